//! Every integration test, in one crate: one binary to build and link instead of one per file. A module per
//! subject; `common` holds what they share (the binary's path, fixtures, temporary files).
//!
//!     cargo test                          # all of them
//!     cargo test --test it golden         # one module (any filter on test names works)

mod common;

mod attachments;
mod attribution;
mod bad_input;
mod bench_generator;
mod budget;
mod cli;
mod diff;
mod docs;
mod framework_corpus;
mod generated_fixtures;
mod golden;
mod growth_shapes;
mod html_report;
mod job_view;
mod layers;
mod log_verdict;
mod mcp;
mod nsys_sqlite;
mod nvidia_smi;
mod oom_messages;
mod pickle_variants;
mod profile_findings;
mod profilers;
mod programs;
mod python_capture;
mod reader_routes;
mod real_findings;
mod real_gpu;
mod real_snapshots;
mod record_layouts;
mod replay_undo;
mod report_wording;
mod scenarios;
mod simulator;
mod split_read;
mod text_artifacts;
mod tui_screens;
mod unmatched_oom;
mod verdict;
