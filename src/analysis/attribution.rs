//! What each live block at the moment is for, from everything the file holds, in order of trust:
//!
//! 1. **label** — the `user_metadata` torch wrote on the allocating event (component tracking names the module, or
//!    `optimizer` during `optimizer.step`; `_set_memory_metadata` lets code set it);
//! 2. **stack** — the allocating frames, judged by the library code in them (`rules/categories.toml`);
//! 3. **inferred** — lifetime and size, where the capture recorded no stack: a block alive since before recording
//!    began was built first and kept (parameters and buffers, and, if recording began after a step, gradients and
//!    optimizer state, whose sizes repeat the parameters'); a block the backward allocated without a Python frame
//!    (`stacks="python"` records none on the autograd thread) is a gradient when a parameter has its size and an
//!    activation's gradient or temporary otherwise.
//!
//! Only bytes none of these decides stay `unknown`. Each block says which source decided, and an inferred one the
//! reason, in a short phrase a report can show.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use super::categories::CategoryCache;
use crate::timeline::replay::{LiveBlock, State};
use crate::timeline::stacks::{StackId, StrId, EMPTY_STACK};
use crate::timeline::{Action, BlockState, DeviceTimeline, Timeline, NO_STR};

/// How a block's category was known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// A label torch recorded on the allocation (`user_metadata`).
    Label,
    /// The frames of the allocating stack.
    Stack,
    /// Lifetime and size.
    Inferred,
}

/// Why a block got its category when no stack said so, or when its stack alone could not. JSON writes its phrase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// Alive since before recording began and never freed: what the job built first.
    BuiltBeforeRecording,
    /// Alive since before recording; the parameters' sizes repeat, and this is one of the repeats.
    RepeatsParameterSizes,
    /// Allocated by the backward (no Python frame, or the autograd engine's frames) with a parameter's size.
    BackwardParameterSized,
    /// Allocated by the backward with a size no parameter has: an activation's gradient or a temporary.
    BackwardNotParameterSized,
    /// A state-only dump: sizes alone, which repeat the parameters'.
    StateSizesRepeat,
    /// A state-only dump: kept, and first of its size.
    StateKept,
    /// Alive since before recording; the trace allocates blocks of its size as this category and keeps them.
    SizeAllocatedInTrace,
    /// Alive since before recording, but the trace was still freeing other blocks of its size made before it when it
    /// ended: transient.
    FreedLikeIt,
    /// Alive since before recording, the only block of its size, and the trace allocates its size only as this
    /// category, never as a parameter's kind.
    LoneSizeOfAnotherKind,
    /// Alive since before recording; the trace keeps blocks of its size as several categories, and the blocks from
    /// before are shared among them in that proportion.
    SizeKeptAsSeveralKinds,
    /// A trace with no frame: re-made a little larger again and again (concatenation), beside others growing with
    /// it: a model's cache, a key and a value per layer.
    GrownSideBySide,
    /// A trace with no frame: re-made a little larger again and again (concatenation), the only object that grows:
    /// an accumulator the program keeps.
    GrownAlone,
    /// A trace with no frame: made before the loop's passes, or by the first of them only, and kept.
    BuiltBeforeTheLoop,
    /// A trace with no frame, of a job whose optimizer keeps copies: made by a later step and kept, a weight's size.
    KeptByALaterStep,
    /// A trace with no frame: made by a pass of the loop and let go of (within it or passes later), or by the pass
    /// that was running.
    MadeByAPass,
    /// A trace with no frame: kept from pass to pass, with others its pass made.
    KeptWithItsPass,
    /// A trace with no frame: kept from pass to pass, the one tensor each pass keeps.
    PassOutputKept,
    /// A trace with no frame: kept from pass to pass, made as a copy of a tensor its pass let go of at once.
    PassCopyKept,
}

impl Reason {
    /// One short phrase for reports.
    pub fn words(self) -> &'static str {
        match self {
            Reason::BuiltBeforeRecording => "allocated before recording began and kept: built with the model",
            Reason::RepeatsParameterSizes => "allocated before recording; its size repeats the parameters'",
            Reason::BackwardParameterSized => "allocated in the backward; a parameter has its size",
            Reason::BackwardNotParameterSized => "allocated in the backward; no parameter has its size",
            Reason::StateSizesRepeat => "no history recorded; its size repeats the parameters'",
            Reason::StateKept => "no history recorded; taken as built with the model",
            Reason::SizeAllocatedInTrace => {
                "allocated before recording; the trace allocates and keeps its size as this"
            }
            Reason::FreedLikeIt => {
                "allocated before recording; the trace was still freeing others of its size: transient"
            }
            Reason::SizeKeptAsSeveralKinds => {
                "allocated before recording; the trace keeps its size as several kinds, and those from before are \
                 shared among them in the same proportion"
            }
            Reason::GrownSideBySide => {
                "no stack recorded; re-made a little larger at every step beside others growing with it: a cache, \
                 one per layer"
            }
            Reason::GrownAlone => {
                "no stack recorded; re-made a little larger at every step, the only object that grows: an \
                 accumulator"
            }
            Reason::BuiltBeforeTheLoop => {
                "no stack recorded; made before the loop's passes (or once, by the first) and kept: built with the \
                 model"
            }
            Reason::KeptByALaterStep => {
                "no stack recorded; made by a later step and kept, a weight's size, where the optimizer keeps \
                 copies: that step's gradients"
            }
            Reason::MadeByAPass => {
                "no stack recorded; made by a pass of the loop and let go of, or by the pass that ran out: its \
                 working memory"
            }
            Reason::KeptWithItsPass => {
                "no stack recorded; kept from pass to pass with the rest of its pass's tensors: a graph held by a \
                 reference to its output"
            }
            Reason::PassOutputKept => {
                "no stack recorded; the one tensor each pass of the loop keeps to the end: the pass's output"
            }
            Reason::PassCopyKept => {
                "no stack recorded; kept from pass to pass, made as a copy of a tensor its pass let go of at once: \
                 the program's own"
            }
            Reason::LoneSizeOfAnotherKind => {
                "allocated before recording, the only block of its size; the trace allocates its size only as \
                 this, never as a parameter's"
            }
        }
    }
}

impl Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.words())
    }
}

/// One block's category and how it was known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attributed {
    pub category: &'static str,
    /// `None` for `unknown`.
    pub source: Option<Source>,
    pub reason: Option<Reason>,
}

impl Attributed {
    fn unknown() -> Attributed {
        Attributed { category: "unknown", source: None, reason: None }
    }
}

/// The category of every allocated block at a moment, by block address, and the labels torch recorded on it.
#[derive(Debug, Default)]
pub struct Attribution {
    blocks: FxHashMap<u64, Attributed>,
    labels: FxHashMap<u64, Labels>,
}

