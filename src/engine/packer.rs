//! Compressing a large batch's pack on another core while the appending
//! thread folds the batch (issue 18).
//!
//! In a large batch the Zstandard pack of the non-message data and the
//! fold's rule checks are each about a third of an append's time, and they
//! do not depend on each other: the pack is a function of the events'
//! bytes alone. So the appender gathers the pack's bytes, hands them to
//! this handle's helper thread, folds the batch meanwhile, and takes the
//! compressed pack back before it encodes the record. A batch the fold
//! refuses drops its pack unseen. The record's bytes are exactly those of
//! an encode on one thread ([`codec::encode_batch_prepacked`]).
//!
//! One helper per handle, started at the first large batch: when it is
//! busy with another appender's batch (or cannot be started), the
//! appender packs on its own thread as before, so the helper never makes
//! an append wait for another one's.

use crate::codec::{self, EncodeOptions, Pack};
use crate::event::Event;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

/// Batches whose pack would take fewer bytes than this are packed on the
/// appending thread: the hand-off (two thread wake-ups, ~10-20 us) would
/// cost more than the overlap saves.
pub(super) const MIN_PARALLEL_PACK: usize = 64 << 10;

/// The most buffer bytes a recycled pack keeps.
const KEEP: usize = 8 << 20;

/// One compression handed to the helper.
struct Job {
    pack: Pack,
    done: mpsc::SyncSender<Pack>,
}

/// The pack helper of one store handle.
pub(super) struct PackHelper {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// A pack whose buffers the next large batch reuses.
    spare: Mutex<Option<Pack>>,
    /// A job is queued or running.
    busy: Arc<AtomicBool>,
    /// More than one core: otherwise the helper would only take turns
    /// with the appender.
    enabled: bool,
}

/// A pack being compressed by the helper.
pub(super) struct Pending(mpsc::Receiver<Pack>);

impl Pending {
    /// The compressed pack; `None` if the helper died (the caller encodes
    /// the batch as usual).
    pub(super) fn wait(self) -> Option<Pack> {
        self.0.recv().ok()
    }
}

impl PackHelper {
    pub(super) fn new() -> PackHelper {
        PackHelper {
            jobs: Mutex::new(None),
            spare: Mutex::new(None),
            busy: Arc::new(AtomicBool::new(false)),
            enabled: std::thread::available_parallelism().is_ok_and(|n| n.get() > 1),
        }
    }

    /// Starts packing `events` (encoded with `options`) on the helper, or
    /// `None` to pack them on the caller's thread: a small batch, a busy
    /// helper, or one machine core.
    pub(super) fn start(&self, events: &[Event<'_>], options: EncodeOptions) -> Option<Pending> {
        if !self.enabled || !options.compress || !large(events, options) {
            return None;
        }
        if self
            .busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        let mut pack = self
            .spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        pack.gather(events, options);
        let started = self.send(pack);
        if started.is_none() {
            self.busy.store(false, Ordering::Release);
        }
        started
    }

    /// Takes back a pack the caller is done with: its buffers serve the
    /// next large batch (a fresh allocation of a few hundred KiB per batch
    /// costs page faults), unless they grew past [`KEEP`].
    pub(super) fn recycle(&self, pack: Pack) {
        if pack.capacity() <= KEEP {
            *self.spare.lock().unwrap_or_else(|e| e.into_inner()) = Some(pack);
        }
    }

    fn send(&self, pack: Pack) -> Option<Pending> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.is_none() {
            *jobs = Some(self.spawn()?);
        }
        let (done, rx) = mpsc::sync_channel(1);
        jobs.as_ref()?.send(Job { pack, done }).ok()?;
        Some(Pending(rx))
    }

    /// The helper thread: it ends when the handle drops its sender.
    fn spawn(&self) -> Option<mpsc::Sender<Job>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let busy = self.busy.clone();
        std::thread::Builder::new()
            .name("sessionlog-pack".into())
            .spawn(move || {
                for Job { mut pack, done } in rx {
                    pack.compress();
                    busy.store(false, Ordering::Release);
                    // The appender is gone when its fold refused the batch.
                    let _ = done.send(pack);
                }
            })
            .ok()?;
        Some(tx)
    }
}

/// Whether the pack of `events` is large enough to be worth the helper
/// (counted without gathering it).
fn large(events: &[Event<'_>], options: EncodeOptions) -> bool {
    let mut total = 0;
    for ev in events {
        if options.verbatim_surface && ev.surface_op.is_some() {
            continue; // never packed
        }
        total += ev.data.get().len();
        if total >= MIN_PARALLEL_PACK {
            return true;
        }
    }
    false
}

impl std::fmt::Debug for PackHelper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackHelper")
            .field("busy", &self.busy.load(Ordering::Relaxed))
            .finish()
    }
}

/// Encodes `events` as a record's codec bytes, with `pack` when the helper
/// built it.
pub(super) fn encode(
    events: &[Event<'_>],
    options: EncodeOptions,
    pack: Option<&Pack>,
    out: &mut Vec<u8>,
    data_ranges: &mut Vec<Option<std::ops::Range<usize>>>,
) -> Result<(), codec::CodecError> {
    match pack {
        Some(pack) => codec::encode_batch_prepacked(events, 0, options, pack, out, data_ranges),
        None => codec::encode_batch_indexed(events, 0, options, out, data_ranges),
    }
}
