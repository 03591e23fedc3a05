//! `oomdoc mcp`: the pipeline as Model Context Protocol tools, over stdio, for coding assistants. Each tool runs the
//! same library code as its command and returns the report's own JSON schema as structured content (`analyze` the
//! CLI's `--format json` document, `diff` the diff's), so an assistant reads the verdict, the causes and the evidence
//! rather than parsing text. A bad input is a tool error carrying the CLI's one-line message; the server keeps no
//! state between calls and reads only the paths it is given. Standard output is the protocol's: nothing else is
//! written there (no progress bar; diagnostics go to stderr).

use std::path::PathBuf;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::Value;

use crate::analysis::At;
use crate::job::{Checklist, Job, JobOptions};
use crate::report::{self, Format};
use crate::Error;

/// A report larger than this is summarised (the job view, each GPU's verdict), with how to ask for the rest.
const MAX_REPORT_BYTES: usize = 1 << 20;

const INSTRUCTIONS: &str = "oomdoc tells why a PyTorch GPU job ran out of memory and what to change. Ask the user \
for what the failed job left: the memory snapshot(s) (oom-<rank>.pickle from oomdoc.record(), or \
torch.cuda.memory._dump_snapshot), the training or server log with the OOM message, nvidia-smi output; any mix, \
files, folders or archives. Call `analyze` on them first: lead with devices[].verdict.summary, then the causes \
ranked by the bytes they explain, the proven what-ifs (devices[].verdict.proven; a line \"not proven for the run\" \
is not a proof) and each finding's fix; devices[].verdict.capture_advice, where present, says how to record the \
next run so its file names what this one could not. With no artifact at all, tell the user to add `import oomdoc; \
oomdoc.record()` at the top of the training script and run it again. `diff` compares two runs (before and after a change); `explain` says what a rule checks; `list_inputs` \
says what each file of a folder is read as.";

