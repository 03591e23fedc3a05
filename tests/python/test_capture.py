"""The capture helpers (python/oomdoc) against a stand-in for torch (fake_torch/): dump at the OOM, rank naming,
restore on exit, no CUDA, torch 2.0's API, `python -m oomdoc run`. The verdict comes from the real oomdoc binary
(OOMDOC_BIN, else the one installed beside this Python) on a real snapshot.

Run: PYTHONPATH=python:tests/python/fake_torch OOMDOC_BIN=target/debug/oomdoc python3 -m unittest discover tests/python
"""
import contextlib
import io
import json
import os
import pickle
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import warnings

import torch

import oomdoc
from oomdoc import _capture

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_TORCH = os.path.join(HERE, "fake_torch")


def fresh(**kwargs):
    """A new fake torch state, and oomdoc's per-process observer forgotten with it."""
    torch._fake.reset(**kwargs)
    _capture._observer_attached = False
    _capture._active.clear()


@contextlib.contextmanager
def environ(**values):
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


NO_RANK = {"RANK": None, "LOCAL_RANK": None, "OOMDOC_VERDICT": None}


class Record(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        fresh()

    def tearDown(self):
        self.tmp.cleanup()
        # Each of these would have been a segfault in a real process.
        self.assertEqual(torch._fake.crashes, [])

    def names(self):
        return [c[0] for c in torch._fake.calls]

    def oom_inside(self, recorder_args=None, **trigger):
        err = io.StringIO()
        with environ(**NO_RANK), contextlib.redirect_stderr(err):
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                with oomdoc.record(**(recorder_args or {"path": os.path.join(self.dir, "oom-{rank}.pickle")})):
                    torch._fake.trigger_oom(**trigger)
        return err.getvalue()

    def test_dumps_the_snapshot_at_the_oom_and_prints_the_verdict(self):
        err = self.oom_inside()
        path = os.path.join(self.dir, "oom-0.pickle")
        self.assertTrue(os.path.getsize(path) > 0)
        self.assertEqual(
            self.names(),
            ["_record_memory_history", "_cuda_attach_out_of_memory_observer", "_dump_snapshot",
             "_record_memory_history"],
        )
        start = torch._fake.calls[0][2]
        self.assertEqual(start, {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100_000})
        self.assertIn(f"oomdoc: out of memory on GPU 0 asking for 16.00 MiB: snapshot written to {path}", err)
        # The verdict of the real snapshot, and only its head: the detail sections are left to the full report.
        self.assertIn("Verdict", err)
        self.assertIn("Primary cause: leaked references", err)
        # The GPU's size, from its properties, sizes what was held outside PyTorch.
        self.assertIn("75.5 GiB free of 79.6 GiB; PyTorch reserved 2.99 GiB; 1.20 GiB outside PyTorch", err)
        self.assertIn("fix: Keep numbers, not tensors", err)
        self.assertNotIn("Largest live allocations", err)
        self.assertIn(f"the full report: oomdoc analyze {path}", err)

    def test_a_capped_process_has_its_cap_in_the_verdict(self):
        # set_per_process_memory_fraction: the device had 75.5 GiB free, the process could hold 3 GiB.
        fresh(fraction=3 * (1 << 30) / 85520809984)
        err = self.oom_inside()
        self.assertIn("asking for 16.0 MiB (a 3.00 GiB cap on this process; 75.5 GiB free of 79.6 GiB", err)

    def test_a_torch_that_cannot_tell_its_cap_gives_the_verdict_without_it(self):
        err = self.oom_inside()
        self.assertIn("Primary cause: leaked references", err)
        self.assertNotIn("cap on this process", err)

    def test_cuda_is_initialised_before_the_allocator_is_asked_anything(self):
        # Seen on a real H200 with torch 2.11: `oomdoc.record()` as a script's first line, before any tensor on the
        # GPU, asked whether history was on and the process died with a segfault.
        self.assertFalse(torch._fake.initialized)
        with environ(**NO_RANK):
            recorder = oomdoc.record(path=os.path.join(self.dir, "oom.pickle"), verdict=False)
        try:
            self.assertTrue(torch._fake.initialized)
            self.assertEqual(torch._fake.crashes, [])
        finally:
            recorder.stop()

    def test_the_snapshot_is_named_by_rank(self):
        cases = [
            ({"RANK": "3", "LOCAL_RANK": "1"}, None, "oom-3.pickle"),
            ({}, 5, "oom-5.pickle"),
            ({"LOCAL_RANK": "2"}, None, "oom-2.pickle"),
            ({}, None, "oom-0.pickle"),
        ]
        for env, dist_rank, name in cases:
            with self.subTest(env=env, dist_rank=dist_rank):
                fresh(dist_rank=dist_rank)
                d = tempfile.mkdtemp(dir=self.dir)
                with environ(**{**NO_RANK, **env}), contextlib.redirect_stderr(io.StringIO()):
                    with self.assertRaises(torch.cuda.OutOfMemoryError):
                        with oomdoc.record(os.path.join(d, "oom-{rank}.pickle"), verdict=False):
                            torch._fake.trigger_oom()
                # The rank's JSON report beside its snapshot (the map step of a job's analysis).
                self.assertEqual(sorted(os.listdir(d)), [name.replace(".pickle", ".json"), name])

    def test_device_pid_and_folders_in_the_path(self):
        err = io.StringIO()
        with environ(**NO_RANK), contextlib.redirect_stderr(err):
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                with oomdoc.record(os.path.join(self.dir, "{host}", "gpu{device}-{pid}.pickle"), verdict=False):
                    torch._fake.trigger_oom(device=3)
        self.assertTrue(os.path.exists(os.path.join(self.dir, socket.gethostname(), f"gpu3-{os.getpid()}.pickle")))

    def test_restores_the_previous_state_on_exit(self):
        path = os.path.join(self.dir, "oom-{rank}.pickle")
        with environ(**NO_RANK), contextlib.redirect_stderr(io.StringIO()):
            with oomdoc.record(path, verdict=False) as r:
                self.assertTrue(torch._fake.history)
                self.assertTrue(r.active)
            self.assertFalse(torch._fake.history)
            self.assertEqual(torch._fake.calls[-1], ("_record_memory_history", (), {
                "enabled": None, "context": "all", "stacks": "all", "max_entries": sys.maxsize}))
            # The observer stays attached (torch cannot detach one) but no longer dumps for a stopped recorder.
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                torch._fake.trigger_oom()
        self.assertEqual(os.listdir(self.dir), [])
        self.assertFalse(r.active)

    def test_a_recording_started_by_someone_else_is_left_on(self):
        fresh(history_on=True)
        with environ(**NO_RANK), contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                with oomdoc.record(os.path.join(self.dir, "oom.pickle"), verdict=False):
                    torch._fake.trigger_oom()
        self.assertNotIn("_record_memory_history", self.names())
        self.assertTrue(torch._fake.history)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "oom.pickle")))

    def test_a_plain_call_records_until_stop(self):
        with environ(**NO_RANK), contextlib.redirect_stderr(io.StringIO()):
            r = oomdoc.record(os.path.join(self.dir, "oom-{rank}.pickle"), max_entries=5000, stacks="all",
                              verdict=False)
            self.assertEqual(torch._fake.calls[0][2]["max_entries"], 5000)
            self.assertEqual(torch._fake.calls[0][2]["stacks"], "all")
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                torch._fake.trigger_oom()
            # Only the first OOM of a recording is dumped: the one that killed the step.
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                torch._fake.trigger_oom()
            self.assertEqual(self.names().count("_dump_snapshot"), 1)
            self.assertTrue(torch._fake.history)
            r.stop()
            self.assertFalse(torch._fake.history)
        self.assertEqual(r.snapshot, os.path.join(self.dir, "oom-0.pickle"))

    def test_without_cuda_it_warns_and_records_nothing(self):
        fresh(cuda_available=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self.assertRaises(torch.cuda.OutOfMemoryError):
                with oomdoc.record(os.path.join(self.dir, "oom.pickle")) as r:
                    torch._fake.trigger_oom()
        self.assertEqual([str(w.message) for w in caught],
                         ["oomdoc.record: CUDA is not available: nothing is recorded"])
        self.assertEqual(caught[0].filename, __file__)
        self.assertEqual(torch._fake.calls, [])
        self.assertFalse(r.active)
        self.assertEqual(os.listdir(self.dir), [])

    def test_without_torch_it_warns_and_records_nothing(self):
        saved = sys.modules["torch"]
        sys.modules["torch"] = None  # what an absent package looks like to `import torch`
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with oomdoc.record(os.path.join(self.dir, "oom.pickle")) as r:
                    pass
        finally:
            sys.modules["torch"] = saved
        self.assertEqual([str(w.message) for w in caught],
                         ["oomdoc.record: torch is not installed: nothing is recorded"])
        self.assertFalse(r.active)

    def test_torch_2_0_api(self):
        fresh(api="legacy")
        self.assertFalse(hasattr(torch, "OutOfMemoryError"))
        err = self.oom_inside()
        self.assertEqual(torch._fake.calls[0], ("_record_memory_history", (True,), {
            "record_context": True, "trace_alloc_max_entries": 100_000, "trace_alloc_record_context": True,
            "record_context_cpp": False}))
        self.assertEqual(self.names()[2], "_snapshot")
        self.assertEqual(torch._fake.calls[-1][1], (False,))
        path = os.path.join(self.dir, "oom-0.pickle")
        with open(path, "rb") as f:
            self.assertIn("segments", pickle.load(f))
        self.assertIn("Primary cause: leaked references", err)

    def test_without_an_oom_observer_the_exception_is_the_moment(self):
        fresh(observer=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            err = self.oom_inside(recorder_args={"path": os.path.join(self.dir, "oom.pickle"), "verdict": False})
        self.assertIn("no OOM observer", str(caught[0].message))
        self.assertIn("snapshot written to", err)
        self.assertEqual(self.names(), ["_record_memory_history", "_dump_snapshot", "_record_memory_history"])

    def test_a_preemptive_rejection_calls_no_observer_and_still_writes_the_snapshot_once(self):
        # per_process_memory_fraction + throw_on_cudamalloc_oom: the allocator raises without calling the observer.
        err = io.StringIO()
        path = os.path.join(self.dir, "oom-{rank}.pickle")
        with environ(**NO_RANK), contextlib.redirect_stderr(err):
            with self.assertRaises(torch.cuda.OutOfMemoryError) as raised:
                with oomdoc.record(path, verdict=False):
                    torch._fake.trigger_rejection()
        self.assertIn("preemptively rejected", str(raised.exception))
        self.assertEqual(self.names().count("_dump_snapshot"), 1)
        self.assertEqual(err.getvalue().count("snapshot written to"), 1)
        self.assertTrue(os.path.getsize(os.path.join(self.dir, "oom-0.pickle")) > 0)

    def test_on_an_intel_gpu_or_an_ascend_npu_the_same_calls_go_to_torch_xpu_or_torch_npu(self):
        # CUDA is unavailable and the only observer hook is the backend's (the stand-in logs each call by the one
        # name its functions have).
        for backend in ("xpu", "npu"):
            with self.subTest(backend=backend):
                fresh(backend=backend)
                self.assertFalse(hasattr(torch._C, "_cuda_attach_out_of_memory_observer"))
                d = tempfile.mkdtemp(dir=self.dir)
                err = self.oom_inside(recorder_args={"path": os.path.join(d, "oom-{rank}.pickle"), "verdict": False})
                self.assertIn("snapshot written to", err)
                self.assertEqual(len(torch._fake.observers), 1, "the backend's OOM observer is attached")
                self.assertEqual(
                    self.names(),
                    ["_record_memory_history", "_cuda_attach_out_of_memory_observer", "_dump_snapshot",
                     "_record_memory_history"],
                )
                self.assertTrue(os.path.getsize(os.path.join(d, "oom-0.pickle")) > 0)
        fresh()

    def test_the_verdict_can_be_turned_off(self):
        err = self.oom_inside(recorder_args={"path": os.path.join(self.dir, "a.pickle"), "verdict": False})
        self.assertIn("snapshot written to", err)
        self.assertNotIn("Verdict", err)
        fresh()
        with environ(OOMDOC_VERDICT="0"):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                with self.assertRaises(torch.cuda.OutOfMemoryError):
                    with oomdoc.record(os.path.join(self.dir, "b.pickle")):
                        torch._fake.trigger_oom()
        self.assertNotIn("Verdict", err.getvalue())

    def test_nested_recorders_dump_once_in_the_innermost(self):
        err = io.StringIO()
        with environ(**NO_RANK), contextlib.redirect_stderr(err):
            with oomdoc.record(os.path.join(self.dir, "outer.pickle"), verdict=False) as outer:
                with self.assertRaises(torch.cuda.OutOfMemoryError):
                    with oomdoc.record(os.path.join(self.dir, "inner.pickle"), verdict=False) as inner:
                        torch._fake.trigger_oom()
                self.assertTrue(torch._fake.history, "the outer recording goes on")
        self.assertEqual(sorted(os.listdir(self.dir)), ["inner.json", "inner.pickle"])
        self.assertEqual((inner.snapshot is not None, outer.snapshot), (True, None))
        self.assertEqual(err.getvalue().count("snapshot written to"), 1)
        # Only the outer one started recording, so only it stops it.
        self.assertEqual(self.names().count("_record_memory_history"), 2)
        self.assertFalse(torch._fake.history)

    def test_the_optimizer_step_is_labelled_and_the_label_put_back(self):
        fresh(metadata=True)
        opt = torch.optim.Optimizer()
        with environ(**NO_RANK), oomdoc.record(os.path.join(self.dir, "oom.pickle"), verdict=False):
            torch.cuda.memory._set_memory_metadata("step 3")
            opt.step()
            torch._fake.allocate("after")
        self.assertEqual(torch._fake.allocations, [("exp_avg", "optimizer"), ("after", "step 3")])
        # Once recording stops the hooks are gone: the step is not labelled.
        torch._fake.allocations.clear()
        torch.cuda.memory._set_memory_metadata("")
        opt.step()
        self.assertEqual(torch._fake.allocations, [("exp_avg", "")])

    def test_modules_are_labelled_with_their_names_when_asked(self):
        fresh(metadata=True)
        model = torch.nn.Module(layers=torch.nn.Module(**{"0": torch.nn.Module(mlp=torch.nn.Module())}))
        with environ(**NO_RANK), oomdoc.record(os.path.join(self.dir, "oom.pickle"), verdict=False,
                                               labels="modules"):
            model()
        self.assertEqual(
            torch._fake.allocations,
            [("activation", "Module"), ("activation", "layers"), ("activation", "layers.0"),
             ("activation", "layers.0.mlp")],
        )
        self.assertEqual(torch._fake.metadata, "")
        # By default only the optimizer's step is labelled: no hook on every module call.
        fresh(metadata=True)
        with environ(**NO_RANK), oomdoc.record(os.path.join(self.dir, "oom.pickle"), verdict=False):
            model()
        self.assertEqual({m for _, m in torch._fake.allocations}, {""})

    def test_labels_off_and_a_torch_without_metadata(self):
        for kwargs, labels in (({"metadata": True}, False), ({"metadata": False}, True)):
            fresh(**kwargs)
            with environ(**NO_RANK), oomdoc.record(os.path.join(self.dir, "oom.pickle"), verdict=False,
                                                   labels=labels):
                torch.optim.Optimizer().step()
            self.assertEqual(torch._fake.allocations, [("exp_avg", "")])
            self.assertNotIn("_set_memory_metadata", self.names())

    def test_other_exceptions_are_not_dumped(self):
        with environ(**NO_RANK), contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(KeyError):
                with oomdoc.record(os.path.join(self.dir, "oom.pickle")):
                    raise KeyError("x")
        self.assertEqual(os.listdir(self.dir), [])
        self.assertFalse(torch._fake.history)

    def test_bad_arguments_are_clear(self):
        with self.assertRaisesRegex(ValueError, "stacks: 'python' or 'all'"):
            oomdoc.record(stacks="cpp")
        with self.assertRaisesRegex(ValueError, "an interval like 200ms"):
            oomdoc.record(smi="often")
        with self.assertRaisesRegex(ValueError, r"path 'oom-\{step\}.pickle': only \{rank\}, \{local_rank\}"):
            oomdoc.record("oom-{step}.pickle")
        self.assertEqual(torch._fake.calls, [], "nothing started")

    def test_analyze_returns_the_report(self):
        report = json.loads(oomdoc.analyze(torch.DEFAULT_SNAPSHOT, format="json"))
        self.assertEqual(report["schema_version"], 1)
        self.assertEqual(report["findings"][0]["rule"], "leaked-references")


def python_env(**extra):
    env = dict(os.environ)
    for k in ("RANK", "LOCAL_RANK", "OOMDOC_VERDICT"):
        env.pop(k, None)
    parts = [FAKE_TORCH] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if env.get("OOMDOC_BIN"):
        env["OOMDOC_BIN"] = os.path.abspath(env["OOMDOC_BIN"])
    env.update(extra)
    return env


SCRIPT = """\
import json, sys
import torch
json.dump(sys.argv, open(sys.argv[1], "w"))
if __name__ == "__main__":
    torch._fake.trigger_oom(device=0, alloc=16 << 20)
"""


class RunCommand(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.script = os.path.join(self.dir, "train.py")
        with open(self.script, "w") as f:
            f.write(SCRIPT)

    def tearDown(self):
        self.tmp.cleanup()

    def run_oomdoc(self, *args, env=None):
        return subprocess.run([sys.executable, "-m", "oomdoc", *args], capture_output=True, text=True,
                              env=env or python_env(), cwd=self.dir, timeout=120)

    def test_runs_the_script_and_diagnoses_its_oom(self):
        out = os.path.join(self.dir, "out")
        argv_file = os.path.join(self.dir, "argv.json")
        p = self.run_oomdoc("run", "--out", out, "--", self.script, argv_file, "--lr", "3e-4")
        self.assertEqual(p.returncode, 1, p.stderr)
        with open(argv_file) as f:
            self.assertEqual(json.load(f), [self.script, argv_file, "--lr", "3e-4"])
        self.assertEqual(sorted(os.listdir(out)), ["oom-0.json", "oom-0.pickle"])
        self.assertIn("Primary cause: leaked references", p.stderr)
        # The script's own traceback still ends the run, after the verdict.
        self.assertIn("OutOfMemoryError: CUDA out of memory", p.stderr)
        self.assertLess(p.stderr.index("Verdict"), p.stderr.index("Traceback"))

    def test_torchrun_style_ranks_and_options_without_the_separator(self):
        out = os.path.join(self.dir, "out")
        p = self.run_oomdoc("run", "--out", out, "--no-verdict", self.script, os.path.join(self.dir, "a.json"),
                            env=python_env(RANK="6", LOCAL_RANK="2", WORLD_SIZE="8"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["oom-6.json", "oom-6.pickle"])
        self.assertNotIn("Verdict", p.stderr)

    def test_a_module_target(self):
        pkg = os.path.join(self.dir, "trainer")
        os.mkdir(pkg)
        for name, text in (("__init__.py", ""), ("__main__.py", SCRIPT)):
            with open(os.path.join(pkg, name), "w") as f:
                f.write(text)
        p = self.run_oomdoc("run", "--no-verdict", "--", "-m", "trainer", os.path.join(self.dir, "argv.json"))
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "oom-0.pickle")))

    def test_a_plain_call_writes_the_snapshot_of_a_rejection_leaving_the_program_and_keeps_the_traceback(self):
        # A plain `oomdoc.record()` (no `with`) and an OOM no observer saw: the snapshot is written from the
        # exception on its way out; the traceback, the exception type and the exit status are the job's own.
        script = os.path.join(self.dir, "plain.py")
        with open(script, "w") as f:
            f.write("import oomdoc, torch\noomdoc.record('oom-{rank}.pickle', verdict=False)\n"
                    "def step():\n    torch._fake.trigger_rejection()\nstep()\n")
        p = subprocess.run([sys.executable, script], capture_output=True, text=True, env=python_env(),
                           cwd=self.dir, timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertTrue(os.path.getsize(os.path.join(self.dir, "oom-0.pickle")) > 0)
        self.assertIn("snapshot written to", p.stderr)
        tb = p.stderr[p.stderr.index("Traceback (most recent call last)"):]
        self.assertIn('line 5, in <module>', tb)
        self.assertIn("in step", tb)
        self.assertTrue(tb.rstrip().splitlines()[-1].startswith("torch.OutOfMemoryError: CUDA out of memory. "
                                                               "Allocation was preemptively rejected"), tb)
        self.assertLess(p.stderr.index("snapshot written to"), p.stderr.index("Traceback"))

    def test_a_dump_killed_midway_leaves_no_file_under_the_final_name(self):
        p = self.run_oomdoc("run", "--no-verdict", "--", self.script, os.path.join(self.dir, "argv.json"),
                            env=python_env(FAKE_TORCH_DUMP_DIES="1"))
        self.assertEqual(p.returncode, 137, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "oom-0.pickle")))
        left = [n for n in os.listdir(self.dir) if n.startswith("oom-0.pickle")]
        self.assertEqual(len(left), 1, left)
        self.assertTrue(left[0].endswith(".tmp"), left)

    def test_a_binary_that_hangs_is_given_up_after_the_limit(self):
        hang = os.path.join(self.dir, "oomdoc-hangs")
        with open(hang, "w") as f:
            f.write("#!/bin/sh\nsleep 60\n")
        os.chmod(hang, 0o755)
        started = time.monotonic()
        p = self.run_oomdoc("run", "--", self.script, os.path.join(self.dir, "argv.json"),
                            env=python_env(OOMDOC_BIN=hang, OOMDOC_VERDICT_TIMEOUT="1"))
        took = time.monotonic() - started
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertLess(took, 30, "the job waited for the binary")
        self.assertIn("took longer than 1 s and was stopped", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "oom-0.pickle")))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "oom-0.json")))
        self.assertIn("OutOfMemoryError: CUDA out of memory", p.stderr)

    def test_the_ranks_json_reports_reduce_to_the_same_job_as_their_snapshots(self):
        out = os.path.join(self.dir, "out")
        snapshots = {"0": "leaked-references", "1": "attention-scores"}
        for rank, capture in snapshots.items():
            real = os.path.join(HERE, "..", "..", "fixtures", "real-gpu", capture, "snapshot.pickle")
            p = self.run_oomdoc("run", "--out", out, "--no-verdict", "--", self.script,
                                os.path.join(self.dir, "argv.json"),
                                env=python_env(RANK=rank, WORLD_SIZE="2", FAKE_TORCH_SNAPSHOT=os.path.abspath(real)))
            self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["oom-0.json", "oom-0.pickle", "oom-1.json", "oom-1.pickle"])
        exe = oomdoc.binary()
        self.assertIsNotNone(exe, "the oomdoc binary (OOMDOC_BIN or the installed one)")

        def job(*names):
            files = [os.path.join(out, n) for n in names]
            p = subprocess.run([exe, "analyze", *files, "--format", "json", "--no-progress"], capture_output=True,
                               text=True, timeout=120)
            self.assertIn(p.returncode, (0, 1), p.stderr)
            return json.loads(p.stdout)["job"]

        from_snapshots = job("oom-0.pickle", "oom-1.pickle")
        from_reports = job("oom-0.json", "oom-1.json")
        for j in (from_snapshots, from_reports):
            for rank in j.get("ranks", []):
                rank.pop("path", None)
        self.assertEqual(from_reports, from_snapshots)

    def test_a_script_that_finishes_keeps_its_exit_status_and_leaves_no_snapshot(self):
        with open(self.script, "w") as f:
            f.write("import sys\nsys.exit(3)\n")
        p = self.run_oomdoc("run", "--", self.script)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "oom-0.pickle")))

    def test_nvidia_smi_is_sampled_beside_the_snapshot(self):
        bin_dir = os.path.join(self.dir, "bin")
        os.mkdir(bin_dir)
        smi = os.path.join(bin_dir, "nvidia-smi")
        with open(smi, "w") as f:
            # What `nvidia-smi --query-gpu=… --format=csv -lms N` prints, from a real capture.
            f.write(textwrap.dedent("""\
                #!/bin/sh
                echo "timestamp, index, memory.used [MiB], memory.free [MiB], memory.total [MiB]"
                echo "2026/11/23 00:57:26.221, 0, 4 MiB, 81076 MiB, 81559 MiB"
                echo "2026/11/23 00:57:26.421, 0, 3021 MiB, 78059 MiB, 81559 MiB"
                exec sleep 30
                """))
        os.chmod(smi, os.stat(smi).st_mode | stat.S_IXUSR)
        env = python_env(PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        p = self.run_oomdoc("run", "--out", "out", "--smi", "100ms", "--", self.script, "argv.json", env=env)
        self.assertEqual(p.returncode, 1, p.stderr)
        csv = os.path.join("out", f"nvidia-smi.{socket.gethostname()}.csv")
        with open(os.path.join(self.dir, csv)) as f:
            self.assertIn("3021 MiB", f.read())
        self.assertIn(f"the full report: oomdoc analyze out/oom-0.pickle {csv}", p.stderr)

    def test_bad_usage_is_one_clear_error(self):
        p = self.run_oomdoc("run", "--out", "x")
        self.assertEqual(p.returncode, 2)
        self.assertIn("give the script to run after `--`", p.stderr)
        p = self.run_oomdoc("run", "--smi", "soon", "--", self.script)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--smi: an interval like 200ms", p.stderr)

    def test_other_commands_go_to_the_binary(self):
        p = self.run_oomdoc("--version")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"^oomdoc \d+\.\d+\.\d+")
        p = self.run_oomdoc("analyze", torch.DEFAULT_SNAPSHOT, "--top", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("Verdict", p.stdout)

    def test_importing_oomdoc_does_not_import_torch(self):
        p = subprocess.run([sys.executable, "-c", "import sys, oomdoc; assert 'torch' not in sys.modules, 'torch'; "
                            "print(oomdoc.__version__)"], capture_output=True, text=True, env=python_env())
        self.assertEqual(p.returncode, 0, p.stderr)


if __name__ == "__main__":
    unittest.main()
