//! Golden reports: text, markdown and JSON on real snapshots and on generated fixtures of every shape.
//! Review changes with `cargo insta review` (or INSTA_UPDATE=always cargo test, then read the diff).

use crate::common;

fn report(file: &str, format: &str) -> String {
    let o = common::oomdoc(&["analyze", file, "--format", format, "--top", "5"]);
    assert!(o.status.success(), "{file} --format {format}: {}", common::stderr(&o));
    common::stdout(&o)
}

fn check_all_formats(file: &str) {
    let name = std::path::Path::new(file).file_stem().unwrap().to_string_lossy().replace('.', "_");
    insta::assert_snapshot!(format!("{name}.text"), report(file, "text"));
    insta::assert_snapshot!(format!("{name}.markdown"), report(file, "markdown"));
    insta::assert_snapshot!(format!("{name}.json"), report(file, "json"));
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
