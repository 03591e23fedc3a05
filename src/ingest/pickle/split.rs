//! Reading the later part of a long list of records on another core.
//!
//! A million-entry trace is one list, written in batches of 1000 (`( … APPENDS`), and reading it is most of the
//! work. Once the main thread has read a first part of the file (a training step or more: every key, frame, stack
//! and record layout a loop repeats), it forks a helper at the MARK of a batch:
//!
//! 1. The helper opens the file again about half-way through what is left and looks for what starts a batch:
//!    APPENDS, MARK, EMPTY_DICT and a record a known layout matches. That is a guess; the main thread confirms it
//!    only if it meets a batch MARK of the same list at exactly that byte.
//! 2. From there it reads batch after batch with its own machine: a copy of the memo as it stood at the fork, the
//!    strings, the record layouts and a fork of the builder. It does not know how many memo slots lie between the
//!    fork and its part, so its own slots follow the copied ones, and every reference past them reads as a gap,
//!    `Custom(GAP, slot)`. The builder defers a gap where it stands for a record's frames (a free event names its
//!    allocation's list) and refuses it anywhere else. A batch is kept only if it made records alone, in order,
//!    stored only values that can cross threads, and made nothing new (a string, a frame, a stack, an attribute
//!    set: the main thread may be making others meanwhile, with the same ids); the first that is not ends its part.
//! 3. When the main thread reaches that MARK, it tells the helper to stop after its batch, checks that it stands
//!    where the helper assumed (a list of records ending with its last record), appends the helper's memo slots
//!    (record ids moved up by the records read in between), has the builder take the records and resolve what it
//!    deferred against the now complete memo, and goes on reading after the helper's last batch. Anything amiss,
//!    and it reads on by itself: the result is the same either way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use super::*;

/// Opens the pickle again, positioned at a byte offset.
pub type Reopen = Arc<dyn Fn(u64) -> std::io::Result<Box<dyn Read + Send>> + Send + Sync>;

/// What a caller offers [`read_split`]: the pickle's length, and a way to read it from an offset on another thread.
pub struct SplitSource {
    pub reopen: Reopen,
    pub len: u64,
    /// The main thread lets the helper read its part to the end rather than stopping it at its next batch: for tests
    /// and fuzzing, where what the helper reads must not depend on which thread is faster.
    pub patient: bool,
}

/// What the helper read: the file's bytes `from..to`, holding `records` records.
#[derive(Clone, Copy, Debug)]
pub struct SplitStats {
    pub from: u64,
    pub to: u64,
    pub records: u32,
}

/// The main thread forks once past this fraction (1/n) of the file.
pub(super) const FORK_AT: u64 = 16;

/// Of what is left at the fork, the share (per thousand) the main thread reads itself; the helper reads the rest. Not
/// half: the helper reads the file itself (no thread reads ahead for it) and backs its own tables, and the main
/// thread still has to take its part over. Measured best on the bench's 1M files on two cores.
const MAIN_SHARE: u64 = 600;

/// The helper looks this far for the start of a batch (a batch of a million-entry trace is ~100 KB).
const SCAN_MAX: u64 = 16 << 20;

/// A memo value that can cross threads: what a trace's memo slots hold.
#[derive(Clone, Copy, Debug)]
pub(super) enum Scalar {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(StrId),
    IntPair(i32, i32),
    EmptyList,
    Custom(u8, u32),
}

impl Scalar {
    /// `None` for a value holding an `Rc`, an open container, or a gap.
    pub(super) fn of(v: &Value) -> Option<Scalar> {
        Some(match *v {
            Value::None => Scalar::None,
            Value::Bool(b) => Scalar::Bool(b),
            Value::Int(i) => Scalar::Int(i),
            Value::Float(f) => Scalar::Float(f),
            Value::Str(s) => Scalar::Str(s),
            Value::IntPair(a, b) => Scalar::IntPair(a, b),
            Value::PendingList(NO_SLOT) => Scalar::EmptyList,
            Value::Custom(GAP, _) => return None,
            Value::Custom(k, i) => Scalar::Custom(k, i),
            _ => return None,
        })
    }

