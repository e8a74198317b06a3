//! The 64-byte segment header: the identity of a segment (store, session,
//! first seq), its salt, and how a header is checked, or recognised as torn.

use super::frame::is_all_zero;
use super::{FORMAT_VERSION, HEADER_LEN, SEGMENT_MAGIC, SegmentError, corrupt};
use crate::format::bytes::{le_u16, le_u32, le_u64};

/// Identity of a segment: which store and session it belongs to and where in
/// the session's sequence it starts. Stored in the header and checked on open,
/// so a misplaced or renamed file is detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentIdent {
    /// Identifier of the store the segment belongs to.
    pub store_id: [u8; 16],
    /// Identifier of the session the segment belongs to.
    pub session_uid: [u8; 16],
    /// Sequence number of the first event in the segment.
    pub first_seq: u64,
}

impl SegmentIdent {
    /// The identity fields exactly as laid out in header bytes 12..52.
    fn ident_bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0..16].copy_from_slice(&self.store_id);
        b[16..32].copy_from_slice(&self.session_uid);
        b[32..40].copy_from_slice(&self.first_seq.to_le_bytes());
        b
    }

    /// Checksum of the identity (crc32 of header bytes 12..52). It seeds every
    /// record checksum, so records only validate inside the segment they were
    /// written to.
    pub fn salt(&self) -> u32 {
        crc32fast::hash(&self.ident_bytes())
    }

    /// The complete 64-byte header of a segment with this identity.
    pub fn header_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&SEGMENT_MAGIC);
        h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        // 10..12 reserved, zero.
        h[12..52].copy_from_slice(&self.ident_bytes());
        h[52..56].copy_from_slice(&self.salt().to_le_bytes());
        let header_crc = crc32fast::hash(&h[0..56]);
        h[56..60].copy_from_slice(&header_crc.to_le_bytes());
        // 60..64 zero.
        h
    }
}

/// Decodes and checks the header at the start of `bytes` (the file, or at
/// least its first 64 bytes) and returns the identity it names.
///
/// The version is checked before the checksum so that a file from a newer
/// format, whose header may be laid out differently, reports
/// [`SegmentError::UnsupportedVersion`] rather than corruption.
pub fn read_header(bytes: &[u8]) -> Result<SegmentIdent, SegmentError> {
    if bytes.len() < HEADER_LEN {
        return Err(corrupt(
            0,
            format!(
                "file is {} bytes, shorter than the {HEADER_LEN}-byte segment header",
                bytes.len()
            ),
        ));
    }
    let h = &bytes[..HEADER_LEN];
    if h[0..8] != SEGMENT_MAGIC {
        return Err(corrupt(
            0,
            "bad magic: this is not a sessionlog segment file",
        ));
    }
    let version = le_u16(h, 8);
    if version != FORMAT_VERSION {
        return Err(SegmentError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if le_u32(h, 56) != crc32fast::hash(&h[0..56]) {
        return Err(corrupt(56, "segment header checksum mismatch"));
    }
    if le_u16(h, 10) != 0 {
        return Err(corrupt(10, "nonzero reserved field in the segment header"));
    }
    // Bytes 60..64 are outside the header checksum, so they are checked here.
    if h[60..64] != [0; 4] {
        return Err(corrupt(
            60,
            "nonzero padding after the segment header checksum",
        ));
    }
    let ident = SegmentIdent {
        store_id: h[12..28].try_into().expect("16-byte slice"),
        session_uid: h[28..44].try_into().expect("16-byte slice"),
        first_seq: le_u64(h, 44),
    };
    if le_u32(h, 52) != ident.salt() {
        return Err(corrupt(
            52,
            "header salt does not match its identity fields",
        ));
    }
    Ok(ident)
}

/// True when the header region holds an incomplete write of exactly
/// `expected`'s header (a prefix of it followed by zeros, or a short file) and
/// nothing follows: the process crashed while creating the segment, before any
/// record could have been written (the writer syncs the header before its
/// first append).
pub(super) fn is_torn_header(bytes: &[u8], expected: &SegmentIdent) -> bool {
    let want = expected.header_bytes();
    let head = &bytes[..bytes.len().min(HEADER_LEN)];
    if head == want {
        return false;
    }
    let matching = head
        .iter()
        .zip(want.iter())
        .take_while(|(a, b)| a == b)
        .count();
    is_all_zero(&head[matching..])
        && (bytes.len() <= HEADER_LEN || is_all_zero(&bytes[HEADER_LEN..]))
}
