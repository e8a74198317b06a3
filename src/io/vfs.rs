//! The file-system interface: every file operation of the engine (store,
//! segments, session headers, manifest, checkpoints, lineage) goes through
//! a [`Vfs`].
//!
//! [`RealFs`] is the operating system's file system and the default of
//! [`crate::store::Options`]. [`FaultFs`] wraps another backend for tests: it
//! counts operations, fails the Nth one (EIO or ENOSPC, once or from then on)
//! and can return short reads. Test code can implement the traits too (the
//! crash-point tests model the page cache with a recording backend).
//!
//! The model the engine is written against is POSIX: a write is not durable
//! until the file is synced ([`VfsFile::sync_data`] / [`VfsFile::sync_all`]),
//! and a directory entry created, renamed, linked or removed is not durable
//! until its directory is synced ([`Vfs::sync_dir`]).
//!
//! Reads of segments go through [`Vfs::map`], which returns [`SegmentBytes`]:
//! the real backend maps the file (`mmap`), so the bytes of an active segment
//! written later through a [`VfsFile`] show up in an existing map (the page
//! cache is shared). A backend that serves a copy must say so with
//! [`Vfs::coherent_maps`] returning false; the store then maps again after
//! each write it needs to read back.

use std::fmt;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::ops::Deref;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

/// Mode of every file the store creates.
pub const FILE_MODE: u32 = 0o600;

/// Mode of every directory the store creates.
pub const DIR_MODE: u32 = 0o700;

/// Read-only bytes of a whole file (a segment), shareable across threads: a
/// memory map for [`RealFs`], or any owned buffer for a test backend.
#[derive(Clone)]
pub struct SegmentBytes(Arc<dyn Deref<Target = [u8]> + Send + Sync>);

impl SegmentBytes {
    /// Wraps any byte container (`Mmap`, `Vec<u8>`, ...).
    pub fn new(bytes: impl Deref<Target = [u8]> + Send + Sync + 'static) -> Self {
        SegmentBytes(Arc::new(bytes))
    }
}

impl Deref for SegmentBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SegmentBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SegmentBytes({} bytes)", self.len())
    }
}

/// What [`Vfs::metadata`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metadata {
    /// File length in bytes.
    pub len: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Last modification time, when known.
    pub modified: Option<SystemTime>,
    /// The inode number: a directory renamed over or replaced at the same
    /// path shows up as a new number.
    pub ino: u64,
    /// Bytes allocated on the device (`st_blocks * 512`): what the file
    /// really costs, preallocated space included, holes excluded.
    pub allocated: u64,
    /// Hard links to the file (`st_nlink`): more than one for a sealed
    /// segment a fork shares.
    pub links: u64,
    /// Birth time, when the file system records it (`statx`): with `ino`,
    /// tells a directory created again at the same path (file systems reuse
    /// a freed inode number at once) from the one seen before.
    pub created: Option<SystemTime>,
}

impl Metadata {
    /// What identifies this file or directory while it lives: its inode
    /// number and birth time.
    pub fn identity(&self) -> (u64, Option<SystemTime>) {
        (self.ino, self.created)
    }
}

