//! The one pipeline: a job's artifacts → readers ([`crate::ingest`]) → one timeline per snapshot (the logs,
//! nvidia-smi and profiler exports joined to each) → analysis → the checklist's rules → the verdict. The command
//! line, the TUI, the tests and the benches all run a job through here, so what a user sees is what is tested.
//!
//! ```no_run
//! use oomdoc::job::{Job, JobOptions};
//! let job = Job::read(&JobOptions::new(["mem_snapshot.pickle"]))?;
//! for analysed in job.analyze() {
//!     let analysed = analysed?;
//!     println!("{}", oomdoc::report::render(oomdoc::report::Format::Text, &analysed.analysis, analysed.timeline, false));
//! }
//! # Ok::<(), oomdoc::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::analysis::categories::Categorizer;
use crate::analysis::{self, Analysis, Options};
use crate::budget::{self, args::PredictArgs, Budget};
use crate::ingest::{self, LoadOptions};
use crate::rules::RuleSet;
use crate::timeline::replay::Replay;
use crate::timeline::Timeline;
use crate::Error;

/// What to read and how to analyse it.
#[derive(Clone, Debug, Default)]
pub struct JobOptions {
    pub files: Vec<PathBuf>,
    pub load: LoadOptions,
    pub analysis: Options,
    /// A folder of rule files that add to or override the built-in checklist (and a `categories.toml`).
    pub rules_dir: Option<PathBuf>,
    /// A model and run to predict the budget of, put beside each device's live memory.
    pub predict: PredictArgs,
    /// Keep each device's replay for browsing (the TUI), instead of dropping it once the facts are derived.
    pub keep_replays: bool,
    /// Print each stage's time and the peak RSS on stderr (`OOMDOC_TIMING`).
    pub timing: bool,
}

impl JobOptions {
    /// The defaults for these files: recognised by content, analysed at the OOM (else the peak).
    pub fn new<P: Into<PathBuf>>(files: impl IntoIterator<Item = P>) -> JobOptions {
        JobOptions { files: files.into_iter().map(Into::into).collect(), ..JobOptions::default() }
    }
}

/// The OOM checklist: the rules and the stack categories they use.
#[derive(Clone)]
pub struct Checklist {
    pub rules: RuleSet,
    pub categories: Categorizer,
}

impl Checklist {
    /// The built-in rules and categories.
    pub fn builtin() -> Checklist {
        Checklist { rules: RuleSet::builtin(), categories: Categorizer::builtin() }
    }

    /// The built-in checklist with a folder's rule files (and its `categories.toml`) added.
    pub fn load(dir: Option<&Path>) -> Result<Checklist, Error> {
        let mut rules = RuleSet::builtin();
        let mut sources = vec![("rules/categories.toml".to_string(), crate::analysis::categories::BUILTIN.to_string())];
        if let Some(d) = dir {
            rules.extend_from_dir(d)?;
            let p = d.join("categories.toml");
            if p.exists() {
                let text =
                    std::fs::read_to_string(&p).map_err(|e| Error::Io { path: p.display().to_string(), source: e })?;
                sources.push((p.display().to_string(), text));
            }
        }
        let refs: Vec<(&str, &str)> = sources.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let categories = Categorizer::new(&refs)?;
        Ok(Checklist { rules, categories })
    }
}

/// A job's inputs, read: one timeline per snapshot (or one for text artifacts alone), and the inputs that could
/// not be read. One bad file does not stop the others: each failure is kept for the caller to report.
pub struct Job {
    pub checklist: Checklist,
    pub prediction: Option<Budget>,
    pub timelines: Vec<Timeline>,
    /// Each timeline's place among the job's snapshots (the order they were given).
    timeline_seq: Vec<usize>,
    /// Snapshot files recognised but not read yet (`LoadOptions::defer_snapshot_files`): [`Job::each_rank`] reads
    /// them.
    deferred: Vec<(usize, PathBuf)>,
    joiner: Option<ingest::Joiner>,
    /// Ranks analysed elsewhere, read from oomdoc's own JSON reports: rows of the job view.
    pub reported: Vec<crate::timeline::reported::ReportedRank>,
    pub failed: Vec<Error>,
    options: JobOptions,
}

