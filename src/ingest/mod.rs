//! Readers for the artifacts a failed job leaves behind, one module per format, all producing a [`Timeline`].

pub mod megatron_log;
pub mod ncu;
pub mod nsys;
pub mod nsys_sqlite;
pub mod nvidia_smi;
pub mod oom_log;
pub mod oomdoc_report;
pub mod pickle;
mod progress;
pub mod read_ahead;
pub mod reader;
pub mod snapshot;
mod snapshot_file;
pub mod snapshot_keys;
pub mod text;
pub mod unpack;
pub mod vllm_log;

pub use progress::count_bar;
use progress::progress_bar;
pub use reader::{sniff_file, Reader, READERS};
pub use snapshot_file::load;
use snapshot_file::load_stream;

use std::path::Path;

use crate::timeline::clock::{self, ClockOptions};
use crate::timeline::profile::ProfileData;
use crate::timeline::{InputInfo, Malformed, MegatronLog, OomMessage, ServingLog, Timeline};

/// Why an input could not be read: the ingest layer's own error, so that it depends on nothing above it (the
/// crate's `Error` wraps it).
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// An input that could not be read: which, and what its reader found wrong.
    #[error("{path}: {source}")]
    Input { path: String, source: ReadError },
}

use IngestError as Error;

/// Why an input could not be read; the error around it ([`Error::Input`]) names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
    #[error(transparent)]
    Ncu(#[from] ncu::NcuError),
    #[error(transparent)]
    Nsys(#[from] nsys::NsysError),
    #[error("a directory is read as Nsight Systems `nsys stats` report files: {0}")]
    NsysDir(#[source] nsys::NsysError),
    #[error(transparent)]
    NsysSqlite(#[from] nsys_sqlite::SqliteError),
    /// An archive or compressed input past a limit.
    #[error(transparent)]
    Unpack(#[from] unpack::Limit),
    #[error("not a readable zip archive: {0}")]
    Zip(#[source] Box<zip::result::ZipError>),
    #[error(
        "a folder with nothing oomdoc reads ({0} files): expected snapshot pickles, logs, nvidia-smi output or Nsight \
         exports, plain, compressed or in archives"
    )]
    NothingInFolder(usize),
    #[error(
        "an archive with nothing oomdoc reads (members skipped: {0}): expected snapshot pickles, logs, nvidia-smi output or \
         Nsight exports, plain or compressed (archives inside it are not opened: unpack them first)"
    )]
    NothingInArchive(usize),
    /// Not a format oomdoc reads: what was looked for and what was found.
    #[error("{0}")]
    Unrecognised(String),
    /// Recognised, and deliberately not read (compressed twice, an archive in an archive): why, and what to do.
    #[error("not read: {0}")]
    NotRead(String),
    /// With `--strict`, a line a recognised block cannot use.
    #[error("line {line}: expected {expected}, found {found:?} (--strict)")]
    Strict { line: usize, expected: String, found: String },
}

/// What kind of artifact a file is. Recognised by content; `--kind` forces one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot).
    Snapshot,
    /// A training or server log: OOM messages, vLLM KV-cache lines.
    Log,
    /// nvidia-smi output: --query-gpu / --query-compute-apps CSV (with -l/-lms), the default table, -q, dmon,
    /// pmon, or several of them pasted into one file.
    NvidiaSmi,
    /// Nsight Systems: `nsys stats` CSV reports (a file, or a directory of `<base>_<report>.csv`), a console
    /// capture of `nsys stats`, or the SQLite export (`nsys export --type sqlite`).
    Nsys,
    /// Nsight Compute: the CSV details page (`ncu --csv`), the raw page (`--page raw`), or the human-readable
    /// page ncu prints without `--csv`.
    Ncu,
    /// oomdoc's own JSON report of one rank (`analyze --format json`): a row of the job view.
    Report,
}

/// Whether a long snapshot's trace may be read in two parts at once, on two cores (see `pickle::split`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRead {
    /// Files smaller than this are read on one thread: a second pays only on a long trace.
    pub min_bytes: u64,
    /// The helper reads its whole part whatever the timing (the tests' setting; otherwise it gives up its part when
    /// the main thread catches up).
    pub patient: bool,
}

