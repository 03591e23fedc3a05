//! The command line end to end: commands, options, exit codes, the JSON contract.

use crate::common;

use common::{oomdoc, stderr, stdout, TempFile};

const REAL: &str = "fixtures/real/cs336-kk-fullstep-57gb.pickle";

#[test]
fn json_contract_fields() {
    let o = oomdoc(&["analyze", REAL, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["inputs"][0]["path"], REAL);
    assert_eq!(v["inputs"][0]["kind"], "pytorch_snapshot");
    assert!(v["inputs"][0]["format_version"].as_str().unwrap().contains("2.5"));
    let d = &v["devices"][0];
    for key in ["device", "moment", "allocated_bytes", "reserved_bytes", "active_bytes", "largest_free_block_bytes"] {
        assert!(!d[key].is_null(), "devices[0].{key}");
    }
    assert_eq!(d["moment"], "peak");
    assert!(d["oom"].is_null());
    assert!(d["top_allocations"][0]["bytes"].as_u64().unwrap() > 0);
    assert!(d["top_allocations"][0]["stack"].as_array().unwrap().len() > 1);
    let f = &v["findings"][0];
    for key in ["rule", "severity", "device", "title", "message", "evidence", "fix"] {
        assert!(!f[key].is_null(), "findings[0].{key}");
    }
}

#[test]
fn fail_on_sets_exit_code_one() {
    let churn = "fixtures/real/sqattn-segment-churn.pickle";
    let o = oomdoc(&["analyze", churn, "--fail-on", "warning"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = oomdoc(&["analyze", churn, "--fail-on", "error"]);
    assert_eq!(o.status.code(), Some(0));
    // A clean file never fails.
    let o = oomdoc(&["analyze", "fixtures/real/mlsys-linear-t24.pickle", "--fail-on", "info"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let plain = stdout(&oomdoc(&["analyze", REAL]));
    assert!(!plain.contains('\x1b'), "piped output must be plain");
    let coloured = stdout(&oomdoc(&["analyze", REAL, "--color", "always"]));
    assert!(coloured.contains("\x1b["));
}

#[test]
fn output_file() {
    let out = TempFile::with("report.md", b"");
    let o = oomdoc(&["analyze", REAL, "-f", "markdown", "-o", out.path()]);
    assert!(o.status.success() && o.stdout.is_empty());
    let text = std::fs::read_to_string(&out.0).unwrap();
    assert!(text.starts_with("## GPU memory report"), "{text}");
}

#[test]
fn at_peak_end_event_and_time() {
    for at in ["peak", "end", "event:100", "100ms", "0.2s"] {
        let o = oomdoc(&["analyze", REAL, "--at", at, "-f", "json"]);
        assert!(o.status.success(), "--at {at}: {}", stderr(&o));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&oomdoc(&["analyze", REAL, "--at", "event:100", "-f", "json"]).stdout).unwrap();
    assert_eq!(v["devices"][0]["event_index"], 100);
    assert_eq!(v["devices"][0]["moment"], "time");
}

#[test]
fn device_filter_on_a_two_gpu_file() {
    let f = "fixtures/real/text2sql-2gpu-stateonly.pickle";
    let v: serde_json::Value = serde_json::from_slice(&oomdoc(&["analyze", f, "-f", "json"]).stdout).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 2);
    let v: serde_json::Value =
        serde_json::from_slice(&oomdoc(&["analyze", f, "-f", "json", "--device", "1"]).stdout).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
    assert_eq!(v["devices"][0]["device"], 1);
}

#[test]
fn facts_rules_and_explain() {
    let o = oomdoc(&["facts", REAL]);
    assert!(o.status.success());
    let text = stdout(&o);
    for fact in ["allocated_bytes", "live.optimizer_state_bytes", "segments.free_events", "oom.present"] {
        assert!(text.contains(fact), "facts lists {fact}");
    }
    let o = oomdoc(&["facts", REAL, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[format!("{REAL}#0")]["oom.present"], "false");

    let rules = stdout(&oomdoc(&["rules"]));
    for id in [
        "fragmentation",
        "leaked-references",
        "missing-no-sync",
        "unbounded-kv-growth",
        "nccl-overhead",
        "compile-warmup",
        "large-intermediate",
    ] {
        assert!(rules.contains(id), "rules lists {id}");
    }
    let ex = stdout(&oomdoc(&["explain", "fragmentation"]));
    assert!(ex.contains("expandable_segments:True") && ex.contains("largest"), "{ex}");
    let o = oomdoc(&["explain", "no-such-rule"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("fragmentation"), "lists the rules: {}", stderr(&o));
}

#[test]
fn user_rules_add_and_categories_extend() {
    let f = "fixtures/real/cs336-wl-train-newest.pickle";
    let without = stdout(&oomdoc(&["analyze", f, "-f", "json"]));
    assert!(!without.contains("big-activations"));
    let o = oomdoc(&["analyze", f, "-f", "json", "--rules", "fixtures/user-rules"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let hit =
        v["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "big-activations").expect("user rule fires");
    assert!(hit["message"].as_str().unwrap().starts_with("Activations hold"), "{hit}");
    assert!(oomdoc(&["rules", "--rules", "fixtures/user-rules"]).stdout.windows(15).any(|w| w == b"big-activations"));
}

#[test]
fn a_broken_user_rule_names_file_line_and_column() {
    let dir = std::env::temp_dir().join(format!("oomdoc-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("broken.toml"),
        "id = \"broken\"\ntitle = \"t\"\nseverity = \"warning\"\nwhen = \"allocated_bytes >\"\nmessage = \"m\"\nfix = \"f\"\n",
    )
    .unwrap();
    let o = oomdoc(&["analyze", REAL, "--rules", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("broken.toml:4:26: expected a number, a fact name"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_teaches() {
    let h = stdout(&oomdoc(&["analyze", "--help"]));
    for needle in ["--at", "--format", "--fail-on", "--gpu-memory", "--rules", "Examples:"] {
        assert!(h.contains(needle), "help mentions {needle}");
    }
    let top = stdout(&oomdoc(&["--help"]));
    assert!(top.contains("_record_memory_history"), "{top}");
}

#[test]
fn analyze_help_is_grouped_and_short_with_h() {
    let short = stdout(&oomdoc(&["analyze", "-h"]));
    let long = stdout(&oomdoc(&["analyze", "--help"]));
    // Grouped: where to find an option says what it is for; output options are never under the budget's "Run".
    for heading in ["Reading the inputs:", "The moment and the GPU:", "Output:", "CI gates:"] {
        assert!(short.contains(heading) && long.contains(heading), "{heading}");
    }
    let section = |text: &str, heading: &str| -> String {
        // Up to the next heading: a line that starts in the first column.
        let body = text.split(heading).nth(1).unwrap_or("");
        body.lines().skip(1).take_while(|l| l.is_empty() || l.starts_with(' ')).collect::<Vec<_>>().join("\n")
    };
    assert!(section(&long, "Output:").contains("--format") && section(&long, "Output:").contains("--output"));
    assert!(section(&long, "CI gates:").contains("--max-peak"));
    assert!(!section(&long, "Run:").contains("--format"), "output options under Run:");
    // The budget's model and run flags are in --help only; -h says where they are.
    assert!(!short.contains("--layers") && long.contains("--layers"));
    assert!(short.contains("every model and run"), "{short}");
    assert!(short.lines().count() * 3 < long.lines().count() * 2, "-h is short: {} lines", short.lines().count());
}

#[test]
fn budget_help_examples_run_without_a_file_of_the_users() {
    let help = stdout(&oomdoc(&["budget", "--help"]));
    assert!(!help.contains("fixtures/"), "an example names a file a wheel does not ship");
    let examples = help.split("Examples").nth(1).unwrap().split("Known GPUs").next().unwrap();
    let mut ran = 0;
    let mut lines = examples.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim().strip_prefix("oomdoc budget") else { continue };
        let mut cmd = rest.to_string();
        while cmd.ends_with('\\') {
            cmd.pop();
            cmd.push(' ');
            cmd.push_str(lines.next().unwrap().trim());
        }
        if cmd.contains("config.json") {
            continue;
        }
        let mut args = vec!["budget"];
        args.extend(cmd.split_whitespace());
        let o = oomdoc(&args);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", stderr(&o));
        assert!(!o.stdout.is_empty(), "{cmd}: silent");
        ran += 1;
    }
    assert!(ran >= 4, "{ran} examples ran");
}

#[test]
fn a_budget_that_left_activations_out_says_so_in_its_headline() {
    let text = stdout(&oomdoc(&["budget", "--params", "7e9", "--train", "--gpu", "h200"]));
    let verdict = text.lines().find(|l| l.starts_with("Verdict:")).unwrap_or_else(|| panic!("{text}"));
    assert!(verdict.contains("model states fit on h200"), "{verdict}");
    assert!(
        verdict.contains("activations, logits and the KV cache not estimated — --layers and --hidden"),
        "{verdict}"
    );
    let short = stdout(&oomdoc(&["budget", "--params", "7e9", "--train", "--gpu", "h100-80gb"]));
    assert!(short.contains("before activations, logits and the KV cache, which are not estimated"), "{short}");
    // With the shape and the run's batch and sequence, nothing is left out and the headline is plain.
    let whole = stdout(&oomdoc(&[
        "budget",
        "--layers",
        "32",
        "--hidden",
        "4096",
        "--heads",
        "32",
        "--vocab",
        "32000",
        "--intermediate",
        "11008",
        "--train",
        "--batch",
        "1",
        "--seq",
        "512",
        "--gpu",
        "h200",
    ]));
    assert!(!whole.contains("not estimated"), "{whole}");
    let json: serde_json::Value =
        serde_json::from_slice(&oomdoc(&["budget", "--params", "7e9", "--train", "--format", "json"]).stdout).unwrap();
    assert_eq!(json["left_out"]["what"], "activations, logits and the KV cache");
}

#[test]
fn one_bad_input_is_one_line_and_the_others_are_still_analysed() {
    // A job of two snapshots and a log, one snapshot truncated: its error is one line, the other snapshot and the
    // log are reported, and the exit code says that something could not be read.
    let whole = std::fs::read(common::root().join(REAL)).unwrap();
    let bad = TempFile::with("truncated.pickle", &whole[..whole.len() / 2]);
    let log = "fixtures/real/logs/vllm-v1-near-full-kv.log";
    let o = oomdoc(&["analyze", bad.path(), REAL, log, "--format", "json"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomdoc: error: ") && err.contains("truncated.pickle"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let paths: Vec<&str> = v["inputs"].as_array().unwrap().iter().filter_map(|i| i["path"].as_str()).collect();
    assert_eq!(paths, [REAL, log]);
    // Nothing readable: no report, only the errors.
    let o = oomdoc(&["analyze", bad.path()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
}

#[test]
fn max_peak_and_max_reserved_exit_1_with_the_reason_on_one_line() {
    // The bundled step peaks at 51.3 GiB allocated, 56.9 GiB reserved.
    let snap = "fixtures/real/cs336-kk-fullstep-57gb.pickle";
    for (args, code, says) in [
        (vec!["--max-peak", "50GiB"], 1, Some("peaked at 51.3 GiB allocated, over --max-peak 50.0 GiB by 1.30 GiB")),
        (vec!["--max-peak", "52GiB"], 0, None),
        (vec!["--max-reserved", "50GiB"], 1, Some("peaked at 56.9 GiB reserved, over --max-reserved 50.0 GiB")),
        (vec!["--max-peak", "60GiB", "--max-reserved", "60GiB"], 0, None),
    ] {
        let o = oomdoc(&[&["analyze", snap, "--format", "json"][..], &args].concat());
        assert_eq!(o.status.code(), Some(code), "{args:?}");
        assert!(!o.stdout.is_empty(), "the report is still written");
        let err = stderr(&o);
        match says {
            Some(s) => assert!(err.lines().count() == 1 && err.contains(s) && err.contains("GPU 0"), "{args:?}: {err}"),
            None => assert!(err.is_empty(), "{err}"),
        }
    }
    let o = oomdoc(&["analyze", snap, "--max-peak", "lots"]);
    assert_eq!(o.status.code(), Some(2));
}
