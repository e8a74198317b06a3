//! The event envelope: one entry of a session's append-only log.
//!
//! An [`Event`] keeps `data` as the raw JSON bytes it arrived with (never
//! re-serialised), so a stored event exports to exactly the payload that came
//! in. Parsing is split in two steps so that violations are reported in the
//! order of the harness's checks: [`RawEvent::parse`] checks the envelope,
//! the caller checks contiguity, then [`RawEvent::into_event`] checks
//! eligibility, the `surfaceOp` shape and the `sourceEventSeqs` shape.

use crate::json::{self, Fields};
use crate::violation::{Location, Rule, Violation};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

pub use super::payload::{Data, DataError};

/// The event types the harness knew when the fixtures were written, sorted
/// (byte order) so that they can be binary-searched.
pub const KNOWN_TYPES: &[&str] = &[
    "agent-preset/selected",
    "agent/inbox/spliced",
    "approval/asked",
    "approval/decided",
    "approval/policy",
    "assistant/chunk",
    "assistant/message",
    "command/done",
    "command/run",
    "compaction/end",
    "compaction/prune",
    "compaction/start",
    "compaction/summary",
    "feedback/record",
    "goal/change",
    "hook/invoked",
    "hook/result",
    "llm/retry",
    "llm/retry-started",
    "permission/preset",
    "plan/mode",
    "request/context",
    "request/header",
    "sandbox/mode",
    "schedule/change",
    "session/end-seed",
    "session/title",
    "session/title-llm-request",
    "step/end",
    "step/start",
    "subagent/descriptor",
    "team/member",
    "team/message/delivered",
    "team/message/queued",
    "team/task",
    "todo/write",
    "tool-workflow/agent-end",
    "tool-workflow/agent-start",
    "tool-workflow/run-end",
    "tool-workflow/run-start",
    "tool/call",
    "tool/code-dispatch",
    "tool/code-dispatch-start",
    "tool/result",
    "turn/end",
    "turn/start",
    "user/message",
    "web/deepseek-search-llm-request",
];

/// Event types that produce model messages and so live on the surface.
pub const SURFACE_TYPES: [&str; 3] = ["user/message", "assistant/message", "tool/result"];

/// Whether events of type `kind` are surface-eligible.
pub fn is_surface_type(kind: &str) -> bool {
    SURFACE_TYPES.contains(&kind)
}

/// `kind` with a `'static` lifetime: an owned string is kept, a borrowed
/// one is looked up among the known types and copied only when it is not
/// one of them.
fn static_kind(kind: Cow<'_, str>) -> Cow<'static, str> {
    match kind {
        Cow::Owned(k) => Cow::Owned(k),
        Cow::Borrowed(k) => match KNOWN_TYPES.binary_search(&k) {
            Ok(i) => Cow::Borrowed(KNOWN_TYPES[i]),
            Err(_) => Cow::Owned(k.to_owned()),
        },
    }
}

/// How an event entered the surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum SurfaceOp {
    /// Added at the tail.
    Append,
    /// Shadows the surface nodes `start..=end` (by seq) and takes their place.
    Replace {
        /// First shadowed node.
        start: u64,
        /// Last shadowed node.
        end: u64,
    },
}

/// One event of a session log.
///
/// `kind` and `data` borrow from the input where they can (`Event<'static>`
/// owns them). `data` is the verbatim JSON text of the payload, checked
/// when it was made ([`Data`]).
///
/// ```
/// use sessionlog::event::Event;
/// let line = r#"{"type":"turn/start","seq":0,"time":5,"data":{"turn":1}}"#;
/// let ev = Event::from_json(line).unwrap();
/// assert_eq!(ev.kind, "turn/start");
/// assert_eq!(ev.data.get(), r#"{"turn":1}"#);
/// assert_eq!(ev.to_json(), line);
/// ```
#[derive(Debug, Clone)]
pub struct Event<'a> {
    /// The event type, e.g. `assistant/chunk`. The vocabulary is open.
    pub kind: Cow<'a, str>,
    /// Position in the session, contiguous from 0.
    pub seq: u64,
    /// Unix epoch milliseconds (a JS safe integer).
    pub time: i64,
    /// The payload, verbatim.
    pub data: Data<'a>,
    /// Provenance: seqs of earlier events this one was built from.
    pub source_event_seqs: Option<Vec<u64>>,
    /// How the event entered the surface (surface-eligible types only).
    pub surface_op: Option<SurfaceOp>,
    /// A reader that does not know `kind` may skip the event.
    pub ignorable: bool,
}

