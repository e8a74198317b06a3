//! The store handle: opening, lookups in the sessions directory, flush,
//! close and the group-commit thread. The map of loaded sessions it holds
//! is managed in [`super::loaded`].

use super::error::{Error, Result, io_at};
use super::journal::Journal;
use super::load::Recovery;
use super::locks::LockTable;
use super::options::{Durability, Options};
use super::periodic::Periodic;
use super::registry::{LookupError, Registry, SessionEntry, Unaccounted};
use super::session::{NodeLocs, Session};
use super::write::new_uid;
use crate::checkpoint::BatchIndex;
use crate::derive::DeriveCache;
use crate::fsutil;
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::manifest::Manifest;
use crate::segment;
use crate::session::SessionState;
use crate::vfs::{SegmentBytes, Vfs};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

pub(super) struct Inner {
    pub(super) options: Options,
    /// The file system every file operation goes through (the real one but
    /// in fault-injection tests, `internals` feature).
    pub(super) vfs: Arc<dyn Vfs>,
    pub(super) read_only: bool,
    pub(super) store_id: [u8; 16],
    /// The store directory.
    pub(super) dir: PathBuf,
    /// The manifest as this handle last read or wrote it (its version is
    /// raised before the first compressed segment).
    pub(super) manifest: Mutex<Manifest>,
    /// The manifest's version is known durable: this handle raised it, or
    /// synced the store directory since it found it raised (a manifest
    /// found raised may be the rename of a process killed before its
    /// directory sync, in the page cache only).
    pub(super) manifest_durable: AtomicBool,
    /// The background compression of sealed segments
    /// (`Options::compress_sealed`, writable handles).
    pub(super) compressor: Option<super::compress::Compressor>,
    /// Compresses large batches' packs on another core (issue 18).
    pub(super) packer: super::packer::PackHelper,
    /// The per-session writer locks (`None`: a read-only handle on a store
    /// no writer ever opened, so no session can be locked).
    pub(super) locks: Option<Arc<LockTable>>,
    pub(super) registry: Registry,
    /// Set by [`Store::close`]: every later call fails, clones included.
    pub(super) closed: AtomicBool,
    /// Ticks of session use, for evicting the least recently used.
    pub(super) clock: AtomicU64,
    /// Bytes of compressed images decoded in memory, wherever they are
    /// held (sessions, snapshots, reads in progress): added when an image
    /// is decoded, taken off when its bytes are dropped
    /// (`Options::max_decoded_images`).
    pub(super) decoded: Arc<AtomicU64>,
    pub(super) pending: Mutex<HashMap<String, SessionHeader>>,
    /// Shared with the group-commit thread, which never holds the store
    /// itself (so dropping the last handle releases the lock at once).
    pub(super) sessions: Arc<Sessions>,
    pub(super) recoveries: Mutex<HashMap<String, Recovery>>,
    /// The group-commit thread (Batched mode), or the journal's background
    /// thread; stopped and joined by close.
    pub(super) group_commit: Mutex<Option<Periodic>>,
    /// The store-wide journal of this handle (`Options::journal`).
    pub(super) journal: Option<Arc<Journal>>,
    /// The archive tier (issue 17), set once at open (nothing without the
    /// `archive` feature).
    #[cfg_attr(not(feature = "archive"), allow(dead_code))]
    pub(super) archive: super::hooks::Slot,
}

/// A store of sessions. `Send + Sync`: share it (it is a cheap handle) and
/// append to different sessions from many threads.
#[derive(Clone)]
pub struct Store {
    pub(super) inner: Arc<Inner>,
}

