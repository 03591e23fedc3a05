//! The reader decodes a trace entry by one of three routes: at fixed offsets from a byte layout learnt from an earlier
//! entry (the fast one), field by field as a streamed record, or whole by the generic pickle machine. A change of the
//! format that no layout can hold (a new key whose value differs on every entry, say) still reads right but takes
//! every entry off the fast route, with no answer changing: these tests are what notices.

use std::path::{Path, PathBuf};
use std::process::Command;

use oomdoc::ingest::snapshot;
use oomdoc::timeline::ReadRoutes;

/// What the fast route must carry on a trace written the way torch writes them: all but a few entries (the first of
/// each layout, and entries whose fields are out of the usual order).
fn fast_routes_hold(r: &ReadRoutes) -> bool {
    r.layout_share() >= 0.98 && r.generic * 100 <= r.entries
}

fn routes(file: &Path) -> (ReadRoutes, usize) {
    let snap = snapshot::read(&std::fs::read(file).expect("read")[..], None).unwrap_or_else(|e| panic!("{e}"));
    let r = snap.routes;
    assert_eq!(
        r.layout + r.streamed + r.generic,
        r.entries,
        "{}: every entry on exactly one route: {r}",
        file.display()
    );
    let events = snap.timeline.devices.iter().map(|d| d.events.len()).sum();
    (r, events)
}

fn generate(tag: &str, args: &[&str]) -> PathBuf {
    let file = std::env::temp_dir().join(format!("oomdoc-routes-{tag}-{}.pickle", std::process::id()));
    let out = Command::new("python3")
        .args(["bench/gen_bench_snapshot.py", "--variant", "real", "--entries", "20000"])
        .args(args)
        .arg("-o")
        .arg(&file)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    file
}

#[test]
fn real_traces_are_read_by_learnt_layout() {
    let mut checked = 0;
    for path in crate::common::real_snapshots() {
        let (r, _) = routes(&path);
        // A short trace is mostly the first entries of its layouts.
        if r.entries < 1000 {
            continue;
        }
        assert!(fast_routes_hold(&r), "{}: {r}", path.display());
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} real traces of 1,000 entries or more");
}

#[test]
fn a_generated_real_shaped_trace_is_read_by_learnt_layout_and_a_made_up_key_is_caught() {
    let plain = generate("plain", &[]);
    let (r, events) = routes(&plain);
    let _ = std::fs::remove_file(&plain);
    assert_eq!(events, 20000);
    assert!(fast_routes_hold(&r), "{r}");

    // A key no torch writes, its value a str that differs on every entry: every entry is still read, and read the
    // same, but no layout holds it, so the check above fails — as it must for any such drift of the format.
    let drifted = generate("made-up-key", &["--extra-key", "region"]);
    let (d, events) = routes(&drifted);
    let _ = std::fs::remove_file(&drifted);
    assert_eq!(events, 20000);
    assert!(!fast_routes_hold(&d), "a varying key left the fast route in use: {d}");
    assert!(d.streamed > d.entries / 2, "{d}");
}
