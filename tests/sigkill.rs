//! A real-process crash test: a child process appends batches in a loop and
//! is killed with SIGKILL at pseudo-random moments; the parent then reopens
//! the store and checks every batch the child acknowledged.
//!
//! The test binary re-executes itself: with `SESSIONLOG_SIGKILL_CHILD` set,
//! the test `sigkill_child_appends_until_killed` is the child. Child number
//! `k` opens the store (`Durability::Sync`; odd ones with
//! `compress_sealed`), loads and verifies the session
//! of child `k - 1` (so recovery itself runs, and is killed, under load),
//! creates session `run-k` and appends the generated stream of child `k` in
//! batches of pseudo-random sizes. After each `append` returns it prints
//! `ACK run-k <last seq>` and flushes. Without the variable that test
//! returns at once.
//!
//! The parent reads the acknowledgements over the pipe, kills the child
//! after a pseudo-random delay (deterministic: a fixed seed), and starts the
//! next one: at least 50 kills, about 10-20 s in all. Then it reopens the
//! store and checks, per session: every acknowledged seq is present; the log
//! is the generated stream cut at a batch boundary (no partial batch),
//! followed by exactly the repair closers of that cut, and only if its last
//! turn was open; `verify` passes; the session accepts a new batch.

use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::session::SessionState;
use sessionlog::store::{Durability, Options, Store};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SESSIONLOG_SIGKILL_CHILD";
const CHILD_INDEX_ENV: &str = "SESSIONLOG_SIGKILL_INDEX";
const CHILD_TEST: &str = "sigkill_child_appends_until_killed";

/// Kills to reach, and the time budget (the test stops early at the budget,
/// and fails if it has fewer than `MIN_KILLS` by then).
const KILLS: usize = 60;
const MIN_KILLS: usize = 50;
const BUDGET: Duration = Duration::from_secs(20);

fn options() -> Options {
    Options {
        durability: Durability::Sync,
        // Small segments and frequent checkpoints: kills land in rollovers,
        // seals and checkpoint writes too.
        segment_size: 64 << 10,
        preallocate: 16 << 10,
        checkpoint_every: 48,
        ..Options::default()
    }
}

/// SplitMix64: the deterministic source of batch sizes and kill delays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn session_id(k: usize) -> String {
    format!("run-{k:03}")
}

/// Child `k`'s stream and its batch boundaries (cumulative event counts,
/// 0 first): the same in the child and in the parent.
fn plan(k: usize) -> (SessionHeader, Vec<OwnedEvent>, Vec<usize>) {
    let (header, events) = Sample::new(SampleConfig {
        turns: 150,
        seed: 1000 + k as u64,
        ..SampleConfig::default()
    })
    .session(&session_id(k));
    let mut rng = Rng(0x5eed_0000 + k as u64);
    let mut bounds = vec![0];
    let mut at = 0;
    while at < events.len() {
        at = (at + 1 + rng.below(12) as usize).min(events.len());
        bounds.push(at);
    }
    (header, events, bounds)
}

/// The closers a reopen appends after the first `n` events of `log`.
fn closers_after(log: &[OwnedEvent], n: usize) -> Vec<OwnedEvent> {
    let mut state = SessionState::new(false);
    state
        .append_batch(&log[..n], &Vec::<Event<'_>>::new())
        .expect("a prefix of the generated stream folds");
    state.closers()
}

/// The child: never returns while it has events to append (the parent
/// kills it); exits on its own after a minute as a safety net.
#[test]
fn sigkill_child_appends_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return; // not the child: nothing to do
    };
    let k: usize = std::env::var(CHILD_INDEX_ENV)
        .expect("child index")
        .parse()
        .expect("child index is a number");
    let started = Instant::now();
    let (header, events, bounds) = plan(k);
    // Every other child stores its sealed segments compressed, so kills
    // land in its background compression too (an image half written, or
    // renamed with the raw file still there).
    let opts = Options {
        compress_sealed: k % 2 == 1,
        ..options()
    };
    let store = Store::open(PathBuf::from(dir), opts).expect("child: open the store");
    if k > 0 {
        // Recovery of the previous child's session, killed or not.
        let prev = session_id(k - 1);
        if store.list().unwrap().iter().any(|h| h.id == prev) {
            store.load(&prev).expect("child: load the previous session");
            store
                .verify(&prev)
                .expect("child: verify the previous session");
        }
    }
    store.create(header).expect("child: create");
    let id = session_id(k);
    let stdout = std::io::stdout();
    for w in bounds.windows(2) {
        store
            .append(&id, &events[w[0]..w[1]])
            .expect("child: append");
        let mut out = stdout.lock();
        writeln!(out, "ACK {id} {}", w[1] - 1).expect("child: write the ack");
        out.flush().expect("child: flush the ack");
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    let mut out = stdout.lock();
    writeln!(out, "DONE {id}").expect("child: write");
    out.flush().expect("child: flush");
    // Wait to be killed (or give up after the safety net).
    while started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Child {
    acked: Option<u64>,
    acks: u64,
}

/// Runs child `k` and kills it after `delay`; returns its acknowledgements.
fn run_child(dir: &Path, k: usize, delay: Duration) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env(CHILD_INDEX_ENV, k.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(delay);
    // SIGKILL (Child::kill sends SIGKILL on Unix). An error means it has
    // already exited, which the status check below reports.
    let _ = child.kill();
    let status = child.wait().expect("wait for the child");
    reader.join().expect("pipe reader");
    let id = session_id(k);
    let mut acked = None;
    let mut acks = 0;
    let mut done = false;
    for line in rx.try_iter() {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next(), parts.next()) {
            (Some("ACK"), Some(s), Some(seq)) if s == id => {
                let seq: u64 = seq.parse().expect("acked seq");
                assert!(
                    acked.is_none_or(|a| seq > a),
                    "acks of {id} are not increasing"
                );
                acked = Some(seq);
                acks += 1;
            }
            (Some("DONE"), Some(s), None) if s == id => done = true,
            _ => {}
        }
    }
    // Killed by our signal, or done with its whole stream and waiting.
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.signal() == Some(SIGKILL) || done,
        "child {k} ended on its own: {status:?} (see its stderr above)"
    );
    Child { acked, acks }
}

