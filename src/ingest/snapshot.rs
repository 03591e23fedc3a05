//! PyTorch CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`), every known shape from 1.13 to 2.15.
//!
//! Frames, stacks and trace entries are converted while the pickle streams in (see [`SnapshotBuilder`]); the
//! small rest (segments, settings, annotations) is decoded from the generic values afterwards.

use std::io::Read;

use super::pickle::{self, dict_get, Builder, Value};
use crate::timeline::stacks::{Frame, StackId, Stacks, StrId, Strings, EMPTY_STACK};
use crate::timeline::{
    Action, AllocatorSettings, Annotation, Block, BlockState, DeviceTimeline, Event, PoolKind,
    Segment, Timeline, NO_STR,
};

const FRAME: u8 = 1;
const STACK: u8 = 2;
const TRACE: u8 = 3;

/// Interned ids of every key the reader looks for, so matching a key is an integer compare.
struct Keys {
    filename: StrId,
    name: StrId,
    line: StrId,
    action: StrId,
    addr: StrId,
    size: StrId,
    stream: StrId,
    device_free: StrId,
    time_us: StrId,
    frames: StrId,
    compile_context: StrId,
    user_metadata: StrId,
    pool_id: StrId,
    segments: StrId,
    device_traces: StrId,
    allocator_settings: StrId,
    external_annotations: StrId,
    host_segments: StrId,
    host_traces: StrId,
    device: StrId,
    address: StrId,
    total_size: StrId,
    allocated_size: StrId,
    active_size: StrId,
    requested_size: StrId,
    segment_type: StrId,
    segment_pool_id: StrId,
    is_expandable: StrId,
    blocks: StrId,
    state: StrId,
    history: StrId,
    stage: StrId,
    alloc_conf: StrId,
    expandable_segments: StrId,
    max_split_size: StrId,
    gc_threshold: StrId,
    roundup: StrId,
    max_cached_size: StrId,
    small: StrId,
}

impl Keys {
    fn new(s: &mut Strings) -> Keys {
        Keys {
            filename: s.intern("filename"),
            name: s.intern("name"),
            line: s.intern("line"),
            action: s.intern("action"),
            addr: s.intern("addr"),
            size: s.intern("size"),
            stream: s.intern("stream"),
            device_free: s.intern("device_free"),
            time_us: s.intern("time_us"),
            frames: s.intern("frames"),
            compile_context: s.intern("compile_context"),
            user_metadata: s.intern("user_metadata"),
            pool_id: s.intern("pool_id"),
            segments: s.intern("segments"),
            device_traces: s.intern("device_traces"),
            allocator_settings: s.intern("allocator_settings"),
            external_annotations: s.intern("external_annotations"),
            host_segments: s.intern("host_segments"),
            host_traces: s.intern("host_traces"),
            device: s.intern("device"),
            address: s.intern("address"),
            total_size: s.intern("total_size"),
            allocated_size: s.intern("allocated_size"),
            active_size: s.intern("active_size"),
            requested_size: s.intern("requested_size"),
            segment_type: s.intern("segment_type"),
            segment_pool_id: s.intern("segment_pool_id"),
            is_expandable: s.intern("is_expandable"),
            blocks: s.intern("blocks"),
            state: s.intern("state"),
            history: s.intern("history"),
            stage: s.intern("stage"),
            alloc_conf: s.intern("PYTORCH_CUDA_ALLOC_CONF"),
            expandable_segments: s.intern("expandable_segments"),
            max_split_size: s.intern("max_split_size"),
            gc_threshold: s.intern("garbage_collection_threshold"),
            roundup: s.intern("roundup_power2_divisions"),
            max_cached_size: s.intern("max_cached_size"),
            small: s.intern("small"),
        }
    }
}

/// Turns frame dicts into interned frames, frame lists into interned stacks and trace-entry dicts into
/// [`Event`]s as the pickle streams in.
struct SnapshotBuilder {
    k: Keys,
    stacks: Stacks,
    events: Vec<Event>,
    frame_buf: Vec<u32>,
    seen_time: bool,
    seen_compile_context: bool,
    seen_user_metadata: bool,
    seen_pool_id: bool,
}

fn want_u64(v: &Value, key: &str, what: &str) -> Result<u64, String> {
    v.as_u64().ok_or_else(|| {
        format!(
            "{what}: '{key}' is {}, expected a non-negative int",
            v.type_name()
        )
    })
}

