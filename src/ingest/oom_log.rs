//! Training logs: every out-of-memory report in them, with its figures.
//!
//! PyTorch's caching allocator has worded its OOM error three ways (all sizes `%.2f` with `bytes`/`KiB`/`MiB`/
//! `GiB`, from `format_size` in c10/cuda/CUDACachingAllocator.cpp):
//!
//! - ≤ 1.3: `Tried to allocate S (GPU N; T total capacity; A already allocated; F free; C cached)`
//! - 1.4–2.0: `… F free; [L allowed; ]R reserved in total by PyTorch)`, from 1.10 followed by a
//!   max_split_size_mb hint; the exception became `torch.cuda.OutOfMemoryError` in 1.13.
//! - ≥ 2.1: `Tried to allocate S. GPU N has a total capac(i)ty of T of which F is free. [Process P has X memory
//!   in use. …][Including non-PyTorch memory, this process has X memory in use. ][L allowed; ]Of the allocated
//!   memory A is allocated by PyTorch, [with P allocated in private pools (e.g., CUDA Graphs), ]and U is reserved
//!   by PyTorch but unallocated.` plus a hint (max_split_size_mb, later expandable_segments). ROCm builds say
//!   `HIP out of memory`, XPU `XPU out of memory`, the newest generic allocator `Out of memory`.
//!
//! `S` is the segment the allocator asked the driver for (the request rounded to its allocation size: 2 MiB for
//! small requests, 20 MiB for 1–10 MiB ones), not the tensor's size.
//!
//! Logs wrap these messages anywhere (terminals at a fixed width, mid-word; loggers at sentence ends), prefix
//! lines with timestamps and levels, and interleave ranks (`[rank3]:`, `3: `). So: lines are split by the rank
//! that wrote them; a message is its anchor line plus the continuation lines of the same rank up to the next
//! record (a traceback line, a new exception, a new timestamped record, a blank line); and the figures are read
//! from that text with every whitespace removed, which makes a break inside a word or a number harmless (the
//! grammar never puts two numbers next to each other with only a space between them).
//!
//! Other failures read as OOMs: the CUDA runtime's own (`CUDA error: out of memory`, old THC `cuda runtime error
//! (2) : out of memory`), cuBLAS's `CUBLAS_STATUS_ALLOC_FAILED`, NCCL's `NCCL WARN Cuda failure 'out of memory'`
//! (with the size from a following `Failed to CUDA calloc N bytes`), and TensorFlow's `failed to allocate … (N
//! bytes) from device: CUDA_ERROR_OUT_OF_MEMORY`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;

use super::text::{find_stamp, lines, parse_size, re, split_rank_prefix, strip_log_prefix};
use crate::timeline::{Malformed, OomKind, OomLimit, OomMessage, Stamp};

/// What reading a log gave.
#[derive(Debug, Default)]
pub struct LogParse {
    pub ooms: Vec<OomMessage>,
    pub malformed: Vec<Malformed>,
}

/// Longest logical message, in lines: a 200-column terminal wraps a full ≥ 2.1 message into 4; a 40-column one
/// into 20.
const MAX_LINES: usize = 24;

/// A line that reports an OOM (the start of a message).
fn anchor(line: &str) -> bool {
    static A: OnceLock<Regex> = OnceLock::new();
    re(
        &A,
        r"(?i)out of memory|OutOfMemoryError|Tried to allocate|CUBLAS_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY|Failed to CUDA calloc|cudaErrorMemoryAllocation|hipErrorOutOfMemory",
    )
    .is_match(line)
}

/// Anchors that always start a new message (a continuation may legitimately begin with "Tried to allocate").
fn primary_anchor(line: &str) -> bool {
    static A: OnceLock<Regex> = OnceLock::new();
    re(
        &A,
        r"(?i)out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY|Failed to CUDA calloc",
    )
    .is_match(line)
}

/// True when a text holds an OOM report this module reads (for sniffing).
pub fn sniff(text: &str) -> bool {
    let p = parse(text, "");
    !p.ooms.is_empty()
}