/// Syncs every session with unsynced appends. A failed sync poisons its
/// session (the data may be lost; retrying the fsync could report a
/// false success) and is returned.
pub(super) fn sync_dirty(sessions: &Sessions) -> Result<()> {
    // Poisoned locks are entered anyway: this also runs from Drop, where
    // a second panic would abort the process, and a sync of what was
    // written is still the right thing to do.
    let sessions: Vec<_> = sessions
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .cloned()
        .collect();
    let mut first_error = None;
    for session in sessions {
        let mut s = session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.poisoned {
            first_error.get_or_insert(Error::Poisoned(s.header.id.clone()));
            continue;
        }
        if let Err(e) = s.sync_if_dirty() {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The sessions of a store, by id.
pub(super) type Sessions = RwLock<HashMap<String, Arc<Mutex<Session>>>>;

impl Inner {
    /// Stops and joins the group-commit thread, if one runs.
    pub(super) fn stop_group_commit(&self) {
        let group_commit = self
            .group_commit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(gc) = group_commit {
            gc.stop();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_group_commit();
        if let Some(c) = &self.compressor {
            c.stop();
        }
        // Best effort for Batched/None: what an explicit close would sync.
        if !self.read_only {
            let synced = sync_dirty(&self.sessions).is_ok();
            if let Some(j) = &self.journal {
                j.close(synced);
            }
        }
    }
}

/// The group-commit thread of [`Durability::Batched`]: wakes every `window`
/// and syncs the dirty sessions; stopped and joined by close or drop.
pub(super) fn spawn_group_commit(sessions: Arc<Sessions>, window: std::time::Duration) -> Periodic {
    // Holds the sessions, never the store: dropping the last store handle
    // stops this thread and releases the lock at once.
    Periodic::spawn("sessionlog-group-commit", window, move || {
        let _ = sync_dirty(&sessions);
        true
    })
}

/// The journal's background thread: keeps a spare journal file ready and
/// removes full ones once every session is synced past them.
fn spawn_journal_maintenance(sessions: Arc<Sessions>, journal: Arc<Journal>) -> Periodic {
    let every = std::time::Duration::from_millis(50);
    Periodic::spawn("sessionlog-journal", every, move || {
        journal.maintain(|| sync_dirty(&sessions).is_ok());
        true
    })
}

impl Store {
    /// Creates or opens the store in `dir` for reading and writing. Any
    /// number of handles, in any number of processes, may have one store
    /// open at once: each session has at most one writer at a time (its
    /// first write takes the session's writer lock; a second writer gets
    /// [`Error::Locked`]), and every handle sees every acknowledged append.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Self::open_with(dir.as_ref(), options, crate::vfs::real(), false)
    }

    /// Opens an existing store for reading only; never writes. Records a
    /// writer has not finished are not shown; a session nobody is writing
    /// whose last turn is open is shown closed (its closers synthesised in
    /// memory, not stored).
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(dir.as_ref(), Options::default(), crate::vfs::real(), true)
    }

    /// [`Store::open_read_only`] with the options a reader uses: its
    /// memory and file bounds (`max_open_sessions`, `max_decoded_images`).
    /// The others (about writing, `max_record` included: every read takes
    /// records up to [`MAX_RECORD_LIMIT`](crate::store::MAX_RECORD_LIMIT),
    /// and the archive tier) are ignored.
    ///
    /// ```no_run
    /// use sessionlog::store::{Options, Store};
    /// let reader = Store::open_read_only_with(
    ///     "sessions",
    ///     Options { max_open_sessions: 64, max_decoded_images: 64 << 20, ..Options::default() },
    /// )?;
    /// # Ok::<(), sessionlog::store::Error>(())
    /// ```
    pub fn open_read_only_with(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Self::open_with(dir.as_ref(), options, crate::vfs::real(), true)
    }

    /// [`Store::open`] with every file operation going through `vfs` (fault
    /// injection; unstable, `internals` feature).
    #[cfg(feature = "internals")]
    pub fn open_with_vfs(
        dir: impl AsRef<Path>,
        options: Options,
        vfs: Arc<dyn Vfs>,
    ) -> Result<Store> {
        Self::open_with(dir.as_ref(), options, vfs, false)
    }

    /// [`Store::open_read_only`] through `vfs` (unstable, `internals`
    /// feature).
    #[cfg(feature = "internals")]
    pub fn open_read_only_with_vfs(dir: impl AsRef<Path>, vfs: Arc<dyn Vfs>) -> Result<Store> {
        Self::open_with(dir.as_ref(), Options::default(), vfs, true)
    }

    /// Whether `dir` holds a store (its `MANIFEST` file is there); does not
    /// open it. [`Store::open`] creates a store in a missing or empty
    /// directory, so a caller that must not create one asks this first.
    pub fn is_store(dir: impl AsRef<Path>) -> bool {
        dir.as_ref().join(crate::manifest::MANIFEST_FILE).is_file()
    }

    /// Where the files of session `id` live in the store at `dir`, computed
    /// without touching the disk: a directory under `dir/sessions/` named
    /// for the id (`format-spec.md` at the repository's root, "Directory
    /// layout"). [`Error::BadId`] for an id that cannot be stored.
    pub fn session_dir_in(dir: impl AsRef<Path>, id: &str) -> Result<PathBuf> {
        let name = fsutil::encode_session_dir_name(id).map_err(|e| Error::BadId {
            id: id.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(dir.as_ref().join(super::registry::SESSIONS_DIR).join(name))
    }

    /// The segment files of session `id`, oldest first: the last one is the
    /// active segment appends go to, unless the session ends with a sealed
    /// one; sealed segments may be compressed images (`.segz`). For backups
    /// and inspection: the store owns them, and nothing but the store may
    /// write them.
    pub fn segment_files(&self, id: &str) -> Result<Vec<PathBuf>> {
        self.with_session(id, |s| {
            Ok(s.segs.iter().map(|seg| seg.path.clone()).collect())
        })
    }

    pub(super) fn open_with(
        dir: &Path,
        options: Options,
        vfs: Arc<dyn Vfs>,
        read_only: bool,
    ) -> Result<Store> {
        let archive = super::hooks::before_open(dir, &options, &vfs, read_only)?; // issue 17
        // The manifest first: a store is created only in a missing or empty
        // directory, and the lock file would make it non-empty.
        let mut manifest = if read_only {
            Manifest::open_with(&*vfs, dir)
        } else {
            Manifest::open_or_create_with(&*vfs, dir).map(|(m, _)| m)
        }?;
        if options.compress_sealed && !read_only {
            // Durable before any image is written (section 2 of the spec),
            // also when found raised already: the rename of a process
            // killed before its directory sync is in the page cache only.
            let raised = manifest.version == crate::manifest::STORE_FORMAT_VERSION;
            manifest = manifest.upgrade_with(&*vfs, dir)?;
            if raised {
                vfs.sync_dir(dir).map_err(io_at(dir))?;
            }
        }
        let manifest_durable = options.compress_sealed && !read_only;
        let locks = LockTable::open(dir, !read_only)
            .map_err(|source| Error::Io {
                path: dir.join(super::locks::LOCK_FILE),
                source,
            })?
            .map(Arc::new);
        let registry = Registry::open(vfs.clone(), dir, !read_only)
            .map_err(|(path, source)| Error::Io { path, source })?;
        // Held from here until the open's maintenance is done: it locks
        // sessions this handle does not write (crashed builds below,
        // orphaned journals and archive leases after), and a writer that
        // meets one of those locks waits instead of failing (section 9).
        let maintenance = match (read_only, &locks) {
            (false, Some(locks)) => Some(locks.maintenance().map_err(|source| Error::Io {
                path: locks.path().to_owned(),
                source,
            })?),
            _ => None,
        };
        if let (false, Some(locks)) = (read_only, &locks) {
            // Builds and removals a crash interrupted: never published (so
            // never acknowledged), or already durably deleted. Each is named
            // by its session's lock key; one whose lock is held is another
            // live handle's work in progress and is left alone.
            registry
                .clean_up(|key| locks.try_lock_key(key))
                .map_err(|(path, source)| Error::Io { path, source })?;
        }
        let journal = match (&locks, read_only, options.journal, options.durability) {
            (Some(locks), false, true, Durability::Sync) => Some(Arc::new(
                Journal::open(
                    dir,
                    vfs.clone(),
                    locks.clone(),
                    manifest.store_id,
                    options.journal_file_size,
                )
                .map_err(|(path, source)| Error::Io { path, source })?,
            )),
            _ => None,
        };
        let sessions: Arc<Sessions> = Arc::new(RwLock::new(HashMap::new()));
        let compressor = (options.compress_sealed && !read_only)
            .then(|| super::compress::Compressor::spawn(vfs.clone(), sessions.clone()));
        let store = Store {
            inner: Arc::new(Inner {
                options,
                vfs,
                read_only,
                store_id: manifest.store_id,
                dir: dir.to_path_buf(),
                manifest: Mutex::new(manifest),
                manifest_durable: AtomicBool::new(manifest_durable),
                compressor,
                packer: super::packer::PackHelper::new(),
                locks,
                registry,
                closed: AtomicBool::new(false),
                clock: AtomicU64::new(0),
                decoded: Arc::new(AtomicU64::new(0)),
                pending: Mutex::new(HashMap::new()),
                sessions,
                recoveries: Mutex::new(HashMap::new()),
                group_commit: Mutex::new(None),
                journal,
                archive: Default::default(),
            }),
        };
        if !read_only {
            // Journals of handles that are gone: their acknowledged batches
            // go back into their segments before anyone writes after them.
            store.adopt_orphaned_journals();
        }
        super::hooks::after_open(&store, archive)?; // issue 17
        drop(maintenance);
        if let (Durability::Batched { window }, false) = (store.inner.options.durability, read_only)
        {
            let handle = spawn_group_commit(store.inner.sessions.clone(), window);
            *store.inner.group_commit.lock().expect("lock") = Some(handle);
        }
        if let Some(j) = &store.inner.journal {
            let handle = spawn_journal_maintenance(store.inner.sessions.clone(), j.clone());
            *store.inner.group_commit.lock().expect("lock") = Some(handle);
        }
        Ok(store)
    }

    /// The headers of every stored session, sorted by id, read from the
    /// sessions' own directories (no log is read). A session declared with
    /// [`Store::create`] and never appended to is not listed; a directory
    /// that is not a readable session is not either: see
    /// [`Store::unaccounted`]. With the archive tier, the sessions other
    /// hosts created are brought in first (their headers), and a local copy
    /// of a session another host deleted since is left out (it stays on
    /// disk; reading or writing it fails with `Error::DeletedElsewhere`).
    pub fn list(&self) -> Result<Vec<SessionHeader>> {
        let remote = self.archive_refresh()?; // issue 17: sessions other hosts created
        let (mut sessions, _) = self.scan()?;
        // ... and not those other hosts deleted since this copy was made.
        self.archive_unlist(&remote, &mut sessions)?;
        Ok(sessions.into_iter().map(|e| e.header).collect())
    }

    /// Entries of the sessions directory that are not readable sessions (no
    /// `HEADER`, a damaged one, one naming another id): damage or foreign
    /// files. They are kept as they are, never deleted; `verify` reports
    /// them.
    pub fn unaccounted(&self) -> Result<Vec<Unaccounted>> {
        Ok(self.scan()?.1)
    }

    pub(super) fn scan(&self) -> Result<(Vec<SessionEntry>, Vec<Unaccounted>)> {
        self.inner
            .registry
            .scan()
            .map_err(|(path, source)| Error::Io { path, source })
    }

    /// Declares a session. Nothing is written until its first append.
    pub fn create(&self, header: SessionHeader) -> Result<()> {
        self.writable()?;
        fsutil::encode_session_dir_name(&header.id).map_err(|e| Error::BadId {
            id: header.id.clone(),
            reason: e.to_string(),
        })?;
        if self.entry(&header.id)?.is_some() {
            return Err(Error::Exists(header.id));
        }
        let mut pending = self.inner.pending.lock().expect("pending lock");
        if pending.contains_key(&header.id) {
            return Err(Error::Exists(header.id));
        }
        pending.insert(header.id.clone(), header);
        Ok(())
    }

    /// The header of session `id` (stored, or declared with
    /// [`Store::create`]), without loading its log.
    pub fn header(&self, id: &str) -> Result<SessionHeader> {
        if let Some(h) = self.inner.pending.lock().expect("pending lock").get(id) {
            return Ok(h.clone());
        }
        match self.entry(id)? {
            Some(e) => Ok(e.header),
            None => Err(Error::NotFound(id.to_owned())),
        }
    }

    /// Whether session `id` is stored (declared-only sessions are not).
    pub fn exists(&self, id: &str) -> Result<bool> {
        Ok(self.entry(id)?.is_some())
    }

    /// The stored session `id`, from its directory.
    pub(super) fn entry(&self, id: &str) -> Result<Option<SessionEntry>> {
        match self.inner.registry.get(id) {
            Ok(e) => Ok(e),
            Err(LookupError::Io(path, source)) => Err(Error::Io { path, source }),
            Err(LookupError::Unaccounted(u)) => Err(Error::Corrupt {
                session: id.to_owned(),
                segment: u.path,
                offset: 0,
                reason: u.reason,
            }),
        }
    }

    pub(super) fn writable(&self) -> Result<()> {
        self.open_handle()?;
        if self.inner.read_only {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Fails once the store is closed (through any clone of the handle).
    pub(super) fn open_handle(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// How the session was recovered when it was last loaded (by a reader)
    /// or taken for writing (with authority: only then is a torn tail cut).
    pub fn recovery(&self, id: &str) -> Option<Recovery> {
        self.inner.recoveries.lock().expect("lock").get(id).cloned()
    }

    /// The store's identity (random, fixed at creation, in `MANIFEST`):
    /// qualifies revisions, so two stores' sessions never compare equal.
    pub fn store_id(&self) -> [u8; 16] {
        self.inner.store_id
    }

    /// The seq session `id`'s next event must have (its length), up to date
    /// with every acknowledged append; cheap once the session is loaded (a
    /// fresh load reads the checkpoint, not the log).
    pub fn next_seq(&self, id: &str) -> Result<u64> {
        self.with_session(id, |s| Ok(s.next_seq()))
    }

    /// Session `id`'s incarnation: 32 hex digits, new each time a session
    /// of that id is created (a deleted and re-created, or replaced,
    /// session has another), so a revision built from it and
    /// [`Store::next_seq`] changes with every append, repair and
    /// replacement.
    pub fn incarnation(&self, id: &str) -> Result<String> {
        match self.entry(id)? {
            Some(e) => Ok(super::registry::hex(&e.uid)),
            None => Err(Error::NotFound(id.to_owned())),
        }
    }

    /// Session `id`'s length and incarnation, read together from one view
    /// of it: what [`Store::next_seq`] and [`Store::incarnation`] report,
    /// without making it one of this handle's loaded sessions. A session
    /// this handle has loaded is asked (brought up to date as `next_seq`
    /// would); any other is read as a reader loads it (its checkpoint and
    /// the records after it, so not the whole log while the checkpoint is
    /// recent) and dropped: nothing is cached, no writer lock is taken, no
    /// torn tail is cut, and no loaded session is released to make room
    /// ([`Options::max_open_sessions`]), so the sessions this handle
    /// writes stay its own. For listings over many sessions (the Node
    /// binding's `listSnapshots`).
    ///
    /// [`Error::NotFound`] when no such session is stored (a declared one,
    /// never appended to, is not); [`Error::Corrupt`] when it is damaged,
    /// as its load would be.
    pub fn peek_next_seq(&self, id: &str) -> Result<(u64, String)> {
        self.open_handle()?;
        if let Some(found) = self.with_loaded(id, |s| {
            Ok((!s.unpublished).then(|| (s.next_seq(), super::registry::hex(&s.uid))))
        })? && let Some(found) = found
        {
            return Ok(found);
        }
        let entry = self
            .entry(id)?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let (s, _) = self.load_entry(id, entry)?;
        Ok((s.next_seq(), super::registry::hex(&s.uid)))
    }

    /// Takes session `id` for writing now, as its first write would: its
    /// writer lock ([`Error::Locked`] if another handle has it), then
    /// recovery with authority (a torn tail cut, an interrupted seal
    /// finished and, unless [`Options::close_interrupted_turns`] is off, an
    /// interrupted turn closed). Returns what recovery found. A caller that
    /// repairs on its own terms (the harness's coordinator) takes the
    /// session this way to learn of a torn tail before it appends.
    pub fn acquire(&self, id: &str) -> Result<Recovery> {
        self.writable()?;
        self.with_session(id, |s| self.ensure_writer(s))?;
        Ok(self.recovery(id).unwrap_or_default())
    }

    /// Raises the store to the newest format version
    /// ([`crate::manifest::STORE_FORMAT_VERSION`]) before this handle first
    /// writes what only such a reader reads: a compressed image (version
    /// 4), a `HEADER` with an embedded checkpoint (version 5). Durable
    /// before the caller writes anything (format-spec section 2): a
    /// manifest found raised may be the rename of a process killed before
    /// its directory sync, in the page cache only (a file written under it
    /// would then outlive it after a power loss, beside an older manifest),
    /// so the store directory is synced once per handle in that case.
    pub(super) fn raise_store_version(&self) -> Result<()> {
        let mut m = self
            .inner
            .manifest
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if m.version < crate::manifest::STORE_FORMAT_VERSION {
            *m = m.upgrade_with(&*self.inner.vfs, &self.inner.dir)?;
        } else if !self.inner.manifest_durable.load(Ordering::Acquire) {
            let dir = &self.inner.dir;
            self.inner.vfs.sync_dir(dir).map_err(io_at(dir))?;
        }
        self.inner.manifest_durable.store(true, Ordering::Release);
        Ok(())
    }

    pub(super) fn session_dir(&self, id: &str) -> Result<PathBuf> {
        self.inner.registry.live_dir(id).map_err(|e| Error::BadId {
            id: id.to_owned(),
            reason: e.to_string(),
        })
    }

    pub(super) fn new_session(&self, header: SessionHeader) -> Result<Session> {
        let dir = self.session_dir(&header.id)?;
        Ok(Session {
            uid: new_uid(&header.id),
            lineage: Lineage::default(),
            header,
            dir,
            state: SessionState::new(self.inner.options.strict),
            derive: DeriveCache::default(),
            lazy: None,
            segs: Vec::new(),
            writer: None,
            batches: BatchIndex::default(),
            node_locs: Arc::new(NodeLocs::default()),
            last_time: 0,
            last_record: None,
            since_checkpoint: 0,
            dirty: false,
            poisoned: false,
            unpublished: true,
            staged: false,
            defer_sync: false,
            active_end: None,
            unverified: None,
            lock: None,
            dir_id: (0, None),
            placeholder: false,
            used: 0,
            refetch: true,
            closers_due: false,
        })
    }

    /// Makes every append durable and writes checkpoints, for every session
    /// whatever another one's failure (a poisoned session, a failed sync);
    /// the first error is returned.
    pub fn flush(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        // Every session gets its sync and its checkpoint whatever another's
        // fails with (one poisoned session must not leave the others'
        // checkpoints unwritten at close); the first error is returned.
        let mut first_error = sync_dirty(&self.inner.sessions).err();
        let sessions: Vec<_> = self
            .inner
            .sessions
            .read()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        for session in sessions {
            let mut s = session.lock().expect("session lock");
            if s.since_checkpoint > 0 && !s.poisoned && s.lock.is_some() {
                // A complete checkpoint brings the derive cache up to date,
                // which decodes the images holding its messages.
                if let Err(e) = self.write_checkpoint(&mut s, true) {
                    first_error.get_or_insert(e);
                }
                self.within_image_budget(&mut s);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Flushes and closes the store: every session is synced, checkpointed
    /// and released (its writer lock too, so another handle may write it at
    /// once). Every later call on this handle or any clone of it fails with
    /// [`Error::Closed`].
    pub fn close(self) -> Result<()> {
        // Stop the group-commit thread first: flush then syncs what is left.
        self.inner.stop_group_commit();
        // The compression in progress is finished (or given up), the queue
        // dropped: the sessions' next writers queue what is still raw.
        if let Some(c) = &self.inner.compressor {
            c.stop();
        }
        let flushed = self.flush();
        self.inner.closed.store(true, Ordering::Release);
        let sessions: Vec<_> = self
            .inner
            .sessions
            .write()
            .expect("sessions lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        let mut released = Ok(());
        for slot in sessions {
            let mut s = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Err(e) = s.release() {
                released = released.and(Err(e));
            }
        }
        if let Some(j) = &self.inner.journal {
            // Every session is synced now (or the failure is reported and
            // the files stay for the sessions' next writers).
            j.close(flushed.is_ok() && released.is_ok());
        }
        // Issue 17: everything to the bucket, leases given up.
        let archived = self.archive_close();
        flushed.and(released).and(archived)
    }

    /// The largest record a read accepts: the format's limit, whatever
    /// [`Options::max_record`](super::Options::max_record) says (it bounds
    /// what this handle writes). A record is read through a map or a
    /// bounded buffer, never allocated from its length field, so a reader
    /// gains nothing from a lower bound; with one, a record another handle
    /// wrote under a higher limit would end a reader's view of the session
    /// there, or fail its load.
    pub(super) fn read_limit(&self) -> u32 {
        segment::MAX_RECORD_LIMIT
    }

    /// Maps a segment through the store's file system. Segment files are
    /// only ever appended to within their preallocated length or sealed
    /// (cut to a length past every committed byte); readers only touch
    /// committed bytes, so the mapping never reads past the end of the file
    /// and never sees bytes change (see [`crate::vfs::RealFs`]'s `map`).
    pub(super) fn map_file(&self, path: &Path) -> Result<SegmentBytes> {
        match self.inner.vfs.map(path) {
            // Issue 17: evicted after the directory was listed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.archive_fetch(path) => {
                self.inner.vfs.map(path).map_err(io_at(path))
            }
            r => r.map_err(io_at(path)),
        }
    }
}
