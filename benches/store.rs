//! Store benchmarks (issue 5, "Criterion suites"): append, derive, reopen,
//! recovery and read, on the project's realistic session generator
//! ([`Sample`]: about 60% streamed `assistant/chunk` events of ~150 B, tool
//! calls, messages and tool results of a few KiB).
//!
//! Run with `cargo bench --bench store`. `SESSIONLOG_BENCH_SMOKE=1` shrinks
//! every size (1k events at most) and the measurement, so CI can run it
//! quickly; `cargo bench --bench store -- --test` runs each benchmark once.
//!
//! Long sessions are generated sessions (20 turns each) concatenated with
//! their seqs re-based, cut at a turn end, so every turn is closed and the
//! sizes are approximate (the first turn end at or past the nominal size;
//! the ids and element throughputs use the nominal size). Every store lives under one
//! temporary directory (`$TMPDIR`, default `/tmp`) for the whole run, so the
//! read-side figures are warm-cache figures. Stores are built once, outside
//! the timed loops, and only when a benchmark that needs them runs.
//!
//! Groups:
//! - `append/{durability}/1-session/{batch}`: appends of a bounded number of
//!   events in batches of 1, 16, 256, 4096 to one new session of a fresh
//!   store, for `Sync`, `Batched { 2 ms }` and `None`; only the `append`
//!   calls are timed (not open, create, close or the final group commit).
//!   `append/{durability}/64-sessions-2-threads/{batch}`: the same with 64
//!   sessions, two threads each appending round-robin to its 32 sessions.
//!   Fresh files: each measurement writes into a new directory.
//! - `derive/cold/{n}`: `Store::open_read_only` + `derive` + iterating every
//!   message; `derive/warm/{n}`: a second `derive` + iteration on an open
//!   store.
//! - `reopen/{checkpoint,stale,none}/{n}`: `Store::open` +
//!   `read_from(id, u64::MAX)` (forces the session load) + drop, with a fresh
//!   checkpoint, with one 10k events stale (appended after `close`, then the
//!   store dropped without `close`), and with the CHECKPOINT file deleted.
//! - `recovery/scan/{n}`: `Store::open_read_only` + forcing the load of a
//!   session whose checkpoint is deleted (a full scan of the log); throughput
//!   in bytes of log (`SessionStats::bytes`: preallocated space not counted).
//!   `recovery/record_scan/{n}`: the log scan alone, as recovery runs it
//!   (map every segment, check every record's frame and checksum), without
//!   decoding or folding; same byte throughput.
//!   `recovery/repair/{n}`: `Store::open` + `repair` of a session whose last
//!   turn stopped in a tool call, each iteration on a fresh copy of the
//!   directory (the copy is not timed); its throughput is one element per
//!   repair (elem/s = repairs/s).
//! - `read/read_from_last_1k/{n}` and `read/load/{n}`; `read/list/{n}`:
//!   `Store::list` of a store of n sessions of one event each (10,000;
//!   200 in smoke mode), each a directory with its `HEADER` (issue 14's
//!   `list` goal).

