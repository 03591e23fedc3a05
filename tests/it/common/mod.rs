//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the real `oomdoc` binary from the crate root (so fixture paths in reports are relative and stable).
pub fn oomdoc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oomdoc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("NO_COLOR")
        .output()
        .expect("oomdoc runs")
}

/// `oomdoc analyze ARGS… --format json`, which must succeed: the report as JSON.
pub fn analyze_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["analyze"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--format", "json"]);
    let o = oomdoc(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs one of the repository's Python generators (`script`, relative to the root) into a fresh temporary folder
/// named after `tag`, with `args` after the folder; returns the folder (the caller removes it).
pub fn generate(script: &str, tag: &str, args: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oomdoc-{tag}-{}", std::process::id()));
    let o = std::process::Command::new("python3")
        .arg(root().join(script))
        .arg(&dir)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "{script}: {}", stderr(&o));
    dir
}

/// Every file in a fixtures folder with the given extension, sorted, as paths relative to the crate root.
pub fn fixtures(dir: &str, ext: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(ext))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    v.sort();
    v
}

/// A scratch file that is removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn with(name: &str, bytes: &[u8]) -> TempFile {
        let dir = std::env::temp_dir().join(format!("oomdoc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        TempFile(p)
    }
    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn read(p: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(root().join(p)).unwrap()
}

/// The findings of a JSON report as sorted `rule:severity` strings.
pub fn rules_fired(v: &serde_json::Value) -> Vec<String> {
    let mut r: Vec<String> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| format!("{}:{}", f["rule"].as_str().unwrap_or("?"), f["severity"].as_str().unwrap_or("?")))
        .collect();
    r.sort();
    r
}

/// The sibling `nsys stats` reports of one capture in fixtures/profilers/ (DDP with gradient accumulation).
pub const DDP_ACCUM_FILES: [&str; 7] = [
    "ddp_accum_cuda_api_sum.csv",
    "ddp_accum_cuda_gpu_kern_sum.csv",
    "ddp_accum_cuda_gpu_mem_size_sum.csv",
    "ddp_accum_cuda_gpu_mem_time_sum.csv",
    "ddp_accum_cuda_gpu_trace.csv",
    "ddp_accum_nvtx_sum.csv",
    "ddp_accum_osrt_sum.csv",
];

/// Every real snapshot in the corpus: `fixtures/real/*.pickle` and each real GPU capture's `snapshot.pickle`.
pub fn real_snapshots() -> Vec<PathBuf> {
    let real_gpu = std::fs::read_dir("fixtures/real-gpu").expect("fixtures/real-gpu");
    std::fs::read_dir("fixtures/real")
        .expect("fixtures/real")
        .map(|e| e.expect("entry").path())
        .chain(real_gpu.map(|e| e.expect("entry").path().join("snapshot.pickle")))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle") && p.is_file())
        .collect()
}
