//! The streamed input: a fixed buffer refilled from the reader, and a cursor over a window of it for the fast
//! paths.

use super::*;

/// A read position in a byte slice; every read returns `None` past the end (the fast path then gives up).
pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl Cursor<'_> {
    #[inline]
    pub(super) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }
    #[inline]
    pub(super) fn at(&self, k: usize) -> Option<u8> {
        self.buf.get(self.pos + k).copied()
    }
    #[inline]
    pub(super) fn next(&mut self) -> Option<u8> {
        let b = self.buf.get(self.pos).copied()?;
        self.pos += 1;
        Some(b)
    }
    #[inline]
    pub(super) fn slice(&self, from: usize, n: usize) -> Option<&[u8]> {
        self.buf.get(self.pos + from..self.pos + from + n)
    }
    #[inline]
    pub(super) fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
}

/// Buffered input that hands out slices and keeps track of the file offset.
pub(super) struct Input<R> {
    pub(super) src: R,
    pub(super) buf: Vec<u8>,
    pub(super) pos: usize,
    pub(super) end: usize,
    /// File offset of `buf[0]`.
    pub(super) base: u64,
    pub(super) eof: bool,
    pub(super) progress: Option<Box<dyn FnMut(u64) + 'static>>,
    /// Where reading goes on instead of `src`, once a helper has read the part in between (see `split`).
    pub(super) replacement: Option<Box<dyn Read + Send>>,
}

impl<R: Read> Input<R> {
    pub(super) fn new(src: R) -> Self {
        Input { src, buf: vec![0; BUF_SIZE], pos: 0, end: 0, base: 0, eof: false, progress: None, replacement: None }
    }

    /// Goes on reading from `src`, which stands at file offset `offset`, dropping what is buffered.
    pub(super) fn restart_at(&mut self, src: Box<dyn Read + Send>, offset: u64) {
        self.replacement = Some(src);
        self.pos = 0;
        self.end = 0;
        self.base = offset;
        self.eof = false;
    }

    #[inline]
    pub(super) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes at least `n` bytes available at `pos`, unless the input ends first. Returns whether it could.
    #[cold]
    pub(super) fn fill(&mut self, n: usize) -> Result<bool, PickleError> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if n > self.buf.len() {
            // A long string: grow step by step so a lying length prefix cannot make us allocate more than the
            // file actually holds (plus one buffer).
            let want = n.min(self.buf.len().saturating_mul(2)).max(self.buf.len());
            self.buf.resize(want, 0);
        }
        while self.end < n && !self.eof {
            if self.end == self.buf.len() {
                let grow = self.buf.len().min(n - self.end).max(BUF_SIZE);
                self.buf.resize(self.buf.len() + grow, 0);
            }
            let read = match self.replacement.as_mut() {
                Some(r) => r.read(&mut self.buf[self.end..]),
                None => self.src.read(&mut self.buf[self.end..]),
            };
            match read {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(PickleError::Io { offset: self.base + self.end as u64, source: e }),
            }
        }
        if let Some(p) = self.progress.as_mut() {
            p(self.base + self.end as u64);
        }
        Ok(self.end >= n)
    }

    #[inline]
    pub(super) fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], PickleError> {
        if self.end - self.pos < n && !self.fill(n)? {
            return Err(PickleError::Truncated { offset: self.base + self.end as u64, what });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    pub(super) fn byte(&mut self, what: &'static str) -> Result<u8, PickleError> {
        if self.pos < self.end {
            let b = self.buf[self.pos];
            self.pos += 1;
            return Ok(b);
        }
        Ok(self.take(1, what)?[0])
    }

    pub(super) fn line(&mut self, what: &'static str) -> Result<Vec<u8>, PickleError> {
        let mut out = Vec::new();
        loop {
            let b = self.byte(what)?;
            if b == b'\n' {
                return Ok(out);
            }
            out.push(b);
            if out.len() > 1 << 20 {
                return Err(PickleError::Malformed {
                    offset: self.offset(),
                    message: format!("a text-protocol {what} longer than 1 MiB"),
                });
            }
        }
    }
}
