//! A safe, streaming, non-executing pickle reader.
//!
//! Pickles are programs for a small stack machine; Python's `pickle.load` will import and call anything a file
//! names. This reader implements only the data opcodes: every opcode that would import a name or call an object
//! (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1/2/4) and the
//! out-of-band buffer opcodes are refused with the opcode's name and byte offset.
//!
//! Two things make it fast and frugal on multi-GB memory snapshots:
//! - the input is streamed through a fixed buffer, never held whole;
//! - a [`Builder`] sees each dict and list the moment its items are complete and may replace it by a compact
//!   value of its own ([`Value::Custom`]) — the snapshot reader turns frame dicts into interned frame ids and trace
//!   entries into plain structs, so no generic tree of millions of small dicts is ever built;
//! - dicts the builder calls records (trace entries) are streamed to it field by field, and once a record's byte
//!   layout is known, later records with the same layout are read at fixed offsets (`RecordShapes`); a list of
//!   consecutive records is kept as a run of their numbers. Every fast path gives up to the generic machine on
//!   anything it does not expect, and the generic machine is the one that reports errors.
//!
//! Memo references share values (an `Rc` clone, or a copy of a small inline value), never deep copies, so a
//! "billion laughs" pickle costs memory linear in its size. Container nesting is capped.

use std::cell::RefCell;
use std::io::Read;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::timeline::stacks::{StrId, Strings};

/// Containers nested deeper than this are refused. A memory snapshot nests at most ~8 levels.
pub const MAX_DEPTH: u32 = 256;
/// The pickler emits list/dict items in batches of this size; a container closed with a full batch may receive more.
const BATCH: usize = 1000;
const NO_SLOT: u32 = u32::MAX;
const BUF_SIZE: usize = 1 << 20;
/// The fast path only looks at what is already buffered; it tops the buffer up to this much first.
const FAST_WINDOW: usize = 64 << 10;

/// A read position in a byte slice; every read returns `None` past the end (the fast path then gives up).
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }
    #[inline]
    fn at(&self, k: usize) -> Option<u8> {
        self.buf.get(self.pos + k).copied()
    }
    #[inline]
    fn next(&mut self) -> Option<u8> {
        let b = self.buf.get(self.pos).copied()?;
        self.pos += 1;
        Some(b)
    }
    #[inline]
    fn slice(&self, from: usize, n: usize) -> Option<&[u8]> {
        self.buf.get(self.pos + from..self.pos + from + n)
    }
    #[inline]
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
}

/// A value on the pickle machine's stack. 16 bytes (a test holds it): inline scalars, thin `Rc`s for the rest.
#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer that does not fit in i64: little-endian two's complement bytes, as LONG1/LONG4 store them.
    BigInt(Rc<Vec<u8>>),
    Float(f64),
    Str(StrId),
    Bytes(Rc<Vec<u8>>),
    /// A 2-tuple of small ints, the shape of every pool id; kept inline to save an allocation per trace entry.
    IntPair(i32, i32),
    Tuple(Rc<Tuple>),
    List(Rc<RefCell<List>>),
    /// A dict: keys and values interleaved, `[k0, v0, k1, v1, ...]`.
    Dict(Rc<RefCell<Dict>>),
    /// An empty list not yet given items; the number is its memo slot (or none). Materialised on first use.
    PendingList(u32),
    /// An empty dict not yet given items (see `PendingList`).
    PendingDict(u32),
    /// A value the [`Builder`] made from a closed container: `(kind, id)`, meaning is the builder's.
    Custom(u8, u32),
}

#[derive(Debug, Default)]
pub struct Tuple {
    pub depth: u32,
    pub items: Vec<Value>,
}

#[derive(Debug, Default)]
pub struct List {
    pub depth: u32,
    items: Vec<Value>,
    /// A list of nothing but `Custom(kind, first)`, `Custom(kind, first + 1)`, … is kept as that run, with
    /// `items` empty: a device's million trace entries would otherwise be 16 MB of items saying 0, 1, 2, …
    run: Option<Run>,
}

/// `len` values `Custom(kind, first + i)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub kind: u8,
    pub first: u32,
    pub len: u32,
}

impl Run {
    /// The run `items` are, if they are one.
    fn of(items: &[Value]) -> Option<Run> {
        let Some(&Value::Custom(kind, first)) = items.first() else { return None };
        let len = u32::try_from(items.len()).ok()?;
        first.checked_add(len)?;
        let consecutive =
            items.iter().zip(first..).all(|(v, i)| matches!(*v, Value::Custom(k, j) if k == kind && j == i));
        consecutive.then_some(Run { kind, first, len })
    }

    fn values(self) -> impl Iterator<Item = Value> {
        (self.first..self.first + self.len).map(move |i| Value::Custom(self.kind, i))
    }
}

impl List {
    fn new(depth: u32, stack: &mut Vec<Value>, at: usize) -> List {
        match Run::of(&stack[at..]) {
            Some(run) => {
                stack.truncate(at);
                List { depth, items: Vec::new(), run: Some(run) }
            }
            None => List { depth, items: stack.split_off(at), run: None },
        }
    }

    /// Moves `stack[at..]` to the end of the list.
    fn append(&mut self, stack: &mut Vec<Value>, at: usize) {
        let new = &stack[at..];
        match self.run {
            Some(ref mut r) => {
                match Run::of(new) {
                    Some(n) if n.kind == r.kind && n.first == r.first + r.len => {
                        r.len += n.len;
                        stack.truncate(at);
                        return;
                    }
                    _ => {}
                }
                let r = self.run.take().expect("matched");
                self.items = r.values().collect();
            }
            None if self.items.is_empty() => {
                if let Some(run) = Run::of(new) {
                    self.run = Some(run);
                    stack.truncate(at);
                    return;
                }
            }
            None => {}
        }
        self.items.extend(stack.drain(at..));
    }

    /// The list as a run of `Custom` values, if it is kept as one (see [`Value::custom_run`]).
    pub fn run(&self) -> Option<Run> {
        self.run
    }
}

#[derive(Debug, Default)]
pub struct Dict {
    pub depth: u32,
    /// Keys and values interleaved.
    pub items: Vec<Value>,
}

impl Value {
    fn depth(&self) -> u32 {
        match self {
            Value::Tuple(t) => t.depth,
            Value::List(l) => l.borrow().depth,
            Value::Dict(d) => d.borrow().depth,
            Value::PendingList(_) | Value::PendingDict(_) => 1,
            _ => 0,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::BigInt(_) => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a str",
            Value::Bytes(_) => "bytes",
            Value::IntPair(..) | Value::Tuple(_) => "a tuple",
            Value::List(_) | Value::PendingList(_) => "a list",
            Value::Dict(_) | Value::PendingDict(_) => "a dict",
            Value::Custom(..) => "a structured record",
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// The value as u64: non-negative ints, including those wider than i64 that still fit in 64 bits.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) if *i >= 0 => Some(*i as u64),
            Value::BigInt(bytes) => {
                let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
                if negative {
                    return None;
                }
                let significant = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
                if significant > 8 {
                    return None;
                }
                let mut le = [0u8; 8];
                le[..significant].copy_from_slice(&bytes[..significant]);
                Some(u64::from_le_bytes(le))
            }
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    pub fn as_str_id(&self) -> Option<StrId> {
        match self {
            Value::Str(s) => Some(*s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// Items of a list-like value (list, tuple, pending empty list); `None` for anything else.
    pub fn list_items(&self) -> Option<ListItems<'_>> {
        match self {
            Value::List(l) => {
                let l = l.borrow();
                Some(match l.run {
                    Some(r) => ListItems::Owned(r.values().collect()),
                    None => ListItems::Borrowed(l),
                })
            }
            Value::Tuple(t) => Some(ListItems::Slice(&t.items)),
            Value::PendingList(_) => Some(ListItems::Slice(&[])),
            _ => None,
        }
    }

    /// A list of consecutive `Custom` values, told without listing them: `Some` only for a list the reader kept
    /// as a run.
    pub fn custom_run(&self) -> Option<Run> {
        match self {
            Value::List(l) => l.borrow().run,
            _ => None,
        }
    }

    /// Interleaved key/value items of a dict (or a pending empty dict); `None` for anything else.
    pub fn dict_items(&self) -> Option<ListItems<'_>> {
        match self {
            Value::Dict(d) => Some(ListItems::BorrowedDict(d.borrow())),
            Value::PendingDict(_) => Some(ListItems::Slice(&[])),
            _ => None,
        }
    }
}

/// Borrowed items of a container.
pub enum ListItems<'a> {
    Borrowed(std::cell::Ref<'a, List>),
    BorrowedDict(std::cell::Ref<'a, Dict>),
    Slice(&'a [Value]),
    /// The items of a list kept as a run.
    Owned(Vec<Value>),
}

impl std::ops::Deref for ListItems<'_> {
    type Target = [Value];
    fn deref(&self) -> &[Value] {
        match self {
            ListItems::Borrowed(l) => &l.items,
            ListItems::BorrowedDict(d) => &d.items,
            ListItems::Slice(s) => s,
            ListItems::Owned(v) => v,
        }
    }
}

/// Looks a key up in interleaved dict items.
pub fn dict_get(items: &[Value], key: StrId) -> Option<&Value> {
    items.chunks_exact(2).find(|kv| matches!(kv[0], Value::Str(k) if k == key)).map(|kv| &kv[1])
}

/// Hooks that see containers as they close and may replace them with compact values.
pub trait Builder {
    /// `items` are the dict's keys and values interleaved. Return `Ok(Some(v))` to stand `v` in for the dict,
    /// `Ok(None)` to keep a generic dict, `Err(message)` if the dict has the expected shape but bad contents.
    fn close_dict(&mut self, strings: &Strings, items: &[Value]) -> Result<Option<Value>, String>;
    /// As `close_dict`, for a list.
    fn close_list(&mut self, items: &[Value]) -> Option<Value>;
    /// Whether `Custom(kind, _)` values are pure functions of their container's items (interned frames and
    /// stacks are; a trace entry, which the builder records as a side effect, is not). Pure values may be
    /// replayed from the span cache instead of being decoded again.
    fn is_pure(&self, _kind: u8) -> bool {
        false
    }
    /// Records: dicts the builder would rather take one field at a time than as a collected item list (millions
    /// of trace entries). Called with a dict's first key; `true` starts a record and sends its fields to
    /// [`Builder::record_field`]. Whatever a record does not finish is forgotten at the next `record_begin`.
    fn record_begin(&mut self, _first_key: StrId) -> bool {
        false
    }
    /// One field of the open record; `false` if the builder cannot take it as is. The reader then gives up the
    /// record and hands the same dict to [`Builder::close_dict`] instead, which says what is wrong with it.
    fn record_field(&mut self, _key: StrId, _value: &Value) -> bool {
        false
    }
    /// Closes the record, as `close_dict` would close the same dict; `None` gives it up as `record_field` does.
    fn record_end(&mut self) -> Option<Value> {
        None
    }
    /// How many records the builder expects (its guess from the file size; 0: no idea), so the memo can be
    /// sized once instead of being copied as it doubles.
    fn expected_records(&self) -> usize {
        0
    }
    /// Where the builder's own output stands, for [`Builder::rewind`].
    fn mark(&self) -> usize {
        0
    }
    /// Forgets what the builder made since `mark`: the fast path gave up a container whose nested records the
    /// builder had already closed, and the generic path is about to read them again.
    fn rewind(&mut self, _mark: usize) {}
}

/// A builder that keeps everything generic.
pub struct PlainBuilder;

impl Builder for PlainBuilder {
    fn close_dict(&mut self, _: &Strings, _: &[Value]) -> Result<Option<Value>, String> {
        Ok(None)
    }
    fn close_list(&mut self, _: &[Value]) -> Option<Value> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error("the file is empty; expected a pickle (it starts with byte 0x80, the PROTO opcode)")]
    Empty,
    #[error("byte 0: expected a pickle (first byte 0x80, the PROTO opcode), found {found}; this is not a pickle file")]
    NotAPickle { found: String },
    #[error(
        "byte {offset}: opcode {name} (0x{op:02x}) would import or call Python code; oomdoc never executes a \
         pickle, and a genuine memory snapshot holds only plain data"
    )]
    Forbidden { offset: u64, op: u8, name: &'static str },
    #[error("byte {offset}: unknown pickle opcode 0x{op:02x}; the file is corrupt or not a pickle")]
    UnknownOpcode { offset: u64, op: u8 },
    #[error("the file ends at byte {offset} inside {what}: it is truncated")]
    Truncated { offset: u64, what: &'static str },
    #[error("byte {offset}: {message}")]
    Malformed { offset: u64, message: String },
    #[error(
        "byte {offset}: containers nested more than {MAX_DEPTH} levels deep (a memory snapshot nests fewer than \
         10); refusing a corrupt or hostile pickle"
    )]
    TooDeep { offset: u64 },
    #[error("read error at byte {offset}: {source}")]
    Io { offset: u64, source: std::io::Error },
}

/// Buffered input that hands out slices and keeps track of the file offset.
struct Input<R> {
    src: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// File offset of `buf[0]`.
    base: u64,
    eof: bool,
    progress: Option<Box<dyn FnMut(u64) + 'static>>,
}

impl<R: Read> Input<R> {
    fn new(src: R) -> Self {
        Input { src, buf: vec![0; BUF_SIZE], pos: 0, end: 0, base: 0, eof: false, progress: None }
    }

