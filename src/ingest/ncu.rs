//! Nsight Compute `ncu --csv` output: the default long "details" page (one row per kernel launch and metric) in
//! every header generation (ncu 2020 with `Kernel Time` and `--nvtx` columns; 2021+ with `Block Size`,
//! `Grid Size`, `Device`, `CC`; 2023.2+ with rule columns and short rows), and the wide `--page raw` page (one row
//! per launch, a row of units under the header). What ncu and the application print before the CSV
//! (`==PROF==` lines, program output) is skipped: the table starts at the header whose first cell is `ID`.
//!
//! Values keep the unit the file wrote (`byte`, `Mbyte`, `nsecond`, `us`, `%`, `Gbyte/second` …); thousands
//! separators (`"81,920"`) and a comma-decimal locale (`"1.234,5"`, `"27.595.520"`) are read per table.

use std::collections::BTreeMap;
use std::collections::HashMap;

use super::nsys::{excerpt, is_none_cell, parse_dim3, split_csv, NumberStyle};
use super::text;
use crate::timeline::profile::{Dim3, MetricValue, NcuKernel, NcuRule, ProfileData, ProfileSource};
use crate::timeline::Malformed;

/// The columns that say which launch a row is about (everything else on the raw page is a metric).
const IDENTITY: [&str; 12] = [
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Kernel Time",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
];

fn is_nvtx_column(h: &str) -> bool {
    h.contains("Push/Pop_Range") || h.contains("Start/Stop_Range")
}

/// A header row: first cell `ID`, a `Kernel Name` column.
fn header_cells(line: &str) -> Option<Vec<String>> {
    let l = line.trim_start_matches('\u{feff}').trim();
    if !l.starts_with("\"ID\"") && !l.starts_with("ID,") {
        return None;
    }
    let cells = split_csv(l)?;
    (cells.first().is_some_and(|c| c == "ID") && cells.iter().any(|c| c == "Kernel Name")).then_some(cells)
}

/// Whether the text holds an `ncu --csv` table (details or raw page).
pub fn sniff(text: &str) -> bool {
    let mut launch = false;
    for (_, l) in text::lines(text) {
        if header_cells(&l).is_some() {
            return true;
        }
        // The human-readable page: a launch line, then a `Section:` table.
        launch |= launch_line(&l).is_some();
        if launch && l.trim_start().starts_with("Section: ") {
            return true;
        }
    }
    false
}

/// Why a file is not an Nsight Compute export we read (one line, without the path).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NcuError(pub String);

impl From<String> for NcuError {
    fn from(message: String) -> NcuError {
        NcuError(message)
    }
}

/// Reads one `ncu --csv` output (a file or a captured stdout). `name_hint` names the source in bookkeeping.
pub fn parse(text: &str, name_hint: Option<&str>) -> Result<ProfileData, NcuError> {
    let lines: Vec<(usize, String)> = text::lines(text).collect();
    let mut src = ProfileSource { name: name_hint.unwrap_or("<input>").to_string(), ..ProfileSource::default() };
    let headers: Vec<usize> =
        lines.iter().enumerate().filter(|(_, (_, l))| header_cells(l).is_some()).map(|(i, _)| i).collect();
    let mut data = ProfileData::default();
    let before = &lines[..headers.first().copied().unwrap_or(lines.len())];
    if !headers.is_empty() {
        note_preamble(before, &mut src, "the CSV");
    }
    if headers.is_empty() {
        let profiler = before.iter().any(|(_, l)| l.starts_with("==PROF==") || l.starts_with("==WARNING=="));
        if before.iter().any(|(_, l)| l.contains("No kernels were profiled")) {
            src.format = "ncu output".into();
            src.skipped.push("ncu profiled no kernel (`==WARNING== No kernels were profiled.`)".into());
            data.sources.push(src);
            return Ok(data);
        }
        let first = lines.iter().map(|(_, l)| l.trim()).find(|l| !l.is_empty()).unwrap_or("");
        let human = lines.iter().any(|(_, l)| l.trim_start().starts_with("Section: "));
        if human {
            read_human(&lines, &mut data, &mut src);
            if !data.ncu_kernels.is_empty() {
                let first_launch = data.ncu_kernels[0].line;
                src.skipped.clear();
                let before: Vec<(usize, String)> = lines.iter().filter(|(n, _)| *n < first_launch).cloned().collect();
                note_preamble(&before, &mut src, "the first kernel");
                data.sources.push(src);
                return Ok(data);
            }
        }
        return Err((format!(
            "not an Nsight Compute CSV: looked for a header row starting `\"ID\",\"Process ID\",…` with a \
             `\"Kernel Name\"` column (details page: `…,\"Metric Name\",\"Metric Unit\",\"Metric Value\"`; raw page: \
             one column per metric and a row of units), after any `==PROF==` lines and program output; found {}",
            if human {
                "ncu's human-readable output (`Section:` blocks) but no kernel header line before them (run ncu \
                 with --csv)"
                    .to_string()
            } else if profiler {
                "ncu's `==PROF==` lines but no CSV table (was --csv given?)".to_string()
            } else if first.is_empty() {
                "an empty text".to_string()
            } else {
                format!("text starting {:?}", excerpt(first))
            }
        ))
        .into());
    }
    let mut formats = Vec::new();
    for (k, &h) in headers.iter().enumerate() {
        let end = headers.get(k + 1).copied().unwrap_or(lines.len());
        let cells = header_cells(&lines[h].1).unwrap_or_default();
        let body = &lines[h + 1..end];
        let format = if cells.iter().any(|c| c == "Metric Name") && cells.iter().any(|c| c == "Metric Value") {
            read_details(&cells, lines[h].0, body, &mut data, &mut src)
        } else {
            read_raw(&cells, lines[h].0, body, &mut data, &mut src)
        };
        if !formats.contains(&format) {
            formats.push(format);
        }
    }
    src.format = formats.join("; ");
    data.sources.push(src);
    Ok(data)
}

