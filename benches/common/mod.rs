//! What the store benchmarks (`reopen`, `store`) share: the session id, the
//! smoke switch, the options, building a one-session store with its
//! checkpoint, the timed reopen, and the Criterion configuration.
//!
//! A bench with `harness = false` is a plain binary crate, so each one takes
//! this file in with `mod common;` (a directory module: Cargo does not take
//! `benches/common/mod.rs` for a bench target of its own, as it would
//! `benches/common.rs`).
#![allow(dead_code)] // each bench uses a different part

use criterion::Criterion;
use sessionlog::checkpoint::CHECKPOINT_FILE;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Durability, Options, Store};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The one session of a built store.
pub const ID: &str = "bench-session";

/// `SESSIONLOG_BENCH_SMOKE=1`: tiny sizes and a short measurement, for CI.
pub fn smoke() -> bool {
    std::env::var("SESSIONLOG_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

/// The store options of the benches: the default, with the checkpoint
/// always in its own `CHECKPOINT` file (a small session's would go into
/// its `HEADER`), so a bench can delete and restore it by its path.
pub fn options(durability: Durability) -> Options {
    Options {
        durability,
        embed_checkpoints: false,
        ..Options::default()
    }
}

/// The directory of session `ID` in the store in `dir`.
pub fn session_dir(dir: &Path) -> PathBuf {
    dir.join("sessions")
        .join(sessionlog::fsutil::encode_session_dir_name(ID).expect("valid session id"))
}

/// Builds a new store in `dir` holding session `ID` (created at
/// `created_at`): `fill` appends its events, with `Durability::None`; then
/// `close()` writes the checkpoint. Returns the checkpoint's path.
pub fn build_store(dir: &Path, created_at: u64, fill: impl FnOnce(&Store)) -> PathBuf {
    let store = Store::open(dir, options(Durability::None)).expect("open a new store");
    store
        .create(SessionHeader::new(ID, created_at))
        .expect("create");
    fill(&store);
    store.close().expect("close writes the checkpoint");
    let checkpoint = session_dir(dir).join(CHECKPOINT_FILE);
    assert!(checkpoint.exists(), "close wrote the checkpoint");
    checkpoint
}

/// Deletes the checkpoint at `path`, if it is there.
pub fn delete_checkpoint(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("delete the checkpoint: {e}"),
    }
}

/// `Store::open` + the first access to the session (the lazy load) + drop.
pub fn reopen_once(dir: &Path) {
    let store = Store::open(dir, options(Durability::None)).expect("reopen");
    black_box(store.read_from(ID, u64::MAX).expect("load the session"));
    drop(black_box(store));
}

/// Criterion with the given warm-up and measurement times, in seconds.
pub fn config((warm, measure): (f64, f64)) -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs_f64(warm))
        .measurement_time(Duration::from_secs_f64(measure))
}
