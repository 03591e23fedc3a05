//! "What would fit": when the budget does not fit, walk the knobs in the order practitioners reach for them —
//! cheapest first — until it fits, then take back every change the final set does not need and settle each knob
//! on its mildest value that still fits.
//!
//! Training: BF16 → activation checkpointing → 8-bit optimizer → ZeRO-1 → ZeRO-2 → smaller micro-batch with
//! gradient accumulation → ZeRO-3 → more GPUs (up to `--max-gpus`) → CPU offload of the optimizer → of the
//! parameters. Serving: FP8 KV cache → FP8 weights → fewer concurrent sequences → 4-bit weights → shorter context
//! → tensor parallelism over more GPUs.

use serde::Serialize;

use super::estimate::{bytes_text, estimate};
use super::model::{Dtype, Model};
use super::run::{Checkpointing, MixedPrecision, Mode, Offload, Optimizer, Run};

/// One knob turned: its name, the value you have, the value that fits, and what it costs.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Change {
    pub knob: &'static str,
    pub from: String,
    pub to: String,
    pub cost: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Proposal {
    pub fits: bool,
    /// The per-GPU total with these changes.
    pub total_bytes: u64,
    /// What the verdict compares against: the GPU, or its `gpu_memory_utilization` share when serving.
    pub limit_bytes: u64,
    pub changes: Vec<Change>,
    pub note: Option<String>,
}

/// The knobs, in ladder order.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Knob {
    Bf16,
    Checkpointing,
    Optimizer8bit,
    Zero1,
    Zero2,
    MicroBatch,
    Zero3,
    MoreGpus,
    OffloadOptimizer,
    OffloadParams,
    KvFp8,
    WeightsFp8,
    FewerSequences,
    WeightsInt4,
    ShorterContext,
    TensorParallel,
}

const TRAIN_LADDER: &[Knob] = &[
    Knob::Bf16,
    Knob::Checkpointing,
    Knob::Optimizer8bit,
    Knob::Zero1,
    Knob::Zero2,
    Knob::MicroBatch,
    Knob::Zero3,
    Knob::MoreGpus,
    Knob::OffloadOptimizer,
    Knob::OffloadParams,
];
const SERVE_LADDER: &[Knob] = &[
    Knob::KvFp8,
    Knob::WeightsFp8,
    Knob::FewerSequences,
    Knob::WeightsInt4,
    Knob::ShorterContext,
    Knob::TensorParallel,
];

struct Ctx<'a> {
    model: &'a Model,
    capacity: u64,
    max_gpus: u64,
    allow_offload: bool,
}