use criterion::{
    BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use sessionlog::event::{OwnedEvent, SurfaceOp};
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::segment::{self, ScanOptions, Tail};
use sessionlog::store::{Durability, Store};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

mod common;
use common::{ID, build_store, delete_checkpoint, options, reopen_once, smoke};

/// An endless stream of realistic events with contiguous seqs: generated
/// sessions concatenated, seqs (and the seqs they cite) re-based.
struct Stream {
    sample: Sample,
    /// Events generated so far (the seq of the next generated session's
    /// first event).
    generated: u64,
    /// Events handed out so far (the seq of the next one).
    next_seq: u64,
    pending: VecDeque<OwnedEvent>,
}

impl Stream {
    fn new(seed: u64) -> Self {
        Stream {
            sample: Sample::new(SampleConfig {
                seed,
                ..SampleConfig::default()
            }),
            generated: 0,
            next_seq: 0,
            pending: VecDeque::new(),
        }
    }

    /// Generates the next whole session, re-based, into `pending`; with
    /// `interrupt`, its last turn stops in the middle of a tool call.
    fn generate(&mut self, interrupt: bool) {
        let (_, events) = if interrupt {
            Sample::new(SampleConfig {
                seed: 7,
                turns: 2,
                interrupt_last_turn: true,
                ..SampleConfig::default()
            })
            .session("part")
        } else {
            self.sample.session("part")
        };
        let offset = self.generated;
        self.generated += events.len() as u64;
        self.pending.extend(events.into_iter().map(|mut e| {
            e.seq += offset;
            // Sample times advance by 7 ms per event from the same start.
            e.time += 7 * offset as i64;
            if let Some(src) = &mut e.source_event_seqs {
                for s in src.iter_mut() {
                    *s += offset;
                }
            }
            if let Some(SurfaceOp::Replace { start, end }) = &mut e.surface_op {
                *start += offset;
                *end += offset;
            }
            e
        }));
    }

    fn next_event(&mut self) -> OwnedEvent {
        if self.pending.is_empty() {
            self.generate(false);
        }
        self.next_seq += 1;
        self.pending.pop_front().expect("generated")
    }

    /// Exactly `n` events (the last turn may be left open).
    fn take(&mut self, n: usize) -> Vec<OwnedEvent> {
        (0..n).map(|_| self.next_event()).collect()
    }

    /// Events up to the first `turn/end` at or past seq `end`.
    fn turns_until(&mut self, end: u64) -> Vec<OwnedEvent> {
        let mut v = Vec::new();
        loop {
            let e = self.next_event();
            let done = e.seq + 1 >= end && e.kind == "turn/end";
            v.push(e);
            if done {
                return v;
            }
        }
    }
}

/// Appends whole turns to `id` until it has (about) `n` events, in batches of
/// 256; with `interrupt`, then a generated session of 2 turns whose last
/// turn is left open. Returns the event count.
fn fill(store: &Store, stream: &mut Stream, n: u64, interrupt: bool) -> u64 {
    while stream.next_seq < n {
        let end = (stream.next_seq + 65_536).min(n);
        for batch in stream.turns_until(end).chunks(256) {
            store.append(ID, batch).expect("append a valid batch");
        }
    }
    if interrupt {
        let tail: Vec<OwnedEvent> = {
            let rest: Vec<OwnedEvent> = stream.pending.drain(..).collect();
            stream.next_seq += rest.len() as u64;
            let mut rest = rest;
            stream.generate(true);
            let part: Vec<OwnedEvent> = stream.pending.drain(..).collect();
            stream.next_seq += part.len() as u64;
            rest.extend(part);
            rest
        };
        for batch in tail.chunks(256) {
            store.append(ID, batch).expect("append a valid batch");
        }
    }
    stream.next_seq
}

/// A built store of one session.
struct Fixture {
    dir: PathBuf,
    events: u64,
    /// Bytes of log (`SessionStats::bytes`).
    bytes: u64,
    checkpoint: PathBuf,
}

/// What a fixture holds after it is built.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Closed: a fresh checkpoint.
    Closed,
    /// Closed, then 10k (smoke: 100) more events appended and the store
    /// dropped without close: a stale checkpoint.
    Stale,
    /// Closed with the last turn open (a crash in a tool call).
    Interrupted,
}

fn stale_delta() -> u64 {
    if smoke() { 100 } else { 10_000 }
}

fn build(root: &Path, n: u64, kind: Kind) -> Fixture {
    let tag = match kind {
        Kind::Closed => "closed",
        Kind::Stale => "stale",
        Kind::Interrupted => "interrupted",
    };
    let dir = root.join(format!("{tag}-{n}"));
    let started = Instant::now();
    let mut stream = Stream::new(42);
    let (mut events, mut bytes) = (0, 0);
    let created_at = SampleConfig::default().start_time as u64;
    let checkpoint = build_store(&dir, created_at, |store| {
        events = fill(store, &mut stream, n, kind == Kind::Interrupted);
        bytes = store.stats(ID).expect("stats").bytes;
    });
    if kind == Kind::Stale {
        let store = Store::open(&dir, options(Durability::None)).expect("reopen");
        events = fill(&store, &mut stream, events + stale_delta(), false);
        bytes = store.stats(ID).expect("stats").bytes;
        drop(store);
        let store = Store::open_read_only(&dir).expect("reopen");
        assert!(store.read_from(ID, u64::MAX).expect("load").is_empty());
        let rec = store.recovery(ID).expect("loaded");
        assert!(rec.used_checkpoint, "{rec:?}");
        assert!(rec.replayed >= stale_delta(), "{rec:?}");
    }
    eprintln!(
        "store: built {tag} session of {events} events ({:.1} MiB of log) in {:.2?}",
        bytes as f64 / (1 << 20) as f64,
        started.elapsed()
    );
    Fixture {
        dir,
        events,
        bytes,
        checkpoint,
    }
}

