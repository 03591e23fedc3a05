//! One device's report: its trace replayed to the moment, the allocator's state there, what holds the memory (by
//! stack, by category, the largest allocations), the OOM's figures, the trace's completeness, and the facts the
//! rules read.

use rustc_hash::FxHashMap;

use super::*;
use crate::timeline::replay::{Replay, State};
use crate::timeline::stacks::{StackId, EMPTY_STACK};
use crate::timeline::{Action, BlockState, DeviceTimeline, PoolKind, Timeline};
use crate::units::{bytes, duration_us};

pub(super) fn analyze_device<'t>(
    tl: &'t Timeline,
    dev: &'t DeviceTimeline,
    opts: &Options,
    cats: &categories::Categorizer,
) -> Result<(DeviceReport, Replay<'t>), AnalysisError> {
    // The replay and the event-only facts are the two long passes over the trace and need nothing of each other:
    // run them on two cores.
    let mut cache = categories::CategoryCache::new(cats, tl);
    // At an OOM whose remedies will be tried, their workload is read on this thread too, which mostly waits for the
    // replay (on a 1M-entry trace the replay takes about 50 ms, the event facts 25-35, the workload's read 15-30).
    let (replay, event_facts, evidence, prepared) = std::thread::scope(|s| {
        let replay = beside(s, || Replay::new(dev, tl.settings.as_ref()));
        let event_facts = facts::event_facts(tl, dev, &mut cache);
        let evidence = attribution::TraceEvidence::of(dev)
            .with_iterations(event_facts.iterations.as_ref())
            .with_sizes_read_ahead(tl, dev, &mut cache);
        let prepared = super::whatif::Prepared::wanted(tl, dev, opts)
            .then(|| super::whatif::Prepared::new(tl, dev, &mut cache))
            .flatten();
        (replay(), event_facts, evidence, prepared)
    });
    let events = &dev.events;
    let last_oom = events.iter().rposition(|e| e.action == Action::Oom).map(|i| i as u32);
    let last = (!events.is_empty()).then(|| events.len() as u32 - 1);
    let mut past_end = None;
    // A request the allocator rejected under its fraction cap leaves no `oom` entry: the log says it, and the
    // snapshot (written from the exception) ends there.
    let rejected = last_oom.is_none() && super::whatif::oom_event(tl, dev).is_some();
    // A state-only dump written where the OOM was caught holds the state the log's message describes: that moment is
    // the OOM, and the message says what was asked.
    let dumped_at_oom = events.is_empty()
        && observed::last_oom_message(tl, dev.device).is_some_and(|m| {
            let state = State::from_segments(&dev.segments);
            observed::describes_state(m, state.allocated, state.reserved)
        });
    let (moment, idx): (Moment, Option<u32>) = match &opts.at {
        At::Auto => match last_oom {
            Some(i) => (Moment::Oom, Some(i)),
            None if rejected || dumped_at_oom => (Moment::Oom, last),
            None if events.is_empty() => (Moment::End, None),
            None => (Moment::Peak, replay.peak_allocated.1),
        },
        At::Oom => match last_oom {
            Some(i) => (Moment::Oom, Some(i)),
            None if rejected || dumped_at_oom => (Moment::Oom, last),
            None => return Err(AnalysisError::NoOom(dev.device)),
        },
        At::Peak => (Moment::Peak, replay.peak_allocated.1),
        At::End => (Moment::End, last),
        At::Event(n) => {
            if (*n as usize) >= events.len() {
                return Err(AnalysisError::NoSuchEvent { event: *n, device: dev.device, events: events.len() });
            }
            (Moment::Time, Some(*n))
        }
        At::Offset(us) => {
            let t0 = events.iter().find_map(|e| e.time_us()).ok_or(AnalysisError::NoTimestamps(dev.device))?;
            let t_end = events.iter().rev().find_map(|e| e.time_us()).unwrap_or(t0);
            if t0 + us > t_end {
                // Past the end: the end it is, and said so (a clamp the user does not see reads as a wrong answer).
                past_end = Some(format!(
                    "--at {} is past the end of the trace ({} after its first event): this is the state at its end.",
                    duration_us(*us),
                    duration_us(t_end - t0)
                ));
                (Moment::End, last)
            } else {
                let i = events.iter().rposition(|e| e.time_us().is_some_and(|t| t <= t0 + us));
                (Moment::Time, i.map(|i| i as u32))
            }
        }
    };
    let last_event = idx.map_or(events.len().saturating_sub(1), |i| i as usize);
    // The passes that follow what each stack holds live (at each iteration's end, at the KV cache's samples) need
    // the replay's series and nothing of the report: run them beside the report and the other facts.
    let kv_last = facts::kv_last(events, moment, idx);
    let (mut report, facts, state, attribution) = std::thread::scope(|s| {
        let live = beside(s, || facts::live_passes(dev, &replay, &event_facts, last_event, kv_last));
        let (state, attribution, report) = device_report(tl, dev, opts, &replay, (moment, idx), evidence, &mut cache);
        let cx = facts::Context {
            tl,
            dev,
            replay: &replay,
            state: &state,
            report: &report,
            gpu_memory: opts.gpu_memory,
            memory_cap: opts.memory_cap,
        };
        let facts = facts::compute(&cx, &event_facts, live);
        (report, facts, state, attribution)
    });
    report.facts = facts;
    if let Some(note) = past_end {
        report.notes.insert(0, note);
    }
    if let (Some(oom), true) = (last_oom, moment != Moment::Oom && matches!(opts.at, At::Offset(_) | At::Event(_))) {
        if idx.is_some_and(|i| i >= oom) {
            let when = events[oom as usize]
                .time_us()
                .zip(events.iter().find_map(|e| e.time_us()))
                .map_or(String::new(), |(t, t0)| format!(", {} into the trace", duration_us(t - t0)));
            report.notes.insert(
                0,
                format!("This GPU ran out of memory before this moment (event {oom}{when}): --at oom shows it."),
            );
        }
    }
    if let (Some(c), Some(it)) = (report.chart.as_mut(), event_facts.iterations.as_ref()) {
        c.iteration_ends.clone_from(&it.ends);
    }
    report.holder = verdict::holder(tl, &report, &state, &attribution);
    // At an OOM of fragments, the blocks that pin them are found from the state; the run's worst moments (a replay
    // up to the OOM) beside the what-ifs, which leave a core idle while one chain of remedies runs longer.
    let mut pinning = report.oom.as_ref().and_then(|o| super::fragments::pinning(tl, dev, &state, o));
    let to_oom = report.oom.as_ref().and_then(|o| o.event_index);
    let (whatif, worst_moments) = std::thread::scope(|s| {
        let replay = &replay;
        let worst = pinning.as_ref().map(|_| beside(s, move || super::fragments::worst_moments(dev, replay, to_oom)));
        let whatif = super::whatif::at_oom(tl, dev, replay, &report, &mut cache, opts, prepared);
        (whatif, worst.map(|w| w()))
    });
    report.whatif = whatif;
    super::whatif::mark_recorded_part_only(idx.map(|i| i as usize), &event_facts, &mut report.whatif);
    if let (Some(p), Some(worst)) = (pinning.as_mut(), worst_moments) {
        p.worst_moments = worst;
    }
    report.pinning = pinning;
    if let (Some(p), Some(map)) = (&report.pinning, report.segment_map.as_mut()) {
        chart::mark_pinning(map, &state, &p.addresses);
    }
    if opts.chart_categories {
        if let Some(c) = report.chart.as_mut() {
            chart::split_by_category(c, tl, &replay, &mut cache);
        }
    }
    Ok((report, replay))
}

