//! The harness's JSONL session files (section 9): line 1 the header, then one
//! event per line, where runs of delta chunks may be packed into one row.
//!
//! Reading folds every event through the session model, so the first broken
//! rule is reported with its line or seq. Torn tails follow section 10: a
//! final fragment without a newline is ignored; an unparsable line or a seq
//! gap ends the kept prefix, unless a `turn/end` follows it (on that line or
//! later), in which case it is corruption: the harness wrote on past it.

use crate::adapters::Reporter;
use crate::adapters::bounded;
use crate::event::{Data, Event, RawEvent};
use crate::header::{ParsedHeader, SessionHeader};
use crate::invariants;
use crate::json::{self, Fields};
use crate::session::SessionState;
use crate::violation::{Location, Rule, Violation};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::io::{self, Write};

/// The packed row types and the chunk type their members expand to.
const PACKED_TYPES: [(&str, &str); 3] = [
    ("text-chunks", "text-delta"),
    ("reasoning-chunks", "reasoning-delta"),
    ("tool-call-chunks", "tool-call-delta"),
];

/// Why reading stopped before the end of the file without an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The first line that was not kept (1-based).
    pub line: u64,
    /// What was wrong with it.
    pub reason: String,
}

/// A session read from a JSONL file.
#[derive(Debug)]
pub struct JsonlSession<'a> {
    /// The header as read.
    pub header: ParsedHeader,
    /// The logical events (packed rows expanded), borrowing from the input
    /// where they can.
    pub events: Vec<Event<'a>>,
    /// The folded state: surface, repair tracker, invariants.
    pub state: SessionState,
    /// The torn tail that was ignored, if any.
    pub torn: Option<TornTail>,
}

/// Reads a harness JSONL session file (plain or with packed rows).
///
/// `strict` adds the invariants of section 8 and the strict header rule.
///
/// ```
/// use sessionlog::adapters::jsonl::read_session;
/// let file = b"{\"type\":\"session\",\"id\":\"s\",\"createdAt\":0}\n{\"type\":\"turn/start\",\"seq\":0,\"time\":0,\"data\":{\"turn\":1}}\n{\"type\":\"turn/e";
/// let s = read_session(file, false).unwrap();
/// assert_eq!(s.events.len(), 1);
/// assert_eq!(s.torn.unwrap().line, 3);
/// ```
pub fn read_session(input: &[u8], strict: bool) -> Result<JsonlSession<'_>, Violation> {
    read(input, strict, false, &mut Reporter::new(&mut |_| {}))
}

/// [`read_session`], reporting the bytes of `input` read (and events) to
/// `progress` as it goes.
pub(crate) fn read_session_reporting<'a>(
    input: &'a [u8],
    strict: bool,
    progress: &mut Reporter<'_>,
) -> Result<JsonlSession<'a>, Violation> {
    read(input, strict, false, progress)
}

/// Validates a harness JSONL session file as `check` does: like
/// [`read_session`], except that every complete line counts. An unparsable
/// line or a seq gap is reported as a violation even when no `turn/end`
/// follows it (the loader, [`read_session`], treats that as a torn tail and
/// keeps the prefix). Only a final fragment without a newline is ignored.
///
/// ```
/// use sessionlog::adapters::jsonl::{check_session, read_session};
/// let file = b"{\"type\":\"session\",\"id\":\"s\",\"createdAt\":0}\n{\"type\":\"turn/start\",\"seq\":1,\"time\":0,\"data\":{\"turn\":1}}\n";
/// assert!(read_session(file, false).unwrap().torn.is_some());
/// assert!(check_session(file, false).is_err());
/// ```
pub fn check_session(input: &[u8], strict: bool) -> Result<JsonlSession<'_>, Violation> {
    read(input, strict, true, &mut Reporter::new(&mut |_| {}))
}

