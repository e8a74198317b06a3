//! Adapters for the harness's own storage formats. They use only the public
//! API of the session model (and, later, the store).

pub mod bounded;
pub mod harness;
pub mod jsonl;
mod progress;
pub mod root;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlite")]
pub mod sqlite17;
#[cfg(feature = "sqlite")]
pub mod sqlite17_write;
#[cfg(feature = "sqlite")]
pub mod sqlite_export;
#[cfg(feature = "sqlite")]
mod sqlite_import;
pub mod storing;

pub(crate) use progress::Reporter;
pub use progress::{Progress, REPORT_BYTES, REPORT_EVENTS, Stage};
