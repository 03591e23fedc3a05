//! The verdict: for each GPU, the answer first. At an OOM, the arithmetic of the failure — what was asked, what the
//! driver had, what PyTorch held and could not use, what was held outside PyTorch — and what filled the GPU; without
//! one, the same for the peak. Then the causes the checklist found, ranked by the memory each explains: the primary
//! cause explains the most, and a cause that explains a small share of the memory is not above a warning, so the
//! last straw (a small request that did not fit in fragmented free space) never outranks what filled the GPU. When
//! no rule fires, the verdict still names what holds the memory and the standard remedies for it: "no rule found a
//! cause" is never the answer to an OOM.

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::attribution::{module_and_phase, Attribution, Reason, Source};
use super::raising_line::{self, Decider, Figures, Likely};
use super::{Analysis, DeviceReport, Finding, Moment, ReportSource, Severity};
use crate::timeline::replay::State;
use crate::timeline::stacks::{StackId, EMPTY_STACK};
use crate::timeline::Timeline;
use crate::units::bytes;

/// A cause that explains less than this share of the memory in question is not above a warning, unless it is the
/// primary cause (nothing explains more).
const SMALL_SHARE: f64 = 0.10;

/// A holder's `stack` when nothing was recorded.
const NO_STACK: &str = "(no stack recorded)";

/// For a dump whose blocks have stacks except those made before recording began.
const EARLIER_ADVICE: &str = "start torch.cuda.memory._record_memory_history() before the model is built, with \
     stacks=\"all\" where the backward allocates, so every block carries the stack that allocated it";

/// For a dump with no history: stacks alone would not help, what holds the memory comes from the history.
const HISTORY_ADVICE: &str = "record the allocation history before the failing step, so the next snapshot says what \
     held the memory: torch.cuda.memory._record_memory_history(max_entries=100000) (oomdoc.record() does it), then \
     _dump_snapshot() where it fails";

/// What holds the most memory at the moment.
#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    /// The category (see rules/categories.toml) with the most live bytes.
    pub category: &'static str,
    pub bytes: u64,
    /// The lines that allocated most of it: `model.py:41, :43 and :47 in forward`.
    pub stack: String,
    /// Its share of allocated memory.
    pub share: f64,
    /// How most of its bytes were known: `label`, `stack` or `inferred` (null for `unknown`).
    pub source: Option<Source>,
    /// Where no stack was recorded: what the inference went by.
    #[serde(rename = "inferred_from", skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// The module a label names for most of its bytes, and the phase: `model.layers.17.mlp` in the `backward`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<&'static str>,
}

/// One cause, as the verdict ranks it.
#[derive(Clone, Debug, Serialize)]
pub struct Cause {
    pub rule: String,
    pub severity: Severity,
    /// The memory it explains (null where no size applies).
    pub bytes: Option<u64>,
    pub title: String,
}

/// The figures of the failure.
#[derive(Clone, Debug, Serialize)]
pub struct Arithmetic {
    pub requested_bytes: Option<u64>,
    /// What the driver said was free on the GPU.
    pub device_free_bytes: Option<u64>,
    pub capacity_bytes: Option<u64>,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Cached free bytes in the request's pool and stream, and the largest of those blocks.
    pub cached_free_bytes: Option<u64>,
    pub largest_free_block_bytes: Option<u64>,
    pub outside_pytorch_bytes: Option<u64>,
    /// The process's cap (set_per_process_memory_fraction), when it had one.
    pub allowed_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    /// One or two sentences: what happened, what filled the GPU, and the primary cause.
    pub summary: String,
    /// The rule that explains the most memory (null when no rule fired).
    pub primary_rule: Option<String>,
    /// What holds the most memory (null without allocator data).
    pub holder: Option<Holder>,
    /// The bytes the primary cause accounts for (null without one).
    pub explained_bytes: Option<u64>,
    /// This GPU's findings, by the memory they explain (those without a size last).
    pub causes: Vec<Cause>,
    /// At an OOM: its figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arithmetic: Option<Arithmetic>,
    /// When no rule names the cause: what usually helps with the memory that holds the most.
    pub remedies: Vec<String>,
    /// Without allocator data, which of the OOM message's figures decided it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<Decider>,
    /// Without allocator data, what the line that raised it was likely doing (from the traceback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub likely: Option<Likely>,
    /// At an OOM: the remedies replayed on this trace through the allocator model, proven or refuted, in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub proven: Vec<String>,
    /// Where the file cannot say what held the memory for a reason a setting fixes: how to record the next run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_advice: Option<String>,
}