/// Equality of the stored form: `data` compares by its exact bytes.
impl PartialEq for Event<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.seq == other.seq
            && self.time == other.time
            && self.data == other.data
            && self.source_event_seqs == other.source_event_seqs
            && self.surface_op == other.surface_op
            && self.ignorable == other.ignorable
    }
}

/// An owned event.
pub type OwnedEvent = Event<'static>;

impl<'a> Event<'a> {
    /// Parses and checks one event from its JSON text, with no context (no
    /// contiguity check). Violations that cannot name a seq name line 0.
    pub fn from_json(text: &'a str) -> Result<Event<'a>, Violation> {
        RawEvent::parse(text)?.into_event()
    }

    /// Parses from bytes, rejecting invalid UTF-8.
    pub fn from_json_bytes(bytes: &'a [u8]) -> Result<Event<'a>, Violation> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            Violation::new(Location::Line(0), Rule::Json, format!("invalid UTF-8: {e}"))
        })?;
        Event::from_json(text)
    }

    /// Copies borrowed parts so the event outlives its input. A borrowed
    /// `kind` that is one of the known types becomes a `'static` borrow
    /// instead of a new `String`: owning an event allocates once (its
    /// data), not twice. (A store's reads own a whole batch at once, with
    /// one allocation for all its data.)
    pub fn into_owned(self) -> OwnedEvent {
        Event {
            kind: static_kind(self.kind),
            seq: self.seq,
            time: self.time,
            data: self.data.into_owned(),
            source_event_seqs: self.source_event_seqs,
            surface_op: self.surface_op,
            ignorable: self.ignorable,
        }
    }

    /// [`Event::into_owned`] for the events of a batch read back from
    /// storage whose seqs are in `seqs`, added to `out`: their borrowed
    /// payloads are copied into one buffer the owned events share (one
    /// allocation for the batch, not one per event; an event kept keeps the
    /// batch's text alive).
    pub(crate) fn into_owned_batch(
        events: Vec<Event<'a>>,
        seqs: Range<u64>,
        out: &mut impl Extend<OwnedEvent>,
    ) {
        let shared = |e: &Event<'_>| e.data.is_borrowed() && seqs.contains(&e.seq);
        let len: usize = events
            .iter()
            .filter(|e| shared(e))
            .map(|e| e.data.get().len())
            .sum();
        let mut text = String::with_capacity(len);
        for e in events.iter().filter(|e| shared(e)) {
            text.push_str(e.data.get());
        }
        let text: Arc<str> = text.into();
        let mut at = 0;
        // A decoded batch's types are borrowed from its type table, one
        // `&str` per type: looked up among the known types once each.
        let mut kinds: Vec<((*const u8, usize), Cow<'static, str>)> = Vec::new();
        let mut kind_of = |kind: Cow<'_, str>| match kind {
            Cow::Borrowed(k) => {
                let key = (k.as_ptr(), k.len());
                if let Some((_, known)) = kinds.iter().find(|(p, _)| *p == key) {
                    return known.clone();
                }
                let known = static_kind(Cow::Borrowed(k));
                kinds.push((key, known.clone()));
                known
            }
            Cow::Owned(k) => Cow::Owned(k),
        };
        out.extend(
            events
                .into_iter()
                .filter(|e| seqs.contains(&e.seq))
                .map(|e| {
                    let data = if e.data.is_borrowed() {
                        let end = at + e.data.get().len();
                        let range = std::mem::replace(&mut at, end)..end;
                        // Past u32 offsets (a batch of 4 GiB of text), each
                        // owns its own copy.
                        Data::shared(&text, range).unwrap_or_else(|| e.data.into_owned())
                    } else {
                        e.data.into_owned()
                    };
                    Event {
                        kind: kind_of(e.kind),
                        seq: e.seq,
                        time: e.time,
                        data,
                        source_event_seqs: e.source_event_seqs,
                        surface_op: e.surface_op,
                        ignorable: e.ignorable,
                    }
                }),
        );
    }

    /// A borrowed view of this event.
    pub fn borrowed(&self) -> Event<'_> {
        Event {
            kind: Cow::Borrowed(&self.kind),
            seq: self.seq,
            time: self.time,
            data: self.data.borrowed(),
            source_event_seqs: self.source_event_seqs.clone(),
            surface_op: self.surface_op,
            ignorable: self.ignorable,
        }
    }

    /// Writes the JSON envelope in the harness's field order: `type, seq,
    /// time, data, sourceEventSeqs, surfaceOp, ignorable`. `data` is copied
    /// verbatim.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        out.extend_from_slice(b"{\"type\":");
        json::write_str(out, &self.kind);
        let _ = write!(
            out,
            ",\"seq\":{},\"time\":{},\"data\":",
            self.seq, self.time
        );
        out.extend_from_slice(self.data.get().as_bytes());
        if let Some(src) = &self.source_event_seqs {
            out.extend_from_slice(b",\"sourceEventSeqs\":[");
            for (i, s) in src.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = write!(out, "{s}");
            }
            out.push(b']');
        }
        match self.surface_op {
            None => {}
            Some(SurfaceOp::Append) => out.extend_from_slice(b",\"surfaceOp\":\"append\""),
            Some(SurfaceOp::Replace { start, end }) => {
                let _ = write!(
                    out,
                    ",\"surfaceOp\":{{\"op\":\"replace\",\"start\":{start},\"end\":{end}}}"
                );
            }
        }
        if self.ignorable {
            out.extend_from_slice(b",\"ignorable\":true");
        }
        out.push(b'}');
    }

    /// The JSON envelope as a string (see [`Event::write_json`]).
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(64 + self.data.get().len());
        self.write_json(&mut out);
        String::from_utf8(out).expect("JSON output is UTF-8")
    }

    /// Checks this event on its own: the rules [`RawEvent`] applies to JSON
    /// input, for events built in code (seq/time range, eligibility,
    /// provenance shape).
    pub fn check_shape(&self) -> Result<(), Violation> {
        let seq = self.seq;
        if seq > json::MAX_SAFE_INTEGER {
            return Err(Violation::at(
                seq,
                Rule::Envelope,
                format!("seq {seq} is not a safe integer"),
            ));
        }
        if self.time.unsigned_abs() > json::MAX_SAFE_INTEGER {
            return Err(Violation::at(
                seq,
                Rule::Envelope,
                format!("time {} is not a safe integer", self.time),
            ));
        }
        // `data` was checked when it was made (`Data`).
        check_eligibility(
            &self.kind,
            seq,
            self.surface_op.is_some(),
            self.source_event_seqs.is_some(),
        )?;
        if let Some(src) = &self.source_event_seqs
            && let Some(bad) = src.iter().find(|s| **s > json::MAX_SAFE_INTEGER)
        {
            return Err(Violation::at(
                seq,
                Rule::Provenance,
                format!("sourceEventSeqs entry {bad} is not a safe integer"),
            ));
        }
        Ok(())
    }
}

