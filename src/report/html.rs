//! One self-contained HTML page: the verdict and findings first, then per GPU the timeline as an inline SVG
//! (allocated and reserved, reduced to at most [`crate::analysis::chart::BUCKETS`] buckets in Rust; memory outside
//! PyTorch when nvidia-smi saw it), the state at the moment, the segment map, live memory by allocating stack as a
//! table and a flame graph (`html_flame`), and the largest allocations with their stacks. Nothing is loaded from
//! anywhere: it opens offline in any browser, and an incident ticket can carry it.
//!
//! Hand-written SVG rather than a chart library: a library would be hundreds of KB inside every report; the
//! picture needs filled areas, lines, rectangles and hover text, which SVG has natively (`<title>`). Everything is
//! drawn here, so the page reads without its one small inline script, which only zooms and pans what is drawn.

use std::fmt::Write;

use super::wording::{self, Highlight};
use super::{percent, stream_name, when};
use crate::analysis::chart::{Chart, SegmentMap};
use crate::analysis::{stacks::folded, Analysis, DeviceReport, Moment, ReportSource};
use crate::timeline::Timeline;
use crate::units::{bytes, duration_us};

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "\
:root{--fg:#1d2430;--dim:#667085;--line:#d0d5dd;--bg:#fff;--alloc:#3b82f6;--res:#f59e0b;--err:#d92d20;--warn:#b54708;--info:#175cd3}\
@media (prefers-color-scheme:dark){:root{--fg:#e4e7ec;--dim:#98a2b3;--line:#344054;--bg:#101828}}\
body{font:15px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;color:var(--fg);background:var(--bg);max-width:1200px;margin:0 auto;padding:1.5rem}\
h1{font-size:1.5rem;margin:0 0 .25rem}h2{font-size:1.2rem;margin:2rem 0 .5rem;border-bottom:1px solid var(--line)}h3{font-size:1rem;margin:1.25rem 0 .4rem}\
.dim,.inputs{color:var(--dim)}.inputs{font-size:.85rem;margin:0}.summary{font-size:1.05rem}\
code,pre,td.num,td.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.85rem}\
table{border-collapse:collapse;width:100%}td,th{padding:.2rem .5rem;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}td.num{text-align:right;white-space:nowrap}\
.finding{border-left:4px solid var(--line);padding:.25rem .75rem;margin:.75rem 0}.sev-error{border-color:var(--err)}.sev-warning{border-color:var(--warn)}.sev-info{border-color:var(--info)}\
.sev{font-weight:600;text-transform:uppercase;font-size:.75rem}.sev-error .sev{color:var(--err)}.sev-warning .sev{color:var(--warn)}.sev-info .sev{color:var(--info)}\
.fix{background:rgba(16,185,129,.08);padding:.4rem .6rem;border-radius:4px}.oom{color:var(--err);font-weight:600}\
svg.timeline{width:100%;height:auto;border:1px solid var(--line);border-radius:4px}svg .alloc{fill:var(--alloc);fill-opacity:.35;stroke:var(--alloc);stroke-width:1}\
svg .res{fill:none;stroke:var(--res);stroke-width:1.5}svg .hit{fill:transparent}svg .hit:hover{fill:rgba(127,127,127,.18)}svg text{fill:var(--dim);font-size:11px}\
.legend span{margin-right:1rem}.sw{display:inline-block;width:.8rem;height:.8rem;margin-right:.3rem;vertical-align:middle}\
.blk-alloc{fill:var(--alloc);background:var(--alloc)}.blk-pending{fill:var(--res);background:var(--res)}.blk-free{fill:#98a2b3;fill-opacity:.45;background:#98a2b3}.blk-req{fill:var(--err);background:var(--err)}.blk-pin{fill:none;stroke:#d97706;stroke-width:1.5;border:1.5px solid #d97706}\
svg.segments{width:100%;height:auto}svg.timeline{cursor:grab;touch-action:none}svg .zoom *{vector-effect:non-scaling-stroke}svg .outside{fill:none;stroke:#7c3aed;stroke-width:1.5;stroke-dasharray:2 2}svg .cat{fill-opacity:.75;stroke:none}svg .low{fill:none;stroke:var(--fg);stroke-opacity:.35;stroke-width:1}\
.cat-parameter{fill:#6366f1;background:#6366f1}.cat-gradient{fill:#22c55e;background:#22c55e}.cat-optimizer_state{fill:#d946ef;background:#d946ef}.cat-activation{fill:#3b82f6;background:#3b82f6}\
.cat-temporary{fill:#06b6d4;background:#06b6d4}.cat-kv_cache{fill:#ec4899;background:#ec4899}.cat-communication{fill:#14b8a6;background:#14b8a6}.cat-compile{fill:#84cc16;background:#84cc16}.cat-user_tensor{fill:#f97316;background:#f97316}.cat-unknown{fill:#94a3b8;background:#94a3b8}\
svg.flame{width:100%;height:auto;cursor:pointer}svg.flame text{fill:#1d2430;font:11px ui-monospace,Menlo,monospace;pointer-events:none}svg.flame .fl:hover rect{stroke:#1d2430;stroke-width:1}.t0{fill:#d0d5dd;background:#d0d5dd}.t1{fill:#c6ccd6;background:#c6ccd6}.t2{fill:#fb923c;background:#fb923c}.t3{fill:#f59e0b;background:#f59e0b}.t4{fill:#f87171;background:#f87171}.t5{fill:#fbbf24;background:#fbbf24}.t6{fill:#fdba74;background:#fdba74}.t7{fill:#fca5a5;background:#fca5a5}details summary{cursor:pointer}pre{margin:.25rem 0;white-space:pre-wrap}footer{margin-top:3rem;color:var(--dim);font-size:.8rem}";

