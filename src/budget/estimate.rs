//! The itemised per-GPU budget: one [`Item`] per kind of memory, each with the formula that produced its bytes and
//! the assumption behind it, so a reader can check every number by hand.

use serde::Serialize;

use super::model::{count, Dtype, Model, Shape};
use super::run::{Checkpointing, InvalidRun, MixedPrecision, Mode, Offload, Optimizer, Run};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The CUDA context with lazy module loading (CUDA ≥ 11.7): 300–600 MiB measured on A100/H100; 512 MiB budgeted.
const CUDA_CONTEXT: u64 = 512 * MIB;
/// cuBLAS + cuBLASLt workspaces at PyTorch's Hopper default (`:4096:8`, 32 MiB each).
const CUBLAS_WORKSPACES: u64 = 64 * MIB;
/// NCCL: NCCL_BUFFSIZE (4 MiB) × up to 32 channels × 2 directions × 2 algorithms ≈ 512 MiB, doubled for NVLS or a
/// second process group.
const NCCL_ALLOWANCE: u64 = GIB;

/// One line of the budget.
#[derive(Clone, Debug, Serialize)]
pub struct Item {
    pub name: String,
    pub bytes: u64,
    pub formula: String,
    pub assumption: String,
    /// The snapshot category this memory shows up as (`oomdoc analyze`); null for memory outside PyTorch's
    /// allocator (CUDA context, NCCL), which a snapshot never sees.
    pub category: Option<&'static str>,
}

#[derive(Clone, Debug, Default)]
pub struct Estimate {
    pub items: Vec<Item>,
    pub notes: Vec<String>,
    /// What the estimate could not count for want of flags, and the flags that would add it: the verdict's
    /// headline carries it, so "fits" never hides it.
    pub left_out: Option<LeftOut>,
}

/// A part of the memory the budget did not estimate.
#[derive(Clone, Debug, Serialize)]
pub struct LeftOut {
    /// "activations, logits and the KV cache".
    pub what: String,
    /// "--batch and --seq".
    pub give: String,
}

impl Estimate {
    pub fn total(&self) -> u64 {
        self.items.iter().map(|i| i.bytes).sum()
    }

    fn push(
        &mut self,
        name: &str,
        bytes: u128,
        formula: String,
        assumption: impl Into<String>,
        cat: Option<&'static str>,
    ) {
        self.items.push(Item {
            name: name.to_string(),
            bytes: bytes.min(u64::MAX as u128) as u64,
            formula,
            assumption: assumption.into(),
            category: cat,
        });
    }
}

fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b.max(1))
}

/// Thousands separators for the formulas: 6738415616 → "6,738,415,616".
pub fn thousands(n: u128) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes per element, as written in formulas: "2", "0.5", "4".
fn per(bits: u64) -> String {
    if bits.is_multiple_of(8) {
        (bits / 8).to_string()
    } else {
        format!("{}", bits as f64 / 8.0)
    }
}

/// The parameters this GPU holds before data-parallel sharding: tensor and pipeline parallelism split the model.
fn local(n: u64, run: &Run) -> u128 {
    div_ceil(n as u128, (run.tensor_parallel * run.pipeline_parallel) as u128)
}

fn split_note(run: &Run) -> String {
    if run.tensor_parallel * run.pipeline_parallel > 1 {
        format!(" / (TP {} · PP {})", run.tensor_parallel, run.pipeline_parallel)
    } else {
        String::new()
    }
}

/// LoRA adapter parameters: rank r on every weight matrix of every decoder layer (PEFT's "all-linear": q, k, v,
/// o, gate, up, down; each MoE expert; not the router), A is r×in and B is out×r.
pub fn lora_params(shape: &Shape, rank: u64) -> u64 {
    shape
        .blocks()
        .iter()
        .map(|b| {
            b.count
                * b.linears
                    .iter()
                    .filter(|l| l.name != "router")
                    .map(|l| l.copies * rank * (l.inputs + l.outputs))
                    .sum::<u64>()
        })
        .sum()
}

