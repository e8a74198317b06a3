//! Segments a forked session shares with its parent.
//!
//! A fork hard-links the parent's sealed segments that lie wholly inside the
//! seed instead of copying them. Those files keep the identity they were
//! written with (their records are salted with the parent's session uid), so
//! the child records, per shared segment, which uid to expect. Without this
//! file a misplaced segment would be accepted; with it, only the segments the
//! fork linked are.
//!
//! File `LINEAGE` in the session directory, written atomically before the
//! links are made:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `SLOGLINE` |
//! | 8 | 4 | version, u32 = 1 |
//! | 12 | 4 | entry count n, u32 |
//! | 16 | 24 n | entries: segment first seq u64, owner session uid [u8; 16] |
//! | 16 + 24 n | 4 | CRC-32 of all preceding bytes |

use crate::format::bytes::{le_u32, le_u64};
use crate::fsutil;
#[cfg(any(test, feature = "internals"))]
use crate::vfs::RealFs;
use crate::vfs::Vfs;
use std::path::Path;

/// The lineage file's name in a session directory.
pub const LINEAGE_FILE: &str = "LINEAGE";
const MAGIC: [u8; 8] = *b"SLOGLINE";
const VERSION: u32 = 1;

/// Per shared segment (by first seq), the session uid it was written with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    entries: Vec<(u64, [u8; 16])>,
}

impl Lineage {
    /// A lineage of the given shared segments.
    pub fn new(mut entries: Vec<(u64, [u8; 16])>) -> Self {
        entries.sort();
        Lineage { entries }
    }

    /// The uid the segment starting at `first_seq` was written with, if it is
    /// shared.
    pub fn owner(&self, first_seq: u64) -> Option<[u8; 16]> {
        self.entries
            .binary_search_by_key(&first_seq, |e| e.0)
            .ok()
            .map(|i| self.entries[i].1)
    }

    /// Whether no segment is shared.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20 + 24 * self.entries.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (seq, uid) in &self.entries {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(uid);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses the file bytes; `Err` names what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Lineage, String> {
        if bytes.len() < 20 || bytes[..8] != MAGIC {
            return Err("not a lineage file".into());
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err("lineage checksum mismatch".into());
        }
        let version = le_u32(body, 8);
        if version != VERSION {
            return Err(format!(
                "lineage version {version} is not supported (this build reads {VERSION})"
            ));
        }
        let n = le_u32(body, 12) as usize;
        let entries = &body[16..];
        if entries.len() != n.saturating_mul(24) {
            return Err("lineage length does not match its entry count".into());
        }
        Ok(Lineage::new(
            entries
                .chunks_exact(24)
                .map(|e| {
                    let seq = le_u64(e, 0);
                    (seq, e[8..].try_into().expect("16 bytes"))
                })
                .collect(),
        ))
    }

    /// Reads the lineage of the session in `dir` (empty when there is none).
    #[cfg(any(test, feature = "internals"))]
    pub fn read(dir: &Path) -> Result<Lineage, String> {
        Self::read_with(&RealFs, dir)
    }

    /// [`Lineage::read`] through the file system `vfs`.
    pub fn read_with(vfs: &dyn Vfs, dir: &Path) -> Result<Lineage, String> {
        match vfs.read_file(&dir.join(LINEAGE_FILE)) {
            Ok(bytes) => Lineage::decode(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lineage::default()),
            Err(e) => Err(format!("reading {}: {e}", dir.join(LINEAGE_FILE).display())),
        }
    }

    /// Writes it atomically into `dir` (temp file, fsync, rename, dir fsync).
    #[cfg(any(test, feature = "internals"))]
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        self.write_with(&RealFs, dir)
    }

    /// [`Lineage::write`] through the file system `vfs`.
    pub fn write_with(&self, vfs: &dyn Vfs, dir: &Path) -> std::io::Result<()> {
        fsutil::write_atomic_with(vfs, dir, LINEAGE_FILE, &self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let l = Lineage::new(vec![(100, [2; 16]), (0, [1; 16])]);
        let bytes = l.encode();
        assert_eq!(Lineage::decode(&bytes).unwrap(), l);
        assert_eq!(l.owner(0), Some([1; 16]));
        assert_eq!(l.owner(100), Some([2; 16]));
        assert_eq!(l.owner(50), None);
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(Lineage::decode(&b).is_err(), "bit {i}");
        }
        for n in 0..bytes.len() {
            assert!(Lineage::decode(&bytes[..n]).is_err(), "cut {n}");
        }
    }
}
