//! The analysis of one snapshot, already read: `cargo bench --bench analysis -- [SNAPSHOT] [ROUNDS]`.
//!
//! What `OOMDOC_TIMING` reports as "analysed in", without the read around it, repeated so that a noisy machine's
//! best and median can be told apart. Under `perf record` it shows where the analysis spends its time.

mod common;

use common::{median, ms, snapshot_arg};
use oomdoc::job::{Job, JobOptions};
use std::time::Instant;

fn main() {
    let Some(path) = snapshot_arg("analysis", "bench/data/snap-1m-real-wrapped.pickle") else {
        return;
    };
    let rounds: usize = std::env::args().skip(1).filter_map(|a| a.parse().ok()).next().unwrap_or(11);
    let job = Job::read(&JobOptions::new([&path])).expect("snapshot loads");
    let times: Vec<_> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            let analysis = job.analyze_first().expect("analyses");
            let d = t.elapsed();
            drop(std::hint::black_box(analysis));
            d
        })
        .collect();
    let best = *times.iter().min().expect("one round");
    println!("{path}: analysis best {} median {} ({rounds} rounds)", ms(best), ms(median(times)));
}
