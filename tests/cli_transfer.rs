//! Store-mode `import` and `export` through the CLI: harness roots, zstd,
//! packed rows, SQLite, `--replace`, `--no-repair`, `--json`, `--progress`.

use sessionlog::adapters::jsonl;
use sessionlog::sample::{Sample, SampleConfig};
use std::path::Path;
use std::process::{Command, Output};

fn run(store: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sessionlog"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .unwrap()
}

fn ok(store: &Path, args: &[&str]) -> String {
    let out = run(store, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const SESSION: &str = concat!(
    r#"{"type":"session","version":0,"id":"s1","createdAt":5,"cwd":"/w","delegationDepth":0}"#,
    "\n",
    r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
    "\n",
    r#"{"type":"step/start","seq":1,"time":1,"data":{"turn":1,"step":1}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":2,"time":2,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"a"}}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":3,"time":3,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"b"}}}"#,
    "\n",
    r#"{"type":"assistant/chunk","seq":4,"time":5,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"c"}}}"#,
    "\n",
    r#"{"type":"assistant/message","seq":5,"time":6,"data":{"turn":1,"step":1,"message":{"role":"assistant","content":[{"type":"text","text":"abc"}]}},"sourceEventSeqs":[2,3,4],"surfaceOp":"append"}"#,
    "\n",
);

#[test]
fn import_export_round_trips_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = tmp.path().join("s1.jsonl");
    std::fs::write(&file, SESSION).unwrap();

    // --no-repair keeps the open turn; a plain import closes it.
    let out = ok(&store, &["import", "--no-repair", file.to_str().unwrap()]);
    assert!(
        out.contains("imported s1: 6 events (last turn left open)"),
        "{out}"
    );
    let err = run(&store, &["import", file.to_str().unwrap()]);
    assert_eq!(err.status.code(), Some(1), "an existing id is an error");
    let out = ok(&store, &["import", "--replace", file.to_str().unwrap()]);
    assert!(out.contains("imported s1: 6 events (2 closers)"), "{out}");

    // Export: stdout plain, packed, zstd file, harness root, SQLite.
    let plain = ok(&store, &["export", "s1"]);
    assert_eq!(plain.lines().count(), 1 + 6 + 2);
    let packed = ok(&store, &["export", "s1", "--pack-chunks"]);
    assert!(
        packed.contains(r#""type":"text-chunks","seq0":2"#),
        "{packed}"
    );
    assert_eq!(packed.lines().count(), 1 + 6 + 2 - 2);
    let zst = tmp.path().join("s1.jsonl.zstd");
    ok(
        &store,
        &["export", "s1", "--zstd", "--to", zst.to_str().unwrap()],
    );
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let out = ok(&store, &["export", "--all", "--to", root.to_str().unwrap()]);
    assert!(out.contains("exported s1 to"), "{out}");
    let db = tmp.path().join("all.db");
    ok(&store, &["export", "--all", "--to", db.to_str().unwrap()]);

    // Each export imports back to the same events.
    for (name, source) in [
        ("from-zstd", zst.clone()),
        ("from-root", root.clone()),
        ("from-db", db.clone()),
    ] {
        let other = tmp.path().join(name);
        ok(&other, &["import", source.to_str().unwrap()]);
        assert_eq!(ok(&other, &["export", "s1"]), plain, "{name}");
    }

    // --json listings.
    let ls: serde_json::Value = serde_json::from_str(&ok(&store, &["ls", "--json"])).unwrap();
    assert_eq!(ls[0]["id"], "s1");
    assert_eq!(ls[0]["cwd"], "/w");
    let stats: serde_json::Value = serde_json::from_str(&ok(&store, &["stats", "--json"])).unwrap();
    assert_eq!(stats[0]["events"], 8);
    assert!(stats[0]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_corrupt_file_names_file_line_and_seq_and_imports_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let bad = tmp.path().join("bad.jsonl");
    let text = SESSION.replace(
        r#""seq":3,"time":3"#,
        r#""seq":3,"time":3,"surfaceOp":"append""#,
    );
    std::fs::write(&bad, text).unwrap();
    let out = run(&store, &["import", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.jsonl") && err.contains("line 5") && err.contains("seq=3"),
        "{err}"
    );
    assert_eq!(ok(&store, &["ls"]), "");
}

/// Runs, requires exit `code`; returns stderr.
fn fail(store: &Path, args: &[&str], code: i32) -> String {
    let out = run(store, args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// A store holding `s1` and `s2` (both SESSION).
fn two_sessions(tmp: &Path) -> std::path::PathBuf {
    let store = tmp.join("store");
    let file = tmp.join("s1.jsonl");
    std::fs::write(&file, SESSION).unwrap();
    ok(&store, &["import", file.to_str().unwrap()]);
    ok(&store, &["import", "--id", "s2", file.to_str().unwrap()]);
    store
}

/// Several sessions to a path that names a file are refused (exit 2),
/// never written as a directory of that name.
#[test]
fn export_of_several_sessions_to_a_file_name_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = two_sessions(tmp.path());
    for name in ["two.jsonl", "two.jsonl.zstd", "two.zstd"] {
        let to = tmp.path().join(name);
        let err = fail(
            &store,
            &["export", "s1", "s2", "--to", to.to_str().unwrap()],
            2,
        );
        assert!(
            err.contains("give a directory") && err.contains("one session"),
            "{err}"
        );
        assert!(!to.exists(), "{name} was created");
        let err = fail(
            &store,
            &["export", "--all", "--to", to.to_str().unwrap()],
            2,
        );
        assert!(err.contains("give a directory"), "{err}");
        assert!(!to.exists(), "{name} was created");
    }
    // An existing regular file is no directory either.
    let file = tmp.path().join("s1.jsonl");
    let err = fail(
        &store,
        &["export", "--all", "--to", file.to_str().unwrap()],
        2,
    );
    assert!(err.contains("give a directory"), "{err}");
    // One session to that name is a file; a new name without a file
    // extension is a harness root.
    let one = tmp.path().join("one.jsonl");
    let out = ok(&store, &["export", "s1", "--to", one.to_str().unwrap()]);
    assert!(out.contains("exported s1 (8 events) to"), "{out}");
    assert!(one.is_file());
    let root = tmp.path().join("root");
    ok(
        &store,
        &["export", "s1", "s2", "--to", root.to_str().unwrap()],
    );
    assert!(root.is_dir());
    let db = tmp.path().join("one.db");
    let out = ok(&store, &["export", "s1", "--to", db.to_str().unwrap()]);
    assert!(out.starts_with("exported 1 session to"), "{out}");
}

/// `import DIR` of a plain folder of session files imports them all, in
/// name order.
#[test]
fn import_of_a_plain_folder_imports_its_session_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = two_sessions(tmp.path());
    let folder = tmp.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    let zst = folder.join("a.jsonl.zstd");
    ok(
        &src,
        &["export", "s2", "--zstd", "--to", zst.to_str().unwrap()],
    );
    std::fs::write(folder.join("b.jsonl"), SESSION).unwrap();
    std::fs::write(folder.join("notes.txt"), "not a session").unwrap();
    let store = tmp.path().join("new");
    let out = ok(&store, &["import", folder.to_str().unwrap()]);
    assert_eq!(
        out,
        "imported s2: 8 events (0 closers)\nimported s1: 6 events (2 closers)\n"
    );
    // A folder with nothing to import says what it looked for.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = fail(&store, &["import", empty.to_str().unwrap()], 1);
    assert!(err.contains("*.jsonl"), "{err}");
}

/// Files that share a session id: `--id-from-filename` stores each under
/// its file's stem; the "already exists" error names both flags.
#[test]
fn id_from_filename_imports_files_that_share_an_id() {
    let tmp = tempfile::tempdir().unwrap();
    let src = two_sessions(tmp.path());
    let x1 = tmp.path().join("x1.jsonl");
    std::fs::write(&x1, SESSION).unwrap();
    let x2 = tmp.path().join("x2.jsonl.zstd");
    ok(
        &src,
        &["export", "s1", "--zstd", "--to", x2.to_str().unwrap()],
    );
    let store = tmp.path().join("new");
    let (x1, x2) = (x1.to_str().unwrap(), x2.to_str().unwrap());
    let err = fail(&store, &["import", x1, x2], 1);
    assert!(
        err.contains("already exists")
            && err.contains("--replace")
            && err.contains("--id-from-filename"),
        "{err}"
    );
    let store = tmp.path().join("by-name");
    let out = ok(&store, &["import", "--id-from-filename", x1, x2]);
    assert_eq!(
        out,
        "imported x1: 6 events (2 closers)\nimported x2: 8 events (0 closers)\n"
    );
    let ls = ok(&store, &["ls"]);
    assert!(ls.starts_with("x1\t5\t-\nx2\t5\t-\n"), "{ls}");
    fail(
        &store,
        &["import", "--id-from-filename", "--id", "y", x1],
        2,
    );
}

#[test]
fn cli_progress_prints_plain_lines_off_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    // A session file of several MB.
    let (header, events) = Sample::new(SampleConfig {
        turns: 400,
        ..SampleConfig::default()
    })
    .session("big");
    let mut buf = Vec::new();
    jsonl::write_session(&mut buf, &header, &events).unwrap();
    assert!(buf.len() > 3 << 20);
    let path = tmp.path().join("big.jsonl");
    std::fs::write(&path, &buf).unwrap();
    let events = events.len();
    let file = path.to_str().unwrap();
    let out = run(&tmp.path().join("a"), &["import", "--progress", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with(&format!("import 1/1: {file}: ")) && l.ends_with("/s")),
        "{stderr}"
    );
    // A line per tenth of the file read, the last one whole; then one per
    // tenth of its events stored (as many as the store's batches allow:
    // one, for a few MB), the last one all of them.
    let (read, stored) = lines.split_at(10.min(lines.len()));
    assert!(read.iter().all(|l| l.contains(" read, ")), "{stderr}");
    assert!(
        read[9].contains(&format!(" read, {events} events, ")),
        "{}",
        read[9]
    );
    assert!((1..=10).contains(&stored.len()), "{stderr}");
    assert!(stored.iter().all(|l| l.contains(" events stored, ")));
    assert!(
        stored
            .last()
            .unwrap()
            .contains(&format!(": {events}/{events} events stored, ")),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("imported big: {events} events")),
        "{stdout}"
    );

    // Without --progress, stderr stays quiet off a terminal.
    let out = run(&tmp.path().join("b"), &["import", file]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    // --progress and --quiet contradict each other.
    let out = run(
        &tmp.path().join("c"),
        &["import", "--progress", "--quiet", file],
    );
    assert_eq!(out.status.code(), Some(2));
}

/// `export --schema 4` refuses a header with fields the schema has no
/// column for (exit 1, naming the session and the fields) and writes
/// nothing; the default schema 17 keeps them.
#[test]
fn schema_4_export_refuses_header_fields_it_cannot_hold() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = tmp.path().join("child.jsonl");
    let header = r#"{"type":"session","version":0,"id":"child","createdAt":5,"cwd":"/w","parentSession":"p","origin":"subagent","delegationDepth":1,"agentPreset":"minimal"}"#;
    let body = SESSION.split_once('\n').unwrap().1;
    std::fs::write(&file, format!("{header}\n{body}")).unwrap();
    ok(&store, &["import", file.to_str().unwrap()]);
    let db = tmp.path().join("out4.db");
    let err = fail(
        &store,
        &[
            "export",
            "child",
            "--schema",
            "4",
            "--to",
            db.to_str().unwrap(),
        ],
        1,
    );
    assert!(
        err.contains(r#"session "child""#)
            && err.contains(r#"origin "subagent", delegationDepth 1, agentPreset "minimal""#)
            && err.contains("no column"),
        "{err}"
    );
    assert!(!db.exists());
    let db = tmp.path().join("out17.db");
    ok(&store, &["export", "child", "--to", db.to_str().unwrap()]);
    let back = tmp.path().join("back");
    ok(&back, &["import", db.to_str().unwrap()]);
    assert_eq!(ok(&back, &["cat", "child"]).lines().next(), Some(header));
}

/// `export --all` exports every readable session, then names each entry of
/// sessions/ it could not read (a damaged HEADER) on stderr and exits 1:
/// to a directory, to standard output and to a database.
#[test]
fn export_all_reports_unreadable_entries_and_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let store = two_sessions(tmp.path());
    let header = store.join("sessions").join("s1").join("HEADER");
    let mut bytes = std::fs::read(&header).unwrap();
    bytes[40] ^= 0x55;
    std::fs::write(&header, bytes).unwrap();
    let named = |err: &str| {
        assert!(
            err.contains("UNACCOUNTED ")
                && err.contains(&format!(
                    "{}: ",
                    store.join("sessions").join("s1").display()
                ))
                && err.contains("HEADER")
                && err.contains("not exported")
                && err.contains("1 session exported; 1 entry of sessions/ not exported"),
            "{err}"
        );
    };
    let root = tmp.path().join("root");
    let out = run(&store, &["export", "--all", "--to", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    named(&String::from_utf8_lossy(&out.stderr));
    assert!(
        root.join("--w--")
            .join("s2")
            .join("session.jsonl.zstd")
            .is_file()
    );
    let out = run(&store, &["export", "--all"]);
    assert_eq!(out.status.code(), Some(1));
    named(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 9);
    let db = tmp.path().join("all.db");
    let out = run(&store, &["export", "--all", "--to", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    named(&String::from_utf8_lossy(&out.stderr));
    assert!(db.is_file());
    // Naming the readable session exports it as before.
    ok(&store, &["export", "s2"]);
}

/// With `--all`, `--to NAME` is a directory whatever the store holds: a
/// name without a file extension is created as one even for one session,
/// and a session file's name is refused even for one session.
#[test]
fn export_all_always_writes_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = tmp.path().join("s1.jsonl");
    std::fs::write(&file, SESSION).unwrap();
    ok(&store, &["import", file.to_str().unwrap()]);
    let backup = tmp.path().join("backup");
    ok(
        &store,
        &["export", "--all", "--to", backup.to_str().unwrap()],
    );
    assert!(
        backup
            .join("--w--")
            .join("s1")
            .join("session.jsonl.zstd")
            .is_file()
    );
    let one = tmp.path().join("one.jsonl");
    let err = fail(
        &store,
        &["export", "--all", "--to", one.to_str().unwrap()],
        2,
    );
    assert!(err.contains("`export --all` writes a directory"), "{err}");
    assert!(!one.exists());
    // A second session goes into the same directory.
    ok(&store, &["import", "--id", "s2", file.to_str().unwrap()]);
    let out = ok(
        &store,
        &["export", "--all", "--to", backup.to_str().unwrap()],
    );
    assert!(out.contains("exported s2 to"), "{out}");
}

/// A root export checks every session's path first: an id whose escaped
/// form is too long for one file name stops it with nothing written,
/// naming the session, the path and why.
#[test]
fn root_export_refuses_ids_too_long_for_a_file_name_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = tmp.path().join("s1.jsonl");
    std::fs::write(&file, SESSION).unwrap();
    let long = "b".repeat(256);
    let slashes = "/".repeat(52);
    for id in ["a", &long, &slashes, "c"] {
        ok(&store, &["import", "--id", id, file.to_str().unwrap()]);
    }
    let root = tmp.path().join("root");
    let err = fail(
        &store,
        &["export", "--all", "--to", root.to_str().unwrap()],
        1,
    );
    assert!(
        err.contains(&format!("session {long:?}"))
            && err.contains(&format!("{slashes:?}"))
            && err.contains(&format!("root/--w--/{long}/session.jsonl.zstd"))
            && err.contains(&format!(
                "root/--w--/{}/session.jsonl.zstd",
                "~002F".repeat(52)
            ))
            && err.contains("as one directory name, and it is 260 bytes")
            && err.contains("2 of 4 sessions cannot be exported into a harness root")
            && err.contains("nothing was exported"),
        "{err}"
    );
    assert!(!root.exists(), "something was written");
    let err = fail(
        &store,
        &["export", "a", &long, "--to", root.to_str().unwrap()],
        1,
    );
    assert!(
        err.contains("256 bytes") && err.contains("--to FILE.jsonl"),
        "{err}"
    );
    // Such a session still goes to a file.
    ok(
        &store,
        &[
            "export",
            &long,
            "--to",
            tmp.path().join("long.jsonl").to_str().unwrap(),
        ],
    );
}

/// Messages say what happened in words, and print session ids with their
/// control characters escaped as `ls` does.
#[test]
fn messages_are_sentences_with_ids_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let file = tmp.path().join("s1.jsonl");
    std::fs::write(&file, SESSION).unwrap();
    let evil = "evil\u{1b}[2J\rid";
    let out = ok(&store, &["import", "--id", evil, file.to_str().unwrap()]);
    assert_eq!(out, "imported evil\\u001b[2J\\rid: 6 events (2 closers)\n");
    let to = tmp.path().join("e.jsonl");
    let out = ok(&store, &["export", evil, "--to", to.to_str().unwrap()]);
    assert!(
        out.starts_with("exported evil\\u001b[2J\\rid (8 events)"),
        "{out:?}"
    );
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let out = ok(
        &store,
        &["export", evil, "--to", root.to_str().unwrap(), "-q"],
    );
    assert!(
        out.starts_with("exported evil\\u001b[2J\\rid to"),
        "{out:?}"
    );
    let out = run(
        &store,
        &["export", "--salvage", evil, "--to", to.to_str().unwrap()],
    );
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("salvaged evil\\u001b[2J\\rid: 8 events"),
        "{err:?}"
    );
    // A torn final frame is described, not dumped as a Rust value.
    let zst = tmp.path().join("s1.jsonl.zstd");
    ok(
        &store,
        &["export", evil, "--zstd", "--to", zst.to_str().unwrap()],
    );
    let bytes = std::fs::read(&zst).unwrap();
    std::fs::write(&zst, &bytes[..bytes.len() - 3]).unwrap();
    let out = run(
        &tmp.path().join("other"),
        &["import", zst.to_str().unwrap()],
    );
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("torn final zstd frame: frame 1 at byte ")
            && err.contains("is cut short: the file ends inside the frame (torn write)")
            && !err.contains("TornFrame"),
        "{err}"
    );
}

/// A root export that fails midway names the session, the root and the
/// reason, and says which sessions were written (each whole) and which not.
#[test]
fn a_root_export_stopped_midway_says_what_was_written() {
    let tmp = tempfile::tempdir().unwrap();
    let store = two_sessions(tmp.path());
    let root = tmp.path().join("root");
    // A file where s2's directory goes.
    std::fs::create_dir_all(root.join("--w--")).unwrap();
    std::fs::write(root.join("--w--").join("s2"), "in the way").unwrap();
    let err = fail(
        &store,
        &["export", "--all", "--to", root.to_str().unwrap()],
        3,
    );
    assert!(
        err.contains(&format!(
            "session \"s2\": writing the export into {}: ",
            root.display()
        )) && err.contains("1 of 2 sessions exported into")
            && err.contains("it and the rest were not written"),
        "{err}"
    );
    assert!(root.join("--w--/s1/session.jsonl.zstd").is_file());
}

/// A root export never replaces a log the root holds: a differing log of
/// one session stops the whole export before anything is written, naming
/// it; the harness's log is left as it was. Re-exporting the same sessions
/// (the same bytes) into the root still succeeds.
#[test]
fn root_export_refuses_to_replace_a_log_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = two_sessions(tmp.path());
    let root = tmp.path().join("root");
    ok(&store, &["export", "--all", "--to", root.to_str().unwrap()]);
    ok(&store, &["export", "--all", "--to", root.to_str().unwrap()]);
    // The harness's own, different log of s2; s1 not there yet.
    let s2 = root.join("--w--/s2/session.jsonl.zstd");
    let theirs = b"the harness's longer log".to_vec();
    std::fs::write(&s2, &theirs).unwrap();
    std::fs::remove_dir_all(root.join("--w--/s1")).unwrap();
    let err = fail(
        &store,
        &["export", "--all", "--to", root.to_str().unwrap()],
        1,
    );
    assert!(
        err.contains("session \"s2\": the harness root already holds")
            && err.contains("nothing was exported")
            && err.contains("hint: an export never replaces a log"),
        "{err}"
    );
    assert_eq!(std::fs::read(&s2).unwrap(), theirs);
    assert!(!root.join("--w--/s1").exists(), "{err}");
    // A root in the other encoding is refused whole.
    std::fs::remove_file(&s2).unwrap();
    std::fs::write(root.join("--w--/s2/session.jsonl"), "plain").unwrap();
    let err = fail(&store, &["export", "s1", "--to", root.to_str().unwrap()], 1);
    assert!(err.contains("holds logs in the other encoding"), "{err}");
    assert!(!root.join("--w--/s1").exists(), "{err}");
}

/// A root whose session directory holds both `session.jsonl.zstd` and
/// `session.jsonl` is refused whole: the root walk takes the compressed
/// log, and before the fix `import ROOT` left the plain one (here the
/// longer session) out without a word and exited 0.
#[test]
fn import_of_a_root_refuses_a_session_directory_with_both_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let dir = root.join("--w--/s1");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("session.jsonl"), SESSION).unwrap();
    let header_only = tmp.path().join("h.jsonl");
    std::fs::write(
        &header_only,
        SESSION.lines().next().unwrap().to_owned() + "\n",
    )
    .unwrap();
    let other = tmp.path().join("other");
    ok(&other, &["import", header_only.to_str().unwrap()]);
    let z = dir.join("session.jsonl.zstd");
    ok(
        &other,
        &["export", "s1", "--zstd", "--to", z.to_str().unwrap()],
    );
    let store = tmp.path().join("store");
    let err = fail(&store, &["import", root.to_str().unwrap()], 1);
    assert!(
        err.contains("1 session directory holds both session.jsonl.zstd and session.jsonl")
            && err.contains("nothing was imported"),
        "{err}"
    );
    assert!(!store.exists(), "{err}");
    // Named one by one, both are imported.
    let out = ok(
        &store,
        &[
            "import",
            "--id-from-filename",
            dir.join("session.jsonl").to_str().unwrap(),
        ],
    );
    assert!(out.contains("imported session: 6 events"), "{out}");
}
