//! Allocated and reserved memory over a trace, reduced for a picture: at most [`BUCKETS`] runs of consecutive
//! events, each with its lowest and highest allocated bytes and its highest reserved bytes. A million events draw
//! as well as a thousand, and the page that shows them stays light.

use crate::timeline::replay::Replay;

/// Buckets in a chart: about one per pixel of a wide chart.
pub const BUCKETS: usize = 1200;

#[derive(Clone, Debug, Default)]
pub struct Chart {
    /// Events per bucket (the last may hold fewer).
    pub per: usize,
    pub events: usize,
    pub alloc_min: Vec<u64>,
    pub alloc_max: Vec<u64>,
    pub reserved_max: Vec<u64>,
    /// The time of each bucket's first event that has one (µs, the trace's clock): places nvidia-smi samples.
    pub time_us: Vec<Option<i64>>,
    /// Allocated bytes by category at each bucket's highest point, when asked for ([`split_by_category`]): the
    /// categories (largest at the peak first), and per bucket their bytes in that order, summing to `alloc_max`.
    pub categories: Vec<&'static str>,
    pub by_category: Vec<Vec<u64>>,
    /// The last event of each pass of the program's loop, where the analysis found them (optimizer steps, snapshot
    /// markers, a repeating sequence of stacks): the axis of two runs compared iteration by iteration.
    pub iteration_ends: Vec<usize>,
}

impl Chart {
    /// The bucket event `i` falls in.
    pub fn bucket_of(&self, i: u32) -> usize {
        (i as usize / self.per.max(1)).min(self.alloc_max.len().saturating_sub(1))
    }

    /// The bucket a time falls in (the last bucket that started at or before it), if the trace has times and
    /// the time is inside it.
    pub fn bucket_at(&self, t: i64) -> Option<usize> {
        let first = self.time_us.iter().flatten().next()?;
        let last = self.time_us.iter().rev().flatten().next()?;
        if t < *first || t > *last + 1_000_000 {
            return None;
        }
        self.time_us.iter().rposition(|b| b.is_some_and(|b| b <= t))
    }

    pub fn top(&self) -> u64 {
        self.alloc_max.iter().chain(&self.reserved_max).copied().max().unwrap_or(0)
    }
}

/// The chart of a replayed trace (`None` without events).
pub fn of(replay: &Replay, events: &[crate::timeline::Event]) -> Option<Chart> {
    let series = &replay.allocated_series;
    if series.is_empty() {
        return None;
    }
    let per = series.len().div_ceil(BUCKETS).max(1);
    let (mut alloc_min, mut alloc_max) = (Vec::new(), Vec::new());
    for chunk in series.chunks(per) {
        alloc_min.push(chunk.iter().copied().min().unwrap_or(0));
        alloc_max.push(chunk.iter().copied().max().unwrap_or(0));
    }
    let mut reserved_max = replay.reserved_series.chunk_max(per);
    reserved_max.resize(alloc_max.len(), reserved_max.last().copied().unwrap_or(0));
    let time_us = events.chunks(per).map(|chunk| chunk.iter().find_map(|e| e.time_us())).collect();
    Some(Chart {
        per,
        events: series.len(),
        alloc_min,
        alloc_max,
        reserved_max,
        time_us,
        categories: Vec::new(),
        by_category: Vec::new(),
        iteration_ends: Vec::new(),
    })
}

