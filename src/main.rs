//! The `oomdoc` command line: parse arguments, call the library, map errors to exit codes.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use oomdoc::analysis::{self, At, Options};
use oomdoc::report::{self, Format};
use oomdoc::rules::{RuleSet, Severity};
use oomdoc::Error;

#[derive(Parser)]
#[command(
    name = "oomdoc",
    version,
    about = "Tells you why your GPU job ran out of memory, and what to change.",
    long_about = "Tells you why your GPU job ran out of memory, and what to change.\n\n\
        Give it what the failed job left behind. Today that is the PyTorch memory snapshot written by\n\
        torch.cuda.memory._dump_snapshot(); oomdoc reads every version (torch 1.13 to 2.15) without\n\
        executing the pickle, rebuilds the allocator's state at the OOM, and runs the OOM checklist\n\
        (see `oomdoc rules`).\n\n\
        Capture one with:\n    \
        torch.cuda.memory._record_memory_history(max_entries=100000)\n    \
        ... run the failing step ...\n    \
        torch.cuda.memory._dump_snapshot(\"mem_snapshot.pickle\")",
    after_help = "Exit codes: 0 ok, 1 findings at or above --fail-on, 2 bad input or usage (one line on stderr)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rebuild the allocator's state at the OOM (or the peak), say what held the memory, and why it ran out.
    #[command(after_help = "Examples:\n  oomdoc analyze mem_snapshot.pickle\n  \
        oomdoc analyze mem_snapshot.pickle --at peak --top 20\n  \
        oomdoc analyze mem_snapshot.pickle --gpu-memory 80GiB\n  \
        oomdoc analyze mem_snapshot.pickle --format markdown -o incident.md\n  \
        oomdoc analyze mem_snapshot.pickle --format json | jq '.findings'\n  \
        oomdoc analyze mem_snapshot.pickle --fail-on warning   # exit 1 if anything was found")]
    Analyze(AnalyzeArgs),
    /// Print every fact the rules can test, with its value (the way to debug a rule).
    Facts(FactsArgs),
    /// List the rules in force.
    Rules(RulesArgs),
    /// Explain what a rule checks, why, and what it suggests.
    Explain(ExplainArgs),
    /// Browse the timeline and the live allocations at any moment in the terminal (opens at the OOM).
    #[command(after_help = "Keys: ←/→ step, PgUp/PgDn page, o OOM, p peak, Home/End, Tab panel, ↑/↓ select,\n  \
        Enter open, / filter, g group by stack, s sort, d next GPU, ? help, q quit.\n\n\
        Example:\n  oomdoc tui mem_snapshot.pickle")]
    Tui(TuiArgs),
    /// The memory budget before a run: every byte per GPU with its formula, a verdict, and what would fit.
    #[command(long_about = oomdoc::budget::args::BUDGET_HELP)]
    Budget(oomdoc::budget::args::BudgetArgs),
}

#[derive(clap::Args)]
struct TuiArgs {
    #[command(flatten)]
    input: InputArgs,
}

#[derive(clap::Args)]
struct InputArgs {
    /// The job's artifacts, any mix: snapshot pickles (torch.cuda.memory._dump_snapshot), training logs with the
    /// OOM message, vLLM logs, nvidia-smi output. Each file is recognised by its content.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Read every file as this kind instead of recognising it.
    #[arg(long, value_enum, value_name = "KIND")]
    kind: Option<oomdoc::ingest::Kind>,
    /// Lines that cannot be used inside a recognised block are errors (default: skipped and counted).
    #[arg(long)]
    strict: bool,
    /// Column names of a `noheader` nvidia-smi CSV, as given to --query-gpu (timestamp,index,memory.used,…).
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    columns: Option<Vec<String>>,
    /// The zone nvidia-smi and log timestamps were written in (UTC, +02:00, -0530). Default: inferred from the
    /// snapshot's clock when there is one.
    #[arg(long, value_name = "ZONE", value_parser = oomdoc::timeline::clock::parse_tz)]
    tz: Option<i64>,
    /// Shift every text artifact's times by this many seconds (a host clock that was off).
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    clock_offset: Option<f64>,
    /// Only this CUDA device.
    #[arg(long, value_name = "N")]
    device: Option<i64>,
    /// The moment to describe: oom, peak, end, a time after the trace start (12.5s, 300ms), or event:N.
    /// Default: the last OOM if there is one, else the peak.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    at: At,
    /// The GPU's total memory (e.g. 80GiB, 40GB, 81559347200): lets oomdoc size memory outside PyTorch at an OOM.
    #[arg(long, value_name = "BYTES", value_parser = oomdoc::units::parse_size_arg)]
    gpu_memory: Option<u64>,
    /// A folder of rule files (*.toml) that add to or override the built-in ones; a categories.toml there adds
    /// category patterns.
    #[arg(long, value_name = "DIR")]
    rules: Option<PathBuf>,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    no_progress: bool,
    // With --model (a config.json) or model flags: the budget's prediction per category beside the snapshot.
    #[command(flatten)]
    predict: oomdoc::budget::args::PredictArgs,
}

