//! Comparison harness (issue 5): sessionlog against SQLite (the harness's
//! schema 4), JSONL and a raw-I/O floor, on the same workload, in one run.
//!
//! Run with `cargo bench --bench compare`. It is a plain program (no
//! criterion): it prints one set of tables and writes them, with the machine
//! facts and the date, to the "Comparison (issue 5)" section of
//! BENCHMARKS.md (text below the section's notes marker is kept).
//!
//! Environment:
//! - `SESSIONLOG_BENCH_SMOKE=1`: tiny sizes (seconds, for CI); BENCHMARKS.md
//!   is not touched;
//! - `SESSIONLOG_BENCH_ONLY=sync:4096,floor:16,...`: only these cells
//!   (engines `sync`, `batched`, `none`, `sqlite-full`, `sqlite-normal`,
//!   `jsonl`, `floor`), for profiling; reads run for a batch only when its
//!   `sync`, `sqlite-full` and `jsonl` cells ran; BENCHMARKS.md is not
//!   touched;
//! - `SESSIONLOG_BENCH_ROUNDS`, `SESSIONLOG_BENCH_READ_REPS`: override the
//!   repetitions;
//! - `SESSIONLOG_BENCH_DIR`: where the files go (default: cargo's target
//!   tmpdir, `target/tmp`);
//! - `SESSIONLOG_BENCH_MD`: write the section to this file instead (any run);
//! - `SESSIONLOG_BENCH_MULTI=only`: run only the many-sessions table
//!   ([`multi`], issue 18) and print it; with `SESSIONLOG_BENCH_MD` also
//!   write its section there. `SESSIONLOG_BENCH_MULTI_SECS` (default 5)
//!   sets the seconds per cell, `SESSIONLOG_BENCH_MULTI_ROWS=8x256,64x4096`
//!   the writers x sessions rows, `SESSIONLOG_BENCH_MULTI_ENGINES=sync,perfile`
//!   only these engines (`sync`, `journal`, `perfile`, `shared`,
//!   `twowrites`, `syncfs`, `sqlite`).
//!
//! A whole run (no `SESSIONLOG_BENCH_ONLY`) ends with the many-sessions
//! table (smoke: 2 and 4 writers over 4 and 16 sessions, 0.3 s cells) and
//! writes it to its own section, "Many sessions, durable appends (issue 18)".
//!
//! Workload: sessions from the project's generator ([`Sample`], 20 turns,
//! compaction on) concatenated into one event stream (seqs, provenance and
//! replace ranges shifted, times kept increasing) and appended to one
//! session. The stream is folded once through a [`SessionState`] before any
//! timing, so every engine gets the same valid events. A cell appends the
//! first N events of that stream in batches of B (B = 1, 16, 256, 4096;
//! N = 2k, 20k, 200k, 200k, each cut back to the end of the last closed turn
//! so no reader has to synthesise closers; a cell also stops at a batch
//! boundary after 60 s, 5 s in smoke mode).
//!
//! Engines, each cell in a fresh directory with fresh files (nothing
//! recycled: recycled, already-allocated files are faster to write):
//! - sessionlog `Durability::Sync`, `Batched{2ms}`, `None` (`Store::open` and
//!   `create` untimed; the first append, which creates the segment, is timed;
//!   for Batched and None the final `flush` is timed);
//! - SQLite via rusqlite (bundled): schema 4 DDL, WAL, `synchronous=FULL` and
//!   `NORMAL`, `foreign_keys=ON`, one prepared INSERT, one `BEGIN IMMEDIATE`
//!   .. `COMMIT` per batch; the `sessions` row is untimed setup;
//! - JSONL: each batch serialised (`Event::write_json`) then one `write` of
//!   its lines and one `fdatasync`, to a file that grows (header line untimed);
//! - floor: the same JSONL bytes, precomputed, one `write_all_at` and one
//!   `fdatasync` per batch into a file preallocated and zero-filled (and
//!   synced) before timing. No engine.
//!
//! MB/s is always JSONL payload bytes of the events appended / time, so it
//! is the same unit for every engine. Each cell runs `rounds` times (engine
//! order rotated per round); the tables show the median, the spread, and the
//! CPU time (getrusage, whole process) per event and per wall second, which
//! tells CPU-bound cells from I/O-bound ones.
//!
//! Reads use the stores written at batch 256 and 4096 by the last round
//! (sessionlog Sync, closed, so with a checkpoint; SQLite FULL; JSONL), all
//! in the page cache, median of `read_reps` (each timed call includes
//! opening the files and dropping what it returned):
//! - load: sessionlog `Store::open_read_only` + `load`; SQLite open + select
//!   all rows + one envelope per row parsed by `Event::from_json`; JSONL read
//!   file + `jsonl::read_session` (parse and fold);
//! - derive: sessionlog `open_read_only` + `derive` + iterating the messages;
//!   SQLite read + parse + surface fold + `derive::derive` from scratch; JSONL
//!   `read_session` + `derive::derive`;
//! - also, for reference: the SQLite adapter's own `read_db` (schema check,
//!   parse and fold). Untimed checks first: sessionlog loads exactly the
//!   events appended, and the three derive paths give the same messages.
//!
//! Bytes on disk per event: sessionlog `stats().bytes` (preallocated space not
//! counted); SQLite db + wal after `wal_checkpoint(TRUNCATE)`; JSONL file size;
//! floor the bytes written.

#[path = "multi/mod.rs"]
mod multi;

use rusqlite::{Connection, OpenFlags, params};
use sessionlog::adapters::jsonl;
use sessionlog::adapters::sqlite::{DDL, SCHEMA_VERSION};
use sessionlog::derive;
use sessionlog::event::{Event, OwnedEvent, SurfaceOp};
use sessionlog::header::SessionHeader;
use sessionlog::json;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::session::SessionState;
use sessionlog::store::{Durability, Options, Store};
use sessionlog::surface::Surface;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::hint::black_box;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ID: &str = "bench-session";
const BATCHES: [usize; 4] = [1, 16, 256, 4096];
/// Batch sizes whose stores are kept for the read measurements.
const READ_BATCHES: [usize; 2] = [256, 4096];

