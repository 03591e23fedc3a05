//! Renderers. They read an [`Analysis`] (and the timeline, for stacks) and know nothing of input formats.

pub mod budget;
pub mod diff;
pub mod facts_table;
pub mod job_view;
pub(crate) mod markdown;
pub mod rule_list;
pub mod sections;
mod text;

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
}

/// Renders `analysis` in `format`. `color` only affects text.
pub fn render(format: Format, analysis: &Analysis, tl: &Timeline, color: bool) -> String {
    match format {
        Format::Text => text(analysis, tl, color),
        Format::Markdown => markdown(analysis, tl),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(analysis).expect("analysis serialises");
            s.push('\n');
            s
        }
    }
}

/// Renders a whole job. One snapshot: its report. Several ranks (snapshots analysed here, or ranks `reported` by
/// oomdoc's own JSON reports): the job view first (ranks, first OOM, outliers, findings across ranks); then in text
/// and Markdown the full reports of the analysed ranks that matter ([`job_view::detailed`]), in JSON one document
/// whose inputs, devices and findings are every analysed rank's, with the view as `job`.
pub fn render_job(
    format: Format,
    analysed: Vec<Analysed>,
    reported: &[crate::timeline::reported::ReportedRank],
    color: bool,
) -> String {
    let analysed_count = analysed.len();
    let mut ranks: Vec<_> = analysed.iter().map(|a| crate::analysis::job_view::summary(&a.analysis)).collect();
    ranks.extend(reported.iter().cloned());
    let view = crate::analysis::job_view::of(&ranks);
    if format == Format::Json {
        let mut all = analysed.into_iter();
        let Some(first) = all.next() else {
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
            return serde_json::to_string_pretty(&doc).expect("json") + "\n";
        };
        let mut combined = first.analysis;
        for a in all {
            combined.inputs.extend(a.analysis.inputs);
            combined.devices.extend(a.analysis.devices);
            combined.findings.extend(a.analysis.findings);
        }
        combined.job = view;
        return render(format, &combined, first.timeline, color);
    }
    let mut out = String::new();
    let keep = view.as_ref().map(job_view::detailed);
    if let Some(v) = &view {
        out.push_str(&match format {
            Format::Markdown => job_view::markdown(v, analysed_count, markdown::esc),
            _ => {
                job_view::text(v, analysed_count, |s| if color { format!("\x1b[1m{s}\x1b[0m") } else { s.to_string() })
            }
        });
    }
    for (i, a) in analysed.iter().enumerate() {
        if keep.as_ref().is_some_and(|k| !k.contains(&i)) {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&render(format, &a.analysis, a.timeline, color));
    }
    out
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
