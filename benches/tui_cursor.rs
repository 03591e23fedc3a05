//! How fast `oomdoc tui` answers: the first screen after parsing, and each cursor move (state update + full
//! redraw on an off-screen terminal) on a big snapshot.
//!
//!     cargo bench --bench tui_cursor -- [SNAPSHOT]
//!
//! SNAPSHOT defaults to bench/data/snap-1m-real.pickle (1M trace entries shaped as torch writes them;
//! `bench/run.sh 1m` writes it). Targets: the first screen within 1.5 s of start (reading, analysis, rules and the
//! first draw); every cursor move under 50 ms.

mod common;

use std::time::{Duration, Instant};

use oomdoc::job::{Job, JobOptions};
use oomdoc::tui::app::{Action, Jump};
use oomdoc::tui::{view, App};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

fn main() {
    let Some(path) = common::snapshot_arg("tui_cursor", "bench/data/snap-1m-real.pickle") else {
        return;
    };
    // The job `oomdoc tui` runs: read, then analyse keeping the replays the app browses.
    let t = Instant::now();
    let mut options = JobOptions::new([&path]);
    options.keep_replays = true;
    let job = Job::read(&options).expect("snapshot loads");
    let parse = t.elapsed();
    let events: usize = job.timelines.iter().flat_map(|tl| &tl.devices).map(|d| d.events.len()).sum();

    let t = Instant::now();
    let mut app = App::new(job.analyze_first().expect("analyses"), &job.checklist.categories, path.clone());
    let mut term = Terminal::new(TestBackend::new(160, 48)).unwrap();
    term.draw(|f| view::draw(f, &app)).unwrap();
    let first = t.elapsed();

    let mut run = |name: &str, acts: Vec<Action>| {
        let mut times = Vec::with_capacity(acts.len());
        for act in acts {
            let t = Instant::now();
            app.update(act);
            term.draw(|f| view::draw(f, &app)).unwrap();
            times.push(t.elapsed());
        }
        times.sort();
        let median = times[times.len() / 2];
        let max = *times.last().unwrap();
        println!("| {name:<34} | {:>5} | {:>9.2} | {:>9.2} |", times.len(), ms(median), ms(max));
        max
    };
    println!("snapshot: {path} ({events} trace entries)");
    println!(
        "parse {:.3} s; analysis + rules + first screen {:.3} s; first screen {:.3} s after start (target ≤ 1.5 s)\n",
        parse.as_secs_f64(),
        first.as_secs_f64(),
        (parse + first).as_secs_f64()
    );
    println!("| cursor move (update + redraw)      | moves | median ms |    max ms |");
    println!("|------------------------------------|------:|----------:|----------:|");
    let mut worst = Duration::ZERO;
    worst = worst.max(run("→ one event (from the start)", {
        let mut v = vec![Action::Jump(Jump::Start)];
        v.extend(std::iter::repeat_n(Action::Step(1), 300));
        v
    }));
    worst = worst.max(run("← one event", std::iter::repeat_n(Action::Step(-1), 300).collect()));
    worst = worst.max(run("Shift→ 100 events", std::iter::repeat_n(Action::Step(100), 200).collect()));
    worst = worst.max(run("PgDn (1/20 of the trace)", std::iter::repeat_n(Action::Page(1), 19).collect()));
    worst = worst.max(run("PgUp", std::iter::repeat_n(Action::Page(-1), 19).collect()));
    let n = events.max(1) as u64;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let jumps: Vec<Action> = (0..100)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Action::Jump(Jump::Event((x % n) as u32))
        })
        .collect();
    worst = worst.max(run("jump to a random event", jumps));
    worst = worst.max(run(
        "o / p / End / Home",
        vec![Action::Jump(Jump::Oom), Action::Jump(Jump::Peak), Action::Jump(Jump::End), Action::Jump(Jump::Start)],
    ));
    worst = worst.max(run(
        "g group, / filter, s sort",
        vec![
            Action::ToggleGroup,
            Action::ToggleGroup,
            Action::StartFilter,
            Action::FilterChar('m'),
            Action::FilterChar('o'),
            Action::FilterDone,
            Action::CycleSort,
            Action::FilterCancel,
        ],
    ));
    println!("\nworst cursor move {:.2} ms (target < 50 ms)", ms(worst));
    std::mem::forget(job);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
