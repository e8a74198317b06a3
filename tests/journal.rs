//! The store-wide journal (issue 18): group commit across sessions, the
//! background retirement of full journal files, and replay after the
//! journal's owner is gone.
//!
//! A killed process loses nothing from the page cache, so a SIGKILL alone
//! never needs the journal. These tests kill a child that appends through
//! the journal, then zero every segment byte that was never synced in the
//! segment itself (everything after each session's first batch, which is
//! synced in place to publish it): what a power loss may do to segment
//! writes whose durability rests on the journal. Reopening must write back
//! every acknowledged batch from the journal. `tests/crash_points.rs` also
//! enumerates every crash point of a workload with the journal on.

mod common;
#[path = "common/hooked_fs.rs"]
mod hooked_fs;

use common::{fast_tempdir, turn_log};
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "SESSIONLOG_JOURNAL_CHILD";
const CHILD_TEST: &str = "journal_child_appends_until_killed";
const SESSIONS: usize = 8;

fn options() -> Options {
    Options {
        journal: true,
        ..Options::default()
    }
}

/// The log of session `i`, cut into whole turns (so no closers are due at
/// any batch boundary).
fn plan(i: usize) -> (String, Vec<Vec<OwnedEvent>>) {
    let log = turn_log(400, &format!("s{i}"));
    let mut batches = vec![Vec::new()];
    for e in log {
        let end = e.kind == "turn/end";
        batches.last_mut().unwrap().push(e);
        if end {
            batches.push(Vec::new());
        }
    }
    batches.pop();
    (format!("s{i}"), batches)
}

fn journal_files(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir.join("journal")) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Thread t of 4 creates sessions t, t + 4, .. and appends their batches
/// in turn, calling `ack(id, batches acknowledged)` after each append and
/// pausing `pause` after each round.
fn append_from_4_threads(store: &Store, ack: impl Fn(&str, usize) + Sync, pause: Duration) {
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (store, ack) = (store.clone(), &ack);
            scope.spawn(move || {
                let plans: Vec<_> = (t..SESSIONS).step_by(4).map(plan).collect();
                for (id, _) in &plans {
                    store.create(SessionHeader::new(id, 0)).unwrap();
                }
                for b in 0..plans[0].1.len() {
                    for (id, batches) in &plans {
                        store.append(id, &batches[b]).expect("append");
                        ack(id, b + 1);
                    }
                    std::thread::sleep(pause);
                }
            });
        }
    });
}

#[test]
fn many_threads_share_the_journal_and_full_files_are_retired() {
    let dir = fast_tempdir();
    let opts = Options {
        journal_file_size: 64 << 10, // many rotations
        ..options()
    };
    let store = Store::open(dir.path(), opts).unwrap();
    let first = journal_files(dir.path());
    assert_eq!(first.len(), 1, "the handle's first journal file");
    append_from_4_threads(&store, |_, _| {}, Duration::ZERO);
    // 8 sessions x ~60 KiB went through 64 KiB files: the first file
    // filled up, was retired and, once the background thread synced
    // every session, removed; so were the others but the current one and
    // its spare.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut files = journal_files(dir.path());
    while (files.len() > 2 || files.contains(&first[0])) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        files = journal_files(dir.path());
    }
    assert!(!files.contains(&first[0]), "the first file was retired");
    assert!(files.len() <= 2, "retired files are removed: {files:?}");
    store.close().unwrap();
    assert_eq!(journal_files(dir.path()), Vec::<String>::new());
    let store = Store::open(dir.path(), Options::default()).unwrap();
    for i in 0..SESSIONS {
        let (id, batches) = plan(i);
        let want: Vec<OwnedEvent> = batches.concat();
        assert_eq!(store.read_from(&id, 0).unwrap(), want, "{id}");
    }
}

/// A stamp clock for the group-commit test: each journal write and the
/// start of each journal sync take the next number.
static CLOCK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// This thread's last journal write, and the start of its last sync.
    static WROTE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static SYNC_BEGAN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn in_journal(p: &Path) -> bool {
    p.parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "journal")
}

#[test]
fn every_journaled_append_returns_after_a_sync_that_began_after_its_write() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    // The start stamp of the latest journal sync that completed. Syncs
    // are slowed so that groups form, and appenders arrive during a sync
    // (those wait for the next one) as well as before it.
    let durable_from = Arc::new(AtomicU64::new(0));
    let done = durable_from.clone();
    let fs = hooked_fs::HookedFs {
        after_write: Some(Arc::new(|p| {
            if in_journal(p) {
                WROTE.set(CLOCK.fetch_add(1, Ordering::SeqCst) + 1);
            }
        })),
        before_sync_data: Some(Arc::new(|p| {
            if in_journal(p) {
                SYNC_BEGAN.set(CLOCK.fetch_add(1, Ordering::SeqCst) + 1);
                std::thread::sleep(Duration::from_micros(300));
            }
        })),
        after_sync_data: Some(Arc::new(move |p| {
            if in_journal(p) {
                done.fetch_max(SYNC_BEGAN.get(), Ordering::SeqCst);
            }
        })),
        ..hooked_fs::HookedFs::default()
    };
    let dir = fast_tempdir();
    let store = Store::open_with_vfs(dir.path(), options(), Arc::new(fs)).unwrap();
    // Threads end at different times: an appender left waiting for a
    // sync that nobody leads once the others are done hangs.
    const THREADS: usize = 16;
    let appends = |t: usize| 10 + 4 * t;
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..THREADS {
        let (store, tx, durable_from) = (store.clone(), tx.clone(), durable_from.clone());
        std::thread::spawn(move || {
            let id = format!("t{t}");
            store.create(SessionHeader::new(&id, 0)).unwrap();
            let n = appends(t);
            let log = turn_log(n as u64, &id);
            let (mut journaled, mut late) = (0, 0);
            for turn in log.chunks(log.len() / n) {
                WROTE.set(0);
                store.append(&id, turn).unwrap();
                // (A session's first batch is synced in its segment.)
                if WROTE.get() == 0 {
                    continue;
                }
                journaled += 1;
                // A sync that began after this append's journal write has
                // returned.
                if durable_from.load(Ordering::SeqCst) <= WROTE.get() {
                    late += 1;
                }
            }
            tx.send((id, n, log, journaled, late)).unwrap();
        });
    }
    drop(tx);
    for _ in 0..THREADS {
        // A waiter nobody wakes would hang its append: give up loudly.
        let (id, n, log, journaled, late) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("every journaled append returns");
        assert!(journaled >= n - 1, "{id}: {journaled} of {n} journaled");
        assert_eq!(late, 0, "{id}: appends acknowledged before a covering sync");
        assert_eq!(store.read_from(&id, 0).unwrap(), log, "{id}");
    }
}

