//! `nvidia-smi dmon` and `pmon`: a header row of column names and units, then a row per sample.

use super::*;

impl Builder<'_> {
    pub(super) fn monitor(&mut self, body: &[Line], start: usize, out: &mut ScanOut) -> usize {
        let names = tokens(&body[start].1);
        let units_at = (start + 1..body.len()).find(|&k| !strip(&body[k].1).is_empty()).unwrap_or(start);
        let units = tokens(&body[units_at].1);
        let col = |n: &str| names.iter().position(|x| x == n);
        let (gpu_c, pid_c, fb_c) = (col("gpu"), col("pid"), col("fb"));
        let (Some(gpu_c), pmon) = (gpu_c, pid_c.is_some()) else { return start + 1 };
        let (mut rows, mut samples, mut pids) = (0usize, 0usize, BTreeSet::new());
        let mut pending: Vec<usize> = Vec::new();
        let mut last = units_at;
        let mut j = units_at + 1;
        while j < body.len() {
            let s = strip(&body[j].1);
            if s.is_empty() {
                j += 1;
                continue;
            }
            if s.starts_with('#') {
                let t = tokens(s);
                if t == names || t == units {
                    last = j;
                    j += 1;
                    continue;
                }
            }
            if block_start(body, j).is_some() {
                break;
            }
            let toks: Vec<&str> = s.split_whitespace().collect();
            if !toks[0].bytes().all(|b| b.is_ascii_digit()) {
                pending.push(j);
                if pending.len() > MAX_GAP {
                    break;
                }
                j += 1;
                continue;
            }
            for k in std::mem::take(&mut pending) {
                self.bad(body[k].0, if pmon { "a pmon row" } else { "a dmon row" }, &body[k].1);
            }
            last = j;
            j += 1;
            if toks.len() < names.len() {
                self.bad(body[last].0, format!("{} columns ({})", names.len(), names.join(" ")), s);
                continue;
            }
            let Ok(gpu) = toks[gpu_c].parse::<u32>() else {
                self.bad(body[last].0, "a GPU index", s);
                continue;
            };
            let stamp = monitor_stamp(&names, &toks);
            let fb = match fb_c.map(|c| toks[c]) {
                None | Some("-") => Ok(None),
                Some(v) => parse_size(v, "MiB").map(Some).ok_or(()),
            };
            let Ok(fb) = fb else {
                self.bad(body[last].0, "fb in MiB", s);
                continue;
            };
            rows += 1;
            let pos_of = |b: &mut Self| b.resolve(Ident { index: Some(gpu), ..Ident::default() });
            if let Some(pc) = pid_c {
                if toks[pc] == "-" {
                    pos_of(self);
                    continue;
                }
                let Ok(pid) = toks[pc].parse::<u32>() else {
                    self.bad(body[last].0, "a process id or -", s);
                    continue;
                };
                let kind = col("type").map(|c| toks[c]).filter(|t| *t != "-").unwrap_or("").to_string();
                let name = col("command").map(|c| toks[c..].join(" ")).filter(|n| n != "-").unwrap_or_default();
                let pos = pos_of(self);
                self.add_process(pos, GpuProcess { pid, name, kind, used_bytes: fb, mig: None }, 1);
                pids.insert(pid);
            } else if fb.is_some() {
                let pos = pos_of(self);
                let mut m = self.sample(stamp, body[last].0);
                m.used = fb;
                self.gpus[pos].gpu.samples.push(m);
                samples += 1;
            } else {
                pos_of(self);
            }
        }
        out.read.push(if pmon {
            format!("nvidia-smi pmon ({}, {})", count(rows, "row"), count(pids.len(), "process"))
        } else if fb_c.is_some() {
            format!("nvidia-smi dmon ({}, {})", count(rows, "row"), count(samples, "sample"))
        } else {
            format!("nvidia-smi dmon ({}; no fb column, so no memory figures)", count(rows, "row"))
        });
        last + 1
    }
}
