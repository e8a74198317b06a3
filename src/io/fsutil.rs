//! Small file-system helpers shared by the store's metadata files.
//!
//! Every helper that syncs says which crash it protects against. The model is
//! POSIX: a `write` is not durable until the file is `fsync`ed, and a
//! directory entry created, renamed or removed is not durable until the
//! *directory* is `fsync`ed.
//!
//! Everything here is Unix-only (permission bits, directory `fsync`).
//!
//! Permissions: store files are created `0600` and directories `0700`
//! (owner only), because session logs hold private conversations. The process
//! umask can only remove bits from these modes, never add them.

#[cfg(any(test, feature = "internals"))]
use crate::vfs::RealFs;
use crate::vfs::Vfs;
use std::fs::File;
#[cfg(any(test, feature = "internals"))]
use std::fs::OpenOptions;
use std::io::{self, Read};
#[cfg(any(test, feature = "internals"))]
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Mode of every file the store creates.
#[cfg(any(test, feature = "internals"))]
pub const FILE_MODE: u32 = crate::vfs::FILE_MODE;

/// Mode of every directory the store creates.
#[cfg(any(test, feature = "internals"))]
pub const DIR_MODE: u32 = crate::vfs::DIR_MODE;

/// Suffix of the temporary file [`write_atomic`] writes before renaming it.
pub const TMP_SUFFIX: &str = ".tmp";

/// Longest name [`encode_session_dir_name`] returns, in bytes (well below
/// the 255-byte `NAME_MAX` of common Unix file systems).
pub const MAX_DIR_NAME: usize = 200;

/// Length, in bytes, of the readable prefix kept in a hashed directory name.
const HASHED_PREFIX: usize = 120;

/// Marker between the prefix and the hash of a hashed directory name. Plain
/// encodings never contain it: in them `~` is always followed by an upper-case
/// hex digit.
const HASH_MARKER: &str = "~h";

/// Creates the directory `path` (not its parents) with mode `0700`.
///
/// Fails if it already exists. The new entry in the parent is not durable
/// until the caller runs [`sync_dir`] on the parent.
#[cfg(any(test, feature = "internals"))]
pub fn create_dir_private(path: impl AsRef<Path>) -> io::Result<()> {
    RealFs.create_dir(path.as_ref())
}

/// Creates the file `path` for reading and writing with mode `0600`; fails if
/// anything exists at `path` (`O_CREAT | O_EXCL`, so an existing file or a
/// symlink planted there is never followed or truncated).
///
/// Neither the contents nor the new directory entry are durable until the
/// caller `fsync`s the file and then the parent directory ([`sync_dir`]).
#[cfg(any(test, feature = "internals"))]
pub fn create_file_private(path: impl AsRef<Path>) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Opens the directory `path` and `fsync`s it.
///
/// Why: creating, renaming or unlinking a file changes only the directory.
/// Until the directory itself is synced, a crash can undo the change even
/// though the file's own data was synced (the file then has no name, or its
/// old name).
#[cfg(any(test, feature = "internals"))]
pub fn sync_dir(path: impl AsRef<Path>) -> io::Result<()> {
    RealFs.sync_dir(path.as_ref())
}

/// Replaces (or creates) `dir/name` with `bytes` so that after a crash the
/// file holds either its old contents or `bytes`, never a mix or a prefix.
///
/// Steps:
/// 1. remove a stale `dir/name.tmp` left by an earlier crash (this assumes a
///    single writer: the store must hold its lock);
/// 2. write `dir/name.tmp` (created `0600`, exclusive);
/// 3. `fsync` it: its contents must be on disk *before* the rename can make
///    them visible under `name` (otherwise a crash right after the rename can
///    leave `name` empty or partial on some file systems);
/// 4. rename it over `dir/name` (atomic replacement of the directory entry);
/// 5. `fsync` `dir`: makes the rename itself durable.
///
/// Crash windows: before step 4 `name` is untouched (old contents, or
/// absent) and at most a stray `name.tmp` remains, which the next call
/// removes; between steps 4 and 5 a crash leaves either the old or the new
/// file under `name`, both complete; after step 5 the new file is durable.
///
/// On an error before the rename the temporary file is removed. An error
/// from step 5 means the rename happened but may not be durable: the caller
/// must treat the outcome as unknown (old or new).
///
/// `name` must be a single path component (no `/`, not `.` or `..`).
#[cfg(any(test, feature = "internals"))]
pub fn write_atomic(dir: impl AsRef<Path>, name: &str, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(&RealFs, dir.as_ref(), name, bytes)
}

/// [`write_atomic`] through the file system `vfs`.
pub fn write_atomic_with(vfs: &dyn Vfs, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("write_atomic: {name:?} is not a plain file name"),
        ));
    }
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let target = dir.join(name);
    match vfs.remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let written = (|| {
        let file = vfs.create_new(&tmp)?;
        file.write_all_at(bytes, 0)?;
        file.sync_all()?;
        vfs.rename(&tmp, &target)
    })();
    if let Err(e) = written {
        let _ = vfs.remove_file(&tmp);
        return Err(e);
    }
    vfs.sync_dir(dir)
}