/// Adafactor's state for full fine-tuning: a factored second moment, rows + columns fp32 numbers per matrix, a
/// full fp32 second moment for vectors; no first moment (Hugging Face's default beta1=None).
fn adafactor_bytes(shape: &Shape) -> u128 {
    let mut n: u128 = 0;
    for b in shape.blocks() {
        let per_block: u128 = b
            .linears
            .iter()
            .map(|l| (l.copies * (l.inputs + l.outputs + if l.bias { l.outputs } else { 0 })) as u128)
            .sum::<u128>()
            + b.vectors as u128;
        n += per_block * b.count as u128;
    }
    let emb = (shape.vocab.unwrap_or(0) + shape.hidden) as u128;
    n += emb * if shape.tied_embeddings { 1 } else { 2 } + shape.hidden as u128;
    n * 4
}

/// Computes the per-GPU budget. Errors name the flag that is missing or inconsistent.
pub fn estimate(model: &Model, run: &Run) -> Result<Estimate, InvalidRun> {
    let mut e = Estimate::default();
    match run.mode {
        Mode::Train => training(model, run, &mut e)?,
        Mode::Infer => inference(model, run, &mut e)?,
    }
    e.push(
        "CUDA context and workspaces",
        (CUDA_CONTEXT + CUBLAS_WORKSPACES) as u128,
        "512 MiB context + 2 × 32 MiB cuBLAS/cuBLASLt workspaces".into(),
        "the context is 300–600 MiB with lazy module loading (CUDA ≥ 11.7); outside PyTorch's allocator, so a \
         snapshot never shows it",
        None,
    );
    if run.gpus > 1 {
        e.push(
            "NCCL buffers",
            NCCL_ALLOWANCE as u128,
            "4 MiB NCCL_BUFFSIZE × ≤32 channels × 2 directions × 2 algorithms ≈ 512 MiB, ×2".into(),
            "an allowance for one process group with room for NVLS or a second group; outside PyTorch's allocator",
            None,
        );
    }
    Ok(e)
}

