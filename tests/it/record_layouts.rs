//! Trace entries are read three ways: field by field as records, at fixed offsets once their byte layout is
//! known, and by the generic pickle machine when neither fits. These pickles are written opcode by opcode so that
//! every integer width and every way out of the fast paths is exercised, and each must give the events the file
//! holds (or the generic path's error).

use std::collections::HashMap;

use oomdoc::ingest::snapshot;
use oomdoc::timeline::{Action, DeviceTimeline, Timeline};

/// A pickle writer for protocol 4, memoizing as Python's pickler does.
struct Writer {
    b: Vec<u8>,
    memo: u32,
    strs: HashMap<String, u32>,
}

impl Writer {
    fn new() -> Writer {
        Writer { b: vec![0x80, 4], memo: 0, strs: HashMap::new() }
    }

    fn memoize(&mut self) -> u32 {
        self.b.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    fn get(&mut self, slot: u32) {
        if slot < 256 {
            self.b.extend([b'h', slot as u8]);
        } else {
            self.b.push(b'j');
            self.b.extend(slot.to_le_bytes());
        }
    }

    /// A str, memoized the first time and referenced after.
    fn str(&mut self, s: &str) {
        if let Some(&slot) = self.strs.get(s) {
            return self.get(slot);
        }
        self.b.extend([0x8c, s.len() as u8]);
        self.b.extend(s.as_bytes());
        let slot = self.memoize();
        self.strs.insert(s.to_string(), slot);
    }

    /// An int in the narrowest encoding, as Python writes it.
    fn int(&mut self, v: i64) {
        match v {
            0..=0xff => self.b.extend([b'K', v as u8]),
            0x100..=0xffff => {
                self.b.push(b'M');
                self.b.extend((v as u16).to_le_bytes());
            }
            _ if i32::try_from(v).is_ok() => {
                self.b.push(b'J');
                self.b.extend((v as i32).to_le_bytes());
            }
            _ => {
                let bytes = v.to_le_bytes();
                let mut n = 8;
                while n > 1
                    && ((bytes[n - 1] == 0 && bytes[n - 2] & 0x80 == 0)
                        || (bytes[n - 1] == 0xff && bytes[n - 2] & 0x80 != 0))
                {
                    n -= 1;
                }
                self.long1(&bytes[..n]);
            }
        }
    }

    fn long1(&mut self, bytes: &[u8]) {
        self.b.extend([0x8a, bytes.len() as u8]);
        self.b.extend(bytes);
    }

    fn dict_open(&mut self) {
        self.b.push(b'}');
        self.memoize();
        self.b.push(b'(');
    }

    fn list_open(&mut self) {
        self.b.push(b']');
        self.memoize();
        self.b.push(b'(');
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.b.extend(bytes);
    }
}

/// Writes `{"segments": [], <extra>, "device_traces": [[entries of device 0], …]}`; `entry` writes one entry's
/// key/value pairs (the dict around them is written here) and returns the dict's memo slot through `slots`.
fn snapshot_with(
    extra: impl FnOnce(&mut Writer),
    devices: &[usize],
    mut entry: impl FnMut(&mut Writer, usize, usize),
) -> Vec<u8> {
    let mut w = Writer::new();
    w.dict_open();
    w.str("segments");
    w.b.push(b']');
    w.memoize();
    extra(&mut w);
    w.str("device_traces");
    w.list_open();
    for (dev, &n) in devices.iter().enumerate() {
        w.list_open();
        for i in 0..n {
            // Batches of 1000, as the pickler writes them.
            if i > 0 && i % 1000 == 0 {
                w.raw(b"e(");
            }
            entry(&mut w, dev, i);
        }
        w.raw(b"e");
    }
    w.raw(b"eu.");
    w.b
}

fn read(bytes: &[u8]) -> Timeline {
    snapshot::read(bytes, None).unwrap_or_else(|e| panic!("{e}")).timeline
}

fn dev(tl: &Timeline, d: i64) -> &DeviceTimeline {
    tl.device(d).unwrap_or_else(|| panic!("no device {d}"))
}

/// An entry of the usual torch layout with the given addr, size and stream encodings.
fn entry(w: &mut Writer, action: &str, addr: impl FnOnce(&mut Writer), size: i64, stream: impl FnOnce(&mut Writer)) {
    w.b.push(b'}');
    w.memoize();
    w.b.push(b'(');
    w.str("action");
    w.str(action);
    w.str("addr");
    addr(w);
    w.str("size");
    w.int(size);
    w.str("stream");
    stream(w);
    w.str("time_us");
    w.int(1_700_000_000_000_000);
    w.b.push(b'u');
}

#[test]
fn every_long1_width_reads_back_exactly() {
    // Per width 1..=8, three entries alike: the first teaches the layout, the others are read from it.
    let value = |n: usize, k: usize| -> Vec<u8> {
        let mut b: Vec<u8> = (0..n).map(|i| (0x11 * (i as u8 + 1)) ^ k as u8).collect();
        b[n - 1] &= 0x7f; // positive: addresses are non-negative
        b
    };
    let expect = |b: &[u8]| -> u64 {
        let mut a = [0u8; 8];
        a[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(a)
    };
    let bytes = snapshot_with(
        |_| {},
        &[24],
        |w, _, i| {
            let (n, k) = (i / 3 + 1, i % 3);
            let v = value(n, k);
            // A stream of all ones in n bytes is -1: kept as its bit pattern.
            let ones = vec![0xffu8; n];
            entry(w, "alloc", |w| w.long1(&v), 512 << k, |w| w.long1(&ones));
        },
    );
    let tl = read(&bytes);
    let d = dev(&tl, 0);
    assert_eq!(d.events.len(), 24);
    for (i, e) in d.events.iter().enumerate() {
        let (n, k) = (i / 3 + 1, i % 3);
        assert_eq!(e.addr, expect(&value(n, k)), "entry {i}: LONG1 of {n} bytes");
        assert_eq!(e.size, 512 << k);
        assert_eq!(d.attrs(e).stream, u64::MAX, "entry {i}: -1 in {n} bytes");
        assert_eq!(e.action, Action::Alloc);
        assert_eq!(e.time_us(), Some(1_700_000_000_000_000));
    }
}

#[test]
fn narrow_and_wide_ints_and_memo_references_read_back() {
    // Sizes in every encoding Python uses (K, M, J, LONG1), actions by memo reference once seen.
    let sizes = [7i64, 300, 70_000, 3 << 30, 5 << 40, 200, 65_535, i32::MAX as i64];
    let actions = ["alloc", "free_requested", "free_completed", "segment_alloc"];
    let bytes = snapshot_with(
        |_| {},
        &[sizes.len() * 4],
        |w, _, i| {
            let size = sizes[i % sizes.len()];
            entry(w, actions[i % 4], |w| w.int(0x7f00_0000_0000 + i as i64 * 4096), size, |w| w.int(0));
        },
    );
    let tl = read(&bytes);
    let d = dev(&tl, 0);
    assert_eq!(d.events.len(), sizes.len() * 4);
    for (i, e) in d.events.iter().enumerate() {
        assert_eq!(e.size, sizes[i % sizes.len()] as u64, "entry {i}");
        assert_eq!(e.addr, 0x7f00_0000_0000 + i as u64 * 4096);
        assert_eq!(e.action, Action::from_name(actions[i % 4]));
    }
}

#[test]
fn a_known_layout_holding_a_bad_value_gets_the_generic_error() {
    // Entries whose addr is a memo reference: first to an int, then (same bytes but for the index) to a str.
    let int_slot = std::cell::Cell::new(0);
    let str_slot = std::cell::Cell::new(0);
    let bytes = snapshot_with(
        |w| {
            w.str("extra");
            w.list_open();
            w.int(4096);
            int_slot.set(w.memoize());
            w.str("not an address");
            str_slot.set(w.strs["not an address"]);
            w.b.push(b'e');
        },
        &[5],
        |w, _, i| {
            let slot = if i < 4 { int_slot.get() } else { str_slot.get() };
            entry(w, "alloc", |w| w.get(slot), 512, |w| w.int(0));
        },
    );
    let err = snapshot::read(&bytes[..], None).err().expect("a str address is an error").to_string();
    assert!(err.contains("trace entry: 'addr' is a str, expected a non-negative int"), "{err}");
}

#[test]
fn a_trace_longer_than_the_fast_window_has_each_event_once() {
    // ~60 bytes an entry: 5000 entries are several times the fast path's window, so the first attempt at the
    // whole list gives up part-way after converting hundreds of entries, which must not be kept twice.
    let n = 5000;
    let bytes = snapshot_with(
        |_| {},
        &[n, 3],
        |w, dev, i| {
            let addr = 0x7f00_0000_0000 + (dev * n + i) as i64 * 512;
            entry(w, if i % 2 == 0 { "alloc" } else { "free_completed" }, |w| w.int(addr), 512, |w| w.int(0));
        },
    );
    let tl = read(&bytes);
    for (d, count) in [(0, n), (1, 3)] {
        let events = &dev(&tl, d).events;
        assert_eq!(events.len(), count, "device {d}");
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.addr, 0x7f00_0000_0000 + (d as usize * n + i) as u64 * 512, "device {d} entry {i}");
        }
    }
}

