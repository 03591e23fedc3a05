//! What users attach: compressed snapshots, a job folder, the same folder as a tar.gz or a zip. Each must give the
//! report the plain files give; bombs and hostile archives must give one clear line and exit 2.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::{self, oomdoc, stderr, stdout};

/// A scratch folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("oomdoc-attach-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn file(&self, name: &str, bytes: &[u8]) -> String {
        let p = self.0.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json_of(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["analyze", "--format", "json"];
    all.extend_from_slice(args);
    let o = oomdoc(&all);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The report without the lines that name where it was read from.
fn without_inputs(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("inputs");
    v
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::encode_all(bytes, 3).unwrap()
}

fn xz(bytes: &[u8]) -> Vec<u8> {
    let mut e = xz2::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn bzip2(bytes: &[u8]) -> Vec<u8> {
    let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A codec's compressor.
type Compress = fn(&[u8]) -> Vec<u8>;

#[test]
fn every_real_snapshot_compressed_gives_the_plain_report() {
    let scratch = Scratch::new("compressed");
    let snapshots = common::fixtures("fixtures/real", ".pickle");
    assert!(snapshots.len() >= 30, "{} real snapshots", snapshots.len());
    for (i, path) in snapshots.iter().enumerate() {
        let plain = common::read(path);
        let expected = without_inputs(json_of(&[path]));
        // gzip, zstd and xz on every file; bzip2, rarer in the wild, on every fourth.
        let mut codecs: Vec<(&str, &str, Compress)> =
            vec![("gzip", "gz", gzip), ("zstd", "zst", zstd), ("xz", "xz", xz)];
        if i % 4 == 0 {
            codecs.push(("bzip2", "bz2", bzip2));
        }
        for (codec, ext, compress) in codecs {
            let name = Path::new(path).file_name().unwrap().to_str().unwrap();
            let packed = scratch.file(&format!("{name}.{ext}"), &compress(&plain));
            let got = json_of(&[&packed]);
            assert_eq!(got["inputs"][0]["compression"], codec, "{path}");
            assert_eq!(got["inputs"][0]["bytes"], plain.len(), "{path}: bytes are the unpacked size");
            assert!(without_inputs(got) == expected, "{path} as {codec}: the report differs from the plain file's");
        }
    }
}

#[test]
fn a_compressed_snapshot_under_a_misleading_name_is_still_read() {
    // Users rename; the bytes decide. A zstd stream named .pickle, a gzip stream with no extension.
    let scratch = Scratch::new("renamed");
    let plain = common::read("fixtures/real/mlsys-linear-t24.pickle");
    let expected = without_inputs(json_of(&["fixtures/real/mlsys-linear-t24.pickle"]));
    for (name, bytes) in [("snap.pickle", zstd(&plain)), ("rank0", gzip(&plain))] {
        let p = scratch.file(name, &bytes);
        assert!(without_inputs(json_of(&[&p])) == expected, "{name}");
    }
}

/// The job folder the archive tests pack: two ranks' snapshots, the training log, nvidia-smi, and a README that is
/// not an artifact and must be skipped with a word, not an error.
const JOB: [(&str, &str); 4] = [
    ("rank0.pickle", "fixtures/generated/joint/nccl-with-smi.pickle"),
    ("rank1.pickle", "fixtures/real/mlsys-linear-t24.pickle"),
    ("train.log", "fixtures/generated/joint/nccl-with-smi.train.log"),
    ("nvidia-smi.csv", "fixtures/generated/joint/nccl-with-smi.nvidia-smi.csv"),
];

fn job_folder(scratch: &Scratch) -> String {
    for (name, src) in JOB {
        scratch.file(&format!("job/{name}"), &common::read(src));
    }
    scratch.file("job/README.md", b"# run 17, died at step 1200\n");
    scratch.0.join("job").to_str().unwrap().to_string()
}

fn tar_gz(folder: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let mut names: Vec<_> = std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    for n in names {
        b.append_path_with_name(Path::new(folder).join(&n), Path::new("job").join(&n)).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn zip_of(folder: &str, method: zip::CompressionMethod) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    let mut names: Vec<_> = std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    for n in names {
        w.start_file(format!("job/{}", n.to_str().unwrap()), opts).unwrap();
        w.write_all(&std::fs::read(Path::new(folder).join(&n)).unwrap()).unwrap();
    }
    w.finish().unwrap().into_inner()
}

#[test]
fn a_job_folder_its_tar_gz_and_its_zip_give_the_report_of_the_files_one_by_one() {
    let scratch = Scratch::new("job");
    let folder = job_folder(&scratch);
    let files: Vec<String> = JOB.iter().map(|(n, _)| format!("{folder}/{n}")).collect();
    let one_by_one = json_of(&files.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(one_by_one["devices"].as_array().unwrap().len(), 2, "two ranks");
    assert!(!one_by_one["findings"].as_array().unwrap().is_empty());

    let tgz = scratch.file("job.tar.gz", &tar_gz(&folder));
    let zipped = scratch.file("job.zip", &zip_of(&folder, zip::CompressionMethod::Deflated));
    let zip_zstd = scratch.file("job-zstd.zip", &zip_of(&folder, zip::CompressionMethod::Zstd));
    for (what, path, kind) in [
        ("folder", &folder, "folder"),
        ("tar.gz", &tgz, "archive"),
        ("zip", &zipped, "archive"),
        ("zip", &zip_zstd, "archive"),
    ] {
        let got = json_of(&[path]);
        for key in ["devices", "findings", "ooms", "capture"] {
            assert!(
                same_but_for_where(&got[key], &one_by_one[key]),
                "{what}: {key} differ from the files read one by one"
            );
        }
        // The container is listed with what was read and what was skipped, and why.
        let inputs = got["inputs"].as_array().unwrap();
        let container = inputs.iter().find(|i| i["kind"] == kind).unwrap_or_else(|| panic!("{what}: {inputs:?}"));
        assert_eq!(
            container["read"][0],
            "4 members read".replace("members", if kind == "folder" { "files" } else { "members" })
        );
        let skipped = container["skipped"][0].as_str().unwrap();
        assert!(skipped.contains("README.md") && skipped.contains("not an artifact"), "{what}: {skipped}");
        // Members are named inside their container, so a finding's file can be found.
        assert!(inputs.iter().any(|i| i["path"].as_str().unwrap().ends_with("rank0.pickle")
            && (kind == "folder" || i["path"].as_str().unwrap().contains("!job/"))));
    }

    // The text report names the container and the members it read.
    let text = stdout(&oomdoc(&["analyze", &tgz]));
    assert!(text.contains("job.tar.gz!job/rank0.pickle") && text.contains("4 members read"), "{text}");
}

/// Equal, once file names are cut to their last component and positions in the input list are dropped: a member
/// is named `job.tar.gz!job/train.log` where the plain file is `…/job/train.log`.
fn same_but_for_where(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    fn strip(v: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match v {
            Value::Object(m) => {
                Value::Object(m.iter().filter(|(k, _)| *k != "input").map(|(k, v)| (k.clone(), strip(v))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            Value::String(s) if JOB.iter().any(|(n, _)| s.ends_with(&format!("/{n}"))) => {
                Value::String(s.rsplit('/').next().unwrap().to_string())
            }
            v => v.clone(),
        }
    }
    strip(a) == strip(b)
}

/// Runs `oomdoc analyze` and checks the bad-input contract: exit 2, nothing on stdout, one line on stderr.
fn refused(args: &[&str]) -> String {
    let mut all = vec!["analyze"];
    all.extend_from_slice(args);
    let o = oomdoc(&all);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?} printed a report");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn a_gzip_bomb_is_refused_in_one_line_before_it_fills_memory() {
    let scratch = Scratch::new("gzbomb");
    // 1 GiB of zeros packs to about 1 MiB: over the 1000× ratio long before it is all unpacked.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = scratch.file("snapshot.pickle.gz", &e.finish().unwrap());
    let err = refused(&[&bomb]);
    assert!(err.contains("snapshot.pickle.gz") && err.contains("decompression bomb"), "{err}");
    // A user who means it can raise the limit in bytes; the same file then fails on what it holds, not its size.
    let err = refused(&["--max-unpacked", "64MiB", &bomb]);
    assert!(err.contains("--max-unpacked") || err.contains("bomb"), "{err}");
}

#[test]
fn a_zip_bomb_member_is_refused_in_one_line() {
    let scratch = Scratch::new("zipbomb");
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Zstd);
    w.start_file("rank0.pickle", opts).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..128 {
        w.write_all(&zeros).unwrap();
    }
    let bomb = scratch.file("job.zip", &w.finish().unwrap().into_inner());
    let err = refused(&[&bomb]);
    assert!(err.contains("job.zip") && (err.contains("bomb") || err.contains("more than")), "{err}");
}

#[test]
fn an_archive_of_a_hundred_thousand_members_is_refused_in_one_line() {
    let scratch = Scratch::new("members");
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..100_000 {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, format!("f{i}"), std::io::empty()).unwrap();
    }
    let t = scratch.file("many.tar", &b.into_inner().unwrap());
    let err = refused(&[&t]);
    assert!(err.contains("many.tar") && err.contains("10000 members") && err.contains("--max-members"), "{err}");
}

#[test]
fn a_link_out_of_the_folder_is_not_followed() {
    let scratch = Scratch::new("links");
    let folder = job_folder(&scratch);
    let outside = scratch.file("secret/rank9.pickle", &common::read("fixtures/real/cs336-rr-infer-t22.pickle"));
    std::os::unix::fs::symlink(&outside, format!("{folder}/rank9.pickle")).unwrap();
    let got = json_of(&[&folder]);
    assert_eq!(got["devices"].as_array().unwrap().len(), 2, "the linked snapshot was read");
    let folder_info = got["inputs"].as_array().unwrap().iter().find(|i| i["kind"] == "folder").unwrap().clone();
    let skipped = folder_info["skipped"].to_string();
    assert!(skipped.contains("rank9.pickle: a link out of the folder, not followed"), "{skipped}");
}

#[test]
fn an_empty_folder_and_a_corrupt_archive_are_clear_errors() {
    let scratch = Scratch::new("empty");
    std::fs::create_dir_all(scratch.0.join("nothing")).unwrap();
    let err = refused(&[scratch.0.join("nothing").to_str().unwrap()]);
    assert!(err.contains("nothing") && err.contains("folder"), "{err}");

    // Cut inside the gzip header: nothing can be read. Cut later: the members before the cut are reported, the one
    // it falls in is one error line, and the exit code says the job was not read whole.
    let tgz = tar_gz(&job_folder(&scratch));
    let p = scratch.file("cut.tar.gz", &tgz[..10]);
    let err = refused(&[&p]);
    assert!(err.contains("cut.tar.gz"), "{err}");
    for cut in [tgz.len() / 4, tgz.len() / 2] {
        let p = scratch.file(&format!("cut{cut}.tar.gz"), &tgz[..cut]);
        let o = oomdoc(&["analyze", &p]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!("cut{cut}.tar.gz!job/")), "names the member: {err}");
    }
    let zip = zip_of(&job_folder(&scratch), zip::CompressionMethod::Deflated);
    let p = scratch.file("cut.zip", &zip[..zip.len() / 2]);
    let err = refused(&[&p]);
    assert!(err.contains("cut.zip") && err.contains("zip"), "{err}");
    let _ = scratch.path();
}

/// One kind of input, as bytes under a name.
struct Kind {
    name: &'static str,
    bytes: Vec<u8>,
    /// Read when the user names it (else: what the error line says).
    alone: Result<(), &'static str>,
    /// Read as a file of a folder (else: what the folder's skipped line says, or the error line when it is one).
    in_folder: Result<(), &'static str>,
    /// Read as a member of a tar archive (else: what the archive's skipped line says).
    in_archive: Result<(), &'static str>,
}

fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *bytes).unwrap();
    }
    b.into_inner().unwrap()
}

fn every_kind() -> Vec<Kind> {
    let snap = common::read("fixtures/real/mlsys-linear-t24.pickle");
    let tar = tar_of(&[("inner/rank0.pickle", &snap)]);
    let mut zipped = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    zipped.start_file("rank0.pickle", zip::write::SimpleFileOptions::default()).unwrap();
    zipped.write_all(&snap).unwrap();
    let zipped = zipped.finish().unwrap().into_inner();
    let twice = "compressed twice";
    let nested = "an archive inside an archive";
    let unknown = "not an artifact oomdoc reads";
    vec![
        Kind { name: "plain.pickle", bytes: snap.clone(), alone: Ok(()), in_folder: Ok(()), in_archive: Ok(()) },
        Kind { name: "s.pickle.gz", bytes: gzip(&snap), alone: Ok(()), in_folder: Ok(()), in_archive: Ok(()) },
        Kind { name: "s.pickle.zst", bytes: zstd(&snap), alone: Ok(()), in_folder: Ok(()), in_archive: Ok(()) },
        Kind { name: "s.pickle.xz", bytes: xz(&snap), alone: Ok(()), in_folder: Ok(()), in_archive: Ok(()) },
        Kind { name: "s.pickle.bz2", bytes: bzip2(&snap), alone: Ok(()), in_folder: Ok(()), in_archive: Ok(()) },
        Kind { name: "job.tar", bytes: tar.clone(), alone: Ok(()), in_folder: Ok(()), in_archive: Err(nested) },
        Kind { name: "job.tar.gz", bytes: gzip(&tar), alone: Ok(()), in_folder: Ok(()), in_archive: Err(nested) },
        Kind { name: "job.zip", bytes: zipped, alone: Ok(()), in_folder: Ok(()), in_archive: Err(nested) },
        Kind {
            name: "s.pickle.gz.gz",
            bytes: gzip(&gzip(&snap)),
            alone: Err("not read: compressed twice (gzip inside gzip)"),
            in_folder: Err(twice),
            in_archive: Err(twice),
        },
        Kind {
            name: "s.pickle.gz.zst",
            bytes: zstd(&gzip(&snap)),
            alone: Err("not read: compressed twice (gzip inside zstd)"),
            in_folder: Err(twice),
            in_archive: Err(twice),
        },
        Kind {
            name: "outer.tar",
            bytes: tar_of(&[("inner.tar", &tar)]),
            alone: Err("an archive with nothing oomdoc reads"),
            in_folder: Err("an archive with nothing oomdoc reads"),
            in_archive: Err(nested),
        },
        Kind {
            name: "empty.pickle",
            bytes: Vec::new(),
            alone: Err("Found an empty file"),
            in_folder: Err(unknown),
            in_archive: Err(unknown),
        },
        Kind {
            name: "notes.txt",
            bytes: b"run 17 died at step 1200\n".to_vec(),
            alone: Err("not a recognised artifact"),
            in_folder: Err(unknown),
            in_archive: Err(unknown),
        },
    ]
}

/// Every input named on the command line is read or said not to be, with why; an analysis that read nothing
/// exits 2; a folder or archive says what it skipped. Each kind alone, beside a good snapshot, in a folder beside it
/// and in an archive beside it.
#[test]
fn every_input_kind_is_read_or_said_not_to_be() {
    let scratch = Scratch::new("outcomes");
    let good = "fixtures/real/cs336-rr-infer-t22.pickle";
    for k in every_kind() {
        let path = scratch.file(&format!("alone/{}", k.name), &k.bytes);
        let name = k.name;

        let o = oomdoc(&["analyze", &path]);
        let (out, err) = (stdout(&o), stderr(&o));
        match k.alone {
            Ok(()) => {
                assert_eq!(o.status.code(), Some(0), "{name} alone: {err}");
                assert!(out.contains("Verdict"), "{name} alone: no report");
            }
            Err(why) => {
                assert_eq!(o.status.code(), Some(2), "{name} alone exits 2");
                assert!(out.is_empty(), "{name} alone printed a report");
                assert!(err.contains(name) && err.contains(why), "{name} alone: {err}");
            }
        }

        let o = oomdoc(&["analyze", &path, good]);
        let (out, err) = (stdout(&o), stderr(&o));
        assert!(out.contains("cs336-rr-infer-t22.pickle") && out.contains("Verdict"), "{name} beside: {out}");
        match k.alone {
            Ok(()) => assert_eq!(o.status.code(), Some(0), "{name} beside a snapshot: {err}"),
            Err(why) => {
                assert_eq!(o.status.code(), Some(2), "{name} beside a snapshot exits 2");
                assert!(err.contains(name) && err.contains(why), "{name} beside a snapshot: {err}");
            }
        }

        let folder = scratch.0.join(format!("folder-{name}"));
        scratch.file(&format!("folder-{name}/{name}"), &k.bytes);
        scratch.file(&format!("folder-{name}/good.pickle"), &common::read(good));
        let v = analyze_any(&[folder.to_str().unwrap()]);
        let container = container_of(&v.json, "folder");
        match k.in_folder {
            Ok(()) => {
                assert_eq!(v.code, 0, "{name} in a folder: {}", v.err);
                assert_eq!(container["read"][0], "2 files read", "{name} in a folder");
            }
            Err(why) if why.starts_with("an archive with") => {
                assert_eq!(v.code, 2, "{name} in a folder: a file that fails is an error");
                assert!(v.err.contains(name) && v.err.contains(why), "{name} in a folder: {}", v.err);
            }
            Err(why) => {
                assert_eq!(v.code, 0, "{name} in a folder: skipped with a word: {}", v.err);
                assert_eq!(container["read"][0], "1 file read", "{name} in a folder");
                let skipped = container["skipped"].to_string();
                assert!(skipped.contains(name) && skipped.contains(why), "{name} in a folder: {skipped}");
            }
        }

        let archive = scratch
            .file(&format!("archive-{name}.tar"), &tar_of(&[(name, &k.bytes), ("good.pickle", &common::read(good))]));
        let v = analyze_any(&[&archive]);
        let container = container_of(&v.json, "archive");
        assert_eq!(v.code, 0, "{name} in an archive: {}", v.err);
        match k.in_archive {
            Ok(()) => assert_eq!(container["read"][0], "2 members read", "{name} in an archive"),
            Err(why) => {
                assert_eq!(container["read"][0], "1 member read", "{name} in an archive");
                let skipped = container["skipped"].to_string();
                assert!(skipped.contains(name) && skipped.contains(why), "{name} in an archive: {skipped}");
            }
        }
    }
}

/// `oomdoc analyze ARGS --format json`, whatever its exit status.
struct Outcome {
    code: i32,
    json: serde_json::Value,
    err: String,
}

fn analyze_any(args: &[&str]) -> Outcome {
    let mut all = vec!["analyze", "--format", "json"];
    all.extend_from_slice(args);
    let o = oomdoc(&all);
    let json = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    Outcome { code: o.status.code().unwrap_or(-1), json, err: stderr(&o) }
}

/// The input line of the job's folder or archive (`Null` when the report has none).
fn container_of(v: &serde_json::Value, kind: &str) -> serde_json::Value {
    let inputs = v["inputs"].as_array().cloned().unwrap_or_default();
    inputs.into_iter().find(|i| i["kind"] == kind).unwrap_or(serde_json::Value::Null)
}

#[test]
fn a_report_written_to_a_file_says_where() {
    let scratch = Scratch::new("written");
    let out = scratch.0.join("report.html");
    let o = oomdoc(&["analyze", "fixtures/real/mlsys-linear-t24.pickle", "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
    let err = stderr(&o);
    assert!(err.contains("wrote") && err.contains("report.html") && err.contains("HTML"), "{err}");
    assert!(std::fs::metadata(&out).unwrap().len() > 1000);
}

/// The same files give the same ranks whatever holds them: a folder lists them by name, and an archive's members
/// are put in the same order, whatever order the archive stored them in.
#[test]
fn ranks_are_the_same_from_a_folder_and_from_an_archive_stored_in_another_order() {
    let scratch = Scratch::new("rank-order");
    // Names that carry no rank: the order decides.
    let a = common::read("fixtures/real/cs336-kk-fullstep-57gb.pickle");
    let b = common::read("fixtures/real/mlsys-linear-t24.pickle");
    scratch.file("job/alpha.pickle", &a);
    scratch.file("job/beta.pickle", &b);
    let reversed = scratch.file("job.tar", &tar_of(&[("job/beta.pickle", &b), ("job/alpha.pickle", &a)]));
    let zipped =
        scratch.file("job.zip", &zip_of(scratch.0.join("job").to_str().unwrap(), zip::CompressionMethod::Stored));
    let rows = |path: &str| -> Vec<(u64, String)> {
        let v = json_of(&[path]);
        v["job"]["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (r["rank"].as_u64().unwrap(), r["input"].as_str().unwrap().rsplit('/').next().unwrap().to_string())
            })
            .collect()
    };
    let from_folder = rows(scratch.0.join("job").to_str().unwrap());
    assert_eq!(from_folder, [(0, "alpha.pickle".to_string()), (1, "beta.pickle".to_string())]);
    assert_eq!(rows(&reversed), from_folder, "a tar stored in another order");
    assert_eq!(rows(&zipped), from_folder, "a zip");
    // The TUI's r / R go through the job's ranks by the same rule.
    let job = oomdoc::job::Job::read(&oomdoc::job::JobOptions::new([&reversed])).unwrap();
    let tui: Vec<(u32, String)> = job
        .ranked_timelines()
        .iter()
        .map(|(r, tl)| (*r, tl.inputs[0].path.rsplit('/').next().unwrap().to_string()))
        .collect();
    assert_eq!(tui, [(0, "alpha.pickle".to_string()), (1, "beta.pickle".to_string())]);
}