impl Ctx<'_> {
    fn limit(&self, run: &Run) -> u64 {
        match run.mode {
            Mode::Train => self.capacity,
            Mode::Infer => (self.capacity as f64 * run.gpu_memory_utilization) as u64,
        }
    }

    fn total(&self, run: &Run) -> u64 {
        match estimate(self.model, run) {
            Ok(e) => e.total(),
            Err(_) => u64::MAX,
        }
    }

    fn fits(&self, run: &Run) -> bool {
        run.validate().is_ok() && self.total(run) <= self.limit(run)
    }

    /// The run with `knob` turned to the value the ladder tries, or None when the knob does not apply.
    fn turn(&self, knob: Knob, run: &Run) -> Option<Run> {
        let mut r = run.clone();
        let dp = run.data_parallel();
        match knob {
            Knob::Bf16 if run.dtype == Dtype::Fp32 => {
                r.dtype = Dtype::Bf16;
                r.mixed_precision = MixedPrecision::Master;
            }
            Knob::Checkpointing if run.checkpointing != Checkpointing::Full => r.checkpointing = Checkpointing::Full,
            Knob::Optimizer8bit if run.optimizer == Optimizer::Adamw => r.optimizer = Optimizer::Adamw8bit,
            Knob::Zero1 if dp > 1 && run.zero < 1 => r.zero = 1,
            Knob::Zero2 if dp > 1 && run.zero < 2 => r.zero = 2,
            Knob::Zero3 if dp > 1 && run.zero < 3 => r.zero = 3,
            Knob::MicroBatch if run.batch.is_some_and(|b| b > 1) => {
                let b = run.batch?;
                let smaller: Vec<u64> = (1..b).rev().filter(|d| b % d == 0).collect();
                let pick = smaller.iter().copied().find(|&d| self.fits(&with_batch(run, d))).unwrap_or(1);
                r = with_batch(run, pick);
            }
            Knob::MoreGpus if run.gpus < self.max_gpus => {
                // More GPUs only lower per-GPU memory when something is sharded across them.
                if run.zero == 0 {
                    r.zero = 3;
                }
                let mut g = run.gpus * 2;
                r.gpus = g.min(self.max_gpus);
                while !self.fits(&r) && g < self.max_gpus {
                    g *= 2;
                    r.gpus = g.min(self.max_gpus);
                }
            }
            Knob::OffloadOptimizer if self.allow_offload && run.offload == Offload::None => {
                r.offload = Offload::Optimizer
            }
            Knob::OffloadParams if self.allow_offload && run.offload != Offload::Params => {
                r.offload = Offload::Params;
                r.zero = 3;
            }
            Knob::KvFp8 if run.kv_dtype.bits() > 8 => r.kv_dtype = Dtype::Fp8,
            Knob::WeightsFp8 if run.dtype.bits() > 8 => r.dtype = Dtype::Fp8,
            Knob::WeightsInt4 if run.dtype.bits() > 4 => r.dtype = Dtype::Int4,
            Knob::FewerSequences if run.batch.is_some_and(|b| b > 1) => {
                let b = run.batch?;
                r.batch = Some((1..b).rev().find(|&n| self.fits(&Run { batch: Some(n), ..run.clone() })).unwrap_or(1));
            }
            Knob::ShorterContext if run.seq.is_some_and(|s| s > run.block_size) => {
                let t = self.longest_seq(run, run.seq?)?;
                r.seq = Some(t);
            }
            Knob::TensorParallel if run.gpus < self.max_gpus => {
                let mut tp = run.tensor_parallel * 2;
                loop {
                    r.tensor_parallel = tp;
                    r.gpus = tp * run.pipeline_parallel;
                    if self.fits(&r) || r.gpus * 2 > self.max_gpus {
                        break;
                    }
                    tp *= 2;
                }
                if r.gpus > self.max_gpus {
                    return None;
                }
            }
            _ => return None,
        }
        Some(r)
    }

    /// The longest sequence (a multiple of the block size, below `upto`) that fits, if any.
    fn longest_seq(&self, run: &Run, upto: u64) -> Option<u64> {
        let bs = run.block_size;
        let (mut lo, mut hi) = (0u64, (upto - 1) / bs);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.fits(&Run { seq: Some(mid * bs), ..run.clone() }) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        (lo > 0).then_some(lo * bs)
    }
}

fn with_batch(run: &Run, b: u64) -> Run {
    let global = run.batch.unwrap_or(1) * run.grad_accumulation;
    Run { batch: Some(b), grad_accumulation: (global / b).max(1), ..run.clone() }
}

/// Proposals for a run that does not fit in `capacity` bytes per GPU (empty when it fits).
pub fn solve(model: &Model, run: &Run, capacity: u64, max_gpus: u64) -> Vec<Proposal> {
    let cx = Ctx { model, capacity, max_gpus: max_gpus.max(run.gpus), allow_offload: true };
    if cx.fits(run) {
        return Vec::new();
    }
    let mut out = vec![walk(&cx, run)];
    // Offload trades a lot of speed; say what more GPUs would do instead.
    let offloads = out[0].changes.iter().any(|c| c.knob == "offload");
    if run.mode == Mode::Train && run.data_parallel() > 1 && offloads {
        let more = Ctx { max_gpus: (run.gpus * 8).max(cx.max_gpus), allow_offload: false, ..cx };
        let mut alt = walk(&more, run);
        if alt.fits {
            alt.note = Some("without CPU offload: more GPUs instead".into());
            out.push(alt);
        }
    }
    out
}

