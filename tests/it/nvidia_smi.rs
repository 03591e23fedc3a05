//! nvidia-smi output: every real file in fixtures/real/nvidia-smi (see its PROVENANCE.md) parses, and what each
//! gave is pinned — GPUs, names, totals, samples, processes, MIG instances, the capture sections skipped. The
//! figures were read off the files by eye (and by grep/awk over them), not copied from the parser. Hand-written
//! variants cover what the real files lack: headers with units, hand-made `memory.used[MiB]` headers, `-lms`
//! stamps, headerless logs, garbage inside a CSV, truncated tables, `-q -d MEMORY` of old drivers, `dmon -s m`,
//! `pmon -s m`, multi-GPU CSV, the 535-era table. Every prefix of a real capture parses without a panic.

use oomdoc::ingest::nvidia_smi::{parse, sniff, SmiGpu, SmiParse};
use oomdoc::ingest::text::wall_us;
use oomdoc::timeline::Stamp;

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> String {
    let path = format!("{}/fixtures/real/nvidia-smi/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn local(y: i64, mo: u32, d: u32, h: u32, mi: u32, s: u32, ms: i64) -> Option<Stamp> {
    Some(Stamp::Local(wall_us(y, mo, d, h, mi, s, ms * 1000).unwrap()))
}

fn mib(x: u64) -> Option<u64> {
    Some(x * MIB)
}

fn only_gpu(p: &SmiParse) -> &SmiGpu {
    assert_eq!(p.gpus.len(), 1, "{:#?}", p.gpus);
    &p.gpus[0]
}

/// (used, total, free, reserved) of a sample, in MiB.
type Figures = (Option<u64>, Option<u64>, Option<u64>, Option<u64>);

fn figures(g: &SmiGpu) -> Vec<Figures> {
    let m = |x: Option<u64>| x.map(|b| b / MIB);
    g.samples.iter().map(|s| (m(s.used), m(s.total), m(s.free), m(s.driver_reserved))).collect()
}

type Proc = (u32, &'static str, &'static str, Option<u64>, Option<(u32, u32)>);

type OwnedProc = (u32, String, String, Option<u64>, Option<(u32, u32)>);

fn processes(g: &SmiGpu) -> Vec<OwnedProc> {
    g.processes.iter().map(|p| (p.pid, p.name.clone(), p.kind.clone(), p.used_bytes.map(|b| b / MIB), p.mig)).collect()
}

fn expect_processes(g: &SmiGpu, want: &[Proc]) {
    let want: Vec<_> = want.iter().map(|&(pid, n, k, u, m)| (pid, n.to_string(), k.to_string(), u, m)).collect();
    assert_eq!(processes(g), want);
}

// -------------------------------------------------------------------------------------------------------------
// Real captures (nvidia_gpu_exporter): idle and load sections, each with a default table, -q, --query-gpu,
// --query-compute-apps, pmon and dmon.

/// Where a capture put its `capabilities :: nvml-symbols` section, if it has one.
#[derive(Clone, Copy)]
enum Nvml {
    None,
    AfterNvlink,
    AtEnd,
}

struct Capture {
    file: &'static str,
    name: &'static str,
    bus: &'static str,
    total: u64,
    reserved: u64,
    /// Used MiB when idle and under load (table, -q and CSV agree).
    used: [u64; 2],
    /// Free MiB (-q and CSV) when idle and under load.
    free: [u64; 2],
    /// The idle table's ctime and the load CSV's timestamp.
    first: (i64, u32, u32, u32, u32, u32, i64),
    last: (i64, u32, u32, u32, u32, u32, i64),
    procs: &'static [Proc],
    /// (GI, CI, MIG device, used MiB, total MiB), the largest use seen.
    mig: &'static [(u32, u32, u32, u64, u64)],
    /// Processes listed by the table (and -q, and pmon) idle/load, by --query-compute-apps idle/load, pmon rows
    /// idle/load.
    listed: [usize; 2],
    apps: [usize; 2],
    pmon_rows: [usize; 2],
    nvml: Nvml,
}

const MEMHOG_H100: &[Proc] = &[
    (11327, "/root/tools/memhog", "C", Some(2566), None),
    (11328, "/root/tools/memhog", "C", Some(1542), None),
    (11345, "./gpu_burn", "C", Some(15690), None),
];

const CAPTURES: &[Capture] = &[
    Capture {
        file: "capture__linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt",
        name: "NVIDIA GeForce RTX 2080 SUPER",
        bus: "00000000:0C:00.0",
        total: 8192,
        reserved: 408,
        used: [214, 819],
        free: [7571, 6967],
        first: (2026, 6, 24, 10, 26, 34, 0),
        last: (2026, 6, 24, 10, 26, 49, 788),
        procs: &[
            (1696, "/usr/bin/gnome-shell", "G", Some(176), None),
            (4584, "/usr/bin/Xwayland", "G", Some(3), None),
            (5267, "ffmpeg", "C", Some(230), None),
            (5268, "ffmpeg", "C", Some(370), None),
        ],
        mig: &[],
        listed: [2, 4],
        apps: [0, 2],
        pmon_rows: [10, 20],
        nvml: Nvml::None,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt",
        name: "NVIDIA GeForce RTX 2080 SUPER",
        bus: "00000000:0C:00.0",
        total: 8192,
        reserved: 400,
        used: [211, 815],
        free: [7582, 6978],
        first: (2026, 8, 12, 21, 53, 45, 0),
        last: (2026, 8, 12, 21, 54, 0, 311),
        procs: &[
            (1720, "/usr/bin/gnome-shell", "G", Some(173), None),
            (4556, "/usr/bin/Xwayland", "G", Some(3), None),
            (28511, "ffmpeg", "C", Some(230), None),
            (28512, "ffmpeg", "C", Some(370), None),
        ],
        mig: &[],
        listed: [2, 4],
        apps: [0, 2],
        pmon_rows: [10, 20],
        nvml: Nvml::AfterNvlink,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt",
        name: "NVIDIA GeForce RTX 4080 SUPER",
        bus: "00000000:01:00.0",
        total: 16376,
        reserved: 434,
        used: [596, 1474],
        free: [15348, 14470],
        first: (2026, 6, 26, 11, 59, 44, 0),
        last: (2026, 6, 26, 11, 59, 58, 761),
        procs: &[
            (2165, "/usr/bin/kwin_wayland", "C+G", Some(25), None),
            (2496, "/usr/bin/plasma-keyboard", "G", Some(200), None),
            (2620, "/usr/bin/Xwayland", "G", Some(4), None),
            (2954, "/usr/bin/plasmashell", "G", Some(120), None),
            (3527, "/usr/bin/xwaylandvideobridge", "G", Some(3), None),
            (5021, "ffmpeg", "C", Some(360), None),
            (5022, "ffmpeg", "C", Some(503), None),
        ],
        mig: &[],
        listed: [5, 7],
        apps: [1, 3],
        pmon_rows: [25, 35],
        nvml: Nvml::None,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
        name: "NVIDIA H100 80GB HBM3",
        bus: "00000000:00:09.0",
        total: 81559,
        reserved: 479,
        used: [0, 19818],
        free: [81081, 61263],
        first: (2026, 7, 14, 8, 12, 38, 0),
        last: (2026, 7, 14, 8, 12, 53, 353),
        procs: MEMHOG_H100,
        mig: &[],
        listed: [0, 3],
        apps: [0, 3],
        pmon_rows: [5, 15],
        nvml: Nvml::AtEnd,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-h100-mig__590.48.01.txt",
        name: "NVIDIA H100 80GB HBM3",
        bus: "00000000:00:09.0",
        total: 81559,
        reserved: 479,
        used: [59, 11125],
        free: [81022, 69956],
        first: (2026, 7, 14, 9, 0, 26, 0),
        last: (2026, 7, 14, 9, 0, 44, 579),
        procs: &[
            (21180, "/root/tools/memhog", "C", Some(2296), Some((2, 0))),
            (21181, "/root/tools/memhog", "C", Some(1272), Some((2, 0))),
            (21198, "./gpu_burn", "C", Some(7484), Some((2, 0))),
        ],
        mig: &[(2, 0, 0, 11091, 40448), (3, 0, 1, 17, 20096), (9, 0, 2, 9, 9984), (10, 0, 3, 9, 9984)],
        listed: [0, 3],
        apps: [0, 3],
        pmon_rows: [5, 15],
        nvml: Nvml::AtEnd,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-h200-mig__590.48.01.txt",
        name: "NVIDIA H200",
        bus: "00000000:83:00.0",
        total: 143771,
        reserved: 614,
        used: [55, 16959],
        free: [143103, 126199],
        first: (2026, 7, 3, 22, 22, 0, 0),
        last: (2026, 7, 3, 22, 22, 27, 218),
        procs: &[
            (12249, "/root/tools/memhog", "C", Some(2194), Some((2, 1))),
            (12250, "/root/tools/memhog", "C", Some(1170), Some((2, 1))),
            (12267, "./gpu_burn", "C", Some(13526), Some((2, 1))),
        ],
        // GI 2 holds two compute instances that share its memory.
        mig: &[
            (2, 0, 0, 16925, 71424),
            (2, 1, 1, 16925, 71424),
            (3, 0, 2, 17, 33280),
            (9, 0, 3, 9, 16384),
            (10, 0, 4, 9, 16384),
        ],
        listed: [0, 3],
        apps: [0, 3],
        pmon_rows: [5, 15],
        nvml: Nvml::None,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-h200__590.48.01.txt",
        name: "NVIDIA H200",
        bus: "00000000:83:00.0",
        total: 143771,
        reserved: 614,
        used: [0, 32362],
        free: [143158, 110796],
        first: (2026, 7, 3, 22, 10, 45, 0),
        last: (2026, 7, 3, 22, 11, 9, 763),
        procs: &[
            (10291, "/root/tools/memhog", "C", Some(2566), None),
            (10293, "/root/tools/memhog", "C", Some(1542), None),
            (10309, "./gpu_burn", "C", Some(28234), None),
        ],
        mig: &[],
        listed: [0, 3],
        apps: [0, 3],
        pmon_rows: [5, 15],
        nvml: Nvml::None,
    },
    Capture {
        file: "capture__linux-x86_64__nvidia-l40s__595.80.txt",
        name: "NVIDIA L40S",
        bus: "00000000:01:00.0",
        total: 46068,
        reserved: 609,
        used: [0, 1235],
        free: [45460, 44225],
        first: (2026, 7, 3, 8, 33, 38, 0),
        last: (2026, 7, 3, 8, 33, 53, 415),
        procs: &[(20037, "ffmpeg", "C", Some(538), None), (20038, "ffmpeg", "C", Some(681), None)],
        mig: &[],
        listed: [0, 2],
        apps: [0, 2],
        pmon_rows: [5, 10],
        nvml: Nvml::None,
    },
    Capture {
        file: "capture__windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.txt",
        name: "NVIDIA GeForce RTX 2080 SUPER",
        bus: "00000000:0C:00.0",
        total: 8192,
        reserved: 205,
        used: [702, 1296],
        free: [7286, 6692],
        first: (2026, 6, 22, 23, 4, 18, 0),
        last: (2026, 6, 22, 23, 4, 33, 297),
        // WDDM: no per-process memory anywhere; -q and --query-compute-apps give whole paths, the table cuts them.
        procs: &[
            (2056, r"C:\Windows\System32\dwm.exe", "C+G", None, None),
            (
                4680,
                r"C:\Program Files\NVIDIA Corporation\NVIDIA GeForce Experience\NVIDIA Share.exe",
                "C+G",
                None,
                None,
            ),
            (12332, r"C:\Windows\explorer.exe", "C+G", None, None),
            (
                12444,
                r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\TextInputHost.exe",
                "C+G",
                None,
                None,
            ),
            (
                14160,
                r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\SearchHost.exe",
                "C+G",
                None,
                None,
            ),
            (
                14184,
                r"C:\Windows\SystemApps\Microsoft.Windows.StartMenuExperienceHost_cw5n1h2txyewy\StartMenuExperienceHost.exe",
                "C+G",
                None,
                None,
            ),
            (
                15076,
                r"C:\Windows\SystemApps\ShellExperienceHost_cw5n1h2txyewy\ShellExperienceHost.exe",
                "C+G",
                None,
                None,
            ),
            (16280, r"C:\Program Files\Controller Companion\ControllerCompanion.exe", "C+G", None, None),
            (20372, r"C:\Program Files\NZXT CAM\NZXT CAM.exe", "C+G", None, None),
            (24804, r"C:\Windows\ImmersiveControlPanel\SystemSettings.exe", "C+G", None, None),
            (25704, FFMPEG_WIN, "C", None, None),
            (26660, FFMPEG_WIN, "C", None, None),
        ],
        mig: &[],
        listed: [10, 12],
        apps: [10, 12],
        pmon_rows: [50, 60],
        nvml: Nvml::None,
    },
    Capture {
        file: "capture__windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt",
        name: "NVIDIA GeForce RTX 2080 SUPER",
        bus: "00000000:0C:00.0",
        total: 8192,
        reserved: 205,
        used: [797, 1366],
        free: [7191, 6622],
        first: (2026, 6, 24, 10, 17, 41, 0),
        last: (2026, 6, 24, 10, 17, 56, 770),
        procs: &[
            (2140, r"C:\Windows\System32\dwm.exe", "C+G", None, None),
            (2164, r"C:\Windows\System32\ApplicationFrameHost.exe", "C+G", None, None),
            (13092, r"C:\Windows\ImmersiveControlPanel\SystemSettings.exe", "C+G", None, None),
            (13160, r"C:\Windows\explorer.exe", "C+G", None, None),
            (13264, r"C:\Windows\System32\ShellHost.exe", "C+G", None, None),
            (
                13504,
                r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\CrossDeviceResume.exe",
                "C+G",
                None,
                None,
            ),
            (
                14808,
                r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\SearchHost.exe",
                "C+G",
                None,
                None,
            ),
            (
                14872,
                r"C:\Windows\SystemApps\Microsoft.Windows.StartMenuExperienceHost_cw5n1h2txyewy\StartMenuExperienceHost.exe",
                "C+G",
                None,
                None,
            ),
            (15964, r"C:\Program Files\NVIDIA Corporation\NVIDIA App\CEF\NVIDIA Overlay.exe", "C+G", None, None),
            (
                16760,
                r"C:\Windows\SystemApps\ShellExperienceHost_cw5n1h2txyewy\ShellExperienceHost.exe",
                "C+G",
                None,
                None,
            ),
            (17648, r"C:\Program Files\NVIDIA Corporation\NVIDIA App\CEF\NVIDIA Overlay.exe", "C+G", None, None),
            (
                17840,
                r"C:\Program Files (x86)\Microsoft\EdgeWebView\Application\149.0.4022.80\msedgewebview2.exe",
                "C+G",
                None,
                None,
            ),
            (19052, r"C:\Windows\SystemApps\Microsoft.LockApp_cw5n1h2txyewy\LockApp.exe", "C+G", None, None),
            (
                19956,
                r"C:\Program Files\WindowsApps\Microsoft.WindowsTerminal_1.24.11321.0_x64__8wekyb3d8bbwe\WindowsTerminal.exe",
                "C+G",
                None,
                None,
            ),
            (20440, r"C:\Program Files\Controller Companion\ControllerCompanion.exe", "C+G", None, None),
            (
                21912,
                r"C:\Program Files\WindowsApps\Microsoft.YourPhone_1.26042.99.0_x64__8wekyb3d8bbwe\PhoneExperienceHost.exe",
                "C+G",
                None,
                None,
            ),
            (
                22412,
                r"C:\Windows\SystemApps\MicrosoftWindows.Client.CBS_cw5n1h2txyewy\TextInputHost.exe",
                "C+G",
                None,
                None,
            ),
            (
                23480,
                r"C:\Program Files\WindowsApps\Agilebits.1Password_8.12.24.34_x64__amwd9z03whsfe\1Password.exe",
                "C+G",
                None,
                None,
            ),
            (23988, r"C:\Program Files (x86)\Microsoft\Edge\Application\msedge.exe", "C+G", None, None),
            (12940, FFMPEG_WIN, "C", None, None),
            (13820, FFMPEG_WIN, "C", None, None),
        ],
        mig: &[],
        listed: [19, 21],
        apps: [19, 21],
        pmon_rows: [95, 105],
        nvml: Nvml::None,
    },
];

const FFMPEG_WIN: &str = r"C:\Users\utku\AppData\Local\Microsoft\WinGet\Packages\Gyan.FFmpeg_Microsoft.Winget.Source_8wekyb3d8bbwe\ffmpeg-8.1.1-full_build\bin\ffmpeg.exe";

/// The sections of a capture that hold no nvidia-smi output this module reads, in file order.
fn skipped_titles(nvml: Nvml) -> Vec<&'static str> {
    let mut t = vec![
        "nvidia_gpu_exporter GPU capture",
        "capabilities :: version",
        "capabilities :: help (-h)",
        "capabilities :: help-query-gpu",
        "capabilities :: help-query-compute-apps",
        "capabilities :: help-query-accounted-apps",
        "capabilities :: help-query-retired-pages",
        "capabilities :: list (-L)",
        "capabilities :: topo -m",
        "capabilities :: nvlink -s",
    ];
    if let Nvml::AfterNvlink = nvml {
        t.push("capabilities :: nvml-symbols");
    }
    t.extend([
        "capabilities :: query-gpu field list (derived, used for query-gpu above)",
        "idle :: query-accounted-apps",
        "idle :: query-retired-pages",
        "load :: query-accounted-apps",
        "load :: query-retired-pages",
    ]);
    if let Nvml::AtEnd = nvml {
        t.push("capabilities :: nvml-symbols");
    }
    t
}