/// Sizes of one run.
struct Config {
    smoke: bool,
    /// Events per cell, by batch size.
    events: [usize; 4],
    rounds: usize,
    read_reps: usize,
    cell_cap: Duration,
    /// `SESSIONLOG_BENCH_ONLY`: run only these cells (for profiling).
    only: Option<Vec<(Engine, usize)>>,
}

impl Config {
    fn from_env() -> Config {
        let smoke = std::env::var("SESSIONLOG_BENCH_SMOKE").is_ok_and(|v| v == "1");
        let mut c = Config::sizes(smoke);
        let number = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.parse::<usize>().expect("a positive integer"))
                .filter(|n| *n > 0)
        };
        c.rounds = number("SESSIONLOG_BENCH_ROUNDS").unwrap_or(c.rounds);
        c.read_reps = number("SESSIONLOG_BENCH_READ_REPS").unwrap_or(c.read_reps);
        c.only = std::env::var("SESSIONLOG_BENCH_ONLY").ok().map(|v| {
            v.split(',')
                .filter(|t| !t.is_empty())
                .map(|t| {
                    let (e, b) = t.split_once(':').expect("ENGINE:BATCH");
                    let engine = *ENGINES
                        .iter()
                        .find(|x| x.short() == e)
                        .unwrap_or_else(|| panic!("unknown engine {e:?}"));
                    let batch = b.parse().expect("a batch size");
                    assert!(BATCHES.contains(&batch), "batch {batch} is not measured");
                    (engine, batch)
                })
                .collect()
        });
        c
    }

    fn sizes(smoke: bool) -> Config {
        if smoke {
            Config {
                smoke,
                events: [50, 320, 2_048, 8_192],
                rounds: 1,
                read_reps: 1,
                cell_cap: Duration::from_secs(5),
                only: None,
            }
        } else {
            Config {
                smoke,
                events: [2_000, 20_000, 200_000, 200_000],
                rounds: 5,
                read_reps: 7,
                cell_cap: Duration::from_secs(60),
                only: None,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    Sync,
    Batched,
    NoSync,
    SqliteFull,
    SqliteNormal,
    Jsonl,
    Floor,
}

const ENGINES: [Engine; 7] = [
    Engine::Sync,
    Engine::Batched,
    Engine::NoSync,
    Engine::SqliteFull,
    Engine::SqliteNormal,
    Engine::Jsonl,
    Engine::Floor,
];

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Sync => "sessionlog Sync",
            Engine::Batched => "sessionlog Batched{2ms}",
            Engine::NoSync => "sessionlog None (+flush)",
            Engine::SqliteFull => "SQLite WAL FULL",
            Engine::SqliteNormal => "SQLite WAL NORMAL",
            Engine::Jsonl => "JSONL write+fdatasync",
            Engine::Floor => "floor (prealloc write+fdatasync)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Engine::Sync => "sync",
            Engine::Batched => "batched",
            Engine::NoSync => "none",
            Engine::SqliteFull => "sqlite-full",
            Engine::SqliteNormal => "sqlite-normal",
            Engine::Jsonl => "jsonl",
            Engine::Floor => "floor",
        }
    }

    fn index(self) -> usize {
        ENGINES.iter().position(|e| *e == self).expect("listed")
    }
}

/// The generated stream and its JSONL form.
struct Workload {
    header: SessionHeader,
    events: Vec<OwnedEvent>,
    sessions: usize,
    /// Every event's JSONL line, concatenated.
    jsonl: Vec<u8>,
    /// `line_end[i]`: end of event i's line (exclusive) in `jsonl`.
    line_end: Vec<usize>,
}

impl Workload {
    fn generate(n: usize) -> Workload {
        let (events, sessions) = Sample::new(SampleConfig::default()).long_session(n);
        let mut state = SessionState::new(false);
        state
            .append_batch(&events, &Vec::<Event>::new())
            .expect("the concatenated stream is a valid session");
        let mut jsonl = Vec::new();
        let mut line_end = Vec::with_capacity(events.len());
        for e in &events {
            e.write_json(&mut jsonl);
            jsonl.push(b'\n');
            line_end.push(jsonl.len());
        }
        let header = SessionHeader::new(ID, SampleConfig::default().start_time as u64);
        Workload {
            header,
            events,
            sessions,
            jsonl,
            line_end,
        }
    }

    /// The largest `k <= n` such that the first `k` events end with a
    /// closed turn (so no engine's reader has to synthesise closers).
    fn closed_prefix(&self, n: usize) -> usize {
        (1..=n.min(self.events.len()))
            .rev()
            .find(|&k| self.events[k - 1].kind == "turn/end")
            .unwrap_or(n)
    }

    fn line_start(&self, i: usize) -> usize {
        if i == 0 { 0 } else { self.line_end[i - 1] }
    }

    /// The JSONL bytes of events `a..b`.
    fn bytes(&self, a: usize, b: usize) -> &[u8] {
        &self.jsonl[self.line_start(a)..self.line_start(b)]
    }
}

/// One measured cell.
#[derive(Debug, Clone, Copy)]
struct Cell {
    events: usize,
    /// JSONL bytes of the events appended.
    payload: u64,
    /// Timed seconds (including the final flush for Batched and None).
    secs: f64,
    /// Seconds until the last append returned (before any flush).
    append_secs: f64,
    /// CPU seconds (user + system, every thread of the process) in the
    /// timed region.
    cpu: f64,
    /// Bytes on disk after the cell.
    disk: u64,
}

impl Cell {
    fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.secs
    }

    fn mb_per_sec(&self) -> f64 {
        self.payload as f64 / self.secs / 1e6
    }
}