#[derive(Deserialize, schemars::JsonSchema)]
pub struct AnalyzeParams {
    /// Paths of the failed job's artifacts, any mix: snapshot pickles (plain or compressed), training or server
    /// logs, nvidia-smi output, Nsight exports, oomdoc JSON reports, folders or archives of them.
    pub files: Vec<String>,
    /// The moment to describe: "auto" (the OOM, else the peak; default), "oom", "peak", "end", "event:N", or a
    /// time into the trace such as "2.5s".
    pub at: Option<String>,
    /// Only this GPU (its CUDA ordinal).
    pub device: Option<i64>,
    /// How many of the largest allocations and stacks to list per GPU (default 5).
    pub top: Option<usize>,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub struct DiffParams {
    /// The run before the change: a snapshot, or an oomdoc JSON report kept from it.
    pub before: String,
    /// The run after the change.
    pub after: String,
    /// The moment to compare in each run (as in `analyze`; default: the OOM, else the peak).
    pub at: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub struct WhatifParams {
    /// The failed job's snapshot(s), with its logs if any (an OOM message gives the GPU's capacity).
    pub files: Vec<String>,
    /// Allocator settings to try, as in PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True",
    /// "max_split_size_mb:512", "garbage_collection_threshold:0.6" …
    #[serde(default)]
    pub set: Vec<String>,
    /// Bytes of a kind scaled: "activation=0.75" (a smaller batch), "kv_cache=0.5", or "activation=auto" (the
    /// largest scale that fits).
    #[serde(default)]
    pub scale: Vec<String>,
    /// Allocations of a line left out: "train.py:88" (a leak freed).
    #[serde(default)]
    pub drop_stack: Vec<String>,
    /// The GPU's memory when nothing in the files says it: "80GiB".
    pub gpu_memory: Option<String>,
    /// Only this GPU.
    pub device: Option<i64>,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub struct FactsParams {
    /// The files to analyze (as for `analyze`).
    pub files: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub struct BudgetParams {
    /// The flags of `oomdoc budget`, one word each: ["--params", "7e9", "--train", "--batch", "8", "--seq",
    /// "4096", "--gpu", "h100-80gb"], or a model's config: ["--config", "config.json", "--infer", …].
    pub args: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub struct ExplainParams {
    /// A rule's id, as findings name it: "fragmentation", "leaked-references", "unbounded-kv-growth", …
    pub rule: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub struct ListInputsParams {
    /// A folder (or one file): each file in it is named with what oomdoc reads it as.
    pub path: String,
}

/// The server: the tools, and nothing else (no state between calls).
#[derive(Clone)]
pub struct Server {
    tool_router: ToolRouter<Self>,
}

impl Default for Server {
    fn default() -> Self {
        Self::new()
    }
}

/// A failed call as the assistant sees it: the CLI's one-line message.
fn failed(e: impl std::fmt::Display) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("oomdoc: error: {e}"))])
}

fn at_of(at: Option<&str>) -> Result<At, String> {
    at.map_or(Ok(At::Auto), str::parse)
}

/// Paths must exist before any work starts: one clear line for a wrong one, not a partial report.
fn checked(paths: &[String]) -> Result<Vec<PathBuf>, String> {
    if paths.is_empty() {
        return Err("give at least one file, folder or archive".into());
    }
    paths
        .iter()
        .map(|p| {
            let path = PathBuf::from(p);
            match std::fs::metadata(&path) {
                Ok(_) => Ok(path),
                Err(e) => Err(format!("{p}: {e}")),
            }
        })
        .collect()
}

/// `oomdoc analyze --format json` on these inputs, as a value.
fn analyze(p: AnalyzeParams) -> Result<Value, String> {
    let files = checked(&p.files)?;
    let mut options = JobOptions::new(files);
    options.load.show_progress = false;
    options.load.defer_snapshot_files = true;
    options.analysis.at = at_of(p.at.as_deref())?;
    options.analysis.device = p.device;
    options.analysis.top = p.top.unwrap_or(5);
    let job = Job::read(&options).map_err(|e| e.to_string())?;
    if let Some(e) = job.failed.first() {
        return Err(e.to_string());
    }
    let mut ranks = Vec::new();
    for rank in job.each_rank(|analysed| report::RankOutput::of(Format::Json, analysed, false)) {
        ranks.push(rank.map_err(|e| e.to_string())?);
    }
    if ranks.is_empty() && job.reported.is_empty() {
        return Err("nothing to report: no input gave a snapshot, a log or a report".into());
    }
    let text: String = report::render_job(Format::Json, ranks, &job.reported, false).concat();
    if text.len() > MAX_REPORT_BYTES {
        let full: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        return Ok(summary(&full, text.len()));
    }
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// A report too large to hand over whole: the job view, the inputs and each GPU's verdict, and how to get the rest.
fn summary(full: &Value, len: usize) -> Value {
    let devices: Vec<Value> = full["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| serde_json::json!({"device": d["device"], "verdict": d["verdict"], "oom": d["oom"]}))
        .collect();
    serde_json::json!({
        "summarised": true,
        "full_report_bytes": len,
        "rest": "the full report is larger than one answer: call analyze with one of the inputs, or with device=N, \
                 for a GPU's whole report",
        "inputs": full["inputs"],
        "job": full.get("job").cloned().unwrap_or(Value::Null),
        "findings": full["findings"],
        "devices": devices,
    })
}

fn diff(p: DiffParams) -> Result<Value, String> {
    let paths = checked(&[p.before, p.after])?;
    let at = at_of(p.at.as_deref())?;
    let (before, _) = crate::job::compared_run(&paths[0], &at).map_err(|e| e.to_string())?;
    let (after, _) = crate::job::compared_run(&paths[1], &at).map_err(|e| e.to_string())?;
    serde_json::to_value(crate::analysis::diff::of(&before, &after)).map_err(|e| e.to_string())
}

fn whatif(p: WhatifParams) -> Result<Value, String> {
    let files = checked(&p.files)?;
    let gpu_memory = p.gpu_memory.as_deref().map(crate::units::parse_size_arg).transpose()?;
    let plan =
        crate::analysis::whatif::Plan::parse(&p.set, &p.scale, &p.drop_stack, gpu_memory).map_err(|e| e.to_string())?;
    if plan.is_empty() {
        return Err("say what to try: set (a setting), scale (a kind's bytes) or drop_stack (a line)".into());
    }
    let mut options = JobOptions::new(files);
    options.load.show_progress = false;
    let out =
        report::whatif::run(options, &plan, false, p.device, None, &Checklist::builtin()).map_err(|e| e.to_string())?;
    if let Some(e) = out.errors.first() {
        return Err(e.clone());
    }
    if out.results.is_empty() {
        return Err("no input holds an allocator trace (a snapshot recorded with _record_memory_history)".into());
    }
    Ok(report::whatif::whatif_json(&out.results))
}

fn facts(p: FactsParams) -> Result<Value, String> {
    let mut options = JobOptions::new(checked(&p.files)?);
    options.load.show_progress = false;
    let job = Job::read(&options).map_err(|e| e.to_string())?;
    if let Some(e) = job.failed.first() {
        return Err(e.to_string());
    }
    let analysed = job.analyze().collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    let analyses: Vec<&crate::analysis::Analysis> = analysed.iter().map(|a| &a.analysis).collect();
    serde_json::from_str(&report::facts_table::render(&analyses, true)).map_err(|e| e.to_string())
}

fn budget(p: BudgetParams) -> Result<Value, String> {
    #[derive(clap::Parser)]
    #[command(name = "budget", no_binary_name = true)]
    struct Flags {
        #[command(flatten)]
        budget: crate::budget::args::BudgetArgs,
    }
    // clap's message is several lines with a usage: the first says what was wrong.
    let flags = <Flags as clap::Parser>::try_parse_from(&p.args).map_err(|e| {
        e.to_string().lines().next().unwrap_or("bad budget flags").trim_start_matches("error: ").to_string()
    })?;
    let b = crate::budget::args::budget(&flags.budget).map_err(|e| e.to_string())?;
    serde_json::from_str(&report::budget::render(&b, Format::Json)).map_err(|e| e.to_string())
}

fn explain(p: ExplainParams) -> Result<String, String> {
    let rules = Checklist::builtin().rules;
    report::rule_list::explain(&rules, &p.rule).map_err(|e: Error| e.to_string())
}

fn list_inputs(p: ListInputsParams) -> Result<Value, String> {
    let root = checked(&[p.path])?.remove(0);
    let mut files = Vec::new();
    if root.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&root)
            .map_err(|e| format!("{}: {e}", root.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        files.extend(entries);
    } else {
        files.push(root);
    }
    let rows: Vec<Value> = files
        .iter()
        .map(|f| {
            let kind = if f.is_dir() {
                Ok("folder (read as a job: each file in it)".to_string())
            } else {
                // Named as `--kind` names it.
                crate::ingest::sniff_file(f).map(|k| {
                    clap::ValueEnum::to_possible_value(&k).map_or(format!("{k:?}"), |v| v.get_name().to_string())
                })
            };
            match kind {
                Ok(k) => serde_json::json!({"path": f.display().to_string(), "read_as": k}),
                Err(e) => serde_json::json!({"path": f.display().to_string(), "not_read": e.to_string()}),
            }
        })
        .collect();
    Ok(serde_json::json!({ "files": rows }))
}

/// Runs a call's work off the protocol's thread (an analysis takes a core for as long as it needs) and turns its
/// outcome into a tool result.
async fn run<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
    done: impl FnOnce(T) -> CallToolResult,
) -> Result<CallToolResult, ErrorData> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(v)) => Ok(done(v)),
        Ok(Err(e)) => Ok(failed(e)),
        Err(e) => Ok(failed(format!("the analysis stopped: {e}"))),
    }
}

