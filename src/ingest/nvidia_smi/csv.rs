//! `--query-gpu` and `--query-compute-apps` CSV: with or without header and units, hand-made headers, `-l` logs,
//! and headerless logs whose columns are given, named on a command line, or inferred.

use super::*;

// ---------------------------------------------------------------------------------------------------------------
// CSV columns and rows

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Role {
    Stamp,
    Index,
    Name,
    Bus,
    Uuid,
    Used,
    Total,
    Free,
    Reserved,
    Pid,
    ProcName,
    ProcUsed,
    Other,
}

#[derive(Clone, Debug)]
pub(super) struct Col {
    pub(super) role: Role,
    /// The unit in the header's brackets.
    pub(super) unit: Option<String>,
    pub(super) label: String,
    pub(super) key: String,
}

impl Col {
    /// `memory.used [MiB]`, `memory.used[MiB]`, `"pid"`.
    pub(super) fn new(field: &str) -> Col {
        let f = field.trim().trim_matches('"');
        let (name, unit) = match f.split_once('[') {
            Some((n, u)) => (n.trim(), Some(u.trim_end_matches(']').trim().to_string())),
            None => (f, None),
        };
        let key = name.to_ascii_lowercase();
        let norm = key.replace('_', ".");
        let role = match norm.as_str() {
            "timestamp" => Role::Stamp,
            "index" => Role::Index,
            "name" | "gpu.name" => Role::Name,
            "pci.bus.id" | "gpu.bus.id" | "bus.id" => Role::Bus,
            "uuid" | "gpu.uuid" => Role::Uuid,
            "memory.used" | "mem.used" | "gpu.memory.used" | "fb.memory.used" => Role::Used,
            "memory.total" | "mem.total" | "gpu.memory.total" | "fb.memory.total" => Role::Total,
            "memory.free" | "mem.free" | "gpu.memory.free" | "fb.memory.free" => Role::Free,
            "memory.reserved" | "mem.reserved" | "gpu.memory.reserved" | "fb.memory.reserved" => Role::Reserved,
            "pid" => Role::Pid,
            "process.name" => Role::ProcName,
            "used.gpu.memory" | "used.memory" => Role::ProcUsed,
            _ => Role::Other,
        };
        Col { role, unit: unit.filter(|u| !u.is_empty()), label: name.to_string(), key }
    }

    pub(super) fn inferred(role: Role, label: &str) -> Col {
        Col { role, unit: None, label: label.to_string(), key: label.to_string() }
    }
}

/// A header row of nvidia-smi CSV (or one a script wrote for it).
pub(super) fn csv_header(s: &str) -> Option<Vec<Col>> {
    let b = s.as_bytes();
    if !(b.contains(&b',') || b.contains(&b'[')) || !s.split(',').next().is_some_and(is_field_name) {
        return None;
    }
    let fields: Vec<&str> = s.split(',').collect();
    if !fields.iter().all(|f| is_field_name(f)) {
        return None;
    }
    let cols: Vec<Col> = fields.iter().map(|f| Col::new(f)).collect();
    let memory = |r: Role| matches!(r, Role::Used | Role::Total | Role::Free | Role::Reserved);
    if fields.len() == 1 {
        return memory(cols[0].role).then_some(cols);
    }
    let strong = cols.iter().any(|c| memory(c.role) || !matches!(c.role, Role::Name | Role::Other | Role::ProcName));
    strong.then_some(cols)
}

