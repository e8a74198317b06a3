//! A generator of realistic agent sessions, for the demo, the benchmarks and
//! tests. Deterministic for a given seed.
//!
//! The event mix follows real harness logs: streamed `assistant/chunk`
//! events (~150 B each) are about 60% of a log; every step has a request
//! header, an assistant message citing its chunks, and often tool calls whose
//! results are a few KiB; long sessions get a compaction (a `user/message`
//! replacing a range of the surface) and a tool-output pruning (a
//! `tool/result` rewrite). Every turn is closed unless asked otherwise.
//!
//! ```
//! use sessionlog::sample::{Sample, SampleConfig};
//! let (header, events) = Sample::new(SampleConfig { turns: 3, ..SampleConfig::default() }).session("s1");
//! assert_eq!(header.id, "s1");
//! assert!(events.iter().filter(|e| e.kind == "assistant/chunk").count() * 2 > events.len());
//! ```

use crate::event::{Data, Event, OwnedEvent, SurfaceOp};
use crate::header::SessionHeader;
use std::borrow::Cow;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SampleConfig {
    /// Turns per session.
    pub turns: usize,
    /// Seed of the deterministic generator.
    pub seed: u64,
    /// Add a compaction (range replace) and a tool-output pruning once the
    /// session has enough history.
    pub compaction: bool,
    /// Leave the last turn open in the middle of a tool call (what a crash
    /// leaves behind).
    pub interrupt_last_turn: bool,
    /// Start time (Unix ms).
    pub start_time: i64,
}

impl Default for SampleConfig {
    fn default() -> Self {
        SampleConfig {
            turns: 20,
            seed: 42,
            compaction: true,
            interrupt_last_turn: false,
            start_time: 1_780_000_000_000,
        }
    }
}

/// A deterministic session generator.
pub struct Sample {
    config: SampleConfig,
    rng: u64,
}

const WORDS: [&str; 24] = [
    " the",
    " file",
    " test",
    " I",
    " will",
    " run",
    " check",
    " output",
    " error",
    " fix",
    " build",
    " it",
    " now",
    " then",
    " code",
    " a",
    " function",
    " read",
    " write",
    " result",
    " passes",
    " looks",
    " good",
    " next",
];

impl Sample {
    /// A generator with this configuration.
    pub fn new(config: SampleConfig) -> Self {
        let rng = config.seed ^ 0x9e37_79b9_7f4a_7c15;
        Sample { config, rng }
    }

