//! Loading or rebuilding one session must not stall appends to another.
//!
//! A store holds a big session (1M events; 20k with
//! `SESSIONLOG_BENCH_SMOKE=1`) whose checkpoint is deleted, so its first
//! load folds the whole log. One thread appends one-event batches to a small
//! session with `Durability::Sync` and records each append's latency: first
//! alone (baseline), then while other threads rebuild the big session again
//! and again (a new handle each time, so each load is a full rebuild).
//! Before the engine split, loading held the store-wide session map lock
//! through the replay, so every append waited for the rebuild.
//!
//! Prints p50/p99/max of each phase (alone; while other handles in the
//! appender's process rebuild the big session; while another process
//! does; while a thread does and a third thread derives it in the
//! appender's own handle; alone again) and the number of rebuilds, side by
//! side in one run. Run with `cargo bench --bench isolation`.
//!
//! Long phases run one after the other, so the machine's own drift (other
//! tenants of a shared host) lands between them. The second part
//! interleaves: rounds of short windows, alone / rebuilt in another thread /
//! rebuilt in another process, in a rotating order, the rebuilders paused
//! (a flag; `SIGSTOP`) outside their windows and each window's first part
//! not measured (a rebuild in flight finishes). It prints each condition's
//! p99 over all its windows, its ratio to "alone" with a 95% bootstrap
//! interval (windows resampled), and the same for the "alone" windows of
//! odd rounds against those of even rounds: the noise floor.

mod common;

use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::store::{Durability, Options, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn event(seq: u64) -> OwnedEvent {
    Event::from_json(&format!(
        r#"{{"type":"session/title","seq":{seq},"time":{seq},"data":{{"title":"t{seq}"}}}}"#
    ))
    .expect("valid event")
    .into_owned()
}

/// Set in the child process that rebuilds the big session (the store's
/// directory): it rebuilds until killed, printing a line per rebuild.
const REBUILDER_ENV: &str = "SESSIONLOG_ISOLATION_REBUILD";

/// Where the big session is rebuilt meanwhile.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rebuild {
    Nowhere,
    /// In another thread of the appender's process (new handles each time).
    Thread,
    /// In another process.
    Process,
}

