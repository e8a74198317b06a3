//! Store mode: the bytes a store takes (`stats`) and storing sealed
//! segments compressed (`compress`).

use crate::cli::{sorted_ids, warn_unaccounted};
use crate::failure::{
    Failure, escape_field, io_err, open_read_only, open_writer, plural, store_err,
};
use sessionlog::store;
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

/// `stats`: the sizes of one session, or of all with a total line.
pub(crate) fn stats(
    dir: &Path,
    id: Option<String>,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let store = open_read_only(dir)?;
    let all = id.is_none();
    if all {
        warn_unaccounted(&store)?;
    }
    let ids = match id {
        Some(id) => vec![id],
        None => sorted_ids(&store)?,
    };
    let mut total = Totals::default();
    let mut objects = Vec::new();
    for id in &ids {
        let s = store.stats(id).map_err(store_err)?;
        total.add(&s);
        let age_secs = s
            .checkpoint_modified
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map(|d| d.as_secs());
        if json {
            objects.push(serde_json::json!({
                "id": id,
                "events": s.events,
                "segments": s.segments,
                "compressedSegments": s.compressed_segments,
                "bytes": s.bytes,
                "sealedBytes": s.sealed_bytes,
                "allocatedBytes": s.allocated,
                "jsonlBytes": s.jsonl_bytes,
                "ratio": if s.jsonl_bytes == 0 { None } else { Some(s.bytes as f64 / s.jsonl_bytes as f64) },
                "eventsSinceCheckpoint": s.events_since_checkpoint,
                "checkpointAgeSeconds": age_secs,
            }));
            continue;
        }
        let age = age_secs.map_or_else(|| "none".to_owned(), |d| format!("{d}s"));
        writeln!(
            out,
            "{} {} checkpoint_age={age}",
            escape_field(id),
            Totals::of(&s)
        )
        .map_err(io_err)?;
    }
    if json {
        return writeln!(out, "{}", serde_json::Value::Array(objects)).map_err(io_err);
    }
    if all {
        writeln!(out, "total sessions={} {total}", ids.len()).map_err(io_err)?;
    }
    Ok(())
}

/// `compress`: the sealed segments of one session, or of all, stored as
/// compressed images now; with `seal`, the active segments sealed first.
pub(crate) fn compress(
    dir: &Path,
    id: Option<String>,
    seal: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let store = open_writer(dir, false)?;
    let ids = match id {
        Some(id) => vec![id],
        None => sorted_ids(&store)?,
    };
    let mut total = store::Compressed::default();
    for id in &ids {
        let sealed = seal && store.seal(id).map_err(store_err)?;
        let done = store.compress_sealed(id).map_err(store_err)?;
        let sealed = if sealed { "sealed, " } else { "" };
        writeln!(out, "{} {sealed}{}", escape_field(id), compressed(&done)).map_err(io_err)?;
        total.add(&done);
    }
    if ids.len() > 1 {
        writeln!(out, "total sessions={} {}", ids.len(), compressed(&total)).map_err(io_err)?;
    }
    store.close().map_err(store_err)
}

/// One line's account of [`store::Compressed`].
fn compressed(c: &store::Compressed) -> String {
    let shared = match c.shared {
        0 => String::new(),
        n => format!(", {} left raw (a fork shares them)", plural(n, "segment")),
    };
    format!(
        "compressed {} ({} -> {} bytes){shared}",
        plural(c.segments, "segment"),
        c.raw_bytes,
        c.image_bytes
    )
}

/// The counts of `stats`: one session's, or the sum over sessions.
#[derive(Default)]
struct Totals {
    events: u64,
    segments: u64,
    compressed: u64,
    bytes: u64,
    sealed_bytes: u64,
    allocated: u64,
    jsonl_bytes: u64,
    since_checkpoint: u64,
}

impl Totals {
    /// The counts of one session.
    fn of(s: &store::SessionStats) -> Totals {
        let mut t = Totals::default();
        t.add(s);
        t
    }

    fn add(&mut self, s: &store::SessionStats) {
        self.events += s.events;
        self.segments += s.segments;
        self.compressed += s.compressed_segments;
        self.bytes += s.bytes;
        self.sealed_bytes += s.sealed_bytes;
        self.allocated += s.allocated;
        self.jsonl_bytes += s.jsonl_bytes;
        self.since_checkpoint += s.events_since_checkpoint;
    }
}

/// The fields a `stats` line has for a session and for the total.
impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "events={} segments={} compressed={} bytes={} sealed_bytes={} allocated={} bytes/event={} jsonl_bytes={} ratio={} since_checkpoint={}",
            self.events,
            self.segments,
            self.compressed,
            self.bytes,
            self.sealed_bytes,
            self.allocated,
            per_event(self.bytes, self.events),
            self.jsonl_bytes,
            ratio(self.bytes, self.jsonl_bytes),
            self.since_checkpoint,
        )
    }
}

fn per_event(bytes: u64, events: u64) -> String {
    if events == 0 {
        "-".into()
    } else {
        format!("{:.1}", bytes as f64 / events as f64)
    }
}

fn ratio(bytes: u64, jsonl_bytes: u64) -> String {
    if jsonl_bytes == 0 {
        "-".into()
    } else {
        format!("{:.3}", bytes as f64 / jsonl_bytes as f64)
    }
}
