//! Property tests of the pure session model: the fold, the surface, derive
//! and crash repair.
//!
//! Session logs are generated from a list of random *actions* interpreted by
//! a [`Model`] that tracks the turn/step structure, the tool calls, and a
//! naive reference surface ([`RefSurface`], a plain `Vec<u64>` searched
//! linearly), so that (almost) every generated event is valid and shrinking
//! works on the action list. [`Model::invalid`] produces one event that
//! breaks a named rule at the current end of the log.
//!
//! The reference implementations here (surface, message projection, crash
//! closers) are written from the domain page (sections 4 and 7), not from
//! `src/`, so they check the engine rather than restate it.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use sessionlog::checkpoint::{self, CheckpointBody, Coverage, DataLoc};
use sessionlog::derive::{self, DeriveCache, Message};
use sessionlog::event::{Event, OwnedEvent, SurfaceOp};
use sessionlog::repair::{NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT};
use sessionlog::session::SessionState;
use sessionlog::surface::Surface;
use sessionlog::violation::Rule;
use std::collections::HashMap;

/// One random choice of the log generator: `(what, x, y, z)`.
type Action = (u8, u32, u32, u32);
type Log = Vec<OwnedEvent>;

const SURFACE_KINDS: [&str; 3] = ["user/message", "assistant/message", "tool/result"];
const TEXTS: [&str; 6] = [
    "Hello",
    " wörld",
    "\"quoted\" \\ back",
    "line\nbreak",
    "🙂 emoji",
    "",
];

// ---------------------------------------------------------------------------
// Event construction
// ---------------------------------------------------------------------------

fn render(v: &Value, pretty: bool) -> String {
    if pretty {
        serde_json::to_string_pretty(v).expect("value serialises")
    } else {
        v.to_string()
    }
}

fn mk(
    kind: &str,
    seq: u64,
    time: i64,
    data: &str,
    op: Option<SurfaceOp>,
    src: Option<Vec<u64>>,
) -> OwnedEvent {
    let mut e = OwnedEvent::new(kind, seq, time, data).expect("generated data is JSON");
    e.surface_op = op;
    e.source_event_seqs = src;
    e
}

fn data_value(e: &Event<'_>) -> Value {
    serde_json::from_str(e.data.get()).expect("stored data is JSON")
}

fn replace_op(shadowed: &[u64]) -> SurfaceOp {
    SurfaceOp::Replace {
        start: shadowed[0],
        end: *shadowed.last().expect("non-empty range"),
    }
}

fn tool_call_block(id: &str) -> Value {
    json!({"type": "tool-call", "id": id, "name": "read_file", "arguments": "{\"path\":\"a.txt\"}"})
}

fn user_data(seq: u64, nested: bool, text: &str) -> Value {
    if nested {
        json!({"role": "user", "id": format!("u{seq}"), "content": [{"type": "text", "text": text}], "source": {"kind": "user"}})
    } else {
        json!({"content": [{"type": "text", "text": text}], "source": {"kind": "user"}})
    }
}

/// The parameters of a generated tool/result payload, so that a pruning
/// rewrite can rebuild it with only the inner tool output changed.
#[derive(Debug, Clone)]
struct ToolResultSpec {
    nested: bool,
    turn: u64,
    step: u64,
    call_id: String,
    is_error: bool,
    output: Value,
    duration: u32,
}

impl ToolResultSpec {
    fn data(&self) -> Value {
        if self.nested {
            json!({
                "turn": self.turn,
                "step": self.step,
                "message": {
                    "id": format!("tr-{}", self.call_id),
                    "role": "user",
                    "source": {"kind": "tool", "callId": self.call_id},
                    "content": [{
                        "type": "tool-result",
                        "toolCallId": self.call_id,
                        "content": self.output,
                        "isError": self.is_error,
                    }],
                },
                "meta": {"durationMs": self.duration},
            })
        } else {
            json!({
                "turn": self.turn,
                "step": self.step,
                "callId": self.call_id,
                "content": self.output,
                "isError": self.is_error,
            })
        }
    }
}

// ---------------------------------------------------------------------------
// Reference surface: a Vec<u64> with linear search (domain page section 4)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum RefPlan {
    Skip,
    Append,
    Replace(Vec<u64>),
}

#[derive(Debug, Clone, Default)]
struct RefSurface {
    nodes: Vec<u64>,
    /// The type of every event that ever entered the surface.
    kinds: HashMap<u64, String>,
    /// `(seq, shadowed)` per applied replace, oldest first.
    replacements: Vec<(u64, Vec<u64>)>,
    generation: u64,
    last: Option<u64>,
}

fn nested(v: &Value) -> bool {
    v.get("message").is_some_and(Value::is_object)
}

impl RefSurface {
    fn pos(&self, seq: u64) -> Option<usize> {
        self.nodes.iter().position(|&s| s == seq)
    }

    /// The checks of section 4 in the order of section 10: range,
    /// provenance, sources cover, tool/result rewrite. `log` holds the
    /// events before `e`.
    fn check(&self, e: &Event<'_>, log: &[OwnedEvent]) -> Result<RefPlan, Rule> {
        if !SURFACE_KINDS.contains(&&*e.kind) {
            return Ok(RefPlan::Skip);
        }
        let plan = match e.surface_op {
            None => return Ok(RefPlan::Skip),
            Some(SurfaceOp::Append) => RefPlan::Append,
            Some(SurfaceOp::Replace { start, end }) => {
                let p = self.pos(start).ok_or(Rule::ReplaceRange)?;
                let q = self.pos(end).ok_or(Rule::ReplaceRange)?;
                if p > q {
                    return Err(Rule::ReplaceRange);
                }
                RefPlan::Replace(self.nodes[p..=q].to_vec())
            }
            Some(other) => unimplemented!("the reference model has no surface op {other:?}"),
        };
        if let Some(src) = &e.source_event_seqs {
            if src.is_empty() && e.kind != "assistant/message" {
                return Err(Rule::Provenance);
            }
            if src.iter().any(|&s| s >= e.seq) {
                return Err(Rule::Provenance);
            }
            for i in 0..src.len() {
                if src[..i].contains(&src[i]) {
                    return Err(Rule::Provenance);
                }
            }
        }
        if let RefPlan::Replace(shadowed) = &plan {
            let src = e.source_event_seqs.as_deref().unwrap_or(&[]);
            if !shadowed.iter().all(|s| src.contains(s)) {
                return Err(Rule::ReplaceSources);
            }
            if e.kind == "tool/result" {
                if shadowed.len() != 1 || self.kinds[&shadowed[0]] != "tool/result" {
                    return Err(Rule::ToolResultRewrite);
                }
                let mut old = data_value(&log[shadowed[0] as usize]);
                let mut new = data_value(e);
                if nested(&old) != nested(&new) {
                    return Err(Rule::ToolResultRewrite);
                }
                let path = if nested(&old) {
                    "/message/content/0/content"
                } else {
                    "/content"
                };
                for v in [&mut old, &mut new] {
                    if let Some(slot) = v.pointer_mut(path) {
                        *slot = Value::Null;
                    }
                }
                if old != new {
                    return Err(Rule::ToolResultRewrite);
                }
            }
        }
        Ok(plan)
    }

