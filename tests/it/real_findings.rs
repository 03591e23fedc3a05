//! What the checklist says about the real snapshots. Every finding is listed with the evidence that justifies
//! it; any other finding (or a missing one) fails, so no rule fires on a file without evidence for it.
//!
//! Not listed any more: segment-churn on cs336-kk-fullstep-57gb. Its 430 segment_free events are one flush (the
//! allocator freeing its cache once to retry a cudaMalloc inside one training step), then a refill: once, not
//! churn. segment-churn now counts the cycles of emptying and refilling (sqattn: 27, selectn: 39).

use crate::common;

/// (file, rule, severity, why it is right)
const EXPECTED: &[(&str, &str, &str, &str)] = &[
    (
        "attention-stateonly-frag.pickle",
        "fragmentation",
        "warning",
        "7.16 GiB of 15.1 GiB reserved is cached free, in pieces: the largest free block is 516 MiB",
    ),
    (
        "cs336-cliffkai-xl-bwd-24k.pickle",
        "optimizer-state",
        "info",
        "the XL model's AdamW step (torch/optim/adamw.py _multi_tensor_adamw) holds 22.9 GiB at the peak, 60% of \
         allocated: its two moments (2 × the 7.6 GiB of parameters) and the foreach step's temporaries",
    ),
    (
        "cs336-kk-fullstep-57gb.pickle",
        "optimizer-state",
        "info",
        "AdamW state (cs336_basics/optimizers.py step) holds 25.6 GiB, half of allocated memory",
    ),
    (
        "cs336-kk-state-71gb.pickle",
        "optimizer-state",
        "info",
        "a state-only dump of the same AdamW training: its sizes repeat the parameters' four times (parameter, \
         gradient, two moments), so 25.6 GiB is AdamW state, inferred from sizes (issue 37)",
    ),
    (
        "cs336-sidsoc-train-62gb.pickle",
        "optimizer-state",
        "info",
        "AdamW state (cs336_basics/optimizer.py:74/75 step) holds 25.9 GiB, half of allocated memory at the peak",
    ),
    (
        "selectn-10streams-t21.pickle",
        "segment-churn",
        "warning",
        "579 segment_free / 584 segment_alloc in 10k events: the cache is emptied and refilled (PROVENANCE notes it)",
    ),
    (
        "sqattn-segment-churn.pickle",
        "segment-churn",
        "warning",
        "420 segment_alloc + 420 segment_free over 70 s: empty_cache churn (PROVENANCE notes it)",
    ),
];

#[test]
fn findings_on_real_snapshots_are_exactly_the_justified_ones() {
    let mut got = Vec::new();
    for file in common::fixtures("fixtures/real", ".pickle") {
        let o = common::oomdoc(&["analyze", &file, "--format", "json"]);
        assert!(o.status.success(), "{file}: {}", common::stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let name = file.rsplit('/').next().unwrap().to_string();
        for f in v["findings"].as_array().unwrap() {
            got.push((
                name.clone(),
                f["rule"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
            ));
        }
    }
    got.sort();
    let mut want: Vec<(String, String, String)> =
        EXPECTED.iter().map(|(f, r, s, _)| (f.to_string(), r.to_string(), s.to_string())).collect();
    want.sort();
    assert_eq!(got, want);
}