fn walk(cx: &Ctx, original: &Run) -> Proposal {
    let ladder = match original.mode {
        Mode::Train => TRAIN_LADDER,
        Mode::Infer => SERVE_LADDER,
    };
    let mut run = original.clone();
    for &knob in ladder {
        if cx.fits(&run) {
            break;
        }
        if let Some(next) = cx.turn(knob, &run) {
            // A knob that does not lower the total is not worth its cost.
            if cx.total(&next) < cx.total(&run) {
                run = next;
            }
        }
    }
    let fits = cx.fits(&run);
    if fits {
        settle(cx, original, &mut run);
    }
    let total = cx.total(&run);
    let limit = cx.limit(&run);
    let note = (!fits).then(|| {
        format!(
            "does not fit even with every knob turned: {} needed per GPU, {} available",
            bytes_text(total as u128),
            bytes_text(limit as u128)
        )
    });
    Proposal { fits, total_bytes: total, limit_bytes: limit, changes: changes(cx, original, &run), note }
}

/// Moves every changed knob back toward its original value as far as the run still fits, in ladder order, so the
/// proposal changes as little as it can.
fn settle(cx: &Ctx, original: &Run, run: &mut Run) {
    let try_set = |run: &mut Run, candidates: Vec<Run>| {
        if let Some(r) = candidates.into_iter().find(|r| cx.fits(r)) {
            *run = r;
        }
    };
    if run.dtype != original.dtype {
        let mut cands = vec![Run { dtype: original.dtype, mixed_precision: original.mixed_precision, ..run.clone() }];
        if original.mode == Mode::Infer && run.dtype == Dtype::Int4 && original.dtype.bits() > 8 {
            cands.push(Run { dtype: Dtype::Fp8, ..run.clone() });
        }
        try_set(run, cands);
    }
    if run.kv_dtype != original.kv_dtype {
        try_set(run, vec![Run { kv_dtype: original.kv_dtype, ..run.clone() }]);
    }
    if run.checkpointing != original.checkpointing {
        try_set(run, vec![Run { checkpointing: original.checkpointing, ..run.clone() }]);
    }
    if run.optimizer != original.optimizer {
        try_set(run, vec![Run { optimizer: original.optimizer, ..run.clone() }]);
    }
    if run.zero != original.zero && run.offload != Offload::Params {
        try_set(run, (original.zero..run.zero).map(|z| Run { zero: z, ..run.clone() }).collect());
    }
    if run.offload != original.offload {
        let order = [Offload::None, Offload::Optimizer, Offload::Params];
        let from = order.iter().position(|o| *o == original.offload).unwrap_or(0);
        let to = order.iter().position(|o| *o == run.offload).unwrap_or(0);
        try_set(run, order[from..to].iter().map(|&o| Run { offload: o, ..run.clone() }).collect());
    }
    if run.gpus != original.gpus {
        let mut cands = Vec::new();
        let mut g = original.gpus;
        while g < run.gpus {
            cands.push(match run.mode {
                Mode::Train => Run { gpus: g, ..run.clone() },
                Mode::Infer => Run { gpus: g, tensor_parallel: g / run.pipeline_parallel, ..run.clone() },
            });
            g *= 2;
        }
        try_set(run, cands);
    }
    if run.batch != original.batch {
        if let (Some(orig), Some(now)) = (original.batch, run.batch) {
            let global = orig * original.grad_accumulation;
            let cands: Vec<Run> = (now + 1..=orig)
                .rev()
                .filter(|d| run.mode == Mode::Infer || orig % d == 0)
                .map(|d| Run {
                    batch: Some(d),
                    grad_accumulation: if run.mode == Mode::Train { (global / d).max(1) } else { 1 },
                    ..run.clone()
                })
                .collect();
            try_set(run, cands);
        }
    }
    if run.seq != original.seq {
        if let Some(orig) = original.seq {
            let mut cands = vec![Run { seq: Some(orig), ..run.clone() }];
            if let Some(t) = cx.longest_seq(run, orig) {
                cands.push(Run { seq: Some(t), ..run.clone() });
            }
            try_set(run, cands);
        }
    }
}

