//! sessionlog: a durable embedded storage engine for event-sourced LLM agent
//! sessions.
//!
//! Start at [`Store`](store::Store): open a store, append batches of events
//! to sessions, read them back, derive the message history, follow a
//! session as other processes write it.
//!
//! ```
//! use sessionlog::build;
//! use sessionlog::event::OwnedEvent;
//! use sessionlog::header::SessionHeader;
//! use sessionlog::store::{Options, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("store"), Options::default())?;
//! store.create(SessionHeader::new("s1", 0))?;
//!
//! // One turn, built with the typed builders (no JSON by hand). An append
//! // is one atomic, durable batch; a batch breaking a rule of the session
//! // model is rejected whole.
//! let turn: Vec<OwnedEvent> = vec![
//!     build::turn_start(0, 1, 1),
//!     build::user_message(1, 1, "hi"),
//!     build::step_start(2, 2, 1, 1),
//!     build::text_chunk(3, 2, 1, 1, "Hello!"),
//!     build::assistant_message(4, 3, 1, 1, "Hello!", &[], &[3]),
//!     build::step_end(5, 3, 1, 1),
//!     build::turn_end(6, 3, 1),
//! ];
//! let batch: Vec<_> = turn.iter().map(OwnedEvent::borrowed).collect();
//! store.append("s1", &batch)?;
//!
//! // The message history the model sees, derived from the log.
//! let derived = store.derive("s1")?;
//! let messages: Vec<String> = derived.messages().map(|m| m.to_json()).collect();
//! assert_eq!(messages.len(), 2);
//! assert!(messages[0].contains(r#""role":"user""#));
//! assert!(messages[1].contains("Hello!"));
//!
//! // Reopened, the store has every acknowledged event.
//! store.close()?;
//! let store = Store::open_read_only(dir.path().join("store"))?;
//! assert_eq!(store.load("s1")?.1.len(), 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate is in layers, data flowing one way (append -> record -> file
//! -> sync -> index):
//! - [`model`]: the pure session model, knowing nothing of files:
//!   [`event`] (the envelope), [`header`], [`build`] (typed event
//!   builders), [`surface`] (the message index), [`derive`](mod@derive)
//!   (the message projection), [`repair`] (closing an interrupted turn),
//!   [`invariants`] (strict mode) and [`session`] (the fold that ties them
//!   together);
//! - the file formats (`format`: segment, codec, checkpoint, manifest,
//!   a session's `HEADER`, lineage, journal) and the file system the engine writes through (`io`: vfs),
//!   crate-private (the unstable `internals` feature makes them public, for
//!   this crate's tests, fuzzing, benches and fault injection); their
//!   errors, which a [`store::Error`] carries, are public in [`store`];
//! - the engine (crate-private), whose public face is [`store`];
//! - [`adapters`]: the harness's own formats (JSONL, SQLite), over the
//!   public API;
//! - [`sample`]: a generator of realistic sessions, for demos and
//!   benchmarks.
#![warn(missing_docs)]

pub mod adapters;
mod engine;
pub mod sample;
pub mod store;

/// The pure session model: the rules of the harness's session domain (its
/// `harness-domain.md`, kept beside this repository in `../shared/docs`, not
/// in it), one place each, knowing nothing of files or bytes.
pub mod model {
    pub mod build;
    pub mod derive;
    pub mod event;
    pub mod header;
    pub mod invariants;
    pub mod json;
    pub(crate) mod payload;
    pub mod repair;
    pub mod session;
    pub mod surface;
    pub mod violation;
}
pub use model::{
    build, derive, event, header, invariants, json, repair, session, surface, violation,
};

// Everything about bytes on disk (`format`) and the file-system seam (`io`)
// is crate-private: its API changes with the format. The `internals`
// feature (unstable, for the crate's own tests, fuzzing, benches and fault
// injection) makes it public, and the `internals!` macro below declares
// each module once, public with the feature and crate-private without it.
macro_rules! internals {
    ($(#[$attr:meta])* mod $name:ident { $($body:tt)* } use { $($reexport:ident),* $(,)? }) => {
        $(#[$attr])*
        #[cfg(feature = "internals")]
        pub mod $name { $($body)* }
        $(#[$attr])*
        #[cfg(not(feature = "internals"))]
        pub(crate) mod $name { $($body)* }
        #[cfg(feature = "internals")]
        pub use $name::{$($reexport),*};
        #[cfg(not(feature = "internals"))]
        pub(crate) use $name::{$($reexport),*};
    };
}

internals! {
    /// The bytes of every file the store writes (see `format-spec.md` at the
    /// repository's root): they know bytes, not JSON events. Public only
    /// with the unstable `internals` feature.
    mod format {
        pub(crate) mod bytes;
        pub mod checkpoint;
        pub mod codec;
        pub mod headerfile;
        pub mod journal;
        pub mod lineage;
        pub mod manifest;
        pub mod segment;
        pub mod varint;
    }
    use { checkpoint, codec, headerfile, journal, lineage, manifest, segment }
}

internals! {
    /// The file system the engine writes through (and the helpers on top).
    /// Public only with the unstable `internals` feature.
    mod io {
        pub mod fsutil;
        pub mod vfs;
    }
    use { fsutil, vfs }
}

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
