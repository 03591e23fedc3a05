//! The allocator simulator and its what-ifs, on real captures: under the recorded settings it makes the segments
//! torch made; under other settings it answers what the second capture of the same program shows.

use oomdoc::analysis::whatif::{self, Plan};
use oomdoc::job::{Job, JobOptions};
use oomdoc::timeline::replay::Replay;

use crate::common::{fixtures, oomdoc, root, stdout};

/// Every real trace that records segment events, each input on its own (a folder with its log).
fn real_inputs() -> Vec<String> {
    let mut v = fixtures("fixtures/real", ".pickle");
    let gpu = root().join("fixtures/real-gpu");
    let mut dirs: Vec<String> = std::fs::read_dir(&gpu)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir() && e.file_name() != "frameworks")
        .map(|e| format!("fixtures/real-gpu/{}", e.file_name().to_string_lossy()))
        .collect();
    // The framework corpus: one folder per capture (the DDP ones hold a snapshot per rank).
    dirs.extend(
        std::fs::read_dir(gpu.join("frameworks"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| format!("fixtures/real-gpu/frameworks/{}", e.file_name().to_string_lossy())),
    );
    dirs.sort();
    v.extend(dirs);
    v
}

/// The one real trace the simulator does not reproduce event for event (torch.compile's CUDA-graph pools).
const CUDA_GRAPH_POOLS: &str = "frameworks/lightning-compile-varying-shapes";

#[test]
fn the_simulator_makes_the_segments_torch_made_on_every_real_trace() {
    let mut checked = 0;
    let mut from_empty = 0;
    for input in real_inputs() {
        let job = Job::read(&JobOptions::new([root().join(&input)])).unwrap();
        for tl in &job.timelines {
            for dev in tl.devices.iter().filter(|d| !d.events.is_empty()) {
                let replay = Replay::new(dev, tl.settings.as_ref());
                let mut v = whatif::validate(tl, dev, &replay, None);
                if v.recorded_segment_events == 0 {
                    continue;
                }
                if v.gc_without_cap {
                    // A run under garbage collection that did not run out: its cap is in the capture's meta.json
                    // only, as a user would give it with --memory-cap.
                    let meta = std::fs::read_to_string(root().join(&input).join("meta.json"))
                        .unwrap_or_else(|e| panic!("{input}: garbage collection without a cap, and no meta.json: {e}"));
                    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
                    v = whatif::validate(tl, dev, &replay, meta["cap_bytes"].as_u64());
                    assert!(!v.gc_without_cap, "{input}");
                }
                checked += 1;
                from_empty += !v.rebuilt_start as usize;
                if input.ends_with(CUDA_GRAPH_POOLS) {
                    // CUDA graphs' private pools size their segments other than the model does (the first
                    // difference: a 2 MiB segment recorded, 32 MiB simulated); the peak still agrees within 1%.
                    let (r, s) = (v.recorded_peak_reserved as f64, v.simulated_peak_reserved as f64);
                    assert!(!v.exact && (s - r).abs() <= 0.01 * r, "{input}: {r} recorded, {s} simulated");
                    continue;
                }
                assert!(
                    v.exact,
                    "{input} GPU {}: {} of {} segment events agree ({:?}); peak reserved {} recorded, {} simulated",
                    dev.device,
                    v.agreeing,
                    v.recorded_segment_events,
                    v.first_difference,
                    v.recorded_peak_reserved,
                    v.simulated_peak_reserved
                );
            }
        }
    }
    // The real corpus: traces from an empty device and traces that start mid-run, with and without expandable
    // segments, a memory cap, empty_cache calls and the allocator's own retries.
    assert!(checked >= 25, "only {checked} real traces with segment events");
    assert!(from_empty >= 10, "only {from_empty} from an empty device");
}

fn whatifs(input: &str, plan: &Plan) -> whatif::DeviceWhatIfs {
    let job = Job::read(&JobOptions::new([root().join(input)])).unwrap();
    let tl = &job.timelines[0];
    let dev = &tl.devices[0];
    let replay = Replay::new(dev, tl.settings.as_ref());
    whatif::run_device(tl, dev, &replay, &job.checklist.categories, plan, None).unwrap()
}

