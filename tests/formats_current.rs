//! The harness's current formats, on the real files its own code wrote
//! (`../shared/fixtures/harness-current/`): every session of the SQLite
//! schema 17 databases and of the zstd JSONL roots imports and equals the
//! expected logical log; each then round-trips value-exact through schema
//! 17, schema 4 and a current-layout root.

mod common;

use serde_json::Value;
use sessionlog::adapters::harness::{self, ExportOptions, ImportOptions};
use sessionlog::adapters::{sqlite, sqlite_export, sqlite17};
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct Row {
    id: String,
    source: String,
    store: String,
    events: usize,
    open: bool,
}

fn manifest(dir: &Path) -> Vec<Row> {
    let text = std::fs::read_to_string(dir.join("harness-current/MANIFEST.tsv")).unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
    let (id, src, status, store, events, open) = (
        col("session_id"),
        col("source_file"),
        col("status"),
        col("store"),
        col("events"),
        col("last_turn_open"),
    );
    lines
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|f| f[status].starts_with("written"))
        .map(|f| Row {
            id: f[id].to_owned(),
            source: f[src].to_owned(),
            store: f[store].to_owned(),
            events: f[events].parse().unwrap(),
            open: f[open] == "yes",
        })
        .collect()
}

/// The database and root a manifest row was written to.
fn locations(dir: &Path, store: &str) -> (PathBuf, PathBuf) {
    let base = dir.join("harness-current");
    if store == "main" {
        (base.join("public17.db"), base.join("public-root"))
    } else {
        (
            base.join(format!("{store}.db")),
            base.join(format!("{store}-root")),
        )
    }
}

fn open(dir: &Path) -> Store {
    Store::open(dir, Options::default()).unwrap()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The expected header after the fixes the fixtures' README lists.
fn fixed_header(mut h: Value) -> Value {
    let o = h.as_object_mut().unwrap();
    o.entry("version").or_insert(0.into());
    o.entry("delegationDepth").or_insert(0.into());
    if let Some(Value::String(cwd)) = o.get_mut("cwd")
        && !cwd.starts_with('/')
    {
        *cwd = format!("/{cwd}");
    }
    h
}

fn events_json(events: &[OwnedEvent]) -> Vec<Value> {
    events
        .iter()
        .map(|e| serde_json::from_str(&e.to_json()).unwrap())
        .collect()
}

fn header_json(h: &SessionHeader) -> Value {
    let mut buf = Vec::new();
    h.write_json(&mut buf);
    serde_json::from_slice(&buf).unwrap()
}

/// What the store must hold: the expected events, then the closers when
/// the last turn was open (import repairs it).
fn expected(dir: &Path, row: &Row) -> (Value, Vec<Value>) {
    let name = row.source.trim_end_matches(".jsonl");
    let text = std::fs::read_to_string(dir.join(format!("expected/{name}.events.jsonl"))).unwrap();
    let mut lines = json_lines(&text);
    let header = fixed_header(lines.remove(0));
    assert_eq!(lines.len(), row.events, "{name}");
    if row.open {
        let closers =
            std::fs::read_to_string(dir.join(format!("expected/{name}.repair.jsonl"))).unwrap();
        lines.extend(json_lines(&closers));
    }
    (header, lines)
}

fn assert_store_has(store: &Store, dir: &Path, row: &Row, what: &str) {
    let (header, events) = store.load(&row.id).unwrap();
    let (want_header, want_events) = expected(dir, row);
    assert_eq!(header_json(&header), want_header, "{what}: {}", row.source);
    assert_eq!(events_json(&events), want_events, "{what}: {}", row.source);
}

/// Groups the manifest rows by the store they were written to.
fn by_store(dir: &Path) -> BTreeMap<String, Vec<Row>> {
    let mut out: BTreeMap<String, Vec<Row>> = BTreeMap::new();
    for r in manifest(dir) {
        out.entry(r.store.clone()).or_default().push(r);
    }
    out
}

#[test]
fn every_current_format_session_imports_as_expected() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let groups = by_store(&dir);
    assert!(groups.len() > 40, "main plus the dups stores");
    let mut checked = 0;
    for (store_name, rows) in &groups {
        let (db, root) = locations(&dir, store_name);
        let tmp = tempfile::tempdir().unwrap();

        let from_db = open(&tmp.path().join("db"));
        let report = sqlite::import_db(&from_db, &db, false).unwrap();
        assert_eq!(report.sessions.len(), rows.len(), "{}", db.display());
        let from_root = open(&tmp.path().join("root"));
        for file in harness::find_sessions(&root).unwrap() {
            harness::import_file(&from_root, &file, ImportOptions::default()).unwrap();
        }
        for row in rows {
            assert_store_has(&from_db, &dir, row, "schema 17");
            assert_store_has(&from_root, &dir, row, "zstd root");
            checked += 1;
        }
    }
    assert_eq!(checked, 93);
}

/// Whether schema 4 has a column for everything in the header: it has none
/// for `origin`, `delegationDepth` and `agentPreset`.
fn fits_schema_4(h: &SessionHeader) -> bool {
    h.origin.is_none() && h.delegation_depth == 0 && h.agent_preset.is_none()
}

