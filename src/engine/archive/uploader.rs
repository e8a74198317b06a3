//! The upload pass (background, every `upload_interval`, and on demand) and
//! local eviction.
//!
//! A pass, for each session whose lease this handle holds: before its first
//! upload of the session (always, on an explicit sync) the lease is checked
//! (lost: the session is fenced, nothing more of it uploaded); `HEADER`
//! and `LINEAGE` are uploaded once; each sealed segment once (sealed
//! segments never change); the active segment only when asked (`close`,
//! [`crate::store::Store::archive_sync`]); the checkpoint last, and only
//! when the segment it ends in is in the bucket at least as long as it
//! covers, so the bucket never holds a checkpoint its segments do not
//! back. Every object is one `PUT` of the whole file: a failed or
//! timed-out `PUT` leaves no object (S3 and the local backend both make a
//! put visible only complete), and it is retried with backoff.

use super::lease::LeaseRecord;
use super::{Archive, archive_error};
use crate::checkpoint::{CHECKPOINT_FILE, Checkpoint};
use crate::engine::error::{Error, Result, io_at};
use crate::engine::periodic::Periodic;
use crate::engine::registry::{HEADER_FILE, decode_header};
use crate::lineage::LINEAGE_FILE;
use crate::segment;
use crate::vfs::SegmentBytes;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::SystemTime;

/// What one upload pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchiveReport {
    /// Objects uploaded.
    pub uploaded: u64,
    /// Local sealed segments removed (their upload confirmed).
    pub evicted: u64,
    /// Sessions another host took over since this handle took them: their
    /// appends now fail with [`Error::NotOwner`].
    pub fenced: Vec<String>,
}

/// The archive's counters since the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArchiveStats {
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
    /// Objects uploaded.
    pub objects_uploaded: u64,
    /// Bytes fetched from the object store (segments, checkpoints, leases,
    /// headers).
    pub bytes_fetched: u64,
    /// Objects fetched.
    pub objects_fetched: u64,
    /// Requests retried after a failure or a timeout.
    pub retries: u64,
    /// Local segments evicted.
    pub evicted: u64,
    /// Conditional writes the bucket refused: the object was not the
    /// version this handle last saw (another host wrote it), or was there
    /// already (format-spec section 10.5).
    pub conflicts: u64,
    /// Objects found diverged from the local file of the same name and
    /// left alone ([`Error::ArchiveDiverged`]), counted each time a pass
    /// meets one.
    pub diverged: u64,
    /// Local segments moved aside (`<name>.diverged-<n>`) because they
    /// diverged from the bucket's copy when this host took the session
    /// back, or when a stale copy was replaced.
    pub quarantined: u64,
}

/// Why an upload of a session stopped.
pub(super) enum Stop {
    /// Another host took the lease: the session is fenced.
    Lost(LeaseRecord),
    /// A request or a file failed.
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Failed(e)
    }
}

/// Checks a session's lease once, before its first upload of a pass, and
/// lists its objects once a lease (what later writes are conditional on).
pub(super) struct Gate {
    epoch: u64,
    checked: bool,
}

impl Gate {
    pub(super) fn open(&mut self, archive: &Archive, dir: &str) -> std::result::Result<(), Stop> {
        if !self.checked {
            self.recheck(archive, dir)?;
            archive.seed(dir)?;
        }
        Ok(())
    }

    /// Checks the lease now (after a refused write: someone else wrote).
    pub(super) fn recheck(
        &mut self,
        archive: &Archive,
        dir: &str,
    ) -> std::result::Result<(), Stop> {
        // The session id is only known from its HEADER; the directory
        // name stands for it in errors.
        archive
            .check_lease(dir, dir, self.epoch)?
            .map_err(Stop::Lost)?;
        self.checked = true;
        Ok(())
    }
}

/// Whose a session directory is, as an eviction sees it.
#[derive(Clone)]
struct Owner {
    id: String,
    uid: [u8; 16],
    /// This handle writes it (holds its writer lock).
    ours: bool,
}

/// One segment of a session directory as the uploader sees it.
pub(super) struct SegFile {
    pub(super) first_seq: u64,
    /// The local file: the raw segment, or its compressed image (a sealed
    /// segment stored compressed, format-spec section 3.5).
    pub(super) name: String,
    pub(super) image: bool,
}

impl SegFile {
    /// Its object's name: always the raw segment's. Images are local only;
    /// the bucket holds every segment raw (section 10.1).
    fn object_name(&self) -> String {
        segment::segment_file_name(self.first_seq)
    }
}