fn set(kv: &str) -> Plan {
    Plan::parse(&[kv.to_string()], &[], &[], None).unwrap()
}

#[test]
fn expandable_segments_on_the_fragmentation_capture_avoid_its_oom_as_the_second_capture_shows() {
    let w = whatifs("fixtures/real-gpu/fragmentation", &set("expandable_segments:True"));
    assert_eq!(w.recorded.fits, Some(false), "as recorded it runs out");
    let with = &w.whatif[0];
    assert_eq!(with.fits, Some(true), "{with:?}");
    assert!(with.exact);
    // The same program run with expandable segments on: its recorded peak.
    let job = Job::read(&JobOptions::new([root().join("fixtures/real-gpu/fragmentation-expandable")])).unwrap();
    let tl = &job.timelines[0];
    let second = Replay::new(&tl.devices[0], tl.settings.as_ref()).peak_reserved.0;
    let err = (with.peak_reserved_bytes as f64 - second as f64).abs() / second as f64;
    assert!(err < 0.05, "predicted {} vs recorded {second}", with.peak_reserved_bytes);
}

#[test]
fn the_standard_knobs_flip_expandable_segments_where_they_were_on() {
    let w = whatifs("fixtures/real-gpu/fragmentation-expandable", &Plan::default());
    let changes: Vec<&str> = w.whatif.iter().map(|w| w.change.as_str()).collect();
    assert!(changes.contains(&"expandable_segments:False"), "{changes:?}");
    assert!(!changes.iter().any(|c| c.starts_with("expandable_segments:True")), "{changes:?}");
    // No OOM and no cap in its files: the capacity is the GPU's, from nvidia-smi.
    assert_eq!(w.capacity.bytes, Some(85_520_809_984), "{:?}", w.capacity);
    assert_eq!(w.recorded.fits, Some(true));
}

#[test]
fn a_leak_left_out_fits_and_a_smaller_batch_is_searched() {
    let plan = Plan::parse(&[], &[], &["leaked_references.py:18".into()], None).unwrap();
    let w = whatifs("fixtures/real-gpu/leaked-references", &plan);
    assert_eq!(w.recorded.fits, Some(false));
    let without = &w.whatif[0];
    assert_eq!(without.fits, Some(true), "{without:?}");
    assert!(without.headroom_bytes.unwrap() > 1 << 30, "{without:?}");
    let plan = Plan::parse(&[], &["activation=auto".into()], &[], None).unwrap();
    let w = whatifs("fixtures/real-gpu/leaked-references", &plan);
    let scaled = &w.whatif[0];
    assert_eq!(scaled.fits, Some(true), "{scaled:?}");
    assert!(scaled.change.contains("the largest that fits"), "{}", scaled.change);
}

