//! `oomdoc diff A B -o diff.html`: two runs on one picture. Both timelines on one axis (aligned by event, or by time
//! when both traces have times), what each held by category, the difference by category and by stack as a table
//! with a diverging bar for each row (grew to the right, shrank to the left), and the two verdicts side by side.
//! Self-contained like the report page: its style and script, nothing from the network.

use std::fmt::Write;

use serde_json::Value;

use super::html::{document, esc};
use crate::analysis::chart::Chart;
use crate::analysis::diff::{Delta, Diff};
use crate::units::bytes;

/// How the two timelines share the x axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Align {
    /// Event i of one run above event i of the other.
    #[default]
    Event,
    /// The same time since each trace's first event (needs time stamps in both).
    Time,
    /// Iteration i of one run above iteration i of the other: each run's passes of its loop (optimizer steps,
    /// snapshot markers, a repeating sequence of stacks), where both are found.
    Iteration,
}

/// Where event `e` falls among the loop's passes: the passes before it, plus how far it is into its own.
fn iteration_x(ends: &[usize], e: usize) -> f64 {
    let k = ends.partition_point(|&end| end < e);
    let start = if k == 0 { 0 } else { ends[k - 1] + 1 };
    // Past the last whole pass (the pass that failed), a pass is as long as the last one.
    let len = match (ends.get(k), k) {
        (Some(&end), _) => end + 1 - start,
        (None, k) if k >= 2 => ends[k - 1] - ends[k - 2],
        _ => 1,
    };
    k as f64 + (e - start) as f64 / len.max(1) as f64
}

/// One run as the picture draws it: its report (JSON form) and, when it was a snapshot analysed here, the timeline
/// of its fullest GPU (a kept JSON report has none).
pub struct Run<'a> {
    pub report: &'a Value,
    pub chart: Option<&'a Chart>,
}

const W: f64 = 960.0;
const H: f64 = 240.0;
const LEFT: f64 = 70.0;
const BOTTOM: f64 = 24.0;

const STYLE: &str = ".diffplot{width:100%;height:auto;background:#fff;border:1px solid #ddd}\
.diffplot .before{fill:none;stroke:#2f6db5;stroke-width:4;stroke-opacity:.45}.diffplot .after{fill:none;stroke:#d9730d;stroke-width:1.4}\
.diffplot .before.res,.diffplot .after.res{stroke-dasharray:4 3;stroke-width:1.2;stroke-opacity:1}.diffplot .end{font-weight:bold}\
.diffplot circle.before{fill:#2f6db5;stroke:none;fill-opacity:1}.diffplot circle.after{fill:#d9730d;stroke:none}.diffplot text{font:11px sans-serif;fill:#555}\
.diffplot .grid{stroke:#eee}.key span{display:inline-block;width:1.6em;height:.35em;margin:0 .3em .15em 1em;vertical-align:middle}\
.sides{display:grid;grid-template-columns:1fr 1fr;gap:1em}.sides>div{border:1px solid #ddd;padding:.5em .8em}\
table.delta td.bar{width:220px}svg.div{width:220px;height:14px}svg.div .grew{fill:#c0392b}svg.div .shrank{fill:#27ae60}\
svg.div line{stroke:#999}";

/// The page.
pub fn render(d: &Diff, before: &Run, after: &Run, align: Align) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "<style>{STYLE}</style>");
    let _ = writeln!(o, "<h1>GPU memory: before and after</h1>");
    let _ = writeln!(
        o,
        "<p class=\"dim\">before: {} · after: {}</p>\n<p class=\"verdict\">{}</p>",
        esc(&d.before.input),
        esc(&d.after.input),
        esc(&super::diff::headline(d))
    );
    timelines(&mut o, before, after, align);
    verdicts(&mut o, before.report, after.report);
    categories(&mut o, d);
    deltas(&mut o, d, "stack", "By allocating stack (largest changes)");
    deltas(&mut o, d, "free", "The cache's free memory");
    if !d.findings_resolved.is_empty() || !d.findings_new.is_empty() || !d.settings_changed.is_empty() {
        let _ = writeln!(o, "<h2>Findings and settings</h2>\n<ul>");
        for f in &d.findings_resolved {
            let _ = writeln!(o, "<li>resolved: {}</li>", esc(f));
        }
        for f in &d.findings_new {
            let _ = writeln!(o, "<li>new: {}</li>", esc(f));
        }
        for s in &d.settings_changed {
            let _ = writeln!(o, "<li>setting: {}</li>", esc(s));
        }
        let _ = writeln!(o, "</ul>");
    }
    document("oomdoc diff", &o)
}

