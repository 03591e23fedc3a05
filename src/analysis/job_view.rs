//! A job of several ranks, seen whole: one row per rank and GPU, which rank ran out first, the ranks that stand out,
//! and each rule's findings merged across ranks. Built from the per-snapshot analyses alone, so it works the same on
//! snapshots read here and on the JSON reports of ranks analysed elsewhere.

use serde::Serialize;

use super::{Analysis, Severity};
use crate::timeline::reported::{ReportedDevice, ReportedFinding, ReportedRank};

/// A rank's category counts as standing out when it holds more than this many times the median of the other ranks.
const OUTLIER_FACTOR: f64 = 2.0;
/// …and is at least this share of the rank's own allocated memory and of a typical rank's (a category that is
/// small beside either is noise).
const OUTLIER_MIN_SHARE: f64 = 0.10;

#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub ranks: Vec<RankRow>,
    /// The rank whose OOM came first on the snapshots' common clock (or the only one that ran out).
    pub first_oom: Option<RankRef>,
    pub outliers: Vec<Outlier>,
    /// Each rule's findings across ranks, worst first.
    pub findings: Vec<MergedFinding>,
}

impl JobView {
    /// Ranks, not rows: a rank with several GPUs has a row per GPU; an OOM message matched to no snapshot is a row,
    /// not a rank.
    pub fn rank_count(&self) -> usize {
        self.ranks.iter().filter(|r| !r.unmatched).map(|r| r.rank).collect::<std::collections::BTreeSet<_>>().len()
    }

    /// The rows of OOM messages no snapshot matched.
    pub fn unmatched(&self) -> impl Iterator<Item = &RankRow> {
        self.ranks.iter().filter(|r| r.unmatched)
    }
}

/// One GPU of one rank.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    pub input: String,
    pub rank: u32,
    pub device: i64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub oom: bool,
    /// On the snapshot's clock (wall-clock microseconds in torch's traces), when it recorded one.
    pub oom_time_us: Option<i64>,
    pub primary_rule: Option<String>,
    /// What held the most memory at the reported moment: `activation: model.py:41 in forward`.
    pub holder: Option<String>,
    /// No snapshot of this GPU was given: the row is an OOM message's (its `input` is where the message is).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unmatched: bool,
    /// Index of this rank in the list the view was made from.
    #[serde(skip)]
    pub analysis: usize,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RankRef {
    pub input: String,
    pub rank: u32,
    pub device: i64,
}

/// A rank that stands out from the others, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Outlier {
    pub input: String,
    pub rank: u32,
    pub device: i64,
    /// One line: "activation 30.1 GiB, 4.1× the other ranks' median (7.3 GiB)".
    pub why: String,
    /// The category that stands out (null when it is the holder stack that differs).
    pub category: Option<String>,
    pub bytes: u64,
    pub median_bytes: u64,
}

/// One rule over the whole job.
#[derive(Clone, Debug, Serialize)]
pub struct MergedFinding {
    pub rule: String,
    pub severity: Severity,
    pub title: String,
    /// The ranks it fired on, in rank order.
    pub ranks: Vec<u32>,
    /// How many ranks the job has.
    pub of: usize,
    /// The largest memory it explains on one rank.
    pub bytes: Option<u64>,
    /// The line every rank's finding points at, when they all point at the same one.
    pub same_line: Option<String>,
}

/// The rank in a snapshot's file name — `rank5`, `rank_5`, `rank-5`, `r5`, `…-5.pickle`, `…_5.pickle` — if it has
/// one. Only the last path component counts (a member's name inside its archive included).
pub fn rank_from_name(path: &str) -> Option<u32> {
    let name = path.rsplit(['/', '\\', '!']).next().unwrap_or(path).to_ascii_lowercase();
    let digits_at = |i: usize| -> Option<u32> {
        let d: String = name[i..].chars().take_while(|c| c.is_ascii_digit()).collect();
        if d.is_empty() || d.len() > 6 {
            None
        } else {
            d.parse().ok()
        }
    };
    let b = name.as_bytes();
    let boundary = |i: usize| i == 0 || !b[i - 1].is_ascii_alphanumeric();
    // "rank" with an optional separator, then digits.
    if let Some(i) = name.find("rank") {
        let mut j = i + 4;
        if j < b.len() && matches!(b[j], b'_' | b'-' | b'.') {
            j += 1;
        }
        if let Some(r) = digits_at(j) {
            return Some(r);
        }
    }
    // "r" as a word of its own, then digits: `r5.pickle`, `snap_r12.pickle`.
    for (i, _) in name.match_indices('r') {
        if boundary(i) {
            if let Some(r) = digits_at(i + 1) {
                let end = i + 1 + r.to_string().len();
                if end == b.len() || !b[end].is_ascii_alphabetic() {
                    return Some(r);
                }
            }
        }
    }
    // Digits just before the extension, after a separator: `snapshot-5.pickle`, `mem_12.pickle.gz`.
    let stem = name.split('.').next().unwrap_or(&name);
    let tail: String = stem.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
    if !tail.is_empty() && tail.len() <= 6 && stem.len() > tail.len() {
        let sep = stem.as_bytes()[stem.len() - tail.len() - 1];
        if matches!(sep, b'-' | b'_') {
            return tail.chars().rev().collect::<String>().parse().ok();
        }
    }
    None
}

