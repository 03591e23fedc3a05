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
    assert!(html.contains("GPU 0</strong> ran out of memory asking for 16.0 MiB"), "the verdict, escaped");
    assert!(html.contains("<span class=\"oom\">OOM</span> needed a 16.0 MiB block"), "the OOM request");
    assert!(html.contains("[leaked-references]</code> — explains 2.44 GiB"));
    assert!(html.contains("<p class=\"fix\"><strong>Fix:</strong> Keep numbers, not tensors"));
    // The timeline: one SVG, a hover target per bucket, the OOM and the peak marked.
    assert_eq!(html.matches("<svg class=\"timeline\"").count(), 1);
    let buckets = html.matches("<rect class=\"hit\"").count();
    assert!((1000..=1200).contains(&buckets), "{buckets} buckets for 9,372 events");
    assert!(html.contains(">OOM · leaked-references</text>"), "the OOM marked, with the findings about it");
    assert!(html.contains(">peak</text>"));
    assert!(
        html.contains("<title>events 9360–9367 (4.27 s in): allocated 2.94 GiB–2.96 GiB"),
        "hover: events, time, bytes"
    );
    // Live memory by stack and the largest allocations with their stacks.
    assert!(html.contains("<h3>Live memory by allocating stack</h3>"));
    assert!(html.contains("<details class=\"allocation\"><summary><code>"));
}

