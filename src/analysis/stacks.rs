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
        if self.line > 0 {
            format!("{}:{} in {}", self.short_path(), self.line, self.name)
        } else {
            format!("{} in {}", self.short_path(), self.name)
        }
    }

    /// The frame in a few words: a Python frame as [`FrameView::short`], a C++ one as its function's qualified name
    /// without return type, arguments or template arguments (`at::cuda::getNewWorkspace`).
    pub fn word(&self) -> String {
        if self.filename.ends_with(".py") {
            return self.short();
        }
        if let Some(op) = aten_op(&self.name) {
            return op;
        }
        let head = self.name.split('(').next().unwrap_or(&self.name);
        let name = head.split_whitespace().last().unwrap_or(head);
        let name = name.split('<').next().unwrap_or(name);
        if name.is_empty() {
            self.short()
        } else {
            name.to_string()
        }
    }

    /// The file's path cut to its last two parts: `dir/file.py`.
    pub fn short_path(&self) -> String {
        let path = self.filename.replace('\\', "/");
        let parts: Vec<&str> = path.rsplit('/').take(2).collect();
        parts.into_iter().rev().collect::<Vec<_>>().join("/")
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
    if let Some(op) = frames.iter().find_map(|f| aten_op(&f.name)) {
        return format!("{op} (C++ frames only, no Python frame: typically the backward pass)");
    }
    let mut s = frames[0].short();
    if s.len() > 100 {
        s.truncate(s.char_indices().nth(97).map_or(s.len(), |(i, _)| i));
        s.push('…');
    }
    s
}

/// The ATen operator the stack went through last (innermost), if its C++ frames were recorded: what tells apart two
/// stacks whose Python frames are the same line.
pub fn innermost_op(tl: &Timeline, stack: StackId) -> Option<String> {
    stack_frames(tl, stack).iter().find_map(|f| aten_op(&f.name))
}

/// `aten::bmm` from a native frame such as `at::_ops::bmm::call(...)`.
fn aten_op(name: &str) -> Option<String> {
    let i = name.find("at::_ops::")?;
    let op = &name[i + "at::_ops::".len()..];
    Some(format!("aten::{}", op.split("::").next().unwrap_or(op)))
}

