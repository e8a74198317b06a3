//! Reading a session's events batch by batch: the one decoding loop behind
//! [`Store::read_from`] (which collects), [`Store::events`] (which
//! streams, holding one batch at a time) and [`Store::batches`] (which lends
//! each batch's events, borrowed from the map).

use super::error::{Error, Result};
use super::handle::Store;
use super::session::{Seg, Session};
use crate::checkpoint::BatchIndex;
use crate::codec;
use crate::event::{Event, OwnedEvent};
use crate::lineage::Lineage;
use crate::segment::{self, SegmentIdent};
use std::collections::VecDeque;
use std::ops::Range;
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
    /// The index in `segs` of the segment read last.
    current: Option<usize>,
    batches: BatchIndex,
    /// The next batch index to decode.
    at: usize,
    /// Batches starting at or past this seq are not read.
    until: u64,
    /// The seq the next batch must start at: the index must not skip one.
    expected: Option<u64>,
    /// The decoded pack of the batch read last, reused: packed data is
    /// lent from it as verbatim data is from the map.
    pack: Vec<u8>,
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
            // Compressed images not decoded yet are decoded into the
            // cursor's own copies, one at a time (see `with_next_batch`),
            // not into the session's.
            segs: s.segs.iter().map(Seg::private).collect(),
            current: None,
            batches: s.batches.clone(),
            at,
            until,
            expected: (at == 0).then_some(0),
            pack: Vec::new(),
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

    /// Decodes the next batch and adds its events with seqs in `seqs` to
    /// `out`; `None` past the end (or `until`).
    pub(super) fn next_batch_into(
        &mut self,
        seqs: Range<u64>,
        out: &mut impl Extend<OwnedEvent>,
    ) -> Option<Result<()>> {
        self.with_next_batch(|events| Event::into_owned_batch(events, seqs, out))
    }

    /// Moving on to segment `next` (an index in `segs`): the last one's
    /// decoded image, if the cursor decoded one, is dropped; nothing
    /// borrows it past a batch. Once per segment, out of the batch loop.
    #[inline(never)]
    fn move_to(&mut self, next: Option<usize>) {
        if let Some(done) = self.current
            && let Some(fresh) = self.segs[done].released()
        {
            self.segs[done] = fresh;
        }
        self.current = next;
    }

    /// Decodes the next batch and lends its events, borrowed from the
    /// mapped segment, to `f`; `None` past the end (or `until`).
    pub(super) fn with_next_batch<R>(
        &mut self,
        f: impl FnOnce(Vec<Event<'_>>) -> R,
    ) -> Option<Result<R>> {
        let b = self.batches.get(self.at)?;
        if b.first_seq >= self.until {
            return None;
        }
        self.at += 1;
        let i = self.segs.partition_point(|g| g.first_seq <= b.segment);
        if self.current != i.checked_sub(1) {
            self.move_to(i.checked_sub(1));
        }
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
        let decoded = codec::decode_batch_in(
            &seg.map[r.start as usize..r.end as usize],
            loc.first_seq,
            loc.count,
            0,
            &mut self.pack,
        );
        Some(match decoded {
            Ok(events) => Ok(f(events)),
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

/// The stored batches of a session from a seq on, each decoded in turn and
/// lent to a callback with its events borrowed from the mapped segment
/// ([`Store::batches`]): no event is copied into an owned record (a packed
/// batch is decompressed into one buffer), and memory holds one batch. For a caller that writes events out (as JSON text, over a
/// wire) rather than keeping them.
pub struct Batches {
    cursor: BatchCursor,
    from: u64,
    end: u64,
    /// The log is known to end short of `end` (a poisoned session may hold
    /// a written batch its index missed): the end is not checked.
    poisoned: bool,
    done: bool,
}

impl Store {
    /// The stored batches of session `id` holding seqs from `from` on, as
    /// they are when called ([`Batches::end`] is the session's length then;
    /// later appends are not included). Like [`Store::events`] but lending
    /// each batch's events instead of copying them:
    ///
    /// ```
    /// # use sessionlog::{build, event::Event, header::SessionHeader, store::{Options, Store}};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path(), Options::default())?;
    /// store.create(SessionHeader::new("s", 0))?;
    /// let events = [build::user_message(0, 1, "hi"), build::user_message(1, 2, "again")];
    /// let borrowed: Vec<Event<'_>> = events.iter().map(|e| e.borrowed()).collect();
    /// store.append("s", &borrowed)?;
    /// let mut batches = store.batches("s", 1)?;
    /// let mut seqs = Vec::new();
    /// while let Some(batch) = batches.next_with(|events| {
    ///     seqs.extend(events.iter().map(|e| e.seq));
    /// }) {
    ///     batch?;
    /// }
    /// assert_eq!((seqs, batches.end()), (vec![1], 2));
    /// # Ok::<(), sessionlog::store::Error>(())
    /// ```
    pub fn batches(&self, id: &str, from: u64) -> Result<Batches> {
        let store_id = self.inner.store_id;
        self.with_session(id, |s| {
            let end = s.next_seq();
            Ok(Batches {
                cursor: BatchCursor::new(store_id, s, from, end),
                from,
                end,
                poisoned: s.poisoned,
                done: false,
            })
        })
    }
}

impl Batches {
    /// The session's length when the reader was made: the seq after the
    /// last event it yields.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Decodes the next batch and calls `f` with its events at or past the
    /// reader's `from` seq (a first batch may start before it), borrowed
    /// from the mapped segment. `None` once every batch was read; a damaged
    /// record, or a batch index that ends short of [`Batches::end`], is an
    /// [`Error::Corrupt`] naming the segment and offset, after which it
    /// yields nothing more.
    pub fn next_with<R>(&mut self, f: impl FnOnce(&[Event<'_>]) -> R) -> Option<Result<R>> {
        // (The cursor starts at the batch holding `from`: with `from` at or
        // past the end, that is the last batch, with nothing to lend.)
        if self.done || self.from >= self.end {
            return None;
        }
        let from = self.from;
        let next = self.cursor.with_next_batch(|events| {
            let skip = events.iter().take_while(|e| e.seq < from).count();
            f(&events[skip..])
        });
        match next {
            Some(Ok(r)) => Some(Ok(r)),
            Some(Err(e)) => {
                self.done = true;
                Some(Err(e))
            }
            None => {
                self.done = true;
                match self.cursor.expected() {
                    Some(e) if e != self.end && !self.poisoned => Some(Err(Error::Corrupt {
                        session: self.cursor.id.clone(),
                        segment: self.cursor.dir.clone(),
                        offset: 0,
                        reason: format!(
                            "the batch index ends at seq {e} but the log at {}",
                            self.end
                        ),
                    })),
                    _ => None,
                }
            }
        }
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
            match self
                .cursor
                .next_batch_into(self.from..u64::MAX, &mut self.pending)?
            {
                Ok(()) => {}
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}
