//! The store manifest: the file `MANIFEST` at the root of a store directory.
//!
//! It marks the directory as a sessionlog store, names the store format
//! version and holds the store's random identity (which every segment header
//! repeats, so a segment copied in from another store is recognised).
//!
//! # Layout (36 bytes, integers little-endian)
//!
//! ```text
//! offset  size  field
//!      0     8  magic "SLOGSTOR"
//!      8     4  store format version u32 (this build reads 3 and 4)
//!     12     4  flags u32 (must be 0)
//!     16    16  store_id (random)
//!     32     4  crc32 u32: CRC-32 (IEEE, as crc32fast) of bytes 0..32
//! ```
//!
//! Envelope shared by every version, so that a newer store is reported as
//! such rather than as corrupt: the file starts with the magic and the version
//! u32, ends with a CRC-32 of all bytes before it, and is at most 4096 bytes.
//! A reader checks the magic and that CRC first, then the version, and only
//! then the version-specific layout.
//!
//! The manifest is created by a link from a synced temporary file (race-free:
//! of two creators one wins), and changed only by [`Manifest::upgrade_with`]
//! (temporary file, fsync, rename, directory fsync), so it is never seen
//! partially written. Version 4 differs from 3 only in what the store may
//! hold: sealed segments stored as compressed images (`.segz`), which a
//! version-3 build would not see. A store is upgraded to 4 before its first
//! image is written, never downgraded.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::bytes::le_u32;
use crate::fsutil::{self, TMP_SUFFIX};
#[cfg(any(test, feature = "internals"))]
use crate::vfs::RealFs;
use crate::vfs::Vfs;

/// Name of the manifest file in the store directory.
pub const MANIFEST_FILE: &str = "MANIFEST";

/// Magic bytes at offset 0 of the manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"SLOGSTOR";

/// The newest store format version this build reads and writes: 5, a store
/// whose sealed segments may be stored compressed (version 4) and whose
/// small sessions may keep their checkpoint in their `HEADER` (version 5).
/// Stores are created at [`STORE_FORMAT_OLDEST`] and upgraded before the
/// first file only a newer reader reads is written.
pub const STORE_FORMAT_VERSION: u32 = 5;

/// The oldest store format version this build reads (and creates).
pub const STORE_FORMAT_OLDEST: u32 = 3;

/// Size of a manifest in bytes (versions 1 and 2: the layout is the same;
/// version 2 stores have version-2 segments, whose record codec packs data).
pub const MANIFEST_LEN: usize = 36;

/// Largest manifest of any version a reader accepts (the envelope bound).
pub const MANIFEST_MAX_LEN: usize = 4096;

