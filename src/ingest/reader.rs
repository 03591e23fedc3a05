//! One interface for every input format, after inferno's `Collapse`: a reader says whether an input is in its
//! format ([`Reader::detect`], from the first bytes or the text) and reads it into what the job collects
//! ([`Reader::read`]). Recognising an input is asking the readers in [`READERS`] order; `--kind` picks one. An input
//! is a file, a decompressed stream or an archive's member ([`Input`]); `unpack.rs` makes them.

use std::io::Read;
use std::path::Path;

use super::unpack::Counted;
use super::IngestError as Error;
use super::{megatron_log, ncu, note_malformed, nsys, nsys_sqlite, nvidia_smi, oom_log, snapshot, vllm_log};
use super::{Collected, Kind, LoadOptions, ReadError};
use crate::timeline::profile::ProfileSource;
use crate::timeline::{InputInfo, InputKind, Malformed};

/// What detection sees of an input: its name, its first bytes, and (for the readers of text formats) its text.
pub struct Detect<'a> {
    pub name: &'a str,
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
    /// Reads the input into what the job collects.
    fn read(&self, input: Input, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error>;
}

/// Every reader, in the order detection asks them: binary formats first, then profiler exports (their header rows
/// are specific, and a console capture may quote the profiled program's own output, an OOM message included), then
/// logs, then nvidia-smi.
pub static READERS: [&dyn Reader; 7] =
    [&SnapshotReader, &NsysSqliteReader, &ReportReader, &NcuReader, &NsysReader, &LogReader, &NvidiaSmiReader];

/// Bytes read ahead to recognise an input (a tar header's magic sits at byte 257).
pub const HEAD: usize = 512;

/// One input as a reader gets it: a plain file, a decompressed stream, or an archive's member.
pub struct Input<'a> {
    /// What reports and errors call it: its path, or `job.tar.gz!rank0/snapshot.pickle`.
    pub name: String,
    /// The file on disk, when the input is one and not compressed: the readers' fastest paths (a read-ahead
    /// thread, SQLite opening the file itself).
    pub file: Option<&'a Path>,
    /// How the bytes were compressed (`gzip`, `zstd`, `xz`, `bzip2`).
    pub compression: Option<&'static str>,
    /// The first bytes (up to [`HEAD`]), already taken from the stream.
    pub head: Vec<u8>,
    rest: Stream<'a>,
    /// The whole input as text, once detection has read it.
    pub text: Option<String>,
    /// Bytes on disk and how many of them have been read, for a progress bar (compressed inputs).
    pub stored: Option<Counted>,
}

/// Where the bytes after an input's head come from.
pub enum Stream<'a> {
    /// The plain file `Input::file`, reopened by the reader.
    File,
    /// A stream that can move to another thread (a decompressed file): read ahead there.
    Owned(Box<dyn Read + Send>),
    /// A stream tied to its archive (a member), read where it is.
    Borrowed(Box<dyn Read + 'a>),
}

impl<'a> Input<'a> {
    /// A plain file; its head read.
    pub fn file(path: &'a Path) -> Result<Input<'a>, Error> {
        let mut head = Vec::with_capacity(HEAD);
        std::fs::File::open(path)
            .and_then(|f| f.take(HEAD as u64).read_to_end(&mut head))
            .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        Ok(Input {
            name: path.display().to_string(),
            file: Some(path),
            compression: None,
            head,
            rest: Stream::File,
            text: None,
            stored: None,
        })
    }

    /// A stream, its head read from it.
    pub fn stream(name: String, mut rest: Stream<'a>) -> Result<Input<'a>, Error> {
        let mut head = Vec::with_capacity(HEAD);
        let r = match &mut rest {
            Stream::Owned(r) => r.by_ref().take(HEAD as u64).read_to_end(&mut head),
            Stream::Borrowed(r) => r.by_ref().take(HEAD as u64).read_to_end(&mut head),
            Stream::File => Ok(0),
        };
        r.map_err(|e| io_error(&name, e))?;
        Ok(Input { name, file: None, compression: None, head, rest, text: None, stored: None })
    }

    /// The last part of the name: the file name a report's name says it is.
    pub fn file_name(&self) -> &str {
        self.name.rsplit(['/', '!', '\\']).next().unwrap_or(&self.name)
    }

    /// The whole input as text (invalid UTF-8 replaced), read once.
    pub fn text(&mut self) -> Result<&str, Error> {
        if self.text.is_none() {
            let bytes = self.take_bytes()?;
            self.text = Some(match String::from_utf8(bytes) {
                Ok(s) => s,
                Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
            });
        }
        Ok(self.text.as_deref().unwrap_or(""))
    }

    /// The whole input as bytes (consumes the stream; the head stays).
    fn take_bytes(&mut self) -> Result<Vec<u8>, Error> {
        if let Stream::File = self.rest {
            let path = self.file.expect("a file input has its path");
            return std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source });
        }
        let mut bytes = std::mem::take(&mut self.head);
        let r = match &mut self.rest {
            Stream::File => Ok(0),
            Stream::Owned(r) => r.read_to_end(&mut bytes),
            Stream::Borrowed(r) => r.read_to_end(&mut bytes),
        };
        r.map_err(|e| io_error(&self.name, e))?;
        self.rest = Stream::Borrowed(Box::new(std::io::empty()));
        self.head = bytes.iter().take(HEAD).copied().collect();
        Ok(bytes)
    }

