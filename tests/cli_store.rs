//! Store mode of the CLI (`sessionlog --store DIR ...`), run as a process.
//!
//! Most tests use small sessions written here. The fixture test imports real
//! harness logs from `../shared/fixtures/harness-jsonl/` and checks that the
//! store prints what file mode prints for the same file; it says so loudly and
//! skips when the fixtures are absent, unless `SESSIONLOG_REQUIRE_FIXTURES`
//! is set (then their absence fails).

use serde_json::Value;
use sessionlog::json::value_eq;
use sessionlog::store::{Options, Store};
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

/// What a run of the CLI produced.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the CLI with `SESSIONLOG_STORE` unset (file mode unless `--store`).
fn cli(args: &[&str]) -> Run {
    run(Command::new(env!("CARGO_BIN_EXE_sessionlog"))
        .env_remove("SESSIONLOG_STORE")
        .args(args))
}

/// Runs the CLI in store mode on `store`.
fn sl(store: &Path, args: &[&str]) -> Run {
    let mut all = vec!["--store", store.to_str().expect("UTF-8 path")];
    all.extend_from_slice(args);
    cli(&all)
}

fn run(cmd: &mut Command) -> Run {
    let out = cmd.output().expect("run sessionlog");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs and requires exit 0; returns stdout.
fn ok(store: &Path, args: &[&str]) -> String {
    let r = sl(store, args);
    assert_eq!(
        r.code, 0,
        "sessionlog {args:?} exited {}: {}",
        r.code, r.stderr
    );
    r.stdout
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn assert_values_eq(what: &str, got: &[Value], want: &[Value]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            value_eq(g, w),
            "{what}: value {i} differs:\n  got      {g}\n  expected {w}"
        );
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

const HEADER: &str = r#"{"type":"session","version":0,"id":"s1","createdAt":1000,"cwd":"/w"}"#;

/// A balanced session: one turn, one step, one assistant message.
const BALANCED: [&str; 6] = [
    r#"{"type":"user/message","seq":0,"time":1001,"data":{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"},"role":"user","id":"u1"},"surfaceOp":"append"}"#,
    r#"{"type":"turn/start","seq":1,"time":1002,"data":{"turn":1}}"#,
    r#"{"type":"step/start","seq":2,"time":1003,"data":{"turn":1,"step":1}}"#,
    r#"{"type":"assistant/message","seq":3,"time":1004,"data":{"turn":1,"step":1,"message":{"role":"assistant","content":[{"type":"text","text":"hello"}],"source":{"kind":"model"},"id":"a1"}},"surfaceOp":"append"}"#,
    r#"{"type":"step/end","seq":4,"time":1005,"data":{"turn":1,"step":1}}"#,
    r#"{"type":"turn/end","seq":5,"time":1006,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
];

/// A session whose turn was interrupted with a tool call pending.
const OPEN: [&str; 4] = [
    r#"{"type":"turn/start","seq":0,"time":2001,"data":{"turn":1}}"#,
    r#"{"type":"step/start","seq":1,"time":2002,"data":{"turn":1,"step":1}}"#,
    r#"{"type":"assistant/message","seq":2,"time":2003,"data":{"turn":1,"step":1,"message":{"role":"assistant","content":[{"type":"tool-call","id":"c1","name":"bash","arguments":"{}"}],"source":{"kind":"model"},"id":"a2"}},"surfaceOp":"append"}"#,
    r#"{"type":"tool/call","seq":3,"time":2004,"data":{"turn":1,"step":1,"callId":"c1","name":"bash","arguments":"{}"}}"#,
];

/// Writes a session file: the header (with `id`), then the lines.
fn write_session(dir: &Path, name: &str, id: &str, lines: &[&str]) -> PathBuf {
    let mut text = HEADER.replace("\"s1\"", &Value::from(id).to_string());
    text.push('\n');
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write session file");
    path
}

/// The segment files of every session in the store.
fn segment_files(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(store.join("sessions")).expect("sessions dir") {
        let d = d.expect("entry").path();
        for f in std::fs::read_dir(&d).expect("session dir") {
            let f = f.expect("entry").path();
            if f.extension().is_some_and(|e| e == "seg") {
                out.push(f);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn import_cat_matches_file_mode_and_rm_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let store = tmp.path().join("store");
    let out = ok(&store, &["import", path_str(&file)]);
    assert_eq!(out, "imported s1: 6 events (0 closers)\n");

    let file_cat = cli(&["cat", path_str(&file)]);
    assert_eq!(file_cat.code, 0);
    let got = ok(&store, &["cat", "s1"]);
    assert_values_eq("cat", &json_lines(&got), &json_lines(&file_cat.stdout));
    // --from keeps the header and starts the events at the seq.
    let from = json_lines(&ok(&store, &["cat", "s1", "--from", "4"]));
    assert_eq!(from.len(), 3);
    assert_eq!(from[0]["type"], "session");
    assert_eq!(from[1]["seq"], 4);

    for cmd in ["surface", "derive"] {
        let want = cli(&[cmd, path_str(&file)]);
        assert_eq!(want.code, 0);
        assert_values_eq(
            cmd,
            &json_lines(&ok(&store, &[cmd, "s1"])),
            &json_lines(&want.stdout),
        );
    }

    assert_eq!(ok(&store, &["ls"]), "s1\t1000\t-\n");
    assert_eq!(ok(&store, &["rm", "s1"]), "removed s1\n");
    assert_eq!(ok(&store, &["ls"]), "");
    let r = sl(&store, &["cat", "s1"]);
    assert_eq!(r.code, 1, "a removed session is not found");
    assert!(r.stderr.contains("does not exist"), "{}", r.stderr);
    assert_eq!(sl(&store, &["rm", "s1"]).code, 1);
}

#[test]
fn store_from_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let store = tmp.path().join("envstore");
    let env_run = |args: &[&str]| {
        run(Command::new(env!("CARGO_BIN_EXE_sessionlog"))
            .env("SESSIONLOG_STORE", &store)
            .args(args))
    };
    let r = env_run(&["import", path_str(&file)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(store.join("sessions").is_dir(), "the store is the env's");
    let r = env_run(&["ls"]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "s1\t1000\t-\n"));
    // --store wins over the environment.
    let other = tmp.path().join("other");
    ok(&other, &["import", path_str(&file)]);
    ok(&other, &["rm", "s1"]);
    assert_eq!(env_run(&["ls"]).stdout, "s1\t1000\t-\n");
}

#[test]
fn import_repairs_an_open_turn_and_reports_the_closers() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "open.jsonl", "open", &OPEN);
    let closers = cli(&["repair", "--dry-run", path_str(&file)]);
    assert_eq!(closers.code, 0);
    let closers = json_lines(&closers.stdout);
    assert_eq!(closers.len(), 3, "tool/result, step/end, turn/end");

    let store = tmp.path().join("store");
    let out = ok(&store, &["import", path_str(&file)]);
    assert_eq!(out, "imported open: 4 events (3 closers)\n");
    let mut want = json_lines(&cli(&["cat", path_str(&file)]).stdout);
    want.extend(closers);
    assert_values_eq("cat", &json_lines(&ok(&store, &["cat", "open"])), &want);
    // Balanced now: nothing to repair, nothing would be.
    assert_eq!(ok(&store, &["repair", "--dry-run", "open"]), "");
    assert_eq!(ok(&store, &["repair", "open"]), "");
}

#[test]
fn repair_closes_a_stored_open_turn_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let file = write_session(tmp.path(), "open.jsonl", "open", &OPEN);
    {
        // A writer that crashed mid-turn: the events are stored, no closers.
        let store = Store::open(&dir, Options::default()).unwrap();
        let bytes = std::fs::read(&file).unwrap();
        let s = sessionlog::adapters::jsonl::read_session(&bytes, false).unwrap();
        store.create(s.header.header.clone()).unwrap();
        store.append("open", &s.events).unwrap();
        store.close().unwrap();
    }
    let want = json_lines(&cli(&["repair", "--dry-run", path_str(&file)]).stdout);
    assert_eq!(want.len(), 3);
    // Inspection shows the closers and writes nothing.
    let dry = json_lines(&ok(&dir, &["repair", "--dry-run", "open"]));
    assert_values_eq("repair --dry-run", &dry, &want);
    assert_values_eq(
        "repair --dry-run again",
        &json_lines(&ok(&dir, &["repair", "--dry-run", "open"])),
        &want,
    );
    // Repair appends them, once.
    assert_values_eq("repair", &json_lines(&ok(&dir, &["repair", "open"])), &want);
    assert_eq!(ok(&dir, &["repair", "open"]), "");
    let cat = json_lines(&ok(&dir, &["cat", "open"]));
    assert_eq!(cat.len(), 1 + 4 + 3);
    assert_values_eq("tail of cat", &cat[5..], &want);
    assert!(ok(&dir, &["verify", "open"]).starts_with("OK open events=7 "));
}

/// Only `repair` stores closers: `compress` (of one session or all, with
/// `--seal` too) takes a session for writing and leaves its open turn open
/// (before, it appended the closers without a word).
#[test]
fn compress_leaves_an_open_turn_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let file = write_session(tmp.path(), "open.jsonl", "open", &OPEN);
    ok(&dir, &["import", "-q", "--no-repair", path_str(&file)]);
    let before = ok(&dir, &["verify", "open"]);
    assert!(before.starts_with("OK open events=4 "), "{before}");
    for args in [
        &["compress", "open"][..],
        &["compress"][..],
        &["compress", "--seal", "open"][..],
    ] {
        ok(&dir, args);
        let now = ok(&dir, &["verify", "open"]);
        assert!(
            now.starts_with("OK open events=4 "),
            "after {args:?}: {now}"
        );
    }
    assert_eq!(json_lines(&ok(&dir, &["repair", "open"])).len(), 3);
}

/// A session another process writes fails its own source of an import
/// (exit 3, with a hint), and the other sources are still imported (the
/// lock used to stop the whole import).
#[test]
fn an_import_goes_on_past_a_session_another_writer_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let held = write_session(tmp.path(), "held.jsonl", "held", &BALANCED);
    let free = write_session(tmp.path(), "free.jsonl", "free", &BALANCED);
    ok(&dir, &["import", "-q", path_str(&held)]);
    let writer = Store::open(&dir, Options::default()).unwrap();
    writer.repair("held").unwrap(); // takes its writer lock
    let r = sl(
        &dir,
        &[
            "import",
            "-q",
            "--replace",
            path_str(&held),
            path_str(&free),
        ],
    );
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("another process (or handle) is writing that session"),
        "{}",
        r.stderr
    );
    assert!(r.stdout.contains("imported free: 6 events"), "{}", r.stdout);
    drop(writer);
    assert!(ok(&dir, &["verify", "free"]).starts_with("OK free events=6 "));
}

