//! Every key (and action name) of a PyTorch memory snapshot that the reader looks for, declared once: its name, the
//! constant the reader matches on, where in the file it appears, and the torch version whose files first carry it.
//! The ids, the string table's first entries and the version dating all come from this one table; see
//! `ARCHITECTURE.md`, "Adding a key to the snapshot".

use crate::timeline::stacks::{StrId, Strings};
use crate::timeline::Backend;

/// Where in a snapshot a key is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The top-level dict.
    Top,
    /// A segment dict (`segments[i]`).
    Segment,
    /// A block dict (`segments[i].blocks[j]`).
    Block,
    /// A trace-entry dict (`device_traces[d][i]`).
    TraceEntry,
    /// The value of a trace entry's `action`.
    Action,
    /// A frame dict (in any `frames` list).
    Frame,
    /// The `allocator_settings` dict.
    Settings,
    /// An `external_annotations` dict.
    Annotation,
    /// Keys read in more than one of the places above.
    Shared,
}

/// One declared key.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    pub name: &'static str,
    pub place: Place,
    /// The torch version whose files first carry it, when its presence dates a file; `None` for keys present in
    /// every version that has their place, or whose presence says nothing of the version.
    pub since: Option<(u8, u8)>,
    /// Written by one accelerator's fork of the allocator only (its presence names the backend).
    pub dialect: Option<Backend>,
}

macro_rules! snapshot_keys {
    ($( $id:ident = $name:literal, $place:ident, $since:expr, $dialect:expr; )*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
        #[repr(u32)]
        enum KeyIndex { $($id),* }

        /// The id of each key in a string table that [`intern_keys`] began.
        #[allow(dead_code)]
        pub mod k {
            use crate::timeline::stacks::StrId;
            $(pub const $id: StrId = super::KeyIndex::$id as StrId;)*
        }

        /// The table, in id order.
        pub const KEYS: &[Key] = &[$(Key { name: $name, place: Place::$place, since: $since, dialect: $dialect }),*];
    };
}

// Appending keeps every earlier id; the order is otherwise free.
snapshot_keys! {
    FILENAME = "filename", Frame, None, None;
    NAME = "name", Shared, None, None;
    LINE = "line", Frame, None, None;
    ACTION = "action", TraceEntry, None, None;
    ADDR = "addr", TraceEntry, None, None;
    SIZE = "size", Shared, None, None;
    STREAM = "stream", Shared, None, None;
    DEVICE_FREE = "device_free", TraceEntry, None, None;
    TIME_US = "time_us", Shared, Some((2, 2)), None;
    FRAMES = "frames", Shared, None, None;
    COMPILE_CONTEXT = "compile_context", TraceEntry, Some((2, 8)), None;
    USER_METADATA = "user_metadata", TraceEntry, Some((2, 10)), None;
    POOL_ID = "pool_id", TraceEntry, Some((2, 12)), None;
    SEGMENTS = "segments", Top, None, None;
    DEVICE_TRACES = "device_traces", Top, None, None;
    ALLOCATOR_SETTINGS = "allocator_settings", Top, Some((2, 3)), None;
    EXTERNAL_ANNOTATIONS = "external_annotations", Top, Some((2, 5)), None;
    HOST_SEGMENTS = "host_segments", Top, Some((2, 14)), None;
    HOST_TRACES = "host_traces", Top, Some((2, 14)), None;
    DEVICE = "device", Shared, None, None;
    ADDRESS = "address", Shared, None, None;
    TOTAL_SIZE = "total_size", Segment, None, None;
    ALLOCATED_SIZE = "allocated_size", Segment, None, None;
    ACTIVE_SIZE = "active_size", Segment, None, None;
    REQUESTED_SIZE = "requested_size", Shared, None, None;
    SEGMENT_TYPE = "segment_type", Segment, None, None;
    SEGMENT_POOL_ID = "segment_pool_id", Segment, Some((2, 1)), None;
    IS_EXPANDABLE = "is_expandable", Segment, None, None;
    BLOCKS = "blocks", Segment, None, None;
    STATE = "state", Block, None, None;
    HISTORY = "history", Block, None, None;
    STAGE = "stage", Annotation, None, None;
    ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF", Settings, None, None;
    EXPANDABLE_SEGMENTS = "expandable_segments", Settings, None, None;
    MAX_SPLIT_SIZE = "max_split_size", Settings, None, None;
    GC_THRESHOLD = "garbage_collection_threshold", Settings, None, None;
    ROUNDUP = "roundup_power2_divisions", Settings, None, None;
    MAX_CACHED_SIZE = "max_cached_size", Settings, Some((2, 13)), None;
    SMALL = "small", Segment, None, None;
    A_ALLOC = "alloc", Action, None, None;
    A_FREE_REQUESTED = "free_requested", Action, None, None;
    A_FREE_COMPLETED = "free_completed", Action, None, None;
    A_SEGMENT_ALLOC = "segment_alloc", Action, None, None;
    A_SEGMENT_FREE = "segment_free", Action, None, None;
    A_SEGMENT_MAP = "segment_map", Action, None, None;
    A_SEGMENT_UNMAP = "segment_unmap", Action, None, None;
    A_SNAPSHOT = "snapshot", Action, None, None;
    A_OOM = "oom", Action, None, None;
    A_ANNOTATE = "annotate", Action, Some((2, 14)), None;
    INTERNAL_METADATA = "internal_metadata", TraceEntry, Some((2, 15)), None;
    // The XPU allocator's settings string (its env var is the device-generic one).
    XPU_ALLOC_CONF = "PYTORCH_ALLOC_CONF", Settings, None, Some(Backend::Xpu);
    // torch_npu: the workspace allocator's state, prepended to each device's trace.
    A_WORKSPACE_SNAPSHOT = "workspace_snapshot", Action, None, Some(Backend::Npu);
    // Newest torch: the ring buffer says outright that it wrapped (a bool, or one per device), and its size.
    TRACE_OVERFLOWED = "trace_alloc_overflowed", Settings, None, None;
    TRACE_MAX_ENTRIES = "trace_alloc_max_entries", Settings, None, None;
    // ROCm, where hipify renamed the settings string (its OOM message names this variable).
    HIP_ALLOC_CONF = "PYTORCH_HIP_ALLOC_CONF", Settings, None, Some(Backend::Rocm);
}

