//! A safe, streaming, non-executing pickle reader.
//!
//! Pickles are programs for a small stack machine; Python's `pickle.load` will import and call anything a file
//! names. This reader implements only the data opcodes: every opcode that would import a name or call an object
//! (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID, BINPERSID, EXT1/2/4) and the
//! out-of-band buffer opcodes are refused with the opcode's name and byte offset.
//!
//! Two things make it fast and frugal on multi-GB memory snapshots:
//! - the input is streamed through a fixed buffer, never held whole;
//! - a [`Builder`] sees each dict and list the moment its items are complete and may replace it by a compact
//!   value of its own ([`Value::Custom`]) — the snapshot reader turns frame dicts into interned frame ids and trace
//!   entries into plain structs, so no generic tree of millions of small dicts is ever built;
//! - dicts the builder calls records (trace entries) are streamed to it field by field, and once a record's byte
//!   layout is known, later records with the same layout are read at fixed offsets (`RecordShapes`); a list of
//!   consecutive records is kept as a run of their numbers. Every fast path gives up to the generic machine on
//!   anything it does not expect, and the generic machine is the one that reports errors.
//!
//! Memo references share values (an `Rc` clone, or a copy of a small inline value), never deep copies, so a
//! "billion laughs" pickle costs memory linear in its size. Container nesting is capped.

use std::cell::RefCell;
use std::io::Read;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::timeline::stacks::{StrId, Strings};

mod builder;
mod fast_path;
mod input;
mod machine;
mod memo;
mod records;
mod split;
mod value;

pub use builder::{Builder, PlainBuilder};
use fast_path::*;
use input::*;
use machine::*;
use memo::*;
use records::*;
use split::*;
pub use split::{Reopen, SplitSource, SplitStats};
pub use value::{dict_get, holds_gap, Dict, List, ListItems, Run, Tuple, Value, GAP};

/// Containers nested deeper than this are refused. A memory snapshot nests at most ~8 levels.
pub const MAX_DEPTH: u32 = 256;
/// The pickler emits list/dict items in batches of this size; a container closed with a full batch may receive more.
const BATCH: usize = 1000;
const NO_SLOT: u32 = u32::MAX;
const BUF_SIZE: usize = 1 << 20;
/// The fast path only looks at what is already buffered; it tops the buffer up to this much first.
const FAST_WINDOW: usize = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error("the file is empty; expected a pickle (it starts with byte 0x80, the PROTO opcode)")]
    Empty,
    #[error("byte 0: expected a pickle (first byte 0x80, the PROTO opcode), found {found}; this is not a pickle file")]
    NotAPickle { found: String },
    #[error(
        "byte {offset}: opcode {name} (0x{op:02x}) would import or call Python code; oomdoc never executes a \
         pickle, and a genuine memory snapshot holds only plain data"
    )]
    Forbidden { offset: u64, op: u8, name: &'static str },
    #[error("byte {offset}: unknown pickle opcode 0x{op:02x}; the file is corrupt or not a pickle")]
    UnknownOpcode { offset: u64, op: u8 },
    #[error("the file ends at byte {offset} inside {what}: it is truncated")]
    Truncated { offset: u64, what: &'static str },
    #[error("byte {offset}: {message}")]
    Malformed { offset: u64, message: String },
    #[error(
        "byte {offset}: containers nested more than {MAX_DEPTH} levels deep (a memory snapshot nests fewer than \
         10); refusing a corrupt or hostile pickle"
    )]
    TooDeep { offset: u64 },
    #[error("read error at byte {offset}: {source}")]
    Io { offset: u64, source: std::io::Error },
}

/// What [`read`] returns: the top-level value and the string table its `Str` values index.
pub struct Parsed {
    pub value: Value,
    pub strings: Strings,
    pub protocol: u8,
    pub bytes_read: u64,
    /// What a helper thread read, when one did (see [`read_split`]).
    pub split: Option<SplitStats>,
    /// How many records the fast routes read.
    pub routes: Routes,
}

/// How many records (dicts a [`Builder`] took as records) each fast route read: at fixed offsets from a learnt byte
/// layout, or field by field as a streamed record. Records neither could read went through the generic machine;
/// the builder counts those. A record whose enclosing container was given up counts only on the route that read it
/// again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    pub layout: u64,
    pub streamed: u64,
}

impl Routes {
    fn add(&mut self, o: Routes) {
        self.layout += o.layout;
        self.streamed += o.streamed;
    }
}

/// Reads one pickle from `src`, handing closed containers to `builder`.
pub fn read<R: Read, B: Builder>(
    src: R,
    builder: &mut B,
    strings: Strings,
    progress: Option<Box<dyn FnMut(u64)>>,
) -> Result<Parsed, PickleError> {
    read_split(src, builder, strings, progress, None)
}

