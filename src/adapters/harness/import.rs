//! Import: one harness session file, read and checked whole through the
//! session model, then published into a [`Store`] whole or not at all.

use super::zstd::{TornFrame, ZstdError, is_zstd, read_zstd_session};
use crate::adapters::jsonl::{self, TornTail};
use crate::adapters::{Progress, Reporter, storing};
use crate::event::OwnedEvent;
use crate::json::{self, Fields};
use crate::store::{self, Store};
use crate::violation::{Location, Rule, Violation};
use std::io;
use std::path::{Path, PathBuf};

/// How [`import_file`] treats an existing session and an open last turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportOptions {
    /// Replace a stored session with the same id (otherwise an error).
    pub replace: bool,
    /// Close an unclosed last turn after importing ([`Store::repair`]).
    pub repair: bool,
    /// Store the session under this id instead of the header's (harness
    /// test snapshots often share a placeholder id).
    pub id: Option<String>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            replace: false,
            repair: true,
            id: None,
        }
    }
}

/// What [`import_file`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportReport {
    /// The file.
    pub path: PathBuf,
    /// The session id (from the file's header).
    pub id: String,
    /// Whether the file was a Zstandard log.
    pub zstd: bool,
    /// Events read from the file (packed rows expanded) and stored.
    pub events: u64,
    /// Whether a stored session with the same id was replaced.
    pub replaced: bool,
    /// The torn last line that was dropped, if any.
    pub torn: Option<TornTail>,
    /// The torn final Zstandard frame, if any.
    pub torn_frame: Option<TornFrame>,
    /// The closers appended to close an unclosed last turn.
    pub closers: Vec<OwnedEvent>,
    /// The last turn was left open (`repair: false`). The store closes it
    /// the next time it opens the session from disk.
    pub left_open: bool,
}

/// Why [`import_file`] stored nothing. In every case the store is as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The Zstandard stream is damaged.
    #[error("{}: {source}", path.display())]
    Zstd {
        /// The file.
        path: PathBuf,
        /// Where and what.
        source: ZstdError,
    },
    /// The log breaks a rule of the session model (or a packed row is
    /// malformed, or a line is damaged before the end): the file's line
    /// (1-based, the header is line 1; for a Zstandard log, a line of its
    /// decoded text) and the event's seq, where they are known.
    #[error("{}: corrupt{}{}: {violation}", path.display(),
        line.map(|l| format!(" at line {l}")).unwrap_or_default(),
        seq.map(|s| format!(" (seq {s})")).unwrap_or_default())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line.
        line: Option<u64>,
        /// The seq.
        seq: Option<u64>,
        /// The rule and reason.
        violation: Violation,
    },
    /// A session with this id is stored and `replace` was not asked.
    #[error("{}: session {id:?} already exists (import with replace to overwrite it)", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
        /// The id.
        id: String,
    },
    /// The store failed; nothing of the session is visible (and a replaced
    /// one is still in place).
    #[error("{}: storing session {id:?}: {source}", path.display())]
    Store {
        /// The file.
        path: PathBuf,
        /// The id.
        id: String,
        /// The store's error.
        source: Box<store::Error>,
    },
}

/// The seq range a line holds: `(first, count)`.
fn line_seqs(line: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(line).ok()?;
    let f = Fields::parse(text.strip_suffix('\r').unwrap_or(text)).ok()?;
    if let Some(seq0) = f.get("seq0").and_then(json::safe_u64) {
        let data = json::object(f.get("data")?)?;
        let pieces = data.get("texts").or_else(|| data.get("args"))?;
        return Some((seq0, json::array(pieces)?.len() as u64));
    }
    Some((f.get("seq").and_then(json::safe_u64)?, 1))
}

/// The (line, seq) a violation points at, as far as the text tells.
fn locate(text: &[u8], v: &Violation) -> (Option<u64>, Option<u64>) {
    match v.location {
        Location::Line(l) => {
            let seq = text
                .split(|&b| b == b'\n')
                .nth(l.saturating_sub(1) as usize)
                .and_then(line_seqs)
                .map(|(s, _)| s);
            (Some(l), seq)
        }
        Location::Seq(s) => {
            // Walk the contiguous prefix. A contiguity violation is the
            // first line that breaks it; any other names a seq inside it.
            let mut next = 0;
            for (i, line) in text.split(|&b| b == b'\n').enumerate().skip(1) {
                let Some((first, n)) = line_seqs(line) else {
                    continue;
                };
                let holds = (first..first.saturating_add(n)).contains(&s);
                if first != next || (holds && v.rule != Rule::Contiguity) {
                    return (holds.then_some(i as u64 + 1), Some(s));
                }
                next = first.saturating_add(n);
            }
            (None, Some(s))
        }
    }
}

/// Whether a file is a Zstandard log: by its extension (`.zstd`, `.zst`),
/// or by its first bytes (a JSONL file starts with `{`, never with the
/// Zstandard magic number).
fn is_zstd_file(path: &Path, bytes: &[u8]) -> bool {
    path.extension().is_some_and(|e| e == "zstd" || e == "zst") || is_zstd(bytes)
}

/// Imports one harness session file (plain JSONL, with or without packed
/// rows, or a Zstandard log) into `store`, under the id in its header.
///
/// The whole file is read and folded through the session model first (the
/// same checks as an append), so a damaged log stores nothing: the error
/// names the file, line and seq. A torn tail (last line, or final frame) is
/// dropped and reported. An existing session with the same id is an error
/// unless `replace`. The session is published whole ([`Store::import`]):
/// with `replace` it is swapped in for the old one only once it is
/// durable, so a failure or a crash never leaves a partial session or
/// neither. A header-only file is stored as a session with no events. An
/// unclosed last turn is stored as it was and then closed with
/// [`Store::repair`] unless `repair` is false.
pub fn import_file(
    store: &Store,
    path: &Path,
    opts: ImportOptions,
) -> Result<ImportReport, ImportError> {
    import_file_with_progress(store, path, opts, &mut |_| {})
}

