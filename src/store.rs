//! The durable store: sessions as segment logs in directories of their
//! own (see `engine::registry`), checkpoints, and crash recovery with
//! repair.
//!
//! Data flow of an append, top to bottom:
//! 1. the batch is folded into the session's [`SessionState`] (every rule of
//!    the model; a bad batch is rejected whole and nothing is written);
//! 2. the batch is encoded ([`codec`]) and written as one record at the end
//!    of the active segment ([`segment`]), rolling over to a new segment when
//!    the active one is full; a failed write takes the fold back;
//! 3. `fdatasync` (in [`Durability::Sync`]) makes it durable before `append`
//!    returns; a failed sync poisons the session;
//! 4. the read indexes (batch index, surface node locations) are extended,
//!    and a checkpoint is written when enough events have accumulated.
//!
//! Sessions are loaded lazily, on first use: loading maps the segments,
//! reads the checkpoint, folds the events after it, truncates a torn tail
//! and closes an interrupted turn (see `format-spec.md`, "Recovery").

use crate::checkpoint::{
    self, BatchEntry, BatchIndex, Checkpoint, CheckpointBody, Coverage, DataLoc,
};
use crate::codec;
use crate::derive::{DeriveCache, Message};
pub use crate::engine::registry::Unaccounted;
use crate::engine::registry::{LookupError, PublishError, Registry, SessionEntry};
use crate::event::{Event, OwnedEvent};
use crate::fsutil;
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::manifest::Manifest;
use crate::segment::{self, ScanOptions, SegmentIdent, SegmentWriter, Tail};
use crate::session::SessionState;
use crate::surface::{EventSource, Surface};
use crate::vfs::{SegmentBytes, Vfs, VfsLock};
use crate::violation::Violation;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// When an append is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` before `append` returns (the default).
    Sync,
    /// Group commit: `append` returns before its batch is durable; one
    /// background thread syncs every dirty session each `window`, so many
    /// appends share one `fdatasync`. [`Store::flush`] waits for it.
    Batched {
        /// How long an append may stay unsynced.
        window: std::time::Duration,
    },
    /// No sync on append; only [`Store::flush`] and [`Store::close`] sync.
    None,
}

/// Store options.
#[derive(Debug, Clone)]
pub struct Options {
    /// When appends are durable.
    pub durability: Durability,
    /// Roll over to a new segment when the active one would pass this size.
    pub segment_size: u64,
    /// The largest batch record accepted, in bytes.
    pub max_record: u32,
    /// Write a checkpoint when this many events were appended since the
    /// last one (or when the log's index grew past the checkpoint's size,
    /// whichever is larger: the cost per event stays O(1) amortised).
    pub checkpoint_every: u64,
    /// Bytes of segment space preallocated (allocated and zeroed) at a time
    /// (default 1 MiB, [`segment::DEFAULT_PREALLOCATE`]).
    pub preallocate: u64,
    /// Also enforce the strict invariants on append.
    pub strict: bool,
    /// The file system every file operation goes through (default: the
    /// real one, [`crate::vfs::RealFs`]).
    pub vfs: Arc<dyn Vfs>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            segment_size: 64 << 20,
            max_record: segment::DEFAULT_MAX_RECORD,
            checkpoint_every: 65_536,
            preallocate: segment::DEFAULT_PREALLOCATE,
            strict: false,
            vfs: crate::vfs::real(),
        }
    }
}

/// Errors of the store. Each names what a person needs to act.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another writer holds the store.
    #[error(
        "store {path} is locked by another writer (open it read-only, or close the other writer)"
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// An I/O error on a file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Damage a crash cannot explain; nothing was truncated.
    #[error("session {session:?} is corrupt in {segment} at offset {offset}: {reason}")]
    Corrupt {
        /// The session id.
        session: String,
        /// The damaged file.
        segment: PathBuf,
        /// Byte offset of the damage.
        offset: u64,
        /// What was found.
        reason: String,
    },
    /// A batch broke a rule of the session model; nothing was stored.
    #[error("session {session:?}: batch rejected at {event_type} {violation}")]
    Rejected {
        /// The session id.
        session: String,
        /// The type of the offending event.
        event_type: String,
        /// The rule, seq and reason.
        violation: Violation,
    },
    /// No such session.
    #[error("session {0:?} does not exist")]
    NotFound(String),
    /// The session already exists.
    #[error("session {0:?} already exists")]
    Exists(String),
    /// An fsync failed earlier; the session refuses writes until reopen.
    #[error("session {0:?} is poisoned by a failed sync; reopen the store")]
    Poisoned(String),
    /// The store was opened read-only.
    #[error("the store is open read-only")]
    ReadOnly,
    /// The session id cannot be stored.
    #[error("invalid session id {id:?}: {reason}")]
    BadId {
        /// The id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The batch is larger than the record limit.
    #[error(
        "session {session:?}: batch of {size} bytes exceeds the record limit of {max} bytes; split it"
    )]
    TooLarge {
        /// The session id.
        session: String,
        /// Encoded size.
        size: u64,
        /// Limit.
        max: u32,
    },
    /// A store-level file (the manifest) is unusable.
    #[error("{0}")]
    Store(String),
}

/// A result of the store.
pub type Result<T> = std::result::Result<T, Error>;

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// A mapped segment.
#[derive(Clone)]
struct Seg {
    first_seq: u64,
    path: PathBuf,
    map: SegmentBytes,
}

/// One loaded session.
struct Session {
    header: SessionHeader,
    uid: [u8; 16],
    /// Segments shared with an ancestor through a fork, and their owners.
    lineage: Lineage,
    dir: PathBuf,
    /// The folded model. While `lazy` holds a checkpoint this is an empty
    /// placeholder: [`Store::materialise`] fills it before any fold, surface
    /// or derive; `Session::next_seq` and `Session::closers` answer from the
    /// checkpoint's head meanwhile.
    state: SessionState,
    derive: DeriveCache,
    /// A checkpoint used at open whose state, derive cache and node
    /// locations are not decoded yet (a reopen that only reads events never
    /// pays for them).
    lazy: Option<Arc<Checkpoint>>,
    segs: Vec<Seg>,
    writer: Option<SegmentWriter>,
    batches: BatchIndex,
    node_locs: Arc<NodeLocs>,
    last_time: i64,
    /// The newest record: (segment, frame offset, end offset, crc).
    last_record: Option<(u64, u64, u64, u32)>,
    since_checkpoint: u64,
    dirty: bool,
    poisoned: bool,
    /// A session declared with `create` and not yet published: its first
    /// append publishes it.
    unpublished: bool,
    /// `dir` is the session's staging directory (being built, not visible).
    staged: bool,
    /// An import in progress: no sync per batch (one at the end).
    defer_sync: bool,
    /// The committed end of the last, unsealed segment as found at load
    /// (read-only stores have no writer to ask).
    active_end: Option<u64>,
    /// The log prefix a checkpoint covered at load, whose records were not
    /// scanned then: (segment, end offset). Checked before derive reads
    /// message data from it.
    unverified: Option<(u64, u64)>,
}

/// What a reader sees: the mapped segments and where the data lies.
#[derive(Clone)]
pub struct Snapshot {
    segs: Vec<Seg>,
    node_locs: Arc<NodeLocs>,
}

impl EventSource for Snapshot {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        data_in(&self.segs, &self.node_locs, seq)
    }
}

/// A borrowed [`Snapshot`]: what the fold of an append reads, without
/// taking a reference to the node-location map (which would make the next
/// index update copy it).
struct View<'a> {
    segs: &'a [Seg],
    node_locs: &'a NodeLocs,
}

impl EventSource for View<'_> {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        data_in(self.segs, self.node_locs, seq)
    }
}

/// Where the data of each surface node lies, in increasing seq order (nodes
/// are only ever added with a seq above every earlier one), found by binary
/// search: no hashing on append, and the checkpoint's `NODES` table as it is.
#[derive(Debug, Clone, Default)]
struct NodeLocs(Vec<(u64, DataLoc)>);

impl NodeLocs {
    fn get(&self, seq: u64) -> Option<&DataLoc> {
        let i = self.0.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        Some(&self.0[i].1)
    }