/// A journal write that fails while appenders wait for a sync wakes every
/// one of them: each append returns (with an error from the failure on),
/// none is left parked. The failure is armed at the end of a sync, so it
/// meets the appender that sync's end woke to lead the next, or one that
/// came in before it; either way the others must learn of it too. Every
/// acknowledged batch is still there after a reopen.
#[test]
fn a_failed_journal_write_wakes_every_waiting_appender() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const ROUNDS: usize = 30;
    const THREADS: usize = 8;
    let mut failed_rounds = 0;
    for round in 0..ROUNDS {
        let armed = Arc::new(AtomicBool::new(false));
        let syncs = Arc::new(AtomicUsize::new(0));
        let (arm, fail) = (armed.clone(), armed);
        let fs = hooked_fs::HookedFs {
            before_write: Some(Arc::new(move |p| {
                if in_journal(p) && fail.swap(false, Ordering::SeqCst) {
                    return Err(std::io::Error::other("injected journal write failure"));
                }
                Ok(())
            })),
            before_sync_data: Some(Arc::new(|p| {
                if in_journal(p) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            })),
            after_sync_data: Some(Arc::new(move |p| {
                if in_journal(p) && syncs.fetch_add(1, Ordering::SeqCst) == 3 + round % 5 {
                    arm.store(true, Ordering::SeqCst);
                }
            })),
            ..hooked_fs::HookedFs::default()
        };
        let dir = fast_tempdir();
        let store = Store::open_with_vfs(dir.path(), options(), Arc::new(fs)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for t in 0..THREADS {
            let (store, tx) = (store.clone(), tx.clone());
            std::thread::spawn(move || {
                let id = format!("t{t}");
                store.create(SessionHeader::new(&id, 0)).unwrap();
                let n = 12;
                let log = turn_log(n as u64, &id);
                let mut acked = 0;
                let mut error = None;
                for turn in log.chunks(log.len() / n) {
                    match store.append(&id, turn) {
                        Ok(()) => acked += turn.len(),
                        Err(e) => {
                            error = Some(e.to_string());
                            break;
                        }
                    }
                }
                tx.send((id, log, acked, error)).unwrap();
            });
        }
        drop(tx);
        let mut results = Vec::new();
        for _ in 0..THREADS {
            // An appender nobody wakes hangs: give up loudly.
            results.push(
                rx.recv_timeout(Duration::from_secs(30))
                    .unwrap_or_else(|_| panic!("round {round}: an append never returned")),
            );
        }
        if results.iter().any(|r| r.3.is_some()) {
            failed_rounds += 1;
        }
        drop(store);
        let store = Store::open(dir.path(), options()).unwrap();
        for (id, log, acked, _) in &results {
            let stored = store.read_from(id, 0).unwrap();
            assert!(
                stored.len() >= *acked,
                "round {round}, {id}: acknowledged events lost"
            );
            assert_eq!(stored[..], log[..stored.len()], "round {round}, {id}");
        }
    }
    assert!(failed_rounds > 0, "no round met the injected failure");
    eprintln!("{failed_rounds} of {ROUNDS} rounds met the injected failure");
}

/// The child: appends every session's turns from 4 threads through the
/// journal, printing `ACK <id> <batches>` after each acknowledged append,
/// until killed.
#[test]
fn journal_child_appends_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return; // not the child
    };
    let store = Store::open(PathBuf::from(dir), options()).expect("child: open");
    let started = Instant::now();
    let ack = |id: &str, n: usize| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ACK {id} {n}").unwrap();
        out.flush().unwrap();
    };
    append_from_4_threads(&store, ack, Duration::from_millis(2));
    while started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs the child until about half its batches are acknowledged, kills it
