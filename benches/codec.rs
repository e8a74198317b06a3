//! Batch codec benchmarks: the encoder on the project's realistic session
//! generator ([`Sample`]: about 60% streamed `assistant/chunk` events of
//! ~150 B, request headers, messages, tool calls and results of a few KiB),
//! cut into append batches of 256 and 4096 events.
//!
//! Run with `cargo bench --bench codec`. `SESSIONLOG_BENCH_SMOKE=1` shrinks
//! the workload (1k events instead of 64k) and the measurement, so CI can run
//! it quickly; `cargo bench --bench codec -- --test` runs each benchmark once.
//!
//! Throughput is in bytes of event `data` (the JSON payloads) encoded per
//! second; the events and bytes of the workload, and the encoded bytes for
//! each form and batch size, are printed before the measurements, so events/s
//! is events / time.
//!
//! Groups:
//! - `encode/store/{batch}`: `encode_batch_with` with the store's options
//!   (data packed into one Zstandard frame per batch, message events
//!   verbatim).
//! - `encode/default/{batch}`: `encode_batch_with` with the default options
//!   (every data field may be packed).
//! - `index/{decode,indexed}/{batch}`: what the store needs after writing a
//!   batch, the byte range of every verbatim data field: `encode_batch_with`
//!   then `decode_batch` and the data pointers (the old way), against
//!   `encode_batch_indexed` alone.
//! - `validate/check_finite_numbers`: the finite-number check every event
//!   built in code passes at append (and JSON input at parse), over every
//!   event's `data`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sessionlog::codec::{self, EncodeOptions};
use sessionlog::event::{OwnedEvent, SurfaceOp};
use sessionlog::sample::{Sample, SampleConfig};
use std::hint::black_box;
use std::ops::Range;
use std::time::Duration;

fn smoke() -> bool {
    std::env::var("SESSIONLOG_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

/// What `Store::write_batch` passes.
const STORE: EncodeOptions = EncodeOptions {
    compress: true,
    verbatim_surface: true,
};

const BATCHES: [usize; 2] = [256, 4096];

/// `n` events with contiguous seqs: generated sessions (seeds 1, 2, ...)
/// concatenated, their seqs (and the seqs they cite) re-based.
fn workload(n: usize) -> Vec<OwnedEvent> {
    let mut out: Vec<OwnedEvent> = Vec::with_capacity(n);
    let mut seed = 1;
    while out.len() < n {
        let (_, events) = Sample::new(SampleConfig {
            seed,
            ..SampleConfig::default()
        })
        .session("bench");
        seed += 1;
        let offset = out.len() as u64;
        out.extend(events.into_iter().map(|mut e| {
            e.seq += offset;
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
    out.truncate(n);
    out
}

fn encode_all(events: &[OwnedEvent], batch: usize, options: EncodeOptions, out: &mut Vec<u8>) {
    out.clear();
    for chunk in events.chunks(batch) {
        codec::encode_batch_with(chunk, 0, options, out).expect("contiguous seqs");
    }
}

/// The byte ranges of the verbatim data fields of one encoded batch, the way
/// the store found them before `encode_batch_indexed`: decode it again.
fn ranges_by_decoding(bytes: &[u8], chunk: &[OwnedEvent], ranges: &mut Vec<Option<Range<usize>>>) {
    ranges.clear();
    let events = codec::decode_batch(bytes, chunk[0].seq, chunk.len() as u32, 0).expect("valid");
    let base = bytes.as_ptr() as usize;
    ranges.extend(events.iter().map(|e| {
        e.data.is_borrowed().then(|| {
            let start = e.data.get().as_ptr() as usize - base;
            start..start + e.data.get().len()
        })
    }));
}

fn bench(c: &mut Criterion) {
    let n = if smoke() { 1024 } else { 65_536 };
    let events = workload(n);
    let data_bytes: usize = events.iter().map(|e| e.data.get().len()).sum();
    let jsonl: usize = events.iter().map(|e| e.to_json().len() + 1).sum();
    println!(
        "codec workload: {} events, {data_bytes} B of data ({:.1} B/event), {jsonl} B as JSONL",
        events.len(),
        data_bytes as f64 / events.len() as f64
    );
    let mut out = Vec::new();
    for (name, options) in [("store", STORE), ("default", EncodeOptions::default())] {
        for batch in BATCHES {
            encode_all(&events, batch, options, &mut out);
            println!(
                "  {name:<7} batch {batch:>4}: {:>9} B encoded ({:.4} of data, {:.4} of JSONL)",
                out.len(),
                out.len() as f64 / data_bytes as f64,
                out.len() as f64 / jsonl as f64,
            );
        }
    }

    let mut g = c.benchmark_group("encode");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(data_bytes as u64));
    for (name, options) in [("store", STORE), ("default", EncodeOptions::default())] {
        for batch in BATCHES {
            g.bench_function(BenchmarkId::new(name, batch), |b| {
                b.iter(|| {
                    encode_all(&events, batch, options, &mut out);
                    black_box(out.len())
                })
            });
        }
    }
    g.finish();

    let mut g = c.benchmark_group("index");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(data_bytes as u64));
    let mut ranges = Vec::new();
    for batch in BATCHES {
        g.bench_function(BenchmarkId::new("decode", batch), |b| {
            b.iter(|| {
                let mut total = 0;
                for chunk in events.chunks(batch) {
                    out.clear();
                    codec::encode_batch_with(chunk, 0, STORE, &mut out).expect("valid");
                    ranges_by_decoding(&out, chunk, &mut ranges);
                    total += ranges.len();
                }
                black_box(total)
            })
        });
        g.bench_function(BenchmarkId::new("indexed", batch), |b| {
            b.iter(|| {
                let mut total = 0;
                for chunk in events.chunks(batch) {
                    out.clear();
                    codec::encode_batch_indexed(chunk, 0, STORE, &mut out, &mut ranges)
                        .expect("valid");
                    total += ranges.len();
                }
                black_box(total)
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("validate");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(data_bytes as u64));
    g.bench_function("check_finite_numbers", |b| {
        b.iter(|| {
            let ok = events
                .iter()
                .filter(|e| sessionlog::json::check_finite_numbers(e.data.get()).is_ok())
                .count();
            black_box(ok)
        })
    });
    g.finish();
}

fn config() -> Criterion {
    let (warm, measure) = if smoke() { (0.1, 0.2) } else { (1.0, 4.0) };
    Criterion::default()
        .warm_up_time(Duration::from_secs_f64(warm))
        .measurement_time(Duration::from_secs_f64(measure))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