    #[inline]
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes at least `n` bytes available at `pos`, unless the input ends first. Returns whether it could.
    #[cold]
    fn fill(&mut self, n: usize) -> Result<bool, PickleError> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if n > self.buf.len() {
            // A long string: grow step by step so a lying length prefix cannot make us allocate more than the
            // file actually holds (plus one buffer).
            let want = n.min(self.buf.len().saturating_mul(2)).max(self.buf.len());
            self.buf.resize(want, 0);
        }
        while self.end < n && !self.eof {
            if self.end == self.buf.len() {
                let grow = self.buf.len().min(n - self.end).max(BUF_SIZE);
                self.buf.resize(self.buf.len() + grow, 0);
            }
            let read = self.src.read(&mut self.buf[self.end..]);
            match read {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PickleError::Io { offset: self.base + self.end as u64, source: e }),
            }
        }
        if let Some(p) = self.progress.as_mut() {
            p(self.base + self.end as u64);
        }
        Ok(self.end >= n)
    }

    #[inline]
    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], PickleError> {
        if self.end - self.pos < n && !self.fill(n)? {
            return Err(PickleError::Truncated { offset: self.base + self.end as u64, what });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn byte(&mut self, what: &'static str) -> Result<u8, PickleError> {
        if self.pos < self.end {
            let b = self.buf[self.pos];
            self.pos += 1;
            return Ok(b);
        }
        Ok(self.take(1, what)?[0])
    }

    fn line(&mut self, what: &'static str) -> Result<Vec<u8>, PickleError> {
        let mut out = Vec::new();
        loop {
            let b = self.byte(what)?;
            if b == b'\n' {
                return Ok(out);
            }
            out.push(b);
            if out.len() > 1 << 20 {
                return Err(PickleError::Malformed {
                    offset: self.offset(),
                    message: format!("a text-protocol {what} longer than 1 MiB"),
                });
            }
        }
    }
}

/// What [`read`] returns: the top-level value and the string table its `Str` values index.
pub struct Parsed {
    pub value: Value,
    pub strings: Strings,
    pub protocol: u8,
    pub bytes_read: u64,
}

/// Memo: dense while the pickler numbers entries 0, 1, 2, … (it always does), sparse otherwise so a hostile
/// index like 0xFFFFFFF0 costs one map entry, not 64 GB.
///
/// A dense slot is 4 bytes: an index into `values`, or (with `SPAN_BIT`) into `span_values`, where the memo stores
/// of a cached span live once for all its occurrences; or the value itself, for the values a trace stores by the
/// million: a str (torch writes each entry's `compile_context` afresh), and the builder's `Custom` values of two
/// kinds (trace entries, frame lists). A snapshot whose frames are not shared has ~30 memo slots per trace entry;
/// at 16 bytes a slot that alone was 500 MB for a million entries.
#[derive(Default)]
struct Memo {
    slots: Vec<u32>,
    values: Vec<Value>,
    span_values: Vec<Value>,
    sparse: FxHashMap<u32, Value>,
    /// A slot was stored twice (no pickler does that): memo references in equal bytes may then mean different
    /// values, so the span cache turns itself off.
    overwritten: bool,
    /// More values than a slot can index (2³⁰): reported as an error when the pickle ends.
    overflow: bool,
    /// The kind of the `Custom` values held in slots tagged `INLINE_A` (the first kind stored) and `INLINE_B`.
    inline_kind: Option<u8>,
    inline_kind_b: Option<u8>,
    /// Index in `values` of the one `PendingDict` that the slots of records still being read point to.
    pending_at: Option<u32>,
}

/// A slot's top two bits say what the rest is: an index into `values` (00), `Custom(inline_kind, id)` (01), an
/// index into `span_values` (10), or (11) with the next bit clear `Custom(inline_kind_b, id)`, set a `Str`.
const TAG: u32 = 3 << 30;
const SPAN_BIT: u32 = 2 << 30;
const INLINE_BIT: u32 = 1 << 30;
const INLINE_SMALL: u32 = 3 << 30;
const SMALL_STR: u32 = 1 << 29;
const SMALL_MAX: u32 = 1 << 29;

/// A memo value: stored in a table, or made from its slot.
enum MemoRef<'a> {
    Stored(&'a Value),
    Inline(Value),
}

impl std::ops::Deref for MemoRef<'_> {
    type Target = Value;
    #[inline]
    fn deref(&self) -> &Value {
        match self {
            MemoRef::Stored(v) => v,
            MemoRef::Inline(v) => v,
        }
    }
}

impl Memo {
    #[inline]
    fn dense_len(&self) -> usize {
        self.slots.len()
    }

    /// Stores the next slot's value: in the slot itself when it is a str or a `Custom` of an inline kind.
    #[inline]
    fn push(&mut self, v: Value) {
        match v {
            Value::Custom(kind, id) => return self.push_custom(kind, id),
            Value::Str(id) if id < SMALL_MAX => return self.push_slot(INLINE_SMALL | SMALL_STR | id),
            _ => {}
        }
        if self.values.len() >= INLINE_BIT as usize {
            self.overflow = true;
            return;
        }
        if self.values.len() == self.values.capacity() {
            self.values.reserve(self.values.capacity().max(1024));
            crate::huge_pages::advise(&self.values);
        }
        let at = self.values.len() as u32;
        self.values.push(v);
        self.push_slot(at);
    }

    #[inline]
    fn push_slot(&mut self, s: u32) {
        if self.slots.len() >= INLINE_BIT as usize {
            self.overflow = true;
            return;
        }
        if self.slots.len() == self.slots.capacity() {
            self.grow_slots();
        }
        self.slots.push(s);
    }

    /// Doubles the slot table; a large one goes on huge pages.
    #[cold]
    fn grow_slots(&mut self) {
        self.slots.reserve(self.slots.capacity().max(1024));
        crate::huge_pages::advise(&self.slots);
    }

    #[inline]
    fn put(&mut self, idx: u32, v: Value) {
        let i = idx as usize;
        if i < self.slots.len() {
            self.overwritten = true;
            if self.values.len() >= INLINE_BIT as usize {
                self.overflow = true;
                return;
            }
            self.slots[i] = self.values.len() as u32;
            self.values.push(v);
        } else if i == self.slots.len() {
            self.push(v);
        } else {
            self.sparse.insert(idx, v);
        }
    }

    /// Stores `Custom(kind, id)` in the slot itself when it fits, as it does for every trace entry and frame list:
    /// a million entries then cost 4 bytes each here instead of 20.
    #[inline]
    fn push_custom(&mut self, kind: u8, id: u32) {
        if let Some(s) = self.custom_slot(kind, id) {
            self.push_slot(s);
        }
    }

    /// The slot word for `Custom(kind, id)`: the value itself when it fits, else an index into `values`.
    #[inline]
    fn custom_slot(&mut self, kind: u8, id: u32) -> Option<u32> {
        let a = *self.inline_kind.get_or_insert(kind);
        if kind == a && id < INLINE_BIT {
            return Some(INLINE_BIT | id);
        }
        let b = *self.inline_kind_b.get_or_insert(kind);
        if kind == b && id < SMALL_MAX {
            return Some(INLINE_SMALL | id);
        }
        if self.values.len() >= INLINE_BIT as usize {
            self.overflow = true;
            return None;
        }
        let at = self.values.len() as u32;
        self.values.push(Value::Custom(kind, id));
        Some(at)
    }

    /// Takes the next slot for a record whose fields are still being read; [`Self::fill_pending`] gives it its
    /// value. Meanwhile a reference to it reads a `PendingDict`, as it would on the ordinary path.
    #[inline]
    fn push_pending(&mut self) {
        let at = match self.pending_at {
            Some(at) => at,
            None => {
                if self.values.len() >= INLINE_BIT as usize {
                    self.overflow = true;
                    return;
                }
                self.values.push(Value::PendingDict(NO_SLOT));
                let at = self.values.len() as u32 - 1;
                self.pending_at = Some(at);
                at
            }
        };
        self.push_slot(at);
    }

    #[inline]
    fn fill_pending(&mut self, idx: u32, v: &Value) {
        let word = match *v {
            Value::Custom(kind, id) => self.custom_slot(kind, id),
            _ => {
                if self.values.len() >= INLINE_BIT as usize {
                    self.overflow = true;
                    return;
                }
                self.values.push(v.clone());
                Some(self.values.len() as u32 - 1)
            }
        };
        if let (Some(w), Some(s)) = (word, self.slots.get_mut(idx as usize)) {
            *s = w;
        }
    }

