//! Sorts allocations into what they are for — parameter, gradient, optimizer state, activation, KV cache,
//! communication, compile — by the frames of the stack that allocated them. The patterns are data
//! (`rules/categories.toml`, extendable with `--rules DIR`); the first matching pattern, by priority, wins.

use regex::Regex;
use rustc_hash::FxHashMap;
use serde::Deserialize;

use crate::timeline::stacks::{FrameId, StackId, EMPTY_STACK};
use crate::timeline::Timeline;

/// The built-in patterns, `rules/categories.toml`: embedded here, by the layer that uses them (the rule files
/// beside it are the rule engine's).
pub const BUILTIN: &str = include_str!("../../rules/categories.toml");

/// Every category a pattern may name, in report order.
pub const CATEGORIES: [&str; 10] = [
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "temporary",
    "kv_cache",
    "communication",
    "compile",
    "user_tensor",
    "unknown",
];

#[derive(Deserialize)]
struct File {
    #[serde(rename = "category", default)]
    patterns: Vec<RawPattern>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    name: String,
    #[serde(default)]
    priority: i64,
    file: Option<String>,
    function: Option<String>,
    #[serde(default)]
    not_function: Option<String>,
    /// Only the innermost frame of the user's own code is tested (the allocating line itself).
    #[serde(default)]
    innermost: bool,
}

#[derive(Clone)]
struct Pattern {
    name: &'static str,
    priority: i64,
    file: Option<Regex>,
    function: Option<Regex>,
    /// The frame's function must not match this (a wrapper's `forward` in a communication file).
    not_function: Option<Regex>,
    innermost: bool,
}

/// A category file that does not compile: which file and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CategoryError(String);

impl From<String> for CategoryError {
    fn from(message: String) -> CategoryError {
        CategoryError(message)
    }
}

/// Compiled category patterns.
#[derive(Clone)]
pub struct Categorizer {
    patterns: Vec<Pattern>,
}

impl Categorizer {
    /// Compiles pattern files; later files' patterns are tried before earlier ones at equal priority.
    pub fn new(sources: &[(&str, &str)]) -> Result<Categorizer, CategoryError> {
        let mut patterns = Vec::new();
        for (idx, (path, text)) in sources.iter().enumerate() {
            let f: File = toml::from_str(text).map_err(|e| CategoryError(format!("{path}: {}", e.message().trim())))?;
            for p in f.patterns {
                let name = CATEGORIES.iter().find(|c| **c == p.name).ok_or_else(|| {
                    format!("{path}: unknown category {:?} (expected one of {})", p.name, CATEGORIES.join(", "))
                })?;
                let re = |s: &Option<String>| -> Result<Option<Regex>, String> {
                    s.as_deref().map(|s| Regex::new(s).map_err(|e| format!("{path}: {e}"))).transpose()
                };
                if p.file.is_none() && p.function.is_none() {
                    return Err(CategoryError(format!(
                        "{path}: a pattern for {:?} needs 'file' or 'function'",
                        p.name
                    )));
                }
                patterns.push((
                    idx,
                    Pattern {
                        name,
                        priority: p.priority,
                        file: re(&p.file)?,
                        function: re(&p.function)?,
                        not_function: re(&p.not_function)?,
                        innermost: p.innermost,
                    },
                ));
            }
        }
        patterns.sort_by(|(ia, a), (ib, b)| b.priority.cmp(&a.priority).then(ib.cmp(ia)));
        Ok(Categorizer { patterns: patterns.into_iter().map(|(_, p)| p).collect() })
    }

    pub fn builtin() -> Categorizer {
        Categorizer::new(&[("rules/categories.toml", BUILTIN)]).expect("built-in categories compile")
    }

    /// Which patterns one frame matches, as bits in priority order (only the first 128 patterns count).
    fn frame_mask(&self, file: &str, func: &str, innermost_user: bool) -> u128 {
        let mut mask = 0u128;
        for (i, p) in self.patterns.iter().take(128).enumerate() {
            if (!p.innermost || innermost_user)
                && p.file.as_ref().is_none_or(|r| r.is_match(file))
                && p.function.as_ref().is_none_or(|r| r.is_match(func))
                && !p.not_function.as_ref().is_some_and(|r| r.is_match(func))
            {
                mask |= 1 << i;
            }
        }
        mask
    }

    fn name_of(&self, mask: u128) -> &'static str {
        if mask == 0 {
            "unknown"
        } else {
            self.patterns[mask.trailing_zeros() as usize].name
        }
    }

    /// The category of a stack: the first pattern (by priority) that any of its frames matches.
    pub fn classify(&self, tl: &Timeline, stack: StackId) -> &'static str {
        let inner = innermost_user_frame(tl, stack);
        let mask = tl.stacks.stack(stack).iter().fold(0u128, |m, &f| {
            let fr = tl.stacks.frame(f);
            m | self.frame_mask(tl.strings.get(fr.filename), tl.strings.get(fr.name), Some(f) == inner)
        });
        self.name_of(mask)
    }
}

/// Memoises classification: a trace repeats a few thousand stacks a million times, and a few thousand frames
/// make up all the stacks, so each frame meets the regular expressions once.
pub struct CategoryCache<'a> {
    cat: &'a Categorizer,
    tl: &'a Timeline,
    stacks: FxHashMap<StackId, &'static str>,
    frames: FxHashMap<FrameId, u128>,
}

impl<'a> CategoryCache<'a> {
    pub fn new(cat: &'a Categorizer, tl: &'a Timeline) -> Self {
        CategoryCache { cat, tl, stacks: FxHashMap::default(), frames: FxHashMap::default() }
    }

    /// Says `category` for `stack` from now on, whatever its frames match: what the trace showed the stack doing
    /// decides (a stack grown by concatenation in the forward of an inference run is a KV cache).
    pub fn relabel(&mut self, stack: StackId, category: &'static str) {
        self.stacks.insert(stack, category);
    }

    pub fn of(&mut self, stack: StackId) -> &'static str {
        if stack == EMPTY_STACK {
            return "unknown";
        }
        if let Some(c) = self.stacks.get(&stack) {
            return c;
        }
        let (tl, cat) = (self.tl, self.cat);
        let mut mask = 0u128;
        for &f in tl.stacks.stack(stack) {
            mask |= *self.frames.entry(f).or_insert_with(|| {
                let fr = tl.stacks.frame(f);
                cat.frame_mask(tl.strings.get(fr.filename), tl.strings.get(fr.name), false)
            });
        }
        if let Some(f) = innermost_user_frame(tl, stack) {
            let fr = tl.stacks.frame(f);
            mask |= cat.frame_mask(tl.strings.get(fr.filename), tl.strings.get(fr.name), true);
        }
        let c = cat.name_of(mask);
        self.stacks.insert(stack, c);
        c
    }
}

/// The innermost frame of the user's own code: the line that allocated, as the user wrote it.
fn innermost_user_frame(tl: &Timeline, stack: StackId) -> Option<FrameId> {
    tl.stacks
        .stack(stack)
        .iter()
        .copied()
        .find(|&f| !crate::timeline::stacks::is_library_frame(tl.strings.get(tl.stacks.frame(f).filename)))
}
