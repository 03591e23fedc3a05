//! A verdict from a log alone (issue 33): the OOM message's arithmetic decides between fragmentation, a cap,
//! memory outside PyTorch and plain shortage, and the traceback's raising line, read with its source, names what it
//! was likely doing. On the real OOM texts of this project's GPU captures (fixtures/real-gpu/*/stderr.log, torch
//! 2.11 on an H100 and an H200) and the rank-3 NCCL log.

use oomdoc::ingest::oom_log::parse;
use serde_json::Value;

use crate::common;

fn verdict_of(log: &str) -> Value {
    let v = common::analyze_json(&[log]);
    assert_eq!(v["devices"].as_array().unwrap().len(), 1, "{log}");
    v["devices"][0]["verdict"].clone()
}

#[test]
fn each_real_oom_text_gets_its_deciding_arithmetic_and_its_raising_line() {
    // (log, what decided it, the raising line, what it was likely doing, the primary rule)
    let cases: [(&str, &str, &str, &str, Option<&str>); 7] = [
        (
            "real-gpu/fragmentation",
            "fragmentation",
            "fragmentation.py:19 in body",
            "allocates by its size",
            Some("fragmentation"),
        ),
        ("real-gpu/kv-growth", "cap", "kv_growth.py:19 in body", "generation", None),
        ("real-gpu/leaked-references", "cap", "leaked_references.py:16 in body", "optimizer's step", None),
        (
            "real-gpu/attention-scores",
            "cap",
            "attention_scores.py:9 in body",
            "attention matrix",
            Some("large-intermediate"),
        ),
        (
            "real-gpu/nccl-nonpytorch",
            "outside_pytorch",
            "nccl_nonpytorch.py:22 in body",
            "allocates by its size",
            Some("nccl-overhead"),
        ),
        // 754 MiB outside PyTorch is the CUDA context alone, beside 139 GiB of PyTorch's tensors: plain shortage, and
        // the context the last straw (the snapshot of the same run finds the leak that filled it).
        ("real-gpu/one-line", "shortage", "plain_leak.py:28 in <module>", "forward pass", None),
        ("real-gpu/oomdoc-run", "cap", "plain_leak.py:30 in <module>", "optimizer's step", None),
    ];
    for (dir, decided, at, what, primary) in cases {
        let log = format!("fixtures/{dir}/stderr.log");
        let v = verdict_of(&log);
        assert_eq!(v["decided_by"], decided, "{log}: {v}");
        assert_eq!(v["likely"]["at"], at, "{log}: {v}");
        assert!(v["likely"]["what"].as_str().unwrap().contains(what), "{log}: {v}");
        assert!(v["likely"]["code"].is_string(), "{log}: the line's source is quoted: {v}");
        let summary = v["summary"].as_str().unwrap();
        assert!(summary.contains(&format!("It failed at {at} (`")), "{log}: {summary}");
        assert_eq!(v["primary_rule"].as_str(), primary, "{log}: {v}");
        match primary {
            Some(_) => assert!(summary.contains("Primary cause:"), "{log}: {summary}"),
            // No rule named it: the arithmetic's own sentence does, and the remedies follow the raising line.
            None if decided == "cap" => {
                assert!(summary.contains("The process's cap decided it: PyTorch had reserved"), "{log}: {summary}");
                let remedies: Vec<&str> =
                    v["remedies"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
                assert!(remedies[0].contains("raise or remove it"), "{log}: {remedies:?}");
                assert_eq!(remedies[1], v["likely"]["remedy"], "{log}");
            }
            None => {
                assert!(summary.contains("Plain shortage: PyTorch's own tensors held 139 GiB"), "{log}: {summary}");
                assert_eq!(v["remedies"][0], v["likely"]["remedy"], "{log}");
                let outside = &v["causes"][0];
                assert_eq!(outside["rule"], "nccl-overhead", "{log}");
                assert_eq!(outside["severity"], "warning", "{log}: the last straw");
            }
        }
    }
}

#[test]
fn a_plain_shortage_is_said_as_one() {
    // torch 2.x's message, no cap, nothing outside PyTorch to speak of, no fragments: PyTorch's tensors filled it.
    let log = common::TempFile::with(
        "short.log",
        b"Traceback (most recent call last):\n  File \"/home/u/train.py\", line 88, in <module>\n    logits = model(x).float()\n           ^^^^^^^^^^^^^^^^\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.83 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.94 GiB memory in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 420.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n",
    );
    let v = verdict_of(log.path());
    assert_eq!(v["decided_by"], "shortage", "{v}");
    assert!(v["summary"].as_str().unwrap().contains("Plain shortage: PyTorch's own tensors held 76.5 GiB"), "{v}");
    assert!(v["likely"]["what"].as_str().unwrap().contains("upcast"), "{v}");
    assert_eq!(v["likely"]["code"], "logits = model(x).float()");
    assert!(v["remedies"][0].as_str().unwrap().contains("chunks"), "{v}");
}

#[test]
fn a_message_ends_at_its_documentation_link() {
    // The capture script's own next line ("capture: fragmentation: oom") is not part of PyTorch's hint.
    let text = std::fs::read_to_string(common::root().join("fixtures/real-gpu/fragmentation/stderr.log")).unwrap();
    let p = parse(&text, "stderr.log");
    let hint = p.ooms[0].hint.as_deref().unwrap();
    assert!(hint.ends_with("cuda-alloc-conf)"), "{hint}");
    assert_eq!(p.ooms[0].user_code.as_deref(), Some("x = torch.empty(400 * MiB, dtype=torch.uint8, device=\"cuda\")"));
}

/// The findings of a log alone, as `rule:severity`.
fn log_rules(log: &str) -> Vec<String> {
    common::rules_fired(&common::analyze_json(&[log]))
}

#[test]
fn vllm_start_up_failures_each_get_their_cause() {
    let no_cache = log_rules("fixtures/logs/vllm-no-cache-blocks.log");
    assert!(no_cache.contains(&"serving-memory:error".to_string()), "{no_cache:?}");
    let graphs = common::analyze_json(&["fixtures/logs/vllm-cudagraph-capture-oom.log"]);
    let found = common::rules_fired(&graphs);
    assert!(found.contains(&"serving-memory:error".to_string()), "{found:?}");
    let fix = graphs["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "serving-memory").unwrap()["fix"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(fix.contains("cudagraph_capture_sizes") && fix.contains("--enforce-eager"), "{fix}");
    assert_eq!(graphs["serving"]["capacity"]["cuda_graph_bytes"], 654_982_513u64);
    // The start-up notice names the same variable, and is no OOM.
    let healthy = log_rules("fixtures/logs/vllm-healthy-startup.log");
    assert!(!healthy.iter().any(|r| r.starts_with("serving-memory")), "{healthy:?}");
}

#[test]
fn megatron_reports_beside_its_estimate() {
    let above = log_rules("fixtures/logs/megatron-above-estimate.log");
    assert!(above.contains(&"megatron-footprint:warning".to_string()), "{above:?}");
    let within = log_rules("fixtures/logs/megatron-within-estimate.log");
    assert!(!within.iter().any(|r| r.starts_with("megatron-footprint")), "{within:?}");
}

/// The real trainer run dumped with `_snapshot()` in its `except` handler (no history): the dump holds the state the
/// log's message describes (7.87 GiB allocated, 8.30 MiB cached free, as torch prints them), so its moment is that OOM.
/// Its sizes name nothing, so the message's arithmetic and raising line speak, and the advice is to record the history
/// (what stacks alone would not give), not to record stacks.
#[test]
fn a_state_only_dump_written_at_the_oom_its_log_reports_reads_as_that_oom() {
    let dir = "fixtures/real-gpu/frameworks/trainer-state-only";
    let v = common::analyze_json(&[dir]);
    let d = &v["devices"][0];
    assert_eq!(d["moment"], "oom", "{d}");
    assert_eq!(d["oom"]["requested_bytes"], 176u64 << 20);
    let verdict = &d["verdict"];
    assert_eq!(verdict["decided_by"], "cap", "{verdict}");
    assert_eq!(verdict["likely"]["at"], "trainer_state_only.py:26 in body", "{verdict}");
    let summary = verdict["summary"].as_str().unwrap();
    assert!(summary.starts_with("GPU 0 ran out of memory asking for 176 MiB"), "{summary}");
    assert!(summary.contains("the file holds the allocator's state only"), "{summary}");
    let remedies: Vec<&str> = verdict["remedies"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert!(remedies.iter().any(|r| r.contains("micro-batch")), "the forward's activations: {remedies:?}");
    assert!(remedies.iter().any(|r| r.contains("set_per_process_memory_fraction")), "the cap: {remedies:?}");
    let advice = verdict["capture_advice"].as_str().unwrap();
    assert!(advice.contains("_record_memory_history(max_entries="), "{advice}");
    assert!(!advice.contains("stacks="), "stacks are not what the dump lacks: {advice}");
    let text = String::from_utf8(common::oomdoc(&["analyze", dir]).stdout).unwrap();
    assert!(text.contains("    next time: record the allocation history"), "one line under the verdict: {text}");

    // Beside another run's log the figures do not match: the dump stays the state it was, not that OOM.
    let other = common::analyze_json(&[
        "fixtures/real-gpu/frameworks/trainer-state-only/snapshot.pickle.xz",
        "fixtures/real-gpu/one-line/stderr.log",
    ]);
    let d = &other["devices"][0];
    assert_eq!(d["moment"], "end", "{d}");
    assert!(d["oom"].is_null(), "{d}");
}
