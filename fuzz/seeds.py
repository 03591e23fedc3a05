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

out = sys.argv[1]
for name, obj in shapes.items():
    for proto in (2, 4, 5):
        with open(f"{out}/{name}-p{proto}.pickle", "wb") as f:
            pickle.dump(obj, f, protocol=proto)
