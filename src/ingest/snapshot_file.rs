//! A snapshot read into a timeline from a plain file (a long trace's later part on a second core, file reads on a
//! second thread) or from a stream (decompressed, or an archive's member): what the snapshot reader
//! (`reader.rs`) does with an input it recognised, and what a job does with the snapshot files it deferred.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::progress::progress_bar;
use super::IngestError as Error;
use super::{describe_start, pickle, read_ahead, reader, snapshot, unpack, ReadError, SplitRead};
use crate::timeline::{InputInfo, InputKind, Timeline};

/// Reads a snapshot file into a timeline; with `split`, a long trace's later part on a second core.
pub fn load(path: &Path, show_progress: bool, split: Option<SplitRead>) -> Result<Timeline, Error> {
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
    let progress = progress_bar(show_progress, len, &shown);
    let callback = progress.clone().map(|bar| Box::new(move |pos: u64| bar.set_position(pos)) as Box<dyn FnMut(u64)>);
    let split = split.and_then(|s| split_source(path, len, s));
    let result = match read_ahead::ReadAhead::start(file) {
        Ok(ahead) => snapshot::read_split(ahead, len, callback, split),
        Err(file) => snapshot::read_split(file, len, callback, split),
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let snap = result.map_err(|e| Error::Input { path: shown.clone(), source: e.into() })?;
    let mut tl = snap.timeline;
    tl.split_read = snap.split.map(|s| (s.records, s.from, s.to));
    tl.read_routes = Some(snap.routes);
    tl.inputs.push(InputInfo {
        path: shown,
        kind: InputKind::PytorchSnapshot,
        format_version: snap.format_version,
        bytes: len,
        pickle_protocol: Some(snap.protocol),
        backend: Some(tl.capture.backend),
        ..InputInfo::default()
    });
    Ok(tl)
}

/// How a plain file's trace is read in two parts at once (see `pickle::split`): by opening it again, for files of
/// `split.min_bytes` or more.
fn split_source(path: &Path, len: u64, split: SplitRead) -> Option<pickle::SplitSource> {
    if len < split.min_bytes {
        return None;
    }
    let path = path.to_path_buf();
    let reopen: pickle::Reopen = std::sync::Arc::new(move |offset| {
        use std::io::Seek;
        let mut f = File::open(&path)?;
        f.seek(std::io::SeekFrom::Start(offset))?;
        Ok(Box::new(f) as Box<dyn Read + Send>)
    });
    Some(pickle::SplitSource { reopen, len, patient: split.patient })
}

/// A snapshot that is not a plain file: a decompressed stream (read ahead on another thread, so decompressing and
/// parsing overlap) or an archive's member (read where it is). The progress bar counts the bytes on disk.
pub(super) fn load_stream(input: reader::Input, show_progress: bool) -> Result<Timeline, Error> {
    let (shown, compression, stored) = (input.name.clone(), input.compression, input.stored.clone());
    let progress = stored.as_ref().and_then(|c| progress_bar(show_progress, c.total, &shown));
    let callback = progress.clone().zip(stored.clone()).map(|(bar, c)| {
        Box::new(move |_: u64| bar.set_position(c.read.load(std::sync::atomic::Ordering::Relaxed)))
            as Box<dyn FnMut(u64)>
    });
    // Sized for the entries it is likely to hold: compressed pickles are about a fifth of their size.
    let len_hint = stored.as_ref().map_or(0, |c| c.total.saturating_mul(5));
    let result = match input.into_stream() {
        reader::Stream::Owned(r) => match read_ahead::ReadAhead::start(r) {
            Ok(ahead) => snapshot::read_sized(ahead, len_hint, callback),
            Err(r) => snapshot::read_sized(r, len_hint, callback),
        },
        reader::Stream::Borrowed(r) => snapshot::read_sized(r, len_hint, callback),
        reader::Stream::File => unreachable!("a plain file is read by `load`"),
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let snap = result.map_err(|e| match e {
        snapshot::SnapshotError::Pickle(pickle::PickleError::Io { source, .. })
            if unpack::limit_of(&source).is_some() =>
        {
            Error::Input { path: shown.clone(), source: ReadError::Unpack(unpack::limit_of(&source).expect("checked")) }
        }
        e => Error::Input { path: shown.clone(), source: e.into() },
    })?;
    let mut tl = snap.timeline;
    tl.read_routes = Some(snap.routes);
    tl.inputs.push(InputInfo {
        path: shown,
        kind: InputKind::PytorchSnapshot,
        format_version: snap.format_version,
        bytes: snap.bytes,
        pickle_protocol: Some(snap.protocol),
        backend: Some(tl.capture.backend),
        compression,
        ..InputInfo::default()
    });
    Ok(tl)
}
