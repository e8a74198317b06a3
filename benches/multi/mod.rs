//! The many-sessions table of the comparison harness (issue 18): durable
//! appends of many sessions from many threads, sessionlog against two I/O
//! floors and SQLite, in one run.
//!
//! Workload: S sessions, W writer threads; thread t owns sessions
//! t, t + W, t + 2W, .. and appends to them in turn, one batch at a time,
//! until the cell's time is up. A batch is 16 events of ~150 B (a session's
//! first batch opens a turn and a step, the rest are `assistant/chunk`
//! events streaming text), so the figures are those of many agents
//! streaming at once. Every batch must be durable when its call returns.
//! Every session's first batch is appended before timing (its files are
//! created then), so a cell measures the steady state of sessions that
//! are already streaming; sessionlog keeps every session open
//! (`max_open_sessions` at least the session count) as the floors keep
//! every file open.
//!
//! Engines:
//! - sessionlog `Durability::Sync` (one `Store` shared by the threads);
//! - sessionlog `Durability::Sync` with `Options::journal`: the same, each
//!   batch acknowledged by a shared sync of the handle's journal (the
//!   segments synced in the background);
//! - floor "per file": the batch's JSONL bytes, precomputed, one `pwrite`
//!   into the session's own file and one `fdatasync` of that file. Floor
//!   files are filled with zeros and synced before timing and overwritten
//!   round-robin (64 KiB per session, 64 MiB shared), because sessionlog
//!   writes into pre-zeroed space too: a floor that grew its file would
//!   pay a journal commit for the new size at every sync;
//! - "group syncfs": per-session files as in "per file", made durable by one
//!   `syncfs` per group (leader/follower as below) instead of one
//!   `fdatasync` each: a candidate design for a cross-session group commit
//!   without a shared journal, measured rather than argued;
//! - floor "shared log": the same bytes written to one file shared by every
//!   thread (offsets handed out under a lock), then group commit: one
//!   thread `fdatasync`s for every batch written before its call began, the
//!   others wait for it (a leader/follower commit, as a database's WAL);
//! - floor "shared log + file per session": what the journal's design
//!   (format-spec section 11) costs in I/O alone: each batch's bytes
//!   written into its session's pre-zeroed file (as a segment write) and
//!   then into the shared log under the same group commit (as a journal
//!   entry); the session files are never synced (sessionlog syncs its
//!   segments in the background, which this floor leaves out). Against
//!   the shared-log floor it says what the second write costs; against
//!   the journal cell, what the encode, the fold and the checks cost;
//! - SQLite WAL `synchronous=FULL`, one connection per thread, one
//!   transaction per batch (only at 8 writers: its one write lock makes more
//!   threads only queue).
//!
//! Acknowledgement latency is the time from the call (write) to its return
//! (durable), p50 and p99 over every batch of the cell.

use rusqlite::{Connection, params};
use sessionlog::build;
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Durability, Options, Store};
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Events per batch.
pub const BATCH: usize = 16;

/// The (writers, sessions) rows of the table.
pub const ROWS: [(usize, usize); 6] = [
    (8, 256),
    (64, 256),
    (256, 256),
    (8, 4096),
    (64, 4096),
    (256, 4096),
];

/// The engines of the table, in column order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// sessionlog, `Durability::Sync`.
    Sync,
    /// sessionlog, `Durability::Sync` with the store-wide journal.
    Journal,
    /// One file per session, write + fdatasync.
    PerFile,
    /// One shared log, group commit.
    SharedLog,
    /// One file per session, group commit by one `syncfs` per group.
    Syncfs,
    /// One shared log, group commit, each batch also written into a file
    /// per session (the journal's two writes, nothing else).
    TwoWrites,
    /// SQLite WAL, synchronous=FULL.
    Sqlite,
}

impl Engine {
    pub const ALL: [Engine; 7] = [
        Engine::Sync,
        Engine::Journal,
        Engine::PerFile,
        Engine::SharedLog,
        Engine::TwoWrites,
        Engine::Syncfs,
        Engine::Sqlite,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Sync => "sessionlog Sync",
            Engine::Journal => "sessionlog Sync + journal",
            Engine::PerFile => "floor: file per session, pwrite+fdatasync",
            Engine::SharedLog => "floor: one shared log, group commit",
            Engine::Syncfs => "file per session, group syncfs",
            Engine::TwoWrites => "floor: shared log + file per session",
            Engine::Sqlite => "SQLite WAL FULL",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Engine::Sync => "sync",
            Engine::Journal => "journal",
            Engine::PerFile => "perfile",
            Engine::SharedLog => "shared",
            Engine::Syncfs => "syncfs",
            Engine::TwoWrites => "twowrites",
            Engine::Sqlite => "sqlite",
        }
    }

    /// Whether the engine runs at `writers` threads.
    pub fn runs_at(self, writers: usize) -> bool {
        self != Engine::Sqlite || writers <= 8
    }
}