/// The page's only script, inline: zoom and pan on the timelines (wheel, drag, double-click to reset) and zoom on
/// the flame graphs (click a frame, double-click for all). The page reads fully without it.
const SCRIPT: &str = r#"(()=>{"use strict";
const svgX=(svg,ev)=>{const r=svg.getBoundingClientRect();return (ev.clientX-r.left)*svg.viewBox.baseVal.width/r.width;};
for(const svg of document.querySelectorAll("svg.timeline")){
const L=+svg.dataset.left,W=+svg.dataset.w,N=+svg.dataset.events,z=svg.querySelector("g.zoom");
const pinned=[...svg.querySelectorAll("[data-x]")],e0=svg.querySelector(".ev0"),e1=svg.querySelector(".ev1"),e1text=e1.textContent,mids=[...svg.querySelectorAll(".evm")];
let s=1,t=0,drag=null;
const ev=x=>Math.max(0,Math.min(N,Math.round(((x-t)/s-L)/(W-L)*N)));
const apply=()=>{s=Math.max(1,Math.min(s,4000));t=Math.min(L*(1-s),Math.max(W*(1-s),t));
z.setAttribute("transform","translate("+t.toFixed(3)+" 0) scale("+s.toFixed(5)+" 1)");
for(const p of pinned){const x=t+s*(+p.dataset.x);p.setAttribute("x",x.toFixed(1));p.style.display=(x<L||x>W)?"none":"";}
e0.textContent="event "+ev(L);e1.textContent=s>1?"event "+ev(W):e1text;
for(const m of mids){m.textContent="event "+ev(L+(W-L)*(+m.dataset.f));}};
svg.addEventListener("wheel",e=>{e.preventDefault();const x=svgX(svg,e),f=Math.exp(-e.deltaY*0.002);t=x-(x-t)*f;s*=f;apply();},{passive:false});
svg.addEventListener("pointerdown",e=>{drag={x:svgX(svg,e),t:t};svg.setPointerCapture(e.pointerId);});
svg.addEventListener("pointermove",e=>{if(drag){t=drag.t+svgX(svg,e)-drag.x;apply();}});
svg.addEventListener("pointerup",()=>{drag=null;});
svg.addEventListener("dblclick",()=>{s=1;t=0;apply();});}
for(const svg of document.querySelectorAll("svg.flame")){
const W=+svg.dataset.w,gs=[...svg.querySelectorAll("g[data-a]")];
const fit=(l,w)=>{const n=w<6?0:Math.floor((w-6)/6.6);return n<3?"":[...l].length<=n?l:[...l].slice(0,n-1).join("")+"\u2026";};
const zoom=(a,b)=>{for(const g of gs){const x0=(+g.dataset.a-a)/(b-a),x1=(+g.dataset.b-a)/(b-a);
if(x1<=0||x0>=1||(x1-x0)*W<0.3){g.style.display="none";continue;}
g.style.display="";const c0=Math.max(0,x0)*W,w=(Math.min(1,x1)-Math.max(0,x0))*W,r=g.querySelector("rect"),tx=g.querySelector("text");
r.setAttribute("x",c0.toFixed(1));r.setAttribute("width",Math.max(w-1,0.5).toFixed(1));tx.setAttribute("x",(c0+3).toFixed(1));tx.textContent=fit(g.dataset.l,w);}};
svg.addEventListener("click",e=>{const g=e.target.closest("g[data-a]");if(g)zoom(+g.dataset.a,+g.dataset.b);});
svg.addEventListener("dblclick",()=>zoom(0,1));}
})();"#;