/// The largest category of live memory at the moment and the lines that allocated most of it.
pub fn holder(tl: &Timeline, r: &DeviceReport, state: &State, attribution: &Attribution) -> Option<Holder> {
    if r.allocated_bytes == 0 {
        return None;
    }
    let mut by_cat: FxHashMap<&'static str, (u64, FxHashMap<StackId, u64>)> = FxHashMap::default();
    for (_, addr, b) in state.allocated_blocks() {
        let e = by_cat.entry(attribution.of(addr).category).or_default();
        e.0 += b.size;
        *e.1.entry(b.stack).or_default() += b.size;
    }
    let (category, (bytes, stacks)) = by_cat.into_iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))?;
    // How its bytes were known, the inference that decided the most of them, and the module a label names.
    let mut sources: FxHashMap<Option<Source>, u64> = FxHashMap::default();
    let mut reasons: FxHashMap<Reason, u64> = FxHashMap::default();
    let mut modules: FxHashMap<(String, Option<&'static str>), u64> = FxHashMap::default();
    for (_, addr, b) in state.allocated_blocks() {
        let a = attribution.of(addr);
        if a.category != category {
            continue;
        }
        *sources.entry(a.source).or_default() += b.size;
        if let Some(r) = a.reason {
            *reasons.entry(r).or_default() += b.size;
        }
        if let Some(l) = attribution.labels(addr).alloc {
            *modules.entry(module_and_phase(tl.strings.get(l), a)).or_default() += b.size;
        }
    }
    let source = most(sources).and_then(|(s, _)| s);
    let reason = most(reasons).map(|(r, _)| r);
    // A module is named when its label covers most of the category.
    let (module, phase) = most(modules).filter(|(_, b)| b * 2 > bytes).map_or((None, None), |((m, p), _)| (Some(m), p));
    let mut stacks: Vec<(StackId, u64)> = stacks.into_iter().collect();
    stacks.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    // The lines that together hold most of the category (at most three).
    let mut top = Vec::new();
    let mut covered = 0;
    for &(s, b) in &stacks {
        if top.len() == 3 || (covered * 2 > bytes && !top.is_empty()) {
            break;
        }
        top.push(s);
        covered += b;
    }
    let stack = if top.iter().all(|&s| s == EMPTY_STACK) {
        NO_STACK.to_string()
    } else {
        top.retain(|&s| s != EMPTY_STACK);
        super::stacks::sites(tl, &top, 3)
    };
    Some(Holder {
        category,
        bytes,
        stack,
        share: bytes as f64 / r.allocated_bytes as f64,
        source,
        reason: reason.filter(|_| source == Some(Source::Inferred)),
        module,
        phase,
    })
}

/// The key holding the most bytes (the smallest key among equals, so the answer does not depend on hash order).
fn most<K: Ord>(m: FxHashMap<K, u64>) -> Option<(K, u64)> {
    m.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
}

/// Ranks each GPU's findings by the memory they explain, caps the severity of those that explain little, and
/// writes each GPU's verdict.
pub fn attach(a: &mut Analysis, yields_to: &dyn Fn(&str) -> Vec<String>) {
    // The GPU that ran out (the first, in the report's order): the others' verdicts point to it instead of giving
    // remedies for memory that did not run out.
    let ran_out = a.devices.iter().find(|d| d.oom.is_some()).map(|d| d.device);
    for d in &mut a.devices {
        let scale = scale(d);
        let mut mine: Vec<&mut Finding> = a.findings.iter_mut().filter(|f| f.device == Some(d.device)).collect();
        let mut primary = primary(&mine, yields_to, scale, d.oom.is_some());
        // From a message alone, plain shortage means PyTorch's own tensors filled the GPU: a cause explaining a
        // small share of that (the CUDA context outside PyTorch) is the last straw, not the primary cause.
        if message_decider(d) == Some(Decider::Shortage)
            && primary.is_some_and(|i| mine[i].bytes.is_some_and(|b| (b as f64) < SMALL_SHARE * scale as f64))
        {
            primary = None;
        }
        let lead = primary.map(|i| (mine[i].rule.clone(), mine[i].bytes));
        for (i, f) in mine.iter_mut().enumerate() {
            let small = f.bytes.is_some_and(|b| (b as f64) < SMALL_SHARE * scale as f64);
            if Some(i) != primary && small && f.severity == Severity::Error {
                f.severity = Severity::Warning;
                if let (Some(b), Some((rule, lead_bytes))) = (f.bytes, &lead) {
                    f.message.push_str(&format!(
                        " It explains {} of the {} in question{}: the last straw, not what filled the GPU.",
                        bytes(b),
                        bytes(scale),
                        lead_bytes.map_or(String::new(), |l| format!(", {rule} explains {}", bytes(l)))
                    ));
                }
            }
        }
        let mut causes: Vec<Cause> = mine
            .iter()
            // A note that explains none of the memory (what was held outside PyTorch when the process hit its own
            // cap) is not a cause.
            .filter(|f| !(f.severity == Severity::Info && f.bytes == Some(0)))
            .map(|f| Cause { rule: f.rule.clone(), severity: f.severity, bytes: f.bytes, title: f.title.clone() })
            .collect();
        causes.sort_by(|x, y| y.bytes.cmp(&x.bytes).then(y.severity.cmp(&x.severity)));
        let (proven, refuted_fix) = proofs(d, primary.map(|i| &*mine[i]));
        if let (Some(i), Some(fix)) = (primary, refuted_fix) {
            // A remedy the simulation refutes is not offered as the fix.
            mine[i].fix = fix;
        }
        let primary = primary.map(|i| &*mine[i]);
        let other_ran_out = ran_out.filter(|_| d.oom.is_none());
        let mut v = verdict(d, primary, causes, other_ran_out);
        v.proven = proven;
        d.verdict = Some(v);
    }
    let order: Vec<i64> = a.devices.iter().map(|d| d.device).collect();
    super::sort_findings(&mut a.findings, &order);
}

