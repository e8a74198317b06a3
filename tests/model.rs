//! Model-based test: a proptest state machine over the store's public API.
//!
//! A random sequence of operations (create, append a batch of the next
//! events of a session's pre-generated `Sample` stream, append an invalid
//! batch, fork, delete, flush, close + reopen, crash = drop without close +
//! reopen) runs against a `Store` and against an in-memory model: per
//! session id, the acknowledged events (plus the repair closers the store
//! appends when a reopened session is first taken for writing and its last
//! turn is open). After every operation
//! `list`, `load` (and `NotFound` for the ids the model does not hold) are
//! checked; every few operations also `surface`, `derive`, `read_from` and
//! `verify` against a from-scratch fold of the model's events. Proptest
//! shrinks a failing sequence to a minimal one.

use proptest::prelude::*;
use sessionlog::derive;
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::session::SessionState;
use sessionlog::store::{Durability, Error, Options, Store};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

const IDS: [&str; 5] = ["s0", "s1", "s2", "s3", "s4"];

/// Per id index, the session's whole event stream (deterministic).
fn streams() -> &'static Vec<Vec<OwnedEvent>> {
    static STREAMS: OnceLock<Vec<Vec<OwnedEvent>>> = OnceLock::new();
    STREAMS.get_or_init(|| {
        IDS.iter()
            .enumerate()
            .map(|(i, id)| {
                Sample::new(SampleConfig {
                    turns: 6,
                    seed: i as u64,
                    ..SampleConfig::default()
                })
                .session(id)
                .1
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    /// Append the next `k` events of the session's stream.
    Append(usize, usize),
    /// Append a batch that must be rejected: variant, offset.
    AppendBad(usize, u8, u64),
    /// Fork `src` at `at % (len + 1)` into `dst`.
    Fork(usize, usize, usize),
    Delete(usize),
    Flush,
    Reopen,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDS.len();
    prop_oneof![
        3 => id.clone().prop_map(Op::Create),
        8 => (id.clone(), 1usize..20).prop_map(|(i, k)| Op::Append(i, k)),
        1 => (id.clone(), 0u8..3, 0u64..3).prop_map(|(i, v, o)| Op::AppendBad(i, v, o)),
        1 => (id.clone(), any::<usize>(), id.clone()).prop_map(|(s, a, d)| Op::Fork(s, a, d)),
        1 => id.prop_map(Op::Delete),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

#[derive(Debug, Clone)]
struct Entry {
    /// Acknowledged events (empty: created, not yet stored).
    events: Vec<OwnedEvent>,
    /// The stream the events are a prefix of (None after a fork or repair).
    stream: Option<usize>,
}

fn options() -> Options {
    Options {
        durability: Durability::Sync,
        segment_size: 4096,
        ..Options::default()
    }
}

fn open(dir: &Path) -> Store {
    Store::open(dir, options()).expect("open the store")
}

fn fold(events: &[OwnedEvent]) -> SessionState {
    let mut state = SessionState::new(false);
    state
        .append_batch(events, &Vec::<Event>::new())
        .expect("the model's events fold");
    state
}

/// The model at a reopen: pending sessions are forgotten, and sessions
/// whose last turn is open get the closers the store appends.
fn reopen_model(model: &mut BTreeMap<String, Entry>) {
    model.retain(|_, e| !e.events.is_empty());
    for e in model.values_mut() {
        let closers = fold(&e.events).closers();
        if !closers.is_empty() {
            e.events.extend(closers);
            e.stream = None;
        }
    }
}

/// After a reopen: each stored session's first write (here `repair`) makes
/// this handle its writer, which closes an interrupted turn, as the model
/// expects.
fn take_sessions(store: &Store, model: &BTreeMap<String, Entry>) -> Result<(), TestCaseError> {
    for id in model.keys() {
        store
            .repair(id)
            .map_err(|e| TestCaseError::fail(format!("repair({id}) after reopen: {e}")))?;
    }
    Ok(())
}

fn check(store: &Store, model: &BTreeMap<String, Entry>, deep: bool) -> Result<(), TestCaseError> {
    let mut listed: Vec<String> = store.list().unwrap().into_iter().map(|h| h.id).collect();
    listed.sort();
    let expected: Vec<String> = model
        .iter()
        .filter(|(_, e)| !e.events.is_empty())
        .map(|(id, _)| id.clone())
        .collect();
    prop_assert_eq!(&listed, &expected, "list()");
    for id in IDS {
        let Some(entry) = model.get(id) else {
            let r = store.load(id);
            prop_assert!(
                matches!(r, Err(Error::NotFound(_))),
                "load({}) of a session the model does not hold: {:?}",
                id,
                r.map(|(_, e)| e.len())
            );
            continue;
        };
        if entry.events.is_empty() {
            // A declared session: nothing stored. (Not loaded, so the store
            // keeps it lazily untouched.)
            continue;
        }
        let (header, events) = store
            .load(id)
            .map_err(|e| TestCaseError::fail(format!("load({id}): {e}")))?;
        prop_assert_eq!(&header.id, id);
        prop_assert_eq!(events.len(), entry.events.len(), "load({}) length", id);
        prop_assert!(events == entry.events, "load({}) events differ", id);
        if deep {
            let state = fold(&entry.events);
            let surface = store
                .surface(id)
                .map_err(|e| TestCaseError::fail(format!("surface({id}): {e}")))?;
            prop_assert_eq!(surface.seqs(), state.surface().seqs(), "surface({})", id);
            let derived = store
                .derive(id)
                .map_err(|e| TestCaseError::fail(format!("derive({id}): {e}")))?;
            let got: Vec<String> = derived.messages().map(|m| m.to_json()).collect();
            let want: Vec<String> = derive::derive(state.surface(), &entry.events)
                .expect("derive from scratch")
                .iter()
                .map(|m| m.to_json())
                .collect();
            prop_assert_eq!(got, want, "derive({})", id);
            for mid in [entry.events.len() / 2, entry.events.len()] {
                let tail = store
                    .read_from(id, mid as u64)
                    .map_err(|e| TestCaseError::fail(format!("read_from({id}, {mid}): {e}")))?;
                prop_assert!(tail == entry.events[mid..], "read_from({}, {})", id, mid);
            }
            store
                .verify(id)
                .map_err(|e| TestCaseError::fail(format!("verify({id}): {e}")))?;
        }
    }
    Ok(())
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = Some(open(dir.path()));
    let mut model: BTreeMap<String, Entry> = BTreeMap::new();
    for (n, op) in ops.iter().enumerate() {
        let s = store.as_ref().expect("store is open");
        match *op {
            Op::Create(i) => {
                let id = IDS[i];
                let r = s.create(SessionHeader::new(id, 0));
                if model.contains_key(id) {
                    prop_assert!(
                        matches!(r, Err(Error::Exists(_))),
                        "create({}): {:?}",
                        id,
                        r
                    );
                } else {
                    prop_assert!(r.is_ok(), "create({}): {:?}", id, r);
                    model.insert(
                        id.to_owned(),
                        Entry {
                            events: Vec::new(),
                            stream: Some(i),
                        },
                    );
                }
            }
            Op::Append(i, k) => {
                let id = IDS[i];
                match model.get_mut(id) {
                    None => {
                        let batch = &streams()[i][..1];
                        let r = s.append(id, batch);
                        prop_assert!(
                            matches!(r, Err(Error::NotFound(_))),
                            "append({}): {:?}",
                            id,
                            r
                        );
                    }
                    Some(entry) => {
                        if let Some(si) = entry.stream {
                            let stream = &streams()[si];
                            let from = entry.events.len();
                            let to = (from + k).min(stream.len());
                            let batch = &stream[from..to];
                            let r = s.append(id, batch);
                            prop_assert!(r.is_ok(), "append({}, {}..{}): {:?}", id, from, to, r);
                            entry.events.extend_from_slice(batch);
                        }
                    }
                }
            }
            Op::AppendBad(i, variant, offset) => {
                let id = IDS[i];
                let next = model.get(id).map_or(0, |e| e.events.len() as u64);
                let template = streams()[i][(next as usize).min(streams()[i].len() - 1)].clone();
                let mut bad = template.clone();
                let batch = match variant {
                    // Past the next seq.
                    0 => {
                        bad.seq = next + 1 + offset;
                        vec![bad]
                    }
                    // Before the next seq (or, on an empty session, past it).
                    1 => {
                        bad.seq = next.checked_sub(1 + offset).unwrap_or(next + 2 + offset);
                        vec![bad]
                    }
                    // A good first event, then a repeated seq.
                    _ => {
                        let mut good = template;
                        good.seq = next;
                        bad.seq = next;
                        vec![good, bad]
                    }
                };
                let r = s.append(id, &batch);
                if model.contains_key(id) {
                    prop_assert!(
                        matches!(r, Err(Error::Rejected { .. })),
                        "bad append({}) variant {}: {:?}",
                        id,
                        variant,
                        r
                    );
                } else {
                    prop_assert!(
                        matches!(r, Err(Error::NotFound(_))),
                        "bad append({}) to a missing session: {:?}",
                        id,
                        r
                    );
                }
            }
            Op::Fork(si, at, di) => {
                let (src, dst) = (IDS[si], IDS[di]);
                let len = model.get(src).map_or(0, |e| e.events.len());
                let at = at % (len + 1);
                let r = s.fork(src, at as u64, SessionHeader::new(dst, 0));
                if model.contains_key(dst) {
                    prop_assert!(
                        matches!(r, Err(Error::Exists(_))),
                        "fork({} -> {}): {:?}",
                        src,
                        dst,
                        r
                    );
                } else if let Some(parent) = model.get(src) {
                    prop_assert!(r.is_ok(), "fork({} at {} -> {}): {:?}", src, at, dst, r);
                    let mut events = parent.events[..at].to_vec();
                    if events.last().is_none_or(|e| e.kind != "session/end-seed") {
                        let time = events.last().map_or(0, |e| e.time);
                        events.push(
                            OwnedEvent::new("session/end-seed", at as u64, time, "{}")
                                .expect("valid JSON"),
                        );
                    }
                    model.insert(
                        dst.to_owned(),
                        Entry {
                            events,
                            stream: None,
                        },
                    );
                } else {
                    prop_assert!(
                        matches!(r, Err(Error::NotFound(_))),
                        "fork({} -> {}): {:?}",
                        src,
                        dst,
                        r
                    );
                }
            }
            Op::Delete(i) => {
                let id = IDS[i];
                let r = s.delete(id);
                if model.remove(id).is_some() {
                    prop_assert!(r.is_ok(), "delete({}): {:?}", id, r);
                } else {
                    prop_assert!(
                        matches!(r, Err(Error::NotFound(_))),
                        "delete({}): {:?}",
                        id,
                        r
                    );
                }
            }
            Op::Flush => {
                let r = s.flush();
                prop_assert!(r.is_ok(), "flush: {:?}", r);
            }
            Op::Reopen => {
                let r = store.take().expect("open").close();
                prop_assert!(r.is_ok(), "close: {:?}", r);
                store = Some(open(dir.path()));
                reopen_model(&mut model);
                take_sessions(store.as_ref().expect("open"), &model)?;
            }
            Op::Crash => {
                drop(store.take());
                store = Some(open(dir.path()));
                reopen_model(&mut model);
                take_sessions(store.as_ref().expect("open"), &model)?;
            }
        }
        let deep = n % 5 == 4 || n + 1 == ops.len();
        check(store.as_ref().expect("open"), &model, deep)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        run(&ops)?;
    }
}

/// A fork whose seed ends exactly at a sealed segment's end: the whole seed
/// is shared by hard links and `session/end-seed` must still carry the
/// seed's last time (as when the seed is copied).
#[test]
fn fork_at_segment_boundary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(dir.path());
    let stream = &streams()[0];
    store.create(SessionHeader::new("p", 0)).expect("create");
    let mut boundary = None;
    let mut segments = 0;
    for (i, e) in stream.iter().enumerate() {
        store.append("p", std::slice::from_ref(e)).expect("append");
        let now = store.stats("p").expect("stats").segments;
        if segments > 0 && now > segments && boundary.is_none() {
            boundary = Some(i as u64);
        }
        segments = now;
    }
    let at = boundary.expect("the stream spans several segments");
    for (child, at) in [("copied", at - 1), ("linked", at)] {
        store
            .fork("p", at, SessionHeader::new(child, 0))
            .expect("fork");
        let (_, events) = store.load(child).expect("load");
        let seed = events.last().expect("end-seed");
        assert_eq!(seed.kind, "session/end-seed");
        assert_eq!(seed.seq, at);
        assert_eq!(
            seed.time,
            stream[at as usize - 1].time,
            "fork {child} at {at}: end-seed time"
        );
    }
}
