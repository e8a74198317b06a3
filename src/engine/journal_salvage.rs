//! Journal files replay refuses (`format-spec.md` section 11, "Damage"):
//! reporting them, and salvaging them when a person asks.
//!
//! A damaged orphaned journal may hold the only copy of acknowledged
//! batches of any session, so while it lies in `journal/` no stored session
//! can be taken for writing, and the store never removes it. Salvage is the
//! way out: it writes back every entry that can still be read (the same
//! checked, idempotent write-back as replay), then moves the file to
//! `journal/damaged/`, where it is kept for a person to examine. After that,
//! a session whose last acknowledged batches were only in the unreadable
//! part of the file loads without them (a torn tail is cut as usual): the
//! report says how much could not be read.

use super::error::{Error, Result};
use super::handle::Store;
use crate::journal::{self, Entry};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a salvage waits for the writer of another handle that took one
/// of a damaged file's sessions and has not written its records back (it
/// reads the file, refuses the damage and lets the session go within
/// milliseconds; a writer that stays is reported instead).
const TAKER_WAIT: Duration = Duration::from_secs(5);

/// Where salvaged journal files are kept, inside the journal directory.
pub(crate) const DAMAGED_DIR: &str = "damaged";

/// A journal file replay refuses. While it lies in `journal/` (and its
/// writer is gone), no stored session can be taken for writing:
/// [`Store::salvage_journals`] is the way out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DamagedJournal {
    /// The file.
    pub path: PathBuf,
    /// Where the damage is.
    pub offset: u64,
    /// What is wrong.
    pub reason: String,
}

/// What [`Store::salvage_journals`] did with one damaged journal file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalSalvage {
    /// The damage, as [`Store::damaged_journals`] reports it (`path` is
    /// where the file was).
    pub damage: DamagedJournal,
    /// Where the file is kept now (`journal/damaged/`, or where it was
    /// when it could not move).
    pub kept: PathBuf,
    /// Whether the file moved to `journal/damaged/`. It stays in
    /// `journal/` (and keeps refusing takes of stored sessions) while a
    /// session of it is written by another handle that took it after the
    /// damage and has not written its records back: `skipped` names it;
    /// run the salvage again once that handle lets the session go.
    pub moved: bool,
    /// Entries that could be read.
    pub entries: u64,
    /// Per session: how many records were written back into its segments
    /// (0 when they were all there already).
    pub replayed: Vec<(String, u64)>,
    /// Sessions whose entries were not written back, and why (another
    /// record where the journal puts one, the session removed since, taken
    /// by a writer that replayed it before the damage).
    pub skipped: Vec<(String, String)>,
    /// Entries whose checksum holds but that do not parse: offset, reason.
    pub unparsed: Vec<(u64, String)>,
    /// Where reading stopped (the first torn or failing entry).
    pub end: u64,
    /// Non-zero bytes from `end` on, not read: a torn tail, or entries
    /// hidden behind damage (nothing can tell which).
    pub unread: u64,
}

impl Store {
    /// The journal files of the store that replay refuses, whether their
    /// writer lives or not: a damaged header, an entry whose checksum holds
    /// but that does not parse, a damaged entry with a valid one after it,
    /// another store's id. A file a crash cut
    /// while it was being created (a header, zeros after) is not damage.
    /// Works on read-only handles; `verify` reports these.
    pub fn damaged_journals(&self) -> Result<Vec<DamagedJournal>> {
        self.open_handle()?;
        let mut damaged = Vec::new();
        for (_, path) in self.journal_files()? {
            let read = || match self.inner.vfs.read_file(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(Error::Io {
                    path: path.clone(),
                    source,
                }),
            };
            let Some(bytes) = read()? else {
                continue;
            };
            let Err(e) = self.scan_journal(&path, &bytes) else {
                continue;
            };
            let first = damage_of(e)?;
            // A live owner may have been writing an entry while it was
            // read, and the next one by the end of the read (a damaged
            // entry with a valid one after it): the verdict stands only if
            // a second read agrees (an owner finishes one small entry long
            // before that).
            let Some(again) = read()? else {
                continue;
            };
            if let Err(e) = self.scan_journal(&path, &again) {
                let second = damage_of(e)?;
                if second.offset == first.offset {
                    damaged.push(second);
                }
            }
        }
        Ok(damaged)
    }

