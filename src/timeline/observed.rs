//! What text artifacts add to the timeline: memory as the driver saw it (nvidia-smi samples, processes, MIG
//! instances), OOM messages from training logs, and a serving engine's KV-cache log. Unlike allocator events these
//! carry wall-clock stamps, which `timeline::clock` puts on the snapshot's clock.

use serde::Serialize;

/// A time as a text artifact wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stamp {
    /// Wall-clock time without a zone (nvidia-smi, most loggers): µs since 1970-01-01 00:00 *of that clock*.
    Local(i64),
    /// An absolute time (the text carried a zone, e.g. docker's `…Z`): Unix µs.
    Unix(i64),
}

/// One reading of a GPU's memory, as nvidia-smi reports it (bytes; nvidia-smi's MiB are 2^20).
#[derive(Clone, Debug, Serialize)]
pub struct MemorySample {
    pub stamp: Option<Stamp>,
    /// Unix µs once aligned to the common clock (see `timeline::clock`); `None` until then or when unknown.
    pub time_us: Option<i64>,
    pub used: Option<u64>,
    pub total: Option<u64>,
    pub free: Option<u64>,
    /// Memory the driver keeps for itself (`memory.reserved`, -q `Reserved`); CUDA does not offer it to programs.
    pub driver_reserved: Option<u64>,
    /// Which input (index into `Timeline::inputs`) and line.
    pub input: usize,
    pub line: usize,
}

/// A process using a GPU (table, `--query-compute-apps`, -q, pmon).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    pub name: String,
    /// `C` compute, `G` graphics, `C+G`.
    pub kind: String,
    /// `None` where the driver does not say (Windows WDDM prints N/A).
    pub used_bytes: Option<u64>,
    /// (GPU instance, compute instance) on a MIG GPU.
    pub mig: Option<(u32, u32)>,
}

/// One MIG instance of a GPU and its memory.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MigInstance {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    pub mig_device: u32,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// What kind of out-of-memory report a log line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomKind {
    /// PyTorch's caching allocator: "CUDA out of memory. Tried to allocate …", with its figures.
    Allocator,
    /// The CUDA (or HIP) runtime failed outside the caching allocator: "CUDA error: out of memory".
    RuntimeError,
    /// cuBLAS could not allocate its workspace or handle: CUBLAS_STATUS_ALLOC_FAILED.
    CublasAllocFailed,
    /// NCCL's own allocation failed: "NCCL WARN Cuda failure 'out of memory'" / "Failed to CUDA calloc".
    Nccl,
    /// TensorFlow's BFC allocator: "failed to allocate … from device: CUDA_ERROR_OUT_OF_MEMORY".
    Tensorflow,
}

/// A limit of the allocator's own that refused the request, named by the newest messages: not the GPU being full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomLimit {
    /// `per_process_memory_fraction` with `throw_on_cudamalloc_oom`: "Allocation was preemptively rejected because
    /// it would exceed per_process_memory_fraction limit". No `oom` trace entry is recorded and no OOM observer
    /// runs.
    FractionRejected,
    /// Expandable segments: the request is larger than the virtual-address reserve of its stream
    /// (`expandable_segments_reserve[_by_class]`).
    ExpandableReserve,
    /// Expandable segments: the reserves together ask for more virtual address space than the process can map.
    AddressSpace,
}

impl OomLimit {
    pub fn name(self) -> &'static str {
        match self {
            OomLimit::FractionRejected => "fraction_rejected",
            OomLimit::ExpandableReserve => "expandable_reserve",
            OomLimit::AddressSpace => "address_space",
        }
    }
}

