//! Key bindings: one table, used both to turn keys into actions and to draw the help overlay.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::app::{Action, Jump};

/// One binding: the keys as shown in help (empty: shown with the binding before it), what it does, which key
/// events it matches, the action, and its place and words in the status bar (place 0: not shown there).
pub struct Binding {
    pub keys: &'static str,
    pub help: &'static str,
    matches: fn(&KeyEvent) -> bool,
    pub action: Action,
    pub status: (u8, &'static str),
}

macro_rules! bind {
    ($keys:expr, $help:expr, |$k:ident| $m:expr, $action:expr) => {
        bind!($keys, $help, |$k| $m, $action, (0, ""))
    };
    ($keys:expr, $help:expr, |$k:ident| $m:expr, $action:expr, $status:expr) => {
        Binding { keys: $keys, help: $help, matches: |$k: &KeyEvent| $m, action: $action, status: $status }
    };
}

/// The status bar's one line of keys, from the table, cut to `width` columns: the entries in their order while they
/// fit, and always the last two (help and quit), so the way to every other key is on screen.
pub fn status_line(table: &[Binding], width: usize) -> String {
    let mut shown: Vec<&(u8, &str)> = table.iter().map(|b| &b.status).filter(|s| s.0 > 0).collect();
    shown.sort_by_key(|s| s.0);
    let tail = shown.split_off(shown.len().saturating_sub(2));
    let tail_width: usize = tail.iter().map(|s| s.1.chars().count() + 2).sum();
    let mut line: Vec<&str> = Vec::new();
    let mut used = tail_width;
    for s in shown {
        let w = s.1.chars().count() + 2;
        if used + w > width {
            break;
        }
        used += w;
        line.push(s.1);
    }
    line.extend(tail.iter().map(|s| s.1));
    line.join("  ")
}

pub fn bindings() -> Vec<Binding> {
    vec![
        bind!(
            "← →",
            "previous / next event",
            |k| k.code == KeyCode::Left && !k.modifiers.contains(KeyModifiers::SHIFT),
            Action::Step(-1),
            (1, "←→ step")
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
        bind!(
            "PgUp PgDn",
            "a twentieth of the trace back / forward",
            |k| k.code == KeyCode::PageUp,
            Action::Page(-1),
            (2, "PgUp/PgDn page")
        ),
        bind!("", "", |k| k.code == KeyCode::PageDown, Action::Page(1)),
        bind!("o", "jump to the OOM", |k| k.code == KeyCode::Char('o'), Action::Jump(Jump::Oom), (3, "o OOM")),
        bind!("p", "jump to the peak", |k| k.code == KeyCode::Char('p'), Action::Jump(Jump::Peak), (4, "p peak")),
        bind!("Home End", "jump to the start / the end", |k| k.code == KeyCode::Home, Action::Jump(Jump::Start)),
        bind!("", "", |k| k.code == KeyCode::End, Action::Jump(Jump::End)),
        bind!(
            "Tab",
            "next panel: live allocations, segments, findings, profile",
            |k| k.code == KeyCode::Tab,
            Action::NextPanel,
            (5, "Tab panel")
        ),
        bind!("", "", |k| k.code == KeyCode::BackTab, Action::PrevPanel),
        bind!(
            "↑ ↓",
            "select a row",
            |k| k.code == KeyCode::Up || k.code == KeyCode::Char('k'),
            Action::Select(-1),
            (6, "↑↓ select")
        ),
        bind!("", "", |k| k.code == KeyCode::Down || k.code == KeyCode::Char('j'), Action::Select(1)),
        bind!(
            "Enter",
            "every frame of the stack (↑↓ scroll it, Enter folds), or where a finding points",
            |k| k.code == KeyCode::Enter,
            Action::Open,
            (7, "Enter open")
        ),
        bind!(
            "s",
            "sort live allocations: size, age, stream",
            |k| k.code == KeyCode::Char('s'),
            Action::CycleSort,
            (10, "s sort")
        ),
        bind!(
            "g",
            "group live allocations by allocating stack",
            |k| k.code == KeyCode::Char('g'),
            Action::ToggleGroup,
            (9, "g group")
        ),
        bind!(
            "/",
            "filter live allocations by text in their stack",
            |k| k.code == KeyCode::Char('/'),
            Action::StartFilter,
            (8, "/ filter")
        ),
        bind!("d", "next GPU", |k| k.code == KeyCode::Char('d'), Action::NextDevice),
        bind!(
            "r R",
            "next / previous rank (several snapshots)",
            |k| k.code == KeyCode::Char('r'),
            Action::SwitchRank(1)
        ),
        bind!("", "", |k| k.code == KeyCode::Char('R'), Action::SwitchRank(-1)),
        bind!(
            "D",
            "the difference of the two runs (oomdoc tui A B): what grew, by kind and by line",
            |k| k.code == KeyCode::Char('D'),
            Action::ToggleDifference
        ),
        bind!("?", "this help", |k| k.code == KeyCode::Char('?'), Action::ToggleHelp, (11, "? help")),
        bind!(
            "q Esc",
            "quit (Esc closes help or the stack first)",
            |k| k.code == KeyCode::Char('q')
                || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)),
            Action::Quit,
            (12, "q quit")
        ),
        bind!("", "", |k| k.code == KeyCode::Esc, Action::Back),
    ]
}

/// The key table as Markdown, one row per binding with keys (the rows without keys continue the one above): what
/// docs/GUIDE.md shows, checked against it by a test.
pub fn markdown_table(table: &[Binding]) -> String {
    let mut out = String::from("| keys | action |\n|---|---|\n");
    for b in table.iter().filter(|b| !b.keys.is_empty()) {
        let keys: Vec<String> = b.keys.split(' ').map(|k| format!("`{k}`")).collect();
        out.push_str(&format!("| {} | {} |\n", keys.join(" "), b.help.replace('|', "\\|")));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_bar_key_is_a_binding_of_the_table() {
        let table = bindings();
        let line = status_line(&table, 200);
        assert!(line.starts_with("←→ step  PgUp/PgDn page  o OOM"), "{line}");
        // At 80 columns the line fits and still ends with the way to help and out.
        let narrow = status_line(&table, 80);
        assert!(narrow.chars().count() <= 80 && narrow.ends_with("? help  q quit"), "{narrow}");
        // Each status entry names the first key of its binding's help keys (arrows written together).
        for b in table.iter().filter(|b| b.status.0 > 0) {
            let first = b.keys.split_whitespace().next().unwrap_or("");
            let shown = b.status.1.split_whitespace().next().unwrap_or("");
            assert!(
                shown.replace("/", " ").contains(first) || shown.starts_with(first.chars().next().unwrap()),
                "{}",
                b.status.1
            );
        }
    }
}
