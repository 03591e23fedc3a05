//! Two runs of a program compared: did the change make memory worse, and where? Built from the two analyses
//! alone: the peak and the moment each report describes, bytes by category and by allocating stack, fragmentation,
//! findings resolved and new, allocator settings changed.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Analysis, DeviceReport};

/// Stacks listed: the largest changes.
const STACKS_SHOWN: usize = 10;

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub before: Side,
    pub after: Side,
    /// Every change in bytes, biggest first within each kind (`peak`, `moment`, `category`, `stack`, `free`).
    pub deltas: Vec<Delta>,
    /// Rules that fired before and not after.
    pub findings_resolved: Vec<String>,
    /// Rules that fire after and did not before.
    pub findings_new: Vec<String>,
    /// `setting: before → after`.
    pub settings_changed: Vec<String>,
    /// The change of the highest peak allocated, in percent of the before's (null when before was 0).
    pub peak_growth_pct: Option<f64>,
}

/// One run, in brief.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub input: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// "the OOM at event 9359 (4.26 s into the trace)", or the peak.
    pub moment: String,
    pub oom: bool,
    pub oom_requested_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Delta {
    /// `peak allocated`, `GPU 1: category activation`, `stack train.py:30 in forward ← …`.
    pub what: String,
    pub kind: &'static str,
    pub before_bytes: u64,
    pub after_bytes: u64,
    /// appeared, gone, grew, shrank, same.
    pub change: &'static str,
}

fn change(before: u64, after: u64) -> &'static str {
    match (before, after) {
        (0, a) if a > 0 => "appeared",
        (b, 0) if b > 0 => "gone",
        (b, a) if a > b => "grew",
        (b, a) if a < b => "shrank",
        _ => "same",
    }
}

fn delta(what: String, kind: &'static str, before: u64, after: u64) -> Delta {
    Delta { what, kind, before_bytes: before, after_bytes: after, change: change(before, after) }
}

fn peaks(d: &DeviceReport) -> (u64, u64) {
    let (a, r) =
        d.peak.as_ref().map_or((d.allocated_bytes, d.reserved_bytes), |p| (p.allocated_bytes, p.reserved_bytes));
    (a.max(d.allocated_bytes), r.max(d.reserved_bytes))
}

fn side(a: &Analysis) -> Side {
    let top = a.devices.iter().max_by_key(|d| peaks(d).0);
    let (peak_alloc, peak_res) = top.map_or((0, 0), peaks);
    let input = a
        .inputs
        .iter()
        .find(|i| i.kind == "pytorch_snapshot")
        .or(a.inputs.first())
        .map_or(String::new(), |i| i.path.clone());
    Side {
        input,
        peak_allocated_bytes: peak_alloc,
        peak_reserved_bytes: peak_res,
        moment: top.map_or("nothing recorded".into(), |d| {
            let at = match (d.event_index, d.time_us.zip(d.trace.first_time_us)) {
                (Some(e), Some((t, t0))) => {
                    format!(" (event {e}, {} into the trace)", crate::units::duration_us(t - t0))
                }
                (Some(e), None) => format!(" (event {e})"),
                (None, _) => String::new(),
            };
            format!("the {}{at}", d.moment.words())
        }),
        oom: a.devices.iter().any(|d| d.oom.is_some()),
        oom_requested_bytes: top.and_then(|d| d.oom.as_ref()).and_then(|o| o.requested_bytes),
    }
}

/// The bytes of each allocating stack at the moment, by the lines that tell it apart.
fn stacks(d: &DeviceReport) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for s in &d.by_stack {
        let name = if s.callers.is_empty() { s.culprit.clone() } else { s.callers.clone() };
        *m.entry(name).or_insert(0) += s.bytes;
    }
    m
}

