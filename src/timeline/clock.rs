//! One clock for every input. A snapshot's trace is stamped in Unix µs (UTC); nvidia-smi and most loggers write
//! the host's local wall-clock time with no zone. To compare them, the wall-clock stamps need the zone offset
//! they were written in:
//!
//! - `--tz ±HH:MM` (or `UTC`) says it;
//! - otherwise, when a snapshot with timestamps is present, oomdoc tries every zone offset that exists (whole
//!   quarter-hours from UTC−12:00 to UTC+14:00) and keeps the one under which the most nvidia-smi samples (and
//!   log OOMs, against the trace's OOMs) fall inside the trace; among equals, the one under which nvidia-smi's
//!   `used` minus PyTorch's reserved bytes varies least, since memory outside PyTorch changes slowly while
//!   reserved memory moves with every cudaMalloc. Equal again: the offset nearest UTC.
//! - without a snapshot, the text artifacts are compared with each other on their own wall clock.
//!
//! `--clock-offset SECONDS` then shifts every text artifact (a host clock that was off).

use serde::Serialize;

use super::{Action, Stamp, Timeline};
use crate::units::duration_us;

/// What the user said about clocks.
#[derive(Clone, Debug, Default)]
pub struct ClockOptions {
    /// The zone offset the wall-clock stamps were written in, seconds east of UTC.
    pub tz_offset_s: Option<i64>,
    /// Added to every text artifact's time after the zone (µs).
    pub offset_us: i64,
}

/// How the inputs were put on one clock, for the report.
#[derive(Clone, Debug, Serialize)]
pub struct ClockReport {
    /// "tz" (given), "inferred" (the heuristic), "wall_clock" (no snapshot clock to align to), "absolute" (every
    /// stamp carried its zone) or "unaligned" (no offset makes the inputs overlap).
    pub method: &'static str,
    /// Zone offset applied to wall-clock stamps, seconds east of UTC.
    pub zone_offset_s: Option<i64>,
    /// `--clock-offset`, µs.
    pub extra_offset_us: i64,
    pub description: String,
}

