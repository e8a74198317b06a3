//! Building a whole session in staging and publishing it: import and fork.
//! The session is written into a staged directory, synced once, and made
//! visible by one rename (or swapped in for the stored one): a failure or a
//! crash before the publish leaves nothing partial.

use super::error::{Error, Result, io_at, publish_error, segment_error};
use super::handle::Store;
use super::registry::{PublishError, SessionEntry};
use super::session::Session;
use super::write::new_uid;
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::segment;
use std::path::Path;

/// Logs shorter than this many events get no checkpoint when built whole
/// (import, fork): replaying them at reopen is cheaper than the file.
const SMALL_LOG_EVENTS: u64 = 1024;

/// How [`Store::build_and_publish`] may publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publish {
    /// The id must not exist.
    New,
    /// Replace the stored session of that id, if any.
    NewOrReplace,
}

/// `events` cut into consecutive batches of about `max_bytes` (at least one
/// event each), so that none passes the record limit.
pub(super) fn split_batches<'a, 'e>(
    events: &'a [Event<'e>],
    max_bytes: usize,
) -> impl Iterator<Item = &'a [Event<'e>]> + 'a {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= events.len() {
            return None;
        }
        let mut end = start;
        let mut bytes = 0;
        while end < events.len() && (end == start || bytes < max_bytes) {
            bytes += events[end].data.get().len() + events[end].kind.len() + 64;
            end += 1;
        }
        let batch = &events[start..end];
        start = end;
        Some(batch)
    })
}

/// How one try of a fork failed.
enum Fork {
    /// The parent was replaced while its segments were linked: try again.
    ParentReplaced(Error),
    Failed(Error),
}

impl From<Error> for Fork {
    fn from(e: Error) -> Fork {
        Fork::Failed(e)
    }
}