fn expected_read(c: &Capture) -> Vec<String> {
    let mig = if c.mig.is_empty() { String::new() } else { format!(", {} MIG devices", c.mig.len()) };
    let procs = |n: usize| if n == 1 { "1 process".to_string() } else { format!("{n} processes") };
    let mut out = Vec::new();
    for (i, phase) in ["idle", "load"].into_iter().enumerate() {
        out.extend([
            format!(
                "{phase} :: nvidia-smi (default table): nvidia-smi default table (1 GPU, {}{mig})",
                procs(c.listed[i])
            ),
            format!("{phase} :: query (-q): nvidia-smi -q (1 GPU, {}{mig})", procs(c.listed[i])),
            format!("{phase} :: query-gpu (csv, what the exporter parses): nvidia-smi --query-gpu CSV (1 row)"),
            format!(
                "{phase} :: query-compute-apps (per-process): nvidia-smi --query-compute-apps CSV ({})",
                procs(c.apps[i])
            ),
            format!(
                "{phase} :: pmon (per-process monitor): nvidia-smi pmon ({} rows, {})",
                c.pmon_rows[i],
                procs(c.listed[i])
            ),
            format!(
                "{phase} :: dmon (per-device monitor, incl. PCIe rx/tx): nvidia-smi dmon (5 rows; no fb column, so no \
                 memory figures)"
            ),
        ]);
    }
    out
}

