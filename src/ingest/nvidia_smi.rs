//! nvidia-smi output in every form people save it: the default table (every driver generation: the 79-column
//! boxes of ≤ 525, the 89/91-column ones of 530+, Windows `WDDM` with `N/A` process memory, the `MIG devices`
//! box, the Processes box with and without `GI`/`CI` columns), `-q` and `-q -d MEMORY`, `--query-gpu` and
//! `--query-compute-apps` CSV (with or without header and units, headers that scripts write by hand such as
//! `memory.used[MiB]`, `-l`/`-lms` logs), and `dmon` / `pmon`. Many outputs may be pasted into one file; a
//! capture file whose sections open with `####…` rules and `# title` / `# $ command` comments is read section by
//! section, and the sections that hold nothing this module reads are listed as skipped.
//!
//! Facts the readers rely on (see shared/formats/text-artifacts.md §3 and the real files in
//! fixtures/real/nvidia-smi):
//! - Every size nvidia-smi prints is MiB = 2^20 bytes, whatever the column says: `dmon`/`pmon` label their `fb`
//!   column `MB` and scripts' hand-made headers say `[MB]`, but the figures are NVML's bytes >> 20. So `MB`,
//!   `GB`, `KB` are read as binary units here.
//! - GPUs are told apart by index where the output gives one (table, `index` column, dmon/pmon `Idx`), else by
//!   PCI bus id (`-q`'s `GPU 00000000:00:09.0`, `pci.bus_id`, `gpu_bus_id`), else by UUID; output that names no
//!   GPU is GPU 0. `-q` lists GPUs in bus order, which is index order, so its n-th GPU is index n unless its
//!   bus id says otherwise.
//! - Processes are kept once per (GPU, pid), across every listing that named them, with the largest memory any
//!   listing gave and the most complete name (`-q` and `--query-compute-apps` print the whole path, the table
//!   cuts it to `...tail`, pmon to 15 characters). MIG instances likewise, once per (GI, CI, MIG device).
//! - A headerless `--query-gpu` log takes its columns from the caller, else from a `--query-gpu=…,noheader`
//!   command line in the text, else by inference: a `YYYY/MM/DD HH:MM:SS.mmm` timestamp, a small integer right
//!   after it as the index, a text column as the name, and the one triple of number columns where used + free
//!   ≈ total (recent drivers leave the reserved memory out of both). Rows whose columns cannot be told are
//!   reported, not guessed.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use regex::Regex;

use super::text::{find_stamp, lines, parse_decimal, parse_size, wall_us};
use crate::timeline::{GpuProcess, Malformed, MemorySample, MigInstance, Stamp};

/// Malformed lines kept with their text (all are counted).
const KEEP_MALFORMED: usize = 20;
/// Lines that are not rows after which a CSV or dmon/pmon block is taken to have ended.
const MAX_GAP: usize = 500;

/// What reading nvidia-smi output gave.
#[derive(Debug, Default, Clone)]
pub struct SmiParse {
    /// Sorted by index.
    pub gpus: Vec<SmiGpu>,
    /// Each output read, in words (`load :: nvidia-smi (default table): nvidia-smi default table (1 GPU, 3
    /// processes)`), prefixed with its capture section's title when it has one.
    pub read: Vec<String>,
    /// Capture sections that hold nothing read here, by title, with why.
    pub skipped: Vec<String>,
    /// The first lines inside recognised blocks that could not be used.
    pub malformed: Vec<Malformed>,
    /// All of them.
    pub malformed_lines: usize,
}

/// One GPU and everything nvidia-smi said about it.
#[derive(Debug, Default, Clone)]
pub struct SmiGpu {
    pub index: u32,
    /// The fullest name given (tables cut names to `NVIDIA GeForce RTX 2080 ...`).
    pub name: Option<String>,
    /// Normalised to nvidia-smi's `00000000:0C:00.0`.
    pub bus_id: Option<String>,
    pub uuid: Option<String>,
    /// In the order read.
    pub samples: Vec<MemorySample>,
    /// Once per pid, in the order first seen.
    pub processes: Vec<GpuProcess>,
    /// Once per (GPU instance, compute instance, MIG device), in the order first seen; the largest use seen.
    pub mig: Vec<MigInstance>,
}

/// True when the text holds at least one nvidia-smi output this module reads.
pub fn sniff(text: &str) -> bool {
    !parse(text, 0, None).read.is_empty()
}

/// Reads every nvidia-smi output in `text`. `input` is the index to store in `MemorySample::input`; `columns` is
/// the user's `--columns` list for headerless `--query-gpu`/`--query-compute-apps` CSV.
pub fn parse(text: &str, input: usize, columns: Option<&[String]>) -> SmiParse {
    let all: Vec<Line> = lines(text).collect();
    let mut b = Builder { input, columns, gpus: Vec::new(), malformed: Vec::new(), malformed_lines: 0 };
    let (mut read, mut skipped) = (Vec::new(), Vec::new());
    for sec in sections(&all) {
        let body = &all[sec.body.clone()];
        let mut out = ScanOut::default();
        b.scan(body, sec.command.as_deref(), &mut out);
        match sec.title {
            None => read.extend(out.read),
            Some(title) if out.read.is_empty() => {
                let why = if body.iter().all(|(_, l)| strip(l).is_empty()) {
                    "empty".to_string()
                } else {
                    out.unread.into_iter().next().unwrap_or_else(|| "no nvidia-smi output read here".to_string())
                };
                skipped.push(format!("{title}: {why}"));
            }
            Some(title) => read.extend(out.read.into_iter().map(|d| format!("{title}: {d}"))),
        }
    }
    let mut gpus: Vec<SmiGpu> = b.gpus.into_iter().map(|a| a.gpu).collect();
    gpus.sort_by_key(|g| g.index);
    SmiParse { gpus, read, skipped, malformed: b.malformed, malformed_lines: b.malformed_lines }
}

type Line = (usize, String);

#[derive(Default)]
struct ScanOut {
    read: Vec<String>,
    /// nvidia-smi output recognised but not read (CSV without memory columns, columns that could not be told).
    unread: Vec<String>,
}

// ---------------------------------------------------------------------------------------------------------------
// Capture sections

struct Section {
    title: Option<String>,
    command: Option<String>,
    body: std::ops::Range<usize>,
}

fn is_rule(s: &str) -> bool {
    let t = strip(s);
    t.len() >= 20 && t.bytes().all(|b| b == b'#')
}

fn is_comment(s: &str) -> bool {
    s.starts_with('#') && !is_rule(s)
}

