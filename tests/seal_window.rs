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
#[path = "common/hooked_fs.rs"]
mod hooked_fs;

use common::{fast_tempdir, turn_log};
use sessionlog::header::SessionHeader;
use sessionlog::store::{Options, Store};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

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
            assert!(common::checkpoint_place(&session).is_some());
            common::remove_checkpoint(&session);
        }
        // The file between the footer's write and the cut: the footer in
        // place, 256 KiB of preallocated zeros after it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&segs[0])
            .unwrap()
            .set_len(sealed_len + (256 << 10))
            .unwrap();
        // The file cut to its sealed length right after its second mapping,
        // as the writer's seal would cut it right after a reader mapped it.
        let (target, maps, cut) = (
            segs[0].clone(),
            AtomicU32::new(0),
            Arc::new(AtomicBool::new(false)),
        );
        let done = cut.clone();
        let vfs = Arc::new(hooked_fs::HookedFs {
            after_map: Some(Box::new(move |p| {
                if p == target && maps.fetch_add(1, Ordering::SeqCst) == 1 {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(p)
                        .and_then(|f| f.set_len(sealed_len))
                        .unwrap();
                    done.store(true, Ordering::SeqCst);
                }
            })),
            ..hooked_fs::HookedFs::default()
        });
        let reader = Store::open_read_only_with_vfs(dir.path(), vfs).unwrap();
        let (_, events) = reader.load("s").unwrap();
        assert_eq!(events, log, "checkpoint: {with_checkpoint}");
        assert!(
            cut.load(Ordering::SeqCst),
            "checkpoint: {with_checkpoint}: the reader mapped the segment twice, \
             so the cut landed between its mapping and its reads"
        );
        reader.verify("s").unwrap();
    }
}
