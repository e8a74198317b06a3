//! The SQLite schema 4 adapter: reading the harness's `public.db` against its
//! MANIFEST, an import/export round trip compared row by row, and the
//! rejections (schema version, schema shape, invalid rows) with the store
//! left unchanged.
//!
//! The fixture tests read `../shared/fixtures/harness-sqlite-v4/` (or
//! `$SESSIONLOG_FIXTURES/harness-sqlite-v4/`); when absent they print
//! SKIPPED, unless `SESSIONLOG_REQUIRE_FIXTURES` is set.

use rusqlite::Connection;
use sessionlog::adapters::sqlite::{SqliteError, export_db, import_db, read_db};
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use sessionlog::violation::Rule;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The DDL of section 9, as the design document writes it.
const DDL: &str = "CREATE TABLE sessions (id TEXT PRIMARY KEY, version INTEGER NOT NULL, created_at INTEGER NOT NULL,
  cwd TEXT, parent_session TEXT, seed_length INTEGER) STRICT;
CREATE TABLE events (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL, type TEXT NOT NULL, time INTEGER NOT NULL, data TEXT NOT NULL,
  source_event_seqs TEXT, surface_op TEXT, PRIMARY KEY (session_id, seq)) STRICT;";

fn fixture_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("SESSIONLOG_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures"))
        .join("harness-sqlite-v4");
    if dir.join("public.db").is_file() && dir.join("MANIFEST.tsv").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("SESSIONLOG_REQUIRE_FIXTURES").is_none(),
        "fixtures required but not found at {}",
        dir.display()
    );
    println!("SKIPPED: SQLite fixtures not found at {}", dir.display());
    None
}

struct ManifestRow {
    id: String,
    events: usize,
    last_turn_closed: bool,
}

fn manifest(dir: &Path) -> Vec<ManifestRow> {
    let text = std::fs::read_to_string(dir.join("MANIFEST.tsv")).unwrap();
    let mut lines = text.lines();
    let cols: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).unwrap();
    let (id, events, closed) = (col("session_id"), col("events"), col("last_turn_closed"));
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            ManifestRow {
                id: f[id].to_owned(),
                events: f[events].parse().unwrap(),
                last_turn_closed: match f[closed] {
                    "yes" => true,
                    "no" => false,
                    other => panic!("last_turn_closed {other:?}"),
                },
            }
        })
        .collect()
}

fn open_store(dir: &Path) -> Store {
    Store::open(dir, Options::default()).unwrap()
}

type SessionRow = (
    String,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<i64>,
);
type EventRow = (
    String,
    i64,
    String,
    i64,
    String,
    Option<String>,
    Option<String>,
);

/// Every row `sql` selects from the database at `db`, as a tuple of its
/// columns.
fn select<T>(db: &Path, sql: &str) -> Vec<T>
where
    T: for<'r> TryFrom<&'r rusqlite::Row<'r>, Error = rusqlite::Error>,
{
    let conn = Connection::open(db).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |r| T::try_from(r))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn session_rows(db: &Path) -> Vec<SessionRow> {
    select(
        db,
        "SELECT id, version, created_at, cwd, parent_session, seed_length FROM sessions ORDER BY id",
    )
}

/// Events rows by session id, in seq order.
fn event_rows(db: &Path) -> BTreeMap<String, Vec<EventRow>> {
    let rows: Vec<EventRow> = select(
        db,
        "SELECT session_id, seq, type, time, data, source_event_seqs, surface_op FROM events ORDER BY session_id, seq",
    );
    let mut out: BTreeMap<String, Vec<EventRow>> = BTreeMap::new();
    for row in rows {
        out.entry(row.0.clone()).or_default().push(row);
    }
    out
}

fn schema_sql(db: &Path) -> Vec<(String, String)> {
    select(
        db,
        "SELECT name, sql FROM sqlite_schema WHERE type = 'table' ORDER BY name",
    )
}

