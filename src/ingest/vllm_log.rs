//! vLLM server logs: the KV-cache capacity announced at start-up, the periodic usage lines, and preemptions.
//!
//! Wordings by generation (from real logs; see `fixtures/real/logs/`):
//! - start-up, V0: `# GPU blocks: 11351, # CPU blocks: 4096`; V1: `# GPU blocks: 1381`, `GPU KV cache size: 178,880
//!   tokens`, `Available KV cache memory: 8.11 GiB`, `Maximum concurrency for 2048 tokens per request: 10.79x`;
//!   the memory profile `model weights take 21.67GiB; non_torch_memory takes 0.13GiB; … the rest of the memory
//!   reserved for KV Cache is 17.79GiB.`; `Loading model weights took 13.9476 GB`;
//! - capacity failure: `The model's max seq len (131072) is larger than the maximum number of tokens that can be
//!   stored in KV cache (81536)`;
//! - periodic stats, V0: `Running: 34 reqs, Swapped: 100 reqs, Pending: 9832 reqs, GPU KV cache usage: 99.2%, CPU KV
//!   cache usage: 70.4%`; V1: `Engine 000: … Running: 18 reqs, Waiting: 43 reqs, GPU KV cache usage: 95.9%, …`;
//! - preemption (V0 scheduler): `… is preempted by PreemptionMode.SWAP mode because there is not enough KV cache
//!   space. … total_num_cumulative_preemption=151`; V1 only counts them in its stats.
//!
//! Lines carry `MM-DD HH:MM:SS` with no year; only a zone-carrying prefix (docker `--timestamps`) or a full date
//! gives a stamp. Order in the file is what the facts use.

use std::sync::OnceLock;

use regex::Regex;

use super::text::{find_stamp, lines, parse_size, re, strip_ansi};
use crate::timeline::{KvStat, Preemption, ServingLog};

fn num(s: &str) -> Option<u64> {
    s.replace(',', "").parse().ok()
}

fn capture<'t>(cell: &'static OnceLock<Regex>, pattern: &str, line: &'t str) -> Option<regex::Captures<'t>> {
    re(cell, pattern).captures(line)
}

/// True when the text holds at least one line only a vLLM log writes.
pub fn sniff(text: &str) -> bool {
    let p = parse(text, "");
    !p.is_empty()
}

