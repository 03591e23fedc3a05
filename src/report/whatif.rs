//! The what-if comparison and the simulator's validation table, as text and JSON.

use serde::Serialize;

use crate::analysis::whatif::{DeviceWhatIfs, Validation, WhatIf};
use crate::units::bytes;

/// One input's what-ifs.
#[derive(Serialize)]
pub struct InputWhatIfs {
    pub input: String,
    pub devices: Vec<DeviceWhatIfs>,
}

/// One input's validation rows.
#[derive(Serialize)]
pub struct InputValidation {
    pub input: String,
    pub devices: Vec<Validation>,
}

/// What `oomdoc whatif` found: the validation rows or the what-ifs of each input, and the errors met on the way
/// (each one line, the input named; the others are still answered).
#[derive(Default)]
pub struct Outcome {
    pub validations: Vec<InputValidation>,
    pub results: Vec<InputWhatIfs>,
    pub errors: Vec<String>,
}

/// Runs `plan` (or, with `validate`, the recorded settings against the recorded segments) on every GPU with a trace
/// of the inputs in `options` (`device`: only that one). Validation reads each input as its own job, so one run's
/// OOM message does not set another's capacity; what-ifs read the inputs as one job. Shared by the command and the
/// MCP server.
pub fn run(
    mut options: crate::job::JobOptions,
    plan: &crate::analysis::whatif::Plan,
    validate: bool,
    device: Option<i64>,
    memory_cap: Option<u64>,
    checklist: &crate::job::Checklist,
) -> Result<Outcome, crate::Error> {
    use crate::analysis::whatif;
    options.analysis.gpu_memory = None;
    let jobs: Vec<Vec<std::path::PathBuf>> =
        if validate { options.files.iter().map(|f| vec![f.clone()]).collect() } else { vec![options.files.clone()] };
    let mut out = Outcome::default();
    for files in jobs {
        options.files = files;
        let job = crate::job::Job::read(&options)?;
        out.errors.extend(job.failed.iter().map(|e| e.to_string()));
        for (_, tl) in job.ranked_timelines() {
            let input = tl.inputs.first().map_or(String::new(), |i| i.path.clone());
            let devices = tl.devices.iter().filter(|d| !d.events.is_empty() && device.is_none_or(|n| n == d.device));
            let (mut vals, mut wifs) = (Vec::new(), Vec::new());
            for dev in devices {
                let replay = crate::timeline::replay::Replay::new(dev, tl.settings.as_ref());
                if validate {
                    vals.push(whatif::validate(tl, dev, &replay, memory_cap));
                    continue;
                }
                match whatif::run_device(tl, dev, &replay, &checklist.categories, plan, memory_cap) {
                    Ok(w) => wifs.push(w),
                    Err(e) => out.errors.push(format!("{input}: {e}")),
                }
            }
            if !vals.is_empty() {
                out.validations.push(InputValidation { input: input.clone(), devices: vals });
            }
            if !wifs.is_empty() {
                out.results.push(InputWhatIfs { input, devices: wifs });
            }
        }
        // Freeing millions of small records takes longer than the process exit that reclaims them anyway.
        std::mem::forget(job);
    }
    Ok(out)
}

/// The what-ifs as the JSON document `oomdoc whatif --format json` writes.
pub fn whatif_json(results: &[InputWhatIfs]) -> serde_json::Value {
    serde_json::json!({"schema_version": 1, "inputs": results})
}

fn answer(w: &WhatIf) -> String {
    if let Some(l) = w.undecided_above {
        return format!("undecided: fits only with a cap above {} (give --memory-cap)", bytes(l));
    }
    match (w.fits, w.headroom_bytes) {
        (Some(true), Some(h)) => format!("fits, {} to spare", bytes(h.max(0) as u64)),
        (Some(false), Some(h)) if h < 0 => format!("does not fit: {} over", bytes(h.unsigned_abs())),
        (Some(false), _) => match w.first_failure {
            Some((_, size)) => format!("does not fit: a {} request finds no room", bytes(size)),
            None => "does not fit".into(),
        },
        _ => "capacity unknown (give --gpu-memory)".into(),
    }
}