#[test]
fn reads_public_db_as_its_manifest_says() {
    let Some(dir) = fixture_dir() else { return };
    let rows = manifest(&dir);
    let sessions = read_db(dir.join("public.db")).unwrap();
    assert_eq!(sessions.len(), rows.len(), "session count");
    assert_eq!(rows.len(), 6);
    for (s, m) in sessions.iter().zip(&rows) {
        assert_eq!(s.header.id, m.id, "sessions in rowid order");
        assert_eq!(s.events.len(), m.events, "events of {}", m.id);
        assert_eq!(s.header.version, 0);
        for (i, e) in s.events.iter().enumerate() {
            assert_eq!(e.seq, i as u64);
        }
        assert_eq!(
            s.closers.is_empty(),
            m.last_turn_closed,
            "closers of {}: {:?}",
            m.id,
            s.closers
        );
    }
    // A fork child keeps its lineage columns.
    let child = sessions
        .iter()
        .find(|s| s.header.parent_session.is_some())
        .unwrap();
    assert_eq!(child.header.seed_length, Some(42));
    // The one replace op comes through typed.
    let replaces: Vec<&OwnedEvent> = sessions
        .iter()
        .flat_map(|s| &s.events)
        .filter(|e| {
            matches!(
                e.surface_op,
                Some(sessionlog::event::SurfaceOp::Replace { .. })
            )
        })
        .collect();
    assert_eq!(replaces.len(), 1);
    assert_eq!(
        replaces[0].source_event_seqs.as_deref(),
        Some(&[19, 20, 4][..])
    );
}

#[test]
fn import_then_export_reproduces_the_rows() {
    let Some(dir) = fixture_dir() else { return };
    let public = dir.join("public.db");
    let rows = manifest(&dir);
    let tmp = tempfile::tempdir().unwrap();
    let store = open_store(&tmp.path().join("store"));
    let report = import_db(&store, &public, false).unwrap();
    assert_eq!(report.sessions.len(), rows.len());
    let read = read_db(&public).unwrap();
    for ((r, m), s) in report.sessions.iter().zip(&rows).zip(&read) {
        assert_eq!(r.id, m.id);
        assert_eq!(r.events as usize, m.events);
        assert!(!r.replaced);
        assert_eq!(r.closers == 0, m.last_turn_closed, "{}", m.id);
        assert_eq!(r.closers as usize, s.closers.len());
        let (header, events) = store.load(&m.id).unwrap();
        assert_eq!(header, s.header);
        assert_eq!(events.len(), m.events + s.closers.len());
        assert_eq!(&events[..m.events], &s.events[..], "{}", m.id);
        assert_eq!(&events[m.events..], &s.closers[..], "{}", m.id);
    }
    assert!(
        rows.iter().any(|m| !m.last_turn_closed),
        "an open last turn"
    );

    let out = tmp.path().join("out.db");
    let ids: Vec<String> = rows.iter().map(|m| m.id.clone()).collect();
    export_db(&store, &ids, &out).unwrap();

    // The same schema, text for text, in WAL mode, version 4.
    assert_eq!(schema_sql(&out), schema_sql(&public));
    let conn = Connection::open(&out).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 4);
    drop(conn);

    assert_eq!(session_rows(&out), session_rows(&public));
    let (before, after) = (event_rows(&public), event_rows(&out));
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (m, s) in rows.iter().zip(&read) {
        let (b, a) = (&before[&m.id], &after[&m.id]);
        assert_eq!(b.len(), m.events);
        // The original seqs come back byte for byte: data is stored
        // verbatim, and sourceEventSeqs/surfaceOp are written in the
        // harness's compact form.
        assert_eq!(&a[..b.len()], &b[..], "rows of {}", m.id);
        // The extra rows are exactly the repair closers.
        let extra = &a[b.len()..];
        assert_eq!(extra.len(), s.closers.len(), "extra rows of {}", m.id);
        for (row, closer) in extra.iter().zip(&s.closers) {
            assert_eq!(row.1 as u64, closer.seq);
            assert_eq!(row.2, closer.kind);
            assert_eq!(row.3, closer.time);
            assert_eq!(row.4, closer.data.get());
        }
        if let Some(last) = extra.last() {
            assert_eq!(last.2, "turn/end");
            let data: serde_json::Value = serde_json::from_str(&last.4).unwrap();
            assert_eq!(data["reason"]["kind"], "interrupted");
        }
    }

    // Reading the export gives the store's sessions.
    let again = read_db(&out).unwrap();
    assert_eq!(again.len(), read.len());
    for s in &again {
        let (header, events) = store.load(&s.header.id).unwrap();
        assert_eq!(s.header, header);
        assert_eq!(s.events, events);
        assert!(
            s.closers.is_empty(),
            "{} is balanced after repair",
            s.header.id
        );
    }

    // Exporting again into the same file: every id is already there.
    let err = export_db(&store, &ids[..1], &out).unwrap_err();
    assert!(
        matches!(&err, SqliteError::ExistsInDb { session, .. } if *session == ids[0]),
        "{err}"
    );
    assert!(err.to_string().contains(&format!("{:?}", ids[0])), "{err}");
    assert_eq!(event_rows(&out), after);

    // Importing again without replace is refused before anything changes;
    // with replace the sessions are replaced.
    let err = import_db(&store, &public, false).unwrap_err();
    assert!(
        matches!(&err, SqliteError::ExistsInStore { session, .. } if *session == ids[0]),
        "{err}"
    );
    let report = import_db(&store, &public, true).unwrap();
    assert!(report.sessions.iter().all(|s| s.replaced));
    for (r, s) in report.sessions.iter().zip(&read) {
        assert_eq!(r.closers as usize, s.closers.len(), "{}", r.id);
    }
}

