//! What an OOM message alone says: which of its figures decided the failure (fragmentation, a cap, memory outside
//! PyTorch, or plain shortage), and what the line that raised it was doing — read from the traceback's source line
//! and the functions below it, and said as likely: the line that asked last is where the memory ran out, not
//! always what filled it.

use serde::Serialize;

use crate::timeline::OomMessage;

/// Which of the message's figures decided the OOM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// PyTorch's cache held at least the request reserved but unallocated: in pieces too small.
    Fragmentation,
    /// The process's cap (`set_per_process_memory_fraction`) ran out while the GPU had the request free.
    Cap,
    /// PyTorch's reservation plus the request fit the GPU; memory outside PyTorch took the rest.
    OutsidePytorch,
    /// PyTorch's own tensors filled what the process could use.
    Shortage,
}

/// The figures the decision reads (bytes), as the report has them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    pub requested: Option<u64>,
    pub device_free: Option<u64>,
    pub capacity: Option<u64>,
    pub allowed: Option<u64>,
    pub reserved_unallocated: Option<u64>,
    pub outside_decided: bool,
}

/// The message's arithmetic, in the order a cause is ruled in: what the cache held unused first (the request
/// would have fit but for the pieces), then the cap (the GPU had room), then memory outside PyTorch, and otherwise
/// PyTorch's own tensors filled the memory. `None` without the request's size.
pub fn decided_by(f: &Figures) -> Option<Decider> {
    let req = f.requested?;
    if f.reserved_unallocated.is_some_and(|u| u >= req) {
        return Some(Decider::Fragmentation);
    }
    let capped = f.allowed.zip(f.capacity).is_some_and(|(a, c)| a < c);
    if capped && f.device_free.is_some_and(|free| free >= req) {
        return Some(Decider::Cap);
    }
    if f.outside_decided {
        return Some(Decider::OutsidePytorch);
    }
    Some(Decider::Shortage)
}

/// What the raising line was likely doing, and what usually helps.
#[derive(Clone, Debug, Serialize)]
pub struct Likely {
    /// `attention_scores.py:9 in body`.
    pub at: String,
    /// The line's source, as the traceback printed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What it likely was: `a materialised attention matrix (QKᵀ)`.
    pub what: &'static str,
    pub remedy: &'static str,
}

/// One kind of raising line: recognised by its source (any of `code`) or by a function below it (any of `calls`).
struct Kind {
    code: &'static [&'static str],
    /// Recognised by its source only when nothing was called below it: the line itself asked.
    at_the_line: bool,
    calls: &'static [&'static str],
    what: &'static str,
    remedy: &'static str,
}

