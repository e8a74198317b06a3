//! The harness's own JSONL storage, on the way in and out (section 9 of the
//! domain notes): packed chunk rows as the harness's encoder writes them,
//! Zstandard session logs (a header frame, then one frame per append batch),
//! the layouts of a harness sessions root, and import into / export from a
//! [`Store`].
//!
//! Reading builds on [`jsonl::read_session`]: every format here decodes to the
//! same JSONL text, so every rule of the session model applies the same way.
//!
//! # Packed rows
//!
//! [`pack_chunks`] turns each maximal run of [`MIN_PACKED_RUN`] or more
//! consecutive `assistant/chunk` events of one block into one row
//! `{"type":"text-chunks"|"reasoning-chunks"|"tool-call-chunks","seq0":S,"time0":T,"data":{...}}`,
//! with the key order and bytes of the harness's rows. A run only takes
//! events that expand back to exactly their own bytes, so expanding a packed
//! file ([`jsonl::read_session`]) always gives back exactly the events.
//!
//! # Zstandard logs
//!
//! [`read_zstd_session`] decodes every frame and concatenates them into the
//! JSONL text; [`write_zstd_session`] writes a header frame and one frame per
//! batch. See [`read_zstd_session`] for what counts as a torn tail.
//!
//! # Roots
//!
//! The root layouts live in [`crate::adapters::root`] (re-exported here):
//! older `<root>/cwd-<12 hex>/<escaped id>.jsonl`, current
//! `<root>/--<slug>--/<escaped id>/session.jsonl[.zstd]`.

use crate::adapters::jsonl::{self, TornTail};
pub use crate::adapters::root::{
    NO_CWD_DIR, PLAIN_FILE_NAME, ZSTD_FILE_NAME, create_dirs_durably, cwd_dir_name, export_path,
    find_sessions, id_escape, id_unescape, project_dir_name, write_atomically,
};
use crate::adapters::{bounded, storing};
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::json::{self, Fields};
use crate::store::{self, Store};
use crate::violation::{Location, Rule, Violation};
use serde_json::value::RawValue;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The shortest run of chunks the harness packs into one row.
pub const MIN_PACKED_RUN: usize = 3;

/// The zstd compression level of written frames (zstd's default).
const ZSTD_LEVEL: i32 = 3;
/// The magic number that starts every Zstandard frame, little-endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

// ---------------------------------------------------------------------------
// Packed rows
// ---------------------------------------------------------------------------

/// The three kinds of packed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedKind {
    /// `text-chunks`: `text-delta` members.
    Text,
    /// `reasoning-chunks`: `reasoning-delta` members.
    Reasoning,
    /// `tool-call-chunks`: `tool-call-delta` members.
    ToolCall,
}

impl PackedKind {
    /// The row's `type`.
    pub fn row_type(self) -> &'static str {
        match self {
            PackedKind::Text => "text-chunks",
            PackedKind::Reasoning => "reasoning-chunks",
            PackedKind::ToolCall => "tool-call-chunks",
        }
    }

    /// The `chunk.type` of the row's members.
    pub fn chunk_type(self) -> &'static str {
        match self {
            PackedKind::Text => "text-delta",
            PackedKind::Reasoning => "reasoning-delta",
            PackedKind::ToolCall => "tool-call-delta",
        }
    }

    fn from_chunk_type(t: &str) -> Option<Self> {
        match t {
            "text-delta" => Some(PackedKind::Text),
            "reasoning-delta" => Some(PackedKind::Reasoning),
            "tool-call-delta" => Some(PackedKind::ToolCall),
            _ => None,
        }
    }
}

/// One packed row: a run of chunk events of one block. The JSON values are
/// the members' raw bytes, so the row writes back exactly what it packed.
#[derive(Debug, Clone)]
pub struct PackedRow<'e> {
    /// Which kind of delta the members are.
    pub kind: PackedKind,
    /// The seq of the first member.
    pub seq0: u64,
    /// The time of the first member.
    pub time0: i64,
    /// `data.turn` of every member.
    pub turn: &'e RawValue,
    /// `data.step` of every member.
    pub step: &'e RawValue,
    /// `chunk.index` of every member.
    pub index: &'e RawValue,
    /// `chunk.id` of every member (tool calls only).
    pub id: Option<&'e RawValue>,
    /// `chunk.name` of every member, when they have one (tool calls only).
    pub name: Option<&'e RawValue>,
    /// The time gaps between consecutive members (one fewer than members).
    pub dt: Vec<i64>,
    /// The members' `text` (or `argumentsDelta`) string literals.
    pub pieces: Vec<&'e RawValue>,
}

