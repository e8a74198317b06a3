//! Reads: events by seq, the surface, derived messages, verify and stats.

use super::error::{Error, Result, io_at, rejected, segment_error};
use super::events::BatchCursor;
use super::handle::Store;
use super::session::{Session, Snapshot};
use crate::checkpoint;

/// How `verify` starts its reason for a damaged checkpoint a `HEADER`
/// embeds (the error names the `HEADER`, whose header itself is sound).
pub(crate) const EMBEDDED_DAMAGE: &str = "the checkpoint embedded in HEADER: ";
use crate::codec;
use crate::derive::{DeriveCache, Message};
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::segment::{self, ScanOptions, SegmentIdent};
use crate::session::SessionState;
use crate::surface::Surface;

/// Derived messages, borrowing from the mapped segments.
pub struct Derived {
    pub(super) snapshot: Snapshot,
    pub(super) cache: DeriveCache,
}

impl Derived {
    /// The messages, zero-copy.
    pub fn messages(&self) -> impl Iterator<Item = Message<'_>> + '_ {
        self.cache
            .messages(&self.snapshot)
            .map(|m| m.expect("surface node data is indexed"))
    }
}

/// What [`Store::verify`] checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Events decoded and folded.
    pub events: u64,
    /// Segment files scanned.
    pub segments: u64,
    /// Bytes of headers, records and footers checked.
    pub bytes: u64,
}

/// Size and checkpoint figures of a session ([`Store::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Events in the log.
    pub events: u64,
    /// Segment files.
    pub segments: u64,
    /// Sealed segments stored as compressed images (`.segz`).
    pub compressed_segments: u64,
    /// Bytes of the log on disk (sealed files, compressed or not, and the
    /// active segment up to its committed end; preallocated space not
    /// counted).
    pub bytes: u64,
    /// The part of `bytes` in sealed segments; the rest is the active
    /// segment, the hot tail that is never compressed.
    pub sealed_bytes: u64,
    /// Bytes of compressed images this handle holds decoded in memory for
    /// the session: the segments holding the messages a derive read (kept
    /// for the next derive while the session is loaded). Other reads
    /// decode one segment at a time and keep none.
    pub decoded_bytes: u64,
    /// What the session really costs on the device: the allocated blocks
    /// of every file in its directory (segments with their preallocated
    /// space, `HEADER`, `CHECKPOINT`, `LINEAGE`; hard-linked segments a
    /// fork shares count in each session).
    pub allocated: u64,
    /// Bytes the same events take as plain JSONL (one event per line).
    pub jsonl_bytes: u64,
    /// Events appended since the last checkpoint.
    pub events_since_checkpoint: u64,
    /// When the checkpoint was last written (its file, or the `HEADER`
    /// that embeds it).
    pub checkpoint_modified: Option<std::time::SystemTime>,
}

impl Store {
    /// The session's header and events.
    pub fn load(&self, id: &str) -> Result<(SessionHeader, Vec<OwnedEvent>)> {
        self.with_session(id, |s| {
            let events = self.read_from_locked(s, id, 0, u64::MAX)?;
            Ok((s.header.clone(), events))
        })
    }

    /// The events from `seq` on: every batch acknowledged so far, by any
    /// writer in any process (a handle that does not write the session
    /// looks for new records first).
    pub fn read_from(&self, id: &str, seq: u64) -> Result<Vec<OwnedEvent>> {
        self.with_session(id, |s| self.read_from_locked(s, id, seq, u64::MAX))
    }

    /// The stored events from `seq` on: [`Store::read_from`] without the
    /// closers a read-only handle synthesises for an interrupted turn.
    pub fn read_stored_from(&self, id: &str, seq: u64) -> Result<Vec<OwnedEvent>> {
        self.with_session(id, |s| {
            let end = s.next_seq();
            self.read_from_locked(s, id, seq, end)
        })
    }

    /// Whether reads of session `id` show an open last turn closed, with
    /// closers synthesised in memory: on a read-only handle, when no writer
    /// holds the session (then the turn was interrupted; a live writer's
    /// open turn is just in progress).
    pub(super) fn synthesises_closers(&self, id: &str) -> bool {
        self.inner.read_only
            && !self
                .inner
                .locks
                .as_ref()
                .is_some_and(|l| l.is_locked_elsewhere(id).unwrap_or(true))
    }

    /// The events with seqs in `seq..until`, decoding only the batches that
    /// hold them.
    pub(super) fn read_from_locked(
        &self,
        s: &Session,
        id: &str,
        seq: u64,
        until: u64,
    ) -> Result<Vec<OwnedEvent>> {
        let mut closers = Vec::new();
        if self.synthesises_closers(id) {
            closers = s.closers();
        }
        let stored_end = s.next_seq().min(until);
        let mut out = Vec::with_capacity(stored_end.saturating_sub(seq) as usize + closers.len());
        let mut cursor = BatchCursor::new(self.inner.store_id, s, seq, until);
        while let Some(batch) = cursor.next_batch_into(seq..until, &mut out) {
            batch?;
        }
        // (A poisoned session may hold a written batch its index missed.)
        let expected = cursor.expected();
        if !s.poisoned && until >= s.next_seq() && expected.is_some_and(|e| e != s.next_seq()) {
            return Err(Error::Corrupt {
                session: id.to_owned(),
                segment: s.dir.clone(),
                offset: 0,
                reason: format!(
                    "the batch index ends at seq {} but the log at {}",
                    expected.unwrap_or_default(),
                    s.next_seq()
                ),
            });
        }
        out.extend(
            closers
                .into_iter()
                .filter(|e| e.seq >= seq && e.seq < until),
        );
        Ok(out)
    }

