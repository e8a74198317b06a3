//! The sessions directory: which sessions exist, and the atomic changes of
//! that set (create, import, replace, fork, delete).
//!
//! A session exists if and only if `sessions/<encoded id>/` exists and holds
//! a valid `HEADER` naming that id. There is no catalog: nothing outside a
//! session's own directory can make it disappear, and every change of the
//! set is one `rename` of a whole directory, so it is atomic for every
//! process and after a crash:
//!
//! * a new session (first append, import, fork) is built in
//!   `sessions/.staging/<uid>/` and published with
//!   `renameat2(RENAME_NOREPLACE)`: two creators of one id cannot both win;
//! * `--replace` swaps the staged directory with the live one
//!   (`RENAME_EXCHANGE`): the old session stays in place until the new one is
//!   complete and durable;
//! * a deleted (or replaced) session's directory is renamed into
//!   `sessions/.trash/` first, then removed.
//!
//! Entries of `.staging` and `.trash` are named `<lock key>-<32 hex>`, the
//! lock key (16 hex digits) being their session's writer lock
//! ([`super::locks`]): whoever builds or removes one holds that lock, so a
//! cleaner that gets the lock knows the entry is left over from a crash.
//!
//! Names starting with `.` are the registry's own: an encoded session id
//! never starts with one ([`encode_session_dir_name`]). Any other entry that
//! is not a session (no `HEADER`, a damaged one, or one naming another id)
//! is *unaccounted*: reported by [`Registry::scan`], never deleted.

use super::locks::{SessionLock, lock_key};
use crate::fsutil::{self, encode_session_dir_name};
use crate::header::SessionHeader;
use crate::headerfile;
use crate::vfs::Vfs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The directory of session directories, inside the store directory.
pub(crate) const SESSIONS_DIR: &str = "sessions";
/// Sessions being built, not yet published.
pub(crate) const STAGING_DIR: &str = ".staging";
/// Sessions deleted or replaced, being removed.
pub(crate) const TRASH_DIR: &str = ".trash";
/// The file that makes a directory a session.
pub(crate) use crate::headerfile::HEADER_FILE;
/// Stores with at least this many entries are scanned by several threads.
const PARALLEL_SCAN_MIN: usize = 512;
/// What one scan thread found: sessions, and entries that are not ones.
type ScanPart = (Vec<SessionEntry>, Vec<Unaccounted>);

/// A session's identity as its directory records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionEntry {
    /// The harness header.
    pub header: SessionHeader,
    /// Distinct per creation: salts the session's segments.
    pub uid: [u8; 16],
    /// The live directory.
    pub dir: PathBuf,
    /// The directory's identity (inode, birth time) as seen just before its
    /// `HEADER` was read, when the lookup took it: a load that finds another
    /// identity read the `HEADER` of another incarnation (a replace
    /// happened in between).
    pub found: Option<DirIdentity>,
}

/// What tells one directory from another at the same path: its inode
/// number and birth time ([`crate::vfs::Metadata::identity`]).
pub(crate) type DirIdentity = (u64, Option<std::time::SystemTime>);

/// An entry of `sessions/` that is not a readable session: kept, reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unaccounted {
    /// The directory (or file).
    pub path: PathBuf,
    /// Why it is not a session.
    pub reason: String,
}

/// Encodes a `HEADER` file (version 1; format-spec section 6).
pub(crate) fn encode_header(header: &SessionHeader, uid: &[u8; 16]) -> Vec<u8> {
    headerfile::encode(&header.to_json(), uid)
}

/// Decodes a `HEADER` file; the error says what is wrong.
pub(crate) fn decode_header(bytes: &[u8]) -> Result<(SessionHeader, [u8; 16]), String> {
    let file = headerfile::decode(bytes)?;
    let header =
        SessionHeader::from_stored_json(file.json).map_err(|v| format!("bad header JSON: {v}"))?;
    Ok((header, file.uid))
}

/// Why a session could not be looked up.
#[derive(Debug)]
pub(crate) enum LookupError {
    /// The directory exists but is not a readable session.
    Unaccounted(Unaccounted),
    /// The file system failed.
    Io(PathBuf, io::Error),
}

/// Why publishing failed.
#[derive(Debug)]
pub(crate) enum PublishError {
    /// A session with that id exists (or appeared meanwhile).
    Exists,
    /// The file system failed before the rename: nothing is visible.
    Io(PathBuf, io::Error),
    /// The rename happened but syncing it failed: the session is visible
    /// now and may or may not survive a crash (a failed fsync).
    Unsynced(PathBuf, PathBuf, io::Error),
}

