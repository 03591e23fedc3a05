#!/usr/bin/env python3
"""Generate a large, realistic PyTorch CUDA memory snapshot for benchmarking oomdoc.

    python3 bench/gen_bench_snapshot.py --entries 1000000 --variant shared   -o bench/data/snap-1m-shared.pickle
    python3 bench/gen_bench_snapshot.py --entries 1000000 --variant unshared -o bench/data/snap-1m-unshared.pickle
    python3 bench/gen_bench_snapshot.py --verify bench/data/snap-100k-shared.pickle
    python3 bench/gen_bench_snapshot.py --selftest          # stream writer == pickle.dump, byte for byte

A small simulator of the caching allocator (best fit, torch's split and merge rules, 2 GiB large / 2 MiB small
segments created on demand) runs a LLaMA-style training loop (forward, backward, grad clipping, foreach AdamW,
zero_grad with set_to_none) on one device, with a sequence length that changes per step. The trace has exactly
N entries (segment_alloc, then alloc / free_requested / free_completed), every one with a 30-frame stack
(native + Python frames, innermost first) drawn from a pool of about 2,000 stacks over about 300 frames. The
final `segments` is the allocator's state after the last entry: replaying the trace from empty lands on it.

Variants:
  real      frames as torch writes them: equal frame dicts are one object, but every allocation gets a fresh
            frames list, and so does every free_requested (its free_completed reuses that one), so a trace holds
            about 0.66 list objects per entry, each pickled as a run of memo references (BINGET / LONG_BINGET),
            with the torch >= 2.10 key set. The statistics of ../shared/tools/snapshot-stats.py (lists per entry,
            bytes per entry, distinct stacks, depth) are printed after writing and match the real files'.
  shared    best case: equal stacks are one list object, so a repeat is one memo reference. No torch writes this;
            kept to show the reader's ceiling. Written with pickle.dump(protocol=4).
  unshared  every trace entry and block gets fresh frame dicts and a fresh list (strings stay shared, as
            pickle memoizes them anyway). Holding 1M entries x 30 fresh dicts would take ~8 GB, so this variant
            is streamed by a small writer that emits exactly the bytes pickle.dump(protocol=4) would write
            (same opcodes, memo numbering, MEMOIZE and 64 KiB FRAMEs); --selftest checks this byte for byte.

--stacks python records what _record_memory_history(stacks="python") does (and oomdoc.record() asks for): Python
frames only, and `frames: []` for whatever the autograd engine allocates and frees on its own thread (about 40% of
the allocations here, 38-62% in real python-stack training traces). Default: all (native and Python frames).

Python 3 standard library only; output is deterministic (fixed seeds).
"""

import argparse
import bisect
import os
import pickle
import random
import sys
import time
import zlib
from array import array

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
STACK_DEPTH = 37         # frames per stack (--depth); tuned so 1M unshared entries are ~760 MB
VARIANTS_PER_SITE = 30  # stack variants per (kind, context, op); tuned so ~2,000 stacks are used
PYTHON_STACKS = False   # --stacks python: what _record_memory_history(stacks="python") records
# --carry-batch: each step's inputs are freed when the next step's are made (`x = batch.to(device)` in the loop),
# not after the backward, so some request is carried across every step boundary
CARRY_BATCH = False

# ----------------------------------------------------------------------------------------------------------
# Frames
# ----------------------------------------------------------------------------------------------------------
_STR = {}


def s(x):
    """One str object per distinct text (what torch's symbolizer produces, and what pickle memoizes)."""
    return _STR.setdefault(x, x)


FRAMES = []  # frame id -> (name, filename, line)
_FRAME_IDS = {}


def F(filename, name, line=0):
    key = (s(name), s(filename), line)
    i = _FRAME_IDS.get(key)
    if i is None:
        i = _FRAME_IDS[key] = len(FRAMES)
        FRAMES.append(key)
    return i


def Fs(filename, name, lines):
    """A frame with several possible lines: a list of frame ids, one is picked per stack variant."""
    return [F(filename, name, ln) for ln in lines]


SP = "/usr/lib/python3.11/site-packages/"
TORCH = SP + "torch/"
HF = SP + "transformers/"
LLAMA = HF + "models/llama/modeling_llama.py"
MOD = TORCH + "nn/modules/module.py"
FUNC = TORCH + "nn/functional.py"
TRAIN = "/app/train.py"

