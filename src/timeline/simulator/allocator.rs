//! A model of PyTorch's CUDA caching allocator that decides placement itself.
//!
//! The rules are those of `c10/cuda/CUDACachingAllocator.cpp` (torch 2.x), as facts: requests are rounded to 512
//! bytes (or to a power-of-two division under `roundup_power2_divisions`); requests up to 1 MiB come from the small
//! pool, whose segments are 2 MiB; larger ones from the large pool, with 20 MiB segments for requests under 10 MiB
//! and the request rounded up to 2 MiB above; a free block is chosen best fit per stream (smallest size, then lowest
//! address), refused when `max_split_size` says it is oversized; the remainder is split off when worth keeping; freed
//! blocks merge with free neighbours. When no cached block fits, a new segment is asked for; when that fails the
//! allocator frees oversized cached segments (`max_split_size`), then every unsplit cached segment, and retries;
//! only then is it out of memory. Expandable segments map 2 MiB (small) or 20 MiB (large) pages at the end of one
//! reserved range per stream and pool, and unmap whole free pages when the cache is emptied.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::timeline::replay::Rules;
use crate::timeline::{Action, PoolKind};

pub const MIN_BLOCK: u64 = 512;
pub const SMALL_SIZE: u64 = 1 << 20;
pub const SMALL_BUFFER: u64 = 2 << 20;
pub const LARGE_BUFFER: u64 = 20 << 20;
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
pub const ROUND_LARGE: u64 = 2 << 20;

/// The settings a simulation runs under.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Config {
    /// Rounding, splitting and expandable segments.
    pub rules: Rules,
    /// `garbage_collection_threshold` (a fraction of the cap; torch uses it only under a memory-fraction cap).
    pub gc_threshold: Option<f64>,
    /// The bytes the allocator may hold in segments: the memory-fraction cap, or what the device had for PyTorch.
    /// `None`: unlimited (every request fits).
    pub capacity: Option<u64>,
    /// `capacity` is a `set_per_process_memory_fraction` cap, checked before asking the driver, against the
    /// segment size the request would get.
    pub fraction_cap: bool,
    /// The device's memory, which sizes an expandable segment's address range (1.125 ×, as torch reserves).
    pub device_total: Option<u64>,
    /// Where the trace shows the driver refusing a new segment, refuse it too (replaying the run as it was);
    /// otherwise the capacity alone decides (what-ifs).
    pub follow_refusals: bool,
    /// Stop at the first request that finds no room, as the program would (torch raises there): for a question
    /// that only asks whether the run fits. Otherwise the run goes on past each failure, the request left out.
    pub stop_at_first_failure: bool,
}

impl Config {
    /// The size of a new segment for a rounded request (`get_allocation_size`).
    pub fn segment_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }
}

/// A change to the allocator's segments, as the trace would record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    pub action: Action,
    pub size: u64,
    /// The workload operation that caused it.
    pub op: u32,
}

/// No block.
pub const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Blk {
    addr: u64,
    size: u64,
    seg: u32,
    prev: u32,
    next: u32,
    allocated: bool,
    mapped: bool,
    /// The pool's free-block search count when the block was cached (garbage collection ages by it).
    gc_base: u64,
}

#[derive(Clone, Debug)]
struct Seg {
    base: u64,
    stream: u64,
    pool: u16,
    expandable: bool,
}

/// One pool: a `(private pool id, small or large)` pair. Free blocks are ordered as torch orders them: by stream,
/// then size, then address; an expandable segment's unmapped ranges by stream, then address. Each key is packed in
/// one `u128` (stream rank, size, address), which a tree compares in one step where a tuple takes four: the
/// simulation is mostly these trees.
#[derive(Clone, Debug)]
struct Pool {
    small: bool,
    private: bool,
    blocks: BTreeMap<u128, u32>,
    unmapped: BTreeMap<u128, u32>,
    free_calls: u64,
    /// Calls that may have changed the pool's blocks: a layout taken when it was last this count still holds.
    changes: u64,
}

/// A free block's key: (stream rank, size, address). Streams are ranks (the workload numbers them in the order of
/// their handles), sizes under 2^48.
fn pack(stream: u64, size: u64, addr: u64) -> u128 {
    ((stream as u128) << 112) | ((size as u128) << 64) | addr as u128
}

fn key_stream(k: u128) -> u64 {
    (k >> 112) as u64
}

fn key_size(k: u128) -> u64 {
    ((k >> 64) as u64) & ((1 << 48) - 1)
}

/// An unmapped range's key: (stream rank, address).
fn upack(stream: u64, addr: u64) -> u128 {
    ((stream as u128) << 64) | addr as u128
}

