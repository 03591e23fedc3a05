//! Interned strings, frames and stacks. Snapshots repeat the same frames millions of times; each distinct string,
//! frame and stack is stored once and referred to by a 4-byte id.

use indexmap::IndexSet;
use rustc_hash::FxBuildHasher;

pub type StrId = u32;
pub type FrameId = u32;
/// A stack id. `EMPTY_STACK` (0) is the stack with no frames: nothing was recorded.
pub type StackId = u32;
pub const EMPTY_STACK: StackId = 0;

#[derive(Default, Debug, Clone)]
pub struct Strings {
    set: IndexSet<Box<str>, FxBuildHasher>,
}

impl Strings {
    /// Interns `bytes`, decoding invalid UTF-8 leniently (U+FFFD), as a person reading a path would want.
    #[inline]
    pub fn intern_bytes(&mut self, bytes: &[u8]) -> StrId {
        match std::str::from_utf8(bytes) {
            Ok(s) => self.intern(s),
            Err(_) => self.intern(&String::from_utf8_lossy(bytes)),
        }
    }

    #[inline]
    pub fn intern(&mut self, s: &str) -> StrId {
        if let Some(i) = self.set.get_index_of(s) {
            return i as StrId;
        }
        self.set.insert_full(s.into()).0 as StrId
    }

    pub fn lookup(&self, s: &str) -> Option<StrId> {
        self.set.get_index_of(s).map(|i| i as StrId)
    }

    pub fn get(&self, id: StrId) -> &str {
        self.set.get_index(id as usize).map_or("", |s| s)
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// One Python (or C++) frame.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Frame {
    pub filename: StrId,
    pub name: StrId,
    pub line: i64,
}

#[derive(Debug, Clone)]
pub struct Stacks {
    frames: IndexSet<Frame, FxBuildHasher>,
    stacks: IndexSet<Box<[FrameId]>, FxBuildHasher>,
}

impl Default for Stacks {
    fn default() -> Self {
        let mut stacks = IndexSet::default();
        stacks.insert(Box::from([]));
        Stacks { frames: IndexSet::default(), stacks }
    }
}

impl Stacks {
    #[inline]
    pub fn intern_frame(&mut self, f: Frame) -> FrameId {
        self.frames.insert_full(f).0 as FrameId
    }

    /// Interns a stack, innermost frame first.
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(i) = self.stacks.get_index_of(frames) {
            return i as StackId;
        }
        self.stacks.insert_full(frames.into()).0 as StackId
    }

    /// The id of a stack interned before, without interning it.
    pub fn find_stack(&self, frames: &[FrameId]) -> Option<StackId> {
        self.stacks.get_index_of(frames).map(|i| i as StackId)
    }

    pub fn frame(&self, id: FrameId) -> Frame {
        self.frames[id as usize]
    }

    pub fn stack(&self, id: StackId) -> &[FrameId] {
        self.stacks.get_index(id as usize).map_or(&[], |s| s)
    }

    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }

    pub fn stack_count(&self) -> usize {
        self.stacks.len()
    }
}

/// Frames that only show the machinery of recording or of the interpreter; PyTorch's own viewer drops them too.
pub fn is_noise_frame(filename: &str, name: &str) -> bool {
    const NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 11] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
        "CUDACachingAllocator",
    ];
    NAMES.iter().any(|n| name.contains(n))
        || FILES.iter().any(|f| filename.contains(f))
        || name.contains("CUDACachingAllocator")
        // CPython's C API between Python frames says nothing about who allocated.
        || (filename == "??" && (name.starts_with("Py") || name.starts_with("_Py")))
}

/// oomdoc's own Python helpers (`python -m oomdoc run`, `oomdoc.record()`) sit above the user's script on every stack
/// they capture. Installed from the wheel they are under site-packages; run from a checkout they are not, and the
/// launcher's `run` would be named as the user's loop.
fn is_oomdoc_launcher(f: &str) -> bool {
    ["__main__.py", "_capture.py", "_binary.py", "__init__.py"]
        .iter()
        .any(|name| f.strip_suffix(name).is_some_and(|dir| dir == "oomdoc/" || dir.ends_with("/oomdoc/")))
}

/// Whether a frame belongs to a library (PyTorch, an installed package, the standard library, native code) rather
/// than to the user's own program. Reports show the user's frames first and fold the rest.
pub fn is_library_frame(filename: &str) -> bool {
    let f = filename.replace('\\', "/");
    f.contains("site-packages/")
        || f.contains("dist-packages/")
        || f.contains("/lib/python")
        || f.contains("/torch/")
        || f.starts_with("torch/")
        || f.contains("<frozen")
        || is_oomdoc_launcher(&f)
        || f == "??"
        || f.is_empty()
        || !(f.ends_with(".py") || f.contains("ipykernel") || f.starts_with('<'))
}
