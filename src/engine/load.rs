//! Loading a session: the checkpoint checked against the log, the segments
//! mapped, the records after the checkpoint folded, a torn tail found.

use super::error::{Error, Result, io_at, segment_error};
use super::handle::Store;
use super::registry::SessionEntry;
use super::remote::Remote;
use super::session::{LastRecord, NodeLocs, Seg, Session, View, verbatim_range};
use crate::checkpoint::{self, BatchIndex, Checkpoint, Coverage};
use crate::codec;
use crate::lineage::Lineage;
use crate::segment::{self, ScanOptions, SegmentIdent, SegmentWriter, Tail};
use crate::vfs::SegmentBytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What opening a session found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// A checkpoint was used (false: rebuilt from the log).
    pub used_checkpoint: bool,
    /// Why the checkpoint was not used.
    pub rebuild_reason: Option<String>,
    /// Events folded after the checkpoint.
    pub replayed: u64,
    /// Where a torn tail was cut (found by the session's writer, which
    /// alone can tell a torn write from one in progress).
    pub torn_at: Option<u64>,
    /// Closers appended (or, read-only, synthesised in memory).
    pub closers: u64,
}

/// The bytes of a mapped active segment up to its committed end: a reader
/// must never touch the mapped bytes past it (see
/// [`segment::committed_end`]).
struct CommittedPrefix(SegmentBytes, usize);

impl CommittedPrefix {
    /// The first `end` bytes of `map` (all of it if shorter: a file the
    /// walk found empty or cut).
    fn of(map: SegmentBytes, end: u64) -> SegmentBytes {
        let end = usize::try_from(end).unwrap_or(usize::MAX).min(map.len());
        SegmentBytes::new(CommittedPrefix(map, end))
    }
}

impl std::ops::Deref for CommittedPrefix {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[..self.1]
    }
}

/// Folds one stored batch (a record of segment `seg_first`, mapped as
/// `map`) into the session and its read indexes; returns its event count.
/// The state must be materialised. A batch that does not decode or breaks
/// a rule was written whole and checksummed, so it is corruption. `pack`
/// is a buffer for the batch's decoded pack, reused from batch to batch.
fn fold_stored(
    s: &mut Session,
    seg_first: u64,
    map: &SegmentBytes,
    path: &Path,
    b: &segment::BatchLoc,
    pack: &mut Vec<u8>,
) -> Result<u64> {
    let id = s.header.id.clone();
    let corrupt = |reason: String| Error::Corrupt {
        session: id.clone(),
        segment: path.to_owned(),
        offset: b.offset,
        reason,
    };
    let r = b.codec_range();
    let events = codec::decode_batch_in(
        &map[r.start as usize..r.end as usize],
        b.first_seq,
        b.count,
        0,
        pack,
    )
    .map_err(|e| corrupt(format!("batch does not decode: {e}")))?;
    let Session {
        state,
        segs,
        node_locs,
        ..
    } = &mut *s;
    let view = View { segs, node_locs };
    state
        .append_batch(&events, &view)
        .map_err(|v| corrupt(format!("stored batch breaks a rule: {v}")))?;
    let last_time = events.last().map_or(s.last_time, |e| e.time);
    s.index_batch(seg_first, map, b, last_time, |i| {
        verbatim_range(map, events[i].data.get())
    })
    .map_err(corrupt)?;
    Ok(events.len() as u64)
}

/// The length of segment `segment` among the files found at load (`lens`:
/// theirs, remote ones' included).
pub(super) fn len_in(files: &[(u64, PathBuf)], lens: &[u64], segment: u64) -> Option<u64> {
    files
        .iter()
        .position(|(f, _)| *f == segment)
        .map(|i| lens[i])
}