/// verify fails over a damaged checkpoint (a small session's is embedded
/// in its HEADER), and its hint says the log is whole without it and how a
/// new one gets written.
#[test]
fn verify_reports_a_damaged_checkpoint_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let file = write_session(tmp.path(), "s.jsonl", "s", &BALANCED);
    ok(&dir, &["import", "-q", path_str(&file)]);
    let sdir = Store::session_dir_in(&dir, "s").unwrap();
    let (held_in, _) = common::checkpoint_place(&sdir).expect("a checkpoint");
    assert!(held_in.ends_with("HEADER"), "{}", held_in.display());
    let mut bytes = common::read_checkpoint(&sdir);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    common::write_checkpoint_bytes(&sdir, &bytes);
    let r = sl(&dir, &["verify", "s"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.starts_with("FAIL s"), "{}", r.stdout);
    assert!(
        r.stderr.contains("HEADER") && r.stderr.contains("checkpoint embedded"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("reads whole without its checkpoint"),
        "{}",
        r.stderr
    );
    // Once a writer has taken the session, its close writes a new one.
    ok(&dir, &["repair", "s"]);
    assert!(ok(&dir, &["verify", "s"]).starts_with("OK s events=6 "));
}

#[test]
fn fork_seeds_a_child_that_ends_with_end_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let store = tmp.path().join("store");
    ok(&store, &["import", path_str(&file)]);

    assert_eq!(
        ok(&store, &["fork", "s1", "kid"]),
        "forked kid from s1 at 6\n"
    );
    let cat = json_lines(&ok(&store, &["cat", "kid"]));
    let h = &cat[0];
    assert_eq!(h["id"], "kid");
    assert_eq!(h["parentSession"], "s1");
    assert_eq!(h["seedLength"], 6);
    assert_eq!(h["cwd"], "/w", "cwd is the parent's");
    assert!(h["createdAt"].as_u64().unwrap() > 1000, "createdAt is now");
    assert_eq!(cat.len(), 1 + 6 + 1);
    let parent = json_lines(&ok(&store, &["cat", "s1"]));
    assert_values_eq("seed", &cat[1..7], &parent[1..]);
    let last = cat.last().unwrap();
    assert_eq!(
        (&last["type"], &last["seq"]),
        (&"session/end-seed".into(), &6.into())
    );

    assert_eq!(
        ok(&store, &["fork", "s1", "short", "--at", "1"]),
        "forked short from s1 at 1\n"
    );
    let short = json_lines(&ok(&store, &["cat", "short"]));
    assert_eq!(short[0]["seedLength"], 1);
    assert_eq!(short.len(), 1 + 1 + 1);
    assert_eq!(short[2]["type"], "session/end-seed");

    let ls = ok(&store, &["ls"]);
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 3, "{ls}");
    assert!(
        lines[0].starts_with("kid\t") && lines[0].ends_with("\ts1"),
        "{ls}"
    );
    assert_eq!(lines[1], "s1\t1000\t-");

    let r = sl(&store, &["fork", "s1", "kid"]);
    assert_eq!(r.code, 1, "the child exists: {}", r.stderr);
    assert!(r.stderr.contains("already exists"), "{}", r.stderr);
    let r = sl(&store, &["fork", "s1", "far", "--at", "7"]);
    assert_eq!(r.code, 1, "past the end: {}", r.stderr);
    let r = sl(&store, &["fork", "nope", "x"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("nope"), "{}", r.stderr);
}

