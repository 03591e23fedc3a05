//! The docs say what the code does: the guide's key table is the TUI's own, the README stays a first screen's
//! worth plus what a newcomer needs (≤ 250 lines), and every path the README and the guide name exists.
//! `OOMDOC_UPDATE_DOCS=1 cargo test --test it docs` rewrites the generated block.

use crate::common::root;

const BEGIN: &str = "<!-- keys:begin -->\n";
const END: &str = "<!-- keys:end -->";

#[test]
fn the_guides_key_table_is_the_tuis() {
    let path = root().join("docs/GUIDE.md");
    let guide = std::fs::read_to_string(&path).unwrap();
    let table = oomdoc::tui::keys::markdown_table(&oomdoc::tui::keys::bindings());
    let (a, b) = (guide.find(BEGIN).expect("keys:begin") + BEGIN.len(), guide.find(END).expect("keys:end"));
    if std::env::var_os("OOMDOC_UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{table}{}", &guide[..a], &guide[b..])).unwrap();
        return;
    }
    assert_eq!(
        &guide[a..b],
        table,
        "docs/GUIDE.md's key table differs from the TUI's (OOMDOC_UPDATE_DOCS=1 rewrites it)"
    );
}

#[test]
fn the_readme_is_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let n = readme.lines().count();
    assert!(n <= 250, "README.md is {n} lines: move the detail to docs/GUIDE.md");
}

/// Every repository path the README and the guide name (`fixtures/…`, `docs/…`, `src/…`, a top-level file) exists.
#[test]
fn every_path_the_docs_name_exists() {
    let prefixes =
        ["fixtures/", "docs/", "bench/", "tests/", "src/", "rules/", "python/", "fuzz/", ".github/", "benches/"];
    for doc in ["README.md", "docs/GUIDE.md", "ARCHITECTURE.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let base = std::path::Path::new(doc).parent().unwrap();
        let mut missing = Vec::new();
        for raw in text.split(|c: char| c.is_whitespace() || "`()[]<>\"',;|".contains(c)) {
            let word = raw.split('#').next().unwrap_or(raw).trim_end_matches(['.', ':']);
            let rel = word.strip_prefix("../").map(|w| (true, w)).unwrap_or((false, word));
            let Some(p) = prefixes.iter().find(|p| rel.1.starts_with(**p)).map(|_| rel.1) else { continue };
            // Globs, placeholders and a member inside an archive name no file.
            if p.contains(['*', '{', '!', '…']) || p.ends_with("/N") {
                continue;
            }
            let found = root().join(p).exists() || (!rel.0 && root().join(base).join(p).exists());
            if !found {
                missing.push(p.to_string());
            }
        }
        // Image and link targets relative to the document itself.
        for target in text.split("](").skip(1).filter_map(|t| t.split(')').next()) {
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let target = target.split('#').next().unwrap_or(target);
            if !root().join(base).join(target).exists() {
                missing.push(target.to_string());
            }
        }
        assert!(missing.is_empty(), "{doc} names paths that do not exist: {missing:?}");
    }
}
