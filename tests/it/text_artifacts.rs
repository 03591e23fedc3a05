//! `oomdoc analyze` on what else a failed job leaves: training logs with the OOM message, vLLM logs, nvidia-smi
//! logs — alone and joined with the snapshot of the same run, on one clock.

use crate::common;

use common::{oomdoc, stderr, stdout};
use serde_json::Value;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

const JOINT: &str = "fixtures/generated/joint/nccl-with-smi.pickle";
const JOINT_LOG: &str = "fixtures/generated/joint/nccl-with-smi.train.log";

fn json(args: &[&str]) -> Value {
    let mut a = vec!["analyze"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--format", "json"]);
    let o = oomdoc(&a);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn text(args: &[&str]) -> String {
    let mut a = vec!["analyze"];
    a.extend_from_slice(args);
    let o = oomdoc(&a);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

fn temp(name: &str, body: &str) -> (tempdir::Dir, String) {
    let d = tempdir::Dir::new();
    let p = d.0.join(name);
    std::fs::write(&p, body).unwrap();
    let s = p.display().to_string();
    (d, s)
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "oomdoc-text-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

// ---- A training log on its own ----

#[test]
fn a_log_alone_gives_the_oom_its_figures_and_the_memory_outside_pytorch() {
    let v = json(&[JOINT_LOG]);
    // The top-level list, in the contract's shape.
    let ooms = v["ooms"].as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    let m = &ooms[0];
    for key in [
        "source",
        "device",
        "rank",
        "requested_bytes",
        "total_bytes",
        "free_bytes",
        "allocated_bytes",
        "reserved_bytes",
        "non_pytorch_bytes",
        "kind",
        "line",
    ] {
        assert!(m.get(key).is_some(), "ooms[] lacks {key}: {m}");
    }
    assert_eq!(m["requested_bytes"], 1536 * MIB);
    assert_eq!(m["total_bytes"], 40 * GIB);
    assert_eq!(m["free_bytes"], 768 * MIB);
    assert_eq!(m["allocated_bytes"], 33 * GIB);
    assert_eq!(m["reserved_bytes"], 33 * GIB + 256 * MIB);
    assert_eq!(m["non_pytorch_bytes"], 6 * GIB);
    assert_eq!((m["device"].as_i64(), m["rank"].as_i64(), m["line"].as_i64()), (Some(0), Some(0), Some(9)));
    assert_eq!(m["kind"], "allocator");
    // The last OOM of GPU 0 is also that device's oom.
    let d = &v["devices"][0];
    assert_eq!(d["source"], "text");
    assert_eq!(d["oom"]["source"], "log");
    assert_eq!(d["oom"]["requested_bytes"], 1536 * MIB);
    assert_eq!(d["oom"]["message"]["line"], 9);
    assert_eq!(d["oom"]["culprit"], "train_fsdp.py:74 in main");
    // 6 GiB outside PyTorch on a 40 GiB GPU, from the message's own figures: PyTorch's 33.25 GiB and the 1.5 GiB
    // request fit the GPU; the driver's 768 MiB did not. The memory outside PyTorch decided the OOM.
    assert_eq!(common::rules_fired(&v), ["nccl-overhead:error"]);
    let f = &v["findings"][0];
    assert!(f["message"].as_str().unwrap().contains("decided this OOM"), "{f}");
    assert!(f["message"].as_str().unwrap().contains("6.00 GiB was held outside"), "{f}");
    assert!(f["message"].as_str().unwrap().contains("from the OOM message"), "{f}");

    let t = text(&[JOINT_LOG]);
    assert!(t.contains("tried to allocate 1.50 GiB (PyTorch's caching allocator, rank 0"), "{t}");
    assert!(t.contains("raised at train_fsdp.py:74 in main"), "{t}");
    assert!(t.contains("No snapshot for this GPU"), "{t}");
}

#[test]
fn fragmentation_from_the_oom_message_alone() {
    // 6.41 GiB reserved but unallocated and a 2 GiB request: fragmentation (pools unknown without a snapshot).
    // Outside PyTorch: 79.10 − 1.06 − 76.53 = 1.51 GiB, 1 GiB beyond a bare CUDA context and more than the 0.94 GiB
    // the request lacked: it decided the OOM too, but explains a fifth of what fragmentation does, so it is a
    // warning under it.
    let log = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
               capacity of 79.10 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.03 \
               GiB memory in use. Of the allocated memory 70.12 GiB is allocated by PyTorch, and 6.41 GiB is \
               reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
               PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n";
    let (_d, path) = temp("train.log", log);
    let v = json(&[&path]);
    assert_eq!(common::rules_fired(&v), ["fragmentation:error", "nccl-overhead:warning"]);
    assert_eq!(v["devices"][0]["verdict"]["primary_rule"], "fragmentation");
    let f = v["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "fragmentation").unwrap();
    let msg = f["message"].as_str().unwrap();
    assert!(msg.contains("6.41 GiB reserved but unallocated") && msg.contains("request for 2.00 GiB"), "{msg}");
    // The same job with only 1 GiB cached free: a real shortage, not fragmentation.
    let short = log.replace("6.41 GiB is reserved", "1.00 GiB is reserved");
    let (_d2, path2) = temp("train.log", &short);
    assert!(!common::rules_fired(&json(&[&path2])).iter().any(|r| r.starts_with("fragmentation")));
}

#[test]
fn a_log_with_no_oom_is_read_as_a_log_when_named_like_one() {
    // `train.log` of a run that did not fail: read, and the report says there was no OOM in it.
    let (_d, path) = temp("train.log", "step 1 loss 2.0\nstep 2 loss 1.9\n");
    let t = text(&[&path]);
    assert!(t.contains("no out-of-memory report"), "{t}");
    // Beside a snapshot it does not stop the analysis.
    let o = oomdoc(&["analyze", "fixtures/real-gpu/healthy/snapshot.pickle", "fixtures/real-gpu/healthy/stderr.log"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Text named otherwise must be recognised (or forced with --kind log).
    let (_d2, notes) = temp("notes.md", "step 1 loss 2.0\nstep 2 loss 1.9\n");
    let o = oomdoc(&["analyze", &notes]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("not a recognised artifact") && e.contains("--kind"), "{e}");
    let t = text(&[&notes, "--kind", "log"]);
    assert!(t.contains("no out-of-memory report"), "{t}");
}

#[test]
fn malformed_oom_messages_are_counted_and_strict_makes_them_errors() {
    let log = "step 1\ntorch.OutOfMemoryError: CUDA out of memory.\n";
    let (_d, path) = temp("cut.log", log);
    let v = json(&[&path]);
    assert_eq!(v["inputs"][0]["malformed_lines"], 1);
    assert_eq!(v["inputs"][0]["malformed"][0]["line"], 2);
    assert!(text(&[&path]).contains("1 malformed line skipped"));
    let o = oomdoc(&["analyze", &path, "--strict"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 2: expected"), "{}", stderr(&o));
}

// ---- A snapshot with the log of the same run ----

#[test]
fn the_snapshot_oom_carries_the_log_message_of_the_same_gpu() {
    let v = json(&[JOINT, JOINT_LOG]);
    assert_eq!(v["inputs"].as_array().unwrap().len(), 2);
    let d = &v["devices"][0];
    assert_eq!(d["source"], "snapshot");
    assert_eq!(d["oom"]["source"], "snapshot");
    assert_eq!(d["oom"]["message"]["requested_bytes"], 1536 * MIB);
    // Total from the message + the driver's free bytes from the snapshot: exact non-PyTorch memory, which decided
    // the OOM (reserved + the request fit the 40 GiB GPU, the driver's free did not).
    assert_eq!(common::rules_fired(&v), ["nccl-overhead:error"]);
    let msg = v["findings"][0]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("6.00 GiB was held outside") && msg.contains("NCCL active"), "{msg}");
    assert!(msg.contains("snapshot's OOM"), "{msg}");
}

#[test]
fn without_the_log_no_number_it_cannot_know() {
    let v = json(&[JOINT]);
    assert_eq!(common::rules_fired(&v), Vec::<String>::new());
    assert!(v["ooms"].as_array().unwrap().is_empty());
    assert!(v["devices"][0].get("observed").is_none());
    let t = text(&[JOINT]);
    assert!(!t.contains("outside PyTorch"), "{t}");
    let o = oomdoc(&["facts", JOINT]);
    assert!(!stdout(&o).contains("nonpytorch_bytes"), "{}", stdout(&o));
}

// ---- vLLM ----

fn vllm_samples() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(common::root().join("fixtures/real/logs/vllm-kv-cache-log-samples.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["kind"].as_str().unwrap().to_string(), v["text"].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn every_real_vllm_sample_yields_what_it_shows() {
    use oomdoc::ingest::vllm_log::parse;
    let samples = vllm_samples();
    assert_eq!(samples.len(), 13);
    for (kind, text) in &samples {
        let log = parse(text, kind);
        let c = &log.capacity;
        let usage: Vec<f64> = log.stats.iter().map(|s| (s.gpu_usage * 1000.0).round() / 10.0).collect();
        match kind.as_str() {
            "startup_kv_capacity_v1_early" => {
                assert_eq!(c.gpu_blocks, Some(1381));
                assert_eq!(c.max_concurrency, Some((2048, 10.79)));
                assert_eq!(c.weights_bytes, Some(67_722_900_000));
            }
            "startup_kv_capacity" => assert_eq!(c.max_concurrency, Some((8192, 4.61))),
            "startup_kv_too_small" => assert_eq!(c.too_small, Some((131_072, 81_536))),
            "startup_weights" => assert_eq!(c.weights_bytes, Some(13_947_600_000)),
            "startup_kv_capacity_v1" => {
                assert_eq!(c.tokens, Some(178_880));
                assert_eq!(c.kv_bytes, Some((8.11 * GIB as f64).round() as u64));
            }
            "periodic_stats_v0" => {
                assert_eq!(usage, [99.1]);
                assert_eq!((log.stats[0].running, log.stats[0].waiting), (Some(36), Some(78)));
            }
            "periodic_stats_v0_and_preemption_swap" => {
                assert_eq!(usage, [99.2, 76.6]);
                assert_eq!(log.stats.iter().map(|s| s.swapped).collect::<Vec<_>>(), [Some(100), Some(137)]);
                assert_eq!(log.preemptions.len(), 1);
                assert_eq!(log.preemptions[0].mode, "SWAP");
            }
            "preemption_recompute" => {
                assert_eq!(log.preemptions[0].mode, "RECOMPUTE");
                assert_eq!(log.preemptions[0].cumulative, Some(101));
            }
            "periodic_stats_v1" => assert_eq!(usage, [0.1, 0.1]),
            "periodic_stats_v1_near_full_kv" => {
                assert_eq!(usage, [95.9, 95.5, 87.7, 95.9, 98.4]);
                let waiting: Vec<u64> = log.stats.iter().filter_map(|s| s.waiting).collect();
                assert_eq!(waiting, [43, 42, 33, 23, 23]);
            }
            "periodic_stats_v1_growing_kv_docker_timestamps" => {
                assert_eq!(usage, [62.8, 68.8, 74.5, 79.9]);
                // docker's RFC 3339 prefix carries the zone: absolute stamps.
                assert!(log.stats.iter().all(|s| matches!(s.stamp, Some(oomdoc::timeline::Stamp::Unix(_)))));
            }
            "periodic_stats_v1_multi_engine_with_mfu" => {
                assert_eq!(log.stats.iter().map(|s| s.engine).collect::<Vec<_>>(), [0, 1]);
            }
            "periodic_stats_v1_interleaved_access_log" => assert_eq!(usage, [76.5]),
            other => panic!("a new sample kind {other}: pin what it yields"),
        }
    }
}

#[test]
fn a_vllm_cache_that_ran_full_warns_and_one_that_did_not_stays_silent() {
    let full = json(&["fixtures/real/logs/vllm-v1-near-full-kv.log"]);
    assert_eq!(common::rules_fired(&full), ["unbounded-kv-growth:warning"]);
    let f = &full["findings"][0];
    assert!(f["device"].is_null(), "a job-level finding: {f}");
    assert!(f["message"].as_str().unwrap().contains("up to 43 requests waited"), "{f}");
    assert_eq!(full["serving"]["usage_lines"], 5);
    let growing = json(&["fixtures/real/logs/vllm-v1-growing-kv-docker.log"]);
    assert_eq!(common::rules_fired(&growing), Vec::<String>::new());
    assert_eq!(growing["serving"]["usage_max"], 0.799);
    let small = json(&["fixtures/real/logs/vllm-v0-kv-too-small.log"]);
    assert_eq!(common::rules_fired(&small), ["unbounded-kv-growth:error"]);
    assert!(text(&["fixtures/real/logs/vllm-v0-kv-too-small.log"]).contains("max seq len 131072 is larger"));
}

// ---- nvidia-smi beside the snapshot: one clock ----

const JOINT_SMI: &str = "fixtures/generated/joint/nccl-with-smi.nvidia-smi.csv";

#[test]
fn snapshot_and_nvidia_smi_of_the_same_run_state_the_memory_outside_pytorch() {
    // The simulator held 6 GiB outside PyTorch (NCCL buffers) on a 40 GiB GPU and wrote nvidia-smi's log in
    // UTC+02:00 wall-clock time; the snapshot's trace is in Unix µs.
    let v = json(&[JOINT, JOINT_SMI]);
    assert_eq!(v["clock"]["method"], "inferred");
    assert_eq!(v["clock"]["zone_offset_s"], 7200);
    let obs = &v["devices"][0]["observed"];
    assert_eq!(obs["samples"], 27);
    assert_eq!(obs["aligned_samples"], 27);
    assert_eq!(obs["total_bytes"], 40 * GIB);
    // The sample nearest the OOM: used − reserved, to nvidia-smi's whole MiB.
    let at = &obs["at_moment"];
    assert_eq!(at["non_pytorch_bytes"], 6 * GIB);
    assert!(obs["non_pytorch_series"].as_array().unwrap().len() >= 20);
    // The GPU's size now comes from nvidia-smi: with the driver's free bytes at the OOM, nccl-overhead fires.
    assert_eq!(common::rules_fired(&v), ["nccl-overhead:error"]);
    let t = text(&[JOINT, JOINT_SMI]);
    assert!(t.contains("Clock: wall-clock times (nvidia-smi, logs) read as UTC+02:00"), "{t}");
    assert!(
        t.contains("at the OOM: nvidia-smi used 39.2 GiB, PyTorch reserved 33.2 GiB → 6.00 GiB outside PyTorch"),
        "{t}"
    );
    // Told the zone, it is used as given.
    let tz = json(&[JOINT, JOINT_SMI, "--tz", "+02:00"]);
    assert_eq!(tz["clock"]["method"], "tz");
    assert_eq!(tz["devices"][0]["observed"]["at_moment"]["non_pytorch_bytes"], 6 * GIB);
}

#[test]
fn nvidia_smi_alone_is_a_report_of_its_own() {
    let v = json(&[JOINT_SMI]);
    let d = &v["devices"][0];
    assert_eq!(d["source"], "text");
    assert_eq!(d["observed"]["samples"], 27);
    assert_eq!(d["observed"]["max_used_bytes"], 40_192 * MIB);
    // Without PyTorch's reserved bytes, nothing is said about memory outside it.
    assert!(d["observed"]["at_moment"].is_null());
    assert_eq!(common::rules_fired(&v), Vec::<String>::new());
}

/// The OOM message alone: a request larger than what the process may use is a large intermediate that cannot fit
/// (error); half of it or more fits only if nothing else is live (warning); an ordinary request on a full GPU is
/// neither.
#[test]
fn a_request_most_of_the_gpu_is_named_from_the_message_alone() {
    let msg = |req: &str, total: &str, free: &str, allowed: &str, alloc: &str| {
        format!(
            "Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n\
             torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of \
             {total} of which {free} is free. Including non-PyTorch memory, this process has 3.10 GiB memory in use.\
             {allowed} Of the allocated memory {alloc} is allocated by PyTorch, and 20.00 MiB is reserved by PyTorch \
             but unallocated.\n"
        )
    };
    let run = |text: String| -> serde_json::Value {
        let f = common::TempFile::with("oom.log", text.as_bytes());
        let o = common::oomdoc(&["analyze", "--format", "json", f.path()]);
        assert_eq!(o.status.code(), Some(0), "{}", common::stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // 6 GiB asked of a 7.79 GiB GPU: 77%. Free is the total less the 3.10 GiB this process holds: nothing outside
    // PyTorch to speak of.
    let v = run(msg("6.00 GiB", "7.79 GiB", "4.69 GiB", "", "3.00 GiB"));
    assert_eq!(common::rules_fired(&v), ["large-intermediate:warning"]);
    let m = v["findings"][0]["message"].as_str().unwrap();
    assert!(m.contains("77% of the 7.79 GiB") && m.contains("fits only if almost nothing else is live"), "{m}");
    // 9 GiB asked of the same GPU: it cannot fit at all.
    let v = run(msg("9.00 GiB", "7.79 GiB", "4.69 GiB", "", "3.00 GiB"));
    assert_eq!(common::rules_fired(&v), ["large-intermediate:error"]);
    assert!(v["findings"][0]["message"].as_str().unwrap().contains("cannot fit even with everything else freed"));
    // A cap: 5 GiB asked, 4 GiB allowed on an 80 GiB GPU: 125% of what the process may use.
    let v = run(msg("5.00 GiB", "79.18 GiB", "76.08 GiB", " 4.00 GiB allowed;", "3.00 GiB"));
    assert_eq!(common::rules_fired(&v), ["large-intermediate:error"]);
    assert!(v["findings"][0]["message"].as_str().unwrap().contains("125% of the 4.00 GiB"), "{}", v["findings"][0]);
    // Near misses: 2 GiB on a full 80 GiB GPU (3%), and 3.5 GiB of 7.79 GiB (45%).
    for (req, total, free) in [("2.00 GiB", "79.18 GiB", "76.08 GiB"), ("3.50 GiB", "7.79 GiB", "4.69 GiB")] {
        let v = run(msg(req, total, free, "", "3.00 GiB"));
        assert!(!common::rules_fired(&v).iter().any(|r| r.starts_with("large-intermediate")), "{req} of {total}");
    }
}