#[test]
fn every_real_capture() {
    for c in CAPTURES {
        let p = parse(&fixture(c.file), 3, None);
        let ctx = c.file;
        assert_eq!(p.malformed_lines, 0, "{ctx}: {:#?}", p.malformed);
        assert_eq!(p.read, expected_read(c), "{ctx}");
        let titles = skipped_titles(c.nvml);
        assert_eq!(p.skipped.len(), titles.len(), "{ctx}: {:#?}", p.skipped);
        for (got, title) in p.skipped.iter().zip(&titles) {
            assert!(got.starts_with(&format!("{title}: ")), "{ctx}: {got} is not {title}");
        }
        let g = only_gpu(&p);
        assert_eq!(g.index, 0, "{ctx}");
        assert_eq!(g.name.as_deref(), Some(c.name), "{ctx}");
        assert_eq!(g.bus_id.as_deref(), Some(c.bus), "{ctx}");
        assert_eq!(g.uuid.as_deref(), Some("GPU-00000000-0000-0000-0000-000000000000"), "{ctx} (masked)");
        // Table, -q, CSV when idle; the same under load. The table gives no free and no reserved figure.
        let (t, r) = (Some(c.total), Some(c.reserved));
        let mut want = Vec::new();
        for i in 0..2 {
            let (u, f) = (Some(c.used[i]), Some(c.free[i]));
            want.extend([(u, t, None, None), (u, t, f, r), (u, t, f, r)]);
        }
        assert_eq!(figures(g), want, "{ctx}");
        assert!(g.samples.iter().all(|s| s.input == 3 && s.time_us.is_none()), "{ctx}");
        let (a, b) = (c.first, c.last);
        assert_eq!(g.samples[0].stamp, local(a.0, a.1, a.2, a.3, a.4, a.5, a.6), "{ctx}");
        assert_eq!(g.samples[5].stamp, local(b.0, b.1, b.2, b.3, b.4, b.5, b.6), "{ctx}");
        assert!(g.samples.windows(2).all(|w| w[0].stamp <= w[1].stamp && w[0].line < w[1].line), "{ctx}");
        expect_processes(g, c.procs);
        let mig: Vec<_> = g
            .mig
            .iter()
            .map(|m| (m.gpu_instance, m.compute_instance, m.mig_device, m.used_bytes / MIB, m.total_bytes / MIB))
            .collect();
        assert_eq!(mig, c.mig, "{ctx}");
        assert!(sniff(&fixture(c.file)), "{ctx}");
    }
}

