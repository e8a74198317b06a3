//! Export: a stored session written as a harness session file, plain
//! JSONL (chunk runs packed or not) or a Zstandard log, to a writer or into
//! a harness sessions root.

use super::packed::{Row, pack_chunks, write_rows};
use super::zstd::{WriteStats, turn_batches, write_zstd_session_with};
use crate::adapters::root::{
    NAME_MAX, PATH_MAX, PLAIN_FILE_NAME, ZSTD_FILE_NAME, create_dirs_durably, export_path,
    id_escape, put_in_place,
};
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::store::{self, Store};
use crate::violation::{Location, Rule, Violation};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The `type`s of packed rows: a line with one of them is a packed row to
/// every reader of harness JSONL.
const PACKED_ROW_TYPES: [&str; 3] = ["text-chunks", "reasoning-chunks", "tool-call-chunks"];

/// The store event type under which the Node binding (`bindings/node`,
/// `backend.rs`) keeps each harness event whole: an ignorable event whose
/// `data` is the harness event's JSON text, verbatim.
pub const VERBATIM_KIND: &str = "harness/event";

/// `events` as the harness wrote them: every event the Node binding stored
/// whole ([`VERBATIM_KIND`]) is replaced by the harness event its `data`
/// holds, so an export writes the harness's own events. Written as they
/// are, those wrappers would read back as ignorable events of a type the
/// harness does not know, which it skips: a session with no turns and no
/// messages. A wrapped event that is not a harness event of the wrapper's
/// seq is a [`Violation`] at that seq (nothing is exported).
pub fn harness_events(events: Vec<OwnedEvent>) -> Result<Vec<OwnedEvent>, Violation> {
    if !events.iter().any(|e| e.kind == VERBATIM_KIND) {
        return Ok(events);
    }
    events
        .into_iter()
        .map(|e| {
            if e.kind != VERBATIM_KIND || !e.ignorable {
                return Ok(e);
            }
            let why = |reason: String| {
                Violation::new(
                    Location::Seq(e.seq),
                    Rule::Envelope,
                    format!("the harness event the Node binding stored is not one: {reason}"),
                )
            };
            let inner = Event::from_json(e.data.get()).map_err(|v| why(v.to_string()))?;
            if inner.seq != e.seq {
                return Err(why(format!("its seq is {}", inner.seq)));
            }
            Ok(inner.into_owned())
        })
        .collect()
}

/// How [`export_session`] writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Pack chunk runs into rows, as the harness's current form does.
    pub pack_chunks: bool,
    /// Write a Zstandard log (a header frame, then one frame per turn).
    pub zstd: bool,
}

/// What [`export_session`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// The session's header as written.
    pub header: SessionHeader,
    /// Events written (inside packed rows or not).
    pub events: u64,
    /// Lines, packed rows and frames written.
    pub stats: WriteStats,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The store could not load the session.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// Writing failed.
    #[error("writing the export: {0}")]
    Io(#[from] io::Error),
    /// The session's path in a harness root is longer than the file system
    /// takes: nothing of the session was written.
    #[error("session {session:?}: cannot be exported into a harness root: {}: {reason}", path.display())]
    PathTooLong {
        /// The session id.
        session: String,
        /// Where the harness's root layout puts it.
        path: PathBuf,
        /// Which part is too long, by how much, and why it is that long.
        reason: String,
    },
    /// An event a harness JSONL file cannot hold: its `type` is one of the
    /// packed row tags (`text-chunks`, `reasoning-chunks`,
    /// `tool-call-chunks`), so every reader (the harness's and ours) would
    /// take its line for a packed row and refuse the file. Nothing was
    /// written. (A schema 17 database holds it: its `ignorable` column
    /// tells packed rows from events.)
    #[error(
        "session {session:?}, seq {seq}: cannot be written as harness JSONL: {reason}; nothing of the session was written (export it to a .db, schema 17, which holds it)"
    )]
    Unrepresentable {
        /// The session id.
        session: String,
        /// The event.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// An event the Node binding stored whole does not hold a harness event
    /// of its seq ([`harness_events`]). Nothing was written.
    #[error("session {session:?}: {violation}; nothing of the session was written")]
    Event {
        /// The session id.
        session: String,
        /// What is wrong, at which seq.
        violation: Violation,
    },
    /// The harness root already holds a log of this session (at its path,
    /// holding something else than the export, or under another project
    /// directory, or in the other encoding): writing would replace it, or
    /// leave the harness two logs of one id. Nothing was written.
    #[error("session {session:?}: the harness root already holds {}: {reason}; nothing of the session was written", path.display())]
    Exists {
        /// The session id.
        session: String,
        /// The log already there.
        path: PathBuf,
        /// Why writing beside or over it is refused.
        reason: String,
    },
}

