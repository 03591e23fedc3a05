//! Where a workload gives back all it takes: the windows between two moments at which the program holds exactly the
//! same requests (a training step from one `zero_grad` to the next, an evaluation batch). What such a window does
//! to the allocator depends only on the state it finds and on its own requests and frees, so a simulation that meets
//! a window alike to one it has simulated before, in the state that window started from and left unchanged, can
//! pass over it. Unlike a repeat ([`super::repeats`]) alike windows need not follow one another: a run whose shapes
//! change per step comes back to a few of them in any order.

use rustc_hash::FxHashMap;

use super::workload::Op;

/// The ops `[start, end)`: every request made in them is freed in them and every free in them frees one of their
/// own requests. Windows of one `kind` ask the allocator for the same things in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pass {
    pub start: u32,
    pub end: u32,
    pub kind: u32,
}

/// What one op of a window asks of the allocator, wherever the window stands.
#[derive(PartialEq)]
enum Asked {
    Request {
        size: u64,
        stream: u32,
        pool: u32,
        stack: u32,
    },
    /// How many ops back the freed request was made.
    Free {
        back: u32,
    },
}

/// Shorter windows save less than their state costs to compare.
const SHORTEST: u32 = 256;
/// Window starts are remembered in a table of this many pairs of slots, by the set held there; a later start whose
/// set falls in a full pair takes the older slot (that window is then not found, and is simulated).
const PAIRS: usize = 1 << 15;

/// Kinds of one length kept: windows of one length but many contents (shapes that change yet keep their count of
/// requests) would otherwise each be compared with every kind before them.
const KINDS_OF_A_LENGTH: usize = 8;

/// A request's id spread over 64 bits: the xor of a set of them names the set.
fn spread(id: u32) -> u64 {
    let mut z = (id as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The outermost windows of `ops` that give back all they take (nearly all: see [`PAIRS`]), at least [`SHORTEST`]
/// ops long, in order, each with its kind. `first_id` is the first request's id (lower ids were live at the start).
///
/// A window `[j, i)` gives back all it takes when the set of requests held at `j` and at `i` is the same: the sets
/// are compared by 47 bits of the xor of their spread ids, which two sets share only by chance, so each window
/// found is then checked op by op, and compared op by op with the first window of each kind of its length to be
/// given its kind.
/// Windows nest (the layers of a pass, from a layer's forward to its backward); only the outermost are kept: each
/// inner one would be a state to compare, and where the window around it meets a new state, so mostly do the ones
/// inside it.
pub fn find(ops: &[Op], first_id: u32) -> Vec<Pass> {
    let mut request_at: Vec<u32> = Vec::with_capacity(ops.len() / 2 + 1);
    // The set of requests held before each op (relative to the start's). A release or the failed request can be
    // in no window: each makes the set one never seen before.
    let mut held = 0u64;
    // Each slot: the set's high half and where it was held (its low 15 bits chose the pair: 47 bits compared). Two
    // sets that share those make a window that is not one; each window is checked below, and such a one fails.
    let mut starts: Vec<(u32, u32)> = vec![(0, u32::MAX); 2 * PAIRS];
    let check = |held: u64| (held >> 32) as u32;
    let mut found: Vec<(u32, u32)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, .. } => {
                // A window starts at a request and ends after a free. The pair's slot for this set, else an
                // empty one, else the older.
                let pair = &mut starts[2 * (held as usize % PAIRS)..][..2];
                let age = |k: usize| if pair[k].1 == u32::MAX { 0 } else { pair[k].1 as u64 + 1 };
                let slot = match (pair[0].0 == check(held), pair[1].0 == check(held)) {
                    (true, _) => 0,
                    (_, true) => 1,
                    _ => usize::from(age(1) < age(0)),
                };
                pair[slot] = (check(held), i as u32);
                held ^= spread(id);
                if let Some(k) = id.checked_sub(first_id) {
                    let k = k as usize;
                    if request_at.len() <= k {
                        request_at.resize(k + 1, u32::MAX);
                    }
                    request_at[k] = i as u32;
                }
            }
            Op::Free { id, .. } => {
                held ^= spread(id);
                let pair = &starts[2 * (held as usize % PAIRS)..][..2];
                if let Some(&(_, j)) = pair.iter().find(|&&(set, at)| set == check(held) && at != u32::MAX) {
                    if i as u32 + 1 - j >= SHORTEST {
                        found.push((j, i as u32 + 1));
                    }
                }
            }
            _ => held ^= spread(u32::MAX - i as u32).rotate_left(17),
        }
    }
    found.sort_unstable_by_key(|&(start, end)| (start, std::cmp::Reverse(end)));
    let request = |id: u32| -> Option<u32> {
        let k = id.checked_sub(first_id)? as usize;
        request_at.get(k).copied().filter(|&at| at != u32::MAX)
    };
    // Each op as a window sees it; a free whose request the window does not hold is none.
    let asked = |x: usize, start: u32| -> Option<Asked> {
        match ops[x] {
            Op::Alloc { size, stream, pool, stack, .. } => Some(Asked::Request { size, stream, pool, stack }),
            Op::Free { id, .. } => {
                // The window's own request, made before the free (ids reused in a hand-made workload are not).
                let at = request(id).filter(|&at| at >= start && (at as usize) < x)?;
                Some(Asked::Free { back: x as u32 - at })
            }
            _ => None,
        }
    };
    let mut list: Vec<Pass> = Vec::new();
    // The first window of each kind, by length: a window is compared with those of its length (a few at most:
    // steps of one shape are alike, and another shape is told apart within a few ops).
    let mut kinds: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    let mut reached = 0;
    for (start, end) in found {
        if start < reached {
            continue;
        }
        let len = (end - start) as usize;
        let firsts = kinds.entry(end - start).or_default();
        let alike = firsts.iter().copied().find(|&k| {
            let first = list[k].start as usize;
            (0..len).all(|o| asked(first + o, first as u32) == asked(start as usize + o, start))
        });
        let kind = match alike {
            Some(k) => list[k].kind,
            None => {
                // A window of a new kind is checked on its own: each free frees a request of its own, and there
                // are as many frees as requests.
                let mut balance = Some(0i64);
                for x in start as usize..end as usize {
                    let one = match asked(x, start) {
                        Some(Asked::Request { .. }) => Some(1),
                        Some(Asked::Free { .. }) => Some(-1),
                        None => None,
                    };
                    balance = balance.zip(one).map(|(b, one)| b + one);
                }
                if balance != Some(0) || firsts.len() >= KINDS_OF_A_LENGTH {
                    continue;
                }
                firsts.push(list.len());
                list.len() as u32
            }
        };
        reached = end;
        list.push(Pass { start, end, kind });
    }
    list
}

