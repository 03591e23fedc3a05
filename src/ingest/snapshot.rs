//! PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`), every known shape from 1.13 to 2.15.
//!
//! Frames, stacks and trace entries are converted while the pickle streams in (see [`SnapshotBuilder`]); the
//! small rest (segments, settings, annotations) is decoded from the generic values afterwards.

use std::io::Read;

use super::pickle::{self, dict_get, holds_gap, Builder, Value, GAP};
use super::snapshot_keys::{intern_keys, k, KeySet};
use crate::timeline::stacks::{Frame, FrameId, StackId, Stacks, StrId, Strings, EMPTY_STACK};
use crate::timeline::Backend;
use crate::timeline::{
    Action, AllocatorSettings, Annotation, Block, BlockState, CaptureInfo, DeviceTimeline, Event, EventAttrTable,
    EventAttrs, PoolKind, ReadRoutes, Segment, Timeline, NO_STR,
};

const FRAME: u8 = 1;
const STACK: u8 = 2;
const TRACE: u8 = 3;

fn action_of(id: StrId) -> Action {
    match id {
        k::A_ALLOC => Action::Alloc,
        k::A_FREE_REQUESTED => Action::FreeRequested,
        k::A_FREE_COMPLETED => Action::FreeCompleted,
        k::A_SEGMENT_ALLOC => Action::SegmentAlloc,
        k::A_SEGMENT_FREE => Action::SegmentFree,
        k::A_SEGMENT_MAP => Action::SegmentMap,
        k::A_SEGMENT_UNMAP => Action::SegmentUnmap,
        k::A_SNAPSHOT => Action::Snapshot,
        k::A_OOM => Action::Oom,
        k::A_ANNOTATE => Action::Annotate,
        k::A_WORKSPACE_SNAPSHOT => Action::WorkspaceSnapshot,
        _ => Action::Unknown,
    }
}

/// Turns frame dicts into interned frames, frame lists into interned stacks and trace-entry dicts into
/// [`Event`]s as the pickle streams in.
struct SnapshotBuilder {
    cx: EntryCx,
    events: Vec<Event>,
    /// Shared by every device's events while reading; each device gets a copy.
    event_attrs: EventAttrTable,
    /// The last event is a trace entry still being streamed field by field (see [`Builder::record_begin`]),
    /// written in place. It is dropped if the record is given up: before anything else is pushed, or at the end.
    open: bool,
    rec_attrs: EventAttrs,
    /// The keys seen before the open record began: what a given-up record must not leave behind.
    seen_before: KeySet,
    /// The id of `events[0]`: 0, or on a fork the records read before it.
    first_event: u32,
    /// On a fork (a helper reading a later part of the trace): what it started from, and what it has kept.
    fork: Option<Fork>,
    /// Trace entries the generic pickle machine handed over whole (neither fast route could read them).
    generic: u64,
}

/// A fork's bounds: it may make nothing that the builder it came from could make meanwhile.
struct Fork {
    /// The sizes of the interned tables when it began: a batch that grew any of them made something the main
    /// builder may have made meanwhile under another id, and is not kept.
    tables: [usize; 3],
    kept_events: usize,
    kept_seen: KeySet,
    kept_generic: u64,
}

/// The stack of an event on a fork whose frames are a list the fork cannot see, in memo slot `stack & !DEFERRED`.
const DEFERRED: StackId = 1 << 31;

/// What decoding a trace entry's fields needs besides the entry itself.
struct EntryCx {
    stacks: Stacks,
    frame_buf: Vec<u32>,
    seen: KeySet,
    /// On a fork: frames in a memo slot it cannot see are deferred, not refused.
    defer: bool,
}

fn want_u64(v: &Value, key: &str, what: &str) -> Result<u64, String> {
    v.as_u64().ok_or_else(|| format!("{what}: '{key}' is {}, expected a non-negative int", v.type_name()))
}

const W: &str = "trace entry";

impl EntryCx {
    fn new() -> EntryCx {
        EntryCx { stacks: Stacks::default(), frame_buf: Vec::new(), seen: KeySet::default(), defer: false }
    }

    /// Puts one trace-entry field into `e` and `a`: the one decoder of both the streamed and the collected path.
    #[inline(always)]
    fn field(&mut self, e: &mut Event, a: &mut EventAttrs, key: StrId, v: &Value) -> Result<(), String> {
        // The keys that date the file or name its dialect are marked in their arms, with a constant: marking every
        // field (a variable shift of a u128) cost 3% of a million-entry read.
        match key {
            k::ACTION => {
                let s = v.as_str_id().ok_or_else(|| format!("{W}: 'action' is {}, expected a str", v.type_name()))?;
                e.action = action_of(s);
                if matches!(e.action, Action::Annotate | Action::WorkspaceSnapshot) {
                    self.seen.insert(s);
                }
            }
            k::ADDR => e.addr = want_u64(v, "addr", W)?,
            k::SIZE => e.size = want_u64(v, "size", W)?,
            // A stream is a raw pointer; a negative value (never seen) is kept as its bit pattern.
            k::STREAM => {
                a.stream = v
                    .as_u64()
                    .or_else(|| v.as_i64().map(|i| i as u64))
                    .ok_or_else(|| format!("{W}: 'stream' is {}, expected an int", v.type_name()))?
            }
            k::DEVICE_FREE => a.set_device_free(want_u64(v, "device_free", W)?),
            k::TIME_US => {
                let t = v.as_i64().ok_or_else(|| format!("{W}: 'time_us' is {}, expected an int", v.type_name()))?;
                e.set_time_us(t);
                self.seen.insert(k::TIME_US);
            }
            k::FRAMES => {
                let stacks = &mut self.stacks;
                e.stack = match stack_of(&mut self.frame_buf, v, |f| Some(stacks.intern_stack(f))) {
                    Some(s) => s,
                    None => self.unknown_frames(v)?,
                }
            }
            k::COMPILE_CONTEXT => {
                a.compile_context = match v.as_str_id() {
                    Some(s) => s,
                    None => self.no_str(v)?,
                };
                self.seen.insert(k::COMPILE_CONTEXT);
            }
            k::USER_METADATA => {
                a.user_metadata = match v.as_str_id() {
                    Some(s) => s,
                    None => self.no_str(v)?,
                };
                self.seen.insert(k::USER_METADATA);
            }
            k::POOL_ID => {
                match pair(v) {
                    Some(p) => a.set_pool_id(p),
                    None => _ = self.no_str(v)?,
                }
                self.seen.insert(k::POOL_ID);
            }
            // Written only when non-empty (2.15+): its presence dates the file, its value is not used.
            k::INTERNAL_METADATA => {
                self.seen.insert(k::INTERNAL_METADATA);
                self.no_str(v)?;
            }
            _ => _ = self.no_str(v)?,
        }
        Ok(())
    }

