//! The command line's arguments (clap): the global options and every
//! subcommand with its help text. `commands.rs` runs them.

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// Inspect harness session logs (file mode), or manage a sessionlog store
/// (store mode: `--store DIR` or `SESSIONLOG_STORE`).
#[derive(Debug, Parser)]
#[command(name = "sessionlog", version, about)]
pub(crate) struct Cli {
    /// Work on the store in DIR instead of on files (store mode).
    #[arg(long, global = true, env = "SESSIONLOG_STORE", value_name = "DIR")]
    pub(crate) store: Option<PathBuf>,
    /// Store mode: also keep the store in this object store (archive tier):
    /// `s3://bucket/prefix` (endpoint and credentials from the `AWS_*`
    /// variables), `file:///dir`.
    #[cfg(feature = "archive")]
    #[arg(long, global = true, env = "SESSIONLOG_ARCHIVE", value_name = "URL")]
    pub(crate) archive: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Validate a session file; print `OK` or the first violation (file
    /// mode only; in store mode use `verify`). Every complete line counts: a
    /// bad line or seq gap is reported even where a loader would treat it
    /// as a torn tail; only a final fragment without a newline is ignored.
    Check {
        /// Also check the relational invariants, known types and message
        /// shapes (many real logs fail these: a diagnostic, not the default).
        #[arg(long)]
        strict: bool,
        /// A harness session file (JSONL, plain or with packed rows).
        file: PathBuf,
    },
    /// Print the logical log as plain JSONL: the header, then one event per
    /// line (packed rows expanded).
    Cat {
        /// Print only the events from this seq on (the header is always
        /// printed).
        #[arg(long, value_name = "SEQ")]
        from: Option<u64>,
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Print a stored session's events, one per line, from a seq on; with
    /// `-f`, keep printing new ones as any process appends them (store mode
    /// only).
    Tail {
        /// Keep following: wait for new events (until interrupted, the
        /// output is closed, or the session is deleted).
        #[arg(short = 'f', long)]
        follow: bool,
        /// Start at this seq (default: the last `-n` events).
        #[arg(long, value_name = "SEQ", conflicts_with = "lines")]
        from: Option<u64>,
        /// Start with the last N events (default 10).
        #[arg(short = 'n', long = "lines", value_name = "N")]
        lines: Option<u64>,
        /// A session id.
        #[arg(value_name = "ID")]
        target: OsString,
    },
    /// Print the surface: nodes, replacement history and replaceGeneration.
    Surface {
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Print the derived message history, one JSON message per line.
    Derive {
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Close an interrupted last turn and print the closers, one per line.
    /// File mode needs --dry-run; in store mode the closers are appended
    /// durably unless --dry-run is given.
    Repair {
        /// Only print the closers, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// A harness session file, or a session id in store mode.
        #[arg(value_name = "FILE|ID")]
        target: OsString,
    },
    /// Store mode: import harness sessions: session files (`.jsonl`, plain
    /// or with packed rows, or `.jsonl.zstd`), directories (a folder's own
    /// `*.jsonl` / `*.jsonl.zstd` files and harness roots), and SQLite
    /// databases of schema 4 or 17 (`.db`).
    Import {
        /// Store the session under this id instead of the header's (only
        /// with a single session file).
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Store each file's session under the file's name without
        /// `.jsonl` / `.jsonl.zstd` (`foo.jsonl.zstd` is stored as `foo`),
        /// so files that share a session id import side by side.
        #[arg(long, conflicts_with = "id")]
        id_from_filename: bool,
        /// Replace sessions that already exist (otherwise an error).
        #[arg(long)]
        replace: bool,
        /// Keep an unclosed last turn open instead of repairing it.
        #[arg(long)]
        no_repair: bool,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Where no bar is drawn (stderr is not a terminal: a log, CI),
        /// print the progress as plain lines on stderr: one each time
        /// another tenth of a file's bytes or of a database's sessions is
        /// read.
        #[arg(long, conflicts_with = "quiet")]
        progress: bool,
        /// Session files, folders of them, harness roots or `.db` files.
        #[arg(required = true, value_name = "PATH")]
        files: Vec<PathBuf>,
    },
    /// Store mode: export sessions as harness JSONL (plain, packed rows or
    /// zstd) to stdout, a file, a harness root directory (the current
    /// layout: `--<slug>--/<id>/session.jsonl.zstd`, packed, one zstd frame
    /// per turn), or a SQLite database (`--to FILE.db`, schema 17 unless
    /// `--schema 4`). Files are written to a temporary name, synced and
    /// renamed into place.
    Export {
        /// The sessions to export.
        #[arg(value_name = "ID", required_unless_present = "all")]
        ids: Vec<String>,
        /// Export every session.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// Where: a file (one session only), a directory (the harness root
        /// layout), a `.db` file, or `-` for standard output (the default).
        #[arg(long, value_name = "FILE|DIR|-")]
        to: Option<PathBuf>,
        /// Pack runs of 3+ delta chunks into rows, as the harness writes.
        #[arg(long)]
        pack_chunks: bool,
        /// Write Zstandard logs (a header frame, then one frame per turn).
        #[arg(long)]
        zstd: bool,
        /// The SQLite schema version of a `.db` export: 17 (the harness's
        /// current layout, the default) or 4 (the older layout).
        #[arg(long, value_name = "VERSION")]
        schema: Option<i64>,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
        /// Export what can be read of a damaged session (one, as plain
        /// JSONL): the whole batches before the damage; stderr says where
        /// it was cut and why. Never the default: a damaged session
        /// otherwise fails with the file and offset.
        #[arg(long)]
        salvage: bool,
    },
    /// Store mode: list the sessions, one per line: id, createdAt,
    /// parentSession (`-` when none), tab separated, sorted by id; control
    /// characters and backslashes in ids are escaped as in JSON. Entries of
    /// `sessions/` that are not readable sessions are counted in a warning
    /// on stderr (`verify` lists them).
    Ls {
        /// Print a JSON array of the session headers instead.
        #[arg(long)]
        json: bool,
    },
    /// Store mode: check every checksum of one session (or all) and fold it
    /// again; print `OK ID events=N segments=S bytes=B` per session. Without
    /// an id, also report what the store keeps but cannot read:
    /// `UNACCOUNTED PATH: REASON` for an entry of `sessions/` that is not a
    /// readable session (a damaged `HEADER`, ...), `DAMAGED PATH: REASON`
    /// for a journal file replay refuses; each counts as a failure.
    Verify {
        /// A session id (default: every session).
        id: Option<String>,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Store mode: write back what can be read of every damaged journal
    /// file whose writer is gone (`verify` lists them; while one is in
    /// `journal/`, no stored session can be taken for writing), then move
    /// it to `journal/damaged/`, where it is kept. Prints what was written
    /// back and how much could not be read.
    SalvageJournals,
    /// Store mode: fork SRC into a new session CHILD seeded with SRC's first
    /// events; the child ends its seed with `session/end-seed`.
    Fork {
        /// The session to fork.
        src: String,
        /// The new session's id.
        child: String,
        /// Seed the child with the first N events (seqs 0..N-1); default:
        /// all of SRC.
        #[arg(long, value_name = "N")]
        at: Option<u64>,
    },
    /// Store mode: remove a session.
    Rm {
        /// The session id.
        id: String,
    },
    /// Store mode: sizes of one session (or all, plus a total line; entries
    /// of `sessions/` that are not readable sessions are counted in a
    /// warning on stderr).
    Stats {
        /// A session id (default: every session).
        id: Option<String>,
        /// Print a JSON array of per-session objects instead.
        #[arg(long)]
        json: bool,
    },
    /// Store mode: store the sealed segments of one session (or all) as
    /// compressed images now (`format-spec.md` section 3.5); the store is
    /// raised to the newest format version first (5), which older builds
    /// refuse. Prints
    /// what each session saved.
    Compress {
        /// Seal each session's active segment first, so its whole log is
        /// compressed (for finished or idle sessions; the next append
        /// starts a new segment).
        #[arg(long)]
        seal: bool,
        /// A session id (default: every session).
        id: Option<String>,
    },
    /// Store mode with `--archive`: take session ID over from the host that
    /// holds it (a host that is gone for good).
    #[cfg(feature = "archive")]
    TakeOver {
        /// The session id.
        id: String,
    },
    /// Store mode with `--archive`: upload everything now (active segments
    /// included) and apply the eviction policy.
    #[cfg(feature = "archive")]
    ArchiveSync,
    /// Run the whole job end to end in a fresh store: generate sessions,
    /// append, crash in a tool call, reopen and repair, derive, export.
    Demo {
        /// The store directory to create: new or empty (a store an earlier demo
        /// made there is replaced; anything else is refused).
        #[arg(default_value = "demo-store")]
        dir: PathBuf,
    },
}