/// The report of one device at `moment` (event `idx`), with the allocator state there.
fn device_report(
    tl: &Timeline,
    dev: &DeviceTimeline,
    opts: &Options,
    replay: &Replay,
    (moment, idx): (Moment, Option<u32>),
    mut evidence: attribution::TraceEvidence,
    cats: &mut categories::CategoryCache,
) -> (State, attribution::Attribution, DeviceReport) {
    let events = &dev.events;
    let oom_count = events.iter().filter(|e| e.action == Action::Oom).count();
    let state = if events.is_empty() { State::from_segments(&dev.segments) } else { replay.state_at(idx) };
    let time_us = idx.and_then(|i| events[i as usize].time_us());
    let free_by_pool = free_by_pool(&state);
    let oom = match (moment, idx) {
        (Moment::Oom, Some(i)) if events[i as usize].action == Action::Oom => {
            Some(oom_report(tl, dev, i, &free_by_pool))
        }
        // A rejection under the fraction cap (see `analyze_device`): the log's message is the OOM, at the trace's end.
        (Moment::Oom, _) => observed::last_oom_message(tl, dev.device).map(observed::message_oom),
        _ => None,
    };
    let seen = idx.map_or(0, |i| i as usize + 1);
    let end = || replay.state_at(events.len().checked_sub(1).map(|i| i as u32));
    let attribution = attribution::attribute_with_evidence(tl, dev, &state, seen, end, cats, &mut evidence);
    let (top_allocations, (by_stack, live_stacks), live_count, no_stack) =
        live_allocations(tl, dev, &state, &attribution, time_us, opts.top);
    let trace = trace_report(dev, replay);
    let peak = (!events.is_empty()).then(|| PeakReport {
        allocated_bytes: replay.peak_allocated.0,
        event_index: replay.peak_allocated.1,
        time_us: replay.peak_allocated.1.and_then(|i| events[i as usize].time_us()),
        reserved_bytes: replay.peak_reserved.0,
    });
    let notes = notes(tl, dev, replay, &trace, no_stack, live_count, oom_count);
    let mut report = DeviceReport {
        device: dev.device,
        moment,
        event_index: idx,
        time_us,
        allocated_bytes: state.allocated,
        reserved_bytes: state.reserved,
        active_bytes: state.active,
        pending_free_bytes: state.active - state.allocated,
        reserved_unallocated_bytes: state.reserved.saturating_sub(state.allocated),
        largest_free_block_bytes: state.largest_free_block(),
        segments: state.segments.len(),
        blocks: state.block_count(),
        oom,
        oom_count,
        peak,
        end: end_totals(dev, &state),
        free_by_pool,
        top_allocations,
        by_stack,
        trace,
        by_category: category_bytes(&state, &attribution),
        budget: None,
        observed: None,
        source: ReportSource::Snapshot,
        unmatched: false,
        verdict: None,
        holder: None,
        whatif: Vec::new(),
        pinning: None,
        notes,
        chart: chart::of(replay, &dev.events),
        segment_map: chart::segment_map(&state),
        live_stacks,
        facts: facts::Facts::default(),
    };
    report.observed = observed::summarize(dev, Some(replay), report.time_us);
    (state, attribution, report)
}

