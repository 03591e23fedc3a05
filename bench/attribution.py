#!/usr/bin/env python3
"""How well oomdoc names what holds memory when a snapshot's stacks are degraded the way torch loses them.

    python3 bench/attribution.py                       # every real snapshot, all variants, both halves
    python3 bench/attribution.py --half tune --check   # the tuning half; exit 1 if a counted case fails
    python3 bench/attribution.py FILE... --json out.json
    python3 bench/attribution.py --unknown-table [--oomdoc-before OLD_BINARY]

Inputs (default): every *.pickle under ../shared/real-artifacts/snapshots/, fixtures/real/*.pickle,
fixtures/real-gpu/*/snapshot.pickle, fixtures/real-gpu/*/*.pickle* and the framework corpus's
fixtures/real-gpu/frameworks/*/snapshot.pickle* (.gz and .xz are decompressed), relative to the repo root. Files with identical (decompressed) bytes are counted once, under the first name met. Each file is
loaded with an unpickler that refuses every global (a snapshot is plain data); files that fail to load, or are
not snapshots, are skipped with a note on stderr.

Variants, each written as torch would have written it (pickle protocol 4, frames lists shared as in the input):
  late@0.25, late@0.5, late@0.75   recording started late: each device trace loses its entries before
                  cut = int(F * len(trace)) (devices with < 20 entries are left as they are); allocations made
                  before the cut (or before the trace began) lose `frames` on their later free entries and, when
                  still live in `segments`, their block `frames` become []; segments created before the cut
                  (segment_alloc/segment_map before it) get `frames` []; external annotations before the cut go.
  python          stacks="python": only frames whose filename ends in .py or starts with '<' are kept; an empty
                  stack is [] on blocks/segments and a missing `frames` key on trace entries.
  late@0.5+python both.
  none            context=None (`_record_memory_history(context=None)`): the trace kept, every frame gone (trace
                  entries, blocks and segments `frames` []): what each block is must come from the trace's shape.
  state           state only (`_snapshot()` with no history): every trace [], every block/segment `frames` [].
A variant that would equal the input (e.g. late@F on a file without a trace) is not run. torch 1.13 files (a bare
segment list) get no variants.

Each variant and the input are analysed with `oomdoc analyze --format json --at end`. Per (file, variant,
device) whose input report has >= 256 MiB allocated, with full/deg = bytes per category of the input/variant:
  agreement = sum_{c != unknown} min(full[c], deg[c]) / sum_{c != unknown} full[c]
  wrong     = sum_{c != unknown} max(0, deg[c] - full[c]) / deg allocated
  unknown   = deg[unknown] / deg allocated
A case passes with agreement >= 90%, wrong <= 5%, unknown <= 10%. Cases whose input report names < 50% of its
allocated bytes are not scored ("reference too unnamed"). `none` and `state` rows are shown but never counted as
failures.

Halves: the distinct file names (basename, or parent/basename where basenames collide) are sorted; the tuning
half is the files at even positions (0, 2, 4, ...), the held-back half those at odd positions. The framework
corpus, captured after the attribution was written, is held back whole.

--unknown-table: for every input (no degradation) the share of allocated bytes in `unknown` at --at end, summed
over devices, for --oomdoc and optionally --oomdoc-before side by side (files with < 256 MiB allocated are
skipped), and the median over the files that were > 25% unknown with the before binary (or --oomdoc without it).

Python 3.9+, standard library only.
"""
import argparse
import concurrent.futures
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
MIN_ALLOCATED = 256 * MIB
MIN_TRACE = 20
PASS_AGREEMENT = 0.90
PASS_WRONG = 0.05
PASS_UNKNOWN = 0.10
MIN_NAMED = 0.50
LATE_FRACTIONS = (0.25, 0.5, 0.75)
ALL_VARIANTS = ["late@0.25", "late@0.5", "late@0.75", "python", "late@0.5+python", "none", "state"]
# Shown, never counted as failures: captures that keep no frame at all, where much is not known by principle.
REPORTED_ONLY = ("none", "state")
LIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The framework corpus (issue 38), captured after the attribution was written: all of it is held back.
FRAMEWORKS = os.path.join("fixtures", "real-gpu", "frameworks")


