//! The harness's `PersistenceBackend` hooks over one [`Store`], with JSON
//! text at the boundary. Plain Rust: the napi layer (`lib.rs`) runs each of
//! these on a worker thread.
//!
//! # How harness events are stored
//!
//! Each harness event is stored whole, as the verbatim `data` of one store
//! event of type [`VERBATIM_KIND`] with the harness event's own `seq` and
//! `time`. The harness's `PersistenceCoordinator` is the authority on its
//! events: it validates them on read (including legacy shapes it still
//! normalizes, such as a pre-react-loop `steering/message` carrying
//! `surfaceOp`, which the store's model refuses) and it drives crash repair
//! through `loadStored`/`commitRepair` (a live session adopted after a hot
//! reload keeps its open turn, which the store would close at load). An
//! opaque type keeps the store's model out of the first; the store is opened
//! with `close_interrupted_turns` off for the second. The store still gives
//! contiguity, durability, torn-tail detection and cutting, atomic first
//! batches, per-session writer locks across processes, fresh reads and seek
//! reads by seq. Sessions written natively (through the Rust API or an
//! import) are read back as they are.
//!
//! Event text is never parsed into `serde_json::Value` or `String`: a batch
//! is split into [`RawValue`]s and only `seq` and `time` are read from each.
//! JavaScript's `JSON.stringify` writes a lone UTF-16 surrogate as the ASCII
//! escape `\ud800`, which a `String` cannot hold but a `RawValue` keeps as it
//! is, so such strings round-trip exactly (as does every byte of the event).

use crate::header;
use serde_json::value::RawValue;
use sessionlog::event::{Data, Event};
use sessionlog::header::SessionHeader;
use sessionlog::json::{self, Fields};
use sessionlog::store::{Batches, Error as StoreError, Options, Store};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// A failure of a hook: a stable code (the `code` a JS caller can switch on)
/// and a message naming what to do.
#[derive(Debug)]
pub struct Failure {
    /// `SESSIONLOG_*`.
    pub code: &'static str,
    /// Human-readable detail.
    pub message: String,
}

/// A hook's result.
pub type Result<T> = std::result::Result<T, Failure>;

fn fail(code: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        let code = match &e {
            StoreError::Locked { .. } => "SESSIONLOG_LOCKED",
            StoreError::Io { .. } => "SESSIONLOG_IO",
            StoreError::Corrupt { .. } => "SESSIONLOG_CORRUPT",
            StoreError::Rejected { .. } => "SESSIONLOG_REJECTED",
            StoreError::NotFound(_) => "SESSIONLOG_NOT_FOUND",
            StoreError::Exists(_) => "SESSIONLOG_EXISTS",
            StoreError::Poisoned(_) => "SESSIONLOG_POISONED",
            StoreError::ReadOnly => "SESSIONLOG_READ_ONLY",
            StoreError::BadId { .. } => "SESSIONLOG_BAD_ID",
            StoreError::TooLarge { .. } => "SESSIONLOG_TOO_LARGE",
            _ => "SESSIONLOG_STORE",
        };
        fail(code, e.to_string())
    }
}

/// One open store and what this process knows about its sessions. Shared
/// by every handle on the same root in the process: writer locks belong to
/// a store handle, so two handles of one process on one root would refuse
/// each other's writes (other processes get `SESSIONLOG_LOCKED` for a
/// session this one writes, and may write every other session).
pub struct Shared {
    /// The store's id, which qualifies every revision.
    store_id: String,
    /// What the store was opened with: every handle on the root in this
    /// process shares it, so every one must ask for the same.
    options: StoreOptions,
    store: Store,
    /// Sessions whose torn tail (cut by the store when this process took
    /// them for writing) was already handed to `commitRepair`: the marker
    /// is reported only until then, as the harness requires ("present iff
    /// there is a torn tail").
    torn_repaired: Mutex<HashSet<String>>,
}

/// Every store this process has open, by canonical root. The registry holds
/// them weakly: the handles (and the tasks in flight on them) hold them
/// strongly, so a store is closed, and its lock released, exactly when the
/// last of those lets go.
static STORES: LazyLock<Mutex<HashMap<PathBuf, Weak<Shared>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn io(what: &str, path: &Path, e: std::io::Error) -> Failure {
    fail("SESSIONLOG_IO", format!("{what} {}: {e}", path.display()))
}

