//! A forward simulator of the caching allocator: it replays a trace's requests and frees and decides placement
//! itself, as torch's allocator does, so the same run can be replayed under other settings, another capacity or
//! an edited workload (what-ifs). The replay beside it (`replay.rs`) follows the recorded addresses and cannot.

pub mod allocator;
pub mod passes;
#[cfg(test)]
mod program;
pub mod repeats;
pub mod workload;

pub use allocator::{Allocator, Config, SegmentEvent};
pub use workload::{Edit, Op, PoolRef, StartSegment, Workload};

use rustc_hash::FxHashMap;

use super::Action;

/// What a simulation found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub peak_reserved: u64,
    /// The trace event at (or before) which the reserved bytes peaked.
    pub peak_reserved_event: Option<u32>,
    pub peak_allocated: u64,
    /// Requests the allocator could not serve: the first one's trace event and size, and how many.
    pub first_failure: Option<(u32, u64)>,
    pub failures: usize,
    /// Whether the request that raised the recorded OOM was served.
    pub oom_request_fits: Option<bool>,
    pub reserved_at_end: u64,
    pub allocated_at_end: u64,
    /// The segment changes, when asked for.
    pub segment_events: Vec<SegmentEvent>,
    /// How many requests met a refusal taken from the trace, and how many releases were told to be the program's
    /// empty_cache because the cache could have served the next request.
    pub refusals_followed: usize,
    pub empty_caches: usize,
    /// Ops not simulated one by one: windows of a repeat that would have left the allocator as it found it.
    pub ops_skipped: u64,
    /// Of those, the ops of windows that give back all they take, passed over as an alike one was simulated.
    pub ops_passed_over: u64,
}

impl Outcome {
    /// No request failed.
    pub fn fits(&self) -> bool {
        self.failures == 0
    }
}

/// Runs a workload through the allocator model.
pub fn simulate(w: &Workload, cfg: Config, record_events: bool) -> Outcome {
    simulate_with(w, cfg, record_events, |_, _| Edit::Keep)
}

/// Runs a workload with each request edited by `edit(stack, size)`: left out, resized or kept.
pub fn simulate_with(
    w: &Workload,
    cfg: Config,
    record_events: bool,
    edit: impl Fn(super::stacks::StackId, u64) -> Edit,
) -> Outcome {
    run(w, cfg, record_events, edit, true)
}

/// [`simulate_with`] op by op, never skipping a repeat: what a skip must equal (a test's yardstick).
#[doc(hidden)]
pub fn simulate_every_op(
    w: &Workload,
    cfg: Config,
    record_events: bool,
    edit: impl Fn(super::stacks::StackId, u64) -> Edit,
) -> Outcome {
    run(w, cfg, record_events, edit, false)
}