/// A run's points: (x in its own unit, allocated, reserved) per bucket, and what the unit is.
fn points(c: &Chart, align: Align) -> Vec<(f64, u64, u64)> {
    let t0 = c.time_us.iter().flatten().next().copied();
    c.alloc_max
        .iter()
        .zip(&c.reserved_max)
        .enumerate()
        .filter_map(|(i, (&a, &r))| {
            let x = match align {
                Align::Event => (i * c.per) as f64,
                Align::Time => (c.time_us.get(i).copied().flatten()? - t0?) as f64 / 1e6,
                Align::Iteration => iteration_x(&c.iteration_ends, i * c.per),
            };
            Some((x, a, r))
        })
        .collect()
}

fn timelines(o: &mut String, before: &Run, after: &Run, align: Align) {
    let _ = writeln!(o, "<h2>Both timelines on one axis</h2>");
    let (Some(b), Some(a)) = (before.chart, after.chart) else {
        // Why a side has no timeline: a kept JSON report holds none (its own analysis may have had one); a snapshot
        // without history (a state-only dump) recorded none.
        let no_history = |r: &Run| r.report["capture"]["has_trace"] == false;
        let missing: Vec<&str> = [("before", before), ("after", after)]
            .into_iter()
            .filter(|(_, r)| r.chart.is_none())
            .map(|(side, _)| side)
            .collect();
        let state_only = [before, after].iter().any(|r| r.chart.is_none() && no_history(r));
        let why = if state_only {
            "its snapshot recorded no allocation history (a state-only dump: torch.cuda.memory.\
             _record_memory_history was not on when it was taken), so there is nothing to draw over time"
        } else {
            "it was given as a kept JSON report, which holds no timeline: give the snapshot instead"
        };
        let _ = writeln!(
            o,
            "<p class=\"dim\">A timeline needs both runs' traces; the {} run has none: {why}.</p>",
            missing.join(" and the ")
        );
        return;
    };
    let has_times = |c: &Chart| c.time_us.iter().flatten().nth(1).is_some();
    let has_iterations = |c: &Chart| c.iteration_ends.len() >= 2;
    let align = match align {
        Align::Time if !(has_times(b) && has_times(a)) => Align::Event,
        Align::Iteration if !(has_iterations(b) && has_iterations(a)) => Align::Event,
        a => a,
    };
    let (pb, pa) = (points(b, align), points(a, align));
    let x_max = pb.iter().chain(&pa).map(|p| p.0).fold(1e-9, f64::max);
    let y_max = pb.iter().chain(&pa).map(|p| p.2.max(p.1)).max().unwrap_or(1).max(1) as f64;
    let (pw, ph) = (W - LEFT - 10.0, H - BOTTOM - 10.0);
    let x = |v: f64| LEFT + v / x_max * pw;
    let y = |v: u64| 10.0 + ph - v as f64 / y_max * ph;
    let unit = match align {
        Align::Event => "events",
        Align::Time => "seconds since each trace's first event",
        Align::Iteration => "iterations of each run's loop",
    };
    let _ = writeln!(
        o,
        "<figure>\n<svg class=\"diffplot\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"allocated and reserved \
         memory of both runs\" data-align=\"{}\">",
        match align {
            Align::Event => "event",
            Align::Time => "time",
            Align::Iteration => "iteration",
        }
    );
    for k in 0..=4 {
        let v = (y_max * k as f64 / 4.0) as u64;
        let _ = writeln!(
            o,
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/><text x=\"{:.1}\" y=\"{:.1}\" \
             text-anchor=\"end\">{}</text>",
            W - 10.0,
            y(v),
            y(v),
            LEFT - 4.0,
            y(v) + 4.0,
            bytes(v)
        );
    }
    // Before is drawn wide and pale under a thin after: where the runs coincide both stay visible.
    for (class, pts, oom) in [("before", &pb, ran_out(before)), ("after", &pa, ran_out(after))] {
        let line = |f: &dyn Fn(&(f64, u64, u64)) -> u64| {
            pts.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(f(p)))).collect::<Vec<_>>().join(" ")
        };
        let _ = writeln!(o, "<polyline class=\"{class} res\" points=\"{}\"/>", line(&|p| p.2));
        let _ = writeln!(o, "<polyline class=\"{class} alloc\" points=\"{}\"/>", line(&|p| p.1));
        // Where each run ends, said: its OOM, or the end of its capture.
        if let Some(last) = pts.last() {
            let (cx, cy) = (x(last.0), y(last.1));
            let what = if oom { "OOM" } else { "end" };
            let _ = writeln!(
                o,
                "<circle class=\"{class}\" cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"3.5\"/><text class=\"end\" x=\"{:.1}\" \
                 y=\"{:.1}\" text-anchor=\"end\">{class}: {what}</text>",
                cx - 5.0,
                (cy - 6.0).max(12.0)
            );
        }
    }
    let end = match align {
        Align::Event => format!("{:.0}", x_max),
        Align::Time => format!("{x_max:.2} s"),
        Align::Iteration => format!("{x_max:.1} iterations"),
    };
    let _ = writeln!(
        o,
        "<text x=\"{LEFT}\" y=\"{:.1}\">0</text><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{end}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{unit}</text>\n</svg>",
        H - 6.0,
        W - 10.0,
        H - 6.0,
        LEFT + pw / 2.0,
        H - 6.0
    );
    let _ = writeln!(
        o,
        "<figcaption class=\"key\"><span style=\"background:#2f6db5\"></span>before: allocated (solid), reserved \
         (dashed) <span style=\"background:#d9730d\"></span>after · aligned by {}</figcaption>\n</figure>",
        match align {
            Align::Event => "event",
            Align::Time => "time",
            Align::Iteration => "iteration",
        }
    );
}

