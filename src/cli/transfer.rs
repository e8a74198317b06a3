//! Store-mode `import` and `export`: sessions in and out of the harness's
//! formats (JSONL plain, packed or zstd, harness roots in both layouts,
//! SQLite schema 4 and 17), with progress bars on a terminal.

use crate::failure::{
    Failure, escape_field, io_err, open_read_only, open_writer, plural, store_err,
};
use crate::progress::{ImportProgress, Progress};
use sessionlog::adapters::harness::{self, ExportOptions, ImportError, ImportOptions};
use sessionlog::adapters::{sqlite, sqlite_export, sqlite17};
use sessionlog::store;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `import` was asked to do.
pub struct ImportArgs {
    /// Store a single file's session under this id.
    pub id: Option<String>,
    /// Store each file's session under its file name's stem.
    pub id_from_filename: bool,
    /// Replace sessions that already exist.
    pub replace: bool,
    /// Keep an unclosed last turn open.
    pub no_repair: bool,
    /// No progress bar.
    pub quiet: bool,
    /// Progress as plain lines on stderr when no bar is drawn.
    pub progress: bool,
}

/// One thing to import.
enum Source {
    Jsonl(PathBuf),
    Db(PathBuf),
}

fn is_db(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "db" || e == "sqlite")
}

/// Whether a file name is a session file's: `*.jsonl` or `*.jsonl.zstd`.
fn is_session_file_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.zstd"))
}

/// The session files directly in a plain folder (`*.jsonl`,
/// `*.jsonl.zstd`; symbolic links to files included).
fn plain_session_files(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let mut found = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| Failure::Io(format!("{}: {e}", dir.display())))?;
    for entry in entries {
        let path = entry
            .map_err(|e| Failure::Io(format!("{}: {e}", dir.display())))?
            .path();
        if is_session_file_name(&path) && path.is_file() {
            found.push(path);
        }
    }
    Ok(found)
}

/// Expands the paths: a directory is a plain folder of session files
/// (its own `*.jsonl` and `*.jsonl.zstd`) and a harness root (every session
/// file in any of its layouts), all in path order; a `.db` file a SQLite
/// database (schema 4 or 17), anything else one session file.
fn sources(paths: &[PathBuf]) -> Result<Vec<Source>, Failure> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = harness::find_sessions(p)
                .map_err(|e| Failure::Io(format!("{}: {e}", p.display())))?;
            // A session directory with both logs: the root walk takes the
            // compressed one; the plain one must not be left out unsaid.
            let shadowed = harness::shadowed_sessions(p)
                .map_err(|e| Failure::Io(format!("{}: {e}", p.display())))?;
            if let Some(first) = shadowed.first() {
                return Err(Failure::Invalid(format!(
                    "{}: {} session director{} hold{} both session.jsonl.zstd and session.jsonl (the first: {}); importing the directory would leave the plain log out, and the harness refuses such a root; nothing was imported\nhint: import the files by name (`import FILE...`, with `--id` or `--id-from-filename` if they share an id)",
                    p.display(),
                    shadowed.len(),
                    if shadowed.len() == 1 { "y" } else { "ies" },
                    if shadowed.len() == 1 { "s" } else { "" },
                    first.parent().unwrap_or(first).display()
                )));
            }
            found.extend(plain_session_files(p)?);
            found.sort();
            found.dedup();
            if found.is_empty() {
                return Err(Failure::Invalid(format!(
                    "{}: no session files found (looked for {dir}/*.jsonl, {dir}/*.jsonl.zstd and the harness root layouts cwd-*/ID.jsonl, _no-cwd/ID.jsonl and PROJECT/ID/session.jsonl[.zstd]); name the files instead: `import FILE...`",
                    p.display(),
                    dir = p.display()
                )));
            }
            out.extend(found.into_iter().map(Source::Jsonl));
        } else if is_db(p) {
            out.push(Source::Db(p.clone()));
        } else {
            out.push(Source::Jsonl(p.clone()));
        }
    }
    Ok(out)
}

/// The id `--id-from-filename` gives a file's session: its name without
/// `.zstd` / `.zst`, then without `.jsonl` / `.json`.
fn id_from_file_name(path: &Path) -> Result<String, Failure> {
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        Failure::Usage(format!(
            "{}: --id-from-filename needs a UTF-8 file name",
            path.display()
        ))
    })?;
    let stem = name
        .strip_suffix(".zstd")
        .or_else(|| name.strip_suffix(".zst"))
        .unwrap_or(name);
    let stem = stem
        .strip_suffix(".jsonl")
        .or_else(|| stem.strip_suffix(".json"))
        .unwrap_or(stem);
    Ok(stem.to_owned())
}

