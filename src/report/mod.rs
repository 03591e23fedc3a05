//! Renderers. They read an [`Analysis`] (and the timeline, for stacks) and know nothing of input formats.

pub mod budget;
pub mod diff;
pub mod diff_html;
pub mod facts_table;
pub mod html;
mod html_flame;
pub mod job_view;
pub(crate) mod markdown;
pub mod rule_list;
mod text;
pub mod whatif;
pub mod wording;

use crate::analysis::Analysis;
use crate::job::Analysed;
use crate::timeline::Timeline;

pub use markdown::render as markdown;
pub use text::render as text;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A summary to read in ten seconds (colour on a terminal).
    Text,
    /// For an incident ticket: a summary table first, details collapsed.
    Markdown,
    /// The versioned machine contract (schema_version 1).
    Json,
    /// One self-contained page (no network): the verdict, the timeline, live memory by stack.
    Html,
}

impl Format {
    /// The format an output file's name asks for (`report.html`, `incident.md`, `report.json`).
    pub fn from_file_name(name: &std::path::Path) -> Option<Format> {
        match name.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "html" | "htm" => Some(Format::Html),
            "md" | "markdown" => Some(Format::Markdown),
            "json" => Some(Format::Json),
            "txt" => Some(Format::Text),
            _ => None,
        }
    }

    /// How the format is named to a person ("an HTML page").
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Markdown => "Markdown",
            Format::Json => "JSON",
            Format::Html => "HTML page",
        }
    }
}

/// Renders `analysis` in `format`. `color` only affects text.
pub fn render(format: Format, analysis: &Analysis, tl: &Timeline, color: bool) -> String {
    match format {
        Format::Text => text(analysis, tl, color),
        Format::Markdown => markdown(analysis, tl),
        Format::Html => html::render(analysis, tl),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(analysis).expect("analysis serialises");
            s.push('\n');
            s
        }
    }
}

/// One rank of a job, analysed and reduced to what the job's report needs: its summary for the job view, its
/// findings' worst severity and its peaks for the exit code, and its own report (rendered while its timeline was
/// at hand, or its analysis for JSON). The timeline itself is not kept.
pub struct RankOutput {
    pub summary: crate::timeline::reported::ReportedRank,
    pub worst: Option<crate::analysis::Severity>,
    body: Body,
}

enum Body {
    Rendered(String),
    Json(JsonParts),
}

/// A rank's share of the job's JSON document, already written: its inputs, devices and findings as array elements
/// (pretty, at the depth they take in the document), and the rest of its analysis without them (the first rank's
/// is the document's frame). Text is smaller than the structures it came from: a thousand ranks keep their output,
/// not their analyses.
struct JsonParts {
    frame: Box<Analysis>,
    inputs: Vec<String>,
    devices: Vec<String>,
    findings: Vec<String>,
}

/// Array elements of the document's top level, as `to_string_pretty` writes them there (four spaces in).
fn elements<T: serde::Serialize>(items: &[T]) -> Vec<String> {
    items
        .iter()
        .map(|item| {
            let text = serde_json::to_string_pretty(item).expect("serialises");
            let mut indented = String::with_capacity(text.len() + text.len() / 8);
            for (i, line) in text.split('\n').enumerate() {
                if i > 0 {
                    indented.push('\n');
                }
                indented.push_str("    ");
                indented.push_str(line);
            }
            indented
        })
        .collect()
}

/// The document in parts: the frame cut at its empty top-level arrays (`"inputs": []` …), each filled with its
/// elements. Parts, not one string: the elements are written as they are, never copied into one.
fn spliced(frame: String, arrays: [(&str, Vec<String>); 3]) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = frame;
    for (key, items) in arrays {
        let empty = format!("\n  \"{key}\": []");
        let Some(at) = rest.find(&empty).filter(|_| !items.is_empty()) else { continue };
        let tail = rest.split_off(at + empty.len());
        rest.truncate(at);
        parts.push(std::mem::take(&mut rest) + &format!("\n  \"{key}\": [\n"));
        let n = items.len();
        for (i, item) in items.into_iter().enumerate() {
            parts.push(item);
            if i + 1 < n {
                parts.push(",\n".into());
            }
        }
        rest = "\n  ]".to_string() + &tail;
    }
    parts.push(rest);
    parts
}