/// The whole page around `body`.
pub fn document(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" \
         content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n\
         <body>\n{body}<footer>Made by oomdoc {} from the files named above; this page loads nothing from the \
         network.</footer>\n<script>{SCRIPT}</script>\n</body>\n</html>\n",
        esc(title),
        env!("CARGO_PKG_VERSION")
    )
}

/// A page for one analysis.
pub fn render(a: &Analysis, tl: &Timeline) -> String {
    let title = a.inputs.first().map_or("GPU memory report".to_string(), |i| format!("oomdoc: {}", i.path));
    document(&title, &fragment(a, tl))
}

/// The body of one analysis's report (a job's page holds several).
pub fn fragment(a: &Analysis, tl: &Timeline) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "<header>\n<h1>GPU memory report</h1>");
    for i in &a.inputs {
        let _ = writeln!(o, "<p class=\"inputs\"><code>{}</code> — {}</p>", esc(&i.path), esc(&wording::input_line(i)));
    }
    if let Some(c) = &a.clock {
        let _ = writeln!(o, "<p class=\"inputs\">Clock: {}</p>", esc(&c.description));
    }
    let _ = writeln!(o, "</header>");
    if a.devices.is_empty() {
        let _ = writeln!(o, "<p>No GPU memory in these files: no segments, no trace events, no OOM message.</p>");
    }
    if a.devices.iter().any(|d| d.verdict.is_some()) {
        let _ = writeln!(o, "<section id=\"verdict\">\n<h2>Verdict</h2>");
        for d in &a.devices {
            let Some(v) = &d.verdict else { continue };
            let _ = match wording::summary_after_gpu(d, &v.summary) {
                Some(rest) => writeln!(o, "<p class=\"summary\"><strong>GPU {}</strong> {}</p>", d.device, esc(rest)),
                None => writeln!(o, "<p class=\"summary\"><strong>GPU {}</strong>: {}</p>", d.device, esc(&v.summary)),
            };
            let detail = wording::verdict_detail(d);
            if !detail.is_empty() {
                let _ = writeln!(o, "<ul class=\"dim\">");
                for line in detail {
                    let _ = writeln!(o, "<li>{}</li>", esc(&line));
                }
                let _ = writeln!(o, "</ul>");
            }
        }
        let _ = writeln!(o, "</section>");
    }
    if !a.findings.is_empty() {
        let _ = writeln!(o, "<section id=\"findings\">\n<h2>Findings</h2>");
        for f in &a.findings {
            let sev = f.severity.name();
            let gpu = f.device.map_or(String::new(), |d| format!("GPU {d}: "));
            let explains = f.bytes.map_or(String::new(), |b| format!(" — explains {}", bytes(b)));
            let _ = writeln!(
                o,
                "<article class=\"finding sev-{sev}\">\n<h3><span class=\"sev\">{sev}</span> {}{} <code>[{}]</code>{}</h3>",
                esc(&gpu),
                esc(&f.title),
                esc(&f.rule),
                esc(&explains)
            );
            let _ =
                writeln!(o, "<p>{}</p>\n<p class=\"fix\"><strong>Fix:</strong> {}</p>", esc(&f.message), esc(&f.fix));
            if let Some(ev) = f.evidence.as_object().filter(|e| !e.is_empty()) {
                let _ = writeln!(o, "<details><summary>Evidence</summary>\n<table class=\"evidence\">");
                for (k, v) in ev {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    let _ =
                        writeln!(o, "<tr><td class=\"mono\">{}</td><td class=\"mono\">{}</td></tr>", esc(k), esc(&v));
                }
                let _ = writeln!(o, "</table></details>");
            }
            let _ = writeln!(o, "</article>");
        }
        let _ = writeln!(o, "</section>");
    }
    for d in &a.devices {
        let rules: Vec<&str> =
            a.findings.iter().filter(|f| f.device == Some(d.device)).map(|f| f.rule.as_str()).collect();
        device(&mut o, d, tl, &rules);
    }
    if let Some(line) = wording::other_gpus_line(&a.other_gpus) {
        let _ = writeln!(o, "<p class=\"dim\">{}</p>", esc(&line));
    }
    if let Some(s) = &a.serving {
        lines_section(
            &mut o,
            "serving",
            &format!("Serving engine (vLLM) <span class=\"dim\">{}</span>", esc(&s.sources.join(", "))),
            &wording::serving_lines(s),
        );
    }
    if let Some(p) = &a.profile {
        lines_section(
            &mut o,
            "profile",
            "Profiler exports (Nsight Systems / Nsight Compute)",
            &wording::profile_lines(p),
        );
    }
    o
}

