//! Hostile and damaged input in the harness's formats, header-only
//! sessions, atomic exports and `check` as a validator. No fixtures needed.

use sessionlog::adapters::harness::{self, ImportError, ImportOptions, ZstdError};
use sessionlog::adapters::sqlite::{self, SqliteError};
use sessionlog::adapters::{jsonl, sqlite_export, sqlite17};
use sessionlog::event::Event;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use std::path::Path;
use std::process::Command;

const HEADER: &str = r#"{"type":"session","version":0,"id":"s","createdAt":1,"delegationDepth":0}"#;
const T0: &str = r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1}}"#;
const END1: &str =
    r#"{"type":"turn/end","seq":1,"time":0,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;

fn open(dir: &Path) -> Store {
    Store::open(dir, Options::default()).unwrap()
}

fn frame(text: &str) -> Vec<u8> {
    zstd::bulk::compress(text.as_bytes(), 3).unwrap()
}

/// A Zstandard frame of `blocks` RLE blocks of 128 KiB of `b'x'` each, no
/// declared size: about 4 bytes per 128 KiB of output.
fn rle_bomb(blocks: usize) -> Vec<u8> {
    let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 7 << 3];
    for i in 0..blocks {
        let header = u32::from(i + 1 == blocks) | (1 << 1) | ((128 << 10) << 3);
        f.extend_from_slice(&header.to_le_bytes()[..3]);
        f.push(b'x');
    }
    f
}

/// Like [`rle_bomb`], but the output is a JSON string: `"xxx...x"`.
fn json_bomb(blocks: usize) -> Vec<u8> {
    let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 7 << 3];
    let raw_quote = |last: u32| {
        let h = last | (1 << 3); // raw block of 1 byte
        let mut b = h.to_le_bytes()[..3].to_vec();
        b.push(b'"');
        b
    };
    f.extend(raw_quote(0));
    for _ in 0..blocks {
        let header: u32 = (1 << 1) | ((128 << 10) << 3);
        f.extend_from_slice(&header.to_le_bytes()[..3]);
        f.push(b'x');
    }
    f.extend(raw_quote(1));
    f
}

#[test]
fn a_tiny_zstd_bomb_is_refused_at_the_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = frame(&format!("{HEADER}\n"));
    bytes.extend(rle_bomb(520)); // 65 MiB of output from ~2 KB
    assert!(bytes.len() < 4096);
    let path = tmp.path().join("bomb.jsonl.zstd");
    std::fs::write(&path, &bytes).unwrap();
    let store = open(&tmp.path().join("store"));
    let err = harness::import_file(&store, &path, ImportOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ImportError::Zstd {
                source: ZstdError::TooLarge { limit },
                ..
            } if limit == 64 << 20
        ),
        "{err}"
    );
    assert!(err.to_string().contains("bomb.jsonl.zstd"), "{err}");
}

#[test]
fn a_frame_asking_for_a_huge_window_is_corrupt_not_allocated() {
    // Window descriptor exponent 20: a 2^30-byte window.
    let mut bytes = frame(&format!("{HEADER}\n"));
    bytes.extend([0x28, 0xB5, 0x2F, 0xFD, 0x00, 20 << 3, 0x01, 0x00, 0x00]);
    let err = harness::read_zstd_session(&bytes).unwrap_err();
    assert!(matches!(err, ZstdError::Corrupt { frame: 1, .. }), "{err}");
}

#[test]
fn damage_inside_a_complete_frame_is_an_error_even_without_a_later_turn_end() {
    let tmp = tempfile::tempdir().unwrap();
    let gap = r#"{"type":"step/start","seq":5,"time":0,"data":{"turn":1,"step":1}}"#;
    let mut bytes = frame(&format!("{HEADER}\n"));
    bytes.extend(frame(&format!("{T0}\n{gap}\n")));
    let path = tmp.path().join("gap.jsonl.zstd");
    std::fs::write(&path, &bytes).unwrap();
    let store = open(&tmp.path().join("store"));
    let err = harness::import_file(&store, &path, ImportOptions::default()).unwrap_err();
    assert!(
        matches!(err, ImportError::Corrupt { line: Some(3), .. }),
        "{err}"
    );
    assert!(store.list().unwrap().is_empty());

    // The same gap in a torn final frame is a torn tail: the prefix imports.
    let mut bytes = frame(&format!("{HEADER}\n"));
    bytes.extend(frame(&format!("{T0}\n{END1}\n")));
    let torn = frame(&format!("{gap}\n"));
    bytes.extend(&torn[..torn.len() - 3]);
    std::fs::write(&path, &bytes).unwrap();
    let r = harness::import_file(&store, &path, ImportOptions::default()).unwrap();
    assert_eq!(r.events, 2);
    assert!(r.torn_frame.is_some());
}