/// The segments of one session directory, sorted by first seq; a raw file
/// wins over an image of the same segment (both exist only between a
/// compression's rename and its removal of the raw file).
pub(super) fn segment_files(archive: &Archive, local: &Path) -> Result<Vec<SegFile>> {
    let mut files: Vec<SegFile> = archive
        .vfs
        .read_dir(local)
        .map_err(io_at(local))?
        .into_iter()
        .filter_map(|n| {
            let name = n.into_string().ok()?;
            let (first_seq, image) = match segment::parse_segment_file_name(&name) {
                Some(seq) => (seq, false),
                None => (segment::parse_image_file_name(&name)?, true),
            };
            Some(SegFile {
                first_seq,
                name,
                image,
            })
        })
        .collect();
    files.sort_by_key(|f| (f.first_seq, f.image));
    files.dedup_by_key(|f| f.first_seq);
    Ok(files)
}

impl Archive {
    /// Starts the background uploader. It holds the archive weakly: the
    /// last store handle's drop stops it.
    pub(super) fn start_uploader(self: &Arc<Self>) {
        let weak: Weak<Archive> = Arc::downgrade(self);
        let thread = Periodic::spawn("sessionlog-archive", self.opts.upload_interval, move || {
            let Some(archive) = weak.upgrade() else {
                return false;
            };
            // Errors are retried by the next pass; a fenced session is
            // reported to its next append.
            let _ = archive.pass(false);
            true
        });
        *self
            .uploader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(thread);
    }