fn run(
    w: &Workload,
    cfg: Config,
    record_events: bool,
    edit: impl Fn(super::stacks::StackId, u64) -> Edit,
    skip_repeats: bool,
) -> Outcome {
    let (mut a, start_blocks) = w.start_allocator(cfg);
    a.record_events = record_events;
    let mut blocks: Vec<u32> = start_blocks;
    blocks.resize(w.ids().max(blocks.len()), allocator::NIL);
    let mut out = Outcome::default();
    let fail = |out: &mut Outcome, event: u32, size: u64| {
        out.failures += 1;
        out.first_failure.get_or_insert((event, size));
    };
    let mut released = false;
    // Garbage collection ages cached blocks by a count that never repeats: its states are never alike.
    let gc = a.config().gc_threshold.is_some_and(|t| t > 0.0);
    let (repeats, passes) = match gc || !skip_repeats {
        true => (&[][..], None),
        false => {
            let (r, p) = w.structure();
            (r, Some(p))
        }
    };
    // Comparing layouts costs a pass over the blocks: at most a few such passes' worth of blocks per op of the
    // workload are spent on it, whatever the repeats found.
    let mut skip = Skipper { budget: 4 * w.ops.len() as u64, ..Skipper::default() };
    let mut memo = passes.map(|p| Memo::new(p, w.ops.len() as u64));
    let mut i = 0;
    while i < w.ops.len() {
        if let Some(to) = skip.at(i, repeats, &a, &out, w, &mut blocks) {
            out.ops_skipped += (to - i) as u64;
            i = to;
            continue;
        }
        if let Some(m) = memo.as_mut().filter(|m| m.due(i)) {
            if let Some(to) = m.at(i, &a, out.failures, released) {
                out.ops_skipped += (to - i) as u64;
                out.ops_passed_over += (to - i) as u64;
                i = to;
                continue;
            }
        }
        let op = &w.ops[i];
        i += 1;
        a.at_op(i as u32 - 1);
        match *op {
            Op::Alloc { id, size, stream, pool, event, stack } => {
                let (stream, pool) = (stream as u64, w.pool(pool));
                let size = match edit(stack, size) {
                    Edit::Keep => size,
                    Edit::Resize(s) => s,
                    Edit::Drop => continue,
                };
                let got = if std::mem::take(&mut released) {
                    if a.cache_serves(size, stream, pool) {
                        // The cache could have served it: the release was the program's empty_cache.
                        out.empty_caches += 1;
                        a.release_cached();
                        a.malloc(size, stream, pool)
                    } else if a.config().follow_refusals {
                        let collections = a.gc_releasing_requests;
                        let got = a.malloc_refused(size, stream, pool);
                        // Where garbage collection made the release, no refusal was needed to explain it.
                        if a.gc_releasing_requests == collections {
                            out.refusals_followed += 1;
                        }
                        got
                    } else {
                        a.malloc(size, stream, pool)
                    }
                } else {
                    a.malloc(size, stream, pool)
                };
                match got {
                    Some(b) => blocks[id as usize] = b,
                    None => fail(&mut out, event, size),
                }
            }
            Op::Released { .. } => released = true,
            Op::Free { id, .. } => {
                let b = std::mem::replace(&mut blocks[id as usize], allocator::NIL);
                if b != allocator::NIL {
                    a.free(b);
                }
            }
            Op::EmptyCache { .. } => {
                out.empty_caches += 1;
                a.release_cached()
            }
            Op::Failed { size, stream, pool, event } => {
                let (stream, pool) = (stream as u64, w.pool(pool));
                // The request that raised the OOM; if it fits here it stays held (its free is not in the trace).
                let served = a.malloc(size, stream, pool).is_some();
                out.oom_request_fits = Some(out.oom_request_fits.unwrap_or(true) && served);
                if !served {
                    fail(&mut out, event, size);
                }
            }
        }
    }
    out.peak_reserved = a.peak_reserved;
    out.peak_reserved_event = a.peak_reserved_op.and_then(|o| w.ops.get(o as usize)).map(|o| o.event());
    out.peak_allocated = a.peak_allocated;
    out.reserved_at_end = a.reserved;
    out.allocated_at_end = a.allocated;
    out.segment_events = std::mem::take(&mut a.segment_events);
    out
}

/// What the allocator looked like at one window boundary of a repeat: the counters, then (where the counters had
/// matched a recent boundary's) the layout and where each live request of the window just ended sits.
#[derive(PartialEq)]
struct Mark {
    counters: [u64; 5],
    layout: Option<Layout>,
}

/// Every block (see [`Allocator::layout`]), and each live request of the window just ended: its place in the
/// window and its block's address.
#[derive(PartialEq)]
struct Layout {
    blocks: Vec<[u64; 6]>,
    window: Vec<(u32, u64)>,
}

/// How many boundaries back a state may come again: an allocator can settle into a cycle of a few layouts (two
/// buffers used in turn) rather than one.
const CYCLE_AT_MOST: usize = 4;
/// Layouts compared in one repeat before it is given up: one that has not settled by then (a ring of more buffers
/// than a cycle holds, addresses that drift) would cost a comparison per window for nothing.
const COMPARISONS_AT_MOST: u32 = 2 * CYCLE_AT_MOST as u32;