/// The launch line of ncu's human-readable page: `  name, 2024-Jul-13 20:38:33, Context 1, Stream 7` (2020) or
/// `  name (117, 1, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 8.6` (2021+): the name, the time, the grid
/// and block, context, stream, device, CC.
type LaunchLine = (String, Option<String>, Option<(Dim3, Dim3)>, Option<u64>, Option<u64>, Option<i64>, Option<String>);

fn launch_line(line: &str) -> Option<LaunchLine> {
    if !line.starts_with("  ") || line.starts_with("   ") {
        return None;
    }
    let l = line.trim();
    let at = l.rfind(", Context ")?;
    let (head, tail) = (&l[..at], &l[at + 2..]);
    let mut context = None;
    let mut stream = None;
    let mut device = None;
    let mut cc = None;
    for part in tail.split(", ") {
        let (k, v) = part.split_once(' ')?;
        match k {
            "Context" => context = v.parse().ok(),
            "Stream" => stream = v.parse().ok(),
            "Device" => device = v.parse().ok(),
            "CC" => cc = Some(v.to_string()),
            _ => {}
        }
    }
    context?;
    // `(117, 1, 1)x(128, 1, 1)` after the name (2021+), or `, <time>` (2020).
    if let Some(x) = head.rfind(")x(") {
        let open = head[..x].rfind(" (")?;
        let grid = parse_dim3(&head[open + 1..=x])?;
        let block = parse_dim3(&head[x + 2..])?;
        return Some((head[..open].to_string(), None, Some((grid, block)), context, stream, device, cc));
    }
    let (name, time) = match head.rsplit_once(", ") {
        Some((n, t)) if t.chars().next().is_some_and(|c| c.is_ascii_digit()) => (n, Some(t.to_string())),
        _ => (head, None),
    };
    Some((name.to_string(), time, None, context, stream, device, cc))
}

