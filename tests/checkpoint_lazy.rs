//! The checkpoint's lazily checked sections (format-spec.md, section 5):
//! reading events after a reopen uses only `HEAD` and `BATCHES`; the state,
//! derive cache and node locations are checked when first needed, and a
//! damaged one then makes the store rebuild the session from the log, with
//! the same answers as before.

mod common;

use common::{checkpoint_place, next_turn, read_checkpoint, turn_log, write_checkpoint_bytes};
use sessionlog::checkpoint::{self, Section};
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Error, Options, Store};
use std::path::{Path, PathBuf};

/// `turns` turns with a compaction in the middle (`common::turn_log`); the
/// last turn left open (its turn/end dropped) when `open_last`.
fn log(turns: u64, open_last: bool) -> Vec<OwnedEvent> {
    let mut out = turn_log(turns, "lazy");
    if open_last {
        out.pop();
    }
    out
}

fn opts() -> Options {
    Options {
        preallocate: 4096,
        ..Options::default()
    }
}

/// A store with one session "s" holding `events` in batches of 4, closed
/// (so its checkpoint covers everything). Returns the session's directory
/// (its checkpoint is embedded in its `HEADER`, or a file of its own).
fn build(dir: &Path, events: &[OwnedEvent]) -> PathBuf {
    let store = Store::open(dir, opts()).unwrap();
    store.create(SessionHeader::new("s", 0)).unwrap();
    for batch in events.chunks(4) {
        store.append("s", batch).unwrap();
    }
    store.close().unwrap();
    dir.join("sessions").join("s")
}

/// Flips one byte in the middle of `section`, leaving its CRC stale.
fn damage(sdir: &Path, section: Section) {
    let mut bytes = read_checkpoint(sdir);
    let range = checkpoint::sections(&bytes).unwrap()[section as usize].clone();
    assert!(!range.is_empty(), "{section:?} is empty");
    bytes[range.start + range.len() / 2] ^= 0x40;
    write_checkpoint_bytes(sdir, &bytes);
}

#[test]
fn reading_events_does_not_decode_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let events = log(20, false);
    let path = build(dir.path(), &events);
    let before = {
        let store = Store::open_read_only(dir.path()).unwrap();
        (
            store.surface("s").unwrap(),
            store.derive("s").unwrap().messages().count(),
        )
    };
    // A damaged STATE goes unnoticed by reads, which do not need it...
    damage(&path, Section::State);
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(store.load("s").unwrap().1, events);
    assert_eq!(store.read_from("s", 37).unwrap(), events[37..].to_vec());
    let rec = store.recovery("s").unwrap();
    assert!(rec.used_checkpoint && rec.replayed == 0, "{rec:?}");
    // ...and is found when the surface is needed: rebuilt from the log.
    assert_eq!(store.surface("s").unwrap(), before.0);
    let rec = store.recovery("s").unwrap();
    assert!(!rec.used_checkpoint, "{rec:?}");
    let reason = rec.rebuild_reason.unwrap_or_default();
    assert!(
        reason.contains("STATE section checksum mismatch"),
        "{reason}"
    );
    assert_eq!(store.derive("s").unwrap().messages().count(), before.1);
    assert_eq!(store.load("s").unwrap().1, events);
}

#[test]
fn each_damaged_lazy_section_rebuilds_at_first_use_with_the_same_answers() {
    for section in [Section::State, Section::Derive, Section::Nodes] {
        // first use: an append, a derive, a verify
        for use_case in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let events = log(12, false);
            let path = build(dir.path(), &events);
            let expected_messages = {
                let store = Store::open_read_only(dir.path()).unwrap();
                store.derive("s").unwrap().messages().count()
            };
            damage(&path, section);
            let store = Store::open(dir.path(), opts()).unwrap();
            match use_case {
                0 => {
                    let more = next_turn(&events);
                    store.append("s", &more).unwrap();
                    assert_eq!(store.load("s").unwrap().1, [events.clone(), more].concat());
                }
                1 => assert_eq!(
                    store.derive("s").unwrap().messages().count(),
                    expected_messages
                ),
                // Verify reads the log and reports the damaged cache.
                _ => match store.verify("s") {
                    Err(Error::Corrupt {
                        segment, reason, ..
                    }) => {
                        assert_eq!(segment, checkpoint_place(&path).unwrap().0);
                        assert!(reason.contains(section.name()), "{reason}");
                        assert_eq!(store.load("s").unwrap().1, events);
                    }
                    other => panic!("{section:?}: verify must report it: {other:?}"),
                },
            }
            let rec = store.recovery("s").unwrap();
            assert!(!rec.used_checkpoint, "{section:?} case {use_case}: {rec:?}");
            let reason = rec.rebuild_reason.clone().unwrap_or_default();
            assert!(
                reason.contains(&format!("{} section checksum mismatch", section.name())),
                "{section:?} case {use_case}: {reason}"
            );
            // Once a writer takes the session, the new checkpoint written by
            // close is whole again (a reader never writes one).
            store.repair("s").unwrap();
            store.close().unwrap();
            let store = Store::open(dir.path(), opts()).unwrap();
            assert!(store.surface("s").is_ok());
            let rec = store.recovery("s").unwrap();
            assert!(rec.used_checkpoint, "{section:?} case {use_case}: {rec:?}");
            assert!(store.verify("s").unwrap().events >= events.len() as u64);
        }
    }
}

