//! The harness's current SQLite layout, schema version 17, as its
//! `session-persistence-sqlite` package defines it: `PRAGMA user_version`
//! 17, `PRAGMA application_id` [`APPLICATION_ID`], and exactly the objects
//! of [`DDL`] (a `persistence_state` row holding the store's UUID, a
//! `sessions` row per session with an `incarnation` UUID and a `revision`,
//! and `events` rows that are either one event or a packed run of chunks).
//!
//! Physical rows, as the harness's `compression.ts` and `codec.ts` write
//! and check them:
//!
//! - `ignorable` 0 marks a packed row: its `type` is `text-chunks`,
//!   `reasoning-chunks` or `tool-call-chunks`, `seq` and `time` are the first
//!   member's, `data` is `{turn, step, index, dt, texts|id,name?,args}` with
//!   [`MIN_PACKED_ROW_MEMBERS`]..=[`MAX_PACKED_ROW_MEMBERS`] members and at
//!   most [`MAX_PACKED_DATA_BYTES`] bytes, and both surface columns NULL.
//! - Any other row is one event; `ignorable` 1 means `"ignorable": true`.
//! - `data` (JSON text) of [`ZSTD_DATA_THRESHOLD_BYTES`] bytes or more is
//!   stored as a zstd frame (a BLOB) when that is smaller.
//! - `source_event_seqs` is a BLOB of varints: the first seq, then each
//!   difference from the previous one, zigzag-encoded; canonical only.
//!
//! A row that does not decode, or breaks the seq order, is a torn tail when
//! no later row holds a `turn/end` (the prefix is kept, as the harness's
//! loader keeps it) and corruption otherwise.

use crate::adapters::jsonl;
use crate::adapters::sqlite::{self, SqliteError, SqliteSession, envelope_line, sources_json};
use crate::adapters::{Reporter, bounded};
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::json::{self, Fields};
use crate::session::SessionState;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

pub use crate::adapters::sqlite17_write::{bound_rows, encode_source_event_seqs};
pub(crate) use crate::adapters::sqlite17_write::{initialize, insert_session};

/// The schema version this module reads and writes.
pub const SCHEMA_VERSION: i64 = 17;
/// `PRAGMA application_id` of a harness session database (`"DSHP"`).
pub const APPLICATION_ID: i64 = 0x4453_4850;
/// Scalar `data` this long or longer is stored zstd-compressed when smaller.
pub const ZSTD_DATA_THRESHOLD_BYTES: usize = 4096;
/// The fewest members of a packed row.
pub const MIN_PACKED_ROW_MEMBERS: usize = 3;
/// The most members of a packed row.
pub const MAX_PACKED_ROW_MEMBERS: usize = 1024;
/// The most bytes of a packed row's `data` (uncompressed UTF-8).
pub const MAX_PACKED_DATA_BYTES: usize = 1 << 20;
/// The zstd level the harness compresses `data` with.
pub(crate) const MAX_SAFE: u64 = json::MAX_SAFE_INTEGER;

/// The harness's `resources/sql/schema.sql`, verbatim. The harness compares
/// `sqlite_schema` with what this creates (whitespace runs folded), so a
/// database written from it passes the harness's own open check.
pub const DDL: &str = "CREATE TABLE persistence_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id  TEXT NOT NULL
) STRICT;

CREATE TABLE sessions (
  id               TEXT PRIMARY KEY,
  version          INTEGER NOT NULL,
  created_at       INTEGER NOT NULL,
  cwd              TEXT,
  parent_session   TEXT,
  seed_length      INTEGER,
  origin           TEXT,
  delegation_depth INTEGER,
  agent_preset     TEXT,
  incarnation      TEXT NOT NULL,
  revision         INTEGER NOT NULL
) STRICT;

CREATE TABLE events (
  session_id        TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq               INTEGER NOT NULL,
  type              TEXT NOT NULL,
  time              INTEGER NOT NULL,
  data              ANY NOT NULL,
  source_event_seqs ANY,
  surface_op        TEXT,
  ignorable         INTEGER CHECK (ignorable IS NULL OR ignorable IN (0, 1)),
  PRIMARY KEY (session_id, seq)
) STRICT;
";