    fn apply(&mut self, e: &Event<'_>, plan: RefPlan) {
        self.last = Some(e.seq);
        match plan {
            RefPlan::Skip => {}
            RefPlan::Append => {
                self.nodes.push(e.seq);
                self.kinds.insert(e.seq, e.kind.to_string());
            }
            RefPlan::Replace(shadowed) => {
                let p = self.pos(shadowed[0]).expect("checked");
                self.nodes.splice(p..p + shadowed.len(), [e.seq]);
                self.kinds.insert(e.seq, e.kind.to_string());
                self.generation += 1;
                self.replacements.push((e.seq, shadowed));
            }
        }
    }

    fn fold(&mut self, e: &Event<'_>, log: &[OwnedEvent]) -> Result<(), Rule> {
        let plan = self.check(e, log)?;
        self.apply(e, plan);
        Ok(())
    }

    /// The `sessionlog surface` JSON, built independently.
    fn to_json(&self) -> String {
        let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let reps: Vec<String> = self
            .replacements
            .iter()
            .map(|(seq, sh)| {
                format!(
                    "{{\"seq\":{seq},\"start\":{},\"end\":{},\"shadowedSeqs\":[{}]}}",
                    sh[0],
                    sh[sh.len() - 1],
                    join(sh)
                )
            })
            .collect();
        format!(
            "{{\"nodes\":[{}],\"replacements\":[{}],\"replaceGeneration\":{}}}",
            join(&self.nodes),
            reps.join(","),
            self.generation
        )
    }

    /// The message history of section 4 ("Deriving messages"), as values.
    fn messages(&self, log: &[OwnedEvent]) -> Vec<Value> {
        self.nodes
            .iter()
            .filter_map(|&s| ref_message(&self.kinds[&s], &data_value(&log[s as usize])))
            .collect()
    }
}

fn ref_message(kind: &str, data: &Value) -> Option<Value> {
    let empty = json!([]);
    match kind {
        "user/message" => Some(data.clone()),
        "assistant/message" if nested(data) => {
            let m = &data["message"];
            (m.get("content") != Some(&empty)).then(|| m.clone())
        }
        "assistant/message" => {
            let content = data.get("content").filter(|c| **c != empty)?;
            let mut m = json!({"role": "assistant", "content": content});
            if let Some(p) = data.get("provenance") {
                m["provenance"] = p.clone();
            }
            Some(m)
        }
        "tool/result" if nested(data) => Some(data["message"].clone()),
        "tool/result" => Some(json!({"role": "user", "content": [{
            "type": "tool-result",
            "toolCallId": data["callId"],
            "content": data["content"],
            "isError": data["isError"],
        }]})),
        _ => unreachable!("not a surface type: {kind}"),
    }
}

// ---------------------------------------------------------------------------
// The log generator
// ---------------------------------------------------------------------------

/// Tracks what a log generated so far looks like: the open turn and step,
/// the tool calls, the reference surface, and the reference repair state.
#[derive(Debug, Clone, Default)]
struct Model {
    log: Log,
    time: i64,
    last_turn: u64,
    turn: Option<u64>,
    last_step: u64,
    step: Option<u64>,
    /// Chunk seqs of the assistant message being streamed.
    chunks: Vec<u64>,
    /// Call ids requested (or logged) in the open step.
    requested: Vec<String>,
    next_id: u64,
    /// Reference repair state (section 7): pending calls in request order,
    /// with the seq of their logged `tool/call`.
    pending: Vec<(String, Option<u64>)>,
    /// `tool/call` events since the last reset, first per call id wins.
    logged: Vec<(String, u64)>,
    surface: RefSurface,
    results: HashMap<u64, ToolResultSpec>,
}

impl Model {
    fn from_actions(actions: &[Action]) -> Model {
        let mut m = Model::default();
        for a in actions {
            m.act(*a);
        }
        m
    }

    fn next_seq(&self) -> u64 {
        self.log.len() as u64
    }

    /// Emits exactly one (valid) event.
    fn act(&mut self, a: Action) {
        self.time += i64::from(a.3 % 1000);
        let seq = self.next_seq();
        let e = match a.0 % 100 {
            0..30 => self.chunk(seq, a),
            30..42 => self.structure(seq, a),
            42..52 => self.assistant(seq, a),
            52..58 => self.tool_call(seq, a),
            58..66 => self.tool_result(seq, a),
            66..76 => self.user(seq, a),
            76..84 => self.replace_user(seq, a),
            84..90 => self.prune(seq, a),
            _ => self.other(seq, a),
        };
        self.push(e);
    }

    fn push(&mut self, e: OwnedEvent) {
        if let Err(rule) = self.surface.fold(&e, &self.log) {
            panic!(
                "generator bug: reference rejects {} with {rule}",
                e.to_json()
            );
        }
        self.observe_repair(&e);
        self.log.push(e);
    }

    /// Section 7: pending calls come from assistant/message tool-call blocks
    /// (both dialects), leave on a tool/result for their id, and reset at
    /// turn/start, turn/end and step/end.
    fn observe_repair(&mut self, e: &Event<'_>) {
        let d = data_value(e);
        match &*e.kind {
            "turn/start" | "turn/end" | "step/end" => {
                self.pending.clear();
                self.logged.clear();
            }
            "assistant/message" => {
                let content = if nested(&d) {
                    &d["message"]["content"]
                } else {
                    &d["content"]
                };
                for block in content.as_array().into_iter().flatten() {
                    if block["type"] == "tool-call" {
                        let id = block["id"].as_str().expect("generated id").to_string();
                        if !self.pending.iter().any(|p| p.0 == id) {
                            let call = self.logged.iter().find(|l| l.0 == id).map(|l| l.1);
                            self.pending.push((id, call));
                        }
                    }
                }
            }
            "tool/call" => {
                let id = d["callId"].as_str().expect("generated id").to_string();
                if !self.logged.iter().any(|l| l.0 == id) {
                    self.logged.push((id.clone(), e.seq));
                }
                for p in self.pending.iter_mut().filter(|p| p.0 == id) {
                    p.1.get_or_insert(e.seq);
                }
            }
            "tool/result" => {
                let id = if nested(&d) {
                    &d["message"]["source"]["callId"]
                } else {
                    &d["callId"]
                };
                self.pending.retain(|p| Some(p.0.as_str()) != id.as_str());
            }
            _ => {}
        }
    }

    fn fresh_id(&mut self) -> String {
        let n = self.next_id;
        self.next_id += 1;
        if n % 5 == 3 {
            format!("call \"{n}\" \\ é")
        } else {
            format!("call_{n}")
        }
    }

    fn open_step(&self) -> Option<(u64, u64)> {
        Some((self.turn?, self.step?))
    }