/// What torch recorded of a block besides its stack: the `user_metadata` of its allocation (component tracking's
/// module name, `optimizer`, or what code set) and the last `annotate` entry made on it since.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    pub alloc: Option<StrId>,
    pub annotation: Option<StrId>,
}

impl Attribution {
    /// The block at `addr` (an allocated block of the state this was computed from).
    pub fn of(&self, addr: u64) -> Attributed {
        self.blocks.get(&addr).copied().unwrap_or_else(Attributed::unknown)
    }

    pub fn labels(&self, addr: u64) -> Labels {
        self.labels.get(&addr).copied().unwrap_or_default()
    }
}

/// The labels of every allocated block of `state`, once the first `seen` trace events happened: a block's
/// `annotate` entries come after its allocation and no later than the moment.
fn labels(tl: &Timeline, dev: &DeviceTimeline, state: &State, seen: usize) -> FxHashMap<u64, Labels> {
    let text = |s: StrId| (s != NO_STR && !matches!(tl.strings.get(s), "" | "N/A")).then_some(s);
    let last = seen.min(dev.events.len());
    let mut annotations: FxHashMap<u64, Vec<(u32, StrId)>> = FxHashMap::default();
    for (i, e) in dev.events[..last].iter().enumerate().filter(|(_, e)| e.action == Action::Annotate) {
        if let Some(s) = text(dev.attrs(e).user_metadata) {
            annotations.entry(e.addr).or_default().push((i as u32, s));
        }
    }
    let mut out = FxHashMap::default();
    for (_, addr, b) in state.allocated_blocks() {
        let alloc = b.alloc_event.and_then(|i| text(dev.attrs(&dev.events[i as usize]).user_metadata));
        let annotation = annotations
            .get(&addr)
            .and_then(|v| v.iter().rev().find(|(i, _)| b.alloc_event.is_none_or(|a| *i > a)).map(|(_, s)| *s));
        if alloc.is_some() || annotation.is_some() {
            out.insert(addr, Labels { alloc, annotation });
        }
    }
    out
}

/// Role a size group's blocks take, in the order the allocator's users create them.
const ROLES: [&str; 3] = ["parameter", "gradient", "optimizer_state"];

/// Attributes every allocated block of `state`, the allocator's state once the first `seen` trace events happened.
/// `end` gives the state at the end of the trace (with each block's allocating event), asked for only when this
/// moment shows nothing of how many copies of each parameter the job keeps.
pub fn attribute(
    tl: &Timeline,
    dev: &DeviceTimeline,
    state: &State,
    seen: usize,
    end: impl FnOnce() -> State,
    cats: &mut CategoryCache,
) -> Attribution {
    attribute_with_evidence(tl, dev, state, seen, end, cats, &mut TraceEvidence::of(dev))
}

/// [`attribute`] with the trace's evidence read once and kept by the caller, for a view that attributes many
/// moments of one trace (the TUI's cursor).
pub fn attribute_with_evidence(
    tl: &Timeline,
    dev: &DeviceTimeline,
    state: &State,
    seen: usize,
    end: impl FnOnce() -> State,
    cats: &mut CategoryCache,
    trace: &mut TraceEvidence,
) -> Attribution {
    let labels = labels(tl, dev, state, seen);
    let (out, evidenced) = attribute_with(tl, dev, state, &labels, cats, trace, None);
    let mut out = if evidenced.is_some() || seen >= dev.events.len() {
        out
    } else {
        // At this moment nothing live shows how many copies of each parameter the job keeps (in the forward, no
        // gradient is live and the optimizer's state has no stack): the end of the trace may. Read once per trace.
        let parameters = match trace.parameters_at_end {
            Some(p) => p,
            None => {
                let end = end();
                let end_labels = self::labels(tl, dev, &end, dev.events.len());
                let p = attribute_with(tl, dev, &end, &end_labels, cats, trace, None).1.map(|(_, p)| p);
                trace.parameters_at_end = Some(p);
                p
            }
        };
        match parameters {
            Some(p) => attribute_with(tl, dev, state, &labels, cats, trace, Some(p)).0,
            None => out,
        }
    };
    out.labels = labels;
    out
}

/// What the whole trace says, whatever the moment: whether it records stacks, and what it allocates (and frees
/// from before it began) of each size.
pub struct TraceEvidence {
    stacks: bool,
    /// Read once, when a moment first has blocks from before recording.
    by_size: Option<FxHashMap<u64, SizeEvidence>>,
    /// The parameters' bytes the end of the trace shows (none where it shows no copies), once a moment asked.
    parameters_at_end: Option<Option<u64>>,
    /// Whether the trace shows a backward pass, once a moment asked.
    backward: Option<bool>,
    /// In a trace with no frame, the allocating events of the objects grown by concatenation and the category
    /// they are (see [`super::concatenation::Frameless`]), once a moment asked.
    grown: Option<FxHashMap<usize, Attributed>>,
    /// In a trace with no frame, what each allocation was to the program's loop (see [`super::lifetimes`]), once
    /// a moment asked.
    roles: Option<Option<super::lifetimes::Roles>>,
    /// The loop's passes where the caller found them already (the facts do), read for the roles.
    iterations: Option<Option<super::iterations::Iterations>>,
}

impl TraceEvidence {
    pub fn of(dev: &DeviceTimeline) -> TraceEvidence {
        let stacks = dev.events.iter().any(|e| e.action == Action::Alloc && e.stack != EMPTY_STACK);
        TraceEvidence {
            stacks,
            by_size: None,
            parameters_at_end: None,
            backward: None,
            grown: None,
            roles: None,
            iterations: None,
        }
    }

    /// With the loop's passes the caller found (from the whole trace, as [`super::iterations::find`] does).
    pub fn with_iterations(mut self, iterations: Option<&super::iterations::Iterations>) -> TraceEvidence {
        self.iterations = Some(iterations.cloned());
        self
    }

    /// Reads now what the trace allocates of each size, where a moment is likely to need it: the trace records
    /// stacks and the file holds blocks in use with none (allocated before recording began). The analysis calls
    /// this beside the replay, on a core the replay leaves idle; read at the moment, it lengthens the report by a
    /// pass over the trace. In a trace with no frame the reading needs the moment's state, and waits for it.
    pub fn with_sizes_read_ahead(mut self, tl: &Timeline, dev: &DeviceTimeline, cats: &mut CategoryCache) -> Self {
        let stackless_in_use = || {
            let mut blocks = dev.segments.iter().flat_map(|s| &s.blocks);
            blocks.any(|b| b.state == BlockState::ActiveAllocated && b.stack == EMPTY_STACK)
        };
        if self.stacks && !dev.events.is_empty() && stackless_in_use() {
            self.by_size = Some(size_evidence(tl, dev, cats, None));
        }
        self
    }