/// What to do when an imported session's id is already stored.
const EXISTS_HINT: &str = "hint: `import --replace` overwrites it; `import --id ID FILE` (one file) or `import --id-from-filename` (the file's name is the id) stores it under another id";

fn import_error(e: ImportError) -> (Failure, bool) {
    match e {
        ImportError::Exists { path, id } => (
            Failure::Invalid(format!(
                "{}: session {id:?} already exists\n{EXISTS_HINT}",
                path.display()
            )),
            false,
        ),
        ImportError::Io { .. } => (Failure::Io(e.to_string()), false),
        // One session another writer holds: the other sources go on.
        ImportError::Store { ref source, .. }
            if matches!(**source, store::Error::Locked { .. }) =>
        {
            (
                Failure::Io(format!(
                    "{e}\nhint: another process (or handle) is writing that session; the other sources are imported, and this one can be once that writer is done"
                )),
                false,
            )
        }
        ImportError::Store { ref source, .. }
            if matches!(
                **source,
                store::Error::Io { .. }
                    | store::Error::Poisoned(_)
                    | store::Error::Manifest(_)
                    | store::Error::Checkpoint { .. }
            ) =>
        {
            // The store itself failed: later files would fail too.
            (Failure::Io(e.to_string()), true)
        }
        _ => (Failure::Invalid(e.to_string()), false),
    }
}

/// `sessionlog --store DIR import PATH...`.
pub fn import(
    dir: &Path,
    paths: &[PathBuf],
    args: ImportArgs,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let sources = sources(paths)?;
    if args.id.is_some() && (sources.len() != 1 || matches!(sources[0], Source::Db(_))) {
        return Err(Failure::Usage(
            "`import --id ID` takes exactly one session file".into(),
        ));
    }
    // The id of each session file, decided before anything is written.
    let mut ids = Vec::with_capacity(sources.len());
    for source in &sources {
        ids.push(match source {
            Source::Jsonl(path) if args.id_from_filename => Some(id_from_file_name(path)?),
            Source::Jsonl(_) => args.id.clone(),
            Source::Db(path) if args.id_from_filename => {
                return Err(Failure::Usage(format!(
                    "{}: --id-from-filename takes session files; a database's sessions keep their ids",
                    path.display()
                )));
            }
            Source::Db(_) => None,
        });
    }
    let store = open_writer(dir, true)?;
    let mut progress = ImportProgress::new(sources.len() as u64, args.quiet, args.progress);
    let mut worst: Option<Failure> = None;
    let mut failed = 0usize;
    let mut note = |f: Failure, worst: &mut Option<Failure>| {
        eprintln!("error: {}", f.message());
        failed += 1;
        if worst.as_ref().is_none_or(|w| w.code() < f.code()) {
            *worst = Some(f);
        }
    };
    for (source, id) in sources.iter().zip(ids) {
        let (Source::Jsonl(path) | Source::Db(path)) = source;
        progress.start(path);
        match source {
            Source::Jsonl(path) => {
                let opts = ImportOptions {
                    replace: args.replace,
                    repair: !args.no_repair,
                    id,
                };
                match harness::import_file_with_progress(&store, path, opts, &mut |p| {
                    progress.observe(p)
                }) {
                    Ok(r) => {
                        if let Some(t) = &r.torn {
                            eprintln!(
                                "note: {}: torn tail dropped from line {}: {}",
                                path.display(),
                                t.line,
                                t.reason
                            );
                        }
                        if let Some(t) = &r.torn_frame {
                            eprintln!("note: {}: torn final zstd frame: {t}", path.display());
                        }
                        let line = if r.left_open {
                            format!(
                                "imported {}: {} (last turn left open)",
                                escape_field(&r.id),
                                plural(r.events, "event")
                            )
                        } else {
                            format!(
                                "imported {}: {} ({})",
                                escape_field(&r.id),
                                plural(r.events, "event"),
                                plural(r.closers.len() as u64, "closer")
                            )
                        };
                        progress.println(out, &line)?;
                    }
                    Err(e) => {
                        let (f, fatal) = import_error(e);
                        note(f, &mut worst);
                        if fatal {
                            progress.finish();
                            let _ = store.close();
                            return Err(Failure::Io(format!(
                                "import stopped after {}",
                                plural(failed as u64, "failed source")
                            )));
                        }
                    }
                }
            }
            Source::Db(path) => {
                match sqlite::import_db_with_progress(&store, path, args.replace, &mut |p| {
                    progress.observe(p)
                }) {
                    Ok(report) => {
                        for s in &report.sessions {
                            if let Some(seq) = s.torn_from {
                                eprintln!(
                                    "note: {}: session {}: torn physical tail dropped from seq {seq}",
                                    path.display(),
                                    escape_field(&s.id)
                                );
                            }
                            let line = format!(
                                "imported {}: {} ({}) from {}",
                                escape_field(&s.id),
                                plural(s.events, "event"),
                                plural(s.closers, "closer"),
                                path.display()
                            );
                            progress.println(out, &line)?;
                        }
                    }
                    Err(e) => {
                        let m = match e {
                            sqlite::SqliteError::ExistsInStore { .. } => {
                                format!("{e}\nhint: `import --replace` overwrites it")
                            }
                            e => e.to_string(),
                        };
                        note(Failure::Invalid(m), &mut worst);
                    }
                }
            }
        }
    }
    progress.finish();
    store.close().map_err(store_err)?;
    match worst {
        None => Ok(()),
        Some(f) => {
            let m = format!(
                "{failed} of {} not imported",
                plural(sources.len() as u64, "source")
            );
            Err(match f {
                Failure::Io(_) => Failure::Io(m),
                _ => Failure::Invalid(m),
            })
        }
    }
}

