//! Strict mode: the relational invariants the harness checks in development
//! (section 8), the known-type list, and the nested message shape.
//!
//! Many real logs break these (older dialects, request headers before the
//! first turn); strict mode is a diagnostic, never the default.

use crate::event::Event;
use crate::header::ParsedHeader;
use crate::json::{self, Fields};
use crate::repair::result_call_id;
use crate::violation::{Location, Rule, Violation};
use serde_json::value::RawValue;

/// The event vocabulary lives with the envelope ([`crate::event`]); kept
/// here too for the strict-mode checks that name it.
pub use crate::event::KNOWN_TYPES;

/// Strict mode's header rule: `version` and `delegationDepth` must be written.
pub fn check_header(parsed: &ParsedHeader) -> Result<(), Violation> {
    for (present, key) in [
        (parsed.had_version, "version"),
        (parsed.had_delegation_depth, "delegationDepth"),
    ] {
        if !present {
            return Err(Violation::new(
                Location::Line(1),
                Rule::Header,
                format!("strict: the header must have {key:?}"),
            ));
        }
    }
    Ok(())
}

/// The turn/step structure seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invariants {
    last_turn: i64,
    open_turn: Option<i64>,
    last_step: i64,
    open_step: Option<i64>,
    /// Call ids with a `tool/call` in the open step.
    calls: Vec<String>,
}

/// The invariants' state as plain data, for the checkpoint codec (which
/// knows the bytes). Turn and step numbers come from events as JavaScript
/// safe integers, which [`Invariants::from_parts`] checks (the checks add
/// one to them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct InvariantsParts {
    pub(crate) last_turn: i64,
    pub(crate) open_turn: Option<i64>,
    pub(crate) last_step: i64,
    pub(crate) open_step: Option<i64>,
    pub(crate) calls: Vec<String>,
}

impl Invariants {
    /// The state as plain data (see [`InvariantsParts`]).
    pub(crate) fn parts(&self) -> InvariantsParts {
        let i = self.clone();
        InvariantsParts {
            last_turn: i.last_turn,
            open_turn: i.open_turn,
            last_step: i.last_step,
            open_step: i.open_step,
            calls: i.calls,
        }
    }

    /// The state from plain data, if every turn and step number is a
    /// JavaScript safe integer (as every number read from an event is).
    pub(crate) fn from_parts(parts: InvariantsParts) -> Result<Invariants, String> {
        let numbers = [parts.last_turn, parts.last_step]
            .into_iter()
            .chain(parts.open_turn)
            .chain(parts.open_step);
        for n in numbers {
            if n.unsigned_abs() > json::MAX_SAFE_INTEGER {
                return Err(format!("turn or step number {n} is not a safe integer"));
            }
        }
        Ok(Invariants {
            last_turn: parts.last_turn,
            open_turn: parts.open_turn,
            last_step: parts.last_step,
            open_step: parts.open_step,
            calls: parts.calls,
        })
    }