    /// A `frames` value that is no stack: an error, or on a fork a list it cannot see, deferred.
    #[cold]
    fn unknown_frames(&self, v: &Value) -> Result<StackId, String> {
        if let Value::Custom(GAP, slot) = *v {
            if self.defer && slot < DEFERRED {
                return Ok(DEFERRED | slot);
            }
        }
        let first_bad = v.list_items().and_then(|items| {
            items.iter().position(|it| !matches!(it, Value::Custom(FRAME, _))).map(|i| (i, items[i].type_name()))
        });
        Err(match first_bad {
            Some((i, t)) => format!("{W}: 'frames' item {i} is {t}, expected a frame dict"),
            None => format!("{W}: 'frames' is {}, expected a list of frames", v.type_name()),
        })
    }

    /// A value read as absent (no str, no pool id); on a fork, one it cannot see is refused instead, since what it
    /// stands for may be present.
    #[cold]
    fn no_str(&self, v: &Value) -> Result<StrId, String> {
        match self.defer && holds_gap(v) {
            true => Err(format!("{W}: a value in a part of the file not read yet")),
            false => Ok(NO_STR),
        }
    }
}

impl SnapshotBuilder {
    /// The size of every table that interns what trace entries hold (frames, stacks, the rarer attributes): a key
    /// whose values are interned in a new table must add it here, or a fork's batches that add to it are kept.
    fn interned_sizes(&self) -> [usize; 3] {
        [self.cx.stacks.frame_count(), self.cx.stacks.stack_count(), self.event_attrs.len()]
    }

    fn frame(&mut self, items: &[Value]) -> Option<Value> {
        let (mut filename, mut name, mut line) = (None, None, 0i64);
        for kv in items.chunks_exact(2) {
            let Value::Str(key) = kv[0] else { return None };
            match key {
                k::FILENAME => filename = Some(kv[1].as_str_id()?),
                k::NAME => name = Some(kv[1].as_str_id()?),
                // torch 2.11 writes synthetic frames (torch.compile's `init_gpu_context`) with line SIZE_MAX:
                // a line no source has, read as unknown (0).
                k::LINE => line = kv[1].as_i64().or_else(|| kv[1].as_u64().map(|_| 0)).unwrap_or(0),
                _ => {}
            }
            // Other keys (2.10's fx_node_* / fx_original_trace) are tolerated.
        }
        let f = Frame { filename: filename?, name: name?, line };
        Some(Value::Custom(FRAME, self.cx.stacks.intern_frame(f)))
    }

    fn trace_entry(&mut self, items: &[Value]) -> Result<Value, String> {
        self.close_open();
        self.generic += 1;
        let mut e = Event::new(Action::Unknown, 0, 0);
        let mut a = EventAttrs::default();
        for kv in items.chunks_exact(2) {
            let Value::Str(key) = kv[0] else { continue };
            self.cx.field(&mut e, &mut a, key, &kv[1])?;
        }
        self.push_event(e, a)
    }

    /// Drops a record that was begun and never ended, and what its fields said of the file.
    #[inline]
    fn close_open(&mut self) {
        if self.open {
            self.abandon_open();
        }
    }

    #[cold]
    fn abandon_open(&mut self) {
        self.open = false;
        self.events.pop();
        self.cx.seen = self.seen_before;
    }

    fn push_event(&mut self, mut e: Event, a: EventAttrs) -> Result<Value, String> {
        self.close_open();
        self.event_attrs.assign(&mut e, a).map_err(|e| e.to_string())?;
        let idx = u32::try_from(self.events.len())
            .ok()
            .and_then(|i| i.checked_add(self.first_event))
            .ok_or_else(|| "more than 4 billion trace entries".to_string())?;
        self.events.push(e);
        Ok(Value::Custom(TRACE, idx))
    }

    /// All events read, in order.
    fn take_events(&mut self) -> Vec<Event> {
        self.close_open();
        std::mem::take(&mut self.events)
    }
}