    /// The text, taken.
    pub fn into_text(mut self) -> Result<String, Error> {
        self.text()?;
        Ok(self.text.take().unwrap_or_default())
    }

    /// The bytes, taken.
    pub fn into_bytes(mut self) -> Result<Vec<u8>, Error> {
        match self.text.take() {
            Some(t) => Ok(t.into_bytes()),
            None => self.take_bytes(),
        }
    }

    /// The stream from its first byte: owned when it can move to another thread.
    pub fn into_stream(self) -> Stream<'a> {
        let head = std::io::Cursor::new(self.head);
        match self.rest {
            Stream::File => Stream::File,
            Stream::Owned(r) => Stream::Owned(Box::new(head.chain(r))),
            Stream::Borrowed(r) => Stream::Borrowed(Box::new(head.chain(r))),
        }
    }
}

/// A read error of a stream: an unpacking limit says itself, anything else is an io error of the input.
fn io_error(name: &str, e: std::io::Error) -> Error {
    match super::unpack::limit_of(&e) {
        Some(limit) => Error::Input { path: name.to_string(), source: ReadError::Unpack(limit) },
        None => Error::Io { path: name.to_string(), source: e },
    }
}

/// The reader `--kind` names (Nsight Systems: the SQLite export's reader when the input is a database).
pub(super) fn reader_for(kind: Kind, input: &Input) -> &'static dyn Reader {
    if kind == Kind::Nsys && NsysSqliteReader.detect(&Detect { name: &input.name, head: &input.head, text: None }) {
        return &NsysSqliteReader;
    }
    *READERS.iter().find(|r| r.kind() == kind && !(kind == Kind::Nsys && r.binary())).expect("a reader per kind")
}

/// Recognises a file by its first bytes (a pickle, an SQLite database, a compressed file) or by what its text holds.
pub fn sniff_file(path: &Path) -> Result<Kind, Error> {
    let mut input = Input::file(path)?;
    detect_reader(&mut input).and_then(|r| r.ok_or_else(|| unrecognised(&mut input))).map(|r| r.kind())
}

/// The reader of an input, if any knows it; its text is read into `input` when detection needs it.
pub(super) fn detect_reader(input: &mut Input) -> Result<Option<&'static dyn Reader>, Error> {
    let binary = Detect { name: &input.name, head: &input.head, text: None };
    if let Some(r) = READERS.iter().find(|r| r.binary() && r.detect(&binary)) {
        return Ok(Some(*r));
    }
    let head = input.head.clone();
    let name = input.name.clone();
    let text = input.text()?;
    let with_text = Detect { name: &name, head: &head, text: Some(text) };
    if let Some(r) = READERS.iter().find(|r| !r.binary() && r.detect(&with_text)) {
        return Ok(Some(*r));
    }
    // A job's log that holds no OOM message is still its log: named like one, it is read as one (and says so).
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    if !head.is_empty()
        && !looks_binary(&head, text)
        && matches!(ext.as_str(), "log" | "out" | "err" | "stderr" | "stdout")
    {
        return Ok(Some(&LogReader));
    }
    Ok(None)
}

/// The first two bytes, zero-padded as errors show them.
fn first_two(head: &[u8]) -> [u8; 2] {
    [head.first().copied().unwrap_or(0), head.get(1).copied().unwrap_or(0)]
}

fn looks_binary(head: &[u8], text: &str) -> bool {
    text.contains('\u{fffd}') || first_two(head).iter().any(|&b| b < 0x09)
}

