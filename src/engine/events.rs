//! Reading a session's events batch by batch: the one decoding loop behind
//! [`Store::read_from`] (which collects) and [`Store::events`] (which
//! streams, holding one batch at a time).

use super::error::{Error, Result};
use super::handle::Store;
use super::session::{Seg, Session};
use crate::checkpoint::BatchIndex;
use crate::codec;
use crate::event::OwnedEvent;
use crate::lineage::Lineage;
use crate::segment::{self, SegmentIdent};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// The batches of a session from one batch on, over a snapshot of its
/// mapped segments and batch index (cheap: the segments are shared maps,
/// the index's checkpointed part a shared map too), so reading needs no
/// lock on the session once it is taken.
pub(super) struct BatchCursor {
    id: String,
    dir: PathBuf,
    store_id: [u8; 16],
    uid: [u8; 16],
    lineage: Lineage,
    segs: Vec<Seg>,
    batches: BatchIndex,
    /// The next batch index to decode.
    at: usize,
    /// Batches starting at or past this seq are not read.
    until: u64,
    /// The seq the next batch must start at: the index must not skip one.
    expected: Option<u64>,
}

impl BatchCursor {
    /// A cursor over the batches of `s` holding seqs `from..until`.
    pub(super) fn new(store_id: [u8; 16], s: &Session, from: u64, until: u64) -> BatchCursor {
        let at = s.batches.after_seq(from).saturating_sub(1);
        BatchCursor {
            id: s.header.id.clone(),
            dir: s.dir.clone(),
            store_id,
            uid: s.uid,
            lineage: s.lineage.clone(),
            segs: s.segs.clone(),
            batches: s.batches.clone(),
            at,
            until,
            expected: (at == 0).then_some(0),
        }
    }

    /// The seq the next batch would start at (where the batches read so far
    /// end), once one was read from the start.
    pub(super) fn expected(&self) -> Option<u64> {
        self.expected
    }

    fn corrupt(&self, path: &Path, offset: u64, reason: String) -> Error {
        Error::Corrupt {
            session: self.id.clone(),
            segment: path.to_owned(),
            offset,
            reason,
        }
    }

    /// Decodes the next batch; `None` past the end (or `until`).
    pub(super) fn next_batch(&mut self) -> Option<Result<Vec<OwnedEvent>>> {
        let b = self.batches.get(self.at)?;
        if b.first_seq >= self.until {
            return None;
        }
        self.at += 1;
        let i = self.segs.partition_point(|g| g.first_seq <= b.segment);
        let Some(seg) = i
            .checked_sub(1)
            .map(|i| &self.segs[i])
            .filter(|g| g.first_seq == b.segment)
        else {
            return Some(Err(self.corrupt(
                &self.dir,
                b.offset,
                format!("the index names segment {} which is not mapped", b.segment),
            )));
        };
        // Issue 17: a segment only in the archive is fetched when a batch
        // in it is first read.
        if let Err(e) = seg.fetch() {
            return Some(Err(e));
        }
        // Records a checkpoint covers were not scanned at open: check the
        // frame and its CRC here, before trusting any length in it.
        let ident = SegmentIdent {
            store_id: self.store_id,
            session_uid: self.lineage.owner(seg.first_seq).unwrap_or(self.uid),
            first_seq: seg.first_seq,
        };
        let Some(loc) = segment::record_at(&seg.map, &ident, b.offset)
            .filter(|loc| loc.first_seq == b.first_seq)
        else {
            return Some(Err(self.corrupt(
                &seg.path,
                b.offset,
                "no valid record where the index points (checksum or frame damaged)".into(),
            )));
        };
        if let Some(e) = self.expected.filter(|e| *e != loc.first_seq) {
            return Some(Err(self.corrupt(
                &seg.path,
                b.offset,
                format!("the index skips from seq {e} to batch {}", loc.first_seq),
            )));
        }
        self.expected = Some(loc.first_seq + u64::from(loc.count));
        let r = loc.codec_range();
        let decoded = codec::decode_batch(
            &seg.map[r.start as usize..r.end as usize],
            loc.first_seq,
            loc.count,
            0,
        );
        Some(match decoded {
            Ok(events) => Ok(events.into_iter().map(|e| e.into_owned()).collect()),
            Err(e) => Err(self.corrupt(&seg.path, b.offset, e.to_string())),
        })
    }
}

/// The events of a session from a seq on, decoded one batch at a time
/// ([`Store::events`]): memory holds one batch, however long the log.
pub struct Events {
    cursor: BatchCursor,
    from: u64,
    pending: VecDeque<OwnedEvent>,
    failed: bool,
}

impl Store {
    /// The stored events of session `id` from seq `from` on, as an iterator
    /// that decodes one batch at a time (so reading a million events holds
    /// one batch, not the log). It reads the session as it is when called
    /// (appends made later are not included; [`Store::tail`] follows them).
    /// A damaged record ends it with an [`Error::Corrupt`] item.
    pub fn events(&self, id: &str, from: u64) -> Result<Events> {
        let store_id = self.inner.store_id;
        self.with_session(id, |s| {
            let end = s.next_seq();
            Ok(Events {
                cursor: BatchCursor::new(store_id, s, from, end),
                from,
                pending: VecDeque::new(),
                failed: false,
            })
        })
    }
}

impl Iterator for Events {
    type Item = Result<OwnedEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(Ok(e));
            }
            if self.failed {
                return None;
            }
            match self.cursor.next_batch()? {
                Ok(batch) => self
                    .pending
                    .extend(batch.into_iter().filter(|e| e.seq >= self.from)),
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
