//! The requests and frees of a device's trace, in order, as a simulation replays them: what the program asked
//! of the allocator, separated from where torch put it.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::timeline::replay::{Replay, State};
use crate::timeline::stacks::StackId;
use crate::timeline::{Action, BlockState, DeviceTimeline, PoolKind};

use super::allocator::{Allocator, Config};

/// One thing the program did to the allocator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// A request of `size` bytes (the caller's size) from `stack`; `id` names it for its free. Streams are ranks
    /// (see [`Workload::streams`]).
    Alloc {
        id: u32,
        size: u64,
        stream: u32,
        pool: PoolRef,
        event: u32,
        stack: StackId,
    },
    Free {
        id: u32,
        event: u32,
    },
    /// `torch.cuda.empty_cache()` (segments released with no request waiting for the memory).
    EmptyCache {
        event: u32,
    },
    /// Segments released just before a new one was made: either the driver refused the next request's segment
    /// and the allocator freed its cache to retry, or the program emptied the cache. The simulation tells which
    /// at the next request: if the cache could have served it, the program did.
    Released {
        event: u32,
    },
    /// The request that raised out-of-memory (rounded size, as the trace records it).
    Failed {
        size: u64,
        stream: u32,
        pool: PoolRef,
        event: u32,
    },
}

/// A request's pool as an index into [`Workload::pools`] (0: the default pools), so that an op takes 32 bytes: a
/// 1M-entry trace's ops are written once and read by every pass over them.
pub type PoolRef = u32;

impl Op {
    pub fn event(&self) -> u32 {
        match *self {
            Op::Alloc { event, .. }
            | Op::Free { event, .. }
            | Op::EmptyCache { event }
            | Op::Released { event }
            | Op::Failed { event, .. } => event,
        }
    }
}

/// What a what-if does to one recorded request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Edit {
    Keep,
    /// The request is not made (nor its free).
    Drop,
    /// The request asks for this many bytes instead.
    Resize(u64),
}

/// A block live when the trace starts: `(address, size, allocated)` per block of each segment.
#[derive(Clone, Debug)]
pub struct StartSegment {
    pub addr: u64,
    pub stream: u64,
    pub pool: (i64, i64),
    pub small: bool,
    pub expandable: bool,
    pub blocks: Vec<(u64, u64, bool)>,
}

/// The program's requests, plus the allocator's state where the trace begins.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub ops: Vec<Op>,
    /// Requests are numbered from here (the lower ids are the blocks live at the start, in `start` order).
    pub first_id: u32,
    pub start: Vec<StartSegment>,
    /// The trace begins mid-run: the start is the state rebuilt from the file, not an empty device.
    pub rebuilt_start: bool,
    /// Addresses the trace gave new segments, by size, in order (see [`Allocator::set_hints`]).
    pub segment_addresses: std::sync::Arc<FxHashMap<u64, Vec<u64>>>,
    /// The driver gave the trace's new segments falling addresses, on the whole (the rank correlation of addresses
    /// with their order not above zero); with fewer than two, taken as CUDA's usual downward order.
    pub addresses_descend: bool,
    /// The trace's streams in the order of their handles: an op's or segment's stream is its index here.
    pub streams: Vec<u64>,
    /// The pools the ops name (see [`PoolRef`]): the default pools' `(0, 0)` first, then each private pool's id.
    pub pools: Vec<(i64, i64)>,
    /// Frees of blocks the workload never saw allocated (skipped).
    pub unmatched_frees: usize,
    /// Ids in use: the start's and the requests'.
    ids: u32,
    /// Where the ops repeat, found on first use (every simulation of the workload shares it).
    repeats: std::sync::OnceLock<Vec<super::repeats::Repeat>>,
    /// The windows that give back all they take, found on first use.
    passes: std::sync::OnceLock<Vec<super::passes::Pass>>,
}

impl Workload {
    /// Reads the workload from a replayed trace (edits apply per request in the simulation:
    /// [`super::simulate_with`]).
    pub fn from_trace(replay: &Replay) -> Workload {
        let rebuilt_start = !replay.complete();
        let start_state = if rebuilt_start { replay.state_at(None) } else { State::default() };
        Workload::read(replay.device(), &start_state, rebuilt_start, false)
            .expect("read in full when not asked to stop")
    }

    /// The workload of a trace that starts on an empty device, read before its replay says whether it does. Equal
    /// to [`Workload::from_trace`] of a replay that finds the trace complete. `None` where the trace shows it is not:
    /// at the first free of a block it did not allocate (a ring buffer that wrapped), or at its end where a block
    /// live in the file's state was not allocated in it (recording started after the model was built). Segments
    /// made before the trace and holding nothing at its end are not looked for: the replay tells those.
    pub fn from_empty_start(dev: &DeviceTimeline) -> Option<Workload> {
        Workload::read(dev, &State::default(), false, true)
    }