/// One timeline analysed: the report model every renderer reads, and (with `keep_replays`) the replays to browse.
pub struct Analysed<'t> {
    pub timeline: &'t Timeline,
    pub analysis: Analysis,
    pub replays: Vec<Replay<'t>>,
}

/// A snapshot's file name without its folder and compression suffix: `oom-2.pickle` for `/tmp/x/oom-2.pickle.xz`.
fn snapshot_name(path: &str) -> String {
    let name = path.rsplit(['/', '\\']).next().unwrap_or(path);
    [".xz", ".zst", ".gz", ".bz2", ".lz4"].iter().find_map(|ext| name.strip_suffix(ext)).unwrap_or(name).to_string()
}

impl Job {
    /// Reads every input. The checklist and the budget are made while the inputs are read (neither needs the
    /// other); a broken rule file or model is an error before any input's.
    pub fn read(options: &JobOptions) -> Result<Job, Error> {
        let t0 = Instant::now();
        let (setup, read) = std::thread::scope(|s| {
            let setup = crate::threads::beside(s, || -> Result<_, Error> {
                let checklist = Checklist::load(options.rules_dir.as_deref())?;
                let prediction = budget::args::predict(&options.predict)?;
                Ok((checklist, prediction))
            });
            let read = ingest::load_job(&options.files, &options.load);
            (setup(), read)
        });
        let (checklist, prediction) = setup?;
        let ingest::Loaded { timelines, timeline_seq, deferred, joiner, mut reported, failed } = read;
        // oomdoc.record() writes each rank's JSON report beside its snapshot: given both, the snapshot is the rank
        // (analysed here, in full) and the report a copy of it, not another rank.
        let snapshots: std::collections::HashSet<String> = timelines
            .iter()
            .flat_map(|t| t.inputs.iter().filter(|i| i.kind == crate::timeline::InputKind::PytorchSnapshot))
            .map(|i| snapshot_name(&i.path))
            .chain(deferred.iter().map(|(_, p)| snapshot_name(&p.to_string_lossy())))
            .collect();
        reported.retain(|r| !snapshots.contains(&snapshot_name(&r.input)));
        if options.timing {
            eprintln!(
                "oomdoc: read {} files in {:.3} s{}",
                options.files.len(),
                t0.elapsed().as_secs_f64(),
                peak_rss()
            );
        }
        Ok(Job {
            checklist,
            prediction,
            timelines,
            timeline_seq,
            deferred,
            joiner: Some(joiner),
            reported,
            failed: failed.into_iter().map(Error::from).collect(),
            options: options.clone(),
        })
    }

    /// A job over timelines already read (a snapshot decoded from memory), checked with `checklist`.
    pub fn of_timelines(timelines: Vec<Timeline>, checklist: Checklist, options: &JobOptions) -> Result<Job, Error> {
        let prediction = budget::args::predict(&options.predict)?;
        Ok(Job {
            checklist,
            prediction,
            timeline_seq: (0..timelines.len()).collect(),
            timelines,
            deferred: Vec::new(),
            joiner: None,
            reported: Vec::new(),
            failed: Vec::new(),
            options: options.clone(),
        })
    }

