//! The common model every parser produces and every analysis reads: per-device allocation timelines.

pub mod clock;
pub mod observed;
pub mod profile;
pub mod replay;
pub mod reported;
pub mod simulator;
pub use reported::Severity;
pub mod stacks;

use serde::Serialize;

pub use observed::{
    GpuProcess, KvCapacity, KvStat, Malformed, MegatronLog, MegatronMemory, MemorySample, MigInstance, OomKind,
    OomLimit, OomMessage, Preemption, ServingLog, Stamp,
};
use stacks::{StackId, Stacks, StrId, Strings};

/// What happened, in the allocator's own terms.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    Annotate,
    /// torch_npu: the workspace allocator's snapshot marker. Its entries are set apart from the device's trace by
    /// the reader (see `CaptureInfo::workspace_entries`); one left in a trace is a marker like `snapshot`.
    WorkspaceSnapshot,
    /// An action name this version of oomdoc does not know; kept so counts stay honest, ignored by replay.
    Unknown,
}

impl Action {
    pub const ALL: [Action; 12] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::Annotate,
        Action::WorkspaceSnapshot,
        Action::Unknown,
    ];

    pub fn from_name(s: &str) -> Action {
        Action::ALL.into_iter().find(|a| a.name() == s).unwrap_or(Action::Unknown)
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
            Action::WorkspaceSnapshot => "workspace_snapshot",
            Action::Unknown => "unknown",
        }
    }

    /// Actions that change no allocator state.
    pub fn is_marker(self) -> bool {
        matches!(self, Action::Snapshot | Action::Oom | Action::Annotate | Action::WorkspaceSnapshot | Action::Unknown)
    }
}

/// Sentinel for "no string" in compact records.
pub const NO_STR: StrId = u32::MAX;

/// One allocator event (a snapshot trace entry). Millions are kept, so it is 32 bytes: what few events differ in
/// (stream, pool, compile context, user metadata, the driver's free bytes at an OOM) is interned per device as
/// [`EventAttrs`] and read through [`DeviceTimeline::attrs`]; the time is stored with a sentinel.
#[derive(Clone, Debug)]
pub struct Event {
    pub addr: u64,
    /// Meaning depends on the action: caller's size for `alloc`, requested size for frees, segment or mapped
    /// bytes for segment events, rounded search size for `oom`, active bytes for `snapshot`.
    pub size: u64,
    time_us: i64,
    pub stack: StackId,
    /// Index into the device's [`EventAttrTable`], 24 bits little-endian.
    attrs: [u8; 3],
    pub action: Action,
}

const _: () = assert!(std::mem::size_of::<Event>() == 32);

const NO_U64: u64 = u64::MAX;
const NO_TIME: i64 = i64::MIN;
const NO_POOL: (i32, i32) = (i32::MIN, i32::MIN);

impl Event {
    pub fn new(action: Action, addr: u64, size: u64) -> Event {
        Event { addr, size, time_us: NO_TIME, stack: stacks::EMPTY_STACK, attrs: [0; 3], action }
    }

    /// Microseconds since the Unix epoch (torch ≥ 2.2).
    pub fn time_us(&self) -> Option<i64> {
        (self.time_us != NO_TIME).then_some(self.time_us)
    }

    pub fn set_time_us(&mut self, v: i64) {
        self.time_us = v.max(NO_TIME + 1);
    }

    /// Its attributes' index in the device's table (0: the defaults).
    pub fn attrs_id(&self) -> u32 {
        u32::from_le_bytes([self.attrs[0], self.attrs[1], self.attrs[2], 0])
    }

    pub(crate) fn set_attrs_id(&mut self, id: u32) {
        let b = id.to_le_bytes();
        self.attrs = [b[0], b[1], b[2]];
    }
}

/// What an event says besides its action, address, size, stack and time. Few distinct values occur in a trace
/// (a handful of streams and pools, "N/A" compile contexts), so they are stored once per device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventAttrs {
    pub stream: u64,
    device_free: u64,
    pub compile_context: StrId,
    pub user_metadata: StrId,
    pool_id: (i32, i32),
}

impl Default for EventAttrs {
    fn default() -> Self {
        EventAttrs { stream: 0, device_free: NO_U64, compile_context: NO_STR, user_metadata: NO_STR, pool_id: NO_POOL }
    }
}

