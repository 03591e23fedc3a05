//! Readers for the artifacts a failed job leaves behind, one module per format, all producing a [`Timeline`].

pub mod ncu;
pub mod nsys;
pub mod nsys_sqlite;
pub mod nvidia_smi;
pub mod oom_log;
pub mod pickle;
pub mod read_ahead;
pub mod snapshot;
pub mod text;
pub mod vllm_log;

use std::fs::File;
use std::io::{IsTerminal, Read};
use std::path::Path;

use crate::timeline::clock::{self, ClockOptions};
use crate::timeline::profile::{ProfileData, ProfileSource};
use crate::timeline::{InputInfo, Malformed, OomMessage, ServingLog, Timeline};
use crate::Error;

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
    /// Not a format oomdoc reads: what was looked for and what was found.
    #[error("{0}")]
    Unrecognised(String),
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
}

/// How to read a job's artifacts.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    pub show_progress: bool,
    /// Forces every file's kind.
    pub kind: Option<Kind>,
    /// Malformed lines in a recognised block are errors instead of being skipped and counted.
    pub strict: bool,
    /// Column names of a `noheader` nvidia-smi CSV (`--columns timestamp,index,memory.used`).
    pub columns: Option<Vec<String>>,
    pub clock: ClockOptions,
}

/// Everything the text artifacts of a job said, before it is joined with a snapshot's timeline.
#[derive(Default)]
struct TextArtifacts {
    inputs: Vec<InputInfo>,
    ooms: Vec<OomMessage>,
    serving: ServingLog,
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
pub fn load_job(paths: &[std::path::PathBuf], opts: &LoadOptions) -> (Vec<Timeline>, Vec<Error>) {
    let mut snapshots = Vec::new();
    let mut text = TextArtifacts::default();
    let mut failed = Vec::new();
    for path in paths {
        match read_input(path, opts, &mut text) {
            Ok(Some(tl)) => snapshots.push(tl),
            Ok(None) => {}
            Err(e) => failed.push(e),
        }
    }
    if let Err(e) = finish_nsys_files(opts, &mut text) {
        failed.push(e);
    }
    if snapshots.is_empty() {
        snapshots.push(Timeline::default());
    }
    for tl in &mut snapshots {
        text.join(tl);
        clock::align(tl, &opts.clock);
    }
    (snapshots, failed)
}

/// Reads one input: a snapshot's timeline, or what a text artifact said, into `text`.
fn read_input(path: &Path, opts: &LoadOptions, text: &mut TextArtifacts) -> Result<Option<Timeline>, Error> {
    if path.is_dir() {
        read_nsys_dir(path, opts, text)?;
        return Ok(None);
    }
    // Sniffing a text artifact reads it whole: its reader gets that text rather than reading the file again.
    let (kind, content) = match opts.kind {
        Some(k) => (k, None),
        None => sniff(path)?,
    };
    let content = || content.map_or_else(|| read_all(path), Ok);
    match kind {
        Kind::Snapshot => return load(path, opts.show_progress).map(Some),
        Kind::Log => read_text(path, content()?, opts, text)?,
        Kind::NvidiaSmi => read_nvidia_smi(path, content()?, opts, text)?,
        Kind::Nsys if is_sqlite(path)? => read_nsys_sqlite(path, opts.strict, text)?,
        Kind::Nsys => read_nsys(path, content()?, text),
        Kind::Ncu => read_ncu(path, content()?, opts, text)?,
    }
    Ok(None)
}

fn read_all(path: &Path) -> Result<String, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// Recognises a file by its first bytes (a pickle, an SQLite database) or by what its text holds.
pub fn sniff_file(path: &Path) -> Result<Kind, Error> {
    sniff(path).map(|(kind, _)| kind)
}

/// [`sniff_file`], also handing back the text when it had to read the file whole to decide.
fn sniff(path: &Path) -> Result<(Kind, Option<String>), Error> {
    let shown = path.display().to_string();
    let io_err = |source| Error::Io { path: shown.clone(), source };
    let mut head = [0u8; 2];
    let n = File::open(path).and_then(|mut f| f.read(&mut head)).map_err(io_err)?;
    if n == 2 && snapshot::sniff(&head) {
        return Ok((Kind::Snapshot, None));
    }
    if n > 0 && head[0] == 0x80 {
        // A pickle too short to hold anything: let the snapshot reader say what is missing.
        return Ok((Kind::Snapshot, None));
    }
    if is_sqlite(path)? {
        return Ok((Kind::Nsys, None));
    }
    let text = read_all(path)?;
    // Profiler exports first: their header rows are specific, and a console capture may quote the profiled
    // program's own output (an OOM message included).
    if ncu::sniff(&text) {
        return Ok((Kind::Ncu, Some(text)));
    }
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if nsys::sniff(&text) || (text.trim().is_empty() && nsys::is_report_file_name(&file_name)) {
        return Ok((Kind::Nsys, Some(text)));
    }
    if oom_log::sniff(&text) || vllm_log::sniff(&text) {
        return Ok((Kind::Log, Some(text)));
    }
    if nvidia_smi::sniff(&text) {
        return Ok((Kind::NvidiaSmi, Some(text)));
    }
    let binary = text.contains('\u{fffd}') || head.iter().any(|&b| b < 0x09);
    // A job's log that holds no OOM message is still its log: named like one, it is read as one (and says so).
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if n > 0 && !binary && matches!(ext.as_str(), "log" | "out" | "err" | "stderr" | "stdout") {
        return Ok((Kind::Log, Some(text)));
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let shown_first: String = first.chars().take(60).collect();
    Err(Error::Input {
        path: shown,
        source: ReadError::Unrecognised(format!(
            "not a recognised artifact. Looked for: a PyTorch memory snapshot pickle (first byte 0x80), a training \
             log with a CUDA out-of-memory message, a vLLM log with KV-cache lines, nvidia-smi output (CSV, table, \
             -q, dmon, pmon), an Nsight Systems stats CSV or SQLite export, an Nsight Compute CSV. Found {}. Use --kind to say \
             which it is.",
            if n == 0 {
                "an empty file".to_string()
            } else if binary {
                format!("binary data starting {}", describe_start(&head))
            } else {
                format!("text starting {shown_first:?}")
            }
        )),
    })
}

fn read_text(path: &Path, text: String, opts: &LoadOptions, out: &mut TextArtifacts) -> Result<(), Error> {
    let shown = path.display().to_string();
    let mut info = InputInfo {
        path: shown.clone(),
        kind: "log",
        format_version: String::new(),
        bytes: text.len() as u64,
        ..InputInfo::default()
    };
    let log = oom_log::parse(&text, &shown);
    let serving = vllm_log::parse(&text, &shown);
    if !log.ooms.is_empty() {
        info.read.push(format!(
            "{} out-of-memory report{}",
            log.ooms.len(),
            if log.ooms.len() == 1 { "" } else { "s" }
        ));
    }
    if !serving.is_empty() {
        info.kind = "vllm_log";
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let mut parts = Vec::new();
        let c = &serving.capacity;
        if c.gpu_blocks.is_some() || c.tokens.is_some() || c.kv_bytes.is_some() || c.max_concurrency.is_some() {
            parts.push("KV-cache capacity".to_string());
        }
        if c.too_small.is_some() {
            parts.push("a KV-cache capacity failure".to_string());
        }
        if !serving.stats.is_empty() {
            parts.push(plural(serving.stats.len(), "KV-cache usage line"));
        }
        if !serving.preemptions.is_empty() {
            parts.push(plural(serving.preemptions.len(), "preemption"));
        }
        info.read.push(format!("vLLM: {}", parts.join(", ")));
    }
    if info.read.is_empty() {
        info.read.push("no out-of-memory report and no vLLM KV-cache line".into());
    }
    note_malformed(&mut info, log.malformed, opts.strict)?;
    out.ooms.extend(log.ooms);
    out.serving.merge(serving);
    out.inputs.push(info);
    Ok(())
}

fn read_nvidia_smi(path: &Path, text: String, opts: &LoadOptions, out: &mut TextArtifacts) -> Result<(), Error> {
    let p = nvidia_smi::parse(&text, out.inputs.len(), opts.columns.as_deref());
    let mut info = InputInfo {
        path: path.display().to_string(),
        kind: "nvidia_smi",
        format_version: String::new(),
        bytes: text.len() as u64,
        read: p.read,
        skipped: p.skipped,
        ..InputInfo::default()
    };
    if info.read.is_empty() {
        info.read.push("no nvidia-smi output recognised".into());
    }
    note_malformed(&mut info, p.malformed, opts.strict)?;
    info.malformed_lines = info.malformed_lines.max(p.malformed_lines);
    out.gpus.extend(p.gpus);
    out.inputs.push(info);
    Ok(())
}

/// Whether a file starts with the SQLite header (an `nsys export --type sqlite` database, if anything we read).
fn is_sqlite(path: &Path) -> Result<bool, Error> {
    let mut head = [0u8; 16];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    Ok(nsys_sqlite::sniff(&head[..n]))
}

fn profile_input(path: &Path, kind: &'static str, bytes: u64, sources: &[ProfileSource]) -> InputInfo {
    let several = sources.len() > 1;
    let mut info = InputInfo {
        path: path.display().to_string(),
        kind,
        bytes,
        format_version: String::new(),
        ..InputInfo::default()
    };
    for s in sources {
        if info.format_version.is_empty() {
            info.format_version = s.format.clone();
        }
        let prefix = if several { format!("{}: ", s.name) } else { String::new() };
        info.read.extend(s.read.iter().map(|r| format!("{prefix}{r}")));
        info.skipped.extend(s.skipped.iter().map(|r| format!("{prefix}{r}")));
    }
    info
}

fn profile_malformed(sources: &[ProfileSource]) -> Vec<Malformed> {
    sources.iter().flat_map(|s| s.malformed.iter().cloned()).collect()
}

/// An `nsys stats` report file (read with its siblings at the end) or an SQLite export (read now).
/// An `nsys export --type sqlite` database: read now.
fn read_nsys_sqlite(path: &Path, strict: bool, out: &mut TextArtifacts) -> Result<(), Error> {
    let shown = path.display().to_string();
    let data = nsys_sqlite::read(path).map_err(|e| Error::Input { path: shown, source: e.into() })?;
    let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
    let mut info = profile_input(path, "nsys_sqlite", bytes, &data.sources);
    note_malformed(&mut info, profile_malformed(&data.sources), strict)?;
    out.profile.merge(data);
    out.inputs.push(info);
    Ok(())
}

/// An `nsys stats` report file: read with its siblings at the end.
fn read_nsys(path: &Path, text: String, out: &mut TextArtifacts) {
    let shown = path.display().to_string();
    // The whole path names the report (its file name says which report it is): two ranks' same-named files stay
    // apart.
    let name = shown.clone();
    out.inputs.push(InputInfo {
        path: shown,
        kind: "nsys",
        bytes: text.len() as u64,
        format_version: String::new(),
        ..InputInfo::default()
    });
    out.nsys_files.push((out.inputs.len() - 1, name, text));
}

fn finish_nsys_files(opts: &LoadOptions, out: &mut TextArtifacts) -> Result<(), Error> {
    if out.nsys_files.is_empty() {
        return Ok(());
    }
    let files = std::mem::take(&mut out.nsys_files);
    let data = nsys::parse_files(files.iter().map(|(_, n, t)| (n.as_str(), t.as_str())))
        .map_err(|e| Error::Input { path: out.inputs[files[0].0].path.clone(), source: e.into() })?;
    for (i, name, _) in &files {
        let sources: Vec<ProfileSource> = data.sources.iter().filter(|s| &s.name == name).cloned().collect();
        let info = &mut out.inputs[*i];
        let filled = profile_input(Path::new(&info.path), "nsys", info.bytes, &sources);
        info.format_version = filled.format_version;
        info.read = filled.read;
        info.skipped = filled.skipped;
        note_malformed(info, profile_malformed(&sources), opts.strict)?;
    }
    out.profile.merge(data);
    Ok(())
}

/// A directory of `nsys stats --format csv --output` report files.
fn read_nsys_dir(dir: &Path, opts: &LoadOptions, out: &mut TextArtifacts) -> Result<(), Error> {
    let shown = dir.display().to_string();
    let data = nsys::read_dir(dir).map_err(|e| Error::Input { path: shown.clone(), source: ReadError::NsysDir(e) })?;
    let mut info = profile_input(dir, "nsys", 0, &data.sources);
    note_malformed(&mut info, profile_malformed(&data.sources), opts.strict)?;
    out.profile.merge(data);
    out.inputs.push(info);
    Ok(())
}

fn read_ncu(path: &Path, text: String, opts: &LoadOptions, out: &mut TextArtifacts) -> Result<(), Error> {
    let shown = path.display().to_string();
    let name = path.file_name().map_or_else(|| shown.clone(), |n| n.to_string_lossy().into_owned());
    let data = ncu::parse(&text, Some(&name)).map_err(|e| Error::Input { path: shown.clone(), source: e.into() })?;
    let mut info = profile_input(path, "ncu", text.len() as u64, &data.sources);
    note_malformed(&mut info, profile_malformed(&data.sources), opts.strict)?;
    out.profile.merge(data);
    out.inputs.push(info);
    Ok(())
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

/// Files at least this large get a progress bar (when stderr is a terminal).
const PROGRESS_MIN_BYTES: u64 = 64 << 20;

/// Reads one artifact into a timeline, recognising its format by content.
pub fn load(path: &Path, show_progress: bool) -> Result<Timeline, Error> {
    let shown = path.display().to_string();
    let io_err = |source| Error::Io { path: shown.clone(), source };
    let mut file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let mut head = [0u8; 2];
    let n = file.read(&mut head).map_err(io_err)?;
    drop(file);
    if n == 2 && !snapshot::sniff(&head) {
        return Err(Error::Input {
            path: shown,
            source: ReadError::Unrecognised(format!(
                "byte 0: not a recognised artifact: expected a PyTorch memory snapshot pickle (first byte 0x80), \
                 found {}",
                describe_start(&head)
            )),
        });
    }
    let file = File::open(path).map_err(io_err)?;
    let progress = (show_progress && len >= PROGRESS_MIN_BYTES && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(format!("reading {}", path.file_name().map_or(shown.clone(), |f| f.to_string_lossy().into())));
        bar
    });
    let callback = progress.clone().map(|bar| Box::new(move |pos: u64| bar.set_position(pos)) as Box<dyn FnMut(u64)>);
    let result = match read_ahead::ReadAhead::start(file) {
        Ok(ahead) => snapshot::read_sized(ahead, len, callback),
        Err(file) => snapshot::read_sized(file, len, callback),
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let snap = result.map_err(|e| Error::Input { path: shown.clone(), source: e.into() })?;
    let mut tl = snap.timeline;
    tl.inputs.push(InputInfo {
        path: shown,
        kind: "pytorch_snapshot",
        format_version: snap.format_version,
        bytes: len,
        pickle_protocol: Some(snap.protocol),
        ..InputInfo::default()
    });
    Ok(tl)
}

fn describe_start(head: &[u8]) -> String {
    let text: String = head.iter().map(|&b| if b.is_ascii_graphic() { b as char } else { '.' }).collect();
    format!("0x{:02x} 0x{:02x} ('{text}')", head[0], head[1])
}
