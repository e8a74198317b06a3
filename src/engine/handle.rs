//! The store handle: opening, the map of loaded sessions, lookups in the
//! sessions directory, flush, close and the group-commit thread.

use super::error::{Error, Result, io_at};
use super::load::Recovery;
use super::options::{Durability, Options};
use super::registry::{LookupError, Registry, SessionEntry, Unaccounted};
use super::session::{NodeLocs, Session};
use super::write::new_uid;
use crate::checkpoint::BatchIndex;
use crate::derive::DeriveCache;
use crate::fsutil;
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::manifest::Manifest;
use crate::session::SessionState;
use crate::vfs::{SegmentBytes, Vfs, VfsLock};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

pub(super) struct Inner {
    pub(super) options: Options,
    pub(super) read_only: bool,
    pub(super) store_id: [u8; 16],
    pub(super) _lock: Option<VfsLock>,
    pub(super) registry: Registry,
    pub(super) pending: Mutex<HashMap<String, SessionHeader>>,
    /// Shared with the group-commit thread, which never holds the store
    /// itself (so dropping the last handle releases the lock at once).
    pub(super) sessions: Arc<Sessions>,
    pub(super) recoveries: Mutex<HashMap<String, Recovery>>,
    /// The group-commit thread (Batched mode), stopped and joined by close.
    pub(super) group_commit: Mutex<Option<GroupCommit>>,
}

/// The handle of the group-commit thread.
pub(super) struct GroupCommit {
    pub(super) stop: Arc<std::sync::atomic::AtomicBool>,
    pub(super) thread: std::thread::JoinHandle<()>,
}

/// A store of sessions. `Send + Sync`: share it (it is a cheap handle) and
/// append to different sessions from many threads.
#[derive(Clone)]
pub struct Store {
    pub(super) inner: Arc<Inner>,
}

pub(super) const LOCK_FILE: &str = "LOCK";

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
            gc.stop.store(true, std::sync::atomic::Ordering::Release);
            gc.thread.thread().unpark();
            let _ = gc.thread.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_group_commit();
        // Best effort for Batched/None: what an explicit close would sync.
        if !self.read_only {
            let _ = sync_dirty(&self.sessions);
        }
    }
}

/// The group-commit thread of [`Durability::Batched`]: wakes every `window`
/// and syncs the dirty sessions; stopped and joined by close or drop.
pub(super) fn spawn_group_commit(
    sessions: Arc<Sessions>,
    window: std::time::Duration,
) -> GroupCommit {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("sessionlog-group-commit".into())
        .spawn(move || {
            use std::sync::atomic::Ordering;
            // Holds the sessions, never the store: dropping the last store
            // handle stops this thread and releases the lock at once.
            while !flag.load(Ordering::Acquire) {
                std::thread::park_timeout(window);
                if flag.load(Ordering::Acquire) {
                    return;
                }
                let _ = sync_dirty(&sessions);
            }
        })
        .expect("spawn the group-commit thread");
    GroupCommit { stop, thread }
}

