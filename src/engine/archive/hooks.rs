//! The calls the engine makes into the archive, each one line at its call
//! site (`handle.rs`, `load.rs`, `write.rs`). Without the `archive` feature
//! `off.rs` defines the same calls as no-ops.

use super::{Archive, dir_name};
use crate::engine::error::{Error, Result};
use crate::engine::handle::Store;
use crate::engine::options::Options;
use crate::segment::SegmentIdent;
use crate::vfs::Vfs;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The session directories the bucket has, as a listing found them.
pub(crate) type Listed = std::collections::HashSet<String>;

/// The archive of a store handle, set once when the store is opened.
pub(crate) type Slot = OnceLock<Arc<Archive>>;

/// Before the store directory is opened: the archive is set up and, for a
/// new directory on a prefix that holds a store, the bucket's `MANIFEST`
/// adopted. A read-only handle does not use the archive.
pub(crate) fn before_open(
    dir: &Path,
    options: &Options,
    vfs: &Arc<dyn Vfs>,
    read_only: bool,
) -> Result<Option<Arc<Archive>>> {
    let (Some(opts), false) = (&options.archive, read_only) else {
        return Ok(None);
    };
    let archive = Archive::new(opts.clone(), dir, vfs.clone()).map_err(|source| Error::Io {
        path: dir.to_owned(),
        source,
    })?;
    archive.adopt_manifest(dir)?;
    Ok(Some(Arc::new(archive)))
}

/// After the store is open: its `MANIFEST` published (or checked), the
/// sessions other hosts created brought in (their headers: `list` shows
/// them), the leases this host held before a restart taken back, and the
/// uploader started.
pub(crate) fn after_open(store: &Store, archive: Option<Arc<Archive>>) -> Result<()> {
    let Some(archive) = archive else {
        return Ok(());
    };
    archive.publish_manifest(&archive.store_dir)?;
    let mut local: Vec<String> = match archive.vfs.read_dir(&archive.sessions_dir) {
        Ok(names) => names
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect(),
        Err(_) => Vec::new(),
    };
    for name in archive.remote_sessions()? {
        archive.hydrate(&store.inner.registry, &name)?;
    }
    // Sessions this host held when it stopped (a crash, or a drop without
    // close) are its own again: their uploads resume. Hydrated sessions
    // are another host's, so only those local before are asked about. A
    // session another process of this host is writing now (its local
    // writer lock held) stays that process's: this handle neither uploads
    // it nor gives its lease up at close (the lease is the host's, shared
    // by its processes).
    let ids: std::collections::HashMap<String, String> = store
        .inner
        .registry
        .scan()
        .map(|(sessions, _)| sessions)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| Some((e.dir.file_name()?.to_str()?.to_owned(), e.header.id)))
        .collect();
    let written_elsewhere = |name: &str| {
        let (Some(id), Some(locks)) = (ids.get(name), &store.inner.locks) else {
            return false;
        };
        matches!(locks.try_lock(id), Ok(None))
    };
    local.sort();
    for name in local {
        if let Some(rec) = archive.current_lease(&name, &name)?
            && rec.host == archive.host
            && !rec.released
            && !written_elsewhere(&name)
        {
            archive.state().held.insert(name, rec.epoch);
        }
    }
    if let Some(locks) = &store.inner.locks {
        let _ = archive.locks.set(locks.clone());
    }
    archive.start_uploader();
    let _ = store.inner.archive.set(archive);
    Ok(())
}

impl Store {
    fn archive(&self) -> Option<&Arc<Archive>> {
        self.inner.archive.get()
    }

    /// Before the first write of session `id` through this handle (its
    /// local writer lock held): the session's lease is taken, or
    /// [`Error::NotOwner`] returned before a byte is written. A session
    /// another host created is brought in first; one taken over from
    /// another host has its local files brought up to the bucket's.
    /// `deleting`: the caller is deleting the local session of this uid,
    /// so a tombstone does not refuse a stale copy (deleting it is what
    /// [`Error::DeletedElsewhere`] asks for); nor does another host's
    /// lease when the bucket holds another incarnation of the id (the copy
    /// is stale: [`Error::ReplacedElsewhere`]): deleting it then touches
    /// nothing of the bucket ([`Store::archive_deleted`]), so that host's
    /// lease has nothing to fence.
    pub(crate) fn archive_lease(&self, id: &str, deleting: Option<&[u8; 16]>) -> Result<()> {
        let taken = self.archive_take(id, false, deleting.is_some());
        let (Err(Error::NotOwner { .. }), Some(uid), Some(a), Some(dir)) =
            (&taken, deleting, self.archive(), dir_name(id))
        else {
            return taken;
        };
        match a.remote_uid(id, &dir) {
            Ok(Some(remote)) if &remote != uid => Ok(()),
            _ => taken,
        }
    }

