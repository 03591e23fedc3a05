"""Small snapshot-shaped pickles for the fuzz corpora: every shape the reader knows, a few entries each, so
libFuzzer's mutations start from valid structure instead of from the first bytes of a multi-MB file.

    python3 fuzz/seeds.py DIR
"""
import pickle
import sys

frames = [{"filename": "train.py", "line": 10 + i, "name": f"f{i}"} for i in range(3)]
cpp = [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}] + frames


def block(addr, size, state="active_allocated", hist=False):
    b = {"address": addr, "size": size, "requested_size": size - 8, "state": state, "frames": frames}
    if hist:
        b = {"size": size, "state": state, "history": [{"addr": addr, "real_size": size, "frames": frames}]}
    return b


def segment(addr, dev=0, expandable=False, hist=False):
    blocks = [block(addr, 1 << 20, hist=hist), block(addr + (1 << 20), 1 << 20, "inactive", hist=hist)]
    return {"device": dev, "address": addr, "total_size": 2 << 20, "allocated_size": 1 << 20,
            "active_size": 1 << 20, "requested_size": (1 << 20) - 8, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": frames, "blocks": blocks}


def trace(base, n, times=True, oom=True, compile_ctx=False):
    t = [{"action": "segment_alloc", "addr": base, "size": 2 << 20, "stream": 0, "frames": frames}]
    for i in range(n):
        a = base + (i % 2) * (1 << 20)
        e = {"action": "alloc", "addr": a, "size": 1 << 20, "stream": 0, "frames": list(cpp if i % 3 else frames)}
        if times:
            e["time_us"] = 1_700_000_000_000_000 + i * 100
        if compile_ctx:
            e["compile_context"] = "N/A" if i % 2 else "[0/0]"
            e["user_metadata"] = ""
        t.append(e)
        if i % 2:
            for act in ("free_requested", "free_completed"):
                f = dict(e, action=act)
                t.append(f)
    if oom:
        t.append({"action": "oom", "addr": 0, "size": 8 << 20, "stream": 0, "device_free": 1 << 20, "frames": frames})
    t.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []})
    return t


settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": False, "pinned_num_register_threads": 1,
            "release_lock_on_malloc": False, "pinned_use_host_register": False, "roundup_power2_divisions": {}}

shapes = {
    "v1.13-segments": [segment(1 << 30)],
    "v2.0-history": {"segments": [segment(1 << 30, hist=True)], "device_traces": [trace(1 << 30, 4, times=False)]},
    "v2.1": {"segments": [segment(1 << 30)], "device_traces": [trace(1 << 30, 6, times=False)]},
    "v2.3-settings": {"segments": [segment(1 << 30, expandable=True)], "device_traces": [trace(1 << 30, 6)],
                      "allocator_settings": settings},
    "v2.10-two-devices": {"segments": [segment(1 << 30), segment(1 << 31, dev=1)],
                          "device_traces": [trace(1 << 30, 8, compile_ctx=True), trace(1 << 31, 3)],
                          "allocator_settings": settings, "external_annotations": []},
    "state-only": {"segments": [segment(1 << 30)], "device_traces": [[]]},
}



def archives(out):
    """Attachments as users send them: each snapshot shape compressed, and small job archives (a snapshot, an OOM
    log line, an nvidia-smi CSV, a README) as tar, tar.gz, tar.xz, tar.bz2 and zip."""
    import bz2, gzip, io, lzma, tarfile, zipfile
    snap = pickle.dumps(shapes["v2.3-settings"], protocol=4)
    log = (b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
           b"of 79.19 GiB of which 6.56 MiB is free. Of the allocated memory 77.80 GiB is allocated by PyTorch, "
           b"and 100.00 MiB is reserved by PyTorch but unallocated.\n")
    smi = (b"timestamp, name, memory.total [MiB], memory.used [MiB]\n"
           b"2024/01/01 10:00:00.000, NVIDIA H100 80GB HBM3, 81559 MiB, 81000 MiB\n")
    members = {"job/rank0.pickle": snap, "job/train.log": log, "job/nvidia-smi.csv": smi, "job/README.md": b"# run\n"}
    for name, obj in shapes.items():
        raw = pickle.dumps(obj, protocol=4)
        open(f"{out}/{name}.pickle.gz", "wb").write(gzip.compress(raw))
        open(f"{out}/{name}.pickle.xz", "wb").write(lzma.compress(raw))
        open(f"{out}/{name}.pickle.bz2", "wb").write(bz2.compress(raw))
    for mode, ext in (("w", "tar"), ("w:gz", "tar.gz"), ("w:xz", "tar.xz"), ("w:bz2", "tar.bz2")):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode=mode) as t:
            for n, b in members.items():
                info = tarfile.TarInfo(n)
                info.size = len(b)
                t.addfile(info, io.BytesIO(b))
        open(f"{out}/job.{ext}", "wb").write(buf.getvalue())
    for method, ext in ((zipfile.ZIP_STORED, "stored"), (zipfile.ZIP_DEFLATED, "deflated"), (zipfile.ZIP_BZIP2, "bz2")):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", method) as z:
            for n, b in members.items():
                z.writestr(n, b)
        open(f"{out}/job-{ext}.zip", "wb").write(buf.getvalue())


if sys.argv[1] == "--archives":
    archives(sys.argv[2])
else:
    out = sys.argv[1]
    for name, obj in shapes.items():
        for proto in (2, 4, 5):
            with open(f"{out}/{name}-p{proto}.pickle", "wb") as f:
                pickle.dump(obj, f, protocol=proto)