/// An out-of-memory report found in a log, with every figure its text gives (bytes).
#[derive(Clone, Debug, Serialize)]
pub struct OomMessage {
    pub source: String,
    /// CUDA device ordinal the text names (`GPU 1`, NCCL's `[1]`); `None` when it names none.
    pub device: Option<i64>,
    /// The rank the launcher's line prefix names (`[rank3]:`, `3: `).
    pub rank: Option<i64>,
    /// The failed request: the segment the allocator asked the driver for (`Tried to allocate`), NCCL's calloc,
    /// TensorFlow's allocation. `None` when the text gives none.
    pub requested_bytes: Option<u64>,
    /// "Tried to allocate more than 1EB memory": `requested_bytes` is a lower bound.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub requested_at_least: bool,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Allocated to tensors by PyTorch's allocator.
    pub allocated_bytes: Option<u64>,
    /// Held by PyTorch's allocator in total (allocated + reserved-but-unallocated).
    pub reserved_bytes: Option<u64>,
    /// GPU memory in use outside PyTorch's cache: total − free − reserved (this process's CUDA context,
    /// cuBLAS/NCCL buffers, other processes).
    pub non_pytorch_bytes: Option<u64>,
    pub kind: OomKind,
    /// 1-based line of the message's first line.
    pub line: usize,
    /// Reserved by PyTorch but not allocated (stated by torch ≥ 2.1, else reserved − allocated).
    pub reserved_unallocated_bytes: Option<u64>,
    /// "Including non-PyTorch memory, this process has X memory in use" (torch ≥ 2.1 with NVML).
    pub process_bytes: Option<u64>,
    /// "Process N has X memory in use", one per process NVML listed.
    pub processes: Vec<(u32, u64)>,
    /// `set_per_process_memory_fraction`'s cap ("X allowed").
    pub allowed_bytes: Option<u64>,
    /// "with X allocated in private pools (e.g., CUDA Graphs)".
    pub private_pool_bytes: Option<u64>,
    /// "CUDA", "HIP", "XPU", "NPU" …
    pub device_type: String,
    /// The allocator's own limit that refused the request, when the message names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<OomLimit>,
    /// The expandable-segment reserve the message names ("the expandable-segment reserve of R").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_bytes: Option<u64>,
    /// NPU: "A current active" (allocated blocks and those freed but not yet reusable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<u64>,
    /// `torch.OutOfMemoryError`, `RuntimeError` …
    pub exception: Option<String>,
    /// Which PyTorch message this is, by its wording: "≤1.3", "1.4–2.0", "≥2.1".
    pub generation: Option<&'static str>,
    /// The advice the message ended with (PYTORCH_CUDA_ALLOC_CONF / max_split_size_mb / expandable_segments).
    pub hint: Option<String>,
    /// The innermost frame of the traceback outside library code: `train.py:42 in step`.
    pub user_frame: Option<String>,
    /// That frame's source line, as the traceback printed it: `logits = self.lm_head(h).float()`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_code: Option<String>,
    /// The functions the traceback went through below that frame, outermost first: `["forward", "silu"]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls_below: Vec<String>,
    pub stamp: Option<Stamp>,
    /// Unix µs once aligned.
    pub time_us: Option<i64>,
    /// The message, whitespace-normalised (cut at 1000 characters).
    pub text: String,
}

/// KV-cache capacity a serving engine announced at start-up.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KvCapacity {
    pub gpu_blocks: Option<u64>,
    pub cpu_blocks: Option<u64>,
    /// "GPU KV cache size: 178,880 tokens".
    pub tokens: Option<u64>,
    /// "Available KV cache memory: 8.11 GiB" / "the rest of the memory reserved for KV Cache is …".
    pub kv_bytes: Option<u64>,
    /// "Maximum concurrency for 2048 tokens per request: 10.79x" → (2048, 10.79).
    pub max_concurrency: Option<(u64, f64)>,
    /// "Loading model weights took 13.9476 GB".
    pub weights_bytes: Option<u64>,
    /// "non_torch_memory takes …GiB".
    pub non_torch_bytes: Option<u64>,
    /// "The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV
    /// cache (81536)" → (131072, 81536).
    pub too_small: Option<(u64, u64)>,
    /// "Estimated CUDA graph memory: 0.61 GiB total" (vLLM ≥ 0.21 profiles CUDA graphs before sizing the cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_graph_bytes: Option<u64>,
    /// "No available memory for the cache blocks": nothing was left for the KV cache at start-up.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub no_cache_memory: bool,
    /// vLLM's hint on an OOM during CUDA-graph capture: "… try setting VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0".
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub oom_in_cudagraph_capture: bool,
}

