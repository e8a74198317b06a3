//! One loaded session: its folded model, mapped segments, read indexes and
//! (when this handle writes it) its active segment writer.

use super::error::{Error, Result};
use super::locks::SessionLock;
use crate::checkpoint::{BatchEntry, BatchIndex, Checkpoint, Coverage, DataLoc};
use crate::derive::DeriveCache;
use crate::event::OwnedEvent;
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::segment::{self, SegmentIdent, SegmentWriter};
use crate::session::SessionState;
use crate::surface::EventSource;
use crate::vfs::SegmentBytes;
use serde_json::value::RawValue;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// A mapped segment (or one in the archive only, fetched on first read:
/// `remote.rs`).
#[derive(Clone)]
pub(super) struct Seg {
    pub(super) first_seq: u64,
    pub(super) path: PathBuf,
    pub(super) map: SegmentBytes,
    pub(super) remote: Option<Arc<super::remote::Remote>>,
}

/// Where a session's newest record lies and its CRC field: a checkpoint's
/// [`Coverage`] without the next seq (which the session's state holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LastRecord {
    pub(super) segment_first_seq: u64,
    /// The record frame's offset in that segment.
    pub(super) offset: u64,
    /// Just past the record.
    pub(super) end: u64,
    pub(super) crc: u32,
}

impl LastRecord {
    /// What a checkpoint's coverage says of it.
    pub(super) fn of(c: &Coverage) -> Self {
        LastRecord {
            segment_first_seq: c.segment_first_seq,
            offset: c.last_record_offset,
            end: c.end_offset,
            crc: c.last_record_crc,
        }
    }

    /// The coverage of a checkpoint ending at this record.
    pub(super) fn coverage(self, next_seq: u64) -> Coverage {
        Coverage {
            segment_first_seq: self.segment_first_seq,
            last_record_offset: self.offset,
            end_offset: self.end,
            last_record_crc: self.crc,
            next_seq,
        }
    }
}

/// One loaded session.
pub(super) struct Session {
    pub(super) header: SessionHeader,
    pub(super) uid: [u8; 16],
    /// Segments shared with an ancestor through a fork, and their owners.
    pub(super) lineage: Lineage,
    pub(super) dir: PathBuf,
    /// The folded model. While `lazy` holds a checkpoint this is an empty
    /// placeholder: [`Store::materialise`] fills it before any fold, surface
    /// or derive; `Session::next_seq` and `Session::closers` answer from the
    /// checkpoint's head meanwhile.
    pub(super) state: SessionState,
    pub(super) derive: DeriveCache,
    /// A checkpoint used at open whose state, derive cache and node
    /// locations are not decoded yet (a reopen that only reads events never
    /// pays for them).
    pub(super) lazy: Option<Arc<Checkpoint>>,
    pub(super) segs: Vec<Seg>,
    pub(super) writer: Option<SegmentWriter>,
    pub(super) batches: BatchIndex,
    pub(super) node_locs: Arc<NodeLocs>,
    pub(super) last_time: i64,
    /// The newest record: what a checkpoint's coverage names.
    pub(super) last_record: Option<LastRecord>,
    pub(super) since_checkpoint: u64,
    pub(super) dirty: bool,
    pub(super) poisoned: bool,
    /// A session declared with `create` and not yet published: its first
    /// append publishes it.
    pub(super) unpublished: bool,
    /// `dir` is the session's staging directory (being built, not visible).
    pub(super) staged: bool,
    /// An import in progress: no sync per batch (one at the end).
    pub(super) defer_sync: bool,
    /// The committed end of the last, unsealed segment as found at load
    /// (read-only stores have no writer to ask).
    pub(super) active_end: Option<u64>,
    /// The log prefix a checkpoint covered at load, whose records were not
    /// scanned then: (segment, end offset). Checked before derive reads
    /// message data from it.
    pub(super) unverified: Option<(u64, u64)>,
    /// This handle's writer lock on the session: held from its first write
    /// until the session is closed or evicted. Without it the session is
    /// read only, and refreshed from the files before each read.
    pub(super) lock: Option<SessionLock>,
    /// The identity of `dir` when loaded (inode number and birth time):
    /// another one means the session was replaced (or deleted and created
    /// again) by another handle. The birth time tells a re-created
    /// directory that got the freed inode number back.
    pub(super) dir_id: (u64, Option<std::time::SystemTime>),
    /// An entry of the session map not loaded yet (or whose load failed):
    /// its first user loads it.
    pub(super) placeholder: bool,
    /// When the session was last used (the handle's clock), for eviction.
    pub(super) used: u64,
    /// Some compressed image holding data of a live surface node may not
    /// be decoded (set at load and when the decoded images are given back):
    /// derive decodes them first ([`Session::fetch_nodes`]), where damage is
    /// an error naming the image. Clear, derive skips that O(surface) walk.
    pub(super) refetch: bool,
    /// The closers of an interrupted last turn are still to be appended:
    /// taking the session for writing tried and failed without poisoning
    /// it (a full disk). The next write tries again before anything else.
    pub(super) closers_due: bool,
}

