//! Segment files: the on-disk layer of the append-only session log.
//!
//! A session's log is a sequence of segment files, each named after the first
//! sequence number it holds ([`segment_file_name`]). This module writes, scans
//! and verifies one segment at a time. It knows nothing about events or JSON: a
//! record payload is a small batch header followed by opaque codec bytes.
//!
//! # File layout (all integers little-endian)
//!
//! ```text
//! header   64 bytes   magic "SLOGSEG\0", version u16, reserved u16,
//!                     store_id [u8;16], session_uid [u8;16], first_seq u64,
//!                     salt u32 = crc32(bytes 12..52), header_crc u32 = crc32(bytes 0..56),
//!                     4 zero bytes
//! records  repeated   len u32 | crc u32 | payload (len bytes) | trailer u32
//!                     crc = crc32 seeded with salt over len bytes + payload
//!                     trailer = crc ^ salt
//!                     payload = first_seq u64 | count u32 | codec bytes
//! footer   40 bytes   (sealed segments only) magic "SLOGEND\0", event_count u64,
//!                     last_seq u64, records_crc u32, record_count u32,
//!                     reserved u32, footer_crc u32
//! ```
//!
//! One record is one append batch, written with a single positional write, so a
//! batch is atomic by construction: after a crash it is either entirely readable
//! or it is the torn tail of the log.
//!
//! A record's `crc` is a CRC-32 seeded with the segment's salt, so a record
//! copied from another segment (a reused or misplaced file) never validates
//! here. The trailer repeats the checksum (XORed with the salt, see
//! `frame_trailer`) so that the scanner can tell a torn write (the trailer
//! never reached the disk) from corruption (the trailer is intact, so the
//! whole write reached the disk, but the bytes changed later).
//!
//! Active segments are preallocated: the file length is the capacity and
//! appends overwrite zeros inside the file, because changing the file size on
//! every append roughly doubles the cost of each `fdatasync`. Zero-filled
//! space reads as "end of log" (`len == 0 && crc == 0`).
//!
//! Positional I/O (`pread`/`pwrite`) is used throughout, so the module is
//! Unix-only.
//!
//! # Where things are
//!
//! One concern per file: `header` (the 64-byte header and the segment's
//! identity), `frame` (the record frame: length, salted CRC, trailer),
//! `scanner` (the one place that tells a torn write from corruption: checking a
//! frame, the search for valid data after a bad one, the whole-file scan),
//! `footer` (the summary of a sealed segment), `reader` (reading records of
//! sealed and active segments), `writer` (append, preallocation, seal,
//! trim, discarding a torn tail) and `image` (the compressed image a sealed
//! segment may be stored as). Everything public is re-exported here.

use std::io;

mod footer;
mod frame;
mod header;
mod image;
mod reader;
mod scanner;
mod writer;

pub use footer::{Footer, verify_footer};
#[cfg(any(test, feature = "internals"))]
pub use frame::encode_frame;
pub use frame::frame_crc_field;
pub use header::{SegmentIdent, read_header};
#[cfg(any(test, feature = "archive"))]
pub use image::decode_image_any;
pub use image::{
    check_sealed, decode_image, encode_image, image_file_name, image_len, parse_image_file_name,
};
/// The image header's constants, for tools that build images (the fuzz
/// targets).
#[cfg(any(test, feature = "internals"))]
pub use image::{IMAGE_HEADER_LEN, IMAGE_MAGIC, IMAGE_VERSION};
pub use reader::{Committed, committed_end, map_sealed_with};
#[cfg(any(test, feature = "internals"))]
pub use reader::{map_sealed, read_batch_payload, read_range};
pub use scanner::{BatchLoc, Scan, ScanOptions, Tail, record_at, scan, scan_from};
pub use writer::SegmentWriter;
#[cfg(any(test, feature = "internals"))]
pub use writer::RecordLoc;

/// Magic bytes at offset 0 of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SLOGSEG\0";

/// Magic bytes that start the footer of a sealed segment.
pub const FOOTER_MAGIC: [u8; 8] = *b"SLOGEND\0";

/// The segment format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 2;

/// Size of the segment header in bytes; the first record starts here.
pub const HEADER_LEN: usize = 64;

/// Size of the footer of a sealed segment in bytes.
pub const FOOTER_LEN: usize = 40;

/// Bytes a record frame adds around its payload: `len`, `crc` and trailer.
pub const FRAME_OVERHEAD: usize = 12;

/// Size of the batch header at the start of every payload: `first_seq` u64 and
/// `count` u32.
pub const BATCH_HEADER_LEN: usize = 12;