impl PackedRow<'_> {
    /// How many events the row holds.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the row holds no event (never, for rows [`pack_chunks`] makes).
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Writes the row in the harness's key order:
    /// `{"type","seq0","time0","data":{"turn","step","index","dt",("texts"|"id","name"?,"args")}}`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(self.kind.row_type().as_bytes());
        let _ = write!(
            out,
            "\",\"seq0\":{},\"time0\":{},\"data\":{{\"turn\":",
            self.seq0, self.time0
        );
        out.extend_from_slice(self.turn.get().as_bytes());
        out.extend_from_slice(b",\"step\":");
        out.extend_from_slice(self.step.get().as_bytes());
        out.extend_from_slice(b",\"index\":");
        out.extend_from_slice(self.index.get().as_bytes());
        out.extend_from_slice(b",\"dt\":[");
        for (i, gap) in self.dt.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let _ = write!(out, "{gap}");
        }
        out.push(b']');
        if let Some(id) = self.id {
            out.extend_from_slice(b",\"id\":");
            out.extend_from_slice(id.get().as_bytes());
            if let Some(name) = self.name {
                out.extend_from_slice(b",\"name\":");
                out.extend_from_slice(name.get().as_bytes());
            }
            out.extend_from_slice(b",\"args\":[");
        } else {
            out.extend_from_slice(b",\"texts\":[");
        }
        for (i, piece) in self.pieces.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(piece.get().as_bytes());
        }
        out.extend_from_slice(b"]}}");
    }
}

/// One line of a packed JSONL file: an event as is, or a packed row.
#[derive(Debug, Clone)]
pub enum Row<'e> {
    /// An event written verbatim.
    Event(&'e Event<'e>),
    /// A run of chunk events.
    Packed(PackedRow<'e>),
}

impl Row<'_> {
    /// How many events the row holds.
    pub fn events(&self) -> usize {
        match self {
            Row::Event(_) => 1,
            Row::Packed(p) => p.len(),
        }
    }

    /// Writes the row's JSON (no newline).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Row::Event(e) => e.write_json(out),
            Row::Packed(p) => p.write_json(out),
        }
    }

    /// The row's JSON as a string.
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(128);
        self.write_json(&mut out);
        String::from_utf8(out).expect("JSON output is UTF-8")
    }
}

/// A chunk event that may join a packed row: its block and its piece.
struct Member<'e> {
    kind: PackedKind,
    turn: &'e RawValue,
    step: &'e RawValue,
    index: &'e RawValue,
    id: Option<&'e RawValue>,
    name: Option<&'e RawValue>,
    piece: &'e RawValue,
}

impl Member<'_> {
    /// Same block: same kind, turn, step, index and (tool calls) id and name,
    /// compared by their bytes (a row holds one copy of each).
    fn same_block(&self, o: &Member<'_>) -> bool {
        let raw = |a: Option<&RawValue>, b: Option<&RawValue>| {
            a.map(RawValue::get) == b.map(RawValue::get)
        };
        self.kind == o.kind
            && self.turn.get() == o.turn.get()
            && self.step.get() == o.step.get()
            && self.index.get() == o.index.get()
            && raw(self.id, o.id)
            && raw(self.name, o.name)
    }
}

/// The member data a packed row expands to, byte for byte as
/// [`jsonl::expand_packed_row`] builds it.
fn member_data(m: &Member<'_>) -> String {
    let mut d = String::with_capacity(96 + m.piece.get().len());
    d.push_str("{\"turn\":");
    d.push_str(m.turn.get());
    d.push_str(",\"step\":");
    d.push_str(m.step.get());
    d.push_str(",\"chunk\":{\"type\":\"");
    d.push_str(m.kind.chunk_type());
    d.push_str("\",\"index\":");
    d.push_str(m.index.get());
    if let Some(id) = m.id {
        d.push_str(",\"id\":");
        d.push_str(id.get());
        if let Some(name) = m.name {
            d.push_str(",\"name\":");
            d.push_str(name.get());
        }
        d.push_str(",\"argumentsDelta\":");
    } else {
        d.push_str(",\"text\":");
    }
    d.push_str(m.piece.get());
    d.push_str("}}");
    d
}

fn is_string(raw: &RawValue) -> bool {
    raw.get().starts_with('"')
}