#[test]
fn capture_skip_reasons_and_lines() {
    let p = parse(&fixture("capture__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"), 0, None);
    assert!(p.skipped.contains(
        &"idle :: query-retired-pages: nvidia-smi CSV without memory or process columns (timestamp, gpu_name, \
          gpu_bus_id, gpu_serial, …)"
            .to_string()
    ));
    assert!(p.skipped.contains(&"capabilities :: help-query-gpu: no nvidia-smi output read here".to_string()));
    // Sample lines: the table's Memory-Usage row, -q's `FB Memory Usage`, the CSV row.
    let lines: Vec<usize> = p.gpus[0].samples.iter().map(|s| s.line).collect();
    assert_eq!(lines, [1462, 1589, 1741, 1806, 1935, 2105]);
}

// -------------------------------------------------------------------------------------------------------------
// Real --query-gpu logs: a 1-s loop of `--format=csv,noheader,nounits` under a header the user's script wrote
// (`timestamp,index,name,gpu_utilization[%],memory.total[MiB],memory.used[MiB],memory.free[MiB],temperature[°C]`).

#[test]
fn real_query_gpu_logs() {
    // (file, rows, first (stamp, used, free), last (stamp, used, free), peak used)
    type Log = (&'static str, usize, ((u32, u32, u32, i64), u64, u64), ((u32, u32, u32, i64), u64, u64), u64);
    let logs: [Log; 3] = [
        (
            "query-gpu_noheader_nounits__gpu_usage_log.csv",
            77,
            ((22, 24, 27, 466), 1747, 22486),
            ((22, 25, 44, 875), 1743, 22490),
            2324,
        ),
        (
            "query-gpu_noheader_nounits__gpu_usage_log_resnet_224.csv",
            22,
            ((0, 13, 19, 84), 11325, 12909),
            ((0, 13, 40, 439), 11325, 12909),
            13002,
        ),
        (
            "query-gpu_noheader_nounits__gpu_usage_log_resnet_512.csv",
            23,
            ((0, 8, 0, 98), 11323, 12911),
            ((0, 8, 22, 475), 11324, 12910),
            13067,
        ),
    ];
    for (file, rows, first, last, peak) in logs {
        let p = parse(&fixture(file), 0, None);
        assert_eq!(p.read, [format!("nvidia-smi --query-gpu CSV ({rows} rows)")], "{file}");
        assert!(p.skipped.is_empty() && p.malformed_lines == 0, "{file}: {p:#?}");
        let g = only_gpu(&p);
        assert_eq!((g.index, g.name.as_deref(), g.bus_id.as_deref()), (0, Some("NVIDIA RTX A5000"), None), "{file}");
        assert_eq!(g.samples.len(), rows, "{file}");
        assert!(g.processes.is_empty() && g.mig.is_empty(), "{file}");
        assert!(g.samples.iter().all(|s| s.total == mib(24564) && s.driver_reserved.is_none()), "{file}");
        let day = if file.ends_with("gpu_usage_log.csv") { (2025, 5, 20) } else { (2025, 5, 25) };
        for (s, ((h, mi, sec, ms), used, free)) in [(&g.samples[0], first), (&g.samples[rows - 1], last)] {
            assert_eq!(s.stamp, local(day.0, day.1, day.2, h, mi, sec, ms), "{file}");
            assert_eq!((s.used, s.free), (mib(used), mib(free)), "{file}");
        }
        assert_eq!(g.samples.iter().filter_map(|s| s.used).max(), mib(peak), "{file}");
        assert_eq!(g.samples[0].line, 2, "{file}: the header is line 1");
    }
}

#[test]
fn real_log_without_its_header_is_inferred() {
    let text = fixture("query-gpu_noheader_nounits__gpu_usage_log.csv");
    let rows: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    let p = parse(&rows, 0, None);
    assert_eq!(
        p.read,
        ["nvidia-smi --query-gpu CSV (77 rows; no header; columns inferred: timestamp, index, name, ?, memory.total, \
          memory.used, memory.free, ?)"]
    );
    let with_header = parse(&text, 0, None);
    assert_eq!(figures(only_gpu(&p)), figures(only_gpu(&with_header)));
    assert_eq!(only_gpu(&p).name.as_deref(), Some("NVIDIA RTX A5000"));
}

// -------------------------------------------------------------------------------------------------------------
// Real default tables from nvidia-htop's tests: drivers 390.25 (8 GPUs), 450.57 (GI/CI columns, MIG M. row),
// 440.82 in Docker (no processes).

#[test]
fn real_table_390_eight_gpus() {
    let p = parse(&fixture("table__nvidia-htop_test_FAKE_STDIN.txt"), 0, None);
    assert_eq!(p.read, ["nvidia-smi default table (8 GPUs, 13 processes)"]);
    assert_eq!(p.malformed_lines, 0);
    let used = [10807, 10783, 10793, 7996, 5964, 10785, 10823, 7773];
    let buses = ["04", "05", "08", "09", "84", "85", "88", "89"];
    let pids: [&[u32]; 8] = [
        &[1032],
        &[11021],
        &[25544],
        &[4755, 14518],
        &[13956, 14293, 14294, 14295],
        &[17547],
        &[11527, 27159],
        &[9908],
    ];
    assert_eq!(p.gpus.len(), 8);
    for (i, g) in p.gpus.iter().enumerate() {
        assert_eq!(g.index, i as u32);
        assert_eq!(g.name.as_deref(), Some("GeForce GTX 108..."));
        assert_eq!(g.bus_id, Some(format!("00000000:{}:00.0", buses[i])));
        assert_eq!(figures(g), [(Some(used[i]), Some(11178), None, None)]);
        assert_eq!(g.samples[0].stamp, local(2018, 5, 21, 14, 7, 29, 0));
        assert_eq!(g.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), pids[i]);
        assert!(g.processes.iter().all(|p| p.kind == "C" && p.mig.is_none()));
    }
    expect_processes(
        &p.gpus[3],
        &[
            (4755, "...ware/MATLAB/matlab94/bin/glnxa64/MATLAB", "C", Some(389), None),
            (14518, "python3", "C", Some(7589), None),
        ],
    );
    assert_eq!(p.gpus[6].processes[1].name, "python3.5");
    assert_eq!(p.gpus[6].processes[1].used_bytes, mib(577));
}

