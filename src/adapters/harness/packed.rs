//! Packed chunk rows: runs of `assistant/chunk` events of one block written
//! as one row, byte for byte as the harness's encoder writes them.

use crate::adapters::{bounded, jsonl};
use crate::event::Event;
use crate::header::SessionHeader;
use crate::json::{self, Fields};
use serde_json::value::RawValue;
use std::io::{self, Write};

/// The shortest run of chunks the harness packs into one row.
pub const MIN_PACKED_RUN: usize = 3;

/// The three kinds of packed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
#[non_exhaustive]
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
///
/// [`jsonl::expand_packed_row`]: crate::adapters::jsonl::expand_packed_row
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
    let replicated = bounded::packed_replicated_bytes(turn, step, index, id, name);
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
pub(super) fn write_rows(out: &mut Vec<u8>, header: Option<&SessionHeader>, rows: &[Row<'_>]) {
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
    jsonl::write_lines(out, header, pack_chunks(events), Row::write_json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OwnedEvent;

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
}
