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
    /// Of those, the ops of windows that give back all they take, passed over as an alike one was simulated (or
    /// the default large pool's ops in them, where one alike left that pool as it found it).
    pub ops_passed_over: u64,
    /// Windows simulated without the large pool's ops that went on op by op part way: a request of another pool
    /// released every pool's cache.
    pub pool_passes_stopped: usize,
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
    // Garbage collection ages cached blocks by a count that never repeats: its states are never alike.
    let gc = a.config().gc_threshold.is_some_and(|t| t > 0.0);
    let (repeats, passes) = match gc || !skip_repeats {
        true => (&[][..], None),
        false => {
            let (r, p) = w.structure();
            (r, Some(p))
        }
    };
    let mut sim = Sim { w, a, blocks, out: Outcome::default(), released: false, edit };
    // Comparing layouts costs a pass over the blocks: at most a few such passes' worth of blocks per op of the
    // workload are spent on it, whatever the repeats found.
    let mut skip = Skipper { budget: 4 * w.ops.len() as u64, ..Skipper::default() };
    let mut memo = passes.map(|p| Memo::new(p, w.ops.len() as u64));
    let stop_at_failure = sim.a.config().stop_at_first_failure;
    let mut i = 0;
    while i < w.ops.len() {
        if stop_at_failure && sim.out.failures > 0 {
            break;
        }
        if let Some(to) = skip.at(i, repeats, &sim.a, &sim.out, w, &mut sim.blocks) {
            // A window being written down op by op is not, past a skip.
            if let Some(m) = memo.as_mut() {
                m.recording = None;
            }
            sim.out.ops_skipped += (to - i) as u64;
            i = to;
            continue;
        }
        if let Some(m) = memo.as_mut().filter(|m| m.due(i)) {
            match m.at(i, &sim.a, sim.out.failures, sim.released) {
                Some(Go::PassOver(to)) => {
                    sim.out.ops_skipped += (to - i) as u64;
                    sim.out.ops_passed_over += (to - i) as u64;
                    i = to;
                    continue;
                }
                Some(Go::ByPool(key, end)) => {
                    i = sim.by_pool(i, end, &m.pool_passes[&key]);
                    continue;
                }
                None => {}
            }
        }
        match memo.as_mut().and_then(|m| m.recording.as_mut()) {
            Some(rec) => sim.step_recorded(i, rec),
            None => sim.step(i),
        }
        i += 1;
    }
    let (a, mut out) = (sim.a, sim.out);
    out.peak_reserved = a.peak_reserved;
    out.peak_reserved_event = a.peak_reserved_op.and_then(|o| w.ops.get(o as usize)).map(|o| o.event());
    out.peak_allocated = a.peak_allocated;
    out.reserved_at_end = a.reserved;
    out.allocated_at_end = a.allocated;
    out.segment_events = a.segment_events;
    out
}

/// One simulation's state: the allocator, the block each request holds, what was found so far, and whether the
/// trace's last op was a release of the cache.
struct Sim<'w, E> {
    w: &'w Workload,
    a: Allocator,
    blocks: Vec<u32>,
    out: Outcome,
    released: bool,
    edit: E,
}

