//! How fast a what-if answers: the device's requests read from its trace (the workload) and one simulation of the
//! caching allocator over them, beside the analysis of the same trace.
//!
//!     cargo bench --bench whatif -- [SNAPSHOT]
//!
//! SNAPSHOT defaults to bench/data/snap-1m-real.pickle (1M trace entries shaped as torch writes them;
//! `bench/run.sh 1m` writes it). Its sequence length changes every step, so no two steps ask for the same sizes:
//! the simulation's worst case, where no window of a repeat can be skipped. A real training loop repeats its steps
//! exactly (bench/data/real-h200-llama-1m.pickle, a real H200 trace: `bench/run.sh real`). Target: one what-if
//! (workload + simulation) under 0.3 s; the verdict's automatic what-ifs within the analysis's own time.
//!
//! The simulations print how many ops they skipped; SIM_ONLY also checks the outcome against op by op.
//!
//! With SIM_ONLY set, it simulates the recorded settings 20 times and says only the best and median: a run for a
//! profiler. With AUTO_ONLY set, it runs the verdict's automatic what-ifs 30 times, each one's time on stderr: the
//! same, for them (their workload read beforehand, as the analysis reads it beside its replay).
//! With E2E_ONLY set, it analyses the trace ending at the OOM of fragments 20 times, each time on stderr.
//!
//! Last, the analysis end to end: the trace with an OOM appended (one of fragments, then a shortage) under a cap at
//! the recorded peak, against the analysis of the trace as it is under the same cap.

mod common;

use std::time::Instant;

use common::{median, ms, snapshot_arg};
use oomdoc::analysis::facts::Site;
use oomdoc::analysis::whatif;
use oomdoc::job::{Job, JobOptions};
use oomdoc::timeline::replay::Replay;
use oomdoc::timeline::simulator;

