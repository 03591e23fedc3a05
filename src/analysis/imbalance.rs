//! How the GPUs of one process compare: the one holding a multiple of what the others hold, the user's lines that
//! hold more there, and the parallelism its frames show (the device-imbalance rule's facts).

use rustc_hash::FxHashMap;

use super::*;
use crate::timeline::stacks::StackId;
use crate::timeline::Timeline;

/// When one process holds several GPUs, how each compares with the others: a GPU holding a multiple of what
/// the others hold ran different work (a pipeline stage, a rank-0-only evaluation, an unbalanced split) or the same
/// work on more data (an uneven scatter). Judged per line as well as in total: the lines that allocated, here and on
/// the others, and how much more they hold here, say which — the same lines ten times larger is a scatter, lines only
/// this GPU runs are a split — and the frames say which parallelism the program used.
pub(super) fn imbalance_facts(tl: &Timeline, devices: &mut [DeviceReport]) {
    let held: Vec<(usize, u64)> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.source == ReportSource::Snapshot)
        .map(|(i, d)| (i, d.allocated_bytes))
        .collect();
    if held.len() < 2 {
        return;
    }
    // Each GPU's live bytes by the user's lines that allocated them, three deep: every live stack, not only the
    // listed ones, named the same way on every GPU.
    let mut names: FxHashMap<StackId, String> = FxHashMap::default();
    // Each line as the reports name it, from the frames of a stack it groups.
    let mut shown: FxHashMap<String, String> = FxHashMap::default();
    let by_line: Vec<FxHashMap<String, u64>> = held
        .iter()
        .map(|&(i, _)| {
            let mut m: FxHashMap<String, u64> = FxHashMap::default();
            for &(id, b) in &devices[i].live_stacks {
                let line = names.entry(id).or_insert_with(|| {
                    let chain = stacks::user_chain(tl, id, 3);
                    shown.entry(chain.clone()).or_insert_with(|| innermost_line(tl, id));
                    chain
                });
                *m.entry(line.clone()).or_default() += b;
            }
            m
        })
        .collect();
    let first_gpu = held.iter().map(|&(i, _)| devices[i].device).min();
    let mut computed = Vec::new();
    for (k, &(i, bytes)) in held.iter().enumerate() {
        let mut others: Vec<u64> = held.iter().filter(|(j, _)| *j != i).map(|(_, b)| *b).collect();
        others.sort_unstable();
        let median = others[others.len() / 2];
        let max_other = *others.last().expect("at least one other");
        // Per line: what it holds here beyond the median of what it holds on the others.
        let mut lines: Vec<(&str, u64, u64)> = by_line[k]
            .iter()
            .map(|(line, &mine)| {
                let mut theirs: Vec<u64> = by_line
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != k)
                    .map(|(_, m)| m.get(line).copied().unwrap_or(0))
                    .collect();
                theirs.sort_unstable();
                (line.as_str(), mine, theirs[theirs.len() / 2])
            })
            .filter(|&(_, mine, theirs)| mine > theirs)
            .collect();
        lines.sort_by(|a, b| (b.1 - b.2).cmp(&(a.1 - a.2)).then(a.0.cmp(b.0)));
        let total_excess: u64 = lines.iter().map(|&(_, m, t)| m - t).sum();
        let named: Vec<&(&str, u64, u64)> =
            lines.iter().take(3).filter(|&&(_, m, t)| (m - t) as f64 >= 0.05 * total_excess as f64).collect();
        let words: Vec<String> = named
            .iter()
            .map(|&&(chain, mine, theirs)| {
                let line = &shown[chain];
                if theirs == 0 {
                    format!("{line}: {} here, on no other GPU", crate::units::bytes(mine))
                } else {
                    format!(
                        "{line}: {} here, {:.0}× the {} it holds on the others",
                        crate::units::bytes(mine),
                        mine as f64 / theirs as f64,
                        crate::units::bytes(theirs)
                    )
                }
            })
            .collect();
        // The same lines larger here (a scatter) or lines only this GPU runs (a split): the top line says.
        let same_lines_ratio = named.first().map_or(0.0, |&&(_, m, t)| if t == 0 { 0.0 } else { m as f64 / t as f64 });
        let parallelism = parallelism(&devices[i].by_stack);
        computed.push((i, bytes, median, max_other, words, same_lines_ratio, parallelism, first_gpu));
    }
    for (i, bytes, median, max_other, words, same_lines_ratio, parallelism, first_gpu) in computed {
        let device = devices[i].device;
        let f = &mut devices[i].facts;
        f.num(
            "imbalance.ratio",
            bytes as f64 / median.max(1) as f64,
            facts::Unit::Plain,
            "allocated ÷ the median of the other GPUs",
        );
        f.num(
            "imbalance.others_bytes",
            median as f64,
            facts::Unit::Bytes,
            "the median the other GPUs held at their moments",
        );
        f.num(
            "imbalance.excess_bytes",
            bytes.saturating_sub(max_other) as f64,
            facts::Unit::Bytes,
            "allocated beyond what the fullest other GPU held",
        );
        f.num("imbalance.gpus", held.len() as f64, facts::Unit::Count, "GPUs with allocator data in this file");
        f.text(
            "imbalance.stacks",
            if words.is_empty() { "no line holds more here than on the others".to_string() } else { words.join("; ") },
            "the lines holding the most more here than on the other GPUs, with how much",
        );
        f.num(
            "imbalance.same_lines_ratio",
            same_lines_ratio,
            facts::Unit::Plain,
            "the line holding the most more here: its bytes here ÷ on the others (0: only this GPU runs it)",
        );
        f.text(
            "imbalance.parallelism",
            parallelism,
            "how the program spread its work, from its frames: DataParallel, DistributedDataParallel, FSDP, pipeline, device_map or none",
        );
        f.flag(
            "imbalance.first_gpu",
            Some(device) == first_gpu,
            "the lowest-numbered GPU here (DataParallel's output device, where it gathers)",
        );
    }
}