/// Live bytes per category at the moment, biggest first, with how each byte was known.
fn category_bytes(state: &State, attribution: &attribution::Attribution) -> Vec<CategoryBytes> {
    let mut by: FxHashMap<&'static str, CategoryBytes> = FxHashMap::default();
    for (_, addr, b) in state.allocated_blocks() {
        let a = attribution.of(addr);
        let c = by.entry(a.category).or_insert_with(|| CategoryBytes {
            category: a.category,
            bytes: 0,
            count: 0,
            source_bytes: SourceBytes::default(),
        });
        c.bytes = c.bytes.saturating_add(b.size);
        c.count += 1;
        match a.source {
            Some(attribution::Source::Label) => c.source_bytes.label = c.source_bytes.label.saturating_add(b.size),
            Some(attribution::Source::Stack) => c.source_bytes.stack = c.source_bytes.stack.saturating_add(b.size),
            Some(attribution::Source::Inferred) => {
                c.source_bytes.inferred = c.source_bytes.inferred.saturating_add(b.size)
            }
            None => {}
        }
    }
    let mut v: Vec<CategoryBytes> = categories::CATEGORIES.iter().filter_map(|c| by.remove(c)).collect();
    v.retain(|c| c.bytes > 0);
    v.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    v
}

/// The file's final state (what a trace replays to), or the moment's own without a trace.
fn end_totals(dev: &DeviceTimeline, state: &State) -> Totals {
    let f;
    let end = if dev.events.is_empty() {
        state
    } else {
        f = State::from_segments(&dev.segments);
        &f
    };
    Totals { allocated_bytes: end.allocated, reserved_bytes: end.reserved, active_bytes: end.active }
}

