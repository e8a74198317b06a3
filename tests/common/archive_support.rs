//! What the archive tests (`tests/archive.rs`) share: the buckets to run
//! on (the local file system backend, and S3 when `SESSIONLOG_S3_ENDPOINT`
//! is set), a host's options, and looks into the bucket and the session
//! directory.

use crate::common::turn_log;
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::store::object_store::{self, ObjectStore, path::Path as ObjectPath};
use sessionlog::store::{ArchiveOptions, EvictionPolicy, Options, Store};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A bucket for one test: a fresh prefix on the backend.
pub struct Bucket {
    pub name: &'static str,
    pub store: Arc<dyn ObjectStore>,
    pub prefix: String,
    _dir: Option<tempfile::TempDir>,
}

/// The backends to run on: the local file system always, S3 when an
/// endpoint is given.
pub fn buckets(test: &str) -> Vec<Bucket> {
    let dir = tempfile::tempdir().unwrap();
    let local = object_store::local::LocalFileSystem::new_with_prefix(dir.path())
        .unwrap()
        .with_automatic_cleanup(true);
    let mut out = vec![Bucket {
        name: "local",
        store: Arc::new(local),
        prefix: "archive".into(),
        _dir: Some(dir),
    }];
    match std::env::var("SESSIONLOG_S3_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => out.push(s3_bucket(&endpoint, test)),
        _ => eprintln!("{test}: S3 run skipped (SESSIONLOG_S3_ENDPOINT is not set)"),
    }
    out
}

/// A bucket on the S3-compatible server at `endpoint`, created with a plain
/// unsigned `PUT /<bucket>` (the test server accepts it; `object_store` has
/// no bucket creation), and a prefix unique to this run.
pub fn s3_bucket(endpoint: &str, test: &str) -> Bucket {
    use std::io::{Read, Write};
    let bucket = "sessionlog-test";
    let hostport = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut conn = std::net::TcpStream::connect(&hostport).expect("connect to the S3 server");
    write!(
        conn,
        "PUT /{bucket} HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.contains("BucketAlreadyOwnedByYou"),
        "creating the bucket: {answer}"
    );
    let store = s3_options(endpoint, bucket, "").store;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Bucket {
        name: "s3",
        store: Arc::new(store),
        prefix: format!("{test}-{}-{nanos}", std::process::id()),
        _dir: None,
    }
}

/// The archive options of an S3-compatible server at `endpoint` (the test
/// server takes any credentials).
pub fn s3_options(endpoint: &str, bucket: &str, prefix: &str) -> ArchiveOptions {
    ArchiveOptions::from_url(
        &format!("s3://{bucket}/{prefix}"),
        [
            ("aws_endpoint", endpoint),
            ("aws_allow_http", "true"),
            ("aws_region", "us-east-1"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
        ],
    )
    .unwrap()
}

/// Options for a "host" on `bucket`: 4 KiB segments (a log spans many),
/// uploads only when the test asks (an hour between background passes).
pub fn host_options(bucket: &Bucket, host: &str, evict: EvictionPolicy) -> Options {
    let mut archive = ArchiveOptions::new(bucket.store.clone(), bucket.prefix.clone());
    archive.host_id = host.into();
    archive.evict = evict;
    archive.upload_interval = Duration::from_secs(3600);
    archive.retry_backoff = Duration::from_millis(5);
    Options {
        segment_size: 4096,
        preallocate: 4096,
        archive: Some(archive),
        ..Options::default()
    }
}

/// Appends `log` to `id` a turn (three or four events) at a time, so a log
/// spans many small segments.
pub fn append_turns(store: &Store, id: &str, log: &[OwnedEvent]) {
    let mut start = 0;
    for (i, e) in log.iter().enumerate() {
        if e.kind == "turn/end" || i + 1 == log.len() {
            store.append(id, &log[start..=i]).unwrap();
            start = i + 1;
        }
    }
}

/// The length of the prefix of `log` made of its first `turns` turns.
pub fn turns_len(log: &[OwnedEvent], turns: usize) -> usize {
    log.iter()
        .enumerate()
        .filter(|(_, e)| e.kind == "turn/end")
        .nth(turns - 1)
        .unwrap()
        .0
        + 1
}

pub fn read_all(store: &Store, id: &str) -> Vec<OwnedEvent> {
    store
        .events(id, 0)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

pub fn segment_files(dir: &Path) -> Vec<String> {
    files_ending(dir, ".seg")
}

/// The files of `dir` whose names end with `suffix`, sorted.
pub fn files_ending(dir: &Path, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

pub fn objects(bucket: &Bucket) -> Vec<(String, u64)> {
    use futures::TryStreamExt;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = ObjectPath::from(bucket.prefix.as_str());
    let mut v: Vec<(String, u64)> = rt
        .block_on(bucket.store.list(Some(&prefix)).try_collect::<Vec<_>>())
        .unwrap()
        .into_iter()
        .map(|m| (m.location.to_string(), m.size))
        .collect();
    v.sort();
    v
}

pub fn object_bytes(store: &Arc<dyn ObjectStore>, key: &str) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        store
            .get(&ObjectPath::from(key))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    })
}