fn training(model: &Model, run: &Run, e: &mut Estimate) -> Result<(), InvalidRun> {
    let p = local(model.parameters, run);
    let dp = run.data_parallel() as u128;
    let split = split_note(run);
    let shape = model.shape.as_ref();
    let sixteen = run.dtype != Dtype::Fp32;
    // torch.autocast keeps the weights (and so the gradients) in fp32; everything else stores them in --dtype.
    let amp = sixteen && run.mixed_precision == MixedPrecision::Amp;
    let wbits = if amp { 32 } else { run.dtype.bits() };
    let shard = |stage: u8| if run.zero >= stage { dp } else { 1 };
    let zero_note =
        |stage: u8| if run.zero >= stage && dp > 1 { format!(" / {dp} (ZeRO-{})", run.zero) } else { String::new() };
    let p_str = thousands(p);
    let pname = format!("P = {}{split}", count(model.parameters));

    let (trainable, adapters) = match run.lora {
        Some(l) => {
            let s = shape.ok_or_else(|| {
                InvalidRun("--lora/--qlora needs the model's shape (--config, or --layers/--hidden/…)".into())
            })?;
            let n = local(lora_params(s, l.rank), run);
            (n, Some((l, n)))
        }
        None => (p, None),
    };

    // Weights.
    let on_cpu = run.offload == Offload::Params;
    match adapters {
        None => {
            let bytes = if on_cpu { 0 } else { div_ceil(p * wbits as u128 / 8, shard(3)) };
            let formula = if on_cpu {
                "on the CPU (ZeRO-Infinity / FSDP CPU offload); layers stream in, see the ZeRO-3 working set".into()
            } else {
                format!("P · {} B{} = {p_str} · {}{}", per(wbits), zero_note(3), per(wbits), zero_note(3))
            };
            let why = if amp {
                format!("{pname}; fp32 weights under torch.autocast, which also serve as the master copy")
            } else {
                format!("{pname}; every weight in {}", run.dtype.name())
            };
            e.push("weights", bytes, formula, why, Some("parameter"));
        }
        Some((l, n)) => {
            let (base, base_formula, base_why) = if l.quantized {
                let q = match shape {
                    Some(s) => local(s.block_linear_params(), run),
                    None => p,
                };
                let nf4 = q / 2 + div_ceil(q, 64) + div_ceil(q, 64 * 256) * 4;
                (
                    nf4 + (p - q) * 2,
                    format!("Q/2 + Q/64 + Q/16384·4 + (P − Q)·2 with Q = {}", thousands(q)),
                    "QLoRA: decoder matrices (Q) in NF4 with double-quantised block constants (bitsandbytes, blocks \
                     of 64); embeddings, LM head and norms in bf16",
                )
            } else {
                (p * run.dtype.bits() as u128 / 8, format!("P · {}", per(run.dtype.bits())), "frozen base in --dtype")
            };
            let bytes = div_ceil(base + n * 4, shard(3));
            e.push(
                "weights",
                bytes,
                format!("{base_formula} + A · 4{} with A = {} adapter parameters", zero_note(3), thousands(n)),
                format!("{pname}; {base_why}; rank-{} adapters in fp32 (PEFT's autocast_adapter_dtype)", l.rank),
                Some("parameter"),
            );
        }
    }

    // Gradients.
    let (gbytes, gformula, gwhy) = match adapters {
        Some((_, n)) => (n * 4, format!("A · 4 = {} · 4", thousands(n)), "only the fp32 adapters get gradients".into()),
        None if on_cpu => (0, "on the CPU with the parameters".into(), "offloaded with the parameters".to_string()),
        None => (
            p * wbits as u128 / 8,
            format!("P · {} B = {p_str} · {}", per(wbits), per(wbits)),
            format!("one gradient per weight, in the weights' dtype ({})", if amp { "fp32" } else { run.dtype.name() }),
        ),
    };
    e.push(
        "gradients",
        div_ceil(gbytes, shard(2)),
        format!("{gformula}{}", zero_note(2)),
        format!("{gwhy}; freed by zero_grad(set_to_none=True) but live from backward to the step, so counted"),
        Some("gradient"),
    );

    // Optimizer state.
    let opt_offloaded = run.offload != Offload::None;
    let (sbytes, sformula, swhy): (u128, String, &str) = match run.optimizer {
        Optimizer::Adamw => {
            (trainable * 8, format!("N · 8 B = {} · 8", thousands(trainable)), "fp32 momentum + variance")
        }
        Optimizer::Adamw8bit => (
            trainable * 2,
            format!("N · 2 B = {} · 2", thousands(trainable)),
            "bitsandbytes 8-bit momentum + variance; block-wise constants (<2%) not counted",
        ),
        Optimizer::SgdMomentum => {
            (trainable * 4, format!("N · 4 B = {} · 4", thousands(trainable)), "one fp32 momentum buffer")
        }
        Optimizer::Sgd => (0, "0".into(), "plain SGD keeps no state"),
        Optimizer::Adafactor => match adapters {
            // Adapters are skinny matrices: factoring saves almost nothing, count (rows + cols) per matrix anyway.
            Some((_, n)) => {
                (n * 4, format!("≈ A · 4 = {} · 4", thousands(n)), "Adafactor on the adapters (upper bound)")
            }
            None => {
                let s = shape.ok_or_else(|| {
                    InvalidRun(
                        "--optimizer adafactor needs the model's shape (--config, or --layers/--hidden/…)".into(),
                    )
                })?;
                (
                    local_bytes(adafactor_bytes(s), run),
                    "Σ over matrices (rows + cols) · 4 B + vectors · 4 B".into(),
                    "factored fp32 second moment, no first moment (beta1=None)",
                )
            }
        },
    };
    let n_name = if adapters.is_some() { "N = adapter parameters" } else { "N = trained parameters = P" };
    e.push(
        "optimizer states",
        if opt_offloaded { 0 } else { div_ceil(sbytes, shard(1)) },
        if opt_offloaded {
            format!("on the CPU ({}{})", bytes_text(div_ceil(sbytes, shard(1))), " per GPU's share")
        } else {
            format!("{sformula}{}", zero_note(1))
        },
        format!("{n_name}; {swhy}"),
        Some("optimizer_state"),
    );

    // Master weights: the fp32 copy the optimizer updates when the model itself is 16-bit.
    if adapters.is_none() && sixteen && run.mixed_precision == MixedPrecision::Master {
        let m = div_ceil(p * 4, shard(1));
        e.push(
            "master weights",
            if opt_offloaded { 0 } else { m },
            if opt_offloaded {
                format!("on the CPU ({})", bytes_text(m))
            } else {
                format!("P · 4 B{} = {p_str} · 4{}", zero_note(1), zero_note(1))
            },
            "fp32 copy of every weight kept by the optimizer (DeepSpeed, Megatron, FSDP's fp32 shards); the 16 bytes \
             per parameter of mixed-precision Adam are 2 + 2 + 4 + 8",
            Some("optimizer_state"),
        );
    }
    if amp && adapters.is_none() {
        e.push(
            "autocast weight cache",
            p * 2,
            format!("P · 2 B = {p_str} · 2"),
            "torch.autocast caches a 16-bit copy of each weight for the whole forward pass (cache_enabled=True)",
            Some("activation"),
        );
    }

    let (Some(s), Some(b), Some(t)) = (shape, run.batch, run.seq) else {
        let missing = missing_for_activations(shape.is_none());
        e.notes.push(format!("{} are not estimated: {}", missing.what, missing.give));
        e.left_out = Some(missing);
        return Ok(());
    };
    activations(s, b, t, run, e);

    if run.zero == 3 {
        let unit = s.largest_layer_params().max(s.embedding_params());
        let bits = if amp { 16 } else { run.dtype.bits().min(16) };
        e.push(
            "ZeRO-3 working set",
            local(unit, run) * 3 * bits as u128 / 8,
            format!("3 · max(layer, embedding) · {} B = 3 · {} · {}", per(bits), thousands(local(unit, run)), per(bits)),
            "FSDP/ZeRO-3 gathers one unit (a decoder layer, or the embedding if larger), prefetches the next, and holds \
             one unit's unsharded gradient before reduce-scatter",
            Some("communication"),
        );
    }
    if run.zero == 0 && run.data_parallel() > 1 {
        e.notes.push(format!(
            "DDP keeps a second copy of the gradients in its buckets unless gradient_as_bucket_view=True (+{} here)",
            bytes_text(div_ceil(p * wbits as u128 / 8, 1))
        ));
    }
    if run.pipeline_parallel > 1 {
        e.notes.push(
            "pipeline parallel (1F1B): the first stage holds PP micro-batches of L/PP layers, i.e. L layers' worth of \
             activations, which is what is counted"
                .into(),
        );
    }
    if let Some(m) = &s.moe {
        e.notes.push(format!(
            "MoE: {} of {} experts per token; activations count the top-{} experts' MLP inputs as {} dense MLPs",
            m.per_token, m.experts, m.per_token, m.per_token
        ));
    }
    Ok(())
}