/// The user objects of a database, as the harness lists them (`type, name,
/// tbl_name, sql` ordered by type and name, whitespace runs folded).
pub(crate) fn schema_objects(conn: &Connection) -> rusqlite::Result<Vec<[String; 4]>> {
    let mut stmt = conn.prepare(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema WHERE name NOT GLOB 'sqlite_*' ORDER BY type, name",
    )?;
    stmt.query_map([], |r| {
        let sql: Option<String> = r.get(3)?;
        let sql = sql
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Ok([r.get(0)?, r.get(1)?, r.get(2)?, sql])
    })?
    .collect()
}

/// The objects `ddl` creates in an empty in-memory database.
pub(crate) fn reference_objects(ddl: &str) -> rusqlite::Result<Vec<[String; 4]>> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(ddl)?;
    schema_objects(&conn)
}

/// Whether `s` is a UUID as the harness's pattern accepts it (versions 1-8,
/// RFC 4122 variant, either case).
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
        && (b'1'..=b'8').contains(&b[14])
        && matches!(b[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

/// A random version-4 UUID (from the OS's random source).
pub fn random_uuid() -> String {
    let mut r = random_bytes::<16>();
    r[6] = (r[6] & 0x0f) | 0x40;
    r[8] = (r[8] & 0x3f) | 0x80;
    let h: String = r.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `N` bytes from `getrandom(2)`.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: the pointer and length describe the unfilled part of `buf`.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), N - got, 0) };
        if n > 0 {
            got += n as usize;
        } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            panic!("getrandom failed: {}", std::io::Error::last_os_error());
        }
    }
    buf
}