impl OwnedEvent {
    /// An owned event from parts; `data` must be JSON text whose numbers
    /// are finite ([`Data::from_json`]).
    pub fn new(
        kind: impl Into<String>,
        seq: u64,
        time: i64,
        data: &str,
    ) -> Result<OwnedEvent, DataError> {
        Ok(Event {
            kind: Cow::Owned(kind.into()),
            seq,
            time,
            data: Data::from_json(data)?,
            source_event_seqs: None,
            surface_op: None,
            ignorable: false,
        })
    }
}

/// An event whose envelope has been checked but whose surface fields have
/// not: the step between the envelope check and the contiguity check.
#[derive(Debug)]
pub struct RawEvent<'a> {
    /// `type`.
    pub kind: Cow<'a, str>,
    /// `seq`.
    pub seq: u64,
    /// `time`.
    pub time: i64,
    /// `data`, verbatim (checked).
    pub data: Data<'a>,
    /// `sourceEventSeqs` as given (unchecked).
    pub source_event_seqs: Option<&'a RawValue>,
    /// `surfaceOp` as given (unchecked).
    pub surface_op: Option<&'a RawValue>,
    /// `ignorable`.
    pub ignorable: bool,
}

const ENVELOPE_KEYS: [&str; 7] = [
    "type",
    "seq",
    "time",
    "data",
    "sourceEventSeqs",
    "surfaceOp",
    "ignorable",
];