def note(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# inputs

class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing global {module}.{name}: a snapshot is plain data")


def read_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz") or data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    elif path.endswith(".xz") or data[:6] == b"\xfd7zXZ\x00":
        data = lzma.decompress(data)
    return data


def default_inputs():
    pats = [
        os.path.join(REPO, "..", "shared", "real-artifacts", "snapshots", "**", "*.pickle"),
        os.path.join(REPO, "fixtures", "real", "*.pickle"),
        os.path.join(REPO, "fixtures", "real-gpu", "*", "snapshot.pickle"),
        os.path.join(REPO, "fixtures", "real-gpu", "*", "*.pickle*"),
        os.path.join(REPO, FRAMEWORKS, "*", "snapshot.pickle*"),
    ]
    out = []
    for p in pats:
        out.extend(sorted(glob.glob(p, recursive=True)))
    return out


def collect_inputs(paths):
    """[(name, path, raw bytes)] deduplicated by content, first name kept; names unique."""
    seen_hash = set()
    seen_path = set()
    items = []
    for p in paths:
        rp = os.path.realpath(p)
        if rp in seen_path:
            continue
        seen_path.add(rp)
        if not os.path.isfile(p):
            note(f"skip {p}: not a file")
            continue
        try:
            data = read_bytes(p)
        except Exception as e:  # noqa: BLE001 - unreadable or a broken .gz: skip it
            note(f"skip {p}: cannot read ({e})")
            continue
        h = hashlib.sha256(data).hexdigest()
        if h in seen_hash:
            continue
        seen_hash.add(h)
        items.append([p, data])
    base_count = {}
    for p, _ in items:
        b = os.path.basename(p)
        base_count[b] = base_count.get(b, 0) + 1
    out = []
    for p, data in items:
        b = os.path.basename(p)
        name = b if base_count[b] == 1 else os.path.basename(os.path.dirname(p)) + "/" + b
        out.append((name, p, data))
    return out


def halves(inputs):
    """{name: 'tune' | 'held'}: alternate by sorted name; the framework corpus is all held back."""
    corpus = os.path.realpath(os.path.join(REPO, FRAMEWORKS)) + os.sep
    new = {n for n, p, _ in inputs if os.path.realpath(p).startswith(corpus)}
    order = sorted({n for n, _, _ in inputs} - new)
    which = {n: ("tune" if i % 2 == 0 else "held") for i, n in enumerate(order)}
    which.update({n: "held" for n in new})
    return which


def load(data):
    return DataOnly(io.BytesIO(data)).load()


def is_snapshot(obj):
    if isinstance(obj, list):
        return all(isinstance(s, dict) and "blocks" in s for s in obj)
    return isinstance(obj, dict) and isinstance(obj.get("segments"), list)


# ---------------------------------------------------------------------------------------------------------------
# degradation (never mutates the input: whatever changes is copied)

def block_addresses(seg):
    addr = seg.get("address", 0)
    for b in seg.get("blocks", []) or []:
        a = b.get("address", addr)
        yield a, b
        addr = a + b.get("size", 0)


def strip_block(b):
    nb = dict(b)
    if "frames" in nb:
        nb["frames"] = []
    nb.pop("forward_frames", None)
    nb.pop("history", None)   # 2.0: emitted only when non-empty
    return nb


def degrade_late(snap, frac):
    """Recording started at entry int(frac * len) of each device's trace. Returns (snapshot, changed)."""
    traces = snap.get("device_traces") or []
    new_traces = []
    # per device: addresses whose live block was allocated before the cut (or the trace), segment creation index
    dev_info = {}
    changed = False
    for d, trace in enumerate(traces):
        if not isinstance(trace, list) or len(trace) < MIN_TRACE:
            new_traces.append(trace)
            continue
        changed = True
        cut = int(frac * len(trace))
        open_alloc = {}
        last_alloc = {}
        seg_created = {}
        out = []
        for i, e in enumerate(trace):
            act = e.get("action")
            a = e.get("addr")
            if act == "alloc":
                open_alloc[a] = i
                last_alloc[a] = i
            elif act in ("free_requested", "free_completed"):
                ai = open_alloc.get(a)
                if act == "free_completed":
                    open_alloc.pop(a, None)
                if i >= cut and (ai is None or ai < cut) and ("frames" in e or "forward_frames" in e):
                    e = dict(e)
                    e.pop("frames", None)
                    e.pop("forward_frames", None)
            elif act in ("segment_alloc", "segment_map"):
                seg_created.setdefault(a, i)
            elif act in ("segment_free", "segment_unmap"):
                seg_created.pop(a, None)
            if i >= cut:
                out.append(e)
        t0 = trace[cut].get("time_us") if cut < len(trace) else None
        dev_info[d] = (cut, last_alloc, seg_created, t0)
        new_traces.append(out)
    if not changed:
        return snap, False
    new_segs = []
    for seg in snap.get("segments", []):
        info = dev_info.get(seg.get("device"))
        if info is None:
            new_segs.append(seg)
            continue
        cut, last_alloc, seg_created, _ = info
        nseg = dict(seg)
        sa = seg.get("address")
        if sa in seg_created and seg_created[sa] < cut:
            if "frames" in nseg:
                nseg["frames"] = []
            nseg.pop("forward_frames", None)
        blocks = []
        for a, b in block_addresses(seg):
            if b.get("state") in LIVE_STATES and last_alloc.get(a, -1) < cut:
                b = strip_block(b)
            blocks.append(b)
        if "blocks" in seg:
            nseg["blocks"] = blocks
        new_segs.append(nseg)
    out = dict(snap)
    out["segments"] = new_segs
    out["device_traces"] = new_traces
    ann = snap.get("external_annotations")
    if isinstance(ann, list) and ann:
        keep = []
        for x in ann:
            info = dev_info.get(x.get("device")) if isinstance(x, dict) else None
            if info is not None and info[3] is not None and isinstance(x.get("time_us"), int) \
                    and x["time_us"] < info[3]:
                continue
            keep.append(x)
        out["external_annotations"] = keep
    return out, True


def is_python_frame(fr):
    fn = fr.get("filename") if isinstance(fr, dict) else None
    return isinstance(fn, str) and (fn.endswith(".py") or fn.startswith("<"))


def degrade_python(snap):
    """stacks="python": keep Python frames only. Identical input lists stay one output list."""
    memo = {}
    state = {"changed": False}

    def filt(lst):
        r = memo.get(id(lst))
        if r is None:
            r = [f for f in lst if is_python_frame(f)]
            if len(r) != len(lst):
                state["changed"] = True
            memo[id(lst)] = r
        return r

    def fix_holder(x, drop_empty):
        fr = x.get("frames")
        hist = x.get("history")
        if not isinstance(fr, list) and not isinstance(hist, list):
            return x
        y = dict(x)
        if isinstance(fr, list):
            nf = filt(fr)
            if not nf and drop_empty:
                del y["frames"]
            else:
                y["frames"] = nf
        if isinstance(hist, list):
            y["history"] = [fix_holder(h, True) if isinstance(h, dict) else h for h in hist]
        return y

    def fix_segments(segs):
        out = []
        for seg in segs:
            if not isinstance(seg, dict):
                out.append(seg)
                continue
            nseg = fix_holder(seg, False)
            if nseg is seg:
                nseg = dict(seg)
            nseg["blocks"] = [fix_holder(b, False) for b in seg.get("blocks", []) or []]
            out.append(nseg)
        return out

    out = dict(snap)
    out["segments"] = fix_segments(snap.get("segments", []))
    out["device_traces"] = [[fix_holder(e, True) for e in t] if isinstance(t, list) else t
                            for t in snap.get("device_traces") or []]
    if isinstance(snap.get("host_segments"), list):
        out["host_segments"] = fix_segments(snap["host_segments"])
    if isinstance(snap.get("host_traces"), list):
        out["host_traces"] = [fix_holder(e, True) for e in snap["host_traces"]]
    return out, state["changed"]


def degrade_state(snap):
    changed = any(t for t in snap.get("device_traces") or [])

    def fix_segments(segs):
        nonlocal changed
        out = []
        for seg in segs:
            if seg.get("frames") or any(b.get("frames") or b.get("history") for b in seg.get("blocks", []) or []):
                changed = True
            nseg = dict(seg)
            if "frames" in nseg:
                nseg["frames"] = []
            nseg.pop("forward_frames", None)
            nseg["blocks"] = [strip_block(b) for b in seg.get("blocks", []) or []]
            out.append(nseg)
        return out

    out = dict(snap)
    out["segments"] = fix_segments(snap.get("segments", []))
    out["device_traces"] = [[] for _ in snap.get("device_traces") or []]
    if "external_annotations" in out:
        out["external_annotations"] = []
    if isinstance(snap.get("host_segments"), list):
        out["host_segments"] = fix_segments(snap["host_segments"])
    if "host_traces" in out:
        out["host_traces"] = []
    return out, changed


def degrade_none(snap):
    """context=None: the trace kept, every frame removed."""
    out, changed = degrade_state(snap)
    traces = snap.get("device_traces") or []
    out["device_traces"] = [[dict(e, frames=[]) if "frames" in e else e for e in t] if isinstance(t, list) else t
                            for t in traces]
    if "external_annotations" in snap:
        out["external_annotations"] = snap["external_annotations"]
    changed = changed or any(e.get("frames") for t in traces if isinstance(t, list) for e in t)
    return out, changed and any(t for t in traces)


def make_variant(snap, variant):
    if variant.startswith("late@"):
        spec = variant[len("late@"):]
        py = spec.endswith("+python")
        frac = float(spec.split("+")[0])
        out, changed = degrade_late(snap, frac)
        if not changed:
            return None
        if py:
            out, _ = degrade_python(out)
        return out
    if variant == "python":
        out, changed = degrade_python(snap)
        return out if changed else None
    if variant == "none":
        out, changed = degrade_none(snap)
        return out if changed else None
    if variant == "state":
        out, changed = degrade_state(snap)
        return out if changed else None
    raise ValueError(variant)


# ---------------------------------------------------------------------------------------------------------------
# running oomdoc

# The moment compared (--at): the end of the capture by default; `peak` or `auto` (the OOM, else the peak) check
# the answer where the verdict is given, scored only where the degraded file's moment holds the same bytes.
AT = "end"


def run_oomdoc(binary, path, timeout):
    """{'devices': {dev: {'allocated': int, 'cats': {cat: bytes}, 'source': str}}} or {'error': str}."""
    cmd = [binary, "analyze", "--format", "json", "--at", AT, "--no-progress", path]
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout}s", "secs": timeout}
    except OSError as e:
        return {"error": f"cannot run {binary}: {e}", "secs": 0}
    secs = time.monotonic() - t
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        return {"error": f"exit {p.returncode}: {err[-1] if err else 'no JSON'}", "secs": secs}
    devs = {}
    for d in doc.get("devices", []) or []:
        if d.get("source", "snapshot") != "snapshot":
            continue
        cats = {}
        for c in d.get("by_category", []) or []:
            cats[c.get("category")] = cats.get(c.get("category"), 0) + int(c.get("bytes", 0))
        devs[d.get("device")] = {"allocated": int(d.get("allocated_bytes", 0) or 0), "cats": cats,
                                 "source": d.get("source")}
    return {"devices": devs, "secs": secs}