/// An open file. Positional I/O only; `Send + Sync` so a writer can move
/// between threads.
pub trait VfsFile: Send + Sync + fmt::Debug {
    /// `pread`: reads up to `buf.len()` bytes at `offset`; may read fewer.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// `pwrite`: writes up to `buf.len()` bytes at `offset`; may write fewer.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// `fdatasync`: the data (and the size, when it changed) is durable.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`: data and all metadata are durable.
    fn sync_all(&self) -> io::Result<()>;
    /// `ftruncate`: sets the file length (zeros when it grows).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// `fallocate`: reserves `offset..offset + len`, extending the file. A
    /// backend without it may do nothing: callers write zeros afterwards.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// The current file length.
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty (the engine asks [`VfsFile::len`]; public
    /// with the `internals` feature only, so only there).
    #[cfg(any(test, feature = "internals"))]
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Reads exactly `buf.len()` bytes at `offset`, looping over short reads.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "failed to fill the whole buffer",
                    ));
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset`, looping over short writes.
    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "failed to write the whole buffer",
                    ));
                }
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The file system. Paths are absolute or relative to the process's working
/// directory, exactly as the caller passes them.
pub trait Vfs: Send + Sync + fmt::Debug {
    /// Creates `path` for reading and writing with mode `0600`; fails if
    /// anything exists there (`O_CREAT | O_EXCL`, never following a symlink).
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VfsFile>>;
    /// Opens an existing file, read-only or for reading and writing.
    fn open(&self, path: &Path, writable: bool) -> io::Result<Box<dyn VfsFile>>;
    /// Reads a whole file.
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The bytes of a whole file for reading (segments): see the module docs.
    fn map(&self, path: &Path) -> io::Result<SegmentBytes>;
    /// Whether bytes written after a [`map`](Vfs::map) show up in it.
    fn coherent_maps(&self) -> bool {
        true
    }
    /// Renames `from` over `to` (atomic replacement of the entry).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Renames `from` to `to` only if nothing exists at `to`
    /// (`renameat2(RENAME_NOREPLACE)`): fails with `AlreadyExists`
    /// otherwise. Publishing a session directory this way makes two
    /// concurrent creators of one id fail cleanly instead of one replacing
    /// the other.
    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Swaps the entries `a` and `b` atomically (`renameat2(RENAME_EXCHANGE)`);
    /// both must exist. Replacing a session directory this way leaves, at
    /// every instant, either the old or the new one in place.
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything below it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Creates the directory `path` (not its parents) with mode `0700`.
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// `fsync`s the directory `path`, making the entries created, renamed,
    /// linked or removed in it durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Makes `dst` a new name of the file `src`.
    fn hard_link(&self, src: &Path, dst: &Path) -> io::Result<()>;
    /// The names in directory `path`, in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<std::ffi::OsString>>;
    /// Metadata of `path`, following symlinks.
    fn metadata(&self, path: &Path) -> io::Result<Metadata>;
    /// Metadata of `path` itself (a symlink is not followed).
    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata>;

    /// Whether anything exists at `path` (following symlinks).
    fn exists(&self, path: &Path) -> bool {
        self.metadata(path).is_ok()
    }
}

// ---------------------------------------------------------------------------
// The real file system
// ---------------------------------------------------------------------------

/// The operating system's file system (Unix).
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

/// A shared handle to [`RealFs`], the default backend.
pub fn real() -> Arc<dyn Vfs> {
    Arc::new(RealFs)
}

#[derive(Debug)]
struct RealFile(File);

impl VfsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.0.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        reserve_space(&self.0, offset, len)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

/// Reserves `start..start+len` with `fallocate(fd, 0, ...)`, extending the
/// file. Filesystems without `fallocate` report EOPNOTSUPP; that is not an
/// error, because the zero writes that follow allocate the space anyway.
#[cfg(target_os = "linux")]
fn reserve_space(file: &File, start: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;

    let too_big = || io::Error::new(io::ErrorKind::InvalidInput, "preallocation range too large");
    let offset = libc::off_t::try_from(start).map_err(|_| too_big())?;
    let len = libc::off_t::try_from(len).map_err(|_| too_big())?;
    loop {
        // SAFETY: fallocate takes plain integers; the descriptor is valid
        // because `file` is borrowed for the duration of the call.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, offset, len) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => return Ok(()),
            _ => return Err(err),
        }
    }
}

/// Without `fallocate` the zero writes alone allocate the space.
#[cfg(not(target_os = "linux"))]
fn reserve_space(_file: &File, _start: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

#[derive(Clone, Copy)]
enum RenameMode {
    NoReplace,
    Exchange,
}

#[cfg(target_os = "linux")]
fn renameat2(from: &Path, to: &Path, mode: RenameMode) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
    };
    let (from, to) = (c(from)?, c(to)?);
    let flags = match mode {
        RenameMode::NoReplace => libc::RENAME_NOREPLACE,
        RenameMode::Exchange => libc::RENAME_EXCHANGE,
    };
    // SAFETY: both paths are NUL-terminated C strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn renameat2(_from: &Path, _to: &Path, _mode: RenameMode) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "atomic no-replace and exchange renames need Linux (renameat2)",
    ))
}

fn metadata_of(m: fs::Metadata) -> Metadata {
    Metadata {
        len: m.size(),
        is_dir: m.is_dir(),
        modified: m.modified().ok(),
        ino: m.ino(),
        allocated: m.blocks() * 512,
        links: m.nlink(),
        created: m.created().ok(),
    }
}

impl Vfs for RealFs {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VfsFile>> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(path)?;
        Ok(Box::new(RealFile(f)))
    }
    fn open(&self, path: &Path, writable: bool) -> io::Result<Box<dyn VfsFile>> {
        let f = OpenOptions::new().read(true).write(writable).open(path)?;
        Ok(Box::new(RealFile(f)))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }
    fn map(&self, path: &Path) -> io::Result<SegmentBytes> {
        let f = File::open(path)?;
        // SAFETY: segment files are only ever appended to within their
        // preallocated length or sealed (cut to a length past every committed
        // byte); readers only touch committed bytes, so the mapping never
        // reads past the end of the file and never sees bytes change. Sealed
        // segments are immutable, and the store only deletes whole segment
        // files (an unlinked file stays mapped intact).
        let map = unsafe { memmap2::Mmap::map(&f)? };
        Ok(SegmentBytes::new(map))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        renameat2(from, to, RenameMode::NoReplace)
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        renameat2(a, b, RenameMode::Exchange)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        DirBuilder::new().mode(DIR_MODE).create(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn hard_link(&self, src: &Path, dst: &Path) -> io::Result<()> {
        fs::hard_link(src, dst)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }
    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        fs::metadata(path).map(metadata_of)
    }
    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata> {
        fs::symlink_metadata(path).map(metadata_of)
    }
}

// Fault injection, for tests: only with the `internals` feature.
#[cfg(any(test, feature = "internals"))]
mod fault;
#[cfg(any(test, feature = "internals"))]
pub use fault::{FaultFs, FaultKind, FaultPlan};
