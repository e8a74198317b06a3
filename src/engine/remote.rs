//! A sealed segment that is not in the session directory but is in the
//! archive (issue 17): known at load by its first seq and length (from the
//! bucket's listing), fetched only when a read needs its bytes.
//!
//! Reads that can fail cleanly fetch first (the batch cursor of reads and
//! iteration, one segment as its first batch is read;
//! [`Session::fetch_nodes`] for derive; [`Session::fetch_all`] for
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
use std::sync::{Arc, Mutex, OnceLock};

/// Fetches the segment (durably, into the session directory) and maps it.
pub(crate) type FetchFn = Box<dyn Fn() -> Result<SegmentBytes> + Send + Sync>;

/// One remote segment: its length, and its bytes once fetched.
pub(crate) struct Remote {
    len: u64,
    fetch: FetchFn,
    bytes: OnceLock<SegmentBytes>,
    /// One fetch at a time per segment within a handle (other handles and
    /// processes are kept apart by unique temporary names and the rename).
    fetching: Mutex<()>,
}

impl Remote {
    pub(crate) fn new(len: u64, fetch: FetchFn) -> Arc<Remote> {
        Arc::new(Remote {
            len,
            fetch,
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
        let b = (self.fetch)()?;
        Ok(self.bytes.get_or_init(|| b))
    }

    /// Whether the bytes were fetched.
    pub(crate) fn resident(&self) -> bool {
        self.bytes.get().is_some()
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
    /// (what derive reads in place). The node locations must be decoded.
    pub(super) fn fetch_nodes(&self) -> Result<()> {
        if !self.segs.iter().any(Seg::is_remote) {
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
        Ok(())
    }

    /// Fetches every remote segment.
    pub(super) fn fetch_all(&self) -> Result<()> {
        self.segs.iter().try_for_each(Seg::fetch)
    }
}
