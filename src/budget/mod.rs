//! `oomdoc budget`: the memory budget sheet before a job runs, and the prediction `oomdoc analyze --model` puts
//! beside what a snapshot measured.
//!
//! The budget is per GPU and itemised — weights, gradients, optimizer states, master weights, activations, logits,
//! KV cache, CUDA context, NCCL — each item carrying the formula that produced it and the assumption behind it.
//! Against a GPU it gives a verdict; for serving, the PagedAttention capacity; when it does not fit, the cheapest
//! set of changes that does ([`solver`]).

pub mod args;
pub mod estimate;
pub mod gpus;
pub mod model;
pub mod run;
pub mod solver;

use serde::Serialize;

/// Why a budget could not be made: the budget layer's own error, so that it depends on nothing above it (the
/// crate's `Error` wraps it).
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A model config (`--model config.json`) the budget could not use.
    #[error("{path}: {source}")]
    Config { path: String, source: model::ConfigError },
    /// Flags that describe no run (one line for the command line).
    #[error("{0}")]
    Usage(String),
}

pub use estimate::{estimate, Estimate, Item};
pub use gpus::Gpu;
pub use model::{Dtype, Model};
pub use run::{Mode, Run};
pub use solver::Proposal;
use BudgetError as Error;

/// Version of the JSON `oomdoc budget --format json` writes.
pub const SCHEMA_VERSION: u32 = 1;

/// The budget sheet. Serialised as-is for `--format json`.
#[derive(Debug, Serialize)]
pub struct Budget {
    pub schema_version: u32,
    pub tool: &'static str,
    pub tool_version: &'static str,
    pub model: Model,
    pub run: Run,
    /// The parameter count the budget uses.
    pub parameters: u64,
    /// Per GPU.
    pub items: Vec<Item>,
    pub total_bytes: u64,
    pub gpu: Option<Gpu>,
    /// What the total is compared with: the GPU's capacity, or its `gpu_memory_utilization` share when serving.
    pub limit_bytes: Option<u64>,
    /// Null without a GPU.
    pub fits: Option<bool>,
    pub headroom_bytes: Option<i64>,
    pub paged_attention: Option<Paged>,
    pub proposals: Vec<Proposal>,
    pub notes: Vec<String>,
    /// What the total leaves out for want of flags (the verdict says it in its headline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_out: Option<estimate::LeftOut>,
}

/// vLLM-style PagedAttention capacity: what is left of `gpu_memory_utilization × capacity` after everything else
/// becomes KV-cache blocks.
#[derive(Clone, Debug, Serialize)]
pub struct Paged {
    pub block_size: u64,
    pub kv_bytes_per_token: u64,
    pub block_bytes: u64,
    /// `gpu_memory_utilization × capacity − everything but the KV cache` (0 when nothing is left).
    pub kv_budget_bytes: u64,
    pub blocks: u64,
    pub tokens: u64,
    /// Sequences of `--seq` tokens that fit at once.
    pub max_sequences_at_seq: u64,
    pub seq: u64,
    /// The longest `max_model_len` one sequence can have (vLLM refuses to start above it), within the model's
    /// own limit.
    pub largest_max_model_len: u64,
    pub model_max_len: Option<u64>,
}

/// Builds the budget for `model` running as `run`, with a verdict when `gpu` is known; the solver may raise the
/// GPU count up to `max_gpus`.
pub fn plan(model: Model, run: Run, gpu: Option<Gpu>, max_gpus: u64) -> Result<Budget, Error> {
    run.validate().map_err(|e| Error::Usage(e.0))?;
    let est = estimate(&model, &run).map_err(|e| Error::Usage(e.0))?;
    let total = est.total();
    let mut notes = model.notes.clone();
    if let (Some(seq), Some(max)) = (run.seq, model.max_position_embeddings) {
        if seq > max {
            notes.push(format!(
                "--seq {seq} is longer than the model's max_position_embeddings ({max}): vLLM refuses such a \
                 max_model_len, and quality past the trained context is not assured"
            ));
        }
    }
    notes.extend(est.notes.iter().cloned());
    let limit = gpu.as_ref().map(|g| match run.mode {
        Mode::Train => g.capacity_bytes,
        Mode::Infer => (g.capacity_bytes as f64 * run.gpu_memory_utilization) as u64,
    });
    let paged = match (&gpu, run.mode, model.shape.as_ref(), run.seq) {
        (Some(_), Mode::Infer, Some(shape), Some(seq)) => {
            let kv: u64 = est.items.iter().filter(|i| i.category == Some("kv_cache")).map(|i| i.bytes).sum();
            let per_token = estimate::kv_bytes_per_token(shape, &run).min(u64::MAX as u128) as u64;
            let budget = limit.unwrap_or(0).saturating_sub(total - kv);
            let block_bytes = per_token * run.block_size;
            let blocks = budget / block_bytes.max(1);
            let tokens = blocks * run.block_size;
            Some(Paged {
                block_size: run.block_size,
                kv_bytes_per_token: per_token,
                block_bytes,
                kv_budget_bytes: budget,
                blocks,
                tokens,
                max_sequences_at_seq: blocks / seq.div_ceil(run.block_size),
                seq,
                largest_max_model_len: model.max_position_embeddings.map_or(tokens, |m| tokens.min(m)),
                model_max_len: model.max_position_embeddings,
            })
        }
        _ => None,
    };
    let proposals = match &gpu {
        Some(g) => solver::solve(&model, &run, g.capacity_bytes, max_gpus),
        None => Vec::new(),
    };
    Ok(Budget {
        schema_version: SCHEMA_VERSION,
        tool: "oomdoc",
        tool_version: env!("CARGO_PKG_VERSION"),
        parameters: model.parameters,
        model,
        run,
        items: est.items,
        total_bytes: total,
        fits: limit.map(|l| total <= l),
        headroom_bytes: limit.map(|l| l as i64 - total as i64),
        limit_bytes: limit,
        gpu,
        paged_attention: paged,
        proposals,
        notes,
        left_out: est.left_out.clone(),
    })
}

/// Bytes the budget puts in one snapshot category (`parameter`, `activation`, …).
pub fn predicted(items: &[Item], category: &str) -> u64 {
    items.iter().filter(|i| i.category == Some(category)).map(|i| i.bytes).sum()
}

/// Weights, gradients, optimizer states and master weights: what ZeRO shards (16 bytes per parameter for
/// mixed-precision AdamW).
pub fn model_states(b: &Budget) -> u64 {
    b.items
        .iter()
        .filter(|i| matches!(i.name.as_str(), "weights" | "gradients" | "optimizer states" | "master weights"))
        .map(|i| i.bytes)
        .sum()
}
