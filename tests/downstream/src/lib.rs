//! A downstream user of `sessionlog`, the way an embedder depends on it
//! (`default-features = false`, no `internals`): this must compile, and
//! every `probe-*` feature must not (see `check.sh`, run by `.ci/run`).

use sessionlog::adapters::jsonl;
use sessionlog::build;
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::store::{
    CheckpointError, CheckpointSection, CodecError, Durability, Error, ManifestError, Options,
    SegmentError, Store,
};
use std::path::Path;

/// What the crate's front page does, through the public API only: open a
/// store, create a session, append a turn, derive its messages, tail it,
/// look at its files.
pub fn front_page(dir: &Path) -> Result<usize, Error> {
    let root = dir.join("store");
    assert!(!Store::is_store(&root));
    let store = Store::open(
        &root,
        Options {
            durability: Durability::Sync,
            ..Options::default()
        },
    )?;
    assert!(Store::is_store(&root));
    store.create(SessionHeader::new("s1", 0))?;
    let turn: Vec<OwnedEvent> = vec![
        build::turn_start(0, 1, 1),
        build::user_message(1, 1, "hi"),
        build::turn_end(2, 1, 1),
    ];
    let batch: Vec<_> = turn.iter().map(OwnedEvent::borrowed).collect();
    store.append("s1", &batch)?;
    let messages = store.derive("s1")?.messages().count();
    let mut tail = store.tail("s1", 0)?;
    assert_eq!(tail.poll()?.len(), 3);
    let files = store.segment_files("s1")?;
    assert!(files[0].starts_with(Store::session_dir_in(&root, "s1")?));
    // A sample session, imported as the harness writes it.
    let (header, events) = Sample::new(SampleConfig::default()).session("s2");
    let _ = (header, events, jsonl::read_session(b"", false).is_err());
    store.close()?;
    Ok(messages)
}

/// Every error a store error carries can be named and matched.
pub fn explain(e: &Error) -> &'static str {
    match e {
        Error::Manifest(ManifestError::Missing { .. }) => "no store here",
        Error::Manifest(_) => "the manifest",
        Error::Segment {
            source: SegmentError::UnsupportedVersion { .. },
            ..
        } => "a newer segment format",
        Error::Checkpoint {
            source:
                CheckpointError::Malformed {
                    section: CheckpointSection::Head,
                    ..
                },
            ..
        } => "a damaged checkpoint head",
        Error::Encode {
            source: CodecError::NonContiguous { .. },
            ..
        } => "a gap in the batch",
        _ => "something else",
    }
}

/// Runs the front page in a temporary directory.
pub fn run() -> usize {
    let dir = tempfile::tempdir().expect("a temporary directory");
    front_page(dir.path()).unwrap_or_else(|e| panic!("{}: {e}", explain(&e)))
}

// The probes: each names one of the engine's internals, and must not
// compile without the `internals` feature.
#[cfg(feature = "probe-checkpoint")]
pub use sessionlog::checkpoint::Checkpoint as probe;
#[cfg(feature = "probe-codec")]
pub use sessionlog::codec::decode_batch as probe;
#[cfg(feature = "probe-format")]
pub use sessionlog::format as probe;
#[cfg(feature = "probe-varint")]
pub use sessionlog::format::varint as probe;
#[cfg(feature = "probe-fsutil")]
pub use sessionlog::fsutil::encode_session_dir_name as probe;
#[cfg(feature = "probe-io")]
pub use sessionlog::io as probe;
#[cfg(feature = "probe-lineage")]
pub use sessionlog::lineage::Lineage as probe;
#[cfg(feature = "probe-manifest")]
pub use sessionlog::manifest::Manifest as probe;
#[cfg(feature = "probe-segment")]
pub use sessionlog::segment::SegmentWriter as probe;
#[cfg(feature = "probe-vfs")]
pub use sessionlog::vfs::Vfs as probe;
/// The fault-injection seam (the file system is inferred, not named).
#[cfg(feature = "probe-open-with-vfs")]
pub fn probe(dir: &Path) {
    let _ = |vfs| Store::open_with_vfs(dir, Options::default(), vfs);
}