#[test]
fn real_table_450_gi_ci_columns() {
    let p = parse(&fixture("table__nvidia-htop_test_FAKE_STDIN_NEW_FORMAT.txt"), 0, None);
    assert_eq!(p.read, ["nvidia-smi default table (2 GPUs, 6 processes)"]);
    assert_eq!(p.malformed_lines, 0);
    let (g0, g1) = (&p.gpus[0], &p.gpus[1]);
    assert_eq!((g0.name.as_deref(), g1.name.as_deref()), (Some("GeForce RTX 2070"), Some("GeForce GTX 750 Ti")));
    assert_eq!(figures(g0), [(Some(749), Some(7981), None, None)]);
    assert_eq!(figures(g1), [(Some(871), Some(2002), None, None)]);
    assert_eq!(g1.bus_id.as_deref(), Some("00000000:04:00.0"));
    assert_eq!(g0.samples[0].stamp, local(2020, 8, 2, 13, 44, 21, 0));
    expect_processes(g0, &[(1032, "python", "C", Some(745), None)]);
    expect_processes(
        g1,
        &[
            (11021, "python3", "G", Some(244), None),
            (25544, "python", "G", Some(139), None),
            (4755, "...matlab94/bin/glnxa64/MATLAB", "G", Some(3), None),
            (14518, "python3", "G", Some(1), None),
            (13956, "python3", "G", Some(472), None),
        ],
    );
}

#[test]
fn real_table_docker_without_processes() {
    let text = fixture("table__nvidia-htop_test_FAKE_STDIN_NO_PROCESSES_DOCKER.txt");
    let p = parse(&text, 0, None);
    assert_eq!(p.read, ["nvidia-smi default table (2 GPUs, 0 processes)"]);
    assert_eq!(p.malformed_lines, 0);
    assert_eq!(figures(&p.gpus[0]), [(Some(10916), Some(11175), None, None)]);
    assert_eq!(figures(&p.gpus[1]), [(Some(149), Some(11178), None, None)]);
    assert_eq!(p.gpus[1].bus_id.as_deref(), Some("00000000:02:00.0"));
    assert!(p.gpus.iter().all(|g| g.processes.is_empty() && g.samples[0].stamp == local(2020, 5, 14, 22, 9, 9, 0)));
    assert!(sniff(&text));
}

// -------------------------------------------------------------------------------------------------------------
// Hand-written variants (shapes from the format notes; not real captures).

#[test]
fn query_gpu_header_with_units_two_gpus() {
    let text = "\
timestamp, index, name, pci.bus_id, memory.total [MiB], memory.reserved [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]
2024/05/01 12:00:00.123, 0, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920 MiB, 512 MiB, 1024 MiB, 80384 MiB, 3 %
2024/05/01 12:00:00.125, 1, NVIDIA A100-SXM4-80GB, 00000000:0F:00.0, 81920 MiB, 512 MiB, 70000 MiB, 11408 MiB, 99 %
2024/05/01 12:00:01.124, 0, NVIDIA A100-SXM4-80GB, 00000000:07:00.0, 81920 MiB, 512 MiB, 2048 MiB, 79360 MiB, 40 %
2024/05/01 12:00:01.126, 1, NVIDIA A100-SXM4-80GB, 00000000:0F:00.0, 81920 MiB, 512 MiB, [N/A], [N/A], [N/A]
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi --query-gpu CSV (4 rows)"]);
    assert_eq!(p.malformed_lines, 0);
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(
        figures(&p.gpus[0]),
        [(Some(1024), Some(81920), Some(80384), Some(512)), (Some(2048), Some(81920), Some(79360), Some(512))]
    );
    assert_eq!(
        figures(&p.gpus[1]),
        [(Some(70000), Some(81920), Some(11408), Some(512)), (None, Some(81920), None, Some(512))]
    );
    assert_eq!(p.gpus[1].bus_id.as_deref(), Some("00000000:0F:00.0"));
    assert_eq!(p.gpus[0].samples[1].stamp, local(2024, 5, 1, 12, 0, 1, 124));
    assert_eq!(p.gpus[1].samples[0].line, 3);
}

#[test]
fn hand_made_header_without_spaces_and_nounits() {
    let text = "timestamp,memory.used[MiB],memory.total[MiB]\n2024/05/01 12:00:00.100, 1747, 24564\n\
                2024/05/01 12:00:00.600, 2048, 24564\n";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi --query-gpu CSV (2 rows)"]);
    let g = only_gpu(&p);
    assert_eq!(g.index, 0);
    assert_eq!(figures(g), [(Some(1747), Some(24564), None, None), (Some(2048), Some(24564), None, None)]);
}

#[test]
fn lms_stamps_keep_milliseconds() {
    // `-lms 250`: four samples a second; the stamps keep their milliseconds, in order.
    let text = "timestamp, memory.used [MiB]\n2024/05/01 23:59:59.750, 100 MiB\n2024/05/02 00:00:00.000, 101 MiB\n\
                2024/05/02 00:00:00.250, 102 MiB\n2024/05/02 00:00:00.500, 103 MiB\n";
    let p = parse(text, 0, None);
    let stamps: Vec<_> = only_gpu(&p).samples.iter().map(|s| s.stamp).collect();
    assert_eq!(
        stamps,
        [
            local(2024, 5, 1, 23, 59, 59, 750),
            local(2024, 5, 2, 0, 0, 0, 0),
            local(2024, 5, 2, 0, 0, 0, 250),
            local(2024, 5, 2, 0, 0, 0, 500)
        ]
    );
    let us: Vec<i64> = stamps
        .iter()
        .map(|s| match s {
            Some(Stamp::Local(u)) => *u,
            _ => 0,
        })
        .collect();
    assert!(us.windows(2).all(|w| w[1] - w[0] == 250_000));
}

#[test]
fn garbage_inside_a_csv_is_counted() {
    let text = "\
timestamp, index, memory.used [MiB], memory.total [MiB]
2024/05/01 12:00:00.000, 0, 100 MiB, 1000 MiB
Traceback (most recent call last):
2024/05/01 12:00:01.000, 0, lots, 1000 MiB
2024/05/01 12:00:02.000, 0, 300 MiB
not, a, row, at all
2024/05/01 12:00:03.000, 0, 400 MiB, 1000 MiB
text after the last row is not the CSV's
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi --query-gpu CSV (2 rows)"]);
    assert_eq!(p.malformed_lines, 4);
    assert_eq!(p.malformed.iter().map(|m| m.line).collect::<Vec<_>>(), [3, 4, 5, 6]);
    assert_eq!(p.malformed[1].found, "2024/05/01 12:00:01.000, 0, lots, 1000 MiB");
    assert!(p.malformed[1].expected.contains("memory.used"), "{:?}", p.malformed[1]);
    assert_eq!(figures(only_gpu(&p)), [(Some(100), Some(1000), None, None), (Some(400), Some(1000), None, None)]);
}

