//! Rebuilds the caching allocator's state (segments, blocks, totals) at any event of a device's trace.
//!
//! The trace gives the caller's *unrounded* sizes; block sizes come from the allocator's own rules (round to 512
//! bytes, split a free block only when the remainder is worth keeping, merge free neighbours), so the replay
//! applies the same rules. When the trace is complete the replay starts from an empty device; when the ring
//! buffer wrapped (or recording started late) it starts from a state rebuilt from the file's final segments, which
//! are always complete: read off what the trace did first at each address where a pass from it replays every event
//! and ends at the file's state, else by undoing the trace event by event. Either way the end of the replay is
//! checked against the file's segments.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::stacks::{StackId, EMPTY_STACK};
use super::{Action, AllocatorSettings, BlockState, DeviceTimeline, Event, EventAttrTable, PoolKind, Segment};

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = 1 << 20;
const SMALL_BUFFER: u64 = 2 << 20;

/// The allocator's sizing rules, as configured for this file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    pub expandable: bool,
    pub max_split_size: Option<u64>,
    /// `(interval start in MiB, divisions)`, sorted by interval.
    pub divisions: Vec<(u64, u64)>,
}

impl Rules {
    pub fn new(settings: Option<&AllocatorSettings>, dev: &DeviceTimeline) -> Rules {
        let expandable = settings.and_then(|s| s.expandable_segments).unwrap_or(false)
            || dev.segments.iter().any(|s| s.expandable)
            || dev.events.iter().any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap));
        Rules {
            expandable,
            max_split_size: settings.and_then(|s| s.max_split_size),
            divisions: settings.map(|s| s.roundup_power2_divisions.clone()).unwrap_or_default(),
        }
    }

    /// `round_size` of the CUDA caching allocator.
    pub fn round(&self, size: u64) -> u64 {
        if size < MIN_BLOCK {
            return MIN_BLOCK;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK * divisions {
            return round_to_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK) * MIN_BLOCK
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let mib = (size >> 20).max(1);
        self.divisions.iter().rev().find(|(start, _)| *start <= mib).map_or(0, |&(_, d)| d)
    }

    pub(crate) fn should_split(&self, kind: PoolKind, rounded: u64, remaining: u64) -> bool {
        if kind == PoolKind::Small || self.expandable {
            remaining >= MIN_BLOCK
        } else {
            self.max_split_size.is_none_or(|m| rounded < m) && remaining > SMALL_SIZE
        }
    }
}

fn round_to_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let base = size & !(step - 1);
    if base == size {
        size
    } else {
        base + step
    }
}

/// A block as the replay knows it. Blocks of a segment form a doubly linked list in address order, as in
/// PyTorch's allocator, so allocating, freeing and merging are O(1) map lookups.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveBlock {
    pub size: u64,
    /// The caller's size (0 when unknown).
    pub requested: u64,
    pub state: BlockState,
    pub stack: StackId,
    /// Index of the `alloc` event that created it, when that event is in the trace.
    pub alloc_event: Option<u32>,
    /// Address of the segment holding it.
    pub segment: u64,
    prev: Link,
    next: Link,
}

/// The address of a neighbouring block, or none: a `u64` with `u64::MAX` for none, 8 bytes where an
/// `Option<u64>` takes 16, which keeps the replay's block map small.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Link(u64);

impl Link {
    const NONE: Link = Link(u64::MAX);

    fn to(addr: u64) -> Link {
        Link(addr)
    }

    fn of(addr: Option<u64>) -> Link {
        addr.map_or(Link::NONE, Link)
    }

    fn get(self) -> Option<u64> {
        (self != Link::NONE).then_some(self.0)
    }
}