/// Why no reader knows an input: what was looked for and what was found.
pub(super) fn unrecognised(input: &mut Input) -> Error {
    let text = input.text.as_deref().unwrap_or("");
    let head = &input.head;
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let shown_first: String = first.chars().take(60).collect();
    Error::Input {
        path: input.name.clone(),
        source: ReadError::Unrecognised(format!(
            "not a recognised artifact. Looked for: a PyTorch memory snapshot pickle (first byte 0x80), a training \
             log with a CUDA out-of-memory message, a vLLM log with KV-cache lines, nvidia-smi output (CSV, table, \
             -q, dmon, pmon), an Nsight Systems stats CSV or SQLite export, an Nsight Compute CSV, any of them \
             compressed (gzip, zstd, xz, bzip2) or in an archive (tar, zip) or a folder. Found {}. Use --kind to say \
             which it is.",
            if head.is_empty() {
                "an empty file".to_string()
            } else if looks_binary(head, text) {
                format!("binary data starting {}", super::describe_start(&first_two(head)))
            } else {
                format!("text starting {shown_first:?}")
            }
        )),
    }
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
    fn read(&self, input: Input, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let tl = match input.file {
            Some(path) if opts.defer_snapshot_files => {
                job.defer_snapshot(path);
                return Ok(());
            }
            Some(path) => super::load(path, opts.show_progress, opts.split_read)?,
            None => super::load_stream(input, opts.show_progress)?,
        };
        job.push_snapshot(tl);
        Ok(())
    }
}

/// oomdoc's own JSON report of one rank: a row of the job view, read back for the reduce step.
pub struct ReportReader;

impl Reader for ReportReader {
    fn kind(&self) -> Kind {
        Kind::Report
    }
    fn detect(&self, input: &Detect) -> bool {
        // Before the logs: a report quotes the OOM messages it read.
        input.text.is_some_and(super::oomdoc_report::sniff)
    }
    fn read(&self, input: Input, _opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let shown = input.name.clone();
        let text = input.into_text()?;
        let ranks = super::oomdoc_report::parse(&text, &shown)
            .map_err(|source| Error::Input { path: shown.clone(), source })?;
        job.reported.extend(ranks);
        Ok(())
    }
}

/// A training or serving log: OOM messages, vLLM KV-cache lines, Megatron-LM's memory lines.
pub struct LogReader;

