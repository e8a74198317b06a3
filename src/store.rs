//! The durable store: sessions as segment logs in directories of their own,
//! checkpoints, and crash recovery with repair.
//!
//! Data flow of an append, top to bottom:
//! 1. the batch is folded into the session's model (every rule of the
//!    harness; a bad batch is rejected whole and nothing is written);
//! 2. the batch is encoded and written as one record at the end of the
//!    active segment, rolling over to a new segment when the active one is
//!    full; a failed write takes the fold back;
//! 3. `fdatasync` (in [`Durability::Sync`]) makes it durable before `append`
//!    returns; a failed sync poisons the session;
//! 4. the read indexes (batch index, surface node locations) are extended,
//!    and a checkpoint is written when enough events have accumulated.
//!
//! Sessions are loaded lazily, on first use: loading maps the segments,
//! reads the checkpoint, folds the events after it, truncates a torn tail
//! and closes an interrupted turn (see `format-spec.md`). The engine lives
//! in crate-private modules; this module is its public face.

#[cfg(feature = "archive")]
pub use crate::engine::{ArchiveOptions, ArchiveReport, ArchiveStats, EvictionPolicy};
pub use crate::engine::{
    Batches, Compressed, CompressionStatus, DamagedJournal, Derived, Durability, Error, Events,
    JournalSalvage, Options, Recovery, Result, SalvageCut, Salvaged, SessionStats, Store, Tail,
    Unaccounted, VerifyReport,
};
/// The errors of the file formats an [`Error`] carries (the format modules
/// themselves are crate-private).
pub use crate::format::{
    checkpoint::{CheckpointError, Section as CheckpointSection},
    codec::CodecError,
    manifest::ManifestError,
    segment::SegmentError,
};
/// The largest batch record the format holds (1 GiB): the upper bound of
/// [`Options::max_record`], and what every read accepts.
pub const MAX_RECORD_LIMIT: u32 = crate::format::segment::MAX_RECORD_LIMIT;
/// The `object_store` crate the archive is built on (`archive` feature):
/// build a backend with it for [`ArchiveOptions::new`], at the version this
/// crate uses.
#[cfg(feature = "archive")]
pub use object_store;
