//! The memo: 4-byte slots, most holding their value inline.

use super::*;

/// Memo: dense while the pickler numbers entries 0, 1, 2, … (it always does), sparse otherwise so a hostile
/// index like 0xFFFFFFF0 costs one map entry, not 64 GB.
///
/// A dense slot is 4 bytes: an index into `values`, or (with `SPAN_BIT`) into `span_values`, where the memo stores
/// of a cached span live once for all its occurrences; or the value itself, for the values a trace stores by the
/// million: a str (torch writes each entry's `compile_context` afresh), and the builder's `Custom` values of two
/// kinds (trace entries, frame lists). A snapshot whose frames are not shared has ~30 memo slots per trace entry;
/// at 16 bytes a slot that alone was 500 MB for a million entries.
pub(super) struct Memo {
    pub(super) slots: Vec<u32>,
    pub(super) values: Vec<Value>,
    pub(super) span_values: Vec<Value>,
    pub(super) sparse: FxHashMap<u32, Value>,
    /// A slot was stored twice (no pickler does that): memo references in equal bytes may then mean different
    /// values, so the span cache turns itself off.
    pub(super) overwritten: bool,
    /// More values than a slot can index (2³⁰): reported as an error when the pickle ends.
    pub(super) overflow: bool,
    /// The kind of the `Custom` values held in slots tagged `INLINE_A` (the first kind stored) and `INLINE_B`.
    pub(super) inline_kind: Option<u8>,
    pub(super) inline_kind_b: Option<u8>,
    /// Index in `values` of the one `PendingDict` that the slots of records still being read point to.
    pub(super) pending_at: Option<u32>,
    /// A reference from the file to this slot or a later one reads as a gap: on a helper (see `split`), whose own
    /// slots follow the ones it started with, but which does not know how many slots lie between.
    pub(super) visible: usize,
    /// On a helper: each reference past `visible`, with how many slots the helper's memo held then. The main
    /// thread checks at the join that each named a slot stored by then: a reference to one never stored is an
    /// error the helper cannot see.
    pub(super) gap_refs: std::cell::RefCell<Vec<(u32, u32)>>,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo {
            slots: Vec::new(),
            values: Vec::new(),
            span_values: Vec::new(),
            sparse: FxHashMap::default(),
            overwritten: false,
            overflow: false,
            inline_kind: None,
            inline_kind_b: None,
            pending_at: None,
            visible: usize::MAX,
            gap_refs: Default::default(),
        }
    }
}

/// A slot's top two bits say what the rest is: an index into `values` (00), `Custom(inline_kind, id)` (01), an
/// index into `span_values` (10), or (11) with the next bit clear `Custom(inline_kind_b, id)`, set a `Str`.
pub(super) const TAG: u32 = 3 << 30;

pub(super) const SPAN_BIT: u32 = 2 << 30;

pub(super) const INLINE_BIT: u32 = 1 << 30;

pub(super) const INLINE_SMALL: u32 = 3 << 30;

pub(super) const SMALL_STR: u32 = 1 << 29;

pub(super) const SMALL_MAX: u32 = 1 << 29;

/// The slot word of a closed empty list (`PendingList(NO_SLOT)`), taken from the top of the str range: torch writes
/// `frames: []` for every allocation with no Python frame, 57% of a real training trace's, and each would cost a
/// 16-byte value besides its slot.
pub(super) const EMPTY_LIST: u32 = INLINE_SMALL | SMALL_STR | (SMALL_MAX - 1);

/// The slot word of a slot a helper reading the later part of a pickle cannot see (see `split`): stored in the
/// part the main thread is still reading, or holding a value that cannot cross threads. It reads as
/// `Custom(GAP, its own index)`. Never in the main thread's memo.
pub(super) const GAP_WORD: u32 = INLINE_SMALL | SMALL_STR | (SMALL_MAX - 2);

/// A memo value: stored in a table, or made from its slot. What a slot holds inline (a str, a `Custom`, a closed
/// empty list) owns nothing, so `Inline` needs no drop: without the `ManuallyDrop`, every memo reference read on
/// the fast path paid a call to `Value`'s drop glue.
pub(super) enum MemoRef<'a> {
    Stored(&'a Value),
    Inline(std::mem::ManuallyDrop<Value>),
}