/// The rank of each of a job's snapshots, given in order: from their names when every name has one and no two share
/// it (`rank5`, `…-5.pickle`), otherwise their place in the order given. Every view of a job (the report's table,
/// the TUI's `r` / `R`) numbers ranks by this one rule.
pub fn rank_numbers<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
    let names: Vec<&str> = names.into_iter().collect();
    let named: Vec<Option<u32>> = names.iter().map(|n| rank_from_name(n)).collect();
    let mut seen = std::collections::BTreeSet::new();
    if named.iter().all(|r| r.is_some_and(|r| seen.insert(r))) {
        named.into_iter().map(|r| r.expect("checked")).collect()
    } else {
        (0..names.len() as u32).collect()
    }
}

/// What the job view needs of one analysed snapshot: the same summary a JSON report gives when read back, so a
/// job of snapshots and a job of reports are one view.
pub fn summary(a: &Analysis) -> ReportedRank {
    let input = a
        .inputs
        .iter()
        .find(|i| i.kind == crate::timeline::InputKind::PytorchSnapshot)
        .or(a.inputs.first())
        .map_or_else(String::new, |i| i.path.clone());
    let devices = a
        .devices
        .iter()
        .map(|d| {
            let (pa, pr) = d
                .peak
                .as_ref()
                .map_or((d.allocated_bytes, d.reserved_bytes), |p| (p.allocated_bytes, p.reserved_bytes));
            let verdict = d.verdict.as_ref();
            ReportedDevice {
                device: d.device,
                allocated_bytes: d.allocated_bytes,
                peak_allocated_bytes: pa.max(d.allocated_bytes),
                peak_reserved_bytes: pr.max(d.reserved_bytes),
                oom: d.oom.is_some(),
                oom_time_us: d.oom.as_ref().and_then(|o| o.time_us),
                primary_rule: verdict.and_then(|v| v.primary_rule.clone()),
                holder: verdict
                    .and_then(|v| v.holder.as_ref())
                    .map(|h| (h.category.to_string(), h.stack.clone(), h.bytes)),
                by_category: d.by_category.iter().map(|c| (c.category.to_string(), c.bytes)).collect(),
                unmatched: d.unmatched.then(|| {
                    let m = d.oom.as_ref().and_then(|o| o.message.as_ref());
                    (
                        m.map_or(String::new(), |m| format!("{}:{}", m.source, m.line)),
                        m.and_then(|m| m.rank).and_then(|r| u32::try_from(r).ok()),
                    )
                }),
            }
        })
        .collect();
    let findings = a
        .findings
        .iter()
        .map(|f| ReportedFinding {
            rule: f.rule.clone(),
            severity: f.severity,
            title: f.title.clone(),
            device: f.device,
            bytes: f.bytes,
            line: crate::ingest::oomdoc_report::finding_line(&f.evidence),
        })
        .collect();
    ReportedRank { input, devices, findings }
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2
    }
}