/// What `export` was asked to do.
pub struct ExportArgs {
    /// The sessions (empty with `all`).
    pub ids: Vec<String>,
    /// Every session.
    pub all: bool,
    /// A file, a `.db` file, a directory (a harness root), or `-`.
    pub to: Option<PathBuf>,
    /// Pack chunk runs into rows.
    pub pack_chunks: bool,
    /// Zstandard logs.
    pub zstd: bool,
    /// The schema version of a `.db` export (default 17).
    pub schema: Option<i64>,
    /// No progress bar.
    pub quiet: bool,
    /// Export the readable prefix of a damaged session (one session, JSONL).
    pub salvage: bool,
}

/// Whether a path that does not exist yet names a session file by its
/// extension (`.jsonl`, `.json`, `.zstd`, `.zst`) rather than a directory.
fn names_a_file(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "jsonl" || e == "json" || e == "zstd" || e == "zst")
}

/// The error of a root export stopped by `e` at session `id`, saying what
/// was written before it: each session listed above as exported is whole
/// (written beside its name, then renamed), the others were not written.
fn root_export_err(
    e: harness::ExportError,
    id: &str,
    root: &Path,
    done: usize,
    n: usize,
) -> Failure {
    let written = format!(
        "{} of {} exported into {} before it (each listed above, whole); it and the rest were not written",
        done,
        plural(n as u64, "session"),
        root.display()
    );
    // What was written goes with what failed, before the hint.
    let with_written = |m: &str| match m.split_once("\nhint: ") {
        Some((what, hint)) => format!("{what}\n{written}\nhint: {hint}"),
        None => format!("{m}\n{written}"),
    };
    match e {
        harness::ExportError::Store(e) => match store_err(e) {
            Failure::Io(m) => Failure::Io(with_written(&m)),
            f => Failure::Invalid(with_written(f.message())),
        },
        harness::ExportError::Io(e) => Failure::Io(format!(
            "session {:?}: writing the export into {}: {e}\n{written}",
            id,
            root.display()
        )),
        e => Failure::Invalid(format!("{e}\n{written}")),
    }
}