    #[inline]
    fn dense_get(&self, i: usize) -> Option<MemoRef<'_>> {
        let s = *self.slots.get(i)?;
        match s & TAG {
            0 => self.values.get(s as usize).map(MemoRef::Stored),
            INLINE_BIT => Some(MemoRef::Inline(Value::Custom(self.inline_kind.unwrap_or(0), s & !TAG))),
            SPAN_BIT => self.span_values.get((s & !TAG) as usize).map(MemoRef::Stored),
            _ if s & SMALL_STR != 0 => Some(MemoRef::Inline(Value::Str(s & (SMALL_MAX - 1)))),
            _ => Some(MemoRef::Inline(Value::Custom(self.inline_kind_b.unwrap_or(0), s & (SMALL_MAX - 1)))),
        }
    }

    #[inline]
    fn get(&self, idx: u32) -> Option<MemoRef<'_>> {
        self.dense_get(idx as usize).or_else(|| self.sparse.get(&idx).map(MemoRef::Stored))
    }

    /// Only slots holding a container still being filled are ever updated, and those are never span or inline
    /// values.
    fn get_mut(&mut self, idx: u32) -> Option<&mut Value> {
        match self.slots.get(idx as usize) {
            Some(&s) if s & TAG == 0 => self.values.get_mut(s as usize),
            Some(_) => None,
            None => self.sparse.get_mut(&idx),
        }
    }

    fn mark(&self) -> (usize, usize) {
        (self.slots.len(), self.values.len())
    }

    fn rewind(&mut self, mark: (usize, usize)) {
        self.slots.truncate(mark.0);
        self.values.truncate(mark.1);
        if self.pending_at.is_some_and(|at| at as usize >= mark.1) {
            self.pending_at = None;
        }
    }

    /// The values stored in dense slots from `from` on.
    fn stored_since(&self, from: usize) -> impl Iterator<Item = MemoRef<'_>> {
        (from..self.slots.len()).filter_map(|i| self.dense_get(i))
    }

    fn len(&self) -> usize {
        self.slots.len() + self.sparse.len()
    }
}

struct Machine<'b, B: Builder> {
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    strings: Strings,
    builder: &'b mut B,
    /// Work stack of the fast path (see `fast_container`).
    scratch: Vec<Value>,
    spans: SpanCache,
    /// Lists of memo references already decoded, by the bytes of their references (see `ref_list`).
    refs: FxHashMap<Box<[u8]>, Value>,
    refs_len: usize,
    records: RecordShapes,
}

/// Containers whose bytes hold only memo references and numbers decode to the same value every time the same
/// bytes recur (memo references are stable in a pickle whose slots are each written once). torch writes a fresh
/// frame dict and a fresh frame list per trace entry when its frames are not shared objects, so the same few
/// thousand stacks recur as identical byte spans hundreds of thousands of times: hashing the span and replaying
/// its memo stores is several times faster than decoding 30 dicts again.
#[derive(Default)]
struct SpanCache {
    index: FxHashMap<Box<[u8]>, u32>,
    entries: Vec<SpanEntry>,
    key_bytes: usize,
}

struct SpanEntry {
    value: Value,
    /// The memo stores made inside the span, in `Memo::span_values`.
    memo: std::ops::Range<u32>,
}

/// Caps what a hostile file can make the cache hold.
const SPAN_CACHE_MAX_BYTES: usize = 64 << 20;
/// Caps the key bytes the list cache keeps.
const REF_CACHE_MAX_BYTES: usize = 64 << 20;
/// The bytes a memo reference takes, by opcode (BINGET, LONG_BINGET); 0 for any other opcode.
const REF_WIDTH: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'h' as usize] = 2;
    t[b'j' as usize] = 5;
    t
};

/// What `Machine::ref_list` found after an EMPTY_LIST.
enum RefList {
    /// Not a list of memo references in the next slot.
    No,
    /// One whose references made this value before: stored and consumed.
    Known(Value),
    /// One not seen before: read it, then `remember_refs` its key bytes (this range of the buffer).
    New(std::ops::Range<usize>),
}
const SPAN_MAX_LEN: usize = 16 << 10;

/// What `pure_span_end` does on each opcode: skip this many argument bytes, or one of the special cases.
const SPAN_OTHER: u8 = 0xff;
const SPAN_OPEN: u8 = 0xfe;
const SPAN_CLOSE: u8 = 0xfd;
const SPAN_MARK: u8 = 0xfc;
const SPAN_LONG1: u8 = 0xfb;
const SPAN_OPS: [u8; 256] = {
    let mut t = [SPAN_OTHER; 256];
    t[0x94] = 0; // MEMOIZE
    t[b'N' as usize] = 0;
    t[0x88] = 0; // NEWTRUE
    t[0x89] = 0; // NEWFALSE
    t[b'h' as usize] = 1; // BINGET
    t[b'K' as usize] = 1; // BININT1
    t[b'M' as usize] = 2; // BININT2
    t[b'j' as usize] = 4; // LONG_BINGET
    t[b'J' as usize] = 4; // BININT
    t[0x8a] = SPAN_LONG1;
    t[b'}' as usize] = SPAN_OPEN;
    t[b']' as usize] = SPAN_OPEN;
    t[b'(' as usize] = SPAN_MARK;
    t[b'u' as usize] = SPAN_CLOSE;
    t[b'e' as usize] = SPAN_CLOSE;
    t[b's' as usize] = SPAN_CLOSE;
    t[b'a' as usize] = SPAN_CLOSE;
    t
};

/// The end (exclusive) of the container that starts at `buf[start]` (`}` or `]`), if every opcode in it is a
/// container, mark, memo store, memo reference or number: no new strings, nothing the memo could disagree on.
fn pure_span_end(buf: &[u8], start: usize) -> Option<usize> {
    // (is_dict, marked) of the open containers.
    let mut open: [(bool, bool); 8] = [(false, false); 8];
    let mut depth = 0usize;
    let mut pos = start;
    let limit = buf.len().min(start + SPAN_MAX_LEN);
    while pos < limit {
        let op = buf[pos];
        pos += 1;
        let what = SPAN_OPS[op as usize];
        if what < SPAN_LONG1 {
            pos += what as usize;
            continue;
        }
        match what {
            SPAN_OPEN => {
                if depth == open.len() {
                    return None;
                }
                open[depth] = (op == b'}', false);
                depth += 1;
            }
            SPAN_MARK => {
                let top = open.get_mut(depth.checked_sub(1)?)?;
                if top.1 {
                    return None;
                }
                top.1 = true;
            }
            SPAN_LONG1 => pos += 1 + *buf.get(pos)? as usize,
            SPAN_CLOSE => {
                let (is_dict, marked) = open[depth.checked_sub(1)?];
                let closes_dict = op == b'u' || op == b's';
                let needs_mark = op == b'u' || op == b'e';
                if is_dict != closes_dict || marked != needs_mark {
                    return None;
                }
                depth -= 1;
                if depth == 0 {
                    return (pos <= buf.len()).then_some(pos);
                }
            }
            _ => return None,
        }
    }
    None
}

/// Reads one pickle from `src`, handing closed containers to `builder`.
pub fn read<R: Read, B: Builder>(
    src: R,
    builder: &mut B,
    strings: Strings,
    progress: Option<Box<dyn FnMut(u64)>>,
) -> Result<Parsed, PickleError> {
    let mut input = Input::new(src);
    input.progress = progress;
    if !input.fill(2)? {
        if input.end == 0 {
            return Err(PickleError::Empty);
        }
        return Err(PickleError::NotAPickle { found: describe_byte(input.buf[0]) });
    }
    if input.buf[0] != 0x80 {
        return Err(PickleError::NotAPickle { found: describe_byte(input.buf[0]) });
    }
    let protocol = input.buf[1];
    if protocol > 5 {
        return Err(PickleError::Malformed {
            offset: 1,
            message: format!("pickle protocol {protocol} is newer than any known (0–5)"),
        });
    }
    let mut memo = Memo::default();
    memo.slots.reserve(builder.expected_records());
    crate::huge_pages::advise(&memo.slots);
    crate::huge_pages::populate_soon(&memo.slots, memo.slots.capacity() * 4);
    let mut m = Machine {
        stack: Vec::with_capacity(64),
        marks: Vec::new(),
        memo,
        strings,
        builder,
        scratch: Vec::new(),
        spans: SpanCache::default(),
        refs: FxHashMap::default(),
        refs_len: 0,
        records: RecordShapes::default(),
    };
    let value = m.run(&mut input)?;
    if m.memo.overflow {
        return Err(PickleError::Malformed {
            offset: input.offset(),
            message: "more than 2^30 memo entries; this reader's limit".into(),
        });
    }
    Ok(Parsed { value, strings: m.strings, protocol, bytes_read: input.offset() })
}

fn describe_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("0x{b:02x} ('{}')", b as char)
    } else {
        format!("0x{b:02x}")
    }
}

fn forbidden_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        _ => return None,
    })
}

