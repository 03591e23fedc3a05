//! What each view of `oomdoc tui` shows, drawn on ratatui's TestBackend: a real snapshot and a generated OOM.
//! Review changes with `cargo insta review`.

use oomdoc::job::{Job, JobOptions};
use oomdoc::tui::app::{Action, Jump, Panel};
use oomdoc::tui::{view, App};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

/// The job `oomdoc tui` runs on these files.
fn load(paths: &[&str]) -> Job {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut options = JobOptions::new(paths.iter().map(|p| root.join(p)));
    options.keep_replays = true;
    let job = Job::read(&options).unwrap();
    assert!(job.failed.is_empty(), "{:?}", job.failed);
    job
}

/// The app `oomdoc tui` opens on the job's first timeline.
fn open<'j>(job: &'j Job, title: &str) -> App<'j> {
    App::new(job.analyze_first().unwrap(), &job.checklist.categories, title.to_string())
}

/// The screen as text, one line per row (colours and styles dropped).
fn screen(app: &App, w: u16, h: u16) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| view::draw(f, app)).unwrap();
    let buf = term.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..h {
        let mut line = String::new();
        for x in 0..w {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn actions(app: &mut App, list: &[Action]) {
    for a in list {
        app.update(a.clone());
    }
}

#[test]
fn oom_fixture_every_view() {
    let job = load(&["fixtures/generated/rules/fragmentation-fire.pickle"]);
    let tl = &job.timelines[0];
    let mut app = open(&job, "fragmentation-fire.pickle");
    // Opens at the OOM.
    let oom = tl.devices[0].events.len() as u32 - 1;
    assert_eq!(app.cursor, Some(oom));
    insta::assert_snapshot!("oom_live", screen(&app, 120, 36));

    actions(&mut app, &[Action::ToggleGroup]);
    insta::assert_snapshot!("oom_live_grouped", screen(&app, 120, 36));

    actions(&mut app, &[Action::ToggleGroup, Action::StartFilter]);
    for c in "build_model".chars() {
        app.update(Action::FilterChar(c));
    }
    actions(&mut app, &[Action::FilterDone, Action::Select(2), Action::Open]);
    assert!(app.rows.iter().all(|r| r.category == "parameter"), "the filter keeps only build_model's allocations");
    insta::assert_snapshot!("oom_live_filtered_stack", screen(&app, 120, 36));

    actions(&mut app, &[Action::Back, Action::FilterCancel, Action::NextPanel]);
    assert_eq!(app.panel, Panel::Segments);
    insta::assert_snapshot!("oom_segments", screen(&app, 120, 36));

    actions(&mut app, &[Action::NextPanel]);
    insta::assert_snapshot!("oom_findings", screen(&app, 120, 36));

    // Enter on the finding goes back to the OOM, on the live table.
    actions(&mut app, &[Action::Jump(Jump::Start), Action::Open]);
    assert_eq!((app.panel, app.cursor), (Panel::Live, Some(oom)));

    actions(&mut app, &[Action::ToggleHelp]);
    insta::assert_snapshot!("help", screen(&app, 120, 36));
}

#[test]
fn real_snapshot_cursor_moves_and_small_terminal() {
    let job = load(&["fixtures/real/decomfl-t29.pickle"]);
    let mut app = open(&job, "decomfl-t29.pickle");
    insta::assert_snapshot!("real_peak_live", screen(&app, 120, 36));
    // Stepping forward incrementally lands on the same state as a fresh replay to the same event.
    actions(
        &mut app,
        &[Action::Jump(Jump::Start), Action::Step(1), Action::Step(1), Action::Page(1), Action::Step(-1)],
    );
    let at = app.cursor;
    let fresh = app.device().unwrap().replay.state_at(at);
    assert_eq!((app.state.allocated, app.state.reserved), (fresh.allocated, fresh.reserved));
    actions(&mut app, &[Action::Jump(Jump::End), Action::NextPanel]);
    insta::assert_snapshot!("real_end_segments", screen(&app, 120, 36));
    // A tiny terminal must not panic.
    for (w, h) in [(20, 5), (1, 1), (60, 12)] {
        screen(&app, w, h);
    }
}

#[test]
fn two_devices_switch() {
    let job = load(&["fixtures/generated/shapes/v2.15-multidevice-pool.pickle"]);
    let mut app = open(&job, "v2.15-multidevice-pool.pickle");
    // No OOM: it opens on the GPU that peaked highest, GPU 1.
    assert_eq!(app.device().unwrap().device, 1);
    app.update(Action::NextDevice);
    assert_eq!(app.device().unwrap().device, 0);
    app.update(Action::NextDevice);
    assert_eq!(app.device().unwrap().device, 1);
    insta::assert_snapshot!("second_gpu_live", screen(&app, 120, 30));
}

#[test]
fn opens_on_the_gpu_that_ran_out_of_memory_at_its_oom() {
    // Three GPUs, the OOM on GPU 1: the first screen is GPU 1 at its OOM.
    let job = load(&["fixtures/generated/verdict/class1-device-imbalance.pickle"]);
    let tl = &job.timelines[0];
    let app = open(&job, "class1-device-imbalance.pickle");
    let d = app.device().unwrap();
    assert_eq!(d.device, 1);
    let oom = tl.device(1).unwrap().events.iter().rposition(|e| e.action == oomdoc::timeline::Action::Oom);
    assert_eq!(app.cursor, oom.map(|i| i as u32));
    let s = screen(&app, 120, 36);
    assert!(s.contains("GPU 1"), "{s}");
    insta::assert_snapshot!("opens_at_the_oom_gpu", s);
}

#[test]
fn incremental_cursor_agrees_with_checkpoint_replay_everywhere() {
    let job = load(&["fixtures/generated/rules/leaked-references-fire-oom.pickle"]);
    let tl = &job.timelines[0];
    let mut app = open(&job, "");
    app.update(Action::Jump(Jump::Start));
    let n = tl.devices[0].events.len();
    for _ in 1..n {
        app.update(Action::Step(1));
        let fresh = app.device().unwrap().replay.state_at(app.cursor);
        assert_eq!(
            (app.state.allocated, app.state.active, app.state.reserved, app.state.largest_free_block()),
            (fresh.allocated, fresh.active, fresh.reserved, fresh.largest_free_block()),
            "at event {:?}",
            app.cursor
        );
    }
}

#[test]
fn real_snapshot_with_findings_every_view() {
    let job = load(&["fixtures/real/cs336-kk-fullstep-57gb.pickle"]);
    let mut app = open(&job, "cs336-kk-fullstep-57gb.pickle");
    actions(&mut app, &[Action::ToggleGroup]);
    insta::assert_snapshot!("real_findings_file_grouped", screen(&app, 120, 36));
    actions(&mut app, &[Action::ToggleGroup, Action::NextPanel, Action::Select(3)]);
    insta::assert_snapshot!("real_findings_file_segments", screen(&app, 120, 36));
    actions(&mut app, &[Action::NextPanel]);
    assert_eq!(app.findings.len(), 1);
    insta::assert_snapshot!("real_findings_file_findings", screen(&app, 120, 36));
    actions(&mut app, &[Action::Select(0), Action::Open]);
    assert_eq!(app.panel, Panel::Live);
    assert_eq!(app.cursor, app.device().unwrap().replay.peak_allocated.1, "a finding without an OOM goes to the peak");
}

#[test]
fn profile_panel_beside_a_snapshot() {
    let job = load(&[
        "fixtures/generated/rules/fragmentation-fire.pickle",
        "fixtures/profilers/ddp_accum_cuda_gpu_trace.csv",
        "fixtures/real/ncu/ncu2025.3_csv_details_sol_h100.txt",
    ]);
    assert_eq!(job.timelines.len(), 1);
    let mut app = open(&job, "fragmentation-fire.pickle + nsys + ncu");
    assert_eq!(app.panels(), [Panel::Live, Panel::Segments, Panel::Findings, Panel::Profile]);
    actions(&mut app, &[Action::PrevPanel]);
    assert_eq!(app.panel, Panel::Profile);
    actions(&mut app, &[Action::Select(1)]);
    let s = screen(&app, 140, 36);
    assert!(s.contains("compute-and-memory-bound"), "{s}");
    insta::assert_snapshot!("profile_panel", s);
    // Without profiler exports there is no profile panel to Tab to.
    let job = load(&["fixtures/generated/rules/fragmentation-fire.pickle"]);
    let app = open(&job, "x");
    assert_eq!(app.panels(), [Panel::Live, Panel::Segments, Panel::Findings]);
}

#[test]
fn several_ranks_one_at_a_time_r_switches() {
    // Two ranks: the header names the open one; r asks for the next (the caller opens it), R for the previous.
    let job =
        load(&["fixtures/real-gpu/healthy/snapshot.pickle", "fixtures/real-gpu/leaked-references/snapshot.pickle"]);
    assert_eq!(job.timelines.len(), 2);
    let analysed = job.analyze_timeline(&job.timelines[1]).unwrap();
    let mut app = App::new(analysed, &job.checklist.categories, "leaked-references/snapshot.pickle".into());
    app.ranks = oomdoc::tui::app::Ranks {
        labels: vec!["rank 0 (snapshot.pickle)".into(), "rank 1 (snapshot.pickle)".into()],
        open: 1,
        switch_to: None,
    };
    let s = screen(&app, 140, 30);
    assert!(s.lines().next().unwrap().contains("rank 1 (snapshot.pickle) (2 of 2, r: next)"), "{s}");
    app.update(Action::SwitchRank(1));
    assert_eq!((app.ranks.switch_to, app.quit), (Some(0), true), "wraps to the first rank");
    app.quit = false;
    app.update(Action::SwitchRank(-1));
    assert_eq!(app.ranks.switch_to, Some(0));
    // One snapshot: r does nothing.
    let job = load(&["fixtures/real-gpu/healthy/snapshot.pickle"]);
    let mut one = open(&job, "healthy");
    one.update(Action::SwitchRank(1));
    assert_eq!((one.ranks.switch_to, one.quit), (None, false));
    assert!(!screen(&one, 140, 30).contains("r: next"));
}

/// A real capture whose stacks hold ~30 C++ frames (`c10::`, `at::`) inside the user's: folded, the user's frame is
/// in the stack pane without scrolling, at 80×24 as at 200×50; Enter unfolds every frame, ↓ scrolls, Enter folds;
/// the key line ends with help and quit at both widths.
#[test]
fn the_stack_pane_reaches_the_users_code_through_cpp_frames() {
    let job = load(&["fixtures/real/cs336-kk-fullstep-57gb.pickle"]);
    let mut app = open(&job, "cs336-kk-fullstep-57gb.pickle");
    actions(&mut app, &[Action::Jump(Jump::Peak)]);
    let (stack, address) = app.selected_row().map(|r| (r.stack, r.address)).expect("a live allocation at the peak");
    let frames = oomdoc::analysis::stack_frames(app.tl, stack);
    let user = frames.iter().find(|f| !f.library).expect("a frame of the user's code").short();
    assert!(frames.iter().take_while(|f| f.library).count() >= 10, "many library frames before the user's");
    for (w, h) in [(80u16, 24u16), (200, 50)] {
        let s = screen(&app, w, h);
        let pane: String =
            s.lines().map(|l| l.chars().skip(w as usize * 58 / 100).collect::<String>() + "\n").collect();
        assert!(pane.contains(&user[..user.len().min(30)]), "{w}×{h}: the user's frame {user} is not in\n{s}");
        let last = s.lines().last().unwrap();
        assert!(last.trim_end().ends_with("? help  q quit"), "{w}×{h}: the key line is cut: {last}");
        insta::assert_snapshot!(format!("cpp_stack_folded_{w}x{h}"), s);
    }
    actions(&mut app, &[Action::Open]);
    assert!(app.detail);
    let open = screen(&app, 80, 24);
    assert!(open.contains("every frame") && open.contains("more lines (↓ scrolls)"), "{open}");
    insta::assert_snapshot!("cpp_stack_open_80x24", open);
    actions(&mut app, &[Action::Select(5)]);
    let scrolled = screen(&app, 80, 24);
    assert_ne!(scrolled, open, "↓ scrolls the open stack");
    assert_eq!(app.selected_row().unwrap().address, address, "scrolling the stack keeps the row");
    actions(&mut app, &[Action::Open]);
    assert!(!app.detail && app.stack_scroll == 0, "Enter folds it again");
}

/// `oomdoc tui A B`: the two runs' difference over the screen (as `oomdoc diff` says it), scrolled, closed with D
/// back to the open run and reopened; without a second run there is none to show.
#[test]
fn two_runs_open_on_their_difference() {
    let before = "fixtures/real-gpu/fragmentation/snapshot.pickle";
    let after = "fixtures/real-gpu/fragmentation-expandable/snapshot.pickle";
    let job = load(&[before]);
    let mut app = open(&job, "fragmentation/snapshot.pickle");
    // Relative paths, as a user types them: the page names them (tests run in the crate's root).
    let read = |p: &str| oomdoc::job::compared_run(std::path::Path::new(p), &oomdoc::analysis::At::Auto).unwrap().0;
    let d = oomdoc::analysis::diff::of(&read(before), &read(after));
    let text = oomdoc::report::diff::render(&d, oomdoc::report::Format::Text);
    app.difference = text.lines().map(str::to_string).collect();
    app.showing_difference = true;
    insta::assert_snapshot!("two_runs_difference", screen(&app, 120, 36));
    actions(&mut app, &[Action::Select(3)]);
    assert_eq!(app.difference_scroll, 3);
    let cursor = app.cursor;
    actions(&mut app, &[Action::Step(-1), Action::Jump(Jump::Start)]);
    assert_eq!((app.difference_scroll, app.cursor), (0, cursor), "the keys scroll the difference, not the run");
    actions(&mut app, &[Action::ToggleDifference]);
    assert!(!app.showing_difference);
    assert!(!screen(&app, 120, 36).contains("difference of the two runs"));
    actions(&mut app, &[Action::ToggleDifference]);
    assert!(app.showing_difference);
    actions(&mut app, &[Action::Back]);
    assert!(!app.showing_difference && !app.quit, "Esc goes back to the run first");

    let mut single = open(&job, "fragmentation/snapshot.pickle");
    actions(&mut single, &[Action::ToggleDifference]);
    assert!(!single.showing_difference, "one run has no difference to show");
}

/// A state-only dump read at its log's OOM (no trace: no cursor to move): the verdict's line says the OOM, every panel
/// draws, and moving about does nothing harmful.
#[test]
fn a_state_only_dump_at_its_logs_oom_draws_every_panel() {
    let job = load(&[
        "fixtures/real-gpu/frameworks/trainer-state-only/snapshot.pickle.xz",
        "fixtures/real-gpu/frameworks/trainer-state-only/stderr.log",
    ]);
    let mut app = open(&job, "trainer-state-only");
    assert_eq!(app.cursor, None);
    let live = screen(&app, 120, 36);
    assert!(live.contains("GPU 0 ran out of memory asking for 176 MiB"), "the verdict's line, at the OOM: {live}");
    actions(&mut app, &[Action::Jump(Jump::End), Action::Jump(Jump::Start), Action::NextPanel]);
    assert_eq!(app.panel, Panel::Segments);
    screen(&app, 120, 36);
    actions(&mut app, &[Action::NextPanel]);
    assert_eq!(app.panel, Panel::Findings);
    screen(&app, 120, 36);
}