/// The memory in question: what PyTorch held, plus what it asked for at an OOM.
fn scale(d: &DeviceReport) -> u64 {
    let req = d.oom.as_ref().and_then(|o| o.requested_bytes).unwrap_or(0);
    (d.reserved_bytes + req).max(d.allocated_bytes).max(1)
}

/// The finding that explains the most memory among those at warning or above; without sizes, the most severe. A
/// finding whose rule yields to another that also found something here (at warning or above, explaining at least a
/// tenth of the memory in question: it accounts for the memory) is not a candidate: the last straw does not lead
/// beside what filled the memory.
fn primary(
    findings: &[&mut Finding],
    yields_to: &dyn Fn(&str) -> Vec<String>,
    scale: u64,
    ran_out: bool,
) -> Option<usize> {
    let fired = |rule: &String| {
        findings.iter().any(|f| {
            &f.rule == rule
                && f.severity >= Severity::Warning
                && f.bytes.is_some_and(|b| b as f64 >= SMALL_SHARE * scale as f64)
        })
    };
    let serious = |f: &Finding| f.severity >= Severity::Warning && !yields_to(&f.rule).iter().any(fired);
    let sized = findings
        .iter()
        .enumerate()
        .filter(|(_, f)| serious(f) && f.bytes.is_some())
        .max_by(|(i, a), (j, b)| a.bytes.cmp(&b.bytes).then(a.severity.cmp(&b.severity)).then(j.cmp(i)))
        .map(|(i, _)| i);
    // At an OOM the primary cause must explain memory: a finding without a size (churn, a missing no_sync) is
    // listed among the causes, not put first.
    sized.or_else(|| {
        findings
            .iter()
            .enumerate()
            .filter(|_| !ran_out)
            .filter(|(_, f)| serious(f))
            .max_by(|(i, a), (j, b)| a.severity.cmp(&b.severity).then(j.cmp(i)))
            .map(|(i, _)| i)
    })
}