/// The event as a packable member, when it is one: an `assistant/chunk` with
/// no surface fields and not `ignorable`, whose data is exactly the expanded
/// shape (same keys, order and bytes); `turn`, `step` and `index` non-negative
/// safe integers; text pieces strings; a tool call's `id` a non-empty string
/// and its `name`, when present, a non-empty string (the harness writes
/// chunks with an empty id or name as they are).
fn member<'e>(e: &'e Event<'_>) -> Option<Member<'e>> {
    if e.kind != "assistant/chunk"
        || e.source_event_seqs.is_some()
        || e.surface_op.is_some()
        || e.ignorable
    {
        return None;
    }
    let data: &'e RawValue = &e.data;
    let fields = Fields::parse(data.get()).ok()?;
    let [(k0, turn), (k1, step), (k2, chunk)] = fields.0.as_slice() else {
        return None;
    };
    if (&*k0.0, &*k1.0, &*k2.0) != ("turn", "step", "chunk") {
        return None;
    }
    let c = json::object(chunk)?;
    let kind = PackedKind::from_chunk_type(&json::string(c.get("type")?)?)?;
    let index = c.get("index")?;
    let tool = kind == PackedKind::ToolCall;
    let (id, name, piece) = if tool {
        (Some(c.get("id")?), c.get("name"), c.get("argumentsDelta")?)
    } else {
        (None, None, c.get("text")?)
    };
    let ok_count = |raw: &RawValue| json::safe_u64(raw).is_some();
    if !(ok_count(turn) && ok_count(step) && ok_count(index) && is_string(piece)) {
        return None;
    }
    let non_empty_string = |raw: &RawValue| is_string(raw) && raw.get() != "\"\"";
    if id.is_some_and(|id| !non_empty_string(id)) || name.is_some_and(|n| !non_empty_string(n)) {
        return None;
    }
    // Our reader refuses rows that copy more than this into every member
    // (a bound against hostile expansion); such chunks stay verbatim.
    let replicated = turn.get().len()
        + step.get().len()
        + index.get().len()
        + id.map_or(0, |v| v.get().len())
        + name.map_or(0, |v| v.get().len());
    if replicated > bounded::MAX_PACKED_REPLICATED_BYTES {
        return None;
    }
    let m = Member {
        kind,
        turn,
        step,
        index,
        id,
        name,
        piece,
    };
    (member_data(&m) == data.get()).then_some(m)
}

/// Packs chunk runs as the harness's encoder does: each maximal run of
/// [`MIN_PACKED_RUN`] or more consecutive `assistant/chunk` events of one
/// block becomes one [`Row::Packed`]; every other event is a [`Row::Event`].
///
/// A block is: same turn, step, `chunk.type` (`text-delta`,
/// `reasoning-delta` or `tool-call-delta`) and index, and for tool calls the
/// same id and the same name (or no name on all). A member's data must be
/// exactly the expanded shape, its seq the previous member's plus one, and
/// its time gap from the previous member a safe integer (gaps may be
/// negative). Expanding the rows gives back exactly `events`.
///
/// ```
/// use sessionlog::adapters::harness::{pack_chunks, Row};
/// use sessionlog::event::Event;
/// let ev = |seq: u64, t: &str| Event::new("assistant/chunk", seq, 100 + seq as i64,
///     &format!(r#"{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":"{t}"}}}}"#)).unwrap();
/// let events = vec![ev(0, "a"), ev(1, "b"), ev(2, "c")];
/// let rows = pack_chunks(&events);
/// assert_eq!(rows.len(), 1);
/// assert_eq!(rows[0].to_json(), r#"{"type":"text-chunks","seq0":0,"time0":100,"data":{"turn":1,"step":1,"index":0,"dt":[1,1],"texts":["a","b","c"]}}"#);
/// ```
pub fn pack_chunks<'e>(events: &'e [Event<'e>]) -> Vec<Row<'e>> {
    let members: Vec<Option<Member<'e>>> = events.iter().map(member).collect();
    let mut rows = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        let Some(first) = &members[i] else {
            rows.push(Row::Event(&events[i]));
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < events.len() {
            let joins = members[j].as_ref().is_some_and(|m| m.same_block(first))
                && events[j - 1].seq.checked_add(1) == Some(events[j].seq)
                && events[j]
                    .time
                    .checked_sub(events[j - 1].time)
                    .is_some_and(|gap| gap.unsigned_abs() <= json::MAX_SAFE_INTEGER);
            if !joins {
                break;
            }
            j += 1;
        }
        if j - i >= MIN_PACKED_RUN {
            rows.push(Row::Packed(PackedRow {
                kind: first.kind,
                seq0: events[i].seq,
                time0: events[i].time,
                turn: first.turn,
                step: first.step,
                index: first.index,
                id: first.id,
                name: first.name,
                dt: events[i..j]
                    .windows(2)
                    .map(|w| w[1].time - w[0].time)
                    .collect(),
                pieces: members[i..j]
                    .iter()
                    .map(|m| m.as_ref().expect("run members are members").piece)
                    .collect(),
            }));
        } else {
            rows.extend(events[i..j].iter().map(Row::Event));
        }
        i = j;
    }
    rows
}

/// Writes the header line, then the rows, one per line.
fn write_rows(out: &mut Vec<u8>, header: Option<&SessionHeader>, rows: &[Row<'_>]) {
    if let Some(h) = header {
        h.write_json(out);
        out.push(b'\n');
    }
    for r in rows {
        r.write_json(out);
        out.push(b'\n');
    }
}

/// Writes a JSONL session in the harness's current form: the header line,
/// then [`pack_chunks`]'s rows, one per line.
pub fn write_session_packed<'e>(
    out: &mut impl Write,
    header: &SessionHeader,
    events: &'e [Event<'e>],
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    header.write_json(&mut buf);
    buf.push(b'\n');
    for r in pack_chunks(events) {
        r.write_json(&mut buf);
        buf.push(b'\n');
        if buf.len() >= 1 << 16 {
            out.write_all(&buf)?;
            buf.clear();
        }
    }
    out.write_all(&buf)
}

