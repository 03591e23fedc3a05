//! Markdown for an incident ticket (GitHub, GitLab, Jira's markdown): summary table first, detail collapsed.

use std::fmt::Write;

use super::wording::{self, Highlight};
use super::{percent, stream_name};
use crate::analysis::{stacks::folded, Analysis, DeviceReport, ReportSource};
use crate::timeline::Timeline;
use crate::units::{bytes, duration_us};

/// Escapes text for a table cell or inline prose.
/// Escapes Markdown in prose; text inside `code spans` is left as written (a backslash there would show), except
/// `|`, which would end a table cell.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for (i, part) in s.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        if i % 2 == 1 {
            out.push_str(&part.replace('|', "\\|"));
        } else {
            // `<` only where it could open an HTML tag (`<1%` reads as itself, as in the tables); `>` only where it
            // would start a quote.
            let mut prev: Option<char> = None;
            let mut chars = part.chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '|' => out.push_str("\\|"),
                    '*' => out.push_str("\\*"),
                    '_' => out.push_str("\\_"),
                    '<' if chars.peek().is_some_and(|n| n.is_ascii_alphabetic() || matches!(n, '/' | '!' | '?')) => {
                        out.push_str("&lt;")
                    }
                    '>' if prev.is_none_or(|p| p == '\n') => out.push_str("&gt;"),
                    c => out.push(c),
                }
                prev = Some(c);
            }
        }
    }
    out
}

pub fn render(a: &Analysis, tl: &Timeline) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "## GPU memory report (oomdoc {})\n", a.tool_version);
    for i in &a.inputs {
        let _ = writeln!(o, "- `{}` — {}", i.path, esc(&wording::input_line(i)));
    }
    if let Some(c) = &a.clock {
        let _ = writeln!(o, "- Clock: {}", esc(&c.description));
    }
    let _ = writeln!(o);
    if let Some(s) = &a.serving {
        let _ = writeln!(o, "**Serving engine (vLLM)**: {}\n", esc(&wording::serving_lines(s).join("; ")));
    }
    if a.devices.is_empty() && a.findings.is_empty() {
        if a.profile.is_none() {
            let _ = writeln!(o, "No GPU memory in these files: no segments, no trace events, no OOM message.");
        }
        profile_section(&mut o, a);
        return o;
    }
    if a.devices.iter().any(|d| d.verdict.is_some()) {
        let _ = writeln!(o, "### Verdict\n");
        for d in &a.devices {
            let Some(v) = &d.verdict else { continue };
            let _ = match wording::summary_after_gpu(d, &v.summary) {
                Some(rest) => writeln!(o, "**GPU {}** {}\n", d.device, esc(rest)),
                None => writeln!(o, "**GPU {}**: {}\n", d.device, esc(&v.summary)),
            };
            for line in wording::verdict_detail(d) {
                let _ = writeln!(o, "- {}", esc(&line));
            }
            let _ = writeln!(o);
        }
    }
    if !a.findings.is_empty() {
        let _ = writeln!(o, "### Findings\n");
        for f in &a.findings {
            let gpu = f.device.map_or(String::new(), |d| format!("GPU {d}: "));
            let explains = f.bytes.map_or(String::new(), |b| format!(", explains {}", bytes(b)));
            let _ = writeln!(
                o,
                "- **{}** — {gpu}{} (`{}`{explains})  \n  {}  \n  **Fix:** {}",
                f.severity,
                esc(&f.title),
                f.rule,
                esc(&f.message),
                esc(&f.fix)
            );
        }
    }
    if a.devices.is_empty() {
        let _ = writeln!(o);
        profile_section(&mut o, a);
        return o;
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "| GPU | moment | OOM request | allocated | reserved | cached free | largest free block | peak allocated |"
    );
    let _ = writeln!(o, "|---|---|---|---:|---:|---:|---:|---:|");
    for d in &a.devices {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {} |",
            d.device,
            d.moment,
            d.oom.as_ref().and_then(|x| x.requested_bytes).map_or("–".into(), bytes),
            bytes(d.allocated_bytes),
            bytes(d.reserved_bytes),
            bytes(d.reserved_unallocated_bytes),
            percent(d.reserved_unallocated_bytes, d.reserved_bytes),
            bytes(d.largest_free_block_bytes),
            d.peak.as_ref().map_or("–".into(), |p| bytes(p.allocated_bytes)),
        );
    }
    for d in &a.devices {
        device(&mut o, d, tl);
    }
    if let Some(line) = wording::other_gpus_line(&a.other_gpus) {
        let _ = writeln!(o, "\n{}", esc(&line));
    }
    profile_section(&mut o, a);
    o
}

