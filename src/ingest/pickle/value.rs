//! The values the machine builds: scalars, strs as interned ids, shared containers, and the builder's own.

use super::*;

/// The `Custom` kind of a memo slot a helper reading a later part of the pickle cannot see (see `split`): the id
/// is the slot's index. No builder makes it; a builder that forks must refuse it wherever its content would matter.
pub const GAP: u8 = 0xff;

/// A value the helper could not see, or a tuple holding one: where it stands in for a str, an int or a pool id, the
/// builder must refuse it rather than read it as absent.
pub fn holds_gap(v: &Value) -> bool {
    match v {
        Value::Custom(GAP, _) => true,
        Value::Tuple(t) => t.items.iter().any(|v| matches!(v, Value::Custom(GAP, _))),
        _ => false,
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
    pub(super) items: Vec<Value>,
    /// A list of nothing but `Custom(kind, first)`, `Custom(kind, first + 1)`, … is kept as that run, with
    /// `items` empty: a device's million trace entries would otherwise be 16 MB of items saying 0, 1, 2, …
    pub(super) run: Option<Run>,
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
    pub(super) fn of(items: &[Value]) -> Option<Run> {
        let Some(&Value::Custom(kind, first)) = items.first() else { return None };
        let len = u32::try_from(items.len()).ok()?;
        first.checked_add(len)?;
        let consecutive =
            items.iter().zip(first..).all(|(v, i)| matches!(*v, Value::Custom(k, j) if k == kind && j == i));
        consecutive.then_some(Run { kind, first, len })
    }

    pub(super) fn values(self) -> impl Iterator<Item = Value> {
        (self.first..self.first + self.len).map(move |i| Value::Custom(self.kind, i))
    }
}

impl List {
    pub(super) fn new(depth: u32, stack: &mut Vec<Value>, at: usize) -> List {
        match Run::of(&stack[at..]) {
            Some(run) => {
                stack.truncate(at);
                List { depth, items: Vec::new(), run: Some(run) }
            }
            None => List { depth, items: stack.split_off(at), run: None },
        }
    }

    /// Moves `stack[at..]` to the end of the list.
    pub(super) fn append(&mut self, stack: &mut Vec<Value>, at: usize) {
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
    /// A memo value that may still be filled: a container whose slot is the one being read (its items are not
    /// known yet). A closed empty list the fast path stored (`PendingList(NO_SLOT)`) is not open.
    #[inline]
    pub(super) fn is_open(&self) -> bool {
        match self {
            Value::PendingDict(_) => true,
            Value::PendingList(slot) => *slot != super::NO_SLOT,
            _ => false,
        }
    }

    pub(super) fn depth(&self) -> u32 {
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