    /// SplitMix64: small, fast, good enough for test data.
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn words(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| WORDS[self.below(WORDS.len() as u64) as usize])
            .collect()
    }

    /// One session: its header and events.
    pub fn session(&mut self, id: &str) -> (SessionHeader, Vec<OwnedEvent>) {
        let mut header = SessionHeader::new(id, self.config.start_time.max(0) as u64);
        header.cwd = Some("/work/project".into());
        let mut b = Builder {
            events: Vec::new(),
            time: self.config.start_time,
            surface: Vec::new(),
        };
        let turns = self.config.turns.max(1);
        let mut compacted = !self.config.compaction;
        let mut pruned = !self.config.compaction;
        for turn in 1..=turns {
            let last = turn == turns;
            b.push(
                "turn/start",
                format!(r#"{{"turn":{turn},"trigger":{{"kind":"message"}}}}"#),
            );
            if !compacted && b.surface.len() >= 8 {
                // Compaction: a summary replaces the oldest half of the surface.
                compacted = true;
                b.push(
                    "compaction/start",
                    r#"{"reason":"context-limit"}"#.to_owned(),
                );
                let shadowed: Vec<u64> = b.surface[..b.surface.len() / 2].to_vec();
                let summary = self.words(60);
                let data = format!(
                    r#"{{"id":"summary-{turn}","role":"user","content":[{{"type":"text","text":"Summary of earlier work:{summary}"}}],"source":{{"kind":"compaction"}}}}"#
                );
                let seq = b.replace("user/message", data, &shadowed);
                b.push("compaction/end", format!(r#"{{"summarySeq":{seq}}}"#));
            }
            let text = self.words(12);
            b.append(
                "user/message",
                format!(
                    r#"{{"id":"u{turn}","role":"user","content":[{{"type":"text","text":"Please{text}"}}],"source":{{"kind":"user"}}}}"#
                ),
                None,
            );
            let steps = 1 + self.below(3) as usize;
            for step in 1..=steps {
                let final_step = step == steps;
                b.push("step/start", format!(r#"{{"turn":{turn},"step":{step}}}"#));
                b.push(
                    "request/header",
                    format!(r#"{{"header":{{"config":{{"model":"sample-model"}},"system":"sys","tools":"tools"}},"reason":"{}"}}"#,
                        if step == 1 { "initial" } else { "continue" }),
                );
                // Streamed text: the bulk of the log.
                let mut chunks = Vec::new();
                chunks.push(b.push(
                    "assistant/chunk",
                    format!(r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"block-start","index":0,"blockType":"text"}}}}"#),
                ));
                let n = 6 + self.below(8) as usize;
                let mut reply = String::new();
                for _ in 0..n {
                    let len = 8 + self.below(12) as usize;
                    let piece = self.words(len);
                    reply.push_str(&piece);
                    chunks.push(b.push(
                        "assistant/chunk",
                        format!(r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"text-delta","index":0,"text":"{piece}"}}}}"#),
                    ));
                }
                let wants_tool = !final_step || (last && self.config.interrupt_last_turn);
                let call_id = format!("call-{turn}-{step}");
                let mut content = format!(r#"[{{"type":"text","text":"{reply}"}}"#);
                if wants_tool {
                    content.push_str(&format!(
                        r#",{{"type":"tool-call","id":"{call_id}","name":"bash","arguments":"{{\"command\":\"cargo test\"}}"}}"#
                    ));
                }
                content.push(']');
                chunks.push(b.push(
                    "assistant/chunk",
                    format!(r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"finish","reason":{{"kind":"{}"}}}}}}"#,
                        if wants_tool { "tool-calls" } else { "stop" }),
                ));
                b.append(
                    "assistant/message",
                    format!(
                        r#"{{"turn":{turn},"step":{step},"message":{{"id":"a{turn}-{step}","role":"assistant","content":{content},"source":{{"kind":"model","model":"sample-model"}}}},"usage":{{"inputTokens":{},"outputTokens":{n}}}}}"#,
                        1000 + self.below(50_000)
                    ),
                    Some(chunks),
                );
                if wants_tool {
                    let call_seq = b.push(
                        "tool/call",
                        format!(r#"{{"turn":{turn},"step":{step},"callId":"{call_id}","name":"bash","arguments":"{{\"command\":\"cargo test\"}}"}}"#),
                    );
                    if last && self.config.interrupt_last_turn {
                        return (header, b.events); // crashed while the tool ran
                    }
                    let len = 300 + self.below(300) as usize;
                    let output = self.words(len);
                    let result = |text: &str| {
                        format!(
                            r#"{{"turn":{turn},"step":{step},"message":{{"id":"r{turn}-{step}","role":"user","source":{{"kind":"tool","callId":"{call_id}"}},"content":[{{"type":"tool-result","toolCallId":"{call_id}","isError":false,"content":[{{"type":"text","text":"{text}"}}]}}]}}}}"#
                        )
                    };
                    let result_seq = b.append("tool/result", result(&output), Some(vec![call_seq]));
                    if !pruned && compacted {
                        // Pruning: the same result with its output cut.
                        pruned = true;
                        b.replace_one("tool/result", result("[output pruned]"), result_seq);
                    }
                }
                b.push("step/end", format!(r#"{{"turn":{turn},"step":{step}}}"#));
            }
            b.push(
                "turn/end",
                format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#),
            );
        }
        (header, b.events)
    }

    /// A long session of `n` events: sessions of this generator (ids `s0`,
    /// `s1`, ...) concatenated into one log from seq 0, each shifted by
    /// the events before it (seqs, source seqs, replaced ranges, and
    /// times by 7 ms per event), so the whole is one valid session. What
    /// the benchmarks write. It may end inside a turn. Returns the events
    /// and how many sessions went into them.
    pub fn long_session(&mut self, n: usize) -> (Vec<OwnedEvent>, usize) {
        let mut events: Vec<OwnedEvent> = Vec::with_capacity(n + 1024);
        let mut k = 0;
        while events.len() < n {
            let (_, part) = self.session(&format!("s{k}"));
            k += 1;
            let offset = events.len() as u64;
            for mut e in part {
                e.seq += offset;
                e.time += 7 * offset as i64;
                if let Some(src) = &mut e.source_event_seqs {
                    for s in src.iter_mut() {
                        *s += offset;
                    }
                }
                if let Some(SurfaceOp::Replace { start, end }) = &mut e.surface_op {
                    *start += offset;
                    *end += offset;
                }
                events.push(e);
            }
        }
        events.truncate(n);
        (events, k)
    }
}

