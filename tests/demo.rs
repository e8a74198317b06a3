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

/// The demo must never delete a store it did not make: a store created by
/// `import` (9 sessions in the report that found this) stays whole, and so
/// does a demo store a user imported a session of their own into.
#[test]
fn the_demo_never_replaces_a_store_it_did_not_make() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_sessionlog");
    let jsonl = tmp.path().join("mine.jsonl");
    std::fs::write(
        &jsonl,
        concat!(
            r#"{"type":"session","id":"mine","createdAt":0}"#,
            "\n",
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            "\n",
            r#"{"type":"turn/end","seq":1,"time":2,"data":{"turn":1}}"#,
            "\n"
        ),
    )
    .unwrap();
    let import = |store: &std::path::Path| {
        let out = Command::new(bin)
            .args(["--store", store.to_str().unwrap(), "import"])
            .arg(&jsonl)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let listed = |store: &std::path::Path| {
        let out = Command::new(bin)
            .args(["--store", store.to_str().unwrap(), "ls"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    // A real store.
    let real = tmp.path().join("real");
    import(&real);
    let refused = Command::new(bin).arg("demo").arg(&real).output().unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("never deletes"), "{stderr}");
    assert!(listed(&real).contains("mine"), "the real store is intact");

    // A demo store a user then imported into.
    let demo = tmp.path().join("demo");
    let made = Command::new(bin).arg("demo").arg(&demo).output().unwrap();
    assert!(made.status.success());
    import(&demo);
    let refused = Command::new(bin).arg("demo").arg(&demo).output().unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("\"mine\""),
        "names the foreign session: {stderr}"
    );
    assert!(listed(&demo).contains("mine"));

    // A file given as the directory.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"keep").unwrap();
    let refused = Command::new(bin).arg("demo").arg(&file).output().unwrap();
    assert!(!refused.status.success());
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}
