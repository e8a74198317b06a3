//! `sessionlog demo`: the main job on an embedded default, end to end.
//!
//! Creates a store, generates realistic sessions and appends them, crashes
//! in the middle of a tool call (a child process killed with SIGKILL),
//! reopens and shows the repair closers, derives the message history, and
//! exports JSONL and SQLite (schema 4), printing what it did and where the
//! files are.

use sessionlog::adapters::jsonl;
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::store::{Durability, Options, Store};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Sessions the demo generates.
const SESSIONS: usize = 16;
/// Turns per session.
const TURNS: usize = 40;
/// The session left with an interrupted tool call.
const CRASHED: &str = "demo-crashed";

/// Environment variable that makes the demo binary act as the crashing child.
pub const CHILD_ENV: &str = "SESSIONLOG_DEMO_CRASH_CHILD";

/// Runs the demo in `dir` (created; an earlier demo store there is replaced).
pub fn run(dir: &Path, out: &mut impl Write) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    prepare(dir)?;
    writeln!(out, "sessionlog demo in {}", dir.display()).map_err(|e| err(&e))?;

    // 1. Generate and append. Small segments, so that sessions span several
    // and the fork below has sealed segments to share.
    let options = || Options {
        segment_size: 64 << 10,
        ..Options::default()
    };
    let store = Store::open(dir, options()).map_err(|e| err(&e))?;
    // Written once the store exists, so only a directory this demo created
    // ever carries it (see `prepare`).
    std::fs::write(
        dir.join(MARKER),
        "made by `sessionlog demo`; the next demo run in this directory replaces it\n",
    )
    .map_err(|e| err(&e))?;
    let started = Instant::now();
    let mut events_total = 0;
    for i in 0..SESSIONS {
        let (header, events) = Sample::new(SampleConfig {
            turns: TURNS,
            seed: i as u64,
            ..SampleConfig::default()
        })
        .session(&format!("demo-{i:02}"));
        store.create(header).map_err(|e| err(&e))?;
        for batch in events.chunks(64) {
            store
                .append(&format!("demo-{i:02}"), batch)
                .map_err(|e| err(&e))?;
        }
        events_total += events.len();
    }
    let elapsed = started.elapsed();
    writeln!(
        out,
        "1. appended {events_total} events in {SESSIONS} sessions ({:.0} events/s, durable: fdatasync per batch of 64)",
        events_total as f64 / elapsed.as_secs_f64()
    )
    .map_err(|e| err(&e))?;
    // A subagent: a fork of the first session at its 1000th event.
    store
        .fork("demo-00", 1000, SessionHeader::new("demo-00-subagent", 0))
        .map_err(|e| err(&e))?;
    let shared = shared_segments(&dir.join("sessions"), "demo-00", "demo-00-subagent");
    writeln!(
        out,
        "   forked demo-00 at seq 1000 into demo-00-subagent: {} hard-linked, not copied",
        crate::failure::plural(shared as u64, "sealed segment")
    )
    .map_err(|e| err(&e))?;
    store.close().map_err(|e| err(&e))?;

    // 2. Crash in the middle of a tool call: a child process appends a
    //    session whose last tool call is running, then is killed.
    crash_child(dir)?;
    writeln!(out, "2. a child process appended {CRASHED} up to a running tool call and was killed with SIGKILL")
        .map_err(|e| err(&e))?;

    // 3. Reopen: recovery closes the interrupted turn.
    let store = Store::open(dir, options()).map_err(|e| err(&e))?;
    let closers = store.repair(CRASHED).map_err(|e| err(&e))?;
    writeln!(
        out,
        "3. reopened: recovery appended {} to {CRASHED}:",
        crate::failure::plural(closers.len() as u64, "closer")
    )
    .map_err(|e| err(&e))?;
    for c in &closers {
        let json = c.to_json();
        let shown: String = json.chars().take(150).collect();
        writeln!(
            out,
            "     {shown}{}",
            if json.len() > 150 { "..." } else { "" }
        )
        .map_err(|e| err(&e))?;
    }
    let before = store.load(CRASHED).map_err(|e| err(&e))?.1.len();
    store.repair(CRASHED).map_err(|e| err(&e))?;
    let after = store.load(CRASHED).map_err(|e| err(&e))?.1.len();
    writeln!(
        out,
        "   repairing again appends nothing ({before} events before, {after} after)"
    )
    .map_err(|e| err(&e))?;

    // 4. Derive the message history.
    let derived = store.derive("demo-00").map_err(|e| err(&e))?;
    let messages: Vec<String> = derived.messages().map(|m| m.to_json()).collect();
    let (_, log) = store.load("demo-00").map_err(|e| err(&e))?;
    writeln!(
        out,
        "4. demo-00: {} events derive to {} messages (after a compaction and a pruned tool output); the last one:",
        log.len(),
        messages.len()
    )
    .map_err(|e| err(&e))?;
    if let Some(last) = messages.last() {
        let shown: String = last.chars().take(150).collect();
        writeln!(out, "     {shown}...").map_err(|e| err(&e))?;
    }

    // 5. Export.
    let export = dir.join("export");
    std::fs::create_dir_all(&export).map_err(|e| err(&e))?;
    let jsonl_path = export.join(format!("{CRASHED}.jsonl"));
    let (header, events) = store.load(CRASHED).map_err(|e| err(&e))?;
    write_jsonl(&jsonl_path, &header, &events)?;
    writeln!(
        out,
        "5. exported {CRASHED} as harness JSONL: {}",
        jsonl_path.display()
    )
    .map_err(|e| err(&e))?;
    let db = export.join("sessions.db");
    let ids: Vec<String> = store
        .list()
        .map_err(|e| err(&e))?
        .into_iter()
        .map(|h| h.id)
        .collect();
    sessionlog::adapters::sqlite::export_db(&store, &ids, &db).map_err(|e| err(&e))?;
    writeln!(
        out,
        "   exported all {} to the harness's SQLite schema 4: {}",
        crate::failure::plural(ids.len() as u64, "session"),
        db.display()
    )
    .map_err(|e| err(&e))?;
    let stats = store.stats("demo-00").map_err(|e| err(&e))?;
    writeln!(
        out,
        "   demo-00 takes {} bytes on disk for {} bytes of plain JSONL ({:.2}x)",
        stats.bytes,
        stats.jsonl_bytes,
        stats.bytes as f64 / stats.jsonl_bytes as f64
    )
    .map_err(|e| err(&e))?;
    store.close().map_err(|e| err(&e))?;
    writeln!(
        out,
        "done: store in {}, exports in {}; try `sessionlog --store {} ls` \
         (after `cargo install --path .`; or `cargo run --release -- --store {} ls`)",
        dir.display(),
        export.display(),
        dir.display(),
        dir.display()
    )
    .map_err(|e| err(&e))?;
    Ok(())
}

