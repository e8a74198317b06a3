//! The store-wide journal of one handle: group commit of durable appends
//! across sessions (issue 18; `format-spec.md` section 11).
//!
//! An append with [`Options::journal`](super::Options) writes its record to
//! the session's segment (unsynced), then copies it into this journal and
//! waits until a sync of the journal covers it. Whichever waiting appender
//! finds no sync running becomes the leader: it syncs the journal once for
//! every entry written so far, and wakes the others. So `n` appends of `n`
//! sessions waiting together cost one `fdatasync`, not `n`. The end of a
//! sync wakes only the appenders it covers, and one of those written during
//! it to lead the next (an appender woken only to sleep again costs two
//! context switches for nothing). Each waiting appender parks its thread
//! and is unparked by name; one a sync covered returns on an atomic copy
//! of the synced count, without taking the journal's lock again (with a
//! condition variable, every woken appender re-took the lock in turn).
//!
//! Journal files have a fixed size, zero-filled and synced when created (off
//! the acknowledgement path: the background thread keeps a spare ready), so
//! a sync writes data blocks only. When the current file is full the next
//! one takes over and the full one is *retired*: the background thread
//! syncs every dirty session, after which no retired entry is needed, and
//! removes the retired files. Each file is named by a random number whose
//! owner byte in `LOCK` this handle holds for the file's life: a file whose
//! owner byte is free belongs to a handle that is gone (`replay.rs`).

use super::locks::{LockTable, SessionLock};
use crate::journal::{self, Entry, JournalHeader};
use crate::vfs::{Vfs, VfsFile};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, Thread};

/// An I/O failure on a journal file.
pub(super) type JournalIoError = (PathBuf, io::Error);

/// One journal file this handle owns.
struct JournalFile {
    number: u64,
    path: PathBuf,
    file: Arc<dyn VfsFile>,
    /// The owner byte, held for the file's life.
    _owner: SessionLock,
}

struct State {
    current: JournalFile,
    /// Where the next entry goes in `current`.
    end: u64,
    /// Entries written (all files), and entries a sync covered.
    written: u64,
    synced: u64,
    /// A leader is syncing.
    syncing: bool,
    /// The appenders waiting for a sync: their entry's number and thread.
    /// Entered under the lock before parking, removed by whoever wakes them.
    waiting: Vec<(u64, Thread)>,
    /// A sync failed: the kernel may have dropped the pages, so no later
    /// entry can be acknowledged (the sessions involved are poisoned).
    failed: bool,
    /// Full files whose sessions are not known synced yet.
    retired: Vec<JournalFile>,
    /// The next file, made ready in the background.
    spare: Option<JournalFile>,
    buf: Vec<u8>,
}

/// The journal of one store handle.
pub(super) struct Journal {
    dir: PathBuf,
    vfs: Arc<dyn Vfs>,
    locks: Arc<LockTable>,
    store_id: [u8; 16],
    file_size: u64,
    /// The numbers of this handle's files, entered before a file is created
    /// and left after it is removed: replay must never probe one of them
    /// (a read lock through this handle's own descriptor would downgrade,
    /// and its release drop, the owner lock).
    owned: Mutex<HashSet<u64>>,
    state: Mutex<State>,
    /// `State::synced`, stored (under the lock) before the appenders it
    /// covers are unparked: they read it instead of taking the lock.
    synced_mark: AtomicU64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("dir", &self.dir).finish()
    }
}

