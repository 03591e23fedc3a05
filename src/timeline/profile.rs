//! What profiler exports say, in one format-free model: Nsight Systems stats reports (kernel, memory-operation,
//! CUDA API and NVTX summaries, the GPU trace) and Nsight Compute kernel metrics. `ingest::nsys` and `ingest::ncu`
//! fill it; what it means (NCCL collectives, optimizer steps and micro-batches, allocator churn, copy volume,
//! memory-/compute-/latency-bound kernels) is derived in `analysis::profile`.
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
