//! A fork whose parent another handle replaces (`import` with `replace`):
//! before it started (the forking handle had the old incarnation loaded),
//! or while it links the parent's sealed segments. The child holds one
//! incarnation whole; before, the fork failed with a false "segment
//! identity does not match" corruption error pointing into staging.

mod common;

use common::{fast_tempdir, turn_log};
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use sessionlog::vfs::{Metadata, RealFs, SegmentBytes, Vfs, VfsFile};
use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

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

/// The real file system, running `hook` once, just before the first hard
/// link (a fork linking the parent's first sealed segment).
struct BeforeFirstLink {
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for BeforeFirstLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeFirstLink")
    }
}

impl Vfs for BeforeFirstLink {
    fn create_new(&self, p: &Path) -> io::Result<Box<dyn VfsFile>> {
        RealFs.create_new(p)
    }
    fn open(&self, p: &Path, w: bool) -> io::Result<Box<dyn VfsFile>> {
        RealFs.open(p, w)
    }
    fn read_file(&self, p: &Path) -> io::Result<Vec<u8>> {
        RealFs.read_file(p)
    }
    fn map(&self, p: &Path) -> io::Result<SegmentBytes> {
        RealFs.map(p)
    }
    fn rename(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename(a, b)
    }
    fn rename_noreplace(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename_noreplace(a, b)
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.exchange(a, b)
    }
    fn remove_file(&self, p: &Path) -> io::Result<()> {
        RealFs.remove_file(p)
    }
    fn remove_dir_all(&self, p: &Path) -> io::Result<()> {
        RealFs.remove_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> io::Result<()> {
        RealFs.create_dir(p)
    }
    fn sync_dir(&self, p: &Path) -> io::Result<()> {
        RealFs.sync_dir(p)
    }
    fn hard_link(&self, a: &Path, b: &Path) -> io::Result<()> {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        RealFs.hard_link(a, b)
    }
    fn read_dir(&self, p: &Path) -> io::Result<Vec<OsString>> {
        RealFs.read_dir(p)
    }
    fn metadata(&self, p: &Path) -> io::Result<Metadata> {
        RealFs.metadata(p)
    }
    fn symlink_metadata(&self, p: &Path) -> io::Result<Metadata> {
        RealFs.symlink_metadata(p)
    }
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
    let vfs = Arc::new(BeforeFirstLink {
        hook: Mutex::new(Some(Box::new(move || {
            // Another handle replaces the parent between the fork's read of
            // it and its links.
            let b = Store::open(&path, options()).unwrap();
            import(&b, &replace, true);
            b.close().unwrap();
        }))),
    });
    let a = Store::open_with_vfs(dir.path(), options(), vfs.clone()).unwrap();
    let at = seed_len(&old);
    a.fork("p", at, SessionHeader::new("child", 0)).unwrap();
    assert!(vfs.hook.lock().unwrap().is_none(), "the hook ran");
    check_child(&a, &new, at);
}
