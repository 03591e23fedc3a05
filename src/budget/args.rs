//! The command-line options of `oomdoc budget` (and the prediction options of `oomdoc analyze --model`), turned
//! once into a [`Model`](super::Model) and a [`Run`](super::Run) so nothing downstream reads argument strings.

use std::path::PathBuf;

use super::model::{self, Dtype, ModelFlags};
use super::run::{Checkpointing, Lora, MixedPrecision, Mode, Offload, Optimizer, Run};
use super::BudgetError as Error;
use super::{gpus, plan, Budget};

pub const BUDGET_HELP: &str =
    "The memory budget before a run: every byte per GPU with its formula, a verdict, and what \
    would fit.\n\n\
    Adds up what one GPU must hold — weights, gradients, optimizer states, master weights, activations (Korthikanti \
    et al.), logits, KV cache, CUDA context, NCCL — and prints each line with its formula and assumption, in decimal \
    GB (1e9 bytes) and GiB. With --gpu or --gpu-memory it says whether the job fits; when it does not, it walks the \
    knobs practitioners reach for (BF16, checkpointing, 8-bit optimizer, ZeRO-1/2, smaller micro-batch with \
    gradient accumulation, ZeRO-3, more GPUs, CPU offload; for serving FP8 KV cache, FP8 weights, fewer sequences, \
    4-bit weights, shorter context, tensor parallelism) and proposes the cheapest set of changes that fits.";

/// The help headings of the model's and the run's flags (the commands that take them beside a snapshot list them in
/// `--help` only).
pub const MODEL_HEADING: &str = "Model (a config.json, flags, or both: flags win)";
pub const RUN_HEADING: &str = "Run";

pub const BUDGET_EXAMPLES: &str = "\
Examples (the shape flags run as written; --config reads a model's config.json instead):
  # 7B with AdamW in mixed precision: 16 bytes per parameter before a single activation
  oomdoc budget --params 7e9 --train --gpu h100-80gb
  # Full fine-tune of Llama-2-7B (its shape) on one H100: does it fit, and if not, what would?
  oomdoc budget --layers 32 --hidden 4096 --heads 32 --intermediate 11008 --vocab 32000 --train \\
      --batch 4 --seq 4096 --gpu h100-80gb
  # A 70B (Llama-3-70B's shape) on 8 GPUs with ZeRO-3 and checkpointing
  oomdoc budget --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --intermediate 28672 \\
      --vocab 128256 --train --batch 1 --seq 8192 --gpus 8 --zero 3 --checkpointing full \\
      --gpu h100-80gb
  # Serving an 8B (Llama-3.1-8B's shape) at 32k context, 4 sequences at a time, on a 24 GB card, as JSON
  oomdoc budget --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 \\
      --vocab 128256 --infer --batch 4 --seq 32768 --gpu 4090 --format json
  # Your model's own config.json
  oomdoc budget --config config.json --train --batch 8 --seq 2048 --gpu a100-80gb
  # After an OOM: the budget beside what the snapshot measured
  oomdoc analyze snap.pickle --config config.json --train --batch 8 --seq 2048

Known GPUs: h100-80gb, h200, a100-80gb, a100-40gb, l40s, l4, a10g, 4090, 3090, t4.";

