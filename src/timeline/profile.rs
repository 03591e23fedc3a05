//! What profiler exports say, in one format-free model: Nsight Systems stats reports (kernel, memory-operation,
//! CUDA API and NVTX summaries, the GPU trace) and Nsight Compute kernel metrics. `ingest::nsys` and `ingest::ncu`
//! fill it; the rule engine reads it through the helpers at the bottom (NCCL collectives, allocator churn, copy
//! volume, memory-/compute-/latency-bound kernels, top kernels by DRAM bytes and time).
//!
//! Units: times are nanoseconds and sizes bytes once read; Nsight Compute metrics keep the unit the file wrote
//! (`MetricValue::unit`) and convert on request (`MetricValue::in_base_unit`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Malformed;

/// Everything read from one or more profiler exports of a job.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProfileData {
    /// One entry per file (or per capture) read: what was recognised, skipped and unusable in it.
    pub sources: Vec<ProfileSource>,
    /// Nsight Systems kernel summary (`gpukernsum` / `cuda_gpu_kern_sum`), or the kernel rows of `gpusum` when that
    /// is all there is.
    pub kernels: Vec<KernelSummary>,
    /// Nsight Systems GPU trace (`gputrace` / `cuda_gpu_trace`): kernels and memory operations on a time axis.
    pub gpu_trace: Vec<GpuOp>,
    /// Memory operations by kind (`gpumemsizesum` + `gpumemtimesum`, joined on the operation).
    pub mem_ops: Vec<MemOpSummary>,
    /// CUDA API calls (`cudaapisum` / `cuda_api_sum`).
    pub api: Vec<ApiSummary>,
    /// OS runtime calls (`osrtsum` / `osrt_sum`).
    pub os_runtime: Vec<ApiSummary>,
    /// NVTX ranges (`nvtxsum` / `nvtx_sum`).
    pub nvtx_ranges: Vec<NvtxSummary>,
    /// Kernels per NVTX range (`nvtxkernsum` / `nvtx_kern_sum`).
    pub nvtx_kernels: Vec<NvtxKernelSummary>,
    /// Rows of the combined reports (`gpusum`, `apigpusum` / `cuda_gpu_sum`, `cuda_api_gpu_sum`).
    pub combined: Vec<CombinedSummary>,
    /// Nsight Compute: one entry per profiled kernel launch.
    pub ncu_kernels: Vec<NcuKernel>,
    /// Nsight Systems SQLite export captured with `--cuda-memory-usage=true`: every device allocation and free the
    /// CUDA driver saw (`CUDA_GPU_MEMORY_USAGE_EVENTS`), in time order.
    pub memory_events: Vec<DriverMemoryEvent>,
}

/// One allocation or free the CUDA driver saw (nsys `CUDA_GPU_MEMORY_USAGE_EVENTS`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DriverMemoryEvent {
    /// Nanoseconds since the capture started.
    pub time_ns: u64,
    /// The CUDA device index.
    pub device: i64,
    /// The process (nsys `globalPid` >> 24 & 0xFFFFFF), when known.
    pub pid: Option<u64>,
    pub address: u64,
    /// Bytes allocated or freed.
    pub bytes: u64,
    pub op: DriverMemoryOp,
    /// The memory kind as nsys names it (`Device`, `Pinned`, `Managed` …).
    pub mem_kind: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverMemoryOp {
    Alloc,
    Free,
}

/// What one input gave.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProfileSource {
    /// The file name (or the name the caller gave).
    pub name: String,
    /// `nsys stats` or `ncu`, with the layout seen, e.g. `nsys stats CSV (report names before 2023.1)`.
    pub format: String,
    /// The parts recognised and read, e.g. `gpukernsum (CUDA kernel summary): 41 rows from line 1`.
    pub read: Vec<String>,
    /// Parts recognised but not read, empty reports (0-byte files, `SKIPPED:` lines), lines that are not the
    /// profiler's (application output before the CSV).
    pub skipped: Vec<String>,
    /// Rows inside a recognised table that could not be used, with their line numbers (all of them).
    pub malformed: Vec<Malformed>,
}

/// `(x, y, z)` of a grid or a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Dim3 {
    pub x: u64,
    pub y: u64,
    pub z: u64,
}

/// Summary statistics of a duration, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TimeStats {
    /// `Time (%)`: share of the report's total.
    pub pct: Option<f64>,
    pub total_ns: u64,
    pub avg_ns: f64,
    pub med_ns: Option<f64>,
    pub min_ns: u64,
    pub max_ns: u64,
    pub stddev_ns: Option<f64>,
}

/// Summary statistics of a size, in bytes (nsys prints decimal MB with 3 decimals: resolution 1000 B).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SizeStats {
    pub total_bytes: u64,
    pub avg_bytes: u64,
    pub med_bytes: Option<u64>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub stddev_bytes: Option<u64>,
}

/// One row of a kernel summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelSummary {
    pub name: String,
    pub instances: u64,
    pub time: TimeStats,
    /// nsys ≤ 2022 splits the summary by launch shape (`GridXYZ`, `BlockXYZ`).
    pub grid: Option<Dim3>,
    pub block: Option<Dim3>,
}

/// Which way a memory copy went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyDirection {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    HostToHost,
    PeerToPeer,
    /// Arrays, unified-memory migrations written another way, and labels this version does not know.
    Other,
}

/// What a GPU trace row or a memory-operation summary is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "direction")]
pub enum GpuOpKind {
    Kernel,
    Memcpy(CopyDirection),
    Memset,
}

impl GpuOpKind {
    /// From an nsys name: `[CUDA memcpy HtoD]` (≤ 2022), `[CUDA memcpy Host-to-Device]` (2023+),
    /// `[CUDA memcpy Unified Host-to-Device]`, `[CUDA memset]`; anything else is a kernel.
    pub fn from_name(name: &str) -> GpuOpKind {
        let n = name.trim();
        let Some(inner) = n.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
            return GpuOpKind::Kernel;
        };
        if inner.starts_with("CUDA memset") {
            return GpuOpKind::Memset;
        }
        let Some(what) = inner.strip_prefix("CUDA memcpy") else {
            return GpuOpKind::Kernel;
        };
        let what = what.trim().trim_start_matches("Unified ").trim();
        let dir = match what {
            "HtoD" | "Host-to-Device" => CopyDirection::HostToDevice,
            "DtoH" | "Device-to-Host" => CopyDirection::DeviceToHost,
            "DtoD" | "Device-to-Device" => CopyDirection::DeviceToDevice,
            "HtoH" | "Host-to-Host" => CopyDirection::HostToHost,
            "PtoP" | "Peer-to-Peer" => CopyDirection::PeerToPeer,
            _ => CopyDirection::Other,
        };
        GpuOpKind::Memcpy(dir)
    }
}

