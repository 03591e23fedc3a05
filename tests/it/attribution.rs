//! What holds each byte: the category patterns' misfires (a file's name decides nothing; a parameter is what a
//! constructor or DataParallel's replicate makes), and the inference where the capture recorded no stack, on real
//! snapshots and on copies degraded as torch would have written them (bench/attribution.py measures all of them).

use crate::common;
use oomdoc::analysis::attribution::label_category;
use oomdoc::analysis::categories::Categorizer;
use oomdoc::timeline::stacks::Frame;
use oomdoc::timeline::Timeline;
use serde_json::Value;

/// The category of a stack given innermost first as (file, function).
fn category(frames: &[(&str, &str)]) -> &'static str {
    let mut tl = Timeline::default();
    let ids: Vec<u32> = frames
        .iter()
        .map(|(file, func)| {
            let f = Frame { filename: tl.strings.intern(file), name: tl.strings.intern(func), line: 1 };
            tl.stacks.intern_frame(f)
        })
        .collect();
    let stack = tl.stacks.intern_stack(&ids);
    Categorizer::builtin().classify(&tl, stack)
}

#[test]
fn dataparallel_replicas_are_parameters_not_gradients() {
    let replicate = [
        ("/usr/lib/python3.12/site-packages/torch/nn/parallel/comm.py", "broadcast_coalesced"),
        ("/usr/lib/python3.12/site-packages/torch/nn/parallel/_functions.py", "forward"),
        ("/usr/lib/python3.12/site-packages/torch/autograd/function.py", "apply"),
        ("/usr/lib/python3.12/site-packages/torch/nn/parallel/replicate.py", "_broadcast_coalesced_reshape"),
        ("/usr/lib/python3.12/site-packages/torch/nn/parallel/data_parallel.py", "replicate"),
        ("train.py", "main"),
    ];
    assert_eq!(category(&replicate), "parameter");
    // A custom autograd Function's forward runs in torch/autograd/function.py too: that file alone is no backward,
    // and the allocating line is the user's own.
    assert_eq!(category(&[("ops.py", "forward_impl"), ("/x/torch/autograd/function.py", "apply")]), "user_tensor");
}

#[test]
fn a_scripts_name_decides_nothing() {
    // The user's own lines, outside any model, optimizer or library: the user's tensors, whatever the script is named.
    assert_eq!(category(&[("/home/u/nccl_bench.py", "body"), ("/home/u/nccl_bench.py", "<module>")]), "user_tensor");
    assert_eq!(category(&[("/home/u/run.py", "test_nccl_speed")]), "user_tensor");
    // NCCL's own frames still are communication.
    let c10d = [("/x/torch/distributed/distributed_c10d.py", "all_reduce"), ("train.py", "main")];
    assert_eq!(category(&c10d), "communication");
    // A training loop's function named `step` is not an optimizer.
    assert_eq!(category(&[("run.py", "step"), ("run.py", "main")]), "user_tensor");
    // Library frames alone say nothing of whose tensor it is.
    assert_eq!(category(&[("/x/site-packages/somelib/io.py", "load")]), "unknown");
}

#[test]
fn a_user_written_parameter_and_optimizer_state_are_named() {
    // A hand-written Linear: the allocating line is in its constructor.
    let linear = [("cs336_basics/model.py", "__init__"), ("cs336_basics/model.py", "__init__"), ("train.py", "main")];
    assert_eq!(category(&linear), "parameter");
    // What a constructor calls further in is judged by its own line: a warm-up forward stays activation.
    let warmup = [("model.py", "forward"), ("model.py", "warm_up"), ("trainer.py", "__init__")];
    assert_eq!(category(&warmup), "activation");
    // A hand-written optimizer's state, made where optimizers make it.
    assert_eq!(
        category(&[("my_adam.py", "_init_group"), ("my_adam.py", "step"), ("train.py", "main")]),
        "optimizer_state"
    );
}

fn json(args: &[&str]) -> Value {
    let o = common::oomdoc(args);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn by_category(d: &Value) -> Vec<(String, u64)> {
    d["by_category"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["category"].as_str().unwrap().to_string(), c["bytes"].as_u64().unwrap()))
        .collect()
}

const GIB: f64 = (1u64 << 30) as f64;