    /// Reads one input with the default options and the built-in checklist.
    pub fn read_file(path: impl Into<PathBuf>) -> Result<Job, Error> {
        let job = Job::read(&JobOptions::new([path]))?;
        match job.failed.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(Job { failed: Vec::new(), ..job }),
        }
    }

    /// Analyses each timeline that holds something read, in order, and runs the checklist on it.
    pub fn analyze(&self) -> impl Iterator<Item = Result<Analysed<'_>, Error>> {
        self.timelines.iter().filter(|tl| !tl.inputs.is_empty()).map(|tl| self.analyze_timeline(tl))
    }

    /// Every snapshot of the job analysed and handed to `each`, in the order they were given; what `each` returns is
    /// kept, the timeline is not. Snapshot files the reading deferred are read here on every core, a few at a time,
    /// so a job of a thousand ranks needs the memory of a few (and of what `each` keeps). A snapshot that cannot be
    /// read or analysed is its error in the list; the others go on.
    pub fn each_rank<R: Send>(&self, each: impl Fn(Analysed<'_>) -> R + Sync) -> Vec<Result<R, Error>> {
        let mut out: Vec<(usize, Result<R, Error>)> = self
            .timelines
            .iter()
            .zip(&self.timeline_seq)
            .filter(|(tl, _)| !tl.inputs.is_empty())
            .map(|(tl, &seq)| (seq, self.analyze_timeline(tl).map(&each)))
            .collect();
        if let (Some(joiner), false) = (&self.joiner, self.deferred.is_empty()) {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let done = std::sync::Mutex::new(Vec::with_capacity(self.deferred.len()));
            let bar = (self.deferred.len() >= 8)
                .then(|| ingest::count_bar(self.options.load.show_progress, self.deferred.len() as u64, "ranks"))
                .flatten();
            // One file: its own bar, by bytes. Several: one bar over the ranks.
            let one_file_bar = self.options.load.show_progress && self.deferred.len() == 1;
            let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(self.deferred.len());
            // Several snapshots read at once already take the cores: a helper thread per read would only compete.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let split = self.options.load.split_read.filter(|_| 2 * workers <= cores);
            std::thread::scope(|s| {
                for _ in 0..workers {
                    s.spawn(|| loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((seq, path)) = self.deferred.get(i) else { break };
                        let t0 = Instant::now();
                        let result = ingest::load_deferred(path, joiner, one_file_bar, split).map_err(Error::from).and_then(|tl| {
                            if self.options.timing {
                                eprintln!(
                                    "oomdoc: read {} in {:.3} s{}",
                                    path.display(),
                                    t0.elapsed().as_secs_f64(),
                                    peak_rss()
                                );
                                if let Some(routes) = tl.read_routes {
                                    eprintln!("oomdoc: {routes}");
                                }
                                if let Some((records, from, to)) = tl.split_read {
                                    eprintln!(
                                        "oomdoc: a helper thread read {records} trace entries, bytes {from}..{to} of {}",
                                        path.display()
                                    );
                                }
                            }
                            self.analyze_timeline(&tl).map(&each)
                        });
                        done.lock().expect("no worker panics holding it").push((*seq, result));
                        if let Some(bar) = &bar {
                            bar.inc(1);
                        }
                    });
                }
            });
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            out.extend(done.into_inner().expect("no worker panicked"));
        }
        out.sort_by_key(|(seq, _)| *seq);
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// The timelines read so far that hold something, in the order the job was given (an archive's members in name
    /// order), each with its rank by the job's one rule ([`analysis::job_view::rank_numbers`]), by rank.
    pub fn ranked_timelines(&self) -> Vec<(u32, &Timeline)> {
        let mut given: Vec<(usize, &Timeline)> = self
            .timelines
            .iter()
            .zip(&self.timeline_seq)
            .filter(|(tl, _)| !tl.inputs.is_empty())
            .map(|(tl, &s)| (s, tl))
            .collect();
        given.sort_by_key(|(seq, _)| *seq);
        let name = |tl: &Timeline| tl.inputs.first().map_or(String::new(), |i| i.path.clone());
        let names: Vec<String> = given.iter().map(|(_, tl)| name(tl)).collect();
        let numbers = analysis::job_view::rank_numbers(names.iter().map(String::as_str));
        let mut ranked: Vec<(u32, &Timeline)> = numbers.into_iter().zip(given.into_iter().map(|(_, tl)| tl)).collect();
        ranked.sort_by_key(|(rank, _)| *rank);
        ranked
    }

    /// The first analysed timeline (a job of one snapshot has one).
    pub fn analyze_first(&self) -> Result<Analysed<'_>, Error> {
        self.analyze().next().unwrap_or_else(|| Err(Error::Usage("nothing was read".into())))
    }

    /// Analyses one of the job's timelines (the TUI opens ranks one at a time).
    pub fn analyze_timeline<'t>(&'t self, tl: &'t Timeline) -> Result<Analysed<'t>, Error> {
        let t1 = Instant::now();
        let shown = tl.inputs.first().map_or(String::new(), |i| i.path.clone());
        let (mut analysis, replays) = analysis::analyze_keeping(
            tl,
            &self.options.analysis,
            &self.checklist.categories,
            self.options.keep_replays,
        )
        .map_err(|source| Error::Analysis { path: shown, source })?;
        if let Some(b) = &self.prediction {
            analysis::prediction::attach(&mut analysis, b);
        }
        self.checklist.rules.apply(&mut analysis);
        if self.options.timing {
            eprintln!("oomdoc: analysed in {:.3} s{}", t1.elapsed().as_secs_f64(), peak_rss());
        }
        Ok(Analysed { timeline: tl, analysis, replays })
    }
}

