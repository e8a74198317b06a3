//! Crash repair (section 7): closing an interrupted last turn.
//!
//! The [`RepairTracker`] follows the open turn, the open step and the tool
//! calls still waiting for a result, one event at a time, so its state can be
//! checkpointed with the rest of the index. [`RepairTracker::closers`] yields
//! the synthetic events that balance the log, deterministically: for each
//! pending call a `tool/result` (outcome unknown when a `tool/call` event was
//! logged for it, not started otherwise), then `step/end` if a step is open,
//! then `turn/end` with reason `interrupted`. Closers are always written in
//! the nested dialect, whatever dialect the log uses.

use crate::event::{Data, Event, OwnedEvent, SurfaceOp};
use crate::json::{self, Valid};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::io::Write;

/// The message of a closer for a call whose `tool/call` was logged.
pub const OUTCOME_UNKNOWN_TEXT: &str = "The tool call was interrupted after it was recorded, but no result was durably recorded. Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the operation is read-only or idempotent; if it may have side effects, first verify external state or ask the user. Do not retry blindly.";

/// The message of a closer for a call that was never logged as started.
pub const NOT_STARTED_TEXT: &str = "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed.";

/// An open turn: its `turn` value as raw JSON (absent when the event had none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenTurn {
    pub(crate) turn: Option<String>,
}

/// An open step: its `turn` and `step` values as raw JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenStep {
    pub(crate) turn: Option<String>,
    pub(crate) step: Option<String>,
}

/// A tool call requested by the model and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingCall {
    pub(crate) call_id: String,
    /// The seq of the `tool/call` event logged for it, if any.
    pub(crate) call_seq: Option<u64>,
}

/// A repair tracker as plain data, for the checkpoint codec (which knows the
/// bytes; the tracker knows what it can use). Owned: a tracker holds one
/// turn's open calls, so copying it out costs little.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepairParts {
    pub(crate) turn: Option<OpenTurn>,
    pub(crate) step: Option<OpenStep>,
    pub(crate) pending: Vec<PendingCall>,
    pub(crate) logged_calls: Vec<(String, u64)>,
    pub(crate) next_seq: u64,
    pub(crate) last_time: i64,
}

/// Follows what a crash would leave open.
///
/// ```
/// use sessionlog::event::Event;
/// use sessionlog::repair::RepairTracker;
/// let mut t = RepairTracker::default();
/// t.observe(&Event::from_json(r#"{"type":"turn/start","seq":0,"time":9,"data":{"turn":1}}"#).unwrap());
/// let closers = t.closers();
/// assert_eq!(closers[0].to_json(), r#"{"type":"turn/end","seq":1,"time":9,"data":{"turn":1,"reason":{"kind":"interrupted"}}}"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairTracker {
    turn: Option<OpenTurn>,
    step: Option<OpenStep>,
    pending: Vec<PendingCall>,
    /// `tool/call` events seen since the last reset, by call id, first wins.
    logged_calls: Vec<(String, u64)>,
    next_seq: u64,
    last_time: i64,
}

impl RepairTracker {
    /// Folds one event in. Never fails: the tracker reads what it can.
    pub fn observe(&mut self, event: &Event<'_>) {
        self.next_seq = event.seq + 1;
        self.last_time = event.time;
        match &*event.kind {
            "turn/start" => {
                self.reset_calls();
                self.step = None;
                self.turn = Some(OpenTurn {
                    turn: field(&event.data, "turn"),
                });
            }
            "turn/end" => {
                self.reset_calls();
                self.step = None;
                self.turn = None;
            }
            "step/start" => {
                self.step = Some(OpenStep {
                    turn: field(&event.data, "turn"),
                    step: field(&event.data, "step"),
                });
            }
            "step/end" => {
                self.reset_calls();
                self.step = None;
            }
            "assistant/message" => {
                for id in requested_call_ids(&event.data) {
                    if !self.pending.iter().any(|p| p.call_id == id) {
                        let call_seq = self.logged_call(&id);
                        self.pending.push(PendingCall {
                            call_id: id,
                            call_seq,
                        });
                    }
                }
            }
            "tool/call" => {
                let Some(id) = Valid::of(&event.data).get("callId").and_then(Valid::as_str) else {
                    return;
                };
                if self.logged_call(&id).is_none() {
                    self.logged_calls.push((id.to_string(), event.seq));
                }
                if let Some(p) = self.pending.iter_mut().find(|p| p.call_id == id) {
                    p.call_seq.get_or_insert(event.seq);
                }
            }
            "tool/result" => {
                if let Some(id) = result_call_id(&event.data) {
                    self.pending.retain(|p| p.call_id != id);
                }
            }
            _ => {}
        }
    }