/// The allocator's state and counters.
#[derive(Clone, Debug)]
pub struct Allocator {
    cfg: Config,
    blks: Vec<Blk>,
    spare: Vec<u32>,
    segs: Vec<Seg>,
    pools: Vec<Pool>,
    pool_index: FxHashMap<((i64, i64), bool), u16>,
    /// The default pools' indices, large and small.
    default_pools: [Option<u16>; 2],
    /// Live segment ranges by base, to keep hinted addresses from overlapping.
    live_ranges: std::collections::BTreeMap<u64, u64>,
    next_base: u64,
    /// Fresh segments take addresses downwards from here, below every segment placed before them, where the driver
    /// gave the trace's segments falling addresses (as CUDA's usually does): equal free blocks are told apart by
    /// address, the lower first, so the newest segment is tried first as on the GPU.
    next_down: u64,
    addresses_descend: bool,
    /// Addresses the recorded trace gave new segments, by size, in order: a new segment of that size takes the
    /// next, so ties between equal free blocks break as they did on the GPU.
    hints: std::sync::Arc<FxHashMap<u64, Vec<u64>>>,
    /// How many of each size's hints were taken.
    hints_taken: FxHashMap<u64, usize>,
    pub reserved: u64,
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_reserved_op: Option<u32>,
    pub peak_allocated: u64,
    pub segment_events: Vec<SegmentEvent>,
    /// Keep segment events (validation needs them; what-ifs do not).
    pub record_events: bool,
    /// Requests at which garbage collection released segments.
    pub gc_releasing_requests: usize,
    /// Segments made, released, mapped or unmapped so far (each moves where the next fresh segment goes).
    pub segment_changes: u64,
    /// Requests no cached block served, and times every pool's cache was released: a pool's own requests touch
    /// no other pool but through these.
    pub misses: u64,
    pub cache_releases: u64,
    /// While set, a request that would release every pool's cache to retry stops short of it, left pending (see
    /// [`Allocator::resume`]): a simulation that has not kept the other pools up to date brings them up first.
    pub(super) guard: bool,
    pending: Option<Pending>,
    op: u32,
}

/// A request stopped before the allocator's last resort: its pool and stream, its rounded size and segment size.
#[derive(Clone, Copy, Debug)]
struct Pending {
    pool: u16,
    stream: u64,
    size: u64,
    alloc_size: u64,
}

const SYNTHETIC_BASE: u64 = 1 << 52;
/// Above every address a recorded trace or the ascending synthetic range (expandable segments' reservations) uses.
const DESCENDING_TOP: u64 = 1 << 60;