#[cfg(test)]
mod tests {
    use super::super::program::{same_either_way, Program, MIB};
    use super::super::{Config, Workload};
    use super::*;

    /// A training loop whose sequence length is drawn each step from four (in a pseudo-random order): the step
    /// allocates its activations layer by layer and frees them in the backward. Returns the program and how many
    /// lengths it drew.
    fn varlen(steps: usize, leak_one_activation: bool) -> (Program, usize) {
        let mut p = Program::default();
        let _weights: Vec<u32> = (0..8).map(|_| p.alloc(40 * MIB)).collect();
        let mut draw = 12345u64;
        let mut lengths = std::collections::BTreeSet::new();
        for _ in 0..steps {
            draw = draw.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 4 + (draw >> 60) % 4;
            lengths.insert(len);
            let batch = p.alloc(len * MIB / 4);
            let mut saved = Vec::new();
            for _layer in 0..64 {
                let t = p.alloc(len * 3 * MIB);
                saved.push(p.alloc(len * MIB));
                p.free(t);
            }
            if leak_one_activation {
                saved.remove(0);
            }
            for s in saved.into_iter().rev() {
                let g = p.alloc(len * 2 * MIB);
                p.free(g);
                p.free(s);
            }
            p.free(batch);
        }
        (p, lengths.len())
    }

    #[test]
    fn the_steps_of_a_run_whose_shapes_vary_are_found_and_alike_ones_passed_over() {
        let (program, lengths) = varlen(40, false);
        let w = Workload::from_ops(program.ops);
        let passes = w.passes();
        // Each step is a window (and inside it so is every stretch from a layer's forward to its backward, what the
        // layers before it saved held at both ends: not kept), of one kind per length.
        assert_eq!(passes.len(), 40, "{:?}", &passes[..3]);
        let kinds: std::collections::HashSet<u32> = passes.iter().map(|p| p.kind).collect();
        assert_eq!(kinds.len(), lengths);
        for p in passes {
            let first = passes[p.kind as usize];
            let alike = |a: &Pass, b: &Pass| {
                let size = |x: u32| match w.ops[x as usize] {
                    Op::Alloc { size, .. } => size,
                    _ => 0,
                };
                a.end - a.start == b.end - b.start
                    && (0..a.end - a.start).all(|o| size(a.start + o) == size(b.start + o))
            };
            assert!(alike(&first, p));
            assert!(passes.iter().filter(|q| q.kind != p.kind).all(|q| !alike(q, p)));
        }
        let (skipped, passed) = same_either_way(&w, Config::default());
        // Three ops in five are the large pool's.
        assert!(passed > w.ops.len() as u64 / 3, "{passed} of {} ops passed over", w.ops.len());
        assert!(skipped >= passed);
        // Capacities that fail some steps, and expandable segments: still alike.
        let mut expandable = Config::default();
        expandable.rules.expandable = true;
        for cfg in [
            Config { capacity: Some(1200 * MIB), ..Config::default() },
            Config { capacity: Some(900 * MIB), ..Config::default() },
            expandable,
        ] {
            same_either_way(&w, cfg);
        }
    }

