//! The layouts of a harness sessions root, and durable writes into one.
//!
//! Older layout: `<root>/cwd-<12 hex>/<escaped id>.jsonl` or
//! `<root>/_no-cwd/<escaped id>.jsonl`. Current layout (the harness's JSONL
//! backend's default): `<root>/--<slug>--/<escaped id>/session.jsonl.zstd`
//! (`session.jsonl` uncompressed), `_no-cwd` for a session without a cwd.
//! See [`id_escape`], [`cwd_dir_name`], [`project_dir_name`],
//! [`find_sessions`] and [`export_path`].

use crate::header::SessionHeader;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The file name of a session in the current layout, compressed.
pub const ZSTD_FILE_NAME: &str = "session.jsonl.zstd";
/// The file name of a session in the current layout, plain.
pub const PLAIN_FILE_NAME: &str = "session.jsonl";
/// The older layout's directory for sessions without a working directory.
pub const NO_CWD_DIR: &str = "_no-cwd";

fn is_kept(c: u16) -> bool {
    c < 0x80 && {
        let b = c as u8;
        b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-'
    }
}

/// Escapes a session id into a file name, injectively, as the harness does:
/// `[A-Za-z0-9._-]` kept; every other UTF-16 code unit (so `~`, and both
/// halves of an astral character) written `~XXXX` with 4 upper-case hex
/// digits. The whole ids `.` and `..` (which name directories) are escaped
/// unit by unit: `~002E` and `~002E~002E`, so no id escapes to a name the
/// file system treats specially. The empty id escapes to the empty string
/// (which names no file: the store never holds an empty id).
///
/// ```
/// use sessionlog::adapters::harness::id_escape;
/// assert_eq!(id_escape("a/b"), "a~002Fb");
/// assert_eq!(id_escape("~"), "~007E");
/// assert_eq!(id_escape(".."), "~002E~002E");
/// assert_eq!(id_escape("a..b"), "a..b");
/// ```
pub fn id_escape(id: &str) -> String {
    if id == "." || id == ".." {
        return "~002E".repeat(id.len());
    }
    let mut out = String::with_capacity(id.len());
    for unit in id.encode_utf16() {
        if is_kept(unit) {
            out.push(unit as u8 as char);
        } else {
            out.push_str(&format!("~{unit:04X}"));
        }
    }
    out
}

/// Reverses [`id_escape`]. `None` for a name [`id_escape`] never produces:
/// a character outside the kept set, a `~` not followed by 4 upper-case hex
/// digits, a needless escape (`~0041`), a bare `.` or `..`, or escapes that
/// are not valid UTF-16 (a lone surrogate).
pub fn id_unescape(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let mut units = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'~' {
            let hex = b.get(i + 1..i + 5)?;
            if !hex
                .iter()
                .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(c))
            {
                return None;
            }
            units.push(u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 5;
        } else if is_kept(u16::from(b[i])) {
            units.push(u16::from(b[i]));
            i += 1;
        } else {
            return None;
        }
    }
    let id = String::from_utf16(&units).ok()?;
    (id_escape(&id) == name).then_some(id)
}

