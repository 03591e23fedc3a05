//! What the profiler exports of a job say, summarised for the report and turned into facts: NCCL collectives per
//! optimizer step and per micro-batch (nsys GPU trace), allocator churn (cudaMalloc/cudaFree calls), copy volume,
//! the kernels that took the most time, the driver's own allocation timeline (nsys SQLite with
//! `--cuda-memory-usage`), and per kernel the Nsight Compute metrics the `kernel-bound` rule classifies.

use serde::Serialize;

use super::facts::{Facts, Unit};
use crate::timeline::profile::{CopyDirection, DriverMemoryEvent, DriverMemoryOp, NcuKernel, ProfileData};

mod allocator_calls;
mod kernels;
mod nccl;
mod steps;

pub use allocator_calls::AllocatorCalls;
pub use kernels::{short_kernel_name, top_by, BoundThresholds, Boundedness};
pub use nccl::{nccl_collective, Collective, CollectiveCount, CollectiveOp, NcclNaming, RangeCollectives};
pub use steps::{is_optimizer_kernel, MicrobatchCue, StepCounts, StepStructure};

/// How many kernels each top list shows.
const TOP_KERNELS: usize = 5;

#[derive(Debug, Serialize)]
pub struct ProfileSummary {
    /// nsys kernel summary: the kernels with the most GPU time.
    pub kernels_by_time: Vec<KernelTime>,
    /// GPU time of every kernel in the summary.
    pub kernel_time_ns: u64,
    pub collectives: Vec<CollectiveCount>,
    /// Optimizer steps in the GPU trace and the all-reduces of each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<StepSummary>,
    /// Collective launches per NVTX range (nsys `nvtx_kern_sum`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub collectives_per_nvtx_range: Vec<RangeCollectives>,
    /// cudaMalloc/cudaFree calls and time; `null` without a CUDA API summary.
    pub allocator_calls: Option<AllocatorCalls>,
    /// Total CUDA API time, for the allocator calls' share.
    pub api_time_ns: u64,
    pub copies: Vec<CopyVolume>,
    /// Device memory the CUDA driver handed out over time, per device (nsys SQLite, `--cuda-memory-usage`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub driver_memory: Vec<DriverMemory>,
    /// Nsight Compute launches, the longest first (at most `--top`), with the class the `kernel-bound` rule gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ncu: Option<NcuSummary>,
}

#[derive(Debug, Serialize)]
pub struct KernelTime {
    pub name: String,
    pub instances: u64,
    pub total_ns: u64,
    /// Share of all kernel time in the summary.
    pub share: f64,
}

#[derive(Debug, Serialize)]
pub struct StepSummary {
    /// Complete steps (each ended by optimizer kernels).
    pub steps: usize,
    pub steps_with_allreduce: usize,
    /// Medians over the steps that all-reduced.
    pub allreduce_per_step: u64,
    pub microbatches_per_step: u64,
    pub allreduce_microbatches_per_step: u64,
    pub per_step: Vec<StepCounts>,
}

#[derive(Debug, Serialize)]
pub struct CopyVolume {
    pub direction: CopyDirection,
    pub bytes: u64,
    pub count: u64,
}