#[test]
fn blocks_from_before_recording_are_the_parameters_and_their_adam_moments() {
    // Recording began after the model was built and after a step: 878 blocks (38.5 GiB) have no stack. The backward
    // in the trace allocates 12.8 GiB of gradients, one per parameter; the blocks from before repeat their sizes
    // three times: the parameters and AdamW's two moments.
    let v = json(&[
        "analyze",
        "--format",
        "json",
        "--at",
        "end",
        "fixtures/attribution/cs336-aimetrics-2.7b-train-fp32-70gb.pickle",
    ]);
    let d = &v["devices"][0];
    let cats = by_category(d);
    let get = |c: &str| cats.iter().find(|(n, _)| n == c).map_or(0, |(_, b)| *b) as f64 / GIB;
    assert!((get("parameter") - 12.8).abs() < 0.2, "{cats:?}");
    assert!((get("optimizer_state") - 25.6).abs() < 0.3, "{cats:?}");
    assert!((get("gradient") - 12.8).abs() < 0.2, "{cats:?}");
    assert_eq!(get("unknown"), 0.0, "{cats:?}");
    // The verdict names the holder and how it was known, not "no recorded stack".
    let summary = d["verdict"]["summary"].as_str().unwrap();
    assert!(summary.contains("optimizer state (25.6 GiB), inferred: allocated before recording"), "{summary}");
    assert_eq!(d["verdict"]["holder"]["source"], "inferred");
    // Every view says how the bytes were known: the text's `by kind` and the HTML page's table.
    let path = "fixtures/attribution/cs336-aimetrics-2.7b-train-fp32-70gb.pickle";
    let text = String::from_utf8(common::oomdoc(&["analyze", "--at", "end", path]).stdout).unwrap();
    assert!(text.contains("optimizer state 25.6 GiB (50%, inferred)"), "{text}");
    let html = std::env::temp_dir().join(format!("oomdoc-attribution-{}.html", std::process::id()));
    common::oomdoc(&["analyze", "--at", "end", path, "-o", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    let _ = std::fs::remove_file(&html);
    assert!(page.contains(
        "<td>optimizer state</td><td class=\"num\">25.6 GiB</td><td class=\"num\">50%</td><td>inferred</td>"
    ));
    // Each inferred byte says how it was inferred, and the JSON says which source named it.
    let rows = d["by_stack"].as_array().unwrap();
    let inferred: Vec<&Value> = rows.iter().filter(|r| r["source"] == "inferred").collect();
    assert!(!inferred.is_empty() && inferred.iter().all(|r| r["inferred_from"].is_string()), "{rows:?}");
    let opt = d["by_category"].as_array().unwrap().iter().find(|c| c["category"] == "optimizer_state").unwrap();
    assert_eq!(opt["source_bytes"]["inferred"], opt["bytes"]);
    // The capture advice names the cause the file shows (recording began late), not stacks="python".
    let notes = d["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect::<Vec<_>>().join("\n");
    assert!(notes.contains("made before recording began") && notes.contains("before the model is built"), "{notes}");
    assert!(!notes.contains("Record with _record_memory_history(context=\"all\", stacks=\"python\")"), "{notes}");
}

#[test]
fn the_backwards_temporaries_are_activations_and_its_weight_gradients_gradients() {
    // stacks="all": every backward allocation passes through the autograd engine's frames. Those with a
    // parameter's size are its gradients; the rest (an activation's gradient, a temporary) are activations.
    let v = json(&["analyze", "--format", "json", "--at", "end", "fixtures/real/cs336-kk-fullstep-57gb.pickle"]);
    let d = &v["devices"][0];
    let rows = d["by_stack"].as_array().unwrap();
    let engine: Vec<&Value> =
        rows.iter().filter(|r| r["callers"].as_str().unwrap().contains("C++ frames only")).collect();
    assert!(engine.iter().any(|r| r["category"] == "gradient"), "{engine:?}");
    let cats = by_category(d);
    let get = |c: &str| cats.iter().find(|(n, _)| n == c).map_or(0, |(_, b)| *b) as f64 / GIB;
    assert!((get("gradient") - 12.8).abs() < 0.2 && (get("parameter") - 12.8).abs() < 0.2, "{cats:?}");
}

#[test]
fn a_state_only_dump_of_unrelated_sizes_stays_unknown() {
    // No history, no frames, sizes with no parameter's copies among them: nothing decides, so nothing is claimed.
    let v = json(&["analyze", "--format", "json", "fixtures/attribution/eqpost-oom-observer-state.pickle"]);
    let cats = by_category(&v["devices"][0]);
    assert_eq!(cats.len(), 1, "{cats:?}");
    assert_eq!(cats[0].0, "unknown");
    // What the file lacks is a history: that is how to record next time, not a remedy for the memory.
    let verdict = &v["devices"][0]["verdict"];
    assert!(verdict["remedies"].as_array().unwrap().is_empty(), "{verdict}");
    let advice = verdict["capture_advice"].as_str().unwrap();
    assert!(advice.contains("_record_memory_history(max_entries="), "{advice}");
}

#[test]
fn a_state_dump_whose_unknown_blocks_lack_the_stacks_others_have_advises_recording_earlier() {
    // A segment list with stacks on 1.1 GiB of its blocks and none on 2.0 GiB (its CLIP token embedding among them,
    // loaded before recording): the advice is to start recording before the model is built, not to record stacks.
    let v = json(&["analyze", "--format", "json", "fixtures/real/layoutedit-legacy-segment-list.pickle"]);
    let verdict = &v["devices"][0]["verdict"];
    assert_eq!(verdict["holder"]["category"], "unknown");
    let summary = verdict["summary"].as_str().unwrap();
    assert!(summary.contains("has no recorded stack (made before recording began"), "{summary}");
    assert!(!summary.contains("record stacks"), "{summary}");
    let advice = verdict["capture_advice"].as_str().unwrap();
    assert!(advice.contains("before the model is built"), "{advice}");
    assert!(verdict["remedies"].as_array().unwrap().is_empty(), "{verdict}");
}

#[test]
fn labels_name_the_category_where_they_say_it_and_the_module_and_phase_in_the_verdict() {
    assert_eq!(label_category("optimizer"), Some("optimizer_state"));
    assert_eq!(label_category("saved_for_backward"), Some("activation"));
    assert_eq!(label_category("model.layers.17.mlp"), None);
    assert_eq!(label_category("model.embed_tokens"), None);
    assert_eq!(label_category("past_key_values cache"), Some("kv_cache"));
    // Component tracking's labels (the module during its forward and backward, "optimizer" during the step) and
    // an annotate entry, generated in torch 2.14's key shape.
    let v = json(&["analyze", "--format", "json", "fixtures/generated/shapes/v2.14-labels.pickle"]);
    let d = &v["devices"][0];
    let summary = d["verdict"]["summary"].as_str().unwrap();
    assert!(summary.contains("activations of `model.layers.3.mlp` in the forward"), "{summary}");
    assert_eq!(d["verdict"]["holder"]["module"], "model.layers.3.mlp");
    assert_eq!(d["verdict"]["holder"]["phase"], "forward");
    // The optimizer's state is known by its label, whatever its stack says.
    let opt = d["by_category"].as_array().unwrap().iter().find(|c| c["category"] == "optimizer_state").unwrap();
    assert_eq!(opt["source_bytes"]["label"], opt["bytes"], "{opt}");
    // The activation annotated as saved for the backward is an activation by its label.
    let act = d["by_category"].as_array().unwrap().iter().find(|c| c["category"] == "activation").unwrap();
    assert!(act["source_bytes"]["label"].as_u64().unwrap() > 0, "{act}");
}

#[test]
fn the_backwards_frameless_allocations_under_stacks_python_are_gradients_by_size_and_the_advice_says_why() {
    // A real H100 capture with stacks="python": the autograd thread records no frame.
    let v = json(&["analyze", "--format", "json", "fixtures/real-gpu/leaked-references/snapshot.pickle"]);
    let d = &v["devices"][0];
    let grad = d["by_category"].as_array().unwrap().iter().find(|c| c["category"] == "gradient").unwrap();
    assert_eq!(grad["source_bytes"]["inferred"], grad["bytes"], "{grad}");
    let notes = d["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect::<Vec<_>>().join("\n");
    assert!(notes.contains("with stacks=\"python\" the autograd thread's backward records none"), "{notes}");
    assert!(!notes.contains("made before recording began"), "{notes}");
}

#[test]
fn a_trace_recorded_without_any_stack_reads_its_blocks_from_their_lifetimes_not_from_the_backward() {
    // context=None: no frame anywhere. The backward's inference by size needs other allocations with frames, so the
    // note must not claim it; what each block was to the loop (built first, a pass's working memory, kept from pass
    // to pass) is read from its lifetime, inferred and said so, and names what the program held most of.
    let dir = common::generate("fixtures/gen_programs.py", "frameless", &["--n", "12", "--seed", "1"]);
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let cases = manifest.as_array().unwrap();
    // A whole trace: blocks from before a late start are judged by their own principle (lifetime and size).
    let case = cases
        .iter()
        .find(|c| c["stacks"] == "none" && c["outcome"] == "oom" && c["trace"] == "whole")
        .expect("a frameless OOM, whole");
    let path = dir.join(case["file"].as_str().unwrap());
    let v = json(&["analyze", "--format", "json", "--no-progress", path.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    let d = &v["devices"][0];
    let notes = d["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect::<Vec<_>>().join("\n");
    assert!(notes.contains("the capture recorded no stacks (context=None); record with context=\"all\""), "{notes}");
    assert!(notes.contains("read from their lifetimes in the loop's passes"), "{notes}");
    assert!(!notes.contains("taken as its gradients"), "{notes}");
    let cats = by_category(d);
    assert!(cats.iter().all(|(c, _)| c != "gradient" && c != "unknown"), "{cats:?}");
    for c in d["by_category"].as_array().unwrap() {
        assert_eq!(c["source_bytes"]["inferred"], c["bytes"], "{c}");
    }
    let most = cats.iter().max_by_key(|(_, b)| *b).map(|(c, _)| c.as_str());
    assert_eq!(most, case["holder"].as_str(), "{cats:?} in {}", case["file"]);
}

/// `by_category` at the end of a degraded real file, in MiB.
fn degraded(name: &str) -> Vec<(String, u64)> {
    let path = format!("fixtures/attribution/degraded/{name}");
    let v = json(&["analyze", "--format", "json", "--at", "end", "--no-progress", &path]);
    by_category(&v["devices"][0]).into_iter().map(|(c, b)| (c, b >> 20)).collect()
}

fn mib(cats: &[(String, u64)], c: &str) -> u64 {
    cats.iter().find(|(n, _)| n == c).map_or(0, |(_, b)| *b)
}

#[test]
fn blocks_the_trace_was_still_freeing_at_its_end_are_transient_not_the_model() {
    // The last quarter of a backward: it frees the forward's saved tensors, made before recording, until the trace
    // ends. Those still held are activations (4,700 MiB in the full file), the weights parameters (3,814 MiB).
    let cats = degraded("hyperion-late0.75.pickle.xz");
    assert!(mib(&cats, "activation").abs_diff(4700) < 150, "{cats:?}");
    assert!(mib(&cats, "parameter").abs_diff(3814) < 150, "{cats:?}");
}

#[test]
fn a_lone_block_from_before_recording_of_a_size_the_trace_makes_only_as_the_users_is_the_users() {
    // The step's 32 MiB intermediate (the script's own line), made before the cut, is the only block of its size
    // among those kept from before (the hand-made weights and the kept summaries share one size), and the trace
    // makes its size every step as the script's own tensor: the user's, as the full file says (416 MiB of user
    // tensors, no parameter).
    let cats = degraded("varlen-1.25-late0.5.pickle.xz");
    assert_eq!(mib(&cats, "parameter"), 0, "{cats:?}");
    assert_eq!(mib(&cats, "user_tensor"), 416, "{cats:?}");
}

#[test]
fn blocks_of_a_size_the_trace_keeps_as_two_kinds_are_shared_as_it_keeps_them() {
    // Each step keeps its output (activations of the model's lines) and a copy the script makes, all 32 MiB; of the
    // 4,440 kept, 4,098 are activations and 342 the script's (10,944 MiB) in the full file. The trace keeps them in
    // the same mix, and those from before the cut are shared in it (all called activation before: 5.7% wrong).
    let cats = degraded("one-line-late0.75.pickle.xz");
    assert!(mib(&cats, "user_tensor").abs_diff(10944) <= 128, "{cats:?}");
    assert!(mib(&cats, "activation").abs_diff(131169) <= 128, "{cats:?}");
}

#[test]
fn a_real_capture_with_no_frame_is_read_from_the_lifetimes_in_its_loop() {
    // context=None on two real captures. A loop whose steps keep their outputs, graph and all: what each step kept
    // is read as kept from pass to pass with the rest of its step (131,169 MiB of activations and the script's
    // 10,944 MiB copies in the full file, one size for both: activation for all of it here), the model built before
    // the loop as parameters. An inference loop: the model built before its passes (9,827 MiB of parameters).
    let cats = degraded("one-line-none.pickle.xz");
    assert!(mib(&cats, "activation").abs_diff(131169 + 10944) <= 256, "{cats:?}");
    assert!(mib(&cats, "parameter") < 300 && mib(&cats, "unknown") == 0, "{cats:?}");
    let cats = degraded("rr-infer-none.pickle.xz");
    assert!(mib(&cats, "parameter").abs_diff(9827) < 100, "{cats:?}");
    assert!(cats.iter().all(|(c, b)| c == "parameter" || *b < 64), "{cats:?}");
}

#[test]
fn weights_sharing_a_size_with_freed_tensors_stay_parameters() {
    // Three blocks of the weights' size, made before recording, are freed as the trace begins; the trace then runs
    // thousands of events without freeing another: the 96 it kept all along are the model (6,301 MiB).
    let cats = degraded("lilysu-late0.25.pickle.xz");
    assert!(mib(&cats, "parameter").abs_diff(6301) < 20, "{cats:?}");
    assert!(mib(&cats, "activation") < 50, "{cats:?}");
}

#[test]
fn the_optimizers_lines_count_its_moments_per_parameter() {
    // AdamW's exp_avg and exp_avg_sq lines made half their blocks in the trace; the gradients were set to None after
    // the step. Two moments per parameter: 25,993 MiB of optimizer state and 13,157 MiB of parameters.
    let cats = degraded("sidsoc-train-late0.75.pickle.xz");
    assert!(mib(&cats, "optimizer_state").abs_diff(25993) < 400, "{cats:?}");
    assert!(mib(&cats, "parameter").abs_diff(13157) < 400, "{cats:?}");
    assert_eq!(mib(&cats, "gradient"), 0, "{cats:?}");
}

#[test]
fn the_backwards_gradients_count_the_parameters_when_every_moment_predates_recording() {
    // Nothing live shows a copy (the moments were all made before the cut, the gradients are freed), but the
    // backward in the trace held one gradient per parameter before each optimizer step: 862 MiB of AdamW state.
    let cats = degraded("labelled-modules-late0.5.pickle.xz");
    assert!(mib(&cats, "optimizer_state").abs_diff(862) < 40, "{cats:?}");
    assert!(mib(&cats, "parameter").abs_diff(437) < 40, "{cats:?}");
}

#[test]
fn a_lone_block_from_before_recording_in_a_layered_model_is_not_guessed() {
    // The ftcourse fine-tune recorded late: one 122 MiB block (the logits) of a size nothing else has and the trace
    // never made. The model kept from before is built in layers, so a lone size is as likely the data or the logits
    // as a weight: unknown, not a parameter. A one-layer model's lone sizes stay its weights (mlsys' nn.Linear).
    let v = json(&[
        "analyze",
        "--format",
        "json",
        "--at",
        "end",
        "--no-progress",
        "fixtures/attribution/degraded/ftcourse-late0.5.pickle.xz",
    ]);
    let cats: Vec<(String, u64)> = by_category(&v["devices"][0]).into_iter().map(|(c, b)| (c, b >> 20)).collect();
    assert_eq!(mib(&cats, "unknown"), 122, "{cats:?}");
    assert!(mib(&cats, "parameter").abs_diff(1053) < 40, "{cats:?}");
    assert!(mib(&cats, "activation").abs_diff(1008) < 40, "{cats:?}");
    let linear = degraded("mlsys-linear-late0.5.pickle.xz");
    assert_eq!(mib(&linear, "unknown"), 0, "{linear:?}");
    assert!(mib(&linear, "parameter") >= 1908, "{linear:?}");
}

#[test]
fn a_training_trace_reads_copies_from_the_counts_where_nothing_else_shows_them() {
    // The Trainer at batch 8 recorded from halfway through its first step: the parameters and AdamW's two moments
    // all predate the cut, and the trace ends inside the second step's backward, before any optimizer step. Each
    // size's count divides by three, and the trace shows the job training (the autograd engine's allocations): a
    // parameter and two moments each, 916 MiB of optimizer state and 458 MiB of weights, as the full file says.
    let cats = degraded("trainer-batch-8-late0.5.pickle.xz");
    assert!(mib(&cats, "optimizer_state").abs_diff(916) < 40, "{cats:?}");
    assert!(mib(&cats, "parameter").abs_diff(458) < 40, "{cats:?}");
    // An inference trace shows no backward: its model's per-layer counts divide by three or four as readily, and
    // the blocks from before it are its weights (the full file says 9.5 GiB of parameters).
    let infer = degraded("rr-infer-late0.5.pickle.xz");
    assert_eq!(mib(&infer, "optimizer_state") + mib(&infer, "gradient"), 0, "{infer:?}");
    assert!(mib(&infer, "parameter") >= 9700, "{infer:?}");
}

#[test]
fn a_state_only_dump_reads_copies_only_where_they_leave_a_layered_model() {
    // State-only copies (bench/attribution.py's `state` variant) of real captures. A Trainer OOM in its forward:
    // 80, 28, 24 and 32 blocks of the sizes that hold the memory divide by 4, but a copy would be 20, 7, 6 and 8 of
    // them, no model's layers; it is activations (7.4 GiB) and weights. JAX beside PyTorch: 4 blocks of 8 GiB and 4
    // of 256 MiB, one of each a copy. A GPT-2 trained with AdamW, 9 blocks of its embedding's size among 288 and 384
    // (one of them the logits): no factor leaves 24 layers behind. All three were read as an optimizer's copies.
    for name in ["trainer-batch-12-state.pickle.xz", "jax-preallocated-state.pickle.xz", "wl-train-state.pickle.xz"] {
        let cats = degraded(name);
        assert!(["optimizer_state", "gradient", "parameter"].iter().all(|c| mib(&cats, c) == 0), "{name}: {cats:?}");
    }
    // Where the copies are real, each keeps the model's layers (36, 2 and 48 a copy of 144, 8 and 192): AdamW's two
    // moments and the gradients, as the full file says (1,457, 728 and 728 MiB).
    let cats = degraded("bcrafton-state.pickle.xz");
    assert_eq!(
        (mib(&cats, "optimizer_state"), mib(&cats, "gradient"), mib(&cats, "parameter")),
        (1457, 728, 728),
        "{cats:?}"
    );
}

#[test]
fn a_trace_with_no_frame_reads_an_optimizers_copies_from_the_counts_and_a_later_steps_gradients_by_size() {
    // context=None on a real 2.7B AdamW step, recorded after the first step: the 877 blocks kept from before the
    // trace are the weights and their two moments (every size's count in threes, each third a layered model). With
    // no frame, nothing showed the job trains, and all 38.5 GiB were read as parameters (50% wrong); the full file
    // says 26,246 MiB of optimizer state and 13,132 of parameters. The step's own gradients, made by a later step
    // and kept with the weights' sizes in a job whose optimizer keeps copies, are gradients (13,131 MiB; unknown
    // before), one per parameter at most.
    let cats = degraded("aimetrics-none.pickle.xz");
    assert!(mib(&cats, "optimizer_state").abs_diff(26246) < 100, "{cats:?}");
    assert!(mib(&cats, "parameter").abs_diff(13132) < 100, "{cats:?}");
    assert!(mib(&cats, "gradient").abs_diff(13131) < 100, "{cats:?}");
    assert!(mib(&cats, "unknown") < 100, "{cats:?}");
}

#[test]
fn blocks_a_script_was_letting_go_of_are_its_own_where_its_request_that_ran_out_is() {
    // The last quarter of the fragmentation capture: the script frees every second 100 MiB tensor it made before
    // the cut, then asks for 400 MiB at its own line and runs out. Nothing in the trace is allocated; the request
    // that failed is the script's own tensor, and so are the 15 blocks it kept (1,500 MiB of user tensors in the
    // full file), not a model's activations (100% wrong before).
    let cats = degraded("fragmentation-late0.75.pickle.xz");
    assert_eq!(mib(&cats, "user_tensor"), 1500, "{cats:?}");
    assert_eq!(mib(&cats, "activation"), 0, "{cats:?}");
}
