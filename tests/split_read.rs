//! Reading the second half of a trace on a helper thread (`pickle::Split`) must give the very snapshot a single
//! thread reads: the same events in the same order, the same attribute ids, stacks, segments and format version.
//! Every real and generated snapshot is read with the helper started at many points, and a generated trace with
//! everything the helper has to get right (frames cut by protocol 4/5 FRAME headers, BINPUT slots in protocol 2,
//! stacks first seen after the helper started, OOM entries, two devices, pool ids, compile contexts) must both
//! match and actually be read in part by the helper. Where the records read before the helper's were already
//! replayed while reading (`replay::Head`), the device's replay must come out the same as one made from scratch.

use std::path::Path;
use std::sync::Arc;

use oomdoc::ingest::pickle::{ReadAt, Split};
use oomdoc::ingest::snapshot::{self, Snapshot};
use oomdoc::timeline::replay::Replay;

/// Everything a read produces that a report could depend on, in a comparable form, with each device's replay.
fn digest(s: &Snapshot) -> String {
    let tl = &s.timeline;
    let mut out = format!("{} p{} {} bytes\n{:?}\n", s.format_version, s.protocol, s.bytes, tl.stacks);
    for d in &tl.devices {
        out += &format!("device {}: {:?}\n{:?}\n{:?}\n", d.device, d.events, d.event_attrs.all(), d.segments);
        let r = Replay::new(d, tl.settings.as_ref());
        out += &format!(
            "replay {:?} {:?} {:?} {:?}\n{:?}\n{:?}\n",
            r.peak_allocated, r.peak_reserved, r.end_mismatch, r.anomalies, r.allocated_series, r.reserved_series
        );
        for at in [None, Some(d.events.len() as u32 / 3), Some(d.events.len().saturating_sub(1) as u32)] {
            let st = r.state_at(at);
            out += &format!(
                "at {at:?}: {} {} {} {} {}\n",
                st.allocated,
                st.active,
                st.reserved,
                st.largest_free_block(),
                st.block_count()
            );
        }
    }
    out += &format!("{:?}\n{:?}\n", tl.settings, tl.annotations);
    out
}

fn read(bytes: &[u8], split: Option<Split>) -> Result<Snapshot, String> {
    snapshot::read_split(bytes, bytes.len() as u64, None, split).map_err(|e| e.to_string())
}

fn split_at(bytes: &[u8], at: f64, after_records: u32) -> Split {
    let source: Arc<dyn ReadAt> = Arc::new(bytes.to_vec());
    Split { source, len: bytes.len() as u64, min_rest: 0, after_records, at, settle_after: 1, patient: true }
}

const POINTS: [f64; 9] = [0.0, 0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 1.0];

/// Devices whose first events were replayed while reading.
fn heads(s: &Snapshot) -> usize {
    s.timeline.devices.iter().filter(|d| d.replay_head.lock().unwrap().is_some()).count()
}

/// Reads `bytes` alone and with a helper started at each of `POINTS`; returns the most records a helper read.
fn same_with_helper(name: &str, bytes: &[u8]) -> u64 {
    let alone = read(bytes, None);
    let mut most = 0;
    let mut replayed = 0;
    for after in [1, 64, 2000] {
        for at in POINTS {
            let helped = read(bytes, Some(split_at(bytes, at, after)));
            match (&alone, &helped) {
                (Ok(a), Ok(h)) => {
                    replayed += heads(h);
                    assert_eq!(digest(a), digest(h), "{name}: helper from {at} after {after} records");
                    most = most.max(h.helper_records);
                }
                (Err(a), Err(h)) => assert_eq!(a, h, "{name}: the same error with a helper from {at}"),
                (a, h) => panic!("{name}: alone {:?} but helped from {at}: {:?}", a.is_ok(), h.is_ok()),
            }
        }
    }
    // Whenever a helper's records were taken in, the events before them were replayed while reading.
    assert!(most == 0 || replayed > 0, "{name}: a helper read {most} records but no replay was made while reading");
    most
}

#[test]
fn every_fixture_snapshot_reads_the_same_with_a_helper() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut files: Vec<_> = ["real", "generated/shapes"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    assert!(files.len() >= 25, "found only {} snapshots", files.len());
    let mut helped = 0;
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        if same_with_helper(&f.display().to_string(), &bytes) > 0 {
            helped += 1;
        }
    }
    // Real traces with a few thousand entries of one layout: the helper takes part in several of them.
    assert!(helped >= 3, "a helper read records in only {helped} of {} files", files.len());
}

