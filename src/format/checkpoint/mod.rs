//! The session checkpoint: the folded index state written next to the log so
//! that reopening costs O(events since the checkpoint), not O(log).
//!
//! File `CHECKPOINT` in the session directory, all integers little-endian:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `SLOGCKPT` |
//! | 8 | 4 | checkpoint format version, u32 ([`CHECKPOINT_VERSION`]) |
//! | 12 | 4 | section count, u32 (must be [`SECTION_COUNT`]) |
//! | 16 | 20 x 5 | section table: per section its offset u64, length u64, CRC-32 u32 |
//! | 116 | 4 | CRC-32 of bytes 0..116 |
//! | 120 | .. | the sections, back to back in table order, ending at the end of the file |
//!
//! The sections ([`Section`]): `HEAD` (coverage, last time, repair
//! tracker), `STATE` (the [`SessionState`]'s surface and invariants),
//! `DERIVE` (the [`DeriveCache`]), each an explicit field-by-field encoding
//! of varints, tags and length-prefixed strings (see `sections.rs` and
//! `format-spec.md` section 5); and two fixed-width tables of little-endian
//! integers, read in place: `BATCHES` (u64 count, then 24-byte
//! [`BatchEntry`]s) and `NODES` (u64 count, then 28-byte `(seq, DataLoc)`
//! entries). The encoding is pinned by a test of the exact bytes: a change
//! to it is a new [`CHECKPOINT_VERSION`].
//!
//! Opening a session reads only what it needs at once: the header, `HEAD`
//! and `BATCHES` are checked (checksums, shape, order) and used in place;
//! `STATE`, `DERIVE` and `NODES` are checked and decoded by
//! [`Checkpoint::materialise`] the first time the session needs its surface.
//! So a reopen that only reads events costs O(batches) of checksumming, not
//! O(surface) of decoding.
//!
//! A checkpoint is written atomically (temp file, fsync, rename, directory
//! fsync) and only ever covers log bytes that are already durable. It is a
//! cache: a missing, corrupt, stale or non-covering checkpoint is never
//! trusted; the session is rebuilt from the log and the rebuild reported.

use crate::derive::DeriveCache;
use crate::repair::RepairTracker;
use crate::session::SessionState;
#[cfg(any(test, feature = "internals"))]
use crate::vfs::RealFs;
use crate::vfs::{SegmentBytes, Vfs};
use sections::{Head, Reader};
use std::path::Path;

mod sections;
#[cfg(test)]
mod tests;

/// The checkpoint file's name inside a session directory.
pub const CHECKPOINT_FILE: &str = "CHECKPOINT";
/// Magic bytes at offset 0.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"SLOGCKPT";
/// The checkpoint format this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 6;
/// Sections in a checkpoint of this version.
pub const SECTION_COUNT: usize = 5;
/// Bytes per section-table entry: offset, length, CRC.
const TABLE_ENTRY_LEN: usize = 20;
/// Offset of the header's own CRC.
const HEADER_CRC_AT: usize = 16 + SECTION_COUNT * TABLE_ENTRY_LEN;
/// Fixed header length before the first section.
pub const CHECKPOINT_HEADER_LEN: usize = HEADER_CRC_AT + 4;
/// Bytes of one `BATCHES` entry.
pub const BATCH_ENTRY_LEN: usize = 24;
/// Bytes of one `NODES` entry.
pub const NODE_ENTRY_LEN: usize = 28;

/// The sections of a checkpoint, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Section {
    /// Coverage, last time, repair tracker.
    Head = 0,
    /// The folded [`SessionState`]'s surface and invariants.
    State = 1,
    /// The [`DeriveCache`].
    Derive = 2,
    /// The batch index: fixed-width batch entries.
    Batches = 3,
    /// The data locations of surface nodes: fixed-width `(seq, DataLoc)`.
    Nodes = 4,
}

impl Section {
    /// The section's name in `format-spec.md` (`HEAD`, `STATE`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Section::Head => "HEAD",
            Section::State => "STATE",
            Section::Derive => "DERIVE",
            Section::Batches => "BATCHES",
            Section::Nodes => "NODES",
        }
    }
}

/// Where the checkpoint stops: the log position it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coverage {
    /// First seq of the segment holding the last covered batch.
    pub segment_first_seq: u64,
    /// Byte offset of the last covered record's frame in that segment.
    pub last_record_offset: u64,
    /// Byte offset in that segment just past the last covered record.
    pub end_offset: u64,
    /// The CRC field of the last covered record, to prove the log at that
    /// offset is the log the checkpoint was taken from.
    pub last_record_crc: u32,
    /// The seq after the last covered event.
    pub next_seq: u64,
}