fn packed(turn: &str, id: &str, members: usize) -> String {
    let args = vec!["\"x\""; members].join(",");
    let dt = vec!["1"; members - 1].join(",");
    format!(
        r#"{{"type":"tool-call-chunks","seq0":1,"time0":0,"data":{{"turn":{turn},"step":1,"index":0,"dt":[{dt}],"id":"{id}","args":[{args}]}}}}"#
    )
}

#[test]
fn packed_rows_cannot_multiply_their_size() {
    let file = |row: &str| format!("{HEADER}\n{T0}\n{row}\n").into_bytes();
    // An ordinary row expands.
    let ok = file(&packed("1", "call_1", 3));
    assert_eq!(jsonl::read_session(&ok, false).unwrap().events.len(), 4);
    // A 100 KB number copied into every member: refused, not expanded.
    let big_turn = format!("1{}", "0".repeat(100_000));
    let v = jsonl::read_session(&file(&packed(&big_turn, "c", 3)), false).unwrap_err();
    assert!(v.reason.contains("data.turn"), "{v}");
    // A long tool-call id copied into 10,000 members: refused.
    let v = jsonl::read_session(&file(&packed("1", &"i".repeat(600), 10_000)), false).unwrap_err();
    assert!(v.reason.contains("copied into every member"), "{v}");
    // turn must be a number, as the harness requires.
    let v = jsonl::read_session(&file(&packed("{\"a\":1}", "c", 3)), false).unwrap_err();
    assert!(v.reason.contains("must be a number"), "{v}");
}

/// A schema 17 database with session `s` holding `rows`
/// `(seq, type, time, data, ignorable)` (data as text or blob).
fn db17(path: &Path, rows: &[(i64, &str, i64, rusqlite::types::Value, Option<i64>)]) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(sqlite17::DDL).unwrap();
    c.execute(
        "INSERT INTO persistence_state VALUES (1, '44444444-4444-4444-8444-444444444444')",
        [],
    )
    .unwrap();
    c.execute_batch("PRAGMA application_id = 1146308688; PRAGMA user_version = 17;")
        .unwrap();
    c.execute(
        "INSERT INTO sessions VALUES ('s', 0, 1, NULL, NULL, NULL, NULL, 0, NULL, '44444444-4444-4444-8444-444444444444', 1)",
        [],
    )
    .unwrap();
    for (seq, kind, time, data, ign) in rows {
        c.execute(
            "INSERT INTO events VALUES ('s', ?1, ?2, ?3, ?4, NULL, NULL, ?5)",
            rusqlite::params![seq, kind, time, data, ign],
        )
        .unwrap();
    }
}

fn text(s: &str) -> rusqlite::types::Value {
    rusqlite::types::Value::Text(s.to_owned())
}

