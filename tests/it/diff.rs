//! `oomdoc diff`: two real runs of the same program captured on an H100 (`fixtures/real-gpu/`), with and without
//! expandable segments; and the CI gate on peak growth.

use crate::common::{oomdoc, stderr, stdout};

const BEFORE: &str = "fixtures/real-gpu/fragmentation/snapshot.pickle";
const AFTER: &str = "fixtures/real-gpu/fragmentation-expandable/snapshot.pickle";

#[test]
fn expandable_segments_before_and_after_in_every_format() {
    let text = stdout(&oomdoc(&["diff", BEFORE, AFTER]));
    assert!(text.contains("The OOM is gone."), "{text}");
    assert!(text.contains("resolved  fragmentation"), "{text}");
    assert!(text.contains("expandable_segments: False → True"), "{text}");
    insta::assert_snapshot!("diff_expandable_text", text);

    let md = stdout(&oomdoc(&["diff", BEFORE, AFTER, "--format", "markdown"]));
    insta::assert_snapshot!("diff_expandable_markdown", md);

    let o = oomdoc(&["diff", BEFORE, AFTER, "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let deltas = v["deltas"].as_array().unwrap();
    for d in deltas {
        assert!(d["what"].is_string() && d["before_bytes"].is_u64() && d["after_bytes"].is_u64(), "{d}");
    }
    let free = deltas.iter().find(|d| d["what"] == "cached free (reserved but not allocated)").unwrap();
    assert_eq!((free["change"].as_str(), free["after_bytes"].as_u64()), (Some("gone"), Some(0)));
    assert_eq!(v["findings_resolved"], serde_json::json!(["fragmentation"]));
    insta::assert_json_snapshot!("diff_expandable_json", v);
}

#[test]
fn fail_on_growth_gates_ci_on_the_peak() {
    // The same program: the peak did not grow.
    let o = oomdoc(&["diff", BEFORE, AFTER, "--fail-on-growth", "5"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // A run that allocates 11× more: over any sane limit, one line saying by how much.
    let small = "fixtures/real-gpu/healthy/snapshot.pickle";
    let big = "fixtures/real-gpu/compile-warmup/snapshot.pickle";
    let o = oomdoc(&["diff", small, big, "--fail-on-growth", "5", "--format", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.lines().count() == 1 && err.contains("grew") && err.contains("--fail-on-growth 5%"), "{err}");
    assert!(!o.stdout.is_empty(), "the comparison is still written");
    // Shrinking never fails.
    let o = oomdoc(&["diff", big, small, "--fail-on-growth", "0"]);
    assert_eq!(o.status.code(), Some(0));
    // A missing file is exit 2.
    let o = oomdoc(&["diff", BEFORE, "nope.pickle"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn two_kept_json_reports_compare_as_their_snapshots_do() {
    // CI keeps the main branch's report; a branch's run is compared to it. Reports written with --top 50 (the
    // stacks diff compares) give the same comparison as the snapshots.
    let dir = std::env::temp_dir().join(format!("oomdoc-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut reports = Vec::new();
    for (name, snap) in [("before.json", BEFORE), ("after.json", AFTER)] {
        let o = oomdoc(&["analyze", snap, "--format", "json", "--top", "50"]);
        let p = dir.join(name);
        std::fs::write(&p, &o.stdout).unwrap();
        reports.push(p.to_str().unwrap().to_string());
    }
    let from_snapshots = stdout(&oomdoc(&["diff", BEFORE, AFTER, "--format", "json"]));
    let from_reports = stdout(&oomdoc(&["diff", &reports[0], &reports[1], "--format", "json"]));
    assert_eq!(from_reports, from_snapshots);
    // A report on one side, a snapshot on the other.
    assert_eq!(stdout(&oomdoc(&["diff", &reports[0], AFTER, "--format", "json"])), from_snapshots);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The points of the polyline of `class` in a page.
fn points(page: &str, class: &str) -> Vec<(f64, f64)> {
    let tag = format!("<polyline class=\"{class}\" points=\"");
    let at = page.find(&tag).unwrap_or_else(|| panic!("no {class} series")) + tag.len();
    let list = &page[at..at + page[at..].find('"').unwrap()];
    list.split(' ')
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

#[test]
fn the_page_draws_both_runs_on_one_axis_with_both_verdicts() {
    let page = stdout(&oomdoc(&["diff", BEFORE, AFTER, "--format", "html"]));
    let (before, after) = (points(&page, "before alloc"), points(&page, "after alloc"));
    assert!(before.len() >= 10 && after.len() >= 10, "{} / {} points", before.len(), after.len());
    // One x axis: the before run ended at its OOM, earlier than the after run, which spans the width.
    let right = |p: &[(f64, f64)]| p.iter().map(|q| q.0).fold(0.0, f64::max);
    assert!(right(&before) < right(&after), "{} vs {}", right(&before), right(&after));
    assert!(page.contains("before: OOM") && page.contains("after: end"), "each run's end is said");
    assert!(page.contains("<h3>before</h3>") && page.contains("<h3>after</h3>"));
    assert!(page.contains("Primary cause: fragmentation"), "the before verdict");
    assert!(page.contains("class=\"grew\"") && page.contains("class=\"shrank\""), "diverging bars both ways");
    assert!(!page.contains("http://") && !page.contains("src=\"http"), "nothing from the network");

    // By time when both traces have times; -o diff.html picks the page by its name.
    let dir = std::env::temp_dir().join(format!("oomdoc-diff-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("diff.html");
    let o = oomdoc(&["diff", BEFORE, AFTER, "--align", "time", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let timed = std::fs::read_to_string(&out).unwrap();
    assert!(timed.contains("data-align=\"time\"") && timed.contains("seconds since each trace"), "aligned by time");

    // By iteration where both runs' loops are found (the real DDP pair: optimizer steps); else by event.
    let page = stdout(&oomdoc(&[
        "diff",
        "fixtures/real-gpu/ddp-without-no-sync/snapshot.pickle",
        "fixtures/real-gpu/ddp-no-sync/snapshot.pickle",
        "--align",
        "iteration",
        "--format",
        "html",
    ]));
    assert!(
        page.contains("data-align=\"iteration\"") && page.contains("iterations of each run's loop"),
        "by iteration"
    );
    let page = stdout(&oomdoc(&["diff", BEFORE, AFTER, "--align", "iteration", "--format", "html"]));
    assert!(page.contains("data-align=\"event\""), "no loop found in these: by event");

    // A side kept as a JSON report holds no timeline: said, and the rest of the page is there.
    let kept = dir.join("before.json");
    let o = oomdoc(&["analyze", BEFORE, "--top", "50", "-o", kept.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let page = stdout(&oomdoc(&["diff", kept.to_str().unwrap(), AFTER, "--format", "html"]));
    assert!(page.contains("A timeline needs both runs' traces"), "the missing timeline is said");
    assert!(page.contains("the before run has none: it was given as a kept JSON report"), "and why");
    assert!(page.contains("largest free block"), "the rest of the comparison is there");
    // A snapshot without history (a real state-only dump) has no timeline either, for another reason.
    let page = stdout(&oomdoc(&[
        "diff",
        "fixtures/real-gpu/frameworks/trainer-state-only/snapshot.pickle.xz",
        "fixtures/real-gpu/frameworks/trainer-batch-too-large/snapshot.pickle.xz",
        "--format",
        "html",
    ]));
    assert!(page.contains("the before run has none: its snapshot recorded no allocation history"), "state-only");
    assert!(!page.contains("kept JSON report"), "not mistaken for a kept report");
    let _ = std::fs::remove_dir_all(&dir);
}