/// Interns every key into a fresh string table, so that each key's id is its index in [`KEYS`].
pub fn intern_keys(s: &mut Strings) {
    for (i, key) in KEYS.iter().enumerate() {
        let id = s.intern(key.name);
        debug_assert_eq!(id as usize, i, "keys must be interned first, and each once");
    }
}

/// The keys a file was seen to use: one bit per declared key.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct KeySet(u128);

const _: () = assert!(KEYS.len() <= 128, "KeySet holds one bit per declared key");

impl KeySet {
    /// Marks `id` seen; ids past the table (keys this reader does not know) are ignored.
    #[inline(always)]
    pub fn insert(&mut self, id: StrId) {
        if (id as usize) < KEYS.len() {
            self.0 |= 1u128 << id;
        }
    }

    pub fn contains(self, id: StrId) -> bool {
        (id as usize) < KEYS.len() && self.0 & (1u128 << id) != 0
    }

    pub fn or(self, o: KeySet) -> KeySet {
        KeySet(self.0 | o.0)
    }

    /// The declared keys in the set.
    pub fn keys(self) -> impl Iterator<Item = (StrId, &'static Key)> {
        KEYS.iter().enumerate().filter(move |(i, _)| self.0 & (1u128 << i) != 0).map(|(i, k)| (i as StrId, k))
    }

    /// The newest torch version the keys prove, if any does.
    pub fn newest_since(self) -> Option<(u8, u8)> {
        self.keys().filter_map(|(_, k)| k.since).max()
    }

    /// The accelerator a dialect key names, if one of the keys is a dialect's.
    pub fn dialect(self) -> Option<Backend> {
        self.keys().find_map(|(_, k)| k.dialect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_is_declared_once_and_its_id_is_its_place_in_the_table() {
        let mut s = Strings::default();
        intern_keys(&mut s);
        assert_eq!(s.len(), KEYS.len(), "a name declared twice would share one id");
        for (i, key) in KEYS.iter().enumerate() {
            assert_eq!(s.get(i as StrId), key.name);
        }
        assert_eq!(KEYS[k::INTERNAL_METADATA as usize].name, "internal_metadata");
        assert_eq!(KEYS[k::A_WORKSPACE_SNAPSHOT as usize].place, Place::Action);
    }

    #[test]
    fn the_newest_key_dates_the_set() {
        let mut seen = KeySet::default();
        assert_eq!(seen.newest_since(), None);
        seen.insert(k::TIME_US);
        seen.insert(k::POOL_ID);
        seen.insert(k::ACTION);
        assert_eq!(seen.newest_since(), Some((2, 12)));
        seen.insert(10_000);
        assert_eq!(seen.newest_since(), Some((2, 12)), "an unknown key dates nothing");
        assert_eq!(seen.dialect(), None);
        seen.insert(k::XPU_ALLOC_CONF);
        assert_eq!(seen.dialect(), Some(Backend::Xpu));
    }
}
