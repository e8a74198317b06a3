//! A background thread that runs a task every interval until stopped: the
//! group commit of `Durability::Batched` and the archive's uploader.
//!
//! The thread sleeps with `park_timeout`, so [`Periodic::stop`] wakes it at
//! once (unpark) instead of waiting out the interval, then joins it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running periodic task.
pub(crate) struct Periodic {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Periodic {
    /// Starts thread `name` running `task` every `every`; the thread ends
    /// when stopped or when `task` returns `false`. The task should hold
    /// what it needs weakly or by a part of the store, never the store
    /// handle itself, so that dropping the last handle can stop it.
    pub(crate) fn spawn(
        name: &str,
        every: Duration,
        mut task: impl FnMut() -> bool + Send + 'static,
    ) -> Periodic {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(every);
                    if flag.load(Ordering::Acquire) || !task() {
                        return;
                    }
                }
            })
            .unwrap_or_else(|e| panic!("spawn the {name} thread: {e}"));
        Periodic { stop, thread }
    }

    /// Stops the thread (waking it now) and joins it.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}