impl<E: Fn(super::stacks::StackId, u64) -> Edit> Sim<'_, E> {
    fn fail(&mut self, event: u32, size: u64) {
        self.out.failures += 1;
        self.out.first_failure.get_or_insert((event, size));
    }

    /// Op `i`, simulated.
    fn step(&mut self, i: usize) {
        let (w, a) = (self.w, &mut self.a);
        a.at_op(i as u32);
        match w.ops[i] {
            Op::Alloc { id, size, stream, pool, event, stack } => {
                let (stream, pool) = (stream as u64, w.pool(pool));
                let size = match (self.edit)(stack, size) {
                    Edit::Keep => size,
                    Edit::Resize(s) => s,
                    Edit::Drop => return,
                };
                let got = if std::mem::take(&mut self.released) {
                    if a.cache_serves(size, stream, pool) {
                        // The cache could have served it: the release was the program's empty_cache.
                        self.out.empty_caches += 1;
                        a.release_cached();
                        a.malloc(size, stream, pool)
                    } else if a.config().follow_refusals {
                        let collections = a.gc_releasing_requests;
                        let got = a.malloc_refused(size, stream, pool);
                        // Where garbage collection made the release, no refusal was needed to explain it.
                        if a.gc_releasing_requests == collections {
                            self.out.refusals_followed += 1;
                        }
                        got
                    } else {
                        a.malloc(size, stream, pool)
                    }
                } else {
                    a.malloc(size, stream, pool)
                };
                match got {
                    Some(b) => self.blocks[id as usize] = b,
                    // Stopped short of the last resort: the caller goes on with it.
                    None if a.is_pending() => {}
                    None => self.fail(event, size),
                }
            }
            Op::Released { .. } => self.released = true,
            Op::Free { id, .. } => {
                let b = std::mem::replace(&mut self.blocks[id as usize], allocator::NIL);
                if b != allocator::NIL {
                    a.free(b);
                }
            }
            Op::EmptyCache { .. } => {
                self.out.empty_caches += 1;
                a.release_cached()
            }
            Op::Failed { size, stream, pool, event } => {
                let (stream, pool) = (stream as u64, w.pool(pool));
                // The request that raised the OOM; if it fits here it stays held (its free is not in the trace).
                let served = a.malloc(size, stream, pool).is_some();
                self.out.oom_request_fits = Some(self.out.oom_request_fits.unwrap_or(true) && served);
                if !served {
                    self.fail(event, size);
                }
            }
        }
    }

    /// Op `i`, simulated, and what it did to the default large pool written down in `rec`.
    fn step_recorded(&mut self, i: usize, rec: &mut Recording) {
        let (allocated, misses) = (self.a.allocated, self.a.misses);
        let in_pool = |s: &Self, id: u32| {
            let b = s.blocks[id as usize];
            b != allocator::NIL && s.a.block_pool(b) == rec.pool
        };
        let freed = matches!(self.w.ops[i], Op::Free { id, .. } if in_pool(self, id));
        self.step(i);
        let large = freed || matches!(self.w.ops[i], Op::Alloc { id, .. } if in_pool(self, id));
        if large {
            rec.allocated_now += self.a.allocated as i64 - allocated as i64;
            rec.pass.tail = rec.pass.tail.max(rec.allocated_now);
            // A request of the pool that no cached block served made or released memory: not the pool's alone.
            rec.clean &= self.a.misses == misses;
        } else {
            let before = std::mem::replace(&mut rec.pass.tail, i64::MIN);
            rec.pass.others.push(((i - rec.start) as u32, before, rec.allocated_now));
        }
    }

    /// Simulates the window `[start, end)` leaving out the default large pool's requests and frees, which `pass`
    /// says leave that pool as they find it: every other pool's, and the peak allocated, as op by op. Where a request
    /// of another pool would release every pool's cache, the large pool's ops before it are simulated first and the
    /// window goes on op by op from there. Returns where it stopped.
    fn by_pool(&mut self, start: usize, end: usize, pass: &PoolPass) -> usize {
        self.a.guard = true;
        let mut peak = self.a.peak_allocated;
        let with_large = |allocated: u64, large: i64| (allocated as i64).saturating_add(large).max(0) as u64;
        for (j, &(k, before, at)) in pass.others.iter().enumerate() {
            let o = start + k as usize;
            peak = peak.max(with_large(self.a.allocated, before));
            self.step(o);
            if self.a.is_pending() {
                self.a.guard = false;
                // The ops left out, in order (they touch their pool alone, so only the order within it counts);
                // the peaks they would reach with the other pools as they stand now are not the run's.
                let peak = peak.max(self.a.peak_allocated);
                let mut others = pass.others[..j].iter().map(|x| x.0).peekable();
                for q in 0..k {
                    if others.next_if_eq(&q).is_none() {
                        self.step(start + q as usize);
                    }
                }
                self.a.peak_allocated = peak;
                self.a.at_op(o as u32);
                match self.a.resume() {
                    Some(b) => {
                        if let Op::Alloc { id, .. } = self.w.ops[o] {
                            self.blocks[id as usize] = b;
                        }
                    }
                    None => {
                        if let Op::Alloc { size, event, stack, .. } = self.w.ops[o] {
                            let size = match (self.edit)(stack, size) {
                                Edit::Resize(s) => s,
                                _ => size,
                            };
                            self.fail(event, size);
                        }
                    }
                }
                self.out.pool_passes_stopped += 1;
                return o + 1;
            }
            peak = peak.max(with_large(self.a.allocated, at));
        }
        peak = peak.max(with_large(self.a.allocated, pass.tail));
        self.a.guard = false;
        self.a.peak_allocated = peak.max(self.a.peak_allocated);
        let left_out = (end - start - pass.others.len()) as u64;
        self.out.ops_skipped += left_out;
        self.out.ops_passed_over += left_out;
        end
    }
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

