//! What-ifs: the device's own requests replayed through the allocator model ([`crate::timeline::simulator`]) under
//! other settings, another capacity or an edited workload, each answering the peak reserved, whether every request
//! (the one that raised the OOM included) fits, and the headroom. And the simulator's check against the trace:
//! under the recorded settings it must make the segments torch made.

use serde::Serialize;

use super::facts::Site;
use crate::timeline::replay::Replay;
use crate::timeline::simulator::{self, Config, Edit, Outcome, Workload};
use crate::timeline::{Action, DeviceTimeline, Timeline};

/// How much the allocator could hold, and where that figure comes from.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Capacity {
    pub bytes: Option<u64>,
    /// A `set_per_process_memory_fraction` cap (checked before the driver is asked).
    pub fraction_cap: bool,
    /// Where the figure comes from, in words.
    pub source: String,
    /// Memory on the device outside PyTorch's cache, when known (what a GPU of another size also loses).
    #[serde(skip)]
    pub outside: Option<u64>,
    /// Where the figure is only a lower bound (a cap the files do not state): below this, as the failed request
    /// shows. A what-if that fits only between the two is undecided, not refuted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_most: Option<u64>,
}

/// Where the capacity comes from, found without the replay (which only supplies its figures): whether the what-ifs
/// can be decided is known before the replay ends.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CapacityFrom {
    /// A memory cap: given (`true`), or from the OOM message.
    Cap(u64, bool),
    /// The trace's last OOM event (its index) and the driver's free bytes there.
    OomEvent(usize, u64),
    /// The OOM message's total and what was outside PyTorch.
    Message(u64, u64),
    GpuMemory(u64),
    /// nvidia-smi's total.
    Samples(u64),
    Unknown,
}

fn capacity_from(
    tl: &Timeline,
    dev: &DeviceTimeline,
    memory_cap: Option<u64>,
    gpu_memory: Option<u64>,
) -> CapacityFrom {
    let msg = tl.ooms.iter().rev().find(|m| m.device.is_none_or(|d| d == dev.device));
    if let Some(cap) = memory_cap {
        return CapacityFrom::Cap(cap, true);
    }
    if let Some(cap) = msg.and_then(|m| m.allowed_bytes) {
        return CapacityFrom::Cap(cap, false);
    }
    let oom = dev.events.iter().enumerate().rev().find(|(_, e)| e.action == Action::Oom);
    if let Some((i, free)) = oom.and_then(|(i, e)| dev.attrs(e).device_free().map(|f| (i, f))) {
        return CapacityFrom::OomEvent(i, free);
    }
    if let Some((total, out)) = msg.and_then(|m| m.total_bytes.zip(m.non_pytorch_bytes)) {
        return CapacityFrom::Message(total, out);
    }
    if let Some(g) = gpu_memory {
        return CapacityFrom::GpuMemory(g);
    }
    match dev.memory_samples.iter().filter_map(|s| s.total).max() {
        Some(total) => CapacityFrom::Samples(total),
        None => CapacityFrom::Unknown,
    }
}

/// The capacity the run had: a memory cap (given or from the OOM message), else what the OOM says the device had
/// for PyTorch (reserved + free at the OOM), else the GPU's memory less what was outside PyTorch.
pub fn capacity(
    tl: &Timeline,
    dev: &DeviceTimeline,
    replay: &Replay,
    memory_cap: Option<u64>,
    gpu_memory: Option<u64>,
) -> Capacity {
    let msg = tl.ooms.iter().rev().find(|m| m.device.is_none_or(|d| d == dev.device));
    let outside = msg.and_then(|m| m.non_pytorch_bytes);
    let of = |bytes: u64, fraction_cap: bool, source: &str| Capacity {
        bytes: Some(bytes),
        fraction_cap,
        source: source.into(),
        outside,
        at_most: None,
    };
    match capacity_from(tl, dev, memory_cap, gpu_memory) {
        CapacityFrom::Cap(cap, given) => {
            of(cap, true, if given { "the memory cap given" } else { "the memory cap in the OOM message" })
        }
        CapacityFrom::OomEvent(i, free) => {
            let reserved = replay.reserved_series.get(i).unwrap_or(replay.peak_reserved.0);
            let rules = &replay.rules;
            let wanted = Config::segment_size(rules.round(dev.events[i].size));
            if wanted <= free && !rules.expandable {
                // The driver had room for the segment: something capped the process below the device.
                // Every segment made before fitted under it: at least the most PyTorch ever held.
                let least = reserved.max(replay.peak_reserved.0);
                return Capacity {
                    at_most: Some((reserved + wanted - 1).max(least)),
                    ..of(least, true, "a cap below the device's free memory: at least the most PyTorch held")
                };
            }
            of(reserved + free, false, "PyTorch's reserved bytes plus the driver's free bytes at the OOM")
        }
        CapacityFrom::Message(total, out) => {
            of(total.saturating_sub(out), false, "the OOM message's total less the memory outside PyTorch")
        }
        CapacityFrom::GpuMemory(g) => of(g, false, "--gpu-memory (memory outside PyTorch unknown)"),
        CapacityFrom::Samples(total) => of(
            total,
            false,
            "the GPU's memory as nvidia-smi gives it; memory outside PyTorch unknown, a cap would not show",
        ),
        CapacityFrom::Unknown => Capacity {
            bytes: None,
            fraction_cap: false,
            source: "unknown: no OOM, no cap, no --gpu-memory".into(),
            outside,
            at_most: None,
        },
    }
}