/// User + system CPU seconds of the process so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn run_cell(
    engine: Engine,
    w: &Workload,
    batch: usize,
    n: usize,
    dir: &Path,
    cap: Duration,
) -> Res<Cell> {
    fs::create_dir_all(dir)?;
    match engine {
        Engine::Sync | Engine::Batched | Engine::NoSync => {
            sessionlog_cell(engine, w, batch, n, &dir.join("store"), cap)
        }
        Engine::SqliteFull | Engine::SqliteNormal => {
            let sync = if engine == Engine::SqliteFull {
                "FULL"
            } else {
                "NORMAL"
            };
            sqlite_cell(sync, w, batch, n, &dir.join("sessions.db"), cap)
        }
        Engine::Jsonl => jsonl_cell(w, batch, n, &dir.join("session.jsonl"), cap),
        Engine::Floor => floor_cell(w, batch, n, &dir.join("floor.bin"), cap),
    }
}

fn sessionlog_cell(
    engine: Engine,
    w: &Workload,
    batch: usize,
    n: usize,
    dir: &Path,
    cap: Duration,
) -> Res<Cell> {
    let durability = match engine {
        Engine::Sync => Durability::Sync,
        Engine::Batched => Durability::Batched {
            window: Duration::from_millis(2),
        },
        _ => Durability::None,
    };
    let store = Store::open(
        dir,
        Options {
            durability,
            ..Options::default()
        },
    )?;
    store.create(w.header.clone())?;
    let (t, cpu0) = (Instant::now(), cpu_seconds());
    let mut i = 0;
    while i < n {
        let j = (i + batch).min(n);
        store.append(ID, &w.events[i..j])?;
        i = j;
        if t.elapsed() > cap {
            break;
        }
    }
    let append_secs = t.elapsed().as_secs_f64();
    if durability != Durability::Sync {
        store.flush()?;
    }
    let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let stats = store.stats(ID)?;
    assert_eq!(stats.events, i as u64, "every event is stored");
    store.close()?;
    Ok(Cell {
        events: i,
        payload: w.bytes(0, i).len() as u64,
        secs,
        cpu,
        append_secs,
        disk: stats.bytes,
    })
}

fn sources_json(out: &mut String, src: &[u64]) {
    out.clear();
    out.push('[');
    for (k, s) in src.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        let _ = write!(out, "{s}");
    }
    out.push(']');
}

fn surface_op_json(out: &mut String, op: SurfaceOp) {
    out.clear();
    match op {
        SurfaceOp::Append => out.push_str("\"append\""),
        SurfaceOp::Replace { start, end } => {
            let _ = write!(
                out,
                "{{\"op\":\"replace\",\"start\":{start},\"end\":{end}}}"
            );
        }
        other => unimplemented!("surface op {other:?}"),
    }
}

fn sqlite_setup(path: &Path, sync: &str) -> Res<Connection> {
    let conn = Connection::open(path)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    assert!(mode.eq_ignore_ascii_case("wal"), "journal mode {mode}");
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;"
    ))?;
    conn.execute_batch(DDL)?;
    conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))?;
    Ok(conn)
}

fn sqlite_cell(
    sync: &str,
    w: &Workload,
    batch: usize,
    n: usize,
    path: &Path,
    cap: Duration,
) -> Res<Cell> {
    let conn = sqlite_setup(path, sync)?;
    let h = &w.header;
    conn.execute(
        "INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![h.id, h.version as i64, h.created_at as i64, h.cwd, h.parent_session, h.seed_length.map(|x| x as i64)],
    )?;
    let mut begin = conn.prepare("BEGIN IMMEDIATE")?;
    let mut commit = conn.prepare("COMMIT")?;
    let mut insert = conn.prepare(
        "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let (mut src_buf, mut op_buf) = (String::new(), String::new());
    let (t, cpu0) = (Instant::now(), cpu_seconds());
    let mut i = 0;
    while i < n {
        let j = (i + batch).min(n);
        begin.execute([])?;
        for e in &w.events[i..j] {
            let src = e.source_event_seqs.as_deref().map(|s| {
                sources_json(&mut src_buf, s);
                src_buf.as_str()
            });
            let op = e.surface_op.map(|o| {
                surface_op_json(&mut op_buf, o);
                op_buf.as_str()
            });
            insert.execute(params![
                ID,
                e.seq as i64,
                e.kind.as_ref(),
                e.time,
                e.data.get(),
                src,
                op
            ])?;
        }
        commit.execute([])?;
        i = j;
        if t.elapsed() > cap {
            break;
        }
    }
    let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    drop((begin, commit, insert));
    let _: (i64, i64, i64) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })?;
    let size = |p: PathBuf| fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let disk = size(path.to_owned()) + size(wal_path(path));
    conn.close().map_err(|(_, e)| e)?;
    Ok(Cell {
        events: i,
        payload: w.bytes(0, i).len() as u64,
        secs,
        cpu,
        append_secs: secs,
        disk,
    })
}

fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

fn sync_dir(dir: &Path) -> Res<()> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

fn jsonl_cell(w: &Workload, batch: usize, n: usize, path: &Path, cap: Duration) -> Res<Cell> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(path)?;
    let mut buf = Vec::with_capacity(1 << 20);
    w.header.write_json(&mut buf);
    buf.push(b'\n');
    file.write_all(&buf)?;
    file.sync_data()?;
    sync_dir(path.parent().expect("in a directory"))?;
    let (t, cpu0) = (Instant::now(), cpu_seconds());
    let mut i = 0;
    while i < n {
        let j = (i + batch).min(n);
        buf.clear();
        for e in &w.events[i..j] {
            e.write_json(&mut buf);
            buf.push(b'\n');
        }
        file.write_all(&buf)?;
        file.sync_data()?;
        i = j;
        if t.elapsed() > cap {
            break;
        }
    }
    let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let disk = file.metadata()?.len();
    Ok(Cell {
        events: i,
        payload: w.bytes(0, i).len() as u64,
        secs,
        cpu,
        append_secs: secs,
        disk,
    })
}

