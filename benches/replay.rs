//! How fast one device's trace is replayed: the allocator's state rebuilt at every event (from an empty device, or,
//! for a trace whose ring buffer wrapped, from the start the undo finds), beside the whole analysis of the same file.
//!
//!     cargo bench --bench replay -- [SNAPSHOT]
//!
//! With REPLAY_ONLY set, it replays the device 40 times and measures nothing: a run for a profiler.
//!
//! SNAPSHOT defaults to bench/data/snap-1m-real-wrapped.pickle (`bench/run.sh 1m` writes it). Target (issue 32):
//! the analysis of a wrapped 1M-event trace ≤ 50 ms.

use std::time::{Duration, Instant};

use oomdoc::job::{Job, JobOptions};
use oomdoc::timeline::replay::{self, Replay};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn timed<T>(rounds: usize, mut f: impl FnMut() -> T) -> Duration {
    median(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                let out = f();
                let d = t.elapsed();
                drop(out);
                d
            })
            .collect(),
    )
}

fn main() {
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| "bench/data/snap-1m-real-wrapped.pickle".to_string());
    if !std::path::Path::new(&path).exists() {
        eprintln!("replay: {path} not found; write it with `bench/run.sh 1m` (or pass a snapshot path)");
        return;
    }
    let job = Job::read(&JobOptions::new([&path])).expect("snapshot loads");
    let tl = &job.timelines[0];
    let dev = tl.devices.iter().max_by_key(|d| d.events.len()).expect("a device");
    if std::env::var_os("REPLAY_ONLY").is_some() {
        // For a profiler: the replay alone, many times.
        for _ in 0..40 {
            drop(Replay::new(dev, tl.settings.as_ref()));
        }
        return;
    }
    let rounds = 9;
    let complete = replay::completeness(dev).complete();
    println!("{path}: {} trace entries, {}", dev.events.len(), if complete { "complete" } else { "wrapped" });
    println!("  replay (one device)          {}", ms(timed(rounds, || Replay::new(dev, tl.settings.as_ref()))));
    println!("  completeness count           {}", ms(timed(rounds, || replay::completeness(dev))));
    println!("  analysis (the whole report)  {}", ms(timed(rounds, || job.analyze_first().map(std::mem::forget))));
}