impl RankOutput {
    pub fn of(format: Format, analysed: Analysed, color: bool) -> RankOutput {
        let summary = crate::analysis::job_view::summary(&analysed.analysis);
        let worst = analysed.analysis.findings.iter().map(|f| f.severity).max();
        let body = match format {
            Format::Json => {
                let mut a = analysed.analysis;
                let parts = JsonParts {
                    inputs: elements(&std::mem::take(&mut a.inputs)),
                    devices: elements(&std::mem::take(&mut a.devices)),
                    findings: elements(&std::mem::take(&mut a.findings)),
                    frame: Box::new(Analysis { job_facts: Default::default(), kernel_facts: Vec::new(), ..a }),
                };
                Body::Json(parts)
            }
            Format::Html => Body::Rendered(html::fragment(&analysed.analysis, analysed.timeline)),
            _ => Body::Rendered(render(format, &analysed.analysis, analysed.timeline, color)),
        };
        RankOutput { summary, worst, body }
    }
}

/// Renders a whole job. One snapshot: its report. Several ranks (snapshots analysed here, or ranks `reported` by
/// oomdoc's own JSON reports): the job view first (ranks, first OOM, outliers, findings across ranks); then in text
/// and Markdown the full reports of the analysed ranks that matter ([`job_view::detailed`]), in JSON one document
/// whose inputs, devices and findings are every analysed rank's, with the view as `job`.
pub fn render_job(
    format: Format,
    ranks: Vec<RankOutput>,
    reported: &[crate::timeline::reported::ReportedRank],
    color: bool,
) -> Vec<String> {
    let analysed_count = ranks.len();
    let mut summaries: Vec<_> = ranks.iter().map(|r| r.summary.clone()).collect();
    summaries.extend(reported.iter().cloned());
    let view = crate::analysis::job_view::of(&summaries);
    if format == Format::Json {
        let (mut frame, mut inputs, mut devices, mut findings) = (None, Vec::new(), Vec::new(), Vec::new());
        for r in ranks {
            let Body::Json(p) = r.body else { continue };
            frame.get_or_insert(p.frame);
            inputs.extend(p.inputs);
            devices.extend(p.devices);
            findings.extend(p.findings);
        }
        let Some(mut frame) = frame else {
            // Reports only: the view is the whole document.
            let doc = serde_json::json!({
                "schema_version": crate::analysis::SCHEMA_VERSION,
                "tool": "oomdoc",
                "tool_version": env!("CARGO_PKG_VERSION"),
                "inputs": [],
                "devices": [],
                "findings": [],
                "job": view,
            });
            return vec![serde_json::to_string_pretty(&doc).expect("json") + "\n"];
        };
        frame.job = view;
        let doc = serde_json::to_string_pretty(&frame).expect("analysis serialises") + "\n";
        return spliced(doc, [("inputs", inputs), ("devices", devices), ("findings", findings)]);
    }
    let mut out = String::new();
    let keep = view.as_ref().map(job_view::detailed);
    let single = ranks.len() == 1 && view.is_none();
    if let Some(v) = &view {
        out.push_str(&match format {
            Format::Markdown => job_view::markdown(v, analysed_count, markdown::esc),
            Format::Html => job_view::html(v, analysed_count),
            _ => {
                job_view::text(v, analysed_count, |s| if color { format!("\x1b[1m{s}\x1b[0m") } else { s.to_string() })
            }
        });
    }
    for (i, r) in ranks.into_iter().enumerate() {
        if keep.as_ref().is_some_and(|k| !k.contains(&i)) {
            continue;
        }
        let Body::Rendered(text) = r.body else { continue };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&text);
    }
    if format == Format::Html {
        let title = if single { "oomdoc: GPU memory report" } else { "oomdoc: a job's GPU memory" };
        out = html::document(title, &out);
    }
    vec![out]
}

/// "default" for the legacy default stream, else the raw stream handle in hex.
pub(crate) fn stream_name(stream: u64) -> String {
    if stream == 0 {
        "default stream".into()
    } else {
        format!("stream 0x{stream:x}")
    }
}

pub(crate) use crate::units::percent;

/// Where in the trace a moment is: "event 1234, 12.3 s into the trace".
pub(crate) fn when(event: Option<u32>, time_us: Option<i64>, first_time_us: Option<i64>) -> String {
    match (event, time_us.zip(first_time_us)) {
        (Some(e), Some((t, t0))) => format!("event {e}, {} into the trace", crate::units::duration_us(t - t0)),
        (Some(e), None) => format!("event {e}"),
        (None, _) => "before the first traced event".into(),
    }
}
