//! Where one pass of the program's loop ends and the next begins. Leaks and per-iteration peaks are judged from
//! iteration to iteration, and many loops that run out of memory have no optimizer: evaluation, inference, data
//! loading. So iterations are found from the trace itself, best evidence first:
//!
//! 1. the optimizer's steps (a training loop),
//! 2. `snapshot` markers the program left (`torch.cuda.memory._snapshot()` once per step),
//! 3. a repeating sequence of allocating stacks: the loop body allocates from the same lines every pass, so one of
//!    them (the anchor) occurs once per pass, and between two of its occurrences every other line of the body
//!    occurs too. Of the candidate anchors, the one whose passes hold the most of the trace's allocations wins;
//!    an anchor inside a layer loop splits the trace into layers, whose passes miss the lines outside the layers.
//!    A trace that recorded no frame at all (`context=None`) is read the same way by allocation size: the loop's
//!    lines make the same sizes every pass.

use crate::timeline::stacks::{StackId, EMPTY_STACK};
use crate::timeline::{Action, Event, Timeline};

/// How the iterations were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    OptimizerSteps,
    SnapshotMarkers,
    RepeatingStacks,
    RepeatingSizes,
}

impl Source {
    pub fn words(self) -> &'static str {
        match self {
            Source::OptimizerSteps => "optimizer steps",
            Source::SnapshotMarkers => "snapshot markers",
            Source::RepeatingStacks => "a repeating sequence of allocating stacks",
            Source::RepeatingSizes => "a repeating sequence of allocation sizes, the trace having no stacks",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Iterations {
    /// The last event of each whole iteration, in order.
    pub ends: Vec<usize>,
    pub source: Source,
}

/// Fewer boundaries than this say nothing about repetition.
const MIN_ENDS: usize = 3;
/// A line of the loop body occurs in at least this share of the passes (a pass may skip a branch).
const BODY_SHARE: f64 = 0.8;
/// The passes must hold at least this share of the allocations between the first and the last anchor.
const MIN_COVERAGE: f64 = 0.6;
/// Candidate anchors tried (one per occurrence count, the most common counts first).
const CANDIDATES: usize = 12;
/// Anchors whose passes cover this much less than the best one are as good (see `repeating_stacks`).
const COVERAGE_SLACK: f64 = 0.05;
/// What may follow the last whole pass, in passes: the pass that failed, and the one after the end of the loop.
const TAIL_PASSES: usize = 2;

/// Finds the iterations of a trace. `optimizer_steps` are the ends of the optimizer's steps (see
/// `facts::optimizer_steps`).
pub fn find(tl: &Timeline, events: &[Event], optimizer_steps: &[usize]) -> Option<Iterations> {
    if optimizer_steps.len() >= MIN_ENDS {
        return Some(Iterations { ends: optimizer_steps.to_vec(), source: Source::OptimizerSteps });
    }
    if let Some(ends) = snapshot_markers(events) {
        return Some(Iterations { ends, source: Source::SnapshotMarkers });
    }
    let framed: Vec<(usize, StackId)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Alloc && e.stack != EMPTY_STACK)
        .map(|(i, e)| (i, e.stack))
        .collect();
    if !framed.is_empty() {
        return repeating_stacks(events, &framed, &|stacks| inside_one_forward(tl, stacks), false)
            .map(|(ends, _)| Iterations { ends, source: Source::RepeatingStacks });
    }
    // No frame anywhere: each size stands in for a line (numbered densely, as stacks are). Without frames nothing
    // says whether a repeat is the layers of one forward pass, so the outermost repeat is taken (the steps, not the
    // layers within them), and a repeat with none inside it only where its passes give back most of what they
    // take: the layers of a forward keep what they make for the backward, as a loop's passes do not (a pass that
    // keeps everything, a graph held from step to step, is told from a layer only by the layers inside it).
    let mut ids: rustc_hash::FxHashMap<u64, StackId> = rustc_hash::FxHashMap::default();
    let by_size: Vec<(usize, StackId)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Alloc)
        .map(|(i, e)| {
            let n = ids.len() as StackId;
            (i, *ids.entry(e.size).or_insert(n))
        })
        .collect();
    let (ends, nests) = repeating_stacks(events, &by_size, &|_| false, true)?;
    (nests || gives_back_most(events, &ends)).then_some(Iterations { ends, source: Source::RepeatingSizes })
}