#[test]
fn an_entry_referenced_again_through_the_memo_is_the_same_event() {
    // device 1's list holds device 0's second and first entry dicts again, by memo reference.
    let mut w = Writer::new();
    w.dict_open();
    w.str("device_traces");
    w.list_open();
    w.list_open();
    let mut slots = Vec::new();
    for i in 0..4 {
        slots.push(w.memo);
        entry(&mut w, "alloc", |w| w.int(0x7f00_0000_0000 + i * 512), 512 + i, |w| w.int(0));
    }
    w.raw(b"e");
    w.list_open();
    w.get(slots[1]);
    w.get(slots[0]);
    w.raw(b"ee");
    w.raw(b"u.");
    let tl = read(&w.b);
    let d0 = &dev(&tl, 0).events;
    let d1 = &dev(&tl, 1).events;
    assert_eq!(d0.len(), 4);
    assert_eq!(d1.len(), 2);
    assert_eq!((d1[0].addr, d1[0].size), (d0[1].addr, d0[1].size));
    assert_eq!((d1[1].addr, d1[1].size), (d0[0].addr, d0[0].size));
}

#[test]
fn entries_the_layouts_cannot_hold_are_read_field_by_field() {
    // A pool id tuple, an inline (new) str and a float in each entry: no fixed layout, still every value.
    let bytes = snapshot_with(
        |_| {},
        &[6],
        |w, _, i| {
            w.b.push(b'}');
            w.memoize();
            w.b.push(b'(');
            w.str("action");
            w.str("alloc");
            w.str("addr");
            w.int(4096 * (i as i64 + 1));
            w.str("size");
            w.int(512);
            w.str("pool_id");
            w.int(i as i64);
            w.int(7);
            w.b.push(0x86);
            w.str("compile_context");
            w.str(&format!("ctx {i}"));
            w.str("user_metadata");
            w.b.push(b'G');
            w.b.extend(1.5f64.to_be_bytes());
            w.b.push(b'u');
        },
    );
    let tl = read(&bytes);
    let d = dev(&tl, 0);
    assert_eq!(d.events.len(), 6);
    for (i, e) in d.events.iter().enumerate() {
        assert_eq!(e.addr, 4096 * (i as u64 + 1));
        assert_eq!(d.attrs(e).pool_id(), Some((i as i64, 7)));
        assert_eq!(tl.str(d.attrs(e).compile_context), format!("ctx {i}"));
    }
}

