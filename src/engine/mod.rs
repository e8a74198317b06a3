//! The engine: what ties the pure model and the byte formats to files.
//!
//! [`registry`] owns the sessions directory (which sessions exist, and the
//! atomic renames that change that set).

pub(crate) mod registry;
