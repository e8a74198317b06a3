//! Adapters for the harness's own storage formats. They use only the public
//! API of the session model (and, later, the store).

pub mod bounded;
pub mod harness;
pub mod jsonl;
pub mod root;
pub mod sqlite;
pub mod sqlite17;
pub mod sqlite17_write;
pub mod sqlite_export;
pub mod storing;