/// An allocator message whose figures have not ended yet.
fn incomplete(msg: &str) -> bool {
    let (w, _) = squeeze(msg);
    w.contains("Triedtoallocate")
        && !["butunallocated.", "reservedintotalbyPyTorch)", "cached)"].iter().any(|k| w.contains(k))
}

/// PyTorch's allocator message ends with a link to its documentation: what follows is another record, whatever it
/// looks like (a script's own `capture: … oom` line was read as part of the hint).
fn ends_with_its_link(msg: &str) -> bool {
    let m = msg.trim_end();
    m.ends_with(')')
        && m.rsplit_once("See documentation for Memory Management").is_some_and(|(_, rest)| {
            let rest = rest.trim_start();
            rest.starts_with("(http") && !rest[1..].contains(['(', ')', ' '].as_slice()) || rest.ends_with("-conf)")
        })
}

/// A line that starts a new record, ending any message before it.
fn record_start(line: &str) -> bool {
    static R: OnceLock<Regex> = OnceLock::new();
    let t = line.trim_start();
    t.is_empty()
        || re(
            &R,
            r"^(?:Traceback \(most recent call last\)|File [^ ]|During handling of|The above exception|Exception raised from|frame #\d|\d{4}[-/]\d{2}[-/]\d{2}[T ]\d{2}:\d{2}|[A-Za-z_][\w.]*(?:Error|Exception|Warning):|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) |[IWEF]\d{4} \d{2}:\d{2}|\S+:\d+:\d+ \[\d+\] )",
        )
        .is_match(t)
}

struct Line {
    no: usize,
    raw: String,
    text: String,
}

/// Reads every OOM report in `text`. `source` names the file in the records.
pub fn parse(text: &str, source: &str) -> LogParse {
    let mut streams: BTreeMap<Option<i64>, Vec<Line>> = BTreeMap::new();
    for (no, raw) in lines(text) {
        let (rank, rest) = split_rank_prefix(&raw);
        let rest = rest.to_string();
        streams.entry(rank).or_default().push(Line { no, raw, text: rest });
    }
    let mut out = LogParse::default();
    for (rank, ls) in &streams {
        parse_stream(ls, *rank, source, &mut out);
    }
    out.ooms.sort_by_key(|o| o.line);
    out.malformed.sort_by_key(|m| m.line);
    out
}

fn parse_stream(ls: &[Line], rank: Option<i64>, source: &str, out: &mut LogParse) {
    let mut i = 0;
    while i < ls.len() {
        if !anchor(&ls[i].text) {
            i += 1;
            continue;
        }
        // The message: the anchor line and its continuations.
        let mut msg = ls[i].text.clone();
        let mut j = i + 1;
        while j < ls.len() && j - i < MAX_LINES {
            let t = &ls[j].text;
            if primary_anchor(t) || ends_with_its_link(&msg) {
                break;
            }
            // A new record ends the message, unless the message is an allocator one still missing its last
            // figure and the line, past its logger prefix, goes on with it (loggers that stamp every line).
            if record_start(t) {
                let rest = strip_log_prefix(t);
                if !(incomplete(&msg) && !rest.is_empty() && !record_start(rest)) {
                    break;
                }
            }
            msg.push(' ');
            msg.push_str(strip_log_prefix(t));
            j += 1;
        }
        let Some(mut o) = read_message(&msg, &ls[i].text) else {
            i += 1;
            continue;
        };
        let mut next = j;
        o.source = source.to_string();
        o.rank = rank;
        o.line = ls[i].no;
        o.stamp = stamp_near(ls, i);
        if let Some(raised) = raising_frames(ls, i) {
            (o.user_frame, o.user_code, o.calls_below) = (Some(raised.frame), raised.code, raised.calls_below);
        }
        if o.kind == OomKind::Nccl {
            if o.device.is_none() {
                o.device = nccl_device(&ls[i].raw);
            }
            // NCCL reports the size on its next WARN line: "Failed to CUDA calloc 6291456 bytes".
            if o.requested_bytes.is_none() {
                for (k, l) in ls.iter().enumerate().skip(i + 1).take(3) {
                    if let Some(n) = calloc_bytes(&l.text).filter(|_| nccl_device(&l.raw) == o.device) {
                        o.requested_bytes = Some(n);
                        next = next.max(k + 1);
                        break;
                    }
                }
            }
        }
        if o.kind == OomKind::Allocator && o.requested_bytes.is_none() && !o.requested_at_least {
            out.malformed.push(Malformed {
                line: ls[i].no,
                expected: "an allocator OOM message with 'Tried to allocate <size> <unit>'".into(),
                found: cut(&o.text, 120),
            });
        }
        out.ooms.push(o);
        i = next.max(i + 1);
    }
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect::<String>() + "…"
    }
}

