//! Facts: named, typed values derived from one device's timeline, which rules test (`oomdoc facts FILE` prints
//! them). A fact that the input cannot support is absent, never guessed: rules then stay silent.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::categories::{CategoryCache, CATEGORIES};
use super::iterations::Iterations;
use super::{culprit, user_chain, DeviceReport};
use crate::timeline::replay::Replay;
use crate::timeline::stacks::{StackId, EMPTY_STACK};
use crate::timeline::{Action, DeviceTimeline, Timeline, NO_STR};
use crate::units::{bytes, duration_us};

/// A value a fact or an expression can have.
#[derive(Clone, Debug, PartialEq)]
pub enum Val {
    Num(f64),
    Bool(bool),
    Str(String),
    Missing,
}

impl Val {
    pub fn truthy(&self) -> bool {
        match self {
            Val::Bool(b) => *b,
            Val::Num(n) => *n != 0.0,
            Val::Str(s) => !s.is_empty(),
            Val::Missing => false,
        }
    }
}

/// How a fact's number reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Ratio,
    Count,
    Micros,
    Plain,
}

#[derive(Clone, Debug)]
pub struct Fact {
    pub value: Val,
    pub unit: Unit,
    pub doc: &'static str,
}

impl Fact {
    /// Formats for a message: `fmt` is "", "bytes", "pct", "pct1" (one decimal), "count", "num" or "s".
    pub fn display(&self, fmt: &str) -> String {
        match (&self.value, fmt) {
            (Val::Num(n), "bytes") => bytes(n.max(0.0) as u64),
            (Val::Num(n), "pct") => format!("{:.0}%", n * 100.0),
            (Val::Num(n), "pct1") => format!("{:.1}%", n * 100.0),
            (Val::Num(n), "count") => format!("{}", n.round() as i64),
            (Val::Num(n), "s") => micros(*n),
            (Val::Num(n), "num") => fmt_num(*n),
            (Val::Num(n), _) => match self.unit {
                Unit::Bytes => bytes(n.max(0.0) as u64),
                Unit::Ratio => format!("{:.0}%", n * 100.0),
                Unit::Count => format!("{}", n.round() as i64),
                Unit::Micros => micros(*n),
                Unit::Plain => fmt_num(*n),
            },
            (Val::Bool(b), _) => b.to_string(),
            (Val::Str(s), _) => s.clone(),
            (Val::Missing, _) => "(unknown)".into(),
        }
    }
}

/// Microseconds, rounded; under one, in nanoseconds (short GPU kernels).
fn micros(us: f64) -> String {
    if us != 0.0 && us.abs() < 1.0 {
        format!("{:.0} ns", us * 1000.0)
    } else {
        duration_us(us.round() as i64)
    }
}

fn fmt_num(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n:.2}")
    }
}

/// Every fact of one device, by name.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    map: BTreeMap<String, Fact>,
    /// The sites whose live allocations accumulate (the leak), most growth first: what a what-if leaves out.
    pub leak_sites: Vec<Site>,
}

impl Facts {
    pub fn get(&self, name: &str) -> Option<&Fact> {
        self.map.get(name)
    }

    /// A numeric fact's value (bytes, counts, ratios); `None` when missing or not a number.
    pub fn number(&self, name: &str) -> Option<f64> {
        match self.map.get(name).map(|f| &f.value) {
            Some(Val::Num(n)) if n.is_finite() => Some(*n),
            _ => None,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Fact)> {
        self.map.iter()
    }

    /// Adds or replaces a fact computed outside the timeline (the budget's prediction, `analyze --model`).
    pub fn insert(&mut self, name: &str, fact: Fact) {
        self.map.insert(name.to_string(), fact);
    }

    pub(crate) fn num(&mut self, name: &str, v: impl Into<f64>, unit: Unit, doc: &'static str) {
        self.map.insert(name.to_string(), Fact { value: Val::Num(v.into()), unit, doc });
    }

    pub(crate) fn opt(&mut self, name: &str, v: Option<impl Into<f64>>, unit: Unit, doc: &'static str) {
        if let Some(v) = v {
            self.num(name, v, unit, doc);
        }
    }

    pub(crate) fn flag(&mut self, name: &str, v: bool, doc: &'static str) {
        self.map.insert(name.to_string(), Fact { value: Val::Bool(v), unit: Unit::Plain, doc });
    }

    pub(crate) fn text(&mut self, name: &str, v: impl Into<String>, doc: &'static str) {
        self.map.insert(name.to_string(), Fact { value: Val::Str(v.into()), unit: Unit::Plain, doc });
    }
}

/// Reserved-but-unallocated bytes and their share of reserved, from a report (a snapshot's or an OOM message's).
pub(crate) fn reserved_unallocated_facts(f: &mut Facts, r: &DeviceReport, doc: &'static str) {
    f.num("reserved_unallocated_bytes", r.reserved_unallocated_bytes as f64, Unit::Bytes, doc);
    if r.reserved_bytes > 0 {
        f.num(
            "reserved_unallocated_ratio",
            r.reserved_unallocated_bytes as f64 / r.reserved_bytes as f64,
            Unit::Ratio,
            "share of reserved bytes not allocated",
        );
    }
}

/// What facts need besides the timeline.
pub struct Context<'a> {
    pub tl: &'a Timeline,
    pub dev: &'a DeviceTimeline,
    pub replay: &'a Replay<'a>,
    /// The allocator state at the report's moment.
    pub state: &'a crate::timeline::replay::State,
    pub report: &'a DeviceReport,
    /// The GPU's capacity, when the user gave it.
    pub gpu_memory: Option<u64>,
    /// The process's memory cap, when the user (or the capture) gave it.
    pub memory_cap: Option<u64>,
}

/// The facts that need only the events and the categories of their stacks, and those categories (one per event):
/// computed while the replay runs on another core (see `analysis::analyze_device`).
pub struct EventFacts {
    kinds: Vec<u8>,
    /// The passes of the program's loop, where found (see `analysis::iterations`).
    pub iterations: Option<Iterations>,
    /// For each optimizer step the program went on from, the allocation that followed it (the next pass begun).
    steps_closed_at: Vec<usize>,
    last_compile: Option<usize>,
    facts: Facts,
}

