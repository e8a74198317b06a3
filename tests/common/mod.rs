//! The scripted workload shared by the fault-injection and crash-point
//! tests: two sessions, batches of several sizes, segment rollovers, a
//! checkpoint, an open last turn, a fork, an import and an import that
//! replaces it, a delete, a close; the model of
//! what each session must hold afterwards, and the check of a reopened store
//! against that model. Also the discovery of the harness fixtures, for the
//! tests that read them.
#![allow(dead_code)] // each test crate uses a different part

use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::session::SessionState;
use sessionlog::store::{Error, Options, Store};
use sessionlog::vfs::Vfs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub fn ev(text: &str) -> OwnedEvent {
    Event::from_json(text).unwrap().into_owned()
}

/// One more closed turn (turn/start, turn/end) after `log`.
pub fn next_turn(log: &[OwnedEvent]) -> Vec<OwnedEvent> {
    let s = log.len();
    vec![
        ev(&format!(
            r#"{{"type":"turn/start","seq":{s},"time":99,"data":{{"turn":99}}}}"#
        )),
        ev(&format!(
            r#"{{"type":"turn/end","seq":{},"time":99,"data":{{"turn":99,"reason":{{"kind":"completed"}}}}}}"#,
            s + 1
        )),
    ]
}

/// A log of `turns` turns (turn/start, user/message, turn/end) starting at
/// seq 0; message sizes vary so batches have different sizes.
pub fn turn_log(turns: u64, tag: &str) -> Vec<OwnedEvent> {
    let mut out = Vec::new();
    for t in 0..turns {
        let s = out.len() as u64;
        out.push(ev(&format!(
            r#"{{"type":"turn/start","seq":{s},"time":{t},"data":{{"turn":{}}}}}"#,
            t + 1
        )));
        if turns >= 4 && t == turns / 2 {
            // A compaction: a summary replaces the first two user messages
            // (seqs 1 and 4), so the workload exercises a surface replace.
            out.push(ev(&format!(
                r#"{{"type":"user/message","seq":{},"time":{t},"data":{{"role":"user","content":[{{"type":"text","text":"{tag} summary"}}]}},"sourceEventSeqs":[1,4],"surfaceOp":{{"op":"replace","start":1,"end":4}}}}"#,
                out.len()
            )));
        }
        let s = out.len() as u64 - 1;
        out.push(ev(&format!(
            r#"{{"type":"user/message","seq":{},"time":{t},"data":{{"role":"user","content":[{{"type":"text","text":"{tag} {t} {}"}}]}},"surfaceOp":"append"}}"#,
            s + 1,
            "x".repeat(20 + (t as usize * 37) % 200)
        )));
        out.push(ev(&format!(
            r#"{{"type":"turn/end","seq":{},"time":{t},"data":{{"turn":{},"reason":{{"kind":"completed"}}}}}}"#,
            s + 2,
            t + 1
        )));
    }
    out
}

/// Cuts `log` into batches of the given sizes, cycling.
pub fn batches(log: &[OwnedEvent], sizes: &[usize]) -> Vec<Vec<OwnedEvent>> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < log.len() {
        let n = sizes[i % sizes.len()].min(log.len() - at);
        out.push(log[at..at + n].to_vec());
        at += n;
        i += 1;
    }
    out
}