/// The OOM at trace event `i`: what was asked, where, and what the pool it would come from had free.
fn oom_report(tl: &Timeline, dev: &DeviceTimeline, i: u32, free_by_pool: &[PoolFree]) -> OomReport {
    let e = &dev.events[i as usize];
    let pool = if e.size <= 1 << 20 { PoolKind::Small } else { PoolKind::Large };
    let (mut free, mut largest) = (0, 0);
    for p in free_by_pool {
        let same_pool = p.pool == pool_name(Some(pool)) || p.pool == Pool::Unknown;
        if same_pool && p.stream == dev.attrs(e).stream {
            free += p.free_bytes;
            largest = largest.max(p.largest_free_block_bytes);
        }
    }
    OomReport {
        source: OomSource::Snapshot,
        requested_bytes: Some(e.size),
        device_free_bytes: dev.attrs(e).device_free(),
        device_free_estimated: tl.capture.backend == crate::timeline::Backend::Xpu
            && dev.attrs(e).device_free().is_some(),
        time_us: e.time_us(),
        event_index: Some(i),
        stream: Some(dev.attrs(e).stream),
        pool: Some(pool_name(Some(pool))),
        cached_free_in_pool_bytes: Some(free),
        largest_free_in_pool_bytes: Some(largest),
        fits_in_cached_free: Some(e.size <= free),
        stack: stack_frames(tl, e.stack).iter().map(FrameView::full).collect(),
        culprit: culprit(tl, e.stack),
        message: observed::last_oom_message(tl, dev.device).cloned(),
    }
}

/// The `top` largest live allocations and stacks at the moment, how many were live, and how many (and how many
/// bytes) had no stack.
fn live_allocations(
    tl: &Timeline,
    dev: &DeviceTimeline,
    state: &State,
    attribution: &attribution::Attribution,
    time_us: Option<i64>,
    top: usize,
) -> (Vec<Allocation>, StackShares, usize, NoStack) {
    let events = &dev.events;
    let now = time_us.or_else(|| events.iter().rev().find_map(|e| e.time_us()));
    let mut live: Vec<Allocation> = state
        .allocated_blocks()
        .map(|(seg, addr, b)| Allocation {
            bytes: b.size,
            requested_bytes: b.requested,
            address: addr,
            stream: seg.stream,
            event_index: b.alloc_event,
            age_us: match (now, b.alloc_event.and_then(|i| events[i as usize].time_us())) {
                (Some(n), Some(t)) => Some(n - t),
                _ => None,
            },
            culprit: String::new(),
            stack: Vec::new(),
            category: attribution.of(addr).category,
            source: attribution.of(addr).source,
            reason: attribution.of(addr).reason,
            stack_id: b.stack,
        })
        .collect();
    live.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.address.cmp(&b.address)));
    let by_stack = stack_groups(tl, &live, top);
    let mut no_stack = NoStack::default();
    for a in live.iter().filter(|a| a.stack_id == EMPTY_STACK) {
        let n = if a.event_index.is_none() { &mut no_stack.before_trace } else { &mut no_stack.in_trace };
        n.0 += 1;
        n.1 += a.bytes;
        if a.event_index.is_none() {
            continue;
        }
        use attribution::Reason;
        let kind = match a.reason {
            Some(Reason::GrownSideBySide | Reason::GrownAlone) => &mut no_stack.grown,
            Some(
                Reason::BuiltBeforeTheLoop
                | Reason::KeptByALaterStep
                | Reason::MadeByAPass
                | Reason::KeptWithItsPass
                | Reason::PassOutputKept
                | Reason::PassCopyKept,
            ) => &mut no_stack.by_lifetime,
            _ => continue,
        };
        kind.0 += 1;
        kind.1 += a.bytes;
    }
    let live_count = live.len();
    live.truncate(top);
    for a in &mut live {
        a.culprit = culprit(tl, a.stack_id);
        a.stack = stack_frames(tl, a.stack_id).iter().map(FrameView::full).collect();
    }
    (live, by_stack, live_count, no_stack)
}

/// Live allocations with no stack (count, bytes): those made before the trace began, and those it saw made
/// with no frame.
#[derive(Default, Clone, Copy)]
struct NoStack {
    before_trace: (usize, u64),
    in_trace: (usize, u64),
    /// Of those in the trace, the copies of objects grown by concatenation (see `concatenation::Frameless`).
    grown: (usize, u64),
    /// Of those in the trace, those whose kind their lifetime in the loop's passes says (see `lifetimes`).
    by_lifetime: (usize, u64),
}