pub fn event_facts(tl: &Timeline, dev: &DeviceTimeline, cats: &mut CategoryCache) -> EventFacts {
    let events = &dev.events;
    let mut f = Facts::default();
    // Every later pass asks "what kind of allocation is this event?": answer once per event, classifying each
    // stack once (stack ids are dense, so a table indexed by them does it without hashing).
    const UNSET: u8 = u8::MAX - 1;
    let mut by_stack: Vec<u8> = Vec::new();
    let mut kinds: Vec<u8> = events
        .iter()
        .map(|e| {
            if e.stack == EMPTY_STACK {
                return NONE;
            }
            let s = e.stack as usize;
            if s >= by_stack.len() {
                by_stack.resize(s + 1, UNSET);
            }
            if by_stack[s] == UNSET {
                by_stack[s] = kind_index(cats.of(e.stack));
            }
            by_stack[s]
        })
        .collect();
    // In a trace with no backward pass, a stack inside the model grown by concatenation is a KV cache, whatever its
    // frames are called (a cache class the user wrote): every later pass and the report count it as one.
    let (kv, activation) = (kind_index("kv_cache"), kind_index("activation"));
    let gradient = kind_index("gradient");
    if !events.is_empty() && !shows_backward(events, |i| kinds[i] == gradient) {
        let last = events.iter().rposition(|e| e.action == Action::Oom).unwrap_or(events.len() - 1);
        let grown = super::concatenation::by_stack(events, last, &|i| kinds[i] == activation);
        for (k, e) in kinds.iter_mut().zip(events) {
            if grown.contains(&e.stack) {
                *k = kv;
            }
        }
        for &s in &grown {
            cats.relabel(s, "kv_cache");
        }
        f.num(
            "kv.grown_stacks",
            grown.len() as f64,
            Unit::Count,
            "stacks in the model's forward grown by concatenation in a trace without a backward pass, counted as KV cache",
        );
        // With no frame at all, objects grown side by side are a model's cache (a key and a value per layer).
        if let Some(grown) = super::concatenation::of_frameless_trace(events).filter(|g| g.a_cache(events)) {
            f.num(
                "kv.grown_objects",
                grown.objects.len() as f64,
                Unit::Count,
                "objects grown by concatenation side by side in a trace with no frame, counted as KV cache",
            );
            for i in grown.events() {
                kinds[i] = kv;
            }
            // The cache asking for its next copy, when that is what ran out.
            if events[last].action == Action::Oom && grown.extended_by(events, last) {
                kinds[last] = kv;
            }
        }
    }
    let comm = kind_index("communication");
    f.flag(
        "nccl.seen",
        kinds.contains(&comm) || dev.segments.iter().any(|s| cats.of(s.stack) == "communication"),
        "NCCL / c10d frames appear in the file",
    );
    let mut iterations = None;
    let mut steps_closed_at = Vec::new();
    let last_compile = last_compile_event(tl, dev, &kinds);
    if !events.is_empty() {
        segment_facts(&mut f, events);
        let (steps, closed_at) = optimizer_steps(events, &kinds);
        steps_closed_at = closed_at;
        f.num(
            "optimizer.steps",
            steps.len() as f64,
            Unit::Count,
            "optimizer steps (clusters of torch.optim allocations)",
        );
        ddp_facts(&mut f, events, &kinds, &steps);
        iterations = super::iterations::find(tl, events, &steps);
        let n = iterations.as_ref().map_or(0, |it| it.ends.len());
        f.num("iter.count", n as f64, Unit::Count, "iterations of the program's loop seen (see iter.source)");
        if let Some(it) = &iterations {
            f.text(
                "iter.source",
                it.source.words(),
                "what marks the iterations: optimizer steps, snapshot markers, or repeating allocating stacks",
            );
        }
    }
    EventFacts { kinds, iterations, steps_closed_at, last_compile, facts: f }
}

/// Whether a trace shows a backward pass: an allocation the autograd engine made, by its frames (`gradient(i)` for
/// the event at `i`), or with no frame where others have them (under stacks="python" the engine's thread has no
/// Python). Only a job that trains has one.
pub(crate) fn shows_backward(events: &[crate::timeline::Event], mut gradient: impl FnMut(usize) -> bool) -> bool {
    let framed = events.iter().any(|e| e.action == Action::Alloc && e.stack != EMPTY_STACK);
    events
        .iter()
        .enumerate()
        .any(|(i, e)| e.action == Action::Alloc && if e.stack == EMPTY_STACK { framed } else { gradient(i) })
}

impl EventFacts {
    /// Whether the trace recorded a whole pass of the program's loop before event `at`: an optimizer step the
    /// program went on from before `at`, or an iteration's end. Where it did not (the OOM struck in the first pass
    /// the trace holds), what that pass does after `at` — the rest of the forward, the loss, the backward, the
    /// optimizer step — is nowhere in the file, and a replay that fits up to `at` proves nothing about it.
    pub fn whole_pass_before(&self, at: usize) -> bool {
        self.steps_closed_at.iter().any(|&e| e < at)
            || self.iterations.as_ref().is_some_and(|it| it.ends.iter().any(|&e| e < at))
    }
}