/// One cell's outcome.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    pub events: u64,
    pub secs: f64,
    /// Acknowledgement latencies, µs, sorted.
    pub lat_us: Vec<u32>,
}

impl Cell {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.secs
    }

    pub fn percentile(&self, p: f64) -> f64 {
        if self.lat_us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.lat_us.len() - 1) as f64 * p).round() as usize;
        f64::from(self.lat_us[i])
    }
}

/// The events of every batch a session may append: batch k of a session
/// holds seqs 16k .. 16k+15. The same events for every session (ids
/// differ), built once.
pub struct Batches {
    /// `events[k]` = batch k.
    events: Vec<Vec<OwnedEvent>>,
    /// The JSONL bytes of batch k (for the floors and SQLite rows).
    jsonl: Vec<Vec<u8>>,
}

impl Batches {
    pub fn new(count: usize) -> Batches {
        let piece = "streamed text of a reply, a few words at a time, as a model writes it out";
        let mut events = Vec::with_capacity(count);
        let mut jsonl = Vec::with_capacity(count);
        for k in 0..count {
            let first = (k * BATCH) as u64;
            let batch: Vec<OwnedEvent> = (0..BATCH as u64)
                .map(|i| {
                    let seq = first + i;
                    let time = 1_700_000_000_000 + seq as i64;
                    match seq {
                        0 => build::turn_start(seq, time, 1),
                        1 => build::step_start(seq, time, 1, 1),
                        _ => build::text_chunk(seq, time, 1, 1, piece),
                    }
                })
                .collect();
            let mut bytes = Vec::new();
            for e in &batch {
                bytes.extend_from_slice(e.to_json().as_bytes());
                bytes.push(b'\n');
            }
            events.push(batch);
            jsonl.push(bytes);
        }
        Batches { events, jsonl }
    }

    fn len(&self) -> usize {
        self.events.len()
    }

    /// Mean JSONL bytes per event.
    pub fn bytes_per_event(&self) -> f64 {
        let b: usize = self.jsonl.iter().map(Vec::len).sum();
        b as f64 / (self.len() * BATCH) as f64
    }
}