fn local_bytes(bytes: u128, run: &Run) -> u128 {
    div_ceil(bytes, (run.tensor_parallel * run.pipeline_parallel) as u128)
}

fn missing_for_activations(no_shape: bool) -> LeftOut {
    let what = "activations, logits and the KV cache".to_string();
    let give = if no_shape {
        "--layers and --hidden add the activations (--heads for eager attention), --kv-heads the KV cache, --vocab \
         the logits, with --batch and --seq; or give --config config.json"
    } else {
        "give --batch and --seq"
    };
    LeftOut { what, give: give.to_string() }
}

/// Activation memory (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
/// eq. 1): a transformer layer stores `s·b·h·(34 + 5·a·s/h)` bytes with 16-bit activations — 34·s·b·h for the
/// inputs of its matmuls, norms, activation function and dropout masks, 5·a·s²·b for the attention scores, their
/// softmax and dropout. FlashAttention (and PyTorch's SDPA kernels) never store the scores. With tensor parallelism
/// and sequence parallelism everything divides by t. Full checkpointing keeps only each layer's input (2·s·b·h)
/// and recomputes one layer at a time during backward.
fn activations(s: &Shape, b: u64, t: u64, run: &Run, e: &mut Estimate) {
    let (b, t_, h, a, l) = (b as u128, t as u128, s.hidden as u128, s.heads as u128, s.layers as u128);
    let tp = run.tensor_parallel as u128;
    // MoE: the routed tokens' MLP inputs and intermediates are stored once per chosen expert (the 19·s·b·h MLP part).
    let k = s.moe.as_ref().map_or(1, |m| m.per_token as u128);
    let coeff = 34 + 19 * (k - 1);
    let scores = if run.flash_attention { 0 } else { 5 * a * t_ };
    let per_layer = t_ * b * (coeff * h + scores) / tp;
    let act_bits: u128 = if run.dtype == Dtype::Fp32 { 32 } else { 16 };
    let scale = |x: u128| x * act_bits / 16;
    let layer_formula = {
        let mlp = if k > 1 { format!("(34 + 19·{})", k - 1) } else { "34".into() };
        let tp_s = if tp > 1 { format!(" / {tp}") } else { String::new() };
        if run.flash_attention {
            (format!("{mlp}·s·b·h{tp_s}"), format!("{mlp}·{t}·{b}·{h}{tp_s}"))
        } else {
            (format!("s·b·h·({mlp} + 5·a·s/h){tp_s}"), format!("{t}·{b}·{h}·({mlp} + 5·{a}·{t}/{h}){tp_s}"))
        }
    };
    let keep = 2 * t_ * b * h / tp;
    let (bytes, formula) = match run.checkpointing {
        Checkpointing::None => (l * per_layer, format!("L · {} = {l} · {}", layer_formula.0, layer_formula.1)),
        Checkpointing::Full => (
            l * keep + per_layer,
            format!("L · 2·s·b·h + {} = {l} · 2·{t}·{b}·{h} + {}", layer_formula.0, layer_formula.1),
        ),
        Checkpointing::Sqrt | Checkpointing::Every(_) => {
            let seg = match run.checkpointing {
                Checkpointing::Every(k) => (k as u128).min(l),
                _ => ((l as f64).sqrt().round() as u128).max(1),
            };
            (
                div_ceil(l, seg) * keep + seg * per_layer,
                format!("⌈L/k⌉ · 2·s·b·h + k · {} with k = {seg}", layer_formula.0),
            )
        }
    };
    let ckpt = match run.checkpointing {
        Checkpointing::None => "no checkpointing: every layer's activations live until its backward".to_string(),
        Checkpointing::Full => "full checkpointing: each layer's input kept, one layer recomputed at a time".into(),
        _ => "segment checkpointing: segment inputs kept, one segment recomputed at a time".into(),
    };
    let attn = if run.flash_attention {
        "FlashAttention/SDPA: the s×s scores are never stored"
    } else {
        "eager attention stores the s×s scores, softmax and dropout mask (5·a·s²·b)"
    };
    let dtype_note = if act_bits == 32 { "; ×2 for fp32 activations" } else { "" };
    let tp_note = if tp > 1 { "; tensor + sequence parallel divide by t" } else { "" };
    e.push(
        "activations",
        scale(bytes),
        formula,
        format!(
            "Korthikanti et al. 2022 (16-bit, GPT-style block: 34·s·b·h of matmul/norm/activation inputs and dropout \
             masks){dtype_note}; {attn}; {ckpt}{tp_note}"
        ),
        Some("activation"),
    );

    let Some(v) = s.vocab.map(u128::from) else { return };
    let abytes = act_bits / 8;
    let (per_elem, how) =
        if act_bits == 32 { (4 + 4, "4 + 4".to_string()) } else { (abytes + 4 + 4, format!("{abytes} + 4 + 4")) };
    e.push(
        "logits",
        t_ * b * v * per_elem / tp,
        format!("s·b·V·({how}) = {t}·{b}·{v}·({how})"),
        "the LM head's output, its fp32 upcast for the loss, and the fp32 log-softmax cross-entropy saves for \
         backward; a fused or chunked loss (Liger, Cut Cross-Entropy) removes most of it",
        Some("activation"),
    );
}