    /// The session's surface.
    pub fn surface(&self, id: &str) -> Result<Surface> {
        self.with_session(id, |s| self.surface_locked(s, id))
    }

    fn surface_locked(&self, s: &mut Session, id: &str) -> Result<Surface> {
        self.materialise(s)?;
        if self.synthesises_closers(id) && s.state.repair().is_open() {
            let mut state = s.state.clone();
            let snap = s.snapshot();
            let closers = state.closers();
            state
                .append_batch(&closers, &snap)
                .map_err(|v| rejected(id, &closers, v))?;
            return Ok(state.surface().clone());
        }
        Ok(s.state.surface().clone())
    }

    /// The derived messages, zero-copy from the mapped segments.
    pub fn derive(&self, id: &str) -> Result<Derived> {
        self.with_session(id, |s| {
            self.materialise(s)?;
            self.verify_covered(s)?;
            // Decoded here, where a damaged image is an error naming it, not
            // a message found missing (an earlier derive may have given the
            // decoded images back). New nodes are read below, by the update.
            if s.refetch || s.derive.needs_rebuild(s.state.surface()) {
                s.fetch_nodes()?;
            }
            let snapshot = s.snapshot();
            let Session { derive, state, .. } = &mut *s;
            derive
                .update(state.surface(), &snapshot)
                .map_err(|source| Error::Index {
                    session: id.to_owned(),
                    source,
                })?;
            // (Past `max_decoded_images`, `with_session` gives the
            // session's decoded images back; the snapshot keeps what the
            // `Derived` borrows.)
            Ok(Derived {
                snapshot,
                cache: s.derive.clone(),
            })
        })
    }

    /// Verifies a session end to end: every segment is scanned record by
    /// record (sealed ones against their footers), every batch decoded, and
    /// the whole log folded again from scratch; the result must equal the
    /// loaded state; the `CHECKPOINT`'s sections are checked too. Damage
    /// is an [`Error::Corrupt`] naming the file and offset.
    pub fn verify(&self, id: &str) -> Result<VerifyReport> {
        self.with_session(id, |s| self.verify_locked(s, id))
    }

    fn verify_locked(&self, s: &mut Session, id: &str) -> Result<VerifyReport> {
        let report = self.verify_files(s, id);
        // Verify decodes compressed images from the files it reads; any the
        // session's view decoded meanwhile (the checkpoint's checks) are
        // not kept either.
        s.release_images();
        report
    }

    fn verify_files(&self, s: &mut Session, id: &str) -> Result<VerifyReport> {
        self.materialise(s)?;
        s.fetch_archived()?; // issue 17: segments only in the archive
        let mut report = VerifyReport::default();
        let mut state = SessionState::new(self.inner.options.strict);
        let mut log: Vec<OwnedEvent> = Vec::new();
        let last = s.segs.len().saturating_sub(1);
        for (i, seg) in s.segs.iter().enumerate() {
            let ident = SegmentIdent {
                store_id: self.inner.store_id,
                session_uid: s.lineage.owner(seg.first_seq).unwrap_or(s.uid),
                first_seq: seg.first_seq,
            };
            // Read the file afresh: the check is of what is on disk. The
            // active segment of a session another handle may be writing
            // counts up to its committed end: past it a record may be in
            // progress, which only its writer can tell from a torn one.
            let (path, mut bytes) = self.read_seg_file(id, &seg.path, &ident)?;
            if let (true, None, Some(end)) = (i == last, &s.lock, s.active_end) {
                bytes.truncate(end as usize);
            }
            let opts = ScanOptions {
                max_record: self.read_limit(),
                expect_sealed: i < last || s.lock.is_some() && s.writer.is_none(),
            };
            let scan =
                segment::scan(&bytes, &ident, &opts).map_err(|e| segment_error(id, &path, e))?;
            report.segments += 1;
            report.bytes += scan.valid_end + scan.footer.map_or(0, |_| segment::FOOTER_LEN as u64);
            for b in &scan.batches {
                let r = b.codec_range();
                let events = codec::decode_batch(
                    &bytes[r.start as usize..r.end as usize],
                    b.first_seq,
                    b.count,
                    0,
                )
                .map_err(|e| Error::Corrupt {
                    session: id.to_owned(),
                    segment: path.clone(),
                    offset: b.offset,
                    reason: format!("batch does not decode: {e}"),
                })?;
                let mut owned: Vec<OwnedEvent> = Vec::with_capacity(events.len());
                Event::into_owned_batch(events, 0..u64::MAX, &mut owned);
                state
                    .append_batch(&owned, &log)
                    .map_err(|v| Error::Corrupt {
                        session: id.to_owned(),
                        segment: path.clone(),
                        offset: b.offset,
                        reason: format!("stored batch breaks a rule: {v}"),
                    })?;
                report.events += owned.len() as u64;
                log.extend(owned);
            }
        }
        if state.next_seq() != s.state.next_seq() || state.surface() != s.state.surface() {
            return Err(Error::Corrupt {
                session: id.to_owned(),
                segment: s.dir.clone(),
                offset: 0,
                reason: format!(
                    "the log folds to {} events but the index holds {}: the checkpoint or index disagrees with the log",
                    state.next_seq(),
                    s.state.next_seq()
                ),
            });
        }
        self.verify_checkpoint(s, id)?;
        Ok(report)
    }