/// The allocator settings the file recorded, and the capacity.
pub fn recorded_config(tl: &Timeline, replay: &Replay, cap: &Capacity) -> Config {
    Config {
        rules: replay.rules.clone(),
        gc_threshold: tl.settings.as_ref().and_then(|s| s.garbage_collection_threshold),
        capacity: cap.bytes,
        fraction_cap: cap.fraction_cap,
        device_total: tl.ooms.iter().rev().find_map(|m| m.total_bytes),
        follow_refusals: false,
        stop_at_first_failure: false,
    }
}

/// The simulator against the trace: the segment changes torch recorded and those the model made.
#[derive(Clone, Debug, Serialize)]
pub struct Validation {
    pub device: i64,
    pub recorded_segment_events: usize,
    pub simulated_segment_events: usize,
    /// How many of them agree from the start (action and size).
    pub agreeing: usize,
    /// The first that differs: (index, recorded, simulated), in words.
    pub first_difference: Option<String>,
    pub recorded_peak_reserved: u64,
    pub simulated_peak_reserved: u64,
    /// The trace starts mid-run: the simulation starts from the rebuilt state.
    pub rebuilt_start: bool,
    pub expandable: bool,
    pub capacity: Capacity,
    pub exact: bool,
    /// Releases of the cache just before a new segment that the cache could not have avoided (the driver refusing
    /// the segment, or an empty_cache: the allocator does the same either way), replayed where the trace has them:
    /// how many. The capacity is the driver's, not the allocator's to decide.
    pub driver_refusals: usize,
    /// Releases of the cache the program made (empty_cache), replayed where the trace has them.
    pub empty_cache_calls: usize,
    /// The file's settings collect garbage, which acts on the process's memory cap (torch collects only where a
    /// memory fraction was set), no cap is in the files (a run that did not run out says none), and the simulation
    /// differs: it may be for want of the cap (`--memory-cap`).
    pub gc_without_cap: bool,
}

impl Validation {
    /// Simulated peak reserved against the recorded one, as a signed fraction.
    pub fn peak_error(&self) -> f64 {
        if self.recorded_peak_reserved == 0 {
            return 0.0;
        }
        (self.simulated_peak_reserved as f64 - self.recorded_peak_reserved as f64) / self.recorded_peak_reserved as f64
    }
}

fn words((a, s): (Action, u64)) -> String {
    format!("{} {}", a.name(), crate::units::bytes(s))
}

/// Replays the device's trace under its recorded settings and compares the segments made.
pub fn validate(tl: &Timeline, dev: &DeviceTimeline, replay: &Replay, memory_cap: Option<u64>) -> Validation {
    let cap = capacity(tl, dev, replay, memory_cap, None);
    let cfg = recorded_config(tl, replay, &cap);
    let gc_without_cap = cfg.gc_threshold.is_some_and(|t| t > 0.0) && !cap.fraction_cap;
    let w = Workload::from_trace(replay);
    let out = simulator::simulate(&w, Config { follow_refusals: true, ..cfg.clone() }, true);
    let recorded = simulator::recorded_segment_events(&dev.events);
    let simulated: Vec<(Action, u64)> = out.segment_events.iter().map(|e| (e.action, e.size)).collect();
    let agreeing = recorded.iter().zip(&simulated).take_while(|(a, b)| a == b).count();
    let first_difference = (agreeing < recorded.len().max(simulated.len())).then(|| {
        let r = recorded.get(agreeing).map_or("nothing".into(), |&e| words(e));
        let s = simulated.get(agreeing).map_or("nothing".into(), |&e| words(e));
        format!("#{}: recorded {r}, simulated {s}", agreeing + 1)
    });
    let exact = first_difference.is_none() && out.peak_reserved == replay.peak_reserved.0;
    Validation {
        device: dev.device,
        recorded_segment_events: recorded.len(),
        simulated_segment_events: simulated.len(),
        agreeing,
        exact,
        first_difference,
        recorded_peak_reserved: replay.peak_reserved.0,
        simulated_peak_reserved: out.peak_reserved,
        rebuilt_start: w.rebuilt_start,
        expandable: cfg.rules.expandable,
        capacity: cap,
        driver_refusals: out.refusals_followed,
        empty_cache_calls: out.empty_caches,
        // Torch collects only under a memory fraction: where the simulation agrees, none was needed.
        gc_without_cap: gc_without_cap && !exact,
    }
}

/// One what-if's answer.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIf {
    /// The change, as the command line says it (`expandable_segments:True`, `scale activation=0.75`, …).
    pub change: String,
    /// The most the allocator held in the simulation; for the verdict's remedies that do not fit, up to the first
    /// request that failed (the program raises there).
    pub peak_reserved_bytes: u64,
    /// Every request fits (`None`: the capacity is unknown).
    pub fits: Option<bool>,
    /// Capacity − peak reserved (negative: short by that much).
    pub headroom_bytes: Option<i64>,
    /// The simulation starts from an empty device with the trace's whole history (else from the rebuilt state).
    pub exact: bool,
    /// The first request that did not fit: (trace event, bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<(u32, u64)>,
    /// Undecided: it fits only if the process could hold more than this (the cap is not in the files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undecided_above: Option<u64>,
    /// It fits, but the trace ends at an OOM inside the first pass of the program's loop it holds: only the part
    /// recorded is shown to fit; what that pass does after the failing request was never recorded.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub recorded_part_only: bool,
    /// Which remedy it tries, for the verdict's wording (the automatic ones).
    #[serde(skip)]
    pub knob: Option<Knob>,
}

