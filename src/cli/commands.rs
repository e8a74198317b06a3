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

use crate::args::{Cli, Command};
use crate::failure::{
    Failure, escape_field, io_err, open_read_only, open_writer, plural, store_err,
};
use clap::Parser;
use sessionlog::adapters::harness;
use sessionlog::adapters::jsonl::{self, JsonlSession};
use sessionlog::derive;
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::store::{self, Store};
use std::ffi::{OsStr, OsString};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = run(cli, &mut out).and_then(|()| out.flush().map_err(io_err));
    match result {
        Ok(()) | Err(Failure::OutputClosed) => ExitCode::SUCCESS,
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
    #[cfg(feature = "archive")]
    if let Some(url) = &cli.archive {
        let archive =
            sessionlog::store::ArchiveOptions::from_url(url, Vec::<(String, String)>::new())
                .map_err(Failure::Usage)?;
        let _ = crate::failure::ARCHIVE.set(archive);
    }
    match cli.store {
        None => run_file(cli.command, out),
        Some(dir) => run_store(&dir, cli.command, out),
    }
}

// ---------------------------------------------------------------------------
// File mode
// ---------------------------------------------------------------------------

/// Reads a session file; a Zstandard log (by its magic number) is decoded
/// to its JSONL text, within the limits for hostile input.
fn read_file(path: &Path) -> Result<Vec<u8>, Failure> {
    let bytes = std::fs::read(path).map_err(|e| Failure::Io(format!("{}: {e}", path.display())))?;
    if !harness::is_zstd(&bytes) {
        return Ok(bytes);
    }
    let z = harness::read_zstd_session(&bytes)
        .map_err(|e| Failure::Invalid(format!("{}: {e}", path.display())))?;
    if let Some(t) = &z.torn {
        eprintln!("note: {}: torn final zstd frame: {t}", path.display());
    }
    Ok(z.text)
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

fn needs_store(command: &str) -> Failure {
    Failure::Usage(format!(
        "`{command}` works on a store: pass --store DIR or set SESSIONLOG_STORE"
    ))
}

fn run_file(command: Command, out: &mut impl Write) -> Result<(), Failure> {
    match command {
        Command::Check { strict, file } => {
            let bytes = read_file(&file)?;
            // As a validator, check reports every complete line's first
            // violation; `load` (cat, surface, ...) keeps the loader's rule.
            match jsonl::check_session(&bytes, strict) {
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
        Command::Tail { .. } => Err(needs_store("tail")),
        Command::Export { .. } => Err(needs_store("export")),
        Command::Ls { .. } => Err(needs_store("ls")),
        Command::Verify { .. } => Err(needs_store("verify")),
        Command::SalvageJournals => Err(needs_store("salvage-journals")),
        Command::Fork { .. } => Err(needs_store("fork")),
        Command::Rm { .. } => Err(needs_store("rm")),
        #[cfg(feature = "archive")]
        Command::TakeOver { .. } => Err(needs_store("take-over")),
        #[cfg(feature = "archive")]
        Command::ArchiveSync => Err(needs_store("archive-sync")),
        Command::Stats { .. } => Err(needs_store("stats")),
        Command::Compress { .. } => Err(needs_store("compress")),
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

fn session_id(target: OsString) -> Result<String, Failure> {
    target
        .into_string()
        .map_err(|t| Failure::Usage(format!("session id {t:?} is not UTF-8")))
}

/// Refuses, in store mode, a `FILE|ID` target that names a file (an
/// existing file, or a name ending in `.jsonl`, `.zstd` or `.zst`) and no
/// stored session: reading a file is file mode, which needs no store.
fn refuse_file_target(dir: &Path, command: &str, target: &OsStr) -> Result<(), Failure> {
    let path = Path::new(target);
    let names_file = path.is_file()
        || path
            .extension()
            .is_some_and(|e| e == "jsonl" || e == "zstd" || e == "zst");
    if !names_file {
        return Ok(());
    }
    let stored = target
        .to_str()
        .is_some_and(|id| Store::open_read_only(dir).is_ok_and(|s| s.exists(id).unwrap_or(false)));
    if stored {
        return Ok(());
    }
    let flag = std::env::args_os()
        .any(|a| a == "--store" || a.to_str().is_some_and(|a| a.starts_with("--store=")));
    let env = std::env::var_os("SESSIONLOG_STORE").is_some();
    let how = match (flag, env) {
        (true, true) => format!(
            "drop --store and unset SESSIONLOG_STORE (`env -u SESSIONLOG_STORE sessionlog {command} {}`)",
            path.display()
        ),
        (true, false) => format!("drop --store (`sessionlog {command} {}`)", path.display()),
        _ => format!(
            "unset SESSIONLOG_STORE (`env -u SESSIONLOG_STORE sessionlog {command} {}`)",
            path.display()
        ),
    };
    Err(Failure::Usage(format!(
        "{} is a file, not a session of the store {}: reading a file is file mode, which needs no store: {how}",
        path.display(),
        dir.display()
    )))
}

/// A session whose HEADER was damaged cannot be listed: `ls` and `stats`
/// say on stderr that something is there rather than let it vanish from
/// their output without a word.
pub(crate) fn warn_unaccounted(store: &Store) -> Result<(), Failure> {
    let unaccounted = store.unaccounted().map_err(store_err)?.len() as u64;
    if unaccounted > 0 {
        let (what, verb, them) = if unaccounted == 1 {
            ("entry", "is", "it")
        } else {
            ("entries", "are", "them")
        };
        eprintln!(
            "warning: {unaccounted} {what} of sessions/ {verb} not a readable session (kept, never deleted, not counted here): `verify` lists {them}"
        );
    }
    Ok(())
}

/// Prints what the store keeps but cannot read (entries of `sessions/`
/// that are not sessions, damaged journal files); returns how many.
fn unreadable(store: &Store, out: &mut impl Write) -> Result<u64, Failure> {
    let mut n = 0;
    for u in store.unaccounted().map_err(store_err)? {
        writeln!(out, "UNACCOUNTED {}: {}", u.path.display(), u.reason).map_err(io_err)?;
        n += 1;
    }
    for d in store.damaged_journals().map_err(store_err)? {
        writeln!(
            out,
            "DAMAGED {}: {} at offset {}",
            d.path.display(),
            d.reason,
            d.offset
        )
        .map_err(io_err)?;
        n += 1;
    }
    Ok(n)
}

pub(crate) fn sorted_ids(store: &Store) -> Result<Vec<String>, Failure> {
    Ok(store
        .list()
        .map_err(store_err)?
        .into_iter()
        .map(|h| h.id)
        .collect())
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
        Command::Tail {
            follow,
            from,
            lines,
            target,
        } => {
            let id = session_id(target)?;
            let store = open_read_only(dir)?;
            // The last lines are counted back from the end of the log the
            // follower follows: a replacement between the count and the
            // follow's start (another incarnation, maybe shorter) means
            // counting again, never following the new log from a seq of
            // the old one.
            let mut tail = loop {
                let incarnation = store.incarnation(&id).map_err(store_err)?;
                let from = match from {
                    Some(seq) => seq,
                    None => store
                        .next_seq(&id)
                        .map_err(store_err)?
                        .saturating_sub(lines.unwrap_or(10)),
                };
                let tail = store.tail(&id, from).map_err(store_err)?;
                if store.incarnation(&id).map_err(store_err)? == incarnation {
                    break tail;
                }
            };
            write_events(out, &tail.poll().map_err(store_err)?)?;
            out.flush().map_err(io_err)?;
            if !follow {
                return Ok(());
            }
            // Until interrupted, the output closed or the session deleted
            // or replaced (both errors, exit 1).
            loop {
                let events = tail
                    .wait(std::time::Duration::from_secs(1))
                    .map_err(store_err)?;
                write_events(out, &events)?;
                out.flush().map_err(io_err)?;
            }
        }
        Command::Cat { from, target } => {
            refuse_file_target(dir, "cat", &target)?;
            let id = session_id(target)?;
            let store = open_read_only(dir)?;
            let events = store.read_from(&id, from.unwrap_or(0)).map_err(store_err)?;
            let header = store.header(&id).map_err(store_err)?;
            // A read-only store shows an open last turn closed: its last
            // `recovery.closers` events are synthesised, not stored.
            let closers = store.recovery(&id).map_or(0, |r| r.closers) as usize;
            jsonl::write_session(out, &header, &events).map_err(io_err)?;
            let shown = closers.min(events.len());
            if shown > 0 {
                out.flush().map_err(io_err)?;
                let what = if shown == 1 {
                    "the last event shown is a closer".to_owned()
                } else {
                    format!("the last {shown} events shown are closers")
                };
                eprintln!(
                    "note: the last turn of {id:?} is open; {what} sessionlog synthesises, not stored; `repair {id}` stores them"
                );
            }
            Ok(())
        }
        Command::Surface { target } => {
            refuse_file_target(dir, "surface", &target)?;
            let id = session_id(target)?;
            let store = open_read_only(dir)?;
            // The surface alone may come from a checkpoint without reading
            // the log; derive checks every record the checkpoint covered,
            // so damage is refused as `cat`, `derive` and `stats` refuse it.
            store.derive(&id).map_err(store_err)?;
            let surface = store.surface(&id).map_err(store_err)?;
            writeln!(out, "{}", surface.to_json()).map_err(io_err)
        }
        Command::Derive { target } => {
            refuse_file_target(dir, "derive", &target)?;
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
            refuse_file_target(dir, "repair --dry-run", &target)?;
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
        Command::Import {
            id,
            id_from_filename,
            replace,
            no_repair,
            quiet,
            progress,
            files,
        } => crate::transfer::import(
            dir,
            &files,
            crate::transfer::ImportArgs {
                id,
                id_from_filename,
                replace,
                no_repair,
                quiet,
                progress,
            },
            out,
        ),
        Command::Export {
            ids,
            all,
            to,
            pack_chunks,
            zstd,
            schema,
            quiet,
            salvage,
        } => crate::transfer::export(
            dir,
            crate::transfer::ExportArgs {
                ids,
                all,
                to,
                pack_chunks,
                zstd,
                schema,
                quiet,
                salvage,
            },
            out,
        ),
        Command::Ls { json } => {
            let store = open_read_only(dir)?;
            let headers = store.list().map_err(store_err)?;
            warn_unaccounted(&store)?;
            if json {
                let mut buf = b"[".to_vec();
                for (i, h) in headers.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    h.write_json(&mut buf);
                }
                buf.extend_from_slice(b"]\n");
                return out.write_all(&buf).map_err(io_err);
            }
            for h in headers {
                writeln!(
                    out,
                    "{}\t{}\t{}",
                    escape_field(&h.id),
                    h.created_at,
                    h.parent_session.as_deref().map_or("-".into(), escape_field)
                )
                .map_err(io_err)?;
            }
            Ok(())
        }
        Command::Verify { id, quiet } => {
            let store = open_read_only(dir)?;
            let whole_store = id.is_none();
            let ids = match id {
                Some(id) => vec![id],
                None => sorted_ids(&store)?,
            };
            let mut worst: Option<Failure> = None;
            let mut failed = 0;
            let mut progress = crate::progress::Progress::new("verify", ids.len() as u64, quiet);
            for id in &ids {
                match store.verify(id) {
                    Ok(r) => {
                        progress.println(
                            out,
                            &format!(
                                "OK {} events={} segments={} bytes={}",
                                escape_field(id),
                                r.events,
                                r.segments,
                                r.bytes
                            ),
                        )?;
                        progress.done(r.events);
                    }
                    Err(e) => {
                        let f = store_err(e);
                        progress.println(out, &format!("FAIL {}", escape_field(id)))?;
                        progress.done(0);
                        eprintln!("error: {}", f.message());
                        failed += 1;
                        if worst.as_ref().is_none_or(|w| w.code() < f.code()) {
                            worst = Some(f);
                        }
                    }
                }
            }
            progress.finish();
            // What the store keeps but cannot read: never silently absent
            // from a check of the whole store.
            let kept = if whole_store {
                unreadable(&store, out)?
            } else {
                0
            };
            match worst {
                None if kept == 0 => Ok(()),
                Some(f) if ids.len() == 1 && kept == 0 => Err(f),
                _ => {
                    let mut m = format!(
                        "{failed} of {} failed verification",
                        plural(ids.len() as u64, "session")
                    );
                    if kept > 0 {
                        m.push_str(&format!(
                            "; {} kept but not readable (listed above, as UNACCOUNTED or DAMAGED)\nhint: nothing was changed; an UNACCOUNTED directory is not a session until its HEADER is mended (it is never deleted); `salvage-journals` writes back what a DAMAGED journal still holds and moves it aside",
                            plural(kept, "file")
                        ));
                    }
                    Err(match worst {
                        Some(Failure::Io(_)) => Failure::Io(m),
                        _ => Failure::Invalid(m),
                    })
                }
            }
        }
        Command::SalvageJournals => {
            let store = open_writer(dir, false)?;
            let done = store.salvage_journals().map_err(store_err)?;
            let stayed: Vec<String> = done
                .iter()
                .filter(|s| !s.moved)
                .map(|s| s.kept.display().to_string())
                .collect();
            if done.is_empty() {
                writeln!(out, "no damaged journal file without a writer").map_err(io_err)?;
            }
            for s in done {
                writeln!(
                    out,
                    "salvaged {} ({} at offset {}): {}; {} read",
                    s.damage.path.display(),
                    s.damage.reason,
                    s.damage.offset,
                    if s.moved {
                        format!("kept as {}", s.kept.display())
                    } else {
                        "not moved (a session below is still taken)".to_owned()
                    },
                    if s.entries == 1 {
                        "1 entry".to_owned()
                    } else {
                        format!("{} entries", s.entries)
                    },
                )
                .map_err(io_err)?;
                for (id, n) in &s.replayed {
                    writeln!(
                        out,
                        "  {}: {} written back",
                        escape_field(id),
                        plural(*n, "record")
                    )
                    .map_err(io_err)?;
                }
                for (id, why) in &s.skipped {
                    writeln!(out, "  {}: not written back: {why}", escape_field(id))
                        .map_err(io_err)?;
                }
                for (offset, why) in &s.unparsed {
                    writeln!(out, "  entry at offset {offset} not readable: {why}")
                        .map_err(io_err)?;
                }
                if s.unread > 0 {
                    writeln!(
                        out,
                        "  {} not read from offset {} on (a torn tail, or entries behind damage: they stay in the kept file)",
                        plural(s.unread, "non-zero byte"),
                        s.end
                    )
                    .map_err(io_err)?;
                }
            }
            if stayed.is_empty() {
                Ok(())
            } else {
                // Like a session another process writes elsewhere: exit 3.
                Err(Failure::Io(format!(
                    "{} not moved: another process took one of its sessions and has not written its records back; run salvage-journals again once it lets the session go",
                    stayed.join(", ")
                )))
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
                        "fork {src:?} at {n}: the session has only {}",
                        plural(len, "event")
                    )));
                }
                Some(n) => n,
                None => len,
            };
            let mut header = SessionHeader::new(child.clone(), now_ms());
            header.cwd = parent.cwd.clone();
            store.fork(&src, at, header).map_err(|e| match e {
                store::Error::Exists(_) => Failure::Invalid(format!(
                    "{e}\nhint: choose another CHILD id; `rm {child}` first to replace it"
                )),
                e => store_err(e),
            })?;
            writeln!(
                out,
                "forked {} from {} at {at}",
                escape_field(&child),
                escape_field(&src)
            )
            .map_err(io_err)?;
            store.close().map_err(store_err)
        }
        Command::Rm { id } => {
            let store = open_writer(dir, false)?;
            store.delete(&id).map_err(store_err)?;
            writeln!(out, "removed {}", escape_field(&id)).map_err(io_err)?;
            store.close().map_err(store_err)
        }
        Command::Demo { .. } => unreachable!("handled before the mode split"),
        #[cfg(feature = "archive")]
        Command::TakeOver { id } => {
            let store = open_writer(dir, false)?;
            store.take_over(&id).map_err(store_err)?;
            writeln!(out, "took {} over", escape_field(&id)).map_err(io_err)?;
            store.close().map_err(store_err)
        }
        #[cfg(feature = "archive")]
        Command::ArchiveSync => archive_sync(dir, out),
        Command::Stats { id, json } => crate::space::stats(dir, id, json, out),
        Command::Compress { id, seal } => crate::space::compress(dir, id, seal, out),
    }
}

/// `archive-sync`: everything to the bucket now.
#[cfg(feature = "archive")]
fn archive_sync(dir: &Path, out: &mut impl Write) -> Result<(), Failure> {
    let store = open_writer(dir, false)?;
    let report = store.archive_sync().map_err(store_err)?;
    writeln!(
        out,
        "uploaded {} objects, evicted {} segments",
        report.uploaded, report.evicted
    )
    .map_err(io_err)?;
    store.close().map_err(store_err)
}