/// The canonical form of `root`, creating the directory if needed.
fn canonical(root: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(root).map_err(|e| io("cannot create store root", root, e))?;
    root.canonicalize()
        .map_err(|e| io("cannot resolve store root", root, e))
}

/// The store options a JavaScript caller may choose
/// (`openSessionLog(root, options)`). Both keep every append durable when
/// it resolves; they change how the store gets there and what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// [`Options::compress_sealed`]: sealed segments stored compressed, by
    /// a background thread.
    pub compress_sealed: bool,
    /// [`Options::journal`]: durable appends of many sessions share one
    /// sync of a store-wide journal.
    pub journal: bool,
    /// [`Options::max_open_sessions`]: sessions kept loaded (and owned, for
    /// those this process writes) at once.
    pub max_open_sessions: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            compress_sealed: false,
            journal: false,
            max_open_sessions: Options::default().max_open_sessions,
        }
    }
}

/// As JavaScript passes them: `{ journal: false, compressSealed: true, maxOpenSessions: 512 }`.
impl std::fmt::Display for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{ journal: {}, compressSealed: {}, maxOpenSessions: {} }}",
            self.journal, self.compress_sealed, self.max_open_sessions
        )
    }
}

/// Opens (or joins) the store at `root` for one more handle. A store this
/// process already has open with other options is refused
/// (`SESSIONLOG_OPTIONS`), not silently shared with the first options.
pub fn acquire(root: &Path, wanted: StoreOptions) -> Result<Arc<Shared>> {
    let root = canonical(root)?;
    let mut stores = STORES.lock().expect("store registry");
    stores.retain(|_, shared| shared.strong_count() > 0);
    if let Some(shared) = stores.get(&root).and_then(Weak::upgrade) {
        // Also a store whose last handle closed while a task still ran on
        // it: opening a second one would find the first one's lock held.
        if shared.options != wanted {
            return Err(fail(
                "SESSIONLOG_OPTIONS",
                format!(
                    "the store at {} is already open in this process with options {}, \
                     not {wanted}: open every handle on one root with the same options, \
                     or close the others first",
                    root.display(),
                    shared.options
                ),
            ));
        }
        return Ok(shared);
    }
    // The coordinator repairs on its own terms (commitRepair), and a live
    // session adopted after a hot reload keeps its open turn.
    let options = Options {
        close_interrupted_turns: false,
        // The harness's own backends take an event of any size (one huge
        // tool result): so does this one, up to the format's limit (and
        // V8's string length, about 512 MiB, comes first).
        max_record: sessionlog::store::MAX_RECORD_LIMIT,
        compress_sealed: wanted.compress_sealed,
        journal: wanted.journal,
        max_open_sessions: wanted.max_open_sessions,
        ..Options::default()
    };
    let store = Store::open(&root, options)?;
    let store_id = store
        .store_id()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let shared = Arc::new(Shared {
        store_id,
        options: wanted,
        store,
        torn_repaired: Mutex::new(HashSet::new()),
    });
    stores.insert(root, Arc::downgrade(&shared));
    Ok(shared)
}

/// Gives back one handle's share: flushes (syncs every append, writes
/// checkpoints). The store closes, releasing its writer locks for other
/// processes, once the last share and any task still running on it are
/// dropped (`Store::close` would close it for every share at once).
pub fn release(shared: Arc<Shared>) -> Result<()> {
    shared.store.flush()?;
    Ok(())
}

/// The store event type that carries one harness event verbatim.
pub const VERBATIM_KIND: &str = "harness/event";