impl Journal {
    /// Opens a new journal for one handle of the store in `store_dir`:
    /// creates `journal/` when needed and this handle's first file.
    pub(super) fn open(
        store_dir: &Path,
        vfs: Arc<dyn Vfs>,
        locks: Arc<LockTable>,
        store_id: [u8; 16],
        file_size: u64,
    ) -> Result<Journal, JournalIoError> {
        let dir = store_dir.join(journal::JOURNAL_DIR);
        if !vfs.exists(&dir) {
            match vfs.create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err((dir, e)),
            }
        }
        // The directory's name must be durable before a file in it is,
        // also when this handle found it: its creator may have been killed
        // (or may still be running) before its own sync of the store
        // directory, and a directory found in the page cache is not known
        // durable.
        vfs.sync_dir(store_dir)
            .map_err(|e| (store_dir.to_owned(), e))?;
        let size = file_size.max(1 << 16);
        let owned = Mutex::new(HashSet::new());
        let current = new_file(&dir, &*vfs, &locks, store_id, size, &owned)?;
        Ok(Journal {
            dir,
            vfs,
            locks,
            store_id,
            file_size: size,
            owned,
            state: Mutex::new(State {
                current,
                end: journal::HEADER_LEN as u64,
                written: 0,
                synced: 0,
                syncing: false,
                waiting: Vec::new(),
                failed: false,
                retired: Vec::new(),
                spare: None,
                buf: Vec::new(),
            }),
            synced_mark: AtomicU64::new(0),
        })
    }

    /// The largest entry the journal takes; a larger record is synced in
    /// its segment instead (a large batch gains nothing from sharing a
    /// sync, and copying it twice would cost).
    pub(super) fn max_entry(&self) -> usize {
        (self.file_size as usize - journal::HEADER_LEN) / 4
    }

    /// Whether a record of session `id` goes through the journal: its whole
    /// entry (id included: ids may be as long as a `HEADER` allows) within
    /// [`Journal::max_entry`], so it fits a file without changing its
    /// length, and the id within the entry's 16-bit length field (a longer
    /// one would be written cut, and replayed as another session's). Any
    /// other record is synced in its segment.
    pub(super) fn takes(&self, id: &str, record: &[u8]) -> bool {
        id.len() <= journal::MAX_ID_LEN
            && journal::ENTRY_OVERHEAD + id.len() + record.len() <= self.max_entry()
    }

    /// Whether `number` is one of this handle's files.
    pub(super) fn owns(&self, number: u64) -> bool {
        self.owned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&number)
    }

    fn new_file(&self) -> Result<JournalFile, JournalIoError> {
        new_file(
            &self.dir,
            &*self.vfs,
            &self.locks,
            self.store_id,
            self.file_size,
            &self.owned,
        )
    }

    fn remove(&self, f: JournalFile) {
        let _ = self.vfs.remove_file(&f.path);
        let number = f.number;
        drop(f); // the owner byte, after the file is gone
        self.owned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&number);
    }

    /// Writes `entry` and returns once a sync of the journal covers it.
    pub(super) fn commit(&self, entry: &Entry<'_>) -> Result<(), JournalIoError> {
        if !self.takes(entry.session, entry.record) {
            // The caller syncs such a record in its segment instead.
            return Err((
                self.dir.clone(),
                io::Error::other("an entry the journal does not take"),
            ));
        }
        let (lsn, mut st) = self.write(entry)?;
        loop {
            if st.synced >= lsn {
                return Ok(());
            }
            if st.failed {
                return Err(self.failed_error(&st));
            }
            if !st.syncing {
                break;
            }
            // Wait for a sync that covers the entry. Whoever wakes this
            // thread removed it from `waiting` first; a wake-up that finds
            // it still there is spurious, and it waits again.
            st.waiting.push((lsn, thread::current()));
            drop(st);
            thread::park();
            // `unpark` makes what its caller did before visible here.
            if self.synced_mark.load(Ordering::Acquire) >= lsn {
                return Ok(());
            }
            // Woken to lead, by a failure, or for nothing: look again.
            st = self.state.lock().expect("journal lock");
            let me = thread::current().id();
            st.waiting.retain(|(_, t)| t.id() != me);
        }
        // The leader: one sync for every entry written so far.
        st.syncing = true;
        let target = st.written;
        let file = st.current.file.clone();
        let path = st.current.path.clone();
        drop(st);
        let result = file.sync_data();
        let mut st = self.state.lock().expect("journal lock");
        st.syncing = false;
        match &result {
            Ok(()) => st.synced = st.synced.max(target),
            Err(_) => st.failed = true,
        }
        let wake = self.to_wake(&mut st);
        drop(st);
        wake.into_iter().for_each(|t| t.unpark());
        result.map_err(|e| (path, e))
    }

    /// Publishes `synced` and takes out of `waiting` the appenders to wake:
    /// after a failure all (nobody may sleep on: each must see it); else
    /// those the synced count covers and, when entries are left unsynced
    /// and no sync runs, the first of their appenders, to lead the next.
    fn to_wake(&self, st: &mut State) -> Vec<Thread> {
        self.synced_mark.store(st.synced, Ordering::Release);
        if st.failed {
            return st.waiting.drain(..).map(|(_, t)| t).collect();
        }
        let synced = st.synced;
        let mut wake = Vec::new();
        st.waiting.retain(|(lsn, t)| {
            let covered = *lsn <= synced;
            if covered {
                wake.push(t.clone());
            }
            !covered
        });
        if !st.syncing && st.written > synced {
            let first = (0..st.waiting.len()).min_by_key(|&i| st.waiting[i].0);
            if let Some(i) = first {
                wake.push(st.waiting.swap_remove(i).1);
            }
        }
        wake
    }

    /// Marks the journal failed and wakes every waiting appender. Each must
    /// see the failure: one woken to lead the next sync that returns with it
    /// would otherwise leave the others parked for good.
    fn fail(&self, st: &mut State) {
        st.failed = true;
        self.to_wake(st).into_iter().for_each(|t| t.unpark());
    }

    fn failed_error(&self, st: &State) -> JournalIoError {
        (
            st.current.path.clone(),
            io::Error::other("an earlier sync of this journal failed"),
        )
    }

    /// Writes one entry; returns its number (1, 2, ...) and the state, still
    /// locked (so the commit need not take the lock again).
    fn write(
        &self,
        entry: &Entry<'_>,
    ) -> Result<(u64, std::sync::MutexGuard<'_, State>), JournalIoError> {
        let mut st = self.state.lock().expect("journal lock");
        if st.failed {
            return Err(self.failed_error(&st));
        }
        let len = entry.framed_len() as u64;
        if st.end + len > self.file_size {
            self.switch(&mut st)?;
        }
        let mut buf = std::mem::take(&mut st.buf);
        buf.clear();
        entry.encode(&mut buf);
        let at = st.end;
        let written = st.current.file.write_all_at(&buf, at);
        st.buf = buf;
        if let Err(e) = written {
            // What landed is unknown and nothing after it may be trusted:
            // later entries would follow a torn one (which ends the scan).
            self.fail(&mut st);
            return Err((st.current.path.clone(), e));
        }
        st.end += len;
        st.written += 1;
        Ok((st.written, st))
    }

    /// The current file is full: sync it (so every entry in it is durable
    /// before the next file's entries are acknowledged), retire it, and go
    /// on in the spare (or a new file).
    fn switch(&self, st: &mut State) -> Result<(), JournalIoError> {
        if let Err(e) = st.current.file.sync_data() {
            self.fail(st);
            return Err((st.current.path.clone(), e));
        }
        st.synced = st.written;
        self.to_wake(st).into_iter().for_each(|t| t.unpark());
        let next = match st.spare.take() {
            Some(f) => f,
            None => self.new_file()?,
        };
        let full = std::mem::replace(&mut st.current, next);
        st.retired.push(full);
        st.end = journal::HEADER_LEN as u64;
        Ok(())
    }

    /// The background step: makes a spare file ready, and when files were
    /// retired, runs `sync_sessions` (which must sync every session this
    /// handle wrote) and then removes them. Errors are kept for later: the
    /// files stay, and are replayed by the sessions' next writers if this
    /// handle never manages.
    pub(super) fn maintain(&self, sync_sessions: impl FnOnce() -> bool) {
        let need_spare = {
            // Made once the current file is half full: an idle handle makes
            // no file it does not need.
            let st = self.state.lock().expect("journal lock");
            st.spare.is_none() && st.end > self.file_size / 2
        };
        if need_spare && let Ok(f) = self.new_file() {
            self.state.lock().expect("journal lock").spare = Some(f);
        }
        let retired = self.state.lock().expect("journal lock").retired.len();
        if retired == 0 || !sync_sessions() {
            return;
        }
        // Only the files retired before the sessions were synced.
        let done: Vec<JournalFile> = {
            let mut st = self.state.lock().expect("journal lock");
            st.retired.drain(..retired).collect()
        };
        for f in done {
            // Not synced: a removal a crash undoes leaves a file whose
            // entries are all in their segments already (replay finds
            // them there and writes nothing).
            self.remove(f);
        }
    }

    /// At close, after every session was synced and released: removes
    /// every file of this handle. With `all_synced` false (a session could
    /// not be synced) the files stay for the sessions' next writers.
    pub(super) fn close(&self, all_synced: bool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !all_synced || st.failed {
            return;
        }
        let mut files: Vec<JournalFile> = st.retired.drain(..).collect();
        files.extend(st.spare.take());
        drop(st);
        for f in files {
            self.remove(f);
        }
        // The current file goes with the handle (its owner byte too).
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.vfs.remove_file(&st.current.path);
    }
}

