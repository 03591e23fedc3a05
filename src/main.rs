//! The `oomdoc` command line: parse arguments, call the library, map errors to exit codes.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use oomdoc::analysis::{self, At, Options};
use oomdoc::report::{self, Format};
use oomdoc::Error;

#[derive(Parser)]
#[command(
    name = "oomdoc",
    version,
    about = "Tells you why your GPU job ran out of memory, and what to change.",
    long_about = "Tells you why your GPU job ran out of memory, and what to change.\n\n\
        Give it what the failed job left behind. Today that is the PyTorch memory snapshot written by\n\
        torch.cuda.memory._dump_snapshot(); oomdoc reads every version (torch 1.13 to 2.15) without\n\
        executing the pickle.\n\n\
        Capture one with:\n    \
        torch.cuda.memory._record_memory_history(max_entries=100000)\n    \
        ... run the failing step ...\n    \
        torch.cuda.memory._dump_snapshot(\"mem_snapshot.pickle\")",
    after_help = "Exit codes: 0 ok, 2 bad input or usage (one line on stderr)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rebuild the allocator's state at the OOM (or the peak) and say what held the memory.
    #[command(after_help = "Examples:\n  oomdoc analyze mem_snapshot.pickle\n  \
        oomdoc analyze mem_snapshot.pickle --at peak --top 20\n  \
        oomdoc analyze mem_snapshot.pickle --format markdown -o incident.md\n  \
        oomdoc analyze mem_snapshot.pickle --format json | jq '.devices[0].oom'")]
    Analyze(AnalyzeArgs),
}

#[derive(clap::Args)]
struct AnalyzeArgs {
    /// Snapshot pickles (torch.cuda.memory._dump_snapshot).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Only this CUDA device.
    #[arg(long, value_name = "N")]
    device: Option<i64>,
    /// The moment to describe: oom, peak, end, a time after the trace start (12.5s, 300ms), or event:N.
    /// Default: the last OOM if there is one, else the peak.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    at: At,
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
    /// No progress bar, even on a terminal.
    #[arg(long)]
    no_progress: bool,
}

fn main() -> ExitCode {
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

fn run(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Analyze(args) => analyze(args),
    }
}

fn analyze(args: AnalyzeArgs) -> Result<ExitCode, Error> {
    let opts = Options {
        at: args.at.clone(),
        top: args.top,
        device: args.device,
    };
    let to_terminal = args.output.is_none() && std::io::stdout().is_terminal();
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => to_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    };
    let mut out = String::new();
    let mut combined: Option<analysis::Analysis> = None;
    for path in &args.files {
        let timing = std::env::var_os("OOMDOC_TIMING").is_some();
        let t0 = std::time::Instant::now();
        let tl = oomdoc::ingest::load(path, !args.no_progress)?;
        if timing {
            eprintln!(
                "oomdoc: read {} in {:.3} s",
                path.display(),
                t0.elapsed().as_secs_f64()
            );
        }
        let t1 = std::time::Instant::now();
        let a = analysis::analyze(&tl, &opts);
        if timing {
            eprintln!("oomdoc: analysed in {:.3} s", t1.elapsed().as_secs_f64());
        }
        let a = a.map_err(|m| Error::Usage(format!("{}: {m}", path.display())))?;
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
                out.push_str(&report::render(f, &a, &tl, color));
            }
        }
        // Freeing millions of small records takes longer than the process exit that reclaims them anyway.
        std::mem::forget(tl);
    }
    if let Some(c) = combined {
        out = serde_json::to_string_pretty(&c).expect("serialises") + "\n";
    }
    match &args.output {
        Some(p) => std::fs::write(p, out).map_err(|source| Error::Io {
            path: p.display().to_string(),
            source,
        })?,
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(out.as_bytes())
                .and_then(|_| stdout.flush())
                .map_err(|source| Error::Io {
                    path: "<stdout>".into(),
                    source,
                })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