#[derive(Debug, Serialize)]
pub struct DriverMemory {
    pub device: i64,
    pub allocations: u64,
    pub frees: u64,
    pub peak_bytes: u64,
    /// Nanoseconds since the capture started.
    pub peak_time_ns: u64,
    /// Still allocated at the end of the capture.
    pub end_bytes: u64,
    /// Live bytes at 32 even points of the capture, for a sparkline.
    pub curve: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub struct NcuSummary {
    pub kernels: usize,
    /// How many launches each class of the `kernel-bound` rule holds (`memory-bound`, …; `unclassified` for those
    /// no case matched).
    pub classes: Vec<(String, usize)>,
    pub by_time: Vec<NcuRow>,
    pub by_dram_bytes: Vec<NcuRow>,
}

#[derive(Debug, Serialize, Clone)]
pub struct NcuRow {
    /// Index in the profile's Nsight Compute launches.
    #[serde(skip)]
    pub index: usize,
    pub id: u64,
    pub name: String,
    pub duration_ns: Option<f64>,
    pub memory_throughput_pct: Option<f64>,
    pub sm_throughput_pct: Option<f64>,
    pub dram_bytes: Option<f64>,
    pub l1_global_bytes: Option<f64>,
    /// The `kernel-bound` rule's case label, once rules ran.
    pub class: Option<String>,
}

fn row(index: usize, k: &NcuKernel) -> NcuRow {
    NcuRow {
        index,
        id: k.id,
        name: k.name.clone(),
        duration_ns: k.duration_ns(),
        memory_throughput_pct: k.memory_throughput_pct(),
        sm_throughput_pct: k.sm_throughput_pct(),
        dram_bytes: k.dram_bytes(),
        l1_global_bytes: k.l1_global_bytes(),
        class: None,
    }
}

fn driver_memory(p: &ProfileData) -> Vec<DriverMemory> {
    // Pinned and pageable allocations are host memory, whatever device they were registered with.
    let on_device = |e: &&DriverMemoryEvent| {
        let k = e.mem_kind.to_ascii_lowercase();
        !(k.contains("pinned") || k.contains("pageable"))
    };
    let mut devices: Vec<i64> = p.memory_events.iter().filter(on_device).map(|e| e.device).collect();
    devices.sort_unstable();
    devices.dedup();
    devices
        .into_iter()
        .map(|device| {
            let mut evs: Vec<_> = p.memory_events.iter().filter(on_device).filter(|e| e.device == device).collect();
            // Several exports merged are each in time order, not together.
            evs.sort_by_key(|e| e.time_ns);
            let (t0, t1) = (evs.first().map_or(0, |e| e.time_ns), evs.last().map_or(0, |e| e.time_ns));
            let mut live: i128 = 0;
            let mut d = DriverMemory {
                device,
                allocations: 0,
                frees: 0,
                peak_bytes: 0,
                peak_time_ns: t0,
                end_bytes: 0,
                curve: vec![0; 32],
            };
            let span = t1.saturating_sub(t0).max(1) as f64;
            let mut bucket_max: Vec<Option<u64>> = vec![None; 32];
            for e in &evs {
                match e.op {
                    DriverMemoryOp::Alloc => {
                        d.allocations += 1;
                        live += i128::from(e.bytes);
                    }
                    DriverMemoryOp::Free => {
                        d.frees += 1;
                        live -= i128::from(e.bytes);
                    }
                }
                let now = live.max(0) as u64;
                if now > d.peak_bytes {
                    d.peak_bytes = now;
                    d.peak_time_ns = e.time_ns;
                }
                let b = ((e.time_ns.saturating_sub(t0) as f64 / span) * 31.0).round() as usize;
                let slot = &mut bucket_max[b.min(31)];
                *slot = Some(slot.map_or(now, |m| m.max(now)));
            }
            // Points with no event carry the level of the last one before them.
            let mut level = 0;
            for (i, m) in bucket_max.iter().enumerate() {
                level = m.unwrap_or(level);
                d.curve[i] = level;
            }
            d.end_bytes = live.max(0) as u64;
            d
        })
        .collect()
}

/// `None` when no profiler export was read.
pub fn summarize(p: &ProfileData, top: usize) -> Option<ProfileSummary> {
    if p.is_empty() {
        return None;
    }
    let kernel_time_ns: u64 = p.kernels.iter().map(|k| k.time.total_ns).sum();
    let kernels_by_time = p
        .top_kernels_by_time(TOP_KERNELS)
        .into_iter()
        .map(|k| KernelTime {
            name: k.name.clone(),
            instances: k.instances,
            total_ns: k.time.total_ns,
            share: if kernel_time_ns > 0 { k.time.total_ns as f64 / kernel_time_ns as f64 } else { 0.0 },
        })
        .collect();
    let steps = p.step_structure().map(|s| StepSummary {
        steps: s.steps.len(),
        steps_with_allreduce: s.steps_with_allreduce(),
        allreduce_per_step: s.median(|c| c.allreduce_launches),
        microbatches_per_step: s.median(|c| c.microbatches),
        allreduce_microbatches_per_step: s.median(|c| c.microbatches_with_allreduce),
        per_step: s.steps.clone(),
    });
    let has_api = !p.api.is_empty() || p.combined.iter().any(|c| c.category == "CUDA_API");
    let api_time_ns = if p.api.is_empty() {
        p.combined.iter().filter(|c| c.category == "CUDA_API").map(|c| c.time.total_ns).sum()
    } else {
        p.api.iter().map(|a| a.time.total_ns).sum()
    };
    let copies = [CopyDirection::HostToDevice, CopyDirection::DeviceToHost, CopyDirection::DeviceToDevice]
        .into_iter()
        .filter_map(|dir| p.copy_volume(dir).map(|(bytes, count)| CopyVolume { direction: dir, bytes, count }))
        .collect();
    let ncu = (!p.ncu_kernels.is_empty()).then(|| {
        let rows: Vec<NcuRow> = p.ncu_kernels.iter().enumerate().map(|(i, k)| row(i, k)).collect();
        NcuSummary {
            kernels: rows.len(),
            classes: Vec::new(),
            by_time: top_by(&rows, top, |r| r.duration_ns).into_iter().cloned().collect(),
            by_dram_bytes: top_by(&rows, top, |r| r.dram_bytes).into_iter().cloned().collect(),
        }
    });
    Some(ProfileSummary {
        kernels_by_time,
        kernel_time_ns,
        collectives: p.collectives(),
        steps,
        collectives_per_nvtx_range: p.collectives_per_nvtx_range(),
        allocator_calls: has_api.then(|| p.allocator_calls()),
        api_time_ns,
        copies,
        driver_memory: driver_memory(p),
        ncu,
    })
}

impl ProfileSummary {
    /// Records the classes the `kernel-bound` rule gave each Nsight Compute launch (by launch index).
    pub fn set_ncu_classes(&mut self, classes: &[Option<String>]) {
        let Some(ncu) = &mut self.ncu else { return };
        let mut counts: Vec<(String, usize)> = Vec::new();
        for c in classes {
            let label = c.clone().unwrap_or_else(|| "unclassified".into());
            match counts.iter_mut().find(|(l, _)| *l == label) {
                Some((_, n)) => *n += 1,
                None => counts.push((label, 1)),
            }
        }
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ncu.classes = counts;
        for r in ncu.by_time.iter_mut().chain(ncu.by_dram_bytes.iter_mut()) {
            r.class = classes.get(r.index).cloned().flatten();
        }
    }
}

/// Job-level facts (`nsys.*`, `ncu.*`) for the rules.
pub fn facts(s: &ProfileSummary, f: &mut Facts) {
    f.flag("profile.present", true, "a profiler export (nsys or ncu) was read");
    let launches = |op: CollectiveOp| s.collectives.iter().filter(|c| c.op == op).map(|c| c.launches).sum::<u64>();
    if !s.collectives.is_empty() {
        f.num(
            "nsys.allreduce_launches",
            launches(CollectiveOp::AllReduce) as f64,
            Unit::Count,
            "NCCL all-reduce launches",
        );
        f.num(
            "nsys.collective_launches",
            s.collectives.iter().map(|c| c.launches).sum::<u64>() as f64,
            Unit::Count,
            "NCCL collective launches of every kind",
        );
        f.num(
            "nsys.collective_time",
            s.collectives.iter().map(|c| c.total_ns).sum::<u64>() as f64 / 1e3,
            Unit::Micros,
            "GPU time in NCCL collective kernels",
        );
    }
    f.flag(
        "nsys.steps_known",
        s.steps.is_some(),
        "a GPU trace showed optimizer steps and all-reduces (the per-step facts below exist)",
    );
    if let Some(st) = &s.steps {
        f.num("nsys.optimizer_steps", st.steps as f64, Unit::Count, "optimizer steps in the GPU trace");
        f.num("nsys.steps_with_allreduce", st.steps_with_allreduce as f64, Unit::Count, "steps that all-reduced");
        f.num(
            "nsys.allreduce_per_step",
            st.allreduce_per_step as f64,
            Unit::Count,
            "all-reduce launches per optimizer step (median)",
        );
        f.num(
            "nsys.microbatches_per_step",
            st.microbatches_per_step as f64,
            Unit::Count,
            "micro-batches (input copies to the GPU) per optimizer step (median)",
        );
        f.num(
            "nsys.allreduce_microbatches_per_step",
            st.allreduce_microbatches_per_step as f64,
            Unit::Count,
            "micro-batches per optimizer step during which gradients were all-reduced (median)",
        );
    }
    if let Some(r) = s
        .collectives_per_nvtx_range
        .iter()
        .filter(|r| r.op == CollectiveOp::AllReduce && r.range_instances > 0)
        // The first range with the most per instance.
        .rev()
        .max_by(|a, b| (a.launches * b.range_instances).cmp(&(b.launches * a.range_instances)))
    {
        f.num(
            "nsys.allreduce_per_nvtx_range",
            r.launches as f64 / r.range_instances as f64,
            Unit::Plain,
            "all-reduce launches per instance of the NVTX range with the most",
        );
        f.text("nsys.allreduce_nvtx_range", r.range.clone(), "that NVTX range");
    }
    if let Some(a) = &s.allocator_calls {
        f.num("nsys.malloc_calls", a.device_alloc_calls as f64, Unit::Count, "cudaMalloc (and relatives) calls");
        f.num("nsys.free_calls", a.device_free_calls as f64, Unit::Count, "cudaFree (and relatives) calls");
        f.num("nsys.malloc_time", a.device_alloc_ns as f64 / 1e3, Unit::Micros, "time in cudaMalloc calls");
        f.num("nsys.free_time", a.device_free_ns as f64 / 1e3, Unit::Micros, "time in cudaFree calls");
        f.num("nsys.api_time", s.api_time_ns as f64 / 1e3, Unit::Micros, "time in all CUDA API calls");
        if s.api_time_ns > 0 {
            f.num(
                "nsys.allocator_api_share",
                (a.device_alloc_ns + a.device_free_ns) as f64 / s.api_time_ns as f64,
                Unit::Ratio,
                "cudaMalloc + cudaFree time as a share of all CUDA API time",
            );
        }
    }
    for c in &s.copies {
        let (bytes, count, doc_b, doc_n) = match c.direction {
            CopyDirection::HostToDevice => {
                ("nsys.h2d_bytes", "nsys.h2d_copies", "bytes copied host to device", "host-to-device copies")
            }
            CopyDirection::DeviceToHost => {
                ("nsys.d2h_bytes", "nsys.d2h_copies", "bytes copied device to host", "device-to-host copies")
            }
            _ => ("nsys.d2d_bytes", "nsys.d2d_copies", "bytes copied device to device", "device-to-device copies"),
        };
        f.num(bytes, c.bytes as f64, Unit::Bytes, doc_b);
        f.num(count, c.count as f64, Unit::Count, doc_n);
    }
    if let Some(d) = s.driver_memory.iter().max_by_key(|d| d.peak_bytes) {
        f.num(
            "nsys.driver_peak_bytes",
            d.peak_bytes as f64,
            Unit::Bytes,
            "most device memory the driver had handed out",
        );
        f.num("nsys.driver_peak_device", d.device as f64, Unit::Count, "the device of that peak");
        f.num("nsys.driver_allocations", d.allocations as f64, Unit::Count, "device allocations the driver saw there");
        f.num("nsys.driver_frees", d.frees as f64, Unit::Count, "device frees the driver saw there");
        f.num("nsys.driver_end_bytes", d.end_bytes as f64, Unit::Bytes, "still allocated at the end of the capture");
    }
    if let Some(n) = &s.ncu {
        f.num("ncu.kernels", n.kernels as f64, Unit::Count, "kernel launches Nsight Compute profiled");
    }
}

/// Per-launch facts (`kernel.*`) for rules with `each = "kernel"`.
pub fn kernel_facts(k: &NcuKernel) -> Facts {
    let mut f = Facts::default();
    f.text("kernel.name", k.name.clone(), "the kernel's name as Nsight Compute wrote it");
    f.text("kernel.short_name", short_kernel_name(&k.name), "the name without templates");
    f.num("kernel.id", k.id as f64, Unit::Count, "the launch's ID in the export");
    let nccl = nccl_collective(&k.name);
    f.flag("kernel.nccl", nccl.is_some(), "an NCCL collective kernel");
    if let Some(c) = nccl {
        f.text("kernel.collective", c.op.name(), "the NCCL collective (AllReduce, AllGather …)");
    }
    f.opt(
        "kernel.memory_throughput",
        k.memory_throughput_pct().map(|p| p / 100.0),
        Unit::Ratio,
        "memory throughput, share of peak (gpu__compute_memory_throughput)",
    );
    f.opt(
        "kernel.sm_throughput",
        k.sm_throughput_pct().map(|p| p / 100.0),
        Unit::Ratio,
        "SM throughput, share of peak (sm__throughput)",
    );
    f.opt(
        "kernel.dram_throughput",
        k.metric_f64("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed").map(|p| p / 100.0),
        Unit::Ratio,
        "DRAM throughput, share of peak",
    );
    f.opt("kernel.dram_bytes", k.dram_bytes(), Unit::Bytes, "bytes read from and written to DRAM");
    f.opt("kernel.l1_global_bytes", k.l1_global_bytes(), Unit::Bytes, "global loads and stores through L1");
    f.opt("kernel.duration", k.duration_ns().map(|ns| ns / 1e3), Unit::Micros, "the launch's duration");
    f
}