/// Whether a checkpoint's batch index, whose checksum, order and covered
/// record check out, also points only into segments that exist. A checksum
/// proves the bytes are the ones written, not that they are right.
pub(super) fn batches_consistent(
    batches: &BatchIndex,
    files: &[(u64, PathBuf)],
    lens: &[u64],
) -> std::result::Result<(), String> {
    // Entries come in seq order, so their segments too: one lookup per
    // segment, not per batch.
    let mut current: Option<(u64, Option<u64>)> = None;
    let mut len_of = |segment: u64| match current {
        Some((s, len)) if s == segment => len,
        _ => {
            let len = len_in(files, lens, segment);
            current = Some((segment, len));
            len
        }
    };
    match batches
        .iter_from(0)
        .find(|b| len_of(b.segment).is_none_or(|len| b.offset >= len))
    {
        Some(b) => Err(format!(
            "checkpoint is inconsistent: batch {} points outside the log",
            b.first_seq
        )),
        None => Ok(()),
    }
}

/// Decodes the lazily kept parts of checkpoint `ck` into `s` (state, derive
/// cache, node locations), after checking them ([`Checkpoint::materialise`])
/// and that every node's data lies inside its segment (`len_of`). On error
/// `s` is unchanged and the checkpoint must not be used.
pub(super) fn install(
    s: &mut Session,
    ck: &Checkpoint,
    len_of: impl Fn(u64) -> Option<u64>,
) -> std::result::Result<(), String> {
    let m = ck.materialise().map_err(|e| e.to_string())?;
    if let Some((seq, _)) = m.node_locs.iter().find(|(_, l)| {
        len_of(l.segment).is_none_or(|len| l.offset.saturating_add(u64::from(l.len)) > len)
    }) {
        return Err(format!(
            "checkpoint is inconsistent: the data of node {seq} points outside the log"
        ));
    }
    s.state = m.state;
    s.derive = m.derive;
    s.node_locs = Arc::new(NodeLocs(m.node_locs));
    Ok(())
}

impl Store {
    /// Loads a stored session: verify the checkpoint against the log, map
    /// the segments, fold the events after the checkpoint.
    ///
    /// `authoritative`: this handle holds the session's writer lock, so
    /// nothing else changes the files: a torn tail is found and cut, a seal
    /// a crash interrupted is finished, and the session gets its segment
    /// writer. Otherwise (a reader, in any process) the files are only
    /// read, the active segment's records are found with positional reads
    /// (the writer may seal and cut it at any moment), and the load stops
    /// at the first record that is not complete, without judging it.
    /// Loading never appends: the closers an interrupted turn needs are the
    /// caller's to append ([`Session::closers`]).
    ///
    /// Cost: O(segments) for the sealed segments the checkpoint covers (their
    /// footers are checked, not their records), O(batches) to check the
    /// checkpoint's batch index, plus O(records after the checkpoint). The
    /// checkpoint's surface, derive cache and node locations are decoded
    /// only when something needs them ([`Store::materialise`]), or at once
    /// when events after it must be folded or closers appended.
    pub(super) fn load_session(
        &self,
        entry: SessionEntry,
        authoritative: bool,
    ) -> Result<(Session, Recovery)> {
        let (mut s, rec) = self.load_session_with(entry, authoritative, true)?;
        // A rebuild decodes every compressed image it folds; none is kept
        // (memory stays bounded by what later reads need).
        s.release_images();
        Ok((s, rec))
    }

