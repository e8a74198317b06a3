//! Temporary files a handle writes into a session directory before a
//! rename puts them in place: a lazy fetch's copy of an archived segment
//! (`fetch`) and a compressed segment image (`compress`). Each is named
//! `.<final name>.<pid>-<n>.<kind>.tmp`, so concurrent writers never share
//! one, and one a killed process left is known by its pid and removed.

use crate::segment;
use crate::vfs::{Vfs, VfsFile};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A lazy fetch of an archived segment.
#[cfg_attr(not(feature = "archive"), allow(dead_code))]
pub(super) const FETCH: &str = "fetch";
/// A compressed segment image.
pub(super) const COMPRESS: &str = "compress";

/// Creates a temporary file of this process's own in `dir` for file
/// `name`, of kind `kind`. A name that exists already was left by a killed
/// process that had this pid before (pids are reused): the next `n` is
/// taken.
pub(super) fn create(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    kind: &str,
) -> std::io::Result<(PathBuf, Box<dyn VfsFile>)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut tries = 0;
    loop {
        let tmp = dir.join(format!(
            ".{name}.{}-{}.{kind}{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            crate::fsutil::TMP_SUFFIX
        ));
        match vfs.create_new(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 64 => {
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Removes the temporary files of kind `kind` that a killed process left
/// in session directory `dir`: those whose process is gone (`kill(pid, 0)`
/// says no such process) and that have not changed for a minute (so a
/// live writer in another PID namespace sharing the directory is left
/// alone). They hold copies of what is still in place (an archived
/// segment; a raw segment, or the image already renamed into place), never
/// anything else. Best effort: what cannot be removed now is next time.
pub(super) fn sweep(vfs: &dyn Vfs, dir: &Path, kind: &str) {
    let Ok(names) = vfs.read_dir(dir) else {
        return;
    };
    let minute_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    for name in names {
        let Some(pid) = name.to_str().and_then(|n| stale_pid(n, kind)) else {
            continue;
        };
        if pid == std::process::id() || process_lives(pid) {
            continue;
        }
        let path = dir.join(&name);
        let old = vfs
            .metadata(&path)
            .is_ok_and(|m| m.modified.is_some_and(|t| t < minute_ago));
        if old {
            let _ = vfs.remove_file(&path);
        }
    }
}

/// The process id in a temporary file name of kind `kind` for a segment,
/// a segment image or a session's metadata file (which a fetch puts in
/// place too), or `None` for any other name.
fn stale_pid(name: &str, kind: &str) -> Option<u32> {
    let rest = name
        .strip_prefix('.')?
        .strip_suffix(crate::fsutil::TMP_SUFFIX)?
        .strip_suffix(kind)?
        .strip_suffix('.')?;
    let (file, tag) = rest.rsplit_once('.')?;
    let metadata = matches!(file, "CHECKPOINT" | "LINEAGE" | "HEADER");
    if !metadata {
        segment::parse_segment_file_name(file).or_else(|| segment::parse_image_file_name(file))?;
    }
    let (pid, n) = tag.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether process `pid` exists (or cannot be told: then it is assumed to).
fn process_lives(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_temporaries_of_the_kind_name_a_pid() {
        assert_eq!(
            stale_pid(".00000000000000000000.seg.4242-7.fetch.tmp", FETCH),
            Some(4242)
        );
        assert_eq!(
            stale_pid(".00000000000000000000.segz.4242-7.compress.tmp", COMPRESS),
            Some(4242)
        );
        // A fetch puts a session's metadata files in place the same way.
        assert_eq!(stale_pid(".CHECKPOINT.4242-7.fetch.tmp", FETCH), Some(4242));
        for other in [
            "00000000000000000000.seg",
            ".00000000000000000000.seg.4242-7.fetch",
            ".MANIFEST.4242-7.fetch.tmp",
            ".00000000000000000000.seg.x-7.fetch.tmp",
            ".00000000000000000000.seg.4242.fetch.tmp",
            ".00000000000000000000.segz.4242-7.compress.tmp",
            "CHECKPOINT.tmp",
        ] {
            assert_eq!(stale_pid(other, FETCH), None, "{other}");
        }
        assert_eq!(
            stale_pid(".00000000000000000000.seg.4242-7.fetch.tmp", COMPRESS),
            None
        );
        assert!(process_lives(std::process::id()));
    }
}
