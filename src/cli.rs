//! The `sessionlog` command line.
//!
//! File mode (the default) inspects harness JSONL files and never writes.
//! Store mode (`--store DIR`, or `SESSIONLOG_STORE`) works on a store
//! directory: import files, list, print, verify, repair, fork and remove
//! sessions. Read-only commands open the store without its write lock, so they
//! work while a writer holds it.
//!
//! Exit codes: 0 success, 1 invalid input or data (the message names the file
//! or session, the line, seq or segment, and the rule broken), 2 usage, 3 I/O
//! error (including a store locked by another writer).

use clap::{Parser, Subcommand};
use sessionlog::adapters::jsonl::{self, JsonlSession};
use sessionlog::derive;
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::manifest::MANIFEST_FILE;
use sessionlog::store::{self, Options, Store};
use std::ffi::OsString;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

/// Inspect harness session logs (file mode), or manage a sessionlog store
/// (store mode: `--store DIR` or `SESSIONLOG_STORE`).
#[derive(Debug, Parser)]
#[command(name = "sessionlog", version, about)]
struct Cli {
    /// Work on the store in DIR instead of on files (store mode).
    #[arg(long, global = true, env = "SESSIONLOG_STORE", value_name = "DIR")]
    store: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a session file; print `OK` or the first violation (file
    /// mode only; in store mode use `verify`).
    Check {
        /// Also check the relational invariants, known types and message
        /// shapes (many real logs fail these: a diagnostic, not the default).
        #[arg(long)]
        strict: bool,
        /// A harness session file (JSONL, plain or with packed rows).
        file: PathBuf,
    },
    /// Print the logical log as plain JSONL: the header, then one event per
    /// line (packed rows expanded).
    Cat {
        /// Print only the events from this seq on (the header is always
        /// printed).
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Print the surface: nodes, replacement history and replaceGeneration.
    Surface {
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Print the derived message history, one JSON message per line.
    Derive {
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Close an interrupted last turn and print the closers, one per line.
    /// File mode needs --dry-run; in store mode the closers are appended
    /// durably unless --dry-run is given.
    Repair {
        /// Only print the closers, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Store mode: import harness JSONL files, one session each.
    Import {
        /// Store the session under this id instead of the header's (only
        /// with a single FILE).
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Harness session files.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Store mode: list the sessions, one per line: id, createdAt,
    /// parentSession (`-` when none), tab separated, sorted by id.
    Ls,
    /// Store mode: check every checksum of one session (or all) and fold it
    /// again; print `OK ID events=N segments=S bytes=B` per session.
    Verify {
        /// A session id (default: every session).
        id: Option<String>,
    },
    /// Store mode: fork SRC into a new session CHILD seeded with SRC's first
    /// events; the child ends its seed with `session/end-seed`.
    Fork {
        /// The session to fork.
        src: String,
        /// The new session's id.
        child: String,
        /// Seed the child with the first N events (seqs 0..N-1); default:
        /// all of SRC.
        #[arg(long, value_name = "N")]
        at: Option<u64>,
    },
    /// Store mode: remove a session.
    Rm {
        /// The session id.
        id: String,
    },
    /// Store mode: sizes of one session (or all, plus a total line).
    Stats {
        /// A session id (default: every session).
        id: Option<String>,
    },
    /// Run the whole job end to end in a fresh store: generate sessions,
    /// append, crash in a tool call, reopen and repair, derive, export.
    Demo {
        /// The store directory to create (an earlier demo store is replaced).
        #[arg(default_value = "demo-store")]
        dir: PathBuf,
    },
}

/// How a command failed, and so which exit code it gets.
#[derive(Debug)]
enum Failure {
    /// Invalid input or data: exit 1.
    Invalid(String),
    /// Usage: exit 2.
    Usage(String),
    /// I/O: exit 3.
    Io(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Invalid(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Io(_) => 3,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Invalid(m) | Failure::Usage(m) | Failure::Io(m) => m,
        }
    }

    /// Prefixes the message with what it is about.
    fn context(self, what: impl std::fmt::Display) -> Failure {
        match self {
            Failure::Invalid(m) => Failure::Invalid(format!("{what}: {m}")),
            Failure::Usage(m) => Failure::Usage(format!("{what}: {m}")),
            Failure::Io(m) => Failure::Io(format!("{what}: {m}")),
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = run(cli, &mut out).and_then(|()| {
        out.flush()
            .map_err(|e| Failure::Io(format!("writing output: {e}")))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            let _ = out.flush();
            eprintln!("error: {}", f.message());
            ExitCode::from(f.code())
        }
    }
}

fn run(cli: Cli, out: &mut impl Write) -> Result<(), Failure> {
    if let Command::Demo { dir } = &cli.command {
        return crate::demo::run(dir, out).map_err(Failure::Io);
    }
    match cli.store {
        None => run_file(cli.command, out),
        Some(dir) => run_store(&dir, cli.command, out),
    }
}

// ---------------------------------------------------------------------------
// File mode
// ---------------------------------------------------------------------------

fn read_file(path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Io(format!("{}: {e}", path.display())))
}

fn note_torn(path: &Path, s: &JsonlSession<'_>) {
    if let Some(t) = &s.torn {
        eprintln!(
            "note: {}: torn tail ignored from line {}: {}",
            path.display(),
            t.line,
            t.reason
        );
    }
}

/// Reads and folds a file, reporting an ignored torn tail on stderr.
fn load<'a>(path: &Path, bytes: &'a [u8], strict: bool) -> Result<JsonlSession<'a>, Failure> {
    let session = jsonl::read_session(bytes, strict)
        .map_err(|v| Failure::Invalid(format!("{}: {v}", path.display())))?;
    note_torn(path, &session);
    Ok(session)
}

fn io_err(e: io::Error) -> Failure {
    Failure::Io(format!("writing output: {e}"))
}

fn needs_store(command: &str) -> Failure {
    Failure::Usage(format!(
        "`{command}` works on a store: pass --store DIR or set SESSIONLOG_STORE"
    ))
}

fn run_file(command: Command, out: &mut impl Write) -> Result<(), Failure> {
    match command {
        Command::Check { strict, file } => {
            let bytes = read_file(&file)?;
            match jsonl::read_session(&bytes, strict) {
                Ok(s) => {
                    note_torn(&file, &s);
                    writeln!(out, "OK").map_err(io_err)
                }
                Err(v) => {
                    writeln!(out, "FAIL {v}").map_err(io_err)?;
                    Err(Failure::Invalid(format!("{}: {v}", file.display())))
                }
            }
        }
        Command::Cat { from, target } => {
            let file = PathBuf::from(target);
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            let from = from.unwrap_or(0);
            let events = s.events.iter().filter(|e| e.seq >= from);
            jsonl::write_session(out, &s.header.header, events).map_err(io_err)
        }
        Command::Surface { target } => {
            let file = PathBuf::from(target);
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            writeln!(out, "{}", s.state.surface().to_json()).map_err(io_err)
        }
        Command::Derive { target } => {
            let file = PathBuf::from(target);
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            let messages = derive::derive(s.state.surface(), &s.events)
                .map_err(|e| Failure::Invalid(format!("{}: {e}", file.display())))?;
            let mut buf = Vec::new();
            for m in messages {
                buf.clear();
                m.write_json(&mut buf);
                buf.push(b'\n');
                out.write_all(&buf).map_err(io_err)?;
            }
            Ok(())
        }
        Command::Repair { dry_run, target } => {
            if !dry_run {
                return Err(Failure::Usage(
                    "file mode only inspects: use `repair --dry-run FILE` (repairing in place needs --store)".into(),
                ));
            }
            let file = PathBuf::from(target);
            let bytes = read_file(&file)?;
            let s = load(&file, &bytes, false)?;
            write_events(out, &s.state.closers())
        }
        Command::Import { .. } => Err(needs_store("import")),
        Command::Ls => Err(needs_store("ls")),
        Command::Verify { .. } => Err(needs_store("verify")),
        Command::Fork { .. } => Err(needs_store("fork")),
        Command::Rm { .. } => Err(needs_store("rm")),
        Command::Stats { .. } => Err(needs_store("stats")),
        Command::Demo { .. } => unreachable!("handled before the mode split"),
    }
}

fn write_events(out: &mut impl Write, events: &[OwnedEvent]) -> Result<(), Failure> {
    let mut buf = Vec::new();
    for e in events {
        buf.clear();
        e.write_json(&mut buf);
        buf.push(b'\n');
        out.write_all(&buf).map_err(io_err)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Store mode
// ---------------------------------------------------------------------------

/// The exit code of a store error: bad data or a bad request is 1, anything
/// about the files or the lock is 3.
fn store_err(e: store::Error) -> Failure {
    use store::Error as E;
    let m = e.to_string();
    match e {
        E::Rejected { .. }
        | E::Corrupt { .. }
        | E::NotFound(_)
        | E::Exists(_)
        | E::BadId { .. }
        | E::TooLarge { .. } => Failure::Invalid(m),
        E::Io { .. } | E::Locked { .. } | E::Poisoned(_) | E::Store(_) | E::ReadOnly => {
            Failure::Io(m)
        }
    }
}

fn open_read_only(dir: &Path) -> Result<Store, Failure> {
    Store::open_read_only(dir).map_err(store_err)
}

/// Opens the store with its write lock. Only `import` creates a store: the
/// other write commands need an existing one.
fn open_writer(dir: &Path, create: bool) -> Result<Store, Failure> {
    if !create && !dir.join(MANIFEST_FILE).is_file() {
        return Err(Failure::Io(format!(
            "{}: no store here (`import` creates one)",
            dir.display()
        )));
    }
    Store::open(dir, Options::default()).map_err(store_err)
}

fn session_id(target: OsString) -> Result<String, Failure> {
    target
        .into_string()
        .map_err(|t| Failure::Usage(format!("session id {t:?} is not UTF-8")))
}

fn sorted_ids(store: &Store) -> Vec<String> {
    let mut ids: Vec<String> = store.list().into_iter().map(|h| h.id).collect();
    ids.sort();
    ids
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn run_store(dir: &Path, command: Command, out: &mut impl Write) -> Result<(), Failure> {
    match command {
        Command::Check { .. } => Err(Failure::Usage(
            "`check` reads a file: in store mode use `verify [ID]` \
             (or drop --store / unset SESSIONLOG_STORE)"
                .into(),
        )),
        Command::Cat { from, target } => {
            let id = session_id(target)?;
            let store = open_read_only(dir)?;
            let events = store.read_from(&id, from.unwrap_or(0)).map_err(store_err)?;
            let header = store
                .list()
                .into_iter()
                .find(|h| h.id == id)
                .ok_or_else(|| store_err(store::Error::NotFound(id.clone())))?;
            jsonl::write_session(out, &header, &events).map_err(io_err)
        }
        Command::Surface { target } => {
            let id = session_id(target)?;
            let store = open_read_only(dir)?;
            let surface = store.surface(&id).map_err(store_err)?;
            writeln!(out, "{}", surface.to_json()).map_err(io_err)
        }
        Command::Derive { target } => {
            let id = session_id(target)?;
            let store = open_read_only(dir)?;
            let derived = store.derive(&id).map_err(store_err)?;
            let mut buf = Vec::new();
            for m in derived.messages() {
                buf.clear();
                m.write_json(&mut buf);
                buf.push(b'\n');
                out.write_all(&buf).map_err(io_err)?;
            }
            Ok(())
        }
        Command::Repair { dry_run, target } => {
            let id = session_id(target)?;
            if dry_run {
                // A read-only store synthesises the closers in memory: they
                // are the last `recovery.closers` events it reads.
                let store = open_read_only(dir)?;
                let (_, events) = store.load(&id).map_err(store_err)?;
                let n = store.recovery(&id).map_or(0, |r| r.closers) as usize;
                return write_events(out, &events[events.len().saturating_sub(n)..]);
            }
            let store = open_writer(dir, false)?;
            // Also the closers that opening the session appended, if any.
            let closers = store.repair(&id).map_err(store_err)?;
            write_events(out, &closers)?;
            store.close().map_err(store_err)
        }
        Command::Import { id, files } => import(dir, id, &files, out),
        Command::Ls => {
            let store = open_read_only(dir)?;
            let mut headers = store.list();
            headers.sort_by(|a, b| a.id.cmp(&b.id));
            for h in headers {
                writeln!(
                    out,
                    "{}\t{}\t{}",
                    h.id,
                    h.created_at,
                    h.parent_session.as_deref().unwrap_or("-")
                )
                .map_err(io_err)?;
            }
            Ok(())
        }
        Command::Verify { id } => {
            let store = open_read_only(dir)?;
            let ids = match id {
                Some(id) => vec![id],
                None => sorted_ids(&store),
            };
            let mut worst: Option<Failure> = None;
            let mut failed = 0;
            for id in &ids {
                match store.verify(id) {
                    Ok(r) => writeln!(
                        out,
                        "OK {id} events={} segments={} bytes={}",
                        r.events, r.segments, r.bytes
                    )
                    .map_err(io_err)?,
                    Err(e) => {
                        let f = store_err(e);
                        writeln!(out, "FAIL {id}").map_err(io_err)?;
                        out.flush().map_err(io_err)?;
                        eprintln!("error: {}", f.message());
                        failed += 1;
                        if worst.as_ref().is_none_or(|w| w.code() < f.code()) {
                            worst = Some(f);
                        }
                    }
                }
            }
            match worst {
                None => Ok(()),
                Some(f) if ids.len() == 1 => Err(f),
                Some(f) => Err(match f {
                    Failure::Io(_) => Failure::Io(format!(
                        "{failed} of {} sessions failed verification",
                        ids.len()
                    )),
                    _ => Failure::Invalid(format!(
                        "{failed} of {} sessions failed verification",
                        ids.len()
                    )),
                }),
            }
        }
        Command::Fork { src, child, at } => {
            let store = open_writer(dir, false)?;
            let (parent, events) = store.load(&src).map_err(store_err)?;
            let len = events.len() as u64;
            drop(events);
            let at = match at {
                Some(n) if n > len => {
                    return Err(Failure::Invalid(format!(
                        "fork {src:?} at {n}: the session has only {len} events"
                    )));
                }
                Some(n) => n,
                None => len,
            };
            let mut header = SessionHeader::new(child.clone(), now_ms());
            header.cwd = parent.cwd.clone();
            store.fork(&src, at, header).map_err(store_err)?;
            writeln!(out, "forked {child} from {src} at {at}").map_err(io_err)?;
            store.close().map_err(store_err)
        }
        Command::Rm { id } => {
            let store = open_writer(dir, false)?;
            store.delete(&id).map_err(store_err)?;
            writeln!(out, "removed {id}").map_err(io_err)?;
            store.close().map_err(store_err)
        }
        Command::Demo { .. } => unreachable!("handled before the mode split"),
        Command::Stats { id } => {
            let store = open_read_only(dir)?;
            let all = id.is_none();
            let ids = match id {
                Some(id) => vec![id],
                None => sorted_ids(&store),
            };
            let mut total = Totals::default();
            for id in &ids {
                let s = store.stats(id).map_err(store_err)?;
                total.add(&s);
                let age = s
                    .checkpoint_modified
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .map_or_else(|| "none".to_owned(), |d| format!("{}s", d.as_secs()));
                writeln!(
                    out,
                    "{id} events={} segments={} bytes={} bytes/event={} jsonl_bytes={} ratio={} since_checkpoint={} checkpoint_age={age}",
                    s.events,
                    s.segments,
                    s.bytes,
                    per_event(s.bytes, s.events),
                    s.jsonl_bytes,
                    ratio(s.bytes, s.jsonl_bytes),
                    s.events_since_checkpoint,
                )
                .map_err(io_err)?;
            }
            if all {
                writeln!(
                    out,
                    "total sessions={} events={} segments={} bytes={} bytes/event={} jsonl_bytes={} ratio={} since_checkpoint={}",
                    ids.len(),
                    total.events,
                    total.segments,
                    total.bytes,
                    per_event(total.bytes, total.events),
                    total.jsonl_bytes,
                    ratio(total.bytes, total.jsonl_bytes),
                    total.since_checkpoint,
                )
                .map_err(io_err)?;
            }
            Ok(())
        }
    }
}

#[derive(Default)]
struct Totals {
    events: u64,
    segments: u64,
    bytes: u64,
    jsonl_bytes: u64,
    since_checkpoint: u64,
}

impl Totals {
    fn add(&mut self, s: &store::SessionStats) {
        self.events += s.events;
        self.segments += s.segments;
        self.bytes += s.bytes;
        self.jsonl_bytes += s.jsonl_bytes;
        self.since_checkpoint += s.events_since_checkpoint;
    }
}

fn per_event(bytes: u64, events: u64) -> String {
    if events == 0 {
        "-".into()
    } else {
        format!("{:.1}", bytes as f64 / events as f64)
    }
}

fn ratio(bytes: u64, jsonl_bytes: u64) -> String {
    if jsonl_bytes == 0 {
        "-".into()
    } else {
        format!("{:.3}", bytes as f64 / jsonl_bytes as f64)
    }
}

/// Events per append when importing, and a bound on their estimated size
/// (well under the record limit).
const IMPORT_CHUNK_EVENTS: usize = 4096;
const IMPORT_CHUNK_BYTES: usize = 16 << 20;

fn import(
    dir: &Path,
    id: Option<String>,
    files: &[PathBuf],
    out: &mut impl Write,
) -> Result<(), Failure> {
    if id.is_some() && files.len() != 1 {
        return Err(Failure::Usage(
            "`import --id ID` takes exactly one FILE".into(),
        ));
    }
    let store = open_writer(dir, true)?;
    let mut worst: Option<Failure> = None;
    let mut failed = 0usize;
    for file in files {
        match import_file(&store, file, id.as_deref()) {
            Ok(line) => {
                writeln!(out, "{line}").map_err(io_err)?;
            }
            Err((f, fatal)) => {
                out.flush().map_err(io_err)?;
                eprintln!("error: {}", f.message());
                failed += 1;
                let code = f.code();
                if worst.as_ref().is_none_or(|w| w.code() < code) {
                    worst = Some(f);
                }
                if fatal {
                    // The store itself failed: later files would too.
                    let _ = store.close();
                    return Err(Failure::Io(format!(
                        "import stopped after {failed} failed file(s)"
                    )));
                }
            }
        }
    }
    store.close().map_err(store_err)?;
    match worst {
        None => Ok(()),
        Some(f) => {
            let m = format!("{failed} of {} files were not imported", files.len());
            Err(match f {
                Failure::Io(_) => Failure::Io(m),
                _ => Failure::Invalid(m),
            })
        }
    }
}

/// Imports one file. On failure the store is left without the session; the
/// flag says whether the store itself failed (stop importing).
fn import_file(store: &Store, file: &Path, id: Option<&str>) -> Result<String, (Failure, bool)> {
    let shown = file.display();
    let bytes = read_file(file).map_err(|f| (f, false))?;
    let s = load(file, &bytes, false).map_err(|f| (f, false))?;
    let mut header = s.header.header.clone();
    if let Some(id) = id {
        header.id = id.to_owned();
    }
    let id = header.id.clone();
    if s.events.is_empty() {
        // A session is stored from its first event: nothing to import.
        return Ok(format!(
            "skipped {id}: 0 events ({shown} has no events; an empty session is not stored)"
        ));
    }
    let fail = |e: store::Error| {
        let fatal = matches!(
            e,
            store::Error::Io { .. } | store::Error::Poisoned(_) | store::Error::Store(_)
        );
        (store_err(e).context(&shown), fatal)
    };
    store.create(header).map_err(fail)?;
    let appended = append_chunks(store, &id, &s.events).and_then(|()| store.repair(&id));
    match appended {
        Ok(closers) => Ok(format!(
            "imported {id}: {} events ({} closers)",
            s.events.len(),
            closers.len()
        )),
        Err(e) => {
            // Leave no half-imported session behind.
            if let Err(d) = store.delete(&id)
                && !matches!(d, store::Error::NotFound(_))
            {
                eprintln!("error: {shown}: removing the half-imported session {id:?}: {d}");
            }
            Err(fail(e))
        }
    }
}

fn append_chunks(store: &Store, id: &str, events: &[Event<'_>]) -> store::Result<()> {
    let mut start = 0;
    let mut size = 0;
    for (i, e) in events.iter().enumerate() {
        let estimate = e.kind.len() + e.data.get().len() + 64;
        if i > start && (i - start >= IMPORT_CHUNK_EVENTS || size + estimate > IMPORT_CHUNK_BYTES) {
            store.append(id, &events[start..i])?;
            start = i;
            size = 0;
        }
        size += estimate;
    }
    store.append(id, &events[start..])
}