/// Checks, before anything is written, that every session's path in the
/// harness root `root` is one the file system takes (the harness's layout
/// puts the escaped id in one file name), that the root holds no log of a
/// session the export would replace or duplicate (a log with exactly the
/// export's bytes aside), and no log of the other encoding: any of these
/// stops the export, naming every such session, with nothing written
/// rather than some sessions written and the rest not.
fn check_root_paths(
    store: &store::Store,
    ids: &[String],
    root: &Path,
    opts: ExportOptions,
) -> Result<(), Failure> {
    if let Some(other) = harness::other_encoding_in_root(root, opts.zstd)
        .map_err(|e| Failure::Io(format!("{}: {e}", root.display())))?
    {
        return Err(Failure::Invalid(format!(
            "{}: the root holds logs in the other encoding ({}); the harness refuses a root holding both, so nothing was exported\nhint: export into another root",
            root.display(),
            other.display()
        )));
    }
    let mut refused = Vec::new();
    let mut exists = false;
    for id in ids {
        match harness::check_export_to_root(store, id, root, opts) {
            Ok(()) => {}
            Err(harness::ExportError::Store(e)) => return Err(store_err(e)),
            Err(harness::ExportError::Io(e)) => {
                return Err(Failure::Io(format!("{}: {e}", root.display())));
            }
            Err(e) => {
                exists |= matches!(e, harness::ExportError::Exists { .. });
                refused.push(e.to_string());
            }
        }
    }
    let hint = if exists {
        "hint: an export never replaces a log in a harness root: remove that log first, or export into another root"
    } else {
        "hint: export such a session to a file (`export ID --to FILE.jsonl`) or a database (`--to FILE.db`), which hold any id"
    };
    match refused.as_slice() {
        [] => Ok(()),
        [one] => Err(Failure::Invalid(format!(
            "{one}; nothing was exported\n{hint}"
        ))),
        many => {
            for m in many {
                eprintln!("error: {m}");
            }
            Err(Failure::Invalid(format!(
                "{} of {} cannot be exported into a harness root (listed above); nothing was exported\n{hint}",
                many.len(),
                plural(ids.len() as u64, "session")
            )))
        }
    }
}

/// `sessionlog --store DIR export ID... | --all [--to FILE|DIR|-]`.
pub fn export(dir: &Path, args: ExportArgs, out: &mut impl Write) -> Result<(), Failure> {
    let store = open_read_only(dir)?;
    if args.salvage {
        return salvage(&store, args, out);
    }
    // With --all, also the entries of sessions/ that are not readable
    // sessions (a damaged HEADER): they cannot be exported, and a
    // migration must not lose them without a word.
    let (ids, unaccounted) = match (args.all, args.ids.is_empty()) {
        (true, true) => {
            let ids: Vec<String> = store
                .list()
                .map_err(store_err)?
                .into_iter()
                .map(|h| h.id)
                .collect();
            (ids, store.unaccounted().map_err(store_err)?)
        }
        (false, false) => (args.ids.clone(), Vec::new()),
        _ => {
            return Err(Failure::Usage(
                "name the sessions to export, or --all (not both)".into(),
            ));
        }
    };
    if args.schema.is_some() && !args.to.as_deref().is_some_and(is_db) {
        return Err(Failure::Usage(
            "--schema applies to a SQLite export (--to FILE.db)".into(),
        ));
    }
    let opts = ExportOptions {
        pack_chunks: args.pack_chunks,
        zstd: args.zstd,
    };
    let to = args.to.filter(|p| p.as_os_str() != "-");
    // `--all` goes to a directory whatever the store holds today, so the
    // same command writes the same kind of output as the store grows;
    // several named sessions do too.
    let to_dir = to
        .as_deref()
        .is_some_and(|p| !is_db(p) && (p.is_dir() || args.all || ids.len() > 1));
    if let Some(path) = &to {
        // A path naming a file is refused, never made a directory.
        if to_dir && !path.is_dir() && (path.exists() || names_a_file(path)) {
            let what = if path.exists() {
                "file"
            } else {
                "session file"
            };
            return Err(Failure::Usage(if args.all {
                format!(
                    "{}: `export --all` writes a directory or a .db, never one {what}: give a directory (`--to DIR` writes a harness root, created if missing) or name one session (`export ID --to FILE`)",
                    path.display()
                )
            } else {
                format!(
                    "{}: {} do not fit in one {what}: give a directory (`--to DIR` writes a harness root, created if missing) or one session (`export ID --to FILE`)",
                    path.display(),
                    plural(ids.len() as u64, "session"),
                )
            }));
        }
        if ids.is_empty() && unaccounted.is_empty() && !is_db(path) && !path.is_dir() {
            return Err(Failure::Invalid(
                "the store holds no sessions to export".into(),
            ));
        }
    }
    let mut progress = Progress::new("export", ids.len() as u64, args.quiet || to.is_none());
    let export_err = |e: harness::ExportError| match e {
        harness::ExportError::Store(e) => store_err(e),
        harness::ExportError::Io(e) => Failure::Io(format!("writing the export: {e}")),
        e => Failure::Invalid(e.to_string()),
    };
    match to {
        None => {
            // Standard output: the sessions one after another.
            for id in &ids {
                let r = harness::export_session(&store, id, out, opts).map_err(export_err)?;
                progress.done(r.events);
            }
        }
        Some(path) if is_db(&path) => {
            let version = args.schema.unwrap_or(sqlite17::SCHEMA_VERSION);
            sqlite_export::export_db(&store, &ids, &path, version).map_err(|e| match e {
                sqlite::SqliteError::Io { .. } | sqlite::SqliteError::Sqlite { .. } => {
                    Failure::Io(e.to_string())
                }
                e => Failure::Invalid(e.to_string()),
            })?;
            writeln!(
                out,
                "exported {} to {}",
                plural(ids.len() as u64, "session"),
                path.display()
            )
            .map_err(io_err)?;
        }
        Some(path) if to_dir => {
            // A harness root the harness can load: its current default
            // layout, packed rows in Zstandard frames.
            let opts = ExportOptions {
                pack_chunks: true,
                zstd: true,
            };
            check_root_paths(&store, &ids, &path, opts)?;
            for (done, id) in ids.iter().enumerate() {
                let file = harness::export_session_to_root(&store, id, &path, opts)
                    .map_err(|e| root_export_err(e, id, &path, done, ids.len()))?;
                progress.println(
                    out,
                    &format!("exported {} to {}", escape_field(id), file.display()),
                )?;
                progress.done(1);
            }
        }
        Some(path) => {
            let mut buf = Vec::new();
            let r = harness::export_session(&store, &ids[0], &mut buf, opts).map_err(export_err)?;
            // Temporary file, sync, rename, directory sync: the old file
            // stays whole until the new one is complete and durable.
            harness::write_atomically(&path, &buf)
                .map_err(|e| Failure::Io(format!("{}: {e}", path.display())))?;
            writeln!(
                out,
                "exported {} ({}) to {}",
                escape_field(&ids[0]),
                plural(r.events, "event"),
                path.display()
            )
            .map_err(io_err)?;
        }
    }
    progress.finish();
    if unaccounted.is_empty() {
        return Ok(());
    }
    out.flush().map_err(io_err)?;
    for u in &unaccounted {
        eprintln!(
            "error: UNACCOUNTED {}: {}: not a readable session, not exported",
            escape_field(&u.path.display().to_string()),
            escape_field(&u.reason)
        );
    }
    Err(Failure::Invalid(format!(
        "{} exported; {} of sessions/ not exported (listed above): not {}\nhint: nothing in the store was changed; an UNACCOUNTED directory is not a session until its HEADER is mended (it is never deleted); `verify` lists it too",
        plural(ids.len() as u64, "session"),
        match unaccounted.len() {
            1 => "1 entry".to_owned(),
            n => format!("{n} entries"),
        },
        if unaccounted.len() == 1 {
            "a readable session"
        } else {
            "readable sessions"
        }
    )))
}

