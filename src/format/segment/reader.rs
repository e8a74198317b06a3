//! Reading records: the codec bytes of a scanned batch, positional reads of
//! an active segment (and how far its committed records reach, for a reader
//! without the writer lock), and maps of sealed segments.

use super::frame::{frame_hasher, frame_trailer};
#[cfg(any(test, feature = "internals"))]
use super::scanner::BatchLoc;
use super::{FOOTER_MAGIC, HEADER_LEN, MAX_RECORD_LIMIT, SegmentError, SegmentIdent};
use crate::format::bytes::le_u32;
use crate::vfs::{SegmentBytes, Vfs, VfsFile};
#[cfg(any(test, feature = "internals"))]
use std::fs::File;
use std::io;
#[cfg(any(test, feature = "internals"))]
use std::ops::Range;
#[cfg(any(test, feature = "internals"))]
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The codec bytes of a batch found by [`scan`](super::scan()) (the payload after its batch
/// header).
///
/// # Panics
///
/// If `loc` lies outside `bytes`: it must come from a scan of these bytes.
#[cfg(any(test, feature = "internals"))]
pub fn read_batch_payload<'a>(bytes: &'a [u8], loc: &BatchLoc) -> &'a [u8] {
    let r = loc.codec_range();
    &bytes[r.start as usize..r.end as usize]
}

/// Reads a byte range of an active segment with `pread`.
///
/// Active segments are read positionally rather than mapped because the
/// writer keeps changing them. `range` must come from a [`scan`](super::scan()) of the file:
/// the buffer is allocated at its length.
#[cfg(any(test, feature = "internals"))]
pub fn read_range(file: &File, range: Range<u64>) -> io::Result<Vec<u8>> {
    let len = range
        .end
        .checked_sub(range.start)
        .and_then(|l| usize::try_from(l).ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid read range {range:?}"),
            )
        })?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, range.start)?;
    Ok(buf)
}

/// How far the visible records of an active segment reach, as found by
/// [`committed_end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Valid records end at `end`; what follows is zeros, the end of the
    /// file, or a record not (yet, or ever) completely written.
    Records {
        /// Offset just past the last valid record.
        end: u64,
    },
    /// A footer starts at `end`: the segment was sealed there.
    Sealed {
        /// Offset of the footer.
        end: u64,
    },
}

/// Walks the records of an active segment from `from` (the end of a record
/// already known valid, or the header's end) with positional reads, and
/// says where the valid ones end.
///
/// This is how a reader that does not hold the session's writer lock finds
/// new records: the writer may seal the segment and cut the file at any
/// moment, and a mapped page past the new end of the file raises SIGBUS,
/// while a read just comes back short. Bytes below the returned end are
/// committed (checksums and trailers verified) and never change again, so
/// the caller may then read them through a map. The walk stops at the
/// first frame that is not valid without judging it: a write in progress
/// and a torn write look alike from outside, and only the writer (at
/// recovery, under the lock) tells them apart. Frames longer than
/// `max_record` end the walk too. Memory use is bounded by a 64 KiB buffer,
/// whatever the length fields say.
pub fn committed_end(
    file: &dyn VfsFile,
    expected: &SegmentIdent,
    from: u64,
    max_record: u32,
) -> io::Result<Committed> {
    let salt = expected.salt();
    let mut at = from.max(HEADER_LEN as u64);
    let mut head = [0u8; 8];
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        if read_up_to(file, &mut head, at)? < head.len() {
            return Ok(Committed::Records { end: at });
        }
        if head == FOOTER_MAGIC {
            return Ok(Committed::Sealed { end: at });
        }
        let len = le_u32(&head, 0);
        let crc = le_u32(&head, 4);
        if len == 0 || len > max_record.min(MAX_RECORD_LIMIT) {
            return Ok(Committed::Records { end: at });
        }
        let mut h = frame_hasher(salt, &head[0..4]);
        let mut pos = at + 8;
        let payload_end = pos + u64::from(len);
        while pos < payload_end {
            let n = chunk.len().min((payload_end - pos) as usize);
            if read_up_to(file, &mut chunk[..n], pos)? < n {
                return Ok(Committed::Records { end: at });
            }
            h.update(&chunk[..n]);
            pos += n as u64;
        }
        let mut trailer = [0u8; 4];
        if read_up_to(file, &mut trailer, payload_end)? < 4 {
            return Ok(Committed::Records { end: at });
        }
        if h.finalize() != crc || u32::from_le_bytes(trailer) != frame_trailer(salt, crc) {
            return Ok(Committed::Records { end: at });
        }
        at = payload_end + 4;
    }
}

/// Reads into `buf` at `offset` until it is full or the file ends; returns
/// how many bytes were read.
fn read_up_to(file: &dyn VfsFile, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Maps a sealed segment read-only.
#[cfg(any(test, feature = "internals"))]
pub fn map_sealed(path: impl AsRef<Path>) -> Result<memmap2::Mmap, SegmentError> {
    // Kept for callers that want the map type itself; the store maps through
    // its file system with [`map_sealed_with`].
    let file = File::open(path)?;
    // SAFETY: the map is only sound if the file is not modified or truncated
    // while mapped. Sealed segments are immutable: nothing writes to them
    // after `seal`, and the store only deletes whole segment files (an
    // unlinked file stays mapped intact); it never truncates a sealed one.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(map)
}

/// Maps (or, for a test backend, reads) a sealed segment through `vfs`.
pub fn map_sealed_with(vfs: &dyn Vfs, path: &Path) -> Result<SegmentBytes, SegmentError> {
    Ok(vfs.map(path)?)
}
