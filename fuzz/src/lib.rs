//! What each fuzz target does with its bytes. The targets in `fuzz_targets/` are one line each; this file is also
//! compiled into the main crate's tests (`tests/it/bad_input.rs` includes it), so every input in `fuzz/regressions/`
//! is replayed by `cargo test` through exactly the code the fuzzer ran. Only the library's public API is used here.
//!
//! A target must never panic, whatever the bytes: an `Err` is the right answer to bad input.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::OnceLock;

use oomdoc::analysis::{self, categories::Categorizer, Options};
use oomdoc::ingest::{self, pickle, snapshot, Kind, LoadOptions};
use oomdoc::job::{Checklist, Job, JobOptions};
use oomdoc::report::{self, Format};
use oomdoc::rules::{self, RuleSet};
use oomdoc::timeline::Timeline;

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn checklist() -> &'static Checklist {
    static B: OnceLock<Checklist> = OnceLock::new();
    B.get_or_init(Checklist::builtin)
}

/// The job pipeline on a timeline, at two moments, and every report format, as `oomdoc analyze` runs them.
fn analyse_and_render(tl: Timeline) {
    let mut options = JobOptions {
        analysis: Options { top: 5, gpu_memory: Some(80 << 30), ..Options::default() },
        ..JobOptions::default()
    };
    let Ok(job) = Job::of_timelines(vec![tl], checklist().clone(), &options) else { return };
    render_all(&job);
    options.analysis.at = analysis::At::End;
    let Ok(job) = Job::of_timelines(job.timelines, checklist().clone(), &options) else { return };
    render_all(&job);
}

fn render_all(job: &Job) {
    for analysed in job.analyze() {
        let Ok(a) = analysed else { continue };
        for f in [Format::Text, Format::Markdown, Format::Json] {
            std::hint::black_box(report::render(f, &a.analysis, a.timeline, true));
        }
    }
}

/// The pickle machine alone, every opcode, with the generic builder.
pub fn pickle(data: &[u8]) {
    let _ = pickle::read(Cursor::new(data), &mut pickle::PlainBuilder, Default::default(), None);
}

/// A snapshot read through the snapshot builder (records, known layouts), then the whole analysis. It is read twice:
/// on one thread, and again with a helper thread offered the later part of the trace (`pickle::split`), which must
/// give the same snapshot or the same error.
pub fn snapshot(data: &[u8]) {
    let one = snapshot::read_sized(Cursor::new(data), data.len() as u64, None);
    let split = split_source(data);
    let two = snapshot::read_split(Cursor::new(data), data.len() as u64, None, Some(split));
    match (&one, &two) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.format_version, b.format_version, "the split read dates the file otherwise");
            assert!(format!("{:?}", a.timeline) == format!("{:?}", b.timeline), "the split read differs");
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "the split read fails otherwise"),
        _ => panic!("the split read and the one-thread read disagree on whether the file reads"),
    }
    if let Ok(s) = one {
        analyse_and_render(s.timeline);
    }
}

