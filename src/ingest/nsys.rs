//! Nsight Systems `nsys stats` reports: CSV files (`<base>_<report>.csv`), and console captures that hold several
//! reports (`nsys stats` / `nsys profile --stats=true` output, CSV or column layout, with `Processing […]` or
//! `Executing '…' stats report` lines between them).
//!
//! Reports are recognised by their header row, in both name generations (`gpukernsum`… before 2023.1,
//! `cuda_gpu_kern_sum`… after); the file name or the console's preamble only settles what a header cannot (CUDA API
//! and OS runtime summaries share one header). Empty reports (0-byte files, `SKIPPED:` lines) are "no data", not
//! errors. Numbers may carry thousands separators (`1,602,579,192`, 2023+ console) or a comma decimal
//! (`"482,333"` in a comma-decimal locale); sizes are decimal MB (10^6 B), times follow the header's unit.
//!
//! The CSV and number helpers here are shared with `ingest::ncu`.

use std::path::Path;

use super::text;
use crate::timeline::profile::{
    ApiSummary, CombinedSummary, Dim3, GpuOp, GpuOpKind, KernelSummary, MemOpSummary, NvtxKernelSummary, NvtxSummary,
    ProfileData, ProfileSource, SizeStats, TimeStats,
};
use crate::timeline::Malformed;

// ---------------------------------------------------------------------------------------------------------------
// CSV and numbers (shared with ncu)

/// Splits one CSV line (RFC 4180 quoting: `"a ""b"", c"` is one field), with the csv crate's core. `None` when a
/// quote is left open (the record goes on past the line, or the line was cut): quotes come in pairs in a line that
/// holds whole records.
pub(crate) fn split_csv(line: &str) -> Option<Vec<String>> {
    if line.bytes().filter(|&b| b == b'"').count() % 2 == 1 {
        return None;
    }
    thread_local! {
        // Building a reader compiles its state machine, which costs more than reading a line: keep one.
        static READER: std::cell::RefCell<csv_core::Reader> = std::cell::RefCell::new(csv_core::Reader::new());
    }
    READER.with(|r| {
        let mut r = r.borrow_mut();
        r.reset();
        split_with(&mut r, line)
    })
}

fn split_with(reader: &mut csv_core::Reader, line: &str) -> Option<Vec<String>> {
    // A record has at most one field more than it has commas, and its fields are no longer than the line.
    let mut out = vec![0u8; line.len() + 1];
    let mut ends = vec![0usize; line.bytes().filter(|&b| b == b',').count() + 2];
    let (mut input, mut nout, mut nend) = (line.as_bytes(), 0, 0);
    loop {
        let (res, nin, o, e) = reader.read_record(input, &mut out[nout..], &mut ends[nend..]);
        input = &input[nin..];
        nout += o;
        nend += e;
        match res {
            csv_core::ReadRecordResult::InputEmpty => {}
            csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
            // The buffers hold the whole line: a field can only shrink.
            csv_core::ReadRecordResult::OutputFull | csv_core::ReadRecordResult::OutputEndsFull => return None,
        }
    }
    let mut fields = Vec::with_capacity(nend.max(1));
    let mut start = 0;
    for &end in &ends[..nend] {
        // A field's offset is relative to the record's output.
        let end = end.min(nout);
        fields.push(String::from_utf8_lossy(&out[start..end]).into_owned());
        start = end;
    }
    if fields.is_empty() {
        fields.push(String::new());
    }
    Some(fields)
}

/// How a table writes numbers: `1,234.5` (period decimal, comma grouping) or `1.234,5` (comma decimal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct NumberStyle {
    pub comma_decimal: bool,
}

impl NumberStyle {
    /// Decides from a table's numeric cells, by counting the values only one style can have. Comma decimal:
    /// a period before the last comma (`1.234,5`), several periods (`27.595.520`), one comma not followed by
    /// exactly three digits (`0,5`). Period decimal: the mirror images (`1,234.5`, `1,234,567`, `2.45`). A lone
    /// separator followed by three digits (`8,192`, `67.109`) says nothing. With no evidence either way, `fractional`
    /// cells (columns the tool always prints with decimals) holding a comma and no period mean comma decimal.
    pub fn detect<'a>(cells: impl IntoIterator<Item = &'a str>, fractional: impl IntoIterator<Item = &'a str>) -> Self {
        let numeric = |s: &str| {
            let s = s.trim().trim_start_matches('-');
            s.starts_with(|c: char| c.is_ascii_digit()) && s.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '.')
        };
        let (mut comma, mut period) = (0usize, 0usize);
        for s in cells.into_iter().map(str::trim).filter(|s| numeric(s)) {
            let (commas, periods) = (s.matches(',').count(), s.matches('.').count());
            let three_after = |i: usize| s.len() - i - 1 == 3;
            match (s.rfind(','), s.rfind('.')) {
                (Some(c), Some(d)) if d < c => comma += 1,
                (Some(_), Some(_)) => period += 1,
                (None, Some(_)) if periods > 1 => comma += 1,
                (None, Some(d)) if !three_after(d) => period += 1,
                (Some(_), None) if commas > 1 => period += 1,
                (Some(c), None) if !three_after(c) => comma += 1,
                _ => {}
            }
        }
        if comma == 0 && period == 0 {
            let frac = fractional.into_iter().map(str::trim).any(|s| numeric(s) && s.contains(',') && !s.contains('.'));
            return NumberStyle { comma_decimal: frac };
        }
        NumberStyle { comma_decimal: comma > period }
    }

    /// The text with grouping removed and a period decimal, ready for `text::parse_decimal`; keeps a leading `-`.
    pub fn normalise(self, s: &str) -> String {
        let s = s.trim();
        if self.comma_decimal {
            s.chars().filter(|&c| c != '.').map(|c| if c == ',' { '.' } else { c }).collect()
        } else {
            s.chars().filter(|&c| c != ',').collect()
        }
    }

    /// A number (negative allowed).
    pub fn f64(self, s: &str) -> Option<f64> {
        let n = self.normalise(s);
        match n.strip_prefix('-') {
            Some(rest) => text::parse_f64(rest).map(|v| -v),
            None => text::parse_f64(&n),
        }
    }

    /// A non-negative integer, exactly; a fractional value is rounded.
    pub fn u64(self, s: &str) -> Option<u64> {
        let (m, d) = text::parse_decimal(&self.normalise(s))?;
        let den = 10u128.checked_pow(d)?;
        u64::try_from((m + den / 2) / den).ok()
    }

    /// A duration in `unit` (`ns`, `us`, `ms`, `s`) as whole nanoseconds, exactly.
    pub fn ns(self, s: &str, unit: TimeUnit) -> Option<u64> {
        let (m, d) = text::parse_decimal(&self.normalise(s))?;
        let den = 10u128.checked_pow(d)?;
        let num = m.checked_mul(unit.ns_per_unit())?;
        u64::try_from((num + den / 2) / den).ok()
    }

    /// A size in `unit` (`MB`, `KB`, `B` … as `text::unit_scale` knows them) as bytes.
    pub fn bytes(self, s: &str, unit: &str) -> Option<u64> {
        text::parse_size(&self.normalise(s), unit)
    }
}