/// Runs `work(thread, session, batch index)` on `writers` threads over
/// `sessions` sessions until `cap` passes or a session runs out of
/// batches; returns events appended, seconds and sorted latencies.
fn drive(
    writers: usize,
    sessions: usize,
    batches: &Batches,
    cap: Duration,
    work: &(dyn Fn(usize, usize, usize) -> Res<()> + Sync),
) -> Res<Cell> {
    // Every session's first batch is setup, untimed: the steady state of
    // many streaming sessions is measured, not the creation of their files.
    std::thread::scope(|scope| -> Res<()> {
        let handles: Vec<_> = (0..writers)
            .map(|t| {
                scope.spawn(move || -> Res<()> {
                    for s in (t..sessions).step_by(writers) {
                        work(t, s, 0)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("writer thread")?;
        }
        Ok(())
    })?;
    let start = Instant::now();
    let results: Vec<Res<(u64, Vec<u32>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|t| {
                scope.spawn(move || -> Res<(u64, Vec<u32>)> {
                    let mine: Vec<usize> = (t..sessions).step_by(writers).collect();
                    let mut lat = Vec::new();
                    let mut events = 0u64;
                    'outer: for k in 1..batches.len() {
                        for &s in &mine {
                            if start.elapsed() > cap {
                                break 'outer;
                            }
                            let t0 = Instant::now();
                            work(t, s, k)?;
                            lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                            events += BATCH as u64;
                        }
                    }
                    Ok((events, lat))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread"))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut cell = Cell {
        secs,
        ..Cell::default()
    };
    for r in results {
        let (events, lat) = r?;
        cell.events += events;
        cell.lat_us.extend(lat);
    }
    cell.lat_us.sort_unstable();
    Ok(cell)
}

fn sessionlog_cell(
    writers: usize,
    sessions: usize,
    b: &Batches,
    dir: &Path,
    cap: Duration,
    journal: bool,
) -> Res<Cell> {
    // Every session stays open, as the floors keep every file open (the
    // default handle cache of 512 would reopen a session on each batch).
    let options = Options {
        durability: Durability::Sync,
        journal,
        max_open_sessions: sessions.max(Options::default().max_open_sessions),
        ..Options::default()
    };
    let store = Store::open(dir, options)?;
    let ids: Vec<String> = (0..sessions).map(|s| format!("s{s:05}")).collect();
    for id in &ids {
        store.create(SessionHeader::new(id.clone(), 1_700_000_000_000))?;
    }
    let cell = drive(writers, sessions, b, cap, &|_, s, k| {
        let events: Vec<Event<'_>> = b.events[k].iter().map(|e| e.borrowed()).collect();
        store.append(&ids[s], &events)?;
        Ok(())
    })?;
    store.close()?;
    Ok(cell)
}

/// Bytes written (zeros, synced) into each floor file before timing; the
/// floors then write inside them, wrapping to offset 0 at the end.
const SESSION_REGION: u64 = 64 << 10;
const SHARED_REGION: u64 = 64 << 20;

/// A file pre-filled with zeros that a floor overwrites round-robin.
/// sessionlog writes into pre-zeroed (written, not fallocated) space, so
/// its `fdatasync` flushes data only; a floor that grew its file would pay
/// a journal commit for the new size on every sync and be no floor.
struct Region {
    file: File,
    next: u64,
    size: u64,
}

impl Region {
    fn create(path: &Path, size: u64) -> Res<Region> {
        let mut file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(path)?;
        let zeros = vec![0u8; 1 << 20];
        let mut left = size;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            file.write_all(&zeros[..n])?;
            left -= n as u64;
        }
        Ok(Region {
            file,
            next: 0,
            size,
        })
    }

    /// Where `len` bytes go next, wrapping at the end of the region.
    fn claim(&mut self, len: u64) -> u64 {
        if self.next + len > self.size {
            self.next = 0;
        }
        let at = self.next;
        self.next += len;
        at
    }

    fn write(&mut self, bytes: &[u8]) -> Res<()> {
        let at = self.claim(bytes.len() as u64);
        self.file.write_all_at(bytes, at)?;
        Ok(())
    }
}

/// Makes everything written so far under `dir` durable (setup, untimed).
fn sync_setup(dir: &Path) -> Res<()> {
    use std::os::fd::AsRawFd;
    let d = File::open(dir)?;
    // SAFETY: syncfs takes any open descriptor of the file system.
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// One pre-zeroed file per session, created and synced before timing.
fn session_files(dir: &Path, sessions: usize) -> Res<Vec<Mutex<Region>>> {
    let files = (0..sessions)
        .map(|s| {
            Region::create(&dir.join(format!("s{s:05}.jsonl")), SESSION_REGION).map(Mutex::new)
        })
        .collect::<Res<_>>()?;
    sync_setup(dir)?;
    Ok(files)
}

fn per_file_cell(
    writers: usize,
    sessions: usize,
    b: &Batches,
    dir: &Path,
    cap: Duration,
) -> Res<Cell> {
    let files = session_files(dir, sessions)?;
    drive(writers, sessions, b, cap, &|_, s, k| {
        let mut f = files[s].lock().expect("file lock");
        f.write(&b.jsonl[k])?;
        f.file.sync_data()?;
        Ok(())
    })
}

/// A leader/follower group commit over one file: a batch is durable once a
/// `sync_data` that began after its write completed has returned. The end
/// of a sync wakes only the writers it covers and one of the later ones to
/// lead the next, each parked thread by name, and a covered writer returns
/// on an atomic copy of the synced count without taking the lock again (as
/// the journal does, `src/engine/journal.rs`): a writer woken only to sleep
/// again, or to queue for the lock, would cost the floor for nothing.
struct GroupCommit {
    state: Mutex<CommitState>,
    /// `CommitState::synced`, stored before the writers it covers wake.
    synced_mark: AtomicU64,
}

#[derive(Default)]
struct CommitState {
    /// Writes completed so far (a write's ticket is this count after it).
    written: u64,
    /// Every write with a ticket up to this is durable.
    synced: u64,
    syncing: bool,
    /// Parked writers: ticket and thread.
    waiting: Vec<(u64, Thread)>,
}

impl GroupCommit {
    fn new() -> GroupCommit {
        GroupCommit {
            state: Mutex::new(CommitState::default()),
            synced_mark: AtomicU64::new(0),
        }
    }

    fn commit(&self, log: &Mutex<Region>, file: &File, bytes: &[u8]) -> Res<()> {
        let at = log.lock().expect("log lock").claim(bytes.len() as u64);
        file.write_all_at(bytes, at)?;
        self.wait_durable(&|| file.sync_data())
    }

    /// Waits until a `sync` that began after the caller's write returned.
    fn wait_durable(&self, sync: &dyn Fn() -> std::io::Result<()>) -> Res<()> {
        let mut st = self.state.lock().expect("commit lock");
        st.written += 1;
        let ticket = st.written;
        loop {
            if st.synced >= ticket {
                return Ok(());
            }
            if !st.syncing {
                st.syncing = true;
                let target = st.written;
                drop(st);
                let r = sync();
                st = self.state.lock().expect("commit lock");
                st.syncing = false;
                let mut wake = Vec::new();
                if r.is_ok() {
                    st.synced = target;
                    self.synced_mark.store(target, Ordering::Release);
                    st.waiting.retain(|(t, th)| {
                        if *t <= target {
                            wake.push(th.clone());
                        }
                        *t > target
                    });
                    let first = (0..st.waiting.len()).min_by_key(|&i| st.waiting[i].0);
                    if let Some(i) = first {
                        wake.push(st.waiting.swap_remove(i).1);
                    }
                } else {
                    // Every waiter retries the sync (and meets the error).
                    wake.extend(st.waiting.drain(..).map(|(_, th)| th));
                }
                drop(st);
                wake.into_iter().for_each(|th| th.unpark());
                r?;
                return Ok(());
            }
            st.waiting.push((ticket, std::thread::current()));
            drop(st);
            std::thread::park();
            if self.synced_mark.load(Ordering::Acquire) >= ticket {
                return Ok(());
            }
            st = self.state.lock().expect("commit lock");
            let me = std::thread::current().id();
            st.waiting.retain(|(_, th)| th.id() != me);
        }
    }
}

/// The shared log's group commit; with `session_files_too`, each batch is
/// written into its session's file first: the I/O of a journaled append,
/// without its CPU.
fn shared_log_cell(
    writers: usize,
    sessions: usize,
    b: &Batches,
    dir: &Path,
    cap: Duration,
    session_files_too: bool,
) -> Res<Cell> {
    let files = if session_files_too {
        session_files(dir, sessions)?
    } else {
        Vec::new()
    };
    let region = Region::create(&dir.join("shared.log"), SHARED_REGION)?;
    sync_setup(dir)?;
    let file = region.file.try_clone()?;
    let log = Mutex::new(region);
    let gc = GroupCommit::new();
    drive(writers, sessions, b, cap, &|_, s, k| {
        if let Some(f) = files.get(s) {
            f.lock().expect("file lock").write(&b.jsonl[k])?;
        }
        gc.commit(&log, &file, &b.jsonl[k])
    })
}

fn syncfs_cell(
    writers: usize,
    sessions: usize,
    b: &Batches,
    dir: &Path,
    cap: Duration,
) -> Res<Cell> {
    use std::os::fd::AsRawFd;
    let files = session_files(dir, sessions)?;
    let d = File::open(dir)?;
    let gc = GroupCommit::new();
    let syncfs = || {
        // SAFETY: syncfs takes any open descriptor of the file system.
        if unsafe { libc::syncfs(d.as_raw_fd()) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    drive(writers, sessions, b, cap, &|_, s, k| {
        files[s].lock().expect("file lock").write(&b.jsonl[k])?;
        gc.wait_durable(&syncfs)
    })
}

fn sqlite_cell(
    writers: usize,
    sessions: usize,
    b: &Batches,
    dir: &Path,
    cap: Duration,
) -> Res<Cell> {
    let path = dir.join("sessions.db");
    {
        let c = Connection::open(&path)?;
        c.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE events (session TEXT NOT NULL, seq INTEGER NOT NULL,
               body TEXT NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID;",
        )?;
    }
    let conns: Vec<Mutex<Connection>> = (0..writers)
        .map(|_| -> Res<Mutex<Connection>> {
            let c = Connection::open(&path)?;
            c.execute_batch("PRAGMA synchronous=FULL;")?;
            c.busy_timeout(Duration::from_secs(60))?;
            Ok(Mutex::new(c))
        })
        .collect::<Res<_>>()?;
    let ids: Vec<String> = (0..sessions).map(|s| format!("s{s:05}")).collect();
    drive(writers, sessions, b, cap, &|t, s, k| {
        let mut c = conns[t].lock().expect("connection");
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            let mut ins = tx.prepare_cached("INSERT INTO events VALUES (?1, ?2, ?3)")?;
            for (i, line) in b.jsonl[k]
                .split(|&c| c == b'\n')
                .filter(|l| !l.is_empty())
                .enumerate()
            {
                let seq = (k * BATCH + i) as i64;
                ins.execute(params![ids[s], seq, std::str::from_utf8(line)?])?;
            }
        }
        tx.commit()?;
        Ok(())
    })
}

/// Runs one cell in a fresh directory `dir` (removed after).
pub fn run(
    engine: Engine,
    writers: usize,
    sessions: usize,
    b: &Batches,
    dir: &Path,
    cap: Duration,
) -> Res<Cell> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    let cell = match engine {
        Engine::Sync => sessionlog_cell(writers, sessions, b, dir, cap, false),
        Engine::Journal => sessionlog_cell(writers, sessions, b, dir, cap, true),
        Engine::PerFile => per_file_cell(writers, sessions, b, dir, cap),
        Engine::SharedLog => shared_log_cell(writers, sessions, b, dir, cap, false),
        Engine::Syncfs => syncfs_cell(writers, sessions, b, dir, cap),
        Engine::TwoWrites => shared_log_cell(writers, sessions, b, dir, cap, true),
        Engine::Sqlite => sqlite_cell(writers, sessions, b, dir, cap),
    }?;
    fs::remove_dir_all(dir)?;
    Ok(cell)
}

/// Whether `SESSIONLOG_BENCH_MULTI_ENGINES` (short names, comma-separated;
/// for profiling one engine) leaves `engine` in; all are in without it.
fn wanted(engine: Engine) -> bool {
    std::env::var("SESSIONLOG_BENCH_MULTI_ENGINES")
        .map_or(true, |v| v.split(',').any(|e| e == engine.short()))
}

/// Runs the table (engine order rotated per row) and returns it as
/// markdown; progress on stderr.
pub fn table(root: &Path, cap: Duration, rows: &[(usize, usize)]) -> Res<String> {
    let b = Batches::new(4096);
    let mut out = String::new();
    use std::fmt::Write as _;
    writeln!(
        out,
        "Batches of {BATCH} events ({:.0} B/event as JSONL), every append durable on return; events/s (p50 / p99 acknowledgement latency, µs). Each cell runs {:.1} s; floors write into pre-zeroed files (see benches/multi/mod.rs).\n",
        b.bytes_per_event(),
        cap.as_secs_f64()
    )?;
    writeln!(
        out,
        "| writers | sessions | {} | Sync / shared-log floor | journal / shared-log floor | journal / two-writes floor | Sync / per-file floor |",
        Engine::ALL.map(Engine::name).join(" | ")
    )?;
    writeln!(
        out,
        "|---|---|{}---:|---:|---:|---:|",
        "---:|".repeat(Engine::ALL.len())
    )?;
    for (ri, &(w, s)) in rows.iter().enumerate() {
        let mut cells: Vec<Option<Cell>> = vec![None; Engine::ALL.len()];
        for k in 0..Engine::ALL.len() {
            let engine = Engine::ALL[(k + ri) % Engine::ALL.len()];
            if !engine.runs_at(w) || !wanted(engine) {
                continue;
            }
            let dir = root.join(format!("multi-w{w}-s{s}-{}", engine.short()));
            let cell = run(engine, w, s, &b, &dir, cap)?;
            eprintln!(
                "writers {w:>3} sessions {s:>4} {:<42} {:>9.0} ev/s p50 {:>6.0} µs p99 {:>7.0} µs",
                engine.name(),
                cell.events_per_sec(),
                cell.percentile(0.5),
                cell.percentile(0.99)
            );
            let i = Engine::ALL
                .iter()
                .position(|e| *e == engine)
                .expect("engine");
            cells[i] = Some(cell);
        }
        let rate = |e: Engine| {
            cells[Engine::ALL.iter().position(|x| *x == e).expect("engine")]
                .as_ref()
                .map(Cell::events_per_sec)
        };
        let shown: Vec<String> = cells
            .iter()
            .map(|c| match c {
                Some(c) => format!(
                    "{:.0}k ({:.0} / {:.0})",
                    c.events_per_sec() / 1e3,
                    c.percentile(0.5),
                    c.percentile(0.99)
                ),
                None => "-".into(),
            })
            .collect();
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        writeln!(
            out,
            "| {w} | {s} | {} | {} | {} | {} | {} |",
            shown.join(" | "),
            ratio(rate(Engine::Sync), rate(Engine::SharedLog)),
            ratio(rate(Engine::Journal), rate(Engine::SharedLog)),
            ratio(rate(Engine::Journal), rate(Engine::TwoWrites)),
            ratio(rate(Engine::Sync), rate(Engine::PerFile)),
        )?;
    }
    Ok(out)
}