/// A standard remedy the verdict tries by itself at an OOM.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Knob {
    ExpandableSegments,
    MaxSplitSize(u64),
    /// A category's requests scaled: a smaller batch (activations, temporaries), a smaller cache (KV).
    Scale(&'static str, f64),
    /// The leak's allocations left out.
    NoLeak,
    /// Optimizer state at a quarter (an 8-bit optimizer: 2 bytes per parameter instead of 8).
    EightBitOptimizer,
}

impl WhatIf {
    /// Where the capacity is only known to lie between two figures and the change fits at the top of that range
    /// but not at the bottom, it is undecided: neither proven nor refuted.
    pub fn settle(&mut self, cap: &Capacity, rerun: impl FnOnce(u64) -> Outcome) {
        let (Some(least), Some(most)) = (cap.bytes, cap.at_most) else { return };
        if self.fits == Some(false) && most > least && rerun(most).fits() {
            self.fits = None;
            self.headroom_bytes = None;
            self.undecided_above = Some(least);
        }
    }

    pub fn of(change: impl Into<String>, out: &Outcome, cfg: &Config, exact: bool) -> WhatIf {
        WhatIf {
            change: change.into(),
            peak_reserved_bytes: out.peak_reserved,
            fits: cfg.capacity.map(|_| out.fits()),
            headroom_bytes: cfg.capacity.map(|c| c as i64 - out.peak_reserved as i64),
            exact,
            first_failure: out.first_failure,
            undecided_above: None,
            recorded_part_only: false,
            knob: None,
        }
    }
}

/// A what-if that cannot be asked: a change the simulator does not model or a trace cannot answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WhatIfError {
    #[error("--set {arg:?}: expected KEY:VALUE, e.g. expandable_segments:True")]
    NotKeyValue { arg: String },
    #[error("--set {key}:{value}: expected {expected}")]
    BadValue { key: String, value: String, expected: &'static str },
    #[error("--set max_split_size_mb:{value}: torch requires more than 20 (MB)")]
    SplitTooSmall { value: String },
    #[error(
        "--set {key}: not an allocator setting the simulator models (expandable_segments, max_split_size_mb, \
         roundup_power2_divisions, garbage_collection_threshold)"
    )]
    UnknownSetting { key: String },
    #[error("--scale {arg:?}: expected CATEGORY=FACTOR, e.g. activation=0.75")]
    NotCategoryFactor { arg: String },
    #[error("--scale {arg:?}: {category:?} is not a category ({})", super::categories::CATEGORIES.join(", "))]
    UnknownCategory { arg: String, category: String },
    #[error("--scale {arg:?}: the factor must be a number ≥ 0, or auto")]
    BadFactor { arg: String },
    #[error(
        "--scale {category}: no request in GPU {device}'s trace is of that kind{}",
        if *stacks { "" } else { " (the capture recorded no stacks to tell kinds apart)" }
    )]
    NoRequestOfKind { category: String, device: i64, stacks: bool },
    #[error("--drop-stack {pattern}: no request in GPU {device}'s trace has that frame")]
    NoFrame { pattern: String, device: i64 },
}

/// An allocator setting as `PYTORCH_CUDA_ALLOC_CONF` writes it, applied to a config.
pub fn apply_setting(cfg: &mut Config, key: &str, value: &str) -> Result<(), WhatIfError> {
    let bad = || WhatIfError::BadValue { key: key.into(), value: value.into(), expected: expected(key) };
    match key {
        "expandable_segments" => {
            cfg.rules.expandable = match value.to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(bad()),
            }
        }
        "max_split_size_mb" => {
            let mb: u64 = value.parse().map_err(|_| bad())?;
            if mb <= 20 {
                return Err(WhatIfError::SplitTooSmall { value: value.into() });
            }
            cfg.rules.max_split_size = Some(mb << 20);
        }
        "roundup_power2_divisions" => cfg.rules.divisions = parse_divisions(value).ok_or_else(bad)?,
        "garbage_collection_threshold" => {
            let t: f64 = value.parse().map_err(|_| bad())?;
            if !(t > 0.0 && t < 1.0) {
                return Err(bad());
            }
            cfg.gc_threshold = Some(t);
        }
        _ => return Err(WhatIfError::UnknownSetting { key: key.into() }),
    }
    Ok(())
}

fn expected(key: &str) -> &'static str {
    match key {
        "expandable_segments" => "True or False",
        "max_split_size_mb" => "a whole number of MB over 20",
        "roundup_power2_divisions" => "a power of two (4), or [256:1,512:2,>:8]",
        "garbage_collection_threshold" => "a fraction between 0 and 1",
        _ => "a value",
    }
}

/// `4` (every interval) or `[256:1,512:2,>:8]`, read as torch reads it: a key is a power of two in MB naming the
/// interval [key, 2·key); the first key also covers every interval below it, and `>` every interval from the last
/// key named on (that one included). As `(interval start in MiB, divisions)`, the form the file's settings take.
fn parse_divisions(v: &str) -> Option<Vec<(u64, u64)>> {
    const INTERVALS: usize = 16;
    let mut table = [0u64; INTERVALS];
    if let Ok(d) = v.parse::<u64>() {
        if !d.is_power_of_two() {
            return None;
        }
        table = [d; INTERVALS];
    } else {
        let inner = v.strip_prefix('[')?.strip_suffix(']')?;
        let mut last: Option<usize> = None;
        for part in inner.split(',') {
            let (k, d) = part.split_once(':')?;
            let d: u64 = d.trim().parse().ok()?;
            if !d.is_power_of_two() {
                return None;
            }
            match k.trim() {
                ">" => table[last.unwrap_or(0)..].fill(d),
                k => {
                    let mb: u64 = k.parse().ok()?;
                    if !mb.is_power_of_two() {
                        return None;
                    }
                    let index = (63 - mb.leading_zeros() as usize).min(INTERVALS - 1);
                    if last.is_none() {
                        table[..index].fill(d);
                    }
                    table[index] = d;
                    last = Some(index);
                }
            }
        }
    }
    Some(table.iter().enumerate().map(|(i, &d)| (1u64 << i, d)).collect())
}