#[test]
fn verify_reports_a_flipped_byte_naming_the_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write_session(tmp.path(), "a.jsonl", "a", &BALANCED);
    let b = write_session(tmp.path(), "b.jsonl", "b", &BALANCED);
    let store = tmp.path().join("store");
    ok(&store, &["import", path_str(&a)]);
    let out = ok(&store, &["verify"]);
    assert!(out.starts_with("OK a events=6 segments=1 bytes="), "{out}");
    let segs = segment_files(&store);
    assert_eq!(segs.len(), 1);
    let seg = &segs[0];
    assert_eq!(seg.file_name().unwrap(), "00000000000000000000.seg");
    ok(&store, &["import", path_str(&b)]);
    assert_eq!(ok(&store, &["verify"]).lines().count(), 2);

    // Offset 100 is well inside the first record (the header is 64 bytes).
    let mut bytes = std::fs::read(seg).unwrap();
    bytes[100] ^= 0x55;
    std::fs::write(seg, &bytes).unwrap();

    let r = sl(&store, &["verify", "a"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains(path_str(seg)),
        "the error names the segment file: {}",
        r.stderr
    );
    // All sessions: the damaged one fails, the other is still checked.
    let r = sl(&store, &["verify"]);
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("FAIL a"), "{}", r.stdout);
    assert!(r.stdout.contains("OK b events=6"), "{}", r.stdout);
    assert!(
        r.stderr.contains("00000000000000000000.seg"),
        "{}",
        r.stderr
    );
    // Reading it is refused too.
    assert_eq!(sl(&store, &["cat", "a"]).code, 1);
}

