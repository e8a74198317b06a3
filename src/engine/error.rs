//! The store's errors, and the helpers that build them with the session,
//! file and offset a person needs.

use crate::engine::registry::PublishError;
use crate::event::Event;
use crate::segment;
use crate::violation::Violation;
use std::path::{Path, PathBuf};

/// Errors of the store. Each names what a person needs to act.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another writer (another process, or another handle in this one)
    /// holds the session: nothing was written. The OS cannot tell which
    /// (open-file-description locks carry no owner).
    #[error(
        "session {session:?} is being written by another writer (lock in {path}); \
         retry once it has closed the session, or read it meanwhile"
    )]
    Locked {
        /// The session id.
        session: String,
        /// The lock file.
        path: PathBuf,
    },
    /// The store handle (or a clone of it) was closed.
    #[error("the store was closed; open it again to use it")]
    Closed,
    /// An I/O error on a file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Damage a crash cannot explain; nothing was truncated.
    #[error("session {session:?} is corrupt in {segment} at offset {offset}: {reason}")]
    Corrupt {
        /// The session id.
        session: String,
        /// The damaged file.
        segment: PathBuf,
        /// Byte offset of the damage.
        offset: u64,
        /// What was found.
        reason: String,
    },
    /// A batch broke a rule of the session model; nothing was stored.
    #[error("session {session:?}: batch rejected at {event_type} {violation}")]
    Rejected {
        /// The session id.
        session: String,
        /// The type of the offending event.
        event_type: String,
        /// The rule, seq and reason.
        violation: Violation,
    },
    /// Another host owns the session in the archive (issue 17): its lease
    /// (`key`) names that host. Nothing was written.
    #[error(
        "session {session:?} is owned by host {owner:?} (lease {key}, epoch {epoch}); \
         nothing was written; if that host is gone for good, take the session over"
    )]
    NotOwner {
        /// The session id.
        session: String,
        /// The owning host (empty: nobody holds it any more).
        owner: String,
        /// The lease epoch that host holds.
        epoch: u64,
        /// The lease record's object key.
        key: String,
    },
    /// The session was deleted (by another host, or another store
    /// directory) after this store's copy of it was made: the archive
    /// holds a tombstone for it (format-spec section 10.3). Returned by a
    /// write and by a load of the copy (a read). Nothing was
    /// written or uploaded, and the local copy was left as it is; delete it
    /// here too, or take the session over (`Store::take_over`, `archive`
    /// feature) to bring it back deliberately.
    #[error(
        "session {session:?} was deleted by host {host:?} (lease record {key}, epoch {epoch}) \
         after this store's copy was made; nothing was written and the copy was kept: \
         delete it here too, or take the session over to bring it back"
    )]
    DeletedElsewhere {
        /// The session id.
        session: String,
        /// The host that deleted it.
        host: String,
        /// The tombstone's lease epoch.
        epoch: u64,
        /// The tombstone's object key.
        key: String,
    },
    /// This store's copy of the session is an older incarnation than the
    /// archive's: the session was deleted or replaced on another host, and
    /// created again, after this copy was made (the two `HEADER`s have
    /// different uids). Nothing was fetched into the copy or written; delete
    /// it here (that deletes nothing in the archive) to read the archive's.
    #[error(
        "session {session:?}: this store's copy is an older incarnation than the archive's \
         ({key} has another uid): the session was deleted or replaced elsewhere and created \
         again; nothing was fetched into the copy: delete it here to read the archive's"
    )]
    ReplacedElsewhere {
        /// The session id.
        session: String,
        /// The archive's `HEADER` key.
        key: String,
    },
    /// A request to the archive's object store failed (after its retries),
    /// or an object there is not what it should be.
    #[error("archive object {key}{}: {reason}", session.as_ref().map(|s| format!(" (session {s:?})")).unwrap_or_default())]
    Archive {
        /// The session (or its directory name), when one is concerned.
        session: Option<String>,
        /// The object key.
        key: String,
        /// What failed.
        reason: String,
    },
    /// The archive holds, under the key of one of a session's files, an
    /// object this host did not write and whose bytes differ from the
    /// local file's: a host that had lost the session's lease wrote it
    /// (format-spec section 10.5). Neither copy was changed, and the
    /// session's uploads stop at that file until it is resolved.
    #[error(
        "archive object {key} (session {session:?}) diverges from the local file {}: {reason}; \
         neither copy was changed",
        file.display()
    )]
    ArchiveDiverged {
        /// The session's directory name.
        session: String,
        /// The local file.
        file: PathBuf,
        /// The object key.
        key: String,
        /// How they differ.
        reason: String,
    },
    /// An archive call on a store opened without an archive.
    #[error("the store was opened without an archive (Options::archive)")]
    NoArchive,
    /// No such session.
    #[error("session {0:?} does not exist")]
    NotFound(String),
    /// The session a [`Tail`](crate::store::Tail) follows was replaced (an
    /// `import --replace`, or deleted and created again): the new session
    /// of that id is another log, which this follower does not read.
    #[error(
        "session {0:?} was replaced while it was followed (another incarnation of that id); follow it again to read the new one"
    )]
    Replaced(String),
    /// The session already exists.
    #[error("session {0:?} already exists")]
    Exists(String),
    /// An fsync failed earlier; the session refuses writes until reopen.
    #[error("session {0:?} is poisoned by a failed sync; reopen the store")]
    Poisoned(String),
    /// The store was opened read-only.
    #[error("the store is open read-only")]
    ReadOnly,
    /// The session id cannot be stored.
    #[error("invalid session id {id:?}: {reason}")]
    BadId {
        /// The id.
        id: String,
        /// Why.
        reason: String,
    },
    /// The batch is larger than the record limit.
    #[error(
        "session {session:?}: batch of {size} bytes exceeds the record limit of {max} bytes; split it"
    )]
    TooLarge {
        /// The session id.
        session: String,
        /// Encoded size.
        size: u64,
        /// Limit.
        max: u32,
    },
    /// The store's `MANIFEST` is missing, damaged, or of another format
    /// version (the message says how to migrate), or the directory is not a
    /// store.
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    /// A segment file cannot be used for a reason other than damage (damage
    /// is [`Error::Corrupt`]): another segment format version, a call its
    /// state does not allow.
    #[error("session {session:?}: {path}: {source}")]
    Segment {
        /// The session id.
        session: String,
        /// The segment file.
        path: PathBuf,
        /// What the segment layer said.
        source: segment::SegmentError,
    },
    /// Writing a session's checkpoint failed (the log is intact: a
    /// checkpoint is a cache, rebuilt from the log).
    #[error("session {session:?}: writing the checkpoint in {dir}: {source}")]
    Checkpoint {
        /// The session id.
        session: String,
        /// The session directory.
        dir: PathBuf,
        /// What failed.
        source: crate::checkpoint::CheckpointError,
    },
    /// A batch could not be encoded (it holds something the record codec
    /// cannot represent); nothing was written.
    #[error("session {session:?}: encoding the batch failed: {source}")]
    Encode {
        /// The session id.
        session: String,
        /// What the codec said.
        source: crate::codec::CodecError,
    },
    /// A surface node's data is not where the session's index says
    /// (derive reads it in place): the index disagrees with the log.
    #[error("session {session:?}: {source}")]
    Index {
        /// The session id.
        session: String,
        /// The node that could not be found.
        source: crate::derive::MissingEvent,
    },
    /// A batch was written but could not be indexed: the session is
    /// poisoned (reopen rebuilds the index from the log).
    #[error("session {session:?}: indexing a written batch: {reason}")]
    Internal {
        /// The session id.
        session: String,
        /// What went wrong.
        reason: String,
    },
}