/// Where one event's `data` lies: segment (by first seq), offset, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataLoc {
    /// First seq of the segment.
    pub segment: u64,
    /// Byte offset of the data in the segment file.
    pub offset: u64,
    /// Data length in bytes.
    pub len: u32,
}

/// One batch of the log, for `read_from`: its first seq and where its
/// record starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    /// First seq of the batch.
    pub first_seq: u64,
    /// First seq of the segment holding it.
    pub segment: u64,
    /// Byte offset of its record frame in the segment file.
    pub offset: u64,
}

/// What a checkpoint holds, decoded whole.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointBody {
    /// The covered log position.
    pub coverage: Coverage,
    /// The time of the last covered event (closers reuse it).
    pub last_time: i64,
    /// The folded model: surface (with order labels), replaceGeneration,
    /// lastProcessedSeq, repair tracker.
    pub state: SessionState,
    /// The derive cache positions.
    pub derive: DeriveCache,
    /// Every batch, in order (the `read_from` index).
    pub batches: Vec<BatchEntry>,
    /// Where each surface node's data lies (the derive index), in strictly
    /// increasing seq order, all below `coverage.next_seq`; the decoder
    /// refuses anything else.
    pub node_locs: Vec<(u64, DataLoc)>,
}

/// What [`Checkpoint::materialise`] decodes: the parts a session needs to
/// fold, derive and check appends.
#[derive(Debug, Clone, PartialEq)]
pub struct Materialised {
    /// The folded model.
    pub state: SessionState,
    /// The derive cache.
    pub derive: DeriveCache,
    /// Data locations of the surface nodes, in increasing seq order.
    pub node_locs: Vec<(u64, DataLoc)>,
}

/// Why a checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// There is no checkpoint file.
    #[error("no checkpoint")]
    Missing,
    /// The file was written by another checkpoint format version.
    #[error(
        "checkpoint format version {found} is not supported (this build reads {CHECKPOINT_VERSION})"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
    },
    /// The file is damaged.
    #[error("checkpoint is corrupt: {0}")]
    Corrupt(String),
    /// A section passed its checksum but does not hold what its encoding
    /// (`format-spec.md` section 5) allows: a writer's bug or crafted bytes.
    #[error("checkpoint is corrupt: section {} at file offset {offset}: {reason}", .section.name())]
    Malformed {
        /// The section (`HEAD`, `STATE` or `DERIVE`).
        section: Section,
        /// File offset of the value that is wrong.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing failed.
    #[error("checkpoint I/O: {0}")]
    Io(#[from] std::io::Error),
}

fn corrupt(why: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt(why.into())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Builds checkpoint file bytes around raw section bytes, with every
/// checksum filled in. [`encode`] uses it; tools and tests can use it to
/// build files with chosen contents.
pub fn frame(sections: [&[u8]; SECTION_COUNT]) -> Vec<u8> {
    let total: usize = sections.iter().map(|s| s.len()).sum();
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_LEN + total);
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&(SECTION_COUNT as u32).to_le_bytes());
    let mut at = CHECKPOINT_HEADER_LEN as u64;
    for s in sections {
        out.extend_from_slice(&at.to_le_bytes());
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(s).to_le_bytes());
        at += s.len() as u64;
    }
    let head_crc = crc32fast::hash(&out[..HEADER_CRC_AT]);
    out.extend_from_slice(&head_crc.to_le_bytes());
    for s in sections {
        out.extend_from_slice(s);
    }
    out
}