impl Store {
    /// Creates or opens the store in `dir`, taking its exclusive write lock.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        Self::open_with(dir.as_ref(), options, false)
    }

    /// Opens an existing store without the write lock; never writes. A torn
    /// tail is ignored (not truncated) and closers are synthesised in memory.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(dir.as_ref(), Options::default(), true)
    }

    /// [`Store::open`] with every file operation going through `vfs`
    /// (replacing `options.vfs`).
    pub fn open_with_vfs(
        dir: impl AsRef<Path>,
        options: Options,
        vfs: Arc<dyn Vfs>,
    ) -> Result<Store> {
        Self::open_with(dir.as_ref(), Options { vfs, ..options }, false)
    }

    /// [`Store::open_read_only`] through `vfs`.
    pub fn open_read_only_with_vfs(dir: impl AsRef<Path>, vfs: Arc<dyn Vfs>) -> Result<Store> {
        Self::open_with(
            dir.as_ref(),
            Options {
                vfs,
                ..Options::default()
            },
            true,
        )
    }

    pub(super) fn open_with(dir: &Path, options: Options, read_only: bool) -> Result<Store> {
        let vfs = options.vfs.clone();
        // The manifest first: a store is created only in a missing or empty
        // directory, and the lock file would make it non-empty.
        let manifest = if read_only {
            Manifest::open_with(&*vfs, dir)
        } else {
            Manifest::open_or_create_with(&*vfs, dir).map(|(m, _)| m)
        }
        .map_err(|e| Error::Store(e.to_string()))?;
        let lock = if read_only {
            None
        } else {
            let path = dir.join(LOCK_FILE);
            match vfs.lock(&path) {
                Ok(Some(lock)) => Some(lock),
                Ok(None) => return Err(Error::Locked { path }),
                Err(e) => return Err(Error::Io { path, source: e }),
            }
        };
        let registry = Registry::open(vfs.clone(), dir, !read_only)
            .map_err(|(path, source)| Error::Io { path, source })?;
        if !read_only {
            // Sessions a crash left half-built: never published, so never
            // acknowledged (this process holds the store's write lock, so no
            // other process is building them).
            for staged in registry
                .staged()
                .map_err(|(path, source)| Error::Io { path, source })?
            {
                registry
                    .discard(&staged)
                    .map_err(|(path, source)| Error::Io { path, source })?;
            }
        }
        let store = Store {
            inner: Arc::new(Inner {
                options,
                read_only,
                store_id: manifest.store_id,
                _lock: lock,
                registry,
                pending: Mutex::new(HashMap::new()),
                sessions: Arc::new(RwLock::new(HashMap::new())),
                recoveries: Mutex::new(HashMap::new()),
                group_commit: Mutex::new(None),
            }),
        };
        if let (Durability::Batched { window }, false) = (store.inner.options.durability, read_only)
        {
            let handle = spawn_group_commit(store.inner.sessions.clone(), window);
            *store.inner.group_commit.lock().expect("lock") = Some(handle);
        }
        Ok(store)
    }

    /// The headers of every stored session, sorted by id, read from the
    /// sessions' own directories (no log is read). A session declared with
    /// [`Store::create`] and never appended to is not listed; a directory
    /// that is not a readable session is not either: see
    /// [`Store::unaccounted`].
    pub fn list(&self) -> Result<Vec<SessionHeader>> {
        let (sessions, _) = self.scan()?;
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
        if self.inner.read_only {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// How the session was recovered when it was first loaded.
    pub fn recovery(&self, id: &str) -> Option<Recovery> {
        self.inner.recoveries.lock().expect("lock").get(id).cloned()
    }

    pub(super) fn session(&self, id: &str) -> Result<Arc<Mutex<Session>>> {
        if let Some(s) = self.inner.sessions.read().expect("sessions lock").get(id) {
            return Ok(s.clone());
        }
        let mut sessions = self.inner.sessions.write().expect("sessions lock");
        if let Some(s) = sessions.get(id) {
            return Ok(s.clone());
        }
        let session = match self.entry(id)? {
            Some(entry) => {
                let (s, rec) = self.load_session(entry, true)?;
                self.inner
                    .recoveries
                    .lock()
                    .expect("lock")
                    .insert(id.to_owned(), rec);
                s
            }
            None => {
                let pending = self.inner.pending.lock().expect("pending lock");
                let header = pending
                    .get(id)
                    .cloned()
                    .ok_or_else(|| Error::NotFound(id.to_owned()))?;
                self.new_session(header)?
            }
        };
        let s = Arc::new(Mutex::new(session));
        sessions.insert(id.to_owned(), s.clone());
        Ok(s)
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
        })
    }

    /// Makes every append durable and writes checkpoints.
    pub fn flush(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        sync_dirty(&self.inner.sessions)?;
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
            if s.since_checkpoint > 0 && !s.poisoned {
                self.write_checkpoint(&mut s, true)?;
            }
        }
        Ok(())
    }

    /// Flushes and releases the store.
    pub fn close(self) -> Result<()> {
        // Stop the group-commit thread first: flush then syncs what is left.
        self.inner.stop_group_commit();
        self.flush()
    }

    /// Maps a segment through the store's file system. Segment files are
    /// only ever appended to within their preallocated length or sealed
    /// (cut to a length past every committed byte); readers only touch
    /// committed bytes, so the mapping never reads past the end of the file
    /// and never sees bytes change (see [`crate::vfs::RealFs`]'s `map`).
    pub(super) fn map_file(&self, path: &Path) -> Result<SegmentBytes> {
        self.inner.options.vfs.map(path).map_err(io_at(path))
    }
}
