//! Profiler exports through `oomdoc analyze`: recognised by content (a file, a directory of `nsys stats` reports,
//! an SQLite export), summarised in every report format, and turned into findings — per-kernel classes from
//! Nsight Compute, all-reduces per optimizer step and micro-batch from an nsys GPU trace, allocator churn from the
//! CUDA API summary.

use crate::common;

use common::{oomdoc, rules_fired, stderr, stdout};
use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let mut all = vec!["analyze", "--format", "json"];
    all.extend_from_slice(args);
    let o = oomdoc(&all);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// The `kernel-bound` findings as `class: ids` (ids in the finding's order).
fn classes(v: &Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["rule"] == "kernel-bound")
        .map(|f| {
            let class = f["title"].as_str().unwrap().rsplit("— ").next().unwrap().to_string();
            let ids: Vec<String> =
                f["evidence"]["kernels"].as_array().unwrap().iter().map(|k| k["kernel.id"].to_string()).collect();
            format!("{class}: {}", ids.join(","))
        })
        .collect()
}

#[test]
fn ncu_one_memory_bound_one_compute_bound_kernel() {
    // Hand-made: an NCCL all-reduce at 85.3% memory / 12.4% SM, an SGEMM at 40% memory / 92% SM, and a generic
    // NCCL kernel at 3% / 1%.
    let v = json(&["fixtures/profilers/ncu_locale_details_win.csv"]);
    assert_eq!(classes(&v), ["memory-bound: 0", "compute-bound: 1", "latency-bound: 2"]);
    let ncu = &v["profile"]["ncu"];
    assert_eq!(ncu["kernels"], 3);
    assert_eq!(ncu["by_time"][0]["name"], "ampere_sgemm_128x64_tn");
    assert_eq!(ncu["by_time"][0]["class"], "compute-bound");
    assert_eq!(ncu["by_dram_bytes"][0]["class"], "memory-bound");
    // Every class finding is info: what limits a kernel is not why memory ran out.
    assert!(v["findings"].as_array().unwrap().iter().all(|f| f["severity"] == "info"));
}

#[test]
fn ncu_real_h100_captures_are_classified_alike_in_every_layout() {
    // Five launches of one program (elementwise, reduction, cuBLAS GEMM) captured as the details page, the raw
    // page, with NVTX, and with auto-scaled units: every layout must give the same classes.
    for f in [
        "ncu2025.3_csv_details_sol_h100.txt",
        "ncu2025.3_csv_details_unitsauto_h100.txt",
        "ncu2025.3_csv_nvtx_details_metrics_h100.txt",
        "ncu2025.3_csv_nvtx_raw_metrics_h100.txt",
        "ncu2025.3_csv_raw_sol_h100.txt",
    ] {
        let v = json(&[&format!("fixtures/real/ncu/{f}")]);
        assert_eq!(classes(&v), ["compute-and-memory-bound: 3", "memory-bound: 2,4,0", "latency-bound: 1"], "{f}");
    }
}

