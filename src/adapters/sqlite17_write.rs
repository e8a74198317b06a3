//! Writing the harness's schema 17 (see [`crate::adapters::sqlite17`] for
//! the layout): physical rows as its `compression.ts` and `codec.ts` bind
//! them, packed runs bounded as its `emitBoundedRun` bounds them.

use crate::adapters::harness::{self, PackedRow, Row};
use crate::adapters::sqlite::{self, SqliteError, surface_op_json};
use crate::adapters::sqlite17::{
    APPLICATION_ID, DDL, MAX_PACKED_DATA_BYTES, MAX_PACKED_ROW_MEMBERS, MAX_SAFE,
    MIN_PACKED_ROW_MEMBERS, SCHEMA_VERSION, ZSTD_DATA_THRESHOLD_BYTES, random_uuid,
};
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use rusqlite::{Connection, params};
use std::path::Path;

/// The zstd level the harness compresses `data` with.
const ZSTD_LEVEL: i32 = 3;

/// Encodes `source_event_seqs` as the harness does.
pub fn encode_source_event_seqs(seqs: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(seqs.len() * 2);
    let mut prev = 0u64;
    for (i, &s) in seqs.iter().enumerate() {
        let mut v = if i == 0 {
            s
        } else if s >= prev {
            (s - prev) * 2
        } else {
            (prev - s) * 2 - 1
        };
        while v >= 0x80 {
            out.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        prev = s;
    }
    out
}

/// A `data` value as the harness stores it: text, or a zstd frame when the
/// text is at least [`ZSTD_DATA_THRESHOLD_BYTES`] long and the frame smaller.
fn encode_data(text: &str) -> rusqlite::types::Value {
    use rusqlite::types::Value;
    if text.len() >= ZSTD_DATA_THRESHOLD_BYTES
        && let Ok(z) = zstd::bulk::compress(text.as_bytes(), ZSTD_LEVEL)
        && z.len() < text.len()
    {
        return Value::Blob(z);
    }
    Value::Text(text.to_owned())
}

/// Splits packed rows as the harness's `emitBoundedRun` does: at most
/// [`MAX_PACKED_ROW_MEMBERS`] members and [`MAX_PACKED_DATA_BYTES`] of data
/// per row (the largest prefix that fits, found by bisection), members left
/// over from a run (fewer than three) as single events.
pub fn bound_rows<'e>(rows: Vec<Row<'e>>, events: &'e [Event<'e>]) -> Vec<Row<'e>> {
    let mut out = Vec::with_capacity(rows.len());
    let mut at = 0usize; // index in `events` of the row's first event
    for row in rows {
        let n = row.events();
        let Row::Packed(p) = row else {
            out.push(row);
            at += n;
            continue;
        };
        let mut off = 0;
        while n - off >= MIN_PACKED_ROW_MEMBERS {
            let high = (n - off).min(MAX_PACKED_ROW_MEMBERS);
            let fits = |k: usize| data_len(&slice(&p, off, k)) <= MAX_PACKED_DATA_BYTES;
            let take = if fits(high) {
                high
            } else {
                let (mut lo, mut hi, mut best) = (MIN_PACKED_ROW_MEMBERS, high - 1, 0);
                while lo <= hi {
                    let mid = (lo + hi) / 2;
                    if fits(mid) {
                        best = mid;
                        lo = mid + 1;
                    } else {
                        hi = mid - 1;
                    }
                }
                best
            };
            if take == 0 {
                out.push(Row::Event(&events[at + off]));
                off += 1;
            } else {
                out.push(Row::Packed(slice(&p, off, take)));
                off += take;
            }
        }
        out.extend(events[at + off..at + n].iter().map(Row::Event));
        at += n;
    }
    out
}

