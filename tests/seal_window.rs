//! A reader in the window of a seal. The writer seals a segment by writing
//! its footer after the last record, then cutting the preallocated zeros
//! after the footer (`SegmentWriter::seal`); a crash between the two leaves
//! the footer uncut until the next writer completes the seal. A reader in
//! another process that finds the footer maps the file while it is still
//! long, and the cut may land right after: a page of the mapping past the
//! new end of the file then raises SIGBUS when touched, which kills the
//! reading process. The reader must touch nothing past the footer's end.
//!
//! Found by `tests/multiprocess.rs` (a reader process died once in ~200
//! runs); this test makes the interleaving deterministic with a file system
//! that cuts the file right after the reader's second mapping of it (the
//! first is the load's listing, the second the one after the reader found
//! the footer).

mod common;

use common::{fast_tempdir, turn_log};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use sessionlog::vfs::{Metadata, RealFs, SegmentBytes, Vfs, VfsFile};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Cuts `target` to `len` bytes right after its second mapping, as the
/// writer's seal would cut it right after a reader mapped it.
#[derive(Debug)]
struct CutAfterSecondMap {
    target: PathBuf,
    len: u64,
    maps: AtomicU32,
    cut: AtomicBool,
}

impl Vfs for CutAfterSecondMap {
    fn map(&self, p: &Path) -> io::Result<SegmentBytes> {
        let map = RealFs.map(p)?;
        if p == self.target && self.maps.fetch_add(1, Ordering::SeqCst) == 1 {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)?
                .set_len(self.len)?;
            self.cut.store(true, Ordering::SeqCst);
        }
        Ok(map)
    }
    fn create_new(&self, p: &Path) -> io::Result<Box<dyn VfsFile>> {
        RealFs.create_new(p)
    }
    fn open(&self, p: &Path, w: bool) -> io::Result<Box<dyn VfsFile>> {
        RealFs.open(p, w)
    }
    fn read_file(&self, p: &Path) -> io::Result<Vec<u8>> {
        RealFs.read_file(p)
    }
    fn rename(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename(a, b)
    }
    fn rename_noreplace(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.rename_noreplace(a, b)
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.exchange(a, b)
    }
    fn remove_file(&self, p: &Path) -> io::Result<()> {
        RealFs.remove_file(p)
    }
    fn remove_dir_all(&self, p: &Path) -> io::Result<()> {
        RealFs.remove_dir_all(p)
    }
    fn create_dir(&self, p: &Path) -> io::Result<()> {
        RealFs.create_dir(p)
    }
    fn sync_dir(&self, p: &Path) -> io::Result<()> {
        RealFs.sync_dir(p)
    }
    fn hard_link(&self, a: &Path, b: &Path) -> io::Result<()> {
        RealFs.hard_link(a, b)
    }
    fn read_dir(&self, p: &Path) -> io::Result<Vec<OsString>> {
        RealFs.read_dir(p)
    }
    fn metadata(&self, p: &Path) -> io::Result<Metadata> {
        RealFs.metadata(p)
    }
    fn symlink_metadata(&self, p: &Path) -> io::Result<Metadata> {
        RealFs.symlink_metadata(p)
    }
}

#[test]
fn a_reader_that_maps_a_segment_between_its_footer_and_its_cut_reads_nothing_past_the_footer() {
    let dir = fast_tempdir();
    let log = turn_log(6, "window");
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.create(SessionHeader::new("s", 0)).unwrap();
    store.append("s", &log).unwrap();
    assert!(store.seal("s").unwrap(), "the active segment is sealed");
    store.close().unwrap();
    let session = Store::session_dir_in(dir.path(), "s").unwrap();
    let segs: Vec<PathBuf> = std::fs::read_dir(&session)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}: one sealed segment, the last one");
    let sealed_len = std::fs::metadata(&segs[0]).unwrap().len();
    for with_checkpoint in [true, false] {
        if !with_checkpoint {
            std::fs::remove_file(session.join("CHECKPOINT")).unwrap();
        }
        // The file between the footer's write and the cut: the footer in
        // place, 256 KiB of preallocated zeros after it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&segs[0])
            .unwrap()
            .set_len(sealed_len + (256 << 10))
            .unwrap();
        let vfs = Arc::new(CutAfterSecondMap {
            target: segs[0].clone(),
            len: sealed_len,
            maps: AtomicU32::new(0),
            cut: AtomicBool::new(false),
        });
        let reader = Store::open_read_only_with_vfs(dir.path(), vfs.clone()).unwrap();
        let (_, events) = reader.load("s").unwrap();
        assert_eq!(events, log, "checkpoint: {with_checkpoint}");
        assert!(
            vfs.cut.load(Ordering::SeqCst),
            "checkpoint: {with_checkpoint}: the reader mapped the segment twice, \
             so the cut landed between its mapping and its reads"
        );
        reader.verify("s").unwrap();
    }
}
