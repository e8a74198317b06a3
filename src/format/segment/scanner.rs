//! The scanner: the one place that tells a torn write (the end of the log
//! after a crash, recovered by discarding it) from corruption (bytes that
//! changed after they were written, never repaired automatically).
//!
//! A frame is checked at one offset ([`check_frame`]); after a frame that is
//! not valid, the rest of the file is searched for any valid record or
//! footer ([`find_valid_after`], the resync), because a crash only damages
//! the end of the log: a bad record followed by a valid one is corruption.

use super::footer::{FooterCheck, decode_footer};
use super::frame::{frame_crc, frame_trailer, is_all_zero, next_nonzero};
use super::header::{is_torn_header, read_header};
use super::{
    BATCH_HEADER_LEN, DEFAULT_MAX_RECORD, FOOTER_LEN, FOOTER_MAGIC, FRAME_OVERHEAD, Footer,
    HEADER_LEN, MAX_RECORD_LIMIT, SegmentError, SegmentIdent, corrupt, invalid,
};
use crate::format::bytes::{le_u32, le_u64};
use std::ops::Range;

/// Outcome of checking the bytes at one offset as a record frame.
enum FrameCheck {
    /// Length, checksum and trailer agree; `payload` is the payload range.
    Valid { payload: Range<usize> },
    /// `len == 0 && crc == 0` (or fewer than 8 zero bytes left): zero-filled
    /// space, the end of the log if nothing valid follows.
    End,
    /// Looks like an incomplete write.
    Torn(&'static str),
    /// The whole frame reached the disk (its trailer is intact) but the
    /// checksum fails: the bytes changed after they were written.
    Corrupt(&'static str),
}

fn check_frame(bytes: &[u8], at: usize, salt: u32) -> FrameCheck {
    let rest = &bytes[at..];
    if rest.len() < 8 {
        return if is_all_zero(rest) {
            FrameCheck::End
        } else {
            FrameCheck::Torn("incomplete record header at end of file")
        };
    }
    let len = le_u32(rest, 0);
    let crc = le_u32(rest, 4);
    if len == 0 {
        return if crc == 0 {
            FrameCheck::End
        } else {
            FrameCheck::Torn("zero record length with a nonzero checksum")
        };
    }
    if len > MAX_RECORD_LIMIT {
        return FrameCheck::Torn("record length is larger than any record can be");
    }
    // `len` is at most 1 GiB here, and it is only used to index bytes that
    // exist: no allocation ever depends on it.
    let len = len as usize;
    let frame_len = FRAME_OVERHEAD + len;
    if rest.len() < frame_len {
        return FrameCheck::Torn("record extends past the end of the file");
    }
    let trailer = le_u32(rest, 8 + len);
    if trailer != frame_trailer(salt, crc) {
        return FrameCheck::Torn("record trailer does not match its header (incomplete write)");
    }
    if frame_crc(salt, &rest[0..4], &rest[8..8 + len]) != crc {
        // A zero trailer is indistinguishable from space the write never
        // reached, so it cannot prove the write was complete.
        if trailer == 0 {
            return FrameCheck::Torn("record checksum mismatch with a zero trailer");
        }
        return FrameCheck::Corrupt("checksum mismatch in a completely written record");
    }
    FrameCheck::Valid {
        payload: at + 8..at + 8 + len,
    }
}

/// What the forward search after a bad record found.
enum FollowUp {
    Nothing,
    Record(usize),
    Footer(usize),
    /// Too many candidate frames to check within the work bound.
    Undecided,
}

/// Searches byte by byte from `from` for any offset where a record frame of
/// this segment validates, or where a footer with a valid checksum starts.
///
/// Work is bounded by the file size: zero runs are skipped in bulk, almost
/// every other offset is rejected by a few comparisons (length range, fit,
/// salted trailer), and the bytes checksummed for the rare remaining
/// candidates are capped at the file size.
fn find_valid_after(bytes: &[u8], from: usize, salt: u32) -> FollowUp {
    let n = bytes.len();
    let mut budget = n.saturating_add(1 << 16);
    let mut p = from.max(HEADER_LEN);
    while n.saturating_sub(p) >= 8 {
        if bytes[p..p + 8] == FOOTER_MAGIC {
            if n - p >= FOOTER_LEN && le_u32(bytes, p + 36) == crc32fast::hash(&bytes[p..p + 36]) {
                return FollowUp::Footer(p);
            }
            p += 1;
            continue;
        }
        let len = le_u32(bytes, p);
        if len == 0 {
            // No frame can start at an offset whose 4 length bytes are all
            // zero: jump to the first nonzero byte and back up 3 so every
            // offset whose length field includes it is still tried.
            match next_nonzero(bytes, p + 4) {
                Some(z) => p = z - 3,
                None => return FollowUp::Nothing,
            }
            continue;
        }
        let len = len as usize;
        if len <= MAX_RECORD_LIMIT as usize && n - p >= FRAME_OVERHEAD + len {
            let crc = le_u32(bytes, p + 4);
            if le_u32(bytes, p + 8 + len) == frame_trailer(salt, crc) {
                if len > budget {
                    return FollowUp::Undecided;
                }
                budget -= len;
                if frame_crc(salt, &bytes[p..p + 4], &bytes[p + 8..p + 8 + len]) == crc {
                    return FollowUp::Record(p);
                }
            }
        }
        p += 1;
    }
    FollowUp::Nothing
}

/// Options for [`scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanOptions {
    /// Largest payload accepted. A complete, valid record larger than this is
    /// reported as [`SegmentError::RecordTooLarge`] rather than dropped, so it
    /// must be at least the writer's limit. Values above [`MAX_RECORD_LIMIT`]
    /// act as that limit.
    pub max_record: u32,
    /// The segment is supposed to be sealed: a torn tail or a missing footer is
    /// corruption instead of a crash to recover from.
    pub expect_sealed: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            max_record: DEFAULT_MAX_RECORD,
            expect_sealed: false,
        }
    }
}

