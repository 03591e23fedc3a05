//! The model: its shape, read from a Hugging Face `config.json` and/or flags, and the parameter count that shape
//! implies. Counting is done per weight matrix (not with a `12·L·h²` rule of thumb) because the budget needs the
//! matrices themselves: LoRA adapters, Adafactor's factored state, quantised weights and ZeRO-3's gather buffers are
//! all sized from them.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};

use super::BudgetError as Error;

/// A number format for weights, activations or the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
    Fp8,
    Int8,
    Int4,
}

impl Dtype {
    pub fn bits(self) -> u64 {
        match self {
            Dtype::Fp32 => 32,
            Dtype::Bf16 | Dtype::Fp16 => 16,
            Dtype::Fp8 | Dtype::Int8 => 8,
            Dtype::Int4 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp8 => "fp8",
            Dtype::Int8 => "int8",
            Dtype::Int4 => "int4",
        }
    }

    /// Accepts our spellings and PyTorch's (`torch_dtype` in config.json).
    pub fn parse(s: &str) -> Option<Dtype> {
        Some(match s.trim().trim_start_matches("torch.").to_ascii_lowercase().as_str() {
            "fp32" | "float32" | "float" | "f32" => Dtype::Fp32,
            "bf16" | "bfloat16" => Dtype::Bf16,
            "fp16" | "float16" | "half" | "f16" => Dtype::Fp16,
            "fp8" | "float8" | "float8_e4m3fn" | "float8_e5m2" | "e4m3" => Dtype::Fp8,
            "int8" | "w8a8" => Dtype::Int8,
            "int4" | "awq" | "gptq" | "w4a16" => Dtype::Int4,
            _ => return None,
        })
    }

    /// Floating point: usable for training and for activations.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Fp32 | Dtype::Bf16 | Dtype::Fp16 | Dtype::Fp8)
    }
}

/// One weight matrix of a decoder block (`copies` > 1 for MoE experts).
#[derive(Clone, Debug, Serialize)]
pub struct Linear {
    pub name: &'static str,
    pub inputs: u64,
    pub outputs: u64,
    pub bias: bool,
    pub copies: u64,
    /// Copies a token actually passes through (MoE top-k); equals `copies` for dense layers.
    pub active_copies: u64,
}

impl Linear {
    fn new(name: &'static str, inputs: u64, outputs: u64, bias: bool) -> Linear {
        Linear { name, inputs, outputs, bias, copies: 1, active_copies: 1 }
    }

    /// Parameters of one copy.
    pub fn params_one(&self) -> u64 {
        self.inputs * self.outputs + if self.bias { self.outputs } else { 0 }
    }

    pub fn params(&self) -> u64 {
        self.params_one() * self.copies
    }
}

/// A kind of decoder layer and how many of the model's layers are of that kind (DeepSeek has dense layers first,
/// then MoE layers).
#[derive(Clone, Debug, Serialize)]
pub struct Block {
    pub count: u64,
    pub linears: Vec<Linear>,
    /// Norm weights, biases outside the matrices, router correction biases: small tensors.
    pub vectors: u64,
}

impl Block {
    pub fn params(&self) -> u64 {
        self.linears.iter().map(Linear::params).sum::<u64>() + self.vectors
    }

    pub fn linear_params(&self) -> u64 {
        self.linears.iter().map(Linear::params).sum()
    }

