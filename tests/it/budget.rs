//! `oomdoc budget` and `oomdoc analyze --model`: the worked numbers of issue 8 reproduced exactly from the formulas,
//! parameter counts from real config.json files, the solver's proposals for the three documented scenarios, the
//! JSON contract, errors, and predicted-vs-measured on a real snapshot.

use crate::common;

use clap::Parser;
use common::{oomdoc, stderr, stdout, TempFile};
use oomdoc::budget::args::BudgetArgs;
use oomdoc::budget::{predicted, Budget};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BudgetArgs,
}

/// Plans a budget from command-line words (tests run in the crate root, where the fixture paths resolve).
fn plan(args: &str) -> Budget {
    let cli = Cli::try_parse_from(std::iter::once("budget").chain(args.split_whitespace()))
        .unwrap_or_else(|e| panic!("{args}: {e}"));
    oomdoc::budget::args::budget(&cli.args).unwrap_or_else(|e| panic!("{args}: {e}"))
}

fn item(b: &Budget, name: &str) -> u64 {
    b.items.iter().find(|i| i.name == name).unwrap_or_else(|| panic!("no item {name:?}")).bytes
}

fn model_states(b: &Budget) -> u64 {
    oomdoc::budget::model_states(b)
}

const LLAMA2_7B: &str = "fixtures/models/Llama-2-7b-hf.json";
const LLAMA3_8B: &str = "fixtures/models/Meta-Llama-3-8B.json";
const LLAMA31_8B: &str = "fixtures/models/Llama-3.1-8B.json";
const LLAMA3_70B: &str = "fixtures/models/Meta-Llama-3-70B.json";

// ---- The worked numbers (decimal GB = 1e9 bytes) ----

#[test]
fn adamw_mixed_precision_7b_is_112_gb() {
    // 2 (bf16 weights) + 2 (bf16 gradients) + 4 (fp32 master) + 4 + 4 (fp32 Adam moments) = 16 bytes per parameter.
    let b = plan("--params 7e9 --train");
    assert_eq!(item(&b, "weights"), 14_000_000_000);
    assert_eq!(item(&b, "gradients"), 14_000_000_000);
    assert_eq!(item(&b, "master weights"), 28_000_000_000);
    assert_eq!(item(&b, "optimizer states"), 56_000_000_000);
    assert_eq!(model_states(&b), 112_000_000_000);
    assert_eq!(oomdoc::units::gb(model_states(&b)), "112.0 GB");
    // torch.autocast puts the 16 bytes elsewhere (fp32 weights and gradients, no separate master copy), same sum.
    assert_eq!(model_states(&plan("--params 7e9 --train --mixed-precision amp")), 112_000_000_000);
}

#[test]
fn zero1_on_8_gpus_is_38_5_gb_per_gpu() {
    // ZeRO-1 shards the 12 bytes of optimizer state and master weights: 2 + 2 + 12/8 = 5.5 bytes per parameter.
    let b = plan("--params 7e9 --train --zero 1 --gpus 8");
    assert_eq!(model_states(&b), 38_500_000_000);
    assert_eq!(oomdoc::units::gb(model_states(&b)), "38.5 GB");
    // ZeRO-2 also shards the gradients: 2 + 14/8.
    assert_eq!(model_states(&plan("--params 7e9 --train --zero 2 --gpus 8")), 26_250_000_000);
}

#[test]
fn zero3_on_8_gpus_is_14_gb_per_gpu() {
    let b = plan("--params 7e9 --train --zero 3 --gpus 8");
    assert_eq!(model_states(&b), 14_000_000_000);
    assert_eq!(oomdoc::units::gb(model_states(&b)), "14.0 GB");
    assert_eq!(model_states(&plan("--params 7e9 --train --fsdp --gpus 8")), 14_000_000_000);
}