/// The older layout's directory for a working directory:
/// `cwd-<first 12 lower-case hex digits of sha256(cwd as UTF-8)>`, or
/// `_no-cwd` when the session has none.
///
/// ```
/// use sessionlog::adapters::harness::cwd_dir_name;
/// assert_eq!(cwd_dir_name(None), "_no-cwd");
/// assert_eq!(cwd_dir_name(Some("/")), "cwd-8a5edab28263");
/// ```
pub fn cwd_dir_name(cwd: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let Some(cwd) = cwd else {
        return NO_CWD_DIR.to_owned();
    };
    let digest = Sha256::digest(cwd.as_bytes());
    let mut out = String::from("cwd-");
    for b in &digest[..6] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

fn is_older_layout_dir(name: &str) -> bool {
    name == NO_CWD_DIR
        || name.strip_prefix("cwd-").is_some_and(|h| {
            h.len() == 12
                && h.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        })
}

/// Finds every session file under a harness sessions root, sorted:
///
/// - older layout: `<root>/cwd-<12 hex>/<name>.jsonl` and
///   `<root>/_no-cwd/<name>.jsonl` (regular files);
/// - current layout: `<root>/<any project dir>/<dir>/session.jsonl.zstd`, or
///   `session.jsonl` when that directory has no compressed log (the
///   compressed one is the backend's default and wins when both exist).
///
/// Symbolic links are not followed. A missing or unreadable root is an
/// error; entries that vanish while walking are skipped.
pub fn find_sessions(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for project in std::fs::read_dir(root)? {
        let project = project?;
        if !project.file_type()?.is_dir() {
            continue;
        }
        let older = is_older_layout_dir(&project.file_name().to_string_lossy());
        let Ok(entries) = std::fs::read_dir(project.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_file() {
                if older && path.extension().is_some_and(|e| e == "jsonl") {
                    found.push(path);
                }
            } else if kind.is_dir() {
                let is_file =
                    |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file());
                let zstd = path.join(ZSTD_FILE_NAME);
                let plain = path.join(PLAIN_FILE_NAME);
                if is_file(&zstd) {
                    found.push(zstd);
                } else if is_file(&plain) {
                    found.push(plain);
                }
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The plain logs [`find_sessions`] passes over in `root`: a current-layout
/// session directory holding both `session.jsonl.zstd` and `session.jsonl`
/// gives only the compressed one, so the plain one (which may hold other
/// events) would be left out of an import without a word. Each such
/// `session.jsonl`, sorted. (The harness refuses a root holding both
/// encodings.)
pub fn shadowed_sessions(root: &Path) -> io::Result<Vec<PathBuf>> {
    let is_file = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file());
    let mut found = Vec::new();
    for project in std::fs::read_dir(root)? {
        let project = project?;
        if !project.file_type()?.is_dir() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(project.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|k| k.is_dir()) {
                continue;
            }
            let plain = entry.path().join(PLAIN_FILE_NAME);
            if is_file(&entry.path().join(ZSTD_FILE_NAME)) && is_file(&plain) {
                found.push(plain);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The current layout's project directory for a working directory, as the
/// harness's `format.ts` `projectKey` builds it: `/`, `\\` and `:` become
/// `-` (a run of them one `-`), `[A-Za-z0-9._-]` stay, every other UTF-16
/// code unit (and `~`) is written `~XXXX`; leading `-` are dropped (an empty
/// result is `root`), the result is cut to 251 characters and framed as
/// `--<slug>--`. Lossy by design (two cwds may share a directory; the
/// session directory below tells them apart). `None` gives `_no-cwd`.
///
/// ```
/// use sessionlog::adapters::harness::project_dir_name;
/// assert_eq!(project_dir_name(Some("/workspace/dsh")), "--workspace-dsh--");
/// assert_eq!(project_dir_name(Some("/")), "--root--");
/// assert_eq!(project_dir_name(Some("{{cwd}}")), "--~007B~007Bcwd~007D~007D--");
/// assert_eq!(project_dir_name(None), "_no-cwd");
/// ```
pub fn project_dir_name(cwd: Option<&str>) -> String {
    let Some(cwd) = cwd else {
        return NO_CWD_DIR.to_owned();
    };
    let mut readable = String::with_capacity(cwd.len());
    let mut separator_run = false;
    for unit in cwd.encode_utf16() {
        if matches!(unit, 0x2F | 0x5C | 0x3A) {
            if !separator_run {
                readable.push('-');
            }
            separator_run = true;
        } else if is_kept(unit) {
            readable.push(unit as u8 as char);
            separator_run = false;
        } else {
            readable.push_str(&format!("~{unit:04X}"));
            separator_run = false;
        }
    }
    let slug = readable.trim_start_matches('-');
    let slug = if slug.is_empty() { "root" } else { slug };
    // All ASCII, so 251 bytes are 251 UTF-16 units, as the harness cuts.
    format!("--{}--", &slug[..slug.len().min(251)])
}

/// The longest file name (one path component), in bytes, that Linux file
/// systems take (`NAME_MAX` of ext4, XFS, btrfs, tmpfs).
pub const NAME_MAX: usize = 255;

/// The longest path, in bytes, a Linux system call takes (`PATH_MAX`, its
/// terminating NUL included).
pub const PATH_MAX: usize = 4096;

/// Where a session goes in a root the harness loads: the current layout,
/// `<root>/<project_dir_name(cwd)>/<id_escape(id)>/session.jsonl[.zstd]`,
/// exactly the path the harness's JSONL backend derives from the header
/// (it refuses a log found anywhere else).
pub fn export_path(root: &Path, header: &SessionHeader, zstd: bool) -> PathBuf {
    root.join(project_dir_name(header.cwd.as_deref()))
        .join(id_escape(&header.id))
        .join(if zstd {
            ZSTD_FILE_NAME
        } else {
            PLAIN_FILE_NAME
        })
}

// ---------------------------------------------------------------------------
// Durable writes
// ---------------------------------------------------------------------------

/// Creates `dir` and any missing ancestors one level at a time (mode 0700,
/// as the harness does), syncing each new directory's parent so the new
/// entry survives a power loss.
pub fn create_dirs_durably(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut d = dir;
    while !d.as_os_str().is_empty() && !d.is_dir() {
        missing.push(d);
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => continue,
            Err(e) => return Err(e),
        }
        sync_parent(d)?;
    }
    Ok(())
}

/// Syncs the directory holding `path`, so an entry made in it (a rename,
/// a new directory) is durable.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` atomically and durably: `path.tmp-<random>`
/// (mode 0600, created new), synced, renamed over `path`, the directory
/// synced. On failure the temporary file is removed and `path` is as it
/// was.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    put_in_place(path, bytes, |tmp| std::fs::rename(tmp, path))
}

/// Writes `bytes` to `path.tmp-<random>` (mode 0600, created new), syncs
/// it, puts it in place with `place` (a rename over `path`, or a hard link
/// that never replaces one), removes the temporary when it is still
/// there, and syncs the directory. On failure `path` is as it was.
pub(crate) fn put_in_place(
    path: &Path,
    bytes: &[u8],
    place: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let r = crate::fsutil::random_id();
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(format!(
        ".tmp-{}",
        r[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ));
    let tmp = path.with_file_name(name);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        place(&tmp)
    })();
    // After a rename the name is gone; after a link (or a failure) the
    // temporary goes.
    let _ = std::fs::remove_file(&tmp);
    result?;
    sync_parent(path)
}
