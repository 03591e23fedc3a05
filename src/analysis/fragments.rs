//! At a fragmentation OOM: the live allocations that pin the pool's free memory in pieces (the blocks whose
//! segments hold free bytes the request could not use, which neither merge into one block nor go back to the
//! driver while they live), and the moments over the trace when the free-but-unusable memory was largest.

use serde::Serialize;

use super::model::OomReport;
use super::stacks::culprit;
use crate::timeline::replay::{free_sample_step, LargePoolFree, Replay, State};
use crate::timeline::stacks::StackId;
use crate::timeline::{BlockState, DeviceTimeline, PoolKind, Timeline};

/// The stacks named, at most.
const STACKS_SHOWN: usize = 5;
/// The moments of worst fragmentation named, at most.
const MOMENTS_SHOWN: usize = 3;

#[derive(Clone, Debug, Serialize)]
pub struct Pinning {
    /// The request that did not fit, and the pool and stream it searched.
    pub requested_bytes: u64,
    /// Free bytes in the segments of that pool that also hold live blocks: what the pinning blocks keep from
    /// merging into one block or being released.
    pub pinned_free_bytes: u64,
    /// Segments of the pool holding both live blocks and free ones.
    pub segments: usize,
    /// Live blocks in them.
    pub blocks: usize,
    /// By allocating stack, the most pinned free bytes first.
    pub by_stack: Vec<PinningStack>,
    /// Over the trace (sampled), the moments when the most free memory was pinned: free bytes of the large pool in
    /// segments that also hold live blocks (those can neither be released nor merge across segments).
    pub worst_moments: Vec<FragmentedMoment>,
    /// The pinning blocks' addresses, to mark them on the segment map.
    #[serde(skip)]
    pub addresses: Vec<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PinningStack {
    /// Where it was allocated (the user's line).
    pub stack: String,
    pub blocks: usize,
    pub live_bytes: u64,
    /// The free bytes of their segments, shared out by their live bytes.
    pub pinned_free_bytes: u64,
    /// How long before the OOM they were allocated: the youngest and the oldest (null where the trace has no
    /// times or their allocation is not in it).
    pub youngest_age_us: Option<i64>,
    pub oldest_age_us: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FragmentedMoment {
    pub event_index: u32,
    pub time_us: Option<i64>,
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// Free bytes in segments that also hold live blocks.
    pub pinned_free_bytes: u64,
}

/// The pinning at a fragmentation OOM (the request no larger than the pool's cached free bytes, larger than its
/// largest free block), found from the state there; `None` otherwise. Its worst moments are left for the caller
/// to fill from [`worst_moments`] up to the OOM's event (a replay: run beside other work).
pub fn pinning(tl: &Timeline, dev: &DeviceTimeline, state: &State, oom: &OomReport) -> Option<Pinning> {
    let requested = oom.requested_bytes?;
    let (free, largest) = (oom.cached_free_in_pool_bytes?, oom.largest_free_in_pool_bytes?);
    if requested > free || requested <= largest {
        return None;
    }
    let kind = if requested <= 1 << 20 { PoolKind::Small } else { PoolKind::Large };
    let stream = oom.stream.unwrap_or(0);
    let now = oom.time_us;
    #[derive(Default)]
    struct Acc {
        blocks: usize,
        live: u64,
        pinned: f64,
        ages: Vec<i64>,
    }
    let mut by_stack: rustc_hash::FxHashMap<StackId, Acc> = Default::default();
    let (mut pinned_free, mut segments, mut blocks) = (0u64, 0usize, 0usize);
    let mut addresses = Vec::new();
    for seg in state.segments_sorted() {
        if seg.stream != stream || seg.kind.is_some_and(|k| k != kind) {
            continue;
        }
        let mut free_here = 0u64;
        let mut live: Vec<(u64, u64, StackId, Option<u32>)> = Vec::new();
        for (addr, b) in state.segment_blocks(seg.addr) {
            match b.state {
                BlockState::Inactive => free_here += b.size,
                _ => live.push((addr, b.size, b.stack, b.alloc_event)),
            }
        }
        if free_here == 0 || live.is_empty() {
            continue;
        }
        segments += 1;
        pinned_free += free_here;
        blocks += live.len();
        let live_total: u64 = live.iter().map(|l| l.1).sum::<u64>().max(1);
        for (addr, size, stack, alloc_event) in live {
            addresses.push(addr);
            let a = by_stack.entry(stack).or_default();
            a.blocks += 1;
            a.live += size;
            a.pinned += free_here as f64 * size as f64 / live_total as f64;
            let born = alloc_event.and_then(|i| dev.events.get(i as usize)).and_then(|e| e.time_us());
            if let (Some(t), Some(b)) = (now, born) {
                a.ages.push((t - b).max(0));
            }
        }
    }
    if segments == 0 {
        return None;
    }
    let mut stacks: Vec<PinningStack> = by_stack
        .into_iter()
        .map(|(stack, a)| PinningStack {
            stack: culprit(tl, stack),
            blocks: a.blocks,
            live_bytes: a.live,
            pinned_free_bytes: a.pinned.round() as u64,
            youngest_age_us: a.ages.iter().min().copied(),
            oldest_age_us: a.ages.iter().max().copied(),
        })
        .collect();
    stacks.sort_by(|a, b| b.pinned_free_bytes.cmp(&a.pinned_free_bytes).then(a.stack.cmp(&b.stack)));
    // The same line may own several stacks (different callers): one row per line.
    let mut merged: Vec<PinningStack> = Vec::new();
    for s in stacks {
        match merged.iter_mut().find(|m| m.stack == s.stack) {
            Some(m) => {
                m.blocks += s.blocks;
                m.live_bytes += s.live_bytes;
                m.pinned_free_bytes += s.pinned_free_bytes;
                m.youngest_age_us = min_opt(m.youngest_age_us, s.youngest_age_us);
                m.oldest_age_us = m.oldest_age_us.max(s.oldest_age_us);
            }
            None => merged.push(s),
        }
    }
    merged.truncate(STACKS_SHOWN);
    addresses.sort_unstable();
    Some(Pinning {
        requested_bytes: requested,
        pinned_free_bytes: pinned_free,
        segments,
        blocks,
        by_stack: merged,
        worst_moments: Vec::new(),
        addresses,
    })
}

/// The large pools' free memory at evenly spaced events among the first `n` (see [`Replay::free_samples`]), by a
/// replay of them; public for the test that holds the replay's own samples to it.
#[doc(hidden)]
pub fn free_samples_replayed(replay: &Replay, n: usize) -> Vec<LargePoolFree> {
    let step = free_sample_step(n);
    let mut st = replay.state_at(None);
    let mut at: Option<u32> = None;
    (step - 1..n)
        .step_by(step)
        .map(|i| {
            replay.advance(&mut st, at, i as u32);
            at = Some(i as u32);
            st.large_pool_free(i as u32)
        })
        .collect()
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The large pool's pinned free memory at evenly spaced events up to `last`: the worst few stretches, each named by
/// its worst sample. Read off the replay where `last` is the trace's last OOM (it sampled them as it passed);
/// otherwise a replay of the trace up to `last`, which the analysis runs beside the what-ifs, where [`pinning`]
/// found the OOM's fragments pinned.
pub fn worst_moments(dev: &DeviceTimeline, replay: &Replay, last: Option<u32>) -> Vec<FragmentedMoment> {
    let n = last.map_or(dev.events.len(), |l| l as usize + 1);
    if n == 0 {
        return Vec::new();
    }
    // The replay sampled them as it passed, where `last` is the trace's last OOM.
    let samples: Vec<LargePoolFree> = match replay.free_samples(n) {
        Some(s) => s.to_vec(),
        None => free_samples_replayed(replay, n),
    };
    let samples: Vec<FragmentedMoment> = samples
        .into_iter()
        .map(|s| FragmentedMoment {
            event_index: s.event,
            time_us: dev.events[s.event as usize].time_us(),
            cached_free_bytes: s.cached,
            largest_free_block_bytes: s.largest_block,
            pinned_free_bytes: s.pinned,
        })
        .collect();
    let mut order: Vec<usize> = (0..samples.len()).filter(|&k| samples[k].pinned_free_bytes > 0).collect();
    order.sort_by(|&a, &b| samples[b].pinned_free_bytes.cmp(&samples[a].pinned_free_bytes).then(a.cmp(&b)));
    // A lesser moment is named only when it is its own episode: between it and every moment named before it, the
    // pinned memory fell to half of its own or less (a ramp or a sawtooth is one episode), and it reaches a quarter
    // of the worst.
    let v = |j: usize| samples[j].pinned_free_bytes;
    let mut chosen: Vec<usize> = Vec::new();
    let top = order.first().map_or(0, |&k| v(k));
    for k in order {
        if v(k) * 4 < top {
            break;
        }
        let own = chosen.iter().all(|&c| {
            let (a, b) = if c < k { (c, k) } else { (k, c) };
            (a..=b).map(v).min().unwrap_or(0) * 2 <= v(k)
        });
        if own {
            chosen.push(k);
        }
        if chosen.len() == MOMENTS_SHOWN {
            break;
        }
    }
    chosen.into_iter().map(|k| samples[k].clone()).collect()
}
