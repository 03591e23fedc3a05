//! What the text artifacts add to a device's report: the OOM message a log holds for it, memory as nvidia-smi saw
//! it, and from both, the memory outside PyTorch's cache. A figure no input supports is left out, never guessed.

use serde::Serialize;

use super::facts::{Facts, Unit};
use super::{DeviceReport, Moment, OomReport, OomSource, ReportSource, Totals, TraceReport};
use crate::timeline::replay::Replay;
use crate::timeline::{Backend, DeviceTimeline, GpuProcess, OomMessage, Timeline};

/// What a CUDA context alone takes outside PyTorch with lazy module loading (CUDA ≥ 11.7: 300–600 MiB): unavoidable,
/// so never the memory that decided an OOM.
const BARE_CONTEXT: u64 = 512 << 20;

/// nvidia-smi samples further than this from the moment do not describe it.
const NEAREST_SAMPLE_US: i64 = 10_000_000;

/// Points kept of the non-PyTorch series (the report shows the shape, not every sample).
const SERIES_POINTS: usize = 64;

/// The last OOM message of a log for this GPU. A message that names no GPU belongs to the only GPU there is.
pub fn last_oom_message(tl: &Timeline, device: i64) -> Option<&OomMessage> {
    let named = tl.ooms.iter().rev().find(|o| o.device == Some(device));
    let only_gpu = tl.devices.len() <= 1 || tl.devices.iter().all(|d| d.device == device);
    named.or_else(|| only_gpu.then(|| tl.ooms.iter().rev().find(|o| o.device.is_none())).flatten())
}

/// Whether a state-only dump holds the state an OOM message describes: the same allocated and reserved bytes as the
/// message prints them (two decimals of the largest unit, as torch's `format_size`). A dump written where the OOM was
/// caught (`_snapshot()` in the `except` handler) does; one written at any other moment almost never matches both.
pub fn describes_state(m: &OomMessage, allocated: u64, reserved: u64) -> bool {
    let Some(a) = m.allocated_bytes else { return false };
    // Torch ≥ 2.1 prints the reserved-but-unallocated bytes, older ones the reserved total; the reader derives the
    // other from the two printed figures, which need not print back the same.
    let reserved_matches =
        m.reserved_unallocated_bytes.is_some_and(|u| same_as_printed(u, reserved.saturating_sub(allocated)))
            || m.reserved_bytes.is_some_and(|r| same_as_printed(r, reserved));
    same_as_printed(a, allocated) && reserved_matches
}

/// `exact` printed the way torch prints sizes reads as `printed` (itself read from such a print).
fn same_as_printed(printed: u64, exact: u64) -> bool {
    fn torch_format(n: u64) -> String {
        match n {
            0..=1024 => format!("{n} bytes"),
            1025..=1_048_576 => format!("{:.2} KiB", n as f64 / 1024.0),
            1_048_577..=1_073_741_824 => format!("{:.2} MiB", n as f64 / 1_048_576.0),
            _ => format!("{:.2} GiB", n as f64 / 1_073_741_824.0),
        }
    }
    torch_format(printed) == torch_format(exact)
}