/// Parses `--tz`: `UTC`, `Z`, `+02:00`, `-0530`, `+2`.
pub fn parse_tz(s: &str) -> Result<i64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("utc") || t.eq_ignore_ascii_case("z") || t.eq_ignore_ascii_case("gmt") {
        return Ok(0);
    }
    let t = t.strip_prefix("UTC").or_else(|| t.strip_prefix("utc")).unwrap_or(t);
    let bad = || format!("--tz {s:?}: expected UTC or an offset such as +02:00, -05:30, +0530 or -7");
    let (sign, rest) = match t.chars().next() {
        Some('+') => (1, &t[1..]),
        Some('-') => (-1, &t[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = match rest.split_once(':') {
        Some((h, m)) => (h, m),
        None if rest.len() == 4 => rest.split_at(2),
        None => (rest, "0"),
    };
    let (h, m): (i64, i64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 14 || m > 59 {
        return Err(bad());
    }
    Ok(sign * (h * 3600 + m * 60))
}

/// `+02:00`, `-05:30`, `UTC`.
pub fn format_tz(offset_s: i64) -> String {
    if offset_s == 0 {
        return "UTC".into();
    }
    let a = offset_s.abs();
    format!("UTC{}{:02}:{:02}", if offset_s < 0 { '-' } else { '+' }, a / 3600, a / 60 % 60)
}

/// Every zone offset in use on Earth is a whole quarter-hour between UTC−12:00 and UTC+14:00.
fn candidate_offsets() -> impl Iterator<Item = i64> {
    (-48..=56).map(|q| q * 15 * 60)
}

/// Per device: the trace's time span and its reserved bytes (up to a constant: an incomplete trace does not know
/// where it started) after each timestamped event, and the times of its OOM events.
struct TraceClock {
    device: i64,
    span: (i64, i64),
    reserved: Vec<(i64, i64)>,
    ooms: Vec<i64>,
}

fn trace_clocks(tl: &Timeline) -> Vec<TraceClock> {
    let mut out = Vec::new();
    for d in &tl.devices {
        let mut reserved = Vec::new();
        let mut ooms = Vec::new();
        let mut r: i64 = 0;
        for e in &d.events {
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => r += e.size as i64,
                Action::SegmentFree | Action::SegmentUnmap => r -= e.size as i64,
                _ => {}
            }
            if let Some(t) = e.time_us() {
                reserved.push((t, r));
                if e.action == Action::Oom {
                    ooms.push(t);
                }
            }
        }
        if let (Some(first), Some(last)) = (reserved.first(), reserved.last()) {
            out.push(TraceClock { device: d.device, span: (first.0, last.0), reserved, ooms });
        }
    }
    out
}

/// How well one zone offset fits: samples inside the trace, and the spread of used − reserved over them.
fn score(tl: &Timeline, traces: &[TraceClock], zone_s: i64, extra_us: i64) -> (usize, u64) {
    let mut inside = 0;
    let mut spread = 0u64;
    const SLACK_US: i64 = 1_000_000;
    for tc in traces {
        let Some(dev) = tl.device(tc.device) else { continue };
        let (mut lo, mut hi) = (i64::MAX, i64::MIN);
        for s in &dev.memory_samples {
            let Some(Stamp::Local(w)) = s.stamp else { continue };
            let t = w - zone_s * 1_000_000 + extra_us;
            if t < tc.span.0 - SLACK_US || t > tc.span.1 + SLACK_US {
                continue;
            }
            inside += 1;
            if let Some(used) = s.used {
                let i = tc.reserved.partition_point(|&(et, _)| et <= t);
                let r = if i == 0 { tc.reserved[0].1 } else { tc.reserved[i - 1].1 };
                let diff = used as i64 - r;
                lo = lo.min(diff);
                hi = hi.max(diff);
            }
        }
        if hi >= lo {
            spread += (hi - lo) as u64;
        }
        for o in tl.ooms.iter().filter(|o| o.device == Some(tc.device)) {
            let Some(Stamp::Local(w)) = o.stamp else { continue };
            let t = w - zone_s * 1_000_000 + extra_us;
            // Loggers stamp to the second at best, and the exception is logged after the failure.
            if tc.ooms.iter().any(|&ot| (t - ot).abs() <= 5_000_000) {
                inside += 1;
            }
        }
    }
    (inside, spread)
}

fn has_local(tl: &Timeline) -> bool {
    tl.devices.iter().flat_map(|d| &d.memory_samples).any(|s| matches!(s.stamp, Some(Stamp::Local(_))))
        || tl.ooms.iter().any(|o| matches!(o.stamp, Some(Stamp::Local(_))))
        || tl.serving.stats.iter().any(|s| matches!(s.stamp, Some(Stamp::Local(_))))
}

fn has_any_stamp(tl: &Timeline) -> bool {
    tl.devices.iter().flat_map(|d| &d.memory_samples).any(|s| s.stamp.is_some())
        || tl.ooms.iter().any(|o| o.stamp.is_some())
}

/// Puts every text artifact's stamp on the snapshot's clock (Unix µs), filling `time_us`, and records how.
pub fn align(tl: &mut Timeline, opts: &ClockOptions) {
    if !has_any_stamp(tl) {
        tl.clock = None;
        return;
    }
    let extra = opts.offset_us;
    let traces = trace_clocks(tl);
    let shift =
        if extra != 0 { format!(", then shifted by {} (--clock-offset)", duration_us(extra)) } else { String::new() };
    let report = if !has_local(tl) {
        ClockReport {
            method: "absolute",
            zone_offset_s: None,
            extra_offset_us: extra,
            description: format!("every text timestamp carried its zone{shift}"),
        }
    } else if let Some(z) = opts.tz_offset_s {
        ClockReport {
            method: "tz",
            zone_offset_s: Some(z),
            extra_offset_us: extra,
            description: format!("wall-clock times (nvidia-smi, logs) read as {} (--tz){shift}", format_tz(z)),
        }
    } else if traces.is_empty() {
        ClockReport {
            method: "wall_clock",
            zone_offset_s: None,
            extra_offset_us: extra,
            description: format!(
                "no snapshot timestamps to align to: nvidia-smi and log times are compared on the host's own wall \
                 clock{shift}"
            ),
        }
    } else {
        let mut best: Option<(i64, usize, u64)> = None;
        let mut fitting = 0;
        for z in candidate_offsets() {
            let (inside, spread) = score(tl, &traces, z, extra);
            if inside == 0 {
                continue;
            }
            fitting += 1;
            let better = match best {
                None => true,
                Some((bz, bi, bs)) => {
                    (inside, std::cmp::Reverse(spread), std::cmp::Reverse(z.abs()))
                        > (bi, std::cmp::Reverse(bs), std::cmp::Reverse(bz.abs()))
                }
            };
            if better {
                best = Some((z, inside, spread));
            }
        }
        match best {
            Some((z, inside, _)) => {
                ClockReport {
                    method: "inferred",
                    zone_offset_s: Some(z),
                    extra_offset_us: extra,
                    description: format!(
                        "wall-clock times (nvidia-smi, logs) read as {}: {} under which {inside} of their stamps \
                     fall inside the snapshot's trace{}{shift}; pass --tz to override",
                        format_tz(z),
                        if fitting == 1 { "the only zone offset" } else { "the zone offset" },
                        if fitting > 1 {
                            format!(" ({fitting} offsets overlap; this one keeps nvidia-smi used − PyTorch reserved steadiest)")
                        } else {
                            String::new()
                        },
                    ),
                }
            }
            None => ClockReport {
                method: "unaligned",
                zone_offset_s: None,
                extra_offset_us: extra,
                description: "no zone offset puts the nvidia-smi samples or log OOMs inside the snapshot's trace \
                              (different runs, or a host clock that was off): figures over time are not compared; \
                              pass --tz and --clock-offset to align them"
                    .into(),
            },
        }
    };
    apply(tl, &report);
    tl.clock = Some(report);
}

fn to_unix(stamp: Option<Stamp>, r: &ClockReport) -> Option<i64> {
    match (stamp?, r.method) {
        (_, "unaligned") => None,
        (Stamp::Unix(u), _) => Some(u + r.extra_offset_us),
        (Stamp::Local(w), _) => Some(w - r.zone_offset_s.unwrap_or(0) * 1_000_000 + r.extra_offset_us),
    }
}

fn apply(tl: &mut Timeline, r: &ClockReport) {
    for d in &mut tl.devices {
        for s in &mut d.memory_samples {
            s.time_us = to_unix(s.stamp, r);
        }
    }
    for o in &mut tl.ooms {
        o.time_us = to_unix(o.stamp, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones() {
        assert_eq!(parse_tz("UTC"), Ok(0));
        assert_eq!(parse_tz("+02:00"), Ok(7200));
        assert_eq!(parse_tz("-0530"), Ok(-19800));
        assert_eq!(parse_tz("+5:45"), Ok(20700));
        assert_eq!(parse_tz("-7"), Ok(-25200));
        assert_eq!(parse_tz("UTC+1"), Ok(3600));
        assert!(parse_tz("Europe/Paris").is_err());
        assert!(parse_tz("+25:00").is_err());
        assert_eq!(format_tz(-19800), "UTC-05:30");
        assert_eq!(candidate_offsets().count(), 105);
    }
}