    fn read(
        dev: &DeviceTimeline,
        start_state: &State,
        rebuilt_start: bool,
        empty_start_only: bool,
    ) -> Option<Workload> {
        let mut w = Workload { rebuilt_start, ..Default::default() };
        let mut streams: Vec<u64> = dev.event_attrs.all().iter().map(|a| a.stream).collect();
        streams.extend(start_state.segments.values().map(|s| s.stream));
        streams.sort_unstable();
        streams.dedup();
        let rank: FxHashMap<u64, u64> = streams.iter().enumerate().map(|(i, &s)| (s, i as u64)).collect();
        w.streams = streams;
        w.pools.push((0, 0));
        let mut pool_ref: FxHashMap<(i64, i64), PoolRef> = FxHashMap::default();
        let mut pool_of = |id: Option<(i64, i64)>, pools: &mut Vec<(i64, i64)>| -> PoolRef {
            match id {
                None | Some((0, 0)) => 0,
                Some(id) => *pool_ref.entry(id).or_insert_with(|| {
                    pools.push(id);
                    pools.len() as PoolRef - 1
                }),
            }
        };
        // An event's stream and pool, by its attributes' index: a trace has a handful, its events a million.
        let attrs = dev.event_attrs.all();
        let attr_stream: Vec<u32> = attrs.iter().map(|a| rank[&a.stream] as u32).collect();
        let mut attr_pool: Vec<Option<PoolRef>> = vec![None; attrs.len()];
        let mut stream_and_pool = |e: &crate::timeline::Event, pools: &mut Vec<(i64, i64)>| -> (u32, PoolRef) {
            // As the table reads an index it does not hold: the defaults.
            let a = Some(e.attrs_id() as usize).filter(|&a| a < attrs.len()).unwrap_or(0);
            let pool = *attr_pool[a].get_or_insert_with(|| pool_of(attrs[a].pool_id(), pools));
            (attr_stream[a], pool)
        };
        let mut addresses: FxHashMap<u64, Vec<u64>> = FxHashMap::default();
        let mut in_order: Vec<u64> = Vec::new();
        let mut live: FxHashMap<u64, u32> = FxHashMap::default();
        let mut next_id = 0u32;
        for seg in start_state.segments_sorted() {
            let mut blocks = Vec::new();
            for (addr, b) in start_state.segment_blocks(seg.addr) {
                let held = b.state != BlockState::Inactive;
                if held {
                    live.insert(addr, next_id);
                    next_id += 1;
                }
                blocks.push((addr, b.size, held));
            }
            let small = match seg.kind {
                Some(k) => k == PoolKind::Small,
                None => seg.size == super::allocator::SMALL_BUFFER && !seg.expandable,
            };
            w.start.push(StartSegment {
                addr: seg.addr,
                stream: rank[&seg.stream],
                pool: seg.pool_id,
                small,
                expandable: seg.expandable,
                blocks,
            });
        }
        w.first_id = next_id;
        let events = &dev.events;
        // At most one op per event: reserved once, the ops are never moved as they grow (a 1M-entry trace's are
        // tens of MB).
        w.ops.reserve_exact(events.len());
        let mut i = 0;
        while i < events.len() {
            let e = &events[i];
            let at = i as u32;
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, next_id);
                    let (stream, pool) = stream_and_pool(e, &mut w.pools);
                    w.ops.push(Op::Alloc { id: next_id, size: e.size, stream, pool, event: at, stack: e.stack });
                    next_id += 1;
                }
                Action::FreeCompleted => match live.remove(&e.addr) {
                    Some(id) => w.ops.push(Op::Free { id, event: at }),
                    None if empty_start_only => return None,
                    None => w.unmatched_frees += 1,
                },
                Action::SegmentAlloc => {
                    addresses.entry(e.size).or_default().push(e.addr);
                    in_order.push(e.addr);
                }
                Action::SegmentFree | Action::SegmentUnmap => {
                    // A run of releases: before a new segment, the allocator's retry or the program's empty_cache
                    // (told apart in the simulation); before the OOM, the allocator's last resort, which the
                    // simulation does by itself; otherwise the program's empty_cache.
                    let mut j = i;
                    while j < events.len() && matches!(events[j].action, Action::SegmentFree | Action::SegmentUnmap) {
                        j += 1;
                    }
                    let next = events[j..].iter().find(|e| !matches!(e.action, Action::Snapshot | Action::Annotate));
                    match next.map(|n| n.action) {
                        Some(Action::SegmentAlloc | Action::SegmentMap) => w.ops.push(Op::Released { event: at }),
                        Some(Action::Oom) => {}
                        _ => w.ops.push(Op::EmptyCache { event: at }),
                    }
                    i = j;
                    continue;
                }
                Action::Oom => {
                    let (stream, pool) = stream_and_pool(e, &mut w.pools);
                    w.ops.push(Op::Failed { size: e.size, stream, pool, event: at })
                }
                Action::FreeRequested if empty_start_only && !live.contains_key(&e.addr) => return None,
                Action::SegmentMap
                | Action::FreeRequested
                | Action::Snapshot
                | Action::Annotate
                | Action::WorkspaceSnapshot
                | Action::Unknown => {}
            }
            i += 1;
        }
        w.segment_addresses = std::sync::Arc::new(addresses);
        w.addresses_descend = descending(&in_order);
        w.ids = next_id;
        let held_before =
            |b: &crate::timeline::Block| b.state != BlockState::Inactive && !live.contains_key(&b.address);
        if empty_start_only && dev.segments.iter().flat_map(|s| &s.blocks).any(held_before) {
            return None;
        }
        Some(w)
    }

    /// A workload of these ops on an empty device (ids numbered from 0).
    pub fn from_ops(ops: Vec<Op>) -> Workload {
        let ids = ops.iter().filter_map(|o| if let Op::Alloc { id, .. } = o { Some(id + 1) } else { None }).max();
        Workload { ops, ids: ids.unwrap_or(0), pools: vec![(0, 0)], ..Default::default() }
    }

    /// The stretches where a window of ops repeats (see [`super::repeats`]).
    pub fn repeats(&self) -> &[super::repeats::Repeat] {
        self.repeats.get_or_init(|| super::repeats::find(&self.ops, self.first_id))
    }

    /// Where the ops repeat and the windows that give back all they take, found on two cores where not yet found
    /// (simulations need both, and each search is a pass over the ops).
    pub fn structure(&self) -> (&[super::repeats::Repeat], &[super::passes::Pass]) {
        if self.repeats.get().is_none() || self.passes.get().is_none() {
            std::thread::scope(|s| {
                let passes = crate::threads::beside(s, || {
                    self.passes();
                });
                self.repeats();
                passes();
            });
        }
        (self.repeats(), self.passes())
    }

    /// The pool an op names (see [`PoolRef`]); the default pools for an index no pool has.
    pub fn pool(&self, p: PoolRef) -> (i64, i64) {
        self.pools.get(p as usize).copied().unwrap_or((0, 0))
    }

    /// The windows that give back all they take (see [`super::passes`]).
    pub fn passes(&self) -> &[super::passes::Pass] {
        self.passes.get_or_init(|| super::passes::find(&self.ops, self.first_id))
    }

    /// The requests in force: how many ids the workload uses.
    pub fn ids(&self) -> usize {
        self.ids as usize
    }

    /// An allocator holding the starting state; returns it with the block of each live start id.
    pub fn start_allocator(&self, cfg: Config) -> (Allocator, Vec<u32>) {
        // Replaying the run as it was, new segments take the addresses the driver gave them, so equal free blocks
        // are told apart as they were on the GPU. Under another setting the segments differ and a recorded address
        // would set one segment's place among fresh ones at random: all are fresh, in the driver's order.
        let replaying = cfg.follow_refusals;
        let mut a = Allocator::new(cfg);
        if replaying {
            a.set_hints(std::sync::Arc::clone(&self.segment_addresses));
        }
        a.set_address_order(self.addresses_descend);
        let mut blocks = Vec::with_capacity(self.ids());
        for s in &self.start {
            let pool = a.pool_for(s.pool, s.small);
            blocks.extend(a.place_segment(s.addr, s.stream, pool, s.expandable, &s.blocks));
        }
        (a, blocks)
    }
}

