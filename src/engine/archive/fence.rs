//! Uploads fenced by the lease (`format-spec.md` section 10.5).
//!
//! Checking the lease before a pass does not stop a write of the pass from
//! landing after another host took the session over. So every write is
//! conditional on what this handle last saw of its key: an object it never
//! saw is created (`If-None-Match: *`), one it saw is replaced only in the
//! version it saw (`If-Match` on its entity tag). A refused write means
//! another host wrote there: the lease is checked again (lost: the session
//! is fenced), and an object that is neither the version seen nor this
//! host's bytes is never replaced ([`Error::ArchiveDiverged`]).
//!
//! A host taking a session back from another moves each of its local
//! segments that is not the bucket's copy (and every later one) aside,
//! under `<name>.diverged-<n>`: it is never uploaded, and never deleted.

use super::uploader::{Gate, Stop, segment_files};
use super::{Archive, archive_error};
use crate::engine::error::{Error, Result, io_at};
use crate::engine::registry::HEADER_FILE;
use crate::lineage::LINEAGE_FILE;
use crate::segment::{self, FOOTER_LEN, FOOTER_MAGIC};
use crate::vfs::SegmentBytes;
use object_store::path::Path as ObjectPath;
use object_store::{PutMode, PutOptions, PutPayload, UpdateVersion};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// What this handle last saw of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Its entity tag (`None`: the backend gave none, so it cannot be
    /// replaced conditionally).
    pub(super) e_tag: Option<String>,
    /// Its length.
    pub(super) size: u64,
    /// This handle wrote it (its bytes are the ones this handle uploaded).
    pub(super) ours: bool,
}

/// What identifies a body this handle tried to write: its length, CRC-32
/// and FNV-1a-128.
pub(crate) type Digest = (u64, u32, u128);

fn digest(b: &[u8]) -> Digest {
    (
        b.len() as u64,
        crc32fast::hash(b),
        crate::fsutil::fnv1a_128(b),
    )
}

/// How a conditional write ended.
pub(super) enum Put {
    /// Written; the new object's entity tag.
    Done(Option<String>),
    /// Refused: an object was there (create), or not the version expected
    /// (replace).
    Conflict,
}

/// What an object this handle did not write holds under a segment's name,
/// next to the local bytes of that segment.
enum Found {
    /// The same sealed segment (length and footer, which carries the
    /// records' CRC, agree).
    Same,
    /// Another sealed segment: never replaced.
    Sealed,
    /// An active segment's snapshot: the local bytes may replace it.
    Snapshot,
}

/// Whether `tail` (a segment's last 40 bytes) is a valid footer: its magic,
/// checksum and reserved field (section 3.3). An active segment's snapshot
/// ends in zeros or record bytes.
fn is_footer(tail: &[u8]) -> bool {
    tail.len() == FOOTER_LEN
        && tail[..8] == FOOTER_MAGIC
        && tail[32..36] == [0; 4]
        && u32::from_le_bytes([tail[36], tail[37], tail[38], tail[39]])
            == crc32fast::hash(&tail[..36])
}

/// Whether `object` holds everything `local` (an unsealed segment file,
/// its preallocated zeros aside) holds: `local` is then only behind it.
pub(super) fn covered_by(local: &[u8], object: &[u8]) -> bool {
    let end = local.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    object.starts_with(&local[..end])
}

