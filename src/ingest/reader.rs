//! One interface for every input format, after inferno's `Collapse`: a reader says whether an input is in its
//! format ([`Reader::detect`], from the first bytes or the text) and reads it into what the job collects
//! ([`Reader::read`]). Recognising a file is asking the readers in [`READERS`] order; `--kind` picks one.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::{ncu, note_malformed, nsys, nsys_sqlite, nvidia_smi, oom_log, snapshot, vllm_log};
use super::{Collected, Kind, LoadOptions, ReadError};
use crate::timeline::profile::ProfileSource;
use crate::timeline::{InputInfo, Malformed};
use crate::Error;

/// What detection sees of an input: its name, its first bytes, and (for the readers of text formats) its text.
pub struct Detect<'a> {
    pub path: &'a Path,
    pub head: &'a [u8],
    /// The whole input as text; `None` while the binary formats are asked.
    pub text: Option<&'a str>,
}

/// One input format.
pub trait Reader: Sync {
    /// What `--kind` calls this format.
    fn kind(&self) -> Kind;
    /// Whether it is recognised from the first bytes alone (asked before any input is read whole).
    fn binary(&self) -> bool {
        false
    }
    /// Whether the input is in this format.
    fn detect(&self, input: &Detect) -> bool;
    /// Reads the input at `path` (its text, when detection read it) into what the job collects.
    fn read(&self, path: &Path, text: Option<String>, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error>;
}

/// Every reader, in the order detection asks them: binary formats first, then profiler exports (their header rows
/// are specific, and a console capture may quote the profiled program's own output, an OOM message included), then
/// logs, then nvidia-smi.
pub static READERS: [&dyn Reader; 6] =
    [&SnapshotReader, &NsysSqliteReader, &NcuReader, &NsysReader, &LogReader, &NvidiaSmiReader];

/// The reader `--kind` names (Nsight Systems: the SQLite export's reader when the file is a database).
fn reader_for(kind: Kind, path: &Path) -> Result<&'static dyn Reader, Error> {
    if kind == Kind::Nsys && NsysSqliteReader.detect(&Detect { path, head: &head(path)?, text: None }) {
        return Ok(&NsysSqliteReader);
    }
    Ok(*READERS.iter().find(|r| r.kind() == kind && !(kind == Kind::Nsys && r.binary())).expect("a reader per kind"))
}

/// Reads one input: a snapshot into a timeline of its own, anything else into what the text artifacts say.
pub(super) fn read_input(path: &Path, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
    if path.is_dir() {
        return read_nsys_dir(path, opts, job);
    }
    // Detecting a text format reads the input whole: its reader gets that text rather than reading it again.
    let (reader, text) = match opts.kind {
        Some(k) => (reader_for(k, path)?, None),
        None => detect(path)?,
    };
    reader.read(path, text, opts, job)
}

/// Recognises a file by its first bytes (a pickle, an SQLite database) or by what its text holds.
pub fn sniff_file(path: &Path) -> Result<Kind, Error> {
    detect(path).map(|(r, _)| r.kind())
}

fn head(path: &Path) -> Result<Vec<u8>, Error> {
    let mut head = vec![0u8; 16];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    head.truncate(n);
    Ok(head)
}