/// A capture's sections: a `####` rule, `# title` and `# $ command` lines, an optional closing rule, then the
/// body up to the next such header. Text without headers is one untitled section.
fn sections(all: &[Line]) -> Vec<Section> {
    let mut out = Vec::new();
    let (mut title, mut command, mut start) = (None, None, 0);
    let mut i = 0;
    while i < all.len() {
        if !(is_rule(&all[i].1) && all.get(i + 1).is_some_and(|(_, l)| is_comment(l))) {
            i += 1;
            continue;
        }
        out.push(Section { title: title.take(), command: command.take(), body: start..i });
        let mut heads = Vec::new();
        let mut j = i + 1;
        while let Some((_, l)) = all.get(j).filter(|(_, l)| is_comment(l)) {
            heads.push(l.trim_start_matches('#').trim().to_string());
            j += 1;
        }
        if all.get(j).is_some_and(|(_, l)| is_rule(l)) {
            j += 1;
        }
        command = heads.iter().find_map(|h| h.strip_prefix("$ ").map(|c| c.trim().to_string()));
        title = Some(
            heads
                .iter()
                .find(|h| !h.is_empty() && !h.starts_with("$ "))
                .cloned()
                .unwrap_or_else(|| format!("section at line {}", all[i].0)),
        );
        start = j;
        i = j;
    }
    out.push(Section { title, command, body: start..all.len() });
    out
}

// ---------------------------------------------------------------------------------------------------------------
// The GPUs being built

struct GpuAcc {
    gpu: SmiGpu,
    /// The index was given by the output (not assigned by order).
    explicit: bool,
    /// Per process: how complete its name's source is (3 `-q`/compute-apps, 2 table, 1 pmon).
    ranks: Vec<u8>,
    /// Per process: whether its kind came from the output.
    kinds: Vec<bool>,
}

/// How an output names a GPU.
#[derive(Default)]
struct Ident {
    index: Option<u32>,
    /// Position in a listing without indices (`-q`), used when nothing else matches.
    ordinal: Option<u32>,
    bus: Option<String>,
    uuid: Option<String>,
    name: Option<String>,
}

struct Builder<'a> {
    input: usize,
    columns: Option<&'a [String]>,
    gpus: Vec<GpuAcc>,
    malformed: Vec<Malformed>,
    malformed_lines: usize,
}