/// The repair closers a reopen appends after `log`.
pub fn closers(log: &[OwnedEvent]) -> Vec<OwnedEvent> {
    let mut state = SessionState::new(false);
    state.append_batch(log, &Vec::<Event<'_>>::new()).unwrap();
    state.closers()
}

/// What the workload was told, per session.
#[derive(Debug, Default, Clone)]
pub struct SessionModel {
    /// Acknowledged batches, concatenated.
    pub acked: Vec<OwnedEvent>,
    /// The batch whose append failed (only when nothing was acked after it).
    pub in_flight: Option<Vec<OwnedEvent>>,
    /// Whether the session may be missing after a reopen.
    pub may_be_absent: bool,
    /// Whether the session must be missing (its deletion was acknowledged).
    pub deleted: bool,
    /// Deletion attempted and failed: present (whole) or absent.
    pub delete_failed: bool,
    /// A replacement (`import --replace`) in flight: the session may hold
    /// this log instead, whole.
    pub replaced_by: Option<Vec<OwnedEvent>>,
}

#[derive(Debug, Default)]
pub struct Model {
    pub sessions: BTreeMap<String, SessionModel>,
}

/// One step's outcome, for the workload driver.
pub enum Stop {
    /// The injected fault surfaced as this error.
    Failed(Error),
}

/// The scripted workload: 2 sessions, appends of several batch sizes, a
/// segment rollover (4 KiB segments), a checkpoint (flush), a fork, a
/// delete, a close. Returns `Err` at the first failing call (after the
/// checks the store promises about it), `Ok` when it completed.
pub fn workload(dir: &Path, fs: &Arc<dyn Vfs>, model: &mut Model, retry: bool) -> Result<(), Stop> {
    workload_with(dir, fs, model, retry, options())
}

/// [`workload`] with other store options (the journal, issue 18).
pub fn workload_with(
    dir: &Path,
    fs: &Arc<dyn Vfs>,
    model: &mut Model,
    retry: bool,
    opts: Options,
) -> Result<(), Stop> {
    // `compress_sealed` here means: compress a's sealed segment in one
    // step after the checkpoint (`Store::compress_sealed`), before the
    // fork reads its seed from it. The background thread stays off, so the sequence
    // of file operations is the same in every run (crash-point
    // enumeration replays it).
    let compress = opts.compress_sealed;
    let opts = Options {
        compress_sealed: false,
        ..opts
    };
    let store = Store::open_with_vfs(dir, opts, fs.clone()).map_err(Stop::Failed)?;
    let log_a = turn_log(24, "a");
    let log_b = turn_log(6, "b");
    let batches_a = batches(&log_a, &[1, 2, 5, 3, 7, 4]);
    let batches_b = batches(&log_b, &[4, 1, 6]);
    for id in ["a", "b"] {
        store
            .create(SessionHeader::new(id, 0))
            .map_err(Stop::Failed)?;
        model.sessions.insert(
            id.to_owned(),
            SessionModel {
                may_be_absent: true,
                ..SessionModel::default()
            },
        );
    }
    let append = |id: &str, batch: &[OwnedEvent], model: &mut Model| -> Result<(), Stop> {
        let m = model.sessions.get_mut(id).unwrap();
        match store.append(id, batch) {
            Ok(()) => {
                m.acked.extend_from_slice(batch);
                m.may_be_absent = false;
                Ok(())
            }
            Err(e) => {
                m.in_flight = Some(batch.to_vec());
                // What the store promises about a failed append.
                match store.append(id, batch) {
                    Err(Error::Poisoned(_)) => {}
                    Ok(()) if retry => {
                        // The error did not poison: the retry wrote the
                        // batch at the same place.
                        m.acked.extend_from_slice(batch);
                        m.in_flight = None;
                        m.may_be_absent = false;
                    }
                    Ok(()) => panic!("persistent fault, but the retried append succeeded"),
                    Err(Error::Rejected { .. }) if !retry => {}
                    Err(e2) => {
                        assert!(!retry, "retry after {e} failed without a fault: {e2}");
                    }
                }
                Err(Stop::Failed(e))
            }
        }
    };
    // Interleaved appends; a's log passes several 4 KiB segments.
    let (mut ia, mut ib) = (batches_a.iter(), batches_b.iter());
    loop {
        let (a, b) = (ia.next(), ib.next());
        if a.is_none() && b.is_none() {
            break;
        }
        if let Some(batch) = a {
            append("a", batch, model)?;
            if let Some(batch) = ia.next() {
                append("a", batch, model)?;
            }
        }
        if let Some(batch) = b {
            append("b", batch, model)?;
        }
    }
    store.flush().map_err(Stop::Failed)?;
    if compress {
        let done = store.compress_sealed("a").map_err(Stop::Failed)?;
        assert!(
            done.segments >= 1,
            "a's sealed segment compressed: {done:?}"
        );
    }
    // Extra appends after the checkpoint: an open turn at the end.
    let n = log_a.len() as u64;
    let tail = [
        ev(&format!(
            r#"{{"type":"turn/start","seq":{n},"time":99,"data":{{"turn":99}}}}"#
        )),
        ev(&format!(
            r#"{{"type":"user/message","seq":{},"time":99,"data":{{"role":"user","content":[{{"type":"text","text":"open"}}]}},"surfaceOp":"append"}}"#,
            n + 1
        )),
    ];
    append("a", &tail[..1], model)?;
    append("a", &tail[1..], model)?;
    // Fork a at a turn boundary inside its sealed segments.
    let at = 30;
    let mut seed = log_a[..at as usize].to_vec();
    seed.push(OwnedEvent::new("session/end-seed", at, seed.last().unwrap().time, "{}").unwrap());
    model.sessions.insert(
        "c".into(),
        SessionModel {
            in_flight: Some(seed.clone()),
            may_be_absent: true,
            ..SessionModel::default()
        },
    );
    store
        .fork("a", at, SessionHeader::new("c", 0))
        .map_err(Stop::Failed)?;
    let c = model.sessions.get_mut("c").unwrap();
    c.acked = seed;
    c.in_flight = None;
    c.may_be_absent = false;
    let next = ev(&format!(
        r#"{{"type":"session/title","seq":{},"time":100,"data":{{"title":"child"}}}}"#,
        at + 1
    ));
    append("c", &[next], model)?;
    // Import d whole, then replace it whole: after a crash, no session, the
    // first, or the second, never a mix or a part.
    let log_d = turn_log(5, "d");
    let log_d2 = turn_log(7, "d2");
    model.sessions.insert(
        "d".into(),
        SessionModel {
            in_flight: Some(log_d.clone()),
            may_be_absent: true,
            ..SessionModel::default()
        },
    );
    store
        .import(SessionHeader::new("d", 0), &log_d, false)
        .map_err(Stop::Failed)?;
    let d = model.sessions.get_mut("d").unwrap();
    d.acked = log_d;
    d.in_flight = None;
    d.may_be_absent = false;
    d.replaced_by = Some(log_d2.clone());
    store
        .import(SessionHeader::new("d", 1), &log_d2, true)
        .map_err(Stop::Failed)?;
    let d = model.sessions.get_mut("d").unwrap();
    d.acked = log_d2;
    d.replaced_by = None;
    // Delete b.
    match store.delete("b") {
        Ok(()) => model.sessions.get_mut("b").unwrap().deleted = true,
        Err(e) => {
            model.sessions.get_mut("b").unwrap().delete_failed = true;
            return Err(Stop::Failed(e));
        }
    }
    store.close().map_err(Stop::Failed)?;
    Ok(())
}

/// The ids a reopened `store` lists, after checking that each one is a
/// session the workload made.
pub fn listed_sessions(store: &Store, model: &Model, context: &str) -> Vec<String> {
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
    for id in &listed {
        assert!(
            model.sessions.contains_key(id),
            "{context}: unknown session {id}"
        );
    }
    listed
}

/// Checks session `id` of a reopened `store` (which lists `listed`) against
/// what the workload was told, `m`:
///
/// * a session whose deletion was acknowledged is gone; a missing one was
///   allowed to be (never acknowledged, or its deletion failed);
/// * a present one holds exactly its acknowledged batches, plus at most the
///   in-flight batch, whole, then the repair closers of that log, once;
/// * it passes `verify`.
///
/// Returns the recovered log of a present session.
pub fn check_session(
    store: &Store,
    listed: &[String],
    id: &str,
    m: &SessionModel,
    context: &str,
) -> Option<Vec<OwnedEvent>> {
    let exists = listed.iter().any(|l| l == id);
    if m.deleted {
        assert!(!exists, "{context}: deleted session {id} is back");
        return None;
    }
    if !exists {
        assert!(
            m.may_be_absent || m.delete_failed,
            "{context}: acknowledged session {id} is missing"
        );
        return None;
    }
    // Taking the session as its writer runs recovery with authority (a torn
    // tail cut, an interrupted turn closed).
    store
        .repair(id)
        .unwrap_or_else(|e| panic!("{context}: recovering {id}: {e}"));
    let got = store
        .read_from(id, 0)
        .unwrap_or_else(|e| panic!("{context}: reading {id}: {e}"));
    let mut candidates = vec![m.acked.clone()];
    candidates.extend(m.replaced_by.clone());
    if let Some(x) = &m.in_flight {
        let mut with = m.acked.clone();
        with.extend_from_slice(x);
        candidates.push(with);
    }
    let ok = candidates.into_iter().any(|mut want| {
        !want.is_empty() && {
            want.extend(closers(&want));
            got == want
        }
    });
    assert!(
        ok,
        "{context}: session {id} holds {} events; acknowledged {} (+{} in flight); recovery {:?}",
        got.len(),
        m.acked.len(),
        m.in_flight.as_ref().map_or(0, Vec::len),
        store.recovery(id)
    );
    store
        .verify(id)
        .unwrap_or_else(|e| panic!("{context}: verify {id}: {e}"));
    Some(got)
}

/// Appends one event at `seq` to session `id` of a reopened `store` (it
/// must accept it) and returns the event.
pub fn append_after_reopen(store: &Store, id: &str, seq: u64, context: &str) -> OwnedEvent {
    let e = ev(&format!(
        r#"{{"type":"session/title","seq":{seq},"time":1000,"data":{{"title":"after"}}}}"#
    ));
    store
        .append(id, std::slice::from_ref(&e))
        .unwrap_or_else(|err| panic!("{context}: append to {id} after reopen: {err}"));
    e
}

/// [`options`] with a's sealed segments compressed by the workload.
#[allow(dead_code)] // not every test binary uses it
pub fn compress_options() -> Options {
    Options {
        compress_sealed: true,
        ..options()
    }
}

/// [`options`] with the store-wide journal on, in its smallest files.
#[allow(dead_code)] // not every test binary uses it
pub fn journal_options() -> Options {
    Options {
        journal: true,
        journal_file_size: 64 << 10,
        ..options()
    }
}

pub fn options() -> Options {
    Options {
        segment_size: 4096,
        preallocate: 4096,
        ..Options::default()
    }
}

/// Where the checkpoint of the session in `session_dir` is: its
/// `CHECKPOINT` file (from byte 0), or embedded in its `HEADER` (from the
/// end of the header JSON; format-spec section 6). `None` without one.
pub fn checkpoint_place(session_dir: &Path) -> Option<(PathBuf, usize)> {
    use sessionlog::headerfile;
    let file = session_dir.join(sessionlog::checkpoint::CHECKPOINT_FILE);
    if file.exists() {
        return Some((file, 0));
    }
    let path = session_dir.join(headerfile::HEADER_FILE);
    let bytes = std::fs::read(&path).ok()?;
    let at = bytes.len() - headerfile::decode(&bytes).ok()?.checkpoint?.len();
    Some((path, at))
}

/// The bytes of the checkpoint of the session in `session_dir`, wherever
/// it is (panics without one).
pub fn read_checkpoint(session_dir: &Path) -> Vec<u8> {
    let (path, at) = checkpoint_place(session_dir).expect("the session has a checkpoint");
    std::fs::read(path).unwrap()[at..].to_vec()
}

/// Puts `checkpoint` in place of the session's checkpoint, where that is.
pub fn write_checkpoint_bytes(session_dir: &Path, checkpoint: &[u8]) {
    let (path, at) = checkpoint_place(session_dir).expect("the session has a checkpoint");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(at);
    bytes.extend_from_slice(checkpoint);
    std::fs::write(path, bytes).unwrap();
}

/// Removes the checkpoint of the session in `session_dir`, wherever it is,
/// so that the next load rebuilds the session from its log.
pub fn remove_checkpoint(session_dir: &Path) {
    use sessionlog::headerfile;
    let _ = std::fs::remove_file(session_dir.join(sessionlog::checkpoint::CHECKPOINT_FILE));
    let path = session_dir.join(headerfile::HEADER_FILE);
    if let Ok(bytes) = std::fs::read(&path)
        && headerfile::decode(&bytes).is_ok_and(|h| h.checkpoint.is_some())
    {
        std::fs::write(&path, headerfile::with_checkpoint(&bytes, None).unwrap()).unwrap();
    }
}

/// A directory on tmpfs when there is one (the test syncs a lot).
pub fn fast_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().unwrap()
}

/// The fixture root, `$SESSIONLOG_FIXTURES` or else `../shared/fixtures`
/// beside the repository, when it holds the harness logs
/// (`harness-jsonl/MANIFEST.tsv`). The fixtures live outside the repository:
/// when they are absent this fails if `SESSIONLOG_REQUIRE_FIXTURES` is set
/// (CI sets it), and otherwise says SKIPPED on stderr and returns `None`.
pub fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("SESSIONLOG_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures"));
    if dir.join("harness-jsonl/MANIFEST.tsv").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("SESSIONLOG_REQUIRE_FIXTURES").is_none(),
        "fixtures required but not found at {}",
        dir.display()
    );
    eprintln!(
        "SKIPPED: harness fixtures not found at {} (set SESSIONLOG_FIXTURES)",
        dir.display()
    );
    None
}
