//! Export: a stored session written as a harness session file, plain
//! JSONL (chunk runs packed or not) or a Zstandard log, to a writer or into
//! a harness sessions root.

use super::packed::{Row, pack_chunks, write_rows};
use super::zstd::{WriteStats, turn_batches, write_zstd_session_with};
use crate::adapters::root::{
    NAME_MAX, PATH_MAX, create_dirs_durably, export_path, id_escape, write_atomically,
};
use crate::header::SessionHeader;
use crate::store::{self, Store};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

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
}

/// Writes a stored session as a harness session file: plain JSONL, with
/// chunk runs packed if asked, or a Zstandard log with one frame per turn
/// (batches end after each `turn/end`, see [`turn_batches`]).
pub fn export_session(
    store: &Store,
    id: &str,
    out: &mut impl Write,
    opts: ExportOptions,
) -> Result<ExportReport, ExportError> {
    let (header, events) = store.load(id)?;
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

/// Exports a stored session into a harness sessions root, at
/// [`export_path`]. Every directory it creates is created alone and its
/// parent synced; the file is written beside its final name (a random
/// suffix), synced, renamed into place, and its directory synced. Returns
/// its path. A path too long for the file system ([`root_export_path`]) is
/// refused before anything is written.
pub fn export_session_to_root(
    store: &Store,
    id: &str,
    root: &Path,
    opts: ExportOptions,
) -> Result<PathBuf, ExportError> {
    let mut buf = Vec::new();
    let report = export_session(store, id, &mut buf, opts)?;
    let path = root_export_path(root, &report.header, opts)?;
    let dir = path.parent().expect("export paths have a parent");
    create_dirs_durably(dir)?;
    write_atomically(&path, &buf)?;
    Ok(path)
}