pub fn of(before: &Analysis, after: &Analysis) -> Diff {
    let (b, a) = (side(before), side(after));
    let mut deltas = vec![
        delta("peak allocated".into(), "peak", b.peak_allocated_bytes, a.peak_allocated_bytes),
        delta("peak reserved".into(), "peak", b.peak_reserved_bytes, a.peak_reserved_bytes),
    ];
    let devices: std::collections::BTreeSet<i64> =
        before.devices.iter().chain(&after.devices).map(|d| d.device).collect();
    let several = devices.len() > 1;
    for dev in devices {
        let gpu = if several { format!("GPU {dev}: ") } else { String::new() };
        let (db, da) =
            (before.devices.iter().find(|d| d.device == dev), after.devices.iter().find(|d| d.device == dev));
        let get = |d: Option<&DeviceReport>, f: fn(&DeviceReport) -> u64| d.map_or(0, f);
        deltas.push(delta(
            format!("{gpu}allocated at the moment"),
            "moment",
            get(db, |d| d.allocated_bytes),
            get(da, |d| d.allocated_bytes),
        ));
        deltas.push(delta(
            format!("{gpu}reserved at the moment"),
            "moment",
            get(db, |d| d.reserved_bytes),
            get(da, |d| d.reserved_bytes),
        ));
        deltas.push(delta(
            format!("{gpu}cached free (reserved but not allocated)"),
            "free",
            get(db, |d| d.reserved_unallocated_bytes),
            get(da, |d| d.reserved_unallocated_bytes),
        ));
        deltas.push(delta(
            format!("{gpu}largest free block"),
            "free",
            get(db, |d| d.largest_free_block_bytes),
            get(da, |d| d.largest_free_block_bytes),
        ));
        let cats = |d: Option<&DeviceReport>| -> BTreeMap<&'static str, u64> {
            d.map_or_else(BTreeMap::new, |d| d.by_category.iter().map(|c| (c.category, c.bytes)).collect())
        };
        let (cb, ca) = (cats(db), cats(da));
        let mut by_cat: Vec<Delta> = cb
            .keys()
            .chain(ca.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|c| delta(format!("{gpu}kind: {c}"), "category", *cb.get(c).unwrap_or(&0), *ca.get(c).unwrap_or(&0)))
            .collect();
        by_cat.sort_by_key(|d| std::cmp::Reverse(d.after_bytes.abs_diff(d.before_bytes)));
        deltas.extend(by_cat);
        let (sb, sa) = (db.map(stacks).unwrap_or_default(), da.map(stacks).unwrap_or_default());
        let mut by_stack: Vec<Delta> = sb
            .keys()
            .chain(sa.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|s| delta(format!("{gpu}stack: {s}"), "stack", *sb.get(s).unwrap_or(&0), *sa.get(s).unwrap_or(&0)))
            .filter(|d| d.change != "same")
            .collect();
        by_stack.sort_by_key(|d| std::cmp::Reverse(d.after_bytes.abs_diff(d.before_bytes)));
        by_stack.truncate(STACKS_SHOWN);
        deltas.extend(by_stack);
    }
    let rules = |a: &Analysis| a.findings.iter().map(|f| f.rule.clone()).collect::<std::collections::BTreeSet<_>>();
    let (rb, ra) = (rules(before), rules(after));
    let settings = |a: &Analysis| -> BTreeMap<String, String> {
        a.allocator_settings.as_ref().map_or_else(BTreeMap::new, |s| s.raw.iter().cloned().collect())
    };
    let (xb, xa) = (settings(before), settings(after));
    let settings_changed = xb
        .keys()
        .chain(xa.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| xb.get(*k) != xa.get(*k))
        .map(|k| {
            let v = |m: &BTreeMap<String, String>| m.get(k).cloned().unwrap_or_else(|| "(unset)".into());
            format!("{k}: {} → {}", v(&xb), v(&xa))
        })
        .collect();
    let peak_growth_pct = (b.peak_allocated_bytes > 0).then(|| {
        (a.peak_allocated_bytes as f64 - b.peak_allocated_bytes as f64) / b.peak_allocated_bytes as f64 * 100.0
    });
    Diff {
        findings_resolved: rb.difference(&ra).cloned().collect(),
        findings_new: ra.difference(&rb).cloned().collect(),
        settings_changed,
        peak_growth_pct,
        before: b,
        after: a,
        deltas,
    }
}