    fn archive_take(&self, id: &str, force: bool, deleting: bool) -> Result<()> {
        let Some(a) = self.archive() else {
            return Ok(());
        };
        let Some(dir) = dir_name(id) else {
            return Ok(()); // refused later, naming the id
        };
        {
            let st = a.state();
            if st.held.contains_key(&dir) {
                return Ok(());
            }
            if let (Some((owner, epoch)), false) = (st.fenced.get(&dir), force) {
                return Err(Error::NotOwner {
                    session: id.to_owned(),
                    owner: owner.clone(),
                    epoch: *epoch,
                    key: a.opts.lease_key(&dir, *epoch).to_string(),
                });
            }
        }
        a.hydrate(&self.inner.registry, &dir)?;
        let local = a.sessions_dir.join(&dir);
        let stale_copy = !deleting && a.vfs.exists(&local);
        let taken = a.take_lease(id, &dir, force, stale_copy)?;
        // Another holder may have written since this handle last looked:
        // what it recorded of the session's objects is stale.
        a.state().forget_objects(&dir);
        let from_elsewhere = taken.previous.as_ref().is_some_and(|p| p.host != a.host);
        // A copy about to be deleted is not brought up to the bucket's.
        if from_elsewhere && !deleting && a.vfs.exists(&local) {
            // The previous owner may have written more since this copy was
            // made: what it uploaded wins over a stale local copy.
            if let Err(e) = a.restore(id, &local, true).map(drop) {
                let _ = a.release_lease(id, &dir, taken.epoch);
                return Err(e);
            }
        }
        let mut st = a.state();
        st.fenced.remove(&dir);
        st.held.insert(dir, taken.epoch);
        Ok(())
    }