fn read<'a>(
    input: &'a [u8],
    strict: bool,
    validate: bool,
    progress: &mut Reporter<'_>,
) -> Result<JsonlSession<'a>, Violation> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    let mut torn = None;
    // `split` yields a last piece after the final newline: empty when the file
    // ends with one, a fragment (a torn write) when it does not.
    let last = lines.pop().unwrap_or_default();
    if !last.is_empty() {
        torn = Some(TornTail {
            line: lines.len() as u64 + 1,
            reason: "final line has no newline (torn write)".into(),
        });
    }
    let Some(first) = lines.first() else {
        return Err(Violation::new(
            Location::Line(1),
            Rule::Header,
            "the file has no complete header line",
        ));
    };
    let header_text = std::str::from_utf8(trim_cr(first)).map_err(|e| {
        Violation::new(
            Location::Line(1),
            Rule::Header,
            format!("invalid UTF-8: {e}"),
        )
    })?;
    let header = SessionHeader::from_json(header_text)?;
    if strict {
        invariants::check_header(&header)?;
    }
    let mut state = SessionState::new(strict);
    let mut events: Vec<Event<'_>> = Vec::new();
    // The bytes of the lines before this one, newlines included.
    let mut done = first.len() as u64 + 1;
    for (idx, raw_line) in lines.iter().enumerate().skip(1) {
        progress.text(done, events.len() as u64);
        done += raw_line.len() as u64 + 1;
        let line_no = idx as u64 + 1;
        let line = trim_cr(raw_line);
        // Ends the kept prefix, or is corruption when a turn/end follows.
        let stop = |rule: Rule, loc: Location, reason: String| {
            if validate || lines[idx..].iter().any(|l| is_turn_end(l)) {
                Err(Violation::new(loc, rule, reason))
            } else {
                Ok(TornTail {
                    line: line_no,
                    reason,
                })
            }
        };
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(e) => {
                torn = Some(stop(
                    Rule::Json,
                    Location::Line(line_no),
                    format!("invalid UTF-8: {e}"),
                )?);
                break;
            }
        };
        let at_line = |mut v: Violation| {
            if let Location::Line(0) = v.location {
                v.location = Location::Line(line_no);
            }
            v
        };
        if let Some(row) = packed_row(text) {
            let members = expand_packed_row(&row).map_err(|why| {
                Violation::new(
                    Location::Line(line_no),
                    Rule::PackedRow,
                    format!("malformed packed row: {why}"),
                )
            })?;
            let first_seq = members.first().map(|m| m.seq).unwrap_or_default();
            if let Err(v) = state.check_contiguity(first_seq) {
                torn = Some(stop(v.rule, v.location, v.reason)?);
                break;
            }
            for m in members {
                state.append(&m, &events)?;
                events.push(m);
            }
            continue;
        }
        let raw = match RawEvent::parse(text) {
            Ok(raw) => raw,
            // A line that parses as a JSON object but breaks the JSON rules
            // of an event (a number that is not finite, `1e400`) is not a
            // torn write: the harness reads it. Refused, never dropped.
            Err(v) if v.rule == Rule::Json && Fields::parse(text).is_ok() => {
                return Err(at_line(v));
            }
            Err(v) if v.rule == Rule::Json => {
                torn = Some(stop(Rule::Json, Location::Line(line_no), v.reason)?);
                break;
            }
            Err(v) => return Err(at_line(v)),
        };
        if let Err(v) = state.check_contiguity(raw.seq) {
            torn = Some(stop(v.rule, v.location, v.reason)?);
            break;
        }
        let event = raw.into_event().map_err(at_line)?;
        state.append(&event, &events)?;
        events.push(event);
    }
    Ok(JsonlSession {
        header,
        events,
        state,
        torn,
    })
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Whether a line is an event whose type is `turn/end`.
fn is_turn_end(line: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(line) else {
        return false;
    };
    text.contains("turn/end")
        && Fields::parse(text)
            .ok()
            .and_then(|f| {
                f.get("type")
                    .and_then(json::string)
                    .map(|t| t == "turn/end")
            })
            .unwrap_or(false)
}

