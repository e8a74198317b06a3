//! `append`: arbitrary event batches, built from the input, appended to a
//! fresh store.
//!
//! Properties: building, checking (`check_shape`) and appending never panic;
//! a rejected batch is an `Error::Rejected` (or `TooLarge`) and leaves no
//! trace; the accepted batches round-trip: `load` returns exactly them,
//! `verify` passes, `derive` and `surface` work, and after a reopen the log
//! is the accepted batches followed by exactly their repair closers.
//!
//! Two input forms. An input starting with `{` is JSONL (a harness session
//! file, as the fixtures seed it): its events, read with `read_session` or
//! else line by line with `Event::from_json`, are cut into batches. Any other
//! input is a little program: each op byte adds an event (type, seq, time,
//! data, surfaceOp, sources, ignorable all drawn from the input, biased to
//! the valid), or appends the pending batch (directly, through a JSON
//! round trip of each event, or one event through `append_new`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use sessionlog::adapters::jsonl::read_session;
use sessionlog::event::{Data, Event, OwnedEvent, SurfaceOp};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Durability, Error, Options, Store};
use sessionlog_fuzz::{AllocWindow, Bytes, budget, closers_after, remove_tree, scratch_root};
use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::OnceLock;

const SESSION: &str = "s";
const MAX_EVENTS: usize = 96;

const KINDS: [&str; 14] = [
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "user/message",
    "assistant/message",
    "tool/result",
    "tool/call",
    "assistant/chunk",
    "request/header",
    "compaction/start",
    "session/end-seed",
    "x/custom",
    "",
];

fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| scratch_root("append"))
}

fn text(input: &mut Bytes<'_>) -> String {
    let n = (input.u8() % 24) as usize;
    let raw = input.take(n);
    serde_json::to_string(&String::from_utf8_lossy(raw)).expect("a string serialises")
}

fn data(input: &mut Bytes<'_>, turn: u64) -> String {
    let call = input.u8() % 4;
    match input.u8() % 14 {
        0 => format!(r#"{{"turn":{turn}}}"#),
        1 => format!(
            r#"{{"role":"user","content":[{{"type":"text","text":{}}}],"source":{{"kind":"user"}}}}"#,
            text(input)
        ),
        2 => format!(
            r#"{{"turn":{turn},"step":1,"message":{{"role":"assistant","content":[{{"type":"text","text":{}}},{{"type":"tool-call","id":"c{call}","name":"bash","arguments":"{{}}"}}]}}}}"#,
            text(input)
        ),
        3 => format!(
            r#"{{"turn":{turn},"step":1,"callId":"c{call}","name":"bash","arguments":"{{}}"}}"#
        ),
        4 => format!(
            r#"{{"turn":{turn},"step":1,"message":{{"role":"user","source":{{"kind":"tool","callId":"c{call}"}},"content":[{{"type":"tool-result","toolCallId":"c{call}","isError":false,"content":[{{"type":"text","text":{}}}]}}]}}}}"#,
            text(input)
        ),
        5 => "{}".into(),
        6 => "-0".into(),
        7 => "1e308".into(),
        8 => "1e999".into(),
        9 => r#"[1,2.5,{"a":null,"b":[true,false]}]"#.into(),
        10 => text(input),
        11 => format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#),
        12 => format!(
            r#"{{"turn":{turn},"step":1,"chunk":{{"type":"text-delta","text":{}}}}}"#,
            text(input)
        ),
        _ => {
            let n = (input.u8() % 48) as usize;
            String::from_utf8_lossy(input.take(n)).into_owned()
        }
    }
}

/// One event drawn from the input; `next` is the seq that would be valid.
fn event(input: &mut Bytes<'_>, next: u64, prev_time: i64, seqs: &[u64]) -> Option<OwnedEvent> {
    let k = input.u8();
    let kind: Cow<'static, str> = if k as usize % 16 < KINDS.len() {
        Cow::Borrowed(KINDS[k as usize % 16])
    } else {
        let n = (input.u8() % 12) as usize;
        Cow::Owned(String::from_utf8_lossy(input.take(n)).into_owned())
    };
    let seq = match input.u8() % 12 {
        0..=7 => next,
        8 => next + 1,
        9 => next.wrapping_sub(1),
        10 => input.u64(),
        _ => 1 << 53,
    };
    let time = match input.u8() % 10 {
        0..=6 => prev_time.saturating_add(i64::from(input.u8())),
        7 => input.u64() as i64,
        8 => 1 << 53,
        _ => -(1 << 53),
    };
    let turn = u64::from(input.u8() % 3);
    let text = data(input, turn);
    // A number JSON.parse reads as Infinity is refused here, at the payload.
    let data = Data::from_raw(RawValue::from_string(text).ok()?).ok()?;
    let pick = |input: &mut Bytes<'_>| -> u64 {
        if seqs.is_empty() {
            u64::from(input.u8())
        } else {
            seqs[input.u8() as usize % seqs.len()]
        }
    };
    let surface_op = match input.u8() % 6 {
        0..=2 => None,
        3 => Some(SurfaceOp::Append),
        4 => Some(SurfaceOp::Replace {
            start: pick(input),
            end: pick(input),
        }),
        _ => Some(SurfaceOp::Replace {
            start: input.u64(),
            end: input.u64(),
        }),
    };
    let source_event_seqs = match input.u8() % 6 {
        0..=2 => None,
        3 => Some(vec![pick(input)]),
        4 => Some((0..input.u8() % 5).map(|_| pick(input)).collect()),
        _ => Some((0..input.u8() % 3).map(|_| input.u64()).collect()),
    };
    // Surface types want a surfaceOp: mostly give them one.
    let surface_op = match (&*kind, surface_op) {
        ("user/message" | "assistant/message" | "tool/result", None) if k & 0x80 == 0 => {
            Some(SurfaceOp::Append)
        }
        (_, op) => op,
    };
    Some(Event {
        kind,
        seq,
        time,
        data,
        source_event_seqs,
        surface_op,
        ignorable: k & 0x40 != 0,
    })
}