/// What the model is.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = MODEL_HEADING)]
pub struct ModelArgs {
    /// A Hugging Face config.json: layers, hidden size, heads, KV heads, head_dim, intermediate size, vocabulary,
    /// tied embeddings, torch_dtype, MoE and MLA fields.
    #[arg(long, value_name = "FILE", visible_alias = "model")]
    pub config: Option<PathBuf>,
    /// Parameter count (7e9, 6.7B, 70b); overrides the count from the shape.
    #[arg(long, value_name = "N", value_parser = parse_count)]
    pub params: Option<u64>,
    /// Decoder layers (num_hidden_layers).
    #[arg(long, value_name = "L", value_parser = parse_count)]
    pub layers: Option<u64>,
    /// Hidden size (hidden_size).
    #[arg(long, value_name = "H", value_parser = parse_count)]
    pub hidden: Option<u64>,
    /// Attention heads (num_attention_heads).
    #[arg(long, value_name = "A", value_parser = parse_count)]
    pub heads: Option<u64>,
    /// KV heads (num_key_value_heads; fewer than --heads is GQA). Default: --heads.
    #[arg(long, value_name = "K", value_parser = parse_count)]
    pub kv_heads: Option<u64>,
    /// Dimensions per head. Default: hidden / heads.
    #[arg(long, value_name = "D", value_parser = parse_count)]
    pub head_dim: Option<u64>,
    /// MLP intermediate size (intermediate_size).
    #[arg(long, value_name = "I", value_parser = parse_count)]
    pub intermediate: Option<u64>,
    /// Vocabulary size (vocab_size).
    #[arg(long, value_name = "V", value_parser = parse_count)]
    pub vocab: Option<u64>,
    /// MoE: experts per layer.
    #[arg(long, value_name = "E", value_parser = parse_count)]
    pub experts: Option<u64>,
    /// MoE: experts each token is routed to.
    #[arg(long, value_name = "K", value_parser = parse_count)]
    pub experts_per_token: Option<u64>,
    /// The LM head shares the embedding matrix (tie_word_embeddings). Default: the config's, else untied.
    #[arg(long)]
    pub tie_embeddings: bool,
}

/// How the model runs.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = RUN_HEADING)]
pub struct RunArgs {
    /// Budget a training step.
    #[arg(long, conflicts_with = "infer")]
    pub train: bool,
    /// Budget serving (vLLM-style PagedAttention KV cache, no gradients).
    #[arg(long)]
    pub infer: bool,
    /// Training: micro-batch per GPU. Serving: concurrent sequences (vLLM's max_num_seqs).
    #[arg(long, value_name = "B", value_parser = parse_count)]
    pub batch: Option<u64>,
    /// Tokens per sequence (serving: prompt + output, vLLM's max_model_len).
    #[arg(long, value_name = "T", value_parser = parse_count)]
    pub seq: Option<u64>,
    /// Weights and compute: bf16, fp16, fp32, fp8 (serving also int8, int4). Default: bf16 for training; for
    /// serving the config's torch_dtype if 16-bit, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub dtype: Option<Dtype>,
    /// Where the fp32 weights live in 16-bit training: master (16-bit model + fp32 master copy in the optimizer),
    /// amp (torch.autocast: fp32 model), off (pure 16-bit).
    #[arg(long, value_enum, value_name = "HOW", default_value_t = MixedPrecision::Master)]
    pub mixed_precision: MixedPrecision,
    /// Optimizer.
    #[arg(long, value_enum, default_value_t = Optimizer::Adamw)]
    pub optimizer: Optimizer,
    /// ZeRO stage: 1 shards optimizer state and master weights, 2 also gradients, 3 also weights (= FSDP).
    #[arg(long, value_name = "STAGE", default_value_t = 0)]
    pub zero: u8,
    /// FSDP FULL_SHARD: the same as --zero 3.
    #[arg(long)]
    pub fsdp: bool,
    /// GPUs in all (data parallel = gpus / (tp × pp)).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_count)]
    pub gpus: u64,
    /// Tensor-parallel size (with sequence parallelism).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_count)]
    pub tp: u64,
    /// Pipeline-parallel size.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_count)]
    pub pp: u64,
    /// Activation checkpointing: none, full (every layer), sqrt (segments of √L layers), every:K.
    #[arg(long, value_name = "HOW", default_value = "none", value_parser = Checkpointing::parse)]
    pub checkpointing: Checkpointing,
    /// Attention kernel: flash (FlashAttention/SDPA: no s×s scores stored) or eager.
    #[arg(long, value_name = "KIND", default_value = "flash", value_parser = ["flash", "sdpa", "eager"])]
    pub attention: String,
    /// LoRA of this rank on every linear layer (frozen base in --dtype).
    #[arg(long, value_name = "R", conflicts_with = "qlora", value_parser = parse_count)]
    pub lora: Option<u64>,
    /// QLoRA: LoRA of this rank on a 4-bit NF4 base.
    #[arg(long, value_name = "R", value_parser = parse_count)]
    pub qlora: Option<u64>,
    /// CPU offload: none, optimizer (ZeRO-Offload), params (ZeRO-Infinity / FSDP offload; needs --zero 3).
    #[arg(long, value_enum, default_value_t = Offload::None)]
    pub offload: Offload,
    /// Serving: KV-cache dtype (bf16, fp16, fp8). Default: the weights' dtype if 16-bit, else bf16.
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub kv_dtype: Option<Dtype>,
    /// Serving: PagedAttention block size in tokens.
    #[arg(long, value_name = "TOKENS", default_value_t = 16, value_parser = parse_count)]
    pub block_size: u64,
    /// Serving: the share of the GPU vLLM may use.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Serving: tokens per forward pass (vLLM's max_num_batched_tokens, the chunked-prefill budget).
    #[arg(long, value_name = "TOKENS", default_value_t = 8192, value_parser = parse_count)]
    pub max_batched_tokens: u64,
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs {
            train: false,
            infer: false,
            batch: None,
            seq: None,
            dtype: None,
            mixed_precision: MixedPrecision::Master,
            optimizer: Optimizer::Adamw,
            zero: 0,
            fsdp: false,
            gpus: 1,
            tp: 1,
            pp: 1,
            checkpointing: Checkpointing::None,
            attention: "flash".into(),
            lora: None,
            qlora: None,
            offload: Offload::None,
            kv_dtype: None,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            max_batched_tokens: 8192,
        }
    }
}

