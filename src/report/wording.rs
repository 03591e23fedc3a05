//! The words of a report shared by every format: each section as plain lines (the verdict's detail, the OOM from
//! the trace or only from a log, memory as nvidia-smi saw it, a serving engine's KV cache, profiler exports, one
//! line per input, how each category's bytes were known) that the text, Markdown and HTML renderers each dress in
//! their own way.

use super::{percent, stream_name, when};
use crate::analysis::observed::ObservedMemory;
use crate::analysis::profile::short_kernel_name;
use crate::analysis::profile::{NcuRow, ProfileSummary};
use crate::analysis::serving::ServingSummary;
use crate::analysis::{CategoryBytes, DeviceReport, Moment, OomReport, OomSource, Pool, ReportSource};
use crate::timeline::profile::CopyDirection;
use crate::timeline::{InputInfo, OomMessage};
use crate::units::{bytes, duration_us};

/// How a category's bytes were known, when not all by their stacks: "inferred", "labelled", "60% inferred".
pub fn known_by(c: &CategoryBytes) -> Option<String> {
    let sb = &c.source_bytes;
    let share = |b: u64| if b >= c.bytes { String::new() } else { format!("{} ", percent(b, c.bytes)) };
    // A share under 1% is not worth a word beside the category.
    let worth = |b: u64| b > 0 && b.saturating_mul(100) >= c.bytes;
    let mut parts = Vec::new();
    if worth(sb.inferred) {
        parts.push(format!("{}inferred", share(sb.inferred)));
    }
    if worth(sb.label) {
        parts.push(format!("{}labelled", share(sb.label)));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// One category of `by kind`: `optimizer state 25.6 GiB (50%, inferred)`.
pub fn category_part(c: &CategoryBytes, allocated: u64) -> String {
    let how = known_by(c).map_or(String::new(), |h| format!(", {h}"));
    format!("{} {} ({}{how})", c.category.replace('_', " "), bytes(c.bytes), percent(c.bytes, allocated))
}

/// One line naming an input and what was read from it.
pub fn input_line(i: &InputInfo) -> String {
    let mut s = match i.pickle_protocol {
        Some(p) => {
            let backend = i.backend.map_or(String::new(), |b| format!(", {}", b.name()));
            format!("{}{backend}, {}, pickle protocol {p}", i.format_version, bytes(i.bytes))
        }
        None => format!("{}, {}", i.kind.words(), bytes(i.bytes)),
    };
    if !i.read.is_empty() {
        s.push_str(&format!("; read: {}", i.read.join("; ")));
    }
    if !i.skipped.is_empty() {
        s.push_str(&format!("; skipped: {}", i.skipped.join(", ")));
    }
    if i.malformed_lines > 0 {
        let first: Vec<String> =
            i.malformed.iter().map(|m| format!("line {}: expected {}", m.line, m.expected)).collect();
        s.push_str(&format!(
            "; {} malformed line{} skipped ({}; --strict makes them errors)",
            i.malformed_lines,
            if i.malformed_lines == 1 { "" } else { "s" },
            first.join("; ")
        ));
    }
    s
}

fn opt_bytes(b: Option<u64>) -> String {
    b.map_or("?".into(), bytes)
}

/// The OOM: the allocator's view when the trace has it, the message's figures when only a log does.
/// The first line is the headline; the verdict (if any) is flagged for highlighting.
pub fn oom_lines(oom: &OomReport) -> Vec<(Highlight, String)> {
    let mut out = Vec::new();
    if oom.source == OomSource::Snapshot {
        let free = match oom.device_free_bytes {
            Some(f) if oom.device_free_estimated => {
                format!(
                    "; the GPU had {} free (or so: XPU estimates it as total − reserved when its runtime cannot say)",
                    bytes(f)
                )
            }
            Some(f) => format!("; the GPU had {} free", bytes(f)),
            None => String::new(),
        };
        out.push((
            Highlight::Headline,
            format!(
                "needed a {} block ({} pool, {}){free}",
                opt_bytes(oom.requested_bytes),
                oom.pool.map_or("?", Pool::name),
                stream_name(oom.stream.unwrap_or(0)),
            ),
        ));
        let (free, largest) = (oom.cached_free_in_pool_bytes.unwrap_or(0), oom.largest_free_in_pool_bytes.unwrap_or(0));
        let (verdict, hl) = if oom.fits_in_cached_free == Some(true) && oom.requested_bytes.unwrap_or(0) > largest {
            ("it would have fit if the cached free memory were one block: fragmentation", Highlight::Warn)
        } else if free == 0 {
            ("nothing was cached free in that pool", Highlight::None)
        } else {
            ("the cached free memory could not have held it either", Highlight::None)
        };
        out.push((
            hl,
            format!("cached free in that pool {}, largest free block {} → {verdict}", bytes(free), bytes(largest)),
        ));
        out.push((Highlight::Culprit("requested by"), oom.culprit.clone()));
        if let Some(m) = &oom.message {
            out.push((Highlight::None, format!("the log says: {}", message_figures(m))));
        }
    } else if let Some(m) = &oom.message {
        let what = match m.requested_bytes {
            Some(b) => format!("tried to allocate {}", bytes(b)),
            None => "an allocation failed".to_string(),
        };
        out.push((Highlight::Headline, format!("{what} ({}, {})", kind_words(m), where_in_log(m))));
        let figures = message_figures(m);
        if !figures.is_empty() {
            out.push((Highlight::None, figures));
        }
        if let (Some(req), Some(un)) = (m.requested_bytes, m.reserved_unallocated_bytes) {
            if un >= req {
                out.push((
                    Highlight::Warn,
                    format!(
                        "{} was reserved by PyTorch but unallocated, more than the {} asked for: the cached free \
                         memory was in pieces too small (fragmentation)",
                        bytes(un),
                        bytes(req)
                    ),
                ));
            }
        }
        if let Some(f) = &m.user_frame {
            out.push((Highlight::Culprit("raised at"), f.clone()));
        }
        if let Some(h) = &m.hint {
            out.push((Highlight::Dim, format!("PyTorch's hint: {h}")));
        }
    }
    out
}

/// How a line should stand out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Highlight {
    None,
    Headline,
    Warn,
    /// Code (a frame): the text is the frame, shown after these words.
    Culprit(&'static str),
    Dim,
}

fn kind_words(m: &OomMessage) -> String {
    use crate::timeline::OomKind::*;
    let k = match m.kind {
        Allocator => "PyTorch's caching allocator",
        RuntimeError => "the CUDA runtime",
        CublasAllocFailed => "cuBLAS",
        Nccl => "NCCL",
        Tensorflow => "TensorFlow",
    };
    match m.rank {
        Some(r) => format!("{k}, rank {r}"),
        None => k.to_string(),
    }
}

fn where_in_log(m: &OomMessage) -> String {
    format!("{}:{}", m.source, m.line)
}

/// The figures an OOM message gives, in one sentence.
fn message_figures(m: &OomMessage) -> String {
    let mut parts = Vec::new();
    if let Some(t) = m.total_bytes {
        parts.push(format!("GPU total {}", bytes(t)));
    }
    if let Some(f) = m.free_bytes {
        parts.push(format!("free {}", bytes(f)));
    }
    if let Some(a) = m.allocated_bytes {
        parts.push(format!("allocated by PyTorch {}", bytes(a)));
    }
    if let Some(r) = m.reserved_bytes {
        parts.push(format!("reserved by PyTorch {}", bytes(r)));
    }
    if let Some(n) = m.non_pytorch_bytes {
        parts.push(format!("outside PyTorch {}", bytes(n)));
    }
    if let Some(a) = m.allowed_bytes {
        parts.push(format!("capped at {} (set_per_process_memory_fraction)", bytes(a)));
    }
    parts.join(", ")
}

/// Memory as nvidia-smi saw the GPU, and outside PyTorch.
pub fn observed_lines(o: &ObservedMemory, d: &DeviceReport) -> Vec<String> {
    let mut out = Vec::new();
    let name = o.name.as_deref().map_or(String::new(), |n| format!("{n}: "));
    out.push(format!(
        "nvidia-smi: {name}{} sample{}{}, total {}, highest used {}",
        o.samples,
        if o.samples == 1 { "" } else { "s" },
        if d.source == ReportSource::Snapshot {
            format!(" ({} on the snapshot's clock)", o.aligned_samples)
        } else {
            String::new()
        },
        opt_bytes(o.total_bytes),
        opt_bytes(o.max_used_bytes),
    ));
    if let Some(at) = &o.at_moment {
        out.push(format!(
            "at the {}: nvidia-smi used {}, PyTorch reserved {} → {} outside PyTorch ({} of the GPU)",
            d.moment.words(),
            bytes(at.used_bytes),
            bytes(at.reserved_bytes),
            bytes(at.non_pytorch_bytes),
            o.total_bytes.map_or("?".into(), |t| percent(at.non_pytorch_bytes, t)),
        ));
    }
    if o.non_pytorch_series.len() >= 2 {
        let vals: Vec<i64> = o.non_pytorch_series.iter().map(|p| p.1.max(0)).collect();
        let (lo, hi) = (*vals.iter().min().unwrap_or(&0), *vals.iter().max().unwrap_or(&0));
        out.push(format!(
            "outside PyTorch over time: {} (min {}, max {})",
            sparkline(&vals),
            bytes(lo as u64),
            bytes(hi as u64)
        ));
    }
    if !o.processes.is_empty() {
        let procs: Vec<String> = o
            .processes
            .iter()
            .map(|p| format!("{} {} {}", p.pid, p.name, p.used_bytes.map_or("N/A".into(), bytes)))
            .collect();
        out.push(format!("processes: {}", procs.join(", ")));
    }
    out
}

fn sparkline(vals: &[i64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let (lo, hi) = (*vals.iter().min().unwrap_or(&0), *vals.iter().max().unwrap_or(&0));
    vals.iter()
        .map(|&v| if hi == lo { BARS[0] } else { BARS[((v - lo) * 7 / (hi - lo)) as usize] })
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// A serving engine's KV cache.
pub fn serving_lines(s: &ServingSummary) -> Vec<String> {
    let mut out = Vec::new();
    let c = &s.capacity;
    let mut cap = Vec::new();
    if let Some(b) = c.gpu_blocks {
        cap.push(format!("{b} GPU blocks"));
    }
    if let Some(t) = c.tokens {
        cap.push(format!("{t} tokens"));
    }
    if let Some(b) = c.kv_bytes {
        cap.push(bytes(b));
    }
    if let Some((t, x)) = c.max_concurrency {
        cap.push(format!("{x}× concurrency at {t} tokens per request"));
    }
    if !cap.is_empty() {
        out.push(format!("KV cache: {}", cap.join(", ")));
    }
    if let Some((len, fits)) = c.too_small {
        out.push(format!("refused to start: max seq len {len} is larger than the {fits} tokens the KV cache holds"));
    }
    if s.usage_lines > 0 {
        let pct = |x: Option<f64>| x.map_or("?".into(), |v| format!("{:.1}%", v * 100.0));
        out.push(format!(
            "GPU KV cache usage over {} line{} (engine {}): {} → {} (max {}); waiting requests {} → {}",
            s.usage_lines,
            if s.usage_lines == 1 { "" } else { "s" },
            s.engine,
            pct(s.usage_first),
            pct(s.usage_last),
            pct(s.usage_max),
            s.waiting_first.map_or("?".into(), |w| w.to_string()),
            s.waiting_last.map_or("?".into(), |w| w.to_string()),
        ));
    }
    if s.preemptions > 0 {
        out.push(format!(
            "{} preemption{} ({})",
            s.preemptions,
            if s.preemptions == 1 { "" } else { "s" },
            s.preemption_mode.as_deref().unwrap_or("?")
        ));
    }
    out
}

fn ns(n: u64) -> String {
    ns_f(Some(n as f64))
}

/// Nanoseconds as a duration: rounded to the microsecond, or in nanoseconds under one.
pub fn ns_f(n: Option<f64>) -> String {
    match n {
        None => "?".into(),
        Some(v) if v < 1000.0 => format!("{v:.0} ns"),
        Some(v) => duration_us((v / 1000.0).round() as i64),
    }
}

pub fn pct_f(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.0}%"))
}

/// What the profiler exports said, one line each: steps and their all-reduces, collectives, allocator calls,
/// copies, the driver's memory curve, the longest kernels, Nsight Compute's classes and top launches.
pub fn profile_lines(p: &ProfileSummary) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = &p.steps {
        out.push(format!(
            "Optimizer steps in the GPU trace: {} ({} with all-reduces): per step {} micro-batch{}, all-reduces in {} \
             of them, {} all-reduce launch{} (medians)",
            s.steps,
            s.steps_with_allreduce,
            s.microbatches_per_step,
            if s.microbatches_per_step == 1 { "" } else { "es" },
            s.allreduce_microbatches_per_step,
            s.allreduce_per_step,
            if s.allreduce_per_step == 1 { "" } else { "es" },
        ));
    }
    if !p.collectives.is_empty() {
        let parts: Vec<String> = p
            .collectives
            .iter()
            .map(|c| {
                format!(
                    "{} ×{}{}",
                    c.op.name(),
                    c.launches,
                    if c.total_ns > 0 { format!(" ({})", ns(c.total_ns)) } else { String::new() }
                )
            })
            .collect();
        out.push(format!("NCCL collectives: {}", parts.join(", ")));
    }
    for r in p.collectives_per_nvtx_range.iter().take(5) {
        out.push(format!(
            "NVTX range {:?}: {} {} launch{} over {} instance{}",
            r.range,
            r.launches,
            r.op.name(),
            if r.launches == 1 { "" } else { "es" },
            r.range_instances,
            if r.range_instances == 1 { "" } else { "s" }
        ));
    }
    if let Some(a) = &p.allocator_calls {
        let share = if p.api_time_ns > 0 {
            format!(
                ", {:.0}% of CUDA API time",
                (a.device_alloc_ns + a.device_free_ns) as f64 * 100.0 / p.api_time_ns as f64
            )
        } else {
            String::new()
        };
        out.push(format!(
            "Allocator calls: cudaMalloc ×{} ({}), cudaFree ×{} ({}){share}",
            a.device_alloc_calls,
            ns(a.device_alloc_ns),
            a.device_free_calls,
            ns(a.device_free_ns),
        ));
    }
    if !p.copies.is_empty() {
        let parts: Vec<String> = p
            .copies
            .iter()
            .map(|c| {
                let dir = match c.direction {
                    CopyDirection::HostToDevice => "host→device",
                    CopyDirection::DeviceToHost => "device→host",
                    _ => "device→device",
                };
                format!("{dir} {} in {} cop{}", bytes(c.bytes), c.count, if c.count == 1 { "y" } else { "ies" })
            })
            .collect();
        out.push(format!("Copies: {}", parts.join(", ")));
    }
    for d in &p.driver_memory {
        let curve: Vec<i64> = d.curve.iter().map(|&v| v as i64).collect();
        out.push(format!(
            "GPU {} device memory from the driver: peak {} at {} into the capture, {} at the end ({} allocations, {} \
             frees)  {}",
            d.device,
            bytes(d.peak_bytes),
            ns(d.peak_time_ns),
            bytes(d.end_bytes),
            d.allocations,
            d.frees,
            sparkline(&curve)
        ));
    }
    if !p.kernels_by_time.is_empty() {
        let parts: Vec<String> = p
            .kernels_by_time
            .iter()
            .map(|k| format!("{} {:.0}% (×{})", short_kernel_name(&k.name), k.share * 100.0, k.instances))
            .collect();
        out.push(format!("Longest kernels ({} GPU time in all): {}", ns(p.kernel_time_ns), parts.join(", ")));
    }
    if let Some(n) = &p.ncu {
        let classes: Vec<String> = n.classes.iter().map(|(c, k)| format!("{k} {c}")).collect();
        out.push(format!(
            "Nsight Compute: {} launch{}{}",
            n.kernels,
            if n.kernels == 1 { "" } else { "es" },
            if classes.is_empty() { String::new() } else { format!(" — {}", classes.join(", ")) }
        ));
        let row = |r: &NcuRow| {
            format!(
                "{} (id {}, {}, memory {}, SM {}{}{})",
                short_kernel_name(&r.name),
                r.id,
                ns_f(r.duration_ns),
                pct_f(r.memory_throughput_pct),
                pct_f(r.sm_throughput_pct),
                r.dram_bytes.map_or(String::new(), |b| format!(", DRAM {}", bytes(b as u64))),
                r.class.as_ref().map_or(String::new(), |c| format!(", {c}"))
            )
        };
        if !n.by_time.is_empty() {
            out.push(format!("  longest: {}", n.by_time.iter().take(3).map(row).collect::<Vec<_>>().join("; ")));
        }
        if !n.by_dram_bytes.is_empty() {
            out.push(format!(
                "  most DRAM bytes: {}",
                n.by_dram_bytes.iter().take(3).map(row).collect::<Vec<_>>().join("; ")
            ));
        }
    }
    out
}

/// A GPU's verdict beyond its summary: the figures of the failure, what filled it, the causes by the memory they
/// explain, and the remedies when no rule names a cause. Plain lines; each renderer dresses them.
/// The moment a GPU's section describes, in words: "at the OOM", "at peak allocated memory", ….
pub fn moment_words(m: Moment) -> &'static str {
    match m {
        Moment::Oom => "at the OOM",
        Moment::Peak => "at peak allocated memory",
        Moment::End => "at the end of the capture",
        Moment::Time => "at the requested moment",
    }
}

/// Where in the capture a GPU's section stands: the event and time, the file's final state, or the logs alone.
pub fn place(d: &DeviceReport) -> String {
    if d.source == ReportSource::Text {
        "no snapshot: from the logs and nvidia-smi".to_string()
    } else if d.trace.entries == 0 {
        "the file's final state".to_string()
    } else {
        when(d.event_index, d.time_us, d.trace.first_time_us)
    }
}

/// A verdict's summary after its subject, when it starts with "GPU N" (most do): the formats that head it with the
/// GPU in bold then do not name it twice.
pub fn summary_after_gpu<'a>(d: &DeviceReport, summary: &'a str) -> Option<&'a str> {
    summary.strip_prefix(&format!("GPU {} ", d.device))
}