/// Members `off..off+k` of a packed row.
fn slice<'e>(p: &PackedRow<'e>, off: usize, k: usize) -> PackedRow<'e> {
    let mut q = p.clone();
    q.seq0 = p.seq0 + off as u64;
    q.time0 = p.time0 + p.dt[..off].iter().sum::<i64>();
    q.dt = p.dt[off..off + k - 1].to_vec();
    q.pieces = p.pieces[off..off + k].to_vec();
    q
}

/// The row's `data` JSON.
fn data_json(p: &PackedRow<'_>) -> String {
    let mut buf = Vec::new();
    p.write_json(&mut buf);
    let s = String::from_utf8(buf).expect("JSON output is UTF-8");
    let at = s.find(",\"data\":").expect("a packed row has data") + 8;
    s[at..s.len() - 1].to_owned()
}

fn data_len(p: &PackedRow<'_>) -> usize {
    data_json(p).len()
}

/// Creates an empty schema 17 database in `conn` (which must be empty): the
/// DDL, a fresh store id, the application id and the version.
pub(crate) fn initialize(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(DDL)?;
    conn.execute(
        "INSERT INTO persistence_state (singleton, store_id) VALUES (1, ?1)",
        [random_uuid()],
    )?;
    conn.execute_batch(&format!(
        "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION};"
    ))
}

/// Writes one session (its `sessions` row, then its physical rows) as the
/// harness's first append would: a fresh incarnation, revision 1 (0 for a
/// session without events), chunk runs packed and bounded.
pub(crate) fn insert_session(
    conn: &Connection,
    path: &Path,
    header: &SessionHeader,
    events: &[OwnedEvent],
) -> Result<(), SqliteError> {
    let err = sqlite::sql_err(path);
    let too_big = |what: &str, v: u64| SqliteError::Unrepresentable {
        path: path.to_owned(),
        session: header.id.clone(),
        seq: None,
        reason: format!("{what} {v} is not a safe integer"),
    };
    let int = |what: &str, v: u64| {
        (v <= MAX_SAFE)
            .then_some(v as i64)
            .ok_or_else(|| too_big(what, v))
    };
    if let Some(cwd) = header.cwd.as_deref().filter(|c| !c.starts_with('/')) {
        // The harness would write it, then refuse to read the row back.
        return Err(SqliteError::Unrepresentable {
            path: path.to_owned(),
            session: header.id.clone(),
            seq: None,
            reason: format!("cwd {cwd:?} is not absolute, and schema 17 readers refuse it"),
        });
    }
    let version = int("version", header.version)?;
    let created_at = int("createdAt", header.created_at)?;
    let seed_length = header
        .seed_length
        .map(|n| int("seedLength", n))
        .transpose()?;
    let depth = int("delegationDepth", header.delegation_depth)?;
    conn.prepare_cached(
        "INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, origin, delegation_depth, agent_preset, incarnation, revision) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )
    .and_then(|mut s| {
        s.execute(params![
            header.id,
            version,
            created_at,
            header.cwd,
            header.parent_session,
            seed_length,
            header.origin,
            depth,
            header.agent_preset,
            random_uuid(),
            i64::from(!events.is_empty()),
        ])
    })
    .map_err(&err)?;
    let mut stmt = conn
        .prepare_cached(
            "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, surface_op, ignorable) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .map_err(&err)?;
    let rows = bound_rows(harness::pack_chunks(events), events);
    for row in &rows {
        match row {
            Row::Packed(p) => stmt.execute(params![
                header.id,
                p.seq0 as i64,
                p.kind.row_type(),
                p.time0,
                encode_data(&data_json(p)),
                None::<Vec<u8>>,
                None::<String>,
                0i64,
            ]),
            Row::Event(e) => stmt.execute(params![
                header.id,
                e.seq as i64,
                e.kind.as_ref(),
                e.time,
                encode_data(e.data.get()),
                e.source_event_seqs.as_deref().map(encode_source_event_seqs),
                e.surface_op.map(surface_op_json),
                e.ignorable.then_some(1i64),
            ]),
        }
        .map_err(&err)?;
    }
    Ok(())
}
