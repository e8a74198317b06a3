//! Reopen benchmarks (issue 3): the cost of `Store::open` plus the first
//! access to a session, with a fresh checkpoint and with none (a full
//! rebuild from the log), against the session's size.
//!
//! Run with `cargo bench --bench reopen`. `SESSIONLOG_BENCH_SMOKE=1` shrinks
//! the sizes (1k, 10k, 20k instead of 1k, 100k, 1M) and the measurement, so
//! CI can run it quickly; `cargo bench --bench reopen -- --test` runs each
//! benchmark once.
//!
//! Each store is built once per size, outside the timed loops, and only when
//! a benchmark of that size runs (a filter skips the build): one session in a
//! realistic mix (about 60% `assistant/chunk` of ~150 B; turns of steps with
//! nested `user/message`, `assistant/message` citing its chunks, and
//! `tool/call` + `tool/result` pairs; every turn closed), appended in batches
//! of 64 with `Durability::None`, then `close()` (which writes the
//! checkpoint). The stores live in one temporary directory for the whole run
//! (under `$TMPDIR`, default `/tmp`), so the files are in the page cache: the
//! figures are warm-cache reopen costs.
//!
//! Timed:
//! - `reopen/checkpoint/{n}`: `Store::open` + first access to the session
//!   (`read_from(id, u64::MAX)`: forces the lazy load, then decodes only the
//!   last batch) + drop, with a fresh checkpoint;
//! - `reopen/rebuild/{n}`: the same after the CHECKPOINT file is deleted
//!   (untimed, before every iteration). A writable store writes a checkpoint
//!   only on flush/close, so dropping it leaves the file deleted.
//!
//! Targets (see BENCHMARKS.md): reopen with a fresh checkpoint within 2x
//! across 1k/100k/1M events, and >= 100x faster than a rebuild at 1M.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use sessionlog::checkpoint::CHECKPOINT_FILE;
use sessionlog::event::{OwnedEvent, SurfaceOp};
use sessionlog::store::{Durability, Store};
use std::cell::OnceCell;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod common;
use common::{ID, build_store, delete_checkpoint, options, reopen_once, session_dir, smoke};

const T0: i64 = 1_786_000_000_000;
const BATCH: usize = 64;

fn sizes() -> [u64; 3] {
    if smoke() {
        [1_000, 10_000, 20_000]
    } else {
        [1_000, 100_000, 1_000_000]
    }
}

/// A deterministic pseudo-random number from a few integers (splitmix64).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Words for the text of chunks and messages.
const WORDS: [&str; 16] = [
    "the",
    "session",
    "log",
    "reads",
    "segment",
    "checkpoint",
    "surface",
    "node",
    "tool",
    "result",
    "while",
    "parsing",
    "a",
    "batch",
    "of",
    "events",
];

/// `len` bytes of plain words (JSON-safe), varied by `seed`.
fn text(seed: u64, len: usize) -> String {
    let mut s = String::with_capacity(len + 12);
    let mut i = 0;
    while s.len() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[(mix(seed, i) % WORDS.len() as u64) as usize]);
        i += 1;
    }
    s.truncate(len);
    s
}

/// Generates a session log, whole turns at a time, in seq order:
///
/// `turn/start`, `user/message`, then 1-4 steps of `step/start`, 4-12
/// `assistant/chunk`, `assistant/message` (citing its chunks; on every step
/// but the last it requests a tool call, answered by `tool/call` +
/// `tool/result`), `step/end`; then `turn/end`. About 60% of the events are
/// chunks.
struct Gen {
    seq: u64,
    turn: u64,
    pending: std::collections::VecDeque<OwnedEvent>,
}

impl Gen {
    fn new() -> Self {
        Gen {
            seq: 0,
            turn: 0,
            pending: Default::default(),
        }
    }

    fn push(
        &mut self,
        kind: &str,
        data: &str,
        op: Option<SurfaceOp>,
        src: Option<Vec<u64>>,
    ) -> u64 {
        let seq = self.seq;
        // ~30 ms apart: a turn spans a few seconds.
        let mut e = OwnedEvent::new(kind, seq, T0 + 30 * seq as i64, data).expect("valid JSON");
        e.surface_op = op;
        e.source_event_seqs = src;
        self.pending.push_back(e);
        self.seq += 1;
        seq
    }