fn floor_cell(w: &Workload, batch: usize, n: usize, path: &Path, cap: Duration) -> Res<Cell> {
    let file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    let total = w.bytes(0, n).len() as u64;
    let capacity = total.div_ceil(1 << 20) * (1 << 20);
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < capacity {
        file.write_all_at(&zeros, at)?;
        at += zeros.len() as u64;
    }
    file.sync_all()?;
    sync_dir(path.parent().expect("in a directory"))?;
    let (t, cpu0) = (Instant::now(), cpu_seconds());
    let (mut i, mut offset) = (0, 0u64);
    while i < n {
        let j = (i + batch).min(n);
        let bytes = w.bytes(i, j);
        file.write_all_at(bytes, offset)?;
        file.sync_data()?;
        offset += bytes.len() as u64;
        i = j;
        if t.elapsed() > cap {
            break;
        }
    }
    let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    Ok(Cell {
        events: i,
        payload: offset,
        secs,
        cpu,
        append_secs: secs,
        disk: offset,
    })
}

// ---------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------

fn sessionlog_load(dir: &Path) -> Res<usize> {
    let store = Store::open_read_only(dir)?;
    let (_, events) = store.load(ID)?;
    Ok(black_box(events).len())
}

fn sessionlog_derive(dir: &Path) -> Res<usize> {
    let store = Store::open_read_only(dir)?;
    let derived = store.derive(ID)?;
    Ok(derived.messages().map(black_box).count())
}

/// Appends the JSON envelope of one `events` row to `line`.
fn envelope(line: &mut Vec<u8>, r: &rusqlite::Row<'_>) -> rusqlite::Result<()> {
    line.clear();
    line.extend_from_slice(b"{\"type\":");
    json::write_str(line, r.get_ref(1)?.as_str()?);
    let _ = write!(
        line,
        ",\"seq\":{},\"time\":{},\"data\":",
        r.get_ref(0)?.as_i64()?,
        r.get_ref(2)?.as_i64()?
    );
    line.extend_from_slice(r.get_ref(3)?.as_str()?.as_bytes());
    if let Some(s) = r.get_ref(4)?.as_str_or_null()? {
        line.extend_from_slice(b",\"sourceEventSeqs\":");
        line.extend_from_slice(s.as_bytes());
    }
    if let Some(o) = r.get_ref(5)?.as_str_or_null()? {
        line.extend_from_slice(b",\"surfaceOp\":");
        line.extend_from_slice(o.as_bytes());
    }
    line.push(b'}');
    Ok(())
}

/// SQLite read + parse: every row of the session, each envelope parsed by
/// `Event::from_json`. With `surface`, also folds the surface.
fn sqlite_read(path: &Path, mut surface: Option<&mut Surface>) -> Res<Vec<OwnedEvent>> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let mut stmt = conn.prepare(
        "SELECT seq, type, time, data, source_event_seqs, surface_op FROM events WHERE session_id = ?1 ORDER BY seq",
    )?;
    let mut rows = stmt.query([ID])?;
    let mut events: Vec<OwnedEvent> = Vec::new();
    let mut line = Vec::with_capacity(4096);
    while let Some(r) = rows.next()? {
        envelope(&mut line, r)?;
        let event = Event::from_json_bytes(&line)?.into_owned();
        if let Some(s) = surface.as_deref_mut() {
            s.fold(&event, &events)?;
        }
        events.push(event);
    }
    Ok(events)
}

fn sqlite_load(path: &Path) -> Res<usize> {
    Ok(black_box(sqlite_read(path, None)?).len())
}

fn sqlite_derive(path: &Path) -> Res<usize> {
    let mut surface = Surface::new();
    let events = sqlite_read(path, Some(&mut surface))?;
    let messages = derive::derive(&surface, &events).map_err(|e| format!("{e:?}"))?;
    Ok(messages.into_iter().map(black_box).count())
}

fn jsonl_load(path: &Path) -> Res<usize> {
    let bytes = fs::read(path)?;
    let s = jsonl::read_session(&bytes, false)?;
    Ok(black_box(s.events).len())
}

fn jsonl_derive(path: &Path) -> Res<usize> {
    let bytes = fs::read(path)?;
    let s = jsonl::read_session(&bytes, false)?;
    let messages = derive::derive(s.state.surface(), &s.events).map_err(|e| format!("{e:?}"))?;
    Ok(messages.into_iter().map(black_box).count())
}

