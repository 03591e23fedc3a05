//! What users attach, opened: compressed files (gzip, zstd, xz, bzip2, recognised by their magic bytes, not their
//! names), archives (tar, possibly compressed, and zip) and folders. Each member or file is recognised by content
//! and read as if it had been given on its own; members that are nothing oomdoc reads are listed once as skipped.
//! Nothing is written to disk: decompression streams into the readers, and an archive's members are read straight
//! out of it.
//!
//! Limits keep a hostile archive from taking the machine: members are counted, unpacked bytes summed, and a stream
//! that unpacks to more than `max_ratio` times its stored size (past 64 MiB) is stopped as a bomb.

use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::reader::{detect_reader, reader_for, unrecognised, Input, Stream};
use super::IngestError as Error;
use super::{Collected, LoadOptions, ReadError};
use crate::timeline::{InputInfo, InputKind};

/// How much an archive may unpack to, and hold. `--max-members`, `--max-unpacked` set the first two.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Members of one archive (and files of one folder) read at most.
    pub max_members: usize,
    /// Bytes one input may unpack to, all its members together.
    pub max_unpacked_bytes: u64,
    /// Unpacked ÷ stored above which a stream is a bomb (checked past 64 MiB unpacked).
    pub max_ratio: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_members: 10_000, max_unpacked_bytes: 256 << 30, max_ratio: 1000 }
    }
}

/// Which limit an input went past.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Limit {
    #[error("more than {0} members (--max-members): not read")]
    Members(usize),
    #[error("unpacks to more than {} (--max-unpacked): not read", crate::units::bytes(*.0))]
    Bytes(u64),
    #[error("unpacks to more than {0} times its size (a decompression bomb? --max-ratio): not read")]
    Ratio(u64),
}

/// The unpacking limit an io error carries, if it is one.
pub fn limit_of(e: &io::Error) -> Option<Limit> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Limit>()).cloned()
}

/// Bytes on disk of an input and how many have been read so far (shared with the reader counting them).
#[derive(Clone, Debug)]
pub struct Counted {
    pub total: u64,
    pub read: Arc<AtomicU64>,
}

/// Counts the bytes read through it.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The unpacked side of a decompressor or an archive member: sums what every stream of one input unpacked
/// and stops at the limits.
struct Guarded<R> {
    inner: R,
    unpacked: Arc<AtomicU64>,
    stored: Arc<AtomicU64>,
    limits: Limits,
}

/// Past this much unpacked, the ratio to the stored bytes is checked.
const RATIO_FROM: u64 = 64 << 20;

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.unpacked.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if total > self.limits.max_unpacked_bytes {
            return Err(io::Error::other(Limit::Bytes(self.limits.max_unpacked_bytes)));
        }
        let stored = self.stored.load(Ordering::Relaxed).max(1);
        if total > RATIO_FROM && total / stored > self.limits.max_ratio {
            return Err(io::Error::other(Limit::Ratio(self.limits.max_ratio)));
        }
        Ok(n)
    }
}

/// The accounting of one input given by the user: its stored bytes read, its unpacked bytes.
#[derive(Clone)]
struct Budget {
    stored: Arc<AtomicU64>,
    unpacked: Arc<AtomicU64>,
    limits: Limits,
}

impl Budget {
    fn new(limits: Limits) -> Budget {
        Budget { stored: Arc::default(), unpacked: Arc::default(), limits }
    }

    fn guard<R: Read>(&self, inner: R) -> Guarded<R> {
        Guarded { inner, unpacked: self.unpacked.clone(), stored: self.stored.clone(), limits: self.limits }
    }
}

/// A compression format, by its magic bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Gzip,
    Zstd,
    Xz,
    Bzip2,
}