/// Recomputes every section checksum and the header checksum of checkpoint
/// bytes in place (for tests that damage a file and want the damage to reach
/// the decoder). Fails if the section table does not describe the file.
#[cfg(any(test, feature = "internals"))]
pub fn fix_checksums(bytes: &mut [u8]) -> Result<(), CheckpointError> {
    let table = section_table(bytes)?;
    for (i, (off, len, _)) in table.iter().enumerate() {
        let crc = crc32fast::hash(&bytes[*off..off + len]);
        let at = 16 + i * TABLE_ENTRY_LEN + 16;
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32fast::hash(&bytes[..HEADER_CRC_AT]);
    bytes[HEADER_CRC_AT..CHECKPOINT_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The byte range of each section of checkpoint file bytes, after checking
/// the header and the section table (not the section checksums).
#[cfg(any(test, feature = "internals"))]
pub fn sections(bytes: &[u8]) -> Result<[std::ops::Range<usize>; SECTION_COUNT], CheckpointError> {
    let table = section_table(bytes)?;
    Ok(table.map(|(off, len, _)| off..off + len))
}

/// Serialises a checkpoint to its file bytes.
pub fn encode(body: &CheckpointBody) -> Vec<u8> {
    let head = sections::encode_head(&body.coverage, body.last_time, body.state.repair());
    let state = sections::encode_state(&body.state);
    let derive = sections::encode_derive(&body.derive);
    let batches = sections::encode_table(&body.batches, BATCH_ENTRY_LEN, sections::put_batch);
    let nodes = sections::encode_table(&body.node_locs, NODE_ENTRY_LEN, sections::put_node);
    frame([&head, &state, &derive, &batches, &nodes])
}

/// Checks the fixed header and returns the section table: (offset, length,
/// crc) per section. The sections must tile the file after the header.
fn section_table(bytes: &[u8]) -> Result<[(usize, usize, u32); SECTION_COUNT], CheckpointError> {
    if bytes.len() < 12 {
        return Err(corrupt("shorter than its header"));
    }
    if bytes[..8] != CHECKPOINT_MAGIC {
        return Err(corrupt("bad magic"));
    }
    // The version is read before the header checksum: a future format may
    // have another header length, and must be refused by name.
    let version = u32_at(bytes, 8);
    if version != CHECKPOINT_VERSION {
        return Err(CheckpointError::UnsupportedVersion { found: version });
    }
    if bytes.len() < CHECKPOINT_HEADER_LEN {
        return Err(corrupt("shorter than its header"));
    }
    if crc32fast::hash(&bytes[..HEADER_CRC_AT]) != u32_at(bytes, HEADER_CRC_AT) {
        return Err(corrupt("header checksum mismatch"));
    }
    if u32_at(bytes, 12) as usize != SECTION_COUNT {
        return Err(corrupt(format!(
            "{} sections, expected {SECTION_COUNT}",
            u32_at(bytes, 12)
        )));
    }
    let mut table = [(0usize, 0usize, 0u32); SECTION_COUNT];
    let mut expect = CHECKPOINT_HEADER_LEN as u64;
    for (i, slot) in table.iter_mut().enumerate() {
        let e = 16 + i * TABLE_ENTRY_LEN;
        let (off, len, crc) = (
            u64_at(bytes, e),
            u64_at(bytes, e + 8),
            u32_at(bytes, e + 16),
        );
        if off != expect
            || off
                .checked_add(len)
                .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(corrupt(format!(
                "section {i} at {off}+{len} does not follow the previous one inside the file"
            )));
        }
        expect = off + len;
        *slot = (off as usize, len as usize, crc);
    }
    if expect != bytes.len() as u64 {
        return Err(corrupt("trailing bytes after the last section"));
    }
    Ok(table)
}

/// Section `s`'s bytes, after checking its CRC, as a [`Reader`].
fn checked<'a>(
    bytes: &'a [u8],
    table: &[(usize, usize, u32); SECTION_COUNT],
    s: Section,
) -> Result<Reader<'a>, CheckpointError> {
    let (off, len, crc) = table[s as usize];
    let b = &bytes[off..off + len];
    if crc32fast::hash(b) != crc {
        return Err(corrupt(format!("{} section checksum mismatch", s.name())));
    }
    Ok(Reader::new(s, b, off))
}

/// The count of a fixed-width table section, checked against its length.
fn table_count(bytes: &[u8], width: usize) -> Option<usize> {
    let count = usize::try_from(u64_at(bytes.get(..8)?, 0)).ok()?;
    (count.checked_mul(width)?.checked_add(8)? == bytes.len()).then_some(count)
}

fn batch_at(bytes: &[u8], i: usize) -> BatchEntry {
    let o = 8 + i * BATCH_ENTRY_LEN;
    BatchEntry {
        first_seq: u64_at(bytes, o),
        segment: u64_at(bytes, o + 8),
        offset: u64_at(bytes, o + 16),
    }
}

fn node_at(bytes: &[u8], i: usize) -> (u64, DataLoc) {
    let o = 8 + i * NODE_ENTRY_LEN;
    (
        u64_at(bytes, o),
        DataLoc {
            segment: u64_at(bytes, o + 8),
            offset: u64_at(bytes, o + 16),
            len: u32_at(bytes, o + 24),
        },
    )
}

/// A checkpoint file, opened: header, `HEAD` and `BATCHES` checked; the
/// other sections checked and decoded on demand ([`Checkpoint::materialise`]).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    bytes: SegmentBytes,
    table: [(usize, usize, u32); SECTION_COUNT],
    head: Head,
    batch_count: usize,
}