/// The time unit of an nsys column (`--timeunit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeUnit {
    Ns,
    Us,
    Ms,
    S,
}

impl TimeUnit {
    fn parse(unit: &str) -> Option<TimeUnit> {
        Some(match unit {
            "ns" | "nsec" => TimeUnit::Ns,
            "us" | "usec" | "μs" | "µs" => TimeUnit::Us,
            "ms" | "msec" => TimeUnit::Ms,
            "s" | "sec" => TimeUnit::S,
            _ => return None,
        })
    }

    fn ns_per_unit(self) -> u128 {
        match self {
            TimeUnit::Ns => 1,
            TimeUnit::Us => 1_000,
            TimeUnit::Ms => 1_000_000,
            TimeUnit::S => 1_000_000_000,
        }
    }
}

/// `(384, 1, 1)`, ` 512    4    1` → `Dim3`.
pub(crate) fn parse_dim3(s: &str) -> Option<Dim3> {
    let nums: Vec<u64> = s
        .split(|c: char| c == ',' || c == '(' || c == ')' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    match nums[..] {
        [x, y, z] => Some(Dim3 { x, y, z }),
        _ => None,
    }
}

/// A cell that says "nothing here": empty, `None` (nsys 2022.4 gputrace), `n/a`.
pub(crate) fn is_none_cell(s: &str) -> bool {
    matches!(s.trim(), "" | "None" | "n/a" | "N/A" | "-")
}

/// Keeps a short, printable excerpt of a line for error messages.
pub(crate) fn excerpt(s: &str) -> String {
    let t: String = s.trim().chars().take(80).collect();
    if s.trim().chars().count() > 80 {
        format!("{t}…")
    } else {
        t
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Report names and headers

/// What a report is, whatever its generation's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Report {
    ApiSum,
    OsrtSum,
    KernSum,
    MemSizeSum,
    MemTimeSum,
    GpuSum,
    GpuTrace,
    NvtxSum,
    NvtxKernSum,
    /// Known to nsys, not read by oomdoc (kernexecsum, um_sum, …).
    Unused,
}

impl Report {
    fn describe(self) -> &'static str {
        match self {
            Report::ApiSum => "CUDA API summary",
            Report::OsrtSum => "OS runtime summary",
            Report::KernSum => "CUDA kernel summary",
            Report::MemSizeSum => "memory operations by size",
            Report::MemTimeSum => "memory operations by time",
            Report::GpuSum => "combined GPU/API summary",
            Report::GpuTrace => "CUDA GPU trace",
            Report::NvtxSum => "NVTX range summary",
            Report::NvtxKernSum => "kernels per NVTX range",
            Report::Unused => "report not used by oomdoc",
        }
    }
}

/// Report names of both generations (≤ 2022.x, 2023.1+), longest first where one is a suffix of another.
const REPORT_NAMES: &[(&str, Report)] = &[
    ("cuda_api_gpu_sum", Report::GpuSum),
    ("cuda_gpu_kern_gb_sum", Report::KernSum),
    ("cuda_gpu_kern_sum", Report::KernSum),
    ("cuda_gpu_mem_size_sum", Report::MemSizeSum),
    ("cuda_gpu_mem_time_sum", Report::MemTimeSum),
    ("cuda_gpu_trace", Report::GpuTrace),
    ("cuda_gpu_sum", Report::GpuSum),
    ("cuda_api_sum", Report::ApiSum),
    ("cuda_api_trace", Report::Unused),
    ("cuda_kern_exec_sum", Report::Unused),
    ("cuda_kern_exec_trace", Report::Unused),
    ("nvtx_kern_sum", Report::NvtxKernSum),
    ("nvtx_pushpop_sum", Report::NvtxSum),
    ("nvtx_startend_sum", Report::NvtxSum),
    ("nvtx_pushpop_trace", Report::Unused),
    ("nvtx_gpu_proj_sum", Report::Unused),
    ("nvtx_gpu_proj_trace", Report::Unused),
    ("nvtx_sum", Report::NvtxSum),
    ("osrt_sum", Report::OsrtSum),
    ("um_total_sum", Report::Unused),
    ("um_cpu_page_faults_sum", Report::Unused),
    ("um_sum", Report::Unused),
    ("wddm_queue_sum", Report::Unused),
    ("apigpusum", Report::GpuSum),
    ("cudaapisum", Report::ApiSum),
    ("cudaapitrace", Report::Unused),
    ("gpukernsum", Report::KernSum),
    ("gpumemsizesum", Report::MemSizeSum),
    ("gpumemtimesum", Report::MemTimeSum),
    ("gpusum", Report::GpuSum),
    ("gputrace", Report::GpuTrace),
    ("kernexecsum", Report::Unused),
    ("kernexectrace", Report::Unused),
    ("nvtxkernsum", Report::NvtxKernSum),
    ("nvtxppsum", Report::NvtxSum),
    ("nvtxpptrace", Report::Unused),
    ("nvtxsesum", Report::NvtxSum),
    ("nvtxgpuproj", Report::Unused),
    ("nvtxsum", Report::NvtxSum),
    ("osrtsum", Report::OsrtSum),
    ("unifiedmemorytotals", Report::Unused),
    ("unifiedmemory", Report::Unused),
    ("umcpupagefaults", Report::Unused),
    ("wddmqueuesdetails", Report::Unused),
    ("openmpevtsum", Report::Unused),
    ("khrdebugsum", Report::Unused),
    ("khrdebuggpusum", Report::Unused),
    ("vulkanmarkerssum", Report::Unused),
    ("vulkangpumarkersum", Report::Unused),
    ("dx11pixsum", Report::Unused),
    ("dx12gpumarkersum", Report::Unused),
    ("dx12pixsum", Report::Unused),
    ("openaccsum", Report::Unused),
];

/// The report a name names: a file name `<base>_<report>[_args].csv`, a script path `…/reports/gpukernsum.py`, or a
/// bare report name (`cuda_gpu_kern_sum:base`). Returns the report's own name too.
fn report_from_name(name: &str) -> Option<(&'static str, Report)> {
    let file = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let stem = file.strip_suffix(".csv").or_else(|| file.strip_suffix(".py")).unwrap_or(file);
    let stem = stem.split(':').next().unwrap_or(stem);
    // The longest report name that is the stem, ends it after `_`, or is followed by `_` / `:` (report args).
    REPORT_NAMES
        .iter()
        .filter(|(r, _)| {
            stem == *r
                || stem.ends_with(&format!("_{r}"))
                || stem.starts_with(&format!("{r}_"))
                || stem.contains(&format!("_{r}_"))
        })
        .max_by_key(|(r, _)| r.len())
        .map(|&(r, k)| (r, k))
}

/// Whether a file name is one `nsys stats --output` writes (`<base>_<report>.csv`): recognises the empty report
/// files nsys leaves when a report has no data.
pub fn is_report_file_name(name: &str) -> bool {
    name.ends_with(".csv") && report_from_name(name).is_some()
}

/// A header cell: its label (`Total Time`) and the unit in its trailing parentheses (`ns`).
#[derive(Clone, Debug)]
struct Col {
    label: String,
    unit: Option<String>,
}

fn split_header_cell(cell: &str) -> Col {
    let c = cell.trim();
    if let (Some(open), true) = (c.rfind('('), c.ends_with(')')) {
        let label = c[..open].trim();
        if !label.is_empty() {
            return Col { label: canon_label(label), unit: Some(c[open + 1..c.len() - 1].trim().to_string()) };
        }
    }
    Col { label: canon_label(c), unit: None }
}

/// One spelling per label across generations: `Average` → `avg`, `Num Calls`/`Calls` → `calls` …
fn canon_label(l: &str) -> String {
    let lower = l.to_ascii_lowercase();
    let l = lower.split_whitespace().collect::<Vec<_>>().join(" ");
    match l.as_str() {
        "average" | "avg" => "avg",
        "median" | "med" => "med",
        "minimum" | "min" => "min",
        "maximum" | "max" => "max",
        "stddev" | "std dev" | "stdev" => "stddev",
        "num calls" | "calls" => "calls",
        "count" | "operations" | "num ops" => "count",
        "instances" | "num instances" => "instances",
        other => return other.to_string(),
    }
    .to_string()
}

/// A recognised header: the report and where its columns are.
#[derive(Clone, Debug)]
struct Header {
    report: Report,
    cols: Vec<Col>,
}

impl Header {
    fn idx(&self, label: &str) -> Option<usize> {
        self.cols.iter().position(|c| c.label == label)
    }

    fn unit(&self, label: &str) -> Option<&str> {
        self.idx(label).and_then(|i| self.cols[i].unit.as_deref())
    }
}

/// Recognises a report by its header cells.
fn classify_header(cells: &[String]) -> Option<Header> {
    if cells.len() < 3 {
        return None;
    }
    let cols: Vec<Col> = cells.iter().map(|c| split_header_cell(c)).collect();
    let has = |l: &str| cols.iter().any(|c| c.label == l);
    let report = if has("start") && has("duration") && has("name") && (has("corrid") || has("strm")) {
        Report::GpuTrace
    } else if has("category") && has("operation") && has("total time") {
        Report::GpuSum
    } else if has("operation") && has("total") && has("count") {
        Report::MemSizeSum
    } else if has("operation") && has("total time") && has("count") {
        Report::MemTimeSum
    } else if has("nvtx range") && has("kernel name") {
        Report::NvtxKernSum
    } else if has("range") && has("style") && has("total time") {
        Report::NvtxSum
    } else if has("name") && has("instances") && has("total time") {
        Report::KernSum
    } else if has("name") && has("calls") && has("total time") {
        Report::ApiSum
    } else if (has("kernel name") && has("api name")) || has("qcount") {
        Report::Unused
    } else {
        return None;
    };
    Some(Header { report, cols })
}

// ---------------------------------------------------------------------------------------------------------------
// Finding tables in text

/// Whether the text holds anything this reader knows: an nsys stats header row (CSV or console column layout),
/// or the console's `Processing […]` / `Executing '…' stats report` lines.
pub fn sniff(text: &str) -> bool {
    let lines: Vec<String> = text::lines(text).take(20_000).map(|(_, l)| l).collect();
    lines.iter().enumerate().any(|(i, l)| {
        preamble_hint(l).is_some()
            || (l.trim_start().starts_with("SKIPPED:") && l.contains("does not contain"))
            || split_csv(l).and_then(|c| classify_header(&c)).is_some()
            || lines.get(i + 1).is_some_and(|next| column_header(l, next).is_some())
    })
}

/// The report a console preamble or heading line names: `Processing [x.sqlite] with [/…/reports/gpumemsizesum.py]...`,
/// `[5/8] Executing 'cuda_api_sum' stats report`, ` ** CUDA API Summary (cudaapisum):`.
fn preamble_hint(line: &str) -> Option<String> {
    let l = line.trim();
    if l.starts_with("Processing [") {
        let script = l.rsplit_once(" with [").map(|(_, s)| s)?;
        let script = script.split(']').next()?;
        return Some(report_from_name(script).map_or_else(|| script.to_string(), |(r, _)| r.to_string()));
    }
    if let Some(i) = l.find("Executing '") {
        let rest = &l[i + "Executing '".len()..];
        return rest.split('\'').next().map(str::to_string);
    }
    if l.starts_with("** ") && l.ends_with("):") {
        let open = l.rfind('(')?;
        return Some(l[open + 1..l.len() - 2].to_string());
    }
    None
}

/// Column spans of a console table's dashed underline (` --------  -----  …`), in chars.
fn column_spans(line: &str) -> Option<Vec<(usize, usize)>> {
    let chars: Vec<char> = line.chars().collect();
    if chars.iter().any(|&c| c != '-' && c != ' ') || !chars.contains(&'-') {
        return None;
    }
    let mut spans = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '-' {
            let s = i;
            while i < chars.len() && chars[i] == '-' {
                i += 1;
            }
            spans.push((s, i));
        } else {
            i += 1;
        }
    }
    (spans.len() >= 3).then_some(spans)
}

