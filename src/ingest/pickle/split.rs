//! Reading the second half of a long list of records on another thread.
//!
//! A million trace entries are most of a snapshot, and each one matching a known layout (see `RecordShapes`) is
//! self-delimiting and refers only to memo slots stored before it. So once the layouts are learnt, a helper
//! thread can start at a record boundary half-way through the rest of the file, with a copy of the memo as it
//! stood, and read records from there while this thread reads the first half. The guess of a boundary is only a
//! guess: the helper's records are used only if this thread, reading on, lands exactly on the helper's starting
//! byte at the start of a record. It then takes the helper's records as if it had read them itself and skips to
//! where the helper stopped. Anything the helper cannot read as a known record (a new frame list, the end of the
//! list, a memo slot stored after the copy) stops it there, and this thread reads on from that point. The result
//! is byte for byte the one a single thread gives.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{first_match, Arg, Builder, Input, Machine, PickleError, Shape, Slot, Value, MAX_SHAPE_LEN};
use crate::timeline::stacks::StrId;

/// A source that can be read at any offset: the file being parsed, opened a second time.
pub trait ReadAt: Send + Sync {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for std::fs::File {
    #[cfg(unix)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
    #[cfg(windows)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(self, buf, offset)
    }
    #[cfg(not(any(unix, windows)))]
    fn read_at(&self, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "positional reads"))
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let from = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - from);
        buf[..n].copy_from_slice(&self[from..from + n]);
        Ok(n)
    }
}

/// Permission to read part of the input on a second thread, and how.
#[derive(Clone)]
pub struct Split {
    /// The same bytes the parser streams, readable at any offset.
    pub source: Arc<dyn ReadAt>,
    /// The input's length in bytes.
    pub len: u64,
    /// No helper when fewer bytes than this are left once the layouts are known: a thread costs more than it saves.
    pub min_rest: u64,
    /// Records read through a known layout before the helper starts (the layouts and memo have settled by then).
    pub after_records: u32,
    /// Where in the rest of the input the helper starts looking for a record, as a fraction of it.
    pub at: f64,
    /// The records read before the helper's, at the least, for the builder to start on them at once (see
    /// [`Builder::settled`]): fewer are not worth a thread.
    pub settle_after: usize,
    /// This thread waits for the helper to find its start, and at their meeting for it to finish on its own,
    /// instead of going on without it: what the helper does then no longer depends on timing (for tests).
    pub patient: bool,
}

impl Split {
    pub fn new(source: Arc<dyn ReadAt>, len: u64) -> Split {
        Split { source, len, min_rest: 8 << 20, after_records: 4096, at: 0.5, settle_after: 1 << 16, patient: false }
    }
}

/// Reads records on the helper thread as the builder would, into a store of its own that the builder later takes
/// in whole ([`Builder::absorb`]).
pub trait RecordHelper: Send + 'static {
    /// Starts a record, as [`Builder::record_begin`] does; `false` if it is not one.
    fn begin(&mut self, first_key: StrId) -> bool;
    /// One field of the record. `false` if it cannot be taken as is: the helper then calls
    /// [`RecordHelper::abandon`] and stops before the record. A memo reference to a slot stored after the helper's
    /// copy of the memo comes as `Custom(DEFERRED, slot)`: the helper may keep it for [`Builder::absorb`] to
    /// resolve, or refuse it.
    fn field(&mut self, key: StrId, value: &Value) -> bool;
    /// Keeps the record; `false` as for a field.
    fn end(&mut self) -> bool;
    /// Forgets the record begun, and all it said.
    fn abandon(&mut self);
}

/// The `Custom` kind of a memo reference the helper could not resolve (see [`RecordHelper::record`]).
pub const DEFERRED: u8 = 0xff;

/// The helper of a builder that has none.
pub enum NoHelper {}

impl RecordHelper for NoHelper {
    fn begin(&mut self, _: StrId) -> bool {
        match *self {}
    }
    fn field(&mut self, _: StrId, _: &Value) -> bool {
        match *self {}
    }
    fn end(&mut self) -> bool {
        match *self {}
    }
    fn abandon(&mut self) {
        match *self {}
    }
}

/// The machine's side of the split.
pub(super) enum Helping<H> {
    Off,
    Ready(Split),
    Running(Running<H>),
    Done,
}

