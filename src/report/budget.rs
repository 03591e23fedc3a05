//! `oomdoc budget`'s sheet as text, markdown or JSON, and the predicted-vs-measured table `oomdoc analyze --model`
//! adds to a report.

use std::fmt::Write;

use super::Format;
use crate::analysis::prediction::Comparison;
use crate::budget::estimate::thousands;
use crate::budget::model::count;
use crate::budget::run::Mode;
use crate::budget::{model_states, Budget};
use crate::units::{bytes, gb};

pub fn render(b: &Budget, format: Format) -> String {
    match format {
        Format::Text => text(b),
        Format::Markdown => markdown(b),
        Format::Json => serde_json::to_string_pretty(b).expect("budget serialises") + "\n",
        // The sheet is a table of figures: on a page, as it reads in a terminal.
        Format::Html => super::html::document(
            "oomdoc budget",
            &format!("<h1>Memory budget</h1>\n<pre>{}</pre>\n", super::html::esc(&text(b))),
        ),
    }
}

fn header(b: &Budget) -> String {
    let mut params = format!("{} parameters", count(b.parameters));
    if let Some(a) = b.model.active_parameters {
        params.push_str(&format!(" ({} active per token)", count(a)));
    }
    format!("{} ({}) · {params}", b.model.name, b.model.source)
}

fn verdict(b: &Budget) -> Option<String> {
    let (g, limit, headroom) = (b.gpu.as_ref()?, b.limit_bytes?, b.headroom_bytes?);
    let share = match b.run.mode {
        Mode::Infer => format!("{:.0}% of ", b.run.gpu_memory_utilization * 100.0),
        Mode::Train => String::new(),
    };
    let of = format!("{share}{} ({})", g.name, gb(g.capacity_bytes));
    Some(if headroom >= 0 {
        let counted = match (&b.left_out, b.run.mode) {
            (Some(_), Mode::Train) => "model states fit",
            (Some(_), Mode::Infer) => "the weights fit",
            (None, _) => "fits",
        };
        let mut v = format!(
            "{counted} on {of}: {} per GPU, {} headroom ({:.0}%)",
            gb(b.total_bytes),
            gb(headroom as u64),
            headroom as f64 * 100.0 / limit.max(1) as f64
        );
        if let Some(l) = &b.left_out {
            v.push_str(&format!("; {} not estimated — {}", l.what, l.give));
        }
        v
    } else {
        format!(
            "does not fit on {of}: {} per GPU needs {} more than the {} there is{}",
            gb(b.total_bytes),
            gb(headroom.unsigned_abs()),
            gb(limit),
            b.left_out.as_ref().map_or(String::new(), |l| format!(", before {}, which are not estimated", l.what))
        )
    })
}

fn text(b: &Budget) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "oomdoc budget  {}", header(b));
    let _ = writeln!(o, "{}\n", b.run.summary());
    let _ = writeln!(o, "Per GPU                               GB        GiB   formula / assumption");
    for i in &b.items {
        let _ = writeln!(o, "  {:<30} {:>9} {:>10}   {}", i.name, gb(i.bytes), bytes(i.bytes), i.formula);
        let _ = writeln!(o, "  {:<30} {:>9} {:>10}   {}", "", "", "", i.assumption);
    }
    let _ = writeln!(o, "  {:<30} {:>9} {:>10}", "total", gb(b.total_bytes), bytes(b.total_bytes));
    if b.run.mode == Mode::Train {
        let states = model_states(b);
        let _ = writeln!(
            o,
            "  {:<30} {:>9} {:>10}   weights + gradients + optimizer states + master weights",
            "  of which model states",
            gb(states),
            bytes(states)
        );
    }
    if let Some(v) = verdict(b) {
        let _ = writeln!(o, "\nVerdict: {v}");
    }
    if let Some(p) = &b.paged_attention {
        let _ = writeln!(o, "\nPagedAttention");
        let _ = writeln!(
            o,
            "  KV budget {} = {:.0}% of the GPU − {} for everything else",
            gb(p.kv_budget_bytes),
            b.run.gpu_memory_utilization * 100.0,
            gb(b.total_bytes - crate::budget::predicted(&b.items, "kv_cache"))
        );
        let _ = writeln!(
            o,
            "  {} blocks of {} tokens ({} each, {} per token) = {} tokens",
            thousands(p.blocks as u128),
            p.block_size,
            bytes(p.block_bytes),
            bytes(p.kv_bytes_per_token),
            thousands(p.tokens as u128)
        );
        let _ = writeln!(o, "  concurrent sequences of {} tokens: {}", p.seq, p.max_sequences_at_seq);
        let limit = match p.model_max_len {
            Some(m) if m <= p.tokens => format!(" (the model's own limit, max_position_embeddings = {m})"),
            Some(m) => format!(" (the model allows {m})"),
            None => String::new(),
        };
        let _ = writeln!(o, "  largest max_model_len that fits: {}{limit}", thousands(p.largest_max_model_len as u128));
    }
    if !b.proposals.is_empty() {
        let _ = writeln!(o, "\nWhat would fit");
        for (n, p) in b.proposals.iter().enumerate() {
            let head = match (&p.note, p.fits) {
                (Some(note), _) => note.clone(),
                (None, true) => "the cheapest change set that fits".into(),
                (None, false) => "nothing fits".into(),
            };
            let _ = writeln!(o, "  {}. {head}", n + 1);
            for c in &p.changes {
                let _ = writeln!(o, "     --{:<14} {:>10} → {:<12} {}", knob_flag(c.knob), c.from, c.to, c.cost);
            }
            let _ = writeln!(
                o,
                "     → {} per GPU of {}{}",
                gb(p.total_bytes),
                gb(p.limit_bytes),
                if p.fits { format!(", {} headroom", gb(p.limit_bytes - p.total_bytes)) } else { String::new() }
            );
        }
    }
    if !b.notes.is_empty() {
        let _ = writeln!(o, "\nNotes");
        for n in &b.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    o
}