fn rebuild_forever(dir: &std::path::Path) {
    use std::io::Write;
    loop {
        let reader = Store::open_read_only(dir).expect("open reader");
        reader.next_seq("big").expect("rebuild big");
        drop(reader);
        let mut out = std::io::stdout().lock();
        if writeln!(out, "rebuilt").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

fn main() {
    if let Some(dir) = std::env::var_os(REBUILDER_ENV) {
        rebuild_forever(std::path::Path::new(&dir));
        return;
    }
    let smoke = common::smoke();
    let big_events = if smoke { 20_000 } else { 1_000_000 };
    let phase = if smoke {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(4)
    };
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path().join("store");
    // The big session, written in batches of 256, then its checkpoint gone.
    {
        let store = Store::open(&dir, common::options(Durability::None)).expect("open");
        // A generated agent session: about 36 events a turn.
        let (header, events) = Sample::new(SampleConfig {
            turns: (big_events / 36).max(1) as usize,
            ..SampleConfig::default()
        })
        .session("big");
        store.create(header).expect("create big");
        for b in events.chunks(256) {
            store.append("big", b).expect("append big");
        }
        store
            .create(SessionHeader::new("small", 0))
            .expect("create small");
        store.append("small", &[event(0)]).expect("append small");
        store.close().expect("close");
    }
    let big_len = Store::open_read_only(&dir)
        .and_then(|s| s.next_seq("big"))
        .expect("big session");
    let checkpoint = dir
        .join("sessions/big")
        .join(sessionlog::checkpoint::CHECKPOINT_FILE);
    common::delete_checkpoint(&checkpoint);

    let store = Store::open(
        &dir,
        Options {
            durability: Durability::Sync,
            ..Options::default()
        },
    )
    .expect("open");
    let next = Arc::new(AtomicU64::new(store.next_seq("small").expect("small")));
    // `other`: rebuild the big session again and again in other handles;
    // `own`: derive it in the appender's own handle meanwhile.
    let run = |other: Rebuild, own: bool| -> (Vec<Duration>, u64) {
        let stop = Arc::new(AtomicBool::new(false));
        let rebuilds = Arc::new(AtomicU64::new(0));
        let rebuilder = (other == Rebuild::Thread).then(|| {
            let (dir, stop, rebuilds) = (dir.clone(), stop.clone(), rebuilds.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // A new handle: its first load of "big" folds the log.
                    let reader = Store::open_read_only(&dir).expect("open reader");
                    reader.next_seq("big").expect("rebuild big");
                    rebuilds.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        let child = (other == Rebuild::Process).then(|| {
            std::process::Command::new(std::env::current_exe().expect("this bench"))
                .env(REBUILDER_ENV, &dir)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start the rebuilding process")
        });
        // Rebuilds also in the writer's own handle: its map must not be
        // held while a session loads.
        let own = own.then(|| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = store.derive("big");
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        });
        let started = Instant::now();
        let mut lat = Vec::new();
        while started.elapsed() < phase {
            let seq = next.fetch_add(1, Ordering::Relaxed);
            let t = Instant::now();
            store.append("small", &[event(seq)]).expect("append small");
            lat.push(t.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
        for t in [rebuilder, own].into_iter().flatten() {
            t.join().expect("join");
        }
        if let Some(mut child) = child {
            use std::io::Read;
            child.kill().expect("stop the rebuilding process");
            let mut lines = String::new();
            let mut stdout = child.stdout.take().expect("piped");
            stdout.read_to_string(&mut lines).expect("its output");
            let _ = child.wait();
            rebuilds.fetch_add(lines.lines().count() as u64, Ordering::Relaxed);
        }
        lat.sort();
        (lat, rebuilds.load(Ordering::Relaxed))
    };
    let interleaved = interleave(&dir, &store, &next, smoke);
    let (alone, _) = run(Rebuild::Nowhere, false);
    let (rebuilt, rebuilds) = run(Rebuild::Thread, false);
    let (elsewhere, rebuilds_elsewhere) = run(Rebuild::Process, false);
    let (both, rebuilds_both) = run(Rebuild::Thread, true);
    let (again, _) = run(Rebuild::Nowhere, false);
    let row = |name: &str, l: &[Duration]| {
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.0} |",
            l.len(),
            percentile(l, 0.5).as_secs_f64() * 1e6,
            percentile(l, 0.99).as_secs_f64() * 1e6,
            l.last().expect("one append").as_secs_f64() * 1e6
        )
    };
    println!(
        "isolation: Sync appends of one event to a small session; big session {big_len} events, rebuilt {rebuilds}, {rebuilds_elsewhere} and {rebuilds_both} times in the second, third and fourth phases"
    );
    println!("| phase | appends | p50 us | p99 us | max us |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    row("alone", &alone);
    row(
        "while another session is rebuilt (another thread)",
        &rebuilt,
    );
    row(
        "while another session is rebuilt (another process)",
        &elsewhere,
    );
    row(
        "rebuilt (another thread) and derived in the appender's handle",
        &both,
    );
    row("alone again", &again);
    interleaved.print();
}

/// The latencies of each measured window of one condition.
type Windows = Vec<Vec<Duration>>;

/// What the interleaved part measured.
struct Interleaved {
    alone: Windows,
    thread: Windows,
    process: Windows,
    rebuilds: u64,
}

/// Rounds of three windows (alone, rebuilt in a thread, rebuilt in
/// another process) in a rotating order.
fn interleave(dir: &std::path::Path, store: &Store, next: &AtomicU64, smoke: bool) -> Interleaved {
    let (rounds, settle, measure) = if smoke {
        (2, Duration::from_millis(50), Duration::from_millis(100))
    } else {
        (
            std::env::var("SESSIONLOG_ISOLATION_ROUNDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(16),
            Duration::from_millis(600),
            Duration::from_millis(1400),
        )
    };
    let active = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let rebuilds = Arc::new(AtomicU64::new(0));
    let thread = {
        let (dir, active, stop, rebuilds) = (
            dir.to_owned(),
            active.clone(),
            stop.clone(),
            rebuilds.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if !active.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                let reader = Store::open_read_only(&dir).expect("open reader");
                reader.next_seq("big").expect("rebuild big");
                rebuilds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut child = std::process::Command::new(std::env::current_exe().expect("this bench"))
        .env(REBUILDER_ENV, dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the rebuilding process");
    let pid = child.id() as libc::pid_t;
    let signal = |sig| {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "signal the rebuilding process");
    };
    signal(libc::SIGSTOP);
    let mut out = Interleaved {
        alone: Vec::new(),
        thread: Vec::new(),
        process: Vec::new(),
        rebuilds: 0,
    };
    let order = [Rebuild::Nowhere, Rebuild::Thread, Rebuild::Process];
    for round in 0..rounds {
        for k in 0..order.len() {
            let cond = order[(round + k) % order.len()];
            active.store(cond == Rebuild::Thread, Ordering::Relaxed);
            if cond == Rebuild::Process {
                signal(libc::SIGCONT);
            }
            let mut lat = Vec::new();
            let started = Instant::now();
            while started.elapsed() < settle + measure {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                store.append("small", &[event(seq)]).expect("append small");
                if started.elapsed() >= settle {
                    lat.push(t.elapsed());
                }
            }
            if cond == Rebuild::Process {
                signal(libc::SIGSTOP);
            }
            lat.sort();
            match cond {
                Rebuild::Nowhere => out.alone.push(lat),
                Rebuild::Thread => out.thread.push(lat),
                Rebuild::Process => out.process.push(lat),
            }
        }
    }
    active.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    thread.join().expect("join the rebuilder");
    signal(libc::SIGCONT);
    child.kill().expect("stop the rebuilding process");
    let mut lines = String::new();
    let mut stdout = child.stdout.take().expect("piped");
    std::io::Read::read_to_string(&mut stdout, &mut lines).expect("its output");
    let _ = child.wait();
    out.rebuilds = rebuilds.load(Ordering::Relaxed) + lines.lines().count() as u64;
    out
}

/// p99 of all the latencies of `windows`.
fn pooled_p99(windows: &[&Vec<Duration>]) -> Duration {
    let mut all: Vec<Duration> = windows.iter().flat_map(|w| w.iter().copied()).collect();
    all.sort();
    percentile(&all, 0.99)
}

/// The ratio of `a`'s pooled p99 to `b`'s, and a 95% bootstrap interval of
/// it (the windows of each resampled with replacement; a fixed-seed
/// xorshift, so the same latencies always give the same interval).
fn ratio_with_interval(a: &[&Vec<Duration>], b: &[&Vec<Duration>]) -> (f64, f64, f64) {
    let ratio = |a: &[&Vec<Duration>], b: &[&Vec<Duration>]| {
        pooled_p99(a).as_secs_f64() / pooled_p99(b).as_secs_f64()
    };
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut pick = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let mut draws: Vec<f64> = (0..1000)
        .map(|_| {
            let ra: Vec<_> = (0..a.len()).map(|_| a[pick(a.len())]).collect();
            let rb: Vec<_> = (0..b.len()).map(|_| b[pick(b.len())]).collect();
            ratio(&ra, &rb)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    (ratio(a, b), draws[25], draws[974])
}

impl Interleaved {
    fn print(&self) {
        fn all(w: &Windows) -> Vec<&Vec<Duration>> {
            w.iter().collect()
        }
        let (alone, thread, process) = (all(&self.alone), all(&self.thread), all(&self.process));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let n = |w: &[&Vec<Duration>]| w.iter().map(|w| w.len()).sum::<usize>();
        println!(
            "interleaved: {} rounds of three windows (alone, rebuilt in a thread, rebuilt in another process) in a rotating order; {} rebuilds",
            self.alone.len(),
            self.rebuilds
        );
        println!("| condition | appends | p99 us (pooled) | p99 / alone | 95% interval |");
        println!("| --- | ---: | ---: | ---: | --- |");
        println!(
            "| alone | {} | {:.0} | 1.00 | |",
            n(&alone),
            us(pooled_p99(&alone))
        );
        for (name, w) in [
            ("rebuilt in another thread", &thread),
            ("rebuilt in another process", &process),
        ] {
            let (r, lo, hi) = ratio_with_interval(w, &alone);
            println!(
                "| {name} | {} | {:.0} | {r:.2} | {lo:.2}-{hi:.2} |",
                n(w),
                us(pooled_p99(w))
            );
        }
        // The noise floor: "alone" against "alone".
        let odd: Vec<_> = alone.iter().skip(1).step_by(2).copied().collect();
        let even: Vec<_> = alone.iter().step_by(2).copied().collect();
        if !odd.is_empty() {
            let (r, lo, hi) = ratio_with_interval(&odd, &even);
            println!(
                "| alone, odd rounds / even rounds (noise) | {} | {:.0} | {r:.2} | {lo:.2}-{hi:.2} |",
                n(&odd),
                us(pooled_p99(&odd))
            );
        }
    }
}
