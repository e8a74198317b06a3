//! Exporting sessions to a SQLite database of schema 4 or 17, atomically.
//!
//! - A new database (the path is absent or an empty file) is built in
//!   `PATH.tmp-<random>` (mode 0600: the harness refuses a database others
//!   can read), in one transaction, closed, synced, then renamed into place
//!   and the directory synced: a crash or a full disk leaves the old path as
//!   it was, never a fragment.
//! - An existing database must be exactly the asked schema: its version,
//!   and exactly the objects of the DDL (an extra trigger, view, index or
//!   table is refused, since it could rewrite or drop what we insert), for
//!   schema 17 also the application id and store id. All sessions are then
//!   added in ONE transaction, so an error leaves the database unchanged.

use crate::adapters::sqlite::{self, SqliteError};
use crate::adapters::sqlite17;
use crate::store::Store;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Exports the sessions `ids` of `store` to the database at `path` in
/// schema `version` (4 or 17; anything else is refused, naming it). See the
/// module documentation for atomicity. Every id is checked first: an id
/// listed twice, or already in an existing database, is an error and
/// nothing is written. So is a session holding anything the schema has no
/// column for (schema 4: the header's `origin`, `delegationDepth`,
/// `agentPreset`, an event's `ignorable`): [`SqliteError::Unrepresentable`]
/// names it, never a silent loss.
pub fn export_db(
    store: &Store,
    ids: &[String],
    path: &Path,
    version: i64,
) -> Result<(), SqliteError> {
    if version != sqlite::SCHEMA_VERSION && version != sqlite17::SCHEMA_VERSION {
        return Err(SqliteError::UnsupportedExportSchema {
            path: path.to_owned(),
            version,
        });
    }
    let mut seen = HashSet::new();
    if let Some(dup) = ids.iter().find(|id| !seen.insert(id.as_str())) {
        return Err(SqliteError::DuplicateId {
            path: path.to_owned(),
            session: dup.clone(),
        });
    }
    let existing = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
    if existing {
        export_into_existing(store, ids, path, version)
    } else {
        export_new(store, ids, path, version)
    }
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> SqliteError + '_ {
    move |source| SqliteError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Inserts every session, in the transaction `conn` is in.
fn insert_all(
    conn: &Connection,
    store: &Store,
    ids: &[String],
    path: &Path,
    version: i64,
) -> Result<(), SqliteError> {
    for id in ids {
        let (header, events) = store.load(id).map_err(|source| SqliteError::Store {
            path: path.to_owned(),
            session: id.clone(),
            source: Box::new(source),
        })?;
        // What the Node binding stored whole, as the harness's events.
        let events = crate::adapters::harness::harness_events(events).map_err(|violation| {
            SqliteError::Invalid {
                path: path.to_owned(),
                session: id.clone(),
                seq: violation.seq().and_then(|s| i64::try_from(s).ok()),
                violation,
            }
        })?;
        if version == sqlite17::SCHEMA_VERSION {
            sqlite17::insert_session(conn, path, &header, &events)?;
        } else {
            sqlite::insert_session(conn, path, &header, &events)?;
        }
    }
    Ok(())
}

fn export_into_existing(
    store: &Store,
    ids: &[String],
    path: &Path,
    version: i64,
) -> Result<(), SqliteError> {
    let err = sqlite::sql_err(path);
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(&err)?;
    // Triggers must not run on our inserts (trusted_schema off refuses
    // functions with side effects in them; the object check below refuses
    // triggers outright), and durability is the harness's: FULL sync.
    conn.execute_batch(
        "PRAGMA trusted_schema = OFF; PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL;",
    )
    .map_err(&err)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&err)?;
    let found: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(&err)?;
    if found != version {
        return Err(SqliteError::OtherSchema {
            path: path.to_owned(),
            found,
            asked: version,
        });
    }
    if version == sqlite17::SCHEMA_VERSION {
        sqlite17::check_schema(&tx, path)?;
    } else {
        sqlite::check_schema(&tx, path)?;
        sqlite17::check_objects(&tx, path, sqlite::DDL)?;
    }
    for id in ids {
        let there = tx
            .query_row("SELECT 1 FROM sessions WHERE id = ?1", [id], |_| Ok(()))
            .optional()
            .map_err(&err)?
            .is_some();
        if there {
            return Err(SqliteError::ExistsInDb {
                path: path.to_owned(),
                session: id.clone(),
            });
        }
    }
    insert_all(&tx, store, ids, path, version)?;
    // Dropping `tx` on any error above rolls everything back.
    tx.commit().map_err(&err)
}

/// `PATH.tmp-<16 hex digits>`, beside `path`.
fn temp_path(path: &Path) -> PathBuf {
    let r: [u8; 8] = sqlite17::random_bytes();
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(".tmp-{hex}"));
    path.with_file_name(name)
}

fn export_new(store: &Store, ids: &[String], path: &Path, version: i64) -> Result<(), SqliteError> {
    let tmp = temp_path(path);
    let result = build(store, ids, path, &tmp, version).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(io_err(path))?;
        crate::adapters::root::sync_parent(path).map_err(io_err(path))
    });
    if result.is_err() {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = tmp.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
    result
}

/// Builds the whole database in `tmp` and syncs it.
fn build(
    store: &Store,
    ids: &[String],
    path: &Path,
    tmp: &Path,
    version: i64,
) -> Result<(), SqliteError> {
    let err = sqlite::sql_err(path);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(io_err(tmp))?;
    let mut conn = Connection::open_with_flags(
        tmp,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(&err)?;
    conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL;")
        .map_err(&err)?;
    // Both layouts are written in WAL mode, as the harness does by default.
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(&err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(SqliteError::JournalMode {
            path: path.to_owned(),
            found: mode,
        });
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&err)?;
    if version == sqlite17::SCHEMA_VERSION {
        sqlite17::initialize(&tx).map_err(&err)?;
    } else {
        sqlite::initialize(&tx).map_err(&err)?;
    }
    insert_all(&tx, store, ids, path, version)?;
    tx.commit().map_err(&err)?;
    // Closing checkpoints the WAL into the file and removes it.
    conn.close().map_err(|(_, e)| err(e))?;
    std::fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .map_err(io_err(tmp))
}
