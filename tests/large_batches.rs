//! Large batches (issue 18): the Zstandard pack of a batch with at least
//! 64 KiB of packable data is compressed on the handle's helper thread
//! while the appending thread folds it. What is stored must be what an
//! encode on one thread stores, whether the helper took the batch, was
//! busy with another appender's, or the fold refused the batch meanwhile.

use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::store::{Error, Options, Store};

/// A generated session of `turns` turns (about 30 events and 9 KiB of
/// JSONL each).
fn session(id: &str, turns: usize, seed: u64) -> Vec<OwnedEvent> {
    Sample::new(SampleConfig {
        turns,
        seed,
        ..SampleConfig::default()
    })
    .session(id)
    .1
}

/// Asserts `got == want`, naming the first difference (not printing
/// thousands of events).
#[track_caller]
fn same(got: &[OwnedEvent], want: &[OwnedEvent], what: &str) {
    if let Some(i) = (0..got.len().min(want.len())).find(|&i| got[i] != want[i]) {
        panic!("{what}: event {i} differs: {:?} vs {:?}", got[i], want[i]);
    }
    assert_eq!(got.len(), want.len(), "{what}: lengths");
}

fn packable_bytes(events: &[OwnedEvent]) -> usize {
    events
        .iter()
        .filter(|e| e.surface_op.is_none())
        .map(|e| e.data.get().len())
        .sum()
}

/// Four threads append their own sessions in batches of 1,000 events at
/// once (one helper: most batches find it busy and pack on their own
/// thread), then every session reads back exactly, from this handle, a
/// reopened one and `verify`.
#[test]
fn large_batches_of_many_threads_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        segment_size: 4 << 20,
        ..Options::default()
    };
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let logs: Vec<(String, Vec<OwnedEvent>)> = (0..4)
        .map(|i| {
            let id = format!("big{i}");
            let log = session(&id, 120, 40 + i);
            (id, log)
        })
        .collect();
    for (id, log) in &logs {
        assert!(
            packable_bytes(&log[..1000]) >= 64 << 10,
            "a batch large enough for the helper"
        );
        store.create(SessionHeader::new(id.clone(), 0)).unwrap();
    }
    std::thread::scope(|scope| {
        for (id, log) in &logs {
            let store = &store;
            scope.spawn(move || {
                for batch in log.chunks(1000) {
                    store.append(id, batch).unwrap();
                }
            });
        }
    });
    for (id, log) in &logs {
        same(&store.read_from(id, 0).unwrap(), log, id);
    }
    store.close().unwrap();
    let store = Store::open(dir.path(), options).unwrap();
    for (id, log) in &logs {
        same(
            &store.read_from(id, 0).unwrap(),
            log,
            &format!("{id}: reopened"),
        );
        store.verify(id).unwrap();
    }
}

/// A large batch the fold refuses (its pack already with the helper)
/// stores nothing; the next large batch is stored whole, with its own
/// pack, not the refused one's.
#[test]
fn a_refused_large_batch_leaves_nothing_and_the_next_one_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let log = session("s", 120, 7);
    store.create(SessionHeader::new("s", 0)).unwrap();
    store.append("s", &log[..1000]).unwrap();
    // The same events again: their seqs are not the next ones.
    let refused = store.append("s", &log[..1000]);
    assert!(
        matches!(refused, Err(Error::Rejected { .. })),
        "{refused:?}"
    );
    // Ending on a turn's end: a reader adds no closers.
    let end = log[..2000]
        .iter()
        .rposition(|e| e.kind == "turn/end")
        .unwrap()
        + 1;
    assert!(packable_bytes(&log[1000..end]) >= 64 << 10);
    store.append("s", &log[1000..end]).unwrap();
    same(&store.read_from("s", 0).unwrap(), &log[..end], "s");
    store.close().unwrap();
    let store = Store::open_read_only(dir.path()).unwrap();
    same(
        &store.read_from("s", 0).unwrap(),
        &log[..end],
        "s: reopened",
    );
    store.verify("s").unwrap();
}