/// Reads every KV-cache line of a vLLM log. `source` names the file.
pub fn parse(text: &str, source: &str) -> ServingLog {
    static BLOCKS: OnceLock<Regex> = OnceLock::new();
    static TOKENS: OnceLock<Regex> = OnceLock::new();
    static AVAILABLE: OnceLock<Regex> = OnceLock::new();
    static REST: OnceLock<Regex> = OnceLock::new();
    static NON_TORCH: OnceLock<Regex> = OnceLock::new();
    static WEIGHTS: OnceLock<Regex> = OnceLock::new();
    static CONCURRENCY: OnceLock<Regex> = OnceLock::new();
    static TOO_SMALL: OnceLock<Regex> = OnceLock::new();
    static USAGE: OnceLock<Regex> = OnceLock::new();
    static PREEMPT: OnceLock<Regex> = OnceLock::new();
    static GRAPHS: OnceLock<Regex> = OnceLock::new();
    let mut log = ServingLog::default();
    let mut seen = false;
    for (no, raw) in lines(text) {
        let line = strip_ansi(&raw);
        if let Some(c) = capture(&BLOCKS, r"# GPU blocks: ([\d,]+)(?:, # CPU blocks: ([\d,]+))?", &line) {
            log.capacity.gpu_blocks = num(&c[1]);
            log.capacity.cpu_blocks = c.get(2).and_then(|m| num(m.as_str()));
            seen = true;
        }
        if let Some(c) = capture(&TOKENS, r"GPU KV cache size: ([\d,]+) tokens", &line) {
            log.capacity.tokens = num(&c[1]);
            seen = true;
        }
        if let Some(c) = capture(&AVAILABLE, r"Available KV cache memory: ([\d.]+) ?([KMGT]i?B)", &line) {
            log.capacity.kv_bytes = parse_size(&c[1], &c[2]);
            seen = true;
        }
        if let Some(c) = capture(&REST, r"reserved for KV Cache is ([\d.]+) ?([KMGT]i?B)", &line) {
            log.capacity.kv_bytes = parse_size(&c[1], &c[2]);
            seen = true;
        }
        if let Some(c) = capture(&NON_TORCH, r"non_torch_memory takes ([\d.]+) ?([KMGT]i?B)", &line) {
            log.capacity.non_torch_bytes = parse_size(&c[1], &c[2]);
        }
        if let Some(c) =
            capture(&WEIGHTS, r"(?:Loading model weights took|model weights take) ([\d.]+) ?([KMGT]i?B)", &line)
        {
            log.capacity.weights_bytes = parse_size(&c[1], &c[2]);
        }
        if let Some(c) = capture(&CONCURRENCY, r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", &line)
        {
            if let (Some(t), Ok(x)) = (num(&c[1]), c[2].parse::<f64>()) {
                log.capacity.max_concurrency = Some((t, x));
                seen = true;
            }
        }
        if let Some(c) = capture(
            &TOO_SMALL,
            r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)",
            &line,
        ) {
            if let (Some(a), Some(b)) = (num(&c[1]), num(&c[2])) {
                log.capacity.too_small = Some((a, b));
                seen = true;
            }
        }
        if let Some(c) = capture(
            &USAGE,
            r"(?:Engine (\d+): )?Avg prompt throughput:.*?Running: (\d+) reqs(?:, Swapped: (\d+) reqs)?, (?:Pending|Waiting): (\d+) reqs, GPU KV cache usage: ([\d.]+)%(?:, CPU KV cache usage: ([\d.]+)%)?",
            &line,
        ) {
            let pct = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<f64>().ok()).map(|p| p / 100.0);
            let int = |i: usize| c.get(i).and_then(|m| num(m.as_str()));
            if let Some(gpu_usage) = pct(5) {
                log.stats.push(KvStat {
                    stamp: stamp_of(&line),
                    line: no,
                    engine: int(1).unwrap_or(0) as u32,
                    gpu_usage,
                    cpu_usage: pct(6),
                    running: int(2),
                    waiting: int(4),
                    swapped: int(3),
                });
                seen = true;
            }
        }
        if let Some(c) = capture(&GRAPHS, r"Estimated CUDA graph memory: ([\d.]+) ?([KMGT]i?B) total", &line) {
            log.capacity.cuda_graph_bytes = parse_size(&c[1], &c[2]);
            seen = true;
        }
        if line.contains("No available memory for the cache blocks") {
            log.capacity.no_cache_memory = true;
            seen = true;
        }
        // The hint vLLM puts on an OOM raised while it captures CUDA graphs (not its start-up advice to disable the
        // profiling, which names the same variable).
        if line.contains("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0")
            && (line.contains("If this problem persists") || line.to_ascii_lowercase().contains("out of memory"))
        {
            log.capacity.oom_in_cudagraph_capture = true;
            seen = true;
        }
        if let Some(c) = capture(
            &PREEMPT,
            r"preempted by PreemptionMode\.(\w+) mode.*?(?:total_num_cumulative_preemption=(\d+))?\s*$",
            &line,
        ) {
            log.preemptions.push(Preemption {
                stamp: stamp_of(&line),
                line: no,
                mode: c[1].to_string(),
                cumulative: c.get(2).and_then(|m| num(m.as_str())),
            });
            seen = true;
        }
    }
    if seen && !source.is_empty() {
        log.source.push(source.to_string());
    }
    log
}

/// A full date on the line (docker's prefix, an ISO logger); vLLM's own `MM-DD HH:MM:SS` has no year.
fn stamp_of(line: &str) -> Option<crate::timeline::Stamp> {
    find_stamp(line).map(|(s, _, _)| s)
}

