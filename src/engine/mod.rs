//! The engine: what ties the pure model (`session`, `surface`, `derive`,
//! `repair`) and the byte formats (`segment`, `codec`, `checkpoint`,
//! `manifest`, `lineage`) to files, through the `Vfs`.
//!
//! One concern a module:
//! - [`registry`]: the sessions directory: which sessions exist, and the
//!   atomic renames that change that set;
//! - [`handle`]: the [`Store`] handle: open, flush, close, group commit;
//!   [`loaded`]: its map of loaded sessions (load on first use, refresh,
//!   evict);
//! - [`locks`]: per-session writer locks, shared by every process;
//! - [`session`]: one loaded session and its read indexes;
//! - [`load`]: loading and recovering a session from its files;
//!   [`ckfile`]: where its checkpoint lives (a file, or its `HEADER`);
//! - [`write`]: the append path and the store-level changes built on it;
//! - [`publish`]: building a whole session in staging and publishing it
//!   (import, fork);
//! - [`read`]: events, surface, derive, verify and stats;
//! - [`events`]: decoding a session batch by batch (collected or streamed);
//! - [`tail`]: following a session as writers append to it;
//! - [`journal`]: the store-wide journal of one handle (group commit of
//!   durable appends across sessions), [`replay`]: replaying the
//!   journals of handles that are gone, and [`journal_salvage`]: reporting
//!   and salvaging the journal files replay refuses;
//! - [`compress`]: storing sealed segments as compressed images, in a
//!   background thread; [`tmpfile`]: the temporary files it and the
//!   archive's fetches write before a rename;
//! - [`periodic`]: the background threads (group commit, archive uploads);
//! - [`options`], [`error`].
//!
//! Data flows one way: append -> record -> file -> sync -> index. Loading
//! returns what it found (the closers an interrupted turn needs included);
//! it does not call the write path.

// The archive tier (issue 17): the module with the `archive` feature, its
// hooks as no-ops without it.
#[cfg(feature = "archive")]
pub(crate) mod archive;
#[cfg(feature = "archive")]
pub(crate) use archive::hooks;
pub(crate) mod ckfile;
pub(crate) mod compress;
pub(crate) mod error;
pub(crate) mod events;
pub(crate) mod handle;
#[cfg(not(feature = "archive"))]
#[path = "archive/off.rs"]
pub(crate) mod hooks;
pub(crate) mod journal;
pub(crate) mod journal_salvage;
pub(crate) mod load;
mod loaded;
pub(crate) mod locks;
pub(crate) mod options;
mod packer;
pub(crate) mod periodic;
pub(crate) mod publish;
pub(crate) mod read;
pub(crate) mod registry;
pub(crate) mod remote;
pub(crate) mod replay;
pub(crate) mod salvage;
pub(crate) mod segfiles;
pub(crate) mod session;
pub(crate) mod tail;
pub(crate) mod tmpfile;
pub(crate) mod write;

#[cfg(feature = "archive")]
pub use archive::{ArchiveOptions, ArchiveReport, ArchiveStats, EvictionPolicy};
pub use compress::{Compressed, CompressionStatus};
pub use error::{Error, Result};
pub use events::{Batches, Events};
pub use handle::Store;
pub use journal_salvage::{DamagedJournal, JournalSalvage};
pub use load::Recovery;
pub use options::{Durability, Options};
pub use read::{Derived, SessionStats, VerifyReport};
pub use registry::Unaccounted;
pub use salvage::{SalvageCut, Salvaged};
pub use tail::Tail;
