//! Conformance with real harness logs: for every file in
//! `../shared/fixtures/harness-jsonl/`, the CLI's `check`, `cat`, `surface`,
//! `derive` and `repair --dry-run` agree, as JSON values, with
//! `../shared/fixtures/expected/`, and the manifest's `fail:<rule>@<seq>`
//! files are rejected with that rule and seq.
//!
//! The fixtures live outside the repository. When they are absent the test
//! says so loudly and skips; set `SESSIONLOG_REQUIRE_FIXTURES=1` (CI does) to
//! make their absence a failure.

use serde_json::Value;
use sessionlog::json::value_eq;
use std::path::Path;
use std::process::Command;

mod common;

/// Runs the CLI; returns (exit code, stdout).
fn cli(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sessionlog"))
        .args(args)
        .output()
        .expect("run sessionlog");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).expect("UTF-8 output"),
    )
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// Headers are compared after sessionlog's normalisation: a missing
/// `version` or `delegationDepth` reads as 0.
fn normalise_header(v: &mut Value) {
    if let Some(h) = v.as_object_mut() {
        h.entry("version").or_insert(Value::from(0));
        h.entry("delegationDepth").or_insert(Value::from(0));
    }
}

fn assert_json_eq(what: &str, got: &[Value], expected: &[Value]) -> Result<(), String> {
    if got.len() != expected.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            expected.len()
        ));
    }
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        if !value_eq(g, e) {
            return Err(format!(
                "{what}: value {i} differs:\n  got      {g}\n  expected {e}"
            ));
        }
    }
    Ok(())
}

struct ManifestRow {
    file: String,
    check: String,
}

fn manifest(dir: &Path) -> Vec<ManifestRow> {
    let text = std::fs::read_to_string(dir.join("harness-jsonl/MANIFEST.tsv")).expect("manifest");
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().expect("manifest header").split('\t').collect();
    let col = |name: &str| {
        head.iter()
            .position(|h| *h == name)
            .expect("manifest column")
    };
    let (file, check) = (col("filename"), col("check"));
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let cells: Vec<&str> = l.split('\t').collect();
            ManifestRow {
                file: cells[file].to_owned(),
                check: cells[check].to_owned(),
            }
        })
        .collect()
}

fn conform(dir: &Path, row: &ManifestRow) -> Result<(), String> {
    let path = dir.join("harness-jsonl").join(&row.file);
    let path = path.to_str().expect("UTF-8 path");
    let stem = row.file.strip_suffix(".jsonl").expect(".jsonl file");
    let expected = |ext: &str| {
        std::fs::read_to_string(dir.join("expected").join(format!("{stem}.{ext}")))
            .unwrap_or_else(|e| panic!("expected/{stem}.{ext}: {e}"))
    };

    let (code, out) = cli(&["check", path]);
    let want = expected("check.txt");
    if out.trim() != want.trim() {
        return Err(format!(
            "check printed {:?}, expected {:?}",
            out.trim(),
            want.trim()
        ));
    }
    if let Some(rule_at) = row.check.strip_prefix("fail:") {
        let (rule, seq) = rule_at.split_once('@').expect("fail:<rule>@<seq>");
        if code != 1 || !out.contains(&format!("seq={seq} [{rule}]")) {
            return Err(format!(
                "expected exit 1 naming [{rule}] at seq={seq}, got {code}: {out}"
            ));
        }
        return Ok(());
    }
    if code != 0 {
        return Err(format!("check exited {code}"));
    }

    let mut events = json_lines(&cli(&["cat", path]).1);
    let mut want = json_lines(&expected("events.jsonl"));
    normalise_header(&mut want[0]);
    normalise_header(&mut events[0]);
    assert_json_eq("cat", &events, &want)?;

    let surface: Value =
        serde_json::from_str(&cli(&["surface", path]).1).map_err(|e| e.to_string())?;
    let want: Value = serde_json::from_str(&expected("surface.json")).map_err(|e| e.to_string())?;
    for key in ["nodes", "replacements"] {
        if !value_eq(&surface[key], &want[key]) {
            return Err(format!(
                "surface {key}: got {}, expected {}",
                surface[key], want[key]
            ));
        }
    }
    let generation = surface["replaceGeneration"]
        .as_u64()
        .ok_or("replaceGeneration missing")?;
    if generation
        != want["replacements"]
            .as_array()
            .map_or(0, |r| r.len() as u64)
    {
        return Err(format!(
            "replaceGeneration {generation} != number of replacements"
        ));
    }

    assert_json_eq(
        "derive",
        &json_lines(&cli(&["derive", path]).1),
        &json_lines(&expected("derive.jsonl")),
    )?;
    assert_json_eq(
        "repair",
        &json_lines(&cli(&["repair", "--dry-run", path]).1),
        &json_lines(&expected("repair.jsonl")),
    )
}

#[test]
fn every_fixture_agrees_with_expected_outputs() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let rows = manifest(&dir);
    assert!(
        rows.len() >= 100,
        "manifest lists only {} files",
        rows.len()
    );
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|row| {
            conform(&dir, row)
                .err()
                .map(|e| format!("{}: {e}", row.file))
        })
        .collect();
    println!(
        "conformance: {} fixtures checked, {} failed",
        rows.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cli_usage_and_input_errors_have_distinct_exit_codes() {
    let (code, _) = cli(&["check"]);
    assert_eq!(code, 2, "missing FILE is a usage error");
    let (code, _) = cli(&["repair", "/nonexistent"]);
    assert_eq!(
        code, 2,
        "repair without --dry-run in file mode is a usage error"
    );
    let (code, _) = cli(&["cat", "/nonexistent/session.jsonl"]);
    assert_eq!(code, 3, "an unreadable file is an I/O error");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"type\":\"session\",\"id\":\"s\",\"createdAt\":0}\n{\"type\":\"turn/start\",\"seq\":0,\"time\":0,\"data\":{},\"surfaceOp\":\"append\"}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sessionlog"))
        .args(["derive", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("bad.jsonl") && err.contains("seq=0") && err.contains("[eligibility]"),
        "error must name file, seq and rule: {err}"
    );
    let (code, out) = cli(&["check", bad.to_str().unwrap()]);
    assert_eq!(
        (code, out.trim()),
        (
            1,
            "FAIL seq=0 [eligibility] turn/start is not surface-eligible and must not carry surfaceOp"
        )
    );
}