    /// [`Store::load_session`], ignoring the checkpoint unless
    /// `use_checkpoint`: a checkpoint found wrong while it is materialised
    /// restarts the load without it.
    pub(super) fn load_session_with(
        &self,
        entry: SessionEntry,
        authoritative: bool,
        use_checkpoint: bool,
    ) -> Result<(Session, Recovery)> {
        let restart = |why: String| -> Result<(Session, Recovery)> {
            let (s, mut rec) = self.load_session_with(entry.clone(), authoritative, false)?;
            rec.rebuild_reason = Some(why);
            Ok((s, rec))
        };
        let uid = entry.uid;
        let mut s = self.new_session(entry.header.clone())?;
        s.uid = uid;
        s.dir = entry.dir.clone();
        s.unpublished = false;
        let vfs = &*self.inner.vfs;
        s.dir_id = vfs.metadata(&s.dir).map_err(io_at(&s.dir))?.identity();
        s.lineage = Lineage::read_with(vfs, &s.dir).map_err(|reason| Error::Corrupt {
            session: s.header.id.clone(),
            segment: s.dir.join(crate::lineage::LINEAGE_FILE),
            offset: 0,
            reason,
        })?;
        let id = s.header.id.clone();
        let mut rec = Recovery::default();
        // Issue 17: the checkpoint and tail fetched; older segments that are
        // only in the archive are known, fetched when a read needs them.
        let remote = self.archive_restore(&id, &s.dir)?;
        let mut files = super::segfiles::list(vfs.read_dir(&s.dir).map_err(io_at(&s.dir))?, &s.dir);
        for (first_seq, _) in &remote {
            if !files.iter().any(|(f, _)| f == first_seq) {
                let name = segment::segment_file_name(*first_seq);
                files.push((*first_seq, s.dir.join(name)));
            }
        }
        files.sort();
        let store_id = self.inner.store_id;
        let lineage = s.lineage.clone();
        let ident_of = |first_seq| SegmentIdent {
            store_id,
            session_uid: lineage.owner(first_seq).unwrap_or(uid),
            first_seq,
        };
        let segs: Vec<Seg> = files
            .iter()
            .map(|(first_seq, p)| {
                let lazy = remote
                    .iter()
                    .find(|(f, _)| f == first_seq)
                    .and_then(|(_, len)| {
                        let fetch = self.archive_lazy(&id, p, ident_of(*first_seq))?;
                        Some(Seg::remote(*first_seq, p.clone(), Remote::new(*len, fetch)))
                    });
                match lazy {
                    Some(seg) => Ok(seg),
                    None => self.open_seg(&id, *first_seq, p, ident_of(*first_seq)),
                }
            })
            .collect::<Result<_>>()?;
        // A raw file gone since the listing was read from its image.
        let files: Vec<(u64, PathBuf)> =
            segs.iter().map(|g| (g.first_seq, g.path.clone())).collect();
        let maps: Vec<SegmentBytes> = segs.iter().map(|g| g.map.clone()).collect();
        let lens: Vec<u64> = segs.iter().map(Seg::len).collect();

        // The checkpoint is a cache: use it only if the record it claims to
        // end at is in the log, with the checksum it recorded.
        let mut covered: Option<Coverage> = None;
        let (ck_place, opened) = if use_checkpoint {
            let (place, opened) = super::ckfile::open(vfs, &s.dir);
            (Some(place), opened)
        } else {
            (None, Err(checkpoint::CheckpointError::Missing))
        };
        match opened {
            Ok(ck) => {
                let c = ck.coverage();
                // A checkpoint only ever covers synced records, and synced
                // records never change or go away (a torn-tail cut and a
                // seal only remove bytes past them). So a covered record
                // that is missing, cut or different is damage to the log,
                // never a crash: refuse, naming the file, rather than
                // rebuild a shorter log from what is left.
                let seg_path = files
                    .iter()
                    .find(|(f, _)| *f == c.segment_first_seq)
                    .map_or_else(
                        || s.dir.join(segment::segment_file_name(c.segment_first_seq)),
                        |(_, p)| p.clone(),
                    );
                let missing = |reason: String| Error::Corrupt {
                    session: id.clone(),
                    segment: seg_path.clone(),
                    offset: c.last_record_offset,
                    reason,
                };
                let Some(i) = files.iter().position(|(f, _)| *f == c.segment_first_seq) else {
                    return Err(missing(format!(
                        "the segment is missing, but the checkpoint covers its records up to seq {}",
                        c.next_seq.saturating_sub(1)
                    )));
                };
                if (maps[i].len() as u64) < c.end_offset {
                    return Err(missing(format!(
                        "the segment is {} bytes, but the checkpoint covers records up to offset {} (seq {})",
                        maps[i].len(),
                        c.end_offset,
                        c.next_seq.saturating_sub(1)
                    )));
                }
                let ok = segment::record_at(
                    &maps[i],
                    &ident_of(c.segment_first_seq),
                    c.last_record_offset,
                )
                .is_some_and(|loc| {
                    loc.end() == c.end_offset
                        && loc.last_seq() + 1 == c.next_seq
                        && segment::frame_crc_field(&maps[i], loc.offset) == c.last_record_crc
                });
                if !ok {
                    return Err(missing(format!(
                        "the record the checkpoint ends at (seq {}) is not there: damaged or replaced",
                        c.next_seq.saturating_sub(1)
                    )));
                }
                let batches = ck.batches();
                let consistent = batches_consistent(&batches, &files, &lens);
                if let Err(why) = consistent {
                    rec.rebuild_reason = Some(why);
                } else {
                    s.batches = batches;
                    s.last_time = ck.last_time();
                    s.last_record = Some(LastRecord::of(&c));
                    covered = Some(c);
                    s.unverified = Some((c.segment_first_seq, c.end_offset));
                    s.lazy = Some(Arc::new(ck));
                }
            }
            Err(e) if use_checkpoint => {
                let at = ck_place.map(|p| p.path.display().to_string());
                rec.rebuild_reason = Some(format!("{}: {e}", at.unwrap_or_default()));
            }
            Err(_) => {}
        }
        rec.used_checkpoint = covered.is_some();
        if covered.is_none() {
            // Without a checkpoint every record is scanned: every segment
            // the archive holds for this session is needed.
            segs.iter().try_for_each(Seg::fetch)?;
        }

        let scan_opts = |sealed| ScanOptions {
            max_record: self.read_limit(),
            expect_sealed: sealed,
        };
        let corrupt = |path: &Path, offset, reason: String| Error::Corrupt {
            session: id.clone(),
            segment: path.to_owned(),
            offset,
            reason,
        };
        let n = files.len();
        let mut expected_first = 0u64;
        let mut torn: Option<(PathBuf, u64)> = None;
        let mut active: Option<(SegmentIdent, PathBuf, segment::Scan)> = None;
        for (i, (first_seq, path)) in files.iter().enumerate() {
            let (first_seq, map) = (*first_seq, maps[i].clone());
            let ident = ident_of(first_seq);
            if first_seq != expected_first {
                return Err(corrupt(
                    path,
                    0,
                    format!(
                        "segment starts at seq {first_seq}, expected {expected_first}: a segment is missing"
                    ),
                ));
            }
            let last = i + 1 == n;
            s.segs.push(segs[i].clone());
            if segs[i].is_remote() {
                if !last && covered.is_some_and(|c| first_seq < c.segment_first_seq) {
                    // Wholly covered by the checkpoint: fetched (and
                    // checked whole) when a read needs its bytes.
                    expected_first = files[i + 1].0;
                    continue;
                }
                segs[i].fetch()?;
            }
            if !last {
                if segment::read_header(&map).map_err(|e| segment_error(&id, path, e))? != ident {
                    return Err(corrupt(
                        path,
                        12,
                        "segment identity does not match its session".into(),
                    ));
                }
                let footer = segment::verify_footer(&map).map_err(|e| {
                    // Only the last segment may be unsealed: say which file
                    // makes this one not the last (a stray file dropped in
                    // the directory is blamed here otherwise).
                    let next = files[i + 1].1.file_name().unwrap_or_default();
                    let e = match e {
                        segment::SegmentError::Corrupt { offset, reason } => {
                            segment::SegmentError::Corrupt {
                                offset,
                                reason: format!(
                                    "{reason}, yet it is not the last segment: {} follows it (a segment file that does not belong, or this one damaged)",
                                    next.to_string_lossy()
                                ),
                            }
                        }
                        other => other,
                    };
                    segment_error(&id, path, e)
                })?;
                expected_first = footer.last_seq + 1;
                if covered.is_some_and(|c| {
                    footer.last_seq < c.next_seq && c.segment_first_seq != first_seq
                }) {
                    continue; // wholly covered by the checkpoint
                }
            }
            // A reader sees the active segment only up to its committed end,
            // found with positional reads: bytes past it may be cut away by
            // the writer's seal while we look (a mapped page past the end of
            // the file raises SIGBUS; a read comes back short).
            let mut map = map;
            // An image is a sealed segment: immutable, read whole.
            let image = super::segfiles::is_image(path);
            if last && !authoritative && !image {
                let resume = covered
                    .filter(|c| c.segment_first_seq == first_seq)
                    .map_or(segment::HEADER_LEN as u64, |c| c.end_offset);
                let seg = s.segs.last_mut().expect("pushed");
                match self.visible_end(&id, path, &ident, resume)? {
                    segment::Committed::Records { end } => {
                        map = CommittedPrefix::of(map, end);
                        seg.map = map.clone();
                    }
                    // Sealed meanwhile (or compressed since: then its image
                    // is read). The writer writes the footer, then cuts the
                    // preallocated zeros after it: a raw file is read only
                    // up to the footer's end, so the cut cannot take a
                    // mapped page from under this reader (SIGBUS), and a
                    // seal a crash interrupted reads as the sealed segment.
                    segment::Committed::Sealed { end } => {
                        *seg = self.open_seg(&id, first_seq, path, ident)?;
                        map = seg.map.clone();
                        if !super::segfiles::is_image(&seg.path) {
                            map = CommittedPrefix::of(map, end + segment::FOOTER_LEN as u64);
                            seg.map = map.clone();
                        }
                    }
                }
            }
            let scan = match covered.filter(|c| c.segment_first_seq == first_seq) {
                Some(c) => {
                    segment::scan_from(&map, &ident, &scan_opts(!last), c.end_offset, c.next_seq)
                }
                None => segment::scan(&map, &ident, &scan_opts(!last)),
            }
            .map_err(|e| segment_error(&id, path, e))?;
            let mut pack = Vec::new();
            for b in &scan.batches {
                if b.first_seq < s.next_seq() {
                    continue; // a full rescan after a resume met a footer
                }
                // Events after the checkpoint are folded into its state.
                if let Some(ck) = s.lazy.take()
                    && let Err(why) = install(&mut s, &ck, |seg| len_in(&files, &lens, seg))
                {
                    drop(s);
                    return restart(why);
                }
                rec.replayed += fold_stored(&mut s, first_seq, &map, path, b, &mut pack)?;
            }
            if last {
                expected_first = s.next_seq();
                if let Tail::Torn { offset, .. } = scan.tail
                    && authoritative
                {
                    torn = Some((path.clone(), offset));
                    rec.torn_at = Some(offset);
                }
                if scan.is_sealed() {
                    if authoritative && !image {
                        // A crash between the footer write and the cut.
                        SegmentWriter::complete_seal_with(vfs, path, &scan)
                            .map_err(|e| segment_error(&id, path, e))?;
                        // The file ends at the footer now: so must the
                        // session's view of it, or a read of its end (a
                        // fork's footer check) touches pages the cut
                        // removed (SIGBUS).
                        if let Some(end) = scan.sealed_len() {
                            let seg = s.segs.last_mut().expect("pushed");
                            seg.map = CommittedPrefix::of(seg.map.clone(), end);
                        }
                    }
                } else {
                    s.active_end = Some(scan.valid_end.max(segment::HEADER_LEN as u64));
                    active = Some((ident, path.clone(), scan));
                }
            } else {
                expected_first = s.next_seq().max(expected_first);
            }
        }
        // Replayed events are not in any checkpoint yet: the next flush
        // writes one, so the next open does not replay them again.
        s.since_checkpoint = rec.replayed;
        if !authoritative {
            if self.synthesises_closers(&id) {
                rec.closers = s.closers().len() as u64;
            }
            return Ok((s, rec));
        }
        if let Some((path, offset)) = torn {
            // The torn bytes are zeroed durably before anything is appended
            // after them, so they can never be mistaken for a record again.
            SegmentWriter::discard_tail_with(vfs, &path, offset).map_err(io_at(&path))?;
        }
        if let Some((ident, path, scan)) = active {
            // Resume at the end of the valid records: no need to read the
            // records before it again.
            let w = if scan.valid_end == 0 {
                // A crash while the segment was created: rewrite its header.
                SegmentWriter::open_append_with(vfs, &path, &ident, &scan)
            } else {
                SegmentWriter::resume_with(vfs, &path, &ident, scan.valid_end, s.next_seq())
            };
            let mut w = w.map_err(|e| segment_error(&id, &path, e))?;
            w.set_max_record(self.inner.options.max_record)
                .map_err(|e| segment_error(&id, &path, e))?;
            s.writer = Some(w);
        }
        Ok((s, rec))
    }

