//! Replaying the journals of handles that are gone (issue 18;
//! `format-spec.md` section 11).
//!
//! A journaled append is acknowledged once its journal entry is synced; its
//! segment is synced later. If the handle dies in between (a crash, a power
//! loss), the segment may lack records the journal holds. The journal file's
//! owner byte in `LOCK` is then free, and:
//!
//! - whoever takes a session for writing first replays that session's
//!   entries from every orphaned journal, before the torn-tail cut of the
//!   load (so nothing acknowledged is cut); the session's writer lock makes
//!   it the only writer of those segments;
//! - a writable open replays every orphaned journal whole, for the sessions
//!   it can lock, and removes the file once every session in it is done.
//!
//! Replay writes an entry's record at its offset unless the segment holds
//! it already; a different complete record there is corruption, reported
//! and left alone. It is idempotent: a file replayed twice writes nothing
//! the second time.

use super::error::{Error, Result};
use super::handle::Store;
use super::locks::SessionLock;
use super::registry::SessionEntry;
use crate::journal::{self, Entry};
use crate::segment;
use crate::vfs::VfsFile;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};

/// An orphaned journal file, read whole under its replay lock.
pub(super) struct Orphan {
    pub(super) path: PathBuf,
    pub(super) bytes: Vec<u8>,
    _probe: SessionLock,
    _replay: SessionLock,
}

impl Store {
    pub(super) fn journal_dir(&self) -> PathBuf {
        self.inner.registry.store_dir().join(journal::JOURNAL_DIR)
    }