/// A checkpoint of format version 5 (the bincode sections of earlier builds,
/// behind the same 120-byte header) is refused by its version at open: a
/// checkpoint is a cache, so the session is rebuilt from the log and the
/// reason reported, never an error; the writer's next checkpoint is version
/// 6 and is used again.
#[test]
fn a_version_5_checkpoint_is_ignored_and_the_session_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let events = log(12, false);
    let path = build(dir.path(), &events);
    let mut bytes = read_checkpoint(&path);
    bytes[8..12].copy_from_slice(&5u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..116]);
    bytes[116..120].copy_from_slice(&crc.to_le_bytes());
    write_checkpoint_bytes(&path, &bytes);
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(store.load("s").unwrap().1, events);
    let rec = store.recovery("s").unwrap();
    assert!(!rec.used_checkpoint, "{rec:?}");
    let reason = rec.rebuild_reason.clone().unwrap_or_default();
    assert!(
        reason.contains("checkpoint format version 5 is not supported (this build reads 6)"),
        "{reason}"
    );
    // The writer's next checkpoint is of this version, and is used.
    store.repair("s").unwrap();
    store.close().unwrap();
    assert_eq!(read_checkpoint(&path)[8..12], 6u32.to_le_bytes());
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(store.load("s").unwrap().1, events);
    assert!(store.recovery("s").unwrap().used_checkpoint);
}

#[test]
fn a_damaged_eager_section_rebuilds_at_open() {
    for section in [Section::Head, Section::Batches] {
        let dir = tempfile::tempdir().unwrap();
        let events = log(12, false);
        let path = build(dir.path(), &events);
        damage(&path, section);
        let store = Store::open(dir.path(), opts()).unwrap();
        assert_eq!(store.load("s").unwrap().1, events);
        let rec = store.recovery("s").unwrap();
        assert!(!rec.used_checkpoint, "{section:?}: {rec:?}");
        let reason = rec.rebuild_reason.unwrap_or_default();
        assert!(
            reason.contains(&format!("{} section checksum mismatch", section.name())),
            "{section:?}: {reason}"
        );
    }
}

#[test]
fn an_open_turn_under_a_lazy_checkpoint_is_closed_once() {
    let dir = tempfile::tempdir().unwrap();
    let events = log(6, true);
    // The writer closes without repairing: the checkpoint covers the open
    // turn, and the closers come at the next writable open.
    build(dir.path(), &events);
    // Read-only: the closers come from the checkpoint's HEAD alone.
    {
        let store = Store::open_read_only(dir.path()).unwrap();
        let loaded = store.load("s").unwrap().1;
        assert_eq!(loaded.len(), events.len() + 1);
        assert_eq!(loaded.last().unwrap().kind, "turn/end");
    }
    for round in 0..2 {
        let store = Store::open(dir.path(), opts()).unwrap();
        // The first write takes the session and closes the turn, once.
        store.repair("s").unwrap();
        let loaded = store.load("s").unwrap().1;
        assert_eq!(loaded.len(), events.len() + 1, "round {round}");
        assert_eq!(loaded[..events.len()], events[..]);
        let rec = store.recovery("s").unwrap();
        assert_eq!(rec.closers, u64::from(round == 0), "round {round}: {rec:?}");
        store.close().unwrap();
    }
}

/// A checkpoint whose checksums hold but whose derive cache points past
/// its messages' data (written by a wrong or hostile writer) is found at
/// the first derive: the session is rebuilt from the log, with the reason
/// reported, and derive answers as before; never a panic inside
/// `Derived::messages`.
#[test]
fn a_checksummed_derive_cache_that_does_not_fit_the_log_rebuilds() {
    use serde_json::value::RawValue;
    use sessionlog::derive::DeriveCache;
    use sessionlog::surface::EventSource;
    /// Every node's data with a 70-byte member first: the cache built from
    /// it has ranges past the end of the data really stored.
    struct Padded(Vec<Box<RawValue>>);
    impl EventSource for Padded {
        fn data(&self, seq: u64) -> Option<&RawValue> {
            self.0.get(seq as usize).map(|b| &**b)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let events = log(12, false);
    let path = build(dir.path(), &events);
    let expected: Vec<String> = {
        let store = Store::open_read_only(dir.path()).unwrap();
        let d = store.derive("s").unwrap();
        d.messages().map(|m| m.to_json()).collect()
    };
    assert!(!expected.is_empty());
    let mut body = checkpoint::decode(&read_checkpoint(&path)).unwrap();
    let padded = Padded(
        events
            .iter()
            .map(|e| {
                let d = e.data.get();
                let longer = match d.strip_prefix('{') {
                    Some(rest) if rest.trim_start() != "}" => {
                        format!("{{\"_\":\"{}\",{rest}", "x".repeat(64))
                    }
                    _ => d.to_owned(),
                };
                RawValue::from_string(longer).unwrap()
            })
            .collect(),
    );
    let mut cache = DeriveCache::default();
    cache.update(body.state.surface(), &padded).unwrap();
    assert_eq!(cache.len(), expected.len());
    assert!(cache.check(body.state.surface(), &events).is_err());
    body.derive = cache;
    write_checkpoint_bytes(&path, &checkpoint::encode(&body));

    let store = Store::open_read_only(dir.path()).unwrap();
    let got: Vec<String> = store
        .derive("s")
        .unwrap()
        .messages()
        .map(|m| m.to_json())
        .collect();
    assert_eq!(got, expected);
    let rec = store.recovery("s").unwrap();
    assert!(!rec.used_checkpoint, "{rec:?}");
    let reason = rec.rebuild_reason.unwrap_or_default();
    assert!(reason.contains("derive cache does not fit"), "{reason}");
}
