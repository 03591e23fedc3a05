//! OOM reports in training logs: every generation of PyTorch's caching-allocator message and the other OOMs
//! (CUDA runtime, cuBLAS, NCCL, HIP, TensorFlow), wrapped, prefixed and interleaved as real logs have them.
//! Numbers are pinned to the byte: `%.2f` of a binary unit times the unit, rounded to the nearest byte; SI units
//! (KB, MB, GB) are powers of 1000. Messages quoted from real reports name their source; the rest are built from
//! the message's grammar in c10/cuda/CUDACachingAllocator.cpp.

use crate::common;
use oomdoc::ingest::oom_log::{parse, LogParse};
use oomdoc::timeline::{OomKind, OomMessage, Stamp};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn one(text: &str) -> OomMessage {
    let p = parse(text, "train.log");
    assert_eq!(p.ooms.len(), 1, "{:#?}", p.ooms);
    p.ooms.into_iter().next().unwrap()
}

/// (requested, total, free, allocated, reserved, non-PyTorch).
type Figures = (Option<u64>, Option<u64>, Option<u64>, Option<u64>, Option<u64>, Option<u64>);

fn figures(o: &OomMessage) -> Figures {
    (o.requested_bytes, o.total_bytes, o.free_bytes, o.allocated_bytes, o.reserved_bytes, o.non_pytorch_bytes)
}

#[test]
fn torch_1_0_to_1_3_cached() {
    // Format notes §4 (1.0–1.3 shape).
    let o = one("RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; \
                 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)\n");
    assert_eq!(o.kind, OomKind::Allocator);
    assert_eq!(o.generation, Some("≤1.3"));
    assert_eq!(o.exception.as_deref(), Some("RuntimeError"));
    assert_eq!(o.device, Some(0));
    assert_eq!(
        figures(&o),
        (
            Some(13_107_200),
            Some(11_725_260_718),
            Some(9_964_324_127),
            Some(8_986_296),
            Some(8_986_296 + 4_907_336),
            Some(11_725_260_718 - 9_964_324_127 - 8_986_296 - 4_907_336)
        )
    );
    // "cached" was the unused part of the cache (the ≤ 1.3 source says so), not its total.
    assert_eq!(o.reserved_unallocated_bytes, Some(4_907_336));
    assert_eq!(o.hint, None);
    assert!(o.text.ends_with("4.68 MiB cached)"), "{}", o.text);
}

#[test]
fn torch_1_0_real_cached_with_kib() {
    // pytorch/pytorch#18853 (2019), quoted in the issue thread.
    let o = one("RuntimeError: CUDA out of memory. Tried to allocate 1024.00 MiB (GPU 0; 15.90 GiB total capacity; \
                 14.25 GiB already allocated; 991.56 MiB free; 607.00 KiB cached)\n");
    assert_eq!(o.requested_bytes, Some(GIB));
    assert_eq!(o.reserved_unallocated_bytes, Some(607 * KIB));
    assert_eq!(o.reserved_bytes, Some(15_300_820_992 + 607 * KIB)); // 14.25 GiB allocated + 607 KiB cached
    assert_eq!(o.free_bytes, Some(1_039_726_019)); // 991.56 MiB
}

#[test]
fn torch_1_4_to_1_12_reserved_in_total_wrapped_with_comment_markers() {
    // inha15/Camera_YOLOv5-HJ E2E_Camera/scripts/clean_cache.py: a 1.10+ message pasted as comments, wrapped at
    // word boundaries with '# ' on every continuation line.
    let o = one("# RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; \
                 130.35 MiB already\n# allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch) If \
                 reserved memory is >> allocated memory try\n# setting max_split_size_mb to avoid fragmentation.\n\
                 # See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n");
    assert_eq!(o.generation, Some("1.4–2.0"));
    assert_eq!(
        figures(&o),
        (
            Some(36 * MIB),
            Some(8_514_772_664),
            Some(49_345_987),
            Some(136_681_882),
            Some(188 * MIB),
            Some(8_514_772_664 - 49_345_987 - 188 * MIB)
        )
    );
    assert_eq!(o.reserved_unallocated_bytes, Some(188 * MIB - 136_681_882));
    assert_eq!(
        o.hint.as_deref(),
        Some(
            "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation. See \
             documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
        )
    );
}

