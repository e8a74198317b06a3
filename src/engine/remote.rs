//! A sealed segment whose bytes are not mapped from the session directory:
//! one in the archive only (issue 17), known at load by its first seq and
//! length (from the bucket's listing) and fetched when a read needs its
//! bytes, or one stored as a compressed image (`segfiles.rs`), decoded when
//! a read needs its bytes.
//!
//! Reads that can fail cleanly fetch first (the batch cursor of reads and
//! iteration, one segment as its first batch is read;
//! [`Session::fetch_nodes`] for derive; [`Session::fetch_archived`] for
//! verify), so a missing or damaged object is an error naming the session,
//! the segment and the key.
//! Every other access to [`Seg::map`] fetches on first touch too (the map
//! of a remote segment is a [`LazyBytes`]), so no reader can see a
//! segment's bytes missing because it forgot to ask.

use super::error::Result;
use super::session::{Seg, Session};
use crate::vfs::SegmentBytes;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Fetches the segment (durably, into the session directory) and maps it.
pub(crate) type FetchFn = Box<dyn Fn() -> Result<SegmentBytes> + Send + Sync>;

/// Decodes a compressed segment image (`segfiles.rs`); shared, so a
/// fresh unfetched copy of the segment can be made.
pub(crate) type DecodeFn = Arc<dyn Fn() -> Result<SegmentBytes> + Send + Sync>;

/// Where a lazy segment's bytes come from.
enum Source {
    /// The archive: fetched once into the session directory, then mapped.
    Archive(FetchFn),
    /// A compressed image in the session directory: decoded into memory,
    /// so a copy that drops its decoded bytes can be made (see
    /// [`Seg::released`]). The counter is the handle's bytes of decoded
    /// images (`Inner::decoded`), kept true by [`Remote::get`] and the
    /// drop of a decoded [`Remote`].
    Image(DecodeFn, Arc<AtomicU64>),
}

/// One remote segment: its length, and its bytes once fetched.
pub(crate) struct Remote {
    len: u64,
    source: Source,
    bytes: OnceLock<SegmentBytes>,
    /// One fetch at a time per segment within a handle (other handles and
    /// processes are kept apart by unique temporary names and the rename).
    fetching: Mutex<()>,
}

impl Remote {
    pub(crate) fn new(len: u64, fetch: FetchFn) -> Arc<Remote> {
        Remote::with(len, Source::Archive(fetch))
    }

    /// A segment stored as a compressed image, decoded by `decode`; the
    /// bytes it decodes are counted in `decoded` while they live.
    pub(crate) fn image(len: u64, decode: DecodeFn, decoded: Arc<AtomicU64>) -> Arc<Remote> {
        Remote::with(len, Source::Image(decode, decoded))
    }

    fn with(len: u64, source: Source) -> Arc<Remote> {
        Arc::new(Remote {
            len,
            source,
            bytes: OnceLock::new(),
            fetching: Mutex::new(()),
        })
    }

    /// The segment's bytes, fetched on first call.
    pub(crate) fn get(&self) -> Result<&SegmentBytes> {
        if let Some(b) = self.bytes.get() {
            return Ok(b);
        }
        let _one = self
            .fetching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(b) = self.bytes.get() {
            return Ok(b);
        }
        let b = match &self.source {
            Source::Archive(fetch) => fetch()?,
            Source::Image(decode, decoded) => {
                let b = decode()?;
                decoded.fetch_add(b.len() as u64, Ordering::Relaxed);
                b
            }
        };
        Ok(self.bytes.get_or_init(|| b))
    }

    /// Whether the bytes were fetched.
    pub(crate) fn resident(&self) -> bool {
        self.bytes.get().is_some()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let (Source::Image(_, decoded), Some(b)) = (&self.source, self.bytes.get()) {
            decoded.fetch_sub(b.len() as u64, Ordering::Relaxed);
        }
    }
}

/// The map of a remote segment: its bytes, fetched on first touch. A fetch
/// that fails here reads as an empty segment (the caller then reports data
/// missing); the reads that fetch first report the archive's error.
pub(crate) struct LazyBytes(pub(crate) Arc<Remote>);

impl Deref for LazyBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.get().map_or(&[], |b| &b[..])
    }
}

impl Seg {
    /// A segment mapped from the session directory.
    pub(super) fn local(first_seq: u64, path: PathBuf, map: SegmentBytes) -> Seg {
        Seg {
            first_seq,
            path,
            map,
            remote: None,
        }
    }