/// How a category is scaled: by a factor, or the largest factor that fits (searched).
#[derive(Clone, Debug, PartialEq)]
pub enum Scale {
    By(f64),
    Largest,
}

/// The changes asked for on the command line, all applied together.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub settings: Vec<(String, String)>,
    pub scales: Vec<(String, Scale)>,
    pub drop_stacks: Vec<String>,
    /// A GPU of this size (less the memory outside PyTorch when known).
    pub gpu_memory: Option<u64>,
}

impl Plan {
    /// Reads `--set KEY:VALUE`, `--scale CATEGORY=FACTOR|auto` and `--drop-stack FRAME`.
    pub fn parse(
        set: &[String],
        scale: &[String],
        drop: &[String],
        gpu_memory: Option<u64>,
    ) -> Result<Plan, WhatIfError> {
        let mut plan = Plan { drop_stacks: drop.to_vec(), gpu_memory, ..Default::default() };
        // A PYTORCH_CUDA_ALLOC_CONF pasted whole is several settings, as torch reads it.
        for whole in set {
            let items = conf_items(whole);
            if items.is_empty() {
                return Err(WhatIfError::NotKeyValue { arg: whole.clone() });
            }
            for s in items {
                let (k, v) = s
                    .split_once(':')
                    .or_else(|| s.split_once('='))
                    .ok_or_else(|| WhatIfError::NotKeyValue { arg: s.to_string() })?;
                apply_setting(&mut Config::default(), k.trim(), v.trim())?;
                plan.settings.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        for s in scale {
            let (cat, f) = s.split_once('=').ok_or_else(|| WhatIfError::NotCategoryFactor { arg: s.clone() })?;
            let cat = cat.trim();
            if !super::categories::CATEGORIES.contains(&cat) {
                return Err(WhatIfError::UnknownCategory { arg: s.clone(), category: cat.into() });
            }
            let by = match f.trim() {
                "auto" | "max" => Scale::Largest,
                f => match f.parse::<f64>() {
                    Ok(x) if x >= 0.0 && x.is_finite() => Scale::By(x),
                    _ => return Err(WhatIfError::BadFactor { arg: s.clone() }),
                },
            };
            plan.scales.push((cat.to_string(), by));
        }
        Ok(plan)
    }

    pub fn is_empty(&self) -> bool {
        self.settings.is_empty() && self.scales.is_empty() && self.drop_stacks.is_empty() && self.gpu_memory.is_none()
    }

    /// The change in words, as the command line gave it.
    pub fn words(&self, searched: Option<f64>) -> String {
        let mut parts: Vec<String> = self.settings.iter().map(|(k, v)| format!("{k}:{v}")).collect();
        for (c, s) in &self.scales {
            parts.push(match (s, searched) {
                (Scale::By(f), _) => format!("{c}×{f}"),
                (Scale::Largest, Some(f)) => format!("{c}×{f:.2} (the largest that fits)"),
                (Scale::Largest, None) => format!("{c}×? (nothing fits)"),
            });
        }
        parts.extend(self.drop_stacks.iter().map(|d| format!("without {d}")));
        if let Some(g) = self.gpu_memory {
            parts.push(format!("a {} GPU", crate::units::bytes(g)));
        }
        parts.join(", ")
    }
}

/// One device's what-ifs.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceWhatIfs {
    pub device: i64,
    pub capacity: Capacity,
    /// The trace's own settings, simulated: the baseline every change is read against.
    pub recorded: WhatIf,
    pub whatif: Vec<WhatIf>,
    /// Why the results are approximate, when they are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approximate: Option<String>,
    /// Why a change that fits is not proven to avoid the OOM, when it is not (see [`WhatIf::recorded_part_only`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_part_only: Option<String>,
}

/// The sentence that says why fitting the recorded part proves nothing of the rest, for a trace that ends at an OOM
/// inside its first pass.
pub const RECORDED_PART_ONLY: &str = "the trace ends at the OOM inside the first pass of the program's loop it \
     holds: a change that fits proves only the part recorded, not what the run does after the failing request (the \
     rest of that pass), which was never recorded";

/// The event a trace's OOM is at: its last `oom` entry, or the end of a trace whose last request the allocator
/// rejected under its fraction cap (no `oom` entry; the log says it). `None`: the trace did not end in an OOM.
pub fn oom_event(tl: &Timeline, dev: &DeviceTimeline) -> Option<usize> {
    dev.events.iter().rposition(|e| e.action == Action::Oom).or_else(|| {
        let rejected = super::observed::last_oom_message(tl, dev.device)
            .is_some_and(|m| m.limit == Some(crate::timeline::OomLimit::FractionRejected));
        (rejected && !dev.events.is_empty()).then(|| dev.events.len() - 1)
    })
}

/// Marks the changes that fit where the trace ends at an OOM (event `oom`) before it recorded a whole pass of the
/// program's loop (see [`super::facts::EventFacts::whole_pass_before`]): fitting proves only the part recorded.
/// Says whether it did.
pub fn mark_recorded_part_only(oom: Option<usize>, events: &super::facts::EventFacts, whatif: &mut [WhatIf]) -> bool {
    let partial = oom.is_some_and(|at| !events.whole_pass_before(at));
    for w in whatif.iter_mut().filter(|w| w.fits == Some(true)) {
        w.recorded_part_only = partial;
    }
    partial && whatif.iter().any(|w| w.recorded_part_only)
}

/// Whether a frame pattern (`file:line`, `file`, or a function name) names one of the stack's frames.
fn stack_has(tl: &Timeline, stack: crate::timeline::stacks::StackId, pattern: &str) -> bool {
    let (file, line) = match pattern.rsplit_once(':') {
        Some((f, l)) => match l.parse::<i64>() {
            Ok(l) => (f, Some(l)),
            Err(_) => (pattern, None),
        },
        None => (pattern, None),
    };
    tl.stacks.stack(stack).iter().any(|&f| {
        let fr = tl.stacks.frame(f);
        let (name, func) = (tl.str(fr.filename), tl.str(fr.name));
        let file_ok = name == file || name.ends_with(&format!("/{file}")) || name.ends_with(&format!("\\{file}"));
        match line {
            Some(l) => file_ok && fr.line == l,
            None => file_ok || func == file,
        }
    })
}

/// Runs the plan on one device (or, with an empty plan, the standard knobs).
pub fn run_device(
    tl: &Timeline,
    dev: &DeviceTimeline,
    replay: &Replay,
    cats: &super::categories::Categorizer,
    plan: &Plan,
    memory_cap: Option<u64>,
) -> Result<DeviceWhatIfs, WhatIfError> {
    let cap = capacity(tl, dev, replay, memory_cap, plan.gpu_memory);
    let base = recorded_config(tl, replay, &cap);
    let plain = Workload::from_trace(replay);
    let exact = !plain.rebuilt_start;
    let approximate = plain.rebuilt_start.then(|| {
        "the trace starts mid-run (its ring buffer wrapped, or recording began late): each simulation starts from \
         the state rebuilt at its first event"
            .to_string()
    });
    let recorded = WhatIf::of("as recorded", &simulator::simulate(&plain, base.clone(), false), &base, exact);
    let mut whatif = Vec::new();
    if plan.is_empty() {
        whatif = standard(&plain, &base, &cap, exact);
    } else {
        let mut cfg = base.clone();
        for (k, v) in &plan.settings {
            apply_setting(&mut cfg, k, v)?;
        }
        if let Some(g) = plan.gpu_memory {
            cfg.capacity = Some(g.saturating_sub(cap.outside.unwrap_or(0)));
            cfg.fraction_cap = false;
        }
        let mut cache = super::categories::CategoryCache::new(cats, tl);
        let (cat_of, has) = request_categories(tl, dev, &mut cache);
        if let Some((name, _)) = plan.scales.iter().find(|(name, _)| !category_index(name).is_some_and(|i| has[i])) {
            return Err(WhatIfError::NoRequestOfKind {
                category: name.clone(),
                device: dev.device,
                stacks: tl.capture.trace_stacks,
            });
        }
        // Per requesting stack: is it left out, and which scale applies (an index into the plan's).
        let mut dropped = vec![false; cat_of.len()];
        let mut any_dropped = vec![false; plan.drop_stacks.len()];
        for (stack, _) in cat_of.iter().enumerate().filter(|(_, &c)| c != u8::MAX) {
            for (i, p) in plan.drop_stacks.iter().enumerate() {
                if stack_has(tl, stack as crate::timeline::stacks::StackId, p) {
                    dropped[stack] = true;
                    any_dropped[i] = true;
                }
            }
        }
        if let Some(i) = any_dropped.iter().position(|&h| !h) {
            return Err(WhatIfError::NoFrame { pattern: plan.drop_stacks[i].clone(), device: dev.device });
        }
        let scale_of: Vec<Option<&Scale>> = cat_of
            .iter()
            .map(|&c| {
                let name = super::categories::CATEGORIES.get(c as usize)?;
                plan.scales.iter().find(|(n, _)| n == name).map(|(_, s)| s)
            })
            .collect();
        // `factor`: what `--scale CATEGORY=auto` scales by in this run.
        let sim = |factor: f64, capacity: Option<u64>| {
            simulator::simulate_with(&plain, Config { capacity, ..cfg.clone() }, false, |stack, size| {
                if dropped.get(stack as usize) == Some(&true) {
                    return Edit::Drop;
                }
                match scale_of.get(stack as usize).copied().flatten() {
                    Some(Scale::By(f)) => Edit::Resize((size as f64 * f).round() as u64),
                    Some(Scale::Largest) => Edit::Resize((size as f64 * factor).round() as u64),
                    None => Edit::Keep,
                }
            })
        };
        let run = |factor: f64| sim(factor, cfg.capacity);
        let searching = plan.scales.iter().any(|(_, s)| *s == Scale::Largest);
        if searching && cfg.capacity.is_some() {
            let (mut lo, mut hi) = (0.0f64, 1.0f64);
            // Past 1× when it fits as recorded: how much larger it could be.
            while run(hi).fits() && hi < 64.0 {
                lo = hi;
                hi *= 2.0;
            }
            for _ in 0..12 {
                let mid = (lo + hi) / 2.0;
                if run(mid).fits() {
                    lo = mid
                } else {
                    hi = mid
                }
            }
            let out = run(lo);
            let found = out.fits().then_some(lo);
            whatif.push(WhatIf::of(plan.words(found), &out, &cfg, exact));
        } else {
            let mut w = WhatIf::of(plan.words(None), &run(1.0), &cfg, exact);
            w.settle(&cap, |most| sim(1.0, Some(most)));
            whatif.push(w);
        }
    }
    let mut cache = super::categories::CategoryCache::new(cats, tl);
    let events = super::facts::event_facts(tl, dev, &mut cache);
    let recorded_part_only =
        mark_recorded_part_only(oom_event(tl, dev), &events, &mut whatif).then(|| RECORDED_PART_ONLY.to_string());
    Ok(DeviceWhatIfs { device: dev.device, capacity: cap, recorded, whatif, approximate, recorded_part_only })
}

/// Each requesting stack's category, by stack id (an index into `CATEGORIES`; `u8::MAX` for a stack that made no
/// request), and which categories made requests. A trace repeats a few thousand stacks a million times: each is
/// classified once.
fn request_categories(
    tl: &Timeline,
    dev: &DeviceTimeline,
    cats: &mut super::categories::CategoryCache,
) -> RequestCategories {
    let mut cat_of: Vec<u8> = vec![u8::MAX; tl.stacks.stack_count()];
    let mut has = [false; super::categories::CATEGORIES.len()];
    for e in dev.events.iter().filter(|e| e.action == Action::Alloc) {
        let Some(slot) = cat_of.get_mut(e.stack as usize) else { continue };
        if *slot == u8::MAX {
            *slot = category_index(cats.of(e.stack)).unwrap_or(0) as u8;
        }
        has[*slot as usize] = true;
    }
    (cat_of, has)
}

fn category_index(c: &str) -> Option<usize> {
    super::categories::CATEGORIES.iter().position(|&k| k == c)
}
/// The standard knobs, each alone: expandable segments, the best `max_split_size_mb`, rounding to power-of-two
/// divisions, and (under a memory cap) garbage collection.
fn standard(w: &Workload, base: &Config, cap: &Capacity, exact: bool) -> Vec<WhatIf> {
    let mut out = Vec::new();
    let try_with = |change: String, cfg: Config| {
        let o = simulator::simulate(w, cfg.clone(), false);
        let mut wi = WhatIf::of(change, &o, &cfg, exact);
        wi.settle(cap, |most| simulator::simulate(w, Config { capacity: Some(most), ..cfg }, false));
        wi
    };
    let mut cfg = base.clone();
    cfg.rules.expandable = !base.rules.expandable;
    out.push(try_with(format!("expandable_segments:{}", if cfg.rules.expandable { "True" } else { "False" }), cfg));
    if !base.rules.expandable {
        let mut best: Option<(u64, u64, Outcome, Config)> = None;
        for mb in [64u64, 128, 256, 512, 1024, 2048, 4096] {
            let mut cfg = base.clone();
            cfg.rules.max_split_size = Some(mb << 20);
            let o = simulator::simulate(w, cfg.clone(), false);
            let key = (o.failures as u64, o.peak_reserved);
            if best.as_ref().is_none_or(|b| key < (b.2.failures as u64, b.1)) {
                best = Some((mb, o.peak_reserved, o, cfg));
            }
        }
        if let Some((mb, _, o, cfg)) = best {
            let mut wi = WhatIf::of(format!("max_split_size_mb:{mb} (the best of 64–4096)"), &o, &cfg, exact);
            wi.settle(cap, |most| simulator::simulate(w, Config { capacity: Some(most), ..cfg }, false));
            out.push(wi);
        }
    }
    let mut cfg = base.clone();
    cfg.rules.divisions = parse_divisions("4").unwrap_or_default();
    out.push(try_with("roundup_power2_divisions:4".into(), cfg));
    if base.fraction_cap && base.gc_threshold.is_none_or(|t| t <= 0.0) {
        let mut cfg = base.clone();
        cfg.gc_threshold = Some(0.8);
        out.push(try_with("garbage_collection_threshold:0.8".into(), cfg));
    }
    out
}

/// The remedies the verdict may quote, tried on the trace at an OOM: expandable segments (where they were off) and
/// `max_split_size_mb`, the holder's category scaled down (a smaller batch or cache), the leak left out, an 8-bit
/// optimizer. Only those that apply to what the trace holds; run on two cores.
pub fn at_oom(
    tl: &Timeline,
    dev: &DeviceTimeline,
    replay: &Replay,
    report: &super::DeviceReport,
    cats: &mut super::categories::CategoryCache,
    opts: &super::Options,
    prepared: Option<Prepared>,
) -> Vec<WhatIf> {
    if dev.events.is_empty() || report.oom.is_none() {
        return Vec::new();
    }
    let cap = capacity(tl, dev, replay, opts.memory_cap, opts.gpu_memory);
    if cap.bytes.is_none() {
        return Vec::new();
    }
    let need = report.oom.as_ref().and_then(|o| o.requested_bytes).map(|r| r + report.allocated_bytes);
    let case = OomCase { holder: report.holder.as_ref().map(|h| h.category), leak: &report.facts.leak_sites, need };
    remedies(tl, dev, replay, &cap, &case, cats, prepared)
}

/// What the remedies read from the trace alone: its requests (where the trace starts on an empty device) and their
/// categories. Made ahead where a core would wait: beside the replay, which the analysis needs first.
pub struct Prepared {
    device: i64,
    workload: Workload,
    categories: RequestCategories,
}

type RequestCategories = (Vec<u8>, [bool; super::categories::CATEGORIES.len()]);

impl Prepared {
    /// `None` where the trace shows it did not start on an empty device (see [`Workload::from_empty_start`]): its
    /// workload needs the replay's rebuilt start.
    pub fn new(tl: &Timeline, dev: &DeviceTimeline, cats: &mut super::categories::CategoryCache) -> Option<Prepared> {
        let workload = Workload::from_empty_start(dev)?;
        Some(Prepared { device: dev.device, workload, categories: request_categories(tl, dev, cats) })
    }