/// Computes every fact for one device, given those computed from its events alone.
/// `live` waits for the passes that follow what each stack holds live (running on another core, see
/// [`live_passes`]), asked for last.
pub fn compute(cx: &Context, ev: &EventFacts, live: impl FnOnce() -> LivePasses) -> Facts {
    let mut f = Facts::default();
    let r = cx.report;
    let events = &cx.dev.events;
    f.text("moment", r.moment.words(), "which moment the state facts describe: OOM, peak, end or time");
    f.num("allocated_bytes", r.allocated_bytes as f64, Unit::Bytes, "bytes held by tensors at the moment");
    f.num("reserved_bytes", r.reserved_bytes as f64, Unit::Bytes, "bytes PyTorch's cache holds from the driver");
    f.num("active_bytes", r.active_bytes as f64, Unit::Bytes, "allocated plus freed-but-pending bytes");
    reserved_unallocated_facts(&mut f, r, "reserved but not allocated to a tensor");
    f.num("largest_free_block_bytes", r.largest_free_block_bytes as f64, Unit::Bytes, "largest cached free block");
    f.num(
        "cache.free_bytes",
        r.reserved_bytes.saturating_sub(r.active_bytes) as f64,
        Unit::Bytes,
        "free bytes in PyTorch's cache (all pools)",
    );
    f.num(
        "cache.largest_free_block_bytes",
        r.largest_free_block_bytes as f64,
        Unit::Bytes,
        "same as largest_free_block_bytes",
    );
    f.num("segments", r.segments as f64, Unit::Count, "segments at the moment");

    // The OOM.
    f.flag("oom.present", r.oom.is_some(), "there was an OOM (trace event or log message) and the moment is the last");
    f.num("oom.count", r.oom_count as f64, Unit::Count, "OOM events in the trace");
    if let Some(o) = &r.oom {
        f.text(
            "oom.source",
            o.source.name(),
            "what says the OOM happened: snapshot (a trace event) or log (a message only)",
        );
        f.opt(
            "oom.requested_bytes",
            o.requested_bytes.map(|b| b as f64),
            Unit::Bytes,
            "block size the allocator could not find",
        );
        f.opt(
            "oom.device_free_bytes",
            o.device_free_bytes.map(|b| b as f64),
            Unit::Bytes,
            "driver-reported free bytes",
        );
        f.opt(
            "oom.pool_free_bytes",
            o.cached_free_in_pool_bytes.map(|b| b as f64),
            Unit::Bytes,
            "free bytes cached in the request's pool and stream",
        );
        f.opt(
            "oom.pool_largest_free_block_bytes",
            o.largest_free_in_pool_bytes.map(|b| b as f64),
            Unit::Bytes,
            "largest free block in the request's pool and stream",
        );
        f.text("oom.where", o.culprit.clone(), "who made the failing request");
        let attention = o.stack.iter().any(|fr| {
            // `file:line:function`
            let (file, func) = fr.rsplit_once(':').unwrap_or((fr.as_str(), ""));
            is_attention_frame(file, func)
        });
        f.flag("oom.attention", attention, "the failing request came from attention code");
        if let (Some(req), Some(i)) = (o.requested_bytes, o.event_index) {
            intermediate_facts(&mut f, cx, req, events[i as usize].stack, attention);
            request_growth_facts(&mut f, &events[..i as usize], events[i as usize].stack, req);
        }
    }
    if let Some(p) = &r.peak {
        f.num("peak.allocated_bytes", p.allocated_bytes as f64, Unit::Bytes, "highest allocated bytes in the trace");
        f.num("peak.reserved_bytes", p.reserved_bytes as f64, Unit::Bytes, "highest reserved bytes in the trace");
    }
    f.num("trace.entries", events.len() as f64, Unit::Count, "trace events on this device");
    f.flag("trace.complete", r.trace.complete, "the trace reaches back to an empty allocator");
    if let Some(span) = r.trace.span_us {
        f.num("trace.span_us", span as f64, Unit::Micros, "time from the first to the last event");
    }

    // Allocator settings.
    let settings = cx.tl.settings.as_ref();
    let expandable = settings.and_then(|s| s.expandable_segments);
    if let Some(e) = expandable {
        f.flag("settings.expandable_segments", e, "expandable_segments as the file records it (torch ≥ 2.3)");
    }
    f.flag(
        "settings.expandable_segments_on",
        expandable == Some(true) || cx.replay.rules.expandable,
        "expandable segments were in use (from the settings or the segments themselves)",
    );
    if let Some(m) = settings.and_then(|s| s.max_split_size) {
        f.num("settings.max_split_size_bytes", m as f64, Unit::Bytes, "max_split_size_mb, in bytes");
    }

    // Live memory by category, at the moment (the report's own split).
    for c in CATEGORIES {
        let (b, n) = r.by_category.iter().find(|x| x.category == c).map_or((0, 0), |x| (x.bytes, x.count));
        f.num(&format!("live.{c}_bytes"), b as f64, Unit::Bytes, "live bytes in this category at the moment");
        f.num(&format!("live.{c}_count"), n as f64, Unit::Count, "live allocations in this category");
        if r.allocated_bytes > 0 {
            f.num(&format!("live.{c}_share"), b as f64 / r.allocated_bytes as f64, Unit::Ratio, "share of allocated");
        }
    }
    // Summed over the blocks rather than taken from the allocated counter: the two agree on any file a real
    // allocator wrote, and a hand-made one whose blocks overlap may make the counter the smaller.
    let known = r.by_category.iter().filter(|c| c.category != "unknown").fold(0u64, |t, c| t.saturating_add(c.bytes));
    f.num("live.categorized_bytes", known as f64, Unit::Bytes, "live bytes whose category is known");

    // Largest live allocation.
    if let Some(top) = r.top_allocations.first() {
        f.num("largest.bytes", top.bytes as f64, Unit::Bytes, "the largest live allocation at the moment");
        let base = cx.gpu_memory.unwrap_or(r.reserved_bytes);
        if base > 0 {
            f.num(
                "largest.share",
                top.bytes as f64 / base as f64,
                Unit::Ratio,
                "its share of the GPU (--gpu-memory) or, without it, of reserved bytes",
            );
        }
        f.flag(
            "largest.attention",
            stack_matches(cx.tl, top.stack_id, is_attention_frame),
            "allocated in attention code",
        );
        f.text("largest.where", user_chain(cx.tl, top.stack_id, 3), "who allocated it");
        f.text("largest.category", top.category, "its category");
    }

    // Memory outside PyTorch.
    super::observed::outside_pytorch_facts(&mut f, r, cx.gpu_memory, cx.memory_cap);
    super::observed::backend_facts(&mut f, r, Some(cx.tl.capture.backend));
    f.map.extend(ev.facts.map.iter().map(|(k, v)| (k.clone(), v.clone())));
    if events.is_empty() {
        return f;
    }
    let cx = &Ctx { cx, kinds: &ev.kinds };
    iteration_peaks(&mut f, cx, ev.iterations.as_ref().map_or(&[], |it| &it.ends));
    let LivePasses { leaks, kv } = live();
    let oom_event = r.oom.as_ref().and_then(|o| o.event_index);
    debug_assert!(kv.as_ref().is_none_or(|k| k.last == oom_event.map_or(events.len() - 1, |i| i as usize)));
    kv_facts(&mut f, cx, kv);
    compile_facts(&mut f, cx, ev.last_compile);
    leak_facts(&mut f, cx, leaks);
    f
}

const NONE: u8 = u8::MAX;

fn kind_index(c: &str) -> u8 {
    CATEGORIES.iter().position(|k| *k == c).map_or(NONE, |i| i as u8)
}

/// The context plus each event's category index.
struct Ctx<'a> {
    cx: &'a Context<'a>,
    kinds: &'a [u8],
}

impl<'a> std::ops::Deref for Ctx<'a> {
    type Target = Context<'a>;
    fn deref(&self) -> &Context<'a> {
        self.cx
    }
}

/// The failing request and the live tensors of its kind: those allocated where it was (or, for attention, in
/// attention code) and at least a quarter of its size — a second score tensor, the softmax's copy of the first.
fn intermediate_facts(f: &mut Facts, cx: &Context, requested: u64, stack: StackId, attention: bool) {
    let mut attn_cache: FxHashMap<StackId, bool> = FxHashMap::default();
    let mut kin = |s: StackId| {
        s == stack
            || (attention
                && s != EMPTY_STACK
                && *attn_cache.entry(s).or_insert_with(|| stack_matches(cx.tl, s, is_attention_frame)))
    };
    let (mut bytes, mut count) = (0u64, 0u32);
    for (_, _, b) in cx.state.allocated_blocks() {
        if b.size >= requested / 4 && stack != EMPTY_STACK && kin(b.stack) {
            bytes += b.size;
            count += 1;
        }
    }
    f.num(
        "intermediate.live_bytes",
        bytes as f64,
        Unit::Bytes,
        "live tensors of the failing request's kind (its line, or attention code), each at least a quarter its size",
    );
    f.num("intermediate.live_count", count as f64, Unit::Count, "how many such tensors were live");
    f.num(
        "intermediate.bytes",
        (bytes + requested) as f64,
        Unit::Bytes,
        "the failing request plus the live tensors of its kind",
    );
}

