//! The structure of training steps in a GPU trace: optimizer steps (their fused optimizer kernels), the all-reduces
//! of each, and the micro-batches between them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::*;
use crate::timeline::profile::*;

/// The steps of one GPU's trace.
pub(crate) fn lane_steps(mut ops: Vec<&GpuOp>) -> Option<StepStructure> {
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
pub(crate) fn step_counts(ops: &[&GpuOp], is_allreduce: &impl Fn(&GpuOp) -> bool) -> StepCounts {
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
pub(crate) fn microbatch_starts(compute: &[&str]) -> Option<Vec<usize>> {
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

impl ProfileData {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