impl Builder<'_> {
    fn bad(&mut self, line: usize, expected: impl Into<String>, found: &str) {
        self.malformed_lines += 1;
        if self.malformed.len() < KEEP_MALFORMED {
            let found = found.trim().chars().take(200).collect();
            self.malformed.push(Malformed { line, expected: expected.into(), found });
        }
    }

    /// The GPU an output names, created when new.
    fn resolve(&mut self, id: Ident) -> usize {
        let fits = |g: &GpuAcc| id.bus.is_none() || g.gpu.bus_id.is_none() || g.gpu.bus_id == id.bus;
        let mut pos = id.bus.as_ref().and_then(|b| self.gpus.iter().position(|g| g.gpu.bus_id.as_ref() == Some(b)));
        if pos.is_none() {
            if let Some(u) = &id.uuid {
                pos = self.gpus.iter().position(|g| g.gpu.uuid.as_ref() == Some(u) && fits(g));
            }
        }
        if let Some(ix) = id.index {
            match pos {
                Some(p) => {
                    let free = !self.gpus.iter().any(|g| g.gpu.index == ix);
                    if self.gpus[p].gpu.index != ix && !self.gpus[p].explicit && free {
                        self.gpus[p].gpu.index = ix;
                    }
                }
                None => pos = self.gpus.iter().position(|g| g.gpu.index == ix && fits(g)),
            }
        } else if let (None, Some(o)) = (pos, id.ordinal) {
            pos = self.gpus.iter().position(|g| g.gpu.index == o && fits(g));
        }
        let pos = pos.unwrap_or_else(|| {
            let want = id.index.or(id.ordinal).filter(|&i| !self.gpus.iter().any(|g| g.gpu.index == i));
            let next = self.gpus.iter().map(|g| g.gpu.index.saturating_add(1)).max().unwrap_or(0);
            let gpu = SmiGpu { index: want.unwrap_or(next), ..SmiGpu::default() };
            self.gpus.push(GpuAcc { gpu, explicit: false, ranks: Vec::new(), kinds: Vec::new() });
            self.gpus.len() - 1
        });
        let g = &mut self.gpus[pos];
        if id.index == Some(g.gpu.index) {
            g.explicit = true;
        }
        if g.gpu.bus_id.is_none() {
            g.gpu.bus_id = id.bus;
        }
        if g.gpu.uuid.is_none() {
            g.gpu.uuid = id.uuid;
        }
        if let Some(n) = id.name.filter(|n| !n.is_empty()) {
            if g.gpu.name.as_ref().is_none_or(|old| old.ends_with("...") && !n.ends_with("...")) {
                g.gpu.name = Some(n);
            }
        }
        pos
    }

    fn sample(&self, stamp: Option<Stamp>, line: usize) -> MemorySample {
        MemorySample {
            stamp,
            time_us: None,
            used: None,
            total: None,
            free: None,
            driver_reserved: None,
            input: self.input,
            line,
        }
    }

    fn add_process(&mut self, pos: usize, mut p: GpuProcess, rank: u8) {
        let kind_known = !p.kind.is_empty();
        if !kind_known {
            p.kind = "C".to_string();
        }
        let g = &mut self.gpus[pos];
        let Some(k) = g.gpu.processes.iter().position(|q| q.pid == p.pid) else {
            g.gpu.processes.push(p);
            g.ranks.push(rank);
            g.kinds.push(kind_known);
            return;
        };
        let q = &mut g.gpu.processes[k];
        q.used_bytes = q.used_bytes.max(p.used_bytes);
        if q.mig.is_none() {
            q.mig = p.mig;
        }
        if !p.name.is_empty() && (rank > g.ranks[k] || q.name.is_empty()) {
            q.name = p.name;
            g.ranks[k] = rank;
        }
        if kind_known && !g.kinds[k] {
            q.kind = p.kind;
            g.kinds[k] = true;
        }
    }

    /// (GPU instance, compute instance, MIG device, used, total bytes).
    fn add_mig(&mut self, pos: usize, (gi, ci, dev, used, total): (u32, u32, u32, u64, u64)) {
        let list = &mut self.gpus[pos].gpu.mig;
        match list.iter_mut().find(|x| (x.gpu_instance, x.compute_instance, x.mig_device) == (gi, ci, dev)) {
            Some(x) => {
                x.used_bytes = x.used_bytes.max(used);
                x.total_bytes = total;
            }
            None => list.push(MigInstance {
                gpu_instance: gi,
                compute_instance: ci,
                mig_device: dev,
                used_bytes: used,
                total_bytes: total,
            }),
        }
    }

    // -----------------------------------------------------------------------------------------------------------
    // The scanner: finds each block in a section and hands it to its reader.

    fn scan(&mut self, body: &[Line], command: Option<&str>, out: &mut ScanOut) {
        let mut cmd_cols = command.and_then(command_columns);
        let mut ctime: Option<(usize, Stamp)> = None;
        let mut i = 0;
        while i < body.len() {
            let s = strip(&body[i].1);
            if s.is_empty() {
                i += 1;
                continue;
            }
            if let Some(start) = block_start(body, i) {
                i = match start {
                    Start::Table => {
                        let stamp = ctime.filter(|(at, _)| at + 3 >= i).map(|(_, st)| st);
                        self.table(body, i, stamp, out)
                    }
                    Start::Query => self.query(body, i, out),
                    Start::Monitor => self.monitor(body, i, out),
                    Start::Csv(cols) => {
                        let rows = collect_rows(body, i + 1, csv_accept(&cols));
                        self.csv(body, &rows, cols, "", out);
                        rows.next
                    }
                };
                continue;
            }
            let has = |b: u8| s.as_bytes().contains(&b);
            if has(b'=') && (s.contains("--query-gpu=") || s.contains("--query-compute-apps=")) {
                cmd_cols = command_columns(s);
            }
            if has(b',') {
                let n = s.split(',').count();
                let given = self
                    .columns
                    .filter(|c| c.len() == n)
                    .map(|c| (c.to_vec(), "columns from --columns"))
                    .or_else(|| cmd_cols.clone().filter(|c| c.len() == n).map(|c| (c, "columns from the command")));
                if given.is_some() || looks_like_smi_row(s) {
                    i = self.headerless(body, i, given, out);
                    continue;
                }
            }
            if let Some(st) = ctime_line(s) {
                ctime = Some((i, st));
            }
            i += 1;
        }
    }

    // -----------------------------------------------------------------------------------------------------------
    // Default table

    fn table(&mut self, body: &[Line], start: usize, stamp: Option<Stamp>, out: &mut ScanOut) -> usize {
        #[derive(Clone, Copy, PartialEq)]
        enum Part {
            Head,
            Gpus,
            MigHead,
            Migs,
            ProcHead,
            Procs,
        }
        let mut part = Part::Head;
        let (mut gpus, mut procs, mut migs) = (0usize, 0usize, 0usize);
        // The GPU row waiting for its Memory-Usage row: (position, line, seen).
        let mut pending: Option<(usize, usize, bool)> = None;
        let mut j = start;
        while j < body.len() {
            let (no, s) = (body[j].0, strip(&body[j].1));
            let new_table = j > start && s.starts_with('|') && s.contains("NVIDIA-SMI ");
            if new_table || !(s.is_empty() || s.starts_with('|') || s.starts_with('+')) {
                break;
            }
            j += 1;
            let first = s.strip_prefix('|').and_then(|r| r.split('|').next()).map_or("", strip);
            // Rules: `+---+`, `|---+---|` (≤ 570), and `|===|` under each box's header.
            if s.chars().all(|c| matches!(c, '|' | '+' | '-' | '=' | ' ')) {
                if s.contains('=') {
                    part = match part {
                        Part::Head => Part::Gpus,
                        Part::MigHead => Part::Migs,
                        Part::ProcHead => Part::Procs,
                        p => p,
                    };
                }
                continue;
            }
            if first.starts_with("MIG devices:") {
                part = Part::MigHead;
                continue;
            }
            if first.starts_with("Processes:") {
                part = Part::ProcHead;
                continue;
            }
            if first.is_empty() {
                continue;
            }
            match part {
                Part::Head | Part::MigHead | Part::ProcHead => {}
                Part::Gpus => {
                    if let Some(c) = GPU_ROW.captures(s) {
                        if let Some((_, line, false)) = pending {
                            self.bad(line, "the GPU's Memory-Usage row (`<used>MiB / <total>MiB`)", "another GPU row");
                        }
                        let Ok(index) = c[1].parse::<u32>() else {
                            self.bad(no, "a GPU index", s);
                            continue;
                        };
                        let name = Some(c[2].trim().to_string());
                        let pos =
                            self.resolve(Ident { index: Some(index), bus: norm_bus(&c[4]), name, ..Ident::default() });
                        pending = Some((pos, no, false));
                        gpus += 1;
                    } else if let Some(c) = MEM_CELL.captures(s) {
                        match &mut pending {
                            Some((pos, _, seen @ false)) => {
                                *seen = true;
                                let mut m = self.sample(stamp, no);
                                m.used = parse_size(&c[1], "MiB");
                                m.total = parse_size(&c[2], "MiB");
                                self.gpus[*pos].gpu.samples.push(m);
                            }
                            _ => self.bad(no, "a GPU row before this Memory-Usage row", s),
                        }
                    } else {
                        self.bad(
                            no,
                            "a GPU row (`| <index>  <name>  <persistence> | <bus id> …`) or its Memory-Usage row",
                            s,
                        );
                    }
                }
                Part::Migs => match MIG_ROW.captures(s) {
                    Some(c) => {
                        let n = |i: usize| c[i].parse::<u32>().ok();
                        let (Some(gpu), Some(gi), Some(ci), Some(dev)) = (n(1), n(2), n(3), n(4)) else {
                            self.bad(no, "MIG device numbers", s);
                            continue;
                        };
                        let (Some(used), Some(total)) = (parse_size(&c[5], "MiB"), parse_size(&c[6], "MiB")) else {
                            self.bad(no, "MIG memory in MiB", s);
                            continue;
                        };
                        let pos = self.resolve(Ident { index: Some(gpu), ..Ident::default() });
                        self.add_mig(pos, (gi, ci, dev, used, total));
                        migs += 1;
                    }
                    None => self.bad(no, "a MIG device row (`| GPU GI CI MIG | <used>MiB / <total>MiB …`)", s),
                },
                Part::Procs => {
                    if s.contains("No running processes found") {
                        continue;
                    }
                    match self.table_process(s) {
                        Some(()) => procs += 1,
                        None => self.bad(no, "a process row (`| GPU [GI CI] PID Type Process-name Usage |`)", s),
                    }
                }
            }
        }
        if let Some((_, line, false)) = pending {
            self.bad(line, "the GPU's Memory-Usage row (`<used>MiB / <total>MiB`)", "end of table");
        }
        let mig_part = if migs > 0 { format!(", {}", count(migs, "MIG device")) } else { String::new() };
        out.read.push(format!(
            "nvidia-smi default table ({}, {}{mig_part})",
            count(gpus, "GPU"),
            count(procs, "process")
        ));
        j
    }

    fn table_process(&mut self, s: &str) -> Option<()> {
        let c = PROC_ROW.captures(s)?;
        let gpu = c[1].parse::<u32>().ok()?;
        let pid = c[4].parse::<u32>().ok()?;
        let id = |m: Option<regex::Match>| m.and_then(|m| m.as_str().parse::<u32>().ok());
        let mig = id(c.get(2)).zip(id(c.get(3)));
        let used_bytes = c[7].strip_suffix("MiB").and_then(|n| parse_size(n, "MiB"));
        let p = GpuProcess { pid, name: c[6].trim().to_string(), kind: c[5].to_string(), used_bytes, mig };
        let pos = self.resolve(Ident { index: Some(gpu), ..Ident::default() });
        self.add_process(pos, p, 2);
        Some(())
    }

    // -----------------------------------------------------------------------------------------------------------
    // -q

    fn query(&mut self, body: &[Line], start: usize, out: &mut ScanOut) -> usize {
        #[derive(Default)]
        struct QMig {
            index: Option<u32>,
            gi: Option<u32>,
            ci: Option<u32>,
            used: Option<u64>,
            total: Option<u64>,
        }
        #[derive(Default)]
        struct QGpu {
            bus: Option<String>,
            uuid: Option<String>,
            name: Option<String>,
            /// Total, reserved, used, free.
            fb: [Option<u64>; 4],
            fb_line: usize,
            migs: Vec<QMig>,
            procs: Vec<GpuProcess>,
            gi: Option<u32>,
            ci: Option<u32>,
        }
        let mut stamp = None;
        let mut gpus: Vec<QGpu> = Vec::new();
        let mut stack: Vec<(usize, String)> = Vec::new();
        let mut j = start;
        while j < body.len() {
            let (no, s) = (body[j].0, strip(&body[j].1));
            if s.is_empty() {
                j += 1;
                continue;
            }
            let indent = indent_of(&body[j].1);
            if indent == 0 {
                if s.starts_with("==") && s.contains("NVSMI LOG") {
                    if j > start {
                        break;
                    }
                } else if let Some(bus) = gpu_header(s) {
                    gpus.push(QGpu { bus: Some(bus), ..QGpu::default() });
                } else if let Some((k, v)) = key_value(s) {
                    if k == "Timestamp" {
                        stamp = find_stamp(v).map(|(st, _, _)| st);
                    }
                } else {
                    break;
                }
                stack.clear();
                j += 1;
                continue;
            }
            j += 1;
            let Some(g) = gpus.last_mut() else { continue };
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            let Some((key, v)) = key_value(s) else {
                if s == "MIG Device" {
                    g.migs.push(QMig::default());
                }
                if s == "FB Memory Usage" && stack.is_empty() {
                    g.fb_line = no;
                }
                stack.push((indent, s.to_string()));
                continue;
            };
            let in_procs = stack.iter().any(|(_, h)| h == "Processes");
            let in_mig = stack.iter().any(|(_, h)| h == "MIG Device");
            let last = stack.last().map_or("", |(_, h)| h.as_str());
            if in_procs {
                match key {
                    "GPU instance ID" => g.gi = v.parse().ok(),
                    "Compute instance ID" => g.ci = v.parse().ok(),
                    "Process ID" => match v.parse::<u32>() {
                        Ok(pid) => {
                            let mig = g.gi.zip(g.ci);
                            g.procs.push(GpuProcess {
                                pid,
                                name: String::new(),
                                kind: String::new(),
                                used_bytes: None,
                                mig,
                            });
                            (g.gi, g.ci) = (None, None);
                        }
                        Err(_) => self.bad(no, "a process id", s),
                    },
                    "Type" | "Name" | "Used GPU Memory" => {
                        let Some(p) = g.procs.last_mut() else {
                            self.bad(no, "`Process ID` before the process's details", s);
                            continue;
                        };
                        match key {
                            "Type" => p.kind = v.to_string(),
                            "Name" => p.name = v.to_string(),
                            _ => match mem_value(v, None) {
                                Ok(u) => p.used_bytes = u,
                                Err(()) => self.bad(no, "memory in MiB or N/A", s),
                            },
                        }
                    }
                    _ => {}
                }
            } else if last.ends_with("FB Memory Usage") {
                let slot = match key {
                    "Total" => 0,
                    "Reserved" => 1,
                    "Used" => 2,
                    "Free" => 3,
                    _ => continue,
                };
                let val = match mem_value(v, None) {
                    Ok(x) => x,
                    Err(()) => {
                        self.bad(no, "memory in MiB or N/A", s);
                        None
                    }
                };
                match (in_mig, g.migs.last_mut()) {
                    (true, Some(m)) if slot == 0 => m.total = val,
                    (true, Some(m)) if slot == 2 => m.used = val,
                    (true, _) => {}
                    (false, _) if stack.len() == 1 => g.fb[slot] = val,
                    (false, _) => {}
                }
            } else if in_mig && last == "MIG Device" {
                let m = g.migs.last_mut();
                match (key, m) {
                    ("Index", Some(m)) => m.index = v.parse().ok(),
                    ("GPU Instance ID", Some(m)) => m.gi = v.parse().ok(),
                    ("Compute Instance ID", Some(m)) => m.ci = v.parse().ok(),
                    _ => {}
                }
            } else if stack.is_empty() {
                match key {
                    "Product Name" => g.name = Some(v.to_string()),
                    "GPU UUID" => g.uuid = Some(v.to_string()).filter(|u| u.starts_with("GPU-")),
                    _ => {}
                }
            }
        }
        let (mut procs, mut migs) = (0, 0);
        let n_gpus = gpus.len();
        for (k, g) in gpus.into_iter().enumerate() {
            let ordinal = u32::try_from(k).ok();
            let pos = self.resolve(Ident { ordinal, bus: g.bus, uuid: g.uuid, name: g.name, index: None });
            if g.fb.iter().any(Option::is_some) {
                let mut m = self.sample(stamp, g.fb_line);
                (m.total, m.driver_reserved, m.used, m.free) = (g.fb[0], g.fb[1], g.fb[2], g.fb[3]);
                self.gpus[pos].gpu.samples.push(m);
            }
            for m in g.migs {
                if let (Some(gi), Some(ci), Some(used), Some(total)) = (m.gi, m.ci, m.used, m.total) {
                    let dev = m.index.unwrap_or(migs as u32);
                    self.add_mig(pos, (gi, ci, dev, used, total));
                    migs += 1;
                }
            }
            for p in g.procs {
                self.add_process(pos, p, 3);
                procs += 1;
            }
        }
        let mig_part = if migs > 0 { format!(", {}", count(migs, "MIG device")) } else { String::new() };
        out.read.push(format!("nvidia-smi -q ({}, {}{mig_part})", count(n_gpus, "GPU"), count(procs, "process")));
        j
    }

    // -----------------------------------------------------------------------------------------------------------
    // dmon / pmon

    fn monitor(&mut self, body: &[Line], start: usize, out: &mut ScanOut) -> usize {
        let names = tokens(&body[start].1);
        let units_at = (start + 1..body.len()).find(|&k| !strip(&body[k].1).is_empty()).unwrap_or(start);
        let units = tokens(&body[units_at].1);
        let col = |n: &str| names.iter().position(|x| x == n);
        let (gpu_c, pid_c, fb_c) = (col("gpu"), col("pid"), col("fb"));
        let (Some(gpu_c), pmon) = (gpu_c, pid_c.is_some()) else { return start + 1 };
        let (mut rows, mut samples, mut pids) = (0usize, 0usize, BTreeSet::new());
        let mut pending: Vec<usize> = Vec::new();
        let mut last = units_at;
        let mut j = units_at + 1;
        while j < body.len() {
            let s = strip(&body[j].1);
            if s.is_empty() {
                j += 1;
                continue;
            }
            if s.starts_with('#') {
                let t = tokens(s);
                if t == names || t == units {
                    last = j;
                    j += 1;
                    continue;
                }
            }
            if block_start(body, j).is_some() {
                break;
            }
            let toks: Vec<&str> = s.split_whitespace().collect();
            if !toks[0].bytes().all(|b| b.is_ascii_digit()) {
                pending.push(j);
                if pending.len() > MAX_GAP {
                    break;
                }
                j += 1;
                continue;
            }
            for k in std::mem::take(&mut pending) {
                self.bad(body[k].0, if pmon { "a pmon row" } else { "a dmon row" }, &body[k].1);
            }
            last = j;
            j += 1;
            if toks.len() < names.len() {
                self.bad(body[last].0, format!("{} columns ({})", names.len(), names.join(" ")), s);
                continue;
            }
            let Ok(gpu) = toks[gpu_c].parse::<u32>() else {
                self.bad(body[last].0, "a GPU index", s);
                continue;
            };
            let stamp = monitor_stamp(&names, &toks);
            let fb = match fb_c.map(|c| toks[c]) {
                None | Some("-") => Ok(None),
                Some(v) => parse_size(v, "MiB").map(Some).ok_or(()),
            };
            let Ok(fb) = fb else {
                self.bad(body[last].0, "fb in MiB", s);
                continue;
            };
            rows += 1;
            let pos_of = |b: &mut Self| b.resolve(Ident { index: Some(gpu), ..Ident::default() });
            if let Some(pc) = pid_c {
                if toks[pc] == "-" {
                    pos_of(self);
                    continue;
                }
                let Ok(pid) = toks[pc].parse::<u32>() else {
                    self.bad(body[last].0, "a process id or -", s);
                    continue;
                };
                let kind = col("type").map(|c| toks[c]).filter(|t| *t != "-").unwrap_or("").to_string();
                let name = col("command").map(|c| toks[c..].join(" ")).filter(|n| n != "-").unwrap_or_default();
                let pos = pos_of(self);
                self.add_process(pos, GpuProcess { pid, name, kind, used_bytes: fb, mig: None }, 1);
                pids.insert(pid);
            } else if fb.is_some() {
                let pos = pos_of(self);
                let mut m = self.sample(stamp, body[last].0);
                m.used = fb;
                self.gpus[pos].gpu.samples.push(m);
                samples += 1;
            } else {
                pos_of(self);
            }
        }
        out.read.push(if pmon {
            format!("nvidia-smi pmon ({}, {})", count(rows, "row"), count(pids.len(), "process"))
        } else if fb_c.is_some() {
            format!("nvidia-smi dmon ({}, {})", count(rows, "row"), count(samples, "sample"))
        } else {
            format!("nvidia-smi dmon ({}; no fb column, so no memory figures)", count(rows, "row"))
        });
        last + 1
    }

    // -----------------------------------------------------------------------------------------------------------
    // CSV

    /// Rows without a header: columns from the caller or the command, else inferred.
    fn headerless(
        &mut self,
        body: &[Line],
        start: usize,
        given: Option<(Vec<String>, &str)>,
        out: &mut ScanOut,
    ) -> usize {
        let n = body[start].1.split(',').count();
        let rows = collect_rows(body, start, |s: &str| s.split(',').count() == n);
        let (cols, how) = match given {
            Some((names, how)) => (names.iter().map(|c| Col::new(c)).collect(), how.to_string()),
            None => {
                let fields: Vec<Vec<&str>> =
                    rows.rows.iter().map(|&k| body[k].1.split(',').map(strip).collect()).collect();
                match infer(&fields) {
                    Ok((cols, labels)) => (cols, format!("no header; columns inferred: {labels}")),
                    Err(why) => {
                        let first = rows.rows.first().map_or(body[start].0, |&k| body[k].0);
                        self.bad(
                            first,
                            "a --query-gpu row whose columns can be told (give the column list)",
                            &format!("{} headerless rows: {why}", rows.rows.len()),
                        );
                        self.malformed_lines += (rows.rows.len() + rows.junk.len()).saturating_sub(1);
                        out.unread.push(format!("headerless CSV whose columns could not be told: {why}"));
                        return rows.next.max(start + 1);
                    }
                }
            }
        };
        self.csv(body, &rows, cols, &how, out);
        rows.next.max(start + 1)
    }

    fn csv(&mut self, body: &[Line], rows: &Rows, mut cols: Vec<Col>, how: &str, out: &mut ScanOut) {
        let kind = csv_kind(&mut cols);
        let how = if how.is_empty() { String::new() } else { format!("; {how}") };
        // Rows and the lines between them, in file order.
        let mut items: Vec<(usize, bool)> = rows.rows.iter().map(|&k| (k, true)).collect();
        items.extend(rows.junk.iter().map(|&k| (k, false)));
        items.sort_unstable();
        let mut n = 0;
        for (k, is_row) in items {
            let (no, line) = (body[k].0, body[k].1.as_str());
            let res = match (is_row, &kind) {
                (_, CsvKind::Other) => Ok(()),
                (false, _) => Err(format!("a CSV row of {} fields", cols.len())),
                (true, CsvKind::Gpu) => self.gpu_row(&cols, line, no),
                (true, CsvKind::Apps) => self.app_row(&cols, line),
            };
            match res {
                Ok(()) => n += usize::from(is_row),
                Err(exp) => self.bad(no, exp, line),
            }
        }
        match kind {
            CsvKind::Gpu => out.read.push(format!("nvidia-smi --query-gpu CSV ({}{how})", count(n, "row"))),
            CsvKind::Apps => {
                out.read.push(format!("nvidia-smi --query-compute-apps CSV ({}{how})", count(n, "process")))
            }
            CsvKind::Other => {
                let names: Vec<&str> = cols.iter().take(4).map(|c| c.label.as_str()).collect();
                out.unread.push(format!("nvidia-smi CSV without memory or process columns ({}, …)", names.join(", ")));
            }
        }
    }

    fn gpu_row(&mut self, cols: &[Col], line: &str, no: usize) -> Result<(), String> {
        let fields: Vec<&str> = line.split(',').map(strip).collect();
        if fields.len() != cols.len() {
            return Err(format!("{} fields", cols.len()));
        }
        let mut id = Ident::default();
        let mut m = self.sample(None, no);
        let mut any = false;
        for (c, v) in cols.iter().zip(&fields) {
            match c.role {
                Role::Stamp if !not_available(v) => {
                    m.stamp = Some(find_stamp(v).ok_or("a timestamp (YYYY/MM/DD HH:MM:SS.mmm)")?.0);
                }
                Role::Index => id.index = Some(v.parse().map_err(|_| "a GPU index")?),
                Role::Name if !not_available(v) => id.name = Some(v.to_string()),
                Role::Bus => id.bus = norm_bus(v),
                Role::Uuid if v.starts_with("GPU-") => id.uuid = Some(v.to_string()),
                Role::Used | Role::Total | Role::Free | Role::Reserved => {
                    let x = mem_value(v, c.unit.as_deref()).map_err(|()| format!("{} in MiB or [N/A]", c.label))?;
                    any |= x.is_some();
                    match c.role {
                        Role::Used => m.used = x,
                        Role::Total => m.total = x,
                        Role::Free => m.free = x,
                        _ => m.driver_reserved = x,
                    }
                }
                _ => {}
            }
        }
        if id.index.is_none() && id.bus.is_none() && id.uuid.is_none() {
            id.ordinal = Some(0);
        }
        let pos = self.resolve(id);
        if any {
            self.gpus[pos].gpu.samples.push(m);
        }
        Ok(())
    }

    fn app_row(&mut self, cols: &[Col], line: &str) -> Result<(), String> {
        let mut fields: Vec<&str> = line.split(',').collect();
        // Commas inside a process name: give the extra fields back to it.
        let extra = fields.len().saturating_sub(cols.len());
        let joined;
        if extra > 0 {
            let at = cols.iter().position(|c| c.role == Role::ProcName).ok_or(format!("{} fields", cols.len()))?;
            joined = fields[at..=at + extra].join(",");
            fields.splice(at..=at + extra, [joined.as_str()]);
        }
        if fields.len() != cols.len() {
            return Err(format!("{} fields", cols.len()));
        }
        let mut id = Ident::default();
        let mut p = GpuProcess { pid: 0, name: String::new(), kind: String::new(), used_bytes: None, mig: None };
        let mut pid = None;
        for (c, v) in cols.iter().zip(fields.iter().map(|f| strip(f))) {
            match c.role {
                Role::Pid => pid = Some(v.parse::<u32>().map_err(|_| "a process id")?),
                Role::ProcName => p.name = v.to_string(),
                Role::ProcUsed => {
                    p.used_bytes = mem_value(v, c.unit.as_deref()).map_err(|()| format!("{} in MiB", c.label))?
                }
                Role::Bus => id.bus = norm_bus(v),
                Role::Uuid if v.starts_with("GPU-") => id.uuid = Some(v.to_string()),
                Role::Name if !not_available(v) => id.name = Some(v.to_string()),
                _ => {}
            }
        }
        p.pid = pid.ok_or("a process id")?;
        if id.bus.is_none() && id.uuid.is_none() {
            id.ordinal = Some(0);
        }
        let pos = self.resolve(id);
        self.add_process(pos, p, 3);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Block detection

enum Start {
    Table,
    Query,
    Monitor,
    Csv(Vec<Col>),
}

fn block_start(body: &[Line], i: usize) -> Option<Start> {
    let raw = &body[i].1;
    let s = strip(raw);
    if s.starts_with('|') && s.contains("NVIDIA-SMI ") {
        return Some(Start::Table);
    }
    if s.starts_with("==") && s.contains("NVSMI LOG") {
        return Some(Start::Query);
    }
    if !raw.starts_with(char::is_whitespace) && gpu_header(s).is_some() {
        let next = body.get(i + 1).map_or("", |(_, l)| l.as_str());
        if next.starts_with("    ") {
            return Some(Start::Query);
        }
    }
    if s.starts_with('#') {
        let t = tokens(s);
        if t.iter().any(|x| x == "gpu") {
            let units = body[i + 1..].iter().map(|(_, l)| strip(l)).find(|l| !l.is_empty()).unwrap_or("");
            if units.starts_with('#') && tokens(units).iter().any(|x| x == "idx") {
                return Some(Start::Monitor);
            }
        }
        return None;
    }
    csv_header(s).map(Start::Csv)
}

/// `s` without ASCII blanks at either end. nvidia-smi pads its lines to 80–90 columns and every line passes
/// through here several times; `str::trim` decodes each char, which a debug build pays for dearly.
fn strip(s: &str) -> &str {
    let b = s.as_bytes();
    let (mut a, mut e) = (0, b.len());
    while a < e && b[a].is_ascii_whitespace() {
        a += 1;
    }
    while e > a && b[e - 1].is_ascii_whitespace() {
        e -= 1;
    }
    &s[a..e]
}

/// How many blanks a line starts with.
fn indent_of(s: &str) -> usize {
    let b = s.as_bytes();
    let mut a = 0;
    while a < b.len() && b[a].is_ascii_whitespace() {
        a += 1;
    }
    a
}

/// `GPU 00000000:00:09.0` → the bus id.
fn gpu_header(s: &str) -> Option<String> {
    norm_bus(s.strip_prefix("GPU ")?)
}

/// `Key   : value` (values may hold colons: bus ids, times).
fn key_value(s: &str) -> Option<(&str, &str)> {
    let (k, v) = s.split_once(" : ").or_else(|| s.strip_suffix(" :").map(|k| (k, "")))?;
    Some((strip(k), strip(v)))
}

/// dmon/pmon header words, lower-cased, without the `#`.
fn tokens(s: &str) -> Vec<String> {
    strip(s).trim_start_matches('#').split_whitespace().map(str::to_ascii_lowercase).collect()
}

/// The time of a dmon/pmon row written with `-o DT` (`20240501  12:00:00`).
fn monitor_stamp(names: &[String], toks: &[&str]) -> Option<Stamp> {
    let date = toks.get(names.iter().position(|n| n == "date")?)?;
    let time = toks.get(names.iter().position(|n| n == "time")?)?;
    if date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let num = |s: &str| s.parse::<u32>().ok();
    let (y, mo, d) = (num(&date[..4])?, num(&date[4..6])?, num(&date[6..])?);
    let mut hms = time.split(':').map(num);
    let (h, mi, s) = (hms.next()??, hms.next()??, hms.next()??);
    wall_us(i64::from(y), mo, d, h, mi, s, 0).map(Stamp::Local)
}

/// A table's first line, `Tue Jul 14 08:12:53 2026`.
fn ctime_line(s: &str) -> Option<Stamp> {
    if s.len() > 40 || s.as_bytes().get(3) != Some(&b' ') {
        return None;
    }
    find_stamp(s).filter(|&(_, a, b)| a == 0 && b == s.len()).map(|(st, _, _)| st)
}

/// `00000000:0C:00.0` / `0000:0c:00.0` → `00000000:0C:00.0`.
fn norm_bus(s: &str) -> Option<String> {
    let mut parts = s.trim().split(':');
    let (d, b, df) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let (dev, func) = df.split_once('.')?;
    let hex = |x: &str, lo: usize, hi: usize| (lo..=hi).contains(&x.len()) && x.bytes().all(|c| c.is_ascii_hexdigit());
    if !(hex(d, 4, 8) && hex(b, 2, 2) && hex(dev, 2, 2) && hex(func, 1, 1)) {
        return None;
    }
    let domain = u32::from_str_radix(d, 16).ok()?;
    Some(format!("{domain:08X}:{}:{}.{}", b.to_ascii_uppercase(), dev.to_ascii_uppercase(), func))
}

/// nvidia-smi's `2026/07/14 08:12:53.353` at the start of a field.
fn smi_stamp(v: &str) -> bool {
    let b = strip(v).as_bytes();
    b.len() >= 19
        && b[..19].iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'/',
            10 => c == b' ',
            13 | 16 => c == b':',
            _ => c.is_ascii_digit(),
        })
}

