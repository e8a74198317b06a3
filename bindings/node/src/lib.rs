//! Node binding of sessionlog: `openSessionLog(root)` returns the harness's
//! `PersistenceBackend` hooks over a [`sessionlog::store::Store`], with JSON
//! text at the boundary (see the repository's `README.md`, "Node binding",
//! and the harness contract, kept beside the repository in
//! `../shared/harness-contract`, not in it).
//!
//! Every hook that can touch the disk returns a Promise and runs on libuv's
//! worker pool (a napi [`AsyncTask`]): the JavaScript thread never waits for
//! an fsync, a segment scan or a rebuild. Only `locate`, which computes a
//! path, is synchronous. Opening the store is deferred to the first hook for
//! the same reason, so `openSessionLog` itself never touches the disk.
//!
//! Handles on one root share one store per process (see `backend::acquire`):
//! the store admits a single writer, and a second `openSessionLog` on the
//! same root (a hot reload, a second plugin) must join it, not fail.
#![deny(missing_docs)]

mod backend;
mod header;

use backend::{Failure, Shared, StoreOptions};
use napi::bindgen_prelude::{AsyncTask, ToNapiValue, TypeName, Utf16String};
use napi::{Env, Task};
use napi_derive::napi;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

impl From<Failure> for napi::Error {
    fn from(f: Failure) -> napi::Error {
        // The code leads the message so a JS caller can match on it; napi's
        // own `code` property carries only its generic status.
        napi::Error::from_reason(format!("{}: {}", f.code, f.message))
    }
}

/// A session id as JavaScript passed it. napi's `String` conversion writes
/// a lone UTF-16 surrogate as U+FFFD, so `'a\ud800'` and `'a\udfff'` would
/// both read the session `'a\ufffd'`: ids come in as UTF-16 and one the
/// store cannot hold (its ids are UTF-8) is refused, naming it.
fn session_id(id: &Utf16String) -> backend::Result<String> {
    String::from_utf16(id).map_err(|_| Failure {
        code: "SESSIONLOG_BAD_ID",
        message: format!(
            "session id {} holds a lone UTF-16 surrogate, which the store cannot hold (its ids are UTF-8)",
            header::escape_utf16(id)
        ),
    })
}

/// A unit of blocking work run on the worker pool; its value resolves the
/// Promise returned to JavaScript.
pub struct Work<T> {
    job: Option<Box<dyn FnOnce() -> backend::Result<T> + Send>>,
}

impl<T> Work<T> {
    fn new(job: impl FnOnce() -> backend::Result<T> + Send + 'static) -> AsyncTask<Work<T>>
    where
        Work<T>: Task,
    {
        AsyncTask::new(Work {
            job: Some(Box::new(job)),
        })
    }
}

impl<T: ToNapiValue + TypeName + Send + 'static> Task for Work<T> {
    type Output = T;
    type JsValue = T;

    fn compute(&mut self) -> napi::Result<T> {
        let job = self.job.take().expect("a task is computed once");
        Ok(job()?)
    }

    fn resolve(&mut self, _env: Env, output: T) -> napi::Result<T> {
        Ok(output)
    }
}

/// Where a handle is in its life.
enum State {
    /// `openSessionLog` returned; nothing was opened yet.
    Unopened,
    /// Holds a share of the process's store for the root.
    Open(Arc<Shared>),
    /// `close` ran; every further hook fails.
    Closed,
}

/// One handle on a store: the object `openSessionLog` returns.
#[napi]
pub struct SessionLog {
    root: PathBuf,
    options: StoreOptions,
    state: Arc<Mutex<State>>,
}

/// A handle collected without `close` still gives its share back, so the
/// store it held is closed (and its lock released) once no handle is left.
/// The close syncs, so it runs on its own thread, not in the garbage
/// collector's finalizer on the JavaScript thread.
impl Drop for SessionLog {
    fn drop(&mut self) {
        let previous = std::mem::replace(
            &mut *self
                .state
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            State::Closed,
        );
        if let State::Open(shared) = previous {
            std::thread::spawn(move || {
                let _ = backend::release(shared);
            });
        }
    }
}