#[test]
fn malformed_keeps_twenty_and_counts_all() {
    let mut text = String::from("timestamp, memory.used [MiB]\n2024/05/01 12:00:00.000, 1 MiB\n");
    for i in 0..30 {
        text.push_str(&format!("2024/05/01 12:00:{i:02}.500, x{i} MiB\n"));
    }
    text.push_str("2024/05/01 12:01:00.000, 2 MiB\n");
    let p = parse(&text, 0, None);
    assert_eq!((p.malformed.len(), p.malformed_lines), (20, 30));
    assert_eq!(only_gpu(&p).samples.len(), 2);
}

#[test]
fn headerless_rows_from_the_command_line_or_columns() {
    // A command line in the text names the columns.
    let text =
        "$ nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,noheader,nounits -lms 500\n\
                2024/05/01 12:00:00.000, 0, 512, 16384\n2024/05/01 12:00:00.500, 0, 1024, 16384\n";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi --query-gpu CSV (2 rows; columns from the command)"]);
    assert_eq!(figures(only_gpu(&p)), [(Some(512), Some(16384), None, None), (Some(1024), Some(16384), None, None)]);

    // Two numbers after a timestamp: which is used cannot be told, so the rows are reported, not guessed.
    let rows = "2024/05/01 12:00:00.000, 10, 20\n2024/05/01 12:00:01.000, 11, 20\n";
    let p = parse(rows, 0, None);
    assert!(p.gpus.is_empty() && p.read.is_empty(), "{p:#?}");
    assert_eq!(p.malformed_lines, 2);
    assert!(p.malformed[0].found.contains("no three number columns"), "{:?}", p.malformed[0]);
    // The caller's column list settles it.
    let cols = ["timestamp".to_string(), "memory.used".to_string(), "memory.total".to_string()];
    let p = parse(rows, 0, Some(&cols));
    assert_eq!(p.read, ["nvidia-smi --query-gpu CSV (2 rows; columns from --columns)"]);
    assert_eq!(figures(only_gpu(&p)), [(Some(10), Some(20), None, None), (Some(11), Some(20), None, None)]);
    assert_eq!(p.malformed_lines, 0);
}

#[test]
fn headerless_with_units_and_two_gpus_inferred() {
    let text = "\
2024/05/01 12:00:00.000, 0, Tesla V100-SXM2-16GB, 00000000:00:1E.0, 16160 MiB, 1000 MiB, 15160 MiB
2024/05/01 12:00:00.002, 1, Tesla V100-SXM2-16GB, 00000000:00:1F.0, 16160 MiB, 16000 MiB, 160 MiB
";
    let p = parse(text, 0, None);
    assert_eq!(
        p.read,
        ["nvidia-smi --query-gpu CSV (2 rows; no header; columns inferred: timestamp, index, name, pci.bus_id, \
          memory.total, memory.used, memory.free)"]
    );
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(figures(&p.gpus[1]), [(Some(16000), Some(16160), Some(160), None)]);
    assert_eq!(p.gpus[1].bus_id.as_deref(), Some("00000000:00:1F.0"));
}

#[test]
fn query_gpu_without_index_by_bus_or_gpu_zero() {
    let by_bus = "pci.bus_id, memory.used [MiB], memory.total [MiB]\n00000000:07:00.0, 100 MiB, 1000 MiB\n\
                  00000000:0F:00.0, 200 MiB, 1000 MiB\n00000000:07:00.0, 150 MiB, 1000 MiB\n";
    let p = parse(by_bus, 0, None);
    assert_eq!(p.gpus.iter().map(|g| (g.index, g.samples.len())).collect::<Vec<_>>(), [(0, 2), (1, 1)]);
    let neither = "memory.used [MiB], memory.total [MiB]\n100 MiB, 1000 MiB\n200 MiB, 1000 MiB\n";
    let p = parse(neither, 0, None);
    assert_eq!(only_gpu(&p).samples.len(), 2);
}

#[test]
fn compute_apps_variants() {
    let text = "\
pid, process_name, used_memory [MiB]
1234, python train.py, 10240 MiB
5678, /usr/bin/python3, [N/A]
9012, python -c print(1,2), 12 MiB
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi --query-compute-apps CSV (3 processes)"]);
    expect_processes(
        only_gpu(&p),
        &[
            (1234, "python train.py", "C", Some(10240), None),
            (5678, "/usr/bin/python3", "C", None, None),
            (9012, "python -c print(1,2)", "C", Some(12), None),
        ],
    );
    // `name`/`used_memory` aliases, without header, columns from the caller.
    let cols: Vec<String> = ["pid", "name", "used_memory"].iter().map(|s| s.to_string()).collect();
    let p = parse("4321, python, 2048\n", 0, Some(&cols));
    expect_processes(only_gpu(&p), &[(4321, "python", "C", Some(2048), None)]);
}

#[test]
fn one_paste_table_then_compute_apps_joined_by_bus_id() {
    let text = "\
Mon Jan 15 10:00:00 2024       
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.129.03             Driver Version: 535.129.03   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |
|                                         |                      |               MIG M. |
|=========================================+======================+======================|
|   0  NVIDIA A100-SXM4-40GB          On  | 00000000:07:00.0 Off |                    0 |
| N/A   33C    P0              58W / 400W |  39000MiB / 40960MiB |     95%      Default |
|                                         |                      |             Disabled |
+-----------------------------------------+----------------------+----------------------+
|   1  NVIDIA A100-SXM4-40GB          On  | 00000000:0F:00.0 Off |                    0 |
| N/A   31C    P0              55W / 400W |   1204MiB / 40960MiB |      0%      Default |
|                                         |                      |             Disabled |
+-----------------------------------------+----------------------+----------------------+
                                                                                         
+---------------------------------------------------------------------------------------+
| Processes:                                                                            |
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|        ID   ID                                                             Usage      |
|=======================================================================================|
|    0   N/A  N/A     41234      C   ...conda3/envs/train/bin/python           38990MiB |
|    1   N/A  N/A     41300    M+C   python                                     1200MiB |
+---------------------------------------------------------------------------------------+
$ nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_gpu_memory --format=csv
gpu_bus_id, pid, process_name, used_gpu_memory [MiB]
00000000:07:00.0, 41234, /opt/conda3/envs/train/bin/python, 38990 MiB
00000000:0F:00.0, 41300, python, 1202 MiB
";
    let p = parse(text, 0, None);
    assert_eq!(
        p.read,
        ["nvidia-smi default table (2 GPUs, 2 processes)", "nvidia-smi --query-compute-apps CSV (2 processes)"]
    );
    assert_eq!(p.malformed_lines, 0, "{:#?}", p.malformed);
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(figures(&p.gpus[0]), [(Some(39000), Some(40960), None, None)]);
    assert_eq!(p.gpus[0].samples[0].stamp, local(2024, 1, 15, 10, 0, 0, 0));
    // The table's cut name gives way to the full path; the larger figure is kept; the table's type stays.
    expect_processes(&p.gpus[0], &[(41234, "/opt/conda3/envs/train/bin/python", "C", Some(38990), None)]);
    expect_processes(&p.gpus[1], &[(41300, "python", "M+C", Some(1202), None)]);
}