/// One row of the GPU trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuOp {
    /// Nanoseconds since the capture started.
    pub start_ns: u64,
    pub duration_ns: u64,
    pub correlation_id: Option<u64>,
    pub name: String,
    pub kind: GpuOpKind,
    /// Memory operations only.
    pub bytes: Option<u64>,
    /// As nsys writes it: `NVIDIA A10 (0)`.
    pub device: Option<String>,
    /// The index in `device`'s parentheses.
    pub device_id: Option<i64>,
    pub context: Option<u64>,
    pub stream: Option<u64>,
    pub grid: Option<Dim3>,
    pub block: Option<Dim3>,
    /// Memory kinds of a copy (`Pageable`, `Pinned`, `Device` …).
    pub src_kind: Option<String>,
    pub dst_kind: Option<String>,
    /// Line in its file.
    pub line: usize,
    /// Which capture (input) it came from, so that several ranks' traces are not read as one.
    #[serde(skip)]
    pub capture: u32,
}

/// Memory operations of one kind: the size and the time summaries joined.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemOpSummary {
    /// As the report wrote it: `[CUDA memcpy HtoD]`.
    pub operation: String,
    pub kind: GpuOpKind,
    pub count: u64,
    pub size: Option<SizeStats>,
    pub time: Option<TimeStats>,
}

/// One row of an API summary (CUDA API or OS runtime).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApiSummary {
    pub name: String,
    pub calls: u64,
    pub time: TimeStats,
}

/// One row of an NVTX range summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NvtxSummary {
    pub range: String,
    /// `PushPop` or `StartEnd`.
    pub style: String,
    pub instances: u64,
    pub time: TimeStats,
}

/// One row of the kernels-per-NVTX-range summary.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NvtxKernelSummary {
    pub range: String,
    pub style: String,
    pub pid: Option<u64>,
    pub tid: Option<u64>,
    /// How many times the range ran, and how many launches of `kernel` ran inside it in all.
    pub range_instances: u64,
    pub kernel_instances: u64,
    pub time: TimeStats,
    pub kernel: String,
}

/// One row of a combined summary (`gpusum`, `apigpusum`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CombinedSummary {
    /// `CUDA_API`, `CUDA_KERNEL`, `MEMORY_OPER`.
    pub category: String,
    pub operation: String,
    pub instances: u64,
    pub time: TimeStats,
}

/// A metric value of Nsight Compute, in the unit the file wrote.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricValue {
    /// `None` for text values (`n/a`, a device name, `No-CC`).
    pub value: Option<f64>,
    /// `%`, `byte`, `Mbyte`, `nsecond`, `ns`, `cycle`, `Gbyte/second`, `byte/block`, or empty for counts.
    pub unit: String,
    /// The value as written.
    pub text: String,
    /// The section the metric was listed in (details page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub section: Option<String>,
}

impl MetricValue {
    /// The value in its base unit: bytes for `byte`/`Kbyte`/`KB`/`Mbyte`/…, nanoseconds for `nsecond`/`usecond`/
    /// `ns`/`us`/…, bytes per second for `…byte/second` and `…B/s`, hertz for `hz`/`Khz`/`Mhz`/`Ghz`. Other units
    /// (`%`, `cycle`, counts, `byte/block`) come back unchanged. Nsight Compute's K/M/G are decimal; `KiB`-style
    /// units are binary.
    pub fn in_base_unit(&self) -> Option<(f64, &'static str)> {
        let v = self.value?;
        let (scale, base) = unit_base(&self.unit)?;
        Some((v * scale, base))
    }

    fn in_unit(&self, base: &str) -> Option<f64> {
        match self.in_base_unit() {
            Some((v, b)) if b == base => Some(v),
            _ => None,
        }
    }
}

/// `(factor, base unit)` of an Nsight Compute unit name, for units that have a base.
fn unit_base(unit: &str) -> Option<(f64, &'static str)> {
    let u = unit.trim();
    if let Some(per) = u.strip_suffix("/second").or_else(|| u.strip_suffix("/s")) {
        let (f, b) = unit_base(per)?;
        return (b == "byte").then_some((f, "byte/second"));
    }
    let prefix = |p: &str| -> Option<f64> {
        Some(match p {
            "" => 1.0,
            "K" | "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024f64.powi(4),
            _ => return None,
        })
    };
    for (suffix, base) in [("byte", "byte"), ("B", "byte"), ("hz", "hz"), ("Hz", "hz")] {
        if let Some(p) = u.strip_suffix(suffix) {
            if let Some(f) = prefix(p) {
                return Some((f, base));
            }
        }
    }
    let ns = match u {
        "psecond" | "ps" => 1e-3,
        "nsecond" | "ns" => 1.0,
        "usecond" | "us" => 1e3,
        "msecond" | "ms" => 1e6,
        "second" | "s" => 1e9,
        _ => return None,
    };
    Some((ns, "ns"))
}

/// A rule result of the details page (ncu ≥ 2023 with sections).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NcuRule {
    pub section: String,
    pub name: String,
    /// `OPT`, `INF`, `WRN`, `ERR`.
    pub kind: String,
    pub description: String,
    pub speedup_type: String,
    pub speedup: Option<f64>,
}

/// One profiled kernel launch of Nsight Compute.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NcuKernel {
    /// The launch number (`ID`).
    pub id: u64,
    pub process_id: Option<u64>,
    pub process: String,
    pub host: String,
    pub name: String,
    /// Wall clock as ncu 2020 wrote it (`2024-Jul-13 19:18:31`).
    pub kernel_time: Option<String>,
    pub device: Option<i64>,
    /// Compute capability (`9.0`).
    pub cc: Option<String>,
    pub context: Option<u64>,
    pub stream: Option<u64>,
    pub block: Option<Dim3>,
    pub grid: Option<Dim3>,
    /// Enclosing NVTX ranges (push/pop outermost first, then start/end), when captured with `--nvtx`.
    pub nvtx: Vec<String>,
    pub metrics: BTreeMap<String, MetricValue>,
    pub rules: Vec<NcuRule>,
    /// Line of its first row.
    pub line: usize,
}

/// The two spellings of the metrics the rule engine uses: `--metrics` names and the section page's display names.
const METRIC_ALIASES: [(&str, &str); 4] = [
    (MEMORY_THROUGHPUT, "Memory Throughput"),
    (SM_THROUGHPUT, "Compute (SM) Throughput"),
    (DURATION, "Duration"),
    ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput"),
];

/// Memory throughput, % of peak (the busiest memory unit).
pub const MEMORY_THROUGHPUT: &str = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed";
/// SM throughput, % of peak.
pub const SM_THROUGHPUT: &str = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
/// Kernel duration.
pub const DURATION: &str = "gpu__time_duration.sum";

impl NcuKernel {
    /// A metric by its `--metrics` name or its section-page display name (`Memory Throughput` ↔
    /// `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed`, `Compute (SM) Throughput` ↔
    /// `sm__throughput…`, `Duration` ↔ `gpu__time_duration.sum`, `DRAM Throughput` ↔ `gpu__dram_throughput…`).
    pub fn metric(&self, name: &str) -> Option<&MetricValue> {
        if let Some(m) = self.metrics.get(name) {
            return Some(m);
        }
        METRIC_ALIASES.iter().find_map(|&(a, b)| {
            let other = if a == name {
                b
            } else if b == name {
                a
            } else {
                return None;
            };
            self.metrics.get(other)
        })
    }

