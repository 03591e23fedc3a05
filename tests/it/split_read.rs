//! A long trace read in two parts at once (`pickle::split`): what the helper thread reads must be what the main
//! thread would have read, and whatever the helper cannot vouch for (a value stored in the part it skipped, a frame
//! or stack new since the fork) it must leave to the main thread.

use std::process::Command;

use oomdoc::ingest::pickle::SplitStats;
use oomdoc::ingest::snapshot;

use crate::bad_input::fuzz_targets::split_source;
use crate::common;

/// Reads `bytes` on one thread and in two parts; both must give the same snapshot. What the helper read.
fn read_both(name: &str, bytes: &[u8]) -> Option<SplitStats> {
    let len = bytes.len() as u64;
    let one = snapshot::read_sized(bytes, len, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    let two =
        snapshot::read_split(bytes, len, None, Some(split_source(bytes))).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(one.format_version, two.format_version, "{name}");
    assert!(format!("{:?}", one.timeline) == format!("{:?}", two.timeline), "{name}: the two reads differ");
    two.split
}

#[test]
fn traces_read_in_two_parts_read_as_in_one() {
    // A real GPU capture (30,000 entries) and generated rule fixtures, all long enough to be split.
    for f in [
        "fixtures/real-gpu/kv-growth/snapshot.pickle",
        "fixtures/generated/rules/unbounded-kv-growth-fire-oom.pickle",
        "fixtures/generated/rules/segment-churn-fire.pickle",
    ] {
        let split = read_both(f, &common::read(f)).unwrap_or_else(|| panic!("{f}: no helper read a part"));
        assert!(split.records > 0 && split.from < split.to, "{f}: {split:?}");
    }
}

/// A training loop's trace as torch writes it (a fresh `frames` list per allocation, named again by its frees,
/// frame dicts shared), pickled by Python, with `twist` applied (see the script).
fn python_trace(twist: &str) -> Vec<u8> {
    let script = r#"
import pickle, sys
twist = sys.argv[1]
n = 30000
frames = [{'filename': f'model{i % 7}.py', 'name': f'f{i}', 'line': i} for i in range(40)]
late_frame = {'filename': 'late.py', 'name': 'only_late', 'line': 1}
gap_str = ''.join(['made-', 'in-the-gap'])
trace, live, t = [], [], 0
for i in range(n):
    t += 1
    meta = ''
    if twist == 'gap-str' and i == n * 3 // 10:
        meta = gap_str
    if twist == 'gap-str' and i >= n * 8 // 10:
        meta = gap_str
    if len(live) < 8:
        k = i % 5
        fl = [frames[(k + j) % 40] for j in range(k + 2)] if i % 3 else []
        if twist == 'late-stack' and i >= n * 85 // 100:
            fl = [late_frame] + fl
        addr = 0x7f0000000000 + (i % 64) * 4096 * 16
        while any(a == addr for a, _, _ in live):
            addr += 4096
        e = {'action': 'alloc', 'addr': addr, 'size': 512 * (k + 1), 'stream': 0, 'time_us': t, 'frames': fl,
             'user_metadata': meta, 'compile_context': 'N/A'}
        if twist == 'gap-key' and i >= n * 3 // 10:
            e['late_key'] = 1
        trace.append(e)
        live.append((addr, e['size'], fl))
    else:
        addr, size, fl = live.pop(0)
        for action in ('free_requested', 'free_completed'):
            trace.append({'action': action, 'addr': addr, 'size': size, 'stream': 0, 'time_us': t, 'frames': fl,
                          'user_metadata': meta, 'compile_context': 'N/A'})
sys.stdout.buffer.write(pickle.dumps({'segments': [], 'device_traces': [trace]}, protocol=4))
"#;
    let out = Command::new("python3").args(["-c", script, twist]).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[test]
fn frees_naming_lists_stored_before_the_helpers_part_are_resolved_when_it_is_taken() {
    // Half the frees name an allocation's list stored before the helper's part began (or in it, under a number the
    // helper cannot know): the helper defers them, the main thread resolves them.
    let split = read_both("plain", &python_trace("plain")).expect("a helper read a part");
    assert!(split.records >= 5000, "{split:?}");
}

#[test]
fn a_value_stored_in_the_skipped_part_ends_the_helpers_part() {
    // From 80% on, every entry's user_metadata names a str first stored at 30%, between the fork and the helper's
    // part: the helper cannot know it, so it stops before the first such entry and the main thread reads the rest.
    let bytes = python_trace("gap-str");
    let split = read_both("gap-str", &bytes).expect("a helper read a part");
    let first_use = bytes.len() as u64 * 8 / 10;
    assert!(split.to < first_use + bytes.len() as u64 / 20, "{split:?}");
}

#[test]
fn a_key_stored_in_the_skipped_part_ends_the_helpers_part() {
    // From 30% on, allocations carry a key first written there, between the fork and the helper's part: the
    // helper cannot tell which key its reference names, so it keeps no batch holding one (the main thread skips
    // the unknown key; the helper must not skip a key it cannot read).
    let bytes = python_trace("gap-key");
    if let Some(split) = read_both("gap-key", &bytes) {
        panic!("the helper kept a part holding keys it cannot read: {split:?}");
    }
}

#[test]
fn a_stack_new_in_the_helpers_part_ends_it() {
    // A frame first seen at 85%: the main thread may be making other frames meanwhile, under the same ids.
    let bytes = python_trace("late-stack");
    let split = read_both("late-stack", &bytes).expect("a helper read a part");
    assert!(split.to < bytes.len() as u64 * 9 / 10, "{split:?}");
}

#[test]
fn the_command_reads_a_long_trace_in_two_parts_with_the_same_report() {
    let f = "fixtures/real-gpu/kv-growth/snapshot.pickle";
    let run = |split: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_oomdoc"));
        c.args(["analyze", f, "--format", "json"]).current_dir(common::root()).env("OOMDOC_TIMING", "1");
        match split {
            "on" => c.env("OOMDOC_SPLIT_MIN_BYTES", "0").env("OOMDOC_SPLIT_PATIENT", "1"),
            _ => c.env("OOMDOC_SPLIT", "0"),
        };
        let o = c.output().expect("oomdoc runs");
        assert!(o.status.success(), "{}", common::stderr(&o));
        o
    };
    let (on, off) = (run("on"), run("off"));
    assert!(common::stderr(&on).contains("a helper thread read"), "{}", common::stderr(&on));
    assert!(!common::stderr(&off).contains("a helper thread read"), "{}", common::stderr(&off));
    assert_eq!(common::stdout(&on), common::stdout(&off));
}

#[test]
fn damaged_traces_read_the_same_in_two_parts() {
    // Bytes changed at random in the later part of a trace, where the helper reads: whatever each change makes of
    // the file (another number, a broken opcode, a reference to a slot not yet stored), the two reads must agree,
    // on the snapshot or on the error.
    let clean = python_trace("plain");
    let (mut x, mut split) = (0x9e37_79b9_7f4a_7c15u64, 0);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..48 {
        let mut bytes = clean.clone();
        for _ in 0..1 + next() % 3 {
            let at = bytes.len() / 2 + (next() as usize) % (bytes.len() / 2);
            bytes[at] = next() as u8;
        }
        let len = bytes.len() as u64;
        let one = snapshot::read_sized(&bytes[..], len, None);
        let two = snapshot::read_split(&bytes[..], len, None, Some(split_source(&bytes)));
        match (one, two) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.format_version, b.format_version, "round {round}");
                assert!(format!("{:?}", a.timeline) == format!("{:?}", b.timeline), "round {round}: reads differ");
                split += b.split.is_some() as u32;
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "round {round}"),
            (a, b) => panic!("round {round}: one read is {:?}, the other {:?}", a.is_ok(), b.is_ok()),
        }
    }
    assert!(split >= 10, "the helper's part was taken in {split} of 48 rounds");
}