#[test]
fn kernel_thresholds_live_in_the_rule_file() {
    // A user copy of the rule with a 90% threshold: the three kernels at 85–89.9% memory throughput stop being
    // memory-bound.
    let text = std::fs::read_to_string(common::root().join("rules/kernel-bound.toml")).unwrap().replace("80%", "90%");
    let dir = std::env::temp_dir().join(format!("oomdoc-kernel-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kernel-bound.toml"), text).unwrap();
    let v = json(&["--rules", dir.to_str().unwrap(), "fixtures/real/ncu/ncu2025.3_csv_details_sol_h100.txt"]);
    assert_eq!(classes(&v), ["compute-and-memory-bound: 3", "latency-bound: 2,4,0,1"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn nsys_all_reduce_in_every_micro_batch_is_missing_no_sync() {
    // 2 steps × 8 micro-batches, the backward all-reduces after every micro-batch: the rule fires.
    let v = json(&["fixtures/profilers/ddp_accum_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), ["missing-no-sync:warning"]);
    let f = &v["findings"][0];
    assert_eq!(f["evidence"]["nsys.allreduce_microbatches_per_step"], 8);
    assert_eq!(f["evidence"]["nsys.steps_with_allreduce"], 2);
    assert_eq!(f["evidence"]["nsys.allreduce_launches"], 16);
    let steps = &v["profile"]["steps"];
    assert_eq!((steps["steps"].as_u64(), steps["microbatches_per_step"].as_u64()), (Some(2), Some(8)));

    // With no_sync: one all-reduce per step, in the last micro-batch. Silent.
    let v = json(&["fixtures/profilers/ddp_nosync_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    assert_eq!(v["profile"]["steps"]["allreduce_per_step"], 1);

    // With no_sync and three gradient buckets: three launches per step, all in the last micro-batch. Silent: a
    // count of launches alone would have fired here.
    let v = json(&["fixtures/profilers/ddp_nosync_buckets_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    assert_eq!(v["profile"]["steps"]["allreduce_per_step"], 3);
    assert_eq!(v["profile"]["steps"]["allreduce_microbatches_per_step"], 1);
}

#[test]
fn nsys_micro_batches_without_input_copies_and_with_loss_logging() {
    // Data already on the GPU: no input copies; the micro-batches are told apart by their kernels repeating (the
    // later ones of a step add to the gradients, one kernel more than the first).
    let v = json(&["fixtures/profilers/ddp_accum_ondevice_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), ["missing-no-sync:warning"]);
    assert_eq!(v["profile"]["steps"]["per_step"][0]["delimited_by"], "repeating_kernels");
    assert_eq!(v["profile"]["steps"]["microbatches_per_step"], 8);
    let v = json(&["fixtures/profilers/ddp_nosync_ondevice_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    assert_eq!(v["profile"]["steps"]["allreduce_microbatches_per_step"], 1);
    // With no_sync, plus a 5 µs all-reduce of the loss in every micro-batch for logging: not gradients. Silent.
    let v = json(&["fixtures/profilers/ddp_nosync_lossreduce_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    assert_eq!(v["profile"]["steps"]["allreduce_per_step"], 9);
    assert_eq!(v["profile"]["steps"]["allreduce_microbatches_per_step"], 1);
    // Two ranks' traces given together are not interleaved into one: the no_sync rank stays 1 per step, and the
    // rank without no_sync is the one reported.
    let v =
        json(&["fixtures/profilers/ddp_nosync_cuda_gpu_trace.csv", "fixtures/profilers/ddp_nosync_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    assert_eq!(v["profile"]["steps"]["allreduce_per_step"], 1);
    let v =
        json(&["fixtures/profilers/ddp_nosync_cuda_gpu_trace.csv", "fixtures/profilers/ddp_accum_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), ["missing-no-sync:warning"]);
    assert_eq!(v["profile"]["steps"]["steps"], 2);
}

#[test]
fn nsys_nvtx_ranges_alone_give_an_info_to_check() {
    // Kernels per NVTX step range, no GPU trace: 8 all-reduces per step is worth checking (info: several gradient
    // buckets launch several too); 1 per step is not.
    let v = json(&["fixtures/profilers/nccl2x_nvtxkernsum.csv"]);
    assert_eq!(rules_fired(&v), ["missing-no-sync:info"]);
    let m = v["findings"][0]["message"].as_str().unwrap();
    assert!(m.starts_with("NVTX range \"step0\" ran 8 NCCL all-reduce launches per instance"), "{m}");
    let v = json(&["fixtures/profilers/nccl2x_nosync_nvtxkernsum.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    // With a GPU trace the trace decides: no info beside the trace's verdict.
    let v = json(&["fixtures/profilers/nccl2x_nvtxkernsum.csv", "fixtures/profilers/ddp_nosync_cuda_gpu_trace.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
}

#[test]
fn nsys_capture_files_read_together() {
    // The capture's sibling report files given at once: one profile, the kernel summary's counts, the API
    // summary's allocator calls, the trace's steps.
    let paths: Vec<String> = common::DDP_ACCUM_FILES.iter().map(|f| format!("fixtures/profilers/{f}")).collect();
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    let v = json(&args);
    assert_eq!(v["inputs"].as_array().unwrap().len(), 7);
    assert!(v["inputs"].as_array().unwrap().iter().all(|i| i["kind"] == "nsys"));
    // The 0-byte report is named by its file and said to be empty.
    assert_eq!(
        v["inputs"][5]["skipped"][0],
        "nvtx_sum: empty (no data; nsys leaves a 0-byte file when a report has none)"
    );
    let p = &v["profile"];
    assert_eq!(p["collectives"][0]["launches"], 16);
    assert_eq!(p["allocator_calls"]["device_alloc_calls"], 24);
    assert_eq!(p["allocator_calls"]["device_free_calls"], 3);
    assert_eq!(p["copies"][0]["bytes"], 201_333_000);
    assert_eq!(p["copies"][0]["count"], 17);
    assert_eq!(p["kernels_by_time"][0]["instances"], 16);
    assert_eq!(rules_fired(&v), ["missing-no-sync:warning"]);
    // 27 allocator calls are no churn.
    assert!(!rules_fired(&v).iter().any(|r| r.starts_with("segment-churn")));
}

#[test]
fn nsys_allocator_churn_from_the_api_summary() {
    let v = json(&["fixtures/profilers/churn_cuda_api_sum.csv"]);
    assert_eq!(rules_fired(&v), ["segment-churn:warning"]);
    let f = &v["findings"][0];
    assert_eq!(f["evidence"]["nsys.free_calls"], 4812);
    assert_eq!(f["evidence"]["nsys.malloc_calls"], 4900);
    assert!(f["message"].as_str().unwrap().contains("75% of all CUDA API time"), "{}", f["message"]);
    // A warm-up: 380 cudaMalloc calls taking most of the API time, 12 cudaFree. Silent.
    let v = json(&["fixtures/profilers/warmup_cuda_api_sum.csv"]);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
}

#[test]
fn nsys_report_directory_is_one_input() {
    let dir = "fixtures/real/nsys/nsys2022.4_stats__torch_gcn_profile_nsys";
    let v = json(&[dir]);
    assert_eq!(v["inputs"].as_array().unwrap().len(), 1);
    assert_eq!(v["inputs"][0]["kind"], "nsys");
    assert_eq!(v["inputs"][0]["path"], dir);
    // Real files without evidence of a problem: no finding.
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    assert!(v["profile"]["kernels_by_time"].as_array().unwrap().len() == 5);
}

#[test]
fn real_nsys_and_ncu_exports_raise_nothing_above_info() {
    let mut inputs: Vec<String> =
        common::fixtures("fixtures/real/nsys", "").into_iter().filter(|p| !p.ends_with(".md")).collect();
    inputs.extend(common::fixtures("fixtures/real/ncu", "").into_iter().filter(|p| {
        (p.ends_with(".csv") || p.ends_with("h100.txt") || p.ends_with("torch.txt")) && !p.contains("text_")
    }));
    assert!(inputs.len() >= 15, "{inputs:?}");
    for i in &inputs {
        let v = json(&[i]);
        let fired = rules_fired(&v);
        assert!(fired.iter().all(|r| r.ends_with(":info")), "{i}: {fired:?}");
    }
}

#[test]
fn profile_section_in_text_and_markdown() {
    let o = oomdoc(&[
        "analyze",
        "fixtures/profilers/ddp_accum_cuda_gpu_trace.csv",
        "fixtures/profilers/ncu_locale_details_win.csv",
    ]);
    let text = stdout(&o);
    assert!(text.contains("Profiler exports (Nsight Systems / Nsight Compute)"), "{text}");
    assert!(
        text.contains("Optimizer steps in the GPU trace: 2 (2 with all-reduces): per step 8 micro-batches"),
        "{text}"
    );
    assert!(text.contains("Nsight Compute: 3 launches — 1 compute-bound, 1 latency-bound, 1 memory-bound"), "{text}");
    assert!(!text.contains("No GPU memory in these files"), "{text}");
    let o = oomdoc(&["analyze", "--format", "markdown", "fixtures/profilers/ddp_accum_cuda_gpu_trace.csv"]);
    let md = stdout(&o);
    assert!(md.contains("### Profiler exports (Nsight Systems / Nsight Compute)"), "{md}");
    assert!(md.find("### Findings") < md.find("### Profiler exports"), "{md}");
    assert!(!md.contains("| GPU | moment"), "no GPU table without a GPU: {md}");
}

#[test]
fn profile_with_a_snapshot_joins_one_report() {
    let v = json(&["fixtures/real/cs336-kk-fullstep-57gb.pickle", "fixtures/profilers/ddp_accum_cuda_gpu_trace.csv"]);
    assert_eq!(v["inputs"].as_array().unwrap().len(), 2);
    assert!(!v["devices"].as_array().unwrap().is_empty());
    assert_eq!(v["profile"]["steps"]["steps"], 2);
    assert!(rules_fired(&v).contains(&"missing-no-sync:warning".to_string()));
}

#[test]
fn kind_forces_a_profiler_reader() {
    let v = json(&["--kind", "ncu", "fixtures/profilers/ncu_locale_raw.csv"]);
    assert_eq!(v["inputs"][0]["kind"], "ncu");
    let o = oomdoc(&["analyze", "--kind", "ncu", "fixtures/profilers/ddp_accum_cuda_api_sum.csv"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("ddp_accum_cuda_api_sum.csv"), "{}", stderr(&o));
}

#[test]
fn nsys_sqlite_export_gives_the_driver_memory_timeline() {
    let v = json(&["fixtures/profilers/nsys_memusage_ddp.sqlite"]);
    assert_eq!(v["inputs"][0]["kind"], "nsys_sqlite");
    let d = &v["profile"]["driver_memory"][0];
    assert_eq!(d["device"], 0);
    // The generator's story: peak 2200 MiB of device memory, 1634 MiB still held at the end; 87 allocations and 50
    // frees, of which 2 and 2 are pinned host buffers (not device memory).
    assert_eq!(d["peak_bytes"], 2_306_867_200u64);
    assert_eq!(d["end_bytes"], 1634u64 << 20);
    assert_eq!((d["allocations"].as_u64(), d["frees"].as_u64()), (Some(85), Some(48)));
    assert_eq!(d["curve"].as_array().unwrap().len(), 32);
    // Four all-reduce launches (gradient buckets) per step, one micro-batch per step: no finding.
    assert_eq!(v["profile"]["steps"]["allreduce_per_step"], 4);
    assert_eq!(rules_fired(&v), Vec::<String>::new());
    let text = stdout(&oomdoc(&["analyze", "fixtures/profilers/nsys_memusage_ddp.sqlite"]));
    assert!(text.contains("GPU 0 device memory from the driver: peak 2.15 GiB"), "{text}");
    // Without --cuda-memory-usage the report says how to get the timeline.
    let v = json(&["fixtures/profilers/nsys_nomemusage.sqlite"]);
    let skipped = v["inputs"][0]["skipped"].to_string();
    assert!(skipped.contains("--cuda-memory-usage=true"), "{skipped}");
    // Not an nsys database: exit 2, one line naming the file.
    let o = oomdoc(&["analyze", "fixtures/profilers/not_nsys.sqlite"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not an Nsight Systems export"), "{}", stderr(&o));
}

#[test]
fn readme_each_rule_example_works() {
    // The `each` example of rules/README.md, as a user would copy it into their rules folder.
    let readme = std::fs::read_to_string(common::root().join("rules/README.md")).unwrap();
    let start = readme.find("id = \"slow-nccl\"").expect("the example is in the README");
    let end = start + readme[start..].find("```").unwrap();
    let dir = std::env::temp_dir().join(format!("oomdoc-readme-each-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("slow-nccl.toml"), &readme[start..end]).unwrap();
    let v = json(&["--rules", dir.to_str().unwrap(), "fixtures/real/ncu/ncu2025.3_csv_details_nccl_h100.txt"]);
    let f = v["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "slow-nccl").expect("the example fires");
    // The single-GPU NCCL reduction of that capture computes at 4% of SM peak.
    assert_eq!(f["message"], "1 of 7 launches are NCCL kernels that barely compute: oneRankReduce (57 µs).");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_profiler_inputs_are_one_clear_line() {
    let dir = std::env::temp_dir().join(format!("oomdoc-empty-nsys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = oomdoc(&["analyze", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("a folder with nothing oomdoc reads (0 files)"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    // A truncated SQLite export: exit 2 naming the file, never a panic.
    let bytes = common::read("fixtures/profilers/nsys_memusage_ddp.sqlite");
    let cut = common::TempFile::with("cut.sqlite", &bytes[..bytes.len() / 3]);
    let o = oomdoc(&["analyze", cut.path()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("cut.sqlite"), "{}", stderr(&o));
    // A malformed ncu row is skipped and counted; --strict makes it the error.
    let o = oomdoc(&["analyze", "--strict", "fixtures/profilers/ncu_locale_details_win.csv"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("line 18"), "{}", stderr(&o));
}