/// Whether the failing request is the next copy of a buffer its line keeps re-allocating larger: `torch.cat` onto
/// an accumulator makes the new, longer copy while the old one is still live, then frees the old one. Counted over
/// the line's allocations before the OOM: the run of such copies, each larger than the last and each made while an
/// earlier one from the same line was live, that the request would extend. A line whose tensors grow from step to
/// step but are freed between (attention scores over a growing sequence) makes no run.
fn request_growth_facts(f: &mut Facts, before: &[crate::timeline::Event], stack: StackId, requested: u64) {
    let run = if stack == EMPTY_STACK {
        match frameless_request_growth(before, requested) {
            Some(run) => run,
            None => return,
        }
    } else {
        line_request_growth(before, stack, requested)
    };
    let steps = run.map_or(0, |r| r.0);
    f.num(
        "oom.request_growth_steps",
        f64::from(steps),
        Unit::Count,
        "copies of one buffer its line re-allocated larger, each while an earlier one was live, that the failing \
         request would extend (torch.cat onto an accumulator)",
    );
    if let Some((_, first)) = run {
        f.num("oom.request_growth_first_bytes", first as f64, Unit::Bytes, "the buffer's size at the run's first copy");
    }
}

/// The run of copies from one line that the request extends: (copies, the first copy's size).
fn line_request_growth(before: &[crate::timeline::Event], stack: StackId, requested: u64) -> Option<(u32, u64)> {
    let mut live: FxHashMap<u64, u64> = FxHashMap::default();
    let (mut run, mut last, mut first, mut live_before) = (0u32, 0u64, 0u64, 0usize);
    // The old copies are freed as the new ones are made: the line's live count stays flat along the run (a list
    // that keeps every tensor grows it, and is a leak, not one buffer).
    let extends = |live: usize, live_before: usize, size: u64, last: u64, run: u32| {
        run > 0 && live > 0 && live <= live_before.max(1) && size > last
    };
    for e in before {
        match e.action {
            Action::Alloc if e.stack == stack => {
                if extends(live.len(), live_before, e.size, last, run) {
                    run += 1;
                } else {
                    run = 1;
                    first = e.size;
                }
                last = e.size;
                live_before = live.len();
                live.insert(e.addr, e.size);
            }
            Action::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    // The request extends the run when an earlier copy is live at the OOM and it asks for more than the last.
    extends(live.len(), live_before, requested, last, run).then_some((run, first))
}

/// [`line_request_growth`] in a trace with no frame: the request extends an object grown by concatenation (each
/// copy linked to the one it replaced) whose last copy is live at the OOM, asking up to twice as much. `None` where
/// the trace has frames (a frameless request there is the backward's) or its objects are a model's cache (the
/// KV-cache rule's).
fn frameless_request_growth(before: &[crate::timeline::Event], requested: u64) -> Option<Option<(u32, u64)>> {
    if super::concatenation::of_frameless_trace(before).is_none_or(|g| g.a_cache(before)) {
        return None;
    }
    let buffers = super::concatenation::frameless_buffers(before);
    let extended =
        buffers.iter().find(|o| super::concatenation::extends(before, o, before.len(), requested, |old| old * 2));
    Some(extended.map(|o| (o.len() as u32, before[o[0]].size)))
}

fn stack_matches(tl: &Timeline, stack: StackId, pred: fn(&str, &str) -> bool) -> bool {
    tl.stacks.stack(stack).iter().any(|&id| {
        let fr = tl.stacks.frame(id);
        pred(tl.strings.get(fr.filename), tl.strings.get(fr.name))
    })
}

fn is_attention_frame(file: &str, name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["softmax", "matmul", "bmm", "baddbmm", "einsum", "attention", "attn", "scaled_dot_product"]
        .iter()
        .any(|k| n.contains(k))
        || file.to_ascii_lowercase().contains("attention")
}

fn segment_facts(f: &mut Facts, events: &[crate::timeline::Event]) {
    let (mut alloc, mut free, mut freed) = (0usize, 0usize, 0u64);
    // A flush: segments given back (empty_cache, or the allocator freeing its cache to retry a cudaMalloc), then
    // segments asked for again — the cache emptied and refilled once.
    let (mut flushes, mut flushing) = (0usize, false);
    for e in events {
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                alloc += usize::from(e.action == Action::SegmentAlloc);
                if flushing {
                    flushes += 1;
                    flushing = false;
                }
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                free += usize::from(e.action == Action::SegmentFree);
                freed += e.size;
                flushing = true;
            }
            _ => {}
        }
    }
    f.num("segments.flushes", flushes as f64, Unit::Count, "times segments were given back and then asked for again");
    let (alloc, free) = (alloc as f64, free as f64);
    f.num("segments.alloc_events", alloc, Unit::Count, "cudaMalloc calls (segment_alloc) in the trace");
    f.num("segments.free_events", free, Unit::Count, "cudaFree calls (segment_free) in the trace");
    f.num("segments.freed_bytes", freed as f64, Unit::Bytes, "bytes given back to the driver in the trace");
    let span = events.len().max(1) as f64;
    f.num("segments.free_events_per_1k", free * 1000.0 / span, Unit::Plain, "segment_free per 1000 events");
}

/// Ends of optimizer steps: the last event of each run of allocations made under `torch.optim` (or another
/// optimizer's `step`), the natural boundary between training iterations; and for each step the program went on
/// from, the allocation that ended it (a step still running at the trace's end has none).
fn optimizer_steps(events: &[crate::timeline::Event], kinds: &[u8]) -> (Vec<usize>, Vec<usize>) {
    let (mut ends, mut closed_at) = (Vec::new(), Vec::new());
    let mut in_step = false;
    let mut last = 0;
    let optimizer = kind_index("optimizer_state");
    for (i, e) in events.iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        let opt = kinds[i] == optimizer;
        if opt {
            in_step = true;
            last = i;
        } else if in_step {
            ends.push(last);
            closed_at.push(i);
            in_step = false;
        }
    }
    if in_step {
        ends.push(last);
    }
    (ends, closed_at)
}