/// The allocator's layout at an op, as [`Memo::state`] gives it.
type State = (u32, u32);

/// Where a window that gives back all it takes (see [`passes`]) takes a simulation.
enum Go {
    /// Past its end: one of its kind, simulated from the same state, left the allocator as it found it.
    PassOver(usize),
    /// Through it without the default large pool's ops, which one of its kind, simulated from the same layout of
    /// that pool, left as it found it: the key of that [`PoolPass`], and where the window ends.
    ByPool((u32, u32), usize),
}

/// What a window's ops did to the default large pool, simulated from one layout of it that they left as they found
/// it, every request of it served from its cache: from that layout they would again, whatever the other pools hold,
/// as a pool's requests touch no other pool but through new memory or a release of every cache.
struct PoolPass {
    /// The ops of the window that are not the pool's, each as its place in the window, then what the peak
    /// allocated needs of the pool's ops: the most the pool held since the last such op (`i64::MIN`: none of its
    /// ops between) and what it held at this one, less what it held at the window's start.
    others: Vec<(u32, i64, i64)>,
    /// The most it held after the last of them.
    tail: i64,
}

/// A window simulated op by op while what it does to the default large pool is written down.
struct Recording {
    start: usize,
    end: usize,
    kind: u32,
    /// The pool, its state at the window's start, and the counters then (caches released, failures).
    pool: u16,
    from: u32,
    counters: (u64, usize),
    pass: PoolPass,
    allocated_now: i64,
    /// Every request of the pool so far was served from its cache.
    clean: bool,
}

/// Passes over a window that gives back all it takes (see [`passes`]) where one of its kind, simulated from the
/// same state, left the allocator as it found it: the allocator is deterministic, so this one would too, and it
/// reaches no peak the first did not. Else, where one of its kind left the default large pool's layout as it found
/// it, the window is simulated without that pool's ops (a batch carried from one step to the next keeps the other
/// pools' states from coming again, but not the large pool's).
struct Memo<'w> {
    passes: &'w [passes::Pass],
    /// The next window, and where it starts.
    next: usize,
    next_start: usize,
    /// The window being simulated: where it ends, its kind, the state it started from and the counters then.
    open: Option<(usize, u32, State, [u64; 5])>,
    /// The layouts met (the whole allocator's or one pool's), found by their hash.
    layouts: Vec<Vec<[u64; 6]>>,
    by_hash: FxHashMap<u64, Vec<u32>>,
    /// (state, kind) of the windows that left a state as they found it.
    unchanged: rustc_hash::FxHashSet<(State, u32)>,
    /// The large pool's part of windows, by (the pool's state, kind).
    pool_passes: FxHashMap<(u32, u32), PoolPass>,
    recording: Option<Recording>,
    /// The state at an op already taken (a window's end is often the next one's start).
    here: Option<(usize, State)>,
    /// The large pool, its change count and its state when its layout was last taken.
    pool_known: Option<(u16, u64, u32)>,
    /// Blocks the layouts may still go over, blocks of layouts that may still be kept, and ops of pool passes.
    budget: u64,
    room: u64,
    pool_room: u64,
}

