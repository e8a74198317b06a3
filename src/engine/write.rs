//! The write path: append (fold, encode, write, sync, index, checkpoint),
//! segment roll-over, and the store-level changes built on it (delete,
//! repair; import and fork are in `publish`).

use super::error::{Error, Result, io_at, publish_error, rejected, segment_error};
use super::handle::Store;
use super::options::Durability;
use super::registry::PublishError;
use super::session::{Seg, Session, View};
use crate::checkpoint::{self, CheckpointBody};
use crate::codec;
use crate::event::{Event, OwnedEvent};
use crate::segment::{self, SegmentIdent, SegmentWriter};
use crate::vfs::SegmentBytes;
use std::time::{Duration, Instant};

/// How long a writer refused a session waits for another handle's
/// maintenance (format-spec section 9) before it reports `Locked`.
const MAINTENANCE_WAIT: Duration = Duration::from_secs(10);

/// How a record's events are encoded: message events verbatim (derive
/// reads them in place), the rest packed when that pays.
const RECORD_ENCODING: codec::EncodeOptions = codec::EncodeOptions {
    compress: true,
    verbatim_surface: true,
};

/// A session identity for segment salting: distinct per creation, so a
/// deleted and re-created session's stale segments cannot validate.
pub(super) fn new_uid(id: &str) -> [u8; 16] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut a = crc32fast::Hasher::new();
    a.update(id.as_bytes());
    a.update(&nanos.to_le_bytes());
    a.update(&std::process::id().to_le_bytes());
    let h1 = a.finalize();
    let mut uid = [0u8; 16];
    uid[..4].copy_from_slice(&h1.to_le_bytes());
    uid[4..].copy_from_slice(&nanos.to_le_bytes()[..12]);
    uid
}