/// (SIGKILL) and returns the acknowledged batch count per session.
fn run_and_kill(dir: &Path) -> BTreeMap<String, usize> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut acked = BTreeMap::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut n = 0;
    while let Some(Ok(line)) = lines.next() {
        let mut p = line.split_whitespace();
        if let (Some("ACK"), Some(id), Some(b)) = (p.next(), p.next(), p.next()) {
            acked.insert(id.to_owned(), b.parse::<usize>().unwrap());
            n += 1;
            if n == SESSIONS * 150 {
                break;
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Acks printed after the last line read are acknowledged too, but
    // checking fewer is still a check.
    acked
}

/// Zeroes every record of `id`'s segment after the first one: segment
/// writes that only the journal made durable, as a power loss may drop
/// them.
fn lose_unsynced_segment_writes(store_dir: &Path, id: &str) {
    let seg = segment_file(store_dir, id);
    let mut bytes = std::fs::read(&seg).unwrap();
    let first_len = u32::from_le_bytes(bytes[64..68].try_into().unwrap()) as usize;
    let first_end = 64 + 12 + first_len;
    assert!(bytes.len() > first_end, "{id} has more than one record");
    bytes[first_end..].fill(0);
    std::fs::write(&seg, bytes).unwrap();
}

/// The (first) raw segment file of session `id`.
fn segment_file(store_dir: &Path, id: &str) -> PathBuf {
    let dir = Store::session_dir_in(store_dir, id).unwrap();
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap_or_else(|| panic!("a segment in {}", dir.display()))
}

/// A closed store (written with `opts`) whose session 0 got its first
/// `n` batches, and an orphaned copy of the journal that holds them.
fn journaled_session(
    dir: &Path,
    opts: Options,
    n: usize,
) -> (String, Vec<Vec<OwnedEvent>>, PathBuf) {
    let a = Store::open(dir, opts).unwrap();
    let (id, batches) = plan(0);
    a.create(SessionHeader::new(&id, 0)).unwrap();
    for b in &batches[..n] {
        a.append(&id, b).unwrap();
    }
    let copy = orphan_copy(dir, "0000000000000abc");
    a.close().unwrap();
    (id, batches, copy)
}

fn check_acked(store: &Store, acked: &BTreeMap<String, usize>, context: &str) {
    for (id, &n) in acked {
        let (_, batches) = plan(id[1..].parse().unwrap());
        let want: Vec<OwnedEvent> = batches[..n].concat();
        let got = store.read_from(id, 0).unwrap();
        assert!(
            got.len() >= want.len() && got[..want.len()] == want[..],
            "{context}: {id} lost acknowledged batches: {} events, {} acknowledged",
            got.len(),
            want.len()
        );
    }
}

#[test]
fn a_killed_writer_s_journal_brings_back_lost_segment_writes() {
    let dir = fast_tempdir();
    let store_dir = dir.path().join("store");
    Store::open(&store_dir, options()).unwrap().close().unwrap();
    // A handle opened while the child lives: it finds no orphan at open,
    // so it replays when it takes a session for writing.
    let early = Store::open(&store_dir, Options::default()).unwrap();
    let acked = run_and_kill(&store_dir);
    assert_eq!(acked.len(), SESSIONS, "every session acknowledged batches");
    assert_eq!(journal_files(&store_dir).len(), 1, "the child's journal");
    for id in acked.keys() {
        lose_unsynced_segment_writes(&store_dir, id);
    }
    // Taking s0 for writing replays its entries only. (The child may have
    // acknowledged more than the parent read before the kill: the next
    // batch is found from the replayed log.)
    assert_eq!(early.repair("s0").unwrap(), Vec::<OwnedEvent>::new());
    let have = early.read_from("s0", 0).unwrap().len();
    let (_, batches) = plan(0);
    let next = (0..=batches.len())
        .find(|&n| batches[..n].iter().map(Vec::len).sum::<usize>() == have)
        .expect("s0 holds whole batches");
    assert!(next >= acked["s0"], "s0 lost acknowledged batches");
    early.append("s0", &batches[next]).unwrap();
    check_acked(&early, &BTreeMap::from([("s0".to_owned(), next + 1)]), "s0");
    early.close().unwrap();
    assert_eq!(journal_files(&store_dir).len(), 1, "still needed by others");
    // A writable open replays the rest and removes the file.
    let store = Store::open(&store_dir, Options::default()).unwrap();
    assert_eq!(journal_files(&store_dir), Vec::<String>::new());
    check_acked(&store, &acked, "after the writable open");
    for id in acked.keys() {
        store.verify(id).unwrap();
    }
}

#[test]
fn a_live_handle_s_journal_is_left_alone() {
    let dir = fast_tempdir();
    let a = Store::open(dir.path(), options()).unwrap();
    let (id, batches) = plan(0);
    a.create(SessionHeader::new(&id, 0)).unwrap();
    a.append(&id, &batches[0]).unwrap();
    a.append(&id, &batches[1]).unwrap();
    let files = journal_files(dir.path());
    assert_eq!(files.len(), 1);
    // Another writable handle: the journal's owner lives, so the file stays.
    let b = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(journal_files(dir.path()), files);
    let (other, more) = plan(1);
    b.create(SessionHeader::new(&other, 0)).unwrap();
    b.append(&other, &more[0]).unwrap();
    a.append(&id, &batches[2]).unwrap();
    assert_eq!(b.read_from(&id, 0).unwrap(), batches[..3].concat());
    drop(b);
    a.close().unwrap();
    assert_eq!(journal_files(dir.path()), Vec::<String>::new());
}

/// A copy of a live journal under another number has no owner: an orphan.
fn orphan_copy(store_dir: &Path, number: &str) -> PathBuf {
    let files = journal_files(store_dir);
    let live = store_dir.join("journal").join(&files[0]);
    let copy = store_dir.join("journal").join(format!("{number}.wal"));
    std::fs::copy(live, &copy).unwrap();
    copy
}

#[test]
fn a_replayed_journal_writes_nothing_twice_and_damage_is_refused_per_session() {
    let dir = fast_tempdir();
    let a = Store::open(dir.path(), options()).unwrap();
    let (id, batches) = plan(0);
    a.create(SessionHeader::new(&id, 0)).unwrap();
    for b in &batches[..4] {
        a.append(&id, b).unwrap();
    }
    let intact = orphan_copy(dir.path(), "0000000000000abc");
    let damaged = orphan_copy(dir.path(), "0000000000000abd");
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[30] ^= 0xff; // the store id, under the header's CRC
    std::fs::write(&damaged, bytes).unwrap();
    a.close().unwrap();
    let seg = Store::session_dir_in(dir.path(), &id).unwrap();
    let before = std::fs::read_dir(&seg).unwrap().count();
    // The open replays the intact copy (every record is in its segment
    // already: nothing is written) and removes it; the damaged one stays
    // and does not fail the open.
    let b = Store::open(dir.path(), Options::default()).unwrap();
    assert!(!intact.exists(), "the intact orphan was removed");
    assert!(damaged.exists(), "the damaged one is kept");
    assert_eq!(b.read_from(&id, 0).unwrap(), batches[..4].concat());
    assert_eq!(std::fs::read_dir(&seg).unwrap().count(), before);
    // Taking the session for writing refuses the damaged journal, naming
    // the session and the file.
    match b.append(&id, &batches[4]) {
        Err(sessionlog::store::Error::Corrupt {
            session, segment, ..
        }) => {
            assert_eq!(session, id);
            assert_eq!(segment, damaged);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The store stays usable: a new session is created and written.
    let (other, more) = plan(1);
    b.create(SessionHeader::new(&other, 0)).unwrap();
    b.append(&other, &more[0]).unwrap();
}

/// The start of each entry of journal file `bytes` (its framing only).
fn entry_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut at = 48;
    let mut all = Vec::new();
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        all.push(at);
        at += 8 + len;
    }
    all
}

/// A store whose one orphaned journal is damaged (its header's store id
/// flipped, and the CRC of its last entry, s1's) after a power loss that
/// kept only the segment writes synced in place. Returns the journal's
/// path, its bytes, and where its last entry starts.
fn store_with_a_damaged_journal(dir: &Path) -> (PathBuf, Vec<u8>, usize) {
    // Small journal files: the fault test copies the store many times.
    let opts = Options {
        journal_file_size: 64 << 10,
        ..options()
    };
    let a = Store::open(dir, opts).unwrap();
    let (s0, b0) = plan(0);
    let (s1, b1) = plan(1);
    for id in [&s0, &s1] {
        a.create(SessionHeader::new(id, 0)).unwrap();
    }
    // Each session's first batch is synced in its segment; the others are
    // journaled: s0's five, then s1's one.
    for b in &b0[..6] {
        a.append(&s0, b).unwrap();
    }
    a.append(&s1, &b1[0]).unwrap();
    a.append(&s1, &b1[1]).unwrap();
    let orphan = orphan_copy(dir, "0000000000000abd");
    a.close().unwrap();
    let mut bytes = std::fs::read(&orphan).unwrap();
    let entries = entry_offsets(&bytes);
    assert_eq!(entries.len(), 6, "five of s0, one of s1");
    bytes[30] ^= 0xff; // the store id, under the header's CRC
    let last = entries[5];
    bytes[last + 20] ^= 0x01; // s1's entry: its CRC fails, reading stops
    std::fs::write(&orphan, &bytes).unwrap();
    // Power loss before the writer synced its segments and wrote its
    // checkpoints: the segment writes only the journal made durable.
    for id in [&s0, &s1] {
        lose_unsynced_segment_writes(dir, id);
        let sdir = Store::session_dir_in(dir, id).unwrap();
        assert!(common::checkpoint_place(&sdir).is_some());
        common::remove_checkpoint(&sdir);
    }
    (orphan, bytes, last)
}

/// After a salvage: s0 has every acknowledged batch back, s1 lost the one
/// only the unreadable entry held; both are writable and verify.
fn check_salvaged(store: &Store, context: &str) {
    let (s0, b0) = plan(0);
    let (s1, b1) = plan(1);
    assert_eq!(
        store.read_from(&s0, 0).unwrap(),
        b0[..6].concat(),
        "{context}"
    );
    assert_eq!(store.read_from(&s1, 0).unwrap(), b1[0], "{context}");
    store.append(&s0, &b0[6]).unwrap();
    store.append(&s1, &b1[1]).unwrap();
    for id in [&s0, &s1] {
        store.verify(id).unwrap();
    }
}

/// A damaged orphaned journal is reported, refused to a writer, then
/// salvaged on request: every entry that can be read is written back, the
/// file is kept in `journal/damaged/`, and the sessions are writable again.
/// What only the unreadable part held is gone, and the report says so.
#[test]
fn a_damaged_journal_is_reported_salvaged_and_kept() {
    let dir = fast_tempdir();
    let (orphan, bytes, last) = store_with_a_damaged_journal(dir.path());
    let (s0, b0) = plan(0);

    let b = Store::open(dir.path(), Options::default()).unwrap();
    let damaged = b.damaged_journals().unwrap();
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(damaged[0].path, orphan);
    assert!(damaged[0].reason.contains("header"), "{damaged:?}");
    let refused = b.append(&s0, &b0[6]);
    assert!(
        matches!(&refused, Err(sessionlog::store::Error::Corrupt { segment, .. }) if *segment == orphan),
        "{refused:?}"
    );
    // A read-only handle reports it too.
    let ro = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(ro.damaged_journals().unwrap(), damaged);
    assert!(matches!(
        ro.salvage_journals(),
        Err(sessionlog::store::Error::ReadOnly)
    ));

    let done = b.salvage_journals().unwrap();
    assert_eq!(done.len(), 1, "{done:?}");
    let s = &done[0];
    assert_eq!(s.damage, damaged[0]);
    let kept = dir.path().join("journal/damaged/0000000000000abd.wal");
    assert_eq!(s.kept, kept);
    assert!(!orphan.exists() && kept.exists());
    assert_eq!(std::fs::read(&kept).unwrap(), bytes, "kept as it was");
    assert_eq!(s.entries, 5);
    assert_eq!(s.replayed, vec![(s0.clone(), 5)]);
    assert!(s.skipped.is_empty() && s.unparsed.is_empty(), "{s:?}");
    assert_eq!(s.end, last as u64);
    assert!(s.unread > 0);
    assert!(b.damaged_journals().unwrap().is_empty());
    assert!(b.salvage_journals().unwrap().is_empty(), "done once");
    check_salvaged(&b, "salvaged");
}

/// Every file operation of an open and a salvage fails in turn (once, and
/// for good): whatever the call returns, the journal file is in exactly one
/// place, intact, and a salvage with the real file system afterwards
/// finishes the job.
#[test]
fn a_salvage_that_fails_at_any_operation_can_be_run_again() {
    use sessionlog::vfs::{FaultFs, FaultKind, FaultPlan, RealFs, Vfs};
    use std::sync::Arc;
    let template = fast_tempdir();
    let (orphan, bytes, _) = store_with_a_damaged_journal(template.path());
    let name = orphan.file_name().unwrap().to_owned();
    let mut failed_runs = 0;
    for persistent in [false, true] {
        for n in 1.. {
            let dir = fast_tempdir();
            copy_dir(template.path(), dir.path());
            let fs = Arc::new(FaultFs::new(
                Arc::new(RealFs),
                FaultPlan {
                    fail_at: Some(n),
                    kind: FaultKind::Eio,
                    persistent,
                    ..FaultPlan::default()
                },
            ));
            let vfs: Arc<dyn Vfs> = fs.clone();
            let context = format!("operation {n} failed (persistent: {persistent})");
            let result = Store::open_with_vfs(dir.path(), Options::default(), vfs)
                .and_then(|store| store.salvage_journals());
            if fs.injected() == 0 {
                assert_eq!(result.unwrap().len(), 1, "{context}");
                break;
            }
            // Some operations are best effort (the open's clean-ups): a
            // fault there may leave the salvage to finish.
            match &result {
                Ok(done) => assert_eq!(done.len(), 1, "{context}"),
                Err(_) => failed_runs += 1,
            }
            let places: Vec<PathBuf> = [
                dir.path().join("journal").join(&name),
                dir.path().join("journal/damaged").join(&name),
            ]
            .into_iter()
            .filter(|p| p.exists())
            .collect();
            assert_eq!(places.len(), 1, "{context}: {places:?}");
            assert_eq!(std::fs::read(&places[0]).unwrap(), bytes, "{context}");
            let store = Store::open(dir.path(), Options::default()).unwrap();
            let again = store.salvage_journals().unwrap();
            let moved = places[0].parent().unwrap().ends_with("journal");
            assert_eq!(again.len(), usize::from(moved), "{context}");
            assert!(store.damaged_journals().unwrap().is_empty(), "{context}");
            check_salvaged(&store, &context);
        }
    }
    assert!(failed_runs > 10, "{failed_runs} runs had a fault injected");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// A journal entry whose checksums hold but whose offset lies past the end
/// of its segment (crafted: a real one starts at or before it, as entries
/// are written back in segment order) is corruption naming the session,
/// the segment and the offset: never a panic, an allocation the size of
/// the offset, or a record written after a gap of zeros that every scan
/// stops at.
#[test]
fn a_journal_entry_past_the_end_of_its_segment_is_refused() {
    let dir = fast_tempdir();
    let (id, batches, copy) = journaled_session(dir.path(), options(), 2);
    let original = std::fs::read(&copy).unwrap();
    let seg = segment_file(dir.path(), &id);
    let seg_len = std::fs::metadata(&seg).unwrap().len();
    for offset in [u64::MAX - 4, 1 << 40, seg_len + 4096] {
        let scanned = sessionlog::journal::scan(&original).unwrap();
        let last = *scanned.entries.iter().rfind(|e| e.session == id).unwrap();
        let crafted = sessionlog::journal::Entry { offset, ..last };
        let mut bytes = original[..sessionlog::journal::HEADER_LEN].to_vec();
        crafted.encode(&mut bytes);
        bytes.resize(original.len(), 0);
        std::fs::write(&copy, &bytes).unwrap();
        // The open's best-effort replay keeps the file it cannot replay.
        let b = Store::open(dir.path(), Options::default()).unwrap();
        assert!(
            copy.exists(),
            "offset {offset}: the refused journal is kept"
        );
        match b.append(&id, &batches[2]) {
            Err(sessionlog::store::Error::Corrupt {
                session,
                segment,
                offset: at,
                reason,
            }) => {
                assert_eq!(session, id);
                assert_eq!(segment, seg);
                assert_eq!(at, offset);
                assert!(reason.contains("past the end of the segment"), "{reason}");
            }
            other => panic!("offset {offset}: expected Corrupt, got {other:?}"),
        }
        assert_eq!(b.read_from(&id, 0).unwrap(), batches[..2].concat());
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), seg_len);
        b.close().unwrap();
    }
}

/// A handle's records can lie in several journal files, whose names are
/// random numbers: replay writes a session's entries back in segment
/// order across all of them, so a segment whose lost writes took its
/// length with them (no preallocation) gets every record back, whichever
/// file the directory lists first.
#[test]
fn entries_split_across_journal_files_are_written_back_in_segment_order() {
    use sessionlog::journal::{Entry, HEADER_LEN, JournalHeader, scan};
    for later_in_first in [true, false] {
        let dir = fast_tempdir();
        let opts = Options {
            preallocate: 0,
            ..options()
        };
        let (id, batches, copy) = journaled_session(dir.path(), opts, 6);
        let original = std::fs::read(&copy).unwrap();
        std::fs::remove_file(&copy).unwrap();
        let scanned = scan(&original).unwrap();
        let mine: Vec<Entry<'_>> = scanned
            .entries
            .iter()
            .copied()
            .filter(|e| e.session == id)
            .collect();
        assert!(mine.len() >= 4, "{} entries", mine.len());
        // Lose every segment write after the first batch, length included.
        let seg = segment_file(dir.path(), &id);
        let keep = mine[1].offset;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(keep)
            .unwrap();
        // The entries from the second batch on, split in two files.
        let (early, late) = mine[1..].split_at(mine.len() / 2);
        let halves = if later_in_first {
            [late, early]
        } else {
            [early, late]
        };
        for (number, half) in [0x1001u64, 0x1002].into_iter().zip(halves) {
            let mut bytes = JournalHeader {
                number,
                store_id: scanned.header.store_id,
            }
            .encode()
            .to_vec();
            for e in half {
                e.encode(&mut bytes);
            }
            bytes.resize(original.len().max(bytes.len() + HEADER_LEN), 0);
            let name = format!("{number:016x}.wal");
            std::fs::write(dir.path().join("journal").join(name), bytes).unwrap();
        }
        let b = Store::open(dir.path(), Options::default()).unwrap();
        assert_eq!(
            b.read_from(&id, 0).unwrap(),
            batches[..6].concat(),
            "later half first: {later_in_first}"
        );
        let left: Vec<_> = journal_files(dir.path())
            .into_iter()
            .filter(|n| n.starts_with("00000000000010"))
            .collect();
        assert!(left.is_empty(), "replayed files are removed: {left:?}");
        b.close().unwrap();
    }
}

/// A damaged entry (its CRC fails) followed by valid ones is not the end
/// of the journal: an entry is acknowledged only after a sync that covered
/// it, so a bit flip in an acknowledged entry followed by more acknowledged
/// ones must not read as a torn tail. Before, the scan stopped there, the
/// writable open replayed the entries before it and removed the file: the
/// acknowledged batches after the damage, which only the journal held
/// after a power loss, were gone without a word. The file is now refused
/// (reported, kept, sessions refused until `salvage_journals`).
#[test]
fn a_damaged_entry_followed_by_valid_ones_is_refused_not_read_as_the_end() {
    let dir = fast_tempdir();
    let opts = Options {
        journal_file_size: 64 << 10,
        ..options()
    };
    let a = Store::open(dir.path(), opts).unwrap();
    let (s0, b0) = plan(0);
    let (s1, b1) = plan(1);
    for id in [&s0, &s1] {
        a.create(SessionHeader::new(id, 0)).unwrap();
    }
    for b in &b0[..6] {
        a.append(&s0, b).unwrap();
    }
    a.append(&s1, &b1[0]).unwrap();
    a.append(&s1, &b1[1]).unwrap();
    let orphan = orphan_copy(dir.path(), "0000000000000abe");
    a.close().unwrap();
    let mut bytes = std::fs::read(&orphan).unwrap();
    let entries = entry_offsets(&bytes);
    assert_eq!(entries.len(), 6, "five of s0, one of s1");
    // s0's second entry: a bit flipped inside its payload (bit rot of a
    // synced, acknowledged entry); four valid entries follow it.
    bytes[entries[1] + 20] ^= 0x01;
    std::fs::write(&orphan, &bytes).unwrap();
    // Power loss: the segment writes only the journal made durable.
    for id in [&s0, &s1] {
        lose_unsynced_segment_writes(dir.path(), id);
        let sdir = Store::session_dir_in(dir.path(), id).unwrap();
        assert!(common::checkpoint_place(&sdir).is_some());
        common::remove_checkpoint(&sdir);
    }
    let b = Store::open(dir.path(), Options::default()).unwrap();
    assert!(
        orphan.exists(),
        "a journal with unreadable acknowledged entries is kept"
    );
    let damaged = b.damaged_journals().unwrap();
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(damaged[0].path, orphan);
    assert_eq!(damaged[0].offset, entries[1] as u64, "{damaged:?}");
    // s1, whose one entry lies past the damage, is refused, not loaded short.
    match b.append(&s1, &b1[1]) {
        Err(sessionlog::store::Error::Corrupt {
            session, segment, ..
        }) => {
            assert_eq!(session, s1);
            assert_eq!(segment, orphan);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Salvage writes back what can be read and keeps the file.
    let done = b.salvage_journals().unwrap();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].entries, 1);
    assert_eq!(done[0].end, entries[1] as u64);
    assert!(done[0].unread > 0);
    assert!(
        dir.path()
            .join("journal/damaged/0000000000000abe.wal")
            .exists()
    );
    assert_eq!(b.read_from(&s0, 0).unwrap(), b0[..2].concat());
}

/// A session id longer than the 65,535 bytes an entry's u16 id length
/// holds (ids may be as long as a `HEADER` allows) is never journaled cut.
/// Before, the entry was written with the length cut to 16 bits: it parsed
/// as an entry of another (nonexistent) session, the writable open removed
/// the file, and after a power loss the acknowledged batches were lost
/// (3 of 9 events left). Such a session's records are now synced in their
/// segment, as a record too large for the journal is.
#[test]
fn a_session_with_an_id_too_long_for_an_entry_keeps_its_batches() {
    let dir = fast_tempdir();
    let a = Store::open(dir.path(), options()).unwrap();
    let id = "x".repeat(70_000);
    let (_, batches) = plan(0);
    a.create(SessionHeader::new(&id, 0)).unwrap();
    for b in &batches[..3] {
        a.append(&id, b).unwrap();
    }
    let orphan = orphan_copy(dir.path(), "0000000000000abf");
    a.close().unwrap();
    let bytes = std::fs::read(&orphan).unwrap();
    let journaled = sessionlog::journal::scan(&bytes).unwrap().entries;
    for e in &journaled {
        assert_eq!(e.session.len(), id.len(), "an entry names another session");
    }
    if !journaled.is_empty() {
        // Power loss before the segment's own sync: the journal brings the
        // batches back.
        lose_unsynced_segment_writes(dir.path(), &id);
        let sdir = Store::session_dir_in(dir.path(), &id).unwrap();
        common::remove_checkpoint(&sdir);
    }
    let b = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(b.read_from(&id, 0).unwrap(), batches[..3].concat());
    assert!(!orphan.exists(), "the replayed journal is removed");
    b.verify(&id).unwrap();
}

/// `damaged_journals` reads live journals too: a read that copied an entry
/// while its owner was still writing it, and the next entry once written,
/// sees a damaged entry with a valid one after it. That is not damage: the
/// verdict stands only if a second read agrees.
#[test]
fn a_live_journal_read_mid_write_is_not_reported_damaged() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = fast_tempdir();
    let a = Store::open(dir.path(), options()).unwrap();
    let (id, batches) = plan(0);
    a.create(SessionHeader::new(&id, 0)).unwrap();
    for b in &batches[..4] {
        a.append(&id, b).unwrap();
    }
    let reads = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = reads.clone();
    let vfs = std::sync::Arc::new(hooked_fs::HookedFs {
        before_read_file: Some(Box::new(move |p| {
            if p.extension().is_none_or(|e| e != "wal") {
                return;
            }
            let mut bytes = std::fs::read(p).unwrap();
            let entries = entry_offsets(&bytes);
            let second = entries[1];
            let saved = bytes[second + 8..entries[2]].to_vec();
            match seen.fetch_add(1, Ordering::SeqCst) {
                // The first read: the second entry's payload not written
                // yet, the third one already there.
                0 => {
                    bytes[second + 8..entries[2]].fill(0);
                    std::fs::write(p, &bytes).unwrap();
                    std::fs::write(p.with_extension("saved"), saved).unwrap();
                }
                // The owner has finished it by the next read.
                1 => {
                    let saved = std::fs::read(p.with_extension("saved")).unwrap();
                    bytes[second + 8..entries[2]].copy_from_slice(&saved);
                    std::fs::write(p, &bytes).unwrap();
                    std::fs::remove_file(p.with_extension("saved")).unwrap();
                }
                _ => {}
            }
        })),
        ..hooked_fs::HookedFs::default()
    });
    let reader = Store::open_read_only_with_vfs(dir.path(), vfs).unwrap();
    assert_eq!(reader.damaged_journals().unwrap(), Vec::new());
    assert_eq!(reads.load(Ordering::SeqCst), 2, "read twice");
    a.append(&id, &batches[4]).unwrap();
    a.close().unwrap();
}