/// Cuts a console line into the cells under `spans`; the last cell runs to the end of the line.
fn cut_columns(line: &str, spans: &[(usize, usize)]) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let n = spans.len();
    spans
        .iter()
        .enumerate()
        .map(|(i, &(s, e))| {
            let end = if i + 1 == n { chars.len() } else { e.min(chars.len()) };
            let s = s.min(end);
            chars[s..end].iter().collect::<String>().trim().to_string()
        })
        .collect()
}

fn column_header(header: &str, dashes: &str) -> Option<Header> {
    let spans = column_spans(dashes)?;
    classify_header(&cut_columns(header, &spans))
}

/// A table found in the text.
struct Table {
    header: Header,
    /// The line of the header.
    line: usize,
    /// `(line, cells)` of each data row; `None` cells when the row could not be cut (open quote).
    rows: Vec<(usize, Option<Vec<String>>, String)>,
    column_layout: bool,
    hint: Option<String>,
}

/// Why `nsys stats` output could not be read (one line, without the path of the file given).
#[derive(Debug, thiserror::Error)]
pub enum NsysError {
    /// A report file of a directory could not be read.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// Not an `nsys stats` report.
    #[error("{0}")]
    Format(String),
}

impl From<String> for NsysError {
    fn from(message: String) -> NsysError {
        NsysError::Format(message)
    }
}