/// Megatron-LM's own memory lines: the theoretical footprint it prints at start-up and each reporting rank's
/// `report_memory` line (its "MB" are MiB: bytes / 2^20).
#[derive(Clone, Debug, Default, Serialize)]
pub struct MegatronLog {
    pub source: Vec<String>,
    /// "Theoretical memory footprints: weight and optimizer=7211.88 MB[, activation=… MB, total=… MB]".
    pub weight_optimizer_bytes: Option<u64>,
    pub activation_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub reports: Vec<MegatronMemory>,
}

/// `[Rank 0] (after 10 iterations) memory (MB) | allocated: … | max allocated: … | reserved: … | max reserved: …`.
#[derive(Clone, Debug, Serialize)]
pub struct MegatronMemory {
    pub rank: i64,
    pub iteration: Option<u64>,
    pub allocated_bytes: u64,
    pub max_allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub max_reserved_bytes: u64,
    pub line: usize,
    pub stamp: Option<Stamp>,
}

impl MegatronLog {
    pub fn is_empty(&self) -> bool {
        self.total_bytes.is_none() && self.weight_optimizer_bytes.is_none() && self.reports.is_empty()
    }

    pub fn merge(&mut self, o: MegatronLog) {
        self.source.extend(o.source);
        self.weight_optimizer_bytes = o.weight_optimizer_bytes.or(self.weight_optimizer_bytes);
        self.activation_bytes = o.activation_bytes.or(self.activation_bytes);
        self.total_bytes = o.total_bytes.or(self.total_bytes);
        self.reports.extend(o.reports);
    }
}

/// One periodic stats line of a serving engine.
#[derive(Clone, Debug, Serialize)]
pub struct KvStat {
    pub stamp: Option<Stamp>,
    pub line: usize,
    /// "Engine 001" (data parallel); 0 when unnamed.
    pub engine: u32,
    /// GPU KV cache usage, 0–1.
    pub gpu_usage: f64,
    pub cpu_usage: Option<f64>,
    pub running: Option<u64>,
    /// V1 "Waiting", V0 "Pending".
    pub waiting: Option<u64>,
    pub swapped: Option<u64>,
}

/// A sequence preempted for lack of KV-cache space.
#[derive(Clone, Debug, Serialize)]
pub struct Preemption {
    pub stamp: Option<Stamp>,
    pub line: usize,
    /// "RECOMPUTE" or "SWAP".
    pub mode: String,
    pub cumulative: Option<u64>,
}

/// What a serving engine's log says about its KV cache.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServingLog {
    pub source: Vec<String>,
    pub capacity: KvCapacity,
    pub stats: Vec<KvStat>,
    pub preemptions: Vec<Preemption>,
}

impl ServingLog {
    pub fn is_empty(&self) -> bool {
        self.stats.is_empty()
            && self.preemptions.is_empty()
            && self.capacity.gpu_blocks.is_none()
            && self.capacity.tokens.is_none()
            && self.capacity.kv_bytes.is_none()
            && self.capacity.max_concurrency.is_none()
            && self.capacity.too_small.is_none()
            && self.capacity.weights_bytes.is_none()
            && self.capacity.cuda_graph_bytes.is_none()
            && !self.capacity.no_cache_memory
            && !self.capacity.oom_in_cudagraph_capture
    }
}

/// A line a parser could not use, inside a block it recognised.
#[derive(Clone, Debug, Serialize)]
pub struct Malformed {
    pub line: usize,
    pub expected: String,
    pub found: String,
}