impl<B: Builder> Machine<'_, B> {
    fn err(offset: u64, message: impl Into<String>) -> PickleError {
        PickleError::Malformed { offset, message: message.into() }
    }

    #[inline]
    fn pop(&mut self, off: u64, what: &str) -> Result<Value, PickleError> {
        self.stack.pop().ok_or_else(|| Self::err(off, format!("{what} needs a value but the stack is empty")))
    }

    #[inline]
    fn pop_mark(&mut self, off: u64, what: &str) -> Result<usize, PickleError> {
        let m = self.marks.pop().ok_or_else(|| Self::err(off, format!("{what} without a preceding MARK")))?;
        if m > self.stack.len() {
            return Err(Self::err(off, format!("{what}: MARK points past the stack")));
        }
        Ok(m)
    }

    fn run<R: Read>(&mut self, input: &mut Input<R>) -> Result<Value, PickleError> {
        loop {
            let off = input.offset();
            let op = input.byte("an opcode")?;
            match op {
                0x80 => {
                    input.byte("PROTO")?;
                }
                0x95 => {
                    input.take(8, "FRAME")?;
                }
                b'.' => {
                    let v = self.pop(off, "STOP")?;
                    return Ok(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'J' => {
                    let b = input.take(4, "BININT")?;
                    self.stack.push(Value::Int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64));
                }
                b'K' => {
                    let b = input.byte("BININT1")?;
                    self.stack.push(Value::Int(b as i64));
                }
                b'M' => {
                    let b = input.take(2, "BININT2")?;
                    self.stack.push(Value::Int(u16::from_le_bytes([b[0], b[1]]) as i64));
                }
                0x8a => {
                    let n = input.byte("LONG1")? as usize;
                    let b = input.take(n, "LONG1")?;
                    self.stack.push(long_value(b));
                }
                0x8b => {
                    let b = input.take(4, "LONG4")?;
                    let n = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if n < 0 {
                        return Err(Self::err(off, "LONG4 with a negative length"));
                    }
                    let b = input.take(n as usize, "LONG4")?;
                    self.stack.push(long_value(b));
                }
                b'G' => {
                    let b = input.take(8, "BINFLOAT")?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.stack.push(Value::Float(f64::from_be_bytes(a)));
                }
                0x8c => {
                    let n = input.byte("SHORT_BINUNICODE")? as usize;
                    let b = input.take(n, "SHORT_BINUNICODE")?;
                    let id = self.strings.intern_bytes(b);
                    self.stack.push(Value::Str(id));
                }
                b'X' => {
                    let b = input.take(4, "BINUNICODE")?;
                    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                    let b = input.take(n, "BINUNICODE")?;
                    let id = self.strings.intern_bytes(b);
                    self.stack.push(Value::Str(id));
                }
                0x8d => {
                    let n = len8(input, "BINUNICODE8")?;
                    let b = input.take(n, "BINUNICODE8")?;
                    let id = self.strings.intern_bytes(b);
                    self.stack.push(Value::Str(id));
                }
                // Python 2 `str`: bytes on the wire; a snapshot never has them, decode leniently as text.
                b'U' => {
                    let n = input.byte("SHORT_BINSTRING")? as usize;
                    let b = input.take(n, "SHORT_BINSTRING")?;
                    let id = self.strings.intern_bytes(b);
                    self.stack.push(Value::Str(id));
                }
                b'T' => {
                    let b = input.take(4, "BINSTRING")?;
                    let n = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if n < 0 {
                        return Err(Self::err(off, "BINSTRING with a negative length"));
                    }
                    let b = input.take(n as usize, "BINSTRING")?;
                    let id = self.strings.intern_bytes(b);
                    self.stack.push(Value::Str(id));
                }
                b'C' => {
                    let n = input.byte("SHORT_BINBYTES")? as usize;
                    let b = input.take(n, "SHORT_BINBYTES")?;
                    self.stack.push(Value::Bytes(Rc::new(b.to_vec())));
                }
                b'B' => {
                    let b = input.take(4, "BINBYTES")?;
                    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                    let b = input.take(n, "BINBYTES")?;
                    self.stack.push(Value::Bytes(Rc::new(b.to_vec())));
                }
                0x8e | 0x96 => {
                    let what = if op == 0x8e { "BINBYTES8" } else { "BYTEARRAY8" };
                    let n = len8(input, what)?;
                    let b = input.take(n, what)?;
                    self.stack.push(Value::Bytes(Rc::new(b.to_vec())));
                }
                // Text-protocol (0/1) scalars.
                b'I' | b'L' => {
                    let what = if op == b'I' { "INT" } else { "LONG" };
                    let line = input.line(what)?;
                    self.stack.push(text_int(&line).ok_or_else(|| {
                        Self::err(off, format!("{what}: not an integer: {:?}", String::from_utf8_lossy(&line)))
                    })?);
                }
                b'F' => {
                    let line = input.line("FLOAT")?;
                    let f: f64 = std::str::from_utf8(&line)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .ok_or_else(|| Self::err(off, "FLOAT: not a number"))?;
                    self.stack.push(Value::Float(f));
                }
                b'S' => {
                    let line = input.line("STRING")?;
                    let t = line.strip_prefix(b"'").and_then(|l| l.strip_suffix(b"'"));
                    let t = t.or_else(|| line.strip_prefix(b"\"").and_then(|l| l.strip_suffix(b"\"")));
                    let t = t.ok_or_else(|| Self::err(off, "STRING: not a quoted string"))?;
                    let id = self.strings.intern_bytes(t);
                    self.stack.push(Value::Str(id));
                }
                b'V' => {
                    let line = input.line("UNICODE")?;
                    let id = self.strings.intern_bytes(&line);
                    self.stack.push(Value::Str(id));
                }
                // Containers.
                b'}' => {
                    if self.known_records(input)? {
                        continue;
                    }
                    match self.fast_container(input, true, off)? {
                        Some(v) => self.stack.push(v),
                        None => self.stack.push(Value::PendingDict(NO_SLOT)),
                    }
                }
                b']' => match self.fast_container(input, false, off)? {
                    Some(v) => self.stack.push(v),
                    None => self.stack.push(Value::PendingList(NO_SLOT)),
                },
                0x8f => self.stack.push(Value::PendingList(NO_SLOT)), // EMPTY_SET: read as a list
                b')' => self.stack.push(Value::Tuple(Rc::new(Tuple::default()))),
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return Err(Self::err(off, "TUPLE1/2/3 needs more values than the stack holds"));
                    }
                    let at = self.stack.len() - n;
                    let t = self.make_tuple(at, off)?;
                    self.stack.push(t);
                }
                b't' => {
                    let at = self.pop_mark(off, "TUPLE")?;
                    let t = self.make_tuple(at, off)?;
                    self.stack.push(t);
                }
                b'l' | 0x91 => {
                    // The new container goes below its items, where the MARK was: the items are `stack[at + 1..]`.
                    let at = self.pop_mark(off, "LIST")?;
                    self.stack.insert(at, Value::PendingList(NO_SLOT));
                    self.extend_list(at + 1, at, off)?;
                }
                b'd' => {
                    let at = self.pop_mark(off, "DICT")?;
                    self.stack.insert(at, Value::PendingDict(NO_SLOT));
                    self.extend_dict(at + 1, at, off)?;
                }
                b'a' => {
                    if self.stack.len() < 2 {
                        return Err(Self::err(off, "APPEND needs a list and a value"));
                    }
                    let at = self.stack.len() - 1;
                    self.extend_list(at, at - 1, off)?;
                }
                b'e' | 0x90 => self.appends(off)?,
                b's' => {
                    if self.stack.len() < 3 {
                        return Err(Self::err(off, "SETITEM needs a dict, a key and a value"));
                    }
                    let at = self.stack.len() - 2;
                    self.extend_dict(at, at - 1, off)?;
                }
                b'u' => {
                    let at = self.pop_mark(off, "SETITEMS")?;
                    if at == 0 {
                        return Err(Self::err(off, "SETITEMS with no dict below the MARK"));
                    }
                    self.extend_dict(at, at - 1, off)?;
                }
                // Stack manipulation.
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop(off, "POP")?;
                    }
                }
                b'1' => {
                    let at = self.pop_mark(off, "POP_MARK")?;
                    self.stack.truncate(at);
                }
                b'2' => {
                    let top = self.stack.last().cloned().ok_or_else(|| Self::err(off, "DUP on an empty stack"))?;
                    self.stack.push(top);
                }
                // Memo.
                0x94 => {
                    let idx = self.memo.len() as u32;
                    self.memoize(idx, off)?;
                }
                b'q' => {
                    let idx = input.byte("BINPUT")? as u32;
                    self.memoize(idx, off)?;
                }
                b'r' => {
                    let b = input.take(4, "LONG_BINPUT")?;
                    self.memoize(u32::from_le_bytes([b[0], b[1], b[2], b[3]]), off)?;
                }
                b'p' => {
                    let line = input.line("PUT")?;
                    let idx = text_index(&line).ok_or_else(|| Self::err(off, "PUT: bad memo index"))?;
                    self.memoize(idx, off)?;
                }
                b'h' => {
                    let idx = input.byte("BINGET")? as u32;
                    self.recall(idx, off)?;
                }
                b'j' => {
                    let b = input.take(4, "LONG_BINGET")?;
                    self.recall(u32::from_le_bytes([b[0], b[1], b[2], b[3]]), off)?;
                }
                b'g' => {
                    let line = input.line("GET")?;
                    let idx = text_index(&line).ok_or_else(|| Self::err(off, "GET: bad memo index"))?;
                    self.recall(idx, off)?;
                }
                0x97 | 0x98 => {
                    let name = if op == 0x97 { "NEXT_BUFFER" } else { "READONLY_BUFFER" };
                    return Err(Self::err(
                        off,
                        format!(
                            "opcode {name} (0x{op:02x}) refers to an out-of-band buffer; a memory snapshot has none"
                        ),
                    ));
                }
                _ => {
                    if let Some(name) = forbidden_name(op) {
                        return Err(PickleError::Forbidden { offset: off, op, name });
                    }
                    return Err(PickleError::UnknownOpcode { offset: off, op });
                }
            }
        }
    }

    /// Called just after an EMPTY_DICT: reads it, and every dict that follows it back to back, as long as each
    /// matches a known record layout, pushing their values. `false` (nothing consumed) if the first does not match.
    /// A list of a million trace entries is read here without going round the opcode loop once per entry.
    fn known_records<R: Read>(&mut self, input: &mut Input<R>) -> Result<bool, PickleError> {
        if !self.memo.sparse.is_empty() || self.memo.overwritten || !self.records.worth_trying() {
            return Ok(false);
        }
        // A read error here or below: the opcode loop meets it again and reports it.
        if input.end - input.pos < FAST_WINDOW && !input.eof && input.fill(FAST_WINDOW).is_err() {
            return Ok(false);
        }
        let mut first = true;
        loop {
            let mut cur = Cursor { buf: &input.buf[input.pos..input.end], pos: 0 };
            let base = input.offset();
            let Some(v) = self.known_record(&mut cur, 0, base)? else {
                if first {
                    return Ok(false);
                }
                // This one's EMPTY_DICT was consumed below, after the last fill: step back over it.
                input.pos -= 1;
                return Ok(true);
            };
            input.pos += cur.pos;
            self.stack.push(v);
            first = false;
            // Top the buffer up before taking the next EMPTY_DICT, so stepping back over it stays possible.
            if input.end - input.pos < FAST_WINDOW && !input.eof && input.fill(FAST_WINDOW).is_err() {
                return Ok(true);
            }
            if input.pos >= input.end || input.buf[input.pos] != b'}' || !self.records.worth_trying() {
                return Ok(true);
            }
            input.pos += 1;
        }
    }

    /// The fast path. Called just after an EMPTY_DICT / EMPTY_LIST opcode at `off`: if the container's whole body
    /// is in the buffer and uses only plain scalars, memo references, tuples and (one level of) nested frame-like
    /// containers, decode it straight into its final value and consume it. Otherwise undo any memo entries it made
    /// and return `None`, leaving the input where it was for the generic machine. Records in memory snapshots (trace
    /// entries, frames, stacks) almost always qualify, so the generic stack/mark machinery is mostly skipped.
    fn fast_container<R: Read>(
        &mut self,
        input: &mut Input<R>,
        is_dict: bool,
        off: u64,
    ) -> Result<Option<Value>, PickleError> {
        if !self.memo.sparse.is_empty() {
            return Ok(None);
        }
        if input.end - input.pos < FAST_WINDOW && !input.eof {
            input.fill(FAST_WINDOW)?;
        }
        let memo_mark = self.memo.mark();
        let scratch_mark = self.scratch.len();
        let builder_mark = self.builder.mark();
        let mut cur = Cursor { buf: &input.buf[input.pos..input.end], pos: 0 };
        let r = self.fast_body(&mut cur, is_dict, 0, off + 1);
        match r {
            Ok(Some(v)) => {
                input.pos += cur.pos;
                Ok(Some(v))
            }
            Ok(None) => {
                self.memo.rewind(memo_mark);
                self.scratch.truncate(scratch_mark);
                self.builder.rewind(builder_mark);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Body of a fast container: `[memo] ( items u|e` or `[memo] item a` / `[memo] key value s`.
    fn fast_body(
        &mut self,
        cur: &mut Cursor,
        is_dict: bool,
        depth: u32,
        base: u64,
    ) -> Result<Option<Value>, PickleError> {
        // A layout holds its keys as they were when it was learnt: once a memo slot has been stored twice, a key's
        // memo reference may mean another key, so layouts are no longer trusted.
        if is_dict && !self.memo.overwritten && self.records.worth_trying() {
            if let Some(v) = self.known_record(cur, depth, base)? {
                return Ok(Some(v));
            }
        }
        let body_start = cur.pos;
        let slot = match cur.peek() {
            Some(0x94) => {
                cur.pos += 1;
                Some(self.memo.dense_len() as u32)
            }
            Some(b'q') => {
                let Some(i) = cur.at(1) else { return Ok(None) };
                cur.pos += 2;
                Some(i as u32)
            }
            Some(b'r') => {
                let Some(b) = cur.slice(1, 4) else {
                    return Ok(None);
                };
                let i = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                cur.pos += 5;
                Some(i)
            }
            _ => None,
        };
        if let Some(slot) = slot {
            if slot as usize != self.memo.dense_len() {
                return Ok(None);
            }
            let pending = if is_dict { Value::PendingDict(slot) } else { Value::PendingList(slot) };
            self.memo.push(pending);
        }
        let single = match cur.peek() {
            Some(b'(') => {
                cur.pos += 1;
                false
            }
            Some(_) => true,
            None => return Ok(None),
        };
        if is_dict && !single {
            match self.fast_record(cur, depth, base, body_start)? {
                Record::Done(v) => {
                    if let Some(slot) = slot {
                        if let Some(m) = self.memo.get_mut(slot) {
                            *m = v.clone();
                        }
                    }
                    return Ok(Some(v));
                }
                Record::NotOne => {}
                Record::GiveUp => return Ok(None),
            }
        }
        let (close_many, close_one) = if is_dict { (b'u', b's') } else { (b'e', b'a') };
        let mark = self.scratch.len();
        loop {
            let Some(op) = cur.next() else {
                return Ok(None);
            };
            match op {
                _ if op == close_many && !single => break,
                _ if op == close_one && single => break,
                b'h' | b'j' => {
                    let Some(idx) = memo_index(cur, op) else { return Ok(None) };
                    match self.memo.dense_get(idx as usize).as_deref() {
                        Some(Value::PendingDict(_) | Value::PendingList(_)) | None => return Ok(None),
                        Some(v) => self.scratch.push(v.clone()),
                    }
                }
                0x94 | b'q' | b'r' => {
                    let idx = match op {
                        0x94 => self.memo.dense_len() as u32,
                        b'q' => {
                            let Some(b) = cur.next() else { return Ok(None) };
                            b as u32
                        }
                        _ => {
                            let Some(b) = cur.take(4) else {
                                return Ok(None);
                            };
                            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                        }
                    };
                    if idx as usize != self.memo.dense_len() || self.scratch.len() == mark {
                        return Ok(None);
                    }
                    let top = self.scratch.last().expect("checked").clone();
                    self.memo.push(top);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.scratch.len() < mark + n {
                        return Ok(None);
                    }
                    let at = self.scratch.len() - n;
                    let t = match &self.scratch[at..] {
                        [Value::Int(a), Value::Int(b)] if i32::try_from(*a).is_ok() && i32::try_from(*b).is_ok() => {
                            Value::IntPair(*a as i32, *b as i32)
                        }
                        items => {
                            let d = items.iter().map(Value::depth).max().unwrap_or(0) + 1;
                            if d > MAX_DEPTH {
                                return Ok(None);
                            }
                            Value::Tuple(Rc::new(Tuple { depth: d, items: items.to_vec() }))
                        }
                    };
                    self.scratch.truncate(at);
                    self.scratch.push(t);
                }
                // One level of nesting: the frames list of a trace entry, the frame dicts of a stack.
                b'}' | b']' if depth < 2 => match self.fast_nested(cur, op, depth, base)? {
                    Some(v) => self.scratch.push(v),
                    None => return Ok(None),
                },
                _ => match fast_scalar(cur, op, &mut self.strings) {
                    Some(v) => self.scratch.push(v),
                    None => return Ok(None),
                },
            }
        }
        let n = self.scratch.len() - mark;
        if single && n != if is_dict { 2 } else { 1 } {
            return Ok(None);
        }
        let v = if is_dict {
            if !n.is_multiple_of(2) {
                return Ok(None);
            }
            let replaced = if n / 2 < BATCH {
                self.builder
                    .close_dict(&self.strings, &self.scratch[mark..])
                    .map_err(|m| Self::err(base + cur.pos as u64, m))?
            } else {
                None
            };
            match replaced {
                Some(v) => v,
                None => {
                    let d = self.scratch[mark..].iter().map(Value::depth).max().unwrap_or(0) + 1;
                    if d > MAX_DEPTH {
                        return Ok(None);
                    }
                    let items = self.scratch[mark..].to_vec();
                    Value::Dict(Rc::new(RefCell::new(Dict { depth: d, items })))
                }
            }
        } else {
            let replaced = if n < BATCH { self.builder.close_list(&self.scratch[mark..]) } else { None };
            match replaced {
                Some(v) => v,
                None => {
                    let d = self.scratch[mark..].iter().map(Value::depth).max().unwrap_or(0) + 1;
                    if d > MAX_DEPTH {
                        return Ok(None);
                    }
                    Value::List(Rc::new(RefCell::new(List::new(d, &mut self.scratch, mark))))
                }
            }
        };
        self.scratch.truncate(mark);
        if let Some(slot) = slot {
            if let Some(m) = self.memo.get_mut(slot) {
                *m = v.clone();
            }
        }
        Ok(Some(v))
    }

    /// A container nested in a fast container, its opening opcode `op` just read: replayed from the span cache
    /// when its bytes were seen before, decoded otherwise.
    fn fast_nested(&mut self, cur: &mut Cursor, op: u8, depth: u32, base: u64) -> Result<Option<Value>, PickleError> {
        let start = cur.pos - 1;
        // A list of memo references (a trace entry's fresh `frames` list) is looked up by its references.
        let refs = if op == b']' && !self.memo.overwritten { self.ref_list(cur) } else { RefList::No };
        let refs_key = match refs {
            RefList::Known(v) => return Ok(Some(v)),
            RefList::New(key) => Some(key),
            RefList::No => None,
        };
        let span = if self.memo.overwritten || refs_key.is_some() { None } else { pure_span_end(cur.buf, start) };
        if let Some(end) = span {
            if let Some(&i) = self.spans.index.get(&cur.buf[start..end]) {
                let e = &self.spans.entries[i as usize];
                self.memo.slots.extend(e.memo.clone().map(|k| k | SPAN_BIT));
                cur.pos = end;
                return Ok(Some(e.value.clone()));
            }
        }
        let memo_mark = self.memo.dense_len();
        let Some(v) = self.fast_body(cur, op == b'}', depth + 1, base)? else {
            return Ok(None);
        };
        if let Some(key) = refs_key {
            self.remember_refs(&cur.buf[key], &v);
        } else if let Some(end) = span.filter(|&e| e == cur.pos) {
            self.remember_span(&cur.buf[start..end], &v, memo_mark);
        }
        Ok(Some(v))
    }

    /// Just after an EMPTY_LIST: a list stored in the next memo slot whose items are only memo references,
    /// `MEMOIZE ( h|j … e` or `MEMOIZE h|j a`. When the same bytes made a value before, that value is stored in
    /// the list's slot and the list consumed (`Known`); `New` gives where its key bytes are in `cur.buf`, to
    /// `remember_refs` once the list is read. The value of a list of references is a function of the references
    /// alone while no memo slot is stored twice and the builder calls it pure; equal bytes are equal references.
    #[inline]
    fn ref_list(&mut self, cur: &mut Cursor) -> RefList {
        let buf = cur.buf;
        let start = cur.pos;
        if buf.get(start) != Some(&0x94) {
            return RefList::No;
        }
        let marked = match buf.get(start + 1) {
            Some(b'(') => true,
            Some(b'h' | b'j') => false,
            _ => return RefList::No,
        };
        let mut p = start + 1 + marked as usize;
        // The references are walked, not decoded: their bytes are the key. (A branch per opcode beats a table of
        // widths here: the branches predict well, a table load sits on the chain from one reference to the next.)
        let end = loop {
            match buf.get(p) {
                Some(b'h') => p += 2,
                Some(b'j') => p += 5,
                _ => break p,
            }
        };
        match buf.get(end) {
            Some(b'e') if marked => {}
            Some(b'a') if !marked && end == start + 1 + REF_WIDTH[buf[start + 1] as usize] as usize => {}
            _ => return RefList::No,
        }
        let key = start..end + 1;
        match self.refs.get(&buf[key.clone()]) {
            Some(v) => {
                let v = v.clone();
                self.memo.push(v.clone());
                cur.pos = key.end;
                RefList::Known(v)
            }
            None => RefList::New(key),
        }
    }

    /// Keeps the value a list of references (`key`, its bytes) made, when the builder calls it pure, within a
    /// budget a hostile file cannot blow.
    fn remember_refs(&mut self, key: &[u8], v: &Value) {
        let pure = matches!(v, Value::Custom(kind, _) if self.builder.is_pure(*kind));
        if pure && self.refs_len + key.len() <= REF_CACHE_MAX_BYTES {
            self.refs_len += key.len();
            self.refs.insert(key.into(), v.clone());
        }
    }

    /// A dict the builder takes as a record (see [`Builder::record_begin`]), from just after its MARK through its
    /// SETITEMS: each key and value goes to the builder as it is read, with no item list and no copy of values
    /// from the memo. Keys must be strs, values scalars, memo references, strs, int pairs or nested fast
    /// containers; anything else gives the record up to the generic path. A record made only of memo-referenced
    /// keys and fixed-width values also teaches its byte layout to [`RecordShapes`] (`body_start`: where the
    /// dict's bytes begin, after its EMPTY_DICT).
    fn fast_record(
        &mut self,
        cur: &mut Cursor,
        depth: u32,
        base: u64,
        body_start: usize,
    ) -> Result<Record, PickleError> {
        let start = cur.pos;
        let memo_mark = self.memo.mark();
        let mut fields = 0usize;
        let mut first_key = 0;
        let mut layout = std::mem::take(&mut self.records.learning);
        layout.clear();
        let mut fixed = self.records.learnable();
        // Where a nested value began (its opening opcode), while it is the last value read.
        let mut tail: Option<(StrId, usize)> = None;
        let outcome = loop {
            let Some(op) = cur.next() else { break Record::GiveUp };
            if tail.is_some() && op != b'u' {
                fixed = false;
            }
            let key = match op {
                b'u' if fields > 0 => break Record::Done(Value::None),
                b'h' | b'j' => {
                    let Some(idx) = memo_index(cur, op) else { break Record::GiveUp };
                    match self.memo.dense_get(idx as usize).as_deref() {
                        Some(&Value::Str(k)) => k,
                        _ if fields == 0 => {
                            cur.pos = start;
                            break Record::NotOne;
                        }
                        _ => break Record::GiveUp,
                    }
                }
                0x8c => {
                    fixed = false;
                    let Some(n) = cur.next() else { break Record::GiveUp };
                    let Some(b) = cur.take(n as usize) else { break Record::GiveUp };
                    let k = self.strings.intern_bytes(b);
                    if !self.memo_store(cur, &Value::Str(k)) {
                        break Record::GiveUp;
                    }
                    k
                }
                _ if fields == 0 => {
                    cur.pos = start;
                    break Record::NotOne;
                }
                _ => break Record::GiveUp,
            };
            if fields == 0 {
                if !self.builder.record_begin(key) {
                    cur.pos = start;
                    self.memo.rewind(memo_mark);
                    break Record::NotOne;
                }
                first_key = key;
            }
            fields += 1;
            if fields >= BATCH {
                break Record::GiveUp;
            }
            let Some(op) = cur.next() else { break Record::GiveUp };
            let at = cur.pos - body_start;
            let accepted = match op {
                // A memo reference is passed as the stored value itself, not a copy.
                b'h' | b'j' => {
                    let Some(idx) = memo_index(cur, op) else { break Record::GiveUp };
                    layout.push(Field { key, at: at as u32, arg: if op == b'h' { Arg::Ref1 } else { Arg::Ref4 } });
                    match self.memo.dense_get(idx as usize).as_deref() {
                        Some(Value::PendingDict(_) | Value::PendingList(_)) | None => false,
                        Some(v) => self.builder.record_field(key, v),
                    }
                }
                b'}' | b']' if depth < 2 => {
                    if tail.is_some() {
                        fixed = false;
                    }
                    tail = Some((key, cur.pos - body_start));
                    match self.fast_nested(cur, op, depth, base)? {
                        Some(v) => self.builder.record_field(key, &v),
                        None => false,
                    }
                }
                _ => {
                    let Some(mut v) = fast_scalar(cur, op, &mut self.strings) else {
                        break Record::GiveUp;
                    };
                    let arg = match (op, &v) {
                        (0x8c, &Value::Str(id)) => Some(Arg::Str { id, memo: cur.peek() == Some(0x94) }),
                        _ => Arg::of_scalar(op, cur.pos - body_start - at),
                    };
                    match arg {
                        Some(arg) => layout.push(Field { key, at: at as u32, arg }),
                        None => fixed = false,
                    }
                    // A pool id: two ints and TUPLE2 (keys are never ints, so a second int is a tuple's).
                    if let Some(next) = cur.peek().filter(|&b| SCALAR_OPS[b as usize]) {
                        fixed = false;
                        cur.pos += 1;
                        let Some(second) = fast_scalar(cur, next, &mut self.strings) else {
                            break Record::GiveUp;
                        };
                        if cur.next() != Some(0x86) {
                            break Record::GiveUp;
                        }
                        v = match (&v, &second) {
                            (Value::Int(a), Value::Int(b))
                                if i32::try_from(*a).is_ok() && i32::try_from(*b).is_ok() =>
                            {
                                Value::IntPair(*a as i32, *b as i32)
                            }
                            _ => Value::Tuple(Rc::new(Tuple { depth: 1, items: vec![v, second] })),
                        };
                    }
                    if matches!(cur.peek(), Some(b'q' | b'r'))
                        || (cur.peek() == Some(0x94)
                            && !matches!(layout.last(), Some(f) if f.at as usize == at && matches!(f.arg, Arg::Str { .. })))
                    {
                        fixed = false;
                    }
                    self.memo_store(cur, &v) && self.builder.record_field(key, &v)
                }
            };
            if !accepted {
                break Record::GiveUp;
            }
        };
        let outcome = match outcome {
            Record::Done(_) => match self.builder.record_end() {
                Some(v) => {
                    if fixed && !self.memo.overwritten {
                        match tail {
                            // The layout runs through the tail's opening opcode.
                            Some((key, at)) => {
                                self.records.learn(&cur.buf[body_start..body_start + at], first_key, &layout, Some(key))
                            }
                            None => self.records.learn(&cur.buf[body_start..cur.pos], first_key, &layout, None),
                        }
                    }
                    Record::Done(v)
                }
                None => Record::GiveUp,
            },
            other => other,
        };
        self.records.learning = layout;
        Ok(outcome)
    }

    /// A record whose bytes match a layout learnt from an earlier one (see [`RecordShapes`]): its fields are read
    /// at their known offsets and sent to the builder, then its tail, if its layout has one, the ordinary way.
    /// `None` (nothing consumed, nothing stored) if no layout matches or the record cannot be finished here; the
    /// ordinary path then reads it. `depth` and `base` are as for [`Self::fast_body`].
    fn known_record(&mut self, cur: &mut Cursor, depth: u32, base: u64) -> Result<Option<Value>, PickleError> {
        let rest = &cur.buf[cur.pos..];
        let Some(i) = self.records.matching(rest) else { return Ok(None) };
        let shape = &self.records.shapes[i];
        let slot = match shape.slot {
            Slot::None => None,
            Slot::Next => Some(self.memo.dense_len() as u32),
            Slot::Put1 => Some(rest[1] as u32),
            Slot::Put4 => Some(u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]])),
        };
        if slot.is_some_and(|s| s as usize != self.memo.dense_len()) || !self.builder.record_begin(shape.first_key) {
            return Ok(None);
        }
        if !shape.stores {
            return Ok(self.known_fixed_record(cur, i, slot.is_some()));
        }
        let memo_mark = self.memo.mark();
        let builder_mark = self.builder.mark();
        let scratch_mark = self.scratch.len();
        let v = self.known_storing_record(cur, i, slot, depth, base);
        if !matches!(v, Ok(Some(_))) {
            self.memo.rewind(memo_mark);
            self.builder.rewind(builder_mark);
            self.scratch.truncate(scratch_mark);
        }
        v
    }

    /// A known record that stores nothing in the memo but (with `stored`) itself, in the next slot.
    #[inline]
    fn known_fixed_record(&mut self, cur: &mut Cursor, i: usize, stored: bool) -> Option<Value> {
        let rest = &cur.buf[cur.pos..];
        let shape = &self.records.shapes[i];
        for f in shape.fields.iter() {
            let at = f.at as usize;
            let v = match f.arg {
                Arg::Ref1 | Arg::Ref4 => {
                    let idx = f.arg.memo_index(rest, at);
                    // Only values already stored are referenced: the record stores nothing of its own but itself.
                    match self.memo.dense_get(idx).as_deref() {
                        Some(Value::PendingDict(_) | Value::PendingList(_)) | None => return None,
                        Some(v) => {
                            if !self.builder.record_field(f.key, v) {
                                return None;
                            }
                            continue;
                        }
                    }
                }
                // A number, None or a bool: nothing to drop, and a call to Value's drop glue per field costs.
                arg => std::mem::ManuallyDrop::new(arg.value(rest, at)?),
            };
            if !self.builder.record_field(f.key, &v) {
                return None;
            }
        }
        let v = self.builder.record_end()?;
        if stored {
            match v {
                Value::Custom(kind, id) => self.memo.push_custom(kind, id),
                _ => self.memo.push(v.clone()),
            }
        }
        cur.pos += shape.len;
        self.records.hit(i);
        Some(v)
    }

    /// A known record that stores values of its own after its slot: a memoized str, its tail. The caller undoes
    /// what it stored when it gives up.
    fn known_storing_record(
        &mut self,
        cur: &mut Cursor,
        i: usize,
        slot: Option<u32>,
        depth: u32,
        base: u64,
    ) -> Result<Option<Value>, PickleError> {
        if slot.is_some() {
            self.memo.push_pending();
        }
        let rest = &cur.buf[cur.pos..];
        let shape = &self.records.shapes[i];
        for f in shape.fields.iter() {
            let at = f.at as usize;
            let v = match f.arg {
                Arg::Ref1 | Arg::Ref4 => {
                    let idx = f.arg.memo_index(rest, at);
                    match self.memo.dense_get(idx).as_deref() {
                        Some(Value::PendingDict(_) | Value::PendingList(_)) | None => return Ok(None),
                        Some(v) => {
                            if !self.builder.record_field(f.key, v) {
                                return Ok(None);
                            }
                            continue;
                        }
                    }
                }
                Arg::Str { id, memo } => {
                    if memo {
                        self.memo.push(Value::Str(id));
                    }
                    Value::Str(id)
                }
                arg => match arg.value(rest, at) {
                    Some(v) => v,
                    None => return Ok(None),
                },
            };
            if !self.builder.record_field(f.key, &v) {
                return Ok(None);
            }
        }
        let (len, tail) = (shape.len, shape.tail);
        if let Some(key) = tail {
            if depth >= 2 {
                return Ok(None);
            }
            let mut c = Cursor { buf: cur.buf, pos: cur.pos + len };
            let op = c.buf[c.pos - 1];
            let Some(v) = self.fast_nested(&mut c, op, depth, base)? else { return Ok(None) };
            if !self.builder.record_field(key, &v) || c.next() != Some(b'u') {
                return Ok(None);
            }
            cur.pos = c.pos;
        } else {
            cur.pos += len;
        }
        let Some(v) = self.builder.record_end() else { return Ok(None) };
        if let Some(slot) = slot {
            self.memo.fill_pending(slot, &v);
        }
        self.records.hit(i);
        Ok(Some(v))
    }

    /// Stores `v` in the memo if a memo opcode follows; `false` if it names a slot out of order.
    #[inline]
    fn memo_store(&mut self, cur: &mut Cursor, v: &Value) -> bool {
        let idx = match cur.peek() {
            Some(0x94) => {
                cur.pos += 1;
                self.memo.dense_len() as u32
            }
            Some(b'q') => match cur.at(1) {
                Some(i) => {
                    cur.pos += 2;
                    i as u32
                }
                None => return false,
            },
            Some(b'r') => {
                let Some(i) = cur.slice(1, 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])) else {
                    return false;
                };
                cur.pos += 5;
                i
            }
            _ => return true,
        };
        if idx as usize != self.memo.dense_len() {
            return false;
        }
        self.memo.push(v.clone());
        true
    }

    /// Caches a decoded pure span: its value and the memo stores made inside it, if all are pure.
    fn remember_span(&mut self, bytes: &[u8], v: &Value, memo_mark: usize) {
        let pure = |v: &Value| matches!(v, Value::Custom(kind, _) if self.builder.is_pure(*kind));
        if !pure(v) || !self.memo.stored_since(memo_mark).all(|m| pure(&m)) {
            return;
        }
        let stored = self.memo.dense_len() - memo_mark;
        if self.spans.key_bytes + bytes.len() > SPAN_CACHE_MAX_BYTES
            || self.memo.span_values.len() + stored >= INLINE_BIT as usize
        {
            return;
        }
        let start = self.memo.span_values.len() as u32;
        let values: Vec<Value> = self.memo.stored_since(memo_mark).map(|m| m.clone()).collect();
        self.memo.span_values.extend(values);
        let end = self.memo.span_values.len() as u32;
        self.spans.key_bytes += bytes.len();
        self.spans.index.insert(bytes.into(), self.spans.entries.len() as u32);
        self.spans.entries.push(SpanEntry { value: v.clone(), memo: start..end });
    }

    fn make_tuple(&mut self, at: usize, off: u64) -> Result<Value, PickleError> {
        let items = &self.stack[at..];
        if let [Value::Int(a), Value::Int(b)] = items {
            if let (Ok(a), Ok(b)) = (i32::try_from(*a), i32::try_from(*b)) {
                self.stack.truncate(at);
                return Ok(Value::IntPair(a, b));
            }
        }
        let depth = items.iter().map(Value::depth).max().unwrap_or(0) + 1;
        if depth > MAX_DEPTH {
            return Err(PickleError::TooDeep { offset: off });
        }
        let items = self.stack.split_off(at);
        Ok(Value::Tuple(Rc::new(Tuple { depth, items })))
    }

    fn memoize(&mut self, idx: u32, off: u64) -> Result<(), PickleError> {
        let top = self.stack.last_mut().ok_or_else(|| Self::err(off, "memo store with an empty stack"))?;
        match top {
            // A pending container learns its slot so the memo can be updated when it closes.
            Value::PendingList(slot) | Value::PendingDict(slot) if *slot == NO_SLOT => {
                *slot = idx;
            }
            _ => {}
        }
        let v = top.clone();
        self.memo.put(idx, v);
        Ok(())
    }

    fn recall(&mut self, idx: u32, off: u64) -> Result<(), PickleError> {
        let v = match self.memo.get(idx) {
            Some(v) => v.clone(),
            None => return Err(Self::err(off, format!("memo reference {idx} to a value never stored"))),
        };
        // A reference to an empty container not given items yet (an empty `frames` list used again, or a
        // self-referencing structure still being filled): give it real shared storage now, so both references see
        // the same items. It is the same object, so this is no second store into the slot.
        let v = match v {
            Value::PendingList(slot) if slot == idx => {
                let l = Value::List(Rc::new(RefCell::new(List { depth: 1, ..List::default() })));
                if let Some(m) = self.memo.get_mut(idx) {
                    *m = l.clone();
                }
                l
            }
            Value::PendingDict(slot) if slot == idx => {
                let d = Value::Dict(Rc::new(RefCell::new(Dict { depth: 1, items: Vec::new() })));
                if let Some(m) = self.memo.get_mut(idx) {
                    *m = d.clone();
                }
                d
            }
            v => v,
        };
        self.stack.push(v);
        Ok(())
    }

    /// Nesting depth of the values `stack[at..]`; refuses anything deeper than [`MAX_DEPTH`].
    fn item_depth(&self, at: usize, off: u64) -> Result<u32, PickleError> {
        let d = self.stack[at..].iter().map(Value::depth).max().unwrap_or(0);
        if d + 1 > MAX_DEPTH {
            return Err(PickleError::TooDeep { offset: off });
        }
        Ok(d)
    }

    fn appends(&mut self, off: u64) -> Result<(), PickleError> {
        let at = self.pop_mark(off, "APPENDS")?;
        if at == 0 {
            return Err(Self::err(off, "APPENDS with no list below the MARK"));
        }
        self.extend_list(at, at - 1, off)
    }

    /// Moves `stack[at..]` into the list at `stack[target]`, letting the builder replace a list that closes.
    fn extend_list(&mut self, at: usize, target: usize, off: u64) -> Result<(), PickleError> {
        let n = self.stack.len() - at;
        match &self.stack[target] {
            &Value::PendingList(slot) => {
                let shared = if slot != NO_SLOT { self.memo.get(slot).map(|m| m.clone()) } else { None };
                if let Some(Value::List(rc)) = shared {
                    let item_depth = self.item_depth(at, off)?;
                    let mut l = rc.borrow_mut();
                    l.depth = l.depth.max(item_depth + 1);
                    l.append(&mut self.stack, at);
                    drop(l);
                    self.stack[target] = Value::List(rc);
                    return Ok(());
                }
                let replaced = if n < BATCH { self.builder.close_list(&self.stack[at..]) } else { None };
                let v = match replaced {
                    Some(v) => {
                        self.stack.truncate(at);
                        v
                    }
                    None => {
                        let item_depth = self.item_depth(at, off)?;
                        Value::List(Rc::new(RefCell::new(List::new(item_depth + 1, &mut self.stack, at))))
                    }
                };
                if slot != NO_SLOT {
                    if let Some(m) = self.memo.get_mut(slot) {
                        *m = v.clone();
                    }
                }
                self.stack[target] = v;
            }
            Value::List(rc) => {
                let rc = rc.clone();
                let item_depth = self.item_depth(at, off)?;
                let mut l = rc.borrow_mut();
                l.depth = l.depth.max(item_depth + 1);
                l.append(&mut self.stack, at);
            }
            other => {
                return Err(Self::err(off, format!("APPEND(S) onto {} instead of a list", other.type_name())));
            }
        }
        Ok(())
    }

    /// Moves key/value pairs `stack[at..]` into the dict at `stack[target]`, letting the builder replace it.
    fn extend_dict(&mut self, at: usize, target: usize, off: u64) -> Result<(), PickleError> {
        let n = self.stack.len() - at;
        if !n.is_multiple_of(2) {
            return Err(Self::err(off, "SETITEMS with an odd number of keys and values"));
        }
        let item_depth = self.stack[at..].iter().map(Value::depth).max().unwrap_or(0);
        if item_depth + 1 > MAX_DEPTH {
            return Err(PickleError::TooDeep { offset: off });
        }
        match &self.stack[target] {
            &Value::PendingDict(slot) => {
                let shared = if slot != NO_SLOT { self.memo.get(slot).map(|m| m.clone()) } else { None };
                if let Some(Value::Dict(rc)) = shared {
                    let item_depth = self.item_depth(at, off)?;
                    let mut d = rc.borrow_mut();
                    d.depth = d.depth.max(item_depth + 1);
                    d.items.extend(self.stack.drain(at..));
                    drop(d);
                    self.stack[target] = Value::Dict(rc);
                    return Ok(());
                }
                let replaced = if n / 2 < BATCH {
                    self.builder.close_dict(&self.strings, &self.stack[at..]).map_err(|m| Self::err(off, m))?
                } else {
                    None
                };
                let v = match replaced {
                    Some(v) => {
                        self.stack.truncate(at);
                        v
                    }
                    None => {
                        let item_depth = self.item_depth(at, off)?;
                        let items = self.stack.split_off(at);
                        Value::Dict(Rc::new(RefCell::new(Dict { depth: item_depth + 1, items })))
                    }
                };
                if slot != NO_SLOT {
                    if let Some(m) = self.memo.get_mut(slot) {
                        *m = v.clone();
                    }
                }
                self.stack[target] = v;
            }
            Value::Dict(rc) => {
                let rc = rc.clone();
                let item_depth = self.item_depth(at, off)?;
                let mut d = rc.borrow_mut();
                d.depth = d.depth.max(item_depth + 1);
                d.items.extend(self.stack.drain(at..));
            }
            other => {
                return Err(Self::err(off, format!("SETITEM(S) into {} instead of a dict", other.type_name())));
            }
        }
        Ok(())
    }
}

