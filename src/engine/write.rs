//! The write path: append (fold, encode, write, sync, index, checkpoint),
//! segment roll-over, and the store-level changes built on it (import,
//! fork, delete, repair).

use super::error::{Error, Result, io_at, publish_error, rejected, segment_error};
use super::handle::Store;
use super::options::Durability;
use super::registry::{PublishError, SessionEntry};
use super::session::{Seg, Session, View};
use crate::checkpoint::{self, CheckpointBody, Coverage};
use crate::codec;
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::segment::{self, SegmentIdent, SegmentWriter};
use crate::vfs::SegmentBytes;
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
        if s.lock.is_some() {
            return Ok(());
        }
        let id = &s.header.id;
        let locks = self.inner.locks.as_ref().ok_or(Error::ReadOnly)?;
        let lock = locks
            .try_lock(id)
            .map_err(|source| Error::Io {
                path: locks.path().to_owned(),
                source,
            })?
            .ok_or_else(|| Error::Locked {
                session: id.clone(),
                path: locks.path().to_owned(),
            })?;
        self.archive_lease(id)?; // issue 17: fenced across hosts
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
        // Recorded first: deciding the closers may rebuild the session from
        // the log (a checkpoint found wrong), which records its own reason.
        self.record_recovery(&id, rec);
        if self.inner.options.close_interrupted_turns {
            let n = self.append_closers(s)?.len() as u64;
            if let Some(r) = self.inner.recoveries.lock().expect("lock").get_mut(&id) {
                r.closers = n;
            }
        }
        Ok(())
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
        let undo = state
            .append_batch_undoable(events, &view)
            .map_err(|violation| rejected(&id, events, violation))?;
        if let Err(e) = self.write_batch(s, events) {
            s.state.revert(undo);
            return Err(e);
        }
        Ok(())
    }

    /// Steps 2-4 of an append, after the fold accepted the batch.
    pub(super) fn write_batch(&self, s: &mut Session, events: &[Event<'_>]) -> Result<()> {
        let opts = &self.inner.options;
        let id = s.header.id.clone();
        let mut payload = Vec::new();
        // Message events stay verbatim: derive reads them in place from the
        // mapping. Everything else (chunks above all) goes into the batch's
        // compressed pack when that pays. The encoder reports where each
        // verbatim `data` lands, so indexing the batch below needs no
        // re-decode of what was just written.
        let mut data_ranges = Vec::with_capacity(events.len());
        codec::encode_batch_indexed(
            events,
            0,
            codec::EncodeOptions {
                compress: true,
                verbatim_surface: true,
            },
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
            s.sync_now()?;
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
                // (or no file) and continues from there.
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
                s.segs.last_mut().expect("active").map = map;
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
        let Some((segment_first_seq, last_record_offset, end_offset, crc)) = s.last_record else {
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
            coverage: Coverage {
                segment_first_seq,
                last_record_offset,
                end_offset,
                last_record_crc: crc,
                next_seq: s.state.next_seq(),
            },
            last_time: s.last_time,
            state: s.state.clone(),
            derive: s.derive.clone(),
            batches: s.batches.to_vec(),
            node_locs: s.node_locs.0.clone(),
        };
        checkpoint::write_with(&*self.inner.vfs, &s.dir, &body).map_err(|source| {
            Error::Checkpoint {
                session: s.header.id.clone(),
                dir: s.dir.clone(),
                source,
            }
        })?;
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
    pub fn fork(&self, source: &str, at: u64, child: SessionHeader) -> Result<()> {
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
            return Err(Error::Exists(id));
        }
        self.session_dir(&id)?; // a usable id
        let parent = self.slot(source)?;
        let mut p = parent.lock().expect("session lock");
        if p.placeholder {
            drop(p);
            // Load it (the closure has nothing else to do).
            self.with_session(source, |_| Ok(()))?;
            p = parent.lock().expect("session lock");
        }
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
                for (first_seq, _, path) in &shared {
                    let link = staged.join(segment::segment_file_name(*first_seq));
                    vfs.hard_link(path, &link).map_err(io_at(&link))?;
                }
            }
            Ok(())
        };
        self.build_and_publish(header, &rest, prepare, Publish::New)
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
    pub fn import(&self, header: SessionHeader, events: &[Event<'_>], replace: bool) -> Result<()> {
        self.writable()?;
        let mode = if replace {
            Publish::NewOrReplace
        } else {
            Publish::New
        };
        self.build_and_publish(header, events, |_| Ok(()), mode)
    }

    /// Builds a new session in a staging directory (`prepare` puts files
    /// there first, then `events` are appended with one sync at the end and
    /// a checkpoint), then publishes it under its id, or swaps it in for the
    /// stored session when `replace`. Any failure before the publish
    /// discards the staged directory: nothing partial is ever visible.
    pub(super) fn build_and_publish(
        &self,
        header: SessionHeader,
        events: &[Event<'_>],
        prepare: impl FnOnce(&Path) -> Result<()>,
        mode: Publish,
    ) -> Result<()> {
        let id = header.id.clone();
        self.session_dir(&id)?; // a usable id
        // The id's writer lock is held from here to the publish, through
        // the session's entry in the map: no other handle can create,
        // replace or write the id meanwhile.
        let slot = self.slot(&id)?;
        let mut s = slot.lock().expect("session lock");
        let built = self.build_and_publish_locked(&mut s, header, events, prepare, mode);
        if built.is_err() {
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
    ) -> Result<()> {
        let id = header.id.clone();
        self.lock_session(s)?;
        let declared = self
            .inner
            .pending
            .lock()
            .expect("pending lock")
            .contains_key(&id);
        let existing = self.entry(&id)?.is_some();
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
            };
            let (c, _) = self.load_session(entry, true)?;
            let c = built.insert(c);
            // The id's lock, lent for the build (a second lock object on
            // the same key would release the first when dropped).
            c.lock = s.lock.take();
            // One sync for the whole build, at the end: nothing is visible
            // before the publish.
            c.defer_sync = true;
            for batch in split_batches(events, self.inner.options.max_record as usize / 4) {
                self.append_locked(c, batch)?;
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
        let published = if existing {
            // Issue 17: the old session's objects go first (the new one's
            // files have the same names).
            self.archive_forget(&id)?;
            // A failure of the exchange leaves the old session in place; a
            // failure after it (syncing, removing the old) leaves the new
            // one: either way nothing is partial, and the staged path holds
            // whichever is not live (discarded at the next open).
            registry
                .replace(&staged, &id)
                .map_err(|(path, source)| (false, Error::Io { path, source }))
        } else {
            registry.publish(&staged, &id).map_err(|e| match e {
                // Visible already: nothing to discard.
                PublishError::Unsynced(..) => (false, publish_error(e, &id)),
                e => (true, publish_error(e, &id)),
            })
        };
        match published {
            Ok(live) => c.move_to(live),
            Err((discard, e)) => {
                if discard {
                    let _ = registry.discard(&staged);
                }
                return Err(e);
            }
        }
        // The new session takes the entry's place, with the lock.
        c.lock = s.lock.take();
        c.dir_ino = self.inner.vfs.metadata(&c.dir).map_or(0, |m| m.ino);
        *s = c;
        Ok(())
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
            self.lock_session(&mut s)?;
            self.inner
                .registry
                .remove(&entry.dir, id)
                .map_err(|(path, source)| Error::Io { path, source })?;
            self.archive_forget(id) // issue 17: its objects too
        })();
        s.writer = None;
        s.lock = None;
        s.placeholder = true;
        drop(s);
        self.forget(id, &slot);
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