/// The sessions directory of one store.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    vfs: Arc<dyn Vfs>,
    sessions: PathBuf,
    staging: PathBuf,
    trash: PathBuf,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> (PathBuf, io::Error) + '_ {
    move |e| (path.to_owned(), e)
}

impl Registry {
    /// The registry of the store in `store_dir`. Writable: creates the
    /// directories it needs (durably) and finishes removals a crash
    /// interrupted (`.trash`). Read-only: touches nothing.
    pub(crate) fn open(
        vfs: Arc<dyn Vfs>,
        store_dir: &Path,
        writable: bool,
    ) -> Result<Registry, (PathBuf, io::Error)> {
        let sessions = store_dir.join(SESSIONS_DIR);
        let r = Registry {
            staging: sessions.join(STAGING_DIR),
            trash: sessions.join(TRASH_DIR),
            sessions,
            vfs,
        };
        if writable {
            r.ensure_dir(&r.sessions, store_dir)?;
            r.ensure_dir(&r.staging, &r.sessions)?;
            r.ensure_dir(&r.trash, &r.sessions)?;
        }
        Ok(r)
    }

    fn ensure_dir(&self, dir: &Path, parent: &Path) -> Result<(), (PathBuf, io::Error)> {
        if self.vfs.exists(dir) {
            return Ok(());
        }
        match self.vfs.create_dir(dir) {
            Ok(()) => {}
            // Another process created it meanwhile.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => return Err((dir.to_owned(), e)),
        }
        self.vfs.sync_dir(parent).map_err(io_at(parent))
    }

    /// The store's directory.
    pub(crate) fn store_dir(&self) -> &Path {
        self.sessions
            .parent()
            .expect("sessions/ is inside the store")
    }

