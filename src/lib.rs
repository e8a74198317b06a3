//! sessionlog: a durable embedded storage engine for event-sourced LLM agent
//! sessions.
//!
//! The pure session model knows nothing of files:
//! [`event`] (the envelope), [`header`], [`surface`] (the message index),
//! [`derive`] (the message projection), [`repair`] (closing an interrupted
//! turn), [`invariants`] (strict mode) and [`session`] (the fold that ties
//! them together). [`adapters`] read and write the harness's own formats.
#![warn(missing_docs)]

pub mod adapters;
pub mod checkpoint;
pub mod codec;
pub mod derive;
mod engine;
pub mod event;
pub mod fsutil;
pub mod header;
pub mod invariants;
pub mod json;
pub mod lineage;
pub mod manifest;
pub mod repair;
pub mod sample;
pub mod segment;
pub mod session;
pub mod store;
pub mod surface;
pub mod vfs;
pub mod violation;

/// The README's Rust examples, compiled and run as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