/// How many segment files two session directories share (same inode).
fn shared_segments(sessions: &Path, a: &str, b: &str) -> usize {
    use std::os::unix::fs::MetadataExt;
    let inodes = |id: &str| -> Vec<u64> {
        std::fs::read_dir(sessions.join(id))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
                    .filter_map(|e| e.metadata().ok().map(|m| m.ino()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let theirs = inodes(b);
    inodes(a).iter().filter(|i| theirs.contains(i)).count()
}

/// The file a demo store carries so a later demo run can tell it made it.
const MARKER: &str = "DEMO-STORE";

/// Makes `dir` ready for a new demo store. A missing or empty directory is
/// used as it is. A directory is removed only when the demo itself made it:
/// it carries [`MARKER`], is a store this build reads, and holds nothing but
/// the demo's sessions (`demo-*`). Anything else (a real store, a demo store
/// a user imported into, any other file) is refused and left untouched.
fn prepare(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        return Err(format!(
            "{} is a file, not a directory; choose another directory",
            dir.display()
        ));
    }
    let empty = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .next()
        .is_none();
    if empty {
        return Ok(());
    }
    let refuse = |why: &str| {
        Err(format!(
            "{} is not empty and {why}; the demo never deletes what it did not \
             create: choose a new directory (e.g. `sessionlog demo demo-store-2`)",
            dir.display()
        ))
    };
    if !dir.join(MARKER).is_file() {
        return refuse("was not made by `sessionlog demo`");
    }
    let store = match Store::open_read_only(dir) {
        Ok(store) => store,
        Err(e) => return refuse(&format!("cannot be read as a demo store ({e})")),
    };
    let listed = match store.list() {
        Ok(listed) => listed,
        Err(e) => return refuse(&format!("cannot be listed ({e})")),
    };
    let foreign: Vec<String> = listed
        .into_iter()
        .map(|h| h.id)
        .filter(|id| !is_demo_session(id))
        .collect();
    drop(store);
    if let Some(id) = foreign.first() {
        return refuse(&format!(
            "holds session {id:?}, which the demo did not write ({} such)",
            foreign.len()
        ));
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("removing the old demo store: {e}"))
}

/// Whether `id` is one of the sessions the demo writes.
fn is_demo_session(id: &str) -> bool {
    id.starts_with("demo-")
}

fn write_jsonl(
    path: &PathBuf,
    header: &SessionHeader,
    events: &[OwnedEvent],
) -> Result<(), String> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(|e| e.to_string())?);
    jsonl::write_session(&mut f, header, events).map_err(|e| e.to_string())?;
    f.flush().map_err(|e| e.to_string())
}

/// Runs this binary again as the crashing child and kills it once it has
/// made the interrupted session durable.
fn crash_child(dir: &Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(exe)
        .env(CHILD_ENV, dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the crash child: {e}"))?;
    let mut ready = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut ready)
        .map_err(|e| e.to_string())?;
    child.kill().map_err(|e| e.to_string())?; // SIGKILL: no destructors, no close
    let _ = child.wait();
    if ready.trim() != "ready" {
        return Err(format!("the crash child failed: {ready:?}"));
    }
    Ok(())
}

/// The child's side: append a session that stops inside a tool call (Sync
/// durability: it is on disk when append returns), say so, then wait to be
/// killed.
pub fn crash_child_main(dir: &Path) -> ! {
    let result = (|| -> Result<(), String> {
        let store = Store::open(
            dir,
            Options {
                durability: Durability::Sync,
                ..Options::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let (header, events) = Sample::new(SampleConfig {
            turns: 5,
            seed: 99,
            interrupt_last_turn: true,
            ..SampleConfig::default()
        })
        .session(CRASHED);
        store.create(header).map_err(|e| e.to_string())?;
        for batch in events.chunks(16) {
            store.append(CRASHED, batch).map_err(|e| e.to_string())?;
        }
        println!("ready");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
        std::mem::forget(store); // never closed: the kill is the end
        Ok(())
    })();
    if let Err(e) = result {
        println!("error: {e}");
        std::process::exit(1);
    }
    loop {
        std::thread::park();
    }
}