/// The flag that sets a knob.
fn knob_flag(knob: &str) -> String {
    knob.replace('_', "-")
}

fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('*', "\\*").replace('_', "\\_").replace('<', "&lt;")
}

fn markdown(b: &Budget) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "## Memory budget (oomdoc {})\n", b.tool_version);
    let _ = writeln!(o, "{}  \n{}\n", esc(&header(b)), esc(&b.run.summary()));
    let _ = writeln!(o, "| item | GB | GiB | formula | assumption |");
    let _ = writeln!(o, "|---|---:|---:|---|---|");
    for i in &b.items {
        let _ = writeln!(
            o,
            "| {} | {} | {} | `{}` | {} |",
            i.name,
            gb(i.bytes),
            bytes(i.bytes),
            i.formula,
            esc(&i.assumption)
        );
    }
    let _ = writeln!(o, "| **total** | **{}** | **{}** | | |", gb(b.total_bytes), bytes(b.total_bytes));
    if let Some(v) = verdict(b) {
        let _ = writeln!(o, "\n**Verdict:** {}", esc(&v));
    }
    if let Some(p) = &b.paged_attention {
        let _ = writeln!(
            o,
            "\n**PagedAttention:** {} of KV budget = {} blocks of {} tokens = {} tokens; {} concurrent sequences of {} \
             tokens; largest `max_model_len` {}.",
            gb(p.kv_budget_bytes),
            thousands(p.blocks as u128),
            p.block_size,
            thousands(p.tokens as u128),
            p.max_sequences_at_seq,
            p.seq,
            thousands(p.largest_max_model_len as u128)
        );
    }
    for (n, p) in b.proposals.iter().enumerate() {
        let head = p.note.clone().unwrap_or_else(|| "The cheapest change set that fits".into());
        let _ = writeln!(o, "\n### What would fit ({}): {}\n", n + 1, esc(&head));
        let _ = writeln!(o, "| knob | now | fits with | cost |");
        let _ = writeln!(o, "|---|---|---|---|");
        for c in &p.changes {
            let _ = writeln!(o, "| `--{}` | {} | {} | {} |", knob_flag(c.knob), c.from, c.to, esc(&c.cost));
        }
        let _ = writeln!(o, "\n{} per GPU of {}.", gb(p.total_bytes), gb(p.limit_bytes));
    }
    if !b.notes.is_empty() {
        let _ = writeln!(o);
        for n in &b.notes {
            let _ = writeln!(o, "> {}\n", esc(n));
        }
    }
    o
}

pub(super) fn ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}×"))
}

/// The predicted-vs-measured block of `oomdoc analyze --model` (text report).
pub fn comparison_text(o: &mut String, c: &Comparison) {
    let _ = writeln!(o, "\n  Predicted vs measured  (budget for {}: {})", c.model, c.run);
    let _ = writeln!(o, "    {:<18} {:>10} {:>10} {:>8}", "category", "predicted", "measured", "ratio");
    for r in &c.rows {
        let _ = writeln!(
            o,
            "    {:<18} {:>10} {:>10} {:>8}",
            r.category.replace('_', " "),
            bytes(r.predicted_bytes),
            bytes(r.measured_bytes),
            ratio(r.ratio)
        );
    }
    if c.unknown_bytes > 0 {
        let _ = writeln!(
            o,
            "    {:<18} {:>10} {:>10}   could belong to any row",
            "uncategorised",
            "–",
            bytes(c.unknown_bytes)
        );
    }
    let _ = writeln!(
        o,
        "    {:<18} {:>10} {:>10}   CUDA context, NCCL: outside PyTorch's allocator, not in a snapshot",
        "outside PyTorch",
        bytes(c.outside_allocator_bytes),
        "–"
    );
}

/// The predicted-vs-measured table of `oomdoc analyze --model` (markdown report).
pub fn comparison_markdown(o: &mut String, c: &Comparison) {
    let _ = writeln!(o, "Predicted vs measured (budget for {}: {}):\n", esc(&c.model), esc(&c.run));
    let _ = writeln!(o, "| category | predicted | measured | ratio |");
    let _ = writeln!(o, "|---|---:|---:|---:|");
    for r in &c.rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} |",
            r.category.replace('_', " "),
            bytes(r.predicted_bytes),
            bytes(r.measured_bytes),
            ratio(r.ratio)
        );
    }
    if c.unknown_bytes > 0 {
        let _ = writeln!(o, "| uncategorised | – | {} | |", bytes(c.unknown_bytes));
    }
    let _ = writeln!(o);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_gigabytes() {
        assert_eq!(gb(68_719_476_736), "68.7 GB");
        assert_eq!(gb(112_000_000_000), "112.0 GB");
        assert_eq!(gb(38_500_000_000), "38.5 GB");
        assert_eq!(gb(1_234_000_000_000), "1.23 TB");
        assert_eq!(gb(604_000_000), "604 MB");
    }
}