#[test]
fn a_key_slot_stored_again_is_read_as_its_new_key() {
    // After three entries have taught their layout, the memo slot of 'addr' is stored again with 'size' (BINPUT
    // to an existing index; no pickler does it, a hand-made file may). Python then reads `h <slot>` as 'size':
    // the address goes to `size`, which the entry's own size then overwrites, and `addr` stays 0.
    let bytes = snapshot_with(
        |_| {},
        &[5],
        |w, _, i| {
            if i == 3 {
                let slot = w.strs["addr"];
                w.raw(&[0x8c, 4]);
                w.raw(b"size");
                w.raw(&[b'q', slot as u8, b'0']);
            }
            entry(w, "alloc", |w| w.int(0x7f00_0000_0000 + i as i64 * 4096), 512, |w| w.int(0));
        },
    );
    let tl = read(&bytes);
    let events = &dev(&tl, 0).events;
    assert_eq!(events.len(), 5);
    for (i, e) in events.iter().enumerate() {
        let addr = if i < 3 { 0x7f00_0000_0000 + i as u64 * 4096 } else { 0 };
        assert_eq!((e.addr, e.size), (addr, 512), "entry {i}");
    }
}

#[test]
fn a_record_given_up_leaves_no_mark_on_the_format_version() {
    // A dict that starts like a trace entry (action, time_us) but holds a thousand more keys is no trace entry
    // (it is not converted at all): the keys it streamed before being given up must not date the file.
    let with_action = |action: bool| {
        snapshot_with(
            |w| {
                w.str("extra");
                w.dict_open();
                if action {
                    w.str("action");
                    w.str("alloc");
                }
                w.str("time_us");
                w.int(5);
                w.str("pool_id");
                w.int(0);
                w.int(0);
                w.raw(&[0x86]);
                for k in 0..1000 {
                    w.str(&format!("k{k}"));
                    w.int(k);
                }
                w.raw(b"u");
            },
            &[],
            |_, _, _| {},
        )
    };
    let version = |b: &[u8]| snapshot::read(b, None).unwrap_or_else(|e| panic!("{e}")).format_version;
    let plain = version(&with_action(false));
    assert_eq!(version(&with_action(true)), plain);
    assert!(!plain.contains("2.2") && !plain.contains("2.12"), "{plain}");
}

