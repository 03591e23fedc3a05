//! A forward simulator of the caching allocator: it replays a trace's requests and frees and decides placement
//! itself, as torch's allocator does, so the same run can be replayed under other settings, another capacity or
//! an edited workload (what-ifs). The replay beside it (`replay.rs`) follows the recorded addresses and cannot.

pub mod allocator;
pub mod workload;

pub use allocator::{Allocator, Config, SegmentEvent};
pub use workload::{Edit, Op, StartSegment, Workload};

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
    for (i, op) in w.ops.iter().enumerate() {
        a.at_op(i as u32);
        match *op {
            Op::Alloc { id, size, stream, pool, event, stack } => {
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