impl ServingLog {
    /// Adds what another log of the same job said.
    pub fn merge(&mut self, other: ServingLog) {
        self.source.extend(other.source);
        let (c, o) = (&mut self.capacity, other.capacity);
        c.gpu_blocks = o.gpu_blocks.or(c.gpu_blocks);
        c.cpu_blocks = o.cpu_blocks.or(c.cpu_blocks);
        c.tokens = o.tokens.or(c.tokens);
        c.kv_bytes = o.kv_bytes.or(c.kv_bytes);
        c.max_concurrency = o.max_concurrency.or(c.max_concurrency);
        c.weights_bytes = o.weights_bytes.or(c.weights_bytes);
        c.non_torch_bytes = o.non_torch_bytes.or(c.non_torch_bytes);
        c.too_small = o.too_small.or(c.too_small);
        c.cuda_graph_bytes = o.cuda_graph_bytes.or(c.cuda_graph_bytes);
        c.no_cache_memory |= o.no_cache_memory;
        c.oom_in_cudagraph_capture |= o.oom_in_cudagraph_capture;
        self.stats.extend(other.stats);
        self.preemptions.extend(other.preemptions);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v0_stats_with_a_progress_bar_glued_on_and_a_swap() {
        let log = parse(
            "Processed prompts:   0%|  | 34/10000 [00:29<3:36:54,  1.31s/it]INFO 06-16 21:24:15 metrics.py:341] Avg \
             prompt throughput: 2706.1 tokens/s, Avg generation throughput: 13395.4 tokens/s, Running: 34 reqs, \
             Swapped: 100 reqs, Pending: 9832 reqs, GPU KV cache usage: 99.2%, CPU KV cache usage: 70.4%.\n\
             WARNING 06-16 21:24:15 scheduler.py:1089] Sequence group 165 is preempted by PreemptionMode.SWAP mode \
             because there is not enough KV cache space. total_num_cumulative_preemption=151\n",
            "x.log",
        );
        assert_eq!(log.stats.len(), 1);
        let s = &log.stats[0];
        assert_eq!((s.running, s.swapped, s.waiting), (Some(34), Some(100), Some(9832)));
        assert!((s.gpu_usage - 0.992).abs() < 1e-9 && (s.cpu_usage.unwrap() - 0.704).abs() < 1e-9);
        assert_eq!(log.preemptions[0].mode, "SWAP");
        assert_eq!(log.preemptions[0].cumulative, Some(151));
        assert_eq!(log.source, ["x.log"]);
    }

    #[test]
    fn v1_capacity_and_engines() {
        let log = parse(
            "INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381\n\
             Available KV cache memory: 8.11 GiB\nGPU KV cache size: 178,880 tokens\n\
             INFO 01-30 03:19:14 kv_cache_utils.py:398] Maximum concurrency for 2048 tokens per request: 10.79x\n\
             the rest of the memory reserved for KV Cache is 17.79GiB.\n\
             INFO 12-15 18:51:34 [loggers.py:259] Engine 001: Avg prompt throughput: 600.0 tokens/s, Avg generation \
             throughput: 0.4 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache \
             hit rate: 0.0%, MFU: 0.4 TF/s/GPU 0.5 GB/s/GPU\n",
            "",
        );
        assert_eq!(log.capacity.gpu_blocks, Some(1381));
        assert_eq!(log.capacity.tokens, Some(178_880));
        assert_eq!(log.capacity.kv_bytes, parse_size("17.79", "GiB"));
        assert_eq!(log.capacity.max_concurrency, Some((2048, 10.79)));
        assert_eq!(log.stats[0].engine, 1);
        assert!(log.source.is_empty());
    }

    #[test]
    fn other_text_is_not_a_vllm_log() {
        assert!(!sniff("Traceback (most recent call last):\nRuntimeError: CUDA error: out of memory\n"));
        assert!(!sniff(""));
    }
}