    /// [`Scalar::of`] for a slot the helper stored, which the main thread takes over at the end of a batch, when
    /// every container the helper opened is closed. An empty list goes over as a closed empty list: one never given
    /// items (still pending in its own slot, as the generic path leaves a `frames: []`), or one given storage when
    /// it was referenced again (a free naming its allocation's `frames: []`). Only the latter's identity is lost,
    /// and nothing the helper kept can hold it: values holding an `Rc` never go over, and records are converted.
    /// `slot` is where the value is stored: a pending list stored under another slot's number, or a list held by
    /// anything but this slot, is shared, and does not go over.
    pub(super) fn of_local(v: &Value, slot: usize) -> Option<Scalar> {
        match v {
            Value::PendingList(s) if *s == NO_SLOT || *s as usize == slot => Some(Scalar::EmptyList),
            Value::List(l) if Rc::strong_count(l) == 1 => {
                let l = l.borrow();
                (l.items.is_empty() && l.run.is_none()).then_some(Scalar::EmptyList)
            }
            v => Scalar::of(v),
        }
    }

    pub(super) fn value(self) -> Value {
        match self {
            Scalar::None => Value::None,
            Scalar::Bool(b) => Value::Bool(b),
            Scalar::Int(i) => Value::Int(i),
            Scalar::Float(f) => Value::Float(f),
            Scalar::Str(s) => Value::Str(s),
            Scalar::IntPair(a, b) => Value::IntPair(a, b),
            Scalar::EmptyList => Value::PendingList(NO_SLOT),
            Scalar::Custom(k, i) => Value::Custom(k, i),
        }
    }
}

/// The main thread's side of a split.
pub(super) struct Split<B> {
    source: SplitSource,
    state: State,
    from_helper: Option<Receiver<Msg<B>>>,
    /// Set when the main thread reaches the helper's part or gives up on it: the helper stops after its batch.
    stop: Arc<AtomicBool>,
}

#[derive(Clone, Copy)]
enum State {
    Armed,
    /// The helper looks for its start; `first_record` records were read before the fork, the records are
    /// `Custom(kind, _)`.
    Forked {
        first_record: u32,
        kind: u8,
    },
    /// The helper reads from the MARK at `at`.
    Started {
        at: u64,
        first_record: u32,
        kind: u8,
    },
}

enum Msg<B> {
    Started(Option<u64>),
    Done(Option<Done<B>>),
}

/// A helper's part: whole batches up to byte `to`.
struct Done<B> {
    to: u64,
    /// The routes of the records kept.
    routes: Routes,
    builder: B,
    records: u32,
    /// The slot words the part stored (`words[first..]`), as the helper's memo holds them: the values of those that
    /// index its table of values are in `stored`, in order, and those that index its span values (the memo stores
    /// of spans it cached) index `span_values`.
    words: Vec<u32>,
    first: usize,
    stored: Vec<Scalar>,
    span_values: Vec<Scalar>,
    inline_kinds: (Option<u8>, Option<u8>),
    /// The fewest slots the main thread's memo may hold at the join for every reference the part made past the
    /// copied slots to name a slot stored by then.
    min_memo_len: u32,
}

impl<B> Split<B> {
    pub(super) fn new(source: SplitSource) -> Split<B> {
        Split { source, state: State::Armed, from_helper: None, stop: Arc::new(AtomicBool::new(false)) }
    }

    /// The next message from the helper, skipping any of the kind not waited for; `None` if it is gone.
    fn receive(&self, started: bool) -> Option<Msg<B>> {
        loop {
            match self.from_helper.as_ref()?.recv().ok()? {
                Msg::Started(_) if !started => continue,
                Msg::Done(_) if started => continue,
                m => return Some(m),
            }
        }
    }
}

