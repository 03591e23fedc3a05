//! Embeds every `rules/*.toml` into the binary, so the built-in checklist needs no files at run time.

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
}