fn changes(cx: &Ctx, a: &Run, b: &Run) -> Vec<Change> {
    let mut v = Vec::new();
    let mut add = |knob: &'static str, from: String, to: String, cost: String| {
        if from != to {
            v.push(Change { knob, from, to, cost });
        }
    };
    match a.mode {
        Mode::Train => {
            add(
                "dtype",
                a.dtype.name().into(),
                b.dtype.name().into(),
                "none on Ampere or newer (faster: tensor cores); fp16 instead needs loss scaling".into(),
            );
            add(
                "checkpointing",
                a.checkpointing.name(),
                b.checkpointing.name(),
                "~20–30% more compute per step: each layer's forward runs again during backward".into(),
            );
            add(
                "optimizer",
                a.optimizer.name().into(),
                b.optimizer.name().into(),
                "bitsandbytes; 8-bit moments usually match AdamW for fine-tuning, no speed cost".into(),
            );
            add(
                "zero",
                a.zero.to_string(),
                b.zero.to_string(),
                match b.zero {
                    3 => {
                        "~1.5× DDP's communication: parameters are all-gathered in forward and again in backward".into()
                    }
                    _ => "none: reduce-scatter + all-gather move the same bytes as DDP's all-reduce".into(),
                },
            );
            if let (Some(x), Some(y)) = (a.batch, b.batch) {
                add(
                    "batch",
                    x.to_string(),
                    y.to_string(),
                    format!(
                        "same global batch with {}× gradient accumulation: more, smaller steps keep the GPU less busy",
                        b.grad_accumulation
                    ),
                );
            }
            add("gpus", a.gpus.to_string(), b.gpus.to_string(), format!("{}× the hardware", b.gpus / a.gpus.max(1)));
            let host = match b.offload {
                Offload::None => String::new(),
                _ => {
                    let moved: u128 = estimate(cx.model, &Run { offload: Offload::None, ..b.clone() })
                        .map(|e| {
                            e.items
                                .iter()
                                .filter(|i| i.category == Some("optimizer_state"))
                                .map(|i| i.bytes as u128)
                                .sum::<u128>()
                        })
                        .unwrap_or(0);
                    format!(
                        "; needs {} of host RAM per GPU, {} for all {}",
                        crate::units::gb(moved as u64),
                        crate::units::gb((moved * b.gpus as u128) as u64),
                        b.gpus
                    )
                }
            };
            add(
                "offload",
                a.offload.name().into(),
                b.offload.name().into(),
                match b.offload {
                    Offload::Params => format!("parameters stream over PCIe every step: often 5–10× slower{host}"),
                    _ => format!("the optimizer step runs on the CPU: 2–5× slower steps{host}"),
                },
            );
        }
        Mode::Infer => {
            add(
                "kv_dtype",
                a.kv_dtype.name().into(),
                b.kv_dtype.name().into(),
                "small accuracy cost; vLLM --kv-cache-dtype fp8".into(),
            );
            add(
                "dtype",
                a.dtype.name().into(),
                b.dtype.name().into(),
                match b.dtype {
                    Dtype::Int4 => "AWQ/GPTQ 4-bit checkpoint: some quality loss, most on reasoning and code".into(),
                    _ => "FP8 checkpoint: near-lossless W8A8 on Ada/Hopper, weight-only on older GPUs".into(),
                },
            );
            if let (Some(x), Some(y)) = (a.batch, b.batch) {
                add(
                    "batch",
                    x.to_string(),
                    y.to_string(),
                    format!("{y} concurrent sequences instead of {x} (--max-num-seqs): lower throughput"),
                );
            }
            if let (Some(x), Some(y)) = (a.seq, b.seq) {
                add(
                    "seq",
                    x.to_string(),
                    y.to_string(),
                    format!("prompts + outputs limited to {y} tokens (--max-model-len)"),
                );
            }
            add(
                "gpus",
                a.gpus.to_string(),
                b.gpus.to_string(),
                format!("tensor parallelism over {} GPUs (--tensor-parallel-size)", b.gpus),
            );
        }
    }
    v
}
