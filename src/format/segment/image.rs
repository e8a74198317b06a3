//! The compressed image of a sealed segment (`<first seq>.segz`): the
//! segment's exact bytes, Zstandard-compressed as a whole, behind a 32-byte
//! header. Decoded, it is the sealed segment byte for byte, so every offset
//! a checkpoint or another process's index holds stays valid: the image is
//! a way of storing a sealed segment, not another layout of its records.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "SLOGSGZ\0"
//!      8     2  image format version u16 = 1
//!     10     2  reserved, 0
//!     12     8  length of the decoded segment u64
//!     20     4  CRC-32 of the compressed bytes (offset 32 to the end)
//!     24     4  reserved, 0
//!     28     4  CRC-32 of bytes 0..28
//!     32     -  one Zstandard frame (content size recorded) of the segment
//! ```

use super::footer::verify_footer;
use super::header::{SegmentIdent, read_header};
use super::{FOOTER_LEN, Footer, HEADER_LEN, SegmentError, corrupt};
use crate::format::bytes::{le_u32, le_u64};

/// Magic bytes at offset 0 of a compressed segment image.
pub const IMAGE_MAGIC: [u8; 8] = *b"SLOGSGZ\0";

/// The image format version this build writes and reads.
pub const IMAGE_VERSION: u16 = 1;

/// Size of the image header; the Zstandard frame starts here.
pub const IMAGE_HEADER_LEN: usize = 32;

/// Zstandard level of images: sealing is off the acknowledgement path, so
/// it pays a slower level than the per-batch packs' 1 for a smaller file.
const IMAGE_LEVEL: i32 = 3;

/// The largest decoded segment an image may claim: a segment holds at most
/// its size limit plus one record (each under 1 GiB), so a claim above this
/// is damage, and decoding never allocates more.
const MAX_IMAGE_LEN: u64 = 8 << 30;

/// Output reserved ahead of a decode, at most: this plus
/// [`RESERVE_RATIO`] times the compressed bytes. A sealed segment compresses
/// far less than 64:1 (BENCHMARKS.md: 3-8:1), so real images take the fast
/// path of one exact allocation; a header claiming more than its frame
/// plausibly holds (checksummed, so crafted, not rot) is decoded into a
/// buffer that grows with the output actually produced.
const RESERVE_BASE: u64 = 8 << 20;

/// See [`RESERVE_BASE`].
const RESERVE_RATIO: u64 = 64;

/// File name of the compressed image of the segment starting at
/// `first_seq`: the segment's name with the suffix `.segz`.
pub fn image_file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.segz")
}

/// Inverse of [`image_file_name`]: `Some(first_seq)` for exactly 20 ASCII
/// digits followed by `.segz`.
pub fn parse_image_file_name(name: &str) -> Option<u64> {
    super::parse_segment_file_name(name.strip_suffix('z')?)
}

/// Checks that `bytes` is a whole sealed segment of `ident`: its header
/// names `ident`, its footer is valid and its records match the footer's
/// checksum. What a sealed segment read from anywhere but its own
/// directory (an image, the archive) must pass before it is used.
pub fn check_sealed(bytes: &[u8], ident: &SegmentIdent) -> Result<Footer, SegmentError> {
    if read_header(bytes)? != *ident {
        return Err(corrupt(
            0,
            format!(
                "the segment's header names another segment than the one expected \
                 (first seq {})",
                ident.first_seq
            ),
        ));
    }
    let footer = verify_footer(bytes)?;
    let records = &bytes[HEADER_LEN..bytes.len() - FOOTER_LEN];
    if crc32fast::hash(records) != footer.records_crc {
        return Err(corrupt(
            HEADER_LEN,
            "the records do not match the footer's checksum",
        ));
    }
    Ok(footer)
}