#[test]
fn whatif_json_has_the_contract_fields() {
    let out = oomdoc(&[
        "whatif",
        "fixtures/real-gpu/fragmentation",
        "--set",
        "expandable_segments:True",
        "--format",
        "json",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let w = &v["inputs"][0]["devices"][0]["whatif"][0];
    assert_eq!(w["change"], "expandable_segments:True");
    assert_eq!(w["fits"], true);
    assert_eq!(w["exact"], true);
    assert!(w["peak_reserved_bytes"].as_u64().unwrap() > 0);
    assert!(w["headroom_bytes"].as_i64().unwrap() > 0);
}

#[test]
fn whatif_refuses_what_it_cannot_model_with_a_clear_error() {
    for (args, says) in [
        (vec!["--set", "pinned_use_host_register:True"], "not an allocator setting the simulator models"),
        (vec!["--set", "max_split_size_mb:10"], "more than 20"),
        (vec!["--set", "expandable_segments"], "expected KEY:VALUE"),
        (vec!["--scale", "activations=0.5"], "is not a category"),
        (vec!["--drop-stack", "nowhere.py:1"], "no request in GPU 0's trace has that frame"),
    ] {
        let mut a = vec!["whatif", "fixtures/real-gpu/fragmentation", "--no-progress"];
        a.extend(args);
        let out = oomdoc(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}");
        assert!(crate::common::stderr(&out).contains(says), "{a:?}: {}", crate::common::stderr(&out));
    }
}

#[test]
fn validate_prints_one_row_per_gpu_and_the_count_exact() {
    let out = oomdoc(&["whatif", "--validate", "fixtures/real-gpu/fragmentation", "fixtures/real/decomfl-t29.pickle"]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("2 of 2 GPUs exact"), "{text}");
}

#[test]
fn the_guide_quotes_the_validation_table_as_the_command_prints_it() {
    // The shell's glob, as the README's command line gives it.
    let mut args: Vec<String> = ["whatif", "--validate", "--no-progress", "-f", "markdown"].map(String::from).to_vec();
    args.extend(fixtures("fixtures/real", ".pickle"));
    let mut dirs: Vec<String> =
        real_inputs().into_iter().filter(|i| i.starts_with("fixtures/real-gpu/")).map(|d| d + "/").collect();
    dirs.sort();
    args.extend(dirs);
    let out = oomdoc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success());
    let guide = std::fs::read_to_string(root().join("docs/GUIDE.md")).unwrap();
    assert!(
        guide.contains(&stdout(&out)),
        "docs/GUIDE.md's simulator table is not what the command prints:\n{}",
        stdout(&out)
    );
}

fn verdict_of(input: &str) -> serde_json::Value {
    let v = crate::common::analyze_json(&[input]);
    v["devices"].as_array().unwrap().iter().find(|d| d["oom"].is_object()).cloned().expect("a GPU that ran out")
}

fn proven(d: &serde_json::Value) -> Vec<String> {
    d["verdict"]["proven"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().map(|l| l.as_str().unwrap().to_string()).collect())
}

#[test]
fn the_verdict_proves_expandable_segments_on_the_real_fragmentation_oom() {
    // The script's last request fails: nothing in the trace says it was the last, so the replay proves that this OOM
    // is avoided, not that the run fits (the second capture, with the setting, did finish).
    let d = verdict_of("fixtures/real-gpu/fragmentation");
    assert_eq!(d["verdict"]["primary_rule"], "fragmentation");
    let lines = proven(&d);
    assert!(
        lines.iter().any(|l| l.starts_with(
            "avoids this OOM, not proven for the run: with expandable_segments:True the part recorded fits"
        ) && l.ends_with("what the run does after the failing request was never recorded")),
        "{lines:?}"
    );
    let w = d["whatif"].as_array().unwrap();
    assert!(
        w.iter()
            .any(|w| w["change"] == "expandable_segments:True" && w["fits"] == true && w["recorded_part_only"] == true),
        "{w:?}"
    );
}

/// The real runs of one Trainer OOM at other batches and settings (`fixtures/real-gpu/frameworks/trainer-batch-*`),
/// each the change a verdict proved: `(capture, change, the run that made it, whether that run finished)`. Batch 12's
/// ×0.75 is batch 9, which was not run: batch 8 ran out, so batch 9 would (memory grows with the batch).
const TRAINER_PAIRS: &[(&str, &str, &str, bool)] = &[
    ("trainer-batch-too-large", "activations ×0.75", "trainer-batch-12", false),
    ("trainer-batch-12", "expandable_segments:True", "trainer-batch-12-expandable", false),
    ("trainer-batch-12", "activations ×0.75", "trainer-batch-8", false),
    ("trainer-batch-8", "expandable_segments:True", "trainer-batch-8-expandable", true),
    ("trainer-batch-8", "activations ×0.75", "trainer-batch-6", true),
];

#[test]
fn the_whatif_command_says_a_first_step_trace_proves_only_its_recorded_part() {
    let json = |capture: &str| -> serde_json::Value {
        let dir = format!("fixtures/real-gpu/frameworks/{capture}/");
        let o = oomdoc(&["whatif", &dir, "--scale", "activation=0.75", "--format", "json", "--no-progress"]);
        assert!(o.status.success(), "{}", crate::common::stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let first = json("trainer-batch-too-large");
    let d = &first["inputs"][0]["devices"][0];
    assert_eq!(d["whatif"][0]["fits"], true);
    assert_eq!(d["whatif"][0]["recorded_part_only"], true);
    assert!(d["recorded_part_only"].as_str().unwrap().contains("was never recorded"), "{d}");
    // One whole step before its OOM: the replay's answer stands for the run.
    let second = json("trainer-batch-8");
    let d = &second["inputs"][0]["devices"][0];
    assert_eq!(d["whatif"][0]["fits"], true);
    assert!(d["whatif"][0].get("recorded_part_only").is_none() && d.get("recorded_part_only").is_none(), "{d}");
}

#[test]
fn a_replay_proves_a_remedy_only_where_the_trace_holds_a_whole_step_as_the_real_reruns_showed() {
    // Batch 16 and 12 ran out in the first forward: the replay fits the recorded part at ×0.75 and with expandable
    // segments, and the real runs at batch 12 (and 8) and with expandable segments still ran out later in the step.
    // Batch 8 ran one whole step, then ran out in the second backward: what its replay proved, the real runs did.
    let root = crate::common::root().join("fixtures/real-gpu/frameworks");
    for &(capture, change, rerun, finished) in TRAINER_PAIRS {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.join(rerun).join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta["outcome"] == "finished", finished, "{rerun}: {meta}");
        let d = verdict_of(&format!("fixtures/real-gpu/frameworks/{capture}/"));
        let line = proven(&d).into_iter().find(|l| l.contains(&format!("with {change}"))).expect(change);
        let prefix = if finished { "proven on this trace" } else { "avoids this OOM, not proven for the run" };
        assert!(line.starts_with(prefix), "{capture}, {change} (the real {rerun} finished: {finished}): {line}");
    }
}

#[test]
fn the_verdict_proves_the_leak_fix_and_refutes_a_smaller_batch_on_the_real_leaks() {
    for input in ["fixtures/real-gpu/leaked-references", "fixtures/real-gpu/one-line", "fixtures/real-gpu/oomdoc-run"] {
        let d = verdict_of(input);
        assert_eq!(d["verdict"]["primary_rule"], "leaked-references", "{input}");
        let lines = proven(&d);
        assert!(lines.iter().any(|l| l.contains("fixing the leak avoids this OOM")), "{input}: {lines:?}");
        // A smaller batch fits the recorded iterations but the leak keeps growing: refuted as the fix.
        assert!(
            lines.iter().any(|l| l.starts_with("refuted as the fix") && l.contains("runs out later, not never")),
            "{input}: {lines:?}"
        );
    }
}

#[test]
fn expandable_segments_are_refuted_as_the_fix_for_what_keeps_growing() {
    // Trainer.evaluate() concatenating every batch's logits on the GPU: the replay with expandable segments fits the
    // batches recorded, but the next copy is larger again (the OOM message itself suggests the setting).
    let d = verdict_of("fixtures/real-gpu/frameworks/trainer-eval-keeps-logits");
    assert_eq!(d["verdict"]["primary_rule"], "growing-buffer");
    let lines = proven(&d);
    assert!(
        lines.iter().any(|l| l.starts_with("refuted as the fix: with expandable_segments:True the recorded run fits")
            && l.ends_with("it runs out later, not never")),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("proven")), "{lines:?}");
    // Run with the setting on a real GPU, both growing captures still ran out.
    for (capture, rerun) in [
        ("trainer-eval-keeps-logits", "trainer-eval-keeps-logits-expandable"),
        ("timm-eval-many-passes", "timm-eval-many-passes-expandable"),
    ] {
        let meta = crate::common::root().join("fixtures/real-gpu/frameworks").join(rerun).join("meta.json");
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(meta).unwrap()).unwrap();
        assert_eq!(meta["outcome"], "oom", "{rerun}");
        assert_eq!(meta["alloc_conf"], "expandable_segments:True", "{rerun}");
        let lines = proven(&verdict_of(&format!("fixtures/real-gpu/frameworks/{capture}")));
        assert!(lines.iter().any(|l| l.starts_with("refuted as the fix: with expandable_segments:True")), "{lines:?}");
    }
}

