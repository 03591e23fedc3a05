//! The fast path: containers decoded straight from the buffer, spans and reference lists replayed from caches.

use super::*;

/// Containers whose bytes hold only memo references and numbers decode to the same value every time the same
/// bytes recur (memo references are stable in a pickle whose slots are each written once). torch writes a fresh
/// frame dict and a fresh frame list per trace entry when its frames are not shared objects, so the same few
/// thousand stacks recur as identical byte spans hundreds of thousands of times: hashing the span and replaying
/// its memo stores is several times faster than decoding 30 dicts again.
#[derive(Default)]
pub(super) struct SpanCache {
    pub(super) index: FxHashMap<Box<[u8]>, u32>,
    pub(super) entries: Vec<SpanEntry>,
    pub(super) key_bytes: usize,
}

pub(super) struct SpanEntry {
    pub(super) value: Value,
    /// The memo stores made inside the span, in `Memo::span_values`.
    pub(super) memo: std::ops::Range<u32>,
}

/// Caps what a hostile file can make the cache hold.
pub(super) const SPAN_CACHE_MAX_BYTES: usize = 64 << 20;

/// Caps the key bytes the list cache keeps.
pub(super) const REF_CACHE_MAX_BYTES: usize = 64 << 20;

/// The bytes a memo reference takes, by opcode (BINGET, LONG_BINGET); 0 for any other opcode.
pub(super) const REF_WIDTH: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'h' as usize] = 2;
    t[b'j' as usize] = 5;
    t
};

/// What `Machine::ref_list` found after an EMPTY_LIST.
pub(super) enum RefList {
    /// Not a list of memo references in the next slot.
    No,
    /// One whose references made this value before: stored and consumed.
    Known(Value),
    /// One not seen before: read it, then `remember_refs` its key bytes (this range of the buffer).
    New(std::ops::Range<usize>),
}

pub(super) const SPAN_MAX_LEN: usize = 16 << 10;

/// What `pure_span_end` does on each opcode: skip this many argument bytes, or one of the special cases.
pub(super) const SPAN_OTHER: u8 = 0xff;

pub(super) const SPAN_OPEN: u8 = 0xfe;

pub(super) const SPAN_CLOSE: u8 = 0xfd;

pub(super) const SPAN_MARK: u8 = 0xfc;

pub(super) const SPAN_LONG1: u8 = 0xfb;