/// Whether the passes between `ends` free, before each pass ends, most of the bytes they allocate.
fn gives_back_most(events: &[Event], ends: &[usize]) -> bool {
    let (mut made, mut given) = (0u64, 0u64);
    let mut live: rustc_hash::FxHashMap<u64, u64> = rustc_hash::FxHashMap::default();
    for w in ends.windows(2) {
        live.clear();
        for e in &events[w[0] + 1..=w[1]] {
            match e.action {
                Action::Alloc => {
                    made += e.size;
                    live.insert(e.addr, e.size);
                }
                Action::FreeRequested | Action::FreeCompleted => given += live.remove(&e.addr).unwrap_or(0),
                _ => {}
            }
        }
    }
    given * 2 > made
}

/// Whether allocations from these stacks were all made inside one call of a module's `forward`: the Python frames
/// they share, from the outermost in, pass through a `forward`. Such a loop is the layers of one forward pass (a
/// model's `for layer in self.layers`), not iterations of the program: one big forward that runs out of memory
/// must not read as a leak across layers. An evaluation loop that keeps its graphs calls `forward` once per pass,
/// below the frames the passes share.
fn inside_one_forward(tl: &Timeline, stacks: &[StackId]) -> bool {
    let python = |s: StackId| -> Vec<crate::timeline::stacks::FrameId> {
        tl.stacks
            .stack(s)
            .iter()
            .rev()
            .copied()
            .filter(|&f| tl.strings.get(tl.stacks.frame(f).filename).contains(".py"))
            .collect()
    };
    let mut chains = stacks.iter().map(|&s| python(s)).filter(|c| !c.is_empty());
    let Some(mut common) = chains.next() else { return false };
    for c in chains {
        let n = common.iter().zip(&c).take_while(|(a, b)| a == b).count();
        common.truncate(n);
    }
    // The call into a module (`_call_impl`) may be shared: a decode loop calls the model once per step.
    common.iter().any(|&f| tl.strings.get(tl.stacks.frame(f).name) == "forward")
}

/// `snapshot` markers with allocations between them.
fn snapshot_markers(events: &[Event]) -> Option<Vec<usize>> {
    let mut ends = Vec::new();
    let mut allocs_since = 0;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => allocs_since += 1,
            Action::Snapshot if allocs_since > 0 => {
                ends.push(i);
                allocs_since = 0;
            }
            _ => {}
        }
    }
    (ends.len() >= MIN_ENDS).then_some(ends)
}

