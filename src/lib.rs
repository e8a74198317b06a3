//! sessionlog: a durable embedded storage engine for event-sourced LLM agent
//! sessions.
//!
//! Start at [`store::Store`]: open a store, append batches of events to
//! sessions, read them back, derive the message history, follow a session
//! as other processes write it.
//!
//! The crate is in layers, data flowing one way (append -> record -> file
//! -> sync -> index):
//! - [`model`]: the pure session model, knowing nothing of files:
//!   [`event`] (the envelope), [`header`], [`surface`] (the message index),
//!   [`derive`](mod@derive) (the message projection), [`repair`] (closing an
//!   interrupted turn), [`invariants`] (strict mode) and [`session`] (the
//!   fold that ties them together);
//! - [`format`](mod@format): the bytes of each file ([`segment`], [`codec`],
//!   [`checkpoint`], [`manifest`], [`lineage`]);
//! - [`io`]: the file system ([`vfs`]) the engine writes through;
//! - the engine (crate-private), whose public face is [`store`];
//! - [`adapters`]: the harness's own formats, over the public API.
#![warn(missing_docs)]

pub mod adapters;
mod engine;
pub mod sample;
pub mod store;

/// The pure session model: the rules of `harness-domain.md`, one place
/// each, knowing nothing of files or bytes.
pub mod model {
    pub mod build;
    pub mod derive;
    pub mod event;
    pub mod header;
    pub mod invariants;
    pub mod json;
    pub mod repair;
    pub mod session;
    pub mod surface;
    pub mod violation;
}
pub use model::{
    build, derive, event, header, invariants, json, repair, session, surface, violation,
};

/// The bytes of every file the store writes (see `format-spec.md`): they
/// know bytes, not JSON events.
pub mod format {
    pub(crate) mod bytes;
    pub mod checkpoint;
    pub mod codec;
    pub mod lineage;
    pub mod manifest;
    pub mod segment;
    pub mod varint;
}
pub use format::{checkpoint, codec, lineage, manifest, segment};

/// The file system the engine writes through (and the helpers on top).
pub mod io {
    pub mod fsutil;
    pub mod vfs;
}
pub use io::{fsutil, vfs};

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