#[test]
fn table_log_with_l_gives_one_sample_per_table() {
    let one = |stamp: &str, used: u32| {
        format!(
            "{stamp}\n\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 440.82       Driver Version: 440.82       CUDA Version: 10.2     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  Tesla T4            Off  | 00000000:00:04.0 Off |                    0 |
| N/A   47C    P0    27W /  70W |  {used:>5}MiB / 15109MiB |      0%      Default |
+-------------------------------+----------------------+----------------------+
"
        )
    };
    let text = one("Wed May  1 12:00:00 2024", 100) + &one("Wed May  1 12:00:01 2024", 14000);
    let p = parse(&text, 0, None);
    assert_eq!(p.read.len(), 2);
    let g = only_gpu(&p);
    assert_eq!(figures(g), [(Some(100), Some(15109), None, None), (Some(14000), Some(15109), None, None)]);
    assert_eq!(g.samples[1].stamp, local(2024, 5, 1, 12, 0, 1, 0));
}

const H100_LOAD_TABLE: &str = "\
Tue Jul 14 08:12:53 2026       
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 590.48.01              Driver Version: 590.48.01      CUDA Version: 13.1     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:09.0 Off |                    0 |
| N/A   59C    P0            629W /  700W |   19818MiB /  81559MiB |    100%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|    0   N/A  N/A           11327      C   /root/tools/memhog                     2566MiB |
|    0   N/A  N/A           11328      C   /root/tools/memhog                     1542MiB |
|    0   N/A  N/A           11345      C   ./gpu_burn                            15690MiB |
+-----------------------------------------------------------------------------------------+
";

#[test]
fn table_copied_from_a_real_capture_matches_it() {
    let p = parse(H100_LOAD_TABLE, 0, None);
    assert_eq!(p.read, ["nvidia-smi default table (1 GPU, 3 processes)"]);
    expect_processes(only_gpu(&p), MEMHOG_H100);
}

#[test]
fn truncated_tables() {
    let cut = |marker: &str, keep: usize| {
        let at = H100_LOAD_TABLE.find(marker).unwrap() + keep;
        H100_LOAD_TABLE[..at].to_string()
    };
    // Cut after the GPU row: the GPU is known, its Memory-Usage row is missing.
    let p = parse(&cut("| N/A   59C", 0), 0, None);
    let g = only_gpu(&p);
    assert_eq!((g.name.as_deref(), g.samples.len()), (Some("NVIDIA H100 80GB HBM3"), 0));
    assert_eq!(p.malformed_lines, 1);
    assert_eq!((p.malformed[0].line, p.malformed[0].found.as_str()), (9, "end of table"));
    // Cut inside the second process row: one process, one malformed row.
    let p = parse(&cut("/root/tools/memhog                     1542", 10), 0, None);
    assert_eq!(p.read, ["nvidia-smi default table (1 GPU, 1 process)"]);
    assert_eq!(figures(only_gpu(&p)), [(Some(19818), Some(81559), None, None)]);
    expect_processes(only_gpu(&p), &[(11327, "/root/tools/memhog", "C", Some(2566), None)]);
    assert_eq!((p.malformed_lines, p.malformed[0].line), (1, 20));
    // Cut inside the Memory-Usage row.
    let p = parse(&cut("19818MiB", 3), 0, None);
    assert_eq!(only_gpu(&p).samples.len(), 0);
    assert_eq!(p.malformed_lines, 2, "{:#?}", p.malformed);
}

#[test]
fn q_memory_of_an_old_driver_two_gpus_with_processes() {
    let text = "\
==============NVSMI LOG==============

Timestamp                           : Wed May  1 12:00:00 2024
Driver Version                      : 470.82.01
CUDA Version                        : 11.4

Attached GPUs                       : 2
GPU 0000:3B:00.0
    Product Name                    : Tesla V100-PCIE-32GB
    FB Memory Usage
        Total                       : 32510 MiB
        Used                        : 31000 MiB
        Free                        : 1510 MiB
    BAR1 Memory Usage
        Total                       : 32768 MiB
        Used                        : 4 MiB
        Free                        : 32764 MiB
    Processes
        Process ID                  : 1032
            Type                    : C
            Name                    : python
            Used GPU Memory         : 30997 MiB

GPU 0000:D8:00.0
    Product Name                    : Tesla V100-PCIE-32GB
    FB Memory Usage
        Total                       : 32510 MiB
        Used                        : 3 MiB
        Free                        : 32507 MiB
    Processes                       : None
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi -q (2 GPUs, 1 process)"]);
    assert_eq!(p.malformed_lines, 0);
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(p.gpus[0].bus_id.as_deref(), Some("00000000:3B:00.0"));
    assert_eq!(p.gpus[1].bus_id.as_deref(), Some("00000000:D8:00.0"));
    assert_eq!(figures(&p.gpus[0]), [(Some(31000), Some(32510), Some(1510), None)]);
    assert_eq!(figures(&p.gpus[1]), [(Some(3), Some(32510), Some(32507), None)]);
    assert_eq!(p.gpus[1].samples[0].stamp, local(2024, 5, 1, 12, 0, 0, 0));
    expect_processes(&p.gpus[0], &[(1032, "python", "C", Some(30997), None)]);
}

#[test]
fn q_mig_devices_of_the_470_layout() {
    let text = "\
==============NVSMI LOG==============

Timestamp                                 : Wed May  1 12:00:00 2024
Attached GPUs                             : 1
GPU 00000000:00:04.0
    Product Name                          : NVIDIA A100-SXM4-40GB
    MIG Devices
        MIG Device
            Index                         : 0
            GPU Instance ID               : 1
            Compute Instance ID           : 0
            Device Attributes
                Shared
                    Multiprocessor count  : 42
            FB Memory Usage
                Total                     : 20096 MiB
                Used                      : 11 MiB
                Free                      : 20085 MiB
            BAR1 Memory Usage
                Total                     : 32767 MiB
                Used                      : 0 MiB
                Free                      : 32767 MiB
    FB Memory Usage
        Total                             : 40536 MiB
        Used                              : 11 MiB
        Free                              : 40525 MiB
    Processes
        GPU instance ID                   : 1
        Compute instance ID               : 0
        Process ID                        : 777
            Type                          : C
            Name                          : python
            Used GPU Memory               : 8 MiB
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi -q (1 GPU, 1 process, 1 MIG device)"]);
    let g = only_gpu(&p);
    assert_eq!(figures(g), [(Some(11), Some(40536), Some(40525), None)]);
    assert_eq!(g.mig.len(), 1);
    assert_eq!((g.mig[0].gpu_instance, g.mig[0].used_bytes, g.mig[0].total_bytes), (1, 11 * MIB, 20096 * MIB));
    expect_processes(g, &[(777, "python", "C", Some(8), Some((1, 0)))]);
}