fn inference(model: &Model, run: &Run, e: &mut Estimate) -> Result<(), InvalidRun> {
    let tp = run.tensor_parallel as u128;
    let p = local(model.parameters, run);
    let shape = model.shape.as_ref();
    let split = split_note(run);
    // Quantised checkpoints (FP8, INT8, AWQ/GPTQ) quantise the decoder's matrices; embeddings, LM head and norms
    // stay 16-bit.
    let (bytes, formula, why) = match run.dtype {
        Dtype::Fp32 | Dtype::Bf16 | Dtype::Fp16 => {
            let bits = run.dtype.bits();
            (
                p * bits as u128 / 8,
                format!("P · {} B = {} · {}", per(bits), thousands(p), per(bits)),
                format!("P = {}{split}; every weight in {}", count(model.parameters), run.dtype.name()),
            )
        }
        q => {
            let n = match shape {
                Some(s) => local(s.block_linear_params(), run),
                None => p,
            };
            let (qbytes, qf) = match q {
                Dtype::Int4 => (n / 2 + div_ceil(n, 128) * 5 / 2, "Q/2 + Q/128 · 2.5"),
                _ => (n, "Q · 1"),
            };
            let scheme = match q {
                Dtype::Int4 => "4-bit AWQ/GPTQ with a 16-bit scale and 4-bit zero per group of 128",
                Dtype::Fp8 => "FP8 (W8A8 on Ada/Hopper, weight-only elsewhere)",
                _ => "INT8 (W8A8 / LLM.int8())",
            };
            (
                qbytes + (p - n) * 2,
                format!("{qf} + (P − Q) · 2 with Q = {}", thousands(n)),
                format!(
                    "P = {}{split}; decoder matrices (Q) {scheme}; embeddings, LM head, norms in 16-bit",
                    count(model.parameters)
                ),
            )
        }
    };
    e.push("weights", bytes, formula, why, Some("parameter"));

    let (Some(s), Some(b), Some(t)) = (shape, run.batch, run.seq) else {
        let missing = missing_for_activations(shape.is_none());
        e.notes.push(format!("{} are not estimated: {}", missing.what, missing.give));
        e.left_out = Some(missing);
        return Ok(());
    };
    let (b_, t_) = (b as u128, t as u128);
    let kv_bits = run.kv_dtype.bits() as u128;
    let l = s.layers as u128;
    // The 2 is K and V. Some published sheets print ~42.9 GB for Llama-3-70B at 8192 tokens × 32 sequences in
    // fp16; the right figure is 85.9 GB: they dropped this factor of 2 (counting K or V, not both).
    let (per_token_layer, kv_formula, kv_why) = match &s.mla {
        Some(m) => (
            (m.kv_lora_rank + m.qk_rope_head_dim) as u128,
            format!(
                "L · (kv_lora_rank + qk_rope_head_dim) · T · B · bytes = {l}·({} + {})·{t}·{b}·{}",
                m.kv_lora_rank,
                m.qk_rope_head_dim,
                per(kv_bits as u64)
            ),
            "multi-head latent attention caches one compressed latent and the shared RoPE key per token (vLLM/SGLang \
             MLA); replicated on every tensor-parallel rank"
                .to_string(),
        ),
        None => {
            // KV heads split across tensor-parallel ranks; with fewer KV heads than ranks each rank keeps a replica.
            let kv_local = div_ceil(s.kv_heads as u128, tp).max(1);
            let tp_s = if tp > 1 { format!(" (⌈{}/{tp}⌉ per GPU)", s.kv_heads) } else { String::new() };
            (
                2 * kv_local * s.head_dim as u128,
                format!(
                    "2 · L · kv_heads · head_dim · T · B · bytes = 2·{l}·{kv_local}·{}·{t}·{b}·{}",
                    s.head_dim,
                    per(kv_bits as u64)
                ),
                format!(
                    "K and V for {} KV heads{tp_s} of {} dims in every layer, {} tokens for each of {} sequences, {}",
                    s.kv_heads,
                    s.head_dim,
                    t,
                    b,
                    run.kv_dtype.name()
                ),
            )
        }
    };
    debug_assert_eq!(l * per_token_layer * kv_bits / 8, kv_bytes_per_token(s, run));
    e.push("KV cache", l * per_token_layer * t_ * b_ * kv_bits / 8, kv_formula, kv_why, Some("kv_cache"));
    if let Some(w) = model.sliding_window.filter(|w| *w < t) {
        e.notes.push(format!(
            "the model uses a {w}-token sliding window: a cache that honours it (vLLM V1) holds at most {w} tokens per \
             sequence per layer, {} here instead of the full-length figure above",
            bytes_text(l * per_token_layer * w as u128 * b_ * kv_bits / 8)
        ));
    }

    // The forward pass of one batch of prefill tokens, one layer at a time: residual, normed input and the MLP's
    // intermediates (gate, up, their product) are live together at the MLP.
    let tokens = (b_ * t_).min(run.max_batched_tokens as u128);
    let abits: u128 = if run.dtype == Dtype::Fp32 { 32 } else { 16 };
    let ab = abits / 8;
    let (width, width_s) = mlp_width(s);
    let scores = if run.flash_attention { 0 } else { (s.heads as u128) * tokens * tokens.min(t_) };
    e.push(
        "activations",
        (tokens * width + scores) * ab / tp,
        format!(
            "tokens · ({width_s}) · {ab} B{} with tokens = min(B·T, {}) = {tokens}",
            if scores > 0 { " + a·tokens·min(T, tokens) · bytes" } else { "" },
            run.max_batched_tokens
        ),
        "one prefill chunk through one layer at a time (nothing is kept for backward); vLLM's chunked-prefill budget \
         (--max-batched-tokens); the MLP's intermediates dominate",
        Some("activation"),
    );
    if let Some(v) = s.vocab.map(u128::from) {
        e.push(
            "logits",
            b_ * v * (ab + 4) / tp,
            format!("B · V · ({ab} + 4) = {b}·{v}·({ab} + 4)"),
            "logits for the last position of each sequence and their fp32 copy for sampling",
            Some("activation"),
        );
    }
    if run.flash_attention {
        e.notes.push("vLLM's CUDA graphs take another 0.1–1 GiB (not counted; --enforce-eager removes them)".into());
    }
    Ok(())
}

