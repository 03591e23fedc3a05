//! oomdoc: tells you why your GPU job ran out of memory, and what to change.
//!
//! Data flows one way: [`ingest`] reads artifacts into a [`timeline::Timeline`], [`analysis`] derives facts
//! (the allocator state at the OOM, the biggest culprits), [`rules`] turn them into findings and the verdict,
//! [`report`] renders them. [`job`] is the pipeline that runs those steps for every caller. ARCHITECTURE.md has
//! the layers (a test keeps imports from going up them) and where each concept lives.

pub mod analysis;
pub mod budget;
pub mod huge_pages;
pub mod ingest;
pub mod job;
pub mod mcp;
pub mod report;
pub mod rules;
pub mod threads;
pub mod timeline;
pub mod tui;
pub mod units;

/// Every error oomdoc reports: one line, naming the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// An input that could not be read: which, and what its reader found wrong.
    #[error(transparent)]
    Input(#[from] ingest::IngestError),
    /// A budget the flags or the model config could not make.
    #[error(transparent)]
    Budget(#[from] budget::BudgetError),
    /// A category file that does not compile.
    #[error(transparent)]
    Categories(#[from] analysis::categories::CategoryError),
    /// A moment or device asked of an input that does not have it.
    #[error("{path}: {source}")]
    Analysis { path: String, source: analysis::AnalysisError },
    /// A rule file that does not parse.
    #[error(transparent)]
    Rule(#[from] rules::RuleError),
    #[error("{0}")]
    Usage(String),
}
