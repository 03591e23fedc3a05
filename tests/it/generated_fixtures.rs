//! Generated fixtures (fixtures/gen_snapshots.py): an allocator simulator writes each run in the key shape of a
//! torch release, and records its own totals in fixtures/generated/expected.json. oomdoc must agree with the
//! simulator on every device, at the end and at the OOM; and the checklist must say exactly what each rule
//! scenario was built to show.

use crate::common;

use serde_json::Value;

fn expected() -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(common::root().join("fixtures/generated/expected.json")).unwrap();
    match serde_json::from_str(&text).unwrap() {
        Value::Object(m) => m,
        _ => panic!("expected.json is not an object"),
    }
}

fn analyze(file: &str, extra: &[&str]) -> Value {
    let mut args = vec!["analyze", file, "--format", "json"];
    args.extend_from_slice(extra);
    let o = common::oomdoc(&args);
    assert!(o.status.success(), "{file}: {}", common::stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// (major, minor) of the first "X.Y" in a version string.
fn version(s: &str) -> (u32, u32) {
    let start = s.find(|c: char| c.is_ascii_digit()).unwrap_or_else(|| panic!("no version in {s:?}"));
    let mut it = s[start..].split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

fn gpu_args(rec: &Value) -> Vec<String> {
    match rec["gpu_memory"].as_str() {
        Some(g) => vec!["--gpu-memory".into(), g.into()],
        None => vec![],
    }
}

#[test]
fn totals_match_the_simulator_on_every_generated_fixture() {
    let all = expected();
    assert!(all.len() >= 30, "expected.json lists {} fixtures", all.len());
    for (name, rec) in &all {
        let file = format!("fixtures/generated/{name}");
        let gpu = gpu_args(rec);
        let gpu: Vec<&str> = gpu.iter().map(String::as_str).collect();
        let mut at_end = vec!["--at", "end"];
        at_end.extend_from_slice(&gpu);
        let end = analyze(&file, &at_end);
        let moment = analyze(&file, &gpu);
        let want_version = rec["torch_shape"].as_str().unwrap();
        let got_version = end["inputs"][0]["format_version"].as_str().unwrap();
        // The backend the dialect's keys or frames name (CUDA's format when none does).
        let dialect = rec["dialect"].as_str().unwrap_or("cuda");
        assert_eq!(end["inputs"][0]["backend"], dialect, "{name}");
        if dialect == "npu" {
            // torch_npu's key set is torch 2.1's whatever its release: no torch version is claimed.
            assert_eq!(got_version, "torch_npu", "{name}");
        } else {
            // Detection names the oldest release whose keys the file has (a 2.4 file has no key 2.3 lacks).
            let (got_v, want_v) = (version(got_version), version(want_version));
            assert!(
                got_v <= want_v && got_v.0 == want_v.0,
                "{name}: detected {got_version}, written as {want_version}"
            );
            if name.starts_with("shapes/") && want_v <= (2, 1) || want_v == (2, 8) || name.starts_with("shapes/v2.15") {
                assert_eq!(got_v, want_v, "{name}: detected {got_version}, written as {want_version}");
            }
        }
        for want in rec["devices"].as_array().unwrap() {
            let dev = want["device"].as_u64().unwrap();
            // A device the process never used (rank 3's snapshot lists devices 0–2 empty) has no report.
            if want["trace_entries"] == 0 && want["end"]["segments"] == 0 {
                continue;
            }
            let find = |v: &Value| -> Value {
                v["devices"].as_array().unwrap().iter().find(|d| d["device"] == dev).cloned().unwrap_or_else(|| {
                    panic!("{name}: device {dev} missing from the report");
                })
            };
            let got = find(&end);
            for key in ["allocated_bytes", "reserved_bytes", "active_bytes", "largest_free_block_bytes"] {
                assert_eq!(got[key], want["end"][key], "{name} device {dev} at end: {key}");
            }
            assert_eq!(got["segments"], want["end"]["segments"], "{name} device {dev}: segments");
            assert_eq!(got["blocks"], want["end"]["blocks"], "{name} device {dev}: blocks");
            let entries = want["trace_entries"].as_u64().unwrap();
            assert_eq!(got["trace"]["entries"].as_u64().unwrap_or(0), entries, "{name} device {dev}: trace entries");
            let got = find(&moment);
            match &want["oom"] {
                Value::Null => {
                    assert_eq!(got["oom"], Value::Null, "{name} device {dev}: no OOM was written");
                    if let Some(peak) = want["peak_allocated_bytes"].as_u64() {
                        assert_eq!(got["peak"]["allocated_bytes"].as_u64(), Some(peak), "{name} device {dev}: peak");
                    }
                }
                oom => {
                    assert_eq!(got["moment"], "oom", "{name} device {dev}");
                    for key in ["allocated_bytes", "reserved_bytes", "active_bytes", "largest_free_block_bytes"] {
                        assert_eq!(got[key], oom[key], "{name} device {dev} at the OOM: {key}");
                    }
                    assert_eq!(got["oom"]["requested_bytes"], oom["requested_bytes"], "{name}: request");
                    assert_eq!(got["oom"]["device_free_bytes"], oom["device_free_bytes"], "{name}: device_free");
                    assert_eq!(got["event_index"], oom["event_index"], "{name}: OOM event");
                }
            }
        }
    }
}

/// (fixture, the findings it must raise as rule:severity, why). Every rule has fixtures that fire and near misses
/// that must stay silent; any finding not listed fails the test.
const RULE_CASES: &[(&str, &[&str], &str)] = &[
    (
        "fragmentation-fire.pickle",
        &["fragmentation:error"],
        "300 MiB request, ~1.1 GiB free in the large pool in 36 MiB holes and a 248 MiB tail",
    ),
    ("fragmentation-quiet-real-shortage.pickle", &[], "1.6 GiB request > all 1.1 GiB cached free: not fragmentation"),
    (
        "leaked-references-fire-oom.pickle",
        &["leaked-references:error", "fragmentation:warning"],
        "one output per step kept until the OOM; the kept outputs also pin the cache in 30 MiB pieces so the \
         24 MiB gradient request fails with enough free bytes in the pool — the last straw, a warning beside the \
         leak that explains 14× more memory",
    ),
    ("leaked-references-fire-no-oom.pickle", &["leaked-references:warning"], "12 updates, one more live each"),
    (
        "growing-buffer-fire.pickle",
        &["growing-buffer:error", "large-intermediate:warning"],
        "logits gathered with torch.cat, one batch longer each step; the request is also a quarter of the GPU, \
         which the huge-intermediate rule says, yielding the lead to the growth",
    ),
    (
        "growing-buffer-quiet-freed.pickle",
        &["fragmentation:warning"],
        "scores one chunk longer each step but freed before the next: no buffer kept (the freed sizes leave the \
         cache in pieces, which the fragmentation rule notes)",
    ),
    ("leaked-references-quiet-window.pickle", &[], "a bounded window of two kept outputs"),
    ("missing-no-sync-fire.pickle", &["missing-no-sync:warning"], "all-reduce in each of 4 micro-batches"),
    ("missing-no-sync-fire-k2.pickle", &["missing-no-sync:warning"], "all-reduce in each of 2 micro-batches"),
    ("missing-no-sync-quiet.pickle", &[], "all-reduce only in the micro-batch before the step (no_sync)"),
    (
        "unbounded-kv-growth-fire-oom.pickle",
        &["unbounded-kv-growth:error", "segment-churn:warning"],
        "DynamicCache grows by a token each step up to the OOM; the allocator's flush-and-retry on each failed \
         cudaMalloc frees segments over and over",
    ),
    (
        "unbounded-kv-growth-fire-no-oom.pickle",
        &["unbounded-kv-growth:warning", "segment-churn:warning", "fragmentation:warning"],
        "past_key_values grows for 250 tokens; every new size leaves the old blocks cached in pieces, and full \
         caches are flushed to retry cudaMalloc",
    ),
    ("unbounded-kv-growth-quiet-static.pickle", &[], "a static cache allocated once at start-up"),
    (
        "unbounded-kv-growth-quiet-window.pickle",
        &["segment-churn:warning", "fragmentation:warning"],
        "the cache levels off at the window (KV rule silent); growing to it left the cache fragmented and flushed",
    ),
    (
        "nccl-overhead-fire.pickle",
        &["nccl-overhead:error"],
        "6 GiB outside PyTorch on a 40 GiB GPU, NCCL seen: reserved + the request fit the GPU, the driver's free did not",
    ),
    ("nccl-overhead-quiet.pickle", &[], "700 MiB outside PyTorch: the CUDA context"),
    ("compile-warmup-fire.pickle", &["compile-warmup:warning", "optimizer-state:info"], "3 GiB inductor workspace"),
    ("compile-warmup-fire-oom.pickle", &["compile-warmup:error"], "OOM inside compile_fx with compile_context 0/0"),
    ("compile-warmup-quiet.pickle", &["optimizer-state:info"], "compiled with a 96 MiB workspace"),
    ("large-intermediate-fire.pickle", &["large-intermediate:warning"], "4 GiB softmax probabilities"),
    ("large-intermediate-quiet.pickle", &[], "largest is a 5 GiB embedding parameter"),
    ("segment-churn-fire.pickle", &["segment-churn:warning"], "empty_cache() after each of 30 steps"),
    ("segment-churn-quiet.pickle", &[], "empty_cache() once"),
    ("optimizer-state-fire.pickle", &["optimizer-state:info"], "AdamW states 10 GiB of 13 GiB"),
    ("healthy-loop.pickle", &[], "a steady training loop"),
    ("healthy-loop-torch2.1.pickle", &[], "a steady training loop, torch 2.1 keys"),
];

#[test]
fn each_rule_fires_on_its_scenarios_and_stays_silent_on_the_near_misses() {
    let all = expected();
    let mut listed = 0;
    for (file, want, why) in RULE_CASES {
        let rec = &all[&format!("rules/{file}")];
        let gpu = gpu_args(rec);
        let gpu: Vec<&str> = gpu.iter().map(String::as_str).collect();
        let v = analyze(&format!("fixtures/generated/rules/{file}"), &gpu);
        let mut got: Vec<String> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| format!("{}:{}", f["rule"].as_str().unwrap(), f["severity"].as_str().unwrap()))
            .collect();
        got.sort();
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(got, want, "{file} ({why})");
        listed += 1;
    }
    let scenarios = all.keys().filter(|k| k.starts_with("rules/")).count();
    assert_eq!(listed, scenarios, "every rule scenario in expected.json has a line in RULE_CASES");
}

/// Rules whose facts come from inputs beside the snapshot: their firing and silent cases are tested where those
/// inputs are (rule id, test file, [firing test, silent test]).
const NEEDS_MORE_THAN_A_SNAPSHOT: &[(&str, &str, &[&str])] = &[
    (
        "budget-overrun",
        "tests/it/budget.rs",
        &[
            "budget_overrun_flags_activations_when_checkpointing_was_assumed",
            "predicted_vs_measured_on_a_real_snapshot",
        ],
    ),
    ("device-imbalance", "tests/it/verdict.rs", &["class_1_one_gpu_full_of_activations_beside_two_that_are_not"]),
    ("serving-memory", "tests/it/log_verdict.rs", &["vllm_start_up_failures_each_get_their_cause"]),
    ("megatron-footprint", "tests/it/log_verdict.rs", &["megatron_reports_beside_its_estimate"]),
    (
        "allocator-limit",
        "tests/it/oom_messages.rs",
        &["each_allocator_limit_message_gives_its_own_cause_and_fix", "a_plain_oom_message_names_no_allocator_limit"],
    ),
    (
        "kernel-bound",
        "tests/it/profile_findings.rs",
        &["ncu_one_memory_bound_one_compute_bound_kernel", "kernel_thresholds_live_in_the_rule_file"],
    ),
];

#[test]
fn every_builtin_rule_has_a_firing_and_a_silent_scenario() {
    let o = common::oomdoc(&["rules"]);
    assert!(o.status.success());
    let ids: Vec<String> = common::stdout(&o)
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    assert!(ids.len() >= 9, "{ids:?}");
    let lists = |w: &[&str], id: &str| w.iter().any(|f| f.split(':').next() == Some(id));
    for id in &ids {
        if let Some((_, file, tests)) = NEEDS_MORE_THAN_A_SNAPSHOT.iter().find(|(r, _, _)| r == id) {
            let src = std::fs::read_to_string(common::root().join(file)).unwrap();
            for t in *tests {
                assert!(src.contains(&format!("fn {t}()")), "rule {id}: {file} lacks test {t}");
            }
            continue;
        }
        let fires = RULE_CASES.iter().any(|(f, w, _)| f.starts_with(id.as_str()) && lists(w, id));
        let silent = RULE_CASES
            .iter()
            .any(|(f, w, _)| (f.starts_with(id.as_str()) || f.starts_with("healthy")) && !lists(w, id));
        assert!(fires, "rule {id}: no scenario named after it fires it");
        assert!(silent, "rule {id}: no near miss named after it (or healthy loop) keeps it silent");
    }
}