#[derive(clap::Args)]
struct AnalyzeArgs {
    #[command(flatten)]
    input: InputArgs,
    /// How many live allocations and stacks to list.
    #[arg(long, value_name = "N", default_value_t = 10)]
    top: usize,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the report to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Colour: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,
    /// Exit with code 1 when a finding of this severity or worse is raised.
    #[arg(long, value_name = "SEVERITY", value_parser = ["info", "warning", "error"])]
    fail_on: Option<String>,
}

#[derive(clap::Args)]
struct FactsArgs {
    #[command(flatten)]
    input: InputArgs,
    /// Print as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct RulesArgs {
    /// Also load rules from this folder.
    #[arg(long, value_name = "DIR")]
    rules: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ExplainArgs {
    /// The rule id (see `oomdoc rules`).
    rule: String,
    /// Also load rules from this folder.
    #[arg(long, value_name = "DIR")]
    rules: Option<PathBuf>,
}

fn main() -> ExitCode {
    install_panic_hook();
    // How the tests see the hook at work (tests/it/bad_input.rs).
    if std::env::var_os("OOMDOC_TEST_PANIC").is_some() {
        panic!("OOMDOC_TEST_PANIC is set");
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if let Error::Io { source, .. } = &e {
                if source.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("oomdoc: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The last line of defence: a panic is a bug, and the user gets one line saying so and where (exit 3), not a
/// backtrace, unless they asked for one with RUST_BACKTRACE.
fn install_panic_hook() {
    if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    std::panic::set_hook(Box::new(|info| {
        let at =
            info.location().map_or_else(|| "an unknown place".to_string(), |l| format!("{}:{}", l.file(), l.line()));
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("oomdoc: internal error at {at}: {what}: this is a bug; please report it with the file it read");
        std::process::exit(3);
    }));
}

fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Analyze(args) => analyze(args),
        Command::Facts(args) => facts(args),
        Command::Tui(args) => tui(args),
        Command::Budget(args) => {
            write_out(None, &oomdoc::budget::args::run_cli(&args)?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Rules(args) => {
            let rules = load_rules(args.rules.as_ref())?;
            let mut out = String::new();
            for r in &rules.rules {
                let sev: Vec<&str> = r.cases.iter().map(|c| c.severity.name()).collect();
                out.push_str(&format!("{:<20} {:<16} {}\n", r.id, sev.join("/"), r.title));
            }
            out.push_str("\n`oomdoc explain RULE` says what a rule checks and why.\n");
            write_out(None, &out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain(args) => {
            let rules = load_rules(args.rules.as_ref())?;
            let r = rules.get(&args.rule).ok_or_else(|| {
                let ids: Vec<&str> = rules.rules.iter().map(|r| r.id.as_str()).collect();
                Error::Usage(format!("no rule {:?}; the rules are: {}", args.rule, ids.join(", ")))
            })?;
            let mut out = format!("{} — {}\n\n{}\n", r.id, r.title, r.explain.trim());
            for c in &r.cases {
                out.push_str(&format!(
                    "\n{} when:\n  {}\nfix:\n  {}\n",
                    c.severity.name(),
                    c.when_src.split_whitespace().collect::<Vec<_>>().join(" "),
                    c.fix
                ));
            }
            if !r.references.is_empty() {
                out.push_str("\nReferences:\n");
                for link in &r.references {
                    out.push_str(&format!("  {link}\n"));
                }
            }
            out.push_str(&format!("\nDefined in {}.\n", r.source));
            write_out(None, &out)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn load_rules(dir: Option<&PathBuf>) -> Result<RuleSet, Error> {
    let mut rules = RuleSet::builtin();
    if let Some(d) = dir {
        rules.extend_from_dir(d)?;
    }
    Ok(rules)
}

fn load_categories(dir: Option<&PathBuf>) -> Result<analysis::categories::Categorizer, Error> {
    let mut sources = vec![("rules/categories.toml".to_string(), oomdoc::rules::builtin_categories().to_string())];
    if let Some(d) = dir {
        let p = d.join("categories.toml");
        if p.exists() {
            let text =
                std::fs::read_to_string(&p).map_err(|e| Error::Io { path: p.display().to_string(), source: e })?;
            sources.push((p.display().to_string(), text));
        }
    }
    let refs: Vec<(&str, &str)> = sources.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    analysis::categories::Categorizer::new(&refs).map_err(Error::Usage)
}

/// Reads every input and analyses it, handing each (timeline, analysis) to `each`.
fn for_each_input(
    input: &InputArgs,
    top: usize,
    mut each: impl FnMut(&oomdoc::timeline::Timeline, analysis::Analysis) -> Result<(), Error>,
) -> Result<(), Error> {
    let opts = Options { at: input.at.clone(), top, device: input.device, gpu_memory: input.gpu_memory };
    let timing = std::env::var_os("OOMDOC_TIMING").is_some();
    let load = oomdoc::ingest::LoadOptions {
        show_progress: !input.no_progress,
        kind: input.kind,
        strict: input.strict,
        columns: input.columns.clone(),
        clock: oomdoc::timeline::clock::ClockOptions {
            tz_offset_s: input.tz,
            offset_us: input.clock_offset.map_or(0, |s| (s * 1e6).round() as i64),
        },
    };
    let t0 = std::time::Instant::now();
    // The checklist, categories and budget are made while the inputs are read: neither needs the other. A bad
    // rule is still reported before a bad input.
    let (setup, timelines) = std::thread::scope(|s| {
        let setup = analysis::beside(s, || -> Result<_, Error> {
            let rules = load_rules(input.rules.as_ref())?;
            let prediction = oomdoc::budget::args::predict(&input.predict)?;
            Ok((rules, prediction, load_categories(input.rules.as_ref())?))
        });
        let timelines = oomdoc::ingest::load_job(&input.files, &load);
        (setup(), timelines)
    });
    let (rules, prediction, cats) = setup?;
    let timelines = timelines?;
    if timing {
        eprintln!("oomdoc: read {} files in {:.3} s{}", input.files.len(), t0.elapsed().as_secs_f64(), peak_rss());
    }
    for tl in timelines {
        let t1 = std::time::Instant::now();
        let shown = tl.inputs.first().map_or(String::new(), |i| i.path.clone());
        let mut a = analysis::analyze(&tl, &opts, &cats).map_err(|m| Error::Usage(format!("{shown}: {m}")))?;
        if let Some(b) = &prediction {
            oomdoc::budget::compare::attach(&mut a, b);
        }
        rules.apply(&mut a);
        if timing {
            eprintln!("oomdoc: analysed in {:.3} s{}", t1.elapsed().as_secs_f64(), peak_rss());
        }
        each(&tl, a)?;
        // Freeing millions of small records takes longer than the process exit that reclaims them anyway.
        std::mem::forget(tl);
    }
    Ok(())
}

/// `, peak RSS N MiB` where /proc tells it (Linux), for OOMDOC_TIMING.
fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l[6..].trim().to_string()))
        .map_or(String::new(), |v| format!(", peak RSS {v}"))
}

fn write_out(path: Option<&PathBuf>, text: &str) -> Result<(), Error> {
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

fn analyze(args: AnalyzeArgs) -> Result<ExitCode, Error> {
    let to_terminal = args.output.is_none() && std::io::stdout().is_terminal();
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => to_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    };
    let fail_on = args.fail_on.as_deref().and_then(Severity::parse);
    let mut out = String::new();
    let mut combined: Option<analysis::Analysis> = None;
    let mut worst: Option<Severity> = None;
    for_each_input(&args.input, args.top, |tl, a| {
        for f in &a.findings {
            worst = worst.max(Severity::parse(&f.severity));
        }
        match args.format {
            Format::Json => match &mut combined {
                None => combined = Some(a),
                Some(c) => {
                    c.inputs.extend(a.inputs);
                    c.devices.extend(a.devices);
                    c.findings.extend(a.findings);
                }
            },
            f => {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&report::render(f, &a, tl, color));
            }
        }
        Ok(())
    })?;
    if let Some(c) = combined {
        out = serde_json::to_string_pretty(&c).expect("serialises") + "\n";
    }
    write_out(args.output.as_ref(), &out)?;
    let failed = matches!((fail_on, worst), (Some(f), Some(w)) if w >= f);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn tui(args: TuiArgs) -> Result<ExitCode, Error> {
    let mut snapshots = 0;
    for f in &args.input.files {
        let kind = match args.input.kind {
            Some(k) => k,
            None if f.is_dir() => oomdoc::ingest::Kind::Nsys,
            None => oomdoc::ingest::sniff_file(f)?,
        };
        snapshots += usize::from(kind == oomdoc::ingest::Kind::Snapshot);
    }
    if snapshots > 1 {
        return Err(Error::Usage(
            "oomdoc tui opens one snapshot at a time (with any logs, nvidia-smi or Nsight exports beside it); run it \
             once per snapshot"
                .into(),
        ));
    }
    if !std::io::stdout().is_terminal() {
        return Err(Error::Usage("oomdoc tui needs a terminal; use `oomdoc analyze` for a report".into()));
    }
    let cats = load_categories(args.input.rules.as_ref())?;
    for_each_input(&args.input, 10, |tl, a| {
        let path = a.inputs.first().map_or(String::new(), |i| format!("{} ({})", i.path, i.format_version));
        let mut app = oomdoc::tui::App::new(tl, &a, &cats, path);
        oomdoc::tui::run(&mut app).map_err(|source| Error::Io { path: "<terminal>".into(), source })
    })?;
    Ok(ExitCode::SUCCESS)
}

fn facts(args: FactsArgs) -> Result<ExitCode, Error> {
    let mut out = String::new();
    let mut json = serde_json::Map::new();
    for_each_input(&args.input, 10, |_, a| {
        let input = a.inputs.last().map_or("", |i| i.path.as_str()).to_string();
        // Per device, then the job's own facts (logs, profiler exports), then each Nsight Compute launch's.
        let mut groups: Vec<(String, &oomdoc::analysis::facts::Facts)> =
            a.devices.iter().map(|d| (format!("{input}#{}", d.device), &d.facts)).collect();
        if a.job_facts.iter().next().is_some() {
            groups.push((format!("{input} (job)"), &a.job_facts));
        }
        for (i, k) in a.kernel_facts.iter().enumerate() {
            groups.push((format!("{input} kernel #{i}"), k));
        }
        for (key, facts) in groups {
            if args.json {
                let mut m = serde_json::Map::new();
                for (name, f) in facts.iter() {
                    m.insert(name.clone(), serde_json::Value::String(f.display("")));
                }
                json.insert(key, serde_json::Value::Object(m));
                continue;
            }
            out.push_str(&format!("{key}\n"));
            for (name, f) in facts.iter() {
                out.push_str(&format!("  {:<40} {:<24} {}\n", name, f.display(""), f.doc));
            }
        }
        Ok(())
    })?;
    if args.json {
        out = serde_json::to_string_pretty(&json).expect("json") + "\n";
    }
    write_out(None, &out)?;
    Ok(ExitCode::SUCCESS)
}