/// The stack a `frames` value stands for; `None` if it is not a list of frames. A list of frames becomes a stack
/// through `stack` (interning it, or only looking it up).
fn stack_of(frame_buf: &mut Vec<u32>, v: &Value, stack: impl FnOnce(&[FrameId]) -> Option<StackId>) -> Option<StackId> {
    match v {
        Value::Custom(STACK, id) => Some(*id),
        Value::PendingList(_) => Some(EMPTY_STACK),
        Value::List(_) | Value::Tuple(_) => {
            // A stack of a thousand frames or more arrives in several batches and stays generic until now.
            let items = v.list_items()?;
            // `frames: []` (no Python frame: the backward pass): 57% of a real training trace's allocations.
            if items.is_empty() {
                return Some(EMPTY_STACK);
            }
            frame_buf.clear();
            for it in items.iter() {
                match it {
                    Value::Custom(FRAME, f) => frame_buf.push(*f),
                    _ => return None,
                }
            }
            stack(frame_buf)
        }
        _ => None,
    }
}

fn pair(v: &Value) -> Option<(i64, i64)> {
    match v {
        Value::IntPair(a, b) => Some((*a as i64, *b as i64)),
        Value::Tuple(t) if t.items.len() == 2 => Some((t.items[0].as_i64()?, t.items[1].as_i64()?)),
        _ => None,
    }
}

/// On a fork: a dict holding a value the fork cannot see, as a key or anywhere but a trace entry's frames (which
/// are deferred), would be read as something it is not (a field skipped, a frame's line taken as 0).
fn refuse_gaps(items: &[Value]) -> Result<(), String> {
    let unseen = items.chunks(2).any(|kv| match kv {
        [key, value] => holds_gap(key) || (!matches!(key, Value::Str(k::FRAMES)) && holds_gap(value)),
        [key] => holds_gap(key),
        _ => false,
    });
    match unseen {
        true => Err("a dict holding a value in a part of the file not read yet".into()),
        false => Ok(()),
    }
}

impl Builder for SnapshotBuilder {
    fn close_dict(&mut self, _strings: &Strings, items: &[Value]) -> Result<Option<Value>, String> {
        if self.fork.is_some() {
            refuse_gaps(items)?;
        }
        // Frames start with 'filename' and trace entries with 'action' in every writer seen; look there first.
        let is = |want: StrId| {
            matches!(items.first(), Some(Value::Str(k)) if *k == want)
                || items.chunks_exact(2).any(|kv| matches!(kv[0], Value::Str(k) if k == want))
        };
        if is(k::ACTION) {
            return self.trace_entry(items).map(Some);
        }
        if is(k::FILENAME) {
            return Ok(self.frame(items));
        }
        Ok(None)
    }

    fn is_pure(&self, kind: u8) -> bool {
        kind == FRAME || kind == STACK
    }

    fn record_begin(&mut self, first_key: StrId) -> bool {
        if first_key != k::ACTION {
            return false;
        }
        self.close_open();
        self.events.push(Event::new(Action::Unknown, 0, 0));
        self.open = true;
        self.seen_before = self.cx.seen;
        self.rec_attrs = EventAttrs::default();
        true
    }

    #[inline]
    fn record_field(&mut self, key: StrId, value: &Value) -> bool {
        match self.events.last_mut() {
            Some(e) if self.open => self.cx.field(e, &mut self.rec_attrs, key, value).is_ok(),
            _ => false,
        }
    }

    fn record_end(&mut self) -> Option<Value> {
        let idx = u32::try_from((self.events.len()).checked_sub(1)?).ok()?.checked_add(self.first_event)?;
        let e = self.events.last_mut().filter(|_| self.open)?;
        self.event_attrs.assign(e, self.rec_attrs).ok()?;
        self.open = false;
        Some(Value::Custom(TRACE, idx))
    }

    fn expected_records(&self) -> usize {
        self.events.capacity()
    }

    fn mark(&self) -> usize {
        self.events.len() - self.open as usize
    }

    fn rewind(&mut self, mark: usize) {
        self.close_open();
        self.events.truncate(mark);
    }

    fn fork(&self) -> Option<Self> {
        if self.open || self.fork.is_some() {
            return None;
        }
        let first_event = u32::try_from(self.events.len()).ok()?.checked_add(self.first_event)?;
        let events: Vec<Event> = Vec::with_capacity(self.events.capacity() - self.events.len());
        crate::huge_pages::advise(&events);
        let stacks = self.cx.stacks.clone();
        Some(SnapshotBuilder {
            fork: Some(Fork {
                tables: self.interned_sizes(),
                kept_events: 0,
                kept_seen: KeySet::default(),
                kept_generic: 0,
            }),
            cx: EntryCx { stacks, frame_buf: Vec::new(), seen: KeySet::default(), defer: true },
            events,
            event_attrs: self.event_attrs.clone(),
            open: false,
            rec_attrs: EventAttrs::default(),
            seen_before: KeySet::default(),
            first_event,
            generic: 0,
        })
    }

    fn fork_batch_done(&mut self, records: usize) -> bool {
        let sizes = self.interned_sizes();
        let Some(f) = self.fork.as_mut() else { return false };
        let intact = !self.open && self.events.len() == records && sizes == f.tables;
        if intact {
            f.kept_events = records;
            f.kept_seen = self.cx.seen;
            f.kept_generic = self.generic;
        }
        intact
    }