impl Codec {
    pub fn of(head: &[u8]) -> Option<Codec> {
        Some(match head {
            [0x1f, 0x8b, ..] => Codec::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Codec::Zstd,
            [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => Codec::Xz,
            [b'B', b'Z', b'h', b'1'..=b'9', ..] => Codec::Bzip2,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Gzip => "gzip",
            Codec::Zstd => "zstd",
            Codec::Xz => "xz",
            Codec::Bzip2 => "bzip2",
        }
    }

    /// A decoder of `r`; concatenated members (gzip, bzip2, xz) and frames (zstd) are all read.
    fn decoder<R: Read>(self, r: R) -> io::Result<Decoder<R>> {
        Ok(match self {
            Codec::Gzip => Decoder::Gzip(flate2::read::MultiGzDecoder::new(io::BufReader::with_capacity(1 << 16, r))),
            Codec::Zstd => Decoder::Zstd(zstd::stream::read::Decoder::new(r)?),
            Codec::Xz => Decoder::Xz(xz2::read::XzDecoder::new_multi_decoder(r)),
            Codec::Bzip2 => Decoder::Bzip2(bzip2::read::MultiBzDecoder::new(r)),
        })
    }
}

/// A decompressing reader; `Send` when its source is, so a decompressed file can be read ahead on another thread.
enum Decoder<R: Read> {
    Gzip(flate2::read::MultiGzDecoder<io::BufReader<R>>),
    Zstd(zstd::stream::read::Decoder<'static, io::BufReader<R>>),
    Xz(xz2::read::XzDecoder<R>),
    Bzip2(bzip2::read::MultiBzDecoder<R>),
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Gzip(d) => d.read(buf),
            Decoder::Zstd(d) => d.read(buf),
            Decoder::Xz(d) => d.read(buf),
            Decoder::Bzip2(d) => d.read(buf),
        }
    }
}

fn is_zip(head: &[u8]) -> bool {
    head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06")
}

fn is_tar(head: &[u8]) -> bool {
    head.get(257..262) == Some(b"ustar")
}

/// Reads one input the user gave: a folder, an archive, a compressed file or a plain one. An input the user named
/// is read or is an error: one that is recognised but not read (compressed twice) says so, never passes silently.
pub(super) fn read_path(path: &Path, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
    match read_any(path, opts, job)? {
        Outcome::Read => Ok(()),
        Outcome::Skipped(why) => {
            Err(Error::Input { path: path.display().to_string(), source: ReadError::NotRead(why) })
        }
    }
}

fn read_any(path: &Path, opts: &LoadOptions, job: &mut Collected) -> Result<Outcome, Error> {
    if path.is_dir() {
        return read_folder(path, opts, job).map(|_| Outcome::Read);
    }
    let input = Input::file(path)?;
    if let Some(kind) = opts.kind.filter(|_| Codec::of(&input.head).is_none() && !is_zip(&input.head)) {
        return reader_for(kind, &input).read(input, opts, job).map(|_| Outcome::Read);
    }
    let budget = Budget::new(opts.limits);
    if is_zip(&input.head) {
        return read_zip(path, opts, job, &budget).map(|_| Outcome::Read);
    }
    if let Some(codec) = Codec::of(&input.head) {
        let io_err = |source| Error::Io { path: input.name.clone(), source };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let total = file.metadata().map_err(io_err)?.len();
        let counted = Counting { inner: file, read: budget.stored.clone() };
        let stream = budget.guard(codec.decoder(counted).map_err(io_err)?);
        let mut inner = Input::stream(input.name.clone(), Stream::Owned(Box::new(stream)))?;
        inner.compression = Some(codec.name());
        inner.stored = Some(Counted { total, read: budget.stored.clone() });
        if is_tar(&inner.head) {
            let name = inner.name.clone();
            let format = format!("tar.{}", short_codec(codec));
            let Stream::Owned(src) = inner.into_stream() else { unreachable!("a decompressed file is owned") };
            return read_tar(&name, &format, src, total, opts, job, &budget).map(|_| Outcome::Read);
        }
        return read_one(inner, opts, job, &budget, 0, true);
    }
    if is_tar(&input.head) {
        let file = std::fs::File::open(path).map_err(|source| Error::Io { path: input.name.clone(), source })?;
        let total = file.metadata().map_or(0, |m| m.len());
        let counted = Counting { inner: file, read: budget.stored.clone() };
        return read_tar(&input.name.clone(), "tar", Box::new(counted), total, opts, job, &budget)
            .map(|_| Outcome::Read);
    }
    read_one(input, opts, job, &budget, 0, true)
}

fn short_codec(c: Codec) -> &'static str {
    match c {
        Codec::Gzip => "gz",
        Codec::Zstd => "zst",
        Codec::Xz => "xz",
        Codec::Bzip2 => "bz2",
    }
}