/// Splits each bucket's highest allocated bytes by category: one pass over the trace from the replay's state before
/// it (blocks live since before the trace take the category the report's attribution gives them there: their
/// stack's, or what their lifetime and size say where they have none), following each block's category from its
/// allocation to its free. The allocator rounds, so the walk's bytes are scaled to the replay's exact total at that
/// event.
pub fn split_by_category(
    c: &mut Chart,
    tl: &crate::timeline::Timeline,
    replay: &Replay,
    cache: &mut crate::analysis::categories::CategoryCache,
) {
    use crate::analysis::categories::CATEGORIES;
    use crate::timeline::Action;
    let series = &replay.allocated_series;
    let events = &replay.device().events;
    if series.len() != events.len() || series.is_empty() {
        return;
    }
    let index = |name: &str| CATEGORIES.iter().position(|c| *c == name).unwrap_or(CATEGORIES.len() - 1);
    let mut live: rustc_hash::FxHashMap<u64, (u8, u64)> = rustc_hash::FxHashMap::default();
    let mut totals = vec![0u64; CATEGORIES.len()];
    let start = replay.state_at(None);
    let end = || replay.state_at(events.len().checked_sub(1).map(|i| i as u32));
    let before = crate::analysis::attribution::attribute(tl, replay.device(), &start, 0, end, cache);
    for (_, addr, b) in start.allocated_blocks() {
        let k = index(before.of(addr).category);
        live.insert(addr, (k as u8, b.size));
        totals[k] += b.size;
    }
    // The event of each bucket's highest allocated value.
    let peaks: Vec<usize> = series
        .chunks(c.per)
        .enumerate()
        .map(|(i, chunk)| {
            i * c.per + chunk.iter().enumerate().max_by_key(|(j, v)| (**v, std::cmp::Reverse(*j))).map_or(0, |m| m.0)
        })
        .collect();
    let mut split = Vec::with_capacity(peaks.len());
    let mut next = 0;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                let k = index(cache.of(e.stack));
                let size = replay.rules.round(e.size);
                if let Some((old_k, old)) = live.insert(e.addr, (k as u8, size)) {
                    totals[old_k as usize] -= old.min(totals[old_k as usize]);
                }
                totals[k] += size;
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some((k, size)) = live.remove(&e.addr) {
                    totals[k as usize] -= size.min(totals[k as usize]);
                }
            }
            _ => {}
        }
        while next < peaks.len() && peaks[next] == i {
            let sum: u64 = totals.iter().sum();
            let exact = series[i];
            let scaled: Vec<u64> = if sum == 0 {
                let mut v = vec![0; totals.len()];
                *v.last_mut().expect("categories") = exact;
                v
            } else {
                totals.iter().map(|&t| (t as u128 * exact as u128 / sum as u128) as u64).collect()
            };
            split.push(scaled);
            next += 1;
        }
    }
    // Categories that ever hold memory, largest at the chart's top first.
    let top = c.alloc_max.iter().enumerate().max_by_key(|(_, v)| **v).map_or(0, |m| m.0);
    let mut used: Vec<usize> = (0..CATEGORIES.len()).filter(|&k| split.iter().any(|v| v[k] > 0)).collect();
    used.sort_by_key(|&k| std::cmp::Reverse(split.get(top).map_or(0, |v| v[k])));
    c.categories = used.iter().map(|&k| CATEGORIES[k]).collect();
    c.by_category = split.iter().map(|v| used.iter().map(|&k| v[k]).collect()).collect();
}

/// Segments drawn: the largest ones (a map of thousands of segments would be a texture, not a picture).
pub const SEGMENTS_SHOWN: usize = 48;

/// The caching allocator's segments at the moment, each as its blocks in address order: what is allocated, what
/// waits for another stream, what is free and where.
#[derive(Clone, Debug, Default)]
pub struct SegmentMap {
    /// The largest segments, largest first.
    pub segments: Vec<SegmentBar>,
    pub total_segments: usize,
}

#[derive(Clone, Debug)]
pub struct SegmentBar {
    pub address: u64,
    pub size: u64,
    pub expandable: bool,
    /// Runs of blocks of one state, in address order: (bytes, state).
    pub runs: Vec<(u64, crate::timeline::BlockState)>,
    /// Live blocks that pin free memory at a fragmentation OOM: (offset in the segment, bytes).
    pub pinning: Vec<(u64, u64)>,
}

/// Marks the pinning blocks (by address) on the map's segments.
pub fn mark_pinning(map: &mut SegmentMap, state: &crate::timeline::replay::State, addresses: &[u64]) {
    for bar in &mut map.segments {
        for (addr, b) in state.segment_blocks(bar.address) {
            if addresses.binary_search(&addr).is_ok() {
                bar.pinning.push((addr - bar.address, b.size));
            }
        }
    }
}

/// The map of a state (`None` without segments).
pub fn segment_map(state: &crate::timeline::replay::State) -> Option<SegmentMap> {
    let mut segs = state.segments_sorted();
    if segs.is_empty() {
        return None;
    }
    let total_segments = segs.len();
    segs.sort_by_key(|s| (std::cmp::Reverse(s.size), s.addr));
    segs.truncate(SEGMENTS_SHOWN);
    let segments = segs
        .into_iter()
        .map(|s| {
            let mut runs: Vec<(u64, crate::timeline::BlockState)> = Vec::new();
            for (_, b) in state.segment_blocks(s.addr) {
                match runs.last_mut() {
                    Some(r) if r.1 == b.state => r.0 += b.size,
                    _ => runs.push((b.size, b.state)),
                }
            }
            SegmentBar { address: s.addr, size: s.size, expandable: s.expandable, runs, pinning: Vec::new() }
        })
        .collect();
    Some(SegmentMap { segments, total_segments })
}
