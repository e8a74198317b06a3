//! Damage campaigns over every file the store writes.
//!
//! A small closed store holds one of each kind of file: `MANIFEST` (of
//! version 5), a session's `HEADER`, sealed segments (with footers), their
//! compressed images (`.segz`) and an active segment, a `CHECKPOINT`, a
//! `HEADER` embedding its session's checkpoint (version 2), a
//! fork's `LINEAGE` (and hard-linked raw segments), plus an
//! orphaned journal file whose entries its segments also hold (a handle
//! that died after syncing). Each file in turn gets one byte changed (every
//! byte of its first and last 160 bytes and of small files, a stride
//! through the rest) or is cut short, on a fresh copy of the store. Then a
//! writable open, every read, and one append per session must keep the
//! promises of `format-spec.md`:
//!
//! - nothing panics; a failure is a typed error whose message names a file
//!   of the store;
//! - no session vanishes: each is listed or reported by
//!   `Store::unaccounted`;
//! - a session that reads, reads exactly as before the damage (events and
//!   derived messages): a single changed byte is never a silently different
//!   or shorter log, since a checkpoint covers every record of a closed
//!   store;
//! - a session that fails to read also refuses an append (damage is never
//!   "repaired" by cutting it off), and one that reads accepts an append,
//!   unless a damaged journal is reported, which `salvage_journals` then
//!   clears;
//! - the open deletes nothing but the files replay accounts for (an
//!   intact orphaned journal) and rewrites nothing but checkpoints;
//! - a checkpoint (a `CHECKPOINT`, or one a `HEADER` embeds) still damaged
//!   after the open is reported by `verify`
//!   (the log reads whole without it, but its damage is never hidden).

use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::headerfile;
use sessionlog::store::{Error, Options, Store};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod common;
use common::{checkpoint_place, fast_tempdir, next_turn, turn_log};

const SESSIONS: [&str; 3] = ["s", "f", "j"];

fn options() -> Options {
    Options {
        segment_size: 4096,
        preallocate: 4096,
        journal_file_size: 64 << 10,
        ..Options::default()
    }
}

/// What a reader sees of one session.
#[derive(Debug, PartialEq)]
struct Seen {
    events: Vec<OwnedEvent>,
    messages: Vec<String>,
}

fn seen(store: &Store, id: &str) -> Result<Seen, Error> {
    let events = store.read_from(id, 0)?;
    let messages = store.derive(id)?.messages().map(|m| m.to_json()).collect();
    match store.verify(id) {
        Ok(_) => {}
        // A damaged checkpoint (a CHECKPOINT file, or the one a HEADER
        // embeds) is reported while the log reads whole without it (`check`
        // makes sure it is reported).
        Err(Error::Corrupt { segment, .. }) if segment.ends_with("CHECKPOINT") => {}
        Err(Error::Corrupt { reason, .. })
            if reason.starts_with("the checkpoint embedded in HEADER") => {}
        Err(e) => return Err(e),
    }
    Ok(Seen { events, messages })
}