/// A stack's innermost line of the user's own code, as the reports name a line: `model.py:41 in forward` (its
/// culprit where it has none).
fn innermost_line(tl: &Timeline, id: StackId) -> String {
    match stacks::stack_frames(tl, id).iter().find(|f| !f.library) {
        Some(f) => {
            let file = f.filename.replace('\\', "/");
            format!("{}:{} in {}", file.rsplit('/').next().unwrap_or(&file), f.line, f.name)
        }
        None => stacks::culprit(tl, id),
    }
}

/// The parallelism a GPU's allocating stacks run through, by the library files in their frames.
fn parallelism(groups: &[StackGroup]) -> &'static str {
    const KINDS: [(&str, &str); 7] = [
        ("/torch/nn/parallel/parallel_apply.py", "DataParallel"),
        ("/torch/nn/parallel/data_parallel.py", "DataParallel"),
        ("/torch/nn/parallel/distributed.py", "DistributedDataParallel"),
        ("/torch/distributed/fsdp/", "FSDP"),
        ("/torch/distributed/pipelining/", "pipeline"),
        ("/accelerate/hooks.py", "device_map"),
        ("/accelerate/big_modeling.py", "device_map"),
    ];
    let mut bytes: FxHashMap<&str, u64> = FxHashMap::default();
    for g in groups {
        // Windows paths name the same files with backslashes.
        let frames: Vec<String> = g.stack.iter().map(|f| f.replace('\\', "/")).collect();
        if let Some(&(_, kind)) = KINDS.iter().find(|(file, _)| frames.iter().any(|f| f.contains(file))) {
            *bytes.entry(kind).or_default() += g.bytes;
        }
    }
    bytes.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0))).map_or("none", |(k, _)| k)
}