/// The `top` stack groups, and every live stack's bytes, largest first.
type StackShares = (Vec<StackGroup>, Vec<(StackId, u64)>);

/// Live bytes per allocating stack, the `top` largest, each named by as many callers as it takes to tell the
/// listed stacks apart (at least 3, at most 8); and every stack's bytes, largest first.
fn stack_groups(tl: &Timeline, live: &[Allocation], top: usize) -> StackShares {
    type Key = (StackId, &'static str, Option<attribution::Source>, Option<attribution::Reason>);
    let mut groups: FxHashMap<Key, (u64, usize)> = FxHashMap::default();
    let mut per_stack: FxHashMap<StackId, u64> = FxHashMap::default();
    for a in live {
        let g = groups.entry((a.stack_id, a.category, a.source, a.reason)).or_default();
        g.0 += a.bytes;
        g.1 += 1;
        *per_stack.entry(a.stack_id).or_default() += a.bytes;
    }
    let mut by_stack: Vec<StackGroup> = groups
        .into_iter()
        .map(|((stack_id, category, source, reason), (bytes, count))| StackGroup {
            bytes,
            count,
            culprit: String::new(),
            callers: String::new(),
            stack: Vec::new(),
            category,
            source,
            reason,
            stack_id,
        })
        .collect();
    by_stack.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack_id.cmp(&b.stack_id)).then(a.category.cmp(b.category)));
    let mut all: Vec<(StackId, u64)> = per_stack.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    by_stack.truncate(top);
    let mut depth = 3;
    while depth < 8 {
        let chains: rustc_hash::FxHashSet<String> =
            by_stack.iter().map(|g| user_chain(tl, g.stack_id, depth)).collect();
        if chains.len() == by_stack.len() {
            break;
        }
        depth += 1;
    }
    for g in &mut by_stack {
        g.culprit = culprit(tl, g.stack_id);
        g.callers = user_chain(tl, g.stack_id, depth);
        if let (true, Some(why)) = (g.stack_id == EMPTY_STACK, g.reason) {
            // What the lifetime and size say is all there is to show of these: say it where the stack would be.
            g.callers = format!("(no stack recorded; {} inferred: {})", g.category.replace('_', " "), why.words());
        }
        g.stack = stack_frames(tl, g.stack_id).iter().map(FrameView::full).collect();
    }
    // Rows whose Python lines are the same (one line calls two operators) are told apart by the ATen operator.
    let mut seen: FxHashMap<String, usize> = FxHashMap::default();
    for g in &by_stack {
        *seen.entry(g.callers.clone()).or_default() += 1;
    }
    // Each such row is named by its ATen operator where those differ, else by its innermost frame the others of
    // its group lack (a backward node, a workspace), in a few words.
    let groups: Vec<String> = seen.into_iter().filter(|(_, n)| *n > 1).map(|(c, _)| c).collect();
    for callers in groups {
        let members: Vec<usize> = (0..by_stack.len()).filter(|&i| by_stack[i].callers == callers).collect();
        let ops: Vec<Option<String>> =
            members.iter().map(|&i| stacks::innermost_op(tl, by_stack[i].stack_id)).collect();
        let ops_differ = ops.iter().collect::<std::collections::BTreeSet<_>>().len() == ops.len();
        let frames: Vec<Vec<String>> = members
            .iter()
            .map(|&i| stack_frames(tl, by_stack[i].stack_id).iter().map(FrameView::word).collect())
            .collect();
        for (k, &i) in members.iter().enumerate() {
            let own = || frames[k].iter().find(|f| frames.iter().enumerate().any(|(j, o)| j != k && !o.contains(f)));
            let via = if ops_differ { ops[k].clone() } else { own().cloned() };
            if let Some(via) = via {
                by_stack[i].callers = format!("{callers} via {via}");
            }
        }
    }
    (by_stack, all)
}