    /// One upload pass over the sessions this handle holds, then eviction.
    /// `include_active`: the active segments too (their bytes up to now).
    pub(super) fn pass(&self, include_active: bool) -> Result<ArchiveReport> {
        let _one = self
            .passes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let held: Vec<(String, u64)> = self
            .state()
            .held
            .iter()
            .map(|(d, e)| (d.clone(), *e))
            .collect();
        let mut report = ArchiveReport::default();
        let mut first_error = None;
        for (dir, epoch) in held {
            // The lease is checked before the first upload of the session
            // (a background pass with nothing new asks nothing), and always
            // on an explicit sync.
            let mut gate = Gate {
                epoch,
                checked: false,
            };
            let uploaded = if include_active {
                gate.open(self, &dir)
                    .and_then(|()| self.upload_session(&dir, &mut gate, true))
            } else {
                self.upload_session(&dir, &mut gate, false)
            };
            match uploaded {
                Ok(n) => report.uploaded += n,
                Err(Stop::Lost(rec)) => {
                    let mut st = self.state();
                    st.held.remove(&dir);
                    st.seeded.remove(&dir);
                    st.fenced.insert(dir.clone(), (rec.host, rec.epoch));
                    report.fenced.push(dir);
                }
                Err(Stop::Failed(e)) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match self.evict() {
            Ok(n) => report.evicted = n,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(report), Err)
    }

    /// Uploads what session directory `dir` has that the bucket lacks.
    fn upload_session(
        &self,
        dir: &str,
        gate: &mut Gate,
        include_active: bool,
    ) -> std::result::Result<u64, Stop> {
        let local = self.sessions_dir.join(dir);
        if !self.vfs.exists(&local) {
            return Ok(0);
        }
        let mut n = 0;
        for name in [HEADER_FILE, LINEAGE_FILE] {
            let path = local.join(name);
            let done = self
                .state()
                .uploaded
                .contains_key(&(dir.to_owned(), name.to_owned()));
            if done || !self.vfs.exists(&path) {
                continue;
            }
            let mut bytes = self.vfs.read_file(&path).map_err(io_at(&path))?;
            if name == HEADER_FILE {
                // Without a checkpoint it may embed: the bucket's HEADER
                // stays version 1 (readable by every build that reads
                // store version 3), and a checkpoint goes to the bucket
                // only as `CHECKPOINT`, once its segments back it (below).
                bytes =
                    crate::engine::ckfile::plain_header(&bytes).map_err(|why| Error::Corrupt {
                        session: dir.to_owned(),
                        segment: path.clone(),
                        offset: 0,
                        reason: why,
                    })?;
            }
            n += u64::from(self.put_fenced(
                gate,
                dir,
                name,
                SegmentBytes::new(bytes),
                true,
                &path,
            )?);
        }
        // The checkpoint is read first: every record it covers was synced
        // before it was written, so segment bytes read after it hold them.
        // One already uploaded is not read again: a new checkpoint is a new
        // file renamed into place, so its stamp differs.
        // The file it is in: `CHECKPOINT`, or the `HEADER` embedding it.
        let ck_path = crate::engine::ckfile::location(&*self.vfs, &local)
            .unwrap_or_else(|| local.join(CHECKPOINT_FILE));
        let stamp = self
            .vfs
            .metadata(&ck_path)
            .ok()
            .map(|m| (m.len, m.modified, m.ino));
        // Nor one fetched from the bucket (a take-over's): the bucket has it.
        let uploaded_before = stamp.is_some() && {
            let st = self.state();
            st.checkpoints.get(dir) == stamp.as_ref()
                || st.fetched_checkpoints.get(dir).map(|(_, s)| s) == stamp.as_ref()
        };
        let checkpoint = if uploaded_before {
            None
        } else {
            match crate::engine::ckfile::open(&*self.vfs, &local) {
                (_, Ok(ck)) => Some(ck.bytes().to_vec()),
                (_, Err(crate::checkpoint::CheckpointError::Missing)) => None,
                (place, Err(crate::checkpoint::CheckpointError::Io(e))) => {
                    return Err(io_at(&place.path)(e).into());
                }
                // Damaged: not uploaded (`verify` reports it; the next
                // writer replaces it).
                (_, Err(_)) => None,
            }
        };
        let files = segment_files(self, &local)?;
        for (i, file) in files.iter().enumerate() {
            let last = i + 1 == files.len();
            let name = file.object_name();
            let recorded = self
                .state()
                .uploaded
                .get(&(dir.to_owned(), name.clone()))
                .copied();
            if matches!(recorded, Some((_, true))) {
                continue; // sealed and uploaded: it never changes
            }
            let Some((map, image)) = self.map_segment(&local, file)? else {
                continue; // removed since the listing (evicted, or deleted)
            };
            if image {
                // Sealed, stored compressed: uploaded as the raw segment
                // it decodes to, checked whole first.
                let raw = segment::decode_image_any(&map).map_err(|e| {
                    crate::engine::error::segment_error(dir, &local.join(&file.name), e)
                })?;
                let path = local.join(&file.name);
                n += u64::from(self.put_fenced(
                    gate,
                    dir,
                    &name,
                    SegmentBytes::new(raw),
                    true,
                    &path,
                )?);
                continue;
            }
            let path = local.join(&name);
            let sealed = segment::verify_footer(&map).is_ok();
            let wanted = sealed || (last && include_active);
            if !wanted {
                continue;
            }
            if recorded == Some((map.len() as u64, false)) {
                continue; // the active segment, unchanged since its upload
            }
            // The active segment: its bytes now, read, not mapped (the
            // writer appends meanwhile; a record caught half-written reads
            // as a torn tail, which the next writer cuts).
            let bytes = if sealed {
                map
            } else {
                SegmentBytes::new(self.vfs.read_file(&path).map_err(io_at(&path))?)
            };
            n += u64::from(self.put_fenced(gate, dir, &name, bytes, sealed, &path)?);
        }
        if let Some(ck) = checkpoint {
            let backed = Checkpoint::parse(SegmentBytes::new(ck.clone()))
                .ok()
                .is_some_and(|c| {
                    let c = c.coverage();
                    let name = segment::segment_file_name(c.segment_first_seq);
                    self.state()
                        .uploaded
                        .get(&(dir.to_owned(), name))
                        .is_some_and(|(len, _)| *len >= c.end_offset)
                });
            if backed {
                let written = self.put_fenced(
                    gate,
                    dir,
                    CHECKPOINT_FILE,
                    SegmentBytes::new(ck),
                    true,
                    &ck_path,
                )?;
                if let Some(stamp) = stamp {
                    self.state().checkpoints.insert(dir.to_owned(), stamp);
                }
                n += u64::from(written);
            }
        }
        Ok(n)
    }

    /// Maps segment `file` of session directory `local`: the raw file, or
    /// its image when the raw file was compressed since the listing (it is
    /// removed only once the image is durable). `None` when neither is
    /// there any more; the flag says whether the bytes are an image.
    fn map_segment(&self, local: &Path, file: &SegFile) -> Result<Option<(SegmentBytes, bool)>> {
        let raw = local.join(segment::segment_file_name(file.first_seq));
        let image = local.join(segment::image_file_name(file.first_seq));
        let tries: &[(&Path, bool)] = if file.image {
            &[(&image, true)]
        } else {
            &[(&raw, false), (&image, true)]
        };
        for (path, is_image) in tries {
            match self.vfs.map(path) {
                Ok(map) => return Ok(Some((map, *is_image))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_at(path)(e)),
            }
        }
        Ok(None)
    }

    /// The id and uid of session directory `dir` (from its `HEADER`), and
    /// whether this handle writes it; `None` when it has no readable
    /// `HEADER`.
    fn owner(&self, dir: &str) -> Option<Owner> {
        let bytes = self
            .vfs
            .read_file(&self.sessions_dir.join(dir).join(HEADER_FILE))
            .ok()?;
        let (header, uid) = decode_header(&bytes).ok()?;
        let ours = self.locks.get().is_some_and(|l| l.holds(&header.id));
        Some(Owner {
            id: header.id,
            uid,
            ours,
        })
    }

    /// Whether `<dir>/<name>` is in the bucket at length `len`: recorded by
    /// this handle's upload (trusted only while this handle writes the
    /// session, `ours`: another process may have replaced it since, and
    /// the new session's file of that name is not that upload), or else
    /// confirmed with a `HEAD`.
    fn confirmed(&self, dir: &str, name: &str, len: u64, ours: bool) -> Result<bool> {
        if ours
            && self
                .state()
                .uploaded
                .get(&(dir.to_owned(), name.to_owned()))
                .is_some_and(|(l, sealed)| *sealed && *l == len)
        {
            return Ok(true);
        }
        let key = self.opts.file_key(dir, name);
        match self.call(|s| {
            let key = key.clone();
            async move { s.head(&key).await }
        }) {
            Ok(meta) => Ok(meta.size == len),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(archive_error(Some(dir), &key, "checking the upload", e)),
        }
    }

    /// Removes the local sealed segments the policy selects whose upload is
    /// confirmed. Never a session's last segment: a resume needs the tail.
    /// The removal is not `fsync`ed: a crash that brings the file back
    /// leaves a copy identical to the object, which is harmless.
    fn evict(&self) -> Result<u64> {
        let policy = &self.opts.evict;
        if policy.older_than.is_none() && policy.max_local_bytes.is_none() {
            return Ok(0);
        }
        let entries = match self.vfs.read_dir(&self.sessions_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_at(&self.sessions_dir)(e)),
        };
        let mut total = 0u64;
        // (modified, dir, file name, bytes on disk, object name, object
        // length) of every sealed, non-last segment. An image's object is
        // the raw segment it decodes to (its length from the image header).
        let mut candidates = Vec::new();
        for dir in entries {
            let Ok(dir) = dir.into_string() else { continue };
            if dir.starts_with('.') {
                continue;
            }
            let local = self.sessions_dir.join(&dir);
            let Ok(files) = segment_files(self, &local) else {
                continue;
            };
            for (i, file) in files.iter().enumerate() {
                let path = local.join(&file.name);
                let Ok(m) = self.vfs.metadata(&path) else {
                    continue;
                };
                total += m.len;
                if i + 1 == files.len() {
                    continue;
                }
                let object_len = if file.image {
                    match self.vfs.map(&path).map(|z| segment::image_len(&z)) {
                        Ok(Ok(len)) => len,
                        // Unreadable or damaged: never evicted on its word.
                        _ => continue,
                    }
                } else {
                    m.len
                };
                let modified = m.modified.unwrap_or(SystemTime::UNIX_EPOCH);
                candidates.push((
                    modified,
                    dir.clone(),
                    file.name.clone(),
                    m.len,
                    file.object_name(),
                    object_len,
                ));
            }
        }
        candidates.sort();
        let now = SystemTime::now();
        let mut evicted = 0;
        // Each candidate's session: its id and uid, and whether this
        // handle writes it (read once per pass).
        let mut owners: HashMap<String, Option<Owner>> = HashMap::new();
        for (modified, dir, name, len, object, object_len) in candidates {
            let old = policy
                .older_than
                .is_some_and(|age| now.duration_since(modified).unwrap_or_default() >= age);
            let over = policy.max_local_bytes.is_some_and(|max| total > max);
            if !(old || over) {
                continue;
            }
            let Some(owner) = owners
                .entry(dir.clone())
                .or_insert_with(|| self.owner(&dir))
                .clone()
            else {
                continue; // no readable HEADER: not evicted on its word
            };
            if !self.confirmed(&dir, &object, object_len, owner.ours)? {
                continue;
            }
            // A session another handle (here or in another process) may
            // replace or delete: its writer lock is held across the
            // removal, so no replace is between its check that the
            // segment is local (what it fetches back before deleting the
            // objects) and its exchange. A writer refused meanwhile waits
            // (the maintenance byte). The session is read again under the
            // lock: a replace that ended since the check above made the
            // file another session's (another uid), whose object may not
            // be up yet; and this handle's records were trusted only if it
            // still writes the session. Both held for this one removal
            // only (not across the next
            // candidate's `HEAD`): a writer refused while the maintenance
            // byte is held waits rather than being told `Locked`.
            let _lock = match (owner.ours, self.locks.get()) {
                (false, Some(locks)) => {
                    let maintenance = locks.maintenance().map_err(io_at(locks.path()))?;
                    match locks.try_lock(&owner.id).map_err(io_at(locks.path()))? {
                        Some(lock) => Some((lock, maintenance)),
                        None => continue, // its writer (or a replace) evicts it
                    }
                }
                _ => None,
            };
            // (Once locked here, the session counts as this handle's.)
            match self.owner(&dir) {
                Some(now) if now.uid == owner.uid && now.ours => {}
                _ => continue,
            }
            let path = self.sessions_dir.join(&dir).join(&name);
            match self.vfs.remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::Io { path, source: e }),
            }
            total -= len;
            evicted += 1;
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(evicted)
    }
}