/// `memory.used`, `memory.used [MiB]`, `temperature[°C]`, `"pid"`.
pub(super) fn is_field_name(f: &str) -> bool {
    let f = f.trim().trim_matches('"');
    let (name, unit) = match f.split_once('[') {
        Some((n, u)) => (n.trim_end(), Some(u)),
        None => (f, None),
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && unit.is_none_or(|u| u.ends_with(']') && !u[..u.len() - 1].contains(['[', ']']))
}

pub(super) enum CsvKind {
    Gpu,
    Apps,
    Other,
}

pub(super) fn csv_kind(cols: &mut [Col]) -> CsvKind {
    let has = |r: Role| cols.iter().any(|c| c.role == r);
    if has(Role::Pid) && (has(Role::ProcName) || has(Role::ProcUsed) || cols.iter().any(|c| c.key == "name")) {
        for c in cols.iter_mut().filter(|c| c.key == "name") {
            c.role = Role::ProcName;
        }
        CsvKind::Apps
    } else if has(Role::Used) || has(Role::Total) || has(Role::Free) || has(Role::Reserved) {
        CsvKind::Gpu
    } else {
        CsvKind::Other
    }
}

pub(super) fn csv_accept(cols: &[Col]) -> impl Fn(&str) -> bool {
    let n = cols.len();
    let more = cols.iter().any(|c| c.role == Role::ProcName || c.key == "name");
    move |s: &str| {
        let k = s.split(',').count();
        k == n || (more && k > n)
    }
}

pub(super) struct Rows {
    /// Positions of the rows.
    pub(super) rows: Vec<usize>,
    /// Lines between rows that are not rows.
    pub(super) junk: Vec<usize>,
    /// Where scanning goes on: after the last row.
    pub(super) next: usize,
}

/// The rows of a block from `start`: lines `accept` takes, up to the next block or a long run of other lines.
pub(super) fn collect_rows(body: &[Line], start: usize, accept: impl Fn(&str) -> bool) -> Rows {
    let (mut rows, mut junk, mut pending) = (Vec::new(), Vec::new(), Vec::new());
    let mut j = start;
    while j < body.len() {
        let s = body[j].1.trim();
        if !s.is_empty() {
            if block_start(body, j).is_some() {
                break;
            }
            if accept(s) {
                junk.append(&mut pending);
                rows.push(j);
            } else {
                pending.push(j);
                if pending.len() > MAX_GAP {
                    break;
                }
            }
        }
        j += 1;
    }
    let next = rows.last().map_or(start, |&r| r + 1);
    Rows { rows, junk, next }
}

/// `[N/A]`, `N/A`, `[Not Supported]`, `Not available in WDDM driver model`, `-`.
pub(super) fn not_available(v: &str) -> bool {
    let v = v.trim();
    v.is_empty()
        || v == "-"
        || v.eq_ignore_ascii_case("n/a")
        || (v.starts_with('[') && v.ends_with(']'))
        || v.starts_with("Not ")
        || v.starts_with("Unknown")
        || v.starts_with("Insufficient")
}

/// `19818 MiB`, `19818` (the header's unit, else MiB), `[N/A]` → None.
pub(super) fn mem_value(v: &str, unit: Option<&str>) -> Result<Option<u64>, ()> {
    let v = v.trim();
    if not_available(v) {
        return Ok(None);
    }
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',')).unwrap_or(v.len());
    let (num, rest) = v.split_at(split);
    let unit = match rest.trim() {
        "" => unit.unwrap_or("MiB"),
        u => u,
    };
    let unit = match unit {
        "MB" => "MiB",
        "GB" => "GiB",
        "KB" => "KiB",
        "TB" => "TiB",
        u => u,
    };
    parse_size(num, unit).map(Some).ok_or(())
}

/// A value in MiB, for inference: `1747`, `1747 MiB`.
pub(super) fn mib_number(v: &str) -> Option<f64> {
    let v = v.trim();
    let n = v.strip_suffix("MiB").unwrap_or(v).trim();
    let (m, d) = parse_decimal(n)?;
    Some(m as f64 / 10f64.powi(d as i32))
}