fn iteration_peaks(f: &mut Facts, cx: &Ctx, steps: &[usize]) {
    let series = &cx.replay.allocated_series;
    if steps.len() < 2 || series.is_empty() {
        return;
    }
    let mut peaks = Vec::new();
    let mut start = 0;
    for &end in steps {
        if end >= start {
            peaks.push(series[start..=end.min(series.len() - 1)].iter().copied().max().unwrap_or(0));
        }
        start = end + 1;
    }
    let first = peaks[0];
    let last = *peaks.last().expect("non-empty");
    f.num("iter.first_peak_bytes", first as f64, Unit::Bytes, "peak allocated bytes of the first iteration");
    f.num("iter.last_peak_bytes", last as f64, Unit::Bytes, "peak allocated bytes of the last whole iteration");
    f.num(
        "iter.max_peak_bytes",
        peaks.iter().copied().max().unwrap_or(0) as f64,
        Unit::Bytes,
        "highest per-iteration peak",
    );
}

/// What an allocation is followed by across the trace: the stack that made it, or, in a trace that recorded no frame
/// at all (`context=None`), its size — a loop's line makes tensors of one size each pass, so a size stands in for
/// the line (two lines of one size are taken for one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Site {
    Stack(StackId),
    Size(u64),
}

/// Live bytes and counts per site at chosen event indices (requested sizes; a block's rounding does not matter
/// for growth). With `by_size`, frameless allocations are followed by their size; otherwise they are left out.
fn live_per_site_at(
    events: &[crate::timeline::Event],
    kinds: &[u8],
    marks: &[usize],
    keep: &dyn Fn(u8) -> bool,
    by_size: bool,
) -> Vec<FxHashMap<Site, (u64, u32)>> {
    let mut live: FxHashMap<u64, (Site, u64)> = FxHashMap::default();
    let mut per: FxHashMap<Site, (u64, u32)> = FxHashMap::default();
    let mut out = Vec::with_capacity(marks.len());
    let mut next = 0;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc if (by_size || e.stack != EMPTY_STACK) && keep(kinds[i]) => {
                let site = if e.stack == EMPTY_STACK { Site::Size(e.size) } else { Site::Stack(e.stack) };
                if let Some((s, b)) = live.insert(e.addr, (site, e.size)) {
                    let p = per.entry(s).or_default();
                    p.0 = p.0.saturating_sub(b);
                    p.1 = p.1.saturating_sub(1);
                }
                let p = per.entry(site).or_default();
                p.0 += e.size;
                p.1 += 1;
            }
            Action::FreeCompleted | Action::FreeRequested => {
                if let Some((s, b)) = live.remove(&e.addr) {
                    let p = per.entry(s).or_default();
                    p.0 = p.0.saturating_sub(b);
                    p.1 = p.1.saturating_sub(1);
                }
            }
            _ => {}
        }
        while next < marks.len() && marks[next] == i {
            out.push(per.iter().filter(|(_, v)| v.1 > 0).map(|(k, v)| (*k, *v)).collect());
            next += 1;
        }
    }
    while out.len() < marks.len() {
        out.push(per.iter().filter(|(_, v)| v.1 > 0).map(|(k, v)| (*k, *v)).collect());
    }
    out
}

/// Evenly spaced event indices (at most `n`), ending at `last`.
fn even_marks(last: usize, n: usize) -> Vec<usize> {
    let n = n.min(last + 1).max(1);
    (1..=n).map(|k| (last + 1) * k / n - 1).collect()
}

/// `n` marks at even steps of time over `events` (the last event at or before each step), or `None` without
/// timestamps. A decode loop whose cache has stopped growing makes few events per step: spaced by events, its flat
/// end would look short; spaced by time, it is as long as it ran.
fn even_time_marks(events: &[crate::timeline::Event], n: usize) -> Option<Vec<usize>> {
    let t0 = events.iter().find_map(|e| e.time_us())?;
    let t1 = events.iter().rev().find_map(|e| e.time_us())?;
    if t1 <= t0 {
        return None;
    }
    let mut marks = Vec::with_capacity(n);
    let mut i = 0;
    for k in 1..=n as i64 {
        let until = t0 + (t1 - t0) * k / n as i64;
        while i + 1 < events.len() && events[i + 1].time_us().is_none_or(|t| t <= until) {
            i += 1;
        }
        if marks.last() != Some(&i) {
            marks.push(i);
        }
    }
    Some(marks)
}

/// Counts rise-and-fall cycles of a series: falls from a local high by at least a fifth of the series' range.
fn allocation_cycles(series: &[u64]) -> usize {
    let (Some(&lo), Some(&hi)) = (series.iter().min(), series.iter().max()) else { return 0 };
    let range = hi - lo;
    if range == 0 {
        return 0;
    }
    let threshold = range / 5;
    let (mut cycles, mut high, mut low) = (0, series[0], series[0]);
    let mut falling = false;
    for &v in series {
        if !falling {
            high = high.max(v);
            if high - v >= threshold {
                falling = true;
                low = v;
                cycles += 1;
            }
        } else {
            low = low.min(v);
            if v - low >= threshold {
                falling = false;
                high = v;
            }
        }
    }
    cycles
}

/// The passes over the trace that follow what each stack holds live, up to the moment: they need the events' kinds
/// and the replay's series, nothing of the report, and run beside it on another core.
pub struct LivePasses {
    leaks: LeakPass,
    kv: Option<KvSamples>,
}

/// [`LivePasses`] up to event `last` (the report's moment), the KV cache's up to `kv_last` (see [`kv_last`]).
pub fn live_passes(dev: &DeviceTimeline, replay: &Replay, ev: &EventFacts, last: usize, kv_last: usize) -> LivePasses {
    LivePasses { leaks: leak_pass(dev, replay, ev, last), kv: kv_samples(dev, ev, kv_last) }
}

/// What `leak_facts` needs from the trace: its rise-and-fall cycles and, when there is repeated work to compare,
/// the live set per stack at each interval's end.
struct LeakPass {
    cycles: usize,
    intervals: Option<Intervals>,
}

struct Intervals {
    marks: Vec<usize>,
    per_iteration: bool,
    snaps: Vec<FxHashMap<Site, (u64, u32)>>,
}