impl Reader for LogReader {
    fn kind(&self) -> Kind {
        Kind::Log
    }
    fn detect(&self, input: &Detect) -> bool {
        input.text.is_some_and(|t| oom_log::sniff(t) || vllm_log::sniff(t) || megatron_log::sniff(t))
    }
    fn read(&self, input: Input, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let (shown, compression) = (input.name.clone(), input.compression);
        let text = input.into_text()?;
        let job = &mut job.text;
        let mut info = InputInfo {
            path: shown.clone(),
            compression,
            kind: InputKind::Log,
            format_version: String::new(),
            bytes: text.len() as u64,
            ..InputInfo::default()
        };
        let log = oom_log::parse(&text, &shown);
        let serving = vllm_log::parse(&text, &shown);
        let megatron = megatron_log::parse(&text, &shown);
        if !log.ooms.is_empty() {
            info.read.push(format!(
                "{} out-of-memory report{}",
                log.ooms.len(),
                if log.ooms.len() == 1 { "" } else { "s" }
            ));
        }
        if !serving.is_empty() {
            info.kind = InputKind::VllmLog;
            let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
            let mut parts = Vec::new();
            let c = &serving.capacity;
            if c.gpu_blocks.is_some() || c.tokens.is_some() || c.kv_bytes.is_some() || c.max_concurrency.is_some() {
                parts.push("KV-cache capacity".to_string());
            }
            if c.too_small.is_some() || c.no_cache_memory {
                parts.push("a KV-cache capacity failure".to_string());
            }
            if c.cuda_graph_bytes.is_some() {
                parts.push("the CUDA-graph estimate".to_string());
            }
            if c.oom_in_cudagraph_capture {
                parts.push("an OOM in CUDA-graph capture".to_string());
            }
            if !serving.stats.is_empty() {
                parts.push(plural(serving.stats.len(), "KV-cache usage line"));
            }
            if !serving.preemptions.is_empty() {
                parts.push(plural(serving.preemptions.len(), "preemption"));
            }
            info.read.push(format!("vLLM: {}", parts.join(", ")));
        }
        if !megatron.is_empty() {
            let mut parts = Vec::new();
            if megatron.weight_optimizer_bytes.is_some() {
                parts.push("the theoretical memory footprint".to_string());
            }
            if !megatron.reports.is_empty() {
                let n = megatron.reports.len();
                parts.push(format!("{n} memory report{}", if n == 1 { "" } else { "s" }));
            }
            info.read.push(format!("Megatron-LM: {}", parts.join(", ")));
        }
        if info.read.is_empty() {
            info.read.push("no out-of-memory report and no vLLM KV-cache line".into());
        }
        note_malformed(&mut info, log.malformed, opts.strict)?;
        job.ooms.extend(log.ooms);
        job.serving.merge(serving);
        job.megatron.merge(megatron);
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
    fn read(&self, input: Input, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let (shown, compression) = (input.name.clone(), input.compression);
        let text = input.into_text()?;
        let job = &mut job.text;
        let p = nvidia_smi::parse(&text, job.inputs.len(), opts.columns.as_deref());
        let mut info = InputInfo {
            path: shown,
            compression,
            kind: InputKind::NvidiaSmi,
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
    fn read(&self, input: Input, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let (strict, job) = (opts.strict, &mut job.text);
        let (shown, compression) = (input.name.clone(), input.compression);
        let (data, bytes) = match input.file {
            Some(path) => (nsys_sqlite::read(path), std::fs::metadata(path).map_or(0, |m| m.len())),
            // SQLite reads a database in memory as well as on disk: nothing is written out.
            None => {
                let name = input.file_name().to_string();
                let bytes = input.into_bytes()?;
                (nsys_sqlite::read_bytes(&bytes, &name), bytes.len() as u64)
            }
        };
        let data = data.map_err(|e| Error::Input { path: shown.clone(), source: e.into() })?;
        let mut info = profile_input(&shown, InputKind::NsysSqlite, bytes, &data.sources);
        info.compression = compression;
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
        let name = input.name.rsplit(['/', '!', '\\']).next().unwrap_or(input.name);
        input.text.is_some_and(|t| nsys::sniff(t) || (t.trim().is_empty() && nsys::is_report_file_name(name)))
    }
    fn read(&self, input: Input, _: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let (shown, compression) = (input.name.clone(), input.compression);
        let text = input.into_text()?;
        let job = &mut job.text;
        // The whole path names the report (its file name says which report it is): two ranks' same-named files stay
        // apart.
        let name = shown.clone();
        job.inputs.push(InputInfo {
            path: shown,
            compression,
            kind: InputKind::Nsys,
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
    fn read(&self, input: Input, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
        let (shown, compression, name) = (input.name.clone(), input.compression, input.file_name().to_string());
        let text = input.into_text()?;
        let job = &mut job.text;
        let data =
            ncu::parse(&text, Some(&name)).map_err(|e| Error::Input { path: shown.clone(), source: e.into() })?;
        let mut info = profile_input(&shown, InputKind::Ncu, text.len() as u64, &data.sources);
        info.compression = compression;
        note_malformed(&mut info, profile_malformed(&data.sources), opts.strict)?;
        job.profile.merge(data);
        job.inputs.push(info);
        Ok(())
    }
}

fn profile_input(path: &str, kind: InputKind, bytes: u64, sources: &[ProfileSource]) -> InputInfo {
    let several = sources.len() > 1;
    let mut info =
        InputInfo { path: path.to_string(), kind, bytes, format_version: String::new(), ..InputInfo::default() };
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
        let filled = profile_input(&info.path, InputKind::Nsys, info.bytes, &sources);
        info.format_version = filled.format_version;
        info.read = filled.read;
        info.skipped = filled.skipped;
        note_malformed(info, profile_malformed(&sources), opts.strict)?;
    }
    out.profile.merge(data);
    Ok(())
}

/// A directory of `nsys stats --format csv --output` report files.
pub(super) fn read_nsys_dir(dir: &Path, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
    let out = &mut job.text;
    let shown = dir.display().to_string();
    let data = nsys::read_dir(dir).map_err(|e| Error::Input { path: shown.clone(), source: ReadError::NsysDir(e) })?;
    let mut info = profile_input(&shown, InputKind::Nsys, 0, &data.sources);
    note_malformed(&mut info, profile_malformed(&data.sources), opts.strict)?;
    out.profile.merge(data);
    out.inputs.push(info);
    Ok(())
}