/// A section of the text report's lines, kept as lines (their columns line up in a monospace block).
fn lines_section(o: &mut String, id: &str, heading: &str, lines: &[String]) {
    let _ = writeln!(o, "<section id=\"{id}\">\n<h2>{heading}</h2>\n<pre>");
    for line in lines {
        let _ = writeln!(o, "{}", esc(line));
    }
    let _ = writeln!(o, "</pre>\n</section>");
}

/// The budget's prediction beside what the snapshot holds, per category (`analyze --model …`).
fn budget_table(o: &mut String, c: &crate::analysis::prediction::Comparison) {
    let _ = writeln!(
        o,
        "<h3>Predicted vs measured <span class=\"dim\">(budget for {}: {})</span></h3>\n<table class=\"budget\">\n\
         <tr><th>category</th><th>predicted</th><th>measured</th><th>measured / predicted</th></tr>",
        esc(&c.model),
        esc(&c.run)
    );
    for r in &c.rows {
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&r.category.replace('_', " ")),
            bytes(r.predicted_bytes),
            bytes(r.measured_bytes),
            super::budget::ratio(r.ratio)
        );
    }
    if c.unknown_bytes > 0 {
        let _ = writeln!(
            o,
            "<tr><td>uncategorised</td><td class=\"num\">–</td><td class=\"num\">{}</td><td>could belong to any row</td></tr>",
            bytes(c.unknown_bytes)
        );
    }
    let _ = writeln!(
        o,
        "<tr><td>outside PyTorch</td><td class=\"num\">{}</td><td class=\"num\">–</td><td>CUDA context, NCCL: not in a snapshot</td></tr>\n</table>",
        bytes(c.outside_allocator_bytes)
    );
}

/// `rules`: the findings on this GPU, named on the timeline at the moment they describe.
fn device(o: &mut String, d: &DeviceReport, tl: &Timeline, rules: &[&str]) {
    let moment = wording::moment_words(d.moment);
    let place = wording::place(d);
    let _ = writeln!(
        o,
        "<section class=\"device\" id=\"gpu-{}\">\n<h2>GPU {} {moment} <span class=\"dim\">({})</span></h2>",
        d.device,
        d.device,
        esc(&place)
    );
    if let Some(chart) = &d.chart {
        timeline(o, d, chart, rules);
    }
    if let Some(oom) = &d.oom {
        let _ = writeln!(o, "<div class=\"oom-block\">");
        for (i, (hl, line)) in wording::oom_lines(oom).into_iter().enumerate() {
            let line = match hl {
                Highlight::Culprit(words) => format!("{words} <code>{}</code>", esc(&line)),
                _ => esc(&line),
            };
            let label = if i == 0 { "<span class=\"oom\">OOM</span> " } else { "" };
            let _ = writeln!(o, "<p>{label}{line}</p>");
        }
        for line in wording::pinning_lines(d) {
            let _ = writeln!(o, "<p class=\"pin\">{}</p>", esc(&line));
        }
        let _ = writeln!(o, "</div>");
    }
    if let Some(obs) = &d.observed {
        for line in wording::observed_lines(obs, d) {
            let _ = writeln!(o, "<p>{}</p>", esc(&line));
        }
    }
    if d.source != ReportSource::Text {
        let _ = writeln!(o, "<table class=\"totals\">");
        let rows = [
            ("allocated", bytes(d.allocated_bytes)),
            ("reserved", bytes(d.reserved_bytes)),
            ("active", bytes(d.active_bytes)),
            (
                "cached free",
                format!(
                    "{} ({} of reserved)",
                    bytes(d.reserved_unallocated_bytes),
                    percent(d.reserved_unallocated_bytes, d.reserved_bytes)
                ),
            ),
            ("largest free block", bytes(d.largest_free_block_bytes)),
            ("segments, blocks", format!("{}, {}", d.segments, d.blocks)),
        ];
        for (k, v) in rows {
            let _ = writeln!(o, "<tr><td>{k}</td><td class=\"num\">{}</td></tr>", esc(&v));
        }
        if let Some(p) = &d.peak {
            let _ = writeln!(
                o,
                "<tr><td>peak allocated</td><td class=\"num\">{} ({})</td></tr>\n<tr><td>peak reserved</td><td class=\"num\">{}</td></tr>",
                bytes(p.allocated_bytes),
                esc(&when(p.event_index, p.time_us, d.trace.first_time_us)),
                bytes(p.reserved_bytes)
            );
        }
        let _ = writeln!(o, "</table>");
    }
    if let Some(map) = &d.segment_map {
        segments(o, d, map);
    }
    if !d.by_category.is_empty() {
        let _ = writeln!(o, "<h3>By kind</h3>\n<table>");
        for c in &d.by_category {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                esc(&c.category.replace('_', " ")),
                bytes(c.bytes),
                percent(c.bytes, d.allocated_bytes),
                esc(&super::wording::known_by(c).unwrap_or_default())
            );
        }
        let _ = writeln!(o, "</table>");
    }
    if !d.by_stack.is_empty() && d.allocated_bytes > 0 {
        let _ = writeln!(o, "<h3>Live memory by allocating stack</h3>\n<table class=\"stacks\">");
        for g in &d.by_stack {
            let _ = writeln!(
                o,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">×{}</td><td class=\"mono\">{}</td></tr>",
                bytes(g.bytes),
                percent(g.bytes, d.allocated_bytes),
                g.count,
                esc(&g.callers)
            );
        }
        let _ = writeln!(o, "</table>");
    }
    super::html_flame::section(o, d, tl);
    if let Some(c) = &d.budget {
        budget_table(o, c);
    }
    if !d.top_allocations.is_empty() {
        let _ = writeln!(o, "<h3>Largest live allocations</h3>");
        for a in &d.top_allocations {
            let age = a.age_us.map_or(String::new(), |us| format!(" · age {}", duration_us(us)));
            let _ = writeln!(
                o,
                "<details class=\"allocation\"><summary><code>{}</code> {} <span class=\"dim\">{}{}</span></summary>\n<pre>",
                bytes(a.bytes),
                esc(&a.culprit),
                esc(&stream_name(a.stream)),
                esc(&age)
            );
            for (lib, line) in folded(tl, a.stack_id, 8) {
                let _ = writeln!(
                    o,
                    "{}",
                    if lib { format!("<span class=\"dim\">{}</span>", esc(&line)) } else { esc(&line) }
                );
            }
            let _ = writeln!(o, "</pre></details>");
        }
    }
    for n in &d.notes {
        let _ = writeln!(o, "<p class=\"dim\">Note: {}</p>", esc(n));
    }
    let _ = writeln!(o, "</section>");
}