/// `, peak RSS N kB` where /proc tells it (Linux), for `timing`.
fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l[6..].trim().to_string()))
        .map_or(String::new(), |v| format!(", peak RSS {v}"))
}

/// One side of `oomdoc diff` (and the MCP server's `diff`), in its JSON form: a snapshot analysed here at `at`, or an
/// oomdoc JSON report kept from an earlier run; with the timeline of its fullest GPU when it is a snapshot (for the
/// page; a kept report holds none).
pub fn compared_run(
    path: &std::path::Path,
    at: &crate::analysis::At,
) -> Result<(serde_json::Value, Option<crate::analysis::chart::Chart>), Error> {
    let io = |source| Error::Io { path: path.display().to_string(), source };
    let head = {
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut head = vec![0u8; 4096];
        let n = std::io::Read::read(&mut f, &mut head).map_err(io)?;
        head.truncate(n);
        head
    };
    if head.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        let text = std::fs::read_to_string(path).map_err(io)?;
        if crate::ingest::oomdoc_report::sniff(&text) {
            return serde_json::from_str(&text).map(|v| (v, None)).map_err(|e| {
                Error::Input(crate::ingest::IngestError::Input {
                    path: path.display().to_string(),
                    source: crate::ingest::ReadError::Unrecognised(format!("not valid JSON: {e}")),
                })
            });
        }
    }
    let mut options = crate::job::JobOptions::new([path.to_path_buf()]);
    options.analysis.at = at.clone();
    options.analysis.top = 50;
    let mut job = Job::read(&options)?;
    if !job.failed.is_empty() {
        return Err(job.failed.swap_remove(0));
    }
    let analysed = job.analyze().collect::<Result<Vec<_>, _>>()?;
    if analysed.len() != 1 {
        return Err(Error::Usage(format!(
            "{}: oomdoc diff compares one snapshot with one snapshot; this holds {}",
            path.display(),
            analysed.len()
        )));
    }
    let mut analysis = analysed.into_iter().next().expect("one").analysis;
    let value = serde_json::to_value(&analysis).expect("analysis serialises");
    // The device the diff's sides describe: the fullest, chosen as `analysis::diff` chooses it.
    let top = value["devices"]
        .as_array()
        .and_then(|ds| ds.iter().enumerate().max_by_key(|(_, d)| crate::ingest::oomdoc_report::peaks(d).0))
        .map(|(i, _)| i);
    Ok((value, top.and_then(|i| analysis.devices[i].chart.take())))
}