    /// Whether the remedies of this device will be tried (see [`at_oom`]): at its OOM, with a capacity to try them
    /// against.
    pub fn wanted(tl: &Timeline, dev: &DeviceTimeline, opts: &super::Options) -> bool {
        matches!(opts.at, super::At::Auto | super::At::Oom)
            && oom_event(tl, dev).is_some()
            && capacity_from(tl, dev, opts.memory_cap, opts.gpu_memory) != CapacityFrom::Unknown
    }
}

/// What the remedies are chosen by.
#[derive(Clone, Copy, Debug)]
pub struct OomCase<'a> {
    /// The category holding the most memory at the OOM.
    pub holder: Option<&'static str>,
    /// The sites (stacks, or sizes in a trace with no frame) whose allocations accumulate.
    pub leak: &'a [super::facts::Site],
    /// The live bytes plus the request at the OOM.
    pub need: Option<u64>,
}

/// The remedies tried for a GPU whose memory is held mostly by `holder`, with `leak` the stacks that accumulate
/// (see [`at_oom`]); public for the benchmark. `prepared` (this device's) serves where the replay finds the trace
/// complete; otherwise the workload is read from the replay.
pub fn remedies(
    tl: &Timeline,
    dev: &DeviceTimeline,
    replay: &Replay,
    cap: &Capacity,
    case: &OomCase,
    cats: &mut super::categories::CategoryCache,
    prepared: Option<Prepared>,
) -> Vec<WhatIf> {
    let OomCase { holder, leak, need } = *case;
    let base = recorded_config(tl, replay, cap);
    // No allocator setting packs the live tensors and the request into less than their sum: past the most the
    // process could hold, the settings are not tried.
    let settings_hopeless = need.is_some_and(|n| n > cap.at_most.or(cap.bytes).unwrap_or(u64::MAX));
    // A workload read before the replay said whether the trace starts on an empty device serves where it does.
    debug_assert!(prepared.as_ref().is_none_or(|p| p.device == dev.device), "prepared for another device");
    let (plain, (cat_of, has)) = match prepared.filter(|_| replay.complete()) {
        Some(p) => (p.workload, p.categories),
        // The requests' categories (a pass over the events) beside the workload (another).
        None => std::thread::scope(|s| {
            let categories = crate::threads::beside(s, || request_categories(tl, dev, cats));
            let plain = Workload::from_trace(replay);
            (plain, categories())
        }),
    };
    let index = category_index;
    let is = |stack: crate::timeline::stacks::StackId, c: usize| cat_of.get(stack as usize) == Some(&(c as u8));
    let scalable =
        holder.filter(|c| ["activation", "temporary", "kv_cache"].contains(c)).and_then(index).filter(|&i| has[i]);
    let leak: rustc_hash::FxHashSet<_> = leak.iter().copied().collect();
    let exact = !plain.rebuilt_start;
    let sim = |knob: Knob, capacity: Option<u64>| -> (Outcome, Config) {
        // The verdict asks only whether the run would have got past its OOM: past a failure the program would
        // have raised, and a run that fails early under a setting (a trace whose start was rebuilt) would
        // otherwise go on failing at every request to its end.
        let mut cfg = Config { capacity, stop_at_first_failure: true, ..base.clone() };
        let out = match knob {
            Knob::ExpandableSegments => {
                cfg.rules.expandable = true;
                simulator::simulate(&plain, cfg.clone(), false)
            }
            Knob::MaxSplitSize(mb) => {
                cfg.rules.max_split_size = Some(mb << 20);
                simulator::simulate(&plain, cfg.clone(), false)
            }
            Knob::Scale(c, f) => {
                let c = index(c).unwrap_or(usize::MAX);
                simulator::simulate_with(&plain, cfg.clone(), false, |stack, size| {
                    if is(stack, c) {
                        Edit::Resize((size as f64 * f).round() as u64)
                    } else {
                        Edit::Keep
                    }
                })
            }
            Knob::NoLeak => simulator::simulate_with(&plain, cfg.clone(), false, |stack, size| {
                let site =
                    if stack == crate::timeline::stacks::EMPTY_STACK { Site::Size(size) } else { Site::Stack(stack) };
                if leak.contains(&site) {
                    Edit::Drop
                } else {
                    Edit::Keep
                }
            }),
            Knob::EightBitOptimizer => {
                let c = index("optimizer_state").unwrap_or(usize::MAX);
                simulator::simulate_with(&plain, cfg.clone(), false, |stack, size| {
                    if is(stack, c) {
                        Edit::Resize(size / 4)
                    } else {
                        Edit::Keep
                    }
                })
            }
        };
        (out, cfg)
    };
    let run = |knob: Knob| -> WhatIf {
        let (out, cfg) = sim(knob, base.capacity);
        let mut wi = WhatIf::of(knob.words(), &out, &cfg, exact);
        wi.settle(cap, |most| sim(knob, Some(most)).0);
        wi.knob = Some(knob);
        wi
    };
    let fits = |w: &WhatIf| w.fits == Some(true);
    let scale = scalable.map(|i| super::categories::CATEGORIES[i]);
    if settings_hopeless {
        // Only the workload can help, and its tries do not depend on each other: one per core.
        let mut knobs: Vec<Knob> = Vec::new();
        if !leak.is_empty() {
            knobs.push(Knob::NoLeak);
            knobs.extend(scale.map(|c| Knob::Scale(c, 0.5)));
        } else if let Some(c) = scale {
            knobs.extend([Knob::Scale(c, 0.75), Knob::Scale(c, 0.5)]);
        }
        if holder == Some("optimizer_state") {
            knobs.push(Knob::EightBitOptimizer);
        }
        let half = knobs.len().div_ceil(2);
        let (mine, theirs) = knobs.split_at(half);
        return std::thread::scope(|s| {
            let other = crate::threads::beside(s, || theirs.iter().map(|&k| run(k)).collect::<Vec<_>>());
            let mut v: Vec<WhatIf> = mine.iter().map(|&k| run(k)).collect();
            v.extend(other());
            v
        });
    }
    // Two chains, one per core, each trying the next remedy only where the last did not answer: the allocator's
    // settings, and the workload (the leak, a smaller batch or cache, an 8-bit optimizer).
    let settings = || {
        let mut out = Vec::new();
        if !base.rules.expandable {
            let w = run(Knob::ExpandableSegments);
            let refuted = !fits(&w);
            out.push(w);
            if refuted && base.rules.max_split_size.is_none() {
                out.push(run(Knob::MaxSplitSize(512)));
            }
        }
        out
    };
    let work = || {
        let mut out = Vec::new();
        if !leak.is_empty() {
            out.push(run(Knob::NoLeak));
            out.extend(scale.map(|c| run(Knob::Scale(c, 0.5))));
        } else if let Some(c) = scale {
            let w = run(Knob::Scale(c, 0.75));
            let refuted = !fits(&w);
            out.push(w);
            if refuted {
                out.push(run(Knob::Scale(c, 0.5)));
            }
        }
        if holder == Some("optimizer_state") {
            out.push(run(Knob::EightBitOptimizer));
        }
        out
    };
    std::thread::scope(|s| {
        let theirs = crate::threads::beside(s, work);
        let mut v = settings();
        v.extend(theirs());
        v
    })
}

