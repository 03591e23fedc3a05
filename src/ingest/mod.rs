//! Readers for the artifacts a failed job leaves behind, one module per format, all producing a [`Timeline`].

pub mod oom_log;
pub mod pickle;
pub mod snapshot;
pub mod text;

use std::fs::File;
use std::io::{IsTerminal, Read};
use std::path::Path;

use crate::timeline::{InputInfo, Timeline};
use crate::Error;

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
            message: format!(
                "byte 0: not a recognised artifact: expected a PyTorch memory snapshot pickle (first byte 0x80), \
                 found {}",
                describe_start(&head)
            ),
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
    let result = snapshot::read(file, callback);
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let snap = result.map_err(|e| Error::Input { path: shown.clone(), message: e.to_string() })?;
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
