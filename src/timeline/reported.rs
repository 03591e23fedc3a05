//! A rank analysed elsewhere: what one of oomdoc's own JSON reports says of it, enough for the job view. The reduce
//! half of a job too large for one machine: `oomdoc analyze --format json` per rank where the files are, then one
//! `oomdoc analyze` over the small reports.

/// One JSON report: the snapshot it was made from, its GPUs and its findings.
#[derive(Clone, Debug, Default)]
pub struct ReportedRank {
    /// The snapshot the report names (its rank is read from this name), or the report's own path.
    pub input: String,
    pub devices: Vec<ReportedDevice>,
    pub findings: Vec<ReportedFinding>,
}

#[derive(Clone, Debug, Default)]
pub struct ReportedDevice {
    pub device: i64,
    /// At the moment the report describes.
    pub allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub oom: bool,
    pub oom_time_us: Option<i64>,
    pub primary_rule: Option<String>,
    /// What held the most memory: its category, the lines that allocated it, its bytes.
    pub holder: Option<(String, String, u64)>,
    /// Bytes by category at the moment.
    pub by_category: Vec<(String, u64)>,
    /// Only an OOM message names this GPU (no snapshot of it): where the message is (`train.log:4`) and the rank
    /// its launcher prefix names.
    pub unmatched: Option<(String, Option<u32>)>,
}

#[derive(Clone, Debug, Default)]
pub struct ReportedFinding {
    pub rule: String,
    pub severity: Severity,
    pub title: String,
    pub device: Option<i64>,
    pub bytes: Option<u64>,
    /// The line the finding points at (a subject's `caller` or `where` in its evidence).
    pub line: Option<String>,
}

/// How bad a finding is; findings at or above `--fail-on` make the exit code 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    #[default]
    Info,
    Warning,
    Error,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        Some(match s {
            "info" => Severity::Info,
            "warning" => Severity::Warning,
            "error" => Severity::Error,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.pad(self.name())
    }
}