/// The job view of several ranks (snapshots analysed here and reports read back), or `None` for one (its report
/// is the whole story). A row's `analysis` is its index in `ranks`.
pub fn of(ranks_in: &[ReportedRank]) -> Option<JobView> {
    if ranks_in.len() < 2 {
        return None;
    }
    let numbers = rank_numbers(ranks_in.iter().map(|r| r.input.as_str()));
    let mut ranks = Vec::new();
    // For each row: whether it is a message that names its rank (it is matched by that rank's snapshot only).
    let mut names_rank = Vec::new();
    for (i, a) in ranks_in.iter().enumerate() {
        let rank = numbers[i];
        for d in &a.devices {
            let (input, rank) = match &d.unmatched {
                Some((at, msg_rank)) => (at.clone(), msg_rank.unwrap_or(rank)),
                None => (a.input.clone(), rank),
            };
            names_rank.push(d.unmatched.as_ref().is_some_and(|(_, r)| r.is_some()));
            ranks.push(RankRow {
                input,
                rank,
                device: d.device,
                peak_allocated_bytes: d.peak_allocated_bytes,
                peak_reserved_bytes: d.peak_reserved_bytes,
                oom: d.oom,
                oom_time_us: d.oom_time_us,
                primary_rule: d.primary_rule.clone(),
                holder: d.holder.as_ref().map(|(c, s, _)| format!("{}: {s}", c.replace('_', " "))),
                unmatched: d.unmatched.is_some(),
                analysis: i,
            });
        }
    }
    // Every rank read the same log: its message is one row, and none where a snapshot of that GPU ran out.
    let matched: Vec<(u32, i64)> = ranks.iter().filter(|r| !r.unmatched && r.oom).map(|r| (r.rank, r.device)).collect();
    let mut seen_messages = std::collections::BTreeSet::new();
    let keep: Vec<bool> = ranks
        .iter()
        .zip(&names_rank)
        .map(|(r, &by_rank)| {
            !r.unmatched
                || (!matched.iter().any(|&(rank, dev)| dev == r.device && (!by_rank || rank == r.rank))
                    && seen_messages.insert(r.input.clone()))
        })
        .collect();
    let mut keep = keep.into_iter();
    ranks.retain(|_| keep.next().unwrap_or(true));
    ranks.sort_by_key(|r| (r.rank, r.device));

    let first_oom = ranks
        .iter()
        .filter(|r| r.oom)
        .min_by_key(|r| (r.oom_time_us.unwrap_or(i64::MAX), r.rank))
        .map(|r| RankRef { input: r.input.clone(), rank: r.rank, device: r.device });

    // A row of an OOM message alone has no allocator figures to compare.
    let snapshot_rows: Vec<RankRow> = ranks.iter().filter(|r| !r.unmatched).cloned().collect();
    let outliers = outliers(ranks_in, &snapshot_rows);
    let findings = merged_findings(ranks_in, &snapshot_rows);
    Some(JobView { ranks, first_oom, outliers, findings })
}

fn device_of<'a>(ranks_in: &'a [ReportedRank], r: &RankRow) -> Option<&'a ReportedDevice> {
    ranks_in[r.analysis].devices.iter().find(|d| d.device == r.device)
}

fn outliers(ranks_in: &[ReportedRank], ranks: &[RankRow]) -> Vec<Outlier> {
    let mut out = Vec::new();
    let categories: std::collections::BTreeSet<&str> = ranks
        .iter()
        .filter_map(|r| device_of(ranks_in, r))
        .flat_map(|d| d.by_category.iter().map(|c| c.0.as_str()))
        .collect();
    let bytes_in = |r: &RankRow, cat: &str| -> u64 {
        device_of(ranks_in, r).and_then(|d| d.by_category.iter().find(|c| c.0 == cat)).map_or(0, |c| c.1)
    };
    for (i, r) in ranks.iter().enumerate() {
        let Some(d) = device_of(ranks_in, r) else { continue };
        // The category that stands out most on this rank, against the median of the others.
        let mut best: Option<(f64, &str, u64, u64)> = None;
        let typical = median(
            ranks
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .filter_map(|(_, o)| device_of(ranks_in, o))
                .map(|o| o.allocated_bytes)
                .collect(),
        );
        for &cat in &categories {
            let mine = bytes_in(r, cat);
            if (mine as f64) < OUTLIER_MIN_SHARE * d.allocated_bytes.max(typical).max(1) as f64 {
                continue;
            }
            let med =
                median(ranks.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, o)| bytes_in(o, cat)).collect());
            let factor = if med == 0 { f64::INFINITY } else { mine as f64 / med as f64 };
            if factor > OUTLIER_FACTOR && best.is_none_or(|b| factor > b.0) {
                best = Some((factor, cat, mine, med));
            }
        }
        if let Some((factor, cat, mine, med)) = best {
            let b = crate::units::bytes;
            let mut why = if factor.is_finite() {
                format!("{} {}, {factor:.1}× the other ranks' median ({})", cat.replace('_', " "), b(mine), b(med))
            } else {
                format!("{} {}, where the other ranks hold none", cat.replace('_', " "), b(mine))
            };
            // The same line holding the most on every rank: the same code given more data on this one.
            let held_by = |o: &RankRow| {
                device_of(ranks_in, o).and_then(|d| d.holder.as_ref()).map(|(c, s, _)| (c.as_str(), s.as_str()))
            };
            let same_line = held_by(r).filter(|&(c, _)| c == cat).filter(|&h| {
                let mut others = ranks.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, o)| held_by(o)).peekable();
                others.peek().is_some() && others.all(|o| o == Some(h))
            });
            if let Some((_, line)) = same_line {
                why.push_str(&format!(
                    "; the same line holds the most on every rank ({line}): the same code given more data here — an \
                     uneven split of the batch or of the sequence lengths"
                ));
            }
            out.push(Outlier {
                input: r.input.clone(),
                rank: r.rank,
                device: r.device,
                why,
                category: Some(cat.to_string()),
                bytes: mine,
                median_bytes: med,
            });
            continue;
        }
        // A holder stack that no other rank's memory is held by, when at least two others agree on theirs.
        if let Some(h) = &r.holder {
            let others: Vec<&String> =
                ranks.iter().enumerate().filter(|(j, _)| *j != i).filter_map(|(_, o)| o.holder.as_ref()).collect();
            let agree = others.first().is_some_and(|first| others.len() >= 2 && others.iter().all(|o| o == first));
            if agree && others[0] != h {
                out.push(Outlier {
                    input: r.input.clone(),
                    rank: r.rank,
                    device: r.device,
                    why: format!("held by {h}, where the other ranks are held by {}", others[0]),
                    category: None,
                    bytes: d.holder.as_ref().map_or(0, |h| h.2),
                    median_bytes: 0,
                });
            }
        }
    }
    out
}

