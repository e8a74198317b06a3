//! A [`Vfs`](sessionlog::vfs::Vfs) over the real file system with hooks,
//! so a test can make a race happen at one exact operation: a directory
//! listing shown stale, a file removed just before it is mapped or cut
//! just after, another handle's change just before a hard link, a slow
//! `fdatasync`. Shared by the compression, archive, fork, seal-window and
//! journal tests.

use sessionlog::vfs::{Metadata, RealFs, SegmentBytes, Vfs, VfsFile};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type Listing = Box<dyn Fn(&Path, Vec<OsString>) -> Vec<OsString> + Send + Sync>;
type Hook = Box<dyn Fn(&Path) + Send + Sync>;
type Gate = Box<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;
type Rewrite = Box<dyn Fn(&Path, Metadata) -> Metadata + Send + Sync>;
/// A hook every file of the file system shares.
type FileHook = Arc<dyn Fn(&Path) + Send + Sync>;
/// A file hook whose error fails the operation.
type FileGate = Arc<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;

/// The real file system, with optional hooks.
#[derive(Default)]
pub struct HookedFs {
    /// Rewrites every directory listing (directory, names as read).
    pub listing: Option<Listing>,
    /// Runs before every `map` of a path.
    pub before_map: Option<Hook>,
    /// Runs after every successful `map` of a path (the mapping made).
    pub after_map: Option<Hook>,
    /// Runs before every hard link (with the link's source).
    pub before_link: Option<Hook>,
    /// Runs before every directory listing; an error fails the listing.
    pub before_read_dir: Option<Gate>,
    /// Runs before every whole-file read.
    pub before_read_file: Option<Hook>,
    /// Rewrites what `metadata` returns.
    pub metadata: Option<Rewrite>,
    /// Runs before every directory `fsync`.
    pub before_sync_dir: Option<Hook>,
    /// Runs before every `RENAME_EXCHANGE` (with its first path); an
    /// error fails the exchange.
    pub before_exchange: Option<Gate>,
    /// Runs before every positional write to a file; an error fails the
    /// write (nothing is written).
    pub before_write: Option<FileGate>,
    /// Runs after every successful positional write to a file.
    pub after_write: Option<FileHook>,
    /// Runs before every `sync_data` of a file.
    pub before_sync_data: Option<FileHook>,
    /// Runs after every successful `sync_data` of a file.
    pub after_sync_data: Option<FileHook>,
}

/// A file of a [`HookedFs`] with file hooks.
#[derive(Debug)]
struct HookedFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    hooks: FileHooks,
}

#[derive(Clone)]
struct FileHooks {
    before_write: Option<FileGate>,
    after_write: Option<FileHook>,
    before_sync_data: Option<FileHook>,
    after_sync_data: Option<FileHook>,
}

impl std::fmt::Debug for FileHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileHooks")
    }
}

impl VfsFile for HookedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if let Some(gate) = &self.hooks.before_write {
            gate(&self.path)?;
        }
        let n = self.inner.write_at(buf, offset)?;
        if let Some(hook) = &self.hooks.after_write {
            hook(&self.path);
        }
        Ok(n)
    }
    fn sync_data(&self) -> io::Result<()> {
        if let Some(hook) = &self.hooks.before_sync_data {
            hook(&self.path);
        }
        self.inner.sync_data()?;
        if let Some(hook) = &self.hooks.after_sync_data {
            hook(&self.path);
        }
        Ok(())
    }
    fn sync_all(&self) -> io::Result<()> {
        self.inner.sync_all()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.allocate(offset, len)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
}

impl HookedFs {
    /// `file`, wrapped when a file hook is set.
    fn wrap(&self, p: &Path, file: Box<dyn VfsFile>) -> Box<dyn VfsFile> {
        let hooks = FileHooks {
            before_write: self.before_write.clone(),
            after_write: self.after_write.clone(),
            before_sync_data: self.before_sync_data.clone(),
            after_sync_data: self.after_sync_data.clone(),
        };
        if hooks.before_write.is_none()
            && hooks.after_write.is_none()
            && hooks.before_sync_data.is_none()
            && hooks.after_sync_data.is_none()
        {
            return file;
        }
        Box::new(HookedFile {
            inner: file,
            path: p.to_owned(),
            hooks,
        })
    }
}

impl std::fmt::Debug for HookedFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookedFs")
    }
}

/// A file system whose directory listings still show the raw name of every
/// compressed segment, as a listing read just before a compression would:
/// every reader then finds the raw file gone and must read the image.
#[allow(dead_code)] // not every test crate that includes this uses it
pub fn stale_listings() -> HookedFs {
    HookedFs {
        listing: Some(Box::new(|_, names| {
            names
                .into_iter()
                .map(|n| match n.to_str().and_then(|s| s.strip_suffix(".segz")) {
                    Some(stem) => format!("{stem}.seg").into(),
                    None => n,
                })
                .collect()
        })),
        ..HookedFs::default()
    }
}

impl Vfs for HookedFs {
    fn create_new(&self, p: &Path) -> io::Result<Box<dyn VfsFile>> {
        Ok(self.wrap(p, RealFs.create_new(p)?))
    }
    fn open(&self, p: &Path, w: bool) -> io::Result<Box<dyn VfsFile>> {
        Ok(self.wrap(p, RealFs.open(p, w)?))
    }
    fn read_file(&self, p: &Path) -> io::Result<Vec<u8>> {
        if let Some(hook) = &self.before_read_file {
            hook(p);
        }
        RealFs.read_file(p)
    }
    fn map(&self, p: &Path) -> io::Result<SegmentBytes> {
        if let Some(hook) = &self.before_map {
            hook(p);
        }
        let map = RealFs.map(p)?;
        if let Some(hook) = &self.after_map {
            hook(p);
        }
        Ok(map)
    }
    fn rename(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename(a, b)
    }
    fn rename_noreplace(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename_noreplace(a, b)
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        if let Some(hook) = &self.before_exchange {
            hook(a)?;
        }
        RealFs.exchange(a, b)
    }
    fn remove_file(&self, p: &Path) -> io::Result<()> {
        RealFs.remove_file(p)
    }
    fn remove_dir_all(&self, p: &Path) -> io::Result<()> {
        RealFs.remove_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> io::Result<()> {
        RealFs.create_dir(p)
    }
    fn sync_dir(&self, p: &Path) -> io::Result<()> {
        if let Some(hook) = &self.before_sync_dir {
            hook(p);
        }
        RealFs.sync_dir(p)
    }
    fn hard_link(&self, a: &Path, b: &Path) -> io::Result<()> {
        if let Some(hook) = &self.before_link {
            hook(a);
        }
        RealFs.hard_link(a, b)
    }
    fn read_dir(&self, p: &Path) -> io::Result<Vec<OsString>> {
        if let Some(hook) = &self.before_read_dir {
            hook(p)?;
        }
        let names = RealFs.read_dir(p)?;
        Ok(match &self.listing {
            Some(rewrite) => rewrite(p, names),
            None => names,
        })
    }
    fn metadata(&self, p: &Path) -> io::Result<Metadata> {
        let m = RealFs.metadata(p)?;
        Ok(match &self.metadata {
            Some(rewrite) => rewrite(p, m),
            None => m,
        })
    }
    fn symlink_metadata(&self, p: &Path) -> io::Result<Metadata> {
        RealFs.symlink_metadata(p)
    }
}
