//! The archive tier on object storage (issue 17, `format-spec.md` section
//! 10): a store's sealed segments and checkpoints uploaded to a bucket,
//! evicted locally, fetched back on demand, and each session's writer
//! fenced across hosts by lease objects.
//!
//! One concern a file:
//! - [`config`]: the public options and the object key layout;
//! - [`uploader`]: the background upload pass and local eviction;
//! - [`fetch`]: the store's identity, sessions and segments brought from the
//!   bucket into the store directory;
//! - [`lease`]: ownership of a session across hosts;
//! - [`fence`]: the conditional writes that keep a host which lost a
//!   lease from replacing what the new holder wrote, and the quarantine of
//!   local segments that diverged from the bucket's;
//! - [`hooks`]: the few calls the engine makes into the archive.
//!
//! The store's API stays synchronous: the archive owns a one-worker tokio
//! runtime and blocks on it, with a timeout and retries on every request.

mod config;
mod fence;
mod fetch;
pub(crate) mod hooks;
mod lease;
mod uploader;

pub use config::{ArchiveOptions, EvictionPolicy};
pub use uploader::{ArchiveReport, ArchiveStats};

use crate::vfs::Vfs;
use object_store::path::Path as ObjectPath;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the archive of one store handle knows and runs.
pub(crate) struct Archive {
    pub(super) opts: ArchiveOptions,
    rt: tokio::runtime::Runtime,
    /// The store directory.
    pub(super) store_dir: PathBuf,
    /// The store directory's `sessions/`.
    pub(super) sessions_dir: PathBuf,
    pub(super) vfs: Arc<dyn Vfs>,
    /// This host's name in leases.
    pub(super) host: String,
    pub(super) state: Mutex<State>,
    pub(super) counters: Counters,
    /// The background uploader, stopped by `close` or drop.
    uploader: Mutex<Option<crate::engine::periodic::Periodic>>,
    /// Held by each upload pass, and by a delete or replace from before
    /// it deletes a session's objects until its directory has changed
    /// (`Store::archive_quiet`).
    pub(super) passes: Mutex<()>,
    /// The backend answered a put with `If-Match` as not implemented (the
    /// local file system backend): replacing is emulated (section 10.5).
    no_if_match: std::sync::atomic::AtomicBool,
    /// The store's lock table (set once the store is open): an eviction
    /// holds the writer lock of a session it does not write while it
    /// removes that session's files, so no replace or delete of another
    /// process is between its check of a segment and its exchange.
    pub(super) locks: std::sync::OnceLock<Arc<crate::engine::locks::LockTable>>,
}

/// What the archive remembers between passes.
#[derive(Default)]
pub(super) struct State {
    /// Sessions (by directory name) whose lease this handle holds, with its
    /// epoch: only their files are uploaded.
    pub(super) held: HashMap<String, u64>,
    /// Sessions whose lease another host took meanwhile: appends fail.
    pub(super) fenced: HashMap<String, (String, u64)>,
    /// Files confirmed uploaded: (session dir, file name) to (length,
    /// sealed). A sealed segment uploaded once never needs it again;
    /// eviction trusts only these (or a `HEAD` that agrees).
    pub(super) uploaded: HashMap<(String, String), (u64, bool)>,
    /// The file (length, modification time, inode) of each session's last
    /// uploaded checkpoint: an unchanged one is not even read again.
    pub(super) checkpoints: HashMap<String, CheckpointStamp>,
    /// The checkpoint this handle last fetched of each session: the
    /// object's entity tag and the local file it became. A take-over finds
    /// the local checkpoint current if both are unchanged (not fetched
    /// twice in one resume).
    pub(super) fetched_checkpoints: HashMap<String, (String, CheckpointStamp)>,
    /// Sessions hydrated or found missing in the bucket this run.
    pub(super) known_remote: HashSet<String>,
    /// The objects of each held session as this handle last wrote or
    /// listed them: (session dir, file name) to what was seen. A write
    /// replaces only the version seen here (`If-Match`), and creates only
    /// what is not here (`If-None-Match: *`).
    pub(super) seen: HashMap<(String, String), fence::Seen>,
    /// Held sessions whose objects this handle has listed into `seen`
    /// since it took their lease (once per lease).
    pub(super) seeded: HashSet<String>,
    /// Writes of this handle whose answer never came (a failed request
    /// that may have landed): (session dir, file name) to the digests of
    /// the bodies tried since the key was last seen. An object holding one
    /// of them is this handle's own, replaceable (section 10.5).
    pub(super) unsure: HashMap<(String, String), Vec<fence::Digest>>,
    /// The uid of the bucket's `HEADER` of each session directory, as this
    /// handle last read it (hydrating, or checking a copy before a fetch
    /// into it); forgotten with the session's objects, so every take reads
    /// it again.
    pub(super) remote_uids: HashMap<String, [u8; 16]>,
}