pub(super) const SPAN_OPS: [u8; 256] = {
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
pub(super) fn pure_span_end(buf: &[u8], start: usize) -> Option<usize> {
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

/// The opcodes [`fast_scalar`] decodes.
pub(super) const SCALAR_OPS: [bool; 256] = {
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
pub(super) fn memo_index(cur: &mut Cursor, op: u8) -> Option<u32> {
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
pub(super) fn fast_scalar(cur: &mut Cursor, op: u8, strings: &mut Strings) -> Option<Value> {
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

impl<B: Builder> Machine<'_, B> {
    /// The fast path. Called just after an EMPTY_DICT / EMPTY_LIST opcode at `off`: if the container's whole body
    /// is in the buffer and uses only plain scalars, memo references, tuples and (one level of) nested frame-like
    /// containers, decode it straight into its final value and consume it. Otherwise undo any memo entries it made
    /// and return `None`, leaving the input where it was for the generic machine. Records in memory snapshots (trace
    /// entries, frames, stacks) almost always qualify, so the generic stack/mark machinery is mostly skipped.
    pub(super) fn fast_container<R: Read>(
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
        let routes_mark = self.routes;
        let mut cur = Cursor { buf: &input.buf[input.pos..input.end], pos: 0 };
        match self.fast_body(&mut cur, is_dict, 0, off + 1) {
            Some(v) => {
                input.pos += cur.pos;
                Ok(Some(v))
            }
            None => {
                if let Some(e) = self.fast_error.take() {
                    return Err(e);
                }
                self.memo.rewind(memo_mark);
                self.scratch.truncate(scratch_mark);
                self.builder.rewind(builder_mark);
                // The records given up are read again: they count on the route that keeps them.
                self.routes = routes_mark;
                Ok(None)
            }
        }
    }

    /// Body of a fast container: `[memo] ( items u|e` or `[memo] item a` / `[memo] key value s`.
    pub(super) fn fast_body(&mut self, cur: &mut Cursor, is_dict: bool, depth: u32, base: u64) -> Option<Value> {
        // A layout holds its keys as they were when it was learnt: once a memo slot has been stored twice, a key's
        // memo reference may mean another key, so layouts are no longer trusted.
        if is_dict && !self.memo.overwritten && self.records.worth_trying() {
            if let Some(v) = self.known_record(cur, depth, base) {
                return Some(v);
            }
            if self.fast_error.is_some() {
                return None;
            }
        }
        let body_start = cur.pos;
        let slot = match cur.peek() {
            Some(0x94) => {
                cur.pos += 1;
                Some(self.memo.dense_len() as u32)
            }
            Some(b'q') => {
                let i = cur.at(1)?;
                cur.pos += 2;
                Some(i as u32)
            }
            Some(b'r') => {
                let b = cur.slice(1, 4)?;
                let i = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                cur.pos += 5;
                Some(i)
            }
            _ => None,
        };
        if let Some(slot) = slot {
            if slot as usize != self.memo.dense_len() {
                return None;
            }
            let pending = if is_dict { Value::PendingDict(slot) } else { Value::PendingList(slot) };
            self.memo.push(pending);
        }
        // An empty container: torch writes `frames: []` for every allocation made with no Python frame on the
        // stack (the autograd engine's backward, kernels called from C++): 57% of a real training trace's.
        let empty = cur.peek().is_some_and(closes_parent);
        let single = match cur.peek() {
            _ if empty => false,
            Some(b'(') => {
                cur.pos += 1;
                false
            }
            Some(_) => true,
            None => return None,
        };
        if is_dict && !single && !empty {
            match self.fast_record(cur, depth, base, body_start) {
                Record::Done(v) => {
                    if let Some(slot) = slot {
                        if let Some(m) = self.memo.get_mut(slot) {
                            *m = v.clone();
                        }
                    }
                    return Some(v);
                }
                Record::NotOne => {}
                Record::GiveUp => return None,
            }
        }
        let (close_many, close_one) = if is_dict { (b'u', b's') } else { (b'e', b'a') };
        let mark = self.scratch.len();
        loop {
            if empty {
                break;
            }
            let op = cur.next()?;
            match op {
                _ if op == close_many && !single => break,
                _ if op == close_one && single => break,
                b'h' | b'j' => {
                    let idx = memo_index(cur, op)?;
                    match self.memo.referenced(idx as usize).as_deref() {
                        Some(v) if v.is_open() => return None,
                        None => return None,
                        Some(v) => self.scratch.push(v.clone()),
                    }
                }
                0x94 | b'q' | b'r' => {
                    let idx = match op {
                        0x94 => self.memo.dense_len() as u32,
                        b'q' => {
                            let b = cur.next()?;
                            b as u32
                        }
                        _ => {
                            let b = cur.take(4)?;
                            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                        }
                    };
                    if idx as usize != self.memo.dense_len() || self.scratch.len() == mark {
                        return None;
                    }
                    let top = self.scratch.last().expect("checked").clone();
                    self.memo.push(top);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.scratch.len() < mark + n {
                        return None;
                    }
                    let at = self.scratch.len() - n;
                    let t = match &self.scratch[at..] {
                        [Value::Int(a), Value::Int(b)] if i32::try_from(*a).is_ok() && i32::try_from(*b).is_ok() => {
                            Value::IntPair(*a as i32, *b as i32)
                        }
                        items => {
                            let d = items.iter().map(Value::depth).max().unwrap_or(0) + 1;
                            if d > MAX_DEPTH {
                                return None;
                            }
                            Value::Tuple(Rc::new(Tuple { depth: d, items: items.to_vec() }))
                        }
                    };
                    self.scratch.truncate(at);
                    self.scratch.push(t);
                }
                // One level of nesting: the frames list of a trace entry, the frame dicts of a stack.
                b'}' | b']' if depth < 2 => match self.fast_nested(cur, op, depth, base) {
                    Some(v) => self.scratch.push(v),
                    None => return None,
                },
                _ => match fast_scalar(cur, op, &mut self.strings) {
                    Some(v) => self.scratch.push(v),
                    None => return None,
                },
            }
        }
        let n = self.scratch.len() - mark;
        if single && n != if is_dict { 2 } else { 1 } {
            return None;
        }
        let v = if is_dict {
            if !n.is_multiple_of(2) {
                return None;
            }
            let replaced = if n / 2 < BATCH {
                match self.builder.close_dict(&self.strings, &self.scratch[mark..]) {
                    Ok(v) => v,
                    Err(m) => {
                        self.fast_error = Some(Self::err(base + cur.pos as u64, m));
                        return None;
                    }
                }
            } else {
                None
            };
            match replaced {
                Some(v) => v,
                None => {
                    let d = self.scratch[mark..].iter().map(Value::depth).max().unwrap_or(0) + 1;
                    if d > MAX_DEPTH {
                        return None;
                    }
                    let items = self.scratch[mark..].to_vec();
                    Value::Dict(Rc::new(RefCell::new(Dict { depth: d, items })))
                }
            }
        } else {
            // A closed empty list: no storage of its own until a reference to it is appended to (see
            // `Machine::recall`).
            if empty {
                self.scratch.truncate(mark);
                if let Some(slot) = slot {
                    self.memo.close_empty_list(slot);
                }
                return Some(Value::PendingList(NO_SLOT));
            }
            let replaced = if n < BATCH { self.builder.close_list(&self.scratch[mark..]) } else { None };
            match replaced {
                Some(v) => v,
                None => {
                    let d = self.scratch[mark..].iter().map(Value::depth).max().unwrap_or(0) + 1;
                    if d > MAX_DEPTH {
                        return None;
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
        Some(v)
    }

    /// A container nested in a fast container, its opening opcode `op` just read: replayed from the span cache
    /// when its bytes were seen before, decoded otherwise.
    pub(super) fn fast_nested(&mut self, cur: &mut Cursor, op: u8, depth: u32, base: u64) -> Option<Value> {
        let start = cur.pos - 1;
        // A list of memo references (a trace entry's fresh `frames` list) is looked up by its references.
        let refs = if op == b']' && !self.memo.overwritten { self.ref_list(cur) } else { RefList::No };
        let refs_key = match refs {
            RefList::Known(v) => return Some(v),
            RefList::New(key) => Some(key),
            RefList::No => None,
        };
        // An empty container (a trace entry's `frames: []`) is cheaper to build than to look up as a span.
        let empty = matches!(cur.buf.get(cur.pos..cur.pos + 2), Some(&[0x94, op]) if closes_parent(op));
        let span =
            if self.memo.overwritten || refs_key.is_some() || empty { None } else { pure_span_end(cur.buf, start) };
        if let Some(end) = span {
            if let Some(&i) = self.spans.index.get(&cur.buf[start..end]) {
                let e = &self.spans.entries[i as usize];
                self.memo.slots.extend(e.memo.clone().map(|k| k | SPAN_BIT));
                cur.pos = end;
                return Some(e.value.clone());
            }
        }
        let memo_mark = self.memo.dense_len();
        let v = self.fast_body(cur, op == b'}', depth + 1, base)?;
        if let Some(key) = refs_key {
            self.remember_refs(&cur.buf[key], &v);
        } else if let Some(end) = span.filter(|&e| e == cur.pos) {
            self.remember_span(&cur.buf[start..end], &v, memo_mark);
        }
        Some(v)
    }

    /// Just after an EMPTY_LIST: a list stored in the next memo slot whose items are only memo references,
    /// `MEMOIZE ( h|j … e` or `MEMOIZE h|j a`. When the same bytes made a value before, that value is stored in
    /// the list's slot and the list consumed (`Known`); `New` gives where its key bytes are in `cur.buf`, to
    /// `remember_refs` once the list is read. The value of a list of references is a function of the references
    /// alone while no memo slot is stored twice and the builder calls it pure; equal bytes are equal references.
    #[inline]
    pub(super) fn ref_list(&mut self, cur: &mut Cursor) -> RefList {
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
        let end = refs_end(buf, start + 1 + marked as usize);
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
    pub(super) fn remember_refs(&mut self, key: &[u8], v: &Value) {
        let pure = matches!(v, Value::Custom(kind, _) if self.builder.is_pure(*kind));
        if pure && self.refs_len + key.len() <= REF_CACHE_MAX_BYTES {
            self.refs_len += key.len();
            self.refs.insert(key.into(), v.clone());
        }
    }

    /// Stores `v` in the memo if a memo opcode follows; `false` if it names a slot out of order.
    #[inline]
    pub(super) fn memo_store(&mut self, cur: &mut Cursor, v: &Value) -> bool {
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
    pub(super) fn remember_span(&mut self, bytes: &[u8], v: &Value, memo_mark: usize) {
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
}

/// Where a run of memo references (`h` and `j` opcodes) starting at `p` ends. The references are walked, not
/// decoded: their bytes are the key. A branch per opcode beats a table of widths here (the branches predict well;
/// a table load sits on the chain from one reference to the next), and runs of one width, the rule (past slot 255
/// every reference is a `j`), go four at a time with their opcode bytes loaded independently instead of each
/// waiting on the step before. It lands exactly where stepping one by one would.
#[inline]
pub(super) fn refs_end(buf: &[u8], mut p: usize) -> usize {
    loop {
        if let Some(w) = buf.get(p..p + 20) {
            if w[0] == b'j' && w[5] == b'j' && w[10] == b'j' && w[15] == b'j' {
                p += 20;
                continue;
            }
        }
        if let Some(w) = buf.get(p..p + 8) {
            if w[0] == b'h' && w[2] == b'h' && w[4] == b'h' && w[6] == b'h' {
                p += 8;
                continue;
            }
        }
        match buf.get(p) {
            Some(b'h') => p += 2,
            Some(b'j') => p += 5,
            _ => return p,
        }
    }
}

/// SETITEMS, SETITEM, APPENDS, APPEND: right after an empty container (and its memo store) they close or add to
/// its parent; an item would come first to add to the container itself.
#[inline]
fn closes_parent(op: u8) -> bool {
    matches!(op, b'u' | b's' | b'e' | b'a')
}

#[cfg(test)]
mod tests {
    use super::refs_end;

    /// The walk one reference at a time: what `refs_end` must agree with.
    fn stepwise(buf: &[u8], mut p: usize) -> usize {
        loop {
            match buf.get(p) {
                Some(b'h') => p += 2,
                Some(b'j') => p += 5,
                _ => return p,
            }
        }
    }

    #[test]
    fn the_four_at_a_time_walk_lands_where_stepping_does() {
        // Random runs of `h` and `j` references whose index bytes are often `h` or `j` themselves, cut anywhere.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let mut buf = Vec::new();
            let refs = next() % 40;
            let mix = next() % 3;
            for _ in 0..refs {
                let j = match mix {
                    0 => true,
                    1 => false,
                    _ => next() % 2 == 0,
                };
                buf.push(if j { b'j' } else { b'h' });
                for _ in 0..if j { 4 } else { 1 } {
                    buf.push([b'h', b'j', b'e', 0, 7][(next() % 5) as usize]);
                }
            }
            buf.push([b'e', b'a', b'h', b'j'][(next() % 4) as usize]);
            let cut = (next() as usize) % (buf.len() + 1);
            buf.truncate(cut);
            for from in 0..buf.len().min(3) {
                assert_eq!(refs_end(&buf, from), stepwise(&buf, from), "{buf:?} from {from}");
            }
        }
    }
}