/// `oomdoc budget`.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = BUDGET_EXAMPLES)]
pub struct BudgetArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// The GPU to check against: h100-80gb, h200, a100-80gb, a100-40gb, l40s, l4, a10g, 4090, 3090, t4.
    #[arg(long, value_name = "NAME", conflicts_with = "gpu_memory", help_heading = "Verdict")]
    pub gpu: Option<String>,
    /// The GPU's memory instead of a name (80GiB, 40GB, 85899345920).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, help_heading = "Verdict")]
    pub gpu_memory: Option<u64>,
    /// The solver may propose up to this many GPUs in all. Default: --gpus (the hardware you have).
    #[arg(long, value_name = "N", help_heading = "Verdict", value_parser = parse_count)]
    pub max_gpus: Option<u64>,
}

/// The options `oomdoc analyze` takes to put a prediction beside a snapshot.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PredictArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

impl ModelArgs {
    fn flags(&self) -> ModelFlags {
        ModelFlags {
            config: self.config.clone(),
            params: self.params,
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            intermediate: self.intermediate,
            vocab: self.vocab,
            experts: self.experts,
            experts_per_token: self.experts_per_token,
            tied_embeddings: self.tie_embeddings,
        }
    }
}

impl RunArgs {
    /// The run, with defaults that depend on the model (dtype from the config's torch_dtype).
    pub fn to_run(&self, model: &super::Model) -> Result<Run, Error> {
        let mode = if self.infer { Mode::Infer } else { Mode::Train };
        // Serving runs the checkpoint's own 16-bit dtype (vLLM's dtype=auto); training defaults to bf16, which
        // needs no loss scaling, even for checkpoints stored in fp16 such as Llama-2.
        let native16 = match (mode, model.torch_dtype) {
            (Mode::Infer, Some(Dtype::Fp16)) => Dtype::Fp16,
            _ => Dtype::Bf16,
        };
        let dtype = self.dtype.unwrap_or(native16);
        let kv_dtype = self.kv_dtype.unwrap_or(if dtype.bits() == 16 { dtype } else { native16 });
        if !kv_dtype.is_float() {
            return Err(Error::Usage(format!("--kv-dtype {}: expected bf16, fp16, fp8 or fp32", kv_dtype.name())));
        }
        let lora = match (self.lora, self.qlora) {
            (Some(r), _) => Some(Lora { rank: r, quantized: false }),
            (None, Some(r)) => Some(Lora { rank: r, quantized: true }),
            (None, None) => None,
        };
        if lora.is_some_and(|l| l.rank == 0) {
            return Err(Error::Usage("--lora/--qlora rank must be at least 1".into()));
        }
        let run = Run {
            mode,
            batch: self.batch,
            seq: self.seq,
            dtype,
            mixed_precision: self.mixed_precision,
            optimizer: self.optimizer,
            zero: if self.fsdp { 3 } else { self.zero },
            gpus: self.gpus,
            tensor_parallel: self.tp,
            pipeline_parallel: self.pp,
            checkpointing: self.checkpointing,
            flash_attention: self.attention != "eager",
            lora,
            offload: self.offload,
            kv_dtype,
            block_size: self.block_size,
            gpu_memory_utilization: self.gpu_memory_utilization,
            max_batched_tokens: self.max_batched_tokens,
            grad_accumulation: 1,
        };
        run.validate().map_err(|e| Error::Usage(e.0))?;
        Ok(run)
    }
}

