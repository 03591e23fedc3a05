//! oomdoc's own JSON report (`analyze --format json`, schema_version 1) read back as ranks for a job view: the
//! reduce step over reports made where each rank's files are.

use serde_json::Value;

use super::ReadError;
use crate::timeline::reported::{ReportedDevice, ReportedFinding, ReportedRank};

/// Whether the text is an oomdoc JSON report: an object with a `schema_version` and `"tool": "oomdoc"`, in any
/// key order and spacing.
pub fn sniff(text: &str) -> bool {
    let t = text.trim_start();
    let tool_is_oomdoc = t.find("\"tool\"").is_some_and(|i| {
        let rest = t[i + 6..].trim_start();
        rest.strip_prefix(':').is_some_and(|r| r.trim_start().starts_with("\"oomdoc\""))
    });
    t.starts_with('{') && t.contains("\"schema_version\"") && tool_is_oomdoc
}

fn unexpected(what: &str) -> ReadError {
    ReadError::Unrecognised(format!("an oomdoc JSON report without {what} (expected schema_version 1)"))
}

/// The rank of one per-rank report (a job's report, several ranks in one, is refused: its ranks' detail is gone).
pub fn parse(text: &str, name: &str) -> Result<Vec<ReportedRank>, ReadError> {
    let v: Value = serde_json::from_str(text).map_err(|e| {
        ReadError::Unrecognised(format!("line {}, column {}: not valid JSON: {e}", e.line(), e.column()))
    })?;
    match v.get("schema_version").and_then(Value::as_u64) {
        Some(1) => {}
        Some(n) => {
            return Err(ReadError::Unrecognised(format!(
                "an oomdoc JSON report of schema_version {n}; this oomdoc reads schema_version 1"
            )))
        }
        None => return Err(unexpected("schema_version")),
    }
    if v.get("job").is_some() {
        return Err(ReadError::Unrecognised(
            "a job's report (several ranks in one): give the per-rank reports instead".into(),
        ));
    }
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let input = v
        .get("inputs")
        .and_then(Value::as_array)
        .and_then(|inputs| {
            inputs.iter().find(|i| i["kind"] == "pytorch_snapshot").or(inputs.first()).and_then(|i| str_of(i, "path"))
        })
        .unwrap_or_else(|| name.to_string());
    let devices = v.get("devices").and_then(Value::as_array).ok_or_else(|| unexpected("devices"))?;
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let devices = devices
        .iter()
        .map(|d| {
            let (peak_allocated_bytes, peak_reserved_bytes) = peaks(d);
            let verdict = d.get("verdict").filter(|p| !p.is_null());
            let holder = verdict.and_then(|v| v.get("holder")).filter(|h| !h.is_null());
            ReportedDevice {
                device: d.get("device").and_then(Value::as_i64).unwrap_or(0),
                allocated_bytes: u(d, "allocated_bytes"),
                peak_allocated_bytes,
                peak_reserved_bytes,
                oom: d.get("oom").is_some_and(|o| !o.is_null()),
                oom_time_us: d.get("oom").and_then(|o| o.get("time_us")).and_then(Value::as_i64),
                primary_rule: verdict.and_then(|v| str_of(v, "primary_rule")),
                holder: holder.map(|h| {
                    (str_of(h, "category").unwrap_or_default(), str_of(h, "stack").unwrap_or_default(), u(h, "bytes"))
                }),
                by_category: d
                    .get("by_category")
                    .and_then(Value::as_array)
                    .map(|cs| cs.iter().map(|c| (str_of(c, "category").unwrap_or_default(), u(c, "bytes"))).collect())
                    .unwrap_or_default(),
                unmatched: d.get("unmatched").and_then(Value::as_bool).unwrap_or(false).then(|| {
                    let m = &d["oom"]["message"];
                    let at = format!("{}:{}", str_of(m, "source").unwrap_or_default(), u(m, "line"));
                    (at, m.get("rank").and_then(Value::as_u64).and_then(|r| u32::try_from(r).ok()))
                }),
            }
        })
        .collect();
    let findings = v
        .get("findings")
        .and_then(Value::as_array)
        .map(|fs| {
            fs.iter()
                .map(|f| ReportedFinding {
                    rule: str_of(f, "rule").unwrap_or_default(),
                    severity: f
                        .get("severity")
                        .and_then(Value::as_str)
                        .and_then(crate::timeline::Severity::parse)
                        .unwrap_or(crate::timeline::Severity::Info),
                    title: str_of(f, "title").unwrap_or_default(),
                    device: f.get("device").and_then(Value::as_i64),
                    bytes: f.get("bytes").and_then(Value::as_u64),
                    line: finding_line(&f["evidence"]),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(vec![ReportedRank { input, devices, findings }])
}

/// A report device's peak allocated and reserved bytes (its `peak`, or the moment's figures when higher or when
/// there was no trace).
pub fn peaks(d: &Value) -> (u64, u64) {
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let p = d.get("peak").filter(|p| !p.is_null());
    let (a, r) = p.map_or((0, 0), |p| (u(p, "allocated_bytes"), u(p, "reserved_bytes")));
    (a.max(u(d, "allocated_bytes")), r.max(u(d, "reserved_bytes")))
}

/// The line a finding points at: the `caller` or `where` of a subject in its evidence (`leak.caller` beside
/// `leak.stacks`).
pub fn finding_line(evidence: &Value) -> Option<String> {
    let ev = evidence.as_object()?;
    let pick = |suffix: &str| {
        ev.iter().find_map(|(k, v)| {
            if k.ends_with(suffix) {
                v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
            } else {
                None
            }
        })
    };
    pick(".caller").or_else(|| pick(".where"))
}