/// Wraps a JSON array of harness events as store events, reading only each
/// event's `seq` and `time` (no string in it is decoded).
fn parse_events(text: &str) -> Result<Vec<Event<'_>>> {
    let bad = |m: String| fail("SESSIONLOG_BAD_INPUT", m);
    let raws: Vec<&RawValue> =
        serde_json::from_str(text).map_err(|e| bad(format!("events are not a JSON array: {e}")))?;
    raws.into_iter()
        .map(|raw| {
            let fields = Fields::parse(raw.get())
                .map_err(|e| bad(format!("event is not a JSON object: {e}")))?;
            // `JSON.parse` keeps a repeated key's last value, the store would
            // index the first: the two would disagree on the seq (or time).
            if let Some(key) = fields.duplicate_key() {
                return Err(bad(format!(
                    "event has the key {key:?} twice (JSON.parse keeps the last one): {}",
                    raw.get()
                )));
            }
            let seq = fields.get("seq").and_then(json::safe_u64).ok_or_else(|| {
                bad(format!(
                    "event lacks a non-negative safe integer seq: {}",
                    raw.get()
                ))
            })?;
            let time = fields
                .get("time")
                .and_then(json::safe_integer)
                .ok_or_else(|| bad(format!("event {seq} lacks a safe integer time")))?;
            // JSON.stringify never writes a number JSON.parse reads as
            // Infinity; text from elsewhere might.
            let data =
                Data::new(raw).map_err(|e| bad(format!("event {seq} is not plain JSON: {e}")))?;
            Ok(Event {
                kind: Cow::Borrowed(VERBATIM_KIND),
                seq,
                time,
                data,
                source_event_seqs: None,
                surface_op: None,
                // A reader that does not know this type cannot interpret the
                // payload, so it may only skip it (this also keeps a store
                // opened in strict mode, which refuses unknown types that are
                // not ignorable, able to take these events).
                ignorable: true,
            })
        })
        .collect()
}

/// Writes one stored event as the harness's JSON: a harness event verbatim,
/// a native one (imported, or written through the Rust API) as the store
/// renders it.
fn write_event(out: &mut Vec<u8>, e: &Event<'_>) {
    if e.kind == VERBATIM_KIND {
        out.extend_from_slice(e.data.get().as_bytes());
    } else {
        e.write_json(out);
    }
}

/// A session's stored events being written out as JSON text, a chunk at a
/// time: `loadStored` and `loadStoredFrom` write them all at once, the
/// streaming reader (`StoredReader` in `lib.rs`) a few MiB per call, so
/// JavaScript parses one chunk while the next is written. Each batch is
/// written straight from the mapped segment (no event is copied into an
/// owned record first), so memory holds the text and one decoded batch.
pub struct EventText {
    batches: Batches,
}

impl EventText {
    /// The next chunk: a JSON array of the events of whole batches, at least
    /// one batch and then no more once `max_bytes` is reached; `None` once
    /// every event was written.
    pub fn next_chunk(&mut self, max_bytes: usize) -> Result<Option<String>> {
        let mut out: Vec<u8> = Vec::new();
        if !self.write_array(&mut out, max_bytes)? {
            return Ok(None);
        }
        Ok(Some(into_string(out)))
    }

    /// Every remaining event as one JSON array (`[]` when none is left).
    fn write_all(&mut self, out: &mut Vec<u8>) -> Result<()> {
        if !self.write_array(out, usize::MAX)? {
            out.extend_from_slice(b"[]");
        }
        Ok(())
    }

    /// Appends to `out` a JSON array of the events of the next whole
    /// batches: at least one, then more until `out` has grown by
    /// `max_bytes` or no batch is left; `false` (and nothing written) when
    /// none was left.
    fn write_array(&mut self, out: &mut Vec<u8>, max_bytes: usize) -> Result<bool> {
        let start = out.len();
        let mut first = true;
        // At least one batch, whatever `max_bytes` says.
        loop {
            let wrote = self.batches.next_with(|events| {
                for e in events {
                    out.push(if first { b'[' } else { b',' });
                    first = false;
                    write_event(out, e);
                }
            });
            match wrote {
                None => break,
                Some(r) => r?,
            }
            if out.len() - start >= max_bytes {
                break;
            }
        }
        if first {
            return Ok(false);
        }
        out.push(b']');
        Ok(true)
    }
}

/// A head object (`{...}`) with every event of `text` added as its
/// `events` member: the one-call `loadStored`/`loadStoredFrom` result.
fn with_all_events((mut out, mut text): (Vec<u8>, EventText)) -> Result<String> {
    // The head ends with `}`: the events go in before it.
    out.pop();
    out.extend_from_slice(b",\"events\":");
    text.write_all(&mut out)?;
    out.push(b'}');
    Ok(into_string(out))
}

fn into_string(out: Vec<u8>) -> String {
    String::from_utf8(out).expect("JSON output is UTF-8")
}