    fn adopt(&mut self, fork: Self, records: usize, resolve: &dyn Fn(u32) -> Option<Value>) -> bool {
        let Some(f) = fork.fork.as_ref() else { return false };
        let first = u32::try_from(self.events.len()).ok().and_then(|n| n.checked_add(self.first_event));
        if self.open || f.kept_events != records || fork.events.len() < records || first.is_none() {
            return false;
        }
        let taken = &fork.events[..records];
        // Resolved before anything changes, without interning: a stack new here would take an id out of turn.
        let (mut resolved, mut frame_buf) = (Vec::new(), Vec::new());
        for (j, e) in taken.iter().enumerate() {
            if e.stack & DEFERRED == 0 {
                continue;
            }
            let Some(v) = resolve(e.stack & !DEFERRED) else { return false };
            let stacks = &self.cx.stacks;
            let Some(stack) = stack_of(&mut frame_buf, &v, |f| stacks.find_stack(f)) else { return false };
            resolved.push((j, stack));
        }
        let at = self.events.len();
        self.events.extend_from_slice(taken);
        for (j, stack) in resolved {
            self.events[at + j].stack = stack;
        }
        self.cx.seen = self.cx.seen.or(f.kept_seen);
        self.generic += f.kept_generic;
        true
    }

    fn close_list(&mut self, items: &[Value]) -> Option<Value> {
        if items.is_empty() || !items.iter().all(|v| matches!(v, Value::Custom(FRAME, _))) {
            return None;
        }
        let cx = &mut self.cx;
        cx.frame_buf.clear();
        cx.frame_buf.extend(items.iter().map(|v| match v {
            Value::Custom(_, f) => *f,
            _ => unreachable!("checked above"),
        }));
        Some(Value::Custom(STACK, cx.stacks.intern_stack(&cx.frame_buf)))
    }
}

/// A snapshot that has been read.
pub struct Snapshot {
    pub timeline: Timeline,
    pub format_version: String,
    pub protocol: u8,
    pub bytes: u64,
    /// What a helper thread read of the trace, when one did.
    pub split: Option<pickle::SplitStats>,
    /// How many trace entries each route of the reader decoded.
    pub routes: ReadRoutes,
}

/// Reads a snapshot from a stream. `Err` carries a message without the path; the caller adds it.
pub fn read<R: Read>(src: R, progress: Option<Box<dyn FnMut(u64)>>) -> Result<Snapshot, SnapshotError> {
    read_sized(src, 0, progress)
}

/// Bytes of pickle per trace entry, at the least: with memo-shared frames an entry takes ~75 bytes. Reserving
/// `len / this` events up front spares the copies of a growing vector, and the untouched tail of the reservation
/// costs address space only, not memory.
const MIN_ENTRY_BYTES: u64 = 48;

/// [`read`], told the file's length (0: unknown) to size the event table once.
pub fn read_sized<R: Read>(src: R, len: u64, progress: Option<Box<dyn FnMut(u64)>>) -> Result<Snapshot, SnapshotError> {
    read_split(src, len, progress, None)
}

