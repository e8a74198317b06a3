//! The archive hooks without the `archive` feature: no archive, so every
//! call does nothing (see `archive/hooks.rs` for what they do with it).

use crate::engine::error::Result;
use crate::engine::handle::Store;
use crate::engine::options::Options;
use crate::vfs::Vfs;
use std::path::Path;
use std::sync::Arc;

/// No archive to keep.
pub(crate) type Slot = ();

/// No bucket to list.
pub(crate) struct Listed;

/// Nothing to set up.
pub(crate) fn before_open(
    _dir: &Path,
    _options: &Options,
    _vfs: &Arc<dyn Vfs>,
    _read_only: bool,
) -> Result<Option<()>> {
    Ok(None)
}

/// Nothing to start.
pub(crate) fn after_open(_store: &Store, _archive: Option<()>) -> Result<()> {
    Ok(())
}

impl Store {
    pub(crate) fn archive_lease(&self, _id: &str, _deleting: Option<&[u8; 16]>) -> Result<()> {
        Ok(())
    }
    pub(crate) fn archive_check(&self, _id: &str) -> Result<()> {
        Ok(())
    }
    pub(crate) fn archive_restore(&self, _id: &str, _dir: &Path) -> Result<Vec<(u64, u64)>> {
        Ok(Vec::new())
    }
    pub(crate) fn archive_lazy(
        &self,
        _id: &str,
        _path: &Path,
        _ident: crate::segment::SegmentIdent,
    ) -> Option<crate::engine::remote::FetchFn> {
        None
    }
    pub(crate) fn archive_fetch(&self, _path: &Path) -> bool {
        false
    }
    pub(crate) fn archive_refresh(&self) -> Result<Listed> {
        Ok(Listed)
    }
    pub(crate) fn archive_unlist(
        &self,
        _remote: &Listed,
        _sessions: &mut [crate::engine::registry::SessionEntry],
    ) -> Result<()> {
        Ok(())
    }
    pub(crate) fn archive_quiet(&self) -> Option<()> {
        None
    }
    pub(crate) fn archive_forget(&self, _id: &str, _keep_whole: Option<&Path>) -> Result<()> {
        Ok(())
    }
    pub(crate) fn archive_deleted(&self, _id: &str, _uid: &[u8; 16]) -> Result<()> {
        Ok(())
    }
    pub(crate) fn archive_close(&self) -> Result<()> {
        Ok(())
    }
}