    fn structure(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let t = self.time;
        let data = match (self.turn, self.step) {
            (None, _) => {
                let turn = self.last_turn + 1;
                self.last_turn = turn;
                self.turn = Some(turn);
                self.last_step = 0;
                let data = if a.1.is_multiple_of(2) {
                    json!({"turn": turn})
                } else {
                    json!({"turn": turn, "trigger": "user"})
                };
                return mk("turn/start", seq, t, &data.to_string(), None, None);
            }
            (Some(turn), None) if a.1.is_multiple_of(3) => {
                self.turn = None;
                let kinds = ["completed", "aborted", "blocked", "error", "max-tokens"];
                let kind = kinds[(a.2 % 5) as usize];
                return mk(
                    "turn/end",
                    seq,
                    t,
                    &json!({"turn": turn, "reason": {"kind": kind}}).to_string(),
                    None,
                    None,
                );
            }
            (Some(turn), None) => {
                let step = self.last_step + 1;
                self.last_step = step;
                self.step = Some(step);
                self.chunks.clear();
                self.requested.clear();
                return mk(
                    "step/start",
                    seq,
                    t,
                    &json!({"turn": turn, "step": step}).to_string(),
                    None,
                    None,
                );
            }
            (Some(turn), Some(step)) => {
                self.step = None;
                json!({"turn": turn, "step": step})
            }
        };
        mk("step/end", seq, t, &data.to_string(), None, None)
    }

    fn chunk(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let Some((turn, step)) = self.open_step() else {
            return self.structure(seq, a);
        };
        self.chunks.push(seq);
        let text = TEXTS[a.1 as usize % TEXTS.len()];
        let data = json!({"turn": turn, "step": step, "chunk": {"type": "text-delta", "index": 0, "text": text}});
        mk(
            "assistant/chunk",
            seq,
            self.time,
            &data.to_string(),
            None,
            None,
        )
    }

    fn assistant(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let Some((turn, step)) = self.open_step() else {
            return self.structure(seq, a);
        };
        let mut content = Vec::new();
        if a.1 & 1 == 1 {
            content.push(json!({"type": "text", "text": TEXTS[a.3 as usize % TEXTS.len()]}));
        }
        if a.1 & 2 == 2 {
            content.push(json!({"type": "reasoning", "text": "thinking"}));
        }
        for _ in 0..(a.1 >> 2) % 3 {
            let id = self.fresh_id();
            content.push(tool_call_block(&id));
            self.requested.push(id);
        }
        if (a.1 >> 4).is_multiple_of(4) {
            // Request again an id that is pending or already logged.
            let known: Vec<String> = (self.pending.iter().map(|p| p.0.clone()))
                .chain(self.logged.iter().map(|l| l.0.clone()))
                .collect();
            if !known.is_empty() {
                let id = known[(a.1 >> 8) as usize % known.len()].clone();
                content.push(tool_call_block(&id));
                if !self.requested.contains(&id) {
                    self.requested.push(id);
                }
            }
        }
        let mut data = if a.2 & 1 == 1 {
            json!({"turn": turn, "step": step, "message": {
                "id": format!("m{seq}"), "role": "assistant", "content": content,
                "source": {"kind": "model", "provider": "p", "model": "m"},
            }})
        } else {
            let mut d = json!({"turn": turn, "step": step, "content": content});
            if a.2 & 4 == 4 {
                d["provenance"] = json!({"provider": "p", "model": "m"});
            }
            d
        };
        if a.2 & 8 == 8 {
            data["usage"] = json!({"inputTokens": a.3 % 100, "outputTokens": 7});
        }
        let src = match (a.2 >> 4) % 3 {
            0 => Some(vec![]),
            1 => None,
            _ => (!self.chunks.is_empty()).then(|| self.chunks.clone()),
        };
        self.chunks.clear();
        mk(
            "assistant/message",
            seq,
            self.time,
            &render(&data, a.2 & 2 == 2),
            Some(SurfaceOp::Append),
            src,
        )
    }

    fn tool_call(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let Some((turn, step)) = self.open_step() else {
            return self.structure(seq, a);
        };
        let unlogged: Vec<&String> = (self.requested.iter())
            .filter(|id| !self.logged.iter().any(|l| &l.0 == *id))
            .collect();
        let id = if unlogged.is_empty() || a.1.is_multiple_of(6) {
            // Logged before any assistant message requested it.
            let id = self.fresh_id();
            self.requested.push(id.clone());
            id
        } else {
            unlogged[a.2 as usize % unlogged.len()].clone()
        };
        let data = json!({"turn": turn, "step": step, "callId": id, "name": "read_file", "arguments": "{}"});
        mk("tool/call", seq, self.time, &data.to_string(), None, None)
    }

    fn tool_result(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let Some((turn, step)) = self.open_step() else {
            return self.structure(seq, a);
        };
        let call_id = if a.1.is_multiple_of(13) {
            format!("ghost-{seq}")
        } else if !self.pending.is_empty() {
            self.pending[a.2 as usize % self.pending.len()].0.clone()
        } else if !self.requested.is_empty() {
            self.requested[a.2 as usize % self.requested.len()].clone()
        } else {
            return self.chunk(seq, a);
        };
        let flags = a.3 >> 10;
        let spec = ToolResultSpec {
            nested: flags & 1 == 0,
            turn,
            step,
            call_id: call_id.clone(),
            is_error: flags & 2 == 2,
            output: json!([{"type": "text", "text": format!("output {seq} {}", "x".repeat((a.3 % 40) as usize))}]),
            duration: a.2 % 5000,
        };
        let src = self
            .logged
            .iter()
            .find(|l| l.0 == call_id)
            .map(|l| vec![l.1]);
        let data = render(&spec.data(), flags & 4 == 4);
        self.results.insert(seq, spec);
        mk(
            "tool/result",
            seq,
            self.time,
            &data,
            Some(SurfaceOp::Append),
            src,
        )
    }

    fn user(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let text = TEXTS[a.2 as usize % TEXTS.len()];
        let data = user_data(seq, a.1 & 1 == 0, text);
        // An inbox splice may cite the event it came from.
        let src = (a.1 & 4 == 4 && seq > 0).then(|| vec![u64::from(a.3) % seq]);
        mk(
            "user/message",
            seq,
            self.time,
            &render(&data, a.1 & 2 == 2),
            Some(SurfaceOp::Append),
            src,
        )
    }

    /// A compaction: a user/message replacing `start..=end` of the surface.
    fn replace_user(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let nodes = &self.surface.nodes;
        if nodes.is_empty() {
            return self.user(seq, a);
        }
        let i = a.1 as usize % nodes.len();
        let j = i + a.2 as usize % (nodes.len() - i).min(4);
        let shadowed = nodes[i..=j].to_vec();
        let mut src = shadowed.clone();
        match a.3 % 4 {
            0 => src.sort_unstable(),
            1 => {} // surface order
            2 => src.reverse(),
            _ => {
                // Cite an extra earlier event too (e.g. the compaction/start).
                let extra = u64::from(a.3 / 4) % seq;
                if !src.contains(&extra) {
                    src.insert(0, extra);
                }
            }
        }
        let data = json!({
            "role": "user", "id": format!("c{seq}"),
            "content": [{"type": "text", "text": "<compacted-summary>earlier work</compacted-summary>"}],
            "source": {"kind": "plugin", "plugin": "compact"},
        });
        mk(
            "user/message",
            seq,
            self.time,
            &data.to_string(),
            Some(replace_op(&shadowed)),
            Some(src),
        )
    }

