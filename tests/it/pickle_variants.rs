//! The same snapshot written four ways — frames shared through the memo (as torch writes them) or fresh objects
//! per trace entry (the span cache's case), pickle protocols 2, 4 and 5 — must give identical reports.

use crate::common;

use serde_json::Value;

const GEN: &str = r#"
import pickle, random, sys
files = [f"/app/m{i}.py" for i in range(12)]
def frame(i):
    return {"filename": files[i % 12], "name": f"fn_{i}", "line": 10 + i * 7}
stacks = [[(s * 7 + k) % 40 for k in range(5 + s % 9)] for s in range(60)]
def build(shared):
    rng = random.Random(7)
    fr = [frame(i) for i in range(40)]
    st = [[fr[i] for i in s] for s in stacks]
    def frames(s):
        return st[s] if shared else [frame(i) for i in stacks[s]]
    trace, live, addr, t = [], [], 0x7f0000000000, 1_700_000_000_000_000
    trace.append({"action": "segment_alloc", "addr": addr, "size": 1 << 30, "stream": 0, "time_us": t, "frames": frames(0)})
    top, blocks = addr, []
    for n in range(3000):
        t += rng.randint(1, 50)
        if live and rng.random() < 0.45:
            a, size, s = live.pop(rng.randrange(len(live)))
            for act in ("free_requested", "free_completed"):
                trace.append({"action": act, "addr": a, "size": size, "stream": 0, "time_us": t, "frames": frames(s)})
        else:
            size, s = 512 * rng.randint(1, 64), rng.randrange(60)
            live.append((top, size, s))
            trace.append({"action": "alloc", "addr": top, "size": size, "stream": 0, "time_us": t, "frames": frames(s)})
            top += size
    # final state: the live blocks in address order, free gaps between them, the tail free
    live.sort()
    pos, out = addr, []
    for a, size, s in live:
        if a > pos:
            out.append({"address": pos, "size": a - pos, "requested_size": 0, "state": "inactive", "frames": []})
        out.append({"address": a, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames(s)})
        pos = a + size
    out.append({"address": pos, "size": addr + (1 << 30) - pos, "requested_size": 0, "state": "inactive", "frames": []})
    alloc = sum(b["size"] for b in out if b["state"] == "active_allocated")
    seg = {"device": 0, "address": addr, "total_size": 1 << 30, "allocated_size": alloc, "active_size": alloc,
           "requested_size": alloc, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": frames(0), "blocks": out}
    return {"segments": [seg], "device_traces": [trace]}
for shared, proto, path in [(True, 4, sys.argv[1]), (False, 4, sys.argv[2]), (False, 2, sys.argv[3]), (False, 5, sys.argv[4])]:
    with open(path, "wb") as f:
        pickle.dump(build(shared), f, protocol=proto)
"#;

fn report(path: &str) -> Value {
    // At the end: the file's own segments (this toy trace does not follow the allocator's placement rules, so
    // only the end state is meaningful), with stacks from every kind of frame list.
    let o = common::oomdoc(&["analyze", path, "--format", "json", "--top", "50", "--at", "end"]);
    assert!(o.status.success(), "{path}: {}", common::stderr(&o));
    let mut v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["inputs"] = Value::Null;
    v
}

#[test]
fn shared_and_unshared_frames_and_every_protocol_give_the_same_report() {
    let dir = std::env::temp_dir().join(format!("oomdoc-variants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let names = ["shared-p4", "fresh-p4", "fresh-p2", "fresh-p5"];
    let paths: Vec<String> = names.iter().map(|n| dir.join(format!("{n}.pickle")).display().to_string()).collect();
    let ok = std::process::Command::new("python3").arg("-c").arg(GEN).args(&paths).status();
    match ok {
        Ok(s) if s.success() => {}
        other => panic!("python3 could not write the variants: {other:?}"),
    }
    let base = report(&paths[0]);
    assert_eq!(base["devices"][0]["top_allocations"].as_array().unwrap().len(), 50);
    assert!(base["devices"][0]["by_stack"].as_array().unwrap().len() >= 10);
    for (name, p) in names.iter().zip(&paths).skip(1) {
        assert_eq!(report(p), base, "{name} differs from the shared-frames file");
    }
    std::fs::remove_dir_all(&dir).ok();
}
