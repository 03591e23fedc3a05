//! The second generator (`fixtures/gen_programs.py`): programs run through an allocator model written apart from the
//! rules and from the first generator, each tensor labelled with what it is. What holds on its cases today is held
//! here, so that a change that loses it fails: every OOM recorded with stacks gets the program's bug as its primary
//! cause and the category that held the most bytes as its holder, and no healthy program gets a warning. (Traces
//! recorded without any stack are the gap still open; the README quotes the figures.)

use serde_json::Value;

#[test]
fn programs_recorded_with_stacks_get_their_cause_and_holder_and_healthy_ones_no_warning() {
    let dir = std::env::temp_dir().join(format!("oomdoc-programs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows = dir.join("rows.json");
    let o = std::process::Command::new("python3")
        .arg(crate::common::root().join("fixtures/gen_programs.py"))
        .args(["--score", "--n", "48", "--seed", "201", "--bin", env!("CARGO_BIN_EXE_oomdoc"), "--json"])
        .arg(&rows)
        .output()
        .expect("python3 runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<Value> = serde_json::from_slice(&std::fs::read(&rows).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let (mut ooms, mut healthy) = (0, 0);
    for r in &rows {
        let name = r["file"].as_str().unwrap();
        if r["outcome"] == "oom" {
            if r["stacks"] == "none" {
                continue;
            }
            ooms += 1;
            assert_eq!(r["got_primary"], r["primary"], "{name}: primary cause");
            assert_eq!(r["got_holder"], r["holder"], "{name}: holder");
        } else {
            healthy += 1;
            assert_eq!(r["warnings"], Value::Array(vec![]), "{name}: a healthy program warned");
        }
    }
    assert!(ooms >= 15 && healthy >= 10, "{ooms} OOMs with stacks, {healthy} healthy programs");
}