    fn active_params(&self) -> u64 {
        self.linears.iter().map(|l| l.params_one() * l.active_copies).sum::<u64>() + self.vectors
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Moe {
    pub experts: u64,
    pub per_token: u64,
    pub expert_intermediate: u64,
    pub shared_experts: u64,
    /// Leading layers that keep a dense MLP (DeepSeek's `first_k_dense_replace`).
    pub dense_layers: u64,
}

/// Multi-head latent attention (DeepSeek-V2/V3): K and V are cached as one compressed latent per token.
#[derive(Clone, Debug, Serialize)]
pub struct Mla {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

/// The decoder's shape.
#[derive(Clone, Debug, Serialize)]
pub struct Shape {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub intermediate: u64,
    /// Unknown when flags gave part of the shape with --params: the logits are then not estimated.
    pub vocab: Option<u64>,
    pub tied_embeddings: bool,
    /// SwiGLU/GeGLU (gate, up, down) rather than a two-matrix MLP.
    pub gated_mlp: bool,
    /// Learned absolute position embeddings (GPT-2): this many rows.
    pub learned_positions: Option<u64>,
    pub moe: Option<Moe>,
    pub mla: Option<Mla>,
    #[serde(skip)]
    pub family: Family,
}

/// What differs between architectures in the count: biases, LayerNorm vs RMSNorm, per-head q/k norms.
#[derive(Clone, Copy, Debug, Default)]
pub struct Family {
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// LayerNorm has a bias as well as a gain: two vectors per norm instead of one.
    pub layernorm: bool,
    /// Qwen3-style RMSNorm on each head's q and k.
    pub qk_norm: bool,
    /// DeepSeek-V3's per-expert routing correction bias.
    pub router_bias: bool,
}

impl Shape {
    fn norm_vectors(&self) -> u64 {
        if self.family.layernorm {
            2 * self.hidden
        } else {
            self.hidden
        }
    }

    fn attention(&self) -> (Vec<Linear>, u64) {
        let (h, f) = (self.hidden, self.family);
        let mut vectors = 0;
        let linears = match &self.mla {
            Some(m) => {
                let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
                let mut v = Vec::new();
                match m.q_lora_rank {
                    Some(r) => {
                        v.push(Linear::new("q_a_proj", h, r, false));
                        v.push(Linear::new("q_b_proj", r, self.heads * qk, false));
                        vectors += r;
                    }
                    None => v.push(Linear::new("q_proj", h, self.heads * qk, false)),
                }
                v.push(Linear::new("kv_a_proj_with_mqa", h, m.kv_lora_rank + m.qk_rope_head_dim, false));
                vectors += m.kv_lora_rank;
                v.push(Linear::new(
                    "kv_b_proj",
                    m.kv_lora_rank,
                    self.heads * (m.qk_nope_head_dim + m.v_head_dim),
                    false,
                ));
                v.push(Linear::new("o_proj", self.heads * m.v_head_dim, h, false));
                v
            }
            None => {
                let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
                vec![
                    Linear::new("q_proj", h, q, f.qkv_bias),
                    Linear::new("k_proj", h, kv, f.qkv_bias),
                    Linear::new("v_proj", h, kv, f.qkv_bias),
                    Linear::new("o_proj", q, h, f.o_bias),
                ]
            }
        };
        if f.qk_norm {
            vectors += 2 * self.head_dim;
        }
        (linears, vectors)
    }

    fn mlp(&self, intermediate: u64, copies: u64, active: u64) -> Vec<Linear> {
        let (h, b) = (self.hidden, self.family.mlp_bias);
        let mut v = if self.gated_mlp {
            vec![
                Linear::new("gate_proj", h, intermediate, b),
                Linear::new("up_proj", h, intermediate, b),
                Linear::new("down_proj", intermediate, h, b),
            ]
        } else {
            vec![Linear::new("up_proj", h, intermediate, b), Linear::new("down_proj", intermediate, h, b)]
        };
        for l in &mut v {
            l.copies = copies;
            l.active_copies = active;
        }
        v
    }

    /// The decoder layers, grouped by kind.
    pub fn blocks(&self) -> Vec<Block> {
        let (attn, attn_vectors) = self.attention();
        let norms = 2 * self.norm_vectors();
        let dense = || {
            let mut linears = attn.clone();
            linears.extend(self.mlp(self.intermediate, 1, 1));
            Block { count: 0, linears, vectors: attn_vectors + norms }
        };
        match &self.moe {
            None => vec![Block { count: self.layers, ..dense() }],
            Some(m) => {
                let mut linears = attn.clone();
                linears.push(Linear::new("router", self.hidden, m.experts, false));
                linears.extend(self.mlp(m.expert_intermediate, m.experts, m.per_token));
                if m.shared_experts > 0 {
                    // DeepSeek's shared experts are one MLP of n_shared × moe_intermediate_size.
                    linears.extend(self.mlp(m.expert_intermediate * m.shared_experts, 1, 1));
                }
                let router_bias = if self.family.router_bias { m.experts } else { 0 };
                let moe =
                    Block { count: self.layers - m.dense_layers, linears, vectors: attn_vectors + norms + router_bias };
                let mut v = Vec::new();
                if m.dense_layers > 0 {
                    v.push(Block { count: m.dense_layers, ..dense() });
                }
                v.push(moe);
                v
            }
        }
    }

    pub fn embedding_params(&self) -> u64 {
        self.vocab.unwrap_or(0) * self.hidden + self.learned_positions.unwrap_or(0) * self.hidden
    }

    pub fn head_params(&self) -> u64 {
        if self.tied_embeddings {
            0
        } else {
            self.vocab.unwrap_or(0) * self.hidden
        }
    }

    /// Every parameter: embeddings, decoder layers, the final norm, the LM head (once if tied).
    pub fn parameters(&self) -> u64 {
        let blocks: u64 = self.blocks().iter().map(|b| b.params() * b.count).sum();
        self.embedding_params() + blocks + self.norm_vectors() + self.head_params()
    }

    /// Parameters one token passes through (differs from [`parameters`](Self::parameters) for MoE).
    pub fn active_parameters(&self) -> u64 {
        let blocks: u64 = self.blocks().iter().map(|b| b.active_params() * b.count).sum();
        self.embedding_params() + blocks + self.norm_vectors() + self.head_params()
    }

    /// Parameters in the decoder layers' weight matrices: what LoRA adapts and what weight quantisation
    /// (NF4, AWQ, FP8 checkpoints) quantises; embeddings, the LM head and norms usually stay 16-bit.
    pub fn block_linear_params(&self) -> u64 {
        self.blocks().iter().map(|b| b.linear_params() * b.count).sum()
    }

    /// The largest single decoder layer's parameters: the unit FSDP/ZeRO-3 gathers.
    pub fn largest_layer_params(&self) -> u64 {
        self.blocks().iter().map(Block::params).max().unwrap_or(0)
    }

    /// KV-cache elements per token per layer: K and V for every KV head, or MLA's compressed latent plus the
    /// decoupled RoPE key.
    pub fn kv_elements_per_token_layer(&self) -> u64 {
        match &self.mla {
            Some(m) => m.kv_lora_rank + m.qk_rope_head_dim,
            None => 2 * self.kv_heads * self.head_dim,
        }
    }
}

/// The model as the budget sees it.
#[derive(Clone, Debug, Serialize)]
pub struct Model {
    /// A short name: the config's `_name_or_path`, its file name, or "model".
    pub name: String,
    /// Where it came from: the config path and/or "flags".
    pub source: String,
    pub model_type: Option<String>,
    pub shape: Option<Shape>,
    /// The count the budget uses: `--params` if given, else counted from the shape.
    pub parameters: u64,
    /// Counted from the shape (absent without one).
    pub counted_parameters: Option<u64>,
    pub active_parameters: Option<u64>,
    /// `torch_dtype` from config.json.
    pub torch_dtype: Option<Dtype>,
    pub max_position_embeddings: Option<u64>,
    pub sliding_window: Option<u64>,
    pub notes: Vec<String>,
}

/// Model flags; any of them overrides the config.
#[derive(Clone, Debug, Default)]
pub struct ModelFlags {
    pub config: Option<std::path::PathBuf>,
    pub params: Option<u64>,
    pub layers: Option<u64>,
    pub hidden: Option<u64>,
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub intermediate: Option<u64>,
    pub vocab: Option<u64>,
    pub experts: Option<u64>,
    pub experts_per_token: Option<u64>,
    pub tied_embeddings: bool,
}

impl ModelFlags {
    pub fn any(&self) -> bool {
        self.config.is_some()
            || self.params.is_some()
            || self.layers.is_some()
            || self.hidden.is_some()
            || self.heads.is_some()
            || self.intermediate.is_some()
            || self.vocab.is_some()
    }
}

/// Model types whose MLP is two matrices (up, down) with a plain activation, and whose blocks carry biases and
/// LayerNorms. Everything else is treated as Llama-style (gated MLP, RMSNorm, no biases), which covers Llama,
/// Mistral, Mixtral, Qwen2/3, Gemma, Phi-3 and DeepSeek.
const GPT_STYLE: &[&str] = &["gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt", "bloom", "phi", "starcoder2", "falcon"];
const LEARNED_POSITIONS: &[&str] = &["gpt2", "gpt_bigcode", "opt"];

/// Reads `path` (a Hugging Face config.json) and applies the flags on top.
pub fn load(flags: &ModelFlags) -> Result<Model, Error> {
    let cfg = match &flags.config {
        Some(p) => Some(read_config(p)?),
        None => None,
    };
    from_config(flags, cfg)
}

/// Why a Hugging Face config.json could not be used (the error around it names the file).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("expected a Hugging Face config.json (JSON): {0}")]
    Json(#[source] serde_json::Error),
    #[error("expected a Hugging Face config.json: a JSON object")]
    NotAnObject,
    /// A value no model has (a fractional layer count, a negative size).
    #[error("{0}")]
    Value(String),
}

/// [`load`], given the config.json already read (see [`parse_config`]).
pub fn from_config(flags: &ModelFlags, cfg: Option<Map<String, Value>>) -> Result<Model, Error> {
    let path = flags.config.as_ref().map(|p| p.display().to_string());
    let mut notes = Vec::new();
    let bad = |message: String| Error::Config {
        path: path.clone().unwrap_or_else(|| "<flags>".into()),
        source: ConfigError::Value(message),
    };

    let c = cfg.as_ref();
    let get = |keys: &[&str]| -> Result<Option<u64>, Error> {
        let Some(c) = c else { return Ok(None) };
        for k in keys {
            match c.get(*k) {
                None | Some(Value::Null) => continue,
                Some(v) => {
                    return match v.as_u64() {
                        Some(n) => Ok(Some(n)),
                        None => Err(bad(format!("\"{k}\" should be a whole number, found {v}"))),
                    }
                }
            }
        }
        Ok(None)
    };
    let text = |key: &str| c.and_then(|c| c.get(key)).and_then(Value::as_str).map(str::to_string);
    let model_type = text("model_type");
    let mt = model_type.as_deref().unwrap_or("");

    // Beyond these no model exists, and the products of the formulas (s·b·h·a·s…) must stay inside 128 bits.
    let bounded = |v: Option<u64>, what: &str, max: u64| -> Result<Option<u64>, Error> {
        match v {
            Some(n) if n > max => Err(bad(format!("{what} {n} is larger than any model's (at most {max})"))),
            v => Ok(v),
        }
    };
    let layers = bounded(flags.layers.or(get(&["num_hidden_layers", "n_layer", "num_layers"])?), "layers", 1 << 16)?;
    let hidden = bounded(flags.hidden.or(get(&["hidden_size", "n_embd", "d_model"])?), "hidden size", 1 << 24)?;
    let heads = bounded(flags.heads.or(get(&["num_attention_heads", "n_head"])?), "attention heads", 1 << 16)?;
    let vocab = bounded(flags.vocab.or(get(&["vocab_size"])?), "vocabulary", 1 << 32)?;
    let gpt_style = GPT_STYLE.contains(&mt);
    let intermediate = match bounded(
        flags.intermediate.or(get(&["intermediate_size", "n_inner", "ffn_dim"])?),
        "intermediate size",
        1 << 26,
    )? {
        Some(i) => Some(i),
        // GPT-2 writes n_inner: null for the default 4·h.
        None if gpt_style => hidden.map(|h| 4 * h),
        None => None,
    };

    // A config.json is the model's own description and must be whole. Flags may give part of the shape: what they
    // leave out is either assumed (and said so) or its items are left out with the flag that would add them.
    let whole = layers.is_some() && hidden.is_some() && heads.is_some() && intermediate.is_some() && vocab.is_some();
    let partial_flags = cfg.is_none() && layers.is_some() && hidden.is_some();
    let shape = match (layers, hidden, heads, intermediate, vocab) {
        (Some(layers), Some(hidden), heads, intermediate, vocab) if whole || partial_flags => {
            if layers == 0 || hidden == 0 || heads == Some(0) || vocab == Some(0) {
                return Err(bad("layers, hidden size, heads and vocabulary must be positive".into()));
            }
            let heads = heads.unwrap_or_else(|| {
                let h = (hidden / 128).max(1);
                notes.push(format!(
                    "assumed {h} attention heads (head dim 128, as most models since Llama have); --heads sets it"
                ));
                h
            });
            let intermediate = intermediate.unwrap_or_else(|| {
                // Llama's rounding of 8/3·h up to a multiple of 256 (11008 for h = 4096).
                let i = (8 * hidden / 3).div_ceil(256) * 256;
                notes.push(format!(
                    "assumed an MLP intermediate size of {i} (8/3·h rounded up to a multiple of 256, as Llama); \
                     --intermediate sets it"
                ));
                i
            });
            if vocab.is_none() {
                notes.push("logits are not estimated: --vocab adds them".into());
            }
            let kv_heads = flags.kv_heads.or(get(&["num_key_value_heads", "num_kv_heads"])?).unwrap_or(heads);
            let kv_heads = bounded(Some(kv_heads), "KV heads", 1 << 16)?.unwrap_or(heads);
            if kv_heads == 0 || heads % kv_heads != 0 {
                return Err(bad(format!(
                    "{heads} attention heads cannot be shared by {kv_heads} KV heads (it must divide them)"
                )));
            }
            let head_dim =
                bounded(Some(flags.head_dim.or(get(&["head_dim"])?).unwrap_or(hidden / heads)), "head dim", 1 << 20)?
                    .unwrap_or(0);
            let bool_of = |k: &str| c.and_then(|c| c.get(k)).and_then(Value::as_bool);
            // When the config is silent, follow the model class's own default: GPT-2-style and Gemma configs tie the
            // LM head to the embedding, Llama-style ones (LlamaConfig, MistralConfig, Qwen2Config) do not.
            let tied =
                flags.tied_embeddings || bool_of("tie_word_embeddings").unwrap_or(gpt_style || mt.starts_with("gemma"));
            let attention_bias = bool_of("attention_bias").unwrap_or(false);
            let family = Family {
                qkv_bias: gpt_style || attention_bias || mt == "qwen2" || mt == "qwen2_moe",
                o_bias: gpt_style || attention_bias,
                mlp_bias: gpt_style || bool_of("mlp_bias").unwrap_or(false),
                layernorm: gpt_style,
                qk_norm: mt.starts_with("qwen3"),
                router_bias: mt == "deepseek_v3",
            };
            let experts = bounded(
                flags.experts.or(get(&["num_local_experts", "n_routed_experts", "num_experts"])?),
                "experts",
                1 << 20,
            )?;
            let moe = match experts {
                Some(e) if e > 1 => {
                    let per_token =
                        flags.experts_per_token.or(get(&["num_experts_per_tok", "moe_top_k"])?).unwrap_or(2);
                    if per_token == 0 {
                        return Err(bad("experts per token must be at least 1".into()));
                    }
                    Some(Moe {
                        experts: e,
                        per_token: per_token.min(e),
                        expert_intermediate: bounded(
                            get(&["moe_intermediate_size"])?,
                            "MoE intermediate size",
                            1 << 26,
                        )?
                        .unwrap_or(intermediate),
                        shared_experts: bounded(get(&["n_shared_experts"])?, "shared experts", 1 << 20)?.unwrap_or(0),
                        dense_layers: get(&["first_k_dense_replace"])?.unwrap_or(0).min(layers),
                    })
                }
                _ => None,
            };
            let dim = |keys: &[&str]| bounded(get(keys)?, keys[0], 1 << 24);
            let mla = match dim(&["kv_lora_rank"])? {
                Some(kv_lora_rank) => Some(Mla {
                    q_lora_rank: dim(&["q_lora_rank"])?,
                    kv_lora_rank,
                    qk_nope_head_dim: dim(&["qk_nope_head_dim"])?.unwrap_or(head_dim),
                    qk_rope_head_dim: dim(&["qk_rope_head_dim"])?.unwrap_or(0),
                    v_head_dim: dim(&["v_head_dim"])?.unwrap_or(head_dim),
                }),
                None => None,
            };
            if cfg.is_some() && !mt.is_empty() && !known_type(mt) {
                notes.push(format!(
                    "model_type \"{mt}\" is counted as a Llama-style decoder (gated MLP, RMSNorm, no biases); check \
                     the parameter count against the model card"
                ));
            }
            Some(Shape {
                layers,
                hidden,
                heads,
                kv_heads,
                head_dim,
                intermediate,
                vocab,
                tied_embeddings: tied,
                gated_mlp: !gpt_style,
                learned_positions: if LEARNED_POSITIONS.contains(&mt) {
                    bounded(get(&["n_positions", "max_position_embeddings"])?, "positions", 1 << 32)?
                } else {
                    None
                },
                moe,
                mla,
                family,
            })
        }
        (None, None, None, None, None) => None,
        // The items that need a shape say which flags would add them (`estimate`).
        _ if cfg.is_none() && flags.params.is_some() => None,
        _ => {
            let mut missing = Vec::new();
            for (v, flag, key) in [
                (layers, "--layers", "num_hidden_layers"),
                (hidden, "--hidden", "hidden_size"),
                (heads, "--heads", "num_attention_heads"),
                (intermediate, "--intermediate", "intermediate_size"),
                (vocab, "--vocab", "vocab_size"),
            ] {
                if v.is_none() {
                    missing.push(if cfg.is_some() { format!("\"{key}\"") } else { flag.to_string() });
                }
            }
            return Err(if cfg.is_some() {
                bad(format!(
                    "expected a Hugging Face config.json with the model's shape; missing {}",
                    missing.join(", ")
                ))
            } else {
                Error::Usage(format!(
                    "the model's shape needs --layers, --hidden, --heads, --intermediate and --vocab (or --params \
                     with part of them); missing {}",
                    missing.join(", ")
                ))
            });
        }
    };

    // Without the vocabulary the embedding and the LM head cannot be counted.
    let counted = shape.as_ref().filter(|s| s.vocab.is_some()).map(Shape::parameters);
    let parameters =
        match (flags.params, counted) {
            (Some(p), _) => p,
            (None, Some(c)) => c,
            (None, None) if shape.is_some() => return Err(Error::Usage(
                "counting the parameters needs --vocab (the embedding and LM head); or give the count with --params"
                    .into(),
            )),
            (None, None) => {
                return Err(Error::Usage(
                    "say which model: --config config.json, or --params N (add --layers, --hidden, --heads, \
                 --intermediate and --vocab for activations and the KV cache)"
                        .into(),
                ))
            }
        };
    if parameters == 0 {
        return Err(Error::Usage("--params must be positive".into()));
    }
    if parameters > 1 << 50 {
        return Err(bad(format!("{parameters} parameters is more than any model has (at most 2^50)")));
    }
    if let (Some(p), Some(c)) = (flags.params, counted) {
        let off = (p as f64 - c as f64).abs() / c as f64;
        if off > 0.02 {
            notes.push(format!(
                "--params {} differs from the {} the shape implies by {:.0}%; weights, gradients and optimizer \
                 state use --params",
                count(p),
                count(c),
                off * 100.0
            ));
        }
    }
    let torch_dtype = text("torch_dtype").or_else(|| text("dtype")).and_then(|s| Dtype::parse(&s));
    let sliding_window = match c.and_then(|c| c.get("use_sliding_window")).and_then(Value::as_bool) {
        Some(false) => None,
        _ => bounded(get(&["sliding_window"])?, "sliding window", 1 << 32)?,
    };
    let name = text("_name_or_path")
        .filter(|s| !s.is_empty())
        .or_else(|| flags.config.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let mut source = path.clone().unwrap_or_default();
    let overridden = flags.params.is_some() || flags.layers.is_some() || flags.hidden.is_some();
    if source.is_empty() {
        source = "flags".into();
    } else if overridden {
        source.push_str(" + flags");
    }
    Ok(Model {
        name,
        source,
        model_type,
        active_parameters: shape.as_ref().filter(|s| s.moe.is_some()).map(Shape::active_parameters),
        counted_parameters: counted,
        shape,
        parameters,
        torch_dtype,
        max_position_embeddings: bounded(get(&["max_position_embeddings", "n_positions"])?, "positions", 1 << 32)?,
        sliding_window,
        notes,
    })
}

fn known_type(mt: &str) -> bool {
    GPT_STYLE.contains(&mt)
        || [
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "gemma",
            "gemma2",
            "phi3",
            "deepseek_v2",
            "deepseek_v3",
            "olmo",
            "olmo2",
            "granite",
            "cohere",
            "internlm2",
            "yi",
        ]
        .contains(&mt)
}

/// Reads a config.json into its top-level object (a multimodal config's `text_config` when the decoder is there).
fn read_config(path: &Path) -> Result<Map<String, Value>, Error> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: p.clone(), source })?;
    parse_config(&p, &text)
}

/// [`read_config`] of a config.json's text; `p` names it in errors.
pub fn parse_config(p: &str, text: &str) -> Result<Map<String, Value>, Error> {
    let p = p.to_string();
    let v: Value =
        serde_json::from_str(text).map_err(|e| Error::Config { path: p.clone(), source: ConfigError::Json(e) })?;
    let Value::Object(mut map) = v else {
        return Err(Error::Config { path: p, source: ConfigError::NotAnObject });
    };
    // Vision-language configs (LLaVA, Mllama, Qwen2-VL) keep the language model under text_config.
    if !map.contains_key("num_hidden_layers") && !map.contains_key("n_layer") {
        if let Some(Value::Object(t)) = map.remove("text_config") {
            let mut t = t;
            for k in ["_name_or_path", "torch_dtype", "tie_word_embeddings"] {
                if let (Some(v), false) = (map.get(k), t.contains_key(k)) {
                    t.insert(k.to_string(), v.clone());
                }
            }
            return Ok(t);
        }
    }
    Ok(map)
}

/// 6738415616 → "6.738 B", 124439808 → "124.4 M".
pub fn count(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        let d = if f >= 1e11 {
            1
        } else if f >= 1e10 {
            2
        } else {
            3
        };
        format!("{:.*} B", d, f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1} M", f / 1e6)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape_of(json: &str) -> Shape {
        let dir = std::env::temp_dir().join(format!("oomdoc-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{:x}.json", json.len() * 31 + json.bytes().map(u64::from).sum::<u64>() as usize));
        std::fs::write(&p, json).unwrap();
        let m = load(&ModelFlags { config: Some(p.clone()), ..Default::default() }).unwrap();
        let _ = std::fs::remove_file(p);
        m.shape.unwrap()
    }