/// A CSV line that can only be nvidia-smi's: it has its timestamp or a `N MiB` value.
fn looks_like_smi_row(s: &str) -> bool {
    let mut fields = s.split(',').map(strip);
    s.split(',').count() >= 2
        && fields.any(|f| smi_stamp(f) || f.strip_suffix(" MiB").is_some_and(|n| parse_decimal(n).is_some()))
}

/// The fields of a `--query-gpu=a,b,c … noheader` command line.
fn command_columns(s: &str) -> Option<Vec<String>> {
    if !s.contains("noheader") {
        return None;
    }
    let at = s.find("--query-gpu=").map(|p| p + 12).or_else(|| s.find("--query-compute-apps=").map(|p| p + 21))?;
    let list = s[at..].split_whitespace().next()?.trim_matches(|c| c == '"' || c == '\'');
    let cols: Vec<String> = list.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect();
    (!cols.is_empty()).then_some(cols)
}

// ---------------------------------------------------------------------------------------------------------------
// CSV columns and rows

#[derive(Clone, Copy, PartialEq, Debug)]
enum Role {
    Stamp,
    Index,
    Name,
    Bus,
    Uuid,
    Used,
    Total,
    Free,
    Reserved,
    Pid,
    ProcName,
    ProcUsed,
    Other,
}