/// The compressed image of sealed segment `raw` (which the caller checked
/// with [`check_sealed`]).
pub fn encode_image(raw: &[u8]) -> Result<Vec<u8>, SegmentError> {
    let mut out = vec![0u8; IMAGE_HEADER_LEN];
    let frame = zstd::bulk::compress(raw, IMAGE_LEVEL)?;
    out.extend_from_slice(&frame);
    out[0..8].copy_from_slice(&IMAGE_MAGIC);
    out[8..10].copy_from_slice(&IMAGE_VERSION.to_le_bytes());
    out[12..20].copy_from_slice(&(raw.len() as u64).to_le_bytes());
    let data_crc = crc32fast::hash(&out[IMAGE_HEADER_LEN..]);
    out[20..24].copy_from_slice(&data_crc.to_le_bytes());
    let crc = crc32fast::hash(&out[0..28]);
    out[28..32].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// The length of the segment image `bytes` decodes to, from its header
/// (checked: magic, version, checksum, bound), without decoding it.
pub fn image_len(bytes: &[u8]) -> Result<u64, SegmentError> {
    if bytes.len() < IMAGE_HEADER_LEN || bytes[0..8] != IMAGE_MAGIC {
        return Err(corrupt(
            0,
            "not a compressed segment image (bad magic or shorter than its header)",
        ));
    }
    if le_u32(bytes, 28) != crc32fast::hash(&bytes[0..28]) {
        return Err(corrupt(0, "the image header's checksum does not match"));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != IMAGE_VERSION {
        return Err(SegmentError::UnsupportedVersion {
            found: version,
            supported: IMAGE_VERSION,
        });
    }
    if bytes[10..12] != [0, 0] || le_u32(bytes, 24) != 0 {
        return Err(corrupt(10, "nonzero reserved field in the image header"));
    }
    let len = le_u64(bytes, 12);
    if len < (HEADER_LEN + FOOTER_LEN) as u64 || len > MAX_IMAGE_LEN {
        return Err(corrupt(
            12,
            format!("the image claims an impossible segment length {len}"),
        ));
    }
    Ok(len)
}

/// Decodes the image `bytes` of the sealed segment `ident` and checks the
/// result whole ([`check_sealed`]). Offsets in errors are of the image
/// file up to the decode, then of the decoded segment (the reason says
/// which).
pub fn decode_image(bytes: &[u8], ident: &SegmentIdent) -> Result<Vec<u8>, SegmentError> {
    let raw = decode_unchecked(bytes)?;
    check_decoded(&raw, ident)?;
    Ok(raw)
}

/// Decodes the image `bytes` of a sealed segment whose identity the
/// caller does not know, and checks the result whole against the identity
/// its own header states: its footer and its records' checksum. For a
/// copy of the segment made elsewhere (the archive's upload), which checks
/// the bytes' integrity, not whose they are.
#[cfg(any(test, feature = "archive"))]
pub fn decode_image_any(bytes: &[u8]) -> Result<Vec<u8>, SegmentError> {
    let raw = decode_unchecked(bytes)?;
    let ident = read_header(&raw).map_err(in_decoded)?;
    check_decoded(&raw, &ident)?;
    Ok(raw)
}

/// The bytes the image decodes to, checked against the image header (its
/// checksum and length) but not yet as a segment.
fn decode_unchecked(bytes: &[u8]) -> Result<Vec<u8>, SegmentError> {
    let len = image_len(bytes)?;
    let data = &bytes[IMAGE_HEADER_LEN..];
    if le_u32(bytes, 20) != crc32fast::hash(data) {
        return Err(corrupt(
            IMAGE_HEADER_LEN,
            "the compressed bytes do not match the image header's checksum",
        ));
    }
    let undecodable = |e: std::io::Error| {
        corrupt(
            IMAGE_HEADER_LEN,
            format!("the compressed bytes do not decode: {e}"),
        )
    };
    let raw = if len <= RESERVE_BASE + RESERVE_RATIO * data.len() as u64 {
        // Allocates exactly `len` and fails on more output.
        zstd::bulk::decompress(data, len as usize).map_err(undecodable)?
    } else {
        // Memory follows the output: at most `len + 1` bytes are read, so
        // more output than claimed is seen without being kept.
        use std::io::Read;
        let mut raw = Vec::with_capacity((RESERVE_BASE + RESERVE_RATIO * data.len() as u64) as usize);
        zstd::stream::read::Decoder::with_buffer(data)
            .map_err(undecodable)?
            .take(len + 1)
            .read_to_end(&mut raw)
            .map_err(undecodable)?;
        raw
    };
    if raw.len() as u64 != len {
        return Err(corrupt(
            IMAGE_HEADER_LEN,
            format!(
                "the image decodes to {} bytes, its header says {len}",
                raw.len()
            ),
        ));
    }
    Ok(raw)
}

/// [`check_sealed`] of a decoded image, its errors saying so.
fn check_decoded(raw: &[u8], ident: &SegmentIdent) -> Result<(), SegmentError> {
    check_sealed(raw, ident).map(drop).map_err(in_decoded)
}

fn in_decoded(e: SegmentError) -> SegmentError {
    match e {
        SegmentError::Corrupt { offset, reason } => SegmentError::Corrupt {
            offset,
            reason: format!("in the decoded segment: {reason}"),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{SegmentWriter, map_sealed};

    fn sealed(dir: &std::path::Path) -> (Vec<u8>, SegmentIdent) {
        let ident = SegmentIdent {
            store_id: [1; 16],
            session_uid: [2; 16],
            first_seq: 10,
        };
        let path = dir.join(crate::segment::segment_file_name(10));
        let mut w = SegmentWriter::create(&path, &ident, 0).unwrap();
        for i in 0..20u64 {
            w.append(10 + i, 1, format!("event {i} {}", "x".repeat(100)).as_bytes())
                .unwrap();
        }
        w.seal_auto().unwrap();
        (map_sealed(&path).unwrap().to_vec(), ident)
    }

    #[test]
    fn an_image_decodes_to_the_exact_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, ident) = sealed(dir.path());
        let img = encode_image(&raw).unwrap();
        assert!(img.len() < raw.len() / 2, "{} of {}", img.len(), raw.len());
        assert_eq!(image_len(&img).unwrap(), raw.len() as u64);
        assert_eq!(decode_image(&img, &ident).unwrap(), raw);
    }

    #[test]
    fn an_image_decodes_without_its_identity_but_not_when_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, _) = sealed(dir.path());
        let img = encode_image(&raw).unwrap();
        assert_eq!(decode_image_any(&img).unwrap(), raw);
        // A segment whose records no longer match its footer, imaged as it
        // is: its header still names it, so only the whole check refuses it.
        let mut bad = raw.clone();
        bad[crate::segment::HEADER_LEN + 20] ^= 1;
        let e = decode_image_any(&encode_image(&bad).unwrap()).unwrap_err();
        assert!(e.to_string().contains("in the decoded segment"), "{e}");
    }

    #[test]
    fn every_changed_byte_of_an_image_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, ident) = sealed(dir.path());
        let img = encode_image(&raw).unwrap();
        for at in 0..img.len() {
            let mut bad = img.clone();
            bad[at] ^= 0x40;
            let e = decode_image(&bad, &ident).expect_err("a changed byte must be caught");
            assert!(
                matches!(
                    e,
                    SegmentError::Corrupt { .. } | SegmentError::UnsupportedVersion { .. }
                ),
                "byte {at}: {e:?}"
            );
        }
        for cut in [0, 8, IMAGE_HEADER_LEN, img.len() - 1] {
            assert!(decode_image(&img[..cut], &ident).is_err(), "cut at {cut}");
        }
    }

    /// `img` claiming `len` decoded bytes, its header checksum made valid
    /// (what only a crafted file, not damage, looks like).
    fn claiming(img: &[u8], len: u64) -> Vec<u8> {
        let mut out = img.to_vec();
        out[12..20].copy_from_slice(&len.to_le_bytes());
        let crc = crc32fast::hash(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn a_claimed_length_other_than_the_frame_s_is_refused_on_either_path() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, ident) = sealed(dir.path());
        let img = encode_image(&raw).unwrap();
        let n = raw.len() as u64;
        // Near the real length: the exact allocation; the largest claim
        // allowed: the buffer that grows with the output.
        for claim in [n - 1, n + 1, MAX_IMAGE_LEN] {
            let e = decode_image(&claiming(&img, claim), &ident).unwrap_err();
            assert!(
                e.to_string().contains(&format!("its header says {claim}"))
                    || e.to_string().contains("do not decode"),
                "claim {claim}: {e}"
            );
        }
    }

    #[test]
    fn an_image_far_smaller_than_its_segment_decodes_through_the_growing_buffer() {
        // 24 MiB of one repeated record compress far beyond 64:1, so the
        // decode does not trust the claimed length ahead of the output.
        let dir = tempfile::tempdir().unwrap();
        let ident = SegmentIdent {
            store_id: [1; 16],
            session_uid: [2; 16],
            first_seq: 0,
        };
        let path = dir.path().join(crate::segment::segment_file_name(0));
        let mut w = SegmentWriter::create(&path, &ident, 0).unwrap();
        let record = vec![b'a'; 1 << 20];
        for i in 0..24u64 {
            w.append(i, 1, &record).unwrap();
        }
        w.seal_auto().unwrap();
        let raw = map_sealed(&path).unwrap().to_vec();
        let img = encode_image(&raw).unwrap();
        let bound = RESERVE_BASE + RESERVE_RATIO * (img.len() - IMAGE_HEADER_LEN) as u64;
        assert!(raw.len() as u64 > bound, "{} vs {bound}", raw.len());
        assert_eq!(decode_image(&img, &ident).unwrap(), raw);
    }

    #[test]
    fn an_image_of_another_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (raw, ident) = sealed(dir.path());
        let img = encode_image(&raw).unwrap();
        let other = SegmentIdent {
            session_uid: [3; 16],
            ..ident
        };
        let e = decode_image(&img, &other).unwrap_err();
        assert!(e.to_string().contains("another segment"), "{e}");
    }

    #[test]
    fn image_names_round_trip_and_are_not_segment_names() {
        assert_eq!(image_file_name(65536), "00000000000000065536.segz");
        assert_eq!(parse_image_file_name(&image_file_name(7)), Some(7));
        assert_eq!(parse_image_file_name("00000000000000000007.seg"), None);
        assert_eq!(
            crate::segment::parse_segment_file_name(&image_file_name(7)),
            None
        );
    }
}