impl<B> Drop for Split<B> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Everything a helper starts from; all of it owned, nothing shared.
struct Start<B> {
    reopen: Reopen,
    /// Where the helper starts looking for its first batch.
    target: u64,
    builder: B,
    strings: Strings,
    memo: MemoSeed,
    shapes: RecordShapes,
    refs: Vec<(Box<[u8]>, Scalar)>,
    first_record: u32,
    kind: u8,
}

impl<B: Builder> Machine<'_, B> {
    /// At a MARK at `off`, at or past `split_check_at`: forks the helper, learns where its part starts, or takes
    /// its part. `true` when it took it: the input then stands after the helper's last batch, and the MARK (the
    /// helper's first) is consumed.
    #[cold]
    pub(super) fn split_step<R: Read>(&mut self, input: &mut Input<R>, off: u64) -> Result<bool, PickleError> {
        let Some(split) = self.split.as_mut() else {
            self.split_check_at = u64::MAX;
            return Ok(false);
        };
        match split.state {
            State::Armed => {
                self.fork(off);
                Ok(false)
            }
            // The helper found its start long ago: looking takes it a fraction of a millisecond.
            State::Forked { first_record, kind } => match split.receive(true) {
                Some(Msg::Started(Some(at))) if at >= off => {
                    split.state = State::Started { at, first_record, kind };
                    self.split_check_at = at;
                    match off == at {
                        true => self.join(input, off),
                        false => Ok(false),
                    }
                }
                _ => {
                    self.end_split();
                    Ok(false)
                }
            },
            State::Started { at, .. } if off == at => self.join(input, off),
            // The helper's MARK went by unseen (read inside a container on the fast path), or it was no MARK: the
            // guess was wrong.
            State::Started { .. } => {
                self.end_split();
                Ok(false)
            }
        }
    }

    fn end_split(&mut self) {
        self.split = None;
        self.split_check_at = u64::MAX;
    }

    /// The list below a MARK about to be pushed, if it is a run of records ending with the builder's last.
    fn records_below(&self) -> Option<Run> {
        let Some(Value::List(rc)) = self.stack.last() else { return None };
        let l = rc.borrow();
        let run = l.run.filter(|r| l.items.is_empty() && r.len > 0)?;
        (run.first as usize + run.len as usize == self.builder.mark()).then_some(run)
    }

    fn fork(&mut self, off: u64) {
        let len = self.split.as_ref().map_or(0, |s| s.source.len);
        let plain = self.memo.sparse.is_empty() && !self.memo.overwritten && self.fast_error.is_none();
        let run = if plain { self.records_below() } else { None };
        let Some(run) = run else {
            // Not a batch of records (the MARK of a dict, say): the next MARK is asked.
            self.split_check_at = off + 1;
            return;
        };
        let Some(builder) = self.builder.fork() else {
            self.end_split();
            return;
        };
        let Some(split) = self.split.as_mut() else { return };
        let target = off + len.saturating_sub(off) / 1000 * MAIN_SHARE;
        let (first_record, kind) = (run.first + run.len, run.kind);
        let start = Start {
            reopen: split.source.reopen.clone(),
            target,
            builder,
            strings: self.strings.clone(),
            memo: self.memo.seed(),
            shapes: self.records.clone(),
            refs: self.refs.iter().filter_map(|(k, v)| Some((k.clone(), Scalar::of(v)?))).collect(),
            first_record,
            kind,
        };
        let (tx, rx) = channel();
        let stop = split.stop.clone();
        let spawned = std::thread::Builder::new().name("split-read".into()).spawn(move || helper(start, tx, &stop));
        if spawned.is_err() {
            self.end_split();
            return;
        }
        split.from_helper = Some(rx);
        split.state = State::Forked { first_record, kind };
        self.split_check_at = target;
    }

    /// At the helper's MARK: takes its part if everything stands as it assumed.
    fn join<R: Read>(&mut self, input: &mut Input<R>, off: u64) -> Result<bool, PickleError> {
        let Some(split) = self.split.take() else { return Ok(false) };
        self.split_check_at = u64::MAX;
        if !split.source.patient {
            split.stop.store(true, Ordering::Relaxed);
        }
        let State::Started { first_record, kind, .. } = split.state else { return Ok(false) };
        let Some(Msg::Done(Some(done))) = split.receive(false) else { return Ok(false) };
        let Some(run) = self.records_below() else { return Ok(false) };
        let here = self.builder.mark();
        let fits = run.kind == kind
            && self.memo.dense_len() >= done.min_memo_len as usize
            && self.memo.sparse.is_empty()
            && !self.memo.overwritten
            && here >= first_record as usize
            && u32::try_from(here).ok().and_then(|h| h.checked_add(done.records)).is_some();
        if !fits {
            return Ok(false);
        }
        if (self.memo.inline_kind, self.memo.inline_kind_b) != done.inline_kinds {
            return Ok(false);
        }
        let Ok(src) = (split.source.reopen)(done.to) else { return Ok(false) };
        // The helper's slots follow the ones stored so far; its records come after the ones read so far.
        let memo_mark = self.memo.mark();
        let shift = here as u32 - first_record;
        let records = (kind, first_record, shift);
        if !self.memo.append_words(&done.words[done.first..], &done.stored, &done.span_values, records) {
            self.memo.rewind(memo_mark);
            return Ok(false);
        }
        let memo = &self.memo;
        if !self.builder.adopt(done.builder, done.records as usize, &|slot| memo.get(slot).map(|v| v.clone())) {
            self.memo.rewind(memo_mark);
            return Ok(false);
        }
        if let Some(Value::List(rc)) = self.stack.last() {
            if let Some(r) = rc.borrow_mut().run.as_mut() {
                r.len += done.records;
            }
        }
        self.split_stats = Some(SplitStats { from: off, to: done.to, records: done.records });
        self.routes.add(done.routes);
        input.restart_at(src, done.to);
        Ok(true)
    }
}