fn verdict(d: &DeviceReport, primary: Option<&Finding>, causes: Vec<Cause>, other_ran_out: Option<i64>) -> Verdict {
    let fact_bytes = |name: &str| match d.facts.get(name).map(|f| &f.value) {
        Some(super::facts::Val::Num(n)) if *n >= 0.0 => Some(*n as u64),
        _ => None,
    };
    let outside = fact_bytes("nonpytorch_bytes");
    let capacity = fact_bytes("gpu.total_bytes");
    let allowed = fact_bytes("oom.allowed_bytes");
    let arithmetic = d.oom.as_ref().map(|o| Arithmetic {
        requested_bytes: o.requested_bytes,
        device_free_bytes: o.device_free_bytes,
        capacity_bytes: capacity,
        reserved_bytes: d.reserved_bytes,
        allocated_bytes: d.allocated_bytes,
        cached_free_bytes: o.cached_free_in_pool_bytes,
        largest_free_block_bytes: o.largest_free_in_pool_bytes,
        outside_pytorch_bytes: outside,
        allowed_bytes: allowed,
    });
    let holder = d.holder.clone();
    let nothing_named = holder.is_some() && names_nothing(d);
    // With no history at all nothing has a stack; where some blocks have theirs, the others were made before
    // recording began or on the autograd thread, which stacks="python" records no frame for. Either way the fix is in
    // how to record, said under the verdict, not a remedy for the memory.
    let unrecorded = unrecorded(d);
    let capture_advice = unrecorded.then_some(if nothing_named { HISTORY_ADVICE } else { EARLIER_ADVICE });
    // Without allocator data the message is all there is: its arithmetic decides, its traceback hints.
    let message_only = names_nothing(d) && d.oom.is_some();
    let decided_by = message_decider(d);
    let likely =
        d.oom.as_ref().and_then(|o| o.message.as_ref()).filter(|_| message_only).and_then(raising_line::likely);
    let likely_words = likely.as_ref().map_or(String::new(), |l| {
        format!(
            " It failed at {}{}: likely {}.",
            l.at,
            l.code.as_ref().map_or(String::new(), |c| format!(" (`{c}`)")),
            l.what
        )
    });
    let mut first = match &d.oom {
        Some(o) => {
            let mut s = format!(
                "GPU {} ran out of memory asking for {}",
                d.device,
                o.requested_bytes.map_or("memory".into(), bytes)
            );
            let mut figures = Vec::new();
            // A capped process fails with the device's memory still free: its cap comes first.
            if let Some(a) = allowed.filter(|&a| capacity.is_none_or(|c| a < c)) {
                figures.push(format!("a {} cap on this process", bytes(a)));
            }
            match (o.device_free_bytes, capacity) {
                (Some(f), Some(c)) => figures.push(format!("{} free of {}", bytes(f), bytes(c))),
                (Some(f), None) => figures.push(format!("{} free on the device", bytes(f))),
                _ => {}
            }
            if d.reserved_bytes > 0 {
                figures.push(format!("PyTorch reserved {}", bytes(d.reserved_bytes)));
            }
            if let Some(x) = outside.filter(|&x| x > 0) {
                figures.push(format!("{} outside PyTorch", bytes(x)));
            }
            if !figures.is_empty() {
                s.push_str(&format!(" ({})", figures.join("; ")));
            }
            s
        }
        None => match (d.moment, &d.peak) {
            (Moment::Peak, Some(p)) => format!(
                "GPU {} peaked at {} allocated ({} reserved){}",
                d.device,
                bytes(p.allocated_bytes),
                bytes(d.reserved_bytes),
                d.time_us
                    .zip(d.trace.first_time_us)
                    .map_or(String::new(), |(t, t0)| format!(" {} into the trace", crate::units::duration_us(t - t0)))
            ),
            _ => format!(
                "At the {} GPU {} held {} allocated ({} reserved){}",
                d.moment.words(),
                d.device,
                bytes(d.allocated_bytes),
                bytes(d.reserved_bytes),
                // The OOM is what the user came for: a moment after it says it happened.
                if d.oom_count > 0 && d.moment != Moment::Peak {
                    " — it had run out of memory before this moment (--at oom shows that one)"
                } else {
                    ""
                }
            ),
        },
    };
    match &holder {
        Some(_) if nothing_named => first.push_str(&format!(
            "; the file holds the allocator's state only (no history, no stack): what held its {} is not known.",
            bytes(d.allocated_bytes)
        )),
        Some(h) if h.stack == NO_STACK && h.source.is_none() => first.push_str(&format!(
            "; {} of what was allocated ({}) has no recorded stack{}.",
            crate::units::percent(h.bytes, d.allocated_bytes),
            bytes(h.bytes),
            if unrecorded { " (made before recording began, or by the backward under stacks=\"python\")" } else { "" }
        )),
        Some(h) => first.push_str(&format!(
            "; {} of what was allocated was {}{} ({}){}.",
            crate::units::percent(h.bytes, d.allocated_bytes),
            category_words(h.category, &h.stack),
            h.module.as_ref().map_or(String::new(), |m| format!(
                " of `{m}`{}",
                h.phase.map_or(String::new(), |p| format!(" in the {p}"))
            )),
            bytes(h.bytes),
            match (h.stack == NO_STACK, h.reason) {
                // No line to show: what the inference went by is the evidence.
                (true, Some(r)) => format!(", inferred: {}", r.words()),
                (true, None) => String::new(),
                (false, _) => format!(" from {}", h.stack),
            }
        )),
        None if d.unmatched => {
            first.push_str(&format!(
                "; {}no snapshot given is of GPU {}, so what held it is not known.",
                d.oom
                    .as_ref()
                    .and_then(|o| o.message.as_ref())
                    .map_or(String::new(), |m| format!("said by {}:{}, and ", m.source, m.line)),
                d.device
            ));
        }
        None if d.source == ReportSource::Text && d.oom.is_some() => {
            first.push_str("; without a snapshot, what held it is not known.");
        }
        None => first.push('.'),
    }
    first.push_str(&likely_words);
    let second = match primary {
        // Another GPU ran out: this one's findings are not the cause of that OOM.
        Some(f) if other_ran_out.is_some() => format!(
            "It did not run out of memory; GPU {} did. Found here: {} [{}]{}.",
            other_ran_out.expect("matched"),
            lowercase_first(&f.title),
            f.rule,
            f.bytes.map_or(String::new(), |b| format!(", explaining {}", bytes(b)))
        ),
        Some(f) => format!(
            "Primary cause: {} [{}]{}.",
            lowercase_first(&f.title),
            f.rule,
            f.bytes.map_or(String::new(), |b| format!(", explaining {}", bytes(b)))
        ),
        None => match &holder {
            None => decided_by.map_or(String::new(), |dec| decider_words(dec, d, arithmetic.as_ref())),
            Some(_) if other_ran_out.is_some() => {
                format!("It did not run out of memory; GPU {} did.", other_ran_out.expect("matched"))
            }
            Some(_) if message_only => {
                decided_by.map_or(String::new(), |dec| decider_words(dec, d, arithmetic.as_ref()))
            }
            Some(_) if unrecorded => "No checklist item names a cause beyond that.".to_string(),
            Some(h) => {
                // Found but sized nothing (churn, a missing no_sync): said, so the sentence does not deny what the
                // causes list shows.
                let sizeless: Vec<&str> = causes
                    .iter()
                    .filter(|c| c.severity >= Severity::Warning && c.bytes.is_none())
                    .map(|c| c.rule.as_str())
                    .collect();
                let beyond = if sizeless.is_empty() {
                    "No checklist item names a cause beyond that".to_string()
                } else {
                    format!(
                        "No checklist item explains the memory beyond that ({} found, explaining none of it)",
                        sizeless.join(", ")
                    )
                };
                format!(
                    "{beyond}; for {}: {}.",
                    category_words(h.category, &h.stack),
                    remedies(h.category).first().copied().unwrap_or("")
                )
            }
        },
    };
    let summary = if second.is_empty() { first } else { format!("{first} {second}") };
    let mut remedies: Vec<String> = match (primary, &holder) {
        (None, Some(_)) if unrecorded => Vec::new(),
        (None, Some(h)) if other_ran_out.is_none() => remedies(h.category).iter().map(|s| s.to_string()).collect(),
        _ => Vec::new(),
    };
    if primary.is_none() {
        if decided_by == Some(Decider::Cap) {
            remedies.push(
                "if the cap was not meant, raise or remove it (torch.cuda.set_per_process_memory_fraction in your \
                 code or a library's, a serving engine's gpu_memory_utilization)"
                    .into(),
            );
        }
        remedies.extend(likely.as_ref().map(|l| l.remedy.to_string()));
    }
    Verdict {
        summary,
        primary_rule: primary.map(|f| f.rule.clone()),
        holder,
        explained_bytes: primary.and_then(|f| f.bytes),
        causes,
        arithmetic,
        remedies,
        decided_by,
        likely,
        proven: Vec::new(),
        capture_advice: capture_advice.map(str::to_string),
    }
}