/// What a person knows — "7B, AdamW, mixed precision" — gives the model states whatever part of the shape comes with
/// it (issue 22): none, the sheet's first example (layers, hidden, heads, KV heads), or layers alone.
#[test]
fn a_parameter_count_alone_or_with_part_of_the_shape_gives_the_model_states() {
    let partial = [
        "",
        "--layers 32 --hidden 4096 --heads 32 --kv-heads 32 --batch 4 --seq 2048",
        "--layers 32",
        "--layers 32 --hidden 4096 --batch 4 --seq 2048",
    ];
    for shape in partial {
        for (params, run, expected) in [
            ("7e9", "--train --optimizer adamw", 112_000_000_000),
            ("7b", "--train --optimizer adamw --zero 1 --gpus 8", 38_500_000_000),
            ("7B", "--train --optimizer adamw --zero 3 --gpus 8", 14_000_000_000),
        ] {
            let b = plan(&format!("--params {params} {run} {shape}"));
            assert_eq!(model_states(&b), expected, "--params {params} {run} {shape}");
        }
    }
    // The sheet's first example: activations from layers and hidden size; the MLP width assumed and said so; the
    // logits left out with the flag that adds them.
    let b = plan("--params 7e9 --layers 32 --hidden 4096 --heads 32 --kv-heads 32 --train --batch 4 --seq 2048");
    assert_eq!(item(&b, "activations"), 32 * 34 * 2048 * 4 * 4096);
    assert!(b.items.iter().all(|i| i.name != "logits"));
    assert!(b.notes.iter().any(|n| n.contains("--vocab adds them")), "{:?}", b.notes);
    assert!(b.notes.iter().any(|n| n.contains("intermediate size of 11008")), "{:?}", b.notes);
    // The count alone: model states, and a line saying which flags add the rest.
    let b = plan("--params 7e9 --train");
    assert!(b.notes.iter().any(|n| n.contains("--layers and --hidden add the activations")), "{:?}", b.notes);
    // Exit 0 from the command line, each spelling.
    for p in ["7b", "7B", "6.7e9", "70b", "1.3B"] {
        let o = oomdoc(&["budget", "--params", p, "--layers", "32", "--hidden", "4096", "--train"]);
        assert_eq!(o.status.code(), Some(0), "{p}: {}", stderr(&o));
    }
    // A shape without the vocabulary cannot be counted: --params is the way out, and the error says so.
    let o = oomdoc(&["budget", "--layers", "32", "--hidden", "4096", "--heads", "32", "--train"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--vocab") && stderr(&o).contains("--params"), "{}", stderr(&o));
}

#[test]
fn llama2_7b_kv_cache_4096_by_32_is_68_7_gb() {
    // 2 (K and V) · 32 layers · 32 KV heads · 128 dims · 4096 tokens · 32 sequences · 2 bytes.
    let b = plan(&format!("--config {LLAMA2_7B} --infer --batch 32 --seq 4096 --dtype bf16"));
    assert_eq!(item(&b, "KV cache"), 2 * 32 * 32 * 128 * 4096 * 32 * 2);
    assert_eq!(item(&b, "KV cache"), 68_719_476_736);
    assert_eq!(oomdoc::units::gb(item(&b, "KV cache")), "68.7 GB");
}

#[test]
fn llama3_8b_gqa_kv_cache_is_17_2_gb() {
    // Grouped-query attention: 8 KV heads instead of 32, a quarter of Llama-2-7B's cache at the same shape.
    let b = plan(&format!("--config {LLAMA3_8B} --infer --batch 32 --seq 4096"));
    assert_eq!(item(&b, "KV cache"), 17_179_869_184);
    assert_eq!(oomdoc::units::gb(item(&b, "KV cache")), "17.2 GB");
}

#[test]
fn llama3_70b_kv_cache_8192_by_32_fp16_is_85_9_gb() {
    // 2 · 80 · 8 · 128 · 8192 · 32 · 2 bytes. Sheets that print ~42.9 GB here dropped the factor 2 for K and V.
    let b = plan(&format!("--config {LLAMA3_70B} --infer --batch 32 --seq 8192 --dtype fp16"));
    assert_eq!(item(&b, "KV cache"), 85_899_345_920);
    assert_eq!(oomdoc::units::gb(item(&b, "KV cache")), "85.9 GB");
    assert_ne!(item(&b, "KV cache"), 42_949_672_960, "the factor of 2 (K and V) must not be dropped");
    let kv = b.items.iter().find(|i| i.name == "KV cache").unwrap();
    assert_eq!(kv.formula, "2 · L · kv_heads · head_dim · T · B · bytes = 2·80·8·128·8192·32·2");
}

#[test]
fn parameter_counts_from_config_json() {
    let count = |path: &str| plan(&format!("--config {path} --train --batch 1 --seq 1")).parameters;
    // The must-show figures, and the exact integers Hugging Face's model.num_parameters() gives.
    assert_eq!(oomdoc::budget::model::count(count(LLAMA2_7B)), "6.738 B");
    assert_eq!(count(LLAMA2_7B), 6_738_415_616);
    assert_eq!(oomdoc::budget::model::count(count(LLAMA3_8B)), "8.030 B");
    assert_eq!(count(LLAMA3_8B), 8_030_261_248);
    assert_eq!(count(LLAMA31_8B), 8_030_261_248);
    assert_eq!(oomdoc::budget::model::count(count(LLAMA3_70B)), "70.55 B");
    assert_eq!(count(LLAMA3_70B), 70_553_706_496);
    // Beyond the must-show: sliding-window GQA, MoE, tied embeddings with q/k/v biases, GPT-2's biases and
    // LayerNorms and learned positions.
    assert_eq!(count("fixtures/models/Mistral-7B-v0.1.json"), 7_241_732_096);
    let mixtral = plan("--config fixtures/models/Mixtral-8x7B-v0.1.json --train --batch 1 --seq 1");
    assert_eq!(mixtral.parameters, 46_702_792_704);
    assert_eq!(mixtral.model.active_parameters, Some(12_879_925_248));
    assert_eq!(count("fixtures/models/Qwen2.5-0.5B.json"), 494_032_768);
    assert_eq!(count("fixtures/models/gpt2.json"), 124_439_808);
}

#[test]
fn flags_describe_the_same_model_as_its_config() {
    let flags = plan(
        "--layers 32 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 --infer --batch 32 \
         --seq 4096",
    );
    assert_eq!(flags.parameters, 8_030_261_248);
    assert_eq!(item(&flags, "KV cache"), 17_179_869_184);
    // Flags override the config.
    let b = plan(&format!("--config {LLAMA3_8B} --kv-heads 32 --infer --batch 32 --seq 4096"));
    assert_eq!(item(&b, "KV cache"), 68_719_476_736);
}

// ---- The formulas ----

#[test]
fn activations_follow_korthikanti() {
    // s·b·h·(34 + 5·a·s/h) bytes per layer with 16-bit activations; FlashAttention drops the score term; full
    // checkpointing keeps 2·s·b·h per layer plus one layer being recomputed.
    let (s, b, h, a, l) = (4096u64, 4u64, 4096u64, 32u64, 32u64);
    let shape = format!("--config {LLAMA2_7B} --train --batch {b} --seq {s}");
    let flash = plan(&shape);
    assert_eq!(item(&flash, "activations"), l * 34 * s * b * h);
    let eager = plan(&format!("{shape} --attention eager"));
    assert_eq!(item(&eager, "activations"), l * s * b * (34 * h + 5 * a * s));
    let full = plan(&format!("{shape} --checkpointing full"));
    assert_eq!(item(&full, "activations"), l * 2 * s * b * h + 34 * s * b * h);
    let sqrt = plan(&format!("{shape} --checkpointing sqrt"));
    // √32 ≈ 6 layers per segment: ⌈32/6⌉ = 6 segment inputs kept, 6 layers recomputed at once.
    assert_eq!(item(&sqrt, "activations"), 6 * 2 * s * b * h + 6 * 34 * s * b * h);
    // Tensor parallelism with sequence parallelism divides by t.
    let tp = plan(&format!("{shape} --tp 2 --gpus 2"));
    assert_eq!(item(&tp, "activations"), l * 34 * s * b * h / 2);
    // fp32 activations take twice the bytes.
    let fp32 = plan(&format!("{shape} --dtype fp32"));
    assert_eq!(item(&fp32, "activations"), 2 * l * 34 * s * b * h);
    // Logits: bf16 output, its fp32 copy, the fp32 log-softmax.
    assert_eq!(item(&flash, "logits"), s * b * 32000 * (2 + 4 + 4));
    let act = flash.items.iter().find(|i| i.name == "activations").unwrap();
    assert!(act.assumption.contains("Korthikanti"), "{}", act.assumption);
    assert_eq!(act.formula, "L · 34·s·b·h = 32 · 34·4096·4·4096");
}

#[test]
fn optimizers_lora_qlora_and_offload() {
    let p = 7_000_000_000u64;
    let states = |extra: &str| item(&plan(&format!("--params 7e9 --train {extra}")), "optimizer states");
    assert_eq!(states("--optimizer adamw-8bit"), 2 * p);
    assert_eq!(states("--optimizer sgd-momentum"), 4 * p);
    assert_eq!(states("--optimizer sgd"), 0);
    assert_eq!(states("--offload optimizer"), 0);
    // Adafactor's factored second moment is tiny next to Adam's.
    let ada = item(
        &plan(&format!("--config {LLAMA2_7B} --train --batch 1 --seq 1 --optimizer adafactor")),
        "optimizer states",
    );
    assert!(ada > 0 && ada < 30_000_000, "{ada}");

    // LoRA r=16 on every linear of Llama-2-7B: 16 · Σ(in + out) per layer · 32 layers = 39,976,960 adapter
    // parameters; the base stays frozen in bf16, only the adapters get gradients and optimizer state.
    let lora = plan(&format!("--config {LLAMA2_7B} --train --batch 1 --seq 1 --lora 16"));
    let adapters = 16 * 32 * (4 * (4096 + 4096) + 3 * (4096 + 11008));
    assert_eq!(adapters, 39_976_960);
    assert_eq!(item(&lora, "gradients"), adapters * 4);
    assert_eq!(item(&lora, "optimizer states"), adapters * 8);
    assert_eq!(item(&lora, "weights"), 6_738_415_616 * 2 + adapters * 4);
    // QLoRA: the decoder's matrices in NF4 (4 bits + double-quantised constants ≈ 4.13 bits).
    let qlora = plan(&format!("--config {LLAMA2_7B} --train --batch 1 --seq 1 --qlora 16"));
    let w = item(&qlora, "weights");
    assert!(w > 3_700_000_000 && w < 4_200_000_000, "{w}");
}

#[test]
fn verdict_and_fits_null_without_gpu() {
    let none = plan("--params 7e9 --train");
    assert_eq!(none.fits, None);
    assert!(none.proposals.is_empty());
    let b = plan("--params 7e9 --train --gpu-memory 80GiB");
    assert_eq!(b.fits, Some(false));
    assert_eq!(b.limit_bytes, Some(80 << 30));
    let small = plan("--params 1e9 --train --gpu h100-80gb");
    assert_eq!(small.fits, Some(true));
    assert_eq!(small.headroom_bytes, Some((81_559i64 << 20) - small.total_bytes as i64));
}

#[test]
fn paged_attention_capacity() {
    // Llama-3.1-8B on a 4090: 90% of 24,564 MiB, less the bf16 weights, activations, logits and CUDA context,
    // divided into 16-token blocks of 128 KiB × 16.
    let b = plan(&format!("--config {LLAMA31_8B} --infer --batch 1 --seq 32768 --gpu 4090"));
    let p = b.paged_attention.as_ref().expect("capacity with a GPU when serving");
    let limit = (24_564u64 << 20) as f64 * 0.9;
    let others = b.total_bytes - predicted(&b.items, "kv_cache");
    assert_eq!(p.kv_bytes_per_token, 2 * 32 * 8 * 128 * 2);
    assert_eq!(p.block_bytes, 2 * 32 * 8 * 128 * 2 * 16);
    assert_eq!(p.kv_budget_bytes, limit as u64 - others);
    assert_eq!(p.blocks, p.kv_budget_bytes / p.block_bytes);
    assert_eq!(p.tokens, p.blocks * 16);
    assert_eq!(p.max_sequences_at_seq, p.blocks / (32768 / 16));
    assert_eq!(p.largest_max_model_len, p.tokens);
    assert!(p.tokens > 32768, "one 32k sequence fits: {}", p.tokens);
    assert_eq!(b.fits, Some(true));
    // The base Llama-3-8B stops at its own 8192 positions.
    let base = plan(&format!("--config {LLAMA3_8B} --infer --batch 1 --seq 8192 --gpu 4090"));
    assert_eq!(base.paged_attention.unwrap().largest_max_model_len, 8192);
}

// ---- The solver's three documented scenarios (README "Budget") ----

fn changes(b: &Budget, n: usize) -> Vec<(String, String, String)> {
    b.proposals[n].changes.iter().map(|c| (c.knob.to_string(), c.from.clone(), c.to.clone())).collect()
}

fn ch(knob: &str, from: &str, to: &str) -> (String, String, String) {
    (knob.into(), from.into(), to.into())
}

#[test]
fn solver_7b_full_finetune_on_one_80gb_gpu() {
    // 108 GB of model states and 73 GB of activations on an 81,559 MiB H100: checkpointing and 8-bit AdamW fit it;
    // nothing else is needed.
    let b = plan(&format!("--config {LLAMA2_7B} --train --batch 4 --seq 4096 --gpu h100-80gb"));
    assert_eq!(b.fits, Some(false));
    assert_eq!(b.proposals.len(), 1);
    assert!(b.proposals[0].fits);
    assert_eq!(changes(&b, 0), vec![ch("checkpointing", "none", "full"), ch("optimizer", "adamw", "adamw-8bit")]);
    let after = plan(&format!(
        "--config {LLAMA2_7B} --train --batch 4 --seq 4096 --gpu h100-80gb --checkpointing full --optimizer adamw-8bit"
    ));
    assert_eq!(after.fits, Some(true));
    assert_eq!(after.total_bytes, b.proposals[0].total_bytes);
    assert!(after.proposals.is_empty());
}

#[test]
fn solver_70b_on_8_h100s() {
    // 1.13 TB of model states: on the 8 GPUs you have, ZeRO-3 + checkpointing + optimizer offload; 8-bit AdamW
    // was tried on the way and dropped because offload made it unnecessary. Without offload: 16 GPUs.
    let b = plan(&format!("--config {LLAMA3_70B} --train --batch 1 --seq 8192 --gpus 8 --gpu h100-80gb"));
    assert_eq!(b.fits, Some(false));
    assert_eq!(
        changes(&b, 0),
        vec![ch("checkpointing", "none", "full"), ch("zero", "0", "3"), ch("offload", "none", "optimizer")]
    );
    assert!(b.proposals[0].fits);
    assert!(b.proposals[0].changes[2].cost.contains("846.6 GB for all 8"), "{}", b.proposals[0].changes[2].cost);
    assert_eq!(b.proposals[1].note.as_deref(), Some("without CPU offload: more GPUs instead"));
    assert_eq!(
        changes(&b, 1),
        vec![
            ch("checkpointing", "none", "full"),
            ch("optimizer", "adamw", "adamw-8bit"),
            ch("zero", "0", "3"),
            ch("gpus", "8", "16"),
        ]
    );
    assert!(b.proposals[1].fits);
}

#[test]
fn solver_8b_serving_32k_on_a_24gb_gpu() {
    // Four 32k-token sequences of Llama-3.1-8B on a 4090: 16 GB of bf16 weights + 17.2 GB of KV cache against
    // 90% of 24 GB. FP8 KV cache alone is not enough; FP8 weights with it fit all four sequences.
    let b = plan(&format!("--config {LLAMA31_8B} --infer --batch 4 --seq 32768 --gpu 4090"));
    assert_eq!(b.fits, Some(false));
    assert_eq!(changes(&b, 0), vec![ch("kv_dtype", "bf16", "fp8"), ch("dtype", "bf16", "fp8")]);
    assert!(b.proposals[0].fits);
    let kv_only = plan(&format!("--config {LLAMA31_8B} --infer --batch 4 --seq 32768 --gpu 4090 --kv-dtype fp8"));
    assert_eq!(kv_only.fits, Some(false));
}

#[test]
fn solver_shrinks_the_micro_batch_with_gradient_accumulation() {
    // 7B with 8-bit AdamW and checkpointing already on, but a micro-batch of 32: the solver keeps the global
    // batch with accumulation.
    let b = plan(&format!(
        "--config {LLAMA2_7B} --train --batch 32 --seq 4096 --checkpointing full --optimizer adamw-8bit --gpu h100-80gb"
    ));
    let c = &b.proposals[0].changes;
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].knob, "batch");
    let to: u64 = c[0].to.parse().unwrap();
    assert!(to < 32 && 32 % to == 0);
    assert!(c[0].cost.contains(&format!("{}× gradient accumulation", 32 / to)), "{}", c[0].cost);
}