/// A salvage and a writer of the same handle, racing for a session of the
/// damaged journal (F60). The writer holds the session (its slot, its
/// lock) and is about to read the orphaned journals when the salvage takes
/// the file exclusively and then asks whether this handle writes the
/// session. Before, the salvage waited for the session's slot while the
/// writer polled for the journal's replay lock, which this very handle
/// held exclusively: both waited forever. Now the salvage lets the file go
/// and takes it again once the session is free.
#[test]
fn a_salvage_and_a_writer_of_one_handle_do_not_wait_for_each_other() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    let dir = fast_tempdir();
    store_with_a_damaged_journal(dir.path());
    let (s0, b0) = plan(0);
    let journal_dir = dir.path().join("journal");

    // After `armed`, the first listing of journal/ (the writer's, its
    // session held) waits for `go`; the second (the salvage's) says so.
    let armed = Arc::new(AtomicUsize::new(0));
    let (gated_tx, gated_rx) = mpsc::channel::<()>();
    let (listed_tx, listed_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (gated_tx, listed_tx, go_rx) = (
        Mutex::new(gated_tx),
        Mutex::new(listed_tx),
        Mutex::new(go_rx),
    );
    let fs = hooked_fs::HookedFs {
        before_read_dir: Some(Box::new({
            let (armed, journal_dir) = (armed.clone(), journal_dir.clone());
            move |p| {
                if p != journal_dir || armed.load(Ordering::SeqCst) == 0 {
                    return Ok(());
                }
                match armed.fetch_add(1, Ordering::SeqCst) {
                    1 => {
                        gated_tx.lock().unwrap().send(()).unwrap();
                        let _ = go_rx.lock().unwrap().recv();
                    }
                    2 => listed_tx.lock().unwrap().send(()).unwrap(),
                    _ => {}
                }
                Ok(())
            }
        })),
        ..hooked_fs::HookedFs::default()
    };
    let b = Arc::new(Store::open_with_vfs(dir.path(), Options::default(), Arc::new(fs)).unwrap());
    armed.store(1, Ordering::SeqCst);

    let (done_tx, done_rx) = mpsc::channel::<String>();
    let writer = {
        let (b, s0, batch, done) = (b.clone(), s0.clone(), b0[6].clone(), done_tx.clone());
        std::thread::spawn(move || {
            let r = b.append(&s0, &batch);
            done.send(format!("writer: {r:?}")).unwrap();
        })
    };
    gated_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the writer lists the journals");
    let salvage = {
        let (b, done) = (b.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let r = b.salvage_journals();
            done.send(format!("salvage: {r:?}")).unwrap();
        })
    };
    listed_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the salvage lists the journals");
    // The salvage takes the file and reaches the session meanwhile.
    std::thread::sleep(Duration::from_millis(300));
    go_tx.send(()).unwrap();
    let mut results = Vec::new();
    for _ in 0..2 {
        match done_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(r) => results.push(r),
            Err(_) => panic!("the salvage and the writer wait for each other: {results:?}"),
        }
    }
    writer.join().unwrap();
    salvage.join().unwrap();
    // Whatever the order, nothing acknowledged is lost: what the salvage
    // left (the writer had the file first) a second salvage does.
    b.salvage_journals().unwrap();
    let all = b.read_from(&s0, 0).unwrap();
    let next = if all == b0[..7].concat() { 7 } else { 6 };
    assert_eq!(all, b0[..next].concat(), "{results:?}");
    b.append(&s0, &b0[next])
        .unwrap_or_else(|e| panic!("{results:?}: {e}"));
    b.verify(&s0).unwrap();
}

