//! Progress bars on stderr, for inputs big enough to wait on and for a job's ranks; only on a terminal.

use std::io::IsTerminal;

/// Files at least this large get a progress bar (when stderr is a terminal).
pub(super) const PROGRESS_MIN_BYTES: u64 = 64 << 20;

/// A progress bar over `len` bytes of `name`, when asked for, on a terminal, and the input is big enough to wait.
/// A progress bar over `len` items (a job's ranks), on a terminal.
pub fn count_bar(show: bool, len: u64, what: &str) -> Option<indicatif::ProgressBar> {
    (show && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(format!("analysing {what}"));
        bar
    })
}

pub(super) fn progress_bar(show: bool, len: u64, name: &str) -> Option<indicatif::ProgressBar> {
    (show && len >= PROGRESS_MIN_BYTES && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(format!("reading {}", name.rsplit(['/', '\\']).next().unwrap_or(name)));
        bar
    })
}
