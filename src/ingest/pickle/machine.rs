//! The generic stack machine: every data opcode, and the one that reports errors.

use super::*;

pub(super) struct Machine<'b, B: Builder> {
    pub(super) stack: Vec<Value>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) strings: Strings,
    pub(super) builder: &'b mut B,
    /// Work stack of the fast path (see `fast_container`).
    pub(super) scratch: Vec<Value>,
    pub(super) spans: SpanCache,
    /// Lists of memo references already decoded, by the bytes of their references (see `ref_list`).
    pub(super) refs: FxHashMap<Box<[u8]>, Value>,
    pub(super) refs_len: usize,
    pub(super) records: RecordShapes,
    /// An error the fast path met (a builder refusing a dict): its functions return `None` as when they give up,
    /// and the caller that left the opcode loop reports it. Kept out of their return values, which then fit in
    /// two registers: a `Result` with the error in it was a memory round trip for every trace entry.
    pub(super) fast_error: Option<PickleError>,
    /// A helper reading a later part of the pickle (see `split`), and the offset from which a MARK asks it how it
    /// goes (`u64::MAX`: never).
    pub(super) split: Option<Box<Split<B>>>,
    pub(super) split_check_at: u64,
    /// On a helper: `run` returns when an APPENDS leaves fewer marks than this (the end of a batch). 0 on the main
    /// thread: never.
    pub(super) batch_stop: usize,
    pub(super) split_stats: Option<SplitStats>,
    /// How many records each fast route read (see [`Routes`]).
    pub(super) routes: Routes,
}

impl<B: Builder> Machine<'_, B> {
    pub(super) fn err(offset: u64, message: impl Into<String>) -> PickleError {
        PickleError::Malformed { offset, message: message.into() }
    }

    #[inline]
    pub(super) fn pop(&mut self, off: u64, what: &str) -> Result<Value, PickleError> {
        self.stack.pop().ok_or_else(|| Self::err(off, format!("{what} needs a value but the stack is empty")))
    }

    #[inline]
    pub(super) fn pop_mark(&mut self, off: u64, what: &str) -> Result<usize, PickleError> {
        let m = self.marks.pop().ok_or_else(|| Self::err(off, format!("{what} without a preceding MARK")))?;
        if m > self.stack.len() {
            return Err(Self::err(off, format!("{what}: MARK points past the stack")));
        }
        Ok(m)
    }

    pub(super) fn run<R: Read>(&mut self, input: &mut Input<R>) -> Result<Value, PickleError> {
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
                b'(' => {
                    if off >= self.split_check_at && self.split_step(input, off)? {
                        continue;
                    }
                    self.marks.push(self.stack.len())
                }
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
                b'e' | 0x90 => {
                    self.appends(off)?;
                    if self.marks.len() < self.batch_stop {
                        return Ok(Value::None);
                    }
                }
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

    pub(super) fn make_tuple(&mut self, at: usize, off: u64) -> Result<Value, PickleError> {
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

    pub(super) fn memoize(&mut self, idx: u32, off: u64) -> Result<(), PickleError> {
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

    pub(super) fn recall(&mut self, idx: u32, off: u64) -> Result<(), PickleError> {
        let v = match self.memo.recalled(idx) {
            Some(v) => v.clone(),
            None => return Err(Self::err(off, format!("memo reference {idx} to a value never stored"))),
        };
        // A reference to an empty container not given items yet (an empty `frames` list used again, or a
        // self-referencing structure still being filled): give it real shared storage now, so both references see
        // the same items. It is the same object, so this is no second store into the slot.
        let v = match v {
            // NO_SLOT: a closed empty list the fast path stored without storage of its own.
            Value::PendingList(slot) if slot == idx || slot == NO_SLOT => {
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
    pub(super) fn item_depth(&self, at: usize, off: u64) -> Result<u32, PickleError> {
        let d = self.stack[at..].iter().map(Value::depth).max().unwrap_or(0);
        if d + 1 > MAX_DEPTH {
            return Err(PickleError::TooDeep { offset: off });
        }
        Ok(d)
    }

    pub(super) fn appends(&mut self, off: u64) -> Result<(), PickleError> {
        let at = self.pop_mark(off, "APPENDS")?;
        if at == 0 {
            return Err(Self::err(off, "APPENDS with no list below the MARK"));
        }
        self.extend_list(at, at - 1, off)
    }

    /// Moves `stack[at..]` into the list at `stack[target]`, letting the builder replace a list that closes.
    pub(super) fn extend_list(&mut self, at: usize, target: usize, off: u64) -> Result<(), PickleError> {
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
    pub(super) fn extend_dict(&mut self, at: usize, target: usize, off: u64) -> Result<(), PickleError> {
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