/// What the allocator model says of the standard remedies at this OOM, for the verdict: the lines that prove or
/// refute them on the user's own trace, and the primary finding's fix where the simulation refutes it.
fn proofs(d: &DeviceReport, primary: Option<&Finding>) -> (Vec<String>, Option<String>) {
    use super::whatif::Knob;
    if d.whatif.is_empty() || d.oom.is_none() {
        return (Vec::new(), None);
    }
    let find = |k: &dyn Fn(Knob) -> bool| d.whatif.iter().find(|w| w.knob.is_some_and(k));
    let approx = if d.whatif[0].exact { "" } else { " (approximately: the trace starts mid-run)" };
    let outcome = |w: &super::whatif::WhatIf| match (w.fits, w.headroom_bytes) {
        (Some(true), Some(h)) => format!(
            "it peaks at {} reserved, {} under the {} it could use",
            bytes(w.peak_reserved_bytes),
            bytes(h.max(0) as u64),
            bytes((w.peak_reserved_bytes as i64 + h).max(0) as u64)
        ),
        _ => match w.first_failure {
            Some((_, size)) => format!("a {} request still finds no room", bytes(size)),
            None => "it still runs out".into(),
        },
    };
    let fits = |w: &super::whatif::WhatIf| w.fits == Some(true);
    let refuted = |w: &super::whatif::WhatIf| w.fits == Some(false);
    // A change that fits, said as a proof where the trace holds a whole pass of the loop before the OOM; where it
    // ends inside the first one, only the recorded part is proven (refutations stand either way: what does not fit
    // the part recorded cannot fit the whole).
    let proven = |change: String, w: &super::whatif::WhatIf, avoided: &str| {
        if w.recorded_part_only {
            format!(
                "avoids this OOM{approx}, not proven for the run: with {change} the part recorded fits ({}); the \
                 trace ends inside the first pass of the loop it holds, and what the run does after the failing \
                 request was never recorded",
                outcome(w)
            )
        } else {
            format!("proven on this trace{approx}: with {change} {}{avoided}", outcome(w))
        }
    };
    // Where the cap is not in the files, a change that fits only under a larger cap is neither proven nor refuted.
    let undecided = |w: &super::whatif::WhatIf| {
        w.undecided_above.map(|l| {
            format!(
                "undecided on this trace: with {} it fits only if the process may hold more than {} (its cap is not \
                 in the files: the OOM message or --memory-cap gives it)",
                w.change,
                bytes(l)
            )
        })
    };
    let rule = primary.map(|f| f.rule.as_str());
    let mut lines = Vec::new();
    let mut fix = None;
    let expandable = find(&|k| k == Knob::ExpandableSegments);
    let split = find(&|k| matches!(k, Knob::MaxSplitSize(_)));
    let grows = matches!(rule, Some("leaked-references" | "unbounded-kv-growth" | "growing-buffer"));
    if grows {
        if let Some(w) = find(&|k| k == Knob::NoLeak).filter(|w| fits(w)) {
            lines.push(if w.recorded_part_only {
                proven("the allocations that accumulate left out".into(), w, "")
            } else {
                format!(
                    "proven on this trace{approx}: without the allocations that accumulate, {} — fixing the leak \
                     avoids this OOM",
                    outcome(w)
                )
            });
        }
        let per = d.facts.number("leak.growth_per_interval_bytes");
        let iterations = d.facts.number("leak.intervals");
        let per_iteration =
            matches!(d.facts.get("leak.per_iteration").map(|f| &f.value), Some(super::facts::Val::Bool(true)));
        if let Some(w) = d.whatif.iter().rfind(|w| matches!(w.knob, Some(Knob::Scale(_, _)))) {
            let Some(Knob::Scale(c, f)) = w.knob else { unreachable!() };
            lines.push(match (fits(w), per) {
                (true, Some(per)) if rule == Some("leaked-references") => format!(
                    "refuted as the fix{approx}: with {} ×{f} (a smaller batch) the {} recorded fit, but what \
                     accumulates still grows by about {} per {} — it runs out later, not never",
                    category_words(c, ""),
                    match (iterations, per_iteration) {
                        (Some(n), true) => format!("{n:.0} iterations"),
                        (Some(n), false) => format!("{n:.0} intervals"),
                        (None, _) => "iterations".into(),
                    },
                    bytes((per * f) as u64),
                    if per_iteration { "iteration" } else { "interval" }
                ),
                (true, _) => format!(
                    "refuted as the fix{approx}: with {} ×{f} the recorded run fits ({}), but what grows keeps \
                     growing — it runs out later, not never",
                    category_words(c, ""),
                    outcome(w)
                ),
                (false, _) if refuted(w) => format!(
                    "refuted on this trace{approx}: with {} ×{f} (a smaller batch) {}",
                    category_words(c, ""),
                    outcome(w)
                ),
                (false, _) => undecided(w).unwrap_or_default(),
            });
            lines.retain(|l| !l.is_empty());
        }
        // The setting the OOM message itself suggests: where it fits the recorded run, it only buys room for more
        // growth.
        if let Some(w) = expandable.filter(|w| fits(w)) {
            lines.push(format!(
                "refuted as the fix{approx}: with expandable_segments:True the recorded run fits ({}), but what grows \
                 keeps growing — it runs out later, not never",
                outcome(w)
            ));
        }
        return (lines, None);
    }
    let fragmented = rule == Some("fragmentation")
        || message_decider(d) == Some(Decider::Fragmentation)
        || primary.is_none()
            && d.reserved_unallocated_bytes > d.oom.as_ref().and_then(|o| o.requested_bytes).unwrap_or(u64::MAX);
    if let Some(w) = expandable {
        if fits(w) {
            lines.push(proven("expandable_segments:True".into(), w, " — it would have avoided this OOM"));
        } else if let Some(line) = undecided(w) {
            lines.push(line);
        } else if fragmented {
            let alt = split.filter(|s| fits(s));
            lines.push(format!("refuted on this trace{approx}: with expandable_segments:True {}", outcome(w)));
            if let Some(s) = alt {
                lines.push(proven(s.change.clone(), s, ""));
            }
            if rule == Some("fragmentation") {
                // The backend's own variable (PYTORCH_HIP_ALLOC_CONF on ROCm, …).
                let var = match d.facts.get("alloc_conf_var").map(|f| &f.value) {
                    Some(super::facts::Val::Str(v)) if !v.is_empty() => v.as_str(),
                    _ => "PYTORCH_CUDA_ALLOC_CONF",
                };
                // Where only the part recorded is shown to fit, the rule's own fix stands beside the lines above.
                fix = alt.filter(|s| s.recorded_part_only).is_none().then(|| match alt {
                    Some(s) => format!(
                        "Set {var}={}: replayed on this trace it avoids the OOM ({}). Expandable segments do not: \
                         replayed with them, {}.",
                        s.change,
                        outcome(s),
                        outcome(w)
                    ),
                    None => format!(
                        "Replayed on this trace, neither expandable segments nor max_split_size_mb avoid this OOM \
                         ({} with expandable_segments:True): free memory instead — what fills the GPU is listed \
                         above.",
                        outcome(w)
                    ),
                });
            }
        } else if let Some(s) = split.filter(|s| fits(s)) {
            lines.push(proven(s.change.clone(), s, ""));
        }
    }
    let scaled: Vec<&super::whatif::WhatIf> =
        d.whatif.iter().filter(|w| matches!(w.knob, Some(Knob::Scale(_, _)))).collect();
    if let Some(w) = scaled.iter().find(|w| fits(w)) {
        let Some(Knob::Scale(c, f)) = w.knob else { unreachable!() };
        lines.push(proven(
            format!(
                "{} ×{f} ({})",
                category_words(c, ""),
                if c == "kv_cache" { "a smaller cache or batch" } else { "a smaller batch" }
            ),
            w,
            "",
        ));
    } else if let Some(w) = scaled.last() {
        let Some(Knob::Scale(c, f)) = w.knob else { unreachable!() };
        match undecided(w) {
            Some(line) => lines.push(line),
            None => {
                lines.push(format!("refuted on this trace{approx}: with {} ×{f} {}", category_words(c, ""), outcome(w)))
            }
        }
    }
    if let Some(w) = find(&|k| k == Knob::EightBitOptimizer) {
        if let Some(line) = undecided(w) {
            lines.push(line);
            return (lines, fix);
        }
        let change = "an 8-bit optimizer (its state at a quarter)".to_string();
        lines.push(if fits(w) {
            proven(change, w, "")
        } else {
            format!("refuted on this trace{approx}: with {change} {}", outcome(w))
        });
    }
    (lines, fix)
}

