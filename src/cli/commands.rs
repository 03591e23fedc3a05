//! What each subcommand does with its arguments: run the job pipeline ([`oomdoc::job`]) and write its report, or
//! list and explain the rules, or the budget. Each returns the process's exit code or the error to report.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use oomdoc::job::{Checklist, Job};
use oomdoc::report;
use oomdoc::Error;

use super::args::{AnalyzeArgs, Cli, Color, Command, DiffArgs, FactsArgs, TuiArgs};

pub fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Analyze(args) => analyze(args),
        Command::Facts(args) => facts(args),
        Command::Tui(args) => tui(args),
        Command::Diff(args) => diff(args),
        Command::Budget(args) => {
            let budget = oomdoc::budget::args::budget(&args.budget)?;
            write_out(None, &report::budget::render(&budget, args.format))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Rules(args) => {
            write_out(None, &report::rule_list::list(&Checklist::load(args.rules.as_deref())?.rules))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain(args) => {
            let rules = Checklist::load(args.rules.as_deref())?.rules;
            write_out(None, &report::rule_list::explain(&rules, &args.rule)?)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Reports each input that could not be read on a line of its own; the caller exits 2 after the rest.
fn report_failed(job: &Job) -> bool {
    for e in &job.failed {
        eprintln!("oomdoc: error: {e}");
    }
    !job.failed.is_empty()
}

fn analyze(args: AnalyzeArgs) -> Result<ExitCode, Error> {
    let to_terminal = args.output.is_none() && std::io::stdout().is_terminal();
    let color = match args.color {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => to_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    };
    let job = Job::read(&args.input.job_options(args.top))?;
    let analysed = job.analyse().collect::<Result<Vec<_>, _>>()?;
    let worst = analysed.iter().flat_map(|a| &a.analysis.findings).map(|f| f.severity).max();
    let over = over_threshold(&analysed, args.max_peak, args.max_reserved);
    let failed = report_failed(&job);
    if !analysed.is_empty() || !job.reported.is_empty() {
        write_out(args.output.as_ref(), &report::render_job(args.format, analysed, &job.reported, color))?;
    }
    // Freeing millions of small records takes longer than the process exit that reclaims them anyway.
    std::mem::forget(job);
    if let Some(why) = &over {
        eprintln!("oomdoc: {why}");
    }
    Ok(if failed {
        ExitCode::from(2)
    } else if over.is_some() || matches!((args.fail_on, worst), (Some(f), Some(w)) if w >= f) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The first GPU whose peak is over `--max-peak` or `--max-reserved`, in one line; the highest over, if several.
fn over_threshold(
    analysed: &[oomdoc::job::Analysed],
    max_peak: Option<u64>,
    max_reserved: Option<u64>,
) -> Option<String> {
    let gpus = || {
        analysed.iter().flat_map(|a| {
            let file = a.analysis.inputs.first().map_or(String::new(), |i| i.path.clone());
            a.analysis.devices.iter().map(move |d| {
                let (alloc, res) = d
                    .peak
                    .as_ref()
                    .map_or((d.allocated_bytes, d.reserved_bytes), |p| (p.allocated_bytes, p.reserved_bytes));
                (file.clone(), d.device, alloc.max(d.allocated_bytes), res.max(d.reserved_bytes))
            })
        })
    };
    let say = |what: &str, flag: &str, limit: u64, (file, dev, bytes): (String, i64, u64)| {
        let b = oomdoc::units::bytes;
        format!("GPU {dev} ({file}) peaked at {} {what}, over {flag} {} by {}", b(bytes), b(limit), b(bytes - limit))
    };
    if let Some(limit) = max_peak {
        if let Some(g) = gpus().map(|(f, d, a, _)| (f, d, a)).filter(|g| g.2 > limit).max_by_key(|g| g.2) {
            return Some(say("allocated", "--max-peak", limit, g));
        }
    }
    if let Some(limit) = max_reserved {
        if let Some(g) = gpus().map(|(f, d, _, r)| (f, d, r)).filter(|g| g.2 > limit).max_by_key(|g| g.2) {
            return Some(say("reserved", "--max-reserved", limit, g));
        }
    }
    None
}

fn diff(args: DiffArgs) -> Result<ExitCode, Error> {
    let read = |path: &PathBuf| -> Result<oomdoc::analysis::Analysis, Error> {
        let mut options = oomdoc::job::JobOptions::new([path.clone()]);
        options.analysis.at = args.at.clone();
        options.analysis.top = 50;
        let mut job = Job::read(&options)?;
        if !job.failed.is_empty() {
            return Err(job.failed.swap_remove(0));
        }
        let analysed = job.analyse().collect::<Result<Vec<_>, _>>()?;
        if analysed.len() != 1 {
            return Err(Error::Usage(format!(
                "{}: oomdoc diff compares one snapshot with one snapshot; this holds {}",
                path.display(),
                analysed.len()
            )));
        }
        Ok(analysed.into_iter().next().expect("one").analysis)
    };
    let (before, after) = (read(&args.before)?, read(&args.after)?);
    let d = oomdoc::analysis::diff::of(&before, &after);
    write_out(args.output.as_ref(), &report::diff::render(&d, args.format))?;
    if let (Some(limit), Some(grew)) = (args.fail_on_growth, d.peak_growth_pct) {
        if grew > limit {
            eprintln!("oomdoc: the peak allocated memory grew {grew:.1}%, over --fail-on-growth {limit}%");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn tui(args: TuiArgs) -> Result<ExitCode, Error> {
    if !std::io::stdout().is_terminal() {
        return Err(Error::Usage("oomdoc tui needs a terminal; use `oomdoc analyze` for a report".into()));
    }
    let mut options = args.input.job_options(10);
    options.keep_replays = true;
    let job = Job::read(&options)?;
    if report_failed(&job) {
        return Ok(ExitCode::from(2));
    }
    let snapshots = job.timelines.iter().filter(|tl| tl.inputs.iter().any(|i| i.kind == "pytorch_snapshot")).count();
    if snapshots > 1 {
        return Err(Error::Usage(format!(
            "oomdoc tui opens one snapshot at a time (with any logs, nvidia-smi or Nsight exports beside it), and \
             these inputs hold {snapshots}; run it once per snapshot"
        )));
    }
    for analysed in job.analyse() {
        let analysed = analysed?;
        let path =
            analysed.analysis.inputs.first().map_or(String::new(), |i| format!("{} ({})", i.path, i.format_version));
        let mut app = oomdoc::tui::App::new(analysed, &job.checklist.categories, path);
        oomdoc::tui::run(&mut app).map_err(|source| Error::Io { path: "<terminal>".into(), source })?;
    }
    Ok(ExitCode::SUCCESS)
}

fn facts(args: FactsArgs) -> Result<ExitCode, Error> {
    let job = Job::read(&args.input.job_options(10))?;
    let analysed = job.analyse().collect::<Result<Vec<_>, _>>()?;
    let failed = report_failed(&job);
    let analyses: Vec<&oomdoc::analysis::Analysis> = analysed.iter().map(|a| &a.analysis).collect();
    write_out(None, &report::facts_table::render(&analyses, args.json))?;
    Ok(if failed { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

pub fn write_out(path: Option<&PathBuf>, text: &str) -> Result<(), Error> {
    match path {
        Some(p) => std::fs::write(p, text).map_err(|source| Error::Io { path: p.display().to_string(), source }),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(text.as_bytes())
                .and_then(|_| stdout.flush())
                .map_err(|source| Error::Io { path: "<stdout>".into(), source })
        }
    }
}
