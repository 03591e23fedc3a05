//! Megatron-LM's own account of memory, beside the snapshot's: the footprint it predicted and what its ranks
//! reported (`megatron.*` job facts).

use super::facts::{Facts, Unit};
use crate::timeline::MegatronLog;

pub fn facts(log: &MegatronLog, f: &mut Facts) {
    if log.is_empty() {
        return;
    }
    f.flag("megatron.present", true, "Megatron-LM's memory lines were read");
    let opt = |f: &mut Facts, name: &str, v: Option<u64>, doc: &'static str| {
        f.opt(name, v.map(|b| b as f64), Unit::Bytes, doc);
    };
    opt(
        f,
        "megatron.theoretical_weight_optimizer_bytes",
        log.weight_optimizer_bytes,
        "Megatron's estimate: weights and optimizer state",
    );
    opt(f, "megatron.theoretical_activation_bytes", log.activation_bytes, "Megatron's estimate: activations");
    opt(
        f,
        "megatron.theoretical_total_bytes",
        log.total_bytes.or(log.weight_optimizer_bytes),
        "Megatron's estimate: in total (weights and optimizer only when it printed no activations)",
    );
    // The rank that reserved most, at its last report.
    if let Some(r) = log.reports.iter().max_by_key(|r| (r.max_reserved_bytes, r.iteration)) {
        f.num(
            "megatron.max_reserved_bytes",
            r.max_reserved_bytes as f64,
            Unit::Bytes,
            "the most any rank reserved (its report_memory line)",
        );
        f.num(
            "megatron.max_allocated_bytes",
            r.max_allocated_bytes as f64,
            Unit::Bytes,
            "what that rank allocated at most",
        );
        f.num("megatron.rank", r.rank as f64, Unit::Count, "the rank that reserved most");
        if let Some(i) = r.iteration {
            f.num("megatron.iteration", i as f64, Unit::Count, "the iteration of that report");
        }
    }
    f.num("megatron.reports", log.reports.len() as f64, Unit::Count, "report_memory lines read");
}
