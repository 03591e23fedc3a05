//! A serving engine's KV cache as its log tells it: the capacity it set aside at start-up and how full it ran.

use serde::Serialize;

use super::facts::{Facts, Unit};
use crate::timeline::{KvCapacity, KvStat, ServingLog};

#[derive(Debug, Serialize)]
pub struct ServingSummary {
    pub sources: Vec<String>,
    pub capacity: KvCapacity,
    /// Usage lines of the busiest engine (data-parallel engines log one line each).
    pub engine: u32,
    pub usage_lines: usize,
    pub usage_first: Option<f64>,
    pub usage_last: Option<f64>,
    pub usage_max: Option<f64>,
    pub waiting_first: Option<u64>,
    pub waiting_last: Option<u64>,
    pub waiting_max: Option<u64>,
    pub preemptions: u64,
    /// SWAP or RECOMPUTE, as the last preemption said.
    pub preemption_mode: Option<String>,
}

/// The stats lines of the engine whose cache ran fullest.
fn busiest(log: &ServingLog) -> (u32, Vec<&KvStat>) {
    let mut engines: Vec<u32> = log.stats.iter().map(|s| s.engine).collect();
    engines.sort_unstable();
    engines.dedup();
    let peak = |e: u32| log.stats.iter().filter(|s| s.engine == e).map(|s| s.gpu_usage).fold(0.0, f64::max);
    let engine = engines.into_iter().max_by(|a, b| peak(*a).total_cmp(&peak(*b)).then(b.cmp(a))).unwrap_or(0);
    (engine, log.stats.iter().filter(|s| s.engine == engine).collect())
}

pub fn summarize(log: &ServingLog) -> Option<ServingSummary> {
    if log.is_empty() {
        return None;
    }
    let (engine, stats) = busiest(log);
    let preemptions =
        log.preemptions.iter().filter_map(|p| p.cumulative).max().unwrap_or(0).max(log.preemptions.len() as u64);
    Some(ServingSummary {
        sources: log.source.clone(),
        capacity: log.capacity.clone(),
        engine,
        usage_lines: stats.len(),
        usage_first: stats.first().map(|s| s.gpu_usage),
        usage_last: stats.last().map(|s| s.gpu_usage),
        usage_max: stats.iter().map(|s| s.gpu_usage).reduce(f64::max),
        waiting_first: stats.first().and_then(|s| s.waiting),
        waiting_last: stats.last().and_then(|s| s.waiting),
        waiting_max: stats.iter().filter_map(|s| s.waiting).max(),
        preemptions,
        preemption_mode: log.preemptions.last().map(|p| p.mode.clone()),
    })
}

/// Job-level facts (`serving.*`) for the rules.
pub fn facts(log: &ServingLog) -> Facts {
    let mut f = Facts::default();
    let Some(s) = summarize(log) else { return f };
    f.flag("serving.present", true, "a serving engine's log (vLLM) was read");
    f.num("serving.kv_usage_lines", s.usage_lines as f64, Unit::Count, "KV-cache usage lines of the busiest engine");
    f.opt("serving.kv_usage_first", s.usage_first, Unit::Ratio, "GPU KV-cache usage on the first line");
    f.opt("serving.kv_usage_last", s.usage_last, Unit::Ratio, "GPU KV-cache usage on the last line");
    f.opt("serving.kv_usage_max", s.usage_max, Unit::Ratio, "highest GPU KV-cache usage");
    f.opt("serving.waiting_first", s.waiting_first.map(|w| w as f64), Unit::Count, "requests waiting, first line");
    f.opt("serving.waiting_last", s.waiting_last.map(|w| w as f64), Unit::Count, "requests waiting, last line");
    f.opt("serving.waiting_max", s.waiting_max.map(|w| w as f64), Unit::Count, "most requests waiting at once");
    f.num("serving.preemptions", s.preemptions as f64, Unit::Count, "sequences preempted for lack of KV space");
    if let Some(m) = &s.preemption_mode {
        f.text("serving.preemption_mode", m.clone(), "SWAP or RECOMPUTE");
    }
    let c = &s.capacity;
    f.opt("serving.kv_tokens", c.tokens.map(|t| t as f64), Unit::Count, "tokens the KV cache holds");
    f.opt("serving.kv_bytes", c.kv_bytes.map(|b| b as f64), Unit::Bytes, "memory set aside for the KV cache");
    f.opt("serving.gpu_blocks", c.gpu_blocks.map(|b| b as f64), Unit::Count, "KV-cache blocks on the GPU");
    if let Some((tokens, x)) = c.max_concurrency {
        f.num("serving.max_concurrency", x, Unit::Plain, "requests of the stated length that fit at once");
        f.num("serving.concurrency_tokens", tokens as f64, Unit::Count, "the length max_concurrency is for");
    }
    if let Some((max_len, fits)) = c.too_small {
        f.num("serving.max_model_len", max_len as f64, Unit::Count, "the model's max seq len vLLM refused");
        f.num("serving.kv_capacity_tokens", fits as f64, Unit::Count, "tokens the KV cache could hold");
    }
    f.opt(
        "serving.cuda_graph_bytes",
        c.cuda_graph_bytes.map(|b| b as f64),
        Unit::Bytes,
        "what vLLM estimated its CUDA graphs take (\"Estimated CUDA graph memory\")",
    );
    f.flag("serving.no_cache_memory", c.no_cache_memory, "vLLM found no memory left for the KV cache at start-up");
    f.flag(
        "serving.oom_in_cudagraph_capture",
        c.oom_in_cudagraph_capture,
        "the OOM came while vLLM captured CUDA graphs (its VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS hint)",
    );
    f
}