    /// Salvages every damaged journal file whose writer is gone: writes
    /// back into their segments the records of every entry that can still
    /// be read (checked against the segment's identity, never over another
    /// record), then moves the file to `journal/damaged/` (kept, never
    /// deleted), so the sessions can be taken for writing again.
    ///
    /// What the unreadable part of a file held is lost to the store: a
    /// session whose last acknowledged batches were only there loads
    /// without them. The report says how much could not be read. A file
    /// stays where it is if writing a session back fails with an I/O error
    /// (the error is returned; run it again).
    ///
    /// ```
    /// # use sessionlog::store::{Options, Store};
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path(), Options::default())?;
    /// for damaged in store.damaged_journals()? {
    ///     println!("{} at offset {}: {}", damaged.path.display(), damaged.offset, damaged.reason);
    /// }
    /// for s in store.salvage_journals()? {
    ///     println!("kept {} ({} bytes unread)", s.kept.display(), s.unread);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn salvage_journals(&self) -> Result<Vec<JournalSalvage>> {
        self.writable()?;
        let Some(locks) = self.inner.locks.clone() else {
            return Ok(Vec::new());
        };
        // It locks sessions it does not write: writers that meet those
        // locks wait (format-spec section 9).
        let _maintenance = locks.maintenance().map_err(|source| Error::Io {
            path: locks.path().to_owned(),
            source,
        })?;
        let mut done = Vec::new();
        let mut files = self.journal_files()?.into_iter();
        let mut retry: Option<(u64, PathBuf)> = None;
        let mut pause = Duration::from_millis(1);
        // How long a file is taken again for a writer of another handle
        // that has not written back its records yet (see below).
        let mut deadline = Instant::now();
        let mut again = |retry: &mut Option<(u64, PathBuf)>, number, path| {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
            *retry = Some((number, path));
        };
        loop {
            let (number, path, retried) = match retry.take() {
                Some((number, path)) => (number, path, true),
                None => match files.next() {
                    Some((number, path)) => {
                        deadline = Instant::now() + TAKER_WAIT;
                        (number, path, false)
                    }
                    None => break,
                },
            };
            // Exclusive: no replayer reads it while it is moved.
            let Some(orphan) = self.open_orphan(number, &path, true)? else {
                // Taken again, it was an orphan: a writer taking one of
                // its sessions reads it (shared) now.
                if retried && Instant::now() < deadline && self.inner.vfs.exists(&path) {
                    again(&mut retry, number, path);
                }
                continue;
            };
            let damage = match self.scan_journal(&path, &orphan.bytes) {
                Ok(_) => continue,
                Err(e) => damage_of(e)?,
            };
            let read = journal::salvage(&orphan.bytes);
            let mut by_session: BTreeMap<&str, Vec<&Entry<'_>>> = BTreeMap::new();
            for en in &read.entries {
                by_session.entry(en.session).or_default().push(en);
            }
            // A thread of this handle using one of its sessions may be
            // taking it, about to wait for this file's replay lock with
            // the session's slot held: waiting for the slot here would
            // wait for each other for good (F60). Let the file go (that
            // taker reads it, and refuses the damage) and take it again.
            let held: Option<Vec<bool>> = by_session.keys().map(|id| self.holds(id)).collect();
            let Some(held) = held else {
                drop(orphan);
                again(&mut retry, number, path);
                continue;
            };
            let (mut replayed, mut skipped) = (Vec::new(), Vec::new());
            let mut moved = true;
            let mut taken_meanwhile = false;
            for ((id, list), held) in by_session.into_iter().zip(held) {
                if held {
                    // Taken by this handle, so before the damage: its
                    // writer replayed (or its old writer synced) them then.
                    skipped.push((id.to_owned(), "this handle writes it".to_owned()));
                    continue;
                }
                let held = locks.try_lock(id).map_err(|source| Error::Io {
                    path: locks.path().to_owned(),
                    source,
                })?;
                if held.is_none() {
                    // Taken before the damage, its writer replayed the
                    // file then, and every record is in place. Taken just
                    // now, its writer may not have read the file yet: if
                    // it lists the journals only after the move, it loads
                    // the session without them. So the file moves only
                    // once its records are in place; such a writer reads
                    // the file meanwhile, refuses the damage and lets the
                    // session go, and the next pass writes them back.
                    let in_place = match self.entry(id) {
                        Ok(Some(e)) => self.entries_in_place(&e.dir, &list),
                        Ok(None) => true,
                        Err(_) => false,
                    };
                    if !in_place {
                        taken_meanwhile = true;
                        if Instant::now() < deadline {
                            break;
                        }
                        moved = false;
                        skipped.push((
                            id.to_owned(),
                            "another handle took it, and its records are not in place yet: the file stays in journal/ (run the salvage again once that handle lets the session go)".to_owned(),
                        ));
                        continue;
                    }
                    skipped.push((
                        id.to_owned(),
                        "another handle writes it (its records are in place)".to_owned(),
                    ));
                    continue;
                }
                let entry = match self.entry(id) {
                    Ok(Some(e)) => e,
                    Ok(None) => {
                        skipped.push((id.to_owned(), "no such session (removed since)".into()));
                        continue;
                    }
                    Err(e @ Error::Corrupt { .. }) => {
                        skipped.push((id.to_owned(), e.to_string()));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                match self.replay_entries(id, &entry.dir, &list) {
                    Ok(n) => replayed.push((id.to_owned(), n)),
                    Err(e @ Error::Corrupt { .. }) => skipped.push((id.to_owned(), e.to_string())),
                    Err(e) => return Err(e),
                }
            }
            if taken_meanwhile && moved {
                drop(orphan);
                again(&mut retry, number, path);
                continue;
            }
            let kept = if moved {
                self.keep_damaged(&path)?
            } else {
                path.clone()
            };
            done.push(JournalSalvage {
                damage,
                kept,
                moved,
                entries: read.entries.len() as u64,
                replayed,
                skipped,
                unparsed: read.unparsed,
                end: read.end,
                unread: read.unread,
            });
        }
        Ok(done)
    }

    /// Whether this handle holds session `id`'s writer lock; `None` while
    /// a thread of this handle uses the session (never waited for: it may
    /// be taking the session and waiting for a journal the caller holds).
    fn holds(&self, id: &str) -> Option<bool> {
        let session = self.inner.sessions.read().expect("lock").get(id).cloned();
        let Some(session) = session else {
            return Some(false);
        };
        match session.try_lock() {
            Ok(s) => Some(s.lock.is_some()),
            Err(std::sync::TryLockError::WouldBlock) => None,
            Err(std::sync::TryLockError::Poisoned(_)) => panic!("session lock poisoned"),
        }
    }

    /// Moves journal file `path` into `journal/damaged/`, durably: the new
    /// name synced before the old one's removal, so a crash leaves it in
    /// one place or the other, never neither.
    fn keep_damaged(&self, path: &std::path::Path) -> Result<PathBuf> {
        let vfs = &*self.inner.vfs;
        let journal_dir = self.journal_dir();
        let dir = journal_dir.join(DAMAGED_DIR);
        let io_at = |path: &std::path::Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        match vfs.create_dir(&dir) {
            Ok(()) => vfs.sync_dir(&journal_dir).map_err(io_at(&journal_dir))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_at(&dir)(e)),
        }
        let name = path.file_name().expect("a journal file name").to_owned();
        let mut kept = dir.join(&name);
        for n in 1.. {
            match vfs.rename_noreplace(path, &kept) {
                Ok(()) => break,
                // Never over a file kept before.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => {
                    let mut other = name.clone();
                    other.push(format!(".{n}"));
                    kept = dir.join(other);
                }
                Err(e) => return Err(io_at(&kept)(e)),
            }
        }
        vfs.sync_dir(&dir).map_err(io_at(&dir))?;
        vfs.sync_dir(&journal_dir).map_err(io_at(&journal_dir))?;
        Ok(kept)
    }
}

/// The damage a `Corrupt` from [`Store::scan_journal`] names; other errors
/// pass through.
fn damage_of(e: Error) -> Result<DamagedJournal> {
    match e {
        Error::Corrupt {
            segment,
            offset,
            reason,
            ..
        } => Ok(DamagedJournal {
            path: segment,
            offset,
            reason,
        }),
        other => Err(other),
    }
}
