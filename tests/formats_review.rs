//! Defects found by the review of the current-format adapters (harness
//! roots, schema 17), each pinned by a test that fails without its fix.

use sessionlog::adapters::harness::{self, ExportError, ExportOptions};
use sessionlog::event::Event;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use std::path::Path;

fn open(dir: &Path) -> Store {
    Store::open(dir, Options::default()).unwrap()
}

const ZSTD: ExportOptions = ExportOptions {
    pack_chunks: true,
    zstd: true,
};

/// A store holding session `id` (cwd `/w`) with `turns` closed turns.
fn store_with(dir: &Path, id: &str, cwd: &str, turns: u64) -> Store {
    let store = open(dir);
    let mut header = SessionHeader::new(id, 1);
    header.cwd = Some(cwd.to_owned());
    let mut events = Vec::new();
    for t in 0..turns {
        let seq = events.len() as u64;
        let turn = t + 1;
        events.push(Event::new("turn/start", seq, 1, &format!(r#"{{"turn":{turn}}}"#)).unwrap());
        events.push(
            Event::new(
                "turn/end",
                seq + 1,
                2,
                &format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#),
            )
            .unwrap(),
        );
    }
    store.import(header, &events, false).unwrap();
    store
}

/// An export into a harness root never replaces a log the root holds for
/// that session: before the fix, a store holding an older, shorter copy of
/// a session exported `--all` into the harness's live root silently
/// replaced the harness's longer log (rename over it), losing its events.
#[test]
fn root_export_never_replaces_an_existing_log() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let long = store_with(&tmp.path().join("long"), "s1", "/w", 3);
    let short = store_with(&tmp.path().join("short"), "s1", "/w", 1);
    let path = harness::export_session_to_root(&long, "s1", &root, ZSTD).unwrap();
    let before = std::fs::read(&path).unwrap();

    // The same bytes again: nothing to do, and no error.
    assert_eq!(
        harness::export_session_to_root(&long, "s1", &root, ZSTD).unwrap(),
        path
    );
    harness::check_export_to_root(&long, "s1", &root, ZSTD).unwrap();

    // Another log of the session: refused, the harness's log untouched.
    let err = harness::export_session_to_root(&short, "s1", &root, ZSTD).unwrap_err();
    assert!(
        matches!(&err, ExportError::Exists { session, path: p, .. } if session == "s1" && *p == path),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("nothing of the session was written"),
        "{err}"
    );
    let err = harness::check_export_to_root(&short, "s1", &root, ZSTD).unwrap_err();
    assert!(matches!(err, ExportError::Exists { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let dir: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(dir, ["session.jsonl.zstd"], "no temporary left behind");
}

/// The harness finds a session by id in every project directory and
/// refuses an id found twice: an export of the same id with another cwd
/// (another project directory) would make both unloadable, so it is
/// refused, as is a log of the other encoding at the export's own place.
#[test]
fn root_export_refuses_a_second_log_of_the_same_id() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let here = store_with(&tmp.path().join("a"), "s1", "/w", 1);
    let there = store_with(&tmp.path().join("b"), "s1", "/elsewhere", 1);
    let first = harness::export_session_to_root(&here, "s1", &root, ZSTD).unwrap();
    let err = harness::export_session_to_root(&there, "s1", &root, ZSTD).unwrap_err();
    assert!(
        matches!(&err, ExportError::Exists { path, .. } if *path == first),
        "{err}"
    );
    assert!(!root.join("--elsewhere--").exists(), "{err}");

    // A plain log where the compressed one would go.
    let root2 = tmp.path().join("root2");
    let plain = root2.join("--w--/s1/session.jsonl");
    std::fs::create_dir_all(plain.parent().unwrap()).unwrap();
    std::fs::write(&plain, "harness log").unwrap();
    let err = harness::export_session_to_root(&here, "s1", &root2, ZSTD).unwrap_err();
    assert!(
        matches!(&err, ExportError::Exists { path, .. } if *path == plain),
        "{err}"
    );
    assert!(!root2.join("--w--/s1/session.jsonl.zstd").exists());
    assert_eq!(
        harness::other_encoding_in_root(&root2, true).unwrap(),
        Some(plain)
    );
    assert_eq!(harness::other_encoding_in_root(&root, true).unwrap(), None);
}

/// An `events` row of a schema 17 database whose session has no
/// `sessions` row is refused, as schema 4 refuses it: before the fix the
/// reader went session by session and never saw it, so the import
/// succeeded and the event was lost without a word.
#[test]
fn schema_17_refuses_orphan_event_rows() {
    use sessionlog::adapters::sqlite::{self, SqliteError};
    use sessionlog::adapters::{sqlite_export, sqlite17};
    let tmp = tempfile::tempdir().unwrap();
    let a = store_with(&tmp.path().join("a"), "s1", "/w", 1);
    let db = tmp.path().join("out.db");
    sqlite_export::export_db(&a, &["s1".to_owned()], &db, sqlite17::SCHEMA_VERSION).unwrap();
    assert_eq!(sqlite::read_db(&db).unwrap().len(), 1);
    // As a tool or a connection without foreign keys may write it.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    conn.execute(
        "INSERT INTO events VALUES ('ghost', 0, 'turn/start', 1, '{\"turn\":1}', NULL, NULL, NULL)",
        [],
    )
    .unwrap();
    drop(conn);
    let err = sqlite::read_db(&db).unwrap_err();
    assert!(
        matches!(&err, SqliteError::OrphanEvents { session, count: 1, .. } if session == "ghost"),
        "{err}"
    );
    let b = open(&tmp.path().join("b"));
    let err = sqlite::import_db(&b, &db, false).unwrap_err();
    assert!(matches!(err, SqliteError::OrphanEvents { .. }), "{err}");
    assert!(b.list().unwrap().is_empty());
}

/// A streamed emoji split between two chunks leaves each chunk's text a
/// lone UTF-16 surrogate (`"\ud83d"`, `"\ude00"`): a JavaScript string, so
/// the harness writes such chunks and packs them. The store keeps them
/// verbatim, but before the fix a packed row holding one was refused as
/// "member is not a string", so our own packed, zstd-root and schema 17
/// exports (and the harness's logs) could not be imported back.
#[test]
fn packed_rows_with_lone_surrogates_round_trip() {
    use sessionlog::adapters::harness::{ImportOptions, import_file};
    use sessionlog::adapters::{jsonl, sqlite, sqlite_export, sqlite17};
    let tmp = tempfile::tempdir().unwrap();
    let a = open(&tmp.path().join("a"));
    let mut header = SessionHeader::new("s", 1);
    header.cwd = Some("/w".into());
    let chunk = |seq: u64, text: &str| {
        Event::new(
            "assistant/chunk",
            seq,
            2,
            &format!(
                r#"{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":"{text}"}}}}"#
            ),
        )
        .unwrap()
    };
    let tool = |seq: u64, id: &str| {
        Event::new(
            "assistant/chunk",
            seq,
            3,
            &format!(
                r#"{{"turn":1,"step":1,"chunk":{{"type":"tool-call-delta","index":1,"id":"{id}","name":"n\udfff","argumentsDelta":"\ud800"}}}}"#
            ),
        )
        .unwrap()
    };
    let events = vec![
        Event::new("turn/start", 0, 1, r#"{"turn":1}"#).unwrap(),
        Event::new("step/start", 1, 1, r#"{"turn":1,"step":1}"#).unwrap(),
        chunk(2, "a"),
        chunk(3, r"\ud83d"),
        chunk(4, r"\ude00b"),
        tool(5, r"c\ud800"),
        tool(6, r"c\ud800"),
        tool(7, r"c\ud800"),
        Event::new("step/end", 8, 4, r#"{"turn":1,"step":1}"#).unwrap(),
        Event::new(
            "turn/end",
            9,
            4,
            r#"{"turn":1,"reason":{"kind":"completed"}}"#,
        )
        .unwrap(),
    ];
    a.import(header.clone(), &events, false).unwrap();
    let want = a.load("s").unwrap();

    // Packed JSONL: two packed rows, read back exactly.
    let mut packed = Vec::new();
    harness::export_session(&a, "s", &mut packed, ZSTD_OFF_PACKED).unwrap();
    let text = String::from_utf8(packed.clone()).unwrap();
    assert_eq!(text.matches("-chunks\"").count(), 2, "{text}");
    let back = jsonl::read_session(&packed, false).unwrap();
    assert_eq!(back.events, want.1);
    let file = tmp.path().join("s.jsonl");
    std::fs::write(&file, &packed).unwrap();
    let b = open(&tmp.path().join("b"));
    import_file(&b, &file, ImportOptions::default()).unwrap();
    assert_eq!(b.load("s").unwrap(), want);

    // A harness root (zstd frames of packed rows).
    let root = tmp.path().join("root");
    let path = harness::export_session_to_root(&a, "s", &root, ZSTD).unwrap();
    let c = open(&tmp.path().join("c"));
    import_file(&c, &path, ImportOptions::default()).unwrap();
    assert_eq!(c.load("s").unwrap(), want);

    // Schema 17 (packed rows in the events table).
    let db = tmp.path().join("s.db");
    sqlite_export::export_db(&a, &["s".to_owned()], &db, sqlite17::SCHEMA_VERSION).unwrap();
    let d = open(&tmp.path().join("d"));
    sqlite::import_db(&d, &db, false).unwrap();
    assert_eq!(d.load("s").unwrap(), want);
}

const ZSTD_OFF_PACKED: ExportOptions = ExportOptions {
    pack_chunks: true,
    zstd: false,
};

/// A complete line holding a number that is not finite (`1e400`) is not a
/// torn write: it parses (the harness reads it as `Infinity` and keeps it
/// and the lines after it). Before the fix the reader took it for a torn
/// tail when no `turn/end` followed, so an import dropped it and every
/// line after it and exited 0 with a note; now it is refused, naming the
/// file, line and seq, and nothing is stored.
#[test]
fn a_complete_line_with_a_non_finite_number_is_refused_not_dropped() {
    use sessionlog::adapters::harness::{ImportError, ImportOptions, import_file};
    use sessionlog::adapters::jsonl;
    let tmp = tempfile::tempdir().unwrap();
    let text = concat!(
        r#"{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0}"#,
        "\n",
        r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
        "\n",
        r#"{"type":"step/start","seq":1,"time":1,"data":{"turn":1,"step":1,"big":1e400}}"#,
        "\n",
        r#"{"type":"step/end","seq":2,"time":1,"data":{"turn":1,"step":1}}"#,
        "\n",
    );
    let v = jsonl::read_session(text.as_bytes(), false).unwrap_err();
    assert_eq!(v.seq(), Some(1), "{v}");
    assert!(v.reason.contains("not finite"), "{v}");
    let file = tmp.path().join("s.jsonl");
    std::fs::write(&file, text).unwrap();
    let store = open(&tmp.path().join("store"));
    let err = import_file(&store, &file, ImportOptions::default()).unwrap_err();
    assert!(
        matches!(
            &err,
            ImportError::Corrupt {
                line: Some(3),
                seq: Some(1),
                ..
            }
        ),
        "{err}"
    );
    assert!(store.list().unwrap().is_empty());
    // Unparsable lines stay torn tails, as the harness reads them.
    let torn = text.replace("1e400", "NaN");
    let s = jsonl::read_session(torn.as_bytes(), false).unwrap();
    assert_eq!((s.events.len(), s.torn.unwrap().line), (1, 3));
}

/// A schema 17 row after the last `turn/end` that decodes (its data is
/// one JSON value) but whose event breaks a rule (a number that is not
/// finite, an unknown surface op) is not a torn tail: the harness's reader
/// decodes it and keeps it. Before the fix the reader dropped it, and the
/// rows after it, as a "torn physical tail", and the import exited 0 with
/// a note; now it is refused, naming the session and seq. Rows that do not
/// decode (here: a BLOB that is not zstd) stay torn tails, as the harness
/// reads them.
#[test]
fn schema_17_tail_rows_that_decode_are_never_dropped_as_torn() {
    use sessionlog::adapters::sqlite::{self, SqliteError};
    use sessionlog::adapters::{sqlite_export, sqlite17};
    let tmp = tempfile::tempdir().unwrap();
    let a = open(&tmp.path().join("a"));
    let mut header = SessionHeader::new("s", 1);
    header.cwd = Some("/w".into());
    let events = vec![
        Event::new("turn/start", 0, 1, r#"{"turn":1}"#).unwrap(),
        Event::new(
            "turn/end",
            1,
            1,
            r#"{"turn":1,"reason":{"kind":"completed"}}"#,
        )
        .unwrap(),
        Event::new("turn/start", 2, 1, r#"{"turn":2}"#).unwrap(),
        Event::new("step/start", 3, 1, r#"{"turn":2,"step":1}"#).unwrap(),
        Event::new("step/end", 4, 1, r#"{"turn":2,"step":1}"#).unwrap(),
    ];
    a.import(header, &events, false).unwrap();
    let base = tmp.path().join("base.db");
    sqlite_export::export_db(&a, &["s".to_owned()], &base, sqlite17::SCHEMA_VERSION).unwrap();
    let variant = |name: &str, sql: &str| {
        let db = tmp.path().join(name);
        std::fs::copy(&base, &db).unwrap();
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
        db
    };
    for (name, sql) in [
        (
            "inf.db",
            r#"UPDATE events SET data = '{"turn":2,"step":1,"e":1e400}' WHERE seq = 3"#,
        ),
        (
            "op.db",
            r#"UPDATE events SET surface_op = '"prepend"' WHERE seq = 3"#,
        ),
    ] {
        let db = variant(name, sql);
        let err = sqlite::read_db(&db).unwrap_err();
        assert!(
            matches!(&err, SqliteError::CorruptRow { session, seq: Some(3), .. } if session == "s"),
            "{name}: {err}"
        );
        let b = open(&tmp.path().join(format!("store-{name}")));
        assert!(sqlite::import_db(&b, &db, false).is_err(), "{name}");
        assert!(b.list().unwrap().is_empty(), "{name}");
    }
    let db = variant(
        "blob.db",
        r#"UPDATE events SET data = CAST('{"turn":2,"step":1}' AS BLOB) WHERE seq = 3"#,
    );
    let s = sqlite::read_db(&db).unwrap();
    assert_eq!((s[0].events.len(), s[0].torn_from), (3, Some(3)));
}

/// An event whose type is a packed row's tag (`text-chunks`, ...) can be
/// stored (the vocabulary is open; a schema 17 database tells it from a
/// packed row by its `ignorable` column), but a harness JSONL line with
/// that type is a packed row to every reader. Before the fix, export
/// wrote such a line (exit 0) and the file could not be imported back,
/// by us or by the harness; now the export is refused, naming the
/// session and seq, and nothing is written.
#[test]
fn export_refuses_an_event_typed_like_a_packed_row() {
    use sessionlog::adapters::{sqlite, sqlite_export, sqlite17};
    let tmp = tempfile::tempdir().unwrap();
    let a = open(&tmp.path().join("a"));
    let mut header = SessionHeader::new("s", 1);
    header.cwd = Some("/w".into());
    let events = vec![
        Event::new("turn/start", 0, 1, r#"{"turn":1}"#).unwrap(),
        Event::new("text-chunks", 1, 1, r#"{"turn":1}"#).unwrap(),
        Event::new(
            "turn/end",
            2,
            1,
            r#"{"turn":1,"reason":{"kind":"completed"}}"#,
        )
        .unwrap(),
    ];
    a.import(header, &events, false).unwrap();
    for opts in [ZSTD, ZSTD_OFF_PACKED, ExportOptions::default()] {
        let mut out = Vec::new();
        let err = harness::export_session(&a, "s", &mut out, opts).unwrap_err();
        let m = err.to_string();
        assert!(
            m.contains("session \"s\", seq 1") && m.contains("packed row"),
            "{opts:?}: {m}"
        );
        assert!(out.is_empty(), "{opts:?}");
    }
    let root = tmp.path().join("root");
    assert!(harness::export_session_to_root(&a, "s", &root, ZSTD).is_err());
    assert!(!root.exists());
    // Schema 17 holds it, and gives it back.
    let db = tmp.path().join("s.db");
    sqlite_export::export_db(&a, &["s".to_owned()], &db, sqlite17::SCHEMA_VERSION).unwrap();
    let b = open(&tmp.path().join("b"));
    sqlite::import_db(&b, &db, false).unwrap();
    assert_eq!(b.load("s").unwrap(), a.load("s").unwrap());
}
