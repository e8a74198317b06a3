//! Several processes on one store: two writer processes (each writing its
//! own sessions, after taking over the session of the writer killed in its
//! slot a round before; one of them storing sealed segments compressed,
//! half of them acknowledging through the store-wide journal) killed
//! with SIGKILL at pseudo-random moments, again and again, while a third
//! process reads every session the whole time; two
//! `import`s racing to create a store; one process touching 10,000 sessions
//! with 1,024 file descriptors.
//!
//! The test binary re-executes itself in the child roles (`writer`,
//! `reader`, `many`), chosen by `SESSIONLOG_MP_ROLE`; without it those
//! tests return at once.
//!
//! What must hold: no acknowledged batch is lost; no reader ever sees part
//! of a batch, or a log that is not a prefix of what was written (cut at a
//! batch boundary, then at most the closers of that cut, which a read-only
//! handle shows for a session nobody writes); the reader never dies (a
//! `SIGBUS` from a segment sealed and cut under it would kill it); after the
//! last kill every session recovers and verifies.

use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::session::SessionState;
use sessionlog::store::{Durability, Error, Options, Store};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "SESSIONLOG_MP_ROLE";
const DIR_ENV: &str = "SESSIONLOG_MP_DIR";
const INDEX_ENV: &str = "SESSIONLOG_MP_INDEX";
const CHILD_TEST: &str = "child";