    /// A numeric metric as written (no unit conversion).
    pub fn metric_f64(&self, name: &str) -> Option<f64> {
        self.metric(name)?.value
    }

    pub fn memory_throughput_pct(&self) -> Option<f64> {
        self.metric_f64(MEMORY_THROUGHPUT)
    }

    pub fn sm_throughput_pct(&self) -> Option<f64> {
        self.metric_f64(SM_THROUGHPUT)
    }

    /// Kernel duration in nanoseconds.
    pub fn duration_ns(&self) -> Option<f64> {
        self.metric(DURATION)?.in_unit("ns")
    }

    /// DRAM bytes moved: `dram__bytes.sum`, or `dram__bytes_read.sum` + `dram__bytes_write.sum`.
    pub fn dram_bytes(&self) -> Option<f64> {
        if let Some(v) = self.metric("dram__bytes.sum").and_then(|m| m.in_unit("byte")) {
            return Some(v);
        }
        let r = self.metric("dram__bytes_read.sum").and_then(|m| m.in_unit("byte"));
        let w = self.metric("dram__bytes_write.sum").and_then(|m| m.in_unit("byte"));
        match (r, w) {
            (None, None) => None,
            (r, w) => Some(r.unwrap_or(0.0) + w.unwrap_or(0.0)),
        }
    }

    /// Global loads + stores through L1 (`l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum` + `…_st.sum`).
    pub fn l1_global_bytes(&self) -> Option<f64> {
        let ld = self.metric("l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum").and_then(|m| m.in_unit("byte"));
        let st = self.metric("l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum").and_then(|m| m.in_unit("byte"));
        match (ld, st) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        }
    }

    /// Memory-, compute- or latency-bound by the two throughputs and the thresholds given. `None` when the
    /// metrics needed are missing: both, or one of them while the other is under its threshold.
    pub fn classify(&self, t: &BoundThresholds) -> Option<Boundedness> {
        let mem = self.memory_throughput_pct();
        let sm = self.sm_throughput_pct();
        let mem_hi = mem.map(|v| v >= t.memory_pct);
        let sm_hi = sm.map(|v| v >= t.compute_pct);
        Some(match (mem_hi, sm_hi) {
            (Some(true), Some(true)) => Boundedness::ComputeAndMemoryBound,
            (Some(true), _) => Boundedness::MemoryBound,
            (_, Some(true)) => Boundedness::ComputeBound,
            (Some(false), Some(false)) => Boundedness::LatencyBound,
            _ => return None,
        })
    }
}

/// Where the thresholds for [`NcuKernel::classify`] come from: a rule file (percent of peak).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BoundThresholds {
    /// `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed` at or above this is memory-bound.
    pub memory_pct: f64,
    /// `sm__throughput.avg.pct_of_peak_sustained_elapsed` at or above this is compute-bound.
    pub compute_pct: f64,
}

/// What limits a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Boundedness {
    MemoryBound,
    ComputeBound,
    /// Both throughputs over their thresholds (a large GEMM: SM and shared memory / L1 both near peak).
    ComputeAndMemoryBound,
    /// Neither: latency, synchronisation, too little work.
    LatencyBound,
}

impl Boundedness {
    pub fn name(self) -> &'static str {
        match self {
            Boundedness::MemoryBound => "memory-bound",
            Boundedness::ComputeBound => "compute-bound",
            Boundedness::ComputeAndMemoryBound => "compute-and-memory-bound",
            Boundedness::LatencyBound => "latency-bound",
        }
    }
}

/// An NCCL collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    SendRecv,
    Send,
    Recv,
    AllToAll,
    /// `ncclDevKernel_Generic…` (NCCL ≥ 2.19, LL128/SIMPLE and other protocols): one kernel for every collective.
    Generic,
    /// NCCL's one-rank reduction kernel (`oneRankReduce<…>`), used when a communicator has a single rank.
    OneRankReduce,
    /// A kernel named `nccl…Kernel…` whose collective this version does not know.
    Unknown,
}

impl CollectiveOp {
    fn from_token(s: &str) -> Option<CollectiveOp> {
        Some(match s {
            "AllReduce" => CollectiveOp::AllReduce,
            "AllGather" => CollectiveOp::AllGather,
            "ReduceScatter" => CollectiveOp::ReduceScatter,
            "Broadcast" => CollectiveOp::Broadcast,
            "Reduce" => CollectiveOp::Reduce,
            "SendRecv" => CollectiveOp::SendRecv,
            "Send" => CollectiveOp::Send,
            "Recv" => CollectiveOp::Recv,
            "AllToAll" | "AlltoAll" => CollectiveOp::AllToAll,
            "Generic" => CollectiveOp::Generic,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "AllReduce",
            CollectiveOp::AllGather => "AllGather",
            CollectiveOp::ReduceScatter => "ReduceScatter",
            CollectiveOp::Broadcast => "Broadcast",
            CollectiveOp::Reduce => "Reduce",
            CollectiveOp::SendRecv => "SendRecv",
            CollectiveOp::Send => "Send",
            CollectiveOp::Recv => "Recv",
            CollectiveOp::AllToAll => "AllToAll",
            CollectiveOp::Generic => "Generic",
            CollectiveOp::OneRankReduce => "OneRankReduce",
            CollectiveOp::Unknown => "Unknown",
        }
    }
}

/// Which NCCL kernel naming a name follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NcclNaming {
    /// NCCL ≤ 2.7: `ncclAllReduceRingLLKernel_sum_f32`.
    Legacy,
    /// NCCL 2.8–2.18: `ncclKernel_AllReduce_RING_LL_Sum_float`.
    Kernel,
    /// NCCL ≥ 2.19: `ncclDevKernel_AllReduce_Sum_f32_RING_LL`, `ncclDevKernel_Generic_1`.
    DevKernel,
    /// `oneRankReduce<…>` and other NCCL kernels without the `nccl` prefix.
    Other,
}

/// An NCCL kernel, taken apart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Collective {
    pub op: CollectiveOp,
    pub naming: NcclNaming,
    /// `RING`, `TREE`, `NVLS`, `COLLNET_DIRECT` … (upper case whatever the naming).
    pub algorithm: Option<String>,
    /// `LL`, `LL128`, `SIMPLE`.
    pub protocol: Option<String>,
    /// The reduction as written (`sum`, `Sum`, `PreMulSum`).
    pub reduction: Option<String>,
    /// The element type as written (`f32`, `float`, `half`, `bf16`).
    pub dtype: Option<String>,
}