/// The fields of a line when it is a packed row (its type is a packed type).
fn packed_row(text: &str) -> Option<Fields<'_>> {
    if !text.contains("-chunks\"") {
        return None;
    }
    let fields = Fields::parse(text).ok()?;
    let kind = fields.get("type").and_then(json::string)?;
    PACKED_TYPES
        .iter()
        .any(|(t, _)| *t == kind)
        .then_some(fields)
}

/// Expands a packed row into its member events: member k has seq `seq0+k`,
/// time `time0 + dt[0] + ... + dt[k-1]`, and data `{turn, step, chunk:{type,
/// index, text}}` (tool calls: `{type, index, id, name?, argumentsDelta}`).
pub fn expand_packed_row<'a>(row: &Fields<'a>) -> Result<Vec<Event<'a>>, String> {
    if let Some(k) = row.duplicate_key() {
        return Err(format!("duplicate key {k:?}"));
    }
    if let Some((k, _)) = row
        .0
        .iter()
        .find(|(k, _)| !["type", "seq0", "time0", "data"].contains(&&*k.0))
    {
        return Err(format!("unknown key {:?}", k.0));
    }
    let kind = row
        .get("type")
        .and_then(json::string)
        .ok_or("missing type")?;
    let chunk_type = PACKED_TYPES
        .iter()
        .find(|(t, _)| *t == kind)
        .map(|(_, c)| *c)
        .ok_or("not a packed row type")?;
    let tool = chunk_type == "tool-call-delta";
    let seq0 = row
        .get("seq0")
        .and_then(json::safe_u64)
        .ok_or("seq0 must be a non-negative safe integer")?;
    let time0 = row
        .get("time0")
        .and_then(json::safe_integer)
        .ok_or("time0 must be a safe integer")?;
    let data = row
        .get("data")
        .and_then(json::object)
        .ok_or("data must be an object")?;
    if let Some(k) = data.duplicate_key() {
        return Err(format!("duplicate key {k:?} in data"));
    }
    let allowed: &[&str] = if tool {
        &["turn", "step", "index", "dt", "id", "name", "args"]
    } else {
        &["turn", "step", "index", "dt", "texts"]
    };
    if let Some((k, _)) = data.0.iter().find(|(k, _)| !allowed.contains(&&*k.0)) {
        return Err(format!("unknown data key {:?}", k.0));
    }
    let need = |k: &'static str| data.get(k).ok_or_else(|| format!("data.{k} is missing"));
    let (turn, step, index) = (need("turn")?, need("step")?, need("index")?);
    // The harness requires numbers here; a bound on their length (and on
    // the copied strings below) bounds how much larger than the row its
    // expansion can be, since every member repeats them.
    for (k, v) in [("turn", turn), ("step", step), ("index", index)] {
        if !is_number(v) {
            return Err(format!("data.{k} must be a number"));
        }
        if v.get().len() > bounded::MAX_PACKED_NUMBER_BYTES {
            return Err(format!(
                "data.{k} is a number literal of {} bytes (limit {})",
                v.get().len(),
                bounded::MAX_PACKED_NUMBER_BYTES
            ));
        }
    }
    let pieces = json::array(need(if tool { "args" } else { "texts" })?)
        .ok_or("texts/args must be an array")?;
    if pieces.is_empty() {
        return Err("a packed row needs at least one member".into());
    }
    if let Some(p) = pieces.iter().find(|p| !is_string(p)) {
        return Err(format!("member {} is not a string", p.get()));
    }
    let dt = json::array(need("dt")?).ok_or("dt must be an array")?;
    if dt.len() + 1 != pieces.len() {
        return Err(format!(
            "dt has {} gaps for {} members; expected {}",
            dt.len(),
            pieces.len(),
            pieces.len() - 1
        ));
    }
    let (id, name) = if tool {
        let id = need("id")?;
        if !is_string(id) {
            return Err("id must be a string".into());
        }
        let name = data.get("name");
        if name.is_some_and(|n| !is_string(n)) {
            return Err("name must be a string".into());
        }
        (Some(id), name)
    } else {
        (None, None)
    };
    let replicated = bounded::packed_replicated_bytes(turn, step, index, id, name);
    if replicated > bounded::MAX_PACKED_REPLICATED_BYTES {
        return Err(format!(
            "turn, step, index, id and name take {replicated} bytes, copied into every member (limit {})",
            bounded::MAX_PACKED_REPLICATED_BYTES
        ));
    }
    let mut out = Vec::with_capacity(pieces.len());
    let mut time = time0;
    for (k, piece) in pieces.iter().enumerate() {
        if k > 0 {
            let gap = json::safe_integer(dt[k - 1]).ok_or("dt entries must be safe integers")?;
            time = time
                .checked_add(gap)
                .filter(|t| t.unsigned_abs() <= json::MAX_SAFE_INTEGER)
                .ok_or("member time is not a safe integer")?;
        }
        let seq = seq0 + k as u64;
        if seq > json::MAX_SAFE_INTEGER {
            return Err("member seq is not a safe integer".into());
        }
        let mut d = String::with_capacity(96 + piece.get().len());
        d.push_str("{\"turn\":");
        d.push_str(turn.get());
        d.push_str(",\"step\":");
        d.push_str(step.get());
        d.push_str(",\"chunk\":{\"type\":\"");
        d.push_str(chunk_type);
        d.push_str("\",\"index\":");
        d.push_str(index.get());
        if let Some(id) = id {
            d.push_str(",\"id\":");
            d.push_str(id.get());
            if let Some(name) = name {
                d.push_str(",\"name\":");
                d.push_str(name.get());
            }
            d.push_str(",\"argumentsDelta\":");
        } else {
            d.push_str(",\"text\":");
        }
        d.push_str(piece.get());
        d.push_str("}}");
        out.push(Event {
            kind: Cow::Borrowed("assistant/chunk"),
            seq,
            time,
            data: Data::from_json(d).map_err(|e| e.to_string())?,
            source_event_seqs: None,
            surface_op: None,
            ignorable: false,
        });
    }
    Ok(out)
}

