//! The session checkpoint: the folded index state written next to the log so
//! that reopening costs O(events since the checkpoint), not O(log).
//!
//! File `CHECKPOINT` in the session directory:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `SLOGCKPT` |
//! | 8 | 4 | checkpoint format version, u32 LE ([`CHECKPOINT_VERSION`]) |
//! | 12 | 8 | payload length, u64 LE (must equal file length - 28) |
//! | 20 | 4 | CRC-32 (IEEE, crc32fast) of the payload, u32 LE |
//! | 24 | 4 | CRC-32 of bytes 0..24, u32 LE |
//! | 28 | n | payload: [`CheckpointBody`], bincode 2, standard config |
//!
//! A checkpoint is written atomically (temp file, fsync, rename, directory
//! fsync) and only ever covers log bytes that are already durable. It is a
//! cache: a missing, corrupt, stale or non-covering checkpoint is never
//! trusted; the session is rebuilt from the log and the rebuild reported.

use crate::derive::DeriveCache;
use crate::session::SessionState;
use crate::vfs::{RealFs, Vfs};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The checkpoint file's name inside a session directory.
pub const CHECKPOINT_FILE: &str = "CHECKPOINT";
/// Magic bytes at offset 0.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"SLOGCKPT";
/// The checkpoint format this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 4;
/// Fixed header length before the payload.
pub const CHECKPOINT_HEADER_LEN: usize = 28;

/// Where the checkpoint stops: the log position it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchEntry {
    /// First seq of the batch.
    pub first_seq: u64,
    /// First seq of the segment holding it.
    pub segment: u64,
    /// Byte offset of its record frame in the segment file.
    pub offset: u64,
}

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Where each surface node's data lies (the derive index).
    pub node_locs: Vec<(u64, DataLoc)>,
}

/// Why a checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
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
    /// Reading or writing failed.
    #[error("checkpoint I/O: {0}")]
    Io(#[from] std::io::Error),
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Serialises a checkpoint to its file bytes.
pub fn encode(body: &CheckpointBody) -> Vec<u8> {
    let payload =
        bincode::serde::encode_to_vec(body, config()).expect("checkpoint body serialises");
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_LEN + payload.len());
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    let head_crc = crc32fast::hash(&out[..24]);
    out.extend_from_slice(&head_crc.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Parses checkpoint file bytes, verifying magic, version and checksums.
/// Never allocates more than the input holds.
pub fn decode(bytes: &[u8]) -> Result<CheckpointBody, CheckpointError> {
    let corrupt = |why: &str| CheckpointError::Corrupt(why.to_owned());
    if bytes.len() < CHECKPOINT_HEADER_LEN {
        return Err(corrupt("shorter than its header"));
    }
    if bytes[..8] != CHECKPOINT_MAGIC {
        return Err(corrupt("bad magic"));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..24]) != u32_at(24) {
        return Err(corrupt("header checksum mismatch"));
    }
    let version = u32_at(8);
    if version != CHECKPOINT_VERSION {
        return Err(CheckpointError::UnsupportedVersion { found: version });
    }
    let len = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let payload = &bytes[CHECKPOINT_HEADER_LEN..];
    if len != payload.len() as u64 {
        return Err(corrupt("payload length does not match the file length"));
    }
    if crc32fast::hash(payload) != u32_at(20) {
        return Err(corrupt("payload checksum mismatch"));
    }
    // bincode checks sequence lengths against the input, but allocates what
    // a string or byte-buffer length claims before reading it: the limit
    // bounds that claim (a 1M-event session's checkpoint claims ~30 MiB).
    let config = config().with_limit::<{ 256 << 20 }>();
    let (body, used): (CheckpointBody, usize) = bincode::serde::decode_from_slice(payload, config)
        .map_err(|e| CheckpointError::Corrupt(format!("payload does not decode: {e}")))?;
    if used != payload.len() {
        return Err(corrupt("trailing bytes after the payload"));
    }
    // A checksum proves these are the bytes written, not that the writer was
    // right: a surface that is not well formed is never handed out.
    body.state.surface().validate().map_err(|why| {
        CheckpointError::Corrupt(format!("the surface is not well formed: {why}"))
    })?;
    Ok(body)
}

/// Reads the checkpoint of the session in `dir`.
pub fn read(dir: &Path) -> Result<CheckpointBody, CheckpointError> {
    read_with(&RealFs, dir)
}

/// [`read`] through the file system `vfs`.
pub fn read_with(vfs: &dyn Vfs, dir: &Path) -> Result<CheckpointBody, CheckpointError> {
    match vfs.read_file(&dir.join(CHECKPOINT_FILE)) {
        Ok(bytes) => decode(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CheckpointError::Missing),
        Err(e) => Err(e.into()),
    }
}

/// Writes the checkpoint of the session in `dir` atomically: after a crash
/// the old checkpoint or the new one is there, whole.
pub fn write(dir: &Path, body: &CheckpointBody) -> Result<(), CheckpointError> {
    write_with(&RealFs, dir, body)
}

/// [`write()`] through the file system `vfs`.
pub fn write_with(vfs: &dyn Vfs, dir: &Path, body: &CheckpointBody) -> Result<(), CheckpointError> {
    crate::fsutil::write_atomic_with(vfs, dir, CHECKPOINT_FILE, &encode(body))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> CheckpointBody {
        CheckpointBody {
            coverage: Coverage {
                segment_first_seq: 0,
                last_record_offset: 64,
                end_offset: 100,
                last_record_crc: 7,
                next_seq: 3,
            },
            last_time: -5,
            state: SessionState::new(false),
            derive: DeriveCache::default(),
            batches: vec![BatchEntry {
                first_seq: 0,
                segment: 0,
                offset: 64,
            }],
            node_locs: vec![(
                1,
                DataLoc {
                    segment: 0,
                    offset: 90,
                    len: 4,
                },
            )],
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(decode(&encode(&body())).unwrap(), body());
    }

    #[test]
    fn every_bit_flip_and_truncation_is_rejected() {
        let bytes = encode(&body());
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(decode(&b).is_err(), "flip of bit {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "truncation to {n} accepted");
        }
    }

    #[test]
    fn other_versions_are_refused_by_name() {
        let mut b = encode(&body());
        let other = CHECKPOINT_VERSION + 1;
        b[8..12].copy_from_slice(&other.to_le_bytes());
        let crc = crc32fast::hash(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        let e = decode(&b).unwrap_err();
        assert!(
            matches!(e, CheckpointError::UnsupportedVersion { found } if found == other),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("version {other}")));
    }
}