/// What both threads see.
struct Shared {
    /// The helper's first record (the offset of its EMPTY_DICT) once found; `SEARCHING` or `NOWHERE` before.
    start: AtomicU64,
    /// Set by this thread: the helper stops at the next record boundary.
    stop: AtomicBool,
}

const SEARCHING: u64 = u64::MAX;
const NOWHERE: u64 = u64::MAX - 1;
/// Bytes the helper looks through for a record boundary before it gives up.
const SEARCH_MAX: usize = 1 << 20;
const CHUNK: usize = 1 << 20;

pub(super) struct Running<H> {
    shared: Arc<Shared>,
    patient: bool,
    settle_after: usize,
    handle: Option<JoinHandle<Option<Helped<H>>>>,
}

impl<H> Drop for Running<H> {
    /// A helper whose work will not be used stops at its next record instead of reading on.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// What the helper read.
struct Helped<H> {
    helper: H,
    start: u64,
    /// The header of the frame `start` lies in, found by following frame lengths: this thread must have read
    /// that very header, which proves the helper's chain of frames is the pickle's.
    start_frame: Option<u64>,
    /// The first byte it did not read.
    end: u64,
    /// Per record: whether it stored itself in the next memo slot.
    stored: Vec<bool>,
    /// For records stored by explicit index (BINPUT): the memo length the first of them assumed.
    put_base: Option<u32>,
    /// APPENDS + MARK pairs it stepped over: (records before it, offset of the APPENDS).
    appends: Vec<(u32, u64)>,
    source: Arc<dyn ReadAt>,
}

/// A memo value the helper can use; containers and other shared values stay behind (`Other`).
#[derive(Clone, Copy)]
enum Plain {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(StrId),
    IntPair(i32, i32),
    Custom(u8, u32),
    Other,
}

impl Plain {
    fn of(v: &Value) -> Plain {
        match *v {
            Value::None => Plain::None,
            Value::Bool(b) => Plain::Bool(b),
            Value::Int(i) => Plain::Int(i),
            Value::Float(f) => Plain::Float(f),
            Value::Str(s) => Plain::Str(s),
            Value::IntPair(a, b) => Plain::IntPair(a, b),
            Value::Custom(k, id) => Plain::Custom(k, id),
            _ => Plain::Other,
        }
    }

    fn value(self) -> Option<Value> {
        Some(match self {
            Plain::None => Value::None,
            Plain::Bool(b) => Value::Bool(b),
            Plain::Int(i) => Value::Int(i),
            Plain::Float(f) => Value::Float(f),
            Plain::Str(s) => Value::Str(s),
            Plain::IntPair(a, b) => Value::IntPair(a, b),
            Plain::Custom(k, id) => Value::Custom(k, id),
            Plain::Other => return None,
        })
    }
}

/// Memo slots copied for the helper at most; a memo larger than this when the records start means no helper.
const MAX_FROZEN: usize = 1 << 23;

impl<B: Builder> Machine<'_, B> {
    /// Starts the helper once enough records have been read through known layouts, if the split allows one.
    /// `input` stands just past the last record read.
    pub(super) fn maybe_start_helper<R: Read>(&mut self, input: &mut Input<R>) {
        let here = input.offset();
        let Helping::Ready(split) = &self.helping else { return };
        if self.known_hits < split.after_records {
            return;
        }
        let split = split.clone();
        self.helping = Helping::Done;
        let rest = split.len.saturating_sub(here);
        if rest < split.min_rest.max(1)
            || self.memo.overwritten
            || !self.memo.sparse.is_empty()
            || self.memo.dense_len() > MAX_FROZEN
        {
            return;
        }
        let Some(helper) = self.builder.helper() else { return };
        let from = here + ((rest as f64 * split.at.clamp(0.0, 1.0)) as u64).min(rest - 1);
        let memo: Vec<Plain> = (0..self.memo.dense_len())
            .map(|i| self.memo.dense_get(i).map_or(Plain::Other, |v| Plain::of(&v)))
            .collect();
        let shapes = self.records.shapes.clone();
        let shared = Arc::new(Shared { start: AtomicU64::new(SEARCHING), stop: AtomicBool::new(false) });
        let theirs = shared.clone();
        let framed = self.last_frame.is_some();
        let source = split.source.clone();
        let patient = split.patient;
        let settle_after = split.settle_after;
        let started = std::thread::Builder::new().name("records".into()).spawn(move || {
            let out = help(helper, &shapes, &memo, &split, from, framed, &theirs);
            if out.is_none() {
                theirs.start.store(NOWHERE, Ordering::Release);
            }
            out
        });
        if let Ok(handle) = started {
            self.helping = Helping::Running(Running { shared, patient, settle_after, handle: Some(handle) });
            // Two threads now decode on two cores: a third, reading ahead, would only take turns with them.
            input.direct = Some(source);
        }
    }

