//! Per-session writer locks: at most one writer of a session at a time,
//! across processes and handles.
//!
//! One file, `<store>/LOCK`, holds every lock: session `id` is a write lock
//! on the single byte at offset [`lock_key`]`(id)`, taken with Linux
//! open-file-description locks (`fcntl(F_OFD_SETLK)`). Those belong to the
//! open file, not the process, so two handles in one process exclude each
//! other just as two processes do, and the kernel drops them when the file
//! is closed or the process dies: a crashed writer never leaves a session
//! locked. One descriptor serves any number of sessions, so holding writer
//! locks on 10,000 sessions costs one file descriptor, not 10,000.
//!
//! The key is 62 bits of the id's FNV-1a-128 hash; two ids sharing a key
//! (probability about n^2 / 2^63 for n sessions) would only make their
//! writers exclude each other, never mix their data. The OS cannot tell who
//! holds an OFD lock (`F_OFD_GETLK` reports pid -1), so a refused writer is
//! told that another writer holds the session, not which one.
//!
//! Two things OFD locks do not do, the table does:
//!
//! - **Exclusion inside one handle.** Locks of one open file description
//!   never conflict with each other, and one `F_UNLCK` drops a byte however
//!   many times it was locked. So the table counts what it holds: a second
//!   exclusive lock of a byte this table holds is refused like another
//!   handle's, and a shared byte is unlocked when its last holder drops it.
//! - **Telling maintenance from a writer.** A writable open briefly locks
//!   sessions it is not going to write (to write back orphaned journals,
//!   to remove crashed builds), as does a journal salvage. Those run under
//!   a shared lock on the maintenance byte ([`MAINTENANCE_KEY`]); a writer
//!   refused a session while some other handle holds that byte waits for
//!   it instead of failing ([`LockTable::maintenance_running`]).

use crate::fsutil::fnv1a_128;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The lock file of a store.
pub(crate) const LOCK_FILE: &str = "LOCK";

/// The byte of `LOCK` that stands for session `id`.
pub(crate) fn lock_key(id: &str) -> u64 {
    (fnv1a_128(id.as_bytes()) as u64) & ((1 << 62) - 1)
}

/// The bytes of `LOCK` from 2^62 up stand for journal files (never a
/// session key): journal `n` (a 60-bit number) has its owner byte at
/// `2^62 + 2n` and its replay byte just after.
pub(crate) fn journal_key(n: u64, which: u64) -> u64 {
    (1 << 62) + 2 * (n & ((1 << 60) - 1)) + which
}

/// The byte of `LOCK` held (shared) by every handle while it maintains
/// sessions it does not write: above every session key (below 2^62) and
/// every journal byte (below 2^62 + 2^61).
pub(crate) const MAINTENANCE_KEY: u64 = (1 << 62) + (1 << 61);
// A valid `off_t`, past the last journal byte.
const _: () =
    assert!(MAINTENANCE_KEY < 1 << 63 && MAINTENANCE_KEY > (1 << 62) + 2 * ((1 << 60) - 1) + 1);

/// The open lock file of one store handle.
#[derive(Debug)]
pub(crate) struct LockTable {
    file: File,
    path: PathBuf,
    /// The bytes this description holds, and how.
    held: Mutex<HashMap<u64, Held>>,
}

/// How a [`LockTable`] holds a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Exclusive,
    /// By this many [`SessionLock`]s of the table.
    Shared(usize),
}

/// A held writer lock; released when dropped.
#[derive(Debug)]
pub(crate) struct SessionLock {
    table: Arc<LockTable>,
    key: u64,
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        let mut held = self.table.held.lock().expect("lock table");
        if let Some(Held::Shared(n)) = held.get_mut(&self.key)
            && *n > 1
        {
            *n -= 1;
            return;
        }
        held.remove(&self.key);
        // Unlocking a range this description holds cannot fail in a way we
        // could act on; closing the file would release it anyway.
        let _ = self
            .table
            .fcntl(libc::F_OFD_SETLK, libc::F_UNLCK as i16, self.key);
    }
}

impl LockTable {
    /// Opens (creating, `0600`) the lock file of the store in `dir`.
    pub(crate) fn open(dir: &Path, create: bool) -> io::Result<Option<LockTable>> {
        let path = dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .mode(crate::vfs::FILE_MODE)
            .open(&path);
        match file {
            Ok(file) => Ok(Some(LockTable::new(file, path))),
            // A read-only handle on a store no writer ever opened.
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => Ok(None),
            // A read-only handle without write permission: it can still ask.
            Err(e) if !create && e.kind() == io::ErrorKind::PermissionDenied => {
                let file = File::open(&path)?;
                Ok(Some(LockTable::new(file, path)))
            }
            Err(e) => Err(e),
        }
    }