impl Checkpoint {
    /// Checks the header, the section table, the `HEAD` section and the
    /// `BATCHES` section (checksum, length, strictly increasing first seqs,
    /// all below the covered seq). Cost: O(batches).
    pub fn parse(bytes: SegmentBytes) -> Result<Checkpoint, CheckpointError> {
        let table = section_table(&bytes)?;
        let head = sections::decode_head(checked(&bytes, &table, Section::Head)?)?;
        let batches = checked(&bytes, &table, Section::Batches)?.bytes();
        let batch_count = table_count(batches, BATCH_ENTRY_LEN)
            .ok_or_else(|| corrupt("BATCHES length does not match its count"))?;
        let mut prev: Option<u64> = None;
        for i in 0..batch_count {
            let b = batch_at(batches, i);
            if prev.is_some_and(|p| p >= b.first_seq) || b.first_seq >= head.coverage.next_seq {
                return Err(corrupt("the batch index is out of order"));
            }
            prev = Some(b.first_seq);
        }
        Ok(Checkpoint {
            bytes,
            table,
            head,
            batch_count,
        })
    }

    /// The encoded checkpoint, as read.
    #[cfg(any(feature = "archive", feature = "internals"))]
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The covered log position.
    pub fn coverage(&self) -> Coverage {
        self.head.coverage
    }

    /// The time of the last covered event.
    pub fn last_time(&self) -> i64 {
        self.head.last_time
    }

    /// The repair tracker at the covered position (what is open, for
    /// closers), without decoding the state.
    pub fn repair(&self) -> &RepairTracker {
        &self.head.repair
    }

    #[cfg(test)]
    fn section_bytes(&self, s: Section) -> &[u8] {
        let (off, len, _) = self.table[s as usize];
        &self.bytes[off..off + len]
    }

    /// The batch index, read in place from the mapped file.
    pub fn batches(&self) -> BatchIndex {
        let (off, _, _) = self.table[Section::Batches as usize];
        BatchIndex {
            base: Some(self.bytes.clone()),
            base_start: off,
            base_len: self.batch_count,
            tail: Vec::new(),
        }
    }

    /// Checks and decodes `STATE`, `DERIVE` and `NODES`, and checks them
    /// against `HEAD`: the surface is well formed and ends at the covered
    /// seq (the state's repair tracker is `HEAD`'s), and the node locations are
    /// in strictly increasing seq order, below the covered seq, with one for
    /// every surface node. Allocates at most a small multiple
    /// of the file's size.
    pub fn materialise(&self) -> Result<Materialised, CheckpointError> {
        let checked = |s: Section| checked(&self.bytes, &self.table, s);
        // Decoding STATE checks the surface is well formed (a checksum
        // proves these are the bytes written, not that the writer was
        // right) and agrees with HEAD's next seq; its repair tracker is
        // HEAD's.
        let state = sections::decode_state(
            checked(Section::State)?,
            self.head.coverage.next_seq,
            self.head.repair.clone(),
        )?;
        let derive = sections::decode_derive(checked(Section::Derive)?)?;
        let nodes = checked(Section::Nodes)?.bytes();
        let count = table_count(nodes, NODE_ENTRY_LEN)
            .ok_or_else(|| corrupt("NODES length does not match its count"))?;
        let node_locs: Vec<(u64, DataLoc)> = (0..count).map(|i| node_at(nodes, i)).collect();
        if node_locs.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(corrupt("the node locations are out of order"));
        }
        // Nodes appended after the checkpoint are added above every covered
        // one, and every surface node needs its data to derive.
        if node_locs
            .last()
            .is_some_and(|(seq, _)| *seq >= self.head.coverage.next_seq)
        {
            return Err(corrupt("a node location lies beyond the covered log"));
        }
        // (Iterating is safe: the surface was checked while decoding.)
        if let Some(seq) = state
            .surface()
            .iter()
            .find(|seq| node_locs.binary_search_by_key(seq, |(s, _)| *s).is_err())
        {
            return Err(corrupt(format!("surface node {seq} has no location")));
        }
        Ok(Materialised {
            state,
            derive,
            node_locs,
        })
    }

    /// Decodes everything into a [`CheckpointBody`].
    #[cfg(any(test, feature = "internals"))]
    pub fn to_body(&self) -> Result<CheckpointBody, CheckpointError> {
        let m = self.materialise()?;
        Ok(CheckpointBody {
            coverage: self.head.coverage,
            last_time: self.head.last_time,
            state: m.state,
            derive: m.derive,
            batches: self.batches().to_vec(),
            node_locs: m.node_locs,
        })
    }
}