impl Archive {
    /// Writes `body` at `key`: created if `expected` is `None` (refused if
    /// any object is there), else replacing only the object whose entity
    /// tag is `expected`. A backend without `If-Match` on puts (the local
    /// file system's) gets it emulated: a `HEAD` comparing the tag, then a
    /// plain put (section 10.5 states the window this leaves).
    pub(super) fn put_conditional(
        &self,
        key: &ObjectPath,
        body: &bytes::Bytes,
        expected: Option<&str>,
    ) -> object_store::Result<Put> {
        use object_store::Error as E;
        let mode = match expected {
            None => PutMode::Create,
            Some(tag) if !self.no_if_match.load(Ordering::Relaxed) => {
                PutMode::Update(UpdateVersion {
                    e_tag: Some(tag.to_owned()),
                    version: None,
                })
            }
            Some(tag) => return self.put_emulated(key, body, tag),
        };
        let put = self.call(|s| {
            let (key, body, mode) = (key.clone(), body.clone(), mode.clone());
            async move {
                let opts = PutOptions {
                    mode,
                    ..PutOptions::default()
                };
                s.put_opts(&key, PutPayload::from(body), opts).await
            }
        });
        match put {
            Ok(r) => Ok(Put::Done(r.e_tag)),
            Err(E::AlreadyExists { .. } | E::Precondition { .. }) => Ok(Put::Conflict),
            Err(E::NotImplemented) if expected.is_some() => {
                self.no_if_match.store(true, Ordering::Relaxed);
                self.put_emulated(key, body, expected.unwrap_or_default())
            }
            Err(e) => Err(e),
        }
    }

    /// `If-Match` emulated: the object's tag read, compared, then a plain
    /// put, both again on each try (a retry never writes on an old
    /// check). Another write landing between the two is not detected.
    fn put_emulated(
        &self,
        key: &ObjectPath,
        body: &bytes::Bytes,
        expected: &str,
    ) -> object_store::Result<Put> {
        let put = self.call(|s| {
            let (key, body) = (key.clone(), body.clone());
            async move {
                match s.head(&key).await {
                    Ok(m) if m.e_tag.as_deref() == Some(expected) => {}
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                }
                s.put(&key, PutPayload::from(body)).await.map(Some)
            }
        })?;
        Ok(put.map_or(Put::Conflict, |r| Put::Done(r.e_tag)))
    }