impl LiveBlock {
    fn free(size: u64, segment: u64) -> LiveBlock {
        LiveBlock {
            size,
            requested: 0,
            state: BlockState::Inactive,
            stack: EMPTY_STACK,
            alloc_event: None,
            segment,
            prev: Link::NONE,
            next: Link::NONE,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SegState {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub pool_id: (i64, i64),
    /// Unknown for a segment made by the trace until its first allocation says which pool it serves.
    pub kind: Option<PoolKind>,
    pub expandable: bool,
}

/// Allocator state of one device at one moment.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub segments: FxHashMap<u64, SegState>,
    blocks: FxHashMap<u64, LiveBlock>,
    /// Every block's start, by segment, in address order: kept only while a trace is undone and its frees must be
    /// found inside long free blocks (see [`State::block_holding`]). `None` going forward, which never needs it. A
    /// sorted vector per segment, not one tree: a segment holds hundreds to thousands of blocks, and moving a few KB
    /// on an insert costs less than a tree's rebalancing (the undo of the wrapped bench trace: 45 → 35 ms).
    starts: Option<FxHashMap<u64, Vec<u64>>>,
    /// Undoing: the index of starts may be built.
    undoing: bool,
    /// Chain walks while undoing, and the blocks they visited: the index is built once the walks are long.
    walks: usize,
    walked: usize,
    /// Σ size of blocks held by tensors.
    pub allocated: u64,
    /// Σ size of blocks not free (held, or freed but waiting on another stream).
    pub active: u64,
    /// Σ segment sizes.
    pub reserved: u64,
}

/// Something in the trace the replay could not apply as the allocator would have.
#[derive(Clone, Debug)]
pub struct Anomaly {
    pub event: u32,
    pub what: &'static str,
}

impl State {
    pub fn from_segments(segments: &[Segment]) -> State {
        let mut st = State::default();
        for s in segments {
            st.segments.insert(
                s.address,
                SegState {
                    addr: s.address,
                    size: s.total_size,
                    stream: s.stream,
                    pool_id: s.pool_id,
                    kind: Some(s.kind),
                    expandable: s.expandable,
                },
            );
            st.reserved += s.total_size;
            let mut prev: Option<u64> = None;
            for b in &s.blocks {
                st.blocks.insert(
                    b.address,
                    LiveBlock {
                        size: b.size,
                        requested: b.requested_size.unwrap_or(0),
                        state: b.state,
                        stack: b.stack,
                        alloc_event: None,
                        segment: s.address,
                        prev: Link::of(prev),
                        next: Link::NONE,
                    },
                );
                if let Some(p) = prev {
                    st.blocks.get_mut(&p).expect("inserted").next = Link::to(b.address);
                }
                prev = Some(b.address);
                st.count(b.state, b.size as i128);
            }
        }
        st
    }

    fn count(&mut self, state: BlockState, delta: i128) {
        let add = |v: &mut u64| *v = (*v as i128 + delta).max(0) as u64;
        match state {
            BlockState::ActiveAllocated => {
                add(&mut self.allocated);
                add(&mut self.active);
            }
            BlockState::ActivePendingFree => add(&mut self.active),
            BlockState::Inactive => {}
        }
    }

    /// Segments in address order.
    pub fn segments_sorted(&self) -> Vec<&SegState> {
        let mut v: Vec<&SegState> = self.segments.values().collect();
        v.sort_unstable_by_key(|s| s.addr);
        v
    }

    /// The blocks of a segment in address order: `(address, block)`.
    pub fn segment_blocks(&self, seg: u64) -> impl Iterator<Item = (u64, &LiveBlock)> {
        let mut at = self.blocks.contains_key(&seg).then_some(seg);
        std::iter::from_fn(move || {
            let a = at?;
            let b = self.blocks.get(&a)?;
            at = b.next.get();
            Some((a, b))
        })
    }

    fn insert_block(&mut self, addr: u64, b: LiveBlock) {
        if let Some(starts) = &mut self.starts {
            let v = starts.entry(b.segment).or_default();
            let at = v.partition_point(|&a| a < addr);
            if v.get(at) != Some(&addr) {
                v.insert(at, addr);
            }
        }
        self.blocks.insert(addr, b);
    }

    fn remove_block(&mut self, addr: u64) -> Option<LiveBlock> {
        let b = self.blocks.remove(&addr)?;
        if let Some(v) = self.starts.as_mut().and_then(|s| s.get_mut(&b.segment)) {
            if let Ok(at) = v.binary_search(&addr) {
                v.remove(at);
            }
        }
        Some(b)
    }

    /// The block that holds `addr`: by the index of starts where it is kept, else by a walk of its segment's chain.
    /// While undoing, the index is built once the walks are long (past 32 blocks each, on average over 256 or more):
    /// its upkeep is a few tree operations per event, a walk's step one probe. A real torch 2.11 trace walks 11
    /// blocks per free found this way (no index: it would cost more than it saves); the wrapped bench trace, whose
    /// 2 GiB segments hold long chains, 113.
    fn block_holding(&mut self, seg: u64, addr: u64) -> Option<(u64, LiveBlock)> {
        let holds = |a: u64, b: &LiveBlock| a <= addr && addr < a + b.size;
        if self.starts.is_none() && self.undoing && self.walks >= 256 && self.walked > 32 * self.walks {
            self.starts = Some(self.index_of_starts());
        }
        match &self.starts {
            Some(starts) => {
                let v = starts.get(&seg)?;
                let a = v[v.partition_point(|&a| a <= addr).checked_sub(1)?];
                self.blocks.get(&a).filter(|b| b.segment == seg && holds(a, b)).map(|b| (a, b.clone()))
            }
            None => {
                let mut steps = 0;
                self.walks += 1;
                let found = self.segment_blocks(seg).find(|&(a, b)| {
                    steps += 1;
                    holds(a, b)
                });
                let found = found.map(|(a, b)| (a, b.clone()));
                self.walked += steps;
                found
            }
        }
    }

    /// Every block's start, by segment, in address order.
    fn index_of_starts(&self) -> FxHashMap<u64, Vec<u64>> {
        let mut starts: FxHashMap<u64, Vec<u64>> = FxHashMap::default();
        for (&a, b) in &self.blocks {
            starts.entry(b.segment).or_default().push(a);
        }
        for v in starts.values_mut() {
            v.sort_unstable();
        }
        starts
    }

    /// Undoing a trace (`on`) or done: while undoing, [`State::block_holding`] may build the index of block starts.
    fn undoing(&mut self, on: bool) {
        self.undoing = on;
        self.starts = None;
        (self.walks, self.walked) = (0, 0);
    }

    fn segment_containing(&self, addr: u64) -> Option<u64> {
        self.segments.values().find(|s| s.addr <= addr && addr < s.addr + s.size).map(|s| s.addr)
    }

    fn blocks_in_state(&self, state: BlockState) -> impl Iterator<Item = (&SegState, u64, &LiveBlock)> {
        self.blocks
            .iter()
            .filter(move |(_, b)| b.state == state)
            .filter_map(|(a, b)| Some((self.segments.get(&b.segment)?, *a, b)))
    }

    /// Every free block: `(segment, block address, block)`, in no particular order.
    pub fn free_blocks(&self) -> impl Iterator<Item = (&SegState, u64, &LiveBlock)> {
        self.blocks_in_state(BlockState::Inactive)
    }

    /// Every block held by a tensor: `(segment, block address, block)`, in no particular order.
    pub fn allocated_blocks(&self) -> impl Iterator<Item = (&SegState, u64, &LiveBlock)> {
        self.blocks_in_state(BlockState::ActiveAllocated)
    }

    pub fn largest_free_block(&self) -> u64 {
        self.free_blocks().map(|(_, _, b)| b.size).max().unwrap_or(0)
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// The large pools' cached free memory: what fragmentation is read from (the small pool's 2 MiB segments hold
    /// requests of 1 MiB or less, which no fragment of it fails).
    pub fn large_pool_free(&self, event: u32) -> LargePoolFree {
        let mut out = LargePoolFree { event, ..LargePoolFree::default() };
        for seg in self.segments.values().filter(|s| s.kind != Some(PoolKind::Small)) {
            let (mut free, mut live) = (0u64, false);
            for (_, b) in self.segment_blocks(seg.addr) {
                if b.state == BlockState::Inactive {
                    free += b.size;
                    out.largest_block = out.largest_block.max(b.size);
                } else {
                    live = true;
                }
            }
            out.cached += free;
            if live {
                out.pinned += free;
            }
        }
        out
    }

    /// Applies one event going forward in time.
    pub fn apply(&mut self, e: &Event, idx: u32, rules: &Rules, attrs: &EventAttrTable) -> Result<(), &'static str> {
        match e.action {
            Action::Alloc => self.alloc(e, idx, rules),
            Action::FreeRequested => {
                let b = self.blocks.get_mut(&e.addr).ok_or("free_requested of an address holding no block")?;
                if b.state != BlockState::ActiveAllocated {
                    return Err("free_requested of a block that is not allocated");
                }
                b.state = BlockState::ActivePendingFree;
                let size = b.size;
                self.allocated -= size.min(self.allocated);
                Ok(())
            }
            Action::FreeCompleted => self.let_go(
                e.addr,
                ("free_completed of an address holding no block", "free_completed of a block already free"),
            ),
            Action::SegmentAlloc => {
                self.add_segment(e.addr, e.size, attrs.get(e).stream, attrs.get(e).pool_id(), false)
            }
            Action::SegmentFree => self.remove_segment(e.addr),
            Action::SegmentMap => self.map(e.addr, e.size, attrs.get(e).stream, attrs.get(e).pool_id()),
            Action::SegmentUnmap => self.unmap(e.addr, e.size),
            Action::Snapshot | Action::Oom | Action::Annotate | Action::WorkspaceSnapshot | Action::Unknown => Ok(()),
        }
    }

    /// Undoes one event, going backward in time.
    pub fn unapply(&mut self, e: &Event, rules: &Rules, attrs: &EventAttrTable) -> Result<(), &'static str> {
        match e.action {
            Action::Alloc => self.unallocate(e.addr),
            Action::FreeRequested => {
                let b = self.blocks.get_mut(&e.addr).ok_or("free_requested (undone) of an address holding no block")?;
                if b.state != BlockState::ActivePendingFree {
                    return Err("free_requested (undone) of a block not pending");
                }
                b.state = BlockState::ActiveAllocated;
                let size = b.size;
                self.allocated += size;
                Ok(())
            }
            Action::FreeCompleted => self.carve(e, rules),
            Action::SegmentAlloc => self.remove_segment(e.addr),
            Action::SegmentFree => self.add_segment(e.addr, e.size, attrs.get(e).stream, attrs.get(e).pool_id(), false),
            Action::SegmentMap => self.unmap(e.addr, e.size),
            Action::SegmentUnmap => self.map(e.addr, e.size, attrs.get(e).stream, attrs.get(e).pool_id()),
            Action::Snapshot | Action::Oom | Action::Annotate | Action::WorkspaceSnapshot | Action::Unknown => Ok(()),
        }
    }

    /// Makes the block in use at `addr` free again, as it was before its allocation, and merges it with free
    /// neighbours.
    fn unallocate(&mut self, addr: u64) -> Result<(), &'static str> {
        self.let_go(addr, ("alloc (undone) of an address holding no block", "alloc (undone) of a free block"))
    }

