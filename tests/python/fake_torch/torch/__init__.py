"""A stand-in for the few parts of torch that oomdoc.record touches. It records every call in `calls`, keeps the
recording state, and `_fake.trigger_oom()` does what the caching allocator does at an OOM: calls the attached
observers, then raises OutOfMemoryError.

`_fake.reset(api=…)` shapes the API like a torch version: "modern" (2.1 and later: keyword
_record_memory_history, _dump_snapshot, _cuda_isHistoryEnabled, torch.OutOfMemoryError) or "legacy" (2.0: the
positional/trace_alloc_* signature, no _dump_snapshot, no history probe, only torch.cuda.OutOfMemoryError).
A dumped snapshot is a copy of a real one (FAKE_TORCH_SNAPSHOT, default: a real H100 capture in fixtures/).
"""
import os
import pickle
import shutil
import sys
import types

__version__ = "0.0.0+fake"

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SNAPSHOT = os.path.join(_HERE, "..", "..", "..", "..", "fixtures", "real-gpu", "leaked-references",
                                "snapshot.pickle")

cuda = types.ModuleType("torch.cuda")
optim = types.ModuleType("torch.optim")
optim.optimizer = types.ModuleType("torch.optim.optimizer")
nn = types.ModuleType("torch.nn")
nn.modules = types.ModuleType("torch.nn.modules")
nn.modules.module = types.ModuleType("torch.nn.modules.module")
for _m in (optim, optim.optimizer, nn, nn.modules, nn.modules.module):
    sys.modules[_m.__name__] = _m
cuda.memory = types.ModuleType("torch.cuda.memory")
distributed = types.ModuleType("torch.distributed")
_C = types.SimpleNamespace()
_fake = types.ModuleType("torch._fake")
sys.modules["torch.cuda"] = cuda
sys.modules["torch.cuda.memory"] = cuda.memory
sys.modules["torch.distributed"] = distributed


class OutOfMemoryError(RuntimeError):
    pass


def _snapshot_file():
    return os.environ.get("FAKE_TORCH_SNAPSHOT", DEFAULT_SNAPSHOT)


class _Handle:
    def __init__(self, registry, hook):
        self.registry, self.hook = registry, hook

    def remove(self):
        if self.hook in self.registry:
            self.registry.remove(self.hook)


def _registrar(registry):
    def register(hook):
        registry.append(hook)
        return _Handle(registry, hook)
    return register


class Optimizer:
    """torch.optim.Optimizer's step as its global hooks see it: pre-hooks, the step (which allocates its state),
    post-hooks."""

    def step(self):
        for h in list(_fake.step_pre):
            h(self, (), {})
        allocate("exp_avg")
        for h in list(_fake.step_post):
            h(self, (), {})


class Module:
    """torch.nn.Module as the global forward hooks see it: named children, hooks around forward."""

    def __init__(self, **children):
        self._children = children

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def forward(self):
        allocate("activation")
        for child in self._children.values():
            child()

    def __call__(self):
        for h in list(_fake.forward_pre):
            h(self, ())
        out = self.forward()
        for h in list(_fake.forward_post):
            h(self, (), out)
        return out


def allocate(what):
    """An allocation as the allocator records it: with the metadata in force on this thread."""
    _fake.allocations.append((what, _fake.metadata))


optim.Optimizer = Optimizer
nn.Module = Module