def named(cats):
    return sum(v for k, v in cats.items() if k != "unknown")


def score(full, deg):
    """(agreement or None, wrong, unknown, named share of the reference)."""
    fa = full["allocated"]
    fnamed = named(full["cats"])
    share = fnamed / fa if fa else 0.0
    da = deg["allocated"]
    wrong = sum(max(0, v - full["cats"].get(k, 0)) for k, v in deg["cats"].items() if k != "unknown")
    wrong = wrong / da if da else 0.0
    unknown = deg["cats"].get("unknown", 0) / da if da else 0.0
    if share < MIN_NAMED or fnamed == 0:
        return None, wrong, unknown, share
    if abs(da - fa) > 0.01 * fa:
        # Another moment (the full trace's peak fell before the degraded trace begins): nothing to compare.
        return None, wrong, unknown, share
    agree = sum(min(v, deg["cats"].get(k, 0)) for k, v in full["cats"].items() if k != "unknown") / fnamed
    return agree, wrong, unknown, share


def gib(b):
    return f"{b / (1 << 30):.2f} GiB"


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------------------------
# modes

def attribution(args, inputs):
    which = halves(inputs)
    variants = args.variants
    tmp_ctx = None
    if args.keep_dir:
        os.makedirs(args.keep_dir, exist_ok=True)
        tmp = args.keep_dir
    else:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="oomdoc-attr-")
        tmp = tmp_ctx.name
    t_start = time.monotonic()
    jobs = {}   # (name, variant) -> future
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)

    def submit(name, variant, path, remove):
        def work():
            r = run_oomdoc(args.oomdoc, path, args.timeout)
            if remove:
                try:
                    os.remove(path)
                except OSError:
                    pass
            return r
        jobs[(name, variant)] = pool.submit(work)

    skipped_variants = []
    used = []
    for idx, (name, path, data) in enumerate(inputs):
        if args.half != "all" and which[name] != args.half:
            continue
        try:
            snap = load(data)
        except Exception as e:   # noqa: BLE001 - any unpickling failure means: not a snapshot we can use
            note(f"skip {name}: does not load ({type(e).__name__}: {e})")
            continue
        if not is_snapshot(snap):
            note(f"skip {name}: not a snapshot")
            continue
        used.append(name)
        submit(name, "full", path, False)
        if isinstance(snap, list):
            note(f"{name}: torch 1.13 segment list, no variants")
            continue
        for v in variants:
            deg = make_variant(snap, v)
            if deg is None:
                skipped_variants.append((name, v))
                continue
            out = os.path.join(tmp, f"{idx:03d}-{name.replace('/', '_')}.{v.replace('+', '_')}.pickle")
            with open(out, "wb") as f:
                pickle.dump(deg, f, protocol=4)
            del deg
            submit(name, v, out, not args.keep_dir)
        del snap
    pool.shutdown(wait=True)
    results = {k: f.result() for k, f in jobs.items()}
    if tmp_ctx is not None:
        tmp_ctx.cleanup()
    elapsed = time.monotonic() - t_start

    rows = []
    unnamed = []
    errors = []
    for name in sorted(used):
        full = results.get((name, "full"))
        if full is None or "error" in full:
            errors.append(f"{name} (full): {full['error'] if full else 'not run'}")
            continue
        for v in variants:
            deg = results.get((name, v))
            if deg is None:
                continue
            for dev, fd in sorted(full["devices"].items(), key=lambda kv: str(kv[0])):
                if fd["allocated"] < MIN_ALLOCATED:
                    continue
                row = {"file": name, "half": which[name], "variant": v, "device": dev,
                       "allocated": fd["allocated"], "counted": v not in REPORTED_ONLY}
                if "error" in deg or dev not in deg["devices"]:
                    row.update(agreement=None, wrong=None, unknown=None, ok=False,
                               error=deg.get("error", f"device {dev} missing"))
                    errors.append(f"{name} {v} dev {dev}: {row['error']}")
                    rows.append(row)
                    continue
                agree, wrong, unknown, share = score(fd, deg["devices"][dev])
                row.update(agreement=agree, wrong=wrong, unknown=unknown, reference_named=share,
                           deg_allocated=deg["devices"][dev]["allocated"], full_categories=fd["cats"],
                           degraded_categories=deg["devices"][dev]["cats"])
                if agree is None:
                    row["ok"] = None
                    if (name, dev) not in [(u[0], u[1]) for u in unnamed]:
                        unnamed.append((name, dev, share))
                else:
                    row["ok"] = agree >= PASS_AGREEMENT and wrong <= PASS_WRONG and unknown <= PASS_UNKNOWN
                rows.append(row)

    print(f"# attribution under degraded stacks ({args.half} half, {len(used)} files, {elapsed:.1f} s)\n")
    print("| file | half | variant | dev | allocated | agreement | wrong | unknown | result |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if r["ok"] is None:
            res = "n/a (reference too unnamed, or another moment)"
        elif "error" in r:
            res = "error" if r["counted"] else "error (not counted)"
        elif r["counted"]:
            res = "pass" if r["ok"] else "FAIL"
        else:
            res = "(pass)" if r["ok"] else "(fail, not counted)"
        print(f"| {r['file']} | {r['half']} | {r['variant']} | {r['device']} | {gib(r['allocated'])} | "
              f"{pct(r['agreement'])} | {pct(r['wrong'])} | {pct(r['unknown'])} | {res} |")
    print()
    if unnamed:
        print("reference too unnamed (full report names < 50% of allocated; not scored): " +
              ", ".join(f"{n} dev {d} ({100 * s:.0f}% named)" for n, d, s in unnamed))
    if errors:
        print("errors: " + "; ".join(errors))
    if skipped_variants:
        print(f"variants equal to their input, not run: {len(skipped_variants)}")
    print()
    summary = {}
    for v in variants:
        vr = [r for r in rows if r["variant"] == v and r["ok"] is not None]
        passed = sum(1 for r in vr if r["ok"])
        s = {"cases": len(vr), "passed": passed, "median_agreement": med(r["agreement"] for r in vr),
             "median_unknown": med(r["unknown"] for r in vr), "median_wrong": med(r["wrong"] for r in vr),
             # A wrong name misleads where an unknown only says less: counted apart from the pass.
             "over_wrong": sum(1 for r in vr if r["wrong"] is not None and r["wrong"] > PASS_WRONG)}
        summary[v] = s
        tag = " (not counted)" if v in REPORTED_ONLY else ""
        print(f"{v}{tag}: {s['cases']} cases, {passed} passed, median agreement {pct(s['median_agreement'])}, "
              f"median unknown {pct(s['median_unknown'])}, median wrong {pct(s['median_wrong'])}, "
              f"over {pct(PASS_WRONG)} wrong {s['over_wrong']}")
    counted = [r for r in rows if r["counted"] and r["ok"] is not None]
    n_pass = sum(1 for r in counted if r["ok"])
    n_fail = len(counted) - n_pass
    print(f"attribution: {n_pass} passed, {n_fail} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"half": args.half, "oomdoc": args.oomdoc, "seconds": elapsed, "files": used,
                       "rows": rows, "summary": summary, "reference_too_unnamed":
                           [{"file": n, "device": d, "named": s} for n, d, s in unnamed],
                       "errors": errors, "passed": n_pass, "failed": n_fail,
                       "run_seconds": {f"{k[0]} {k[1]}": r.get("secs") for k, r in results.items()}},
                      f, indent=1, default=str)
    return 1 if (args.check and n_fail) else 0


