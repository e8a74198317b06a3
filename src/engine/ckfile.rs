//! Where a session's checkpoint lives: its own `CHECKPOINT` file, or, for
//! a small session, embedded at the end of its `HEADER` (format-spec
//! sections 5 and 6). A file costs a block of the disk however small it
//! is: 1,000 sessions of ~16 KB spent a quarter of their bytes on
//! checkpoints of ~600 bytes. The `CHECKPOINT` file wins when both exist:
//! a session embeds only while it has none, so a `HEADER`'s checkpoint
//! next to a file is an older one.

use crate::checkpoint::{CHECKPOINT_FILE, Checkpoint, CheckpointError};
use crate::headerfile::{self, HEADER_BLOCK, HEADER_FILE};
use crate::vfs::{SegmentBytes, Vfs};
use std::io;
use std::path::{Path, PathBuf};

/// Where a checkpoint is read from: the file, and the offset in it where
/// the checkpoint starts (0 for `CHECKPOINT`; the end of the header JSON
/// for one a `HEADER` embeds). For messages.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) path: PathBuf,
    pub(crate) at: u64,
}

impl Place {
    /// Whether this is a checkpoint a `HEADER` embeds.
    pub(crate) fn embedded(&self) -> bool {
        !self.path.ends_with(CHECKPOINT_FILE)
    }
}

/// Opens the checkpoint of the session in `dir`: its `CHECKPOINT` file, or
/// else the one its `HEADER` embeds. Also returns where it is (or would
/// be) read from. [`CheckpointError::Missing`] when there is neither.
pub(crate) fn open(vfs: &dyn Vfs, dir: &Path) -> (Place, Result<Checkpoint, CheckpointError>) {
    let file = Place {
        path: dir.join(CHECKPOINT_FILE),
        at: 0,
    };
    match crate::checkpoint::open_with(vfs, dir) {
        Err(CheckpointError::Missing) => {}
        other => return (file, other),
    }
    let path = dir.join(HEADER_FILE);
    let bytes = match vfs.read_file(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return (file, Err(CheckpointError::Missing));
        }
        Err(e) => return (Place { path, at: 0 }, Err(e.into())),
    };
    // A `HEADER` that does not decode is the registry's to report (the
    // session is unaccounted); here it only means no embedded checkpoint.
    match headerfile::decode(&bytes).map(|h| h.checkpoint) {
        Ok(Some(ck)) => {
            let at = (bytes.len() - ck.len()) as u64;
            let parsed = Checkpoint::parse(SegmentBytes::new(ck.to_vec()));
            (Place { path, at }, parsed)
        }
        Ok(None) | Err(_) => (file, Err(CheckpointError::Missing)),
    }
}

/// The file holding the checkpoint of the session in `dir`, without
/// reading the checkpoint: its `CHECKPOINT` file, or its `HEADER` when
/// that embeds one; `None` when there is neither.
pub(crate) fn location(vfs: &dyn Vfs, dir: &Path) -> Option<PathBuf> {
    let file = dir.join(CHECKPOINT_FILE);
    if vfs.exists(&file) {
        return Some(file);
    }
    let path = dir.join(HEADER_FILE);
    let bytes = vfs.read_file(&path).ok()?;
    matches!(headerfile::decode(&bytes), Ok(h) if h.checkpoint.is_some()).then_some(path)
}

/// The `HEADER` of the session in `dir` with checkpoint `bytes` (an
/// encoded checkpoint) embedded, when the session may embed it: it has no
/// `CHECKPOINT` file and the `HEADER` then fits in one block. `None`: the
/// checkpoint goes to its own file.
pub(crate) fn embedding(vfs: &dyn Vfs, dir: &Path, bytes: &[u8]) -> io::Result<Option<Vec<u8>>> {
    if vfs.exists(&dir.join(CHECKPOINT_FILE)) {
        return Ok(None);
    }
    let header = vfs.read_file(&dir.join(HEADER_FILE))?;
    let plain = headerfile::with_checkpoint(&header, None).map_err(invalid)?;
    if plain.len() + bytes.len() > HEADER_BLOCK {
        return Ok(None);
    }
    headerfile::with_checkpoint(&header, Some(bytes))
        .map(Some)
        .map_err(invalid)
}

/// Puts `bytes` in place as file `name` of the session in `dir`
/// (`CHECKPOINT`, or a `HEADER` from [`embedding`]), atomically: written
/// whole under a temporary name, `fsync`ed, renamed, the directory
/// `fsync`ed; after a crash the old file or the new one is there, whole.
pub(crate) fn put(vfs: &dyn Vfs, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    crate::fsutil::write_atomic_with(vfs, dir, name, bytes)
}

/// Removes the checkpoint of the session in `dir` wherever it is: its
/// `CHECKPOINT` file, and the one its `HEADER` embeds (the `HEADER` written
/// again without it). A checkpoint is a cache: nothing is lost.
#[cfg(feature = "archive")]
pub(crate) fn remove(vfs: &dyn Vfs, dir: &Path) -> io::Result<()> {
    let path = dir.join(CHECKPOINT_FILE);
    match vfs.remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let header = vfs.read_file(&dir.join(HEADER_FILE))?;
    if headerfile::decode(&header).is_ok_and(|h| h.checkpoint.is_some()) {
        let plain = headerfile::with_checkpoint(&header, None).map_err(invalid)?;
        crate::fsutil::write_atomic_with(vfs, dir, HEADER_FILE, &plain)?;
    }
    Ok(())
}

/// What the `HEADER` of the session in `dir` holds without any embedded
/// checkpoint: the bytes a version-1 reader reads (the archive uploads
/// these, so the bucket stays readable by every build that reads version 3).
#[cfg(feature = "archive")]
pub(crate) fn plain_header(bytes: &[u8]) -> Result<Vec<u8>, String> {
    headerfile::with_checkpoint(bytes, None)
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{HEADER_FILE}: {why}"))
}