pub fn verdict_detail(d: &DeviceReport) -> Vec<String> {
    let Some(v) = &d.verdict else { return Vec::new() };
    let mut out = Vec::new();
    if let Some(a) = &v.arithmetic {
        let mut parts = vec![format!("asked {}", opt_bytes(a.requested_bytes))];
        if let Some(c) = a.allowed_bytes.filter(|&c| a.capacity_bytes.is_none_or(|g| c < g)) {
            parts.push(format!("cap {c} (set_per_process_memory_fraction)", c = bytes(c)));
        }
        if let Some(f) = a.device_free_bytes {
            parts.push(format!("driver free {}", bytes(f)));
        }
        if let Some(c) = a.capacity_bytes {
            parts.push(format!("GPU {}", bytes(c)));
        }
        if a.reserved_bytes > 0 || a.allocated_bytes > 0 {
            parts.push(format!(
                "PyTorch reserved {} (allocated {})",
                bytes(a.reserved_bytes),
                bytes(a.allocated_bytes)
            ));
        }
        if let (Some(f), Some(l)) = (a.cached_free_bytes, a.largest_free_block_bytes) {
            parts.push(format!("cached free in the pool {} (largest block {})", bytes(f), bytes(l)));
        }
        if let Some(x) = a.outside_pytorch_bytes {
            parts.push(format!("outside PyTorch {}", bytes(x)));
        }
        out.push(format!("the arithmetic: {}", parts.join(" · ")));
    }
    if !d.by_category.is_empty() && d.allocated_bytes > 0 {
        let parts: Vec<String> = d
            .by_category
            .iter()
            .take(4)
            .map(|c| format!("{} {}", c.category.replace('_', " "), percent(c.bytes, d.allocated_bytes)))
            .collect();
        out.push(format!("what filled it: {}", parts.join(", ")));
    }
    if !v.causes.is_empty() {
        let parts: Vec<String> = v
            .causes
            .iter()
            .map(|c| format!("{} {} ({})", c.rule, c.bytes.map_or("–".into(), bytes), c.severity))
            .collect();
        out.push(format!("causes, by the memory they explain: {}", parts.join(" · ")));
    }
    out.extend(v.proven.iter().cloned());
    if v.holder.is_some() && (v.likely.is_some() || v.decided_by.is_some()) {
        // The message decided the sentence (nothing said what held the memory): no remedy is in it.
        out.extend(v.remedies.iter().map(|r| format!("to try: {r}")));
    } else if let Some(h) = &v.holder {
        for r in v.remedies.iter().skip(1) {
            out.push(format!("also for {}: {r}", crate::analysis::verdict::category_words(h.category, &h.stack)));
        }
    }
    out.extend(v.capture_advice.iter().map(|a| format!("next time: {a}")));
    out
}

