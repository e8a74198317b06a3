//! Import progress (issue 16): the library reports progress that moves
//! within one input (bytes of a session file's text, sessions and events of
//! a database) at a bounded rate. (`import --progress` is tested in
//! `cli_transfer.rs`.)
//!
//! The fixture test reads `../shared/fixtures/` (or `$SESSIONLOG_FIXTURES`);
//! when absent it says SKIPPED, unless `SESSIONLOG_REQUIRE_FIXTURES` is set.

mod common;

use sessionlog::adapters::harness::{
    self, ImportOptions, import_file_with_progress, turn_batches, write_zstd_session,
};
use sessionlog::adapters::sqlite::{self, import_db_with_progress};
use sessionlog::adapters::{Progress, REPORT_BYTES, REPORT_EVENTS, Stage, jsonl, sqlite_export};
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::store::{Options, Store};
use std::path::Path;

/// A session of `turns` sample turns (about 11 KiB each).
fn sample(id: &str, turns: usize) -> (SessionHeader, Vec<OwnedEvent>) {
    Sample::new(SampleConfig {
        turns,
        ..SampleConfig::default()
    })
    .session(id)
}

/// A plain JSONL file of a session of several MB.
fn big_file(dir: &Path) -> (std::path::PathBuf, u64) {
    let (header, events) = sample("big", 400);
    let mut buf = Vec::new();
    jsonl::write_session(&mut buf, &header, &events).unwrap();
    assert!(buf.len() > 3 << 20, "{} bytes", buf.len());
    let path = dir.join("big.jsonl");
    std::fs::write(&path, &buf).unwrap();
    (path, events.len() as u64)
}

fn store(dir: &Path) -> Store {
    Store::open(dir, Options::default()).unwrap()
}

/// The reports of one import, checked for what every import must show:
/// counts that only grow within a stage, reading before storing, and a
/// last report with every session stored.
fn check_stages(seen: &[Progress]) -> (Vec<Progress>, Vec<Progress>) {
    let reading: Vec<Progress> = seen
        .iter()
        .copied()
        .filter(|p| p.stage == Stage::Reading)
        .collect();
    let storing: Vec<Progress> = seen
        .iter()
        .copied()
        .filter(|p| p.stage == Stage::Storing)
        .collect();
    assert!(!reading.is_empty() && !storing.is_empty(), "{seen:?}");
    assert_eq!(
        seen.iter().position(|p| p.stage == Stage::Storing),
        Some(reading.len()),
        "reading comes first: {seen:?}"
    );
    for stage in [&reading, &storing] {
        assert!(
            stage.windows(2).all(|w| w[0].bytes <= w[1].bytes
                && w[0].events <= w[1].events
                && w[0].sessions <= w[1].sessions),
            "counts only grow within a stage: {stage:?}"
        );
    }
    let last = seen.last().unwrap();
    assert_eq!(last.sessions, last.total_sessions, "{last:?}");
    (reading, storing)
}

#[test]
fn a_multi_mb_jsonl_file_reports_its_bytes_as_they_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (path, events) = big_file(tmp.path());
    let size = std::fs::metadata(&path).unwrap().len();
    let st = store(&tmp.path().join("store"));
    let mut seen = Vec::new();
    let report =
        import_file_with_progress(&st, &path, ImportOptions::default(), &mut |p| seen.push(p))
            .unwrap();
    assert_eq!(report.events, events);

    let (reading, storing) = check_stages(&seen);
    assert!(
        reading
            .iter()
            .all(|p| p.total_bytes == size && p.total_sessions == 1)
    );
    // Several values within the file before its end, not just 0 and all.
    let within: Vec<u64> = reading
        .iter()
        .map(|p| p.bytes)
        .filter(|&b| b > 0 && b < size)
        .collect();
    assert!(within.len() >= 10, "{within:?}");
    assert!(within.windows(2).all(|w| w[0] < w[1]), "{within:?}");
    let last_read = reading.last().unwrap();
    assert_eq!((last_read.bytes, last_read.events), (size, events));
    // At a bounded rate: about one report per REPORT_BYTES.
    assert!(
        seen.len() as u64 <= size / REPORT_BYTES + 5,
        "{} reports for {size} bytes",
        seen.len()
    );
    let last = storing.last().unwrap();
    assert_eq!((last.sessions, last.events), (1, events));
}

#[test]
fn a_zstd_log_reports_the_bytes_of_its_decoded_text() {
    let tmp = tempfile::tempdir().unwrap();
    let (header, events) = sample("z", 200);
    let mut z = Vec::new();
    write_zstd_session(&mut z, &header, &events, &turn_batches(&events)).unwrap();
    let path = tmp.path().join("z.jsonl.zstd");
    std::fs::write(&path, &z).unwrap();
    let st = store(&tmp.path().join("store"));
    let mut seen = Vec::new();
    harness::import_file_with_progress(&st, &path, ImportOptions::default(), &mut |p| seen.push(p))
        .unwrap();
    let (reading, _) = check_stages(&seen);
    let text = harness::read_zstd_session(&z).unwrap().text.len() as u64;
    assert!(reading.iter().all(|p| p.total_bytes == text), "{reading:?}");
    assert!(
        reading
            .iter()
            .filter(|p| p.bytes > 0 && p.bytes < text)
            .count()
            >= 5
    );
    let last = reading.last().unwrap();
    assert_eq!((last.bytes, last.events), (text, events.len() as u64));
}