// ---------------------------------------------------------------------------
// Zstandard logs
// ---------------------------------------------------------------------------

/// A Zstandard session log decoded into its JSONL text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZstdText {
    /// The decoded JSONL text: every complete frame, then what the torn
    /// final frame gave, if any (its unterminated last line is a torn tail
    /// for [`jsonl::read_session`]).
    pub text: Vec<u8>,
    /// Complete frames decoded (the header frame included).
    pub frames: usize,
    /// Bytes of `text` that came from complete frames: a bad line or seq
    /// gap inside them is damage, never a torn tail.
    pub complete_bytes: usize,
    /// The torn final frame, if the file ends inside one.
    pub torn: Option<TornFrame>,
}

/// A final frame cut short by a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornFrame {
    /// Its position among the frames (0 is the header frame).
    pub frame: usize,
    /// The byte offset where it starts in the file.
    pub offset: u64,
    /// Bytes of it in the file.
    pub bytes: u64,
    /// Bytes of JSONL text it still gave.
    pub decoded: u64,
    /// What was wrong.
    pub reason: String,
}

/// Damage in a Zstandard session log that a crash cannot explain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZstdError {
    /// A frame does not decode (bad magic, corrupt block, checksum
    /// mismatch).
    #[error("corrupt Zstandard session log: frame {frame} at byte {offset}: {reason}")]
    Corrupt {
        /// The frame's position (0 is the header frame).
        frame: usize,
        /// Its byte offset.
        offset: u64,
        /// The decoder's complaint.
        reason: String,
    },
    /// The first frame is not exactly one line.
    #[error("corrupt Zstandard session log: first frame is not exactly one header line ({reason})")]
    HeaderFrame {
        /// What it holds instead.
        reason: String,
    },
    /// The log decodes to more than the limit for hostile input.
    #[error(
        "Zstandard session log decodes to more than {limit} bytes; refused (limit for hostile input)"
    )]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// A complete frame ends inside a line.
    #[error(
        "corrupt Zstandard session log: complete frame {frame} at byte {offset} contains an unterminated JSONL record"
    )]
    Unterminated {
        /// The frame's position.
        frame: usize,
        /// Its byte offset.
        offset: u64,
    },
}

/// Whether `bytes` start like a Zstandard frame.
pub fn is_zstd(bytes: &[u8]) -> bool {
    bytes.starts_with(&ZSTD_MAGIC)
}

/// Decodes a Zstandard session log (a sequence of frames: the header line,
/// then one frame per append batch) into its JSONL text, decoding at most
/// [`bounded::zstd_session_limit`] bytes (see
/// [`read_zstd_session_limited`]).
pub fn read_zstd_session(bytes: &[u8]) -> Result<ZstdText, ZstdError> {
    read_zstd_session_limited(bytes, bounded::zstd_session_limit(bytes.len()))
}