/// Recognises an NCCL kernel in any of the three naming generations, demangled (`void ncclKernel_…(…)`), bare or
/// mangled (`_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE`).
pub fn nccl_collective(kernel_name: &str) -> Option<Collective> {
    let base = kernel_base_name(kernel_name);
    if base == "oneRankReduce" {
        return Some(Collective {
            op: CollectiveOp::OneRankReduce,
            naming: NcclNaming::Other,
            algorithm: None,
            protocol: None,
            reduction: None,
            dtype: None,
        });
    }
    if let Some(rest) = base.strip_prefix("ncclDevKernel_") {
        return Some(parse_devkernel(rest));
    }
    if let Some(rest) = base.strip_prefix("ncclKernel_") {
        return Some(parse_kernel_gen(rest));
    }
    if let Some(rest) = base.strip_prefix("nccl") {
        if rest.contains("Kernel") {
            return Some(parse_legacy(rest));
        }
    }
    None
}

/// `void ns::name<T>(args)` → `name`; a mangled `_Z<len><name>…` → `name`.
fn kernel_base_name(s: &str) -> &str {
    let s = s.trim();
    if let Some(m) = s.strip_prefix("_Z") {
        let digits = m.bytes().take_while(u8::is_ascii_digit).count();
        if let Ok(len) = m[..digits].parse::<usize>() {
            if let Some(name) = m.get(digits..digits + len) {
                return name;
            }
        }
    }
    let mut s = s.strip_prefix("void ").unwrap_or(s);
    // Anonymous namespaces before the name would look like arguments or template parameters.
    while let Some(rest) = s.strip_prefix("<unnamed>::").or_else(|| s.strip_prefix("(anonymous namespace)::")) {
        s = rest;
    }
    // Cut at the first '(' or '<' (arguments, template), then drop any namespace qualifier.
    let end = s.find(['(', '<']).unwrap_or(s.len());
    let s = s[..end].trim();
    s.rsplit("::").next().unwrap_or(s)
}

const PROTOCOLS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

fn parse_devkernel(rest: &str) -> Collective {
    // {Op}_{RedOp}_{type}_{ALGO}_{PROTO}, {Op}_{ALGO}_{PROTO}, {Op}, Generic, Generic_1
    let tokens: Vec<&str> = rest.split('_').filter(|t| !t.is_empty()).collect();
    let op = tokens.first().and_then(|t| CollectiveOp::from_token(t)).unwrap_or(CollectiveOp::Unknown);
    let mut c = empty_collective(op, NcclNaming::DevKernel);
    if op == CollectiveOp::Generic {
        return c;
    }
    let mut rest = &tokens[tokens.len().min(1)..];
    if let Some(p) = rest.last().filter(|p| PROTOCOLS.contains(p)) {
        c.protocol = Some(p.to_string());
        rest = &rest[..rest.len() - 1];
        // The algorithm is the upper-case run before the protocol (`RING`, `COLLNET_DIRECT`, `NVLS_TREE`).
        let algo_start = rest.iter().rposition(|t| !is_upper(t)).map_or(0, |i| i + 1);
        if algo_start < rest.len() {
            c.algorithm = Some(rest[algo_start..].join("_"));
        }
        rest = &rest[..algo_start];
    }
    if let Some((red, ty)) = rest.split_first() {
        c.reduction = Some(red.to_string());
        if !ty.is_empty() {
            c.dtype = Some(ty.join("_"));
        }
    }
    c
}

fn parse_kernel_gen(rest: &str) -> Collective {
    // {Op}_{ALGO}_{PROTO}_{RedOp}_{type}
    let tokens: Vec<&str> = rest.split('_').filter(|t| !t.is_empty()).collect();
    let op = tokens.first().and_then(|t| CollectiveOp::from_token(t)).unwrap_or(CollectiveOp::Unknown);
    let mut c = empty_collective(op, NcclNaming::Kernel);
    let rest = &tokens[tokens.len().min(1)..];
    if let Some(pi) = rest.iter().position(|t| PROTOCOLS.contains(t)) {
        if pi > 0 {
            c.algorithm = Some(rest[..pi].join("_"));
        }
        c.protocol = Some(rest[pi].to_string());
        let after = &rest[pi + 1..];
        if let Some((red, ty)) = after.split_first() {
            c.reduction = Some(red.to_string());
            if !ty.is_empty() {
                c.dtype = Some(ty.join("_"));
            }
        }
    }
    c
}

fn parse_legacy(rest: &str) -> Collective {
    // {Op}{Algo}{Proto}Kernel_{redop}_{type}, e.g. AllReduceRingLLKernel_sum_f32, SendRecvKernel_copy_i8
    const OPS: [&str; 9] =
        ["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "SendRecv", "Send", "Recv", "AllToAll"];
    let (head, tail) = match rest.find("Kernel") {
        Some(i) => (&rest[..i], &rest[i + "Kernel".len()..]),
        None => (rest, ""),
    };
    let op_name = OPS.iter().find(|o| head.starts_with(**o));
    let op = op_name.and_then(|o| CollectiveOp::from_token(o)).unwrap_or(CollectiveOp::Unknown);
    let mut c = empty_collective(op, NcclNaming::Legacy);
    let mut shape = op_name.map_or(head, |o| &head[o.len()..]);
    for proto in ["LL128", "LL", "Simple"] {
        if let Some(s) = shape.strip_suffix(proto) {
            c.protocol = Some(proto.to_ascii_uppercase());
            shape = s;
            break;
        }
    }
    if !shape.is_empty() {
        c.algorithm = Some(shape.to_ascii_uppercase());
    }
    let mut parts = tail.trim_start_matches('_').splitn(2, '_');
    c.reduction = parts.next().filter(|s| !s.is_empty()).map(str::to_string);
    c.dtype = parts.next().filter(|s| !s.is_empty()).map(str::to_string);
    c
}

fn empty_collective(op: CollectiveOp, naming: NcclNaming) -> Collective {
    Collective { op, naming, algorithm: None, protocol: None, reduction: None, dtype: None }
}

fn is_upper(t: &str) -> bool {
    t.chars().any(|c| c.is_ascii_uppercase()) && !t.chars().any(|c| c.is_ascii_lowercase())
}

/// How often one collective ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CollectiveCount {
    pub op: CollectiveOp,
    /// Kernel launches.
    pub launches: u64,
    /// GPU time in those kernels, when the source has it.
    pub total_ns: u64,
}

/// Collective launches inside one NVTX range (from the kernels-per-range summary).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RangeCollectives {
    pub range: String,
    /// How many times the range ran.
    pub range_instances: u64,
    pub op: CollectiveOp,
    /// Launches of that collective inside the range, over all its instances.
    pub launches: u64,
}

/// cudaMalloc/cudaFree (and their driver-API and host-pinned relatives) calls and time: allocator churn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocatorCalls {
    pub device_alloc_calls: u64,
    pub device_alloc_ns: u64,
    pub device_free_calls: u64,
    pub device_free_ns: u64,
    pub host_alloc_calls: u64,
    pub host_alloc_ns: u64,
    pub host_free_calls: u64,
    pub host_free_ns: u64,
}

/// What an API name does to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AllocApi {
    DeviceAlloc,
    DeviceFree,
    HostAlloc,
    HostFree,
}