const GEN: &str = r#"
import pickle, random, sys
rng = random.Random(11)
files = [f"/app/model/part{i}.py" for i in range(9)] + ["/usr/lib/python3/site-packages/torch/nn/modules/module.py"]
frames = [{"filename": files[i % 10], "name": f"fn_{i}", "line": 3 + 11 * i} for i in range(120)]
stacks = [[frames[(s * 13 + k * 7) % 120] for k in range(3 + s % 7)] for s in range(400)]
def trace(dev, n):
    out, live, top, t = [], [], 0x7f0000000000 + dev * (1 << 36), 1_700_000_000_000_000
    out.append({"action": "segment_alloc", "addr": top, "size": 1 << 34, "stream": 0, "time_us": t, "frames": stacks[0]})
    for i in range(n):
        t += rng.randint(1, 900)
        # stacks come into use gradually, so some are first seen after the helper has started
        s = rng.randrange(1 + min(399, i // 15))
        stream = 94_000_000 + dev if i % 50 == 0 else 0
        extra = {"compile_context": "N/A" if i % 400 else "[0/1]"}
        if live and rng.random() < 0.45:
            a, size, s0 = live.pop(rng.randrange(len(live)))
            for act in ("free_requested", "free_completed"):
                out.append({"action": act, "addr": a, "size": size, "stream": stream, "time_us": t, "frames": stacks[s0], **extra})
        elif i % 997 == 500:
            out.append({"action": "oom", "size": 1 << rng.randint(20, 40), "device_free": rng.randint(0, 1 << 33), "stream": stream, "time_us": t, "frames": stacks[s]})
        else:
            size = rng.choice([512, 4096, 1 << 20, 3 << 22, 1 << 31, 1 << 33])
            e = {"action": "alloc", "addr": top, "size": size, "stream": stream, "time_us": t, "frames": stacks[s], **extra}
            if i % 500 == 0:
                e["pool_id"] = (0, dev + 1)
            out.append(e)
            live.append((top, size, s))
            top += size
    return out
snap = {"segments": [], "device_traces": [trace(0, 9000), trace(1, 4000)],
        "allocator_settings": {"expandable_segments": False}}
for proto, path in zip((2, 4, 5), sys.argv[1:]):
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=proto)
"#;

/// The generated trace in protocols 2, 4 and 5, written once for all tests here.
fn generated() -> &'static [(String, Vec<u8>)] {
    static FILES: std::sync::OnceLock<Vec<(String, Vec<u8>)>> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("oomdoc-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths: Vec<String> =
            ["p2", "p4", "p5"].iter().map(|p| dir.join(format!("{p}.pickle")).display().to_string()).collect();
        let ok = std::process::Command::new("python3").arg("-c").arg(GEN).args(&paths).status();
        assert!(ok.is_ok_and(|s| s.success()), "python3 could not write the trace");
        let files = paths.iter().map(|p| (p.clone(), std::fs::read(p).unwrap())).collect();
        let _ = std::fs::remove_dir_all(&dir);
        files
    })
}

#[test]
fn a_long_two_device_trace_reads_the_same_and_the_helper_takes_part() {
    for (p, bytes) in generated() {
        let most = same_with_helper(p, bytes);
        // It stops at each entry with a stack not seen before (the generic reader takes those), and at the end
        // of a device's list; the longest stretch without either is ~3000 entries, and the helper starts where the split point falls.
        assert!(most > 300, "{p}: the helper read at most {most} records");
        eprintln!("{p}: the helper read up to {most} records");
        // A split found by searching must land on a real record boundary, wherever the search starts.
        for k in 1..40 {
            let at = k as f64 / 40.0;
            let a = read(bytes, None).unwrap();
            let h = read(bytes, Some(split_at(bytes, at, 16))).unwrap();
            assert_eq!(digest(&a), digest(&h), "{p}: helper from {at}");
        }
    }
}

#[test]
fn a_cut_or_corrupted_trace_fails_the_same_with_a_helper() {
    let bytes = &generated()[1].1;
    // Cut short in the second half, where the helper reads.
    for cut in [bytes.len() * 3 / 5, bytes.len() * 4 / 5, bytes.len() - 3] {
        same_with_helper(&format!("cut at {cut}"), &bytes[..cut]);
    }
    // An entry's address turned into a str: the same clear error, from the reader, either way.
    let mut bad = bytes.to_vec();
    let at = bad.len() * 3 / 4;
    let i = at + bad[at..].windows(2).position(|w| w == [b'}', 0x94]).unwrap();
    let j = i + bad[i..].iter().position(|&b| b == 0x8a).unwrap();
    bad[j] = 0x8c;
    same_with_helper("corrupted", &bad);
}