#[test]
fn torch_1_5_malloc_location_and_allowed_fraction() {
    let o = one("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 15.78 GiB total capacity; \
                 9.20 GiB already allocated; 1.13 GiB free; 10.00 GiB allowed; 9.75 GiB reserved in total by PyTorch) \
                 (malloc at /opt/conda/conda-bld/pytorch_1587428266983/work/c10/cuda/CUDACachingAllocator.cpp:289)\n");
    assert_eq!(o.device, Some(1));
    assert_eq!(o.requested_bytes, Some(2 * GIB));
    assert_eq!(o.allowed_bytes, Some(10 * GIB));
    assert_eq!(o.reserved_bytes, Some(10_468_982_784)); // 9.75 GiB
    assert_eq!(o.allocated_bytes, Some(9_878_424_781)); // 9.20 GiB
}

#[test]
fn torch_1_13_out_of_memory_error_and_jupyter_form() {
    let text = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.69 GiB total \
                capacity; 22.61 GiB already allocated; 5.69 MiB free; 22.83 GiB reserved in total by PyTorch) If \
                reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See \
                documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n";
    let o = one(text);
    assert_eq!(o.exception.as_deref(), Some("torch.cuda.OutOfMemoryError"));
    assert_eq!(o.requested_bytes, Some(20 * MIB));
    let j = one(&text.replace("torch.cuda.OutOfMemoryError", "OutOfMemoryError"));
    assert_eq!(j.exception.as_deref(), Some("OutOfMemoryError"));
    assert_eq!(figures(&j), figures(&o));
}

#[test]
fn torch_2_1_capacty_typo_fragmentation_signature() {
    // Format notes §4, 2.1 (lerf #73): 4.84 GiB free in PyTorch's cache vs a 3.00 GiB request.
    let o = one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total \
                 capacty of 23.65 GiB of which 1.66 GiB is free. Including non-PyTorch memory, this process has 20.81 \
                 GiB memory in use. Of the allocated memory 12.09 GiB is allocated by PyTorch, and 4.84 GiB is \
                 reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
                 max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and \
                 PYTORCH_CUDA_ALLOC_CONF\n");
    assert_eq!(o.generation, Some("≥2.1"));
    assert_eq!(o.device, Some(0));
    assert_eq!(o.requested_bytes, Some(3 * GIB));
    assert_eq!(o.total_bytes, Some(25_393_994_138));
    assert_eq!(o.free_bytes, Some(1_782_411_428));
    assert_eq!(o.process_bytes, Some(22_344_567_357));
    assert_eq!(o.allocated_bytes, Some(12_981_538_652));
    assert_eq!(o.reserved_unallocated_bytes, Some(5_196_910_428));
    assert_eq!(o.reserved_bytes, Some(12_981_538_652 + 5_196_910_428));
    assert_eq!(o.non_pytorch_bytes, Some(25_393_994_138 - 1_782_411_428 - 12_981_538_652 - 5_196_910_428));
    assert!(o.reserved_unallocated_bytes.unwrap() >= o.requested_bytes.unwrap());
    assert!(o.hint.as_deref().unwrap().ends_with("PYTORCH_CUDA_ALLOC_CONF"));
}

#[test]
fn torch_2_2_word_wrapped_with_both_process_forms() {
    // pytorch/pytorch#99699's description: wrapped at word boundaries, another process listed before this one.
    let o = one("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB.\n\
                 GPU 0 has a total capacty of 15.90 GiB of which 8.44 MiB is free.\n\
                 Process 1246069 has 577.00 MiB memory in use. Including non-PyTorch memory,\n\
                 this process has 15.32 GiB memory in use. Of the allocated memory\n\
                 14.12 GiB is allocated by PyTorch, and 410.41 MiB is reserved\n\
                 by PyTorch but unallocated. If reserved but unallocated memory is large\n\
                 try setting max_split_size_mb to avoid fragmentation.  See documentation\n \
                 for Memory Management and PYTORCH_CUDA_ALLOC_CONF\n");
    assert_eq!(o.requested_bytes, Some(138 * MIB));
    assert_eq!(o.total_bytes, Some(17_072_495_002));
    assert_eq!(o.free_bytes, Some(8_849_981));
    assert_eq!(o.processes, vec![(1_246_069, 577 * MIB)]);
    assert_eq!(o.process_bytes, Some(16_449_724_744));
    assert_eq!(o.allocated_bytes, Some(15_161_234_555));
    assert_eq!(o.reserved_unallocated_bytes, Some(430_346_076));
    assert!(o.text.ends_with("PYTORCH_CUDA_ALLOC_CONF"), "{}", o.text);
}