/// Whether a raw JSON value is a string. Any JSON string counts, a lone
/// UTF-16 surrogate escape (`"\ud83d"`) too: a JavaScript string holds
/// one (a streamed emoji split between two chunks), the harness packs it,
/// and the expanded member copies the literal verbatim.
fn is_string(v: &RawValue) -> bool {
    v.get().starts_with('"')
}

/// Whether a raw JSON value is a number.
fn is_number(v: &RawValue) -> bool {
    v.get()
        .as_bytes()
        .first()
        .is_some_and(|b| *b == b'-' || b.is_ascii_digit())
}

/// Writes a plain JSONL session: the header line, then one event per line.
pub fn write_session<'e>(
    out: &mut impl Write,
    header: &SessionHeader,
    events: impl IntoIterator<Item = &'e Event<'e>>,
) -> io::Result<()> {
    write_lines(out, header, events, |e, buf| e.write_json(buf))
}

/// Writes the header line, then one line per item (`line` writes an
/// item's JSON, without the newline), through a 64 KiB buffer: every JSONL
/// form (plain, packed rows) is written by this one loop.
pub(crate) fn write_lines<T>(
    out: &mut impl Write,
    header: &SessionHeader,
    items: impl IntoIterator<Item = T>,
    mut line: impl FnMut(&T, &mut Vec<u8>),
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    header.write_json(&mut buf);
    buf.push(b'\n');
    for item in items {
        line(&item, &mut buf);
        buf.push(b'\n');
        if buf.len() >= 1 << 16 {
            out.write_all(&buf)?;
            buf.clear();
        }
    }
    out.write_all(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "{\"type\":\"session\",\"id\":\"s\",\"createdAt\":0}\n";

    fn file(lines: &[&str]) -> Vec<u8> {
        let mut f = H.as_bytes().to_vec();
        for l in lines {
            f.extend_from_slice(l.as_bytes());
            f.push(b'\n');
        }
        f
    }

    #[test]
    fn expands_packed_rows_exactly() {
        let f = file(&[
            r#"{"type":"text-chunks","seq0":0,"time0":10,"data":{"turn":1,"step":1,"index":0,"dt":[2,3],"texts":["a","b","c"]}}"#,
            r#"{"type":"tool-call-chunks","seq0":3,"time0":20,"data":{"turn":1,"step":1,"index":1,"dt":[1],"id":"c1","name":"bash","args":["{","}"]}}"#,
        ]);
        let s = read_session(&f, false).unwrap();
        let got: Vec<String> = s.events.iter().map(Event::to_json).collect();
        assert_eq!(
            got[1],
            r#"{"type":"assistant/chunk","seq":1,"time":12,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"b"}}}"#
        );
        assert_eq!(
            got[2],
            r#"{"type":"assistant/chunk","seq":2,"time":15,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"c"}}}"#
        );
        assert_eq!(
            got[4],
            r#"{"type":"assistant/chunk","seq":4,"time":21,"data":{"turn":1,"step":1,"chunk":{"type":"tool-call-delta","index":1,"id":"c1","name":"bash","argumentsDelta":"}"}}}"#
        );
    }

    #[test]
    fn malformed_packed_row_names_the_line() {
        let f = file(&[
            r#"{"type":"text-chunks","seq0":0,"time0":10,"data":{"turn":1,"step":1,"index":0,"dt":[2],"texts":["a","b","c"]}}"#,
        ]);
        let v = read_session(&f, false).unwrap_err();
        assert_eq!((v.rule, v.location), (Rule::PackedRow, Location::Line(2)));
    }

    #[test]
    fn gap_is_torn_unless_a_turn_end_follows() {
        let t0 = r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1}}"#;
        let gap = r#"{"type":"step/start","seq":5,"time":0,"data":{"turn":1,"step":1}}"#;
        let end = r#"{"type":"turn/end","seq":6,"time":0,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;
        let f = file(&[t0, gap]);
        let s = read_session(&f, false).unwrap();
        assert_eq!((s.events.len(), s.torn.unwrap().line), (1, 3));
        let v = read_session(&file(&[t0, gap, end]), false).unwrap_err();
        assert_eq!((v.rule, v.seq()), (Rule::Contiguity, Some(5)));
        let f = file(&[t0, "{not json"]);
        let s = read_session(&f, false).unwrap();
        assert_eq!(s.torn.unwrap().line, 3);
        let v = read_session(&file(&[t0, "{not json", end]), false).unwrap_err();
        assert_eq!((v.rule, v.location), (Rule::Json, Location::Line(3)));
    }

    #[test]
    fn envelope_errors_are_violations_not_torn_tails() {
        let v = read_session(
            &file(&[r#"{"type":"x","seq":0,"time":0,"data":{},"extra":1}"#]),
            false,
        )
        .unwrap_err();
        assert_eq!((v.rule, v.seq()), (Rule::Envelope, Some(0)));
        let v = read_session(
            &file(&[r#"{"type":"x","seq":"0","time":0,"data":{}}"#]),
            false,
        )
        .unwrap_err();
        assert_eq!((v.rule, v.location), (Rule::Envelope, Location::Line(2)));
    }

    #[test]
    fn writes_what_it_reads() {
        let f = file(&[r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1}}"#]);
        let s = read_session(&f, false).unwrap();
        let mut out = Vec::new();
        write_session(&mut out, &s.header.header, &s.events).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"type\":\"session\",\"version\":0,\"id\":\"s\",\"createdAt\":0,\"delegationDepth\":0}\n{\"type\":\"turn/start\",\"seq\":0,\"time\":0,\"data\":{\"turn\":1}}\n"
        );
    }
}