    fn turn(&mut self) {
        self.turn += 1;
        let t = self.turn;
        self.push("turn/start", &format!(r#"{{"turn":{t}}}"#), None, None);
        let ask = text(mix(t, 1), 120);
        self.push(
            "user/message",
            &format!(
                r#"{{"turn":{t},"message":{{"id":"u-{t}","role":"user","content":[{{"type":"text","text":"{ask}"}}],"source":{{"kind":"user"}}}}}}"#
            ),
            Some(SurfaceOp::Append),
            None,
        );
        let steps = 1 + mix(t, 2) % 4;
        for s in 1..=steps {
            self.push(
                "step/start",
                &format!(r#"{{"turn":{t},"step":{s}}}"#),
                None,
                None,
            );
            let chunks = 4 + mix(t, 10 + s) % 9;
            let mut cited = Vec::with_capacity(chunks as usize);
            let mut answer = String::new();
            for c in 0..chunks {
                let delta = text(mix(t, 100 * s + c), 78);
                answer.push_str(&delta);
                cited.push(self.push(
                    "assistant/chunk",
                    &format!(
                        r#"{{"turn":{t},"step":{s},"chunk":{{"type":"text-delta","index":0,"text":"{delta}"}}}}"#
                    ),
                    None,
                    None,
                ));
            }
            let call = (s < steps).then(|| format!("call-{t}-{s}"));
            let mut content = format!(r#"[{{"type":"text","text":"{answer}"}}"#);
            if let Some(id) = &call {
                let _ = write!(
                    content,
                    r#",{{"type":"tool-call","id":"{id}","name":"read_file","arguments":"{{\"path\":\"src/store.rs\"}}"}}"#
                );
            }
            content.push(']');
            self.push(
                "assistant/message",
                &format!(
                    r#"{{"turn":{t},"step":{s},"message":{{"id":"a-{t}-{s}","role":"assistant","content":{content},"source":{{"kind":"model","provider":"p","model":"m"}}}},"usage":{{"inputTokens":1200,"outputTokens":80}}}}"#
                ),
                Some(SurfaceOp::Append),
                Some(cited),
            );
            if let Some(id) = call {
                let call_seq = self.push(
                    "tool/call",
                    &format!(
                        r#"{{"turn":{t},"step":{s},"callId":"{id}","name":"read_file","input":{{"path":"src/store.rs"}}}}"#
                    ),
                    None,
                    None,
                );
                let output = text(mix(t, 1000 + s), 300);
                self.push(
                    "tool/result",
                    &format!(
                        r#"{{"turn":{t},"step":{s},"message":{{"id":"r-{t}-{s}","role":"user","source":{{"kind":"tool","callId":"{id}"}},"content":[{{"type":"tool-result","toolCallId":"{id}","content":[{{"type":"text","text":"{output}"}}],"isError":false}}]}},"meta":{{"durationMs":12}}}}"#
                    ),
                    Some(SurfaceOp::Append),
                    Some(vec![call_seq]),
                );
            }
            self.push(
                "step/end",
                &format!(r#"{{"turn":{t},"step":{s}}}"#),
                None,
                None,
            );
        }
        self.push(
            "turn/end",
            &format!(r#"{{"turn":{t},"reason":{{"kind":"completed"}}}}"#),
            None,
            None,
        );
    }

    /// The next batch of up to `BATCH` events; after `n` events, only the
    /// rest of the current turn (so every turn is closed). Empty at the end.
    fn batch(&mut self, n: u64) -> Vec<OwnedEvent> {
        while self.pending.len() < BATCH && self.seq < n {
            self.turn();
        }
        let k = self.pending.len().min(BATCH);
        self.pending.drain(..k).collect()
    }
}

/// A built store: one session, its checkpoint fresh.
struct Fixture {
    dir: PathBuf,
    events: u64,
    checkpoint: PathBuf,
}

/// Builds the store of a session of (about) `n` events in `root/{n}`, and
/// checks once how each reopen path recovers.
fn build(root: &Path, n: u64) -> Fixture {
    let dir = root.join(n.to_string());
    let started = Instant::now();
    let mut g = Gen::new();
    let (mut events, mut chunks, mut surface) = (0u64, 0u64, 0u64);
    let (mut chunk_bytes, mut jsonl_bytes) = (0usize, 0usize);
    let checkpoint = build_store(&dir, 0, |store| {
        loop {
            let batch = g.batch(n);
            if batch.is_empty() {
                break;
            }
            events += batch.len() as u64;
            chunks += batch.iter().filter(|e| e.kind == "assistant/chunk").count() as u64;
            surface += batch.iter().filter(|e| e.surface_op.is_some()).count() as u64;
            for e in &batch {
                jsonl_bytes += e.to_json().len() + 1;
                if e.kind == "assistant/chunk" {
                    chunk_bytes += e.data.get().len();
                }
            }
            store.append(ID, &batch).expect("append a valid batch");
        }
    });
    let built = started.elapsed();

    let session_dir = session_dir(&dir);
    let ckpt_bytes = std::fs::metadata(&checkpoint)
        .expect("close wrote the checkpoint")
        .len();
    let log_bytes: u64 = std::fs::read_dir(&session_dir)
        .expect("session dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != CHECKPOINT_FILE)
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    eprintln!(
        "reopen: built {events} events ({:.1}% chunks of {} B data on average, \
         {surface} surface nodes, {:.1} MiB as JSONL) in {:.2?}: segment files {:.1} MiB \
         (with preallocation), checkpoint {:.1} KiB",
        100.0 * chunks as f64 / events as f64,
        chunk_bytes / chunks.max(1) as usize,
        jsonl_bytes as f64 / (1 << 20) as f64,
        built,
        log_bytes as f64 / (1 << 20) as f64,
        ckpt_bytes as f64 / 1024.0,
    );

    // The checkpoint path: used, nothing replayed.
    let store = Store::open(&dir, options(Durability::None)).expect("reopen");
    assert!(store.read_from(ID, u64::MAX).expect("load").is_empty());
    let rec = store.recovery(ID).expect("loaded");
    assert!(rec.used_checkpoint, "fresh checkpoint not used: {rec:?}");
    assert_eq!(rec.replayed, 0, "{rec:?}");
    assert_eq!(rec.closers, 0, "every turn is closed: {rec:?}");
    assert_eq!(store.surface(ID).expect("surface").len() as u64, surface);
    drop(store);

    // The rebuild path: no checkpoint, the whole log replayed; dropping the
    // store without close leaves the checkpoint deleted.
    let bytes = std::fs::read(&checkpoint).expect("checkpoint");
    std::fs::remove_file(&checkpoint).expect("delete the checkpoint");
    let store = Store::open(&dir, options(Durability::None)).expect("reopen");
    assert!(store.read_from(ID, u64::MAX).expect("load").is_empty());
    let rec = store.recovery(ID).expect("loaded");
    assert!(!rec.used_checkpoint, "{rec:?}");
    assert_eq!(rec.replayed, events, "{rec:?}");
    drop(store);
    assert!(!checkpoint.exists(), "a dropped store wrote a checkpoint");
    std::fs::write(&checkpoint, bytes).expect("restore the checkpoint");

    Fixture {
        dir,
        events,
        checkpoint,
    }
}

fn bench(c: &mut Criterion) {
    let root = tempfile::Builder::new()
        .prefix("sessionlog-bench-reopen-")
        .tempdir()
        .expect("temporary directory");
    eprintln!("reopen: stores in {}", root.path().display());
    let mut g = c.benchmark_group("reopen");
    for n in sizes() {
        let fixture: OnceCell<Fixture> = OnceCell::new();
        let get = || fixture.get_or_init(|| build(root.path(), n));
        g.sample_size(if n >= 100_000 { 10 } else { 50 });
        g.bench_function(BenchmarkId::new("checkpoint", n), |b| {
            let f = get();
            assert!(f.checkpoint.exists());
            b.iter(|| reopen_once(&f.dir))
        });
        g.bench_function(BenchmarkId::new("rebuild", n), |b| {
            let f = get();
            b.iter_batched(
                || delete_checkpoint(&f.checkpoint),
                |()| reopen_once(&f.dir),
                BatchSize::PerIteration,
            );
            // Leave the store as built: a fresh checkpoint.
            let store = Store::open(&f.dir, options(Durability::None)).expect("reopen");
            assert!(store.read_from(ID, u64::MAX).expect("load").is_empty());
            assert_eq!(store.recovery(ID).expect("loaded").replayed, f.events);
            store.close().expect("close writes the checkpoint");
        });
    }
    g.finish();
}

fn config() -> Criterion {
    common::config(if smoke() { (0.2, 0.5) } else { (1.0, 5.0) })
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