/// A number for a new journal file: random enough that two handles never
/// pick one (and if they did, the owner lock would refuse the second).
fn new_number() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = crc32fast::Hasher::new();
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let hi = u64::from(h.finalize());
    (hi << 28 ^ nanos as u64) & ((1 << 60) - 1)
}

/// Creates, zero-fills and syncs a new journal file with its owner lock
/// held, and syncs the directory: its name must be durable before any
/// entry in it is acknowledged.
fn new_file(
    dir: &Path,
    vfs: &dyn Vfs,
    locks: &Arc<LockTable>,
    store_id: [u8; 16],
    size: u64,
    owned: &Mutex<HashSet<u64>>,
) -> Result<JournalFile, JournalIoError> {
    let (number, owner) = loop {
        let n = new_number();
        if !owned.lock().expect("journal lock").insert(n) {
            continue;
        }
        let lock = locks
            .try_lock_journal_owner(n)
            .map_err(|e| (locks.path().to_owned(), e));
        match lock {
            Ok(Some(lock)) if !vfs.exists(&dir.join(journal::file_name(n))) => break (n, lock),
            other => {
                owned.lock().expect("journal lock").remove(&n);
                other?;
            }
        }
    };
    let path = dir.join(journal::file_name(number));
    let file: Arc<dyn VfsFile> = Arc::from(vfs.create_new(&path).map_err(|e| (path.clone(), e))?);
    let made = (|| -> io::Result<()> {
        let header = JournalHeader { number, store_id }.encode();
        file.write_all_at(&header, 0)?;
        let zeros = vec![0u8; 1 << 20];
        let mut at = header.len() as u64;
        while at < size {
            let n = (size - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        file.sync_all()?;
        vfs.sync_dir(dir)
    })();
    if let Err(e) = made {
        let _ = vfs.remove_file(&path);
        drop(owner);
        owned.lock().expect("journal lock").remove(&number);
        return Err((path, e));
    }
    Ok(JournalFile {
        number,
        path,
        file,
        _owner: owner,
    })
}