/// The largest segments, each a bar of its blocks (allocated, waiting for another stream, free), to one scale; at an
/// OOM, the failed request drawn beside the largest free block.
fn segments(o: &mut String, d: &DeviceReport, map: &SegmentMap) {
    use crate::timeline::BlockState;
    let oom = d.oom.as_ref().and_then(|o| o.requested_bytes);
    // One scale for the segments and the request, which may be larger than any segment; room for its label.
    let widest = map.segments.iter().map(|s| s.size).chain(oom).max().unwrap_or(1).max(1) as f64;
    let (label_w, bar_w, row) = (130.0, W - 210.0, 16.0);
    let extra = if oom.is_some() { 3.0 * row + 10.0 } else { 0.0 };
    let h = row * map.segments.len() as f64 + extra + 4.0;
    let shown = if map.total_segments > map.segments.len() {
        format!("the {} largest of {} segments", map.segments.len(), map.total_segments)
    } else {
        format!("{} segments", map.total_segments)
    };
    let _ = writeln!(
        o,
        "<h3>Segments at the moment <span class=\"dim\">({shown}, to one scale)</span></h3>\n<figure>\n<svg class=\"segments\" viewBox=\"0 0 {W} {h:.0}\" role=\"img\" aria-label=\"segments and their blocks\">"
    );
    let scale = |b: u64| bar_w * b as f64 / widest;
    for (i, seg) in map.segments.iter().enumerate() {
        let y = i as f64 * row;
        let _ = writeln!(
            o,
            "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            label_w - 6.0,
            y + 11.5,
            bytes(seg.size)
        );
        let mut x = label_w;
        for (size, state) in &seg.runs {
            let (class, what) = match state {
                BlockState::ActiveAllocated => ("blk-alloc", "allocated"),
                BlockState::ActivePendingFree => ("blk-pending", "freed, waiting for another stream"),
                BlockState::Inactive => ("blk-free", "free"),
            };
            let w = scale(*size);
            let _ = writeln!(
                o,
                "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\"><title>{} {what} in a {} segment at 0x{:x}{}</title></rect>",
                y + 2.0,
                w.max(0.5),
                row - 4.0,
                bytes(*size),
                bytes(seg.size),
                seg.address,
                if seg.expandable { " (expandable)" } else { "" }
            );
            x += w;
        }
        for &(offset, size) in &seg.pinning {
            let _ = writeln!(
                o,
                "<rect class=\"blk-pin\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\"><title>{} live, pinning this \
                 segment's free memory</title></rect>",
                label_w + scale(offset),
                y + 1.0,
                scale(size).max(0.5),
                row - 2.0,
                bytes(size)
            );
        }
    }
    if let Some(req) = oom {
        let y = map.segments.len() as f64 * row + 10.0;
        for (k, (label, size, class)) in
            [("failed request", req, "blk-req"), ("largest free block", d.largest_free_block_bytes, "blk-free")]
                .into_iter()
                .enumerate()
        {
            let yy = y + k as f64 * (row + 2.0);
            let _ = writeln!(
                o,
                "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text><rect class=\"{class}\" x=\"{label_w}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{:.1}\"><title>{label}: {}</title></rect><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                label_w - 6.0,
                yy + 11.5,
                yy + 2.0,
                scale(size).max(0.5),
                row - 4.0,
                bytes(size),
                label_w + scale(size).max(0.5) + 6.0,
                yy + 11.5,
                bytes(size)
            );
        }
    }
    let _ = writeln!(
        o,
        "</svg>\n<figcaption class=\"legend dim\"><span><i class=\"sw blk-alloc\"></i>allocated</span><span><i class=\"sw blk-pending\"></i>freed, waiting for another stream</span><span><i class=\"sw blk-free\"></i>free (cached)</span>{}{}</figcaption>\n</figure>",
        if oom.is_some() { "<span><i class=\"sw blk-req\"></i>the failed request</span>" } else { "" },
        if map.segments.iter().any(|s| !s.pinning.is_empty()) {
            "<span><i class=\"sw blk-pin\"></i>live blocks pinning free memory</span>"
        } else {
            ""
        }
    );
}

