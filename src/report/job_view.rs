//! The job view, first in a report of several ranks: the rank table, the first OOM, the ranks that stand out, the
//! findings merged across ranks. Then full reports only for the ranks that matter (see [`detailed`]).

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::analysis::job_view::{JobView, RankRow};
use crate::units::{bytes, duration_us};

/// The ranks to report in full: every rank that ran out of memory or stands out; the rank with the highest peak
/// when none did. The others are their row in the table. Ranks read from JSON reports (an index past the
/// analysed ones) have their full report in that JSON.
pub fn detailed(view: &JobView) -> BTreeSet<usize> {
    let mut keep: BTreeSet<usize> = view.ranks.iter().filter(|r| r.oom).map(|r| r.analysis).collect();
    for o in &view.outliers {
        keep.extend(view.ranks.iter().filter(|r| r.rank == o.rank && r.device == o.device).map(|r| r.analysis));
    }
    if keep.is_empty() {
        keep.extend(view.ranks.iter().max_by_key(|r| r.peak_allocated_bytes).map(|r| r.analysis));
    }
    keep
}

/// "OOM, first", "OOM, +1.20 s", "OOM" (no time), or "—".
fn oom_cell(view: &JobView, r: &RankRow) -> String {
    if !r.oom {
        return "—".into();
    }
    let first = view.first_oom.as_ref();
    if first.is_some_and(|f| f.rank == r.rank && f.device == r.device) {
        return "OOM, first".into();
    }
    let t0 = first.and_then(|f| view.ranks.iter().find(|x| x.rank == f.rank && x.device == f.device)?.oom_time_us);
    match (r.oom_time_us, t0) {
        (Some(t), Some(t0)) => format!("OOM, +{}", duration_us(t - t0)),
        _ => "OOM".into(),
    }
}