/// A frame dict: written in full the first time, referenced after.
fn frame(w: &mut Writer, slots: &mut HashMap<usize, u32>, f: usize) {
    if let Some(&s) = slots.get(&f) {
        return w.get(s);
    }
    slots.insert(f, w.memo);
    w.dict_open();
    w.str("filename");
    w.str(&format!("model_{}.py", f % 3));
    w.str("line");
    w.int(10 + f as i64);
    w.str("name");
    w.str(&format!("fn_{f}"));
    w.b.push(b'u');
}

/// The entry torch ≥ 2.10 writes: a fresh memoized 'N/A' compile context and a fresh frames list per
/// allocation, the free events naming the allocation's list by memo reference.
fn torch_entry(
    w: &mut Writer,
    frame_slots: &mut HashMap<usize, u32>,
    action: &str,
    addr: i64,
    frames: Result<&[usize], u32>,
) -> (u32, Option<u32>) {
    let slot = w.memo;
    w.dict_open();
    for (k, v) in [("action", action), ("addr", ""), ("size", ""), ("stream", ""), ("time_us", "")] {
        w.str(k);
        match k {
            "action" => w.str(v),
            "addr" => w.int(addr),
            "size" => w.int(512),
            "stream" => w.int(0),
            _ => w.int(1_700_000_000_000_000 + addr),
        }
    }
    w.str("compile_context");
    w.raw(&[0x8c, 3]);
    w.raw(b"N/A");
    w.memoize();
    w.str("user_metadata");
    w.str("");
    w.str("frames");
    let list = match frames {
        // No Python frame (an allocation of the autograd engine's backward): Python writes an empty list as
        // EMPTY_LIST MEMOIZE, no MARK.
        Ok([]) => {
            let list = w.memo;
            w.b.push(b']');
            w.memoize();
            Some(list)
        }
        Ok(fs) => {
            let list = w.memo;
            w.list_open();
            for &f in fs {
                frame(w, frame_slots, f);
            }
            w.b.push(b'e');
            Some(list)
        }
        Err(list) => {
            w.get(list);
            None
        }
    };
    w.b.push(b'u');
    (slot, list)
}

