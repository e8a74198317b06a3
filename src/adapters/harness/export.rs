//! Export: a stored session written as a harness session file, plain
//! JSONL (chunk runs packed or not) or a Zstandard log, to a writer or into
//! a harness sessions root.

use super::packed::{Row, pack_chunks, write_rows};
use super::zstd::{WriteStats, turn_batches, write_zstd_session_with};
use crate::adapters::root::{create_dirs_durably, export_path, write_atomically};
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

/// Exports a stored session into a harness sessions root, at
/// [`export_path`]. Every directory it creates is created alone and its
/// parent synced; the file is written beside its final name (a random
/// suffix), synced, renamed into place, and its directory synced. Returns
/// its path.
pub fn export_session_to_root(
    store: &Store,
    id: &str,
    root: &Path,
    opts: ExportOptions,
) -> Result<PathBuf, ExportError> {
    let mut buf = Vec::new();
    let report = export_session(store, id, &mut buf, opts)?;
    let path = export_path(root, &report.header, opts.zstd);
    let dir = path.parent().expect("export paths have a parent");
    create_dirs_durably(dir)?;
    write_atomically(&path, &buf)?;
    Ok(path)
}
