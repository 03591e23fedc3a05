//! Stacks for people: the user's own frames first, library frames folded, recording machinery dropped.

use crate::timeline::stacks::{is_library_frame, is_noise_frame, StackId};
use crate::timeline::Timeline;

/// One frame of a stack, ready to show.
#[derive(Clone, Debug)]
pub struct FrameView {
    pub filename: String,
    pub line: i64,
    pub name: String,
    pub library: bool,
}

impl FrameView {
    /// `file:line:function`, the stable form used in JSON.
    pub fn full(&self) -> String {
        format!("{}:{}:{}", self.filename, self.line, self.name)
    }

    /// `dir/file.py:line in function`, with the path cut to its last two parts.
    pub fn short(&self) -> String {
        let path = self.filename.replace('\\', "/");
        let parts: Vec<&str> = path.rsplit('/').take(2).collect();
        let short: Vec<&str> = parts.into_iter().rev().collect();
        if self.line > 0 {
            format!("{}:{} in {}", short.join("/"), self.line, self.name)
        } else {
            format!("{} in {}", short.join("/"), self.name)
        }
    }
}

/// The frames of a stack, innermost first, without the recording machinery.
pub fn stack_frames(tl: &Timeline, stack: StackId) -> Vec<FrameView> {
    tl.stacks
        .stack(stack)
        .iter()
        .map(|&f| tl.stacks.frame(f))
        .filter_map(|f| {
            let filename = tl.strings.get(f.filename);
            let name = tl.strings.get(f.name);
            (!is_noise_frame(filename, name)).then(|| FrameView {
                filename: filename.to_string(),
                line: f.line,
                name: name.to_string(),
                library: is_library_frame(filename),
            })
        })
        .collect()
}

/// Who to blame for an allocation, in a few words: the innermost frame of the user's own code, else the innermost
/// Python frame, else the innermost frame.
pub fn culprit(tl: &Timeline, stack: StackId) -> String {
    let frames = stack_frames(tl, stack);
    if frames.is_empty() {
        return "(no stack recorded)".into();
    }
    if let Some(f) = frames.iter().find(|f| !f.library) {
        return f.short();
    }
    if let Some(f) = frames.iter().find(|f| f.filename.ends_with(".py")) {
        return f.short();
    }
    // Native frames only (typically the backward pass on the autograd thread): name the ATen operator.
    for f in &frames {
        if let Some(i) = f.name.find("at::_ops::") {
            let op = &f.name[i + "at::_ops::".len()..];
            let op = op.split("::").next().unwrap_or(op);
            return format!("aten::{op} (native frames only)");
        }
    }
    frames[0].short()
}

/// A stack shortened for reading: the user's frames shown, each run of library frames folded into one line.
pub fn folded(tl: &Timeline, stack: StackId, max_lines: usize) -> Vec<(bool, String)> {
    let frames = stack_frames(tl, stack);
    let mut out: Vec<(bool, String)> = Vec::new();
    let mut i = 0;
    while i < frames.len() && out.len() < max_lines {
        if frames[i].library {
            let start = i;
            while i < frames.len() && frames[i].library {
                i += 1;
            }
            let n = i - start;
            // The innermost library frame is the one that says what kind of allocation this is.
            let shown = frames[start..i]
                .iter()
                .find(|f| f.filename.ends_with(".py"))
                .unwrap_or(&frames[start]);
            let text = if n == 1 {
                shown.short()
            } else {
                format!("{} (+{} library frames)", shown.short(), n - 1)
            };
            out.push((true, text));
        } else {
            out.push((false, frames[i].short()));
            i += 1;
        }
    }
    if i < frames.len() {
        out.push((true, format!("… {} more frames", frames.len() - i)));
    }
    out
}
