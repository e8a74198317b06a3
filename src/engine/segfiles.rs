//! The segment files of a session directory: raw segments (`.seg`) and the
//! compressed images sealed ones may be stored as (`.segz`, see
//! [`compress`](super::compress)). Every reader finds, maps and reads them
//! here, so each follows the one rule: a raw file is preferred over an
//! image of the same segment (both exist only between a compression's
//! rename and its removal of the raw file), and a raw file found gone is
//! read from its image (it was removed only after the image was durable).

use super::error::{Error, Result, io_at, segment_error};
use super::handle::Store;
use super::remote::Remote;
use super::session::Seg;
use crate::segment::{self, SegmentIdent};
use crate::vfs::SegmentBytes;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The segment files among `names` (the entries of directory `dir`), by
/// first seq, oldest first; a raw file wins over an image of its segment.
pub(super) fn list(names: Vec<OsString>, dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut files: Vec<(u64, bool, PathBuf)> = names
        .into_iter()
        .filter_map(|name| {
            let name = name.into_string().ok()?;
            let (seq, image) = match segment::parse_segment_file_name(&name) {
                Some(seq) => (seq, false),
                None => (segment::parse_image_file_name(&name)?, true),
            };
            Some((seq, image, dir.join(name)))
        })
        .collect();
    files.sort();
    files.dedup_by_key(|(seq, _, _)| *seq);
    files.into_iter().map(|(seq, _, p)| (seq, p)).collect()
}

/// Whether `path` names a compressed segment image.
pub(super) fn is_image(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "segz")
}

/// The image that replaced raw segment file `path`, if `path` is raw.
pub(super) fn image_of(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let seq = segment::parse_segment_file_name(name)?;
    Some(path.with_file_name(segment::image_file_name(seq)))
}

/// A file read at `path`, or at the image of `path` when `path` is a raw
/// segment found gone; returns the path read.
fn with_fallback<T>(
    path: &Path,
    mut read: impl FnMut(&Path) -> std::io::Result<T>,
) -> std::result::Result<(PathBuf, T), (PathBuf, std::io::Error)> {
    match read(path) {
        Ok(v) => Ok((path.to_owned(), v)),
        Err(e) if e.kind() == ErrorKind::NotFound => match image_of(path) {
            Some(image) => match read(&image) {
                Ok(v) => Ok((image, v)),
                // Neither: report the file asked for.
                Err(e2) if e2.kind() == ErrorKind::NotFound => Err((path.to_owned(), e)),
                Err(e2) => Err((image, e2)),
            },
            None => Err((path.to_owned(), e)),
        },
        Err(e) => Err((path.to_owned(), e)),
    }
}

/// Links segment file `path` (a raw segment or an image) into directory
/// `to` under its own name, or its image when the raw file is found gone
/// (a fork sharing a segment its parent's writer compressed meanwhile).
pub(super) fn link_into(vfs: &dyn crate::vfs::Vfs, path: &Path, to: &Path) -> Result<()> {
    with_fallback(path, |p| {
        let name = p.file_name().ok_or(ErrorKind::InvalidInput)?;
        vfs.hard_link(p, &to.join(name))
    })
    .map(drop)
    .map_err(|(p, e)| io_at(&p)(e))
}

impl Store {
    /// Segment `first_seq` of session `id` at `path`: a raw file mapped, or
    /// an image whose decoded bytes are made on first read (and checked
    /// whole then, against `ident`), like an archived segment's.
    pub(super) fn open_seg(
        &self,
        id: &str,
        first_seq: u64,
        path: &Path,
        ident: SegmentIdent,
    ) -> Result<Seg> {
        let vfs = &*self.inner.vfs;
        if !is_image(path) {
            match vfs.map(path) {
                Ok(map) => return Ok(Seg::local(first_seq, path.to_owned(), map)),
                Err(e) if e.kind() != ErrorKind::NotFound => return Err(io_at(path)(e)),
                Err(e) => {
                    // Compressed since the listing: the local image, before
                    // asking the archive.
                    if let Some(image) = image_of(path).filter(|i| vfs.exists(i)) {
                        return self.open_image(id, first_seq, &image, ident);
                    }
                    // Issue 17: evicted after the directory was listed.
                    if self.archive_fetch(path) {
                        let map = self.map_file(path)?;
                        return Ok(Seg::local(first_seq, path.to_owned(), map));
                    }
                    return Err(io_at(path)(e));
                }
            }
        }
        match self.open_image(id, first_seq, path, ident) {
            // Issue 17: an image evicted after the directory was listed;
            // the bucket holds the segment raw.
            Err(Error::Io { path: at, source }) if source.kind() == ErrorKind::NotFound => {
                let raw = path.with_file_name(segment::segment_file_name(first_seq));
                if self.archive_fetch(&raw) {
                    let map = self.map_file(&raw)?;
                    return Ok(Seg::local(first_seq, raw, map));
                }
                Err(Error::Io { path: at, source })
            }
            other => other,
        }
    }

    fn open_image(
        &self,
        id: &str,
        first_seq: u64,
        path: &Path,
        ident: SegmentIdent,
    ) -> Result<Seg> {
        let zmap = self.inner.vfs.map(path).map_err(io_at(path))?;
        let len = segment::image_len(&zmap).map_err(|e| segment_error(id, path, e))?;
        let (id, at) = (id.to_owned(), path.to_owned());
        let decode = std::sync::Arc::new(move || {
            segment::decode_image(&zmap, &ident)
                .map(SegmentBytes::new)
                .map_err(|e| segment_error(&id, &at, e))
        });
        Ok(Seg::remote(
            first_seq,
            path.to_owned(),
            Remote::image(len, decode, self.inner.decoded.clone()),
        ))
    }

    /// The bytes of segment file `path` of session `id`, read afresh
    /// (decoded and checked whole against `ident` if it is an image; the
    /// image read if `path` is a raw file found gone), and the path read.
    pub(super) fn read_seg_file(
        &self,
        id: &str,
        path: &Path,
        ident: &SegmentIdent,
    ) -> Result<(PathBuf, Vec<u8>)> {
        let vfs = &*self.inner.vfs;
        let (at, bytes) =
            with_fallback(path, |p| vfs.read_file(p)).map_err(|(p, e)| io_at(&p)(e))?;
        if !is_image(&at) {
            return Ok((at, bytes));
        }
        let raw = segment::decode_image(&bytes, ident).map_err(|e| segment_error(id, &at, e))?;
        Ok((at, raw))
    }
}