#[test]
fn torch_2_3_wrapped_mid_word_by_a_terminal_then_cpp_stack() {
    // pytorch/pytorch#129632: a 200-column terminal broke "0 b|ytes" and the docs URL; a C++ stack follows.
    let o = one("Traceback (most recent call last):\n  File \"/home/XXX/a.py\", line 2, in <module>\n    x = \
                 torch.ones((int(90e9),), device='cuda', dtype=torch.uint8)\ntorch.cuda.OutOfMemoryError: CUDA out \
                 of memory. Tried to allocate 83.82 GiB. GPU 0 has a total capacity of 79.35 GiB of which 78.40 GiB \
                 is free. Process 3456282 has 969.00 MiB memory in use. Of the allocated memory 0 bytes is allocated \
                 by PyTorch, and 0 b\nytes is reserved by PyTorch but unallocated. If reserved but unallocated memory \
                 is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
                 documentation for Memory Management  (https://pytorch.org/docs/stable/notes/c\nuda.html#environment\
                 -variables)\nException raised from malloc at ../c10/cuda/CUDACachingAllocator.cpp:1125 (most recent \
                 call first):\nframe #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57\n");
    assert_eq!(
        figures(&o),
        (Some(90_001_039_688), Some(85_201_413_734), Some(84_181_359_002), Some(0), Some(0), Some(1_020_054_732))
    );
    assert_eq!(o.processes, vec![(3_456_282, 969 * MIB)]);
    assert_eq!(o.user_frame.as_deref(), Some("a.py:2 in <module>"));
    let hint = o.hint.unwrap();
    assert!(hint.contains("expandable_segments:True") && hint.ends_with("#environment-variables)"), "{hint}");
}

#[test]
fn torch_2_5_generic_error_several_processes_new_env_name() {
    // huggingface/trl#5197: four processes listed, PYTORCH_ALLOC_CONF in the hint.
    let o =
        one("> torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.60 GiB. GPU 0 has a total capacity \
                 of 14.74 GiB of which 2.44 GiB is free. Process 21197 has 366.00 MiB memory in use. Process 21194 has \
                 8.07 GiB memory in use. Process 21200 has 3.40 GiB memory in use. Process 21203 has 484.00 MiB memory \
                 in use. Of the allocated memory 7.85 GiB is allocated by PyTorch, and 86.90 MiB is reserved by \
                 PyTorch but unallocated. If reserved but unallocated memory is large try setting \
                 PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory \
                 Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n");
    assert_eq!(o.exception.as_deref(), Some("torch.OutOfMemoryError"));
    assert_eq!(
        o.processes,
        vec![(21197, 366 * MIB), (21194, 8_665_096_520), (21200, 3_650_722_202), (21203, 484 * MIB)]
    );
    assert_eq!(o.reserved_bytes, Some(8_428_873_318 + 91_121_254));
    assert_eq!(o.non_pytorch_bytes, Some(15_826_954_486 - 2_619_930_051 - 8_428_873_318 - 91_121_254));
    assert!(o.hint.unwrap().ends_with("#environment-variables)"));
}

#[test]
fn rocm_hip_message() {
    let o =
        one("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
                 191.98 GiB of which 1.06 GiB is free. Of the allocated memory 180.00 GiB is allocated by PyTorch, and \
                 9.50 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try \
                 setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation \
                 for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n");
    assert_eq!(o.device_type, "HIP");
    assert_eq!(o.requested_bytes, Some(2 * GIB));
    assert_eq!(o.reserved_bytes, Some(180 * GIB + 9 * GIB + GIB / 2));
}

#[test]
fn newest_generic_out_of_memory_with_private_pools_and_allowed() {
    let o = one("torch.OutOfMemoryError: Out of memory. Tried to allocate 512.00 MiB. GPU 2 has a total capacity of \
                 79.19 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.88 GiB \
                 memory in use. 70.00 GiB allowed; Of the allocated memory 68.00 GiB is allocated by PyTorch, with \
                 4.00 GiB allocated in private pools (e.g., CUDA Graphs), and 1.50 GiB is reserved by PyTorch but \
                 unallocated. If reserved but unallocated memory is large try setting \
                 PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n");
    assert_eq!(o.device, Some(2));
    assert_eq!(o.allowed_bytes, Some(70 * GIB));
    assert_eq!(o.private_pool_bytes, Some(4 * GIB));
    assert_eq!(o.allocated_bytes, Some(68 * GIB));
    assert_eq!(o.reserved_bytes, Some(68 * GIB + 3 * GIB / 2));
}

#[test]
fn sizes_in_every_unit() {
    let msg = |req: &str, unit: &str| {
        format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req}. GPU 0 has a total capacity of \
             2.00 {unit} of which 0 bytes is free. Of the allocated memory 1024.00 KiB is allocated by PyTorch, and \
             1024 bytes is reserved by PyTorch but unallocated.\n"
        )
    };
    let cases: [(&str, &str, u64, u64); 8] = [
        ("512 B", "GiB", 512, 2 * GIB),
        ("1.50 TiB", "TiB", 1_649_267_441_664, 2 << 40),
        ("13535.27 GiB", "EiB", 14_533_385_498_132, 2 << 60),
        ("2.00 GB", "GB", 2_000_000_000, 2_000_000_000),
        ("500.00 MB", "MB", 500_000_000, 2_000_000),
        ("750.00 KB", "KB", 750_000, 2_000),
        ("12.50 KiB", "MiB", 12_800, 2 * MIB),
        ("1.00 EiB", "TB", 1 << 60, 2_000_000_000_000),
    ];
    for (req, unit, want_req, want_total) in cases {
        let o = one(&msg(req, unit));
        assert_eq!(o.requested_bytes, Some(want_req), "{req}");
        assert_eq!(o.total_bytes, Some(want_total), "{unit}");
        assert_eq!(o.free_bytes, Some(0));
        assert_eq!(o.allocated_bytes, Some(MIB));
        assert_eq!(o.reserved_unallocated_bytes, Some(1024));
    }
}