/// What became of one member of an archive or file of a folder.
enum Outcome {
    Read,
    /// Not anything oomdoc reads: why.
    Skipped(String),
}

/// Reads one input (a file, a decompressed stream, a member): decompressing or descending into it first when it
/// is compressed or an archive (members nest at most `MAX_NESTING` deep). `given`: the user named it, so an
/// unrecognised input is an error rather than a skipped member.
fn read_one(
    mut input: Input,
    opts: &LoadOptions,
    job: &mut Collected,
    budget: &Budget,
    depth: usize,
    given: bool,
) -> Result<Outcome, Error> {
    if let Some(codec) = Codec::of(&input.head) {
        if input.compression.is_some() || depth >= MAX_NESTING {
            let outer = input.compression.unwrap_or("an archive");
            return Ok(Outcome::Skipped(format!(
                "compressed twice ({} inside {outer}): decompress it once, then give oomdoc the result",
                codec.name()
            )));
        }
        let name = input.name.clone();
        let inner = match input.into_stream() {
            Stream::Owned(r) => Stream::Owned(Box::new(budget.guard(codec.decoder(r).map_err(|e| io_err(&name, e))?))),
            Stream::Borrowed(r) => {
                Stream::Borrowed(Box::new(budget.guard(codec.decoder(r).map_err(|e| io_err(&name, e))?)))
            }
            Stream::File => {
                let path = std::path::PathBuf::from(&name);
                let file = std::fs::File::open(&path).map_err(|e| io_err(&name, e))?;
                Stream::Owned(Box::new(budget.guard(codec.decoder(file).map_err(|e| io_err(&name, e))?)))
            }
        };
        let mut inner = Input::stream(name, inner)?;
        inner.compression = Some(codec.name());
        return read_one(inner, opts, job, budget, depth + 1, given);
    }
    if depth > 0 && (is_tar(&input.head) || is_zip(&input.head)) {
        return Ok(Outcome::Skipped("an archive inside an archive: unpack it first".into()));
    }
    let reader = match opts.kind {
        Some(k) => Some(reader_for(k, &input)),
        None => detect_reader(&mut input)?,
    };
    match reader {
        Some(r) => {
            r.read(input, opts, job)?;
            Ok(Outcome::Read)
        }
        None if given => Err(unrecognised(&mut input)),
        None => {
            let why = match unrecognised(&mut input) {
                Error::Input { source: ReadError::Unrecognised(m), .. } => {
                    m.split(". Found ").nth(1).map_or("not an artifact oomdoc reads".to_string(), |f| {
                        format!("not an artifact oomdoc reads ({})", f.split(". Use --kind").next().unwrap_or(f))
                    })
                }
                other => other.to_string(),
            };
            Ok(Outcome::Skipped(why))
        }
    }
}

/// Archives inside archives, compression inside compression: this deep at most.
const MAX_NESTING: usize = 2;

fn io_err(name: &str, e: io::Error) -> Error {
    match limit_of(&e) {
        Some(l) => Error::Input { path: name.to_string(), source: ReadError::Unpack(l) },
        None => Error::Io { path: name.to_string(), source: e },
    }
}

/// What a container (archive or folder) read and skipped, as an input of its own in the report.
fn container_info(
    name: &str,
    kind: InputKind,
    format: &str,
    bytes: u64,
    read: usize,
    skipped: Vec<String>,
) -> InputInfo {
    let what = if kind == InputKind::Folder { "file" } else { "member" };
    let mut info = InputInfo {
        path: name.to_string(),
        kind,
        format_version: format.to_string(),
        bytes,
        skipped,
        ..InputInfo::default()
    };
    info.read.push(format!("{read} {what}{} read", if read == 1 { "" } else { "s" }));
    info
}