/// Columns of headerless `--query-gpu` rows, with their labels in words; or why they cannot be told.
pub(super) fn infer(rows: &[Vec<&str>]) -> Result<(Vec<Col>, String), String> {
    let n = rows.first().map_or(0, Vec::len);
    let all = |c: usize, f: &dyn Fn(&str) -> bool| rows.iter().all(|r| f(r[c]));
    let ts: Vec<bool> = (0..n).map(|c| all(c, &smi_stamp)).collect();
    let bus: Vec<bool> = (0..n).map(|c| all(c, &|v| norm_bus(v).is_some())).collect();
    let uuid: Vec<bool> = (0..n).map(|c| all(c, &|v| v.starts_with("GPU-") || v.starts_with("MIG-"))).collect();
    let with_mib: Vec<bool> = (0..n)
        .map(|c| {
            all(c, &|v| not_available(v) || (v.ends_with("MiB") && mib_number(v).is_some()))
                && rows.iter().any(|r| r[c].ends_with("MiB"))
        })
        .collect();
    // Per column, its values as numbers (None where N/A), when every value is one.
    let nums: Vec<Option<Vec<Option<f64>>>> = (0..n)
        .map(|c| {
            let vals: Option<Vec<Option<f64>>> = rows
                .iter()
                .map(|r| if not_available(r[c]) { Some(None) } else { mib_number(r[c]).map(Some) })
                .collect();
            vals.filter(|v| v.iter().any(Option::is_some))
        })
        .collect();
    let mut roles = vec![Role::Other; n];
    for c in 0..n {
        if ts[c] {
            roles[c] = Role::Stamp;
        } else if bus[c] {
            roles[c] = Role::Bus;
        } else if uuid[c] {
            roles[c] = Role::Uuid;
        }
    }
    // The index: the first column after the timestamp, small whole numbers 0..k.
    if let Some(c) = (0..n).find(|&c| !ts[c]) {
        let ints: Option<BTreeSet<u32>> =
            rows.iter().map(|r| r[c].parse::<u32>().ok().filter(|&x| x <= 63)).collect::<Option<_>>();
        if let Some(set) = ints {
            let dense = set.iter().enumerate().all(|(i, &x)| x as usize == i);
            if dense && !with_mib[c] && roles[c] == Role::Other {
                roles[c] = Role::Index;
            }
        }
    }
    if let Some(c) = (0..n).find(|&c| {
        roles[c] == Role::Other
            && nums[c].is_none()
            && rows.iter().all(|r| r[c].chars().any(|ch| ch.is_ascii_alphabetic()))
    }) {
        roles[c] = Role::Name;
    }
    let cand: Vec<usize> = if with_mib.iter().any(|&m| m) {
        (0..n).filter(|&c| with_mib[c]).collect()
    } else {
        (0..n).filter(|&c| roles[c] == Role::Other && nums[c].is_some()).collect()
    };
    let val = |c: usize, r: usize| nums[c].as_ref().and_then(|v| v[r]);
    let fits = |t: usize, u: usize, f: usize| {
        let mut seen = false;
        let ok = (0..rows.len()).all(|r| match (val(t, r), val(u, r), val(f, r)) {
            (Some(t), Some(u), Some(f)) => {
                seen = true;
                t > 0.0 && u + f <= t + 2.0 && t - u - f <= 0.06 * t
            }
            _ => true,
        });
        ok && seen
    };
    let mut triples = Vec::new();
    for &t in &cand {
        for &u in &cand {
            for &f in &cand {
                // Used and free are interchangeable in the sum; nvidia-smi lists used first, and so do scripts.
                if t != u && t != f && u < f && fits(t, u, f) {
                    triples.push((t, u, f));
                }
            }
        }
    }
    match (triples.as_slice(), cand.as_slice()) {
        ([(t, u, f)], _) => {
            roles[*t] = Role::Total;
            roles[*u] = Role::Used;
            roles[*f] = Role::Free;
        }
        ([], [only]) if with_mib[*only] => roles[*only] = Role::Used,
        ([], [a, b]) if with_mib[*a] => {
            let constant = |c: usize| (0..rows.len()).all(|r| val(c, r) == val(c, 0));
            let ge = |x: usize, y: usize| (0..rows.len()).all(|r| val(x, r) >= val(y, r));
            match (constant(*a) && ge(*a, *b), constant(*b) && ge(*b, *a)) {
                (true, false) => (roles[*a], roles[*b]) = (Role::Total, Role::Used),
                (false, true) => (roles[*a], roles[*b]) = (Role::Used, Role::Total),
                _ => return Err("two memory columns, and neither is a constant total".to_string()),
            }
        }
        ([], _) => return Err("no three number columns where used + free ≈ total".to_string()),
        (many, _) => {
            let list: Vec<String> = many.iter().map(|(t, u, f)| format!("{}/{}/{}", t + 1, u + 1, f + 1)).collect();
            return Err(format!(
                "several column triples fit used + free ≈ total (total/used/free: {})",
                list.join(", ")
            ));
        }
    }
    let label = |r: Role| match r {
        Role::Stamp => "timestamp",
        Role::Index => "index",
        Role::Name => "name",
        Role::Bus => "pci.bus_id",
        Role::Uuid => "uuid",
        Role::Total => "memory.total",
        Role::Used => "memory.used",
        Role::Free => "memory.free",
        _ => "?",
    };
    let cols: Vec<Col> = roles.iter().map(|&r| Col::inferred(r, label(r))).collect();
    let labels: Vec<&str> = roles.iter().map(|&r| label(r)).collect();
    Ok((cols, labels.join(", ")))
}