/// [`import_file`], telling `progress` how far it has got as it goes: the
/// bytes of the file's text read and checked (of a Zstandard log, of its
/// decoded text) and the events, at most once per [`REPORT_BYTES`], then
/// the session stored. See [`Progress`].
///
/// ```
/// use sessionlog::adapters::harness::{ImportOptions, import_file_with_progress};
/// use sessionlog::adapters::{Progress, Stage};
/// use sessionlog::store::{Options, Store};
/// let dir = std::env::temp_dir().join(format!("sessionlog-doc-progress-{}", std::process::id()));
/// let _ = std::fs::remove_dir_all(&dir);
/// std::fs::create_dir_all(&dir).unwrap();
/// let file = dir.join("s.jsonl");
/// std::fs::write(&file, "{\"type\":\"session\",\"id\":\"s\",\"createdAt\":0}\n").unwrap();
/// let store = Store::open(dir.join("store"), Options::default()).unwrap();
/// let mut last = Progress::default();
/// import_file_with_progress(&store, &file, ImportOptions::default(), &mut |p| last = p).unwrap();
/// assert_eq!((last.stage, last.sessions, last.total_bytes), (Stage::Storing, 1, 42));
/// # drop(store);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
///
/// [`REPORT_BYTES`]: crate::adapters::REPORT_BYTES
pub fn import_file_with_progress(
    store: &Store,
    path: &Path,
    opts: ImportOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<ImportReport, ImportError> {
    let mut progress = Reporter::new(progress);
    let bytes = std::fs::read(path).map_err(|source| ImportError::Io {
        path: path.to_owned(),
        source,
    })?;
    let zstd = is_zstd_file(path, &bytes);
    let (text, torn_frame, complete_bytes) = if zstd {
        let z = read_zstd_session(&bytes).map_err(|source| ImportError::Zstd {
            path: path.to_owned(),
            source,
        })?;
        (z.text, z.torn, Some(z.complete_bytes))
    } else {
        (bytes, None, None)
    };
    let corrupt = |violation: Violation| {
        let (line, seq) = locate(&text, &violation);
        ImportError::Corrupt {
            path: path.to_owned(),
            line,
            seq,
            violation,
        }
    };
    progress.start_text(text.len() as u64);
    let session = jsonl::read_session_reporting(&text, false, &mut progress).map_err(corrupt)?;
    let mut header = session.header.header.clone();
    if let Some(id) = &opts.id {
        header.id = id.clone();
    }
    let id = header.id.clone();
    let open = !session.state.closers().is_empty();
    let store_err = |source: store::Error| match source {
        store::Error::Rejected { violation, .. } => corrupt(violation),
        source => ImportError::Store {
            path: path.to_owned(),
            id: id.clone(),
            source: Box::new(source),
        },
    };

    // A bad line or seq gap inside a complete Zstandard frame is damage:
    // the frame was a finished write (the harness refuses such a log).
    if let (Some(t), Some(complete)) = (&session.torn, complete_bytes)
        && line_start(&text, t.line) < complete
    {
        return Err(corrupt(Violation::new(
            Location::Line(t.line),
            Rule::Json,
            format!("inside a complete Zstandard frame: {}", t.reason),
        )));
    }

    // The store publishes the session whole (a header-only one too), or
    // swaps it in for the old one whole: a failure (or a crash) leaves the
    // store as it was.
    let replaced = store.exists(&id).map_err(store_err)?;
    if replaced && !opts.replace {
        return Err(ImportError::Exists {
            path: path.to_owned(),
            id,
        });
    }
    let events = session.events.len() as u64;
    progress.storing(events);
    storing::store_session_reporting(store, header, &session.events, opts.replace, &mut progress)
        .map_err(|e| match e {
        store::Error::Exists(_) => ImportError::Exists {
            path: path.to_owned(),
            id: id.clone(),
        },
        e => store_err(e),
    })?;
    let closers = if open && opts.repair {
        store.repair(&id).map_err(store_err)?
    } else {
        Vec::new()
    };
    progress.stored(events);
    Ok(ImportReport {
        path: path.to_owned(),
        id: id.clone(),
        zstd,
        events,
        replaced,
        torn: session.torn.clone(),
        torn_frame,
        closers,
        left_open: open && !opts.repair,
    })
}

/// The byte offset where 1-based `line` starts in `text`.
fn line_start(text: &[u8], line: u64) -> usize {
    if line <= 1 {
        return 0;
    }
    memchr::memchr_iter(b'\n', text)
        .nth(line as usize - 2)
        .map_or(text.len(), |p| p + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_seqs_in_packed_text() {
        let t = b"{\"type\":\"session\"}\n{\"type\":\"text-chunks\",\"seq0\":0,\"time0\":0,\"data\":{\"texts\":[\"a\",\"b\",\"c\"]}}\n{\"type\":\"x\",\"seq\":3}\n{\"type\":\"x\",\"seq\":3}\n";
        let at = |loc, rule| locate(t, &Violation::new(loc, rule, ""));
        assert_eq!(at(Location::Seq(1), Rule::Provenance), (Some(2), Some(1)));
        assert_eq!(at(Location::Seq(3), Rule::Provenance), (Some(3), Some(3)));
        assert_eq!(at(Location::Seq(3), Rule::Contiguity), (Some(4), Some(3)));
        assert_eq!(at(Location::Line(4), Rule::Json), (Some(4), Some(3)));
    }
}