/// Writes a stored session as a harness session file: plain JSONL, with
/// chunk runs packed if asked, or a Zstandard log with one frame per turn
/// (batches end after each `turn/end`, see [`turn_batches`]). Events the
/// Node binding stored whole are written as the harness events they hold
/// ([`harness_events`]). A session
/// holding an event whose type is a packed row's tag is refused
/// ([`ExportError::Unrepresentable`]) before anything is written: its line
/// would read back as a malformed packed row.
pub fn export_session(
    store: &Store,
    id: &str,
    out: &mut impl Write,
    opts: ExportOptions,
) -> Result<ExportReport, ExportError> {
    let (header, events) = store.load(id)?;
    let events = harness_events(events).map_err(|violation| ExportError::Event {
        session: header.id.clone(),
        violation,
    })?;
    if let Some(e) = events
        .iter()
        .find(|e| PACKED_ROW_TYPES.contains(&e.kind.as_ref()))
    {
        return Err(ExportError::Unrepresentable {
            session: header.id.clone(),
            seq: e.seq,
            reason: format!(
                "its type {:?} is a packed row's tag, so its line would be read as a packed row",
                e.kind
            ),
        });
    }
    let stats = if opts.zstd {
        let batches = turn_batches(&events);
        write_zstd_session_with(out, &header, &events, &batches, opts.pack_chunks)?
    } else {
        let rows: Vec<Row<'_>> = if opts.pack_chunks {
            pack_chunks(&events)
        } else {
            events.iter().map(Row::Event).collect()
        };
        let mut buf = Vec::with_capacity(1 << 16);
        write_rows(&mut buf, Some(&header), &rows);
        out.write_all(&buf)?;
        WriteStats {
            rows: rows.len() as u64,
            packed_rows: rows.iter().filter(|r| matches!(r, Row::Packed(_))).count() as u64,
            frames: 0,
        }
    };
    Ok(ExportReport {
        header,
        events: events.len() as u64,
        stats,
    })
}

/// Where [`export_session_to_root`] writes the session of `header` under
/// `root` ([`export_path`]), if the file system can hold that path: every
/// component at most [`NAME_MAX`] bytes, the whole under [`PATH_MAX`].
/// The harness's layout puts the escaped id ([`id_escape`], 5 bytes for
/// every character outside `[A-Za-z0-9._-]`) in one component, so an id
/// the store keeps (under a shortened directory name) may not fit:
/// [`ExportError::PathTooLong`] names the session, the path and the part
/// that is too long. Checking every session first lets an export of
/// several refuse before it writes anything.
pub fn root_export_path(
    root: &Path,
    header: &SessionHeader,
    opts: ExportOptions,
) -> Result<PathBuf, ExportError> {
    use std::os::unix::ffi::OsStrExt;
    let path = export_path(root, header, opts.zstd);
    let too_long = |reason: String| ExportError::PathTooLong {
        session: header.id.clone(),
        path: path.clone(),
        reason,
    };
    let escaped = id_escape(&header.id);
    for c in path.components() {
        let len = c.as_os_str().as_bytes().len();
        if len <= NAME_MAX {
            continue;
        }
        return Err(too_long(if c.as_os_str() == escaped.as_str() {
            format!(
                "the harness's root layout writes the id, escaped (5 bytes for every character outside [A-Za-z0-9._-]), as one directory name, and it is {len} bytes: over the {NAME_MAX} bytes a file name may have"
            )
        } else {
            format!(
                "a file name in it is {len} bytes: over the {NAME_MAX} bytes a file name may have"
            )
        }));
    }
    let len = path.as_os_str().as_bytes().len();
    if len >= PATH_MAX {
        return Err(too_long(format!(
            "the path is {len} bytes, and the system takes paths of less than {PATH_MAX}"
        )));
    }
    Ok(path)
}

