//! Surface benchmarks (issue 2): fold throughput, replace cost against the
//! surface size, and derive from a warm cache.
//!
//! Run with `cargo bench --bench surface`. `SESSIONLOG_BENCH_SMOKE=1` shrinks
//! every size 100x and shortens the measurement, so CI can run it quickly;
//! `cargo bench --bench surface -- --test` runs each benchmark once.
//!
//! Every log is built once, outside the timed loops. Targets (see
//! BENCHMARKS.md): >= 20 M non-surface events/s and >= 5 M surface
//! events/s folded; a single-node replace flat across surface sizes (within
//! 2x from 1k to 1M nodes).

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sessionlog::derive::{self, DeriveCache};
use sessionlog::event::{OwnedEvent, SurfaceOp};
use sessionlog::session::SessionState;
use sessionlog::surface::Surface;
use std::hint::black_box;
use std::time::{Duration, Instant};

const T0: i64 = 1_786_000_000_000;

fn smoke() -> bool {
    std::env::var("SESSIONLOG_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

/// `full`, or `full / 100` in smoke mode.
fn size(full: usize) -> usize {
    if smoke() { (full / 100).max(1) } else { full }
}

fn event(
    kind: &str,
    seq: u64,
    data: &str,
    op: Option<SurfaceOp>,
    src: Option<Vec<u64>>,
) -> OwnedEvent {
    let mut e = OwnedEvent::new(kind, seq, T0 + seq as i64 / 16, data).expect("bench data is JSON");
    e.surface_op = op;
    e.source_event_seqs = src;
    e
}

fn chunk(seq: u64) -> OwnedEvent {
    let data = format!(
        r#"{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":"tok{}"}}}}"#,
        seq % 97
    );
    event("assistant/chunk", seq, &data, None, None)
}

fn user(seq: u64) -> OwnedEvent {
    let data = format!(
        r#"{{"role":"user","id":"u{seq}","content":[{{"type":"text","text":"message {seq}: please look at src/surface.rs"}}],"source":{{"kind":"user"}}}}"#
    );
    event("user/message", seq, &data, Some(SurfaceOp::Append), None)
}

fn assistant(seq: u64, nested: bool) -> OwnedEvent {
    let content = format!(
        r#"[{{"type":"reasoning","text":"thinking about {seq}"}},{{"type":"text","text":"Here is the answer to {seq}."}},{{"type":"tool-call","id":"call_{seq}","name":"read_file","arguments":"{{\"path\":\"src/{seq}.rs\"}}"}}]"#
    );
    let data = if nested {
        format!(
            r#"{{"turn":1,"step":1,"message":{{"role":"assistant","content":{content},"source":{{"kind":"model","provider":"p","model":"m"}},"id":"a{seq}"}},"usage":{{"inputTokens":1200,"outputTokens":80}}}}"#
        )
    } else {
        format!(
            r#"{{"turn":1,"step":1,"content":{content},"provenance":{{"provider":"p","model":"m"}},"usage":{{"inputTokens":1200,"outputTokens":80}}}}"#
        )
    };
    event(
        "assistant/message",
        seq,
        &data,
        Some(SurfaceOp::Append),
        Some(vec![]),
    )
}

fn tool_result_data(seq: u64, nested: bool, output: &str) -> String {
    if nested {
        format!(
            r#"{{"turn":1,"step":1,"message":{{"id":"t{seq}","role":"user","source":{{"kind":"tool","callId":"call_{seq}"}},"content":[{{"type":"tool-result","toolCallId":"call_{seq}","content":[{{"type":"text","text":"{output}"}}],"isError":false}}]}},"meta":{{"durationMs":12}}}}"#
        )
    } else {
        format!(
            r#"{{"turn":1,"step":1,"callId":"call_{seq}","content":[{{"type":"text","text":"{output}"}}],"isError":false}}"#
        )
    }
}

fn tool_result(seq: u64, nested: bool) -> OwnedEvent {
    let output = format!(
        "fn main() {{ println!(\\\"{seq}\\\"); }} // a few hundred bytes of tool output {}",
        "x".repeat(200)
    );
    event(
        "tool/result",
        seq,
        &tool_result_data(seq, nested, &output),
        Some(SurfaceOp::Append),
        None,
    )
}

fn fold_log(log: &Vec<OwnedEvent>) -> Surface {
    let mut s = Surface::new();
    for e in log {
        s.fold(e, log).expect("bench log is valid");
    }
    s
}

/// Builds the event with a given seq.
type MakeEvent = fn(u64) -> OwnedEvent;

/// (a) Fold throughput over a 1M-event log, per event kind.
fn fold(c: &mut Criterion) {
    let n = size(1_000_000);
    let groups: [(&str, MakeEvent); 2] = [("fold/non-surface", chunk), ("fold/surface", user)];
    for (name, make) in groups {
        let log: Vec<OwnedEvent> = (0..n as u64).map(make).collect();
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(n as u64));
        g.sample_size(10);
        g.bench_function("Surface::fold", |b| {
            b.iter_batched(
                Surface::new,
                |mut s| {
                    for e in &log {
                        s.fold(e, &log).expect("valid");
                    }
                    s
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function("SessionState::append", |b| {
            b.iter_batched(
                || SessionState::new(false),
                |mut st| {
                    for e in &log {
                        st.append(e, &log).expect("valid");
                    }
                    st
                },
                BatchSize::PerIteration,
            )
        });
        g.bench_function("SessionState::append_batch/1000", |b| {
            b.iter_batched(
                || SessionState::new(false),
                |mut st| {
                    for batch in log.chunks(1000) {
                        st.append_batch(batch, &log).expect("valid");
                    }
                    st
                },
                BatchSize::PerIteration,
            )
        });
        g.finish();
    }
}

/// (b) `check` + `apply` + `undo` of a single-node replace in the middle of
/// a prebuilt surface of `n` nodes: a user/message (compaction of one node)
/// and a tool/result prune (which also runs the rewrite rule).
fn replace(c: &mut Criterion) {
    let mut g = c.benchmark_group("replace");
    for full in [1_000, 100_000, 1_000_000] {
        let n = size(full) as u64;
        let mid = n / 2;
        let log: Vec<OwnedEvent> = (0..n)
            .map(|s| {
                if s == mid {
                    tool_result(s, true)
                } else {
                    user(s)
                }
            })
            .collect();
        let surface = fold_log(&log);
        assert_eq!(surface.len() as u64, n);
        let compaction = event(
            "user/message",
            n,
            r#"{"role":"user","content":[{"type":"text","text":"<compacted-summary>...</compacted-summary>"}],"source":{"kind":"plugin","plugin":"compact"}}"#,
            Some(SurfaceOp::Replace {
                start: mid,
                end: mid,
            }),
            Some(vec![mid]),
        );
        let prune = event(
            "tool/result",
            n,
            &tool_result_data(mid, true, "[output pruned]"),
            Some(SurfaceOp::Replace {
                start: mid,
                end: mid,
            }),
            Some(vec![mid]),
        );
        for (name, rep) in [("user-message", &compaction), ("tool-result-prune", &prune)] {
            // Sanity: the replace is accepted and the undo restores the surface.
            let mut s = surface.clone();
            let plan = s.check(rep, &log).expect("replace is valid");
            let u = s.apply(rep, plan);
            assert_eq!(s.replace_generation(), 1);
            s.undo(u);
            assert!(s == surface);
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    let plan = s.check(black_box(rep), &log).expect("valid");
                    let u = s.apply(rep, plan);
                    s.undo(u);
                })
            });
        }
    }
    g.finish();
}

/// The derive log: nested and flat assistant messages and tool results,
/// and user messages, in turn.
fn mixed(seq: u64) -> OwnedEvent {
    match seq % 5 {
        0 => user(seq),
        1 => assistant(seq, true),
        2 => tool_result(seq, true),
        3 => assistant(seq, false),
        _ => tool_result(seq, false),
    }
}

/// (c) Derive of 10k messages from a warm cache, and the cache update after
/// one appended node (and, for contrast, after a replace: a full rebuild).
fn derive(c: &mut Criterion) {
    let n = size(10_000) as u64;
    let log: Vec<OwnedEvent> = (0..n).map(mixed).collect();
    let surface = fold_log(&log);
    let mut cache = DeriveCache::default();
    cache.update(&surface, &log).expect("cache covers the log");
    assert_eq!(cache.len() as u64, n);

    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut g = c.benchmark_group("derive");
    g.throughput(Throughput::Elements(n));
    g.bench_function(BenchmarkId::new("warm-cache/messages+write_json", n), |b| {
        b.iter(|| {
            buf.clear();
            for m in cache.messages(&log) {
                m.expect("present").write_json(&mut buf);
                buf.push(b'\n');
            }
            black_box(buf.len())
        })
    });
    g.bench_function(BenchmarkId::new("from-scratch/derive+write_json", n), |b| {
        b.iter(|| {
            buf.clear();
            for m in derive::derive(&surface, &log).expect("present") {
                m.write_json(&mut buf);
                buf.push(b'\n');
            }
            black_box(buf.len())
        })
    });
    g.finish();

    let mut g = c.benchmark_group("derive/update");
    // One appended node: the surface grows by one node (untimed), then the
    // cache update is timed. `DeriveCache::clone` leaves no spare capacity,
    // so after each reset one untimed append takes the Vec growth that a
    // cache grown by `update` would have amortised; then `k` appends follow
    // without reallocation.
    let k = (n / 2).max(1);
    let mut grown = log.clone();
    grown.extend((n..n + k).map(mixed));
    let mut surface_k = surface.clone();
    let mut cache_k = cache.clone();
    let mut next = grown.len();
    g.bench_function(BenchmarkId::new("append-1-node", n), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if next == grown.len() {
                    surface_k = surface.clone();
                    cache_k = cache.clone();
                    next = n as usize;
                    surface_k.fold(&grown[next], &grown).expect("valid");
                    cache_k.update(&surface_k, &grown).expect("present");
                    next += 1;
                }
                surface_k.fold(&grown[next], &grown).expect("valid");
                let start = Instant::now();
                cache_k
                    .update(black_box(&surface_k), &grown)
                    .expect("present");
                total += start.elapsed();
                next += 1;
            }
            total
        })
    });
    assert_eq!(cache_k.len(), surface_k.len());

    // After a replace the cache is rebuilt from scratch.
    let mut replaced = log.clone();
    replaced.push(event(
        "user/message",
        n,
        r#"{"role":"user","content":[{"type":"text","text":"summary"}],"source":{"kind":"plugin"}}"#,
        Some(SurfaceOp::Replace { start: n / 2, end: n / 2 }),
        Some(vec![n / 2]),
    ));
    let mut s2 = surface.clone();
    s2.fold(&replaced[n as usize], &replaced).expect("valid");
    g.bench_function(BenchmarkId::new("after-replace-rebuild", n), |b| {
        b.iter_batched(
            || cache.clone(),
            |mut c| {
                c.update(&s2, &replaced).expect("present");
                c
            },
            BatchSize::NumIterations(16),
        )
    });
    g.finish();
}

fn config() -> Criterion {
    let (warm, measure) = if smoke() { (0.2, 0.5) } else { (1.0, 3.0) };
    Criterion::default()
        .warm_up_time(Duration::from_secs_f64(warm))
        .measurement_time(Duration::from_secs_f64(measure))
}

criterion_group! {
    name = benches;
    config = config();
    targets = fold, replace, derive
}
criterion_main!(benches);