/// The leak pass up to event `last` (the report's moment).
fn leak_pass(dev: &DeviceTimeline, replay: &Replay, ev: &EventFacts, last: usize) -> LeakPass {
    let series = &replay.allocated_series;
    if series.is_empty() {
        return LeakPass { cycles: 0, intervals: None };
    }
    let cycles = allocation_cycles(&series[..=last.min(series.len() - 1)]);
    // Growth means something only across repeated work: iterations of the loop (optimizer steps, snapshot
    // markers, a repeating sequence of allocating stacks), or else a trace whose allocated memory visibly rises
    // and falls again and again (one training step also accumulates gradients steadily — that is not a leak).
    let ends = ev.iterations.as_ref().map_or(&[][..], |it| &it.ends[..]);
    let (marks, per_iteration) = if ends.len() >= 3 {
        let mut m: Vec<usize> = ends.iter().copied().filter(|&s| s <= last).collect();
        m.push(last);
        m.dedup();
        (m, true)
    } else if cycles >= 4 {
        (even_marks(last, 16), false)
    } else {
        return LeakPass { cycles, intervals: None };
    };
    if marks.len() < 4 {
        return LeakPass { cycles, intervals: None };
    }
    let skip = ["kv_cache", "parameter", "optimizer_state", "compile"].map(kind_index);
    // A trace with no frame anywhere (context=None) is followed by size: nothing else tells its allocations apart.
    let frameless = !dev.events.iter().any(|e| e.action == Action::Alloc && e.stack != EMPTY_STACK);
    let snaps = live_per_site_at(&dev.events, &ev.kinds, &marks, &|k| !skip.contains(&k), frameless);
    LeakPass { cycles, intervals: Some(Intervals { marks, per_iteration, snaps }) }
}

/// A stack whose live allocations accumulate from interval to interval.
struct Accumulating {
    site: Site,
    growth: u64,
    live_bytes: u64,
    live_count: u32,
    rising: f64,
}

/// A stack accumulates when its live count never fell from one interval's end to the next and rose in at least
/// half of them since it first appeared; how steady is steady enough for a finding is the rule's to say
/// (`leak.rising_fraction`).
const ACCUMULATES_RISING: f64 = 0.5;

/// leaked-references: the stacks whose live allocations keep accumulating across iterations, together (a kept
/// autograd graph holds the activations of every layer: many lines, one leak).
fn leak_facts(f: &mut Facts, cx: &Ctx, leaks: LeakPass) {
    f.num("trace.cycles", leaks.cycles as f64, Unit::Count, "rise-and-fall cycles of allocated memory (repeated work)");
    let Some(Intervals { marks, per_iteration, snaps }) = leaks.intervals else { return };
    let end = snaps.last().expect("marks non-empty");
    let mut acc: Vec<Accumulating> = Vec::new();
    for (&site, &(end_bytes, end_count)) in end {
        let counts: Vec<u32> = snaps.iter().map(|s| s.get(&site).map_or(0, |v| v.1)).collect();
        let Some(first) = counts.iter().position(|&c| c > 0) else { continue };
        let seen = counts.len() - first - 1;
        if seen < 3 || counts[first..].windows(2).any(|w| w[1] < w[0]) {
            continue;
        }
        let rising = counts[first..].windows(2).filter(|w| w[1] > w[0]).count() as f64 / seen as f64;
        let first_bytes = snaps[first].get(&site).map_or(0, |v| v.0);
        if rising < ACCUMULATES_RISING || end_bytes <= first_bytes {
            continue;
        }
        acc.push(Accumulating {
            site,
            growth: end_bytes - first_bytes,
            live_bytes: end_bytes,
            live_count: end_count,
            rising,
        });
    }
    if acc.is_empty() {
        return;
    }
    acc.sort_by(|a, b| b.growth.cmp(&a.growth).then(a.site.cmp(&b.site)));
    let growth: u64 = acc.iter().map(|a| a.growth).sum();
    let live_bytes: u64 = acc.iter().map(|a| a.live_bytes).sum();
    let live_count: u32 = acc.iter().map(|a| a.live_count).sum();
    let rising = acc.iter().map(|a| a.rising * a.growth as f64).sum::<f64>() / growth.max(1) as f64;
    let intervals = marks.len() - 1;
    let doc_growth = if per_iteration {
        "bytes the accumulating stacks' live set grows per iteration"
    } else {
        "bytes the accumulating stacks' live set grows per sixteenth of the trace (no iterations found)"
    };
    f.num("leak.growth_bytes", growth as f64, Unit::Bytes, "bytes the accumulating stacks' live set grew in all");
    f.num("leak.growth_per_interval_bytes", growth as f64 / intervals as f64, Unit::Bytes, doc_growth);
    f.num("leak.live_bytes", live_bytes as f64, Unit::Bytes, "live bytes of the accumulating stacks at the moment");
    f.num("leak.live_count", live_count as f64, Unit::Count, "their live allocations at the moment");
    f.num("leak.stacks", acc.len() as f64, Unit::Count, "allocating stacks that accumulate");
    f.num(
        "leak.rising_fraction",
        rising,
        Unit::Ratio,
        "share of intervals in which their live count rose (byte-weighted)",
    );
    f.num("leak.intervals", intervals as f64, Unit::Count, "intervals observed");
    f.flag("leak.per_iteration", per_iteration, "intervals are iterations of the program's loop");
    f.leak_sites = acc.iter().map(|a| a.site).collect();
    let stacks: Vec<StackId> =
        acc.iter().filter_map(|a| if let Site::Stack(s) = a.site { Some(s) } else { None }).collect();
    if let Some(&top) = stacks.first() {
        f.text("leak.where", user_chain(cx.tl, top, 4), "the stack that accumulates the most");
        f.text("leak.sites", super::stacks::sites(cx.tl, &stacks, 4), "the lines that allocated what accumulates");
        let caller = super::stacks::common_caller(cx.tl, &stacks).unwrap_or_else(|| culprit(cx.tl, top));
        f.text("leak.caller", caller, "the innermost line of your code all accumulating allocations were made under");
    } else {
        // Followed by size: say the sizes, and that the line is not known.
        let sizes: Vec<String> = acc
            .iter()
            .take(4)
            .filter_map(|a| match a.site {
                Site::Size(n) => Some(bytes(n)),
                Site::Stack(_) => None,
            })
            .collect();
        let more = if acc.len() > 4 { format!(" and {} more sizes", acc.len() - 4) } else { String::new() };
        let sites =
            format!("an unrecorded line (blocks of {}{more}; the capture recorded no stacks)", sizes.join(", "));
        f.text("leak.where", "(no stack recorded)", "the stack that accumulates the most");
        f.text("leak.sites", sites, "the lines that allocated what accumulates");
        f.text(
            "leak.caller",
            "a line the capture did not record (record with context=\"all\" to see it)",
            "the innermost line of your code all accumulating allocations were made under",
        );
    }
    if cx.report.allocated_bytes > 0 {
        f.num(
            "leak.share",
            live_bytes as f64 / cx.report.allocated_bytes as f64,
            Unit::Ratio,
            "their share of allocated bytes",
        );
    }
}

