//! Nsight Systems SQLite exports (`nsys export --type sqlite`): the hand-made exports in `fixtures/profilers/`
//! (written by `gen_nsys_sqlite.py`) read back exactly, and every broken or foreign file is a clear error, never a
//! panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oomdoc::analysis::profile::{nccl_collective, CollectiveOp};
use oomdoc::ingest::nsys_sqlite;
use oomdoc::timeline::profile::{CopyDirection, Dim3, DriverMemoryOp, GpuOpKind, ProfileData};

const MIB: u64 = 1 << 20;
const MEMUSAGE: &str = "nsys_memusage_ddp.sqlite";
const NOMEMUSAGE: &str = "nsys_nomemusage.sqlite";
const NOT_NSYS: &str = "not_nsys.sqlite";
/// The PID the generator serializes into `globalPid`.
const PID: u64 = 48213;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join("profilers").join(name)
}

fn read(name: &str) -> ProfileData {
    nsys_sqlite::read(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A fresh, empty directory under the system temp dir for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("oomdoc-nsys-sqlite-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn err_of(path: &Path) -> String {
    match nsys_sqlite::read(path) {
        Ok(d) => panic!("{}: read, expected an error: {:?}", path.display(), d.sources),
        Err(e) => e.to_string(),
    }
}

/// Peak and final live bytes per device, walking the events in order (+bytes on alloc, −bytes on free).
fn live_bytes(d: &ProfileData, kind: &str) -> BTreeMap<i64, (u64, u64)> {
    let mut out: BTreeMap<i64, (i128, i128)> = BTreeMap::new();
    for e in d.memory_events.iter().filter(|e| e.mem_kind == kind) {
        let (peak, live) = out.entry(e.device).or_default();
        match e.op {
            DriverMemoryOp::Alloc => *live += i128::from(e.bytes),
            DriverMemoryOp::Free => *live -= i128::from(e.bytes),
        }
        *peak = (*peak).max(*live);
    }
    out.into_iter().map(|(d, (p, l))| (d, (u64::try_from(p).unwrap(), u64::try_from(l).unwrap()))).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// The fixtures

#[test]
fn sniffs_the_sqlite_header() {
    let head = std::fs::read(fixture(MEMUSAGE)).unwrap();
    assert!(nsys_sqlite::sniff(&head[..16]));
    assert!(nsys_sqlite::sniff(&head));
    assert!(!nsys_sqlite::sniff(&head[..15]));
    assert!(!nsys_sqlite::sniff(b"Start,End,Duration\n"));
}

#[test]
fn memory_usage_source_says_what_was_read() {
    let d = read(MEMUSAGE);
    assert_eq!(d.sources.len(), 1);
    let s = &d.sources[0];
    assert_eq!(s.name, MEMUSAGE);
    assert_eq!(s.format, "nsys SQLite export");
    assert_eq!(
        s.read,
        [
            "META_DATA_EXPORT: nsys 2024.6.2.225, export schema 3.16.1",
            "CUDA_GPU_MEMORY_USAGE_EVENTS: 137 allocation events (87 allocations, 50 frees)",
            "CUPTI_ACTIVITY_KIND_KERNEL: 150 kernels",
            "CUPTI_ACTIVITY_KIND_MEMCPY: 21 memory copies",
            "CUPTI_ACTIVITY_KIND_MEMSET: 6 memsets",
        ]
    );
    assert!(s.skipped.is_empty(), "{:?}", s.skipped);
    assert!(s.malformed.is_empty(), "{:?}", s.malformed);
}

#[test]
fn memory_events_are_the_driver_timeline() {
    let d = read(MEMUSAGE);
    let ev = &d.memory_events;
    assert_eq!(ev.len(), 137);
    assert_eq!(ev.iter().filter(|e| e.op == DriverMemoryOp::Alloc).count(), 87);
    assert!(ev.windows(2).all(|w| w[0].time_ns <= w[1].time_ns), "not in time order");
    assert!(ev.iter().all(|e| e.device == 0 && e.pid == Some(PID)));

    // First: the first 64 MiB weight segment.
    let first = &ev[0];
    assert_eq!(
        (first.time_ns, first.address, first.bytes, first.op, first.mem_kind.as_str()),
        (1_204_331_000, 0x7F3A_0000_0000, 64 * MIB, DriverMemoryOp::Alloc, "Device")
    );
    // Last: the second pinned staging buffer going away.
    let last = ev.last().unwrap();
    assert_eq!((last.bytes, last.op, last.mem_kind.as_str()), (32 * MIB, DriverMemoryOp::Free, "Pinned"));
    assert_eq!(last.time_ns, ev.iter().map(|e| e.time_ns).max().unwrap());

    // Pinned host buffers: two allocated, two freed.
    let pinned: Vec<_> = ev.iter().filter(|e| e.mem_kind == "Pinned").collect();
    assert_eq!(pinned.len(), 4);
    assert_eq!(pinned.iter().filter(|e| e.op == DriverMemoryOp::Alloc).count(), 2);

    // The exact peak the generator prints: weights 514 MiB + Adam state 1024 MiB + 70 MiB kept from five steps +
    // the sixth step's 592 MiB of activations = 2200 MiB; 1634 MiB still held at the end.
    let live = live_bytes(&d, "Device");
    assert_eq!(live.keys().copied().collect::<Vec<_>>(), [0]);
    assert_eq!(live[&0], (2_306_867_200, 1_713_373_184));
    assert_eq!(live[&0], (2200 * MIB, 1634 * MIB));
    assert_eq!(live_bytes(&d, "Pinned")[&0], (64 * MIB, 0));

    // Activation segments come back at the same address the driver handed out before.
    let act: Vec<_> = ev.iter().filter(|e| e.bytes == 128 * MIB && e.op == DriverMemoryOp::Alloc).collect();
    assert_eq!(act.len(), 24);
    assert_eq!(act[0].address, act[4].address);
}

#[test]
fn kernels_copies_and_memsets_form_the_gpu_trace() {
    let d = read(MEMUSAGE);
    let t = &d.gpu_trace;
    assert_eq!(t.len(), 150 + 21 + 6);
    assert!(t.windows(2).all(|w| w[0].start_ns <= w[1].start_ns), "not in start order");
    assert!(t.iter().all(|o| o.device_id == Some(0) && o.line >= 1 && o.correlation_id.is_some()));

    let kernels: Vec<_> = t.iter().filter(|o| o.kind == GpuOpKind::Kernel).collect();
    assert_eq!(kernels.len(), 150);
    // The demangled name, not the short one.
    let opt: Vec<_> = kernels.iter().filter(|k| k.name.contains("multi_tensor_apply_kernel")).collect();
    assert_eq!(opt.len(), 6);
    assert!(opt[0].name.starts_with("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"));
    assert_eq!(opt[0].duration_ns, 2_400_000);
    assert_eq!(opt[0].grid, Some(Dim3 { x: 320, y: 1, z: 1 }));
    assert_eq!(opt[0].block, Some(Dim3 { x: 512, y: 1, z: 1 }));
    assert_eq!(opt[0].stream, Some(7));
    assert_eq!(opt[0].context, Some(1));

    // NCCL all-reduces, recognised by the shared helper: four per step, between optimizer steps.
    let nccl: Vec<_> = kernels.iter().filter_map(|k| nccl_collective(&k.name).map(|c| (k, c))).collect();
    assert_eq!(nccl.len(), 24);
    for (k, c) in &nccl {
        assert_eq!(k.name, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)");
        assert_eq!(k.stream, Some(20));
        assert_eq!(c.op, CollectiveOp::AllReduce);
        assert_eq!(
            (c.algorithm.as_deref(), c.protocol.as_deref(), c.dtype.as_deref()),
            (Some("RING"), Some("LL"), Some("f32"))
        );
    }
    let per_step = d.collectives_between(CollectiveOp::AllReduce, |o| o.name.contains("multi_tensor_apply_kernel"));
    assert_eq!(per_step, [4, 4, 4, 4, 4, 4, 0]);

    // Copies: the weights and each batch up through pinned memory, the loss down to pageable memory.
    let h2d: Vec<_> = t.iter().filter(|o| o.kind == GpuOpKind::Memcpy(CopyDirection::HostToDevice)).collect();
    assert_eq!(h2d.len(), 15);
    assert_eq!(h2d[0].name, "[CUDA memcpy Host-to-Device]");
    assert_eq!((h2d[0].src_kind.as_deref(), h2d[0].dst_kind.as_deref()), (Some("Pinned"), Some("Device")));
    assert_eq!(d.copy_volume(CopyDirection::HostToDevice), Some((514 * MIB + 6 * 8 * MIB, 15)));
    assert_eq!(d.copy_volume(CopyDirection::DeviceToHost), Some((6 * 4, 6)));
    let d2h = t.iter().find(|o| o.kind == GpuOpKind::Memcpy(CopyDirection::DeviceToHost)).unwrap();
    assert_eq!((d2h.src_kind.as_deref(), d2h.dst_kind.as_deref()), (Some("Device"), Some("Pageable")));

    let memsets: Vec<_> = t.iter().filter(|o| o.kind == GpuOpKind::Memset).collect();
    assert_eq!(memsets.len(), 6);
    assert!(memsets.iter().all(|m| m.name == "[CUDA memset]" && m.bytes == Some(20 * MIB)));
    assert_eq!(memsets[0].dst_kind.as_deref(), Some("Device"));
}

#[test]
fn capture_without_memory_usage_says_how_to_get_it() {
    let d = read(NOMEMUSAGE);
    assert!(d.memory_events.is_empty());
    let s = &d.sources[0];
    assert_eq!(
        s.skipped,
        ["CUDA_GPU_MEMORY_USAGE_EVENTS: absent — capture with `nsys profile --cuda-memory-usage=true` to record \
          allocations"]
    );
    assert_eq!(
        s.read,
        [
            "META_DATA_EXPORT: nsys 2024.6.2.225, export schema 3.16.1",
            "CUPTI_ACTIVITY_KIND_KERNEL: 50 kernels",
            "CUPTI_ACTIVITY_KIND_MEMCPY: 13 memory copies",
            "CUPTI_ACTIVITY_KIND_MEMSET: 2 memsets",
        ]
    );
    assert_eq!(d.collectives_between(CollectiveOp::AllReduce, |o| o.name.contains("multi_tensor_apply")), [4, 4, 0]);
}

#[test]
fn reads_a_read_only_copy_and_leaves_nothing_beside_it() {
    let dir = scratch("readonly");
    let copy = dir.join("capture with spaces & #hash?.sqlite");
    std::fs::copy(fixture(MEMUSAGE), &copy).unwrap();
    let mut perms = std::fs::metadata(&copy).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&copy, perms).unwrap();
    let d = nsys_sqlite::read(&copy).unwrap();
    assert_eq!(d.memory_events.len(), 137);
    assert_eq!(d.sources[0].name, "capture with spaces & #hash?.sqlite");
    let names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["capture with spaces & #hash?.sqlite"], "no journal or WAL file");
    let mut perms = std::fs::metadata(&copy).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&copy, perms).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------------------------
// Files that are not (whole) nsys exports

#[test]
fn empty_file() {
    let dir = scratch("empty");
    let p = dir.join("empty.sqlite");
    std::fs::write(&p, b"").unwrap();
    let e = err_of(&p);
    assert_eq!(
        e,
        "expected an SQLite database (`nsys export --type sqlite`), which starts with \"SQLite format 3\\0\", found \
         an empty file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn truncated_copies() {
    let dir = scratch("truncated");
    let bytes = std::fs::read(fixture(MEMUSAGE)).unwrap();
    assert_eq!(bytes.len() % 4096, 0);
    // Inside the header, at a page boundary, and mid-page.
    for (cut, what) in
        [(50, "inside the 100-byte header"), (4 * 4096, "the header says 16 pages"), (10_000, "16 pages")]
    {
        let p = dir.join(format!("cut{cut}.sqlite"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = err_of(&p);
        assert!(e.starts_with("truncated SQLite database") && e.contains(what), "{cut}: {e}");
    }
    // Whole pages, but the header's page count no longer valid: SQLite itself finds the damage.
    let mut stale = bytes[..4 * 4096].to_vec();
    stale[92..96].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    let p = dir.join("stale.sqlite");
    std::fs::write(&p, &stale).unwrap();
    let e = err_of(&p);
    assert!(e.starts_with("not a readable SQLite database: malformed database schema"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_schema_page() {
    let dir = scratch("corrupt");
    let mut bytes = std::fs::read(fixture(MEMUSAGE)).unwrap();
    for b in &mut bytes[100..4096] {
        *b = 0xA5;
    }
    let p = dir.join("corrupt.sqlite");
    std::fs::write(&p, &bytes).unwrap();
    let e = err_of(&p);
    assert_eq!(e, "not a readable SQLite database: database disk image is malformed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn random_bytes_and_text() {
    let dir = scratch("foreign");
    // A fixed linear congruential sequence: the same "random" bytes every run.
    let mut x: u32 = 0x2545_F491;
    let noise: Vec<u8> = (0..8192)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect();
    let p = dir.join("noise.sqlite");
    std::fs::write(&p, &noise).unwrap();
    let e = err_of(&p);
    assert!(e.starts_with("not an SQLite database: expected an SQLite database (`nsys export --type sqlite`)"), "{e}");
    assert!(e.ends_with("found bytes e2 8d 1b 98 5d 5e 4d dd 59 98 e3 66 5f a8 a0 cf ('....]^M.Y..f_...')"), "{e}");

    let p = dir.join("report.txt");
    std::fs::write(&p, "Time (%),Total Time (ns),Instances,Avg (ns),Name\n12.5,1000,1,1000.0,foo\n").unwrap();
    let e = err_of(&p);
    assert!(e.contains("found text starting \"Time (%),Total Time (ns)"), "{e}");

    // Starts like SQLite, then nothing of a database.
    let p = dir.join("fake.sqlite");
    let mut fake = b"SQLite format 3\0".to_vec();
    fake.extend(&noise[..4096 - 16]);
    std::fs::write(&p, &fake).unwrap();
    let e = err_of(&p);
    assert!(e.starts_with("corrupt SQLite database: the header gives a page size of"), "{e}");

    let e = err_of(&dir.join("does-not-exist.sqlite"));
    assert!(e.starts_with("cannot open"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sqlite_database_that_is_not_an_nsys_export() {
    let e = err_of(&fixture(NOT_NSYS));
    assert_eq!(
        e,
        "an SQLite database, but not an Nsight Systems export: looked for the tables CUDA_GPU_MEMORY_USAGE_EVENTS, \
         CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET, found 1 table: customers"
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Odd databases, built here

fn build(dir: &Path, name: &str, sql: &str) -> PathBuf {
    let p = dir.join(name);
    let conn = rusqlite::Connection::open(&p).unwrap();
    conn.execute_batch(sql).unwrap();
    drop(conn);
    p
}

const MEMORY_TABLE: &str = "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER NOT NULL, globalPid INTEGER NOT \
     NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, address INTEGER NOT NULL, pc INTEGER NOT NULL, \
     bytes INTEGER NOT NULL, memKind INTEGER NOT NULL, memoryOperationType INTEGER NOT NULL, name TEXT, correlationId \
     INTEGER, streamId INTEGER);";

#[test]
fn bad_rows_are_skipped_and_listed_by_rowid() {
    let dir = scratch("badrows");
    // Loose columns (no NOT NULL), as a hand-edited or foreign-tool file may have; no ENUM_* tables.
    let p = build(
        &dir,
        "bad.sqlite",
        "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, bytes, \
         memKind, memoryOperationType);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (300, 16777216, 1, 1, 4096, 0, 2048, 2, 1);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (100, 16777216, 1, 1, 4096, 0, 2048, 2, 0);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (200, 16777216, 1, 1, 8192, 0, NULL, 2, 0);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (250, 16777216, 1, 1, 8192, 0, -5, 2, 0);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (-1, 16777216, 1, 1, 8192, 0, 5, 2, 0);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (260, 16777216, 1, 1, 8192, 0, 5, 2, 9);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (270, NULL, -1, 1, -1, 0, 5, 1, 0);
         INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (280, NULL, 1, 1, -1, 0, 5, NULL, 0);",
    );
    let d = nsys_sqlite::read(&p).unwrap();
    let ev = &d.memory_events;
    assert_eq!(ev.len(), 3);
    // Sorted by time; no enum table: kinds by number, operations by their documented numbers.
    assert_eq!(
        (ev[0].time_ns, ev[0].op, ev[0].mem_kind.as_str(), ev[0].pid),
        (100, DriverMemoryOp::Alloc, "2", Some(1))
    );
    assert_eq!(
        (ev[1].time_ns, ev[1].op, ev[1].address, ev[1].mem_kind.as_str()),
        (280, DriverMemoryOp::Alloc, u64::MAX, "unknown")
    );
    assert_eq!(ev[1].pid, None);
    assert_eq!((ev[2].time_ns, ev[2].op), (300, DriverMemoryOp::Free));
    let m: Vec<(usize, &str, &str)> =
        d.sources[0].malformed.iter().map(|m| (m.line, m.expected.as_str(), m.found.as_str())).collect();
    assert_eq!(
        m,
        [
            (3, "CUDA_GPU_MEMORY_USAGE_EVENTS.bytes: a byte count ≥ 0", "NULL"),
            (4, "CUDA_GPU_MEMORY_USAGE_EVENTS.bytes: a byte count ≥ 0", "-5"),
            (5, "CUDA_GPU_MEMORY_USAGE_EVENTS.start: a time in ns ≥ 0", "-1"),
            (
                6,
                "CUDA_GPU_MEMORY_USAGE_EVENTS.memoryOperationType: an allocation or a deallocation \
                 (ENUM_CUDA_DEV_MEM_EVENT_OPER)",
                "9"
            ),
            (7, "CUDA_GPU_MEMORY_USAGE_EVENTS.deviceId: a device id ≥ 0", "-1"),
        ]
    );
    assert_eq!(d.sources[0].read, ["CUDA_GPU_MEMORY_USAGE_EVENTS: 3 allocation events (2 allocations, 1 free)"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wrong_types_and_missing_columns_are_errors() {
    let dir = scratch("types");
    let p = build(
        &dir,
        "text.sqlite",
        &format!(
            "{MEMORY_TABLE}
             INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (1, 1, 0, 1, 4096, 0, 64, 2, 0, NULL, NULL, NULL);
             INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (2, 1, 0, 1, 4096, 0, 'lots', 2, 0, NULL, NULL, NULL);"
        ),
    );
    assert_eq!(
        err_of(&p),
        "CUDA_GPU_MEMORY_USAGE_EVENTS rowid 2, column bytes: expected an integer, found the text \"lots\""
    );
    let p = build(
        &dir,
        "real.sqlite",
        "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start, end, deviceId, streamId, bytes, copyKind);
         INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (10, 20, 0, 7, 1.5, 1);",
    );
    assert_eq!(
        err_of(&p),
        "CUPTI_ACTIVITY_KIND_MEMCPY rowid 1, column bytes: expected an integer, found the real number 1.5"
    );
    let p = build(
        &dir,
        "nobytes.sqlite",
        "CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, address, memKind, \
         memoryOperationType);",
    );
    assert_eq!(
        err_of(&p),
        "CUDA_GPU_MEMORY_USAGE_EVENTS: no column `bytes` (found: start, globalPid, deviceId, address, memKind, \
         memoryOperationType)"
    );
    let p = build(&dir, "noname.sqlite", "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId);");
    let e = err_of(&p);
    assert!(e.starts_with("CUPTI_ACTIVITY_KIND_KERNEL: no column `demangledName`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernel_names_fall_back_to_the_short_name() {
    let dir = scratch("names");
    let p = build(
        &dir,
        "names.sqlite",
        "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
         INSERT INTO StringIds VALUES (1, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL');
         INSERT INTO StringIds VALUES (2, 'void gemm<float>(float *)');
         INSERT INTO StringIds VALUES (3, 'gemm');
         CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT \
         NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER, demangledName INTEGER NOT \
         NULL, shortName INTEGER NOT NULL, gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, \
         blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL);
         INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (500, 900, 1, 1, 7, 11, 2, 3, 1, 1, 1, 32, 1, 1);
         INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (100, 400, 1, 1, 9, 12, 99, 1, 2, 1, 1, 640, 1, 1);
         INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (450, 460, 1, 1, 9, NULL, 98, 97, 2, 1, 1, 640, 1, 1);
         INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (470, 460, 1, 1, 9, NULL, 2, 3, 2, 1, 1, 640, 1, 1);
         INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (480, 490, 1, 1, 9, NULL, 2, 3, -2, 1, 1, 640, 1, 1);",
    );
    let d = nsys_sqlite::read(&p).unwrap();
    let names: Vec<(&str, u64, usize)> = d.gpu_trace.iter().map(|o| (o.name.as_str(), o.start_ns, o.line)).collect();
    assert_eq!(
        names,
        [
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, 2),
            ("<kernel name: StringIds id 98 not found>", 450, 3),
            ("void gemm<float>(float *)", 500, 1),
        ]
    );
    assert_eq!(d.gpu_trace[1].correlation_id, None);
    assert_eq!(nccl_collective(&d.gpu_trace[0].name).unwrap().dtype.as_deref(), Some("bf16"));
    let m: Vec<(usize, &str)> = d.sources[0].malformed.iter().map(|m| (m.line, m.expected.as_str())).collect();
    assert_eq!(
        m,
        [
            (4, "CUPTI_ACTIVITY_KIND_KERNEL.end: a time in ns ≥ start"),
            (5, "CUPTI_ACTIVITY_KIND_KERNEL.gridX: a dimension ≥ 0"),
        ]
    );
    let skipped = &d.sources[0].skipped;
    assert!(skipped[0].starts_with("CUDA_GPU_MEMORY_USAGE_EVENTS: absent"), "{skipped:?}");
    assert_eq!(
        &skipped[1..],
        [
            "CUPTI_ACTIVITY_KIND_MEMCPY: absent — no memory copy was traced",
            "CUPTI_ACTIVITY_KIND_MEMSET: absent — no memset was traced",
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nsys_export_without_cuda_data() {
    let dir = scratch("nocuda");
    let p = build(
        &dir,
        "cpu_only.sqlite",
        "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE OSRT_API (start INTEGER NOT NULL, end INTEGER NOT NULL, nameId INTEGER NOT NULL);",
    );
    let e = err_of(&p);
    assert!(e.starts_with("an Nsight Systems export without CUDA data"), "{e}");
    assert!(e.contains("--cuda-memory-usage=true"), "{e}");
    let p = build(&dir, "nothing.sqlite", "PRAGMA user_version = 1;");
    let e = err_of(&p);
    assert!(e.ends_with("found no table"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn empty_tables_are_noted() {
    let dir = scratch("emptytables");
    let p = build(&dir, "empty_tables.sqlite", MEMORY_TABLE);
    let d = nsys_sqlite::read(&p).unwrap();
    assert!(d.memory_events.is_empty() && d.gpu_trace.is_empty());
    assert_eq!(d.sources[0].skipped[0], "CUDA_GPU_MEMORY_USAGE_EVENTS: empty (no allocation recorded)");
    assert!(d.sources[0].read.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
