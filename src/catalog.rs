//! The store catalog: the file `CATALOG` at the store root, an append-only
//! log of session creations, header updates and deletions, so that listing
//! the sessions of a store never reads a session log.
//!
//! # File layout (integers little-endian)
//!
//! ```text
//! header   16 bytes   magic "SLOGCATL", version u32 (= 1), reserved u32 (= 0)
//! records  repeated   len u32 | crc u32 | payload (len bytes)
//!                     crc = CRC-32 (IEEE, as crc32fast) of the 4 len bytes
//!                           followed by the payload
//!                     payload = bincode 2 (serde, config::standard()) of a
//!                           CatalogRecord; 1 <= len <= 1 MiB
//! ```
//!
//! A [`CatalogRecord::Put`] creates a session or replaces its header (the
//! session uid must stay the same); a [`CatalogRecord::Delete`] removes it.
//! Replaying the records in order gives the live sessions.
//!
//! The payload embeds [`SessionHeader`] through serde, and bincode is
//! positional: adding, removing or reordering a `SessionHeader` field changes
//! this file format and requires a new [`CATALOG_FORMAT_VERSION`] (the golden
//! test in `tests/catalog.rs` fails when that happens).
//!
//! # Writes and durability
//!
//! The file is created (and rewritten by compaction) with
//! [`write_atomic`](crate::fsutil::write_atomic), so its header is never seen partially written. Each
//! [`Catalog::put`] and [`Catalog::delete`] writes one complete frame with a
//! single positional write at the end of the file and then `fdatasync`s it
//! (which also persists the new file size). When the call returns, the change
//! survives a crash. Because every append is synced before the next one
//! starts, only the *last* frame of the file can be torn by a crash.
//!
//! If a write or sync fails, the catalog refuses all further changes
//! ([`CatalogError::Poisoned`]): after a failed `fsync` the kernel may have
//! dropped the dirty pages, and appending behind a lost record would turn a
//! torn tail into corruption. Reopening re-reads the file from disk.
//!
//! # Reading: torn tail versus corruption
//!
//! [`Catalog::open`] replays the records in order. At the first frame that is
//! not valid (fewer than 8 bytes left, zero length, the frame runs past the
//! end of the file, or its checksum fails):
//!
//! * if a complete frame with a correct checksum starts anywhere after it,
//!   the bad frame cannot be a torn tail (only the last write can be torn), so
//!   the file is corrupt: [`CatalogError::Corrupt`];
//! * otherwise the bad bytes are the torn tail of an interrupted append: they
//!   are ignored and, unless the catalog is opened read-only, cut off with
//!   `set_len` + `fsync` *before* anything new is appended (appending behind
//!   them would make them a bad record followed by a valid one).
//!
//! A length above [`MAX_RECORD`] is always corruption (a torn write leaves a
//! prefix of the frame, or zeros, never a larger length), and is rejected
//! without allocating. A frame whose checksum is correct but whose payload
//! does not decode, or does not make sense (delete of an unknown session, a
//! changed session uid, an empty id), is corruption wherever it is: its
//! checksum proves the write completed.
//!
//! The one undetectable case is damage to the *last* record: it reads as a
//! torn tail and that record is dropped. A torn frame whose own payload bytes
//! happen to contain a checksum-valid frame (only possible with crafted
//! session strings) is reported as corruption rather than truncated.
//!
//! # Compaction
//!
//! When an append would leave more than `max(1024, 4 * live sessions)`
//! records in the file, the catalog is first rewritten with one `Put` per
//! live session ([`Catalog::compact`]) via [`write_atomic`](crate::fsutil::write_atomic): write
//! `CATALOG.tmp`, fsync it, rename it over `CATALOG`, fsync the directory,
//! then reopen the handle. Crash argument: every record of the old file is
//! already durable, and the new file holds exactly the same live set. Before
//! the rename the old file is intact (a stray `CATALOG.tmp` is removed by
//! the next open or compaction); after the rename either file under the name
//! `CATALOG` replays to the same sessions; the temporary file is synced
//! before the rename, so the name never points at a partial file.
//!
//! # Session directories and the store's protocol
//!
//! Session `id` lives in `<store>/sessions/<encode_session_dir_name(id)>`
//! ([`SESSIONS_DIR`]); the store's own files (`MANIFEST`, `CATALOG`) sit at
//! the root, so no session id can collide with them.
//!
//! **A session exists if and only if the catalog says so.** The store must
//! order its steps so that the directory is never referenced before it is
//! durable, and is only removed after it is unreferenced:
//!
//! * create: make the session directory (`0700`), write its first segment
//!   and fsync it, fsync the session directory, fsync `sessions/`, *then*
//!   [`Catalog::put`] (durable on return). A crash before the put leaves an
//!   unreferenced directory.
//! * delete: [`Catalog::delete`] (durable on return), *then* remove the
//!   directory tree and fsync `sessions/`. A crash in between leaves an
//!   unreferenced directory.
//! * open: every entry of `sessions/` that no live session maps to is listed
//!   in [`Replay::orphan_dirs`]; the store removes them (then fsyncs
//!   `sessions/`) before creating sessions. Live sessions whose directory is
//!   absent are listed in [`Replay::missing_dirs`]: under this protocol that
//!   never happens, so the store should report it as damage.
//!
//! The catalog assumes a single writer; the store must hold an exclusive
//! lock on the store directory while a writable catalog is open.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fsutil::{BadId, TMP_SUFFIX, encode_session_dir_name, write_atomic_with};
use crate::header::SessionHeader;
use crate::vfs::{Vfs, VfsFile};

