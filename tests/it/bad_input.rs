//! Bad input gets one clear line on stderr and exit code 2: never a panic, never a backtrace, never code run.

use crate::common;

use common::{oomdoc, stderr, TempFile};

/// Runs `oomdoc analyze` on `bytes` and returns the single error line, checking the contract.
fn error_for(name: &str, bytes: &[u8]) -> String {
    let f = TempFile::with(name, bytes);
    let o = oomdoc(&["analyze", f.path()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{name}: exit code; stderr: {err}");
    assert!(o.stdout.is_empty(), "{name}: printed a report");
    assert_eq!(err.lines().count(), 1, "{name}: not one line: {err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{name}: {err}");
    assert!(err.starts_with("oomdoc: error: ") && err.contains(f.path()), "{name}: names the file: {err}");
    err
}

#[test]
fn empty_file() {
    assert!(error_for("empty.pickle", b"").contains("empty"));
}

#[test]
fn not_a_pickle() {
    let e = error_for("log.txt", b"Traceback (most recent call last):\n  File \"train.py\"\n");
    // Says what it looked for and what it found instead.
    assert!(e.contains("not a recognised artifact") && e.contains("snapshot pickle (first byte 0x80)"), "{e}");
    assert!(e.contains("training log") && e.contains(r#"text starting "Traceback"#), "{e}");
    let bin = error_for("data.bin", &[0x00, 0x01, 0x02, 0xff, 0xfe]);
    assert!(bin.contains("binary data starting 0x00 0x01"), "{bin}");
}

#[test]
fn truncated_at_many_offsets() {
    let full = common::read("fixtures/real/mlsys-linear-t24.pickle");
    for cut in [1, 2, 3, 100, full.len() / 3, full.len() / 2, full.len() - 2, full.len() - 1] {
        let e = error_for(&format!("cut{cut}.pickle"), &full[..cut]);
        assert!(e.contains("truncated") || e.contains("byte"), "cut at {cut}: {e}");
    }
}

#[test]
fn global_reduce_calling_os_system_is_refused() {
    // Protocol 2: GLOBAL 'os system', BINUNICODE 'touch <marker>', TUPLE1, REDUCE, STOP.
    let marker = std::env::temp_dir().join(format!("oomdoc-pwned-{}", std::process::id()));
    let cmd = format!("touch {}", marker.display());
    let mut p = b"\x80\x02cos\nsystem\nq\x00X".to_vec();
    p.extend_from_slice(&(cmd.len() as u32).to_le_bytes());
    p.extend_from_slice(cmd.as_bytes());
    p.extend_from_slice(b"q\x01\x85q\x02Rq\x03.");
    let e = error_for("os_system.pickle", &p);
    assert!(e.contains("GLOBAL") && e.contains("byte 2") && e.contains("never executes"), "{e}");
    assert!(!marker.exists(), "the pickle's command ran");
}

#[test]
fn stack_global_is_refused() {
    // Protocol 4: SHORT_BINUNICODE 'os', MEMOIZE, SHORT_BINUNICODE 'system', MEMOIZE, STACK_GLOBAL ...
    let p = b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x04true\x94\x85\x94R\x94.";
    let e = error_for("stack_global.pickle", p);
    assert!(e.contains("STACK_GLOBAL") && e.contains("byte 16"), "{e}");
}

#[test]
fn other_object_opcodes_are_refused_by_name() {
    for (name, op) in
        [("BUILD", b'b'), ("INST", b'i'), ("OBJ", b'o'), ("NEWOBJ", 0x81), ("PERSID", b'P'), ("EXT1", 0x82)]
    {
        let e = error_for(&format!("{name}.pickle"), &[0x80, 4, b'N', op, b'.']);
        assert!(e.contains(name) && e.contains("byte 3"), "{name}: {e}");
    }
}

#[test]
fn memo_bomb_stays_small() {
    // Billion laughs: level k+1 is a list of two references to level k; 60 levels would be 2^60 items if copied.
    let mut p = vec![0x80, 4, b']', 0x94];
    for level in 0..60u32 {
        p.extend_from_slice(&[b']', 0x94, b'(', b'j']);
        p.extend_from_slice(&(level * 2).to_le_bytes());
        p.push(b'j');
        p.extend_from_slice(&(level * 2).to_le_bytes());
        p.push(b'e');
        // MEMOIZE gave this list index 2*level+1; store it again at 2*(level+1) so the next level finds it.
        p.push(b'r');
        p.extend_from_slice(&((level + 1) * 2).to_le_bytes());
    }
    p.push(b'.');
    let start = std::time::Instant::now();
    let e = error_for("memo_bomb.pickle", &p);
    assert!(e.contains("not a PyTorch memory snapshot"), "{e}");
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
}

#[test]
fn huge_memo_index_costs_nothing() {
    let p = [0x80, 4, b'K', 7, b'r', 0xf0, 0xff, 0xff, 0xff, b'0', b'j', 0xf0, 0xff, 0xff, 0xff, b'.'];
    let e = error_for("memo_index.pickle", &p);
    assert!(e.contains("holds an int"), "{e}");
}

#[test]
fn ten_thousand_deep_nesting() {
    let mut p = vec![0x80, 4];
    p.extend(std::iter::repeat_n(b']', 10_000));
    p.extend(std::iter::repeat_n(b'a', 9_999));
    p.push(b'.');
    let e = error_for("deep.pickle", &p);
    assert!(e.contains("nested more than"), "{e}");
}

#[test]
fn well_formed_pickle_of_the_wrong_shape() {
    // {"hello": [1, 2, 3]}
    let p = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x05hello\x94]\x94(K\x01K\x02K\x03es.";
    let e = error_for("wrong_shape.pickle", p);
    assert!(e.contains("not a PyTorch memory snapshot") && e.contains("'hello'"), "{e}");
    // [1, 2, 3]
    let e = error_for("wrong_list.pickle", b"\x80\x04]\x94(K\x01K\x02K\x03e.");
    assert!(e.contains("first item is an int"), "{e}");
}

#[test]
fn a_field_of_the_wrong_type_names_where() {
    // {"segments": [], "device_traces": [[{"action": "alloc", "addr": "x"}]]}
    let p =
        b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces]](}(\x8c\x06action\x8c\x05alloc\x8c\x04addr\x8c\x01xuaau.";
    let e = error_for("bad_field.pickle", p);
    assert!(e.contains("byte") && e.contains("'addr' is a str, expected a non-negative int"), "{e}");
}

#[test]
fn missing_file_and_bad_usage() {
    let o = oomdoc(&["analyze", "no/such/file.pickle"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("no/such/file.pickle") && e.lines().count() == 1, "{e}");
    let o = oomdoc(&["analyze", "fixtures/real/mlsys-linear-t24.pickle", "--at", "tomorrow"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--at"), "{}", stderr(&o));
    let o = oomdoc(&["analyze", "fixtures/real/mlsys-linear-t24.pickle", "--at", "oom"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no OOM"), "{}", stderr(&o));
    let o = oomdoc(&["analyze", "fixtures/real/mlsys-linear-t24.pickle", "--device", "3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("devices present: 0"), "{}", stderr(&o));
}

/// The three inputs that panicked the pickle reader (issue 16): a LIST or DICT opcode with items after its MARK
/// (protocol 0/1 style, hand-made or mutated), and a small memo bomb of such lists. One line, exit 2, each.
#[test]
fn list_and_dict_opcodes_with_items_are_read_not_panicked_on() {
    for (name, what) in [
        ("list-of-memo-refs-bomb.pickle", "not a PyTorch memory snapshot"),
        ("list-opcode-with-items.pickle", "first item is an int"),
        ("dict-opcode-with-items.pickle", "not a PyTorch memory snapshot"),
    ] {
        let bytes = common::read(format!("fuzz/regressions/snapshot/{name}"));
        let e = error_for(name, &bytes);
        assert!(e.contains(what), "{name}: {e}");
    }
}

#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
pub(crate) mod fuzz_targets;

/// Every input a fuzz target ever crashed on (`fuzz/regressions/<target>/`), replayed through the same target
/// code the fuzzer ran: none may panic again.
#[test]
fn every_fuzz_crash_is_replayed() {
    let dir = common::root().join("fuzz/regressions");
    let mut replayed = 0;
    for target in std::fs::read_dir(&dir).expect("fuzz/regressions") {
        let target = target.unwrap().path();
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        let run: fn(&[u8]) = match name.as_str() {
            "pickle" => fuzz_targets::pickle,
            "snapshot" => fuzz_targets::snapshot,
            "oom_log" => fuzz_targets::oom_log,
            "vllm_log" => fuzz_targets::vllm_log,
            "nvidia_smi" => fuzz_targets::nvidia_smi,
            "nsys_csv" => fuzz_targets::nsys_csv,
            "nsys_sqlite" => fuzz_targets::nsys_sqlite,
            "ncu" => fuzz_targets::ncu,
            "rule_file" => fuzz_targets::rule_file,
            "when_expr" => fuzz_targets::when_expr,
            "categories" => fuzz_targets::categories,
            "budget_config" => fuzz_targets::budget_config,
            "job" => fuzz_targets::job,
            "archive" => fuzz_targets::archive,
            other => panic!("fuzz/regressions/{other}: no such fuzz target"),
        };
        let mut files: Vec<_> = std::fs::read_dir(&target).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            let bytes = std::fs::read(&f).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{} panicked again", f.display());
            // The pickle readers' inputs also go through the binary: one line and exit 2, or a report.
            if matches!(name.as_str(), "pickle" | "snapshot") {
                let o = oomdoc(&["analyze", f.to_str().unwrap()]);
                assert!(matches!(o.status.code(), Some(0) | Some(2)), "{}: {}", f.display(), stderr(&o));
                assert!(stderr(&o).lines().count() <= 1, "{}: {}", f.display(), stderr(&o));
            }
            replayed += 1;
        }
    }
    assert!(replayed >= 4, "only {replayed} regression inputs");
}

/// The panic hook is the last line of defence: a panic anywhere prints one line naming the place and exits 3.
#[test]
fn a_panic_is_one_line_and_exit_3() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oomdoc"))
        .args(["analyze", "fixtures/real/mlsys-linear-t24.pickle"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OOMDOC_TEST_PANIC", "1")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("oomdoc: internal error at src/") && e.contains("this is a bug"), "{e}");
}

/// The worst shapes for time and memory (`fuzz/hostile.py`, about 1 MiB each) are read or refused within an
/// address-space limit of the binary, a fixed allowance for the runtime and 64× the input: nothing a hostile file
/// says can make oomdoc allocate in proportion to a number it claims. (Their time, well under a second each, is
/// measured by bench/hostile.sh, not here.)
#[test]
fn hostile_megabyte_inputs_stay_within_64_times_their_size() {
    let dir = common::generate("fuzz/hostile.py", "hostile", &[]);
    let bin = env!("CARGO_BIN_EXE_oomdoc");
    let binary_kib = std::fs::metadata(bin).unwrap().len() / 1024;
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 14, "{files:?}");
    for f in &files {
        let size_kib = std::fs::metadata(f).unwrap().len() / 1024;
        // The executable is mapped whole; the runtime (threads' stacks, the allocator) needs a few tens of MiB.
        let limit_kib = binary_kib + 48 * 1024 + 64 * size_kib;
        let script = format!("ulimit -v {limit_kib} && exec \"$0\" analyze \"$1\" --no-progress");
        let o = std::process::Command::new("sh")
            .args(["-c", &script, bin, f.to_str().unwrap()])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            // One malloc arena: an address-space limit then measures what the program asks for, not the
            // allocator's per-thread reservations.
            .env("MALLOC_ARENA_MAX", "1")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        let err = stderr(&o);
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(matches!(o.status.code(), Some(0) | Some(2)), "{name}: exit {:?}: {err}", o.status.code());
        assert!(err.lines().count() <= 1, "{name}: {err}");
        assert!(!err.contains("memory allocation") && !err.contains("internal error"), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A typed error keeps what caused it: the io error under a file that cannot be opened, the JSON error under a
/// config that does not parse, the reader's error under an input.
#[test]
fn errors_keep_what_caused_them() {
    use std::error::Error as _;
    let e = oomdoc::ingest::nsys_sqlite::read(std::path::Path::new("/nonexistent/report.sqlite")).unwrap_err();
    let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io error under it");
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    let e = oomdoc::budget::model::parse_config("config.json", "{\"hidden_size\": ").unwrap_err();
    assert!(e.to_string().starts_with("config.json: expected a Hugging Face config.json (JSON): "), "{e}");
    let json = e.source().and_then(|s| s.source()).and_then(|s| s.downcast_ref::<serde_json::Error>());
    assert!(json.is_some_and(|j| j.is_eof()), "{e:?}");
    let bad = common::TempFile::with("bad.csv", b"\"ID\",\"Process ID\"\nnot,a,launch\n");
    let job = oomdoc::job::Job::read(&oomdoc::job::JobOptions {
        load: oomdoc::ingest::LoadOptions { kind: Some(oomdoc::ingest::Kind::Ncu), ..Default::default() },
        ..oomdoc::job::JobOptions::new([bad.path()])
    })
    .unwrap();
    match &job.failed[..] {
        [oomdoc::Error::Input(oomdoc::ingest::IngestError::Input {
            path,
            source: oomdoc::ingest::ReadError::Ncu(_),
        })] => {
            assert_eq!(path, bad.path())
        }
        other => panic!("expected one Nsight Compute read error, got {other:?}"),
    }
}