    /// The tracker as plain data (see [`RepairParts`]).
    pub(crate) fn parts(&self) -> RepairParts {
        let t = self.clone();
        RepairParts {
            turn: t.turn,
            step: t.step,
            pending: t.pending,
            logged_calls: t.logged_calls,
            next_seq: t.next_seq,
            last_time: t.last_time,
        }
    }

    /// A tracker from plain data, if the closers it yields are JSON: the
    /// `turn` and `step` texts are written into closer payloads as they are,
    /// so each must be one JSON value.
    pub(crate) fn from_parts(parts: RepairParts) -> Result<RepairTracker, String> {
        let texts = [
            parts.turn.as_ref().and_then(|t| t.turn.as_deref()),
            parts.step.as_ref().and_then(|s| s.turn.as_deref()),
            parts.step.as_ref().and_then(|s| s.step.as_deref()),
        ];
        for text in texts.into_iter().flatten() {
            if serde_json::from_str::<&RawValue>(text).is_err() {
                return Err(format!("an open turn or step number {text:?} is not JSON"));
            }
        }
        Ok(RepairTracker {
            turn: parts.turn,
            step: parts.step,
            pending: parts.pending,
            logged_calls: parts.logged_calls,
            next_seq: parts.next_seq,
            last_time: parts.last_time,
        })
    }

    fn reset_calls(&mut self) {
        self.pending.clear();
        self.logged_calls.clear();
    }

    fn logged_call(&self, id: &str) -> Option<u64> {
        self.logged_calls
            .iter()
            .find(|(c, _)| c == id)
            .map(|(_, s)| *s)
    }

    /// Whether the log ends inside a turn or step (closers are needed).
    pub fn is_open(&self) -> bool {
        self.turn.is_some() || self.step.is_some()
    }