/// Location of one batch (record) found by [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchLoc {
    /// File offset of the record frame.
    pub offset: u64,
    /// File byte range of the payload (batch header plus codec bytes).
    pub payload: Range<u64>,
    /// Sequence number of the batch's first event.
    pub first_seq: u64,
    /// Number of events in the batch (at least 1).
    pub count: u32,
}

impl BatchLoc {
    /// File byte range of the codec bytes (the payload after the batch
    /// header): what [`read_range`](super::read_range) should fetch from an active segment.
    pub fn codec_range(&self) -> Range<u64> {
        self.payload.start + BATCH_HEADER_LEN as u64..self.payload.end
    }

    /// Sequence number of the batch's last event.
    pub fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.count) - 1
    }

    /// File offset just past this record's frame.
    pub fn end(&self) -> u64 {
        self.payload.end + 4
    }
}

/// How the record stream of a scanned segment ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// At end of file, at zero-filled space, or at a valid footer.
    Clean,
    /// At an incomplete write: the bytes from `offset` on are garbage that
    /// [`SegmentWriter::discard_tail`](super::SegmentWriter::discard_tail) should zero before appending again.
    Torn {
        /// File offset where the incomplete write starts (the scan's `valid_end`).
        offset: u64,
        /// What was found there.
        reason: &'static str,
    },
}

/// Result of [`scan`]: the valid batches of a segment and how it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    /// Every valid batch, in file (and sequence) order.
    pub batches: Vec<BatchLoc>,
    /// File offset just past the last valid record: where the footer starts
    /// when sealed, where appending continues when active. It is 0 when the
    /// header itself is incomplete (a crash while creating the segment; see
    /// [`SegmentWriter::open_append`](super::SegmentWriter::open_append)).
    pub valid_end: u64,
    /// Whether the stream ends cleanly or at a torn write.
    pub tail: Tail,
    /// The footer, when the segment is sealed.
    pub footer: Option<Footer>,
}

impl Scan {
    /// True when the segment carries a valid footer.
    pub fn is_sealed(&self) -> bool {
        self.footer.is_some()
    }

    /// The exact file length of the sealed segment (`valid_end + 40`), or
    /// `None` if it is not sealed. A file longer than this had its seal
    /// interrupted; see [`SegmentWriter::complete_seal`](super::SegmentWriter::complete_seal).
    pub fn sealed_len(&self) -> Option<u64> {
        self.footer.map(|_| self.valid_end + FOOTER_LEN as u64)
    }
}

/// Scans a whole segment file (`bytes`, mapped or read) that should have the
/// identity `expected`, validating every record.
///
/// Returns the valid batches and how the log ends. A crash can only leave an
/// incomplete write at the end (reported as [`Tail::Torn`], or as
/// [`Tail::Clean`] when it left zeros), so anything else is
/// [`SegmentError::Corrupt`]: a bad header or identity, a break in the
/// sequence numbers, a completely written record whose checksum fails, or a
/// bad record followed by valid ones. With `opts.expect_sealed` a torn tail or
/// a missing footer is corrupt too.
///
/// Work is linear in the file size and nothing is allocated from length fields
/// read from the file.
pub fn scan(
    bytes: &[u8],
    expected: &SegmentIdent,
    opts: &ScanOptions,
) -> Result<Scan, SegmentError> {
    scan_inner(bytes, expected, opts, None)
}