impl Allocator {
    pub fn new(cfg: Config) -> Allocator {
        Allocator {
            cfg,
            blks: Vec::new(),
            spare: Vec::new(),
            segs: Vec::new(),
            pools: Vec::new(),
            pool_index: FxHashMap::default(),
            default_pools: [None; 2],
            live_ranges: Default::default(),
            next_base: SYNTHETIC_BASE,
            next_down: DESCENDING_TOP,
            addresses_descend: false,
            hints: Default::default(),
            hints_taken: FxHashMap::default(),
            reserved: 0,
            allocated: 0,
            peak_reserved: 0,
            peak_reserved_op: None,
            peak_allocated: 0,
            segment_events: Vec::new(),
            record_events: false,
            gc_releasing_requests: 0,
            segment_changes: 0,
            misses: 0,
            cache_releases: 0,
            guard: false,
            pending: None,
            op: 0,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn set_hints(&mut self, hints: std::sync::Arc<FxHashMap<u64, Vec<u64>>>) {
        self.hints = hints;
        self.hints_taken.clear();
    }

    /// The operation the next changes are charged to.
    pub fn at_op(&mut self, op: u32) {
        self.op = op;
    }

    pub fn pool_for(&mut self, pool_id: (i64, i64), small: bool) -> u16 {
        // Nearly every request is in the default pools: index them without hashing.
        if pool_id == (0, 0) {
            if let Some(&p) = self.default_pools[small as usize].as_ref() {
                return p;
            }
        }
        let private = pool_id != (0, 0);
        let n = self.pools.len() as u16;
        let p = *self.pool_index.entry((pool_id, small)).or_insert_with(|| {
            self.pools.push(Pool {
                small,
                private,
                blocks: BTreeMap::new(),
                unmapped: BTreeMap::new(),
                free_calls: 0,
                changes: 0,
            });
            n
        });
        if pool_id == (0, 0) {
            self.default_pools[small as usize] = Some(p);
        }
        p
    }

    fn new_blk(&mut self, b: Blk) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.blks[i as usize] = b;
                i
            }
            None => {
                self.blks.push(b);
                (self.blks.len() - 1) as u32
            }
        }
    }

    /// A new free block of `size` at `addr`, linked right after `b` in its segment.
    fn link_after(&mut self, b: u32, addr: u64, size: u64, mapped: bool) -> u32 {
        let k = self.blks[b as usize].clone();
        let n =
            self.new_blk(Blk { addr, size, seg: k.seg, prev: b, next: k.next, allocated: false, mapped, gc_base: 0 });
        if k.next != NIL {
            self.blks[k.next as usize].prev = n;
        }
        self.blks[b as usize].next = n;
        n
    }

    /// A new free block of `size` at `addr`, linked right before `b` in its segment.
    fn link_before(&mut self, b: u32, addr: u64, size: u64, mapped: bool) -> u32 {
        let k = self.blks[b as usize].clone();
        let n =
            self.new_blk(Blk { addr, size, seg: k.seg, prev: k.prev, next: b, allocated: false, mapped, gc_base: 0 });
        if k.prev != NIL {
            self.blks[k.prev as usize].next = n;
        }
        self.blks[b as usize].prev = n;
        n
    }

    fn key(&self, b: u32) -> u128 {
        let k = &self.blks[b as usize];
        pack(self.segs[k.seg as usize].stream, k.size, k.addr)
    }

    fn ukey(&self, b: u32) -> u128 {
        let k = &self.blks[b as usize];
        upack(self.segs[k.seg as usize].stream, k.addr)
    }

    fn pool_of(&self, b: u32) -> usize {
        self.segs[self.blks[b as usize].seg as usize].pool as usize
    }

    fn cache(&mut self, b: u32) {
        let p = self.pool_of(b);
        self.blks[b as usize].gc_base = self.pools[p].free_calls;
        let k = self.key(b);
        self.pools[p].blocks.insert(k, b);
    }

    fn uncache(&mut self, b: u32) {
        let p = self.pool_of(b);
        let k = self.key(b);
        self.pools[p].blocks.remove(&k);
    }

    fn event(&mut self, action: Action, size: u64) {
        self.segment_changes += 1;
        if self.record_events {
            self.segment_events.push(SegmentEvent { action, size, op: self.op });
        }
    }

    fn grow(&mut self, bytes: u64) {
        self.reserved += bytes;
        if self.reserved > self.peak_reserved {
            self.peak_reserved = self.reserved;
            self.peak_reserved_op = Some(self.op);
        }
    }

    /// An address for a new segment: the recorded one for its size when it is free, else a fresh one.
    fn segment_base(&mut self, size: u64) -> u64 {
        while let Some(&a) = self.hints.get(&size).and_then(|q| {
            let taken = self.hints_taken.entry(size).or_default();
            *taken += 1;
            q.get(*taken - 1)
        }) {
            let clear_before = self.live_ranges.range(..=a).next_back().is_none_or(|(&b, &s)| b + s <= a);
            let clear_after = self.live_ranges.range(a..).next().is_none_or(|(&b, _)| b >= a + size);
            if clear_before && clear_after && a < SYNTHETIC_BASE {
                self.next_down = self.next_down.min(a);
                return a;
            }
        }
        if self.addresses_descend {
            // Below every segment placed so far, as a driver handing out falling addresses puts a new one.
            if let Some(a) = self.next_down.checked_sub(size.div_ceil(ROUND_LARGE) * ROUND_LARGE + ROUND_LARGE) {
                self.next_down = a;
                return a;
            }
        }
        let a = self.next_base;
        self.next_base += size.div_ceil(ROUND_LARGE) * ROUND_LARGE + ROUND_LARGE;
        a
    }

    /// New segments' addresses go down (true) or up, as the driver gave the trace's.
    pub fn set_address_order(&mut self, descend: bool) {
        self.addresses_descend = descend;
    }

    fn add_segment(&mut self, base: u64, size: u64, stream: u64, pool: u16, expandable: bool) -> u32 {
        self.live_ranges.insert(base, size);
        self.segs.push(Seg { base, stream, pool, expandable });
        (self.segs.len() - 1) as u32
    }

    /// Puts a segment of the rebuilt starting state in place: its blocks `(address, size, allocated)` in address
    /// order. Returns the allocated blocks' ids in order.
    pub fn place_segment(
        &mut self,
        base: u64,
        stream: u64,
        pool: u16,
        expandable: bool,
        blocks: &[(u64, u64, bool)],
    ) -> Vec<u32> {
        let total: u64 = blocks.iter().map(|b| b.1).sum();
        self.pools[pool as usize].changes += 1;
        let seg = self.add_segment(base, total, stream, pool, expandable);
        self.next_base = self.next_base.max(base.saturating_add(total).min(SYNTHETIC_BASE));
        self.next_down = self.next_down.min(base);
        let mut prev = NIL;
        let mut held = Vec::new();
        for &(addr, size, allocated) in blocks {
            let b = self.new_blk(Blk { addr, size, seg, prev, next: NIL, allocated, mapped: true, gc_base: 0 });
            if prev != NIL {
                self.blks[prev as usize].next = b;
            }
            prev = b;
            if allocated {
                self.allocated += size;
                held.push(b);
            } else {
                self.cache(b);
            }
        }
        self.grow(total);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
        held
    }

    /// `malloc`: a block for a request of `size` bytes (the caller's size), or `None` when the allocator would
    /// have raised out-of-memory.
    pub fn malloc(&mut self, size: u64, stream: u64, pool_id: (i64, i64)) -> Option<u32> {
        self.malloc_with(size, stream, pool_id, false)
    }

    /// `malloc` where the driver is known to have refused the first new segment (the trace shows the allocator
    /// freeing its cache before making one): the first try fails whatever the capacity.
    pub fn malloc_refused(&mut self, size: u64, stream: u64, pool_id: (i64, i64)) -> Option<u32> {
        self.malloc_with(size, stream, pool_id, true)
    }

    /// Whether a cached block would serve the request as it stands.
    pub fn cache_serves(&mut self, size: u64, stream: u64, pool_id: (i64, i64)) -> bool {
        let size = self.cfg.rules.round(size);
        let pool = self.pool_for(pool_id, size <= SMALL_SIZE);
        self.pools[pool as usize].changes += 1;
        let calls = self.pools[pool as usize].free_calls;
        let found = self.get_free_block(pool, stream, size);
        self.pools[pool as usize].free_calls = calls;
        match found {
            Some(b) => {
                self.cache(b);
                true
            }
            None => false,
        }
    }

    fn malloc_with(&mut self, size: u64, stream: u64, pool_id: (i64, i64), refused: bool) -> Option<u32> {
        let size = self.cfg.rules.round(size);
        let small = size <= SMALL_SIZE;
        let pool = self.pool_for(pool_id, small);
        self.pools[pool as usize].changes += 1;
        let alloc_size = Config::segment_size(size);
        let mut found = self.get_free_block(pool, stream, size);
        if found.is_none() {
            self.misses += 1;
            let collected =
                self.cfg.fraction_cap && self.cfg.gc_threshold.is_some_and(|t| t > 0.0) && self.garbage_collect();
            // Segments the trace shows released before this request are garbage collection's where it releases
            // some here: the driver was not asked, so nothing says it refused. (Torch could also collect and then
            // be refused; the trace's run of releases does not say which, and the collector's reading is taken.)
            let refused = refused && !collected;
            if collected {
                self.gc_releasing_requests += 1;
            }
            if !refused {
                found = self.alloc_block(pool, stream, size, alloc_size);
            }
            if found.is_none() && self.release_available(pool, stream, size) {
                found = self.alloc_block(pool, stream, size, alloc_size);
            }
            if found.is_none() {
                if self.guard {
                    self.pending = Some(Pending { pool, stream, size, alloc_size });
                    return None;
                }
                self.release_cached();
                found = self.alloc_block(pool, stream, size, alloc_size);
            }
        }
        let b = found?;
        self.alloc_found(b, size, pool);
        Some(b)
    }

    /// Whether a request was stopped short of the last resort under [`Allocator::guard`].
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Goes on with the request left pending: releases every pool's cache and retries, as `malloc` would have.
    pub fn resume(&mut self) -> Option<u32> {
        let Pending { pool, stream, size, alloc_size } = self.pending.take()?;
        self.pools[pool as usize].changes += 1;
        self.release_cached();
        let b = self.alloc_block(pool, stream, size, alloc_size)?;
        self.alloc_found(b, size, pool);
        Some(b)
    }

    fn get_free_block(&mut self, pool: u16, stream: u64, size: u64) -> Option<u32> {
        let p = &mut self.pools[pool as usize];
        if self.cfg.fraction_cap && self.cfg.gc_threshold.is_some_and(|t| t > 0.0) {
            p.free_calls += 1;
        }
        let p = &self.pools[pool as usize];
        let mut it = p.blocks.range(pack(stream, size, 0)..).map(|(&k, &b)| (k, b));
        let mut cur = it.next()?;
        if key_stream(cur.0) != stream {
            return None;
        }
        let exp = |s: &Allocator, b: u32| s.segs[s.blks[b as usize].seg as usize].expandable;
        if exp(self, cur.1) {
            if self.cfg.rules.expandable {
                // Best fit counts an expandable block as the size it can grow to (itself and the unmapped range
                // after it), so a block at a segment's end may be passed over for a tighter one.
                let grows_to = |s: &Allocator, b: u32| {
                    let k = &s.blks[b as usize];
                    k.size
                        + if k.next != NIL && !s.blks[k.next as usize].mapped {
                            s.blks[k.next as usize].size
                        } else {
                            0
                        }
                };
                for next in it {
                    if !(exp(self, cur.1)
                        && key_stream(next.0) == stream
                        && grows_to(self, next.1) < grows_to(self, cur.1))
                    {
                        break;
                    }
                    cur = next;
                }
            } else {
                loop {
                    match it.next() {
                        Some(n) if key_stream(n.0) == stream && exp(self, n.1) => continue,
                        Some(n) if key_stream(n.0) == stream => {
                            cur = n;
                            break;
                        }
                        _ => return None,
                    }
                }
            }
        }
        if let Some(m) = self.cfg.rules.max_split_size {
            // An oversized block is not handed to a small request, nor to a large one it exceeds by 20 MiB.
            let found = key_size(cur.0);
            if size < m && found >= m || size >= m && found >= size + LARGE_BUFFER {
                return None;
            }
        }
        self.pools[pool as usize].blocks.remove(&cur.0);
        Some(cur.1)
    }

    fn alloc_block(&mut self, pool: u16, stream: u64, size: u64, alloc_size: u64) -> Option<u32> {
        if self.cfg.fraction_cap && self.cfg.capacity.is_some_and(|c| self.reserved + alloc_size > c) {
            return None;
        }
        if self.cfg.rules.expandable && !self.pools[pool as usize].private {
            return self.allocate_expandable(pool, stream, size);
        }
        if !self.cfg.fraction_cap && self.cfg.capacity.is_some_and(|c| self.reserved + alloc_size > c) {
            return None;
        }
        let base = self.segment_base(alloc_size);
        let seg = self.add_segment(base, alloc_size, stream, pool, false);
        let b = self.new_blk(Blk {
            addr: base,
            size: alloc_size,
            seg,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: true,
            gc_base: 0,
        });
        self.grow(alloc_size);
        self.event(Action::SegmentAlloc, alloc_size);
        Some(b)
    }

    fn alloc_found(&mut self, b: u32, size: u64, pool: u16) {
        let kind = if self.pools[pool as usize].small { PoolKind::Small } else { PoolKind::Large };
        let remaining = self.blks[b as usize].size - size;
        if self.cfg.rules.should_split(kind, size, remaining) {
            let addr = self.blks[b as usize].addr + size;
            let r = self.link_after(b, addr, remaining, true);
            self.blks[b as usize].size = size;
            self.cache(r);
        }
        let bb = &mut self.blks[b as usize];
        bb.allocated = true;
        self.allocated += bb.size;
        self.peak_allocated = self.peak_allocated.max(self.allocated);
    }

    /// Frees a block: it merges with free neighbours and returns to its pool.
    pub fn free(&mut self, b: u32) {
        if !self.blks[b as usize].allocated {
            return;
        }
        let p = self.pool_of(b);
        self.pools[p].changes += 1;
        let k = &mut self.blks[b as usize];
        k.allocated = false;
        self.allocated -= k.size;
        let (prev, next) = (k.prev, k.next);
        self.try_merge(b, prev);
        self.try_merge(b, next);
        self.cache(b);
    }

    /// A count that moves whenever the pool's blocks may have changed.
    pub fn pool_changes(&self, pool: u16) -> u64 {
        self.pools[pool as usize].changes
    }

    /// The block's size (its rounded size once allocated).
    pub fn block_size(&self, b: u32) -> u64 {
        self.blks[b as usize].size
    }

    pub fn block_addr(&self, b: u32) -> u64 {
        self.blks[b as usize].addr
    }

    /// Every block of every segment, as what decides the allocator's next moves: address, size, whether allocated
    /// and mapped, and its segment's stream, pool and kind; in address order. Two states with equal layouts (and
    /// equal counters, pools and settings) answer every request alike.
    pub fn layout(&self) -> Vec<[u64; 6]> {
        self.layout_parts(u16::MAX, false).1
    }

    /// [`Allocator::layout`] in two: the blocks of `pool` (left out, empty, unless `with_pool`), and the others'.
    pub fn layout_parts(&self, pool: u16, with_pool: bool) -> (Vec<[u64; 6]>, Vec<[u64; 6]>) {
        let mut dead = vec![false; self.blks.len()];
        for &s in &self.spare {
            dead[s as usize] = true;
        }
        let (mut mine, mut others) = (Vec::new(), Vec::with_capacity(self.blks.len() - self.spare.len()));
        for (b, _) in self.blks.iter().zip(&dead).filter(|(_, &d)| !d) {
            let s = &self.segs[b.seg as usize];
            let row = [
                b.addr,
                b.size,
                b.allocated as u64 | (b.mapped as u64) << 1 | (s.expandable as u64) << 2,
                s.base,
                s.stream,
                s.pool as u64,
            ];
            if s.pool == pool {
                if with_pool {
                    mine.push(row);
                }
            } else {
                others.push(row);
            }
        }
        // Blocks never overlap: the address alone orders them.
        mine.sort_unstable_by_key(|r| r[0]);
        others.sort_unstable_by_key(|r| r[0]);
        (mine, others)
    }

    /// The default (not private) pool of small or large requests, once made.
    pub fn default_pool(&self, small: bool) -> Option<u16> {
        self.default_pools[small as usize]
    }

    /// The pool a block belongs to.
    pub fn block_pool(&self, b: u32) -> u16 {
        self.pool_of(b) as u16
    }

    /// The pools made so far.
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NIL {
            return 0;
        }
        let s = &self.blks[src as usize];
        if s.allocated || s.mapped != self.blks[dst as usize].mapped {
            return 0;
        }
        let p = self.pool_of(src);
        if s.mapped {
            let k = self.key(src);
            self.pools[p].blocks.remove(&k);
        } else {
            let k = self.ukey(src);
            self.pools[p].unmapped.remove(&k);
        }
        let s = self.blks[src as usize].clone();
        if self.blks[dst as usize].prev == src {
            let d = &mut self.blks[dst as usize];
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.blks[s.prev as usize].next = dst;
            }
        } else {
            self.blks[dst as usize].next = s.next;
            if s.next != NIL {
                self.blks[s.next as usize].prev = dst;
            }
        }
        self.blks[dst as usize].size += s.size;
        self.spare.push(src);
        s.size
    }

    fn release_block(&mut self, b: u32) {
        self.uncache(b);
        let k = &self.blks[b as usize];
        let (size, base) = (k.size, k.addr);
        self.live_ranges.remove(&base);
        self.reserved -= size;
        self.spare.push(b);
        self.event(Action::SegmentFree, size);
    }

    /// With `max_split_size`, frees oversized cached segments of the stream: the smallest one big enough, or the
    /// largest ones until enough is freed.
    fn release_available(&mut self, pool: u16, stream: u64, size: u64) -> bool {
        let Some(m) = self.cfg.rules.max_split_size else { return false };
        let want = size.max(m);
        let p = &self.pools[pool as usize];
        if let Some((_, &b)) = p.blocks.range(pack(stream, want, 0)..).next().filter(|(&k, _)| key_stream(k) == stream)
        {
            let bk = &self.blks[b as usize];
            if !self.segs[bk.seg as usize].expandable && bk.prev == NIL && bk.next == NIL {
                self.release_block(b);
            }
            return true;
        }
        let largest: Vec<(u64, u32)> = p
            .blocks
            .range(pack(stream, 0, 0)..pack(stream, want, 0))
            .rev()
            .map(|(&k, &b)| (key_size(k), b))
            .take_while(|&(size, _)| size >= m)
            .collect();
        let mut released = 0;
        for (size, b) in largest {
            if released >= want {
                break;
            }
            let bk = &self.blks[b as usize];
            if !self.segs[bk.seg as usize].expandable && bk.prev == NIL && bk.next == NIL {
                released += size;
                self.release_block(b);
            }
        }
        released >= want
    }

    /// `empty_cache` (and the allocator's last resort before out-of-memory): frees every unsplit cached segment of
    /// the default pools, large then small, and unmaps the whole free pages of expandable segments.
    pub fn release_cached(&mut self) {
        self.cache_releases += 1;
        self.pools.iter_mut().for_each(|p| p.changes += 1);
        let pools: Vec<u16> = {
            let mut v: Vec<(bool, u16)> =
                self.pools.iter().enumerate().filter(|(_, p)| !p.private).map(|(i, p)| (p.small, i as u16)).collect();
            v.sort();
            v.into_iter().map(|(_, i)| i).collect()
        };
        for pool in pools {
            let blocks: Vec<u32> = self.pools[pool as usize].blocks.values().copied().collect();
            let mut to_unmap = Vec::new();
            for b in blocks {
                let bk = &self.blks[b as usize];
                if self.segs[bk.seg as usize].expandable {
                    to_unmap.push(b);
                } else if bk.prev == NIL && bk.next == NIL {
                    self.release_block(b);
                }
            }
            for b in to_unmap {
                self.unmap(b);
            }
        }
    }

    /// Garbage collection under a memory-fraction cap: frees unsplit cached large segments older than the average,
    /// until the reserved bytes are back under the threshold.
    /// Whether it released any segment.
    fn garbage_collect(&mut self) -> bool {
        let (Some(t), Some(cap)) = (self.cfg.gc_threshold, self.cfg.capacity) else { return false };
        let threshold = (t * cap as f64) as u64;
        if self.reserved <= threshold {
            return false;
        }
        let target = self.reserved - threshold;
        self.pools.iter_mut().for_each(|p| p.changes += 1);
        let Some(&pool) = self.pool_index.get(&((0, 0), false)) else { return false };
        let calls = self.pools[pool as usize].free_calls;
        let freeable = |s: &Allocator| -> Vec<(u32, u64)> {
            s.pools[pool as usize]
                .blocks
                .values()
                .filter(|&&b| {
                    let b = &s.blks[b as usize];
                    b.prev == NIL && b.next == NIL && !s.segs[b.seg as usize].expandable
                })
                .map(|&b| (b, calls - s.blks[b as usize].gc_base))
                .collect()
        };
        let mut blocks = freeable(self);
        let mut total_age: u64 = blocks.iter().map(|b| b.1).sum();
        let mut count = blocks.len();
        let mut reclaimed = 0;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            for &(b, age) in &blocks {
                if age as f64 >= threshold {
                    freed = true;
                    reclaimed += self.blks[b as usize].size;
                    total_age -= age;
                    count -= 1;
                    self.release_block(b);
                }
            }
            blocks = freeable(self);
        }
        reclaimed > 0
    }

    fn page(&self, pool: usize) -> u64 {
        if self.pools[pool].small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        }
    }

    fn allocate_expandable(&mut self, pool: u16, stream: u64, size: u64) -> Option<u32> {
        let mut c = self.find_expandable(pool, stream, size);
        if !self.blks[c as usize].mapped {
            let n = self.blks[c as usize].size.min(size);
            if !self.map(c, n) {
                return None;
            }
        }
        while self.blks[c as usize].size < size {
            let remaining = size - self.blks[c as usize].size;
            let next = self.blks[c as usize].next;
            if next == NIL {
                return None;
            }
            let n = remaining.min(self.blks[next as usize].size);
            if !self.map(next, n) {
                return None;
            }
            c = next;
        }
        self.uncache(c);
        Some(c)
    }

    fn find_expandable(&mut self, pool: u16, stream: u64, size: u64) -> u32 {
        let usable = |s: &Allocator, b: u32| b != NIL && !s.blks[b as usize].allocated;
        let room = |s: &Allocator, mut b: u32| {
            let mut bytes = 0;
            while bytes < size && usable(s, b) {
                bytes += s.blks[b as usize].size;
                b = s.blks[b as usize].next;
            }
            bytes >= size
        };
        let candidates: Vec<u32> =
            self.pools[pool as usize].unmapped.range(upack(stream, 0)..upack(stream + 1, 0)).map(|(_, &b)| b).collect();
        for mut c in candidates {
            let prev = self.blks[c as usize].prev;
            if usable(self, prev) {
                c = prev;
            }
            if room(self, c) {
                return c;
            }
        }
        let page = self.page(pool as usize);
        let total = self.cfg.device_total.unwrap_or(1 << 40);
        let va = (total + total / 8).div_ceil(page) * page;
        let base = self.next_base;
        self.next_base += va + ROUND_LARGE;
        let seg = self.add_segment(base, va, stream, pool, true);
        let b = self.new_blk(Blk {
            addr: base,
            size: va,
            seg,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: false,
            gc_base: 0,
        });
        let k = self.ukey(b);
        self.pools[pool as usize].unmapped.insert(k, b);
        b
    }

    /// Maps the pages covering the first `size` bytes of an unmapped block.
    fn map(&mut self, b: u32, size: u64) -> bool {
        let pool = self.pool_of(b);
        let page = self.page(pool);
        let k = self.blks[b as usize].clone();
        let base = self.segs[k.seg as usize].base;
        let end = (k.addr - base + size).div_ceil(page) * page + base;
        let mapped = (end - k.addr).min(k.size);
        if !self.cfg.fraction_cap && self.cfg.capacity.is_some_and(|c| self.reserved + mapped > c) {
            return false;
        }
        let uk = self.ukey(b);
        self.pools[pool].unmapped.remove(&uk);
        self.blks[b as usize].mapped = true;
        if mapped < k.size {
            let r = self.link_after(b, k.addr + mapped, k.size - mapped, false);
            self.blks[b as usize].size = mapped;
            let rk = self.ukey(r);
            self.pools[pool].unmapped.insert(rk, r);
        }
        let (prev, next) = (self.blks[b as usize].prev, self.blks[b as usize].next);
        self.try_merge(b, prev);
        self.try_merge(b, next);
        self.cache(b);
        self.grow(mapped);
        self.event(Action::SegmentMap, mapped);
        true
    }

    /// Unmaps the whole pages inside a free mapped block of an expandable segment.
    fn unmap(&mut self, b: u32) {
        let pool = self.pool_of(b);
        let page = self.page(pool);
        let k = self.blks[b as usize].clone();
        let base = self.segs[k.seg as usize].base;
        let begin = (k.addr - base).div_ceil(page) * page + base;
        let end = (k.addr + k.size - base) / page * page + base;
        if begin >= end {
            return;
        }
        self.uncache(b);
        if begin > k.addr {
            let f = self.link_before(b, k.addr, begin - k.addr, true);
            self.cache(f);
        }
        if end < k.addr + k.size {
            let f = self.link_after(b, end, k.addr + k.size - end, true);
            self.cache(f);
        }
        {
            let bb = &mut self.blks[b as usize];
            bb.addr = begin;
            bb.size = end - begin;
            bb.mapped = false;
        }
        let (prev, next) = (self.blks[b as usize].prev, self.blks[b as usize].next);
        self.try_merge(b, prev);
        self.try_merge(b, next);
        let uk = self.ukey(b);
        self.pools[pool].unmapped.insert(uk, b);
        self.reserved -= end - begin;
        self.event(Action::SegmentUnmap, end - begin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn alloc(c: Config) -> Allocator {
        let mut a = Allocator::new(c);
        a.record_events = true;
        a
    }

    fn events(a: &Allocator) -> Vec<(Action, u64)> {
        a.segment_events.iter().map(|e| (e.action, e.size / MIB)).collect()
    }

    #[test]
    fn segments_are_sized_as_torch_sizes_them() {
        let mut a = alloc(Config::default());
        a.malloc(1000, 0, (0, 0)).unwrap(); // small pool: a 2 MiB segment
        a.malloc(3 * MIB, 0, (0, 0)).unwrap(); // under 10 MiB: a 20 MiB segment
        a.malloc(18 * MIB + 1, 0, (0, 0)).unwrap(); // over the 17 MiB left: its own segment, rounded up to 2 MiB
        a.malloc(5 * MIB, 0, (0, 0)).unwrap(); // fits in the first 20 MiB segment's remainder
        assert_eq!(events(&a), vec![(Action::SegmentAlloc, 2), (Action::SegmentAlloc, 20), (Action::SegmentAlloc, 20)]);
        assert_eq!(a.reserved, 42 * MIB);
        assert_eq!(a.allocated, 1024 + 3 * MIB + 18 * MIB + 512 + 5 * MIB);
    }

    #[test]
    fn best_fit_takes_the_smallest_block_and_frees_merge() {
        let mut a = alloc(Config::default());
        let x = a.malloc(100 * MIB, 0, (0, 0)).unwrap();
        let y = a.malloc(40 * MIB, 0, (0, 0)).unwrap();
        a.free(x);
        a.free(y);
        // 40 MiB fits the 40 MiB segment, not the 100 MiB one.
        let z = a.malloc(30 * MIB, 0, (0, 0)).unwrap();
        assert_eq!(a.blks[z as usize].seg, a.blks[y as usize].seg);
        // another stream's cached block is not used
        a.malloc(50 * MIB, 7, (0, 0)).unwrap();
        assert_eq!(events(&a).len(), 3);
        assert_eq!(a.reserved, 190 * MIB);
    }

    #[test]
    fn out_of_memory_frees_the_cache_and_retries() {
        let mut a = alloc(Config { capacity: Some(300 * MIB), ..Default::default() });
        let x = a.malloc(200 * MIB, 0, (0, 0)).unwrap();
        a.free(x);
        // 250 MiB does not fit the cached 200 MiB: the cache is released and the retry succeeds.
        a.malloc(250 * MIB, 0, (0, 0)).unwrap();
        assert_eq!(
            events(&a),
            vec![(Action::SegmentAlloc, 200), (Action::SegmentFree, 200), (Action::SegmentAlloc, 250)]
        );
        assert!(a.malloc(100 * MIB, 0, (0, 0)).is_none());
    }

    #[test]
    fn max_split_size_keeps_oversized_blocks_whole() {
        let rules = Rules { max_split_size: Some(64 * MIB), ..Default::default() };
        let mut a = alloc(Config { rules, ..Default::default() });
        let x = a.malloc(100 * MIB, 0, (0, 0)).unwrap();
        a.free(x);
        // a small request does not take the oversized cached block
        a.malloc(30 * MIB, 0, (0, 0)).unwrap();
        assert_eq!(a.reserved, 130 * MIB);
        // a large one within 20 MiB of it does, unsplit
        let y = a.malloc(90 * MIB, 0, (0, 0)).unwrap();
        assert_eq!(a.block_size(y), 100 * MIB);
    }

    #[test]
    fn expandable_segments_map_pages_and_reuse_holes() {
        let rules = Rules { expandable: true, ..Default::default() };
        let mut a =
            alloc(Config { rules, capacity: Some(400 * MIB), device_total: Some(1 << 30), ..Default::default() });
        let held: Vec<u32> = (0..3).map(|_| a.malloc(100 * MIB, 0, (0, 0)).unwrap()).collect();
        assert_eq!(a.reserved, 300 * MIB);
        a.free(held[1]);
        // the hole is reused; the segment grows by whole 20 MiB pages
        a.malloc(120 * MIB, 0, (0, 0)).unwrap();
        assert_eq!(a.reserved, 320 * MIB, "{:?}", events(&a));
        a.release_cached();
        assert!(a.segment_events.iter().all(|e| e.action != Action::SegmentFree));
    }

    #[test]
    fn fragmentation_that_expandable_segments_avoid() {
        // The real capture's program: 15 segments of 256 MiB, each left holding 100 MiB, then 400 MiB, 4 GiB cap.
        let run = |expandable: bool| {
            let rules = Rules { expandable, ..Default::default() };
            let cfg = Config { rules, capacity: Some(4 << 30), fraction_cap: true, ..Default::default() };
            let mut a = alloc(cfg);
            let big: Vec<u32> = (0..15).map(|_| a.malloc(256 * MIB, 0, (0, 0)).unwrap()).collect();
            big.into_iter().for_each(|b| a.free(b));
            let pairs: Vec<(u32, u32)> = (0..15)
                .map(|_| (a.malloc(100 * MIB, 0, (0, 0)).unwrap(), a.malloc(100 * MIB, 0, (0, 0)).unwrap()))
                .collect();
            pairs.iter().for_each(|p| a.free(p.1));
            (a.malloc(400 * MIB, 0, (0, 0)).is_some(), a.peak_reserved)
        };
        assert_eq!(run(false), (false, 15 * 256 * MIB));
        let (fits, peak) = run(true);
        assert!(fits);
        assert!(peak < 4 << 30);
    }
}