/// Reads one `nsys stats` output: a CSV report file, or a console capture holding several reports. `name_hint` is
/// the file name (`run_cuda_gpu_kern_sum.csv`), used only where the header row cannot tell (the CUDA API and the
/// OS runtime summaries share one header). An empty text is an empty report, not an error. A capture's several
/// report files go through [`parse_files`] or [`read_dir`], which join them before filling in what only the
/// combined reports (`gpusum`, `apigpusum`) hold; merging single-file results would count those rows twice.
pub fn parse(text: &str, name_hint: Option<&str>) -> Result<ProfileData, NsysError> {
    let mut data = parse_unfinished(text, name_hint)?;
    data.fill_from_combined();
    Ok(data)
}

/// Reads several sibling report files (`<base>_<report>.csv`, as `nsys stats --format csv --output <base>` writes
/// them) into one profile: `(file name, text)` pairs. Fails only when no file is an nsys report at all.
pub fn parse_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<ProfileData, NsysError> {
    let mut data = ProfileData::default();
    let mut errors = Vec::new();
    let mut any = false;
    for (name, text) in files {
        match parse_unfinished(text, Some(name)) {
            Ok(d) => {
                any = true;
                data.merge(d);
            }
            Err(e) => {
                errors.push(format!("{name}: {e}"));
                data.sources.push(ProfileSource {
                    name: name.to_string(),
                    format: "not an nsys stats report".into(),
                    skipped: vec![e.to_string()],
                    ..ProfileSource::default()
                });
            }
        }
    }
    if !any {
        return Err((if errors.is_empty() {
            "no report files: expected the `*.csv` files `nsys stats --format csv --output` writes (or `*.txt` \
             console captures)"
                .to_string()
        } else {
            errors.join("; ")
        })
        .into());
    }
    data.fill_from_combined();
    Ok(data)
}

