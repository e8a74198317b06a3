//! Loading a session: the checkpoint checked against the log, the segments
//! mapped, the records after the checkpoint folded, a torn tail found.

use super::error::{Error, Result, io_at, segment_error};
use super::handle::Store;
use super::registry::SessionEntry;
use super::session::{NodeLocs, Seg, Session, View, crc_at, verbatim_range};
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
    /// Bytes of torn tail discarded.
    pub torn_at: Option<u64>,
    /// Closers appended (or, read-only, synthesised in memory).
    pub closers: u64,
}

/// The length of segment `segment` among the files found at load.
pub(super) fn len_in(files: &[(u64, PathBuf)], maps: &[SegmentBytes], segment: u64) -> Option<u64> {
    files
        .iter()
        .position(|(f, _)| *f == segment)
        .map(|i| maps[i].len() as u64)
}

/// Whether a checkpoint's batch index, whose checksum, order and covered
/// record check out, also points only into segments that exist. A checksum
/// proves the bytes are the ones written, not that they are right.
pub(super) fn batches_consistent(
    batches: &BatchIndex,
    files: &[(u64, PathBuf)],
    maps: &[SegmentBytes],
) -> std::result::Result<(), String> {
    // Entries come in seq order, so their segments too: one lookup per
    // segment, not per batch.
    let mut current: Option<(u64, Option<u64>)> = None;
    let mut len_of = |segment: u64| match current {
        Some((s, len)) if s == segment => len,
        _ => {
            let len = len_in(files, maps, segment);
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
    /// the segments, fold the events after the checkpoint, handle a torn
    /// tail, close an interrupted turn.
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
        repair: bool,
    ) -> Result<(Session, Recovery)> {
        self.load_session_with(entry, repair, true)
    }

    /// [`Store::load_session`], ignoring the checkpoint unless
    /// `use_checkpoint`: a checkpoint found wrong while it is materialised
    /// restarts the load without it.
    pub(super) fn load_session_with(
        &self,
        entry: SessionEntry,
        repair: bool,
        use_checkpoint: bool,
    ) -> Result<(Session, Recovery)> {
        let restart = |why: String| -> Result<(Session, Recovery)> {
            let (s, mut rec) = self.load_session_with(entry.clone(), repair, false)?;
            rec.rebuild_reason = Some(why);
            Ok((s, rec))
        };
        let uid = entry.uid;
        let mut s = self.new_session(entry.header.clone())?;
        s.uid = uid;
        s.dir = entry.dir.clone();
        s.unpublished = false;
        let vfs = &*self.inner.options.vfs;
        s.lineage = Lineage::read_with(vfs, &s.dir).map_err(|reason| Error::Corrupt {
            session: s.header.id.clone(),
            segment: s.dir.join(crate::lineage::LINEAGE_FILE),
            offset: 0,
            reason,
        })?;
        let id = s.header.id.clone();
        let mut rec = Recovery::default();
        let mut files: Vec<(u64, PathBuf)> = vfs
            .read_dir(&s.dir)
            .map_err(io_at(&s.dir))?
            .into_iter()
            .filter_map(|name| {
                let name = name.into_string().ok()?;
                segment::parse_segment_file_name(&name).map(|seq| (seq, s.dir.join(name)))
            })
            .collect();
        files.sort();
        let store_id = self.inner.store_id;
        let lineage = s.lineage.clone();
        let ident_of = |first_seq| SegmentIdent {
            store_id,
            session_uid: lineage.owner(first_seq).unwrap_or(uid),
            first_seq,
        };
        let maps: Vec<SegmentBytes> = files
            .iter()
            .map(|(_, p)| self.map_file(p))
            .collect::<Result<_>>()?;

        // The checkpoint is a cache: use it only if the record it claims to
        // end at is in the log, with the checksum it recorded.
        let mut covered: Option<Coverage> = None;
        let opened = if use_checkpoint {
            checkpoint::open_with(vfs, &s.dir)
        } else {
            Err(checkpoint::CheckpointError::Missing)
        };
        match opened {
            Ok(ck) => {
                let c = ck.coverage();
                let found = files.iter().position(|(f, _)| *f == c.segment_first_seq);
                let ok = found.is_some_and(|i| {
                    segment::record_at(
                        &maps[i],
                        &ident_of(c.segment_first_seq),
                        c.last_record_offset,
                    )
                    .is_some_and(|loc| {
                        loc.end() == c.end_offset
                            && loc.last_seq() + 1 == c.next_seq
                            && crc_at(&maps[i], loc.offset) == c.last_record_crc
                    })
                });
                let batches = ck.batches();
                let consistent = if ok {
                    batches_consistent(&batches, &files, &maps)
                } else {
                    Err("checkpoint does not match the log".into())
                };
                if let Err(why) = consistent {
                    rec.rebuild_reason = Some(why);
                } else {
                    s.batches = batches;
                    s.last_time = ck.last_time();
                    s.last_record = Some((
                        c.segment_first_seq,
                        c.last_record_offset,
                        c.end_offset,
                        c.last_record_crc,
                    ));
                    covered = Some(c);
                    s.unverified = Some((c.segment_first_seq, c.end_offset));
                    s.lazy = Some(Arc::new(ck));
                }
            }
            Err(e) if use_checkpoint => rec.rebuild_reason = Some(e.to_string()),
            Err(_) => {}
        }
        rec.used_checkpoint = covered.is_some();

        let scan_opts = |sealed| ScanOptions {
            max_record: self
                .inner
                .options
                .max_record
                .max(segment::DEFAULT_MAX_RECORD),
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
            s.segs.push(Seg {
                first_seq,
                path: path.clone(),
                map: map.clone(),
            });
            if !last {
                if segment::read_header(&map).map_err(|e| segment_error(&id, path, e))? != ident {
                    return Err(corrupt(
                        path,
                        12,
                        "segment identity does not match its session".into(),
                    ));
                }
                let footer =
                    segment::verify_footer(&map).map_err(|e| segment_error(&id, path, e))?;
                expected_first = footer.last_seq + 1;
                if covered.is_some_and(|c| {
                    footer.last_seq < c.next_seq && c.segment_first_seq != first_seq
                }) {
                    continue; // wholly covered by the checkpoint
                }
            }
            let scan = match covered.filter(|c| c.segment_first_seq == first_seq) {
                Some(c) => {
                    segment::scan_from(&map, &ident, &scan_opts(!last), c.end_offset, c.next_seq)
                }
                None => segment::scan(&map, &ident, &scan_opts(!last)),
            }
            .map_err(|e| segment_error(&id, path, e))?;
            for b in &scan.batches {
                if b.first_seq < s.next_seq() {
                    continue; // a full rescan after a resume met a footer
                }
                // Events after the checkpoint are folded into its state.
                if let Some(ck) = s.lazy.take()
                    && let Err(why) = install(&mut s, &ck, |seg| len_in(&files, &maps, seg))
                {
                    drop(s);
                    return restart(why);
                }
                let r = b.codec_range();
                let events = codec::decode_batch(
                    &map[r.start as usize..r.end as usize],
                    b.first_seq,
                    b.count,
                    0,
                )
                .map_err(|e| corrupt(path, b.offset, format!("batch does not decode: {e}")))?;
                let Session {
                    state,
                    segs,
                    node_locs,
                    ..
                } = &mut s;
                let view = View { segs, node_locs };
                state.append_batch(&events, &view).map_err(|v| {
                    corrupt(path, b.offset, format!("stored batch breaks a rule: {v}"))
                })?;
                let last_time = events.last().map_or(s.last_time, |e| e.time);
                s.index_batch(first_seq, &map, b, last_time, |i| {
                    verbatim_range(&map, events[i].data.get())
                })
                .map_err(|why| corrupt(path, b.offset, why))?;
                rec.replayed += events.len() as u64;
            }
            if last {
                expected_first = s.next_seq();
                if let Tail::Torn { offset, .. } = scan.tail {
                    torn = Some((path.clone(), offset));
                    rec.torn_at = Some(offset);
                }
                if scan.is_sealed() {
                    if !self.inner.read_only {
                        // A crash between the footer write and the cut.
                        SegmentWriter::complete_seal_with(vfs, path, &scan)
                            .map_err(|e| segment_error(&id, path, e))?;
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
        if self.inner.read_only {
            rec.closers = s.closers().len() as u64;
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
        if repair && !s.closers().is_empty() {
            // Closers are folded: the checkpoint's state is needed now.
            if let Some(ck) = s.lazy.take()
                && let Err(why) = install(&mut s, &ck, |seg| len_in(&files, &maps, seg))
            {
                drop(s);
                return restart(why);
            }
            rec.closers = self.append_closers(&mut s)?.len() as u64;
        }
        Ok((s, rec))
    }

    /// Decodes what the session's checkpoint left in place at open (its
    /// state, derive cache and node locations), checking it first. A
    /// checkpoint found wrong here is dropped and the session rebuilt from
    /// the log, and [`Store::recovery`] reports the rebuild and why.
    pub(super) fn materialise(&self, s: &mut Session) -> Result<()> {
        let Some(ck) = s.lazy.take() else {
            return Ok(());
        };
        let lens: Vec<(u64, u64)> = s
            .segs
            .iter()
            .map(|g| (g.first_seq, g.map.len() as u64))
            .collect();
        let len_of = |segment: u64| lens.iter().find(|(f, _)| *f == segment).map(|g| g.1);
        let Err(why) = install(s, &ck, len_of) else {
            return Ok(());
        };
        drop(ck);
        let id = s.header.id.clone();
        // The rebuild replaces the session whole (its writer too); the old
        // one never appended anything after its checkpoint.
        let placeholder = self.new_session(s.header.clone())?;
        let old = std::mem::replace(s, placeholder);
        let entry = SessionEntry {
            header: old.header.clone(),
            uid: old.uid,
            dir: old.dir.clone(),
        };
        drop(old);
        let (fresh, mut rec) = self.load_session_with(entry, true, false)?;
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
        let max_record = self
            .inner
            .options
            .max_record
            .max(segment::DEFAULT_MAX_RECORD);
        for seg in s.segs.iter().take_while(|g| g.first_seq <= last) {
            let ident = s.ident(self.inner.store_id, seg.first_seq);
            let corrupt = |offset: u64, reason: String| Error::Corrupt {
                session: s.header.id.clone(),
                segment: seg.path.clone(),
                offset,
                reason,
            };
            if seg.first_seq < last {
                let footer = segment::verify_footer(&seg.map)
                    .map_err(|e| segment_error(&s.header.id, &seg.path, e))?;
                let records = &seg.map[segment::HEADER_LEN..seg.map.len() - segment::FOOTER_LEN];
                if crc32fast::hash(records) != footer.records_crc {
                    return Err(corrupt(
                        segment::HEADER_LEN as u64,
                        "the records do not match the footer's checksum".into(),
                    ));
                }
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
        Ok(())
    }
}