    /// A tool-result prune: replaces one tool/result node with the same
    /// payload but a different inner tool output.
    fn prune(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let trs: Vec<u64> = (self.surface.nodes.iter())
            .copied()
            .filter(|s| self.results.contains_key(s))
            .collect();
        if trs.is_empty() {
            return self.replace_user(seq, a);
        }
        let old = trs[a.1 as usize % trs.len()];
        let mut spec = self.results[&old].clone();
        spec.output = match a.2 % 3 {
            0 => json!([]),
            1 => json!([{"type": "text", "text": "[output pruned]"}]),
            _ => json!([{"type": "text", "text": format!("[pruned at {seq}]")}]),
        };
        let mut src = vec![old];
        if a.2 & 4 == 4 && old > 0 {
            src.push(old - 1);
        }
        let data = render(&spec.data(), a.2 & 8 == 8);
        self.results.insert(seq, spec);
        mk(
            "tool/result",
            seq,
            self.time,
            &data,
            Some(SurfaceOp::Replace {
                start: old,
                end: old,
            }),
            Some(src),
        )
    }

    fn other(&mut self, seq: u64, a: Action) -> OwnedEvent {
        let t = self.time;
        let (kind, data) = match a.1 % 6 {
            0 => (
                "session/title",
                json!({"title": "A title", "messageSeqs": [0], "source": {"kind": "fallback"}}),
            ),
            1 => (
                "todo/write",
                json!({"todos": [{"content": "x", "status": "pending"}]}),
            ),
            2 => (
                "request/header",
                json!({"header": {"config": {"model": "m"}}, "reason": "initial"}),
            ),
            3 => {
                let mut e = mk(
                    "plugin/x-custom",
                    seq,
                    t,
                    &json!({"k": a.2}).to_string(),
                    None,
                    None,
                );
                e.ignorable = true;
                return e;
            }
            4 => ("session/end-seed", json!({})),
            _ => (
                "web/unknown-plugin",
                json!({"n": a.2, "nested": {"a": [1, 2.5, null]}}),
            ),
        };
        mk(kind, seq, t, &render(&data, a.2 & 1 == 1), None, None)
    }

    /// An event that breaks one rule at the end of the log, with that rule.
    fn invalid(&self, m: (u8, u32, u32)) -> (OwnedEvent, Rule) {
        let seq = self.next_seq();
        let t = self.time;
        let nodes = &self.surface.nodes;
        let (x, y) = (m.1 as usize, m.2 as usize);
        let user = user_data(seq, true, "bad").to_string();
        let bad_seq = || {
            let s = if x & 1 == 1 && seq > 0 {
                y as u64 % seq
            } else {
                seq + 1 + y as u64 % 5
            };
            let e = mk("user/message", s, t, &user, Some(SurfaceOp::Append), None);
            (e, Rule::Contiguity)
        };
        // A valid range of the surface, when it is not empty.
        let range = (!nodes.is_empty()).then(|| {
            let i = x % nodes.len();
            let j = i + y % (nodes.len() - i).min(3);
            nodes[i..=j].to_vec()
        });
        let non_surface = [
            "turn/start",
            "assistant/chunk",
            "tool/call",
            "session/title",
            "todo/write",
        ];
        match m.0 % 12 {
            0 => bad_seq(),
            1 => {
                // surfaceOp on a type that is not surface-eligible.
                let op = match &range {
                    Some(sh) if y & 1 == 1 => replace_op(sh),
                    _ => SurfaceOp::Append,
                };
                let src = range.clone().filter(|_| y & 2 == 2);
                let e = mk(non_surface[x % 5], seq, t, "{}", Some(op), src);
                (e, Rule::Eligibility)
            }
            2 => {
                // sourceEventSeqs on a type that is not surface-eligible.
                let src = if seq > 0 {
                    vec![y as u64 % seq]
                } else {
                    vec![]
                };
                let e = mk(non_surface[x % 5], seq, t, "{}", None, Some(src));
                (e, Rule::Eligibility)
            }
            3 => {
                // A surface-eligible event without surfaceOp.
                let src = range.clone().filter(|_| y & 1 == 1);
                (
                    mk(SURFACE_KINDS[x % 3], seq, t, &user, None, src),
                    Rule::Eligibility,
                )
            }
            4 => {
                // A reversed range: end before start on the surface.
                if nodes.len() < 2 {
                    return bad_seq();
                }
                let i = x % (nodes.len() - 1);
                let j = i + 1 + y % (nodes.len() - i - 1);
                let op = SurfaceOp::Replace {
                    start: nodes[j],
                    end: nodes[i],
                };
                let e = mk(
                    "user/message",
                    seq,
                    t,
                    &user,
                    Some(op),
                    Some(nodes[i..=j].to_vec()),
                );
                (e, Rule::ReplaceRange)
            }
            5 => {
                // An endpoint that is not on the surface: shadowed, not a
                // surface event, this event itself, or in the future.
                let off: Vec<u64> = (0..seq)
                    .filter(|s| !nodes.contains(s))
                    .chain([seq, seq + 1 + y as u64 % 3])
                    .collect();
                let o = off[x % off.len()];
                let (start, end) = match (&range, y % 3) {
                    (Some(sh), 0) => (sh[0], o),
                    (Some(sh), 1) => (o, sh[sh.len() - 1]),
                    _ => (o, o),
                };
                let mut src: Vec<u64> = [start, end].into_iter().filter(|&s| s < seq).collect();
                src.dedup();
                let kind = if y & 4 == 4 {
                    "tool/result"
                } else {
                    "user/message"
                };
                let op = SurfaceOp::Replace { start, end };
                let e = mk(
                    kind,
                    seq,
                    t,
                    &user,
                    Some(op),
                    (!src.is_empty()).then_some(src),
                );
                (e, Rule::ReplaceRange)
            }
            6 => {
                // A duplicate source.
                if seq == 0 {
                    return bad_seq();
                }
                let e = match &range {
                    Some(sh) if x & 1 == 1 => {
                        let mut src = sh.clone();
                        src.push(sh[y % sh.len()]);
                        mk(
                            "user/message",
                            seq,
                            t,
                            &user,
                            Some(replace_op(sh)),
                            Some(src),
                        )
                    }
                    _ => {
                        let d = y as u64 % seq;
                        let src = if d > 0 { vec![d, 0, d] } else { vec![d, d] };
                        mk(
                            "user/message",
                            seq,
                            t,
                            &user,
                            Some(SurfaceOp::Append),
                            Some(src),
                        )
                    }
                };
                (e, Rule::Provenance)
            }
            7 => {
                // A source that is not earlier than the event.
                let fwd = seq + y as u64 % 3;
                let e = match &range {
                    Some(sh) if x & 1 == 1 => {
                        let mut src = sh.clone();
                        src.insert(y % (src.len() + 1), fwd);
                        mk(
                            "user/message",
                            seq,
                            t,
                            &user,
                            Some(replace_op(sh)),
                            Some(src),
                        )
                    }
                    _ => mk(
                        "user/message",
                        seq,
                        t,
                        &user,
                        Some(SurfaceOp::Append),
                        Some(vec![fwd]),
                    ),
                };
                (e, Rule::Provenance)
            }
            8 => {
                // Empty sources (only assistant/message may have []).
                let kind = ["user/message", "tool/result"][x % 2];
                let e = mk(kind, seq, t, &user, Some(SurfaceOp::Append), Some(vec![]));
                (e, Rule::Provenance)
            }
            9 => {
                // Sources that do not cover the shadowed range.
                let Some(sh) = &range else {
                    return bad_seq();
                };
                let mut src = sh.clone();
                src.remove(y % src.len());
                if let Some(other) = (0..seq).find(|s| x & 1 == 1 && !sh.contains(s)) {
                    src.push(other);
                }
                let src = (!src.is_empty()).then_some(src);
                let e = mk("user/message", seq, t, &user, Some(replace_op(sh)), src);
                (e, Rule::ReplaceSources)
            }
            variant => {
                // A tool/result rewrite that changes more than the output.
                let trs: Vec<u64> = nodes
                    .iter()
                    .copied()
                    .filter(|s| self.results.contains_key(s))
                    .collect();
                let others: Vec<u64> = nodes
                    .iter()
                    .copied()
                    .filter(|s| !self.results.contains_key(s))
                    .collect();
                let kind = if variant == 10 { 0 } else { 1 + x % 4 };
                let any_spec = ToolResultSpec {
                    nested: true,
                    turn: 1,
                    step: 1,
                    call_id: "c".into(),
                    is_error: false,
                    output: json!([]),
                    duration: 0,
                };
                let (shadowed, spec) = match kind {
                    0..=2 if !trs.is_empty() => {
                        let old = trs[y % trs.len()];
                        let mut spec = self.results[&old].clone();
                        spec.output = json!([{"type": "text", "text": "[pruned]"}]);
                        match kind {
                            0 => spec.is_error = !spec.is_error,
                            1 => spec.nested = !spec.nested,
                            _ => spec.call_id.push_str("-other"),
                        }
                        (vec![old], spec)
                    }
                    3 if !others.is_empty() => (vec![others[y % others.len()]], any_spec),
                    4 if nodes.len() >= 2 => {
                        let i = y % (nodes.len() - 1);
                        (nodes[i..i + 2].to_vec(), any_spec)
                    }
                    _ => return bad_seq(),
                };
                let e = mk(
                    "tool/result",
                    seq,
                    t,
                    &spec.data().to_string(),
                    Some(replace_op(&shadowed)),
                    Some(shadowed.clone()),
                );
                (e, Rule::ToolResultRewrite)
            }
        }
    }

