//! `--format html` (or `-o report.html`): one self-contained page. Its structure on real snapshots, the data it
//! embeds, and that it loads nothing from anywhere.

use crate::common::{oomdoc, stderr};

/// The page for `args`, written through `-o FILE.html` (the name alone chooses HTML).
fn page(name: &str, inputs: &[&str]) -> String {
    let out = std::env::temp_dir().join(format!("oomdoc-html-{}-{name}.html", std::process::id()));
    let mut args = vec!["analyze"];
    args.extend_from_slice(inputs);
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    let o = oomdoc(&args);
    assert!(o.status.code().is_some_and(|c| c < 2), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    html
}

/// No `src`, `href` or `url()` that reaches out: the page must open offline and leak nothing when opened.
fn assert_offline(html: &str) {
    let lower = html.to_ascii_lowercase();
    for attr in ["src=", "href=", "url("] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(attr) {
            let at = from + i + attr.len();
            let value = lower[at..].trim_start_matches(['"', '\'', ' ']);
            assert!(
                !(value.starts_with("http:") || value.starts_with("https:") || value.starts_with("//")),
                "{attr} reaches out at byte {at}: {}",
                &html[at..(at + 60).min(html.len())]
            );
            from = at;
        }
    }
    assert!(!lower.contains("<script src") && !lower.contains("<link"), "no external scripts or stylesheets");
}

/// Every element that opens closes, in the page's main containers.
fn assert_balanced(html: &str) {
    for tag in ["section", "svg", "table", "details", "figure", "article", "header", "ul", "pre"] {
        let open = html.matches(&format!("<{tag}>")).count() + html.matches(&format!("<{tag} ")).count();
        let close = html.matches(&format!("</{tag}>")).count();
        assert_eq!(open, close, "<{tag}> opened {open} times, closed {close}");
    }
}

#[test]
fn a_real_oom_page_leads_with_the_verdict_and_shows_the_timeline() {
    let html = page("leak", &["fixtures/real-gpu/leaked-references/snapshot.pickle"]);
    assert!(html.starts_with("<!doctype html>\n<html lang=\"en\">"));
    assert_offline(&html);
    assert_balanced(&html);
    // Verdict, then findings, then the GPU: in that order.
    let (v, f, g) = (
        html.find("id=\"verdict\"").unwrap(),
        html.find("id=\"findings\"").unwrap(),
        html.find("id=\"gpu-0\"").unwrap(),
    );
    assert!(v < f && f < g);
    assert!(html.contains("GPU 0</strong>: GPU 0 ran out of memory asking for 16.0 MiB"), "the verdict, escaped");
    assert!(html.contains("<span class=\"oom\">OOM</span> needed a 16.0 MiB block"), "the OOM request");
    assert!(html.contains("[leaked-references]</code> — explains 2.44 GiB"));
    assert!(html.contains("<p class=\"fix\"><strong>Fix:</strong> Keep numbers, not tensors"));
    // The timeline: one SVG, a hover target per bucket, the OOM and the peak marked.
    assert_eq!(html.matches("<svg class=\"timeline\"").count(), 1);
    let buckets = html.matches("<rect class=\"hit\"").count();
    assert!((1000..=1200).contains(&buckets), "{buckets} buckets for 9,372 events");
    assert!(html.contains(">OOM</text>") && html.contains(">peak</text>"));
    assert!(html.contains("<title>events 9360–9367: allocated"), "hover text names events and bytes");
    // Live memory by stack and the largest allocations with their stacks.
    assert!(html.contains("<h3>Live memory by allocating stack</h3>"));
    assert!(html.contains("<details class=\"allocation\"><summary><code>"));
}

#[test]
fn a_long_trace_stays_light_and_a_job_leads_with_its_ranks() {
    // 19,770 events: still at most 1,200 buckets, and a page of tens of KB, not MB.
    let html = page("kk", &["fixtures/real/cs336-kk-fullstep-57gb.pickle"]);
    assert_offline(&html);
    assert_balanced(&html);
    assert!(html.matches("<rect class=\"hit\"").count() <= 1200);
    assert!(html.len() < 600_000, "{} bytes", html.len());
    // Two ranks: the job table first, one page.
    let html = page(
        "job",
        &["fixtures/real-gpu/healthy/snapshot.pickle", "fixtures/real-gpu/leaked-references/snapshot.pickle"],
    );
    assert_offline(&html);
    assert_balanced(&html);
    assert_eq!(html.matches("<!doctype html>").count(), 1);
    assert!(html.find("<h1>Job: 2 ranks</h1>").unwrap() < html.find("id=\"verdict\"").unwrap());
    assert!(html.contains("<table class=\"ranks\">"));
    // --format html says it too; text stays the default without -o.
    let o = oomdoc(&["analyze", "--format", "html", "fixtures/real-gpu/healthy/snapshot.pickle"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("<!doctype html>"));
    let o = oomdoc(&["analyze", "fixtures/real-gpu/healthy/snapshot.pickle"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("oomdoc "));
}

#[test]
fn the_segment_map_shows_fragmentation_beside_the_failed_request() {
    // The real H100 fragmentation capture: 15 segments of 256 MiB, each part allocated, part free; the 400 MiB
    // request beside the 156 MiB largest free block.
    let html = page("frag", &["fixtures/real-gpu/fragmentation/snapshot.pickle"]);
    assert_offline(&html);
    assert_balanced(&html);
    assert!(html.contains("<h3>Segments at the moment <span class=\"dim\">(15 segments, to one scale)</span></h3>"));
    assert_eq!(html.matches("<rect class=\"blk-alloc\"").count(), 15);
    assert_eq!(html.matches("<rect class=\"blk-free\"").count(), 16, "a free run per segment, and the largest block");
    assert!(html.contains("<title>failed request: 400 MiB</title>"));
    assert!(html.contains("<title>largest free block: 156 MiB</title>"));
}