#[test]
fn the_verdict_proves_its_remedies_on_the_generated_classes() {
    // Proven where the trace holds a whole pass of the loop before the OOM; where it ends in the first one (the
    // failing line never ran and freed before), only this OOM is avoided.
    let (whole, first) = ("proven on this trace", "avoids this OOM, not proven for the run");
    for (input, starts, says) in [
        ("fixtures/generated/rules/fragmentation-fire.pickle", first, "with expandable_segments:True"),
        ("fixtures/generated/verdict/class2-fragmentation-alone.pickle", first, "with expandable_segments:True"),
        ("fixtures/generated/verdict/class2-eval-without-no-grad.pickle", whole, "fixing the leak avoids this OOM"),
        (
            "fixtures/generated/verdict/class4-attention-25gib-request.pickle",
            first,
            "with activations ×0.75 (a smaller batch)",
        ),
        ("fixtures/generated/shapes/v2.14-labels.pickle", whole, "with activations ×0.75 (a smaller batch)"),
    ] {
        let lines = proven(&verdict_of(input));
        assert!(lines.iter().any(|l| l.starts_with(starts) && l.contains(says)), "{input}: {lines:?}");
    }
    // A growing KV cache: halving it fits the recorded run, but it keeps growing.
    let lines = proven(&verdict_of("fixtures/generated/rules/unbounded-kv-growth-fire-oom.pickle"));
    assert!(lines.iter().any(|l| l.starts_with("refuted as the fix") && l.contains("KV cache ×0.")), "{lines:?}");
}