fn options() -> Options {
    Options {
        durability: Durability::Sync,
        // Small segments: writers seal (and cut) segments under the reader.
        segment_size: 32 << 10,
        preallocate: 16 << 10,
        checkpoint_every: 64,
        ..Options::default()
    }
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Rounds of the two-writer campaign: 30, or `SESSIONLOG_MP_ROUNDS` for a
/// longer run by hand (children inherit it).
fn campaign_rounds() -> usize {
    std::env::var("SESSIONLOG_MP_ROUNDS").map_or(30, |v| v.parse().expect("SESSIONLOG_MP_ROUNDS"))
}

/// How long a child lives before it exits on its own: past the campaign.
fn child_lifetime() -> Duration {
    Duration::from_secs(60 + campaign_rounds() as u64)
}

fn session_id(k: usize) -> String {
    format!("w-{k:03}")
}

/// Writer `k`'s stream and its batch boundaries (0 first).
fn plan(k: usize) -> (SessionHeader, Vec<OwnedEvent>, Vec<usize>) {
    let (header, events) = Sample::new(SampleConfig {
        turns: 80,
        seed: 7000 + k as u64,
        ..SampleConfig::default()
    })
    .session(&session_id(k));
    let mut rng = Rng(0xa11ce + k as u64);
    let mut bounds = vec![0];
    let mut at = 0;
    while at < events.len() {
        at = (at + 1 + (rng.next() % 10) as usize).min(events.len());
        bounds.push(at);
    }
    (header, events, bounds)
}

fn closers_after(log: &[OwnedEvent], n: usize) -> Vec<OwnedEvent> {
    let mut state = SessionState::new(false);
    state
        .append_batch(&log[..n], &Vec::<Event<'_>>::new())
        .expect("a prefix of the stream folds");
    state.closers()
}

/// Whether `got` is `stream` cut at a batch boundary, then nothing or
/// exactly the closers of the cut. Returns the cut.
fn whole_prefix(got: &[OwnedEvent], stream: &[OwnedEvent], bounds: &[usize]) -> Option<usize> {
    let common = got.iter().zip(stream).take_while(|(a, b)| a == b).count();
    bounds.iter().rev().copied().find(|&b| {
        b <= common
            && b <= got.len()
            && (got.len() == b || got[b..] == closers_after(stream, b)[..])
    })
}

/// The child roles, run by re-executing this binary.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let dir = PathBuf::from(std::env::var_os(DIR_ENV).expect("store dir"));
    match role.as_str() {
        "writer" => writer(&dir),
        "reader" => reader(&dir),
        "many" => many_sessions(&dir),
        other => panic!("unknown role {other}"),
    }
}

/// Appends its stream, printing `ACK id seq` after each acknowledged batch,
/// then waits to be killed.
fn writer(dir: &Path) {
    let k: usize = std::env::var(INDEX_ENV).unwrap().parse().unwrap();
    let started = Instant::now();
    let (header, events, bounds) = plan(k);
    // Every other writer stores its sealed segments compressed: its
    // background thread is killed mid-image too, and the reader meets raw
    // files replaced by images under it. Half of the writers acknowledge
    // through the store-wide journal (segments synced behind it), so a
    // killed one leaves journal files whose copies the next writable open
    // writes back, while the other writer and the reader run.
    let opts = Options {
        compress_sealed: k % 2 == 1,
        journal: k % 4 >= 2,
        ..options()
    };
    let store = Store::open(dir, opts).expect("writer: open");
    // First take over the session the writer of this slot two writers ago
    // was killed in: its load recovers the torn tail (and, for a journaled
    // writer, whatever the journal holds) and closes an open turn.
    if k >= 2 {
        match store.repair(&session_id(k - 2)) {
            // Killed before it created its session.
            Ok(_) | Err(Error::NotFound(_)) => {}
            Err(e) => panic!("writer: take over {}: {e}", session_id(k - 2)),
        }
    }
    store.create(header).expect("writer: create");
    let id = session_id(k);
    let mut out = std::io::stdout();
    writeln!(out, "CREATED {id}").unwrap();
    out.flush().unwrap();
    for w in bounds.windows(2) {
        store
            .append(&id, &events[w[0]..w[1]])
            .expect("writer: append");
        writeln!(out, "ACK {id} {}", w[1] - 1).unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "DONE {id}").unwrap();
    out.flush().unwrap();
    while started.elapsed() < child_lifetime() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads every session again and again through one read-only handle (fresh
/// reads, no reopen) and checks each log; prints `CHECKED n` now and then
/// and `BAD ...` (then exits 1) at the first violation.
fn reader(dir: &Path) {
    let started = Instant::now();
    let store = loop {
        match Store::open_read_only(dir) {
            Ok(s) => break s,
            Err(_) if started.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("reader: open: {e}"),
        }
    };
    let mut plans: BTreeMap<String, (Vec<OwnedEvent>, Vec<usize>)> = BTreeMap::new();
    let mut checked = 0u64;
    let mut out = std::io::stdout();
    while started.elapsed() < child_lifetime() {
        let Ok(listed) = store.list() else { continue };
        for h in listed {
            let k: usize = h.id[2..].parse().expect("w-NNN");
            let (stream, bounds) = plans.entry(h.id.clone()).or_insert_with(|| {
                let (_, e, b) = plan(k);
                (e, b)
            });
            let got = match store.read_from(&h.id, 0) {
                Ok(got) => got,
                Err(Error::NotFound(_)) => continue,
                Err(e) => {
                    writeln!(out, "BAD {} read failed: {e}", h.id).unwrap();
                    std::process::exit(1);
                }
            };
            if whole_prefix(&got, stream, bounds).is_none() {
                writeln!(
                    out,
                    "BAD {}: {} events are not a whole-batch prefix",
                    h.id,
                    got.len()
                )
                .unwrap();
                std::process::exit(1);
            }
            checked += 1;
        }
        writeln!(out, "CHECKED {checked}").unwrap();
        out.flush().unwrap();
    }
}

fn spawn(role: &str, dir: &Path, k: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(DIR_ENV, dir)
        .env(INDEX_ENV, k.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a child")
}

/// Collects a child's stdout lines on a thread.
fn lines(child: &mut Child) -> (mpsc::Receiver<String>, std::thread::JoinHandle<()>) {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (rx, t)
}

const SIGKILL: i32 = 9;

#[test]
fn two_writer_processes_killed_and_a_reader_process_lose_nothing() {
    if std::env::var_os(ROLE_ENV).is_some() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    Store::open(&dir, options()).unwrap().close().unwrap();
    let mut reader = spawn("reader", &dir, 0);
    let (reader_lines, reader_thread) = lines(&mut reader);
    let mut rng = Rng(0xfeed);
    let started = Instant::now();
    let mut acked: BTreeMap<usize, Option<u64>> = BTreeMap::new();
    let mut rounds = 0;
    let mut k = 0;
    // `SESSIONLOG_MP_ROUNDS` runs a longer campaign by hand (the budget
    // grows with it).
    let max_rounds: usize =
        std::env::var("SESSIONLOG_MP_ROUNDS").map_or(30, |v| v.parse().unwrap());
    let budget = Duration::from_secs(25 * max_rounds as u64 / 30);
    while rounds < max_rounds && started.elapsed() < budget {
        let mut pair: Vec<(usize, Child)> = (0..2)
            .map(|i| (k + i, spawn("writer", &dir, k + i)))
            .collect();
        let outs: Vec<_> = pair.iter_mut().map(|(_, c)| lines(c)).collect();
        let mut said: Vec<Vec<String>> = vec![Vec::new(); outs.len()];
        // Three rounds in four, the kill waits until both writers have
        // taken over and created their sessions (a take-over can outlast
        // the delay on a loaded machine, and then nothing new is written);
        // every fourth kills at random, often inside the take-over itself.
        if rounds % 4 != 3 {
            let deadline = Instant::now() + Duration::from_secs(20);
            for (j, (rx, _)) in outs.iter().enumerate() {
                while !said[j].iter().any(|l| l.contains("CREATED ")) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(left) {
                        Ok(line) => said[j].push(line),
                        Err(_) => {
                            panic!("writer {} did not create its session: {:?}", k + j, said[j])
                        }
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(30 + rng.next() % 250));
        for (j, (kk, c)) in pair.iter_mut().enumerate() {
            let _ = c.kill();
            let status = c.wait().unwrap();
            let (rx, t) = &outs[j];
            let _ = t;
            let mut last = None;
            let mut done = false;
            for line in std::mem::take(&mut said[j])
                .into_iter()
                .chain(rx.try_iter())
            {
                let mut p = line.split_whitespace();
                match (p.next(), p.next(), p.next()) {
                    (Some("ACK"), Some(_), Some(seq)) => last = Some(seq.parse::<u64>().unwrap()),
                    (Some("DONE"), _, _) => done = true,
                    _ => {}
                }
            }
            assert!(
                status.signal() == Some(SIGKILL) || done,
                "writer {kk} ended on its own: {status:?}"
            );
            acked.insert(*kk, last);
        }
        for (_, t) in outs {
            t.join().unwrap();
        }
        k += 2;
        rounds += 1;
        if let Some(status) = reader.try_wait().unwrap() {
            // What it said last: a BAD line (then it exits 1), or nothing
            // (a signal: a SIGBUS from a cut segment would kill it).
            let said: Vec<String> = reader_lines.try_iter().collect();
            let last: Vec<&String> = said.iter().rev().take(3).collect();
            panic!(
                "the reader died after {rounds} rounds, {:?} in: {status:?}; its last lines: {last:?}",
                started.elapsed()
            );
        }
    }
    let _ = reader.kill();
    let status = reader.wait().unwrap();
    reader_thread.join().unwrap();
    let out: Vec<String> = reader_lines.try_iter().collect();
    let bad: Vec<&String> = out.iter().filter(|l| l.starts_with("BAD")).collect();
    assert!(bad.is_empty(), "the reader saw: {bad:?}");
    assert_eq!(status.signal(), Some(SIGKILL), "the reader ran to the end");
    let checked: u64 = out
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("CHECKED ").and_then(|n| n.parse().ok()))
        .unwrap_or(0);
    assert!(checked > 20, "the reader checked {checked} logs");

    // The journaled writers were killed with their journals in use: the
    // last of them left its files for the open below to write back.
    let journals = std::fs::read_dir(dir.join("journal")).map_or(0, |d| d.count());
    assert!(journals > 0, "no journal files left by the killed writers");

    // Every session recovers as a whole-batch prefix holding every ack.
    let store = Store::open(&dir, options()).unwrap();
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
    let mut sessions = 0;
    for (&k, &last) in &acked {
        let id = session_id(k);
        if !listed.contains(&id) {
            assert!(last.is_none(), "{id} is gone but acked seq {last:?}");
            continue;
        }
        store.repair(&id).unwrap();
        let got = store.read_from(&id, 0).unwrap();
        let (_, stream, bounds) = plan(k);
        let cut = whole_prefix(&got, &stream, &bounds)
            .unwrap_or_else(|| panic!("{id}: {} events: not a whole-batch prefix", got.len()));
        if let Some(last) = last {
            assert!(cut as u64 > last, "{id}: acked seq {last} lost (cut {cut})");
        }
        store.verify(&id).unwrap();
        sessions += 1;
    }
    assert!(sessions >= 10, "{sessions} sessions written");
    let images = std::fs::read_dir(dir.join("sessions"))
        .unwrap()
        .filter_map(|d| std::fs::read_dir(d.unwrap().path()).ok())
        .flatten()
        .filter(|f| {
            f.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|e| e == "segz")
        })
        .count();
    assert!(images > 0, "the compressing writers left images");
    println!(
        "{rounds} rounds, {} writer kills, {sessions} sessions, reader checked {checked} logs",
        2 * rounds
    );
}

/// Two `import`s creating one store at once, again and again: both succeed
/// and every session reads back. Before, the second MANIFEST rename
/// replaced the store id after the first had written segments (85 of 150
/// runs read as corrupt).
#[test]
fn concurrent_imports_into_a_fresh_directory_both_land() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_sessionlog");
    let file = |name: &str| {
        let p = tmp.path().join(format!("{name}.jsonl"));
        let (header, events) = Sample::new(SampleConfig {
            turns: 3,
            ..SampleConfig::default()
        })
        .session(name);
        let mut f = std::fs::File::create(&p).unwrap();
        sessionlog::adapters::jsonl::write_session(&mut f, &header, &events).unwrap();
        p
    };
    let (a, b) = (file("a"), file("b"));
    for round in 0..25 {
        let store = tmp.path().join(format!("store-{round}"));
        let run = |f: &Path| {
            Command::new(bin)
                .arg("--store")
                .arg(&store)
                .args(["import", "-q"])
                .arg(f)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (pa, pb) = (run(&a), run(&b));
        for p in [pa, pb] {
            let out = p.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let s = Store::open_read_only(&store).unwrap();
        assert_eq!(s.list().unwrap().len(), 2, "round {round}");
        for id in ["a", "b"] {
            s.verify(id)
                .unwrap_or_else(|e| panic!("round {round}: {id}: {e}"));
        }
    }
}

/// The child of [`ten_thousand_sessions_with_1024_file_descriptors`]: lowers
/// its own descriptor limit, then writes 10,000 sessions through one
/// handle, then reads them all back.
fn many_sessions(dir: &Path) {
    let limit = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: setrlimit with a valid struct; lowering is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let store = Store::open(
        dir,
        Options {
            durability: Durability::None,
            preallocate: 4096,
            ..Options::default()
        },
    )
    .expect("open");
    let event = |seq: u64| {
        Event::from_json(&format!(
            r#"{{"type":"session/title","seq":{seq},"time":1,"data":{{"title":"t"}}}}"#
        ))
        .unwrap()
        .into_owned()
    };
    for i in 0..10_000 {
        let id = format!("s{i:05}");
        store
            .create(SessionHeader::new(&id, 0))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        store
            .append(&id, &[event(0)])
            .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    // Every session again: a second append each (loads again what was
    // evicted), then a read.
    for i in 0..10_000 {
        let id = format!("s{i:05}");
        store
            .append(&id, &[event(1)])
            .unwrap_or_else(|e| panic!("{id}: {e}"));
    }
    store.close().expect("close");
    let store = Store::open_read_only(dir).unwrap();
    assert_eq!(store.list().unwrap().len(), 10_000);
    for i in (0..10_000).step_by(97) {
        assert_eq!(store.read_from(&format!("s{i:05}"), 0).unwrap().len(), 2);
    }
    println!("MANY OK");
}

/// One process, 10,000 sessions, `ulimit -n 1024`: before, a session held
/// an open file until close and the 1,021st one failed with "Too many open
/// files".
#[test]
fn ten_thousand_sessions_with_1024_file_descriptors() {
    if std::env::var_os(ROLE_ENV).is_some() {
        return;
    }
    // tmpfs when there is one: this is about descriptors, not the disk.
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let dir = tmp.path().join("store");
    let child = spawn("many", &dir, 0);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("MANY OK"),
        "{:?}: {stdout}",
        out.status
    );
}