impl SnapshotBuilder {
    fn frame(&mut self, items: &[Value]) -> Option<Value> {
        let k = &self.k;
        let (mut filename, mut name, mut line) = (None, None, 0i64);
        for kv in items.chunks_exact(2) {
            let Value::Str(key) = kv[0] else { return None };
            if key == k.filename {
                filename = Some(kv[1].as_str_id()?);
            } else if key == k.name {
                name = Some(kv[1].as_str_id()?);
            } else if key == k.line {
                line = kv[1].as_i64()?;
            }
            // Other keys (2.10's fx_node_* / fx_original_trace) are tolerated.
        }
        let f = Frame {
            filename: filename?,
            name: name?,
            line,
        };
        Some(Value::Custom(FRAME, self.stacks.intern_frame(f)))
    }

    fn trace_entry(&mut self, strings: &Strings, items: &[Value]) -> Result<Value, String> {
        let SnapshotBuilder {
            k,
            stacks,
            frame_buf,
            events,
            seen_time,
            seen_compile_context,
            seen_user_metadata,
            seen_pool_id,
        } = self;
        let mut e = Event {
            action: Action::Unknown,
            addr: 0,
            size: 0,
            stream: 0,
            device_free: None,
            time_us: None,
            stack: EMPTY_STACK,
            compile_context: NO_STR,
            user_metadata: NO_STR,
            pool_id: None,
        };
        const W: &str = "trace entry";
        for kv in items.chunks_exact(2) {
            let Value::Str(key) = kv[0] else { continue };
            let v = &kv[1];
            if key == k.action {
                let s = v
                    .as_str_id()
                    .ok_or_else(|| format!("{W}: 'action' is {}, expected a str", v.type_name()))?;
                e.action = Action::from_name(strings.get(s));
            } else if key == k.addr {
                e.addr = want_u64(v, "addr", W)?;
            } else if key == k.size {
                e.size = want_u64(v, "size", W)?;
            } else if key == k.stream {
                // A stream is a raw pointer; a negative value (never seen) is kept as its bit pattern.
                e.stream = v
                    .as_u64()
                    .or_else(|| v.as_i64().map(|i| i as u64))
                    .ok_or_else(|| {
                        format!("{W}: 'stream' is {}, expected an int", v.type_name())
                    })?;
            } else if key == k.device_free {
                e.device_free = Some(want_u64(v, "device_free", W)?);
            } else if key == k.time_us {
                e.time_us = Some(v.as_i64().ok_or_else(|| {
                    format!("{W}: 'time_us' is {}, expected an int", v.type_name())
                })?);
                *seen_time = true;
            } else if key == k.frames {
                e.stack = stack_of(stacks, frame_buf, v).ok_or_else(|| {
                    format!(
                        "{W}: 'frames' is {}, expected a list of frames",
                        v.type_name()
                    )
                })?;
            } else if key == k.compile_context {
                e.compile_context = v.as_str_id().unwrap_or(NO_STR);
                *seen_compile_context = true;
            } else if key == k.user_metadata {
                e.user_metadata = v.as_str_id().unwrap_or(NO_STR);
                *seen_user_metadata = true;
            } else if key == k.pool_id {
                e.pool_id = pair(v);
                *seen_pool_id = true;
            }
        }
        if e.action == Action::Unknown && dict_get(items, k.action).is_none() {
            return Err(format!("{W} without an 'action'"));
        }
        let idx = u32::try_from(events.len())
            .map_err(|_| "more than 4 billion trace entries".to_string())?;
        events.push(e);
        Ok(Value::Custom(TRACE, idx))
    }
}