/// At a fragmentation OOM: the live blocks that pin the free memory in pieces, by line, and when over the trace the
/// free-but-unusable memory was largest.
pub fn pinning_lines(d: &DeviceReport) -> Vec<String> {
    let Some(p) = &d.pinning else { return Vec::new() };
    let mut out = vec![format!(
        "pinned: {} live block{} in {} segment{} keep {} cached free in pieces none of which holds the {} asked for: \
         while they live the pieces neither merge nor go back to the driver",
        p.blocks,
        if p.blocks == 1 { "" } else { "s" },
        p.segments,
        if p.segments == 1 { "" } else { "s" },
        bytes(p.pinned_free_bytes),
        bytes(p.requested_bytes)
    )];
    for s in &p.by_stack {
        let age = match (s.youngest_age_us, s.oldest_age_us) {
            (Some(y), Some(o)) if y == o => format!(", allocated {} before the OOM", crate::units::duration_us(y)),
            (Some(y), Some(o)) => format!(
                ", allocated {} to {} before the OOM",
                crate::units::duration_us(y),
                crate::units::duration_us(o)
            ),
            _ => String::new(),
        };
        out.push(format!(
            "  {} ×{} ({} live) pins {}{age}",
            s.stack,
            s.blocks,
            bytes(s.live_bytes),
            bytes(s.pinned_free_bytes)
        ));
    }
    let moments: Vec<String> = p
        .worst_moments
        .iter()
        .map(|m| {
            format!(
                "{} ({} of the {} cached free pinned in part-used segments, largest free block {})",
                when(Some(m.event_index), m.time_us, d.trace.first_time_us),
                bytes(m.pinned_free_bytes),
                bytes(m.cached_free_bytes),
                bytes(m.largest_free_block_bytes)
            )
        })
        .collect();
    if !moments.is_empty() {
        out.push(format!("most free memory pinned at {}", moments.join("; then at ")));
    }
    out
}

