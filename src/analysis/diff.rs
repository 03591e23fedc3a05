//! Two runs of a program compared: did the change make memory worse, and where? Built from the two reports alone,
//! in their JSON form (schema_version 1) — an analysis made here, or a report written earlier and kept, e.g. the
//! main branch's in CI: the peak and the moment each describes, bytes by category and by allocating stack,
//! fragmentation, findings resolved and new, allocator settings changed.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

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

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn devices(report: &Value) -> &[Value] {
    report.get("devices").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

use crate::ingest::oomdoc_report::peaks;

/// The moment as the reports' text says it: "the OOM (event 120, 1.6 ms into the trace)".
fn moment(d: &Value) -> String {
    let words = match d.get("moment").and_then(Value::as_str) {
        Some("oom") => "OOM",
        Some("peak") => "peak",
        Some("end") => "end of the capture",
        _ => "requested moment",
    };
    let event = d.get("event_index").and_then(Value::as_u64);
    let t = d.get("time_us").and_then(Value::as_i64);
    let t0 = d.get("trace").and_then(|t| t.get("first_time_us")).and_then(Value::as_i64);
    let at = match (event, t.zip(t0)) {
        (Some(e), Some((t, t0))) => format!(" (event {e}, {} into the trace)", crate::units::duration_us(t - t0)),
        (Some(e), None) => format!(" (event {e})"),
        (None, _) => String::new(),
    };
    format!("the {words}{at}")
}

fn side(report: &Value) -> Side {
    let top = devices(report).iter().max_by_key(|d| peaks(d).0);
    let (peak_alloc, peak_res) = top.map_or((0, 0), peaks);
    let inputs = report.get("inputs").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    let input = inputs
        .iter()
        .find(|i| i["kind"] == "pytorch_snapshot")
        .or(inputs.first())
        .and_then(|i| i["path"].as_str())
        .unwrap_or("")
        .to_string();
    let oom_of = |d: &Value| d.get("oom").filter(|o| !o.is_null()).cloned();
    Side {
        input,
        peak_allocated_bytes: peak_alloc,
        peak_reserved_bytes: peak_res,
        moment: top.map_or("nothing recorded".into(), moment),
        oom: devices(report).iter().any(|d| oom_of(d).is_some()),
        oom_requested_bytes: top.and_then(oom_of).and_then(|o| o.get("requested_bytes").and_then(Value::as_u64)),
    }
}

/// The bytes of each allocating stack at the moment, by the lines that tell it apart.
fn stacks(d: &Value) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for s in d.get("by_stack").and_then(Value::as_array).into_iter().flatten() {
        let callers = s["callers"].as_str().unwrap_or("");
        let name = if callers.is_empty() { s["culprit"].as_str().unwrap_or("?") } else { callers };
        *m.entry(name.to_string()).or_insert(0) += u(s, "bytes");
    }
    m
}

fn categories(d: Option<&Value>) -> BTreeMap<String, u64> {
    d.and_then(|d| d.get("by_category"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| (c["category"].as_str().unwrap_or("?").to_string(), u(c, "bytes")))
        .collect()
}

/// Two reports in their JSON form (`serde_json::to_value` of an analysis, or a report read back).
pub fn of(before: &Value, after: &Value) -> Diff {
    let (b, a) = (side(before), side(after));
    let mut deltas = vec![
        delta("peak allocated".into(), "peak", b.peak_allocated_bytes, a.peak_allocated_bytes),
        delta("peak reserved".into(), "peak", b.peak_reserved_bytes, a.peak_reserved_bytes),
    ];
    let ids = |r: &Value| devices(r).iter().filter_map(|d| d["device"].as_i64()).collect::<Vec<_>>();
    let all: std::collections::BTreeSet<i64> = ids(before).into_iter().chain(ids(after)).collect();
    let several = all.len() > 1;
    for dev in all {
        let gpu = if several { format!("GPU {dev}: ") } else { String::new() };
        let find = |r: &'_ Value| devices(r).iter().find(|d| d["device"].as_i64() == Some(dev)).cloned();
        let (db, da) = (find(before), find(after));
        let get = |d: &Option<Value>, k: &str| d.as_ref().map_or(0, |d| u(d, k));
        for (what, kind, key) in [
            ("allocated at the moment", "moment", "allocated_bytes"),
            ("reserved at the moment", "moment", "reserved_bytes"),
            ("cached free (reserved but not allocated)", "free", "reserved_unallocated_bytes"),
            ("largest free block", "free", "largest_free_block_bytes"),
        ] {
            deltas.push(delta(format!("{gpu}{what}"), kind, get(&db, key), get(&da, key)));
        }
        let (cb, ca) = (categories(db.as_ref()), categories(da.as_ref()));
        let mut by_cat: Vec<Delta> = cb
            .keys()
            .chain(ca.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|c| delta(format!("{gpu}kind: {c}"), "category", *cb.get(c).unwrap_or(&0), *ca.get(c).unwrap_or(&0)))
            .collect();
        by_cat.sort_by_key(|d| std::cmp::Reverse(d.after_bytes.abs_diff(d.before_bytes)));
        deltas.extend(by_cat);
        let (sb, sa) = (db.as_ref().map(stacks).unwrap_or_default(), da.as_ref().map(stacks).unwrap_or_default());
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
    let rules = |r: &Value| {
        r.get("findings")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| f["rule"].as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let (rb, ra) = (rules(before), rules(after));
    let settings = |r: &Value| -> BTreeMap<String, String> {
        r.get("allocator_settings")
            .and_then(|s| s.get("raw"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|kv| Some((kv.get(0)?.as_str()?.to_string(), kv.get(1)?.as_str()?.to_string())))
            .collect()
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