impl Default for SplitRead {
    fn default() -> SplitRead {
        SplitRead { min_bytes: 32 << 20, patient: false }
    }
}

/// How to read a job's artifacts.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub show_progress: bool,
    /// Forces every file's kind.
    pub kind: Option<Kind>,
    /// Malformed lines in a recognised block are errors instead of being skipped and counted.
    pub strict: bool,
    /// Column names of a `noheader` nvidia-smi CSV (`--columns timestamp,index,memory.used`).
    pub columns: Option<Vec<String>>,
    pub clock: ClockOptions,
    /// How much an archive or compressed input may unpack to.
    pub limits: unpack::Limits,
    /// Snapshots that are plain files are only recognised, not read: the job reads them later, several at a time,
    /// and lets each go once analysed (a job of many ranks in bounded memory). See [`Loaded::deferred`].
    pub defer_snapshot_files: bool,
    /// A long plain snapshot file's trace read in two parts at once (`None`: on one thread). The job turns it off
    /// where it reads several snapshots at once and they would only compete for the cores.
    pub split_read: Option<SplitRead>,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions {
            show_progress: false,
            kind: None,
            strict: false,
            columns: None,
            clock: ClockOptions::default(),
            limits: unpack::Limits::default(),
            defer_snapshot_files: false,
            split_read: Some(SplitRead::default()),
        }
    }
}

/// What a job's readers collect: a timeline per snapshot, and what the other artifacts said.
#[derive(Default)]
pub struct Collected {
    snapshots: Vec<Timeline>,
    /// Each snapshot's place among the job's snapshots, read or deferred.
    snapshot_seq: Vec<usize>,
    /// Plain snapshot files left to read, with their place (`LoadOptions::defer_snapshot_files`).
    deferred: Vec<(usize, std::path::PathBuf)>,
    seq: usize,
    /// Ranks analysed elsewhere (oomdoc's own JSON reports).
    reported: Vec<crate::timeline::reported::ReportedRank>,
    text: TextArtifacts,
    /// Members of an archive or files of a folder that could not be read (the others still are).
    failed: Vec<Error>,
}

impl Collected {
    pub(crate) fn push_snapshot(&mut self, tl: Timeline) {
        self.snapshot_seq.push(self.seq);
        self.seq += 1;
        self.snapshots.push(tl);
    }
    /// Puts the snapshots read since `from_seq` (one archive's members) in the order of their names, as a folder of
    /// the same files lists them: the ranks a job is given then do not depend on the order an archive stored them.
    pub(crate) fn order_by_name_since(&mut self, from_seq: usize) {
        let mut read: Vec<(String, usize)> = self
            .snapshots
            .iter()
            .zip(&self.snapshot_seq)
            .enumerate()
            .filter(|(_, (_, &seq))| seq >= from_seq)
            .map(|(i, (tl, _))| (tl.inputs.first().map_or_else(String::new, |i| i.path.clone()), i))
            .collect();
        let mut seqs: Vec<usize> = read.iter().map(|&(_, i)| self.snapshot_seq[i]).collect();
        seqs.sort_unstable();
        read.sort();
        for ((_, i), seq) in read.into_iter().zip(seqs) {
            self.snapshot_seq[i] = seq;
        }
    }
    pub(crate) fn defer_snapshot(&mut self, path: &Path) {
        self.deferred.push((self.seq, path.to_path_buf()));
        self.seq += 1;
    }
}

/// Everything the text artifacts of a job said, before it is joined with a snapshot's timeline.
#[derive(Default)]
struct TextArtifacts {
    inputs: Vec<InputInfo>,
    ooms: Vec<OomMessage>,
    serving: ServingLog,
    megatron: MegatronLog,
    gpus: Vec<nvidia_smi::SmiGpu>,
    profile: ProfileData,
    /// `nsys stats` report files, read together at the end (a capture's combined and dedicated reports must be
    /// joined before one fills the other in): (index in `inputs`, file name, text).
    nsys_files: Vec<(usize, String, String)>,
}