/// Name of the catalog file in the store directory.
pub const CATALOG_FILE: &str = "CATALOG";

/// Name of the directory, at the store root, that holds one directory per
/// session.
pub const SESSIONS_DIR: &str = "sessions";

/// Magic bytes at offset 0 of the catalog.
pub const CATALOG_MAGIC: [u8; 8] = *b"SLOGCATL";

/// The catalog format version this build writes and reads.
pub const CATALOG_FORMAT_VERSION: u32 = 1;

/// Size of the catalog file header; the first record starts here.
pub const CATALOG_HEADER_LEN: usize = 16;

/// Bytes before each payload: `len` u32 and `crc` u32.
pub const FRAME_HEADER_LEN: usize = 8;

/// Largest record payload, in bytes (1 MiB): it also bounds what bincode
/// may allocate for a length it reads (a header is never near this size).
pub const MAX_RECORD: u32 = 1 << 20;

/// Default lower bound of the compaction threshold: the catalog is compacted
/// once it would hold more than `max(this, 4 * live sessions)` records.
pub const DEFAULT_COMPACT_MIN_RECORDS: u64 = 1024;

/// One catalog record (the payload of one frame).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CatalogRecord {
    /// Creates the session `header.id`, or replaces its header.
    Put {
        /// The session header.
        header: SessionHeader,
        /// The session's unique identity (repeated in its segment headers).
        session_uid: [u8; 16],
    },
    /// Removes the session `id`.
    Delete {
        /// The session id.
        id: String,
    },
}

/// A live session as the catalog knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The session header.
    pub header: SessionHeader,
    /// The session's unique identity.
    pub session_uid: [u8; 16],
    /// The session's directory name under [`SESSIONS_DIR`].
    pub dir_name: String,
}

/// What [`Catalog::open`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replay {
    /// Whole valid records replayed.
    pub records: u64,
    /// Bytes of a torn tail (or a torn file header) that were ignored; unless
    /// the catalog was opened read-only, they were cut off durably.
    pub torn_bytes: u64,
    /// The catalog file was missing (or had a torn header) and was written
    /// fresh (never in read-only mode).
    pub created: bool,
    /// The catalog was compacted during open.
    pub compacted: bool,
    /// Entries of `sessions/` that belong to no live session (crashed
    /// creations or deletions): the store removes them.
    pub orphan_dirs: Vec<PathBuf>,
    /// Live sessions whose directory under `sessions/` does not exist or is
    /// not a directory (damage: the store protocol never causes it).
    pub missing_dirs: Vec<String>,
}