    /// What a frameless allocation at event `i` is, when it re-made an object grown by concatenation: a cache's
    /// (several growing side by side a little at a time), or an accumulator's (one growing alone, or a buffer the
    /// loop appends a batch to, each copy up to twice the last).
    fn grown(&mut self, dev: &DeviceTimeline, i: u32) -> Option<Attributed> {
        let grown = self.grown.get_or_insert_with(|| {
            let inferred =
                |category, reason| Attributed { category, source: Some(Source::Inferred), reason: Some(reason) };
            let objects = super::concatenation::of_frameless_trace(&dev.events).unwrap_or_default();
            let what = if objects.a_cache(&dev.events) {
                inferred("kv_cache", Reason::GrownSideBySide)
            } else {
                inferred("user_tensor", Reason::GrownAlone)
            };
            let mut by_event: FxHashMap<usize, Attributed> = objects.events().into_iter().map(|e| (e, what)).collect();
            for e in super::concatenation::frameless_buffers(&dev.events).into_iter().flatten() {
                by_event.entry(e).or_insert(inferred("user_tensor", Reason::GrownAlone));
            }
            by_event
        });
        grown.get(&(i as usize)).copied()
    }

    /// What a frameless allocation at event `i` was to the program's loop, read from its lifetime.
    fn role(&mut self, tl: &Timeline, dev: &DeviceTimeline, i: u32, state: &State) -> Option<super::lifetimes::Role> {
        self.roles(tl, dev, state).and_then(|r| r.of(i as usize))
    }

    /// The roles of a frameless trace's allocations; `before_trace` says whether blocks from before the trace are
    /// live (read at the first moment asked).
    fn roles(&mut self, tl: &Timeline, dev: &DeviceTimeline, state: &State) -> Option<&super::lifetimes::Roles> {
        self.roles
            .get_or_insert_with(|| {
                let iterations = match self.iterations.take() {
                    Some(it) => it,
                    None => super::iterations::find(tl, &dev.events, &[]),
                };
                let model: FxHashSet<u64> = state
                    .allocated_blocks()
                    .filter(|(_, _, b)| b.alloc_event.is_none())
                    .map(|(_, _, b)| caller_size(b))
                    .collect();
                super::lifetimes::of_frameless_trace(&dev.events, iterations.as_ref(), &model)
            })
            .as_ref()
    }

    /// Whether the job trains (see [`super::facts::shows_backward`]). Only a job that trains keeps copies of its
    /// parameters (gradients, optimizer moments); an inference trace's blocks from before it are the model.
    fn shows_backward(&mut self, dev: &DeviceTimeline, cats: &mut CategoryCache) -> bool {
        let events = &dev.events;
        *self
            .backward
            .get_or_insert_with(|| super::facts::shows_backward(events, |i| cats.of(events[i].stack) == "gradient"))
    }

    fn by_size(
        &mut self,
        tl: &Timeline,
        dev: &DeviceTimeline,
        cats: &mut CategoryCache,
        state: &State,
    ) -> &FxHashMap<u64, SizeEvidence> {
        if self.by_size.is_none() && !self.stacks {
            self.roles(tl, dev, state);
        }
        let roles = self.roles.as_ref().and_then(|r| r.as_ref());
        self.by_size.get_or_insert_with(|| size_evidence(tl, dev, cats, roles))
    }
}