#[test]
fn more_than_one_exabyte() {
    let o = one("RuntimeError: CUDA out of memory. Tried to allocate more than 1EB memory.\n");
    assert_eq!(o.requested_bytes, Some(1 << 60));
    assert!(o.requested_at_least);
    assert_eq!(o.total_bytes, None);
}

#[test]
fn windows_allocated_beyond_capacity_gives_no_non_pytorch_figure() {
    // suno-ai/bark usage comment (real): no per-process part, 14.51 GiB allocated on an 8 GiB card.
    let o = one("#  CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 8.00 GiB of\n\
                 # which 0 bytes is free. Of the allocated memory 14.51 GiB is allocated by PyTorch,\n\
                 # and 15.90 MiB is reserved by PyTorch but unallocated.\n# preload_models()\n");
    assert_eq!(o.requested_bytes, Some(20 * MIB));
    assert_eq!(o.allocated_bytes, Some(15_579_993_866));
    assert_eq!(o.process_bytes, None);
    assert_eq!(o.non_pytorch_bytes, None);
}

#[test]
fn logger_prefix_and_first_sentence_stripped() {
    // fairseq's trainer logs the exception after its own prefix (format notes §4).
    let o =
        one("2020-08-06 07:12:50 | WARNING | fairseq.trainer | OOM: Ran out of memory with exception: CUDA out of \
                 memory. Tried to allocate 1.25 GiB (GPU 0; 10.92 GiB total capacity; 8.61 GiB already allocated; \
                 1.14 GiB free; 8.95 GiB reserved in total by PyTorch)\n");
    assert_eq!(o.requested_bytes, Some(1_342_177_280));
    assert_eq!(o.exception, None);
    assert!(matches!(o.stamp, Some(Stamp::Local(_))));
    // A message quoted without "CUDA out of memory.", one sentence per line.
    let o = one("Tried to allocate 15.00 GiB.\nGPU 0 has a total capacity of 14.56 GiB of which 6.91 GiB is free.\n\
                 Including non-PyTorch memory, this process has 7.65 GiB memory in use.\nOf the allocated memory 7.23 \
                 GiB is allocated by PyTorch,\nand 301.94 MiB is reserved by PyTorch but unallocated.\n");
    assert_eq!(o.requested_bytes, Some(15 * GIB));
    assert_eq!(o.reserved_unallocated_bytes, Some(316_607_037)); // 301.94 MiB
}