    /// Checks `closers` against section 7, computed from the model.
    fn check_closers(&self, closers: &[OwnedEvent]) -> Result<(), TestCaseError> {
        let next = self.next_seq();
        let mut want: Vec<&str> = Vec::new();
        if self.turn.is_some() || self.step.is_some() {
            want.extend(self.pending.iter().map(|_| "tool/result"));
            if self.step.is_some() {
                want.push("step/end");
            }
            if self.turn.is_some() {
                want.push("turn/end");
            }
        }
        let kinds: Vec<&str> = closers.iter().map(|c| &*c.kind).collect();
        prop_assert_eq!(kinds, want);
        let last_time = self.log.last().map_or(0, |e| e.time);
        for (i, c) in closers.iter().enumerate() {
            prop_assert_eq!(c.seq, next + i as u64, "closers continue the seqs");
            prop_assert_eq!(c.time, last_time, "closers reuse the last time");
            prop_assert!(!c.ignorable);
            // A closer is a valid stored event: it round-trips through JSON.
            let text = c.to_json();
            let parsed = Event::from_json(&text).map_err(|v| TestCaseError::fail(v.to_string()))?;
            prop_assert_eq!(&parsed.into_owned(), c);
        }
        let turn = self.turn.map(|t| json!(t));
        let step = self.step.map(|s| json!(s));
        for ((call_id, call_seq), c) in self.pending.iter().zip(closers) {
            let d = data_value(c);
            prop_assert_eq!(c.surface_op, Some(SurfaceOp::Append));
            prop_assert_eq!(&c.source_event_seqs, &call_seq.map(|s| vec![s]));
            prop_assert_eq!(d.get("turn"), turn.as_ref());
            prop_assert_eq!(d.get("step"), step.as_ref());
            let msg = &d["message"];
            prop_assert_eq!(&msg["role"], "user");
            prop_assert_eq!(&msg["source"], &json!({"kind": "tool", "callId": call_id}));
            prop_assert_eq!(
                &msg["id"],
                &json!(format!("interrupted-tool-result-{call_id}-{}", c.seq))
            );
            let block = &msg["content"][0];
            prop_assert_eq!(&block["type"], "tool-result");
            prop_assert_eq!(&block["toolCallId"], &json!(call_id));
            prop_assert_eq!(&block["isError"], &json!(true));
            let (text, code) = match call_seq {
                Some(_) => (OUTCOME_UNKNOWN_TEXT, "TOOL_OUTCOME_UNKNOWN"),
                None => (NOT_STARTED_TEXT, "TOOL_NOT_STARTED"),
            };
            prop_assert_eq!(&block["content"], &json!([{"type": "text", "text": text}]));
            prop_assert_eq!(&d["error"]["code"], code);
        }
        let n = self.pending.len();
        if let Some(step_end) = closers.get(n).filter(|c| c.kind == "step/end") {
            prop_assert_eq!(data_value(step_end), json!({"turn": turn, "step": step}));
        }
        if let Some(turn_end) = closers.last().filter(|c| c.kind == "turn/end") {
            prop_assert_eq!(
                data_value(turn_end),
                json!({"turn": turn, "reason": {"kind": "interrupted"}})
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Folding helpers
// ---------------------------------------------------------------------------

/// Folds `log` one event at a time with [`SessionState::append`].
fn fold_each(log: &[OwnedEvent]) -> SessionState {
    let mut st = SessionState::new(false);
    let mut base: Log = Vec::with_capacity(log.len());
    for e in log {
        if let Err(v) = st.append(e, &base) {
            panic!("valid event rejected: {v}\n{}", e.to_json());
        }
        base.push(e.clone());
    }
    st
}

/// Cuts `log` into consecutive batches whose sizes cycle through `sizes`.
fn batches<'a>(log: &'a [OwnedEvent], sizes: &[usize]) -> Vec<&'a [OwnedEvent]> {
    let mut out = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at >= log.len() {
            break;
        }
        let end = (at + size).min(log.len());
        out.push(&log[at..end]);
        at = end;
    }
    out
}

/// Clones a state through the checkpoint codec, as a store would.
fn checkpoint(state: &SessionState) -> SessionState {
    let mut seqs: Vec<u64> = state.surface().iter().collect();
    seqs.sort_unstable();
    let nowhere = DataLoc {
        segment: 0,
        offset: 0,
        len: 0,
    };
    let body = CheckpointBody {
        coverage: Coverage {
            segment_first_seq: 0,
            last_record_offset: 0,
            end_offset: 0,
            last_record_crc: 0,
            next_seq: state.next_seq(),
        },
        last_time: 0,
        state: state.clone(),
        derive: DeriveCache::default(),
        batches: Vec::new(),
        node_locs: seqs.into_iter().map(|seq| (seq, nowhere)).collect(),
    };
    checkpoint::decode(&checkpoint::encode(&body))
        .expect("a checkpoint decodes")
        .state
}

fn message_strings(cache: &DeriveCache, log: &Log) -> Vec<String> {
    cache
        .messages(log)
        .map(|m| m.expect("cache covers the log").to_json())
        .collect()
}

fn actions(max: usize) -> impl Strategy<Value = Vec<Action>> {
    prop::collection::vec(any::<Action>(), 0..max)
}

fn batch_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..12, 1..12)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Keep failures in the output only: no regression files next to the test.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Wild surface ops, for the reference comparison
// ---------------------------------------------------------------------------