    /// Where the records of the active segment `path` that a reader may
    /// use end, walking from `from` ([`segment::committed_end`]). When the
    /// walk stops at something other than zeros or the end of the file (a
    /// record in progress, a torn one, or damage), the whole file is
    /// scanned with the torn-versus-corrupt rules: a bad record followed by
    /// a valid one is corruption, reported, never hidden as a shorter log.
    /// A record still being written can look bad for one read while the
    /// next one is already complete, so a verdict of corruption stands only
    /// if a second walk and scan agree.
    pub(super) fn visible_end(
        &self,
        id: &str,
        path: &Path,
        ident: &SegmentIdent,
        from: u64,
    ) -> Result<segment::Committed> {
        let vfs = &*self.inner.vfs;
        let max = self.read_limit();
        let opts = ScanOptions {
            max_record: max,
            expect_sealed: false,
        };
        let mut attempt = 0;
        loop {
            let file = match vfs.open(path, false) {
                Ok(f) => f,
                // Sealed and compressed since it was listed (a raw segment
                // is removed only once its image is in place).
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        && super::segfiles::image_of(path).is_some_and(|p| vfs.exists(&p)) =>
                {
                    return Ok(segment::Committed::Sealed { end: 0 });
                }
                Err(e) => return Err(io_at(path)(e)),
            };
            let found = segment::committed_end(&*file, ident, from, max).map_err(io_at(path))?;
            let segment::Committed::Records { end } = found else {
                return Ok(found);
            };
            let mut head = [0u8; 8];
            let n = file.read_at(&mut head, end).map_err(io_at(path))?;
            if n < head.len() || head == [0; 8] {
                return Ok(found); // zeros or the end of the file
            }
            let bytes = vfs.read_file(path).map_err(io_at(path))?;
            match segment::scan(&bytes, ident, &opts) {
                Err(segment::SegmentError::Corrupt { .. }) if attempt == 0 => attempt += 1,
                Err(e) => return Err(segment_error(id, path, e)),
                // A record in progress or torn: the writer (now or next)
                // decides which; a reader stops before it.
                Ok(_) => return Ok(found),
            }
        }
    }