#[test]
fn schema_17_rows_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let t0 = text(r#"{"turn":1}"#);
    let end = |seq| {
        (
            seq,
            "turn/end",
            0,
            text(r#"{"turn":1,"reason":{"kind":"completed"}}"#),
            None,
        )
    };
    // A packed row claiming 2,000 members: more than a row may hold.
    let many = format!(
        r#"{{"turn":1,"step":1,"index":0,"dt":[{}],"texts":[{}]}}"#,
        vec!["0"; 1999].join(","),
        vec!["\"a\""; 2000].join(",")
    );
    let p = tmp.path().join("many.db");
    db17(
        &p,
        &[
            (0, "turn/start", 0, t0.clone(), None),
            (1, "text-chunks", 0, text(&many), Some(0)),
            end(2001),
        ],
    );
    let err = sqlite::read_db(&p).unwrap_err();
    assert!(
        matches!(&err, SqliteError::CorruptRow { seq: Some(1), reason, .. } if reason.contains("2000 members")),
        "{err}"
    );
    // A packed data blob that decodes past 1 MiB: refused while decoding.
    let p = tmp.path().join("bomb.db");
    db17(
        &p,
        &[
            (0, "turn/start", 0, t0.clone(), None),
            (
                1,
                "text-chunks",
                0,
                rusqlite::types::Value::Blob(rle_bomb(16)),
                Some(0),
            ),
            end(4),
        ],
    );
    let err = sqlite::read_db(&p).unwrap_err();
    assert!(err.to_string().contains("1048576"), "{err}");
    // The same bad row with no turn/end after it: a torn tail, prefix kept.
    let p = tmp.path().join("torn.db");
    db17(
        &p,
        &[
            (0, "turn/start", 0, t0, None),
            (
                1,
                "text-chunks",
                0,
                rusqlite::types::Value::Blob(rle_bomb(16)),
                Some(0),
            ),
        ],
    );
    let s = sqlite::read_db(&p).unwrap();
    assert_eq!((s[0].events.len(), s[0].torn_from), (1, Some(1)));
    // Many scalar blobs, each under its own 64 MiB limit, together past
    // what a small file may decode to.
    let p = tmp.path().join("many-bombs.db");
    let mut rows = vec![(0, "turn/start", 0, text(r#"{"turn":1}"#), None)];
    for seq in 1..=3 {
        rows.push((
            seq,
            "x/y",
            0,
            rusqlite::types::Value::Blob(json_bomb(256)), // 32 MiB each
            None,
        ));
    }
    rows.push(end(4));
    db17(&p, &rows);
    let err = sqlite::read_db(&p).unwrap_err();
    assert!(err.to_string().contains("in all"), "{err}");
    // A column of the wrong kind is refused even in the tail, as the
    // harness's decodeEventRow refuses it before the torn-tail rule.
    let p = tmp.path().join("types.db");
    db17(
        &p,
        &[
            (0, "turn/start", 0, text(r#"{"turn":1}"#), None),
            (1, "", 0, text("{}"), None),
        ],
    );
    let err = sqlite::read_db(&p).unwrap_err();
    assert!(
        matches!(&err, SqliteError::CorruptRow { seq: Some(1), reason, .. } if reason.contains("non-empty string")),
        "{err}"
    );
}

#[test]
fn header_only_sessions_are_read_as_sessions_with_no_events() {
    let tmp = tempfile::tempdir().unwrap();
    // Plain JSONL and a zstd log holding only the header.
    let only_header = format!("{HEADER}\n");
    let s = jsonl::read_session(only_header.as_bytes(), false).unwrap();
    assert_eq!((s.header.header.id.as_str(), s.events.len()), ("s", 0));
    let z = harness::read_zstd_session(&frame(&format!("{HEADER}\n"))).unwrap();
    assert_eq!(jsonl::read_session(&z.text, false).unwrap().events.len(), 0);
    // Schema 17 and schema 4 databases with a sessions row and no events.
    let p = tmp.path().join("h17.db");
    db17(&p, &[]);
    let s = sqlite::read_db(&p).unwrap();
    assert_eq!((s.len(), s[0].events.len()), (1, 0));
    // Import stores them as sessions with no events.
    let store = open(&tmp.path().join("store"));
    let r = sqlite::import_db(&store, &p, false).unwrap();
    assert_eq!((r.sessions.len(), r.sessions[0].events), (1, 0));
    assert_eq!(store.list().unwrap().len(), 1);
    assert!(store.load(&r.sessions[0].id).unwrap().1.is_empty());
}

fn store_with_session(dir: &Path) -> Store {
    let store = open(dir);
    store.create(SessionHeader::new("s", 1)).unwrap();
    let events = [T0, END1].map(|t| Event::from_json(t).unwrap());
    store.append("s", &events).unwrap();
    store
}

#[test]
fn exports_into_a_database_with_a_trigger_or_other_version_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = store_with_session(&tmp.path().join("store"));
    let ids = ["s".to_owned()];
    // A fresh schema 17 export, then a trigger added to it.
    let p = tmp.path().join("out.db");
    sqlite_export::export_db(&store, &ids, &p, 17).unwrap();
    let c = rusqlite::Connection::open(&p).unwrap();
    c.execute_batch(
        "DELETE FROM events; DELETE FROM sessions; CREATE TRIGGER t AFTER INSERT ON events BEGIN DELETE FROM events; END;",
    )
    .unwrap();
    drop(c);
    let before = std::fs::read(&p).unwrap();
    let err = sqlite_export::export_db(&store, &ids, &p, 17).unwrap_err();
    assert!(matches!(err, SqliteError::SchemaObjects { .. }), "{err}");
    assert!(err.to_string().contains("trigger t"), "{err}");
    assert_eq!(std::fs::read(&p).unwrap(), before);
    // Schema 4 asked of a schema 17 file, and a version we do not write.
    let err = sqlite_export::export_db(&store, &ids, &p, 4).unwrap_err();
    assert!(matches!(
        err,
        SqliteError::OtherSchema {
            found: 17,
            asked: 4,
            ..
        }
    ));
    let err = sqlite_export::export_db(&store, &ids, &tmp.path().join("x.db"), 5).unwrap_err();
    assert!(err.to_string().contains("version 5"), "{err}");
    assert!(!tmp.path().join("x.db").exists());
}

fn cli(store: &Path, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sessionlog"));
    if !store.as_os_str().is_empty() {
        c.arg("--store").arg(store);
    }
    c.args(args)
        .env_remove("SESSIONLOG_STORE")
        .output()
        .unwrap()
}

#[test]
fn export_to_a_file_replaces_it_atomically_and_leaves_no_temporary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    store_with_session(&dir).close().unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let file = out.join("s.jsonl");
    std::fs::write(&file, "old").unwrap();
    let o = cli(&dir, &["export", "s", "--to", file.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .starts_with("{\"type\":\"session\"")
    );
    let names: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
    // A .db export: schema 17 by default, and --schema 9 is refused by name.
    let db = out.join("s.db");
    assert!(
        cli(&dir, &["export", "s", "--to", db.to_str().unwrap()])
            .status
            .success()
    );
    let v: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 17);
    let db9 = out.join("s9.db");
    let o = cli(
        &dir,
        &[
            "export",
            "s",
            "--schema",
            "9",
            "--to",
            db9.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("version 9"),
        "{o:?}"
    );
    assert!(!db9.exists());
}

#[test]
fn check_reports_a_gap_the_loader_treats_as_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let gap = r#"{"type":"step/start","seq":5,"time":0,"data":{"turn":1,"step":1}}"#;
    let file = tmp.path().join("gap.jsonl");
    std::fs::write(&file, format!("{HEADER}\n{T0}\n{gap}\n")).unwrap();
    let f = file.to_str().unwrap();
    let o = cli(Path::new(""), &["check", f]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("FAIL") && out.contains("contiguity"),
        "{out}"
    );
    // The loader keeps the prefix.
    let o = cli(Path::new(""), &["cat", f]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 2);
    // An unparsable complete line, too; a final fragment without newline is
    // still only a torn write.
    std::fs::write(&file, format!("{HEADER}\n{T0}\n{{not json\n")).unwrap();
    assert_eq!(cli(Path::new(""), &["check", f]).status.code(), Some(1));
    std::fs::write(&file, format!("{HEADER}\n{T0}\n{{not js")).unwrap();
    assert!(cli(Path::new(""), &["check", f]).status.success());
}

#[test]
fn a_torn_final_frame_that_does_not_decode_keeps_the_complete_frames() {
    let mut bytes = frame(&format!("{HEADER}\n"));
    bytes.extend(frame(&format!("{T0}\n{END1}\n")));
    // A frame header, then a whole compressed block of garbage that is not
    // the last one: the file ends inside the frame, after that block.
    bytes.extend([0x28, 0xB5, 0x2F, 0xFD, 0x00, 7 << 3]);
    bytes.extend([(40u32 << 3 | 2 << 1) as u8, 0x01, 0x00]);
    bytes.extend([0xFF; 40]);
    let z = harness::read_zstd_session(&bytes).unwrap();
    let t = z.torn.unwrap();
    assert!(t.reason.contains("does not decode"), "{t:?}");
    assert_eq!(jsonl::read_session(&z.text, false).unwrap().events.len(), 2);
    // The same garbage in a complete frame is corruption.
    let mut bad = frame(&format!("{HEADER}\n"));
    bad.extend([0x28, 0xB5, 0x2F, 0xFD, 0x00, 7 << 3]);
    bad.extend([(40u32 << 3 | 2 << 1 | 1) as u8, 0x01, 0x00]);
    bad.extend([0xFF; 40]);
    assert!(matches!(
        harness::read_zstd_session(&bad),
        Err(ZstdError::Corrupt { frame: 1, .. })
    ));
}

#[test]
fn schema_17_keeps_empty_provenance_and_refuses_a_relative_cwd() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(&tmp.path().join("store"));
    let mut h = SessionHeader::new("s", 1);
    h.cwd = Some("/w".into());
    store.create(h).unwrap();
    let msg = r#"{"type":"assistant/message","seq":1,"time":0,"data":{"turn":1,"step":1,"message":{"role":"assistant","content":[]}},"sourceEventSeqs":[],"surfaceOp":"append"}"#;
    let events = [T0, msg].map(|t| Event::from_json(t).unwrap());
    store.append("s", &events).unwrap();
    let p = tmp.path().join("p.db");
    sqlite_export::export_db(&store, &["s".to_owned()], &p, 17).unwrap();
    let back = sqlite::read_db(&p).unwrap();
    assert_eq!(back[0].events[1].source_event_seqs, Some(vec![]));
    let kind: String = rusqlite::Connection::open(&p)
        .unwrap()
        .query_row(
            "SELECT typeof(source_event_seqs) FROM events WHERE seq = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(kind, "blob");

    let mut rel = SessionHeader::new("r", 1);
    rel.cwd = Some("{{cwd}}/w".into());
    store.create(rel).unwrap();
    store.append("r", &[Event::from_json(T0).unwrap()]).unwrap();
    let q = tmp.path().join("q.db");
    let err = sqlite_export::export_db(&store, &["r".to_owned()], &q, 17).unwrap_err();
    assert!(err.to_string().contains("not absolute"), "{err}");
    assert!(!q.exists());
    // Schema 4 has no such rule.
    sqlite_export::export_db(&store, &["r".to_owned()], &q, 4).unwrap();
}