/// [`attribute`] at one state, with the parameters' bytes another state showed; also says how many copies per
/// parameter this state's own blocks show, and the parameters' bytes, when they show it.
fn attribute_with(
    tl: &Timeline,
    dev: &DeviceTimeline,
    state: &State,
    labels: &FxHashMap<u64, Labels>,
    cats: &mut CategoryCache,
    trace: &mut TraceEvidence,
    parameters_elsewhere: Option<u64>,
) -> (Attribution, Option<(u64, u64)>) {
    let events = &dev.events;
    let mut out = Attribution::default();
    // Blocks no label or stack decides, by the kind of inference they need.
    let mut before_recording: Vec<(u64, u64)> = Vec::new();
    let mut backward: Vec<(u64, u64)> = Vec::new();
    let mut engine_checked: FxHashMap<StackId, bool> = FxHashMap::default();
    // In a trace with no frame, the blocks it made before the loop's passes and kept: read as those from before it.
    let mut built_first: Vec<(u64, u64)> = Vec::new();
    // In a trace with no frame, what a later pass made and kept, which its role leaves unsaid.
    let mut unsaid: Vec<(u64, u64)> = Vec::new();
    for (_, addr, b) in state.allocated_blocks() {
        let size = caller_size(b);
        let l = labels.get(&addr).copied().unwrap_or_default();
        // What a block was annotated as since its allocation says more than the label it was allocated under.
        let named = [l.annotation, l.alloc].into_iter().flatten().find_map(|s| label_category(tl.strings.get(s)));
        if let Some(c) = named {
            out.blocks.insert(addr, Attributed { category: c, source: Some(Source::Label), reason: None });
            continue;
        }
        if b.stack != EMPTY_STACK {
            let c = cats.of(b.stack);
            if c == "gradient" {
                // The autograd engine allocates an activation's gradient and a temporary as readily as a weight's
                // gradient: only AccumulateGrad's own frames settle it by stack.
                if engine_only(tl, b.stack, &mut engine_checked) {
                    backward.push((addr, size));
                    out.blocks.insert(addr, Attributed { category: c, source: Some(Source::Stack), reason: None });
                    continue;
                }
            }
            let source = (c != "unknown").then_some(Source::Stack);
            out.blocks.insert(addr, Attributed { category: c, source, reason: None });
            continue;
        }
        match b.alloc_event {
            None => before_recording.push((addr, size)),
            // An allocation the trace saw with no frame while others have them: a thread without Python frames,
            // which under stacks="python" is the autograd engine's.
            Some(_) if trace.stacks => backward.push((addr, size)),
            Some(i) => {
                if let Some(a) = trace.grown(dev, i) {
                    out.blocks.insert(addr, a);
                    continue;
                }
                match trace.role(tl, dev, i, state) {
                    None => unsaid.push((addr, size)),
                    Some(super::lifetimes::Role::BuiltFirst) => built_first.push((addr, size)),
                    Some(role) => {
                        if let Some((category, reason)) = of_role(role) {
                            let a = Attributed { category, source: Some(Source::Inferred), reason: Some(reason) };
                            out.blocks.insert(addr, a);
                        }
                    }
                }
            }
        }
    }

    // Blocks from before recording that the trace shows transient, or kept as the trace keeps another kind, are
    // that kind; only the rest are what the model is built of, and lend their sizes to the backward's judgement.
    if !before_recording.is_empty() && !events.is_empty() {
        let engine: FxHashSet<u64> = backward.iter().map(|&(a, _)| a).collect();
        before_recording = like_the_trace(
            &mut out,
            state,
            before_recording,
            &engine,
            trace.by_size(tl, dev, cats, state),
            events.len(),
        );
    }
    let made_in_trace: FxHashSet<u64> = built_first.iter().map(|&(a, _)| a).collect();
    before_recording.extend(built_first);

    // Sizes a parameter has: known parameters, and the blocks kept from before recording (parameters and their
    // copies), and what a stack calls optimizer state (each moment has its parameter's size).
    let mut parameter_sized: FxHashSet<u64> = FxHashSet::default();
    for (_, addr, b) in state.allocated_blocks() {
        let a = out.of(addr);
        if matches!(a.category, "parameter" | "optimizer_state") && a.source.is_some() {
            parameter_sized.insert(caller_size(b));
        }
    }
    parameter_sized.extend(before_recording.iter().map(|&(_, s)| s));

    for &(addr, size) in &backward {
        let prior = out.blocks.get(&addr).copied();
        let (category, reason) = if parameter_sized.is_empty() {
            // Nothing says which sizes are parameters: keep what the stack said (a gradient), or say nothing.
            match prior {
                Some(p) => (p.category, None),
                None => ("unknown", None),
            }
        } else if parameter_sized.contains(&size) {
            ("gradient", Some(Reason::BackwardParameterSized))
        } else {
            ("activation", Some(Reason::BackwardNotParameterSized))
        };
        let source = match prior {
            Some(p) if p.source == Some(Source::Stack) => Some(Source::Stack),
            _ if category == "unknown" => None,
            _ => Some(Source::Inferred),
        };
        out.blocks.insert(addr, Attributed { category, source, reason });
    }

    if before_recording.is_empty() {
        return (out, None);
    }
    let counts: FxHashMap<u64, (u32, u32)> = if events.is_empty() {
        FxHashMap::default()
    } else {
        let by_size = trace.by_size(tl, dev, cats, state);
        by_size.iter().map(|(&size, ev)| (size, (ev.freed_from_before_after_step, ev.gradients_at_most))).collect()
    };
    // Copies are read from how the counts divide in a state-only dump, a trace that shows the job training, and a
    // trace with no frame at all, which cannot show it (the counts must still leave a layered model behind).
    let counts_say_copies = events.is_empty() || !trace.stacks || trace.shows_backward(dev, cats);
    let roles = roles_before_recording(
        &mut out,
        state,
        &before_recording,
        &counts,
        events.is_empty(),
        counts_say_copies,
        parameters_elsewhere,
    );
    for addr in made_in_trace {
        if let Some(a) = out.blocks.get_mut(&addr) {
            if a.reason.is_some() {
                a.reason = Some(Reason::BuiltBeforeTheLoop);
            }
        }
    }
    gradients_kept_by_a_later_step(&mut out, &before_recording, unsaid);
    (out, roles)
}

/// In a trace with no frame whose blocks kept from before it show an optimizer's copies (the job trains), what a
/// later step made and kept with a weight's size is that step's gradients, kept until the next `zero_grad`: at most
/// one per parameter of its size.
fn gradients_kept_by_a_later_step(out: &mut Attribution, kept: &[(u64, u64)], unsaid: Vec<(u64, u64)>) {
    if unsaid.is_empty() {
        return;
    }
    let mut parameters: FxHashMap<u64, u32> = FxHashMap::default();
    let mut copies = false;
    for &(addr, size) in kept {
        match out.of(addr).category {
            "parameter" => *parameters.entry(size).or_default() += 1,
            "optimizer_state" => copies = true,
            _ => {}
        }
    }
    if !copies {
        return;
    }
    for (addr, size) in unsaid {
        if let Some(n) = parameters.get_mut(&size).filter(|n| **n > 0) {
            *n -= 1;
            let a = Attributed {
                category: "gradient",
                source: Some(Source::Inferred),
                reason: Some(Reason::KeptByALaterStep),
            };
            out.blocks.insert(addr, a);
        }
    }
}

/// The category and reason a frameless allocation's role in the loop gives it; `None` for what was built first,
/// whose kind (parameter, gradient, optimizer state) is read as the blocks from before a trace are.
fn of_role(role: super::lifetimes::Role) -> Option<(&'static str, Reason)> {
    use super::lifetimes::Role;
    match role {
        Role::BuiltFirst => None,
        Role::Transient => Some(("activation", Reason::MadeByAPass)),
        Role::KeptWithItsPass => Some(("activation", Reason::KeptWithItsPass)),
        Role::OutputKept => Some(("activation", Reason::PassOutputKept)),
        Role::CopyKept => Some(("user_tensor", Reason::PassCopyKept)),
    }
}

/// What the trace allocates of each size: how many allocations its stacks call a parameter's kind (parameter,
/// AccumulateGrad's gradient, optimizer state), and how many of every other category the trace still holds
/// at its end, by stack.
#[derive(Default)]
struct SizeEvidence {
    parameter_kind: u32,
    /// Allocations of another category that the trace keeps to its end: a block from before recording is like
    /// them only where they are kept as it is (the same activation of every layer, saved for the backward); a size
    /// the trace allocates and frees again and again says nothing of a block kept all along.
    kept_other: FxHashMap<&'static str, u32>,
    /// Blocks of this size allocated before the trace and freed in it: not kept as a parameter is.
    freed_from_before: u32,
    /// Where the first and the last of those frees happened, by event.
    first_freed_from_before: usize,
    last_freed_from_before: usize,
    /// Those frees made after the trace's last new optimizer state: `zero_grad` setting the gradients to None.
    freed_from_before_after_step: u32,
    /// The most blocks of this size the backward (AccumulateGrad, or a frameless allocation: under
    /// stacks="python" the only trace of a gradient) held at once before the optimizer's last step: a whole
    /// backward makes one gradient per parameter, so this counts the parameters of this size (a frameless
    /// temporary of the same size may add one).
    gradients_at_most: u32,
    /// The category the trace allocates this size as most often, of those not a parameter's kind.
    most_other: Option<&'static str>,
    /// In a trace with no frame, its own allocations of this size still live at its end that no role named: kept
    /// as the blocks from before it may be, which their frees alone then do not make transient.
    kept_unnamed: u32,
}