/// Default upper bound on a record payload (batch header plus codec bytes).
pub const DEFAULT_MAX_RECORD: u32 = 64 << 20;

/// Hard upper bound on any record payload, whatever `max_record` is set to.
///
/// It keeps the footer magic unambiguous: read as a record length, the first
/// four footer bytes (`"SLOG"`, about 1.2e9) are always out of range, so a
/// footer can never be mistaken for a record frame or the reverse.
pub const MAX_RECORD_LIMIT: u32 = 1 << 30;

/// Capacity growth step of a writer continued with [`SegmentWriter::open_append`]
/// (a created writer grows by its `preallocate` argument instead), and the
/// store's default. 1 MiB: opening a session proves the zeroed space after
/// its last record holds no valid record, so every byte preallocated ahead is
/// scanned at each open (about 60 us per MiB here), and a small session
/// should not take 4 MiB of disk; the size change it saves an `fdatasync`
/// from is then paid once per MiB appended.
pub const DEFAULT_PREALLOCATE: u64 = 1 << 20;

const _: () = assert!(MAX_RECORD_LIMIT < u32::from_le_bytes([b'S', b'L', b'O', b'G']));

/// Smallest valid frame: overhead plus an empty batch (no codec bytes).
const MIN_FRAME_LEN: usize = FRAME_OVERHEAD + BATCH_HEADER_LEN;

/// Granularity at which [`SegmentWriter::discard_tail`] looks for zeroed space.
const ZERO_BLOCK: usize = 4096;

/// Buffer size for zero filling and sequential reads.
const IO_CHUNK: usize = 1 << 20;

/// The source of zero fills. A zeroed static lives in `.bss`: its pages are
/// the kernel's shared zero page until written (never), so a fill neither
/// allocates nor clears a buffer (a fresh `vec![0; IO_CHUNK]` per growth was
/// ~2% of an unsynced append at batch 4096: glibc serves it from the heap
/// and clears it).
static ZEROS: [u8; IO_CHUNK] = [0; IO_CHUNK];

/// The append buffer is shrunk back to this size after an unusually large
/// record, so one 64 MiB batch does not pin 64 MiB for the writer's lifetime.
const RETAINED_BUF: usize = 1 << 20;

/// Errors of the segment layer. The caller adds the session and file path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegmentError {
    /// The file does not hold what was written to it: a checksum or a
    /// structural invariant failed where a crash cannot explain it.
    #[error(
        "segment is corrupt at byte offset {offset}: {reason}; \
         the data changed after it was written, so it is not repaired automatically: \
         restore the segment from a backup or inspect it before moving it aside"
    )]
    Corrupt {
        /// File offset of the first byte that could not be trusted.
        offset: u64,
        /// What was found there.
        reason: String,
    },

    /// The segment was written in a format version this build cannot read.
    #[error(
        "segment format version {found} is not supported (this build reads version {supported}); \
         open the store with a sessionlog release that supports version {found}"
    )]
    UnsupportedVersion {
        /// The version stored in the header.
        found: u16,
        /// The version this build supports.
        supported: u16,
    },

    /// A record payload (batch header plus codec bytes) is over the limit.
    #[error(
        "record payload of {size} bytes exceeds the maximum of {max} bytes; \
         split the batch into smaller appends, or raise max_record (at most 1 GiB)"
    )]
    RecordTooLarge {
        /// Payload size in bytes.
        size: u64,
        /// The limit in force.
        max: u32,
    },

    /// The caller asked for something the segment's state does not allow
    /// (a sequence gap, an empty batch, appending to a sealed segment, ...).
    /// Nothing was written.
    #[error("invalid segment operation: {reason}")]
    InvalidArgument {
        /// What was wrong and what to do instead.
        reason: String,
    },

    /// An operating-system I/O error.
    #[error("segment I/O failed: {0}")]
    Io(#[from] io::Error),
}

fn corrupt(offset: usize, reason: impl Into<String>) -> SegmentError {
    SegmentError::Corrupt {
        offset: offset as u64,
        reason: reason.into(),
    }
}

fn invalid(reason: impl Into<String>) -> SegmentError {
    SegmentError::InvalidArgument {
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------
// File names
// ---------------------------------------------------------------------------

/// File name of the segment whose first sequence number is `first_seq`:
/// 20 zero-padded digits, so lexical order is numeric order.
pub fn segment_file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

/// Inverse of [`segment_file_name`]: `Some(first_seq)` for exactly 20 ASCII
/// digits followed by `.seg`, `None` for any other name (including values that
/// overflow `u64`).
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}