fn alloc_api(name: &str) -> Option<AllocApi> {
    // `cudaMalloc_v3020`, `cuMemAlloc_v2`: drop a version suffix.
    let base = match name.rfind("_v") {
        Some(i) if name[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < name.len() => &name[..i],
        _ => name,
    };
    Some(match base {
        "cudaMalloc"
        | "cudaMallocAsync"
        | "cudaMallocFromPoolAsync"
        | "cudaMallocManaged"
        | "cudaMallocPitch"
        | "cudaMalloc3D"
        | "cudaMallocArray"
        | "cuMemAlloc"
        | "cuMemAllocAsync"
        | "cuMemAllocFromPoolAsync"
        | "cuMemAllocManaged"
        | "cuMemAllocPitch"
        | "cuMemCreate" => AllocApi::DeviceAlloc,
        "cudaFree" | "cudaFreeAsync" | "cudaFreeArray" | "cuMemFree" | "cuMemFreeAsync" | "cuMemRelease" => {
            AllocApi::DeviceFree
        }
        "cudaMallocHost" | "cudaHostAlloc" | "cuMemAllocHost" | "cuMemHostAlloc" => AllocApi::HostAlloc,
        "cudaFreeHost" | "cuMemFreeHost" => AllocApi::HostFree,
        _ => return None,
    })
}

impl ProfileData {
    /// Appends another input's data (several sibling report files of one capture, or several captures).
    pub fn merge(&mut self, other: ProfileData) {
        // A trace merged in from another input is another capture (another rank, or another run).
        let capture = self.gpu_trace.iter().map(|o| o.capture + 1).max().unwrap_or(0);
        let shift = if self.gpu_trace.is_empty() { 0 } else { capture };
        self.sources.extend(other.sources);
        self.kernels.extend(other.kernels);
        self.gpu_trace.extend(other.gpu_trace.into_iter().map(|mut o| {
            o.capture += shift;
            o
        }));
        self.api.extend(other.api);
        self.os_runtime.extend(other.os_runtime);
        self.nvtx_ranges.extend(other.nvtx_ranges);
        self.nvtx_kernels.extend(other.nvtx_kernels);
        self.combined.extend(other.combined);
        self.ncu_kernels.extend(other.ncu_kernels);
        self.memory_events.extend(other.memory_events);
        for op in other.mem_ops {
            self.add_mem_op(op);
        }
    }

    /// Adds a memory-operation summary row, joining the size and the time report's rows of one operation.
    pub fn add_mem_op(&mut self, op: MemOpSummary) {
        match self.mem_ops.iter_mut().find(|m| m.operation == op.operation) {
            Some(m) => {
                m.count = m.count.max(op.count);
                m.size = m.size.or(op.size);
                m.time = m.time.or(op.time);
            }
            None => self.mem_ops.push(op),
        }
    }

    /// Fills what the dedicated reports did not give from the combined ones (`gpusum`, `apigpusum`): kernels,
    /// API calls, memory-operation times. Readers call it once all of a capture's files are merged.
    pub fn fill_from_combined(&mut self) {
        let kernels_missing = self.kernels.is_empty();
        let api_missing = self.api.is_empty();
        let mut seen_kernels = Vec::new();
        let mut seen_api = Vec::new();
        let mut mem = Vec::new();
        for c in &self.combined {
            match c.category.as_str() {
                "CUDA_KERNEL" if kernels_missing && !seen_kernels.contains(&c.operation) => {
                    seen_kernels.push(c.operation.clone());
                    self.kernels.push(KernelSummary {
                        name: c.operation.clone(),
                        instances: c.instances,
                        time: c.time,
                        grid: None,
                        block: None,
                    });
                }
                "CUDA_API" if api_missing && !seen_api.contains(&c.operation) => {
                    seen_api.push(c.operation.clone());
                    self.api.push(ApiSummary { name: c.operation.clone(), calls: c.instances, time: c.time });
                }
                "MEMORY_OPER" => mem.push(MemOpSummary {
                    operation: c.operation.clone(),
                    kind: GpuOpKind::from_name(&c.operation),
                    count: c.instances,
                    size: None,
                    time: Some(c.time),
                }),
                _ => {}
            }
        }
        for m in mem {
            self.add_mem_op(m);
        }
    }

    /// No data at all (every report empty or skipped).
    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
            && self.gpu_trace.is_empty()
            && self.mem_ops.is_empty()
            && self.api.is_empty()
            && self.os_runtime.is_empty()
            && self.nvtx_ranges.is_empty()
            && self.nvtx_kernels.is_empty()
            && self.combined.is_empty()
            && self.ncu_kernels.is_empty()
            && self.memory_events.is_empty()
    }

    /// Malformed rows over all sources.
    pub fn malformed_count(&self) -> usize {
        self.sources.iter().map(|s| s.malformed.len()).sum()
    }

    /// NCCL collectives and how often they ran: from the kernel summary when there is one, else the GPU trace,
    /// else the Nsight Compute launches. Sorted by collective.
    pub fn collectives(&self) -> Vec<CollectiveCount> {
        let mut out: BTreeMap<CollectiveOp, (u64, u64)> = BTreeMap::new();
        let mut add = |name: &str, n: u64, ns: u64| {
            if let Some(c) = nccl_collective(name) {
                let e = out.entry(c.op).or_default();
                e.0 += n;
                e.1 += ns;
            }
        };
        if !self.kernels.is_empty() {
            self.kernels.iter().for_each(|k| add(&k.name, k.instances, k.time.total_ns));
        } else if self.gpu_trace.iter().any(|op| op.kind == GpuOpKind::Kernel) {
            self.gpu_trace
                .iter()
                .filter(|op| op.kind == GpuOpKind::Kernel)
                .for_each(|k| add(&k.name, 1, k.duration_ns));
        } else {
            self.ncu_kernels.iter().for_each(|k| add(&k.name, 1, k.duration_ns().map_or(0, |d| d.round() as u64)));
        }
        out.into_iter().map(|(op, (launches, total_ns))| CollectiveCount { op, launches, total_ns }).collect()
    }

    /// Launches of each collective inside each NVTX range (nvtxkernsum): with iteration ranges (`iter0`,
    /// `optimizer_step` …) this is the all-reduce count per step.
    pub fn collectives_per_nvtx_range(&self) -> Vec<RangeCollectives> {
        let mut out: Vec<RangeCollectives> = Vec::new();
        for k in &self.nvtx_kernels {
            let Some(c) = nccl_collective(&k.kernel) else { continue };
            match out.iter_mut().find(|r| r.range == k.range && r.op == c.op) {
                Some(r) => {
                    r.launches += k.kernel_instances;
                    r.range_instances = r.range_instances.max(k.range_instances);
                }
                None => out.push(RangeCollectives {
                    range: k.range.clone(),
                    range_instances: k.range_instances,
                    op: c.op,
                    launches: k.kernel_instances,
                }),
            }
        }
        out
    }

    /// Counts of `op` collectives in the GPU trace between consecutive kernels that `is_boundary` picks (e.g. the
    /// optimizer's `multi_tensor_apply_kernel`): one count per segment, the one before the first boundary
    /// included, in time order.
    pub fn collectives_between(&self, op: CollectiveOp, is_boundary: impl Fn(&GpuOp) -> bool) -> Vec<usize> {
        let mut ops: Vec<&GpuOp> = self.gpu_trace.iter().filter(|o| o.kind == GpuOpKind::Kernel).collect();
        ops.sort_by_key(|o| o.start_ns);
        let mut out = vec![0usize];
        for o in ops {
            if is_boundary(o) {
                out.push(0);
            } else if nccl_collective(&o.name).is_some_and(|c| c.op == op) {
                *out.last_mut().expect("never empty") += 1;
            }
        }
        out
    }

    /// How gradient all-reduces fall into optimizer steps and micro-batches, from the GPU trace. Steps end at the
    /// optimizer's kernels (a run of them with nothing else of note between is one step end). Micro-batches are
    /// told apart, in order of preference, by the copy of their inputs to the GPU (a run of host-to-device copies
    /// starts one), or by the step's compute kernels repeating: k micro-batches of one model launch the same
    /// kernel sequence k times. `None` without a GPU trace that shows at least one optimizer step and one
    /// all-reduce.
    pub fn step_structure(&self) -> Option<StepStructure> {
        // Each rank's trace on its own: steps of different GPUs or processes must not interleave.
        let mut lanes: BTreeMap<(u32, Option<i64>), Vec<&GpuOp>> = BTreeMap::new();
        for o in &self.gpu_trace {
            lanes.entry((o.capture, o.device_id)).or_default().push(o);
        }
        lanes
            .into_values()
            .filter_map(|ops| lane_steps(ops))
            .max_by_key(|s| (s.median(|c| c.microbatches_with_allreduce), s.steps_with_allreduce()))
    }

    /// cudaMalloc/cudaFree (and relatives) calls and time, from the CUDA API summary (or `apigpusum`).
    pub fn allocator_calls(&self) -> AllocatorCalls {
        let mut a = AllocatorCalls::default();
        let rows: Vec<(&str, u64, u64)> = if self.api.is_empty() {
            self.combined
                .iter()
                .filter(|c| c.category == "CUDA_API")
                .map(|c| (c.operation.as_str(), c.instances, c.time.total_ns))
                .collect()
        } else {
            self.api.iter().map(|c| (c.name.as_str(), c.calls, c.time.total_ns)).collect()
        };
        for (name, calls, ns) in rows {
            let (c, t) = match alloc_api(name) {
                Some(AllocApi::DeviceAlloc) => (&mut a.device_alloc_calls, &mut a.device_alloc_ns),
                Some(AllocApi::DeviceFree) => (&mut a.device_free_calls, &mut a.device_free_ns),
                Some(AllocApi::HostAlloc) => (&mut a.host_alloc_calls, &mut a.host_alloc_ns),
                Some(AllocApi::HostFree) => (&mut a.host_free_calls, &mut a.host_free_ns),
                None => continue,
            };
            *c += calls;
            *t += ns;
        }
        a
    }

    /// Bytes copied in one direction and how many copies: from the memory-operation summaries when they give
    /// sizes, else from the GPU trace. `None` when neither says.
    pub fn copy_volume(&self, dir: CopyDirection) -> Option<(u64, u64)> {
        let sized: Vec<&MemOpSummary> =
            self.mem_ops.iter().filter(|m| m.kind == GpuOpKind::Memcpy(dir) && m.size.is_some()).collect();
        if !sized.is_empty() {
            return Some(sized.iter().fold((0, 0), |(b, n), m| (b + m.size.map_or(0, |s| s.total_bytes), n + m.count)));
        }
        let ops: Vec<&GpuOp> = self.gpu_trace.iter().filter(|o| o.kind == GpuOpKind::Memcpy(dir)).collect();
        if ops.is_empty() {
            return None;
        }
        Some(ops.iter().fold((0, 0), |(b, n), o| (b + o.bytes.unwrap_or(0), n + 1)))
    }

    /// The Nsight Compute launches with their class under the thresholds given.
    pub fn classify_ncu(&self, t: &BoundThresholds) -> Vec<(&NcuKernel, Option<Boundedness>)> {
        self.ncu_kernels.iter().map(|k| (k, k.classify(t))).collect()
    }

    /// The `n` Nsight Compute launches that moved the most DRAM bytes (those without the metric left out).
    pub fn top_ncu_by_dram_bytes(&self, n: usize) -> Vec<&NcuKernel> {
        top_by(&self.ncu_kernels, n, NcuKernel::dram_bytes)
    }

    /// The `n` longest Nsight Compute launches.
    pub fn top_ncu_by_time(&self, n: usize) -> Vec<&NcuKernel> {
        top_by(&self.ncu_kernels, n, NcuKernel::duration_ns)
    }

    /// The `n` kernels with the most total GPU time (nsys kernel summary).
    pub fn top_kernels_by_time(&self, n: usize) -> Vec<&KernelSummary> {
        top_by(&self.kernels, n, |k| Some(k.time.total_ns as f64))
    }
}

