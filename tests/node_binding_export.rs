//! Sessions the Node binding (`bindings/node`) wrote, exported: the binding
//! stores each harness event whole, as the `data` of an ignorable store
//! event of type `harness/event` (`bindings/node/src/backend.rs`). An export
//! must write the harness's events back, not those wrappers: the harness
//! skips an ignorable event of a type it does not know, so a log of
//! wrappers loads as a session with no turns and no messages.

use sessionlog::adapters::harness::{ExportOptions, export_session, read_zstd_session};
use sessionlog::adapters::jsonl::read_session;
use sessionlog::event::{Data, Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use std::borrow::Cow;

/// Harness events as `JSON.stringify` writes them: a lone surrogate as an
/// escape, a run of chunks (packed on export), a message on the surface.
const EVENTS: [&str; 7] = [
    r#"{"type":"turn/start","seq":0,"time":10,"data":{"turn":1,"note":"a\ud800b"}}"#,
    r#"{"type":"user/message","seq":1,"time":11,"data":{"role":"user","content":[{"type":"text","text":"hi \udfff"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
    r#"{"type":"step/start","seq":2,"time":12,"data":{"turn":1,"step":1}}"#,
    r#"{"type":"assistant/chunk","seq":3,"time":13,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"He"}}}"#,
    r#"{"type":"assistant/chunk","seq":4,"time":14,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"ll"}}}"#,
    r#"{"type":"assistant/chunk","seq":5,"time":15,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"o"}}}"#,
    r#"{"type":"assistant/message","seq":6,"time":16,"data":{"turn":1,"step":1,"message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"Hello"}],"source":{"kind":"model"}}},"sourceEventSeqs":[3,4,5],"surfaceOp":"append"}"#,
];

/// The store holding session `n`, written as the binding writes a first
/// batch (`Shared::append_batch`, `parse_events`).
fn store_written_by_the_binding(dir: &std::path::Path) -> Store {
    let store = Store::open(
        dir,
        Options {
            close_interrupted_turns: false,
            ..Options::default()
        },
    )
    .unwrap();
    let raws: Vec<Box<serde_json::value::RawValue>> = EVENTS
        .iter()
        .map(|t| serde_json::value::RawValue::from_string((*t).to_owned()).unwrap())
        .collect();
    let wrapped: Vec<Event<'_>> = raws
        .iter()
        .zip(EVENTS.iter().map(|t| Event::from_json(t).unwrap()))
        .map(|(raw, e)| Event {
            kind: Cow::Borrowed("harness/event"),
            seq: e.seq,
            time: e.time,
            data: Data::new(raw).unwrap(),
            source_event_seqs: None,
            surface_op: None,
            ignorable: true,
        })
        .collect();
    let mut header = SessionHeader::new("n", 1000);
    header.cwd = Some("/w".into());
    store.import(header, &wrapped, false).unwrap();
    store
}

fn originals() -> Vec<OwnedEvent> {
    EVENTS
        .iter()
        .map(|t| Event::from_json(t).unwrap().into_owned())
        .collect()
}

#[test]
fn an_export_writes_the_harness_events_the_node_binding_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_written_by_the_binding(dir.path());

    // Plain JSONL: every event line is the harness's own text.
    let mut plain = Vec::new();
    export_session(&store, "n", &mut plain, ExportOptions::default()).unwrap();
    let text = String::from_utf8(plain.clone()).unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines, EVENTS, "plain export");
    assert_eq!(read_session(&plain, false).unwrap().events, originals());

    // The harness root's form: packed rows in Zstandard frames.
    let opts = ExportOptions {
        pack_chunks: true,
        zstd: true,
    };
    let mut zst = Vec::new();
    let report = export_session(&store, "n", &mut zst, opts).unwrap();
    assert_eq!(report.events, EVENTS.len() as u64);
    assert_eq!(report.stats.packed_rows, 1, "the chunk run is packed");
    let jsonl = read_zstd_session(&zst).unwrap();
    assert_eq!(
        read_session(&jsonl.text, false).unwrap().events,
        originals()
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn a_database_export_writes_the_harness_events_the_node_binding_stored() {
    use sessionlog::adapters::{sqlite, sqlite_export, sqlite17};
    let dir = tempfile::tempdir().unwrap();
    let store = store_written_by_the_binding(&dir.path().join("store"));
    for version in [sqlite17::SCHEMA_VERSION, sqlite::SCHEMA_VERSION] {
        let db = dir.path().join(format!("out-{version}.db"));
        sqlite_export::export_db(&store, &["n".to_owned()], &db, version).unwrap();
        let read = sqlite::read_db(&db).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].events, originals(), "schema {version}");
    }
}
