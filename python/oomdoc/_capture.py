"""Record the CUDA caching allocator's history, dump a snapshot at the OOM, and print oomdoc's verdict on it.

torch is imported when recording starts, never when this module is imported. Features are detected, not inferred
from version numbers:
- `torch.cuda.memory._record_memory_history` takes `enabled/context/stacks/max_entries` since torch 2.1 and
  `enabled, record_context, trace_alloc_max_entries, trace_alloc_record_context, record_context_cpp` in 2.0;
- `torch.cuda.memory._dump_snapshot` is used when present, else `_snapshot()` is pickled as it does;
- `torch._C._cuda_attach_out_of_memory_observer` gives the moment of the OOM, before the exception unwinds and
  frees what the failing step held; without it the context manager dumps when the OOM exception reaches it;
- `torch._C._cuda_isHistoryEnabled` tells whether someone else already records (then their settings are kept and
  recording is left on at the end);
- `torch.cuda.memory._set_memory_metadata` (torch 2.10 and later) labels the events recorded after it on this
  thread: "optimizer" during `optimizer.step` (torch.optim's global step hooks), and with labels="modules" the
  module's name during its forward (torch.nn's global forward hooks), which oomdoc reads as what the memory is for
  and where in the model it was allocated.

Not every OOM reaches an observer: a request the allocator rejects under `per_process_memory_fraction` with
`throw_on_cudamalloc_oom` raises with no observer called, and some builds have no observer at all. The snapshot is
then written from the exception: when it leaves the `with` block, or (a plain `oomdoc.record()` call) when it
leaves the program, through `sys.excepthook`, before the traceback is printed. The job's exception, traceback and
exit status stay its own. On Intel GPUs and Ascend NPUs the same calls are made on `torch.xpu` / `torch.npu`
(torch_npu), where the job runs.

A snapshot is written to a temporary file and renamed: a job killed while dumping leaves no half file under the
final name. The analysis runs in a child process under a time limit (OOMDOC_VERDICT_TIMEOUT seconds, default 120),
so a slow or hung binary cannot hold the job; beside the snapshot it also writes the rank's JSON report
(`oom-0.json` beside `oom-0.pickle`), so a job of many ranks is reduced from small files
(`oomdoc analyze oom/*.json`) instead of moving every snapshot to one machine.
"""
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings

from . import _binary

# torch cannot detach an OOM observer: one observer per process dispatches to the recorders active now.
_active = []
_observer_attached = False
_lock = threading.Lock()
# The excepthook in force before the first plain-call recorder installed ours (put back when none is left).
_previous_excepthook = None

# Where each accelerator's allocator is reached: the device module's attribute on torch, and the names of its
# observer hooks on torch._C (or torch_npu._C). The rejection observers are probed: no released torch is known to
# expose one to Python yet.
_BACKENDS = (
    ("cuda", ("_cuda_attach_out_of_memory_observer",), ("_cuda_attach_oom_rejection_observer",)),
    ("xpu", ("_xpu_attach_out_of_memory_observer",), ()),
    ("npu", ("_npu_attach_out_of_memory_observer",), ()),
)

VERDICT_TIMEOUT_S = 120


def _env_rank(name):
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def current_rank(torch=None):
    """The process's rank: RANK (set by torchrun, Slurm launchers, …), else torch.distributed's when initialised,
    else LOCAL_RANK, else 0."""
    rank = _env_rank("RANK")
    if rank is not None:
        return rank
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    rank = _env_rank("LOCAL_RANK")
    return 0 if rank is None else rank


def _parameters(fn):
    import inspect

    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _device_module(torch):
    """The accelerator the job runs on: ("cuda", torch.cuda) — ROCm builds too —, else ("xpu", torch.xpu), else
    ("npu", torch.npu) when torch_npu is imported; None when none is available."""
    for name, _, _ in _BACKENDS:
        module = getattr(torch, name, None)
        try:
            if module is not None and module.is_available():
                return name, module
        except Exception:
            continue
    return None