/// Writes object `key` (a raw put, as another program sharing the bucket
/// might).
#[allow(dead_code)] // not every test binary that includes this uses it
pub fn put_object(store: &Arc<dyn ObjectStore>, key: &str, bytes: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(store.put(&ObjectPath::from(key), bytes.to_vec().into()))
        .unwrap();
}

/// The segment objects of session directory `s` in the bucket, oldest
/// first: (file name, size).
pub fn segment_objects(bucket: &Bucket) -> Vec<(String, u64)> {
    let prefix = format!("{}/sessions/s/", bucket.prefix);
    objects(bucket)
        .into_iter()
        .filter_map(|(k, size)| Some((k.strip_prefix(&prefix)?.to_owned(), size)))
        .filter(|(n, _)| n.ends_with(".seg"))
        .collect()
}

/// The size of object `name` of session directory `s`.
pub fn object_size(bucket: &Bucket, name: &str) -> u64 {
    let key = format!("{}/sessions/s/{name}", bucket.prefix);
    objects(bucket)
        .into_iter()
        .find(|(k, _)| *k == key)
        .unwrap_or_else(|| panic!("{}: no object {key}", bucket.name))
        .1
}

/// Runs one request against the bucket's object store.
pub fn on_bucket<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Host "a" writes session "s" (`log`, or 200 turns: dozens of 4 KiB
/// segments) in `dir` and closes: every segment and the checkpoint
/// (covering it all) go to the bucket. Returns the log.
pub fn archived_session(
    bucket: &Bucket,
    dir: &Path,
    log: Option<Vec<OwnedEvent>>,
) -> Vec<OwnedEvent> {
    let log = log.unwrap_or_else(|| turn_log(200, "lazy"));
    let a = Store::open(dir, host_options(bucket, "a", EvictionPolicy::default())).unwrap();
    a.create(SessionHeader::new("s", 0)).unwrap();
    append_turns(&a, "s", &log);
    a.close().unwrap();
    log
}

/// A host named `host` on a new, empty directory `dir`, and the (bytes,
/// objects) opening it fetched.
pub fn new_host(bucket: &Bucket, dir: &Path, host: &str) -> (Store, (u64, u64)) {
    let store = Store::open(dir, host_options(bucket, host, EvictionPolicy::default())).unwrap();
    let opened = fetched(&store);
    (store, opened)
}

/// (bytes, objects) fetched by `store` so far.
pub fn fetched(store: &Store) -> (u64, u64) {
    let st = store.archive_stats().unwrap();
    (st.bytes_fetched, st.objects_fetched)
}