/// Up to this much outside PyTorch is the CUDA context, its libraries and the driver by themselves (0.7–1.4 GiB
/// measured on H100 and H200 GPUs; rules/nccl-overhead.toml): nothing to hunt, so not what decided an OOM.
const CONTEXT_ONLY: f64 = 1.5 * (1u64 << 30) as f64;

/// Whether the device's data says nothing of what held its memory: none was given, or a state-only dump whose sizes
/// named none of it (no history, no stack, no inference). Its OOM message is then all there is.
fn names_nothing(d: &DeviceReport) -> bool {
    d.holder.as_ref().is_none_or(|h| unrecorded(d) && d.by_category.iter().all(|c| c.category == h.category))
}

/// Whether the device is a dump without a trace whose largest share has no stack and no inference behind it.
fn unrecorded(d: &DeviceReport) -> bool {
    d.holder.as_ref().is_some_and(|h| d.trace.entries == 0 && h.stack == NO_STACK && h.source.is_none())
}

/// Which of an OOM message's figures decided it, where the message is all there is (no allocator data).
fn message_decider(d: &DeviceReport) -> Option<Decider> {
    let o = d.oom.as_ref().filter(|_| names_nothing(d))?;
    let fact = |name: &str| d.facts.get(name).map(|f| &f.value);
    let num = |name: &str| match fact(name) {
        Some(super::facts::Val::Num(n)) if *n >= 0.0 => Some(*n as u64),
        _ => None,
    };
    let outside_decided = matches!(fact("oom.outside_decided"), Some(super::facts::Val::Bool(true)))
        && num("nonpytorch_bytes").is_some_and(|b| b as f64 > CONTEXT_ONLY);
    raising_line::decided_by(&Figures {
        requested: o.requested_bytes,
        device_free: o.device_free_bytes,
        capacity: num("gpu.total_bytes"),
        allowed: num("oom.allowed_bytes"),
        reserved_unallocated: Some(d.reserved_unallocated_bytes).filter(|_| d.reserved_bytes > 0),
        outside_decided,
    })
}