/// [`read`], with a way to open the same pickle again at an offset: a long list of records may then be read in
/// two parts at once, the later one on a helper thread (see `split`). The result is the same either way.
pub fn read_split<R: Read, B: Builder>(
    src: R,
    builder: &mut B,
    strings: Strings,
    progress: Option<Box<dyn FnMut(u64)>>,
    split: Option<SplitSource>,
) -> Result<Parsed, PickleError> {
    let mut input = Input::new(src);
    input.progress = progress;
    if !input.fill(2)? {
        if input.end == 0 {
            return Err(PickleError::Empty);
        }
        return Err(PickleError::NotAPickle { found: describe_byte(input.buf[0]) });
    }
    if input.buf[0] != 0x80 {
        return Err(PickleError::NotAPickle { found: describe_byte(input.buf[0]) });
    }
    let protocol = input.buf[1];
    if protocol > 5 {
        return Err(PickleError::Malformed {
            offset: 1,
            message: format!("pickle protocol {protocol} is newer than any known (0–5)"),
        });
    }
    let mut memo = Memo::default();
    // The guess is one entry per 48 bytes; a real trace stores 2–3 slots per entry of 80–300 bytes. Room for two
    // per guessed entry spares the copy of a table that outgrows its first reservation (at a split's join, say), and
    // costs address space only: what is backed up front stays one per guessed entry. (Room for three raised the
    // unshared file's peak RSS by 45 MB, through its huge pages.)
    let expected = builder.expected_records();
    memo.slots.reserve(expected.saturating_mul(2));
    crate::huge_pages::advise(&memo.slots);
    crate::huge_pages::populate_soon(&memo.slots, expected * 4);
    let mut m = Machine {
        stack: Vec::with_capacity(64),
        marks: Vec::new(),
        memo,
        strings,
        builder,
        scratch: Vec::new(),
        spans: SpanCache::default(),
        refs: FxHashMap::default(),
        refs_len: 0,
        records: RecordShapes::default(),
        fast_error: None,
        // Protocols before 4 number memo stores in the file (BINPUT), which a helper cannot follow.
        split_check_at: split.as_ref().filter(|_| protocol >= 4).map_or(u64::MAX, |s| s.len / FORK_AT),
        split: split.map(|s| Box::new(Split::new(s))),
        batch_stop: 0,
        split_stats: None,
        routes: Routes::default(),
    };
    let value = m.run(&mut input)?;
    if m.memo.overflow {
        return Err(PickleError::Malformed {
            offset: input.offset(),
            message: "more than 2^30 memo entries; this reader's limit".into(),
        });
    }
    Ok(Parsed {
        value,
        strings: m.strings,
        protocol,
        bytes_read: input.offset(),
        split: m.split_stats,
        routes: m.routes,
    })
}

fn describe_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("0x{b:02x} ('{}')", b as char)
    } else {
        format!("0x{b:02x}")
    }
}

fn forbidden_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        _ => return None,
    })
}

fn len8<R: Read>(input: &mut Input<R>, what: &'static str) -> Result<usize, PickleError> {
    let off = input.offset();
    let b = input.take(8, what)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    usize::try_from(u64::from_le_bytes(a))
        .map_err(|_| PickleError::Malformed { offset: off, message: format!("{what}: length does not fit") })
}

#[inline]
fn long_value(b: &[u8]) -> Value {
    if b.len() <= 8 {
        return Value::Int(small_long(b));
    }
    Value::BigInt(Rc::new(b.to_vec()))
}

/// A little-endian two's complement int of at most 8 bytes (LONG1's encoding; no bytes is 0). Built in a
/// register: copying a variable number of bytes into an array and loading it back stalls on store forwarding.
#[inline]
fn small_long(b: &[u8]) -> i64 {
    debug_assert!(b.len() <= 8);
    if b.is_empty() {
        return 0;
    }
    let mut v = 0u64;
    for (i, &x) in b.iter().enumerate() {
        v |= (x as u64) << (8 * i);
    }
    let shift = 64 - 8 * b.len() as u32;
    ((v << shift) as i64) >> shift
}

fn text_int(line: &[u8]) -> Option<Value> {
    let s = std::str::from_utf8(line).ok()?.trim().trim_end_matches('L');
    match s {
        "00" => return Some(Value::Bool(false)),
        "01" => return Some(Value::Bool(true)),
        _ => {}
    }
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::Int(i));
    }
    // Wider than i64: keep it only if it fits u64 (the sole case a snapshot could need).
    let u: u64 = s.parse().ok()?;
    let mut bytes = u.to_le_bytes().to_vec();
    bytes.push(0);
    Some(Value::BigInt(Rc::new(bytes)))
}

