//! How fast one device's trace is replayed: the allocator's state rebuilt at every event (from an empty device, or,
//! for a trace whose ring buffer wrapped, from the start the undo finds), beside the whole analysis of the same file.
//!
//!     cargo bench --bench replay -- [SNAPSHOT]
//!
//! With REPLAY_ONLY set, it replays the device 40 times and measures nothing: a run for a profiler.
//!
//! SNAPSHOT defaults to bench/data/snap-1m-real-wrapped.pickle (`bench/run.sh 1m` writes it). Target (issue 32):
//! the analysis of a wrapped 1M-event trace ≤ 50 ms.

mod common;

use std::time::{Duration, Instant};

use common::{median, ms, snapshot_arg};
use oomdoc::job::{Job, JobOptions};
use oomdoc::timeline::replay::{self, Replay};

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
    let Some(path) = snapshot_arg("replay", "bench/data/snap-1m-real-wrapped.pickle") else {
        return;
    };
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