/// KV-cache bytes one token takes on one GPU, all layers.
pub fn kv_bytes_per_token(s: &Shape, run: &Run) -> u128 {
    let per_layer = match &s.mla {
        Some(m) => (m.kv_lora_rank + m.qk_rope_head_dim) as u128,
        None => 2 * div_ceil(s.kv_heads as u128, run.tensor_parallel as u128).max(1) * s.head_dim as u128,
    };
    s.layers as u128 * per_layer * run.kv_dtype.bits() as u128 / 8
}

/// Elements live per token at the MLP: residual + normed input + intermediates.
fn mlp_width(s: &Shape) -> (u128, String) {
    let h = s.hidden as u128;
    let mats: u128 = if s.gated_mlp { 3 } else { 2 };
    match &s.moe {
        None => (2 * h + mats * s.intermediate as u128, format!("2·h + {mats}·I = 2·{h} + {mats}·{}", s.intermediate)),
        Some(m) => {
            let i = (m.expert_intermediate * (m.per_token + m.shared_experts)) as u128;
            (2 * h + mats * i, format!("2·h + {mats}·k·I_expert = 2·{h} + {mats}·{i}"))
        }
    }
}

/// "12.5 GiB (13.5 GB)" for notes.
pub fn bytes_text(n: u128) -> String {
    let n = n.min(u64::MAX as u128) as u64;
    format!("{} ({})", crate::units::bytes(n), crate::units::gb(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(6_738_415_616), "6,738,415,616");
    }
}