#[test]
fn every_line_stamped_by_a_logger() {
    let o = one("2024-05-01 10:00:00,123 ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 \
                 GiB. GPU 0 has a total capacity of 39.38 GiB\n2024-05-01 10:00:00,123 ERROR of which 100.00 MiB is \
                 free. Of the allocated memory 37.00 GiB is allocated by PyTorch, and 1.50 GiB is\n2024-05-01 \
                 10:00:00,124 ERROR reserved by PyTorch but unallocated.\n2024-05-01 10:00:01,000 INFO next record\n");
    assert_eq!(o.free_bytes, Some(100 * MIB));
    assert_eq!(o.reserved_unallocated_bytes, Some(3 * GIB / 2));
    assert!(!o.text.contains("next record"), "{}", o.text);
}

#[test]
fn interleaved_ranks_with_torchrun_prefixes() {
    let log = "\
[rank0]: Traceback (most recent call last):
[rank1]: Traceback (most recent call last):
[rank0]:   File \"/workspace/train.py\", line 88, in <module>
[rank1]:   File \"/workspace/train.py\", line 88, in <module>
[rank0]:     loss = step(batch)
[rank1]:     loss = step(batch)
[rank0]:   File \"/workspace/train.py\", line 51, in step
[rank1]:   File \"/workspace/train.py\", line 47, in step
[rank1]:   File \"/usr/lib/python3.11/site-packages/torch/nn/modules/module.py\", line 1751, in _wrapped_call_impl
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 1 has a total capacity of 79.19
[rank1]:  GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.18 GiB memory in use. Of
[rank0]:  GiB of which 3.00 GiB is free. Including non-PyTorch memory, this process has 76.18 GiB memory in use. Of
[rank0]:  the allocated memory 70.00 GiB is allocated by PyTorch, and 2.50 GiB is reserved by PyTorch but unallocated.
[rank1]:  the allocated memory 72.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.
E0514 12:00:01.123000 140 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1)
";
    let p = parse(log, "run.log");
    assert_eq!(p.ooms.len(), 2);
    let (r0, r1) = (&p.ooms[0], &p.ooms[1]);
    assert_eq!((r0.rank, r0.device, r0.line), (Some(0), Some(0), 10));
    assert_eq!((r1.rank, r1.device, r1.line), (Some(1), Some(1), 11));
    assert_eq!(r0.requested_bytes, Some(2 * GIB));
    assert_eq!(r1.requested_bytes, Some(4 * GIB));
    assert_eq!(r0.free_bytes, Some(3 * GIB));
    assert_eq!(r1.free_bytes, Some(GIB));
    assert_eq!(r0.reserved_bytes, Some(72 * GIB + GIB / 2));
    assert_eq!(r1.reserved_bytes, Some(73 * GIB));
    assert_eq!(r0.user_frame.as_deref(), Some("train.py:51 in step"));
    assert_eq!(r1.user_frame.as_deref(), Some("train.py:47 in step"));
    assert!(p.malformed.is_empty());
}