    fn push(&mut self, seq: u64, loc: DataLoc) {
        debug_assert!(self.0.last().is_none_or(|(s, _)| *s < seq));
        self.0.push((seq, loc));
    }
}

/// The stored data of surface node `seq`, read in place from its segment.
fn data_in<'a>(segs: &'a [Seg], node_locs: &NodeLocs, seq: u64) -> Option<&'a RawValue> {
    let loc = node_locs.get(seq)?;
    // Segments are sorted by first seq.
    let i = segs
        .partition_point(|s| s.first_seq <= loc.segment)
        .checked_sub(1)?;
    let seg = segs.get(i).filter(|s| s.first_seq == loc.segment)?;
    let bytes = seg
        .map
        .get(loc.offset as usize..loc.offset as usize + loc.len as usize)?;
    // The bytes were valid JSON when appended, and their record's CRC was
    // checked (at open, or by `verify_covered` before derive); only UTF-8 is
    // needed for a sound RawValue.
    Some(crate::codec::raw_value(std::str::from_utf8(bytes).ok()?))
}

/// Derived messages, borrowing from the mapped segments.
pub struct Derived {
    snapshot: Snapshot,
    cache: DeriveCache,
}

impl Derived {
    /// The messages, zero-copy.
    pub fn messages(&self) -> impl Iterator<Item = Message<'_>> + '_ {
        self.cache
            .messages(&self.snapshot)
            .map(|m| m.expect("surface node data is indexed"))
    }
}

/// What [`Store::verify`] checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Events decoded and folded.
    pub events: u64,
    /// Segment files scanned.
    pub segments: u64,
    /// Bytes of headers, records and footers checked.
    pub bytes: u64,
}

/// Size and checkpoint figures of a session ([`Store::stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Events in the log.
    pub events: u64,
    /// Segment files.
    pub segments: u64,
    /// Bytes of the log on disk (sealed files, and the active segment up to
    /// its committed end; preallocated space not counted).
    pub bytes: u64,
    /// Bytes the same events take as plain JSONL (one event per line).
    pub jsonl_bytes: u64,
    /// Events appended since the last checkpoint.
    pub events_since_checkpoint: u64,
    /// When the checkpoint file was last written.
    pub checkpoint_modified: Option<std::time::SystemTime>,
}

/// What opening a session found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// A checkpoint was used (false: rebuilt from the log).
    pub used_checkpoint: bool,
    /// Why the checkpoint was not used.
    pub rebuild_reason: Option<String>,
    /// Events folded after the checkpoint.
    pub replayed: u64,
    /// Bytes of torn tail discarded.
    pub torn_at: Option<u64>,
    /// Closers appended (or, read-only, synthesised in memory).
    pub closers: u64,
}

struct Inner {
    options: Options,
    read_only: bool,
    store_id: [u8; 16],
    _lock: Option<VfsLock>,
    registry: Registry,
    pending: Mutex<HashMap<String, SessionHeader>>,
    /// Shared with the group-commit thread, which never holds the store
    /// itself (so dropping the last handle releases the lock at once).
    sessions: Arc<Sessions>,
    recoveries: Mutex<HashMap<String, Recovery>>,
    /// The group-commit thread (Batched mode), stopped and joined by close.
    group_commit: Mutex<Option<GroupCommit>>,
}

/// The handle of the group-commit thread.
struct GroupCommit {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// A store of sessions. `Send + Sync`: share it (it is a cheap handle) and
/// append to different sessions from many threads.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

const LOCK_FILE: &str = "LOCK";

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

