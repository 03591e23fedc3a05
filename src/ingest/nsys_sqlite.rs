//! Nsight Systems SQLite exports (`nsys export --type sqlite`, or the `.sqlite` that `nsys stats` leaves beside a
//! report).
//!
//! What is read:
//! - `CUDA_GPU_MEMORY_USAGE_EVENTS` (captured with `nsys profile --cuda-memory-usage=true`): every allocation and
//!   free the CUDA driver saw, into [`ProfileData::memory_events`]. Columns `start`, `globalPid`, `deviceId`,
//!   `address`, `bytes`, `memKind` (→ `ENUM_CUDA_MEM_KIND`), `memoryOperationType` (→
//!   `ENUM_CUDA_DEV_MEM_EVENT_OPER`: 0 allocation, 1 deallocation).
//! - `CUPTI_ACTIVITY_KIND_KERNEL`, `CUPTI_ACTIVITY_KIND_MEMCPY`, `CUPTI_ACTIVITY_KIND_MEMSET` into
//!   [`ProfileData::gpu_trace`]. Kernel names are ids into `StringIds`; `copyKind` refers to
//!   `ENUM_CUDA_MEMCPY_OPER`, `srcKind`/`dstKind`/`memKind` to `ENUM_CUDA_MEM_KIND`.
//!
//! Enum values are shown by the labels the export's own `ENUM_*` tables give (`Device`, `Pinned`,
//! `Host-to-Device`); without the table, by their number. Processes are nsys GlobalIds: the PID is
//! `globalPid / 0x1000000 % 0x1000000`.
//!
//! The file is opened read-only as an immutable database (`file:…?immutable=1`): no lock is taken and no journal or
//! WAL file is created beside it. Rows are streamed from one prepared statement per table; each row becomes one
//! event. A NULL or negative time, size, device or count skips the row and lists it (by rowid) as malformed; a value
//! of the wrong type (text where an integer belongs) is an error.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, Row};

use crate::timeline::profile::{Dim3, DriverMemoryEvent, DriverMemoryOp, GpuOp, GpuOpKind, ProfileData, ProfileSource};
use crate::timeline::Malformed;

/// `ProfileSource::format` of every file this module reads.
pub const FORMAT: &str = "nsys SQLite export";

const MEMORY_TABLE: &str = "CUDA_GPU_MEMORY_USAGE_EVENTS";
const KERNEL_TABLE: &str = "CUPTI_ACTIVITY_KIND_KERNEL";
const MEMCPY_TABLE: &str = "CUPTI_ACTIVITY_KIND_MEMCPY";
const MEMSET_TABLE: &str = "CUPTI_ACTIVITY_KIND_MEMSET";
/// The tables read; a database with none of them is not something this module can use.
const DATA_TABLES: [&str; 4] = [MEMORY_TABLE, KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE];

const MEM_KIND_ENUM: &str = "ENUM_CUDA_MEM_KIND";
const MEM_OPER_ENUM: &str = "ENUM_CUDA_DEV_MEM_EVENT_OPER";
const MEMCPY_ENUM: &str = "ENUM_CUDA_MEMCPY_OPER";

/// The first 16 bytes of every SQLite 3 database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// The size of the database header.
const HEADER_LEN: usize = 100;

/// True when `head` starts like an SQLite 3 database.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(SQLITE_MAGIC)
}

/// Why an SQLite export could not be read (one line, without the path).
#[derive(Debug, thiserror::Error)]
pub enum SqliteError {
    /// The file could not be opened or read.
    #[error("{context}: {source}")]
    Io { context: &'static str, source: std::io::Error },
    /// SQLite refused the database or a query.
    #[error("{context}: {source}")]
    Db { context: String, source: rusqlite::Error },
    /// Not an export, or a table or value not as an export has it.
    #[error("{0}")]
    Format(String),
}

impl From<String> for SqliteError {
    fn from(message: String) -> SqliteError {
        SqliteError::Format(message)
    }
}

/// Reads an Nsight Systems SQLite export: driver memory events, kernels, copies and memsets, with one
/// [`ProfileSource`] saying what was read, which tables were absent or empty, and which rows were unusable.
///
/// Errors (one line, without the path): not an SQLite file, a truncated or corrupt database, an SQLite database with
/// none of the tables read, a table without a column it needs, a value of the wrong type.
pub fn read(path: &Path) -> Result<ProfileData, SqliteError> {
    check_header(path)?;
    let conn = open(path)?;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned());
    read_connection(&conn, name)
}

/// [`read`] of a database held in memory (a member of an archive, a compressed export), named `name`.
pub fn read_bytes(bytes: &[u8], name: &str) -> Result<ProfileData, SqliteError> {
    header_problem(bytes, bytes.len() as u64)?;
    let mut conn = Connection::open_in_memory()
        .map_err(|source| SqliteError::Db { context: "cannot open an SQLite database in memory".into(), source })?;
    conn.deserialize_read_exact(rusqlite::MAIN_DB, bytes, bytes.len(), true)
        .map_err(|source| SqliteError::Db { context: "cannot open as an SQLite database".into(), source })?;
    read_connection(&conn, name.to_string())
}