/// Decodes a Zstandard session log into its JSONL text, refusing it
/// ([`ZstdError::TooLarge`]) as soon as the text passes `limit` bytes. The
/// output grows with the bytes really decoded (a frame's declared size is
/// never trusted), and frames needing a window above
/// [`bounded::ZSTD_WINDOW_LOG_MAX`] are corrupt.
///
/// - Every complete frame is decoded and the texts are concatenated.
/// - The first frame must be exactly one line ending in a newline, and every
///   later complete frame must end in a newline (or be empty): a complete
///   frame is a finished write, so a line it leaves open is damage, as the
///   harness's own reader says.
/// - A file that ends inside a frame (a torn final write, even one that
///   lacks only its checksum) is a torn tail: what the partial frame still
///   decodes is kept, and [`jsonl::read_session`] then drops its unterminated
///   last line. A tail of zero bytes where a frame should start (a crash
///   after the file grew but before its data landed) is torn too.
/// - Anything that does not decode (bad magic, corrupt block, checksum
///   mismatch) is [`ZstdError::Corrupt`]: bytes that are wrong, not missing.
pub fn read_zstd_session_limited(bytes: &[u8], limit: u64) -> Result<ZstdText, ZstdError> {
    let corrupt = |frame: usize, offset: usize, reason: String| ZstdError::Corrupt {
        frame,
        offset: offset as u64,
        reason,
    };
    let mut dec = bounded::decoder().map_err(|e| corrupt(0, 0, e.to_string()))?;
    // Which frame is torn is decided from the frame structure first, as the
    // harness decides it: damage inside a complete frame is corruption, while
    // a torn final frame keeps what it decodes to (nothing if it does not).
    let torn_start = bounded::torn_frame_start(bytes)
        .map_err(|(frame, offset, reason)| corrupt(frame, offset, reason))?;
    let complete_end = torn_start.unwrap_or(bytes.len());
    let mut text = Vec::new();
    let mut pos = 0;
    let mut frames = 0;
    let mut torn = None;
    while pos < bytes.len() {
        let start = pos;
        let text_start = text.len();
        if start >= complete_end {
            let mut reason = if bytes[start..].iter().all(|&b| b == 0) {
                "zero-filled tail where a frame should start".to_owned()
            } else {
                "the file ends inside the frame (torn write)".to_owned()
            };
            if !bytes[start..].iter().all(|&b| b == 0) {
                match bounded::decode_frame(&mut dec, &bytes[start..], &mut text, limit) {
                    Ok(_) => {}
                    Err(bounded::DecodeError::TooLarge { limit }) => {
                        return Err(ZstdError::TooLarge { limit });
                    }
                    Err(bounded::DecodeError::Corrupt(why)) => {
                        // The harness recovers nothing from a torn frame that
                        // does not decode; the complete frames stand.
                        text.truncate(text_start);
                        reason = format!("torn final frame does not decode: {why}");
                    }
                }
            }
            torn = Some(TornFrame {
                frame: frames,
                offset: start as u64,
                bytes: (bytes.len() - start) as u64,
                decoded: (text.len() - text_start) as u64,
                reason,
            });
            break;
        }
        let d = bounded::decode_frame(&mut dec, &bytes[pos..complete_end], &mut text, limit)
            .map_err(|e| match e {
                bounded::DecodeError::TooLarge { limit } => ZstdError::TooLarge { limit },
                bounded::DecodeError::Corrupt(reason) => corrupt(frames, start, reason),
            })?;
        pos += d.consumed;
        if !d.complete {
            return Err(corrupt(
                frames,
                start,
                "a structurally complete frame did not decode to its end".into(),
            ));
        }
        let frame_text = &text[text_start..];
        if frames == 0 {
            let newlines = frame_text.iter().filter(|&&b| b == b'\n').count();
            if newlines != 1 || frame_text.last() != Some(&b'\n') {
                return Err(ZstdError::HeaderFrame {
                    reason: format!(
                        "{} bytes, {newlines} newline(s){}",
                        frame_text.len(),
                        if frame_text.last() == Some(&b'\n') {
                            ""
                        } else {
                            ", unterminated"
                        }
                    ),
                });
            }
        } else if frame_text.last().is_some_and(|&b| b != b'\n') {
            return Err(ZstdError::Unterminated {
                frame: frames,
                offset: start as u64,
            });
        }
        frames += 1;
    }
    let complete_bytes = match &torn {
        Some(t) => text.len() - t.decoded as usize,
        None => text.len(),
    };
    Ok(ZstdText {
        text,
        frames,
        complete_bytes,
        torn,
    })
}

fn compressor() -> io::Result<zstd::bulk::Compressor<'static>> {
    let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    Ok(c)
}

/// Checks batch boundaries against `len` events: strictly increasing, each
/// in `1..len`.
fn check_boundaries(boundaries: &[usize], len: usize) -> io::Result<()> {
    let mut prev = 0;
    for &b in boundaries {
        if b <= prev || b >= len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "batch boundaries must be strictly increasing and inside 1..{len}, got {boundaries:?}"
                ),
            ));
        }
        prev = b;
    }
    Ok(())
}

/// What a write produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Lines written after the header (events and packed rows).
    pub rows: u64,
    /// Packed rows among them.
    pub packed_rows: u64,
    /// Zstandard frames written (0 for plain JSONL).
    pub frames: u64,
}

/// Writes a Zstandard session log as the harness's current backend does: a
/// frame holding the header line, then one frame per batch, chunk runs
/// packed inside each batch (a packed row never spans two batches).
///
/// `batch_boundaries` are the indices into `events` where a new batch
/// starts: strictly increasing, each in `1..events.len()`; none gives one
/// batch. Frames carry a content checksum. No events: the header frame only.
pub fn write_zstd_session<'e>(
    out: &mut impl Write,
    header: &SessionHeader,
    events: &'e [Event<'e>],
    batch_boundaries: &[usize],
) -> io::Result<()> {
    write_zstd_session_with(out, header, events, batch_boundaries, true).map(drop)
}