/// A schema 4 database at `path` with the given rows:
/// `(session id, [(seq, type, data, source_event_seqs, surface_op)])`.
type Row<'a> = (i64, &'a str, &'a str, Option<&'a str>, Option<&'a str>);

fn make_db(path: &Path, ddl: &str, user_version: i64, sessions: &[(&str, &[Row<'_>])]) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(ddl).unwrap();
    conn.execute_batch(&format!("PRAGMA user_version = {user_version}"))
        .unwrap();
    for (id, events) in sessions {
        conn.execute(
            "INSERT INTO sessions (id, version, created_at, cwd) VALUES (?1, 0, 1000, '/w')",
            [id],
        )
        .unwrap();
        for (seq, kind, data, src, op) in events.iter() {
            conn.execute(
                "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op) VALUES (?1, ?2, ?3, 1000, ?4, ?5, ?6)",
                rusqlite::params![id, seq, kind, data, src, op],
            )
            .unwrap();
        }
    }
}

const GOOD: &[Row<'static>] = &[
    (0, "turn/start", r#"{"turn":1}"#, None, None),
    (
        1,
        "user/message",
        r#"{"role":"user","content":[{"type":"text","text":"hi"}]}"#,
        None,
        Some(r#""append""#),
    ),
    (
        2,
        "turn/end",
        r#"{"turn":1,"reason":{"kind":"completed"}}"#,
        None,
        None,
    ),
];

#[test]
fn user_version_5_is_unsupported() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("v5.db");
    make_db(&db, DDL, 5, &[("s", GOOD)]);
    let err = read_db(&db).unwrap_err();
    assert!(
        matches!(err, SqliteError::UnsupportedSchema { found: 5, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("version 5"), "{msg}");
    assert!(msg.contains("schema versions 4 and 17"), "{msg}");
    assert!(msg.contains("never migrates"), "{msg}");
    assert!(msg.contains("v5.db"), "{msg}");
    // Import refuses too, and export will not add to it.
    let store = open_store(&tmp.path().join("store"));
    assert!(matches!(
        import_db(&store, &db, false),
        Err(SqliteError::UnsupportedSchema { found: 5, .. })
    ));
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn the_doc_ddl_with_its_line_breaks_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("ok.db");
    make_db(&db, DDL, 4, &[("s", GOOD)]);
    let sessions = read_db(&db).unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].header.cwd.as_deref(), Some("/w"));
    assert_eq!(sessions[0].header.created_at, 1000);
    assert_eq!(
        sessions[0].events[1].to_json(),
        r#"{"type":"user/message","seq":1,"time":1000,"data":{"role":"user","content":[{"type":"text","text":"hi"}]},"surfaceOp":"append"}"#
    );
}

#[test]
fn a_missing_column_is_a_schema_mismatch_naming_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("nocol.db");
    let ddl = DDL.replace(", surface_op TEXT", "");
    make_db(&db, &ddl, 4, &[]);
    let err = read_db(&db).unwrap_err();
    match &err {
        SqliteError::SchemaMismatch { table, detail, .. } => {
            assert_eq!(table, "events");
            assert!(detail.contains("surface_op"), "{detail}");
        }
        other => panic!("expected SchemaMismatch, got {other}"),
    }
    assert!(err.to_string().contains("\"events\""), "{err}");

    let db = tmp.path().join("nocol2.db");
    make_db(&db, &DDL.replace(", seed_length INTEGER", ""), 4, &[]);
    assert!(matches!(
        read_db(&db),
        Err(SqliteError::SchemaMismatch { ref table, .. }) if table == "sessions"
    ));

    // Same columns, but not STRICT: the types are not enforced.
    let db = tmp.path().join("lax.db");
    make_db(&db, &DDL.replace(") STRICT;", ");"), 4, &[]);
    assert!(matches!(
        read_db(&db),
        Err(SqliteError::SchemaMismatch { ref detail, .. }) if detail.contains("STRICT")
    ));

    // A nullable data column.
    let db = tmp.path().join("nullable.db");
    make_db(&db, &DDL.replace("data TEXT NOT NULL", "data TEXT"), 4, &[]);
    assert!(matches!(
        read_db(&db),
        Err(SqliteError::SchemaMismatch { ref table, .. }) if table == "events"
    ));

    // A missing table, and export refusing to add to a mismatched db.
    let db = tmp.path().join("notable.db");
    make_db(
        &db,
        &DDL[..DDL.find("CREATE TABLE events").unwrap()],
        4,
        &[],
    );
    assert!(matches!(
        read_db(&db),
        Err(SqliteError::SchemaMismatch { ref table, .. }) if table == "events"
    ));
    let store = open_store(&tmp.path().join("store"));
    store.create(SessionHeader::new("x", 1)).unwrap();
    let events = good_events();
    store.append("x", &events).unwrap();
    assert!(matches!(
        export_db(&store, &["x".to_owned()], &db),
        Err(SqliteError::SchemaMismatch { ref table, .. }) if table == "events"
    ));
}

fn envelope(r: &Row<'_>) -> OwnedEvent {
    let mut line = format!(
        r#"{{"type":"{}","seq":{},"time":1000,"data":{}"#,
        r.1, r.0, r.2
    );
    if let Some(s) = r.3 {
        line.push_str(&format!(r#","sourceEventSeqs":{s}"#));
    }
    if let Some(o) = r.4 {
        line.push_str(&format!(r#","surfaceOp":{o}"#));
    }
    line.push('}');
    Event::from_json(&line).unwrap().into_owned()
}

/// The events of the rows `GOOD`.
fn good_events() -> Vec<OwnedEvent> {
    GOOD.iter().map(envelope).collect()
}

/// A store holding session "keep", and its content.
fn store_with_keep(dir: &Path) -> (Store, Vec<OwnedEvent>) {
    let store = open_store(dir);
    store.create(SessionHeader::new("keep", 5)).unwrap();
    let events = good_events();
    store.append("keep", &events).unwrap();
    (store, events)
}

fn assert_store_is(store: &Store, keep: &[OwnedEvent]) {
    let ids: Vec<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
    assert_eq!(ids, ["keep"]);
    let (header, events) = store.load("keep").unwrap();
    assert_eq!(header, SessionHeader::new("keep", 5));
    assert_eq!(events, keep);
}

#[test]
fn an_invalid_event_names_session_and_seq_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("bad.db");
    let bad: &[Row<'_>] = &[
        GOOD[0],
        GOOD[1],
        GOOD[2],
        (3, "turn/start", r#"{"turn":2}"#, None, Some(r#""append""#)),
    ];
    // The good session comes first: it must not be imported either.
    make_db(&db, DDL, 4, &[("good", GOOD), ("bad", bad)]);
    let err = read_db(&db).unwrap_err();
    match &err {
        SqliteError::Invalid {
            session,
            seq,
            violation,
            ..
        } => {
            assert_eq!(session, "bad");
            assert_eq!(*seq, Some(3));
            assert_eq!(violation.rule, Rule::Eligibility);
            assert_eq!(violation.seq(), Some(3));
        }
        other => panic!("expected Invalid, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("\"bad\"") && msg.contains("seq 3"), "{msg}");

    let (store, keep) = store_with_keep(&tmp.path().join("store"));
    let err = import_db(&store, &db, false).unwrap_err();
    assert!(
        matches!(&err, SqliteError::Invalid { session, seq: Some(3), .. } if session == "bad"),
        "{err}"
    );
    assert_store_is(&store, &keep);
    // replace does not change that: validation comes first.
    assert!(import_db(&store, &db, true).is_err());
    assert_store_is(&store, &keep);
    // Nor does reopening.
    drop(store);
    let store = open_store(&tmp.path().join("store"));
    assert_store_is(&store, &keep);
}

#[test]
fn columns_cannot_smuggle_envelope_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("smuggle.db");
    let rows: &[Row<'_>] = &[(0, "x/y", r#"{},"ignorable":true"#, None, None)];
    make_db(&db, DDL, 4, &[("s", rows)]);
    assert!(matches!(
        read_db(&db),
        Err(SqliteError::Invalid { seq: Some(0), ref violation, .. }) if violation.rule == Rule::Json
    ));
    let db = tmp.path().join("gap.db");
    let rows: &[Row<'_>] = &[GOOD[0], (2, "x/y", "{}", None, None)];
    make_db(&db, DDL, 4, &[("s", rows)]);
    assert!(matches!(
        read_db(&db),
        Err(SqliteError::Invalid { seq: Some(2), ref violation, .. }) if violation.rule == Rule::Contiguity
    ));
}

#[test]
fn a_failed_append_leaves_no_half_imported_session() {
    // Valid for the non-strict model, but a strict store rejects a step
    // outside a turn: the import must take the session back out.
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("loose.db");
    let rows: &[Row<'_>] = &[
        GOOD[0],
        GOOD[1],
        GOOD[2],
        (3, "step/start", r#"{"turn":2,"step":1}"#, None, None),
    ];
    make_db(&db, DDL, 4, &[("loose", rows)]);
    assert_eq!(read_db(&db).unwrap()[0].events.len(), 4);
    let store_dir = tmp.path().join("store");
    {
        let (store, _) = store_with_keep(&store_dir);
        store.close().unwrap();
    }
    let keep = good_events();
    let store = Store::open(
        &store_dir,
        Options {
            strict: true,
            ..Options::default()
        },
    )
    .unwrap();
    let err = import_db(&store, &db, false).unwrap_err();
    assert!(
        matches!(&err, SqliteError::Store { session, .. } if session == "loose"),
        "{err}"
    );
    assert_store_is(&store, &keep);
    assert!(store.load("loose").is_err());
}

#[test]
fn export_refuses_ignorable_events_and_creates_nothing_for_them() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open_store(&tmp.path().join("store"));
    store.create(SessionHeader::new("ig", 1)).unwrap();
    let e = Event::from_json(r#"{"type":"plugin/x","seq":0,"time":1,"data":{},"ignorable":true}"#)
        .unwrap();
    store.append("ig", &[e]).unwrap();
    let out = tmp.path().join("ig.db");
    let err = export_db(&store, &["ig".to_owned()], &out).unwrap_err();
    assert!(
        matches!(&err, SqliteError::Unrepresentable { session, seq: Some(0), .. } if session == "ig"),
        "{err}"
    );
    // The export is atomic: nothing at the path, no temporary file left.
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

/// Header fields schema 4 has no column for are refused as `ignorable` is,
/// naming the session and each field: never dropped without a word.
#[test]
fn export_refuses_header_fields_schema_4_has_no_column_for() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open_store(&tmp.path().join("store"));
    let mut header = SessionHeader::new("child", 5);
    header.cwd = Some("/w".into());
    header.parent_session = Some("p".into());
    header.origin = Some("subagent".into());
    header.delegation_depth = 1;
    header.agent_preset = Some("minimal".into());
    store.create(header).unwrap();
    store.append("child", &good_events()).unwrap();
    // A header the columns hold whole exports.
    store.create(SessionHeader::new("keep", 5)).unwrap();
    store.append("keep", &good_events()).unwrap();
    let out = tmp.path().join("child.db");
    let err = export_db(&store, &["keep".to_owned(), "child".to_owned()], &out).unwrap_err();
    let SqliteError::Unrepresentable {
        session,
        seq: None,
        reason,
        ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(session, "child");
    assert!(
        reason.contains(r#"origin "subagent", delegationDepth 1, agentPreset "minimal""#)
            && reason.contains("no column"),
        "{err}"
    );
    // Atomic: nothing at the path, no temporary file left.
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    // One field alone is named alone.
    let mut header = SessionHeader::new("deep", 5);
    header.delegation_depth = 2;
    store.create(header).unwrap();
    store.append("deep", &good_events()).unwrap();
    let err = export_db(&store, &["deep".to_owned()], &out).unwrap_err();
    assert!(
        err.to_string()
            .contains("the header has delegationDepth 2, and"),
        "{err}"
    );
    export_db(&store, &["keep".to_owned()], &out).unwrap();
}