    /// The whole object at `key` with its entity tag, or `None`.
    fn get_tagged(
        &self,
        key: &ObjectPath,
    ) -> object_store::Result<Option<(bytes::Bytes, Option<String>)>> {
        let got = self.call(|s| {
            let key = key.clone();
            async move {
                let r = s.get(&key).await?;
                let tag = r.meta.e_tag.clone();
                Ok((r.bytes().await?, tag))
            }
        });
        match got {
            Ok((b, tag)) => {
                self.count_fetched(b.len());
                Ok(Some((b, tag)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The last 40 bytes of the object at `key`, `size` long (`None`: it
    /// is shorter than a footer, or gone).
    fn get_tail(&self, key: &ObjectPath, size: u64) -> object_store::Result<Option<bytes::Bytes>> {
        let Some(start) = size.checked_sub(FOOTER_LEN as u64) else {
            return Ok(None);
        };
        let got = self.call(|s| {
            let key = key.clone();
            async move { s.get_range(&key, start..size).await }
        });
        match got {
            Ok(b) => {
                self.count_fetched(b.len());
                Ok(Some(b))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn count_fetched(&self, len: usize) {
        let c = &self.counters;
        c.bytes_fetched.fetch_add(len as u64, Ordering::Relaxed);
        c.objects_fetched.fetch_add(1, Ordering::Relaxed);
    }

    /// Lists session directory `dir`'s objects into what this handle has
    /// seen (once per lease): a write then replaces only those versions.
    pub(super) fn seed(&self, dir: &str) -> Result<()> {
        if self.state().seeded.contains(dir) {
            return Ok(());
        }
        let prefix = self.opts.session_key(dir);
        let metas = self
            .list_meta(&prefix)
            .map_err(|e| archive_error(Some(dir), &prefix, "listing the session", e))?;
        let mut st = self.state();
        for m in metas {
            let Some(name) = m.location.filename() else {
                continue;
            };
            let key = (dir.to_owned(), name.to_owned());
            // What this handle wrote itself stays known as its own.
            if st
                .seen
                .get(&key)
                .is_some_and(|s| s.ours && s.e_tag == m.e_tag)
            {
                continue;
            }
            st.seen.insert(
                key,
                Seen {
                    e_tag: m.e_tag,
                    size: m.size,
                    ours: false,
                },
            );
        }
        st.seeded.insert(dir.to_owned());
        Ok(())
    }

    /// Uploads `bytes` as file `name` of session directory `dir` (local
    /// file `file`), fenced: once the gate says this host holds the
    /// session, with a conditional write on what this handle last saw of
    /// the key. Returns whether anything was written (not when the bucket
    /// already had these bytes).
    pub(super) fn put_fenced(
        &self,
        gate: &mut Gate,
        dir: &str,
        name: &str,
        bytes: SegmentBytes,
        sealed: bool,
        file: &Path,
    ) -> std::result::Result<bool, Stop> {
        gate.open(self, dir)?;
        let key = self.opts.file_key(dir, name);
        let len = bytes.len() as u64;
        let seen = self
            .state()
            .seen
            .get(&(dir.to_owned(), name.to_owned()))
            .cloned();
        // HEADER and LINEAGE are written once and the same on every host.
        let once = name == HEADER_FILE || name == LINEAGE_FILE;
        if once && seen.is_some() {
            self.record(dir, name, len, sealed, seen.and_then(|s| s.e_tag), false);
            return Ok(false);
        }
        if let Some(s) = seen.as_ref().filter(|s| !s.ours)
            && segment::parse_segment_file_name(name).is_some()
        {
            match self.found(dir, &key, s.size, &bytes, sealed)? {
                Found::Same => {
                    self.record(dir, name, len, sealed, s.e_tag.clone(), true);
                    return Ok(false);
                }
                Found::Sealed => {
                    return Err(self.diverged(
                        dir,
                        file,
                        &key,
                        "the bucket holds another sealed segment of this name",
                    ));
                }
                Found::Snapshot => {} // an active segment's bytes: replaced
            }
        }
        // One copy, shared by every try.
        let body = bytes::Bytes::copy_from_slice(&bytes);
        let put = match &seen {
            None => self.put_conditional(&key, &body, None),
            Some(Seen { e_tag: Some(t), .. }) => self.put_conditional(&key, &body, Some(t)),
            // No tag to replace it on: never replaced blindly.
            Some(_) => Ok(Put::Conflict),
        };
        let put = self.remember_unsure(dir, name, &body, put);
        match put.map_err(|e| Stop::Failed(archive_error(Some(dir), &key, "uploading", e)))? {
            Put::Done(tag) => {
                let c = &self.counters;
                c.bytes_uploaded.fetch_add(len, Ordering::Relaxed);
                c.objects_uploaded.fetch_add(1, Ordering::Relaxed);
                self.record(dir, name, len, sealed, tag, true);
                Ok(true)
            }
            Put::Conflict => {
                self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                // Someone wrote there: if the lease moved, the session is
                // fenced and nothing more of it is written.
                gate.recheck(self, dir)?;
                if once {
                    self.record(dir, name, len, sealed, None, false);
                    return Ok(false);
                }
                // Still the holder: this handle's own write whose answer was
                // lost (a retry finds its object), or a late write of a host
                // that had lost the lease. Only the first is taken as done.
                let got = self
                    .get_tagged(&key)
                    .map_err(|e| Stop::Failed(archive_error(Some(dir), &key, "reading back", e)))?;
                match got {
                    Some((b, tag)) if b == body => {
                        self.record(dir, name, len, sealed, tag, true);
                        Ok(true)
                    }
                    // This handle's own earlier write, whose answer was lost
                    // in a pass that failed (F61): replaced in that version.
                    Some((b, Some(tag))) if self.tried(dir, name, &b) => {
                        let again = self.put_conditional(&key, &body, Some(&tag));
                        let again = self.remember_unsure(dir, name, &body, again);
                        match again.map_err(|e| {
                            Stop::Failed(archive_error(Some(dir), &key, "uploading", e))
                        })? {
                            Put::Done(tag) => {
                                let c = &self.counters;
                                c.bytes_uploaded.fetch_add(len, Ordering::Relaxed);
                                c.objects_uploaded.fetch_add(1, Ordering::Relaxed);
                                self.record(dir, name, len, sealed, tag, true);
                                Ok(true)
                            }
                            Put::Conflict => {
                                gate.recheck(self, dir)?;
                                Err(self.diverged(
                                    dir,
                                    file,
                                    &key,
                                    "the object changed while this host replaced its own write",
                                ))
                            }
                        }
                    }
                    Some(_) => Err(self.diverged(
                        dir,
                        file,
                        &key,
                        "the object changed since this host last saw it, and holds other bytes",
                    )),
                    None => Err(self.diverged(
                        dir,
                        file,
                        &key,
                        "the object this host last saw was removed",
                    )),
                }
            }
        }
    }

    /// Passes `put` through, remembering its body when it failed (it may
    /// have landed: an answer lost, a timeout).
    fn remember_unsure(
        &self,
        dir: &str,
        name: &str,
        body: &[u8],
        put: object_store::Result<Put>,
    ) -> object_store::Result<Put> {
        if put.is_err() {
            let mut st = self.state();
            let tried = st
                .unsure
                .entry((dir.to_owned(), name.to_owned()))
                .or_default();
            let d = digest(body);
            if !tried.contains(&d) {
                tried.push(d);
            }
        }
        put
    }

    /// Whether `bytes` are a body this handle tried to write at
    /// `<dir>/<name>` without learning whether it landed.
    fn tried(&self, dir: &str, name: &str, bytes: &[u8]) -> bool {
        let st = self.state();
        st.unsure
            .get(&(dir.to_owned(), name.to_owned()))
            .is_some_and(|t| t.contains(&digest(bytes)))
    }

    /// Records `<dir>/<name>` as uploaded (length `len`, `sealed`) and seen
    /// with entity tag `tag`.
    fn record(
        &self,
        dir: &str,
        name: &str,
        len: u64,
        sealed: bool,
        tag: Option<String>,
        ours: bool,
    ) {
        let mut st = self.state();
        let key = (dir.to_owned(), name.to_owned());
        st.unsure.remove(&key);
        st.uploaded.insert(key.clone(), (len, sealed));
        if tag.is_some() || ours {
            st.seen.insert(
                key,
                Seen {
                    e_tag: tag,
                    size: len,
                    ours,
                },
            );
        }
    }

    fn diverged(&self, dir: &str, file: &Path, key: &ObjectPath, why: &str) -> Stop {
        self.counters.diverged.fetch_add(1, Ordering::Relaxed);
        Stop::Failed(Error::ArchiveDiverged {
            session: dir.to_owned(),
            file: file.to_owned(),
            key: key.to_string(),
            reason: why.to_owned(),
        })
    }

    /// What the object at `key` (`size` long, not written by this handle)
    /// is next to the local segment `bytes`.
    fn found(
        &self,
        dir: &str,
        key: &ObjectPath,
        size: u64,
        bytes: &[u8],
        sealed: bool,
    ) -> std::result::Result<Found, Stop> {
        let tail = self
            .get_tail(key, size)
            .map_err(|e| Stop::Failed(archive_error(Some(dir), key, "reading the footer", e)))?;
        let Some(tail) = tail.filter(|t| is_footer(t)) else {
            return Ok(Found::Snapshot);
        };
        let local_tail = &bytes[bytes.len().saturating_sub(FOOTER_LEN)..];
        Ok(
            if sealed && size == bytes.len() as u64 && *tail == *local_tail {
                Found::Same
            } else {
                Found::Sealed
            },
        )
    }

    /// The length and footer of local sealed segment `path` (an image's
    /// decoded ones); `None` if it is not sealed (an active segment).
    fn local_footer(&self, path: &Path, image: bool) -> Result<Option<(u64, Vec<u8>)>> {
        let map = match self.vfs.map(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_at(path)(e)),
        };
        let raw = if image {
            match segment::decode_image_any(&map) {
                Ok(raw) => SegmentBytes::new(raw),
                // A damaged image: no copy to compare (the load reports it).
                Err(_) => return Ok(None),
            }
        } else {
            map
        };
        if segment::verify_footer(&raw).is_err() {
            return Ok(None);
        }
        Ok(Some((
            raw.len() as u64,
            raw[raw.len() - FOOTER_LEN..].to_vec(),
        )))
    }

    /// On taking session `id` (directory `local`) back from another host
    /// whose objects `listed` shows: each local segment that is sealed and
    /// not the bucket's copy (other length or footer), and every later
    /// local segment, is moved aside. Later local segments the bucket
    /// lacks after segments it has the same are kept: they extend its log.
    /// An unsealed one the bucket has is replaced when stale, and moved
    /// aside first if the bucket's does not hold all of it
    /// (`fetch_into`).
    pub(super) fn quarantine_diverged(
        &self,
        id: &str,
        local: &Path,
        listed: &[(ObjectPath, u64)],
    ) -> Result<()> {
        let remote: std::collections::HashMap<u64, (&ObjectPath, u64)> = listed
            .iter()
            .filter_map(|(k, size)| {
                Some((segment::parse_segment_file_name(k.filename()?)?, (k, *size)))
            })
            .collect();
        let mut diverged = false;
        for f in segment_files(self, local)? {
            let path = local.join(&f.name);
            if !diverged {
                let Some((key, size)) = remote.get(&f.first_seq) else {
                    continue;
                };
                let Some((len, footer)) = self.local_footer(&path, f.image)? else {
                    // Unsealed: diverged if it holds more than the bucket's
                    // copy (records the last holder's history lacks). One
                    // behind it is replaced when stale, moved aside first
                    // if its bytes are not the object's (`fetch_into`).
                    let used = self.vfs.read_file(&path).map_err(io_at(&path))?;
                    let end = used.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
                    if end as u64 > *size {
                        diverged = true;
                        self.quarantine_all(local, f.first_seq)?;
                    }
                    continue;
                };
                let tail = self
                    .get_tail(key, *size)
                    .map_err(|e| archive_error(Some(id), key, "reading the footer", e))?;
                if len == *size && tail.as_deref() == Some(&footer[..]) {
                    continue;
                }
                diverged = true;
            }
            self.quarantine_all(local, f.first_seq)?;
        }
        Ok(())
    }

    /// Moves segment `first_seq` of `local` aside, raw file and image.
    fn quarantine_all(&self, local: &Path, first_seq: u64) -> Result<()> {
        for name in [
            segment::segment_file_name(first_seq),
            segment::image_file_name(first_seq),
        ] {
            if self.vfs.exists(&local.join(&name)) {
                self.quarantine(local, &name)?;
            }
        }
        Ok(())
    }

    /// Moves `dir/name` aside to `dir/<name>.diverged-<n>` (the first `n`
    /// free; never replacing a file), durably. Returns the new path.
    pub(super) fn quarantine(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        let from = dir.join(name);
        for n in 0u32.. {
            let to = dir.join(format!("{name}.diverged-{n}"));
            match self.vfs.rename_noreplace(&from, &to) {
                Ok(()) => {
                    self.vfs.sync_dir(dir).map_err(io_at(dir))?;
                    self.counters.quarantined.fetch_add(1, Ordering::Relaxed);
                    let dir_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    let mut st = self.state();
                    let object = segment::parse_image_file_name(name)
                        .map_or_else(|| name.to_owned(), segment::segment_file_name);
                    st.uploaded.remove(&(dir_name.to_owned(), object));
                    return Ok(to);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_at(&from)(e)),
            }
        }
        unreachable!("u32 quarantine names exhausted")
    }
}
