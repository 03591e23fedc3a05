//! Facts derived from the timeline: the allocator state at the moment that matters (the OOM, else the peak),
//! what was live and who allocated it, free space vs the failed request, and what the capture did not record.

pub mod attribution;
pub mod categories;
pub mod chart;
pub mod concatenation;
mod device;
pub mod diff;
pub mod facts;
pub mod fragments;
mod imbalance;
pub mod iterations;
pub mod job_view;
pub mod lifetimes;
pub mod megatron;
pub mod model;
pub mod observed;
pub mod prediction;
pub mod profile;
pub mod raising_line;
pub mod serving;
pub mod stacks;
pub mod verdict;
pub mod whatif;

use std::collections::BTreeMap;

pub use crate::threads::beside;
use crate::timeline::replay::Replay;
use crate::timeline::Timeline;
pub use model::*;
pub use stacks::{culprit, stack_frames, user_chain, FrameView};

pub const SCHEMA_VERSION: u32 = 1;

/// Which moment of the trace to describe.
#[derive(Clone, Debug, PartialEq)]
pub enum At {
    /// The last OOM if there is one, else the peak.
    Auto,
    Oom,
    Peak,
    End,
    /// Microseconds after the first trace event.
    Offset(i64),
    /// Right after this trace event.
    Event(u32),
}

impl std::str::FromStr for At {
    type Err = String;
    fn from_str(s: &str) -> Result<At, String> {
        let bad = || {
            format!(
                "--at {s:?}: expected oom, peak, end, a time after the trace start such as 12.5s or 300ms, or \
                 event:N"
            )
        };
        Ok(match s {
            "auto" => At::Auto,
            "oom" => At::Oom,
            "peak" => At::Peak,
            "end" => At::End,
            _ => {
                if let Some(n) = s.strip_prefix("event:") {
                    At::Event(n.parse().map_err(|_| bad())?)
                } else if let Some(ms) = s.strip_suffix("ms") {
                    At::Offset((ms.parse::<f64>().map_err(|_| bad())? * 1e3) as i64)
                } else if let Some(us) = s.strip_suffix("us") {
                    At::Offset(us.parse::<f64>().map_err(|_| bad())? as i64)
                } else if let Some(sec) = s.strip_suffix('s') {
                    At::Offset((sec.parse::<f64>().map_err(|_| bad())? * 1e6) as i64)
                } else {
                    return Err(bad());
                }
            }
        })
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub at: At,
    pub top: usize,
    pub device: Option<i64>,
    /// The GPU's total memory, when known: sizes the memory outside PyTorch.
    pub gpu_memory: Option<u64>,
    /// The process's memory cap (`set_per_process_memory_fraction` × the GPU), when known other than from the OOM
    /// message: a capped process runs out with the device's memory still free.
    pub memory_cap: Option<u64>,
    /// Split the chart's allocated bytes by category (one more pass over the trace: only the HTML report draws it).
    pub chart_categories: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { at: At::Auto, top: 10, device: None, gpu_memory: None, memory_cap: None, chart_categories: false }
    }
}

/// A moment or device asked for that the input does not have.
#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error("--device {device}: no such device in the input (devices present: {present})")]
    NoSuchDevice { device: i64, present: String },
    #[error("--at oom: device {0} has no OOM event in its trace")]
    NoOom(i64),
    #[error("--at event:{event}: device {device} has {events} trace events")]
    NoSuchEvent { event: u32, device: i64, events: usize },
    #[error("--at with a time: device {0}'s trace has no timestamps (torch < 2.2); use event:N")]
    NoTimestamps(i64),
}

/// Analyses every device (or the one asked for), classifying allocations with `cats`.
pub fn analyze(tl: &Timeline, opts: &Options, cats: &categories::Categorizer) -> Result<Analysis, AnalysisError> {
    analyze_keeping(tl, opts, cats, false).map(|(a, _)| a)
}

