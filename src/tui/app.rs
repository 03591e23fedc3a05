//! TUI state and its updates. No terminal I/O here: `update` takes an action and changes the state; the view
//! module draws the state. The allocator state at the cursor comes from the replay's checkpoints, advanced
//! incrementally when the cursor moves forward.

use rustc_hash::FxHashMap;

use crate::analysis::attribution::{attribute_with_evidence, Attributed, Attribution, Source, TraceEvidence};
use crate::analysis::categories::{Categorizer, CategoryCache};
use crate::analysis::{culprit, Finding};
use crate::job::Analysed;
use crate::timeline::replay::{Replay, State};
use crate::timeline::stacks::StackId;
use crate::timeline::{Action as Ev, BlockState, Timeline};

#[derive(Clone, Debug, PartialEq)]
pub enum Jump {
    Oom,
    Peak,
    Start,
    End,
    Event(u32),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Quit,
    Back,
    Step(i64),
    Page(i64),
    Jump(Jump),
    NextPanel,
    PrevPanel,
    Select(i64),
    Open,
    CycleSort,
    ToggleGroup,
    StartFilter,
    FilterChar(char),
    FilterBackspace,
    FilterDone,
    FilterCancel,
    NextDevice,
    /// Another rank of the job (+1 next, -1 previous): the app ends and the caller opens that rank.
    SwitchRank(i64),
    ToggleHelp,
    /// The difference of the two runs given (`oomdoc tui A B`), over the whole screen, or back to the open run.
    ToggleDifference,
}

/// The job's ranks when several snapshots were given: their labels and which one is open.
#[derive(Clone, Debug, Default)]
pub struct Ranks {
    pub labels: Vec<String>,
    pub open: usize,
    /// The rank the user asked for: set by [`Action::SwitchRank`], read by the caller once the app ends.
    pub switch_to: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    Live,
    Segments,
    Findings,
    /// What Nsight Systems / Nsight Compute exports given beside the snapshot said (only when there were some).
    Profile,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    Size,
    Age,
    Stream,
}

/// A live allocation at the cursor, ready to show.
#[derive(Clone, Debug)]
pub struct Row {
    pub bytes: u64,
    pub count: usize,
    pub address: u64,
    pub stream: u64,
    pub alloc_event: Option<u32>,
    pub age_us: Option<i64>,
    pub category: &'static str,
    /// How the category was known (label, stack, or inferred from lifetime and size); none for `unknown`.
    pub source: Option<Source>,
    pub culprit: String,
    pub stack: StackId,
}

pub struct DeviceCtx<'t> {
    pub device: i64,
    pub replay: Replay<'t>,
    pub oom: Option<u32>,
    /// The event the analysis's report of this GPU describes (the OOM, else the peak): where its findings point.
    pub reported_at: Option<u32>,
    /// What the whole trace says of each size (and of the parameters at its end), read once for every cursor
    /// position's attribution.
    evidence: TraceEvidence,
}

pub struct App<'t> {
    pub tl: &'t Timeline,
    pub title: String,
    pub findings: Vec<Finding>,
    /// Each GPU's verdict summary (the report's first words), by device.
    pub verdicts: Vec<(i64, String)>,
    /// Per GPU, what the OOM panel adds at the OOM: the blocks that pin the free memory, the remedies the
    /// allocator model proved or refuted.
    pub at_oom: Vec<(i64, Vec<String>)>,
    /// The report's profiler section, one line each (empty without profiler exports).
    pub profile_lines: Vec<String>,
    /// Nsight Compute launches, the longest first, with the class the `kernel-bound` rule gave.
    pub ncu_rows: Vec<crate::analysis::profile::NcuRow>,
    pub devices: Vec<DeviceCtx<'t>>,
    pub dev: usize,
    /// Right after this event (`None`: before the first event, or a file without a trace).
    pub cursor: Option<u32>,
    pub state: State,
    pub panel: Panel,
    pub selected: usize,
    pub sort: Sort,
    pub group: bool,
    pub filter: String,
    pub filtering: bool,
    pub help: bool,
    /// The stack of the selected row is open in full (library frames unfolded) in the detail pane; ↑↓ scroll it.
    pub detail: bool,
    /// Lines the open stack is scrolled by.
    pub stack_scroll: u16,
    pub quit: bool,
    /// The job's ranks (empty labels: one snapshot).
    pub ranks: Ranks,
    /// With two runs given (`oomdoc tui A B`), what changed from the first to the second, as `oomdoc diff` says it:
    /// one line each. Empty otherwise.
    pub difference: Vec<String>,
    /// The difference is on the screen (it opens there when there is one); ↑↓ and PgUp/PgDn scroll it.
    pub showing_difference: bool,
    pub difference_scroll: u16,
    /// Rows of the live table for the cursor, filter, grouping and sort.
    pub rows: Vec<Row>,
    culprits: FxHashMap<StackId, String>,
    cats: CategoryCache<'t>,
    /// The attribution of the state at (GPU, cursor), kept while neither moves.
    attribution: (Option<(usize, Option<u32>)>, Attribution),
}