/// [`read_sized`], given a way to open the file again at an offset: a long trace is then read in two parts at
/// once (see `pickle::split`), with the same result.
pub fn read_split<R: Read>(
    src: R,
    len: u64,
    progress: Option<Box<dyn FnMut(u64)>>,
    split: Option<pickle::SplitSource>,
) -> Result<Snapshot, SnapshotError> {
    let mut strings = Strings::default();
    intern_keys(&mut strings);
    // Capped so that a hostile length cannot reserve absurd address space.
    let reserve = (len / MIN_ENTRY_BYTES).min(1 << 23) as usize;
    let mut b = SnapshotBuilder {
        cx: EntryCx::new(),
        events: {
            let v: Vec<Event> = Vec::with_capacity(reserve);
            crate::huge_pages::advise(&v);
            // Real traces take 90–300 bytes of pickle per entry: back what 150 bytes an entry would fill.
            crate::huge_pages::populate_soon(&v, (len / 150) as usize * std::mem::size_of::<Event>());
            v
        },
        event_attrs: EventAttrTable::default(),
        open: false,
        rec_attrs: EventAttrs::default(),
        seen_before: KeySet::default(),
        first_event: 0,
        fork: None,
        generic: 0,
    };
    let parsed = pickle::read_split(src, &mut b, strings, progress, split)?;
    b.close_open();
    let cx = std::mem::replace(&mut b.cx, EntryCx::new());
    let event_attrs = std::mem::take(&mut b.event_attrs);
    let EntryCx { stacks, seen, .. } = cx;
    let mut d =
        Decoder { strings: &parsed.strings, work_left: parsed.bytes_read.max(1024), stacks, frame_buf: Vec::new() };
    let mut tl = Timeline::default();
    let mut version = Version::default();
    let top = &parsed.value;

    if let Some(items) = top.list_items() {
        // torch 1.13 `_snapshot()` / any `memory_snapshot()`: a bare list of segments.
        if let Some(first) = items.first() {
            if first.dict_items().is_none() {
                return Err(SnapshotError::Shape(format!(
                    "not a PyTorch memory snapshot: the top level is a list, but its first item is {}, not a \
                     segment dict",
                    first.type_name()
                )));
            }
        }
        version.bare_list = true;
        d.segments(&items, &mut tl, &mut version)?;
    } else if let Some(items) = top.dict_items() {
        for kv in items.chunks_exact(2) {
            if let Value::Str(key) = kv[0] {
                version.keys.insert(key);
            }
        }
        let segs = dict_get(&items, k::SEGMENTS);
        let traces = dict_get(&items, k::DEVICE_TRACES);
        if segs.is_none() && traces.is_none() {
            let keys: Vec<String> = items
                .chunks_exact(2)
                .take(6)
                .map(|kv| match kv[0] {
                    Value::Str(s) => format!("'{}'", parsed.strings.get(s)),
                    ref v => v.type_name().to_string(),
                })
                .collect();
            return Err(SnapshotError::Shape(format!(
                "not a PyTorch memory snapshot: expected a dict with 'segments' and 'device_traces' (torch ≥ 2.0) \
                 or a list of segments (torch 1.13), found a dict with keys {}",
                if keys.is_empty() { "(none)".to_string() } else { keys.join(", ") }
            )));
        }
        if let Some(segs) = segs {
            let list = segs
                .list_items()
                .ok_or_else(|| SnapshotError::Shape(format!("'segments' is {}, expected a list", segs.type_name())))?;
            d.segments(&list, &mut tl, &mut version)?;
        }
        if let Some(traces) = traces {
            let lists = traces.list_items().ok_or_else(|| {
                SnapshotError::Shape(format!("'device_traces' is {}, expected a list of lists", traces.type_name()))
            })?;
            // Which converted events each device's list holds: a run of them (the pickler writes each device's
            // entries in order, and the reader keeps such a list as a run), or any others.
            enum Held {
                Run(usize, usize),
                Each(Vec<usize>),
            }
            let mut held = Vec::new();
            for (dev, list) in lists.iter().enumerate() {
                if let Some(run) = list.custom_run().filter(|r| r.kind == TRACE) {
                    d.spend(run.len as usize, "device_traces")?;
                    held.push((dev, Held::Run(run.first as usize, run.len as usize)));
                    continue;
                }
                let entries = list.list_items().ok_or_else(|| {
                    SnapshotError::Shape(format!("device_traces[{dev}] is {}, expected a list", list.type_name()))
                })?;
                if entries.is_empty() {
                    continue;
                }
                d.spend(entries.len(), "device_traces")?;
                let each = entries
                    .iter()
                    .enumerate()
                    .map(|(i, e)| match e {
                        Value::Custom(TRACE, j) => Ok(*j as usize),
                        _ => Err(SnapshotError::Shape(format!(
                            "device_traces[{dev}][{i}] is {}, expected a trace entry dict with an 'action'",
                            e.type_name()
                        ))),
                    })
                    .collect::<Result<Vec<usize>, _>>()?;
                let contiguous = each.windows(2).all(|w| w[1] == w[0] + 1);
                held.push((dev, if contiguous { Held::Run(each[0], each.len()) } else { Held::Each(each) }));
            }
            // Runs in order that share no event can be moved out of the table; anything else (an entry dict
            // referenced again through the memo, say) is copied.
            let mut end = 0;
            let movable = held.iter().all(|(_, h)| match *h {
                Held::Run(first, len) if first >= end => {
                    end = first + len;
                    true
                }
                _ => false,
            });
            let mut all_events = b.take_events();
            let mut consumed = 0usize;
            for (dev, h) in held {
                let events = match h {
                    Held::Run(first, len) if movable => {
                        // Dicts read before the trace that looked like entries (an `action` key) may precede the
                        // run: drop them in place, then move the run out (no second copy of the trace).
                        all_events.drain(..first - consumed);
                        let rest = all_events.split_off(len);
                        consumed = first + len;
                        std::mem::replace(&mut all_events, rest)
                    }
                    Held::Run(first, len) => (first..first + len).map(|j| event_at(&all_events, j)).collect(),
                    Held::Each(each) => each.iter().map(|&j| event_at(&all_events, j)).collect(),
                };
                let dt = tl.device_mut(dev as i64);
                dt.events = events;
                dt.event_attrs = event_attrs.clone();
            }
        }
        if let Some(s) = dict_get(&items, k::ALLOCATOR_SETTINGS) {
            tl.settings = Some(d.settings(s, &mut version, &mut tl.capture));
        }
        if let Some(a) = dict_get(&items, k::EXTERNAL_ANNOTATIONS) {
            tl.annotations = d.annotations(a);
        }
        if let Some(h) = dict_get(&items, k::HOST_SEGMENTS) {
            tl.capture.host_segments = h.list_items().map_or(0, |l| l.len());
        }
        if let Some(h) = dict_get(&items, k::HOST_TRACES) {
            tl.capture.host_trace_entries = h.list_items().map_or(0, |l| l.len());
        }
    } else {
        return Err(SnapshotError::Shape(format!(
            "not a PyTorch memory snapshot: the pickle holds {}, expected a dict with 'segments' (torch ≥ 2.0) or \
             a list of segments (torch 1.13)",
            top.type_name()
        )));
    }

    version.keys = version.keys.or(seen);
    tl.stacks = d.stacks;
    tl.strings = parsed.strings;
    let (backend, evidence) = backend_of(&tl, version.keys);
    tl.capture.backend = backend;
    tl.capture.backend_evidence = evidence;
    if backend == Backend::Npu {
        set_workspace_apart(&mut tl);
    }
    let format_version = match backend {
        // torch_npu dates its own releases; its key set is that of torch 2.1 whatever its version.
        Backend::Npu => "torch_npu".to_string(),
        _ => version.describe(),
    };
    let routes = ReadRoutes {
        layout: parsed.routes.layout,
        streamed: parsed.routes.streamed,
        generic: b.generic,
        entries: tl.devices.iter().map(|d| d.events.len() as u64).sum(),
    };

    fill_capture_info(&mut tl, version.keys.contains(k::TIME_US));
    Ok(Snapshot {
        timeline: tl,
        format_version,
        protocol: parsed.protocol,
        bytes: parsed.bytes_read,
        split: parsed.split,
        routes,
    })
}