fn ranks_list(ranks: &[u32]) -> String {
    // Runs of consecutive ranks as a–b: "0–6, 9".
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j > i + 1 {
            format!("{}–{}", ranks[i], ranks[j])
        } else if j == i + 1 {
            format!("{}, {}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// The lines that say what is shown in full and why.
fn shown_in_full(view: &JobView, analysed: usize) -> String {
    let keep = detailed(view);
    // One entry per rank (a rank's GPUs may each have a reason), its reasons together.
    let mut why: Vec<(String, Vec<&str>)> = Vec::new();
    for r in view.ranks.iter().filter(|r| keep.contains(&r.analysis) && r.analysis < analysed) {
        let reason = if r.oom {
            "ran out of memory"
        } else if view.outliers.iter().any(|o| o.rank == r.rank && o.device == r.device) {
            "stands out"
        } else {
            "the highest peak"
        };
        let who = if r.unmatched {
            format!("GPU {}'s OOM message ({}, no snapshot of it)", r.device, short(&r.input))
        } else {
            format!("rank {}", r.rank)
        };
        match why.iter_mut().find(|(w, _)| *w == who) {
            Some((_, reasons)) if !reasons.contains(&reason) => reasons.push(reason),
            Some(_) => {}
            None => why.push((who, vec![reason])),
        }
    }
    let why: Vec<String> = why
        .into_iter()
        .map(|(who, reasons)| if who.starts_with("rank") { format!("{who} ({})", reasons.join(", ")) } else { who })
        .collect();
    let rest = view.ranks.iter().filter(|r| !keep.contains(&r.analysis) && r.analysis < analysed).count();
    let mut s = if why.is_empty() {
        "Every rank was read from its JSON report: each report has its rank in full".to_string()
    } else {
        format!("In full below: {}", why.join(", "))
    };
    if rest > 0 {
        s.push_str("; the other ranks are their row above (--format json has every rank in full)");
    }
    s
}

/// A path's last component (a member's name inside its archive included).
fn short(path: &str) -> &str {
    path.rsplit(['/', '!']).next().unwrap_or(path)
}

/// "rank 3, GPU 3 (train.log:4)", said as a log's message where no snapshot of that GPU was given.
fn first_oom_words(view: &JobView, f: &crate::analysis::job_view::RankRef, code: impl Fn(&str) -> String) -> String {
    let log_only = view.unmatched().any(|r| r.rank == f.rank && r.device == f.device && r.input == f.input);
    format!(
        "rank {}, GPU {} ({}{})",
        f.rank,
        f.device,
        code(&f.input),
        if log_only { ": an OOM message, no snapshot of that GPU given" } else { "" }
    )
}

fn merged_line(m: &crate::analysis::job_view::MergedFinding) -> String {
    let mut s = format!("{} on {} of {} ranks ({})", m.rule, m.ranks.len(), m.of, ranks_list(&m.ranks));
    if let Some(line) = &m.same_line {
        let _ = write!(s, ", {}{line}", if m.ranks.len() > 1 { "same line: " } else { "at " });
    }
    if let Some(b) = m.bytes {
        let _ = write!(s, "; explains up to {} on one rank", bytes(b));
    }
    s
}

pub fn text(view: &JobView, analysed: usize, bold: impl Fn(&str) -> String) -> String {
    let mut o = String::new();
    let snapshots: BTreeSet<&str> = view.ranks.iter().filter(|r| !r.unmatched).map(|r| r.input.as_str()).collect();
    let rank_count = view.rank_count();
    let reports = view
        .ranks
        .iter()
        .filter(|r| r.analysis >= analysed && !r.unmatched)
        .map(|r| r.analysis)
        .collect::<BTreeSet<_>>()
        .len();
    let from = match (snapshots.len() - reports, reports) {
        (n, 0) => format!("{n} snapshots"),
        (0, r) => format!("{r} JSON reports"),
        (n, r) => format!("{n} snapshots and {r} JSON reports"),
    };
    let _ = writeln!(o, "{}", bold(&format!("Job: {rank_count} ranks, {from}")));
    match &view.first_oom {
        Some(f) => {
            let n = view.ranks.iter().filter(|r| r.oom).count();
            let _ = writeln!(
                o,
                "  first OOM: {}{}",
                first_oom_words(view, f, str::to_string),
                if n > 1 { format!("; {n} ranks ran out of memory") } else { String::new() }
            );
        }
        None => {
            let _ = writeln!(o, "  no rank ran out of memory");
        }
    }
    let rows: Vec<[String; 7]> = view
        .ranks
        .iter()
        .map(|r| {
            [
                r.rank.to_string(),
                r.device.to_string(),
                bytes(r.peak_allocated_bytes),
                bytes(r.peak_reserved_bytes),
                oom_cell(view, r),
                r.primary_rule.clone().unwrap_or_else(|| "—".into()),
                r.input.rsplit(['/', '!']).next().unwrap_or(&r.input).to_string(),
            ]
        })
        .collect();
    let head = ["rank", "GPU", "peak allocated", "peak reserved", "OOM", "primary cause", "file"];
    let width =
        |c: usize| rows.iter().map(|r| r[c].chars().count()).chain([head[c].chars().count()]).max().unwrap_or(0);
    let widths: Vec<usize> = (0..head.len()).map(width).collect();
    let line = |cells: [&str; 7]| {
        let mut s = String::from("  ");
        for (c, cell) in cells.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            if c < 4 {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                if c + 1 < cells.len() {
                    s.push_str(&" ".repeat(pad));
                }
            }
            if c + 1 < cells.len() {
                s.push_str("  ");
            }
        }
        s.trim_end().to_string()
    };
    let _ = writeln!(o, "{}", line(head));
    for r in &rows {
        let _ = writeln!(o, "{}", line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6]]));
    }
    for out in &view.outliers {
        let _ = writeln!(o, "  stands out: rank {}, GPU {}: {}", out.rank, out.device, out.why);
    }
    for m in &view.findings {
        let _ = writeln!(o, "  across ranks: {} {}", m.severity.name(), merged_line(m));
    }
    let _ = writeln!(o, "  {}", shown_in_full(view, analysed));
    o
}