/// The helper thread: finds where its part starts, says so, reads it.
fn helper<B: Builder>(start: Start<B>, tx: Sender<Msg<B>>, stop: &AtomicBool) {
    let found = (start.reopen)(start.target).ok().and_then(|src| {
        let mut input = Input::new(src);
        input.base = start.target;
        let at = find_batch(&mut input, &start.shapes)?;
        Some((input, at))
    });
    let Some((input, at)) = found else {
        let _ = tx.send(Msg::Started(None));
        return;
    };
    if tx.send(Msg::Started(Some(at))).is_ok() {
        let _ = tx.send(Msg::Done(read_part(start, input, stop)));
    }
}

/// From where the input stands, the first byte that looks like the MARK starting a batch of records: after an
/// APPENDS (and maybe a FRAME opcode), before an EMPTY_DICT and bytes one of `shapes` matches. The input is left
/// on it.
fn find_batch<R: Read>(input: &mut Input<R>, shapes: &RecordShapes) -> Option<u64> {
    let from = input.offset();
    // What must follow a candidate to judge it: the longest layout.
    let ahead = MAX_SHAPE_LEN + 2;
    loop {
        if input.end - input.pos < 4 * ahead && !input.eof {
            input.fill(BUF_SIZE / 2).ok()?;
        }
        let buf = &input.buf[input.pos..input.end];
        let last = buf.len().checked_sub(ahead)?;
        for i in 1..last {
            if buf[i] != b'(' || buf[i + 1] != b'}' {
                continue;
            }
            let after_appends = buf[i - 1] == b'e' || (i >= 10 && buf[i - 9] == 0x95 && buf[i - 10] == b'e');
            if after_appends && shapes.matching(&buf[i + 2..]).is_some() {
                input.pos += i;
                return Some(input.offset());
            }
        }
        input.pos += last;
        if input.offset() - from > SCAN_MAX || input.eof {
            return None;
        }
    }
}

