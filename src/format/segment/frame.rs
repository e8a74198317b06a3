//! The record frame: `len | crc | payload | trailer`, with the CRC seeded by
//! the segment's salt and the trailer bound to it, and the zero-filled space
//! that reads as the end of the log.

use super::{BATCH_HEADER_LEN, FRAME_OVERHEAD, MAX_RECORD_LIMIT, SegmentError, invalid};

/// Record checksum: CRC-32 seeded with the segment salt over the 4 length
/// bytes, then the payload.
pub(super) fn frame_crc(salt: u32, len_bytes: &[u8], payload: &[u8]) -> u32 {
    let mut h = frame_hasher(salt, len_bytes);
    h.update(payload);
    h.finalize()
}

/// The record checksum after the length bytes, for a payload that is read
/// in pieces: feed it the payload, then `finalize` gives [`frame_crc`].
pub(super) fn frame_hasher(salt: u32, len_bytes: &[u8]) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new_with_initial(salt);
    h.update(len_bytes);
    h
}

/// The trailer stored after a payload: the record checksum XORed with the
/// salt. Binding the trailer to the segment (rather than repeating the bare
/// checksum) means a complete record copied from another segment has a
/// mismatching trailer and reads as garbage, not as a corrupted record of this
/// segment. It also means zero-filled space never has an intact trailer unless
/// the salt itself is zero.
pub(super) fn frame_trailer(salt: u32, crc: u32) -> u32 {
    crc ^ salt
}

/// The CRC field of the record frame at `offset` of segment bytes `map`
/// (the frame must be there: the caller found it by a scan or an index).
/// A checkpoint's coverage keeps it to prove the log at that offset is the
/// log it was taken from.
pub fn frame_crc_field(map: &[u8], offset: u64) -> u32 {
    crate::format::bytes::le_u32(map, offset as usize + 4)
}

/// Encodes one record frame for a segment with salt `salt` into `out`
/// (cleared first): `len | crc | first_seq | count | codec_bytes | trailer`.
///
/// [`SegmentWriter::append`](super::SegmentWriter::append) uses this; it is public so that tools and tests
/// can build frames byte-exactly. Fails with
/// [`SegmentError::InvalidArgument`] for `count == 0` and
/// [`SegmentError::RecordTooLarge`] above [`MAX_RECORD_LIMIT`].
pub fn encode_frame(
    salt: u32,
    first_seq: u64,
    count: u32,
    codec_bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SegmentError> {
    if count == 0 {
        return Err(invalid(
            "a batch must hold at least one event (count was 0)",
        ));
    }
    let payload_len = BATCH_HEADER_LEN as u64 + codec_bytes.len() as u64;
    if payload_len > u64::from(MAX_RECORD_LIMIT) {
        return Err(SegmentError::RecordTooLarge {
            size: payload_len,
            max: MAX_RECORD_LIMIT,
        });
    }
    let len = payload_len as u32;
    out.clear();
    out.reserve(FRAME_OVERHEAD + payload_len as usize);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled in below
    out.extend_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(codec_bytes);
    let crc = frame_crc(salt, &out[0..4], &out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&frame_trailer(salt, crc).to_le_bytes());
    Ok(())
}

pub(super) fn is_all_zero(b: &[u8]) -> bool {
    next_nonzero(b, 0).is_none()
}

/// Index of the first nonzero byte at or after `from`. Works a 64-byte block
/// at a time (the OR-fold vectorises) because a scan may have to cross many
/// megabytes of preallocated zeros.
pub(super) fn next_nonzero(bytes: &[u8], from: usize) -> Option<usize> {
    let tail = bytes.get(from..)?;
    // Whole 64-byte blocks as eight u64 words OR-ed together (the loop the
    // compiler vectorises); preallocated space is megabytes of zeros.
    let mut blocks = tail.chunks_exact(64);
    let mut base = from;
    for block in &mut blocks {
        let mut acc = 0u64;
        for word in block.chunks_exact(8) {
            acc |= u64::from_ne_bytes(word.try_into().expect("8 bytes"));
        }
        if acc != 0 {
            return block.iter().position(|&b| b != 0).map(|i| base + i);
        }
        base += 64;
    }
    blocks
        .remainder()
        .iter()
        .position(|&b| b != 0)
        .map(|i| base + i)
}