    /// The journal files in the store, by number (none without the
    /// directory).
    pub(super) fn journal_files(&self) -> Result<Vec<(u64, PathBuf)>> {
        let dir = self.journal_dir();
        let names = match self.inner.vfs.read_dir(&dir) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::Io { path: dir, source }),
        };
        Ok(names
            .iter()
            .filter_map(|n| journal::parse_file_name(n.to_str()?).map(|k| (k, dir.join(n))))
            .filter(|(k, _)| !self.inner.journal.as_ref().is_some_and(|j| j.owns(*k)))
            .collect())
    }

    /// Opens journal `number` if its owner is gone, holding its replay lock
    /// (`exclusive`: to remove it; otherwise shared, waiting for a remover).
    /// `None` when its owner lives (its entries of any session this handle
    /// can lock were synced before the owner let the session go), when a
    /// remover holds it (`exclusive` only), or when it is gone.
    pub(super) fn open_orphan(
        &self,
        number: u64,
        path: &Path,
        exclusive: bool,
    ) -> Result<Option<Orphan>> {
        let Some(locks) = &self.inner.locks else {
            return Ok(None);
        };
        let lock_err = |source| Error::Io {
            path: locks.path().to_owned(),
            source,
        };
        // Opened before the locks: a file removed after this still reads
        // whole through the descriptor.
        let file = match self.inner.vfs.open(path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let Some(probe) = locks.try_probe_journal_owner(number).map_err(lock_err)? else {
            return Ok(None);
        };
        let Some(replay) = locks
            .lock_journal_replay(number, exclusive)
            .map_err(lock_err)?
        else {
            return Ok(None);
        };
        let bytes = read_all(&*file).map_err(|source| Error::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(Some(Orphan {
            path: path.to_owned(),
            bytes,
            _probe: probe,
            _replay: replay,
        }))
    }

    /// Before session `e` is loaded by its new writer (its lock held):
    /// writes into its segments every record orphaned journals hold for it.
    /// Returns how many records were written.
    pub(super) fn replay_journals_for(&self, e: &SessionEntry) -> Result<u64> {
        let mut orphans = Vec::new();
        for (number, path) in self.journal_files()? {
            if let Some(orphan) = self.open_orphan(number, &path, false)? {
                orphans.push(orphan);
            }
        }
        let mut mine: Vec<&Entry<'_>> = Vec::new();
        let mut scans = Vec::with_capacity(orphans.len());
        for orphan in &orphans {
            let scanned = self.scan_orphan(orphan).map_err(|err| match err {
                // Refused for the session being taken: its entries may be
                // in the damaged file.
                Error::Corrupt {
                    segment,
                    offset,
                    reason,
                    ..
                } => Error::Corrupt {
                    session: e.header.id.clone(),
                    segment,
                    offset,
                    reason,
                },
                other => other,
            })?;
            scans.extend(scanned);
        }
        for scanned in &scans {
            mine.extend(scanned.iter().filter(|en| en.session == e.header.id));
        }
        // In segment order across files (their names are random numbers):
        // each record is then written after those before it.
        mine.sort_by_key(|en| (en.segment, en.offset));
        self.replay_entries(&e.header.id, &e.dir, &mine)
    }

    /// At a writable open: replays every orphaned journal for the sessions
    /// this handle can lock, and removes each file whose sessions were all
    /// done. A file with a session another handle writes stays (that
    /// writer replayed it when it took the session; the file goes at a
    /// later open). Best effort: what fails here is retried, and reported,
    /// when the session is taken for writing.
    pub(super) fn adopt_orphaned_journals(&self) {
        let (Some(locks), Ok(files)) = (self.inner.locks.clone(), self.journal_files()) else {
            return;
        };
        // Held (with their replay locks) until the end.
        let held: Vec<Orphan> = files
            .into_iter()
            .filter_map(|(number, path)| self.open_orphan(number, &path, true).ok().flatten())
            .collect();
        let mut orphans = Vec::new();
        for orphan in &held {
            // A damaged file is left for the sessions' writers, which
            // refuse it (so the damage is reported with the session taken,
            // not by failing every open of the store).
            match self.scan_orphan(orphan) {
                Ok(Some(entries)) => orphans.push((&orphan.path, entries)),
                // Never used (its header incomplete, nothing after it).
                Ok(None) => {
                    let _ = self.inner.vfs.remove_file(&orphan.path);
                }
                Err(_) => {}
            }
        }
        // Each session's entries across all files, in segment order (the
        // files' names are random numbers): a record is written after the
        // ones before it.
        let mut by_session: BTreeMap<&str, Vec<&Entry<'_>>> = BTreeMap::new();
        for (_, entries) in &orphans {
            for en in entries {
                by_session.entry(en.session).or_default().push(en);
            }
        }
        let mut incomplete: HashSet<&str> = HashSet::new();
        for (id, mut list) in by_session {
            let Ok(Some(_held)) = locks.try_lock(id) else {
                incomplete.insert(id);
                continue;
            };
            list.sort_by_key(|en| (en.segment, en.offset));
            // A session that cannot be replayed now (damage, I/O) keeps its
            // files; its next writer replays them and reports why not.
            let replayed = self
                .entry(id)
                .and_then(|e| e.map_or(Ok(0), |e| self.replay_entries(id, &e.dir, &list)));
            if replayed.is_err() {
                incomplete.insert(id);
            }
        }
        for (path, entries) in &orphans {
            if !entries.iter().any(|en| incomplete.contains(en.session)) {
                let _ = self.inner.vfs.remove_file(path);
            }
        }
    }

    /// The entries of an orphaned journal of this store; `None` for a file
    /// that was never used (a header a crash cut, zeros after it). Damage
    /// is refused: its entries may be the only copy of acknowledged batches.
    fn scan_orphan<'a>(&self, o: &'a Orphan) -> Result<Option<Vec<Entry<'a>>>> {
        self.scan_journal(&o.path, &o.bytes)
    }

    /// [`Store::scan_orphan`] of the bytes of journal file `path`; an error
    /// is `Corrupt` naming the file and offset, its session empty.
    pub(super) fn scan_journal<'a>(
        &self,
        path: &Path,
        bytes: &'a [u8],
    ) -> Result<Option<Vec<Entry<'a>>>> {
        let corrupt = |offset, reason: String| Error::Corrupt {
            session: String::new(),
            segment: path.to_owned(),
            offset,
            reason: format!("journal: {reason}"),
        };
        let scanned = match journal::scan(bytes) {
            Ok(s) => s,
            Err(journal::JournalError::BadHeader(_))
                if bytes
                    .get(journal::HEADER_LEN..)
                    .is_none_or(|rest| rest.iter().all(|&b| b == 0)) =>
            {
                return Ok(None);
            }
            Err(journal::JournalError::BadEntry { offset, reason }) => {
                return Err(corrupt(offset, reason));
            }
            Err(e) => return Err(corrupt(0, e.to_string())),
        };
        if scanned.header.store_id != self.inner.store_id {
            return Err(corrupt(
                24,
                "the journal belongs to another store".to_string(),
            ));
        }
        Ok(Some(scanned.entries))
    }

    /// Writes each entry's record into its segment of session `id` (in
    /// `dir`) unless it is there, then syncs each segment written.
    pub(super) fn replay_entries(
        &self,
        id: &str,
        dir: &Path,
        entries: &[&Entry<'_>],
    ) -> Result<u64> {
        let vfs = &*self.inner.vfs;
        let mut by_segment: BTreeMap<u64, Vec<&Entry<'_>>> = BTreeMap::new();
        for en in entries {
            by_segment.entry(en.segment).or_default().push(en);
        }
        let mut written = 0;
        for (first_seq, list) in by_segment {
            let path = dir.join(segment::segment_file_name(first_seq));
            let io_err = |source| Error::Io {
                path: path.clone(),
                source,
            };
            let file = match vfs.open(&path, true) {
                Ok(f) => f,
                // Removed since (an archived segment evicted, a sealed one
                // replaced by its compressed image, a session replaced):
                // its records were durable before that.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(e)),
            };
            let mut bytes = read_all(&*file).map_err(io_err)?;
            let Ok(ident) = segment::read_header(&bytes) else {
                // A segment whose header a crash cut holds no record.
                continue;
            };
            // Whether an entry of this segment is replayed: written now, or
            // found in place.
            let mut relied_on = false;
            for en in list {
                if ident.store_id != self.inner.store_id || ident.session_uid != en.uid {
                    continue; // a stale entry of a session since replaced
                }
                relied_on = true;
                // An entry starts inside its segment or right at its end (a
                // lost write after the last record on disk; entries come in
                // segment order, and those of a handle's files are sorted
                // across them). One past the end would leave
                // a gap of zeros that every scan stops at, hiding the
                // record; a crafted offset must not overflow or allocate.
                let at = usize::try_from(en.offset)
                    .ok()
                    .filter(|at| *at <= bytes.len());
                let Some((at, end)) =
                    at.and_then(|at| Some((at, at.checked_add(en.record.len())?)))
                else {
                    return Err(Error::Corrupt {
                        session: id.to_owned(),
                        segment: path.clone(),
                        offset: en.offset,
                        reason: format!(
                            "the journal puts an acknowledged record past the end of the segment ({} bytes)",
                            bytes.len()
                        ),
                    });
                };
                if bytes.get(at..end) == Some(en.record) {
                    continue;
                }
                if segment::record_at(&bytes, &ident, en.offset).is_some() {
                    return Err(Error::Corrupt {
                        session: id.to_owned(),
                        segment: path.clone(),
                        offset: en.offset,
                        reason: "another record lies where the journal puts an acknowledged one"
                            .into(),
                    });
                }
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[at..end].copy_from_slice(en.record);
                if segment::record_at(&bytes, &ident, en.offset).is_none() {
                    return Err(Error::Corrupt {
                        session: id.to_owned(),
                        segment: path.clone(),
                        offset: en.offset,
                        reason: "a journaled record does not belong to this segment".into(),
                    });
                }
                file.write_all_at(en.record, en.offset).map_err(io_err)?;
                written += 1;
            }
            // Synced even when every record was in place already: a
            // record found in the page cache (its writer killed before its
            // segment's sync) is not durable, and the journal copy that is
            // may be removed once this returns.
            if relied_on {
                file.sync_data().map_err(io_err)?;
            }
        }
        Ok(written)
    }

    /// Whether every record `entries` hold for one session (in `dir`) is
    /// in its segment already, or needed no longer (its segment removed or
    /// replaced, as [`Store::replay_entries`] takes them): a replay would
    /// write nothing. Read without the session's lock, so a read that
    /// fails (a writer cutting a torn tail meanwhile) counts as not in
    /// place.
    pub(super) fn entries_in_place(&self, dir: &Path, entries: &[&Entry<'_>]) -> bool {
        let mut by_segment: BTreeMap<u64, Vec<&Entry<'_>>> = BTreeMap::new();
        for en in entries {
            by_segment.entry(en.segment).or_default().push(en);
        }
        by_segment.into_iter().all(|(first_seq, list)| {
            let path = dir.join(segment::segment_file_name(first_seq));
            let bytes = match self.inner.vfs.open(&path, false) {
                Ok(file) => match read_all(&*file) {
                    Ok(bytes) => bytes,
                    Err(_) => return false,
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
                Err(_) => return false,
            };
            let Ok(ident) = segment::read_header(&bytes) else {
                // Holds no record, and replay writes none into it.
                return true;
            };
            list.iter().all(|en| {
                ident.store_id != self.inner.store_id
                    || ident.session_uid != en.uid
                    || usize::try_from(en.offset).ok().is_some_and(|at| {
                        at.checked_add(en.record.len())
                            .and_then(|end| bytes.get(at..end))
                            == Some(en.record)
                    })
            })
        })
    }
}

pub(super) fn read_all(file: &dyn VfsFile) -> io::Result<Vec<u8>> {
    let len = file.len()?;
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}
