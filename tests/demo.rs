//! `sessionlog demo` runs end to end and leaves a store that verifies.

use std::process::Command;

#[test]
fn the_demo_runs_end_to_end_and_its_store_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo-store");
    let bin = env!("CARGO_BIN_EXE_sessionlog");
    let out = Command::new(bin).arg("demo").arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("recovery appended 3 closers to demo-crashed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\"kind\":\"interrupted\""),
        "the turn/end closer is shown: {stdout}"
    );
    assert!(
        stdout.contains("repairing again appends nothing"),
        "{stdout}"
    );
    assert!(stdout.contains("sealed segments hard-linked"), "{stdout}");
    assert!(dir.join("export/demo-crashed.jsonl").is_file());
    assert!(dir.join("export/sessions.db").is_file());

    let verify = Command::new(bin)
        .args(["--store", dir.to_str().unwrap(), "verify"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "{report}");
    assert_eq!(
        report.lines().filter(|l| l.starts_with("OK ")).count(),
        18,
        "{report}"
    );

    // Running it again replaces the old demo store.
    let again = Command::new(bin).arg("demo").arg(&dir).output().unwrap();
    assert!(again.status.success());
    // It refuses to clobber a directory that is not a store.
    let other = tmp.path().join("not-a-store");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("precious.txt"), b"keep me").unwrap();
    let refused = Command::new(bin).arg("demo").arg(&other).output().unwrap();
    assert!(!refused.status.success());
    assert!(other.join("precious.txt").is_file());
}
