//! Archive benchmark (issue 17): resuming a session from the local disk,
//! against the same on a new, empty store directory whose session comes
//! from the object store, lazily, with the bytes fetched.
//!
//! Run with `cargo bench --features archive --bench archive`.
//! `SESSIONLOG_BENCH_SMOKE=1` shrinks the session from 1M events to 20k
//! (and its segments to 256 KiB, so it still spans several); `-- --test`
//! runs each benchmark once. The object store is `object_store`'s
//! local-directory backend (no network: the figure is the archive path's
//! own cost, fetching, checking and writing what it fetches), or an
//! S3-compatible server when `SESSIONLOG_S3_ENDPOINT` is set.
//!
//! The session: turns of `turn/start`, a `user/message` on the surface, two
//! `assistant/chunk`s of ~150 B and `turn/end`, in batches of 64, 4 MiB
//! segments (a dozen for 1M events), built once, uploaded by `close` (its
//! checkpoint covers the whole log).
//!
//! Timed, each on the store directory that wrote it (`local`, no archive)
//! and on a new, empty directory over the same bucket prefix (`archive`,
//! created untimed before each iteration):
//! - `ready/{local,archive}/{n}`: `Store::open` + `acquire` (the session
//!   loaded for append: a resume that only appends). The archive path
//!   fetches the session's HEADER, checkpoint and tail segment only.
//! - `derive/{local,archive}/{n}`: `Store::open` + `derive`. Derive reads
//!   the data of the surface's live nodes in place, so it needs every
//!   segment holding one: this session has no compaction, every turn's
//!   user message is live, so that is every segment (a session whose
//!   compactions replaced its old messages would need only the recent
//!   ones).
//!
//! Printed once: the bytes each archive path fetched, against the log,
//! tail and checkpoint sizes.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::store::{ArchiveOptions, Durability, Options, Store, object_store};
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{ID, session_dir, smoke};

fn events() -> u64 {
    if smoke() { 20_000 } else { 1_000_000 }
}

/// Several segments for the session either way.
fn segment_size() -> u64 {
    if smoke() { 256 << 10 } else { 4 << 20 }
}

/// The store's options, without the archive.
fn local_options() -> Options {
    Options {
        segment_size: segment_size(),
        preallocate: segment_size(),
        ..common::options(Durability::None)
    }
}

fn ev(text: &str) -> OwnedEvent {
    Event::from_json(text).expect("a valid event").into_owned()
}

/// Turn `t` starting at seq `s`: five events.
fn turn(t: u64, s: u64) -> Vec<OwnedEvent> {
    let words = [
        "the",
        "log",
        "reads",
        "a",
        "segment",
        "checkpoint",
        "tool",
        "batch",
    ];
    let text: String = (0..24)
        .map(|i| words[((t * 7 + i * 3) % 8) as usize])
        .collect::<Vec<_>>()
        .join(" ");
    vec![
        ev(&format!(
            r#"{{"type":"turn/start","seq":{s},"time":{t},"data":{{"turn":{}}}}}"#,
            t + 1
        )),
        ev(&format!(
            r#"{{"type":"user/message","seq":{},"time":{t},"data":{{"role":"user","content":[{{"type":"text","text":"{t} {text}"}}]}},"surfaceOp":"append"}}"#,
            s + 1
        )),
        ev(&format!(
            r#"{{"type":"assistant/chunk","seq":{},"time":{t},"data":{{"turn":{},"step":1,"delta":"{text}"}}}}"#,
            s + 2,
            t + 1
        )),
        ev(&format!(
            r#"{{"type":"assistant/chunk","seq":{},"time":{t},"data":{{"turn":{},"step":1,"delta":"{t} {text}"}}}}"#,
            s + 3,
            t + 1
        )),
        ev(&format!(
            r#"{{"type":"turn/end","seq":{},"time":{t},"data":{{"turn":{},"reason":{{"kind":"completed"}}}}}}"#,
            s + 4,
            t + 1
        )),
    ]
}

/// The object store the benchmark uses, and its prefix.
fn bucket(root: &Path) -> (Arc<dyn object_store::ObjectStore>, String) {
    match std::env::var("SESSIONLOG_S3_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => {
            let prefix = format!("bench-{}", std::process::id());
            let store = ArchiveOptions::from_url(
                &format!("s3://sessionlog-test/{prefix}"),
                [
                    ("aws_endpoint", endpoint.as_str()),
                    ("aws_allow_http", "true"),
                    ("aws_region", "us-east-1"),
                    ("aws_access_key_id", "test"),
                    ("aws_secret_access_key", "test"),
                ],
            )
            .expect("an S3 client")
            .store;
            (store, prefix)
        }
        _ => {
            let dir = root.join("bucket");
            std::fs::create_dir_all(&dir).expect("the bucket directory");
            let store = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .expect("a local object store");
            (Arc::new(store), "archive".into())
        }
    }
}