/// The session id was not usable as a session identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadId {
    /// The id was the empty string.
    #[error("a session id must not be empty")]
    Empty,
}

/// True for the bytes kept as they are in a session directory name.
fn is_kept(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// The name of the directory that holds session `id`: a safe, portable file
/// name that is injective in `id`.
///
/// Encoding: bytes `[A-Za-z0-9._-]` are kept, except a leading `.`; every
/// other byte of the id's UTF-8 (including `~`, `/`, NUL and each byte of a
/// multi-byte character) becomes `~XX`, two upper-case hex digits. So the
/// result never contains `/` or NUL and never is (or starts with) `.`, which
/// also rules out `.` and `..`. The code is injective because it is uniquely
/// decodable: a kept byte is one character other than `~`, an escape is
/// exactly `~` and two hex digits.
///
/// Long ids: when the encoding exceeds [`MAX_DIR_NAME`] (200) bytes, the name
/// is the first 120 bytes of the encoding (shortened so that no escape is cut)
/// followed by `~h` and the 32 lower-case hex digits of the FNV-1a-128 hash of
/// the whole id. Such names (at most 154 bytes) never equal a plain encoding,
/// which cannot contain `~h`. Two long ids with the same prefix map to the
/// same name only on a 128-bit hash collision; every session's `HEADER`
/// holds its full id and a directory is a session only when its name is the
/// encoding of that id, so a collision is detected rather than silently
/// merging two sessions.
///
/// Note: names are case-sensitive (`a` and `A` differ), as on the Unix file
/// systems the store targets.
///
/// ```
/// use sessionlog::fsutil::encode_session_dir_name as enc;
/// assert_eq!(enc("s-1.x_Y").unwrap(), "s-1.x_Y");
/// assert_eq!(enc("a/b").unwrap(), "a~2Fb");
/// assert_eq!(enc("..").unwrap(), "~2E.");
/// assert_eq!(enc("é").unwrap(), "~C3~A9");
/// ```
pub fn encode_session_dir_name(id: &str) -> Result<String, BadId> {
    if id.is_empty() {
        return Err(BadId::Empty);
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(id.len());
    for (i, &b) in id.as_bytes().iter().enumerate() {
        if is_kept(b) && !(i == 0 && b == b'.') {
            out.push(b as char);
        } else {
            out.push('~');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    if out.len() <= MAX_DIR_NAME {
        return Ok(out);
    }
    // The encoding is ASCII. Every `~` starts an escape (a kept `~` does not
    // exist and hex digits are not `~`), so a cut at `c` falls inside an
    // escape iff a `~` sits at `c - 1` or `c - 2`.
    let bytes = out.as_bytes();
    let mut cut = HASHED_PREFIX;
    if bytes[cut - 1] == b'~' {
        cut -= 1;
    } else if bytes[cut - 2] == b'~' {
        cut -= 2;
    }
    out.truncate(cut);
    out.push_str(HASH_MARKER);
    out.push_str(&format!("{:032x}", fnv1a_128(id.as_bytes())));
    Ok(out)
}

/// FNV-1a with 128-bit state (offset basis `0x6c62272e07bb014262b821756295c58d`,
/// prime `2^88 + 0x13B`). Chosen because it is tiny and fixed by its
/// specification: its value never changes between builds, unlike
/// `std::collections::hash_map::DefaultHasher`. It is not a cryptographic
/// hash; collisions are detected (see [`encode_session_dir_name`]).
pub fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

/// 16 random bytes: from `/dev/urandom`, or, if that cannot be read, the
/// FNV-1a-128 hash of the time, the process id, a per-process counter and a
/// stack address (unique enough for an identity; not for secrets).
///
/// Used for the store id and suitable for session uids.
pub fn random_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .is_ok()
    {
        return id;
    }
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut seed = Vec::with_capacity(48);
    seed.extend_from_slice(&nanos.to_le_bytes());
    seed.extend_from_slice(&std::process::id().to_le_bytes());
    seed.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    seed.extend_from_slice(&(&id as *const _ as usize).to_le_bytes());
    fnv1a_128(&seed).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_128_matches_reference_values() {
        // Reference values computed independently (Python big integers).
        assert_eq!(fnv1a_128(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv1a_128(b"a"), FNV_A);
        assert_eq!(fnv1a_128(b"foobar"), FNV_FOOBAR);
    }

    const FNV_A: u128 = 0xd228cb696f1a8caf78912b704e4a8964;
    const FNV_FOOBAR: u128 = 0x343e1662793c64bf6f0d3597ba446f18;

    #[test]
    fn hashed_names_do_not_cut_escapes() {
        for pad in 0..3 {
            let id = format!("{}{}", "a".repeat(pad), "/".repeat(100));
            let name = encode_session_dir_name(&id).unwrap();
            let (prefix, hash) = name.split_once(HASH_MARKER).unwrap();
            assert_eq!(hash.len(), 32);
            assert!(prefix.len() <= HASHED_PREFIX && prefix.len() > HASHED_PREFIX - 3);
            assert_eq!((prefix.len() - pad) % 3, 0, "{prefix}");
        }
    }
}
