//! `nvidia-smi -q` and `-q -d MEMORY`: indented key-value blocks per GPU.

use super::*;

impl Builder<'_> {
    pub(super) fn query(&mut self, body: &[Line], start: usize, out: &mut ScanOut) -> usize {
        #[derive(Default)]
        struct QMig {
            index: Option<u32>,
            gi: Option<u32>,
            ci: Option<u32>,
            used: Option<u64>,
            total: Option<u64>,
        }
        #[derive(Default)]
        struct QGpu {
            bus: Option<String>,
            uuid: Option<String>,
            name: Option<String>,
            /// Total, reserved, used, free.
            fb: [Option<u64>; 4],
            fb_line: usize,
            migs: Vec<QMig>,
            procs: Vec<GpuProcess>,
            gi: Option<u32>,
            ci: Option<u32>,
        }
        let mut stamp = None;
        let mut gpus: Vec<QGpu> = Vec::new();
        let mut stack: Vec<(usize, String)> = Vec::new();
        let mut j = start;
        while j < body.len() {
            let (no, s) = (body[j].0, strip(&body[j].1));
            if s.is_empty() {
                j += 1;
                continue;
            }
            let indent = indent_of(&body[j].1);
            if indent == 0 {
                if s.starts_with("==") && s.contains("NVSMI LOG") {
                    if j > start {
                        break;
                    }
                } else if let Some(bus) = gpu_header(s) {
                    gpus.push(QGpu { bus: Some(bus), ..QGpu::default() });
                } else if let Some((k, v)) = key_value(s) {
                    if k == "Timestamp" {
                        stamp = find_stamp(v).map(|(st, _, _)| st);
                    }
                } else {
                    break;
                }
                stack.clear();
                j += 1;
                continue;
            }
            j += 1;
            let Some(g) = gpus.last_mut() else { continue };
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            let Some((key, v)) = key_value(s) else {
                if s == "MIG Device" {
                    g.migs.push(QMig::default());
                }
                if s == "FB Memory Usage" && stack.is_empty() {
                    g.fb_line = no;
                }
                stack.push((indent, s.to_string()));
                continue;
            };
            let in_procs = stack.iter().any(|(_, h)| h == "Processes");
            let in_mig = stack.iter().any(|(_, h)| h == "MIG Device");
            let last = stack.last().map_or("", |(_, h)| h.as_str());
            if in_procs {
                match key {
                    "GPU instance ID" => g.gi = v.parse().ok(),
                    "Compute instance ID" => g.ci = v.parse().ok(),
                    "Process ID" => match v.parse::<u32>() {
                        Ok(pid) => {
                            let mig = g.gi.zip(g.ci);
                            g.procs.push(GpuProcess {
                                pid,
                                name: String::new(),
                                kind: String::new(),
                                used_bytes: None,
                                mig,
                            });
                            (g.gi, g.ci) = (None, None);
                        }
                        Err(_) => self.bad(no, "a process id", s),
                    },
                    "Type" | "Name" | "Used GPU Memory" => {
                        let Some(p) = g.procs.last_mut() else {
                            self.bad(no, "`Process ID` before the process's details", s);
                            continue;
                        };
                        match key {
                            "Type" => p.kind = v.to_string(),
                            "Name" => p.name = v.to_string(),
                            _ => match mem_value(v, None) {
                                Ok(u) => p.used_bytes = u,
                                Err(()) => self.bad(no, "memory in MiB or N/A", s),
                            },
                        }
                    }
                    _ => {}
                }
            } else if last.ends_with("FB Memory Usage") {
                let slot = match key {
                    "Total" => 0,
                    "Reserved" => 1,
                    "Used" => 2,
                    "Free" => 3,
                    _ => continue,
                };
                let val = match mem_value(v, None) {
                    Ok(x) => x,
                    Err(()) => {
                        self.bad(no, "memory in MiB or N/A", s);
                        None
                    }
                };
                match (in_mig, g.migs.last_mut()) {
                    (true, Some(m)) if slot == 0 => m.total = val,
                    (true, Some(m)) if slot == 2 => m.used = val,
                    (true, _) => {}
                    (false, _) if stack.len() == 1 => g.fb[slot] = val,
                    (false, _) => {}
                }
            } else if in_mig && last == "MIG Device" {
                let m = g.migs.last_mut();
                match (key, m) {
                    ("Index", Some(m)) => m.index = v.parse().ok(),
                    ("GPU Instance ID", Some(m)) => m.gi = v.parse().ok(),
                    ("Compute Instance ID", Some(m)) => m.ci = v.parse().ok(),
                    _ => {}
                }
            } else if stack.is_empty() {
                match key {
                    "Product Name" => g.name = Some(v.to_string()),
                    "GPU UUID" => g.uuid = Some(v.to_string()).filter(|u| u.starts_with("GPU-")),
                    _ => {}
                }
            }
        }
        let (mut procs, mut migs) = (0, 0);
        let n_gpus = gpus.len();
        for (k, g) in gpus.into_iter().enumerate() {
            let ordinal = u32::try_from(k).ok();
            let pos = self.resolve(Ident { ordinal, bus: g.bus, uuid: g.uuid, name: g.name, index: None });
            if g.fb.iter().any(Option::is_some) {
                let mut m = self.sample(stamp, g.fb_line);
                (m.total, m.driver_reserved, m.used, m.free) = (g.fb[0], g.fb[1], g.fb[2], g.fb[3]);
                self.gpus[pos].gpu.samples.push(m);
            }
            for m in g.migs {
                if let (Some(gi), Some(ci), Some(used), Some(total)) = (m.gi, m.ci, m.used, m.total) {
                    let dev = m.index.unwrap_or(migs as u32);
                    self.add_mig(pos, (gi, ci, dev, used, total));
                    migs += 1;
                }
            }
            for p in g.procs {
                self.add_process(pos, p, 3);
                procs += 1;
            }
        }
        let mig_part = if migs > 0 { format!(", {}", count(migs, "MIG device")) } else { String::new() };
        out.read.push(format!("nvidia-smi -q ({}, {}{mig_part})", count(n_gpus, "GPU"), count(procs, "process")));
        j
    }
}