/// The members of a tar archive, in order, each read straight out of it.
fn read_tar(
    name: &str,
    format: &str,
    src: Box<dyn Read + '_>,
    total: u64,
    opts: &LoadOptions,
    job: &mut Collected,
    budget: &Budget,
) -> Result<(), Error> {
    let progress = super::progress_bar(opts.show_progress, total, name);
    let mut archive = tar::Archive::new(src);
    let entries = archive.entries().map_err(|e| io_err(name, e))?;
    let (mut count, mut read, mut skipped) = (0usize, 0usize, Vec::new());
    let member_opts = LoadOptions { show_progress: false, ..opts.clone() };
    let mut member_failed = false;
    let failed_before = job.failed.len();
    let first_seq = job.seq;
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            // A member that failed to read left the stream where it broke: that member's error already says
            // why, and a second line for the archive would only repeat it.
            Err(_) if member_failed => {
                skipped.push("the rest: not read, the archive is damaged at the member above".to_string());
                break;
            }
            Err(e) => return Err(io_err(name, e)),
        };
        member_failed = false;
        count += 1;
        if count > opts.limits.max_members {
            return Err(Error::Input {
                path: name.to_string(),
                source: ReadError::Unpack(Limit::Members(opts.limits.max_members)),
            });
        }
        if let Some(bar) = &progress {
            bar.set_position(budget.stored.load(Ordering::Relaxed));
        }
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let member = entry.path().map_or_else(|_| "?".into(), |p| p.display().to_string());
        let input = Input::stream(format!("{name}!{member}"), Stream::Borrowed(Box::new(budget.guard(entry))))?;
        match read_one(input, &member_opts, job, budget, 1, false) {
            Ok(Outcome::Read) => read += 1,
            Ok(Outcome::Skipped(why)) => skipped.push(format!("{member}: {why}")),
            Err(e @ Error::Input { source: ReadError::Unpack(_), .. }) => return Err(relabel(e, name)),
            Err(e) => {
                member_failed = true;
                job.failed.push(e)
            }
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    if read == 0 && job.failed.len() == failed_before {
        return Err(Error::Input { path: name.to_string(), source: ReadError::NothingInArchive(skipped.len()) });
    }
    job.order_by_name_since(first_seq);
    job.text.inputs.push(container_info(name, InputKind::Archive, format, total, read, skipped));
    Ok(())
}

/// A limit crossed inside an archive is the archive's error.
fn relabel(e: Error, archive: &str) -> Error {
    match e {
        Error::Input { source, .. } => Error::Input { path: archive.to_string(), source },
        other => other,
    }
}