/// Appends events with contiguous seqs and advancing times, tracking the
/// surface so replaces name real nodes.
struct Builder {
    events: Vec<OwnedEvent>,
    time: i64,
    surface: Vec<u64>,
}

impl Builder {
    fn event(&mut self, kind: &str, data: String) -> OwnedEvent {
        self.time += 7;
        Event {
            kind: Cow::Owned(kind.to_owned()),
            seq: self.events.len() as u64,
            time: self.time,
            data: Data::from_json(data).expect("generated JSON is plain JSON"),
            source_event_seqs: None,
            surface_op: None,
            ignorable: false,
        }
    }

    fn push(&mut self, kind: &str, data: String) -> u64 {
        let e = self.event(kind, data);
        let seq = e.seq;
        self.events.push(e);
        seq
    }

    fn append(&mut self, kind: &str, data: String, sources: Option<Vec<u64>>) -> u64 {
        let mut e = self.event(kind, data);
        e.surface_op = Some(SurfaceOp::Append);
        e.source_event_seqs = sources;
        let seq = e.seq;
        self.events.push(e);
        self.surface.push(seq);
        seq
    }

    /// Replaces the contiguous surface nodes `shadowed` by a new node.
    fn replace(&mut self, kind: &str, data: String, shadowed: &[u64]) -> u64 {
        let (start, end) = (shadowed[0], *shadowed.last().expect("non-empty"));
        let mut e = self.event(kind, data);
        e.surface_op = Some(SurfaceOp::Replace { start, end });
        e.source_event_seqs = Some(shadowed.to_vec());
        let seq = e.seq;
        self.events.push(e);
        let at = self
            .surface
            .iter()
            .position(|s| *s == start)
            .expect("start on surface");
        self.surface.drain(at..at + shadowed.len());
        self.surface.insert(at, seq);
        seq
    }

    fn replace_one(&mut self, kind: &str, data: String, node: u64) -> u64 {
        self.replace(kind, data, &[node])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionState;

    #[test]
    fn sessions_are_valid_realistic_and_deterministic() {
        let config = SampleConfig {
            turns: 30,
            ..SampleConfig::default()
        };
        let (_, events) = Sample::new(config.clone()).session("s");
        let mut state = SessionState::new(false);
        state.append_batch(&events, &Vec::<Event>::new()).unwrap();
        assert!(state.closers().is_empty(), "every turn is closed");
        assert_eq!(
            state.surface().replace_generation(),
            2,
            "one compaction, one pruning"
        );
        let chunks = events
            .iter()
            .filter(|e| e.kind == "assistant/chunk")
            .count();
        let share = chunks as f64 / events.len() as f64;
        assert!((0.5..0.8).contains(&share), "chunk share {share}");
        let (_, again) = Sample::new(config).session("s");
        assert_eq!(events, again);
    }

    #[test]
    fn an_interrupted_session_needs_closers() {
        let (_, events) = Sample::new(SampleConfig {
            turns: 3,
            interrupt_last_turn: true,
            ..SampleConfig::default()
        })
        .session("s");
        let mut state = SessionState::new(false);
        state.append_batch(&events, &Vec::<Event>::new()).unwrap();
        let kinds: Vec<String> = state.closers().iter().map(|e| e.kind.to_string()).collect();
        assert_eq!(kinds, ["tool/result", "step/end", "turn/end"]);
    }
}