/// What the profiler exports said, after the findings and the GPUs (as in the text report).
fn profile_section(o: &mut String, a: &Analysis) {
    let Some(p) = &a.profile else { return };
    let _ = writeln!(o, "\n### Profiler exports (Nsight Systems / Nsight Compute)\n");
    for l in wording::profile_lines(p) {
        let _ = writeln!(o, "- {}", esc(l.trim_start()));
    }
}

fn device(o: &mut String, d: &DeviceReport, tl: &Timeline) {
    let place = wording::place(d);
    let _ = writeln!(o, "\n### GPU {} at {} ({place})\n", d.device, d.moment);
    if let Some(oom) = &d.oom {
        for (i, (hl, line)) in wording::oom_lines(oom).into_iter().enumerate() {
            let line = match hl {
                Highlight::Headline | Highlight::Warn => format!("**{}**", esc(&line)),
                Highlight::Dim => format!("_{}_", esc(&line)),
                Highlight::Culprit(words) => format!("{words} `{line}`"),
                Highlight::None => esc(&line),
            };
            let _ = writeln!(o, "{}{line}  ", if i == 0 { "**OOM**: " } else { "" });
        }
        for line in wording::pinning_lines(d) {
            let _ = writeln!(o, "{}  ", esc(&line));
        }
        let _ = writeln!(o);
    }
    if let Some(obs) = &d.observed {
        for line in wording::observed_lines(obs, d) {
            let _ = writeln!(o, "- {}", esc(&line));
        }
        let _ = writeln!(o);
    }
    if d.source == ReportSource::Text {
        for n in &d.notes {
            let _ = writeln!(o, "> {}", esc(n));
        }
        return;
    }
    if !d.by_category.is_empty() {
        let parts: Vec<String> =
            d.by_category.iter().map(|c| super::wording::category_part(c, d.allocated_bytes)).collect();
        let _ = writeln!(o, "Live memory by kind: {}.\n", parts.join(", "));
    }
    if let Some(c) = &d.budget {
        super::budget::comparison_markdown(o, c);
    }
    if !d.by_stack.is_empty() && d.allocated_bytes > 0 {
        let _ = writeln!(o, "| live bytes | share | count | allocated by |");
        let _ = writeln!(o, "|---:|---:|---:|---|");
        for g in &d.by_stack {
            let _ = writeln!(
                o,
                "| {} | {} | {} | `{}` |",
                bytes(g.bytes),
                percent(g.bytes, d.allocated_bytes),
                g.count,
                g.callers.replace('`', "'")
            );
        }
        let _ = writeln!(o);
    }
    if !d.top_allocations.is_empty() {
        let _ = writeln!(o, "<details><summary>Largest live allocations ({})</summary>\n", d.top_allocations.len());
        for a in &d.top_allocations {
            let age = a.age_us.map_or(String::new(), |us| format!(", age {}", duration_us(us)));
            let _ = writeln!(o, "**{}**{age}, {}\n", bytes(a.bytes), stream_name(a.stream));
            let _ = writeln!(o, "```");
            let lines = folded(tl, a.stack_id, 12);
            if lines.is_empty() {
                let _ = writeln!(o, "(no stack recorded)");
            }
            for (_, line) in lines {
                let _ = writeln!(o, "{line}");
            }
            let _ = writeln!(o, "```\n");
        }
        let _ = writeln!(o, "</details>\n");
    }
    if d.trace.entries > 0 {
        let actions: Vec<String> = d.trace.actions.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let span = d.trace.span_us.map_or(String::new(), |s| format!(" over {}", duration_us(s)));
        let _ = writeln!(o, "Trace: {} events{span} ({}).\n", d.trace.entries, actions.join(", "));
    }
    for n in &d.notes {
        let _ = writeln!(o, "> {}\n", esc(n));
    }
}