impl MemoRef<'_> {
    /// Only for values that own nothing (no `Rc` inside), which is all a slot can hold.
    #[inline]
    fn inline(v: Value) -> Self {
        debug_assert!(matches!(v, Value::Str(_) | Value::Custom(..) | Value::PendingList(NO_SLOT)));
        MemoRef::Inline(std::mem::ManuallyDrop::new(v))
    }
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
    pub(super) fn dense_len(&self) -> usize {
        self.slots.len()
    }

    /// Stores the next slot's value: in the slot itself when it is a str or a `Custom` of an inline kind.
    #[inline]
    pub(super) fn push(&mut self, v: Value) {
        match v {
            Value::Custom(kind, id) => return self.push_custom(kind, id),
            Value::Str(id) if id < SMALL_MAX - 2 => return self.push_slot(INLINE_SMALL | SMALL_STR | id),
            Value::PendingList(NO_SLOT) => return self.push_slot(EMPTY_LIST),
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
    pub(super) fn push_slot(&mut self, s: u32) {
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
    pub(super) fn grow_slots(&mut self) {
        self.slots.reserve(self.slots.capacity().max(1024));
        crate::huge_pages::advise(&self.slots);
    }

    #[inline]
    pub(super) fn put(&mut self, idx: u32, v: Value) {
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
    pub(super) fn push_custom(&mut self, kind: u8, id: u32) {
        if let Some(s) = self.custom_slot(kind, id) {
            self.push_slot(s);
        }
    }

    /// The slot word for `Custom(kind, id)`: the value itself when it fits, else an index into `values`.
    #[inline]
    pub(super) fn custom_slot(&mut self, kind: u8, id: u32) -> Option<u32> {
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
    pub(super) fn push_pending(&mut self) {
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
    pub(super) fn fill_pending(&mut self, idx: u32, v: &Value) {
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
    pub(super) fn dense_get(&self, i: usize) -> Option<MemoRef<'_>> {
        let s = *self.slots.get(i)?;
        match s & TAG {
            0 => self.values.get(s as usize).map(MemoRef::Stored),
            INLINE_BIT => Some(MemoRef::inline(Value::Custom(self.inline_kind.unwrap_or(0), s & !TAG))),
            SPAN_BIT => self.span_values.get((s & !TAG) as usize).map(MemoRef::Stored),
            _ if s == EMPTY_LIST => Some(MemoRef::inline(Value::PendingList(NO_SLOT))),
            _ if s == GAP_WORD => Some(MemoRef::inline(Value::Custom(GAP, i as u32))),
            _ if s & SMALL_STR != 0 => Some(MemoRef::inline(Value::Str(s & (SMALL_MAX - 1)))),
            _ => Some(MemoRef::inline(Value::Custom(self.inline_kind_b.unwrap_or(0), s & (SMALL_MAX - 1)))),
        }
    }

    /// The value a memo reference in the file (BINGET, LONG_BINGET) names.
    #[inline]
    pub(super) fn referenced(&self, i: usize) -> Option<MemoRef<'_>> {
        if i >= self.visible {
            self.gap_refs.borrow_mut().push((i as u32, self.slots.len() as u32));
            return Some(MemoRef::inline(Value::Custom(GAP, i as u32)));
        }
        self.dense_get(i)
    }

    /// [`Self::referenced`], sparse slots included.
    #[inline]
    pub(super) fn recalled(&self, idx: u32) -> Option<MemoRef<'_>> {
        self.referenced(idx as usize).or_else(|| self.sparse.get(&idx).map(MemoRef::Stored))
    }

    #[inline]
    pub(super) fn get(&self, idx: u32) -> Option<MemoRef<'_>> {
        self.dense_get(idx as usize).or_else(|| self.sparse.get(&idx).map(MemoRef::Stored))
    }

    /// Only slots holding a container still being filled, or a closed empty list about to be given storage, are
    /// ever updated; the others are never span or inline values.
    pub(super) fn get_mut(&mut self, idx: u32) -> Option<&mut Value> {
        match self.slots.get(idx as usize) {
            Some(&s) if s & TAG == 0 => self.values.get_mut(s as usize),
            Some(&EMPTY_LIST) => {
                if self.values.len() >= INLINE_BIT as usize {
                    self.overflow = true;
                    return None;
                }
                self.slots[idx as usize] = self.values.len() as u32;
                self.values.push(Value::PendingList(NO_SLOT));
                self.values.last_mut()
            }
            Some(_) => None,
            None => self.sparse.get_mut(&idx),
        }
    }

    /// The list in slot `idx`, just stored as open, closed with no items: its value moves into the slot word.
    pub(super) fn close_empty_list(&mut self, idx: u32) {
        match self.slots.get(idx as usize) {
            // The value stored last: taken back, so it costs nothing.
            Some(&s) if s & TAG == 0 && s as usize + 1 == self.values.len() && self.pending_at != Some(s) => {
                self.values.pop();
                self.slots[idx as usize] = EMPTY_LIST;
            }
            _ => {
                if let Some(m) = self.get_mut(idx) {
                    *m = Value::PendingList(NO_SLOT);
                }
            }
        }
    }

    pub(super) fn mark(&self) -> (usize, usize) {
        (self.slots.len(), self.values.len())
    }

    pub(super) fn rewind(&mut self, mark: (usize, usize)) {
        self.slots.truncate(mark.0);
        self.values.truncate(mark.1);
        if self.pending_at.is_some_and(|at| at as usize >= mark.1) {
            self.pending_at = None;
        }
    }

    /// The values stored in dense slots from `from` on.
    pub(super) fn stored_since(&self, from: usize) -> impl Iterator<Item = MemoRef<'_>> {
        (from..self.slots.len()).filter_map(|i| self.dense_get(i))
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len() + self.sparse.len()
    }
}

impl Memo {
    /// On a helper: the value of slot `i`, which it stored, as the main thread may take it over; `None` if it cannot
    /// go over (see [`Scalar::of_local`]).
    #[inline]
    pub(super) fn local_value(&self, i: usize) -> Option<Scalar> {
        self.dense_get(i).and_then(|v| Scalar::of_local(&v, i))
    }

    /// Appends the slot words a helper stored (see `split`). The values of the words that index its table of values
    /// are `stored`, in order; its span values are `span_values`, which join this memo's. Record ids of `kind` from
    /// `first` on move up by `shift`. `false` if a value or an id does not fit; the caller rewinds.
    pub(super) fn append_words(
        &mut self,
        words: &[u32],
        stored: &[Scalar],
        span_values: &[Scalar],
        (kind, first, shift): (u8, u32, u32),
    ) -> bool {
        let span_base = self.span_values.len() as u32;
        if span_base as usize + span_values.len() >= INLINE_BIT as usize {
            return false;
        }
        let shifted = |v: Scalar| match v {
            Scalar::Custom(k, id) if k == kind && id >= first => id.checked_add(shift).map(|id| Value::Custom(k, id)),
            v => Some(v.value()),
        };
        for &v in span_values {
            let Some(v) = shifted(v) else { return false };
            self.span_values.push(v);
        }
        let shift_id = |id: u32| if id >= first { id.checked_add(shift) } else { Some(id) };
        if self.slots.capacity() - self.slots.len() < words.len() {
            self.slots.reserve(words.len());
            crate::huge_pages::advise(&self.slots);
        }
        let mut stored = stored.iter();
        for &w in words {
            let word = match w & TAG {
                INLINE_BIT if self.inline_kind == Some(kind) => match shift_id(w & !TAG) {
                    Some(id) if id < INLINE_BIT => INLINE_BIT | id,
                    _ => return false,
                },
                INLINE_BIT => w,
                INLINE_SMALL if w & SMALL_STR == 0 && self.inline_kind_b == Some(kind) => {
                    match shift_id(w & (SMALL_MAX - 1)) {
                        Some(id) if id < SMALL_MAX => INLINE_SMALL | id,
                        _ => return false,
                    }
                }
                INLINE_SMALL => w,
                SPAN_BIT => SPAN_BIT | (span_base + (w & !TAG)),
                _ => {
                    let Some(v) = stored.next().and_then(|&v| shifted(v)) else { return false };
                    if self.values.len() >= INLINE_BIT as usize {
                        return false;
                    }
                    match v {
                        Value::Custom(k, id) => match self.custom_slot(k, id) {
                            Some(word) => word,
                            None => return false,
                        },
                        v => {
                            self.values.push(v);
                            self.values.len() as u32 - 1
                        }
                    }
                }
            };
            self.push_slot(word);
        }
        stored.next().is_none()
    }
}

/// The memo as a helper thread starts with it (see `split`): the slots stored so far, where a value that cannot
/// cross threads (one holding an `Rc`: a generic container) stands as a gap.
pub(super) struct MemoSeed {
    slots: Vec<u32>,
    values: Vec<Scalar>,
    inline_kind: Option<u8>,
    inline_kind_b: Option<u8>,
}

impl Memo {
    pub(super) fn seed(&self) -> MemoSeed {
        let mut values = Vec::new();
        let slots = self
            .slots
            .iter()
            .map(|&s| {
                let stored = match s & TAG {
                    0 => self.values.get(s as usize),
                    SPAN_BIT => self.span_values.get((s & !TAG) as usize),
                    // A closed empty list gets storage when referenced again, and then may be appended to: the
                    // helper must not make a copy of its own.
                    _ if s == EMPTY_LIST => return GAP_WORD,
                    _ => return s,
                };
                match stored.and_then(Scalar::of) {
                    Some(v) => {
                        values.push(v);
                        values.len() as u32 - 1
                    }
                    None => GAP_WORD,
                }
            })
            .collect();
        MemoSeed { slots, values, inline_kind: self.inline_kind, inline_kind_b: self.inline_kind_b }
    }
}

impl MemoSeed {
    /// The helper's memo: the seed's slots, then its own, which the file's references cannot name (the helper does
    /// not know their numbers).
    pub(super) fn into_memo(self) -> Memo {
        Memo {
            visible: self.slots.len(),
            slots: self.slots,
            values: self.values.into_iter().map(Scalar::value).collect(),
            inline_kind: self.inline_kind,
            inline_kind_b: self.inline_kind_b,
            ..Memo::default()
        }
    }
}