    /// Makes the block in use at `addr` free and merges it with free neighbours: a `free_completed` going forward,
    /// an `alloc` going back. `(missing, free)` say what was wrong where no block starts at `addr`, or it is free.
    fn let_go(&mut self, addr: u64, (missing, free): (&'static str, &'static str)) -> Result<(), &'static str> {
        let b = self.blocks.get_mut(&addr).ok_or(missing)?;
        let (state, size) = (b.state, b.size);
        if state == BlockState::Inactive {
            return Err(free);
        }
        b.state = BlockState::Inactive;
        b.stack = EMPTY_STACK;
        b.alloc_event = None;
        let (prev, next) = (b.prev.get(), b.next.get());
        self.count(state, -(size as i128));
        self.merge_neighbours(addr, prev, next);
        Ok(())
    }

    /// Splits the block at `addr` so that it keeps `size` bytes; the rest becomes a new block after it, in the
    /// state `rest_state`.
    fn split(&mut self, addr: u64, size: u64) {
        let b = self.blocks.get_mut(&addr).expect("caller checked");
        let rest_addr = addr + size;
        let mut rest = LiveBlock::free(b.size - size, b.segment);
        rest.prev = Link::to(addr);
        rest.next = b.next;
        b.size = size;
        b.next = Link::to(rest_addr);
        if let Some(n) = rest.next.get() {
            if let Some(nb) = self.blocks.get_mut(&n) {
                nb.prev = Link::to(rest_addr);
            }
        }
        self.insert_block(rest_addr, rest);
    }

    fn alloc(&mut self, e: &Event, idx: u32, rules: &Rules) -> Result<(), &'static str> {
        let rounded = rules.round(e.size);
        // The block is looked up once: a third of a trace's events are allocations.
        let b = self.blocks.get_mut(&e.addr).ok_or("alloc not at the start of a block")?;
        if b.state != BlockState::Inactive {
            return Err("alloc of a block that is in use");
        }
        let (size, seg_addr) = (b.size, b.segment);
        let seg = self.segments.get_mut(&seg_addr).ok_or("alloc in a block without a segment")?;
        let kind = *seg.kind.get_or_insert(if rounded <= SMALL_SIZE { PoolKind::Small } else { PoolKind::Large });
        let split = rounded < size && rules.should_split(kind, rounded, size - rounded);
        let taken = if split { rounded } else { size };
        b.state = BlockState::ActiveAllocated;
        b.requested = e.size;
        b.stack = e.stack;
        b.alloc_event = Some(idx);
        if split {
            self.split(e.addr, rounded);
        }
        self.count(BlockState::ActiveAllocated, taken as i128);
        if rounded > taken {
            return Err("alloc larger than the free block it landed in");
        }
        Ok(())
    }

    /// Going backward over a `free_completed`: the block existed (pending) before; cut it out of free space.
    fn carve(&mut self, e: &Event, rules: &Rules) -> Result<(), &'static str> {
        // Mostly the freed block still starts at its address (no free block before it took it in): no search of
        // the segments and of the segment's chain of blocks, which on a real trace holds thousands.
        let (seg_addr, start, free) = match self.blocks.get(&e.addr) {
            Some(b) if b.state == BlockState::Inactive => (b.segment, e.addr, b.clone()),
            _ => {
                let seg_addr =
                    self.segment_containing(e.addr).ok_or("free_completed (undone) outside every segment")?;
                let (start, free) =
                    self.block_holding(seg_addr, e.addr).ok_or("free_completed (undone) in a hole of its segment")?;
                (seg_addr, start, free)
            }
        };
        if free.state != BlockState::Inactive {
            return Err("free_completed (undone) of memory that is in use");
        }
        let end = start + free.size;
        // A file's block need not start its segment's chain (nothing checks it on reading), and a start rebuilt
        // from first events removes segments before it carves: the segment may be gone.
        let seg = self.segments.get(&seg_addr).ok_or("free_completed (undone) in a segment that is gone")?;
        let kind = seg.kind.unwrap_or(if e.size <= SMALL_SIZE { PoolKind::Small } else { PoolKind::Large });
        let mut size = rules.round(e.size).min(end - e.addr);
        if !rules.should_split(kind, size, end - e.addr - size) {
            size = end - e.addr;
        }
        if start < e.addr {
            self.split(start, e.addr - start);
        }
        if e.addr + size < end {
            self.split(e.addr, size);
        }
        // Allocated before the trace began: who allocated it is unknown (a free's frames are the free site's).
        let b = self.blocks.get_mut(&e.addr).expect("split above");
        b.requested = e.size;
        b.state = BlockState::ActivePendingFree;
        b.stack = EMPTY_STACK;
        b.alloc_event = None;
        self.count(BlockState::ActivePendingFree, size as i128);
        Ok(())
    }

    /// Merges the free block at `addr` with free neighbours. A million frees go through here: each neighbour is
    /// looked up once, and only the blocks that change are touched again.
    fn merge_free(&mut self, addr: u64) {
        let b = &self.blocks[&addr];
        self.merge_neighbours(addr, b.prev.get(), b.next.get());
    }

    /// [`State::merge_free`], told the block's neighbours.
    fn merge_neighbours(&mut self, addr: u64, prev: Option<u64>, next: Option<u64>) {
        let free = |a: Option<u64>, blocks: &FxHashMap<u64, LiveBlock>| {
            a.filter(|a| blocks.get(a).is_some_and(|b| b.state == BlockState::Inactive))
        };
        let (free_prev, free_next) = (free(prev, &self.blocks), free(next, &self.blocks));
        if free_prev.is_none() && free_next.is_none() {
            return;
        }
        // What joins the block that survives (the previous one, if free): this block and/or the next one.
        let mut grow = 0;
        let mut new_next = next;
        if let Some(n) = free_next {
            let nb = self.remove_block(n).expect("linked");
            grow += nb.size;
            new_next = nb.next.get();
        }
        let keep = match free_prev {
            Some(p) => {
                let b = self.remove_block(addr).expect("present");
                grow += b.size;
                p
            }
            None => addr,
        };
        let b = self.blocks.get_mut(&keep).expect("present");
        b.size += grow;
        b.next = Link::of(new_next);
        b.stack = EMPTY_STACK;
        b.alloc_event = None;
        if let Some(nn) = new_next {
            if let Some(x) = self.blocks.get_mut(&nn) {
                x.prev = Link::to(keep);
            }
        }
    }

    fn add_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        pool_id: Option<(i64, i64)>,
        expandable: bool,
    ) -> Result<(), &'static str> {
        if self.segments.contains_key(&addr) || self.segment_containing(addr).is_some() {
            return Err("segment allocated over an existing segment");
        }
        let kind = (!expandable && size == SMALL_BUFFER).then_some(PoolKind::Small);
        self.segments
            .insert(addr, SegState { addr, size, stream, pool_id: pool_id.unwrap_or((0, 0)), kind, expandable });
        self.insert_block(addr, LiveBlock::free(size, addr));
        self.reserved += size;
        Ok(())
    }

    fn remove_segment(&mut self, addr: u64) -> Result<(), &'static str> {
        let seg = self.segments.remove(&addr).ok_or("segment_free of an address that starts no segment")?;
        self.reserved -= seg.size.min(self.reserved);
        let mut busy = false;
        let mut at = Some(addr);
        while let Some(a) = at {
            let Some(b) = self.remove_block(a) else {
                break;
            };
            if b.state != BlockState::Inactive {
                busy = true;
                self.count(b.state, -(b.size as i128));
            }
            at = b.next.get();
        }
        if busy {
            return Err("segment released while blocks in it were in use");
        }
        Ok(())
    }

    /// Blocks of a segment, removed from the map, in address order.
    fn take_blocks(&mut self, seg: u64) -> Vec<(u64, LiveBlock)> {
        let mut out = Vec::new();
        let mut at = Some(seg);
        while let Some(a) = at {
            let Some(b) = self.remove_block(a) else {
                break;
            };
            at = b.next.get();
            out.push((a, b));
        }
        out
    }

    /// Inserts blocks (address order) as the block list of segment `seg`, relinking them.
    fn put_blocks(&mut self, seg: u64, blocks: Vec<(u64, LiveBlock)>) {
        let addrs: Vec<u64> = blocks.iter().map(|(a, _)| *a).collect();
        for (i, (a, mut b)) in blocks.into_iter().enumerate() {
            b.segment = seg;
            b.prev = Link::of((i > 0).then(|| addrs[i - 1]));
            b.next = Link::of(addrs.get(i + 1).copied());
            self.insert_block(a, b);
        }
    }

    /// An expandable segment grows: the new pages join the segment that ends (or starts) where they start (end).
    fn map(&mut self, addr: u64, size: u64, stream: u64, pool_id: Option<(i64, i64)>) -> Result<(), &'static str> {
        let end = addr + size;
        let before = self.segments.values().find(|s| s.expandable && s.addr + s.size == addr).map(|s| s.addr);
        let after = self.segments.get(&end).filter(|s| s.expandable).map(|s| s.addr);
        self.reserved += size;
        let base = before.unwrap_or(addr);
        let mut blocks = match before {
            Some(b) => self.take_blocks(b),
            None => Vec::new(),
        };
        blocks.push((addr, LiveBlock::free(size, base)));
        let mut seg = match before {
            Some(b) => self.segments.remove(&b).expect("found above"),
            None => {
                SegState { addr, size: 0, stream, pool_id: pool_id.unwrap_or((0, 0)), kind: None, expandable: true }
            }
        };
        seg.size += size;
        if let Some(a) = after {
            let next = self.segments.remove(&a).expect("found above");
            seg.size += next.size;
            seg.kind = seg.kind.or(next.kind);
            blocks.extend(self.take_blocks(a));
        }
        self.segments.insert(base, seg);
        self.put_blocks(base, blocks);
        self.merge_free(addr);
        Ok(())
    }

    /// An expandable segment gives pages back: the range leaves the segment, which may split in two.
    fn unmap(&mut self, addr: u64, size: u64) -> Result<(), &'static str> {
        let end = addr + size;
        let seg_addr = self.segment_containing(addr).ok_or("segment_unmap outside every segment")?;
        let seg = self.segments[&seg_addr].clone();
        if end > seg.addr + seg.size {
            return Err("segment_unmap past the end of its segment");
        }
        self.segments.remove(&seg_addr);
        let mut left = Vec::new();
        let mut right = Vec::new();
        let mut busy = false;
        for (a, b) in self.take_blocks(seg_addr) {
            let b_end = a + b.size;
            if b_end <= addr {
                left.push((a, b));
            } else if a >= end {
                right.push((a, b));
            } else {
                if b.state != BlockState::Inactive {
                    busy = true;
                    self.count(b.state, -(b.size as i128));
                }
                if a < addr {
                    left.push((a, LiveBlock { size: addr - a, ..b.clone() }));
                }
                if b_end > end {
                    right.push((end, LiveBlock { size: b_end - end, ..b }));
                }
            }
        }
        self.reserved -= size.min(self.reserved);
        let seg_end = seg.addr + seg.size;
        if addr > seg.addr {
            self.segments.insert(seg.addr, SegState { size: addr - seg.addr, ..seg.clone() });
            self.put_blocks(seg.addr, left);
        }
        if seg_end > end {
            self.segments.insert(end, SegState { addr: end, size: seg_end - end, ..seg });
            self.put_blocks(end, right);
        }
        if busy {
            return Err("segment_unmap of pages that were in use");
        }
        Ok(())
    }

    /// Describes the first difference from the file's segments, or `None` when they agree block for block.
    pub fn diff(&self, segments: &[Segment]) -> Option<String> {
        let mut n = 0usize;
        let mut first = None;
        let theirs: BTreeMap<u64, &Segment> = segments.iter().map(|s| (s.address, s)).collect();
        for s in self.segments_sorted() {
            let a = s.addr;
            match theirs.get(&a) {
                None => {
                    n += 1;
                    first.get_or_insert_with(|| format!("segment 0x{a:x} ({} B) is not in the file", s.size));
                }
                Some(t) => {
                    if t.total_size != s.size {
                        n += 1;
                        first.get_or_insert_with(|| {
                            format!("segment 0x{a:x} is {} B in the replay, {} B in the file", s.size, t.total_size)
                        });
                        continue;
                    }
                    let ours: Vec<(u64, u64, BlockState)> =
                        self.segment_blocks(a).map(|(a, b)| (a, b.size, b.state)).collect();
                    let file: Vec<(u64, u64, BlockState)> =
                        t.blocks.iter().map(|b| (b.address, b.size, b.state)).collect();
                    if ours != file {
                        n += 1;
                        let at = ours.iter().zip(&file).find(|(x, y)| x != y);
                        first.get_or_insert_with(|| match at {
                            Some((x, y)) => format!(
                                "segment 0x{a:x}: block 0x{:x} is {} B {:?} in the replay, the file has 0x{:x} {} B \
                                 {:?}",
                                x.0, x.1, x.2, y.0, y.1, y.2
                            ),
                            None => format!(
                                "segment 0x{a:x}: {} blocks in the replay, {} in the file",
                                ours.len(),
                                file.len()
                            ),
                        });
                    }
                }
            }
        }
        for (a, t) in &theirs {
            if !self.segments.contains_key(a) {
                n += 1;
                first.get_or_insert_with(|| format!("segment 0x{a:x} ({} B) is in the file only", t.total_size));
            }
        }
        first.map(|f| if n > 1 { format!("{f} (and {} more segments differ)", n - 1) } else { f })
    }
}