/// The allocation site and its callers in the user's own code, innermost first: `allocate (backend.py:195) ←
/// init_weight (flex_opt.py:139)`. Two stacks with the same allocation site are told apart by their callers.
pub fn user_chain(tl: &Timeline, stack: StackId, depth: usize) -> String {
    let frames = stack_frames(tl, stack);
    let user: Vec<&FrameView> = frames.iter().filter(|f| !f.library).take(depth).collect();
    if user.is_empty() {
        return culprit(tl, stack);
    }
    user.iter()
        .map(|f| {
            let file = f.filename.replace('\\', "/");
            let file = file.rsplit('/').next().unwrap_or(&file).to_string();
            format!("{} ({file}:{})", f.name, f.line)
        })
        .collect::<Vec<_>>()
        .join(" ← ")
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
            // The innermost Python library frame says what kind of allocation this is; a run of native frames is
            // best named by its ATen operator.
            let run = &frames[start..i];
            let label = match run.iter().find(|f| f.filename.ends_with(".py")) {
                Some(f) => f.short(),
                None => run.iter().find_map(|f| aten_op(&f.name)).unwrap_or_else(|| "C++ code".into()),
            };
            let text = if n == 1 { label } else { format!("{label} (+{} library frames)", n - 1) };
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

/// Where the user's own line only calls into a framework (`trainer.train()`, `model.generate(…)`), the model code
/// that allocated: the innermost `forward` of a library's Python file outside torch itself (`modeling_llama.py:68
/// in forward`, a timm or torch-geometric layer). None when the user's line is the model's own code.
fn model_frame(frames: &[FrameView]) -> Option<String> {
    let user = frames.iter().position(|f| !f.library)?;
    frames[..user]
        .iter()
        .find(|f| {
            let path = f.filename.replace('\\', "/");
            // Inside an installed package the package is what follows site-packages (a venv may live under
            // /opt/torch/); torch's own modules (nn.Linear) are the operator, not the model.
            let package = ["site-packages/", "dist-packages/"]
                .iter()
                .find_map(|m| path.rsplit_once(m).map(|(_, rest)| rest))
                .unwrap_or(&path);
            f.name == "forward"
                && path.ends_with(".py")
                && !package.starts_with("torch/")
                && !path.contains("/torch/nn/")
        })
        .map(FrameView::short)
}

/// The innermost frame of the user's own code (else the culprit's), as `(short file, line, function)`.
fn site(frames: &[FrameView]) -> Option<(String, i64, String)> {
    let f = frames.iter().find(|f| !f.library).or_else(|| frames.iter().find(|f| f.filename.ends_with(".py")))?;
    Some((f.short_path(), f.line, f.name.clone()))
}

/// The lines that allocated from these stacks, grouped by file and function, at most `max` groups:
/// `model.py:41, :43 and :47 in forward; train.py:90 in step`.
pub fn sites(tl: &Timeline, stacks: &[StackId], max: usize) -> String {
    // (file, function) of the user's line → its line numbers, and the model code it called into.
    type Group = ((String, String), Vec<i64>, Vec<String>);
    let mut groups: Vec<Group> = Vec::new();
    for &s in stacks {
        let frames = stack_frames(tl, s);
        let Some((file, line, name)) = site(&frames) else { continue };
        let model = model_frame(&frames);
        let g = match groups.iter_mut().position(|g| g.0 == (file.clone(), name.clone())) {
            Some(i) => &mut groups[i],
            None => {
                groups.push(((file, name), Vec::new(), Vec::new()));
                groups.last_mut().expect("pushed")
            }
        };
        if !g.1.contains(&line) {
            g.1.push(line);
        }
        if let Some(m) = model.filter(|m| !g.2.contains(m)) {
            g.2.push(m);
        }
    }
    if groups.is_empty() {
        return "(no stack recorded)".into();
    }
    let more = groups.len().saturating_sub(max);
    let mut parts: Vec<String> = groups
        .into_iter()
        .take(max)
        .map(|((file, name), mut lines, models)| {
            lines.sort_unstable();
            let ls: Vec<String> = lines
                .iter()
                .enumerate()
                .filter_map(|(i, &l)| match (i, l > 0) {
                    (0, true) => Some(format!("{file}:{l}")),
                    (0, false) => Some(file.clone()),
                    (_, true) => Some(format!(":{l}")),
                    (_, false) => None,
                })
                .collect();
            let joined = match ls.len() {
                1 => ls[0].clone(),
                n => format!("{} and {}", ls[..n - 1].join(", "), ls[n - 1]),
            };
            let via = match models.len() {
                0 => String::new(),
                1 | 2 => format!(" via {}", models.join(" and ")),
                n => format!(" via {}, {} and {} more", models[0], models[1], n - 2),
            };
            format!("{joined} in {name}{via}")
        })
        .collect();
    if more > 0 {
        parts.push(format!("and {more} more"));
    }
    parts.join("; ")
}

/// The innermost line of the user's code that every one of these allocations was made under, other than the
/// allocating line itself: the loop body that keeps calling them (`evaluate.py:77 in evaluate`).
pub fn common_caller(tl: &Timeline, stacks: &[StackId]) -> Option<String> {
    let chains: Vec<Vec<FrameView>> = stacks
        .iter()
        .map(|&s| stack_frames(tl, s).into_iter().filter(|f| !f.library).rev().collect::<Vec<_>>())
        .filter(|c| !c.is_empty())
        .collect();
    let first = chains.first()?;
    let same = |a: &FrameView, b: &FrameView| a.filename == b.filename && a.line == b.line && a.name == b.name;
    let mut n = first.len();
    for c in &chains[1..] {
        n = n.min(c.iter().zip(first).take_while(|(a, b)| same(a, b)).count());
    }
    // The common part must stop short of each chain's own allocating line.
    n = chains.iter().fold(n, |n, c| n.min(c.len() - 1));
    (n > 0).then(|| first[n - 1].short())
}
