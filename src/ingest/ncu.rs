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
use crate::timeline::profile::{MetricValue, NcuKernel, NcuRule, ProfileData, ProfileSource};
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
    text::lines(text).any(|(_, l)| header_cells(&l).is_some())
}

/// Reads one `ncu --csv` output (a file or a captured stdout). `name_hint` names the source in bookkeeping.
pub fn parse(text: &str, name_hint: Option<&str>) -> Result<ProfileData, String> {
    let lines: Vec<(usize, String)> = text::lines(text).collect();
    let mut src = ProfileSource { name: name_hint.unwrap_or("<input>").to_string(), ..ProfileSource::default() };
    let headers: Vec<usize> =
        lines.iter().enumerate().filter(|(_, (_, l))| header_cells(l).is_some()).map(|(i, _)| i).collect();
    let mut data = ProfileData::default();
    let before = &lines[..headers.first().copied().unwrap_or(lines.len())];
    note_preamble(before, &mut src);
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
        return Err(format!(
            "not an Nsight Compute CSV: looked for a header row starting `\"ID\",\"Process ID\",…` with a \
             `\"Kernel Name\"` column (details page: `…,\"Metric Name\",\"Metric Unit\",\"Metric Value\"`; raw page: \
             one column per metric and a row of units), after any `==PROF==` lines and program output; found {}",
            if human {
                "ncu's human-readable output (`Section:` blocks): run ncu with --csv".to_string()
            } else if profiler {
                "ncu's `==PROF==` lines but no CSV table (was --csv given?)".to_string()
            } else if first.is_empty() {
                "an empty text".to_string()
            } else {
                format!("text starting {:?}", excerpt(first))
            }
        ));
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

/// Counts what came before the CSV: profiler lines and the program's own output; keeps `==ERROR==` lines.
fn note_preamble(before: &[(usize, String)], src: &mut ProfileSource) {
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
            "before the CSV: {prof} profiler line{} (`==PROF==` …), {app} line{} of program output",
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