// ---- The command line ----

#[test]
fn json_contract() {
    let o = oomdoc(&[
        "budget",
        "--config",
        LLAMA2_7B,
        "--train",
        "--batch",
        "4",
        "--seq",
        "4096",
        "--gpu",
        "h100-80gb",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["parameters"], 6_738_415_616u64);
    assert_eq!(v["fits"], false);
    let items = v["items"].as_array().unwrap();
    for i in items {
        for key in ["name", "bytes", "formula", "assumption"] {
            assert!(!i[key].is_null(), "items[].{key}: {i}");
        }
    }
    let sum: u64 = items.iter().map(|i| i["bytes"].as_u64().unwrap()).sum();
    assert_eq!(v["total_bytes"].as_u64().unwrap(), sum);
    let p = &v["proposals"][0];
    assert_eq!(p["fits"], true);
    assert_eq!(p["changes"][0]["knob"], "checkpointing");
    assert_eq!(p["changes"][0]["from"], "none");
    assert_eq!(p["changes"][0]["to"], "full");
    assert!(p["changes"][0]["cost"].as_str().unwrap().contains("20–30%"));
    // No GPU: fits is null, not false.
    let o = oomdoc(&["budget", "--params", "7e9", "--train", "-f", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["fits"].is_null());
    assert_eq!(v["proposals"], serde_json::json!([]));
}

#[test]
fn text_and_markdown_show_each_formula_and_assumption() {
    let args = ["budget", "--config", LLAMA3_70B, "--infer", "--batch", "32", "--seq", "8192", "--dtype", "fp16"];
    let text = stdout(&oomdoc(&args));
    assert!(text.contains("KV cache                         85.9 GB   80.0 GiB"), "{text}");
    assert!(text.contains("2 · L · kv_heads · head_dim · T · B · bytes = 2·80·8·128·8192·32·2"), "{text}");
    assert!(text.contains("K and V for 8 KV heads of 128 dims"), "{text}");
    let md = stdout(&oomdoc(&[&args[..], &["--format", "markdown"]].concat()));
    assert!(md.starts_with("## Memory budget"), "{md}");
    assert!(md.contains("| KV cache | 85.9 GB | 80.0 GiB | `2 · L · kv_heads"), "{md}");
    let train = stdout(&oomdoc(&["budget", "--params", "7e9", "--train", "--zero", "1", "--gpus", "8"]));
    assert!(train.contains("of which model states          38.5 GB"), "{train}");
}

#[test]
fn bad_config_json_is_one_line_and_exit_2() {
    let cases: [(&str, &[u8], &str); 4] = [
        ("broken.json", b"{\"num_hidden_layers\": 32,", "expected a Hugging Face config.json (JSON)"),
        ("list.json", b"[1, 2]", "expected a Hugging Face config.json: a JSON object"),
        ("partial.json", b"{\"num_hidden_layers\": 32, \"hidden_size\": 4096}", "missing \"num_attention_heads\""),
        ("typed.json", b"{\"num_hidden_layers\": \"32\"}", "\"num_hidden_layers\" should be a whole number"),
    ];
    for (name, bytes, phrase) in cases {
        let f = TempFile::with(name, bytes);
        let o = oomdoc(&["budget", "--config", f.path(), "--train", "--batch", "1", "--seq", "1"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
        assert!(err.contains(f.path()) && err.contains(phrase), "{name}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = oomdoc(&["budget", "--config", "no/such/config.json", "--train"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no/such/config.json"), "{}", stderr(&o));
}

#[test]
fn usage_errors_exit_2() {
    for (args, phrase) in [
        (&["budget", "--params", "7e9"][..], "--train or --infer"),
        (&["budget", "--train"][..], "say which model"),
        (&["budget", "--config", LLAMA2_7B, "--train", "--gpu", "h100-80gb"][..], "--batch"),
        (&["budget", "--params", "7e9", "--train", "--gpu", "tpu-v5"][..], "unknown GPU"),
        (&["budget", "--params", "7e9", "--train", "--gpus", "6", "--tp", "4"][..], "not a multiple"),
        (&["budget", "--params", "7e9", "--train", "--offload", "params"][..], "--zero 3"),
        (&["budget", "--params", "7e9", "--train", "--dtype", "int4"][..], "--qlora"),
        (&["budget", "--params", "seven", "--train"][..], "expected a count"),
        (&["budget", "--layers", "32", "--train"][..], "missing --hidden"),
        (&["budget", "--params", "7e9", "--train", "--layers", "1.5"][..], "whole number"),
        (&["budget", "--params", "7e9", "--train", "--seq", "1e12"][..], "larger than any run"),
    ] {
        let o = oomdoc(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(phrase), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"));
    }
}

#[test]
fn help_teaches_with_examples() {
    let help = stdout(&oomdoc(&["budget", "--help"]));
    for needle in [
        "Examples (",
        "--params 7e9 --train",
        "--gpu h100-80gb",
        "--config",
        "--kv-heads",
        "--checkpointing",
        "--optimizer",
        "--zero",
        "--gpu-memory",
        "--format",
        "Korthikanti",
        "oomdoc analyze snap.pickle --config",
    ] {
        assert!(help.contains(needle), "budget --help lacks {needle:?}:\n{help}");
    }
    let analyze = stdout(&oomdoc(&["analyze", "--help"]));
    assert!(analyze.contains("--model") && analyze.contains("--batch") && analyze.contains("--seq"), "{analyze}");
}

// ---- Predicted vs measured on a real snapshot ----

/// A CS336 "medium" model (24 layers, d_model 1024, 16 heads, d_ff 4096, vocabulary 10,000), trained in fp32 with
/// naive attention at batch 4 × 512 tokens: its largest live tensor is the 4·512·10000 fp32 logits (78.1 MiB).
const CS336_MEDIUM: &[&str] = &[
    "analyze",
    "fixtures/real/cs336-wl-train-newest.pickle",
    "--layers",
    "24",
    "--hidden",
    "1024",
    "--heads",
    "16",
    "--intermediate",
    "4096",
    "--vocab",
    "10000",
    "--dtype",
    "fp32",
    "--attention",
    "eager",
    "--batch",
    "4",
    "--seq",
    "512",
    "--format",
    "json",
];

#[test]
fn predicted_vs_measured_on_a_real_snapshot() {
    let o = oomdoc(CS336_MEDIUM);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["devices"][0]["budget"]["rows"].as_array().unwrap();
    let act = rows.iter().find(|r| r["category"] == "activation").unwrap();
    // Korthikanti's formula with the score term, ×2 for fp32: within 10% of the activations the snapshot holds.
    let ratio = act["ratio"].as_f64().unwrap();
    assert!((0.9..1.1).contains(&ratio), "activation measured/predicted = {ratio}");
    assert!(v["findings"].as_array().unwrap().iter().all(|f| f["rule"] != "budget-overrun"), "{}", v["findings"]);
    // Without --model the report is unchanged: no budget key.
    let plain: serde_json::Value =
        serde_json::from_slice(&oomdoc(&["analyze", CS336_MEDIUM[1], "--format", "json"]).stdout).unwrap();
    assert!(plain["devices"][0].get("budget").is_none());
}

#[test]
fn budget_overrun_flags_activations_when_checkpointing_was_assumed() {
    // Budgeted with full checkpointing, the run holds 10× the activations: checkpointing was not active.
    let o = oomdoc(&[CS336_MEDIUM, &["--checkpointing", "full"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = v["findings"].as_array().unwrap().iter().find(|f| f["rule"] == "budget-overrun").expect("fires");
    assert_eq!(f["severity"], "warning");
    let msg = f["message"].as_str().unwrap();
    // 6.65 GiB: the backward's temporaries that were counted as gradients are activations now (issue 37).
    assert!(msg.contains("Activations hold 6.65 GiB") && msg.contains("checkpointing is probably not active"), "{msg}");
    assert_eq!(f["evidence"]["budget.worst_category"], "activation");
    // The text report shows the table and the finding.
    let text = stdout(&oomdoc(&[&CS336_MEDIUM[..CS336_MEDIUM.len() - 2], &["--checkpointing", "full"]].concat()));
    assert!(text.contains("Predicted vs measured"), "{text}");
    assert!(text.contains("[budget-overrun]"), "{text}");
}

#[test]
fn predicted_vs_measured_model_states_on_a_real_snapshot() {
    // CS336 2.7B (32 layers, d_model 2560, d_ff 10240) in fp32 with AdamW at its optimizer step: gradients
    // (4 B/param) and AdamW state (8 B/param) measured within 3% of the budget.
    let o = oomdoc(&[
        "analyze",
        "fixtures/real/cs336-kk-fullstep-57gb.pickle",
        "--layers",
        "32",
        "--hidden",
        "2560",
        "--heads",
        "32",
        "--intermediate",
        "10240",
        "--vocab",
        "10000",
        "--dtype",
        "fp32",
        "--batch",
        "4",
        "--seq",
        "128",
        "-f",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["devices"][0]["budget"]["rows"].as_array().unwrap();
    for cat in ["gradient", "optimizer_state"] {
        let r = rows.iter().find(|r| r["category"] == cat).unwrap();
        let ratio = r["ratio"].as_f64().unwrap();
        assert!((0.97..1.03).contains(&ratio), "{cat}: {ratio}");
    }
    assert!(v["findings"].as_array().unwrap().iter().all(|f| f["rule"] != "budget-overrun"));
}
