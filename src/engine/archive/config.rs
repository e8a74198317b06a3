//! The archive's public configuration and its object key layout
//! (`format-spec.md` section 10).

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use std::sync::Arc;
use std::time::Duration;

/// Which locally stored sealed segments may be removed once their upload is
/// confirmed. A session's last segment (the tail a resume needs) and its
/// checkpoint are never evicted. With neither bound set nothing is evicted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EvictionPolicy {
    /// Evict a sealed segment whose file was last modified this long ago.
    pub older_than: Option<Duration>,
    /// Evict the oldest sealed segments while the segment files of the whole
    /// store take more than this many bytes.
    pub max_local_bytes: Option<u64>,
}

impl EvictionPolicy {
    /// Evict sealed segments as soon as their upload is confirmed.
    pub fn immediately() -> Self {
        EvictionPolicy {
            older_than: Some(Duration::ZERO),
            max_local_bytes: None,
        }
    }

    /// Evict sealed segments older than `age`.
    pub fn older_than(age: Duration) -> Self {
        EvictionPolicy {
            older_than: Some(age),
            max_local_bytes: None,
        }
    }

    /// Evict the oldest sealed segments while the store's segments take
    /// more than `bytes`.
    pub fn max_local_bytes(bytes: u64) -> Self {
        EvictionPolicy {
            older_than: None,
            max_local_bytes: Some(bytes),
        }
    }
}

/// The archive tier (issue 17): sealed segments and checkpoints uploaded to
/// an object store in the background, evicted locally by `evict`, fetched
/// back when a session needs them; ownership of a session across hosts
/// fenced by lease objects. Set it as
/// [`Options::archive`](crate::store::Options::archive).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ArchiveOptions {
    /// The bucket (or any `object_store` backend). A `LocalFileSystem`
    /// should be built `with_automatic_cleanup(true)` (as
    /// [`ArchiveOptions::from_url`] does for `file://`): otherwise the
    /// directory of a session deleted from it stays, listed like a
    /// session, and a host holding a copy of that session made before the
    /// delete still lists the copy (reading or writing it is refused
    /// either way).
    pub store: Arc<dyn ObjectStore>,
    /// The key prefix every object of this store lives under ("" for the
    /// bucket's root). Hosts sharing one prefix share one store.
    pub prefix: String,
    /// This host's name in leases. Empty (the default): the host name and
    /// the store directory's path, so two store directories on one machine
    /// are two hosts.
    pub host_id: String,
    /// Which local sealed segments are removed once uploaded.
    pub evict: EvictionPolicy,
    /// How often the background uploader looks for new sealed segments and
    /// checkpoints (and applies `evict`).
    pub upload_interval: Duration,
    /// A request to the object store that takes longer fails (and is
    /// retried).
    pub request_timeout: Duration,
    /// Retries of a failed or timed-out request, with exponential backoff
    /// from `retry_backoff` (doubling, at most 5 s between tries).
    pub max_retries: u32,
    /// The first backoff between retries.
    pub retry_backoff: Duration,
}

impl ArchiveOptions {
    /// The archive on `store` under `prefix`, with the default policy (no
    /// eviction), an upload pass every second, 30 s request timeout and 5
    /// retries from 100 ms.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<String>) -> Self {
        ArchiveOptions {
            store,
            prefix: prefix.into().trim_matches('/').to_owned(),
            host_id: String::new(),
            evict: EvictionPolicy::default(),
            upload_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(30),
            max_retries: 5,
            retry_backoff: Duration::from_millis(100),
        }
    }

    /// The archive at `url`: `s3://bucket/prefix`, `file:///dir/prefix`,
    /// `memory:///` and the other schemes `object_store` knows. `options`
    /// are the backend's (for S3: `aws_endpoint`, `aws_access_key_id`,
    /// `aws_secret_access_key`, `aws_region`, `aws_allow_http`; the
    /// environment's `AWS_*` variables are read too). Conditional puts are
    /// turned on for S3: ownership fencing needs them.
    pub fn from_url<I, K, V>(url: &str, options: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let parsed = url::Url::parse(url).map_err(|e| format!("archive URL {url:?}: {e}"))?;
        let mut opts: Vec<(String, String)> = Vec::new();
        if parsed.scheme() == "s3" || parsed.scheme() == "s3a" {
            for (k, v) in std::env::vars() {
                let k = k.to_ascii_lowercase();
                if k.starts_with("aws_") {
                    opts.push((k, v));
                }
            }
            opts.push(("aws_conditional_put".into(), "etag".into()));
        }
        for (k, v) in options {
            opts.push((k.as_ref().to_ascii_lowercase(), v.into()));
        }
        if parsed.scheme() == "file" {
            // The local backend wants its directory to exist.
            std::fs::create_dir_all(parsed.path())
                .map_err(|e| format!("archive directory {}: {e}", parsed.path()))?;
            // Directories emptied by deletes are removed, so that a listing
            // names a session only while the bucket holds an object of it,
            // as on S3 (a listing tells a copy of a session deleted
            // elsewhere by its absence, format-spec.md 10.3).
            let store = object_store::local::LocalFileSystem::new_with_prefix(parsed.path())
                .map_err(|e| format!("archive URL {url:?}: {e}"))?
                .with_automatic_cleanup(true);
            return Ok(Self::new(Arc::new(store), ""));
        }
        let (store, prefix) = object_store::parse_url_opts(&parsed, opts)
            .map_err(|e| format!("archive URL {url:?}: {e}"))?;
        Ok(Self::new(Arc::from(store), prefix.to_string()))
    }

    /// The key `rest` (slash-separated) under the prefix.
    pub(super) fn key(&self, rest: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rest)
        } else {
            ObjectPath::from(format!("{}/{rest}", self.prefix))
        }
    }

    /// `<prefix>/MANIFEST`: the store's identity, shared by every host.
    pub(super) fn manifest_key(&self) -> ObjectPath {
        self.key("MANIFEST")
    }

    /// `<prefix>/sessions`: one "directory" per session.
    pub(super) fn sessions_key(&self) -> ObjectPath {
        self.key("sessions")
    }

    /// `<prefix>/sessions/<dir>`: a session's files.
    pub(super) fn session_key(&self, dir: &str) -> ObjectPath {
        self.key(&format!("sessions/{dir}"))
    }

    /// `<prefix>/sessions/<dir>/<file>`: one file of a session, under the
    /// name it has locally.
    pub(super) fn file_key(&self, dir: &str, file: &str) -> ObjectPath {
        self.key(&format!("sessions/{dir}/{file}"))
    }

    /// `<prefix>/leases/<dir>`: a session's lease records, one per epoch.
    pub(super) fn lease_prefix(&self, dir: &str) -> ObjectPath {
        self.key(&format!("leases/{dir}"))
    }

    /// `<prefix>/leases/<dir>/<epoch, 20 digits>`.
    pub(super) fn lease_key(&self, dir: &str, epoch: u64) -> ObjectPath {
        self.key(&format!("leases/{dir}/{epoch:020}"))
    }
}