/// What the trace holds (entries per action, its span) and how completely the replay could follow it.
fn trace_report(dev: &DeviceTimeline, replay: &Replay) -> TraceReport {
    let events = &dev.events;
    let mut counts = [0usize; Action::Unknown as usize + 1];
    for e in events {
        counts[e.action as usize] += 1;
    }
    let actions: BTreeMap<&'static str, usize> =
        Action::ALL.iter().filter(|&&a| counts[a as usize] > 0).map(|&a| (a.name(), counts[a as usize])).collect();
    let first_time_us = events.iter().find_map(|e| e.time_us());
    let last_time_us = events.iter().rev().find_map(|e| e.time_us());
    TraceReport {
        entries: events.len(),
        first_time_us,
        last_time_us,
        span_us: first_time_us.zip(last_time_us).map(|(a, b)| b - a),
        actions,
        complete: replay.complete(),
        frees_without_alloc: replay.completeness.frees_without_alloc,
        live_without_alloc: replay.completeness.live_without_alloc,
        replay_matches_file: (!events.is_empty()).then(|| replay.end_mismatch.is_none()),
    }
}

fn pool_name(kind: Option<PoolKind>) -> Pool {
    match kind {
        Some(PoolKind::Small) => Pool::Small,
        Some(PoolKind::Large) => Pool::Large,
        None => Pool::Unknown,
    }
}

fn free_by_pool(state: &State) -> Vec<PoolFree> {
    let mut map: BTreeMap<(Pool, u64, (i64, i64)), PoolFree> = BTreeMap::new();
    for (seg, _, b) in state.free_blocks() {
        let pool = pool_name(seg.kind);
        let p = map.entry((pool, seg.stream, seg.pool_id)).or_insert(PoolFree {
            pool,
            stream: seg.stream,
            pool_id: seg.pool_id,
            free_bytes: 0,
            largest_free_block_bytes: 0,
            free_blocks: 0,
        });
        p.free_bytes += b.size;
        p.largest_free_block_bytes = p.largest_free_block_bytes.max(b.size);
        p.free_blocks += 1;
    }
    let mut v: Vec<PoolFree> = map.into_values().collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.free_bytes));
    v
}