/// SIGKILL's number on Linux (and every Unix the store targets).
const SIGKILL: i32 = 9;

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_batch() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // the child runs only its own test
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("store");
    let mut rng = Rng(0xdead_beef);
    let started = Instant::now();
    let mut acked: BTreeMap<usize, Option<u64>> = BTreeMap::new();
    let mut acks_total = 0u64;
    let mut k = 0;
    while k < KILLS && started.elapsed() < BUDGET {
        // Mostly short lives (kills land during open, recovery, the first
        // appends), some long ones (rollovers, checkpoints).
        let delay = match rng.below(4) {
            0 => rng.below(40),
            1 | 2 => 40 + rng.below(120),
            _ => 150 + rng.below(250),
        };
        let child = run_child(&dir, k, Duration::from_millis(delay));
        acks_total += child.acks;
        acked.insert(k, child.acked);
        k += 1;
    }
    let kills = k;
    assert!(
        kills >= MIN_KILLS,
        "only {kills} kills in {:?}: the machine is too slow for this test's budget",
        BUDGET
    );

    // Reopen and check every session against its stream.
    let store = Store::open(&dir, options()).expect("reopen after the last kill");
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
    let mut lost = 0u64;
    let mut partial = 0u64;
    let mut events_checked = 0u64;
    let mut with_closers = 0;
    for (&k, &last) in &acked {
        let id = session_id(k);
        let (_, events, bounds) = plan(k);
        if !listed.contains(&id) {
            assert!(
                last.is_none(),
                "session {id} is gone but the child acknowledged seq {last:?}"
            );
            continue;
        }
        store.repair(&id).expect("recover a session as its writer");
        let (_, log) = store.load(&id).expect("load a recovered session");
        let common = log.iter().zip(&events).take_while(|(a, b)| a == b).count();
        // The cut: the largest batch boundary after which exactly the closers
        // of the cut follow.
        let cut =
            bounds.iter().rev().copied().find(|&b| {
                b <= common && b <= log.len() && log[b..] == closers_after(&events, b)[..]
            });
        let Some(cut) = cut else {
            partial += 1;
            eprintln!(
                "{id}: {} events, {common} match the stream, and no batch boundary <= {common} \
                 is followed by exactly its closers",
                log.len()
            );
            continue;
        };
        if let Some(last) = last
            && (cut as u64) <= last
        {
            lost += last + 1 - cut as u64;
        }
        if log.len() > cut {
            with_closers += 1;
        }
        store.verify(&id).expect("verify a recovered session");
        events_checked += log.len() as u64;
    }
    assert_eq!(lost, 0, "acknowledged events lost");
    assert_eq!(partial, 0, "partial batches seen");

    // The store still takes appends: the next batch of the last session.
    let (last_k, _) = acked
        .iter()
        .rev()
        .find(|(k, _)| listed.contains(&session_id(**k)))
        .expect("at least one session survived");
    let id = session_id(*last_k);
    let (_, log) = store.load(&id).expect("load");
    let next = log.len() as u64;
    let time = log.last().map_or(0, |e| e.time);
    let start =
        format!(r#"{{"type":"turn/start","seq":{next},"time":{time},"data":{{"turn":9999}}}}"#);
    let end = format!(
        r#"{{"type":"turn/end","seq":{},"time":{time},"data":{{"turn":9999,"reason":{{"kind":"completed"}}}}}}"#,
        next + 1
    );
    let batch = [
        Event::from_json(&start).expect("event"),
        Event::from_json(&end).expect("event"),
    ];
    store.append(&id, &batch).expect("append after recovery");
    assert_eq!(store.load(&id).expect("load").1.len() as u64, next + 2);
    store.close().expect("close");

    println!(
        "sigkill: {kills} kills in {:.1} s; {acks_total} acknowledged batches checked over {} \
         sessions ({events_checked} events, {with_closers} repaired with closers); \
         acknowledged events lost: {lost}; partial batches seen: {partial}",
        started.elapsed().as_secs_f64(),
        acked.len(),
    );
}