impl State {
    /// Forgets what this handle knew of session directory `dir`'s
    /// objects: a new lease (another holder may have written meanwhile),
    /// or a deleted session.
    pub(super) fn forget_objects(&mut self, dir: &str) {
        self.uploaded.retain(|(d, _), _| d != dir);
        self.seen.retain(|(d, _), _| d != dir);
        self.unsure.retain(|(d, _), _| d != dir);
        self.seeded.remove(dir);
        self.checkpoints.remove(dir);
        self.remote_uids.remove(dir);
    }
}

/// What identifies one written checkpoint file (each is a new file renamed
/// into place).
pub(super) type CheckpointStamp = (u64, Option<std::time::SystemTime>, u64);

/// Counters for reports and benchmarks.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) bytes_uploaded: AtomicU64,
    pub(super) objects_uploaded: AtomicU64,
    pub(super) bytes_fetched: AtomicU64,
    pub(super) objects_fetched: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) evicted: AtomicU64,
    pub(super) conflicts: AtomicU64,
    pub(super) diverged: AtomicU64,
    pub(super) quarantined: AtomicU64,
}

/// A request that will fail the same way if tried again.
fn permanent(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    matches!(
        e,
        E::NotFound { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotImplemented
            | E::NotSupported { .. }
            | E::InvalidPath { .. }
            | E::UnknownConfigurationKey { .. }
    )
}

impl Archive {
    /// The archive of the store in `store_dir`. Nothing is requested yet.
    pub(super) fn new(
        opts: ArchiveOptions,
        store_dir: &std::path::Path,
        vfs: Arc<dyn Vfs>,
    ) -> std::io::Result<Archive> {
        // One worker: the HTTP client's connections progress while no
        // caller blocks, and the archive never competes with the writers
        // for more than a thread.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sessionlog-archive-io")
            .enable_all()
            .build()?;
        let host = if opts.host_id.is_empty() {
            let name = std::fs::read_to_string("/etc/hostname")
                .map(|s| s.trim().to_owned())
                .ok()
                .filter(|s| !s.is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_else(|| "localhost".into());
            let dir = std::fs::canonicalize(store_dir).unwrap_or_else(|_| store_dir.to_owned());
            format!("{name}:{}", dir.display())
        } else {
            opts.host_id.clone()
        };
        Ok(Archive {
            opts,
            rt,
            store_dir: store_dir.to_owned(),
            sessions_dir: store_dir.join(crate::engine::registry::SESSIONS_DIR),
            vfs,
            host,
            state: Mutex::new(State::default()),
            counters: Counters::default(),
            uploader: Mutex::new(None),
            passes: Mutex::new(()),
            no_if_match: std::sync::atomic::AtomicBool::new(false),
            locks: std::sync::OnceLock::new(),
        })
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs one request to the object store (`f` builds it, again for each
    /// try), with the timeout and retries of the options. Errors that a
    /// retry cannot change (not found, already exists, a failed
    /// precondition) are returned at once.
    pub(super) fn call<T, F, Fut>(&self, f: F) -> object_store::Result<T>
    where
        F: Fn(Arc<dyn object_store::ObjectStore>) -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let mut backoff = self.opts.retry_backoff;
        let mut attempt = 0;
        loop {
            let store = self.opts.store.clone();
            let timeout = self.opts.request_timeout;
            let result = self.rt.block_on(async {
                match tokio::time::timeout(timeout, f(store)).await {
                    Ok(r) => r,
                    Err(_) => Err(object_store::Error::Generic {
                        store: "archive",
                        source: format!("no answer within {timeout:?}").into(),
                    }),
                }
            });
            match result {
                Ok(v) => return Ok(v),
                Err(e) if permanent(&e) || attempt >= self.opts.max_retries => return Err(e),
                Err(_) => {
                    attempt += 1;
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Writes `body` at `key` only if no object is there (S3
    /// `If-None-Match: *`, a no-replace link on the local backend): `true`
    /// if this call created it, `false` if one existed.
    pub(super) fn put_if_absent(
        &self,
        key: &ObjectPath,
        body: Vec<u8>,
    ) -> object_store::Result<bool> {
        use object_store::{PutMode, PutOptions, PutPayload};
        let body = bytes::Bytes::from(body);
        let put = self.call(|s| {
            let (key, body) = (key.clone(), body.clone());
            async move {
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..PutOptions::default()
                };
                s.put_opts(&key, PutPayload::from(body), opts).await
            }
        });
        match put {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The whole object at `key`, or `None` if there is none.
    pub(super) fn get(&self, key: &ObjectPath) -> object_store::Result<Option<bytes::Bytes>> {
        let got = self.call(|s| {
            let key = key.clone();
            async move { s.get(&key).await?.bytes().await }
        });
        match got {
            Ok(b) => {
                self.counters
                    .bytes_fetched
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                self.counters
                    .objects_fetched
                    .fetch_add(1, Ordering::Relaxed);
                Ok(Some(b))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every object under `prefix` (recursively), with its size.
    pub(super) fn list(&self, prefix: &ObjectPath) -> object_store::Result<Vec<(ObjectPath, u64)>> {
        let listed = self.list_meta(prefix)?;
        Ok(listed.into_iter().map(|m| (m.location, m.size)).collect())
    }

    /// Every object under `prefix` (recursively), as listed.
    pub(super) fn list_meta(
        &self,
        prefix: &ObjectPath,
    ) -> object_store::Result<Vec<object_store::ObjectMeta>> {
        use futures::TryStreamExt;
        self.call(|s| {
            let prefix = prefix.clone();
            async move { s.list(Some(&prefix)).try_collect::<Vec<_>>().await }
        })
    }

    /// The names of the "directories" right under `prefix`.
    pub(super) fn list_dirs(&self, prefix: &ObjectPath) -> object_store::Result<Vec<String>> {
        let listed = self.call(|s| {
            let prefix = prefix.clone();
            async move { s.list_with_delimiter(Some(&prefix)).await }
        })?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(percent_decode))
            .collect())
    }

    /// The counters, for [`crate::store::Store::archive_stats`].
    pub(super) fn stats(&self) -> ArchiveStats {
        let c = &self.counters;
        ArchiveStats {
            bytes_uploaded: c.bytes_uploaded.load(Ordering::Relaxed),
            objects_uploaded: c.objects_uploaded.load(Ordering::Relaxed),
            bytes_fetched: c.bytes_fetched.load(Ordering::Relaxed),
            objects_fetched: c.objects_fetched.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            conflicts: c.conflicts.load(Ordering::Relaxed),
            diverged: c.diverged.load(Ordering::Relaxed),
            quarantined: c.quarantined.load(Ordering::Relaxed),
        }
    }

    /// Stops and joins the background uploader, if it runs.
    pub(super) fn stop_uploader(&self) {
        let thread = self
            .uploader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            t.stop();
        }
    }
}

impl Drop for Archive {
    fn drop(&mut self) {
        self.stop_uploader();
    }
}

/// The session directory name of `id` (its key under `sessions/`).
pub(super) fn dir_name(id: &str) -> Option<String> {
    crate::fsutil::encode_session_dir_name(id).ok()
}

/// A key part as `object_store` lists it, decoded: it percent-encodes the
/// bytes it does not keep (a session directory's `~` among them) when a key
/// is built, and lists the encoded form.
fn percent_decode(part: &str) -> String {
    let b = part.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An error of the object store as the store's error, naming the key.
pub(super) fn archive_error(
    session: Option<&str>,
    key: &ObjectPath,
    what: &str,
    e: impl std::fmt::Display,
) -> crate::engine::Error {
    crate::engine::Error::Archive {
        session: session.map(str::to_owned),
        key: key.to_string(),
        reason: format!("{what}: {e}"),
    }
}