#[test]
fn srun_and_vllm_worker_prefixes() {
    let p = parse(
        "0: RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 31.75 GiB total capacity; 30.34 \
         GiB already allocated; 13.50 MiB free; 30.70 GiB reserved in total by PyTorch)\n\
         (VllmWorker rank=1 pid=254) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.25 GiB. GPU 1 \
         has a total capacity of 93.02 GiB of which 1.18 GiB is free. Process 2752205 has 91.82 GiB memory in use. \
         Of the allocated memory 90.63 GiB is allocated by PyTorch, and 120.54 MiB is reserved by PyTorch but \
         unallocated.\n",
        "x",
    );
    assert_eq!(p.ooms.len(), 2);
    assert_eq!((p.ooms[0].rank, p.ooms[0].device, p.ooms[0].requested_bytes), (Some(0), Some(0), Some(20 * MIB)));
    let v = &p.ooms[1];
    assert_eq!((v.rank, v.device), (Some(1), Some(1)));
    assert_eq!(v.processes, vec![(2_752_205, 98_590_974_280)]);
    assert_eq!(v.non_pytorch_bytes, Some(99_879_464_468 - 1_267_015_352 - 97_313_221_509 - 126_395_351));
}

#[test]
fn cuda_runtime_errors() {
    let o =
        one("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some \
                 other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing \
                 CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n");
    assert_eq!(o.kind, OomKind::RuntimeError);
    assert_eq!((o.requested_bytes, o.device, o.total_bytes), (None, None, None));
    assert!(o.text.ends_with("device-side assertions."), "{}", o.text);
    let o = one("torch.AcceleratorError: CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation' in \
                 https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n");
    assert_eq!((o.kind, o.exception.as_deref()), (OomKind::RuntimeError, Some("torch.AcceleratorError")));
    let o = one("RuntimeError: HIP error: out of memory\n");
    assert_eq!((o.kind, o.device_type.as_str()), (OomKind::RuntimeError, "HIP"));
    let o = one(
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510\n",
    );
    assert_eq!(o.kind, OomKind::RuntimeError);
}

#[test]
fn cublas_alloc_failed() {
    let o = one("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`\n");
    assert_eq!(o.kind, OomKind::CublasAllocFailed);
    assert_eq!(o.requested_bytes, None);
    assert!(o.text.ends_with("`cublasCreate(handle)`"), "{}", o.text);
}

#[test]
fn nccl_cuda_failure_with_its_calloc_size() {
    let p = parse(
        "node-3:4123:4188 [3] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'\n\
         [5] include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n\
         [5] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes\n\
         torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, \
         unhandled cuda error\n",
        "x",
    );
    assert_eq!(p.ooms.len(), 2, "{:#?}", p.ooms);
    assert_eq!((p.ooms[0].kind, p.ooms[0].device, p.ooms[0].requested_bytes), (OomKind::Nccl, Some(3), None));
    assert_eq!(
        (p.ooms[1].kind, p.ooms[1].device, p.ooms[1].requested_bytes),
        (OomKind::Nccl, Some(5), Some(6_291_456))
    );
}

#[test]
fn tensorflow_bfc() {
    let o =
        one("2019-01-01 12:00:00.000000: E tensorflow/stream_executor/cuda/cuda_driver.cc:806] failed to allocate \
                 17.79G (19104890880 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory\n");
    assert_eq!((o.kind, o.requested_bytes), (OomKind::Tensorflow, Some(19_104_890_880)));
}

#[test]
fn every_oom_of_a_long_log_in_order_and_malformed_counted() {
    let mut log = String::new();
    for i in 0..3 {
        log.push_str(&format!("step {i} loss 1.0\n"));
        log.push_str(&format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {i}.00 GiB. GPU {i} has a total capacity \
             of 23.65 GiB of which 1.00 GiB is free. Of the allocated memory 20.00 GiB is allocated by PyTorch, and \
             1.00 GiB is reserved by PyTorch but unallocated.\n\n"
        ));
    }
    log.push_str("torch.OutOfMemoryError: CUDA out of memory.\n");
    let LogParse { ooms, malformed } = parse(&log, "x");
    assert_eq!(ooms.len(), 4);
    assert_eq!(ooms.iter().map(|o| o.device).collect::<Vec<_>>(), vec![Some(0), Some(1), Some(2), None]);
    assert_eq!(ooms[2].requested_bytes, Some(2 * GIB));
    assert_eq!(ooms.iter().map(|o| o.line).collect::<Vec<_>>(), vec![2, 5, 8, 10]);
    assert_eq!(malformed.len(), 1);
    assert_eq!(malformed[0].line, 10);
}