#[test]
fn where_expandable_segments_were_on_the_verdict_does_not_recommend_them() {
    for input in
        ["fixtures/generated/shapes/v2.8-expandable-oom.pickle", "fixtures/generated/growth/kv-expandable-0.pickle"]
    {
        let v = crate::common::analyze_json(&[input]);
        assert_eq!(v["allocator_settings"]["expandable_segments"], true, "{input}");
        let said =
            serde_json::to_string(&(&v["findings"], &v["devices"][0]["verdict"], &v["devices"][0]["whatif"])).unwrap();
        assert!(!said.contains("expandable_segments:True"), "{input}: {said}");
    }
}

#[test]
fn the_blocks_that_pin_the_fragments_are_named_on_the_real_fragmentation_capture() {
    let d = verdict_of("fixtures/real-gpu/fragmentation");
    let p = &d["pinning"];
    // fragmentation.py keeps one 100 MiB tensor in each of 15 segments of 256 MiB: each pins the 156 MiB after it.
    assert_eq!(p["blocks"], 15, "{p}");
    assert_eq!(p["segments"], 15, "{p}");
    assert_eq!(p["pinned_free_bytes"].as_u64(), Some((15 * 156) << 20), "{p}");
    let top = &p["by_stack"][0];
    assert!(top["stack"].as_str().unwrap().contains("fragmentation.py:15"), "{top}");
    assert_eq!(top["blocks"], 15);
    assert!(top["youngest_age_us"].as_i64().unwrap() > 0, "{top}");
    // The worst moment is the OOM's stretch, just before it.
    let worst = &p["worst_moments"][0];
    let oom = d["oom"]["event_index"].as_u64().unwrap();
    assert!(worst["event_index"].as_u64().unwrap() + 2 >= oom, "{worst} vs OOM at {oom}");
    // Where nothing was fragmented, nothing is said.
    assert!(verdict_of("fixtures/real-gpu/leaked-references")["pinning"].is_null());
}

#[test]
fn the_replay_samples_the_free_memory_a_replay_up_to_the_oom_finds() {
    use oomdoc::analysis::fragments::free_samples_replayed;
    use oomdoc::timeline::Action;
    // From an empty device, from a rebuilt start (the trace wrapped), and a trace with no OOM (nothing sampled).
    let (mut sampled, mut rebuilt) = (0, 0);
    for input in [
        "fixtures/real-gpu/fragmentation",
        "fixtures/generated/rules/fragmentation-fire.pickle",
        "fixtures/generated/dialects/cuda-trace-overflowed.pickle",
        "fixtures/real-gpu/leaked-references",
    ] {
        let job = Job::read(&JobOptions::new([root().join(input)])).unwrap();
        for tl in &job.timelines {
            for dev in &tl.devices {
                let replay = Replay::new(dev, tl.settings.as_ref());
                let n = dev.events.iter().rposition(|e| e.action == Action::Oom).map_or(0, |i| i + 1);
                match replay.free_samples(n) {
                    Some(s) => {
                        assert_eq!(s, &free_samples_replayed(&replay, n)[..], "{input}: GPU {}", dev.device);
                        assert_eq!(s.len(), n / n.div_ceil(256), "{input}");
                        sampled += 1;
                        rebuilt += usize::from(!replay.complete());
                    }
                    None => assert_eq!(n, 0, "{input}: an OOM at event {} unsampled", n - 1),
                }
                assert!(replay.free_samples(n.saturating_sub(1)).is_none());
            }
        }
    }
    assert!(sampled >= 3 && rebuilt >= 1, "{sampled} sampled, {rebuilt} from a rebuilt start");
}