/// Iteration ends from the anchor stack whose passes best cover the trace (see the module's documentation);
/// `allocs` are the allocations' (event index, stack), dense stack ids. Of the anchors that cover about as well as
/// the best, the one with the shortest pass, or with `outermost` the longest; and whether an anchor of at least
/// twice as many passes covers enough of the trace to count (a loop inside the passes).
fn repeating_stacks(
    events: &[Event],
    allocs: &[(usize, StackId)],
    nested: &dyn Fn(&[StackId]) -> bool,
    outermost: bool,
) -> Option<(Vec<usize>, bool)> {
    if allocs.len() < 4 * MIN_ENDS {
        return None;
    }
    let n_stacks = allocs.iter().map(|a| a.1 as usize).max().unwrap_or(0) + 1;
    let mut count = vec![0u32; n_stacks];
    let mut first = vec![u32::MAX; n_stacks];
    for (k, &(_, s)) in allocs.iter().enumerate() {
        count[s as usize] += 1;
        first[s as usize] = first[s as usize].min(k as u32);
    }
    // One candidate per occurrence count: the stack with that count that appears first. Counts that many
    // allocations share come first (the lines of a loop body share the number of passes).
    let mut by_count: rustc_hash::FxHashMap<u32, (u64, StackId, u32)> = rustc_hash::FxHashMap::default();
    for s in 0..n_stacks {
        let c = count[s];
        if c < (MIN_ENDS + 1) as u32 || c as usize > allocs.len() / 2 {
            continue;
        }
        let e = by_count.entry(c).or_insert((0, s as StackId, first[s]));
        e.0 += u64::from(c);
        if first[s] < e.2 {
            e.1 = s as StackId;
            e.2 = first[s];
        }
    }
    let mut candidates: Vec<(u64, u32, StackId)> = by_count.into_iter().map(|(c, (w, s, _))| (w, c, s)).collect();
    candidates.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    candidates.truncate(CANDIDATES);

    let mut seen_in = vec![0u32; n_stacks];
    let mut last_pass = vec![u32::MAX; n_stacks];
    // (coverage, passes, their ends, lines in the body)
    let mut found: Vec<(f64, usize, Vec<usize>, usize)> = Vec::new();
    for &(_, _, anchor) in &candidates {
        let mut at: Vec<usize> = allocs.iter().enumerate().filter(|(_, a)| a.1 == anchor).map(|(k, _)| k).collect();
        // A line the loop shares with its set-up (a weight of the input's size, with no frame to tell them apart)
        // occurs there close together: those are no passes. The loop runs to the end, so its passes are known by
        // the later ones.
        let lens: Vec<usize> = at.windows(2).map(|w| w[1] - w[0]).collect();
        let mut later = lens[lens.len() / 2..].to_vec();
        later.sort_unstable();
        let typical = later.get(later.len() / 2).copied().unwrap_or(0);
        let set_up = lens.iter().take_while(|&&l| l * 4 < typical).count();
        at.drain(..set_up);
        if at.len() < MIN_ENDS + 1 {
            continue;
        }
        let passes = at.len() - 1;
        let (lo, hi) = (at[0], at[passes]);
        // The passes must be most of the trace's allocations, not one phase of it.
        if (hi - lo) * 2 < allocs.len() {
            continue;
        }
        seen_in.iter_mut().for_each(|x| *x = 0);
        last_pass.iter_mut().for_each(|x| *x = u32::MAX);
        let mut pass = 0u32;
        for (k, &(_, s)) in allocs.iter().enumerate().take(hi).skip(lo) {
            if pass as usize + 1 < at.len() && k == at[pass as usize + 1] {
                pass += 1;
            }
            let s = s as usize;
            if last_pass[s] != pass {
                last_pass[s] = pass;
                seen_in[s] += 1;
            }
        }
        let body = |s: StackId| f64::from(seen_in[s as usize]) >= BODY_SHARE * passes as f64;
        let covered = allocs[lo..hi].iter().filter(|a| body(a.1)).count();
        let coverage = covered as f64 / (hi - lo) as f64;
        if coverage < MIN_COVERAGE {
            continue;
        }
        let mut lines: Vec<StackId> =
            (0..n_stacks as StackId).filter(|&s| seen_in[s as usize] > 0 && body(s)).collect();
        let body_lines = lines.len();
        lines.truncate(256);
        if nested(&lines) {
            continue;
        }
        let ends: Vec<usize> = at[1..].iter().map(|&k| allocs[k].0 - 1).collect();
        found.push((coverage, passes, ends, body_lines));
    }
    // Longer passes always cover a little more (a line that runs every few iterations, noise, become "body"): of
    // the anchors that cover about as much as the best, the one with the shortest pass is the loop's period.
    let top = found.iter().map(|f| f.0).fold(0.0, f64::max);
    // A loop of several lines (one line made many times over is no loop: q, k and v of one size).
    let most = found.iter().filter(|f| f.3 >= 2).map(|f| f.1).max().unwrap_or(0);
    let good = found.into_iter().filter(|f| f.0 >= top - COVERAGE_SLACK);
    let (passes, ends) = if outermost {
        // A loop inside the passes covers less (the lines outside it are not its body), but covers.
        let fewest = good.min_by_key(|f| f.1)?;
        (most >= 2 * fewest.1, fewest.2)
    } else {
        (false, good.max_by_key(|f| f.1)?.2)
    };
    // The passes of a loop run to the end of the trace (or to the OOM, in the pass that failed). A repeating run
    // followed by much other work is a loop inside one iteration — the layers of one forward pass, which the
    // backward and the optimizer follow — and no sign of iterations at all.
    let mut lengths: Vec<usize> = ends.windows(2).map(|w| w[1] - w[0]).collect();
    lengths.sort_unstable();
    let pass = lengths.get(lengths.len() / 2).copied().unwrap_or(0);
    let tail = events.len() - 1 - ends.last().copied().unwrap_or(0);
    (tail <= TAIL_PASSES * pass.max(1)).then_some((ends, passes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(stack: StackId) -> Event {
        let mut e = Event::new(Action::Alloc, 0, 1);
        e.stack = stack;
        e
    }

    /// A loop body of an input line, four layers of three lines each (one stack per line, the same every layer)
    /// and a loss line, run `passes` times, with the last pass cut short by the OOM.
    fn loop_trace(passes: usize, layers: usize) -> Vec<Event> {
        let mut v = vec![alloc(90), alloc(91)];
        for p in 0..passes {
            v.push(alloc(1));
            for _ in 0..layers {
                v.extend([alloc(10), alloc(11), alloc(12)]);
            }
            v.push(alloc(2));
            if p + 1 == passes {
                v.push(alloc(1));
                v.push(alloc(10));
            }
        }
        v
    }

    #[test]
    fn a_loop_without_an_optimizer_is_split_at_its_first_line_not_at_its_layers() {
        let ev = loop_trace(14, 4);
        let allocs: Vec<(usize, StackId)> = ev.iter().enumerate().map(|(i, e)| (i, e.stack)).collect();
        let it = repeating_stacks(&ev, &allocs, &|_| false, false)
            .map(|(ends, _)| Iterations { ends, source: Source::RepeatingStacks })
            .expect("found");
        assert_eq!(it.source, Source::RepeatingStacks);
        assert_eq!(it.ends.len(), 14, "{:?}", it.ends);
        // Each pass ends with its loss line, just before the next input line.
        for &e in &it.ends {
            assert_eq!(ev[e].stack, 2);
            assert_eq!(ev[e + 1].stack, 1);
        }
    }

    #[test]
    fn a_trace_without_frames_is_split_by_its_sizes() {
        // The same loop recorded with context=None: no stack, each line's size its own.
        let ev: Vec<Event> = loop_trace(14, 4)
            .into_iter()
            .map(|e| {
                let mut f = Event::new(Action::Alloc, 0, 512 * (u64::from(e.stack) + 1));
                f.stack = EMPTY_STACK;
                f
            })
            .collect();
        let it = find(&Timeline::default(), &ev, &[]).expect("found");
        assert_eq!(it.source, Source::RepeatingSizes);
        // The steps, not the layers: a pass is the input line, four layers of three and the loss line.
        assert!(it.ends.len() >= 13, "{:?}", it.ends);
        assert!(it.ends.windows(2).all(|w| w[1] - w[0] == 14), "{:?}", it.ends);
        // Without a loop inside them, passes that give back nothing are taken for the layers of one forward.
        let one_level: Vec<Event> = ev.iter().filter(|e| ![512 * 11, 512 * 12].contains(&e.size)).cloned().collect();
        assert!(find(&Timeline::default(), &one_level, &[]).is_none());
        // Weights loaded first, one of them the size of the loop's input line: the set-up makes no passes.
        let mut set_up: Vec<Event> = (0..26)
            .flat_map(|_| [512 * 91, 512 * 91, 512 * 2].map(|size| Event::new(Action::Alloc, 0, size)))
            .collect();
        // No loss line: the input line alone marks the steps.
        set_up.extend(ev.iter().filter(|e| e.size != 512 * 3).cloned());
        let it = find(&Timeline::default(), &set_up, &[]).expect("found after a set-up");
        assert!(it.ends.len() >= 13 && it.ends.windows(2).all(|w| w[1] - w[0] == 13), "{:?}", it.ends);
        // The same passes freeing what they make (a loop under no_grad): a loop of the program.
        let freed: Vec<Event> = one_level
            .iter()
            .enumerate()
            .flat_map(|(i, e)| {
                let addr = (i as u64 + 1) << 20;
                let mut a = e.clone();
                a.addr = addr;
                [a, Event::new(Action::FreeCompleted, addr, e.size)]
            })
            .collect();
        assert_eq!(find(&Timeline::default(), &freed, &[]).map(|it| it.source), Some(Source::RepeatingSizes));
    }

    #[test]
    fn optimizer_steps_and_markers_come_first_and_noise_is_no_loop() {
        let ev = loop_trace(5, 2);
        let tl = Timeline::default();
        assert_eq!(find(&tl, &ev, &[3, 9, 20]).unwrap().source, Source::OptimizerSteps);
        let mut marked = ev.clone();
        for at in [10, 20, 30] {
            marked.insert(at, Event::new(Action::Snapshot, 0, 0));
        }
        assert_eq!(find(&tl, &marked, &[]).unwrap().source, Source::SnapshotMarkers);
        // Every allocation from a different line: nothing repeats.
        let once: Vec<Event> = (0..100).map(alloc).collect();
        assert!(find(&tl, &once, &[]).is_none());
    }
}