/// The sentence that names what decided an OOM when only its message is known and no rule named a cause.
fn decider_words(dec: Decider, d: &DeviceReport, a: Option<&Arithmetic>) -> String {
    let figure = |v: Option<u64>| v.map_or("?".to_string(), bytes);
    let req = figure(a.and_then(|a| a.requested_bytes));
    match dec {
        Decider::Cap => format!(
            "The process's cap decided it: PyTorch had reserved {} of the {} it was allowed and asked for {req} \
             more, with {} still free on the GPU.",
            bytes(d.reserved_bytes),
            figure(a.and_then(|a| a.allowed_bytes)),
            figure(a.and_then(|a| a.device_free_bytes)),
        ),
        Decider::Fragmentation => format!(
            "The cache's fragments decided it: {} was reserved but unallocated, more than the {req} asked for, in \
             pieces too small.",
            bytes(d.reserved_unallocated_bytes)
        ),
        Decider::OutsidePytorch => format!(
            "Memory outside PyTorch decided it: PyTorch's {} and the {req} asked for fit the GPU, but the driver had \
             less than that free.",
            bytes(d.reserved_bytes)
        ),
        Decider::Shortage => format!(
            "Plain shortage: PyTorch's own tensors held {}{}, and the {req} asked for did not fit beside them.",
            bytes(d.allocated_bytes),
            a.and_then(|a| a.allowed_bytes.or(a.capacity_bytes))
                .map_or(String::new(), |l| format!(" of the {} it could use", bytes(l)))
        ),
    }
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        // Keep acronyms and names (NCCL, KV) as they are.
        Some(f) if c.clone().next().is_some_and(|n| n.is_lowercase()) => f.to_lowercase().chain(c).collect(),
        _ => s.to_string(),
    }
}