/// A salvage racing a writer of another handle (another process) that
/// took one of the damaged file's sessions just before the salvage reached
/// it, and lists the journals only `hold` later. Returns the writer's
/// append, the salvage's report, the writer's store and the journal's path.
#[allow(clippy::type_complexity)]
fn salvage_racing_a_new_writer(
    dir: &Path,
    hold: Duration,
) -> (
    sessionlog::store::Result<()>,
    Vec<sessionlog::store::JournalSalvage>,
    Store,
    PathBuf,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    let (orphan, _, _) = store_with_a_damaged_journal(dir);
    let (s0, b0) = plan(0);
    let journal_dir = dir.join("journal");

    // Once armed, the writer's next listing of journal/ (it holds s0's
    // lock then) waits for `go`.
    let armed = Arc::new(AtomicBool::new(false));
    let (gated_tx, gated_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (gated_tx, go_rx) = (Mutex::new(gated_tx), Mutex::new(go_rx));
    let fs = hooked_fs::HookedFs {
        before_read_dir: Some(Box::new({
            let (armed, journal_dir) = (armed.clone(), journal_dir.clone());
            move |p| {
                if p == journal_dir && armed.swap(false, Ordering::SeqCst) {
                    gated_tx.lock().unwrap().send(()).unwrap();
                    let _ = go_rx.lock().unwrap().recv();
                }
                Ok(())
            }
        })),
        ..hooked_fs::HookedFs::default()
    };
    let w = Arc::new(Store::open_with_vfs(dir, Options::default(), Arc::new(fs)).unwrap());
    armed.store(true, Ordering::SeqCst);
    let writer = {
        let (w, s0, batch) = (w.clone(), s0.clone(), b0[6].clone());
        std::thread::spawn(move || w.append(&s0, &batch))
    };
    gated_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the writer lists the journals");
    let salvage = {
        let dir = dir.to_owned();
        std::thread::spawn(move || {
            Store::open(&dir, Options::default())
                .unwrap()
                .salvage_journals()
        })
    };
    std::thread::sleep(hold);
    go_tx.send(()).unwrap();
    let written = writer.join().unwrap();
    let salvaged = salvage.join().unwrap().unwrap();
    let Ok(w) = Arc::try_unwrap(w) else {
        panic!("the writer's thread is done")
    };
    (written, salvaged, w, orphan)
}

/// The writer lists the journals 300 ms after it took the session, inside
/// the salvage's wait. Before, the salvage skipped the session ("another
/// handle writes it", taken to mean before the damage, so replayed then)
/// and moved the file to `journal/damaged/`; the writer then found no
/// journal and loaded the session without the five batches only the file
/// held: acknowledged batches gone, and the next append refused as not
/// contiguous (or, one batch on, written where they belong). Now the file
/// moves only once the session's records are in place: the writer reads
/// it, refuses the damage and lets the session go, and the salvage writes
/// them back.
#[test]
fn a_salvage_never_moves_a_file_a_new_writer_has_not_read() {
    let dir = fast_tempdir();
    let (written, salvaged, w, _) =
        salvage_racing_a_new_writer(dir.path(), Duration::from_millis(300));
    let (s0, b0) = plan(0);
    assert!(
        matches!(written, Err(sessionlog::store::Error::Corrupt { .. })),
        "the writer reads the damaged file: {written:?}"
    );
    assert_eq!(salvaged.len(), 1, "{salvaged:?}");
    assert!(salvaged[0].moved, "{salvaged:?}");
    assert!(
        salvaged[0]
            .replayed
            .iter()
            .any(|(id, n)| id == &s0 && *n == 5),
        "{salvaged:?}"
    );
    assert_eq!(w.read_from(&s0, 0).unwrap(), b0[..6].concat());
    w.append(&s0, &b0[6]).unwrap();
    w.verify(&s0).unwrap();
}

/// The same writer, holding the session past the salvage's wait: the file
/// stays in `journal/`, the report says why and names the session, the
/// writer then refuses the damage, and the next salvage finishes the job.
#[test]
fn a_salvage_leaves_the_file_while_a_new_writer_holds_its_session() {
    let dir = fast_tempdir();
    let (written, salvaged, w, orphan) =
        salvage_racing_a_new_writer(dir.path(), Duration::from_secs(7));
    let (s0, b0) = plan(0);
    assert!(
        matches!(written, Err(sessionlog::store::Error::Corrupt { .. })),
        "{written:?}"
    );
    assert_eq!(salvaged.len(), 1, "{salvaged:?}");
    let s = &salvaged[0];
    assert!(!s.moved, "{salvaged:?}");
    assert_eq!(s.kept, orphan);
    assert!(orphan.exists());
    assert!(
        s.skipped
            .iter()
            .any(|(id, why)| id == &s0 && why.contains("not in place")),
        "{salvaged:?}"
    );
    let again = w.salvage_journals().unwrap();
    assert!(again.len() == 1 && again[0].moved, "{again:?}");
    assert!(!orphan.exists());
    assert_eq!(w.read_from(&s0, 0).unwrap(), b0[..6].concat());
    w.append(&s0, &b0[6]).unwrap();
    w.verify(&s0).unwrap();
}