/// Like [`scan`], but trusts the records before `offset` (where a record
/// ends and the batch starting at `next_seq` would begin): the walk starts
/// there, so reopening after a checkpoint costs the records written since,
/// not the whole segment. `offset` must come from a verified source (a
/// checkpoint whose last record was checked). The returned `batches` hold
/// only the records from `offset` on. If a footer is met, the segment is
/// rescanned whole, since the footer's checksums cover every record.
pub fn scan_from(
    bytes: &[u8],
    expected: &SegmentIdent,
    opts: &ScanOptions,
    offset: u64,
    next_seq: u64,
) -> Result<Scan, SegmentError> {
    let at = usize::try_from(offset).unwrap_or(usize::MAX);
    if at < HEADER_LEN || at > bytes.len() {
        return Err(invalid(format!(
            "resume offset {offset} is outside the segment's records (file is {} bytes)",
            bytes.len()
        )));
    }
    scan_inner(bytes, expected, opts, Some((at, next_seq)))
}

/// Checks the single record at `offset`: a complete frame with this
/// segment's salt, a valid checksum and trailer, and a batch header. Used to
/// confirm that a checkpoint's last covered record is really in the file.
pub fn record_at(bytes: &[u8], expected: &SegmentIdent, offset: u64) -> Option<BatchLoc> {
    let at = usize::try_from(offset).ok()?;
    if at < HEADER_LEN || at >= bytes.len() {
        return None;
    }
    let FrameCheck::Valid { payload } = check_frame(bytes, at, expected.salt()) else {
        return None;
    };
    if payload.len() < BATCH_HEADER_LEN {
        return None;
    }
    let first_seq = le_u64(bytes, payload.start);
    let count = le_u32(bytes, payload.start + 8);
    (count > 0).then_some(BatchLoc {
        offset,
        payload: payload.start as u64..payload.end as u64,
        first_seq,
        count,
    })
}

fn scan_inner(
    bytes: &[u8],
    expected: &SegmentIdent,
    opts: &ScanOptions,
    resume: Option<(usize, u64)>,
) -> Result<Scan, SegmentError> {
    if is_torn_header(bytes, expected) {
        if opts.expect_sealed {
            return Err(corrupt(
                0,
                "sealed segment must end with a valid footer (its header is incomplete)",
            ));
        }
        return Ok(Scan {
            batches: Vec::new(),
            valid_end: 0,
            tail: Tail::Torn {
                offset: 0,
                reason: "incomplete segment header (crash while the segment was created)",
            },
            footer: None,
        });
    }
    let ident = read_header(bytes)?;
    if ident != *expected {
        return Err(corrupt(
            12,
            format!(
                "segment identity does not match (found first_seq {}, expected {}; store or \
                 session ids may differ too): the file is misplaced or was renamed",
                ident.first_seq, expected.first_seq
            ),
        ));
    }

    let salt = expected.salt();
    let max_record = opts.max_record.min(MAX_RECORD_LIMIT);
    let n = bytes.len();
    let mut batches = Vec::new();
    let (mut at, mut next_seq) = resume.unwrap_or((HEADER_LEN, expected.first_seq));
    let mut event_count: u64 = 0;

    // Walk the valid records. The loop ends at a footer (returns), or at the
    // first offset that is not a valid record: `stop` says why (None for
    // zero-filled space or end of file).
    let stop: Option<&'static str> = loop {
        if at == n {
            break None;
        }
        if n - at >= 8 && bytes[at..at + 8] == FOOTER_MAGIC {
            match decode_footer(bytes, at) {
                FooterCheck::Valid(_) if resume.is_some() => {
                    return scan_inner(bytes, expected, opts, None);
                }
                FooterCheck::Valid(footer) => {
                    check_footer_matches(bytes, at, &footer, &batches, event_count, next_seq)?;
                    if let Some(z) = next_nonzero(bytes, at + FOOTER_LEN) {
                        return Err(corrupt(z, "nonzero bytes after the segment footer"));
                    }
                    return Ok(Scan {
                        batches,
                        valid_end: at as u64,
                        tail: Tail::Clean,
                        footer: Some(footer),
                    });
                }
                FooterCheck::Torn(reason) => break Some(reason),
                FooterCheck::Corrupt(reason) => return Err(corrupt(at, reason)),
            }
        }
        match check_frame(bytes, at, salt) {
            FrameCheck::Valid { payload } => {
                let loc = check_batch(bytes, at, payload, next_seq, max_record)?;
                next_seq = loc.first_seq + u64::from(loc.count);
                event_count += u64::from(loc.count);
                at = loc.end() as usize;
                batches.push(loc);
            }
            FrameCheck::End => break None,
            FrameCheck::Torn(reason) => break Some(reason),
            FrameCheck::Corrupt(reason) => return Err(corrupt(at, reason)),
        }
    };

    // A crash only damages the end of the log, so whatever stopped the walk
    // must not be followed by anything valid.
    match find_valid_after(bytes, at + 1, salt) {
        FollowUp::Nothing => {}
        FollowUp::Record(p) => {
            return Err(corrupt(
                at,
                format!(
                    "bad record followed by valid records (next valid record at offset {p}): \
                     data in the middle of the segment was damaged or lost"
                ),
            ));
        }
        FollowUp::Footer(p) => {
            return Err(corrupt(
                at,
                format!(
                    "bad record followed by valid records (a footer at offset {p}): \
                     data in the middle of the segment was damaged or lost"
                ),
            ));
        }
        FollowUp::Undecided => {
            return Err(corrupt(
                at,
                "bad record followed by data that could not be ruled out as valid records",
            ));
        }
    }

    if opts.expect_sealed {
        let detail = stop.unwrap_or("the records end without one");
        return Err(corrupt(
            at,
            format!("sealed segment must end with a valid footer ({detail})"),
        ));
    }
    let tail = match stop {
        None => Tail::Clean,
        Some(reason) => Tail::Torn {
            offset: at as u64,
            reason,
        },
    };
    Ok(Scan {
        batches,
        valid_end: at as u64,
        tail,
        footer: None,
    })
}