#[test]
fn dmon_with_fb_and_time_columns() {
    let text = "\
#Date       Time        gpu     fb   bar1   ccpm
#YYYYMMDD   HH:MM:SS    Idx     MB     MB     MB
 20240501   12:00:00      0    402      4      0
 20240501   12:00:00      1  70000      4      0
 20240501   12:00:01      0    500      4      0
 20240501   12:00:01      1      -      -      -
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi dmon (4 rows, 3 samples)"]);
    assert_eq!(p.gpus.len(), 2);
    let used = |g: &SmiGpu| g.samples.iter().map(|s| s.used.map(|b| b / MIB)).collect::<Vec<_>>();
    assert_eq!(used(&p.gpus[0]), [Some(402), Some(500)]);
    assert_eq!(used(&p.gpus[1]), [Some(70000)]);
    assert_eq!(p.gpus[0].samples[1].stamp, local(2024, 5, 1, 12, 0, 1, 0));
    assert!(p.gpus[0].samples[0].total.is_none());
}

#[test]
fn pmon_with_fb() {
    let text = "\
# gpu        pid  type    fb   ccpm  command
# Idx          #   C/G    MB     MB  name
    0      12345     C  4000      0  python
    0      12346     G    12      0  Xorg
    1          -     -     -      -  -
# gpu        pid  type    fb   ccpm  command
# Idx          #   C/G    MB     MB  name
    0      12345     C  4100      0  python
";
    let p = parse(text, 0, None);
    assert_eq!(p.read, ["nvidia-smi pmon (4 rows, 2 processes)"]);
    assert_eq!(p.malformed_lines, 0);
    expect_processes(&p.gpus[0], &[(12345, "python", "C", Some(4100), None), (12346, "Xorg", "G", Some(12), None)]);
    assert!(p.gpus[1].processes.is_empty());
}

#[test]
fn empty_and_foreign_input() {
    for text in ["", "\n\n   \n", "\r\n"] {
        let p = parse(text, 0, None);
        assert!(p.gpus.is_empty() && p.read.is_empty() && p.skipped.is_empty() && p.malformed_lines == 0);
        assert!(!sniff(text));
    }
    let foreign = [
        "Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n\
         55.1,1234,3,411.3,400.0,300,534,117.2,cudaMalloc\n",
        "INFO 05-12 08:01:39 [gpu_worker.py:298] Available KV cache memory: 8.11 GiB\n",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of \
         79.15 GiB of which 12.06 MiB is free.\n",
        "a,b,c\n1,2,3\n4,5,6\n",
    ];
    for text in foreign {
        let p = parse(text, 0, None);
        assert!(p.gpus.is_empty() && p.read.is_empty() && p.malformed_lines == 0, "{text}: {p:#?}");
        assert!(!sniff(text), "{text}");
    }
}

// -------------------------------------------------------------------------------------------------------------
// No panic, ever.

fn check_invariants(p: &SmiParse, what: &str) {
    assert!(p.malformed.len() <= 20 && p.malformed.len() <= p.malformed_lines, "{what}");
    assert!(p.gpus.windows(2).all(|w| w[0].index < w[1].index), "{what}: GPU indices unique and sorted");
}

#[test]
fn every_prefix_of_a_real_capture() {
    let text = fixture("capture__linux-x86_64__nvidia-h100-mig__590.48.01.txt");
    // Every line boundary, and a cut in the middle of each line from the first nvidia-smi output on (before it
    // come --help texts).
    let outputs = text.find("# idle :: nvidia-smi (default table)").unwrap();
    let mut cuts: Vec<usize> = vec![0, text.len()];
    let mut start = 0;
    for (i, _) in text.match_indices('\n') {
        cuts.push(i + 1);
        let mid = start + (i - start) / 2;
        if mid >= outputs && text.is_char_boundary(mid) {
            cuts.push(mid);
        }
        start = i + 1;
    }
    let (a, b) = cuts.split_at(cuts.len() / 2);
    std::thread::scope(|s| {
        for part in [a, b] {
            let text = &text;
            s.spawn(move || {
                for &cut in part {
                    check_invariants(&parse(&text[..cut], 0, None), &format!("prefix of {cut} bytes"));
                }
            });
        }
    });
}

#[test]
fn hostile_lines_do_not_panic() {
    let lines = [
        "| NVIDIA-SMI 1",
        "|=====|",
        "| 4294967296  X  On | 0000:00:00.0 Off |",
        "| 99999999999999999999999MiB / 1MiB |",
        "| Processes: |",
        "|=|",
        "|  99999999999   N/A  N/A  99999999999999  C  x  10MiB |",
        "|    0   N/A  N/A  1  C  x  99999999999999999999MiB |",
        "| MIG devices: |",
        "|=|",
        "|  0  99999999999  0  0  | 1MiB / 2MiB |",
        "==============NVSMI LOG==============",
        "GPU 0000:00:00.0",
        "    MIG Device",
        "        FB Memory Usage",
        "            Used : 99999999999999999999999 MiB",
        "    Processes",
        "            Type : C",
        "        Process ID : -1",
        "        Process ID : 5",
        "            Used GPU Memory : 1e9 MiB",
        "GPU zzzz:00:00.0",
        "# gpu pid fb command",
        "# Idx # MB name",
        "0",
        "99999999999 1 2 x",
        "0 99999999999 1 x",
        "0 1 99999999999999999999999 x",
        "#Date Time gpu fb",
        "#YYYYMMDD HH:MM:SS Idx MB",
        "2024050x 12:00:00 0 1",
        "99999999 99:99:99 0 1",
        "memory.used [MiB]",
        "5 MiB",
        "[",
        "a[b]c, d[, memory.used[",
        "timestamp, index, memory.used, pid",
        "2024/13/45 25:61:61.000, 0, 1, 2",
        "2024/05/01 12:00:00.000, 4294967296, 1 MiB",
        "│ 0 名前 │ 0000:00:00.0 │ 1MiB / 2MiB │",
        "Tue Jul 14 08:12:53 2026",
        "#####################################",
        "# title",
        "#####################################",
        "pid, process_name, used_memory",
        ",,,,",
        "1,,",
    ];
    let all = lines.join("\n");
    check_invariants(&parse(&all, 0, None), "all");
    for i in 0..lines.len() {
        for j in i..lines.len() {
            let text = lines[i..=j].join("\n");
            check_invariants(&parse(&text, 0, None), &text);
        }
    }
    let mut rev = lines;
    rev.reverse();
    check_invariants(&parse(&rev.join("\n"), 0, None), "reversed");
}