/// The whitespace-free form of `m`, with each of its bytes' position in `m`.
fn squeeze(m: &str) -> (String, Vec<usize>) {
    let mut w = String::with_capacity(m.len());
    let mut at = Vec::with_capacity(m.len());
    for (i, c) in m.char_indices() {
        if !c.is_whitespace() {
            w.push(c);
            for k in 0..c.len_utf8() {
                at.push(i + k);
            }
        }
    }
    at.push(m.len());
    (w, at)
}

const NUM_UNIT: &str = r"(\d+(?:\.\d+)?)(bytes|byte|[KMGTPE]i?B|B)";

struct Fields<'a> {
    w: &'a str,
    end: usize,
}

impl Fields<'_> {
    /// The size in the first match of `pattern` (one `{S}` placeholder for the size), and where it ends.
    fn size(&mut self, cell: &'static OnceLock<Regex>, pattern: &str) -> Option<u64> {
        let r = cell.get_or_init(|| Regex::new(&pattern.replace("{S}", NUM_UNIT)).expect("valid regex"));
        let c = r.captures(self.w)?;
        let n = parse_size(&c[c.len() - 2], &c[c.len() - 1])?;
        self.end = self.end.max(c.get(0)?.end());
        Some(n)
    }
}

/// Reads one logical message; `None` if it is not an OOM report after all (a line that only mentions one).
fn read_message(m: &str, first_line: &str) -> Option<OomMessage> {
    static GPU_OLD: OnceLock<Regex> = OnceLock::new();
    static GPU_NEW: OnceLock<Regex> = OnceLock::new();
    static REQ: OnceLock<Regex> = OnceLock::new();
    static REQ_EB: OnceLock<Regex> = OnceLock::new();
    static TOTAL_OLD: OnceLock<Regex> = OnceLock::new();
    static ALLOC_OLD: OnceLock<Regex> = OnceLock::new();
    static FREE_OLD: OnceLock<Regex> = OnceLock::new();
    static RES_OLD: OnceLock<Regex> = OnceLock::new();
    static CACHED_OLD: OnceLock<Regex> = OnceLock::new();
    static ALLOWED: OnceLock<Regex> = OnceLock::new();
    static TOTAL_NEW: OnceLock<Regex> = OnceLock::new();
    static FREE_NEW: OnceLock<Regex> = OnceLock::new();
    static PROC_SELF: OnceLock<Regex> = OnceLock::new();
    static PROC_OTHER: OnceLock<Regex> = OnceLock::new();
    static ALLOC_NEW: OnceLock<Regex> = OnceLock::new();
    static PRIVATE: OnceLock<Regex> = OnceLock::new();
    static UNALLOC: OnceLock<Regex> = OnceLock::new();
    static TF: OnceLock<Regex> = OnceLock::new();
    static RUNTIME: OnceLock<Regex> = OnceLock::new();
    static DEVTYPE: OnceLock<Regex> = OnceLock::new();
    static TRUNCATED: OnceLock<Regex> = OnceLock::new();
    static REJECTED: OnceLock<Regex> = OnceLock::new();
    static ACTIVE_OLD: OnceLock<Regex> = OnceLock::new();
    static RESERVE: OnceLock<Regex> = OnceLock::new();

    let (w, at) = squeeze(m);
    let mut f = Fields { w: &w, end: 0 };
    let mut o = OomMessage {
        source: String::new(),
        device: None,
        rank: None,
        requested_bytes: None,
        requested_at_least: false,
        total_bytes: None,
        free_bytes: None,
        allocated_bytes: None,
        reserved_bytes: None,
        non_pytorch_bytes: None,
        kind: OomKind::Allocator,
        line: 0,
        reserved_unallocated_bytes: None,
        process_bytes: None,
        processes: Vec::new(),
        allowed_bytes: None,
        private_pool_bytes: None,
        device_type: "CUDA".into(),
        limit: None,
        reserve_bytes: None,
        active_bytes: None,
        exception: exception(first_line),
        generation: None,
        hint: None,
        user_frame: None,
        user_code: None,
        calls_below: Vec::new(),
        stamp: None,
        time_us: None,
        text: String::new(),
    };
    if let Some(c) =
        re(&DEVTYPE, r"\b(CUDA|HIP|XPU|MPS|NPU|MTIA)(?: backend)?\s+(?:out of memory|error: out of memory)").captures(m)
    {
        o.device_type = c[1].to_string();
    } else if m.contains("PYTORCH_HIP_ALLOC_CONF") || m.contains("hipError") {
        o.device_type = "HIP".into();
    }

    if w.contains("preemptivelyrejected") {
        // torch ≥ 2.12 with per_process_memory_fraction and throw_on_cudamalloc_oom: the allocator refuses a
        // request that would pass the cap before asking the driver.
        o.kind = OomKind::Allocator;
        o.limit = Some(OomLimit::FractionRejected);
        o.generation = Some("≥2.12");
        o.requested_bytes = f.size(&REJECTED, r"Requestedsize:{S}");
        f.end = f.end.max(w.find("limit.").map_or(0, |p| p + "limit.".len()));
    } else if w.contains("Triedtoallocate") {
        o.kind = OomKind::Allocator;
        if let Some(c) = re(&REQ_EB, r"Triedtoallocatemorethan1EBmemory").find(&w) {
            // c10 checks `size < one_exa_bytes` with one_exa_bytes = 2^60 before it allocates.
            o.requested_bytes = Some(1 << 60);
            o.requested_at_least = true;
            f.end = f.end.max(c.end());
        } else {
            o.requested_bytes = f.size(&REQ, r"Triedtoallocate{S}");
        }
        // torch_npu keeps the 1.4–2.0 layout, with `NPU n;` and a "current active" figure.
        let gpu_old = re(&GPU_OLD, r"\((?:GPU|NPU)(\d+);").captures(&w);
        if gpu_old.is_some() || w.contains("totalcapacity;") {
            o.device = gpu_old.and_then(|c| c[1].parse().ok());
            o.total_bytes = f.size(&TOTAL_OLD, r"{S}totalcapacity");
            o.allocated_bytes = f.size(&ALLOC_OLD, r"{S}alreadyallocated");
            o.free_bytes = f.size(&FREE_OLD, r";{S}free");
            o.active_bytes = f.size(&ACTIVE_OLD, r";{S}currentactive;");
            o.allowed_bytes = f.size(&ALLOWED, r"{S}allowed;");
            o.reserved_bytes = f.size(&RES_OLD, r"{S}reservedintotalbyPyTorch");
            o.generation = Some("1.4–2.0");
            o.reserved_unallocated_bytes = o.reserved_bytes.zip(o.allocated_bytes).map(|(r, a)| r.saturating_sub(a));
            if o.reserved_bytes.is_none() {
                // ≤ 1.3 said "cached" for memory "held by the allocator but not used by the program" (the source's
                // own comment): the reserved-but-unallocated part, not the total.
                o.reserved_unallocated_bytes = f.size(&CACHED_OLD, r"{S}cached\)");
                if o.reserved_unallocated_bytes.is_some() {
                    o.generation = Some("≤1.3");
                    o.reserved_bytes = o.reserved_unallocated_bytes.zip(o.allocated_bytes).map(|(c, a)| c + a);
                }
            }
            // The closing parenthesis ends the figures.
            if let Some(p) = w[f.end..].find(')') {
                f.end += p + 1;
            }
        } else {
            o.device = re(&GPU_NEW, r"GPU(\d+)hasatotalcapac").captures(&w).and_then(|c| c[1].parse().ok());
            o.total_bytes = f.size(&TOTAL_NEW, r"hasatotalcapac(?:i)?tyof{S}");
            o.free_bytes = f.size(&FREE_NEW, r"ofwhich{S}isfree");
            o.process_bytes = f.size(&PROC_SELF, r"thisprocesshas{S}memoryinuse");
            let other = PROC_OTHER.get_or_init(|| {
                Regex::new(&r"Process(\d+)has{S}memoryinuse".replace("{S}", NUM_UNIT)).expect("valid regex")
            });
            for c in other.captures_iter(&w) {
                if let (Ok(pid), Some(b)) = (c[1].parse(), parse_size(&c[2], &c[3])) {
                    o.processes.push((pid, b));
                    f.end = f.end.max(c.get(0).map_or(0, |x| x.end()));
                }
            }
            o.allowed_bytes = f.size(&ALLOWED, r"{S}allowed;");
            o.allocated_bytes = f.size(&ALLOC_NEW, r"Oftheallocatedmemory{S}isallocatedbyPyTorch");
            o.private_pool_bytes = f.size(&PRIVATE, r"with{S}allocatedinprivatepools");
            o.reserved_unallocated_bytes = f.size(&UNALLOC, r"and{S}isreservedbyPyTorchbutunallocated");
            if o.total_bytes.is_some() || o.allocated_bytes.is_some() {
                o.generation = Some("≥2.1");
            }
            // "Of the allocated memory" counts private pools in; reserved = that + unallocated either way.
            o.reserved_bytes = o.allocated_bytes.zip(o.reserved_unallocated_bytes).map(|(a, u)| a + u);
            if o.reserved_unallocated_bytes.is_some() {
                f.end = f.end.max(w.find("butunallocated.").map_or(f.end, |p| p + "butunallocated.".len()));
            }
        }
        o.non_pytorch_bytes = match (o.total_bytes, o.free_bytes, o.reserved_bytes) {
            // Windows can report more allocated than capacity (system-memory fallback): then nothing is known.
            (Some(t), Some(fr), Some(r)) if fr + r <= t => Some(t - fr - r),
            _ => None,
        };
        o.hint = hint(m, &w, &at, &mut f.end);
        // torch ≥ 2.16 with expandable segments: the per-stream reserve of virtual addresses, not the GPU, ran out.
        if w.contains("expandable-segmentreserve") {
            o.limit = Some(OomLimit::ExpandableReserve);
            o.reserve_bytes = f.size(&RESERVE, r"expandable-segmentreserveof{S}");
        } else if w.contains("expandable_segments_reserve")
            && (w.contains("virtualaddress") || w.contains("over-reserved") || w.contains("reduceit"))
        {
            o.limit = Some(OomLimit::AddressSpace);
        }
        if o.limit.is_some() {
            f.end = w.len();
        }
    } else if m.contains("CUBLAS_STATUS_ALLOC_FAILED") {
        o.kind = OomKind::CublasAllocFailed;
        f.end = w.find("CUBLAS_STATUS_ALLOC_FAILED").map_or(0, |p| p + 26);
        // "… when calling `cublasCreate(handle)`": keep the call.
        if let Some(p) = w[f.end..].find(')').filter(|&p| p < 60) {
            f.end += p + 1;
            if w[f.end..].starts_with('`') {
                f.end += 1;
            }
        }
    } else if m.contains("NCCL") && m.to_ascii_lowercase().contains("out of memory") {
        o.kind = OomKind::Nccl;
        o.device_type = "CUDA".into();
        // "out of memory" and the character after it (a quote or a full stop), whatever its width.
        f.end = w.to_ascii_lowercase().find("outofmemory").map_or(w.len(), |p| {
            let after = p + "outofmemory".len();
            after + w[after..].chars().next().map_or(0, char::len_utf8)
        });
    } else if let Some(c) = re(&TF, r"failed to allocate (\d+(?:\.\d+)?)([KMGTPE]i?B?|B|bytes)? \((\d+) bytes\) from device: CUDA_ERROR_OUT_OF_MEMORY").captures(m) {
        o.kind = OomKind::Tensorflow;
        o.requested_bytes = c[3].parse().ok();
        o.exception = None;
        f.end = at.iter().position(|&p| p >= c.get(0).map_or(0, |x| x.end())).unwrap_or(w.len());
    } else if let Some(c) = re(
        &RUNTIME,
        r"(?i)\b(CUDA|HIP) error: out of memory|cuda runtime error \(2\) ?: ?out of memory|cudaErrorMemoryAllocation|hipErrorOutOfMemory",
    )
    .captures(m)
    {
        o.kind = OomKind::RuntimeError;
        if let Some(t) = c.get(1) {
            o.device_type = t.as_str().to_uppercase();
        }
        f.end = at.iter().position(|&p| p >= c.get(0).map_or(0, |x| x.end())).unwrap_or(w.len());
        // torch names the async-error advice and CUDA_LAUNCH_BLOCKING after the message; keep them in the text.
        for tail in ["CUDA_LAUNCH_BLOCKING=1", "device-sideassertions.", "formoreinformation."] {
            if let Some(p) = w.find(tail) {
                f.end = f.end.max(p + tail.len());
            }
        }
    } else if let Some(c) = re(&TRUNCATED, r"\b(?:CUDA|HIP|XPU|NPU) out of memory\.?").find(m) {
        // The caching allocator's message with its figures cut off: an OOM, but a malformed one.
        o.kind = OomKind::Allocator;
        f.end = at.iter().position(|&p| p >= c.end()).unwrap_or(w.len());
    } else {
        return None;
    }
    let mut end = at.get(f.end).copied().unwrap_or(m.len()).min(m.len());
    // A cut inside a character of the squeezed text maps inside it here too: keep the whole character.
    while !m.is_char_boundary(end) {
        end += 1;
    }
    o.text = cut(&m[..end].split_whitespace().collect::<Vec<_>>().join(" "), 1000);
    Some(o)
}