/// [`write_zstd_session`], choosing whether to pack chunk runs.
pub fn write_zstd_session_with<'e>(
    out: &mut impl Write,
    header: &SessionHeader,
    events: &'e [Event<'e>],
    batch_boundaries: &[usize],
    pack: bool,
) -> io::Result<WriteStats> {
    check_boundaries(batch_boundaries, events.len())?;
    let mut c = compressor()?;
    let mut stats = WriteStats::default();
    let mut plain = Vec::with_capacity(1 << 16);
    header.write_json(&mut plain);
    plain.push(b'\n');
    out.write_all(&c.compress(&plain)?)?;
    stats.frames += 1;
    let mut start = 0;
    let ends = batch_boundaries.iter().copied().chain([events.len()]);
    for end in ends {
        if start == end {
            break; // no events at all
        }
        let batch = &events[start..end];
        let rows: Vec<Row<'e>> = if pack {
            pack_chunks(batch)
        } else {
            batch.iter().map(Row::Event).collect()
        };
        plain.clear();
        write_rows(&mut plain, None, &rows);
        out.write_all(&c.compress(&plain)?)?;
        stats.frames += 1;
        stats.rows += rows.len() as u64;
        stats.packed_rows += rows.iter().filter(|r| matches!(r, Row::Packed(_))).count() as u64;
        start = end;
    }
    Ok(stats)
}

/// Batch boundaries after every `turn/end` (the harness flushes at turn
/// boundaries): the batches [`export_session`] writes as frames.
pub fn turn_batches(events: &[Event<'_>]) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(i, e)| e.kind == "turn/end" && i + 1 < events.len())
        .map(|(i, _)| i + 1)
        .collect()
}

// ---------------------------------------------------------------------------
// Import and export
// ---------------------------------------------------------------------------

/// How [`import_file`] treats an existing session and an open last turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportOptions {
    /// Replace a stored session with the same id (otherwise an error).
    pub replace: bool,
    /// Close an unclosed last turn after importing ([`Store::repair`]).
    pub repair: bool,
    /// Store the session under this id instead of the header's (harness
    /// test snapshots often share a placeholder id).
    pub id: Option<String>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            replace: false,
            repair: true,
            id: None,
        }
    }
}

/// What [`import_file`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportReport {
    /// The file.
    pub path: PathBuf,
    /// The session id (from the file's header).
    pub id: String,
    /// Whether the file was a Zstandard log.
    pub zstd: bool,
    /// Events read from the file (packed rows expanded) and stored.
    pub events: u64,
    /// Whether a stored session with the same id was replaced.
    pub replaced: bool,
    /// The torn last line that was dropped, if any.
    pub torn: Option<TornTail>,
    /// The torn final Zstandard frame, if any.
    pub torn_frame: Option<TornFrame>,
    /// The closers appended to close an unclosed last turn.
    pub closers: Vec<OwnedEvent>,
    /// The last turn was left open (`repair: false`). The store closes it
    /// the next time it opens the session from disk.
    pub left_open: bool,
}

/// Why [`import_file`] stored nothing. In every case the store is as it was.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The Zstandard stream is damaged.
    #[error("{}: {source}", path.display())]
    Zstd {
        /// The file.
        path: PathBuf,
        /// Where and what.
        source: ZstdError,
    },
    /// The log breaks a rule of the session model (or a packed row is
    /// malformed, or a line is damaged before the end): the file's line
    /// (1-based, the header is line 1; for a Zstandard log, a line of its
    /// decoded text) and the event's seq, where they are known.
    #[error("{}: corrupt{}{}: {violation}", path.display(),
        line.map(|l| format!(" at line {l}")).unwrap_or_default(),
        seq.map(|s| format!(" (seq {s})")).unwrap_or_default())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line.
        line: Option<u64>,
        /// The seq.
        seq: Option<u64>,
        /// The rule and reason.
        violation: Violation,
    },
    /// A session with this id is stored and `replace` was not asked.
    #[error("{}: session {id:?} already exists (import with replace to overwrite it)", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
        /// The id.
        id: String,
    },
    /// The store failed; nothing of the session is visible (and a replaced
    /// one is still in place).
    #[error("{}: storing session {id:?}: {source}", path.display())]
    Store {
        /// The file.
        path: PathBuf,
        /// The id.
        id: String,
        /// The store's error.
        source: Box<store::Error>,
    },
}

/// The seq range a line holds: `(first, count)`.
fn line_seqs(line: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(line).ok()?;
    let f = Fields::parse(text.strip_suffix('\r').unwrap_or(text)).ok()?;
    if let Some(seq0) = f.get("seq0").and_then(json::safe_u64) {
        let data = json::object(f.get("data")?)?;
        let pieces = data.get("texts").or_else(|| data.get("args"))?;
        return Some((seq0, json::array(pieces)?.len() as u64));
    }
    Some((f.get("seq").and_then(json::safe_u64)?, 1))
}

