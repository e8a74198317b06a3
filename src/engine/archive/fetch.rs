//! Bringing the bucket's contents into the store directory: the store's
//! identity (`MANIFEST`), sessions other hosts created, and segments that
//! are not (or no longer) local. Every file fetched is written whole under
//! a temporary name, `fsync`ed, renamed into place and its directory
//! `fsync`ed ([`crate::fsutil::write_atomic_with`]): a crash leaves either
//! no file or the whole one, never a prefix the loader would take for a
//! torn tail.

use super::{Archive, archive_error};
use crate::checkpoint::CHECKPOINT_FILE;
use crate::engine::error::{Error, Result, io_at};
use crate::engine::registry::{HEADER_FILE, PublishError, Registry, decode_header};
use crate::lineage::LINEAGE_FILE;
use crate::manifest::{MANIFEST_FILE, Manifest, STORE_FORMAT_OLDEST};
use crate::segment;
use std::path::Path;
use std::sync::atomic::Ordering;

impl Archive {
    /// Before a store directory is opened: if it has no `MANIFEST` and the
    /// bucket has one, that one is written into it, so every host sharing
    /// the prefix uses one store id (segments are salted with it: a
    /// segment written under another id would not be accepted).
    pub(super) fn adopt_manifest(&self, store_dir: &Path) -> Result<()> {
        let local = store_dir.join(MANIFEST_FILE);
        if self.vfs.exists(&local) {
            return Ok(());
        }
        let key = self.opts.manifest_key();
        let Some(bytes) = self
            .get(&key)
            .map_err(|e| archive_error(None, &key, "reading the store's manifest", e))?
        else {
            return Ok(());
        };
        // A store is created only in a missing or empty directory: the
        // manifest goes first, like a local creation's.
        if !self.vfs.exists(store_dir) {
            std::fs::create_dir_all(store_dir).map_err(io_at(store_dir))?;
        }
        crate::fsutil::write_atomic_with(&*self.vfs, store_dir, MANIFEST_FILE, &bytes)
            .map_err(io_at(&local))
    }

    /// After the store is open: the bucket gets this store's `MANIFEST` if
    /// it has none; one naming another store is refused (two stores
    /// sharing a prefix would mix sessions). The bucket's copy says which
    /// store the prefix holds: its store id is compared, not its version
    /// (a host may have raised its local store to version 4 for images,
    /// which stay local: the bucket's copy is always the version-3 form,
    /// what every build that reads the bucket reads).
    pub(super) fn publish_manifest(&self, store_dir: &Path) -> Result<()> {
        let local = store_dir.join(MANIFEST_FILE);
        let key = self.opts.manifest_key();
        let ours = Manifest::open_with(&*self.vfs, store_dir)?;
        let bucket_form = Manifest {
            version: STORE_FORMAT_OLDEST,
            ..ours
        }
        .encode()
        .to_vec();
        let put = self.put_if_absent(&key, bucket_form);
        match put {
            Ok(true) => Ok(()),
            // Another store's, or ours uploaded before (a retried create
            // whose first answer was lost finds its own object).
            Ok(false) => {
                let theirs = self
                    .get(&key)
                    .map_err(|e| archive_error(None, &key, "reading the store's manifest", e))?;
                let theirs = theirs
                    .as_deref()
                    .map(|b| Manifest::decode(b, Path::new(key.as_ref())));
                match theirs {
                    Some(Ok(m)) if m.store_id == ours.store_id => Ok(()),
                    Some(Err(e)) => Err(Error::Archive {
                        session: None,
                        key: key.to_string(),
                        reason: format!("the bucket's MANIFEST cannot be read: {e}"),
                    }),
                    _ => Err(Error::Archive {
                        session: None,
                        key: key.to_string(),
                        reason: format!(
                            "the bucket holds another store (its MANIFEST names another store id \
                             than {}); use another prefix, or open a new, empty directory on this prefix",
                            local.display()
                        ),
                    }),
                }
            }
            Err(e) => Err(archive_error(None, &key, "writing the store's manifest", e)),
        }
    }

