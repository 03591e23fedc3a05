//! Several ranks' snapshots are one job: the rank table, the first OOM, the ranks that stand out, findings merged
//! across ranks, and full detail only where it matters. The job is built from real snapshots (captured on an H100,
//! `fixtures/real-gpu/`) renamed as the ranks of a DDP job whose rank 2 leaked references and ran out of memory.

use crate::common::{oomdoc, stderr, stdout};

/// Rank files in a scratch folder: (file name, real snapshot).
struct Ranks(std::path::PathBuf);

impl Ranks {
    fn new(name: &str, files: &[(&str, &str)]) -> Ranks {
        let dir = std::env::temp_dir().join(format!("oomdoc-job-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (to, from) in files {
            std::fs::copy(crate::common::root().join(from), dir.join(to)).unwrap();
        }
        Ranks(dir)
    }
    fn paths(&self, names: &[&str]) -> Vec<String> {
        names.iter().map(|n| self.0.join(n).to_str().unwrap().to_string()).collect()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const DDP: [(&str, &str); 4] = [
    ("rank0.pickle", "fixtures/real-gpu/ddp-no-sync/snapshot.pickle"),
    ("rank1.pickle", "fixtures/real-gpu/ddp-without-no-sync/snapshot.pickle"),
    ("rank2.pickle", "fixtures/real-gpu/leaked-references/snapshot.pickle"),
    ("rank3.pickle", "fixtures/real-gpu/ddp-no-sync/snapshot.pickle"),
];

/// Runs analyze from inside the folder, so paths in the output are the bare file names (stable goldens).
fn analyze_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_oomdoc"))
        .arg("analyze")
        .args(args)
        .current_dir(dir)
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

#[test]
fn a_ddp_job_names_the_oom_rank_the_table_and_the_outlier() {
    let ranks = Ranks::new("ddp", &DDP);
    // Given out of order: the ranks come from the names.
    let order = ["rank3.pickle", "rank0.pickle", "rank2.pickle", "rank1.pickle"];
    let json = analyze_in(&ranks.0, &[&["--format", "json"][..], &order].concat());
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let job = &v["job"];
    assert_eq!(job["first_oom"], serde_json::json!({"input": "rank2.pickle", "rank": 2, "device": 0}));
    let rows = job["ranks"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["rank"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(rows.iter().map(|r| r["oom"].as_bool().unwrap()).collect::<Vec<_>>(), [false, false, true, false]);
    assert_eq!(rows[2]["primary_rule"], "leaked-references");
    for key in
        ["input", "rank", "device", "peak_allocated_bytes", "peak_reserved_bytes", "oom", "oom_time_us", "primary_rule"]
    {
        assert!(rows.iter().all(|r| r.get(key).is_some()), "ranks[] carry {key}");
    }
    let outliers = job["outliers"].as_array().unwrap();
    assert_eq!(outliers.len(), 1, "{outliers:?}");
    assert_eq!(outliers[0]["rank"], 2);
    assert_eq!(outliers[0]["category"], "activation");
    // JSON keeps every rank in full.
    assert_eq!(v["devices"].as_array().unwrap().len(), 4);
    insta::assert_json_snapshot!("ddp_job_view", job);

    let text = stdout(&analyze_in(&ranks.0, &["--color", "never"].iter().copied().chain(order).collect::<Vec<_>>()));
    assert!(text.starts_with("Job: 4 ranks, 4 snapshots\n  first OOM: rank 2, GPU 0 (rank2.pickle)"), "{text}");
    // Full detail for the OOM rank only; the healthy ranks are their row.
    assert_eq!(text.matches("\nVerdict\n").count(), 1, "{text}");
    assert!(text.contains("oomdoc rank2.pickle") && !text.contains("oomdoc rank0.pickle"), "{text}");
    insta::assert_snapshot!("ddp_job_text", text);

    let md = stdout(&analyze_in(&ranks.0, &[&["--format", "markdown"][..], &order].concat()));
    assert!(md.starts_with("## Job: 4 ranks\n\n**First OOM**: rank 2, GPU 0 (`rank2.pickle`)"), "{md}");
    assert!(md.contains("| 2 | 0 | 2.97 GiB | 2.99 GiB | OOM, first | `leaked-references` |"), "{md}");
    insta::assert_snapshot!("ddp_job_markdown", md);
}

#[test]
fn findings_on_many_ranks_are_one_line_and_a_job_without_an_oom_shows_its_highest_peak() {
    // Eight ranks of the same leaking program: one merged line, "on 8 of 8 ranks, same line".
    let files: Vec<(String, &str)> =
        (0..8).map(|r| (format!("rank_{r}.pickle"), "fixtures/real-gpu/leaked-references/snapshot.pickle")).collect();
    let ranks = Ranks::new("leak8", &files.iter().map(|(a, b)| (a.as_str(), *b)).collect::<Vec<_>>());
    let names: Vec<&str> = files.iter().map(|(a, _)| a.as_str()).collect();
    let text = stdout(&analyze_in(&ranks.0, &[&["--color", "never"][..], &names].concat()));
    let line =
        text.lines().find(|l| l.contains("across ranks: error leaked-references")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("on 8 of 8 ranks (0–7), same line: capture/common.py:61 in run"), "{line}");
    assert!(!text.contains("stands out"), "identical ranks: no outlier\n{text}");

    // No OOM anywhere: the table, and the rank with the highest peak in full.
    let healthy = Ranks::new(
        "healthy",
        &[
            ("r0.pickle", "fixtures/real-gpu/healthy/snapshot.pickle"),
            ("r1.pickle", "fixtures/real-gpu/healthy/snapshot.pickle"),
        ],
    );
    let text = stdout(&analyze_in(&healthy.0, &["--color", "never", "r0.pickle", "r1.pickle"]));
    assert!(text.contains("  no rank ran out of memory"), "{text}");
    assert!(text.contains("In full below: rank 1 (the highest peak)"), "{text}");
    assert_eq!(text.matches("\nVerdict\n").count(), 1, "{text}");
}

#[test]
fn without_rank_names_the_order_given_is_the_rank() {
    let ranks = Ranks::new(
        "unnamed",
        &[
            ("a.pickle", "fixtures/real-gpu/healthy/snapshot.pickle"),
            ("b.pickle", "fixtures/real-gpu/fragmentation/snapshot.pickle"),
        ],
    );
    let o = analyze_in(&ranks.0, &["--format", "json", "b.pickle", "a.pickle"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["job"]["ranks"].as_array().unwrap();
    assert_eq!((rows[0]["input"].as_str(), rows[0]["rank"].as_u64()), (Some("b.pickle"), Some(0)));
    assert_eq!((rows[1]["input"].as_str(), rows[1]["rank"].as_u64()), (Some("a.pickle"), Some(1)));
    // One snapshot is not a job: no job object.
    let one = oomdoc(&["analyze", "--format", "json", "fixtures/real-gpu/healthy/snapshot.pickle"]);
    let v: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    assert!(v.get("job").is_none(), "{}", stderr(&one));
    let _ = ranks.paths(&[]);
}

#[test]
fn map_reduce_per_rank_json_reports_give_the_same_job_view_as_the_snapshots() {
    // Map: one `analyze --format json` per rank, where its file is. Reduce: one analyze over the reports.
    let ranks = Ranks::new("mapreduce", &DDP);
    let mut reports = Vec::new();
    for (name, _) in DDP {
        let o = analyze_in(&ranks.0, &["--format", "json", name]);
        assert!(o.status.success());
        let json = name.replace(".pickle", ".json");
        std::fs::write(ranks.0.join(&json), &o.stdout).unwrap();
        reports.push(json);
    }
    let names: Vec<&str> = DDP.iter().map(|(n, _)| *n).collect();
    let direct: serde_json::Value =
        serde_json::from_slice(&analyze_in(&ranks.0, &[&["--format", "json"][..], &names].concat()).stdout).unwrap();
    let reports: Vec<&str> = reports.iter().map(String::as_str).collect();
    let o = analyze_in(&ranks.0, &[&["--format", "json"][..], &reports].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reduced: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(reduced["job"], direct["job"], "the job view from the reports is the snapshots' view");
    assert_eq!(reduced["schema_version"], 1);
    // Reports and snapshots mixed: the same view.
    let mixed = ["rank0.json", "rank1.pickle", "rank2.json", "rank3.pickle"];
    let o = analyze_in(&ranks.0, &[&["--format", "json"][..], &mixed].concat());
    let mixed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(mixed["job"], direct["job"]);
    // In text the job view names where the ranks came from.
    let text = stdout(&analyze_in(&ranks.0, &[&["--color", "never"][..], &reports].concat()));
    assert!(text.starts_with("Job: 4 ranks, 4 JSON reports\n  first OOM: rank 2, GPU 0 (rank2.pickle)"), "{text}");
    // A job's report is not a rank's: refused in one line.
    std::fs::write(ranks.0.join("job.json"), serde_json::to_vec(&direct).unwrap()).unwrap();
    let o = analyze_in(&ranks.0, &["job.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("give the per-rank reports"));
}

#[test]
fn many_ranks_are_read_on_every_core_in_order_and_a_broken_one_is_one_line() {
    // 40 ranks read by the parallel path, one of them truncated: the others are reported in rank order.
    let ranks = Ranks::new("many", &[]);
    let good = crate::common::root().join("fixtures/real-gpu/healthy/snapshot.pickle");
    let bytes = std::fs::read(&good).unwrap();
    let mut names = Vec::new();
    for r in (0..40).rev() {
        let name = format!("rank{r}.pickle");
        if r == 17 {
            std::fs::write(ranks.0.join(&name), &bytes[..bytes.len() / 2]).unwrap();
        } else {
            std::os::unix::fs::symlink(&good, ranks.0.join(&name)).unwrap();
        }
        names.push(name);
    }
    let args: Vec<&str> = ["--format", "json"].into_iter().chain(names.iter().map(String::as_str)).collect();
    let o = analyze_in(&ranks.0, &args);
    assert_eq!(o.status.code(), Some(2), "a rank could not be read");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("rank17.pickle"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let got: Vec<u64> = v["job"]["ranks"].as_array().unwrap().iter().map(|r| r["rank"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (0..40).filter(|&r| r != 17).collect();
    assert_eq!(got, want);
    // The devices are in the order the files were given (39 first), whichever core read them.
    let inputs: Vec<&str> = v["inputs"].as_array().unwrap().iter().map(|i| i["path"].as_str().unwrap()).collect();
    assert_eq!(inputs.first(), Some(&"rank39.pickle"));
    assert_eq!(inputs.last(), Some(&"rank0.pickle"));
}