#[test]
fn garbage_never_panics() {
    let mut s = String::new();
    for i in 0..2000u32 {
        let c = char::from_u32(32 + (i * 7919) % 95).unwrap();
        s.push(c);
        if i % 37 == 0 {
            s.push_str(" Tried to allocate ");
        }
        if i % 53 == 0 {
            s.push_str("out of memory GPU 9 has a total capac\n");
        }
    }
    let _ = parse(&s, "x");
    let _ = parse("Tried to allocate 99999999999999999999999999.99 EiB. GPU 99999999999999999999 has", "x");
    let _ = parse("\u{0}\u{1b}[31mCUDA out of memory\r\n\r\n", "x");
}

// ---- Other accelerators' messages, and the newest CUDA endings (texts as read in their sources: the XPU allocator,
// ---- torch_npu's NPUCachingAllocator, hipified CUDA, CUDACachingAllocator of 2026) -----------------------------

#[test]
fn xpu_message_with_its_empty_cache_advice() {
    // c10/xpu/XPUCachingAllocator.cpp: no per-process part, no env hint; free may be total − reserved.
    let o =
        one("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of \
         11.93 GiB of which 5.62 MiB is free. Of the allocated memory 10.43 GiB is allocated by PyTorch, and \
         94.57 MiB is reserved by PyTorch but unallocated. Please use `empty_cache` to release all unoccupied cached \
         memory.\n");
    assert_eq!(
        (o.kind, o.device_type.as_str(), o.device, o.generation),
        (OomKind::Allocator, "XPU", Some(0), Some("≥2.1"))
    );
    assert_eq!(o.requested_bytes, Some(20 * MIB));
    assert_eq!(o.total_bytes, Some(12_809_739_960));
    assert_eq!(o.free_bytes, Some(5_892_997));
    assert_eq!(o.allocated_bytes, Some(11_199_127_224));
    assert_eq!(o.reserved_unallocated_bytes, Some(99_163_832));
    assert_eq!(o.limit, None);
}

#[test]
fn npu_message_in_the_old_layout_with_current_active() {
    // torch_npu NPUCachingAllocator.cpp, the classic form (a space before "If"), and the newer one (").If").
    for sep in [" ", "."] {
        let o = one(&format!(
            "RuntimeError: NPU out of memory. Tried to allocate 260.00 MiB (NPU 2; 28.50 GiB total capacity; 10.24 \
             GiB already allocated; 10.24 GiB current active; 149.57 MiB free; 10.28 GiB reserved in total by \
             PyTorch){sep}If reserved memory is >> allocated memory try setting max_split_size_mb to avoid \
             fragmentation.\n[ERROR] 2026-03-02-11:04:17 (PID:4242, Device:2, RankID:-1) ERR00006 PTA memory error\n"
        ));
        assert_eq!((o.device_type.as_str(), o.device, o.generation), ("NPU", Some(2), Some("1.4–2.0")), "{sep:?}");
        assert_eq!(o.requested_bytes, Some(260 * MIB));
        assert_eq!(o.total_bytes, Some(30_601_641_984));
        assert_eq!(o.allocated_bytes, Some(10_995_116_278));
        assert_eq!(o.active_bytes, Some(10_995_116_278));
        assert_eq!(o.free_bytes, Some(156_835_512));
        assert_eq!(o.reserved_bytes, Some(11_038_065_951));
        let hint = o.hint.unwrap();
        assert!(hint.starts_with("If reserved memory is") && hint.ends_with("avoid fragmentation."), "{hint}");
        assert!(!o.text.contains("PTA"), "the vendor's error block is not the message: {}", o.text);
    }
}