#[derive(Clone, Debug)]
struct Col {
    role: Role,
    /// The unit in the header's brackets.
    unit: Option<String>,
    label: String,
    key: String,
}

impl Col {
    /// `memory.used [MiB]`, `memory.used[MiB]`, `"pid"`.
    fn new(field: &str) -> Col {
        let f = field.trim().trim_matches('"');
        let (name, unit) = match f.split_once('[') {
            Some((n, u)) => (n.trim(), Some(u.trim_end_matches(']').trim().to_string())),
            None => (f, None),
        };
        let key = name.to_ascii_lowercase();
        let norm = key.replace('_', ".");
        let role = match norm.as_str() {
            "timestamp" => Role::Stamp,
            "index" => Role::Index,
            "name" | "gpu.name" => Role::Name,
            "pci.bus.id" | "gpu.bus.id" | "bus.id" => Role::Bus,
            "uuid" | "gpu.uuid" => Role::Uuid,
            "memory.used" | "mem.used" | "gpu.memory.used" | "fb.memory.used" => Role::Used,
            "memory.total" | "mem.total" | "gpu.memory.total" | "fb.memory.total" => Role::Total,
            "memory.free" | "mem.free" | "gpu.memory.free" | "fb.memory.free" => Role::Free,
            "memory.reserved" | "mem.reserved" | "gpu.memory.reserved" | "fb.memory.reserved" => Role::Reserved,
            "pid" => Role::Pid,
            "process.name" => Role::ProcName,
            "used.gpu.memory" | "used.memory" => Role::ProcUsed,
            _ => Role::Other,
        };
        Col { role, unit: unit.filter(|u| !u.is_empty()), label: name.to_string(), key }
    }

