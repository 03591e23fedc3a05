//! Where a workload repeats itself: the stretches in which one window of requests and frees (a training step, an
//! evaluation batch) comes again and again, equal in every request's size, stream, pool and stack and in how far
//! back each free's request lies. A simulation that finds the allocator in the same state at the start of two such
//! windows knows the rest of the stretch ends in that state too (the allocator is deterministic), and skips it.
//! Each free in a repeated window frees a request of the same window or the one before it, so the blocks that skip
//! leaves live are known: those of the last window, placed where the simulated window's were.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

use super::workload::Op;

/// Windows `[start + k·period, start + (k+1)·period)`, for k = 0..=`windows`, all alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repeat {
    pub start: u32,
    pub period: u32,
    pub windows: u32,
}

impl Repeat {
    /// The op at which the last window ends.
    pub fn end(&self) -> u32 {
        self.start + (self.windows + 1) * self.period
    }
}

/// Two windows starting alike are looked for only at a sample of positions (anchors): those chosen by content (one
/// in `ANCHOR_EVERY`), which a repeated window shares with its repeat, and every `ANCHOR_EVERY`-th position, which
/// meets a short window (few distinct ops, perhaps none chosen by content) at the same phase within a few periods.
const ANCHOR_EVERY: u64 = 32;
/// How many ops an anchor's content hash covers.
const ANCHOR_SPAN: usize = 16;

fn hash_of(v: impl Hash) -> u64 {
    let mut h = FxHasher::default();
    v.hash(&mut h);
    h.finish()
}