/// A snapshot dict opened through its first device's trace list: `{'device_traces': [[`.
fn first_device_trace() -> Writer {
    let mut w = Writer::new();
    w.dict_open();
    w.str("device_traces");
    w.list_open();
    w.list_open();
    w
}

/// An allocation with a fresh frames list, then its free_requested and free_completed naming that list: the three
/// entries' memo slots.
fn alloc_and_free(w: &mut Writer, frame_slots: &mut HashMap<usize, u32>, addr: i64, frames: &[usize]) -> [u32; 3] {
    let (alloc, list) = torch_entry(w, frame_slots, "alloc", addr, Ok(frames));
    let list = list.expect("a list");
    let (requested, _) = torch_entry(w, frame_slots, "free_requested", addr, Err(list));
    let (completed, _) = torch_entry(w, frame_slots, "free_completed", addr, Err(list));
    [alloc, requested, completed]
}

#[test]
fn torch_entries_with_a_fresh_context_str_and_frames_list_read_back_through_their_layouts() {
    // 300 allocations over 7 stacks, each freed (free_requested, free_completed) naming its list; then a second
    // device lists three of the first device's entry dicts again by memo reference, which must find each one
    // where the pickler stored it: the entry's slot first, then its 'N/A', then its frames list.
    let stacks: Vec<Vec<usize>> = (0..7).map(|s| (0..(3 + s * 5)).map(|k| (s * 7 + k * 3) % 40).collect()).collect();
    let mut w = first_device_trace();
    let mut frame_slots = HashMap::new();
    let mut entry_slots = Vec::new();
    let mut expect = Vec::new();
    for i in 0..300usize {
        if i > 0 && i % 300 == 0 {
            w.raw(b"e(");
        }
        let s = (i * 5 + i / 11) % stacks.len();
        let addr = 0x7f00_0000_0000 + i as i64 * 4096;
        entry_slots.extend(alloc_and_free(&mut w, &mut frame_slots, addr, &stacks[s]));
        for action in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted] {
            expect.push((action, addr as u64, s));
        }
    }
    w.raw(b"e");
    w.list_open();
    for k in [5usize, 600, 899] {
        w.get(entry_slots[k]);
    }
    w.raw(b"eeu.");
    let tl = read(&w.b);
    let frames_of = |d: &DeviceTimeline, e: &oomdoc::timeline::Event| -> Vec<(String, i64)> {
        let _ = d;
        tl.stacks
            .stack(e.stack)
            .iter()
            .map(|&f| {
                let f = tl.stacks.frame(f);
                (tl.str(f.name).to_string(), f.line)
            })
            .collect()
    };
    let want_frames =
        |s: usize| -> Vec<(String, i64)> { stacks[s].iter().map(|&f| (format!("fn_{f}"), 10 + f as i64)).collect() };
    let d0 = dev(&tl, 0);
    assert_eq!(d0.events.len(), expect.len());
    for (i, (e, &(action, addr, s))) in d0.events.iter().zip(&expect).enumerate() {
        assert_eq!((e.action, e.addr), (action, addr), "entry {i}");
        assert_eq!(frames_of(d0, e), want_frames(s), "entry {i}'s stack");
        assert_eq!(tl.str(d0.attrs(e).compile_context), "N/A", "entry {i}");
    }
    let d1 = dev(&tl, 1);
    assert_eq!(d1.events.len(), 3);
    for (e, k) in d1.events.iter().zip([5usize, 600, 899]) {
        assert_eq!((e.action, e.addr), (expect[k].0, expect[k].1), "device 1's copy of entry {k}");
        assert_eq!(frames_of(d1, e), want_frames(expect[k].2));
    }
}