    /// The checkpoint is a cache the log rebuilds, but damage to it is
    /// damage: reported, not hidden behind the rebuild (which also gives up
    /// the check that no record it covers is missing). Every section's
    /// checksum and encoding is checked; a checkpoint of another format
    /// version is not damage (it is ignored, and replaced by the next
    /// writer).
    fn verify_checkpoint(&self, s: &Session, id: &str) -> Result<()> {
        use checkpoint::CheckpointError as E;
        // A checkpoint embedded in the HEADER is named by the HEADER.
        let (place, opened) = super::ckfile::open(&*self.inner.vfs, &s.dir);
        let checked = opened.and_then(|ck| ck.materialise().map(drop));
        match checked {
            Ok(()) | Err(E::Missing | E::UnsupportedVersion { .. }) => Ok(()),
            Err(E::Io(source)) => Err(Error::Io {
                path: place.path,
                source,
            }),
            Err(e) => Err(Error::Corrupt {
                session: id.to_owned(),
                offset: place.at
                    + match &e {
                        E::Malformed { offset, .. } => *offset,
                        _ => 0,
                    },
                reason: format!(
                    "{}{e}; the log verified and is read without it, but records it covered \
                     could be missing unnoticed; once the log is known whole, the session's \
                     next writer (a repair, or any append) replaces it at close",
                    if place.embedded() {
                        EMBEDDED_DAMAGE
                    } else {
                        ""
                    }
                ),
                segment: place.path,
            }),
        }
    }

    /// Size and checkpoint figures of a session.
    pub fn stats(&self, id: &str) -> Result<SessionStats> {
        self.with_session(id, |s| self.stats_locked(s, id))
    }

    fn stats_locked(&self, s: &mut Session, id: &str) -> Result<SessionStats> {
        let (mut bytes, mut sealed_bytes, mut compressed_segments) = (0, 0, 0);
        for (i, seg) in s.segs.iter().enumerate() {
            let last = i + 1 == s.segs.len();
            // The active segment counts up to its committed end: its
            // preallocated zeros are not data. An image counts its own
            // size, not the segment's it decodes to.
            let image = super::segfiles::is_image(&seg.path);
            let n = match (&s.writer, last, s.active_end) {
                (Some(w), true, _) => w.len(),
                (None, true, Some(end)) => end,
                _ if image => self
                    .inner
                    .vfs
                    .metadata(&seg.path)
                    .map_or_else(|_| seg.len(), |m| m.len),
                _ => seg.len(),
            };
            bytes += n;
            if !(last && s.last_is_active()) {
                sealed_bytes += n;
            }
            compressed_segments += u64::from(image);
        }
        // Stored events only: a read-only view's synthesised closers are not
        // on disk.
        let events = self.read_from_locked(s, id, 0, s.next_seq())?;
        let mut jsonl_bytes = 0u64;
        let mut buf = Vec::new();
        for e in &events {
            buf.clear();
            e.write_json(&mut buf);
            jsonl_bytes += buf.len() as u64 + 1;
        }
        // The file the checkpoint is in: its own, or the HEADER embedding it.
        let checkpoint_modified = super::ckfile::location(&*self.inner.vfs, &s.dir)
            .and_then(|path| self.inner.vfs.metadata(&path).ok())
            .and_then(|m| m.modified);
        let vfs = &*self.inner.vfs;
        let mut allocated = 0;
        let names = match vfs.read_dir(&s.dir) {
            Ok(names) => names,
            // Created, nothing appended yet: no directory holds it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && s.unpublished && !s.staged => {
                Vec::new()
            }
            Err(e) => return Err(io_at(&s.dir)(e)),
        };
        for name in names {
            let path = s.dir.join(name);
            match vfs.symlink_metadata(&path) {
                Ok(m) => allocated += m.allocated,
                // Replaced or removed meanwhile (a checkpoint's rename).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&path)(e)),
            }
        }
        Ok(SessionStats {
            events: events.len() as u64,
            segments: s.segs.len() as u64,
            compressed_segments,
            bytes,
            sealed_bytes,
            decoded_bytes: s.decoded_bytes(),
            allocated,
            jsonl_bytes,
            events_since_checkpoint: s.since_checkpoint,
            checkpoint_modified,
        })
    }
}