/// Errors of the catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Reading, writing or syncing failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The catalog is damaged at `offset` (not a torn tail).
    #[error("{}: corrupt catalog at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// The catalog path.
        path: PathBuf,
        /// Offset of the bad header field or record frame.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The catalog was written in a format version this build cannot read.
    #[error(
        "{}: the catalog was written by a build using catalog format version {found}; this build reads only version {supported}",
        path.display()
    )]
    UnsupportedVersion {
        /// The catalog path.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The version this build reads ([`CATALOG_FORMAT_VERSION`]).
        supported: u32,
    },
    /// Two different session ids map to the same directory name (a 128-bit
    /// hash collision of two long ids): refused, never merged.
    #[error("{}: session ids {existing:?} and {id:?} both map to directory {dir_name:?}", path.display())]
    DirNameCollision {
        /// The catalog path.
        path: PathBuf,
        /// The shared directory name.
        dir_name: String,
        /// The id already in the catalog.
        existing: String,
        /// The id that collides with it.
        id: String,
    },
    /// A record payload would exceed [`MAX_RECORD`].
    #[error("catalog record of {size} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge {
        /// The payload size.
        size: u64,
        /// The limit.
        max: u32,
    },
    /// The session id is not usable.
    #[error(transparent)]
    BadId(#[from] BadId),
    /// [`Catalog::delete`] of a session the catalog does not hold.
    #[error("no session {id:?} in the catalog")]
    NotFound {
        /// The id.
        id: String,
    },
    /// [`Catalog::put`] for a live session with a different session uid (a
    /// session must be deleted before its id is reused).
    #[error("session {id:?} exists with a different session uid")]
    UidMismatch {
        /// The id.
        id: String,
    },
    /// A change was attempted on a catalog opened read-only.
    #[error("{}: the catalog is open read-only", path.display())]
    ReadOnly {
        /// The catalog path.
        path: PathBuf,
    },
    /// An earlier write or sync failed; the catalog must be reopened.
    #[error("{}: an earlier catalog write failed; reopen the store", path.display())]
    Poisoned {
        /// The catalog path.
        path: PathBuf,
    },
    /// A record could not be encoded (not expected to happen).
    #[error("cannot encode a catalog record: {reason}")]
    Encode {
        /// The encoder's message.
        reason: String,
    },
}

/// The catalog of a store, open for replay and (unless read-only) appends.
#[derive(Debug)]
pub struct Catalog {
    dir: PathBuf,
    path: PathBuf,
    /// `None` when read-only (no file handle is ever needed to write).
    file: Option<Box<dyn VfsFile>>,
    vfs: Arc<dyn Vfs>,
    read_only: bool,
    poisoned: bool,
    /// Offset of the end of the last valid record (the append position).
    end: u64,
    /// Records in the file.
    records: u64,
    entries: BTreeMap<String, Entry>,
    /// Directory name to id, for collision checks.
    by_dir: BTreeMap<String, String>,
    compact_min: u64,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The 16-byte catalog file header.
pub fn header_bytes() -> [u8; CATALOG_HEADER_LEN] {
    let mut h = [0u8; CATALOG_HEADER_LEN];
    h[0..8].copy_from_slice(&CATALOG_MAGIC);
    h[8..12].copy_from_slice(&CATALOG_FORMAT_VERSION.to_le_bytes());
    h
}

fn frame_crc(len_bytes: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len_bytes);
    h.update(payload);
    h.finalize()
}

