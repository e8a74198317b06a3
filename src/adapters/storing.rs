//! Putting one imported session into a [`Store`]: the one place every
//! format's import goes through, so the rule for sessions without events
//! lives in one spot.

use crate::event::Event;
use crate::header::SessionHeader;
use crate::store::{self, Store};

/// Events appended per store batch when importing, and a bound on their
/// estimated size (well under the store's default record limit).
const BATCH_EVENTS: usize = 4096;
const BATCH_BYTES: usize = 16 << 20;

/// What [`store_session`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The session was created and its events appended.
    Stored,
    /// The session has no events and was not stored (see [`store_session`]).
    SkippedNoEvents,
}

/// Creates `header` in `store` and appends `events` in bounded batches. On
/// a failed append the half-imported session is deleted and the error
/// returned. The caller handles an existing id (and replacing) first.
///
/// A session with no events (a header-only file: the harness writes one
/// when a session is created and its first turn is refused) is NOT stored
/// yet: the store keeps a session from its first event on, and storing a
/// zero-event session needs `Store::import_session`, which is being added.
/// This function is the single call site to switch when it lands.
pub fn store_session(
    store: &Store,
    header: SessionHeader,
    events: &[Event<'_>],
) -> store::Result<Stored> {
    if events.is_empty() {
        // ZERO-EVENT SESSIONS: replace this skip with
        // `store.import_session(header, events)` once the store has it.
        return Ok(Stored::SkippedNoEvents);
    }
    let id = header.id.clone();
    store.create(header)?;
    if let Err(e) = append_batches(store, &id, events) {
        // Leave no half-imported session behind; the append error is the one
        // to report even if deleting fails too.
        let _ = store.delete(&id);
        return Err(e);
    }
    Ok(Stored::Stored)
}

/// Appends `events` in batches of at most 4,096 events and about 16 MiB
/// (well under the store's default record limit).
pub fn append_batches(store: &Store, id: &str, events: &[Event<'_>]) -> store::Result<()> {
    let mut start = 0;
    let mut size = 0;
    for (i, e) in events.iter().enumerate() {
        let estimate = e.kind.len() + e.data.get().len() + 64;
        if i > start && (i - start >= BATCH_EVENTS || size + estimate > BATCH_BYTES) {
            store.append(id, &events[start..i])?;
            start = i;
            size = 0;
        }
        size += estimate;
    }
    if start < events.len() {
        store.append(id, &events[start..])?;
    }
    Ok(())
}