/// Stores built on first use, shared by the groups.
struct Fixtures {
    root: tempfile::TempDir,
    built: RefCell<BTreeMap<(Kind, u64), Rc<Fixture>>>,
}

impl Fixtures {
    fn get(&self, n: u64, kind: Kind) -> Rc<Fixture> {
        self.built
            .borrow_mut()
            .entry((kind, n))
            .or_insert_with(|| Rc::new(build(self.root.path(), n, kind)))
            .clone()
    }
}

/// A fresh temporary directory for one measurement.
fn fresh_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("temporary directory")
}

fn durabilities() -> [(&'static str, Durability); 3] {
    [
        ("sync", Durability::Sync),
        (
            "batched-2ms",
            Durability::Batched {
                window: Duration::from_millis(2),
            },
        ),
        ("none", Durability::None),
    ]
}

/// Batches appended per measurement: bounded so that the whole group runs in
/// a few minutes on two cores.
fn batches_per_iter(d: Durability, batch: usize) -> usize {
    let n = match (d, batch) {
        (Durability::Sync, 1) => 200,
        (Durability::Sync, 16) => 100,
        (Durability::Sync, 256) => 40,
        (Durability::Sync, _) => 8,
        (_, 1) => 2_000,
        (_, 16) => 500,
        (_, 256) => 100,
        _ => 16,
    };
    if smoke() {
        (n / 20).clamp(1, 1_000 / batch.min(1_000))
    } else {
        n
    }
}

fn append(c: &mut Criterion) {
    let batches = [1usize, 16, 256, 4096];
    let max = batches
        .iter()
        .flat_map(|&b| durabilities().map(|(_, d)| b * batches_per_iter(d, b)))
        .max()
        .unwrap_or(0);
    let mut pool: Option<Vec<OwnedEvent>> = None;
    let mut g = c.benchmark_group("append");
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    for (name, d) in durabilities() {
        for batch in batches {
            let count = batch * batches_per_iter(d, batch);
            g.throughput(Throughput::Elements(count as u64));
            g.bench_function(BenchmarkId::new(format!("{name}/1-session"), batch), |b| {
                let pool = pool.get_or_insert_with(|| Stream::new(1).take(max));
                let events = &pool[..count];
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let tmp = fresh_dir("sessionlog-bench-append-");
                        let store = Store::open(tmp.path(), options(d)).expect("open");
                        store.create(SessionHeader::new(ID, 0)).expect("create");
                        let t = Instant::now();
                        for chunk in events.chunks(batch) {
                            store.append(ID, chunk).expect("append");
                        }
                        total += t.elapsed();
                        store.close().expect("close");
                    }
                    total
                })
            });
        }
    }
    // 64 sessions from 2 threads.
    for (name, d) in durabilities() {
        if d == Durability::Sync {
            continue;
        }
        for batch in [16usize, 256] {
            let rounds = if smoke() {
                1
            } else if batch == 16 {
                20
            } else {
                4
            };
            let count = 64 * rounds * batch;
            g.throughput(Throughput::Elements(count as u64));
            g.bench_function(
                BenchmarkId::new(format!("{name}/64-sessions-2-threads"), batch),
                |b| {
                    let pool = pool.get_or_insert_with(|| Stream::new(1).take(max));
                    let events = &pool[..rounds * batch];
                    let ids: Vec<String> = (0..64).map(|i| format!("s{i:02}")).collect();
                    b.iter_custom(|iters| {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let tmp = fresh_dir("sessionlog-bench-append-");
                            let store = Store::open(tmp.path(), options(d)).expect("open");
                            for id in &ids {
                                store.create(SessionHeader::new(id, 0)).expect("create");
                            }
                            let t = Instant::now();
                            std::thread::scope(|scope| {
                                for half in ids.chunks(32) {
                                    let store = &store;
                                    scope.spawn(move || {
                                        for chunk in events.chunks(batch) {
                                            for id in half {
                                                store.append(id, chunk).expect("append");
                                            }
                                        }
                                    });
                                }
                            });
                            total += t.elapsed();
                            store.close().expect("close");
                        }
                        total
                    })
                },
            );
        }
    }
    g.finish();
}