/// Builds the store in `dir`; returns what each session reads.
fn build(dir: &Path) -> BTreeMap<String, Seen> {
    // s and f keep their checkpoints in CHECKPOINT files, j in its HEADER.
    let store = Store::open(
        dir,
        Options {
            embed_checkpoints: false,
            ..options()
        },
    )
    .unwrap();
    store.create(SessionHeader::new("s", 0)).unwrap();
    let log = turn_log(30, "s");
    let turns: Vec<_> = log.chunk_by(|_, b| b.kind != "turn/start").collect();
    let (before_fork, after_fork) = turns.split_at(24);
    for turn in before_fork {
        store.append("s", turn).unwrap();
    }
    // At a turn boundary, so the fork's seed leaves no turn open.
    let written = before_fork.iter().map(|t| t.len()).sum::<usize>() as u64;
    let at = log
        .iter()
        .rposition(|e| e.kind == "turn/start" && e.seq + 20 < written)
        .unwrap();
    store
        .fork("s", at as u64, SessionHeader::new("f", 0))
        .unwrap();
    for turn in after_fork {
        store.append("s", turn).unwrap();
    }
    // s's sealed segments written after the fork become images (the
    // store's manifest version 5); those the fork links stay raw, shared.
    let done = store.compress_sealed("s").unwrap();
    assert!(done.segments >= 1 && done.shared >= 1, "{done:?}");
    store.close().unwrap();
    // The journaled session, through a handle with the journal; its file
    // is copied (an orphan: no handle owns that number) before the close
    // syncs the segments and removes the original.
    let with_journal = Store::open(
        dir,
        Options {
            journal: true,
            ..options()
        },
    )
    .unwrap();
    with_journal.create(SessionHeader::new("j", 0)).unwrap();
    for turn in turn_log(6, "j").chunk_by(|_, b| b.kind != "turn/start") {
        with_journal.append("j", turn).unwrap();
    }
    let journal = dir.join("journal");
    let live = std::fs::read_dir(&journal)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    std::fs::copy(live.path(), journal.join("0000000000000abc.wal")).unwrap();
    with_journal.close().unwrap();

    let store = Store::open_read_only(dir).unwrap();
    SESSIONS
        .iter()
        .map(|id| (id.to_string(), seen(&store, id).unwrap()))
        .collect()
}

/// Every file under `dir`, relative, with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e.path().strip_prefix(dir).unwrap().to_owned();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

