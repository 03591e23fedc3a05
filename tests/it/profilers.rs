//! Nsight Systems stats and Nsight Compute CSV readers: every real file under `fixtures/real/{nsys,ncu}` parses and
//! what was read is pinned; hand-made fixtures (`fixtures/profilers/`) cover the layouts no real file shows.

use crate::common;

use std::path::{Path, PathBuf};

use oomdoc::analysis::profile::{nccl_collective, BoundThresholds, Boundedness, CollectiveOp, NcclNaming};
use oomdoc::ingest::{ncu, nsys};
use oomdoc::timeline::profile::{CopyDirection, Dim3, GpuOpKind, NcuKernel, ProfileData};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(rel)
}

fn read(rel: &str) -> String {
    let bytes = std::fs::read(fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    String::from_utf8(bytes).expect("utf-8 fixture")
}

fn nsys_file(rel: &str) -> ProfileData {
    let name = rel.rsplit('/').next().unwrap();
    nsys::parse(&read(rel), Some(name)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn nsys_dir(rel: &str) -> ProfileData {
    nsys::read_dir(&fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn ncu_file(rel: &str) -> ProfileData {
    let name = rel.rsplit('/').next().unwrap();
    ncu::parse(&read(rel), Some(name)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn kernel(d: &ProfileData, id: u64) -> &NcuKernel {
    d.ncu_kernels.iter().find(|k| k.id == id).unwrap_or_else(|| panic!("no launch {id}"))
}

const T80: BoundThresholds = BoundThresholds { memory_pct: 80.0, compute_pct: 80.0 };

fn classes(d: &ProfileData, t: &BoundThresholds) -> Vec<Option<Boundedness>> {
    d.classify_ncu(t).into_iter().map(|(_, c)| c).collect()
}

fn no_malformed(d: &ProfileData) {
    for s in &d.sources {
        assert!(s.malformed.is_empty(), "{}: {:?}", s.name, s.malformed);
    }
}

const REAL_NSYS_DIRS: [&str; 6] = [
    "real/nsys/nsys2022.4_stats__0919_test",
    "real/nsys/nsys2022.4_stats__bertSelectNNew",
    "real/nsys/nsys2022.4_stats__gcn_profile_nsys",
    "real/nsys/nsys2022.4_stats__graphiler_hgt_fb15k",
    "real/nsys/nsys2022.4_stats__paddle_gcn_profile_nsys",
    "real/nsys/nsys2022.4_stats__torch_gcn_profile_nsys",
];

// ---------------------------------------------------------------------------------------------------------------
// nsys, real files

#[test]
fn every_real_nsys_file_parses_alone_and_by_directory() {
    for dir in REAL_NSYS_DIRS {
        let d = nsys_dir(dir);
        no_malformed(&d);
        let mut entries: Vec<_> = std::fs::read_dir(fixture(dir)).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        let csvs = entries.iter().filter(|p| p.extension().is_some_and(|x| x == "csv")).count();
        assert_eq!(d.sources.len(), csvs, "{dir}: one source per CSV file");
        for p in entries {
            let name = p.file_name().unwrap().to_str().unwrap();
            let text = std::fs::read_to_string(&p).unwrap();
            let one = nsys::parse(&text, Some(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            no_malformed(&one);
            if text.is_empty() {
                assert!(one.is_empty() && one.sources[0].skipped[0].contains("empty"), "{name}");
            } else {
                assert!(nsys::sniff(&text), "{name}");
                let unused = one.sources[0].skipped.iter().any(|s| s.contains("report not used by oomdoc"));
                assert!(!one.is_empty() || unused, "{name}: nothing read");
                assert!(!ncu::sniff(&text), "{name}");
            }
        }
    }
}

#[test]
fn nsys_0919_test_cutlass_sgemm_on_a10() {
    let d = nsys_dir("real/nsys/nsys2022.4_stats__0919_test");
    let s = &d.sources;
    assert_eq!(s.len(), 11, "the console captures are not read twice");
    assert!(s.iter().all(|s| s.format == "nsys stats CSV (report names before 2023.1)" || s.read.is_empty()));
    assert!(s.iter().any(|s| s.skipped == ["kernexecsum (report not used by oomdoc): header at line 1, 1 rows"]));

    assert_eq!(d.kernels.len(), 1);
    let k = &d.kernels[0];
    assert!(k.name.starts_with("void cutlass::Kernel<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>"));
    assert_eq!((k.instances, k.time.total_ns, k.time.min_ns, k.time.max_ns), (40, 492_601_763, 7_958_895, 15_750_334));
    assert_eq!(k.time.avg_ns, 12_315_044.1);
    assert_eq!(k.time.pct, Some(100.0));
    assert_eq!(k.grid, Some(Dim3 { x: 512, y: 4, z: 1 }));
    assert_eq!(k.block, Some(Dim3 { x: 128, y: 1, z: 1 }));

    assert_eq!(d.gpu_trace.len(), 46);
    let t0 = &d.gpu_trace[0];
    assert_eq!((t0.start_ns, t0.duration_ns, t0.correlation_id), (2_541_359_215, 6_057_259, Some(526)));
    assert_eq!(t0.kind, GpuOpKind::Memcpy(CopyDirection::HostToDevice));
    assert_eq!(t0.bytes, Some(67_109_000), "67.109 decimal MB");
    assert_eq!((t0.device.as_deref(), t0.device_id), (Some("NVIDIA A10 (0)"), Some(0)));
    assert_eq!((t0.context, t0.stream, t0.src_kind.as_deref()), (Some(1), Some(7), Some("Pageable")));
    assert_eq!(d.gpu_trace.iter().filter(|o| o.kind == GpuOpKind::Kernel).count(), 40);
    let first_kernel = d.gpu_trace.iter().find(|o| o.kind == GpuOpKind::Kernel).unwrap();
    assert_eq!((first_kernel.start_ns, first_kernel.stream, first_kernel.bytes), (3_689_393_414, Some(16), None));
    assert_eq!(first_kernel.grid, Some(Dim3 { x: 512, y: 4, z: 1 }));

    assert_eq!(d.mem_ops.len(), 1);
    let m = &d.mem_ops[0];
    assert_eq!((m.operation.as_str(), m.count), ("[CUDA memcpy HtoD]", 6));
    assert_eq!(m.size.unwrap().total_bytes, 402_653_000);
    assert_eq!(m.time.unwrap().total_ns, 35_619_330);
    assert_eq!(d.copy_volume(CopyDirection::HostToDevice), Some((402_653_000, 6)));
    assert_eq!(d.copy_volume(CopyDirection::DeviceToHost), None);

    assert_eq!(d.api.len(), 10);
    let a = d.allocator_calls();
    assert_eq!((a.device_alloc_calls, a.device_alloc_ns), (18, 4_251_733));
    assert_eq!((a.device_free_calls, a.device_free_ns), (2, 945_780_245));
    assert_eq!(d.os_runtime.len(), 29);
    assert_eq!(d.os_runtime[0].name, "poll");

    assert_eq!(d.nvtx_ranges.len(), 10);
    let r = &d.nvtx_ranges[0];
    assert_eq!(
        (r.range.as_str(), r.style.as_str(), r.instances, r.time.total_ns),
        ("iter0", "PushPop", 2, 958_043_318)
    );
    assert_eq!(d.nvtx_kernels.len(), 10);
    let nk = &d.nvtx_kernels[0];
    assert_eq!(
        (nk.range.as_str(), nk.range_instances, nk.kernel_instances, nk.time.total_ns),
        ("iter0", 2, 4, 32_718_941)
    );
    assert_eq!(d.combined.len(), 14, "apigpusum 12 + gpusum 2");
    assert!(d.collectives().is_empty(), "no NCCL in a one-GPU sgemm");
}

#[test]
fn nsys_bert_cpu_only_capture_is_mostly_empty_reports() {
    let d = nsys_dir("real/nsys/nsys2022.4_stats__bertSelectNNew");
    let empty: Vec<&str> = d
        .sources
        .iter()
        .filter(|s| s.skipped.iter().any(|k| k.contains("empty (no data")))
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(empty.len(), 8);
    assert!(empty.contains(&"bertSelectNNew_gpukernsum.csv"));
    assert!(d.kernels.is_empty() && d.gpu_trace.is_empty() && d.mem_ops.is_empty());
    assert_eq!(d.api.len(), 1);
    assert_eq!((d.api[0].name.as_str(), d.api[0].calls), ("cudaStreamCreateWithPriority", 64));
    assert_eq!(d.os_runtime.len(), 29);
    assert_eq!(d.allocator_calls(), Default::default());
}

#[test]
fn nsys_paddle_gcn_captures() {
    for (dir, malloc_ns, free_ns, kern_ns) in [
        ("real/nsys/nsys2022.4_stats__gcn_profile_nsys", 1_709_124_966, 780_254_116, 50_014),
        ("real/nsys/nsys2022.4_stats__paddle_gcn_profile_nsys", 1_774_851_231, 2_480_410_186, 50_751),
    ] {
        let d = nsys_dir(dir);
        assert_eq!((d.kernels.len(), d.gpu_trace.len(), d.api.len()), (41, 450, 13), "{dir}");
        let a = d.allocator_calls();
        assert_eq!((a.device_alloc_calls, a.device_alloc_ns), (195, malloc_ns), "{dir}: cudaMalloc");
        assert_eq!((a.device_free_calls, a.device_free_ns), (6, free_ns), "{dir}: cudaFree");
        assert_eq!((a.host_alloc_calls, a.host_free_calls), (1, 0), "{dir}: cudaHostAlloc");
        let top = d.top_kernels_by_time(1)[0];
        assert!(top.name.starts_with("void phi::BNForwardInference<float, (common::DataLayout)2>"), "{dir}");
        assert_eq!((top.instances, top.time.total_ns), (3, kern_ns), "{dir}");
        assert_eq!(d.copy_volume(CopyDirection::HostToDevice), Some((1_490_000, 215)), "{dir}");
        assert_eq!(d.copy_volume(CopyDirection::DeviceToHost), Some((329_000, 43)), "{dir}");
        assert_eq!(d.copy_volume(CopyDirection::DeviceToDevice), Some((374_000, 56)), "{dir}");
        assert_eq!(d.gpu_trace[0].device.as_deref(), Some("NVIDIA GeForce RTX 3070 (0)"), "{dir}");
    }
}

#[test]
fn nsys_graphiler_nvtx_ranges_and_big_device_copies() {
    let d = nsys_dir("real/nsys/nsys2022.4_stats__graphiler_hgt_fb15k");
    assert_eq!((d.kernels.len(), d.gpu_trace.len(), d.nvtx_ranges.len(), d.nvtx_kernels.len()), (21, 111, 4, 34));
    let r = &d.nvtx_ranges[0];
    assert_eq!((r.range.as_str(), r.style.as_str(), r.instances), ("my_code_range", "StartEnd", 2));
    assert_eq!((r.time.total_ns, r.time.min_ns, r.time.max_ns), (1_190_599_554, 528_260_301, 662_339_253));
    assert_eq!(d.nvtx_ranges[1].range, "graphiler");
    assert_eq!(d.nvtx_kernels[0].range, "DGL-bmm");
    assert_eq!(d.copy_volume(CopyDirection::DeviceToDevice), Some((332_449_000, 6)));
    assert_eq!(d.copy_volume(CopyDirection::HostToDevice), Some((69_024_000, 36)));
    let a = d.allocator_calls();
    assert_eq!((a.device_alloc_calls, a.device_alloc_ns, a.device_free_calls), (30, 2_402_045_809, 24));
    let top = d.top_kernels_by_time(1)[0];
    assert!(top.name.starts_with("void at::native::index_elementwise_kernel<(int)128, (int)4,"));
    assert_eq!((top.instances, top.time.total_ns, top.grid), (32, 72_764_989, Some(Dim3 { x: 620_232, y: 1, z: 1 })));
    assert_eq!(d.gpu_trace[0].device.as_deref(), Some("NVIDIA GeForce RTX 3090 (0)"));
}

#[test]
fn nsys_torch_gcn_capture() {
    let d = nsys_dir("real/nsys/nsys2022.4_stats__torch_gcn_profile_nsys");
    assert_eq!((d.kernels.len(), d.gpu_trace.len(), d.api.len()), (22, 141, 11));
    let a = d.allocator_calls();
    assert_eq!((a.device_alloc_calls, a.device_alloc_ns), (7, 465_770));
    assert_eq!((a.device_free_calls, a.device_free_ns), (3, 826_359_045));
    assert_eq!((a.host_alloc_calls, a.host_alloc_ns), (12, 652_120));
    assert_eq!(d.copy_volume(CopyDirection::HostToDevice), Some((553_000, 63)));
    let t0 = &d.gpu_trace[0];
    assert_eq!((t0.start_ns, t0.duration_ns, t0.bytes), (2_799_790_219, 928, Some(0)));
}

#[test]
fn nsys_console_capture_2023_column_layout_with_thousands_separators() {
    let d = nsys_file("real/nsys/nsys_stats_console_8reports_torch.txt");
    no_malformed(&d);
    let s = &d.sources[0];
    assert_eq!(s.format, "nsys stats console capture (report names 2023.1+)");
    assert_eq!(s.read.len(), 5, "{:?}", s.read);
    assert_eq!(s.read[0], "osrt_sum (OS runtime summary, console columns): 29 rows from line 17");
    assert_eq!(s.skipped.len(), 1);
    assert!(s.skipped[0].starts_with("nvtx_sum: SKIPPED: /home/"), "{}", s.skipped[0]);
    assert!(s.skipped[0].ends_with("does not contain NV Tools Extension (NVTX) data. (line 14)"));

    assert_eq!(d.os_runtime.len(), 29);
    assert_eq!((d.os_runtime[0].name.as_str(), d.os_runtime[0].time.total_ns), ("poll", 1_602_579_192));
    assert_eq!(d.os_runtime[0].time.avg_ns, 57_234_971.1);
    assert_eq!(d.api.len(), 12);
    let a = d.allocator_calls();
    assert_eq!((a.device_alloc_calls, a.device_alloc_ns), (8, 542_094));
    assert_eq!((a.device_free_calls, a.device_free_ns), (3, 422_289_647));
    assert_eq!((a.host_alloc_calls, a.host_alloc_ns), (12, 572_412));

    assert_eq!(d.kernels.len(), 19);
    let k = &d.kernels[0];
    assert!(k.name.starts_with("void at::native::index_elementwise_kernel<(int)128") && k.name.ends_with('…'));
    assert_eq!((k.instances, k.time.total_ns, k.time.avg_ns, k.grid), (11, 44_287, 4_026.1, None));
    assert_eq!(d.kernels[1].name, "ampere_sgemm_64x32_sliced1x4_tn");

    assert_eq!(d.mem_ops.len(), 3);
    let h2d = &d.mem_ops[0];
    assert_eq!((h2d.operation.as_str(), h2d.count), ("[CUDA memcpy Host-to-Device]", 97));
    assert_eq!((h2d.size.unwrap().total_bytes, h2d.time.unwrap().total_ns), (846_000, 138_432));
    assert_eq!(d.copy_volume(CopyDirection::DeviceToDevice), Some((2_000, 6)));
}

#[test]
fn nsys_console_captures_2022_csv_and_column() {
    let d = nsys_file("real/nsys/nsys2022.4_stats__0919_test/console_csv_stdout.txt");
    assert_eq!(d.sources[0].format, "nsys stats console capture (report names before 2023.1)");
    assert_eq!(
        d.sources[0].read,
        [
            "gpumemsizesum (memory operations by size): 1 row from line 2",
            "gpukernsum (CUDA kernel summary): 1 row from line 6"
        ]
    );
    assert_eq!((d.kernels[0].instances, d.kernels[0].time.total_ns), (40, 492_601_763));
    assert_eq!(d.mem_ops[0].size.unwrap().total_bytes, 402_653_000);

    let d = nsys_file("real/nsys/nsys2022.4_stats__0919_test/console_column_stdout.txt");
    assert_eq!(
        d.sources[0].read,
        [
            "gpumemsizesum (memory operations by size, console columns): 1 row from line 5",
            "cudaapisum (CUDA API summary, console columns): 10 rows from line 13"
        ]
    );
    assert_eq!(d.api.len(), 10);
    assert_eq!(d.api[0].name, "cudaStreamCreateWithPriority");
    assert_eq!(d.allocator_calls().device_alloc_calls, 18);
}

#[test]
fn nsys_header_decides_the_report_not_the_name() {
    let text = read("real/nsys/nsys2022.4_stats__0919_test/0919_test_gpukernsum.csv");
    for hint in [None, Some("whatever.csv"), Some("run_cuda_api_sum.csv")] {
        let d = nsys::parse(&text, hint).unwrap();
        assert_eq!(d.kernels.len(), 1, "{hint:?}");
        assert!(d.api.is_empty());
    }
    // The CUDA API and OS runtime summaries share a header: without a name, the rows' names decide.
    let api = nsys::parse(&read("real/nsys/nsys2022.4_stats__0919_test/0919_test_cudaapisum.csv"), None).unwrap();
    assert_eq!((api.api.len(), api.os_runtime.len()), (10, 0));
    let os = nsys::parse(&read("real/nsys/nsys2022.4_stats__0919_test/0919_test_osrtsum.csv"), None).unwrap();
    assert_eq!((os.api.len(), os.os_runtime.len()), (0, 29));
}

// ---------------------------------------------------------------------------------------------------------------
// nsys, hand-made layouts

fn ddp_accum() -> ProfileData {
    let texts: Vec<(String, String)> =
        common::DDP_ACCUM_FILES.iter().map(|n| (n.to_string(), read(&format!("profilers/{n}")))).collect();
    nsys::parse_files(texts.iter().map(|(n, t)| (n.as_str(), t.as_str()))).unwrap()
}

#[test]
fn nsys_2023_report_names_and_2024_trace_header() {
    let d = ddp_accum();
    no_malformed(&d);
    let formats: Vec<&str> = d.sources.iter().map(|s| s.format.as_str()).collect();
    assert_eq!(formats.iter().filter(|f| **f == "nsys stats CSV (report names 2023.1+)").count(), 6);
    let nvtx = d.sources.iter().find(|s| s.name == "ddp_accum_nvtx_sum.csv").unwrap();
    assert_eq!(nvtx.skipped, ["nvtx_sum: empty (no data; nsys leaves a 0-byte file when a report has none)"]);

    assert_eq!(d.kernels.len(), 3);
    assert_eq!((d.kernels[0].instances, d.kernels[0].time.total_ns, d.kernels[0].grid), (16, 250_000_000, None));
    assert_eq!(d.gpu_trace.len(), 53);
    let memset = d.gpu_trace.iter().find(|o| o.kind == GpuOpKind::Memset).unwrap();
    assert_eq!(
        (memset.bytes, memset.src_kind.as_deref(), memset.dst_kind.as_deref()),
        (Some(2_000), Some("Device"), None)
    );
    let k = d.gpu_trace.iter().find(|o| o.kind == GpuOpKind::Kernel).unwrap();
    assert_eq!((k.grid, k.stream), (Some(Dim3 { x: 1024, y: 1, z: 1 }), Some(7)));
    assert_eq!(d.copy_volume(CopyDirection::HostToDevice), Some((201_333_000, 17)));
    let memsets = d.mem_ops.iter().find(|m| m.kind == GpuOpKind::Memset).unwrap();
    assert_eq!((memsets.count, memsets.size.unwrap().total_bytes, memsets.time.unwrap().total_ns), (2, 4_000, 3_968));

    // cuda_api_sum and osrt_sum share a header; the file names keep them apart.
    assert_eq!((d.api.len(), d.os_runtime.len()), (7, 2));
    let a = d.allocator_calls();
    assert_eq!((a.device_alloc_calls, a.device_alloc_ns), (24, 364_001_234));
    assert_eq!((a.device_free_calls, a.device_free_ns), (3, 1_302_117_334));
    assert_eq!((a.host_alloc_calls, a.host_free_calls), (2, 1));

    let c = d.collectives();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].op, c[0].launches, c[0].total_ns), (CollectiveOp::AllReduce, 16, 250_000_000));
}

#[test]
fn nsys_trace_all_reduces_per_optimizer_step() {
    let adam = |o: &oomdoc::timeline::profile::GpuOp| o.name.contains("multi_tensor_apply_kernel");
    let accum = ddp_accum();
    assert_eq!(accum.collectives_between(CollectiveOp::AllReduce, adam), [8, 8, 0]);
    let nosync = nsys_file("profilers/ddp_nosync_cuda_gpu_trace.csv");
    assert_eq!(nosync.collectives_between(CollectiveOp::AllReduce, adam), [1, 1, 0]);
    // Without a kernel summary the trace gives the counts.
    assert_eq!(nosync.collectives()[0].launches, 2);
    assert_eq!(nosync.collectives()[0].total_ns, 2 * 15_625_000);
}

#[test]
fn nsys_console_capture_2024_csv_with_skipped_report() {
    let d = nsys_file("profilers/console_2024_csv_stdout.txt");
    no_malformed(&d);
    let s = &d.sources[0];
    assert_eq!(s.format, "nsys stats console capture (report names 2023.1+)");
    assert_eq!(
        s.skipped,
        ["nvtx_sum: SKIPPED: ddp_accum.sqlite does not contain NV Tools Extension (NVTX) data. (line 5)"]
    );
    assert_eq!(
        s.read,
        [
            "cuda_api_sum (CUDA API summary): 7 rows from line 8",
            "cuda_gpu_kern_sum (CUDA kernel summary): 3 rows from line 18",
            "cuda_gpu_mem_size_sum (memory operations by size): 2 rows from line 24"
        ]
    );
    assert_eq!((d.api.len(), d.kernels.len(), d.mem_ops.len()), (7, 3, 2));
    assert_eq!(d.collectives()[0].launches, 16);
}

#[test]
fn nsys_skipped_and_empty_reports_are_no_data_not_errors() {
    let d = nsys::parse("", Some("run_cuda_gpu_kern_sum.csv")).unwrap();
    assert!(d.is_empty());
    assert_eq!(
        d.sources[0].skipped,
        ["cuda_gpu_kern_sum: empty (no data; nsys leaves a 0-byte file when a report has none)"]
    );
    let d = nsys::parse("\n  \n", None).unwrap();
    assert!(d.is_empty());
    let skipped = "SKIPPED: /tmp/x.sqlite does not contain CUDA kernel data.\n";
    assert!(nsys::sniff(skipped));
    let d = nsys::parse(skipped, None).unwrap();
    assert!(d.is_empty());
    assert_eq!(d.sources[0].skipped, ["report: SKIPPED: /tmp/x.sqlite does not contain CUDA kernel data. (line 1)"]);
    // A known report oomdoc does not read.
    let d =
        nsys::parse("Name,Projected Start (ns),Projected Duration (ns)\nx,1,2\n", Some("r_nvtx_gpu_proj_trace.csv"))
            .unwrap();
    assert_eq!(d.sources[0].skipped, ["nvtx_gpu_proj_trace (report not used by oomdoc)"]);
}

#[test]
fn nsys_older_nccl_names_and_collectives_per_nvtx_step() {
    let d = nsys_file("profilers/nccl27_gpukernsum.csv");
    no_malformed(&d);
    let c = d.collectives();
    assert_eq!(
        c.iter().map(|c| (c.op, c.launches)).collect::<Vec<_>>(),
        [(CollectiveOp::AllReduce, 16), (CollectiveOp::Broadcast, 2)]
    );
    assert_eq!(nccl_collective(&d.kernels[0].name).unwrap().naming, NcclNaming::Legacy);
    assert_eq!(d.kernels[0].grid, Some(Dim3 { x: 2, y: 1, z: 1 }));

    let d = nsys_file("profilers/nccl2x_nvtxkernsum.csv");
    let per = d.collectives_per_nvtx_range();
    let got: Vec<(&str, CollectiveOp, u64, u64)> =
        per.iter().map(|r| (r.range.as_str(), r.op, r.range_instances, r.launches)).collect();
    assert_eq!(
        got,
        [
            ("step0", CollectiveOp::AllReduce, 1, 8),
            ("step0", CollectiveOp::AllGather, 1, 1),
            ("step1", CollectiveOp::AllReduce, 1, 8),
            ("step1", CollectiveOp::AllGather, 1, 1),
        ]
    );
    assert_eq!(nccl_collective(&d.nvtx_kernels[0].kernel).unwrap().naming, NcclNaming::Kernel);
}

#[test]
fn nccl_names_of_all_three_generations() {
    let cases = [
        ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", CollectiveOp::AllReduce, NcclNaming::Legacy),
        ("ncclAllReduceRingLLKernel_sum_f16(ncclColl)", CollectiveOp::AllReduce, NcclNaming::Legacy),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", CollectiveOp::AllReduce, NcclNaming::Kernel),
        (
            "ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)",
            CollectiveOp::AllReduce,
            NcclNaming::Kernel,
        ),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", CollectiveOp::AllGather, NcclNaming::Kernel),
        ("ncclKernel_ReduceScatter_RING_LL_Sum_bf16", CollectiveOp::ReduceScatter, NcclNaming::Kernel),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", CollectiveOp::SendRecv, NcclNaming::Kernel),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)",
            CollectiveOp::AllReduce,
            NcclNaming::DevKernel,
        ),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", CollectiveOp::AllReduce, NcclNaming::DevKernel),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", CollectiveOp::Generic, NcclNaming::DevKernel),
        ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", CollectiveOp::Generic, NcclNaming::DevKernel),
        (
            "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE",
            CollectiveOp::AllReduce,
            NcclNaming::DevKernel,
        ),
        (
            "void ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            CollectiveOp::SendRecv,
            NcclNaming::DevKernel,
        ),
    ];
    for (name, op, naming) in cases {
        let c = nccl_collective(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!((c.op, c.naming), (op, naming), "{name}");
    }
    let c = nccl_collective("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)").unwrap();
    assert_eq!(
        (c.reduction.as_deref(), c.dtype.as_deref(), c.algorithm.as_deref(), c.protocol.as_deref()),
        (Some("Sum"), Some("bf16"), Some("RING"), Some("LL"))
    );
    for not in ["void at::native::reduce_kernel<128, 4>(x)", "ampere_sgemm_32x32_sliced1x4_tn", "[CUDA memcpy HtoD]"] {
        assert!(nccl_collective(not).is_none(), "{not}");
    }
}

#[test]
fn nsys_comma_decimal_locale() {
    let d = nsys_file("profilers/locale_gpumemsizesum.csv");
    no_malformed(&d);
    assert!(d.sources[0].read[0].contains("comma decimals"), "{:?}", d.sources[0].read);
    let s = d.mem_ops[0].size.unwrap();
    assert_eq!((s.total_bytes, s.avg_bytes, s.stddev_bytes), (482_333_000, 160_778_000, Some(0)));
    assert_eq!(d.copy_volume(CopyDirection::DeviceToHost), Some((482_333_000, 3)));
    let d = nsys_file("profilers/locale_gpumemtimesum.csv");
    let t = d.mem_ops[0].time.unwrap();
    assert_eq!((t.pct, t.total_ns, t.avg_ns, t.stddev_ns), (Some(100.0), 35_619_330, 5_936_555.0, Some(366_901.2)));
}

#[test]
fn nsys_bad_rows_are_counted_with_line_numbers() {
    let text = read("real/nsys/nsys2022.4_stats__0919_test/0919_test_gputrace.csv");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[2] = lines[2].replacen(",5924811,", ",5.9e6,", 1);
    lines[4] = lines[4].split(',').take(5).collect::<Vec<_>>().join(",");
    lines[6] = format!("{},\"open quote", lines[6]);
    let d = nsys::parse(&lines.join("\n"), Some("x_gputrace.csv")).unwrap();
    assert_eq!(d.gpu_trace.len(), 43);
    let m = &d.sources[0].malformed;
    assert_eq!(m.iter().map(|m| m.line).collect::<Vec<_>>(), [3, 5, 7]);
    assert_eq!(m[0].expected, "a duration in `duration`, found \"5.9e6\"");
    assert_eq!(m[1].expected, "20 fields as in the header at line 1");
    assert_eq!(m[2].expected, "a CSV row (a quoted field is not closed)");
    assert_eq!(d.malformed_count(), 3);
}

// ---------------------------------------------------------------------------------------------------------------
// ncu, real files

#[test]
fn every_real_ncu_csv_parses() {
    let dir = fixture("real/ncu");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if !name.starts_with("ncu") || name.contains("versions") || name.contains("_text_") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(ncu::sniff(&text), "{name}");
        assert!(!nsys::sniff(&text), "{name}");
        let d = ncu::parse(&text, Some(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        no_malformed(&d);
        assert!(!d.ncu_kernels.is_empty(), "{name}");
        assert!(d.ncu_kernels.iter().all(|k| !k.metrics.is_empty() && !k.name.is_empty()), "{name}");
        n += 1;
    }
    assert_eq!(n, 8);
}

#[test]
fn ncu_2020_paddle_details_with_nvtx_after_program_output() {
    let d = ncu_file("real/ncu/ncu2020.2_csv_nvtx_details_stdout_paddle.csv");
    let s = &d.sources[0];
    assert_eq!(s.format, "ncu --csv details page");
    assert_eq!(
        s.read,
        ["ncu details page (ncu 2020-style header (Kernel Time), NVTX columns): 2 kernel launches, 20 metric rows from \
          line 108"]
    );
    assert_eq!(s.skipped, ["before the CSV: 2 profiler lines (`==PROF==` …), 105 lines of program output"]);
    let k = kernel(&d, 0);
    assert!(k.name.starts_with("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x10_nn_align4>"));
    assert_eq!((k.process_id, k.process.as_str(), k.host.as_str()), (Some(93785), "python3.8", "127.0.0.1"));
    assert_eq!(k.kernel_time.as_deref(), Some("2024-Jul-13 19:18:31"));
    assert_eq!((k.context, k.stream, k.device, k.block), (Some(1), Some(13), None, None));
    assert_eq!(k.nvtx, ["linear_nvtx"]);
    assert_eq!(k.metrics.len(), 10);
    let dur = k.metric("gpu__time_duration.sum").unwrap();
    assert_eq!((dur.value, dur.unit.as_str(), dur.text.as_str()), (Some(8192.0), "nsecond", "8,192"));
    assert_eq!(k.duration_ns(), Some(8192.0));
    let smem = k.metric("launch__shared_mem_per_block_dynamic").unwrap();
    assert_eq!((smem.value, smem.unit.as_str()), (Some(81_920.0), "byte/block"));
    assert_eq!(k.metric("launch__block_size").unwrap().unit, "");
    assert_eq!((k.memory_throughput_pct(), k.sm_throughput_pct()), (Some(2.45), Some(1.03)));
    assert_eq!(k.metric("Memory Throughput").unwrap().value, Some(2.45), "display name reaches the metric");
    assert_eq!(classes(&d, &T80), [Some(Boundedness::LatencyBound); 2]);
    assert_eq!(kernel(&d, 1).duration_ns(), Some(3584.0));
}

#[test]
fn ncu_2020_torch_details_classified_under_given_thresholds() {
    let d = ncu_file("real/ncu/ncu2020.2_csv_nvtx_details_stdout_torch.txt");
    assert_eq!(d.ncu_kernels.len(), 14);
    assert!(d.ncu_kernels.iter().all(|k| k.nvtx == ["convLayer"] && k.stream == Some(7)));
    let sgemm = kernel(&d, 3);
    assert_eq!(sgemm.name, "ampere_sgemm_32x32_sliced1x4_tn");
    assert_eq!((sgemm.memory_throughput_pct(), sgemm.sm_throughput_pct()), (Some(47.72), Some(40.54)));
    assert_eq!(sgemm.duration_ns(), Some(16_704.0));
    // Nothing in this small GCN reaches 80% of either peak.
    assert!(classes(&d, &T80).iter().all(|c| *c == Some(Boundedness::LatencyBound)));
    // The thresholds are the caller's (a rule file's): at 30% the same kernels split three ways.
    let t30 = BoundThresholds { memory_pct: 30.0, compute_pct: 30.0 };
    assert_eq!(sgemm.classify(&t30), Some(Boundedness::ComputeAndMemoryBound));
    assert_eq!(kernel(&d, 1).classify(&t30), Some(Boundedness::ComputeBound), "CatArrayBatchedCopy: SM 38.95%");
    assert_eq!(kernel(&d, 8).classify(&t30), Some(Boundedness::MemoryBound), "memory 34.04%, SM 1.69%");
    assert_eq!(kernel(&d, 0).classify(&t30), Some(Boundedness::LatencyBound));
    assert_eq!(d.top_ncu_by_time(2).iter().map(|k| k.id).collect::<Vec<_>>(), [3, 9]);
    assert!(d.top_ncu_by_dram_bytes(3).is_empty(), "no DRAM byte metric was collected");
}

#[test]
fn ncu_2025_h100_details_with_nvtx_memory_and_compute_bound() {
    let d = ncu_file("real/ncu/ncu2025.3_csv_nvtx_details_metrics_h100.txt");
    let s = &d.sources[0];
    assert_eq!(
        s.read,
        ["ncu details page (ncu 2021+ header (Block/Grid Size, Device, CC), NVTX columns): 5 kernel launches, 50 metric \
          rows from line 5"]
    );
    assert_eq!(s.skipped, ["before the CSV: 3 profiler lines (`==PROF==` …), 1 line of program output"]);
    let nvtx: Vec<&[String]> = d.ncu_kernels.iter().map(|k| k.nvtx.as_slice()).collect();
    assert_eq!(nvtx, [["setup"], ["setup"], ["step0"], ["step0"], ["step0"]]);
    use Boundedness::*;
    assert_eq!(
        classes(&d, &T80),
        [Some(MemoryBound), Some(LatencyBound), Some(MemoryBound), Some(ComputeAndMemoryBound), Some(MemoryBound)]
    );
    let mul = kernel(&d, 2);
    assert!(mul
        .name
        .starts_with("void at::vectorized_elementwise_kernel<4, at::AUnaryFunctor<float, float, float, binary_"));
    assert_eq!((mul.memory_throughput_pct(), mul.sm_throughput_pct()), (Some(87.96), Some(4.64)));
    assert_eq!((mul.block, mul.grid), (Some(Dim3 { x: 128, y: 1, z: 1 }), Some(Dim3 { x: 65_536, y: 1, z: 1 })));
    assert_eq!((mul.device, mul.cc.as_deref()), (Some(0), Some("9.0")));
    let gemm = kernel(&d, 3);
    assert_eq!(gemm.name, "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT");
    assert_eq!(gemm.dram_bytes(), Some(1_288_896_000.0));
    let dur = gemm.metric("gpu__time_duration.sum").unwrap();
    assert_eq!((dur.unit.as_str(), gemm.duration_ns()), ("ns", Some(1_222_496.0)));
    assert_eq!(d.top_ncu_by_dram_bytes(3).iter().map(|k| k.id).collect::<Vec<_>>(), [3, 2, 4]);
    assert_eq!(d.top_ncu_by_time(1)[0].id, 3);
    assert_eq!(mul.l1_global_bytes(), Some(268_435_456.0 * 2.0));
}

#[test]
fn ncu_2025_h100_raw_page() {
    let d = ncu_file("real/ncu/ncu2025.3_csv_nvtx_raw_metrics_h100.txt");
    assert_eq!(d.sources[0].format, "ncu --csv --page raw");
    assert_eq!(
        d.sources[0].read,
        ["ncu raw page (ncu 2021+ header (Block/Grid Size, Device, CC), NVTX columns): 5 kernel launches, 290 metric \
          columns from line 5"]
    );
    assert_eq!(d.ncu_kernels.len(), 5);
    let gemm = kernel(&d, 3);
    assert_eq!(gemm.nvtx, ["step0"]);
    let dram = gemm.metric("dram__bytes.sum").unwrap();
    assert_eq!((dram.value, dram.unit.as_str()), (Some(1_288_926_208.0), "byte"));
    assert_eq!(gemm.metric("gpu__time_duration.sum").unwrap().unit, "ns");
    let name = gemm.metric("device__attribute_display_name").unwrap();
    assert_eq!((name.value, name.text.as_str()), (None, "NVIDIA H100 80GB HBM3"));
    assert_eq!(gemm.metric_f64("launch__grid_size"), Some(132.0));
    use Boundedness::*;
    assert_eq!(
        classes(&d, &T80),
        [Some(MemoryBound), Some(LatencyBound), Some(MemoryBound), Some(ComputeAndMemoryBound), Some(MemoryBound)]
    );
    assert_eq!(d.top_ncu_by_dram_bytes(1)[0].id, 3);

    let sol = ncu_file("real/ncu/ncu2025.3_csv_raw_sol_h100.txt");
    assert_eq!(sol.ncu_kernels.len(), 5);
    assert!(sol.ncu_kernels.iter().all(|k| k.metrics.len() == 501));
    assert_eq!(kernel(&sol, 3).memory_throughput_pct(), Some(94.57));
}

#[test]
fn ncu_2025_h100_section_page_with_rule_rows() {
    let d = ncu_file("real/ncu/ncu2025.3_csv_details_sol_h100.txt");
    assert_eq!(
        d.sources[0].read,
        ["ncu details page (ncu 2021+ header (Block/Grid Size, Device, CC), rule columns): 5 kernel launches, 50 metric \
          rows, 5 rule rows from line 5"]
    );
    let k = kernel(&d, 1);
    assert_eq!(k.rules.len(), 1);
    let r = &k.rules[0];
    assert_eq!((r.section.as_str(), r.name.as_str(), r.kind.as_str()), ("SpeedOfLight", "SOLBottleneck", "OPT"));
    assert!(r.description.starts_with("Memory is more heavily utilized than Compute"));
    assert_eq!(r.speedup, None);
    // Display names stand for the metric names.
    assert_eq!(
        (k.memory_throughput_pct(), k.sm_throughput_pct(), k.duration_ns()),
        (Some(79.83), Some(14.55), Some(41_792.0))
    );
    let f = k.metric("DRAM Frequency").unwrap();
    assert_eq!(
        (f.unit.as_str(), f.value, f.section.as_deref()),
        ("hz", Some(2_615_773_353.75), Some("GPU Speed Of Light Throughput"))
    );
    assert_eq!(f.in_base_unit(), Some((2_615_773_353.75, "hz")));
    assert_eq!(k.metric_f64("SM Active Cycles"), Some(74_507.96));
    use Boundedness::*;
    assert_eq!(
        classes(&d, &T80),
        [Some(MemoryBound), Some(LatencyBound), Some(MemoryBound), Some(ComputeAndMemoryBound), Some(MemoryBound)]
    );
}

#[test]
fn ncu_2025_h100_scaled_units() {
    let d = ncu_file("real/ncu/ncu2025.3_csv_details_unitsauto_h100.txt");
    let k0 = kernel(&d, 0);
    let dram = k0.metric("dram__bytes.sum").unwrap();
    assert_eq!((dram.value, dram.unit.as_str()), (Some(246.13), "Mbyte"));
    assert_eq!(k0.dram_bytes(), Some(246_130_000.0));
    assert_eq!(k0.metric("dram__bytes_read.sum").unwrap().unit, "Kbyte");
    assert_eq!(k0.metric("gpu__time_duration.sum").unwrap().unit, "us");
    assert!((k0.duration_ns().unwrap() - 82_270.0).abs() < 1e-6);
    let gemm = kernel(&d, 3);
    assert_eq!(gemm.metric("dram__bytes.sum").unwrap().unit, "Gbyte");
    assert_eq!(gemm.dram_bytes(), Some(1.29e9));
    assert_eq!(gemm.metric("gpu__time_duration.sum").unwrap().unit, "ms");
    assert_eq!(gemm.duration_ns(), Some(1_220_000.0));
}

#[test]
fn ncu_2025_h100_one_rank_nccl() {
    let d = ncu_file("real/ncu/ncu2025.3_csv_details_nccl_h100.txt");
    assert_eq!(d.ncu_kernels.len(), 7);
    let nccl = kernel(&d, 6);
    assert!(nccl.name.starts_with("void <unnamed>::oneRankReduce<FuncPreMulSum<float>>"));
    let c = d.collectives();
    assert_eq!((c.len(), c[0].op, c[0].launches, c[0].total_ns), (1, CollectiveOp::OneRankReduce, 1, 56_640));
    assert_eq!(nccl.classify(&T80), Some(Boundedness::LatencyBound));
    assert_eq!(d.sources[0].skipped, ["before the CSV: 3 profiler lines (`==PROF==` …), 2 lines of program output"]);
}

// ---------------------------------------------------------------------------------------------------------------
// ncu, hand-made layouts

#[test]
fn ncu_locale_details_windows_with_a_cut_row() {
    let d = ncu_file("profilers/ncu_locale_details_win.csv");
    let s = &d.sources[0];
    assert!(s.read[0].contains("comma decimals"), "{:?}", s.read);
    assert_eq!(s.skipped, ["before the CSV: 3 profiler lines (`==PROF==` …), 1 line of program output"]);
    assert_eq!(s.malformed.len(), 1);
    assert_eq!((s.malformed[0].line, s.malformed[0].expected.as_str()), (18, "a `Metric Name` (or a `Rule Name`)"));
    assert_eq!(d.ncu_kernels.len(), 3);
    let ar = kernel(&d, 0);
    assert_eq!(ar.dram_bytes(), Some(27_595_520.0));
    assert_eq!(ar.duration_ns(), Some(1_234.5));
    assert_eq!(ar.classify(&T80), Some(Boundedness::MemoryBound));
    assert_eq!(ar.cc.as_deref(), Some("8.6"));
    let gemm = kernel(&d, 1);
    assert_eq!(gemm.dram_bytes(), Some(1_966_080.0), "read + write, Kbyte = 1000 B");
    assert_eq!(gemm.duration_ns(), Some(98_300.0));
    assert_eq!(gemm.classify(&T80), Some(Boundedness::ComputeBound));
    let na = gemm.metric("sm__warps_active.avg.pct_of_peak_sustained_active").unwrap();
    assert_eq!((na.value, na.text.as_str()), (None, "n/a"));
    let c = d.collectives();
    assert_eq!(
        c.iter().map(|c| (c.op, c.launches)).collect::<Vec<_>>(),
        [(CollectiveOp::AllReduce, 1), (CollectiveOp::Generic, 1)]
    );
}

#[test]
fn ncu_locale_raw_page() {
    let d = ncu_file("profilers/ncu_locale_raw.csv");
    no_malformed(&d);
    assert_eq!(d.ncu_kernels.len(), 2);
    let ag = kernel(&d, 0);
    assert_eq!(ag.dram_bytes(), Some(25_165_824.0));
    assert_eq!(ag.duration_ns(), Some(40_960.0));
    assert_eq!(ag.classify(&T80), Some(Boundedness::MemoryBound));
    assert_eq!(kernel(&d, 1).classify(&T80), Some(Boundedness::ComputeBound));
    assert_eq!(d.collectives()[0].op, CollectiveOp::AllGather);
}

// ---------------------------------------------------------------------------------------------------------------
// What these readers do not know

#[test]
fn unknown_files_are_errors_naming_what_was_looked_for() {
    let ncu_csv = read("real/ncu/ncu2020.2_csv_nvtx_details_stdout_paddle.csv");
    let e = nsys::parse(&ncu_csv, Some("metrics.csv")).unwrap_err().to_string();
    assert!(e.starts_with("not an Nsight Systems stats report: looked for an `nsys stats` header row"), "{e}");
    let nsys_csv = read("real/nsys/nsys2022.4_stats__0919_test/0919_test_gputrace.csv");
    let e = ncu::parse(&nsys_csv, None).unwrap_err().to_string();
    assert!(e.starts_with("not an Nsight Compute CSV: looked for a header row starting `\"ID\",\"Process ID\""), "{e}");
    assert!(e.contains("; found text starting \"Start (ns),Duration (ns),CorrId,GrdX,"), "{e}");
    // A `Section:` table with no launch line above it cannot be read.
    let orphan = "    Section: GPU Speed Of Light Throughput\n    ---- ---- ----\n    Duration  us  1.0\n";
    let e = ncu::parse(orphan, None).unwrap_err().to_string();
    assert!(e.contains("human-readable output (`Section:` blocks) but no kernel header line"), "{e}");
    let e = ncu::parse(&read("real/ncu/ncu2025.3_h100_versions.txt"), None).unwrap_err().to_string();
    assert!(e.contains("found text starting \"/usr/local/cuda/bin/ncu\""), "{e}");
    assert!(ncu::parse("", None).unwrap_err().to_string().ends_with("found an empty text"));
    let none = "==PROF== Connected to process 1 (/usr/bin/python3)\n==WARNING== No kernels were profiled.\n";
    let d = ncu::parse(none, None).unwrap();
    assert!(d.is_empty() && d.sources[0].skipped.iter().any(|s| s.contains("profiled no kernel")));
    assert!(nsys::parse("hello\nworld\n", None).is_err());
    assert!(nsys::parse_files([("a.txt", "hello")]).is_err());
}

/// Prefixes of real files (cut inside a line, a quoted field, a number) parse or fail cleanly. Cuts fall every
/// `stride` bytes and at every line end within the first `window` bytes, and near the end of the file.
#[test]
fn truncated_real_files_never_panic() {
    let files = [
        ("real/nsys/nsys2022.4_stats__0919_test/0919_test_gputrace.csv", 4_000, 13),
        ("real/nsys/nsys_stats_console_8reports_torch.txt", 8_000, 29),
        ("real/nsys/nsys2022.4_stats__0919_test/console_column_stdout.txt", 2_500, 3),
        ("real/ncu/ncu2025.3_csv_details_sol_h100.txt", 5_000, 31),
        ("real/ncu/ncu2020.2_csv_nvtx_details_stdout_torch.txt", 6_000, 97),
        ("real/ncu/ncu2025.3_csv_nvtx_raw_metrics_h100.txt", 6_000, 101),
        ("profilers/ncu_locale_details_win.csv", 3_500, 7),
        ("profilers/console_2024_csv_stdout.txt", 2_500, 5),
    ];
    for (rel, window, stride) in files {
        let text = read(rel);
        let window = window.min(text.len());
        let mut cuts: Vec<usize> = (0..window).step_by(stride).collect();
        cuts.extend(text[..window].match_indices('\n').flat_map(|(i, _)| [i, i + 1]));
        cuts.extend([1, 2, 3, 17, 63].map(|k| text.len().saturating_sub(k)));
        for cut in cuts {
            let Some(prefix) = text.get(..cut) else { continue };
            let _ = (nsys::sniff(prefix), ncu::sniff(prefix));
            let _ = nsys::parse(prefix, Some("x_cuda_gpu_trace.csv"));
            let _ = ncu::parse(prefix, None);
        }
    }
}

#[test]
fn ncu_2020_human_readable_page() {
    let text = read("real/ncu/ncu2020.2_text_nvtx_metrics_torch.txt");
    assert!(ncu::sniff(&text) && !nsys::sniff(&text));
    let d = ncu::parse(&text, Some("ncu2020.2_text_nvtx_metrics_torch.txt")).unwrap();
    no_malformed(&d);
    assert_eq!(d.sources[0].format, "ncu human-readable page (no --csv)");
    assert_eq!(d.sources[0].read, ["14 kernel launches, 140 metric rows"]);
    assert_eq!(d.ncu_kernels.len(), 14);
    let k = kernel(&d, 0);
    assert!(k.name.starts_with("void at::native::index_elementwise_kernel<128, 4,"), "{}", k.name);
    assert_eq!((k.process_id, k.process.as_str(), k.host.as_str()), (Some(2_072_460), "python3.8", "127.0.0.1"));
    assert_eq!(k.kernel_time.as_deref(), Some("2024-Jul-13 20:38:33"));
    assert_eq!((k.context, k.stream), (Some(1), Some(7)));
    assert_eq!(k.nvtx, ["convLayer"]);
    assert_eq!(k.memory_throughput_pct(), Some(6.45));
    assert_eq!(k.sm_throughput_pct(), Some(11.86));
    assert_eq!(k.duration_ns(), Some(5980.0));
    assert_eq!(k.metric_f64("launch__grid_size"), Some(117.0));
    assert_eq!(k.metric("launch__registers_per_thread").unwrap().unit, "register/thread");
    assert_eq!(k.metric("launch__block_size").unwrap().unit, "");
    let gemm = kernel(&d, 3);
    assert_eq!(gemm.name, "ampere_sgemm_32x32_sliced1x4_tn");
    assert_eq!(gemm.kernel_time.as_deref(), Some("2024-Jul-13 20:38:34"));
}

#[test]
fn ncu_2023_human_readable_page() {
    // Hand-made after the documented 2021+ layout (fixtures/profilers/README.md).
    let d = ncu_file("profilers/ncu_human_2023.txt");
    no_malformed(&d);
    assert_eq!(d.ncu_kernels.len(), 2);
    let k = kernel(&d, 0);
    assert!(k.name.ends_with("std::array<char *, 3>)"), "{}", k.name);
    assert_eq!((k.grid, k.block), (Some(Dim3 { x: 65536, y: 1, z: 1 }), Some(Dim3 { x: 128, y: 1, z: 1 })));
    assert_eq!((k.device, k.cc.as_deref(), k.stream), (Some(0), Some("9.0"), Some(7)));
    // Display names: `Memory Throughput` and `Compute (SM) Throughput` stand for the metrics the rules use.
    assert_eq!((k.memory_throughput_pct(), k.sm_throughput_pct()), (Some(92.41), Some(11.02)));
    assert_eq!(k.duration_ns(), Some(179_550.0));
    assert_eq!(k.metric_f64("Elapsed Cycles"), Some(315_022.0));
    assert_eq!(k.metric_f64("SM Active Cycles"), Some(309_114.53));
    // A unit wider than its column, and the advice line after the table, read right.
    assert_eq!(k.metric("Registers Per Thread").unwrap().unit, "register/thread");
    assert_eq!(k.metric_f64("Registers Per Thread"), Some(16.0));
    assert_eq!(k.metric_f64("Threads"), Some(8_388_608.0));
    assert_eq!(k.metrics.len(), 14);
    let g = kernel(&d, 1);
    assert_eq!(g.name, "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_NTN");
    assert_eq!((g.sm_throughput_pct(), g.duration_ns()), (Some(88.64), Some(1_200_000.0)));
}

#[test]
fn ncu_human_page_name_and_unit_one_space_apart() {
    // Both the name and the unit fill their columns: one space between them; the rule's middle column says where
    // the unit is.
    let text = "  k (1, 1, 1)x(32, 1, 1), Context 1, Stream 7, Device 0, CC 9.0\n\
                \x20   Section: Memory Workload Analysis\n\
                \x20   ---------------------------- ------------ ------------\n\
                \x20   Metric Name                   Metric Unit Metric Value\n\
                \x20   ---------------------------- ------------ ------------\n\
                \x20   Memory Throughput Per Second Gbyte/second     1,234.50\n\
                \x20   Mem Busy                                %        41.20\n\
                \x20   ---------------------------- ------------ ------------\n\
                \x20   WRN   Advice below a table is not a metric.\n";
    let d = ncu::parse(text, None).unwrap();
    no_malformed(&d);
    let k = kernel(&d, 0);
    let m = k.metric("Memory Throughput Per Second").expect("name without the unit");
    assert_eq!((m.unit.as_str(), m.value), ("Gbyte/second", Some(1234.5)));
    assert_eq!(k.metric_f64("Mem Busy"), Some(41.2));
    assert_eq!(k.metrics.len(), 2);
}