/// Converted event `j`. Every trace value the reader hands out names an event it keeps, so the fallback (an
/// unknown event) only guards against a bug turning into a panic.
fn event_at(events: &[Event], j: usize) -> Event {
    events.get(j).cloned().unwrap_or_else(|| Event::new(Action::Unknown, 0, 0))
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Pickle(#[from] pickle::PickleError),
    #[error("{0}")]
    Shape(String),
}

fn fill_capture_info(tl: &mut Timeline, time: bool) {
    let c = &mut tl.capture;
    c.time_stamps = time;
    c.has_trace = tl.devices.iter().any(|d| !d.events.is_empty());
    c.trace_stacks = tl.devices.iter().flat_map(|d| &d.events).any(|e| e.stack != EMPTY_STACK);
    c.block_stacks =
        tl.devices.iter().flat_map(|d| &d.segments).flat_map(|s| &s.blocks).any(|b| b.stack != EMPTY_STACK);
    c.cpp_frames = (0..tl.stacks.frame_count() as u32).any(|f| {
        let name = tl.strings.get(tl.stacks.frame(f).filename);
        name.ends_with(".cpp") || name.ends_with(".h") || name.ends_with(".cc") || name == "??"
    });
    c.unknown_actions = tl.devices.iter().flat_map(|d| &d.events).filter(|e| e.action == Action::Unknown).count();
}

/// Key evidence for telling versions apart (no version field exists; see the format notes §10): the declared keys
/// seen anywhere in the file, and three shapes that no single key marks.
#[derive(Default)]
struct Version {
    keys: KeySet,
    bare_list: bool,
    requested_size: bool,
    history: bool,
    /// Blocks with an `address` (the key is older, on segments).
    block_address: bool,
}

impl Version {
    fn describe(&self) -> String {
        if self.bare_list {
            return if self.block_address {
                "segment list (memory_snapshot(), torch ≥ 2.1)".into()
            } else if self.requested_size {
                "segment list (memory_snapshot(), torch 2.0)".into()
            } else {
                "torch 1.13 (segment list)".into()
            };
        }
        if self.history {
            return "torch 2.0 (block history)".into();
        }
        let block_address = self.block_address.then_some((2, 1));
        match self.keys.newest_since().max(block_address) {
            Some((major, minor)) => format!("torch ≥ {major}.{minor}"),
            None => "torch 2.0".into(),
        }
    }
}

struct Decoder<'a> {
    stacks: Stacks,
    frame_buf: Vec<u32>,
    strings: &'a Strings,
    /// Caps how many records a file may make us visit: a hostile file can reference one segment a million times
    /// at two bytes a reference, but cannot make us do more work than its size allows.
    work_left: u64,
}