/// Byte layouts of records seen before. Millions of trace entries are written alike: the same keys as memo
/// references in the same order, the same opcodes and integer widths; only the argument bytes of values differ.
/// A record's layout is its bytes with those arguments masked out; a later record whose bytes equal a layout
/// under its mask holds the same keys, opcodes and widths, so its values can be read at fixed offsets without
/// walking its opcodes one by one. Records that hold anything else (a str, a nested container, a memo store of
/// their own) are never learnt.
#[derive(Default)]
struct RecordShapes {
    shapes: Vec<Shape>,
    /// Reused buffer for the layout of the record being read.
    learning: Vec<Field>,
    last: usize,
    tries: u32,
    hits: u32,
    /// Records left to read without trying the layouts, after a stretch where they rarely matched.
    resting: u32,
}

#[derive(Clone)]
struct Shape {
    /// The record's bytes from just after EMPTY_DICT through SETITEMS, padded to whole words.
    bytes: Box<[u64]>,
    mask: Box<[u64]>,
    len: usize,
    slot: Slot,
    first_key: StrId,
    fields: Box<[Field]>,
    /// The key of a last value that varies in length (a trace entry's fresh `frames` list): the layout ends with
    /// its opening opcode, and the record's SETITEMS follows the value.
    tail: Option<StrId>,
    /// The record stores something in the memo besides itself (a memoized str, the tail), after its own slot.
    stores: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    None,
    /// MEMOIZE: the next slot.
    Next,
    /// BINPUT / LONG_BINPUT with the index right after the opcode.
    Put1,
    Put4,
}