    /// Before an append: a session whose lease another host took fails
    /// with [`Error::NotOwner`] (a memory lookup: the uploader's pass finds
    /// the loss).
    pub(crate) fn archive_check(&self, id: &str) -> Result<()> {
        let Some(a) = self.archive() else {
            return Ok(());
        };
        let st = a.state();
        if st.fenced.is_empty() {
            return Ok(());
        }
        let Some(dir) = dir_name(id) else {
            return Ok(());
        };
        match st.fenced.get(&dir) {
            Some((owner, epoch)) => Err(Error::NotOwner {
                session: id.to_owned(),
                owner: owner.clone(),
                epoch: *epoch,
                key: a.opts.lease_key(&dir, *epoch).to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Before a session is loaded from `dir`: the checkpoint, lineage and
    /// tail segments the bucket has and the directory lacks are fetched;
    /// the older segments it lacks are returned as `(first seq, length)`,
    /// fetched when a read needs them ([`Store::archive_lazy`]).
    pub(crate) fn archive_restore(&self, id: &str, dir: &Path) -> Result<Vec<(u64, u64)>> {
        match self.archive() {
            Some(a) => a.restore(id, dir, false),
            None => Ok(Vec::new()),
        }
    }

    /// How segment `path` of session `id` (identity `ident`), in the
    /// archive only, is fetched when a read needs it.
    pub(crate) fn archive_lazy(
        &self,
        id: &str,
        path: &Path,
        ident: SegmentIdent,
    ) -> Option<crate::engine::remote::FetchFn> {
        let a = self.archive()?.clone();
        let (id, path) = (id.to_owned(), path.to_owned());
        Some(Box::new(move || a.fetch_lazy(&id, &path, &ident)))
    }

    /// A segment file that is missing (evicted after it was listed) is
    /// fetched; returns whether it was.
    pub(crate) fn archive_fetch(&self, path: &Path) -> bool {
        self.archive()
            .is_some_and(|a| a.fetch_segment(path).unwrap_or(false))
    }

    /// Before `list`: sessions other hosts created since are brought in.
    /// Returns the session directories the bucket has.
    pub(crate) fn archive_refresh(&self) -> Result<Listed> {
        let Some(a) = self.archive() else {
            return Ok(Listed::new());
        };
        let names = a.remote_sessions()?;
        for name in &names {
            a.hydrate(&self.inner.registry, name)?;
        }
        Ok(names.into_iter().collect())
    }

    /// Leaves out of a listing the local copies of sessions deleted on
    /// another host since they were made (format-spec.md 10.3): the bucket
    /// (`remote`, from [`Store::archive_refresh`]) holds nothing of the
    /// session, this handle does not hold its lease, and the lease's newest
    /// record is a tombstone, the same test a load of the copy makes
    /// before it refuses it. The copies stay on disk as they are. One lease
    /// read per local session the bucket lacks and this handle does not
    /// write (a session not uploaded yet, or one of these).
    pub(crate) fn archive_unlist(
        &self,
        remote: &Listed,
        sessions: &mut Vec<crate::engine::registry::SessionEntry>,
    ) -> Result<()> {
        let Some(a) = self.archive() else {
            return Ok(());
        };
        let mut kept = Vec::with_capacity(sessions.len());
        for e in sessions.drain(..) {
            let Some(dir) = dir_name(&e.header.id) else {
                kept.push(e);
                continue;
            };
            let asks = !remote.contains(&dir) && !a.state().held.contains_key(&dir);
            if asks
                && a.current_lease(&e.header.id, &dir)?
                    .is_some_and(|r| r.deleted)
            {
                continue;
            }
            kept.push(e);
        }
        *sessions = kept;
        Ok(())
    }

    /// Holds off this handle's upload passes (uploads and evictions) while
    /// the caller deletes a session's objects and changes its directory. A
    /// pass in between would upload a replaced session's old files again
    /// (and record them, so the new ones under the same names would not
    /// go up), or evict a segment the forget had just found local. Taken
    /// after the session's slot, never the other way round (a pass takes
    /// no session).
    pub(crate) fn archive_quiet(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        let a = self.archive()?;
        Some(
            a.passes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Session `id` is deleted (or about to be replaced): its objects are
    /// deleted from the bucket, `HEADER` first (so no host brings in a
    /// half-deleted session), and what this handle recorded of them
    /// forgotten. The lease stays (this handle keeps writing the id).
    /// `keep_whole`: the session's local directory when it stays until a
    /// later step succeeds (a replace's exchange): what only the bucket
    /// holds of it is fetched there first.
    pub(crate) fn archive_forget(&self, id: &str, keep_whole: Option<&Path>) -> Result<()> {
        let (Some(a), Some(dir)) = (self.archive(), dir_name(id)) else {
            return Ok(());
        };
        a.forget(id, &dir, keep_whole)
    }

    /// Session `id` was deleted here (its directory is gone): its objects
    /// are deleted ([`Store::archive_forget`]), then its lease given up as
    /// a tombstone, so no store holding an older copy writes it back
    /// ([`Error::DeletedElsewhere`]); a new session of the id takes the
    /// lease past it.
    ///
    /// `uid`: the deleted session's. When the bucket holds another
    /// incarnation of the id (this copy was stale: the session was deleted
    /// or replaced elsewhere and created again), only the local copy was
    /// deleted: the bucket's session is left alone, and no tombstone
    /// written. The check needs no race guard: this handle holds the lease,
    /// so no other host writes the session meanwhile.
    pub(crate) fn archive_deleted(&self, id: &str, uid: &[u8; 16]) -> Result<()> {
        let (Some(a), Some(dir)) = (self.archive(), dir_name(id)) else {
            return Ok(());
        };
        if a.remote_uid(id, &dir)?.is_some_and(|remote| &remote != uid) {
            return Ok(());
        }
        // Without the lease (a stale copy deleted while another host holds
        // the id's lease: [`Store::archive_lease`]) nothing of the bucket
        // is touched: that host may be uploading a new incarnation.
        let Some(epoch) = a.state().held.get(&dir).copied() else {
            return Ok(());
        };
        a.forget(id, &dir, None)?;
        a.state().held.remove(&dir);
        a.tombstone(id, &dir, epoch)
    }

    /// At close, after every session is released: everything local goes to
    /// the bucket (active segments included), then the leases are given
    /// up so another host can take the sessions without forcing.
    pub(crate) fn archive_close(&self) -> Result<()> {
        let Some(a) = self.archive() else {
            return Ok(());
        };
        a.stop_uploader();
        let passed = a.pass(true);
        let held: Vec<(String, u64)> = a.state().held.drain().collect();
        let mut released = Ok(());
        for (dir, epoch) in held {
            if let Err(e) = a.release_lease(&dir, &dir, epoch) {
                released = released.and(Err(e));
            }
        }
        passed.map(|_| ()).and(released)
    }

    /// Uploads now what the background uploader would, plus the active
    /// segments (the bytes written so far), and applies the eviction
    /// policy: after it returns, another host resuming a session this
    /// handle holds sees every append synced before the call. Requires the
    /// `archive` feature and [`Options::archive`].
    pub fn archive_sync(&self) -> Result<super::ArchiveReport> {
        self.writable()?;
        let a = self.archive().ok_or(Error::NoArchive)?;
        crate::engine::handle::sync_dirty(&self.inner.sessions)?;
        a.pass(true)
    }

    /// The archive's counters since this handle opened the store (`None`
    /// without an archive).
    pub fn archive_stats(&self) -> Option<super::ArchiveStats> {
        self.archive().map(|a| a.stats())
    }

    /// Takes session `id` over from whichever host holds its lease: for a
    /// host that is gone (it never released the session). The host that
    /// held it gets [`Error::NotOwner`] on its next append once its
    /// uploader notices, and its uploads of the session stop. This handle
    /// must not have the session loaded for writing.
    pub fn take_over(&self, id: &str) -> Result<()> {
        self.writable()?;
        self.archive().ok_or(Error::NoArchive)?;
        self.archive_take(id, true, false)
    }
}
