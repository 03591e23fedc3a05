//! oomdoc: tells you why your GPU job ran out of memory, and what to change.
//!
//! Data flows one way: [`ingest`] reads artifacts into a [`timeline::Timeline`], [`analysis`] derives facts
//! (the allocator state at the OOM, the biggest culprits), [`report`] renders them.

pub mod analysis;
pub mod budget;
pub mod huge_pages;
pub mod ingest;
pub mod job;
pub mod report;
pub mod rules;
pub mod timeline;
pub mod tui;
pub mod units;

/// Every error oomdoc reports: one line, naming the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Input { path: String, message: String },
    #[error("{0}")]
    Usage(String),
}