fn derive_sizes() -> [u64; 3] {
    if smoke() {
        [100, 300, 1_000]
    } else {
        [1_000, 100_000, 1_000_000]
    }
}

fn iterate(store: &Store) -> usize {
    let derived = store.derive(ID).expect("derive");
    derived.messages().map(black_box).count()
}

fn derive(c: &mut Criterion, fx: &Fixtures) {
    let mut g = c.benchmark_group("derive");
    for n in derive_sizes() {
        g.sample_size(if n >= 100_000 { 10 } else { 50 });
        g.throughput(Throughput::Elements(n));
        g.bench_function(BenchmarkId::new("cold", n), |b| {
            let f = fx.get(n, Kind::Closed);
            b.iter(|| {
                let store = Store::open_read_only(&f.dir).expect("open");
                let count = iterate(&store);
                drop(black_box(store));
                count
            })
        });
        g.bench_function(BenchmarkId::new("warm", n), |b| {
            let f = fx.get(n, Kind::Closed);
            let store = Store::open_read_only(&f.dir).expect("open");
            let messages = iterate(&store);
            assert!(messages > 0);
            b.iter(|| iterate(&store));
        });
    }
    g.finish();
}

fn reopen_sizes() -> [u64; 2] {
    if smoke() {
        [300, 1_000]
    } else {
        [100_000, 1_000_000]
    }
}

fn reopen(c: &mut Criterion, fx: &Fixtures) {
    let mut g = c.benchmark_group("reopen");
    g.sample_size(10);
    for n in reopen_sizes() {
        g.bench_function(BenchmarkId::new("checkpoint", n), |b| {
            let f = fx.get(n, Kind::Closed);
            assert!(f.checkpoint.exists());
            b.iter(|| reopen_once(&f.dir))
        });
        g.bench_function(BenchmarkId::new("stale", n), |b| {
            let f = fx.get(n, Kind::Stale);
            b.iter(|| reopen_once(&f.dir));
            let store = Store::open_read_only(&f.dir).expect("reopen");
            assert!(store.read_from(ID, u64::MAX).expect("load").is_empty());
            let rec = store.recovery(ID).expect("loaded");
            assert!(
                rec.used_checkpoint && rec.replayed > 0,
                "still stale: {rec:?}"
            );
        });
        g.bench_function(BenchmarkId::new("none", n), |b| {
            let f = fx.get(n, Kind::Closed);
            let saved = std::fs::read(&f.checkpoint).expect("checkpoint");
            // A dropped writable store writes no checkpoint: deleted once,
            // it stays deleted.
            delete_checkpoint(&f.checkpoint);
            b.iter(|| reopen_once(&f.dir));
            assert!(!f.checkpoint.exists(), "a dropped store wrote a checkpoint");
            std::fs::write(&f.checkpoint, saved).expect("restore the checkpoint");
        });
    }
    g.finish();
}

/// The segment files under `dir`, in seq order per session.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(segment::parse_segment_file_name)
                .is_some()
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn recovery(c: &mut Criterion, fx: &Fixtures) {
    let mut g = c.benchmark_group("recovery");
    g.sample_size(10);
    let n = if smoke() { 1_000 } else { 1_000_000 };
    let f = fx.get(n, Kind::Closed);
    g.throughput(Throughput::Bytes(f.bytes));
    g.bench_function(BenchmarkId::new("scan", n), |b| {
        let saved = std::fs::read(&f.checkpoint).expect("checkpoint");
        delete_checkpoint(&f.checkpoint);
        b.iter(|| {
            let store = Store::open_read_only(&f.dir).expect("open");
            black_box(store.read_from(ID, u64::MAX).expect("load"));
            drop(black_box(store));
        });
        let store = Store::open_read_only(&f.dir).expect("open");
        assert!(store.read_from(ID, u64::MAX).expect("load").is_empty());
        let rec = store.recovery(ID).expect("loaded");
        assert!(!rec.used_checkpoint && rec.replayed == f.events, "{rec:?}");
        drop(store);
        std::fs::write(&f.checkpoint, saved).expect("restore the checkpoint");
    });
    // The log scan alone: what recovery does to find the end of the log and
    // a torn tail (map each segment, check every frame and checksum), with
    // no decoding and no fold. `recovery/scan` above adds both.
    let segments = segment_files(&f.dir);
    let scan_all = || {
        let mut events = 0u64;
        for path in &segments {
            let file = std::fs::File::open(path).expect("open segment");
            // SAFETY: the fixture's files are not modified while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) }.expect("map segment");
            let ident = segment::read_header(&map).expect("segment header");
            let scan = segment::scan(&map, &ident, &ScanOptions::default()).expect("scan");
            assert_eq!(scan.tail, Tail::Clean, "{}", path.display());
            events += scan.batches.iter().map(|b| u64::from(b.count)).sum::<u64>();
        }
        events
    };
    assert_eq!(scan_all(), f.events, "the scan finds every event");
    g.bench_function(BenchmarkId::new("record_scan", n), |b| {
        b.iter(|| black_box(scan_all()))
    });
    let repair_sizes: &[u64] = if smoke() { &[300] } else { &[1_000, 100_000] };
    for &n in repair_sizes {
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("repair", n), |b| {
            let f = fx.get(n, Kind::Interrupted);
            b.iter_batched(
                || {
                    let tmp = fresh_dir("sessionlog-bench-repair-");
                    copy_dir(&f.dir, tmp.path());
                    tmp
                },
                |tmp| {
                    let store = Store::open(tmp.path(), options(Durability::Sync)).expect("open");
                    let closers = store.repair(ID).expect("repair");
                    assert_eq!(closers.len(), 3, "tool/result, step/end, turn/end");
                    drop(black_box(store));
                    tmp
                },
                BatchSize::PerIteration,
            );
        });
    }
    g.finish();
}

