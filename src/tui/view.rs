//! Drawing: reads the app state, never changes it. One function per area of the screen, so each can be tested on
//! its own with a `TestBackend`.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Cell, Chart, Clear, Dataset, GraphType, Paragraph, Row as TableRow, Table, TableState, Wrap,
};
use ratatui::Frame;

use super::app::{App, Panel, Row, Sort};
use super::keys;
use crate::analysis::attribution::Source;
use crate::analysis::stacks::folded;
use crate::analysis::{stack_frames, Severity};
use crate::timeline::{Action as Ev, BlockState};
use crate::units::{bytes, duration_us};

const ALLOCATED: Color = Color::Cyan;
const RESERVED: Color = Color::Yellow;
const OOM: Color = Color::Red;
const PEAK: Color = Color::Magenta;
const CURSOR: Color = Color::White;

/// The whole screen.
pub fn draw(f: &mut Frame, app: &App) {
    let [header, chart, body, status] =
        Layout::vertical([Constraint::Length(3), Constraint::Length(10), Constraint::Min(6), Constraint::Length(1)])
            .areas(f.area());
    draw_header(f, app, header);
    draw_chart(f, app, chart);
    let [left, right] = Layout::horizontal([Constraint::Percentage(58), Constraint::Percentage(42)]).areas(body);
    match app.panel {
        Panel::Live => {
            draw_live(f, app, left);
            draw_detail(f, app, right);
        }
        Panel::Segments => {
            draw_segments(f, app, left);
            draw_pools(f, app, right);
        }
        Panel::Findings => {
            draw_findings(f, app, left);
            draw_finding_detail(f, app, right);
        }
        Panel::Profile => {
            draw_profile(f, app, left);
            draw_ncu(f, app, right);
        }
    }
    draw_status(f, app, status);
    if app.showing_difference {
        draw_difference(f, app, Rect { height: f.area().height.saturating_sub(1), ..f.area() });
    }
    if app.help {
        draw_help(f, f.area());
    }
}