/// Reads the report files of a directory (sorted by name) as in [`parse_files`]: the `*.csv` files that
/// `nsys stats --format csv --output` writes, or, when there are none, the `*.txt` console captures. (A console
/// capture repeats the CSV files' reports: reading both would count everything twice.)
pub fn read_dir(dir: &Path) -> Result<ProfileData, NsysError> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| NsysError::Io { path, source }
    };
    let files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    let with_ext = |ext: &str| -> Vec<std::path::PathBuf> {
        files.iter().filter(|p| p.extension().is_some_and(|x| x == ext)).cloned().collect()
    };
    let mut paths = with_ext("csv");
    if paths.is_empty() {
        paths = with_ext("txt");
    }
    paths.sort();
    let mut texts = Vec::new();
    for p in &paths {
        let bytes = std::fs::read(p).map_err(io(p))?;
        let name = p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned());
        texts.push((name, String::from_utf8_lossy(&bytes).into_owned()));
    }
    parse_files(texts.iter().map(|(n, t)| (n.as_str(), t.as_str())))
}

fn parse_unfinished(text: &str, name_hint: Option<&str>) -> Result<ProfileData, NsysError> {
    let name = name_hint.unwrap_or("<input>").to_string();
    let file_report = name_hint.and_then(report_from_name);
    let mut source = ProfileSource { name: name.clone(), ..ProfileSource::default() };
    let mut data = ProfileData::default();
    if text.trim().is_empty() {
        source.format = "nsys stats".into();
        let what = file_report.map_or_else(|| "report".to_string(), |(r, _)| r.to_string());
        source.skipped.push(format!("{what}: empty (no data; nsys leaves a 0-byte file when a report has none)"));
        data.sources.push(source);
        return Ok(data);
    }
    let lines: Vec<(usize, String)> = text::lines(text).collect();
    let (tables, skipped, console) = find_tables(&lines);
    source.skipped.extend(skipped);
    if tables.is_empty() && source.skipped.is_empty() && !console {
        if let Some((r, Report::Unused)) = file_report {
            source.format = "nsys stats CSV".into();
            source.skipped.push(format!("{r} ({})", Report::Unused.describe()));
            data.sources.push(source);
            return Ok(data);
        }
        let first = lines.iter().map(|(_, l)| l.trim()).find(|l| !l.is_empty()).unwrap_or("");
        return Err((format!(
            "not an Nsight Systems stats report: looked for an `nsys stats` header row (e.g. `Time (%),Total Time \
             (ns),Instances,Avg (ns),…,Name`, `Start (ns),Duration (ns),CorrId,…`, `Total (MB),Count,…,Operation`) \
             in CSV or console column layout, and for `Processing [...]` / `Executing '…' stats report` lines; \
             found text starting {:?}",
            excerpt(first)
        ))
        .into());
    }
    if tables.is_empty() && source.skipped.is_empty() {
        source.skipped.push("console capture without any report table".into());
    }
    let mut new_names = false;
    let mut old_names = false;
    for t in tables {
        let hinted = t.hint.as_deref().and_then(report_from_name).or(if console { None } else { file_report });
        if let Some((r, _)) = hinted {
            if r.contains('_') {
                new_names = true;
            } else {
                old_names = true;
            }
        }
        read_table(&t, hinted, &mut data, &mut source);
    }
    source.format = format!(
        "nsys stats {}{}",
        if console { "console capture" } else { "CSV" },
        match (old_names, new_names) {
            (true, false) => " (report names before 2023.1)",
            (false, true) => " (report names 2023.1+)",
            (true, true) => " (report names of both generations)",
            _ => "",
        }
    );
    data.sources.push(source);
    Ok(data)
}

/// Finds every table: CSV headers and console column headers (a header line over a dashed line). Returns the
/// tables, what was skipped (`SKIPPED:` lines), and whether the text is a console capture (several reports with
/// preamble lines).
fn find_tables(lines: &[(usize, String)]) -> (Vec<Table>, Vec<String>, bool) {
    let mut tables = Vec::new();
    let mut skipped = Vec::new();
    let mut hint: Option<String> = None;
    let mut console = false;
    let mut i = 0;
    while i < lines.len() {
        let (no, l) = (&lines[i].0, lines[i].1.as_str());
        if let Some(h) = preamble_hint(l) {
            console = true;
            hint = Some(h);
            i += 1;
            continue;
        }
        if let Some(rest) = l.trim().strip_prefix("SKIPPED:") {
            let what = hint.take().unwrap_or_else(|| "report".to_string());
            skipped.push(format!("{what}: SKIPPED:{rest} (line {no})"));
            i += 1;
            continue;
        }
        // Console column layout: a header line over a dashed line.
        if let Some(next) = lines.get(i + 1) {
            if let (Some(spans), Some(header)) = (column_spans(&next.1), column_header(l, &next.1)) {
                let mut rows = Vec::new();
                let mut j = i + 2;
                while j < lines.len() && !lines[j].1.trim().is_empty() && preamble_hint(&lines[j].1).is_none() {
                    rows.push((lines[j].0, Some(cut_columns(&lines[j].1, &spans)), lines[j].1.clone()));
                    j += 1;
                }
                tables.push(Table { header, line: *no, rows, column_layout: true, hint: hint.take() });
                i = j;
                continue;
            }
        }
        if let Some(header) = split_csv(l).and_then(|c| classify_header(&c)) {
            let mut rows = Vec::new();
            let mut j = i + 1;
            while j < lines.len() && !lines[j].1.trim().is_empty() && preamble_hint(&lines[j].1).is_none() {
                rows.push((lines[j].0, split_csv(&lines[j].1), lines[j].1.clone()));
                j += 1;
            }
            tables.push(Table { header, line: *no, rows, column_layout: false, hint: hint.take() });
            i = j;
            continue;
        }
        i += 1;
    }
    (tables, skipped, console)
}

