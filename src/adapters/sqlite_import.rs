//! Import of a SQLite database (schema 4 or 17) into a [`Store`]: read and
//! checked whole ([`read_db`]), then stored session by session.
//! Re-exported by [`crate::adapters::sqlite`].
//!
//! [`read_db`]: crate::adapters::sqlite::read_db

use crate::adapters::sqlite::{SqliteError, read_db_reporting};
use crate::adapters::{Progress, Reporter, storing};
use crate::store::Store;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// What [`import_db`] did for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedSession {
    /// The session id.
    pub id: String,
    /// Events imported from the database.
    pub events: u64,
    /// Closers appended by repair (the last turn was open).
    pub closers: u64,
    /// A session with this id was deleted first.
    pub replaced: bool,
    /// Schema 17: the first seq of a torn physical tail left out.
    pub torn_from: Option<u64>,
}

/// What [`import_db`] did, session by session in database order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    /// The database file.
    pub path: PathBuf,
    /// One entry per `sessions` row.
    pub sessions: Vec<ImportedSession>,
}

/// Imports every session of a schema 4 or 17 database into `store`.
///
/// The whole database is read and checked first ([`read_db`]), so an
/// invalid row leaves the store unchanged. An id already in the store is an
/// error (before anything is written) unless `replace`. Each session goes in
/// through [`storing::store_session`], which publishes it whole (with
/// `replace`, swapped in for the stored one only once it is durable), so a
/// failure or a crash never leaves a partial session; header-only sessions
/// are stored too. Then the session is repaired like after a crash: an
/// unclosed last turn gets its closers.
///
/// [`read_db`]: crate::adapters::sqlite::read_db
pub fn import_db(
    store: &Store,
    path: impl AsRef<Path>,
    replace: bool,
) -> Result<ImportReport, SqliteError> {
    import_db_with_progress(store, path, replace, &mut |_| {})
}

/// [`import_db`], telling `progress` how far it has got as it goes: the
/// sessions and events read and checked (at most once per
/// [`REPORT_EVENTS`] events, and once per session), then the sessions
/// stored, one report each. See [`Progress`].
///
/// [`REPORT_EVENTS`]: crate::adapters::REPORT_EVENTS
pub fn import_db_with_progress(
    store: &Store,
    path: impl AsRef<Path>,
    replace: bool,
    progress: &mut dyn FnMut(Progress),
) -> Result<ImportReport, SqliteError> {
    let path = path.as_ref();
    let mut progress = Reporter::new(progress);
    let sessions = read_db_reporting(path, &mut progress)?;
    let existing: HashSet<String> = store
        .list()
        .map_err(|source| SqliteError::Store {
            path: path.to_owned(),
            session: String::new(),
            source: Box::new(source),
        })?
        .into_iter()
        .map(|h| h.id)
        .collect();
    if !replace && let Some(s) = sessions.iter().find(|s| existing.contains(&s.header.id)) {
        return Err(SqliteError::ExistsInStore {
            path: path.to_owned(),
            session: s.header.id.clone(),
        });
    }
    let mut report = ImportReport {
        path: path.to_owned(),
        sessions: Vec::with_capacity(sessions.len()),
    };
    progress.storing(sessions.iter().map(|s| s.events.len() as u64).sum());
    for session in sessions {
        let id = session.header.id.clone();
        let store_err = |source| SqliteError::Store {
            path: path.to_owned(),
            session: id.clone(),
            source: Box::new(source),
        };
        let replaced = existing.contains(&id);
        let n = session.events.len() as u64;
        storing::store_session_reporting(
            store,
            session.header,
            &session.events,
            replace,
            &mut progress,
        )
        .map_err(store_err)?;
        let closers = store.repair(&id).map_err(store_err)?;
        progress.stored(n);
        report.sessions.push(ImportedSession {
            closers: closers.iter().filter(|e| e.seq >= n).count() as u64,
            id,
            events: n,
            replaced,
            torn_from: session.torn_from,
        });
    }
    Ok(report)
}
