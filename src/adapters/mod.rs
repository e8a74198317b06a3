//! Adapters for the harness's own storage formats. They use only the public
//! API of the session model and the store.

pub mod jsonl;
pub mod sqlite;