/// The hint PyTorch appended, and the end of the message after it.
fn hint(m: &str, w: &str, at: &[usize], end: &mut usize) -> Option<String> {
    let start = w[*end..].find("Ifreserved").map(|p| p + *end)?;
    // It ends with the docs link (≥ 2.2) or with the env variable's name (1.10–2.1).
    // (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` inside the ≥ 2.2 hint is not its end.)
    // Any anchor of the CUDA notes page: `#environment-variables` (2.2–2.x), `#optimizing-memory-usage-…` (newest).
    let link = w[start..].find("cuda.html#").and_then(|p| w[start + p..].find(')').map(|q| start + p + q + 1));
    let conf =
        w[start..].match_indices("ALLOC_CONF").map(|(p, k)| start + p + k.len()).find(|&e| !w[e..].starts_with('='));
    // torch_npu's hint ends the message at its full stop.
    let npu = w[start..].find("avoidfragmentation.").map(|p| start + p + "avoidfragmentation.".len());
    let stop = [link, conf].into_iter().flatten().min().or(npu).unwrap_or(w.len());
    *end = stop;
    let (a, b) = (at[start], at.get(stop).copied().unwrap_or(m.len()).min(m.len()));
    Some(m[a..b].split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The exception class on the message's first line: `torch.OutOfMemoryError`, `RuntimeError` …
fn exception(line: &str) -> Option<String> {
    static E: OnceLock<Regex> = OnceLock::new();
    let r = re(&E, r"\b([A-Za-z_][\w.]*(?:Error|Exception))\s*:");
    r.captures_iter(line).map(|c| c[1].to_string()).find(|e| e != "OOM")
}

/// NCCL's log prefix names the CUDA device: `host:pid:tid [dev] file.cc:line NCCL WARN …`, or `[dev] …`.
fn nccl_device(raw: &str) -> Option<i64> {
    static N: OnceLock<Regex> = OnceLock::new();
    re(&N, r"(?:^|\s)(?:\S+:\d+:\d+ )?\[(\d+)\] \S*.*NCCL WARN").captures(raw).and_then(|c| c[1].parse().ok())
}

fn calloc_bytes(line: &str) -> Option<u64> {
    static C: OnceLock<Regex> = OnceLock::new();
    re(&C, r"Failed to CUDA calloc (?:async )?(\d+) bytes").captures(line).and_then(|c| c[1].parse().ok())
}

/// The message's time: a stamp on its line, else on the traceback's header line just above it.
fn stamp_near(ls: &[Line], i: usize) -> Option<Stamp> {
    if let Some((s, _, _)) = find_stamp(&ls[i].raw) {
        return Some(s);
    }
    for l in ls[..i].iter().rev().take(400) {
        if l.text.contains("Traceback (most recent call last)") {
            return find_stamp(&l.raw).map(|(s, _, _)| s);
        }
        if anchor(&l.text) {
            break;
        }
    }
    None
}

/// Where the user's code raised: the innermost traceback frame above the message that is not library code, its
/// source line, and the functions called below it.
struct Raised {
    frame: String,
    code: Option<String>,
    calls_below: Vec<String>,
}

/// The traceback just above the message at line `i`, read for [`Raised`].
fn raising_frames(ls: &[Line], i: usize) -> Option<Raised> {
    static F: OnceLock<Regex> = OnceLock::new();
    // CPython `File "x.py", line 3, in f`; IPython ≥ 8 `File /x.py:3, in f(...)`.
    let r = re(&F, r#"File "([^"]+)", line (\d+), in (\S+)|File ([^\s,]+):(\d+), in (\w+)"#);
    // The frames, innermost first, each with the source line printed under it (not the carets under that).
    let mut frames: Vec<(&str, String, String, Option<String>)> = Vec::new();
    let mut below: Option<&str> = None;
    for l in ls[..i].iter().rev().take(400) {
        if anchor(&l.text) {
            break;
        }
        if let Some(c) = r.captures(&l.text) {
            let (path, line, func) = match c.get(1) {
                Some(p) => (p.as_str(), c[2].to_string(), c[3].to_string()),
                None => (c.get(4).map_or("", |m| m.as_str()), c[5].to_string(), c[6].to_string()),
            };
            let code = below.map(str::trim).filter(|t| !t.is_empty()).map(str::to_string);
            frames.push((path, line, func, code));
            below = None;
            continue;
        }
        if l.text.contains("Traceback (most recent call last)") {
            break;
        }
        let t = l.text.trim();
        // A source line, not the carets (`~~^~~`) CPython ≥ 3.11 prints under it.
        if !t.is_empty() && !t.chars().all(|c| matches!(c, '^' | '~' | ' ')) {
            below = Some(&l.text);
        }
    }
    let k = frames.iter().position(|(path, ..)| !crate::timeline::stacks::is_library_frame(path))?;
    let (path, line, func, code) = &frames[k];
    let short = path.rsplit(['/', '\\']).next().unwrap_or(path);
    Some(Raised {
        frame: format!("{short}:{line} in {func}"),
        code: code.clone(),
        calls_below: frames[..k].iter().rev().map(|(_, _, f, _)| f.clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_only_mentions_oom_is_not_an_oom() {
        assert!(parse("retrying: lower the batch size to avoid out of memory errors\n", "x").ooms.is_empty());
        assert!(parse("    except torch.cuda.OutOfMemoryError:\n", "x").ooms.is_empty());
    }

    #[test]
    fn squeeze_maps_back() {
        let (w, at) = squeeze("a b\n c");
        assert_eq!(w, "abc");
        assert_eq!(at, vec![0, 2, 5, 6]);
    }
}