/// A result of the store.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether the same call may succeed if simply tried again: the
    /// operating system ran out of something for a moment (file
    /// descriptors, memory, buffer space), or a call was interrupted or
    /// would have blocked. Such an error says nothing about the session's
    /// bytes, so a caller must not take it for damage (report the session
    /// as unreadable, or quarantine it): it retries, or passes the error
    /// on. [`Error::Archive`] is not classified (it covers both requests
    /// that failed and objects found damaged): `false`.
    ///
    /// ```
    /// use sessionlog::store::Error;
    /// let emfile = Error::Io {
    ///     path: "s/00000000000000000000.seg".into(),
    ///     source: std::io::Error::from_raw_os_error(24), // EMFILE
    /// };
    /// assert!(emfile.is_transient());
    /// let missing = Error::Io {
    ///     path: "s/00000000000000000000.seg".into(),
    ///     source: std::io::ErrorKind::NotFound.into(),
    /// };
    /// assert!(!missing.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Io { source, .. } => io_is_transient(source),
            Error::Segment {
                source: segment::SegmentError::Io(source),
                ..
            } => io_is_transient(source),
            _ => false,
        }
    }
}

/// An OS error that a retry may not meet again (see [`Error::is_transient`]),
/// itself or as the source of an error that wraps it with context.
fn io_is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    let direct = |e: &std::io::Error| {
        matches!(
            e.kind(),
            Interrupted | WouldBlock | OutOfMemory | TimedOut | ResourceBusy
        ) || matches!(
            e.raw_os_error(),
            Some(
                libc::EMFILE
                    | libc::ENFILE
                    | libc::ENOMEM
                    | libc::ENOBUFS
                    | libc::EAGAIN
                    | libc::EINTR
            )
        )
    };
    if direct(e) {
        return true;
    }
    let mut inner: Option<&(dyn std::error::Error + 'static)> = e.get_ref().map(|i| i as _);
    while let Some(i) = inner {
        if i.downcast_ref::<std::io::Error>().is_some_and(direct) {
            return true;
        }
        inner = i.source();
    }
    false
}

pub(super) fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// The store error for a failed publish of session `id`.
pub(super) fn publish_error(e: PublishError, id: &str) -> Error {
    match e {
        PublishError::Exists => Error::Exists(id.to_owned()),
        PublishError::Io(path, source) | PublishError::Unsynced(_, path, source) => {
            Error::Io { path, source }
        }
    }
}

/// A rejection naming the session and the offending event's type and seq.
pub(super) fn rejected(session: &str, batch: &[Event<'_>], violation: Violation) -> Error {
    let event_type = violation
        .seq()
        .and_then(|seq| batch.iter().find(|e| e.seq == seq))
        .or(batch.first())
        .map_or_else(String::new, |e| e.kind.to_string());
    Error::Rejected {
        session: session.to_owned(),
        event_type,
        violation,
    }
}

pub(super) fn segment_error(session: &str, path: &Path, e: segment::SegmentError) -> Error {
    match e {
        segment::SegmentError::Corrupt { offset, reason } => Error::Corrupt {
            session: session.to_owned(),
            segment: path.to_owned(),
            offset,
            reason,
        },
        segment::SegmentError::Io(source) => Error::Io {
            path: path.to_owned(),
            source,
        },
        segment::SegmentError::RecordTooLarge { size, max } => Error::TooLarge {
            session: session.to_owned(),
            size,
            max,
        },
        source => Error::Segment {
            session: session.to_owned(),
            path: path.to_owned(),
            source,
        },
    }
}