/// GPUs the logs name (or GPU 0 for messages that name none), for a timeline without a snapshot device.
pub fn log_devices(tl: &Timeline) -> Vec<i64> {
    let mut v: Vec<i64> = tl.ooms.iter().map(|o| o.device.unwrap_or(0)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Memory as nvidia-smi saw one GPU.
#[derive(Debug, Serialize)]
pub struct ObservedMemory {
    pub name: Option<String>,
    pub bus_id: Option<String>,
    pub samples: usize,
    /// Samples put on the snapshot's clock (see the top-level `clock`).
    pub aligned_samples: usize,
    pub total_bytes: Option<u64>,
    pub max_used_bytes: Option<u64>,
    /// The sample nearest the report's moment (within 10 s), with PyTorch's reserved bytes then.
    pub at_moment: Option<ObservedAt>,
    /// Memory outside PyTorch's cache over time: (Unix µs, used − reserved bytes), at most 64 points.
    pub non_pytorch_series: Vec<(i64, i64)>,
    pub processes: Vec<GpuProcess>,
}

#[derive(Debug, Serialize)]
pub struct ObservedAt {
    pub time_us: i64,
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    /// used − reserved (0 when nvidia-smi saw less than PyTorch reserved: a sample taken before a cudaMalloc).
    pub non_pytorch_bytes: u64,
    pub input: usize,
    pub line: usize,
}

/// PyTorch's reserved bytes at a Unix µs time, from the replay (`None` outside the trace). `times` are the
/// (event index, time) of the timestamped events, in order.
fn reserved_at(times: &[(usize, i64)], replay: &Replay, t: i64) -> Option<u64> {
    let (first, last) = (times.first()?, times.last()?);
    if t < first.1 || t > last.1 + NEAREST_SAMPLE_US {
        return None;
    }
    let k = times.partition_point(|&(_, et)| et <= t);
    let idx = times[k.saturating_sub(1)].0;
    replay.reserved_series.get(idx)
}

/// Summarises the nvidia-smi samples of a device; `replay` (a snapshot's) places them against reserved memory.
pub fn summarize(dev: &DeviceTimeline, replay: Option<&Replay>, moment_us: Option<i64>) -> Option<ObservedMemory> {
    if dev.memory_samples.is_empty() && dev.processes.is_empty() {
        return None;
    }
    let samples = &dev.memory_samples;
    let total_bytes = samples.iter().rev().find_map(|s| s.total.or_else(|| Some(s.used? + s.free?)));
    let max_used_bytes = samples.iter().filter_map(|s| s.used).max();
    let aligned: Vec<(i64, u64, usize, usize)> =
        samples.iter().filter_map(|s| Some((s.time_us?, s.used?, s.input, s.line))).collect();
    let mut at_moment = None;
    let mut series = Vec::new();
    if let Some(replay) = replay {
        let times: Vec<(usize, i64)> =
            dev.events.iter().enumerate().filter_map(|(i, e)| e.time_us().map(|t| (i, t))).collect();
        if let Some(m) = moment_us {
            let nearest =
                aligned.iter().filter(|s| (s.0 - m).abs() <= NEAREST_SAMPLE_US).min_by_key(|s| (s.0 - m).abs());
            if let Some(&(t, used, input, line)) = nearest {
                if let Some(reserved) = reserved_at(&times, replay, t) {
                    at_moment = Some(ObservedAt {
                        time_us: t,
                        used_bytes: used,
                        reserved_bytes: reserved,
                        non_pytorch_bytes: used.saturating_sub(reserved),
                        input,
                        line,
                    });
                }
            }
        }
        let points: Vec<(i64, i64)> = aligned
            .iter()
            .filter_map(|&(t, used, _, _)| reserved_at(&times, replay, t).map(|r| (t, used as i64 - r as i64)))
            .collect();
        let step = points.len().div_ceil(SERIES_POINTS).max(1);
        series = points.into_iter().step_by(step).collect();
    }
    Some(ObservedMemory {
        name: dev.name.clone(),
        bus_id: dev.bus_id.clone(),
        samples: samples.len(),
        aligned_samples: aligned.len(),
        total_bytes,
        max_used_bytes,
        at_moment,
        non_pytorch_series: series,
        processes: dev.processes.clone(),
    })
}

/// A GPU nvidia-smi saw that no snapshot or OOM message describes.
#[derive(Debug, Serialize)]
pub struct OtherGpu {
    pub device: i64,
    pub name: Option<String>,
    pub total_bytes: Option<u64>,
    pub max_used_bytes: Option<u64>,
    pub samples: usize,
}

pub fn other_gpu(dev: &DeviceTimeline) -> OtherGpu {
    let s = &dev.memory_samples;
    OtherGpu {
        device: dev.device,
        name: dev.name.clone(),
        total_bytes: s.iter().rev().find_map(|x| x.total.or_else(|| Some(x.used? + x.free?))),
        max_used_bytes: s.iter().filter_map(|x| x.used).max(),
        samples: s.len(),
    }
}

/// An OOM as a log message tells it, with no allocator state behind it.
pub fn message_oom(m: &OomMessage) -> OomReport {
    OomReport {
        source: OomSource::Log,
        requested_bytes: m.requested_bytes,
        device_free_bytes: m.free_bytes,
        device_free_estimated: Backend::of_message(&m.device_type) == Some(Backend::Xpu),
        time_us: m.time_us,
        event_index: None,
        stream: None,
        pool: None,
        cached_free_in_pool_bytes: None,
        largest_free_in_pool_bytes: None,
        fits_in_cached_free: None,
        stack: m.user_frame.iter().cloned().collect(),
        culprit: m.user_frame.clone().unwrap_or_default(),
        message: Some(m.clone()),
    }
}

/// The report of a GPU only text artifacts describe: its OOM message and what nvidia-smi saw. `snapshot_gpus`: the
/// GPUs the input's snapshots hold (none without a snapshot); beside them, an OOM of this GPU is said as unmatched.
pub fn text_only_report(tl: &Timeline, device: i64, snapshot_gpus: &[i64]) -> DeviceReport {
    let empty = DeviceTimeline { device, ..Default::default() };
    let dev = tl.device(device).unwrap_or(&empty);
    let msg = last_oom_message(tl, device);
    let allocated = msg.and_then(|m| m.allocated_bytes).unwrap_or(0);
    let reserved = msg.and_then(|m| m.reserved_bytes).unwrap_or(0);
    let unallocated = msg.and_then(|m| m.reserved_unallocated_bytes).unwrap_or(reserved.saturating_sub(allocated));
    let oom = msg.map(message_oom);
    let oom_count = tl.ooms.iter().filter(|o| o.device.unwrap_or(0) == device).count();
    let unmatched = msg.is_some() && !snapshot_gpus.is_empty();
    let mut notes = Vec::new();
    if unmatched {
        let ids: Vec<String> = snapshot_gpus.iter().map(i64::to_string).collect();
        notes.push(format!(
            "No snapshot given is of GPU {device} (the snapshot here is of GPU {}): the figures are the OOM message's \
             alone. Give that GPU's own snapshot (_dump_snapshot() in the process that ran out) to see what held its \
             memory.",
            ids.join(", ")
        ));
    } else if msg.is_some() {
        notes.push(
            "No snapshot for this GPU: the figures are the OOM message's. A snapshot shows who allocated what: \
             torch.cuda.memory._record_memory_history() early in the job, _dump_snapshot() when it fails."
                .to_string(),
        );
    }
    let observed = summarize(dev, None, msg.and_then(|m| m.time_us));
    let mut report = DeviceReport {
        device,
        moment: if msg.is_some() { Moment::Oom } else { Moment::End },
        event_index: None,
        time_us: msg.and_then(|m| m.time_us),
        allocated_bytes: allocated,
        reserved_bytes: reserved,
        active_bytes: allocated,
        pending_free_bytes: 0,
        reserved_unallocated_bytes: unallocated,
        largest_free_block_bytes: 0,
        segments: 0,
        blocks: 0,
        oom,
        oom_count,
        peak: None,
        end: Totals { allocated_bytes: allocated, reserved_bytes: reserved, active_bytes: allocated },
        free_by_pool: Vec::new(),
        top_allocations: Vec::new(),
        by_stack: Vec::new(),
        trace: TraceReport::default(),
        by_category: Vec::new(),
        budget: None,
        observed,
        source: ReportSource::Text,
        unmatched,
        verdict: None,
        holder: None,
        whatif: Vec::new(),
        pinning: None,
        notes,
        chart: None,
        segment_map: None,
        live_stacks: Vec::new(),
        facts: Facts::default(),
    };
    report.facts = text_only_facts(&report);
    report
}

fn text_only_facts(r: &DeviceReport) -> Facts {
    let mut f = Facts::default();
    f.text("moment", r.moment.words(), "which moment the state facts describe");
    f.text("source", r.source.name(), "snapshot (allocator data) or text (logs, nvidia-smi only)");
    f.flag("oom.present", r.oom.is_some(), "a log reported an OOM on this GPU");
    f.num("oom.count", r.oom_count as f64, Unit::Count, "OOM messages for this GPU");
    if let Some(o) = &r.oom {
        f.text("oom.source", o.source.name(), "what says the OOM happened: snapshot or log");
        f.opt("oom.requested_bytes", o.requested_bytes.map(|b| b as f64), Unit::Bytes, "size the message names");
        f.opt("oom.device_free_bytes", o.device_free_bytes.map(|b| b as f64), Unit::Bytes, "free on the GPU");
        f.text("oom.where", o.culprit.clone(), "the last user frame of the traceback");
        if let Some(m) = &o.message {
            f.text("oom.kind", kind_name(m), "allocator, runtime_error, cublas_alloc_failed, nccl, tensorflow");
            if m.allocated_bytes.is_some() {
                f.num("allocated_bytes", r.allocated_bytes as f64, Unit::Bytes, "allocated by PyTorch (message)");
            }
            if m.reserved_bytes.is_some() {
                f.num("reserved_bytes", r.reserved_bytes as f64, Unit::Bytes, "reserved by PyTorch (message)");
                super::facts::reserved_unallocated_facts(&mut f, r, "reserved by PyTorch but unallocated (message)");
            }
        }
    }
    outside_pytorch_facts(&mut f, r, None, None);
    backend_facts(&mut f, r, None);
    f
}

fn kind_name(m: &OomMessage) -> String {
    serde_json::to_value(m.kind).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
}

/// The backend this GPU ran (the snapshot's, else what its OOM message names) and the variable that configures its
/// allocator: what a fix must name.
pub fn backend_facts(f: &mut Facts, r: &DeviceReport, snapshot: Option<Backend>) {
    let said = r.oom.as_ref().and_then(|o| o.message.as_ref()).and_then(|m| Backend::of_message(&m.device_type));
    let backend = snapshot.filter(|&b| b != Backend::Cuda).or(said).unwrap_or_default();
    f.text("backend", backend.name(), "the accelerator's allocator: CUDA, ROCm, XPU or NPU");
    f.text("alloc_conf_var", backend.alloc_conf_var(), "the environment variable that configures that allocator");
}

/// The GPU's capacity and the memory outside PyTorch's cache, from the best source there is:
/// 1. a snapshot OOM's driver-reported free bytes with the capacity (total − free − reserved, exact at the OOM);
/// 2. the OOM message's own figures (total − free − reserved as PyTorch printed them);
/// 3. the nvidia-smi sample nearest the moment (used − reserved, as close as the sampling interval allows).
pub fn outside_pytorch_facts(f: &mut Facts, r: &DeviceReport, gpu_memory: Option<u64>, memory_cap: Option<u64>) {
    let msg = r.oom.as_ref().and_then(|o| o.message.as_ref());
    let smi_total = r.observed.as_ref().and_then(|o| o.total_bytes);
    let (total, total_doc) = match (gpu_memory, smi_total, msg.and_then(|m| m.total_bytes)) {
        (Some(t), _, _) => (Some(t), "the GPU's capacity (--gpu-memory)"),
        (None, Some(t), _) => (Some(t), "the GPU's capacity (nvidia-smi memory.total)"),
        (None, None, Some(t)) => (Some(t), "the GPU's capacity (the OOM message)"),
        _ => (None, ""),
    };
    // What one request may take: set_per_process_memory_fraction's cap when the message names it (or the user, or
    // the capture, gave it), else the GPU.
    let (allowed, allowed_doc) = match (msg.and_then(|m| m.allowed_bytes), memory_cap) {
        (Some(a), _) => (Some(a), "the process's memory cap (\"X allowed\" in the OOM message)"),
        (None, Some(a)) => (Some(a), "the process's memory cap (--memory-cap)"),
        (None, None) => (None, ""),
    };
    if let Some(a) = allowed {
        f.num("oom.allowed_bytes", a as f64, Unit::Bytes, allowed_doc);
    }
    if let Some(limit) = msg.and_then(|m| m.limit) {
        f.text(
            "oom.allocator_limit",
            limit.name(),
            "the allocator's own limit the message says refused the request: fraction_rejected, expandable_reserve, \
             address_space",
        );
    }
    if let Some(b) = msg.and_then(|m| m.reserve_bytes) {
        f.num("oom.expandable_reserve_bytes", b as f64, Unit::Bytes, "the stream's expandable-segment reserve");
    }
    let requested = r.oom.as_ref().and_then(|o| o.requested_bytes);
    if let (Some(req), Some(limit)) = (requested, allowed.or(total)) {
        f.num("oom.limit_bytes", limit as f64, Unit::Bytes, "what the process may use: its cap, else the GPU");
        f.num(
            "oom.request_share",
            req as f64 / limit.max(1) as f64,
            Unit::Ratio,
            "the failing request as a share of what the process may use",
        );
    }
    // What the process could hold when it failed: its cap, else what it had reserved plus what the driver still
    // had free.
    let free = r.oom.as_ref().and_then(|o| o.device_free_bytes);
    if let Some(req) = requested {
        let available = allowed.or(free.map(|f| r.reserved_bytes + f)).or(total);
        if let Some(a) = available.filter(|&a| a > 0) {
            f.num(
                "oom.available_bytes",
                a as f64,
                Unit::Bytes,
                "what the process could hold: its cap, else reserved + driver free",
            );
            f.num(
                "oom.request_share_available",
                req as f64 / a as f64,
                Unit::Ratio,
                "the failing request as a share of what the process could hold",
            );
        }
    }
    let Some(total) = total else { return };
    f.num("gpu.total_bytes", total as f64, Unit::Bytes, total_doc);
    // Memory outside PyTorch decided the OOM when PyTorch's own reservation plus the request would have fit the GPU
    // beside a bare CUDA context, but the driver had less free than the request: without what else was held
    // outside PyTorch (NCCL, other processes, other libraries), the request would have been granted.
    if let (Some(req), Some(free)) = (requested, free) {
        let capped = allowed.is_some_and(|a| a < total);
        let decided = !capped && free < req && r.reserved_bytes + req + BARE_CONTEXT <= total;
        // The other way round: a request refused under the process's own cap, or one the driver had room for, was
        // not refused for what is held outside PyTorch — other processes sharing the GPU included.
        f.flag(
            "oom.outside_irrelevant",
            capped || free >= req,
            "the request was refused under the process's cap, or the driver had more free than it asked: memory \
             outside PyTorch did not decide the OOM",
        );
        f.flag(
            "oom.outside_decided",
            decided,
            "reserved + request + a bare CUDA context (512 MiB) fit the GPU, but the driver had less free than the \
             request: memory outside PyTorch decided the OOM",
        );
        f.num(
            "oom.deficit_bytes",
            req.saturating_sub(free) as f64,
            Unit::Bytes,
            "what the request lacked: request − driver free",
        );
    }
    let snapshot_free = r.oom.as_ref().filter(|o| o.source == OomSource::Snapshot).and_then(|o| o.device_free_bytes);
    let (other, source) = if let Some(free) = snapshot_free {
        (
            total.saturating_sub(free).saturating_sub(r.reserved_bytes),
            "the snapshot's OOM (total − driver free − reserved)",
        )
    } else if let Some(n) = msg.and_then(|m| m.non_pytorch_bytes) {
        (n, "the OOM message (total − free − reserved by PyTorch)")
    } else if let Some(at) = r.observed.as_ref().and_then(|o| o.at_moment.as_ref()) {
        (at.non_pytorch_bytes, "nvidia-smi at the moment (used − reserved by PyTorch)")
    } else {
        return;
    };
    f.num("nonpytorch_bytes", other as f64, Unit::Bytes, "GPU memory in use outside PyTorch's cache at the moment");
    f.num("nonpytorch_share", other as f64 / total.max(1) as f64, Unit::Ratio, "its share of the GPU");
    f.text("nonpytorch.source", source, "where the non-PyTorch figure comes from");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message as torch ≥ 2.1 (or, with `reserved` only, 1.4–2.0) words it, read back by the log reader.
    fn message(allocated: &str, unallocated: Option<&str>, reserved: Option<&str>) -> OomMessage {
        let text = match (unallocated, reserved) {
            (Some(u), _) => format!(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 176.00 MiB. GPU 0 has a total capacity \
                 of 139.80 GiB of which 131.25 GiB is free. Of the allocated memory {allocated} is allocated by \
                 PyTorch, and {u} is reserved by PyTorch but unallocated."
            ),
            (None, Some(r)) => format!(
                "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; \
                 {allocated} already allocated; 3.44 MiB free; {r} reserved in total by PyTorch)"
            ),
            (None, None) => "RuntimeError: CUDA error: out of memory".to_string(),
        };
        let mut ooms = crate::ingest::oom_log::parse(&text, "log").ooms;
        assert_eq!(ooms.len(), 1, "{text}");
        ooms.remove(0)
    }

    #[test]
    fn a_state_matches_a_message_as_torch_prints_its_sizes() {
        const GIB: f64 = (1u64 << 30) as f64;
        let m = message("7.87 GiB", Some("8.30 MiB"), None);
        let exact = 8_452_567_040;
        assert!(describes_state(&m, exact, exact + 8_703_181 + 1000));
        // 7.88 GiB printed: another moment.
        let other = (7.88 * GIB) as u64;
        assert!(!describes_state(&m, other, other + 8_703_181));
        // The cached free differs: another moment with the same allocated bytes.
        assert!(!describes_state(&m, exact, exact + (20 << 20)));
        // Torch prints up to 1024 bytes as bytes and 1 GiB as 1024.00 MiB.
        assert!(same_as_printed(1024, 1024) && !same_as_printed(1024, 1025));
        assert!(same_as_printed(1 << 30, 1 << 30) && !same_as_printed(1 << 30, (1 << 30) + (6 << 20)));
        // Old messages give the reserved total; a message without either says nothing of the cache.
        let old = message("7.87 GiB", None, Some("7.89 GiB"));
        assert!(describes_state(&old, exact, (7.89 * GIB) as u64));
        assert!(!describes_state(&message("7.87 GiB", None, None), exact, exact));
    }
}