/// `3 GPUs`, `1 process`.
pub(super) fn count(n: usize, word: &str) -> String {
    match (n, word.ends_with('s')) {
        (1, _) => format!("1 {word}"),
        (_, true) => format!("{n} {word}es"),
        _ => format!("{n} {word}s"),
    }
}

impl Builder<'_> {
    /// Rows without a header: columns from the caller or the command, else inferred.
    pub(super) fn headerless(
        &mut self,
        body: &[Line],
        start: usize,
        given: Option<(Vec<String>, &str)>,
        out: &mut ScanOut,
    ) -> usize {
        let n = body[start].1.split(',').count();
        let rows = collect_rows(body, start, |s: &str| s.split(',').count() == n);
        let (cols, how) = match given {
            Some((names, how)) => (names.iter().map(|c| Col::new(c)).collect(), how.to_string()),
            None => {
                let fields: Vec<Vec<&str>> =
                    rows.rows.iter().map(|&k| body[k].1.split(',').map(strip).collect()).collect();
                match infer(&fields) {
                    Ok((cols, labels)) => (cols, format!("no header; columns inferred: {labels}")),
                    Err(why) => {
                        let first = rows.rows.first().map_or(body[start].0, |&k| body[k].0);
                        self.bad(
                            first,
                            "a --query-gpu row whose columns can be told (give the column list)",
                            &format!("{} headerless rows: {why}", rows.rows.len()),
                        );
                        self.malformed_lines += (rows.rows.len() + rows.junk.len()).saturating_sub(1);
                        out.unread.push(format!("headerless CSV whose columns could not be told: {why}"));
                        return rows.next.max(start + 1);
                    }
                }
            }
        };
        self.csv(body, &rows, cols, &how, out);
        rows.next.max(start + 1)
    }

    pub(super) fn csv(&mut self, body: &[Line], rows: &Rows, mut cols: Vec<Col>, how: &str, out: &mut ScanOut) {
        let kind = csv_kind(&mut cols);
        let how = if how.is_empty() { String::new() } else { format!("; {how}") };
        // Rows and the lines between them, in file order.
        let mut items: Vec<(usize, bool)> = rows.rows.iter().map(|&k| (k, true)).collect();
        items.extend(rows.junk.iter().map(|&k| (k, false)));
        items.sort_unstable();
        let mut n = 0;
        for (k, is_row) in items {
            let (no, line) = (body[k].0, body[k].1.as_str());
            let res = match (is_row, &kind) {
                (_, CsvKind::Other) => Ok(()),
                (false, _) => Err(format!("a CSV row of {} fields", cols.len())),
                (true, CsvKind::Gpu) => self.gpu_row(&cols, line, no),
                (true, CsvKind::Apps) => self.app_row(&cols, line),
            };
            match res {
                Ok(()) => n += usize::from(is_row),
                Err(exp) => self.bad(no, exp, line),
            }
        }
        match kind {
            CsvKind::Gpu => out.read.push(format!("nvidia-smi --query-gpu CSV ({}{how})", count(n, "row"))),
            CsvKind::Apps => {
                out.read.push(format!("nvidia-smi --query-compute-apps CSV ({}{how})", count(n, "process")))
            }
            CsvKind::Other => {
                let names: Vec<&str> = cols.iter().take(4).map(|c| c.label.as_str()).collect();
                out.unread.push(format!("nvidia-smi CSV without memory or process columns ({}, …)", names.join(", ")));
            }
        }
    }

    pub(super) fn gpu_row(&mut self, cols: &[Col], line: &str, no: usize) -> Result<(), String> {
        let fields: Vec<&str> = line.split(',').map(strip).collect();
        if fields.len() != cols.len() {
            return Err(format!("{} fields", cols.len()));
        }
        let mut id = Ident::default();
        let mut m = self.sample(None, no);
        let mut any = false;
        for (c, v) in cols.iter().zip(&fields) {
            match c.role {
                Role::Stamp if !not_available(v) => {
                    m.stamp = Some(find_stamp(v).ok_or("a timestamp (YYYY/MM/DD HH:MM:SS.mmm)")?.0);
                }
                Role::Index => id.index = Some(v.parse().map_err(|_| "a GPU index")?),
                Role::Name if !not_available(v) => id.name = Some(v.to_string()),
                Role::Bus => id.bus = norm_bus(v),
                Role::Uuid if v.starts_with("GPU-") => id.uuid = Some(v.to_string()),
                Role::Used | Role::Total | Role::Free | Role::Reserved => {
                    let x = mem_value(v, c.unit.as_deref()).map_err(|()| format!("{} in MiB or [N/A]", c.label))?;
                    any |= x.is_some();
                    match c.role {
                        Role::Used => m.used = x,
                        Role::Total => m.total = x,
                        Role::Free => m.free = x,
                        _ => m.driver_reserved = x,
                    }
                }
                _ => {}
            }
        }
        if id.index.is_none() && id.bus.is_none() && id.uuid.is_none() {
            id.ordinal = Some(0);
        }
        let pos = self.resolve(id);
        if any {
            self.gpus[pos].gpu.samples.push(m);
        }
        Ok(())
    }

    pub(super) fn app_row(&mut self, cols: &[Col], line: &str) -> Result<(), String> {
        let mut fields: Vec<&str> = line.split(',').collect();
        // Commas inside a process name: give the extra fields back to it.
        let extra = fields.len().saturating_sub(cols.len());
        let joined;
        if extra > 0 {
            let at = cols.iter().position(|c| c.role == Role::ProcName).ok_or(format!("{} fields", cols.len()))?;
            joined = fields[at..=at + extra].join(",");
            fields.splice(at..=at + extra, [joined.as_str()]);
        }
        if fields.len() != cols.len() {
            return Err(format!("{} fields", cols.len()));
        }
        let mut id = Ident::default();
        let mut p = GpuProcess { pid: 0, name: String::new(), kind: String::new(), used_bytes: None, mig: None };
        let mut pid = None;
        for (c, v) in cols.iter().zip(fields.iter().map(|f| strip(f))) {
            match c.role {
                Role::Pid => pid = Some(v.parse::<u32>().map_err(|_| "a process id")?),
                Role::ProcName => p.name = v.to_string(),
                Role::ProcUsed => {
                    p.used_bytes = mem_value(v, c.unit.as_deref()).map_err(|()| format!("{} in MiB", c.label))?
                }
                Role::Bus => id.bus = norm_bus(v),
                Role::Uuid if v.starts_with("GPU-") => id.uuid = Some(v.to_string()),
                Role::Name if !not_available(v) => id.name = Some(v.to_string()),
                _ => {}
            }
        }
        p.pid = pid.ok_or("a process id")?;
        if id.bus.is_none() && id.uuid.is_none() {
            id.ordinal = Some(0);
        }
        let pos = self.resolve(id);
        self.add_process(pos, p, 3);
        Ok(())
    }
}