/// Checks what the harness checks when it opens a database: user_version 17,
/// the application id, exactly the objects of [`DDL`], and a UUID store id.
pub(crate) fn check_schema(conn: &Connection, path: &Path) -> Result<(), SqliteError> {
    let err = sqlite::sql_err(path);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(&err)?;
    if version != SCHEMA_VERSION {
        return Err(SqliteError::UnsupportedSchema {
            path: path.to_owned(),
            found: version,
        });
    }
    let app: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(&err)?;
    if app != APPLICATION_ID {
        return Err(SqliteError::ApplicationId {
            path: path.to_owned(),
            found: app,
        });
    }
    check_objects(conn, path, DDL)?;
    let id: Option<Option<String>> = conn
        .query_row(
            "SELECT CASE WHEN typeof(store_id) = 'text' THEN store_id END FROM persistence_state WHERE singleton = 1",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(&err)?;
    match id.flatten() {
        Some(id) if is_uuid(&id) => Ok(()),
        found => Err(SqliteError::StoreId {
            path: path.to_owned(),
            found,
        }),
    }
}

/// Refuses a database whose user objects differ from those `ddl` creates:
/// an extra trigger, view, index or table, or a changed column.
pub(crate) fn check_objects(conn: &Connection, path: &Path, ddl: &str) -> Result<(), SqliteError> {
    let err = sqlite::sql_err(path);
    let found = schema_objects(conn).map_err(&err)?;
    let want = reference_objects(ddl).map_err(&err)?;
    if found == want {
        return Ok(());
    }
    let extra: Vec<String> = found
        .iter()
        .filter(|f| !want.contains(f))
        .map(|f| format!("{} {}", f[0], f[1]))
        .collect();
    let missing: Vec<String> = want
        .iter()
        .filter(|w| !found.contains(w))
        .map(|w| format!("{} {}", w[0], w[1]))
        .collect();
    Err(SqliteError::SchemaObjects {
        path: path.to_owned(),
        detail: format!("unexpected or changed {extra:?}; missing or changed {missing:?}"),
    })
}

/// Reads every session of a schema 17 database (already open, inside a read
/// transaction), in `sessions` row order, checking every row as the harness
/// does and every event by the rules of the session model.
pub(crate) fn read_sessions(
    conn: &Connection,
    path: &Path,
    progress: &mut Reporter<'_>,
) -> Result<Vec<SqliteSession>, SqliteError> {
    let err = sqlite::sql_err(path);
    check_schema(conn, path)?;
    sqlite::check_orphans(conn, path)?;
    let mut stmt = conn
        .prepare(
            "SELECT id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, incarnation, revision FROM sessions ORDER BY rowid",
        )
        .map_err(&err)?;
    let rows = stmt
        .query_map([], |r| {
            (0..11)
                .map(|i| r.get::<_, rusqlite::types::Value>(i))
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(&err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(&err)?;
    let mut events_stmt = conn
        .prepare(
            "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable FROM events WHERE session_id = ?1 ORDER BY seq",
        )
        .map_err(&err)?;
    // What all zstd values of the database may decode to together: the rule
    // for a compressed log, applied to the file (and its WAL).
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let on_disk = size(path) + size(Path::new(&wal));
    let mut budget = bounded::zstd_session_limit(usize::try_from(on_disk).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(rows.len());
    progress.start_sessions(rows.len() as u64);
    for row in rows {
        let (header, id) =
            session_header(&row).map_err(|(id, reason)| SqliteError::CorruptRow {
                path: path.to_owned(),
                session: id,
                seq: None,
                reason,
            })?;
        let mut decoded: Vec<(i64, Result<Vec<OwnedEvent>, String>)> = Vec::new();
        let mut rows = events_stmt.query([&id]).map_err(&err)?;
        while let Some(r) = rows.next().map_err(&err)? {
            let seq = match r.get_ref(0).map_err(&err)? {
                ValueRef::Integer(s) => s,
                _ => -1,
            };
            let row = decode_row(r, &mut budget).map_err(|reason| SqliteError::CorruptRow {
                path: path.to_owned(),
                session: id.clone(),
                seq: Some(seq),
                reason: format!("stored event: {reason}"),
            })?;
            decoded.push((seq, row));
        }
        let (events, torn_from) =
            scan_rows(decoded).map_err(|(seq, reason)| SqliteError::CorruptRow {
                path: path.to_owned(),
                session: id.clone(),
                seq: Some(seq),
                reason,
            })?;
        let mut state = SessionState::new(false);
        let mut folded: Vec<OwnedEvent> = Vec::with_capacity(events.len());
        for e in events {
            state
                .append(&e, &folded)
                .map_err(|violation| SqliteError::Invalid {
                    path: path.to_owned(),
                    session: id.clone(),
                    seq: i64::try_from(e.seq).ok(),
                    violation,
                })?;
            folded.push(e);
            progress.event();
        }
        let events = folded;
        out.push(SqliteSession {
            header,
            closers: state.closers(),
            events,
            torn_from,
        });
        progress.session_read();
    }
    Ok(out)
}

/// The harness's `scanRows`: the contiguous prefix of decoded rows. A bad
/// row (or one breaking the seq order) at or before the last row holding a
/// `turn/end` is corruption `(seq, reason)`; after it, a torn tail whose
/// first seq is returned with the prefix.
#[allow(clippy::type_complexity)]
fn scan_rows(
    rows: Vec<(i64, Result<Vec<OwnedEvent>, String>)>,
) -> Result<(Vec<OwnedEvent>, Option<u64>), (i64, String)> {
    let last_turn_end = rows.iter().rposition(|(_, r)| {
        r.as_ref()
            .is_ok_and(|evs| evs.iter().any(|e| e.kind == "turn/end"))
    });
    let mut events: Vec<OwnedEvent> = Vec::new();
    for (i, (seq, row)) in rows.into_iter().enumerate() {
        let committed = last_turn_end.is_some_and(|l| i <= l);
        let why = match row {
            Ok(evs) => {
                let next = events.len() as u64;
                match evs
                    .iter()
                    .enumerate()
                    .find(|(k, e)| e.seq != next + *k as u64)
                {
                    None => {
                        events.extend(evs);
                        continue;
                    }
                    Some((k, e)) => format!(
                        "seq gap: expected seq {}, the row holds {}",
                        next + k as u64,
                        e.seq
                    ),
                }
            }
            Err(why) => why,
        };
        if committed {
            return Err((seq, format!("invalid committed physical row: {why}")));
        }
        return Ok((events, Some(u64::try_from(seq).unwrap_or(0))));
    }
    Ok((events, None))
}

/// The header of a `sessions` row, checked as the harness's
/// `decodeSessionRow` does; on error `(id, reason)`.
fn session_header(
    row: &[rusqlite::types::Value],
) -> Result<(SessionHeader, String), (String, String)> {
    use rusqlite::types::Value as V;
    let id = match &row[0] {
        V::Text(s) if !s.is_empty() => s.clone(),
        v => return Err((format!("{v:?}"), "id must be a non-empty string".into())),
    };
    let fail = |reason: &str| Err((id.clone(), reason.to_owned()));
    let int = |v: &V, nullable: bool, min: i64| match v {
        V::Null if nullable => Ok(None),
        V::Integer(n) if *n >= min && n.unsigned_abs() <= MAX_SAFE => Ok(Some(*n)),
        _ => Err(()),
    };
    let text = |v: &V| match v {
        V::Null => Ok(None),
        V::Text(s) => Ok(Some(s.clone())),
        _ => Err(()),
    };
    let min = -(MAX_SAFE as i64);
    let Ok(Some(version)) = int(&row[1], false, min) else {
        return fail("version must be a safe integer");
    };
    let Ok(Some(created_at)) = int(&row[2], false, 0) else {
        return fail("created_at must be a non-negative safe integer");
    };
    let (Ok(cwd), Ok(parent), Ok(origin), Ok(preset)) =
        (text(&row[3]), text(&row[4]), text(&row[6]), text(&row[8]))
    else {
        return fail("cwd, parent_session, origin and agent_preset must be strings or null");
    };
    if cwd.as_deref().is_some_and(|c| !c.starts_with('/')) {
        return fail("stored session cwd must be absolute");
    }
    if origin.as_deref().is_some_and(|o| o != "subagent") {
        return fail("stored session origin must be subagent or null");
    }
    let (Ok(seed), Ok(depth)) = (int(&row[5], true, 0), int(&row[7], true, 0)) else {
        return fail("seed_length and delegation_depth must be non-negative safe integers or null");
    };
    match &row[9] {
        V::Text(s) if is_uuid(s) => {}
        _ => return fail("stored session incarnation must be a UUID"),
    }
    if int(&row[10], false, 0).is_err() {
        return fail("revision must be a non-negative safe integer");
    }
    let mut h = serde_json::Map::new();
    h.insert("type".into(), "session".into());
    h.insert("version".into(), version.into());
    h.insert("id".into(), id.clone().into());
    h.insert("createdAt".into(), created_at.into());
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            h.insert(k.into(), v);
        }
    };
    put("cwd", cwd.map(Into::into));
    put("parentSession", parent.map(Into::into));
    put("seedLength", seed.map(Into::into));
    put("origin", origin.map(Into::into));
    put("delegationDepth", depth.map(Into::into));
    put("agentPreset", preset.map(Into::into));
    let line = serde_json::Value::Object(h).to_string();
    match SessionHeader::from_json(&line) {
        Ok(p) => Ok((p.header, id)),
        Err(v) => Err((id, format!("{v} (sessions row assembled as {line})"))),
    }
}

/// Decodes one physical `events` row into its events. The outer error is
/// a row whose columns have the wrong types, which the harness's
/// `decodeEventRow` refuses before any torn-tail rule applies (always
/// corruption); the inner one a row that does not decode (JSON, packing,
/// zstd, varints), which is a torn tail after the last `turn/end`.
fn decode_row(
    r: &rusqlite::Row<'_>,
    budget: &mut u64,
) -> Result<Result<Vec<OwnedEvent>, String>, String> {
    let get = |i| r.get_ref(i).map_err(|e| e.to_string());
    let seq = match get(0)? {
        ValueRef::Integer(s) if s >= 0 && s as u64 <= MAX_SAFE => s,
        _ => return Err("seq must be a non-negative safe integer".into()),
    };
    let kind = match get(1)? {
        ValueRef::Text(t) if !t.is_empty() => {
            std::str::from_utf8(t).map_err(|e| format!("type: {e}"))?
        }
        _ => return Err("type must be a non-empty string".into()),
    };
    let time = match get(2)? {
        ValueRef::Integer(t) if t.unsigned_abs() <= MAX_SAFE => t,
        _ => return Err("time must be a safe integer".into()),
    };
    let ignorable = match get(6)? {
        ValueRef::Null => None,
        ValueRef::Integer(i @ (0 | 1)) => Some(i),
        _ => return Err("ignorable must be 0, 1, or null".into()),
    };
    let sources = match get(4)? {
        ValueRef::Null => None,
        ValueRef::Blob(b) => Some(b),
        _ => return Err("source_event_seqs must be a blob or null".into()),
    };
    let op = match get(5)? {
        ValueRef::Null => None,
        ValueRef::Text(t) => Some(std::str::from_utf8(t).map_err(|e| format!("surface_op: {e}"))?),
        _ => return Err("surface_op must be a string or null".into()),
    };
    let data = match get(3)? {
        ValueRef::Text(t) => Ok(t),
        ValueRef::Blob(b) => Err(b),
        _ => return Err("data must be a string or blob".into()),
    };
    let row = PhysicalRow {
        seq,
        kind,
        time,
        data,
        sources,
        op,
        ignorable,
    };
    decode_physical(&row, budget)
}

/// The columns of one `events` row, their kinds checked.
struct PhysicalRow<'r> {
    seq: i64,
    kind: &'r str,
    time: i64,
    /// `Ok(text)` or `Err(zstd blob)`.
    data: Result<&'r [u8], &'r [u8]>,
    sources: Option<&'r [u8]>,
    op: Option<&'r str>,
    ignorable: Option<i64>,
}

/// The harness's `decodeRow` on a row whose column kinds are right; zstd
/// values decode within `budget`, which shrinks by what they give. The
/// inner error is a row that does not decode (as the harness's `decodeRow`
/// fails: zstd, UTF-8, JSON text, a packed row, varints), a torn tail after
/// the last `turn/end`; the outer one a row that decodes but whose event
/// breaks a rule of the session model (its envelope, surface op, a number
/// that is not finite): the harness reads that row, so it is never dropped
/// as torn, always corruption.
#[allow(clippy::type_complexity)]
fn decode_physical(
    row: &PhysicalRow<'_>,
    budget: &mut u64,
) -> Result<Result<Vec<OwnedEvent>, String>, String> {
    match decode_physical_row(row, budget) {
        Err(undecodable) => Ok(Err(undecodable)),
        Ok(Ok(events)) => Ok(Ok(events)),
        Ok(Err(violation)) => Err(violation.to_string()),
    }
}

/// [`decode_physical`]: `Err` a row that does not decode, `Ok(Err)` one
/// whose event breaks a rule.
#[allow(clippy::type_complexity)]
fn decode_physical_row(
    row: &PhysicalRow<'_>,
    budget: &mut u64,
) -> Result<Result<Vec<OwnedEvent>, crate::violation::Violation>, String> {
    let PhysicalRow {
        seq,
        kind,
        time,
        data,
        sources,
        op,
        ignorable,
    } = *row;
    let packed = ignorable == Some(0);
    let limit = if packed {
        MAX_PACKED_DATA_BYTES as u64
    } else {
        bounded::MAX_SCALAR_DATA_BYTES
    };
    let data = match data {
        Ok(text) => text.to_vec(),
        Err(blob) => {
            // Each value has its own limit, and all values of the database
            // share one: a small file cannot make every row a bomb.
            let out = bounded::decode_zstd(blob, limit.min(*budget)).map_err(|e| {
                if limit > *budget {
                    "data zstd values of this database decode to more than max(64 MiB, 1024 x its size) in all (limit for hostile input)".to_owned()
                } else {
                    format!("data zstd value: {e}")
                }
            })?;
            *budget -= out.len() as u64;
            out
        }
    };
    let data = String::from_utf8(data).map_err(|e| format!("data is not UTF-8: {e}"))?;
    if packed {
        if !["text-chunks", "reasoning-chunks", "tool-call-chunks"].contains(&kind) {
            return Err(format!(
                "malformed {kind} storage row: packed discriminator requires a chunk tag"
            ));
        }
        if sources.is_some() || op.is_some() {
            return Err(format!(
                "malformed {kind} storage row: packed surface fields must be null"
            ));
        }
        return expand(kind, seq, time, &data).map(Ok);
    }
    let sources = sources.map(decode_source_event_seqs).transpose()?;
    let mut line = String::new();
    envelope_line(
        &mut line,
        seq,
        kind,
        time,
        &data,
        sources.as_deref().map(sources_json).as_deref(),
        op,
    )
    .map_err(|v| v.reason)?;
    if ignorable == Some(1) {
        line.pop();
        line.push_str(",\"ignorable\":true}");
    }
    Ok(Event::from_json(&line).map(|e| vec![e.into_owned()]))
}

/// Expands a packed row's `data` into its members, with the schema-17
/// bounds on top of the JSONL rules.
fn expand(kind: &str, seq: i64, time: i64, data: &str) -> Result<Vec<OwnedEvent>, String> {
    if data.len() > MAX_PACKED_DATA_BYTES {
        return Err(format!(
            "malformed {kind} storage row: data exceeds {MAX_PACKED_DATA_BYTES} UTF-8 bytes"
        ));
    }
    let line = format!("{{\"type\":\"{kind}\",\"seq0\":{seq},\"time0\":{time},\"data\":{data}}}");
    let fields = Fields::parse(&line).map_err(|e| format!("malformed {kind} storage row: {e}"))?;
    let members = jsonl::expand_packed_row(&fields)
        .map_err(|why| format!("malformed {kind} storage row: {why}"))?;
    if !(MIN_PACKED_ROW_MEMBERS..=MAX_PACKED_ROW_MEMBERS).contains(&members.len()) {
        return Err(format!(
            "malformed {kind} storage row: {} members; a row holds {MIN_PACKED_ROW_MEMBERS}..{MAX_PACKED_ROW_MEMBERS}",
            members.len()
        ));
    }
    Ok(members.into_iter().map(Event::into_owned).collect())
}

/// Decodes a canonical `source_event_seqs` blob.
pub fn decode_source_event_seqs(bytes: &[u8]) -> Result<Vec<u64>, String> {
    let bad = |why: &str| format!("malformed source_event_seqs storage value: {why}");
    let mut out = Vec::new();
    let mut prev: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let first = out.is_empty();
        let limit = if first { MAX_SAFE } else { MAX_SAFE * 2 };
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            let Some(&b) = bytes.get(i) else {
                return Err(bad("truncated varint"));
            };
            i += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if shift > 0 && b & 0x7f == 0 {
                    return Err(bad("non-canonical varint"));
                }
                if value > limit {
                    return Err(bad("varint is out of range"));
                }
                break;
            }
            shift += 7;
            if shift > 56 {
                return Err(bad("varint is out of range"));
            }
        }
        let v = if first {
            value
        } else if value & 1 == 0 {
            prev.checked_add(value / 2)
                .ok_or_else(|| bad("decoded seq is out of range"))?
        } else {
            prev.checked_sub(value.div_ceil(2))
                .ok_or_else(|| bad("decoded seq is out of range"))?
        };
        if v > MAX_SAFE {
            return Err(bad("decoded seq is out of range"));
        }
        out.push(v);
        prev = v;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_refuse_non_canonical() {
        for seqs in [
            vec![],
            vec![0],
            vec![5, 3, 9, 9, 0],
            vec![MAX_SAFE, 0, MAX_SAFE],
        ] {
            let b = encode_source_event_seqs(&seqs);
            assert_eq!(decode_source_event_seqs(&b).unwrap(), seqs);
        }
        assert_eq!(encode_source_event_seqs(&[300]), vec![0xAC, 0x02]);
        assert!(decode_source_event_seqs(&[0x80, 0x00]).is_err());
        assert!(decode_source_event_seqs(&[0x80]).is_err());
        // 1 then -2: below zero.
        assert!(decode_source_event_seqs(&[1, 3]).is_err());
    }

    #[test]
    fn uuids() {
        assert!(is_uuid(&random_uuid()));
        assert!(!is_uuid("00000000-0000-0000-0000-000000000000"));
        assert!(is_uuid("44444444-4444-4444-8444-444444444444"));
    }
}