    fn new(file: File, path: PathBuf) -> LockTable {
        LockTable {
            file,
            path,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// The lock file's path, for errors.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn fcntl(&self, cmd: libc::c_int, kind: i16, key: u64) -> io::Result<libc::flock> {
        // SAFETY: a zeroed `flock` is a valid value of this plain C struct.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind;
        fl.l_whence = libc::SEEK_SET as i16;
        fl.l_start = key as libc::off_t;
        fl.l_len = 1;
        fl.l_pid = 0; // required by OFD locks
        loop {
            // SAFETY: `fl` is a valid, exclusively borrowed `flock` for the
            // duration of the call; the descriptor is open.
            let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &mut fl) };
            if rc != -1 {
                return Ok(fl);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Takes the writer lock of session `id`, or `Ok(None)` when another
    /// handle (in any process) holds it.
    pub(crate) fn try_lock(self: &Arc<Self>, id: &str) -> io::Result<Option<SessionLock>> {
        self.try_lock_key(lock_key(id))
    }

    /// [`LockTable::try_lock`] by key (a staged session is named by its key).
    pub(crate) fn try_lock_key(self: &Arc<Self>, key: u64) -> io::Result<Option<SessionLock>> {
        self.try_key(key, libc::F_WRLCK as i16)
    }

    /// Takes the owner lock of journal file `n` (a write lock its owner
    /// holds for the file's life), or `Ok(None)` when it is held.
    pub(crate) fn try_lock_journal_owner(
        self: &Arc<Self>,
        n: u64,
    ) -> io::Result<Option<SessionLock>> {
        self.try_key(journal_key(n, 0), libc::F_WRLCK as i16)
    }

    /// A read lock on journal `n`'s owner byte: granted only when no owner
    /// holds it, i.e. the journal's owner is gone (only owners take the
    /// write lock). Many replayers may hold it at once.
    pub(crate) fn try_probe_journal_owner(
        self: &Arc<Self>,
        n: u64,
    ) -> io::Result<Option<SessionLock>> {
        self.try_key(journal_key(n, 0), libc::F_RDLCK as i16)
    }

    /// The replay lock of orphaned journal `n`: shared by the writers that
    /// replay their session's entries (waiting for a remover, which holds
    /// it briefly), exclusive for the one that removes the file.
    pub(crate) fn lock_journal_replay(
        self: &Arc<Self>,
        n: u64,
        exclusive: bool,
    ) -> io::Result<Option<SessionLock>> {
        let key = journal_key(n, 1);
        if exclusive {
            return self.try_key(key, libc::F_WRLCK as i16);
        }
        self.wait_shared(key).map(Some)
    }

    /// A shared lock on [`MAINTENANCE_KEY`], held while this handle locks
    /// sessions it does not write. Nobody takes that byte exclusively, so
    /// it is granted at once.
    pub(crate) fn maintenance(self: &Arc<Self>) -> io::Result<SessionLock> {
        self.wait_shared(MAINTENANCE_KEY)
    }

    /// Whether some handle (in any process, this one too) is maintaining
    /// sessions now (a snapshot).
    pub(crate) fn maintenance_running(&self) -> io::Result<bool> {
        if self
            .held
            .lock()
            .expect("lock table")
            .contains_key(&MAINTENANCE_KEY)
        {
            return Ok(true);
        }
        let fl = self.fcntl(libc::F_OFD_GETLK, libc::F_WRLCK as i16, MAINTENANCE_KEY)?;
        Ok(fl.l_type != libc::F_UNLCK as i16)
    }

    /// Takes `key` shared, waiting (`F_OFD_SETLKW`) for another handle's
    /// exclusive holder (a brief one: removers of journal files and nobody
    /// else take these bytes exclusively, and they never wait themselves),
    /// and polling while this table holds it exclusively (asking the kernel
    /// for a shared lock then would turn that exclusive lock into a shared
    /// one). The table's mutex is held across the wait, so no other lock of
    /// this table changes the byte meanwhile.
    fn wait_shared(self: &Arc<Self>, key: u64) -> io::Result<SessionLock> {
        loop {
            {
                let mut held = self.held.lock().expect("lock table");
                match held.get_mut(&key) {
                    Some(Held::Shared(n)) => {
                        *n += 1;
                        return Ok(self.holder(key));
                    }
                    Some(Held::Exclusive) => {}
                    None => {
                        self.fcntl(libc::F_OFD_SETLKW, libc::F_RDLCK as i16, key)?;
                        held.insert(key, Held::Shared(1));
                        return Ok(self.holder(key));
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn holder(self: &Arc<Self>, key: u64) -> SessionLock {
        SessionLock {
            table: self.clone(),
            key,
        }
    }

    fn try_key(self: &Arc<Self>, key: u64, kind: i16) -> io::Result<Option<SessionLock>> {
        let shared = kind == libc::F_RDLCK as i16;
        let mut held = self.held.lock().expect("lock table");
        match held.get_mut(&key) {
            Some(Held::Shared(n)) if shared => {
                *n += 1;
                return Ok(Some(self.holder(key)));
            }
            // Held by this table: refused as another holder would be.
            Some(_) => return Ok(None),
            None => {}
        }
        match self.fcntl(libc::F_OFD_SETLK, kind, key) {
            Ok(_) => {
                held.insert(
                    key,
                    if shared {
                        Held::Shared(1)
                    } else {
                        Held::Exclusive
                    },
                );
                Ok(Some(self.holder(key)))
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether this table holds session `id`'s byte exclusively: this
    /// handle writes the session (or maintains it for a moment).
    #[cfg_attr(not(feature = "archive"), allow(dead_code))] // archive eviction
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.held.lock().expect("lock table").get(&lock_key(id)) == Some(&Held::Exclusive)
    }

    /// Whether some other handle holds the writer lock of `id` right now
    /// (a snapshot: it may change the next moment).
    pub(crate) fn is_locked_elsewhere(&self, id: &str) -> io::Result<bool> {
        let fl = self.fcntl(libc::F_OFD_GETLK, libc::F_WRLCK as i16, lock_key(id))?;
        Ok(fl.l_type != libc::F_UNLCK as i16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tables_on_one_file_exclude_each_other_per_session() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(LockTable::open(dir.path(), true).unwrap().unwrap());
        let b = Arc::new(LockTable::open(dir.path(), true).unwrap().unwrap());
        let held = a.try_lock("s1").unwrap().expect("free");
        assert!(b.try_lock("s1").unwrap().is_none(), "second writer refused");
        assert!(b.is_locked_elsewhere("s1").unwrap());
        assert!(!a.is_locked_elsewhere("s1").unwrap(), "our own lock");
        let other = b.try_lock("s2").unwrap().expect("another session is free");
        drop(held);
        assert!(!b.is_locked_elsewhere("s1").unwrap());
        assert!(b.try_lock("s1").unwrap().is_some(), "released on drop");
        drop(other);
        // Keys stay below 2^62 (off_t is signed).
        assert!(lock_key("x") < 1 << 62);
    }

    #[test]
    fn one_table_counts_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(LockTable::open(dir.path(), true).unwrap().unwrap());
        let b = Arc::new(LockTable::open(dir.path(), true).unwrap().unwrap());
        // A second exclusive lock of a byte the table holds is refused (the
        // kernel would grant it: one open file description).
        let first = a.try_lock("s1").unwrap().expect("free");
        assert!(a.try_lock("s1").unwrap().is_none(), "held by this table");
        assert!(a.holds("s1") && !b.holds("s1") && !a.holds("s2"));
        drop(first);
        assert!(!a.holds("s1"));
        assert!(a.try_lock("s1").unwrap().is_some(), "released");
        // A shared byte stays locked until its last holder drops it (one
        // F_UNLCK would drop it for all of them).
        let p1 = a.try_probe_journal_owner(5).unwrap().expect("shared");
        let p2 = a.try_probe_journal_owner(5).unwrap().expect("shared again");
        assert!(
            a.try_lock_journal_owner(5).unwrap().is_none(),
            "shared here"
        );
        drop(p1);
        assert!(
            b.try_lock_journal_owner(5).unwrap().is_none(),
            "one holder left"
        );
        drop(p2);
        assert!(
            b.try_lock_journal_owner(5).unwrap().is_some(),
            "the last one gone"
        );
    }

    #[test]
    fn maintenance_is_seen_by_every_table() {
        let dir = tempfile::tempdir().unwrap();
        let a = Arc::new(LockTable::open(dir.path(), true).unwrap().unwrap());
        let b = Arc::new(LockTable::open(dir.path(), true).unwrap().unwrap());
        assert!(!b.maintenance_running().unwrap());
        let m1 = a.maintenance().unwrap();
        let m2 = b.maintenance().unwrap();
        drop(m2);
        assert!(b.maintenance_running().unwrap(), "a's");
        assert!(a.maintenance_running().unwrap(), "its own");
        drop(m1);
        assert!(!b.maintenance_running().unwrap());
        assert!(!a.maintenance_running().unwrap());
        assert!(MAINTENANCE_KEY > journal_key((1 << 60) - 1, 1));
    }

    /// A session locked by another handle's maintenance (a writable open
    /// writing back an orphaned journal) is waited for; one locked by a
    /// writer is refused at once.
    #[test]
    fn a_writer_waits_out_maintenance_but_not_a_writer() {
        use crate::event::OwnedEvent;
        use crate::header::SessionHeader;
        use crate::store::{Error, Options, Store};
        let dir = tempfile::tempdir().unwrap();
        let other = Store::open(dir.path(), Options::default()).unwrap();
        let event = |seq| OwnedEvent::new("note", seq, 1, "{}").unwrap();
        other.create(SessionHeader::new("s", 1)).unwrap();
        other.append("s", &[event(0)]).unwrap();
        other.close().unwrap();
        let store = Store::open(dir.path(), Options::default()).unwrap();

        let m = Arc::new(LockTable::open(dir.path(), false).unwrap().unwrap());
        let maintenance = m.maintenance().unwrap();
        let held = m.try_lock("s").unwrap().expect("free");
        let released = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(held);
            drop(maintenance);
        });
        store
            .append("s", &[event(1)])
            .expect("waits for the maintenance");
        released.join().unwrap();
        store.close().unwrap();

        let store = Store::open(dir.path(), Options::default()).unwrap();
        let _writer = m.try_lock("s").unwrap().expect("free");
        let started = std::time::Instant::now();
        let err = store.append("s", &[event(2)]).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "no wait for a writer"
        );
    }
}