    /// Called with the EMPTY_DICT of a record just consumed, before reading it: if the helper started at that very
    /// byte, takes its records and moves the input past them (`true`). Gives the helper up once this thread is
    /// past its start, or when it found none.
    pub(super) fn meet_helper<R: Read>(&mut self, input: &mut Input<R>) -> Result<bool, PickleError> {
        let Helping::Running(run) = &self.helping else { return Ok(false) };
        let here = input.offset() - 1;
        let mut start = run.shared.start.load(Ordering::Acquire);
        while start == SEARCHING && run.patient {
            std::thread::yield_now();
            start = run.shared.start.load(Ordering::Acquire);
        }
        if start == SEARCHING || (start != NOWHERE && start > here) {
            return Ok(false);
        }
        let Helping::Running(mut run) = std::mem::replace(&mut self.helping, Helping::Done) else {
            return Ok(false);
        };
        if start != here {
            return Ok(false);
        }
        if !run.patient {
            run.shared.stop.store(true, Ordering::Relaxed);
        }
        let Some(Ok(Some(out))) = run.handle.take().map(JoinHandle::join) else { return Ok(false) };
        if out.start != here
            || out.start_frame != self.last_frame
            || out.stored.is_empty()
            || self.memo.overwritten
            || !self.memo.sparse.is_empty()
        {
            return Ok(false);
        }
        if out.put_base.is_some_and(|b| b as usize != self.memo.dense_len()) {
            return Ok(false);
        }
        self.take_helped(input, out, run.settle_after)
    }

    /// Pushes the helper's records, stores them in the memo and appends them to their list as reading them here
    /// would have, then skips the input to where the helper stopped.
    fn take_helped<R: Read>(
        &mut self,
        input: &mut Input<R>,
        out: Helped<B::Helper>,
        settle_after: usize,
    ) -> Result<bool, PickleError> {
        let n = out.stored.len() as u32;
        self.builder.settled(settle_after);
        let memo = &self.memo;
        let resolve = |slot: u32| memo.dense_get(slot as usize).map(|v| v.clone());
        let Some((kind, first)) = self.builder.absorb(out.helper, &resolve) else { return Ok(false) };
        self.helper_records += n as u64;
        for (k, &stored) in out.stored.iter().enumerate() {
            if stored {
                self.memo.push_custom(kind, first + k as u32);
            }
        }
        let mut from = 0u32;
        for &(before, off) in &out.appends {
            self.stack.extend((from..before).map(|k| Value::Custom(kind, first + k)));
            from = before;
            self.appends(off)?;
            self.marks.push(self.stack.len());
        }
        self.stack.extend((from..n).map(|k| Value::Custom(kind, first + k)));
        input.skip_to(out.end, &out.source);
        Ok(true)
    }
}

impl<R: Read> Input<R> {
    /// Moves to file offset `to`, at or after the current one. Past what is buffered, the rest of the input is
    /// read from `source` at offsets: reading the skipped bytes through the stream would copy them twice for
    /// nothing.
    fn skip_to(&mut self, to: u64, source: &Arc<dyn ReadAt>) {
        if to <= self.base + self.end as u64 {
            self.pos = (to - self.base) as usize;
            return;
        }
        self.base = to;
        self.pos = 0;
        self.end = 0;
        self.direct = Some(source.clone());
    }
}

