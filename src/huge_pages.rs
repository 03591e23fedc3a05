//! Large buffers backed by transparent huge pages where the kernel offers them on request (`madvise` mode).
//!
//! Reading a million-entry snapshot touches ~80 MB of fresh memory. With 4 KiB pages that is ~20,000 page faults,
//! and in a virtual machine each costs microseconds: measured here, a quarter of the run was spent in the kernel.
//! A 2 MiB page takes one fault for what 512 small ones did. Pages are still only backed when first touched, so
//! a reservation that is never filled costs no memory.

/// Asks for huge pages under `v`'s whole capacity. Does nothing for buffers too small to hold one, or off Linux.
pub fn advise<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = v.capacity() * std::mem::size_of::<T>();
        if bytes < 2 * HUGE {
            return;
        }
        let start = v.as_ptr() as usize;
        let end = start + bytes;
        // Whole pages inside the buffer only: the advice applies to the mapping, and a neighbour's page must not
        // change.
        let page = 4096;
        let (first, last) = (start.div_ceil(page) * page, end / page * page);
        if last > first {
            // SAFETY: the range lies inside memory `v` owns; MADV_HUGEPAGE changes how it is backed, not its
            // contents, and failure (no THP support) is harmless.
            unsafe {
                libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Has the kernel back the first `bytes` of `v`'s capacity with zeroed pages now, on another thread, so the thread
/// that fills the buffer does not stop to fault each page in: in a virtual machine, zeroing the pages of a
/// million-entry trace's tables is tens of milliseconds. `MADV_POPULATE_WRITE` (Linux 5.14) only backs pages that
/// are not backed yet and never changes contents, so it cannot disturb what the filling thread has written, and
/// where it is unsupported, nothing happens.
pub fn populate_soon<T>(v: &Vec<T>, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const MADV_POPULATE_WRITE: libc::c_int = 23;
        let bytes = bytes.min(v.capacity() * std::mem::size_of::<T>());
        if bytes < 4 << 20 {
            return;
        }
        let page = 4096;
        let start = (v.as_ptr() as usize).div_ceil(page) * page;
        let end = (v.as_ptr() as usize + bytes) / page * page;
        if end <= start {
            return;
        }
        let _ = std::thread::Builder::new().name("populate".into()).spawn(move || {
            // In 2 MiB steps, so the filling thread, which starts at the front, soon meets backed pages.
            let mut at = start;
            while at < end {
                let len = (end - at).min(2 << 20);
                // SAFETY: a hint about memory this process mapped; it backs pages without changing any byte, and
                // on memory that is no longer mapped it only fails.
                if unsafe { libc::madvise(at as *mut libc::c_void, len, MADV_POPULATE_WRITE) } != 0 {
                    return;
                }
                at += len;
            }
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (v, bytes);
}