    fn inferred(role: Role, label: &str) -> Col {
        Col { role, unit: None, label: label.to_string(), key: label.to_string() }
    }
}

/// A header row of nvidia-smi CSV (or one a script wrote for it).
fn csv_header(s: &str) -> Option<Vec<Col>> {
    let b = s.as_bytes();
    if !(b.contains(&b',') || b.contains(&b'[')) || !s.split(',').next().is_some_and(is_field_name) {
        return None;
    }
    let fields: Vec<&str> = s.split(',').collect();
    if !fields.iter().all(|f| is_field_name(f)) {
        return None;
    }
    let cols: Vec<Col> = fields.iter().map(|f| Col::new(f)).collect();
    let memory = |r: Role| matches!(r, Role::Used | Role::Total | Role::Free | Role::Reserved);
    if fields.len() == 1 {
        return memory(cols[0].role).then_some(cols);
    }
    let strong = cols.iter().any(|c| memory(c.role) || !matches!(c.role, Role::Name | Role::Other | Role::ProcName));
    strong.then_some(cols)
}

/// `memory.used`, `memory.used [MiB]`, `temperature[°C]`, `"pid"`.
fn is_field_name(f: &str) -> bool {
    let f = f.trim().trim_matches('"');
    let (name, unit) = match f.split_once('[') {
        Some((n, u)) => (n.trim_end(), Some(u)),
        None => (f, None),
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && unit.is_none_or(|u| u.ends_with(']') && !u[..u.len() - 1].contains(['[', ']']))
}

enum CsvKind {
    Gpu,
    Apps,
    Other,
}

fn csv_kind(cols: &mut [Col]) -> CsvKind {
    let has = |r: Role| cols.iter().any(|c| c.role == r);
    if has(Role::Pid) && (has(Role::ProcName) || has(Role::ProcUsed) || cols.iter().any(|c| c.key == "name")) {
        for c in cols.iter_mut().filter(|c| c.key == "name") {
            c.role = Role::ProcName;
        }
        CsvKind::Apps
    } else if has(Role::Used) || has(Role::Total) || has(Role::Free) || has(Role::Reserved) {
        CsvKind::Gpu
    } else {
        CsvKind::Other
    }
}

fn csv_accept(cols: &[Col]) -> impl Fn(&str) -> bool {
    let n = cols.len();
    let more = cols.iter().any(|c| c.role == Role::ProcName || c.key == "name");
    move |s: &str| {
        let k = s.split(',').count();
        k == n || (more && k > n)
    }
}

struct Rows {
    /// Positions of the rows.
    rows: Vec<usize>,
    /// Lines between rows that are not rows.
    junk: Vec<usize>,
    /// Where scanning goes on: after the last row.
    next: usize,
}

/// The rows of a block from `start`: lines `accept` takes, up to the next block or a long run of other lines.
fn collect_rows(body: &[Line], start: usize, accept: impl Fn(&str) -> bool) -> Rows {
    let (mut rows, mut junk, mut pending) = (Vec::new(), Vec::new(), Vec::new());
    let mut j = start;
    while j < body.len() {
        let s = body[j].1.trim();
        if !s.is_empty() {
            if block_start(body, j).is_some() {
                break;
            }
            if accept(s) {
                junk.append(&mut pending);
                rows.push(j);
            } else {
                pending.push(j);
                if pending.len() > MAX_GAP {
                    break;
                }
            }
        }
        j += 1;
    }
    let next = rows.last().map_or(start, |&r| r + 1);
    Rows { rows, junk, next }
}

/// `[N/A]`, `N/A`, `[Not Supported]`, `Not available in WDDM driver model`, `-`.
fn not_available(v: &str) -> bool {
    let v = v.trim();
    v.is_empty()
        || v == "-"
        || v.eq_ignore_ascii_case("n/a")
        || (v.starts_with('[') && v.ends_with(']'))
        || v.starts_with("Not ")
        || v.starts_with("Unknown")
        || v.starts_with("Insufficient")
}

/// `19818 MiB`, `19818` (the header's unit, else MiB), `[N/A]` → None.
fn mem_value(v: &str, unit: Option<&str>) -> Result<Option<u64>, ()> {
    let v = v.trim();
    if not_available(v) {
        return Ok(None);
    }
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',')).unwrap_or(v.len());
    let (num, rest) = v.split_at(split);
    let unit = match rest.trim() {
        "" => unit.unwrap_or("MiB"),
        u => u,
    };
    let unit = match unit {
        "MB" => "MiB",
        "GB" => "GiB",
        "KB" => "KiB",
        "TB" => "TiB",
        u => u,
    };
    parse_size(num, unit).map(Some).ok_or(())
}