/// The helper's view of the input: the opcodes from some offset on, read at offsets, with FRAME headers left out.
///
/// Protocol 4 and 5 pickles are cut into frames of ~64 KiB, each led by a FRAME opcode and its 8-byte length,
/// at any opcode boundary, so every ~800th record has one inside it. The reader skips them as opcodes; the
/// helper follows the chain of frame lengths and leaves the headers out, so that such a record reads like any
/// other.
struct Window<'a> {
    src: &'a dyn ReadAt,
    len: u64,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Where runs of `buf` come from: (first byte in `buf`, its file offset), in order.
    runs: Vec<(usize, u64)>,
    /// File offset of the next byte to read.
    next: u64,
    /// Payload bytes left in the current frame; `None` for an unframed pickle.
    frame_left: Option<u64>,
    /// File offsets of the FRAME headers left out so far.
    headers: Vec<u64>,
    /// The input, or the chain of frames, has ended.
    ended: bool,
}

/// Frames longer than this are not believed when looking for the chain of frames.
const MAX_FRAME: u64 = 1 << 24;

impl Window<'_> {
    /// File offset of `buf[i]`.
    fn offset_of(&self, i: usize) -> u64 {
        let k = self.runs.partition_point(|r| r.0 <= i);
        match k.checked_sub(1).and_then(|k| self.runs.get(k)) {
            Some(&(at, off)) => off + (i - at) as u64,
            None => self.next,
        }
    }

    fn offset(&self) -> u64 {
        self.offset_of(self.pos)
    }

    /// The FRAME header at `at`: its payload length, if it is one.
    fn header_at(&self, at: u64) -> Option<u64> {
        let mut h = [0u8; 9];
        let n = self.src.read_at(&mut h, at).ok()?;
        let len = u64::from_le_bytes(h[1..9].try_into().ok()?);
        (n == 9 && h[0] == 0x95 && (1..=MAX_FRAME).contains(&len)).then_some(len)
    }

    /// At least `n` bytes from `pos`, unless the input (or the chain of frames) ends first.
    fn ensure(&mut self, n: usize) -> &[u8] {
        if self.end - self.pos < n && !self.ended {
            let keep_from = self.pos;
            self.buf.copy_within(keep_from..self.end, 0);
            let first = self.runs.partition_point(|r| r.0 <= keep_from).saturating_sub(1);
            let start = self.offset_of(keep_from);
            self.runs.drain(..first);
            if let Some(r) = self.runs.first_mut() {
                *r = (0, start);
            }
            for r in self.runs.iter_mut().skip(1) {
                r.0 -= keep_from;
            }
            self.end -= keep_from;
            self.pos = 0;
            while self.end < self.buf.len() && !self.ended {
                if self.frame_left == Some(0) {
                    match self.header_at(self.next) {
                        Some(len) => {
                            self.headers.push(self.next);
                            self.next += 9;
                            self.frame_left = Some(len);
                        }
                        None => self.ended = true,
                    }
                    continue;
                }
                let room = (self.buf.len() - self.end) as u64;
                let want = self.frame_left.map_or(room, |l| l.min(room)).min(self.len.saturating_sub(self.next));
                if want == 0 {
                    self.ended = true;
                    break;
                }
                let k = match self.src.read_at(&mut self.buf[self.end..self.end + want as usize], self.next) {
                    Ok(0) | Err(_) => {
                        self.ended = true;
                        break;
                    }
                    Ok(k) => k,
                };
                if self.runs.last().is_none_or(|&(at, off)| off + (self.end - at) as u64 != self.next) {
                    self.runs.push((self.end, self.next));
                }
                self.end += k;
                self.next += k as u64;
                if let Some(l) = self.frame_left.as_mut() {
                    *l -= k as u64;
                }
            }
        }
        &self.buf[self.pos..self.end]
    }
}

/// The header of the first frame at or after `from` whose length leads to three more frame headers in a row (or
/// to the end of the file): a chain that chance does not make. `None` if none begins within `SEARCH_MAX` bytes.
fn find_frame(src: &dyn ReadAt, len: u64, from: u64) -> Option<u64> {
    let mut raw = vec![0u8; SEARCH_MAX];
    let n = src.read_at(&mut raw, from).ok()?;
    let probe = Window {
        src,
        len,
        buf: Vec::new(),
        pos: 0,
        end: 0,
        runs: Vec::new(),
        next: 0,
        frame_left: None,
        headers: Vec::new(),
        ended: true,
    };
    raw[..n].iter().enumerate().filter(|&(_, &b)| b == 0x95).map(|(i, _)| from + i as u64).find(|&at| {
        let mut h = at;
        for _ in 0..4 {
            match probe.header_at(h) {
                Some(l) => h += 9 + l,
                None => return false,
            }
            // The last frame ends the file.
            if h == len {
                return true;
            }
        }
        true
    })
}