impl<'a> RawEvent<'a> {
    /// Parses the JSON text of one event and checks its envelope: only the
    /// keys of the envelope, each once; `type` a string; `seq` a
    /// non-negative safe integer; `time` a safe integer; `data` present;
    /// `ignorable` absent or `true`.
    ///
    /// A text that is not a JSON object is a [`Rule::Json`] violation at
    /// line 0 (the reader fills in the line).
    pub fn parse(text: &'a str) -> Result<RawEvent<'a>, Violation> {
        let fields = Fields::parse(text).map_err(|e| {
            Violation::new(
                Location::Line(0),
                Rule::Json,
                format!("not a JSON object: {e}"),
            )
        })?;
        // Name the seq in later errors when it is readable at all.
        let seq_hint = fields.get("seq").and_then(json::safe_u64);
        let loc = seq_hint.map_or(Location::Line(0), Location::Seq);
        let fail = |reason: String| Violation::new(loc, Rule::Envelope, reason);
        if let Some(k) = fields.duplicate_key() {
            return Err(fail(format!("duplicate key {k:?}")));
        }
        if let Some((k, _)) = fields
            .0
            .iter()
            .find(|(k, _)| !ENVELOPE_KEYS.contains(&&*k.0))
        {
            return Err(fail(format!("unknown envelope key {:?}", k.0)));
        }
        let kind = match fields.get("type") {
            None => return Err(fail("missing \"type\"".into())),
            Some(t) => json::string(t)
                .ok_or_else(|| fail(format!("\"type\" must be a string, got {}", t.get())))?,
        };
        let seq = match fields.get("seq") {
            None => return Err(fail("missing \"seq\"".into())),
            Some(s) => seq_hint.ok_or_else(|| {
                fail(format!(
                    "seq {} is not a non-negative safe integer",
                    s.get()
                ))
            })?,
        };
        let time = match fields.get("time") {
            None => return Err(fail("missing \"time\"".into())),
            Some(t) => json::safe_integer(t)
                .ok_or_else(|| fail(format!("time {} is not a safe integer", t.get())))?,
        };
        let data = fields
            .get("data")
            .ok_or_else(|| fail("missing \"data\"".into()))?;
        let data = Data::new(data).map_err(|why| {
            Violation::new(loc, Rule::Json, format!("data is not plain JSON: {why}"))
        })?;
        let ignorable = match fields.get("ignorable") {
            None => false,
            Some(v) if json::is_true(v) => true,
            Some(v) => {
                return Err(fail(format!(
                    "\"ignorable\" must be true when present, got {}",
                    v.get()
                )));
            }
        };
        Ok(RawEvent {
            kind,
            seq,
            time,
            data,
            source_event_seqs: fields.get("sourceEventSeqs"),
            surface_op: fields.get("surfaceOp"),
            ignorable,
        })
    }

    /// Checks eligibility and the shapes of `surfaceOp` and `sourceEventSeqs`,
    /// producing the typed event.
    pub fn into_event(self) -> Result<Event<'a>, Violation> {
        let seq = self.seq;
        check_eligibility(
            &self.kind,
            seq,
            self.surface_op.is_some(),
            self.source_event_seqs.is_some(),
        )?;
        let surface_op = self
            .surface_op
            .map(|raw| parse_surface_op(raw, seq))
            .transpose()?;
        let source_event_seqs = self
            .source_event_seqs
            .map(|raw| parse_sources(raw, seq))
            .transpose()?;
        Ok(Event {
            kind: self.kind,
            seq,
            time: self.time,
            data: self.data,
            source_event_seqs,
            surface_op,
            ignorable: self.ignorable,
        })
    }
}