/// Parses and plans `oomdoc budget`.
pub fn budget(args: &BudgetArgs) -> Result<Budget, Error> {
    if !args.run.train && !args.run.infer {
        return Err(Error::Usage("say what to budget: --train or --infer".into()));
    }
    let model = model::load(&args.model.flags())?;
    let run = args.run.to_run(&model)?;
    // Without the run's shape the sheet still gives the model states (and says what is missing), but a verdict
    // against a GPU would leave out the activations or the KV cache: it needs them.
    let verdict = args.gpu.is_some() || args.gpu_memory.is_some();
    if verdict && model.shape.is_some() && (run.batch.is_none() || run.seq.is_none()) {
        return Err(Error::Usage(match run.mode {
            Mode::Train => {
                "a verdict needs the run's shape: --batch (micro-batch per GPU) and --seq (tokens per sequence)".into()
            }
            Mode::Infer => {
                "a verdict needs the run's shape: --batch (concurrent sequences) and --seq (max_model_len)".into()
            }
        }));
    }
    let gpu = match (&args.gpu, args.gpu_memory) {
        (Some(name), _) => Some(gpus::find(name).map_err(|e| Error::Usage(e.to_string()))?),
        (None, Some(bytes)) => Some(gpus::custom(bytes)),
        (None, None) => None,
    };
    let max_gpus = args.max_gpus.unwrap_or(run.gpus);
    plan(model, run, gpu, max_gpus)
}

/// The prediction for `oomdoc analyze --model …`, or None when no model option was given.
pub fn predict(args: &PredictArgs) -> Result<Option<Budget>, Error> {
    let f = args.model.flags();
    if !f.any() {
        return Ok(None);
    }
    let model = model::load(&f)?;
    let run = args.run.to_run(&model)?;
    plan(model, run, None, 1).map(Some)
}

/// "7e9", "6.7B", "70b", "1.3B", "124M", "32k", "6738415616": every count oomdoc takes (parameters, layers, batch,
/// sequence length…) is written as people write it. A count must come out whole: "1.5" layers is refused.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let (num, scale) = match t.chars().last().map(|c| c.to_ascii_lowercase()) {
        Some('b') => (&t[..t.len() - 1], 1e9),
        Some('m') => (&t[..t.len() - 1], 1e6),
        Some('k') => (&t[..t.len() - 1], 1e3),
        Some('t') => (&t[..t.len() - 1], 1e12),
        _ => (t.as_str(), 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(n) if n > 0.0 && n.is_finite() && n * scale < 1.8e19 => {
            let v = n * scale;
            if (v - v.round()).abs() > 1e-6 * v.max(1.0) {
                return Err(format!("{s:?}: expected a whole number"));
            }
            Ok(v.round() as u64)
        }
        _ => Err(format!("{s:?}: expected a count such as 7e9, 6.7B, 70b or 124M")),
    }
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    Dtype::parse(s).ok_or_else(|| format!("{s:?}: expected bf16, fp16, fp32, fp8, int8 or int4"))
}

/// "80GiB", "40GB", "85899345920".
pub fn parse_size(s: &str) -> Result<u64, String> {
    crate::units::parse_size_arg(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sizes() {
        assert_eq!(parse_count("7e9").unwrap(), 7_000_000_000);
        assert_eq!(parse_count("6.7B").unwrap(), 6_700_000_000);
        assert_eq!(parse_count("124m").unwrap(), 124_000_000);
        assert!(parse_count("seven").is_err());
        for (text, n) in [("7b", 7e9), ("7B", 7e9), ("6.7e9", 6.7e9), ("70b", 70e9), ("1.3B", 1.3e9), ("32k", 32e3)] {
            assert_eq!(parse_count(text).unwrap(), n as u64, "{text}");
        }
        assert!(parse_count("1.5").is_err(), "a fraction is no count");
        assert!(parse_count("1e30").is_err(), "beyond 64 bits");
        assert!(parse_count("-1").is_err());
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("40GB").unwrap(), 40_000_000_000);
        assert!(parse_size("80 parsecs").is_err());
    }
}