fn read_connection(conn: &Connection, name: String) -> Result<ProfileData, SqliteError> {
    let tables = table_names(conn)?;
    let has = |t: &str| tables.iter().any(|n| n.eq_ignore_ascii_case(t));
    if !DATA_TABLES.iter().any(|t| has(t)) {
        return Err((not_an_export(&tables)).into());
    }
    let mut source = ProfileSource { name, format: FORMAT.to_string(), ..ProfileSource::default() };
    let mut data = ProfileData::default();
    if has("META_DATA_EXPORT") {
        if let Some(line) = export_version(conn)? {
            source.read.push(line);
        }
    }
    let enums = Enums {
        mem_kind: load_enum(conn, &tables, MEM_KIND_ENUM)?,
        mem_oper: load_enum(conn, &tables, MEM_OPER_ENUM)?,
        memcpy: load_enum(conn, &tables, MEMCPY_ENUM)?,
    };
    let strings = has("StringIds");

    if has(MEMORY_TABLE) {
        let (events, allocs) = read_memory_events(conn, &enums, &mut source)?;
        if events.is_empty() {
            source.skipped.push(format!("{MEMORY_TABLE}: empty (no allocation recorded)"));
        } else {
            source.read.push(format!(
                "{MEMORY_TABLE}: {} allocation events ({allocs} allocation{}, {} free{})",
                events.len(),
                plural(allocs),
                events.len() - allocs,
                plural(events.len() - allocs),
            ));
        }
        data.memory_events = events;
    } else {
        source.skipped.push(format!(
            "{MEMORY_TABLE}: absent — capture with `nsys profile --cuda-memory-usage=true` to record allocations"
        ));
    }

    let mut trace = Vec::new();
    let parts: [(&str, &str, &str, &str); 3] = [
        (KERNEL_TABLE, "kernel", "kernels", "no CUDA kernel was traced (capture with `nsys profile --trace=cuda`)"),
        (MEMCPY_TABLE, "memory copy", "memory copies", "no memory copy was traced"),
        (MEMSET_TABLE, "memset", "memsets", "no memset was traced"),
    ];
    for (table, one, many, absent) in parts {
        if !has(table) {
            source.skipped.push(format!("{table}: absent — {absent}"));
            continue;
        }
        let before = trace.len();
        match table {
            KERNEL_TABLE => read_kernels(conn, strings, &mut trace, &mut source)?,
            MEMCPY_TABLE => read_memcpys(conn, &enums, &mut trace, &mut source)?,
            _ => read_memsets(conn, &enums, &mut trace, &mut source)?,
        }
        let n = trace.len() - before;
        if n == 0 {
            source.skipped.push(format!("{table}: empty"));
        } else {
            source.read.push(format!("{table}: {n} {}", if n == 1 { one } else { many }));
        }
    }
    trace.sort_by_key(|o: &GpuOp| o.start_ns);
    data.gpu_trace = trace;
    data.sources.push(source);
    Ok(data)
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The file

/// Checks the SQLite header before SQLite sees the file, to say plainly what the file is when it is not a database,
/// and to catch a database cut short (SQLite would only find that when a query reaches the missing pages).
fn check_header(path: &Path) -> Result<(), SqliteError> {
    let io = |context: &'static str| move |source| SqliteError::Io { context, source };
    let mut file = File::open(path).map_err(io("cannot open"))?;
    let len = file.metadata().map_err(io("cannot read"))?.len();
    let mut head = Vec::with_capacity(HEADER_LEN);
    file.by_ref().take(HEADER_LEN as u64).read_to_end(&mut head).map_err(io("cannot read"))?;
    header_problem(&head, len)
}

/// What is wrong with a database of `len` bytes starting `head` (its first `HEADER_LEN` bytes, or all of it).
fn header_problem(head: &[u8], len: u64) -> Result<(), SqliteError> {
    let head = &head[..head.len().min(HEADER_LEN)];
    const EXPECTED: &str = "an SQLite database (`nsys export --type sqlite`), which starts with \"SQLite format 3\\0\"";
    if head.is_empty() {
        return Err((format!("expected {EXPECTED}, found an empty file")).into());
    }
    if !sniff(head) {
        return Err((format!("not an SQLite database: expected {EXPECTED}, found {}", describe_start(head))).into());
    }
    if head.len() < HEADER_LEN {
        return Err((format!(
            "truncated SQLite database: the file ends at byte {} inside the {HEADER_LEN}-byte header",
            head.len()
        ))
        .into());
    }
    let page_size = match u16::from_be_bytes([head[16], head[17]]) {
        1 => 65536u64,
        n => u64::from(n),
    };
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return Err((format!(
            "corrupt SQLite database: the header gives a page size of {page_size} bytes (a power of two from 512 to \
             65536 expected)"
        ))
        .into());
    }
    let be32 = |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    // The page count in the header is valid when the change counter matches "version-valid-for".
    let pages = u64::from(be32(28));
    if pages > 0 && be32(24) == be32(92) && pages * page_size > len {
        return Err((format!(
            "truncated SQLite database: the header says {pages} pages of {page_size} bytes ({} bytes), the file has \
             {len} bytes",
            pages * page_size
        ))
        .into());
    }
    if !len.is_multiple_of(page_size) {
        return Err((format!(
            "truncated or corrupt SQLite database: {len} bytes is not a whole number of {page_size}-byte pages"
        ))
        .into());
    }
    Ok(())
}