impl Decoder<'_> {
    fn spend(&mut self, n: usize, what: &str) -> Result<(), SnapshotError> {
        if n as u64 > self.work_left {
            return Err(SnapshotError::Shape(format!(
                "{what} references more records than the file could hold (shared objects repeated: a memo bomb?)"
            )));
        }
        self.work_left -= n as u64;
        Ok(())
    }

    fn get<'v>(&self, items: &'v [Value], key: StrId) -> Option<&'v Value> {
        dict_get(items, key)
    }

    fn u64_field(&self, items: &[Value], key: StrId, ctx: &dyn Fn() -> String) -> Result<Option<u64>, SnapshotError> {
        match self.get(items, key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                SnapshotError::Shape(format!(
                    "{}: '{}' is {}, expected a non-negative int",
                    ctx(),
                    self.strings.get(key),
                    v.type_name()
                ))
            }),
        }
    }

    fn stack(&mut self, v: Option<&Value>) -> StackId {
        let stacks = &mut self.stacks;
        v.and_then(|v| stack_of(&mut self.frame_buf, v, |f| Some(stacks.intern_stack(f)))).unwrap_or(EMPTY_STACK)
    }

    fn need(&self, items: &[Value], key: StrId, ctx: &dyn Fn() -> String) -> Result<u64, SnapshotError> {
        self.u64_field(items, key, ctx)?
            .ok_or_else(|| SnapshotError::Shape(format!("{}: missing '{}'", ctx(), self.strings.get(key))))
    }

    fn segments(&mut self, list: &[Value], tl: &mut Timeline, version: &mut Version) -> Result<(), SnapshotError> {
        self.spend(list.len(), "segments")?;
        for (si, seg) in list.iter().enumerate() {
            let ctx = || format!("segments[{si}]");
            let items = seg.dict_items().ok_or_else(|| {
                SnapshotError::Shape(format!("{}: is {}, expected a segment dict", ctx(), seg.type_name()))
            })?;
            let device = match self.get(&items, k::DEVICE) {
                Some(v) => v.as_i64().ok_or_else(|| {
                    SnapshotError::Shape(format!("{}: 'device' is {}, expected an int", ctx(), v.type_name()))
                })?,
                None => 0,
            };
            let address = self.need(&items, k::ADDRESS, &ctx)?;
            let total_size = self.need(&items, k::TOTAL_SIZE, &ctx)?;
            let stream = self.get(&items, k::STREAM).and_then(|v| v.as_u64().or(v.as_i64().map(|i| i as u64)));
            let kind = match self.get(&items, k::SEGMENT_TYPE) {
                Some(Value::Str(s)) if *s == k::SMALL => PoolKind::Small,
                _ => PoolKind::Large,
            };
            let pool_id = match self.get(&items, k::SEGMENT_POOL_ID) {
                Some(v) => {
                    version.keys.insert(k::SEGMENT_POOL_ID);
                    pair(v).unwrap_or((0, 0))
                }
                None => (0, 0),
            };
            let expandable = self.get(&items, k::IS_EXPANDABLE).and_then(Value::as_bool).unwrap_or(false);
            let seg_stack = self.stack(self.get(&items, k::FRAMES));
            let declared_allocated = self.u64_field(&items, k::ALLOCATED_SIZE, &ctx)?;
            let declared_active = self.u64_field(&items, k::ACTIVE_SIZE, &ctx)?;

            let blocks_v = self
                .get(&items, k::BLOCKS)
                .ok_or_else(|| SnapshotError::Shape(format!("{}: missing 'blocks'", ctx())))?;
            let blist = blocks_v.list_items().ok_or_else(|| {
                SnapshotError::Shape(format!("{}: 'blocks' is {}, expected a list", ctx(), blocks_v.type_name()))
            })?;
            self.spend(blist.len(), "blocks")?;
            let mut blocks = Vec::with_capacity(blist.len());
            let mut next_addr = address;
            for (bi, blk) in blist.iter().enumerate() {
                let bctx = || format!("segments[{si}].blocks[{bi}]");
                let bitems = blk.dict_items().ok_or_else(|| {
                    SnapshotError::Shape(format!("{}: is {}, expected a block dict", bctx(), blk.type_name()))
                })?;
                let size = self
                    .u64_field(&bitems, k::SIZE, &bctx)?
                    .ok_or_else(|| SnapshotError::Shape(format!("{}: missing 'size'", bctx())))?;
                let state = match self.get(&bitems, k::STATE) {
                    Some(Value::Str(s)) => BlockState::from_name(self.strings.get(*s)).ok_or_else(|| {
                        SnapshotError::Shape(format!(
                            "{}: unknown block state '{}' (expected active_allocated, active_pending_free or \
                             inactive)",
                            bctx(),
                            self.strings.get(*s)
                        ))
                    })?,
                    Some(v) => {
                        return Err(SnapshotError::Shape(format!(
                            "{}: 'state' is {}, expected a str",
                            bctx(),
                            v.type_name()
                        )))
                    }
                    None => return Err(SnapshotError::Shape(format!("{}: missing 'state'", bctx()))),
                };
                // 1.13/2.0 blocks have no address: they tile the segment, so it is the running sum.
                let addr = match self.u64_field(&bitems, k::ADDRESS, &bctx)? {
                    Some(a) => {
                        version.block_address = true;
                        a
                    }
                    None => next_addr,
                };
                next_addr = addr.wrapping_add(size);
                let requested_size = self.u64_field(&bitems, k::REQUESTED_SIZE, &bctx)?;
                version.requested_size |= requested_size.is_some();
                let mut stack = self.stack(self.get(&bitems, k::FRAMES));
                if let Some(h) = self.get(&bitems, k::HISTORY) {
                    version.history = true;
                    // Newest entry first; an inactive block's history is its previous occupant's, not a live stack.
                    if state != BlockState::Inactive {
                        if let Some(first) = h.list_items().and_then(|l| l.first().cloned()) {
                            if let Some(hi) = first.dict_items() {
                                stack = self.stack(self.get(&hi, k::FRAMES));
                            }
                        }
                    }
                }
                blocks.push(Block { address: addr, size, requested_size, state, stack });
            }
            tl.device_mut(device).segments.push(Segment {
                device,
                address,
                total_size,
                stream: stream.unwrap_or(0),
                kind,
                pool_id,
                expandable,
                stack: seg_stack,
                blocks,
                declared_allocated,
                declared_active,
            });
        }
        for d in &mut tl.devices {
            d.segments.sort_by_key(|s| s.address);
        }
        Ok(())
    }

    fn settings(&self, v: &Value, version: &mut Version, capture: &mut CaptureInfo) -> AllocatorSettings {
        let mut s = AllocatorSettings::default();
        let Some(items) = v.dict_items() else {
            return s;
        };
        for kv in items.chunks_exact(2) {
            let Value::Str(key) = kv[0] else { continue };
            let val = &kv[1];
            let shown = match val {
                Value::Str(x) => format!("{:?}", self.strings.get(*x)),
                Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
                Value::Int(i) => i.to_string(),
                Value::Float(f) => f.to_string(),
                Value::Dict(_) | Value::PendingDict(_) => {
                    let d = val.dict_items().unwrap();
                    let parts: Vec<String> = d
                        .chunks_exact(2)
                        .map(|kv| {
                            let kk = kv[0].as_str_id().map_or("?", |id| self.strings.get(id));
                            format!("{kk}: {}", kv[1].as_i64().map_or("?".into(), |i| i.to_string()))
                        })
                        .collect();
                    format!("{{{}}}", parts.join(", "))
                }
                other => other.type_name().to_string(),
            };
            s.raw.push((self.strings.get(key).to_string(), shown));
            version.keys.insert(key);
            if key == k::TRACE_OVERFLOWED {
                capture.ring_overflowed = overflowed(val);
            } else if key == k::TRACE_MAX_ENTRIES {
                // One for every device, or one per device (the largest said).
                capture.ring_max_entries =
                    val.as_u64().or_else(|| val.list_items().and_then(|l| l.iter().filter_map(Value::as_u64).max()));
            } else if key == k::ALLOC_CONF || key == k::XPU_ALLOC_CONF || key == k::HIP_ALLOC_CONF {
                s.alloc_conf = val.as_str_id().map(|x| self.strings.get(x).to_string());
            } else if key == k::EXPANDABLE_SEGMENTS {
                s.expandable_segments = val.as_bool();
            } else if key == k::MAX_SPLIT_SIZE {
                s.max_split_size = val.as_i64().filter(|&m| m > 0).map(|m| m as u64);
            } else if key == k::GC_THRESHOLD {
                s.garbage_collection_threshold = val.as_f64();
            } else if key == k::ROUNDUP {
                if let Some(d) = val.dict_items() {
                    for kv in d.chunks_exact(2) {
                        let mib = kv[0].as_str_id().and_then(|id| self.strings.get(id).parse::<u64>().ok());
                        if let (Some(mib), Some(div)) = (mib, kv[1].as_u64()) {
                            s.roundup_power2_divisions.push((mib, div));
                        }
                    }
                    s.roundup_power2_divisions.sort();
                }
            }
        }
        // Older files only say it in the settings string.
        if s.expandable_segments.is_none() {
            if let Some(conf) = &s.alloc_conf {
                if conf.replace(' ', "").contains("expandable_segments:True") {
                    s.expandable_segments = Some(true);
                }
            }
        }
        s
    }

    fn annotations(&self, v: &Value) -> Vec<Annotation> {
        let Some(list) = v.list_items() else {
            return Vec::new();
        };
        list.iter()
            .filter_map(|a| {
                let items = a.dict_items()?;
                let name = self.get(&items, k::NAME).and_then(Value::as_str_id).unwrap_or(NO_STR);
                let stage = self.get(&items, k::STAGE).and_then(Value::as_str_id).map(|s| self.strings.get(s));
                Some(Annotation {
                    device: self.get(&items, k::DEVICE).and_then(Value::as_i64).unwrap_or(0),
                    time_us: self.get(&items, k::TIME_US).and_then(Value::as_i64)?,
                    name,
                    start: stage != Some("END"),
                })
            })
            .collect()
    }
}