/// The stack a `frames` value stands for; `None` if it is not a list of frames.
fn stack_of(stacks: &mut Stacks, frame_buf: &mut Vec<u32>, v: &Value) -> Option<StackId> {
    match v {
        Value::Custom(STACK, id) => Some(*id),
        Value::PendingList(_) => Some(EMPTY_STACK),
        Value::List(_) | Value::Tuple(_) => {
            // A stack of a thousand frames or more arrives in several batches and stays generic until now.
            let items = v.list_items()?;
            frame_buf.clear();
            for it in items.iter() {
                match it {
                    Value::Custom(FRAME, f) => frame_buf.push(*f),
                    _ => return None,
                }
            }
            Some(stacks.intern_stack(frame_buf))
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

impl Builder for SnapshotBuilder {
    fn close_dict(&mut self, strings: &Strings, items: &[Value]) -> Result<Option<Value>, String> {
        let k = &self.k;
        let mut is_frame = false;
        let mut is_trace = false;
        for kv in items.chunks_exact(2) {
            if let Value::Str(key) = kv[0] {
                if key == k.filename {
                    is_frame = true;
                } else if key == k.action {
                    is_trace = true;
                }
            }
        }
        if is_trace {
            return self.trace_entry(strings, items).map(Some);
        }
        if is_frame {
            return Ok(self.frame(items));
        }
        Ok(None)
    }

    fn close_list(&mut self, items: &[Value]) -> Option<Value> {
        if items.is_empty() || !items.iter().all(|v| matches!(v, Value::Custom(FRAME, _))) {
            return None;
        }
        self.frame_buf.clear();
        self.frame_buf.extend(items.iter().map(|v| match v {
            Value::Custom(_, f) => *f,
            _ => unreachable!("checked above"),
        }));
        let buf = std::mem::take(&mut self.frame_buf);
        let id = self.stacks.intern_stack(&buf);
        self.frame_buf = buf;
        Some(Value::Custom(STACK, id))
    }
}

/// A snapshot that has been read.
pub struct Snapshot {
    pub timeline: Timeline,
    pub format_version: String,
    pub protocol: u8,
    pub bytes: u64,
}

/// Reads a snapshot from a stream. `Err` carries a message without the path; the caller adds it.
pub fn read<R: Read>(
    src: R,
    progress: Option<Box<dyn FnMut(u64)>>,
) -> Result<Snapshot, SnapshotError> {
    let mut strings = Strings::default();
    let k = Keys::new(&mut strings);
    let mut b = SnapshotBuilder {
        k,
        stacks: Stacks::default(),
        events: Vec::new(),
        frame_buf: Vec::new(),
        seen_time: false,
        seen_compile_context: false,
        seen_user_metadata: false,
        seen_pool_id: false,
    };
    let parsed = pickle::read(src, &mut b, strings, progress)?;
    let SnapshotBuilder {
        k,
        stacks,
        events: all_events,
        seen_time,
        seen_compile_context,
        seen_user_metadata,
        seen_pool_id,
        ..
    } = b;
    let mut d = Decoder {
        k: &k,
        strings: &parsed.strings,
        work_left: parsed.bytes_read.max(1024),
        stacks,
        frame_buf: Vec::new(),
    };
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
        let segs = dict_get(&items, k.segments);
        let traces = dict_get(&items, k.device_traces);
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
            let list = segs.list_items().ok_or_else(|| {
                SnapshotError::Shape(format!(
                    "'segments' is {}, expected a list",
                    segs.type_name()
                ))
            })?;
            d.segments(&list, &mut tl, &mut version)?;
        }
        if let Some(traces) = traces {
            let lists = traces.list_items().ok_or_else(|| {
                SnapshotError::Shape(format!(
                    "'device_traces' is {}, expected a list of lists",
                    traces.type_name()
                ))
            })?;
            for (dev, list) in lists.iter().enumerate() {
                let entries = list.list_items().ok_or_else(|| {
                    SnapshotError::Shape(format!(
                        "device_traces[{dev}] is {}, expected a list",
                        list.type_name()
                    ))
                })?;
                if entries.is_empty() {
                    continue;
                }
                d.spend(entries.len(), "device_traces")?;
                let mut events = Vec::with_capacity(entries.len());
                for (i, e) in entries.iter().enumerate() {
                    match e {
                        Value::Custom(TRACE, idx) => events.push(all_events[*idx as usize].clone()),
                        other => {
                            return Err(SnapshotError::Shape(format!(
                                "device_traces[{dev}][{i}] is {}, expected a trace entry dict with an 'action'",
                                other.type_name()
                            )))
                        }
                    }
                }
                tl.device_mut(dev as i64).events = events;
            }
        }
        if let Some(s) = dict_get(&items, k.allocator_settings) {
            version.settings = true;
            tl.settings = Some(d.settings(s, &mut version));
        }
        if let Some(a) = dict_get(&items, k.external_annotations) {
            version.annotations = true;
            tl.annotations = d.annotations(a);
        }
        if let Some(h) = dict_get(&items, k.host_segments) {
            version.host = true;
            tl.capture.host_segments = h.list_items().map_or(0, |l| l.len());
        }
        if let Some(h) = dict_get(&items, k.host_traces) {
            tl.capture.host_trace_entries = h.list_items().map_or(0, |l| l.len());
        }
    } else {
        return Err(SnapshotError::Shape(format!(
            "not a PyTorch memory snapshot: the pickle holds {}, expected a dict with 'segments' (torch ≥ 2.0) or \
             a list of segments (torch 1.13)",
            top.type_name()
        )));
    }

    version.time = seen_time;
    version.compile_context = seen_compile_context;
    version.user_metadata = seen_user_metadata;
    version.pool_id = seen_pool_id;
    let format_version = version.describe();

    tl.stacks = d.stacks;
    tl.strings = parsed.strings;
    fill_capture_info(&mut tl, version.time);
    Ok(Snapshot {
        timeline: tl,
        format_version,
        protocol: parsed.protocol,
        bytes: parsed.bytes_read,
    })
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
    c.trace_stacks = tl
        .devices
        .iter()
        .flat_map(|d| &d.events)
        .any(|e| e.stack != EMPTY_STACK);
    c.block_stacks = tl
        .devices
        .iter()
        .flat_map(|d| &d.segments)
        .flat_map(|s| &s.blocks)
        .any(|b| b.stack != EMPTY_STACK);
    c.cpp_frames = (0..tl.stacks.frame_count() as u32).any(|f| {
        let name = tl.strings.get(tl.stacks.frame(f).filename);
        name.ends_with(".cpp") || name.ends_with(".h") || name.ends_with(".cc") || name == "??"
    });
    c.unknown_actions = tl
        .devices
        .iter()
        .flat_map(|d| &d.events)
        .filter(|e| e.action == Action::Unknown)
        .count();
}

/// Key evidence for telling versions apart (no version field exists; see the format notes §10).
#[derive(Default)]
struct Version {
    bare_list: bool,
    requested_size: bool,
    history: bool,
    block_address: bool,
    pool_ids: bool,
    time: bool,
    settings: bool,
    max_cached_size: bool,
    annotations: bool,
    compile_context: bool,
    user_metadata: bool,
    pool_id: bool,
    host: bool,
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
        let at_least = [
            (self.host, "2.14"),
            (self.max_cached_size, "2.13"),
            (self.pool_id, "2.12"),
            (self.user_metadata, "2.10"),
            (self.compile_context, "2.8"),
            (self.annotations, "2.5"),
            (self.settings, "2.3"),
            (self.time, "2.2"),
            (self.pool_ids || self.block_address, "2.1"),
        ]
        .into_iter()
        .find(|(seen, _)| *seen)
        .map(|(_, v)| v);
        match at_least {
            Some(v) => format!("torch ≥ {v}"),
            None => "torch 2.0".into(),
        }
    }
}