/// Imports `db` with progress and checks the reports against its sessions:
/// each session read, then each stored, events counted as they go.
fn check_db_progress(db: &Path, store_dir: &Path) {
    let sessions = sqlite::read_db(db).unwrap();
    let n = sessions.len() as u64;
    let events: Vec<u64> = sessions.iter().map(|s| s.events.len() as u64).collect();
    let total: u64 = events.iter().sum();
    assert!(n >= 3, "{}: {n} sessions", db.display());
    let st = store(store_dir);
    let mut seen = Vec::new();
    let report = import_db_with_progress(&st, db, false, &mut |p| seen.push(p)).unwrap();
    assert_eq!(report.sessions.len() as u64, n);

    let (reading, storing) = check_stages(&seen);
    assert!(reading.iter().all(|p| p.total_bytes == 0 && p.bytes == 0));
    assert!(reading.iter().all(|p| p.total_sessions == n), "{reading:?}");
    // Every session read is reported with the events read so far.
    let mut sum = 0;
    for (k, e) in events.iter().enumerate() {
        sum += e;
        assert!(
            reading
                .iter()
                .any(|p| p.sessions == k as u64 + 1 && p.events == sum),
            "session {k} read: {reading:?}"
        );
    }
    let last = reading.last().unwrap();
    assert_eq!((last.sessions, last.events), (n, total));
    // Between session reports, one per REPORT_EVENTS at most.
    assert!(reading.len() as u64 <= 2 + n + total / REPORT_EVENTS + 1);
    // Then each session stored, one report each (after the one at 0).
    assert_eq!(storing.len() as u64, n + 1, "{storing:?}");
    let mut sum = 0;
    for (k, p) in storing.iter().skip(1).enumerate() {
        sum += events[k];
        assert_eq!((p.sessions, p.events), (k as u64 + 1, sum), "{p:?}");
    }
}

#[test]
fn a_database_reports_sessions_and_events_as_they_are_read_and_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let src = store(&tmp.path().join("src"));
    let mut ids = Vec::new();
    for (k, turns) in [3, 30, 1, 60, 10].into_iter().enumerate() {
        let id = format!("s{k}");
        let (header, events) = sample(&id, turns);
        src.import(header, &events, false).unwrap();
        ids.push(id);
    }
    for version in [
        sqlite::SCHEMA_VERSION,
        sessionlog::adapters::sqlite17::SCHEMA_VERSION,
    ] {
        let db = tmp.path().join(format!("all{version}.db"));
        sqlite_export::export_db(&src, &ids, &db, version).unwrap();
        check_db_progress(&db, &tmp.path().join(format!("to{version}")));
    }
}

#[test]
fn fixture_databases_report_each_session() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for (k, db) in ["harness-sqlite-v4/public.db", "harness-current/public17.db"]
        .into_iter()
        .enumerate()
    {
        check_db_progress(&dir.join(db), &tmp.path().join(format!("store{k}")));
    }
}

/// Records of 256 KiB: the store writes an import in batches of about
/// 64 KiB, so a session of a few MB takes dozens of them.
fn small_records() -> Options {
    Options {
        max_record: 256 << 10,
        ..Options::default()
    }
}

#[test]
fn the_store_reports_the_events_written_batch_by_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let st = Store::open(tmp.path().join("store"), small_records()).unwrap();
    let (header, events) = sample("s", 100);
    let events: Vec<_> = events.iter().map(OwnedEvent::borrowed).collect();
    let n = events.len() as u64;
    let mut seen = Vec::new();
    st.import_with_progress(header.clone(), &events, false, &mut |w| seen.push(w))
        .unwrap();
    // Several counts within the session, each larger than the last, the
    // last (the session published) every event, once.
    assert!(seen.len() >= 5, "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&n));
    assert!(seen[..seen.len() - 1].iter().all(|&w| 0 < w && w < n));
    assert_eq!(st.load("s").unwrap().1.len() as u64, n);

    // Replacing reports the same way.
    let mut again = Vec::new();
    st.import_with_progress(header.clone(), &events, true, &mut |w| again.push(w))
        .unwrap();
    assert_eq!(again, seen);
    // A failure never reports the whole session.
    let mut failed = Vec::new();
    assert!(
        st.import_with_progress(header, &events, false, &mut |w| failed.push(w))
            .is_err()
    );
    assert!(!failed.contains(&n), "{failed:?}");
    // No events: only "published", 0.
    let mut empty = Vec::new();
    st.import_with_progress(SessionHeader::new("e", 0), &[], false, &mut |w| {
        empty.push(w)
    })
    .unwrap();
    assert_eq!(empty, [0]);
}

#[test]
fn storing_one_big_file_reports_events_within_the_session() {
    let tmp = tempfile::tempdir().unwrap();
    let (path, events) = big_file(tmp.path());
    let st = Store::open(tmp.path().join("store"), small_records()).unwrap();
    let mut seen = Vec::new();
    import_file_with_progress(&st, &path, ImportOptions::default(), &mut |p| seen.push(p)).unwrap();
    let (_, storing) = check_stages(&seen);
    // Before the session is stored, the events stored so far move.
    let within: Vec<u64> = storing
        .iter()
        .filter(|p| p.sessions == 0)
        .map(|p| p.events)
        .filter(|&e| e > 0)
        .collect();
    assert!(within.len() >= 5, "{storing:?}");
    assert!(within.windows(2).all(|w| w[0] < w[1]), "{within:?}");
    assert!(within.iter().all(|&e| e < events), "{within:?}");
    // At a bounded rate: one per REPORT_EVENTS at most, besides the start
    // and the end.
    assert!(
        storing.len() as u64 <= 2 + events / REPORT_EVENTS,
        "{} reports for {events} events",
        storing.len()
    );
    let last = storing.last().unwrap();
    assert_eq!((last.sessions, last.events), (1, events));
}
