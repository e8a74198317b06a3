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

use crate::fsutil::fnv1a_128;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// The open lock file of one store handle.
#[derive(Debug)]
pub(crate) struct LockTable {
    file: File,
    path: PathBuf,
}

/// A held writer lock; released when dropped.
#[derive(Debug)]
pub(crate) struct SessionLock {
    table: Arc<LockTable>,
    key: u64,
}

impl Drop for SessionLock {
    fn drop(&mut self) {
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
            Ok(file) => Ok(Some(LockTable { file, path })),
            // A read-only handle on a store no writer ever opened.
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => Ok(None),
            // A read-only handle without write permission: it can still ask.
            Err(e) if !create && e.kind() == io::ErrorKind::PermissionDenied => {
                let file = File::open(&path)?;
                Ok(Some(LockTable { file, path }))
            }
            Err(e) => Err(e),
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
        self.fcntl(libc::F_OFD_SETLKW, libc::F_RDLCK as i16, key)?;
        Ok(Some(SessionLock {
            table: self.clone(),
            key,
        }))
    }

    fn try_key(self: &Arc<Self>, key: u64, kind: i16) -> io::Result<Option<SessionLock>> {
        match self.fcntl(libc::F_OFD_SETLK, kind, key) {
            Ok(_) => Ok(Some(SessionLock {
                table: self.clone(),
                key,
            })),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
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
}