pub fn whatif_text(inputs: &[InputWhatIfs]) -> String {
    let mut s = String::new();
    for i in inputs {
        for d in &i.devices {
            s += &format!("{} — GPU {}\n", i.input, d.device);
            match d.capacity.bytes {
                Some(c) => match d.capacity.at_most {
                    Some(m) if m > c => {
                        s += &format!("  capacity {} to {} ({})\n", bytes(c), bytes(m), d.capacity.source)
                    }
                    _ => s += &format!("  capacity {} ({})\n", bytes(c), d.capacity.source),
                },
                None => s += &format!("  capacity {}\n", d.capacity.source),
            }
            let width = d.whatif.iter().map(|w| w.change.chars().count()).chain([11]).max().unwrap_or(11) + 2;
            for w in std::iter::once(&d.recorded).chain(&d.whatif) {
                s += &format!(
                    "  {:<width$}peak reserved {:>10}   {}\n",
                    w.change,
                    bytes(w.peak_reserved_bytes),
                    answer(w)
                );
            }
            if let Some(why) = &d.approximate {
                s += &format!("  approximate: {why}\n");
            }
            if let Some(why) = &d.recorded_part_only {
                s += &format!("  not proven: {why}\n");
            }
            s.push('\n');
        }
    }
    s
}

/// The rows with segment events to compare (a trace without any proves nothing about placement), and how many
/// GPUs had none.
fn compared(inputs: &[InputValidation]) -> (Vec<(String, &Validation)>, usize) {
    let mut rows = Vec::new();
    let mut none = 0;
    for i in inputs {
        let parts: Vec<&str> = i.input.trim_end_matches('/').rsplit(['/', '!']).take(2).collect();
        let name = parts.into_iter().rev().collect::<Vec<_>>().join("/");
        for v in &i.devices {
            if v.recorded_segment_events == 0 && v.simulated_segment_events == 0 {
                none += 1;
            } else {
                rows.push((name.clone(), v));
            }
        }
    }
    (rows, none)
}

const GC_WITHOUT_CAP: &str = "garbage collection acts on the process's memory cap, which these files do not hold \
     (if the program set a memory fraction, give --memory-cap)";

fn footer(rows: &[(String, &Validation)], none: usize) -> String {
    let exact = rows.iter().filter(|r| r.1.exact).count();
    let mut s =
        format!("{exact} of {} GPUs exact (the same segment events, in order, and the same peak reserved)", rows.len());
    if none > 0 {
        s += &format!("; {none} more recorded no segment event and are not counted");
    }
    s + "\n"
}

pub fn validation_text(inputs: &[InputValidation]) -> String {
    let (rows, none) = compared(inputs);
    let mut s = String::from(
        "input                                         GPU  start    segment events rec/sim/agree   peak reserved rec → sim\n",
    );
    for (name, v) in &rows {
        let start = if v.rebuilt_start { "rebuilt" } else { "empty" };
        let mut line = format!(
            "{:<45} {:>3}  {:<8} {:>6}/{:>6}/{:>6}            {:>10} → {:>10} ({:+.2}%)",
            truncate(name, 45),
            v.device,
            start,
            v.recorded_segment_events,
            v.simulated_segment_events,
            v.agreeing,
            bytes(v.recorded_peak_reserved),
            bytes(v.simulated_peak_reserved),
            v.peak_error() * 100.0,
        );
        line += if v.exact { "  exact" } else { "" };
        if v.expandable {
            line += "  expandable";
        }
        s += line.trim_end();
        s.push('\n');
        if let Some(d) = &v.first_difference {
            s += &format!("{:51}first difference {d}\n", "");
        }
        if v.gc_without_cap {
            s += &format!("{:51}{GC_WITHOUT_CAP}\n", "");
        }
    }
    s + &footer(&rows, none)
}

pub fn validation_markdown(inputs: &[InputValidation]) -> String {
    let (rows, none) = compared(inputs);
    let mut s = String::from(
        "| trace | starts | segment events recorded / simulated | peak reserved recorded → simulated | |\n|---|---|---:|---:|---|\n",
    );
    for (name, v) in &rows {
        let mut notes = vec![if v.exact { "exact" } else { "differs" }];
        if v.expandable {
            notes.push("expandable segments");
        }
        if v.capacity.fraction_cap {
            notes.push("memory cap");
        }
        let refusals = format!("{} releases replayed", v.driver_refusals);
        if v.driver_refusals > 0 {
            notes.push(&refusals);
        }
        let calls = format!("{} empty_cache calls", v.empty_cache_calls);
        if v.empty_cache_calls > 0 {
            notes.push(&calls);
        }
        if v.gc_without_cap {
            notes.push(GC_WITHOUT_CAP);
        }
        s += &format!(
            "| `{}`{} | {} | {} / {} | {} → {} | {} |\n",
            name,
            if v.device != 0 { format!(" GPU {}", v.device) } else { String::new() },
            if v.rebuilt_start { "mid-run (rebuilt)" } else { "empty device" },
            v.recorded_segment_events,
            v.simulated_segment_events,
            bytes(v.recorded_peak_reserved),
            bytes(v.simulated_peak_reserved),
            notes.join(", ")
        );
    }
    s + "\n" + &footer(&rows, none)
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let tail: String = s.chars().rev().take(n - 1).collect::<Vec<_>>().into_iter().rev().collect();
        format!("…{tail}")
    }
}
