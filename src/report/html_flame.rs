//! Live memory at the moment as an icicle graph: the whole live memory on top, then each caller's share, down to
//! the frame that allocated. Drawn in Rust as SVG (it reads without a script); the page's script only re-lays it
//! out when a frame is clicked (zoom) or the graph double-clicked (back to the whole).

use std::fmt::Write;

use rustc_hash::FxHashMap;

use super::html::esc;
use crate::analysis::stacks::stack_frames;
use crate::analysis::DeviceReport;
use crate::timeline::Timeline;
use crate::units::{bytes, percent};

/// Drawing width in SVG units, and one row's height.
pub const WIDTH: f64 = 1200.0;
const ROW: f64 = 17.0;
/// Rows below the root: deeper frames are counted in their ancestor at this depth.
const MAX_DEPTH: usize = 64;
/// Frames drawn at most: the widest ones (a frame is never narrower than its children, so what is kept is a tree).
const MAX_NODES: usize = 6000;
/// Narrower than this share of the whole is not drawn even when zoomed (a pixel at 10× on a wide screen).
const MIN_SHARE: f64 = 1e-5;

struct Node {
    label: String,
    title: String,
    /// 0: the root, 1: a library frame, 2…: the user's frames, coloured by file.
    tone: u8,
    bytes: u64,
    children: Vec<usize>,
    depth: usize,
    a: f64,
    b: f64,
}

/// How many characters of a label fit in `w` units (monospace-ish 11px text).
pub fn fits(w: f64) -> usize {
    if w < 6.0 {
        0
    } else {
        ((w - 6.0) / 6.6).floor() as usize
    }
}

fn shown(label: &str, w: f64) -> String {
    let n = fits(w);
    let count = label.chars().count();
    if n < 3 {
        String::new()
    } else if count <= n {
        label.to_string()
    } else {
        label.chars().take(n - 1).chain(std::iter::once('…')).collect()
    }
}

fn tone_of(file: &str) -> u8 {
    // A file keeps its colour across GPUs and reports: a hash of its name, not its order.
    let h = file.bytes().fold(2166136261u32, |h, b| (h ^ b as u32).wrapping_mul(16777619));
    2 + (h % 6) as u8
}

