//! The terminal summary: the verdict and the numbers first, the biggest culprits named, their stacks shown.

use std::fmt::Write;

use super::wording::{self, Highlight};
use super::{percent, stream_name, when};
use crate::analysis::{stacks::folded, Analysis, DeviceReport, Moment, ReportSource, Severity};
use crate::timeline::Timeline;
use crate::units::{bytes, duration_us};

struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
    fn red(&self, s: &str) -> String {
        self.paint("1;31", s)
    }
    fn yellow(&self, s: &str) -> String {
        self.paint("33", s)
    }
    fn cyan(&self, s: &str) -> String {
        self.paint("36", s)
    }
}

pub fn render(a: &Analysis, tl: &Timeline, color: bool) -> String {
    let st = Style { on: color };
    let mut o = String::new();
    for input in &a.inputs {
        let _ = writeln!(
            o,
            "{} {}  {}",
            st.bold("oomdoc"),
            st.bold(&input.path),
            st.dim(&format!("({})", wording::input_line(input)))
        );
    }
    if let Some(c) = &a.clock {
        let _ = writeln!(o, "{} {}", st.dim("Clock:"), c.description);
    }
    if a.devices.is_empty() && a.serving.is_none() && a.profile.is_none() {
        let _ = writeln!(o, "\nNo GPU memory in these files: no segments, no trace events, no OOM message.");
    }
    let verdicts: Vec<&DeviceReport> = a.devices.iter().filter(|d| d.verdict.is_some()).collect();
    if !verdicts.is_empty() {
        let _ = writeln!(o, "\n{}", st.bold("Verdict"));
        for d in verdicts {
            let v = d.verdict.as_ref().expect("filtered");
            let _ = writeln!(o, "  {}", v.summary);
            for line in wording::verdict_detail(d) {
                let _ = writeln!(o, "    {}", st.dim(&line));
            }
        }
    }
    if !a.findings.is_empty() {
        let _ = writeln!(o);
        for f in &a.findings {
            let sev = match f.severity {
                Severity::Error => st.red("error"),
                Severity::Warning => st.yellow("warning"),
                Severity::Info => st.cyan("info"),
            };
            let gpu = f.device.map_or(String::new(), |d| format!("GPU {d}: "));
            let explains = f.bytes.map_or(String::new(), |b| format!(" explains {}", bytes(b)));
            let _ = writeln!(
                o,
                "{sev} {} {}",
                st.bold(&format!("{gpu}{}", f.title)),
                st.dim(&format!("[{}]{explains}", f.rule))
            );
            let _ = writeln!(o, "  {}", f.message);
            let _ = writeln!(o, "  {} {}", st.bold("fix:"), f.fix);
        }
    }
    for d in &a.devices {
        device(&mut o, d, tl, &st);
    }
    if let Some(line) = wording::other_gpus_line(&a.other_gpus) {
        let _ = writeln!(o, "\n{}", st.dim(&line));
    }
    if let Some(s) = &a.serving {
        let _ = writeln!(o, "\n{}  {}", st.bold("Serving engine (vLLM)"), st.dim(&s.sources.join(", ")));
        for line in wording::serving_lines(s) {
            let _ = writeln!(o, "  {line}");
        }
    }
    if let Some(p) = &a.profile {
        let _ = writeln!(o, "\n{}", st.bold("Profiler exports (Nsight Systems / Nsight Compute)"));
        for line in wording::profile_lines(p) {
            let _ = writeln!(o, "  {line}");
        }
    }
    if let Some(s) = &a.allocator_settings {
        let conf = s.alloc_conf.as_deref().unwrap_or("");
        let _ = writeln!(
            o,
            "\n{} PYTORCH_CUDA_ALLOC_CONF={}  expandable_segments={}  max_split_size={}",
            st.dim("Allocator:"),
            if conf.is_empty() { "(unset)" } else { conf },
            s.expandable_segments.map_or("?".into(), |e| e.to_string()),
            s.max_split_size.map_or("unlimited".into(), bytes),
        );
    }
    o
}