/// Bytes shared by the readers of one file.
struct Shared(std::sync::Arc<Vec<u8>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A way to read `data` again from any offset, on any thread, as a file is reopened; the helper reads its whole part,
/// so that what it reads does not depend on timing.
pub fn split_source(data: &[u8]) -> pickle::SplitSource {
    let bytes = std::sync::Arc::new(data.to_vec());
    let reopen: pickle::Reopen = std::sync::Arc::new(move |offset| {
        let mut c = Cursor::new(Shared(bytes.clone()));
        c.set_position(offset);
        Ok(Box::new(c) as Box<dyn std::io::Read + Send>)
    });
    pickle::SplitSource { reopen, len: data.len() as u64, patient: true }
}

pub fn oom_log(data: &[u8]) {
    let t = text(data);
    let _ = ingest::oom_log::sniff(&t);
    std::hint::black_box(ingest::oom_log::parse(&t, "fuzz.log"));
}

pub fn vllm_log(data: &[u8]) {
    let t = text(data);
    let _ = ingest::vllm_log::sniff(&t);
    std::hint::black_box(ingest::vllm_log::parse(&t, "fuzz.log"));
}

/// Every nvidia-smi form, with and without the `--columns` of a noheader CSV.
pub fn nvidia_smi(data: &[u8]) {
    let t = text(data);
    let _ = ingest::nvidia_smi::sniff(&t);
    std::hint::black_box(ingest::nvidia_smi::parse(&t, 0, None));
    let cols: Vec<String> =
        ["timestamp", "index", "memory.used", "memory.total", "name"].iter().map(|s| s.to_string()).collect();
    std::hint::black_box(ingest::nvidia_smi::parse(&t, 1, Some(&cols)));
}

/// `nsys stats` CSV reports and console captures; the first byte picks the file name a report came in (the name
/// settles what a header cannot).
pub fn nsys_csv(data: &[u8]) {
    const NAMES: [&str; 6] = [
        "run_cuda_api_sum.csv",
        "run_osrt_sum.csv",
        "run_cuda_gpu_trace.csv",
        "run_nvtx_sum.csv",
        "capture.txt",
        "run_gpukernsum.csv",
    ];
    let Some((&pick, rest)) = data.split_first() else { return };
    let t = text(rest);
    let _ = ingest::nsys::sniff(&t);
    let name = NAMES[pick as usize % NAMES.len()];
    let _ = std::hint::black_box(ingest::nsys::parse_files([(name, t.as_str())]));
}

/// A corrupted `nsys export --type sqlite` database: SQLite opens files, so the bytes go through one.
pub fn nsys_sqlite(data: &[u8]) {
    let f = Scratch::new("sqlite", data);
    let _ = std::hint::black_box(ingest::nsys_sqlite::read(&f.0));
}

pub fn ncu(data: &[u8]) {
    let t = text(data);
    let _ = ingest::ncu::sniff(&t);
    let _ = std::hint::black_box(ingest::ncu::parse(&t, Some("fuzz.csv")));
}

/// A rule file; when it compiles, its cases are evaluated against facts of every kind.
pub fn rule_file(data: &[u8]) {
    let t = text(data);
    let Ok(rule) = rules::parse_rule("fuzz.toml", &t) else { return };
    let set = RuleSet { rules: vec![rule] };
    let mut facts = analysis::facts::Facts::default();
    sample_facts(&mut facts);
    std::hint::black_box(set.evaluate(Some(0), &facts));
    std::hint::black_box(set.evaluate_each("kernel", &[facts.clone(), facts.clone()], &facts));
}

/// A `when` expression, evaluated with facts of every kind and with missing ones.
pub fn when_expr(data: &[u8]) {
    let t = text(data);
    let Ok(e) = rules::expr::parse(&t) else { return };
    let mut names = Vec::new();
    rules::expr::facts(&e, &mut names);
    use rules::expr::Val;
    let lookups: [fn(&str) -> Val; 6] = [
        |_| Val::Missing,
        |n| Val::Num(n.len() as f64 - 3.5),
        |n| Val::Str(n.to_string()),
        |n| Val::Bool(n.len() % 2 == 0),
        |_| Val::Num(f64::NAN),
        |_| Val::Num(f64::INFINITY),
    ];
    for lookup in lookups {
        std::hint::black_box(rules::expr::eval(&e, &lookup).truthy());
    }
}

/// A categories.toml, then classifying the stacks of a real snapshot with it.
pub fn categories(data: &[u8]) {
    let t = text(data);
    let Ok(c) = Categorizer::new(&[("categories.toml", &t)]) else { return };
    let tl = sample_timeline();
    let mut cache = analysis::categories::CategoryCache::new(&c, tl);
    for d in &tl.devices {
        for e in d.events.iter().take(200) {
            std::hint::black_box(cache.of(e.stack));
        }
    }
}

/// A Hugging Face config.json, then the budget of a training and a serving run on it.
pub fn budget_config(data: &[u8]) {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        b: oomdoc::budget::args::BudgetArgs,
    }
    let t = text(data);
    let Ok(cfg) = oomdoc::budget::model::parse_config("config.json", &t) else { return };
    let Ok(model) = oomdoc::budget::model::from_config(&Default::default(), Some(cfg)) else { return };
    for args in [
        &["b", "--train", "--batch", "4", "--seq", "2048", "--gpu", "h100-80gb"][..],
        &["b", "--infer", "--batch", "8", "--seq", "4096", "--gpu", "4090"][..],
        &["b", "--train", "--batch", "1", "--seq", "8192", "--gpus", "8", "--zero", "3", "--gpu", "a100-80gb"][..],
    ] {
        let cli = Cli::parse_from(args);
        let Ok(run) = cli.b.run.to_run(&model) else { continue };
        let gpu = cli.b.gpu.as_deref().and_then(|g| oomdoc::budget::gpus::find(g).ok());
        if let Ok(b) = oomdoc::budget::plan(model.clone(), run, gpu, 64) {
            std::hint::black_box(oomdoc::report::budget::render(&b, Format::Text));
            std::hint::black_box(oomdoc::report::budget::render(&b, Format::Json));
        }
    }
}

