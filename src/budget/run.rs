//! The run's shape: training or serving, batch and sequence, precision, optimizer, parallelism, the memory knobs.

use serde::Serialize;

use super::model::Dtype;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Train,
    Infer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Optimizer {
    /// fp32 first and second moments: 8 bytes per trained parameter.
    Adamw,
    /// bitsandbytes AdamW8bit: block-wise 8-bit moments, 2 bytes per parameter.
    #[value(name = "adamw-8bit")]
    Adamw8bit,
    /// Factored second moment (rows + columns per matrix), no first moment (Hugging Face's default beta1=None).
    Adafactor,
    /// No state.
    Sgd,
    /// One fp32 momentum buffer: 4 bytes per parameter.
    #[value(name = "sgd-momentum")]
    SgdMomentum,
}

impl Optimizer {
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Adamw => "adamw",
            Optimizer::Adamw8bit => "adamw-8bit",
            Optimizer::Adafactor => "adafactor",
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
        }
    }
}

/// Where the fp32 copy of the weights lives in 16-bit training.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MixedPrecision {
    /// 16-bit weights and gradients; the optimizer keeps fp32 master weights (DeepSpeed, Megatron).
    Master,
    /// torch.autocast: fp32 weights and gradients, 16-bit activations (Hugging Face Trainer's bf16=True).
    Amp,
    /// Pure 16-bit: no fp32 copy at all (optimizer moments stay fp32).
    Off,
}

impl MixedPrecision {
    pub fn name(self) -> &'static str {
        match self {
            MixedPrecision::Master => "master",
            MixedPrecision::Amp => "amp",
            MixedPrecision::Off => "off",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "layers")]
pub enum Checkpointing {
    None,
    /// Every layer: only each layer's input is kept.
    Full,
    /// Segments of √L layers (Chen et al. 2016).
    Sqrt,
    /// Segments of k layers.
    Every(u64),
}

impl Checkpointing {
    pub fn parse(s: &str) -> Result<Checkpointing, String> {
        Ok(match s {
            "none" | "off" => Checkpointing::None,
            "full" | "every" | "all" => Checkpointing::Full,
            "sqrt" => Checkpointing::Sqrt,
            _ => match s.strip_prefix("every:").and_then(|k| k.parse::<u64>().ok()) {
                Some(k) if k >= 1 => Checkpointing::Every(k),
                _ => return Err(format!("{s:?}: expected none, full, sqrt or every:K (segments of K layers)")),
            },
        })
    }