struct Decoder<'a> {
    k: &'a Keys,
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

    fn u64_field(
        &self,
        items: &[Value],
        key: StrId,
        ctx: &dyn Fn() -> String,
    ) -> Result<Option<u64>, SnapshotError> {
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
        v.and_then(|v| stack_of(&mut self.stacks, &mut self.frame_buf, v))
            .unwrap_or(EMPTY_STACK)
    }

    fn need(
        &self,
        items: &[Value],
        key: StrId,
        ctx: &dyn Fn() -> String,
    ) -> Result<u64, SnapshotError> {
        self.u64_field(items, key, ctx)?.ok_or_else(|| {
            SnapshotError::Shape(format!("{}: missing '{}'", ctx(), self.strings.get(key)))
        })
    }

    fn segments(
        &mut self,
        list: &[Value],
        tl: &mut Timeline,
        version: &mut Version,
    ) -> Result<(), SnapshotError> {
        self.spend(list.len(), "segments")?;
        let k = self.k;
        for (si, seg) in list.iter().enumerate() {
            let ctx = || format!("segments[{si}]");
            let items = seg.dict_items().ok_or_else(|| {
                SnapshotError::Shape(format!(
                    "{}: is {}, expected a segment dict",
                    ctx(),
                    seg.type_name()
                ))
            })?;
            let device = match self.get(&items, k.device) {
                Some(v) => v.as_i64().ok_or_else(|| {
                    SnapshotError::Shape(format!(
                        "{}: 'device' is {}, expected an int",
                        ctx(),
                        v.type_name()
                    ))
                })?,
                None => 0,
            };
            let address = self.need(&items, k.address, &ctx)?;
            let total_size = self.need(&items, k.total_size, &ctx)?;
            let stream = self
                .get(&items, k.stream)
                .and_then(|v| v.as_u64().or(v.as_i64().map(|i| i as u64)));
            let kind = match self.get(&items, k.segment_type) {
                Some(Value::Str(s)) if *s == k.small => PoolKind::Small,
                _ => PoolKind::Large,
            };
            let pool_id = match self.get(&items, k.segment_pool_id) {
                Some(v) => {
                    version.pool_ids = true;
                    pair(v).unwrap_or((0, 0))
                }
                None => (0, 0),
            };
            let expandable = self
                .get(&items, k.is_expandable)
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let seg_stack = self.stack(self.get(&items, k.frames));
            let declared_allocated = self.u64_field(&items, k.allocated_size, &ctx)?;
            let declared_active = self.u64_field(&items, k.active_size, &ctx)?;

            let blocks_v = self
                .get(&items, k.blocks)
                .ok_or_else(|| SnapshotError::Shape(format!("{}: missing 'blocks'", ctx())))?;
            let blist = blocks_v.list_items().ok_or_else(|| {
                SnapshotError::Shape(format!(
                    "{}: 'blocks' is {}, expected a list",
                    ctx(),
                    blocks_v.type_name()
                ))
            })?;
            self.spend(blist.len(), "blocks")?;
            let mut blocks = Vec::with_capacity(blist.len());
            let mut next_addr = address;
            for (bi, blk) in blist.iter().enumerate() {
                let bctx = || format!("segments[{si}].blocks[{bi}]");
                let bitems = blk.dict_items().ok_or_else(|| {
                    SnapshotError::Shape(format!(
                        "{}: is {}, expected a block dict",
                        bctx(),
                        blk.type_name()
                    ))
                })?;
                let size = self
                    .u64_field(&bitems, k.size, &bctx)?
                    .ok_or_else(|| SnapshotError::Shape(format!("{}: missing 'size'", bctx())))?;
                let state = match self.get(&bitems, k.state) {
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
                let addr = match self.u64_field(&bitems, k.address, &bctx)? {
                    Some(a) => {
                        version.block_address = true;
                        a
                    }
                    None => next_addr,
                };
                next_addr = addr.wrapping_add(size);
                let requested_size = self.u64_field(&bitems, k.requested_size, &bctx)?;
                version.requested_size |= requested_size.is_some();
                let mut stack = self.stack(self.get(&bitems, k.frames));
                if let Some(h) = self.get(&bitems, k.history) {
                    version.history = true;
                    // Newest entry first; an inactive block's history is its previous occupant's, not a live stack.
                    if state != BlockState::Inactive {
                        if let Some(first) = h.list_items().and_then(|l| l.first().cloned()) {
                            if let Some(hi) = first.dict_items() {
                                stack = self.stack(self.get(&hi, k.frames));
                            }
                        }
                    }
                }
                blocks.push(Block {
                    address: addr,
                    size,
                    requested_size,
                    state,
                    stack,
                });
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

    fn settings(&self, v: &Value, version: &mut Version) -> AllocatorSettings {
        let k = self.k;
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
                            format!(
                                "{kk}: {}",
                                kv[1].as_i64().map_or("?".into(), |i| i.to_string())
                            )
                        })
                        .collect();
                    format!("{{{}}}", parts.join(", "))
                }
                other => other.type_name().to_string(),
            };
            s.raw.push((self.strings.get(key).to_string(), shown));
            if key == k.alloc_conf {
                s.alloc_conf = val.as_str_id().map(|x| self.strings.get(x).to_string());
            } else if key == k.expandable_segments {
                s.expandable_segments = val.as_bool();
            } else if key == k.max_split_size {
                s.max_split_size = val.as_i64().filter(|&m| m > 0).map(|m| m as u64);
            } else if key == k.gc_threshold {
                s.garbage_collection_threshold = val.as_f64();
            } else if key == k.max_cached_size {
                version.max_cached_size = true;
            } else if key == k.roundup {
                if let Some(d) = val.dict_items() {
                    for kv in d.chunks_exact(2) {
                        let mib = kv[0]
                            .as_str_id()
                            .and_then(|id| self.strings.get(id).parse::<u64>().ok());
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
        let k = self.k;
        let Some(list) = v.list_items() else {
            return Vec::new();
        };
        list.iter()
            .filter_map(|a| {
                let items = a.dict_items()?;
                let name = self
                    .get(&items, k.name)
                    .and_then(Value::as_str_id)
                    .unwrap_or(NO_STR);
                let stage = self
                    .get(&items, k.stage)
                    .and_then(Value::as_str_id)
                    .map(|s| self.strings.get(s));
                Some(Annotation {
                    device: self
                        .get(&items, k.device)
                        .and_then(Value::as_i64)
                        .unwrap_or(0),
                    time_us: self.get(&items, k.time_us).and_then(Value::as_i64)?,
                    name,
                    start: stage != Some("END"),
                })
            })
            .collect()
    }
}

/// Whether `bytes` look like a pickle (for format sniffing).
pub fn sniff(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x80 && bytes[1] <= 5
}

impl DeviceTimeline {
    pub fn trace_stack_count(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.stack != EMPTY_STACK)
            .count()
    }
}
