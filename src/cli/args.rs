//! The command line's arguments: what each subcommand takes, its help text, and how it becomes a
//! [`JobOptions`]. Parsing only; the commands themselves are in `commands.rs`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use oomdoc::analysis::{At, Options};
use oomdoc::job::JobOptions;
use oomdoc::report::Format;
use oomdoc::rules::Severity;

#[derive(Parser)]
#[command(
    name = "oomdoc",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("OOMDOC_BUILD"), ")"),
    about = "Tells you why your GPU job ran out of memory, and what to change.",
    long_about = "Tells you why your GPU job ran out of memory, and what to change.\n\n\
        Give it what the failed job left behind, any mix, each recognised by its content:\n  \
        PyTorch memory snapshots   torch.cuda.memory._dump_snapshot(), every version (torch 1.13 to 2.15),\n                             \
        one per rank; read without executing the pickle\n  \
        training and server logs   the CUDA out-of-memory message; vLLM's KV-cache lines\n  \
        nvidia-smi output          --query-gpu CSV logs, the default table, -q, dmon, pmon\n  \
        Nsight Systems exports     nsys stats CSV reports (or their folder), the SQLite export\n  \
        Nsight Compute exports     ncu --csv pages, or its human-readable output\n\
        Any of them may be compressed (gzip, zstd, xz, bzip2), in an archive (.tar, .tar.gz, .zip) or in a\n\
        folder. oomdoc rebuilds the allocator's state at the OOM, runs the OOM checklist (oomdoc rules)\n\
        and leads with a verdict: what filled the GPU, and the causes ranked by the bytes they explain.\n\n\
        Capture a snapshot with:\n    \
        torch.cuda.memory._record_memory_history(max_entries=100000)\n    \
        ... run the failing step ...\n    \
        torch.cuda.memory._dump_snapshot(\"mem_snapshot.pickle\")",
    after_help = "Exit codes: 0 ok, 1 findings at or above --fail-on, 2 bad input or usage (one line on stderr)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Rebuild the allocator's state at the OOM (or the peak), say what held the memory, and why it ran out.
    #[command(after_help = "Examples: one per kind of input\n  \
        oomdoc analyze mem_snapshot.pickle                   # a snapshot\n  \
        oomdoc analyze rank0.pickle rank1.pickle train.log   # snapshots per rank and the log\n  \
        oomdoc analyze train.log nvidia-smi.csv              # no snapshot: OOM message, nvidia-smi\n  \
        oomdoc analyze vllm_server.log                       # a vLLM server's KV cache\n  \
        oomdoc analyze report.sqlite ncu_details.csv         # Nsight Systems and Compute exports\n  \
        oomdoc analyze job-artifacts.tar.gz                  # an archive, a folder, a .zst file\n\
        Examples: with options\n  \
        oomdoc analyze mem_snapshot.pickle --at peak --top 20\n  \
        oomdoc analyze mem_snapshot.pickle --gpu-memory 80GiB\n  \
        oomdoc analyze mem_snapshot.pickle --format markdown -o incident.md\n  \
        oomdoc analyze mem_snapshot.pickle --format json | jq '.findings'\n  \
        oomdoc analyze mem_snapshot.pickle --fail-on warning   # exit 1 if anything was found\n  \
        oomdoc analyze mem_snapshot.pickle --max-peak 40GiB    # exit 1 if a GPU's peak is over it (CI)\n\
        The budget beside the snapshot: --config config.json --train --batch B --seq S (every model and run flag: \
        --help).")]
    Analyze(AnalyzeArgs),
    /// Print every fact the rules can test, with its value (the way to debug a rule).
    Facts(FactsArgs),
    /// List the rules in force.
    Rules(RulesArgs),
    /// Explain what a rule checks, why, and what it suggests.
    Explain(ExplainArgs),
    /// Browse the timeline and the live allocations at any moment in the terminal (opens at the OOM).
    #[command(after_help = "Keys: ←/→ step, PgUp/PgDn page, o OOM, p peak, Home/End, Tab panel, ↑/↓ select,\n  \
        Enter every frame of the stack, / filter, g group by stack, s sort, d next GPU, ? help, q quit.\n\n\
        Example:\n  oomdoc tui mem_snapshot.pickle")]
    Tui(TuiArgs),
    /// Compare two runs (before and after a change): the peak, bytes by kind and by allocating stack, free memory,
    /// findings, allocator settings.
    #[command(after_help = "Examples:\n  \
        oomdoc diff before.pickle after.pickle\n  \
        oomdoc diff main.pickle branch.pickle --fail-on-growth 5   # CI: exit 1 if the peak grew >5%\n  \
        oomdoc diff before.pickle after.pickle --format markdown -o memory-diff.md\n  \
        oomdoc diff main-report.json branch.pickle      # a report kept from the main branch's run")]
    Diff(DiffArgs),
    /// Replay the run through a model of PyTorch's caching allocator under other settings, another GPU or a
    /// changed workload: would it have fit?
    #[command(after_help = "Examples:\n  \
        oomdoc whatif mem_snapshot.pickle                                  # the standard knobs, tried\n  \
        oomdoc whatif mem_snapshot.pickle --set expandable_segments:True\n  \
        oomdoc whatif mem_snapshot.pickle --set max_split_size_mb:512 --gpu-memory 80GiB\n  \
        oomdoc whatif mem_snapshot.pickle --scale activation=0.75          # a smaller batch's activations\n  \
        oomdoc whatif mem_snapshot.pickle --drop-stack train.py:88         # without what that line allocates\n  \
        oomdoc whatif --validate fixtures/real/*.pickle                    # the model against the recorded segments")]
    Whatif(WhatifArgs),
    /// The memory budget before a run: every byte per GPU with its formula, a verdict, and what would fit.
    #[command(long_about = oomdoc::budget::args::BUDGET_HELP)]
    Budget(BudgetCommand),
    /// Serve the analysis to a coding assistant: a Model Context Protocol server on stdin/stdout.
    #[command(after_help = "Tools: analyze (files, folders, archives; at, device, top), diff (before, after), \
        whatif (files; set, scale, drop_stack), facts (files), budget (the budget command's flags), explain (a \
        rule), list_inputs (a folder). Each returns the report's JSON schema; a bad input is a tool \
        error with the command's one-line message.\n\n\
        In an assistant's MCP configuration:\n  \
        {\"mcpServers\": {\"oomdoc\": {\"command\": \"oomdoc\", \"args\": [\"mcp\"]}}}")]
    Mcp,
}

#[derive(clap::Args)]
pub struct BudgetCommand {
    #[command(flatten)]
    pub budget: oomdoc::budget::args::BudgetArgs,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(clap::Args)]
pub struct WhatifArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// An allocator setting as PYTORCH_CUDA_ALLOC_CONF writes it (expandable_segments:True, max_split_size_mb:512,
    /// roundup_power2_divisions:4, garbage_collection_threshold:0.8); repeat for several, all applied together, or
    /// paste a whole PYTORCH_CUDA_ALLOC_CONF (garbage_collection_threshold:0.6,max_split_size_mb:128).
    #[arg(long = "set", value_name = "KEY:VALUE", help_heading = "The change")]
    pub set: Vec<String>,
    /// Scale the requests of a kind of memory by a factor (activation=0.75: a batch of 6 instead of 8); `auto`
    /// as the factor searches the largest that fits.
    #[arg(long, value_name = "CATEGORY=FACTOR", help_heading = "The change")]
    pub scale: Vec<String>,
    /// Leave out the requests whose stack has this frame (file:line, or a function name): a leak fixed.
    #[arg(long, value_name = "FRAME", help_heading = "The change")]
    pub drop_stack: Vec<String>,
    /// Check the model instead: replay each trace under its recorded settings and compare the segments made with
    /// the segments torch recorded.
    #[arg(long)]
    pub validate: bool,
    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Text, help_heading = "Output")]
    pub format: Format,
}

#[derive(clap::Args)]
pub struct DiffArgs {
    /// The run before the change: a snapshot (plain, compressed, or the one snapshot of an archive or folder), or an
    /// oomdoc JSON report of one kept from earlier (written with --top 50 it compares as the snapshot does).
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The run after the change.
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// Output format (default: from the -o file's name, else text). html: both timelines on one axis, the
    /// difference by kind and by stack as diverging bars, the two verdicts side by side.
    #[arg(long, short = 'f', value_enum)]
    pub format: Option<Format>,
    /// Write the comparison to FILE instead of standard output (diff.html: the page).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// How the page lines the two timelines up: event (event i above event i), time (since each trace's first
    /// event) or iteration (pass i of the loop above pass i, where each run's iterations are found); time and
    /// iteration fall back to event when a trace lacks them.
    #[arg(long, value_enum, default_value_t = oomdoc::report::diff_html::Align::Event)]
    pub align: oomdoc::report::diff_html::Align,
    /// For CI: exit with code 1 when the peak allocated memory grew by more than PCT percent.
    #[arg(long, value_name = "PCT")]
    pub fail_on_growth: Option<f64>,
    /// The moment to compare in each run: oom, peak, end, a time, or event:N. Default: the OOM, else the peak.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    pub at: At,
}

#[derive(clap::Args)]
pub struct TuiArgs {
    #[command(flatten)]
    pub input: InputArgs,
}

#[derive(clap::Args)]
pub struct InputArgs {
    /// The job's artifacts, any mix: snapshot pickles (torch.cuda.memory._dump_snapshot), training logs with the
    /// OOM message, vLLM logs, nvidia-smi output, Nsight Systems and Nsight Compute exports; compressed (gzip,
    /// zstd, xz, bzip2), in archives (tar, zip) or folders. Each is recognised by its content.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Read every file as this kind instead of recognising it.
    #[arg(long, value_enum, value_name = "KIND", help_heading = "Reading the inputs")]
    pub kind: Option<oomdoc::ingest::Kind>,
    /// Lines that cannot be used inside a recognised block are errors (default: skipped and counted).
    #[arg(long, help_heading = "Reading the inputs")]
    pub strict: bool,
    /// Column names of a `noheader` nvidia-smi CSV, as given to --query-gpu (timestamp,index,memory.used,…).
    #[arg(long, value_name = "A,B,C", value_delimiter = ',', help_heading = "Reading the inputs")]
    pub columns: Option<Vec<String>>,
    /// The zone nvidia-smi and log timestamps were written in (UTC, +02:00, -0530). Default: inferred from the
    /// snapshot's clock when there is one.
    #[arg(long, value_name = "ZONE", value_parser = oomdoc::timeline::clock::parse_tz, help_heading = "Reading the inputs")]
    pub tz: Option<i64>,
    /// Shift every text artifact's times by this many seconds (a host clock that was off).
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true, help_heading = "Reading the inputs")]
    pub clock_offset: Option<f64>,
    /// Only this CUDA device.
    #[arg(long, value_name = "N", help_heading = "The moment and the GPU")]
    pub device: Option<i64>,
    /// The moment to describe: oom, peak, end, a time after the trace start (12.5s, 300ms), or event:N.
    /// Default: the last OOM if there is one, else the peak.
    #[arg(long, value_name = "WHEN", default_value = "auto", help_heading = "The moment and the GPU")]
    pub at: At,
    /// The GPU's total memory (e.g. 80GiB, 40GB, 81559347200): lets oomdoc size memory outside PyTorch at an OOM.
    #[arg(long, value_name = "BYTES", value_parser = oomdoc::units::parse_size_arg, help_heading = "The moment and the GPU")]
    pub gpu_memory: Option<u64>,
    /// The process's memory cap, set with torch.cuda.set_per_process_memory_fraction (the fraction × the GPU's
    /// memory): a capped process runs out with the device still free. Read from the OOM message when one is given;
    /// `oomdoc.record()` passes it.
    #[arg(long, value_name = "BYTES", value_parser = oomdoc::units::parse_size_arg, help_heading = "The moment and the GPU")]
    pub memory_cap: Option<u64>,
    /// A folder of rule files (*.toml) that add to or override the built-in ones; a categories.toml there adds
    /// category patterns.
    #[arg(long, value_name = "DIR", help_heading = "Reading the inputs")]
    pub rules: Option<PathBuf>,
    /// No progress bar, even on a terminal.
    #[arg(long, help_heading = "Reading the inputs")]
    pub no_progress: bool,
    /// An archive or folder with more members than this is refused (a guard against hostile archives).
    #[arg(long, value_name = "N", default_value_t = 10_000, help_heading = "Reading the inputs")]
    pub max_members: usize,
    /// An input that unpacks (decompresses, all its members together) to more than this is refused.
    #[arg(long, value_name = "BYTES", value_parser = oomdoc::units::parse_size_arg, default_value = "256GiB", help_heading = "Reading the inputs")]
    pub max_unpacked: u64,
    /// A compressed input or member that unpacks to more than this many times its stored size (past 64 MiB) is
    /// refused as a decompression bomb. Real snapshots compress 10–40×.
    #[arg(long, value_name = "N", default_value_t = 1000, help_heading = "Reading the inputs")]
    pub max_ratio: u64,
    // With --model (a config.json) or model flags: the budget's prediction per category beside the snapshot.
    #[command(flatten)]
    pub predict: oomdoc::budget::args::PredictArgs,
}

#[derive(clap::Args)]
pub struct AnalyzeArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// How many live allocations and stacks to list.
    #[arg(long, value_name = "N", default_value_t = 10, help_heading = "Output")]
    pub top: usize,
    /// Output format [default: text, or what the -o file's name says: .html, .md, .json].
    #[arg(long, short = 'f', value_enum, help_heading = "Output")]
    pub format: Option<Format>,
    /// Write the report to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE", help_heading = "Output")]
    pub output: Option<PathBuf>,
    /// Colour: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_name = "WHEN", value_enum, default_value_t = Color::Auto, help_heading = "Output")]
    pub color: Color,
    /// Exit with code 1 when a finding of this severity or worse is raised.
    #[arg(long, value_name = "SEVERITY", value_enum, help_heading = "CI gates")]
    pub fail_on: Option<Severity>,
    /// For CI: exit with code 1 when any GPU's peak allocated memory is over SIZE (e.g. 40GiB), saying which.
    #[arg(long, value_name = "SIZE", value_parser = oomdoc::units::parse_size_arg, help_heading = "CI gates")]
    pub max_peak: Option<u64>,
    /// For CI: exit with code 1 when any GPU's peak reserved memory is over SIZE, saying which.
    #[arg(long, value_name = "SIZE", value_parser = oomdoc::units::parse_size_arg, help_heading = "CI gates")]
    pub max_reserved: Option<u64>,
}

#[derive(clap::Args)]
pub struct FactsArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Print as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct RulesArgs {
    /// Also load rules from this folder.
    #[arg(long, value_name = "DIR")]
    pub rules: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct ExplainArgs {
    /// The rule id (see `oomdoc rules`).
    pub rule: String,
    /// Also load rules from this folder.
    #[arg(long, value_name = "DIR")]
    pub rules: Option<PathBuf>,
}

/// When the text report is coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Color {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    Always,
    Never,
}

impl InputArgs {
    /// The job these arguments describe; `top`: how many live allocations and stacks a report lists.
    pub fn job_options(&self, top: usize) -> JobOptions {
        JobOptions {
            files: self.files.clone(),
            load: oomdoc::ingest::LoadOptions {
                show_progress: !self.no_progress,
                kind: self.kind,
                strict: self.strict,
                columns: self.columns.clone(),
                clock: oomdoc::timeline::clock::ClockOptions {
                    tz_offset_s: self.tz,
                    offset_us: self.clock_offset.map_or(0, |s| (s * 1e6).round() as i64),
                },
                limits: oomdoc::ingest::unpack::Limits {
                    max_members: self.max_members,
                    max_unpacked_bytes: self.max_unpacked,
                    max_ratio: self.max_ratio,
                },
                defer_snapshot_files: false,
                split_read: split_read_from_env(),
            },
            analysis: Options {
                at: self.at.clone(),
                top,
                device: self.device,
                gpu_memory: self.gpu_memory,
                memory_cap: self.memory_cap,
                chart_categories: false,
            },
            rules_dir: self.rules.clone(),
            predict: self.predict.clone(),
            keep_replays: false,
            timing: std::env::var_os("OOMDOC_TIMING").is_some(),
        }
    }
}

/// The command line, with the budget's model and run flags (which `analyze`, `facts` and `tui` take to put a
/// prediction beside a snapshot) left out of those commands' short help (`-h`): `--help` lists them all.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().mut_subcommands(|sub| {
        if sub.get_name() == "budget" {
            return sub;
        }
        sub.mut_args(|a| match a.get_help_heading() {
            Some(h) if [oomdoc::budget::args::MODEL_HEADING, oomdoc::budget::args::RUN_HEADING].contains(&h) => {
                a.hide_short_help(true)
            }
            _ => a,
        })
    })
}

/// Parses the process's arguments with [`command`].
pub fn parse() -> Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    Cli::from_arg_matches(&command().try_get_matches()?)
}

/// How a long trace is read, from the environment (for measurements and the tests): `OOMDOC_SPLIT=0` reads on one
/// thread, `OOMDOC_SPLIT_MIN_BYTES` sets the size from which a second core helps (default 32 MiB), and
/// `OOMDOC_SPLIT_PATIENT=1` makes the helper read its whole part whatever the timing.
fn split_read_from_env() -> Option<oomdoc::ingest::SplitRead> {
    if std::env::var_os("OOMDOC_SPLIT").is_some_and(|v| v == "0") {
        return None;
    }
    let mut split = oomdoc::ingest::SplitRead::default();
    if let Some(min) = std::env::var("OOMDOC_SPLIT_MIN_BYTES").ok().and_then(|v| v.parse().ok()) {
        split.min_bytes = min;
    }
    split.patient = std::env::var_os("OOMDOC_SPLIT_PATIENT").is_some_and(|v| v == "1");
    Some(split)
}