/// What a reader sees: the mapped segments and where the data lies.
#[derive(Clone)]
pub struct Snapshot {
    pub(super) segs: Vec<Seg>,
    pub(super) node_locs: Arc<NodeLocs>,
}

impl EventSource for Snapshot {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        data_in(&self.segs, &self.node_locs, seq)
    }
}

/// A borrowed [`Snapshot`]: what the fold of an append reads, without
/// taking a reference to the node-location map (which would make the next
/// index update copy it).
pub(super) struct View<'a> {
    pub(super) segs: &'a [Seg],
    pub(super) node_locs: &'a NodeLocs,
}

impl EventSource for View<'_> {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        data_in(self.segs, self.node_locs, seq)
    }
}

/// Where the data of each surface node lies, in increasing seq order (nodes
/// are only ever added with a seq above every earlier one), found by binary
/// search: no hashing on append, and the checkpoint's `NODES` table as it is.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeLocs(pub(super) Vec<(u64, DataLoc)>);

impl NodeLocs {
    pub(super) fn get(&self, seq: u64) -> Option<&DataLoc> {
        let i = self.0.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        Some(&self.0[i].1)
    }

    pub(super) fn push(&mut self, seq: u64, loc: DataLoc) {
        debug_assert!(self.0.last().is_none_or(|(s, _)| *s < seq));
        self.0.push((seq, loc));
    }
}

/// The stored data of surface node `seq`, read in place from its segment.
pub(super) fn data_in<'a>(segs: &'a [Seg], node_locs: &NodeLocs, seq: u64) -> Option<&'a RawValue> {
    let loc = node_locs.get(seq)?;
    // Segments are sorted by first seq.
    let i = segs
        .partition_point(|s| s.first_seq <= loc.segment)
        .checked_sub(1)?;
    let seg = segs.get(i).filter(|s| s.first_seq == loc.segment)?;
    let bytes = seg
        .map
        .get(loc.offset as usize..loc.offset as usize + loc.len as usize)?;
    // The bytes were valid JSON when appended, and their record's CRC was
    // checked (at open, or by `verify_covered` before derive); only UTF-8 is
    // needed for a sound RawValue.
    Some(crate::model::payload::raw_value(
        std::str::from_utf8(bytes).ok()?,
    ))
}

impl Session {
    /// The session's directory was renamed to `dir` (published): its files
    /// are the same (open handles and maps follow the inode), their paths
    /// are not.
    pub(super) fn move_to(&mut self, dir: PathBuf) {
        for seg in &mut self.segs {
            if let Some(name) = seg.path.file_name() {
                seg.path = dir.join(name);
            }
        }
        self.dir = dir;
        self.staged = false;
    }

    /// The identity segment `first_seq` of this session must carry (the
    /// owner's uid for a segment shared through a fork).
    pub(super) fn ident(&self, store_id: [u8; 16], first_seq: u64) -> SegmentIdent {
        SegmentIdent {
            store_id,
            session_uid: self.lineage.owner(first_seq).unwrap_or(self.uid),
            first_seq,
        }
    }

    /// `fdatasync`s the active segment. A failure poisons the session: the
    /// kernel may have dropped the dirty pages, and a retried fsync could
    /// report success for data that is gone.
    pub(super) fn sync_now(&mut self) -> Result<()> {
        if let Some(w) = &self.writer
            && let Err(e) = w.sync()
        {
            self.poisoned = true;
            return Err(Error::Io {
                path: self
                    .segs
                    .last()
                    .map_or_else(|| self.dir.clone(), |g| g.path.clone()),
                source: e,
            });
        }
        self.dirty = false;
        Ok(())
    }