/// Any file, recognised by content, beside (per the first byte) nothing, a real snapshot with a trace, or a
/// snapshot with an OOM and memory outside PyTorch: reading, joining on one clock, analysis, rules and reports.
pub fn job(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let f = Scratch::new("artifact", rest);
    let mut paths = vec![f.0.clone()];
    let beside = match pick % 3 {
        1 => Some(root().join("fixtures/real/mlsys-linear-t24.pickle")),
        2 => Some(root().join("fixtures/generated/joint/nccl-with-smi.pickle")),
        _ => None,
    };
    paths.extend(beside);
    let mut options = JobOptions::new(paths);
    options.load = LoadOptions { kind: None, strict: pick & 0x80 != 0, ..LoadOptions::default() };
    options.analysis = Options { top: 5, gpu_memory: Some(80 << 30), ..Options::default() };
    if let Ok(job) = Job::read(&options) {
        render_all(&job);
    }
    let _ = Kind::Log;
}

/// One attachment as a user hands it: compressed, a tar or zip of artifacts, read with small limits so a
/// mutated length cannot make a run slow (the limits themselves are part of what is fuzzed).
pub fn archive(data: &[u8]) {
    let f = Scratch::new("attachment", data);
    let mut options = JobOptions::new(vec![f.0.clone()]);
    options.load.limits = ingest::unpack::Limits { max_members: 64, max_unpacked_bytes: 64 << 20, max_ratio: 1000 };
    options.analysis = Options { top: 5, gpu_memory: Some(80 << 30), ..Options::default() };
    if let Ok(job) = Job::read(&options) {
        render_all(&job);
    }
}

/// The project's root: this file is built in `fuzz/` and in the main crate's tests.
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.join("fixtures").is_dir() {
        here
    } else {
        here.join("..")
    }
}

/// A real snapshot's timeline, read once.
fn sample_timeline() -> &'static Timeline {
    static T: OnceLock<Timeline> = OnceLock::new();
    T.get_or_init(|| {
        let bytes = std::fs::read(root().join("fixtures/real/mlsys-linear-t24.pickle")).expect("fixture");
        snapshot::read(Cursor::new(bytes), None).expect("fixture reads").timeline
    })
}

/// Facts of every kind a rule may meet, with names the built-in rules use.
fn sample_facts(f: &mut analysis::facts::Facts) {
    use analysis::facts::{Fact, Unit};
    use rules::expr::Val;
    let mut put = |n: &str, v: Val, unit: Unit| f.insert(n, Fact { value: v, unit, doc: "" });
    put("allocated_bytes", Val::Num(3e9), Unit::Bytes);
    put("reserved_bytes", Val::Num(4e9), Unit::Bytes);
    put("oom.present", Val::Bool(true), Unit::Plain);
    put("oom.where", Val::Str("train.py:1 in f".into()), Unit::Plain);
    put("moment", Val::Str("OOM".into()), Unit::Plain);
    put("live.activation_share", Val::Num(0.5), Unit::Ratio);
    put("kernel.duration", Val::Num(12.5), Unit::Micros);
    put("kernel.short_name", Val::Str("k".into()), Unit::Plain);
    put("iter.count", Val::Num(f64::NAN), Unit::Count);
    put("neg", Val::Num(-1e300), Unit::Bytes);
}

/// A file holding the bytes, removed when dropped (one per thread: libFuzzer may run jobs in one process).
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str, data: &[u8]) -> Scratch {
        let p = std::env::temp_dir().join(format!(
            "oomdoc-fuzz-{what}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&p, data).expect("scratch file");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