/// Whether addresses given in this order go down on the whole: the sign of their rank correlation with the order
/// (the small pool's segments and reused ranges interleave, so neighbours alone mislead).
fn descending(addrs: &[u64]) -> bool {
    // A range the driver hands back is ranked where it first came: a repeat would only add ties.
    let mut seen = FxHashSet::default();
    let addrs: Vec<u64> = addrs.iter().copied().filter(|a| seen.insert(*a)).collect();
    let n = addrs.len();
    if n < 2 {
        return true;
    }
    let mut by_addr: Vec<usize> = (0..n).collect();
    by_addr.sort_unstable_by_key(|&i| addrs[i]);
    let mean = (n - 1) as f64 / 2.0;
    let covariance: f64 = by_addr.iter().enumerate().map(|(rank, &i)| (rank as f64 - mean) * (i as f64 - mean)).sum();
    covariance <= 0.0
}

#[cfg(test)]
mod tests {
    use super::descending;

    #[test]
    fn the_drivers_address_order_is_read_on_the_whole_not_from_neighbours() {
        // Large segments going down, each followed by a small-pool segment from a range above them: half the
        // neighbouring pairs rise, the order falls.
        let mut addrs = Vec::new();
        for i in 0..10u64 {
            addrs.push(0x7f00_0000_0000 - i * 0x1000_0000);
            addrs.push(0x7f80_0000_0000 - i * 0x20_0000);
        }
        assert!(descending(&addrs));
        let rising: Vec<u64> = (0..10u64).map(|i| 0x7000_0000_0000 + i * 0x1000_0000).collect();
        assert!(!descending(&rising));
        assert!(descending(&[]), "with nothing to go by, CUDA's usual order");
        // A range handed back again and again does not outvote the order the fresh ones came in.
        let mut reused = rising.clone();
        reused.extend(std::iter::repeat_n(0x7000_0000_0000, 30));
        assert!(!descending(&reused));
        assert!(descending(&[5, 5, 5]), "one address: nothing to go by");
    }
}