/// A surface event built with no regard to validity: replace endpoints are
/// picked from the surface, from any earlier seq, or from the future;
/// sources cover, miss, duplicate or run ahead; tool/result rewrites change
/// the output, isError, the dialect or the call id.
fn wild_event(
    op: Action,
    seq: u64,
    r: &RefSurface,
    results: &HashMap<u64, ToolResultSpec>,
) -> OwnedEvent {
    let (a, b, c, d) = op;
    let pick = |x: u32| -> u64 {
        if !x.is_multiple_of(4) && !r.nodes.is_empty() {
            r.nodes[(x / 4) as usize % r.nodes.len()]
        } else {
            u64::from(x / 4) % (seq + 2)
        }
    };
    let spec_for = |seq: u64| ToolResultSpec {
        nested: d & 1 == 0,
        turn: 1,
        step: 1,
        call_id: format!("c{seq}"),
        is_error: d & 2 == 2,
        output: json!([{"type": "text", "text": format!("out {seq}")}]),
        duration: d % 7,
    };
    let assistant = || {
        if d & 1 == 0 {
            json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "a"}]}})
        } else {
            json!({"turn": 1, "step": 1, "content": [], "usage": {}})
        }
    };
    let t = i64::from(c);
    match a % 8 {
        0 => mk("assistant/chunk", seq, t, "{\"chunk\":{}}", None, None),
        1 => mk(
            "user/message",
            seq,
            t,
            &user_data(seq, d & 1 == 0, "u").to_string(),
            Some(SurfaceOp::Append),
            None,
        ),
        2 => mk(
            "assistant/message",
            seq,
            t,
            &assistant().to_string(),
            Some(SurfaceOp::Append),
            (d & 2 == 2).then(Vec::new),
        ),
        3 => mk(
            "tool/result",
            seq,
            t,
            &spec_for(seq).data().to_string(),
            Some(SurfaceOp::Append),
            None,
        ),
        kind => {
            let start = pick(b);
            let end = match c % 3 {
                0 => start,
                1 => (r.pos(start))
                    .and_then(|p| r.nodes.get(p + (c / 3) as usize % 3))
                    .copied()
                    .unwrap_or_else(|| pick(c / 3)),
                _ => pick(c / 3),
            };
            let cover: Vec<u64> = match (r.pos(start), r.pos(end)) {
                (Some(p), Some(q)) if p <= q => r.nodes[p..=q].to_vec(),
                _ if start == end => vec![start],
                _ => vec![start, end],
            };
            let src = match d % 8 {
                0 => {
                    let mut s = cover.clone();
                    s.sort_unstable();
                    Some(s)
                }
                1 => Some(cover.iter().rev().copied().collect()),
                2 => {
                    let mut s = cover.clone();
                    let extra = u64::from(d / 8) % (seq + 1);
                    if !s.contains(&extra) {
                        s.push(extra);
                    }
                    Some(s)
                }
                3 => {
                    let mut s = cover.clone();
                    s.remove((d / 8) as usize % s.len());
                    (!s.is_empty()).then_some(s)
                }
                4 => None,
                5 => Some(vec![]),
                6 => {
                    let mut s = cover.clone();
                    s.push(cover[0]);
                    Some(s)
                }
                _ => {
                    let mut s = cover.clone();
                    s.push(seq);
                    Some(s)
                }
            };
            let (kind, data) = match kind {
                4 | 5 => ("user/message", user_data(seq, true, "summary")),
                6 => {
                    let spec = match results.get(&start) {
                        Some(old) => {
                            let mut spec = old.clone();
                            match (d / 8) % 5 {
                                0 => spec.output = json!([{"type": "text", "text": "[pruned]"}]),
                                1 => spec.is_error = !spec.is_error,
                                2 => spec.nested = !spec.nested,
                                3 => {} // identical
                                _ => spec.call_id.push('x'),
                            }
                            spec
                        }
                        None => spec_for(seq),
                    };
                    ("tool/result", spec.data())
                }
                _ => ("assistant/message", assistant()),
            };
            mk(
                kind,
                seq,
                t,
                &render(&data, b & 1 == 1),
                Some(SurfaceOp::Replace { start, end }),
                src,
            )
        }
    }
}

