//! Key bindings: one table, used both to turn keys into actions and to draw the help overlay.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::app::{Action, Jump};

/// One binding: the keys as shown in help (empty: shown with the binding before it), what it does, which key
/// events it matches, and the action.
pub struct Binding {
    pub keys: &'static str,
    pub help: &'static str,
    matches: fn(&KeyEvent) -> bool,
    pub action: Action,
}

macro_rules! bind {
    ($keys:expr, $help:expr, |$k:ident| $m:expr, $action:expr) => {
        Binding { keys: $keys, help: $help, matches: |$k: &KeyEvent| $m, action: $action }
    };
}

pub fn bindings() -> Vec<Binding> {
    vec![
        bind!(
            "← →",
            "previous / next event",
            |k| k.code == KeyCode::Left && !k.modifiers.contains(KeyModifiers::SHIFT),
            Action::Step(-1)
        ),
        bind!("", "", |k| k.code == KeyCode::Right && !k.modifiers.contains(KeyModifiers::SHIFT), Action::Step(1)),
        bind!(
            "Shift ← →",
            "100 events back / forward",
            |k| matches!(k.code, KeyCode::Left) && k.modifiers.contains(KeyModifiers::SHIFT),
            Action::Step(-100)
        ),
        bind!(
            "",
            "",
            |k| matches!(k.code, KeyCode::Right) && k.modifiers.contains(KeyModifiers::SHIFT),
            Action::Step(100)
        ),
        bind!("PgUp PgDn", "a twentieth of the trace back / forward", |k| k.code == KeyCode::PageUp, Action::Page(-1)),
        bind!("", "", |k| k.code == KeyCode::PageDown, Action::Page(1)),
        bind!("o", "jump to the OOM", |k| k.code == KeyCode::Char('o'), Action::Jump(Jump::Oom)),
        bind!("p", "jump to the peak", |k| k.code == KeyCode::Char('p'), Action::Jump(Jump::Peak)),
        bind!("Home End", "jump to the start / the end", |k| k.code == KeyCode::Home, Action::Jump(Jump::Start)),
        bind!("", "", |k| k.code == KeyCode::End, Action::Jump(Jump::End)),
        bind!(
            "Tab",
            "next panel: live allocations, segments, findings, profile",
            |k| k.code == KeyCode::Tab,
            Action::NextPanel
        ),
        bind!("", "", |k| k.code == KeyCode::BackTab, Action::PrevPanel),
        bind!("↑ ↓", "select a row", |k| k.code == KeyCode::Up || k.code == KeyCode::Char('k'), Action::Select(-1)),
        bind!("", "", |k| k.code == KeyCode::Down || k.code == KeyCode::Char('j'), Action::Select(1)),
        bind!(
            "Enter",
            "open the selected row (a stack, or where a finding points)",
            |k| k.code == KeyCode::Enter,
            Action::Open
        ),
        bind!("s", "sort live allocations: size, age, stream", |k| k.code == KeyCode::Char('s'), Action::CycleSort),
        bind!("g", "group live allocations by allocating stack", |k| k.code == KeyCode::Char('g'), Action::ToggleGroup),
        bind!(
            "/",
            "filter live allocations by text in their stack",
            |k| k.code == KeyCode::Char('/'),
            Action::StartFilter
        ),
        bind!("d", "next GPU", |k| k.code == KeyCode::Char('d'), Action::NextDevice),
        bind!("?", "this help", |k| k.code == KeyCode::Char('?'), Action::ToggleHelp),
        bind!(
            "q Esc",
            "quit (Esc closes help or the stack first)",
            |k| k.code == KeyCode::Char('q')
                || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)),
            Action::Quit
        ),
        bind!("", "", |k| k.code == KeyCode::Esc, Action::Back),
    ]
}

/// The action for a key, outside filter typing.
pub fn action_for(key: &KeyEvent, table: &[Binding]) -> Option<Action> {
    table.iter().find(|b| (b.matches)(key)).map(|b| b.action.clone())
}

/// While typing a filter, keys edit it.
pub fn filter_action(key: &KeyEvent) -> Option<Action> {
    match key.code {
        KeyCode::Enter => Some(Action::FilterDone),
        KeyCode::Esc => Some(Action::FilterCancel),
        KeyCode::Backspace => Some(Action::FilterBackspace),
        KeyCode::Char(c) => Some(Action::FilterChar(c)),
        _ => None,
    }
}