def _c_modules(torch, backend):
    mods = [getattr(torch, "_C", None)]
    if backend == "npu":
        mods.append(getattr(sys.modules.get("torch_npu"), "_C", None))
    return [m for m in mods if m is not None]


def _history_enabled(torch):
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if probe is None:
        return None
    try:
        return bool(probe())
    except Exception:
        return None


def _start_history(dev, max_entries, stacks, context):
    record = dev.memory._record_memory_history
    params = _parameters(record)
    modern = {"enabled": "all", "context": context, "stacks": stacks, "max_entries": max_entries}
    legacy = {
        "record_context": context is not None,
        "trace_alloc_max_entries": max_entries,
        "trace_alloc_record_context": context in ("all", "alloc"),
        "record_context_cpp": stacks == "all",
    }
    if params is None:
        # A builtin without a signature: try the current form, then torch 2.0's.
        try:
            record(**modern)
            return "modern"
        except TypeError:
            record(True, **legacy)
            return "legacy"
    if "max_entries" in params:
        record(**{k: v for k, v in modern.items() if k in params})
        return "modern"
    record(True, **{k: v for k, v in legacy.items() if k in params})
    return "legacy"


def _stop_history(dev, api):
    record = dev.memory._record_memory_history
    if api == "modern":
        record(enabled=None)
    else:
        record(False)