    /// The session directories the bucket has.
    pub(super) fn remote_sessions(&self) -> Result<Vec<String>> {
        let key = self.opts.sessions_key();
        self.list_dirs(&key)
            .map_err(|e| archive_error(None, &key, "listing the sessions", e))
    }

    /// Creates the local directory of session directory `dir` from the
    /// bucket (its `HEADER` and `LINEAGE`; the checkpoint and segments come
    /// when the session is loaded), if the bucket has it and it is not local.
    /// Built in the registry's staging area and published with one rename,
    /// like any new session. `lock` is held meanwhile (the session's
    /// writer lock: the staging cleaner of another handle leaves the entry
    /// alone). Returns whether a session was published.
    pub(super) fn hydrate(&self, registry: &Registry, dir: &str) -> Result<bool> {
        let live = self.sessions_dir.join(dir);
        if self.vfs.exists(&live) {
            return Ok(false);
        }
        let Some((header, uid)) = self.remote_header(None, dir)? else {
            return Ok(false);
        };
        let id = header.id.clone();
        let staged = registry
            .stage(&header, &uid)
            .map_err(|(path, source)| Error::Io { path, source })?;
        let filled = (|| {
            // The checkpoint and segments come when the session is loaded:
            // opening a store on a bucket of many sessions fetches only
            // their headers.
            self.fetch_into(&id, dir, LINEAGE_FILE, &staged)?;
            Ok::<_, Error>(())
        })();
        if let Err(e) = filled {
            let _ = registry.discard(&staged);
            return Err(e);
        }
        match registry.publish(&staged, &id) {
            Ok(_) => {
                self.state().known_remote.insert(dir.to_owned());
                Ok(true)
            }
            // Another handle brought it in (or created it) first.
            Err(PublishError::Exists) => {
                let _ = registry.discard(&staged);
                Ok(false)
            }
            Err(PublishError::Io(path, source)) => {
                let _ = registry.discard(&staged);
                Err(Error::Io { path, source })
            }
            Err(PublishError::Unsynced(path, _, source)) => Err(Error::Io { path, source }),
        }
    }

    /// The uid of the session the bucket holds under directory `dir` (its
    /// `HEADER`'s), `None` when it holds none.
    pub(super) fn remote_uid(&self, id: &str, dir: &str) -> Result<Option<[u8; 16]>> {
        Ok(self.remote_header(Some(id), dir)?.map(|(_, uid)| uid))
    }

    /// The bucket's `HEADER` of session directory `dir` (decoded), `None`
    /// when it has none; its uid is remembered (`State::remote_uids`).
    fn remote_header(
        &self,
        id: Option<&str>,
        dir: &str,
    ) -> Result<Option<(crate::header::SessionHeader, [u8; 16])>> {
        let key = self.opts.file_key(dir, HEADER_FILE);
        let Some(bytes) = self
            .get(&key)
            .map_err(|e| archive_error(id, &key, "reading a session's HEADER", e))?
        else {
            return Ok(None);
        };
        let (header, uid) = decode_header(&bytes).map_err(|reason| Error::Archive {
            session: id.map(str::to_owned),
            key: key.to_string(),
            reason: format!("the session's HEADER is damaged: {reason}"),
        })?;
        self.state().remote_uids.insert(dir.to_owned(), uid);
        Ok(Some((header, uid)))
    }