/// Whether the run's fullest GPU ran out of memory.
fn ran_out(run: &Run) -> bool {
    top_device(run.report).is_some_and(|d| !d["oom"].is_null())
}

/// The fullest GPU of a report (the one the diff's sides describe).
fn top_device(report: &Value) -> Option<&Value> {
    report.get("devices").and_then(Value::as_array)?.iter().max_by_key(|d| crate::ingest::oomdoc_report::peaks(d).0)
}

fn verdicts(o: &mut String, before: &Value, after: &Value) {
    let _ = writeln!(o, "<h2>The two verdicts</h2>\n<div class=\"sides\">");
    for (name, r) in [("before", before), ("after", after)] {
        let dev = top_device(r);
        let summary = dev.and_then(|d| d["verdict"]["summary"].as_str()).unwrap_or("no verdict (nothing recorded)");
        let _ = writeln!(o, "<div><h3>{name}</h3>\n<p>{}</p>", esc(summary));
        let causes = dev.and_then(|d| d["verdict"]["causes"].as_array());
        if let Some(causes) = causes.filter(|c| !c.is_empty()) {
            let _ = writeln!(o, "<ul>");
            for c in causes {
                let rule = c["rule"].as_str().unwrap_or("?");
                let b = c["bytes"].as_u64().map_or(String::new(), |b| format!(" {}", bytes(b)));
                let _ = writeln!(o, "<li>{}{b}</li>", esc(rule));
            }
            let _ = writeln!(o, "</ul>");
        }
        let _ = writeln!(o, "</div>");
    }
    let _ = writeln!(o, "</div>");
}

/// One diverging bar: the change as a share of the largest change listed, grown to the right, shrunk to the left.
fn bar(delta: &Delta, scale: u64) -> String {
    let half = 110.0;
    let (grew, size) = match delta.after_bytes.cmp(&delta.before_bytes) {
        std::cmp::Ordering::Greater => (true, delta.after_bytes - delta.before_bytes),
        _ => (false, delta.before_bytes - delta.after_bytes),
    };
    let w = size as f64 / scale.max(1) as f64 * half;
    let (class, x0) = if grew { ("grew", half) } else { ("shrank", half - w) };
    format!(
        "<svg class=\"div\" viewBox=\"0 0 220 14\"><rect class=\"{class}\" x=\"{x0:.1}\" y=\"2\" width=\"{w:.1}\" \
         height=\"10\"/><line x1=\"110\" x2=\"110\" y1=\"0\" y2=\"14\"/></svg>"
    )
}

fn table(o: &mut String, rows: &[&Delta]) {
    let scale = rows.iter().map(|d| d.after_bytes.abs_diff(d.before_bytes)).max().unwrap_or(1);
    let _ = writeln!(
        o,
        "<table class=\"delta\">\n<tr><th>what</th><th>before</th><th>after</th><th>change</th><th></th></tr>"
    );
    for d in rows {
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td class=\"bar\">{}</td></tr>",
            esc(&d.what),
            bytes(d.before_bytes),
            bytes(d.after_bytes),
            super::diff::signed(d.before_bytes, d.after_bytes),
            d.change,
            bar(d, scale)
        );
    }
    let _ = writeln!(o, "</table>");
}

fn categories(o: &mut String, d: &Diff) {
    let rows: Vec<&Delta> = d.deltas.iter().filter(|x| x.kind == "category").collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "<h2>What each held, by kind</h2>");
    table(o, &rows);
}

fn deltas(o: &mut String, d: &Diff, kind: &str, title: &str) {
    let rows: Vec<&Delta> = d.deltas.iter().filter(|x| x.kind == kind).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(o, "<h2>{}</h2>", esc(title));
    table(o, &rows);
}
