//! Records (trace entries): streamed to the builder field by field, and read at fixed offsets once their byte
//! layout is known.

use super::*;

/// Byte layouts of records seen before. Millions of trace entries are written alike: the same keys as memo
/// references in the same order, the same opcodes and integer widths; only the argument bytes of values differ.
/// A record's layout is its bytes with those arguments masked out; a later record whose bytes equal a layout
/// under its mask holds the same keys, opcodes and widths, so its values can be read at fixed offsets without
/// walking its opcodes one by one. A layout may also hold a constant str (its bytes are part of the layout) with
/// its memo store, and end in one nested container of varying length (a trace entry's fresh `frames` list), read
/// the ordinary way after the fixed part. Records that hold anything else are never learnt.
#[derive(Default, Clone)]
pub(super) struct RecordShapes {
    pub(super) shapes: Vec<Shape>,
    /// Reused buffer for the layout of the record being read.
    pub(super) learning: Vec<Field>,
    pub(super) last: usize,
    /// For each layout, the one that matched right after it last time: entries follow each other in patterns
    /// (an allocation, its free_requested, its free_completed), so it is tried first.
    pub(super) next: Vec<u8>,
    pub(super) tries: u32,
    pub(super) hits: u32,
    /// Records left to read without trying the layouts, after a stretch where they rarely matched.
    pub(super) resting: u32,
}

#[derive(Clone)]
pub(super) struct Shape {
    /// The record's bytes from just after EMPTY_DICT through SETITEMS, padded to whole words.
    pub(super) bytes: Box<[u64]>,
    pub(super) mask: Box<[u64]>,
    pub(super) len: usize,
    pub(super) slot: Slot,
    pub(super) first_key: StrId,
    pub(super) fields: Box<[Field]>,
    /// The key of a last value that varies in length (a trace entry's fresh `frames` list): the layout ends with
    /// its opening opcode, and the record's SETITEMS follows the value.
    pub(super) tail: Option<StrId>,
    /// The record stores something in the memo besides itself (a memoized str, the tail), after its own slot.
    pub(super) stores: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    None,
    /// MEMOIZE: the next slot.
    Next,
    /// BINPUT / LONG_BINPUT with the index right after the opcode.
    Put1,
    Put4,
}

#[derive(Clone, Copy)]
pub(super) struct Field {
    pub(super) key: StrId,
    /// Offset of the value's argument bytes from the start of the record.
    pub(super) at: u32,
    pub(super) arg: Arg,
}