    fn open_with(dir: &Path, options: Options, read_only: bool) -> Result<Store> {
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

    fn scan(&self) -> Result<(Vec<SessionEntry>, Vec<Unaccounted>)> {
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
    fn entry(&self, id: &str) -> Result<Option<SessionEntry>> {
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

    fn writable(&self) -> Result<()> {
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

    fn session(&self, id: &str) -> Result<Arc<Mutex<Session>>> {
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

    fn session_dir(&self, id: &str) -> Result<PathBuf> {
        self.inner.registry.live_dir(id).map_err(|e| Error::BadId {
            id: id.to_owned(),
            reason: e.to_string(),
        })
    }

    fn new_session(&self, header: SessionHeader) -> Result<Session> {
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

    /// Appends a batch of events: the first seq must be the session's next
    /// seq, the batch contiguous, every rule of the model kept. A bad batch
    /// is rejected whole and nothing is stored. Returns once the batch is
    /// durable (in [`Durability::Sync`]).
    pub fn append(&self, id: &str, events: &[Event<'_>]) -> Result<()> {
        self.writable()?;
        if events.is_empty() {
            return Ok(());
        }
        let session = self.session(id)?;
        let mut s = session.lock().expect("session lock");
        let appended = self.append_locked(&mut s, events);
        if s.poisoned && s.unpublished {
            // Its first batch was never published and its staged directory
            // is gone: forget the half-built session. After an I/O error the
            // declaration stays, so a retry starts afresh; when another
            // process created the id meanwhile, the next use loads theirs.
            if s.staged {
                let _ = self.inner.registry.discard(&s.dir);
            }
            drop(s);
            self.inner
                .sessions
                .write()
                .expect("sessions lock")
                .remove(id);
            if matches!(appended, Err(Error::Exists(_))) {
                self.inner.pending.lock().expect("pending lock").remove(id);
            }
        }
        appended
    }

    /// Appends one event, assigning its seq (the next) and time (`time_ms`),
    /// like the harness's `Session.append(type, data, surfaceIntent)`.
    /// Returns the seq given.
    pub fn append_new(&self, id: &str, mut event: OwnedEvent, time_ms: i64) -> Result<u64> {
        self.writable()?;
        let session = self.session(id)?;
        let mut s = session.lock().expect("session lock");
        event.seq = s.next_seq();
        event.time = time_ms;
        self.append_locked(&mut s, std::slice::from_ref(&event))?;
        Ok(event.seq)
    }

    fn append_locked(&self, s: &mut Session, events: &[Event<'_>]) -> Result<()> {
        let id = s.header.id.clone();
        if s.poisoned {
            return Err(Error::Poisoned(id));
        }
        self.materialise(s)?;
        let Session {
            state,
            segs,
            node_locs,
            ..
        } = &mut *s;
        let view = View { segs, node_locs };
        let undo = state
            .append_batch_undoable(events, &view)
            .map_err(|violation| rejected(&id, events, violation))?;
        if let Err(e) = self.write_batch(s, events) {
            s.state.revert(undo);
            return Err(e);
        }
        Ok(())
    }

    /// Steps 2-4 of an append, after the fold accepted the batch.
    fn write_batch(&self, s: &mut Session, events: &[Event<'_>]) -> Result<()> {
        let opts = &self.inner.options;
        let id = s.header.id.clone();
        let mut payload = Vec::new();
        // Message events stay verbatim: derive reads them in place from the
        // mapping. Everything else (chunks above all) goes into the batch's
        // compressed pack when that pays. The encoder reports where each
        // verbatim `data` lands, so indexing the batch below needs no
        // re-decode of what was just written.
        let mut data_ranges = Vec::with_capacity(events.len());
        codec::encode_batch_indexed(
            events,
            0,
            codec::EncodeOptions {
                compress: true,
                verbatim_surface: true,
            },
            &mut payload,
            &mut data_ranges,
        )
        .map_err(|e| Error::Store(format!("session {id:?}: encoding the batch failed: {e}")))?;
        let size = (payload.len() + segment::BATCH_HEADER_LEN) as u64;
        if size > u64::from(opts.max_record) {
            return Err(Error::TooLarge {
                session: id,
                size,
                max: opts.max_record,
            });
        }
        let first_seq = events[0].seq;
        let first_append = s.unpublished;
        let vfs = &*opts.vfs;
        if first_append && !s.staged {
            // A new session is built where no other process looks, and
            // published whole once its first batch is durable.
            s.dir = self
                .inner
                .registry
                .stage(&s.header, &s.uid)
                .map_err(|(path, source)| Error::Io { path, source })?;
            s.staged = true;
        }
        let full = s.writer.as_ref().is_some_and(|w| {
            w.len() + size + segment::FRAME_OVERHEAD as u64 > opts.segment_size && !w.is_empty()
        });
        if full {
            self.roll_over(s)?;
        }
        if s.writer.is_none() {
            self.start_segment(s, first_seq)?;
        }
        let writer = s.writer.as_mut().expect("active segment");
        let seg_first = writer.ident().first_seq;
        let path = s.segs.last().expect("active segment mapped").path.clone();
        let loc = writer
            .append(first_seq, events.len() as u32, &payload)
            .map_err(|e| segment_error(&id, &path, e))?;
        s.dirty = true;
        if opts.durability == Durability::Sync && !s.defer_sync {
            s.sync_now()?;
        }
        if first_append {
            // The session becomes visible only once its first batch is durable
            // (in every mode: a session never appears empty after a crash),
            // by one rename of its directory. The record is already written,
            // so a failure here cannot be rolled back in place: the session
            // is poisoned, and its staged directory discarded.
            if opts.durability != Durability::Sync {
                s.sync_now()?;
            }
            match self.inner.registry.publish(&s.dir, &id) {
                Ok(live) => s.move_to(live),
                Err(PublishError::Unsynced(live, path, source)) => {
                    // Visible, but not known durable: like a failed fsync.
                    s.move_to(live);
                    s.unpublished = false;
                    s.poisoned = true;
                    self.inner.pending.lock().expect("pending lock").remove(&id);
                    return Err(Error::Io { path, source });
                }
                Err(e) => {
                    s.poisoned = true;
                    let _ = self.inner.registry.discard(&s.dir);
                    s.staged = false;
                    return Err(publish_error(e, &id));
                }
            }
            s.unpublished = false;
            self.inner.pending.lock().expect("pending lock").remove(&id);
        }
        // Index the batch: remap when the record lies past the mapping (or
        // when the file system's maps are copies, not views of the file).
        // The record is in the segment now (durable in Sync mode), so the
        // caller's undo of the fold would leave the index behind the log:
        // a failure here poisons the session instead (reopen re-reads it).
        let end = loc.offset + loc.payload_len as u64 + segment::FRAME_OVERHEAD as u64;
        let indexed = (|| -> Result<()> {
            if s.segs.last().expect("active").map.len() < end as usize || !vfs.coherent_maps() {
                // (Read the path again: a first append moved the directory.)
                let path = s.segs.last().expect("active").path.clone();
                let map = self.map_file(&path)?;
                s.segs.last_mut().expect("active").map = map;
            }
            let map = s.segs.last().expect("active").map.clone();
            let r = segment::BatchLoc {
                offset: loc.offset,
                payload: loc.offset + 8..loc.offset + 8 + u64::from(loc.payload_len),
                first_seq,
                count: events.len() as u32,
            };
            let base = r.codec_range().start as usize;
            let last_time = events.last().expect("a batch is not empty").time;
            s.index_batch(seg_first, &map, &r, last_time, |i| {
                let d = data_ranges[i].as_ref()?;
                Some(base + d.start..base + d.end)
            })
            .map_err(|why| Error::Store(format!("session {id:?}: indexing a written batch: {why}")))
        })();
        if let Err(e) = indexed {
            s.poisoned = true;
            return Err(e);
        }
        s.since_checkpoint += events.len() as u64;
        let threshold = opts
            .checkpoint_every
            .max(s.batches.len() as u64 + s.state.surface().len() as u64);
        if s.since_checkpoint >= threshold {
            // The batch is written and indexed (and durable in Sync mode):
            // failing the append now would make the caller's undo of the
            // fold disagree with the log. The checkpoint is only a cache;
            // `since_checkpoint` stays, so the next append past the
            // threshold or `flush` tries again (and `flush` reports it).
            let _ = self.write_checkpoint(s, false);
        }
        Ok(())
    }

    fn start_segment(&self, s: &mut Session, first_seq: u64) -> Result<()> {
        let ident = SegmentIdent {
            store_id: self.inner.store_id,
            session_uid: s.uid,
            first_seq,
        };
        let path = s.dir.join(segment::segment_file_name(first_seq));
        let vfs = &*self.inner.options.vfs;
        // On failure `create_with` removes the file itself: a retry can
        // create it again.
        let mut w = SegmentWriter::create_with(vfs, &path, &ident, self.inner.options.preallocate)
            .map_err(|e| segment_error(&s.header.id, &path, e))?;
        w.set_max_record(self.inner.options.max_record)
            .map_err(|e| segment_error(&s.header.id, &path, e))?;
        let finish = || -> Result<SegmentBytes> {
            // The new segment's name must be durable before a batch in it is
            // acknowledged: otherwise a crash could lose the whole file.
            vfs.sync_dir(&s.dir).map_err(io_at(&s.dir))?;
            self.map_file(&path)
        };
        let map = match finish() {
            Ok(map) => map,
            Err(e) => {
                // The file exists (holding no record) but its name may not be
                // durable: a failed directory fsync is a failed fsync. The
                // session is poisoned; the next open finds the empty segment
                // (or no file) and continues from there.
                s.poisoned = true;
                return Err(e);
            }
        };
        s.segs.push(Seg {
            first_seq,
            path,
            map,
        });
        s.writer = Some(w);
        Ok(())
    }

    fn roll_over(&self, s: &mut Session) -> Result<()> {
        s.sync_if_dirty()?;
        let w = s.writer.take().expect("active segment");
        s.active_end = None;
        let path = s.segs.last().expect("active").path.clone();
        let sealed = w
            .seal_auto()
            .and_then(|()| segment::map_sealed_with(&*self.inner.options.vfs, &path))
            .map_err(|e| segment_error(&s.header.id, &path, e));
        match sealed {
            Ok(map) => {
                s.segs.last_mut().expect("active").map = map;
                Ok(())
            }
            Err(e) => {
                // The writer is gone and the segment may hold a footer
                // without its cut, or no footer: a new segment after it
                // would make an unsealed segment a middle one (corruption
                // at the next open). The old map may also reach past the cut
                // file. Poisoned: the next open completes or undoes the seal.
                s.poisoned = true;
                Err(e)
            }
        }
    }

    /// Writes the session's checkpoint. The derive cache in it is brought up
    /// to date when that is incremental, or when `complete` (flush, close):
    /// a checkpoint taken in passing during appends keeps a cache that a
    /// replacement made stale rather than rebuild it, since the rebuild is
    /// O(surface) and a stale cache only makes the next derive rebuild it.
    fn write_checkpoint(&self, s: &mut Session, complete: bool) -> Result<()> {
        let Some((segment_first_seq, last_record_offset, end_offset, crc)) = s.last_record else {
            return Ok(());
        };
        self.materialise(s)?;
        // A checkpoint only ever covers durable records.
        s.sync_if_dirty()?;
        let Session {
            derive,
            state,
            segs,
            node_locs,
            header,
            ..
        } = &mut *s;
        if complete || !derive.needs_rebuild(state.surface()) {
            derive
                .update(state.surface(), &View { segs, node_locs })
                .map_err(|e| Error::Store(format!("session {:?}: {e}", header.id)))?;
        }
        let body = CheckpointBody {
            coverage: Coverage {
                segment_first_seq,
                last_record_offset,
                end_offset,
                last_record_crc: crc,
                next_seq: s.state.next_seq(),
            },
            last_time: s.last_time,
            state: s.state.clone(),
            derive: s.derive.clone(),
            batches: s.batches.to_vec(),
            node_locs: s.node_locs.0.clone(),
        };
        checkpoint::write_with(&*self.inner.options.vfs, &s.dir, &body)
            .map_err(|e| Error::Store(format!("session {:?}: {e}", s.header.id)))?;
        s.since_checkpoint = 0;
        Ok(())
    }

    /// Loads a stored session: verify the checkpoint against the log, map
    /// the segments, fold the events after the checkpoint, handle a torn
    /// tail, close an interrupted turn.
    ///
    /// Cost: O(segments) for the sealed segments the checkpoint covers (their
    /// footers are checked, not their records), O(batches) to check the
    /// checkpoint's batch index, plus O(records after the checkpoint). The
    /// checkpoint's surface, derive cache and node locations are decoded
    /// only when something needs them ([`Store::materialise`]), or at once
    /// when events after it must be folded or closers appended.
    fn load_session(&self, entry: SessionEntry, repair: bool) -> Result<(Session, Recovery)> {
        self.load_session_with(entry, repair, true)
    }

    /// [`Store::load_session`], ignoring the checkpoint unless
    /// `use_checkpoint`: a checkpoint found wrong while it is materialised
    /// restarts the load without it.
    fn load_session_with(
        &self,
        entry: SessionEntry,
        repair: bool,
        use_checkpoint: bool,
    ) -> Result<(Session, Recovery)> {
        let restart = |why: String| -> Result<(Session, Recovery)> {
            let (s, mut rec) = self.load_session_with(entry.clone(), repair, false)?;
            rec.rebuild_reason = Some(why);
            Ok((s, rec))
        };
        let uid = entry.uid;
        let mut s = self.new_session(entry.header.clone())?;
        s.uid = uid;
        s.dir = entry.dir.clone();
        s.unpublished = false;
        let vfs = &*self.inner.options.vfs;
        s.lineage = Lineage::read_with(vfs, &s.dir).map_err(|reason| Error::Corrupt {
            session: s.header.id.clone(),
            segment: s.dir.join(crate::lineage::LINEAGE_FILE),
            offset: 0,
            reason,
        })?;
        let id = s.header.id.clone();
        let mut rec = Recovery::default();
        let mut files: Vec<(u64, PathBuf)> = vfs
            .read_dir(&s.dir)
            .map_err(io_at(&s.dir))?
            .into_iter()
            .filter_map(|name| {
                let name = name.into_string().ok()?;
                segment::parse_segment_file_name(&name).map(|seq| (seq, s.dir.join(name)))
            })
            .collect();
        files.sort();
        let store_id = self.inner.store_id;
        let lineage = s.lineage.clone();
        let ident_of = |first_seq| SegmentIdent {
            store_id,
            session_uid: lineage.owner(first_seq).unwrap_or(uid),
            first_seq,
        };
        let maps: Vec<SegmentBytes> = files
            .iter()
            .map(|(_, p)| self.map_file(p))
            .collect::<Result<_>>()?;

        // The checkpoint is a cache: use it only if the record it claims to
        // end at is in the log, with the checksum it recorded.
        let mut covered: Option<Coverage> = None;
        let opened = if use_checkpoint {
            checkpoint::open_with(vfs, &s.dir)
        } else {
            Err(checkpoint::CheckpointError::Missing)
        };
        match opened {
            Ok(ck) => {
                let c = ck.coverage();
                let found = files.iter().position(|(f, _)| *f == c.segment_first_seq);
                let ok = found.is_some_and(|i| {
                    segment::record_at(
                        &maps[i],
                        &ident_of(c.segment_first_seq),
                        c.last_record_offset,
                    )
                    .is_some_and(|loc| {
                        loc.end() == c.end_offset
                            && loc.last_seq() + 1 == c.next_seq
                            && crc_at(&maps[i], loc.offset) == c.last_record_crc
                    })
                });
                let batches = ck.batches();
                let consistent = if ok {
                    batches_consistent(&batches, &files, &maps)
                } else {
                    Err("checkpoint does not match the log".into())
                };
                if let Err(why) = consistent {
                    rec.rebuild_reason = Some(why);
                } else {
                    s.batches = batches;
                    s.last_time = ck.last_time();
                    s.last_record = Some((
                        c.segment_first_seq,
                        c.last_record_offset,
                        c.end_offset,
                        c.last_record_crc,
                    ));
                    covered = Some(c);
                    s.unverified = Some((c.segment_first_seq, c.end_offset));
                    s.lazy = Some(Arc::new(ck));
                }
            }
            Err(e) if use_checkpoint => rec.rebuild_reason = Some(e.to_string()),
            Err(_) => {}
        }
        rec.used_checkpoint = covered.is_some();

        let scan_opts = |sealed| ScanOptions {
            max_record: self
                .inner
                .options
                .max_record
                .max(segment::DEFAULT_MAX_RECORD),
            expect_sealed: sealed,
        };
        let corrupt = |path: &Path, offset, reason: String| Error::Corrupt {
            session: id.clone(),
            segment: path.to_owned(),
            offset,
            reason,
        };
        let n = files.len();
        let mut expected_first = 0u64;
        let mut torn: Option<(PathBuf, u64)> = None;
        let mut active: Option<(SegmentIdent, PathBuf, segment::Scan)> = None;
        for (i, (first_seq, path)) in files.iter().enumerate() {
            let (first_seq, map) = (*first_seq, maps[i].clone());
            let ident = ident_of(first_seq);
            if first_seq != expected_first {
                return Err(corrupt(
                    path,
                    0,
                    format!(
                        "segment starts at seq {first_seq}, expected {expected_first}: a segment is missing"
                    ),
                ));
            }
            let last = i + 1 == n;
            s.segs.push(Seg {
                first_seq,
                path: path.clone(),
                map: map.clone(),
            });
            if !last {
                if segment::read_header(&map).map_err(|e| segment_error(&id, path, e))? != ident {
                    return Err(corrupt(
                        path,
                        12,
                        "segment identity does not match its session".into(),
                    ));
                }
                let footer =
                    segment::verify_footer(&map).map_err(|e| segment_error(&id, path, e))?;
                expected_first = footer.last_seq + 1;
                if covered.is_some_and(|c| {
                    footer.last_seq < c.next_seq && c.segment_first_seq != first_seq
                }) {
                    continue; // wholly covered by the checkpoint
                }
            }
            let scan = match covered.filter(|c| c.segment_first_seq == first_seq) {
                Some(c) => {
                    segment::scan_from(&map, &ident, &scan_opts(!last), c.end_offset, c.next_seq)
                }
                None => segment::scan(&map, &ident, &scan_opts(!last)),
            }
            .map_err(|e| segment_error(&id, path, e))?;
            for b in &scan.batches {
                if b.first_seq < s.next_seq() {
                    continue; // a full rescan after a resume met a footer
                }
                // Events after the checkpoint are folded into its state.
                if let Some(ck) = s.lazy.take()
                    && let Err(why) = install(&mut s, &ck, |seg| len_in(&files, &maps, seg))
                {
                    drop(s);
                    return restart(why);
                }
                let r = b.codec_range();
                let events = codec::decode_batch(
                    &map[r.start as usize..r.end as usize],
                    b.first_seq,
                    b.count,
                    0,
                )
                .map_err(|e| corrupt(path, b.offset, format!("batch does not decode: {e}")))?;
                let Session {
                    state,
                    segs,
                    node_locs,
                    ..
                } = &mut s;
                let view = View { segs, node_locs };
                state.append_batch(&events, &view).map_err(|v| {
                    corrupt(path, b.offset, format!("stored batch breaks a rule: {v}"))
                })?;
                let last_time = events.last().map_or(s.last_time, |e| e.time);
                s.index_batch(first_seq, &map, b, last_time, |i| {
                    verbatim_range(&map, events[i].data.get())
                })
                .map_err(|why| corrupt(path, b.offset, why))?;
                rec.replayed += events.len() as u64;
            }
            if last {
                expected_first = s.next_seq();
                if let Tail::Torn { offset, .. } = scan.tail {
                    torn = Some((path.clone(), offset));
                    rec.torn_at = Some(offset);
                }
                if scan.is_sealed() {
                    if !self.inner.read_only {
                        // A crash between the footer write and the cut.
                        SegmentWriter::complete_seal_with(vfs, path, &scan)
                            .map_err(|e| segment_error(&id, path, e))?;
                    }
                } else {
                    s.active_end = Some(scan.valid_end.max(segment::HEADER_LEN as u64));
                    active = Some((ident, path.clone(), scan));
                }
            } else {
                expected_first = s.next_seq().max(expected_first);
            }
        }
        // Replayed events are not in any checkpoint yet: the next flush
        // writes one, so the next open does not replay them again.
        s.since_checkpoint = rec.replayed;
        if self.inner.read_only {
            rec.closers = s.closers().len() as u64;
            return Ok((s, rec));
        }
        if let Some((path, offset)) = torn {
            // The torn bytes are zeroed durably before anything is appended
            // after them, so they can never be mistaken for a record again.
            SegmentWriter::discard_tail_with(vfs, &path, offset).map_err(io_at(&path))?;
        }
        if let Some((ident, path, scan)) = active {
            // Resume at the end of the valid records: no need to read the
            // records before it again.
            let w = if scan.valid_end == 0 {
                // A crash while the segment was created: rewrite its header.
                SegmentWriter::open_append_with(vfs, &path, &ident, &scan)
            } else {
                SegmentWriter::resume_with(vfs, &path, &ident, scan.valid_end, s.next_seq())
            };
            let mut w = w.map_err(|e| segment_error(&id, &path, e))?;
            w.set_max_record(self.inner.options.max_record)
                .map_err(|e| segment_error(&id, &path, e))?;
            s.writer = Some(w);
        }
        if repair && !s.closers().is_empty() {
            // Closers are folded: the checkpoint's state is needed now.
            if let Some(ck) = s.lazy.take()
                && let Err(why) = install(&mut s, &ck, |seg| len_in(&files, &maps, seg))
            {
                drop(s);
                return restart(why);
            }
            rec.closers = self.append_closers(&mut s)?.len() as u64;
        }
        Ok((s, rec))
    }

    /// Closes an interrupted last turn: appends the repair closers as one
    /// batch and syncs it, whatever the durability mode. Returns them (empty
    /// when the log is balanced).
    fn append_closers(&self, s: &mut Session) -> Result<Vec<OwnedEvent>> {
        self.materialise(s)?;
        let closers = s.state.closers();
        if !closers.is_empty() {
            self.append_locked(s, &closers)?;
            s.sync_now()?;
        }
        Ok(closers)
    }

    /// Decodes what the session's checkpoint left in place at open (its
    /// state, derive cache and node locations), checking it first. A
    /// checkpoint found wrong here is dropped and the session rebuilt from
    /// the log, and [`Store::recovery`] reports the rebuild and why.
    fn materialise(&self, s: &mut Session) -> Result<()> {
        let Some(ck) = s.lazy.take() else {
            return Ok(());
        };
        let lens: Vec<(u64, u64)> = s
            .segs
            .iter()
            .map(|g| (g.first_seq, g.map.len() as u64))
            .collect();
        let len_of = |segment: u64| lens.iter().find(|(f, _)| *f == segment).map(|g| g.1);
        let Err(why) = install(s, &ck, len_of) else {
            return Ok(());
        };
        drop(ck);
        let id = s.header.id.clone();
        // The rebuild replaces the session whole (its writer too); the old
        // one never appended anything after its checkpoint.
        let placeholder = self.new_session(s.header.clone())?;
        let old = std::mem::replace(s, placeholder);
        let entry = SessionEntry {
            header: old.header.clone(),
            uid: old.uid,
            dir: old.dir.clone(),
        };
        drop(old);
        let (fresh, mut rec) = self.load_session_with(entry, true, false)?;
        rec.rebuild_reason = Some(why);
        *s = fresh;
        self.inner.recoveries.lock().expect("lock").insert(id, rec);
        Ok(())
    }

    /// Checks, once per open, the records a checkpoint covered (they were
    /// not scanned at open, to keep reopen cheap): sealed segments against
    /// their footer's checksum of all records, the covering segment record by
    /// record up to the covered end. Derive reads message data in place from
    /// these records, so it must not trust them unchecked.
    fn verify_covered(&self, s: &mut Session) -> Result<()> {
        let Some((last, end)) = s.unverified else {
            return Ok(());
        };
        let max_record = self
            .inner
            .options
            .max_record
            .max(segment::DEFAULT_MAX_RECORD);
        for seg in s.segs.iter().take_while(|g| g.first_seq <= last) {
            let ident = s.ident(self.inner.store_id, seg.first_seq);
            let corrupt = |offset: u64, reason: String| Error::Corrupt {
                session: s.header.id.clone(),
                segment: seg.path.clone(),
                offset,
                reason,
            };
            if seg.first_seq < last {
                let footer = segment::verify_footer(&seg.map)
                    .map_err(|e| segment_error(&s.header.id, &seg.path, e))?;
                let records = &seg.map[segment::HEADER_LEN..seg.map.len() - segment::FOOTER_LEN];
                if crc32fast::hash(records) != footer.records_crc {
                    return Err(corrupt(
                        segment::HEADER_LEN as u64,
                        "the records do not match the footer's checksum".into(),
                    ));
                }
            } else {
                let prefix = seg.map.get(..end as usize).ok_or_else(|| {
                    corrupt(
                        end,
                        "the segment is shorter than the checkpoint covers".into(),
                    )
                })?;
                let opts = ScanOptions {
                    max_record,
                    expect_sealed: false,
                };
                let scan = segment::scan(prefix, &ident, &opts)
                    .map_err(|e| segment_error(&s.header.id, &seg.path, e))?;
                if scan.valid_end != end {
                    return Err(corrupt(
                        scan.valid_end,
                        "the records end before the checkpoint's covered end".into(),
                    ));
                }
            }
        }
        s.unverified = None;
        Ok(())
    }

    /// The session's header and events.
    pub fn load(&self, id: &str) -> Result<(SessionHeader, Vec<OwnedEvent>)> {
        let events = self.read_from(id, 0)?;
        let session = self.session(id)?;
        let header = session.lock().expect("session lock").header.clone();
        Ok((header, events))
    }

    /// The events from `seq` on.
    pub fn read_from(&self, id: &str, seq: u64) -> Result<Vec<OwnedEvent>> {
        let session = self.session(id)?;
        let s = session.lock().expect("session lock");
        self.read_from_locked(&s, id, seq, u64::MAX)
    }

    /// The events with seqs in `seq..until`, decoding only the batches that
    /// hold them.
    fn read_from_locked(
        &self,
        s: &Session,
        id: &str,
        seq: u64,
        until: u64,
    ) -> Result<Vec<OwnedEvent>> {
        let start = s.batches.after_seq(seq).saturating_sub(1);
        let mut closers = Vec::new();
        if self.inner.read_only {
            closers = s.closers();
        }
        let stored_end = s.next_seq().min(until);
        let mut out = Vec::with_capacity(stored_end.saturating_sub(seq) as usize + closers.len());
        // The seq the next batch must start at: the index must not skip one.
        let mut expected: Option<u64> = (start == 0).then_some(0);
        for b in s
            .batches
            .iter_from(start)
            .take_while(|b| b.first_seq < until)
        {
            let corrupt = |path: &Path, reason: String| Error::Corrupt {
                session: id.to_owned(),
                segment: path.to_owned(),
                offset: b.offset,
                reason,
            };
            let i = s.segs.partition_point(|g| g.first_seq <= b.segment);
            let seg = i
                .checked_sub(1)
                .map(|i| &s.segs[i])
                .filter(|g| g.first_seq == b.segment)
                .ok_or_else(|| {
                    corrupt(
                        &s.dir,
                        format!("the index names segment {} which is not mapped", b.segment),
                    )
                })?;
            // Records a checkpoint covers were not scanned at open: check the
            // frame and its CRC here, before trusting any length in it.
            let ident = s.ident(self.inner.store_id, seg.first_seq);
            let loc = segment::record_at(&seg.map, &ident, b.offset)
                .filter(|loc| loc.first_seq == b.first_seq)
                .ok_or_else(|| {
                    corrupt(
                        &seg.path,
                        "no valid record where the index points (checksum or frame damaged)".into(),
                    )
                })?;
            if expected.is_some_and(|e| e != loc.first_seq) {
                return Err(corrupt(
                    &seg.path,
                    format!(
                        "the index skips from seq {} to batch {}",
                        expected.unwrap_or_default(),
                        loc.first_seq
                    ),
                ));
            }
            expected = Some(loc.first_seq + u64::from(loc.count));
            let r = loc.codec_range();
            let events = codec::decode_batch(
                &seg.map[r.start as usize..r.end as usize],
                loc.first_seq,
                loc.count,
                0,
            )
            .map_err(|e| corrupt(&seg.path, e.to_string()))?;
            for e in events {
                if e.seq >= seq && e.seq < until {
                    out.push(e.into_owned());
                }
            }
        }
        // (A poisoned session may hold a written batch its index missed.)
        if !s.poisoned && until >= s.next_seq() && expected.is_some_and(|e| e != s.next_seq()) {
            return Err(Error::Corrupt {
                session: id.to_owned(),
                segment: s.dir.clone(),
                offset: 0,
                reason: format!(
                    "the batch index ends at seq {} but the log at {}",
                    expected.unwrap_or_default(),
                    s.next_seq()
                ),
            });
        }
        out.extend(
            closers
                .into_iter()
                .filter(|e| e.seq >= seq && e.seq < until),
        );
        Ok(out)
    }

    /// The session's surface.
    pub fn surface(&self, id: &str) -> Result<Surface> {
        let session = self.session(id)?;
        let mut s = session.lock().expect("session lock");
        self.materialise(&mut s)?;
        if self.inner.read_only && s.state.repair().is_open() {
            let mut state = s.state.clone();
            let snap = s.snapshot();
            let closers = state.closers();
            state
                .append_batch(&closers, &snap)
                .map_err(|v| rejected(id, &closers, v))?;
            return Ok(state.surface().clone());
        }
        Ok(s.state.surface().clone())
    }

    /// The derived messages, zero-copy from the mapped segments.
    pub fn derive(&self, id: &str) -> Result<Derived> {
        let session = self.session(id)?;
        let mut s = session.lock().expect("session lock");
        self.materialise(&mut s)?;
        self.verify_covered(&mut s)?;
        let snapshot = s.snapshot();
        let Session { derive, state, .. } = &mut *s;
        derive
            .update(state.surface(), &snapshot)
            .map_err(|e| Error::Store(format!("session {id:?}: {e}")))?;
        Ok(Derived {
            snapshot,
            cache: s.derive.clone(),
        })
    }

    /// Forks `source` at `at` events into a new session `child`: the child
    /// header names `parentSession` and `seedLength`, and `session/end-seed`
    /// is appended unless the seed already ends with one.
    ///
    /// The parent's sealed segments that lie wholly inside the seed are
    /// hard-linked, not copied (their owner is recorded in the child's
    /// `LINEAGE`); only the rest of the seed is written again. The child is
    /// built in staging and published only once it is complete and durable:
    /// a crash before leaves a staged directory that the next writable open
    /// discards.
    pub fn fork(&self, source: &str, at: u64, child: SessionHeader) -> Result<()> {
        self.writable()?;
        let mut header = child;
        let id = header.id.clone();
        if self.exists(&id)?
            || self
                .inner
                .pending
                .lock()
                .expect("pending lock")
                .contains_key(&id)
        {
            return Err(Error::Exists(id));
        }
        self.session_dir(&id)?; // a usable id
        let parent = self.session(source)?;
        let p = parent.lock().expect("session lock");
        let at = at.min(p.next_seq());
        header.parent_session = Some(source.to_owned());
        header.seed_length = Some(at);

        // The shareable prefix: sealed segments that end inside the seed.
        let mut shared = Vec::new();
        let mut shared_end = 0;
        for (i, seg) in p.segs.iter().enumerate() {
            let sealed = i + 1 < p.segs.len() || p.writer.is_none();
            if !sealed {
                break;
            }
            let footer = segment::verify_footer(&seg.map)
                .map_err(|e| segment_error(source, &seg.path, e))?;
            if footer.last_seq >= at {
                break;
            }
            shared.push((
                seg.first_seq,
                p.lineage.owner(seg.first_seq).unwrap_or(p.uid),
                seg.path.clone(),
            ));
            shared_end = footer.last_seq + 1;
        }
        let mut rest = self.read_from_locked(&p, source, shared_end, at)?;
        // The last event of the seed (in the copied tail, or the last shared
        // segment): whether it already ends the seed, and its time.
        let last_of_seed = match rest.last() {
            Some(e) => Some((e.kind == "session/end-seed", e.time)),
            None if at > 0 => self
                .read_from_locked(&p, source, at - 1, at)?
                .first()
                .map(|e| (e.kind == "session/end-seed", e.time)),
            None => None,
        };
        drop(p);
        let (ends_with_seed_marker, seed_time) = last_of_seed.unwrap_or((false, 0));
        if !ends_with_seed_marker {
            let time = seed_time;
            rest.push(OwnedEvent::new("session/end-seed", at, time, "{}").expect("valid JSON"));
        }

        // The child is built in staging and published whole: a crash before
        // leaves a staged directory (discarded at the next open), never a
        // partial child.
        let vfs = &*self.inner.options.vfs;
        let prepare = |staged: &Path| -> Result<()> {
            if !shared.is_empty() {
                // The lineage must be durable before the links it vouches for.
                Lineage::new(shared.iter().map(|(f, uid, _)| (*f, *uid)).collect())
                    .write_with(vfs, staged)
                    .map_err(io_at(staged))?;
                for (first_seq, _, path) in &shared {
                    let link = staged.join(segment::segment_file_name(*first_seq));
                    vfs.hard_link(path, &link).map_err(io_at(&link))?;
                }
            }
            Ok(())
        };
        self.build_and_publish(header, &rest, prepare, false)
    }

    /// Imports a whole session atomically: `events` (from seq 0) are folded
    /// with every rule of the model and written into a staged directory,
    /// synced, and then published in one rename; any failure leaves the
    /// store as it was. A session with no events is stored as such (its
    /// header only). With `replace`, an existing session of that id is
    /// swapped for the new one in one atomic exchange once the new one is
    /// durable (the old one stays in place until then); without it, an
    /// existing id is [`Error::Exists`]. An unclosed last turn is stored as
    /// it is: [`Store::repair`] closes it.
    pub fn import(&self, header: SessionHeader, events: &[Event<'_>], replace: bool) -> Result<()> {
        self.writable()?;
        let id = header.id.clone();
        self.session_dir(&id)?; // a usable id
        if self
            .inner
            .pending
            .lock()
            .expect("pending lock")
            .contains_key(&id)
        {
            return Err(Error::Exists(id));
        }
        let existing = self.entry(&id)?;
        if existing.is_some() && !replace {
            return Err(Error::Exists(id));
        }
        self.build_and_publish(header, events, |_| Ok(()), existing.is_some())
    }

    /// Builds a new session in a staging directory (`prepare` puts files
    /// there first, then `events` are appended with one sync at the end and
    /// a checkpoint), then publishes it under its id, or swaps it in for the
    /// stored session when `replace`. Any failure before the publish
    /// discards the staged directory: nothing partial is ever visible.
    fn build_and_publish(
        &self,
        header: SessionHeader,
        events: &[Event<'_>],
        prepare: impl FnOnce(&Path) -> Result<()>,
        replace: bool,
    ) -> Result<()> {
        let id = header.id.clone();
        let uid = new_uid(&id);
        let registry = &self.inner.registry;
        let staged = registry
            .stage(&header, &uid)
            .map_err(|(path, source)| Error::Io { path, source })?;
        let built = (|| -> Result<Session> {
            prepare(&staged)?;
            let entry = SessionEntry {
                header: header.clone(),
                uid,
                dir: staged.clone(),
            };
            let (mut c, _) = self.load_session(entry, false)?;
            // One sync for the whole build, at the end: nothing is visible
            // before the publish.
            c.defer_sync = true;
            for batch in split_batches(events, self.inner.options.max_record as usize / 4) {
                self.append_locked(&mut c, batch)?;
            }
            c.defer_sync = false;
            c.sync_now()?;
            if c.since_checkpoint > 0 {
                self.write_checkpoint(&mut c, true)?;
            }
            Ok(c)
        })();
        let mut c = match built {
            Ok(c) => c,
            Err(e) => {
                let _ = registry.discard(&staged);
                return Err(e);
            }
        };
        // The old session, if this process has it open, is dropped first:
        // its files are about to go.
        self.inner
            .sessions
            .write()
            .expect("sessions lock")
            .remove(&id);
        let published = if replace {
            // A failure of the exchange leaves the old session in place; a
            // failure after it (syncing, removing the old) leaves the new
            // one: either way nothing is partial, and the staged path holds
            // whichever is not live (discarded at the next open).
            registry
                .replace(&staged, &id)
                .map_err(|(path, source)| (false, Error::Io { path, source }))
        } else {
            registry.publish(&staged, &id).map_err(|e| match e {
                // Visible already: nothing to discard.
                PublishError::Unsynced(..) => (false, publish_error(e, &id)),
                e => (true, publish_error(e, &id)),
            })
        };
        match published {
            Ok(live) => c.move_to(live),
            Err((discard, e)) => {
                if discard {
                    let _ = registry.discard(&staged);
                }
                return Err(e);
            }
        }
        self.inner
            .sessions
            .write()
            .expect("sessions lock")
            .insert(id, Arc::new(Mutex::new(c)));
        Ok(())
    }

    /// Deletes a session: its directory is renamed away durably (from then
    /// on the session does not exist, for every process), then removed.
    pub fn delete(&self, id: &str) -> Result<()> {
        self.writable()?;
        let was_pending = self
            .inner
            .pending
            .lock()
            .expect("pending lock")
            .remove(id)
            .is_some();
        let entry = self.entry(id)?;
        self.inner.sessions.write().expect("lock").remove(id);
        match entry {
            Some(entry) => self
                .inner
                .registry
                .remove(&entry.dir, &entry.uid)
                .map_err(|(path, source)| Error::Io { path, source }),
            None if was_pending => Ok(()),
            None => Err(Error::NotFound(id.to_owned())),
        }
    }

    /// Verifies a session end to end: every segment is scanned record by
    /// record (sealed ones against their footers), every batch decoded, and
    /// the whole log folded again from scratch; the result must equal the
    /// loaded state. Damage is an [`Error::Corrupt`] naming the segment and
    /// offset.
    pub fn verify(&self, id: &str) -> Result<VerifyReport> {
        let session = self.session(id)?;
        let mut s = session.lock().expect("session lock");
        self.materialise(&mut s)?;
        let mut report = VerifyReport::default();
        let mut state = SessionState::new(self.inner.options.strict);
        let mut log: Vec<OwnedEvent> = Vec::new();
        let last = s.segs.len().saturating_sub(1);
        for (i, seg) in s.segs.iter().enumerate() {
            let ident = SegmentIdent {
                store_id: self.inner.store_id,
                session_uid: s.lineage.owner(seg.first_seq).unwrap_or(s.uid),
                first_seq: seg.first_seq,
            };
            // Read the file afresh: the check is of what is on disk.
            let bytes = self
                .inner
                .options
                .vfs
                .read_file(&seg.path)
                .map_err(io_at(&seg.path))?;
            let opts = ScanOptions {
                max_record: self
                    .inner
                    .options
                    .max_record
                    .max(segment::DEFAULT_MAX_RECORD),
                expect_sealed: i < last || s.writer.is_none() && !self.inner.read_only,
            };
            let scan = segment::scan(&bytes, &ident, &opts)
                .map_err(|e| segment_error(id, &seg.path, e))?;
            report.segments += 1;
            report.bytes += scan.valid_end + scan.footer.map_or(0, |_| segment::FOOTER_LEN as u64);
            for b in &scan.batches {
                let r = b.codec_range();
                let events = codec::decode_batch(
                    &bytes[r.start as usize..r.end as usize],
                    b.first_seq,
                    b.count,
                    0,
                )
                .map_err(|e| Error::Corrupt {
                    session: id.to_owned(),
                    segment: seg.path.clone(),
                    offset: b.offset,
                    reason: format!("batch does not decode: {e}"),
                })?;
                let owned: Vec<OwnedEvent> = events.into_iter().map(Event::into_owned).collect();
                state
                    .append_batch(&owned, &log)
                    .map_err(|v| Error::Corrupt {
                        session: id.to_owned(),
                        segment: seg.path.clone(),
                        offset: b.offset,
                        reason: format!("stored batch breaks a rule: {v}"),
                    })?;
                report.events += owned.len() as u64;
                log.extend(owned);
            }
        }
        if state.next_seq() != s.state.next_seq() || state.surface() != s.state.surface() {
            return Err(Error::Corrupt {
                session: id.to_owned(),
                segment: s.dir.clone(),
                offset: 0,
                reason: format!(
                    "the log folds to {} events but the index holds {}: the checkpoint or index disagrees with the log",
                    state.next_seq(),
                    s.state.next_seq()
                ),
            });
        }
        Ok(report)
    }

    /// Size and checkpoint figures of a session.
    pub fn stats(&self, id: &str) -> Result<SessionStats> {
        let session = self.session(id)?;
        let s = session.lock().expect("session lock");
        let mut bytes = 0;
        for (i, seg) in s.segs.iter().enumerate() {
            let last = i + 1 == s.segs.len();
            // The active segment counts up to its committed end: its
            // preallocated zeros are not data.
            bytes += match (&s.writer, last, s.active_end) {
                (Some(w), true, _) => w.len(),
                (None, true, Some(end)) => end,
                _ => seg.map.len() as u64,
            };
        }
        // Stored events only: a read-only view's synthesised closers are not
        // on disk.
        let events = self.read_from_locked(&s, id, 0, s.next_seq())?;
        let mut jsonl_bytes = 0u64;
        let mut buf = Vec::new();
        for e in &events {
            buf.clear();
            e.write_json(&mut buf);
            jsonl_bytes += buf.len() as u64 + 1;
        }
        let checkpoint_modified = self
            .inner
            .options
            .vfs
            .metadata(&s.dir.join(checkpoint::CHECKPOINT_FILE))
            .ok()
            .and_then(|m| m.modified);
        Ok(SessionStats {
            events: events.len() as u64,
            segments: s.segs.len() as u64,
            bytes,
            jsonl_bytes,
            events_since_checkpoint: s.since_checkpoint,
            checkpoint_modified,
        })
    }

    /// Closes the session's last turn if it is open, appending the closers
    /// durably; returns the closers appended by this call or, when opening
    /// the session already repaired it, by that recovery.
    pub fn repair(&self, id: &str) -> Result<Vec<OwnedEvent>> {
        self.writable()?;
        let session = self.session(id)?;
        let mut s = session.lock().expect("session lock");
        let closers = self.append_closers(&mut s)?;
        if !closers.is_empty() {
            return Ok(closers);
        }
        let recovered = self.recovery(id).map_or(0, |r| r.closers);
        let from = s.next_seq().saturating_sub(recovered);
        self.read_from_locked(&s, id, from, u64::MAX)
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
}

/// Syncs every session with unsynced appends. A failed sync poisons its
/// session (the data may be lost; retrying the fsync could report a
/// false success) and is returned.
fn sync_dirty(sessions: &Sessions) -> Result<()> {
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
type Sessions = RwLock<HashMap<String, Arc<Mutex<Session>>>>;

impl Inner {
    /// Stops and joins the group-commit thread, if one runs.
    fn stop_group_commit(&self) {
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
fn spawn_group_commit(sessions: Arc<Sessions>, window: std::time::Duration) -> GroupCommit {
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

impl Session {
    /// The session's directory was renamed to `dir` (published): its files
    /// are the same (open handles and maps follow the inode), their paths
    /// are not.
    fn move_to(&mut self, dir: PathBuf) {
        for seg in &mut self.segs {
            if let Some(name) = seg.path.file_name() {
                seg.path = dir.join(name);
            }
        }
        self.dir = dir;
        self.staged = false;
    }

    /// The identity segment `first_seq` of this session must carry (the
    /// owner's uid for a segment shared through a fork).
    fn ident(&self, store_id: [u8; 16], first_seq: u64) -> SegmentIdent {
        SegmentIdent {
            store_id,
            session_uid: self.lineage.owner(first_seq).unwrap_or(self.uid),
            first_seq,
        }
    }

    /// `fdatasync`s the active segment. A failure poisons the session: the
    /// kernel may have dropped the dirty pages, and a retried fsync could
    /// report success for data that is gone.
    fn sync_now(&mut self) -> Result<()> {
        if let Some(w) = &self.writer
            && let Err(e) = w.sync()
        {
            self.poisoned = true;
            return Err(Error::Io {
                path: self
                    .segs
                    .last()
                    .map_or_else(|| self.dir.clone(), |g| g.path.clone()),
                source: e,
            });
        }
        self.dirty = false;
        Ok(())
    }

    /// [`Session::sync_now`] when appends are waiting for a sync.
    fn sync_if_dirty(&mut self) -> Result<()> {
        if self.dirty { self.sync_now() } else { Ok(()) }
    }

    /// Extends the read indexes with a batch just written or replayed: the
    /// batch index, the data locations of the surface nodes it added, the
    /// newest record and time. `data_range(i)` is the byte range in `map`
    /// of event `i`'s `data` when it is stored verbatim (`None` when it is
    /// packed). A surface node must be verbatim, since derive reads it in
    /// place; the writer guarantees it, so a stored batch that breaks it is
    /// corrupt, and the error names the seq.
    fn index_batch(
        &mut self,
        segment: u64,
        map: &[u8],
        b: &segment::BatchLoc,
        last_time: i64,
        data_range: impl Fn(usize) -> Option<Range<usize>>,
    ) -> std::result::Result<(), String> {
        let locs = Arc::make_mut(&mut self.node_locs);
        for (i, seq) in (b.first_seq..b.first_seq + u64::from(b.count)).enumerate() {
            if !self.state.surface().contains(seq) {
                continue;
            }
            let range = data_range(i)
                .filter(|r| r.end <= map.len())
                .ok_or_else(|| format!("surface node {seq} is not stored verbatim"))?;
            locs.push(
                seq,
                DataLoc {
                    segment,
                    offset: range.start as u64,
                    len: range.len() as u32,
                },
            );
        }
        self.batches.push(BatchEntry {
            first_seq: b.first_seq,
            segment,
            offset: b.offset,
        });
        self.last_time = last_time;
        self.last_record = Some((segment, b.offset, b.end(), crc_at(map, b.offset)));
        Ok(())
    }

    /// The seq the next event must have.
    fn next_seq(&self) -> u64 {
        match &self.lazy {
            Some(ck) => ck.coverage().next_seq,
            None => self.state.next_seq(),
        }
    }

    /// The closers a crash now would need.
    fn closers(&self) -> Vec<OwnedEvent> {
        match &self.lazy {
            Some(ck) => ck.repair().closers(),
            None => self.state.closers(),
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            segs: self.segs.clone(),
            node_locs: self.node_locs.clone(),
        }
    }
}

/// The store error for a failed publish of session `id`.
fn publish_error(e: PublishError, id: &str) -> Error {
    match e {
        PublishError::Exists => Error::Exists(id.to_owned()),
        PublishError::Io(path, source) | PublishError::Unsynced(_, path, source) => {
            Error::Io { path, source }
        }
    }
}

/// `events` cut into consecutive batches of about `max_bytes` (at least one
/// event each), so that none passes the record limit.
fn split_batches<'a, 'e>(
    events: &'a [Event<'e>],
    max_bytes: usize,
) -> impl Iterator<Item = &'a [Event<'e>]> + 'a {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= events.len() {
            return None;
        }
        let mut end = start;
        let mut bytes = 0;
        while end < events.len() && (end == start || bytes < max_bytes) {
            bytes += events[end].data.get().len() + events[end].kind.len() + 64;
            end += 1;
        }
        let batch = &events[start..end];
        start = end;
        Some(batch)
    })
}

/// Where `data`, decoded from `map`, lies in it: `None` when the decoder
/// produced it elsewhere (a packed field).
fn verbatim_range(map: &[u8], data: &str) -> Option<Range<usize>> {
    let start = (data.as_ptr() as usize).checked_sub(map.as_ptr() as usize)?;
    let end = start + data.len();
    (end <= map.len()).then_some(start..end)
}

/// The length of segment `segment` among the files found at load.
fn len_in(files: &[(u64, PathBuf)], maps: &[SegmentBytes], segment: u64) -> Option<u64> {
    files
        .iter()
        .position(|(f, _)| *f == segment)
        .map(|i| maps[i].len() as u64)
}

/// Whether a checkpoint's batch index, whose checksum, order and covered
/// record check out, also points only into segments that exist. A checksum
/// proves the bytes are the ones written, not that they are right.
fn batches_consistent(
    batches: &BatchIndex,
    files: &[(u64, PathBuf)],
    maps: &[SegmentBytes],
) -> std::result::Result<(), String> {
    // Entries come in seq order, so their segments too: one lookup per
    // segment, not per batch.
    let mut current: Option<(u64, Option<u64>)> = None;
    let mut len_of = |segment: u64| match current {
        Some((s, len)) if s == segment => len,
        _ => {
            let len = len_in(files, maps, segment);
            current = Some((segment, len));
            len
        }
    };
    match batches
        .iter_from(0)
        .find(|b| len_of(b.segment).is_none_or(|len| b.offset >= len))
    {
        Some(b) => Err(format!(
            "checkpoint is inconsistent: batch {} points outside the log",
            b.first_seq
        )),
        None => Ok(()),
    }
}

/// Decodes the lazily kept parts of checkpoint `ck` into `s` (state, derive
/// cache, node locations), after checking them ([`Checkpoint::materialise`])
/// and that every node's data lies inside its segment (`len_of`). On error
/// `s` is unchanged and the checkpoint must not be used.
fn install(
    s: &mut Session,
    ck: &Checkpoint,
    len_of: impl Fn(u64) -> Option<u64>,
) -> std::result::Result<(), String> {
    let m = ck.materialise().map_err(|e| e.to_string())?;
    if let Some((seq, _)) = m.node_locs.iter().find(|(_, l)| {
        len_of(l.segment).is_none_or(|len| l.offset.saturating_add(u64::from(l.len)) > len)
    }) {
        return Err(format!(
            "checkpoint is inconsistent: the data of node {seq} points outside the log"
        ));
    }
    s.state = m.state;
    s.derive = m.derive;
    s.node_locs = Arc::new(NodeLocs(m.node_locs));
    Ok(())
}

/// A rejection naming the session and the offending event's type and seq.
fn rejected(session: &str, batch: &[Event<'_>], violation: Violation) -> Error {
    let event_type = violation
        .seq()
        .and_then(|seq| batch.iter().find(|e| e.seq == seq))
        .or(batch.first())
        .map_or_else(String::new, |e| e.kind.to_string());
    Error::Rejected {
        session: session.to_owned(),
        event_type,
        violation,
    }
}

fn crc_at(map: &[u8], offset: u64) -> u32 {
    let o = offset as usize + 4;
    u32::from_le_bytes(map[o..o + 4].try_into().expect("4 bytes"))
}

impl Store {
    /// Maps a segment through the store's file system. Segment files are
    /// only ever appended to within their preallocated length or sealed
    /// (cut to a length past every committed byte); readers only touch
    /// committed bytes, so the mapping never reads past the end of the file
    /// and never sees bytes change (see [`crate::vfs::RealFs`]'s `map`).
    fn map_file(&self, path: &Path) -> Result<SegmentBytes> {
        self.inner.options.vfs.map(path).map_err(io_at(path))
    }
}

fn segment_error(session: &str, path: &Path, e: segment::SegmentError) -> Error {
    match e {
        segment::SegmentError::Corrupt { offset, reason } => Error::Corrupt {
            session: session.to_owned(),
            segment: path.to_owned(),
            offset,
            reason,
        },
        segment::SegmentError::Io(source) => Error::Io {
            path: path.to_owned(),
            source,
        },
        segment::SegmentError::RecordTooLarge { size, max } => Error::TooLarge {
            session: session.to_owned(),
            size,
            max,
        },
        other => Error::Store(format!("session {session:?}: {}: {other}", path.display())),
    }
}

/// A session identity for segment salting: distinct per creation, so a
/// deleted and re-created session's stale segments cannot validate.
fn new_uid(id: &str) -> [u8; 16] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut a = crc32fast::Hasher::new();
    a.update(id.as_bytes());
    a.update(&nanos.to_le_bytes());
    a.update(&std::process::id().to_le_bytes());
    let h1 = a.finalize();
    let mut uid = [0u8; 16];
    uid[..4].copy_from_slice(&h1.to_le_bytes());
    uid[4..].copy_from_slice(&nanos.to_le_bytes()[..12]);
    uid
}