    /// Fails with [`Error::ReplacedElsewhere`] when the bucket holds
    /// another incarnation of the session in `local` (deleted or replaced
    /// on another host, and created again, after this copy was made):
    /// nothing of it may be fetched into this copy. The bucket's uid is
    /// read once per handle and session (a hydrate read it already), and
    /// again after each take of the lease.
    fn check_incarnation(&self, id: &str, dir: &str, local: &Path) -> Result<()> {
        let Ok(bytes) = self.vfs.read_file(&local.join(HEADER_FILE)) else {
            return Ok(()); // no local HEADER: nothing to compare
        };
        let Ok((_, uid)) = decode_header(&bytes) else {
            return Ok(());
        };
        if self.state().remote_uids.get(dir) == Some(&uid) {
            return Ok(());
        }
        match self.remote_uid(id, dir)? {
            Some(remote) if remote != uid => Err(Error::ReplacedElsewhere {
                session: id.to_owned(),
                key: self.opts.file_key(dir, HEADER_FILE).to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Fetches `<dir>/<name>` into directory `into` (whole, durable); returns
    /// whether the bucket had it.
    fn fetch_into(&self, id: &str, dir: &str, name: &str, into: &Path) -> Result<bool> {
        let key = self.opts.file_key(dir, name);
        let Some(bytes) = self
            .get(&key)
            .map_err(|e| archive_error(Some(id), &key, "fetching", e))?
        else {
            return Ok(false);
        };
        if let Some(first_seq) = segment::parse_segment_file_name(name) {
            // Checked before it is put in place: an object that is not a
            // segment of this name is refused, naming its key.
            segment::read_header(&bytes)
                .ok()
                .filter(|h| h.first_seq == first_seq)
                .ok_or_else(|| Error::Archive {
                    session: Some(id.to_owned()),
                    key: key.to_string(),
                    reason: "the object is not the segment its name says".into(),
                })?;
            // A local copy it replaces that holds records the object does
            // not (written by a host that had lost the lease) is moved
            // aside, never overwritten.
            let path = into.join(name);
            match self.vfs.read_file(&path) {
                Ok(old) if !super::fence::covered_by(&old, &bytes) => {
                    self.quarantine(into, name)?;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(&path)(e)),
            }
        }
        self.put_in_place(into, name, &bytes)
            .map_err(io_at(&into.join(name)))?;
        Ok(true)
    }

    /// Puts `bytes` in place as `dir/name`, durably: written to a temporary
    /// name of this process's own (two processes may fetch the same file at
    /// once: a shared name would let one rename the other's half-written
    /// file into place), synced, renamed, the directory synced. A
    /// temporary a killed process left is swept by the next load.
    fn put_in_place(&self, dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let (tmp, file) =
            crate::engine::tmpfile::create(&*self.vfs, dir, name, crate::engine::tmpfile::FETCH)?;
        let written = (|| {
            file.write_all_at(bytes, 0)?;
            file.sync_all()?;
            self.vfs.rename(&tmp, &dir.join(name))?;
            self.vfs.sync_dir(dir)
        })();
        if written.is_err() {
            let _ = self.vfs.remove_file(&tmp);
        }
        written
    }

    /// Brings the files of session `id` (local directory `local`) that the
    /// bucket has and the directory lacks, lazily: the checkpoint, the
    /// lineage, and only the segments the checkpoint does not cover (the
    /// tail: all of them without a checkpoint). Older segments missing
    /// locally (evicted, or written on another host) are returned as
    /// `(first seq, length)`: the load knows them and fetches one when a
    /// read needs its bytes ([`Archive::fetch_lazy`]).
    ///
    /// With `replace_stale` (this host just took the session over from
    /// another host), a local file the bucket has in another length is
    /// replaced too (without it, only an unsealed one the bucket has later
    /// segments after), unless it is a sealed segment (immutable, so the
    /// same everywhere), and the checkpoint is taken from the bucket (or
    /// removed when the bucket has none: a local one could cover records
    /// the bucket's segments do not have).
    pub(super) fn restore(
        &self,
        id: &str,
        local: &Path,
        replace_stale: bool,
    ) -> Result<Vec<(u64, u64)>> {
        let Some(dir) = local.file_name().and_then(|n| n.to_str()) else {
            return Ok(Vec::new());
        };
        crate::engine::tmpfile::sweep(&*self.vfs, local, crate::engine::tmpfile::FETCH);
        let quarantined = self.counters.quarantined.load(Ordering::Relaxed);
        let prefix = self.opts.session_key(dir);
        let metas = self
            .list_meta(&prefix)
            .map_err(|e| archive_error(Some(id), &prefix, "listing the session", e))?;
        // Nothing of the session in the bucket and a copy here: a session
        // not uploaded yet, or one deleted elsewhere since this copy was
        // made (its lease's newest record a tombstone). That copy is not
        // read as if the session still existed, as it is not written
        // (`Error::DeletedElsewhere`, the copy kept). A holder of the lease
        // has nothing to ask.
        if metas.is_empty() && !self.state().held.contains_key(dir) {
            match self.current_lease(id, dir)? {
                Some(rec) if rec.deleted => return Err(self.deleted_elsewhere(id, dir, &rec)),
                _ => {}
            }
        }
        // Files are fetched into this copy only when the bucket's session
        // is this one (its uid): checked once, before the first fetch (a
        // complete local copy costs no request for it).
        let checked = std::cell::Cell::new(false);
        let same_session = || -> Result<()> {
            if !checked.replace(true) {
                self.check_incarnation(id, dir, local)?;
            }
            Ok(())
        };
        let fetch_into = |name: &str| -> Result<bool> {
            same_session()?;
            self.fetch_into(id, dir, name, local)
        };
        let mut remote_checkpoint = false;
        // The other files first: the checkpoint says where the tail starts.
        for meta in &metas {
            let Some(name) = meta.location.filename() else {
                continue;
            };
            let path = local.join(name);
            let wanted = if name == CHECKPOINT_FILE {
                remote_checkpoint = true;
                let current = self.fetched_current(dir, &path, meta.e_tag.as_deref());
                // None here: neither a file nor one the HEADER embeds.
                let none = crate::engine::ckfile::location(&*self.vfs, local).is_none();
                (replace_stale && !current) || none
            } else {
                name == LINEAGE_FILE && !self.vfs.exists(&path)
            };
            if wanted && fetch_into(name)? && name == CHECKPOINT_FILE {
                let stamp = self.vfs.metadata(&path).map_err(io_at(&path))?;
                if let Some(tag) = &meta.e_tag {
                    self.state().fetched_checkpoints.insert(
                        dir.to_owned(),
                        (tag.clone(), (stamp.len, stamp.modified, stamp.ino)),
                    );
                }
            }
        }
        let listed: Vec<(object_store::path::Path, u64)> =
            metas.into_iter().map(|m| (m.location, m.size)).collect();
        if replace_stale && !remote_checkpoint {
            // Its own file, or the one its HEADER embeds.
            crate::engine::ckfile::remove(&*self.vfs, local).map_err(io_at(local))?;
        }
        // Sealed segments are the same everywhere only along one history:
        // a local one the last holder's history does not have is moved
        // aside (with what follows it) and the bucket's used. Checked when
        // taking the session from another host, and when loading one
        // another host holds (or last held): the only times they can differ.
        let shared = listed.iter().any(|(k, _)| {
            k.filename()
                .and_then(segment::parse_segment_file_name)
                .is_some_and(|first_seq| self.has_local_copy(local, first_seq))
        });
        if replace_stale || (shared && self.held_elsewhere(id, dir)?) {
            same_session()?; // nothing moved aside for another session's sake
            self.quarantine_diverged(id, local, &listed)?;
        }
        // Segments before the one the checkpoint ends in are covered: their
        // bytes are needed only by reads of old events (or of node data
        // there). A checkpoint that does not open means a full load.
        let missing = listed.iter().any(|(k, _)| {
            k.filename()
                .and_then(segment::parse_segment_file_name)
                .is_some_and(|first_seq| !self.has_local_copy(local, first_seq))
        });
        let tail_start = match missing {
            true => crate::engine::ckfile::open(&*self.vfs, local)
                .1
                .map_or(0, |ck| ck.coverage().segment_first_seq),
            false => 0,
        };
        // A local unsealed segment the bucket has later segments after was
        // sealed by another host since this copy was made: it is stale
        // whoever asks (this host cannot be writing it: it would hold the
        // lease, and nobody else could have written past it).
        let last_remote = listed
            .iter()
            .filter_map(|(k, _)| segment::parse_segment_file_name(k.filename()?))
            .max();
        let mut lazy = Vec::new();
        for (key, size) in &listed {
            let Some(name) = key.filename() else { continue };
            let Some(first_seq) = segment::parse_segment_file_name(name) else {
                continue;
            };
            let path = local.join(name);
            if self
                .vfs
                .exists(&local.join(segment::image_file_name(first_seq)))
            {
                // Sealed and stored compressed here: the same segment as
                // the object (sealed segments are the same everywhere).
                continue;
            }
            let superseded = last_remote.is_some_and(|l| l > first_seq);
            let wanted = match self.vfs.metadata(&path) {
                Ok(m) if m.len == *size => false,
                Ok(_) => (replace_stale || superseded) && !self.is_sealed(&path),
                Err(_) if first_seq < tail_start => {
                    lazy.push((first_seq, *size));
                    false
                }
                Err(_) => true,
            };
            if wanted {
                fetch_into(name)?;
            }
        }
        if !replace_stale && self.counters.quarantined.load(Ordering::Relaxed) != quarantined {
            // A local segment was moved aside: the local checkpoint may
            // describe its records. The bucket's goes with its segments.
            if !(remote_checkpoint && fetch_into(CHECKPOINT_FILE)?) {
                crate::engine::ckfile::remove(&*self.vfs, local).map_err(io_at(local))?;
            }
        }
        Ok(lazy)
    }

    /// Whether another host holds (or last held) session directory `dir`'s
    /// lease, and this handle does not hold it.
    fn held_elsewhere(&self, id: &str, dir: &str) -> Result<bool> {
        if self.state().held.contains_key(dir) {
            return Ok(false);
        }
        Ok(self
            .current_lease(id, dir)?
            .is_some_and(|r| r.host != self.host))
    }

    /// Whether the local checkpoint `path` of session directory `dir` is
    /// the one this handle fetched, and the bucket's (entity tag `tag`) is
    /// still that one.
    fn fetched_current(&self, dir: &str, path: &Path, tag: Option<&str>) -> bool {
        let Some((fetched, stamp)) = self.state().fetched_checkpoints.get(dir).cloned() else {
            return false;
        };
        tag == Some(fetched.as_str())
            && self
                .vfs
                .metadata(path)
                .is_ok_and(|m| (m.len, m.modified, m.ino) == stamp)
    }

    /// Fetches sealed segment `path` of session `id`, covered by its
    /// checkpoint and missing locally, for a read that needs its bytes:
    /// checked whole (identity `ident`, footer, records' checksum) before
    /// it is put in place under a temporary name of its own, `fsync`ed and
    /// renamed (concurrent fetchers of one segment each rename a whole
    /// copy), then mapped. An object missing or damaged is an error naming
    /// the session, the segment and the key.
    pub(super) fn fetch_lazy(
        &self,
        id: &str,
        path: &Path,
        ident: &segment::SegmentIdent,
    ) -> Result<crate::vfs::SegmentBytes> {
        let (Some(name), Some(local)) = (path.file_name().and_then(|n| n.to_str()), path.parent())
        else {
            return Err(io_at(path)(std::io::ErrorKind::InvalidInput.into()));
        };
        let dir = local.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let key = self.opts.file_key(dir, name);
        let bad = |reason: String| Error::Archive {
            session: Some(id.to_owned()),
            key: key.to_string(),
            reason: format!("segment {}: {reason}", path.display()),
        };
        let bytes = self
            .get(&key)
            .map_err(|e| bad(format!("fetching it failed: {e}")))?
            .ok_or_else(|| {
                bad("evicted locally but not in the archive (the checkpoint covers it)".into())
            })?;
        segment::check_sealed(&bytes, ident)
            .map_err(|e| bad(format!("the object is damaged: {e}")))?;
        self.put_in_place(local, name, &bytes)
            .map_err(io_at(path))?;
        // Sealed and in the bucket: never uploaded again.
        self.state().uploaded.insert(
            (dir.to_owned(), name.to_owned()),
            (bytes.len() as u64, true),
        );
        self.vfs.map(path).map_err(io_at(path))
    }

    /// Deletes session directory `dir`'s objects, `HEADER` first, and
    /// forgets what this handle uploaded of it.
    ///
    /// With `keep_whole` (the session's local directory, when the session
    /// stays until a later step succeeds: `import --replace` deletes the
    /// old session's objects before its exchange), every segment and
    /// `LINEAGE` the directory lacks (evicted here, or written on another
    /// host) is fetched into it first: a failure of that later step must
    /// leave the old session whole, and the bucket's copy is going. Nothing
    /// is deleted unless every fetch succeeded.
    pub(super) fn forget(&self, id: &str, dir: &str, keep_whole: Option<&Path>) -> Result<()> {
        let prefix = self.opts.session_key(dir);
        let mut keys: Vec<_> = self
            .list(&prefix)
            .map_err(|e| archive_error(Some(id), &prefix, "listing the session", e))?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if let Some(local) = keep_whole {
            for name in keys.iter().filter_map(|k| k.filename()) {
                let missing = match segment::parse_segment_file_name(name) {
                    Some(first_seq) => !self.has_local_copy(local, first_seq),
                    None => name == LINEAGE_FILE && !self.vfs.exists(&local.join(name)),
                };
                if missing && !self.fetch_into(id, dir, name, local)? {
                    // Listed, then gone: another host deleted it meanwhile.
                    return Err(Error::Archive {
                        session: Some(id.to_owned()),
                        key: self.opts.file_key(dir, name).to_string(),
                        reason: "the object went away while the session was being fetched whole before its objects are deleted".into(),
                    });
                }
            }
        }
        // Forgotten before the deletes: were one to fail midway, what this
        // handle recorded as uploaded must not let an eviction remove a
        // local file the bucket no longer holds.
        {
            let mut st = self.state();
            st.forget_objects(dir);
            st.fetched_checkpoints.remove(dir);
        }
        keys.sort_by_key(|k| k.filename() != Some(HEADER_FILE));
        for key in keys {
            match self.call(|s| {
                let key = key.clone();
                async move { s.delete(&key).await }
            }) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(archive_error(Some(id), &key, "deleting", e)),
            }
        }
        Ok(())
    }

    /// Fetches the one segment file `path` (missing locally) if the bucket
    /// has it; returns whether it did.
    pub(super) fn fetch_segment(&self, path: &Path) -> Result<bool> {
        let (Some(name), Some(local)) = (path.file_name().and_then(|n| n.to_str()), path.parent())
        else {
            return Ok(false);
        };
        let Some(dir) = local.file_name().and_then(|n| n.to_str()) else {
            return Ok(false);
        };
        let Some(first_seq) = segment::parse_segment_file_name(name) else {
            return Ok(false);
        };
        if !self.vfs.exists(local) || self.has_local_copy(local, first_seq) {
            return Ok(false); // not this session's any more, or still here
        }
        self.fetch_into(dir, dir, name, local)
    }

    /// Whether session directory `local` holds segment `first_seq`, raw or
    /// as a compressed image.
    fn has_local_copy(&self, local: &Path, first_seq: u64) -> bool {
        self.vfs
            .exists(&local.join(segment::segment_file_name(first_seq)))
            || self
                .vfs
                .exists(&local.join(segment::image_file_name(first_seq)))
    }

    /// Whether the segment file at `path` has a valid footer.
    pub(super) fn is_sealed(&self, path: &Path) -> bool {
        self.vfs
            .map(path)
            .is_ok_and(|m| segment::verify_footer(&m).is_ok())
    }
}