/// `verify` of the whole store reports what the store keeps but cannot
/// read: a session whose `HEADER` was damaged (gone from `ls`, so it must
/// not be gone from `verify` too) and a journal file replay refuses;
/// `salvage-journals` deals with the journal, never with the session.
#[test]
fn verify_reports_unreadable_sessions_and_journals_and_salvage_moves_the_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write_session(tmp.path(), "a.jsonl", "a", &BALANCED);
    let b = write_session(tmp.path(), "b.jsonl", "b", &BALANCED);
    let store = tmp.path().join("store");
    ok(&store, &["import", path_str(&a), path_str(&b)]);
    assert_eq!(ok(&store, &["verify"]).lines().count(), 2);

    // A flipped byte in b's HEADER: b is no longer a readable session.
    let header = Store::session_dir_in(&store, "b").unwrap().join("HEADER");
    let mut bytes = std::fs::read(&header).unwrap();
    bytes[40] ^= 0x20;
    std::fs::write(&header, &bytes).unwrap();
    let r = sl(&store, &["ls"]);
    assert_eq!((r.code, r.stdout.lines().count()), (0, 1), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("warning: 1 entry of sessions/ is not a readable session"),
        "{}",
        r.stderr
    );
    let r = sl(&store, &["stats"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("total sessions=1 "), "{}", r.stdout);
    assert!(r.stderr.contains("1 entry of sessions/"), "{}", r.stderr);
    let r = sl(&store, &["verify"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("OK a events=6"), "{}", r.stdout);
    let dir_b = Store::session_dir_in(&store, "b").unwrap();
    assert!(
        r.stdout
            .contains(&format!("UNACCOUNTED {}: HEADER", dir_b.display())),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("0 of 1 session failed verification; 1 file kept"),
        "{}",
        r.stderr
    );
    std::fs::write(&header, {
        bytes[40] ^= 0x20;
        &bytes
    })
    .unwrap();
    assert_eq!(ok(&store, &["verify"]).lines().count(), 2);

    // A damaged journal without a writer (a copy of a live one, its store
    // id flipped under the header's CRC).
    let live = Store::open(
        &store,
        Options {
            journal: true,
            ..Options::default()
        },
    )
    .unwrap();
    let more = sessionlog::build::user_message(6, 1, "more");
    live.append("a", &[more.borrowed()]).unwrap();
    let journal_dir = store.join("journal");
    let name = std::fs::read_dir(&journal_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let orphan = journal_dir.join("0000000000000abd.wal");
    let mut copy = std::fs::read(journal_dir.join(name)).unwrap();
    copy[30] ^= 0xff;
    std::fs::write(&orphan, &copy).unwrap();
    live.close().unwrap();
    let r = sl(&store, &["verify"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(&format!(
            "DAMAGED {}: journal: bad journal header",
            orphan.display()
        )),
        "{}",
        r.stdout
    );
    // Writing an existing session is refused while it lies there.
    let r = sl(&store, &["repair", "a"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(path_str(&orphan)), "{}", r.stderr);
    assert!(r.stderr.contains("salvage-journals"), "{}", r.stderr);

    let out = ok(&store, &["salvage-journals"]);
    let kept = journal_dir.join("damaged").join("0000000000000abd.wal");
    assert!(
        out.starts_with(&format!("salvaged {}", orphan.display()))
            && out.contains(&format!("kept as {}; 1 entry read", kept.display()))
            && out.contains("  a: 0 records written back"),
        "{out}"
    );
    assert!(kept.exists() && !orphan.exists());
    assert_eq!(ok(&store, &["verify"]).lines().count(), 2);
    ok(&store, &["repair", "a"]);
    assert_eq!(
        ok(&store, &["salvage-journals"]),
        "no damaged journal file without a writer\n"
    );
}

#[test]
fn readers_work_while_a_writer_holds_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let dir = tmp.path().join("store");
    ok(&dir, &["import", path_str(&file)]);

    let other = write_session(tmp.path(), "s2.jsonl", "s2", &BALANCED);
    let writer = Store::open(&dir, Options::default()).unwrap();
    // Another process writing s1 (its first write takes the session).
    writer.repair("s1").unwrap();
    assert_eq!(ok(&dir, &["ls"]), "s1\t1000\t-\n");
    assert_eq!(json_lines(&ok(&dir, &["cat", "s1"])).len(), 7);
    assert!(ok(&dir, &["verify"]).starts_with("OK s1 "));
    assert!(ok(&dir, &["stats", "s1"]).starts_with("s1 events=6 "));
    for args in [
        &["rm", "s1"][..],
        &["repair", "s1"],
        &["import", "--replace", path_str(&file)],
    ] {
        let r = sl(&dir, args);
        assert_eq!(r.code, 3, "{args:?} while locked: {}", r.stderr);
        assert!(
            r.stderr.contains(path_str(&dir.join("LOCK"))) && r.stderr.contains("\"s1\""),
            "{args:?}: the message names the session and the lock file: {}",
            r.stderr
        );
    }
    // Other sessions are free to write meanwhile, forks of s1 included.
    ok(&dir, &["fork", "s1", "kid"]);
    ok(&dir, &["import", path_str(&other)]);
    writer.close().unwrap();
    ok(&dir, &["rm", "s1"]);
    let listed = ok(&dir, &["ls"]);
    assert!(!listed.contains("s1\t"), "{listed}");
    assert!(
        listed.contains("kid\t") && listed.contains("s2\t"),
        "{listed}"
    );
}

#[test]
fn import_of_a_bad_file_fails_and_stores_nothing_of_it() {
    let tmp = tempfile::tempdir().unwrap();
    let good = write_session(tmp.path(), "good.jsonl", "good", &BALANCED);
    let mut lines = BALANCED.to_vec();
    // seq 1 breaks a rule: turn/start cannot carry surfaceOp.
    lines[1] =
        r#"{"type":"turn/start","seq":1,"time":1002,"data":{"turn":1},"surfaceOp":"append"}"#;
    let bad = write_session(tmp.path(), "bad.jsonl", "bad", &lines);
    let store = tmp.path().join("store");
    let r = sl(&store, &["import", path_str(&bad), path_str(&good)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("bad.jsonl")
            && r.stderr.contains("seq=1")
            && r.stderr.contains("[eligibility]"),
        "the error names file, seq and rule: {}",
        r.stderr
    );
    assert_eq!(r.stdout, "imported good: 6 events (0 closers)\n");
    assert_eq!(ok(&store, &["ls"]), "good\t1000\t-\n");
    assert_eq!(sl(&store, &["cat", "bad"]).code, 1);

    // An id that is already stored is an error; the stored one is untouched.
    let again = write_session(tmp.path(), "again.jsonl", "good", &BALANCED[..2]);
    let r = sl(&store, &["import", path_str(&again)]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("already exists"), "{}", r.stderr);
    assert_eq!(json_lines(&ok(&store, &["cat", "good"])).len(), 7);
    // ... unless it is imported under another id.
    let out = ok(&store, &["import", "--id", "good2", path_str(&again)]);
    assert_eq!(out, "imported good2: 2 events (1 closer)\n");
    assert_eq!(json_lines(&ok(&store, &["cat", "good2"]))[0]["id"], "good2");
}

#[test]
fn import_drops_a_torn_tail_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "torn.jsonl", "torn", &BALANCED);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(br#"{"type":"turn/start","seq":6,"ti"#);
    std::fs::write(&file, bytes).unwrap();
    let store = tmp.path().join("store");
    let r = sl(&store, &["import", path_str(&file)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "imported torn: 6 events (0 closers)\n");
    assert!(
        r.stderr.contains("torn.jsonl") && r.stderr.contains("torn tail"),
        "{}",
        r.stderr
    );
    assert_eq!(json_lines(&ok(&store, &["cat", "torn"])).len(), 7);
}

#[test]
fn stats_counts_committed_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write_session(tmp.path(), "a.jsonl", "a", &BALANCED);
    let b = write_session(tmp.path(), "b.jsonl", "b", &BALANCED);
    let store = tmp.path().join("store");
    ok(&store, &["import", path_str(&a), path_str(&b)]);
    let out = ok(&store, &["stats"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let field = |line: &str, key: &str| -> String {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            .to_owned()
    };
    assert!(lines[0].starts_with("a "), "{out}");
    assert!(lines[2].starts_with("total sessions=2 "), "{out}");
    assert_eq!(field(lines[0], "events"), "6");
    assert_eq!(field(lines[0], "segments"), "1");
    assert_eq!(field(lines[2], "events"), "12");
    let file_bytes = std::fs::read(&a).unwrap().len() as u64;
    let bytes: u64 = field(lines[0], "bytes").parse().unwrap();
    let jsonl: u64 = field(lines[0], "jsonl_bytes").parse().unwrap();
    assert!(
        jsonl > file_bytes / 2 && jsonl < file_bytes * 2,
        "jsonl_bytes {jsonl} vs the file's {file_bytes}"
    );
    // Preallocated segment space is not data: a small session is small.
    assert!(
        bytes < 4 * jsonl,
        "{bytes} bytes for {jsonl} bytes of JSONL: {out}"
    );
    let ratio: f64 = field(lines[0], "ratio").parse().unwrap();
    assert!((ratio - bytes as f64 / jsonl as f64).abs() < 0.001, "{out}");
    assert_eq!(
        field(lines[2], "bytes").parse::<u64>().unwrap(),
        bytes + field(lines[1], "bytes").parse::<u64>().unwrap()
    );
    let r = sl(&store, &["stats", "nope"]);
    assert_eq!(r.code, 1);
}

#[test]
fn usage_and_missing_store_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let store = tmp.path().join("store");
    for args in [&["ls"][..], &["rm", "x"], &["verify"], &["import", "f"]] {
        assert_eq!(cli(args).code, 2, "{args:?} without a store");
    }
    let r = sl(&store, &["check", path_str(&file)]);
    assert_eq!(r.code, 2, "check is file mode: {}", r.stderr);
    let r = sl(
        &store,
        &["import", "--id", "x", path_str(&file), path_str(&file)],
    );
    assert_eq!(r.code, 2, "--id with two files: {}", r.stderr);
    assert_eq!(sl(&store, &["import"]).code, 2);
    // No store there: readers and writers other than import do not create one.
    assert_eq!(sl(&store, &["ls"]).code, 3);
    assert_eq!(sl(&store, &["rm", "x"]).code, 3);
    assert!(!store.exists());
    // An unreadable file fails that file with an I/O error.
    let r = sl(&store, &["import", "/nonexistent/x.jsonl"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("/nonexistent/x.jsonl"), "{}", r.stderr);
    // File mode is unchanged.
    assert_eq!(cli(&["cat", path_str(&file)]).code, 0);
    assert_eq!(cli(&["repair", path_str(&file)]).code, 2);
}

// ---------------------------------------------------------------------------
// Real harness logs
// ---------------------------------------------------------------------------

/// Fixtures with distinct ids (`None`), or imported under a new id: packed
/// rows, a replace op, the flat dialect, an open last turn, a header without
/// `version`, a subagent child with `parentSession`.
const FIXTURES: [(&str, Option<&str>); 6] = [
    (
        "examples__acp-agent__tests__snapshots__packed-chunks__session.jsonl",
        None,
    ),
    (
        "examples__headless-agent__tests__snapshots__compaction-recovery__session.jsonl",
        Some("compaction"),
    ),
    (
        "apps__web__tests__snapshots__fresh-round-trip__session.jsonl",
        Some("fresh"),
    ),
    (
        "packages__test-support__acp-snapshot__tests__fixtures__suite__pin-turn__session.jsonl",
        None,
    ),
    (
        "packages__test-support__acp-snapshot__tests__fixtures__record-suite__rec-child__session.jsonl",
        None,
    ),
    (
        "examples__acp-agent__tests__snapshots__advanced-toolchain__session.1.jsonl",
        None,
    ),
];

#[test]
fn imported_fixtures_read_back_as_in_file_mode() {
    let Some(fx) = common::fixtures() else { return };
    let fx = fx.join("harness-jsonl");
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let mut expected_ls = Vec::new();
    for (name, new_id) in FIXTURES {
        let path = fx.join(name);
        let path = path_str(&path);
        let file_cat = cli(&["cat", path]);
        assert_eq!(file_cat.code, 0, "{name}: {}", file_cat.stderr);
        let mut want = json_lines(&file_cat.stdout);
        let closers = json_lines(&cli(&["repair", "--dry-run", path]).stdout);
        let id = match new_id {
            Some(id) => {
                want[0]["id"] = id.into();
                id.to_owned()
            }
            None => want[0]["id"].as_str().unwrap().to_owned(),
        };
        let mut args = vec!["import"];
        if let Some(id) = new_id {
            args.extend(["--id", id]);
        }
        args.push(path);
        let out = ok(&store, &args);
        assert_eq!(
            out,
            format!(
                "imported {id}: {} event{} ({} closer{})\n",
                want.len() - 1,
                if want.len() == 2 { "" } else { "s" },
                closers.len(),
                if closers.len() == 1 { "" } else { "s" }
            ),
            "{name}"
        );
        let events = want.len() - 1 + closers.len();
        expected_ls.push(format!(
            "{id}\t{}\t{}",
            want[0]["createdAt"],
            want[0]["parentSession"].as_str().unwrap_or("-")
        ));

        let balanced = closers.is_empty();
        want.extend(closers);
        assert_values_eq(
            &format!("{name}: cat"),
            &json_lines(&ok(&store, &["cat", &id])),
            &want,
        );
        if balanced {
            for cmd in ["surface", "derive"] {
                assert_values_eq(
                    &format!("{name}: {cmd}"),
                    &json_lines(&ok(&store, &[cmd, &id])),
                    &json_lines(&cli(&[cmd, path]).stdout),
                );
            }
        }
        let v = ok(&store, &["verify", &id]);
        assert!(
            v.starts_with(&format!("OK {id} events={events} ")),
            "{name}: {v}"
        );
    }
    assert!(
        FIXTURES.iter().any(|(n, _)| n.contains("pin-turn")),
        "one fixture has an open last turn"
    );
    expected_ls.sort();
    let ls = ok(&store, &["ls"]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), expected_ls);
    assert!(
        ls.lines().any(|l| !l.ends_with("\t-")),
        "a child lists its parent: {ls}"
    );

    // The header's id again: refused, nothing changes.
    let again = fx.join(FIXTURES[0].0);
    let r = sl(&store, &["import", path_str(&again)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(ok(&store, &["ls"]), ls);
    // A file breaking a rule is not imported.
    let bad = fx.join("apps__web__tests__snapshots__cordis-tool-round__session.jsonl");
    let r = sl(&store, &["import", "--id", "cordis", path_str(&bad)]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("seq=87") && r.stderr.contains("[contiguity]"),
        "{}",
        r.stderr
    );
    assert_eq!(ok(&store, &["ls"]), ls);
}

#[test]
fn a_failed_append_midway_leaves_no_half_imported_session() {
    let tmp = tempfile::tempdir().unwrap();
    // The first event is appended; the second alone is larger than the
    // store's record limit (64 MiB), so its append fails. Its text is
    // 84 MiB of pseudo-random printable characters (92 of them, no quote or
    // backslash): at log2(92) = 6.52 bits each, no general-purpose coder
    // stores them in less than 68 MiB.
    let alphabet: Vec<u8> = (b' '..=b'~').filter(|&c| c != b'"' && c != b'\\').collect();
    let mut x = 0x2545_f491u32;
    let text: String = (0..84 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            char::from(alphabet[(x % alphabet.len() as u32) as usize])
        })
        .collect();
    let blob = format!(r#"{{"type":"custom/blob","seq":1,"time":1002,"data":{{"x":"{text}"}}}}"#);
    let file = write_session(tmp.path(), "big.jsonl", "big", &[BALANCED[0], &blob]);
    let store = tmp.path().join("store");
    let r = sl(&store, &["import", path_str(&file)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("big.jsonl") && r.stderr.contains("record limit"),
        "{}",
        r.stderr
    );
    assert_eq!(ok(&store, &["ls"]), "");
    assert_eq!(sl(&store, &["cat", "big"]).code, 1);
    // No session directory, and nothing left half-built in the staging area.
    let entries = |p: &std::path::Path| std::fs::read_dir(p).unwrap().count();
    let sessions = store.join("sessions");
    assert_eq!(entries(&sessions), 2, "only .staging and .trash");
    assert_eq!(
        entries(&sessions.join(".staging")),
        0,
        "no session files are left"
    );
    assert_eq!(
        entries(&sessions.join(".trash")),
        0,
        "no session files are left"
    );
}

/// `tail -f` in one process prints what another process appends, as it is
/// appended; `cat | head` ends quietly when the reader goes away.
#[test]
fn tail_follows_appends_from_another_process_and_closed_pipes_are_quiet() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let dir = tmp.path().join("store");
    ok(&dir, &["import", path_str(&file)]);
    let mut follower = std::process::Command::new(env!("CARGO_BIN_EXE_sessionlog"))
        .args(["--store", path_str(&dir), "tail", "-f", "--from", "4", "s1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follower.stdout.take().unwrap()).lines();
    let seq_of = |l: &str| {
        serde_json::from_str::<Value>(l).unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(seq_of(&lines.next().unwrap().unwrap()), 4);
    assert_eq!(seq_of(&lines.next().unwrap().unwrap()), 5);
    // Another process (this one) appends: the follower prints it.
    let writer = Store::open(&dir, Options::default()).unwrap();
    let ev = sessionlog::event::Event::from_json(
        r#"{"type":"session/title","seq":6,"time":2000,"data":{"title":"t"}}"#,
    )
    .unwrap();
    writer.append("s1", &[ev]).unwrap();
    assert_eq!(seq_of(&lines.next().unwrap().unwrap()), 6);
    follower.kill().unwrap();
    follower.wait().unwrap();

    // A closed pipe: the first line is read, then the reader goes away.
    let mut cat = std::process::Command::new(env!("CARGO_BIN_EXE_sessionlog"))
        .args(["--store", path_str(&dir), "tail", "-f", "--from", "0", "s1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(cat.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    drop(out);
    // The next append makes it write into the closed pipe.
    let ev = sessionlog::event::Event::from_json(
        r#"{"type":"session/title","seq":7,"time":2001,"data":{"title":"u"}}"#,
    )
    .unwrap();
    writer.append("s1", &[ev]).unwrap();
    let done = cat.wait_with_output().unwrap();
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        done.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
}

/// A MANIFEST of another format version, or a damaged one, exits 1 with
/// what is wrong and how to migrate, not 3 with "check the disk" (the
/// errors were flattened into one string variant before).
#[test]
fn manifest_errors_exit_1_with_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let dir = tmp.path().join("store");
    ok(&dir, &["import", path_str(&file)]);
    let path = dir.join("MANIFEST");
    let good = std::fs::read(&path).unwrap();
    let mut old = good.clone();
    old[8..12].copy_from_slice(&2u32.to_le_bytes());
    let crc = crc32fast::hash(&old[..32]);
    old[32..36].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &old).unwrap();
    for args in [&["ls"][..], &["import", path_str(&file)]] {
        let r = sl(&dir, args);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("store format version 2"), "{}", r.stderr);
        assert!(
            r.stderr.contains("export"),
            "says how to migrate: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("check the disk"), "{}", r.stderr);
    }
    let mut flipped = good.clone();
    flipped[20] ^= 1;
    std::fs::write(&path, &flipped).unwrap();
    let r = sl(&dir, &["ls"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("MANIFEST"), "{}", r.stderr);
    assert!(!r.stderr.contains("check the disk"), "{}", r.stderr);
    // A missing store says how to make one.
    let r = sl(&tmp.path().join("nowhere"), &["ls"]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("import"), "{}", r.stderr);
}

// ---------------------------------------------------------------------------
// Issue 16: what a new user expects of the CLI
// ---------------------------------------------------------------------------

/// `ls` escapes ids holding newlines, tabs, control characters or
/// backslashes (JSON-style), so each row stays one line; `--json` is raw.
#[test]
fn ls_escapes_ids_so_each_row_stays_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let odd = "a\tb\nc\\d\u{1b}e";
    let file = write_session(tmp.path(), "odd.jsonl", odd, &BALANCED);
    let store = tmp.path().join("store");
    let out = ok(&store, &["import", path_str(&file)]);
    assert!(
        out.starts_with("imported a\\tb\\nc\\\\d\\u001be: "),
        "{out:?}"
    );
    let out = ok(&store, &["fork", odd, "kid"]);
    assert_eq!(out, "forked kid from a\\tb\\nc\\\\d\\u001be at 6\n");
    let ls = ok(&store, &["ls"]);
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 2, "{ls:?}");
    assert_eq!(lines[0], "a\\tb\\nc\\\\d\\u001be\t1000\t-", "{ls:?}");
    assert!(lines[1].starts_with("kid\t"), "{ls:?}");
    assert!(lines[1].ends_with("\ta\\tb\\nc\\\\d\\u001be"), "{ls:?}");
    assert_eq!(lines[1].split('\t').count(), 3, "{ls:?}");
    // --json keeps the ids as they are.
    let json: Value = serde_json::from_str(&ok(&store, &["ls", "--json"])).unwrap();
    assert_eq!(json[0]["id"], odd);
    assert_eq!(json[1]["parentSession"], odd);
    // Messages naming an id escape it as `ls` does.
    let out = ok(&store, &["rm", odd]);
    assert_eq!(out, "removed a\\tb\\nc\\\\d\\u001be\n");
}

/// "1 event", "1 closer": no "1 closers".
#[test]
fn counts_of_one_are_singular() {
    let tmp = tempfile::tempdir().unwrap();
    let one = write_session(tmp.path(), "one.jsonl", "one", &BALANCED[..1]);
    let two = write_session(tmp.path(), "two.jsonl", "two", &BALANCED[..2]);
    let store = tmp.path().join("store");
    assert_eq!(
        ok(&store, &["import", path_str(&one)]),
        "imported one: 1 event (0 closers)\n"
    );
    assert_eq!(
        ok(&store, &["import", path_str(&two)]),
        "imported two: 2 events (1 closer)\n"
    );
    let r = sl(&store, &["fork", "one", "x", "--at", "5"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("the session has only 1 event\n")
            || r.stderr.ends_with("the session has only 1 event"),
        "{}",
        r.stderr
    );
    // One bad file of one.
    let bad = tmp.path().join("bad.jsonl");
    std::fs::write(&bad, "not json\n").unwrap();
    let r = sl(&store, &["import", path_str(&bad)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("1 of 1 source not imported"),
        "{}",
        r.stderr
    );
}

/// A regular file given as the store, and a store whose parent directory
/// is missing, get hints that say what to do (not "check the disk").
#[test]
fn a_file_as_store_and_a_missing_parent_say_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    for args in [&["ls"][..], &["import", path_str(&file)], &["rm", "s1"]] {
        let r = sl(&file, args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr
                .contains("is a file; --store takes a store directory"),
            "{args:?}: {}",
            r.stderr
        );
        assert!(!r.stderr.contains("check the disk"), "{}", r.stderr);
    }
    let parent = tmp.path().join("no").join("such");
    let store = parent.join("store");
    let r = sl(&store, &["import", path_str(&file)]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stderr.contains(path_str(&parent)) && r.stderr.contains("mkdir -p"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("check the disk"), "{}", r.stderr);
    assert!(!parent.exists());
}

/// With `SESSIONLOG_STORE` set, a file given to `cat`, `surface` or
/// `derive` says that file mode needs the variable unset.
#[test]
fn a_file_path_in_store_mode_says_to_unset_the_variable() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let store = tmp.path().join("store");
    ok(&store, &["import", path_str(&file)]);
    let env_run = |args: &[&str]| {
        run(Command::new(env!("CARGO_BIN_EXE_sessionlog"))
            .env("SESSIONLOG_STORE", &store)
            .args(args))
    };
    for cmd in ["cat", "surface", "derive"] {
        for target in [path_str(&file), "missing.jsonl"] {
            let r = env_run(&[cmd, target]);
            assert_eq!(r.code, 2, "{cmd} {target}: {}", r.stderr);
            assert!(
                r.stderr.contains("unset SESSIONLOG_STORE"),
                "{cmd} {target}: {}",
                r.stderr
            );
        }
    }
    // With --store, and for repair, likewise.
    let r = sl(&store, &["cat", path_str(&file)]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("drop --store"), "{}", r.stderr);
    let r = env_run(&["repair", "--dry-run", path_str(&file)]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    // Session ids still work.
    assert_eq!(env_run(&["cat", "s1"]).code, 0);
}

/// Writes a store holding session `open` with its last turn open and no
/// closers stored (a writer that crashed mid-turn).
fn store_with_an_open_turn(tmp: &Path) -> PathBuf {
    let dir = tmp.join("store");
    let file = write_session(tmp, "open.jsonl", "open", &OPEN);
    let store = Store::open(&dir, Options::default()).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let s = sessionlog::adapters::jsonl::read_session(&bytes, false).unwrap();
    store.create(s.header.header.clone()).unwrap();
    store.append("open", &s.events).unwrap();
    store.close().unwrap();
    dir
}

/// `cat` of a session whose last turn is open shows closers a read-only
/// store synthesises: it says so on stderr.
#[test]
fn cat_of_an_open_turn_notes_the_synthesised_closers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = store_with_an_open_turn(tmp.path());
    let r = sl(&dir, &["cat", "open"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(json_lines(&r.stdout).len(), 1 + 4 + 3);
    assert!(
        r.stderr.contains("the last 3 events shown are closers")
            && r.stderr.contains("not stored")
            && r.stderr.contains("`repair open`"),
        "{}",
        r.stderr
    );
    // From seq 5 on only two of them are shown.
    let r = sl(&dir, &["cat", "open", "--from", "5"]);
    assert!(
        r.stderr.contains("the last 2 events shown are closers"),
        "{}",
        r.stderr
    );
    // Once stored, nothing to say.
    ok(&dir, &["repair", "open"]);
    let r = sl(&dir, &["cat", "open"]);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""));
}

/// `surface` of a corrupt session fails as `cat`, `derive` and `stats` do,
/// also when a checkpoint lets it skip reading the damaged sealed segment.
#[test]
fn surface_of_a_corrupt_session_fails_like_cat() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    {
        // Small segments: the session spans several, the first sealed.
        let opts = Options {
            segment_size: 1024,
            ..Options::default()
        };
        let store = Store::open(&dir, opts).unwrap();
        store
            .create(sessionlog::header::SessionHeader::new("a", 1000))
            .unwrap();
        let mut seq = 0;
        for turn in 1..=40 {
            let texts = [
                format!(r#"{{"type":"turn/start","seq":{seq},"time":1,"data":{{"turn":{turn}}}}}"#),
                format!(
                    r#"{{"type":"user/message","seq":{},"time":1,"data":{{"content":[{{"type":"text","text":"hi {turn}"}}],"source":{{"kind":"user"}},"role":"user","id":"u{turn}"}},"surfaceOp":"append"}}"#,
                    seq + 1
                ),
                format!(
                    r#"{{"type":"turn/end","seq":{},"time":1,"data":{{"turn":{turn},"reason":{{"kind":"completed"}}}}}}"#,
                    seq + 2
                ),
            ];
            let batch: Vec<_> = texts
                .iter()
                .map(|j| sessionlog::event::Event::from_json(j).unwrap())
                .collect();
            store.append("a", &batch).unwrap();
            seq += 3;
        }
        store.close().unwrap();
    }
    let segs = segment_files(&dir);
    assert!(segs.len() > 1, "{segs:?}");
    assert_eq!(ok(&dir, &["surface", "a"]).lines().count(), 1);
    let mut bytes = std::fs::read(&segs[0]).unwrap();
    bytes[100] ^= 0x55;
    std::fs::write(&segs[0], &bytes).unwrap();
    for cmd in ["cat", "derive", "stats", "surface"] {
        let r = sl(&dir, &[cmd, "a"]);
        assert_eq!(r.code, 1, "{cmd}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.stdout, "", "{cmd}");
        assert!(r.stderr.contains("corrupt"), "{cmd}: {}", r.stderr);
    }
}

/// A fork onto an existing id says what to do about a fork.
#[test]
fn fork_onto_an_existing_id_has_a_fork_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write_session(tmp.path(), "s1.jsonl", "s1", &BALANCED);
    let store = tmp.path().join("store");
    ok(&store, &["import", path_str(&file)]);
    ok(&store, &["fork", "s1", "kid"]);
    let r = sl(&store, &["fork", "s1", "kid"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("choose another CHILD id") && r.stderr.contains("`rm kid`"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("import --replace"), "{}", r.stderr);
}

/// A flipped byte in the middle of a session makes it unreadable (exit 1,
/// the file and offset named, `--salvage` suggested); `export --salvage`
/// gets the whole batches before the damage out and says where it cut,
/// changing nothing in the store.
#[test]
fn export_salvage_gets_the_readable_prefix_of_a_damaged_session() {
    use sessionlog::sample::{Sample, SampleConfig};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let (header, events) = Sample::new(SampleConfig {
        turns: 4,
        ..SampleConfig::default()
    })
    .session("s");
    {
        let store = Store::open(&dir, Options::default()).unwrap();
        store.create(header).unwrap();
        for b in events.chunks(10) {
            store.append("s", b).unwrap();
        }
        store.close().unwrap();
    }
    let seg = dir.join("sessions/s/00000000000000000000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    let ident = sessionlog::segment::read_header(&bytes).unwrap();
    let scan = sessionlog::segment::scan(&bytes, &ident, &Default::default()).unwrap();
    assert!(scan.batches.len() > 4);
    let damaged = &scan.batches[3];
    bytes[damaged.payload.start as usize + 5] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    common::remove_checkpoint(&dir.join("sessions/s"));

    let r = sl(&dir, &["export", "s"]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let out = tmp.path().join("salvaged.jsonl");
    let r = sl(&dir, &["export", "--salvage", "s", "--to", path_str(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("offset {}", damaged.offset)) && r.stderr.contains("cut at"),
        "{}",
        r.stderr
    );
    let lines = json_lines(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(
        lines.len(),
        1 + damaged.first_seq as usize,
        "header + the whole batches before"
    );
    for (line, e) in lines[1..].iter().zip(&events) {
        assert_eq!(line, &serde_json::from_str::<Value>(&e.to_json()).unwrap());
    }
    // The store is as it was: still damaged, still reported.
    assert_eq!(std::fs::read(&seg).unwrap(), bytes);
    assert_eq!(sl(&dir, &["verify", "s"]).code, 1);
    // Two sessions, or a root, are refused.
    assert_eq!(sl(&dir, &["export", "--salvage", "s", "t"]).code, 2);
}

#[test]
fn compress_stores_sealed_segments_as_images_and_stats_counts_them() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let log = common::turn_log(40, "s");
    {
        // Small segments, so the session has sealed ones.
        let s = Store::open(
            &store,
            Options {
                segment_size: 4096,
                preallocate: 4096,
                ..Options::default()
            },
        )
        .unwrap();
        s.create(sessionlog::header::SessionHeader::new("s", 0))
            .unwrap();
        for turn in log.chunks(3) {
            s.append("s", turn).unwrap();
        }
        s.close().unwrap();
    }
    let cat_before = ok(&store, &["cat", "s"]);
    let out = ok(&store, &["compress"]);
    let line = out.lines().next().unwrap();
    let n: u64 = line
        .strip_prefix("s compressed ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("{out}"))
        .parse()
        .unwrap();
    assert!(n >= 2, "{out}");
    let stats = ok(&store, &["stats", "s"]);
    let field = |key: &str| stat_field(&stats, key);
    assert_eq!(field("compressed"), n, "{stats}");
    assert!(field("sealed_bytes") < field("bytes"), "{stats}");
    assert!(
        field("bytes") * 2 < field("jsonl_bytes"),
        "images under half of JSONL: {stats}"
    );
    assert_eq!(ok(&store, &["cat", "s"]), cat_before);
    assert!(ok(&store, &["verify", "s"]).starts_with("OK s "));
    let again = ok(&store, &["compress", "s"]);
    assert!(again.starts_with("s compressed 0 segments"), "{again}");
    // --seal: the active segment too, so nothing stays raw.
    let sealed = ok(&store, &["compress", "--seal", "s"]);
    assert!(
        sealed.starts_with("s sealed, compressed 1 segment "),
        "{sealed}"
    );
    let stats = ok(&store, &["stats", "s"]);
    let field = |key: &str| stat_field(&stats, key);
    assert_eq!(field("compressed"), field("segments"), "{stats}");
    assert_eq!(field("sealed_bytes"), field("bytes"), "{stats}");
    assert_eq!(ok(&store, &["cat", "s"]), cat_before);
}

/// The number after `key=` in a `stats` line.
fn stat_field(stats: &str, key: &str) -> u64 {
    stats
        .split(' ')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {stats:?}"))
        .trim()
        .parse()
        .unwrap()
}