#[derive(Clone, Copy)]
struct Field {
    key: StrId,
    /// Offset of the value's argument bytes from the start of the record.
    at: u32,
    arg: Arg,
}

/// A fixed-width value encoding: its opcode is part of the layout, its argument bytes are not.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arg {
    U8,
    U16,
    I32,
    /// LONG1 with this many bytes (the count byte is part of the layout).
    Long(u8),
    F64,
    Ref1,
    Ref4,
    None,
    True,
    False,
    /// A str whose bytes are part of the layout (torch's fresh `'N/A'` compile context per entry); with `memo`,
    /// a MEMOIZE follows it, also part of the layout, storing it in the next slot.
    Str {
        id: StrId,
        memo: bool,
    },
}

impl Arg {
    /// The layout of a scalar with opcode `op` and `width` argument bytes, if it has a fixed width.
    fn of_scalar(op: u8, width: usize) -> Option<Arg> {
        Some(match op {
            b'K' => Arg::U8,
            b'M' => Arg::U16,
            b'J' => Arg::I32,
            0x8a if width <= 9 => Arg::Long(width as u8 - 1),
            b'G' => Arg::F64,
            b'N' => Arg::None,
            0x88 => Arg::True,
            0x89 => Arg::False,
            _ => return None,
        })
    }