impl Store {
    /// Forks `source` at `at` events into a new session `child`: the child
    /// header names `parentSession` and `seedLength`, and `session/end-seed`
    /// is appended unless the seed already ends with one.
    ///
    /// The parent's sealed segments that lie wholly inside the seed are
    /// hard-linked, not copied (their owner is recorded in the child's
    /// `LINEAGE`); only the rest of the seed is written again. The child is
    /// built in staging and published only once it is complete and durable:
    /// a crash before leaves a staged directory that the next writable open
    /// discards.
    ///
    /// A parent that another handle replaces (`import` with `replace`)
    /// while the fork links its segments is forked again, from what it is
    /// then: the child holds either incarnation whole, never a mix.
    pub fn fork(&self, source: &str, at: u64, child: SessionHeader) -> Result<()> {
        let mut tries = 0;
        loop {
            match self.fork_once(source, at, child.clone()) {
                Err(Fork::ParentReplaced(e)) if tries < 3 => {
                    tries += 1;
                    drop(e);
                }
                Err(Fork::ParentReplaced(e) | Fork::Failed(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }

    fn fork_once(
        &self,
        source: &str,
        at: u64,
        child: SessionHeader,
    ) -> std::result::Result<(), Fork> {
        self.writable()?;
        let mut header = child;
        let id = header.id.clone();
        if self.exists(&id)?
            || self
                .inner
                .pending
                .lock()
                .expect("pending lock")
                .contains_key(&id)
        {
            return Err(Error::Exists(id).into());
        }
        self.session_dir(&id)?; // a usable id
        // Loaded, or brought up to date with its files (another handle may
        // have appended to it or replaced it since this one loaded it).
        self.with_session(source, |_| Ok(()))?;
        let parent = self.slot(source)?;
        let mut p = parent.lock().expect("session lock");
        if p.placeholder {
            // Evicted in between: loaded again.
            drop(p);
            self.with_session(source, |_| Ok(()))?;
            p = parent.lock().expect("session lock");
        }
        let (parent_dir, parent_id) = (p.dir.clone(), p.dir_id);
        let at = at.min(p.next_seq());
        header.parent_session = Some(source.to_owned());
        header.seed_length = Some(at);

        // The shareable prefix: sealed segments that end inside the seed.
        let mut shared = Vec::new();
        let mut shared_end = 0;
        for (i, seg) in p.segs.iter().enumerate() {
            let sealed = i + 1 < p.segs.len() || !p.last_is_active();
            if !sealed {
                break;
            }
            seg.fetch()?; // issue 17: only in the archive
            let footer = segment::verify_footer(&seg.map)
                .map_err(|e| segment_error(source, &seg.path, e))?;
            if footer.last_seq >= at {
                break;
            }
            shared.push((
                seg.first_seq,
                p.lineage.owner(seg.first_seq).unwrap_or(p.uid),
                seg.path.clone(),
            ));
            shared_end = footer.last_seq + 1;
        }
        let mut rest = self.read_from_locked(&p, source, shared_end, at)?;
        // The last event of the seed (in the copied tail, or the last shared
        // segment): whether it already ends the seed, and its time.
        let last_of_seed = match rest.last() {
            Some(e) => Some((e.kind == "session/end-seed", e.time)),
            None if at > 0 => self
                .read_from_locked(&p, source, at - 1, at)?
                .first()
                .map(|e| (e.kind == "session/end-seed", e.time)),
            None => None,
        };
        self.within_image_budget(&mut p);
        drop(p);
        let (ends_with_seed_marker, seed_time) = last_of_seed.unwrap_or((false, 0));
        if !ends_with_seed_marker {
            let time = seed_time;
            rest.push(OwnedEvent::new("session/end-seed", at, time, "{}").expect("valid JSON"));
        }

        // The child is built in staging and published whole: a crash before
        // leaves a staged directory (discarded at the next open), never a
        // partial child.
        let vfs = &*self.inner.vfs;
        let prepare = |staged: &Path| -> Result<()> {
            if !shared.is_empty() {
                // The lineage must be durable before the links it vouches for.
                Lineage::new(shared.iter().map(|(f, uid, _)| (*f, *uid)).collect())
                    .write_with(vfs, staged)
                    .map_err(io_at(staged))?;
                for (_, _, path) in &shared {
                    // Under its own name: a raw segment or its image.
                    super::segfiles::link_into(vfs, path, staged)?;
                }
            }
            Ok(())
        };
        self.build_and_publish(header, &rest, prepare, Publish::New, &mut |_| {})
            .map_err(|e| {
                // The links took another incarnation's files than the one
                // read (their identity check in staging failed): retried.
                let replaced = !shared.is_empty()
                    && self
                        .inner
                        .vfs
                        .metadata(&parent_dir)
                        .map_or(true, |m| m.identity() != parent_id);
                if replaced {
                    Fork::ParentReplaced(e)
                } else {
                    Fork::Failed(e)
                }
            })
    }

    /// Imports a whole session atomically: `events` (from seq 0) are folded
    /// with every rule of the model and written into a staged directory,
    /// synced, and then published in one rename; any failure leaves the
    /// store as it was. A session with no events is stored as such (its
    /// header only). With `replace`, an existing session of that id is
    /// swapped for the new one in one atomic exchange once the new one is
    /// durable (the old one stays in place until then); without it, an
    /// existing id is [`Error::Exists`]. An unclosed last turn is stored as
    /// it is: [`Store::repair`] closes it.
    ///
    /// [`Store::import_with_progress`] is the same, telling how far it has
    /// got.
    pub fn import(&self, header: SessionHeader, events: &[Event<'_>], replace: bool) -> Result<()> {
        self.import_with_progress(header, events, replace, &mut |_| {})
    }

    /// [`Store::import`], telling `progress` how many of `events` are
    /// written so far, for a progress bar over one big session.
    ///
    /// The events are written in batches of about a quarter of
    /// [`Options::max_record`](super::Options::max_record) bytes each (at
    /// least one event); after each batch but the last, `progress` is told
    /// the events written (into the staged session, not yet durable nor
    /// visible), each count larger than the one before and smaller than
    /// `events.len()`. Then, once the whole session is durable and
    /// published, it is told `events.len()` exactly once, as its last call:
    /// that value means "published" (for a session with no events, 0). On
    /// a failure it is not told `events.len()`, and nothing is stored.
    ///
    /// ```
    /// use sessionlog::event::OwnedEvent;
    /// use sessionlog::sample::{Sample, SampleConfig};
    /// use sessionlog::store::{Options, Store};
    ///
    /// let dir = tempfile::tempdir()?;
    /// // Small records, so that 100 sample turns take several batches.
    /// let options = Options {
    ///     max_record: 256 << 10,
    ///     ..Options::default()
    /// };
    /// let store = Store::open(dir.path(), options)?;
    /// let (header, events) = Sample::new(SampleConfig {
    ///     turns: 100,
    ///     ..SampleConfig::default()
    /// })
    /// .session("s");
    /// let events: Vec<_> = events.iter().map(OwnedEvent::borrowed).collect();
    /// let mut seen = Vec::new();
    /// store.import_with_progress(header, &events, false, &mut |n| seen.push(n))?;
    /// assert!(seen.len() > 2 && seen.windows(2).all(|w| w[0] < w[1]));
    /// assert_eq!(seen.last(), Some(&(events.len() as u64))); // published
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn import_with_progress(
        &self,
        header: SessionHeader,
        events: &[Event<'_>],
        replace: bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        self.writable()?;
        let mode = if replace {
            Publish::NewOrReplace
        } else {
            Publish::New
        };
        self.build_and_publish(header, events, |_| Ok(()), mode, progress)
    }

    /// Builds a new session in a staging directory (`prepare` puts files
    /// there first, then `events` are appended with one sync at the end and
    /// a checkpoint), then publishes it under its id, or swaps it in for the
    /// stored session when `replace`. Any failure before the publish
    /// discards the staged directory: nothing partial is ever visible.
    /// `progress` is told the events written as in
    /// [`Store::import_with_progress`].
    pub(super) fn build_and_publish(
        &self,
        header: SessionHeader,
        events: &[Event<'_>],
        prepare: impl FnOnce(&Path) -> Result<()>,
        mode: Publish,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let id = header.id.clone();
        self.session_dir(&id)?; // a usable id
        // The id's writer lock is held from here to the publish, through
        // the session's entry in the map: no other handle can create,
        // replace or write the id meanwhile.
        let slot = self.slot(&id)?;
        let mut s = slot.lock().expect("session lock");
        // A session this handle writes (an import of its id refused, or a
        // replace that failed) stays as it is on a failure: its unsynced
        // appends, its writer and lock, its poison. Anything else (a
        // placeholder, a session only read) gives back the lock the build
        // took and is loaded again by its next user.
        let writing = !s.placeholder && !s.unpublished && s.lock.is_some();
        let built = self.build_and_publish_locked(&mut s, header, events, prepare, mode, progress);
        // (A session published but not known durable is in the slot now,
        // poisoned, with its lock: kept too.)
        if built.is_err() && !writing && !s.poisoned {
            s.lock = None;
            s.writer = None;
            s.placeholder = true;
        }
        built
    }

    fn build_and_publish_locked(
        &self,
        s: &mut Session,
        header: SessionHeader,
        events: &[Event<'_>],
        prepare: impl FnOnce(&Path) -> Result<()>,
        mode: Publish,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let id = header.id.clone();
        self.lock_session(s)?;
        let declared = self
            .inner
            .pending
            .lock()
            .expect("pending lock")
            .contains_key(&id);
        let old = self.entry(&id)?;
        let existing = old.is_some();
        if declared || existing && mode == Publish::New {
            return Err(Error::Exists(id));
        }
        let uid = new_uid(&id);
        let registry = &self.inner.registry;
        let staged = registry
            .stage(&header, &uid)
            .map_err(|(path, source)| Error::Io { path, source })?;
        let mut built = None;
        let result = (|| -> Result<()> {
            prepare(&staged)?;
            let entry = SessionEntry {
                header: header.clone(),
                uid,
                dir: staged.clone(),
                found: None,
            };
            let (c, _) = self.load_session(entry, true)?;
            let c = built.insert(c);
            // The id's lock, lent for the build (a second lock object on
            // the same key would release the first when dropped).
            c.lock = s.lock.take();
            // One sync for the whole build, at the end: nothing is visible
            // before the publish.
            c.defer_sync = true;
            let mut written = 0;
            for batch in split_batches(events, self.inner.options.max_record as usize / 4) {
                self.append_locked(c, batch)?;
                written += batch.len();
                if written < events.len() {
                    progress(written as u64);
                }
            }
            c.defer_sync = false;
            c.sync_now()?;
            // A small log reopens by replaying it faster than a checkpoint
            // is read, and the checkpoint file would cost a block of its
            // own (1,000 small imported sessions would spend as much on
            // checkpoints as on their logs).
            if c.since_checkpoint >= SMALL_LOG_EVENTS {
                self.write_checkpoint(c, true)?;
            }
            Ok(())
        })();
        if let Some(c) = &mut built
            && s.lock.is_none()
        {
            s.lock = c.lock.take();
        }
        if let Err(e) = result {
            let _ = registry.discard(&staged);
            return Err(e);
        }
        let mut c = built.expect("built");
        // No upload pass of this handle between the forget and the exchange.
        let _quiet = existing.then(|| self.archive_quiet());
        let published = if existing {
            // Issue 17: the old session's objects go first (the new one's
            // files have the same names), once what only the bucket held
            // of it is local again: the exchange may still fail.
            self.archive_forget(&id, old.as_ref().map(|e| e.dir.as_path()))?;
            // A failure of the exchange leaves the old session in place; a
            // failure after it (syncing, removing the old) leaves the new
            // one: either way nothing is partial, and the staged path holds
            // whichever is not live (discarded at the next open).
            registry.replace(&staged, &id)
        } else {
            registry.publish(&staged, &id)
        };
        match published {
            Ok(live) => c.move_to(live),
            // Visible, but not known durable (a failed directory sync):
            // like a failed fsync of an append, the session is poisoned,
            // with its lock, so nothing is acknowledged on top of it.
            Err(PublishError::Unsynced(live, path, source)) => {
                c.move_to(live);
                // The next writer (another process, once this one is
                // gone) syncs the session's directories before it
                // acknowledges anything (`ensure_writer`).
                c.poisoned = true;
                c.lock = s.lock.take();
                *s = c;
                return Err(Error::Io { path, source });
            }
            // Nothing visible changed (a replace's old session is in place).
            Err(e) => {
                let e = publish_error(e, &id);
                if !existing {
                    let _ = registry.discard(&staged);
                }
                return Err(e);
            }
        }
        // The new session takes the entry's place, with the lock, as the
        // most recently used (eviction releases the least recently used).
        c.lock = s.lock.take();
        c.dir_id = self
            .inner
            .vfs
            .metadata(&c.dir)
            .map_or((0, None), |m| m.identity());
        c.used = self
            .inner
            .clock
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *s = c;
        // Segments the build sealed, now in their final directory.
        self.queue_compression(s, None);
        // Durable and published.
        progress(events.len() as u64);
        Ok(())
    }
}