def _dump(dev, path):
    """Writes the snapshot to a temporary name beside `path`, then renames it: a process killed while dumping (a
    multi-GB snapshot takes seconds) leaves a `.tmp` file, never a truncated one under the final name."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        dump = getattr(dev.memory, "_dump_snapshot", None)
        if dump is not None:
            dump(tmp)
        else:
            snapshot = dev.memory._snapshot()
            with open(tmp, "wb") as f:
                pickle.dump(snapshot, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def _is_oom(torch, exc):
    for owner in (torch, getattr(torch, "cuda", None), getattr(torch, "xpu", None), getattr(torch, "npu", None)):
        cls = getattr(owner, "OutOfMemoryError", None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    # torch before OutOfMemoryError existed raised a RuntimeError with this message (torch_npu still does).
    return isinstance(exc, RuntimeError) and re.search(r"\b(CUDA|HIP|XPU|NPU) out of memory", str(exc)) is not None


def _observer(device, alloc, device_alloc, device_free):
    # Called by the allocator, GIL held, before the OutOfMemoryError is raised: an exception here must not escape.
    # Recorders nest (a `with oomdoc.record(…)` inside a script run by `python -m oomdoc run`): the innermost one,
    # the last started, dumps; one OOM gives one snapshot and one verdict.
    with _lock:
        innermost = _active[-1] if _active else None
    if innermost is not None:
        innermost._on_oom(device=device, requested=alloc)


def _rejection_observer(device, alloc, total_allocated, device_total):
    # Called (asynchronously) for a request rejected under per_process_memory_fraction: no OOM observer runs then.
    _observer(device, alloc, total_allocated, None)


def _attach_observer(torch, backend):
    """Attaches the OOM observer (and the rejection observer, where this torch has one) of the backend's allocator;
    says whether an OOM observer is attached."""
    global _observer_attached
    with _lock:
        if _observer_attached:
            return True
        names = next((b for b in _BACKENDS if b[0] == backend), _BACKENDS[0])
        mods = _c_modules(torch, backend)
        attach = next((getattr(m, n) for n in names[1] for m in mods if getattr(m, n, None) is not None), None)
        if attach is None:
            return False
        attach(_observer)
        for n in names[2]:
            reject = next((getattr(m, n) for m in mods if getattr(m, n, None) is not None), None)
            if reject is not None:
                try:
                    reject(_rejection_observer)
                except Exception:
                    pass
        _observer_attached = True
        return True


def _excepthook(exc_type, exc, tb):
    """The OOM that leaves the program with no observer called (a rejection under the fraction cap, a torch without
    observers): the innermost plain-call recorder dumps it, then the traceback is printed as it would have been."""
    try:
        with _lock:
            innermost = _active[-1] if _active else None
        if innermost is not None and innermost.snapshot is None and _is_oom(innermost._torch, exc):
            innermost._on_oom()
    except Exception:
        pass
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _install_excepthook():
    global _previous_excepthook
    with _lock:
        if sys.excepthook is not _excepthook:
            _previous_excepthook = sys.excepthook
            sys.excepthook = _excepthook


def _remove_excepthook():
    global _previous_excepthook
    with _lock:
        if sys.excepthook is _excepthook and not _active:
            sys.excepthook = _previous_excepthook or sys.__excepthook__
            _previous_excepthook = None


class _Labels:
    """Labels what the allocator records with `_set_memory_metadata` while a recorder is active: "optimizer" during
    optimizer.step, and (modules=True) the module's qualified name during its forward, innermost module first. The
    metadata is per thread, as the hooks are; the label in force before a hook is put back after it."""

    def __init__(self, torch, dev, modules):
        self.set = getattr(dev.memory, "_set_memory_metadata", None)
        self.get = getattr(dev.memory, "_get_memory_metadata", None)
        self.torch = torch
        self.modules = modules
        self.handles = []
        self.names = {}
        self.local = threading.local()

    def _push(self, label):
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        before = self.get() if self.get is not None else (stack[-1][1] if stack else "")
        stack.append((before, label))
        self.set(label)

    def _pop(self):
        stack = getattr(self.local, "stack", None)
        if stack:
            before, _ = stack.pop()
            self.set(before)

    def _name(self, module):
        name = self.names.get(id(module))
        if name is None:
            # A module not seen yet is the root of a model called for the first time: name all of its modules.
            for n, m in getattr(module, "named_modules", lambda: [])():
                self.names.setdefault(id(m), n or type(m).__name__)
            name = self.names.setdefault(id(module), type(module).__name__)
        return name

    def start(self):
        """Installs the hooks this torch offers; says whether any was."""
        if self.set is None:
            return False
        optim = getattr(getattr(self.torch, "optim", None), "optimizer", None)
        pre = getattr(optim, "register_optimizer_step_pre_hook", None)
        post = getattr(optim, "register_optimizer_step_post_hook", None)
        if pre is not None and post is not None:
            self.handles.append(pre(lambda opt, args, kwargs: self._push("optimizer")))
            self.handles.append(post(lambda opt, args, kwargs: self._pop()))
        if self.modules:
            module = getattr(getattr(getattr(self.torch, "nn", None), "modules", None), "module", None)
            fpre = getattr(module, "register_module_forward_pre_hook", None)
            fpost = getattr(module, "register_module_forward_hook", None)
            if fpre is not None and fpost is not None:
                self.handles.append(fpre(lambda m, args: self._push(self._name(m))))
                self.handles.append(fpost(lambda m, args, out: self._pop()))
        return bool(self.handles)

    def stop(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def parse_interval_ms(value):
    """'200ms', '0.5s', '2s' or a number of milliseconds -> milliseconds (at least 1)."""
    if isinstance(value, (int, float)):
        ms = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", str(value))
        if not m:
            raise ValueError(f"an interval like 200ms or 0.5s, not {value!r}")
        ms = float(m.group(1)) * (1000.0 if m.group(2) == "s" else 1.0)
    if ms < 1:
        raise ValueError(f"an interval of at least 1ms, not {value!r}")
    return int(round(ms))


class SmiSampler:
    """nvidia-smi logging memory beside the job (the CSV oomdoc reads to size memory outside PyTorch)."""

    QUERY = "--query-gpu=timestamp,index,memory.used,memory.free,memory.total"

    def __init__(self, path, interval_ms):
        self.path = path
        self.interval_ms = interval_ms
        self.process = None

    def start(self):
        exe = shutil.which("nvidia-smi")
        if exe is None:
            warnings.warn("oomdoc: nvidia-smi is not on the PATH: memory outside PyTorch will not be sampled")
            return self
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(self.path, "w") as out:
            self.process = subprocess.Popen(
                [exe, self.QUERY, "--format=csv", "-lms", str(self.interval_ms)],
                stdout=out,
                stderr=subprocess.DEVNULL,
            )
        return self

    def wait_for_a_sample(self, timeout=1.0):
        """An OOM in the job's first moments can come before nvidia-smi has printed a line: give it up to `timeout`
        seconds, while it runs, to write its header and one sample."""
        deadline = time.monotonic() + timeout
        while self.process is not None and self.process.poll() is None and time.monotonic() < deadline:
            try:
                with open(self.path, "rb") as f:
                    if f.read().count(b"\n") >= 2:
                        return
            except OSError:
                return
            time.sleep(0.02)

    def stop(self):
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None


def _brief(report):
    """The report's head: inputs, verdict and findings, up to the first GPU's detail section."""
    plain = re.compile(r"\x1b\[[0-9;]*m")
    lines = report.splitlines()
    for i, line in enumerate(lines):
        if i > 0 and not lines[i - 1].strip() and re.match(r"GPU \d+ at ", plain.sub("", line)):
            return "\n".join(lines[: i - 1]).rstrip("\n")
    return report.rstrip("\n")


def _human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def _color_on(stream):
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except Exception:
        return False


class Recorder:
    """Recording started by :func:`record`; a context manager, or call :meth:`stop`."""

    def __init__(self, path, max_entries, stacks, context, verdict, smi, labels=True, json_report=True):
        if labels not in (True, False, "modules"):
            raise ValueError(f"labels: True, False or 'modules', not {labels!r}")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks: 'python' or 'all', not {stacks!r}")
        if context not in ("all", "alloc", "state", None):
            raise ValueError(f"context: 'all', 'alloc', 'state' or None, not {context!r}")
        self.path = str(path)
        try:
            self.path.format(rank=0, local_rank=0, pid=0, device=0, host="host")
        except (KeyError, IndexError, ValueError) as e:
            # Said now, not at the OOM, where a failed dump could only be reported.
            raise ValueError(
                f"path {self.path!r}: only {{rank}}, {{local_rank}}, {{device}}, {{pid}} and {{host}} are filled in "
                f"(double a brace to keep it: {{{{ }}}}); {type(e).__name__}: {e}"
            ) from None
        self.max_entries = int(max_entries)
        self.stacks = stacks
        self.context = context
        self.verdict = verdict and os.environ.get("OOMDOC_VERDICT", "1") not in ("0", "no", "false", "off")
        self.smi_interval_ms = None if smi is None else parse_interval_ms(smi)
        self.active = False
        #: the snapshot written at the OOM (the first one; later OOMs in the same recording are not dumped).
        self.snapshot = None
        #: where nvidia-smi was logged, when it was.
        self.smi_path = None
        self._torch = None
        self._api = None
        self._smi = None
        self._dumping = False
        self.labels = labels
        self._labels = None
        self.json_report = json_report
        #: the rank's JSON report written beside the snapshot, when it was.
        self.report = None
        self._dev = None
        self._backend = None
        self._hooked = False

    def _names(self, device=None):
        torch = self._torch
        return {
            "rank": current_rank(torch),
            "local_rank": _env_rank("LOCAL_RANK") or 0,
            "pid": os.getpid(),
            "device": 0 if device is None else device,
            "host": socket.gethostname(),
        }

    def start(self):
        try:
            import torch
        except ImportError:
            warnings.warn("oomdoc.record: torch is not installed: nothing is recorded", stacklevel=3)
            return self
        found = _device_module(torch)
        if found is None:
            warnings.warn("oomdoc.record: CUDA is not available: nothing is recorded", stacklevel=3)
            return self
        self._backend, dev = found
        self._dev = dev
        self._torch = torch
        init = getattr(dev, "init", None)
        if init is not None:
            # The allocator's entry points below reach per-device state that exists only once CUDA is initialised;
            # called before, they crash the process (torch 2.11 on an H200, before the training script's first CUDA
            # call). Initialising here is what the script's first tensor on the GPU would do anyway.
            init()
        if self._backend != "cuda" or not _history_enabled(torch):
            self._api = _start_history(dev, self.max_entries, self.stacks, self.context)
        observer = _attach_observer(torch, self._backend)
        if not observer:
            # Only the exception is seen: the snapshot is taken when it reaches the `with` block's end.
            warnings.warn(
                "oomdoc.record: this torch has no OOM observer: the snapshot is dumped when the OutOfMemoryError "
                "leaves the `with oomdoc.record():` block",
                stacklevel=3,
            )
        if self.labels:
            labels = _Labels(torch, dev, modules=self.labels == "modules")
            if labels.start():
                self._labels = labels
        with _lock:
            _active.append(self)
        self.active = True
        _install_excepthook()
        if self.smi_interval_ms is not None and (_env_rank("LOCAL_RANK") or 0) == 0:
            folder = os.path.dirname(self.path.format(**self._names()))
            self.smi_path = os.path.join(folder, "nvidia-smi.{}.csv".format(socket.gethostname()))
            self._smi = SmiSampler(self.smi_path, self.smi_interval_ms).start()
        return self

    def stop(self):
        """Stops what this recorder started (recording, the nvidia-smi sampler) and stops dumping at an OOM."""
        if not self.active:
            return
        self.active = False
        with _lock:
            if self in _active:
                _active.remove(self)
        _remove_excepthook()
        if self._labels is not None:
            self._labels.stop()
            self._labels = None
        if self._api is not None:
            _stop_history(self._dev, self._api)
            self._api = None
        if self._smi is not None:
            self._smi.stop()
            self._smi = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc is not None and self.active and self.snapshot is None and _is_oom(self._torch, exc):
                self._on_oom()
        finally:
            self.stop()
        return False

    def _on_oom(self, device=None, requested=None):
        if self.snapshot is not None or self._dumping or not self.active:
            return
        self._dumping = True
        try:
            path = self.path.format(**self._names(device))
            _dump(self._dev, path)
            self.snapshot = path
            what = "" if requested is None else f" asking for {_human(requested)}"
            gpu = "" if device is None else f" on GPU {device}"
            print(f"oomdoc: out of memory{gpu}{what}: snapshot written to {path}", file=sys.stderr, flush=True)
            total = self._total_memory(device)
            cap = self._memory_cap(device, total)
            if self.json_report:
                self._write_report(path, total, cap)
            if self.verdict:
                self._print_verdict(path, total, cap)
        except Exception as e:  # never into the allocator
            print(f"oomdoc: could not write the snapshot at the OOM: {e}", file=sys.stderr, flush=True)
        finally:
            self._dumping = False

    def _total_memory(self, device):
        # The GPU's size lets the report tell memory held outside PyTorch (CUDA context, NCCL, other libraries) from
        # the driver's free bytes the snapshot recorded at the OOM. Read from the device's properties: no allocation.
        try:
            props = self._dev.get_device_properties(0 if device is None else device)
            return int(props.total_memory)
        except Exception:
            return None

    def _memory_cap(self, device, total):
        # A process capped with set_per_process_memory_fraction fails with the device's memory still free; the OOM
        # message names the cap, but the observer runs before the message exists. torch ≥ 2.9 can be asked.
        get = getattr(self._dev, "get_per_process_memory_fraction", None)
        if get is None or not total:
            return None
        try:
            fraction = float(get(0 if device is None else device))
        except Exception:
            return None
        return int(total * fraction) if 0 < fraction < 1 else None

    @staticmethod
    def _figures(total_memory, memory_cap):
        return [
            *(["--gpu-memory", str(total_memory)] if total_memory else []),
            *(["--memory-cap", str(memory_cap)] if memory_cap else []),
        ]

    def _write_report(self, path, total_memory, memory_cap):
        """The rank's JSON report beside its snapshot: the map step of the job's analysis, on the rank's node."""
        out = os.path.splitext(path)[0] + ".json"
        tmp = f"{out}.{os.getpid()}.tmp"
        try:
            proc = _binary.run_binary(
                ["analyze", path, *self._figures(total_memory, memory_cap), "--no-progress", "--format", "json",
                 "-o", tmp],
                timeout=_verdict_timeout(),
            )
            if proc.returncode in (0, 1) and os.path.exists(tmp):
                os.replace(tmp, out)
                self.report = out
        except (_binary.BinaryNotFound, OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if os.path.exists(tmp):
                try:
                    os.remove(tmp)
                except OSError:
                    pass

    def _print_verdict(self, path, total_memory=None, memory_cap=None):
        files = [path]
        if self._smi is not None:
            self._smi.wait_for_a_sample()
        if self.smi_path and os.path.exists(self.smi_path) and os.path.getsize(self.smi_path) > 0:
            files.append(self.smi_path)
        color = _color_on(sys.stderr)
        try:
            proc = _binary.run_binary(
                [
                    "analyze",
                    *files,
                    *self._figures(total_memory, memory_cap),
                    "--no-progress",
                    "--top",
                    "3",
                    "--color",
                    "always" if color else "never",
                ],
                timeout=_verdict_timeout(),
            )
        except (_binary.BinaryNotFound, OSError) as e:
            print(f"oomdoc: could not run the analysis ({e}); later: oomdoc analyze {path}", file=sys.stderr, flush=True)
            return
        except subprocess.TimeoutExpired:
            print(
                f"oomdoc: the analysis took longer than {_verdict_timeout():g} s and was stopped "
                f"(OOMDOC_VERDICT_TIMEOUT); run: oomdoc analyze {path}",
                file=sys.stderr,
                flush=True,
            )
            return
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace").strip()
        if out.strip():
            print(_brief(out), file=sys.stderr)
            print(
                f"\noomdoc: the full report: oomdoc analyze {' '.join(files)}  (-o report.html for a page to attach)",
                file=sys.stderr,
                flush=True,
            )
        if err:
            print(err, file=sys.stderr, flush=True)


def _verdict_timeout():
    try:
        return max(0.1, float(os.environ.get("OOMDOC_VERDICT_TIMEOUT", VERDICT_TIMEOUT_S)))
    except ValueError:
        return VERDICT_TIMEOUT_S


def record(path="oom-{rank}.pickle", max_entries=100_000, stacks="python", context="all", verdict=True, smi=None,
           labels=True, json_report=True):
    """Records the allocator's history and, at an out-of-memory error, dumps a snapshot and prints oomdoc's verdict.

    Use it as a plain call at the start of training, or as a context manager around the part that may fail::

        import oomdoc
        oomdoc.record()                      # one line: oom-<rank>.pickle and the verdict at the OOM

        with oomdoc.record("snapshots/oom-{rank}.pickle"):
            train()

    path: where the snapshot goes; `{rank}`, `{local_rank}`, `{device}`, `{pid}` and `{host}` are filled in
        (the rank from RANK, torch.distributed or LOCAL_RANK).
    max_entries: allocation events kept (a ring buffer: the last ones before the OOM).
    stacks: "python", or "all" for C++ frames too (slower).
    context: what the events record: "all", "alloc", "state" or None.
    verdict: print oomdoc's verdict to stderr after the dump (also off with OOMDOC_VERDICT=0).
    smi: sample nvidia-smi every this often ("200ms") beside the snapshot, one file per host, so the report can size
        memory held outside PyTorch.
    labels: where torch can label what it records (`_set_memory_metadata`, torch 2.10 and later), label the
        optimizer's step, so its state is named even without a stack; "modules" also labels each module's forward
        with its name (a global forward hook on every module call: a little slower); False for neither.
    json_report: also write the rank's JSON report beside the snapshot (`oom-0.json`), for `oomdoc analyze
        oom/*.json` over a job of many ranks.

    Without CUDA (or torch) it warns and records nothing. On exit (or `.stop()`) what it changed is restored:
    recording it started is stopped, a recording someone else started is left on, and it no longer dumps.
    """
    return Recorder(path, max_entries, stacks, context, verdict, smi, labels, json_report).start()
