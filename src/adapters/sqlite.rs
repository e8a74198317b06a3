//! The harness's SQLite layout, schema version 4 (section 9): a `sessions`
//! table (one row per session header) and an `events` table (one row per
//! logical event, `data`, `source_event_seqs` and `surface_op` as JSON text).
//!
//! [`read_db`] and [`import_db`] read schema 4 here and schema 17 through
//! [`crate::adapters::sqlite17`], by `PRAGMA user_version`, and never
//! migrate: any other version, or tables whose columns differ from the DDL,
//! are rejected before a row is read. Exports of both go through
//! [`crate::adapters::sqlite_export`]. Every row passes the same rules as a
//! JSONL line: the columns are assembled into one JSON envelope, parsed by
//! [`Event::from_json`] and folded through a [`SessionState`], so the first
//! broken rule is reported with its session and seq.
//!
//! Import validates the whole database before it writes anything to the
//! store; export writes all sessions in one transaction, atomically.

use crate::adapters::Reporter;
use crate::event::{Event, OwnedEvent, SurfaceOp};
use crate::header::SessionHeader;
use crate::json::Fields;
use crate::session::SessionState;
use crate::store::{self, Store};
use crate::violation::{Location, Rule, Violation};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde_json::value::RawValue;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use crate::adapters::sqlite_import::{
    ImportReport, ImportedSession, import_db, import_db_with_progress,
};

/// The schema version this adapter reads and writes.
pub const SCHEMA_VERSION: i64 = 4;

/// The DDL of schema version 4, as the harness writes it.
pub const DDL: &str = "CREATE TABLE sessions (id TEXT PRIMARY KEY, version INTEGER NOT NULL, created_at INTEGER NOT NULL, cwd TEXT, parent_session TEXT, seed_length INTEGER) STRICT;
CREATE TABLE events (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, seq INTEGER NOT NULL, type TEXT NOT NULL, time INTEGER NOT NULL, data TEXT NOT NULL, source_event_seqs TEXT, surface_op TEXT, PRIMARY KEY (session_id, seq)) STRICT;";

/// One column as `PRAGMA table_xinfo` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    decl_type: String,
    not_null: bool,
    default: Option<String>,
    /// Position in the primary key (1-based), 0 when not part of it.
    pk: i64,
    /// Non-zero for hidden and generated columns.
    hidden: i64,
}

impl Column {
    fn new(name: &str, decl_type: &str, not_null: bool, pk: i64) -> Self {
        Column {
            name: name.into(),
            decl_type: decl_type.into(),
            not_null,
            default: None,
            pk,
            hidden: 0,
        }
    }

    fn describe(&self) -> String {
        let mut s = format!("{} {}", self.name, self.decl_type);
        if self.not_null {
            s.push_str(" NOT NULL");
        }
        if self.pk > 0 {
            let _ = write!(s, " PK#{}", self.pk);
        }
        if let Some(d) = &self.default {
            let _ = write!(s, " DEFAULT {d}");
        }
        if self.hidden != 0 {
            let _ = write!(s, " HIDDEN({})", self.hidden);
        }
        s
    }
}

/// The columns of schema 4. Primary-key columns of a STRICT table are
/// implicitly NOT NULL, and `table_xinfo` says so.
fn expected_columns(table: &str) -> Vec<Column> {
    match table {
        "sessions" => vec![
            Column::new("id", "TEXT", true, 1),
            Column::new("version", "INTEGER", true, 0),
            Column::new("created_at", "INTEGER", true, 0),
            Column::new("cwd", "TEXT", false, 0),
            Column::new("parent_session", "TEXT", false, 0),
            Column::new("seed_length", "INTEGER", false, 0),
        ],
        _ => vec![
            Column::new("session_id", "TEXT", true, 1),
            Column::new("seq", "INTEGER", true, 2),
            Column::new("type", "TEXT", true, 0),
            Column::new("time", "INTEGER", true, 0),
            Column::new("data", "TEXT", true, 0),
            Column::new("source_event_seqs", "TEXT", false, 0),
            Column::new("surface_op", "TEXT", false, 0),
        ],
    }
}