/// A step line through one value per bucket (`ys`, already in SVG units), as polygon points: only the corners, so
/// a flat stretch of a thousand buckets is two points. `reverse` walks it right to left (a band's lower edge).
fn steps(out: &mut String, x: &dyn Fn(usize) -> f64, ys: &[f64], reverse: bool) {
    let n = ys.len();
    if n == 0 {
        return;
    }
    let mut pt = |xv: f64, yv: f64| {
        let _ = write!(out, "{xv:.1},{yv:.1} ");
    };
    if !reverse {
        pt(x(0), ys[0]);
        for i in 1..n {
            if ys[i] != ys[i - 1] {
                pt(x(i), ys[i - 1]);
                pt(x(i), ys[i]);
            }
        }
        pt(x(n), ys[n - 1]);
    } else {
        pt(x(n), ys[n - 1]);
        for i in (1..n).rev() {
            if ys[i] != ys[i - 1] {
                pt(x(i), ys[i]);
                pt(x(i), ys[i - 1]);
            }
        }
        pt(x(0), ys[0]);
    }
}

/// Width and height of the chart's drawing area, in SVG units.
const W: f64 = 1200.0;
const H: f64 = 260.0;
const LEFT: f64 = 70.0;
const BOTTOM: f64 = 24.0;

/// Allocated (area) and reserved (line) over the trace, memory outside PyTorch when nvidia-smi saw it, the OOM and
/// the peak marked, each bucket a hover target. The plot sits in a nested `<svg>` (which clips it) inside a group
/// the page's script scales and shifts to zoom and pan; labels that must not stretch carry their unzoomed `data-x`.
fn timeline(o: &mut String, d: &DeviceReport, c: &Chart, rules: &[&str]) {
    let n = c.alloc_max.len().max(1);
    // Memory outside PyTorch, placed by time on the buckets (only samples inside the trace).
    let outside: Vec<(usize, u64)> = d
        .observed
        .as_ref()
        .map(|obs| {
            obs.non_pytorch_series.iter().filter_map(|&(t, b)| Some((c.bucket_at(t)?, b.max(0) as u64))).collect()
        })
        .unwrap_or_default();
    let top = (c.top().max(outside.iter().map(|p| p.1).max().unwrap_or(0)) as f64 * 1.05).max(1.0);
    let x = |i: usize| LEFT + (W - LEFT) * i as f64 / n as f64;
    let y = |v: u64| H - BOTTOM - (H - BOTTOM - 8.0) * v as f64 / top;
    let _ = writeln!(
        o,
        "<figure>\n<svg class=\"timeline\" viewBox=\"0 0 {W} {H}\" data-left=\"{LEFT}\" data-w=\"{W}\" data-events=\"{}\" \
         role=\"img\" aria-label=\"allocated and reserved memory over the trace\">\n\
         <svg x=\"{LEFT}\" y=\"0\" width=\"{}\" height=\"{H}\" viewBox=\"{LEFT} 0 {} {H}\"><g class=\"zoom\">",
        c.events,
        W - LEFT,
        W - LEFT
    );
    // The allocated band: up along the highest value of each bucket, back along the lowest.
    let mut area = String::new();
    let ys = |v: &mut dyn Iterator<Item = u64>| -> Vec<f64> { v.map(|b| (y(b) * 10.0).round() / 10.0).collect() };
    steps(&mut area, &x, &ys(&mut c.alloc_max.iter().copied()), false);
    steps(&mut area, &x, &ys(&mut c.alloc_min.iter().copied()), true);
    if c.by_category.len() == n && !c.categories.is_empty() {
        // Stacked by category at each bucket's highest point, the band's lowest edge drawn over it.
        let mut below = vec![0u64; n];
        for (k, cat) in c.categories.iter().enumerate() {
            let mut pts = String::new();
            steps(&mut pts, &x, &ys(&mut (0..n).map(|i| below[i] + c.by_category[i][k])), false);
            steps(&mut pts, &x, &ys(&mut below.iter().copied()), true);
            for (i, b) in below.iter_mut().enumerate() {
                *b += c.by_category[i][k];
            }
            let _ = writeln!(
                o,
                "<polygon class=\"cat cat-{cat}\" points=\"{}\"><title>{}</title></polygon>",
                pts.trim_end(),
                cat.replace('_', " ")
            );
        }
        let mut low = String::new();
        steps(&mut low, &x, &ys(&mut c.alloc_min.iter().copied()), false);
        let _ = writeln!(o, "<polyline class=\"low\" points=\"{}\"/>", low.trim_end());
    } else {
        let _ = writeln!(o, "<polygon class=\"alloc\" points=\"{}\"/>", area.trim_end());
    }
    let mut res = String::new();
    steps(&mut res, &x, &ys(&mut c.reserved_max.iter().copied()), false);
    let _ = writeln!(o, "<polyline class=\"res\" points=\"{}\"/>", res.trim_end());
    if !outside.is_empty() {
        let points: Vec<String> =
            outside.iter().map(|&(i, b)| format!("{:.1},{:.1}", (x(i) + x(i + 1)) / 2.0, y(b))).collect();
        let _ = writeln!(o, "<polyline class=\"outside\" points=\"{}\"/>", points.join(" "));
    }
    let mut labels = String::new();
    let mut mark = |event: Option<u32>, color: &str, label: &str, row: f64| {
        let Some(e) = event else { return };
        let bx = x(c.bucket_of(e)) + (W - LEFT) / n as f64 / 2.0;
        // Near the right edge the label goes to the line's left, so it is not cut off.
        let (dx, anchor) = if bx > W - 80.0 { (-4.0, "end") } else { (4.0, "start") };
        let _ = writeln!(
            o,
            "<line x1=\"{bx:.1}\" y1=\"8\" x2=\"{bx:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\"/>",
            y(0),
        );
        // The findings are about the report's moment: they are named at its mark.
        let label = if event == d.event_index && !rules.is_empty() {
            format!("{label} · {}", esc(&rules.join(", ")))
        } else {
            label.to_string()
        };
        let _ = writeln!(
            labels,
            "<text x=\"{:.1}\" data-x=\"{:.1}\" y=\"{row}\" text-anchor=\"{anchor}\" style=\"fill:{color}\">{label}</text>",
            bx + dx,
            bx + dx
        );
    };
    mark(d.oom.as_ref().and_then(|oom| oom.event_index), "var(--err)", "OOM", 18.0);
    mark(d.peak.as_ref().and_then(|p| p.event_index), "var(--res)", "peak", 32.0);
    // At a fragmentation OOM, the moments the free memory was most in pieces.
    for (k, m) in d.pinning.iter().flat_map(|p| &p.worst_moments).enumerate() {
        let label = if k == 0 { "most fragmented" } else { "fragmented" };
        mark(Some(m.event_index), "#d97706", label, 46.0 + 14.0 * k as f64);
    }
    if let Some(e) = d.event_index.filter(|_| matches!(d.moment, Moment::Time)) {
        mark(Some(e), "var(--fg)", "the moment", 46.0);
    }
    // Hover: each bucket's figures.
    let outside_at: rustc_hash::FxHashMap<usize, u64> = outside.iter().copied().collect();
    for i in 0..n {
        let first = i * c.per;
        let last = ((i + 1) * c.per).min(c.events).saturating_sub(1);
        let alloc = if c.alloc_min[i] == c.alloc_max[i] {
            bytes(c.alloc_max[i])
        } else {
            format!("{}–{}", bytes(c.alloc_min[i]), bytes(c.alloc_max[i]))
        };
        let events = if first == last { format!("event {first}") } else { format!("events {first}–{last}") };
        let time = match (c.time_us.get(i).copied().flatten(), d.trace.first_time_us) {
            (Some(t), Some(t0)) => format!(" ({} in)", duration_us(t - t0)),
            _ => String::new(),
        };
        let out = outside_at.get(&i).map_or(String::new(), |b| format!(", outside PyTorch {}", bytes(*b)));
        let split = c.by_category.get(i).map_or(String::new(), |v| {
            let mut parts: Vec<(u64, &str)> =
                v.iter().zip(&c.categories).filter(|(b, _)| **b > 0).map(|(b, k)| (*b, *k)).collect();
            parts.sort_by_key(|p| std::cmp::Reverse(p.0));
            let words: Vec<String> =
                parts.iter().take(4).map(|(b, k)| format!("{} {}", k.replace('_', " "), bytes(*b))).collect();
            if words.is_empty() {
                String::new()
            } else {
                format!(" — at the highest: {}", words.join(", "))
            }
        });
        let _ = writeln!(
            o,
            "<rect class=\"hit\" x=\"{:.1}\" y=\"0\" width=\"{:.2}\" height=\"{:.1}\"><title>{events}{time}: allocated {alloc}, reserved {}{out}{split}</title></rect>",
            x(i),
            (W - LEFT) / n as f64,
            y(0),
            bytes(c.reserved_max[i])
        );
    }
    let _ = writeln!(o, "</g>\n{labels}</svg>");
    // Axis: zero, the top, and the events shown (the script rewrites them as it zooms).
    let _ = writeln!(
        o,
        "<line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{W}\" y2=\"{:.1}\" stroke=\"currentColor\" stroke-opacity=\".3\"/>\
         <text x=\"4\" y=\"{:.1}\">0</text><text x=\"4\" y=\"14\">{}</text><text class=\"ev0\" x=\"{LEFT}\" y=\"{:.1}\">event 0</text>\
         <text class=\"ev1\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{} events{}</text>",
        y(0),
        y(0),
        y(0),
        bytes(top as u64),
        H - 6.0,
        W - 4.0,
        H - 6.0,
        c.events,
        d.trace.span_us.map_or(String::new(), |s| format!(", {}", duration_us(s)))
    );
    // Between the ends: bytes at a quarter, half and three quarters of the height, and the events under a quarter,
    // half and three quarters of the width (the script renumbers those as it zooms).
    for f in [0.25, 0.5, 0.75] {
        let v = (top * f) as u64;
        let _ = writeln!(
            o,
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{W}\" y2=\"{yy:.1}\" stroke=\"currentColor\" stroke-opacity=\".12\"/>\
             <text x=\"4\" y=\"{:.1}\">{}</text>\
             <text class=\"evm\" data-f=\"{f}\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">event {}</text>",
            y(v) + 4.0,
            bytes(v),
            LEFT + (W - LEFT) * f,
            H - 6.0,
            (c.events as f64 * f) as u64,
            yy = y(v),
        );
    }
    let outside_legend = if outside.is_empty() {
        ""
    } else {
        "<span><i class=\"sw\" style=\"background:#7c3aed\"></i>outside PyTorch (nvidia-smi used − reserved)</span>"
    };
    let allocated_legend = if c.categories.is_empty() {
        format!(
            "<span><i class=\"sw\" style=\"background:var(--alloc)\"></i>allocated (lowest to highest in each of {n} \
             steps of {} events)</span>",
            c.per
        )
    } else {
        let mut l = String::new();
        // Only the categories this GPU had: a swatch for one it never held would be a colour with nothing drawn.
        for (k, cat) in c.categories.iter().enumerate() {
            if c.by_category.iter().any(|v| v.get(k).is_some_and(|&b| b > 0)) {
                let _ = write!(l, "<span><i class=\"sw cat-{cat}\"></i>{}</span>", cat.replace('_', " "));
            }
        }
        let _ = write!(
            l,
            "<span>(allocated at the highest point of each of {n} steps of {} events; the line under it: the lowest)</span>",
            c.per
        );
        l
    };
    let _ = writeln!(
        o,
        "</svg>\n<figcaption class=\"legend dim\">{allocated_legend}<span><i class=\"sw\" style=\"background:var(--res)\"></i>reserved</span>{outside_legend}\
         <span>wheel to zoom, drag to pan, double-click to reset; hover for the numbers</span></figcaption>\n</figure>"
    );
}