/// How much of the device's history the trace holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completeness {
    /// Frees of blocks whose allocation is not in the trace.
    pub frees_without_alloc: usize,
    /// Blocks live at the end whose allocation is not in the trace.
    pub live_without_alloc: usize,
    /// Segments present at the end (or released in the trace) that the trace never created.
    pub segments_without_alloc: usize,
}

impl Completeness {
    pub fn complete(&self) -> bool {
        self.frees_without_alloc == 0 && self.live_without_alloc == 0 && self.segments_without_alloc == 0
    }
}

/// What the trace lacks (see [`Completeness`]).
pub fn completeness(dev: &DeviceTimeline) -> Completeness {
    first_events(dev).completeness
}

/// What a trace did first at each address, found in one pass: each block address's first event (and its first
/// `free_completed` before any allocation there), each segment's first event, whether ranges were mapped, and what
/// the trace lacks, which the same lookups count.
struct FirstEvents {
    blocks: FxHashMap<u64, FirstAtBlock>,
    /// A segment's first event, and whether the trace holds it at this point of the pass.
    segments: FxHashMap<u64, (u32, bool)>,
    mapped: bool,
    completeness: Completeness,
}

struct FirstAtBlock {
    event: u32,
    /// The first `free_completed` before any allocation at the address ([`NO_EVENT`] if none).
    completed: u32,
    allocated: bool,
    /// Allocated by the trace and not yet freed, at this point of the pass.
    live: bool,
}

const NO_EVENT: u32 = u32::MAX;

fn first_events(dev: &DeviceTimeline) -> FirstEvents {
    let mut c = Completeness::default();
    let mut blocks: FxHashMap<u64, FirstAtBlock> = FxHashMap::default();
    let mut segments: FxHashMap<u64, (u32, bool)> = FxHashMap::default();
    let mut mapped = false;
    for (i, e) in dev.events.iter().enumerate() {
        let i = i as u32;
        match e.action {
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted => {
                let f = blocks.entry(e.addr).or_insert(FirstAtBlock {
                    event: i,
                    completed: NO_EVENT,
                    allocated: false,
                    live: false,
                });
                match e.action {
                    Action::Alloc => (f.allocated, f.live) = (true, true),
                    Action::FreeRequested if !f.live => c.frees_without_alloc += 1,
                    Action::FreeCompleted => {
                        if f.completed == NO_EVENT && !f.allocated {
                            f.completed = i;
                        }
                        if !f.live {
                            c.frees_without_alloc += 1;
                        }
                        f.live = false;
                    }
                    _ => {}
                }
            }
            Action::SegmentAlloc | Action::SegmentFree => {
                let s = segments.entry(e.addr).or_insert((i, false));
                if e.action == Action::SegmentAlloc {
                    s.1 = true;
                } else if !s.1 {
                    c.segments_without_alloc += 1;
                } else {
                    s.1 = false;
                }
            }
            Action::SegmentMap | Action::SegmentUnmap => mapped = true,
            _ => {}
        }
    }
    for s in &dev.segments {
        // Mapped ranges split and join, so their starts need not match a segment event.
        if !(segments.get(&s.address).is_some_and(|s| s.1) || s.expandable && mapped) {
            c.segments_without_alloc += 1;
        }
        for b in &s.blocks {
            if b.state != BlockState::Inactive && !blocks.get(&b.address).is_some_and(|f| f.live) {
                c.live_without_alloc += 1;
            }
        }
    }
    FirstEvents { blocks, segments, mapped, completeness: c }
}

/// Checkpoint spacing: `state_at` replays at most this many events from a stored state.
const CHECKPOINT_EVERY: usize = 1 << 16;