    #[test]
    fn deepseek_v3_mla_and_moe() {
        // The fields of deepseek-ai/DeepSeek-V3's config.json that decide the count (the file itself is not
        // shipped). 671 B is the published total, without the multi-token-prediction module.
        let s = shape_of(
            r#"{"model_type":"deepseek_v3","num_hidden_layers":61,"hidden_size":7168,"num_attention_heads":128,
            "num_key_value_heads":128,"intermediate_size":18432,"moe_intermediate_size":2048,"n_routed_experts":256,
            "n_shared_experts":1,"num_experts_per_tok":8,"first_k_dense_replace":3,"q_lora_rank":1536,
            "kv_lora_rank":512,"qk_nope_head_dim":128,"qk_rope_head_dim":64,"v_head_dim":128,"vocab_size":129280,
            "tie_word_embeddings":false}"#,
        );
        assert_eq!(s.parameters() / 1_000_000_000, 671);
        // 37 B activated per token.
        assert_eq!(s.active_parameters() / 1_000_000_000, 37);
        // MLA caches 512 + 64 numbers per token per layer instead of 2·128·128.
        assert_eq!(s.kv_elements_per_token_layer(), 576);
    }

    #[test]
    fn dtype_spellings() {
        assert_eq!(Dtype::parse("torch.bfloat16"), Some(Dtype::Bf16));
        assert_eq!(Dtype::parse("float16"), Some(Dtype::Fp16));
        assert_eq!(Dtype::parse("FP8"), Some(Dtype::Fp8));
        assert_eq!(Dtype::parse("q4"), None);
        assert_eq!(count(6_738_415_616), "6.738 B");
        assert_eq!(count(70_553_706_496), "70.55 B");
        assert_eq!(count(671_026_434_048), "671.0 B");
    }
}
