//! Putting one imported session into a [`Store`]: the one place every
//! format's import goes through.

use crate::adapters::Reporter;
use crate::event::Event;
use crate::header::SessionHeader;
use crate::store::{self, Store};

/// Stores an imported session whole with [`Store::import`]: published in
/// one rename once it is durable (a session with no events too: a
/// header-only file is a session, and an import keeps it), or, with
/// `replace`, swapped in for the stored session of that id in one atomic
/// exchange. A failure or a crash leaves the store as it was.
pub fn store_session(
    store: &Store,
    header: SessionHeader,
    events: &[Event<'_>],
    replace: bool,
) -> store::Result<()> {
    store.import(header, events, replace)
}

/// [`store_session`], telling `progress` the events written as the store
/// writes its batches ([`Store::import_with_progress`]). The store's last
/// report (the session published) is left to the caller's
/// `Reporter::stored`, which comes once the session is complete (its
/// closers appended).
pub(crate) fn store_session_reporting(
    store: &Store,
    header: SessionHeader,
    events: &[Event<'_>],
    replace: bool,
    progress: &mut Reporter<'_>,
) -> store::Result<()> {
    let all = events.len() as u64;
    store.import_with_progress(header, events, replace, &mut |written| {
        if written < all {
            progress.storing_events(written);
        }
    })
}