impl Knob {
    /// As `oomdoc whatif` would be asked for it.
    pub fn words(self) -> String {
        match self {
            Knob::ExpandableSegments => "expandable_segments:True".into(),
            Knob::MaxSplitSize(mb) => format!("max_split_size_mb:{mb}"),
            Knob::Scale(c, f) => format!("{c}×{f}"),
            Knob::NoLeak => "without the leak".into(),
            Knob::EightBitOptimizer => "optimizer_state×0.25".into(),
        }
    }
}

/// The settings of one allocator configuration string: comma-separated, except inside `[…]`
/// (`roundup_power2_divisions:[256:1,>:4]`).
fn conf_items(conf: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in conf.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&conf[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&conf[start..]);
    items.into_iter().map(str::trim).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pasted_alloc_conf_is_several_settings_and_brackets_hold_their_commas() {
        let set = ["garbage_collection_threshold:0.6, roundup_power2_divisions:[256:1,>:4]".to_string()];
        let plan = Plan::parse(&set, &[], &[], None).unwrap();
        let pairs: Vec<(&str, &str)> = plan.settings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pairs, [("garbage_collection_threshold", "0.6"), ("roundup_power2_divisions", "[256:1,>:4]")]);
        assert!(Plan::parse(&["max_split_size_mb:64,bogus".to_string()], &[], &[], None).is_err());
        assert!(Plan::parse(&[",".to_string()], &[], &[], None).is_err(), "nothing to set is an error");
    }

    #[test]
    fn divisions_are_read_as_torch_reads_them() {
        let all4 = parse_divisions("4").unwrap();
        assert_eq!(all4.len(), 16);
        assert!(all4.iter().all(|&(_, d)| d == 4));
        let t = parse_divisions("[256:1,512:2,>:8]").unwrap();
        let at = |mib: u64| t.iter().find(|e| e.0 == mib).unwrap().1;
        // the first key covers every interval below it; `>` fills from the last key named, that one included
        assert_eq!((at(1), at(128), at(256), at(512), at(1024), at(32768)), (1, 1, 1, 8, 8, 8));
        assert!(parse_divisions("3").is_none());
        assert!(parse_divisions("[100:2]").is_none());
        assert!(parse_divisions("[256:3]").is_none());
    }

    #[test]
    fn a_plan_reads_the_command_line_and_says_itself() {
        let p = Plan::parse(
            &["expandable_segments:True".into(), "max_split_size_mb=512".into()],
            &["activation=0.75".into(), "kv_cache=auto".into()],
            &["train.py:88".into()],
            Some(80 << 30),
        )
        .unwrap();
        assert_eq!(
            p.words(Some(0.5)),
            "expandable_segments:True, max_split_size_mb:512, activation×0.75, kv_cache×0.50 (the largest that \
             fits), without train.py:88, a 80.0 GiB GPU"
        );
        assert!(Plan::parse(&[], &["activation=-1".into()], &[], None).is_err());
        assert!(Plan::parse(&["garbage_collection_threshold:1.5".into()], &[], &[], None).is_err());
    }
}