/// The members of a zip archive, in their order in it; their declared sizes are checked against the limits first.
fn read_zip(path: &Path, opts: &LoadOptions, job: &mut Collected, budget: &Budget) -> Result<(), Error> {
    let name = path.display().to_string();
    let zip_err = |e: zip::result::ZipError| Error::Input { path: name.clone(), source: ReadError::Zip(Box::new(e)) };
    let file = std::fs::File::open(path).map_err(|source| Error::Io { path: name.clone(), source })?;
    let total = file.metadata().map_or(0, |m| m.len());
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    let limits = opts.limits;
    let limit = |l| Error::Input { path: name.clone(), source: ReadError::Unpack(l) };
    if archive.len() > limits.max_members {
        return Err(limit(Limit::Members(limits.max_members)));
    }
    let mut declared = 0u64;
    for i in 0..archive.len() {
        let f = archive.by_index_raw(i).map_err(zip_err)?;
        declared = declared.saturating_add(f.size());
        if f.size() > RATIO_FROM && f.size() / f.compressed_size().max(1) > limits.max_ratio {
            return Err(limit(Limit::Ratio(limits.max_ratio)));
        }
    }
    if declared > limits.max_unpacked_bytes {
        return Err(limit(Limit::Bytes(limits.max_unpacked_bytes)));
    }
    let progress = super::progress_bar(opts.show_progress, total, &name);
    let member_opts = LoadOptions { show_progress: false, ..opts.clone() };
    let (mut read, mut skipped) = (0usize, Vec::new());
    let failed_before = job.failed.len();
    let first_seq = job.seq;
    for i in 0..archive.len() {
        let mut f = archive.by_index(i).map_err(zip_err)?;
        if !f.is_file() {
            continue;
        }
        // The stored bytes this member adds, for the ratio check and the bar: its compressed size.
        budget.stored.fetch_add(f.compressed_size(), Ordering::Relaxed);
        if let Some(bar) = &progress {
            bar.set_position(budget.stored.load(Ordering::Relaxed));
        }
        let member = f.name().map_or_else(|_| format!("member {i}"), |n| n.to_string());
        let input = Input::stream(format!("{name}!{member}"), Stream::Borrowed(Box::new(budget.guard(&mut f))))?;
        match read_one(input, &member_opts, job, budget, 1, false) {
            Ok(Outcome::Read) => read += 1,
            Ok(Outcome::Skipped(why)) => skipped.push(format!("{member}: {why}")),
            Err(e @ Error::Input { source: ReadError::Unpack(_), .. }) => return Err(relabel(e, &name)),
            Err(e) => job.failed.push(e),
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    if read == 0 && job.failed.len() == failed_before {
        return Err(Error::Input { path: name, source: ReadError::NothingInArchive(skipped.len()) });
    }
    job.order_by_name_since(first_seq);
    job.text.inputs.push(container_info(&name, InputKind::Archive, "zip", total, read, skipped));
    Ok(())
}

/// Folders are walked this deep at most.
const MAX_DEPTH: usize = 8;

/// A folder: every file in it and below, in name order, read as if given on its own. A folder of `nsys stats`
/// report files alone is read as one capture, as before. Links are followed only where they stay inside it.
fn read_folder(dir: &Path, opts: &LoadOptions, job: &mut Collected) -> Result<(), Error> {
    if is_nsys_report_folder(dir) {
        return super::reader::read_nsys_dir(dir, opts, job);
    }
    let name = dir.display().to_string();
    let root = dir.canonicalize().map_err(|source| Error::Io { path: name.clone(), source })?;
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    walk(dir, &root, 0, &mut files, &mut skipped).map_err(|source| Error::Io { path: name.clone(), source })?;
    if files.len() > opts.limits.max_members {
        return Err(Error::Input { path: name, source: ReadError::Unpack(Limit::Members(opts.limits.max_members)) });
    }
    let mut read = 0usize;
    for f in &files {
        let input = match Input::file(f) {
            Ok(i) => i,
            Err(e) => {
                job.failed.push(e);
                continue;
            }
        };
        let budget = Budget::new(opts.limits);
        let rel = f.strip_prefix(dir).unwrap_or(f).display().to_string();
        let outcome = if is_zip(&input.head)
            || (is_tar(&input.head) && Codec::of(&input.head).is_none())
            || Codec::of(&input.head).is_some()
        {
            read_any(f, opts, job)
        } else {
            read_one(input, opts, job, &budget, 0, false)
        };
        match outcome {
            Ok(Outcome::Read) => read += 1,
            Ok(Outcome::Skipped(why)) => skipped.push(format!("{rel}: {why}")),
            Err(e) => job.failed.push(e),
        }
    }
    if read == 0 && job.failed.is_empty() {
        return Err(Error::Input { path: name, source: ReadError::NothingInFolder(files.len()) });
    }
    job.text.inputs.push(container_info(&name, InputKind::Folder, "folder", 0, read, skipped));
    Ok(())
}

/// The files under `dir` (sorted, links inside `root` followed), and the entries left out, with why.
fn walk(
    dir: &Path,
    root: &Path,
    depth: usize,
    files: &mut Vec<std::path::PathBuf>,
    skipped: &mut Vec<String>,
) -> io::Result<()> {
    let mut entries: Vec<std::path::PathBuf> =
        std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let shown = p.strip_prefix(root).unwrap_or(&p).display().to_string();
        let link = p.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink());
        if link && !p.canonicalize().is_ok_and(|t| t.starts_with(root)) {
            skipped.push(format!("{shown}: a link out of the folder, not followed"));
            continue;
        }
        if p.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                skipped.push(format!("{shown}: more than {MAX_DEPTH} folders deep, not read"));
            } else if !link {
                walk(&p, root, depth + 1, files, skipped)?;
            }
        } else if p.is_file() {
            files.push(p);
        }
    }
    Ok(())
}

/// A folder holding only `nsys stats --format csv --output` report files (and console captures).
fn is_nsys_report_folder(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let mut any = false;
    for e in entries.flatten() {
        let p = e.path();
        if !p.is_file() {
            return false;
        }
        let file_name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !(file_name.ends_with(".csv") || file_name.ends_with(".txt")) {
            return false;
        }
        any |= super::nsys::is_report_file_name(&file_name);
    }
    any
}