impl<'t> App<'t> {
    /// The app over one analysed timeline, taking its replays (each device's trace replayed once, by the
    /// analysis); a device the analysis left out (`--device`) is replayed here.
    pub fn new(analysed: Analysed<'t>, cats: &'t Categorizer, title: String) -> App<'t> {
        let Analysed { timeline: tl, analysis, mut replays } = analysed;
        let analysis = &analysis;
        let devices: Vec<DeviceCtx> = tl
            .devices
            .iter()
            .filter(|d| !d.segments.is_empty() || !d.events.is_empty())
            .map(|d| DeviceCtx {
                device: d.device,
                replay: match replays.iter().position(|r| r.device().device == d.device) {
                    Some(i) => replays.swap_remove(i),
                    None => Replay::new(d, tl.settings.as_ref()),
                },
                oom: d.events.iter().rposition(|e| e.action == Ev::Oom).map(|i| i as u32),
                reported_at: analysis.devices.iter().find(|r| r.device == d.device).and_then(|r| r.event_index),
                evidence: TraceEvidence::of(d),
            })
            .collect();
        let mut app = App {
            tl,
            title,
            findings: analysis.findings.clone(),
            verdicts: analysis
                .devices
                .iter()
                .filter_map(|d| Some((d.device, d.verdict.as_ref()?.summary.clone())))
                .collect(),
            at_oom: analysis
                .devices
                .iter()
                .map(|d| (d.device, oom_panel_lines(d)))
                .filter(|(_, l)| !l.is_empty())
                .collect(),
            profile_lines: analysis.profile.as_ref().map(crate::report::wording::profile_lines).unwrap_or_default(),
            ncu_rows: analysis.profile.as_ref().and_then(|p| p.ncu.as_ref()).map_or(Vec::new(), |n| n.by_time.clone()),
            devices,
            dev: 0,
            cursor: None,
            state: State::default(),
            panel: Panel::Live,
            selected: 0,
            sort: Sort::Size,
            group: false,
            filter: String::new(),
            filtering: false,
            help: false,
            detail: false,
            stack_scroll: 0,
            quit: false,
            ranks: Ranks::default(),
            difference: Vec::new(),
            showing_difference: false,
            difference_scroll: 0,
            rows: Vec::new(),
            culprits: FxHashMap::default(),
            cats: CategoryCache::new(cats, tl),
            attribution: (None, Attribution::default()),
        };
        app.open_device(first_device(&app.devices));
        app
    }

    pub fn device(&self) -> Option<&DeviceCtx<'t>> {
        self.devices.get(self.dev)
    }

    /// The verdict of the GPU shown.
    /// The OOM panel's extra lines for the current GPU.
    pub fn at_oom(&self) -> &[String] {
        let Some(d) = self.device().map(|d| d.device) else { return &[] };
        self.at_oom.iter().find(|(id, _)| *id == d).map_or(&[], |(_, l)| l.as_slice())
    }

    pub fn verdict(&self) -> Option<&str> {
        let d = self.device()?.device;
        self.verdicts.iter().find(|(id, _)| *id == d).map(|(_, s)| s.as_str())
    }

    pub fn events_len(&self) -> usize {
        self.device().map_or(0, |d| d.replay.device().events.len())
    }

    fn open_device(&mut self, i: usize) {
        self.dev = i;
        let Some(d) = self.devices.get(i) else { return };
        // Start where the story is: the OOM, else the peak, else the end.
        let at = d.oom.or(d.replay.peak_allocated.1).or_else(|| self.events_len().checked_sub(1).map(|n| n as u32));
        self.cursor = None;
        self.state = State::default();
        self.move_to(at);
    }

    /// Moves the cursor, computing the state incrementally when moving forward a little.
    pub fn move_to(&mut self, to: Option<u32>) {
        let Some(d) = self.devices.get(self.dev) else { return };
        let n = d.replay.device().events.len();
        let to = to.map(|t| t.min(n.saturating_sub(1) as u32)).filter(|_| n > 0);
        let fresh = self.rows.is_empty() && self.state.segments.is_empty();
        match (self.cursor, to) {
            (Some(c), Some(t)) if !fresh && t >= c && t - c <= 4096 => d.replay.advance(&mut self.state, Some(c), t),
            _ => self.state = d.replay.state_at(to),
        }
        if n == 0 {
            self.state = State::from_segments(&d.replay.device().segments);
        }
        self.cursor = to;
        self.rebuild_rows();
    }

    fn culprit(&mut self, stack: StackId) -> String {
        let tl = self.tl;
        self.culprits.entry(stack).or_insert_with(|| culprit(tl, stack)).clone()
    }

    /// Rebuilds the live table: the cursor, filter, grouping or sort changed.
    pub fn rebuild_rows(&mut self) {
        // What each live block is for, as the report says it: from labels, stacks, or lifetime and size; made again
        // only where the GPU or the cursor moved (not for a filter, a sort or grouping).
        let at = (self.dev, self.cursor);
        if self.attribution.0 != Some(at) {
            let Some(d) = self.devices.get_mut(self.dev) else { return };
            let seen = self.cursor.map_or(0, |c| c as usize + 1);
            let replay = &d.replay;
            let last = replay.device().events.len().checked_sub(1).map(|i| i as u32);
            let end = || replay.state_at(last);
            let a = attribute_with_evidence(
                self.tl,
                replay.device(),
                &self.state,
                seen,
                end,
                &mut self.cats,
                &mut d.evidence,
            );
            self.attribution = (Some(at), a);
        }
        let Some(d) = self.devices.get(self.dev) else { return };
        let events = &d.replay.device().events;
        let now = self.cursor.and_then(|c| events[c as usize].time_us());
        let mut live: Vec<(u64, u64, u64, Option<u32>, StackId)> = self
            .state
            .allocated_blocks()
            .map(|(seg, addr, b)| (b.size, addr, seg.stream, b.alloc_event, b.stack))
            .collect();
        live.sort_unstable_by_key(|r| r.1);
        let mut rows = Vec::with_capacity(live.len());
        let filter = self.filter.to_lowercase();
        for (bytes, address, stream, alloc_event, stack) in live {
            let culprit = self.culprit(stack);
            if !filter.is_empty()
                && !self.stack_text(stack).contains(&filter)
                && !culprit.to_lowercase().contains(&filter)
            {
                continue;
            }
            let age_us = match (now, alloc_event.and_then(|i| events[i as usize].time_us())) {
                (Some(n), Some(t)) => Some(n - t),
                _ => None,
            };
            let Attributed { category, source, .. } = self.attribution.1.of(address);
            rows.push(Row { bytes, count: 1, address, stream, alloc_event, age_us, category, source, culprit, stack });
        }
        if self.group {
            // One row per stack and what it was for, and how that was known: the blocks without a stack are told
            // apart by their category.
            let mut by: FxHashMap<(StackId, &'static str, Option<Source>), Row> = FxHashMap::default();
            for r in rows {
                by.entry((r.stack, r.category, r.source))
                    .and_modify(|g| {
                        g.bytes += r.bytes;
                        g.count += 1;
                        g.age_us = g.age_us.max(r.age_us);
                    })
                    .or_insert(r);
            }
            rows = by.into_values().collect();
        }
        match self.sort {
            Sort::Size => rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.address.cmp(&b.address))),
            Sort::Age => rows.sort_by(|a, b| b.age_us.cmp(&a.age_us).then(b.bytes.cmp(&a.bytes))),
            Sort::Stream => rows.sort_by(|a, b| a.stream.cmp(&b.stream).then(b.bytes.cmp(&a.bytes))),
        }
        self.rows = rows;
        self.selected = self.selected.min(self.rows.len().saturating_sub(1));
    }

    fn stack_text(&self, stack: StackId) -> String {
        let tl = self.tl;
        tl.stacks
            .stack(stack)
            .iter()
            .map(|&f| {
                let f = tl.stacks.frame(f);
                format!("{} {}", tl.strings.get(f.filename), tl.strings.get(f.name))
            })
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    }

    fn rows_len(&self) -> usize {
        match self.panel {
            Panel::Live => self.rows.len(),
            Panel::Segments => self.state.segments.len(),
            Panel::Findings => self.findings.len(),
            Panel::Profile => self.ncu_rows.len(),
        }
    }

    /// The panels Tab cycles through: the profile panel only when profiler exports were read.
    pub fn panels(&self) -> Vec<Panel> {
        let mut v = vec![Panel::Live, Panel::Segments, Panel::Findings];
        if !self.profile_lines.is_empty() {
            v.push(Panel::Profile);
        }
        v
    }

    /// Applies one action.
    pub fn update(&mut self, action: Action) {
        // Over the difference view, the keys scroll it; Esc or D goes back to the open run, q quits, ? helps.
        if self.showing_difference && !self.help {
            let last = self.difference.len().saturating_sub(1) as i64;
            let scroll = |by: i64, at: u16| (at as i64 + by).clamp(0, last) as u16;
            match action {
                Action::Select(k) | Action::Step(k) => self.difference_scroll = scroll(k, self.difference_scroll),
                Action::Page(k) => self.difference_scroll = scroll(k * 20, self.difference_scroll),
                Action::Jump(Jump::Start) => self.difference_scroll = 0,
                Action::Back | Action::ToggleDifference | Action::Open => self.showing_difference = false,
                Action::Quit | Action::ToggleHelp | Action::SwitchRank(_) => {}
                _ => return,
            }
            if !matches!(action, Action::Quit | Action::ToggleHelp | Action::SwitchRank(_)) {
                return;
            }
        }
        let n = self.events_len() as i64;
        let cur = self.cursor.map_or(-1, |c| c as i64);
        match action {
            Action::Quit => self.quit = true,
            Action::Back => {
                if self.help {
                    self.help = false;
                } else if self.detail {
                    self.detail = false;
                    self.stack_scroll = 0;
                } else {
                    self.quit = true;
                }
            }
            Action::Step(k) => self.step_to(cur + k, n),
            Action::Page(k) => self.step_to(cur + k * (n / 20).max(1), n),
            Action::Jump(j) => {
                let d = self.device();
                let target = match j {
                    Jump::Oom => d.and_then(|d| d.oom),
                    Jump::Peak => d.and_then(|d| d.replay.peak_allocated.1),
                    Jump::Start => (n > 0).then_some(0),
                    Jump::End => (n > 0).then(|| (n - 1) as u32),
                    Jump::Event(e) => Some(e),
                };
                if target.is_some() {
                    self.move_to(target);
                }
            }
            Action::NextPanel | Action::PrevPanel => {
                let order = self.panels();
                let i = order.iter().position(|p| *p == self.panel).unwrap_or(0);
                let k = if action == Action::NextPanel { 1 } else { order.len() - 1 };
                self.panel = order[(i + k) % order.len()];
                self.selected = 0;
                self.detail = false;
            }
            Action::Select(k) if self.detail && self.panel == Panel::Live => {
                self.stack_scroll = (i64::from(self.stack_scroll) + k).clamp(0, i64::from(u16::MAX)) as u16;
            }
            Action::Select(k) => {
                let len = self.rows_len() as i64;
                if len > 0 {
                    self.selected = (self.selected as i64 + k).clamp(0, len - 1) as usize;
                }
            }
            Action::Open => match self.panel {
                // Enter unfolds the stack (every frame, scrollable) and folds it again.
                Panel::Live => {
                    self.detail = !self.detail && !self.rows.is_empty();
                    self.stack_scroll = 0;
                }
                Panel::Segments | Panel::Profile => {}
                Panel::Findings => {
                    if let Some(f) = self.findings.get(self.selected) {
                        if let Some(i) = self.devices.iter().position(|d| Some(d.device) == f.device) {
                            if i != self.dev {
                                self.open_device(i);
                            }
                        }
                        let d = self.device();
                        // A finding is about its GPU's report, at that report's moment.
                        let target = d.and_then(|d| d.reported_at.or(d.oom).or(d.replay.peak_allocated.1));
                        if target.is_some() {
                            self.move_to(target);
                        }
                        self.panel = Panel::Live;
                        self.selected = 0;
                    }
                }
            },
            Action::CycleSort => {
                self.sort = match self.sort {
                    Sort::Size => Sort::Age,
                    Sort::Age => Sort::Stream,
                    Sort::Stream => Sort::Size,
                };
                self.rebuild_rows();
            }
            Action::ToggleGroup => {
                self.group = !self.group;
                self.selected = 0;
                self.rebuild_rows();
            }
            Action::StartFilter => {
                self.filtering = true;
                self.panel = Panel::Live;
            }
            Action::FilterChar(c) => {
                self.filter.push(c);
                self.selected = 0;
                self.rebuild_rows();
            }
            Action::FilterBackspace => {
                self.filter.pop();
                self.rebuild_rows();
            }
            Action::FilterDone => self.filtering = false,
            Action::FilterCancel => {
                self.filtering = false;
                self.filter.clear();
                self.rebuild_rows();
            }
            Action::NextDevice => {
                if self.devices.len() > 1 {
                    self.open_device((self.dev + 1) % self.devices.len());
                }
            }
            Action::SwitchRank(by) => {
                let n = self.ranks.labels.len() as i64;
                if n > 1 {
                    self.ranks.switch_to = Some((self.ranks.open as i64 + by).rem_euclid(n) as usize);
                    self.quit = true;
                }
            }
            Action::ToggleHelp => self.help = !self.help,
            Action::ToggleDifference => {
                self.showing_difference = !self.difference.is_empty();
            }
        }
    }

    fn step_to(&mut self, target: i64, n: i64) {
        if n == 0 {
            return;
        }
        let t = target.clamp(0, n - 1) as u32;
        self.move_to(Some(t));
    }

    /// The selected live row, if any.
    pub fn selected_row(&self) -> Option<&Row> {
        (self.panel == Panel::Live).then(|| self.rows.get(self.selected)).flatten()
    }

    /// When the selected allocation is freed after the cursor (event index), if it is.
    pub fn freed_at(&self, row: &Row) -> Option<u32> {
        let d = self.device()?;
        let from = self.cursor.map_or(0, |c| c as usize + 1);
        d.replay.device().events[from..]
            .iter()
            .position(|e| matches!(e.action, Ev::FreeRequested | Ev::FreeCompleted) && e.addr == row.address)
            .map(|p| (from + p) as u32)
    }

    /// Block states of a segment at the cursor, in address order: (address, size, state).
    pub fn segment_blocks(&self, seg: u64) -> Vec<(u64, u64, BlockState)> {
        self.state.segment_blocks(seg).map(|(a, b)| (a, b.size, b.state)).collect()
    }
}