impl EventAttrs {
    /// Only on `oom`: what `cudaMemGetInfo` reported free.
    pub fn device_free(&self) -> Option<u64> {
        (self.device_free != NO_U64).then_some(self.device_free)
    }

    pub fn set_device_free(&mut self, v: u64) {
        self.device_free = v.min(NO_U64 - 1);
    }

    /// The memory pool of the event (torch ≥ 2.12).
    pub fn pool_id(&self) -> Option<(i64, i64)> {
        (self.pool_id != NO_POOL).then_some((self.pool_id.0 as i64, self.pool_id.1 as i64))
    }

    pub fn set_pool_id(&mut self, (a, b): (i64, i64)) {
        let clamp = |v: i64| v.clamp(i32::MIN as i64 + 1, i32::MAX as i64) as i32;
        self.pool_id = (clamp(a), clamp(b));
    }
}

/// A trace with more distinct stream/pool/context values than an event can name.
#[derive(Debug, thiserror::Error)]
#[error("more than {MAX_ATTRS} distinct stream/pool/context values in the trace")]
pub struct TooManyAttrs;

/// The distinct [`EventAttrs`] of a trace; index 0 is the defaults.
#[derive(Clone, Debug)]
pub struct EventAttrTable {
    list: Vec<EventAttrs>,
    index: rustc_hash::FxHashMap<EventAttrs, u32>,
    /// The attributes given last and their index.
    last: (EventAttrs, u32),
}

/// An event's attribute index has 24 bits.
pub const MAX_ATTRS: usize = 1 << 24;

impl Default for EventAttrTable {
    fn default() -> Self {
        let d = EventAttrs::default();
        EventAttrTable { list: vec![d], index: [(d, 0)].into_iter().collect(), last: (d, 0) }
    }
}

impl EventAttrTable {
    pub fn get(&self, e: &Event) -> &EventAttrs {
        self.list.get(e.attrs_id() as usize).unwrap_or(&self.list[0])
    }

    /// Gives `e` these attributes. Fails past 16.7 million distinct ones (a trace of nothing but OOMs, each with
    /// its own free figure).
    pub fn assign(&mut self, e: &mut Event, a: EventAttrs) -> Result<(), TooManyAttrs> {
        e.set_attrs_id(self.intern(a)?);
        Ok(())
    }

    /// The index of these attributes, added if new (see [`EventAttrTable::assign`]).
    #[inline]
    pub fn intern(&mut self, a: EventAttrs) -> Result<u32, TooManyAttrs> {
        // Consecutive events mostly share their attributes: check the last one before hashing.
        if self.last.0 == a {
            return Ok(self.last.1);
        }
        let id = match self.index.get(&a) {
            Some(&id) => id,
            None => {
                if self.list.len() >= MAX_ATTRS {
                    return Err(TooManyAttrs);
                }
                let id = self.list.len() as u32;
                self.list.push(a);
                self.index.insert(a, id);
                id
            }
        };
        self.last = (a, id);
        Ok(id)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Every distinct attribute set, indexed by [`Event::attrs_id`].
    pub fn all(&self) -> &[EventAttrs] {
        &self.list
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    pub fn from_name(s: &str) -> Option<BlockState> {
        Some(match s {
            "active_allocated" => BlockState::ActiveAllocated,
            // The docstring says "awaiting", the serializer writes "pending": accept both.
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            _ => return None,
        })
    }
}

/// A block of a segment in the file's final state.
#[derive(Clone, Debug)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: Option<u64>,
    pub state: BlockState,
    pub stack: StackId,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Small,
    Large,
}

/// A segment (one cudaMalloc, or one mapped range of an expandable segment) in the file's final state.
#[derive(Clone, Debug)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub kind: PoolKind,
    pub pool_id: (i64, i64),
    pub expandable: bool,
    pub stack: StackId,
    pub blocks: Vec<Block>,
    /// The sums as the file states them, kept to check them against the blocks.
    pub declared_allocated: Option<u64>,
    pub declared_active: Option<u64>,
}

