//! The hook through which a caller turns containers into its own compact values as they complete.

use super::*;

/// Hooks that see containers as they close and may replace them with compact values. `Send` so that a fork of it
/// can read a later part of the pickle on another thread (see [`Builder::fork`]).
pub trait Builder: Send + 'static {
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
    /// A builder for a helper thread that reads a later part of a long list of records: it knows what this one
    /// knows now, numbers its records after this one's, and must not make anything new that this one could also
    /// make meanwhile (a string, a frame, a stack: [`Builder::fork_batch_done`] says whether it did). Values from
    /// memo slots the helper cannot see arrive as `Custom(GAP, slot)`. `None`: no forking.
    fn fork(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
    /// On a fork: a batch of records ended, and the fork has made `records` since it began; whether they stand as
    /// they would in this builder's place (then they are kept, else the batch is dropped and the helper stops).
    fn fork_batch_done(&mut self, _records: usize) -> bool {
        false
    }
    /// Takes a fork's first `records` records as the next ones, resolving what it deferred through `resolve`
    /// (the value of a memo slot). `false`, with nothing changed, when they cannot be taken.
    fn adopt(&mut self, _fork: Self, _records: usize, _resolve: &dyn Fn(u32) -> Option<Value>) -> bool
    where
        Self: Sized,
    {
        false
    }
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