/// Encodes `record` as one complete frame (`len | crc | payload`).
pub fn encode_frame(record: &CatalogRecord) -> Result<Vec<u8>, CatalogError> {
    let payload =
        bincode::serde::encode_to_vec(record, bincode::config::standard()).map_err(|e| {
            CatalogError::Encode {
                reason: e.to_string(),
            }
        })?;
    if payload.len() as u64 > u64::from(MAX_RECORD) {
        return Err(CatalogError::RecordTooLarge {
            size: payload.len() as u64,
            max: MAX_RECORD,
        });
    }
    let len = (payload.len() as u32).to_le_bytes();
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    frame.extend_from_slice(&len);
    frame.extend_from_slice(&frame_crc(&len, &payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Decodes a checksum-valid payload; the whole payload must be one record.
fn decode_payload(payload: &[u8]) -> Result<CatalogRecord, String> {
    let config = bincode::config::standard().with_limit::<{ MAX_RECORD as usize }>();
    let (record, used) = bincode::serde::decode_from_slice::<CatalogRecord, _>(payload, config)
        .map_err(|e| format!("undecodable record: {e}"))?;
    if used != payload.len() {
        return Err(format!(
            "{} trailing bytes after the record",
            payload.len() - used
        ));
    }
    Ok(record)
}

/// Result of checking the bytes at one offset as a frame.
enum Frame {
    Valid { end: usize },
    TooLarge(u32),
    Bad(&'static str),
}

fn check_frame(bytes: &[u8], at: usize) -> Frame {
    let rest = bytes.len() - at;
    if rest < FRAME_HEADER_LEN {
        return Frame::Bad("incomplete record header at the end of the file");
    }
    let len = le_u32(bytes, at);
    if len == 0 {
        return Frame::Bad("zero record length");
    }
    if len > MAX_RECORD {
        return Frame::TooLarge(len);
    }
    // `len` only indexes bytes that exist; nothing is allocated from it.
    let len = len as usize;
    if rest - FRAME_HEADER_LEN < len {
        return Frame::Bad("record extends past the end of the file");
    }
    let payload = &bytes[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + len];
    if frame_crc(&bytes[at..at + 4], payload) != le_u32(bytes, at + 4) {
        return Frame::Bad("record checksum mismatch");
    }
    Frame::Valid {
        end: at + FRAME_HEADER_LEN + len,
    }
}

enum FollowUp {
    Nothing,
    Found(usize),
    Undecided,
}

/// Searches every offset from `from` for a complete, checksum-valid frame.
/// The bytes checksummed are capped near the file size; past the cap the
/// answer is [`FollowUp::Undecided`] (treated as corruption: never truncate
/// what might be valid data).
fn find_valid_after(bytes: &[u8], from: usize) -> FollowUp {
    let n = bytes.len();
    let mut budget = n.saturating_add(1 << 16);
    let mut p = from;
    while n.saturating_sub(p) >= FRAME_HEADER_LEN {
        let len = le_u32(bytes, p) as usize;
        if len != 0 && len <= MAX_RECORD as usize && n - p - FRAME_HEADER_LEN >= len {
            if len > budget {
                return FollowUp::Undecided;
            }
            budget -= len;
            let payload = &bytes[p + FRAME_HEADER_LEN..p + FRAME_HEADER_LEN + len];
            if frame_crc(&bytes[p..p + 4], payload) == le_u32(bytes, p + 4) {
                return FollowUp::Found(p);
            }
        }
        p += 1;
    }
    FollowUp::Nothing
}

/// The state replayed from catalog bytes.
#[derive(Default)]
struct Parsed {
    entries: BTreeMap<String, Entry>,
    by_dir: BTreeMap<String, String>,
    records: u64,
    /// End of the last valid record (0 if the file header itself is torn).
    valid_end: usize,
    header_torn: bool,
}

fn parse(bytes: &[u8], path: &Path) -> Result<Parsed, CatalogError> {
    let corrupt = |offset: usize, reason: String| CatalogError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason,
    };
    let mut st = Parsed::default();
    let want = header_bytes();
    if bytes.len() < CATALOG_HEADER_LEN {
        // Cannot come from a crash (the file is created whole by a rename),
        // but a prefix of the header holds no data: treat it as torn.
        if bytes == &want[..bytes.len()] {
            st.header_torn = true;
            return Ok(st);
        }
        return Err(corrupt(
            0,
            "truncated file header that does not match".into(),
        ));
    }
    if bytes[0..8] != CATALOG_MAGIC {
        return Err(corrupt(0, "bad magic (not a sessionlog catalog)".into()));
    }
    let found = le_u32(bytes, 8);
    if found != CATALOG_FORMAT_VERSION {
        return Err(CatalogError::UnsupportedVersion {
            path: path.to_path_buf(),
            found,
            supported: CATALOG_FORMAT_VERSION,
        });
    }
    let reserved = le_u32(bytes, 12);
    if reserved != 0 {
        return Err(corrupt(
            12,
            format!("reserved header field is {reserved:#x}, not 0"),
        ));
    }
    let mut at = CATALOG_HEADER_LEN;
    st.valid_end = at;
    while at < bytes.len() {
        let end = match check_frame(bytes, at) {
            Frame::Valid { end } => end,
            Frame::TooLarge(len) => {
                return Err(corrupt(
                    at,
                    format!("record length {len} exceeds the limit of {MAX_RECORD} bytes"),
                ));
            }
            Frame::Bad(reason) => match find_valid_after(bytes, at + 1) {
                FollowUp::Nothing => break,
                FollowUp::Found(p) => {
                    return Err(corrupt(
                        at,
                        format!("{reason}, but a valid record follows at offset {p}"),
                    ));
                }
                FollowUp::Undecided => {
                    return Err(corrupt(
                        at,
                        format!("{reason}; cannot tell a torn tail from corruption"),
                    ));
                }
            },
        };
        let record = decode_payload(&bytes[at + FRAME_HEADER_LEN..end])
            .map_err(|reason| corrupt(at, reason))?;
        apply(&mut st.entries, &mut st.by_dir, record, path).map_err(|e| match e {
            Apply::Bad(reason) => corrupt(at, reason),
            Apply::Err(e) => e,
        })?;
        st.records += 1;
        at = end;
        st.valid_end = end;
    }
    Ok(st)
}

enum Apply {
    Bad(String),
    Err(CatalogError),
}

/// Applies a replayed record to the in-memory state.
fn apply(
    entries: &mut BTreeMap<String, Entry>,
    by_dir: &mut BTreeMap<String, String>,
    record: CatalogRecord,
    path: &Path,
) -> Result<(), Apply> {
    match record {
        CatalogRecord::Put {
            header,
            session_uid,
        } => {
            let dir_name = encode_session_dir_name(&header.id)
                .map_err(|e| Apply::Bad(format!("put with a bad id: {e}")))?;
            if let Some(e) = entries.get(&header.id) {
                if e.session_uid != session_uid {
                    return Err(Apply::Bad(format!(
                        "put for session {:?} changes its session uid",
                        header.id
                    )));
                }
            } else if let Some(existing) = by_dir.get(&dir_name) {
                return Err(Apply::Err(CatalogError::DirNameCollision {
                    path: path.to_path_buf(),
                    dir_name,
                    existing: existing.clone(),
                    id: header.id,
                }));
            }
            by_dir.insert(dir_name.clone(), header.id.clone());
            entries.insert(
                header.id.clone(),
                Entry {
                    header,
                    session_uid,
                    dir_name,
                },
            );
        }
        CatalogRecord::Delete { id } => match entries.remove(&id) {
            Some(e) => {
                by_dir.remove(&e.dir_name);
            }
            None => return Err(Apply::Bad(format!("delete of unknown session {id:?}"))),
        },
    }
    Ok(())
}

impl Catalog {
    /// Opens the catalog of the store at `dir` (which must exist) and replays
    /// it.
    ///
    /// Writable (`read_only == false`): a missing `CATALOG` (a store whose
    /// creation crashed after its manifest, or a new store) is created empty;
    /// a torn tail is cut off durably; a stale `CATALOG.tmp` is removed;
    /// `sessions/` is created (`0700`, root synced) if missing; the catalog
    /// is compacted if it is over the threshold.
    ///
    /// Read-only: nothing is written; a missing catalog reads as empty, and a
    /// torn tail is ignored but left in place. [`Catalog::put`] and
    /// [`Catalog::delete`] then fail with [`CatalogError::ReadOnly`].
    pub fn open(dir: impl AsRef<Path>, read_only: bool) -> Result<(Catalog, Replay), CatalogError> {
        Self::open_with(crate::vfs::real(), dir.as_ref(), read_only)
    }

    /// [`Catalog::open`] through the file system `vfs`, which the catalog
    /// keeps for its later writes.
    pub fn open_with(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        read_only: bool,
    ) -> Result<(Catalog, Replay), CatalogError> {
        let dir = dir.to_path_buf();
        let path = dir.join(CATALOG_FILE);
        let io_err = |p: &Path| {
            let p = p.to_path_buf();
            move |source| CatalogError::Io { path: p, source }
        };
        let mut replay = Replay::default();
        let bytes = match vfs.read_file(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&path)(e)),
        };
        let parsed = match &bytes {
            Some(b) => parse(b, &path)?,
            None => Parsed {
                header_torn: true,
                ..Parsed::default()
            },
        };
        let file_len = bytes.as_ref().map_or(0, |b| b.len());
        let mut catalog = Catalog {
            dir: dir.clone(),
            path: path.clone(),
            file: None,
            vfs: vfs.clone(),
            read_only,
            poisoned: false,
            end: parsed.valid_end as u64,
            records: parsed.records,
            entries: parsed.entries,
            by_dir: parsed.by_dir,
            compact_min: DEFAULT_COMPACT_MIN_RECORDS,
        };
        replay.records = parsed.records;
        if parsed.header_torn {
            // A catalog is written (with its header) before any session
            // directory can exist. A missing or headerless catalog beside
            // session directories is damage: recreating it empty would make
            // every session an orphan, and the store would remove them.
            let sessions = dir.join(SESSIONS_DIR);
            let count = match vfs.read_dir(&sessions) {
                Ok(listing) => listing.len(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                Err(e) => return Err(io_err(&sessions)(e)),
            };
            if count > 0 {
                return Err(CatalogError::Corrupt {
                    path: path.clone(),
                    offset: 0,
                    reason: format!(
                        "the catalog is missing or has no valid header, but {} holds {count} session \
                         directories; refusing to recreate it (that would discard them): restore CATALOG",
                        sessions.display()
                    ),
                });
            }
            replay.torn_bytes = file_len as u64;
        } else {
            replay.torn_bytes = (file_len - parsed.valid_end) as u64;
        }
        if !read_only {
            match vfs.remove_file(&dir.join(format!("{CATALOG_FILE}{TMP_SUFFIX}"))) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&dir)(e)),
            }
            if parsed.header_torn {
                write_atomic_with(&*vfs, &dir, CATALOG_FILE, &header_bytes())
                    .map_err(io_err(&path))?;
                catalog.end = CATALOG_HEADER_LEN as u64;
                replay.created = true;
            }
            let file = vfs.open(&path, true).map_err(io_err(&path))?;
            if replay.torn_bytes > 0 && !parsed.header_torn {
                // Durable before any append: a new record behind the torn
                // bytes would make them a bad record followed by a valid one.
                file.set_len(catalog.end).map_err(io_err(&path))?;
                file.sync_all().map_err(io_err(&path))?;
            }
            catalog.file = Some(file);
            let sessions = dir.join(SESSIONS_DIR);
            match vfs.create_dir(&sessions) {
                Ok(()) => vfs.sync_dir(&dir).map_err(io_err(&dir))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&sessions)(e)),
            }
            if catalog.over_threshold(catalog.records, catalog.entries.len()) {
                catalog.compact()?;
                replay.compacted = true;
            }
        }
        catalog.scan_session_dirs(&mut replay)?;
        Ok((catalog, replay))
    }

    /// Fills in [`Replay::orphan_dirs`] and [`Replay::missing_dirs`].
    fn scan_session_dirs(&self, replay: &mut Replay) -> Result<(), CatalogError> {
        let sessions = self.sessions_dir();
        let io_err = |source| CatalogError::Io {
            path: sessions.clone(),
            source,
        };
        match self.vfs.read_dir(&sessions) {
            Ok(listing) => {
                for name in listing {
                    let live = name.to_str().is_some_and(|n| self.by_dir.contains_key(n));
                    if !live {
                        replay.orphan_dirs.push(sessions.join(name));
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        replay.orphan_dirs.sort();
        for (id, e) in &self.entries {
            let is_dir = self
                .vfs
                .symlink_metadata(&sessions.join(&e.dir_name))
                .is_ok_and(|m| m.is_dir);
            if !is_dir {
                replay.missing_dirs.push(id.clone());
            }
        }
        Ok(())
    }

    /// Creates session `header.id` or replaces its header, durably (one
    /// appended record, then `fdatasync`).
    ///
    /// A put identical to the current entry writes nothing. Fails with
    /// [`CatalogError::UidMismatch`] if the session exists with another uid,
    /// [`CatalogError::DirNameCollision`] if another live id has the same
    /// directory name, [`CatalogError::BadId`] for an empty id,
    /// [`CatalogError::RecordTooLarge`] above 1 MiB. On an error nothing
    /// changed in memory; an I/O error poisons the catalog.
    pub fn put(
        &mut self,
        header: SessionHeader,
        session_uid: [u8; 16],
    ) -> Result<(), CatalogError> {
        self.writable()?;
        let dir_name = encode_session_dir_name(&header.id)?;
        let live_after = match self.entries.get(&header.id) {
            Some(e) if e.session_uid != session_uid => {
                return Err(CatalogError::UidMismatch { id: header.id });
            }
            Some(e) if e.header == header => return Ok(()),
            Some(_) => self.entries.len(),
            None => {
                if let Some(existing) = self.by_dir.get(&dir_name) {
                    return Err(CatalogError::DirNameCollision {
                        path: self.path.clone(),
                        dir_name,
                        existing: existing.clone(),
                        id: header.id,
                    });
                }
                self.entries.len() + 1
            }
        };
        let frame = encode_frame(&CatalogRecord::Put {
            header: header.clone(),
            session_uid,
        })?;
        self.append(&frame, live_after)?;
        self.by_dir.insert(dir_name.clone(), header.id.clone());
        self.entries.insert(
            header.id.clone(),
            Entry {
                header,
                session_uid,
                dir_name,
            },
        );
        Ok(())
    }

    /// Deletes session `id`, durably (one appended record, then
    /// `fdatasync`), and returns its entry. The caller removes the session
    /// directory only after this returns.
    pub fn delete(&mut self, id: &str) -> Result<Entry, CatalogError> {
        self.writable()?;
        if !self.entries.contains_key(id) {
            return Err(CatalogError::NotFound { id: id.to_owned() });
        }
        let frame = encode_frame(&CatalogRecord::Delete { id: id.to_owned() })?;
        self.append(&frame, self.entries.len() - 1)?;
        let entry = self.entries.remove(id).expect("checked above");
        self.by_dir.remove(&entry.dir_name);
        Ok(entry)
    }

    /// The live sessions, by id.
    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// The live session `id`.
    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// The headers of the live sessions, in id order.
    pub fn list(&self) -> impl Iterator<Item = &SessionHeader> {
        self.entries.values().map(|e| &e.header)
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the catalog holds no live session.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the catalog file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `<store>/sessions`.
    pub fn sessions_dir(&self) -> PathBuf {
        self.dir.join(SESSIONS_DIR)
    }

    /// The directory of session `id` (whether or not it exists).
    pub fn session_dir(&self, id: &str) -> Result<PathBuf, BadId> {
        Ok(self.sessions_dir().join(encode_session_dir_name(id)?))
    }

    /// Records currently in the file (live and superseded).
    pub fn record_count(&self) -> u64 {
        self.records
    }

    /// Length of the valid part of the file, in bytes.
    pub fn file_len(&self) -> u64 {
        self.end
    }

    /// Whether the catalog was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Sets the lower bound of the compaction threshold (default
    /// [`DEFAULT_COMPACT_MIN_RECORDS`]; at least 1). The catalog is compacted
    /// before an append that would leave more than `max(min, 4 * live)`
    /// records. Meant for tests and tools.
    pub fn set_compact_min_records(&mut self, min: u64) {
        self.compact_min = min.max(1);
    }

    fn over_threshold(&self, records: u64, live: usize) -> bool {
        records > self.compact_min.max(4 * live as u64)
    }

    /// Rewrites the catalog with one `Put` per live session (see the module
    /// documentation for the crash argument) and reopens the file handle.
    /// Any failure poisons the catalog (the file under the name `CATALOG` may
    /// be the old or the new one; both hold the same sessions).
    pub fn compact(&mut self) -> Result<(), CatalogError> {
        self.writable()?;
        let result = self.compact_inner();
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn compact_inner(&mut self) -> Result<(), CatalogError> {
        let mut bytes = header_bytes().to_vec();
        for e in self.entries.values() {
            bytes.extend_from_slice(&encode_frame(&CatalogRecord::Put {
                header: e.header.clone(),
                session_uid: e.session_uid,
            })?);
        }
        let io_err = |source| CatalogError::Io {
            path: self.path.clone(),
            source,
        };
        write_atomic_with(&*self.vfs, &self.dir, CATALOG_FILE, &bytes).map_err(io_err)?;
        let file = self.vfs.open(&self.path, true).map_err(io_err)?;
        self.file = Some(file);
        self.end = bytes.len() as u64;
        self.records = self.entries.len() as u64;
        Ok(())
    }

    fn writable(&self) -> Result<(), CatalogError> {
        if self.read_only {
            return Err(CatalogError::ReadOnly {
                path: self.path.clone(),
            });
        }
        if self.poisoned {
            return Err(CatalogError::Poisoned {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// Compacts first if needed, then writes `frame` at the end with one
    /// positional write and `fdatasync`s it.
    fn append(&mut self, frame: &[u8], live_after: usize) -> Result<(), CatalogError> {
        if self.over_threshold(self.records + 1, live_after) {
            self.compact()?;
        }
        let file = self.file.as_ref().expect("a writable catalog has a file");
        let written = file
            .write_all_at(frame, self.end)
            .and_then(|()| file.sync_data());
        if let Err(source) = written {
            self.poisoned = true;
            return Err(CatalogError::Io {
                path: self.path.clone(),
                source,
            });
        }
        self.end += frame.len() as u64;
        self.records += 1;
        Ok(())
    }
}