    /// Folds the records another writer appended to the active segment
    /// since this (reading) handle last looked: they end at `end`, found by
    /// [`segment::committed_end`]. Only bytes below `end` are touched.
    pub(super) fn fold_new_records(&self, s: &mut Session, end: u64) -> Result<()> {
        self.materialise(s)?;
        let from = s.active_end.expect("an active segment");
        let seg = s.segs.last().expect("an active segment is mapped");
        let (path, seg_first) = (seg.path.clone(), seg.first_seq);
        let ident = s.ident(self.inner.store_id, seg_first);
        let map = match self.map_file(&path) {
            Ok(map) => CommittedPrefix::of(map, end),
            // Sealed and compressed since the records were found (the raw
            // file goes only once its image is durable): read the session
            // again from its files as they are now.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let id = s.header.id.clone();
                return self.load_into(s, &id);
            }
            Err(e) => return Err(e),
        };
        let opts = ScanOptions {
            max_record: self.read_limit(),
            expect_sealed: false,
        };
        let scan = segment::scan_from(&map, &ident, &opts, from, s.next_seq())
            .map_err(|e| segment_error(&s.header.id, &path, e))?;
        s.segs.last_mut().expect("active").map = map.clone();
        let mut pack = Vec::new();
        for b in &scan.batches {
            fold_stored(s, seg_first, &map, &path, b, &mut pack)?;
        }
        s.active_end = Some(scan.valid_end.max(from));
        Ok(())
    }

    /// Decodes what the session's checkpoint left in place at open (its
    /// state, derive cache and node locations), checking it first. A
    /// checkpoint found wrong here is dropped and the session rebuilt from
    /// the log, and [`Store::recovery`] reports the rebuild and why.
    pub(super) fn materialise(&self, s: &mut Session) -> Result<()> {
        let Some(ck) = s.lazy.take() else {
            return Ok(());
        };
        let lens: Vec<(u64, u64)> = s.segs.iter().map(|g| (g.first_seq, g.len())).collect();
        let len_of = |segment: u64| lens.iter().find(|(f, _)| *f == segment).map(|g| g.1);
        let Err(why) = install(s, &ck, len_of) else {
            return Ok(());
        };
        drop(ck);
        self.rebuild_without_checkpoint(s, why)
    }

    /// Replaces loaded session `s` by a load of its log that ignores the
    /// checkpoint, found wrong for reason `why` ([`Store::recovery`]
    /// reports it).
    fn rebuild_without_checkpoint(&self, s: &mut Session, why: String) -> Result<()> {
        let id = s.header.id.clone();
        // The rebuild replaces the session whole (its writer too, under the
        // same writer lock). What the old one appended since it was loaded
        // is in the files, maybe unsynced (a derive's check runs after
        // appends): the new one counts it unsynced, and keeps the poison.
        let placeholder = self.new_session(s.header.clone())?;
        let mut old = std::mem::replace(s, placeholder);
        let entry = SessionEntry {
            header: old.header.clone(),
            uid: old.uid,
            dir: old.dir.clone(),
            found: None,
        };
        let lock = old.lock.take();
        let (poisoned, used) = (old.poisoned, old.used);
        drop(old);
        let (mut fresh, mut rec) = match self.load_session_with(entry, lock.is_some(), false) {
            Ok(loaded) => loaded,
            Err(e) => {
                // Loaded again by its next user (the lock goes with the
                // old session; a next writer counts its records unsynced).
                s.placeholder = true;
                return Err(e);
            }
        };
        fresh.dirty = lock.is_some();
        fresh.lock = lock;
        fresh.poisoned = poisoned;
        fresh.used = used;
        rec.rebuild_reason = Some(why);
        *s = fresh;
        self.inner.recoveries.lock().expect("lock").insert(id, rec);
        Ok(())
    }

    /// Checks, once per open, the records a checkpoint covered (they were
    /// not scanned at open, to keep reopen cheap): sealed segments against
    /// their footer's checksum of all records, the covering segment record by
    /// record up to the covered end. Derive reads message data in place from
    /// these records, so it must not trust them unchecked.
    pub(super) fn verify_covered(&self, s: &mut Session) -> Result<()> {
        let Some((last, end)) = s.unverified else {
            return Ok(());
        };
        let max_record = self.read_limit();
        // Derive reads the data of live surface nodes in place: the remote
        // segments holding some are fetched (and checked whole then).
        s.fetch_nodes()?;
        for seg in s.segs.iter().take_while(|g| g.first_seq <= last) {
            if seg.remote.is_some() {
                continue; // checked whole when fetched, or not read
            }
            let ident = s.ident(self.inner.store_id, seg.first_seq);
            let corrupt = |offset: u64, reason: String| Error::Corrupt {
                session: s.header.id.clone(),
                segment: seg.path.clone(),
                offset,
                reason,
            };
            if seg.first_seq < last {
                segment::check_sealed(&seg.map, &ident)
                    .map_err(|e| segment_error(&s.header.id, &seg.path, e))?;
            } else {
                let prefix = seg.map.get(..end as usize).ok_or_else(|| {
                    corrupt(
                        end,
                        "the segment is shorter than the checkpoint covers".into(),
                    )
                })?;
                let opts = ScanOptions {
                    max_record,
                    expect_sealed: false,
                };
                let scan = segment::scan(prefix, &ident, &opts)
                    .map_err(|e| segment_error(&s.header.id, &seg.path, e))?;
                if scan.valid_end != end {
                    return Err(corrupt(
                        scan.valid_end,
                        "the records end before the checkpoint's covered end".into(),
                    ));
                }
            }
        }
        s.unverified = None;
        // The derive cache came with the checkpoint too: derive lends out
        // slices of the data its entries point into.
        let snapshot = s.snapshot();
        if let Err(e) = s.derive.check(s.state.surface(), &snapshot) {
            drop(snapshot);
            let why =
                format!("checkpoint is inconsistent: its derive cache does not fit the log ({e})");
            return self.rebuild_without_checkpoint(s, why);
        }
        Ok(())
    }
}