def reset(api="modern", cuda_available=True, observer=True, history_on=False, dist_rank=None, fraction=None,
          metadata=False, backend="cuda"):
    """metadata: a torch with _set_memory_metadata / _get_memory_metadata (2.10 and later). backend="xpu": a torch
    on an Intel GPU: CUDA unavailable, the same allocator API on torch.xpu, the observer hook on _C's _xpu_ name."""
    _fake.calls = []
    _fake.allocations = []
    _fake.metadata = ""
    _fake.step_pre, _fake.step_post, _fake.forward_pre, _fake.forward_post = [], [], [], []
    optim.optimizer.register_optimizer_step_pre_hook = _registrar(_fake.step_pre)
    optim.optimizer.register_optimizer_step_post_hook = _registrar(_fake.step_post)
    nn.modules.module.register_module_forward_pre_hook = _registrar(_fake.forward_pre)
    nn.modules.module.register_module_forward_hook = _registrar(_fake.forward_post)
    for name in ("_set_memory_metadata", "_get_memory_metadata"):
        if hasattr(cuda.memory, name):
            delattr(cuda.memory, name)
    if metadata:
        def _set_memory_metadata(s):
            _fake.calls.append(("_set_memory_metadata", (s,), {}))
            _fake.metadata = s

        cuda.memory._set_memory_metadata = _set_memory_metadata
        cuda.memory._get_memory_metadata = lambda: _fake.metadata
    _fake.observers = []
    _fake.history = history_on
    _fake.api = api
    _fake.initialized = False
    # Calls that crash the real process (a segfault, no exception): the tests check this stays empty.
    _fake.crashes = []

    def log(name, *args, **kwargs):
        _fake.calls.append((name, args, kwargs))

    cuda.is_available = lambda: cuda_available

    def init():
        if not cuda_available:
            raise RuntimeError("Found no NVIDIA driver on your system.")
        _fake.initialized = True

    cuda.init = init
    # torch ≥ 2.9 reports set_per_process_memory_fraction's cap; `fraction=None` is a torch without the getter.
    if hasattr(cuda, "get_per_process_memory_fraction"):
        del cuda.get_per_process_memory_fraction
    if fraction is not None:
        cuda.get_per_process_memory_fraction = lambda device=None: fraction
    # An H100 80GB's total_memory, as torch reports it.
    cuda.get_device_properties = lambda device: types.SimpleNamespace(total_memory=85520809984, name="fake")
    for name in ("_record_memory_history", "_dump_snapshot", "_snapshot"):
        if hasattr(cuda.memory, name):
            delattr(cuda.memory, name)
    for name in ("_cuda_isHistoryEnabled", "_cuda_attach_out_of_memory_observer"):
        if hasattr(_C, name):
            delattr(_C, name)
    g = globals()
    g.pop("OutOfMemoryError", None)
    if hasattr(cuda, "OutOfMemoryError"):
        del cuda.OutOfMemoryError

    if api == "modern":
        def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                                   device=None):
            log("_record_memory_history", enabled=enabled, context=context, stacks=stacks, max_entries=max_entries)
            _fake.history = enabled is not None

        def _dump_snapshot(filename="dump_snapshot.pickle"):
            log("_dump_snapshot", filename)
            if os.environ.get("FAKE_TORCH_DUMP_DIES"):
                # A job killed while it dumps: half the file written, then the process gone.
                with open(_snapshot_file(), "rb") as src, open(filename, "wb") as out:
                    data = src.read()
                    out.write(data[: len(data) // 2])
                os._exit(137)
            shutil.copyfile(_snapshot_file(), filename)

        cuda.memory._record_memory_history = _record_memory_history
        cuda.memory._dump_snapshot = _dump_snapshot
        def _cuda_isHistoryEnabled():
            # torch 2.11 reads the current device's allocator here: before CUDA is initialised it segfaults.
            if not _fake.initialized:
                _fake.crashes.append("_cuda_isHistoryEnabled before CUDA init")
            return _fake.history

        _C._cuda_isHistoryEnabled = _cuda_isHistoryEnabled
        g["OutOfMemoryError"] = _OOM
        cuda.OutOfMemoryError = _OOM
    elif api == "legacy":
        def _record_memory_history(enabled, record_context=True, trace_alloc_max_entries=1,
                                   trace_alloc_record_context=False, device=None, record_context_cpp=False):
            log("_record_memory_history", enabled, record_context=record_context,
                trace_alloc_max_entries=trace_alloc_max_entries,
                trace_alloc_record_context=trace_alloc_record_context, record_context_cpp=record_context_cpp)
            _fake.history = bool(enabled)

        cuda.memory._record_memory_history = _record_memory_history
        cuda.OutOfMemoryError = _OOM
    else:
        raise ValueError(api)

    def _snapshot(device=None):
        log("_snapshot")
        with open(_snapshot_file(), "rb") as f:
            return pickle.load(f)

    cuda.memory._snapshot = _snapshot
    if observer:
        def attach(fn):
            log("_cuda_attach_out_of_memory_observer")
            _fake.observers.append(fn)

        _C._cuda_attach_out_of_memory_observer = attach

    for name in ("xpu", "npu"):
        g.pop(name, None)
        sys.modules.pop("torch." + name, None)
        if hasattr(_C, f"_{name}_attach_out_of_memory_observer"):
            delattr(_C, f"_{name}_attach_out_of_memory_observer")
    sys.modules.pop("torch_npu", None)
    if backend in ("xpu", "npu"):
        # The same allocator API on torch.xpu (Intel) or torch.npu (Ascend, once torch_npu is imported), CUDA
        # unavailable, the observer hook under the backend's name: on torch._C for XPU, torch_npu._C for NPU.
        dev = types.ModuleType("torch." + backend)
        dev.memory = cuda.memory
        dev.is_available = lambda: True
        dev.init = cuda.init
        dev.get_device_properties = cuda.get_device_properties
        cuda.is_available = lambda: False
        g[backend] = dev
        sys.modules["torch." + backend] = dev
        hook_owner = _C
        if backend == "npu":
            torch_npu = types.ModuleType("torch_npu")
            torch_npu._C = types.SimpleNamespace()
            sys.modules["torch_npu"] = torch_npu
            hook_owner = torch_npu._C
        if hasattr(_C, "_cuda_attach_out_of_memory_observer"):
            setattr(hook_owner, f"_{backend}_attach_out_of_memory_observer", _C._cuda_attach_out_of_memory_observer)
            del _C._cuda_attach_out_of_memory_observer

    distributed.is_available = lambda: True
    distributed.is_initialized = lambda: dist_rank is not None
    distributed.get_rank = lambda: dist_rank


_OOM = OutOfMemoryError


def trigger_oom(device=0, alloc=16 << 20):
    """What the allocator does when cudaMalloc fails: the observers first, then the exception."""
    for fn in list(_fake.observers):
        fn(device, alloc, 80 << 30, 1 << 20)
    raise _OOM(f"CUDA out of memory. Tried to allocate {alloc >> 20} MiB. GPU {device} has a total capacity of "
               "79.19 GiB of which 1.00 MiB is free.")


def trigger_rejection(alloc=1536 << 20):
    """A request the allocator refuses under per_process_memory_fraction with throw_on_cudamalloc_oom (torch ≥ 2.12):
    no OOM observer is called, no `oom` entry recorded; only the exception."""
    raise _OOM("CUDA out of memory. Allocation was preemptively rejected because it would exceed "
               f"per_process_memory_fraction limit. Requested size: {alloc / (1 << 30):.2f} GiB")


_fake.reset = reset
_fake.trigger_oom = trigger_oom
_fake.trigger_rejection = trigger_rejection
_fake.allocate = allocate
reset(api=os.environ.get("FAKE_TORCH_API", "modern"),
      cuda_available=os.environ.get("FAKE_TORCH_CUDA", "1") == "1")