    /// Removes what a crash left in `.staging` (sessions never published,
    /// so never acknowledged) and `.trash` (sessions whose delete or
    /// replacement was already durable). An entry whose session lock
    /// `try_lock` cannot get is another live handle's work in progress and
    /// is left alone; so is any entry not named `<lock key>-...` (nothing
    /// the store cannot account for is deleted).
    pub(crate) fn clean_up(
        &self,
        try_lock: impl Fn(u64) -> io::Result<Option<SessionLock>>,
    ) -> Result<(), (PathBuf, io::Error)> {
        for dir in [&self.staging, &self.trash] {
            let names = match self.vfs.read_dir(dir) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err((dir.clone(), e)),
            };
            let mut removed = false;
            for name in names {
                let Some(key) = key_of(&name.to_string_lossy()) else {
                    continue;
                };
                let path = dir.join(&name);
                let Some(_lock) = try_lock(key).map_err(io_at(&path))? else {
                    continue;
                };
                match self.vfs.remove_dir_all(&path) {
                    Ok(()) => removed = true,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err((path, e)),
                }
            }
            if removed {
                self.vfs.sync_dir(dir).map_err(io_at(dir))?;
            }
        }
        Ok(())
    }

    /// The live directory of session `id`.
    pub(crate) fn live_dir(&self, id: &str) -> Result<PathBuf, fsutil::BadId> {
        Ok(self.sessions.join(encode_session_dir_name(id)?))
    }

    /// Reads the session at `dir`, which must be named for its id.
    fn read_entry(&self, dir: &Path) -> Result<SessionEntry, LookupError> {
        let unaccounted = |reason: String| {
            LookupError::Unaccounted(Unaccounted {
                path: dir.to_owned(),
                reason,
            })
        };
        let path = dir.join(HEADER_FILE);
        let bytes = match self.vfs.read_file(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The directory itself gone (deleted or replaced since it
                // was found): not damage, a session that is no longer there.
                if let Err(gone) = self.vfs.symlink_metadata(dir)
                    && gone.kind() == io::ErrorKind::NotFound
                {
                    return Err(LookupError::Io(path, e));
                }
                return Err(unaccounted(format!("no {HEADER_FILE} file")));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(unaccounted("not a directory".into()));
            }
            Err(e) => return Err(LookupError::Io(path, e)),
        };
        let (header, uid) =
            decode_header(&bytes).map_err(|why| unaccounted(format!("{HEADER_FILE}: {why}")))?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        match encode_session_dir_name(&header.id) {
            Ok(expected) if Some(&expected) == name.as_ref() => Ok(SessionEntry {
                header,
                uid,
                dir: dir.to_owned(),
                found: None,
            }),
            _ => Err(unaccounted(format!(
                "{HEADER_FILE} names session {:?}, whose directory would be another",
                header.id
            ))),
        }
    }

    /// Session `id`: `Ok(None)` when it does not exist.
    pub(crate) fn get(&self, id: &str) -> Result<Option<SessionEntry>, LookupError> {
        let Ok(dir) = self.live_dir(id) else {
            return Ok(None);
        };
        let found = match self.vfs.symlink_metadata(&dir) {
            Ok(m) => m.identity(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(LookupError::Io(dir, e)),
        };
        match self.read_entry(&dir) {
            Ok(entry) if entry.header.id == id => Ok(Some(SessionEntry {
                found: Some(found),
                ..entry
            })),
            // A hash collision of two long ids: the directory is another's.
            Ok(_) => Ok(None),
            // Deleted between the two looks.
            Err(LookupError::Io(_, e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every session, and every entry that is not one.
    pub(crate) fn scan(
        &self,
    ) -> Result<(Vec<SessionEntry>, Vec<Unaccounted>), (PathBuf, io::Error)> {
        let names = match self.vfs.read_dir(&self.sessions) {
            Ok(n) => n,
            // A read-only open of a store that never held a session.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err((self.sessions.clone(), e)),
        };
        // The registry's own entries start with a dot.
        let names: Vec<_> = names
            .into_iter()
            .filter(|n| n.as_encoded_bytes().first() != Some(&b'.'))
            .collect();
        // Reading a HEADER is an open, a read and a close: syscall-bound,
        // so a large store is read by a few threads at once (1.5x faster
        // with 2 threads on 2 cores: `read/list/10000` in benches/store.rs,
        // BENCHMARKS.md); a small one in order, which also keeps the
        // fault-injection runs' operation order deterministic.
        let threads = if names.len() >= PARALLEL_SCAN_MIN {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
        } else {
            1
        };
        let mut parts = if threads > 1 {
            let chunk = names.len().div_ceil(threads);
            std::thread::scope(|scope| {
                let handles: Vec<_> = names
                    .chunks(chunk)
                    .map(|part| scope.spawn(move || self.scan_part(part)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a scan thread does not panic"))
                    .collect::<Result<Vec<_>, _>>()
            })?
        } else {
            vec![self.scan_part(&names)?]
        };
        let (mut sessions, mut unaccounted) = parts.pop().unwrap_or_default();
        for (s, u) in parts {
            sessions.extend(s);
            unaccounted.extend(u);
        }
        sessions.sort_by(|a, b| a.header.id.cmp(&b.header.id));
        unaccounted.sort_by(|a, b| a.path.cmp(&b.path));
        Ok((sessions, unaccounted))
    }

    /// Reads the sessions directory entries `names` (see [`scan`](Registry::scan)).
    fn scan_part(&self, names: &[std::ffi::OsString]) -> Result<ScanPart, (PathBuf, io::Error)> {
        let mut sessions = Vec::with_capacity(names.len());
        let mut unaccounted = Vec::new();
        for name in names {
            let dir = self.sessions.join(name);
            match self.read_entry(&dir) {
                Ok(entry) => sessions.push(entry),
                Err(LookupError::Unaccounted(u)) => unaccounted.push(u),
                // Deleted by another process between the listing and the read.
                Err(LookupError::Io(_, e)) if e.kind() == io::ErrorKind::NotFound => {}
                Err(LookupError::Io(path, e)) => return Err((path, e)),
            }
        }
        Ok((sessions, unaccounted))
    }

    /// Creates `.staging/<uid>/` with the session's `HEADER` written and
    /// synced. The caller fills it (segments, `LINEAGE`) and then
    /// [`publish`](Registry::publish)es or [`replace`](Registry::replace)s it.
    pub(crate) fn stage(
        &self,
        header: &SessionHeader,
        uid: &[u8; 16],
    ) -> Result<PathBuf, (PathBuf, io::Error)> {
        let dir = self
            .staging
            .join(format!("{:016x}-{}", lock_key(&header.id), hex(uid)));
        self.vfs.create_dir(&dir).map_err(io_at(&dir))?;
        let path = dir.join(HEADER_FILE);
        let written = (|| {
            let f = self.vfs.create_new(&path)?;
            f.write_all_at(&encode_header(header, uid), 0)?;
            f.sync_data()
        })();
        if let Err(e) = written {
            let _ = self.vfs.remove_dir_all(&dir);
            return Err((path, e));
        }
        Ok(dir)
    }

    /// Publishes a staged session under `id`, failing with
    /// [`PublishError::Exists`] if that id exists. Durable when it returns:
    /// the staged directory's entries, then both parents of the rename.
    pub(crate) fn publish(&self, staged: &Path, id: &str) -> Result<PathBuf, PublishError> {
        let live = self
            .live_dir(id)
            .map_err(|e| PublishError::Io(staged.to_owned(), io::Error::other(e)))?;
        let io = |p: &Path| {
            let p = p.to_owned();
            move |e| PublishError::Io(p, e)
        };
        // Everything in the session must be reachable before it is visible.
        self.vfs.sync_dir(staged).map_err(io(staged))?;
        match self.vfs.rename_noreplace(staged, &live) {
            Ok(()) => {}
            Err(e)
                if e.kind() == io::ErrorKind::AlreadyExists
                    || e.raw_os_error() == Some(libc::ENOTEMPTY) =>
            {
                return Err(PublishError::Exists);
            }
            Err(e) => return Err(PublishError::Io(live, e)),
        }
        // The staging entry's removal need not be durable for the new name
        // to be, but a file system that journals the two directories apart
        // could otherwise show the directory in both after a crash.
        for dir in [&self.sessions, &self.staging] {
            self.vfs
                .sync_dir(dir)
                .map_err(|e| PublishError::Unsynced(live.clone(), dir.clone(), e))?;
        }
        Ok(live)
    }

    /// Swaps a staged session in for the live session `id` (which must
    /// exist), then removes the old one. At every instant one of the two is
    /// in place; the swap is durable when this returns. A failure before
    /// the exchange is [`PublishError::Io`] (the old session in place); a
    /// failed sync after it is [`PublishError::Unsynced`] (the new one
    /// visible, its durability unknown). The old one's removal is best
    /// effort: what stays in staging is discarded at the next open.
    pub(crate) fn replace(&self, staged: &Path, id: &str) -> Result<PathBuf, PublishError> {
        let live = self
            .live_dir(id)
            .map_err(|e| PublishError::Io(staged.to_owned(), io::Error::other(e)))?;
        self.vfs
            .sync_dir(staged)
            .map_err(|e| PublishError::Io(staged.to_owned(), e))?;
        self.vfs
            .exchange(staged, &live)
            .map_err(|e| PublishError::Io(live.clone(), e))?;
        for dir in [&self.sessions, &self.staging] {
            self.vfs
                .sync_dir(dir)
                .map_err(|e| PublishError::Unsynced(live.clone(), dir.clone(), e))?;
        }
        // `staged` now holds the old session.
        let _ = self.discard(staged);
        Ok(live)
    }

    /// Removes session `id` (live at `dir`): its directory is renamed into
    /// the trash (durably: from then on the session does not exist), then
    /// removed. The caller holds the session's writer lock.
    pub(crate) fn remove(&self, dir: &Path, id: &str) -> Result<(), (PathBuf, io::Error)> {
        let gone = self.trash.join(format!(
            "{:016x}-{}",
            lock_key(id),
            hex(&fsutil::random_id())
        ));
        self.vfs.rename(dir, &gone).map_err(io_at(dir))?;
        self.vfs
            .sync_dir(&self.sessions)
            .map_err(io_at(&self.sessions))?;
        self.vfs.sync_dir(&self.trash).map_err(io_at(&self.trash))?;
        self.vfs.remove_dir_all(&gone).map_err(io_at(&gone))?;
        self.vfs.sync_dir(&self.trash).map_err(io_at(&self.trash))
    }

    /// Throws away a staged (never published, or replaced) session. The
    /// caller holds the session's writer lock.
    pub(crate) fn discard(&self, staged: &Path) -> Result<(), (PathBuf, io::Error)> {
        let name = staged.file_name().unwrap_or_default().to_string_lossy();
        let key = key_of(&name).unwrap_or_default();
        let gone = self
            .trash
            .join(format!("{key:016x}-{}", hex(&fsutil::random_id())));
        self.vfs.rename(staged, &gone).map_err(io_at(staged))?;
        self.vfs.remove_dir_all(&gone).map_err(io_at(&gone))?;
        self.vfs.sync_dir(&self.trash).map_err(io_at(&self.trash))
    }
}

/// The lock key an entry of `.staging` or `.trash` is named by.
fn key_of(name: &str) -> Option<u64> {
    let (key, _) = name.split_once('-')?;
    if key.len() != 16 {
        return None;
    }
    u64::from_str_radix(key, 16).ok()
}

/// 32 lower-case hex digits.
pub(crate) fn hex(bytes: &[u8; 16]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_header_the_store_takes_reads_back_as_it_was() {
        for version in [0, 1, 99, u64::MAX] {
            let mut h = SessionHeader::new("v", 1);
            h.version = version;
            let (back, _) = decode_header(&encode_header(&h, &[1; 16])).unwrap();
            assert_eq!(back, h);
        }
    }

    #[test]
    fn header_round_trips_and_every_damage_is_refused() {
        let mut h = SessionHeader::new("s/1", 7);
        h.cwd = Some("/w".into());
        let uid = [9u8; 16];
        let bytes = encode_header(&h, &uid);
        assert_eq!(decode_header(&bytes).unwrap(), (h, uid));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(decode_header(&b).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(decode_header(&bytes[..n]).is_err(), "cut at {n} accepted");
        }
    }
}