/// The first bytes of a file, for an error: as text when they read as text, else in hex.
fn describe_start(head: &[u8]) -> String {
    let shown = &head[..head.len().min(16)];
    if let Ok(text) = std::str::from_utf8(head) {
        if text.chars().all(|c| !c.is_control() || c.is_ascii_whitespace()) {
            let t: String = text.chars().take(40).collect();
            return format!("text starting {t:?}");
        }
    }
    let hex: Vec<String> = shown.iter().map(|b| format!("{b:02x}")).collect();
    let ascii: String =
        shown.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
    format!("bytes {} ('{ascii}')", hex.join(" "))
}

/// Opens the database read-only and immutable: SQLite takes no lock and writes nothing beside the file.
fn open(path: &Path) -> Result<Connection, SqliteError> {
    let uri = format!("file:{}?immutable=1", uri_path(path));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    Connection::open_with_flags(&uri, flags)
        .map_err(|source| SqliteError::Db { context: "cannot open as an SQLite database".into(), source })
}

/// The absolute path, percent-encoded for an SQLite `file:` URI.
fn uri_path(path: &Path) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        abs.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = {
        let s = abs.to_string_lossy().replace('\\', "/");
        if s.starts_with('/') {
            s.into_bytes()
        } else {
            format!("/{s}").into_bytes()
        }
    };
    let mut out = String::with_capacity(bytes.len() + 8);
    // `//` before the path: an empty authority, so that a path starting with `//` is not read as one.
    out.push_str("//");
    for b in bytes {
        if b.is_ascii_alphanumeric() || b"/-._~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn table_names(conn: &Connection) -> Result<Vec<String>, SqliteError> {
    let sql = "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') ORDER BY name";
    let db_err = |source| SqliteError::Db { context: "not a readable SQLite database".into(), source };
    let mut stmt = conn.prepare(sql).map_err(db_err)?;
    let mut rows = stmt.query([]).map_err(db_err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        if let ValueRef::Text(t) = row.get_ref(0).map_err(db_err)? {
            out.push(String::from_utf8_lossy(t).into_owned());
        }
    }
    Ok(out)
}

fn not_an_export(tables: &[String]) -> String {
    let looked = DATA_TABLES.join(", ");
    let nsys_marks = ["StringIds", "META_DATA_EXPORT", "TARGET_INFO_GPU", MEM_KIND_ENUM];
    if tables.iter().any(|t| nsys_marks.iter().any(|m| t.eq_ignore_ascii_case(m))) {
        return format!(
            "an Nsight Systems export without CUDA data: none of the tables {looked} is present; capture with \
             `nsys profile --trace=cuda --cuda-memory-usage=true`"
        );
    }
    const SHOWN: usize = 8;
    let found = if tables.is_empty() {
        "no table".to_string()
    } else {
        let mut names: Vec<&str> = tables.iter().take(SHOWN).map(String::as_str).collect();
        if tables.len() > SHOWN {
            names.push("…");
        }
        format!("{} table{}: {}", tables.len(), plural(tables.len()), names.join(", "))
    };
    format!("an SQLite database, but not an Nsight Systems export: looked for the tables {looked}, found {found}")
}

fn columns(conn: &Connection, table: &str) -> Result<Vec<String>, String> {
    let err = |e: rusqlite::Error| format!("{table}: cannot read the table's columns: {e}");
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)").map_err(err)?;
    let mut rows = stmt.query([table]).map_err(err)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(err)? {
        if let ValueRef::Text(t) = row.get_ref(0).map_err(err)? {
            out.push(String::from_utf8_lossy(t).into_owned());
        }
    }
    Ok(out)
}

/// A column of a query: read from the table when it has it; a required one missing is an error, an optional one
/// reads as NULL.
struct Col {
    name: &'static str,
    required: bool,
}

const fn req(name: &'static str) -> Col {
    Col { name, required: true }
}

const fn opt(name: &'static str) -> Col {
    Col { name, required: false }
}

/// `rowid` then the columns, in order, as `t."col"` (or `NULL`); the names of those the table lacks.
fn select_list(conn: &Connection, table: &str, cols: &[Col]) -> Result<(String, Vec<&'static str>), String> {
    let have = columns(conn, table)?;
    let mut parts = vec!["t.rowid".to_string()];
    let mut missing = Vec::new();
    for c in cols {
        if have.iter().any(|h| h.eq_ignore_ascii_case(c.name)) {
            parts.push(format!("t.\"{}\"", c.name));
        } else if c.required {
            return Err(format!("{table}: no column `{}` (found: {})", c.name, have.join(", ")));
        } else {
            parts.push("NULL".to_string());
            missing.push(c.name);
        }
    }
    Ok((parts.join(", "), missing))
}