impl Shared {
    /// The revision of stored session `id`, or `None` when it is not
    /// stored: the store's id, the session's incarnation (new when it is
    /// replaced or re-created), its length and, while `loadStored` reports
    /// one, the torn marker. Every append and every repair with closers
    /// adds events; a repair that only retires a torn tail drops the
    /// marker. Either changes the revision, as the harness requires of
    /// every append and repair (its coordinator keeps a prepared session,
    /// torn marker included, while the revision it was read at is
    /// current).
    ///
    /// Read with [`Store::peek_next_seq`]: a session this process has not
    /// loaded is read (its checkpoint and the records after it) and not
    /// kept, so `readStoredRevision` and `listSnapshots` never make the
    /// store release this process's idle sessions, and their writer locks,
    /// to make room (`maxOpenSessions`).
    ///
    /// A session that cannot be read (damaged: `SESSIONLOG_CORRUPT`, or
    /// any other failure of its own files) has the revision
    /// `...:<incarnation>:unreadable`, which no readable state has: stable
    /// while the damage stays, changed when a repair or a restore makes it
    /// readable, and its `loadStored` reports the damage. So one such
    /// session neither fails a listing nor is left out of it (the harness's
    /// JSONL backend lists a log with a damaged body too). A session gone
    /// meanwhile is `None`. Failures of the store itself (a closed handle,
    /// an id the store cannot hold) and transient ones
    /// ([`StoreError::is_transient`]: out of file descriptors or memory for
    /// a moment, which say nothing of the session) are errors.
    fn revision(&self, id: &str) -> Result<Option<String>> {
        let error = match self.store.peek_next_seq(id) {
            Ok((next_seq, incarnation)) => {
                return Ok(Some(self.revision_of(id, &incarnation, next_seq)));
            }
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e @ (StoreError::Closed | StoreError::BadId { .. })) => return Err(e.into()),
            // Out of descriptors or memory for a moment: nothing was
            // learned of the session, so no revision is made up for it
            // (an `unreadable` one would tell the coordinator the session
            // changed, and change back at the next listing).
            Err(e) if e.is_transient() => return Err(e.into()),
            Err(e) => e,
        };
        // Deleted while it was read (its files went away under the read),
        // or there and unreadable.
        let incarnation = match self.store.incarnation(id) {
            Ok(incarnation) => incarnation,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(StoreError::Closed) => return Err(error.into()),
            Err(e) if e.is_transient() => return Err(e.into()),
            // Its HEADER unreadable too since the listing read it.
            Err(_) => "-".to_owned(),
        };
        Ok(Some(format!(
            "sessionlog:{}:{incarnation}:unreadable",
            self.store_id
        )))
    }

    /// The revision of session `id` when it held `next_seq` events.
    fn revision_at(&self, id: &str, next_seq: u64) -> Result<String> {
        Ok(self.revision_of(id, &self.store.incarnation(id)?, next_seq))
    }

    /// The revision of session `id`'s incarnation `incarnation` holding
    /// `next_seq` events.
    fn revision_of(&self, id: &str, incarnation: &str, next_seq: u64) -> String {
        let mut revision = format!("sessionlog:{}:{incarnation}:{next_seq}", self.store_id);
        if let Some(marker) = self.torn_marker(id) {
            let _ = std::fmt::Write::write_fmt(&mut revision, format_args!(":torn{marker}"));
        }
        revision
    }

    /// The stored session's header, `None` when it does not exist (one
    /// small file read; sessions other processes created are seen at once).
    fn header(&self, id: &str) -> Result<Option<SessionHeader>> {
        match self.store.header(id) {
            Ok(h) => Ok(Some(h)),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The torn-tail marker to report for `id`: the offset where the store
    /// cut a torn tail when it loaded the session, until a repair took it.
    fn torn_marker(&self, id: &str) -> Option<u64> {
        let torn_at = self.store.recovery(id)?.torn_at?;
        (!self.torn_repaired.lock().expect("torn lock").contains(id)).then_some(torn_at)
    }

    /// `loadStored`: `{"meta","events","revision","tornMarker"?}` or `None`.
    pub fn load_stored(&self, id: &str) -> Result<Option<String>> {
        self.open_stored(id)?.map(with_all_events).transpose()
    }

    /// The head of `loadStored`, `{"meta","revision","tornMarker"?}`, and
    /// its events to write out, or `None`. The coordinator loads a session
    /// to use it, so this process takes it for writing (which finds and cuts
    /// a torn tail: the marker); a session another process writes is read
    /// as it is, with no marker (its torn tail, if any, is that writer's).
    /// The revision is the one of the events read: both come from one
    /// snapshot of the session.
    pub fn open_stored(&self, id: &str) -> Result<Option<(Vec<u8>, EventText)>> {
        let Some(header) = self.header(id)? else {
            return Ok(None);
        };
        match self.store.acquire(id) {
            Ok(_) | Err(StoreError::Locked { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let batches = self.store.batches(id, 0)?;
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"{\"meta\":");
        header::write_json(&header, &mut out);
        out.extend_from_slice(b",\"revision\":");
        json::write_str(&mut out, &self.revision_at(id, batches.end())?);
        if let Some(marker) = self.torn_marker(id) {
            let _ = write!(out, ",\"tornMarker\":{marker}");
        }
        out.push(b'}');
        Ok(Some((out, EventText { batches })))
    }

    /// `readStoredRevision`: [`Shared::revision`], the one `listSnapshots`
    /// reports.
    pub fn read_stored_revision(&self, id: &str) -> Result<Option<String>> {
        self.revision(id)
    }

    /// `loadStoredFrom`: `{"meta","events"}` with the events at or past
    /// `from`, decoding only the batches that hold them.
    pub fn load_stored_from(&self, id: &str, from: u64) -> Result<Option<String>> {
        self.open_stored_from(id, from)?
            .map(with_all_events)
            .transpose()
    }

    /// The head of `loadStoredFrom`, `{"meta"}`, and its events (those at or
    /// past `from`) to write out, or `None`.
    pub fn open_stored_from(&self, id: &str, from: u64) -> Result<Option<(Vec<u8>, EventText)>> {
        let Some(header) = self.header(id)? else {
            return Ok(None);
        };
        let batches = self.store.batches(id, from)?;
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"meta\":");
        header::write_json(&header, &mut out);
        out.push(b'}');
        Ok(Some((out, EventText { batches })))
    }

    /// `appendBatch`: a durable append. The first one (`!materialized`)
    /// creates the session with it: the store publishes header and batch
    /// together, in one rename, once they are durable, so a crash cannot
    /// leave an empty listed session, and a second process creating the
    /// same id gets `SESSIONLOG_EXISTS` or `SESSIONLOG_LOCKED`.
    pub fn append_batch(&self, meta: &str, events: &str, materialized: bool) -> Result<()> {
        let header = header::from_json(meta).map_err(|m| fail("SESSIONLOG_BAD_INPUT", m))?;
        let events = parse_events(events)?;
        if events.is_empty() {
            return Ok(());
        }
        if materialized {
            self.store.append(&header.id, &events)?;
        } else {
            self.store.import(header, &events, false)?;
        }
        Ok(())
    }

    /// `commitRepair`: the torn tail named by `torn_marker` was already cut
    /// (durably zeroed) by the store when it loaded the session, so the
    /// marker is checked and retired; then `closers` are appended.
    pub fn commit_repair(&self, meta: &str, torn_marker: Option<f64>, closers: &str) -> Result<()> {
        let header = header::from_json(meta).map_err(|m| fail("SESSIONLOG_BAD_INPUT", m))?;
        let id = header.id;
        if let Some(marker) = torn_marker {
            let found = self.torn_marker(&id);
            if found.map(|m| m as f64) != Some(marker) {
                return Err(fail(
                    "SESSIONLOG_STALE_REPAIR",
                    format!(
                        "session {id:?}: torn marker {marker} does not name the torn tail this store found ({found:?}); load the session again"
                    ),
                ));
            }
        }
        let closers = parse_events(closers)?;
        if !closers.is_empty() {
            self.store.append(&id, &closers)?;
        }
        // Only a repair that took effect retires the marker: a refused one
        // (bad closers, a failed write) changes nothing and can be retried
        // with the same marker.
        if torn_marker.is_some() {
            self.torn_repaired
                .lock()
                .expect("torn lock")
                .insert(id.clone());
        }
        Ok(())
    }

    /// `list`: the headers of the stored (materialized) sessions.
    pub fn list(&self) -> Result<String> {
        let headers = self.store.list()?;
        let mut out = Vec::with_capacity(headers.len() * 96 + 2);
        out.push(b'[');
        for (i, h) in headers.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            header::write_json(h, &mut out);
        }
        out.push(b']');
        Ok(into_string(out))
    }

    /// `listSnapshots`: `{"header","revision"}` of every stored session,
    /// with the revision `readStoredRevision` reports ([`Shared::revision`]:
    /// a damaged session is listed with a revision its load reports the
    /// damage under, one deleted since the sessions directory was read is
    /// left out). No session is kept loaded by the listing.
    pub fn list_snapshots(&self) -> Result<String> {
        self.list_snapshots_with(|| Ok(()))
    }

    /// [`Shared::list_snapshots`], running `after_listing` once the
    /// sessions directory was read and before any revision is (a test of
    /// what happens meanwhile: [`list_snapshots_deleting_for_test`]).
    fn list_snapshots_with(&self, after_listing: impl FnOnce() -> Result<()>) -> Result<String> {
        let headers = self.store.list()?;
        after_listing()?;
        let mut out = Vec::with_capacity(headers.len() * 160 + 2);
        out.push(b'[');
        for h in &headers {
            let Some(revision) = self.revision(&h.id)? else {
                continue; // deleted since the listing
            };
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"header\":");
            header::write_json(h, &mut out);
            out.extend_from_slice(b",\"revision\":");
            json::write_str(&mut out, &revision);
            out.push(b'}');
        }
        out.push(b']');
        Ok(into_string(out))
    }
}