#[test]
fn the_html_marks_the_pinning_blocks_and_the_worst_moment() {
    let out = oomdoc(&["analyze", "fixtures/real-gpu/fragmentation", "--format", "html", "--no-progress"]);
    assert!(out.status.success());
    let html = stdout(&out);
    assert_eq!(html.matches("<rect class=\"blk-pin\"").count(), 15);
    assert!(html.contains(">most fragmented</text>"));
    assert!(html.contains("live blocks pinning free memory"));
}

#[test]
fn a_state_only_dump_has_nothing_to_replay_and_says_so() {
    // torch wrote the final segments and no trace: there are no requests to replay.
    for input in ["fixtures/real/docubox-stateonly.pickle", "fixtures/real/attention-stateonly-frag.pickle"] {
        let out = oomdoc(&["whatif", input, "--no-progress"]);
        assert_eq!(out.status.code(), Some(2), "{input}");
        assert!(crate::common::stderr(&out).contains("no input holds an allocator trace"), "{input}");
    }
}

/// Simulates every device of `input` with and without skips, under the recorded settings and others, with a
/// capacity that makes requests fail and with edited requests, and asserts the outcomes (segment events included)
/// equal. Returns the share of its ops skipped, and passed over as windows that give back all they take, under the
/// recorded settings (the most of its devices).
fn skipping_changes_nothing(input: &str) -> (f64, f64) {
    use oomdoc::timeline::simulator::{self, Edit, Workload};
    let (mut skipped, mut passed) = (0f64, 0f64);
    let job = Job::read(&JobOptions::new([root().join(input)])).unwrap();
    for tl in &job.timelines {
        for dev in tl.devices.iter().filter(|d| !d.events.is_empty()) {
            let replay = Replay::new(dev, tl.settings.as_ref());
            let w = Workload::from_trace(&replay);
            // The analysis reads the workload beside the replay, before it knows whether the trace starts on an
            // empty device: where it does, that read is the same workload.
            // Where it does not, the read ahead stops, but for segments made before the trace (the replay's to tell).
            let (gpu, c) = (dev.device, &replay.completeness);
            match (Workload::from_empty_start(dev), replay.complete()) {
                (Some(ahead), true) => {
                    assert!(format!("{ahead:?}") == format!("{w:?}"), "{input} GPU {gpu}: read ahead differs")
                }
                (None, true) => panic!("{input} GPU {gpu}: a complete trace read ahead stopped"),
                (Some(_), false) => {
                    assert!(c.frees_without_alloc + c.live_without_alloc == 0, "{input} GPU {gpu}: not stopped: {c:?}")
                }
                (None, false) => {}
            }
            let cap = whatif::capacity(tl, dev, &replay, None, None);
            let base = whatif::recorded_config(tl, &replay, &cap);
            let mut configs = vec![base.clone()];
            let mut flipped = base.clone();
            flipped.rules.expandable = !base.rules.expandable;
            configs.push(flipped);
            let mut split = base.clone();
            split.rules.max_split_size = Some(64 << 20);
            configs.push(split);
            let mut rounded = base.clone();
            rounded.rules.divisions = vec![(0, 4)];
            configs.push(rounded);
            let mut tight = base.clone();
            tight.follow_refusals = false;
            tight.capacity = Some(replay.peak_reserved.0 * 9 / 10);
            configs.push(tight);
            let edits: [&dyn Fn(u32, u64) -> Edit; 3] = [
                &|_, _| Edit::Keep,
                &|stack, size| if stack % 3 == 0 { Edit::Resize(size / 2) } else { Edit::Keep },
                &|stack, _| if stack % 7 == 1 { Edit::Drop } else { Edit::Keep },
            ];
            for (c, cfg) in configs.into_iter().enumerate() {
                for (e, edit) in edits.iter().enumerate() {
                    let mut fast = simulator::simulate_with(&w, cfg.clone(), true, edit);
                    let slow = simulator::simulate_every_op(&w, cfg.clone(), true, edit);
                    assert_eq!((slow.ops_skipped, slow.ops_passed_over), (0, 0));
                    if (c, e) == (0, 0) {
                        skipped = skipped.max(fast.ops_skipped as f64 / w.ops.len().max(1) as f64);
                        passed = passed.max(fast.ops_passed_over as f64 / w.ops.len().max(1) as f64);
                    }
                    (fast.ops_skipped, fast.ops_passed_over, fast.pool_passes_stopped) = (0, 0, 0);
                    assert!(
                        fast == slow,
                        "{input} GPU {}, config {c}, edit {e}: {fast:?}\nop by op: {slow:?}",
                        dev.device
                    );
                    // Asked only whether it fits, the run stops at its first failure: the same answer, the same
                    // first failure, and where nothing fails the same run.
                    let cfg = simulator::Config { stop_at_first_failure: true, ..cfg.clone() };
                    let stopped = simulator::simulate_with(&w, cfg, false, edit);
                    let answer = |o: &simulator::Outcome| (o.fits(), o.first_failure, o.failures.min(1));
                    assert_eq!(answer(&stopped), answer(&slow), "{input} GPU {}, config {c}, edit {e}", dev.device);
                    if slow.fits() {
                        assert_eq!(stopped.peak_reserved, slow.peak_reserved, "{input} config {c}, edit {e}");
                    }
                }
            }
        }
    }
    (skipped, passed)
}