impl Store {
    /// Appends a batch of events: the first seq must be the session's next
    /// seq, the batch contiguous, every rule of the model kept. A bad batch
    /// is rejected whole and nothing is stored. Returns once the batch is
    /// durable (in [`Durability::Sync`]).
    pub fn append(&self, id: &str, events: &[Event<'_>]) -> Result<()> {
        self.writable()?;
        if events.is_empty() {
            return Ok(());
        }
        let mut lost_race = false;
        let appended = self.with_session(id, |s| {
            let appended = self.append_locked(s, events);
            let exists = matches!(appended, Err(Error::Exists(_)));
            if s.unpublished && (s.poisoned || exists) {
                // Its first batch was never published and its staged
                // directory is gone: forget the half-built session (and its
                // lock). After an I/O error the declaration stays, so a
                // retry starts afresh; when another handle created the id
                // meanwhile, the next use loads theirs.
                if s.staged {
                    let _ = self.inner.registry.discard(&s.dir);
                }
                s.writer = None;
                s.lock = None;
                s.placeholder = true;
                lost_race = exists;
            }
            appended
        });
        if lost_race {
            self.inner.pending.lock().expect("pending lock").remove(id);
        }
        appended
    }

    /// Takes this handle's writer lock on `s`, or fails with
    /// [`Error::Locked`] (another handle, in any process, writes it) before
    /// anything is written.
    pub(super) fn lock_session(&self, s: &mut Session) -> Result<()> {
        self.lock_session_for(s, None)
    }

    /// [`Store::lock_session`]; `deleting`: to delete the session of this
    /// uid, which an archive tombstone does not refuse (nor, for a stale
    /// copy, another host's lease of the id's new incarnation).
    fn lock_session_for(&self, s: &mut Session, deleting: Option<&[u8; 16]>) -> Result<()> {
        if s.lock.is_some() {
            return Ok(());
        }
        let id = &s.header.id;
        let locks = self.inner.locks.as_ref().ok_or(Error::ReadOnly)?;
        let io = |source| Error::Io {
            path: locks.path().to_owned(),
            source,
        };
        // A handle maintaining sessions (a writable open writing back an
        // orphaned journal, a salvage) holds their locks for a moment
        // without being their writer: wait that out, up to a bound. Seen
        // refused with no maintenance running, after one more try (the
        // maintenance may have ended between the two looks), the session
        // has a writer.
        let deadline = Instant::now() + MAINTENANCE_WAIT;
        let mut pause = Duration::from_millis(1);
        let lock = loop {
            if let Some(lock) = locks.try_lock(id).map_err(io)? {
                break lock;
            }
            let waiting = locks.maintenance_running().map_err(io)? && Instant::now() < deadline;
            if !waiting {
                if let Some(lock) = locks.try_lock(id).map_err(io)? {
                    break lock;
                }
                return Err(Error::Locked {
                    session: id.clone(),
                    path: locks.path().to_owned(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        };
        self.archive_lease(id, deleting)?; // issue 17: fenced across hosts
        s.lock = Some(lock);
        Ok(())
    }

    /// Makes this handle the writer of `s`: takes its writer lock, then
    /// loads it again from its files with authority (nothing else can
    /// change them now): a torn tail is cut, a seal a crash interrupted is
    /// finished, the segment writer opened; then, unless
    /// [`Options::close_interrupted_turns`](super::Options) is off, an open
    /// last turn (its previous writer stopped mid-turn) gets its closers.
    pub(super) fn ensure_writer(&self, s: &mut Session) -> Result<()> {
        if s.lock.is_some() {
            if s.closers_due {
                return self.close_interrupted_turn(s);
            }
            return Ok(());
        }
        self.lock_session(s)?;
        let id = s.header.id.clone();
        let entry = self.entry(&id);
        if s.unpublished {
            // Declared here; another handle may have created it meanwhile.
            return match entry {
                Ok(None) => Ok(()),
                Ok(Some(_)) => {
                    s.lock = None;
                    Err(Error::Exists(id))
                }
                Err(e) => {
                    s.lock = None;
                    Err(e)
                }
            };
        }
        let loaded = entry.and_then(|e| {
            let e = e.ok_or_else(|| Error::NotFound(id.clone()))?;
            // Acknowledged records a gone handle's journal holds go back
            // into the segments before the load cuts a torn tail.
            self.replay_journals_for(&e)?;
            self.load_session(e, true)
        });
        let (mut fresh, rec) = match loaded {
            Ok(l) => l,
            Err(e) => {
                s.lock = None;
                return Err(e);
            }
        };
        fresh.lock = s.lock.take();
        fresh.used = s.used;
        *s = fresh;
        // Records past the checkpoint may be in the page cache only (their
        // writer died before its sync: Batched, None, or the journal's
        // background sync): this writer builds on them and checkpoints
        // them, so they count as unsynced, and the next sync (an append's,
        // the group commit's, a flush's, a release's; always before a
        // checkpoint) makes them durable. A checkpoint covers synced
        // records only.
        if rec.replayed > 0 || !rec.used_checkpoint {
            s.dirty = true;
        }
        // Likewise the directory entries the previous writer made may be
        // in the page cache only (killed before its directory sync: the
        // rename that published the session, a new segment's name; or
        // poisoned by a failed one, which only that process knew): this
        // writer acknowledges batches that rest on them, so they are made
        // durable first: the session's directory (its files' names) and
        // `sessions/` (the session's own name). A failure is a failed
        // fsync: poisoned.
        if let Err(e) = self.sync_session_dirs(&s.dir) {
            s.poisoned = true;
            return Err(e);
        }
        // With the journal an append is acknowledged without a sync of its
        // segment, so "the next sync" above could come only after batches
        // were acknowledged on top of the inherited records: a power loss
        // would then leave a gap of zeros before them (the journal holds
        // them, not the inherited ones, whose writer died before writing
        // its journal entry). They are synced now, before anything is.
        if s.dirty && self.inner.journal.is_some() {
            s.sync_now()?;
        }
        // Images a killed compressor left half written, whatever this
        // handle's options (a `compress` killed mid-write is swept by any
        // later writer, not only by one that compresses in the background).
        super::tmpfile::sweep(&*self.inner.vfs, &s.dir, super::tmpfile::COMPRESS);
        self.queue_compression(s, None);
        // Recorded first: deciding the closers may rebuild the session from
        // the log (a checkpoint found wrong), which records its own reason.
        self.record_recovery(&id, rec);
        if self.inner.options.close_interrupted_turns {
            self.close_interrupted_turn(s)?;
        }
        Ok(())
    }

    /// Appends the closers of the session's open last turn, if any (none
    /// when it is balanced). A failure that does not poison the session
    /// (a full disk) leaves them due: the next write tries again first, so
    /// no batch goes on after a turn its writer never closed.
    fn close_interrupted_turn(&self, s: &mut Session) -> Result<()> {
        // Cleared first: appending them takes this path again.
        s.closers_due = false;
        match self.append_closers(s) {
            Ok(closers) => {
                let id = &s.header.id;
                if let Some(r) = self.inner.recoveries.lock().expect("lock").get_mut(id) {
                    r.closers = closers.len() as u64;
                }
                Ok(())
            }
            Err(e) => {
                s.closers_due = !s.poisoned;
                Err(e)
            }
        }
    }

    /// Appends one event, assigning its seq (the next) and time (`time_ms`),
    /// like the harness's `Session.append(type, data, surfaceIntent)`.
    /// Returns the seq given.
    pub fn append_new(&self, id: &str, mut event: OwnedEvent, time_ms: i64) -> Result<u64> {
        self.writable()?;
        self.with_session(id, |s| {
            // The seq is assigned under the writer lock, after the reload
            // that taking it does.
            self.ensure_writer(s)?;
            event.seq = s.next_seq();
            event.time = time_ms;
            self.append_locked(s, std::slice::from_ref(&event))?;
            Ok(event.seq)
        })
    }

    pub(super) fn append_locked(&self, s: &mut Session, events: &[Event<'_>]) -> Result<()> {
        let id = s.header.id.clone();
        if s.poisoned {
            return Err(Error::Poisoned(id));
        }
        self.archive_check(&id)?; // issue 17: another host took it over
        self.ensure_writer(s)?;
        self.materialise(s)?;
        let Session {
            state,
            segs,
            node_locs,
            ..
        } = &mut *s;
        let view = View { segs, node_locs };
        // A large batch's pack is compressed on the other core meanwhile.
        let pending = self.inner.packer.start(events, RECORD_ENCODING);
        let undo = state
            .append_batch_undoable(events, &view)
            .map_err(|violation| rejected(&id, events, violation))?;
        let pack = pending.and_then(|p| p.wait());
        let written = self.write_batch(s, events, pack.as_ref());
        if let Some(pack) = pack {
            self.inner.packer.recycle(pack);
        }
        if let Err(e) = written {
            s.state.revert(undo);
            return Err(e);
        }
        Ok(())
    }

    /// Steps 2-4 of an append, after the fold accepted the batch. `pack`:
    /// the batch's pack, when the helper built it.
    pub(super) fn write_batch(
        &self,
        s: &mut Session,
        events: &[Event<'_>],
        pack: Option<&codec::Pack>,
    ) -> Result<()> {
        let opts = &self.inner.options;
        let id = s.header.id.clone();
        let mut payload = Vec::new();
        // Message events stay verbatim: derive reads them in place from the
        // mapping. Everything else (chunks above all) goes into the batch's
        // compressed pack when that pays. The encoder reports where each
        // verbatim `data` lands, so indexing the batch below needs no
        // re-decode of what was just written.
        let mut data_ranges = Vec::with_capacity(events.len());
        super::packer::encode(
            events,
            RECORD_ENCODING,
            pack,
            &mut payload,
            &mut data_ranges,
        )
        .map_err(|source| Error::Encode {
            session: id.clone(),
            source,
        })?;
        let size = (payload.len() + segment::BATCH_HEADER_LEN) as u64;
        if size > u64::from(opts.max_record) {
            return Err(Error::TooLarge {
                session: id,
                size,
                max: opts.max_record,
            });
        }
        let first_seq = events[0].seq;
        let first_append = s.unpublished;
        let vfs = &*self.inner.vfs;
        if first_append && !s.staged {
            // A new session is built where no other process looks, and
            // published whole once its first batch is durable.
            s.dir = self
                .inner
                .registry
                .stage(&s.header, &s.uid)
                .map_err(|(path, source)| Error::Io { path, source })?;
            s.staged = true;
        }
        let full = s.writer.as_ref().is_some_and(|w| {
            w.len() + size + segment::FRAME_OVERHEAD as u64 > opts.segment_size && !w.is_empty()
        });
        if full {
            self.roll_over(s)?;
        }
        if s.writer.is_none() {
            self.start_segment(s, first_seq)?;
        }
        let writer = s.writer.as_mut().expect("active segment");
        writer.set_preallocate(growth_step(opts.preallocate, writer.len()));
        let seg_first = writer.ident().first_seq;
        let path = s.segs.last().expect("active segment mapped").path.clone();
        let loc = writer
            .append(first_seq, events.len() as u32, &payload)
            .map_err(|e| segment_error(&id, &path, e))?;
        s.dirty = true;
        if opts.durability == Durability::Sync && !s.defer_sync {
            match &self.inner.journal {
                // A first batch is synced in its segment: publishing needs it.
                Some(j) if !first_append => {
                    self.journal_commit(j, s, &id, seg_first, loc.offset)?
                }
                _ => s.sync_now()?,
            }
        }
        if first_append {
            // The session becomes visible only once its first batch is durable
            // (in every mode: a session never appears empty after a crash),
            // by one rename of its directory. The record is already written,
            // so a failure here cannot be rolled back in place: the session
            // is poisoned, and its staged directory discarded.
            if opts.durability != Durability::Sync {
                s.sync_now()?;
            }
            match self.inner.registry.publish(&s.dir, &id) {
                Ok(live) => s.move_to(live),
                Err(PublishError::Unsynced(live, path, source)) => {
                    // Visible, but not known durable: like a failed fsync.
                    s.move_to(live);
                    s.unpublished = false;
                    s.poisoned = true;
                    self.inner.pending.lock().expect("pending lock").remove(&id);
                    return Err(Error::Io { path, source });
                }
                Err(e) => {
                    s.poisoned = true;
                    let _ = self.inner.registry.discard(&s.dir);
                    s.staged = false;
                    return Err(publish_error(e, &id));
                }
            }
            s.unpublished = false;
            self.inner.pending.lock().expect("pending lock").remove(&id);
        }
        // Index the batch: remap when the record lies past the mapping (or
        // when the file system's maps are copies, not views of the file).
        // The record is in the segment now (durable in Sync mode), so the
        // caller's undo of the fold would leave the index behind the log:
        // a failure here poisons the session instead (reopen re-reads it).
        let end = loc.offset + loc.payload_len as u64 + segment::FRAME_OVERHEAD as u64;
        let indexed = (|| -> Result<()> {
            if s.segs.last().expect("active").map.len() < end as usize || !vfs.coherent_maps() {
                // (Read the path again: a first append moved the directory.)
                let path = s.segs.last().expect("active").path.clone();
                let map = self.map_file(&path)?;
                s.segs.last_mut().expect("active").map = map;
            }
            let map = s.segs.last().expect("active").map.clone();
            let r = segment::BatchLoc {
                offset: loc.offset,
                payload: loc.offset + 8..loc.offset + 8 + u64::from(loc.payload_len),
                first_seq,
                count: events.len() as u32,
            };
            let base = r.codec_range().start as usize;
            let last_time = events.last().expect("a batch is not empty").time;
            s.index_batch(seg_first, &map, &r, last_time, |i| {
                let d = data_ranges[i].as_ref()?;
                Some(base + d.start..base + d.end)
            })
            .map_err(|reason| Error::Internal {
                session: id.clone(),
                reason,
            })
        })();
        if let Err(e) = indexed {
            s.poisoned = true;
            return Err(e);
        }
        s.since_checkpoint += events.len() as u64;
        let threshold = opts
            .checkpoint_every
            .max(s.batches.len() as u64 + s.state.surface().len() as u64);
        if s.since_checkpoint >= threshold {
            // The batch is written and indexed (and durable in Sync mode):
            // failing the append now would make the caller's undo of the
            // fold disagree with the log. The checkpoint is only a cache;
            // `since_checkpoint` stays, so the next append past the
            // threshold or `flush` tries again (and `flush` reports it).
            let _ = self.write_checkpoint(s, false);
        }
        Ok(())
    }

    /// Makes the record just written durable through the journal (shared
    /// sync), or by syncing its segment when it is too large to journal. A
    /// failure poisons the session, as a failed segment sync does.
    fn journal_commit(
        &self,
        j: &super::journal::Journal,
        s: &mut Session,
        id: &str,
        segment: u64,
        offset: u64,
    ) -> Result<()> {
        let writer = s.writer.as_ref().expect("active segment");
        let committed = match writer.last_frame() {
            Some(record) if j.takes(id, record) => j.commit(&crate::journal::Entry {
                uid: writer.ident().session_uid,
                segment,
                offset,
                session: id,
                record,
            }),
            _ => return s.sync_now(),
        };
        committed.map_err(|(path, source)| {
            s.poisoned = true;
            Error::Io { path, source }
        })
    }

    /// `fsync`s session directory `dir` and `sessions/`, its parent: the
    /// names of the session's files and the session's own name.
    fn sync_session_dirs(&self, dir: &std::path::Path) -> Result<()> {
        let vfs = &*self.inner.vfs;
        vfs.sync_dir(dir).map_err(io_at(dir))?;
        if let Some(parent) = dir.parent() {
            vfs.sync_dir(parent).map_err(io_at(parent))?;
        }
        Ok(())
    }

    pub(super) fn start_segment(&self, s: &mut Session, first_seq: u64) -> Result<()> {
        let ident = SegmentIdent {
            store_id: self.inner.store_id,
            session_uid: s.uid,
            first_seq,
        };
        let path = s.dir.join(segment::segment_file_name(first_seq));
        let vfs = &*self.inner.vfs;
        // On failure `create_with` removes the file itself: a retry can
        // create it again.
        let first_step = growth_step(self.inner.options.preallocate, 0);
        let mut w = SegmentWriter::create_with(vfs, &path, &ident, first_step)
            .map_err(|e| segment_error(&s.header.id, &path, e))?;
        w.set_max_record(self.inner.options.max_record)
            .map_err(|e| segment_error(&s.header.id, &path, e))?;
        let finish = || -> Result<SegmentBytes> {
            // The new segment's name must be durable before a batch in it is
            // acknowledged: otherwise a crash could lose the whole file.
            vfs.sync_dir(&s.dir).map_err(io_at(&s.dir))?;
            self.map_file(&path)
        };
        let map = match finish() {
            Ok(map) => map,
            Err(e) => {
                // The file exists (holding no record) but its name may not be
                // durable: a failed directory fsync is a failed fsync. The
                // session is poisoned; the next open finds the empty segment
                // (or no file) past the checkpoint's, syncs the directory
                // (`ensure_writer`) and continues from there.
                s.poisoned = true;
                return Err(e);
            }
        };
        s.segs.push(Seg::local(first_seq, path, map));
        s.writer = Some(w);
        Ok(())
    }

    pub(super) fn roll_over(&self, s: &mut Session) -> Result<()> {
        s.sync_if_dirty()?;
        let w = s.writer.take().expect("active segment");
        s.active_end = None;
        let path = s.segs.last().expect("active").path.clone();
        let sealed = w
            .seal_auto()
            .and_then(|()| segment::map_sealed_with(&*self.inner.vfs, &path))
            .map_err(|e| segment_error(&s.header.id, &path, e));
        match sealed {
            Ok(map) => {
                let seg = s.segs.last_mut().expect("active");
                seg.map = map;
                let first_seq = seg.first_seq;
                self.queue_compression(s, Some(first_seq));
                Ok(())
            }
            Err(e) => {
                // The writer is gone and the segment may hold a footer
                // without its cut, or no footer: a new segment after it
                // would make an unsealed segment a middle one (corruption
                // at the next open). The old map may also reach past the cut
                // file. Poisoned: the next open completes or undoes the seal.
                s.poisoned = true;
                Err(e)
            }
        }
    }

    /// Writes the session's checkpoint. The derive cache in it is brought up
    /// to date when that is incremental, or when `complete` (flush, close):
    /// a checkpoint taken in passing during appends keeps a cache that a
    /// replacement made stale rather than rebuild it, since the rebuild is
    /// O(surface) and a stale cache only makes the next derive rebuild it.
    pub(super) fn write_checkpoint(&self, s: &mut Session, complete: bool) -> Result<()> {
        let Some(last) = s.last_record else {
            return Ok(());
        };
        if s.lock.is_none() {
            // Only the session's writer writes its checkpoint.
            return Ok(());
        }
        self.materialise(s)?;
        // A checkpoint only ever covers durable records.
        s.sync_if_dirty()?;
        let Session {
            derive,
            state,
            segs,
            node_locs,
            header,
            ..
        } = &mut *s;
        if complete || !derive.needs_rebuild(state.surface()) {
            derive
                .update(state.surface(), &View { segs, node_locs })
                .map_err(|source| Error::Index {
                    session: header.id.clone(),
                    source,
                })?;
        }
        let body = CheckpointBody {
            coverage: last.coverage(s.state.next_seq()),
            last_time: s.last_time,
            state: s.state.clone(),
            derive: s.derive.clone(),
            batches: s.batches.to_vec(),
            node_locs: s.node_locs.0.clone(),
        };
        let bytes = checkpoint::encode(&body);
        let vfs = &*self.inner.vfs;
        let failed = |e: std::io::Error| Error::Checkpoint {
            session: s.header.id.clone(),
            dir: s.dir.clone(),
            source: e.into(),
        };
        // A small session's checkpoint goes into its HEADER (one block
        // instead of two); the store must be of a version that reads it.
        let embedding = if self.inner.options.embed_checkpoints {
            super::ckfile::embedding(vfs, &s.dir, &bytes).map_err(failed)?
        } else {
            None
        };
        match embedding {
            Some(header) => {
                self.raise_store_version()?;
                super::ckfile::put(vfs, &s.dir, super::registry::HEADER_FILE, &header)
            }
            None => super::ckfile::put(vfs, &s.dir, checkpoint::CHECKPOINT_FILE, &bytes),
        }
        .map_err(failed)?;
        s.since_checkpoint = 0;
        Ok(())
    }

    /// Closes an interrupted last turn: appends the repair closers as one
    /// batch and syncs it, whatever the durability mode. Returns them (empty
    /// when the log is balanced).
    pub(super) fn append_closers(&self, s: &mut Session) -> Result<Vec<OwnedEvent>> {
        self.materialise(s)?;
        let closers = s.state.closers();
        if !closers.is_empty() {
            self.append_locked(s, &closers)?;
            s.sync_now()?;
        }
        Ok(closers)
    }

    /// Deletes a session: its directory is renamed away durably (from then
    /// on the session does not exist, for every handle), then removed.
    /// Takes the session's writer lock first: a session another handle
    /// writes is [`Error::Locked`].
    pub fn delete(&self, id: &str) -> Result<()> {
        self.writable()?;
        let was_pending = self
            .inner
            .pending
            .lock()
            .expect("pending lock")
            .remove(id)
            .is_some();
        let slot = self.slot(id)?;
        let mut s = slot.lock().expect("session lock");
        let writing = !s.placeholder && !s.unpublished && s.lock.is_some();
        let deleted = (|| {
            let Some(entry) = self.entry(id)? else {
                return if was_pending {
                    Ok(())
                } else {
                    Err(Error::NotFound(id.to_owned()))
                };
            };
            if s.placeholder {
                s.header = entry.header.clone();
            }
            self.lock_session_for(&mut s, Some(&entry.uid))?;
            // No upload pass of this handle between the removal and the
            // forget (it would upload what it read before the removal).
            let _quiet = self.archive_quiet();
            self.inner
                .registry
                .remove(&entry.dir, id)
                .map_err(|(path, source)| Error::Io { path, source })?;
            self.archive_deleted(id, &entry.uid) // issue 17: its objects too, and a tombstone
        })();
        // A failed delete leaves a session this handle writes as it is
        // (unsynced appends, writer, lock, poison); anything else is
        // forgotten and loaded again by its next user.
        if deleted.is_ok() || !writing {
            s.writer = None;
            s.lock = None;
            s.placeholder = true;
            drop(s);
            self.forget(id, &slot);
        }
        deleted
    }

    /// Closes the session's last turn if it is open, appending the closers
    /// durably; returns the closers appended by this call or, when opening
    /// the session already repaired it, by that recovery.
    pub fn repair(&self, id: &str) -> Result<Vec<OwnedEvent>> {
        self.writable()?;
        self.with_session(id, |s| {
            // Taking the session for writing may already close the turn.
            self.ensure_writer(s)?;
            let closers = self.append_closers(s)?;
            if !closers.is_empty() {
                return Ok(closers);
            }
            let recovered = self.recovery(id).map_or(0, |r| r.closers);
            let from = s.next_seq().saturating_sub(recovered);
            self.read_from_locked(s, id, from, u64::MAX)
        })
    }
}

/// The smallest preallocation step (unless the option is smaller).
const MIN_GROWTH: u64 = 64 << 10;

/// How much segment space to preallocate when the active segment, holding
/// `len` bytes, is full: as much as it holds (at least [`MIN_GROWTH`]), up to
/// the `configured` step. Zero-filling costs a write and a sync of every
/// byte it adds, and a session reopened after eviction grows its segment
/// again; growing with the segment keeps both proportional to the data (a
/// small session never zero-fills a megabyte) while a large one reaches the
/// full step after a few doublings.
fn growth_step(configured: u64, len: u64) -> u64 {
    configured.min(len.max(MIN_GROWTH))
}
