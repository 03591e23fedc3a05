//! `oomdoc tui`: browse the timeline and the live allocations in a terminal.
//!
//! Input → action → state update → render, as in bottom and gitui: [`keys`] turns key events into [`app::Action`]s,
//! [`app::App::update`] applies them, [`view::draw`] reads the state and draws it.

pub mod app;
pub mod keys;
pub mod view;

use std::io;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event, KeyEventKind};

pub use app::App;

/// Runs the event loop on the real terminal until the user quits. The terminal is restored on return and, through
/// ratatui's panic hook, on a panic.
pub fn run(app: &mut App) -> io::Result<()> {
    let mut terminal = ratatui::init();
    let result = event_loop(&mut terminal, app);
    ratatui::restore();
    result
}

/// Several ranks, one at a time on one terminal: `open(i)` makes the app for rank `i` (analysing it then), and
/// `r` / `R` in the app end it with the rank to open next.
pub fn run_ranks<'j, E>(first: usize, mut open: impl FnMut(usize) -> Result<App<'j>, E>) -> io::Result<Result<(), E>> {
    let mut terminal = ratatui::init();
    let mut current = first;
    let result = loop {
        let mut app = match open(current) {
            Ok(app) => app,
            Err(e) => break Ok(Err(e)),
        };
        if let Err(e) = event_loop(&mut terminal, &mut app) {
            break Err(e);
        }
        match app.ranks.switch_to {
            Some(next) => current = next,
            None => break Ok(Ok(())),
        }
    };
    ratatui::restore();
    result
}

fn event_loop(terminal: &mut ratatui::DefaultTerminal, app: &mut App) -> io::Result<()> {
    let table = keys::bindings();
    loop {
        terminal.draw(|f| view::draw(f, app))?;
        if app.quit {
            return Ok(());
        }
        // Apply every key already waiting before drawing again: holding → does not queue up redraws.
        let mut next = Some(event::read()?);
        while let Some(ev) = next.take() {
            if let Event::Key(k) = ev {
                if k.kind == KeyEventKind::Press {
                    let action = if app.filtering { keys::filter_action(&k) } else { keys::action_for(&k, &table) };
                    if let Some(a) = action {
                        app.update(a);
                    }
                }
            }
            if app.quit {
                break;
            }
            if event::poll(Duration::ZERO)? {
                next = Some(event::read()?);
            }
        }
    }
}