/// Which accelerator's allocator wrote the file, and what says so: a key only its serializer writes, else the
/// allocator's own source files in the C++ frames (`stacks="all"`) or the vendor's Python package in any frame.
/// With neither, CUDA's (ROCm writes the same format, and says so only in its frames and messages).
fn backend_of(tl: &Timeline, keys: KeySet) -> (Backend, Option<&'static str>) {
    match keys.dialect() {
        Some(Backend::Xpu) => return (Backend::Xpu, Some("allocator_settings.PYTORCH_ALLOC_CONF")),
        Some(Backend::Npu) => return (Backend::Npu, Some("workspace_snapshot trace entries")),
        Some(Backend::Rocm) => return (Backend::Rocm, Some("allocator_settings.PYTORCH_HIP_ALLOC_CONF")),
        _ => {}
    }
    // C++ frames name the file alone (`CUDACachingAllocator.cpp`) or with its directory.
    const BY_FRAME: [(&str, Backend, &str); 8] = [
        ("HIPCachingAllocator", Backend::Rocm, "HIP allocator frames (HIPCachingAllocator)"),
        ("c10/hip/", Backend::Rocm, "HIP allocator frames (c10/hip)"),
        ("XPUCachingAllocator", Backend::Xpu, "XPU allocator frames (XPUCachingAllocator)"),
        ("c10/xpu/", Backend::Xpu, "XPU allocator frames (c10/xpu)"),
        ("NPUCachingAllocator", Backend::Npu, "NPU allocator frames (NPUCachingAllocator)"),
        ("torch_npu/", Backend::Npu, "torch_npu frames"),
        ("c10_npu", Backend::Npu, "torch_npu frames"),
        ("CUDACachingAllocator", Backend::Cuda, "CUDA allocator frames (CUDACachingAllocator)"),
    ];
    let mut cuda = None;
    for f in 0..tl.stacks.frame_count() as u32 {
        let name = tl.strings.get(tl.stacks.frame(f).filename);
        for (needle, backend, why) in BY_FRAME {
            if name.contains(needle) {
                match backend {
                    Backend::Cuda => cuda = Some(why),
                    _ => return (backend, Some(why)),
                }
            }
        }
    }
    (Backend::Cuda, cuda)
}

/// torch_npu prepends its workspace allocator's trace to each device's, through that allocator's
/// `workspace_snapshot` marker: the device trace is then two streams, each in time order, one after the other. The
/// workspace part (through the last marker) is set apart, counted, so that the replay follows one allocator; the
/// segments it created are taken out of the caching allocator's state (their bytes are counted too: memory the
/// device holds outside the cache).
fn set_workspace_apart(tl: &mut Timeline) {
    let (mut entries, mut bytes) = (0, 0);
    for d in &mut tl.devices {
        let Some(last) = d.events.iter().rposition(|e| e.action == Action::WorkspaceSnapshot) else { continue };
        let made: Vec<u64> = d.events[..=last]
            .iter()
            .filter(|e| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap))
            .map(|e| e.addr)
            .collect();
        d.events.drain(..=last);
        entries += last + 1;
        d.segments.retain(|seg| {
            let workspace = made.contains(&seg.address);
            if workspace {
                bytes += seg.total_size;
            }
            !workspace
        });
    }
    tl.capture.workspace_entries = entries;
    tl.capture.workspace_bytes = bytes;
}

/// `trace_alloc_overflowed`: one bool for every device (written as device -1), a list of them by device, or a dict
/// of device to bool.
fn overflowed(v: &Value) -> Vec<(i64, bool)> {
    if let Some(b) = v.as_bool() {
        return vec![(-1, b)];
    }
    if let Some(d) = v.dict_items() {
        return d.chunks_exact(2).filter_map(|kv| Some((kv[0].as_i64()?, kv[1].as_bool()?))).collect();
    }
    v.list_items()
        .map(|l| l.iter().enumerate().filter_map(|(i, b)| Some((i as i64, b.as_bool()?))).collect())
        .unwrap_or_default()
}

/// Whether `bytes` look like a pickle (for format sniffing).
pub fn sniff(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x80 && bytes[1] <= 5
}

impl DeviceTimeline {
    pub fn trace_stack_count(&self) -> usize {
        self.events.iter().filter(|e| e.stack != EMPTY_STACK).count()
    }
}