/// A category in words.
pub fn category_words(category: &str, stack: &str) -> &'static str {
    match category {
        "parameter" => "parameters",
        "gradient" => "gradients",
        "optimizer_state" => "optimizer state",
        "activation" => "activations",
        "temporary" => "temporaries",
        "kv_cache" => "KV cache",
        "communication" => "communication buffers",
        "compile" => "torch.compile buffers",
        "user_tensor" => "tensors your code made outside the model",
        _ if stack == NO_STACK => "allocations with no recorded stack",
        _ => "allocations of no known kind",
    }
}

/// What usually helps when this category holds the memory, most effective first.
pub fn remedies(category: &str) -> &'static [&'static str] {
    match category {
        "activation" => &[
            "a smaller micro-batch (with gradient accumulation to keep the effective batch), activation checkpointing \
             (torch.utils.checkpoint), and torch.no_grad() or torch.inference_mode() in evaluation",
            "FlashAttention / scaled_dot_product_attention instead of a materialised softmax(QKᵀ) at long sequences",
            "bf16 activations (torch.autocast) instead of fp32",
        ],
        "parameter" => &[
            "load the weights in 16 bits (torch_dtype=torch.bfloat16) and keep no second copy (EMA, reference model) \
             on the GPU",
            "shard them (FSDP / ZeRO-3) or split the model over GPUs (tensor or pipeline parallel)",
            "for inference, 8-bit or 4-bit weights (bitsandbytes, AWQ, GPTQ)",
        ],
        "gradient" => &[
            "shard them (ZeRO-2 / FSDP) and zero_grad(set_to_none=True)",
            "gradient_as_bucket_view=True on DDP (no second copy in the buckets)",
            "LoRA adapters instead of full fine-tuning",
        ],
        "optimizer_state" => &[
            "an 8-bit optimizer (bitsandbytes AdamW8bit: 2 bytes per parameter instead of 8)",
            "shard the state (ZeRO-1/2, FSDP) or offload it to the CPU",
            "Adafactor, or SGD with momentum",
        ],
        "kv_cache" => &[
            "cap max_model_len / max_new_tokens and the number of concurrent sequences",
            "a static or paged cache sized at start-up (transformers cache_implementation=\"static\", vLLM)",
            "an FP8 KV cache, or fewer KV heads (GQA)",
        ],
        "communication" => &[
            "smaller NCCL buffers (NCCL_BUFFSIZE) and DDP buckets (bucket_cap_mb), gradient_as_bucket_view=True",
            "fewer process groups (each has its own communicator buffers)",
        ],
        "user_tensor" => &[
            "keep numbers, not tensors, across steps: loss.item(), metrics as Python floats, and outputs kept with \
             .detach().cpu(); clear or bound any list that collects tensors",
            "move inputs to the GPU one batch at a time, and drop references (del) to what the step no longer needs",
        ],
        "compile" => &[
            "warm up with smaller shapes, mark dynamic dimensions (torch._dynamo.mark_dynamic) to avoid recompiles",
            "mode=\"max-autotune-no-cudagraphs\" if CUDA-graph pools are the cost",
        ],
        "temporary" => &["free intermediates sooner (del), process in chunks, avoid needless .clone() / .contiguous()"],
        _ => &["record stacks to see who allocated it: torch.cuda.memory._record_memory_history(context=\"all\", \
             stacks=\"python\")"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(rule: &str, severity: Severity, gib: u64) -> Finding {
        Finding {
            rule: rule.into(),
            severity,
            device: Some(0),
            bytes: Some(gib << 30),
            title: String::new(),
            message: String::new(),
            evidence: serde_json::Value::Null,
            fix: String::new(),
            references: Vec::new(),
        }
    }

    #[test]
    fn the_last_straw_yields_to_what_filled_the_memory() {
        let yields = |id: &str| {
            if id == "fragmentation" {
                vec!["leaked-references".to_string()]
            } else {
                Vec::new()
            }
        };
        // More cached free bytes than the leak grew by: bytes alone would make fragmentation primary.
        let mut frag = finding("fragmentation", Severity::Error, 3);
        let mut leak = finding("leaked-references", Severity::Error, 2);
        assert_eq!(primary(&[&mut frag, &mut leak], &yields, 20 << 30, true), Some(1));
        assert_eq!(primary(&[&mut frag, &mut leak], &|_| Vec::new(), 20 << 30, true), Some(0));
        // A leak that accounts for less than a tenth of the memory does not: fragmentation leads.
        let mut small = finding("leaked-references", Severity::Warning, 1);
        assert_eq!(primary(&[&mut frag, &mut small], &yields, 20 << 30, true), Some(0));
    }
}