/// ncu's default, human-readable page: after the program output, `[pid] process@host`, then per launch its line,
/// `NVTX … Ranges:` blocks, and `Section: …` tables of `name  unit  value` between dashed rules (newer versions add
/// a `Metric Name  Metric Unit  Metric Value` header). Launches are numbered from 0 in order, as `ID` in the CSV.
fn read_human(lines: &[(usize, String)], data: &mut ProfileData, src: &mut ProfileSource) {
    let values = lines.iter().filter_map(|(_, l)| {
        let t = l.trim_end();
        t.rsplit_once("  ").map(|(_, v)| v.trim()).filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit()))
    });
    let style = NumberStyle::detect(values, []);
    let mut process: (Option<u64>, String, String) = (None, String::new(), String::new());
    let mut section: Option<String> = None;
    let mut spans: Option<Vec<(usize, usize)>> = None;
    let mut in_nvtx = false;
    let mut table_rows = 0;
    let (mut header_seen, mut header_closed) = (false, false);
    let mut metric_rows = 0;
    let first = data.ncu_kernels.len();
    for (no, line) in lines {
        let t = line.trim();
        if t.is_empty() || t.starts_with("==") {
            continue;
        }
        if let Some(rest) = t.strip_prefix('[') {
            if let Some((pid, who)) = rest.split_once("] ") {
                if let Ok(pid) = pid.parse::<u64>() {
                    let (name, host) = who.rsplit_once('@').unwrap_or((who, ""));
                    process = (Some(pid), name.to_string(), host.to_string());
                    continue;
                }
            }
        }
        if let Some((name, time, dims, context, stream, device, cc)) = launch_line(line) {
            data.ncu_kernels.push(NcuKernel {
                id: (data.ncu_kernels.len() - first) as u64,
                process_id: process.0,
                process: process.1.clone(),
                host: process.2.clone(),
                name,
                kernel_time: time,
                device,
                cc,
                context,
                stream,
                grid: dims.map(|d| d.0),
                block: dims.map(|d| d.1),
                nvtx: Vec::new(),
                metrics: BTreeMap::new(),
                rules: Vec::new(),
                line: *no,
            });
            section = None;
            spans = None;
            in_nvtx = false;
            continue;
        }
        let Some(kernel) = data.ncu_kernels[first..].last_mut() else { continue };
        if t.starts_with("NVTX ") && t.ends_with("Ranges:") {
            in_nvtx = true;
            continue;
        }
        if let Some(name) = t.strip_prefix("Section: ") {
            section = Some(name.to_string());
            spans = None;
            in_nvtx = false;
            continue;
        }
        if in_nvtx {
            // `<0,convLayer>` (start/end: id, name) or `<convLayer>`; `<default domain>` names the domain.
            if let Some(inner) = t.strip_prefix('<').and_then(|x| x.strip_suffix('>')) {
                if inner != "default domain" {
                    let name = inner.split_once(',').map_or(inner, |(_, n)| n);
                    kernel.nvtx.push(name.to_string());
                }
            }
            continue;
        }
        if t.chars().all(|c| c == '-' || c == ' ') {
            // A rule opens a table; a second one right after the optional `Metric Name …` header is part of the
            // header; one after rows closes the table (rule advice printed below it is not a metric).
            match &spans {
                None => {
                    let indent = line.len() - line.trim_start().len();
                    let mut v = Vec::new();
                    let mut start = None;
                    for (i, c) in line.char_indices() {
                        match (c, start) {
                            ('-', None) => start = Some(i),
                            (' ', Some(s)) => {
                                v.push((s, i));
                                start = None;
                            }
                            _ => {}
                        }
                    }
                    if let Some(s) = start {
                        v.push((s, line.len()));
                    }
                    spans = (v.len() == 3 && v[0].0 == indent).then_some(v);
                    table_rows = 0;
                    header_seen = false;
                    header_closed = false;
                }
                // The rule under a `Metric Name` header.
                Some(_) if table_rows == 0 && header_seen && !header_closed => header_closed = true,
                Some(_) => spans = None,
            }
            continue;
        }
        if spans.is_none() {
            continue;
        }
        if table_rows == 0 && t.starts_with("Metric Name") {
            header_seen = true;
            continue;
        }
        // Columns are set apart by two or more spaces; a wide unit (`register/thread`) may start inside the name's
        // column, so the rule's spans cannot cut them. The value is the last word.
        let body = t;
        let (left, value) = match body.rsplit_once(char::is_whitespace) {
            Some((l, v)) => (l.trim_end(), v.trim()),
            None => ("", body),
        };
        // Name and unit set apart by one space only (both filling their columns): the unit is what the rule's
        // middle column holds.
        let unit_in_column = spans
            .as_ref()
            .and_then(|sp| line.get(sp[1].0..sp[1].1.min(line.len())))
            .map(str::trim)
            .filter(|u| !u.is_empty() && !u.contains(' ') && left.ends_with(&format!(" {u}")));
        let (name, unit) = match (left.rfind("  "), unit_in_column) {
            (Some(i), _) => (left[..i].trim(), left[i..].trim()),
            (None, Some(u)) => (left[..left.len() - u.len()].trim(), u),
            (None, None) => (left.trim(), ""),
        };
        if name.is_empty() || value.is_empty() {
            src.malformed.push(bad(*no, "a metric row: name, unit, value", line));
            continue;
        }
        table_rows += 1;
        insert_metric(&mut kernel.metrics, name, metric_value(value, unit, section.clone(), style));
        metric_rows += 1;
    }
    let launches = data.ncu_kernels.len() - first;
    if launches > 0 {
        src.format = "ncu human-readable page (no --csv)".into();
        src.read.push(format!("{launches} kernel launches, {metric_rows} metric rows"));
    }
}