/// A kernel name without its return type, namespaces, template arguments and parameters:
/// `void at::native::vectorized_elementwise_kernel<4, …>(int, …)` → `vectorized_elementwise_kernel`.
pub fn short_kernel_name(name: &str) -> String {
    let cleaned = name.trim().replace("(anonymous namespace)::", "").replace("<unnamed>::", "");
    // The name proper ends at the first `(` outside template brackets (a return type may hold `<…>` too);
    // drop template arguments, then the return type (before the last space), then namespaces.
    let mut depth = 0i32;
    let mut head = String::new();
    for c in cleaned.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth <= 0 => break,
            _ if depth <= 0 => head.push(c),
            _ => {}
        }
    }
    let head = head.trim();
    let last_word = head.rsplit(' ').next().unwrap_or(head);
    let mut parts = last_word.rsplit("::");
    let last = parts.next().unwrap_or(last_word).trim();
    // `gemvx::kernel` says more than `kernel`.
    if last.len() < 8 {
        if let Some(ns) = parts.next().filter(|p| !p.is_empty()) {
            return format!("{ns}::{last}");
        }
    }
    if last.is_empty() {
        cleaned.chars().take(60).collect()
    } else {
        last.to_string()
    }
}

/// The steps of one GPU's trace.
fn lane_steps(mut ops: Vec<&GpuOp>) -> Option<StepStructure> {
    ops.sort_by_key(|o| o.start_ns);
    let is_allreduce = |o: &GpuOp| {
        o.kind == GpuOpKind::Kernel && nccl_collective(&o.name).is_some_and(|c| c.op == CollectiveOp::AllReduce)
    };
    let is_optimizer = |o: &GpuOp| o.kind == GpuOpKind::Kernel && is_optimizer_kernel(&o.name);
    let mut groups: Vec<Vec<&GpuOp>> = vec![Vec::new()];
    let mut prev_optimizer = false;
    let mut complete = 0;
    for o in ops {
        if is_optimizer(o) {
            if !prev_optimizer {
                complete += 1;
                groups.push(Vec::new());
            }
            prev_optimizer = true;
            continue;
        }
        prev_optimizer = false;
        groups.last_mut().expect("never empty").push(o);
    }
    if complete == 0 || !groups.iter().flatten().any(|o| is_allreduce(o)) {
        return None;
    }
    let trailing = groups.pop().map(|g| step_counts(&g, &is_allreduce)).unwrap_or_default();
    let steps = groups.iter().map(|g| step_counts(g, &is_allreduce)).collect();
    Some(StepStructure { steps, trailing })
}