fn draw_header(f: &mut Frame, app: &App, area: Rect) {
    let n = app.events_len();
    let mut first = vec![Span::from("oomdoc ").bold(), Span::from(app.title.as_str())];
    if !app.findings.is_empty() {
        let worst = app.findings[0].severity;
        first.push(
            Span::from(format!(
                "   {} finding{} (Tab)",
                app.findings.len(),
                if app.findings.len() == 1 { "" } else { "s" }
            ))
            .fg(severity_color(worst))
            .bold(),
        );
    }
    if app.ranks.labels.len() > 1 {
        let r = &app.ranks;
        first.push(Span::from(format!("   {}", r.labels[r.open])).bold());
        first.push(Span::from(format!(" ({} of {}, r: next)", r.open + 1, r.labels.len())));
    }
    if let Some(d) = app.device() {
        first.push(Span::from(format!("   GPU {}", d.device)).bold());
        if app.devices.len() > 1 {
            first.push(Span::from(format!(" ({} of {}, d: next)", app.dev + 1, app.devices.len())));
        }
    }
    let st = &app.state;
    let mut second = vec![
        Span::from("allocated ").fg(ALLOCATED),
        Span::from(bytes(st.allocated)).bold(),
        Span::from("  reserved ").fg(RESERVED),
        Span::from(bytes(st.reserved)).bold(),
        Span::from(format!("  cached free {}", bytes(st.reserved - st.allocated.min(st.reserved)))),
        Span::from(format!("  largest free block {}", bytes(st.largest_free_block()))),
    ];
    match (app.cursor, app.device()) {
        (Some(c), Some(d)) => {
            let e = &d.replay.device().events[c as usize];
            second.push(Span::from(format!("   event {}/{n}: ", c + 1)));
            let what = if e.action == Ev::Oom {
                Span::from(format!("OOM {}", bytes(e.size))).fg(OOM).bold()
            } else {
                Span::from(format!("{} {}", e.action.name(), bytes(e.size)))
            };
            second.push(what);
            if let (Some(t), Some(t0)) = (e.time_us(), d.replay.device().events.iter().find_map(|e| e.time_us())) {
                second.push(Span::from(format!(" at {}", duration_us(t - t0))));
            }
        }
        _ if n == 0 => second.push(Span::from("   no trace: the state at the dump").italic()),
        _ => {}
    }
    let mut lines = vec![Line::from(first), Line::from(second)];
    if let Some(v) = app.verdict() {
        lines.push(Line::from(Span::from(v.to_string()).italic()));
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// Max of each bucket: a peak is never averaged away.
fn downsample(series: &[u64], buckets: usize) -> Vec<(f64, f64)> {
    if series.is_empty() || buckets == 0 {
        return Vec::new();
    }
    let per = series.len().div_ceil(buckets).max(1);
    series.chunks(per).enumerate().map(|(i, c)| ((i * per) as f64, *c.iter().max().unwrap_or(&0) as f64)).collect()
}

fn draw_chart(f: &mut Frame, app: &App, area: Rect) {
    let block = Block::default().borders(Borders::ALL).title(Line::from(vec![
        Span::from(" timeline  "),
        Span::from("━ allocated ").fg(ALLOCATED),
        Span::from("━ reserved ").fg(RESERVED),
        Span::from("│ OOM ").fg(OOM),
        Span::from("│ peak ").fg(PEAK),
        Span::from("│ cursor ").fg(CURSOR),
    ]));
    let Some(d) = app.device() else {
        f.render_widget(block, area);
        return;
    };
    let n = d.replay.allocated_series.len();
    if n == 0 {
        f.render_widget(
            Paragraph::new("No allocation trace in this file: only the state at the dump.").block(block),
            area,
        );
        return;
    }
    let width = area.width.saturating_sub(12).max(10) as usize * 2;
    let allocated = downsample(&d.replay.allocated_series, width);
    let per = n.div_ceil(width).max(1);
    let reserved: Vec<(f64, f64)> = d
        .replay
        .reserved_series
        .chunk_max(per)
        .iter()
        .enumerate()
        .map(|(i, &m)| ((i * per) as f64, m as f64))
        .collect();
    let top = d.replay.reserved_series.max().unwrap_or(1).max(1) as f64 * 1.05;
    let vline = |x: u32| vec![(x as f64, 0.0), (x as f64, top)];
    let oom = d.oom.map(vline);
    let peak = d.replay.peak_allocated.1.map(vline);
    let cursor = app.cursor.map(vline);
    let mut sets = vec![
        Dataset::default().marker(Marker::Braille).graph_type(GraphType::Line).fg(RESERVED).data(&reserved),
        Dataset::default().marker(Marker::Braille).graph_type(GraphType::Line).fg(ALLOCATED).data(&allocated),
    ];
    for (line, color) in [(&peak, PEAK), (&oom, OOM), (&cursor, CURSOR)] {
        if let Some(l) = line {
            sets.push(Dataset::default().marker(Marker::Braille).graph_type(GraphType::Line).fg(color).data(l));
        }
    }
    let chart = Chart::new(sets)
        .block(block)
        .x_axis(Axis::default().bounds([0.0, n.max(2) as f64 - 1.0]).labels(["0".to_string(), format!("{n} events")]))
        .y_axis(Axis::default().bounds([0.0, top]).labels(["0".to_string(), bytes(top as u64)]));
    f.render_widget(chart, area);
}

fn panel_title<'a>(app: &App, this: Panel, title: &'a str) -> Line<'a> {
    let style = if app.panel == this { Style::default().bold().reversed() } else { Style::default() };
    Line::from(Span::styled(format!(" {title} "), style))
}