/// A fixed-width value encoding: its opcode is part of the layout, its argument bytes are not.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Arg {
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
    pub(super) fn of_scalar(op: u8, width: usize) -> Option<Arg> {
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
    pub(super) fn value(self, rest: &[u8], at: usize) -> Option<Value> {
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
    pub(super) fn memo_index(self, rest: &[u8], at: usize) -> usize {
        if self == Arg::Ref1 {
            rest[at] as usize
        } else {
            u32::from_le_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]) as usize
        }
    }

    /// Argument bytes that vary from record to record (the LONG1 count byte stays in the layout).
    pub(super) fn varying(self) -> std::ops::Range<usize> {
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
pub(super) const MAX_SHAPES: usize = 64;

pub(super) const MAX_SHAPE_LEN: usize = 1024;

/// Trying the layouts is stopped for a while when fewer than a quarter of this many tries match.
pub(super) const SHAPE_WINDOW: u32 = 1024;

pub(super) const SHAPE_REST: u32 = 16 * 1024;

impl RecordShapes {
    #[inline]
    pub(super) fn worth_trying(&mut self) -> bool {
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

    pub(super) fn learnable(&self) -> bool {
        self.shapes.len() < MAX_SHAPES
    }

    #[inline]
    pub(super) fn hit(&mut self, i: usize) {
        self.hits += 1;
        if let Some(n) = self.next.get_mut(self.last) {
            *n = i as u8;
        }
        self.last = i;
    }

    /// The first layout `rest` matches: the one that followed the last match last time, then the last match
    /// itself, then the others.
    #[inline]
    pub(super) fn matching(&self, rest: &[u8]) -> Option<usize> {
        let predicted = self.next.get(self.last).map_or(self.last, |&n| n as usize);
        if predicted != self.last && self.shapes.get(predicted).is_some_and(|s| s.matches(rest)) {
            return Some(predicted);
        }
        first_match(&self.shapes, self.last, rest)
    }

    pub(super) fn learn(&mut self, bytes: &[u8], first_key: StrId, fields: &[Field], tail: Option<StrId>) {
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
        self.next.push(self.shapes.len() as u8);
        self.shapes.push(Shape { bytes: bytes_w, mask, len: bytes.len(), slot, first_key, fields, tail, stores });
    }
}

/// The first of `shapes` that `rest` matches, trying `last` first.
#[inline]
pub(super) fn first_match(shapes: &[Shape], last: usize, rest: &[u8]) -> Option<usize> {
    // The same order as `(last + k) % n`, without a division per entry: nearly every entry matches `last`.
    let n = shapes.len();
    if last < n && shapes[last].matches(rest) {
        return Some(last);
    }
    (last.saturating_add(1).min(n)..n).chain(0..last.min(n)).find(|&i| shapes[i].matches(rest))
}

impl Shape {
    #[inline]
    pub(super) fn matches(&self, rest: &[u8]) -> bool {
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
pub(super) enum Record {
    Done(Value),
    /// Not a dict the builder takes as a record: decode it the ordinary way.
    NotOne,
    /// A record the fast path cannot finish: the generic machine reads it again.
    GiveUp,
}

impl<B: Builder> Machine<'_, B> {
    /// Called just after an EMPTY_DICT: reads it, and every dict that follows it back to back, as long as each
    /// matches a known record layout, pushing their values. `false` (nothing consumed) if the first does not match.
    /// A list of a million trace entries is read here without going round the opcode loop once per entry.
    pub(super) fn known_records<R: Read>(&mut self, input: &mut Input<R>) -> Result<bool, PickleError> {
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
            let Some(v) = self.known_record(&mut cur, 0, base) else {
                if let Some(e) = self.fast_error.take() {
                    return Err(e);
                }
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

    /// A dict the builder takes as a record (see [`Builder::record_begin`]), from just after its MARK through its
    /// SETITEMS: each key and value goes to the builder as it is read, with no item list and no copy of values
    /// from the memo. Keys must be strs, values scalars, memo references, strs, int pairs or nested fast
    /// containers; anything else gives the record up to the generic path. A record made only of memo-referenced
    /// keys and fixed-width values also teaches its byte layout to [`RecordShapes`] (`body_start`: where the
    /// dict's bytes begin, after its EMPTY_DICT).
    pub(super) fn fast_record(&mut self, cur: &mut Cursor, depth: u32, base: u64, body_start: usize) -> Record {
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
                    match self.memo.referenced(idx as usize).as_deref() {
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
                    match self.memo.referenced(idx as usize).as_deref() {
                        Some(v) if v.is_open() => false,
                        None => false,
                        Some(v) => self.builder.record_field(key, v),
                    }
                }
                b'}' | b']' if depth < 2 => {
                    if tail.is_some() {
                        fixed = false;
                    }
                    tail = Some((key, cur.pos - body_start));
                    match self.fast_nested(cur, op, depth, base) {
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
                    self.routes.streamed += 1;
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
        outcome
    }

    /// A record whose bytes match a layout learnt from an earlier one (see [`RecordShapes`]): its fields are read
    /// at their known offsets and sent to the builder, then its tail, if its layout has one, the ordinary way.
    /// `None` (nothing consumed, nothing stored) if no layout matches or the record cannot be finished here; the
    /// ordinary path then reads it. `depth` and `base` are as for [`Self::fast_body`].
    pub(super) fn known_record(&mut self, cur: &mut Cursor, depth: u32, base: u64) -> Option<Value> {
        let rest = &cur.buf[cur.pos..];
        let i = self.records.matching(rest)?;
        let shape = &self.records.shapes[i];
        let slot = match shape.slot {
            Slot::None => None,
            Slot::Next => Some(self.memo.dense_len() as u32),
            Slot::Put1 => Some(rest[1] as u32),
            Slot::Put4 => Some(u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]])),
        };
        if slot.is_some_and(|s| s as usize != self.memo.dense_len()) || !self.builder.record_begin(shape.first_key) {
            return None;
        }
        if !shape.stores {
            return self.known_fixed_record(cur, i, slot.is_some());
        }
        let memo_mark = self.memo.mark();
        let builder_mark = self.builder.mark();
        let routes_mark = self.routes;
        let scratch_mark = self.scratch.len();
        let v = self.known_storing_record(cur, i, slot, depth, base);
        if v.is_none() {
            self.memo.rewind(memo_mark);
            self.builder.rewind(builder_mark);
            self.routes = routes_mark;
            self.scratch.truncate(scratch_mark);
        }
        v
    }

    /// A known record that stores nothing in the memo but (with `stored`) itself, in the next slot.
    #[inline]
    pub(super) fn known_fixed_record(&mut self, cur: &mut Cursor, i: usize, stored: bool) -> Option<Value> {
        let rest = &cur.buf[cur.pos..];
        let shape = &self.records.shapes[i];
        for f in shape.fields.iter() {
            let at = f.at as usize;
            let v = match f.arg {
                Arg::Ref1 | Arg::Ref4 => {
                    let idx = f.arg.memo_index(rest, at);
                    // Only values already stored are referenced: the record stores nothing of its own but itself.
                    match self.memo.referenced(idx).as_deref() {
                        Some(v) if v.is_open() => return None,
                        None => return None,
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
        self.routes.layout += 1;
        Some(v)
    }

    /// A known record that stores values of its own after its slot: a memoized str, its tail. The caller undoes
    /// what it stored when it gives up.
    pub(super) fn known_storing_record(
        &mut self,
        cur: &mut Cursor,
        i: usize,
        slot: Option<u32>,
        depth: u32,
        base: u64,
    ) -> Option<Value> {
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
                    match self.memo.referenced(idx).as_deref() {
                        Some(v) if v.is_open() => return None,
                        None => return None,
                        Some(v) => {
                            if !self.builder.record_field(f.key, v) {
                                return None;
                            }
                            continue;
                        }
                    }
                }
                Arg::Str { id, memo } => {
                    if memo {
                        self.memo.push(Value::Str(id));
                    }
                    std::mem::ManuallyDrop::new(Value::Str(id))
                }
                // A number, None, a bool or a str id: nothing to drop (as in `known_fixed_record`).
                arg => std::mem::ManuallyDrop::new(arg.value(rest, at)?),
            };
            if !self.builder.record_field(f.key, &v) {
                return None;
            }
        }
        let (len, tail) = (shape.len, shape.tail);
        if let Some(key) = tail {
            if depth >= 2 {
                return None;
            }
            let mut c = Cursor { buf: cur.buf, pos: cur.pos + len };
            let op = c.buf[c.pos - 1];
            let v = self.fast_nested(&mut c, op, depth, base)?;
            if !self.builder.record_field(key, &v) || c.next() != Some(b'u') {
                return None;
            }
            cur.pos = c.pos;
        } else {
            cur.pos += len;
        }
        let v = self.builder.record_end()?;
        if let Some(slot) = slot {
            self.memo.fill_pending(slot, &v);
        }
        self.records.hit(i);
        self.routes.layout += 1;
        Some(v)
    }
}