/// The logs of the session `id` already in the harness root `root`, by
/// the harness's own lookup: `<root>/<any project dir>/<id_escape(id)>/`
/// `session.jsonl.zstd` or `session.jsonl` (its loader finds a session by
/// id in every project directory, and refuses an id found twice or a log
/// in the other encoding).
fn logs_in_root(root: &Path, id: &str) -> io::Result<Vec<PathBuf>> {
    let projects = match std::fs::read_dir(root) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let escaped = id_escape(id);
    let mut found = Vec::new();
    for project in projects {
        let project = project?;
        if !project.file_type()?.is_dir() {
            continue;
        }
        for name in [ZSTD_FILE_NAME, PLAIN_FILE_NAME] {
            let p = project.path().join(&escaped).join(name);
            match std::fs::symlink_metadata(&p) {
                Ok(_) => found.push(p),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // A project entry that is not a directory (ENOTDIR) holds
                // no session directory.
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
                Err(e) => return Err(e),
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Checks that `bytes`, the export of the session of `header`, can go to
/// `path` in `root` without replacing or shadowing a log the root already
/// holds: `Ok(true)` when exactly these bytes are already there (nothing
/// to write), `Ok(false)` when no log of the session is there, and
/// [`ExportError::Exists`] otherwise.
fn check_root_destination(
    root: &Path,
    header: &SessionHeader,
    path: &Path,
    bytes: &[u8],
) -> Result<bool, ExportError> {
    let mut same = false;
    for existing in logs_in_root(root, &header.id)? {
        let exists = |reason: String| ExportError::Exists {
            session: header.id.clone(),
            path: existing.clone(),
            reason,
        };
        if existing != path {
            return Err(exists(format!(
                "a log of this session the export would not replace ({} is where it writes); the harness refuses a session id found twice in one root, or a log in the other encoding",
                path.display()
            )));
        }
        let is_file = std::fs::symlink_metadata(&existing)?.file_type().is_file();
        if !is_file || std::fs::read(&existing)? != bytes {
            return Err(exists(
                "a log of this session that differs from the export, which would replace it (remove it first, or export into another root)".into(),
            ));
        }
        same = true;
    }
    Ok(same)
}

/// Checks, without writing anything, that [`export_session_to_root`] would
/// not be refused for a log the root already holds ([`ExportError::Exists`],
/// see there), nor for its path ([`root_export_path`]): so an export of
/// several sessions can refuse before it writes any. The session is only
/// encoded when the root holds a log of its id (to compare the bytes).
pub fn check_export_to_root(
    store: &Store,
    id: &str,
    root: &Path,
    opts: ExportOptions,
) -> Result<(), ExportError> {
    let header = store.header(id)?;
    let path = root_export_path(root, &header, opts)?;
    if logs_in_root(root, id)?.is_empty() {
        return Ok(());
    }
    let mut buf = Vec::new();
    export_session(store, id, &mut buf, opts)?;
    check_root_destination(root, &header, &path, &buf).map(drop)
}

/// A log in the harness root `root` of the encoding an export with `zstd`
/// does NOT write (`<root>/<project>/<session>/session.jsonl` for a
/// Zstandard export, `session.jsonl.zstd` otherwise), if there is one: the
/// harness's JSONL backend refuses a root holding both encodings, so an
/// export into it would make every session of the root unloadable.
pub fn other_encoding_in_root(root: &Path, zstd: bool) -> io::Result<Option<PathBuf>> {
    let other = if zstd {
        PLAIN_FILE_NAME
    } else {
        ZSTD_FILE_NAME
    };
    let projects = match std::fs::read_dir(root) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for project in projects {
        let project = project?;
        if !project.file_type()?.is_dir() {
            continue;
        }
        for session in std::fs::read_dir(project.path())? {
            let session = session?;
            if !session.file_type()?.is_dir() {
                continue;
            }
            let p = session.path().join(other);
            if std::fs::symlink_metadata(&p).is_ok() {
                return Ok(Some(p));
            }
        }
    }
    Ok(None)
}

/// Exports a stored session into a harness sessions root, at
/// [`export_path`]. Every directory it creates is created alone and its
/// parent synced; the file is written beside its final name (a random
/// suffix), synced, linked into place (never over an existing file), and
/// its directory synced. Returns its path. A path too long for the file
/// system ([`root_export_path`]) is refused before anything is written, and
/// so is a root that already holds a log of the session
/// ([`ExportError::Exists`]): at the same path with other contents (an
/// export never replaces a session the harness wrote), under another
/// project directory, or in the other encoding. A log already there with
/// exactly the export's bytes is left as it is.
pub fn export_session_to_root(
    store: &Store,
    id: &str,
    root: &Path,
    opts: ExportOptions,
) -> Result<PathBuf, ExportError> {
    let mut buf = Vec::new();
    let report = export_session(store, id, &mut buf, opts)?;
    let path = root_export_path(root, &report.header, opts)?;
    if check_root_destination(root, &report.header, &path, &buf)? {
        return Ok(path);
    }
    let dir = path.parent().expect("export paths have a parent");
    create_dirs_durably(dir)?;
    write_new(&path, &buf).map_err(|e| match e.kind() {
        // Another writer put a log there since the check.
        io::ErrorKind::AlreadyExists => ExportError::Exists {
            session: report.header.id.clone(),
            path: path.clone(),
            reason: "a log of this session, written while the export ran".into(),
        },
        _ => ExportError::Io(e),
    })?;
    Ok(path)
}

/// Writes `bytes` to the new file `path` atomically and durably:
/// `path.tmp-<random>` (mode 0600), synced, hard-linked to `path` (which
/// fails with `AlreadyExists` rather than replace a file), the temporary
/// removed and the directory synced. On failure `path` is as it was.
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    put_in_place(path, bytes, |tmp| std::fs::hard_link(tmp, path))
}
