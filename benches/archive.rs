//! Archive benchmark (issue 17): resuming a session (`Store::open` on the
//! store directory + `derive`) from the local disk, against the same on a
//! new, empty store directory whose session comes from the object store,
//! with the bytes fetched.
//!
//! Run with `cargo bench --features archive --bench archive`.
//! `SESSIONLOG_BENCH_SMOKE=1` shrinks the session from 1M events to 20k;
//! `-- --test` runs each benchmark once. The object store is
//! `object_store`'s local-directory backend (no network: the figure is the
//! archive path's own cost, fetching, checking and writing every file
//! whole), or an S3-compatible server when `SESSIONLOG_S3_ENDPOINT` is set.
//!
//! The session: turns of `turn/start`, a `user/message` on the surface, two
//! `assistant/chunk`s of ~150 B and `turn/end`, in batches of 64, 64 MiB
//! segments, built once, uploaded by `close`.
//!
//! Timed:
//! - `resume/local/{n}`: open + derive on the store directory that wrote it
//!   (no archive);
//! - `resume/archive/{n}`: open + derive on a new, empty directory (created
//!   untimed before each iteration) over the same bucket prefix: the
//!   session's HEADER, checkpoint and segments are fetched.
//!
//! Printed once: the bytes the archive path fetched, against the session's
//! log and checkpoint sizes. Fetching is per session (every segment it
//! lacks), so the bytes fetched are the whole log plus the checkpoint, not
//! only the checkpoint and the tail.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::store::{ArchiveOptions, Durability, Options, Store, object_store};
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::{ID, build_store, smoke};

fn events() -> u64 {
    if smoke() { 20_000 } else { 1_000_000 }
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
        ..common::options(Durability::None)
    }
}

fn resume(dir: &Path, opts: Options) -> Store {
    let store = Store::open(dir, opts).expect("open");
    black_box(store.derive(ID).expect("derive"));
    store
}

fn benches(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let (bucket, prefix) = bucket(root.path());
    let n = events();
    let writer = root.path().join("writer");
    let checkpoint = build_store(&writer, 0, |store| {
        // Built with the archive on, so `close` uploads it all.
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
    });
    // build_store opened without the archive: upload now, as its host.
    Store::open(&writer, options(&bucket, &prefix, "writer"))
        .and_then(|s| {
            s.take_over(ID)?;
            s.close()
        })
        .expect("upload the session");
    let log: u64 = std::fs::read_dir(checkpoint.parent().expect("session dir"))
        .expect("session dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .map(|e| e.metadata().expect("metadata").len())
        .sum();
    let ck = std::fs::metadata(&checkpoint).expect("checkpoint").len();

    let reader = root.path().join("once");
    let store = resume(&reader, options(&bucket, &prefix, "reader"));
    let stats = store.archive_stats().expect("an archive");
    eprintln!(
        "archive: {n} events, log {:.1} MiB, checkpoint {:.1} KiB; a resume on a new \
         directory fetched {:.1} MiB in {} objects",
        log as f64 / (1 << 20) as f64,
        ck as f64 / 1024.0,
        stats.bytes_fetched as f64 / (1 << 20) as f64,
        stats.objects_fetched
    );
    drop(store);

    let mut g = c.benchmark_group("resume");
    g.sample_size(10);
    g.bench_with_input(BenchmarkId::new("local", n), &n, |b, _| {
        b.iter(|| resume(&writer, common::options(Durability::None)));
    });
    let mut fresh = 0u64;
    g.bench_with_input(BenchmarkId::new("archive", n), &n, |b, _| {
        b.iter_batched(
            || {
                fresh += 1;
                root.path().join(format!("host-{fresh}"))
            },
            |dir| resume(&dir, options(&bucket, &prefix, "reader")),
            BatchSize::PerIteration,
        );
    });
    g.finish();
}

criterion_group! {
    name = archive;
    config = common::config(if smoke() { (0.1, 0.5) } else { (1.0, 10.0) });
    targets = benches
}
criterion_main!(archive);
