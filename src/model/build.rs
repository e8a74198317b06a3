//! Typed builders for the common events of a turn, so a caller does not
//! write JSON strings by hand: the shapes are the harness's (the same the
//! sample generator and the repair closers use), every string is escaped,
//! and a turn built from them folds through every rule of the model.
//!
//! ```
//! use sessionlog::build::{self, ToolCall};
//! let call = ToolCall { id: "c1", name: "bash", arguments: r#"{"command":"ls"}"# };
//! let turn = vec![
//!     build::turn_start(0, 1, 1),
//!     build::user_message(1, 1, "list the files"),
//!     build::step_start(2, 2, 1, 1),
//!     build::text_chunk(3, 2, 1, 1, "Let me look."),
//!     build::assistant_message(4, 3, 1, 1, "Let me look.", &[call], &[3]),
//!     build::tool_call(5, 3, 1, 1, &call),
//!     build::tool_result(6, 4, 1, 1, "c1", 5, "Cargo.toml\nsrc", false),
//!     build::step_end(7, 4, 1, 1),
//!     build::turn_end(8, 4, 1),
//! ];
//! let mut state = sessionlog::session::SessionState::new(false);
//! state.append_batch(&turn, &Vec::new()).unwrap();
//! assert!(state.closers().is_empty());
//! ```

use crate::event::{OwnedEvent, SurfaceOp};
use crate::json::write_str;

/// A tool call an assistant message requests.
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    /// The call id (the tool result names it).
    pub id: &'a str,
    /// The tool's name.
    pub name: &'a str,
    /// The arguments, as JSON text (stored as a JSON string, as the
    /// harness does).
    pub arguments: &'a str,
}

fn event(
    kind: &'static str,
    seq: u64,
    time: i64,
    data: Vec<u8>,
    surface: Option<SurfaceOp>,
    sources: Option<Vec<u64>>,
) -> OwnedEvent {
    let data = String::from_utf8(data).expect("the builders write UTF-8");
    let mut e = OwnedEvent::new(kind, seq, time, &data).expect("the builders write valid JSON");
    e.surface_op = surface;
    e.source_event_seqs = sources;
    e
}

fn text(out: &mut Vec<u8>, s: &str) {
    write_str(out, s);
}

/// `"<id_key>":id,"name":name,"arguments":arguments` of a tool call (the
/// assistant message's part says `id`, the `tool/call` event `callId`).
fn call_fields(out: &mut Vec<u8>, id_key: &str, call: &ToolCall<'_>) {
    text(out, id_key);
    out.push(b':');
    text(out, call.id);
    out.extend_from_slice(br#","name":"#);
    text(out, call.name);
    out.extend_from_slice(br#","arguments":"#);
    text(out, call.arguments);
}

/// `turn/start` of turn `turn`.
pub fn turn_start(seq: u64, time: i64, turn: u64) -> OwnedEvent {
    event(
        "turn/start",
        seq,
        time,
        format!(r#"{{"turn":{turn}}}"#).into_bytes(),
        None,
        None,
    )
}

/// `turn/end` of turn `turn`, completed.
pub fn turn_end(seq: u64, time: i64, turn: u64) -> OwnedEvent {
    event(
        "turn/end",
        seq,
        time,
        format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#).into_bytes(),
        None,
        None,
    )
}

/// `step/start` of step `step` of turn `turn`.
pub fn step_start(seq: u64, time: i64, turn: u64, step: u64) -> OwnedEvent {
    event(
        "step/start",
        seq,
        time,
        format!(r#"{{"turn":{turn},"step":{step}}}"#).into_bytes(),
        None,
        None,
    )
}

/// `step/end` of step `step` of turn `turn`.
pub fn step_end(seq: u64, time: i64, turn: u64, step: u64) -> OwnedEvent {
    event(
        "step/end",
        seq,
        time,
        format!(r#"{{"turn":{turn},"step":{step}}}"#).into_bytes(),
        None,
        None,
    )
}

/// A `user/message` with one text part, appended to the surface.
pub fn user_message(seq: u64, time: i64, message: &str) -> OwnedEvent {
    let mut d = br#"{"role":"user","content":[{"type":"text","text":"#.to_vec();
    text(&mut d, message);
    d.extend_from_slice(br#"}],"source":{"kind":"user"}}"#);
    event("user/message", seq, time, d, Some(SurfaceOp::Append), None)
}

/// An `assistant/chunk` streaming `piece` of text (block 0).
pub fn text_chunk(seq: u64, time: i64, turn: u64, step: u64, piece: &str) -> OwnedEvent {
    let mut d =
        format!(r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"text-delta","index":0,"text":"#)
            .into_bytes();
    text(&mut d, piece);
    d.extend_from_slice(b"}}");
    event("assistant/chunk", seq, time, d, None, None)
}

/// An `assistant/message`: `reply` as a text part (omitted when empty),
/// then the tool calls it requests; appended to the surface, citing the
/// chunks it was streamed as (`chunk_seqs`, none for a message not
/// streamed).
pub fn assistant_message(
    seq: u64,
    time: i64,
    turn: u64,
    step: u64,
    reply: &str,
    calls: &[ToolCall<'_>],
    chunk_seqs: &[u64],
) -> OwnedEvent {
    let mut d =
        format!(r#"{{"turn":{turn},"step":{step},"message":{{"role":"assistant","content":["#)
            .into_bytes();
    let mut first = true;
    if !reply.is_empty() {
        d.extend_from_slice(br#"{"type":"text","text":"#);
        text(&mut d, reply);
        d.push(b'}');
        first = false;
    }
    for c in calls {
        if !first {
            d.push(b',');
        }
        first = false;
        d.extend_from_slice(br#"{"type":"tool-call","#);
        call_fields(&mut d, "id", c);
        d.push(b'}');
    }
    d.extend_from_slice(b"]}}");
    let sources = (!chunk_seqs.is_empty()).then(|| chunk_seqs.to_vec());
    event(
        "assistant/message",
        seq,
        time,
        d,
        Some(SurfaceOp::Append),
        sources,
    )
}

/// The `tool/call` event of `call` (after the assistant message that
/// requests it).
pub fn tool_call(seq: u64, time: i64, turn: u64, step: u64, call: &ToolCall<'_>) -> OwnedEvent {
    let mut d = format!(r#"{{"turn":{turn},"step":{step},"#).into_bytes();
    call_fields(&mut d, "callId", call);
    d.push(b'}');
    event("tool/call", seq, time, d, None, None)
}

/// The `tool/result` of call `call_id` (whose `tool/call` is event
/// `call_seq`): one text part, appended to the surface.
#[allow(clippy::too_many_arguments)] // one per field of the harness event
pub fn tool_result(
    seq: u64,
    time: i64,
    turn: u64,
    step: u64,
    call_id: &str,
    call_seq: u64,
    output: &str,
    is_error: bool,
) -> OwnedEvent {
    let mut d = format!(
        r#"{{"turn":{turn},"step":{step},"message":{{"role":"user","source":{{"kind":"tool","callId":"#
    )
    .into_bytes();
    text(&mut d, call_id);
    d.extend_from_slice(br#"},"content":[{"type":"tool-result","toolCallId":"#);
    text(&mut d, call_id);
    d.extend_from_slice(
        format!(r#","isError":{is_error},"content":[{{"type":"text","text":"#).as_bytes(),
    );
    text(&mut d, output);
    d.extend_from_slice(b"}]}]}}");
    event(
        "tool/result",
        seq,
        time,
        d,
        Some(SurfaceOp::Append),
        Some(vec![call_seq]),
    )
}