    pub fn name(self) -> String {
        match self {
            Checkpointing::None => "none".into(),
            Checkpointing::Full => "full".into(),
            Checkpointing::Sqrt => "sqrt".into(),
            Checkpointing::Every(k) => format!("every:{k}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    None,
    /// ZeRO-Offload: optimizer state and fp32 master weights in CPU memory, the step on the CPU.
    Optimizer,
    /// ZeRO-Infinity / FSDP CPU offload: parameters and gradients too; layers stream to the GPU as needed.
    Params,
}

impl Offload {
    pub fn name(self) -> &'static str {
        match self {
            Offload::None => "none",
            Offload::Optimizer => "optimizer",
            Offload::Params => "params",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Lora {
    pub rank: u64,
    /// QLoRA: the frozen base weights in 4-bit NF4.
    pub quantized: bool,
}

/// Everything about the run that changes memory. `gpus` counts every GPU; data parallelism is what is left after
/// tensor and pipeline parallelism.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub mode: Mode,
    /// Training: the micro-batch per GPU. Serving: concurrent sequences (vLLM's max_num_seqs).
    pub batch: Option<u64>,
    /// Tokens per sequence (serving: prompt + output, vLLM's max_model_len).
    pub seq: Option<u64>,
    pub dtype: Dtype,
    pub mixed_precision: MixedPrecision,
    pub optimizer: Optimizer,
    pub zero: u8,
    pub gpus: u64,
    pub tensor_parallel: u64,
    pub pipeline_parallel: u64,
    pub checkpointing: Checkpointing,
    /// FlashAttention / SDPA: the s×s attention scores are never stored.
    pub flash_attention: bool,
    pub lora: Option<Lora>,
    pub offload: Offload,
    pub kv_dtype: Dtype,
    pub block_size: u64,
    pub gpu_memory_utilization: f64,
    pub max_batched_tokens: u64,
    /// Set by the solver when it shrinks the micro-batch: steps accumulated per optimizer update.
    pub grad_accumulation: u64,
}

impl Run {
    pub fn data_parallel(&self) -> u64 {
        (self.gpus / (self.tensor_parallel * self.pipeline_parallel)).max(1)
    }

    /// Checks the combination; the error is one line for the command line.
    pub fn validate(&self) -> Result<(), InvalidRun> {
        if self.gpus == 0 || self.tensor_parallel == 0 || self.pipeline_parallel == 0 {
            return Err(InvalidRun("--gpus, --tp and --pp must be at least 1".into()));
        }
        // Beyond these no run exists, and the budget's products (s·b·h·a·s…) must stay inside 128 bits.
        for (flag, v, max) in [
            ("--batch", self.batch.unwrap_or(1), 1u64 << 24),
            ("--seq", self.seq.unwrap_or(1), 1 << 24),
            ("--gpus", self.gpus, 1 << 24),
            ("--tp", self.tensor_parallel, 1 << 24),
            ("--pp", self.pipeline_parallel, 1 << 24),
            ("--block-size", self.block_size, 1 << 20),
            ("--max-batched-tokens", self.max_batched_tokens, 1 << 32),
            ("--lora/--qlora rank", self.lora.map_or(1, |l| l.rank), 1 << 20),
        ] {
            if v > max {
                return Err(InvalidRun(format!("{flag} {v} is larger than any run's (at most {max})")));
            }
        }
        if !self.gpus.is_multiple_of(self.tensor_parallel * self.pipeline_parallel) {
            return Err(InvalidRun(format!(
                "--gpus {} is not a multiple of --tp {} × --pp {}",
                self.gpus, self.tensor_parallel, self.pipeline_parallel
            )));
        }
        if self.zero > 3 {
            return Err(InvalidRun(format!("--zero {}: ZeRO stages are 0, 1, 2 and 3", self.zero)));
        }
        if self.offload == Offload::Params && self.zero != 3 {
            return Err(InvalidRun("--offload params streams ZeRO-3 / FSDP shards from the CPU: add --zero 3".into()));
        }
        if self.mode == Mode::Train && !self.dtype.is_float() {
            return Err(InvalidRun(format!(
                "--dtype {} trains nothing: use bf16/fp16/fp32 (with --qlora R for a 4-bit base)",
                self.dtype.name()
            )));
        }
        if self.mode == Mode::Infer && (self.lora.is_some() || self.offload != Offload::None || self.zero > 0) {
            return Err(InvalidRun(
                "--lora, --qlora, --offload and --zero are training options; drop them with --infer".into(),
            ));
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return Err(InvalidRun(format!(
                "--gpu-memory-utilization {}: expected a fraction in (0, 1]",
                self.gpu_memory_utilization
            )));
        }
        if self.block_size == 0 || self.max_batched_tokens == 0 {
            return Err(InvalidRun("--block-size and --max-batched-tokens must be positive".into()));
        }
        if self.batch == Some(0) || self.seq == Some(0) {
            return Err(InvalidRun("--batch and --seq must be positive".into()));
        }
        Ok(())
    }

    /// One line: "train · batch 4 × seq 4096 · bf16 (fp32 master) · adamw · ZeRO-0 · 1 GPU · checkpointing none".
    pub fn summary(&self) -> String {
        let mut parts = vec![match self.mode {
            Mode::Train => "train".to_string(),
            Mode::Infer => "serve".to_string(),
        }];
        let shape = match (self.batch, self.seq, self.mode) {
            (Some(b), Some(s), Mode::Infer) => format!("{b} sequences × {s} tokens"),
            (Some(b), Some(s), Mode::Train) => format!("micro-batch {b} × seq {s}"),
            (Some(b), None, _) => format!("batch {b}"),
            (None, Some(s), _) => format!("seq {s}"),
            (None, None, _) => "no batch/seq given".into(),
        };
        parts.push(shape);
        if self.grad_accumulation > 1 {
            parts.push(format!("{}× gradient accumulation", self.grad_accumulation));
        }
        match self.mode {
            Mode::Train => {
                let mp = match (self.dtype, self.mixed_precision) {
                    (Dtype::Fp32, _) => "fp32".to_string(),
                    (d, MixedPrecision::Master) => format!("{} (fp32 master weights)", d.name()),
                    (d, MixedPrecision::Amp) => format!("{} autocast (fp32 weights)", d.name()),
                    (d, MixedPrecision::Off) => format!("pure {}", d.name()),
                };
                parts.push(mp);
                if let Some(l) = self.lora {
                    parts.push(format!("{} r={}", if l.quantized { "QLoRA" } else { "LoRA" }, l.rank));
                }
                parts.push(self.optimizer.name().to_string());
                parts.push(format!("ZeRO-{}", self.zero));
                parts.push(format!("checkpointing {}", self.checkpointing.name()));
                if self.offload != Offload::None {
                    parts.push(format!("offload {}", self.offload.name()));
                }
            }
            Mode::Infer => {
                parts.push(format!("weights {}", self.dtype.name()));
                parts.push(format!("KV {}", self.kv_dtype.name()));
            }
        }
        let mut gpus = format!("{} GPU{}", self.gpus, if self.gpus == 1 { "" } else { "s" });
        if self.tensor_parallel > 1 || self.pipeline_parallel > 1 {
            gpus.push_str(&format!(" (TP {}, PP {})", self.tensor_parallel, self.pipeline_parallel));
        }
        parts.push(gpus);
        if !self.flash_attention {
            parts.push("eager attention".into());
        }
        parts.join(" · ")
    }
}

/// A run the flags describe that cannot be: which flags, and why (one line for the command line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRun(pub String);