/// The simulation skips the windows of a repeated stretch that would leave the allocator as it found it (a
/// steady training or evaluation loop). Skipping must change nothing, on every real and generated trace.
#[test]
fn skipping_repeated_windows_changes_no_outcome_on_any_trace() {
    let mut traces = 0;
    let mut skipped_in = std::collections::BTreeSet::new();
    let mut generated = Vec::new();
    let mut dirs = vec![root().join("fixtures/generated")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(|e| e.ok()) {
            let path = e.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().unwrap().to_string_lossy().contains(".pickle") {
                generated.push(path.strip_prefix(root()).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    generated.sort();
    for input in real_inputs().into_iter().chain(generated) {
        let (skipped, _) = skipping_changes_nothing(&input);
        traces += 1;
        if skipped > 0.0 {
            skipped_in.insert(input.clone());
        }
    }
    eprintln!("{traces} inputs; windows skipped in {}: {skipped_in:?}", skipped_in.len());
    assert!(skipped_in.len() >= 8, "the skip was exercised on {} traces only: {skipped_in:?}", skipped_in.len());
}

/// A run whose sequence length changes every step repeats no window, but comes back to a few steps in any order:
/// each step gives back all it takes, and one alike to a step simulated from the same state is passed over. On the
/// bench's generated trace of that shape (and on its wrapped variant) most ops are passed over and nothing changes.
/// Where each step's batch is carried into the next (made before the last one's is freed), the small pool's state
/// never comes again but the large pool's does: its ops are passed over, and again most ops.
#[test]
fn steps_alike_to_one_simulated_are_passed_over_and_change_no_outcome() {
    for (tag, wrap, carry) in [("varlen", "0", false), ("varlen-wrapped", "0.5", false), ("varlen-carry", "0", true)] {
        let file = std::env::temp_dir().join(format!("oomdoc-passes-{tag}-{}.pickle", std::process::id()));
        let out = std::process::Command::new("python3")
            .args(["bench/gen_bench_snapshot.py", "--variant", "real", "--entries", "200000", "--wrap", wrap])
            .args(carry.then_some("--carry-batch"))
            .arg("-o")
            .arg(&file)
            .current_dir(root())
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (skipped, passed) = skipping_changes_nothing(&file.to_string_lossy());
        std::fs::remove_file(&file).ok();
        assert!(passed > 0.5, "{tag}: {:.0}% of the ops passed over", passed * 100.0);
        assert!(skipped >= passed);
    }
}