/// The (line, seq) a violation points at, as far as the text tells.
fn locate(text: &[u8], v: &Violation) -> (Option<u64>, Option<u64>) {
    match v.location {
        Location::Line(l) => {
            let seq = text
                .split(|&b| b == b'\n')
                .nth(l.saturating_sub(1) as usize)
                .and_then(line_seqs)
                .map(|(s, _)| s);
            (Some(l), seq)
        }
        Location::Seq(s) => {
            // Walk the contiguous prefix. A contiguity violation is the
            // first line that breaks it; any other names a seq inside it.
            let mut next = 0;
            for (i, line) in text.split(|&b| b == b'\n').enumerate().skip(1) {
                let Some((first, n)) = line_seqs(line) else {
                    continue;
                };
                let holds = (first..first.saturating_add(n)).contains(&s);
                if first != next || (holds && v.rule != Rule::Contiguity) {
                    return (holds.then_some(i as u64 + 1), Some(s));
                }
                next = first.saturating_add(n);
            }
            (None, Some(s))
        }
    }
}

/// Whether a file is a Zstandard log: by its extension (`.zstd`, `.zst`),
/// or by its first bytes (a JSONL file starts with `{`, never with the
/// Zstandard magic number).
fn is_zstd_file(path: &Path, bytes: &[u8]) -> bool {
    path.extension().is_some_and(|e| e == "zstd" || e == "zst") || is_zstd(bytes)
}

/// Imports one harness session file (plain JSONL, with or without packed
/// rows, or a Zstandard log) into `store`, under the id in its header.
///
/// The whole file is read and folded through the session model first (the
/// same checks as an append), so a damaged log stores nothing: the error
/// names the file, line and seq. A torn tail (last line, or final frame) is
/// dropped and reported. An existing session with the same id is an error
/// unless `replace`. The session is published whole ([`Store::import`]):
/// with `replace` it is swapped in for the old one only once it is
/// durable, so a failure or a crash never leaves a partial session or
/// neither. A header-only file is stored as a session with no events. An
/// unclosed last turn is stored as it was and then closed with
/// [`Store::repair`] unless `repair` is false.
pub fn import_file(
    store: &Store,
    path: &Path,
    opts: ImportOptions,
) -> Result<ImportReport, ImportError> {
    let bytes = std::fs::read(path).map_err(|source| ImportError::Io {
        path: path.to_owned(),
        source,
    })?;
    let zstd = is_zstd_file(path, &bytes);
    let (text, torn_frame, complete_bytes) = if zstd {
        let z = read_zstd_session(&bytes).map_err(|source| ImportError::Zstd {
            path: path.to_owned(),
            source,
        })?;
        (z.text, z.torn, Some(z.complete_bytes))
    } else {
        (bytes, None, None)
    };
    let corrupt = |violation: Violation| {
        let (line, seq) = locate(&text, &violation);
        ImportError::Corrupt {
            path: path.to_owned(),
            line,
            seq,
            violation,
        }
    };
    let session = jsonl::read_session(&text, false).map_err(corrupt)?;
    let mut header = session.header.header.clone();
    if let Some(id) = &opts.id {
        header.id = id.clone();
    }
    let id = header.id.clone();
    let open = !session.state.closers().is_empty();
    let store_err = |source: store::Error| match source {
        store::Error::Rejected { violation, .. } => corrupt(violation),
        source => ImportError::Store {
            path: path.to_owned(),
            id: id.clone(),
            source: Box::new(source),
        },
    };

    // A bad line or seq gap inside a complete Zstandard frame is damage:
    // the frame was a finished write (the harness refuses such a log).
    if let (Some(t), Some(complete)) = (&session.torn, complete_bytes)
        && line_start(&text, t.line) < complete
    {
        return Err(corrupt(Violation::new(
            Location::Line(t.line),
            Rule::Json,
            format!("inside a complete Zstandard frame: {}", t.reason),
        )));
    }

    // The store publishes the session whole (a header-only one too), or
    // swaps it in for the old one whole: a failure (or a crash) leaves the
    // store as it was.
    let replaced = store.exists(&id).map_err(store_err)?;
    if replaced && !opts.replace {
        return Err(ImportError::Exists {
            path: path.to_owned(),
            id,
        });
    }
    storing::store_session(store, header, &session.events, opts.replace).map_err(|e| match e {
        store::Error::Exists(_) => ImportError::Exists {
            path: path.to_owned(),
            id: id.clone(),
        },
        e => store_err(e),
    })?;
    let closers = if open && opts.repair {
        store.repair(&id).map_err(store_err)?
    } else {
        Vec::new()
    };
    Ok(ImportReport {
        path: path.to_owned(),
        id: id.clone(),
        zstd,
        events: session.events.len() as u64,
        replaced,
        torn: session.torn.clone(),
        torn_frame,
        closers,
        left_open: open && !opts.repair,
    })
}

