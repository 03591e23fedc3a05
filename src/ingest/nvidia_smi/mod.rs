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

mod csv;
mod monitor;
mod query;
mod table;

use csv::*;

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

    // -----------------------------------------------------------------------------------------------------------
    // -q

    // -----------------------------------------------------------------------------------------------------------
    // dmon / pmon

    // -----------------------------------------------------------------------------------------------------------
    // CSV
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