/// Options of `openSessionLog`; each is off when absent. Every handle on
/// one root in a process must pass the same ones (the handles share one
/// store): the first hook of a handle that differs fails with
/// `SESSIONLOG_OPTIONS`.
#[napi(object)]
pub struct OpenOptions {
    /// Store sealed segments compressed, by a background thread
    /// (`Options::compress_sealed`: about 0.2-0.4x the bytes of plain JSONL
    /// for sealed data; reads of sealed data decode it). Raises the store
    /// to the newest format version (5) at open.
    pub compress_sealed: Option<bool>,
    /// Share one sync among the durable appends of many sessions
    /// (`Options::journal`: pays off with many sessions written at once).
    pub journal: Option<bool>,
    /// Sessions the store keeps loaded at once (`Options::max_open_sessions`,
    /// default 512). A session this process wrote stays its own (its writer
    /// lock held: another process's append gets `SESSIONLOG_LOCKED`) while
    /// it is loaded; past this many, the least recently used idle ones are
    /// released, lock included, and another process may then write them.
    /// Size it to the sessions one process owns at once.
    pub max_open_sessions: Option<u32>,
}

/// Opens (creating if absent) the store rooted at `root`. The store itself
/// is opened by the first hook, on a worker thread.
#[napi]
pub fn open_session_log(root: String, options: Option<OpenOptions>) -> SessionLog {
    let options = options.map_or_else(StoreOptions::default, |o| StoreOptions {
        compress_sealed: o.compress_sealed.unwrap_or(false),
        journal: o.journal.unwrap_or(false),
        max_open_sessions: o
            .max_open_sessions
            .map_or(StoreOptions::default().max_open_sessions, |n| {
                n.max(1) as usize
            }),
    });
    SessionLog {
        root: PathBuf::from(root),
        options,
        state: Arc::new(Mutex::new(State::Unopened)),
    }
}

/// The handle's share of the store, opening it on first use.
fn shared(
    root: &std::path::Path,
    options: StoreOptions,
    state: &Mutex<State>,
) -> backend::Result<Arc<Shared>> {
    let mut state = state.lock().expect("handle lock");
    match &*state {
        State::Open(shared) => Ok(shared.clone()),
        State::Closed => Err(Failure {
            code: "SESSIONLOG_CLOSED",
            message: format!("the handle on {} is closed", root.display()),
        }),
        State::Unopened => {
            let shared = backend::acquire(root, options)?;
            *state = State::Open(shared.clone());
            Ok(shared)
        }
    }
}

impl SessionLog {
    /// Runs `f` on the worker pool with this handle's store.
    fn run<T>(
        &self,
        f: impl FnOnce(&Shared) -> backend::Result<T> + Send + 'static,
    ) -> AsyncTask<Work<T>>
    where
        Work<T>: Task,
    {
        let (root, options, state) = (self.root.clone(), self.options, self.state.clone());
        Work::new(move || f(&*shared(&root, options, &state)?))
    }
}

/// Where a [`StoredReader`] is in its life.
enum ReaderState {
    /// Made; nothing was read yet.
    Unopened,
    /// `open` found the session: the events left to write out.
    Open(Box<backend::EventText>),
    /// Every event was returned, the session was absent, or a read failed.
    Done,
}

/// A streaming read of one session's stored events (`storedReader`): `open`
/// resolves to the head (`{"meta","revision","tornMarker"?}` as `loadStored`
/// reports it, or `{"meta"}` from a seq), then each `next` to the next chunk
/// of events as a JSON array, or null at the end. Both come from one
/// snapshot of the session. JavaScript parses a chunk while the worker
/// writes the next one, and never holds the whole log's text at once.
/// Call `next` again only after the previous call resolved.
#[napi]
pub struct StoredReader {
    log: SessionLogRef,
    /// The id, or why it was refused (reported by `open`).
    id: std::result::Result<String, String>,
    from: Option<u64>,
    state: Arc<Mutex<ReaderState>>,
}