/// Runs wild ops through [`Surface::fold`] and the reference side by side.
/// Returns the rules of the rejected events (for the coverage test).
fn run_wild(ops: &[Action]) -> Result<Vec<Option<Rule>>, TestCaseError> {
    let mut log: Log = Vec::new();
    let mut s = Surface::new();
    let mut r = RefSurface::default();
    let mut results: HashMap<u64, ToolResultSpec> = HashMap::new();
    let mut outcomes = Vec::new();
    for op in ops {
        let seq = log.len() as u64;
        let e = wild_event(*op, seq, &r, &results);
        let before = s.clone();
        let want = r.check(&e, &log);
        let got = s.fold(&e, &log);
        match (want, got) {
            (Ok(plan), Ok(())) => {
                r.apply(&e, plan);
                if e.kind == "tool/result" {
                    let d = data_value(&e);
                    let is_nested = nested(&d);
                    let (call_id, block) = if is_nested {
                        (
                            &d["message"]["source"]["callId"],
                            &d["message"]["content"][0],
                        )
                    } else {
                        (&d["callId"], &d)
                    };
                    results.insert(
                        seq,
                        ToolResultSpec {
                            nested: is_nested,
                            turn: 1,
                            step: 1,
                            call_id: call_id.as_str().expect("generated").to_string(),
                            is_error: block["isError"] == json!(true),
                            output: block["content"].clone(),
                            duration: d["meta"]["durationMs"].as_u64().unwrap_or(0) as u32,
                        },
                    );
                }
                log.push(e);
                outcomes.push(None);
            }
            (Err(rule), Err(v)) => {
                prop_assert_eq!(v.rule, rule, "{}\nsurface {}", e.to_json(), r.to_json());
                prop_assert_eq!(v.seq(), Some(seq));
                prop_assert_eq!(&s, &before, "a rejected event changed the surface");
                prop_assert_eq!(s.to_json(), before.to_json());
                outcomes.push(Some(rule));
            }
            (want, got) => {
                return Err(TestCaseError::fail(format!(
                    "reference {want:?}, engine {got:?} for {}\nsurface {}",
                    e.to_json(),
                    r.to_json()
                )));
            }
        }
        prop_assert_eq!(s.to_json(), r.to_json());
        prop_assert_eq!(s.seqs(), r.nodes.clone());
        prop_assert_eq!(s.len(), r.nodes.len());
        prop_assert_eq!(s.head(), r.nodes.first().copied());
        prop_assert_eq!(s.tail(), r.nodes.last().copied());
        prop_assert_eq!(s.last_processed_seq(), r.last);
        prop_assert_eq!(s.replace_generation(), r.generation);
        for &n in &r.nodes {
            prop_assert!(s.contains(n));
        }
    }
    Ok(outcomes)
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(128))]

    /// Folding in random batches with `append_batch` (through a
    /// checkpoint at a random batch boundary) equals folding one event at a
    /// time with `append`, and equals folding the whole log as one batch.
    #[test]
    fn batched_fold_equals_event_by_event_fold(
        acts in actions(160),
        sizes in batch_sizes(),
        cut in any::<usize>(),
    ) {
        let m = Model::from_actions(&acts);
        let want = fold_each(&m.log);
        let parts = batches(&m.log, &sizes);
        let cut = cut % parts.len().max(1);
        let mut st = SessionState::new(false);
        let mut base: Log = Vec::new();
        for (i, batch) in parts.iter().enumerate() {
            st.append_batch(batch, &base).map_err(|v| TestCaseError::fail(v.to_string()))?;
            base.extend_from_slice(batch);
            prop_assert_eq!(st.next_seq(), base.len() as u64);
            prop_assert_eq!(st.surface().last_processed_seq(), base.last().map(|e| e.seq));
            if i == cut {
                let restored = checkpoint(&st);
                prop_assert_eq!(&restored, &st);
                st = restored;
            }
        }
        prop_assert_eq!(&st, &want);
        prop_assert_eq!(st.surface().to_json(), want.surface().to_json());
        prop_assert_eq!(st.closers(), want.closers());

        let mut whole = SessionState::new(false);
        whole.append_batch(&m.log, &Log::new()).map_err(|v| TestCaseError::fail(v.to_string()))?;
        prop_assert_eq!(&whole, &want);
        prop_assert_eq!(whole.surface().to_json(), want.surface().to_json());
    }

    /// A `DeriveCache` updated after every batch yields exactly the
    /// messages of `derive::derive` from scratch, which are those of the
    /// reference projection; the cache equals one built in one go.
    #[test]
    fn derive_cache_matches_derive_from_scratch(
        acts in actions(160),
        sizes in batch_sizes(),
    ) {
        let m = Model::from_actions(&acts);
        let mut st = SessionState::new(false);
        let mut base: Log = Vec::new();
        let mut cache = DeriveCache::default();
        let mut reference = RefSurface::default();
        for batch in batches(&m.log, &sizes) {
            st.append_batch(batch, &base).map_err(|v| TestCaseError::fail(v.to_string()))?;
            for e in batch {
                reference.fold(e, &base).map_err(|r| TestCaseError::fail(r.to_string()))?;
                base.push(e.clone());
            }
            cache.update(st.surface(), &base).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let cached = message_strings(&cache, &base);
            let scratch = derive::derive(st.surface(), &base).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let scratch: Vec<String> = scratch.iter().map(Message::to_json).collect();
            prop_assert_eq!(&cached, &scratch);

            let values: Vec<Value> = cached.iter().map(|s| serde_json::from_str(s).expect("message is JSON")).collect();
            prop_assert_eq!(values, reference.messages(&base));

            // Verbatim messages are slices of the stored payload.
            for (seq, msg) in cache.message_seqs().zip(cache.messages(&base)) {
                if let Ok(Message::Verbatim(text)) = msg {
                    prop_assert!(base[seq as usize].data.get().contains(text));
                }
            }
            let mut fresh = DeriveCache::default();
            fresh.update(st.surface(), &base).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&cache, &fresh);
        }
    }

    /// A valid prefix plus one invalid event (alone, or at the end of a
    /// batch of valid events, possibly followed by more): `append` /
    /// `append_batch` fails with the expected rule at the bad event's seq and
    /// the state equals a clone taken before; afterwards it still folds the
    /// valid rest of the log to the from-scratch state. An accepted batch
    /// taken back with `revert` also restores the state before it.
    #[test]
    fn rejected_events_and_batches_change_nothing(
        acts in actions(120),
        at in any::<usize>(),
        from in any::<usize>(),
        mutations in prop::collection::vec((any::<(u8, u32, u32)>(), 0u8..3, 0u64..3), 1..6),
    ) {
        let n = at % (acts.len() + 1);
        let mut m = Model::from_actions(&acts[..n]);
        let bad: Vec<(OwnedEvent, Rule)> = mutations.iter().map(|(mu, _, _)| m.invalid(*mu)).collect();
        for a in &acts[n..] {
            m.act(*a);
        }
        let log = m.log;
        let k = from % (n + 1);
        let fail = |v: sessionlog::violation::Violation| TestCaseError::fail(v.to_string());
        // st_k has folded log[..k], st_n has folded log[..n].
        let mut st_k = SessionState::new(false);
        st_k.append_batch(&log[..k], &Log::new()).map_err(fail)?;
        let base_k: Log = log[..k].to_vec();
        let before_k = st_k.clone();
        let undo = st_k.append_batch_undoable(&log[k..n], &base_k).map_err(fail)?;
        let mut st_n = st_k.clone();
        st_k.revert(undo);
        prop_assert_eq!(&st_k, &before_k, "revert of an accepted batch");
        prop_assert_eq!(st_k.surface().to_json(), before_k.surface().to_json());
        let base_n: Log = log[..n].to_vec();
        let before_n = st_n.clone();

        for ((bad, rule), (_, mode, tail)) in bad.iter().zip(&mutations) {
            let (st, before, result) = match mode {
                0 => (&mut st_n, &before_n, None),
                1 => {
                    let r = st_n.append_batch(std::slice::from_ref(bad), &base_n);
                    (&mut st_n, &before_n, Some(r))
                }
                _ => {
                    let mut batch = log[k..n].to_vec();
                    batch.push(bad.clone());
                    for i in 1..=*tail {
                        batch.push(mk("assistant/chunk", bad.seq + i, bad.time, "{}", None, None));
                    }
                    let r = st_k.append_batch(&batch, &base_k);
                    (&mut st_k, &before_k, Some(r))
                }
            };
            let result = result.unwrap_or_else(|| st.append(bad, &base_n));
            let Err(v) = result else {
                return Err(TestCaseError::fail(format!("accepted invalid event {}", bad.to_json())));
            };
            prop_assert_eq!(v.rule, *rule, "{}: {}", bad.to_json(), v);
            prop_assert_eq!(v.seq(), Some(bad.seq));
            prop_assert_eq!(&*st, before);
            prop_assert_eq!(st.surface().to_json(), before.surface().to_json());
            prop_assert_eq!(st.closers(), before.closers());
        }

        let want = fold_each(&log);
        st_k.append_batch(&log[k..], &base_k).map_err(fail)?;
        prop_assert_eq!(&st_k, &want);
        prop_assert_eq!(st_k.surface().to_json(), want.surface().to_json());
        st_n.append_batch(&log[n..], &base_n).map_err(fail)?;
        prop_assert_eq!(&st_n, &want);
    }

    /// The surface of generated logs equals the naive reference.
    #[test]
    fn surface_of_generated_logs_equals_reference(acts in actions(200)) {
        let m = Model::from_actions(&acts);
        let st = fold_each(&m.log);
        prop_assert_eq!(st.surface().to_json(), m.surface.to_json());
        prop_assert_eq!(st.surface().seqs(), m.surface.nodes.clone());
    }

    /// Wild surface ops: `Surface::fold` accepts and rejects exactly what
    /// the reference does, with the same rule, and agrees on the result.
    #[test]
    fn surface_equals_reference_on_wild_ops(ops in actions(120)) {
        run_wild(&ops)?;
    }

    /// After every event: the closers are deterministic, continue the seqs,
    /// match section 7 (computed from the model), and applying them leaves a
    /// balanced log (no more closers), also when folded from scratch.
    #[test]
    fn closers_balance_the_log(acts in actions(120)) {
        let mut m = Model::default();
        let mut st = SessionState::new(false);
        let mut base = Log::new();
        for a in &acts {
            m.act(*a);
            let e = m.log.last().expect("one event per action");
            st.append(e, &base).map_err(|v| TestCaseError::fail(v.to_string()))?;
            base.push(e.clone());
            let closers = st.closers();
            prop_assert_eq!(&closers, &st.closers());
            m.check_closers(&closers)?;
            let mut repaired = st.clone();
            repaired.append_batch(&closers, &m.log).map_err(|v| TestCaseError::fail(v.to_string()))?;
            prop_assert!(repaired.closers().is_empty(), "closers after repair: {:?}", repaired.closers());
            prop_assert_eq!(repaired.next_seq(), (m.log.len() + closers.len()) as u64);
        }
        // Reopening the repaired log from scratch adds nothing.
        let mut full = m.log.clone();
        full.extend(st.closers());
        prop_assert!(fold_each(&full).closers().is_empty());
    }
}

