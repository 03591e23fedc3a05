//! Megatron-LM training logs: the theoretical memory footprint it prints at start-up
//! (`megatron/training/theoretical_memory_usage.py`) and the per-rank `report_memory` lines
//! (`megatron/training/utils.py`), read as evidence beside a rank's snapshot.
//!
//! - `Theoretical memory footprints: weight and optimizer=7211.88 MB, activation=1180.45 MB, total=8392.33 MB`
//!   (the short form, weight and optimizer only, when activations are not estimated);
//! - `[Rank 0] (after 10 iterations) memory (MB) | allocated: 7253.68 | max allocated: 7959.97 | reserved: 8266.0 |
//!   max reserved: 8266.0` (newer versions append `| device usage: …`).
//!
//! Megatron's "MB" are 2^20 bytes.

use std::sync::OnceLock;

use regex::Regex;

use super::text::{find_stamp, lines, re, strip_ansi};
use crate::timeline::{MegatronLog, MegatronMemory};

const MIB: f64 = (1u64 << 20) as f64;

fn mib(s: &str) -> Option<u64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).map(|v| (v * MIB).round() as u64)
}

/// True when the text holds a line only Megatron writes.
pub fn sniff(text: &str) -> bool {
    !parse(text, "").is_empty()
}

pub fn parse(text: &str, source: &str) -> MegatronLog {
    static THEORY: OnceLock<Regex> = OnceLock::new();
    static PART: OnceLock<Regex> = OnceLock::new();
    static REPORT: OnceLock<Regex> = OnceLock::new();
    let mut log = MegatronLog::default();
    for (no, raw) in lines(text) {
        let line = strip_ansi(&raw);
        if re(&THEORY, r"Theoretical memory footprints:").is_match(&line) {
            let parts = re(&PART, r"(weight and optimizer|activation|total)=([\d.]+) MB");
            for c in parts.captures_iter(&line) {
                let v = mib(&c[2]);
                match &c[1] {
                    "weight and optimizer" => log.weight_optimizer_bytes = v,
                    "activation" => log.activation_bytes = v,
                    _ => log.total_bytes = v,
                }
            }
            continue;
        }
        let report = re(
            &REPORT,
            r"\[Rank (\d+)\]\s*(?:\(after (\d+) iterations\))?\s*memory \(MB\)\s*\|\s*allocated:\s*([\d.]+)\s*\|\s*max allocated:\s*([\d.]+)\s*\|\s*reserved:\s*([\d.]+)\s*\|\s*max reserved:\s*([\d.]+)",
        );
        if let Some(c) = report.captures(&line) {
            let (Some(a), Some(ma), Some(r), Some(mr)) = (mib(&c[3]), mib(&c[4]), mib(&c[5]), mib(&c[6])) else {
                continue;
            };
            log.reports.push(MegatronMemory {
                rank: c[1].parse().unwrap_or(0),
                iteration: c.get(2).and_then(|m| m.as_str().parse().ok()),
                allocated_bytes: a,
                max_allocated_bytes: ma,
                reserved_bytes: r,
                max_reserved_bytes: mr,
                line: no,
                stamp: find_stamp(&line).map(|(s, _, _)| s),
            });
        }
    }
    if !log.is_empty() && !source.is_empty() {
        log.source.push(source.to_string());
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footprint_and_the_report_lines() {
        let log = parse(
            " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 1315950592\n\
             Theoretical memory footprints: weight and optimizer=7211.88 MB, activation=1180.45 MB, total=8392.33 MB\n\
             [Rank 0] (after 10 iterations) memory (MB) | allocated: 7253.681640625 | max allocated: \
             7959.9697265625 | reserved: 8266.0 | max reserved: 8266.0\n\
             [Rank 4] (after 20 iterations) memory (MB) | allocated: 7253.5 | max allocated: 7960.0 | reserved: \
             8300.0 | max reserved: 8302.0 | device usage: 9120.0\n",
            "train.log",
        );
        assert_eq!(log.weight_optimizer_bytes, Some((7211.88 * MIB).round() as u64));
        assert_eq!(log.total_bytes, Some((8392.33 * MIB).round() as u64));
        assert_eq!(log.reports.len(), 2);
        let r = &log.reports[1];
        assert_eq!((r.rank, r.iteration, r.max_reserved_bytes), (4, Some(20), 8302 << 20));
        assert_eq!(log.source, ["train.log"]);
    }

    #[test]
    fn the_short_footprint_and_other_text() {
        let log = parse("Theoretical memory footprints: weight and optimizer=7211.88 MB\n", "");
        assert_eq!((log.weight_optimizer_bytes.is_some(), log.total_bytes), (true, None));
        assert!(!sniff("iteration 10/ 100 | consumed samples: 80 | lm loss: 9.1\n"));
    }
}
