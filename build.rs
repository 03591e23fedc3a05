//! Embeds every `rules/*.toml` into the binary, so the built-in checklist needs no files at run time, and records
//! how the binary was built (the commit, the profile, the compiler) for `oomdoc --version`.

use std::fmt::Write;

fn main() {
    println!("cargo:rerun-if-changed=rules");
    let mut names: Vec<String> = std::fs::read_dir("rules")
        .expect("rules/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    let mut out = String::from(
        "/// Built-in rule files: (file name, contents).\npub const BUILTIN_RULES: &[(&str, &str)] = &[\n",
    );
    for n in &names {
        println!("cargo:rerun-if-changed=rules/{n}");
        let _ = writeln!(out, "    ({n:?}, include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/rules/{n}\"))),");
    }
    out.push_str("];\n");
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("builtin_rules.rs");
    std::fs::write(dest, out).expect("write builtin_rules.rs");
    build_info();
}

/// `OOMDOC_BUILD`: "commit abc1234, release, rustc 1.88.0" (what is known of it: a source tarball has no commit).
fn build_info() {
    let run = |cmd: &str, args: &[&str]| -> Option<String> {
        let out = std::process::Command::new(cmd).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
    };
    let mut parts = Vec::new();
    if let Some(commit) = run("git", &["rev-parse", "--short=9", "HEAD"]) {
        let dirty = run("git", &["status", "--porcelain", "--untracked-files=no"]).is_some();
        parts.push(format!("commit {commit}{}", if dirty { "+changes" } else { "" }));
        // Rebuilt when the commit moves (not on every edit: the +changes mark is as of the last build script run).
        if let Some(head) = run("git", &["rev-parse", "--git-path", "HEAD"]) {
            println!("cargo:rerun-if-changed={head}");
        }
    }
    parts.push(std::env::var("PROFILE").unwrap_or_else(|_| "unknown profile".into()));
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    if let Some(v) = run(&rustc, &["--version"]) {
        parts.push(v.split(" (").next().unwrap_or(&v).to_string());
    }
    println!("cargo:rustc-env=OOMDOC_BUILD={}", parts.join(", "));
}