fn options(store: &Arc<dyn object_store::ObjectStore>, prefix: &str, host: &str) -> Options {
    let mut archive = ArchiveOptions::new(store.clone(), prefix);
    archive.host_id = host.into();
    archive.upload_interval = Duration::from_secs(3600);
    Options {
        archive: Some(archive),
        ..local_options()
    }
}

/// Open + derive.
fn derive(dir: &Path, opts: Options) -> Store {
    let store = Store::open(dir, opts).expect("open");
    black_box(store.derive(ID).expect("derive"));
    store
}

/// Open + the session loaded for append.
fn ready(dir: &Path, opts: Options) -> Store {
    let store = Store::open(dir, opts).expect("open");
    black_box(store.acquire(ID).expect("acquire"));
    store
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn benches(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let (bucket, prefix) = bucket(root.path());
    let n = events();
    let writer = root.path().join("writer");
    {
        // Built with the archive on, so `close` uploads it all (and writes
        // the checkpoint first).
        let store = Store::open(&writer, options(&bucket, &prefix, "writer")).expect("open");
        store.create(SessionHeader::new(ID, 0)).expect("create");
        let mut seq = 0;
        let mut t = 0;
        let mut batch = Vec::new();
        while seq < n {
            batch.extend(turn(t, seq));
            seq += 5;
            t += 1;
            if batch.len() >= 64 || seq >= n {
                store.append(ID, &batch).expect("append");
                batch.clear();
            }
        }
        store.close().expect("close uploads the session");
    }
    let mut segs: Vec<(String, u64)> = std::fs::read_dir(session_dir(&writer))
        .expect("session dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| {
            let len = e.metadata().expect("metadata").len();
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    segs.sort();
    let log: u64 = segs.iter().map(|(_, len)| len).sum();
    let tail = segs.last().expect("a segment").1;
    let ck = std::fs::metadata(session_dir(&writer).join("CHECKPOINT"))
        .expect("checkpoint")
        .len();
    let fetched = |dir: &str, f: fn(&Path, Options) -> Store| {
        let store =
            Store::open(root.path().join(dir), options(&bucket, &prefix, "reader")).expect("open");
        let opened = store.archive_stats().expect("an archive");
        drop(store);
        let store = f(&root.path().join(dir), options(&bucket, &prefix, "reader"));
        let stats = store.archive_stats().expect("an archive");
        (stats.bytes_fetched, stats.objects_fetched, opened)
    };
    let (ready_bytes, ready_objects, opened) = fetched("once-ready", ready);
    let (derive_bytes, derive_objects, _) = fetched("once-derive", derive);
    eprintln!(
        "archive: {n} events in {} segments: log {:.1} MiB, tail {:.2} MiB, checkpoint {:.2} MiB; \
         on a new directory, open alone fetched {} B in {} objects (MANIFEST, HEADER), \
         open + acquire {:.2} MiB in {ready_objects} objects, \
         open + derive {:.2} MiB in {derive_objects} objects (local: 0 B fetched)",
        segs.len(),
        mib(log),
        mib(tail),
        mib(ck),
        opened.bytes_fetched,
        opened.objects_fetched,
        mib(ready_bytes),
        mib(derive_bytes),
    );

    let mut fresh = 0u64;
    let mut new_dir = || {
        fresh += 1;
        root.path().join(format!("host-{fresh}"))
    };
    for (name, f) in [
        ("ready", ready as fn(&Path, Options) -> Store),
        ("derive", derive),
    ] {
        let mut g = c.benchmark_group(name);
        g.sample_size(10);
        g.bench_with_input(BenchmarkId::new("local", n), &n, |b, _| {
            b.iter(|| f(&writer, local_options()));
        });
        g.bench_with_input(BenchmarkId::new("archive", n), &n, |b, _| {
            b.iter_batched(
                &mut new_dir,
                |dir| f(&dir, options(&bucket, &prefix, "reader")),
                BatchSize::PerIteration,
            );
        });
        g.finish();
    }
}

criterion_group! {
    name = archive;
    config = common::config(if smoke() { (0.1, 0.5) } else { (1.0, 10.0) });
    targets = benches
}
criterion_main!(archive);