/// Skips the windows of a repeat once a boundary finds the allocator as it was at one of the last few: the windows
/// left go round the same cycle, and the last one's live requests sit where the matching window's did.
#[derive(Default)]
struct Skipper {
    /// The repeat being watched (an index into the workload's repeats) and its next boundary.
    at: usize,
    boundary: Option<usize>,
    recent: Vec<Mark>,
    compared: u32,
    /// Blocks the layout comparisons may still go over.
    budget: u64,
}

impl Skipper {
    /// At op `i`: where to go on from, if some windows of a repeat can be skipped.
    fn at(
        &mut self,
        i: usize,
        repeats: &[repeats::Repeat],
        a: &Allocator,
        out: &Outcome,
        w: &Workload,
        blocks: &mut [u32],
    ) -> Option<usize> {
        let b = loop {
            let b = match self.boundary {
                Some(b) => b,
                None => {
                    let r = repeats.get(self.at)?;
                    let first = (r.start + r.period) as usize;
                    self.boundary = Some(first);
                    first
                }
            };
            if b >= i {
                break b;
            }
            // A window passed over by the memo went past this boundary: the states kept are no longer the last
            // few boundaries', and the next boundary is the first one ahead.
            let r = repeats[self.at];
            let period = r.period as usize;
            let next = b + (i - b).div_ceil(period) * period;
            self.recent.clear();
            if next > r.end() as usize {
                self.at += 1;
                self.boundary = None;
                self.compared = 0;
            } else {
                self.boundary = Some(next);
            }
        };
        if i != b {
            return None;
        }
        let r = repeats[self.at];
        let (period, end) = (r.period as usize, r.end() as usize);
        let counters = [a.reserved, a.allocated, a.segment_changes, a.pools() as u64, out.failures as u64];
        let mut mark = Mark { counters, layout: None };
        let window = i - period..i;
        let mut skip_to = None;
        if self.compared < COMPARISONS_AT_MOST && self.budget > 0 && self.recent.iter().any(|m| m.counters == counters)
        {
            self.compared += 1;
            let live: Vec<(u32, u64)> = w.ops[window.clone()]
                .iter()
                .enumerate()
                .filter_map(|(k, op)| match *op {
                    Op::Alloc { id, .. } if blocks[id as usize] != allocator::NIL => {
                        Some((k as u32, a.block_addr(blocks[id as usize])))
                    }
                    _ => None,
                })
                .collect();
            let blocks_now = a.layout();
            self.budget = self.budget.saturating_sub(blocks_now.len() as u64);
            mark.layout = Some(Layout { blocks: blocks_now, window: live });
            let cycle = (1..=self.recent.len()).find(|&c| self.recent[self.recent.len() - c] == mark);
            if let Some(c) = cycle {
                let turns = (end - i) / (c * period);
                if turns > 0 {
                    let shift = turns * c * period;
                    for o in window {
                        if let Op::Alloc { id, .. } = w.ops[o] {
                            let held = std::mem::replace(&mut blocks[id as usize], allocator::NIL);
                            if held != allocator::NIL {
                                if let Op::Alloc { id: later, .. } = w.ops[o + shift] {
                                    blocks[later as usize] = held;
                                }
                            }
                        }
                    }
                    skip_to = Some(i + shift);
                }
            }
        }
        let next = b + period;
        if skip_to.is_some() || next > end {
            // What is left of the repeat (less than a cycle) is simulated; the next repeat starts after it.
            self.at += 1;
            self.boundary = None;
            self.recent.clear();
            self.compared = 0;
            return skip_to;
        }
        self.boundary = Some(next);
        if self.recent.len() == CYCLE_AT_MOST {
            self.recent.remove(0);
        }
        self.recent.push(mark);
        None
    }
}

