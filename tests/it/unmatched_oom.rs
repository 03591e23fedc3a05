//! An OOM message that matches no snapshot (another rank's log, a GPU whose snapshot was not given) is its own entry
//! in every format, said as unmatched, and the job's first OOM considers it.

use crate::common::{analyze_json, oomdoc, stderr, stdout};

const SNAPSHOT: &str = "fixtures/real/cs336-kk-fullstep-57gb.pickle";
const LOG: &str = "fixtures/logs/rank3-oom-gpu3.log";

fn analyze(format: &str, args: &[&str]) -> String {
    let mut all = vec!["analyze", "--format", format];
    all.extend_from_slice(args);
    let o = oomdoc(&all);
    assert_eq!(o.status.code(), Some(0), "{format}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn a_log_oom_of_another_gpu_is_its_own_entry_in_every_format() {
    let v = analyze_json(&[SNAPSHOT, LOG]);
    let devices = v["devices"].as_array().unwrap();
    let gpu3 = devices.iter().find(|d| d["device"] == 3).expect("the log's GPU has an entry");
    assert_eq!(gpu3["unmatched"], true);
    assert_eq!(gpu3["source"], "text");
    assert_eq!(gpu3["oom"]["requested_bytes"], 2u64 << 30);
    assert_eq!(gpu3["oom"]["message"]["rank"], 3);
    let summary = gpu3["verdict"]["summary"].as_str().unwrap();
    assert!(summary.contains("GPU 3 ran out of memory asking for 2.00 GiB"), "{summary}");
    assert!(summary.contains("no snapshot given is of GPU 3") && summary.contains("rank3-oom-gpu3.log:7"), "{summary}");
    // The snapshot's own GPU keeps its report, and is not said to have run out.
    let gpu0 = devices.iter().find(|d| d["device"] == 0).unwrap();
    assert!(gpu0["oom"].is_null() && gpu0.get("unmatched").is_none());

    for format in ["text", "markdown", "html"] {
        let out = analyze(format, &[SNAPSHOT, LOG]);
        let verdict = out.replace("**", "").replace("<strong>", "").replace("</strong>", "");
        assert!(verdict.contains("GPU 3 ran out of memory asking for 2.00 GiB"), "{format}: the verdict lacks GPU 3");
        assert!(out.contains("no snapshot given is of GPU 3"), "{format}: not said as unmatched");
        assert!(out.contains("Tried to allocate") || out.contains("tried to allocate"), "{format}: no OOM detail");
    }
}

#[test]
fn in_a_job_the_unmatched_oom_is_one_row_and_the_first_oom() {
    let v = analyze_json(&[SNAPSHOT, "fixtures/real/cs336-wl-train-newest.pickle", LOG]);
    let job = &v["job"];
    let rows = job["ranks"].as_array().unwrap();
    let unmatched: Vec<_> = rows.iter().filter(|r| r["unmatched"] == true).collect();
    assert_eq!(unmatched.len(), 1, "one row for the message, though both ranks read it: {rows:?}");
    assert_eq!(unmatched[0]["rank"], 3, "the rank its launcher prefix names");
    assert_eq!(unmatched[0]["device"], 3);
    assert_eq!(job["first_oom"]["device"], 3, "the job's first OOM considers the log");

    let text = analyze("text", &[SNAPSHOT, "fixtures/real/cs336-wl-train-newest.pickle", LOG]);
    assert!(text.starts_with("Job: 2 ranks, 2 snapshots"), "{text}");
    assert!(text.contains("first OOM: rank 3, GPU 3") && text.contains("no snapshot of that GPU given"), "{text}");
    assert!(!text.contains("no rank ran out of memory"), "{text}");
    for format in ["markdown", "html"] {
        let out = analyze(format, &[SNAPSHOT, "fixtures/real/cs336-wl-train-newest.pickle", LOG]);
        assert!(out.contains("First OOM") && out.contains("no snapshot of that GPU given"), "{format}");
    }
}

#[test]
fn a_log_oom_of_the_snapshots_gpu_is_matched_not_repeated() {
    // The real capture's own log names GPU 0, the snapshot's GPU: one report, with the message joined to it.
    let v = analyze_json(&[
        "fixtures/real-gpu/nccl-nonpytorch/snapshot.pickle",
        "fixtures/real-gpu/nccl-nonpytorch/stderr.log",
    ]);
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert!(devices[0].get("unmatched").is_none());
    assert!(!devices[0]["oom"]["message"].is_null());
}
