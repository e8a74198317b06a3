//! A [`Vfs`](sessionlog::vfs::Vfs) whose directory listings are stale:
//! every compressed image (`.segz`) is listed under its raw segment's name,
//! as a listing read just before a compression's install would show it. The
//! raw file is gone, so every reader must fall back to the image. Shared by
//! the compression and archive tests.

use std::path::Path;

/// A file system whose directory listings still show the raw name of every
/// compressed segment, as a listing read just before a compression would:
/// every reader then finds the raw file gone and must read the image.
#[derive(Debug)]
pub struct StaleListings(pub sessionlog::vfs::RealFs);

impl sessionlog::vfs::Vfs for StaleListings {
    fn create_new(&self, p: &Path) -> std::io::Result<Box<dyn sessionlog::vfs::VfsFile>> {
        self.0.create_new(p)
    }
    fn open(&self, p: &Path, w: bool) -> std::io::Result<Box<dyn sessionlog::vfs::VfsFile>> {
        self.0.open(p, w)
    }
    fn read_file(&self, p: &Path) -> std::io::Result<Vec<u8>> {
        self.0.read_file(p)
    }
    fn map(&self, p: &Path) -> std::io::Result<sessionlog::vfs::SegmentBytes> {
        self.0.map(p)
    }
    fn rename(&self, a: &Path, b: &Path) -> std::io::Result<()> {
        self.0.rename(a, b)
    }
    fn rename_noreplace(&self, a: &Path, b: &Path) -> std::io::Result<()> {
        self.0.rename_noreplace(a, b)
    }
    fn exchange(&self, a: &Path, b: &Path) -> std::io::Result<()> {
        self.0.exchange(a, b)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        self.0.remove_file(p)
    }
    fn remove_dir_all(&self, p: &Path) -> std::io::Result<()> {
        self.0.remove_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> std::io::Result<()> {
        self.0.create_dir(p)
    }
    fn sync_dir(&self, p: &Path) -> std::io::Result<()> {
        self.0.sync_dir(p)
    }
    fn hard_link(&self, a: &Path, b: &Path) -> std::io::Result<()> {
        self.0.hard_link(a, b)
    }
    fn read_dir(&self, p: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
        let names = self.0.read_dir(p)?;
        Ok(names
            .into_iter()
            .map(|n| match n.to_str().and_then(|s| s.strip_suffix(".segz")) {
                Some(stem) => format!("{stem}.seg").into(),
                None => n,
            })
            .collect())
    }
    fn metadata(&self, p: &Path) -> std::io::Result<sessionlog::vfs::Metadata> {
        self.0.metadata(p)
    }
    fn symlink_metadata(&self, p: &Path) -> std::io::Result<sessionlog::vfs::Metadata> {
        self.0.symlink_metadata(p)
    }
}