#[test]
fn hip_message_names_its_own_variable() {
    let o =
        one("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 278.00 MiB. GPU 0 has a total capacity of \
         63.98 GiB of which 190.00 MiB is free. Of the allocated memory 59.51 GiB is allocated by PyTorch, and 3.95 \
         GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
         PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory \
         Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n");
    assert_eq!(o.device_type, "HIP");
    assert_eq!(o.requested_bytes, Some(278 * MIB));
    assert!(o.hint.unwrap().contains("PYTORCH_HIP_ALLOC_CONF"));
}

#[test]
fn newest_cuda_message_ends_at_its_new_docs_link() {
    let o = one(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
         79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in \
         use. Of the allocated memory 71.20 GiB is allocated by PyTorch, and 6.31 GiB is reserved by PyTorch but \
         unallocated. If reserved but unallocated memory is large try setting \
         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory \
         Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)\n\
         capture: wrote oom.pickle\n",
    );
    assert_eq!(o.requested_bytes, Some(2 * GIB));
    let hint = o.hint.unwrap();
    assert!(hint.ends_with("#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"), "{hint}");
    assert!(!o.text.contains("capture:"), "{}", o.text);
}

/// The three refusals of the allocator's own limits, each a cause with its own fix.
const PREEMPTIVE: &str = "torch.OutOfMemoryError: CUDA out of memory. Allocation was preemptively rejected because it \
                          would exceed per_process_memory_fraction limit. Requested size: 1.50 GiB\n";
const RESERVE: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 24.00 GiB. GPU 0 has a total \
                       capacity of 79.19 GiB of which 40.11 GiB is free. Of the allocated memory 30.02 GiB is \
                       allocated by PyTorch, and 8.20 GiB is reserved by PyTorch but unallocated. This allocation \
                       exceeds the expandable-segment reserve of 20.00 GiB for this stream; raise it with \
                       expandable_segments_reserve_by_class in PYTORCH_CUDA_ALLOC_CONF.\n";
const ADDRESS: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total \
                       capacity of 79.19 GiB of which 70.00 GiB is free. Of the allocated memory 1.02 GiB is allocated \
                       by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. The expandable segments \
                       over-reserved virtual address space; reduce it via expandable_segments_reserve in \
                       PYTORCH_CUDA_ALLOC_CONF.\n";

#[test]
fn each_allocator_limit_message_is_read_with_its_figures() {
    use oomdoc::timeline::OomLimit;
    let o = one(PREEMPTIVE);
    assert_eq!(
        (o.kind, o.limit, o.requested_bytes),
        (OomKind::Allocator, Some(OomLimit::FractionRejected), Some(1610612736))
    );
    let o = one(RESERVE);
    assert_eq!(
        (o.limit, o.reserve_bytes, o.requested_bytes),
        (Some(OomLimit::ExpandableReserve), Some(20 * GIB), Some(24 * GIB))
    );
    assert!(o.text.ends_with("PYTORCH_CUDA_ALLOC_CONF."), "the ending is kept: {}", o.text);
    let o = one(ADDRESS);
    assert_eq!(o.limit, Some(OomLimit::AddressSpace));
}

fn log_findings(text: &str) -> Vec<(String, String, String)> {
    let f = common::TempFile::with("limit.log", text.as_bytes());
    let v = common::analyze_json(&[f.path()]);
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let s = |k: &str| x[k].as_str().unwrap_or_default().to_string();
            (s("rule"), s("message"), s("fix"))
        })
        .collect()
}

#[test]
fn each_allocator_limit_message_gives_its_own_cause_and_fix() {
    for (text, fix) in [
        (PREEMPTIVE, "Raise per_process_memory_fraction"),
        (RESERVE, "Raise the reserve for that stream"),
        (ADDRESS, "Reduce the reserve"),
    ] {
        let found = log_findings(text);
        let limit = found.iter().find(|(r, ..)| r == "allocator-limit").unwrap_or_else(|| panic!("{found:?}"));
        assert!(limit.2.starts_with(fix), "{}", limit.2);
    }
}

#[test]
fn a_plain_oom_message_names_no_allocator_limit() {
    let found = log_findings(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 \
         GiB of which 1.02 GiB is free. Of the allocated memory 71.20 GiB is allocated by PyTorch, and 6.31 GiB is \
         reserved by PyTorch but unallocated.\n",
    );
    assert!(found.iter().all(|(r, ..)| r != "allocator-limit"), "{found:?}");
}
