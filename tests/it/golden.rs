//! Golden reports: text, markdown and JSON on real snapshots and on generated fixtures of every shape.
//! Review changes with `cargo insta review` (or INSTA_UPDATE=always cargo test, then read the diff).

use crate::common;

fn report(files: &[&str], format: &str) -> String {
    let mut args = vec!["analyze"];
    args.extend_from_slice(files);
    args.extend_from_slice(&["--format", format, "--top", "5"]);
    let o = common::oomdoc(&args);
    assert!(o.status.success(), "{files:?} --format {format}: {}", common::stderr(&o));
    common::stdout(&o)
}

fn check_all_formats(file: &str) {
    check_files(&[file]);
}

/// The report on a snapshot and the files beside it (its log), named after the snapshot.
fn check_files(files: &[&str]) {
    let name = std::path::Path::new(files[0]).file_stem().unwrap().to_string_lossy().replace('.', "_");
    insta::assert_snapshot!(format!("{name}.text"), report(files, "text"));
    insta::assert_snapshot!(format!("{name}.markdown"), report(files, "markdown"));
    insta::assert_snapshot!(format!("{name}.json"), report(files, "json"));
}

/// A dialect's snapshot with the OOM message its job printed, where it has one.
fn check_dialect(name: &str) {
    let snapshot = format!("fixtures/generated/dialects/{name}.pickle");
    let log = format!("fixtures/generated/dialects/{name}.log");
    match std::path::Path::new(&log).exists() {
        true => check_files(&[&snapshot, &log]),
        false => check_files(&[&snapshot]),
    }
}

/// Each dialect's golden report, and the backend its first line names.
#[test]
fn dialects_xpu_npu_rocm_newest_cuda_and_a_preemptive_rejection() {
    for (name, first_line) in [
        ("xpu-forward-oom", "(torch ≥ 2.10, XPU,"),
        ("npu-workspace-ahead", "(torch_npu, NPU,"),
        ("rocm-cpp-frames", "(torch ≥ 2.8, ROCm,"),
        ("cuda-trace-overflowed", "(torch ≥ 2.14, CUDA,"),
        ("cuda-preemptive-rejection", "(torch ≥ 2.14, CUDA,"),
    ] {
        check_dialect(name);
        let text = report(&[&format!("fixtures/generated/dialects/{name}.pickle")], "text");
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains(first_line), "{name}: {first}");
    }
}

macro_rules! golden {
    ($($test:ident => $file:expr,)*) => {
        $(
            #[test]
            fn $test() {
                check_all_formats($file);
            }
        )*
    };
}

golden! {
    real_train_step_with_cpp_stacks => "fixtures/real/cs336-kk-fullstep-57gb.pickle",
    real_newest_keys_wrapped_trace => "fixtures/real/cs336-wl-train-newest.pickle",
    real_windows_paths_complete_trace => "fixtures/real/decomfl-t29.pickle",
    real_v2_0_block_history => "fixtures/real/yiyi-flexgen-opt1.3b-t20.pickle",
    real_two_gpus_state_only => "fixtures/real/text2sql-2gpu-stateonly.pickle",
    real_ten_streams_segment_churn => "fixtures/real/selectn-10streams-t21.pickle",
    real_legacy_segment_list_cuda1 => "fixtures/real/layoutedit-legacy-segment-list.pickle",
    generated_v1_13_segment_list => "fixtures/generated/shapes/v1.13-segments.pickle",
    generated_v2_0_history_protocol_2 => "fixtures/generated/shapes/v2.0-history-proto2.pickle",
    generated_v2_1_oom_and_pending_frees => "fixtures/generated/shapes/v2.1-oom-pending.pickle",
    generated_v2_8_expandable_map_unmap_oom => "fixtures/generated/shapes/v2.8-expandable-oom.pickle",
    generated_v2_8_wrapped_trace => "fixtures/generated/shapes/v2.8-wrapped-trace.pickle",
    generated_v2_15_two_devices_private_pool_protocol_5 => "fixtures/generated/shapes/v2.15-multidevice-pool.pickle",
    generated_v2_14_component_labels => "fixtures/generated/shapes/v2.14-labels.pickle",
    generated_fragmentation_oom => "fixtures/generated/rules/fragmentation-fire.pickle",
}
