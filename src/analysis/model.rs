//! The report model: what every report shows, per GPU and for the whole input, as the analysis builds it and every
//! renderer reads it. Serialised as-is for `--format json` (schema version 1: fields are only ever added).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{attribution, chart, facts, fragments, job_view, observed, prediction, profile, serving, verdict, whatif};
use crate::timeline::stacks::StackId;
use crate::timeline::{AllocatorSettings, CaptureInfo, InputInfo};

/// Everything a report shows. Serialised as-is for `--format json` (schema version 1).
#[derive(Debug, Serialize)]
pub struct Analysis {
    pub schema_version: u32,
    pub tool: &'static str,
    pub tool_version: &'static str,
    pub inputs: Vec<InputInfo>,
    pub devices: Vec<DeviceReport>,
    pub allocator_settings: Option<AllocatorSettings>,
    pub capture: CaptureInfo,
    /// Rule findings (filled by the rule engine; empty until it runs).
    pub findings: Vec<Finding>,
    /// Every OOM message found in the logs, in the order found (the last per GPU is also that device's `oom`).
    pub ooms: Vec<crate::timeline::OomMessage>,
    /// GPUs only nvidia-smi saw beside a snapshot of another one (a node's other ranks), one line each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_gpus: Vec<observed::OtherGpu>,
    /// A serving engine's KV cache, from its log.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<serving::ServingSummary>,
    /// How the text artifacts' times were put on the snapshot's clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<crate::timeline::clock::ClockReport>,
    /// What the profiler exports (Nsight Systems, Nsight Compute) said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<profile::ProfileSummary>,
    /// Several ranks' snapshots: the rank table, the first OOM, the ranks that stand out, findings across ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<job_view::JobView>,
    /// Facts about the job rather than one GPU (a serving log's KV cache, profiler exports); rules see them with
    /// no device.
    #[serde(skip)]
    pub job_facts: facts::Facts,
    /// Facts of each Nsight Compute launch, for rules with `each = "kernel"`.
    #[serde(skip)]
    pub kernel_facts: Vec<facts::Facts>,
}

/// The moment a device's report describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Moment {
    /// The last OOM.
    Oom,
    /// The highest allocated bytes of the trace.
    Peak,
    /// The end of the capture (the file's final state).
    End,
    /// A moment the user asked for (`--at 12.5s`, `--at event:N`).
    Time,
}

impl Moment {
    /// As JSON and the Markdown table write it.
    pub fn name(self) -> &'static str {
        match self {
            Moment::Oom => "oom",
            Moment::Peak => "peak",
            Moment::End => "end",
            Moment::Time => "time",
        }
    }

    /// As messages say it ("at the OOM", "at the peak").
    pub fn words(self) -> &'static str {
        match self {
            Moment::Oom => "OOM",
            Moment::Peak => "peak",
            Moment::End => "end of the capture",
            Moment::Time => "requested moment",
        }
    }
}

impl std::fmt::Display for Moment {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// What a device's report was made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportSource {
    /// A snapshot: the allocator's own data.
    Snapshot,
    /// Only logs and nvidia-smi describe this GPU.
    Text,
}

impl ReportSource {
    pub fn name(self) -> &'static str {
        match self {
            ReportSource::Snapshot => "snapshot",
            ReportSource::Text => "text",
        }
    }
}

/// What says an OOM happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OomSource {
    /// An `oom` event in the snapshot's trace.
    Snapshot,
    /// Only the OOM message in a log.
    Log,
}

impl OomSource {
    pub fn name(self) -> &'static str {
        match self {
            OomSource::Snapshot => "snapshot",
            OomSource::Log => "log",
        }
    }
}

/// The caching allocator's pool a block belongs to. Declared in name order: reports list pools sorted by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pool {
    /// Segments for requests over 1 MiB.
    Large,
    /// 2 MiB segments for requests of at most 1 MiB.
    Small,
    /// A segment whose pool the snapshot does not say.
    Unknown,
}

impl Pool {
    pub fn name(self) -> &'static str {
        match self {
            Pool::Large => "large",
            Pool::Small => "small",
            Pool::Unknown => "unknown",
        }
    }
}

pub use crate::timeline::Severity;

