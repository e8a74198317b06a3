//! A [`Vfs`](sessionlog::vfs::Vfs) over the real file system with hooks,
//! so a test can make a race happen at one exact operation: a directory
//! listing shown stale, a file removed just before it is mapped or cut
//! just after, another handle's change just before a hard link. Shared by
//! the compression, archive, fork and seal-window tests.

use sessionlog::vfs::{Metadata, RealFs, SegmentBytes, Vfs, VfsFile};
use std::ffi::OsString;
use std::io;
use std::path::Path;

type Listing = Box<dyn Fn(&Path, Vec<OsString>) -> Vec<OsString> + Send + Sync>;
type Hook = Box<dyn Fn(&Path) + Send + Sync>;
type Gate = Box<dyn Fn(&Path) -> io::Result<()> + Send + Sync>;
type Rewrite = Box<dyn Fn(&Path, Metadata) -> Metadata + Send + Sync>;

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
        RealFs.create_new(p)
    }
    fn open(&self, p: &Path, w: bool) -> io::Result<Box<dyn VfsFile>> {
        RealFs.open(p, w)
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