fn main() {
    let Some(path) = snapshot_arg("whatif", "bench/data/snap-1m-real.pickle") else {
        return;
    };
    let mut job = Job::read(&JobOptions::new([&path])).expect("snapshot loads");
    let tl = &job.timelines[0];
    let dev = tl.devices.iter().max_by_key(|d| d.events.len()).expect("a device");
    let rounds = 7;
    if std::env::var_os("SIM_ONLY").is_some() {
        let replay = Replay::new(dev, tl.settings.as_ref());
        let w = simulator::Workload::from_trace(&replay);
        let cap = whatif::capacity(tl, dev, &replay, None, None);
        let base = whatif::recorded_config(tl, &replay, &cap);
        let mut times: Vec<_> = (0..20)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(simulator::simulate(&w, base.clone(), false));
                t.elapsed()
            })
            .collect();
        times.sort();
        println!("simulation, as recorded: best {} median {}", ms(times[0]), ms(median(times)));
        let mut times: Vec<_> = (0..20)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(simulator::Workload::from_trace(&replay));
                t.elapsed()
            })
            .collect();
        times.sort();
        println!("  the workload alone: best {} median {}", ms(times[0]), ms(median(times)));
        let t = Instant::now();
        let found = std::hint::black_box(simulator::repeats::find(&w.ops, w.first_id));
        println!("  finding the repeats: {}", ms(t.elapsed()));
        drop(found);
        let r = w.repeats();
        let covered: u64 = r.iter().map(|r| (r.end() - r.start) as u64).sum();
        println!("  {} repeats covering {} of {} ops", r.len(), covered, w.ops.len());
        let t = Instant::now();
        let found = std::hint::black_box(simulator::passes::find(&w.ops, w.first_id));
        println!("  finding the windows that give back all they take: {}", ms(t.elapsed()));
        let covered: u32 = found.iter().map(|p| p.end - p.start).sum();
        let kinds: std::collections::HashSet<u32> = found.iter().map(|p| p.kind).collect();
        println!("  {} such windows covering {covered} ops, of {} kinds", found.len(), kinds.len());
        let mut times: Vec<_> = (0..5)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(simulator::simulate_every_op(&w, base.clone(), false, |_, _| {
                    simulator::Edit::Keep
                }));
                t.elapsed()
            })
            .collect();
        times.sort();
        println!("simulation op by op: best {} median {}", ms(times[0]), ms(median(times)));
        let mut skipping = simulator::simulate(&w, base.clone(), true);
        let skipped = std::mem::take(&mut skipping.ops_skipped);
        let passed = std::mem::take(&mut skipping.ops_passed_over);
        let stopped = std::mem::take(&mut skipping.pool_passes_stopped);
        let same = skipping == simulator::simulate_every_op(&w, base.clone(), true, |_, _| simulator::Edit::Keep);
        println!(
            "  {skipped} ops skipped ({passed} in windows passed over, {stopped} stopped part way); the same outcome \
             as op by op: {same}"
        );
        return;
    }
    let analysis = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                let a = job.analyze_first().expect("analyses");
                let d = t.elapsed();
                std::mem::forget(a);
                d
            })
            .collect(),
    );
    let replay = Replay::new(dev, tl.settings.as_ref());
    let cap = whatif::capacity(tl, dev, &replay, None, None);
    let base = whatif::recorded_config(tl, &replay, &cap);
    let workload = median(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                let w = simulator::Workload::from_trace(&replay);
                std::hint::black_box(w.structure());
                let d = t.elapsed();
                drop(w);
                d
            })
            .collect(),
    );
    let w = simulator::Workload::from_trace(&replay);
    let mut expandable = base.clone();
    expandable.rules.expandable = !base.rules.expandable;
    let mut split = base.clone();
    split.rules.max_split_size = Some(512 << 20);
    println!("{path}: {} trace entries, {} requests and frees", dev.events.len(), w.ops.len());
    println!("  analysis (the whole report)      {}", ms(analysis));
    println!("  workload from the trace          {}   (its requests, where they repeat, the windows that give back all they take)", ms(workload));
    // The verdict's automatic what-ifs at an OOM, at their most: expandable segments refuted then max_split_size,
    // and a leak left out then a smaller batch, on two cores (capacity: the recorded peak, so the chains run long).
    let cats = oomdoc::analysis::categories::Categorizer::builtin();
    let case = |leak, need| whatif::OomCase { holder: Some("activation"), leak, need };
    let cap_at_peak = whatif::Capacity { bytes: Some(replay.peak_reserved.0), ..cap.clone() };
    let leak: Vec<_> = dev
        .events
        .iter()
        .filter(|e| e.action == oomdoc::timeline::Action::Alloc)
        .map(|e| Site::Stack(e.stack))
        .take(3)
        .collect();
    // The analysis reads the workload beside its replay where the trace starts on an empty device (`Prepared`):
    // the what-ifs then start from it.
    let prepare = || {
        let mut cache = oomdoc::analysis::categories::CategoryCache::new(&cats, tl);
        whatif::Prepared::new(tl, dev, &mut cache)
    };
    let auto = |case: &whatif::OomCase, prepared: bool| {
        let made = prepared.then(prepare).flatten();
        let mut cache = oomdoc::analysis::categories::CategoryCache::new(&cats, tl);
        let t = Instant::now();
        let w = whatif::remedies(tl, dev, &replay, &cap_at_peak, case, &mut cache, made);
        let d = t.elapsed();
        assert!(!w.is_empty());
        d
    };
    if std::env::var_os("AUTO_ONLY").is_some() {
        for _ in 0..30 {
            eprintln!("{}", ms(auto(&case(&leak, None), true)));
        }
        return;
    }
    let times = |case: &whatif::OomCase, prepared: bool| median((0..rounds).map(|_| auto(case, prepared)).collect());
    let ratio = |d: std::time::Duration| d.as_secs_f64() / analysis.as_secs_f64();
    // A plain shortage (the live tensors and the request past the cap): only the workload's tries, one per core.
    let (at_most, shortage) = (case(&leak, None), case(&[], Some(u64::MAX)));
    let (automatic, automatic_alone) = (times(&at_most, true), times(&at_most, false));
    let (short, short_alone) = (times(&shortage, true), times(&shortage, false));
    let ahead = replay.complete() && prepare().is_some();
    let prepared = median(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(prepare());
                t.elapsed()
            })
            .collect(),
    );
    println!(
        "  the verdict's automatic what-ifs {} at most ({:.2}× the analysis); at a plain shortage {} ({:.2}×)",
        ms(automatic),
        ratio(automatic),
        ms(short),
        ratio(short)
    );
    if ahead {
        println!(
            "    their workload read beside the replay in {}; without it, {} ({:.2}×) and {} ({:.2}×)",
            ms(prepared),
            ms(automatic_alone),
            ratio(automatic_alone),
            ms(short_alone),
            ratio(short_alone)
        );
    } else {
        println!("    (the trace does not start on an empty device: its workload is read after the replay)");
    }
    for (name, cfg) in [("as recorded", base), ("expandable flipped", expandable), ("max_split_size_mb:512", split)] {
        let sim = median(
            (0..rounds)
                .map(|_| {
                    let t = Instant::now();
                    let o = simulator::simulate(&w, cfg.clone(), false);
                    let d = t.elapsed();
                    assert!(o.peak_reserved > 0);
                    d
                })
                .collect(),
        );
        println!("  simulation, {name:<22} {}   one what-if (workload + simulation) {}", ms(sim), ms(workload + sim));
    }
    // End to end, as a user meets it: the same trace ending at an OOM under a cap at the recorded peak, analysed
    // whole, against the analysis of the trace as it is under the same cap, timed one beside the other. Two OOMs:
    // one the cache's fragments decide (the request fits neither the room left under the cap nor the largest cached
    // block, but the cached bytes: the settings are tried, and the blocks that pin the fragments are found), and a
    // plain shortage (the live bytes and the request past the cap: only the workload's remedies). The difference
    // is what the verdict's what-ifs, and the OOM's own report, add.
    assert!(dev.events.iter().all(|e| e.action != oomdoc::timeline::Action::Oom), "the bench's trace has no OOM");
    let cap = replay.peak_reserved.0;
    let end = replay.state_at(dev.events.len().checked_sub(1).map(|l| l as u32));
    let round = |b: u64| b.next_multiple_of(2 << 20);
    let fragments = round(cap.saturating_sub(end.reserved).max(end.largest_free_block()) + (2 << 20));
    let shortage = round(cap.saturating_sub(end.allocated) + (2 << 20));
    let d = tl.devices.iter().position(|d| std::ptr::eq(d, dev)).expect("the device");
    drop(replay);
    let opts = oomdoc::analysis::Options { memory_cap: Some(cap), ..Default::default() };
    let whole = |tl: &oomdoc::timeline::Timeline, tried: &mut Vec<whatif::WhatIf>| {
        let t = Instant::now();
        let a = oomdoc::analysis::analyze(tl, &opts, &cats).expect("analyses");
        let d = t.elapsed();
        *tried = a.devices.iter().flat_map(|r| r.whatif.iter().cloned()).collect();
        d
    };
    // With E2E_ONLY set, only the trace ending at the OOM of fragments, analysed 20 times: a run for a profiler.
    if std::env::var_os("E2E_ONLY").is_some() {
        job.timelines[0].devices[d].events.push(oomdoc::timeline::Event::new(
            oomdoc::timeline::Action::Oom,
            0,
            fragments,
        ));
        let mut tried = Vec::new();
        for _ in 0..20 {
            eprintln!("{}", ms(whole(&job.timelines[0], &mut tried)));
        }
        return;
    }
    for (name, request) in [("fragments", fragments), ("a shortage", shortage)] {
        let mut tried = Vec::new();
        let without = median((0..3).map(|_| whole(&job.timelines[0], &mut tried)).collect());
        assert!(tried.is_empty());
        let events = &mut job.timelines[0].devices[d].events;
        events.push(oomdoc::timeline::Event::new(oomdoc::timeline::Action::Oom, 0, request));
        let with_oom = median((0..3).map(|_| whole(&job.timelines[0], &mut tried)).collect());
        job.timelines[0].devices[d].events.pop();
        // The OOM of fragments must be one: the settings are tried only there.
        let settings = tried
            .iter()
            .any(|w| matches!(w.knob, Some(whatif::Knob::ExpandableSegments | whatif::Knob::MaxSplitSize(_))));
        let tried: Vec<String> = tried.iter().map(|w| w.change.clone()).collect();
        assert_eq!(settings, name == "fragments", "{name}: what-ifs tried: {tried:?}");
        println!(
            "  analysis under a cap at the peak {}; ending at an OOM of {name} {} ({:.2}×; what-ifs tried: {})",
            ms(without),
            ms(with_oom),
            with_oom.as_secs_f64() / without.as_secs_f64(),
            tried.join(", ")
        );
    }
}