/// Exports every session of `a` to schema 17, schema 4 and a current-layout
/// root, imports each back into a fresh store, and checks that the headers
/// and events are equal. Schema 4 refuses, naming it, each session whose
/// header has a field it has no column for, and takes the others. Returns
/// the schema 17 file.
fn round_trip(a: &Store, work: &Path) -> PathBuf {
    let mut ids: Vec<String> = a.list().unwrap().into_iter().map(|h| h.id).collect();
    ids.sort();
    let original: Vec<_> = ids.iter().map(|id| a.load(id).unwrap()).collect();
    let db17 = work.join("out17.db");
    sqlite_export::export_db(a, &ids, &db17, sqlite17::SCHEMA_VERSION).unwrap();
    let db4 = work.join("out4.db");
    let (ids4, refused): (Vec<_>, Vec<_>) = ids
        .iter()
        .zip(&original)
        .partition(|(_, (h, _))| fits_schema_4(h));
    let ids4: Vec<String> = ids4.into_iter().map(|(id, _)| id.clone()).collect();
    for (id, _) in refused {
        let err =
            sqlite_export::export_db(a, std::slice::from_ref(id), &db4, sqlite::SCHEMA_VERSION)
                .unwrap_err();
        assert!(
            matches!(&err, sqlite::SqliteError::Unrepresentable { session, seq: None, .. } if session == id),
            "{err}"
        );
        assert!(!db4.exists(), "{err}");
    }
    sqlite_export::export_db(a, &ids4, &db4, sqlite::SCHEMA_VERSION).unwrap();
    let root = work.join("root");
    let opts = ExportOptions {
        pack_chunks: true,
        zstd: true,
    };
    for id in &ids {
        let p = harness::export_session_to_root(a, id, &root, opts).unwrap();
        assert!(p.ends_with("session.jsonl.zstd"));
        let project = p.parent().unwrap().parent().unwrap().file_name().unwrap();
        let project = project.to_string_lossy();
        assert!(
            project.starts_with("--") || project == "_no-cwd",
            "{}",
            p.display()
        );
    }
    let b17 = open(&work.join("b17"));
    sqlite::import_db(&b17, &db17, false).unwrap();
    let b4 = open(&work.join("b4"));
    sqlite::import_db(&b4, &db4, false).unwrap();
    let broot = open(&work.join("broot"));
    for f in harness::find_sessions(&root).unwrap() {
        harness::import_file(&broot, &f, ImportOptions::default()).unwrap();
    }
    for (id, (h, events)) in ids.iter().zip(&original) {
        for (name, s) in [("schema 17", &b17), ("root", &broot)] {
            let (h2, e2) = s.load(id).unwrap();
            assert_eq!(header_json(&h2), header_json(h), "{name}: {id}");
            assert_eq!(events_json(&e2), events_json(events), "{name}: {id}");
        }
        if !ids4.contains(id) {
            assert!(!b4.exists(id).unwrap(), "schema 4: {id}");
            continue;
        }
        let (h4, e4) = b4.load(id).unwrap();
        assert_eq!(h4, *h, "schema 4: {id}");
        assert_eq!(events_json(&e4), events_json(events), "schema 4: {id}");
    }
    db17
}

#[test]
fn current_format_sessions_round_trip_value_exact() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let mut sessions = 0;
    for store_name in by_store(&dir).keys() {
        let (db, _) = locations(&dir, store_name);
        let tmp = tempfile::tempdir().unwrap();
        let a = open(&tmp.path().join("a"));
        sqlite::import_db(&a, &db, false).unwrap();
        sessions += a.list().unwrap().len();
        let db17 = round_trip(&a, tmp.path());
        if store_name != "main" {
            continue;
        }
        // Our schema 17 file has what the harness's has: the physical layout.
        let count = |p: &Path, sql: &str| -> i64 {
            let c = rusqlite::Connection::open(p).unwrap();
            c.query_row(sql, [], |r| r.get(0)).unwrap()
        };
        for sql in [
            "SELECT COUNT(*) FROM events WHERE ignorable = 0",
            // The one open-turn session gained its closer on import.
            "SELECT COUNT(*) FROM events WHERE session_id <> '12121212-3434-4545-8686-787878787878'",
            "SELECT COUNT(*) FROM events WHERE typeof(data) = 'blob'",
            "SELECT COUNT(*) FROM sessions",
            "PRAGMA user_version",
            "PRAGMA application_id",
        ] {
            assert_eq!(count(&db17, sql), count(&db, sql), "{sql}");
        }
    }
    assert_eq!(sessions, 93);
}

/// The older plain JSONL fixtures (`harness-jsonl/`) that pass `check`
/// and have events round-trip through the current formats too.
#[test]
fn older_jsonl_fixtures_round_trip_through_the_current_formats() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("harness-jsonl"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    let mut done = 0;
    for file in files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let check = std::fs::read_to_string(dir.join(format!("expected/{name}.check.txt")))
            .unwrap_or_default();
        if !check.starts_with("OK") {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        // Schema 17 refuses a relative cwd (the harness cannot read it back):
        // give it the fix the current fixtures' writer gave, a leading `/`.
        let text = std::fs::read_to_string(&file).unwrap();
        let (head, rest) = text.split_once('\n').unwrap();
        let head = fixed_header(serde_json::from_str(head).unwrap());
        let fixed = tmp.path().join("fixed.jsonl");
        std::fs::write(&fixed, format!("{head}\n{rest}")).unwrap();
        let a = open(&tmp.path().join("a"));
        harness::import_file(&a, &fixed, ImportOptions::default()).unwrap();
        round_trip(&a, tmp.path());
        done += 1;
    }
    assert!(done > 60, "{done}");
}