/// Counts what came before the CSV: profiler lines and the program's own output; keeps `==ERROR==` lines.
fn note_preamble(before: &[(usize, String)], src: &mut ProfileSource, what: &str) {
    let mut prof = 0;
    let mut app = 0;
    for (no, l) in before {
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        if t.starts_with("==ERROR==") {
            src.skipped.push(format!("line {no}: {}", excerpt(t)));
        }
        if t.starts_with("==") {
            prof += 1;
        } else {
            app += 1;
        }
    }
    if prof + app > 0 {
        src.skipped.push(format!(
            "before {what}: {prof} profiler line{} (`==PROF==` …), {app} line{} of program output",
            if prof == 1 { "" } else { "s" },
            if app == 1 { "" } else { "s" }
        ));
    }
}

/// Rows of a table body: `(line, cells)` of the lines that are CSV records; lines that are not (`==PROF==`,
/// program output printed after the table) are counted as skipped, unclosed quotes as malformed.
fn body_rows(body: &[(usize, String)], src: &mut ProfileSource) -> Vec<(usize, Vec<String>, String)> {
    let mut rows = Vec::new();
    let mut other = 0;
    for (no, l) in body {
        let t = l.trim();
        if t.is_empty() {
            continue;
        }
        if !t.starts_with('"') {
            other += 1;
            continue;
        }
        match split_csv(t) {
            Some(cells) => rows.push((*no, cells, l.clone())),
            None => src.malformed.push(bad(*no, "a CSV row (a quoted field is not closed)", l)),
        }
    }
    if other > 0 {
        src.skipped
            .push(format!("{other} non-CSV line{} inside or after the table", if other == 1 { "" } else { "s" }));
    }
    rows
}

fn bad(line: usize, expected: &str, found: &str) -> Malformed {
    Malformed { line, expected: expected.to_string(), found: excerpt(found) }
}

/// The launch a row belongs to; what is missing when the row cannot be used.
fn launch_id(cols: &Cols, cells: &[String], style: NumberStyle) -> Result<u64, String> {
    let n = cols.names.len();
    if cells.len() > n && cells[n..].iter().any(|c| !c.trim().is_empty()) {
        return Err(format!("at most {n} fields as in the header"));
    }
    let id = cols.get(cells, "ID").and_then(|s| style.u64(s)).ok_or("a launch number in `ID`")?;
    if cols.get(cells, "Kernel Name").is_none_or(str::is_empty) {
        return Err("a `Kernel Name`".into());
    }
    Ok(id)
}

/// A metric cell: a number in the table's style, or text (`n/a`, a device name).
fn metric_value(text: &str, unit: &str, section: Option<String>, style: NumberStyle) -> MetricValue {
    let text = text.trim().to_string();
    MetricValue {
        value: if is_none_cell(&text) { None } else { style.f64(&text) },
        unit: unit.trim().to_string(),
        text,
        section,
    }
}

/// Column positions by name.
struct Cols<'a> {
    names: &'a [String],
}

impl Cols<'_> {
    fn idx(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|c| c == name)
    }

    fn get<'c>(&self, cells: &'c [String], name: &str) -> Option<&'c str> {
        self.idx(name).and_then(|i| cells.get(i)).map(|s| s.trim())
    }

    fn nvtx_columns(&self) -> Vec<(usize, usize)> {
        // (column, position of the range name inside each quoted `domain:range:…` entry)
        self.names
            .iter()
            .enumerate()
            .filter(|(_, h)| is_nvtx_column(h))
            .map(|(i, h)| {
                let h = h.trim_start_matches("thread ");
                (i, h.split(':').position(|p| p.contains("Range")).unwrap_or(1))
            })
            .collect()
    }
}