/// What a reader needs of its handle to open the store lazily.
struct SessionLogRef {
    root: PathBuf,
    options: StoreOptions,
    state: Arc<Mutex<State>>,
}

#[napi]
impl StoredReader {
    /// Opens the read: the head JSON, or null when the session is not
    /// stored. Reading the whole log (`fromSeq` null) takes the session
    /// for writing, as `loadStored` does.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn open(&self) -> AsyncTask<Work<Option<String>>> {
        let (root, options, handle) = (
            self.log.root.clone(),
            self.log.options,
            self.log.state.clone(),
        );
        let (id, from, state) = (self.id.clone(), self.from, self.state.clone());
        Work::new(move || {
            let mut state = state.lock().expect("reader lock");
            let id = id.map_err(|message| Failure {
                code: "SESSIONLOG_BAD_ID",
                message,
            })?;
            if !matches!(*state, ReaderState::Unopened) {
                return Err(Failure {
                    code: "SESSIONLOG_BAD_INPUT",
                    message: format!("the reader of session {id:?} was already opened"),
                });
            }
            *state = ReaderState::Done;
            let shared = shared(&root, options, &handle)?;
            let opened = match from {
                None => shared.open_stored(&id)?,
                Some(from) => shared.open_stored_from(&id, from)?,
            };
            Ok(opened.map(|(head, text)| {
                *state = ReaderState::Open(Box::new(text));
                String::from_utf8(head).expect("JSON output is UTF-8")
            }))
        })
    }

    /// The next events as a JSON array of whole stored batches, at least
    /// one batch and about `max_bytes` of text at most (a larger batch is
    /// returned whole), or null once every event was returned.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn next(&self, max_bytes: u32) -> AsyncTask<Work<Option<String>>> {
        let state = self.state.clone();
        Work::new(move || {
            let mut state = state.lock().expect("reader lock");
            let ReaderState::Open(text) = &mut *state else {
                return Ok(None);
            };
            let chunk = text.next_chunk(max_bytes.max(1) as usize);
            if !matches!(chunk, Ok(Some(_))) {
                *state = ReaderState::Done;
            }
            chunk
        })
    }
}

/// Where a session's files live (`SessionLocation`).
#[napi(object)]
pub struct Location {
    /// Always `sessionlog-session-dir`: the session's directory of segments.
    pub kind: String,
    /// Absolute path of that directory.
    pub path: String,
}