# native frames: the allocator entry (every alloc), the deallocation path (every free)
CORE_ALLOC = [
    F("??", "torch::unwind::unwind()"),
    F("??", "torch::CapturedTraceback::gather(bool, bool, bool)"),
    F("memory_snapshot.cpp", "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    F("CUDACachingAllocator.cpp",
      "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
]
CORE_FREE = [
    F("??", "torch::unwind::unwind()"),
    F("??", "torch::CapturedTraceback::gather(bool, bool, bool)"),
    F("memory_snapshot.cpp", "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    F("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)"),
    F("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)"),
    F("??", "c10::StorageImpl::~StorageImpl()"),
    F("??", "c10::TensorImpl::~TensorImpl()"),
    F("python_variable.cpp", "THPVariable_subclass_dealloc(_object*)"),
]
ENGINE_CPP_TAIL = [
    F("??", "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
    F("engine.cpp", "torch::autograd::call_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&)"),
    F("engine.cpp", "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
    F("engine.cpp", "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    F("engine.cpp", "torch::autograd::Engine::execute_with_graph_task(std::shared_ptr<torch::autograd::GraphTask> const&, std::shared_ptr<torch::autograd::Node>, torch::autograd::InputBuffer&&)"),
    F("python_engine.cpp", "torch::autograd::python::PythonEngine::execute_with_graph_task(std::shared_ptr<torch::autograd::GraphTask> const&, std::shared_ptr<torch::autograd::Node>, torch::autograd::InputBuffer&&)"),
    F("engine.cpp", "torch::autograd::Engine::execute(std::vector<torch::autograd::Edge, std::allocator<torch::autograd::Edge> > const&, std::vector<at::Tensor, std::allocator<at::Tensor> > const&, bool, bool, bool, std::vector<torch::autograd::Edge, std::allocator<torch::autograd::Edge> > const&)"),
    F("python_engine.cpp", "THPEngine_run_backward(_object*, _object*, _object*)"),
]
# outermost interpreter frames, used to pad a stack to STACK_DEPTH
RUNTIME_PAD = [F("??", n) for n in (
    "_PyObject_MakeTpCall", "slot_tp_call", "_PyObject_Call", "PyObject_Call", "cfunction_call",
    "method_vectorcall_VARARGS_KEYWORDS", "_PyFunction_Vectorcall", "_PyObject_FastCallDictTstate",
    "_PyObject_Call_Prepend", "_PyEval_EvalFrameDefault", "PyEval_EvalCode", "run_eval_code_obj",
    "run_mod", "pyrun_file", "_PyRun_SimpleFileObject", "_PyRun_AnyFileObject", "pymain_run_file_obj",
    "pymain_run_file", "Py_RunMain", "pymain_main", "Py_BytesMain", "__libc_init_first",
    "__libc_start_main", "_start")]

_OP_CPP = {}
_CPP_FILES = ["RegisterCUDA.cpp", "RegisterCompositeImplicitAutograd.cpp", "RegisterCompositeExplicitAutograd.cpp"]
_VT_FILES = ["VariableType_0.cpp", "VariableType_1.cpp", "VariableType_2.cpp", "VariableType_3.cpp", "VariableType_4.cpp"]
_PY_FILES = ["python_torch_functions_0.cpp", "python_torch_functions_1.cpp", "python_torch_functions_2.cpp",
             "python_variable_methods.cpp", "python_nn_functions.cpp"]


def op_cpp(op):
    """Four native frames of an ATen op, innermost first."""
    fr = _OP_CPP.get(op)
    if fr is None:
        h = zlib.crc32(op.encode())
        args = "(at::Tensor const&, at::Tensor const&)"
        fr = _OP_CPP[op] = [
            F(_CPP_FILES[h % 3], "at::(anonymous namespace)::wrapper_CUDA_%s%s" % (op, args)),
            F(_VT_FILES[h % 5], "torch::autograd::VariableType::(anonymous namespace)::%s(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)" % op),
            F("??", "at::_ops::%s::call%s" % (op, args)),
            F(_PY_FILES[h % 5], "torch::autograd::THPVariable_%s(_object*, _object*, _object*)" % op),
        ]
    return fr


def node_cpp(node):
    return [F("Functions.cpp", "torch::autograd::generated::%s::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)" % node)]


# Python frames
CALL = "CALL"  # marker: nn.Module.__call__ -> _wrapped_call_impl -> _call_impl
P_CALL = [F(MOD, "_call_impl", 1750), F(MOD, "_wrapped_call_impl", 1739)]
P_LINEAR = Fs(TORCH + "nn/modules/linear.py", "forward", [125])
P_EMB = Fs(TORCH + "nn/modules/sparse.py", "forward", [190])
P_EMB_F = Fs(FUNC, "embedding", [2551])
P_SILU_F = Fs(FUNC, "silu", [2380])
P_SILU_M = Fs(TORCH + "nn/modules/activation.py", "forward", [432])
P_CE_F = Fs(FUNC, "cross_entropy", [3479, 3494])
P_RMS = Fs(LLAMA, "forward", [69, 70, 71, 72, 73])
P_ROT_EMB = Fs(LLAMA, "forward", [111, 112, 113, 116, 117])
P_ROTH = Fs(LLAMA, "rotate_half", [128, 129, 130])
P_APPLY_ROT = Fs(LLAMA, "apply_rotary_pos_emb", [153, 154, 155, 156])
P_MLP = Fs(LLAMA, "forward", [186, 187])
P_ATTN = Fs(LLAMA, "forward", [251, 252, 253, 256, 259, 262, 278, 291, 292])
P_SDPA = Fs(HF + "integrations/sdpa_attention.py", "sdpa_attention_forward", [54, 66, 71, 89])
P_DEC = Fs(LLAMA, "forward", [332, 333, 336, 349, 350, 353, 354, 355])
P_GCL = Fs(HF + "modeling_layers.py", "__call__", [83, 94])
P_MODEL = Fs(LLAMA, "forward", [540, 548, 555, 563, 571, 577, 589, 592])
P_GEN = Fs(HF + "utils/generic.py", "wrapper", [965, 969, 1005])
P_CAUSAL = Fs(LLAMA, "forward", [818, 830, 831, 836, 839])
P_LOSS = Fs(HF + "loss/loss_utils.py", "ForCausalLMLoss", [55, 58, 62, 64])
P_FCE = Fs(HF + "loss/loss_utils.py", "fixed_cross_entropy", [36, 38])
P_NOGRAD_CTX = Fs(TORCH + "utils/_contextlib.py", "decorate_context", [116])
P_STEP_FWD = Fs(TRAIN, "train_step", [221, 225, 229])
P_STEP_DATA = Fs(TRAIN, "train_step", [214, 216])
P_STEP_BWD = Fs(TRAIN, "train_step", [233, 238])
P_STEP_CLIP = Fs(TRAIN, "train_step", [241])
P_STEP_OPT = Fs(TRAIN, "train_step", [244, 247])
P_STEP_ZERO = Fs(TRAIN, "train_step", [251])
P_TRAIN = Fs(TRAIN, "train", [301, 305, 318, 322, 330, 337])
P_TRAIN_EVAL = Fs(TRAIN, "train", [341, 350])
P_EVAL = Fs(TRAIN, "evaluate", [265, 270, 274, 279])
P_MAIN = Fs(TRAIN, "main", [398, 401, 405])
P_MODULE = Fs(TRAIN, "<module>", [412])
P_DATA_TO = Fs("/app/data.py", "to_device", [77, 80])
P_COLLATE = Fs("/app/data.py", "collate", [58, 61])
P_ENGINE = Fs(TORCH + "autograd/graph.py", "_engine_run_backward", [823])
P_AG_BWD = Fs(TORCH + "autograd/__init__.py", "backward", [347])
P_TENSOR_BWD = Fs(TORCH + "_tensor.py", "backward", [626])
P_OPT_WRAP = Fs(TORCH + "optim/optimizer.py", "wrapper", [493])
P_USE_GRAD = Fs(TORCH + "optim/optimizer.py", "_use_grad", [89])
P_FALLBACK = Fs(TORCH + "optim/optimizer.py", "maybe_fallback", [151])
P_ZERO_GRAD = Fs(TORCH + "optim/optimizer.py", "zero_grad", [987, 992])
P_ADAMW_STEP = Fs(TORCH + "optim/adamw.py", "step", [232, 243])
P_ADAMW_FN = Fs(TORCH + "optim/adamw.py", "adamw", [875])
P_ADAMW_MT = Fs(TORCH + "optim/adamw.py", "_multi_tensor_adamw",
                [601, 608, 613, 633, 650, 661, 668, 672, 677, 683, 690, 697])
P_INIT_GROUP = Fs(TORCH + "optim/adamw.py", "_init_group", [178, 182, 186])
P_CLIP = Fs(TORCH + "nn/utils/clip_grad.py", "clip_grad_norm_", [95, 101, 105, 112])
P_TOTAL_NORM = Fs(TORCH + "nn/utils/clip_grad.py", "_get_total_norm", [51, 56, 59])
P_CLIP_W = Fs(TORCH + "nn/utils/clip_grad.py", "_clip_grads_with_norm_", [148, 153])
P_NOGRAD_W = Fs(TORCH + "nn/utils/clip_grad.py", "_no_grad_wrapper", [34])
P_BUILD = Fs("/app/model_utils.py", "build_model", [42, 47, 53])
P_MOD_TO = Fs(MOD, "to", [1343])
P_APPLY = Fs(MOD, "_apply", [915, 942])
P_CONVERT = Fs(MOD, "convert", [1329])

TRAIN_TAIL = [P_TRAIN, P_MAIN, P_MODULE]
CAUSAL_UP = [CALL, P_CAUSAL, CALL]  # LlamaForCausalLM.forward called by the training script
MODEL_UP = [CALL, P_MODEL, P_GEN] + CAUSAL_UP
LAYER_UP = [CALL, P_DEC, "GCL?"] + MODEL_UP

# Python path (innermost first) of each context; "GCL?" is an optional gradient-checkpointing frame
CONTEXTS = {
    "embed": [P_EMB_F, P_EMB] + MODEL_UP,
    "rotary": [P_ROT_EMB, P_NOGRAD_CTX] + MODEL_UP,
    "attn_norm": [P_RMS] + LAYER_UP,
    "attn_proj": [P_LINEAR, CALL, P_ATTN] + LAYER_UP,
    "rope": [P_ROTH, P_APPLY_ROT, P_ATTN] + LAYER_UP,
    "sdpa": [P_SDPA, P_ATTN] + LAYER_UP,
    "attn": [P_ATTN] + LAYER_UP,
    "layer": [P_DEC, "GCL?"] + MODEL_UP,
    "mlp_norm": [P_RMS] + LAYER_UP,
    "mlp_proj": [P_LINEAR, CALL, P_MLP] + LAYER_UP,
    "mlp_act": [P_SILU_F, P_SILU_M, CALL, P_MLP] + LAYER_UP,
    "mlp": [P_MLP] + LAYER_UP,
    "final_norm": [P_RMS] + MODEL_UP,
    "lm_head": [P_LINEAR] + CAUSAL_UP,
    "loss": [P_CE_F, P_FCE, P_LOSS, P_CAUSAL, P_GEN, CALL],
    "data": [P_DATA_TO, P_STEP_DATA] + TRAIN_TAIL,
    "collate": [P_COLLATE, P_STEP_DATA] + TRAIN_TAIL,
    "backward": [P_ENGINE, P_AG_BWD, P_TENSOR_BWD, P_STEP_BWD] + TRAIN_TAIL,
    "clip": [P_TOTAL_NORM, P_NOGRAD_W, P_CLIP, P_NOGRAD_W, P_STEP_CLIP] + TRAIN_TAIL,
    "clip_apply": [P_CLIP_W, P_NOGRAD_W, P_CLIP, P_NOGRAD_W, P_STEP_CLIP] + TRAIN_TAIL,
    "adamw_init": [P_INIT_GROUP, P_ADAMW_STEP, P_USE_GRAD, P_OPT_WRAP, P_STEP_OPT] + TRAIN_TAIL,
    "adamw": [P_ADAMW_MT, P_FALLBACK, P_ADAMW_FN, P_ADAMW_STEP, P_USE_GRAD, P_OPT_WRAP, P_STEP_OPT] + TRAIN_TAIL,
    "zero_grad": [P_ZERO_GRAD, P_NOGRAD_CTX, P_STEP_ZERO] + TRAIN_TAIL,
    "init": [P_CONVERT, P_APPLY, P_APPLY, P_APPLY, P_MOD_TO, P_BUILD, P_MAIN, P_MODULE],
}
FWD_CONTEXTS = {"embed", "rotary", "attn_norm", "attn_proj", "rope", "sdpa", "attn", "layer", "mlp_norm",
                "mlp_proj", "mlp_act", "mlp", "final_norm", "lm_head", "loss"}


def python_path(ctx, rng, evaluating):
    out = []
    for item in CONTEXTS[ctx]:
        if item == CALL:
            out += P_CALL
        elif item == "GCL?":
            if rng.random() < 0.5:
                out.append(rng.choice(P_GCL))
        else:
            out.append(rng.choice(item))
    if ctx in FWD_CONTEXTS:
        if evaluating:
            out += [rng.choice(P_EVAL), rng.choice(P_TRAIN_EVAL), rng.choice(P_MAIN), P_MODULE[0]]
        else:
            out += [rng.choice(P_STEP_FWD), rng.choice(P_TRAIN), rng.choice(P_MAIN), P_MODULE[0]]
    return out


def fit(frames):
    if len(frames) >= STACK_DEPTH:
        return tuple(frames[:STACK_DEPTH])
    return tuple(frames + RUNTIME_PAD[len(RUNTIME_PAD) - (STACK_DEPTH - len(frames)):])


class StackPool:
    """Stacks (tuples of frame ids), each site (kind, ctx, op, node, key) mapped to one of a few variants."""

    def __init__(self):
        self.stacks = []
        self.ids = {}
        self.variants = {}
        self.site = {}

    def _intern(self, st):
        i = self.ids.get(st)
        if i is None:
            i = self.ids[st] = len(self.stacks)
            self.stacks.append(st)
        return i

    def _build(self, kind, ctx, op, node, evaluating, v):
        rng = random.Random(zlib.crc32(repr((kind, ctx, op, node, evaluating, v)).encode()))
        py = python_path(ctx, rng, evaluating)
        if PYTHON_STACKS:
            # Python frames only, as deep as the code is. The autograd engine runs the backward of CUDA tensors
            # on its own thread, where no Python frame is: torch records `frames: []` for what it allocates
            # and frees (57% of the allocations of a real training trace, bench/real/).
            return () if kind in ("bwd_alloc", "bwd_free") else tuple(py)
        if kind == "alloc":
            return fit(CORE_ALLOC + op_cpp(op) + py)
        if kind == "bwd_alloc":
            return fit(CORE_ALLOC + op_cpp(op)[:2] + node_cpp(node) + ENGINE_CPP_TAIL + py)
        if kind == "bwd_free":
            return fit(CORE_FREE[:6] + node_cpp(node) + ENGINE_CPP_TAIL + py)
        return fit(CORE_FREE + py)  # "free"

    def get(self, kind, ctx, op, key, node=None, evaluating=False):
        """The stack of one call site. Sites sharing (kind, ctx, op, node) take turns over up to
        VARIANTS_PER_SITE distinct variants (built on first use, so the pool holds only used stacks)."""
        trip = (kind, ctx, op, node, evaluating)
        sk = (trip, key)
        sid = self.site.get(sk)
        if sid is not None:
            return sid
        st = self.variants.get(trip)
        if st is None:
            st = self.variants[trip] = {"ids": [], "seen": set(), "tries": 0, "sites": 0}
        ids = st["ids"]
        want = st["sites"] % VARIANTS_PER_SITE
        st["sites"] += 1
        while want >= len(ids) and st["tries"] < VARIANTS_PER_SITE * 4:
            s_ = self._build(kind, ctx, op, node, evaluating, st["tries"])
            st["tries"] += 1
            if s_ not in st["seen"]:
                st["seen"].add(s_)
                ids.append(self._intern(s_))
        sid = self.site[sk] = ids[want % len(ids)]
        return sid


# ----------------------------------------------------------------------------------------------------------
# Allocator (c10/cuda/CUDACachingAllocator.cpp: best fit by (size, address), split/merge rules)
# ----------------------------------------------------------------------------------------------------------
K_SMALL = 1 * MiB
SMALL_SEG = 2 * MiB
LARGE_SEG = 2 * GiB


class Block:
    __slots__ = ("addr", "size", "req", "active", "prev", "next", "seg", "stack")

    def __init__(self, addr, size, seg, prev=None, nxt=None):
        self.addr, self.size, self.seg, self.prev, self.next = addr, size, seg, prev, nxt
        self.req, self.active, self.stack = 0, False, None


class Segment:
    __slots__ = ("addr", "size", "pool", "head", "stack")

    def __init__(self, addr, size, pool, stack):
        self.addr, self.size, self.pool, self.stack = addr, size, pool, stack
        self.head = Block(addr, size, self)


class Allocator:
    def __init__(self):
        self.segments = []
        self.free_keys = {"small": [], "large": []}
        self.free_blk = {"small": {}, "large": {}}
        self.next_addr = {"large": 0x7F3C00000000, "small": 0x7F3BF0000000}

    def _add_free(self, b):
        pool = b.seg.pool
        bisect.insort(self.free_keys[pool], (b.size, b.addr))
        self.free_blk[pool][b.addr] = b

    def _del_free(self, b):
        pool = b.seg.pool
        keys = self.free_keys[pool]
        i = bisect.bisect_left(keys, (b.size, b.addr))
        assert keys[i] == (b.size, b.addr)
        del keys[i]
        del self.free_blk[pool][b.addr]

    def new_segment(self, pool, rsize, stack):
        size = SMALL_SEG if pool == "small" else max(LARGE_SEG, -(-rsize // (2 * MiB)) * 2 * MiB)
        addr = self.next_addr[pool]
        self.next_addr[pool] += size + (0 if pool == "small" else 32 * MiB)
        seg = Segment(addr, size, pool, stack)
        self.segments.append(seg)
        self._add_free(seg.head)
        return seg

    def malloc(self, req, stack):
        rsize = max(512, -(-req // 512) * 512)
        pool = "small" if rsize <= K_SMALL else "large"
        keys = self.free_keys[pool]
        i = bisect.bisect_left(keys, (rsize, 0))
        if i == len(keys):
            return None, pool, rsize
        size, addr = keys.pop(i)
        b = self.free_blk[pool].pop(addr)
        rem = size - rsize
        if rem >= 512 if pool == "small" else rem > K_SMALL:
            nb = Block(addr + rsize, rem, b.seg, b, b.next)
            if b.next is not None:
                b.next.prev = nb
            b.next = nb
            b.size = rsize
            self._add_free(nb)
        b.active, b.req, b.stack = True, req, stack
        return b, pool, rsize

    def free(self, b):
        b.active, b.stack = False, None
        p = b.prev
        if p is not None and not p.active:
            self._del_free(p)
            b.addr, b.size, b.prev = p.addr, b.size + p.size, p.prev
            if p.prev is not None:
                p.prev.next = b
            else:
                b.seg.head = b
        n = b.next
        if n is not None and not n.active:
            self._del_free(n)
            b.size += n.size
            b.next = n.next
            if n.next is not None:
                n.next.prev = b
        self._add_free(b)


# ----------------------------------------------------------------------------------------------------------
# The training loop (LLaMA-style, bf16, AdamW foreach), as a stream of alloc / free requests
# ----------------------------------------------------------------------------------------------------------
class T:
    __slots__ = ("req", "stack", "block", "dead")

    def __init__(self, req, stack):
        self.req, self.stack, self.block, self.dead = req, stack, None, False


H, I_, V, L, B, NH = 1024, 2816, 32000, 16, 4, 16


def program(rng, pool):
    ev = [False]  # evaluating?

    def A(req, ctx, op, key, node=None):
        if node is None:
            st = pool.get("alloc", ctx, op, key, evaluating=ev[0])
        else:
            st = pool.get("bwd_alloc", "backward", op, key, node=node)
        return T(req, st)

    def Fr(t, ctx, key, node=None):
        if node is None:
            st = pool.get("free", ctx, None, key, evaluating=ev[0])
        else:
            st = pool.get("bwd_free", "backward", None, key, node=node)
        return ("f", t, st)

    params = [("embed", V * H * 2)]
    for l in range(L):
        params += [("L%d.q" % l, H * H * 2), ("L%d.k" % l, H * H * 2), ("L%d.v" % l, H * H * 2),
                   ("L%d.o" % l, H * H * 2), ("L%d.gate" % l, H * I_ * 2), ("L%d.up" % l, H * I_ * 2),
                   ("L%d.down" % l, H * I_ * 2), ("L%d.in_norm" % l, H * 2), ("L%d.post_norm" % l, H * 2)]
    params += [("norm", H * 2), ("lm_head", V * H * 2)]
    psize = dict(params)
    for name, size in params:
        t = A(size, "init", "empty", name)
        yield ("a", t)
    exp_avg, exp_avg_sq = {}, {}
    step = 0
    carried = []
    while True:
        step += 1
        S = rng.choice(range(640, 1025, 64))
        Tn = B * S
        act, act32, mlp, tok32 = Tn * H * 2, Tn * H * 4, Tn * I_ * 2, Tn * 4
        ev[0] = step % 10 == 0  # an evaluation batch (no_grad forward) every 10 steps

        def out(t):
            return ("a", t)

        # --- inputs
        batch = []
        for nm in ("input_ids", "labels", "attention_mask"):
            t = A(Tn * 8, "data", "_to_copy", nm)
            batch.append(t)
            yield out(t)
        if CARRY_BATCH:
            for t, nm in zip(carried, ("input_ids", "labels", "attention_mask")):
                yield Fr(t, "data", nm)
            carried = batch
        # --- forward
        saved = []  # (tensor, layer) freed in backward
        h = A(act, "embed", "embedding", "embed")
        yield out(h)
        cos = A(S * 64 * 2 * 2, "rotary", "cos", "cos")
        sin = A(S * 64 * 2 * 2, "rotary", "sin", "sin")
        yield out(cos)
        yield out(sin)

        def norm(x, ctx, key):
            t1 = A(act32, ctx, "_to_copy", key + ".f32")
            yield out(t1)
            t2 = A(act32, ctx, "pow", key + ".pow")
            yield out(t2)
            t3 = A(tok32, ctx, "mean", key + ".mean")
            yield out(t3)
            yield Fr(t2, ctx, key + ".pow")
            t3b = A(tok32, ctx, "add", key + ".eps")
            yield out(t3b)
            yield Fr(t3, ctx, key + ".mean")
            t4 = A(tok32, ctx, "rsqrt", key + ".rsqrt")
            yield out(t4)
            yield Fr(t3b, ctx, key + ".eps")
            t5 = A(act32, ctx, "mul", key + ".mul")
            yield out(t5)
            t6 = A(act, ctx, "_to_copy", key + ".bf16")
            yield out(t6)
            yield Fr(t5, ctx, key + ".mul")
            t7 = A(act, ctx, "mul", key + ".w")
            yield out(t7)
            return [t1, t4, t6], t7

        layer_saved = []
        for l in range(L):
            k = "L%d" % l
            mine = []
            sv, x = yield from norm(h, "attn_norm", k + ".in")
            mine += sv
            q = A(act, "attn_proj", "mm", k + ".q")
            kk = A(act, "attn_proj", "mm", k + ".k")
            vv = A(act, "attn_proj", "mm", k + ".v")
            for t in (q, kk, vv):
                yield out(t)
            mine.append(x)
            roped = []
            for nm, src in (("q", q), ("k", kk)):
                a = A(act, "rope", "mul", k + ".rope_cos." + nm)
                yield out(a)
                half = A(act // 2, "rope", "neg", k + ".neg." + nm)
                yield out(half)
                c = A(act, "rope", "cat", k + ".cat." + nm)
                yield out(c)
                yield Fr(half, "rope", k + ".neg." + nm)
                b2 = A(act, "rope", "mul", k + ".rope_sin." + nm)
                yield out(b2)
                yield Fr(c, "rope", k + ".cat." + nm)
                r = A(act, "rope", "add", k + ".rope_add." + nm)
                yield out(r)
                yield Fr(a, "rope", k + ".rope_cos." + nm)
                yield Fr(b2, "rope", k + ".rope_sin." + nm)
                roped.append(r)
            mine += [q, kk] + roped + [vv]
            o = A(act, "sdpa", "_scaled_dot_product_flash_attention", k + ".sdpa")
            lse = A(B * NH * S * 4, "sdpa", "_scaled_dot_product_flash_attention", k + ".lse")
            seed = A(8, "sdpa", "_scaled_dot_product_flash_attention", k + ".seed")
            off = A(8, "sdpa", "_scaled_dot_product_flash_attention", k + ".offset")
            for t in (o, lse, seed, off):
                yield out(t)
            mine += [o, lse, seed, off]
            ctg = A(act, "attn", "clone", k + ".contig")
            yield out(ctg)
            op_ = A(act, "attn_proj", "mm", k + ".o")
            yield out(op_)
            h2 = A(act, "layer", "add", k + ".res1")
            yield out(h2)
            mine += [ctg, op_, h]
            sv, x2 = yield from norm(h2, "mlp_norm", k + ".post")
            mine += sv + [x2]
            g = A(mlp, "mlp_proj", "mm", k + ".gate")
            yield out(g)
            sl = A(mlp, "mlp_act", "silu", k + ".silu")
            yield out(sl)
            u = A(mlp, "mlp_proj", "mm", k + ".up")
            yield out(u)
            m = A(mlp, "mlp", "mul", k + ".mul")
            yield out(m)
            d = A(act, "mlp_proj", "mm", k + ".down")
            yield out(d)
            h3 = A(act, "layer", "add", k + ".res2")
            yield out(h3)
            mine += [g, sl, u, m, d, h2]
            if ev[0]:  # no_grad: nothing is kept for backward
                for t in mine:
                    yield Fr(t, "layer", k + ".drop")
                mine = []
            layer_saved.append(mine)
            h = h3
        sv, hn = yield from norm(h, "final_norm", "final")
        logits = A(Tn * V * 2, "lm_head", "mm", "logits")
        yield out(logits)
        lf = A(Tn * V * 4, "loss", "_to_copy", "logits.f32")
        yield out(lf)
        ls = A(Tn * V * 4, "loss", "_log_softmax", "log_softmax")
        yield out(ls)
        yield Fr(lf, "loss", "logits.f32")
        loss = A(2, "loss", "nll_loss_forward", "loss")
        tw = A(4, "loss", "nll_loss_forward", "total_weight")
        yield out(loss)
        yield out(tw)
        head_saved = sv + [h, hn, logits, ls, tw]
        if ev[0]:
            for t in head_saved + [loss, cos, sin] + ([] if CARRY_BATCH else batch):
                yield Fr(t, "loss", "eval_end")
            continue

        # --- backward
        grads = {}

        def pgrad(name, node):
            t = A(psize[name], "backward", "mm" if psize[name] > H * 2 else "sum", name + ".grad", node)
            grads[name] = t
            return ("a", t)

        one = A(2, "backward", "ones_like", "seed_grad", "GraphRoot")
        yield out(one)
        g1 = A(Tn * V * 4, "backward", "nll_loss_backward", "nll_grad", "NllLossBackward0")
        yield out(g1)
        yield Fr(one, "backward", "seed_grad", "NllLossBackward0")
        yield Fr(tw, "backward", "tw", "NllLossBackward0")
        yield Fr(loss, "backward", "loss", "NllLossBackward0")
        g2 = A(Tn * V * 4, "backward", "_log_softmax_backward_data", "lsm_grad", "LogSoftmaxBackward0")
        yield out(g2)
        yield Fr(g1, "backward", "nll_grad", "LogSoftmaxBackward0")
        yield Fr(ls, "backward", "log_softmax", "LogSoftmaxBackward0")
        g3 = A(Tn * V * 2, "backward", "_to_copy", "logits_grad", "ToCopyBackward0")
        yield out(g3)
        yield Fr(g2, "backward", "lsm_grad", "ToCopyBackward0")
        gh = A(act, "backward", "mm", "head_in_grad", "MmBackward0")
        yield out(gh)
        yield pgrad("lm_head", "MmBackward0")
        yield Fr(g3, "backward", "logits_grad", "MmBackward0")
        yield Fr(logits, "backward", "logits", "MmBackward0")

        def norm_bwd(gy, sv, wname, key):
            t = A(act32, "backward", "mul", key + ".nb1", "MulBackward0")
            yield out(t)
            yield pgrad(wname, "MulBackward0")
            t2 = A(act32, "backward", "mul", key + ".nb2", "MulBackward0")
            yield out(t2)
            t3 = A(tok32, "backward", "sum", key + ".nb3", "RsqrtBackward0")
            yield out(t3)
            yield Fr(t, "backward", key + ".nb1", "RsqrtBackward0")
            gx = A(act, "backward", "_to_copy", key + ".nbx", "ToCopyBackward0")
            yield out(gx)
            yield Fr(t2, "backward", key + ".nb2", "ToCopyBackward0")
            yield Fr(t3, "backward", key + ".nb3", "ToCopyBackward0")
            for i, t in enumerate(sv):
                yield Fr(t, "backward", key + ".sv%d" % i, "MulBackward0")
            yield Fr(gy, "backward", key + ".gy", "MulBackward0")
            return gx

        gh = yield from norm_bwd(gh, head_saved[:3], "norm", "final")
        yield Fr(head_saved[3], "backward", "h_final", "MulBackward0")
        yield Fr(head_saved[4], "backward", "hn_final", "MulBackward0")
        for l in reversed(range(L)):
            k = "L%d" % l
            sv = layer_saved[l]
            (n1_t1, n1_t4, n1_t6, x, q, kk, rq, rk, vv, o, lse, seed, off, ctg, op_, h_in,
             n2_t1, n2_t4, n2_t6, x2, g, sl, u, m, d, h2) = sv
            # MLP
            gm = A(mlp, "backward", "mm", k + ".gm", "MmBackward0")
            yield out(gm)
            yield pgrad(k + ".down", "MmBackward0")
            yield Fr(m, "backward", k + ".m", "MmBackward0")
            yield Fr(d, "backward", k + ".d", "AddBackward0")
            gsl = A(mlp, "backward", "mul", k + ".gsl", "MulBackward0")
            yield out(gsl)
            gu = A(mlp, "backward", "mul", k + ".gu", "MulBackward0")
            yield out(gu)
            yield Fr(gm, "backward", k + ".gm", "MulBackward0")
            yield Fr(sl, "backward", k + ".sl", "MulBackward0")
            gg = A(mlp, "backward", "silu_backward", k + ".gg", "SiluBackward0")
            yield out(gg)
            yield Fr(gsl, "backward", k + ".gsl", "SiluBackward0")
            yield Fr(g, "backward", k + ".g", "SiluBackward0")
            gx1 = A(act, "backward", "mm", k + ".gx_up", "MmBackward0")
            yield out(gx1)
            yield pgrad(k + ".up", "MmBackward0")
            yield Fr(gu, "backward", k + ".gu", "MmBackward0")
            yield Fr(u, "backward", k + ".u", "MmBackward0")
            gx2 = A(act, "backward", "mm", k + ".gx_gate", "MmBackward0")
            yield out(gx2)
            yield pgrad(k + ".gate", "MmBackward0")
            yield Fr(gg, "backward", k + ".gg", "MmBackward0")
            gx = A(act, "backward", "add", k + ".gx_mlp", "AddBackward0")
            yield out(gx)
            yield Fr(gx1, "backward", k + ".gx_up", "AddBackward0")
            yield Fr(gx2, "backward", k + ".gx_gate", "AddBackward0")
            yield Fr(x2, "backward", k + ".x2", "MmBackward0")
            gn = yield from norm_bwd(gx, [n2_t1, n2_t4, n2_t6], k + ".post_norm", k + ".post")
            gres = A(act, "backward", "add", k + ".gres1", "AddBackward0")
            yield out(gres)
            yield Fr(gn, "backward", k + ".gn2", "AddBackward0")
            yield Fr(gh, "backward", k + ".gh", "AddBackward0")
            yield Fr(h2, "backward", k + ".h2", "AddBackward0")
            gh = gres
            # attention
            gctg = A(act, "backward", "mm", k + ".gctg", "MmBackward0")
            yield out(gctg)
            yield pgrad(k + ".o", "MmBackward0")
            yield Fr(op_, "backward", k + ".op", "AddBackward0")
            yield Fr(ctg, "backward", k + ".ctg", "MmBackward0")
            gq = A(act, "backward", "_scaled_dot_product_flash_attention_backward", k + ".gq", "ScaledDotProductFlashAttentionBackward0")
            gk = A(act, "backward", "_scaled_dot_product_flash_attention_backward", k + ".gk", "ScaledDotProductFlashAttentionBackward0")
            gv = A(act, "backward", "_scaled_dot_product_flash_attention_backward", k + ".gv", "ScaledDotProductFlashAttentionBackward0")
            dsum = A(B * NH * S * 4, "backward", "_scaled_dot_product_flash_attention_backward", k + ".dsum", "ScaledDotProductFlashAttentionBackward0")
            for t in (gq, gk, gv, dsum):
                yield out(t)
            yield Fr(dsum, "backward", k + ".dsum", "ScaledDotProductFlashAttentionBackward0")
            yield Fr(gctg, "backward", k + ".gctg", "ScaledDotProductFlashAttentionBackward0")
            for t, nm in ((o, "o"), (lse, "lse"), (seed, "seed"), (off, "off"), (rq, "rq"), (rk, "rk")):
                yield Fr(t, "backward", k + "." + nm, "ScaledDotProductFlashAttentionBackward0")
            gqs = []
            for gsrc, nm in ((gq, "q"), (gk, "k")):
                ga = A(act, "backward", "mul", k + ".grc." + nm, "MulBackward0")
                yield out(ga)
                gb = A(act, "backward", "mul", k + ".grs." + nm, "MulBackward0")
                yield out(gb)
                gc = A(act // 2, "backward", "slice_backward", k + ".grh." + nm, "CatBackward0")
                yield out(gc)
                gd = A(act, "backward", "add", k + ".gra." + nm, "AddBackward0")
                yield out(gd)
                for t, n2 in ((ga, "grc"), (gb, "grs"), (gc, "grh"), (gsrc, "gsrc")):
                    yield Fr(t, "backward", k + "." + n2 + "." + nm, "AddBackward0")
                gqs.append(gd)
            gxs = []
            for gsrc, pn in ((gqs[0], "q"), (gqs[1], "k"), (gv, "v")):
                t = A(act, "backward", "mm", k + ".gx_" + pn, "MmBackward0")
                yield out(t)
                yield pgrad(k + "." + pn, "MmBackward0")
                yield Fr(gsrc, "backward", k + ".g" + pn, "MmBackward0")
                gxs.append(t)
            for t, nm in ((q, "q"), (kk, "k"), (vv, "v")):
                yield Fr(t, "backward", k + ".proj_" + nm, "MmBackward0")
            s1 = A(act, "backward", "add", k + ".gsum1", "AddBackward0")
            yield out(s1)
            s2 = A(act, "backward", "add", k + ".gsum2", "AddBackward0")
            yield out(s2)
            yield Fr(s1, "backward", k + ".gsum1", "AddBackward0")
            for i, t in enumerate(gxs):
                yield Fr(t, "backward", k + ".gxs%d" % i, "AddBackward0")
            yield Fr(x, "backward", k + ".x", "MmBackward0")
            gn = yield from norm_bwd(s2, [n1_t1, n1_t4, n1_t6], k + ".in_norm", k + ".in")
            gres = A(act, "backward", "add", k + ".gres0", "AddBackward0")
            yield out(gres)
            yield Fr(gn, "backward", k + ".gn1", "AddBackward0")
            yield Fr(gh, "backward", k + ".gh0", "AddBackward0")
            yield Fr(h_in, "backward", k + ".h_in", "AddBackward0")
            gh = gres
        ge = A(V * H * 2, "backward", "embedding_dense_backward", "embed.grad", "EmbeddingBackward0")
        grads["embed"] = ge
        yield out(ge)
        yield Fr(gh, "backward", "embed_gy", "EmbeddingBackward0")
        for t, nm in ((cos, "cos"), (sin, "sin")):
            yield Fr(t, "backward", nm, "EmbeddingBackward0")
        for t, nm in zip([] if CARRY_BATCH else batch, ("input_ids", "labels", "attention_mask")):
            yield Fr(t, "data", nm)

        # --- clip_grad_norm_
        norms = []
        for name, _ in params:
            t = A(2, "clip", "_foreach_norm", name)
            norms.append(t)
            yield out(t)
        st = A(2 * len(params), "clip", "stack", "stack")
        yield out(st)
        tot = A(2, "clip", "linalg_vector_norm", "total")
        yield out(tot)
        yield Fr(st, "clip", "stack")
        for t, (name, _) in zip(norms, params):
            yield Fr(t, "clip", name)
        coef = A(4, "clip_apply", "div", "coef")
        yield out(coef)
        cl = A(4, "clip_apply", "clamp", "clamped")
        yield out(cl)
        for t, nm in ((coef, "coef"), (cl, "clamped"), (tot, "total")):
            yield Fr(t, "clip_apply", nm)
        # --- AdamW (foreach)
        if not exp_avg:
            for name, size in params:
                exp_avg[name] = A(size, "adamw_init", "zeros_like", name + ".exp_avg")
                yield out(exp_avg[name])
                exp_avg_sq[name] = A(size, "adamw_init", "zeros_like", name + ".exp_avg_sq")
                yield out(exp_avg_sq[name])
        tmp = []
        for name, size in params:
            t = A(size, "adamw", "_foreach_sqrt", name)
            tmp.append(t)
            yield out(t)
        for t, (name, _) in zip(tmp, params):
            yield Fr(t, "adamw", name)
        # --- zero_grad(set_to_none=True)
        for name, _ in params:
            yield Fr(grads[name], "zero_grad", name)


# ----------------------------------------------------------------------------------------------------------
# Simulation: exactly N trace entries
# ----------------------------------------------------------------------------------------------------------
ACTIONS = [s("alloc"), s("free_requested"), s("free_completed"), s("segment_alloc")]


class Trace:
    def __init__(self):
        self.action = bytearray()
        self.addr = array("Q")
        self.size = array("Q")
        self.time = array("Q")
        self.stack = array("I")

    def add(self, a, addr, size, t, stack):
        self.action.append(a)
        self.addr.append(addr)
        self.size.append(size)
        self.time.append(t)
        self.stack.append(stack)

    def __len__(self):
        return len(self.action)


def simulate(n_entries, seed=1234):
    rng = random.Random(seed)
    trng = random.Random(seed + 1)
    pool = StackPool()
    alloc = Allocator()
    tr = Trace()
    now = 1748732571000000
    live = peak = 0
    steps_seen = 0
    for op in program(rng, pool):
        rem = n_entries - len(tr)
        if rem <= 0:
            break
        t = op[1]
        if op[0] == "a":
            b, p, rsize = alloc.malloc(t.req, t.stack)
            if b is None:
                seg = alloc.new_segment(p, rsize, t.stack)
                now += trng.randint(50, 400)
                tr.add(3, seg.addr, seg.size, now, t.stack)
                if rem < 2:  # room for the segment_alloc only: the allocation itself is not recorded
                    t.dead = True
                    continue
                b, _, _ = alloc.malloc(t.req, t.stack)
            now += trng.randint(2, 40)
            tr.add(0, b.addr, t.req, now, t.stack)
            t.block = b
            live += b.size
            peak = max(peak, live)
        else:
            if t.dead:
                continue
            if rem < 2:  # keep the tensor alive rather than leave a dangling free_requested
                continue
            b = t.block
            assert b is not None and b.active, "double free in the program"
            now += trng.randint(1, 12)
            tr.add(1, b.addr, b.req, now, op[2])
            now += trng.randint(0, 2)
            tr.add(2, b.addr, b.req, now, op[2])
            live -= b.size
            alloc.free(b)
            t.block = None
    assert len(tr) == n_entries
    return pool, alloc, tr, peak


# ----------------------------------------------------------------------------------------------------------
# Building the snapshot objects
# ----------------------------------------------------------------------------------------------------------
K = {k: s(k) for k in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                       "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
                       "size", "state", "name", "filename", "line", "action", "addr", "time_us",
                       "compile_context", "user_metadata", "segments", "device_traces", "allocator_settings",
                       "external_annotations", "PYTORCH_CUDA_ALLOC_CONF", "max_split_size",
                       "expandable_segments", "roundup_power2_divisions")}
V_ACTIVE, V_INACTIVE, V_LARGE, V_SMALL, V_NA, V_EMPTY = (s("active_allocated"), s("inactive"), s("large"),
                                                       s("small"), s("N/A"), s(""))


class Objects:
    """Python objects for frames / stacks: shared (one object per distinct frame / stack), real (frame dicts
    shared, a fresh list each time), or fresh each time (unshared)."""

    def __init__(self, pool, shared, fresh_lists=False):
        self.pool, self.shared, self.fresh_lists = pool, shared, fresh_lists
        if shared:
            fr = [{K["name"]: n, K["filename"]: f, K["line"]: ln} for (n, f, ln) in FRAMES]
            self.frame_objs = fr
            self.stack_objs = [[fr[i] for i in st] for st in pool.stacks]
            self.empty = []

    def stack(self, sid):
        if self.shared and self.fresh_lists:
            return list(self.stack_objs[sid])
        if self.shared:
            return self.stack_objs[sid]
        return [{K["name"]: n, K["filename"]: f, K["line"]: ln}
                for (n, f, ln) in (FRAMES[i] for i in self.pool.stacks[sid])]

    def no_frames(self):
        return self.empty if self.shared else []


def build_segments(alloc, objs):
    out = []
    for seg in sorted(alloc.segments, key=lambda g: g.addr):
        blocks = []
        b = seg.head
        a_size = a_req = 0
        while b is not None:
            if b.active:
                a_size += b.size
                a_req += b.req
                blocks.append({K["address"]: b.addr, K["size"]: b.size, K["requested_size"]: b.req,
                               K["state"]: V_ACTIVE, K["frames"]: objs.stack(b.stack)})
            else:
                blocks.append({K["address"]: b.addr, K["size"]: b.size, K["requested_size"]: b.req,
                               K["state"]: V_INACTIVE, K["frames"]: objs.no_frames()})
            b = b.next
        # key order as torch 2.x writes it (frames are filled in after blocks)
        out.append({K["device"]: 0, K["address"]: seg.addr, K["total_size"]: seg.size,
                    K["allocated_size"]: a_size, K["active_size"]: a_size, K["requested_size"]: a_req,
                    K["stream"]: 0, K["segment_type"]: V_LARGE if seg.pool == "large" else V_SMALL,
                    K["segment_pool_id"]: (0, 0), K["is_expandable"]: False, K["blocks"]: blocks,
                    K["frames"]: objs.stack(seg.stack)})
    return out


def allocator_settings():
    return {K["PYTORCH_CUDA_ALLOC_CONF"]: V_EMPTY, K["max_split_size"]: -1, K["expandable_segments"]: False,
            K["roundup_power2_divisions"]: {}}


EXTRA_KEY = None


def trace_entry(tr, i, objs, frames=None):
    # torch builds the compile context string afresh for every entry (pickle then writes and memoizes it each time);
    # the empty user metadata is CPython's one empty string.
    ctx = "".join(("N/", "A")) if objs.fresh_lists else V_NA
    e = {K["action"]: ACTIONS[tr.action[i]], K["addr"]: tr.addr[i], K["size"]: tr.size[i], K["stream"]: 0,
         K["time_us"]: tr.time[i], K["compile_context"]: ctx, K["user_metadata"]: V_EMPTY,
         K["frames"]: objs.stack(tr.stack[i]) if frames is None else frames}
    if EXTRA_KEY:
        # A key a future torch might add: a str that differs on every entry, before the frames as torch orders them.
        e = {**{k: v for k, v in e.items() if k != K["frames"]}, EXTRA_KEY: "v%d" % i, K["frames"]: e[K["frames"]]}
    return e


def trace_entries(tr, objs):
    """The trace's entries; with fresh lists, a free_completed reuses the list of the free_requested before it
    (torch records one context for the free and completes it with the same)."""
    out = []
    for i in range(len(tr)):
        reuse = None
        if objs.fresh_lists and tr.action[i] == 2 and i > 0 and tr.action[i - 1] == 1 and tr.stack[i] == tr.stack[i - 1]:
            reuse = out[-1][K["frames"]]
        out.append(trace_entry(tr, i, objs, reuse))
    return out


def build_snapshot(pool, alloc, tr, shared, fresh_lists=False):
    objs = Objects(pool, shared, fresh_lists)
    return {K["segments"]: build_segments(alloc, objs),
            K["device_traces"]: [trace_entries(tr, objs)],
            K["allocator_settings"]: allocator_settings(),
            K["external_annotations"]: []}


def stats(path):
    """The figures ../shared/tools/snapshot-stats.py prints, computed the same way."""
    import statistics

    class DataOnly(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError("a snapshot is plain data")

    with open(path, "rb") as f:
        data = DataOnly(f).load()
    if not isinstance(data, dict):  # the oldest format: a bare list of segments, no trace
        data = {}
    trace = [e for dev in data.get("device_traces", []) for e in dev]
    with_frames = [e["frames"] for e in trace if e.get("frames")]
    depths = [len(fr) for fr in with_frames]
    if not with_frames:
        return {"entries": len(trace), "keys": sorted({k for e in trace[:1000] for k in e})}
    allocs = [e for e in trace if e.get("action") == "alloc"]
    return {
        "entries": len(trace),
        # stacks="python" leaves what the autograd engine allocates with no frame at all
        "allocs_without_frames": round(sum(1 for e in allocs if not e.get("frames")) / max(len(allocs), 1), 3),
        "lists_per_entry": round(len({id(fr) for fr in with_frames}) / len(with_frames), 3),
        "distinct_stacks": len({tuple(id(x) for x in fr) for fr in with_frames}),
        "frame_dicts": len({id(x) for fr in with_frames for x in fr}),
        "depth_median": statistics.median(depths),
        "depth_max": max(depths),
        "keys": sorted({k for e in trace[:1000] for k in e}),
        "bytes_per_entry": round(os.path.getsize(path) / len(trace), 1),
        **wrap_stats(data, trace),
    }


def wrap_stats(data, trace):
    """How far the trace is from the start of the run (a wrapped ring buffer, or recording started late): the share
    of the blocks live at the end it never saw allocated, of the segments it never saw created, and of its entries
    that free an allocation it never saw."""
    allocated, created, unseen_frees = set(), set(), 0
    for e in trace:
        a = e.get("action")
        if a == "alloc":
            allocated.add(e.get("addr"))
        elif a == "segment_alloc" or a == "segment_map":
            created.add(e.get("addr"))
        elif a == "free_requested" and e.get("addr") not in allocated:
            unseen_frees += 1
    segs = [sg for sg in data.get("segments", []) if isinstance(sg, dict)]
    live = [b for sg in segs for b in sg.get("blocks", []) if b.get("state") == "active_allocated"]
    return {
        "blocks_before_trace": round(sum(1 for b in live if b.get("address") not in allocated) / max(len(live), 1), 3),
        "segments_before_trace": round(sum(1 for sg in segs if sg.get("address") not in created) / max(len(segs), 1), 3),
        "frees_unseen_per_entry": round(unseen_frees / max(len(trace), 1), 4),
    }


# ----------------------------------------------------------------------------------------------------------
# Streaming protocol-4 writer: the bytes the C pickler (pickle.dump, protocol 4) writes, without the objects
# ----------------------------------------------------------------------------------------------------------
FRAME_TARGET = 64 * 1024
encode_long = pickle.encode_long


def enc_int(v):
    if 0 <= v < 256:
        return b"K" + bytes((v,))
    if 0 <= v < 65536:
        return b"M" + v.to_bytes(2, "little")
    if -0x80000000 <= v <= 0x7FFFFFFF:
        return b"J" + v.to_bytes(4, "little", signed=True)
    e = encode_long(v)
    if len(e) < 256:
        return b"\x8a" + bytes((len(e),)) + e
    return b"\x8b" + len(e).to_bytes(4, "little", signed=True) + e


class StreamPickler:
    def __init__(self, f):
        self.f = f
        self.buf = bytearray()
        self.memo = {}  # id(obj) -> memo index
        self.keep = []  # keeps memoized objects alive so ids stay unique
        self.n = 0
        f.write(b"\x80\x04")

    # framing: when a save() begins and the current frame holds >= 64 KiB, the frame is committed
    def boundary(self):
        if len(self.buf) >= FRAME_TARGET:
            self.commit()

    def commit(self):
        n = len(self.buf)
        if n >= 4:
            self.f.write(b"\x95" + n.to_bytes(8, "little"))
        self.f.write(self.buf)
        self.buf = bytearray()

    def get_op(self, idx):
        return b"h" + bytes((idx,)) if idx < 256 else b"j" + idx.to_bytes(4, "little")

    def memoize(self, obj):
        self.memo[id(obj)] = self.n
        self.keep.append(obj)
        self.n += 1
        self.buf += b"\x94"

    def save(self, obj):
        self.boundary()
        w = self.buf
        t = type(obj)
        if obj is None:
            w += b"N"
        elif obj is True:
            w += b"\x88"
        elif obj is False:
            w += b"\x89"
        elif t is int:
            w += enc_int(obj)
        else:
            idx = self.memo.get(id(obj))
            if idx is not None:
                w += self.get_op(idx)
            elif t is str:
                e = obj.encode("utf-8", "surrogatepass")
                if len(e) < 256:
                    w += b"\x8c" + bytes((len(e),)) + e
                else:
                    w += b"X" + len(e).to_bytes(4, "little") + e
                self.memoize(obj)
            elif t is tuple:
                if not obj:
                    w += b")"
                else:
                    assert len(obj) <= 3
                    for x in obj:
                        self.save(x)
                    self.buf += b"\x85\x86\x87"[len(obj) - 1:len(obj)]
                    self.memoize(obj)
            elif t is list:
                w += b"]"
                self.memoize(obj)
                self.save_items(obj)
            elif t is dict:
                w += b"}"
                self.memoize(obj)
                n = len(obj)
                if n == 1:
                    (k, v), = obj.items()
                    self.save(k)
                    self.save(v)
                    self.buf += b"s"
                elif n > 1:
                    items = list(obj.items())
                    i = 0
                    while True:
                        self.buf += b"("
                        batch = items[i:i + 1000]
                        for k, v in batch:
                            self.save(k)
                            self.save(v)
                        self.buf += b"u"
                        i += len(batch)
                        if len(batch) != 1000:
                            break
            else:
                raise TypeError(t)

    def save_items(self, lst, save_one=None):
        save_one = save_one or self.save
        n = len(lst)
        if n == 1:
            save_one(lst[0])
            self.buf += b"a"
        elif n > 1:
            i = 0
            while i < n:
                self.buf += b"("
                for x in lst[i:i + 1000]:
                    save_one(x)
                self.buf += b"e"
                i += 1000

    def finish(self):
        self.buf += b"."
        self.commit()


class Chunk:
    """Pre-encoded opcodes plus the offsets where a save() begins inside them (where a frame may end)."""
    __slots__ = ("data", "bounds")

    def __init__(self):
        self.data = bytearray()
        self.bounds = []

    def raw(self, b):
        self.data += b

    def mark(self):  # a save() begins here
        self.bounds.append(len(self.data))

    def op(self, b):  # a complete save() of an atom or a memo reference
        self.bounds.append(len(self.data))
        self.data += b


def stream_unshared(f, pool, alloc, tr):
    p = StreamPickler(f)
    objs = Objects(pool, shared=False)
    p.boundary()
    p.buf += b"}"
    p.memoize({})  # the top-level dict (never referenced again)
    p.buf += b"("
    p.save(K["segments"])
    p.save(build_segments(alloc, objs))
    p.save(K["device_traces"])
    p.boundary()
    p.buf += b"]"
    p.memoize([])
    p.boundary()
    p.buf += b"]"
    p.memoize([])

    frame_cache = {}
    blob_cache = {}

    def ref(obj):
        idx = p.memo.get(id(obj))
        return None if idx is None else p.get_op(idx)

    def frame_chunk(fid):
        c = frame_cache.get(fid)
        if c is None:
            n, fn, ln = FRAMES[fid]
            parts = [ref(K["name"]), ref(n), ref(K["filename"]), ref(fn), ref(K["line"])]
            if None in parts:
                return None
            c = Chunk()
            c.mark()
            c.raw(b"}\x94(")
            for x in parts:
                c.op(x)
            c.op(enc_int(ln))
            c.raw(b"u")
            frame_cache[fid] = c
        return c

    def stack_chunk(sid):
        c = blob_cache.get(sid)
        if c is None:
            c = Chunk()
            c.mark()
            # pickle writes an empty list as `] MEMOIZE`, one item with APPEND, more within MARK … APPENDS.
            depth = len(pool.stacks[sid])
            c.raw(b"]\x94(" if depth > 1 else b"]\x94")
            for fid in pool.stacks[sid]:
                fc = frame_chunk(fid)
                if fc is None:
                    return None
                base = len(c.data)
                c.data += fc.data
                c.bounds += [base + o for o in fc.bounds]
            if depth:
                c.raw(b"e" if depth > 1 else b"a")
            c.data = bytes(c.data)
            blob_cache[sid] = c
        return c

    hdr = {}

    def header_refs():
        keys = [K[k] for k in ("action", "addr", "size", "stream", "time_us", "compile_context",
                               "user_metadata", "frames")] + [V_NA, V_EMPTY]
        r = [ref(k) for k in keys]
        if None in r:
            return None
        return dict(zip(("action", "addr", "size", "stream", "time_us", "cc", "um", "frames", "na", "empty"), r))

    act_refs = [None] * 4
    n = len(tr)
    A_, AD, SZ, TM, ST = tr.action, tr.addr, tr.size, tr.time, tr.stack

    def slow(i):
        p.save(trace_entry(tr, i, objs))

    def fast(i, h, ar, sc):
        a, addr, size, t = A_[i], AD[i], SZ[i], TM[i]
        pieces = (h["action"], ar, h["addr"], enc_int(addr), h["size"], enc_int(size), h["stream"], b"K\x00",
                  h["time_us"], enc_int(t), h["cc"], h["na"], h["um"], h["empty"], h["frames"])
        head = b"".join(pieces)
        buf = p.buf
        total = 3 + len(head) + len(sc.data) + 1
        p.n += 2 + len(pool.stacks[ST[i]])  # the entry, its list, each fresh frame dict
        if len(buf) + total < FRAME_TARGET:
            buf += b"}\x94("
            buf += head
            buf += sc.data
            buf += b"u"
            return
        # a frame may end inside this entry: split at the first save() that begins at >= 64 KiB
        c = Chunk()
        c.mark()
        c.raw(b"}\x94(")
        for x in pieces:
            c.op(x)
        base = len(c.data)
        c.data += sc.data
        c.bounds += [base + o for o in sc.bounds]
        c.raw(b"u")
        j = bisect.bisect_left(c.bounds, FRAME_TARGET - len(buf))
        if j == len(c.bounds):
            buf += c.data
            return
        cut = c.bounds[j]
        buf += c.data[:cut]
        p.commit()
        p.buf += c.data[cut:]

    def save_entry(i):
        nonlocal hdr
        a = A_[i]
        if hdr is None or not hdr:
            hdr = header_refs()
        ar = act_refs[a]
        if ar is None:
            ar = act_refs[a] = ref(ACTIONS[a])
        sc = stack_chunk(ST[i]) if hdr and ar else None
        if sc is None:
            slow(i)
        else:
            fast(i, hdr, ar, sc)

    if n == 1:
        save_entry(0)
        p.buf += b"a"
    elif n > 1:
        i = 0
        while i < n:
            p.buf += b"("
            for j in range(i, min(i + 1000, n)):
                save_entry(j)
            p.buf += b"e"
            i += 1000
    p.buf += b"a"
    p.save(K["allocator_settings"])
    p.save(allocator_settings())
    p.save(K["external_annotations"])
    p.save([])
    p.buf += b"u"
    p.finish()


# ----------------------------------------------------------------------------------------------------------
# Driver, self-test, verification
# ----------------------------------------------------------------------------------------------------------
def wrap_trace(tr, keep):
    """The last `keep` entries: what a ring buffer of max_entries=keep holds after a longer run. The final segments
    stay the whole run's, so the trace starts mid-way: blocks live from before it, frees of allocations it never
    saw, segments it never saw created."""
    out = Trace()
    cut = len(tr) - keep
    out.action = tr.action[cut:]
    out.addr, out.size, out.time, out.stack = tr.addr[cut:], tr.size[cut:], tr.time[cut:], tr.stack[cut:]
    return out


def generate(n, variant, out, writer="auto", quiet=False, wrap=0.0):
    t0 = time.time()
    if wrap:
        # The run is longer than the buffer by `wrap` of it: 0.5 keeps the second half of a run twice as long.
        pool, alloc, full, peak = simulate(int(n / (1 - wrap)))
        tr = wrap_trace(full, n)
        del full
    else:
        pool, alloc, tr, peak = simulate(n)
    t1 = time.time()
    if writer == "auto":
        writer = "pickle" if variant in ("shared", "real") else "stream"
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        if writer == "pickle":
            snap = build_snapshot(pool, alloc, tr, variant in ("shared", "real"), fresh_lists=variant == "real")
            pickle.dump(snap, f, protocol=4)
            del snap
        else:
            assert variant == "unshared", "the stream writer writes the unshared variant"
            stream_unshared(f, pool, alloc, tr)
    os.replace(tmp, out)
    t2 = time.time()
    if not quiet:
        used = len(set(tr.stack))
        nblocks = 0
        for seg in alloc.segments:
            b = seg.head
            while b is not None:
                nblocks += 1
                b = b.next
        print("%s: %d entries, %d segments, %d blocks, %d stacks used (%d in pool) over %d frames, "
              "peak allocated %.2f GiB; simulate %.1fs, write (%s) %.1fs"
              % (out, len(tr), len(alloc.segments), nblocks, used, len(pool.stacks), len(FRAMES),
                 peak / GiB, t1 - t0, writer, t2 - t1), file=sys.stderr)
        size = os.path.getsize(out)
        print("%s %d bytes (%.1f MB)" % (out, size, size / 1e6))
        if variant == "real":
            st = stats(out)
            if wrap:
                print("%s: wrapped: %.0f%% of the blocks live at the end allocated before the trace, %.0f%% of the "
                      "segments created before it, %.2f%% of the entries free allocations it never saw"
                      % (out, 100 * st["blocks_before_trace"], 100 * st["segments_before_trace"],
                         100 * st["frees_unseen_per_entry"]))
            print("%s: %d entries, lists/entry %.3f, %d distinct stacks, %d frame dicts, depth median %s max %d, "
                  "%.1f bytes/entry, %.0f%% of allocations without frames, keys %s"
                  % (out, st["entries"], st["lists_per_entry"], st["distinct_stacks"], st["frame_dicts"],
                     st["depth_median"], st["depth_max"], st["bytes_per_entry"], 100 * st["allocs_without_frames"],
                     ",".join(st["keys"])))


def selftest():
    global PYTHON_STACKS
    import tempfile
    ok = True
    with tempfile.TemporaryDirectory() as d:
        for python in (False, True):
            PYTHON_STACKS = python
            for n in (1, 2, 3, 999, 1000, 1001, 2000, 30000):
                a, b = os.path.join(d, "a"), os.path.join(d, "b")
                generate(n, "unshared", a, "pickle", quiet=True)
                generate(n, "unshared", b, "stream", quiet=True)
                same = open(a, "rb").read() == open(b, "rb").read()
                print("stacks=%-6s entries=%-6d stream writer %s pickle.dump"
                      % ("python" if python else "all", n, "==" if same else "!="))
                ok &= same
    PYTHON_STACKS = False
    return ok


def verify(path):
    """Load with pickle, replay the trace and check it against `segments`."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][0]
    live = {}
    segs = {}
    for e in trace:
        a = e["action"]
        assert PYTHON_STACKS or len(e["frames"]) == len(trace[0]["frames"]), "stack depth differs"
        if a == "alloc":
            assert e["addr"] not in live
            live[e["addr"]] = e["size"]
        elif a == "free_completed":
            del live[e["addr"]]
        elif a == "segment_alloc":
            segs[e["addr"]] = e["size"]
    active = {}
    act_size = 0
    for sg in snap["segments"]:
        assert segs.get(sg["address"]) == sg["total_size"], "segment not in trace"
        addr = sg["address"]
        tot = 0
        for b in sg["blocks"]:
            assert b["address"] == addr, "blocks not contiguous"
            addr += b["size"]
            tot += b["size"]
            if b["state"] == "active_allocated":
                active[b["address"]] = b["requested_size"]
                act_size += b["size"]
        assert tot == sg["total_size"], "block sizes do not sum to total_size"
        assert sg["allocated_size"] == sum(b["size"] for b in sg["blocks"] if b["state"] == "active_allocated")
    assert len(segs) == len(snap["segments"])
    assert set(active) == set(live), "live allocations differ"
    rep_req = sum(live.values())
    blk_req = sum(active.values())
    assert rep_req == blk_req
    # an independent address-level replay with torch's rounding / split / merge rules gives every block
    seg_type = {sg["address"]: sg["segment_type"] for sg in snap["segments"]}
    blk, end2start, owner = {}, {}, {}  # start -> [size, active]; end -> start; start -> segment address

    def put(a, size, act, seg):
        blk[a] = [size, act]
        end2start[a + size] = a
        owner[a] = seg

    def drop(a):
        size, _ = blk.pop(a)
        del end2start[a + size]
        return owner.pop(a)

    for e in trace:
        a = e["action"]
        if a == "segment_alloc":
            put(e["addr"], e["size"], False, e["addr"])
        elif a == "alloc":
            size, act = blk[e["addr"]]
            assert not act
            seg = drop(e["addr"])
            rsize = max(512, -(-e["size"] // 512) * 512)
            rem = size - rsize
            if rem >= 512 if seg_type[seg] == "small" else rem > K_SMALL:
                put(e["addr"] + rsize, rem, False, seg)
                size = rsize
            put(e["addr"], size, True, seg)
        elif a == "free_completed":
            start = e["addr"]
            size, act = blk[start]
            assert act
            seg = drop(start)
            nxt = start + size
            if nxt in blk and not blk[nxt][1] and owner[nxt] == seg:
                size += blk[nxt][0]
                drop(nxt)
            prv = end2start.get(start)
            if prv is not None and not blk[prv][1] and owner[prv] == seg:
                size += blk[prv][0]
                drop(prv)
                start = prv
            put(start, size, False, seg)
    replayed = sorted((a, sz, act) for a, (sz, act) in blk.items())
    recorded = sorted((b["address"], b["size"], b["state"] == "active_allocated")
                      for sg in snap["segments"] for b in sg["blocks"])
    assert replayed == recorded, "replayed blocks differ from segments"
    rep_active = sum(sz for _, sz, act in replayed if act)
    assert rep_active == act_size
    frames = {(f["name"], f["filename"], f["line"]) for e in trace for f in e["frames"]}
    stacks = {tuple((f["name"], f["filename"], f["line"]) for f in e["frames"]) for e in trace}
    list_ids = len({id(e["frames"]) for e in trace})
    print("%s: OK — %d entries, %d segments, %d live allocations\n"
          "  active_allocated block bytes in segments %d == replayed from the trace %d "
          "(requested bytes %d == %d); all %d blocks match the replay\n"
          "  %d distinct stacks, %d distinct frames, %d distinct frame-list objects in the trace"
          % (path, len(trace), len(snap["segments"]), len(live), act_size, rep_active, blk_req, rep_req,
             len(recorded), len(stacks), len(frames), list_ids))


def main():
    global STACK_DEPTH, PYTHON_STACKS, EXTRA_KEY, CARRY_BATCH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int)
    ap.add_argument("--variant", choices=["real", "shared", "unshared"])
    ap.add_argument("--stats", metavar="PICKLE", help="print a file's shape statistics as JSON")
    ap.add_argument("-o", "--output")
    ap.add_argument("--depth", type=int, default=STACK_DEPTH,
                    help="frames per stack (default %(default)s: 1M unshared entries ~760 MB; 30 gives ~650 MB)")
    ap.add_argument("--writer", choices=["auto", "pickle", "stream"], default="auto",
                    help="auto: pickle.dump for shared, the streaming writer for unshared")
    ap.add_argument("--stacks", choices=["all", "python"], default="all",
                    help="as torch's _record_memory_history(stacks=...): all (native and Python frames, default) "
                         "or python (Python frames only; the autograd engine's allocations get none)")
    ap.add_argument("--wrap", type=float, default=0.0, metavar="FRACTION",
                    help="a ring buffer that wrapped: the run is longer than the trace kept by this fraction of it "
                         "(0.5: the trace is the second half of the run), as max_entries makes on any long run")
    ap.add_argument("--carry-batch", action="store_true",
                    help="free each step's inputs when the next step's are made, as `x = batch.to(device)` in a "
                         "loop does, rather than after the backward: a request is held across every step boundary")
    ap.add_argument("--extra-key", metavar="NAME",
                    help="add a key no torch writes to every trace entry, its value a str that differs on each "
                         "(for the reader's test that such a drift is caught)")
    ap.add_argument("--verify", metavar="PICKLE", help="load a generated file and check it")
    ap.add_argument("--selftest", action="store_true", help="stream writer == pickle.dump, byte for byte")
    a = ap.parse_args()
    if a.selftest:
        sys.exit(0 if selftest() else 1)
    PYTHON_STACKS = a.stacks == "python"
    if a.verify:
        verify(a.verify)
        return
    if a.stats:
        import json
        print(json.dumps(stats(a.stats)))
        return
    if not (a.entries and a.variant and a.output):
        ap.error("--entries, --variant and -o are required")
    if not 16 <= a.depth <= 38:
        ap.error("--depth must be within 16..38")
    STACK_DEPTH = a.depth
    EXTRA_KEY = a.extra_key
    CARRY_BATCH = a.carry_batch
    if EXTRA_KEY and a.variant == "unshared":
        ap.error("--extra-key needs the pickle writer (--variant real or shared)")
    d = os.path.dirname(os.path.abspath(a.output))
    os.makedirs(d, exist_ok=True)
    if not 0 <= a.wrap < 0.95:
        ap.error("--wrap must be within 0..0.95")
    generate(a.entries, a.variant, a.output, a.writer, wrap=a.wrap)


if __name__ == "__main__":
    main()