#[derive(Debug, Serialize, Clone)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    pub device: Option<i64>,
    /// The memory this cause accounts for (a leak's growth, the memory outside PyTorch, the fragmented free
    /// bytes, the tensor); null where no size applies. The verdict ranks causes by it.
    pub bytes: Option<u64>,
    pub title: String,
    pub message: String,
    pub evidence: serde_json::Value,
    pub fix: String,
    pub references: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub device: i64,
    pub moment: Moment,
    /// Index of the trace event the state is taken right after (`null`: the file's final state, no trace).
    pub event_index: Option<u32>,
    pub time_us: Option<i64>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub active_bytes: u64,
    /// Freed by the program but still in use by another stream (`record_stream`).
    pub pending_free_bytes: u64,
    /// Reserved by PyTorch's cache but not allocated to a tensor.
    pub reserved_unallocated_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub segments: usize,
    pub blocks: usize,
    pub oom: Option<OomReport>,
    pub oom_count: usize,
    pub peak: Option<PeakReport>,
    pub end: Totals,
    pub free_by_pool: Vec<PoolFree>,
    pub top_allocations: Vec<Allocation>,
    pub by_stack: Vec<StackGroup>,
    pub trace: TraceReport,
    /// Live memory by what it is for (see rules/categories.toml), biggest first.
    pub by_category: Vec<CategoryBytes>,
    /// The budget's prediction beside the live bytes per category (`oomdoc analyze --model …`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<prediction::Comparison>,
    /// Memory as nvidia-smi saw this GPU, and outside PyTorch over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<observed::ObservedMemory>,
    pub source: ReportSource,
    /// A GPU only an OOM message names, beside snapshots of other GPUs: its own entry, said as unmatched, so the
    /// log's OOM is never dropped for want of a snapshot to join it to.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unmatched: bool,
    /// The answer first: what filled this GPU and why (set once the rules have run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<verdict::Verdict>,
    /// What holds the most memory at the moment: the largest category and where it was allocated.
    #[serde(skip)]
    pub holder: Option<verdict::Holder>,
    /// At an OOM: the run replayed through the allocator model with the standard remedies, each answering
    /// whether the OOM (and every later request) would have been avoided.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub whatif: Vec<whatif::WhatIf>,
    /// At a fragmentation OOM: the live blocks that pin the pool's free memory in pieces, and when over the trace
    /// the free-but-unusable memory was largest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinning: Option<fragments::Pinning>,
    pub notes: Vec<String>,
    /// Allocated and reserved over the trace, reduced for a picture (the HTML report); not in the JSON.
    #[serde(skip)]
    pub chart: Option<chart::Chart>,
    /// The segments at the moment, block by block, for a picture (the HTML report); not in the JSON.
    #[serde(skip)]
    pub segment_map: Option<chart::SegmentMap>,
    /// Every stack that holds live memory at the moment, with its bytes, largest first: the HTML report's flame
    /// graph (`by_stack` keeps only the top ones); not in the JSON.
    #[serde(skip)]
    pub live_stacks: Vec<(StackId, u64)>,
    /// Every fact the rules may test (`oomdoc facts`).
    #[serde(skip)]
    pub facts: facts::Facts,
}

#[derive(Debug, Serialize)]
pub struct CategoryBytes {
    pub category: &'static str,
    pub bytes: u64,
    pub count: usize,
    /// How these bytes were known: a label torch recorded, the allocating stack, or lifetime and size.
    pub source_bytes: SourceBytes,
}

#[derive(Debug, Serialize, Default, Clone, Copy)]
pub struct SourceBytes {
    pub label: u64,
    pub stack: u64,
    pub inferred: u64,
}

#[derive(Debug, Serialize, Clone, Copy)]
pub struct Totals {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub active_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct OomReport {
    pub source: OomSource,
    /// Snapshot: the rounded block size the allocator searched for. Log: the size the message names (the
    /// segment PyTorch asked the driver for); null when the message gives none.
    pub requested_bytes: Option<u64>,
    /// What the driver reported free on the GPU at the failure.
    pub device_free_bytes: Option<u64>,
    /// The free figure may be the allocator's estimate (total − reserved), not the driver's: XPU writes that when its
    /// runtime cannot tell.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub device_free_estimated: bool,
    pub time_us: Option<i64>,
    pub event_index: Option<u32>,
    pub stream: Option<u64>,
    pub pool: Option<Pool>,
    /// Free bytes cached in the pool and stream the request could have used.
    pub cached_free_in_pool_bytes: Option<u64>,
    pub largest_free_in_pool_bytes: Option<u64>,
    /// The request would have fit in the cached free bytes if they were one block.
    pub fits_in_cached_free: Option<bool>,
    pub stack: Vec<String>,
    pub culprit: String,
    /// The OOM message a log reported for this GPU (the last one), with its figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<crate::timeline::OomMessage>,
}

#[derive(Debug, Serialize)]
pub struct PeakReport {
    pub allocated_bytes: u64,
    pub event_index: Option<u32>,
    pub time_us: Option<i64>,
    pub reserved_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct PoolFree {
    pub pool: Pool,
    pub stream: u64,
    pub pool_id: (i64, i64),
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub free_blocks: usize,
}

#[derive(Debug, Serialize)]
pub struct Allocation {
    pub bytes: u64,
    pub requested_bytes: u64,
    pub address: u64,
    pub stream: u64,
    /// Trace index of the `alloc` that made it, when the trace has it.
    pub event_index: Option<u32>,
    /// Time since it was allocated, when the trace has timestamps.
    pub age_us: Option<i64>,
    pub culprit: String,
    /// Innermost frame first: `file:line:function`.
    pub stack: Vec<String>,
    /// What it is for (see `by_category`).
    pub category: &'static str,
    /// How that was known: `label`, `stack` or `inferred` (null for `unknown`).
    pub source: Option<attribution::Source>,
    /// For an inferred category: what decided it, in a phrase.
    #[serde(rename = "inferred_from", skip_serializing_if = "Option::is_none")]
    pub reason: Option<attribution::Reason>,
    #[serde(skip)]
    pub stack_id: StackId,
}

#[derive(Debug, Serialize)]
pub struct StackGroup {
    pub bytes: u64,
    pub count: usize,
    pub culprit: String,
    /// The allocation site and its callers in the user's code, innermost first.
    pub callers: String,
    pub stack: Vec<String>,
    /// What the group's memory is for; one stack's blocks may differ (the backward's gradients and
    /// temporaries), so a group is one stack and one category.
    pub category: &'static str,
    pub source: Option<attribution::Source>,
    #[serde(rename = "inferred_from", skip_serializing_if = "Option::is_none")]
    pub reason: Option<attribution::Reason>,
    #[serde(skip)]
    pub stack_id: StackId,
}

#[derive(Debug, Serialize, Default)]
pub struct TraceReport {
    pub entries: usize,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub span_us: Option<i64>,
    pub actions: BTreeMap<&'static str, usize>,
    /// The trace reaches back to an empty allocator (nothing was cut off by the ring buffer).
    pub complete: bool,
    pub frees_without_alloc: usize,
    pub live_without_alloc: usize,
    /// The replayed trace lands exactly on the file's final segments.
    pub replay_matches_file: Option<bool>,
}