fn write_files(dir: &Path, files: &BTreeMap<PathBuf, Vec<u8>>) {
    for (rel, bytes) in files {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

/// The offsets of a file of `len` bytes the campaign changes.
fn offsets(len: usize) -> Vec<usize> {
    const EDGE: usize = 160;
    if len <= 3 * EDGE {
        return (0..len).collect();
    }
    let mut v: Vec<usize> = (0..EDGE).collect();
    v.extend((EDGE..len - EDGE).step_by(23));
    v.extend(len - EDGE..len);
    v
}

/// Where two views of a session first differ, briefly.
fn diff(got: &Seen, want: &Seen) -> String {
    let first = |a: &[String], b: &[String]| a.iter().zip(b).position(|(x, y)| x != y);
    let (ge, we): (Vec<String>, Vec<String>) = (
        got.events.iter().map(|e| format!("{e:?}")).collect(),
        want.events.iter().map(|e| format!("{e:?}")).collect(),
    );
    format!(
        "{} events (want {}), first differing at {:?}; {} messages (want {}), first differing at {:?}",
        ge.len(),
        we.len(),
        first(&ge, &we),
        got.messages.len(),
        want.messages.len(),
        first(&got.messages, &want.messages)
    )
}

/// An error that names a file of the store at `dir`.
fn names_a_file(e: &Error, dir: &Path) -> bool {
    e.to_string().contains(dir.to_str().unwrap())
}

/// Opens the damaged store in `dir` (`before`: its files as damaged; the
/// undamaged ones are `pristine`) and checks every promise; `what` says
/// which damage, for the messages.
fn check(
    dir: &Path,
    pristine: &BTreeMap<PathBuf, Vec<u8>>,
    before: &BTreeMap<PathBuf, Vec<u8>>,
    want: &BTreeMap<String, Seen>,
    what: &str,
) {
    let store = match Store::open(dir, options()) {
        Ok(s) => s,
        Err(e) => {
            // Only the store-wide files may refuse the whole store.
            assert!(
                matches!(e, Error::Manifest(_)),
                "{what}: the open failed: {e}"
            );
            return;
        }
    };
    let listed: BTreeSet<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
    let unaccounted = store.unaccounted().unwrap();
    for id in SESSIONS {
        let dir_of = Store::session_dir_in(dir, id).unwrap();
        assert!(
            listed.contains(id) || unaccounted.iter().any(|u| u.path == dir_of),
            "{what}: session {id} vanished: listed {listed:?}, unaccounted {unaccounted:?}"
        );
    }
    let damaged_journal = !store.damaged_journals().unwrap().is_empty();
    let mut readable = Vec::new();
    for id in SESSIONS {
        match seen(&store, id) {
            Ok(got) => {
                assert!(
                    got == want[id],
                    "{what}: session {id} reads differently: {}",
                    diff(&got, &want[id])
                );
                readable.push(id);
            }
            Err(e) => assert!(names_a_file(&e, dir), "{what}: {id}: {e}"),
        }
        // A checkpoint still damaged after the open (its CHECKPOINT file, or
        // the one its HEADER embeds) is reported by verify (it is a cache
        // the log rebuilds, but its damage is never hidden).
        let place = checkpoint_place(&Store::session_dir_in(dir, id).unwrap());
        let damaged = place.as_ref().is_some_and(|(ck, at)| {
            std::fs::read(ck).ok().is_some_and(|b| {
                matches!(
                    sessionlog::checkpoint::decode(&b[*at..]),
                    Err(e) if !matches!(e, sessionlog::checkpoint::CheckpointError::UnsupportedVersion { .. })
                )
            })
        });
        if damaged && listed.contains(id) {
            let ck = &place.as_ref().unwrap().0;
            match store.verify(id) {
                Err(Error::Corrupt { segment, .. }) if &segment == ck => {}
                Err(e) => assert!(names_a_file(&e, dir), "{what}: {id}: {e}"),
                Ok(_) => panic!(
                    "{what}: {id}: verify passed over a damaged checkpoint in {}",
                    ck.display()
                ),
            }
        }
    }
    // Nothing deleted but an intact orphan journal; nothing rewritten but
    // checkpoints (a HEADER only in the checkpoint it embeds: its uid and
    // header line as they were), and segments only by the journal's
    // write-back, which puts back bytes the undamaged file had (a cut
    // segment gets its journaled records again).
    let after = files(dir);
    let same_header = |a: &[u8], b: &[u8]| {
        let (a, b) = (headerfile::decode(a), headerfile::decode(b));
        matches!((a, b), (Ok(a), Ok(b)) if (a.uid, a.json) == (b.uid, b.json))
    };
    for (rel, bytes) in before {
        let name = rel.file_name().unwrap().to_str().unwrap();
        match after.get(rel) {
            Some(now) if now == bytes || name == "CHECKPOINT" => {}
            Some(now) if name == "HEADER" && same_header(now, bytes) => {}
            Some(now) => {
                let undamaged = &pristine[rel];
                // A byte neither the damaged nor the undamaged file had
                // there (zeros past the damaged file's end are the gap a
                // write past it leaves).
                let foreign = |i: usize, b: u8| {
                    let ours = bytes.get(i) == Some(&b)
                        || undamaged.get(i) == Some(&b)
                        || (i >= bytes.len() && b == 0);
                    (!ours).then_some(i)
                };
                let written_back = name.ends_with(".seg")
                    && now.len() <= undamaged.len().max(bytes.len())
                    && now
                        .iter()
                        .enumerate()
                        .all(|(i, b)| foreign(i, *b).is_none());
                assert!(
                    written_back,
                    "{what}: the open rewrote {} ({} bytes; damaged {}, undamaged {}; first foreign byte at {:?})",
                    rel.display(),
                    now.len(),
                    bytes.len(),
                    undamaged.len(),
                    now.iter().enumerate().find_map(|(i, b)| foreign(i, *b))
                );
            }
            None => assert!(
                rel.starts_with("journal") && !damaged_journal,
                "{what}: the open removed {}",
                rel.display()
            ),
        }
    }
    // Appends: refused where reads failed, accepted where they worked
    // (after a salvage when a journal is damaged).
    if damaged_journal {
        for id in &readable {
            let more = next_turn(&want[*id].events);
            match store.append(id, &more) {
                Err(Error::Corrupt { segment, .. }) => assert!(
                    segment.starts_with(dir.join("journal")),
                    "{what}: {id}: {}",
                    segment.display()
                ),
                other => panic!("{what}: {id}: a damaged journal must refuse: {other:?}"),
            }
        }
        let salvaged = store.salvage_journals().unwrap();
        assert_eq!(salvaged.len(), 1, "{what}");
    }
    // Damage is never hidden: a session that did not read may take an
    // append (old damage in a sealed segment does not stop the writer),
    // but it still does not read afterwards.
    for id in SESSIONS {
        let readable = readable.contains(&id);
        let base = &want[id].events;
        let more = next_turn(base);
        match store.append(id, &more) {
            Ok(()) => {}
            Err(e) if readable => panic!("{what}: {id} read fine, then refused an append: {e}"),
            Err(e) => assert!(names_a_file(&e, dir), "{what}: {id}: {e}"),
        }
        match store.read_from(id, 0) {
            Ok(got) if readable => assert!(
                got == [base.clone(), more].concat(),
                "{what}: {id}: {} events after the append",
                got.len()
            ),
            Ok(got) => panic!(
                "{what}: {id} failed to read, then read {} events",
                got.len()
            ),
            Err(e) if readable => panic!("{what}: {id} read fine, then failed: {e}"),
            Err(e) => assert!(names_a_file(&e, dir), "{what}: {id}: {e}"),
        }
    }
}

/// A fresh copy of the `pristine` store with file `rel` damaged by
/// `damage`, checked; `what` names the damage.
fn damage_and_check(
    pristine: &BTreeMap<PathBuf, Vec<u8>>,
    want: &BTreeMap<String, Seen>,
    rel: &Path,
    damage: impl FnOnce(&mut Vec<u8>),
    what: &str,
) {
    let dir = fast_tempdir();
    let mut damaged = pristine.clone();
    damage(damaged.get_mut(rel).unwrap());
    write_files(dir.path(), &damaged);
    check(
        dir.path(),
        pristine,
        &damaged,
        want,
        &format!("{} {what}", rel.display()),
    );
}

#[test]
fn one_changed_byte_in_any_file_is_found_or_harmless() {
    let template = fast_tempdir();
    let want = build(template.path());
    let pristine = files(template.path());
    let mut kinds = BTreeSet::new();
    let mut runs = 0;
    for (rel, bytes) in &pristine {
        let name = rel.file_name().unwrap().to_str().unwrap().to_owned();
        if name == "LOCK" {
            continue; // empty: locks live on its byte ranges, not its bytes
        }
        let embeds =
            name == "HEADER" && headerfile::decode(bytes).is_ok_and(|h| h.checkpoint.is_some());
        let kind = if embeds {
            "HEADER with a checkpoint".to_owned()
        } else if name.ends_with(".seg") {
            "segment".to_owned()
        } else if name.ends_with(".segz") {
            "segment image".to_owned()
        } else if name.ends_with(".wal") {
            "journal".to_owned()
        } else {
            name.clone()
        };
        kinds.insert(kind);
        for at in offsets(bytes.len()) {
            damage_and_check(
                &pristine,
                &want,
                rel,
                |b| b[at] ^= 0x5a,
                &format!("byte {at} changed"),
            );
            runs += 1;
        }
    }
    let expected: BTreeSet<String> = [
        "CHECKPOINT",
        "HEADER",
        "HEADER with a checkpoint",
        "LINEAGE",
        "MANIFEST",
        "journal",
        "segment",
        "segment image",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, expected, "every kind of file the store writes");
    println!("{runs} single-byte damages checked");
}

#[test]
fn any_file_cut_short_is_found_or_harmless() {
    let template = fast_tempdir();
    let want = build(template.path());
    let pristine = files(template.path());
    for (rel, bytes) in &pristine {
        let len = bytes.len();
        if len == 0 {
            continue; // LOCK
        }
        let mut cuts: BTreeSet<usize> = [0, 1, len / 2, len.saturating_sub(1)].into();
        cuts.extend([12, 36, 40, 64, 100].into_iter().filter(|&c| c < len));
        cuts.remove(&len);
        for cut in cuts {
            damage_and_check(
                &pristine,
                &want,
                rel,
                |b| b.truncate(cut),
                &format!("cut to {cut} bytes"),
            );
        }
    }
}
