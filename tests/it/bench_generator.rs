//! The speed bench must be measured on files shaped like the ones torch writes: `bench/gen_bench_snapshot.py
//! --variant real` is checked here against the figures of the real snapshots in `fixtures/real/` (lists of frames
//! per trace entry, bytes per entry, the key set), computed by the generator's `--stats`, which computes them
//! as `../shared/tools/snapshot-stats.py` does.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn stats(file: &Path) -> Value {
    let out = Command::new("python3")
        .args(["bench/gen_bench_snapshot.py", "--stats"])
        .arg(file)
        .output()
        .expect("python3 runs");
    assert!(out.status.success(), "--stats {}: {}", file.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--stats prints JSON")
}

/// Writes a bench file with these generator arguments to a scratch path, which the caller removes.
fn generate(tag: &str, args: &[&str]) -> std::path::PathBuf {
    let file = std::env::temp_dir().join(format!("oomdoc-bench-{tag}-{}.pickle", std::process::id()));
    let gen = Command::new("python3")
        .arg("bench/gen_bench_snapshot.py")
        .args(args)
        .arg("-o")
        .arg(&file)
        .output()
        .expect("python3 runs");
    assert!(gen.status.success(), "{}", String::from_utf8_lossy(&gen.stderr));
    file
}

fn figure(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn the_real_variant_has_the_statistics_of_real_snapshots() {
    // The range over the real traces long enough to have a shape (1000+ entries).
    let mut lists = (f64::MAX, f64::MIN);
    let mut bytes = (f64::MAX, f64::MIN);
    let mut measured = 0;
    for e in std::fs::read_dir("fixtures/real").expect("fixtures/real") {
        let path = e.expect("entry").path();
        if path.extension().is_none_or(|x| x != "pickle") {
            continue;
        }
        let s = stats(&path);
        if s["entries"].as_u64().unwrap_or(0) < 1000 {
            continue;
        }
        let (l, b) = (figure(&s, "lists_per_entry"), figure(&s, "bytes_per_entry"));
        lists = (lists.0.min(l), lists.1.max(l));
        bytes = (bytes.0.min(b), bytes.1.max(b));
        measured += 1;
    }
    assert!(measured >= 15, "only {measured} real traces of 1000+ entries");
    // What ../shared/tools/snapshot-stats.py printed for one of them: the two computations agree.
    let one = stats(Path::new("fixtures/real/cs336-bcrafton-t210.pickle"));
    assert_eq!((figure(&one, "lists_per_entry"), figure(&one, "bytes_per_entry")), (0.667, 195.9));

    let file = generate("real", &["--variant", "real", "--entries", "20000"]);
    let s = stats(&file);
    let (l, b) = (figure(&s, "lists_per_entry"), figure(&s, "bytes_per_entry"));
    assert!(lists.0 <= l && l <= lists.1, "lists per entry {l}, real files {lists:?}");
    assert!(bytes.0 <= b && b <= bytes.1, "bytes per entry {b}, real files {bytes:?}");
    // The key set torch ≥ 2.10 writes.
    let keys: Vec<&str> = s["keys"].as_array().expect("keys").iter().filter_map(Value::as_str).collect();
    assert_eq!(keys, ["action", "addr", "compile_context", "frames", "size", "stream", "time_us", "user_metadata"]);
    // Stacks as deep as real ones (real medians: 31–37 frames), and more than a handful of them.
    let depth = figure(&s, "depth_median");
    assert!((20.0..=45.0).contains(&depth), "median depth {depth}");
    assert!(s["distinct_stacks"].as_u64().unwrap_or(0) >= 100, "{s}");
    // oomdoc reads every entry of it.
    let tl = oomdoc::ingest::snapshot::read(&std::fs::read(&file).expect("read")[..], None)
        .unwrap_or_else(|e| panic!("{e}"))
        .timeline;
    let events: usize = tl.devices.iter().map(|d| d.events.len()).sum();
    let _ = std::fs::remove_file(&file);
    assert_eq!(events, 20000);
}

#[test]
fn the_python_stacks_variant_has_the_statistics_of_python_stack_captures() {
    // Traces recorded with `stacks="python"` (what `oomdoc.record()` asks for) during training: the autograd
    // engine's allocations have no Python frame, so they are the ones with allocations that have no frames.
    let mut range = [(f64::MAX, f64::MIN); 3];
    let keys = ["lists_per_entry", "bytes_per_entry", "allocs_without_frames"];
    let mut measured = Vec::new();
    for path in crate::common::real_snapshots() {
        let s = stats(&path);
        if s["entries"].as_u64().unwrap_or(0) < 1000 || s["allocs_without_frames"].as_f64().unwrap_or(0.0) == 0.0 {
            continue;
        }
        for (r, k) in range.iter_mut().zip(keys) {
            let x = figure(&s, k);
            *r = (r.0.min(x), r.1.max(x));
        }
        measured.push(path);
    }
    assert!(measured.len() >= 4, "python-stack training traces: {measured:?}");

    let file = generate("python", &["--variant", "real", "--stacks", "python", "--entries", "100000"]);
    let s = stats(&file);
    for (r, k) in range.iter().zip(keys) {
        let x = figure(&s, k);
        assert!(r.0 <= x && x <= r.1, "{k} {x}, real python-stack traces {r:?} ({measured:?})");
    }
    let tl = oomdoc::ingest::snapshot::read(&std::fs::read(&file).expect("read")[..], None)
        .unwrap_or_else(|e| panic!("{e}"))
        .timeline;
    let _ = std::fs::remove_file(&file);
    let events = &tl.devices[0].events;
    assert_eq!(events.len(), 100_000);
    // The entries without frames are read as such: the empty stack, not a stack of their neighbour's.
    let allocs: Vec<_> = events.iter().filter(|e| e.action == oomdoc::timeline::Action::Alloc).collect();
    let empty = allocs.iter().filter(|e| e.stack == oomdoc::timeline::stacks::EMPTY_STACK).count();
    let share = empty as f64 / allocs.len() as f64;
    assert!((share - figure(&s, "allocs_without_frames")).abs() < 0.001, "{share} {s}");
}

#[test]
fn the_wrapped_variant_has_the_statistics_of_wrapped_real_traces() {
    // Real traces that do not reach back to the start of their run (a wrapped ring buffer, or recording started
    // late): the share of blocks live at the end they never saw allocated, of segments they never saw created, and
    // of entries freeing what they never saw. The wrapped bench file must sit inside their range.
    let mut before = (f64::MAX, f64::MIN);
    let mut unseen = (f64::MAX, f64::MIN);
    let mut wrapped = 0;
    for dir in ["fixtures/real", "fixtures/real-gpu"] {
        let mut files: Vec<std::path::PathBuf> = Vec::new();
        for e in std::fs::read_dir(dir).expect(dir) {
            let p = e.expect("entry").path();
            if p.is_dir() {
                files.push(p.join("snapshot.pickle"));
            } else if p.extension().is_some_and(|x| x == "pickle") {
                files.push(p);
            }
        }
        for path in files.into_iter().filter(|p| p.exists()) {
            let s = stats(&path);
            if s["entries"].as_u64().unwrap_or(0) < 1000 || s.get("blocks_before_trace").is_none() {
                continue;
            }
            let b = figure(&s, "blocks_before_trace");
            if b < 0.05 {
                continue; // a trace from the start of its run
            }
            before = (before.0.min(b), before.1.max(b));
            let u = figure(&s, "frees_unseen_per_entry");
            unseen = (unseen.0.min(u), unseen.1.max(u));
            wrapped += 1;
        }
    }
    assert!(wrapped >= 5, "only {wrapped} wrapped real traces");
    let file = generate("wrapped", &["--variant", "real", "--wrap", "0.5", "--entries", "20000"]);
    let s = stats(&file);
    let _ = std::fs::remove_file(&file);
    let (b, u) = (figure(&s, "blocks_before_trace"), figure(&s, "frees_unseen_per_entry"));
    assert!(before.0 <= b && b <= before.1, "blocks from before the trace {b}, real wrapped traces {before:?}");
    assert!(unseen.0 <= u && u <= unseen.1, "unseen frees per entry {u}, real wrapped traces {unseen:?}");
    assert!(figure(&s, "segments_before_trace") > 0.2, "{s}");
}
