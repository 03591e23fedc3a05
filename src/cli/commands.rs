//! What each subcommand does with its arguments: run the job pipeline ([`oomdoc::job`]) and write its report, or
//! list and explain the rules, or the budget. Each returns the process's exit code or the error to report.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use oomdoc::job::{Checklist, Job};
use oomdoc::report;
use oomdoc::Error;

use super::args::{AnalyzeArgs, Cli, Color, Command, DiffArgs, FactsArgs, TuiArgs, WhatifArgs};

pub fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Analyze(args) => analyze(args),
        Command::Facts(args) => facts(args),
        Command::Tui(args) => tui(args),
        Command::Diff(args) => diff(args),
        Command::Whatif(args) => whatif(args),
        Command::Budget(args) => {
            let budget = oomdoc::budget::args::budget(&args.budget)?;
            write_out(None, &report::budget::render(&budget, args.format))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Rules(args) => {
            write_out(None, &report::rule_list::list(&Checklist::load(args.rules.as_deref())?.rules))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Mcp => {
            oomdoc::mcp::serve()?;
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
    let format = args
        .format
        .or_else(|| args.output.as_deref().and_then(report::Format::from_file_name))
        .unwrap_or(report::Format::Text);
    let mut options = args.input.job_options(args.top);
    options.load.defer_snapshot_files = true;
    options.analysis.chart_categories = format == report::Format::Html;
    let job = Job::read(&options)?;
    let mut failed = report_failed(&job);
    let mut ranks = Vec::new();
    for rank in job.each_rank(|analysed| report::RankOutput::of(format, analysed, color)) {
        match rank {
            Ok(r) => ranks.push(r),
            Err(e) => {
                eprintln!("oomdoc: error: {e}");
                failed = true;
            }
        }
    }
    let worst = ranks.iter().filter_map(|r| r.worst).max();
    let over = over_threshold(&ranks, args.max_peak, args.max_reserved);
    if !ranks.is_empty() || !job.reported.is_empty() {
        write_parts(args.output.as_ref(), report::render_job(format, ranks, &job.reported, color))?;
        say_written(args.output.as_ref(), format);
    } else if !failed {
        // Every input failed is said above; an analysis that produced nothing is never a success.
        eprintln!("oomdoc: error: nothing to report: no input gave a snapshot, a log or a report");
        failed = true;
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

/// The GPU whose peak is most over `--max-peak` (else `--max-reserved`), in one line.
fn over_threshold(ranks: &[report::RankOutput], max_peak: Option<u64>, max_reserved: Option<u64>) -> Option<String> {
    let gpus = || {
        ranks.iter().flat_map(|r| {
            r.summary
                .devices
                .iter()
                .map(|d| (&r.summary.input, d.device, d.peak_allocated_bytes, d.peak_reserved_bytes))
        })
    };
    let say = |what: &str, flag: &str, limit: u64, (file, dev, bytes): (&String, i64, u64)| {
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
    let format = args
        .format
        .or_else(|| args.output.as_deref().and_then(report::Format::from_file_name))
        .unwrap_or(report::Format::Text);
    let read = |p: &PathBuf| oomdoc::job::compared_run(p, &args.at);
    let ((before, before_chart), (after, after_chart)) = (read(&args.before)?, read(&args.after)?);
    let d = oomdoc::analysis::diff::of(&before, &after);
    let page = match format {
        report::Format::Html => {
            use report::diff_html::{render, Run};
            let b = Run { report: &before, chart: before_chart.as_ref() };
            let a = Run { report: &after, chart: after_chart.as_ref() };
            render(&d, &b, &a, args.align)
        }
        f => report::diff::render(&d, f),
    };
    write_out(args.output.as_ref(), &page)?;
    say_written(args.output.as_ref(), format);
    if let (Some(limit), Some(grew)) = (args.fail_on_growth, d.peak_growth_pct) {
        if grew > limit {
            eprintln!("oomdoc: the peak allocated memory grew {grew:.1}%, over --fail-on-growth {limit}%");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn whatif(args: WhatifArgs) -> Result<ExitCode, Error> {
    use oomdoc::analysis::whatif;
    let plan = whatif::Plan::parse(&args.set, &args.scale, &args.drop_stack, args.input.gpu_memory)
        .map_err(|e| Error::Usage(e.to_string()))?;
    if args.validate && !plan.is_empty() {
        return Err(Error::Usage(
            "--validate replays the recorded settings; it takes no --set, --scale or --drop-stack".into(),
        ));
    }
    let checklist = Checklist::load(args.input.rules.as_deref())?;
    let outcome = report::whatif::run(
        args.input.job_options(10),
        &plan,
        args.validate,
        args.input.device,
        args.input.memory_cap,
        &checklist,
    )?;
    for e in &outcome.errors {
        eprintln!("oomdoc: error: {e}");
    }
    let failed = !outcome.errors.is_empty();
    let report::whatif::Outcome { validations, results, .. } = outcome;
    if validations.is_empty() && results.is_empty() && !failed {
        eprintln!("oomdoc: error: no input holds an allocator trace (a snapshot recorded with _record_memory_history)");
        return Ok(ExitCode::from(2));
    }
    let json = args.format == report::Format::Json;
    let out = match (args.validate, json) {
        (true, true) => {
            serde_json::to_string_pretty(&serde_json::json!({"schema_version": 1, "validation": validations}))
                .expect("serialises")
                + "\n"
        }
        (true, false) if args.format == report::Format::Markdown => report::whatif::validation_markdown(&validations),
        (true, false) => report::whatif::validation_text(&validations),
        (false, true) => {
            serde_json::to_string_pretty(&report::whatif::whatif_json(&results)).expect("serialises") + "\n"
        }
        (false, false) => report::whatif::whatif_text(&results),
    };
    write_out(None, &out)?;
    Ok(if failed { ExitCode::from(2) } else { ExitCode::SUCCESS })
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
    // One timeline per snapshot (or one for text artifacts alone). Several snapshots are the job's ranks, numbered as
    // the report numbers them, opened one at a time: the first to run out of memory first.
    let ranked = job.ranked_timelines();
    let ranks: Vec<&oomdoc::timeline::Timeline> = ranked.iter().map(|(_, tl)| *tl).collect();
    let labels: Vec<String> = ranked
        .iter()
        .map(|(rank, tl)| {
            let file = tl.inputs.first().map_or(String::new(), |i| i.path.clone());
            let short = file.rsplit(['/', '!']).next().unwrap_or(&file).to_string();
            format!("rank {rank} ({short})")
        })
        .collect();
    let oom_time = |tl: &oomdoc::timeline::Timeline| {
        tl.devices
            .iter()
            .flat_map(|d| d.events.iter().filter(|e| e.action == oomdoc::timeline::Action::Oom))
            .map(|e| e.time_us().unwrap_or(i64::MAX))
            .min()
    };
    let first = ranks.iter().enumerate().filter_map(|(i, tl)| Some((oom_time(tl)?, i))).min().map_or(0, |(_, i)| i);
    // Two runs given: what changed from the first to the second, as `oomdoc diff` says it; the TUI opens on it.
    // (Two files `oomdoc diff` can compare: two folders or archives of artifacts are ranks, without the view.)
    let difference = match args.input.files.as_slice() {
        [a, b] if ranks.len() == 2 => {
            let read = |p: &PathBuf| oomdoc::job::compared_run(p, &oomdoc::analysis::At::Auto).ok();
            match (read(a), read(b)) {
                (Some((before, _)), Some((after, _))) => {
                    let d = oomdoc::analysis::diff::of(&before, &after);
                    report::diff::render(&d, report::Format::Text).lines().map(str::to_string).collect()
                }
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    };
    let mut opened = false;
    oomdoc::tui::run_ranks(first, |i| -> Result<oomdoc::tui::App, Error> {
        let analysed = job.analyze_timeline(ranks[i])?;
        let path =
            analysed.analysis.inputs.first().map_or(String::new(), |i| format!("{} ({})", i.path, i.format_version));
        let mut app = oomdoc::tui::App::new(analysed, &job.checklist.categories, path);
        app.ranks = oomdoc::tui::app::Ranks { labels: labels.clone(), open: i, switch_to: None };
        app.difference = difference.clone();
        app.showing_difference = !opened && !app.difference.is_empty();
        opened = true;
        Ok(app)
    })
    .map_err(|source| Error::Io { path: "<terminal>".into(), source })??;
    Ok(ExitCode::SUCCESS)
}

fn facts(args: FactsArgs) -> Result<ExitCode, Error> {
    let job = Job::read(&args.input.job_options(10))?;
    let analysed = job.analyze().collect::<Result<Vec<_>, _>>()?;
    let failed = report_failed(&job);
    let analyses: Vec<&oomdoc::analysis::Analysis> = analysed.iter().map(|a| &a.analysis).collect();
    write_out(None, &report::facts_table::render(&analyses, args.json))?;
    Ok(if failed { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

pub fn write_out(path: Option<&PathBuf>, text: &str) -> Result<(), Error> {
    write_parts(path, [text])
}

/// A report written to a file says where it went (on stderr: stdout stays the report's, or nothing).
pub fn say_written(path: Option<&PathBuf>, format: report::Format) {
    if let Some(p) = path {
        let size = std::fs::metadata(p).map_or(String::new(), |m| format!(", {}", oomdoc::units::bytes(m.len())));
        eprintln!("oomdoc: wrote {} ({}{size})", p.display(), format.name());
    }
}

/// Writes a report that comes in parts (a job's JSON: each rank's share as it was written), one after the other.
fn write_parts<S: AsRef<str>>(path: Option<&PathBuf>, parts: impl IntoIterator<Item = S>) -> Result<(), Error> {
    let (mut out, shown): (Box<dyn Write>, String) = match path {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|source| Error::Io { path: p.display().to_string(), source })?;
            (Box::new(std::io::BufWriter::new(f)), p.display().to_string())
        }
        None => (Box::new(std::io::stdout().lock()), "<stdout>".into()),
    };
    let io = |source| Error::Io { path: shown.clone(), source };
    for part in parts {
        out.write_all(part.as_ref().as_bytes()).map_err(io)?;
    }
    out.flush().map_err(io)
}