#[test]
fn a_long_trace_stays_light_and_a_job_leads_with_its_ranks() {
    // 19,770 events with C++ stacks: still at most 1,200 buckets, and a page well under the 5 MB bound.
    let html = page("kk", &["fixtures/real/cs336-kk-fullstep-57gb.pickle"]);
    assert_offline(&html);
    assert_balanced(&html);
    assert!(html.matches("<rect class=\"hit\"").count() <= 1200);
    assert!(html.len() < 1_000_000, "{} bytes", html.len());
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

/// `(data-a, data-b, title)` of every flame-graph frame on the page.
fn flame_frames(html: &str) -> Vec<(f64, f64, String)> {
    html.split("<g class=\"fl t")
        .skip(1)
        .map(|g| {
            let attr = |name: &str| {
                let at = g.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
                g[at..at + g[at..].find('"').unwrap()].to_string()
            };
            let title = &g[g.find("<title>").unwrap() + 7..g.find("</title>").unwrap()];
            (attr("data-a").parse().unwrap(), attr("data-b").parse().unwrap(), title.to_string())
        })
        .collect()
}

#[test]
fn the_flame_graph_shares_live_memory_out_by_allocating_stack() {
    let html = page("flame", &["fixtures/real-gpu/leaked-references/snapshot.pickle"]);
    assert_balanced(&html);
    assert_eq!(html.matches("<svg class=\"flame\"").count(), 1);
    let frames = flame_frames(&html);
    // The root is all live memory (the report's allocated bytes), the whole width.
    assert_eq!((frames[0].0, frames[0].1), (0.0, 1.0));
    assert!(frames[0].2.starts_with("all live memory at the moment: 2.97 GiB"), "{}", frames[0].2);
    // The leaking line holds 2.49 GiB of it under run(), as the text report's stack table adds up (1.15 + 1.15 +
    // 196 MiB), and its width is its share.
    let leak = frames.iter().find(|f| f.2.starts_with("body (capture/leaked_references.py:18) — ")).unwrap();
    assert!(leak.2.ends_with("2.49 GiB (84% of live memory)"), "{}", leak.2);
    assert!((leak.1 - leak.0 - 0.84).abs() < 0.005, "{leak:?}");
    // Children never stick out of their parent: every frame lies inside [0, 1] and inside some wider frame.
    for f in &frames[1..] {
        assert!(f.0 >= 0.0 && f.1 <= 1.000_001 && f.0 < f.1, "{f:?}");
        assert!(frames.iter().any(|p| p.0 <= f.0 && p.1 >= f.1 - 1e-6 && p.1 - p.0 >= f.1 - f.0), "{f:?}");
    }
    // One inline script (zoom and pan), nothing fetched.
    assert_eq!(html.matches("<script>").count(), 1);
    assert_offline(&html);
    // A capture with no stack at all: no picture of one "(no stack recorded)" bar, the table says it.
    let html = page("nostack", &["fixtures/real/text2sql-2gpu-stateonly.pickle"]);
    assert!(!html.contains("<svg class=\"flame\"") && html.contains("(no stack recorded)"));
}

#[test]
fn memory_outside_pytorch_profiles_and_the_budget_are_on_the_page() {
    // nvidia-smi beside the snapshot: memory outside PyTorch drawn on the timeline.
    let html = page(
        "smi",
        &["fixtures/real-gpu/leaked-references/snapshot.pickle", "fixtures/real-gpu/leaked-references/nvidia-smi.csv"],
    );
    assert_balanced(&html);
    assert!(html.contains("<polyline class=\"outside\" points=\""));
    assert!(html.contains("outside PyTorch (nvidia-smi used − reserved)"));
    assert!(
        html.contains(", outside PyTorch 751 MiB — at the highest: activation 2.33 GiB, user tensor 196 MiB"),
        "hover at the OOM's bucket names it, and what filled the allocated memory"
    );
    // Allocated stacked by category, the categories named in the legend.
    assert!(html.contains("<polygon class=\"cat cat-activation\" points=\""));
    assert!(html.contains("<i class=\"sw cat-activation\"></i>activation</span>"));
    // An Nsight Systems export: its section.
    let html = page(
        "nsys",
        &["fixtures/real-gpu/leaked-references/snapshot.pickle", "fixtures/profilers/ddp_accum_cuda_gpu_trace.csv"],
    );
    assert_balanced(&html);
    assert!(html.contains("<section id=\"profile\">\n<h2>Profiler exports (Nsight Systems / Nsight Compute)</h2>"));
    // A model given: the budget's prediction beside what was measured.
    let html = page(
        "budget",
        &[
            "fixtures/real-gpu/leaked-references/snapshot.pickle",
            "--params",
            "25M",
            "--train",
            "--batch",
            "8",
            "--seq",
            "512",
        ],
    );
    assert_balanced(&html);
    assert!(html.contains("<table class=\"budget\">"));
    assert!(html.contains("<tr><th>category</th><th>predicted</th><th>measured</th>"));
}

#[test]
fn the_category_split_adds_up_to_the_allocated_bytes_in_every_bucket() {
    use oomdoc::job::{Job, JobOptions};
    for file in ["fixtures/real-gpu/leaked-references/snapshot.pickle", "fixtures/real/cs336-kk-fullstep-57gb.pickle"] {
        let mut options = JobOptions::new([file]);
        options.analysis.chart_categories = true;
        let job = Job::read(&options).unwrap();
        for analysed in job.analyze() {
            let analysed = analysed.unwrap();
            let c = analysed.analysis.devices[0].chart.as_ref().unwrap();
            assert_eq!(c.by_category.len(), c.alloc_max.len(), "{file}");
            assert!(!c.categories.is_empty());
            for (i, split) in c.by_category.iter().enumerate() {
                let sum: u64 = split.iter().sum();
                // Scaled with a floor per category: at most a byte short per category.
                assert!(
                    sum <= c.alloc_max[i] && sum + split.len() as u64 >= c.alloc_max[i],
                    "{file} bucket {i}: {sum} vs {}",
                    c.alloc_max[i]
                );
            }
        }
        // Without asking, nothing is split (the other formats do not pay for the pass).
        let job = Job::read(&JobOptions::new([file])).unwrap();
        let analysed = job.analyze().next().unwrap().unwrap();
        assert!(analysed.analysis.devices[0].chart.as_ref().unwrap().by_category.is_empty());
    }
}