/// The generators are not vacuous: across many cases they produce every
/// kind of event and replace, and the mutations and wild ops hit every
/// surface rule (and acceptance).
#[test]
fn generators_cover_every_rule() {
    let mut runner = TestRunner::deterministic();
    let mut kinds: HashMap<String, usize> = HashMap::new();
    let mut rules: HashMap<Rule, usize> = HashMap::new();
    let mut wild: HashMap<Option<Rule>, usize> = HashMap::new();
    let (mut replaces, mut prunes, mut closer_results, mut nested_results, mut flat_results) =
        (0, 0, 0, 0, 0);
    for _ in 0..200 {
        let acts = actions(160).new_tree(&mut runner).expect("tree").current();
        let m = Model::from_actions(&acts);
        for e in &m.log {
            *kinds.entry(e.kind.to_string()).or_default() += 1;
            if let Some(SurfaceOp::Replace { .. }) = e.surface_op {
                if e.kind == "tool/result" {
                    prunes += 1;
                } else {
                    replaces += 1;
                }
            }
            if e.kind == "tool/result" {
                if nested(&data_value(e)) {
                    nested_results += 1;
                } else {
                    flat_results += 1;
                }
            }
        }
        closer_results += m.pending.len();
        let mutation = any::<(u8, u32, u32)>()
            .new_tree(&mut runner)
            .expect("tree")
            .current();
        *rules.entry(m.invalid(mutation).1).or_default() += 1;
        for o in run_wild(&acts).expect("wild ops agree") {
            *wild.entry(o).or_default() += 1;
        }
    }
    eprintln!(
        "kinds {kinds:?}\nrules {rules:?}\nwild {wild:?}\nreplaces {replaces} prunes {prunes} closer_results {closer_results} nested {nested_results} flat {flat_results}"
    );
    for k in [
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "assistant/chunk",
        "assistant/message",
        "tool/call",
        "tool/result",
        "user/message",
    ] {
        assert!(kinds.get(k).copied().unwrap_or(0) > 0, "no {k} generated");
    }
    assert!(
        replaces > 0 && prunes > 0 && closer_results > 0,
        "{replaces} {prunes} {closer_results}"
    );
    assert!(nested_results > 0 && flat_results > 0);
    for rule in [
        Rule::Contiguity,
        Rule::Eligibility,
        Rule::ReplaceRange,
        Rule::Provenance,
        Rule::ReplaceSources,
        Rule::ToolResultRewrite,
    ] {
        assert!(
            rules.contains_key(&rule),
            "no mutation breaks {rule}: {rules:?}"
        );
    }
    for o in [
        None,
        Some(Rule::ReplaceRange),
        Some(Rule::Provenance),
        Some(Rule::ReplaceSources),
        Some(Rule::ToolResultRewrite),
    ] {
        assert!(wild.contains_key(&o), "no wild op gives {o:?}: {wild:?}");
    }
}

/// Regression: after `SessionState::revert`, a `DeriveCache` updated while
/// the reverted batch was folded was not rebuilt when a later batch reused
/// the reverted seqs (same `replaceGeneration`, last node still on the
/// surface), and sliced the new payload with the old byte ranges. The cache
/// now also keys on the surface's undo epoch.
#[test]
fn derive_cache_after_revert_and_seq_reuse() {
    let ev = |s: &str| Event::from_json(s).expect("valid").into_owned();
    let base = vec![ev(
        r#"{"type":"user/message","seq":0,"time":0,"data":{"n":0},"surfaceOp":"append"}"#,
    )];
    let mut st = SessionState::new(false);
    st.append_batch(&base, &Log::new()).expect("valid");
    let mut cache = DeriveCache::default();

    let a = vec![ev(
        r#"{"type":"user/message","seq":1,"time":0,"data":{"text":"first attempt, long payload"},"surfaceOp":"append"}"#,
    )];
    let undo = st.append_batch_undoable(&a, &base).expect("valid");
    let log_a: Log = base.iter().chain(&a).cloned().collect();
    cache.update(st.surface(), &log_a).expect("present");
    st.revert(undo);

    let b = vec![ev(
        r#"{"type":"user/message","seq":1,"time":0,"data":{"t":"B"},"surfaceOp":"append"}"#,
    )];
    st.append_batch(&b, &base).expect("valid");
    let log_b: Log = base.iter().chain(&b).cloned().collect();
    cache.update(st.surface(), &log_b).expect("present");
    let scratch: Vec<String> = (derive::derive(st.surface(), &log_b)
        .expect("present")
        .iter())
    .map(Message::to_json)
    .collect();
    assert_eq!(message_strings(&cache, &log_b), scratch);
}