impl<'w> Memo<'w> {
    /// For a workload of `ops` ops: a few passes over the blocks per op are spent comparing layouts, a quarter
    /// block per op kept (a workload whose states never come again would otherwise keep every one), and half an op
    /// of pool passes per op.
    fn new(passes: &'w [passes::Pass], ops: u64) -> Memo<'w> {
        Memo {
            passes,
            next: 0,
            next_start: passes.first().map_or(usize::MAX, |p| p.start as usize),
            open: None,
            layouts: Vec::new(),
            by_hash: FxHashMap::default(),
            unchanged: Default::default(),
            pool_passes: FxHashMap::default(),
            recording: None,
            here: None,
            pool_known: None,
            budget: 4 * ops,
            room: ops / 4,
            pool_room: ops / 2,
        }
    }

    /// Whether op `i` starts or ends a window (or one was passed by a skip).
    #[inline]
    fn due(&self, i: usize) -> bool {
        i >= self.next_start || self.open.is_some_and(|(end, ..)| i >= end)
    }

    /// A layout's index among those met; `None` once the budget is spent, or a new one finds no room.
    fn intern(&mut self, layout: Vec<[u64; 6]>) -> Option<u32> {
        self.budget = self.budget.saturating_sub(layout.len() as u64);
        let mut h = rustc_hash::FxHasher::default();
        std::hash::Hash::hash(&layout, &mut h);
        let h = std::hash::Hasher::finish(&h);
        let met = self.by_hash.get(&h).and_then(|ids| ids.iter().find(|&&s| self.layouts[s as usize] == layout));
        match met {
            Some(&s) => Some(s),
            None if layout.len() as u64 <= self.room => {
                self.room -= layout.len() as u64;
                self.layouts.push(layout);
                let s = self.layouts.len() as u32 - 1;
                self.by_hash.entry(h).or_default().push(s);
                Some(s)
            }
            None => None,
        }
    }

    /// The state of the allocator at op `i`: the default large pool's layout and the other pools', each as an
    /// index into the layouts met (the large pool's alone decides what its own requests do).
    fn state(&mut self, i: usize, a: &Allocator) -> Option<State> {
        if let Some((at, s)) = self.here {
            if at == i {
                return Some(s);
            }
        }
        if self.budget == 0 {
            return None;
        }
        // The large pool's layout is taken again only where it may have changed: a window simulated without its ops
        // leaves it untouched.
        let pool = a.default_pool(false);
        let known = pool.and_then(|p| self.pool_known.filter(|k| (k.0, k.1) == (p, a.pool_changes(p))).map(|k| k.2));
        let (large, rest) = a.layout_parts(pool.unwrap_or(u16::MAX), known.is_none());
        let large = match known {
            Some(s) => s,
            None => self.intern(large)?,
        };
        if let Some(p) = pool {
            self.pool_known = Some((p, a.pool_changes(p), large));
        }
        let s = (large, self.intern(rest)?);
        self.here = Some((i, s));
        Some(s)
    }

    /// At op `i`: where to go on from, if the window starting here can be passed over or simulated in part.
    fn at(&mut self, i: usize, a: &Allocator, failures: usize, released: bool) -> Option<Go> {
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
        if let Some(rec) = self.recording.take_if(|r| i >= r.end) {
            let kept = rec.end == i
                && rec.clean
                && rec.counters == (a.cache_releases, failures)
                && rec.pass.others.len() as u64 <= self.pool_room
                && a.default_pool(false) == Some(rec.pool)
                && self.state(i, a).map(|s| s.0) == Some(rec.from);
            if kept {
                self.pool_room -= rec.pass.others.len() as u64;
                self.pool_passes.insert((rec.from, rec.kind), rec.pass);
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
        let (end, kind) = (pass.end as usize, pass.kind);
        let state = self.state(i, a)?;
        if self.unchanged.contains(&(state, kind)) {
            // The state is the same at its end.
            self.here = Some((end, state));
            return Some(Go::PassOver(end));
        }
        self.open = Some((end, kind, state, counters));
        let pool = a.default_pool(false)?;
        let from = state.0;
        if self.pool_passes.contains_key(&(from, kind)) {
            return Some(Go::ByPool((from, kind), end));
        }
        if self.pool_room > 0 {
            self.recording = Some(Recording {
                start: i,
                end,
                kind,
                pool,
                from,
                counters: (a.cache_releases, failures),
                pass: PoolPass { others: Vec::new(), tail: i64::MIN },
                allocated_now: 0,
                clean: true,
            });
        }
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