pub fn markdown(view: &JobView, analysed: usize, esc: impl Fn(&str) -> String) -> String {
    let mut o = String::new();
    let rank_count = view.rank_count();
    let _ = writeln!(o, "## Job: {rank_count} ranks\n");
    match &view.first_oom {
        Some(f) => {
            let _ = writeln!(o, "**First OOM**: {}\n", first_oom_words(view, f, |p| format!("`{p}`")));
        }
        None => {
            let _ = writeln!(o, "No rank ran out of memory.\n");
        }
    }
    let _ = writeln!(o, "| rank | GPU | peak allocated | peak reserved | OOM | primary cause | held most by | file |");
    let _ = writeln!(o, "|---:|---:|---:|---:|---|---|---|---|");
    for r in &view.ranks {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {} | `{}` |",
            r.rank,
            r.device,
            bytes(r.peak_allocated_bytes),
            bytes(r.peak_reserved_bytes),
            oom_cell(view, r),
            r.primary_rule.as_deref().map_or("—".into(), |p| format!("`{p}`")),
            r.holder.as_deref().map_or("—".into(), &esc),
            r.input.replace('|', "\\|"),
        );
    }
    let _ = writeln!(o);
    for out in &view.outliers {
        let _ = writeln!(o, "- **Stands out**: rank {}, GPU {}: {}", out.rank, out.device, esc(&out.why));
    }
    for m in &view.findings {
        let _ = writeln!(o, "- **Across ranks**: {} {}", m.severity.name(), esc(&merged_line(m)));
    }
    let _ = writeln!(o, "\n{}\n", esc(&shown_in_full(view, analysed)));
    o
}

pub fn html(view: &JobView, analysed: usize) -> String {
    let esc = super::html::esc;
    let mut o = String::new();
    let rank_count = view.rank_count();
    let _ = writeln!(o, "<section id=\"job\">\n<h1>Job: {rank_count} ranks</h1>");
    match &view.first_oom {
        Some(f) => {
            let _ = writeln!(
                o,
                "<p class=\"summary\"><strong>First OOM</strong>: {}</p>",
                first_oom_words(view, f, |p| format!("<code>{}</code>", esc(p)))
            );
        }
        None => {
            let _ = writeln!(o, "<p class=\"summary\">No rank ran out of memory.</p>");
        }
    }
    let _ = writeln!(
        o,
        "<table class=\"ranks\">\n<tr><th>rank</th><th>GPU</th><th>peak allocated</th><th>peak reserved</th><th>OOM</th><th>primary cause</th><th>held most by</th><th>file</th></tr>"
    );
    for r in &view.ranks {
        let _ = writeln!(
            o,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>",
            r.rank,
            r.device,
            bytes(r.peak_allocated_bytes),
            bytes(r.peak_reserved_bytes),
            esc(&oom_cell(view, r)),
            esc(r.primary_rule.as_deref().unwrap_or("—")),
            esc(r.holder.as_deref().unwrap_or("—")),
            esc(&r.input)
        );
    }
    let _ = writeln!(o, "</table>\n<ul>");
    for out in &view.outliers {
        let _ = writeln!(
            o,
            "<li><strong>Stands out</strong>: rank {}, GPU {}: {}</li>",
            out.rank,
            out.device,
            esc(&out.why)
        );
    }
    for m in &view.findings {
        let _ = writeln!(o, "<li><strong>Across ranks</strong>: {} {}</li>", m.severity.name(), esc(&merged_line(m)));
    }
    let _ = writeln!(o, "</ul>\n<p class=\"dim\">{}</p>\n</section>", esc(&shown_in_full(view, analysed)));
    o
}