/// `export --salvage ID [--to FILE]`: the readable prefix of a damaged
/// session as plain JSONL, and on stderr what was cut and where.
fn salvage(store: &store::Store, args: ExportArgs, out: &mut impl Write) -> Result<(), Failure> {
    let [id] = args.ids.as_slice() else {
        return Err(Failure::Usage(
            "--salvage exports one session: name it (`export --salvage ID`)".into(),
        ));
    };
    let to = args.to.filter(|p| p.as_os_str() != "-");
    if to.as_deref().is_some_and(|p| is_db(p) || p.is_dir()) || args.pack_chunks || args.zstd {
        return Err(Failure::Usage(
            "--salvage writes plain JSONL: to a file (--to FILE) or standard output".into(),
        ));
    }
    let s = store.salvage(id).map_err(store_err)?;
    let mut buf = Vec::new();
    sessionlog::adapters::jsonl::write_session(&mut buf, &s.header, &s.events).map_err(io_err)?;
    match &to {
        Some(path) => harness::write_atomically(path, &buf)
            .map_err(|e| Failure::Io(format!("{}: {e}", path.display())))?,
        None => out.write_all(&buf).map_err(io_err)?,
    }
    let id = escape_field(id);
    match &s.cut {
        None => eprintln!(
            "salvaged {id}: {}, nothing damaged",
            plural(s.events.len() as u64, "event")
        ),
        Some(c) => eprintln!(
            "salvaged {id}: {} (seqs 0..{}); cut at {} offset {}: {}; nothing in the store was changed (`verify {id}` reports the damage)",
            plural(s.events.len() as u64, "event"),
            c.seq,
            c.segment.display(),
            c.offset,
            c.reason
        ),
    }
    Ok(())
}
