//! A fork whose parent another handle replaces (`import` with `replace`):
//! before it started (the forking handle had the old incarnation loaded),
//! or while it links the parent's sealed segments. The child holds one
//! incarnation whole; before, the fork failed with a false "segment
//! identity does not match" corruption error pointing into staging.

mod common;
#[path = "common/hooked_fs.rs"]
mod hooked_fs;

use common::{fast_tempdir, turn_log};
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
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
