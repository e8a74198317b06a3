//! The footer of a sealed segment: its counts and the checksum of all its
//! records, checked in O(1) when a sealed segment is opened.

use super::frame::is_all_zero;
use super::header::read_header;
use super::{FOOTER_LEN, FOOTER_MAGIC, HEADER_LEN, MIN_FRAME_LEN, SegmentError, corrupt};
use crate::format::bytes::{le_u32, le_u64};

/// Summary stored at the end of a sealed segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// Number of events in the segment (sum of the batch counts).
    pub event_count: u64,
    /// Sequence number of the last event (`first_seq - 1`, wrapping, when the
    /// segment holds no events).
    pub last_seq: u64,
    /// CRC-32 of all record bytes, from offset 64 to the footer.
    pub records_crc: u32,
    /// Number of records (batches) in the segment.
    pub record_count: u32,
}

impl Footer {
    pub(super) fn encode(&self) -> [u8; FOOTER_LEN] {
        let mut f = [0u8; FOOTER_LEN];
        f[0..8].copy_from_slice(&FOOTER_MAGIC);
        f[8..16].copy_from_slice(&self.event_count.to_le_bytes());
        f[16..24].copy_from_slice(&self.last_seq.to_le_bytes());
        f[24..28].copy_from_slice(&self.records_crc.to_le_bytes());
        f[28..32].copy_from_slice(&self.record_count.to_le_bytes());
        // 32..36 reserved, zero.
        let crc = crc32fast::hash(&f[0..36]);
        f[36..40].copy_from_slice(&crc.to_le_bytes());
        f
    }
}

/// Outcome of checking the bytes at one offset as a footer.
pub(super) enum FooterCheck {
    Valid(Footer),
    Torn(&'static str),
    Corrupt(String),
}

/// Checks the magic, checksum and reserved field of the footer at `at`
/// (consistency with the records is checked by the caller).
pub(super) fn decode_footer(bytes: &[u8], at: usize) -> FooterCheck {
    if bytes.len() - at < FOOTER_LEN || bytes[at..at + 8] != FOOTER_MAGIC {
        return FooterCheck::Torn("incomplete footer at end of file");
    }
    let f = &bytes[at..at + FOOTER_LEN];
    if le_u32(f, 36) != crc32fast::hash(&f[0..36]) {
        // A 40-byte write can straddle a sector boundary, so a bad footer
        // checksum is treated like any other incomplete write.
        return FooterCheck::Torn("footer checksum mismatch (incomplete footer write)");
    }
    if le_u32(f, 32) != 0 {
        return FooterCheck::Corrupt("nonzero reserved field in the footer".into());
    }
    FooterCheck::Valid(Footer {
        event_count: le_u64(f, 8),
        last_seq: le_u64(f, 16),
        records_crc: le_u32(f, 24),
        record_count: le_u32(f, 28),
    })
}

/// Reads and checks the footer at the end of a sealed segment in O(1), without
/// reading the records. Used when opening sealed segments; [`scan`](super::scan()) with
/// `expect_sealed` verifies everything.
///
/// Checks the header (magic, version, checksum; not the identity: compare
/// [`read_header`] with the expected [`SegmentIdent`](super::SegmentIdent) for that), the footer
/// magic and checksum, and that the counts agree with the header and the
/// record area size.
///
/// A segment whose seal was interrupted (footer written, file not yet cut to
/// length) has zeros at its end and fails here; [`scan`](super::scan()) recognises it and
/// [`SegmentWriter::complete_seal`](super::SegmentWriter::complete_seal) finishes it.
pub fn verify_footer(bytes: &[u8]) -> Result<Footer, SegmentError> {
    let ident = read_header(bytes)?;
    let n = bytes.len();
    if n < HEADER_LEN + FOOTER_LEN {
        return Err(corrupt(
            n,
            "file ends before a footer: the segment is not sealed",
        ));
    }
    let at = n - FOOTER_LEN;
    if bytes[at..at + 8] != FOOTER_MAGIC {
        let reason = if is_all_zero(&bytes[at..]) {
            "no footer at the end of the file (the bytes there are zero): the segment is \
             still active or its seal was interrupted; scan it, and complete_seal it if \
             the scan finds a footer"
        } else {
            "no footer magic at the end of the file"
        };
        return Err(corrupt(at, reason));
    }
    let footer = match decode_footer(bytes, at) {
        FooterCheck::Valid(f) => f,
        FooterCheck::Torn(reason) => return Err(corrupt(at, reason)),
        FooterCheck::Corrupt(reason) => return Err(corrupt(at, reason)),
    };
    let records_len = (at - HEADER_LEN) as u64;
    let expected_last = ident
        .first_seq
        .wrapping_add(footer.event_count)
        .wrapping_sub(1);
    let consistent = footer.last_seq == expected_last
        && u64::from(footer.record_count) <= footer.event_count
        && (footer.record_count == 0) == (records_len == 0)
        && u64::from(footer.record_count) * MIN_FRAME_LEN as u64 <= records_len;
    if !consistent {
        return Err(corrupt(
            at,
            format!(
                "footer counts are inconsistent: {} events in {} records over {} bytes, \
                 last_seq {} for a segment starting at seq {}",
                footer.event_count,
                footer.record_count,
                records_len,
                footer.last_seq,
                ident.first_seq
            ),
        ));
    }
    Ok(footer)
}