/// Copies a store directory (the lock file included; nothing holds it).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the store") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

fn read(c: &mut Criterion, fx: &Fixtures) {
    let mut g = c.benchmark_group("read");
    let n = if smoke() { 1_000 } else { 100_000 };
    let last = if smoke() { 100 } else { 1_000 };
    g.throughput(Throughput::Elements(last));
    g.bench_function(BenchmarkId::new("read_from_last_1k", n), |b| {
        let f = fx.get(n, Kind::Closed);
        let store = Store::open_read_only(&f.dir).expect("open");
        let from = f.events - last;
        assert_eq!(store.read_from(ID, from).expect("read").len() as u64, last);
        b.iter(|| store.read_from(ID, from).expect("read"));
    });
    // `list` over many small sessions: every session's HEADER is read.
    let sessions: u64 = if smoke() { 200 } else { 10_000 };
    g.throughput(Throughput::Elements(sessions));
    g.bench_function(BenchmarkId::new("list", sessions), |b| {
        let dir = fx.root.path().join(format!("list-{sessions}"));
        build_many(&dir, sessions);
        let store = Store::open_read_only(&dir).expect("open");
        assert_eq!(store.list().expect("list").len() as u64, sessions);
        b.iter(|| store.list().expect("list"));
    });
    g.throughput(Throughput::Elements(n));
    g.sample_size(10);
    g.bench_function(BenchmarkId::new("load", n), |b| {
        let f = fx.get(n, Kind::Closed);
        let store = Store::open_read_only(&f.dir).expect("open");
        assert_eq!(store.load(ID).expect("load").1.len() as u64, f.events);
        b.iter(|| store.load(ID).expect("load"));
    });
    g.finish();
}

/// A store of `count` sessions of one event each (built once per run).
fn build_many(dir: &Path, count: u64) {
    if dir.exists() {
        return;
    }
    let t0 = Instant::now();
    let store = Store::open(dir, options(Durability::None)).expect("open a new store");
    for i in 0..count {
        let id = format!("session-{i:06}");
        store
            .create(SessionHeader::new(id.clone(), 1_700_000_000_000))
            .expect("create");
        let e = sessionlog::build::user_message(0, 1_700_000_000_000, "hello");
        store.append(&id, &[e.borrowed()]).expect("append");
    }
    store.close().expect("close");
    eprintln!(
        "store: {count} sessions built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

fn bench(c: &mut Criterion) {
    let fx = Fixtures {
        root: fresh_dir("sessionlog-bench-store-"),
        built: RefCell::new(BTreeMap::new()),
    };
    eprintln!("store: stores in {}", fx.root.path().display());
    append(c);
    derive(c, &fx);
    reopen(c, &fx);
    recovery(c, &fx);
    read(c, &fx);
}

fn config() -> Criterion {
    common::config(if smoke() { (0.1, 0.2) } else { (1.0, 3.0) })
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
