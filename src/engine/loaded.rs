//! The map of loaded sessions of a [`Store`] handle: finding (or adding)
//! a session's entry, loading it on first use, bringing a session another
//! handle writes up to date before each use, and evicting idle sessions
//! when the map is full (`Options::max_open_sessions`).

use super::error::{Error, Result, io_at};
use super::handle::Store;
use super::load::Recovery;
use super::registry::SessionEntry;
use super::session::Session;
use crate::header::SessionHeader;
use crate::segment;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

impl Store {
    /// [`Store::with_session`] for a session this handle has loaded:
    /// `None`, with nothing added to the map (so nothing evicted), when it
    /// has not. Does not count as a use of the session.
    pub(super) fn with_loaded<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Result<T>,
    ) -> Result<Option<T>> {
        let Some(slot) = self
            .inner
            .sessions
            .read()
            .expect("sessions lock")
            .get(id)
            .cloned()
        else {
            return Ok(None);
        };
        let mut s = slot.lock().expect("session lock");
        // Forgotten while this call waited, or not loaded (yet, or its load
        // failed): read from the files instead.
        if s.placeholder || !self.is_current(id, &slot) {
            return Ok(None);
        }
        self.open_handle()?;
        if let Err(e) = self.refresh(&mut s) {
            s.placeholder = true;
            drop(s);
            self.forget(id, &slot);
            return Err(e);
        }
        let out = f(&mut s);
        self.within_image_budget(&mut s);
        out.map(Some)
    }

    /// Runs `f` on session `id`, loaded and up to date. The session map's
    /// lock is held only to find (or add) the session's entry, never while
    /// a session loads, so loading or rebuilding one session does not stall
    /// the others. A session this handle does not write is refreshed first:
    /// appends made since by any writer (in any process) are folded in.
    pub(super) fn with_session<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Session) -> Result<T>,
    ) -> Result<T> {
        self.open_handle()?;
        let mut slot = self.slot(id)?;
        let mut s = slot.lock().expect("session lock");
        // An entry forgotten while this call waited for it (its load failed
        // in another thread, the session was deleted) is nobody's any more:
        // loading it would make a second session object for the id, with a
        // writer and a lock of its own (the same process's lock, so taking
        // it again succeeds). The map's current entry is used instead.
        while !self.is_current(id, &slot) {
            drop(s);
            slot = self.slot(id)?;
            s = slot.lock().expect("session lock");
        }
        // Closed while this call waited: nothing more is written.
        self.open_handle()?;
        let ready = if s.placeholder {
            self.load_into(&mut s, id)
        } else {
            self.refresh(&mut s)
        };
        if let Err(e) = ready {
            s.placeholder = true;
            drop(s);
            self.forget(id, &slot);
            return Err(e);
        }
        s.used = self.inner.clock.fetch_add(1, Ordering::Relaxed);
        let out = f(&mut s);
        self.within_image_budget(&mut s);
        out
    }

    /// Memory stays bounded whatever a call on session `s` decoded (a
    /// derive, a rebuild, a fork's footer checks, a checkpoint's derive
    /// cache): past `max_decoded_images` the session gives its decoded
    /// images back, and whatever borrows them (a `Derived`) keeps its own
    /// clones. Every call that may decode images ends with this.
    pub(super) fn within_image_budget(&self, s: &mut Session) {
        if self.inner.decoded.load(Ordering::Relaxed) > self.inner.options.max_decoded_images {
            s.release_images();
        }
    }

    /// Whether `slot` is session `id`'s entry in the map (not one forgotten).
    fn is_current(&self, id: &str, slot: &Arc<Mutex<Session>>) -> bool {
        self.inner
            .sessions
            .read()
            .expect("sessions lock")
            .get(id)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
    }

    /// The map entry of session `id`, added (as a placeholder, loaded by the
    /// first user) when missing. Adding may evict idle sessions first.
    pub(super) fn slot(&self, id: &str) -> Result<Arc<Mutex<Session>>> {
        if let Some(s) = self.inner.sessions.read().expect("sessions lock").get(id) {
            return Ok(s.clone());
        }
        let mut placeholder = self.new_session(SessionHeader::new(id, 0))?;
        placeholder.placeholder = true;
        self.checkpoint_before_eviction();
        let mut sessions = self.inner.sessions.write().expect("sessions lock");
        if let Some(s) = sessions.get(id) {
            return Ok(s.clone());
        }
        if sessions.len() >= self.inner.options.max_open_sessions.max(1) {
            self.evict_idle(&mut sessions);
        }
        let s = Arc::new(Mutex::new(placeholder));
        sessions.insert(id.to_owned(), s.clone());
        Ok(s)
    }

    /// Removes `slot` from the map if it is still the entry of `id`.
    pub(super) fn forget(&self, id: &str, slot: &Arc<Mutex<Session>>) {
        let mut sessions = self.inner.sessions.write().expect("sessions lock");
        if sessions.get(id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            sessions.remove(id);
        }
    }

    /// Loads session `id` into a placeholder: the stored session (read
    /// only until its first write), or a declared one.
    pub(super) fn load_into(&self, s: &mut Session, id: &str) -> Result<()> {
        let fresh = match self.entry(id)? {
            Some(entry) => {
                let (fresh, rec) = self.load_entry(id, entry)?;
                self.record_recovery(id, rec);
                fresh
            }
            None => {
                let pending = self.inner.pending.lock().expect("pending lock");
                let header = pending
                    .get(id)
                    .cloned()
                    .ok_or_else(|| Error::NotFound(id.to_owned()))?;
                self.new_session(header)?
            }
        };
        *s = fresh;
        Ok(())
    }

    /// Loads `entry` without its writer lock. Another handle may replace
    /// the session (`RENAME_EXCHANGE`) between the lookup's read of the
    /// `HEADER` and the load's listing, which would build one incarnation
    /// from the other's files: a false `Corrupt` (the segments are salted
    /// with another uid); or its writer may start a segment and write a
    /// checkpoint ending in it between the load's listing and its read of
    /// the checkpoint: a false `Corrupt` too (the listing lacks the
    /// segment). So a load that failed as corrupt, or whose directory is
    /// not the one whose `HEADER` was read, starts again from a new lookup
    /// (at most twice more: each retry needs another such change to land
    /// in the same window).
    pub(super) fn load_entry(
        &self,
        id: &str,
        mut entry: SessionEntry,
    ) -> Result<(Session, Recovery)> {
        for _ in 0..2 {
            let Some(found) = entry.found else { break };
            match self.load_session(entry.clone(), false) {
                Ok((fresh, rec)) if fresh.dir_id == found => return Ok((fresh, rec)),
                Ok(_) => {}
                Err(e) => {
                    let now = self.inner.vfs.metadata(&entry.dir).map(|m| m.identity());
                    // The same directory: damage, unless the listing was
                    // older than the checkpoint read after it (the writer
                    // started a segment and checkpointed into it in
                    // between: "the segment is missing"); a new load lists
                    // again, and real damage is found again.
                    let corrupt = matches!(e, Error::Corrupt { .. });
                    if now.is_ok_and(|now| now == found) && !corrupt {
                        return Err(e);
                    }
                }
            }
            entry = self
                .entry(id)?
                .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        }
        self.load_session(entry, false)
    }

    /// Records how session `id` was loaded, for [`Store::recovery`].
    pub(super) fn record_recovery(&self, id: &str, rec: Recovery) {
        self.inner
            .recoveries
            .lock()
            .expect("lock")
            .insert(id.to_owned(), rec);
    }

    /// Brings a session this handle does not write up to date with its
    /// files: another handle may have appended, sealed a segment, or
    /// replaced or deleted the session since it was loaded. The common case,
    /// nothing new, costs a `stat` and one positional read of 8 bytes (a
    /// listing of the session directory when its last segment is sealed).
    fn refresh(&self, s: &mut Session) -> Result<()> {
        if s.lock.is_some() || s.unpublished {
            return Ok(()); // nobody else writes it
        }
        let vfs = &*self.inner.vfs;
        let id = s.header.id.clone();
        match vfs.metadata(&s.dir) {
            Ok(m) if m.identity() == s.dir_id => {}
            // Replaced (or deleted and created again) by another handle.
            Ok(_) => return self.load_into(s, &id),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(id));
            }
            Err(e) => {
                return Err(Error::Io {
                    path: s.dir.clone(),
                    source: e,
                });
            }
        }
        let Some(end) = s.active_end else {
            // No active segment: the writer may have started one since, and
            // that file may be sealed, compressed (`.segz`) or evicted to
            // the archive by now (behind a newer segment: the last one is
            // never evicted). Any segment file from the next seq on means
            // new records; only a listing finds all of those.
            let next = s.next_seq();
            let names = match vfs.read_dir(&s.dir) {
                Ok(names) => names,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::NotFound(id));
                }
                Err(e) => return Err(io_at(&s.dir)(e)),
            };
            if super::segfiles::list(names, &s.dir)
                .iter()
                .any(|(first_seq, _)| *first_seq >= next)
            {
                return self.load_into(s, &id);
            }
            return Ok(());
        };
        let seg = s.segs.last().expect("an active segment is mapped");
        let (path, first_seq) = (seg.path.clone(), seg.first_seq);
        let ident = s.ident(self.inner.store_id, first_seq);
        match self.visible_end(&id, &path, &ident, end)? {
            segment::Committed::Records { end: e } if e == end => Ok(()),
            segment::Committed::Records { end: e } => self.fold_new_records(s, e),
            // Sealed (and maybe a new segment started): load again, which
            // costs the records since the checkpoint.
            segment::Committed::Sealed { .. } => self.load_into(s, &id),
        }
    }

    /// The idle sessions an eviction of the map would release now (not in
    /// use by another thread), least recently used first: a quarter of the
    /// map. Empty while the map is not full.
    fn eviction_candidates(
        &self,
        sessions: &HashMap<String, Arc<Mutex<Session>>>,
    ) -> Vec<(u64, String)> {
        if sessions.len() < self.inner.options.max_open_sessions.max(1) {
            return Vec::new();
        }
        let mut idle: Vec<(u64, String)> = sessions
            .iter()
            .filter(|(_, slot)| Arc::strong_count(slot) == 1)
            .filter_map(|(id, slot)| {
                let s = slot.try_lock().ok()?;
                Some((s.used, id.clone()))
            })
            .collect();
        idle.sort();
        idle.truncate((sessions.len() / 4).max(1));
        idle
    }

    /// Checkpoints the sessions the next eviction will release, before it
    /// and without the map's lock (a checkpoint syncs files; the map's lock
    /// would stall every other session meanwhile). A released session
    /// otherwise kept its records past its last checkpoint uncovered: a
    /// later cut of its tail at a record boundary would read as a shorter
    /// log, where `close` promises a checkpoint over every record (format-
    /// spec section 8). Best effort: a failed checkpoint leaves the
    /// session as it was, released all the same.
    fn checkpoint_before_eviction(&self) {
        let slots: Vec<Arc<Mutex<Session>>> = {
            let sessions = self.inner.sessions.read().expect("sessions lock");
            self.eviction_candidates(&sessions)
                .iter()
                .filter_map(|(_, id)| sessions.get(id).cloned())
                .collect()
        };
        for slot in slots {
            let Ok(mut s) = slot.try_lock() else {
                continue; // in use again: not evicted
            };
            if s.since_checkpoint > 0 && s.lock.is_some() && !s.poisoned && !s.placeholder {
                let _ = self.write_checkpoint(&mut s, true);
                self.within_image_budget(&mut s);
            }
        }
    }

    /// Evicts idle sessions (not in use by another thread) from a full map,
    /// least recently used first: a quarter of the map, so eviction is rare.
    /// An evicted session is synced, its preallocated tail trimmed and its
    /// writer lock released (checkpointed just before, outside the map's
    /// lock: [`Store::checkpoint_before_eviction`]); loading it again costs
    /// a checkpoint read.
    ///
    /// The release happens here, under the map's write lock, on purpose:
    /// writer locks are owned by this handle's open file description, so a
    /// new entry for the same id taking its lock while the old one still
    /// held it would "succeed" (same owner), and the old one's release
    /// would then unlock the new one's lock. Releasing before the entry
    /// leaves the map rules that out, at the cost of a sync (Batched and
    /// None modes only) while the map is locked.
    fn evict_idle(&self, sessions: &mut HashMap<String, Arc<Mutex<Session>>>) {
        for (_, id) in self.eviction_candidates(sessions) {
            let Some(slot) = sessions.get(&id) else {
                continue;
            };
            let released = match slot.try_lock() {
                Ok(mut s) => s.release().is_ok(),
                Err(_) => false,
            };
            // A session whose sync failed stays (poisoned), so the failure
            // is reported to its next user rather than lost.
            if released {
                sessions.remove(&id);
            }
        }
    }
}