/// The enclosing NVTX ranges of a launch from the `--nvtx` columns: `494  "<default domain>:setup:none:…" ` (push/pop,
/// after the thread id) and ` "0:<default domain>:convLayer:none:none" ` (start/end).
fn nvtx_ranges(cells: &[String], nvtx_cols: &[(usize, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    for &(col, pos) in nvtx_cols {
        let Some(v) = cells.get(col) else { continue };
        for (k, part) in v.split('"').enumerate() {
            if k % 2 == 1 {
                if let Some(name) = part.split(':').nth(pos).filter(|n| !n.is_empty()) {
                    out.push(name.to_string());
                }
            }
        }
    }
    out
}

/// A launch's identity from its first row.
fn new_kernel(cols: &Cols, cells: &[String], id: u64, line: usize, style: NumberStyle) -> NcuKernel {
    let text = |n: &str| cols.get(cells, n).unwrap_or("").to_string();
    let opt = |n: &str| cols.get(cells, n).filter(|s| !is_none_cell(s)).map(str::to_string);
    let num = |n: &str| cols.get(cells, n).and_then(|s| style.u64(s));
    NcuKernel {
        id,
        process_id: num("Process ID"),
        process: text("Process Name"),
        host: text("Host Name"),
        name: text("Kernel Name"),
        kernel_time: opt("Kernel Time"),
        device: cols.get(cells, "Device").and_then(|s| s.parse().ok()),
        cc: opt("CC"),
        context: num("Context"),
        stream: num("Stream"),
        block: cols.get(cells, "Block Size").and_then(parse_dim3),
        grid: cols.get(cells, "Grid Size").and_then(parse_dim3),
        nvtx: nvtx_ranges(cells, &cols.nvtx_columns()),
        metrics: BTreeMap::new(),
        rules: Vec::new(),
        line,
    }
}

fn header_generation(names: &[String]) -> String {
    let has = |n: &str| names.iter().any(|c| c == n);
    let mut parts = vec![if has("Kernel Time") {
        "ncu 2020-style header (Kernel Time)"
    } else if has("Block Size") || has("CC") {
        "ncu 2021+ header (Block/Grid Size, Device, CC)"
    } else {
        "header without launch columns"
    }];
    if names.iter().any(|c| is_nvtx_column(c)) {
        parts.push("NVTX columns");
    }
    if has("Rule Name") {
        parts.push("rule columns");
    }
    parts.join(", ")
}

fn read_details(
    names: &[String],
    header_line: usize,
    body: &[(usize, String)],
    data: &mut ProfileData,
    src: &mut ProfileSource,
) -> String {
    let cols = Cols { names };
    let rows = body_rows(body, src);
    let (mi, ui, vi) = (cols.idx("Metric Name"), cols.idx("Metric Unit"), cols.idx("Metric Value"));
    let values = rows.iter().filter_map(|(_, c, _)| vi.and_then(|i| c.get(i))).map(String::as_str);
    let speedups = rows.iter().filter_map(|(_, c, _)| cols.idx("Estimated Speedup").and_then(|i| c.get(i)));
    let style = NumberStyle::detect(values.chain(speedups.map(String::as_str)), []);
    let mut index: HashMap<(u64, Option<u64>), usize> = HashMap::new();
    let first_kernel = data.ncu_kernels.len();
    let (mut metric_rows, mut rule_rows) = (0usize, 0usize);
    for (line, cells, raw) in &rows {
        let id = match launch_id(&cols, cells, style) {
            Ok(id) => id,
            Err(expected) => {
                src.malformed.push(bad(*line, &expected, raw));
                continue;
            }
        };
        let pid = cols.get(cells, "Process ID").and_then(|s| style.u64(s));
        let metric = mi.and_then(|i| cells.get(i)).map(|s| s.trim()).filter(|s| !s.is_empty());
        let rule = cols.get(cells, "Rule Name").filter(|s| !s.is_empty());
        if metric.is_none() && rule.is_none() {
            src.malformed.push(bad(*line, "a `Metric Name` (or a `Rule Name`)", raw));
            continue;
        }
        let k = *index.entry((id, pid)).or_insert_with(|| {
            data.ncu_kernels.push(new_kernel(&cols, cells, id, *line, style));
            data.ncu_kernels.len() - 1
        });
        let kernel = &mut data.ncu_kernels[k];
        let section = cols.get(cells, "Section Name").filter(|s| !s.is_empty()).map(str::to_string);
        if let Some(name) = metric {
            let text = vi.and_then(|i| cells.get(i)).map_or("", String::as_str);
            let unit = ui.and_then(|i| cells.get(i)).map_or("", String::as_str);
            let value = metric_value(text, unit, section.clone(), style);
            insert_metric(&mut kernel.metrics, name, value);
            metric_rows += 1;
        }
        if let Some(rule) = rule {
            kernel.rules.push(NcuRule {
                section: section.unwrap_or_default(),
                name: rule.to_string(),
                kind: cols.get(cells, "Rule Type").unwrap_or("").to_string(),
                description: cols.get(cells, "Rule Description").unwrap_or("").to_string(),
                speedup_type: cols.get(cells, "Estimated Speedup Type").unwrap_or("").to_string(),
                speedup: cols.get(cells, "Estimated Speedup").and_then(|s| style.f64(s)),
            });
            rule_rows += 1;
        }
    }
    let launches = data.ncu_kernels.len() - first_kernel;
    src.read.push(format!(
        "ncu details page ({}{}): {launches} kernel launch{}, {metric_rows} metric row{}{} from line {header_line}",
        header_generation(names),
        if style.comma_decimal { ", comma decimals" } else { "" },
        if launches == 1 { "" } else { "es" },
        if metric_rows == 1 { "" } else { "s" },
        if rule_rows > 0 {
            format!(", {rule_rows} rule row{}", if rule_rows == 1 { "" } else { "s" })
        } else {
            String::new()
        },
    ));
    "ncu --csv details page".to_string()
}

/// Keeps the first value of a metric; a second one from another section goes under `Section: name`.
fn insert_metric(metrics: &mut BTreeMap<String, MetricValue>, name: &str, value: MetricValue) {
    match metrics.get(name) {
        None => {
            metrics.insert(name.to_string(), value);
        }
        Some(old) if old.section != value.section => {
            let key = format!("{}: {name}", value.section.as_deref().unwrap_or(""));
            metrics.entry(key).or_insert(value);
        }
        Some(_) => {}
    }
}

fn read_raw(
    names: &[String],
    header_line: usize,
    body: &[(usize, String)],
    data: &mut ProfileData,
    src: &mut ProfileSource,
) -> String {
    let cols = Cols { names };
    let mut rows = body_rows(body, src);
    // The units row: identity cells empty (`"","",…,"byte","%"`).
    let units: Vec<String> = match rows.first() {
        Some((_, cells, _)) if cells.first().is_some_and(|c| c.trim().is_empty()) => rows.remove(0).1,
        _ => {
            src.skipped.push("raw page without a units row: metric units unknown".into());
            Vec::new()
        }
    };
    let metric_cols: Vec<usize> =
        (0..names.len()).filter(|&i| !IDENTITY.contains(&names[i].as_str()) && !is_nvtx_column(&names[i])).collect();
    let values = rows.iter().flat_map(|(_, c, _)| metric_cols.iter().filter_map(|&i| c.get(i))).map(String::as_str);
    let style = NumberStyle::detect(values, []);
    let mut launches = 0;
    for (line, cells, raw) in &rows {
        let id = match launch_id(&cols, cells, style) {
            Ok(id) => id,
            Err(expected) => {
                src.malformed.push(bad(*line, &expected, raw));
                continue;
            }
        };
        let mut k = new_kernel(&cols, cells, id, *line, style);
        for &i in &metric_cols {
            let Some(text) = cells.get(i).filter(|s| !s.trim().is_empty()) else { continue };
            let value = metric_value(text, units.get(i).map_or("", String::as_str), None, style);
            k.metrics.insert(names[i].clone(), value);
        }
        data.ncu_kernels.push(k);
        launches += 1;
    }
    src.read.push(format!(
        "ncu raw page ({}{}): {launches} kernel launch{}, {} metric columns from line {header_line}",
        header_generation(names),
        if style.comma_decimal { ", comma decimals" } else { "" },
        if launches == 1 { "" } else { "es" },
        metric_cols.len(),
    ));
    "ncu --csv --page raw".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvtx_cells() {
        let names: Vec<String> = [
            "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",
            "Id:Domain:Start/Stop_Range:PL_Type:PL_Value",
        ]
        .map(String::from)
        .to_vec();
        let cols = Cols { names: &names };
        let cells = vec![
            "494  \"<default domain>:setup:none:none:none:none:none:none\" ".to_string(),
            " \"0:<default domain>:convLayer:none:none\" ".to_string(),
        ];
        assert_eq!(nvtx_ranges(&cells, &cols.nvtx_columns()), vec!["setup", "convLayer"]);
    }
}