/// Errors of the SQLite adapter; each names the database file and, where
/// there is one, the session and seq.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteError {
    /// SQLite itself failed (open, query, write).
    #[error("{path}: SQLite error: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        source: rusqlite::Error,
    },
    /// `PRAGMA user_version` is neither 4 nor 17 (or not the one expected).
    #[error(
        "{path}: SQLite schema version {found} is not supported: sessionlog reads and writes schema versions 4 and 17 and never migrates"
    )]
    UnsupportedSchema {
        /// The database file.
        path: PathBuf,
        /// The `user_version` found.
        found: i64,
    },
    /// `PRAGMA application_id` is not the harness's (schema 17).
    #[error(
        "{path}: application id {found}, expected {} (a harness session database)",
        crate::adapters::sqlite17::APPLICATION_ID
    )]
    ApplicationId {
        /// The database file.
        path: PathBuf,
        /// The id found.
        found: i64,
    },
    /// The database's objects (tables, indexes, triggers, views) are not
    /// exactly those of the schema's DDL.
    #[error("{path}: the database does not contain exactly the required schema objects: {detail}")]
    SchemaObjects {
        /// The database file.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The `persistence_state` row is missing or its store id is not a UUID.
    #[error("{path}: no valid store identity (persistence_state store_id {found:?})")]
    StoreId {
        /// The database file.
        path: PathBuf,
        /// The store id found, if it is text.
        found: Option<String>,
    },
    /// A physical row does not decode (schema 17), or breaks the seq order,
    /// before a later `turn/end`.
    #[error("{path}: session {session:?}{}: corrupt session log: {reason}", .seq.map(|s| format!(", events row seq {s}")).unwrap_or_else(|| ", sessions row".into()))]
    CorruptRow {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
        /// The row's `seq`; `None` for the `sessions` row.
        seq: Option<i64>,
        /// What is wrong.
        reason: String,
    },
    /// Export was asked for a schema version it does not write.
    #[error(
        "{path}: cannot write SQLite schema version {version}: sessionlog writes schema versions 4 and 17"
    )]
    UnsupportedExportSchema {
        /// The database file.
        path: PathBuf,
        /// The version asked for.
        version: i64,
    },
    /// Export into an existing database of another schema version.
    #[error(
        "{path}: the database is SQLite schema version {found}; refusing to add schema {asked} rows to it (export with --schema {found}, or to a new file)"
    )]
    OtherSchema {
        /// The database file.
        path: PathBuf,
        /// Its `user_version`.
        found: i64,
        /// The version asked for.
        asked: i64,
    },
    /// An I/O step of an atomic export failed (temporary file, sync, rename).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A table is missing or differs from the schema 4 DDL.
    #[error("{path}: table {table:?} does not match SQLite schema version 4: {detail}")]
    SchemaMismatch {
        /// The database file.
        path: PathBuf,
        /// The table.
        table: String,
        /// What was found.
        detail: String,
    },
    /// `events` rows name a session that has no `sessions` row.
    #[error("{path}: {count} events rows name session {session:?}, which has no sessions row")]
    OrphanEvents {
        /// The database file.
        path: PathBuf,
        /// The session id the rows name.
        session: String,
        /// How many rows.
        count: u64,
    },
    /// A row breaks a rule of the session model.
    #[error("{path}: session {session:?}, {}: {violation}", row_name(*.seq))]
    Invalid {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
        /// The `seq` column of the offending `events` row; `None` for the
        /// `sessions` row.
        seq: Option<i64>,
        /// The rule and reason.
        violation: Violation,
    },
    /// Import without `replace` found the session already in the store.
    #[error(
        "{path}: session {session:?} already exists in the store (import with replace to overwrite it); nothing was imported"
    )]
    ExistsInStore {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
    },
    /// Export found the session already in the database.
    #[error("{path}: session {session:?} already exists in the database; nothing was exported")]
    ExistsInDb {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
    },
    /// The same id was given twice to export.
    #[error("{path}: session {session:?} is listed twice; nothing was exported")]
    DuplicateId {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
    },
    /// The store failed for a session.
    #[error("{path}: session {session:?}: {source}")]
    Store {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
        /// The store error.
        source: Box<store::Error>,
    },
    /// A stored session holds something schema 4 has no column for.
    #[error("{path}: session {session:?}{}: cannot be written to the SQLite schema: {reason}", .seq.map(|s| format!(", seq {s}")).unwrap_or_default())]
    Unrepresentable {
        /// The database file.
        path: PathBuf,
        /// The session id.
        session: String,
        /// The event, if it is one.
        seq: Option<u64>,
        /// Why.
        reason: String,
    },
    /// The database refused WAL journal mode.
    #[error("{path}: journal mode is {found:?} after PRAGMA journal_mode=WAL")]
    JournalMode {
        /// The database file.
        path: PathBuf,
        /// The journal mode SQLite reported.
        found: String,
    },
}

