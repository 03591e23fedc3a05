//! Small things a newcomer tripped over, each pinned: rows that looked identical, a moment past the trace's end
//! clamped in silence, the GPU named twice, `&lt;1%` in Markdown, identifiers in prose, a rank listed once per
//! reason, unexplained "native" words, and a timeline labelled only at its ends.

use crate::common::{analyze_json, oomdoc, stderr, stdout};

const REAL: &str = "fixtures/real/cs336-kk-fullstep-57gb.pickle";
const TWO_GPUS: &str = "fixtures/generated/verdict/class1-device-imbalance.pickle";

fn run(args: &[&str]) -> String {
    let o = oomdoc(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn rows_of_the_same_python_lines_are_told_apart_by_their_operator() {
    let v = analyze_json(&[REAL]);
    let rows = v["devices"][0]["by_stack"].as_array().unwrap();
    let callers: Vec<&str> = rows.iter().map(|r| r["callers"].as_str().unwrap()).collect();
    let unique: std::collections::BTreeSet<&&str> = callers.iter().collect();
    assert_eq!(unique.len(), callers.len(), "two rows read the same: {callers:#?}");
    assert!(callers.iter().any(|c| c.contains("optimizers.py:100") && c.contains(" via aten::")), "{callers:#?}");
    // C++-only stacks say what that means.
    assert!(rows.iter().all(|r| !r["culprit"].as_str().unwrap().contains("native")));
    assert!(rows.iter().any(|r| r["culprit"].as_str().unwrap().contains("C++ frames only, no Python frame")));
}

#[test]
fn a_moment_past_the_end_is_the_end_and_says_so_and_an_earlier_oom_is_named() {
    let text = run(&["analyze", TWO_GPUS, "--at", "99s", "--color", "never"]);
    assert!(text.contains("--at 99.00 s is past the end of the trace"), "{text}");
    let gpu1 = text.lines().find(|l| l.contains("GPU 1 held")).unwrap_or_else(|| panic!("{text}"));
    assert!(gpu1.contains("At the end of the capture"), "{gpu1}");
    assert!(gpu1.contains("it had run out of memory before this moment (--at oom shows that one)"), "{gpu1}");
    let v = analyze_json(&[TWO_GPUS, "--at", "99s"]);
    assert!(v["devices"].as_array().unwrap().iter().all(|d| d["moment"] == "end"));
    // A moment inside the trace is the requested one, with no such note.
    let inside = run(&["analyze", TWO_GPUS, "--at", "1ms", "--color", "never"]);
    assert!(!inside.contains("past the end"), "{inside}");
}

#[test]
fn markdown_and_html_name_the_gpu_once_and_markdown_writes_less_than_as_itself() {
    let md = run(&["analyze", REAL, "--format", "markdown"]);
    assert!(md.contains("**GPU 0** peaked at") && !md.contains("**GPU 0**: GPU 0"), "{md}");
    assert!(!md.contains("&lt;1%") && md.contains("activation <1%"), "{md}");
    let html = run(&["analyze", REAL, "--format", "html"]);
    assert!(html.contains("<strong>GPU 0</strong> peaked at") && !html.contains("</strong>: GPU 0 "));
}

#[test]
fn the_html_timeline_is_labelled_between_its_ends_and_its_legend_has_only_what_was_drawn() {
    let html = run(&["analyze", REAL, "--format", "html"]);
    assert_eq!(html.matches("class=\"evm\"").count(), 3, "events at a quarter, half, three quarters");
    assert!(html.contains("data-f=\"0.5\"") && html.contains("mids=[...svg.querySelectorAll(\".evm\")]"));
    let legend = html.split("<figcaption class=\"legend dim\">").nth(2).unwrap_or_else(|| panic!("no timeline legend"));
    let legend = legend.split("</figcaption>").next().unwrap();
    let v = analyze_json(&[REAL]);
    let held: Vec<&str> =
        v["devices"][0]["by_category"].as_array().unwrap().iter().map(|c| c["category"].as_str().unwrap()).collect();
    for cat in ["kv_cache", "nccl"] {
        assert!(!held.contains(&cat), "the fixture holds {cat}");
        assert!(!legend.contains(&format!("cat-{cat}")), "a legend swatch for {cat}, never held: {legend}");
    }
}

#[test]
fn the_job_view_words_categories_and_lists_a_rank_once() {
    let dir = std::env::temp_dir().join(format!("oomdoc-wording-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, src) in [("rank0.pickle", TWO_GPUS), ("rank1.pickle", REAL)] {
        std::fs::copy(crate::common::root().join(src), dir.join(name)).unwrap();
    }
    let (a, b) = (dir.join("rank0.pickle"), dir.join("rank1.pickle"));
    let text = run(&["analyze", a.to_str().unwrap(), b.to_str().unwrap(), "--color", "never"]);
    std::fs::remove_dir_all(&dir).unwrap();
    let full = text.lines().find(|l| l.trim_start().starts_with("In full below:")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(full.matches("rank 0 (").count(), 1, "rank 0 listed once: {full}");
    let view: String = text.split("\n\n").next().unwrap().to_string();
    assert!(!view.contains("optimizer_state"), "an identifier in the job view: {view}");
}
