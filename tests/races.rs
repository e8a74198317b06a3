//! Races the store must lose gracefully, made deterministic with hooks in
//! the file system (`tests/common/hooked_fs.rs`):
//!
//! - a fork whose parent another handle replaces (`import` with `replace`):
//!   before it started (the forking handle had the old incarnation loaded),
//!   or while it links the parent's sealed segments. The child holds one
//!   incarnation whole; before, the fork failed with a false "segment
//!   identity does not match" corruption error pointing into staging;
//! - a call that waited for a session whose load failed in another thread
//!   (which forgets the entry): it must use the map's new entry, never load
//!   the forgotten one as a second session object with a lock of its own;
//! - a reader's load racing a replace between its read of the `HEADER` and
//!   its listing, which must read one incarnation whole, not fail; and one
//!   racing its writer's new segment and checkpoint between its listing and
//!   its read of the checkpoint.

mod common;
#[path = "common/hooked_fs.rs"]
mod hooked_fs;

use common::{fast_tempdir, turn_log};
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::store::Error;
use sessionlog::store::{Options, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Small segments and records, so an import seals several segments (a
/// fork links those).
fn options() -> Options {
    Options {
        segment_size: 4096,
        preallocate: 4096,
        max_record: 4096,
        ..Options::default()
    }
}

/// Two incarnations of session "p": different texts, the same shape.
fn incarnations() -> (Vec<OwnedEvent>, Vec<OwnedEvent>) {
    (turn_log(40, "old"), turn_log(40, "new"))
}

fn import(store: &Store, log: &[OwnedEvent], replace: bool) {
    let events: Vec<Event<'_>> = log.iter().map(OwnedEvent::borrowed).collect();
    store
        .import(SessionHeader::new("p", 0), &events, replace)
        .unwrap();
}

/// A seed length at a turn boundary, past the first sealed segments.
fn seed_len(log: &[OwnedEvent]) -> u64 {
    log.iter()
        .rposition(|e| e.kind == "turn/start" && e.seq < log.len() as u64 - 10)
        .unwrap() as u64
}

fn check_child(store: &Store, want: &[OwnedEvent], at: u64) {
    let (_, events) = store.load("child").unwrap();
    assert_eq!(&events[..at as usize], &want[..at as usize]);
    assert_eq!(events[at as usize].kind, "session/end-seed");
    store.verify("child").unwrap();
}

#[test]
fn a_fork_of_a_parent_replaced_since_it_was_loaded_forks_what_it_is_now() {
    let dir = fast_tempdir();
    let (old, new) = incarnations();
    let setup = Store::open(dir.path(), options()).unwrap();
    import(&setup, &old, false);
    setup.close().unwrap();
    let a = Store::open(dir.path(), options()).unwrap();
    assert_eq!(a.load("p").unwrap().1, old); // loaded in `a`
    let b = Store::open(dir.path(), options()).unwrap();
    import(&b, &new, true);
    let at = seed_len(&new);
    a.fork("p", at, SessionHeader::new("child", 0)).unwrap();
    check_child(&a, &new, at);
}

#[test]
fn a_fork_whose_parent_is_replaced_while_it_links_is_forked_again() {
    let dir = fast_tempdir();
    let (old, new) = incarnations();
    {
        let setup = Store::open(dir.path(), options()).unwrap();
        import(&setup, &old, false);
        setup.close().unwrap();
    }
    let path = dir.path().to_owned();
    let replace = new.clone();
    let ran = Arc::new(AtomicBool::new(false));
    let once = ran.clone();
    let vfs = Arc::new(hooked_fs::HookedFs {
        before_link: Some(Box::new(move |_| {
            if once.swap(true, Ordering::SeqCst) {
                return;
            }
            // Another handle replaces the parent between the fork's read
            // of it and its first link.
            let b = Store::open(&path, options()).unwrap();
            import(&b, &replace, true);
            b.close().unwrap();
        })),
        ..hooked_fs::HookedFs::default()
    });
    let a = Store::open_with_vfs(dir.path(), options(), vfs).unwrap();
    let at = seed_len(&old);
    a.fork("p", at, SessionHeader::new("child", 0)).unwrap();
    assert!(ran.load(Ordering::SeqCst), "the hook ran");
    check_child(&a, &new, at);
}

/// Thread 1's load of session "s" fails (a listing error after a pause),
/// which forgets the map's entry while thread 2 waits for it. Thread 2 must
/// then load the map's new entry: before, it loaded the forgotten one, so
/// the handle held two session objects for "s", each taking the writer lock
/// through the process's one lock descriptor, and dropping one gave the
/// lock back under the other, letting a second handle write.
#[test]
fn a_call_waiting_for_a_session_whose_load_failed_uses_the_new_entry() {
    let dir = fast_tempdir();
    let log = turn_log(6, "s");
    {
        let setup = Store::open(dir.path(), options()).unwrap();
        import(&setup, &log[..3], false);
        setup.close().unwrap();
    }
    let session = Store::session_dir_in(dir.path(), "p").unwrap();
    let failed = Arc::new(AtomicBool::new(false));
    let once = failed.clone();
    let vfs = Arc::new(hooked_fs::HookedFs {
        before_read_dir: Some(Box::new(move |p| {
            if p == session && !once.swap(true, Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(300));
                return Err(std::io::Error::other("injected: listing failed"));
            }
            Ok(())
        })),
        ..hooked_fs::HookedFs::default()
    });
    let a = Store::open_with_vfs(dir.path(), options(), vfs).unwrap();
    std::thread::scope(|scope| {
        let first = scope.spawn(|| a.read_from("p", 0));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let second = scope.spawn(|| a.append("p", &log[3..]));
        assert!(first.join().unwrap().is_err(), "the first load failed");
        second.join().unwrap().unwrap();
    });
    assert!(failed.load(Ordering::SeqCst));
    // One more append through the handle's entry, then another handle
    // must find the session's writer lock held.
    assert_eq!(a.read_from("p", 0).unwrap(), log);
    let b = Store::open(dir.path(), options()).unwrap();
    match b.append("p", &turn_log(7, "s")[6..]) {
        Err(Error::Locked { .. }) => {}
        other => panic!("a second handle must find the lock held: {other:?}"),
    }
}

/// Past `max_open_sessions`, a handle releases its least recently used
/// sessions, writer locks included: a session just imported counts as just
/// used. Before, an import left the session's use clock at 0, so the
/// newest import was the first released (by id order among the imports)
/// and another handle could take it while this one was still writing.
#[test]
fn eviction_releases_the_least_recently_used_import_first() {
    let dir = fast_tempdir();
    let opts = || Options {
        max_open_sessions: 2,
        ..options()
    };
    let a = Store::open(dir.path(), opts()).unwrap();
    let log = turn_log(2, "s");
    let events: Vec<Event<'_>> = log.iter().map(OwnedEvent::borrowed).collect();
    // "z" first (the least recently used), then "a", then "b": adding "b"
    // releases one session, "z".
    for id in ["z", "a", "b"] {
        a.import(SessionHeader::new(id, 0), &events[..3], false)
            .unwrap();
    }
    let b = Store::open(dir.path(), opts()).unwrap();
    b.append("z", &log[3..]).unwrap();
    match b.append("b", &log[3..]) {
        Err(Error::Locked { .. }) => {}
        other => panic!("the newest import is still the first handle's: {other:?}"),
    }
}

/// A session deleted by another handle between a lookup's look at its
/// directory and its read of the `HEADER` is gone, not damaged: `header` is
/// `NotFound` (before: `Corrupt`, "no HEADER file", with a hint to salvage).
#[test]
fn a_session_deleted_during_a_lookup_is_not_found_not_corrupt() {
    let dir = fast_tempdir();
    let log = turn_log(2, "s");
    {
        let setup = Store::open(dir.path(), options()).unwrap();
        import(&setup, &log, false);
        setup.close().unwrap();
    }
    let path = dir.path().to_owned();
    let once = Arc::new(AtomicBool::new(false));
    let ran = once.clone();
    let vfs = Arc::new(hooked_fs::HookedFs {
        before_read_file: Some(Box::new(move |p| {
            if p.ends_with("HEADER") && !ran.swap(true, Ordering::SeqCst) {
                let other = Store::open(&path, options()).unwrap();
                other.delete("p").unwrap();
                other.close().unwrap();
            }
        })),
        ..hooked_fs::HookedFs::default()
    });
    let a = Store::open_with_vfs(dir.path(), options(), vfs).unwrap();
    match a.header("p") {
        Err(Error::NotFound(id)) => assert_eq!(id, "p"),
        other => panic!("a deleted session is not found: {other:?}"),
    }
    assert!(
        once.load(Ordering::SeqCst),
        "the delete ran during the lookup"
    );
    assert!(a.unaccounted().unwrap().is_empty());
}

/// A reader holding a session that another handle deletes and creates
/// again reads the new one, even when the new directory got the old one's
/// inode number back (file systems reuse a freed number at once; the hook
/// makes it certain): the directory's birth time tells them apart. Before,
/// the reader kept serving the deleted log.
#[test]
fn a_reader_sees_a_session_created_again_in_a_reused_inode() {
    // On a disk file system: it records birth times (tmpfs may not).
    let dir = tempfile::tempdir().unwrap();
    let session = Store::session_dir_in(dir.path(), "p").unwrap();
    let vfs = Arc::new(hooked_fs::HookedFs {
        metadata: Some(Box::new(move |p, mut m| {
            if p == session {
                m.ino = 42;
            }
            m
        })),
        ..hooked_fs::HookedFs::default()
    });
    let (old, new) = (turn_log(2, "old"), turn_log(1, "new"));
    let writer = Store::open(dir.path(), options()).unwrap();
    import(&writer, &old, false);
    let reader = Store::open_read_only_with_vfs(dir.path(), vfs).unwrap();
    assert_eq!(reader.read_from("p", 0).unwrap(), old);
    writer.delete("p").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    import(&writer, &new, false);
    assert_eq!(reader.read_from("p", 0).unwrap(), new);
}

/// A reader whose load of a session races a replace by another handle
/// between its read of the `HEADER` and its listing of the directory reads
/// the new incarnation whole. Before, it built the session from the old
/// uid and the new files and failed with a false `Corrupt` ("segment
/// identity does not match").
#[test]
fn a_load_racing_a_replace_reads_the_new_incarnation() {
    let dir = fast_tempdir();
    let (old, new) = incarnations();
    {
        let setup = Store::open(dir.path(), options()).unwrap();
        import(&setup, &old, false);
        setup.close().unwrap();
    }
    let path = dir.path().to_owned();
    let session = Store::session_dir_in(dir.path(), "p").unwrap();
    let once = Arc::new(AtomicBool::new(false));
    let ran = once.clone();
    let vfs = Arc::new(hooked_fs::HookedFs {
        before_read_dir: Some(Box::new(move |p| {
            if p == session && !ran.swap(true, Ordering::SeqCst) {
                let other = Store::open(&path, options()).unwrap();
                import(&other, &incarnations().1, true);
                other.close().unwrap();
            }
            Ok(())
        })),
        ..hooked_fs::HookedFs::default()
    });
    let reader = Store::open_read_only_with_vfs(dir.path(), vfs).unwrap();
    assert_eq!(reader.read_from("p", 0).unwrap(), new);
    assert!(
        once.load(Ordering::SeqCst),
        "the replace ran during the load"
    );
    reader.verify("p").unwrap();
}

/// A reader's load that lists a session's segments, then reads its
/// checkpoint, while the writer (another handle) starts a new segment and
/// writes a checkpoint ending in it between the two, reads the session
/// whole. Before, the checkpoint named a segment the reader's listing
/// lacked: a false `Corrupt` ("the segment is missing, but the checkpoint
/// covers its records").
#[test]
fn a_load_whose_listing_predates_the_checkpoint_reads_the_session() {
    let dir = fast_tempdir();
    let log = turn_log(60, "w");
    // A turn boundary near the middle: the rest fills several segments.
    let at = log
        .iter()
        .position(|e| e.kind == "turn/start" && e.seq >= log.len() as u64 / 2)
        .unwrap();
    let writer = Arc::new(Store::open(dir.path(), options()).unwrap());
    writer.create(SessionHeader::new("p", 0)).unwrap();
    fn batch(b: &[OwnedEvent]) -> Vec<Event<'_>> {
        b.iter().map(OwnedEvent::borrowed).collect()
    }
    for turn in log[..at].chunk_by(|_, b| b.kind != "turn/start") {
        writer.append("p", &batch(turn)).unwrap();
    }
    writer.flush().unwrap();
    let session = Store::session_dir_in(dir.path(), "p").unwrap();
    let segments = || {
        std::fs::read_dir(&session)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "seg")
            })
            .count()
    };
    let segments_before = segments();
    let once = Arc::new(AtomicBool::new(false));
    let (ran, w, rest) = (once.clone(), writer.clone(), log[at..].to_vec());
    let vfs = Arc::new(hooked_fs::HookedFs {
        after_map: Some(Box::new(move |p| {
            if p.extension().is_some_and(|e| e == "seg") && !ran.swap(true, Ordering::SeqCst) {
                // After the reader's listing: the writer fills the active
                // segment, starts a new one and checkpoints into it.
                for turn in rest.chunk_by(|_, b| b.kind != "turn/start") {
                    w.append("p", &batch(turn)).unwrap();
                }
                w.flush().unwrap();
            }
        })),
        ..hooked_fs::HookedFs::default()
    });
    let reader = Store::open_read_only_with_vfs(dir.path(), vfs).unwrap();
    assert_eq!(reader.read_from("p", 0).unwrap(), log);
    assert!(
        once.load(Ordering::SeqCst),
        "the writer ran during the load"
    );
    assert!(
        segments() > segments_before,
        "the writer started a new segment"
    );
}