/// One line for the GPUs only nvidia-smi saw beside a snapshot: `nvidia-smi also saw GPUs 0–4 and 6 (…)`.
pub fn other_gpus_line(others: &[crate::analysis::observed::OtherGpu]) -> Option<String> {
    if others.is_empty() {
        return None;
    }
    let mut ids: Vec<i64> = others.iter().map(|o| o.device).collect();
    ids.sort_unstable();
    let mut runs: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        runs.push(if j > i { format!("{}–{}", ids[i], ids[j]) } else { ids[i].to_string() });
        i = j + 1;
    }
    let names: std::collections::BTreeSet<&str> = others.iter().filter_map(|o| o.name.as_deref()).collect();
    let max_used = others.iter().filter_map(|o| o.max_used_bytes).max();
    let total = others.iter().filter_map(|o| o.total_bytes).max();
    let mut detail = Vec::new();
    if !names.is_empty() {
        detail.push(names.into_iter().collect::<Vec<_>>().join(", "));
    }
    if let Some(u) = max_used {
        detail.push(format!(
            "highest used {}{}",
            bytes(u),
            total.map_or(String::new(), |t| format!(" of {}", bytes(t)))
        ));
    }
    Some(format!(
        "nvidia-smi also saw GPU{} {}{}",
        if ids.len() == 1 { "" } else { "s" },
        runs.join(", "),
        if detail.is_empty() { String::new() } else { format!(" ({})", detail.join("; ")) }
    ))
}