// ---------------------------------------------------------------------------------------------------------------
// Reading rows

/// Fractional columns (nsys always prints decimals there): a comma in them and no period is a comma decimal.
const FRACTIONAL: [&str; 4] = ["avg", "med", "stddev", "time"];

fn read_table(t: &Table, hinted: Option<(&'static str, Report)>, data: &mut ProfileData, src: &mut ProfileSource) {
    let h = &t.header;
    let mut report = h.report;
    // The API and OS runtime summaries share a header: the name settles it, else the rows' names do.
    if report == Report::ApiSum {
        report = match hinted.map(|(_, r)| r) {
            Some(Report::OsrtSum) => Report::OsrtSum,
            Some(Report::ApiSum) => Report::ApiSum,
            _ => api_or_osrt(t),
        };
    }
    let name = hinted.filter(|(_, r)| *r == report).map_or_else(|| report_label(report), |(n, _)| n.to_string());
    if report == Report::Unused {
        src.skipped.push(format!("{name} ({}): header at line {}, {} rows", report.describe(), t.line, t.rows.len()));
        return;
    }
    let ncols = h.cols.len();
    let good: Vec<&(usize, Option<Vec<String>>, String)> =
        t.rows.iter().filter(|(_, c, _)| c.as_ref().is_some_and(|c| c.len() == ncols)).collect();
    let all_cells = good.iter().flat_map(|(_, c, _)| c.as_deref().unwrap_or(&[]).iter().map(String::as_str));
    let frac_idx: Vec<usize> = h
        .cols
        .iter()
        .enumerate()
        .filter(|(_, c)| FRACTIONAL.contains(&c.label.as_str()) || c.unit.as_deref() == Some("MB"))
        .map(|(i, _)| i)
        .collect();
    let frac_cells = good
        .iter()
        .flat_map(|(_, c, _)| frac_idx.iter().filter_map(|&i| c.as_ref().and_then(|c| c.get(i))))
        .map(|s| s.as_str());
    let style = NumberStyle::detect(all_cells, frac_cells);
    let reader = RowReader { h, style };
    let mut read = 0usize;
    for (line, cells, raw) in &t.rows {
        let Some(cells) = cells else {
            src.malformed.push(bad(*line, "a CSV row (a quoted field is not closed)", raw));
            continue;
        };
        if cells.len() != ncols {
            src.malformed.push(bad(*line, &format!("{ncols} fields as in the header at line {}", t.line), raw));
            continue;
        }
        let ok =
            match report {
                Report::ApiSum | Report::OsrtSum => reader.api(cells).map(|a| {
                    if report == Report::ApiSum {
                        data.api.push(a)
                    } else {
                        data.os_runtime.push(a)
                    }
                }),
                Report::KernSum => reader.kernel(cells).map(|k| data.kernels.push(k)),
                Report::MemSizeSum => reader.mem_size(cells).map(|m| data.add_mem_op(m)),
                Report::MemTimeSum => reader.mem_time(cells).map(|m| data.add_mem_op(m)),
                Report::GpuSum => reader.combined(cells).map(|c| data.combined.push(c)),
                Report::GpuTrace => reader.trace(cells, *line).map(|o| data.gpu_trace.push(o)),
                Report::NvtxSum => reader.nvtx(cells).map(|n| data.nvtx_ranges.push(n)),
                Report::NvtxKernSum => reader.nvtx_kernel(cells).map(|n| data.nvtx_kernels.push(n)),
                Report::Unused => Err(String::new()),
            };
        match ok {
            Ok(()) => read += 1,
            Err(expected) => src.malformed.push(bad(*line, &expected, raw)),
        }
    }
    src.read.push(format!(
        "{name} ({}{}{}): {read} row{} from line {}",
        report.describe(),
        if t.column_layout { ", console columns" } else { "" },
        if style.comma_decimal { ", comma decimals" } else { "" },
        if read == 1 { "" } else { "s" },
        t.line
    ));
}

fn report_label(r: Report) -> String {
    match r {
        Report::ApiSum => "cuda_api_sum",
        Report::OsrtSum => "osrt_sum",
        Report::KernSum => "cuda_gpu_kern_sum",
        Report::MemSizeSum => "cuda_gpu_mem_size_sum",
        Report::MemTimeSum => "cuda_gpu_mem_time_sum",
        Report::GpuSum => "cuda_gpu_sum",
        Report::GpuTrace => "cuda_gpu_trace",
        Report::NvtxSum => "nvtx_sum",
        Report::NvtxKernSum => "nvtx_kern_sum",
        Report::Unused => "unused report",
    }
    .to_string()
}

/// With no name to go by: CUDA API names start with `cuda`/`cu` + upper case (`cuInit`, `cuGetProcAddress`).
fn api_or_osrt(t: &Table) -> Report {
    let Some(ni) = t.header.idx("name") else { return Report::ApiSum };
    let names: Vec<&str> =
        t.rows.iter().filter_map(|(_, c, _)| c.as_ref().and_then(|c| c.get(ni))).map(String::as_str).collect();
    let cuda = names
        .iter()
        .filter(|n| {
            n.starts_with("cuda") || (n.starts_with("cu") && n[2..].starts_with(|c: char| c.is_ascii_uppercase()))
        })
        .count();
    if names.is_empty() || cuda * 2 >= names.len() {
        Report::ApiSum
    } else {
        Report::OsrtSum
    }
}

fn bad(line: usize, expected: &str, found: &str) -> Malformed {
    Malformed { line, expected: expected.to_string(), found: excerpt(found) }
}

struct RowReader<'a> {
    h: &'a Header,
    style: NumberStyle,
}