    /// The seq the next event gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The closers that balance the log, in order; empty when balanced.
    /// They continue the seq numbering and reuse the last event's time.
    pub fn closers(&self) -> Vec<OwnedEvent> {
        if !self.is_open() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut seq = self.next_seq;
        let (turn, step) = match (&self.step, &self.turn) {
            (Some(s), _) => (s.turn.clone(), s.step.clone()),
            (None, Some(t)) => (t.turn.clone(), None),
            (None, None) => (None, None),
        };
        for call in &self.pending {
            let mut data = Vec::with_capacity(768);
            data.push(b'{');
            write_turn_step(&mut data, turn.as_deref(), step.as_deref());
            let mut id = Vec::new();
            json::write_str(
                &mut id,
                &format!("interrupted-tool-result-{}-{seq}", call.call_id),
            );
            let mut call_id = Vec::new();
            json::write_str(&mut call_id, &call.call_id);
            let (text, error) = match call.call_seq {
                Some(_) => (
                    OUTCOME_UNKNOWN_TEXT,
                    r#"{"name":"ToolOutcomeUnknownError","code":"TOOL_OUTCOME_UNKNOWN"}"#,
                ),
                None => (
                    NOT_STARTED_TEXT,
                    r#"{"name":"ToolNotStartedError","code":"TOOL_NOT_STARTED"}"#,
                ),
            };
            let mut text_json = Vec::new();
            json::write_str(&mut text_json, text);
            let (id, call_id, text_json) = (utf8(&id), utf8(&call_id), utf8(&text_json));
            let _ = write!(
                data,
                r#""message":{{"id":{id},"role":"user","source":{{"kind":"tool","callId":{call_id}}},"content":[{{"type":"tool-result","toolCallId":{call_id},"isError":true,"content":[{{"type":"text","text":{text_json}}}]}}]}},"error":{error}}}"#
            );
            let mut ev = closer("tool/result", seq, self.last_time, data);
            ev.surface_op = Some(SurfaceOp::Append);
            ev.source_event_seqs = call.call_seq.map(|s| vec![s]);
            out.push(ev);
            seq += 1;
        }
        if self.step.is_some() {
            let mut data = b"{".to_vec();
            write_turn_step(&mut data, turn.as_deref(), step.as_deref());
            trim_comma(&mut data);
            data.push(b'}');
            out.push(closer("step/end", seq, self.last_time, data));
            seq += 1;
        }
        if let Some(t) = &self.turn {
            let mut data = b"{".to_vec();
            write_turn_step(&mut data, t.turn.as_deref(), None);
            data.extend_from_slice(br#""reason":{"kind":"interrupted"}}"#);
            out.push(closer("turn/end", seq, self.last_time, data));
        }
        out
    }
}

fn utf8(b: &[u8]) -> &str {
    std::str::from_utf8(b).expect("JSON output is UTF-8")
}

/// Writes `"turn":T,"step":S,` for the values that are present.
fn write_turn_step(out: &mut Vec<u8>, turn: Option<&str>, step: Option<&str>) {
    for (key, v) in [("turn", turn), ("step", step)] {
        if let Some(v) = v {
            let _ = write!(out, "\"{key}\":{v},");
        }
    }
}

fn trim_comma(out: &mut Vec<u8>) {
    if out.last() == Some(&b',') {
        out.pop();
    }
}

fn closer(kind: &str, seq: u64, time: i64, data: Vec<u8>) -> OwnedEvent {
    let data = String::from_utf8(data).expect("JSON output is UTF-8");
    Event {
        kind: Cow::Owned(kind.to_owned()),
        seq,
        time,
        // Built from this crate's templates and values copied from checked
        // events.
        data: Data::trusted(Cow::Owned(
            RawValue::from_string(data).expect("closer data is valid JSON"),
        )),
        source_event_seqs: None,
        surface_op: None,
        ignorable: false,
    }
}

/// The raw JSON text of a top-level field of an object payload.
fn field(data: &RawValue, key: &str) -> Option<String> {
    Valid::of(data).get(key).map(|v| v.text().to_owned())
}

/// The tool-call ids an assistant message requests, in content order, from
/// `data.message.content` (nested) or `data.content` (flat).
pub fn requested_call_ids(data: &RawValue) -> Vec<String> {
    if !may_request_calls(data.get().as_bytes()) {
        return Vec::new();
    }
    // `Valid` walks the already-validated text once; `json::object` at each
    // level would re-scan the whole message for every level it descends.
    let data = Valid::of(data);
    let content = match data.get("message").filter(|m| m.text().starts_with('{')) {
        Some(m) => m.get("content"),
        None => data.get("content"),
    };
    let Some(blocks) = content else {
        return Vec::new();
    };
    blocks
        .elements()
        .filter(|b| b.get("type").and_then(Valid::as_str).as_deref() == Some("tool-call"))
        .filter_map(|b| b.get("id")?.as_str().map(Cow::into_owned))
        .collect()
}

/// Whether a message's JSON text can hold a block of type `"tool-call"`.
///
/// Most assistant messages request no tool, and walking one to learn that
/// was half of the repair tracker's time on the append path. A JSON string
/// decodes to `tool-call` only if the text holds it literally or spells a
/// character of it as a `\uXXXX` escape (no short escape such as `\n`
/// stands for a letter or `-`), so a text with neither needs no walk.
fn may_request_calls(text: &[u8]) -> bool {
    memchr::memmem::find(text, b"\"tool-call\"").is_some()
        || memchr::memmem::find(text, b"\\u").is_some()
}

/// The call id a tool/result answers: `data.message.source.callId` (nested)
/// or `data.callId` (flat).
pub fn result_call_id(data: &RawValue) -> Option<String> {
    let data = Valid::of(data);
    let id = match data.get("message").filter(|m| m.text().starts_with('{')) {
        Some(m) => m.get("source")?.get("callId"),
        None => data.get("callId"),
    };
    id.and_then(Valid::as_str).map(Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(lines: &[&str]) -> RepairTracker {
        let mut t = RepairTracker::default();
        for (i, l) in lines.iter().enumerate() {
            let ev = Event::from_json(l).unwrap();
            assert_eq!(ev.seq, i as u64);
            t.observe(&ev);
        }
        t
    }

    #[test]
    fn balanced_log_needs_nothing() {
        let t = track(&[
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"turn/end","seq":1,"time":2,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
        ]);
        assert!(t.closers().is_empty());
    }

    #[test]
    fn pending_calls_in_request_order_with_kinds() {
        let t = track(&[
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":2}}"#,
            r#"{"type":"step/start","seq":1,"time":1,"data":{"turn":2,"step":3}}"#,
            r#"{"type":"assistant/message","seq":2,"time":1,"data":{"turn":2,"step":3,"content":[{"type":"tool-call","id":"b"},{"type":"text"},{"type":"tool-call","id":"a"},{"type":"tool-call","id":"b"},{"type":"tool-call","id":"c"}]},"surfaceOp":"append"}"#,
            r#"{"type":"tool/call","seq":3,"time":1,"data":{"callId":"a"}}"#,
            r#"{"type":"tool/result","seq":4,"time":7,"data":{"turn":2,"step":3,"callId":"c","content":[],"isError":false},"surfaceOp":"append"}"#,
        ]);
        let c = t.closers();
        let kinds: Vec<&str> = c.iter().map(|e| &*e.kind).collect();
        assert_eq!(
            kinds,
            ["tool/result", "tool/result", "step/end", "turn/end"]
        );
        assert!(c.iter().all(|e| e.time == 7));
        assert_eq!(c.iter().map(|e| e.seq).collect::<Vec<_>>(), [5, 6, 7, 8]);
        assert_eq!(result_call_id(&c[0].data).as_deref(), Some("b"));
        assert!(c[0].data.get().contains("TOOL_NOT_STARTED"));
        assert!(c[0].data.get().contains("interrupted-tool-result-b-5"));
        assert_eq!(c[0].source_event_seqs, None);
        assert_eq!(result_call_id(&c[1].data).as_deref(), Some("a"));
        assert!(c[1].data.get().contains("TOOL_OUTCOME_UNKNOWN"));
        assert_eq!(c[1].source_event_seqs, Some(vec![3]));
        assert_eq!(c[2].data.get(), r#"{"turn":2,"step":3}"#);
        assert_eq!(
            c[3].data.get(),
            r#"{"turn":2,"reason":{"kind":"interrupted"}}"#
        );
    }

    #[test]
    fn boundaries_reset_pending_and_missing_numbers_are_omitted() {
        let t = track(&[
            r#"{"type":"turn/start","seq":0,"time":1,"data":{}}"#,
            r#"{"type":"step/start","seq":1,"time":1,"data":{}}"#,
            r#"{"type":"assistant/message","seq":2,"time":1,"data":{"message":{"content":[{"type":"tool-call","id":"x"}]}},"surfaceOp":"append"}"#,
            r#"{"type":"step/end","seq":3,"time":1,"data":{}}"#,
            r#"{"type":"step/start","seq":4,"time":1,"data":{"step":2}}"#,
        ]);
        let c = t.closers();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].data.get(), r#"{"step":2}"#);
        assert_eq!(c[1].data.get(), r#"{"reason":{"kind":"interrupted"}}"#);
    }

    #[test]
    fn closers_rebalance_the_log() {
        let mut t = track(&[
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"step/start","seq":1,"time":1,"data":{"turn":1,"step":1}}"#,
            r#"{"type":"assistant/message","seq":2,"time":1,"data":{"message":{"content":[{"type":"tool-call","id":"x"}]}},"surfaceOp":"append"}"#,
        ]);
        for c in t.closers() {
            t.observe(&c);
        }
        assert!(t.closers().is_empty());
    }

    /// The prefilter that skips messages without tool calls must not skip a
    /// type spelled with escapes, nor one split across levels.
    #[test]
    fn call_ids_are_found_however_the_type_is_spelled() {
        let ids = |data: &str| {
            let raw: Box<RawValue> = serde_json::from_str(data).unwrap();
            requested_call_ids(&raw)
        };
        assert_eq!(
            ids(r#"{"content":[{"type":"text","text":"no tools here"}]}"#),
            Vec::<String>::new()
        );
        assert_eq!(ids(r#"{"content":[{"type":"tool-call","id":"a"}]}"#), ["a"]);
        assert_eq!(
            ids(r#"{"message":{"content":[{"type":"t\u006fol-call","id":"b"}]}}"#),
            ["b"]
        );
        assert_eq!(
            ids(
                r#"{"content":[{"type":"tool\u002dcall","id":"c"},{"type":"tool-call","id":"d"}]}"#
            ),
            ["c", "d"]
        );
        // Text that mentions a tool call is not one.
        assert_eq!(
            ids(r#"{"content":[{"type":"text","text":"\"tool-call\""}]}"#),
            Vec::<String>::new()
        );
    }
}