fn merged_findings(ranks_in: &[ReportedRank], ranks: &[RankRow]) -> Vec<MergedFinding> {
    let rank_of = |analysis: usize, device: Option<i64>| {
        ranks.iter().find(|r| r.analysis == analysis && device.is_none_or(|d| d == r.device)).map(|r| r.rank)
    };
    let of = ranks.iter().map(|r| r.rank).collect::<std::collections::BTreeSet<_>>().len();
    let mut merged: Vec<(MergedFinding, Vec<Option<String>>)> = Vec::new();
    for (i, a) in ranks_in.iter().enumerate() {
        // A note that explains none of the memory is no cause across ranks either.
        for f in a.findings.iter().filter(|f| !(f.severity == Severity::Info && f.bytes == Some(0))) {
            let Some(rank) = rank_of(i, f.device) else { continue };
            let sev = f.severity;
            match merged.iter_mut().find(|(m, _)| m.rule == f.rule) {
                Some((m, lines)) => {
                    if !m.ranks.contains(&rank) {
                        m.ranks.push(rank);
                    }
                    m.severity = m.severity.max(sev);
                    m.bytes = m.bytes.max(f.bytes);
                    lines.push(f.line.clone());
                }
                None => merged.push((
                    MergedFinding {
                        rule: f.rule.clone(),
                        severity: sev,
                        title: f.title.clone(),
                        ranks: vec![rank],
                        of,
                        bytes: f.bytes,
                        same_line: None,
                    },
                    vec![f.line.clone()],
                )),
            }
        }
    }
    let mut out: Vec<MergedFinding> = merged
        .into_iter()
        .map(|(mut m, lines)| {
            m.ranks.sort_unstable();
            if lines[0].is_some() && lines.iter().all(|l| l == &lines[0]) {
                m.same_line = lines[0].clone();
            }
            m
        })
        .collect();
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then(b.ranks.len().cmp(&a.ranks.len())).then(a.rule.cmp(&b.rule)));
    out
}

#[cfg(test)]
mod tests {
    use super::rank_from_name;

    #[test]
    fn ranks_from_file_names() {
        for (name, rank) in [
            ("rank5.pickle", Some(5)),
            ("rank_5.pickle", Some(5)),
            ("snapshot_rank-12.pickle.gz", Some(12)),
            ("job.tar.gz!job/rank3.pickle", Some(3)),
            ("r7.pickle", Some(7)),
            ("mem_r7.pickle", Some(7)),
            ("snapshot-5.pickle", Some(5)),
            ("mem_12.pickle", Some(12)),
            ("runs/rank2/snapshot.pickle", None),
            ("train.pickle", None),
            ("resnet50.pickle", None),
            ("llama3.pickle", None),
        ] {
            assert_eq!(rank_from_name(name), rank, "{name}");
        }
    }
}