#[napi]
impl SessionLog {
    /// JSON `{"meta","events","revision","tornMarker"?}`, or null when the
    /// session is not stored.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn load_stored(&self, id: Utf16String) -> AsyncTask<Work<Option<String>>> {
        let id = session_id(&id);
        self.run(move |s| s.load_stored(&id?))
    }

    /// The revision `loadStored` would report, or null; the one
    /// `listSnapshots` lists (`...:unreadable` for a damaged session).
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn read_stored_revision(&self, id: Utf16String) -> AsyncTask<Work<Option<String>>> {
        let id = session_id(&id);
        self.run(move |s| s.read_stored_revision(&id?))
    }

    /// JSON `{"meta","events"}` with the events whose seq is at least
    /// `from_seq`, or null.
    #[napi(ts_return_type = "Promise<string | null>")]
    pub fn load_stored_from(
        &self,
        id: Utf16String,
        from_seq: f64,
    ) -> AsyncTask<Work<Option<String>>> {
        let id = session_id(&id);
        self.run(move |s| {
            // The coordinator validates fromSeq as a non-negative safe
            // integer before calling; anything else reads from 0 or the end.
            s.load_stored_from(&id?, from_seq.max(0.0) as u64)
        })
    }

    /// Durably appends a contiguous batch (JSON array); `is_materialized`
    /// false declares the session with this first batch.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn append_batch(
        &self,
        meta_json: String,
        events_json: String,
        is_materialized: bool,
    ) -> AsyncTask<Work<()>> {
        self.run(move |s| s.append_batch(&meta_json, &events_json, is_materialized))
    }

    /// Retires the torn tail `torn_marker` (when given) and durably appends
    /// `closers_json` (a JSON array).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn commit_repair(
        &self,
        meta_json: String,
        torn_marker: Option<f64>,
        closers_json: String,
    ) -> AsyncTask<Work<()>> {
        self.run(move |s| s.commit_repair(&meta_json, torn_marker, &closers_json))
    }

    /// JSON `SessionHeader[]` of the stored sessions.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn list(&self) -> AsyncTask<Work<String>> {
        self.run(|s| s.list())
    }

    /// JSON `{"header","revision"}[]` of the stored sessions: a damaged one
    /// listed with its `...:unreadable` revision, one deleted meanwhile
    /// left out; a transient failure (out of descriptors or memory) rejects
    /// the listing; no session is kept loaded.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn list_snapshots(&self) -> AsyncTask<Work<String>> {
        self.run(|s| s.list_snapshots())
    }

    /// A streaming read of session `id` (see [`StoredReader`]): all of its
    /// events, as `loadStored` returns them, when `from_seq` is null or
    /// undefined; those from `from_seq` on, as `loadStoredFrom`, otherwise.
    /// Touches nothing until its `open`.
    #[napi]
    pub fn stored_reader(&self, id: Utf16String, from_seq: Option<f64>) -> StoredReader {
        StoredReader {
            log: SessionLogRef {
                root: self.root.clone(),
                options: self.options,
                state: self.state.clone(),
            },
            id: session_id(&id).map_err(|f| f.message),
            from: from_seq.map(|f| f.max(0.0) as u64),
            state: Arc::new(Mutex::new(ReaderState::Unopened)),
        }
    }

    /// The session's directory; computed, the disk is not touched.
    #[napi]
    pub fn locate(&self, meta_json: String) -> Option<Location> {
        let header = header::from_json(&meta_json).ok()?;
        let path = backend::session_dir(&self.root, &header.id).ok()?;
        Some(Location {
            kind: "sessionlog-session-dir".into(),
            path: path.to_string_lossy().into_owned(),
        })
    }

    /// Flushes and gives back this handle's share of the store; the last
    /// handle on a root closes the store. Idempotent.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self) -> AsyncTask<Work<()>> {
        let state = self.state.clone();
        Work::new(move || {
            let previous =
                std::mem::replace(&mut *state.lock().expect("handle lock"), State::Closed);
            match previous {
                State::Open(shared) => backend::release(shared),
                State::Unopened | State::Closed => Ok(()),
            }
        })
    }
}

/// Test-only: leaves a torn (never committed) record after the durable end
/// of session `id` under `root`, as a crash mid-append would. Every handle
/// on `root` in this process must be closed first. `cwd` is unused: the store
/// does not key sessions by working directory.
#[napi(ts_return_type = "Promise<void>")]
pub fn corrupt_tail_for_test(root: String, id: String, cwd: Option<String>) -> AsyncTask<Work<()>> {
    let _ = cwd;
    Work::new(move || backend::corrupt_tail_for_test(std::path::Path::new(&root), &id))
}

/// Test-only: `listSnapshots` of the store open at `root` in this process,
/// with the sessions `ids` deleted by another handle after the listing read
/// the sessions directory and before it computed any revision (a deletion
/// racing the listing, made deterministic).
#[napi(ts_return_type = "Promise<string>")]
pub fn list_snapshots_deleting_for_test(root: String, ids: Vec<String>) -> AsyncTask<Work<String>> {
    Work::new(move || backend::list_snapshots_deleting_for_test(std::path::Path::new(&root), &ids))
}