impl RowReader<'_> {
    fn cell<'c>(&self, cells: &'c [String], label: &str) -> Option<&'c str> {
        self.h.idx(label).and_then(|i| cells.get(i)).map(String::as_str)
    }

    fn text(&self, cells: &[String], label: &str) -> Result<String, String> {
        self.cell(cells, label).map(|s| s.trim().to_string()).ok_or_else(|| format!("a `{label}` column"))
    }

    fn opt_text(&self, cells: &[String], label: &str) -> Option<String> {
        self.cell(cells, label).filter(|s| !is_none_cell(s)).map(|s| s.trim().to_string())
    }

    fn count(&self, cells: &[String], label: &str) -> Result<u64, String> {
        let s = self.cell(cells, label).ok_or_else(|| format!("a `{label}` column"))?;
        self.style.u64(s).ok_or_else(|| format!("a count in `{label}`, found {s:?}"))
    }

    fn opt_count(&self, cells: &[String], label: &str) -> Option<u64> {
        self.cell(cells, label).filter(|s| !is_none_cell(s)).and_then(|s| self.style.u64(s))
    }

    fn time_unit(&self, label: &str) -> Result<TimeUnit, String> {
        match self.h.unit(label) {
            None => Ok(TimeUnit::Ns),
            Some(u) => TimeUnit::parse(u).ok_or_else(|| format!("a time unit in `{label} ({u})`")),
        }
    }

    fn ns(&self, cells: &[String], label: &str) -> Result<u64, String> {
        let unit = self.time_unit(label)?;
        let s = self.cell(cells, label).ok_or_else(|| format!("a `{label}` column"))?;
        self.style.ns(s, unit).ok_or_else(|| format!("a duration in `{label}`, found {s:?}"))
    }

    fn ns_f64(&self, cells: &[String], label: &str) -> Option<f64> {
        let unit = self.time_unit(label).ok()?;
        let s = self.cell(cells, label).filter(|s| !is_none_cell(s))?;
        Some(self.style.f64(s)? * unit.ns_per_unit() as f64)
    }

    fn time(&self, cells: &[String]) -> Result<TimeStats, String> {
        let total_ns = self.ns(cells, "total time")?;
        Ok(TimeStats {
            pct: self.cell(cells, "time").and_then(|s| self.style.f64(s)),
            total_ns,
            avg_ns: self.ns_f64(cells, "avg").ok_or("an average in `Avg`")?,
            med_ns: self.ns_f64(cells, "med"),
            min_ns: self.ns(cells, "min")?,
            max_ns: self.ns(cells, "max")?,
            stddev_ns: self.ns_f64(cells, "stddev"),
        })
    }

    fn size_unit(&self, label: &str) -> Result<&str, String> {
        let u = self.h.unit(label).ok_or_else(|| format!("a size unit in the `{label}` header"))?;
        text::unit_scale(u).map(|_| u).ok_or_else(|| format!("a size unit in `{label} ({u})`"))
    }

    fn bytes(&self, cells: &[String], label: &str) -> Result<u64, String> {
        let unit = self.size_unit(label)?;
        let s = self.cell(cells, label).ok_or_else(|| format!("a `{label}` column"))?;
        self.style.bytes(s, unit).ok_or_else(|| format!("a size in `{label}`, found {s:?}"))
    }

    fn opt_bytes(&self, cells: &[String], label: &str) -> Option<u64> {
        let unit = self.size_unit(label).ok()?;
        self.cell(cells, label).filter(|s| !is_none_cell(s)).and_then(|s| self.style.bytes(s, unit))
    }

    fn api(&self, c: &[String]) -> Result<ApiSummary, String> {
        Ok(ApiSummary { name: self.text(c, "name")?, calls: self.count(c, "calls")?, time: self.time(c)? })
    }

    fn kernel(&self, c: &[String]) -> Result<KernelSummary, String> {
        Ok(KernelSummary {
            name: self.text(c, "name")?,
            instances: self.count(c, "instances")?,
            time: self.time(c)?,
            grid: self.cell(c, "gridxyz").and_then(parse_dim3),
            block: self.cell(c, "blockxyz").and_then(parse_dim3),
        })
    }

    fn mem_size(&self, c: &[String]) -> Result<MemOpSummary, String> {
        let operation = self.text(c, "operation")?;
        Ok(MemOpSummary {
            kind: GpuOpKind::from_name(&operation),
            operation,
            count: self.count(c, "count")?,
            size: Some(SizeStats {
                total_bytes: self.bytes(c, "total")?,
                avg_bytes: self.bytes(c, "avg")?,
                med_bytes: self.opt_bytes(c, "med"),
                min_bytes: self.bytes(c, "min")?,
                max_bytes: self.bytes(c, "max")?,
                stddev_bytes: self.opt_bytes(c, "stddev"),
            }),
            time: None,
        })
    }

    fn mem_time(&self, c: &[String]) -> Result<MemOpSummary, String> {
        let operation = self.text(c, "operation")?;
        Ok(MemOpSummary {
            kind: GpuOpKind::from_name(&operation),
            operation,
            count: self.count(c, "count")?,
            size: None,
            time: Some(self.time(c)?),
        })
    }

    fn combined(&self, c: &[String]) -> Result<CombinedSummary, String> {
        Ok(CombinedSummary {
            category: self.text(c, "category")?,
            operation: self.text(c, "operation")?,
            instances: self.count(c, "instances")?,
            time: self.time(c)?,
        })
    }

    fn trace(&self, c: &[String], line: usize) -> Result<GpuOp, String> {
        let name = self.text(c, "name")?;
        let device = self.opt_text(c, "device");
        let device_id = device.as_deref().and_then(|d| {
            let open = d.rfind('(')?;
            d[open + 1..].strip_suffix(')')?.trim().parse().ok()
        });
        let dim = |a: &str, b: &str, cc: &str| -> Option<Dim3> {
            Some(Dim3 { x: self.opt_count(c, a)?, y: self.opt_count(c, b)?, z: self.opt_count(c, cc)? })
        };
        let kind = GpuOpKind::from_name(&name);
        Ok(GpuOp {
            start_ns: self.ns(c, "start")?,
            duration_ns: self.ns(c, "duration")?,
            correlation_id: self.opt_count(c, "corrid"),
            kind,
            bytes: if kind == GpuOpKind::Kernel { None } else { self.opt_bytes(c, "bytes") },
            device,
            device_id,
            context: self.opt_count(c, "ctx"),
            stream: self.opt_count(c, "strm"),
            grid: dim("grdx", "grdy", "grdz"),
            block: dim("blkx", "blky", "blkz"),
            src_kind: self.opt_text(c, "srcmemkd"),
            dst_kind: self.opt_text(c, "dstmemkd"),
            name,
            line,
            capture: 0,
        })
    }

    fn nvtx(&self, c: &[String]) -> Result<NvtxSummary, String> {
        Ok(NvtxSummary {
            range: self.text(c, "range")?,
            style: self.text(c, "style")?,
            instances: self.count(c, "instances")?,
            time: self.time(c)?,
        })
    }

    fn nvtx_kernel(&self, c: &[String]) -> Result<NvtxKernelSummary, String> {
        Ok(NvtxKernelSummary {
            range: self.text(c, "nvtx range")?,
            style: self.text(c, "style")?,
            pid: self.opt_count(c, "pid"),
            tid: self.opt_count(c, "tid"),
            range_instances: self.count(c, "nvtx inst")?,
            kernel_instances: self.count(c, "kern inst")?,
            time: self.time(c)?,
            kernel: self.text(c, "kernel name")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes() {
        assert_eq!(split_csv(r#"a,"b, c","d ""e"" f",,"#).unwrap(), vec!["a", "b, c", "d \"e\" f", "", ""]);
        assert_eq!(split_csv(r#"" ""0:<d>:r:none"" ",x"#).unwrap(), vec![" \"0:<d>:r:none\" ", "x"]);
        assert!(split_csv(r#""open,"#).is_none());
    }

    #[test]
    fn number_styles() {
        let s = NumberStyle::detect(["1,602,579,192", "57,234,971.1"], []);
        assert!(!s.comma_decimal);
        assert_eq!(s.u64("1,602,579,192"), Some(1_602_579_192));
        let s = NumberStyle::detect(["482,333", "3", "160,778"], ["160,778"]);
        assert!(s.comma_decimal);
        assert_eq!(s.bytes("482,333", "MB"), Some(482_333_000));
        let s = NumberStyle::detect(["1.234,5"], []);
        assert!(s.comma_decimal);
        assert_eq!(s.f64("1.234,5"), Some(1234.5));
        assert_eq!(NumberStyle::default().ns("1.5", TimeUnit::Us), Some(1500));
        assert_eq!(NumberStyle::default().f64("-2.5"), Some(-2.5));
    }

    #[test]
    fn report_names() {
        assert_eq!(report_from_name("bertSelectNNew_gpukernsum.csv").map(|r| r.0), Some("gpukernsum"));
        assert_eq!(report_from_name("out/run_cuda_gpu_mem_size_sum.csv").map(|r| r.0), Some("cuda_gpu_mem_size_sum"));
        assert_eq!(report_from_name("/x/reports/gpumemsizesum.py").map(|r| r.0), Some("gpumemsizesum"));
        assert_eq!(report_from_name("run_cuda_gpu_kern_sum_base.csv").map(|r| r.0), Some("cuda_gpu_kern_sum"));
        assert_eq!(report_from_name("a_nvtxsum.csv").map(|r| r.0), Some("nvtxsum"));
        assert_eq!(report_from_name("a_nvtx_sum.csv").map(|r| r.0), Some("nvtx_sum"));
        assert_eq!(report_from_name("a_gpusum.csv").map(|r| r.0), Some("gpusum"));
        assert_eq!(report_from_name("a_apigpusum.csv").map(|r| r.0), Some("apigpusum"));
        assert!(report_from_name("notes.csv").is_none());
    }

    #[test]
    fn dims() {
        assert_eq!(parse_dim3(" 512    4    1"), Some(Dim3 { x: 512, y: 4, z: 1 }));
        assert_eq!(parse_dim3("(384, 1, 1)"), Some(Dim3 { x: 384, y: 1, z: 1 }));
        assert_eq!(parse_dim3("None"), None);
    }
}