def unknown_table(args, inputs):
    which = halves(inputs)
    binaries = [("oomdoc", args.oomdoc)]
    if args.oomdoc_before:
        binaries.insert(0, ("before", args.oomdoc_before))
    t_start = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    todo = [(name, path) for name, path, _ in inputs if args.half == "all" or which[name] == args.half]
    futs = {(name, tag): pool.submit(run_oomdoc, b, path, args.timeout)
            for name, path in todo for tag, b in binaries}
    pool.shutdown(wait=True)
    elapsed = time.monotonic() - t_start
    rows = []
    for name, _ in todo:
        row = {"file": name}
        for tag, _b in binaries:
            r = futs[(name, tag)].result()
            if "error" in r:
                note(f"skip {name} ({tag}): {r['error']}")
                row = None
                break
            alloc = sum(d["allocated"] for d in r["devices"].values())
            unk = sum(d["cats"].get("unknown", 0) for d in r["devices"].values())
            row["allocated"] = alloc
            row[tag] = unk / alloc if alloc else None
        if row is None or row.get("allocated", 0) < MIN_ALLOCATED:
            continue
        rows.append(row)
    tags = [t for t, _ in binaries]
    print(f"# unknown share at --at end ({len(rows)} files >= 256 MiB, {elapsed:.1f} s)\n")
    print("| file | allocated | " + " | ".join(f"unknown ({t})" for t in tags) + " |")
    print("|---|---:|" + "---:|" * len(tags))
    for r in rows:
        print(f"| {r['file']} | {gib(r['allocated'])} | " + " | ".join(pct(r[t]) for t in tags) + " |")
    print()
    ref = tags[0]
    sel = [r for r in rows if r[ref] is not None and r[ref] > 0.25]
    parts = [f"{t} {pct(med(r[t] for r in sel))}" for t in tags]
    print(f"median unknown over the {len(sel)} files > 25% unknown with {ref}: " + ", ".join(parts))
    print("median unknown over all files: " + ", ".join(f"{t} {pct(med(r[t] for r in rows))}" for t in tags))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "selected": [r["file"] for r in sel],
                       "median_selected": {t: med(r[t] for r in sel) for t in tags}}, f, indent=1)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Halves: distinct file names sorted; tune = even positions (0, 2, ...), "
                                        "held = odd positions. See the module docstring for the variants.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="snapshot files (default: the real snapshots of shared/ and fixtures/)")
    ap.add_argument("--oomdoc", default=os.path.join(REPO, "target", "release", "oomdoc"), help="binary to test")
    ap.add_argument("--oomdoc-before", help="--unknown-table: a second binary shown beside --oomdoc")
    ap.add_argument("--half", choices=["tune", "held", "all"], default="all",
                    help="tune: files at even positions of the sorted names; held: odd positions (default all)")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS),
                    help=f"comma-separated subset of {','.join(ALL_VARIANTS)}")
    ap.add_argument("--unknown-table", action="store_true", help="the unknown share per input file, no degradation")
    ap.add_argument("--check", action="store_true", help="exit 1 when any counted case fails")
    ap.add_argument("--json", metavar="FILE", help="write all the numbers as JSON")
    ap.add_argument("--keep-dir", metavar="DIR", help="write the degraded files here and keep them")
    ap.add_argument("--jobs", type=int, default=2, help="oomdoc runs at once (default 2)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per oomdoc run (default 600)")
    ap.add_argument("--at", default="end", choices=["end", "peak", "auto"],
                    help="the moment compared (default end); cases whose moments differ are not scored")
    args = ap.parse_args(argv)
    global AT
    AT = args.at
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in args.variants:
        if v not in ALL_VARIANTS and not (v.startswith("late@") and v.split("@")[1].split("+")[0]
                                          .replace(".", "", 1).isdigit()):
            ap.error(f"unknown variant {v}")
    for b in [args.oomdoc] + ([args.oomdoc_before] if args.oomdoc_before else []):
        if not os.access(b, os.X_OK):
            ap.error(f"no oomdoc binary at {b} (cargo build --release, or --oomdoc PATH)")
    inputs = collect_inputs(args.files or default_inputs())
    if not inputs:
        ap.error("no input files")
    if args.unknown_table:
        return unknown_table(args, inputs)
    return attribution(args, inputs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