/// Decodes the batch header of a checksum-valid record and checks it. The
/// record was completely written, so any problem here is corruption (or a
/// writer bug), never a torn write.
fn check_batch(
    bytes: &[u8],
    at: usize,
    payload: Range<usize>,
    next_seq: u64,
    max_record: u32,
) -> Result<BatchLoc, SegmentError> {
    let len = payload.len();
    if len < BATCH_HEADER_LEN {
        return Err(corrupt(
            at,
            format!(
                "record of {len} bytes is too short for its {BATCH_HEADER_LEN}-byte batch header"
            ),
        ));
    }
    if len > max_record as usize {
        return Err(SegmentError::RecordTooLarge {
            size: len as u64,
            max: max_record,
        });
    }
    let first_seq = le_u64(bytes, payload.start);
    let count = le_u32(bytes, payload.start + 8);
    if count == 0 {
        return Err(corrupt(at, "batch with zero events"));
    }
    if first_seq != next_seq {
        return Err(corrupt(
            at,
            format!("sequence discontinuity: batch starts at seq {first_seq}, expected {next_seq}"),
        ));
    }
    if first_seq.checked_add(u64::from(count)).is_none() {
        return Err(corrupt(at, "batch sequence numbers overflow u64"));
    }
    Ok(BatchLoc {
        offset: at as u64,
        payload: payload.start as u64..payload.end as u64,
        first_seq,
        count,
    })
}

/// Checks that a checksum-valid footer at `at` describes the records before it.
fn check_footer_matches(
    bytes: &[u8],
    at: usize,
    footer: &Footer,
    batches: &[BatchLoc],
    event_count: u64,
    next_seq: u64,
) -> Result<(), SegmentError> {
    let mismatch = if footer.event_count != event_count {
        Some(format!(
            "footer says {} events, the records hold {event_count}",
            footer.event_count
        ))
    } else if footer.record_count as usize != batches.len() {
        Some(format!(
            "footer says {} records, the segment holds {}",
            footer.record_count,
            batches.len()
        ))
    } else if footer.last_seq != next_seq.wrapping_sub(1) {
        Some(format!(
            "footer says last_seq {}, the records end at {}",
            footer.last_seq,
            next_seq.wrapping_sub(1)
        ))
    } else if footer.records_crc != crc32fast::hash(&bytes[HEADER_LEN..at]) {
        Some("footer records checksum does not match the records".to_string())
    } else {
        None
    };
    match mismatch {
        Some(reason) => Err(corrupt(at, reason)),
        None => Ok(()),
    }
}
