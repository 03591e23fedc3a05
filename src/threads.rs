//! Work beside the current thread: the one helper every layer uses to run two independent passes on two cores,
//! and to fall back to one where no thread can be started.

/// Starts `work` on another thread of `scope` and returns what waits for its result. Where no thread can be started
/// (a process at its thread limit), `work` runs when its result is first asked for, on the asking thread.
pub fn beside<'s, T: Send + 's>(
    scope: &'s std::thread::Scope<'s, '_>,
    work: impl FnOnce() -> T + Send + 's,
) -> impl FnOnce() -> T + 's {
    let cell = std::sync::Arc::new(std::sync::Mutex::new(Some(work)));
    let theirs = cell.clone();
    let take = move |c: &std::sync::Mutex<Option<_>>| c.lock().unwrap_or_else(|e| e.into_inner()).take();
    let handle = std::thread::Builder::new().spawn_scoped(scope, move || take(&theirs).map(|f| f())).ok();
    move || {
        let ran = handle.and_then(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        match ran {
            Some(v) => v,
            None => take(&cell).map(|f| f()).expect("the work runs here when no thread took it"),
        }
    }
}