/// Runs `sql` and calls `each` with every row, streaming.
fn for_each_row(
    conn: &Connection,
    table: &str,
    sql: &str,
    mut each: impl FnMut(&Row<'_>) -> Result<(), String>,
) -> Result<(), String> {
    let err = |e: rusqlite::Error| format!("{table}: {e}");
    let mut stmt = conn.prepare(sql).map_err(err)?;
    let mut rows = stmt.query([]).map_err(err)?;
    while let Some(row) = rows.next().map_err(err)? {
        each(row)?;
    }
    Ok(())
}

fn export_version(conn: &Connection) -> Result<Option<String>, String> {
    let have = columns(conn, "META_DATA_EXPORT")?;
    if !["name", "value"].iter().all(|c| have.iter().any(|h| h.eq_ignore_ascii_case(c))) {
        return Ok(None);
    }
    let mut product = None;
    let mut schema = None;
    for_each_row(conn, "META_DATA_EXPORT", "SELECT name, value FROM META_DATA_EXPORT", |row| {
        let text = |i| match row.get_ref(i) {
            Ok(ValueRef::Text(t)) => Some(String::from_utf8_lossy(t).trim().to_string()),
            _ => None,
        };
        match text(0).as_deref() {
            Some("EXPORT_PRODUCT_VERSION") => product = text(1),
            Some("EXPORT_SCHEMA_VERSION") => schema = text(1),
            _ => {}
        }
        Ok(())
    })?;
    Ok(match (product, schema) {
        (None, None) => None,
        (p, s) => Some(format!(
            "META_DATA_EXPORT: nsys {}, export schema {}",
            p.as_deref().unwrap_or("?"),
            s.as_deref().unwrap_or("?")
        )),
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Enums

/// One `ENUM_*` table: value → (symbol name, human label).
#[derive(Debug, Default)]
struct Enum {
    entries: HashMap<i64, (String, String)>,
}

impl Enum {
    /// The human label (`Device`), else the symbol name, else the number as text.
    fn label(&self, v: i64) -> String {
        match self.entries.get(&v) {
            Some((_, label)) if !label.is_empty() => label.clone(),
            Some((name, _)) if !name.is_empty() => name.clone(),
            _ => v.to_string(),
        }
    }

    /// Allocation or free, by the label or name the enum gives the value (`Allocation`/`Deallocation`,
    /// `CUDA_DEV_MEM_EVENT_OPR_ALLOCATION`/`…_DEALLOCATION`); values it does not list by their documented numbers
    /// (0 allocation, 1 deallocation).
    fn memory_op(&self, v: i64) -> Option<DriverMemoryOp> {
        if let Some((name, label)) = self.entries.get(&v) {
            let words = format!("{name} {label}").to_ascii_uppercase();
            if words.contains("DEALLOC") || words.contains("FREE") || words.contains("RELEASE") {
                return Some(DriverMemoryOp::Free);
            }
            if words.contains("ALLOC") {
                return Some(DriverMemoryOp::Alloc);
            }
            return None;
        }
        match v {
            0 => Some(DriverMemoryOp::Alloc),
            1 => Some(DriverMemoryOp::Free),
            _ => None,
        }
    }
}

struct Enums {
    mem_kind: Enum,
    mem_oper: Enum,
    memcpy: Enum,
}

/// Reads an `ENUM_*` table (`id`, `name`, `label`); an absent table, or one without `id`, gives an empty enum.
fn load_enum(conn: &Connection, tables: &[String], table: &'static str) -> Result<Enum, String> {
    if !tables.iter().any(|t| t.eq_ignore_ascii_case(table)) {
        return Ok(Enum::default());
    }
    let have = columns(conn, table)?;
    let has = |c: &str| have.iter().any(|h| h.eq_ignore_ascii_case(c));
    if !has("id") {
        return Ok(Enum::default());
    }
    let pick = |c: &str| if has(c) { format!("\"{c}\"") } else { "NULL".to_string() };
    let sql = format!("SELECT id, {}, {} FROM \"{table}\"", pick("name"), pick("label"));
    let mut e = Enum::default();
    for_each_row(conn, table, &sql, |row| {
        let text = |i| match row.get_ref(i) {
            Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).trim().to_string(),
            _ => String::new(),
        };
        if let Ok(ValueRef::Integer(id)) = row.get_ref(0) {
            e.entries.insert(id, (text(1), text(2)));
        }
        Ok(())
    })?;
    Ok(e)
}

// ---------------------------------------------------------------------------------------------------------------
// Cells

/// Where a value came from, for messages.
#[derive(Clone, Copy)]
struct At {
    table: &'static str,
    rowid: i64,
}

impl At {
    fn line(self) -> usize {
        usize::try_from(self.rowid).unwrap_or(0)
    }

    fn malformed(self, column: &str, expected: &str, found: String) -> Malformed {
        Malformed { line: self.line(), expected: format!("{}.{column}: {expected}", self.table), found }
    }
}

fn describe_value(v: ValueRef<'_>) -> String {
    match v {
        ValueRef::Null => "NULL".to_string(),
        ValueRef::Integer(i) => format!("the integer {i}"),
        ValueRef::Real(r) => format!("the real number {r}"),
        ValueRef::Text(t) => {
            let s = String::from_utf8_lossy(t);
            let shown: String = s.chars().take(60).collect();
            format!("the text {shown:?}{}", if s.chars().count() > 60 { "…" } else { "" })
        }
        ValueRef::Blob(b) => format!("a blob of {} bytes", b.len()),
    }
}

/// An integer cell (`None` for NULL); any other type is an error naming the table, row and column.
fn int(row: &Row<'_>, i: usize, at: At, column: &str) -> Result<Option<i64>, String> {
    let v = row.get_ref(i).map_err(|e| format!("{} rowid {}, column {column}: {e}", at.table, at.rowid))?;
    match v {
        ValueRef::Null => Ok(None),
        ValueRef::Integer(x) => Ok(Some(x)),
        other => Err(format!(
            "{} rowid {}, column {column}: expected an integer, found {}",
            at.table,
            at.rowid,
            describe_value(other)
        )),
    }
}

/// A time, size, device or count: NULL or negative makes the row malformed.
fn non_negative(v: Option<i64>, at: At, column: &str, what: &str) -> Result<u64, Malformed> {
    match v {
        Some(x) if x >= 0 => Ok(x as u64),
        Some(x) => Err(at.malformed(column, what, x.to_string())),
        None => Err(at.malformed(column, what, "NULL".to_string())),
    }
}

/// An optional id (stream, context, correlation): NULL or negative reads as unknown.
fn optional_id(v: Option<i64>) -> Option<u64> {
    v.and_then(|x| u64::try_from(x).ok())
}

/// The PID in an nsys serialized GlobalId (`globalPid / 0x1000000 % 0x1000000`).
fn pid_of_global_id(global_pid: i64) -> u64 {
    ((global_pid as u64) >> 24) & 0x00FF_FFFF
}

/// Text or integer cell as text (`None` for NULL); other types are errors.
fn text_or_int(row: &Row<'_>, i: usize, at: At, column: &str) -> Result<Option<String>, String> {
    let v = row.get_ref(i).map_err(|e| format!("{} rowid {}, column {column}: {e}", at.table, at.rowid))?;
    match v {
        ValueRef::Null => Ok(None),
        ValueRef::Integer(x) => Ok(Some(x.to_string())),
        ValueRef::Text(t) => Ok(Some(String::from_utf8_lossy(t).into_owned())),
        other => Err(format!(
            "{} rowid {}, column {column}: expected text or an integer, found {}",
            at.table,
            at.rowid,
            describe_value(other)
        )),
    }
}

fn rowid(row: &Row<'_>, table: &'static str) -> Result<i64, String> {
    match row.get_ref(0) {
        Ok(ValueRef::Integer(r)) => Ok(r),
        Ok(other) => Err(format!("{table}: expected an integer rowid, found {}", describe_value(other))),
        Err(e) => Err(format!("{table}: {e}")),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Tables

/// `CUDA_GPU_MEMORY_USAGE_EVENTS` in time order, and how many are allocations.
fn read_memory_events(
    conn: &Connection,
    enums: &Enums,
    source: &mut ProfileSource,
) -> Result<(Vec<DriverMemoryEvent>, usize), String> {
    let cols = [
        req("start"),
        opt("globalPid"),
        req("deviceId"),
        req("address"),
        req("bytes"),
        opt("memKind"),
        req("memoryOperationType"),
    ];
    let (list, missing) = select_list(conn, MEMORY_TABLE, &cols)?;
    if missing.contains(&"memKind") {
        source.skipped.push(format!("{MEMORY_TABLE}: no memKind column; memory kinds unknown"));
    }
    let sql = format!("SELECT {list} FROM \"{MEMORY_TABLE}\" AS t");
    let mut events = Vec::new();
    let mut allocs = 0usize;
    for_each_row(conn, MEMORY_TABLE, &sql, |row| {
        let at = At { table: MEMORY_TABLE, rowid: rowid(row, MEMORY_TABLE)? };
        let start = int(row, 1, at, "start")?;
        let global_pid = int(row, 2, at, "globalPid")?;
        let device = int(row, 3, at, "deviceId")?;
        let address = int(row, 4, at, "address")?;
        let bytes = int(row, 5, at, "bytes")?;
        let kind = int(row, 6, at, "memKind")?;
        let oper = int(row, 7, at, "memoryOperationType")?;
        let checked = (|| {
            let time_ns = non_negative(start, at, "start", "a time in ns ≥ 0")?;
            let device = non_negative(device, at, "deviceId", "a device id ≥ 0")? as i64;
            let bytes = non_negative(bytes, at, "bytes", "a byte count ≥ 0")?;
            // Addresses are unsigned 64-bit values stored in SQLite's signed integers: keep the bits.
            let address = address.ok_or_else(|| at.malformed("address", "an address", "NULL".to_string()))? as u64;
            let op = match oper {
                Some(v) => enums.mem_oper.memory_op(v).ok_or_else(|| {
                    at.malformed(
                        "memoryOperationType",
                        "an allocation or a deallocation (ENUM_CUDA_DEV_MEM_EVENT_OPER)",
                        enums.mem_oper.label(v),
                    )
                })?,
                None => {
                    return Err(at.malformed(
                        "memoryOperationType",
                        "an allocation or a deallocation (ENUM_CUDA_DEV_MEM_EVENT_OPER)",
                        "NULL".to_string(),
                    ))
                }
            };
            let mem_kind = kind.map_or_else(|| "unknown".to_string(), |k| enums.mem_kind.label(k));
            Ok(DriverMemoryEvent {
                time_ns,
                device,
                pid: global_pid.map(pid_of_global_id),
                address,
                bytes,
                op,
                mem_kind,
            })
        })();
        match checked {
            Ok(ev) => {
                allocs += usize::from(ev.op == DriverMemoryOp::Alloc);
                events.push(ev);
            }
            Err(m) => source.malformed.push(m),
        }
        Ok(())
    })?;
    events.sort_by_key(|e| e.time_ns);
    Ok((events, allocs))
}

/// Start, duration, device, context, stream and correlation of a trace row (selected columns 1 to 6, after the
/// rowid: start, end, deviceId, contextId, streamId, correlationId).
struct Common {
    start_ns: u64,
    duration_ns: u64,
    device_id: i64,
    context: Option<u64>,
    stream: Option<u64>,
    correlation_id: Option<u64>,
}

const COMMON_COLS: [Col; 6] =
    [req("start"), req("end"), req("deviceId"), opt("contextId"), opt("streamId"), opt("correlationId")];

/// Reads the common columns (selected at 1..=6); `Ok(Err(_))` for a malformed row.
fn common(row: &Row<'_>, at: At) -> Result<Result<Common, Malformed>, String> {
    let start = int(row, 1, at, "start")?;
    let end = int(row, 2, at, "end")?;
    let device = int(row, 3, at, "deviceId")?;
    let context = int(row, 4, at, "contextId")?;
    let stream = int(row, 5, at, "streamId")?;
    let correlation = int(row, 6, at, "correlationId")?;
    Ok((|| {
        let start_ns = non_negative(start, at, "start", "a time in ns ≥ 0")?;
        let end_ns = non_negative(end, at, "end", "a time in ns ≥ start")?;
        if end_ns < start_ns {
            return Err(at.malformed("end", "a time in ns ≥ start", format!("{end_ns} < start {start_ns}")));
        }
        let device_id = non_negative(device, at, "deviceId", "a device id ≥ 0")? as i64;
        Ok(Common {
            start_ns,
            duration_ns: end_ns - start_ns,
            device_id,
            context: optional_id(context),
            stream: optional_id(stream),
            correlation_id: optional_id(correlation),
        })
    })())
}

fn gpu_op(c: Common, name: String, kind: GpuOpKind, line: usize) -> GpuOp {
    GpuOp {
        start_ns: c.start_ns,
        duration_ns: c.duration_ns,
        correlation_id: c.correlation_id,
        name,
        kind,
        bytes: None,
        device: None,
        device_id: Some(c.device_id),
        context: c.context,
        stream: c.stream,
        grid: None,
        block: None,
        src_kind: None,
        dst_kind: None,
        line,
        capture: 0,
    }
}

fn read_kernels(
    conn: &Connection,
    strings: bool,
    trace: &mut Vec<GpuOp>,
    source: &mut ProfileSource,
) -> Result<(), String> {
    let mut cols: Vec<Col> = COMMON_COLS.into_iter().collect();
    cols.extend([
        opt("gridX"),
        opt("gridY"),
        opt("gridZ"),
        opt("blockX"),
        opt("blockY"),
        opt("blockZ"),
        opt("demangledName"),
        opt("shortName"),
    ]);
    let (list, missing) = select_list(conn, KERNEL_TABLE, &cols)?;
    if missing.contains(&"demangledName") && missing.contains(&"shortName") {
        return Err(format!("{KERNEL_TABLE}: no column `demangledName` (nor `shortName`): kernels have no name"));
    }
    let sql = if strings {
        format!(
            "SELECT {list}, d.value, s.value FROM \"{KERNEL_TABLE}\" AS t LEFT JOIN StringIds AS d ON d.id = {} \
             LEFT JOIN StringIds AS s ON s.id = {}",
            if missing.contains(&"demangledName") { "NULL" } else { "t.\"demangledName\"" },
            if missing.contains(&"shortName") { "NULL" } else { "t.\"shortName\"" },
        )
    } else {
        format!("SELECT {list}, NULL, NULL FROM \"{KERNEL_TABLE}\" AS t")
    };
    for_each_row(conn, KERNEL_TABLE, &sql, |row| {
        let at = At { table: KERNEL_TABLE, rowid: rowid(row, KERNEL_TABLE)? };
        let c = common(row, at)?;
        let mut dims = [None; 6];
        for (k, name) in ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"].into_iter().enumerate() {
            dims[k] = int(row, 7 + k, at, name)?;
        }
        let demangled_id = text_or_int(row, 13, at, "demangledName")?;
        let short_id = text_or_int(row, 14, at, "shortName")?;
        let demangled = text_or_int(row, 15, at, "StringIds.value")?.filter(|s| !s.trim().is_empty());
        let short = text_or_int(row, 16, at, "StringIds.value")?.filter(|s| !s.trim().is_empty());
        let c = match c {
            Ok(c) => c,
            Err(m) => {
                source.malformed.push(m);
                return Ok(());
            }
        };
        let dim = |x: Option<i64>, y: Option<i64>, z: Option<i64>, what: &str| -> Result<Option<Dim3>, Malformed> {
            match (x, y, z) {
                (Some(x), Some(y), Some(z)) => {
                    let f = |v: i64, axis: &str| {
                        u64::try_from(v)
                            .map_err(|_| at.malformed(&format!("{what}{axis}"), "a dimension ≥ 0", v.to_string()))
                    };
                    Ok(Some(Dim3 { x: f(x, "X")?, y: f(y, "Y")?, z: f(z, "Z")? }))
                }
                _ => Ok(None),
            }
        };
        let (grid, block) = match (dim(dims[0], dims[1], dims[2], "grid"), dim(dims[3], dims[4], dims[5], "block")) {
            (Ok(g), Ok(b)) => (g, b),
            (Err(m), _) | (_, Err(m)) => {
                source.malformed.push(m);
                return Ok(());
            }
        };
        // A name column holding text (not a StringIds id) is the name itself.
        let is_id = |s: &Option<String>| s.as_deref().is_some_and(|s| s.parse::<i64>().is_ok());
        let raw = |s: Option<String>| if is_id(&s) { None } else { s.filter(|s| !s.trim().is_empty()) };
        let unresolved = |s: &Option<String>| s.clone().filter(|_| is_id(s));
        let name =
            demangled.or_else(|| raw(demangled_id.clone())).or(short).or_else(|| raw(short_id.clone())).unwrap_or_else(
                || match unresolved(&demangled_id).or_else(|| unresolved(&short_id)) {
                    Some(id) => format!("<kernel name: StringIds id {id} not found>"),
                    None => "<unnamed kernel>".to_string(),
                },
            );
        let mut op = gpu_op(c, name, GpuOpKind::Kernel, at.line());
        op.grid = grid;
        op.block = block;
        trace.push(op);
        Ok(())
    })
}

fn read_memcpys(
    conn: &Connection,
    enums: &Enums,
    trace: &mut Vec<GpuOp>,
    source: &mut ProfileSource,
) -> Result<(), String> {
    let mut cols: Vec<Col> = COMMON_COLS.into_iter().collect();
    cols.extend([req("bytes"), req("copyKind"), opt("srcKind"), opt("dstKind")]);
    let (list, _) = select_list(conn, MEMCPY_TABLE, &cols)?;
    let sql = format!("SELECT {list} FROM \"{MEMCPY_TABLE}\" AS t");
    for_each_row(conn, MEMCPY_TABLE, &sql, |row| {
        let at = At { table: MEMCPY_TABLE, rowid: rowid(row, MEMCPY_TABLE)? };
        let c = common(row, at)?;
        let bytes = int(row, 7, at, "bytes")?;
        let copy_kind = int(row, 8, at, "copyKind")?;
        let src = int(row, 9, at, "srcKind")?;
        let dst = int(row, 10, at, "dstKind")?;
        let checked = c.and_then(|c| {
            let bytes = non_negative(bytes, at, "bytes", "a byte count ≥ 0")?;
            let kind = copy_kind
                .ok_or_else(|| at.malformed("copyKind", "a copy kind (ENUM_CUDA_MEMCPY_OPER)", "NULL".to_string()))?;
            Ok((c, bytes, kind))
        });
        let (c, bytes, kind) = match checked {
            Ok(x) => x,
            Err(m) => {
                source.malformed.push(m);
                return Ok(());
            }
        };
        let name = format!("[CUDA memcpy {}]", enums.memcpy.label(kind));
        let op_kind = GpuOpKind::from_name(&name);
        let mut op = gpu_op(c, name, op_kind, at.line());
        op.bytes = Some(bytes);
        op.src_kind = src.map(|k| enums.mem_kind.label(k));
        op.dst_kind = dst.map(|k| enums.mem_kind.label(k));
        trace.push(op);
        Ok(())
    })
}

fn read_memsets(
    conn: &Connection,
    enums: &Enums,
    trace: &mut Vec<GpuOp>,
    source: &mut ProfileSource,
) -> Result<(), String> {
    let mut cols: Vec<Col> = COMMON_COLS.into_iter().collect();
    cols.extend([req("bytes"), opt("memKind")]);
    let (list, _) = select_list(conn, MEMSET_TABLE, &cols)?;
    let sql = format!("SELECT {list} FROM \"{MEMSET_TABLE}\" AS t");
    for_each_row(conn, MEMSET_TABLE, &sql, |row| {
        let at = At { table: MEMSET_TABLE, rowid: rowid(row, MEMSET_TABLE)? };
        let c = common(row, at)?;
        let bytes = int(row, 7, at, "bytes")?;
        let kind = int(row, 8, at, "memKind")?;
        let checked = c.and_then(|c| Ok((c, non_negative(bytes, at, "bytes", "a byte count ≥ 0")?)));
        let (c, bytes) = match checked {
            Ok(x) => x,
            Err(m) => {
                source.malformed.push(m);
                return Ok(());
            }
        };
        let name = "[CUDA memset]".to_string();
        let mut op = gpu_op(c, name, GpuOpKind::Memset, at.line());
        op.bytes = Some(bytes);
        op.dst_kind = kind.map(|k| enums.mem_kind.label(k));
        trace.push(op);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem_kind_enum() -> Enum {
        let mut e = Enum::default();
        e.entries.insert(1, ("CUDA_MEMOPR_MEMORY_KIND_PINNED".into(), "Pinned".into()));
        e.entries.insert(2, ("CUDA_MEMOPR_MEMORY_KIND_DEVICE".into(), "Device".into()));
        e.entries.insert(5, ("CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC".into(), String::new()));
        e
    }

    #[test]
    fn enum_labels() {
        let e = mem_kind_enum();
        assert_eq!(e.label(2), "Device");
        assert_eq!(e.label(1), "Pinned");
        // No label: the symbol name; not listed: the number.
        assert_eq!(e.label(5), "CUDA_MEMOPR_MEMORY_KIND_DEVICE_STATIC");
        assert_eq!(e.label(42), "42");
        assert_eq!(Enum::default().label(2), "2");
    }

    #[test]
    fn memory_operations() {
        let mut e = Enum::default();
        // Without the enum table: the documented numbers.
        assert_eq!(e.memory_op(0), Some(DriverMemoryOp::Alloc));
        assert_eq!(e.memory_op(1), Some(DriverMemoryOp::Free));
        assert_eq!(e.memory_op(2), None);
        // With it: by name or label, whatever the numbers.
        e.entries.insert(14, ("CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION".into(), String::new()));
        e.entries.insert(15, (String::new(), "Allocation".into()));
        e.entries.insert(16, ("SOMETHING_ELSE".into(), "Other".into()));
        assert_eq!(e.memory_op(14), Some(DriverMemoryOp::Free));
        assert_eq!(e.memory_op(15), Some(DriverMemoryOp::Alloc));
        assert_eq!(e.memory_op(16), None);
        assert_eq!(e.memory_op(0), Some(DriverMemoryOp::Alloc));
    }

    #[test]
    fn global_pid() {
        // A local capture: hardware id 1 in the top byte, the PID in bits 24..47.
        let g = (1i64 << 56) | (48213i64 << 24);
        assert_eq!(pid_of_global_id(g), 48213);
        // The documented formula, globalPid / 0x1000000 % 0x1000000.
        assert_eq!(pid_of_global_id(g), (g / 0x100_0000 % 0x100_0000) as u64);
        assert_eq!(pid_of_global_id(0), 0);
        assert_eq!(pid_of_global_id(0xFFFF_FFFF << 24), 0xFF_FFFF);
        // The top bit set (a negative i64) does not leak into the PID.
        assert_eq!(pid_of_global_id(i64::MIN | (7 << 24) | 0xFF_FFFF), 7);
    }

    #[test]
    fn header_sniff() {
        assert!(sniff(b"SQLite format 3\0\x10\x00"));
        assert!(!sniff(b"SQLite format 3"));
        assert!(!sniff(b"\x80\x02}q"));
        assert!(!sniff(b""));
    }

    #[test]
    fn start_described() {
        assert_eq!(describe_start(b"hello, world\n"), "text starting \"hello, world\\n\"");
        assert_eq!(describe_start(&[0x80, 0x02, b'}', b'q']), "bytes 80 02 7d 71 ('..}q')");
    }

    #[test]
    fn uri_paths_are_encoded() {
        let u = uri_path(Path::new("/tmp/a b?c#d%e.sqlite"));
        assert!(u.ends_with("/tmp/a%20b%3Fc%23d%25e.sqlite"), "{u}");
        assert!(u.starts_with("///"), "{u}");
    }
}
