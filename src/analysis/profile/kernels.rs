//! Kernels by what bounds them (Nsight Compute's memory and compute throughput), top lists, copy volume, and the
//! short names reports show.

use serde::Serialize;

use crate::timeline::profile::*;

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

/// The `n` items with the largest key, ties in input order; items without a key are left out.
pub fn top_by<T>(items: &[T], n: usize, key: impl Fn(&T) -> Option<f64>) -> Vec<&T> {
    let mut keyed: Vec<(f64, usize, &T)> =
        items.iter().enumerate().filter_map(|(i, t)| key(t).filter(|v| v.is_finite()).map(|v| (v, i, t))).collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().take(n).map(|(_, _, t)| t).collect()
}

impl ProfileData {
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

impl NcuKernel {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
