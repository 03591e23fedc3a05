//! Predicted vs measured: the budget's bytes per snapshot category beside the live bytes a snapshot recorded, as
//! a table for the report and as facts (`budget.*`) for `rules/budget-overrun.toml`.

use serde::Serialize;

use super::facts::{Fact, Unit, Val};
use super::{Analysis, DeviceReport};
use crate::budget::{predicted, Budget};

/// The categories a budget predicts, in the order the table lists them.
pub const COMPARED: [&str; 6] = ["parameter", "gradient", "optimizer_state", "activation", "kv_cache", "communication"];

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub category: &'static str,
    pub predicted_bytes: u64,
    pub measured_bytes: u64,
    /// measured / predicted (null when nothing was predicted).
    pub ratio: Option<f64>,
}

/// One device's comparison, attached to its report.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub model: String,
    pub run: String,
    pub rows: Vec<Row>,
    /// Live bytes no category pattern recognised: they belong to some row, unknown which.
    pub unknown_bytes: u64,
    /// Budgeted memory a snapshot cannot see (CUDA context, NCCL).
    pub outside_allocator_bytes: u64,
}

/// The live bytes of a category at the report's moment, from the report's own `by_category` (typed: a renamed fact
/// cannot silently zero the comparison).
fn live(d: &DeviceReport, cat: &str) -> u64 {
    d.by_category.iter().filter(|c| c.category == cat).map(|c| c.bytes).sum()
}

fn num(d: &mut DeviceReport, name: &str, v: f64, unit: Unit, doc: &'static str) {
    d.facts.insert(name, Fact { value: Val::Num(v), unit, doc });
}

fn text(d: &mut DeviceReport, name: &str, v: String, doc: &'static str) {
    d.facts.insert(name, Fact { value: Val::Str(v), unit: Unit::Plain, doc });
}

/// Puts the prediction beside every device's live memory and adds the `budget.*` facts the rules test.
pub fn attach(a: &mut Analysis, b: &Budget) {
    for d in &mut a.devices {
        let rows: Vec<Row> = COMPARED
            .iter()
            .map(|&c| {
                let (p, m) = (predicted(&b.items, c), live(d, c));
                Row { category: c, predicted_bytes: p, measured_bytes: m, ratio: (p > 0).then(|| m as f64 / p as f64) }
            })
            .filter(|r| r.predicted_bytes > 0 || r.measured_bytes > 0)
            .collect();
        let outside: u64 = b.items.iter().filter(|i| i.category.is_none()).map(|i| i.bytes).sum();
        for r in &rows {
            let name = format!("budget.{}_bytes", r.category);
            num(
                d,
                &name,
                r.predicted_bytes as f64,
                Unit::Bytes,
                "bytes the budget (--model …) predicts for this category",
            );
            if let Some(x) = r.ratio {
                num(d, &format!("budget.{}_ratio", r.category), x, Unit::Plain, "live bytes / predicted bytes");
            }
        }
        num(
            d,
            "budget.predicted_bytes",
            (b.total_bytes - outside) as f64,
            Unit::Bytes,
            "everything the budget puts in PyTorch's allocator",
        );
        text(d, "budget.checkpointing", b.run.checkpointing.name(), "activation checkpointing the budget assumed");
        text(d, "budget.model", b.model.name.clone(), "the model the budget is for");
        if let Some(x) = b.run.batch {
            num(d, "budget.batch", x as f64, Unit::Count, "micro-batch (or sequences) the budget assumed");
        }
        if let Some(x) = b.run.seq {
            num(d, "budget.seq", x as f64, Unit::Count, "sequence length the budget assumed");
        }
        // The category that blew its budget by the most bytes.
        if let Some(w) = rows
            .iter()
            .filter(|r| r.predicted_bytes > 0 && r.measured_bytes > r.predicted_bytes)
            .max_by_key(|r| r.measured_bytes - r.predicted_bytes)
        {
            text(d, "budget.worst_category", w.category.to_string(), "the category furthest over its budget");
            num(d, "budget.worst_ratio", w.ratio.unwrap_or(0.0), Unit::Plain, "its live bytes / predicted bytes");
            num(d, "budget.worst_measured_bytes", w.measured_bytes as f64, Unit::Bytes, "its live bytes");
            num(d, "budget.worst_predicted_bytes", w.predicted_bytes as f64, Unit::Bytes, "its predicted bytes");
            num(
                d,
                "budget.worst_excess_bytes",
                (w.measured_bytes - w.predicted_bytes) as f64,
                Unit::Bytes,
                "live minus predicted",
            );
        }
        d.budget = Some(Comparison {
            model: b.model.name.clone(),
            run: b.run.summary(),
            rows,
            unknown_bytes: live(d, "unknown"),
            outside_allocator_bytes: outside,
        });
    }
}