/// Bytes a record can need past its EMPTY_DICT, and then some.
const LOOKAHEAD: usize = MAX_SHAPE_LEN + 16;

/// The helper thread: finds the first record at or after `from` that a layout matches, then reads records until
/// something else comes or it is told to stop. `None` when it found no record to start at.
fn help<H: RecordHelper>(
    mut helper: H,
    shapes: &[Shape],
    memo: &[Plain],
    split: &Split,
    from: u64,
    framed: bool,
    shared: &Shared,
) -> Option<Helped<H>> {
    let src = &*split.source;
    let (next, frame_left) = if framed { (find_frame(src, split.len, from)?, Some(0)) } else { (from, None) };
    let mut w = Window {
        src,
        len: split.len,
        buf: vec![0; CHUNK],
        pos: 0,
        end: 0,
        runs: Vec::new(),
        next,
        frame_left,
        headers: Vec::new(),
        ended: false,
    };
    let mut last = 0;
    // The start: an EMPTY_DICT followed by the bytes of a known layout.
    let mut searched = 0;
    loop {
        if searched > SEARCH_MAX || shared.stop.load(Ordering::Relaxed) {
            return None;
        }
        let rest = w.ensure(LOOKAHEAD);
        if rest.len() < 2 {
            return None;
        }
        let upto = if rest.len() > LOOKAHEAD { rest.len() - LOOKAHEAD } else { rest.len() };
        match rest[..upto].iter().position(|&b| b == b'}') {
            Some(i) => match first_match(shapes, last, &rest[i + 1..]) {
                Some(s) => {
                    last = s;
                    w.pos += i;
                    break;
                }
                None => {
                    w.pos += i + 1;
                    searched += i + 1;
                }
            },
            None => {
                w.pos += upto;
                searched += upto;
            }
        }
    }
    let start = w.offset();
    let start_frame = w.headers.iter().rev().find(|&&h| h < start).copied();
    shared.start.store(start, Ordering::Release);

    let mut stored = Vec::new();
    let mut stores = 0u32;
    let mut put_base = None;
    let mut appends = Vec::new();
    'records: while !shared.stop.load(Ordering::Relaxed) {
        let rest = w.ensure(LOOKAHEAD);
        match rest.first() {
            Some(b'}') => {}
            Some(b'e') if rest.get(1) == Some(&b'(') => {
                appends.push((stored.len() as u32, w.offset()));
                w.pos += 2;
                continue;
            }
            _ => break,
        }
        let body = &rest[1..];
        let Some(i) = first_match(shapes, last, body) else { break };
        let shape = &shapes[i];
        let store = match shape.slot {
            Slot::None => false,
            Slot::Next => true,
            Slot::Put1 | Slot::Put4 => {
                let idx = if shape.slot == Slot::Put1 { Arg::Ref1 } else { Arg::Ref4 }.memo_index(body, 1) as u32;
                let Some(base) = idx.checked_sub(stores) else { break };
                if *put_base.get_or_insert(base) != base {
                    break;
                }
                true
            }
        };
        if !helper.begin(shape.first_key) {
            break;
        }
        for f in shape.fields.iter() {
            let v = match f.arg {
                Arg::Ref1 | Arg::Ref4 => {
                    let idx = f.arg.memo_index(body, f.at as usize);
                    match memo.get(idx) {
                        Some(p) => p.value(),
                        // Stored after the copy was made (a stack first seen after the layouts were learnt): this
                        // thread will know it by the time the records are taken.
                        None => u32::try_from(idx).ok().map(|i| Value::Custom(DEFERRED, i)),
                    }
                }
                arg => arg.value(body, f.at as usize),
            };
            if !v.is_some_and(|v| helper.field(f.key, &v)) {
                helper.abandon();
                break 'records;
            }
        }
        if !helper.end() {
            helper.abandon();
            break;
        }
        last = i;
        stored.push(store);
        stores += store as u32;
        w.pos += 1 + shape.len;
    }
    let end = w.offset();
    Some(Helped { helper, start, start_frame, end, stored, put_base, appends, source: split.source.clone() })
}