fn tabs(app: &App) -> Line<'static> {
    let mut spans = Vec::new();
    for p in app.panels() {
        let name = match p {
            Panel::Live => "live",
            Panel::Segments => "segments",
            Panel::Findings => "findings",
            Panel::Profile => "profile",
        };
        let s = format!(" {name} ");
        spans.push(if app.panel == p { Span::from(s).reversed() } else { Span::from(s).dim() });
    }
    Line::from(spans)
}

fn draw_live(f: &mut Frame, app: &App, area: Rect) {
    let sort = match app.sort {
        Sort::Size => "size",
        Sort::Age => "age",
        Sort::Stream => "stream",
    };
    let what = if app.group { "live by stack" } else { "live allocations" };
    let mut title = format!("{what} ({}) · sort: {sort}", app.rows.len());
    if !app.filter.is_empty() {
        title.push_str(&format!(" · filter: {}", app.filter));
    }
    let block =
        Block::default().borders(Borders::ALL).title(panel_title(app, Panel::Live, &title)).title_bottom(tabs(app));
    let header = if app.group {
        TableRow::new(["bytes", "count", "oldest", "category", "allocated by"])
    } else {
        TableRow::new(["size", "age", "stream", "category", "allocated by"])
    }
    .bold();
    let rows = app.rows.iter().map(|r| {
        let age = r.age_us.map_or("-".to_string(), duration_us);
        let mid = if app.group { r.count.to_string() } else { age.clone() };
        let third = if app.group { age } else { stream_name(r.stream) };
        TableRow::new([
            Cell::from(bytes(r.bytes)),
            Cell::from(mid),
            Cell::from(third),
            Cell::from(category_cell(r)),
            Cell::from(r.culprit.clone()),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(11),
            Constraint::Min(10),
        ],
    )
    .header(header)
    .block(block)
    .row_highlight_style(Style::default().reversed());
    let mut state = TableState::default().with_selected((!app.rows.is_empty()).then_some(app.selected));
    f.render_stateful_widget(table, area, &mut state);
}

/// The category as the report words it; `~` marks one inferred from lifetime and size (the help says so).
fn category_cell(r: &Row) -> String {
    let words = r.category.replace('_', " ");
    if r.source == Some(Source::Inferred) {
        format!("~{words}")
    } else {
        words
    }
}

fn stream_name(s: u64) -> String {
    if s == 0 {
        "default".into()
    } else {
        format!("{s:#x}")
    }
}

fn draw_detail(f: &mut Frame, app: &App, area: Rect) {
    let title = if app.detail {
        " stack, every frame · ↑↓ scroll · Enter fold · Esc close "
    } else {
        " stack (innermost first) · Enter: every frame "
    };
    let block = Block::default().borders(Borders::ALL).title(title);
    let Some(row) = app.selected_row() else {
        f.render_widget(Paragraph::new("No live allocation selected.").block(block), area);
        return;
    };
    let mut lines = vec![Line::from(vec![
        Span::from(bytes(row.bytes)).bold(),
        Span::from(if app.group {
            format!(" in {} allocations", row.count)
        } else {
            format!(" at {:#x}", row.address)
        }),
    ])];
    if let (Some(d), false) = (app.device(), app.group) {
        let events = &d.replay.device().events;
        let when = |i: u32| {
            let t = events[i as usize].time_us();
            let t0 = events.iter().find_map(|e| e.time_us());
            match (t, t0) {
                (Some(t), Some(t0)) => format!("event {} ({})", i + 1, duration_us(t - t0)),
                _ => format!("event {}", i + 1),
            }
        };
        lines.push(Line::from(match row.alloc_event {
            Some(i) => format!("allocated at {}", when(i)),
            None => "allocated before the trace begins".into(),
        }));
        lines.push(Line::from(match app.freed_at(row) {
            Some(i) => format!("freed at {}", when(i)),
            None => "never freed in the trace".into(),
        }));
    }
    lines.push(Line::from(""));
    let head = lines.len();
    // Library frames are context, dim; the user's own frames are where the fix goes, bold. Folded, each run of
    // library frames is one line (as in the text report), so the user's code shows without scrolling.
    if app.detail {
        for fr in stack_frames(app.tl, row.stack) {
            lines.push(if fr.library {
                Line::from(format!("  {}", fr.short())).dim()
            } else {
                Line::from(fr.short()).bold()
            });
        }
    } else {
        for (library, text) in folded(app.tl, row.stack, usize::MAX) {
            lines.push(if library { Line::from(format!("  {text}")).dim() } else { Line::from(text).bold() });
        }
    }
    if lines.len() == head {
        lines.push(Line::from("(no stack recorded)").italic());
    }
    // One line per frame (cut at the pane's edge, never wrapped): what is below the fold is said, and scrolls.
    let inner = area.height.saturating_sub(2) as usize;
    let scroll = if app.detail { (app.stack_scroll as usize).min(lines.len().saturating_sub(inner)) } else { 0 };
    let mut shown: Vec<Line> = lines.into_iter().skip(scroll).collect();
    if shown.len() > inner && inner > 0 {
        let hidden = shown.len() - (inner - 1);
        shown.truncate(inner - 1);
        let more = if app.detail { "↓ scrolls" } else { "Enter shows every frame" };
        shown.push(Line::from(format!("… {hidden} more lines ({more})")).italic());
    }
    f.render_widget(Paragraph::new(shown).block(block), area);
}

fn draw_segments(f: &mut Frame, app: &App, area: Rect) {
    let segs = app.state.segments_sorted();
    let title = format!("segments at the cursor ({}) · █ allocated ▒ pending free · free", segs.len());
    let block =
        Block::default().borders(Borders::ALL).title(panel_title(app, Panel::Segments, &title)).title_bottom(tabs(app));
    let inner = block.inner(area);
    let bar_width = inner.width.saturating_sub(22).max(8) as usize;
    let height = inner.height as usize;
    let start = app.selected.saturating_sub(height.saturating_sub(1));
    let mut lines = Vec::new();
    for (i, s) in segs.iter().enumerate().skip(start).take(height) {
        let mut cells = vec![(' ', Color::Reset); bar_width];
        for (addr, b) in app.state.segment_blocks(s.addr) {
            let from = ((addr - s.addr) as u128 * bar_width as u128 / s.size.max(1) as u128) as usize;
            let to = (((addr - s.addr + b.size) as u128 * bar_width as u128).div_ceil(s.size.max(1) as u128)) as usize;
            let cell = match b.state {
                BlockState::ActiveAllocated => ('█', ALLOCATED),
                BlockState::ActivePendingFree => ('▒', RESERVED),
                BlockState::Inactive => ('·', Color::DarkGray),
            };
            for c in cells.iter_mut().take(to.min(bar_width)).skip(from) {
                // Allocated wins a shared cell: a sliver of a tensor must not vanish between free blocks.
                if c.0 != '█' {
                    *c = cell;
                }
            }
        }
        let mut spans = vec![Span::from(format!("{:>9} ", bytes(s.size)))];
        spans.extend(cells.into_iter().map(|(ch, color)| Span::from(ch.to_string()).fg(color)));
        let mut line = Line::from(spans);
        if i == app.selected {
            line = line.reversed();
        }
        lines.push(line);
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn draw_pools(f: &mut Frame, app: &App, area: Rect) {
    let block = Block::default().borders(Borders::ALL).title(" free memory at the cursor ");
    let st = &app.state;
    let mut lines = vec![
        Line::from(format!(
            "reserved {}  allocated {}  active {}",
            bytes(st.reserved),
            bytes(st.allocated),
            bytes(st.active)
        )),
        Line::from(format!(
            "cached free {}  largest free block {}",
            bytes(st.reserved - st.active.min(st.reserved)),
            bytes(st.largest_free_block())
        )),
    ];
    if let (Some(d), Some(c)) = (app.device(), app.cursor) {
        let e = &d.replay.device().events[c as usize];
        if e.action == Ev::Oom {
            let fits = st.largest_free_block() >= e.size;
            lines.push(Line::from(""));
            lines.push(Line::from(format!("OOM: a request for {} could not be placed", bytes(e.size))).fg(OOM).bold());
            lines.push(Line::from(format!(
                "largest free block {} · {}",
                bytes(st.largest_free_block()),
                if fits { "it fits another pool or stream only" } else { "too small" }
            )));
            if let Some(free) = d.replay.device().attrs(e).device_free() {
                lines.push(Line::from(format!("the driver had {} free", bytes(free))));
            }
            for l in app.at_oom() {
                lines.push(Line::from(l.clone()).fg(PEAK));
            }
        }
    }
    let segs = st.segments_sorted();
    if let Some(s) = segs.get(app.selected) {
        lines.push(Line::from(""));
        lines.push(Line::from(format!("segment {:#x}: {}", s.addr, bytes(s.size))).bold());
        lines.push(Line::from(format!(
            "stream {} · pool {:?}{}",
            stream_name(s.stream),
            s.pool_id,
            if s.expandable { " · expandable" } else { "" }
        )));
        for (addr, b) in st.segment_blocks(s.addr).take(area.height.saturating_sub(9) as usize) {
            let state = match b.state {
                BlockState::ActiveAllocated => "allocated",
                BlockState::ActivePendingFree => "pending free",
                BlockState::Inactive => "free",
            };
            lines.push(Line::from(format!("  {addr:#x} {:>10} {state}", bytes(b.size))));
        }
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn severity_color(s: Severity) -> Color {
    match s {
        Severity::Error => Color::Red,
        Severity::Warning => Color::Yellow,
        Severity::Info => Color::Blue,
    }
}

fn draw_findings(f: &mut Frame, app: &App, area: Rect) {
    let title = format!("findings ({}) · Enter: go to the moment", app.findings.len());
    let block =
        Block::default().borders(Borders::ALL).title(panel_title(app, Panel::Findings, &title)).title_bottom(tabs(app));
    if app.findings.is_empty() {
        f.render_widget(Paragraph::new("No rule found a cause.").block(block), area);
        return;
    }
    let lines: Vec<Line> = app
        .findings
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let gpu = x.device.map_or(String::new(), |d| format!("GPU {d} "));
            let line = Line::from(vec![
                Span::from(format!("{:<8}", x.severity)).fg(severity_color(x.severity)).bold(),
                Span::from(format!("{gpu}{} [{}]", x.title, x.rule)),
            ]);
            if i == app.selected {
                line.reversed()
            } else {
                line
            }
        })
        .collect();
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn draw_finding_detail(f: &mut Frame, app: &App, area: Rect) {
    let block = Block::default().borders(Borders::ALL).title(" evidence and fix ");
    let Some(x) = app.findings.get(app.selected) else {
        f.render_widget(block, area);
        return;
    };
    let mut lines = vec![Line::from(x.message.clone()), Line::from("")];
    if let Some(obj) = x.evidence.as_object() {
        for (k, v) in obj {
            let v = match (v.as_u64(), v.as_str()) {
                (Some(n), _) if k.ends_with("bytes") => bytes(n),
                (_, Some(s)) => s.to_string(),
                _ if v.is_f64() => format!("{:.3}", v.as_f64().unwrap_or(0.0)).trim_end_matches('0').to_string(),
                _ => v.to_string(),
            };
            lines.push(Line::from(vec![Span::from(format!("{k}: ")).dim(), Span::from(v)]));
        }
    }
    lines.push(Line::from(""));
    lines.push(Line::from(vec![Span::from("fix: ").bold(), Span::from(x.fix.clone())]));
    f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }), area);
}

fn draw_profile(f: &mut Frame, app: &App, area: Rect) {
    let block = Block::default()
        .borders(Borders::ALL)
        .title(panel_title(app, Panel::Profile, "profiler exports (Nsight Systems / Nsight Compute)"))
        .title_bottom(tabs(app));
    let lines: Vec<Line> = app.profile_lines.iter().map(|l| Line::from(l.clone())).collect();
    f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }), area);
}