    /// Checks `event` against the structure so far, without changing it.
    pub fn check(&self, event: &Event<'_>) -> Result<(), Violation> {
        let seq = event.seq;
        let bad = |why: String| Err(Violation::at(seq, Rule::Invariant, why));
        let kind = &*event.kind;
        if !event.ignorable && !KNOWN_TYPES.contains(&kind) {
            return bad(format!(
                "unknown event type {kind:?} without \"ignorable\": true"
            ));
        }
        let data = json::object(&event.data);
        let num = |key: &str| {
            data.as_ref()
                .and_then(|f| f.get(key))
                .and_then(json::safe_integer)
        };
        match kind {
            "turn/start" => {
                if let Some(t) = self.open_turn {
                    return bad(format!("turn/start while turn {t} is open"));
                }
                if num("turn") != Some(self.last_turn + 1) {
                    return bad(format!(
                        "turn/start must number turn {}",
                        self.last_turn + 1
                    ));
                }
            }
            "turn/end" => {
                let Some(t) = self.open_turn else {
                    return bad("turn/end with no open turn".into());
                };
                if let Some(s) = self.open_step {
                    return bad(format!("turn/end while step {s} is open"));
                }
                if num("turn") != Some(t) {
                    return bad(format!("turn/end must name the open turn {t}"));
                }
            }
            "step/start" => {
                let Some(t) = self.open_turn else {
                    return bad("step/start outside a turn".into());
                };
                if let Some(s) = self.open_step {
                    return bad(format!("step/start while step {s} is open"));
                }
                if num("turn") != Some(t) || num("step") != Some(self.last_step + 1) {
                    return bad(format!(
                        "step/start must name turn {t}, step {}",
                        self.last_step + 1
                    ));
                }
            }
            "step/end" => self.in_step(&num, seq, kind)?,
            "assistant/chunk" | "assistant/message" | "tool/call" => {
                self.in_step(&num, seq, kind)?;
                if kind != "tool/call" {
                    check_message_shape(kind, &event.data, seq)?;
                }
            }
            "tool/result" => {
                check_message_shape(kind, &event.data, seq)?;
                let synthetic_not_started = data
                    .as_ref()
                    .and_then(|f| f.get("error"))
                    .and_then(json::object)
                    .and_then(|e| {
                        e.get("code")
                            .and_then(json::string)
                            .map(|c| c == "TOOL_NOT_STARTED")
                    })
                    .unwrap_or(false);
                let appended = matches!(event.surface_op, Some(crate::event::SurfaceOp::Append));
                if appended {
                    self.in_step(&num, seq, kind)?;
                    let id = result_call_id(&event.data);
                    if !synthetic_not_started
                        && !id.as_ref().is_some_and(|id| self.calls.contains(id))
                    {
                        return bad(format!(
                            "tool/result for call {:?} has no prior tool/call in the step",
                            id.unwrap_or_default()
                        ));
                    }
                }
            }
            "user/message" => check_message_shape(kind, &event.data, seq)?,
            "todo/write" | "request/header" | "request/context" if self.open_turn.is_none() => {
                return bad(format!("{kind} outside a turn"));
            }
            _ => {}
        }
        Ok(())
    }

    fn in_step(
        &self,
        num: &dyn Fn(&str) -> Option<i64>,
        seq: u64,
        kind: &str,
    ) -> Result<(), Violation> {
        match (self.open_turn, self.open_step) {
            (Some(t), Some(s)) if num("turn") == Some(t) && num("step") == Some(s) => Ok(()),
            (Some(t), Some(s)) => Err(Violation::at(
                seq,
                Rule::Invariant,
                format!("{kind} must name the open turn {t} and step {s}"),
            )),
            _ => Err(Violation::at(
                seq,
                Rule::Invariant,
                format!("{kind} outside an open step"),
            )),
        }
    }

    /// Folds a checked event in.
    pub fn apply(&mut self, event: &Event<'_>) {
        let num = |key: &str| {
            json::object(&event.data)
                .and_then(|f| f.get(key))
                .and_then(json::safe_integer)
        };
        match &*event.kind {
            "turn/start" => {
                self.open_turn = num("turn");
                self.last_turn = self.open_turn.unwrap_or(self.last_turn);
                self.last_step = 0;
                self.calls.clear();
            }
            "turn/end" => self.open_turn = None,
            "step/start" => {
                self.open_step = num("step");
                self.last_step = self.open_step.unwrap_or(self.last_step);
                self.calls.clear();
            }
            "step/end" => {
                self.open_step = None;
                self.calls.clear();
            }
            "tool/call" => {
                if let Some(id) = json::object(&event.data)
                    .and_then(|f| f.get("callId"))
                    .and_then(json::string)
                {
                    self.calls.push(id.into_owned());
                }
            }
            _ => {}
        }
    }
}