/// Section 4: a surface-eligible event must carry `surfaceOp`; any other event
/// must carry neither `surfaceOp` nor `sourceEventSeqs`.
fn check_eligibility(
    kind: &str,
    seq: u64,
    has_op: bool,
    has_sources: bool,
) -> Result<(), Violation> {
    if is_surface_type(kind) {
        if !has_op {
            return Err(Violation::at(
                seq,
                Rule::Eligibility,
                format!("{kind} is surface-eligible and must carry surfaceOp"),
            ));
        }
    } else if has_op {
        return Err(Violation::at(
            seq,
            Rule::Eligibility,
            format!("{kind} is not surface-eligible and must not carry surfaceOp"),
        ));
    } else if has_sources {
        return Err(Violation::at(
            seq,
            Rule::Eligibility,
            format!("{kind} is not surface-eligible and must not carry sourceEventSeqs"),
        ));
    }
    Ok(())
}

fn parse_surface_op(raw: &RawValue, seq: u64) -> Result<SurfaceOp, Violation> {
    let bad = |why: &str| {
        Violation::at(
            seq,
            Rule::SurfaceOp,
            format!(
                "surfaceOp {} is invalid: {why}; expected \"append\" or {{\"op\":\"replace\",\"start\":S,\"end\":E}}",
                raw.get()
            ),
        )
    };
    if let Some(s) = json::string(raw) {
        return if s == "append" {
            Ok(SurfaceOp::Append)
        } else {
            Err(bad("unknown op"))
        };
    }
    let fields = json::object(raw).ok_or_else(|| bad("not a string or object"))?;
    if fields.duplicate_key().is_some() {
        return Err(bad("duplicate key"));
    }
    if fields.0.len() != 3
        || ["op", "start", "end"]
            .iter()
            .any(|k| fields.get(k).is_none())
    {
        return Err(bad("a replace object has exactly the keys op, start, end"));
    }
    if fields.get("op").and_then(json::string).as_deref() != Some("replace") {
        return Err(bad("op must be \"replace\""));
    }
    let start = fields
        .get("start")
        .and_then(json::safe_u64)
        .ok_or_else(|| bad("start must be a non-negative safe integer"))?;
    let end = fields
        .get("end")
        .and_then(json::safe_u64)
        .ok_or_else(|| bad("end must be a non-negative safe integer"))?;
    Ok(SurfaceOp::Replace { start, end })
}

fn parse_sources(raw: &RawValue, seq: u64) -> Result<Vec<u64>, Violation> {
    let items = json::array(raw).ok_or_else(|| {
        Violation::at(
            seq,
            Rule::Provenance,
            format!("sourceEventSeqs must be an array, got {}", raw.get()),
        )
    })?;
    items
        .into_iter()
        .map(|item| {
            json::safe_u64(item).ok_or_else(|| {
                Violation::at(
                    seq,
                    Rule::Provenance,
                    format!(
                        "sourceEventSeqs entry {} is not a non-negative safe integer",
                        item.get()
                    ),
                )
            })
        })
        .collect()
}