fn class_color(c: Option<&str>) -> Color {
    match c {
        Some("memory-bound") => Color::Yellow,
        Some("compute-bound") => Color::Green,
        Some("compute-and-memory-bound") => Color::Cyan,
        Some("latency-bound") => Color::Magenta,
        _ => Color::Gray,
    }
}

/// The `kernel-bound` class in a column of nine.
fn short_class(c: Option<&str>) -> &str {
    match c {
        Some("compute-and-memory-bound") => "both",
        Some(c) => c.strip_suffix("-bound").unwrap_or(c),
        None => "-",
    }
}

fn draw_ncu(f: &mut Frame, app: &App, area: Rect) {
    let block = Block::default().borders(Borders::ALL).title(" Nsight Compute launches, longest first ");
    if app.ncu_rows.is_empty() {
        f.render_widget(Paragraph::new("No Nsight Compute export.").block(block), area);
        return;
    }
    let pct = |v: Option<f64>| format!("{:>4}", crate::report::wording::pct_f(v));
    let mut lines = vec![Line::from("duration    mem    SM  bound    kernel").dim()];
    for (i, r) in app.ncu_rows.iter().enumerate() {
        let dur = crate::report::wording::ns_f(r.duration_ns);
        let class = r.class.as_deref();
        let line = Line::from(vec![
            Span::from(format!("{dur:>9} {} {}  ", pct(r.memory_throughput_pct), pct(r.sm_throughput_pct))),
            Span::from(format!("{:<9}", short_class(class))).fg(class_color(class)),
            Span::from(crate::analysis::profile::short_kernel_name(&r.name)),
        ]);
        lines.push(if i == app.selected { line.reversed() } else { line });
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn draw_status(f: &mut Frame, app: &App, area: Rect) {
    let line = if app.filtering {
        Line::from(vec![Span::from("filter: ").bold(), Span::from(app.filter.clone()), Span::from("▏")])
    } else {
        Line::from(keys::status_line(&keys::bindings(), area.width as usize)).dim()
    };
    f.render_widget(Paragraph::new(line), area);
}

/// The two runs compared, over the whole screen but the status line: `oomdoc diff`'s text, scrolled.
fn draw_difference(f: &mut Frame, app: &App, area: Rect) {
    let lines: Vec<Line> = app
        .difference
        .iter()
        .map(|l| {
            if l.starts_with(|c: char| !c.is_whitespace()) {
                Line::from(l.as_str()).bold()
            } else {
                Line::from(l.as_str())
            }
        })
        .collect();
    let title = " difference of the two runs — D or Esc: the open run, r: the other run, ↑↓ PgUp PgDn: scroll ";
    f.render_widget(Clear, area);
    f.render_widget(
        Paragraph::new(lines)
            .scroll((app.difference_scroll, 0))
            .block(Block::default().borders(Borders::ALL).title(title)),
        area,
    );
}

fn draw_help(f: &mut Frame, area: Rect) {
    let table = keys::bindings();
    let mut lines = vec![Line::from("Keys").bold(), Line::from("")];
    for b in table.iter().filter(|b| !b.keys.is_empty()) {
        lines.push(Line::from(vec![Span::from(format!("{:<12}", b.keys)).bold(), Span::from(b.help)]));
    }
    lines.push(Line::from(""));
    lines.push(Line::from("~ before a category: inferred from lifetime and size (no stack said)."));
    lines.push(Line::from("Esc or ? closes this help.").dim());
    let w = 72.min(area.width);
    let h = (lines.len() as u16 + 2).min(area.height);
    let popup = Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h };
    f.render_widget(Clear, popup);
    f.render_widget(Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" help ")), popup);
}
