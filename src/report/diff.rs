//! `oomdoc diff`: two runs side by side, the verdict on the peak first, then what changed by category, by stack and
//! in the cache's free memory, the findings and the allocator settings.

use std::fmt::Write;

use super::Format;
use crate::analysis::diff::{Delta, Diff};
use crate::units::bytes;

/// "+1.20 GiB", "−300 MiB", "±0".
pub(super) fn signed(before: u64, after: u64) -> String {
    match after.cmp(&before) {
        std::cmp::Ordering::Greater => format!("+{}", bytes(after - before)),
        std::cmp::Ordering::Less => format!("−{}", bytes(before - after)),
        std::cmp::Ordering::Equal => "±0".into(),
    }
}

pub(super) fn headline(d: &Diff) -> String {
    let (b, a) = (&d.before, &d.after);
    let pct = d.peak_growth_pct.map_or(String::new(), |p| format!(" ({p:+.1}%)"));
    let verb = match a.peak_allocated_bytes.cmp(&b.peak_allocated_bytes) {
        std::cmp::Ordering::Greater => "grew",
        std::cmp::Ordering::Less => "fell",
        std::cmp::Ordering::Equal => "is unchanged",
    };
    let mut s = format!(
        "Peak allocated {verb}: {} → {}{pct}; peak reserved {} → {}.",
        bytes(b.peak_allocated_bytes),
        bytes(a.peak_allocated_bytes),
        bytes(b.peak_reserved_bytes),
        bytes(a.peak_reserved_bytes)
    );
    match (b.oom, a.oom) {
        (true, false) => s.push_str(" The OOM is gone."),
        (false, true) => s.push_str(" After the change it runs out of memory."),
        (true, true) => s.push_str(" Both run out of memory."),
        (false, false) => {}
    }
    s
}

fn rows<'a>(d: &'a Diff, kind: &str) -> impl Iterator<Item = &'a Delta> + 'a {
    let kind = kind.to_string();
    d.deltas.iter().filter(move |x| x.kind == kind)
}

pub fn render(d: &Diff, format: Format) -> String {
    match format {
        Format::Json => {
            let mut s = serde_json::to_string_pretty(d).expect("diff serialises");
            s.push('\n');
            s
        }
        Format::Markdown => markdown(d),
        Format::Text => text(d),
        Format::Html => super::html::document(
            "oomdoc diff",
            &format!("<h1>GPU memory: before and after</h1>\n<pre>{}</pre>\n", super::html::esc(&text(d))),
        ),
    }
}

fn text(d: &Diff) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "oomdoc diff  before: {}  after: {}\n", d.before.input, d.after.input);
    let _ = writeln!(o, "{}", headline(d));
    let _ = writeln!(o, "  before: {}; after: {}", d.before.moment, d.after.moment);
    let section = |o: &mut String, title: &str, kind: &str| {
        let list: Vec<&Delta> = rows(d, kind).collect();
        if list.is_empty() {
            return;
        }
        let _ = writeln!(o, "\n{title}");
        let w = list.iter().map(|x| bytes(x.before_bytes).len()).max().unwrap_or(0);
        for x in list {
            let _ = writeln!(
                o,
                "  {:>w$} → {:<9}  {:<10}  {:<8}  {}",
                bytes(x.before_bytes),
                bytes(x.after_bytes),
                signed(x.before_bytes, x.after_bytes),
                x.change,
                x.what
            );
        }
    };
    section(&mut o, "At the moment each report describes", "moment");
    section(&mut o, "By kind", "category");
    section(&mut o, "By allocating stack (the largest changes)", "stack");
    section(&mut o, "Free memory in the cache (fragmentation)", "free");
    if !d.findings_resolved.is_empty() || !d.findings_new.is_empty() {
        let _ = writeln!(o, "\nFindings");
        for r in &d.findings_resolved {
            let _ = writeln!(o, "  resolved  {r}");
        }
        for r in &d.findings_new {
            let _ = writeln!(o, "  new       {r}");
        }
    }
    if !d.settings_changed.is_empty() {
        let _ = writeln!(o, "\nAllocator settings changed");
        for s in &d.settings_changed {
            let _ = writeln!(o, "  {s}");
        }
    }
    o
}

fn markdown(d: &Diff) -> String {
    let esc = super::markdown::esc;
    let mut o = String::new();
    let _ = writeln!(o, "## GPU memory: before and after\n");
    let _ = writeln!(o, "- before: `{}` — {}", d.before.input, esc(&d.before.moment));
    let _ = writeln!(o, "- after: `{}` — {}\n", d.after.input, esc(&d.after.moment));
    let _ = writeln!(o, "**{}**\n", esc(&headline(d)));
    let _ = writeln!(o, "| what | before | after | change | |");
    let _ = writeln!(o, "|---|---:|---:|---:|---|");
    for x in &d.deltas {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} |",
            esc(&x.what),
            bytes(x.before_bytes),
            bytes(x.after_bytes),
            signed(x.before_bytes, x.after_bytes),
            x.change
        );
    }
    let _ = writeln!(o);
    for r in &d.findings_resolved {
        let _ = writeln!(o, "- resolved: `{r}`");
    }
    for r in &d.findings_new {
        let _ = writeln!(o, "- new: `{r}`");
    }
    for s in &d.settings_changed {
        let _ = writeln!(o, "- allocator setting changed: `{s}`");
    }
    o
}