fn notes(
    tl: &Timeline,
    dev: &DeviceTimeline,
    replay: &Replay,
    trace: &TraceReport,
    no_stack: NoStack,
    live_count: usize,
    oom_count: usize,
) -> Vec<String> {
    let mut notes = Vec::new();
    if dev.events.is_empty() {
        notes.push(
            "The file holds the allocator state only, no trace of events: nothing says when memory was allocated \
             or what the peak was. Record with torch.cuda.memory._record_memory_history(max_entries=100000) before \
             the failing step."
                .into(),
        );
    } else if !trace.complete {
        let c = &replay.completeness;
        let parts: Vec<String> = [
            (c.frees_without_alloc, "frees of allocations made before it"),
            (c.live_without_alloc, "blocks live at the end that it never saw allocated"),
            (c.segments_without_alloc, "segments it never saw created"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        // Newest torch says outright whether the ring buffer wrapped, for every device (-1) or for each.
        let said = tl.capture.ring_overflowed.iter().find(|(d, _)| *d == dev.device || *d == -1).map(|&(_, w)| w);
        let max_entries = tl.capture.ring_max_entries.map_or(String::new(), |n| format!(", max_entries {n}"));
        let why = match said {
            Some(true) => format!("the ring buffer wrapped (the file says so: trace_alloc_overflowed{max_entries})"),
            Some(false) => "recording started late (the ring buffer did not wrap, the file says)".to_string(),
            None => "the ring buffer wrapped, or recording started late".to_string(),
        };
        let advice = match said {
            Some(false) => "Start _record_memory_history before the model is built to see the whole run.",
            _ => "Raise max_entries in _record_memory_history to keep more.",
        };
        notes.push(format!(
            "The trace does not reach back to the start of the program ({}): {why}. The state before its first \
             event was rebuilt from the file's final segments; the peak is the peak within the trace. {advice}",
            parts.join(", ")
        ));
    }
    if tl.capture.workspace_entries > 0 {
        notes.push(format!(
            "{} trace entries of torch_npu's workspace allocator, which it puts ahead of each device's trace, were \
             set apart, with its segments ({}): the replay follows the caching allocator alone, in time order, and \
             the workspace's memory counts as held outside it.",
            tl.capture.workspace_entries,
            bytes(tl.capture.workspace_bytes)
        ));
    }
    // What the capture lacked, said as its cause with the setting that fixes it; the categories of these blocks
    // are inferred (see `attribution`), so this is advice for the next capture, not the verdict.
    let (before, in_trace) = (no_stack.before_trace, no_stack.in_trace);
    if before.0 > 0 && live_count > 0 && !dev.events.is_empty() {
        notes.push(format!(
            "{} of {} live allocations ({}) were made before recording began and carry no stack: recording \
             started after the model was built, or the ring buffer wrapped. Their categories are inferred from \
             lifetime and size. To see who allocated them, call torch.cuda.memory._record_memory_history() before \
             the model is built, with max_entries large enough to keep the whole run.",
            before.0,
            live_count,
            bytes(before.1),
        ));
    }
    if in_trace.0 > 0 && live_count > 0 {
        // Where other allocations have frames, the frameless ones are the autograd thread's, told apart by size
        // (see `attribution`); where none has, nothing in the file tells what they are, and the note says so
        // rather than claim the backward's inference.
        let grown = no_stack.grown;
        let (cause, judged) = if tl.capture.trace_stacks || tl.capture.block_stacks {
            (
                ": with stacks=\"python\" the autograd thread's backward records none; stacks=\"all\" records its \
                 C++ frames",
                "Those with a parameter's size are taken as its gradients, the rest as activations' gradients and \
                 temporaries."
                    .to_string(),
            )
        } else {
            let (by_lifetime, left) = (no_stack.by_lifetime, in_trace.0 - grown.0 - no_stack.by_lifetime.0);
            let mut read = Vec::new();
            if grown.0 > 0 {
                read.push(format!(
                    "{} ({}) are copies of objects re-made a little larger at every step, a cache where several \
                     grow together and an accumulator where one grows alone",
                    grown.0,
                    bytes(grown.1)
                ));
            }
            if by_lifetime.0 > 0 {
                read.push(format!(
                    "{} ({}) are read from their lifetimes in the loop's passes: made before the passes and kept \
                     (the model), made and let go of by a pass (its working memory), or kept from pass to pass",
                    by_lifetime.0,
                    bytes(by_lifetime.1)
                ));
            }
            let judged = if read.is_empty() {
                "With no frame anywhere in the file, nothing tells their kinds apart: they are left unknown."
                    .to_string()
            } else {
                let rest = if left > 0 { format!("; the other {left} are left unknown") } else { String::new() };
                format!(
                    "With no frame anywhere in the file, only what the trace shows tells their kinds apart: {}{rest}.",
                    read.join("; ")
                )
            };
            (": the capture recorded no stacks (context=None); record with context=\"all\"", judged)
        };
        notes.push(format!(
            "{} of {} live allocations ({}) were recorded with no frame{cause}. {judged}",
            in_trace.0,
            live_count,
            bytes(in_trace.1),
        ));
    }
    if let Some(m) = &replay.end_mismatch {
        notes.push(format!(
            "Replaying the trace does not land exactly on the file's final segments ({m}); figures at moments \
             other than the end are approximate."
        ));
    }
    if !replay.anomalies.is_empty() && replay.end_mismatch.is_some() {
        let a = &replay.anomalies[0];
        notes.push(format!(
            "{} trace events could not be replayed as the allocator would have; the first, event {}: {}.",
            replay.anomalies.len(),
            a.event,
            a.what
        ));
    }
    let bad_sums = dev
        .segments
        .iter()
        .filter(|s| {
            let alloc: u64 = s.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
            let active: u64 = s.blocks.iter().filter(|b| b.state != BlockState::Inactive).map(|b| b.size).sum();
            let total: u64 = s.blocks.iter().map(|b| b.size).sum();
            s.declared_allocated.is_some_and(|d| d != alloc)
                || s.declared_active.is_some_and(|d| d != active)
                || total != s.total_size
        })
        .count();
    if bad_sums > 0 {
        notes.push(format!(
            "{bad_sums} segments state totals that differ from the sum of their blocks; the block-level figures \
             are used."
        ));
    }
    if oom_count > 1 {
        notes.push(format!(
            "The trace holds {oom_count} OOMs: the program caught earlier ones and carried on. The last one is \
             shown."
        ));
    }
    if let Some(span) = trace.span_us {
        if span == 0 && trace.entries > 1 {
            notes.push("Every trace event has the same timestamp.".into());
        }
    }
    let _ = duration_us;
    notes
}
