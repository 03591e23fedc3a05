//! What the benches share: the snapshot they are pointed at, and how they report times.

// Each bench uses a part of this.
#![allow(dead_code)]

use std::time::Duration;

/// The snapshot named on the command line, else `default`; `None`, said on stderr, when it is not there.
pub fn snapshot_arg(bench: &str, default: &str) -> Option<String> {
    let path = std::env::args().skip(1).find(|a| !a.starts_with('-')).unwrap_or_else(|| default.to_string());
    if std::path::Path::new(&path).exists() {
        return Some(path);
    }
    eprintln!("{bench}: {path} not found; write it with `bench/run.sh 1m` (or pass a snapshot path)");
    None
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
