//! The default table: every driver generation's boxes, the MIG devices box and the Processes box.

use super::*;

// ---------------------------------------------------------------------------------------------------------------
// Table rows

/// `|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:09.0 Off |` (name, persistence/driver model, bus id).
pub(super) static GPU_ROW: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\|\s*(\d+)\s+(.*?)\s+(\S+)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
        .expect("valid regex")
});
/// `|   19818MiB /  81559MiB |`
pub(super) static MEM_CELL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|").expect("valid regex"));
/// `|  0    2   0   0  |              26MiB / 40448MiB    |` (GPU, GI, CI, MIG device, used, total).
pub(super) static MIG_ROW: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB").expect("valid regex")
});
/// `|    0   N/A  N/A           11345      C   ./gpu_burn                            15690MiB |` (GI/CI columns
/// since 450; `N/A` memory under WDDM).
pub(super) static PROC_ROW: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\|\s*(\d+)\s+(?:(N/A|\d+)\s+(N/A|\d+)\s+)?(\d+)\s+([CGM](?:\+[CGM])*)\s+(.*?)\s+(\d+MiB|N/A)\s*\|$")
        .expect("valid regex")
});

impl Builder<'_> {
    pub(super) fn table(&mut self, body: &[Line], start: usize, stamp: Option<Stamp>, out: &mut ScanOut) -> usize {
        #[derive(Clone, Copy, PartialEq)]
        enum Part {
            Head,
            Gpus,
            MigHead,
            Migs,
            ProcHead,
            Procs,
        }
        let mut part = Part::Head;
        let (mut gpus, mut procs, mut migs) = (0usize, 0usize, 0usize);
        // The GPU row waiting for its Memory-Usage row: (position, line, seen).
        let mut pending: Option<(usize, usize, bool)> = None;
        let mut j = start;
        while j < body.len() {
            let (no, s) = (body[j].0, strip(&body[j].1));
            let new_table = j > start && s.starts_with('|') && s.contains("NVIDIA-SMI ");
            if new_table || !(s.is_empty() || s.starts_with('|') || s.starts_with('+')) {
                break;
            }
            j += 1;
            let first = s.strip_prefix('|').and_then(|r| r.split('|').next()).map_or("", strip);
            // Rules: `+---+`, `|---+---|` (≤ 570), and `|===|` under each box's header.
            if s.chars().all(|c| matches!(c, '|' | '+' | '-' | '=' | ' ')) {
                if s.contains('=') {
                    part = match part {
                        Part::Head => Part::Gpus,
                        Part::MigHead => Part::Migs,
                        Part::ProcHead => Part::Procs,
                        p => p,
                    };
                }
                continue;
            }
            if first.starts_with("MIG devices:") {
                part = Part::MigHead;
                continue;
            }
            if first.starts_with("Processes:") {
                part = Part::ProcHead;
                continue;
            }
            if first.is_empty() {
                continue;
            }
            match part {
                Part::Head | Part::MigHead | Part::ProcHead => {}
                Part::Gpus => {
                    if let Some(c) = GPU_ROW.captures(s) {
                        if let Some((_, line, false)) = pending {
                            self.bad(line, "the GPU's Memory-Usage row (`<used>MiB / <total>MiB`)", "another GPU row");
                        }
                        let Ok(index) = c[1].parse::<u32>() else {
                            self.bad(no, "a GPU index", s);
                            continue;
                        };
                        let name = Some(c[2].trim().to_string());
                        let pos =
                            self.resolve(Ident { index: Some(index), bus: norm_bus(&c[4]), name, ..Ident::default() });
                        pending = Some((pos, no, false));
                        gpus += 1;
                    } else if let Some(c) = MEM_CELL.captures(s) {
                        match &mut pending {
                            Some((pos, _, seen @ false)) => {
                                *seen = true;
                                let mut m = self.sample(stamp, no);
                                m.used = parse_size(&c[1], "MiB");
                                m.total = parse_size(&c[2], "MiB");
                                self.gpus[*pos].gpu.samples.push(m);
                            }
                            _ => self.bad(no, "a GPU row before this Memory-Usage row", s),
                        }
                    } else {
                        self.bad(
                            no,
                            "a GPU row (`| <index>  <name>  <persistence> | <bus id> …`) or its Memory-Usage row",
                            s,
                        );
                    }
                }
                Part::Migs => match MIG_ROW.captures(s) {
                    Some(c) => {
                        let n = |i: usize| c[i].parse::<u32>().ok();
                        let (Some(gpu), Some(gi), Some(ci), Some(dev)) = (n(1), n(2), n(3), n(4)) else {
                            self.bad(no, "MIG device numbers", s);
                            continue;
                        };
                        let (Some(used), Some(total)) = (parse_size(&c[5], "MiB"), parse_size(&c[6], "MiB")) else {
                            self.bad(no, "MIG memory in MiB", s);
                            continue;
                        };
                        let pos = self.resolve(Ident { index: Some(gpu), ..Ident::default() });
                        self.add_mig(pos, (gi, ci, dev, used, total));
                        migs += 1;
                    }
                    None => self.bad(no, "a MIG device row (`| GPU GI CI MIG | <used>MiB / <total>MiB …`)", s),
                },
                Part::Procs => {
                    if s.contains("No running processes found") {
                        continue;
                    }
                    match self.table_process(s) {
                        Some(()) => procs += 1,
                        None => self.bad(no, "a process row (`| GPU [GI CI] PID Type Process-name Usage |`)", s),
                    }
                }
            }
        }
        if let Some((_, line, false)) = pending {
            self.bad(line, "the GPU's Memory-Usage row (`<used>MiB / <total>MiB`)", "end of table");
        }
        let mig_part = if migs > 0 { format!(", {}", count(migs, "MIG device")) } else { String::new() };
        out.read.push(format!(
            "nvidia-smi default table ({}, {}{mig_part})",
            count(gpus, "GPU"),
            count(procs, "process")
        ));
        j
    }

    pub(super) fn table_process(&mut self, s: &str) -> Option<()> {
        let c = PROC_ROW.captures(s)?;
        let gpu = c[1].parse::<u32>().ok()?;
        let pid = c[4].parse::<u32>().ok()?;
        let id = |m: Option<regex::Match>| m.and_then(|m| m.as_str().parse::<u32>().ok());
        let mig = id(c.get(2)).zip(id(c.get(3)));
        let used_bytes = c[7].strip_suffix("MiB").and_then(|n| parse_size(n, "MiB"));
        let p = GpuProcess { pid, name: c[6].trim().to_string(), kind: c[5].to_string(), used_bytes, mig };
        let pos = self.resolve(Ident { index: Some(gpu), ..Ident::default() });
        self.add_process(pos, p, 2);
        Some(())
    }
}