/// Errors opening or creating a store manifest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// Reading or writing failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The directory does not exist, or is empty: no store has been created
    /// there yet ([`Store::open`](crate::store::Store::open) creates one).
    #[error("{}: no sessionlog store here (missing or empty directory)", path.display())]
    Missing {
        /// The store directory.
        path: PathBuf,
    },
    /// The directory has no `MANIFEST` but is not empty: it is not a store,
    /// and it is never taken over.
    #[error("{}: not a sessionlog store (no {MANIFEST_FILE} and the directory is not empty)", path.display())]
    NotAStore {
        /// The directory.
        path: PathBuf,
    },
    /// Creating a store found an existing manifest.
    #[error("{}: a store already exists here", path.display())]
    AlreadyExists {
        /// The manifest path.
        path: PathBuf,
    },
    /// The store was written in a format version this build cannot read.
    #[error(
        "{}: the store was written by a build using store format version {found}; this build reads versions {STORE_FORMAT_OLDEST} to {supported} (to migrate: `sessionlog --store DIR export --all --to OUT` with a build that reads version {found}, then `sessionlog --store NEW import OUT` with this one)",
        path.display()
    )]
    UnsupportedVersion {
        /// The manifest path.
        path: PathBuf,
        /// The version in the manifest.
        found: u32,
        /// The newest version this build reads (`STORE_FORMAT_VERSION`).
        supported: u32,
    },
    /// The manifest exists but is damaged or not a manifest.
    #[error("{}: corrupt store manifest: {reason}", path.display())]
    Corrupt {
        /// The manifest path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The decoded manifest of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    /// The store's random identity.
    pub store_id: [u8; 16],
    /// The store format version (3 or 4: 4 when sealed segments may be
    /// stored compressed).
    pub version: u32,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ManifestError + '_ {
    move |source| ManifestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `dir` has no entries other than the temporary files of a
/// manifest being created (`MANIFEST.tmp`, `MANIFEST.tmp-*`: left by a crash
/// or written right now by a concurrent creator).
fn is_effectively_empty(vfs: &dyn Vfs, dir: &Path) -> Result<bool, ManifestError> {
    let tmp = format!("{MANIFEST_FILE}{TMP_SUFFIX}");
    for name in vfs.read_dir(dir).map_err(io_err(dir))? {
        let name = name.to_string_lossy();
        if !name.starts_with(tmp.as_str()) {
            return Ok(false);
        }
    }
    Ok(true)
}

impl Manifest {
    /// A manifest with a fresh random store id.
    pub fn generate() -> Manifest {
        Manifest {
            store_id: fsutil::random_id(),
            version: STORE_FORMAT_OLDEST,
        }
    }

    /// The manifest's bytes (flags 0).
    pub fn encode(&self) -> [u8; MANIFEST_LEN] {
        let mut b = [0u8; MANIFEST_LEN];
        b[0..8].copy_from_slice(&MANIFEST_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&0u32.to_le_bytes());
        b[16..32].copy_from_slice(&self.store_id);
        let crc = crc32fast::hash(&b[0..32]);
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes manifest bytes; `path` only labels errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Manifest, ManifestError> {
        let corrupt = |reason: String| ManifestError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < 8 || bytes[0..8] != MANIFEST_MAGIC {
            return Err(corrupt("bad magic (not a sessionlog manifest)".into()));
        }
        if bytes.len() < 16 || bytes.len() > MANIFEST_MAX_LEN {
            return Err(corrupt(format!("impossible length {}", bytes.len())));
        }
        let body = bytes.len() - 4;
        let stored = le_u32(bytes, body);
        let actual = crc32fast::hash(&bytes[..body]);
        if stored != actual {
            return Err(corrupt(format!(
                "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
            )));
        }
        let found = le_u32(bytes, 8);
        if !(STORE_FORMAT_OLDEST..=STORE_FORMAT_VERSION).contains(&found) {
            return Err(ManifestError::UnsupportedVersion {
                path: path.to_path_buf(),
                found,
                supported: STORE_FORMAT_VERSION,
            });
        }
        if bytes.len() != MANIFEST_LEN {
            return Err(corrupt(format!(
                "length {} (version {found} manifests are {MANIFEST_LEN} bytes)",
                bytes.len()
            )));
        }
        let flags = le_u32(bytes, 12);
        if flags != 0 {
            return Err(corrupt(format!("unknown flags {flags:#x}")));
        }
        Ok(Manifest {
            store_id: bytes[16..32].try_into().expect("16 bytes"),
            version: found,
        })
    }

    /// Reads the manifest of the store at `dir`.
    ///
    /// Errors: [`ManifestError::Missing`] if `dir` does not exist or is empty
    /// (a stale `MANIFEST.tmp` alone counts as empty: a store creation that
    /// crashed), [`ManifestError::NotAStore`] if it has no `MANIFEST` but
    /// other entries, [`ManifestError::UnsupportedVersion`],
    /// [`ManifestError::Corrupt`] and [`ManifestError::Io`].
    #[cfg(any(test, feature = "internals"))]
    pub fn open(dir: impl AsRef<Path>) -> Result<Manifest, ManifestError> {
        Self::open_with(&RealFs, dir.as_ref())
    }

    /// [`Manifest::open`] through the file system `vfs`.
    pub fn open_with(vfs: &dyn Vfs, dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        let file = match vfs.open(&path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return match vfs.metadata(dir) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ManifestError::Missing {
                        path: dir.to_path_buf(),
                    }),
                    Err(e) => Err(io_err(dir)(e)),
                    Ok(_) if is_effectively_empty(vfs, dir)? => Err(ManifestError::Missing {
                        path: dir.to_path_buf(),
                    }),
                    // A concurrent creator linked its manifest in after our
                    // open: read that one.
                    Ok(_) if vfs.exists(&path) => Manifest::open_with(vfs, dir),
                    Ok(_) => Err(ManifestError::NotAStore {
                        path: dir.to_path_buf(),
                    }),
                };
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        // Read at most one byte more than any manifest may have, so a huge
        // file is rejected without reading it all.
        let mut bytes = vec![0u8; MANIFEST_MAX_LEN + 1];
        let mut n = 0;
        while n < bytes.len() {
            match file.read_at(&mut bytes[n..], n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        bytes.truncate(n);
        Manifest::decode(&bytes, &path)
    }

    /// Creates a new store manifest with a random store id in the existing
    /// directory `dir`, durably (once this returns, the manifest survives a
    /// crash).
    ///
    /// Refuses ([`ManifestError::AlreadyExists`]) if `dir` already has a
    /// manifest: a new store id would disown every existing segment. Refuses
    /// ([`ManifestError::NotAStore`]) if `dir` has other entries (temporary
    /// `MANIFEST.tmp*` files are ignored). Race-free: the manifest is written
    /// and synced under a name of its own, then hard-linked to `MANIFEST`,
    /// which fails if another process created one first; that process's
    /// manifest then stands ([`Manifest::open_or_create`] opens it).
    #[cfg(any(test, feature = "internals"))]
    pub fn create(dir: impl AsRef<Path>) -> Result<Manifest, ManifestError> {
        Self::create_with(&RealFs, dir.as_ref())
    }

    /// [`Manifest::create`] through the file system `vfs`.
    pub fn create_with(vfs: &dyn Vfs, dir: &Path) -> Result<Manifest, ManifestError> {
        let path = dir.join(MANIFEST_FILE);
        match vfs.symlink_metadata(&path) {
            Ok(_) => return Err(ManifestError::AlreadyExists { path }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
        if !is_effectively_empty(vfs, dir)? {
            return Err(ManifestError::NotAStore {
                path: dir.to_path_buf(),
            });
        }
        // Race-free creation: the manifest is written whole and synced under
        // a name of its own, then linked to MANIFEST, which fails if another
        // creator got there first (`link` never replaces). The loser then
        // opens the winner's manifest, so every process agrees on the store
        // id; a rename here would let the second creator replace the id
        // after the first had written segments under it.
        let manifest = Manifest::generate();
        let (tmp, written) = manifest.put_with(vfs, dir, |tmp| vfs.hard_link(tmp, &path));
        let _ = vfs.remove_file(&tmp);
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ManifestError::AlreadyExists { path });
            }
            Err(e) => return Err(io_err(&path)(e)),
        }
        // The new name must be durable before anything is written under
        // this store id.
        vfs.sync_dir(dir).map_err(io_err(dir))?;
        Ok(manifest)
    }

    /// Opens the store at `dir`, creating it first if `dir` is missing or
    /// empty. Returns the manifest and whether it was created.
    ///
    /// A missing `dir` is created with mode `0700` (its parent must exist)
    /// and its parent directory is synced, so the new store's directory entry
    /// is durable before the manifest is written into it.
    #[cfg(any(test, feature = "internals"))]
    pub fn open_or_create(dir: impl AsRef<Path>) -> Result<(Manifest, bool), ManifestError> {
        Self::open_or_create_with(&RealFs, dir.as_ref())
    }

    /// [`Manifest::open_or_create`] through the file system `vfs`.
    pub fn open_or_create_with(
        vfs: &dyn Vfs,
        dir: &Path,
    ) -> Result<(Manifest, bool), ManifestError> {
        match Manifest::open_with(vfs, dir) {
            Err(ManifestError::Missing { .. }) => {}
            other => return other.map(|m| (m, false)),
        }
        if !vfs.exists(dir) {
            match vfs.create_dir(dir) {
                Ok(()) => {}
                // Created concurrently; `create` re-checks emptiness.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(dir)(e)),
            }
            let parent = match dir.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            vfs.sync_dir(parent).map_err(io_err(parent))?;
        }
        match Manifest::create_with(vfs, dir) {
            Ok(m) => Ok((m, true)),
            // Another process created the store meanwhile: open theirs.
            Err(ManifestError::AlreadyExists { .. }) => {
                Manifest::open_with(vfs, dir).map(|m| (m, false))
            }
            Err(ManifestError::NotAStore { path }) => match Manifest::open_with(vfs, dir) {
                // ... and already put files beside its manifest.
                Ok(m) => Ok((m, false)),
                Err(_) => Err(ManifestError::NotAStore { path }),
            },
            Err(e) => Err(e),
        }
    }

    /// Raises the store at `dir` to [`STORE_FORMAT_VERSION`] (no-op when
    /// it is there): the new manifest, with the same store id, is written
    /// whole to a temporary name, `fsync`ed, renamed over `MANIFEST` and
    /// the directory `fsync`ed, so a crash leaves the old manifest or the
    /// new one, and the new one is durable before the caller writes
    /// anything only a reader of the new version can read. Concurrent
    /// upgraders write the same bytes.
    pub fn upgrade_with(&self, vfs: &dyn Vfs, dir: &Path) -> Result<Manifest, ManifestError> {
        if self.version == STORE_FORMAT_VERSION {
            return Ok(*self);
        }
        let upgraded = Manifest {
            version: STORE_FORMAT_VERSION,
            ..*self
        };
        let path = dir.join(MANIFEST_FILE);
        let (tmp, written) = upgraded.put_with(vfs, dir, |tmp| vfs.rename(tmp, &path));
        if let Err(e) = written {
            let _ = vfs.remove_file(&tmp);
            return Err(io_err(&path)(e));
        }
        vfs.sync_dir(dir).map_err(io_err(dir))?;
        Ok(upgraded)
    }

    /// Writes this manifest whole under a temporary name of its own in
    /// `dir`, `fsync`s it, then puts it in place with `place` (a link or a
    /// rename to `MANIFEST`). Returns the temporary name with the outcome.
    fn put_with(
        &self,
        vfs: &dyn Vfs,
        dir: &Path,
        place: impl FnOnce(&Path) -> io::Result<()>,
    ) -> (PathBuf, io::Result<()>) {
        let tmp = dir.join(format!(
            "{MANIFEST_FILE}{TMP_SUFFIX}-{}",
            Manifest::generate().store_id_hex()
        ));
        let written = (|| {
            let file = vfs.create_new(&tmp)?;
            file.write_all_at(&self.encode(), 0)?;
            file.sync_all()?;
            place(&tmp)
        })();
        (tmp, written)
    }

    /// The store id as 32 lower-case hex digits.
    pub fn store_id_hex(&self) -> String {
        self.store_id
            .iter()
            .fold(String::with_capacity(32), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            })
    }
}