/// Everything known about one GPU.
#[derive(Debug, Default)]
pub struct DeviceTimeline {
    pub device: i64,
    /// Trace entries in chronological order.
    pub events: Vec<Event>,
    /// The attributes its events refer to.
    pub event_attrs: EventAttrTable,
    /// The allocator state when the file was written (complete even when the trace is not).
    pub segments: Vec<Segment>,
    /// Memory as nvidia-smi saw it, in the order read (see `timeline::clock` for their times).
    pub memory_samples: Vec<MemorySample>,
    /// Processes on the GPU at the last nvidia-smi capture that listed them.
    pub processes: Vec<GpuProcess>,
    /// MIG instances at the last capture that listed them.
    pub mig: Vec<MigInstance>,
    /// The GPU's name and PCI bus id, when a capture gave them.
    pub name: Option<String>,
    pub bus_id: Option<String>,
}

impl DeviceTimeline {
    /// An event's stream, pool, compile context, user metadata and OOM free bytes.
    pub fn attrs(&self, e: &Event) -> &EventAttrs {
        self.event_attrs.get(e)
    }

    /// Allocator events or a final state from a snapshot (as opposed to text artifacts only).
    pub fn has_allocator_data(&self) -> bool {
        !self.events.is_empty() || !self.segments.is_empty()
    }
}

/// Allocator settings recorded by torch ≥ 2.3.
#[derive(Debug, Default, Clone, Serialize)]
pub struct AllocatorSettings {
    pub alloc_conf: Option<String>,
    pub expandable_segments: Option<bool>,
    /// Bytes; `None` when unlimited (the file writes SIZE_MAX as -1).
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    /// `(interval start in MiB, divisions)`, sorted.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
    /// Every setting as the file wrote it, for display.
    pub raw: Vec<(String, String)>,
}

/// A `record_function` marker (torch ≥ 2.5 `external_annotations`).
#[derive(Debug, Clone)]
pub struct Annotation {
    pub device: i64,
    pub time_us: i64,
    pub name: StrId,
    pub start: bool,
}

/// Where the data came from.
/// What an input is, as the JSON names it (`pytorch_snapshot`, `nvidia_smi`, …).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    #[default]
    PytorchSnapshot,
    Log,
    VllmLog,
    NvidiaSmi,
    Nsys,
    NsysSqlite,
    Ncu,
    Archive,
    Folder,
}

impl InputKind {
    /// As a report's input line says it.
    pub fn words(self) -> &'static str {
        match self {
            InputKind::PytorchSnapshot => "pytorch snapshot",
            InputKind::Log => "log",
            InputKind::VllmLog => "vLLM log",
            InputKind::NvidiaSmi => "nvidia-smi",
            InputKind::Nsys => "nsys",
            InputKind::NsysSqlite => "nsys sqlite",
            InputKind::Ncu => "ncu",
            InputKind::Archive => "archive",
            InputKind::Folder => "folder",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct InputInfo {
    pub path: String,
    pub kind: InputKind,
    pub format_version: String,
    pub bytes: u64,
    pub pickle_protocol: Option<u8>,
    /// Snapshots: which accelerator's allocator wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// How the file was compressed (`gzip`, `zstd`, `xz`, `bzip2`); absent when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<&'static str>,
    /// Text artifacts: the parts recognised and read (e.g. `load :: nvidia-smi (default table)`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    /// Text artifacts: sections or blocks not recognised, by their header.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Lines inside recognised blocks that could not be used (skipped; `--strict` makes them errors).
    #[serde(skip_serializing_if = "is_zero")]
    pub malformed_lines: usize,
    /// The first few of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub malformed: Vec<Malformed>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Default)]
pub struct Timeline {
    pub strings: Strings,
    pub stacks: Stacks,
    pub devices: Vec<DeviceTimeline>,
    pub inputs: Vec<InputInfo>,
    pub settings: Option<AllocatorSettings>,
    pub annotations: Vec<Annotation>,
    /// What was and was not recorded, in words for the report.
    pub capture: CaptureInfo,
    /// OOM reports found in logs, in the order found.
    pub ooms: Vec<OomMessage>,
    /// A serving engine's KV-cache log (vLLM).
    pub serving: ServingLog,
    /// Megatron-LM's memory lines.
    pub megatron: MegatronLog,
    /// How text artifacts' wall-clock stamps were put on the common clock.
    pub clock: Option<clock::ClockReport>,
    /// What Nsight Systems and Nsight Compute exports of the job said.
    pub profile: profile::ProfileData,
    /// The part of the trace a helper thread read (entries, first byte, last byte), when the file was read in two
    /// parts: said with the job's timings, part of no report.
    pub split_read: Option<(u32, u64, u64)>,
    /// How the reader decoded the trace entries: said with the job's timings, part of no report.
    pub read_routes: Option<ReadRoutes>,
}

/// Which accelerator's allocator wrote a snapshot. ROCm writes CUDA's format unchanged; only its C++ frames and its
/// messages tell it apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Cuda,
    Rocm,
    Xpu,
    Npu,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "CUDA",
            Backend::Rocm => "ROCm",
            Backend::Xpu => "XPU",
            Backend::Npu => "NPU",
        }
    }