/// The icicle graph of `d`'s live memory, with its heading; nothing when nothing is live.
pub fn section(o: &mut String, d: &DeviceReport, tl: &Timeline) {
    let total: u64 = d.live_stacks.iter().map(|s| s.1).sum();
    if total == 0 {
        return;
    }
    let mut nodes = vec![Node {
        label: format!("all live memory: {}", bytes(total)),
        title: format!("all live memory at the moment: {} in {} stacks", bytes(total), d.live_stacks.len()),
        tone: 0,
        bytes: total,
        children: Vec::new(),
        depth: 0,
        a: 0.0,
        b: 1.0,
    }];
    let mut index: FxHashMap<(usize, String), usize> = FxHashMap::default();
    let mut any_frames = false;
    for &(stack, b) in &d.live_stacks {
        let frames = stack_frames(tl, stack);
        any_frames |= !frames.is_empty();
        let mut path: Vec<(String, String, u8)> = frames
            .iter()
            .rev()
            .map(|f| {
                let label = if f.line > 0 {
                    format!("{} ({}:{})", f.name, f.short_path(), f.line)
                } else {
                    format!("{} ({})", f.name, f.short_path())
                };
                (f.full(), label, if f.library { 1 } else { tone_of(&f.filename) })
            })
            .collect();
        if path.is_empty() {
            path.push(("(no stack)".into(), "(no stack recorded)".into(), 1));
        }
        let mut cur = 0;
        for (depth, (key, label, tone)) in path.into_iter().enumerate().take(MAX_DEPTH) {
            let next = *index.entry((cur, key)).or_insert_with(|| {
                nodes.push(Node {
                    title: label.clone(),
                    label,
                    tone,
                    bytes: 0,
                    children: Vec::new(),
                    depth: depth + 1,
                    a: 0.0,
                    b: 0.0,
                });
                let id = nodes.len() - 1;
                nodes[cur].children.push(id);
                id
            });
            nodes[next].bytes += b;
            cur = next;
        }
    }
    if !any_frames {
        // Nothing but "(no stack recorded)": the table above says it, and a picture of one bar says nothing more.
        return;
    }
    // Lay out: each node's children side by side from its left edge, largest first.
    let mut order = vec![0usize];
    let mut i = 0;
    while i < order.len() {
        let id = order[i];
        i += 1;
        let mut kids = std::mem::take(&mut nodes[id].children);
        kids.sort_by(|&x, &y| nodes[y].bytes.cmp(&nodes[x].bytes).then(nodes[x].label.cmp(&nodes[y].label)));
        let mut at = nodes[id].a;
        for &k in &kids {
            let w = nodes[k].bytes as f64 / total as f64;
            nodes[k].a = at;
            nodes[k].b = at + w;
            at += w;
        }
        order.extend(kids.iter().copied());
        nodes[id].children = kids;
    }
    let mut drawn: Vec<usize> = (0..nodes.len()).filter(|&k| nodes[k].b - nodes[k].a >= MIN_SHARE).collect();
    let left_out = if drawn.len() > MAX_NODES {
        drawn.sort_by(|&x, &y| nodes[y].bytes.cmp(&nodes[x].bytes).then(x.cmp(&y)));
        drawn.truncate(MAX_NODES);
        drawn.sort_unstable();
        nodes.len() - MAX_NODES
    } else {
        nodes.len() - drawn.len()
    };
    let depth = drawn.iter().map(|&k| nodes[k].depth).max().unwrap_or(0) + 1;
    let h = depth as f64 * ROW;
    let _ = writeln!(
        o,
        "<h3>Live memory by allocating stack, as a graph <span class=\"dim\">(callers above, the allocating frame \
         at the bottom; click a frame to zoom, double-click to see all)</span></h3>\n<figure>\n<svg class=\"flame\" \
         data-w=\"{WIDTH}\" viewBox=\"0 0 {WIDTH} {h:.0}\" role=\"img\" aria-label=\"live memory by allocating stack\">"
    );
    for &k in &drawn {
        let n = &nodes[k];
        let (x, w) = (n.a * WIDTH, (n.b - n.a) * WIDTH);
        let y = (n.depth as f64) * ROW;
        let _ = writeln!(
            o,
            "<g class=\"fl t{}\" data-a=\"{:.6}\" data-b=\"{:.6}\" data-l=\"{}\"><title>{} — {} ({} of live memory)</title>\
             <rect x=\"{x:.1}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"{:.0}\"/><text x=\"{:.1}\" y=\"{:.0}\">{}</text></g>",
            n.tone,
            n.a,
            n.b,
            esc(&n.label),
            esc(&n.title),
            bytes(n.bytes),
            percent(n.bytes, total),
            (w - 1.0).max(0.5),
            ROW - 1.0,
            x + 3.0,
            y + 12.0,
            esc(&shown(&n.label, w))
        );
    }
    let more = if left_out > 0 { format!(" {left_out} frames too small to draw are left out.") } else { String::new() };
    let _ = writeln!(
        o,
        "</svg>\n<figcaption class=\"legend dim\"><span><i class=\"sw t2\"></i>your code (a colour per file)</span>\
         <span><i class=\"sw t1\"></i>libraries</span>Widths are live bytes at the moment.{more}</figcaption>\n</figure>"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_cut_to_the_width_with_an_ellipsis() {
        assert_eq!(shown("forward (nn/linear.py:12)", 1200.0), "forward (nn/linear.py:12)");
        assert_eq!(shown("forward (nn/linear.py:12)", 60.0), "forward…");
        assert_eq!(shown("forward", 20.0), "");
    }
}