/// Reads whole batches from the MARK the input stands on, until one cannot be the helper's, the list ends, or the
/// main thread arrives.
fn read_part<B: Builder>(
    start: Start<B>,
    mut input: Input<Box<dyn Read + Send>>,
    stop: &AtomicBool,
) -> Option<Done<B>> {
    let Start { mut builder, strings, memo, shapes, refs, first_record, kind, .. } = start;
    let strings_len = strings.len();
    let refs_len = refs.iter().map(|(k, _)| k.len()).sum();
    let memo = memo.into_memo();
    let first_slot = memo.dense_len();
    let mut m = Machine {
        stack: vec![Value::PendingList(NO_SLOT)],
        marks: Vec::new(),
        memo,
        strings,
        builder: &mut builder,
        scratch: Vec::new(),
        spans: SpanCache::default(),
        refs: refs.into_iter().map(|(k, v)| (k, v.value())).collect(),
        refs_len,
        records: shapes,
        fast_error: None,
        split: None,
        split_check_at: u64::MAX,
        batch_stop: 1,
        split_stats: None,
        routes: Routes::default(),
    };
    // The end of the last batch kept: its offset, memo length and records.
    let mut kept = (input.offset(), first_slot, 0u32, 0usize);
    let mut kept_routes = Routes::default();
    while !stop.load(Ordering::Relaxed) {
        // FRAME opcodes may stand between batches.
        loop {
            if input.end - input.pos < 9 && !input.eof && input.fill(9).is_err() {
                break;
            }
            match input.buf[..input.end].get(input.pos) {
                Some(0x95) if input.end - input.pos >= 9 => input.pos += 9,
                _ => break,
            }
        }
        if input.buf[..input.end].get(input.pos) != Some(&b'(') {
            break;
        }
        let slots_before = m.memo.dense_len();
        if m.run(&mut input).is_err() {
            break;
        }
        let records = match m.stack.as_slice() {
            [Value::List(rc)] => {
                let l = rc.borrow();
                match l.run {
                    Some(r) if l.items.is_empty() && r.kind == kind && r.first == first_record => r.len,
                    _ => break,
                }
            }
            _ => break,
        };
        let plain = m.marks.is_empty()
            && m.strings.len() == strings_len
            && m.memo.sparse.is_empty()
            && !m.memo.overwritten
            && !m.memo.overflow
            && (slots_before..m.memo.dense_len()).all(|i| m.memo.local_value(i).is_some());
        if !plain || !m.builder.fork_batch_done(records as usize) {
            break;
        }
        kept = (input.offset(), m.memo.dense_len(), records, m.memo.gap_refs.borrow().len());
        kept_routes = m.routes;
    }
    let (to, slots_end, records, gap_refs) = kept;
    if records == 0 {
        return None;
    }
    // A reference past the copied slots named a slot stored before the part (the main thread's) or in it before the
    // reference: the memo the main thread has at the join must be long enough for every one of them.
    let min_memo_len = m.memo.gap_refs.borrow()[..gap_refs]
        .iter()
        .map(|&(slot, len)| (slot + 1).saturating_sub(len - first_slot as u32))
        .max()
        .unwrap_or(0);
    let mut stored = Vec::new();
    for i in first_slot..slots_end {
        if m.memo.slots[i] & TAG == 0 {
            stored.push(m.memo.local_value(i)?);
        }
    }
    let span_values = m.memo.span_values.iter().map(Scalar::of).collect::<Option<Vec<_>>>()?;
    let inline_kinds = (m.memo.inline_kind, m.memo.inline_kind_b);
    let mut words = std::mem::take(&mut m.memo.slots);
    words.truncate(slots_end);
    drop(m);
    Some(Done {
        to,
        routes: kept_routes,
        builder,
        records,
        words,
        first: first_slot,
        stored,
        span_values,
        inline_kinds,
        min_memo_len,
    })
}