/// The reader of a file, and its text when detection had to read it whole.
fn detect(path: &Path) -> Result<(&'static dyn Reader, Option<String>), Error> {
    let head = head(path)?;
    let binary = Detect { path, head: &head, text: None };
    if let Some(r) = READERS.iter().find(|r| r.binary() && r.detect(&binary)) {
        return Ok((*r, None));
    }
    let text = read_all(path)?;
    let with_text = Detect { path, head: &head, text: Some(&text) };
    if let Some(r) = READERS.iter().find(|r| !r.binary() && r.detect(&with_text)) {
        return Ok((*r, Some(text)));
    }
    // The first two bytes, zero-padded as the error shows them.
    let two = [head.first().copied().unwrap_or(0), head.get(1).copied().unwrap_or(0)];
    let looks_binary = text.contains('\u{fffd}') || two.iter().any(|&b| b < 0x09);
    // A job's log that holds no OOM message is still its log: named like one, it is read as one (and says so).
    let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if !head.is_empty() && !looks_binary && matches!(ext.as_str(), "log" | "out" | "err" | "stderr" | "stdout") {
        return Ok((&LogReader, Some(text)));
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let shown_first: String = first.chars().take(60).collect();
    Err(Error::Input {
        path: path.display().to_string(),
        source: ReadError::Unrecognised(format!(
            "not a recognised artifact. Looked for: a PyTorch memory snapshot pickle (first byte 0x80), a training \
             log with a CUDA out-of-memory message, a vLLM log with KV-cache lines, nvidia-smi output (CSV, table, \
             -q, dmon, pmon), an Nsight Systems stats CSV or SQLite export, an Nsight Compute CSV. Found {}. Use --kind to say \
             which it is.",
            if head.is_empty() {
                "an empty file".to_string()
            } else if looks_binary {
                format!("binary data starting {}", super::describe_start(&two))
            } else {
                format!("text starting {shown_first:?}")
            }
        )),
    })
}

fn read_all(path: &Path) -> Result<String, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// The text a reader was handed, or the file's.
fn text_of(path: &Path, text: Option<String>) -> Result<String, Error> {
    text.map_or_else(|| read_all(path), Ok)
}

/// A PyTorch memory snapshot pickle: a timeline of its own.
pub struct SnapshotReader;

impl Reader for SnapshotReader {
    fn kind(&self) -> Kind {
        Kind::Snapshot
    }
    fn binary(&self) -> bool {
        true
    }
    fn detect(&self, input: &Detect) -> bool {
        // A pickle too short to hold anything is still handed to the snapshot reader, to say what is missing.
        (input.head.len() >= 2 && snapshot::sniff(&input.head[..2])) || input.head.first() == Some(&0x80)
    }
    fn read(&self, path: &Path, _: Option<String>, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        job.snapshots.push(super::load(path, opts.show_progress)?);
        Ok(())
    }
}

/// A training or serving log: OOM messages, vLLM KV-cache lines.
pub struct LogReader;

impl Reader for LogReader {
    fn kind(&self) -> Kind {
        Kind::Log
    }
    fn detect(&self, input: &Detect) -> bool {
        input.text.is_some_and(|t| oom_log::sniff(t) || vllm_log::sniff(t))
    }
    fn read(&self, path: &Path, text: Option<String>, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let text = text_of(path, text)?;
        let job = &mut job.text;
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
        job.ooms.extend(log.ooms);
        job.serving.merge(serving);
        job.inputs.push(info);
        Ok(())
    }
}

/// nvidia-smi output, in any of its forms.
pub struct NvidiaSmiReader;

impl Reader for NvidiaSmiReader {
    fn kind(&self) -> Kind {
        Kind::NvidiaSmi
    }
    fn detect(&self, input: &Detect) -> bool {
        input.text.is_some_and(nvidia_smi::sniff)
    }
    fn read(&self, path: &Path, text: Option<String>, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let text = text_of(path, text)?;
        let job = &mut job.text;
        let p = nvidia_smi::parse(&text, job.inputs.len(), opts.columns.as_deref());
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
        job.gpus.extend(p.gpus);
        job.inputs.push(info);
        Ok(())
    }
}

/// An `nsys export --type sqlite` database: read now.
pub struct NsysSqliteReader;

impl Reader for NsysSqliteReader {
    fn kind(&self) -> Kind {
        Kind::Nsys
    }
    fn binary(&self) -> bool {
        true
    }
    fn detect(&self, input: &Detect) -> bool {
        nsys_sqlite::sniff(input.head)
    }
    fn read(&self, path: &Path, _: Option<String>, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let (strict, job) = (opts.strict, &mut job.text);
        let shown = path.display().to_string();
        let data = nsys_sqlite::read(path).map_err(|e| Error::Input { path: shown, source: e.into() })?;
        let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
        let mut info = profile_input(path, "nsys_sqlite", bytes, &data.sources);
        note_malformed(&mut info, profile_malformed(&data.sources), strict)?;
        job.profile.merge(data);
        job.inputs.push(info);
        Ok(())
    }
}

/// An `nsys stats` report file (or a console capture of `nsys stats`): read with its siblings at the end.
pub struct NsysReader;

impl Reader for NsysReader {
    fn kind(&self) -> Kind {
        Kind::Nsys
    }
    fn detect(&self, input: &Detect) -> bool {
        let name = input.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        input.text.is_some_and(|t| nsys::sniff(t) || (t.trim().is_empty() && nsys::is_report_file_name(&name)))
    }
    fn read(&self, path: &Path, text: Option<String>, _: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let text = text_of(path, text)?;
        let job = &mut job.text;
        let shown = path.display().to_string();
        // The whole path names the report (its file name says which report it is): two ranks' same-named files stay
        // apart.
        let name = shown.clone();
        job.inputs.push(InputInfo {
            path: shown,
            kind: "nsys",
            bytes: text.len() as u64,
            format_version: String::new(),
            ..InputInfo::default()
        });
        job.nsys_files.push((job.inputs.len() - 1, name, text));
        Ok(())
    }
}

/// An Nsight Compute export: the CSV details or raw page, or the human-readable page.
pub struct NcuReader;

impl Reader for NcuReader {
    fn kind(&self) -> Kind {
        Kind::Ncu
    }
    fn detect(&self, input: &Detect) -> bool {
        input.text.is_some_and(ncu::sniff)
    }
    fn read(&self, path: &Path, text: Option<String>, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let text = text_of(path, text)?;
        let job = &mut job.text;
        let shown = path.display().to_string();
        let name = path.file_name().map_or_else(|| shown.clone(), |n| n.to_string_lossy().into_owned());
        let data =
            ncu::parse(&text, Some(&name)).map_err(|e| Error::Input { path: shown.clone(), source: e.into() })?;
        let mut info = profile_input(path, "ncu", text.len() as u64, &data.sources);
        note_malformed(&mut info, profile_malformed(&data.sources), opts.strict)?;
        job.profile.merge(data);
        job.inputs.push(info);
        Ok(())
    }
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

pub(super) fn finish_nsys_files(opts: &LoadOptions, out: &mut super::TextArtifacts) -> Result<(), Error> {
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
fn read_nsys_dir(dir: &Path, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
    let out = &mut job.text;
    let shown = dir.display().to_string();
    let data = nsys::read_dir(dir).map_err(|e| Error::Input { path: shown.clone(), source: ReadError::NsysDir(e) })?;
    let mut info = profile_input(dir, "nsys", 0, &data.sources);
    note_malformed(&mut info, profile_malformed(&data.sources), opts.strict)?;
    out.profile.merge(data);
    out.inputs.push(info);
    Ok(())
}