/// `frameless`: in a trace with no frame, what each allocation was to the loop, which says its kind as a stack would.
fn size_evidence(
    tl: &Timeline,
    dev: &DeviceTimeline,
    cats: &mut CategoryCache,
    frameless: Option<&super::lifetimes::Roles>,
) -> FxHashMap<u64, SizeEvidence> {
    let mut by_size: FxHashMap<u64, SizeEvidence> = FxHashMap::default();
    let mut other: FxHashMap<u64, FxHashMap<&'static str, u32>> = FxHashMap::default();
    // Blocks of another kind than a parameter's that the trace allocated and has not freed yet.
    let mut held: FxHashMap<u64, (u64, &'static str)> = FxHashMap::default();
    let mut seen_alloc: FxHashSet<u64> = FxHashSet::default();
    let mut engine_checked: FxHashMap<StackId, bool> = FxHashMap::default();
    let mut last_optimizer_state: Option<usize> = None;
    let mut freed_from_before: Vec<(usize, u64)> = Vec::new();
    let mut gradient_like: FxHashMap<u64, u64> = FxHashMap::default();
    let mut gradients_live: FxHashMap<u64, u32> = FxHashMap::default();
    // Each size's record counts of live gradients, with the event that set them (rising in both).
    let mut gradient_records: FxHashMap<u64, Vec<(usize, u32)>> = FxHashMap::default();
    for (i, e) in dev.events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                seen_alloc.insert(e.addr);
                // Only what pass after pass keeps says how blocks of its size from before the trace were kept.
                let kept = frameless.and_then(|r| r.of(i)).filter(|r| r.kept_from_pass_to_pass());
                let by_role = kept.and_then(of_role);
                if let Some((c, _)) = by_role.filter(|_| e.stack == EMPTY_STACK) {
                    *other.entry(e.size).or_default().entry(c).or_default() += 1;
                    held.insert(e.addr, (e.size, c));
                    continue;
                }
                // The engine's allocations outside AccumulateGrad (and, under stacks="python", all of its
                // allocations, which have no frame) are as often an activation's gradient or a temporary as a
                // weight's gradient: they say nothing of whether the size is a parameter's.
                let c = if e.stack == EMPTY_STACK { "gradient" } else { cats.of(e.stack) };
                let engine_only = c == "gradient" && engine_only(tl, e.stack, &mut engine_checked);
                if c == "gradient" && !engine_only {
                    gradient_like.insert(e.addr, e.size);
                    let live = gradients_live.entry(e.size).or_default();
                    *live += 1;
                    let records = gradient_records.entry(e.size).or_default();
                    if records.last().is_none_or(|&(_, n)| *live > n) {
                        records.push((i, *live));
                    }
                }
                if e.stack == EMPTY_STACK && frameless.is_some_and(|r| r.live_at_end(i)) {
                    by_size.entry(e.size).or_default().kept_unnamed += 1;
                }
                if e.stack == EMPTY_STACK || engine_only {
                    continue;
                }
                if c == "optimizer_state" {
                    last_optimizer_state = Some(i);
                }
                if ROLES.contains(&c) {
                    by_size.entry(e.size).or_default().parameter_kind += 1;
                } else {
                    *other.entry(e.size).or_default().entry(c).or_default() += 1;
                    held.insert(e.addr, (e.size, c));
                }
            }
            // The request that ran out is an allocation the program tried: its stack says what the program
            // makes of its size (where a trace holds nothing but frees and the OOM, all it says of the program).
            Action::Oom if e.stack != EMPTY_STACK => {
                let c = cats.of(e.stack);
                if !ROLES.contains(&c) {
                    *other.entry(e.size).or_default().entry(c).or_default() += 1;
                }
            }
            Action::FreeRequested if !seen_alloc.contains(&e.addr) => {
                let ev = by_size.entry(e.size).or_default();
                if ev.freed_from_before == 0 {
                    ev.first_freed_from_before = i;
                }
                ev.freed_from_before += 1;
                ev.last_freed_from_before = i;
                freed_from_before.push((i, e.size));
            }
            Action::FreeRequested => {
                held.remove(&e.addr);
                if let Some(size) = gradient_like.remove(&e.addr) {
                    if let Some(live) = gradients_live.get_mut(&size) {
                        *live = live.saturating_sub(1);
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(step) = last_optimizer_state {
        for (_, size) in freed_from_before.into_iter().filter(|&(i, _)| i > step) {
            by_size.entry(size).or_default().freed_from_before_after_step += 1;
        }
    }
    // The gradients counted are every parameter's only where the optimizer stepped after them: a backward cut short
    // by the OOM or the trace's end made some, and may have gone higher with its temporaries. Where recording began
    // inside the backward, the gradients it made before are the blocks from before the trace let go after the step
    // (zero_grad): live all along until then, they were held beside those the trace saw.
    if let Some(step) = last_optimizer_state {
        for (size, records) in gradient_records {
            if let Some(&(_, n)) = records.iter().rev().find(|&&(when, _)| when < step) {
                let ev = by_size.entry(size).or_default();
                ev.gradients_at_most = n + ev.freed_from_before_after_step;
            }
        }
    }
    // A CUDA graph's private pool holds the graph's own buffers, whatever their size: what is kept there says
    // nothing of a block the job keeps in the default pool.
    let mut private: Vec<(u64, u64)> =
        dev.segments.iter().filter(|s| s.pool_id != (0, 0)).map(|s| (s.address, s.address + s.total_size)).collect();
    private.sort_unstable();
    let in_private = |addr: u64| {
        let i = private.partition_point(|&(start, _)| start <= addr);
        i > 0 && addr < private[i - 1].1
    };
    for (addr, (size, c)) in held {
        if !in_private(addr) {
            *by_size.entry(size).or_default().kept_other.entry(c).or_default() += 1;
        }
    }
    for (size, counts) in other {
        by_size.entry(size).or_default().most_other = most_common(&counts).map(|(c, _)| c);
    }
    by_size
}

/// The category a label names, when one of its words names one: `optimizer` (component tracking's name for
/// `optimizer.step`), `saved_for_backward` (a tensor the autograd graph keeps), `gradient`, `kv_cache`. A module's
/// name (`model.layers.17.mlp`) says where in the model, not what for: the stack or the inference decides that.
pub fn label_category(label: &str) -> Option<&'static str> {
    let lower = label.to_ascii_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let has = |w: &[&str]| words.iter().any(|x| w.contains(x));
    if has(&["optimizer", "optim"]) {
        Some("optimizer_state")
    } else if has(&["kv", "kvcache", "past"]) && has(&["cache", "kv", "kvcache"]) {
        Some("kv_cache")
    } else if has(&["grad", "grads", "gradient", "gradients"]) {
        Some("gradient")
    } else if has(&["saved", "activation", "activations"]) {
        Some("activation")
    } else if has(&["parameter", "parameters", "param", "params", "weight", "weights"]) {
        Some("parameter")
    } else {
        None
    }
}

/// Where in the model and the step a label puts a block: the module's name, and `forward` or `backward` when the
/// label or the block's origin says which.
pub fn module_and_phase(label: &str, attributed: Attributed) -> (String, Option<&'static str>) {
    let lower = label.to_ascii_lowercase();
    let phase = if lower.contains("backward") && !lower.contains("saved_for_backward") {
        Some("backward")
    } else if lower.contains("forward")
        || (attributed.category == "activation"
            && !matches!(attributed.reason, Some(Reason::BackwardNotParameterSized)))
    {
        Some("forward")
    } else if matches!(attributed.reason, Some(Reason::BackwardParameterSized | Reason::BackwardNotParameterSized))
        || attributed.category == "gradient"
    {
        Some("backward")
    } else {
        None
    };
    (label.to_string(), phase)
}

/// The size the caller asked for, which is what repeats between a parameter and its copies (the block's own size
/// may carry a split remainder); the block's size where the file does not say.
fn caller_size(b: &LiveBlock) -> u64 {
    if b.requested > 0 {
        b.requested
    } else {
        b.size
    }
}

/// The kind of the `i`th of `of` blocks shared among `counts`' kinds in their proportion, the larger kinds first: the
/// kind whose cumulative share covers the block's middle, (i + ½) / of.
fn share_of(counts: &FxHashMap<&'static str, u32>, i: u32, of: u32) -> Option<&'static str> {
    let mut kinds: Vec<(&'static str, u32)> = counts.iter().map(|(&c, &n)| (c, n)).collect();
    kinds.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let total: u64 = kinds.iter().map(|k| u64::from(k.1)).sum();
    let middle = (2 * u64::from(i) + 1) * total;
    let mut cumulative = 0u64;
    kinds
        .into_iter()
        .find(|&(_, n)| {
            cumulative += u64::from(n);
            middle < 2 * cumulative * u64::from(of.max(1))
        })
        .map(|k| k.0)
}

/// The category counted most often (ties to the first by name), and its count.
fn most_common(counts: &FxHashMap<&'static str, u32>) -> Option<(&'static str, u32)> {
    counts.iter().max_by_key(|(c, n)| (**n, std::cmp::Reverse(**c))).map(|(c, n)| (*c, *n))
}

/// Whether a stack the categories call a gradient is only the autograd engine's (no AccumulateGrad frame): as often
/// an activation's gradient or a temporary as a weight's gradient. Frameless stacks are judged by the caller.
fn engine_only(tl: &Timeline, stack: StackId, checked: &mut FxHashMap<StackId, bool>) -> bool {
    stack != EMPTY_STACK && !*checked.entry(stack).or_insert_with(|| accumulates_grad(tl, stack))
}

fn accumulates_grad(tl: &Timeline, stack: StackId) -> bool {
    tl.stacks.stack(stack).iter().any(|&f| {
        let name = tl.strings.get(tl.stacks.frame(f).name);
        name.contains("AccumulateGrad") || name.contains("accumulate_grad")
    })
}

/// The blocks from before recording whose size the trace shows as another kind than the model's: the trace was still
/// freeing others of their size from before recording when it ended (transient: the backward consumes what the
/// forward saved), or it allocates their size as another category and keeps those as these are kept. Attributes
/// those, leaves unknown a lone block (the only one of a size the trace never made) among blocks built in layers,
/// and returns the rest. A size a label or stack (not the engine's, whose blocks `engine` holds) shows as a
/// parameter's kind is kept.
fn like_the_trace(
    out: &mut Attribution,
    state: &State,
    blocks: Vec<(u64, u64)>,
    engine: &FxHashSet<u64>,
    evidence: &FxHashMap<u64, SizeEvidence>,
    events: usize,
) -> Vec<(u64, u64)> {
    // What the trace's own allocations are, by their stacks, most often (a size's vote each), other than a
    // parameter's kind: a model's activations, or, in a program that runs none, its own tensors.
    let mut votes: FxHashMap<&'static str, u32> = FxHashMap::default();
    for c in evidence.values().filter_map(|ev| ev.most_other).filter(|c| *c != "unknown") {
        *votes.entry(c).or_default() += 1;
    }
    let transient_kind = most_common(&votes).map_or("activation", |(c, _)| c);
    let mut known_kind: FxHashSet<u64> = FxHashSet::default();
    for (_, addr, b) in state.allocated_blocks() {
        let a = out.of(addr);
        if ROLES.contains(&a.category) && a.source.is_some() && !engine.contains(&addr) {
            known_kind.insert(caller_size(b));
        }
    }
    let mut live_sizes: FxHashMap<u64, u32> = FxHashMap::default();
    for (_, _, b) in state.allocated_blocks() {
        *live_sizes.entry(caller_size(b)).or_default() += 1;
    }
    let mut held_from_before: FxHashMap<u64, u32> = FxHashMap::default();
    for &(_, size) in &blocks {
        *held_from_before.entry(size).or_default() += 1;
    }
    // Whether what was kept from before recording is built in layers (most of its bytes in sizes held more than
    // once): a model of one layer has nothing but lone sizes, and those are its weights.
    let kept: u64 = blocks.iter().map(|&(_, s)| s).sum();
    let repeated: u64 = blocks.iter().filter(|&&(_, s)| held_from_before[&s] > 1).map(|&(_, s)| s).sum();
    let layered = repeated * 2 > kept;
    let mut rest = Vec::with_capacity(blocks.len());
    let mut nth_of_size: FxHashMap<u64, u32> = FxHashMap::default();
    for (addr, size) in blocks {
        // The only block of its size, among those kept from before and those live.
        let lone = held_from_before[&size] == 1 && live_sizes.get(&size) == Some(&1);
        let Some(ev) = evidence.get(&size).filter(|_| !known_kind.contains(&size)) else {
            // One block of a size nothing else has, that the trace never made: a model's weights come in layers
            // and copies, so this lone one may as well be the data, the logits or an embedding. Not a guess.
            if layered && lone && !evidence.contains_key(&size) {
                continue;
            }
            rest.push((addr, size));
            continue;
        };
        // The trace was still freeing others of its size made before it when it ended (it ended sooner after the
        // last of those frees than the frees took): the size is transient, as what the model is built of is not,
        // and what the trace allocates its size as says what for. Frees made only as the trace began (the last
        // tensors of a step, a model deleted) say nothing of the blocks the trace kept all along.
        let span = ev.last_freed_from_before.saturating_sub(ev.first_freed_from_before);
        let after = events.saturating_sub(ev.last_freed_from_before + 1);
        let still_freeing = ev.freed_from_before >= 2 && after <= span;
        if ev.parameter_kind == 0 && ev.kept_unnamed == 0 && still_freeing {
            // Where the trace allocates no block of its size, being let go of says it was transient, and the
            // trace's other allocations what the program's transient tensors are: a model's activations (the
            // forward's saved tensors a backward consumes), or, in a script that runs no model, its own.
            let category = ev.most_other.filter(|c| *c != "unknown").unwrap_or(transient_kind);
            let a = Attributed { category, source: Some(Source::Inferred), reason: Some(Reason::FreedLikeIt) };
            out.blocks.insert(addr, a);
            continue;
        }
        let (other, n) = most_common(&ev.kept_other).unwrap_or(("", 0));
        if n > ev.parameter_kind {
            // Kept as several kinds (a loop that keeps its outputs and a copy of them, of one size), those from
            // before were kept as the trace keeps them: shared in its proportion, the larger kinds first, so the
            // bytes of each kind come out as the trace's mix says, where naming them all after the commonest would
            // put every other kind's bytes in it.
            let nth = nth_of_size.entry(size).or_default();
            let category = share_of(&ev.kept_other, *nth, held_from_before[&size]).unwrap_or(other);
            *nth += 1;
            let several = ev.kept_other.len() > 1;
            let (source, reason) = match category {
                "unknown" => (None, None),
                _ if several => (Some(Source::Inferred), Some(Reason::SizeKeptAsSeveralKinds)),
                _ => (Some(Source::Inferred), Some(Reason::SizeAllocatedInTrace)),
            };
            out.blocks.insert(addr, Attributed { category, source, reason });
            continue;
        }
        // Alone of its size, and a size the trace makes only as another kind, never a parameter's: the step's own
        // tensor from before the cut (an intermediate, a batch), not a weight. (Weights that share a size with the
        // trace's temporaries come many of a size, a layer's each, and are not judged here.)
        if let Some(category) = ev.most_other.filter(|c| lone && ev.parameter_kind == 0 && *c != "unknown") {
            let a =
                Attributed { category, source: Some(Source::Inferred), reason: Some(Reason::LoneSizeOfAnotherKind) };
            out.blocks.insert(addr, a);
            continue;
        }
        rest.push((addr, size));
    }
    rest
}

/// The blocks kept from before recording, by size: each parameter's size occurs once per copy the job keeps of it
/// (its gradient, each optimizer moment). The copies per parameter are read from the sizes where the parameters'
/// count is known (a gradient or optimizer state the trace saw, or a parameter's stack; one optimizer line's
/// moments; the most gradients the backward held before a step), else from how the counts divide; the first copy
/// of each size is the parameter, then the gradient where gradients are kept, then the optimizer's moments.
fn roles_before_recording(
    out: &mut Attribution,
    state: &State,
    blocks: &[(u64, u64)],
    trace_counts: &FxHashMap<u64, (u32, u32)>,
    state_only: bool,
    counts_say_copies: bool,
    parameters_elsewhere: Option<u64>,
) -> Option<(u64, u64)> {
    if blocks.is_empty() {
        return None;
    }
    // Known roles per size, from the live blocks a label, stack or the backward decided.
    let mut known: FxHashMap<u64, [u64; 3]> = FxHashMap::default();
    // The optimizer creates each moment of a parameter on its own line (`exp_avg`, then `exp_avg_sq`): the blocks
    // one line made of a size count that size's parameters, where no parameter or gradient of it is known.
    let mut per_moment_line: FxHashMap<(u64, StackId), u64> = FxHashMap::default();
    for (_, addr, b) in state.allocated_blocks() {
        let a = out.of(addr);
        if let Some(r) = ROLES.iter().position(|c| *c == a.category) {
            if a.source.is_some() {
                known.entry(caller_size(b)).or_default()[r] += 1;
                if r == 2 && a.source == Some(Source::Stack) {
                    *per_moment_line.entry((caller_size(b), b.stack)).or_default() += 1;
                }
            }
        }
    }
    // Per size: the most blocks one moment's line made, and how many lines made them.
    let mut params_by_moments: FxHashMap<u64, (u64, u64)> = FxHashMap::default();
    for ((size, _), n) in per_moment_line {
        let p = params_by_moments.entry(size).or_default();
        *p = (p.0.max(n), p.1 + 1);
    }
    // The moments of each parameter of a size, where two lines or more made them: (blocks one line made, lines).
    // One line making every moment (a loop over the state's names) counts them all, not the parameters.
    let moment_lines = |size: u64, k: &[u64; 3]| -> Option<(u64, u64)> {
        params_by_moments.get(&size).copied().filter(|&(per_line, lines)| lines >= 2 && per_line < k[2])
    };
    let known_params =
        |size: u64, k: &[u64; 3]| -> u64 { k[0].max(k[1]).max(moment_lines(size, k).map_or(0, |m| m.0)) };
    let mut by_size: FxHashMap<u64, Vec<u64>> = FxHashMap::default();
    for &(addr, size) in blocks {
        by_size.entry(size).or_default().push(addr);
    }
    if by_size.is_empty() {
        return None;
    }
    let gradients_seen = known.values().any(|k| k[1] > 0);
    // Copies per parameter (roles), by bytes: from the sizes whose parameter count is known.
    let mut votes: FxHashMap<u64, u64> = FxHashMap::default();
    for (&size, addrs) in &by_size {
        let k = &known.get(&size).copied().unwrap_or_default();
        let params = known_params(size, k);
        // Only a gradient or an optimizer moment shows that copies exist: parameters alone (some loaded with a
        // stack, the rest before recording) say nothing of how many copies each has.
        if params == 0 || k[1] + k[2] == 0 {
            // Where nothing live shows them, the backward's gradients do: it held as many of the size at most as
            // there are parameters of it.
            let gradients = trace_counts.get(&size).map_or(0, |c| c.1) as u64;
            if gradients > 0 && k[1] + k[2] == 0 {
                let total = addrs.len() as u64 + k[0];
                let roles = ((total as f64 / gradients.max(k[0]) as f64).round() as u64).clamp(1, 4);
                *votes.entry(roles).or_default() += size * addrs.len() as u64;
            }
            continue;
        }
        let total = addrs.len() as u64 + k[0] + k[1] + k[2];
        let roles = match moment_lines(size, k) {
            // The optimizer's lines say how many moments each parameter has; the gradient is kept unless the
            // trace freed this size's blocks from before it once the optimizer had made its state (zero_grad
            // setting them to None) and none is live.
            // Where the trace made every moment, the parameters are as many as one line made.
            Some((per_line, lines)) => {
                let base = 1 + lines;
                let exact = [1, 0].into_iter().find(|g| total == per_line * (base + g));
                let freed = trace_counts.get(&size).map_or(0, |c| c.0);
                let g = exact.unwrap_or(if k[1] > 0 || freed == 0 { 1 } else { 0 });
                (base + g).clamp(1, 4)
            }
            _ => ((total as f64 / params as f64).round() as u64).clamp(1, 4),
        };
        *votes.entry(roles).or_default() += size * addrs.len() as u64;
    }
    // Evidence from a few sizes does not speak for the rest: it must cover a quarter of these bytes.
    let all_bytes: u64 = by_size.iter().map(|(s, a)| s * a.len() as u64).sum();
    let voted: u64 = votes.values().sum();
    let evidenced = votes
        .into_iter()
        .max_by_key(|&(r, b)| (b, std::cmp::Reverse(r)))
        .map(|(r, _)| r)
        .filter(|_| voted * 4 >= all_bytes);
    // Without a size whose parameters the trace shows, copies are read from the counts alone only in a state-only
    // dump or a trace that shows the job training: an inference trace's blocks kept from before it began are the
    // model, whose per-layer counts divide by 3 or 4 as readily as copies do.
    // Where this moment shows no copies, the parameters' bytes another moment showed do: what is kept from before
    // recording, divided by them, is the copies kept now (a gradient set to None since is not among them).
    let evidenced = evidenced.or_else(|| {
        parameters_elsewhere.filter(|&p| p > 0).map(|p| ((all_bytes as f64 / p as f64).round() as u64).clamp(1, 4))
    });
    let roles = evidenced.unwrap_or_else(|| if counts_say_copies { copies_from_counts(&by_size) } else { 1 });
    // A state-only dump has no lifetimes: without sizes that repeat as a parameter's copies do, nothing is known.
    if state_only && evidenced.is_none() && roles == 1 {
        return None;
    }
    let reason_first = if state_only { Reason::StateKept } else { Reason::BuiltBeforeRecording };
    let reason_copy = if state_only { Reason::StateSizesRepeat } else { Reason::RepeatsParameterSizes };
    let mut parameter_bytes: u64 = known.iter().map(|(size, k)| size * k[0]).sum();
    let mut sizes: Vec<u64> = by_size.keys().copied().collect();
    sizes.sort_unstable();
    for size in sizes {
        let mut addrs = by_size.remove(&size).unwrap_or_default();
        addrs.sort_unstable();
        let k = known.get(&size).copied().unwrap_or_default();
        let total = addrs.len() as u64 + k[0] + k[1] + k[2];
        if state_only && evidenced.is_none() && !total.is_multiple_of(roles) {
            // Not one of the repeating sizes: a state dump says nothing more of it.
            continue;
        }
        // Known gradients undercount the parameters where recording began inside the backward.
        let params = total.div_ceil(roles).max(k[0]).max(known_params(size, &k));
        // The roles this size has, one slot per copy: parameters, then gradients (kept where the job keeps them:
        // two copies, or four with two moments), then optimizer moments.
        let with_grad = match roles {
            2 => !gradients_seen || k[1] > 0,
            4 => true,
            _ => k[1] > 0,
        };
        let mut need = [
            params.saturating_sub(k[0]),
            if with_grad { params.saturating_sub(k[1]) } else { 0 },
            (params * roles).saturating_sub(params + if with_grad { params } else { 0 }).saturating_sub(k[2]),
        ];
        for addr in addrs {
            let role = need.iter().position(|&n| n > 0).unwrap_or(0);
            need[role] = need[role].saturating_sub(1);
            let reason = if role == 0 { reason_first } else { reason_copy };
            if role == 0 {
                parameter_bytes += size;
            }
            out.blocks.insert(
                addr,
                Attributed { category: ROLES[role], source: Some(Source::Inferred), reason: Some(reason) },
            );
        }
    }
    evidenced.map(|r| (r, parameter_bytes))
}

/// Copies kept per parameter, read from the counts alone: the sizes that hold the memory (each at least 1% of it)
/// repeat once per layer and per copy, so their counts share the copies as a factor; one large tensor of its own
/// size (an embedding without its copies, an activation) says there are none. A
/// factor of 2 is as often an even number of layers or an untied embedding as a gradient, so only 3 (two optimizer
/// moments, or a gradient and one) and 4 (a gradient and two moments) count.
///
/// A transformer's counts divide by 4 without any copy (4 projections a layer, 8 or 32 layers; a forward's
/// activations, 10 a layer), so the factor must leave a model behind: one copy's counts are its layers' (each size
/// a weight of every layer, or the embedding and the head), and those that repeat share the number of layers.
/// Activations read as copies leave none (20, 7, 6 and 8 a copy), nor do a few large tensors (4 and 4: one a copy).
fn copies_from_counts(by_size: &FxHashMap<u64, Vec<u64>>) -> u64 {
    let total: u64 = by_size.iter().map(|(s, a)| s * a.len() as u64).sum();
    let counts: Vec<u64> =
        by_size.iter().filter(|(s, a)| (*s * a.len() as u64) * 100 >= total).map(|(_, a)| a.len() as u64).collect();
    if counts.len() < 2 {
        return 1;
    }
    let g = counts.iter().fold(0, |g, &c| gcd(g, c));
    let leaves_layers = |k: u64| {
        let repeated: Vec<u64> = counts.iter().map(|c| c / k).filter(|&n| n >= 2).collect();
        repeated.len() >= 2 && repeated.iter().fold(0, |g, &c| gcd(g, c)) >= 2
    };
    [4, 3].into_iter().find(|&k| g.is_multiple_of(k) && leaves_layers(k)).unwrap_or(1)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_kept_as_several_kinds_are_shared_in_the_traces_proportion() {
        let counts: FxHashMap<&'static str, u32> = [("activation", 1032), ("user_tensor", 86)].into_iter().collect();
        let kinds: Vec<&str> = (0..342 + 4098).map(|i| share_of(&counts, i, 342 + 4098).unwrap()).collect();
        let users = kinds.iter().filter(|&&k| k == "user_tensor").count();
        // 86 of 1,118 kept: 7.7% of the 4,440 blocks from before, the larger kind first.
        assert_eq!(users, 342);
        assert_eq!(kinds[0], "activation");
        assert_eq!(kinds[4439], "user_tensor");
        let one: FxHashMap<&'static str, u32> = [("activation", 5)].into_iter().collect();
        assert!((0..7).all(|i| share_of(&one, i, 7) == Some("activation")));
    }
}