/// Passes over a window that gives back all it takes (see [`passes`]) where one of its kind, simulated from the
/// same state, left the allocator as it found it: the allocator is deterministic, so this one would too, and it
/// reaches no peak the first did not.
struct Memo<'w> {
    passes: &'w [passes::Pass],
    /// The next window, and where it starts.
    next: usize,
    next_start: usize,
    /// The window being simulated: where it ends, its kind, the state it started from and the counters then.
    open: Option<(usize, u32, u32, [u64; 5])>,
    /// The layouts met, found by their hash.
    layouts: Vec<Vec<[u64; 6]>>,
    by_hash: FxHashMap<u64, Vec<u32>>,
    /// (state, kind) of the windows that left a state as they found it.
    unchanged: rustc_hash::FxHashSet<(u32, u32)>,
    /// The state at an op already taken (a window's end is often the next one's start).
    here: Option<(usize, u32)>,
    /// Blocks the layouts may still go over, and blocks of layouts that may still be kept.
    budget: u64,
    room: u64,
}

impl<'w> Memo<'w> {
    /// For a workload of `ops` ops: a few passes over the blocks per op are spent comparing layouts, and a quarter
    /// block per op kept (a workload whose states never come again would otherwise keep every one).
    fn new(passes: &'w [passes::Pass], ops: u64) -> Memo<'w> {
        Memo {
            passes,
            next: 0,
            next_start: passes.first().map_or(usize::MAX, |p| p.start as usize),
            open: None,
            layouts: Vec::new(),
            by_hash: FxHashMap::default(),
            unchanged: Default::default(),
            here: None,
            budget: 4 * ops,
            room: ops / 4,
        }
    }

    /// Whether op `i` starts or ends a window (or one was passed by a skip).
    #[inline]
    fn due(&self, i: usize) -> bool {
        i >= self.next_start || self.open.is_some_and(|(end, ..)| i >= end)
    }

    /// The state of the allocator at op `i`, as an index into the layouts met; `None` once the budget is spent.
    fn state(&mut self, i: usize, a: &Allocator) -> Option<u32> {
        if let Some((at, s)) = self.here {
            if at == i {
                return Some(s);
            }
        }
        if self.budget == 0 {
            return None;
        }
        let layout = a.layout();
        self.budget = self.budget.saturating_sub(layout.len() as u64);
        let mut h = rustc_hash::FxHasher::default();
        std::hash::Hash::hash(&layout, &mut h);
        let h = std::hash::Hasher::finish(&h);
        let met = self.by_hash.get(&h).and_then(|ids| ids.iter().find(|&&s| self.layouts[s as usize] == layout));
        let s = match met {
            Some(&s) => s,
            None if layout.len() as u64 <= self.room => {
                self.room -= layout.len() as u64;
                self.layouts.push(layout);
                let s = self.layouts.len() as u32 - 1;
                self.by_hash.entry(h).or_default().push(s);
                s
            }
            None => return None,
        };
        self.here = Some((i, s));
        Some(s)
    }

    /// At op `i`: where to go on from, if the window starting here can be passed over.
    fn at(&mut self, i: usize, a: &Allocator, failures: usize, released: bool) -> Option<usize> {
        let counters = [a.reserved, a.allocated, a.segment_changes, a.pools() as u64, failures as u64];
        if let Some((end, kind, from, then)) = self.open {
            if i >= end {
                self.open = None;
                // One whose end a skip went past ended in a state not seen.
                if end == i && then == counters && self.state(i, a) == Some(from) {
                    self.unchanged.insert((from, kind));
                }
            }
        }
        while self.next < self.passes.len() && (self.passes[self.next].start as usize) < i {
            self.next += 1;
        }
        self.next_start = self.passes.get(self.next).map_or(usize::MAX, |p| p.start as usize);
        if self.next_start != i || released {
            return None;
        }
        let pass = self.passes[self.next];
        let state = self.state(i, a)?;
        if self.unchanged.contains(&(state, pass.kind)) {
            // The state is the same at its end.
            self.here = Some((pass.end as usize, state));
            return Some(pass.end as usize);
        }
        self.open = Some((pass.end as usize, pass.kind, state, counters));
        None
    }
}

/// The segment changes a trace recorded, in the simulator's terms.
pub fn recorded_segment_events(events: &[super::Event]) -> Vec<(Action, u64)> {
    events
        .iter()
        .filter(|e| {
            matches!(e.action, Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap)
        })
        .map(|e| (e.action, e.size))
        .collect()
}