/// Serialises as the harness's JSON event (exactly [`Event::write_json`]'s
/// bytes, `data` verbatim), so an event can go into any serde output.
impl serde::Serialize for Event<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw = RawValue::from_string(self.to_json()).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule_of(text: &str) -> Rule {
        Event::from_json(text).unwrap_err().rule
    }

    #[test]
    fn a_batch_owned_at_once_shares_one_buffer_and_equals_each_owned_alone() {
        let lines = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"x/unknown","seq":1,"time":2,"data":"été"}"#,
            r#"{"type":"x/unknown","seq":2,"time":3,"data":[1,2,3]}"#,
            r#"{"type":"assistant/chunk","seq":3,"time":4,"data":{"t":"é"}}"#,
        ];
        let mut batch: Vec<Event<'_>> =
            lines.iter().map(|l| Event::from_json(l).unwrap()).collect();
        // One event's data already owned: kept as it is, not copied again.
        batch[2] = batch[2].clone().into_owned();
        let owned_ptr = batch[2].data.get().as_ptr();
        let alone: Vec<OwnedEvent> = batch.iter().cloned().map(Event::into_owned).collect();
        let mut together = Vec::new();
        Event::into_owned_batch(batch.clone(), 1..3, &mut together);
        assert_eq!(together, alone[1..3], "only the seqs asked for");
        together.clear();
        Event::into_owned_batch(batch, 0..u64::MAX, &mut together);
        assert_eq!(together, alone);
        assert!(together.iter().all(|e| !e.data.is_borrowed()));
        assert_eq!(together[2].data.get().as_ptr(), owned_ptr);
        // The borrowed ones now lie end to end in one buffer.
        let (a, b, d) = (&together[0].data, &together[1].data, &together[3].data);
        assert_eq!(
            b.get().as_ptr(),
            a.get().as_ptr().wrapping_add(a.get().len())
        );
        assert_eq!(
            d.get().as_ptr(),
            b.get().as_ptr().wrapping_add(b.get().len())
        );
        // A clone shares the text; a kept event outlives the others.
        let kept = together[3].clone();
        assert_eq!(kept.data.get().as_ptr(), d.get().as_ptr());
        drop(together);
        assert_eq!(kept.data.get(), r#"{"t":"é"}"#);
        assert_eq!(kept.kind, "assistant/chunk");
        assert!(
            matches!(kept.kind, Cow::Borrowed(_)),
            "a known type stays 'static"
        );
    }

    #[test]
    fn shared_data_takes_only_str_slices_of_its_buffer() {
        let text: Arc<str> = r#""é"[1]"#.into();
        assert_eq!(Data::shared(&text, 0..4).unwrap().get(), r#""é""#);
        assert_eq!(Data::shared(&text, 4..7).unwrap().get(), "[1]");
        assert!(Data::shared(&text, 0..2).is_none(), "inside a char");
        assert!(Data::shared(&text, 4..8).is_none(), "past the end");
    }

    #[test]
    fn round_trips_verbatim_data() {
        let line = r#"{"type":"user/message","seq":3,"time":-7,"data":{"b":1.50,"a":"\u00e9"},"sourceEventSeqs":[1,2],"surfaceOp":{"op":"replace","start":1,"end":2},"ignorable":true}"#;
        let ev = Event::from_json(line).unwrap();
        assert_eq!(ev.data.get(), r#"{"b":1.50,"a":"\u00e9"}"#);
        assert_eq!(ev.surface_op, Some(SurfaceOp::Replace { start: 1, end: 2 }));
        assert_eq!(ev.to_json(), line);
    }

    #[test]
    fn into_owned_borrows_known_kinds_statically() {
        let text = r#"{"type":"assistant/chunk","seq":0,"time":0,"data":{}}"#;
        let ev = Event::from_json(text).unwrap();
        assert!(matches!(ev.kind, Cow::Borrowed(_)));
        let owned = ev.clone().into_owned();
        assert!(matches!(owned.kind, Cow::Borrowed("assistant/chunk")));
        assert_eq!(owned, ev);
        let odd = r#"{"type":"vendor/thing","seq":0,"time":0,"data":{}}"#;
        let owned = Event::from_json(odd).unwrap().into_owned();
        assert!(matches!(owned.kind, Cow::Owned(ref k) if k == "vendor/thing"));
    }

    #[test]
    fn envelope_rejections() {
        let base = |extra: &str| format!(r#"{{"type":"x","seq":0,"time":0,"data":{{}}{extra}}}"#);
        assert_eq!(rule_of(&base(r#","other":1"#)), Rule::Envelope);
        assert_eq!(rule_of(&base(r#","ignorable":false"#)), Rule::Envelope);
        assert_eq!(rule_of(&base(r#","seq":1"#)), Rule::Envelope);
        assert_eq!(
            rule_of(r#"{"type":"x","seq":1.5,"time":0,"data":{}}"#),
            Rule::Envelope
        );
        assert_eq!(
            rule_of(r#"{"type":"x","seq":-1,"time":0,"data":{}}"#),
            Rule::Envelope
        );
        assert_eq!(
            rule_of(r#"{"type":"x","seq":9007199254740992,"time":0,"data":{}}"#),
            Rule::Envelope
        );
        assert_eq!(
            rule_of(r#"{"type":"x","seq":0,"time":"1","data":{}}"#),
            Rule::Envelope
        );
        assert_eq!(rule_of(r#"{"type":"x","seq":0,"time":0}"#), Rule::Envelope);
        assert_eq!(
            rule_of(r#"{"type":1,"seq":0,"time":0,"data":{}}"#),
            Rule::Envelope
        );
        assert_eq!(
            rule_of(r#"{"type":"x","seq":0,"time":0,"data":NaN}"#),
            Rule::Json
        );
        assert_eq!(
            rule_of(r#"{"type":"x","seq":0,"time":0,"data":1e999}"#),
            Rule::Json
        );
        assert_eq!(rule_of(r#"[1]"#), Rule::Json);
        assert_eq!(
            Event::from_json_bytes(b"{\"type\":\"\xff\",\"seq\":0,\"time\":0,\"data\":{}}")
                .unwrap_err()
                .rule,
            Rule::Json
        );
        // An integral float is an integer, as in JS.
        assert_eq!(
            Event::from_json(r#"{"type":"x","seq":2.0,"time":1e3,"data":{}}"#)
                .unwrap()
                .seq,
            2
        );
    }

    #[test]
    fn eligibility_and_shapes() {
        assert_eq!(
            rule_of(r#"{"type":"user/message","seq":0,"time":0,"data":{}}"#),
            Rule::Eligibility
        );
        assert_eq!(
            rule_of(r#"{"type":"turn/start","seq":0,"time":0,"data":{},"surfaceOp":"append"}"#),
            Rule::Eligibility
        );
        assert_eq!(
            rule_of(r#"{"type":"turn/start","seq":0,"time":0,"data":{},"sourceEventSeqs":[0]}"#),
            Rule::Eligibility
        );
        assert_eq!(
            rule_of(r#"{"type":"user/message","seq":0,"time":0,"data":{},"surfaceOp":"prepend"}"#),
            Rule::SurfaceOp
        );
        assert_eq!(
            rule_of(
                r#"{"type":"user/message","seq":0,"time":0,"data":{},"surfaceOp":{"op":"replace","start":0,"end":0,"x":1}}"#
            ),
            Rule::SurfaceOp
        );
        assert_eq!(
            rule_of(
                r#"{"type":"user/message","seq":0,"time":0,"data":{},"surfaceOp":"append","sourceEventSeqs":null}"#
            ),
            Rule::Provenance
        );
        assert_eq!(
            rule_of(
                r#"{"type":"user/message","seq":0,"time":0,"data":{},"surfaceOp":"append","sourceEventSeqs":[-1]}"#
            ),
            Rule::Provenance
        );
    }
}