/// Median seconds of `reps` runs of `f`, and what it returned.
fn time_reads(reps: usize, mut f: impl FnMut() -> Res<usize>) -> Res<(f64, usize)> {
    let mut times = Vec::with_capacity(reps);
    let mut out = 0;
    for _ in 0..reps {
        let t = Instant::now();
        out = f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok((median(&mut times), out))
}

/// The messages of each derive path as JSON, to check they agree (untimed).
fn derived_json(store_dir: &Path, db: &Path, jsonl_file: &Path) -> Res<[Vec<String>; 3]> {
    let store = Store::open_read_only(store_dir)?;
    let a = store.derive(ID)?.messages().map(|m| m.to_json()).collect();
    let mut surface = Surface::new();
    let events = sqlite_read(db, Some(&mut surface))?;
    let b = derive::derive(&surface, &events)
        .map_err(|e| format!("{e:?}"))?
        .iter()
        .map(|m| m.to_json())
        .collect();
    let bytes = fs::read(jsonl_file)?;
    let s = jsonl::read_session(&bytes, false)?;
    let c = derive::derive(s.state.surface(), &s.events)
        .map_err(|e| format!("{e:?}"))?
        .iter()
        .map(|m| m.to_json())
        .collect();
    Ok([a, b, c])
}

/// One timed read path: what it reads, given the file or store.
type ReadFn = fn(&Path) -> Res<usize>;

struct ReadRow {
    name: &'static str,
    /// Per read batch size: (seconds, events in the log, items returned),
    /// `None` when not measured.
    cols: Vec<Option<(f64, usize, usize)>>,
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn si(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn command_output(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn machine_facts(dir: &Path) -> Vec<(String, String)> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let dirs = dir.display().to_string();
    let df = command_output("df", &["-T", &dirs]);
    let fs_line = df
        .lines()
        .nth(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!(
                "{} on {} (mounted at {})",
                f.get(1).unwrap_or(&"?"),
                f.first().unwrap_or(&"?"),
                f.last().unwrap_or(&"?")
            )
        })
        .unwrap_or_else(|| "unknown".into());
    vec![
        ("date".into(), command_output("date", &["-u"])),
        ("CPU".into(), format!("{cpu}, {cores} cores available")),
        ("kernel".into(), command_output("uname", &["-r"])),
        ("filesystem".into(), format!("{fs_line}; bench dir {dirs}")),
        (
            "SQLite".into(),
            format!("{} (rusqlite, bundled)", rusqlite::version()),
        ),
    ]
}

/// A markdown table header: `| first | batch 1 | ... |` and its rule.
fn table_head(o: &mut String, first: &str, cols: &[String]) {
    let _ = write!(o, "| {first} |");
    for c in cols {
        let _ = write!(o, " {c} |");
    }
    let _ = write!(o, "\n|---|");
    for _ in cols {
        let _ = write!(o, "---:|");
    }
    o.push('\n');
}

/// `x` formatted by `f`, or `-` when it was not measured (NaN).
fn or_dash(x: f64, f: impl Fn(f64) -> String) -> String {
    if x.is_finite() { f(x) } else { "-".into() }
}

fn report(
    config: &Config,
    w: &Workload,
    facts: &[(String, String)],
    cells: &[Vec<Vec<Cell>>],
    reads: &[ReadRow],
    derive_counts: &[usize],
) -> String {
    let mut o = String::new();
    // Median over rounds of `f`; NaN when the cell did not run.
    let med = |e: Engine, b: usize, f: &dyn Fn(&Cell) -> f64| -> f64 {
        let mut v: Vec<f64> = cells[e.index()][b].iter().map(f).collect();
        if v.is_empty() {
            f64::NAN
        } else {
            median(&mut v)
        }
    };
    let eps = |e: Engine, b: usize| med(e, b, &|c| c.events_per_sec());
    let batch_cols: Vec<String> = BATCHES.iter().map(|b| format!("batch {b}")).collect();
    let _ = writeln!(o, "Machine and run:\n");
    for (k, v) in facts {
        let _ = writeln!(o, "- {k}: {v}");
    }
    let chunk_share = w
        .events
        .iter()
        .filter(|e| e.kind == "assistant/chunk")
        .count() as f64
        / w.events.len() as f64;
    let surface_bytes: usize = (0..w.events.len())
        .filter(|&i| w.events[i].surface_op.is_some())
        .map(|i| w.line_end[i] - w.line_start(i))
        .sum();
    let _ = writeln!(
        o,
        "- workload: {} events ({} generated sessions of 20 turns concatenated into one session), {:.0} B/event as JSONL, {:.0}% assistant/chunk; surface events (messages, tool results) are {:.0}% of the events and {:.0}% of the JSONL bytes",
        w.events.len(),
        w.sessions,
        w.jsonl.len() as f64 / w.events.len() as f64,
        chunk_share * 100.0,
        w.events.iter().filter(|e| e.surface_op.is_some()).count() as f64 * 100.0
            / w.events.len() as f64,
        surface_bytes as f64 * 100.0 / w.jsonl.len() as f64
    );
    let _ = writeln!(
        o,
        "- every cell writes fresh files in a fresh directory (recycled, already-allocated files would be faster); median of {} round(s), engine order rotated per round; events per cell (cut to the last closed turn; a cell stops early only past {} s): {}",
        config.rounds,
        config.cell_cap.as_secs(),
        BATCHES
            .iter()
            .zip(config.events)
            .map(|(b, n)| format!("batch {b}: {}", w.closed_prefix(n)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let _ = writeln!(
        o,
        "\nAppend throughput, events/s (MB/s of JSONL payload), fresh files:\n"
    );
    table_head(&mut o, "engine", &batch_cols);
    for e in ENGINES {
        let _ = write!(o, "| {} |", e.name());
        for b in 0..BATCHES.len() {
            let cell = or_dash(eps(e, b), |x| {
                format!("{} ({:.1})", si(x), med(e, b, &|c| c.mb_per_sec()))
            });
            let _ = write!(o, " {cell} |");
        }
        o.push('\n');
    }
    let _ = write!(o, "| sessionlog None, appends only (flush not timed) |");
    for b in 0..BATCHES.len() {
        let x = med(Engine::NoSync, b, &|c| c.events as f64 / c.append_secs);
        let _ = write!(o, " {} |", or_dash(x, si));
    }
    o.push('\n');

    let _ = writeln!(
        o,
        "\nSpread of append events/s over the rounds (min - max):\n"
    );
    table_head(&mut o, "engine", &batch_cols);
    for e in ENGINES {
        let _ = write!(o, "| {} |", e.name());
        for rounds in &cells[e.index()] {
            let v: Vec<f64> = rounds.iter().map(Cell::events_per_sec).collect();
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let cell = or_dash(lo, |lo| format!("{} - {}", si(lo), si(hi)));
            let _ = write!(o, " {cell} |");
        }
        o.push('\n');
    }

    let _ = writeln!(
        o,
        "\nCPU during the timed append: CPU seconds (user + system, all threads) / wall seconds, and CPU µs per event (medians):\n"
    );
    table_head(&mut o, "engine", &batch_cols);
    for e in ENGINES {
        let _ = write!(o, "| {} |", e.name());
        for b in 0..BATCHES.len() {
            let busy = med(e, b, &|c| c.cpu / c.secs);
            let per = med(e, b, &|c| c.cpu / c.events as f64 * 1e6);
            let cell = or_dash(busy, |busy| format!("{busy:.2} ({per:.2} µs)"));
            let _ = write!(o, " {cell} |");
        }
        o.push('\n');
    }

    let _ = writeln!(o, "\nRatios (sessionlog / peer, median events/s):\n");
    table_head(&mut o, "ratio", &batch_cols);
    for ours in [Engine::Sync, Engine::Batched, Engine::NoSync] {
        for peer in [
            Engine::SqliteFull,
            Engine::SqliteNormal,
            Engine::Jsonl,
            Engine::Floor,
        ] {
            let _ = write!(o, "| {} / {} |", ours.short(), peer.short());
            for b in 0..BATCHES.len() {
                let _ = write!(o, " {} |", ratio(eps(ours, b), eps(peer, b)));
            }
            o.push('\n');
        }
    }

    let _ = writeln!(
        o,
        "\nReads (page cache warm; median of {}; each includes opening the files), events/s (ms):\n",
        config.read_reps
    );
    let read_cols: Vec<String> = READ_BATCHES
        .iter()
        .map(|b| format!("log written at batch {b}"))
        .collect();
    table_head(&mut o, "read", &read_cols);
    for r in reads {
        let _ = write!(o, "| {} |", r.name);
        for col in &r.cols {
            let cell = col.map_or_else(
                || "-".into(),
                |(secs, events, _)| format!("{} ({:.1} ms)", si(events as f64 / secs), secs * 1e3),
            );
            let _ = write!(o, " {cell} |");
        }
        o.push('\n');
    }
    let find = |name: &str| reads.iter().find(|r| r.name == name);
    for (label, ours, peer) in [
        (
            "load: sessionlog / SQLite read+parse",
            READ_NAMES[0],
            READ_NAMES[1],
        ),
        (
            "derive: sessionlog / SQLite read+parse+derive",
            READ_NAMES[3],
            READ_NAMES[4],
        ),
    ] {
        if let (Some(a), Some(b)) = (find(ours), find(peer)) {
            let _ = write!(o, "| {label} |");
            for (x, y) in a.cols.iter().zip(&b.cols) {
                let cell = match (x, y) {
                    (Some(x), Some(y)) => ratio(y.0, x.0),
                    _ => "-".into(),
                };
                let _ = write!(o, " {cell} |");
            }
            o.push('\n');
        }
    }
    let _ = writeln!(
        o,
        "\nDerived messages per log (identical for the three paths, checked): {}.",
        derive_counts
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let surface_data: usize = w
        .events
        .iter()
        .filter(|e| e.surface_op.is_some())
        .map(|e| e.data.get().len())
        .sum();
    let surface_data = surface_data as f64 / w.events.len() as f64;
    let jsonl_per_event = w.jsonl.len() as f64 / w.events.len() as f64;
    let _ = writeln!(
        o,
        "\nBytes on disk per event (last round). The `data` of surface events alone is {surface_data:.0} B/event ({:.2}x JSONL); sessionlog stores it verbatim (for zero-copy derive) and packs the data of the other events of each batch into one Zstandard frame (format-spec.md section 4), so the saving grows with the batch:\n",
        surface_data / jsonl_per_event
    );
    table_head(&mut o, "engine", &batch_cols);
    let bpe = |e: Engine, b: usize| {
        cells[e.index()][b]
            .last()
            .map_or(f64::NAN, |c| c.disk as f64 / c.events as f64)
    };
    for e in ENGINES {
        let _ = write!(o, "| {} |", e.name());
        for b in 0..BATCHES.len() {
            let _ = write!(o, " {} |", or_dash(bpe(e, b), |x| format!("{x:.0}")));
        }
        o.push('\n');
    }
    for (label, peer) in [
        ("sessionlog Sync / JSONL", Engine::Jsonl),
        ("sessionlog Sync / SQLite FULL", Engine::SqliteFull),
    ] {
        let _ = write!(o, "| {label} |");
        for b in 0..BATCHES.len() {
            let _ = write!(o, " {} |", ratio(bpe(Engine::Sync, b), bpe(peer, b)));
        }
        o.push('\n');
    }

    // The issue's targets, against this run.
    let _ = writeln!(o, "\nTargets of issue 5 in this run:\n");
    let _ = writeln!(o, "| target | measured | met |\n|---|---|---|");
    let yes = |ok: bool| if ok { "yes" } else { "no" };
    for (b, batch) in BATCHES.iter().enumerate() {
        let r = eps(Engine::Sync, b) / eps(Engine::Floor, b);
        let _ = writeln!(
            o,
            "| durable (Sync) append >= 0.9x floor, batch {batch} | {} | {} |",
            or_dash(r, |r| format!("{r:.2}x")),
            or_dash(r, |r| yes(r >= 0.9).into())
        );
    }
    let none_best = (0..BATCHES.len())
        .map(|b| eps(Engine::NoSync, b))
        .filter(|x| x.is_finite())
        .fold(f64::NAN, f64::max);
    let none_cpu = (0..BATCHES.len())
        .map(|b| med(Engine::NoSync, b, &|c| c.events as f64 / c.append_secs))
        .filter(|x| x.is_finite())
        .fold(f64::NAN, f64::max);
    let _ = writeln!(
        o,
        "| Durability::None append >= 3M events/s | best {} with flush, {} appends only | {} |",
        or_dash(none_best, si),
        or_dash(none_cpu, si),
        or_dash(none_cpu, |x| yes(x >= 3e6).into())
    );
    for (label, ours, peer, goal) in [
        ("full load >= 3x SQLite read+parse", 0, 1, 3.0),
        ("derive after reopen >= 10x SQLite", 3, 4, 10.0),
    ] {
        let rs: Vec<f64> = reads[ours]
            .cols
            .iter()
            .zip(&reads[peer].cols)
            .filter_map(|(x, y)| Some(y.as_ref()?.0 / x.as_ref()?.0))
            .collect();
        let shown = rs
            .iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(", ");
        let met = if rs.is_empty() {
            "-".into()
        } else {
            yes(rs.iter().all(|r| *r >= goal)).to_string()
        };
        let _ = writeln!(
            o,
            "| {label} | {} (logs written at batch {}) | {met} |",
            if shown.is_empty() { "-".into() } else { shown },
            READ_BATCHES.map(|b| b.to_string()).join(", ")
        );
    }
    let rs: Vec<f64> = (0..BATCHES.len())
        .map(|b| bpe(Engine::Sync, b) / bpe(Engine::Jsonl, b))
        .collect();
    let _ = writeln!(
        o,
        "| bytes on disk per event <= 0.5x JSONL | {} (batch {}) | {} |",
        rs.iter()
            .map(|r| or_dash(*r, |r| format!("{r:.2}x")))
            .collect::<Vec<_>>()
            .join(", "),
        BATCHES.map(|b| b.to_string()).join(", "),
        if rs.iter().any(|r| !r.is_finite()) {
            "-"
        } else {
            yes(rs.iter().all(|r| *r <= 0.5))
        }
    );
    o
}

const READ_NAMES: [&str; 7] = [
    "load: sessionlog open_read_only + load",
    "load: SQLite select all + Event::from_json per row",
    "load: JSONL read + read_session (parse + fold)",
    "derive: sessionlog open_read_only + derive (checkpoint cache)",
    "derive: SQLite read + parse + surface fold + derive",
    "derive: JSONL read_session + derive",
    "load: SQLite adapter read_db (schema check + parse + fold)",
];

const SECTION: &str = "## Comparison (issue 5)";
/// The heading of the many-sessions table's section (issue 18).
const MULTI_SECTION: &str = "## Many sessions, durable appends (issue 18)";

/// Everything after this line in the section is kept when the bench rewrites
/// the section (findings written by hand).
const NOTES_MARKER: &str =
    "<!-- compare: notes below this line are kept when the bench rewrites the section -->\n";

/// Inserts or replaces this bench's section of BENCHMARKS.md, leaving every
/// other section as it is. Reads the file right before writing it.
fn write_section(path: &Path, heading: &str, body: &str) -> Res<()> {
    let old = match fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.into()),
    };
    // Where the section is now: from its heading to the next `## ` heading.
    let range = old
        .match_indices(heading)
        .map(|(i, _)| i)
        .find(|&i| {
            (i == 0 || old.as_bytes()[i - 1] == b'\n') && old[i + heading.len()..].starts_with('\n')
        })
        .map(|start| {
            let after = start + heading.len();
            let end = old[after..]
                .find("\n## ")
                .map_or(old.len(), |k| after + k + 1);
            start..end
        });
    // Notes written by hand below the marker survive a new run.
    let notes = range
        .as_ref()
        .and_then(|r| {
            let current = &old[r.clone()];
            current
                .find(NOTES_MARKER)
                .map(|k| current[k + NOTES_MARKER.len()..].trim_end().to_owned())
        })
        .unwrap_or_default();
    let mut section = format!(
        "{heading}\n\nGenerated by `cargo bench --bench compare` (benches/compare.rs) from one run; rerun it to refresh everything above the notes marker.\n\n{body}\n{NOTES_MARKER}"
    );
    if !notes.is_empty() {
        section.push_str(&notes);
    }
    section.push('\n');
    let new = match range {
        _ if old.is_empty() => format!("# Benchmarks\n\n{section}"),
        Some(r) => {
            let mut s = String::with_capacity(old.len() + section.len());
            s.push_str(&old[..r.start]);
            s.push_str(&section);
            if r.end < old.len() {
                s.push('\n');
            }
            s.push_str(&old[r.end..]);
            s
        }
        None => {
            let mut s = old.clone();
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s.push('\n');
            s.push_str(&section);
            s
        }
    };
    fs::write(path, new)?;
    Ok(())
}

fn main() -> Res<()> {
    if std::env::var("SESSIONLOG_BENCH_MULTI").is_ok_and(|v| v == "only") {
        let base = std::env::var_os("SESSIONLOG_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
        let secs: f64 = std::env::var("SESSIONLOG_BENCH_MULTI_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5.0);
        let rows: Vec<(usize, usize)> = match std::env::var("SESSIONLOG_BENCH_MULTI_ROWS") {
            Ok(v) => v
                .split(',')
                .filter_map(|r| {
                    let (w, s) = r.split_once('x')?;
                    Some((w.parse().ok()?, s.parse().ok()?))
                })
                .collect(),
            Err(_) => multi::ROWS.to_vec(),
        };
        let table =
            multi::table(&base, Duration::from_secs_f64(secs), &rows).map_err(|e| e.to_string())?;
        println!("{table}");
        if let Some(path) = std::env::var_os("SESSIONLOG_BENCH_MD") {
            write_section(Path::new(&path), MULTI_SECTION, &table)?;
        }
        return Ok(());
    }
    let config = Config::from_env();
    let max_events = *config.events.iter().max().expect("sizes");
    let t0 = Instant::now();
    let w = Workload::generate(max_events);
    eprintln!(
        "workload: {} events, {} sessions, {} JSONL bytes ({:.1} s)",
        w.events.len(),
        w.sessions,
        w.jsonl.len(),
        t0.elapsed().as_secs_f64()
    );
    let base = std::env::var_os("SESSIONLOG_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let root = base.join(format!("compare-{}", std::process::id()));
    if root.exists() {
        fs::remove_dir_all(&root)?;
    }
    fs::create_dir_all(&root)?;
    let mut facts = machine_facts(&root);
    let load_start = loadavg();

    // cells[engine][batch] = one Cell per round.
    let mut cells: Vec<Vec<Vec<Cell>>> = vec![vec![Vec::new(); BATCHES.len()]; ENGINES.len()];
    let last_round = config.rounds - 1;
    for round in 0..config.rounds {
        for (bi, &batch) in BATCHES.iter().enumerate() {
            for k in 0..ENGINES.len() {
                let engine = ENGINES[(k + round) % ENGINES.len()];
                if config
                    .only
                    .as_ref()
                    .is_some_and(|only| !only.contains(&(engine, batch)))
                {
                    continue;
                }
                let dir = root.join(format!("r{round}-b{batch}-{}", engine.short()));
                let cell = run_cell(
                    engine,
                    &w,
                    batch,
                    w.closed_prefix(config.events[bi]),
                    &dir,
                    config.cell_cap,
                )?;
                eprintln!(
                    "round {round} batch {batch:>4} {:<34} {:>6} events {:>9} ev/s {:>7.1} MB/s {:>6.0} B/ev",
                    engine.name(),
                    cell.events,
                    si(cell.events_per_sec()),
                    cell.mb_per_sec(),
                    cell.disk as f64 / cell.events as f64
                );
                cells[engine.index()][bi].push(cell);
                let keep = round == last_round
                    && READ_BATCHES.contains(&batch)
                    && matches!(engine, Engine::Sync | Engine::SqliteFull | Engine::Jsonl);
                if !keep {
                    fs::remove_dir_all(&dir)?;
                }
            }
        }
    }

    let mut reads: Vec<ReadRow> = READ_NAMES
        .iter()
        .map(|&name| ReadRow {
            name,
            cols: Vec::new(),
        })
        .collect();
    let mut derive_counts = Vec::new();
    for batch in READ_BATCHES {
        let bi = BATCHES.iter().position(|b| *b == batch).expect("a batch");
        let dir = |e: Engine| root.join(format!("r{last_round}-b{batch}-{}", e.short()));
        let store = dir(Engine::Sync).join("store");
        let db = dir(Engine::SqliteFull).join("sessions.db");
        let file = dir(Engine::Jsonl).join("session.jsonl");
        // What each engine holds (untimed checks).
        let have = |e: Engine| cells[e.index()][bi].len() == config.rounds;
        if !(have(Engine::Sync) && have(Engine::SqliteFull) && have(Engine::Jsonl)) {
            for row in &mut reads {
                row.cols.push(None);
            }
            continue;
        }
        let n = cells[Engine::Sync.index()][bi]
            .last()
            .expect("a round")
            .events;
        {
            let s = Store::open_read_only(&store)?;
            let (_, loaded) = s.load(ID)?;
            if let Some(k) = (0..n).find(|&k| loaded.get(k) != Some(&w.events[k])) {
                panic!(
                    "sessionlog load differs at event {k} of {n} (loaded {}): {:?} vs {:?}",
                    loaded.len(),
                    loaded.get(k).map(|e| e.to_json()),
                    w.events[k].to_json()
                );
            }
            assert_eq!(
                loaded.len(),
                n,
                "sessionlog loads what was appended, and no closers"
            );
        }
        let ns = sqlite_read(&db, None)?.len();
        let nj = jsonl_load(&file)?;
        let [a, b, c] = derived_json(&store, &db, &file)?;
        assert!(
            a == b && b == c,
            "every derive path gives the same messages"
        );
        derive_counts.push(a.len());
        let jobs: [(&Path, usize, ReadFn); 7] = [
            (&store, n, sessionlog_load),
            (&db, ns, sqlite_load),
            (&file, nj, jsonl_load),
            (&store, n, sessionlog_derive),
            (&db, ns, sqlite_derive),
            (&file, nj, jsonl_derive),
            (&db, ns, |p| {
                let s = sessionlog::adapters::sqlite::read_db(p)?;
                Ok(black_box(s).len())
            }),
        ];
        for (row, (path, events, f)) in reads.iter_mut().zip(jobs) {
            let (secs, items) = time_reads(config.read_reps, || f(path))?;
            eprintln!(
                "read batch {batch:>4} {:<62} {:>8.2} ms {:>9} ev/s",
                row.name,
                secs * 1e3,
                si(events as f64 / secs)
            );
            row.cols.push(Some((secs, events, items)));
        }
    }

    facts.push((
        "load average (1/5/15 min)".into(),
        format!(
            "{load_start} at start, {} at end (other processes share the machine; figures include their interference)",
            loadavg()
        ),
    ));
    let table = report(&config, &w, &facts, &cells, &reads, &derive_counts);
    println!("\n{table}");
    // The many-sessions table (issue 18), whenever the whole run is asked for.
    let multi_table = if config.only.is_none() {
        let (cap, rows) = if config.smoke {
            (Duration::from_millis(300), vec![(2, 4), (4, 16)])
        } else {
            (Duration::from_secs(5), multi::ROWS.to_vec())
        };
        let t = multi::table(&root, cap, &rows).map_err(|e| e.to_string())?;
        println!("\n{t}");
        Some(t)
    } else {
        None
    };
    fs::remove_dir_all(&root)?;
    // SESSIONLOG_BENCH_MD names another file to write (any run, for tests).
    let target = std::env::var_os("SESSIONLOG_BENCH_MD")
        .map(PathBuf::from)
        .or_else(|| {
            (!config.smoke && config.only.is_none())
                .then(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md"))
        });
    match target {
        Some(path) => {
            write_section(&path, SECTION, &table)?;
            eprintln!("wrote the \"{SECTION}\" section of {}", path.display());
            if let Some(t) = &multi_table {
                write_section(&path, MULTI_SECTION, t)?;
                eprintln!(
                    "wrote the \"{MULTI_SECTION}\" section of {}",
                    path.display()
                );
            }
        }
        None => eprintln!("smoke or partial run: BENCHMARKS.md not written"),
    }
    eprintln!("total {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