/// The large pools' free memory right after one event (see [`State::large_pool_free`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LargePoolFree {
    pub event: u32,
    /// Free bytes cached in the large pools' segments.
    pub cached: u64,
    pub largest_block: u64,
    /// Free bytes in segments that also hold live blocks: what no release can return.
    pub pinned: u64,
}

/// How many events up to an OOM the large pools' free memory is sampled at, evenly spaced.
pub const FREE_SAMPLES: usize = 256;

/// The events sampled among the first `n`: every `step`-th, the first at `step - 1`.
pub fn free_sample_step(n: usize) -> usize {
    n.div_ceil(FREE_SAMPLES).max(1)
}

/// The events a trace's free memory is sampled over as its replay passes them: up to its last OOM, where the
/// analysis looks for the moments the fragments were worst (another pass otherwise, on a core the what-ifs want).
fn sampled_events(dev: &DeviceTimeline) -> usize {
    dev.events.iter().rposition(|e| e.action == Action::Oom).map_or(0, |i| i + 1)
}

/// Replays one device. Construction runs one forward pass (for the peak, checkpoints and the end-state check);
/// `state_at` starts from the nearest checkpoint.
pub struct Replay<'t> {
    dev: &'t DeviceTimeline,
    pub rules: Rules,
    pub completeness: Completeness,
    /// `checkpoints[k]` is the state before event `k * CHECKPOINT_EVERY`.
    checkpoints: Vec<State>,
    /// Events the replay could not apply as the allocator would have.
    pub anomalies: Vec<Anomaly>,
    /// Highest allocated bytes and the event after which it was reached (`None`: before the first event).
    pub peak_allocated: (u64, Option<u32>),
    pub peak_reserved: (u64, Option<u32>),
    /// How the replayed end differs from the file's final segments; `None` when it lands exactly.
    pub end_mismatch: Option<String>,
    /// Allocated bytes right after each event.
    pub allocated_series: Vec<u64>,
    /// Reserved bytes right after each event.
    pub reserved_series: StepSeries,
    /// The large pools' free memory at [`FREE_SAMPLES`] evenly spaced events among the first `.0` (up to the
    /// trace's last OOM; none without one).
    free_samples: (usize, Vec<LargePoolFree>),
}

/// A per-event series that changes at few events, kept as its change points: reserved bytes move only when a
/// segment comes or goes, and a million 8-byte values saying the same thing cost 8 MB.
#[derive(Clone, Debug, Default)]
pub struct StepSeries {
    /// (first event, value from it on); the first change is at event 0.
    changes: Vec<(u32, u64)>,
    len: usize,
}

