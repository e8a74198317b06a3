//! How a command fails (and so its exit code), and the helpers the
//! commands share to open a store, map its errors and print session ids
//! in messages: used by `cli`, `transfer` and `demo`, which depend on this
//! module and not on each other.

use sessionlog::store::{self, Options, Store};
use std::io;
use std::path::Path;

/// How a command failed, and so which exit code it gets.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Invalid input or data: exit 1.
    Invalid(String),
    /// Usage: exit 2.
    Usage(String),
    /// I/O: exit 3.
    Io(String),
    /// The reader of our output went away (`sessionlog cat ID | head`):
    /// nothing is wrong, stop quietly with exit 0.
    OutputClosed,
}

impl Failure {
    pub(crate) fn code(&self) -> u8 {
        match self {
            Failure::Invalid(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Io(_) => 3,
            Failure::OutputClosed => 0,
        }
    }

    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Invalid(m) | Failure::Usage(m) | Failure::Io(m) => m,
            Failure::OutputClosed => "the output was closed",
        }
    }
}

pub(crate) fn io_err(e: io::Error) -> Failure {
    if e.kind() == io::ErrorKind::BrokenPipe {
        return Failure::OutputClosed;
    }
    Failure::Io(format!("writing output: {e}"))
}

/// `n` and the word, plural unless `n` is 1: "1 closer", "3 closers".
pub(crate) fn plural(n: impl Into<u64>, word: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// A session id (or any text from the store) as a message prints it, and a
/// field of an `ls` row: backslash, tab, newline, carriage return and every
/// other control character written as in JSON (`\\`, `\t`, `\n`, `\r`,
/// `\u001b`), so a row stays one line of three tab-separated fields and an
/// id cannot move the cursor, clear the screen or forge a line of output.
pub(crate) fn escape_field(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || c.is_control()) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            // Control characters are all in the BMP: one \uXXXX each.
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The exit code of a store error: bad data, damage or a bad request is 1,
/// anything about the disk, a missing store or a lock is 3.
pub(crate) fn store_err(e: store::Error) -> Failure {
    use store::Error as E;
    use store::ManifestError as M;
    // What happened (the error names session, seq, file and offset), then
    // what to do about it.
    let hint = match &e {
        E::Rejected { .. } => "nothing of the batch was stored; fix the event and append again",
        E::Corrupt { reason, .. } if reason.starts_with("journal:") => {
            "nothing was changed; that journal file may hold the only copy of acknowledged batches, so no stored session is written while it lies there: `salvage-journals` writes back what it still holds and moves it to journal/damaged/"
        }
        E::Corrupt {
            segment, reason, ..
        } if segment.ends_with("CHECKPOINT")
            || reason.starts_with("the checkpoint embedded in HEADER") =>
        {
            "nothing was changed; the session's log verified and reads whole without its checkpoint, which is a cache: once you know no record is missing (compare with a backup or the harness's own copy), `repair ID` takes the session and the store's close writes a new one"
        }
        E::Corrupt { .. } => {
            "nothing was changed; `verify` lists every damaged session, the file and offset above say where to look, and `export --salvage ID` gets the readable part out"
        }
        E::NotFound(_) => "`ls` lists the stored sessions",
        E::Replaced(_) => "run `tail` again to follow the new session of that id",
        E::Exists(_) => "choose another id, or `import --replace`",
        E::BadId { .. } => "session ids must be non-empty",
        E::TooLarge { .. } => "append the events in smaller batches",
        E::Locked { .. } => {
            "another process (or handle) is writing this session; other sessions, and reading this one (ls, cat, tail, surface, derive, verify, stats, export), work meanwhile"
        }
        E::Closed => "the store was closed; open it again",
        E::Poisoned(_) => {
            "a sync failed, so later writes are refused: reopen the store (run the command again)"
        }
        E::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
            "this user may not read or write that file: check its permissions and its directory's"
        }
        E::Io { source, .. }
            if matches!(
                source.kind(),
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
            ) =>
        {
            "the disk (or the quota) is full: free some space and run the command again"
        }
        E::Io { source, .. } if source.kind() == io::ErrorKind::ReadOnlyFilesystem => {
            "the file system is mounted read-only: read commands still work"
        }
        E::Io { .. } | E::Manifest(M::Io { .. }) | E::Checkpoint { .. } => {
            "check the disk, permissions and free space"
        }
        E::Manifest(M::Missing { .. }) => {
            "no store here yet: create one with `sessionlog --store DIR import FILE...`"
        }
        E::Manifest(M::NotAStore { .. }) => {
            "give the store's directory (a new or empty one for `import`)"
        }
        E::Manifest(M::UnsupportedVersion { .. }) | E::Segment { .. } => {
            "this build cannot read that format version; the message says how to migrate"
        }
        E::Manifest(_) => "the store's MANIFEST is damaged: nothing was changed",
        E::Index { .. } | E::Internal { .. } => {
            "the session's index disagrees with its log: `verify` checks it; reopening rebuilds the index"
        }
        E::Encode { .. } => {
            "nothing was stored; the batch holds something the record codec cannot represent"
        }
        E::ReadOnly => "this command needs a writable store",
        E::NotOwner { .. } => {
            "another host owns the session: write it there, or `take-over ID` if that host is gone for good"
        }
        E::ReplacedElsewhere { .. } => {
            "this store's copy is older than the archive's session of that id: `rm ID` here (the archive's is kept), then read it again"
        }
        E::DeletedElsewhere { .. } => {
            "the session was deleted on another host: `rm ID` here too, or `take-over ID` to bring this copy back"
        }
        E::Archive { .. } => {
            "check the archive URL, the credentials (AWS_* variables) and that the bucket is reachable"
        }
        _ => "see the message above",
    };
    let m = format!("{e}\nhint: {hint}");
    match e {
        E::Io { .. }
        | E::Locked { .. }
        | E::Poisoned(_)
        | E::Closed
        | E::ReadOnly
        | E::Checkpoint { .. }
        | E::Manifest(M::Io { .. } | M::Missing { .. }) => Failure::Io(m),
        _ => Failure::Invalid(m),
    }
}

