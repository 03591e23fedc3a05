//! The Python module's capture helpers (`python/oomdoc`), run by their own unittest suite against a stand-in for
//! torch (`tests/python/fake_torch`), with this build's binary giving the verdict. CI also runs the suite against
//! the installed wheel (`tests/e2e/wheel.sh`).

use std::process::Command;

#[test]
fn capture_helpers_pass_their_python_suite() {
    let root = env!("CARGO_MANIFEST_DIR");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-s", "tests/python", "-t", "tests/python"])
        .current_dir(root)
        .env("PYTHONPATH", format!("{root}/python:{root}/tests/python/fake_torch"))
        .env("OOMDOC_BIN", env!("CARGO_BIN_EXE_oomdoc"))
        .env_remove("RANK")
        .env_remove("LOCAL_RANK")
        .env_remove("OOMDOC_VERDICT")
        .output()
        .unwrap_or_else(|e| panic!("{python} (Python 3) is needed for this test: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python -m unittest failed:\n{stderr}");
    // The count keeps a suite that silently found no tests from passing.
    let ran: usize = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .expect("unittest prints how many tests ran");
    assert!(ran >= 20, "only {ran} Python tests ran:\n{stderr}");
}
