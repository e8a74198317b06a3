//! Store-mode `import` and `export` through the CLI: harness roots, zstd,
//! packed rows, SQLite, `--replace`, `--no-repair`, `--json`.

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