/// [`analyze`], also handing back each device's replay when `keep_replays` (to browse the trace without replaying
/// it again).
pub fn analyze_keeping<'t>(
    tl: &'t Timeline,
    opts: &Options,
    cats: &categories::Categorizer,
    keep_replays: bool,
) -> Result<(Analysis, Vec<Replay<'t>>), AnalysisError> {
    let mut devices = Vec::new();
    let mut replays = Vec::new();
    let mut ids: Vec<i64> = tl.devices.iter().map(|d| d.device).collect();
    if !tl.devices.iter().any(|d| d.has_allocator_data()) {
        ids.extend(observed::log_devices(tl));
    }
    ids.sort_unstable();
    ids.dedup();
    // Beside a snapshot, the GPUs an nvidia-smi log of the whole node also saw (other ranks' GPUs) are one line,
    // not a report each: they have no allocator data and no OOM message.
    let held: Vec<i64> = tl.devices.iter().filter(|d| d.has_allocator_data()).map(|d| d.device).collect();
    let snapshot_gpus = !held.is_empty();
    let mut other_gpus = Vec::new();
    for id in ids {
        if opts.device.is_some_and(|d| d != id) {
            continue;
        }
        match tl.device(id) {
            Some(dev) if dev.has_allocator_data() => {
                let (report, replay) = device::analyze_device(tl, dev, opts, cats)?;
                devices.push(report);
                if keep_replays {
                    replays.push(replay);
                }
            }
            Some(dev) if dev.memory_samples.is_empty() && dev.processes.is_empty() && dev.mig.is_empty() => {}
            Some(dev) if snapshot_gpus && observed::last_oom_message(tl, id).is_none() => {
                other_gpus.push(observed::other_gpu(dev));
            }
            _ => devices.push(observed::text_only_report(tl, id, &held)),
        }
    }
    if snapshot_gpus {
        // An OOM message naming a GPU no snapshot here holds (another rank's log, a snapshot taken on another GPU)
        // is its own text-only entry; in a job, the job view keeps it once, and not where a snapshot of it ran out.
        let mut unmatched: Vec<i64> = tl
            .ooms
            .iter()
            .filter_map(|o| o.device)
            .filter(|&id| !devices.iter().any(|d| d.device == id) && opts.device.is_none_or(|d| d == id))
            .collect();
        unmatched.sort_unstable();
        unmatched.dedup();
        for id in unmatched {
            devices.push(observed::text_only_report(tl, id, &held));
        }
    }
    // The GPU that ran out leads every report (the first to run out first); the others follow in their order.
    devices.sort_by_key(|d| {
        (d.oom.is_none(), d.oom.as_ref().map_or(i64::MAX, |_| d.time_us.unwrap_or(i64::MAX)), d.device)
    });
    if let Some(d) = opts.device {
        if devices.is_empty() {
            let have: Vec<String> = tl.devices.iter().map(|d| d.device.to_string()).collect();
            return Err(AnalysisError::NoSuchDevice {
                device: d,
                present: if have.is_empty() { "none".into() } else { have.join(", ") },
            });
        }
    }
    imbalance::imbalance_facts(tl, &mut devices);
    let profile_summary = profile::summarize(&tl.profile, opts.top);
    let mut job_facts = serving::facts(&tl.serving);
    megatron::facts(&tl.megatron, &mut job_facts);
    if let Some(p) = &profile_summary {
        profile::facts(p, &mut job_facts);
    }
    let analysis = Analysis {
        schema_version: SCHEMA_VERSION,
        tool: "oomdoc",
        tool_version: env!("CARGO_PKG_VERSION"),
        inputs: tl.inputs.clone(),
        devices,
        allocator_settings: tl.settings.clone(),
        capture: tl.capture.clone(),
        findings: Vec::new(),
        ooms: tl.ooms.clone(),
        other_gpus,
        serving: serving::summarize(&tl.serving),
        clock: tl.clock.clone(),
        profile: profile_summary,
        job: None,
        job_facts,
        kernel_facts: tl.profile.ncu_kernels.iter().map(profile::kernel_facts).collect(),
    };
    Ok((analysis, replays))
}

/// Most important first: errors before warnings before info, then by device in the report's order (the GPU that
/// ran out first), then by the memory they explain, then in rule order.
pub fn sort_findings(findings: &mut [Finding], device_order: &[i64]) {
    let place = |d: Option<i64>| d.map(|d| device_order.iter().position(|&o| o == d).unwrap_or(usize::MAX));
    findings.sort_by(|a, b| {
        b.severity.cmp(&a.severity).then(place(a.device).cmp(&place(b.device))).then(b.bytes.cmp(&a.bytes))
    });
}