/// missing-no-sync: gradient all-reduce in every micro-batch, not only the one before the optimizer step.
fn ddp_facts(f: &mut Facts, events: &[crate::timeline::Event], kinds: &[u8], steps: &[usize]) {
    if steps.is_empty() {
        return;
    }
    // Between optimizer steps, count the micro-batches whose backward did communication: communication
    // allocations separated by forward-pass (activation) allocations belong to different micro-batches.
    let mut per_step = Vec::new();
    let mut forwards_per_step = Vec::new();
    let mut start = 0;
    let mut comm_allocs = 0usize;
    let [comm, activation, gradient] = ["communication", "activation", "gradient"].map(kind_index);
    for &end in steps {
        let (mut bursts, mut forwards) = (0usize, 0usize);
        let mut in_comm = false;
        let mut in_fwd = false;
        for (i, e) in events.iter().enumerate().take(end + 1).skip(start) {
            if e.action != Action::Alloc {
                continue;
            }
            // The autograd engine allocates from its own thread: without C++ frames its stacks are empty.
            let kind = if kinds[i] == NONE { gradient } else { kinds[i] };
            match kind {
                _ if kind == comm => {
                    comm_allocs += 1;
                    if !in_comm {
                        bursts += 1;
                    }
                    in_comm = true;
                    in_fwd = false;
                }
                _ if kind == activation => {
                    if !in_fwd {
                        forwards += 1;
                    }
                    in_fwd = true;
                    in_comm = false;
                }
                // A backward pass separates one micro-batch's forward from the next.
                _ if kind == gradient => in_fwd = false,
                _ => {}
            }
        }
        per_step.push(bursts);
        forwards_per_step.push(forwards);
        start = end + 1;
    }
    // The first interval includes set-up; judge the steady state.
    let tail = |v: &[usize]| -> Vec<usize> {
        if v.len() > 1 {
            v[1..].to_vec()
        } else {
            v.to_vec()
        }
    };
    let median = |mut v: Vec<usize>| -> usize {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let with_comm = per_step.iter().filter(|&&b| b > 0).count();
    f.num("ddp.comm_allocs", comm_allocs as f64, Unit::Count, "allocations under DDP / c10d / NCCL frames");
    f.num("ddp.steps_with_allreduce", with_comm as f64, Unit::Count, "optimizer-step intervals with communication");
    if with_comm > 0 {
        f.num(
            "ddp.allreduce_microbatches_per_step",
            median(tail(&per_step)) as f64,
            Unit::Count,
            "median micro-batches per optimizer step whose backward ran an all-reduce",
        );
        f.num(
            "ddp.microbatches_per_step",
            median(tail(&forwards_per_step)) as f64,
            Unit::Count,
            "median forward passes per optimizer step (gradient accumulation steps)",
        );
    }
}

/// Samples of the KV cache's live bytes up to the moment.
const KV_SAMPLES: usize = 32;

/// The KV cache's live bytes at its samples, the last at event `last`.
struct KvSamples {
    last: usize,
    series: Vec<u64>,
}

/// Where the KV cache's samples end: at the OOM where the report's moment is one the trace recorded (the event its
/// OOM report points to); otherwise at the trace's end, so a cache that levelled off after the peak allocated moment
/// is seen to level off.
pub fn kv_last(events: &[crate::timeline::Event], moment: super::Moment, idx: Option<u32>) -> usize {
    match idx {
        Some(i) if moment == super::Moment::Oom && events[i as usize].action == Action::Oom => i as usize,
        _ => events.len().saturating_sub(1),
    }
}

/// unbounded-kv-growth: the KV cache's live bytes up to the moment, judged on their envelope — the most bytes live
/// at once so far at each sample — so that a cache re-allocated one token longer each step (torch.cat: new, then the
/// old freed), one that grows in steps as requests join, and a running batch that merges and retires requests (a
/// sawtooth) all count as growth, while a cache allocated once (static, paged, preallocated) or one that levels off
/// does not. The KV cache is what KV-cache code allocated, and, in a trace with no backward pass, any stack in the
/// model's forward grown by concatenation (a cache the user wrote, whatever its frames are called: see
/// [`event_facts`]). Sampled by [`kv_samples`], judged by [`kv_facts`].
fn kv_samples(dev: &DeviceTimeline, ev: &EventFacts, last: usize) -> Option<KvSamples> {
    let kv = kind_index("kv_cache");
    if !ev.kinds.contains(&kv) {
        return None;
    }
    // At the ends of the decode steps when the loop is known and its steps reach the moment: mid-step, a cache being
    // rebuilt one token longer is briefly there twice (the new tensor before the old is freed), which an arbitrary
    // sample would catch. The moment itself is the last sample.
    let ends: Vec<usize> =
        ev.iterations.as_ref().map_or(Vec::new(), |it| it.ends.iter().copied().filter(|&e| e <= last).collect());
    let reaches = ends.last().is_some_and(|&e| e * 10 >= last * 9);
    let mut marks = if ends.len() >= 8 && reaches {
        let n = KV_SAMPLES.min(ends.len());
        let mut m: Vec<usize> = (1..=n).map(|k| ends[ends.len() * k / n - 1]).collect();
        m.dedup();
        m
    } else {
        even_time_marks(&dev.events[..=last], KV_SAMPLES).unwrap_or_else(|| even_marks(last, KV_SAMPLES))
    };
    if marks.last() != Some(&last) {
        marks.push(last);
    }
    let series: Vec<u64> = live_per_site_at(&dev.events, &ev.kinds, &marks, &|k| k == kv, true)
        .iter()
        .map(|s| s.values().map(|v| v.0).sum())
        .collect();
    Some(KvSamples { last, series })
}

fn kv_facts(f: &mut Facts, cx: &Ctx, samples: Option<KvSamples>) {
    let Some(KvSamples { series, .. }) = samples else { return };
    let kv = kind_index("kv_cache");
    let Some(first) = series.iter().position(|&b| b > 0) else { return };
    let tail = &series[first..];
    let now = *series.last().expect("marks non-empty");
    let envelope: Vec<u64> = tail
        .iter()
        .scan(0u64, |m, &v| {
            *m = (*m).max(v);
            Some(*m)
        })
        .collect();
    let max = *envelope.last().expect("non-empty");
    f.num("kv.live_bytes", now as f64, Unit::Bytes, "KV-cache bytes live at the moment");
    f.num("kv.first_bytes", tail[0] as f64, Unit::Bytes, "KV-cache bytes when first seen");
    f.num("kv.max_bytes", max as f64, Unit::Bytes, "the most KV-cache bytes live at once, up to the moment");
    f.num("kv.growth_bytes", now.saturating_sub(tail[0]) as f64, Unit::Bytes, "KV-cache bytes gained since first seen");
    if tail.len() >= 4 && tail[0] > 0 {
        // A rise is more than 1%: a cache that is reallocated at the same size (or with allocator rounding noise)
        // is not growing.
        let grew = |a: u64, b: u64| b > a + a / 100;
        let rises = envelope.windows(2).filter(|w| grew(w[0], w[1])).count();
        f.num("kv.growth_ratio", max as f64 / tail[0] as f64, Unit::Plain, "most KV bytes at once ÷ when first seen");
        f.num(
            "kv.rising_fraction",
            rises as f64 / (tail.len() - 1) as f64,
            Unit::Ratio,
            "share of samples where the most KV bytes so far rose",
        );
        // A plateau: the envelope did not rise over the last quarter of the samples.
        let q = (tail.len() / 4).max(1);
        let quarter = &envelope[envelope.len() - q - 1..];
        f.flag("kv.plateau", !grew(quarter[0], max), "KV bytes stopped rising over the last quarter of the trace");
        // Growth spread over the run, not one jump: in how many quarters of the samples the envelope rose.
        let n = envelope.len() - 1;
        let quarters = (0..4).filter(|&i| grew(envelope[n * i / 4], envelope[n * (i + 1) / 4])).count();
        f.num(
            "kv.rising_quarters",
            quarters as f64,
            Unit::Count,
            "quarters of the samples in which the most KV bytes so far rose",
        );
        f.num("kv.samples", tail.len() as f64, Unit::Count, "samples since the KV cache appeared");
        // Still growing at the moment, whatever the path: the envelope rose in the last third of the samples, or
        // the OOM's own request was the cache asking for more.
        let third = &envelope[envelope.len() - (tail.len() / 3).max(1) - 1..];
        let oom_is_kv = cx.report.oom.as_ref().and_then(|o| o.event_index).is_some_and(|i| cx.kinds[i as usize] == kv);
        f.flag("kv.oom_request", oom_is_kv, "the OOM's request was the KV cache's (the cache asked for more)");
        f.flag(
            "kv.still_rising",
            grew(third[0], max) || oom_is_kv,
            "the most KV bytes so far rose in the last third of the samples, or the OOM's request was the KV cache's",
        );
    }
    // Without the growth the request would have fit: the growth made the difference at the OOM.
    if let Some((req, free)) =
        cx.report.oom.as_ref().and_then(|o| o.requested_bytes.zip(o.device_free_bytes)).filter(|_| tail.len() >= 4)
    {
        f.flag(
            "kv.covers_deficit",
            now.saturating_sub(tail[0]) >= req.saturating_sub(free),
            "the KV bytes gained since the cache appeared are at least what the failing request lacked (request − driver free)",
        );
    }
    if cx.report.allocated_bytes > 0 {
        f.num("kv.share", now as f64 / cx.report.allocated_bytes as f64, Unit::Ratio, "KV share of allocated bytes");
        f.num(
            "kv.growth_share",
            now.saturating_sub(tail[0]) as f64 / cx.report.allocated_bytes as f64,
            Unit::Ratio,
            "KV-cache bytes gained since first seen, as a share of allocated bytes at the moment",
        );
    }
}

/// compile-warmup: the peak (or the OOM) during torch.compile's first iterations, against the steady state.
/// The last event made while torch.compile was at work: with a compile context, or with compile frames.
fn last_compile_event(tl: &Timeline, dev: &DeviceTimeline, kinds: &[u8]) -> Option<usize> {
    let na = tl.strings.lookup("N/A");
    // Few distinct attribute sets: judge each one's compile context once.
    let compiling: Vec<bool> = dev
        .event_attrs
        .all()
        .iter()
        .map(|a| {
            let cc = a.compile_context;
            cc != NO_STR && Some(cc) != na && !tl.str(cc).is_empty()
        })
        .collect();
    let compile = kind_index("compile");
    dev.events
        .iter()
        .zip(kinds)
        .rposition(|(e, &k)| k == compile || compiling.get(e.attrs_id() as usize).copied().unwrap_or(false))
}

fn compile_facts(f: &mut Facts, cx: &Ctx, last_compile: Option<usize>) {
    f.flag("compile.seen", last_compile.is_some(), "torch.compile (dynamo/inductor) activity in the trace");
    let Some(last_compile) = last_compile else { return };
    let series = &cx.replay.allocated_series;
    let compile_peak = series[..=last_compile].iter().copied().max().unwrap_or(0);
    f.num("compile.peak_bytes", compile_peak as f64, Unit::Bytes, "peak allocated up to the last compile event");
    if last_compile + 1 < series.len() {
        let steady = series[last_compile + 1..].iter().copied().max().unwrap_or(0);
        f.num("steady.peak_bytes", steady as f64, Unit::Bytes, "peak allocated after compilation finished");
        if steady > 0 {
            f.num("compile.peak_ratio", compile_peak as f64 / steady as f64, Unit::Plain, "compile peak ÷ steady peak");
        }
    }
    if let Some(i) = cx.report.oom.as_ref().and_then(|o| o.event_index) {
        f.flag("compile.oom", i as usize <= last_compile, "the OOM happened while compiling");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Event;

    fn facts_of(plan: &[(Action, u8)]) -> EventFacts {
        let (events, kinds): (Vec<Event>, Vec<u8>) = plan.iter().map(|&(a, k)| (Event::new(a, 0, 512), k)).unzip();
        let (_, steps_closed_at) = optimizer_steps(&events, &kinds);
        EventFacts { kinds, iterations: None, steps_closed_at, last_compile: None, facts: Facts::default() }
    }

    #[test]
    fn a_step_counts_as_a_whole_pass_only_if_the_program_went_on_from_it_before_the_oom() {
        let (opt, act) = (kind_index("optimizer_state"), kind_index("activation"));
        // The OOM (event 3) strikes in the first optimizer step; an `except` handler allocates after it.
        let first = facts_of(&[
            (Action::Alloc, act),
            (Action::Alloc, opt),
            (Action::Alloc, opt),
            (Action::Oom, NONE),
            (Action::Alloc, act),
        ]);
        assert!(!first.whole_pass_before(3));
        // A step, the next forward, then the OOM (event 4): one whole pass before it.
        let second = facts_of(&[
            (Action::Alloc, act),
            (Action::Alloc, opt),
            (Action::Alloc, act),
            (Action::Alloc, act),
            (Action::Oom, NONE),
        ]);
        assert!(second.whole_pass_before(4));
        assert!(!second.whole_pass_before(2), "the step ended at event 2, by the allocation there");
    }
}
