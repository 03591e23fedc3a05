//! NCCL collectives in a GPU trace: the kernel names of three NCCL generations parsed into the operation,
//! algorithm, protocol, reduction and type, and counted per job, per NVTX range and between boundaries.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::timeline::profile::*;

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
    pub(crate) fn from_token(s: &str) -> Option<CollectiveOp> {
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
pub(crate) fn kernel_base_name(s: &str) -> &str {
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

pub(crate) const PROTOCOLS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

pub(crate) fn parse_devkernel(rest: &str) -> Collective {
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

pub(crate) fn parse_kernel_gen(rest: &str) -> Collective {
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

pub(crate) fn parse_legacy(rest: &str) -> Collective {
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

pub(crate) fn empty_collective(op: CollectiveOp, naming: NcclNaming) -> Collective {
    Collective { op, naming, algorithm: None, protocol: None, reduction: None, dtype: None }
}

pub(crate) fn is_upper(t: &str) -> bool {
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

impl ProfileData {
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
}