/// The archive tier given on the command line (`--archive URL`, issue 17),
/// used by every store open.
#[cfg(feature = "archive")]
pub(crate) static ARCHIVE: std::sync::OnceLock<store::ArchiveOptions> = std::sync::OnceLock::new();

/// The options every store open uses: the defaults, plus the archive when
/// one was given.
fn store_options() -> Options {
    Options {
        // Only `repair` closes an interrupted turn (it asks for the closers
        // itself): `compress`, `rm`, `fork` and the rest take a session for
        // writing without changing its log.
        close_interrupted_turns: false,
        #[cfg(feature = "archive")]
        archive: ARCHIVE.get().cloned(),
        ..Options::default()
    }
}

/// Whether an archive was given: the store directory is then a local copy
/// of the bucket's store, created (and filled) on first use.
fn archived() -> bool {
    #[cfg(feature = "archive")]
    return ARCHIVE.get().is_some();
    #[cfg(not(feature = "archive"))]
    false
}

/// Refuses a store path that is not a directory before the store is
/// opened (opening it would fail with "Not a directory" and a hint about
/// the disk).
fn check_store_dir(dir: &Path) -> Result<(), Failure> {
    if dir.exists() && !dir.is_dir() {
        return Err(Failure::Usage(format!(
            "{} is a file; --store takes a store directory (`import` creates one in a new or empty directory)",
            dir.display()
        )));
    }
    Ok(())
}

pub(crate) fn open_read_only(dir: &Path) -> Result<Store, Failure> {
    check_store_dir(dir)?;
    if archived() {
        // Reading fetches from the bucket into the local directory, so it
        // opens the store for writing (it appends nothing).
        return open_writer(dir, true);
    }
    Store::open_read_only(dir).map_err(store_err)
}

/// Opens the store for writing. Only `import` creates a store (in an
/// existing directory, or a new one whose parent exists): the other write
/// commands need an existing one.
pub(crate) fn open_writer(dir: &Path, create: bool) -> Result<Store, Failure> {
    check_store_dir(dir)?;
    if create && !dir.exists() {
        let parent = match dir.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => Path::new("/"),
        };
        if !parent.is_dir() {
            return Err(Failure::Io(format!(
                "cannot create the store {}: its parent directory {} does not exist\nhint: create it first (`mkdir -p {}`), or give another --store",
                dir.display(),
                parent.display(),
                parent.display()
            )));
        }
    }
    if !create && !archived() && !Store::is_store(dir) {
        return Err(Failure::Io(format!(
            "{}: no store here (`import` creates one)",
            dir.display()
        )));
    }
    Store::open(dir, store_options()).map_err(store_err)
}