#[tool_router(router = tool_router)]
impl Server {
    pub fn new() -> Self {
        Self { tool_router: Self::tool_router() }
    }

    /// Why the job ran out of memory: the verdict per GPU (what filled it, the causes ranked by the bytes they
    /// explain, the fixes proven on the trace), the findings with their evidence, and for several ranks the job
    /// view. Call it first, on every artifact the user has.
    #[tool(name = "analyze")]
    async fn analyze_tool(&self, Parameters(p): Parameters<AnalyzeParams>) -> Result<CallToolResult, ErrorData> {
        run(move || analyze(p), CallToolResult::structured).await
    }

    /// What changed between two runs of a program (before and after a change): the peaks, bytes by kind and by
    /// allocating stack, the cache's free memory, findings resolved and new, allocator settings changed.
    #[tool(name = "diff")]
    async fn diff_tool(&self, Parameters(p): Parameters<DiffParams>) -> Result<CallToolResult, ErrorData> {
        run(move || diff(p), CallToolResult::structured).await
    }

    /// Would a change have avoided the OOM? Replays the trace through a model of PyTorch's caching allocator under
    /// other settings (set), with a kind's bytes scaled (scale: a smaller batch) or a line's allocations left out
    /// (drop_stack: a leak fixed), and says the peak and whether it fits, on the user's own run.
    #[tool(name = "whatif")]
    async fn whatif_tool(&self, Parameters(p): Parameters<WhatifParams>) -> Result<CallToolResult, ErrorData> {
        run(move || whatif(p), CallToolResult::structured).await
    }

    /// Every fact the checklist's rules test, with its value, per GPU and for the job: to see why a rule did or did
    /// not fire.
    #[tool(name = "facts")]
    async fn facts_tool(&self, Parameters(p): Parameters<FactsParams>) -> Result<CallToolResult, ErrorData> {
        run(move || facts(p), CallToolResult::structured).await
    }

    /// Before a run: the memory budget per GPU of a model and a run (every byte with its formula), whether it fits,
    /// and what would. Takes the flags of `oomdoc budget`.
    #[tool(name = "budget")]
    async fn budget_tool(&self, Parameters(p): Parameters<BudgetParams>) -> Result<CallToolResult, ErrorData> {
        run(move || budget(p), CallToolResult::structured).await
    }

    /// What a rule of the OOM checklist checks, why, when it fires and its fix.
    #[tool(name = "explain")]
    async fn explain_tool(&self, Parameters(p): Parameters<ExplainParams>) -> Result<CallToolResult, ErrorData> {
        run(move || explain(p), |text| CallToolResult::success(vec![ContentBlock::text(text)])).await
    }

    /// What each file of a folder is read as (snapshot, log, nvidia-smi, Nsight, archive …), or why not: to pick
    /// the files to analyze.
    #[tool(name = "list_inputs")]
    async fn list_inputs_tool(&self, Parameters(p): Parameters<ListInputsParams>) -> Result<CallToolResult, ErrorData> {
        run(move || list_inputs(p), CallToolResult::structured).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("oomdoc", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// Serves the tools on stdin/stdout until the client closes them.
pub fn serve() -> Result<(), Error> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Usage(format!("could not start the server: {e}")))?;
    runtime.block_on(async {
        let service = Server::new()
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| Error::Usage(format!("the MCP session did not start: {e}")))?;
        service.waiting().await.map_err(|e| Error::Usage(format!("the MCP session ended badly: {e}")))?;
        Ok(())
    })
}