    /// A loop whose batch is carried: each step's three small inputs are made before the last step's are freed
    /// (`x = batch.to(device)` at the loop's top), its length drawn from four; each layer's activations are large,
    /// its temporaries small, and every fifth step holds a burst of small buffers that needs more small segments than
    /// the others. With `keep`, each step also keeps a small buffer for good (a log of its loss), which the small
    /// pool's segments fill up with, and the large requests are all served from one segment that stays split (a
    /// block at its start held throughout): releasing the caches leaves the large pool as it is.
    fn carried(steps: usize, keep: bool) -> Program {
        const KIB: u64 = 1 << 10;
        let mut p = Program::default();
        let _weights: Vec<u32> = (0..8).map(|_| p.alloc(40 * MIB)).collect();
        if keep {
            let arena = p.alloc(600 * MIB);
            p.free(arena);
            p.alloc(2 * MIB);
        }
        let mut draw = 777u64;
        let mut inputs: Vec<u32> = Vec::new();
        for step in 0..steps {
            draw = draw.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 4 + (draw >> 60) % 4;
            let next: Vec<u32> = (0..3).map(|k| p.alloc((16 + 4 * k + len) * KIB)).collect();
            for x in std::mem::replace(&mut inputs, next) {
                p.free(x);
            }
            if keep {
                p.alloc(300 * KIB);
            }
            let mut saved = Vec::new();
            for _layer in 0..32 {
                let t = p.alloc(len * 3 * MIB);
                let small = p.alloc(len * 40 * KIB);
                saved.push(p.alloc(len * MIB));
                p.free(small);
                p.free(t);
            }
            if step % 5 == 4 {
                let burst: Vec<u32> = (0..12).map(|_| p.alloc(512 * KIB)).collect();
                burst.into_iter().for_each(|b| p.free(b));
            }
            for s in saved.into_iter().rev() {
                let g = p.alloc(len * 2 * MIB);
                let small = p.alloc(len * 20 * KIB);
                p.free(g);
                p.free(small);
                p.free(s);
            }
        }
        p
    }

    #[test]
    fn a_carried_batch_keeps_states_from_coming_again_but_not_the_large_pools() {
        let w = Workload::from_ops(carried(60, false).ops);
        assert!(w.passes().len() >= 50, "{} windows", w.passes().len());
        let (skipped, passed) = same_either_way(&w, Config::default());
        // Three ops in five are the large pool's.
        assert!(passed > w.ops.len() as u64 / 3, "{passed} of {} ops passed over", w.ops.len());
        assert!(skipped >= passed);
        let mut expandable = Config::default();
        expandable.rules.expandable = true;
        same_either_way(&w, expandable);
        // Capacities at which a window's small request needs a segment the cap refuses (the small pool fills up
        // with what each step keeps), so every cache is released part way through a window whose large pool's ops
        // were being left out.
        let w = Workload::from_ops(carried(60, true).ops);
        let peak = super::super::simulate(&w, Config::default(), false).peak_reserved;
        let mut stopped = 0;
        for short in [1, 3, 5, 7] {
            let cfg = Config { capacity: Some(peak - short * MIB), ..Config::default() };
            stopped += super::super::simulate(&w, cfg.clone(), false).pool_passes_stopped;
            same_either_way(&w, cfg);
        }
        assert!(stopped > 0, "no window stopped part way");
    }

    #[test]
    fn a_hand_made_workload_that_reuses_ids_is_simulated_alike() {
        // Each step makes requests 1..=150 again: a free's request is found after it, which is not its own.
        let mut ops = vec![Op::Alloc { id: 0, size: 40 * MIB, stream: 0, pool: 0, event: 0, stack: 1 }];
        for step in 0..6u64 {
            for id in 1..=150 {
                ops.push(Op::Alloc { id, size: (step % 2 + 1) * MIB, stream: 0, pool: 0, event: 0, stack: 1 });
            }
            for id in 1..=150 {
                ops.push(Op::Free { id, event: 0 });
            }
        }
        let w = Workload::from_ops(ops);
        assert!(w.passes().len() <= 1, "{:?}", w.passes());
        same_either_way(&w, Config::default());
    }

    #[test]
    fn a_step_that_keeps_an_activation_gives_back_not_all_it_takes_and_no_state_comes_again() {
        let w = Workload::from_ops(varlen(40, true).0.ops);
        // The layers after the kept activation still give back all they take, but no window holds a whole step,
        // and as every step leaves one more block the allocator is never in a state it was in before.
        let batches: Vec<usize> =
            (0..w.ops.len()).filter(|&i| matches!(w.ops[i], Op::Alloc { size, .. } if size < 2 * MIB)).collect();
        assert!(!w.passes().is_empty());
        assert!(w.passes().iter().all(|p| !batches.iter().any(|&b| (p.start as usize..p.end as usize).contains(&b))));
        let (_, passed) = same_either_way(&w, Config::default());
        assert_eq!(passed, 0);
    }
}