struct Run {
    store: Store,
    accepted: Vec<OwnedEvent>,
}

impl Run {
    fn append(&mut self, batch: &[OwnedEvent]) {
        if batch.is_empty() {
            return;
        }
        match self.store.append(SESSION, batch) {
            Ok(()) => self.accepted.extend(batch.iter().cloned()),
            Err(Error::Rejected { .. } | Error::TooLarge { .. }) => {}
            Err(e) => panic!("append failed with neither a rejection nor TooLarge: {e}"),
        }
    }

    fn append_new(&mut self, e: OwnedEvent) {
        let time = e.time;
        match self.store.append_new(SESSION, e.clone(), time) {
            Ok(seq) => {
                assert_eq!(
                    seq,
                    self.accepted.len() as u64,
                    "append_new gave the next seq"
                );
                let mut e = e;
                e.seq = seq;
                self.accepted.push(e);
            }
            Err(Error::Rejected { .. } | Error::TooLarge { .. }) => {}
            Err(e) => panic!("append_new failed with neither a rejection nor TooLarge: {e}"),
        }
    }
}

fn program(run: &mut Run, data: &[u8]) {
    let mut input = Bytes::new(data);
    let mut batch: Vec<OwnedEvent> = Vec::new();
    let mut built = 0;
    while !input.is_empty() && built < MAX_EVENTS {
        let op = input.u8();
        let next = (run.accepted.len() + batch.len()) as u64;
        let prev_time = batch
            .last()
            .or(run.accepted.last())
            .map_or(1_000, |e| e.time);
        let seqs: Vec<u64> = run
            .store
            .surface(SESSION)
            .map_or_else(|_| Vec::new(), |s| s.iter().collect());
        match op % 10 {
            0..=5 => {
                if let Some(e) = event(&mut input, next, prev_time, &seqs) {
                    let _ = e.check_shape();
                    batch.push(e);
                    built += 1;
                }
            }
            6 | 7 => run.append(&std::mem::take(&mut batch)),
            8 => {
                // Through the JSON envelope, as a harness would send it.
                let through: Vec<OwnedEvent> = std::mem::take(&mut batch)
                    .iter()
                    .filter_map(|e| {
                        let json = e.to_json();
                        Event::from_json(&json).ok().map(Event::into_owned)
                    })
                    .collect();
                run.append(&through);
            }
            _ => {
                if let Some(e) = event(&mut input, next, prev_time, &seqs) {
                    built += 1;
                    run.append_new(e);
                }
            }
        }
    }
    run.append(&batch);
}

fn jsonl(run: &mut Run, data: &[u8]) {
    let events: Vec<OwnedEvent> = match read_session(data, false) {
        Ok(s) => s.events.into_iter().map(Event::into_owned).collect(),
        Err(_) => data
            .split(|&b| b == b'\n')
            .filter_map(|line| Event::from_json_bytes(line).ok().map(Event::into_owned))
            .collect(),
    };
    // Batch sizes from the events themselves: stable under mutation.
    let mut batch = Vec::new();
    for e in events.into_iter().take(4 * MAX_EVENTS) {
        let cut = e.data.get().len() % 5 == 0;
        batch.push(e);
        if cut {
            run.append(&std::mem::take(&mut batch));
        }
    }
    run.append(&batch);
}

fuzz_target!(|data: &[u8]| {
    let window = AllocWindow::start();
    let dir = root().join("store");
    remove_tree(&dir);
    let strict = data.first().is_some_and(|b| b & 1 == 1 && *b != b'{');
    let options = Options {
        durability: Durability::Sync,
        segment_size: 8192,
        preallocate: 4096,
        checkpoint_every: 8,
        strict,
        ..Options::default()
    };
    let store = Store::open(&dir, options.clone()).expect("open a fresh store");
    store
        .create(SessionHeader::new(SESSION, 0))
        .expect("create the session");
    let mut run = Run {
        store,
        accepted: Vec::new(),
    };
    if data.first() == Some(&b'{') {
        jsonl(&mut run, data);
    } else if !data.is_empty() {
        program(&mut run, &data[1..]);
    }
    let Run { store, accepted } = run;
    if accepted.is_empty() {
        window.check(budget(data.len(), 0), "nothing accepted");
        return;
    }
    let (_, loaded) = store.load(SESSION).expect("load the accepted batches");
    assert!(loaded == accepted, "load differs from the accepted batches");
    store
        .verify(SESSION)
        .unwrap_or_else(|e| panic!("verify of accepted batches failed: {e}"));
    let _ = store.surface(SESSION).expect("surface");
    let _ = store.derive(SESSION).expect("derive").messages().count();
    drop(store);

    let store = Store::open(&dir, options).expect("reopen");
    // The next writer closes the interrupted turn when it takes the session.
    store.repair(SESSION).expect("repair after reopen");
    let (_, reloaded) = store.load(SESSION).expect("reload");
    let closers = closers_after(&accepted, accepted.len());
    assert!(
        reloaded[..] == [accepted.clone(), closers].concat()[..],
        "after reopen: {} events, expected {} accepted + closers",
        reloaded.len(),
        accepted.len()
    );
    store
        .verify(SESSION)
        .unwrap_or_else(|e| panic!("verify after reopen failed: {e}"));
    window.check(budget(data.len() * 16, 0), "append");
});