/// The stretches of `ops` that repeat, in order and not overlapping. `first_id` is the first request's id (lower
/// ids are blocks live at the start).
pub fn find(ops: &[Op], first_id: u32) -> Vec<Repeat> {
    let n = ops.len();
    // Each op's content; a free's is how many ops back its request was, and what cannot repeat (a free of a
    // block from the start, a release, the failed request) is unique.
    let mut request_at: Vec<u32> = vec![u32::MAX; n];
    let mut content: Vec<u64> = Vec::with_capacity(n);
    // The anchors, each with the bytes the program holds there (the caller's sizes): a repeat of a window starts at
    // the same point of the program's memory, which the layers of one pass, alike in their requests, do not.
    let mut anchors: Vec<(u32, u64)> = Vec::with_capacity(n / ANCHOR_EVERY as usize * 2 + 1);
    let mut held = 0u64;
    let request = |id: u32, request_at: &[u32]| -> Option<u32> {
        let k = id.checked_sub(first_id)? as usize;
        request_at.get(k).copied().filter(|&at| at != u32::MAX)
    };
    for (i, op) in ops.iter().enumerate() {
        let c = match *op {
            Op::Alloc { id, size, stream, pool, stack, .. } => {
                if let Some(slot) = id.checked_sub(first_id).and_then(|k| request_at.get_mut(k as usize)) {
                    *slot = i as u32;
                }
                hash_of((0u8, size, stream, pool, stack))
            }
            Op::Free { id, .. } => match request(id, &request_at) {
                Some(at) => hash_of((1u8, i as u32 - at)),
                None => hash_of((2u8, i)),
            },
            _ => hash_of((3u8, i)),
        };
        if c.is_multiple_of(ANCHOR_EVERY) || (i as u64).is_multiple_of(ANCHOR_EVERY) {
            anchors.push((i as u32, held));
        }
        match *op {
            Op::Alloc { size, .. } => held += size,
            Op::Free { id, .. } => {
                if let Some(Op::Alloc { size, .. }) = request(id, &request_at).map(|at| ops[at as usize]) {
                    held -= size;
                }
            }
            _ => {}
        }
        content.push(c);
    }
    // How far back the request a free at `x` frees, where it is one of the workload's own.
    let back = |x: usize| -> Option<u32> {
        match ops[x] {
            // A request made after its free (ids reused in a hand-made workload) is not this free's.
            Op::Free { id, .. } => request(id, &request_at).and_then(|at| (x as u32).checked_sub(at)),
            _ => None,
        }
    };
    let mut out = Vec::new();
    let mut seen: FxHashMap<(u64, u64), usize> = FxHashMap::default();
    // Anchors before this op are passed over: inside a repeat found, or a run already compared.
    let mut from = 0;
    for &(i, held) in &anchors {
        let i = i as usize;
        if i < from || i + ANCHOR_SPAN > n {
            continue;
        }
        let key = (hash_of(&content[i..i + ANCHOR_SPAN]), held);
        let Some(j) = seen.insert(key, i) else { continue };
        let period = i - j;
        // The windows from j on, as long as each op equals the one a period before and each free frees a request of
        // its own window or the one before.
        let mut x = i;
        while x < n
            && content[x] == content[x - period]
            && back(x).is_none_or(|d| d as usize <= period + (x - j) % period)
        {
            x += 1;
        }
        let windows = ((x - j) / period - 1) as u32;
        if windows == 0 {
            // A repeat of another period starting before x would meet the same mismatch at x (or one the width
            // of a window's phase apart): look on from there, or the same ops are compared again and again.
            from = x;
            continue;
        }
        let r = Repeat { start: j as u32, period: period as u32, windows };
        out.push(r);
        from = r.end() as usize;
        seen.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::program::{same_either_way, Program, MIB};
    use super::super::{Config, Workload};

    #[test]
    fn a_steady_loop_is_one_repeat_and_its_windows_are_skipped() {
        let mut p = Program::default();
        let _model: Vec<u32> = (0..3).map(|_| p.alloc(30 * MIB)).collect();
        for _ in 0..400 {
            let a = p.alloc(64 * MIB);
            let b = p.alloc(3 * MIB);
            p.free(a);
            let c = p.alloc(32 * MIB);
            p.free(b);
            p.free(c);
        }
        let w = Workload::from_ops(p.ops);
        let r = w.repeats();
        assert_eq!(r.len(), 1, "{r:?}");
        // The loop's six ops, or (where none of them is an anchor by content, and positions every ANCHOR_EVERY
        // meet the same phase only every lcm(6, 32) ops) a whole number of them.
        assert_eq!(r[0].period % 6, 0, "{r:?}");
        assert!(r[0].end() as usize >= w.ops.len() - r[0].period as usize * 2);
        let (skipped, _) = same_either_way(&w, Config::default());
        assert!(skipped as usize >= w.ops.len() / 2, "{skipped} ops skipped");
        // Under a capacity the loop cannot hold, every window fails alike: nothing is skipped past a failure.
        let tight = Config { capacity: Some(100 * MIB), ..Config::default() };
        same_either_way(&w, tight);
    }

    #[test]
    fn two_buffers_used_in_turn_settle_into_a_cycle_of_two_layouts() {
        let mut p = Program::default();
        let mut last = p.alloc(100 * MIB);
        for _ in 0..200 {
            let next = p.alloc(100 * MIB);
            p.free(last);
            last = next;
        }
        let w = Workload::from_ops(p.ops);
        assert!(!w.repeats().is_empty());
        assert!(same_either_way(&w, Config::default()).0 > 0);
    }

    #[test]
    fn a_ring_of_more_buffers_than_a_cycle_holds_is_simulated_op_by_op_alike() {
        let mut p = Program::default();
        let mut ring: std::collections::VecDeque<u32> = (0..6).map(|_| p.alloc(50 * MIB)).collect();
        for _ in 0..300 {
            let next = p.alloc(50 * MIB);
            p.free(ring.pop_front().unwrap());
            ring.push_back(next);
        }
        let w = Workload::from_ops(p.ops);
        same_either_way(&w, Config::default());
    }

    #[test]
    fn a_loop_that_keeps_something_each_step_is_never_skipped() {
        let mut p = Program::default();
        for _ in 0..40 {
            let kept = p.alloc(8 * MIB);
            let t = p.alloc(64 * MIB);
            p.free(t);
            let _ = kept;
        }
        let w = Workload::from_ops(p.ops);
        assert_eq!(same_either_way(&w, Config::default()).0, 0);
    }
}