/// One step's micro-batches and all-reduces (see [`ProfileData::step_structure`]).
fn step_counts(ops: &[&GpuOp], is_allreduce: &impl Fn(&GpuOp) -> bool) -> StepCounts {
    let mut c =
        StepCounts { allreduce_launches: ops.iter().filter(|o| is_allreduce(o)).count() as u64, ..Default::default() };
    // Micro-batch of each op, by input copies: a run of host-to-device copies after a kernel starts one (copies
    // and memsets before the first kernel are one run).
    let mut by_input: Vec<usize> = Vec::with_capacity(ops.len());
    let (mut n_input, mut kernel_since_copy, mut in_run) = (0usize, true, false);
    for o in ops {
        match o.kind {
            GpuOpKind::Memcpy(CopyDirection::HostToDevice) => {
                if !in_run && kernel_since_copy {
                    n_input += 1;
                    kernel_since_copy = false;
                }
                in_run = true;
            }
            GpuOpKind::Kernel => {
                in_run = false;
                kernel_since_copy = true;
            }
            _ => {}
        }
        by_input.push(n_input.saturating_sub(1));
    }
    let (mb_of, microbatches, cue) = if n_input >= 2 {
        (by_input, n_input, MicrobatchCue::InputCopies)
    } else {
        // By repetition: the compute kernels (neither NCCL nor copies) form k copies of one sequence.
        let compute: Vec<&str> = ops
            .iter()
            .filter(|o| o.kind == GpuOpKind::Kernel && nccl_collective(&o.name).is_none())
            .map(|o| o.name.as_str())
            .collect();
        match microbatch_starts(&compute) {
            Some(starts) => {
                // An op belongs to the micro-batch of the compute kernel launched last before it.
                let mut seen = 0usize;
                let mb: Vec<usize> = ops
                    .iter()
                    .map(|o| {
                        if o.kind == GpuOpKind::Kernel && nccl_collective(&o.name).is_none() {
                            seen += 1;
                        }
                        starts.partition_point(|&s| s < seen).saturating_sub(1)
                    })
                    .collect();
                (mb, starts.len(), MicrobatchCue::RepeatingKernels)
            }
            None => (vec![0; ops.len()], usize::from(!compute.is_empty()), MicrobatchCue::None),
        }
    };
    // All-reduce weight per micro-batch: GPU time when the trace has it, else launches. A micro-batch counts as
    // all-reducing gradients only with at least half the weight of the heaviest one: a loss averaged across ranks
    // for logging (`dist.all_reduce(loss)`, a few µs) is not a gradient all-reduce.
    let mut weight = vec![0u64; microbatches.max(1)];
    let timed = ops.iter().filter(|o| is_allreduce(o)).all(|o| o.duration_ns > 0);
    for (o, &mb) in ops.iter().zip(&mb_of) {
        if is_allreduce(o) {
            let last = weight.len() - 1;
            weight[mb.min(last)] += if timed { o.duration_ns } else { 1 };
        }
    }
    let heaviest = weight.iter().copied().max().unwrap_or(0);
    c.microbatches = microbatches as u64;
    c.microbatches_with_allreduce = weight.iter().filter(|&&w| w > 0 && w * 2 >= heaviest).count() as u64;
    c.delimited_by = cue;
    c
}

/// Where the micro-batches of a step start, as indices into its compute kernels; `None` when the step shows no
/// repetition. First an exact period (k copies of one sequence); else the step's opening kernels recurring: the
/// forward pass is the same in every micro-batch even where the backward is not (the first backward of a window
/// assigns gradients, the later ones add to them). How often an opening of m kernels recurs falls as m grows;
/// the micro-batch count is the longest plateau of that count (a kernel that also recurs inside a pass gives a
/// higher count for short openings only).
fn microbatch_starts(compute: &[&str]) -> Option<Vec<usize>> {
    let n = compute.len();
    if let Some(p) = (1..=n / 2).find(|&p| n.is_multiple_of(p) && (p..n).all(|i| compute[i] == compute[i - p])) {
        return Some((0..n).step_by(p).collect());
    }
    let occurrences = |m: usize| -> Vec<usize> {
        let sig = &compute[..m];
        let mut out = Vec::new();
        let mut i = 0;
        while i + m <= n {
            if compute[i..i + m] == *sig {
                out.push(i);
                i += m;
            } else {
                i += 1;
            }
        }
        out
    };
    // (count, first m, last m) of each plateau with at least two recurrences.
    let mut best: Option<(usize, usize, usize)> = None;
    let mut run: Option<(usize, usize, usize)> = None;
    for m in 1..=32.min(n / 2) {
        let c = occurrences(m).len();
        if c < 2 {
            break;
        }
        run = match run {
            Some((rc, first, _)) if rc == c => Some((rc, first, m)),
            _ => Some((c, m, m)),
        };
        let r = run.expect("just set");
        if best.is_none_or(|b| r.2 - r.1 >= b.2 - b.1) {
            best = Some(r);
        }
    }
    best.map(|(_, _, m)| occurrences(m))
}

/// What told one micro-batch from the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MicrobatchCue {
    /// Nothing did: the step is one micro-batch as far as the trace shows.
    #[default]
    None,
    /// A run of host-to-device copies (the micro-batch's inputs) starts each.
    InputCopies,
    /// The step's compute kernels repeat once per micro-batch.
    RepeatingKernels,
}

/// Kernels of an optimizer step: PyTorch's foreach and fused optimizers (and the gradient clipping and AMP
/// unscaling that run right before them) all launch `multi_tensor_apply_kernel`; fused and hand-written optimizer
/// kernels (apex, DeepSpeed, bitsandbytes, Triton) name their algorithm. A step written as plain elementwise
/// kernels is not recognised.
pub fn is_optimizer_kernel(name: &str) -> bool {
    let n = short_kernel_name(name).to_ascii_lowercase();
    let full = name.to_ascii_lowercase();
    full.contains("multi_tensor_apply")
        || ["adam", "sgd", "lamb", "adagrad", "rmsprop", "adafactor", "optimizer", "optim_"]
            .iter()
            .any(|o| n.contains(o))
}