impl StepSeries {
    fn push(&mut self, v: u64) {
        if self.changes.last().is_none_or(|c| c.1 != v) {
            self.changes.push((self.len as u32, v));
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value right after event `i`.
    pub fn get(&self, i: usize) -> Option<u64> {
        if i >= self.len {
            return None;
        }
        let k = self.changes.partition_point(|c| c.0 as usize <= i);
        Some(self.changes[k - 1].1)
    }

    pub fn max(&self) -> Option<u64> {
        self.changes.iter().map(|c| c.1).max()
    }

    /// The largest value in each run of `per` consecutive events, for a chart.
    pub fn chunk_max(&self, per: usize) -> Vec<u64> {
        let per = per.max(1);
        let mut out = Vec::with_capacity(self.len.div_ceil(per));
        let mut k = 0;
        for start in (0..self.len).step_by(per) {
            let end = (start + per).min(self.len);
            while k + 1 < self.changes.len() && self.changes[k + 1].0 as usize <= start {
                k += 1;
            }
            let mut m = self.changes[k].1;
            let mut j = k + 1;
            while j < self.changes.len() && (self.changes[j].0 as usize) < end {
                m = m.max(self.changes[j].1);
                j += 1;
            }
            out.push(m);
        }
        out
    }
}

struct Pass {
    checkpoints: Vec<State>,
    anomalies: Vec<Anomaly>,
    peak_allocated: (u64, Option<u32>),
    peak_reserved: (u64, Option<u32>),
    end: State,
    allocated_series: Vec<u64>,
    reserved_series: StepSeries,
    /// Free memory sampled among the first `sampled` events, the next sample after event `next_sample`.
    sampled: usize,
    next_sample: usize,
    free_samples: Vec<LargePoolFree>,
}

impl Pass {
    /// A pass about to replay `len` events from `start`, sampling free memory among the first `sampled`, its series
    /// written into `spare` where that has room: a pass that replaces one given up on takes over its buffer, whose
    /// pages are already backed (8 MB for a million events).
    fn reusing(start: State, len: usize, sampled: usize, mut spare: Vec<u64>) -> Pass {
        spare.clear();
        let allocated_series = if spare.capacity() >= len {
            spare
        } else {
            let v = Vec::with_capacity(len);
            crate::huge_pages::advise(&v);
            crate::huge_pages::populate_soon(&v, len * 8);
            v
        };
        Pass {
            checkpoints: Vec::with_capacity(len / CHECKPOINT_EVERY + 1),
            anomalies: Vec::new(),
            peak_allocated: (start.allocated, None),
            peak_reserved: (start.reserved, None),
            end: start,
            allocated_series,
            reserved_series: StepSeries::default(),
            sampled,
            next_sample: if sampled == 0 { usize::MAX } else { free_sample_step(sampled) - 1 },
            free_samples: Vec::new(),
        }
    }

    /// Replays `events[from..to]`, the events before `from` having been replayed already. With `tentative`, stops
    /// at the first event the allocator could not have done and returns `false`: the starting state was a guess.
    fn run(
        &mut self,
        events: &[Event],
        (from, to): (usize, usize),
        rules: &Rules,
        attrs: &EventAttrTable,
        tentative: bool,
    ) -> bool {
        let st = &mut self.end;
        for (i, e) in events.iter().enumerate().take(to).skip(from) {
            if i % CHECKPOINT_EVERY == 0 {
                self.checkpoints.push(st.clone());
            }
            if let Err(what) = st.apply(e, i as u32, rules, attrs) {
                if tentative {
                    return false;
                }
                self.anomalies.push(Anomaly { event: i as u32, what });
            }
            if st.allocated > self.peak_allocated.0 {
                self.peak_allocated = (st.allocated, Some(i as u32));
            }
            if st.reserved > self.peak_reserved.0 {
                self.peak_reserved = (st.reserved, Some(i as u32));
            }
            self.allocated_series.push(st.allocated);
            self.reserved_series.push(st.reserved);
            if i == self.next_sample {
                self.free_samples.push(st.large_pool_free(i as u32));
                self.next_sample += free_sample_step(self.sampled);
                if self.next_sample >= self.sampled {
                    self.next_sample = usize::MAX;
                }
            }
        }
        true
    }

    /// The series' buffer, emptied, for another pass.
    fn into_buffer(self) -> Vec<u64> {
        let mut v = self.allocated_series;
        v.clear();
        v
    }

    fn finish(mut self) -> Pass {
        if self.checkpoints.is_empty() {
            self.checkpoints.push(self.end.clone());
        }
        self
    }
}

/// The pass from `start`, its series written into `spare` where that has room.
fn forward(dev: &DeviceTimeline, start: State, (rules, sampled): (&Rules, usize), spare: Vec<u64>) -> Pass {
    let mut pass = Pass::reusing(start, dev.events.len(), sampled, spare);
    pass.run(&dev.events, (0, dev.events.len()), rules, &dev.event_attrs, false);
    pass.finish()
}

/// The pass from an empty device, or at its first anomaly the buffer of its series, for the pass that replaces it:
/// a trace whose ring buffer wrapped (the usual case for a long run) meets one within its first events.
fn forward_from_empty(dev: &DeviceTimeline, (rules, sampled): (&Rules, usize)) -> Result<Pass, Vec<u64>> {
    let mut pass = Pass::reusing(State::default(), dev.events.len(), sampled, Vec::new());
    if pass.run(&dev.events, (0, dev.events.len()), rules, &dev.event_attrs, true) {
        Ok(pass.finish())
    } else {
        Err(pass.into_buffer())
    }
}

/// The state before the first event, rebuilt by undoing the trace from the file's final state, and the events that
/// could not be undone.
fn undo(dev: &DeviceTimeline, rules: &Rules) -> (State, Vec<Anomaly>) {
    let mut st = State::from_segments(&dev.segments);
    st.undoing(true);
    let mut anomalies = Vec::new();
    for (i, e) in dev.events.iter().enumerate().rev() {
        if let Err(what) = st.unapply(e, rules, &dev.event_attrs) {
            anomalies.push(Anomaly { event: i as u32, what });
        }
    }
    st.undoing(false);
    anomalies.reverse();
    (st, anomalies)
}

/// The state before the first event, rebuilt from the file's final state by undoing at each address only what the
/// trace did there in sum: a block the trace allocated and the file still holds is let go of, a segment the trace
/// made is removed and one it released put back, and a block the trace freed without having allocated it is cut out
/// of the free space its frees show, the latest first, as the undo would meet them. One pass over the events (to find
/// each address's first event, [`first_events`]) where the undo makes a million changes to the state; `None` where
/// it cannot say (mapped ranges of expandable segments, or a change the state refuses), and what it returns is a
/// guess until a forward pass from it meets no anomaly and ends at the file's state.
fn start_by_first_events(dev: &DeviceTimeline, rules: &Rules, first: &FirstEvents) -> Option<State> {
    if first.mapped {
        return None;
    }
    let blocks = &first.blocks;
    let mut st = State::from_segments(&dev.segments);
    st.undoing(true);
    // What the trace allocated and the file holds: free at the start.
    for (&addr, f) in blocks {
        if f.allocated && st.blocks.get(&addr).is_some_and(|b| b.state != BlockState::Inactive) {
            st.unallocate(addr).ok()?;
        }
    }
    // Segments: every one the trace touched leaves first, then those it released come back, so that one put back
    // never meets one made later at an overlapping address, whatever order the map gives.
    for &addr in first.segments.keys() {
        if st.segments.contains_key(&addr) {
            st.remove_segment(addr).ok()?;
        }
    }
    for (&addr, &(i, _)) in &first.segments {
        let e = &dev.events[i as usize];
        if e.action == Action::SegmentFree {
            let attrs = dev.event_attrs.get(e);
            st.add_segment(addr, e.size, attrs.stream, attrs.pool_id(), false).ok()?;
        }
    }
    // Blocks from before the trace that it frees: cut out as the undo would, the latest free first.
    let mut carved: Vec<(u32, u32, u64)> = blocks
        .iter()
        .filter(|(_, f)| dev.events[f.event as usize].action != Action::Alloc)
        .map(|(&addr, f)| (f.completed, f.event, addr))
        .collect();
    carved.sort_unstable_by(|a, b| b.cmp(a));
    for (completed, first, _addr) in carved {
        if completed != NO_EVENT {
            st.carve(&dev.events[completed as usize], rules).ok()?;
        }
        let e = &dev.events[first as usize];
        if e.action == Action::FreeRequested {
            st.unapply(e, rules, &dev.event_attrs).ok()?;
        }
    }
    st.undoing(false);
    Some(st)
}

/// The forward pass from the start [`start_by_first_events`] finds, where it replays every event and ends at the
/// file's state; else the series' buffer back, for the undo's pass. On every real trace that must be rebuilt, where it does, that start is the one the
/// whole undo finds (`tests/it/replay_undo.rs`). A trace that replays whole from an empty device never gets here
/// (its first-event start is the empty device, which the pass from empty already refused).
fn from_first_events(
    dev: &DeviceTimeline,
    (rules, sampled): (&Rules, usize),
    first: &FirstEvents,
    spare: Vec<u64>,
) -> Result<Pass, Vec<u64>> {
    let Some(start) = start_by_first_events(dev, rules, first) else { return Err(spare) };
    let mut pass = Pass::reusing(start, dev.events.len(), sampled, spare);
    let whole = pass.run(&dev.events, (0, dev.events.len()), rules, &dev.event_attrs, true);
    if whole && pass.end.diff(&dev.segments).is_none() {
        Ok(pass.finish())
    } else {
        Err(pass.into_buffer())
    }
}

/// The pass from the start before the trace: the one its first events give where it holds, else the whole undo's,
/// with the undo's anomalies first.
fn from_rebuilt_start(dev: &DeviceTimeline, plan: (&Rules, usize), first: &FirstEvents, spare: Vec<u64>) -> Pass {
    from_first_events(dev, plan, first, spare).unwrap_or_else(|spare| {
        let (start, undone) = undo(dev, plan.0);
        let mut pass = forward(dev, start, plan, spare);
        pass.anomalies.splice(0..0, undone);
        pass
    })
}

/// For the tests: the start [`start_by_first_events`] finds against the one the whole undo finds, as
/// `(agree, accepted)`: whether the two states are the same, and whether the forward pass from the first met no
/// anomaly and ended at the file's state (`None`: a trace whose replay rebuilds no start).
#[doc(hidden)]
pub fn start_by_first_events_agrees(
    dev: &DeviceTimeline,
    settings: Option<&AllocatorSettings>,
) -> Option<(bool, bool)> {
    let rules = Rules::new(settings, dev);
    let plan = (&rules, sampled_events(dev));
    let first = first_events(dev);
    // Where `Replay::new` rebuilds a start: the pass from empty fails or ends elsewhere, and the trace is not whole.
    let ends_right = |p: Pass| p.end.diff(&dev.segments).is_none();
    if dev.events.is_empty() || forward_from_empty(dev, plan).is_ok_and(ends_right) || first.completeness.complete() {
        return None;
    }
    let (undone, anomalies) = undo(dev, &rules);
    let Some(start) = start_by_first_events(dev, &rules, &first) else { return Some((false, false)) };
    let same = anomalies.is_empty() && state_seen(&undone) == state_seen(&start);
    let pass = forward(dev, start, plan, Vec::new());
    Some((same, pass.anomalies.is_empty() && pass.end.diff(&dev.segments).is_none()))
}

/// A state as the tests compare it: the layout, and what describes each block in use (free blocks' descriptions are
/// read by nothing, and a map's order is not part of a state).
fn state_seen(st: &State) -> String {
    let mut segs: Vec<_> = st.segments.values().map(|s| format!("{s:?}")).collect();
    segs.sort();
    let mut blocks: Vec<_> = st
        .blocks
        .iter()
        .map(|(a, b)| match b.state {
            BlockState::Inactive => format!("{a:x} {} {:?} {:?} {:?}", b.size, b.segment, b.prev, b.next),
            _ => format!("{a:x} {b:?}"),
        })
        .collect();
    blocks.sort();
    format!("{} {} {} {segs:?} {blocks:?}", st.allocated, st.active, st.reserved)
}

/// For the tests (`tests/it/replay_undo.rs`): undoes the whole trace finding each free's block by the index of block
/// starts from the first event, and again by walking the segments' chains only, and says whether the two rebuilt the
/// same state with the same anomalies (`None`: no trace).
#[doc(hidden)]
pub fn undo_with_index_agrees(dev: &DeviceTimeline, settings: Option<&AllocatorSettings>) -> Option<bool> {
    if dev.events.is_empty() {
        return None;
    }
    let rules = Rules::new(settings, dev);
    let undo_all = |indexed: bool| {
        let mut st = State::from_segments(&dev.segments);
        if indexed {
            st.undoing(true);
            st.starts = Some(st.index_of_starts());
        }
        let mut anomalies = Vec::new();
        for (i, e) in dev.events.iter().enumerate().rev() {
            if let Err(what) = st.unapply(e, &rules, &dev.event_attrs) {
                anomalies.push((i, what));
            }
        }
        (state_seen(&st), anomalies)
    };
    Some(undo_all(true) == undo_all(false))
}

impl<'t> Replay<'t> {
    pub fn new(dev: &'t DeviceTimeline, settings: Option<&AllocatorSettings>) -> Replay<'t> {
        let rules = Rules::new(settings, dev);
        // Read once: each pass samples free memory over the same events.
        let plan = (&rules, sampled_events(dev));
        // Most traces with a history start from an empty device: try that first, it needs no extra pass.
        let (pass, completeness) = match forward_from_empty(dev, plan) {
            Ok(pass) if dev.events.is_empty() => (pass, completeness(dev)),
            // Every event applied; if the end is not the file's, rebuild the start when the trace is not whole.
            Ok(pass) => match pass.end.diff(&dev.segments) {
                None => return Replay::of(dev, rules, Completeness::default(), pass, None),
                Some(mismatch) => {
                    let first = first_events(dev);
                    if first.completeness.complete() {
                        return Replay::of(dev, rules, first.completeness, pass, Some(mismatch));
                    }
                    (from_rebuilt_start(dev, plan, &first, pass.into_buffer()), first.completeness)
                }
            },
            // Mostly a trace that starts mid-way (its ring buffer wrapped): its start is rebuilt from the file's
            // final state.
            Err(spare) => {
                let first = first_events(dev);
                let pass = if first.completeness.complete() {
                    // A whole history with events the allocator could not have done: replay it all from empty,
                    // anomalies and all.
                    forward(dev, State::default(), plan, spare)
                } else {
                    from_rebuilt_start(dev, plan, &first, spare)
                };
                (pass, first.completeness)
            }
        };
        let end_mismatch = if dev.events.is_empty() { None } else { pass.end.diff(&dev.segments) };
        Replay::of(dev, rules, completeness, pass, end_mismatch)
    }

    fn of(
        dev: &'t DeviceTimeline,
        rules: Rules,
        completeness: Completeness,
        pass: Pass,
        end_mismatch: Option<String>,
    ) -> Replay<'t> {
        Replay {
            dev,
            rules,
            completeness,
            checkpoints: pass.checkpoints,
            anomalies: pass.anomalies,
            peak_allocated: pass.peak_allocated,
            peak_reserved: pass.peak_reserved,
            end_mismatch,
            allocated_series: pass.allocated_series,
            reserved_series: pass.reserved_series,
            free_samples: (pass.sampled, pass.free_samples),
        }
    }

    /// The large pools' free memory at [`FREE_SAMPLES`] evenly spaced events among the first `n`, where the
    /// replay sampled those as it passed them (`n` up to the trace's last OOM); `None` otherwise.
    pub fn free_samples(&self, n: usize) -> Option<&[LargePoolFree]> {
        (n > 0 && self.free_samples.0 == n).then_some(&self.free_samples.1[..])
    }

    /// Whether the trace reaches back to an empty allocator.
    pub fn complete(&self) -> bool {
        !self.dev.events.is_empty() && self.completeness.complete()
    }

    /// The state right after event `idx` (`None`: before the first event). Exact from the file when nothing after
    /// `idx` changes the allocator's state.
    pub fn state_at(&self, idx: Option<u32>) -> State {
        let upto = idx.map_or(0, |i| i as usize + 1).min(self.dev.events.len());
        if self.dev.events[upto..].iter().all(|e| e.action.is_marker()) {
            let mut st = State::from_segments(&self.dev.segments);
            self.attach_alloc_events(&mut st);
            return st;
        }
        let k = (upto / CHECKPOINT_EVERY).min(self.checkpoints.len() - 1);
        let mut st = self.checkpoints[k].clone();
        let from = k * CHECKPOINT_EVERY;
        for (i, e) in self.dev.events[from..upto].iter().enumerate() {
            let _ = st.apply(e, (from + i) as u32, &self.rules, &self.dev.event_attrs);
        }
        st
    }

    /// Advances `st`, the state right after event `from` (`None`: before the first), to right after event `to`,
    /// replaying only the events in between. For stepping a cursor forward without going back to a checkpoint.
    pub fn advance(&self, st: &mut State, from: Option<u32>, to: u32) {
        let start = from.map_or(0, |f| f as usize + 1);
        for i in start..=(to as usize).min(self.dev.events.len().saturating_sub(1)) {
            let _ = st.apply(&self.dev.events[i], i as u32, &self.rules, &self.dev.event_attrs);
        }
    }

    /// The device this replay is of.
    pub fn device(&self) -> &'t DeviceTimeline {
        self.dev
    }

    /// The file's segments do not say which trace event made each block; find it (the last `alloc` at the
    /// block's address).
    fn attach_alloc_events(&self, st: &mut State) {
        let mut last_alloc: rustc_hash::FxHashMap<u64, u32> = Default::default();
        for (i, e) in self.dev.events.iter().enumerate() {
            if e.action == Action::Alloc {
                last_alloc.insert(e.addr, i as u32);
            }
        }
        for (a, b) in st.blocks.iter_mut() {
            if b.state != BlockState::Inactive {
                b.alloc_event = last_alloc.get(a).copied();
                if b.stack == EMPTY_STACK {
                    if let Some(&i) = last_alloc.get(a) {
                        b.stack = self.dev.events[i as usize].stack;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Block;

    #[test]
    fn rounding_matches_the_allocator() {
        let r = Rules::default();
        assert_eq!(r.round(1), 512);
        assert_eq!(r.round(512), 512);
        assert_eq!(r.round(513), 1024);
        let r = Rules { divisions: vec![(1, 4)], ..Rules::default() };
        // 5 MiB + 1 with 4 divisions between 4 MiB and 8 MiB rounds up to 6 MiB.
        assert_eq!(r.round((5 << 20) + 1), 6 << 20);
        assert_eq!(r.round(4 << 20), 4 << 20);
    }

    fn ev(action: Action, addr: u64, size: u64) -> Event {
        Event::new(action, addr, size)
    }

    #[test]
    fn split_and_merge_follow_pool_rules() {
        let r = Rules::default();
        let mut st = State::default();
        let a = 0x1000_0000;
        st.apply(&ev(Action::SegmentAlloc, a, 20 << 20), 0, &r, &EventAttrTable::default()).unwrap();
        // Large pool: 19.5 MiB left > 1 MiB, so it splits.
        st.apply(&ev(Action::Alloc, a, (1 << 20) + 100), 1, &r, &EventAttrTable::default()).unwrap();
        assert_eq!(st.allocated, (1 << 20) + 512);
        // Next request leaves 0.9 MiB: no split, the block keeps the remainder.
        let next = a + (1 << 20) + 512;
        let rest = (20 << 20) - (1 << 20) - 512;
        st.apply(&ev(Action::Alloc, next, rest - 900_000), 2, &r, &EventAttrTable::default()).unwrap();
        assert_eq!(st.allocated, 20 << 20);
        st.apply(&ev(Action::FreeRequested, a, 0), 3, &r, &EventAttrTable::default()).unwrap();
        st.apply(&ev(Action::FreeCompleted, a, 0), 4, &r, &EventAttrTable::default()).unwrap();
        st.apply(&ev(Action::FreeCompleted, next, 0), 5, &r, &EventAttrTable::default()).unwrap();
        assert_eq!(st.allocated, 0);
        assert_eq!(st.largest_free_block(), 20 << 20);
        assert_eq!(st.block_count(), 1);
        st.apply(&ev(Action::SegmentFree, a, 20 << 20), 6, &r, &EventAttrTable::default()).unwrap();
        assert_eq!(st.reserved, 0);
    }

    #[test]
    fn expandable_map_and_unmap() {
        let r = Rules { expandable: true, ..Rules::default() };
        let mut st = State::default();
        let a = 0x7000_0000;
        st.apply(&ev(Action::SegmentMap, a, 2 << 20), 0, &r, &EventAttrTable::default()).unwrap();
        st.apply(&ev(Action::SegmentMap, a + (2 << 20), 4 << 20), 1, &r, &EventAttrTable::default()).unwrap();
        assert_eq!(st.segments.len(), 1);
        assert_eq!(st.largest_free_block(), 6 << 20);
        st.apply(&ev(Action::Alloc, a, 1 << 20), 2, &r, &EventAttrTable::default()).unwrap();
        st.apply(&ev(Action::SegmentUnmap, a + (4 << 20), 2 << 20), 3, &r, &EventAttrTable::default()).unwrap();
        assert_eq!(st.reserved, 4 << 20);
        assert_eq!(st.largest_free_block(), 3 << 20);
    }

    fn device_of(events: Vec<Event>, segments: Vec<Segment>) -> DeviceTimeline {
        DeviceTimeline { events, segments, ..DeviceTimeline::default() }
    }

    fn segment(address: u64, blocks: Vec<(u64, u64, BlockState)>) -> Segment {
        Segment {
            device: 0,
            address,
            total_size: blocks.iter().map(|b| b.1).sum(),
            stream: 0,
            kind: PoolKind::Large,
            pool_id: (0, 0),
            expandable: false,
            stack: EMPTY_STACK,
            blocks: blocks
                .into_iter()
                .map(|(address, size, state)| Block { address, size, requested_size: None, state, stack: EMPTY_STACK })
                .collect(),
            declared_allocated: None,
            declared_active: None,
        }
    }

    #[test]
    fn a_start_from_first_events_is_taken_where_it_explains_every_event_and_the_undo_would_not() {
        // The undo carves the block freed at the end out of the 4.5 MiB free then (the trace's own blocks still
        // held): 0.5 MiB is not worth splitting off, the block takes it, and the events before meet a block too
        // large. The start read off first events sees the whole 20 MiB free, splits, and every event applies.
        let (b, mib) = (0x1000_0000u64, 1u64 << 20);
        let half = mib / 2;
        let dev = device_of(
            vec![
                ev(Action::Alloc, b + 4 * mib, half),
                ev(Action::Alloc, b + 4 * mib + half, 15 * mib + half),
                ev(Action::FreeRequested, b + 4 * mib, half),
                ev(Action::FreeCompleted, b + 4 * mib, half),
                ev(Action::FreeRequested, b, 4 * mib),
                ev(Action::FreeCompleted, b, 4 * mib),
            ],
            vec![segment(
                b,
                vec![
                    (b, 4 * mib + half, BlockState::Inactive),
                    (b + 4 * mib + half, 15 * mib + half, BlockState::ActiveAllocated),
                ],
            )],
        );
        let r = Replay::new(&dev, None);
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
        assert_eq!(r.end_mismatch, None);
        assert_eq!(
            r.allocated_series,
            vec![4 * mib + half, 20 * mib, 19 * mib + half, 19 * mib + half, 15 * mib + half, 15 * mib + half]
        );
        assert_eq!(r.peak_allocated, (20 * mib, Some(1)));
    }

    #[test]
    fn a_block_that_does_not_start_its_segment_is_an_anomaly_not_a_panic() {
        // Nothing checks on reading that a segment's first block starts at its address; the start rebuilt from first
        // events removes the segment the trace made before carving the block it frees, which is then in no segment.
        let g = 0x2000_0000u64;
        let dev = device_of(
            vec![ev(Action::SegmentAlloc, g, 20 << 20), ev(Action::FreeCompleted, g + (2 << 20), 4 << 20)],
            vec![segment(g, vec![(g + (2 << 20), 18 << 20, BlockState::Inactive)])],
        );
        let r = Replay::new(&dev, None);
        assert!(!r.complete());
        assert!(!r.anomalies.is_empty() || r.end_mismatch.is_some());
    }

    // The three ways a replay finds its starting state: the first pass from an empty device stops at its first
    // anomaly, and what follows must be what a full pass would have given.
    #[test]
    fn a_whole_history_from_empty_keeps_every_anomaly() {
        let a = 0x1000_0000;
        // Complete (every block the trace frees, it allocated), but one alloc lands where no segment is.
        let dev = device_of(
            vec![
                ev(Action::SegmentAlloc, a, 20 << 20),
                ev(Action::Alloc, a + (30 << 20), 2 << 20),
                ev(Action::Alloc, a, 2 << 20),
                ev(Action::FreeRequested, a, 0),
                ev(Action::FreeCompleted, a, 0),
                ev(Action::FreeRequested, a + (30 << 20), 0),
            ],
            vec![segment(a, vec![(a, 20 << 20, BlockState::Inactive)])],
        );
        let r = Replay::new(&dev, None);
        assert!(r.complete());
        let events: Vec<u32> = r.anomalies.iter().map(|x| x.event).collect();
        assert_eq!(events, [1, 5]);
        assert_eq!(r.allocated_series.len(), 6);
        assert_eq!(r.peak_allocated, (2 << 20, Some(2)));
    }

    #[test]
    fn a_wrapped_trace_starts_from_the_state_rebuilt_backward() {
        let a = 0x1000_0000;
        // The block at `a` was allocated before the trace began; the trace allocates the free block after it,
        // then frees `a`.
        let dev = device_of(
            vec![
                ev(Action::Alloc, a + (4 << 20), 16 << 20),
                ev(Action::FreeRequested, a, 4 << 20),
                ev(Action::FreeCompleted, a, 4 << 20),
            ],
            vec![segment(
                a,
                vec![(a, 4 << 20, BlockState::Inactive), (a + (4 << 20), 16 << 20, BlockState::ActiveAllocated)],
            )],
        );
        let r = Replay::new(&dev, None);
        assert!(!r.complete());
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
        assert_eq!(r.end_mismatch, None);
        assert_eq!(r.allocated_series.first(), Some(&(20 << 20)));
        assert_eq!(r.allocated_series.last(), Some(&(16 << 20)));
    }

    #[test]
    fn the_completeness_count_says_what_the_trace_lacks() {
        let a = 0x1000_0000;
        let wrapped = device_of(
            vec![ev(Action::FreeRequested, a, 4 << 20), ev(Action::FreeCompleted, a, 4 << 20)],
            vec![segment(a, vec![(a, 4 << 20, BlockState::Inactive)])],
        );
        let lacks = Completeness { frees_without_alloc: 2, live_without_alloc: 0, segments_without_alloc: 1 };
        assert_eq!(completeness(&wrapped), lacks);
        assert_eq!(Replay::new(&wrapped, None).completeness, lacks);
        let late = device_of(
            vec![ev(Action::Alloc, a + (4 << 20), 4 << 20)],
            vec![segment(
                a,
                vec![(a, 4 << 20, BlockState::ActiveAllocated), (a + (4 << 20), 4 << 20, BlockState::ActiveAllocated)],
            )],
        );
        let lacks = Completeness { frees_without_alloc: 0, live_without_alloc: 1, segments_without_alloc: 1 };
        assert_eq!(completeness(&late), lacks);
        let whole =
            device_of(vec![ev(Action::SegmentAlloc, a, 20 << 20), ev(Action::SegmentFree, a, 20 << 20)], vec![]);
        assert!(completeness(&whole).complete());
    }

    #[test]
    fn a_clean_history_from_empty_needs_no_second_pass() {
        let a = 0x1000_0000;
        let dev = device_of(
            vec![ev(Action::SegmentAlloc, a, 20 << 20), ev(Action::Alloc, a, 20 << 20)],
            vec![segment(a, vec![(a, 20 << 20, BlockState::ActiveAllocated)])],
        );
        let r = Replay::new(&dev, None);
        assert!(r.complete());
        assert!(r.anomalies.is_empty());
        assert_eq!(r.end_mismatch, None);
        assert_eq!(r.allocated_series, [0, 20 << 20]);
    }

    #[test]
    fn step_series_reads_like_the_full_series() {
        let full: Vec<u64> = [5, 5, 5, 9, 9, 2, 2, 2, 2, 7, 7, 3].to_vec();
        let mut st = StepSeries::default();
        for &v in &full {
            st.push(v);
        }
        assert_eq!(st.changes.len(), 5);
        assert_eq!(st.len(), full.len());
        for (i, &v) in full.iter().enumerate() {
            assert_eq!(st.get(i), Some(v), "event {i}");
        }
        assert_eq!(st.get(full.len()), None);
        assert_eq!(st.max(), Some(9));
        for per in 1..=13 {
            let naive: Vec<u64> = full.chunks(per).map(|c| *c.iter().max().unwrap()).collect();
            assert_eq!(st.chunk_max(per), naive, "per {per}");
        }
        assert!(StepSeries::default().chunk_max(4).is_empty());
    }
}