/// Strict: message events in the nested shape with the right role and source.
fn check_message_shape(kind: &str, data: &RawValue, seq: u64) -> Result<(), Violation> {
    let bad = |why: &str| {
        Err(Violation::at(
            seq,
            Rule::Invariant,
            format!("strict: {kind} {why}"),
        ))
    };
    let Some(fields) = json::object(data) else {
        return bad("data must be an object");
    };
    let (message, role): (Fields<'_>, &str) = match kind {
        "user/message" => (fields, "user"),
        "assistant/message" | "tool/result" => {
            let Some(m) = fields.get("message").and_then(json::object) else {
                return bad("must use the nested dialect (data.message)");
            };
            (
                m,
                if kind == "tool/result" {
                    "user"
                } else {
                    "assistant"
                },
            )
        }
        _ => return Ok(()),
    };
    if message.get("role").and_then(json::string).as_deref() != Some(role) {
        return bad(&format!("message must have role {role:?}"));
    }
    let Some(source) = message.get("source").and_then(json::object) else {
        return bad("message must have a source object");
    };
    if kind == "tool/result"
        && (source.get("kind").and_then(json::string).as_deref() != Some("tool")
            || source.get("callId").and_then(json::string).is_none())
    {
        return bad("message source must be {kind:\"tool\", callId}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_types_are_sorted_and_unique() {
        // `Event::into_owned` binary-searches this list.
        assert!(KNOWN_TYPES.windows(2).all(|w| w[0] < w[1]));
    }

    fn run(lines: &[&str]) -> Result<(), Violation> {
        let mut inv = Invariants::default();
        for l in lines {
            let e = Event::from_json(l).unwrap();
            inv.check(&e)?;
            inv.apply(&e);
        }
        Ok(())
    }

    const T1: &str = r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1}}"#;
    const S1: &str = r#"{"type":"step/start","seq":1,"time":0,"data":{"turn":1,"step":1}}"#;

    #[test]
    fn turns_and_steps_number_and_never_nest() {
        assert!(run(&[T1, S1]).is_ok());
        assert!(run(&[r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":2}}"#]).is_err());
        assert!(
            run(&[
                T1,
                r#"{"type":"turn/start","seq":1,"time":0,"data":{"turn":2}}"#
            ])
            .is_err()
        );
        assert!(
            run(&[
                T1,
                S1,
                r#"{"type":"step/start","seq":2,"time":0,"data":{"turn":1,"step":2}}"#
            ])
            .is_err()
        );
        assert!(
            run(&[
                T1,
                S1,
                r#"{"type":"turn/end","seq":2,"time":0,"data":{"turn":1}}"#
            ])
            .is_err()
        );
        assert!(
            run(&[
                T1,
                r#"{"type":"step/start","seq":1,"time":0,"data":{"turn":1,"step":2}}"#
            ])
            .is_err()
        );
    }

    #[test]
    fn events_name_open_turn_and_step() {
        let chunk = |t, s| {
            format!(
                r#"{{"type":"assistant/chunk","seq":2,"time":0,"data":{{"turn":{t},"step":{s}}}}}"#
            )
        };
        assert!(run(&[T1, S1, &chunk(1, 1)]).is_ok());
        assert!(run(&[T1, S1, &chunk(1, 2)]).is_err());
        assert!(run(&[T1, &chunk(1, 1)]).is_err());
    }

    #[test]
    fn tool_result_needs_a_call_and_types_must_be_known() {
        let call =
            r#"{"type":"tool/call","seq":2,"time":0,"data":{"turn":1,"step":1,"callId":"c"}}"#;
        let result = |id: &str, err: &str| {
            format!(
                r#"{{"type":"tool/result","seq":3,"time":0,"data":{{"turn":1,"step":1,"message":{{"role":"user","source":{{"kind":"tool","callId":"{id}"}},"content":[]}}{err}}},"surfaceOp":"append"}}"#
            )
        };
        assert!(run(&[T1, S1, call, &result("c", "")]).is_ok());
        assert!(run(&[T1, S1, call, &result("d", "")]).is_err());
        assert!(
            run(&[
                T1,
                S1,
                call,
                &result("d", r#","error":{"code":"TOOL_NOT_STARTED"}"#)
            ])
            .is_ok()
        );
        assert!(run(&[r#"{"type":"x/y","seq":0,"time":0,"data":{}}"#]).is_err());
        assert!(run(&[r#"{"type":"x/y","seq":0,"time":0,"data":{},"ignorable":true}"#]).is_ok());
        assert!(run(&[r#"{"type":"todo/write","seq":0,"time":0,"data":{}}"#]).is_err());
    }

    #[test]
    fn messages_must_be_nested_with_role_and_source() {
        let user = |d: &str| {
            format!(r#"{{"type":"user/message","seq":0,"time":0,"data":{d},"surfaceOp":"append"}}"#)
        };
        assert!(
            run(&[&user(
                r#"{"role":"user","content":[],"source":{"kind":"user"}}"#
            )])
            .is_ok()
        );
        assert!(run(&[&user(r#"{"content":[],"source":{"kind":"user"}}"#)]).is_err());
        assert!(run(&[&user(r#"{"role":"user","content":[]}"#)]).is_err());
    }
}