/// Where the TUI opens: on the GPU that ran out of memory (the first in time when several did), else on the one
/// that peaked highest.
fn first_device(devices: &[DeviceCtx]) -> usize {
    let oom_time = |d: &DeviceCtx| {
        let e = &d.replay.device().events[d.oom? as usize];
        Some(e.time_us().unwrap_or(i64::MAX))
    };
    let first_oom = devices.iter().enumerate().filter_map(|(i, d)| Some((oom_time(d)?, i))).min();
    match first_oom {
        Some((_, i)) => i,
        None => devices
            .iter()
            .enumerate()
            .max_by(|(i, a), (j, b)| a.replay.peak_allocated.0.cmp(&b.replay.peak_allocated.0).then(j.cmp(i)))
            .map_or(0, |(i, _)| i),
    }
}

/// The OOM panel's extra lines, short enough for a side panel: the blocks that pin the free memory and the
/// remedies replayed on the trace (the reports say them in full).
fn oom_panel_lines(d: &crate::analysis::DeviceReport) -> Vec<String> {
    use crate::units::bytes;
    let mut out = Vec::new();
    if let Some(p) = &d.pinning {
        out.push(format!("pinned: {} blocks keep {} free in pieces", p.blocks, bytes(p.pinned_free_bytes)));
        for s in p.by_stack.iter().take(2) {
            out.push(format!("  {} by {}× {}", bytes(s.pinned_free_bytes), s.blocks, s.stack));
        }
        if let Some(m) = p.worst_moments.first() {
            out.push(format!("most pinned: {} at event {}", bytes(m.pinned_free_bytes), m.event_index));
        }
    }
    for w in &d.whatif {
        let answer = match (w.fits, w.headroom_bytes, w.undecided_above) {
            (Some(true), Some(h), _) => format!("fits ({} spare)", bytes(h.max(0) as u64)),
            (Some(false), _, _) => "still runs out".to_string(),
            (_, _, Some(l)) => format!("fits only over a {} cap", bytes(l)),
            _ => "capacity unknown".to_string(),
        };
        out.push(format!("{} → {answer}", w.change));
    }
    out
}
