//! The library's modules form layers, and a module only uses the layers below it (ARCHITECTURE.md):
//!
//! ```text
//!   tui · mcp            browse a job's timeline · serve it to an assistant   (use report, job and below)
//!   report               text, Markdown, JSON, budget sheet  (renders what job and analysis made)
//!   job                  the pipeline: read → analyse → check
//!   rules                the checklist: facts → findings
//!   analysis             timeline → facts, the report model, the verdict
//!   ingest · budget      readers → timeline · model + run → budget (independent of each other)
//!   timeline             the shared model
//!   units · huge_pages · threads   helpers
//! ```
//!
//! An import that goes up (a fact value owned by the rule engine, a budget that knows the report) makes the layers
//! a circle; this test names the file and the line.

use crate::common;

const LAYERS: &[(&str, u32)] = &[
    ("units", 0),
    ("huge_pages", 0),
    ("threads", 0),
    ("timeline", 1),
    ("ingest", 2),
    ("budget", 2),
    ("analysis", 3),
    ("rules", 4),
    ("job", 5),
    ("report", 6),
    ("tui", 7),
    ("mcp", 7),
];

/// The layers below this one have their own error types (`ingest::IngestError`, `budget::BudgetError`,
/// `analysis::AnalysisError`): the crate's `Error` (lib.rs) is for the rules and above.
const ROOT_ERROR_FROM: u32 = 3;

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// Every `.rs` file under `dir`.
fn sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The imports in `text` (a file of module `top`) that go to a layer at or above its own, with their line; and
/// how many crate paths were seen.
fn upward(top: &str, text: &str) -> (Vec<(usize, String)>, usize) {
    let own = layer(top).unwrap_or_else(|| panic!("module {top} has no layer: add it to LAYERS"));
    let (mut up, mut seen) = (Vec::new(), 0);
    for (no, line) in text.lines().enumerate() {
        let mut rest = line.split("//").next().unwrap_or("");
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            seen += 1;
            if rest.starts_with('{') {
                up.push((
                    no + 1,
                    "a grouped `crate::{…}` import: write one path per module so layers can be read".into(),
                ));
                continue;
            }
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // The root's `Error` wraps every layer's error up to the rules: below them a layer has its own.
            if name == "Error" && own <= ROOT_ERROR_FROM {
                up.push((no + 1, format!("{top} (layer {own}) uses crate::Error, which wraps the layers above it")));
                continue;
            }
            match layer(&name) {
                Some(theirs) if name != top && theirs >= own => {
                    up.push((no + 1, format!("{top} (layer {own}) uses crate::{name} (layer {theirs})")))
                }
                _ => {}
            }
        }
    }
    (up, seen)
}

#[test]
fn the_scan_sees_an_upward_import() {
    let text = "use crate::timeline::Timeline;\nuse crate::rules::expr::Val; // up\n// use crate::tui::App;\n";
    let (up, seen) = upward("analysis", text);
    assert_eq!(seen, 2);
    assert_eq!(up, [(2, "analysis (layer 3) uses crate::rules (layer 4)".to_string())]);
    assert_eq!(upward("ingest", "x = crate::budget::plan(m);").0.len(), 1, "a peer layer is not used either");
    assert_eq!(upward("budget", "use crate::Error;").0.len(), 1, "below the rules, a layer's errors are its own");
    assert!(upward("rules", "use crate::Error;").0.is_empty());
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = common::root().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut seen = 0;
    let mut up = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        // The binary (main.rs, cli/) sits above every layer; lib.rs is the root, whose `Error` the rules and the layers
        // above may name (the scan checks that those below do not).
        if top == "main" || top == "cli" || top == "lib" {
            continue;
        }
        let (found, n) = upward(&top, &std::fs::read_to_string(file).unwrap());
        seen += n;
        up.extend(found.into_iter().map(|(line, what)| format!("{}:{line}: {what}", rel.display())));
    }
    assert!(seen > 100, "only {seen} crate paths seen: is the scan broken?");
    assert!(up.is_empty(), "imports that go up or sideways:\n{}", up.join("\n"));
}

/// clap's value parsers, by file: the one place a public function returns `Result<_, String>` (clap shows the
/// string).
const VALUE_PARSERS: &[&str] = &[
    "timeline/clock.rs: parse_tz",
    "units.rs: parse_size_arg",
    "budget/args.rs: parse_count",
    "budget/args.rs: parse_size",
    "budget/run.rs: parse",
];

/// The public functions of `file` whose errors are strings, but clap's value parsers (a signature may span lines:
/// read up to its body).
fn string_errors(file: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("pub fn ") {
        let sig = &text[at..text[at..].find('{').map_or(text.len(), |e| at + e)];
        if sig.contains(", String>") && sig.contains("Result<") {
            let name = format!("{file}: {}", sig["pub fn ".len()..].split(['(', '<']).next().unwrap_or(""));
            if !VALUE_PARSERS.contains(&name.as_str()) {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn the_scan_sees_a_string_error_over_several_lines() {
    assert_eq!(string_errors("a.rs", "pub fn run(\n    a: u8,\n) -> Result<Plan, String> {"), ["a.rs: run"]);
    assert!(string_errors("timeline/clock.rs", "pub fn parse_tz(s: &str) -> Result<i64, String> {").is_empty());
    // A value parser's name elsewhere is not one.
    assert_eq!(string_errors("analysis/whatif.rs", "pub fn parse(s: &[String]) -> Result<Plan, String> {").len(), 1);
    assert!(string_errors("a.rs", "pub fn run(a: u8) -> Result<Plan, WhatIfError> {").is_empty());
}

#[test]
fn the_library_returns_typed_errors_and_reads_no_environment() {
    // Environment switches belong to the binary (main.rs, cli/), which hands them down as options.
    let src = common::root().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let (mut strings, mut env) = (Vec::new(), Vec::new());
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().to_string();
        if rel == "main.rs" || rel.starts_with("cli") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        strings.extend(string_errors(&rel.replace('\\', "/"), &text));
        for (no, line) in text.lines().enumerate() {
            if line.contains("env::var") && !line.trim_start().starts_with("//") {
                env.push(format!("{rel}:{}", no + 1));
            }
        }
    }
    assert!(strings.is_empty(), "public functions returning Result<_, String>:\n{}", strings.join("\n"));
    assert!(env.is_empty(), "environment read inside the library:\n{}", env.join("\n"));
}