    /// The value of a fixed-width scalar whose argument bytes start at `rest[at]`; `None` for a memo reference,
    /// which only the memo can resolve. Always inlined: called, its 16-byte result is written in pieces and read
    /// back whole, a store-forwarding stall per field.
    #[inline(always)]
    fn value(self, rest: &[u8], at: usize) -> Option<Value> {
        Some(match self {
            Arg::U8 => Value::Int(rest[at] as i64),
            Arg::U16 => Value::Int(u16::from_le_bytes([rest[at], rest[at + 1]]) as i64),
            Arg::I32 => Value::Int(i32::from_le_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]) as i64),
            Arg::Long(n) => Value::Int(match rest.get(at + 1..at + 9) {
                // One 8-byte load, shifted: the bytes past the int are the next opcodes, shifted out.
                Some(w) if n > 0 => {
                    let shift = 64 - 8 * n as u32;
                    ((u64::from_le_bytes(w.try_into().expect("8 bytes")) << shift) as i64) >> shift
                }
                _ => small_long(&rest[at + 1..at + 1 + n as usize]),
            }),
            Arg::F64 => {
                let mut a = [0u8; 8];
                a.copy_from_slice(&rest[at..at + 8]);
                Value::Float(f64::from_be_bytes(a))
            }
            Arg::None => Value::None,
            Arg::True => Value::Bool(true),
            Arg::False => Value::Bool(false),
            Arg::Str { id, .. } => Value::Str(id),
            Arg::Ref1 | Arg::Ref4 => return None,
        })
    }

    /// The memo index a reference's argument bytes at `rest[at]` name.
    #[inline]
    fn memo_index(self, rest: &[u8], at: usize) -> usize {
        if self == Arg::Ref1 {
            rest[at] as usize
        } else {
            u32::from_le_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]) as usize
        }
    }

    /// Argument bytes that vary from record to record (the LONG1 count byte stays in the layout).
    fn varying(self) -> std::ops::Range<usize> {
        match self {
            Arg::U8 | Arg::Ref1 => 0..1,
            Arg::U16 => 0..2,
            Arg::I32 | Arg::Ref4 => 0..4,
            Arg::Long(n) => 1..1 + n as usize,
            Arg::F64 => 0..8,
            Arg::None | Arg::True | Arg::False | Arg::Str { .. } => 0..0,
        }
    }
}

/// Layouts kept at most; a file has a few dozen (integer widths × actions × fields present).
const MAX_SHAPES: usize = 64;
const MAX_SHAPE_LEN: usize = 1024;
/// Trying the layouts is stopped for a while when fewer than a quarter of this many tries match.
const SHAPE_WINDOW: u32 = 1024;
const SHAPE_REST: u32 = 16 * 1024;