#[test]
fn a_frames_list_naming_its_own_entry_gets_the_generic_error_after_the_layout_is_known() {
    // The 6th entry's frames list holds a reference to the entry itself (no pickler writes that): read through
    // the learnt layout or not, it is the same error.
    let build = |at: usize| {
        let mut w = Writer::new();
        let mut frame_slots = HashMap::new();
        w.dict_open();
        w.str("device_traces");
        w.list_open();
        w.list_open();
        for i in 0..8usize {
            let addr = 0x7f00_0000_0000 + i as i64 * 4096;
            if i == at {
                let own = w.memo;
                w.dict_open();
                w.str("action");
                w.str("alloc");
                w.str("addr");
                w.int(addr);
                w.str("size");
                w.int(512);
                w.str("stream");
                w.int(0);
                w.str("time_us");
                w.int(1_700_000_000_000_000 + addr);
                w.str("compile_context");
                w.raw(&[0x8c, 3]);
                w.raw(b"N/A");
                w.memoize();
                w.str("user_metadata");
                w.str("");
                w.str("frames");
                w.list_open();
                frame(&mut w, &mut frame_slots, 1);
                w.get(own);
                w.raw(b"eu");
            } else {
                torch_entry(&mut w, &mut frame_slots, "alloc", addr, Ok(&[1, 2, 3]));
            }
        }
        w.raw(b"eeu.");
        w.b
    };
    let message = |b: &[u8]| {
        let e = snapshot::read(b, None).err().expect("an entry inside its own frames is an error").to_string();
        // The offset and the entry's index differ with where the entry is; what is wrong must not.
        e.replace(|c: char| c.is_ascii_digit(), "")
    };
    let first = message(&build(0));
    assert!(first.contains("is a dict, expected a trace entry dict"), "{first}");
    assert_eq!(message(&build(5)), first);
}

#[test]
fn entries_with_no_python_frame_read_back_with_their_empty_frames_list() {
    // torch ≥ 2.10 with stacks="python": every allocation made outside Python (the backward pass) has `frames: []`,
    // a fresh empty list its free events name by memo reference. Half the allocations here, in runs and alone,
    // the first entry among them, so the layouts are learnt from both kinds.
    let stacks: Vec<Vec<usize>> = vec![vec![], vec![1, 2, 3], vec![4, 5], vec![]];
    let mut w = first_device_trace();
    let mut frame_slots = HashMap::new();
    let mut expect = Vec::new();
    for i in 0..2000usize {
        if i > 0 && i % 333 == 0 {
            w.raw(b"e(");
        }
        let s = if i % 7 < 3 { 0 } else { 1 + i % 3 };
        let addr = 0x7f00_0000_0000 + i as i64 * 512;
        alloc_and_free(&mut w, &mut frame_slots, addr, &stacks[s]);
        for action in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted] {
            expect.push((action, addr as u64, s));
        }
    }
    w.raw(b"eeu.");
    let tl = read(&w.b);
    let d0 = dev(&tl, 0);
    assert_eq!(d0.events.len(), expect.len());
    for (i, (e, &(action, addr, s))) in d0.events.iter().zip(&expect).enumerate() {
        assert_eq!((e.action, e.addr, e.size), (action, addr, 512), "entry {i}");
        let names: Vec<String> =
            tl.stacks.stack(e.stack).iter().map(|&f| tl.str(tl.stacks.frame(f).name).to_string()).collect();
        let want: Vec<String> = stacks[s].iter().map(|f| format!("fn_{f}")).collect();
        assert_eq!(names, want, "entry {i}'s stack");
        assert_eq!(tl.str(d0.attrs(e).compile_context), "N/A", "entry {i}");
    }
}