/// Most specific first: an upcast of the logits is an upcast before it is a loss.
const KINDS: &[Kind] = &[
    Kind {
        at_the_line: false,
        code: &["transpose(-2, -1)", "transpose(-1, -2)", "matmul(q", "bmm(q", "einsum(\"bhqd,bhkd"],
        calls: &[],
        what: "a materialised attention matrix (QKᵀ: batch × heads × sequence²)",
        remedy: "compute attention with torch.nn.functional.scaled_dot_product_attention (FlashAttention / \
                 memory-efficient kernels never hold the full matrix), or shorten the sequence",
    },
    Kind {
        at_the_line: false,
        code: &[".float()", ".double()", "to(torch.float32)", "to(torch.float64)", "dtype=torch.float32"],
        calls: &[],
        what: "an fp32 copy of a large tensor (an upcast; with logits, batch × sequence × vocabulary in fp32)",
        remedy: "keep the tensor in bf16, or compute the loss in chunks of the sequence (a chunked / fused \
                 cross-entropy) so the fp32 logits never exist at once",
    },
    Kind {
        at_the_line: false,
        code: &["cross_entropy", "log_softmax", "lm_head", "logits"],
        calls: &["cross_entropy", "log_softmax", "nll_loss"],
        what: "the logits over the vocabulary and their loss",
        remedy: "compute the loss in chunks (a chunked or fused linear cross-entropy), and a smaller micro-batch",
    },
    Kind {
        at_the_line: false,
        code: &["torch.cat(", "torch.concat(", "torch.stack(", "torch.hstack(", "torch.vstack("],
        calls: &["cat", "concat", "stack"],
        what: "a tensor grown by concatenation (each torch.cat copies all of it; in a loop the copies pile up)",
        remedy: "preallocate the whole tensor and fill it, or keep a list and concatenate once at the end; for a \
                 KV cache, a static or paged cache",
    },
    Kind {
        at_the_line: false,
        code: &[".generate("],
        calls: &["generate"],
        what: "generation: its KV cache, which grows with every token, and the activations of each step",
        remedy: "fewer sequences at once or a shorter max_new_tokens, a static or quantized KV cache, or a serving \
                 engine with a paged cache (vLLM, SGLang)",
    },
    Kind {
        at_the_line: false,
        code: &[".backward(", "autograd.grad("],
        calls: &["backward", "_engine_run_backward"],
        what: "the backward pass: gradients beside the activations saved for it",
        remedy: "activation checkpointing (torch.utils.checkpoint) and a smaller micro-batch with gradient \
                 accumulation",
    },
    Kind {
        at_the_line: false,
        code: &["opt.step(", "optimizer.step(", "optim.step("],
        calls: &["_multi_tensor_adam", "_multi_tensor_adamw", "_init_group", "_fused_adam", "_fused_adamw"],
        what: "the optimizer's step: at the first step its state (Adam keeps two fp32 copies of every parameter), \
               at every step its multi-tensor temporaries",
        remedy: "an optimizer with less state (8-bit Adam, Adafactor) or its state sharded (ZeRO, FSDP); \
                 foreach=False trades speed for the step's temporaries",
    },
    Kind {
        at_the_line: false,
        code: &[".cuda()", ".to(\"cuda", ".to('cuda", ".to(device", "from_pretrained("],
        calls: &["_apply", "convert", "load_state_dict", "from_pretrained"],
        what: "the model's weights coming onto the GPU: the model alone does not fit",
        remedy: "load it in bf16 or quantized (8/4-bit), or split it across GPUs (device_map=\"auto\", FSDP)",
    },
    Kind {
        at_the_line: false,
        code: &[],
        calls: &["_call_impl", "_wrapped_call_impl"],
        what: "the model's forward pass: its activations",
        remedy: "a smaller micro-batch (with gradient accumulation), activation checkpointing, and \
                 torch.no_grad() / torch.inference_mode() where no backward follows",
    },
    Kind {
        at_the_line: true,
        code: &["torch.empty(", "torch.zeros(", "torch.ones(", "torch.full(", "torch.randn(", "torch.rand("],
        calls: &[],
        what: "a tensor this line allocates by its size",
        remedy: "check the size this line asks for against what the GPU has left",
    },
];

/// The likely meaning of the line that raised the OOM, from the traceback above the message.
pub fn likely(msg: &OomMessage) -> Option<Likely> {
    let at = msg.user_frame.clone()?;
    let code = msg.user_code.as_deref().unwrap_or("");
    let kind = KINDS.iter().find(|k| {
        let by_code = (!k.at_the_line || msg.calls_below.is_empty()) && k.code.iter().any(|c| code.contains(c));
        by_code || msg.calls_below.iter().any(|f| k.calls.contains(&f.as_str()))
    })?;
    Some(Likely { at, code: msg.user_code.clone(), what: kind.what, remedy: kind.remedy })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(req: u64, free: u64, unused: u64) -> Figures {
        Figures {
            requested: Some(req),
            device_free: Some(free),
            capacity: Some(80),
            allowed: None,
            reserved_unallocated: Some(unused),
            outside_decided: false,
        }
    }

    #[test]
    fn the_arithmetic_decides_in_order() {
        assert_eq!(decided_by(&figures(4, 1, 6)), Some(Decider::Fragmentation));
        assert_eq!(decided_by(&Figures { allowed: Some(8), ..figures(4, 60, 1) }), Some(Decider::Cap));
        assert_eq!(decided_by(&Figures { outside_decided: true, ..figures(4, 1, 1) }), Some(Decider::OutsidePytorch));
        assert_eq!(decided_by(&figures(4, 1, 1)), Some(Decider::Shortage));
        // A cap the GPU could not have met anyway is not what decided it.
        assert_eq!(decided_by(&Figures { allowed: Some(8), ..figures(4, 1, 1) }), Some(Decider::Shortage));
        assert_eq!(decided_by(&Figures { requested: None, ..figures(4, 1, 1) }), None);
    }
}
