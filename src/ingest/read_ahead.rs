//! Reading a file on another thread, a few chunks ahead of the parser.
//!
//! Copying a file out of the page cache is kernel time on the reading thread: about a tenth of reading a
//! million-entry snapshot. A second thread does those reads while the parser decodes what came before, and the
//! parser only copies each chunk once more, in user space, which is cheaper.

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Bytes a read on the helper thread asks for; at most `IN_FLIGHT + 2` such chunks exist at once.
const CHUNK: usize = 1 << 20;
const IN_FLIGHT: usize = 2;

/// A reader whose reads are made ahead of time on another thread.
pub struct ReadAhead {
    chunks: Receiver<io::Result<Vec<u8>>>,
    /// Emptied chunks go back to the helper to be filled again.
    spent: SyncSender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    ended: bool,
}

impl ReadAhead {
    /// Starts reading `src` on a new thread; `Err(src)` if no thread can be started (read it directly then).
    pub fn start<R: Read + Send + 'static>(src: R) -> Result<ReadAhead, R> {
        let (tx, chunks) = sync_channel(IN_FLIGHT);
        let (spent, back) = sync_channel::<Vec<u8>>(IN_FLIGHT + 2);
        // The source travels through a slot so that it can be handed back when the thread does not start.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(src)));
        let theirs = slot.clone();
        let started = std::thread::Builder::new().name("read-ahead".into()).spawn(move || {
            let Some(mut src) = theirs.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
            loop {
                let mut buf = back.try_recv().unwrap_or_default();
                buf.resize(CHUNK, 0);
                let mut n = 0;
                while n < CHUNK {
                    match src.read(&mut buf[n..]) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            // What was read before the error still counts.
                            buf.truncate(n);
                            if n > 0 && tx.send(Ok(buf)).is_err() {
                                return;
                            }
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
                buf.truncate(n);
                // A closed channel: the parser stopped (an error, or the pickle ended early).
                if n == 0 || tx.send(Ok(buf)).is_err() {
                    return;
                }
            }
        });
        match started {
            Ok(_) => Ok(ReadAhead { chunks, spent, cur: Vec::new(), pos: 0, ended: false }),
            Err(_) => match slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                Some(src) => Err(src),
                // The thread started after all and took the source.
                None => Ok(ReadAhead { chunks, spent, cur: Vec::new(), pos: 0, ended: false }),
            },
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.ended {
                return Ok(0);
            }
            match self.chunks.recv() {
                Ok(Ok(next)) => {
                    let old = std::mem::replace(&mut self.cur, next);
                    let _ = self.spent.try_send(old);
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                Err(_) => self.ended = true,
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_what_the_source_holds() {
        let data: Vec<u8> = (0..3 * CHUNK + 12345).map(|i| (i * 7 % 251) as u8).collect();
        let mut r = ReadAhead::start(std::io::Cursor::new(data.clone())).unwrap_or_else(|_| panic!("no thread"));
        let mut got = Vec::new();
        let mut buf = vec![0u8; 300_001];
        loop {
            let n = r.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data);
    }

    #[test]
    fn a_read_error_reaches_the_reader() {
        struct Failing(usize);
        impl Read for Failing {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("disk gone"));
                }
                let n = out.len().min(self.0);
                self.0 -= n;
                Ok(n)
            }
        }
        let mut r = ReadAhead::start(Failing(10)).unwrap_or_else(|_| panic!("no thread"));
        let mut buf = [0u8; 64];
        assert_eq!(r.read(&mut buf).unwrap(), 10);
        assert_eq!(r.read(&mut buf).unwrap_err().to_string(), "disk gone");
    }
}