fn row_name(seq: Option<i64>) -> String {
    match seq {
        Some(s) => format!("events row seq {s}"),
        None => "sessions row".into(),
    }
}

/// A session read from a schema 4 database.
#[derive(Debug, Clone, PartialEq)]
pub struct SqliteSession {
    /// The header (`origin`, `delegationDepth` and `agentPreset` have no
    /// column and take their defaults).
    pub header: SessionHeader,
    /// The events, in seq order, `data` verbatim.
    pub events: Vec<OwnedEvent>,
    /// The closers crash repair would append (empty when the last turn is
    /// closed).
    pub closers: Vec<OwnedEvent>,
    /// Schema 17: the first seq of a torn physical tail that was left out
    /// (rows after the last `turn/end` that do not decode or break the seq
    /// order), as the harness's loader leaves it out.
    pub torn_from: Option<u64>,
}

pub(crate) fn sql_err(path: &Path) -> impl Fn(rusqlite::Error) -> SqliteError + '_ {
    move |source| SqliteError::Sqlite {
        path: path.to_owned(),
        source,
    }
}

/// Checks `PRAGMA user_version` and both tables against the schema 4 DDL.
pub(crate) fn check_schema(conn: &Connection, path: &Path) -> Result<(), SqliteError> {
    let err = sql_err(path);
    let found: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(&err)?;
    if found != SCHEMA_VERSION {
        return Err(SqliteError::UnsupportedSchema {
            path: path.to_owned(),
            found,
        });
    }
    for table in ["sessions", "events"] {
        let mismatch = |detail: String| SqliteError::SchemaMismatch {
            path: path.to_owned(),
            table: table.to_owned(),
            detail,
        };
        let kind: Option<(String, i64, i64)> = conn
            .query_row(
                "SELECT type, wr, strict FROM pragma_table_list WHERE schema = 'main' AND name = ?1",
                [table],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(&err)?;
        let Some((kind, without_rowid, strict)) = kind else {
            let mut stmt = conn
                .prepare(
                    "SELECT name FROM pragma_table_list WHERE schema = 'main' AND name NOT LIKE 'sqlite_%' ORDER BY name",
                )
                .map_err(&err)?;
            let names = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(&err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            return Err(mismatch(format!(
                "the table is missing; the database has {names:?}"
            )));
        };
        if kind != "table" {
            return Err(mismatch(format!("it is a {kind}, not a table")));
        }
        if strict != 1 {
            return Err(mismatch("the table is not STRICT".into()));
        }
        if without_rowid != 0 {
            return Err(mismatch("the table is WITHOUT ROWID".into()));
        }
        let mut stmt = conn
            .prepare(
                "SELECT name, type, \"notnull\", dflt_value, pk, hidden FROM pragma_table_xinfo(?1) ORDER BY cid",
            )
            .map_err(&err)?;
        let found = stmt
            .query_map([table], |r| {
                Ok(Column {
                    name: r.get(0)?,
                    decl_type: r.get(1)?,
                    not_null: r.get::<_, i64>(2)? != 0,
                    default: r.get(3)?,
                    pk: r.get(4)?,
                    hidden: r.get(5)?,
                })
            })
            .map_err(&err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(&err)?;
        let expected = expected_columns(table);
        if found != expected {
            let list = |cols: &[Column]| {
                cols.iter()
                    .map(Column::describe)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let missing: Vec<&str> = expected
                .iter()
                .filter(|e| !found.iter().any(|f| f.name == e.name))
                .map(|e| e.name.as_str())
                .collect();
            let mut detail = format!(
                "found columns ({}); expected ({})",
                list(&found),
                list(&expected)
            );
            if !missing.is_empty() {
                let _ = write!(detail, "; missing {missing:?}");
            }
            return Err(mismatch(detail));
        }
    }
    // The foreign key of events, as in the DDL.
    let fks = {
        let mut stmt = conn
            .prepare(
                r#"SELECT "table", "from", "to", on_delete FROM pragma_foreign_key_list('events')"#,
            )
            .map_err(&err)?;
        stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .map_err(&err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(&err)?
    };
    let want = (
        "sessions".to_owned(),
        "session_id".to_owned(),
        Some("id".to_owned()),
        "CASCADE".to_owned(),
    );
    if fks != [want] {
        return Err(SqliteError::SchemaMismatch {
            path: path.to_owned(),
            table: "events".into(),
            detail: format!(
                "foreign keys {fks:?}; expected session_id REFERENCES sessions(id) ON DELETE CASCADE"
            ),
        });
    }
    Ok(())
}

/// Opens `path` read-only (no URI interpretation, no create).
fn open_read_only(path: &Path) -> Result<Connection, SqliteError> {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql_err(path))
}

/// Reads every session of a schema 4 or schema 17 database (by its
/// `PRAGMA user_version`; any other version is refused, naming it), in
/// `sessions` row order, checking every row by the rules of the session
/// model (non-strict), and for schema 17 every check the harness's reader
/// makes ([`crate::adapters::sqlite17`]).
///
/// The database is opened read-only and read in one transaction.
pub fn read_db(path: impl AsRef<Path>) -> Result<Vec<SqliteSession>, SqliteError> {
    read_db_reporting(path.as_ref(), &mut Reporter::new(&mut |_| {}))
}

/// [`read_db`], reporting the sessions and events read to `progress`.
pub(crate) fn read_db_reporting(
    path: &Path,
    progress: &mut Reporter<'_>,
) -> Result<Vec<SqliteSession>, SqliteError> {
    let mut conn = open_read_only(path)?;
    let tx = conn.transaction().map_err(sql_err(path))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql_err(path))?;
    let sessions = if version == crate::adapters::sqlite17::SCHEMA_VERSION {
        crate::adapters::sqlite17::read_sessions(&tx, path, progress)?
    } else {
        check_schema(&tx, path)?;
        read_sessions(&tx, path, progress)?
    };
    tx.finish().map_err(sql_err(path))?;
    Ok(sessions)
}

/// Refuses `events` rows whose `session_id` has no `sessions` row (both
/// schemas): reading session by session would never see them, so they
/// would be lost without a word.
pub(crate) fn check_orphans(conn: &Connection, path: &Path) -> Result<(), SqliteError> {
    let err = sql_err(path);
    let orphan: Option<(String, u64)> = conn
        .query_row(
            "SELECT session_id, COUNT(*) FROM events WHERE session_id NOT IN (SELECT id FROM sessions) GROUP BY session_id ORDER BY session_id LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)),
        )
        .optional()
        .map_err(&err)?;
    match orphan {
        Some((session, count)) => Err(SqliteError::OrphanEvents {
            path: path.to_owned(),
            session,
            count,
        }),
        None => Ok(()),
    }
}

fn read_sessions(
    conn: &Connection,
    path: &Path,
    progress: &mut Reporter<'_>,
) -> Result<Vec<SqliteSession>, SqliteError> {
    let err = sql_err(path);
    check_orphans(conn, path)?;
    let mut sessions_stmt = conn
        .prepare(
            "SELECT id, version, created_at, cwd, parent_session, seed_length FROM sessions ORDER BY rowid",
        )
        .map_err(&err)?;
    let rows = sessions_stmt
        .query_map([], |r| {
            Ok(SessionRow {
                id: r.get(0)?,
                version: r.get(1)?,
                created_at: r.get(2)?,
                cwd: r.get(3)?,
                parent_session: r.get(4)?,
                seed_length: r.get(5)?,
            })
        })
        .map_err(&err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(&err)?;
    let mut events_stmt = conn
        .prepare(
            "SELECT seq, type, time, data, source_event_seqs, surface_op FROM events WHERE session_id = ?1 ORDER BY seq",
        )
        .map_err(&err)?;
    let mut out = Vec::with_capacity(rows.len());
    progress.start_sessions(rows.len() as u64);
    for row in rows {
        let header = row.header().map_err(|violation| SqliteError::Invalid {
            path: path.to_owned(),
            session: row.id.clone(),
            seq: None,
            violation,
        })?;
        let mut state = SessionState::new(false);
        let mut events: Vec<OwnedEvent> = Vec::new();
        let mut rows = events_stmt.query([&row.id]).map_err(&err)?;
        let mut line = String::new();
        while let Some(r) = rows.next().map_err(&err)? {
            let seq: i64 = r.get(0).map_err(&err)?;
            let kind: String = r.get(1).map_err(&err)?;
            let time: i64 = r.get(2).map_err(&err)?;
            let data: String = r.get(3).map_err(&err)?;
            let sources: Option<String> = r.get(4).map_err(&err)?;
            let op: Option<String> = r.get(5).map_err(&err)?;
            let invalid = |mut violation: Violation| {
                if let (Location::Line(_), Ok(s)) = (violation.location, u64::try_from(seq)) {
                    violation.location = Location::Seq(s);
                }
                SqliteError::Invalid {
                    path: path.to_owned(),
                    session: row.id.clone(),
                    seq: Some(seq),
                    violation,
                }
            };
            envelope_line(
                &mut line,
                seq,
                &kind,
                time,
                &data,
                sources.as_deref(),
                op.as_deref(),
            )
            .map_err(&invalid)?;
            let event = Event::from_json(&line).map_err(&invalid)?;
            state.append(&event, &events).map_err(&invalid)?;
            events.push(event.into_owned());
            progress.event();
        }
        out.push(SqliteSession {
            header,
            events,
            closers: state.closers(),
            torn_from: None,
        });
        progress.session_read();
    }
    Ok(out)
}

struct SessionRow {
    id: String,
    version: i64,
    created_at: i64,
    cwd: Option<String>,
    parent_session: Option<String>,
    seed_length: Option<i64>,
}

impl SessionRow {
    /// The header, by the rules of a JSONL header line.
    fn header(&self) -> Result<SessionHeader, Violation> {
        let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
        let mut line = format!(
            "{{\"type\":\"session\",\"version\":{},\"id\":{},\"createdAt\":{}",
            self.version,
            q(&self.id),
            self.created_at
        );
        if let Some(cwd) = &self.cwd {
            let _ = write!(line, ",\"cwd\":{}", q(cwd));
        }
        if let Some(p) = &self.parent_session {
            let _ = write!(line, ",\"parentSession\":{}", q(p));
        }
        if let Some(n) = self.seed_length {
            let _ = write!(line, ",\"seedLength\":{n}");
        }
        line.push('}');
        SessionHeader::from_json(&line)
            .map(|p| p.header)
            .map_err(|mut v| {
                v.reason = format!("{} (sessions row assembled as {line})", v.reason);
                v
            })
    }
}

/// Assembles the JSON envelope of one `events` row into `line`. Each JSON
/// column must hold exactly one JSON value, so a column cannot smuggle
/// extra envelope keys into the line.
pub(crate) fn envelope_line(
    line: &mut String,
    seq: i64,
    kind: &str,
    time: i64,
    data: &str,
    sources: Option<&str>,
    op: Option<&str>,
) -> Result<(), Violation> {
    let one_value = |column: &str, text: &str| {
        serde_json::from_str::<&RawValue>(text)
            .map(drop)
            .map_err(|e| {
                Violation::new(
                    Location::Line(0),
                    Rule::Json,
                    format!("column {column} does not hold one JSON value: {e}"),
                )
            })
    };
    one_value("data", data)?;
    line.clear();
    line.push_str("{\"type\":");
    line.push_str(&serde_json::to_string(kind).expect("a string serialises"));
    let _ = write!(line, ",\"seq\":{seq},\"time\":{time},\"data\":");
    line.push_str(data);
    if let Some(s) = sources {
        one_value("source_event_seqs", s)?;
        line.push_str(",\"sourceEventSeqs\":");
        line.push_str(s);
    }
    if let Some(o) = op {
        one_value("surface_op", o)?;
        line.push_str(",\"surfaceOp\":");
        line.push_str(o);
    }
    line.push('}');
    Ok(())
}

/// Exports sessions of `store` to a schema 4 database at `path`: see
/// [`crate::adapters::sqlite_export::export_db`], which this calls with
/// schema 4.
pub fn export_db(store: &Store, ids: &[String], path: impl AsRef<Path>) -> Result<(), SqliteError> {
    crate::adapters::sqlite_export::export_db(store, ids, path.as_ref(), SCHEMA_VERSION)
}

/// Creates the schema 4 tables and version in an empty database.
pub(crate) fn initialize(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(DDL)?;
    conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
}

/// The header fields of `header` that schema 4 has no column for and that
/// a reader of its row would not get back (it gives them their defaults,
/// see `SessionRow::header`), each as `key value` in the header's JSON
/// key order: empty when the row holds the whole header.
fn header_fields_without_column(header: &SessionHeader) -> Vec<String> {
    // What the row gives back: its columns, every other field as
    // `SessionHeader::new` leaves it, so a header field added later is
    // compared (and refused) without this list knowing it.
    let row = SessionHeader {
        version: header.version,
        id: header.id.clone(),
        created_at: header.created_at,
        cwd: header.cwd.clone(),
        parent_session: header.parent_session.clone(),
        seed_length: header.seed_length,
        ..SessionHeader::new(header.id.clone(), header.created_at)
    };
    if row == *header {
        return Vec::new();
    }
    let (full_text, kept_text) = (header.to_json(), row.to_json());
    let (Ok(full), Ok(kept)) = (Fields::parse(&full_text), Fields::parse(&kept_text)) else {
        // `to_json` writes an object; should it ever not, the header still
        // differs from its row, so the whole of it is named.
        return vec![full_text];
    };
    full.0
        .iter()
        .filter(|(k, v)| kept.get(&k.0).is_none_or(|kv| kv.get() != v.get()))
        .map(|(k, v)| format!("{} {}", k.0, v.get()))
        .collect()
}

/// Writes one session's `sessions` row and `events` rows in schema 4.
/// Anything schema 4 has no column for is an error, never dropped: a header
/// field (`origin`, `delegationDepth` other than 0, `agentPreset`) or an
/// event with `ignorable`.
pub(crate) fn insert_session(
    tx: &Connection,
    path: &Path,
    header: &SessionHeader,
    events: &[OwnedEvent],
) -> Result<(), SqliteError> {
    let err = sql_err(path);
    let unrepresentable = |seq: Option<u64>, reason: String| SqliteError::Unrepresentable {
        path: path.to_owned(),
        session: header.id.clone(),
        seq,
        reason,
    };
    let int = |v: u64, what: &str, seq: Option<u64>| {
        i64::try_from(v).map_err(|_| unrepresentable(seq, format!("{what} {v} exceeds INTEGER")))
    };
    let created_at = int(header.created_at, "createdAt", None)?;
    let seed_length = header
        .seed_length
        .map(|n| int(n, "seedLength", None))
        .transpose()?;
    let version = int(header.version, "version", None)?;
    let lost = header_fields_without_column(header);
    if !lost.is_empty() {
        return Err(unrepresentable(
            None,
            format!(
                "the header has {}, and schema 4 has no column for {}; schema 17 (the default) keeps {}",
                lost.join(", "),
                if lost.len() == 1 { "it" } else { "them" },
                if lost.len() == 1 { "it" } else { "them" },
            ),
        ));
    }
    if let Some(e) = events.iter().find(|e| e.ignorable) {
        return Err(unrepresentable(
            Some(e.seq),
            format!(
                "{} has ignorable: true, and schema 4 has no column for it",
                e.kind
            ),
        ));
    }
    tx.prepare_cached(
        "INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            header.id,
            version,
            created_at,
            header.cwd,
            header.parent_session,
            seed_length
        ])
    })
    .map_err(&err)?;
    let mut stmt = tx
        .prepare_cached(
            "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(&err)?;
    for e in events {
        let seq = int(e.seq, "seq", Some(e.seq))?;
        let sources = e.source_event_seqs.as_deref().map(sources_json);
        let op = e.surface_op.map(surface_op_json);
        stmt.execute(params![
            header.id,
            seq,
            e.kind.as_ref(),
            e.time,
            e.data.get(),
            sources,
            op
        ])
        .map_err(&err)?;
    }
    Ok(())
}

/// `[1,2]`.
pub(crate) fn sources_json(src: &[u64]) -> String {
    let mut out = String::with_capacity(2 + src.len() * 4);
    out.push('[');
    for (i, s) in src.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{s}");
    }
    out.push(']');
    out
}

/// `"append"` or `{"op":"replace","start":S,"end":E}`.
pub(crate) fn surface_op_json(op: SurfaceOp) -> String {
    match op {
        SurfaceOp::Append => "\"append\"".into(),
        SurfaceOp::Replace { start, end } => {
            format!("{{\"op\":\"replace\",\"start\":{start},\"end\":{end}}}")
        }
    }
}