/// The byte offset where 1-based `line` starts in `text`.
fn line_start(text: &[u8], line: u64) -> usize {
    if line <= 1 {
        return 0;
    }
    memchr::memchr_iter(b'\n', text)
        .nth(line as usize - 2)
        .map_or(text.len(), |p| p + 1)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(seq: u64, time: i64, data: &str) -> OwnedEvent {
        Event::new("assistant/chunk", seq, time, data).unwrap()
    }

    fn text(seq: u64, time: i64, index: u32, t: &str) -> OwnedEvent {
        chunk(
            seq,
            time,
            &format!(
                r#"{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":{index},"text":"{t}"}}}}"#
            ),
        )
    }

    fn round_trip(events: &[OwnedEvent]) -> Vec<Row<'_>> {
        let header = SessionHeader::new("s", 0);
        let mut out = Vec::new();
        write_session_packed(&mut out, &header, events).unwrap();
        let back = jsonl::read_session(&out, false).unwrap();
        assert_eq!(back.events, events);
        pack_chunks(events)
    }

    #[test]
    fn runs_shorter_than_three_stay_verbatim() {
        let ev = vec![text(0, 0, 0, "a"), text(1, 1, 0, "b"), text(2, 2, 1, "c")];
        assert!(round_trip(&ev).iter().all(|r| matches!(r, Row::Event(_))));
    }

    #[test]
    fn non_exact_shapes_break_runs() {
        let ev = vec![
            text(0, 0, 0, "a"),
            text(1, 1, 0, "b"),
            // Whitespace: expansion would not give these bytes back.
            chunk(
                2,
                2,
                r#"{"turn":1, "step":1,"chunk":{"type":"text-delta","index":0,"text":"c"}}"#,
            ),
            text(3, 3, 0, "d"),
        ];
        assert_eq!(round_trip(&ev).len(), 4);
        let ev = vec![text(0, 0, 0, "a"), text(1, 1, 0, "b"), text(2, 2, 0, "c")];
        assert_eq!(round_trip(&ev).len(), 1);
    }

    #[test]
    fn unsafe_gaps_split_runs() {
        let max = json::MAX_SAFE_INTEGER as i64;
        let ev = vec![
            text(0, -max, 0, "a"),
            text(1, -max, 0, "b"),
            text(2, -max, 0, "c"),
            text(3, max, 0, "d"),
            text(4, max, 0, "e"),
            text(5, max - 7, 0, "f"),
        ];
        let rows = round_trip(&ev);
        assert_eq!(rows.len(), 2);
        let Row::Packed(p) = &rows[1] else { panic!() };
        assert_eq!(p.dt, vec![0, -7]);
    }

    #[test]
    fn tool_calls_need_id_and_same_name() {
        let tc = |seq, name: &str, id: &str| {
            chunk(
                seq,
                seq as i64,
                &format!(
                    r#"{{"turn":1,"step":1,"chunk":{{"type":"tool-call-delta","index":1,"id":"{id}"{name},"argumentsDelta":"x"}}}}"#
                ),
            )
        };
        let named = r#","name":"bash""#;
        let ev = vec![
            tc(0, named, "c"),
            tc(1, named, "c"),
            tc(2, named, "c"),
            tc(3, "", "c"),
            tc(4, "", "c"),
            tc(5, "", "c"),
            tc(6, "", ""),
            tc(7, "", ""),
            tc(8, "", ""),
        ];
        let rows = round_trip(&ev);
        assert_eq!(rows.len(), 5);
        assert_eq!(
            rows[0].to_json(),
            r#"{"type":"tool-call-chunks","seq0":0,"time0":0,"data":{"turn":1,"step":1,"index":1,"dt":[1,1],"id":"c","name":"bash","args":["x","x","x"]}}"#
        );
        assert_eq!(
            rows[1].to_json(),
            r#"{"type":"tool-call-chunks","seq0":3,"time0":3,"data":{"turn":1,"step":1,"index":1,"dt":[1,1],"id":"c","args":["x","x","x"]}}"#
        );
    }

    #[test]
    fn escapes_round_trip() {
        for id in ["a/b", "~", "é", "😀", ".", "..", "...", "a b", "x~0041"] {
            assert_eq!(id_unescape(&id_escape(id)).as_deref(), Some(id), "{id}");
        }
        for bad in [".", "..", "~0041", "~002f", "a/b", "~D83D", "~00"] {
            assert_eq!(id_unescape(bad), None, "{bad}");
        }
    }

    #[test]
    fn locates_seqs_in_packed_text() {
        let t = b"{\"type\":\"session\"}\n{\"type\":\"text-chunks\",\"seq0\":0,\"time0\":0,\"data\":{\"texts\":[\"a\",\"b\",\"c\"]}}\n{\"type\":\"x\",\"seq\":3}\n{\"type\":\"x\",\"seq\":3}\n";
        let at = |loc, rule| locate(t, &Violation::new(loc, rule, ""));
        assert_eq!(at(Location::Seq(1), Rule::Provenance), (Some(2), Some(1)));
        assert_eq!(at(Location::Seq(3), Rule::Provenance), (Some(3), Some(3)));
        assert_eq!(at(Location::Seq(3), Rule::Contiguity), (Some(4), Some(3)));
        assert_eq!(at(Location::Line(4), Rule::Json), (Some(4), Some(3)));
    }
}