fn text_index(line: &[u8]) -> Option<u32> {
    std::str::from_utf8(line).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Parsed, PickleError> {
        read(bytes, &mut PlainBuilder, Strings::default(), None)
    }

    #[test]
    fn values_stay_small() {
        // The memo holds one Value per memoized object: millions in a big snapshot.
        assert_eq!(std::mem::size_of::<Value>(), 16);
    }

    #[test]
    fn reads_scalars_and_wide_ints() {
        // 0x80 0x04 LONG1 9 bytes = 2**64 - 1, STOP
        let mut p = vec![0x80, 4, 0x8a, 9];
        p.extend_from_slice(&[0xff; 8]);
        p.push(0);
        p.push(b'.');
        let v = parse(&p).unwrap().value;
        assert_eq!(v.as_u64(), Some(u64::MAX));
        // negative LONG1
        let v = parse(&[0x80, 2, 0x8a, 1, 0xff, b'.']).unwrap().value;
        assert_eq!(v.as_i64(), Some(-1));
        // 17-byte integer, too wide for u64
        let mut p = vec![0x80, 4, 0x8a, 17];
        p.extend_from_slice(&[1; 17]);
        p.push(b'.');
        let v = parse(&p).unwrap().value;
        assert!(matches!(v, Value::BigInt(_)) && v.as_u64().is_none());
    }

    #[test]
    fn small_longs_of_every_width_sign_extend() {
        for v in [0i64, 1, -1, 127, -128, 128, -129, 1 << 40, -(1 << 40), i64::MAX, i64::MIN] {
            let b = v.to_le_bytes();
            // The narrowest two's complement encoding, and every wider one.
            let mut n = 8;
            while n > 1 && ((b[n - 1] == 0 && b[n - 2] & 0x80 == 0) || (b[n - 1] == 0xff && b[n - 2] & 0x80 != 0)) {
                n -= 1;
            }
            for w in n..=8 {
                assert_eq!(small_long(&b[..w]), v, "{v} in {w} bytes");
            }
        }
        assert_eq!(small_long(&[]), 0);
    }

    #[test]
    fn invalid_utf8_is_decoded_leniently() {
        let p = [0x80, 4, 0x8c, 3, b'a', 0xff, b'b', b'.'];
        let parsed = parse(&p).unwrap();
        let id = parsed.value.as_str_id().unwrap();
        assert_eq!(parsed.strings.get(id), "a\u{fffd}b");
    }

    #[test]
    fn memo_shares_rather_than_copies() {
        // [L, L] where L = [1] memoized: both items are the same Rc.
        let p = [0x80, 4, b']', 0x94, b'(', b']', 0x94, b'K', 1, b'a', b'h', 1, b'e', b'.'];
        let v = parse(&p).unwrap().value;
        let items = v.list_items().unwrap();
        match (&items[0], &items[1]) {
            (Value::List(a), Value::List(b)) => assert!(Rc::ptr_eq(a, b)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn refuses_code_execution_opcodes() {
        let p = b"\x80\x02cos\nsystem\nq\x00X\x0a\x00\x00\x00echo pwnedq\x01\x85q\x02Rq\x03.";
        let e = parse(p).err().unwrap();
        assert!(matches!(e, PickleError::Forbidden { name: "GLOBAL", offset: 2, .. }), "{e}");
    }

    #[test]
    fn truncation_is_reported_with_offset() {
        let e = parse(&[0x80, 4, 0x8c, 10, b'a']).err().unwrap();
        assert!(matches!(e, PickleError::Truncated { offset: 5, .. }), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let mut p = vec![0x80, 4];
        p.extend(std::iter::repeat_n(b']', 10_000));
        p.extend(std::iter::repeat_n(b'a', 9_999));
        p.push(b'.');
        let e = parse(&p).err().unwrap();
        assert!(matches!(e, PickleError::TooDeep { .. }), "{e}");
    }

    fn render(v: &Value, strings: &Strings) -> String {
        let items = |xs: &[Value]| xs.iter().map(|x| render(x, strings)).collect::<Vec<_>>();
        match v {
            Value::Int(i) => i.to_string(),
            Value::Str(id) => format!("'{}'", strings.get(*id)),
            Value::Dict(_) | Value::PendingDict(_) => {
                let kv = items(&v.dict_items().unwrap());
                format!("{{{}}}", kv.chunks(2).map(|p| format!("{}: {}", p[0], p[1])).collect::<Vec<_>>().join(", "))
            }
            _ => format!("[{}]", items(&v.list_items().expect("a list")).join(", ")),
        }
    }

    #[test]
    fn empty_containers_close_where_python_puts_them() {
        // Written by Python 3's pickle.dumps(…, protocol=4). An empty list is followed by what closes or extends
        // its parent (SETITEMS, SETITEM, APPENDS, APPEND) or by the parent's next item; torch writes the first
        // for every trace entry with no Python frame (`'frames': []` last in the entry dict).
        let cases: [(&[u8], &str); 3] = [
            (
                &[
                    128, 4, 149, 31, 0, 0, 0, 0, 0, 0, 0, 125, 148, 40, 140, 1, 97, 148, 93, 148, 140, 1, 98, 148, 93,
                    148, 40, 93, 148, 125, 148, 93, 148, 101, 140, 1, 99, 148, 125, 148, 117, 46,
                ],
                "{'a': [], 'b': [[], {}, []], 'c': {}}",
            ),
            (
                &[
                    128, 4, 149, 19, 0, 0, 0, 0, 0, 0, 0, 93, 148, 40, 93, 148, 93, 148, 93, 148, 97, 125, 148, 93,
                    148, 125, 148, 97, 101, 46,
                ],
                "[[], [[]], {}, [{}]]",
            ),
            (
                &[128, 4, 149, 13, 0, 0, 0, 0, 0, 0, 0, 125, 148, 140, 1, 107, 148, 93, 148, 93, 148, 97, 115, 46],
                "{'k': [[]]}",
            ),
        ];
        for (bytes, want) in cases {
            let parsed = parse(bytes).unwrap();
            assert_eq!(render(&parsed.value, &parsed.strings), want);
        }
    }

    #[test]
    fn a_closed_empty_list_referenced_again_is_one_list() {
        // `{'a': []}` with the list in memo slot 3, closed by SETITEM (so the fast path keeps it in its slot word),
        // then two references to slot 3 with an APPEND between them: both are the same list.
        let p = [
            128, 4, b']', 148, b'(', b'}', 148, 140, 1, b'a', 148, b']', 148, b's', b'h', 3, b'K', 5, b'a', b'h', 3,
            b'e', b'.',
        ];
        let parsed = parse(&p).unwrap();
        let items = parsed.value.list_items().expect("a list");
        assert_eq!(items.len(), 3);
        assert_eq!(render(&items[1], &parsed.strings), "[5]");
        assert_eq!(render(&items[2], &parsed.strings), "[5]");
    }

    /// Refuses any dict holding the key 'bad': a snapshot builder refusing a malformed trace entry.
    struct Refusing;

    impl Builder for Refusing {
        fn close_dict(&mut self, strings: &Strings, items: &[Value]) -> Result<Option<Value>, String> {
            match items.iter().step_by(2).any(|k| matches!(k, Value::Str(id) if strings.get(*id) == "bad")) {
                true => Err("a bad dict".into()),
                false => Ok(None),
            }
        }
        fn close_list(&mut self, _: &[Value]) -> Option<Value> {
            None
        }
    }

    #[test]
    fn a_builder_refusing_a_dict_on_the_fast_path_stops_the_read_there() {
        // [{'ok': 1}, [{'bad': 2}]]: the refused dict is nested in a list the fast path reads whole. Its error is
        // the read's, at the byte past the dict's SETITEM where the fast path met it (the generic machine would
        // name the SETITEM itself, byte 27), and the dicts before it are read as usual.
        let p = [
            128, 4, b']', 148, b'(', b'}', 148, 140, 2, b'o', b'k', 148, b'K', 1, b's', b']', 148, b'}', 148, 140, 3,
            b'b', b'a', b'd', 148, b'K', 2, b's', b'a', b'e', b'.',
        ];
        let e = read(&p[..], &mut Refusing, Strings::default(), None).err().expect("refused");
        assert!(matches!(&e, PickleError::Malformed { offset: 28, message } if message == "a bad dict"), "{e}");
        let mut ok = p;
        ok[21] = b'x';
        assert!(read(&ok[..], &mut Refusing, Strings::default(), None).is_ok());
    }

    #[test]
    fn sparse_memo_index_costs_one_entry() {
        // LONG_BINPUT 0xFFFFFFF0 then LONG_BINGET it.
        let p = [0x80, 4, b'K', 7, b'r', 0xf0, 0xff, 0xff, 0xff, b'0', b'j', 0xf0, 0xff, 0xff, 0xff, b'.'];
        assert_eq!(parse(&p).unwrap().value.as_i64(), Some(7));
    }
}