impl RecordShapes {
    #[inline]
    fn worth_trying(&mut self) -> bool {
        if self.shapes.is_empty() {
            return false;
        }
        if self.resting > 0 {
            self.resting -= 1;
            return false;
        }
        self.tries += 1;
        if self.tries >= SHAPE_WINDOW {
            if self.hits < SHAPE_WINDOW / 4 {
                self.resting = SHAPE_REST;
            }
            self.tries = 0;
            self.hits = 0;
        }
        true
    }

    fn learnable(&self) -> bool {
        self.shapes.len() < MAX_SHAPES
    }

    #[inline]
    fn hit(&mut self, i: usize) {
        self.hits += 1;
        self.last = i;
    }

    /// The first layout `rest` matches, the last one matched tried first.
    #[inline]
    fn matching(&self, rest: &[u8]) -> Option<usize> {
        first_match(&self.shapes, self.last, rest)
    }

    fn learn(&mut self, bytes: &[u8], first_key: StrId, fields: &[Field], tail: Option<StrId>) {
        if bytes.len() > MAX_SHAPE_LEN || self.shapes.len() >= MAX_SHAPES {
            return;
        }
        let (slot, slot_arg) = match bytes.first() {
            Some(0x94) => (Slot::Next, 0..0),
            Some(b'q') => (Slot::Put1, 1..2),
            Some(b'r') => (Slot::Put4, 1..5),
            _ => (Slot::None, 0..0),
        };
        let words = bytes.len().div_ceil(8);
        let mut raw = vec![0u8; words * 8];
        raw[..bytes.len()].copy_from_slice(bytes);
        let mut mask = vec![0u8; words * 8];
        mask[..bytes.len()].fill(0xff);
        mask[slot_arg].fill(0);
        for f in fields {
            let r = f.arg.varying();
            mask[f.at as usize + r.start..f.at as usize + r.end].fill(0);
        }
        let to_words = |b: &[u8]| -> Box<[u64]> {
            b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
        };
        let mask = to_words(&mask);
        let bytes_w: Box<[u64]> = to_words(&raw).iter().zip(mask.iter()).map(|(b, m)| b & m).collect();
        if self.shapes.iter().any(|s| s.mask == mask && s.bytes == bytes_w) {
            return;
        }
        let stores = tail.is_some() || fields.iter().any(|f| matches!(f.arg, Arg::Str { memo: true, .. }));
        let fields = fields.into();
        self.shapes.push(Shape { bytes: bytes_w, mask, len: bytes.len(), slot, first_key, fields, tail, stores });
    }
}

/// The first of `shapes` that `rest` matches, trying `last` first.
#[inline]
fn first_match(shapes: &[Shape], last: usize, rest: &[u8]) -> Option<usize> {
    let n = shapes.len();
    (0..n).map(|k| (last + k) % n).find(|&i| shapes[i].matches(rest))
}

impl Shape {
    #[inline]
    fn matches(&self, rest: &[u8]) -> bool {
        let Some(window) = rest.get(..self.bytes.len() * 8) else {
            return false;
        };
        window
            .chunks_exact(8)
            .zip(self.bytes.iter().zip(self.mask.iter()))
            .all(|(c, (b, m))| u64::from_le_bytes(c.try_into().expect("8 bytes")) & m == *b)
    }
}

/// How a record dict ended on the fast path.
enum Record {
    Done(Value),
    /// Not a dict the builder takes as a record: decode it the ordinary way.
    NotOne,
    /// A record the fast path cannot finish: the generic machine reads it again.
    GiveUp,
}

/// The opcodes [`fast_scalar`] decodes.
const SCALAR_OPS: [bool; 256] = {
    let mut t = [false; 256];
    t[b'K' as usize] = true;
    t[b'M' as usize] = true;
    t[b'J' as usize] = true;
    t[0x8a] = true;
    t[b'G' as usize] = true;
    t[b'N' as usize] = true;
    t[0x88] = true;
    t[0x89] = true;
    t
};

/// The argument of BINGET (`h`) or LONG_BINGET (`j`), the opcode `op` just read.
#[inline]
fn memo_index(cur: &mut Cursor, op: u8) -> Option<u32> {
    if op == b'h' {
        cur.next().map(u32::from)
    } else {
        let b = cur.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// A number, None, bool or str whose opcode `op` was just read; `None` for any other opcode or when the buffer
/// ends first.
#[inline]
fn fast_scalar(cur: &mut Cursor, op: u8, strings: &mut Strings) -> Option<Value> {
    Some(match op {
        b'K' => Value::Int(cur.next()? as i64),
        b'M' => {
            let b = cur.take(2)?;
            Value::Int(u16::from_le_bytes([b[0], b[1]]) as i64)
        }
        b'J' => {
            let b = cur.take(4)?;
            Value::Int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
        }
        0x8a => {
            let n = cur.next()?;
            long_value(cur.take(n as usize)?)
        }
        b'G' => {
            let b = cur.take(8)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Value::Float(f64::from_be_bytes(a))
        }
        b'N' => Value::None,
        0x88 => Value::Bool(true),
        0x89 => Value::Bool(false),
        0x8c => {
            let n = cur.next()?;
            Value::Str(strings.intern_bytes(cur.take(n as usize)?))
        }
        b'X' => {
            let b = cur.take(4)?;
            let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
            Value::Str(strings.intern_bytes(cur.take(n)?))
        }
        _ => return None,
    })
}

fn len8<R: Read>(input: &mut Input<R>, what: &'static str) -> Result<usize, PickleError> {
    let off = input.offset();
    let b = input.take(8, what)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    usize::try_from(u64::from_le_bytes(a))
        .map_err(|_| PickleError::Malformed { offset: off, message: format!("{what}: length does not fit") })
}

#[inline]
fn long_value(b: &[u8]) -> Value {
    if b.len() <= 8 {
        return Value::Int(small_long(b));
    }
    Value::BigInt(Rc::new(b.to_vec()))
}

/// A little-endian two's complement int of at most 8 bytes (LONG1's encoding; no bytes is 0). Built in a
/// register: copying a variable number of bytes into an array and loading it back stalls on store forwarding.
#[inline]
fn small_long(b: &[u8]) -> i64 {
    debug_assert!(b.len() <= 8);
    if b.is_empty() {
        return 0;
    }
    let mut v = 0u64;
    for (i, &x) in b.iter().enumerate() {
        v |= (x as u64) << (8 * i);
    }
    let shift = 64 - 8 * b.len() as u32;
    ((v << shift) as i64) >> shift
}

fn text_int(line: &[u8]) -> Option<Value> {
    let s = std::str::from_utf8(line).ok()?.trim().trim_end_matches('L');
    match s {
        "00" => return Some(Value::Bool(false)),
        "01" => return Some(Value::Bool(true)),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::Int(i));
    }
    // Wider than i64: keep it only if it fits u64 (the sole case a snapshot could need).
    let u: u64 = s.parse().ok()?;
    let mut bytes = u.to_le_bytes().to_vec();
    bytes.push(0);
    Some(Value::BigInt(Rc::new(bytes)))
}

fn text_index(line: &[u8]) -> Option<u32> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Parsed, PickleError> {
        read(bytes, &mut PlainBuilder, Strings::default(), None)
    }

    #[test]
    fn values_stay_small() {
        // The memo holds one Value per memoized object: millions in a big snapshot.
        assert_eq!(std::mem::size_of::<Value>(), 16);
    }

    #[test]
    fn reads_scalars_and_wide_ints() {
        // 0x80 0x04 LONG1 9 bytes = 2**64 - 1, STOP
        let mut p = vec![0x80, 4, 0x8a, 9];
        p.extend_from_slice(&[0xff; 8]);
        p.push(0);
        p.push(b'.');
        let v = parse(&p).unwrap().value;
        assert_eq!(v.as_u64(), Some(u64::MAX));
        // negative LONG1
        let v = parse(&[0x80, 2, 0x8a, 1, 0xff, b'.']).unwrap().value;
        assert_eq!(v.as_i64(), Some(-1));
        // 17-byte integer, too wide for u64
        let mut p = vec![0x80, 4, 0x8a, 17];
        p.extend_from_slice(&[1; 17]);
        p.push(b'.');
        let v = parse(&p).unwrap().value;
        assert!(matches!(v, Value::BigInt(_)) && v.as_u64().is_none());
    }

    #[test]
    fn small_longs_of_every_width_sign_extend() {
        for v in [0i64, 1, -1, 127, -128, 128, -129, 1 << 40, -(1 << 40), i64::MAX, i64::MIN] {
            let b = v.to_le_bytes();
            // The narrowest two's complement encoding, and every wider one.
            let mut n = 8;
            while n > 1 && ((b[n - 1] == 0 && b[n - 2] & 0x80 == 0) || (b[n - 1] == 0xff && b[n - 2] & 0x80 != 0)) {
                n -= 1;
            }
            for w in n..=8 {
                assert_eq!(small_long(&b[..w]), v, "{v} in {w} bytes");
            }
        }
        assert_eq!(small_long(&[]), 0);
    }

    #[test]
    fn invalid_utf8_is_decoded_leniently() {
        let p = [0x80, 4, 0x8c, 3, b'a', 0xff, b'b', b'.'];
        let parsed = parse(&p).unwrap();
        let id = parsed.value.as_str_id().unwrap();
        assert_eq!(parsed.strings.get(id), "a\u{fffd}b");
    }

    #[test]
    fn memo_shares_rather_than_copies() {
        // [L, L] where L = [1] memoized: both items are the same Rc.
        let p = [0x80, 4, b']', 0x94, b'(', b']', 0x94, b'K', 1, b'a', b'h', 1, b'e', b'.'];
        let v = parse(&p).unwrap().value;
        let items = v.list_items().unwrap();
        match (&items[0], &items[1]) {
            (Value::List(a), Value::List(b)) => assert!(Rc::ptr_eq(a, b)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn refuses_code_execution_opcodes() {
        let p = b"\x80\x02cos\nsystem\nq\x00X\x0a\x00\x00\x00echo pwnedq\x01\x85q\x02Rq\x03.";
        let e = parse(p).err().unwrap();
        assert!(matches!(e, PickleError::Forbidden { name: "GLOBAL", offset: 2, .. }), "{e}");
    }

    #[test]
    fn truncation_is_reported_with_offset() {
        let e = parse(&[0x80, 4, 0x8c, 10, b'a']).err().unwrap();
        assert!(matches!(e, PickleError::Truncated { offset: 5, .. }), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let mut p = vec![0x80, 4];
        p.extend(std::iter::repeat_n(b']', 10_000));
        p.extend(std::iter::repeat_n(b'a', 9_999));
        p.push(b'.');
        let e = parse(&p).err().unwrap();
        assert!(matches!(e, PickleError::TooDeep { .. }), "{e}");
    }

    #[test]
    fn sparse_memo_index_costs_one_entry() {
        // LONG_BINPUT 0xFFFFFFF0 then LONG_BINGET it.
        let p = [0x80, 4, b'K', 7, b'r', 0xf0, 0xff, 0xff, 0xff, b'0', b'j', 0xf0, 0xff, 0xff, 0xff, b'.'];
        assert_eq!(parse(&p).unwrap().value.as_i64(), Some(7));
    }
}