/// One optimizer step as the GPU trace shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StepCounts {
    /// Micro-batches (see `delimited_by`).
    pub microbatches: u64,
    /// NCCL all-reduce launches.
    pub allreduce_launches: u64,
    /// Micro-batches during which at least one all-reduce ran.
    pub microbatches_with_allreduce: u64,
    pub delimited_by: MicrobatchCue,
}

/// Steps of a GPU trace: each complete one (ended by the optimizer) and what came after the last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepStructure {
    pub steps: Vec<StepCounts>,
    pub trailing: StepCounts,
}

impl StepStructure {
    /// The median over complete steps that all-reduced at all (the lower one of an even count).
    pub fn median(&self, f: impl Fn(&StepCounts) -> u64) -> u64 {
        let mut v: Vec<u64> = self.steps.iter().filter(|s| s.allreduce_launches > 0).map(f).collect();
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    }

    pub fn steps_with_allreduce(&self) -> usize {
        self.steps.iter().filter(|s| s.allreduce_launches > 0).count()
    }
}

/// The `n` items with the largest key, ties in input order; items without a key are left out.
pub fn top_by<T>(items: &[T], n: usize, key: impl Fn(&T) -> Option<f64>) -> Vec<&T> {
    let mut keyed: Vec<(f64, usize, &T)> =
        items.iter().enumerate().filter_map(|(i, t)| key(t).filter(|v| v.is_finite()).map(|v| (v, i, t))).collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().take(n).map(|(_, _, t)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_three_generations() {
        let c = nccl_collective("ncclAllReduceRingLLKernel_sum_f32(ncclColl)").unwrap();
        assert_eq!((c.op, c.naming), (CollectiveOp::AllReduce, NcclNaming::Legacy));
        assert_eq!(c.algorithm.as_deref(), Some("RING"));
        assert_eq!(c.protocol.as_deref(), Some("LL"));
        assert_eq!((c.reduction.as_deref(), c.dtype.as_deref()), (Some("sum"), Some("f32")));
        let c = nccl_collective("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)").unwrap();
        assert_eq!((c.op, c.naming), (CollectiveOp::AllReduce, NcclNaming::Kernel));
        assert_eq!((c.algorithm.as_deref(), c.protocol.as_deref()), (Some("RING"), Some("LL")));
        assert_eq!((c.reduction.as_deref(), c.dtype.as_deref()), (Some("Sum"), Some("float")));
        let c = nccl_collective("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)").unwrap();
        assert_eq!((c.op, c.naming), (CollectiveOp::AllReduce, NcclNaming::DevKernel));
        assert_eq!((c.algorithm.as_deref(), c.protocol.as_deref()), (Some("RING"), Some("LL")));
        assert_eq!((c.reduction.as_deref(), c.dtype.as_deref()), (Some("Sum"), Some("f32")));
        let c = nccl_collective("_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE");
        assert_eq!(c.unwrap().dtype.as_deref(), Some("bf16"));
        let op = |n: &str| nccl_collective(n).unwrap().op;
        assert_eq!(op("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)"), CollectiveOp::Generic);
        assert_eq!(op("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_half"), CollectiveOp::ReduceScatter);
        assert_eq!(op("ncclReduceScatterRingLL128Kernel_sum_f16"), CollectiveOp::ReduceScatter);
        assert_eq!(nccl_collective("ncclDevKernel_AllGather_RING_LL").unwrap().op, CollectiveOp::AllGather);
        assert_eq!(nccl_collective("ncclDevKernel_SendRecv(x)").unwrap().op, CollectiveOp::SendRecv);
        assert_eq!(
            nccl_collective("void <unnamed>::oneRankReduce<FuncPreMulSum<float>>(void *, void *)").unwrap().op,
            CollectiveOp::OneRankReduce
        );
        assert!(nccl_collective("void at::native::reduce_kernel<128, 4>(x)").is_none());
        assert!(nccl_collective("ampere_sgemm_32x32_sliced1x4_tn").is_none());
    }

    #[test]
    fn units_to_base() {
        let m = |v: f64, u: &str| MetricValue { value: Some(v), unit: u.into(), text: String::new(), section: None };
        assert_eq!(m(246.13, "Mbyte").in_base_unit(), Some((246.13e6, "byte")));
        assert_eq!(m(2.0, "Kbyte").in_base_unit(), Some((2000.0, "byte")));
        assert_eq!(m(5.98, "usecond").in_base_unit().map(|x| x.1), Some("ns"));
        assert_eq!(m(1.5, "Gbyte/second").in_base_unit(), Some((1.5e9, "byte/second")));
        assert_eq!(m(7.0, "ms").in_base_unit(), Some((7e6, "ns")));
        assert_eq!(m(1.0, "%").in_base_unit(), None);
        assert_eq!(m(1.0, "byte/block").in_base_unit(), None);
        assert_eq!(m(1.0, "KiB").in_base_unit(), Some((1024.0, "byte")));
    }

    #[test]
    fn short_names() {
        let short = |n: &str| short_kernel_name(n);
        assert_eq!(
            short("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3)"),
            "vectorized_elementwise_kernel"
        );
        assert_eq!(short("std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<float>, float>>(T13)"), "gemvx::kernel");
        assert_eq!(
            short("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<X>(T1, T2)"),
            "multi_tensor_apply_kernel"
        );
        assert_eq!(
            short("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        );
        assert_eq!(short("ampere_sgemm_32x32_sliced1x4_tn"), "ampere_sgemm_32x32_sliced1x4_tn");
        assert_eq!(short("void <unnamed>::oneRankReduce<FuncPreMulSum<float>>(void *, void *)"), "oneRankReduce");
    }

    #[test]
    fn optimizer_kernels() {
        for k in [
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>>(T1, T2)",
            "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float>(int, int volatile *, T1, T2, T3)",
            "void at::native::(anonymous namespace)::fused_sgd_kernel<float>(float *, float *, float)",
            "kOptimizer32bit2State<float, 0>",
            "void kOptimizerStatic8bit2State<__half, 0>(T2 *, T2 *, unsigned char *)",
            "_fused_adamw_kernel",
            "lamb_stage1_kernel",
        ] {
            assert!(is_optimizer_kernel(k), "{k}");
        }
        for k in [
            "ampere_sgemm_32x32_sliced1x4_tn",
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(T1::Params)",
        ] {
            assert!(!is_optimizer_kernel(k), "{k}");
        }
    }

    #[test]
    fn alloc_names() {
        assert_eq!(alloc_api("cudaMalloc"), Some(AllocApi::DeviceAlloc));
        assert_eq!(alloc_api("cudaMalloc_v3020"), Some(AllocApi::DeviceAlloc));
        assert_eq!(alloc_api("cuMemAlloc_v2"), Some(AllocApi::DeviceAlloc));
        assert_eq!(alloc_api("cudaFree"), Some(AllocApi::DeviceFree));
        assert_eq!(alloc_api("cudaHostAlloc"), Some(AllocApi::HostAlloc));
        assert_eq!(alloc_api("cudaMemcpyAsync"), None);
        assert_eq!(alloc_api("cudaStreamIsCapturing_v10000"), None);
    }
}