/// Parses checkpoint file bytes whole, verifying magic, version, checksums
/// and the consistency checks of [`Checkpoint::materialise`].
#[cfg(any(test, feature = "internals"))]
pub fn decode(bytes: &[u8]) -> Result<CheckpointBody, CheckpointError> {
    Checkpoint::parse(SegmentBytes::new(bytes.to_vec()))?.to_body()
}

/// Opens the checkpoint of the session in `dir` ([`Checkpoint::parse`] of
/// the mapped file).
pub fn open_with(vfs: &dyn Vfs, dir: &Path) -> Result<Checkpoint, CheckpointError> {
    match vfs.map(&dir.join(CHECKPOINT_FILE)) {
        // The file is replaced by rename, never written in place, so the
        // mapping stays what it was when opened.
        Ok(bytes) => Checkpoint::parse(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CheckpointError::Missing),
        Err(e) => Err(e.into()),
    }
}

/// Reads the checkpoint of the session in `dir`, whole.
#[cfg(any(test, feature = "internals"))]
pub fn read(dir: &Path) -> Result<CheckpointBody, CheckpointError> {
    open_with(&RealFs, dir)?.to_body()
}

/// Writes the checkpoint of the session in `dir` atomically: after a crash
/// the old checkpoint or the new one is there, whole.
#[cfg(any(test, feature = "internals"))]
pub fn write(dir: &Path, body: &CheckpointBody) -> Result<(), CheckpointError> {
    write_with(&RealFs, dir, body)
}

/// [`write()`] through the file system `vfs` (always as the `CHECKPOINT`
/// file; the store embeds a small session's checkpoint in its `HEADER`).
#[cfg(any(test, feature = "internals"))]
pub fn write_with(vfs: &dyn Vfs, dir: &Path, body: &CheckpointBody) -> Result<(), CheckpointError> {
    crate::fsutil::write_atomic_with(vfs, dir, CHECKPOINT_FILE, &encode(body))?;
    Ok(())
}

/// The batch index of a session (`read_from`): the entries a checkpoint
/// holds, read in place from its mapping, followed by the batches appended
/// or replayed since. Entries are in strictly increasing first-seq order.
#[derive(Debug, Clone, Default)]
pub struct BatchIndex {
    base: Option<SegmentBytes>,
    base_start: usize,
    base_len: usize,
    tail: Vec<BatchEntry>,
}

impl BatchIndex {
    /// Entries in the index.
    pub fn len(&self) -> usize {
        self.base_len + self.tail.len()
    }

    /// Whether the index is empty.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The in-place entries' bytes (with their count prefix), empty when
    /// there is no base. One deref of the mapping, so loops fetch it once.
    fn base_bytes(&self) -> &[u8] {
        match &self.base {
            Some(b) => &b[self.base_start..self.base_start + 8 + self.base_len * BATCH_ENTRY_LEN],
            None => &[],
        }
    }

    /// Entry `i`.
    pub fn get(&self, i: usize) -> Option<BatchEntry> {
        if i < self.base_len {
            Some(batch_at(self.base_bytes(), i))
        } else {
            self.tail.get(i - self.base_len).copied()
        }
    }

    /// Appends an entry (its first seq must be above the last one's).
    pub fn push(&mut self, entry: BatchEntry) {
        debug_assert!(self.last().is_none_or(|b| b.first_seq < entry.first_seq));
        self.tail.push(entry);
    }

    /// The last entry.
    pub fn last(&self) -> Option<BatchEntry> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// The index of the first entry whose first seq is above `seq`, by binary
    /// search (like `slice::partition_point(|b| b.first_seq <= seq)`).
    pub fn after_seq(&self, seq: u64) -> usize {
        if self.tail.first().is_some_and(|b| b.first_seq <= seq) {
            return self.base_len + self.tail.partition_point(|b| b.first_seq <= seq);
        }
        let base = self.base_bytes();
        let (mut lo, mut hi) = (0, self.base_len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if batch_at(base, mid).first_seq <= seq {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The entries from `i` on.
    pub fn iter_from(&self, i: usize) -> impl Iterator<Item = BatchEntry> + '_ {
        let base = self.base_bytes();
        (i.min(self.base_len)..self.base_len)
            .map(move |j| batch_at(base, j))
            .chain(
                self.tail
                    .iter()
                    .skip(i.saturating_sub(self.base_len))
                    .copied(),
            )
    }

    /// Every entry, copied out.
    pub fn to_vec(&self) -> Vec<BatchEntry> {
        self.iter_from(0).collect()
    }
}
