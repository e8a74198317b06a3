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