impl TextArtifacts {
    fn join(&self, tl: &mut Timeline) {
        // Samples name their input by index among the text inputs; in the joined timeline those follow its own.
        let base = tl.inputs.len();
        tl.inputs.extend(self.inputs.iter().cloned());
        tl.ooms.extend(self.ooms.iter().cloned());
        tl.serving.merge(self.serving.clone());
        tl.megatron.merge(self.megatron.clone());
        tl.profile.merge(self.profile.clone());
        for g in &self.gpus {
            let d = tl.device_mut(i64::from(g.index));
            d.memory_samples.extend(g.samples.iter().cloned().map(|mut s| {
                s.input += base;
                s
            }));
            if !g.processes.is_empty() {
                d.processes = g.processes.clone();
            }
            if !g.mig.is_empty() {
                d.mig = g.mig.clone();
            }
            d.name = g.name.clone().or(d.name.take());
            d.bus_id = g.bus_id.clone().or(d.bus_id.take());
        }
    }
}

/// Reads every artifact of one job. Each snapshot gives a timeline; what the text artifacts (logs, nvidia-smi)
/// say is joined with every one of them, on the snapshot's clock. Without a snapshot the text artifacts form one
/// timeline of their own. An input that cannot be read is an error of its own, beside the timelines of the others.
pub fn load_job(paths: &[std::path::PathBuf], opts: &LoadOptions) -> Loaded {
    let mut job = Collected::default();
    let mut failed = Vec::new();
    for path in paths {
        if let Err(e) = unpack::read_path(path, opts, &mut job) {
            failed.push(e);
        }
        failed.append(&mut job.failed);
    }
    let Collected { mut snapshots, mut snapshot_seq, mut text, reported, deferred, .. } = job;
    if let Err(e) = reader::finish_nsys_files(opts, &mut text) {
        failed.push(e);
    }
    if snapshots.is_empty() && deferred.is_empty() {
        snapshots.push(Timeline::default());
        snapshot_seq.push(0);
    }
    let joiner = Joiner { text, clock: opts.clock.clone() };
    for tl in &mut snapshots {
        joiner.prepare(tl);
    }
    Loaded { timelines: snapshots, timeline_seq: snapshot_seq, deferred, joiner, reported, failed }
}

/// A job's inputs, read: one timeline per snapshot (or one for text artifacts alone), the snapshot files left to
/// read, the ranks analysed elsewhere, and the inputs that could not be read.
pub struct Loaded {
    pub timelines: Vec<Timeline>,
    /// Each timeline's place among the job's snapshots.
    pub timeline_seq: Vec<usize>,
    /// Snapshot files to read with [`load_deferred`], with their place.
    pub deferred: Vec<(usize, std::path::PathBuf)>,
    /// What joins the text artifacts to a snapshot read later.
    pub joiner: Joiner,
    pub reported: Vec<crate::timeline::reported::ReportedRank>,
    pub failed: Vec<Error>,
}

/// The text artifacts of a job and how to put them on a snapshot's clock: applied to each snapshot's timeline.
pub struct Joiner {
    text: TextArtifacts,
    clock: ClockOptions,
}

impl Joiner {
    fn prepare(&self, tl: &mut Timeline) {
        self.text.join(tl);
        clock::align(tl, &self.clock);
    }
}

/// Reads a snapshot file the job deferred, joined with the job's text artifacts.
pub fn load_deferred(
    path: &Path,
    joiner: &Joiner,
    show_progress: bool,
    split: Option<SplitRead>,
) -> Result<Timeline, Error> {
    let mut tl = load(path, show_progress, split)?;
    joiner.prepare(&mut tl);
    Ok(tl)
}

/// Keeps the first few malformed lines and the count; with `--strict` the first one is an error.
fn note_malformed(info: &mut InputInfo, malformed: Vec<Malformed>, strict: bool) -> Result<(), Error> {
    if let (true, Some(m)) = (strict, malformed.first()) {
        return Err(Error::Input {
            path: info.path.clone(),
            source: ReadError::Strict { line: m.line, expected: m.expected.clone(), found: m.found.clone() },
        });
    }
    info.malformed_lines += malformed.len();
    info.malformed.extend(malformed.into_iter().take(MALFORMED_SHOWN.saturating_sub(info.malformed.len())));
    Ok(())
}

/// Malformed lines listed per input (all are counted).
const MALFORMED_SHOWN: usize = 5;

pub(crate) fn describe_start(head: &[u8]) -> String {
    let text: String = head.iter().map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
    format!("0x{:02x} 0x{:02x} ('{text}')", head[0], head[1])
}