    /// A segment in the archive only, fetched when first read.
    pub(super) fn remote(first_seq: u64, path: PathBuf, remote: Arc<Remote>) -> Seg {
        Seg {
            first_seq,
            path,
            map: SegmentBytes::new(LazyBytes(remote.clone())),
            remote: Some(remote),
        }
    }

    /// The segment's length, without fetching it.
    pub(super) fn len(&self) -> u64 {
        match &self.remote {
            Some(r) => r.len,
            None => self.map.len() as u64,
        }
    }

    /// Whether the segment is in the archive only, not fetched yet.
    pub(super) fn is_remote(&self) -> bool {
        self.remote.as_ref().is_some_and(|r| !r.resident())
    }

    /// Decoded bytes of a compressed image this segment holds in memory
    /// (0 for anything else).
    pub(super) fn decoded_bytes(&self) -> u64 {
        match &self.remote {
            Some(r) if matches!(r.source, Source::Image(..)) && r.resident() => r.len,
            _ => 0,
        }
    }

    /// A fresh, undecoded copy of this segment if it is a compressed image
    /// (its decode function shared), `None` for anything else.
    fn fresh_image(&self) -> Option<Seg> {
        let r = self.remote.as_ref()?;
        let Source::Image(decode, decoded) = &r.source else {
            return None;
        };
        let fresh = Remote::image(r.len, decode.clone(), decoded.clone());
        Some(Seg::remote(self.first_seq, self.path.clone(), fresh))
    }

    /// The same segment without its decoded bytes, if it is a compressed
    /// image that holds them: reads through the copy decode it again. Any
    /// clone of `self` (a read in progress, a derived snapshot) keeps the
    /// old bytes alive until it is dropped, so nothing it borrows goes away.
    pub(super) fn released(&self) -> Option<Seg> {
        self.remote.as_ref().filter(|r| r.resident())?;
        self.fresh_image()
    }

    /// A copy for a reader of its own: a compressed image not decoded yet
    /// gets a fresh source, so decoding it fills the copy, not `self`;
    /// anything else is shared.
    pub(super) fn private(&self) -> Seg {
        match &self.remote {
            Some(r) if !r.resident() => self.fresh_image().unwrap_or_else(|| self.clone()),
            _ => self.clone(),
        }
    }

    /// Fetches the segment if it is remote.
    pub(super) fn fetch(&self) -> Result<()> {
        match &self.remote {
            Some(r) => r.get().map(drop),
            None => Ok(()),
        }
    }
}

impl Session {
    /// Fetches the remote segments holding the data of live surface nodes
    /// (what derive reads in place), and clears `refetch`. The node
    /// locations must be decoded.
    pub(super) fn fetch_nodes(&mut self) -> Result<()> {
        if !self.segs.iter().any(Seg::is_remote) {
            self.refetch = false;
            return Ok(());
        }
        // The node locations keep shadowed nodes too: only the surface's
        // live nodes are read by derive.
        let mut wanted: Vec<u64> = self
            .state
            .surface()
            .iter()
            .filter_map(|seq| Some(self.node_locs.get(seq)?.segment))
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        for seg in &self.segs {
            if seg.is_remote() && wanted.binary_search(&seg.first_seq).is_ok() {
                seg.fetch()?;
            }
        }
        self.refetch = false;
        Ok(())
    }

    /// Fetches every segment that is only in the archive (compressed
    /// images are decoded by whoever reads them).
    pub(super) fn fetch_archived(&self) -> Result<()> {
        self.segs
            .iter()
            .filter(|g| {
                g.remote
                    .as_ref()
                    .is_some_and(|r| matches!(r.source, Source::Archive(_)))
            })
            .try_for_each(Seg::fetch)
    }

    /// Drops the decoded bytes of this session's compressed images (a
    /// whole-log read or a rebuild decodes them all); the next read that
    /// needs one decodes it again. Derive's working set is kept apart:
    /// [`Session::fetch_nodes`] decodes what derive reads, and a derive
    /// holds its own clones.
    pub(super) fn release_images(&mut self) {
        for seg in &mut self.segs {
            if let Some(fresh) = seg.released() {
                *seg = fresh;
                self.refetch = true;
            }
        }
    }

    /// Bytes of compressed images this session holds decoded.
    pub(super) fn decoded_bytes(&self) -> u64 {
        self.segs.iter().map(Seg::decoded_bytes).sum()
    }
}