/// A value in MiB, for inference: `1747`, `1747 MiB`.
fn mib_number(v: &str) -> Option<f64> {
    let v = v.trim();
    let n = v.strip_suffix("MiB").unwrap_or(v).trim();
    let (m, d) = parse_decimal(n)?;
    Some(m as f64 / 10f64.powi(d as i32))
}

/// Columns of headerless `--query-gpu` rows, with their labels in words; or why they cannot be told.
fn infer(rows: &[Vec<&str>]) -> Result<(Vec<Col>, String), String> {
    let n = rows.first().map_or(0, Vec::len);
    let all = |c: usize, f: &dyn Fn(&str) -> bool| rows.iter().all(|r| f(r[c]));
    let ts: Vec<bool> = (0..n).map(|c| all(c, &smi_stamp)).collect();
    let bus: Vec<bool> = (0..n).map(|c| all(c, &|v| norm_bus(v).is_some())).collect();
    let uuid: Vec<bool> = (0..n).map(|c| all(c, &|v| v.starts_with("GPU-") || v.starts_with("MIG-"))).collect();
    let with_mib: Vec<bool> = (0..n)
        .map(|c| {
            all(c, &|v| not_available(v) || (v.ends_with("MiB") && mib_number(v).is_some()))
                && rows.iter().any(|r| r[c].ends_with("MiB"))
        })
        .collect();
    // Per column, its values as numbers (None where N/A), when every value is one.
    let nums: Vec<Option<Vec<Option<f64>>>> = (0..n)
        .map(|c| {
            let vals: Option<Vec<Option<f64>>> = rows
                .iter()
                .map(|r| if not_available(r[c]) { Some(None) } else { mib_number(r[c]).map(Some) })
                .collect();
            vals.filter(|v| v.iter().any(Option::is_some))
        })
        .collect();
    let mut roles = vec![Role::Other; n];
    for c in 0..n {
        if ts[c] {
            roles[c] = Role::Stamp;
        } else if bus[c] {
            roles[c] = Role::Bus;
        } else if uuid[c] {
            roles[c] = Role::Uuid;
        }
    }
    // The index: the first column after the timestamp, small whole numbers 0..k.
    if let Some(c) = (0..n).find(|&c| !ts[c]) {
        let ints: Option<BTreeSet<u32>> =
            rows.iter().map(|r| r[c].parse::<u32>().ok().filter(|&x| x <= 63)).collect::<Option<_>>();
        if let Some(set) = ints {
            let dense = set.iter().enumerate().all(|(i, &x)| x as usize == i);
            if dense && !with_mib[c] && roles[c] == Role::Other {
                roles[c] = Role::Index;
            }
        }
    }
    if let Some(c) = (0..n).find(|&c| {
        roles[c] == Role::Other
            && nums[c].is_none()
            && rows.iter().all(|r| r[c].chars().any(|ch| ch.is_ascii_alphabetic()))
    }) {
        roles[c] = Role::Name;
    }
    let cand: Vec<usize> = if with_mib.iter().any(|&m| m) {
        (0..n).filter(|&c| with_mib[c]).collect()
    } else {
        (0..n).filter(|&c| roles[c] == Role::Other && nums[c].is_some()).collect()
    };
    let val = |c: usize, r: usize| nums[c].as_ref().and_then(|v| v[r]);
    let fits = |t: usize, u: usize, f: usize| {
        let mut seen = false;
        let ok = (0..rows.len()).all(|r| match (val(t, r), val(u, r), val(f, r)) {
            (Some(t), Some(u), Some(f)) => {
                seen = true;
                t > 0.0 && u + f <= t + 2.0 && t - u - f <= 0.06 * t
            }
            _ => true,
        });
        ok && seen
    };
    let mut triples = Vec::new();
    for &t in &cand {
        for &u in &cand {
            for &f in &cand {
                // Used and free are interchangeable in the sum; nvidia-smi lists used first, and so do scripts.
                if t != u && t != f && u < f && fits(t, u, f) {
                    triples.push((t, u, f));
                }
            }
        }
    }
    match (triples.as_slice(), cand.as_slice()) {
        ([(t, u, f)], _) => {
            roles[*t] = Role::Total;
            roles[*u] = Role::Used;
            roles[*f] = Role::Free;
        }
        ([], [only]) if with_mib[*only] => roles[*only] = Role::Used,
        ([], [a, b]) if with_mib[*a] => {
            let constant = |c: usize| (0..rows.len()).all(|r| val(c, r) == val(c, 0));
            let ge = |x: usize, y: usize| (0..rows.len()).all(|r| val(x, r) >= val(y, r));
            match (constant(*a) && ge(*a, *b), constant(*b) && ge(*b, *a)) {
                (true, false) => (roles[*a], roles[*b]) = (Role::Total, Role::Used),
                (false, true) => (roles[*a], roles[*b]) = (Role::Used, Role::Total),
                _ => return Err("two memory columns, and neither is a constant total".to_string()),
            }
        }
        ([], _) => return Err("no three number columns where used + free ≈ total".to_string()),
        (many, _) => {
            let list: Vec<String> = many.iter().map(|(t, u, f)| format!("{}/{}/{}", t + 1, u + 1, f + 1)).collect();
            return Err(format!(
                "several column triples fit used + free ≈ total (total/used/free: {})",
                list.join(", ")
            ));
        }
    }
    let label = |r: Role| match r {
        Role::Stamp => "timestamp",
        Role::Index => "index",
        Role::Name => "name",
        Role::Bus => "pci.bus_id",
        Role::Uuid => "uuid",
        Role::Total => "memory.total",
        Role::Used => "memory.used",
        Role::Free => "memory.free",
        _ => "?",
    };
    let cols: Vec<Col> = roles.iter().map(|&r| Col::inferred(r, label(r))).collect();
    let labels: Vec<&str> = roles.iter().map(|&r| label(r)).collect();
    Ok((cols, labels.join(", ")))
}

/// `3 GPUs`, `1 process`.
fn count(n: usize, word: &str) -> String {
    match (n, word.ends_with('s')) {
        (1, _) => format!("1 {word}"),
        (_, true) => format!("{n} {word}es"),
        _ => format!("{n} {word}s"),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Table rows

/// `|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:09.0 Off |` (name, persistence/driver model, bus id).
static GPU_ROW: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\|\s*(\d+)\s+(.*?)\s+(\S+)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
        .expect("valid regex")
});
/// `|   19818MiB /  81559MiB |`
static MEM_CELL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|").expect("valid regex"));
/// `|  0    2   0   0  |              26MiB / 40448MiB    |` (GPU, GI, CI, MIG device, used, total).
static MIG_ROW: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB").expect("valid regex")
});
/// `|    0   N/A  N/A           11345      C   ./gpu_burn                            15690MiB |` (GI/CI columns
/// since 450; `N/A` memory under WDDM).
static PROC_ROW: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\|\s*(\d+)\s+(?:(N/A|\d+)\s+(N/A|\d+)\s+)?(\d+)\s+([CGM](?:\+[CGM])*)\s+(.*?)\s+(\d+MiB|N/A)\s*\|$")
        .expect("valid regex")
});