fn device(o: &mut String, d: &DeviceReport, tl: &Timeline, st: &Style) {
    let words = wording::moment_words(d.moment);
    let moment = if d.moment == Moment::Oom { st.red(words) } else { st.bold(words) };
    let place = wording::place(d);
    let _ = writeln!(o, "\n{} {}  {}", st.bold(&format!("GPU {}", d.device)), moment, st.dim(&format!("({place})")));

    if let Some(oom) = &d.oom {
        for (i, (hl, line)) in wording::oom_lines(oom).into_iter().enumerate() {
            let line = match hl {
                Highlight::Warn => st.yellow(&line),
                Highlight::Culprit(words) => format!("{words} {}", st.cyan(&line)),
                Highlight::Dim => st.dim(&line),
                Highlight::Headline | Highlight::None => line,
            };
            let _ = writeln!(o, "  {}  {line}", if i == 0 { st.red("OOM") } else { "   ".into() });
        }
        for line in wording::pinning_lines(d) {
            let _ = writeln!(o, "       {}", st.yellow(&line));
        }
    }
    if let Some(obs) = &d.observed {
        for line in wording::observed_lines(obs, d) {
            let _ = writeln!(o, "  {line}");
        }
    }
    if d.source == ReportSource::Text {
        for n in &d.notes {
            let _ = writeln!(o, "  {} {}", st.yellow("note:"), n);
        }
        return;
    }
    let _ = writeln!(
        o,
        "  allocated {}   reserved {}   active {}   cached free {} ({} of reserved)",
        st.bold(&bytes(d.allocated_bytes)),
        st.bold(&bytes(d.reserved_bytes)),
        bytes(d.active_bytes),
        bytes(d.reserved_unallocated_bytes),
        percent(d.reserved_unallocated_bytes, d.reserved_bytes),
    );
    let pending = if d.pending_free_bytes > 0 {
        format!(" · {} pending free", bytes(d.pending_free_bytes))
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "  largest free block {} · {} segments, {} blocks{pending}",
        bytes(d.largest_free_block_bytes),
        d.segments,
        d.blocks
    );
    if let Some(p) = &d.peak {
        let _ = writeln!(
            o,
            "  peak allocated {} ({}), peak reserved {}",
            bytes(p.allocated_bytes),
            when(p.event_index, p.time_us, d.trace.first_time_us),
            bytes(p.reserved_bytes)
        );
    }
    if d.moment != Moment::End && d.trace.entries > 0 {
        let _ = writeln!(
            o,
            "  at the end: allocated {}, reserved {}",
            bytes(d.end.allocated_bytes),
            bytes(d.end.reserved_bytes)
        );
    }

    if !d.by_category.is_empty() {
        let parts: Vec<String> =
            d.by_category.iter().map(|c| super::wording::category_part(c, d.allocated_bytes)).collect();
        let _ = writeln!(o, "  by kind: {}", parts.join(", "));
    }
    if let Some(c) = &d.budget {
        super::budget::comparison_text(o, c);
    }
    if !d.by_stack.is_empty() && d.allocated_bytes > 0 {
        let _ = writeln!(o, "\n  {}", st.bold("Live memory by allocating stack"));
        for g in &d.by_stack {
            let _ = writeln!(
                o,
                "  {:>10} {:>4} {:>6}  {}",
                bytes(g.bytes),
                percent(g.bytes, d.allocated_bytes),
                format!("×{}", g.count),
                st.cyan(&g.callers)
            );
        }
    }
    if !d.top_allocations.is_empty() {
        let _ = writeln!(o, "\n  {}", st.bold("Largest live allocations"));
        for (i, a) in d.top_allocations.iter().enumerate() {
            let age = a.age_us.map_or(String::new(), |us| format!("  age {}", duration_us(us)));
            let _ = writeln!(
                o,
                "  {:>10}  {}{}  {}",
                bytes(a.bytes),
                st.cyan(&a.culprit),
                st.dim(&age),
                st.dim(&stream_name(a.stream))
            );
            // Full stacks for the top three; the rest are named by their culprit line.
            if i < 3 {
                for (lib, line) in folded(tl, a.stack_id, 8) {
                    let _ = writeln!(o, "              {}", if lib { st.dim(&line) } else { line });
                }
            }
        }
    }
    if d.trace.entries > 0 {
        let actions: Vec<String> = d.trace.actions.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let span = d.trace.span_us.map_or(String::new(), |s| format!(" over {}", duration_us(s)));
        let _ = writeln!(o, "\n  {} {} events{span}: {}", st.dim("Trace:"), d.trace.entries, actions.join(", "));
    }
    for n in &d.notes {
        let _ = writeln!(o, "  {} {}", st.yellow("note:"), n);
    }
}