    /// Lets the session go: syncs what is unsynced, trims the active
    /// segment's preallocated zeros (space a closed session should not
    /// keep: 1,000 small sessions would otherwise hold 1,000 MiB), and
    /// releases the writer lock. A failed sync poisons the session and is
    /// returned; the lock is then kept, so nobody else writes past a batch
    /// whose fate is unknown until this handle is dropped.
    pub(super) fn release(&mut self) -> Result<()> {
        if self.lock.is_none() {
            return Ok(());
        }
        if self.poisoned {
            return Err(Error::Poisoned(self.header.id.clone()));
        }
        self.sync_if_dirty()?;
        if let Some(w) = &mut self.writer {
            // Only zeros past the last record go; a reader never touches
            // bytes past the committed end, so none can fault on the cut.
            // Losing the cut to a crash leaves zeros, which read as the end.
            let _ = w.trim();
            // Read-only from here on: refreshed from its committed end.
            self.active_end = Some(w.len());
        }
        self.writer = None;
        self.lock = None;
        Ok(())
    }

    /// Whether the last segment is still active (not sealed).
    pub(super) fn last_is_active(&self) -> bool {
        self.writer.is_some() || self.active_end.is_some()
    }

    /// [`Session::sync_now`] when appends are waiting for a sync.
    pub(super) fn sync_if_dirty(&mut self) -> Result<()> {
        if self.dirty { self.sync_now() } else { Ok(()) }
    }

    /// Extends the read indexes with a batch just written or replayed: the
    /// batch index, the data locations of the surface nodes it added, the
    /// newest record and time. `data_range(i)` is the byte range in `map`
    /// of event `i`'s `data` when it is stored verbatim (`None` when it is
    /// packed). A surface node must be verbatim, since derive reads it in
    /// place; the writer guarantees it, so a stored batch that breaks it is
    /// corrupt, and the error names the seq.
    pub(super) fn index_batch(
        &mut self,
        segment: u64,
        map: &[u8],
        b: &segment::BatchLoc,
        last_time: i64,
        data_range: impl Fn(usize) -> Option<Range<usize>>,
    ) -> std::result::Result<(), String> {
        let locs = Arc::make_mut(&mut self.node_locs);
        let batch = b.first_seq..b.first_seq + u64::from(b.count);
        for seq in self.state.surface().live_in(batch) {
            let range = data_range((seq - b.first_seq) as usize)
                .filter(|r| r.end <= map.len())
                .ok_or_else(|| format!("surface node {seq} is not stored verbatim"))?;
            locs.push(
                seq,
                DataLoc {
                    segment,
                    offset: range.start as u64,
                    len: range.len() as u32,
                },
            );
        }
        self.batches.push(BatchEntry {
            first_seq: b.first_seq,
            segment,
            offset: b.offset,
        });
        self.last_time = last_time;
        self.last_record = Some(LastRecord {
            segment_first_seq: segment,
            offset: b.offset,
            end: b.end(),
            crc: segment::frame_crc_field(map, b.offset),
        });
        Ok(())
    }

    /// The seq the next event must have.
    pub(super) fn next_seq(&self) -> u64 {
        match &self.lazy {
            Some(ck) => ck.coverage().next_seq,
            None => self.state.next_seq(),
        }
    }

    /// The closers a crash now would need.
    pub(super) fn closers(&self) -> Vec<OwnedEvent> {
        match &self.lazy {
            Some(ck) => ck.repair().closers(),
            None => self.state.closers(),
        }
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            segs: self.segs.clone(),
            node_locs: self.node_locs.clone(),
        }
    }
}

/// Where `data`, decoded from `map`, lies in it: `None` when the decoder
/// produced it elsewhere (a packed field).
pub(super) fn verbatim_range(map: &[u8], data: &str) -> Option<Range<usize>> {
    let start = (data.as_ptr() as usize).checked_sub(map.as_ptr() as usize)?;
    let end = start + data.len();
    (end <= map.len()).then_some(start..end)
}