    /// The environment variable that configures this backend's caching allocator.
    pub fn alloc_conf_var(self) -> &'static str {
        match self {
            Backend::Cuda => "PYTORCH_CUDA_ALLOC_CONF",
            // hipify renames the variable in ROCm builds (every HIP message names it).
            Backend::Rocm => "PYTORCH_HIP_ALLOC_CONF",
            Backend::Xpu => "PYTORCH_ALLOC_CONF",
            Backend::Npu => "PYTORCH_NPU_ALLOC_CONF",
        }
    }

    /// The backend an OOM message's device type names (`HIP out of memory` …).
    pub fn of_message(device_type: &str) -> Option<Backend> {
        match device_type {
            "CUDA" => Some(Backend::Cuda),
            "HIP" => Some(Backend::Rocm),
            "XPU" => Some(Backend::Xpu),
            "NPU" => Some(Backend::Npu),
            _ => None,
        }
    }
}

/// How many trace entries each route of the reader decoded: at fixed offsets from a learnt byte layout, field by
/// field as a streamed record, or whole by the generic pickle machine (see `ingest::pickle::Routes`).
/// A real trace is read almost all by layout; a key whose value varies in a way no layout can hold sends every entry down a slower route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadRoutes {
    pub layout: u64,
    pub streamed: u64,
    pub generic: u64,
    /// The trace entries the file holds, on every device.
    pub entries: u64,
}

impl ReadRoutes {
    /// The share of the entries read by learnt layout (0 when there are none).
    pub fn layout_share(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.layout as f64 / self.entries as f64
        }
    }
}

impl std::fmt::Display for ReadRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} trace entries: {} by learnt layout, {} streamed, {} generic",
            self.entries, self.layout, self.streamed, self.generic
        )
    }
}

/// What the capture settings recorded, inferred from the file.
#[derive(Debug, Default, Clone, Serialize)]
pub struct CaptureInfo {
    pub has_trace: bool,
    pub block_stacks: bool,
    pub trace_stacks: bool,
    pub cpp_frames: bool,
    pub time_stamps: bool,
    pub host_segments: usize,
    pub host_trace_entries: usize,
    pub unknown_actions: usize,
    /// Which accelerator's allocator wrote the file, and what said so.
    pub backend: Backend,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_evidence: Option<&'static str>,
    /// What newest torch writes in `allocator_settings`: whether the ring buffer wrapped, per device when it says
    /// so per device (`(device, wrapped)`), and its size.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ring_overflowed: Vec<(i64, bool)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_max_entries: Option<u64>,
    /// torch_npu: trace entries of the workspace allocator, split out of the device traces before the replay.
    #[serde(skip_serializing_if = "is_zero")]
    pub workspace_entries: usize,
    /// The workspace allocator's segments, taken out of the caching allocator's state.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub workspace_bytes: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl Timeline {
    pub fn device(&self, device: i64) -> Option<&DeviceTimeline> {
        self.devices.iter().find(|d| d.device == device)
    }

    pub fn device_mut(&mut self, device: i64) -> &mut DeviceTimeline {
        match self.devices.iter().position(|d| d.device == device) {
            Some(i) => &mut self.devices[i],
            None => {
                self.devices.push(DeviceTimeline { device, ..Default::default() });
                self.devices.sort_by_key(|d| d.device);
                self.devices.iter_mut().find(|d| d.device == device).expect("just inserted")
            }
        }
    }

    pub fn str(&self, id: StrId) -> &str {
        if id == NO_STR {
            ""
        } else {
            self.strings.get(id)
        }
    }
}