/// Where a session's files live under `root`, without touching the disk.
pub fn session_dir(root: &Path, id: &str) -> Result<PathBuf> {
    Ok(Store::session_dir_in(root, id)?)
}

/// Test-only: `listSnapshots` of the store this process has open at
/// `root`, with the sessions `ids` deleted by another handle on the store
/// (as `sessionlog rm` in another process would) after the listing read the
/// sessions directory and before it computed any revision: a deletion
/// racing the listing, made deterministic.
pub fn list_snapshots_deleting_for_test(root: &Path, ids: &[String]) -> Result<String> {
    let root = canonical(root)?;
    let shared = STORES
        .lock()
        .expect("store registry")
        .get(&root)
        .and_then(Weak::upgrade)
        .ok_or_else(|| {
            fail(
                "SESSIONLOG_NOT_OPEN",
                format!("{} is not open in this process", root.display()),
            )
        })?;
    shared.list_snapshots_with(|| {
        let other = Store::open(
            &root,
            Options {
                close_interrupted_turns: false,
                ..Options::default()
            },
        )?;
        for id in ids {
            other.delete(id)?;
        }
        other.close()?;
        Ok(())
    })
}

/// Test-only: writes a torn record (a frame header promising more bytes than
/// follow it, as a crash mid-write leaves) right after the committed end of
/// the session's active segment. The store must not be open in this process,
/// since an open store would write over it.
pub fn corrupt_tail_for_test(root: &Path, id: &str) -> Result<()> {
    let root = canonical(root)?;
    let open = STORES
        .lock()
        .expect("store registry")
        .get(&root)
        .is_some_and(|shared| shared.strong_count() > 0);
    if open {
        return Err(fail(
            "SESSIONLOG_IN_USE",
            format!(
                "{} is open in this process; close every handle before corrupting a tail",
                root.display()
            ),
        ));
    }
    // A read-only store neither repairs nor truncates: it reports the
    // committed end as it is on disk.
    let store = Store::open_read_only(&root)?;
    let stats = store.stats(id)?;
    let mut segments = store.segment_files(id)?;
    drop(store);
    let active = segments.pop().ok_or_else(|| {
        fail(
            "SESSIONLOG_NOT_FOUND",
            format!("session {id:?} has no segment"),
        )
    })?;
    // `stats.bytes` counts sealed segments whole and the active one up to
    // its committed end.
    let mut sealed = 0;
    for path in &segments {
        sealed += std::fs::metadata(path)
            .map_err(|e| io("cannot stat", path, e))?
            .len();
    }
    let end = stats.bytes - sealed;
    let mut frame = Vec::new();
    frame.extend_from_slice(&64u32.to_le_bytes()); // payload length
    frame.extend_from_slice(&0x5EED_F00Du32.to_le_bytes()); // checksum
    frame.extend_from_slice(&[0xA5; 20]); // 20 of the 64 payload bytes
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .map_err(|e| io("cannot open", &active, e))?;
    std::os::unix::fs::FileExt::write_all_at(&file, &frame, end)
        .map_err(|e| io("cannot write", &active, e))?;
    file.sync_all().map_err(|e| io("cannot sync", &active, e))?;
    Ok(())
}
