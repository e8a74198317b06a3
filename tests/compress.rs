//! Sealed segments stored compressed (`Options::compress_sealed`,
//! `Store::compress_sealed`): what a store with images reads is exactly
//! what it read before, for every kind of reader; the store's format
//! version is raised first; a damaged image is an error naming it; a crash
//! between the image and the raw file's removal leaves both, read as one.

use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::store::{Error, Options, Store};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
#[path = "common/hooked_fs.rs"]
mod hooked_fs;
use common::{fast_tempdir, turn_log};

fn options(compress: bool) -> Options {
    Options {
        segment_size: 4096,
        preallocate: 4096,
        compress_sealed: compress,
        ..Options::default()
    }
}

/// What a reader sees of a session: its events and derived messages.
fn view(store: &Store, id: &str) -> (Vec<OwnedEvent>, Vec<String>) {
    let (_, events) = store.load(id).unwrap();
    let messages = store
        .derive(id)
        .unwrap()
        .messages()
        .map(|m| m.to_json())
        .collect();
    (events, messages)
}

fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    out
}

fn session_dir(store: &Path, id: &str) -> PathBuf {
    Store::session_dir_in(store, id).unwrap()
}

fn manifest_version(store: &Path) -> u32 {
    let m = std::fs::read(store.join("MANIFEST")).unwrap();
    u32::from_le_bytes(m[8..12].try_into().unwrap())
}

fn wait_idle(store: &Store) {
    let start = Instant::now();
    while store.compression_status().pending > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "compression stuck"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A session of `turns` turns, appended a turn at a time.
fn write(store: &Store, id: &str, turns: u64) -> Vec<OwnedEvent> {
    let log = turn_log(turns, id);
    store.create(SessionHeader::new(id, 0)).unwrap();
    for turn in log.chunks(3) {
        store.append(id, turn).unwrap();
    }
    log
}

#[test]
fn sealed_segments_are_compressed_in_the_background_and_read_the_same() {
    let dir = fast_tempdir();
    let plain = fast_tempdir();
    let (log, expected) = {
        let twin = Store::open(plain.path(), options(false)).unwrap();
        let log = write(&twin, "s", 60);
        (log, view(&twin, "s"))
    };
    assert_eq!(
        manifest_version(plain.path()),
        3,
        "no compression: version 3"
    );

    let store = Store::open(dir.path(), options(true)).unwrap();
    assert_eq!(manifest_version(dir.path()), 5, "raised at open");
    assert_eq!(write(&store, "s", 60), log);
    wait_idle(&store);
    let status = store.compression_status();
    assert_eq!(status.last_error, None);
    assert!(status.done.segments >= 3, "{status:?}");
    assert!(
        status.done.image_bytes < status.done.raw_bytes,
        "{status:?}"
    );
    let sdir = session_dir(dir.path(), "s");
    let images = files(&sdir, ".segz");
    let raws = files(&sdir, ".seg");
    assert_eq!(images.len() as u64, status.done.segments);
    assert_eq!(raws.len(), 1, "only the active segment stays raw: {raws:?}");
    // The writing handle (its maps of the removed raw files), a handle
    // opened now, a read-only one: all read what the uncompressed twin does.
    assert_eq!(view(&store, "s"), expected);
    store.verify("s").unwrap();
    let paths = store.segment_files("s").unwrap();
    assert_eq!(&paths[..images.len()], &images[..]);
    store.close().unwrap();
    for reopened in [
        Store::open(dir.path(), options(false)).unwrap(),
        Store::open_read_only(dir.path()).unwrap(),
    ] {
        assert_eq!(view(&reopened, "s"), expected);
        reopened.verify("s").unwrap();
    }
    // Without a checkpoint every record is folded again, from the images.
    assert!(common::checkpoint_place(&sdir).is_some());
    common::remove_checkpoint(&sdir);
    let rebuilt = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(view(&rebuilt, "s"), expected);
}

#[test]
fn compress_sealed_compresses_a_store_written_without_it() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    write(&store, "s", 40);
    let expected = view(&store, "s");
    let reader = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(view(&reader, "s"), expected);
    assert_eq!(manifest_version(dir.path()), 3);

    let done = store.compress_sealed("s").unwrap();
    assert!(done.segments >= 2, "{done:?}");
    assert!(
        done.image_bytes * 2 < done.raw_bytes,
        "images take under half: {done:?}"
    );
    assert_eq!(manifest_version(dir.path()), 5, "raised before the images");
    assert_eq!(store.compress_sealed("s").unwrap().segments, 0, "done once");
    // A reader that loaded the session before keeps reading it; one that
    // opens now reads the images.
    assert_eq!(view(&reader, "s"), expected);
    assert_eq!(view(&store, "s"), expected);
    assert_eq!(
        view(&Store::open_read_only(dir.path()).unwrap(), "s"),
        expected
    );
    // Appending goes on (new segments, sealed ones stay compressed).
    let more = common::next_turn(&expected.0);
    store.append("s", &more).unwrap();
    store.close().unwrap();
    let reopened = Store::open(dir.path(), options(false)).unwrap();
    let (events, _) = view(&reopened, "s");
    assert_eq!(events.len(), expected.0.len() + 2);
    reopened.verify("s").unwrap();
}

#[test]
fn a_fork_shares_compressed_segments() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    let log = write(&store, "p", 40);
    store.compress_sealed("p").unwrap();
    store.fork("p", 60, SessionHeader::new("c", 0)).unwrap();
    let (events, _) = view(&store, "c");
    assert_eq!(&events[..60], &log[..60]);
    let cdir = session_dir(dir.path(), "c");
    let shared = files(&cdir, ".segz");
    assert!(!shared.is_empty(), "the fork links the parent's images");
    store.close().unwrap();
    let reopened = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(reopened.load("c").unwrap().1, events);
    reopened.verify("c").unwrap();
    reopened.verify("p").unwrap();
}

/// Both sessions' allocated bytes: a file a fork shares counts in each.
fn allocated(store: &Store, ids: &[&str]) -> u64 {
    ids.iter()
        .map(|id| store.stats(id).unwrap().allocated)
        .sum()
}

#[test]
fn segments_a_fork_shares_stay_raw_until_it_is_gone() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    write(&store, "p", 40);
    store.fork("p", 60, SessionHeader::new("c", 0)).unwrap();
    let pdir = session_dir(dir.path(), "p");
    let cdir = session_dir(dir.path(), "c");
    let linked = files(&cdir, ".seg").len() as u64 - 1;
    assert!(linked >= 1, "the fork links raw sealed segments");
    let raw_before = files(&pdir, ".seg").len() as u64;
    let before = allocated(&store, &["p", "c"]);
    let expected = (view(&store, "p"), view(&store, "c"));

    // Imaging a segment the fork keeps would store its bytes twice.
    let done = store.compress_sealed("p").unwrap();
    assert_eq!(done.shared, linked, "{done:?}");
    assert_eq!(done.segments, raw_before - 1 - linked, "{done:?}");
    assert!(
        allocated(&store, &["p", "c"]) <= before,
        "compressing grew the two sessions: {before} -> {}",
        allocated(&store, &["p", "c"])
    );
    assert_eq!((view(&store, "p"), view(&store, "c")), expected);

    // Once the fork is gone the parent's segments are its own again.
    store.delete("c").unwrap();
    let done = store.compress_sealed("p").unwrap();
    assert_eq!((done.segments, done.shared), (linked, 0), "{done:?}");
    assert_eq!(files(&pdir, ".seg").len(), 1, "only the active one is raw");
    assert_eq!(view(&store, "p"), expected.0);
    store.verify("p").unwrap();
}

#[test]
fn a_fork_compresses_what_it_inherited_once_its_parent_is_gone() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    write(&store, "p", 40);
    store.fork("p", 60, SessionHeader::new("c", 0)).unwrap();
    let cdir = session_dir(dir.path(), "c");
    store.seal("c").unwrap();
    let inherited = files(&cdir, ".seg").len() as u64 - 1;
    assert!(inherited >= 1, "the fork links raw sealed segments");
    let expected = view(&store, "c");
    assert_eq!(
        store.compress_sealed("c").unwrap().shared,
        inherited,
        "shared with the parent: left raw"
    );

    store.delete("p").unwrap();
    let done = store.compress_sealed("c").unwrap();
    assert_eq!((done.segments, done.shared), (inherited, 0), "{done:?}");
    assert!(files(&cdir, ".seg").is_empty(), "all sealed, all images");
    assert_eq!(view(&store, "c"), expected);
    store.verify("c").unwrap();
    store.close().unwrap();
    // The images are read under their owner's identity (the LINEAGE).
    for reopened in [
        Store::open(dir.path(), options(true)).unwrap(),
        Store::open_read_only(dir.path()).unwrap(),
    ] {
        assert_eq!(view(&reopened, "c"), expected);
        reopened.verify("c").unwrap();
    }
}

#[test]
fn the_background_compresses_what_a_fork_inherited_once_it_is_its_own() {
    let dir = fast_tempdir();
    {
        let store = Store::open(dir.path(), options(false)).unwrap();
        write(&store, "p", 40);
        store.fork("p", 60, SessionHeader::new("c", 0)).unwrap();
        store.delete("p").unwrap();
        store.close().unwrap();
    }
    let cdir = session_dir(dir.path(), "c");
    let raw_before = files(&cdir, ".seg").len() as u64;
    assert!(
        raw_before >= 2,
        "inherited sealed segments and the active one"
    );
    let store = Store::open(dir.path(), options(true)).unwrap();
    let (events, _) = view(&store, "c");
    // Taking the fork for writing queues its raw sealed segments.
    store.append("c", &common::next_turn(&events)).unwrap();
    wait_idle(&store);
    let status = store.compression_status();
    assert_eq!(status.last_error, None);
    assert_eq!(status.done.segments, raw_before - 1, "{status:?}");
    assert_eq!(files(&cdir, ".seg").len(), 1, "only the active one");
    store.verify("c").unwrap();
    let (after, _) = view(&Store::open_read_only(dir.path()).unwrap(), "c");
    assert_eq!(&after[..events.len()], &events[..]);
}

#[test]
fn a_raw_file_left_beside_its_image_is_read_and_compressed_again() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    write(&store, "s", 40);
    let expected = view(&store, "s");
    store.close().unwrap();
    let sdir = session_dir(dir.path(), "s");
    let raws = files(&sdir, ".seg");
    let kept: Vec<(PathBuf, Vec<u8>)> = raws[..raws.len() - 1]
        .iter()
        .map(|p| (p.clone(), std::fs::read(p).unwrap()))
        .collect();
    let store = Store::open(dir.path(), options(false)).unwrap();
    store.compress_sealed("s").unwrap();
    store.close().unwrap();
    // A crash after the image's rename, before the raw file's removal
    // reached the disk: both are there.
    for (p, bytes) in &kept {
        std::fs::write(p, bytes).unwrap();
    }
    let reader = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(view(&reader, "s"), expected);
    assert_eq!(
        reader.segment_files("s").unwrap()[0],
        kept[0].0,
        "the raw file is read"
    );
    // The session's next writer compresses them again.
    let store = Store::open(dir.path(), options(true)).unwrap();
    assert_eq!(view(&store, "s"), expected);
    let more = common::next_turn(&expected.0);
    store.append("s", &more).unwrap();
    wait_idle(&store);
    assert_eq!(files(&sdir, ".seg").len(), 1, "compressed again");
    let (events, _) = view(&store, "s");
    assert_eq!(&events[..expected.0.len()], &expected.0[..]);
    store.verify("s").unwrap();
}

#[test]
fn a_damaged_image_is_an_error_naming_it() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    write(&store, "s", 40);
    store.compress_sealed("s").unwrap();
    store.close().unwrap();
    let sdir = session_dir(dir.path(), "s");
    let image = files(&sdir, ".segz")[0].clone();
    let mut bytes = std::fs::read(&image).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&image, &bytes).unwrap();
    let store = Store::open_read_only(dir.path()).unwrap();
    for result in [
        store.load("s").map(drop),
        store.verify("s").map(drop),
        store.read_from("s", 0).map(drop),
    ] {
        match result {
            Err(e @ (Error::Corrupt { .. } | Error::Segment { .. })) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&*image.file_name().unwrap().to_string_lossy()),
                    "{msg}"
                );
            }
            other => panic!("a damaged image must fail the read: {other:?}"),
        }
    }
    let salvaged = store.salvage("s").unwrap();
    let cut = salvaged.cut.expect("salvage stops at the image");
    assert_eq!(cut.segment, image);
    assert_eq!(cut.seq, 0);
}

/// A half-written image a killed compressor left is removed by the next
/// writer of its session, with or without `Options::compress_sealed` (a
/// killed `sessionlog compress` opens no background compressor, and its
/// temporaries held tens of MiB each that nothing removed).
#[test]
fn a_stale_temporary_of_a_dead_compressor_is_swept() {
    for background in [true, false] {
        let dir = fast_tempdir();
        let store = Store::open(dir.path(), options(false)).unwrap();
        write(&store, "s", 40);
        store.close().unwrap();
        let sdir = session_dir(dir.path(), "s");
        // pid 2^22 + 1 is above the kernel's pid limit: never a live process.
        let stale = sdir.join(".00000000000000000000.segz.4194305-0.compress.tmp");
        let fresh = sdir.join(".00000000000000000000.segz.4194305-1.compress.tmp");
        for p in [&stale, &fresh] {
            std::fs::write(p, b"partial image").unwrap();
        }
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let store = Store::open(dir.path(), options(background)).unwrap();
        if background {
            store
                .append("s", &common::next_turn(&store.load("s").unwrap().1))
                .unwrap();
            wait_idle(&store);
        } else {
            store.compress_sealed("s").unwrap();
        }
        assert!(
            !stale.exists(),
            "background {background}: a dead process's old temporary is removed"
        );
        assert!(
            fresh.exists(),
            "background {background}: a recent one may be a live writer's elsewhere"
        );
    }
}

#[test]
fn a_reader_follows_a_writer_whose_active_segment_is_sealed_and_compressed() {
    let dir = fast_tempdir();
    let writer = Store::open(dir.path(), options(true)).unwrap();
    let log = turn_log(60, "s");
    writer.create(SessionHeader::new("s", 0)).unwrap();
    writer.append("s", &log[..3]).unwrap();
    // The reader maps the first segment while it is the active one.
    let reader = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.load("s").unwrap().1, &log[..3]);
    let mut tail = reader.tail("s", 3).unwrap();
    for turn in log[3..].chunks(3) {
        writer.append("s", turn).unwrap();
    }
    wait_idle(&writer);
    let sdir = session_dir(dir.path(), "s");
    assert!(
        !sdir.join("00000000000000000000.seg").exists(),
        "compressed"
    );
    // Its active segment was sealed, then replaced by its image: the
    // follower and the reader read on, from the image.
    assert_eq!(tail.poll().unwrap(), &log[3..]);
    assert_eq!(reader.load("s").unwrap().1, log);
    reader.verify("s").unwrap();
}

#[test]
fn whole_log_reads_keep_no_image_decoded_and_derive_keeps_its_own() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    let log = write(&store, "s", 60);
    let done = store.compress_sealed("s").unwrap();
    assert!(done.segments >= 3, "{done:?}");
    store.close().unwrap();
    for use_checkpoint in [true, false] {
        if !use_checkpoint {
            // A rebuild decodes every image it folds.
            let sdir = session_dir(dir.path(), "s");
            assert!(common::checkpoint_place(&sdir).is_some());
            common::remove_checkpoint(&sdir);
        }
        let reader = Store::open_read_only(dir.path()).unwrap();
        let decoded = |what: &str| {
            let n = reader.stats("s").unwrap().decoded_bytes;
            eprintln!("{what}: {n}");
            n
        };
        assert_eq!(reader.load("s").unwrap().1, log);
        assert_eq!(decoded("after load"), 0, "checkpoint: {use_checkpoint}");
        let mut streamed = Vec::new();
        for e in reader.events("s", 0).unwrap() {
            streamed.push(e.unwrap());
        }
        assert_eq!(streamed, log);
        assert_eq!(decoded("after events"), 0);
        let messages = reader.derive("s").unwrap().messages().count();
        assert!(messages > 0);
        let kept = decoded("after derive");
        assert!(
            kept > 0 && kept <= done.raw_bytes,
            "{kept} of {}",
            done.raw_bytes
        );
        // The next derive uses what the first kept.
        assert_eq!(reader.derive("s").unwrap().messages().count(), messages);
        assert_eq!(decoded("after a second derive"), kept);
        reader.verify("s").unwrap();
        assert_eq!(decoded("after verify"), 0);
        assert_eq!(reader.derive("s").unwrap().messages().count(), messages);
    }
}

#[test]
fn an_import_is_compressed_once_published_and_leaves_no_temporary() {
    let dir = fast_tempdir();
    // Small records, so the import's batches fill several segments.
    let opts = Options {
        max_record: 4096,
        ..options(true)
    };
    let store = Store::open(dir.path(), opts).unwrap();
    let log = turn_log(80, "i");
    store
        .import(SessionHeader::new("i", 0), &log, false)
        .unwrap();
    wait_idle(&store);
    let status = store.compression_status();
    assert_eq!(status.last_error, None);
    let sdir = session_dir(dir.path(), "i");
    let names: Vec<String> = std::fs::read_dir(&sdir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !names.iter().any(|n| n.ends_with(".tmp")),
        "no temporary left: {names:?}"
    );
    let images = files(&sdir, ".segz").len() as u64;
    assert!(images >= 3, "{names:?}");
    assert_eq!(status.done.segments, images, "each compressed once");
    assert_eq!(files(&sdir, ".seg").len(), 1, "{names:?}");
    assert_eq!(store.load("i").unwrap().1, log);
    store.verify("i").unwrap();
}

#[test]
fn a_sealed_small_session_is_compressed_whole_and_appends_go_on() {
    let dir = fast_tempdir();
    // Default segment size: a small session never fills one.
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let log = write(&store, "s", 30);
    let expected = view(&store, "s");
    assert_eq!(
        store.compress_sealed("s").unwrap().segments,
        0,
        "nothing sealed"
    );
    assert!(store.seal("s").unwrap());
    assert!(!store.seal("s").unwrap(), "nothing left to seal");
    let done = store.compress_sealed("s").unwrap();
    assert_eq!(done.segments, 1);
    let sdir = session_dir(dir.path(), "s");
    assert!(files(&sdir, ".seg").is_empty(), "the whole log is an image");
    assert_eq!(view(&store, "s"), expected);
    let stats = store.stats("s").unwrap();
    assert_eq!(stats.sealed_bytes, stats.bytes, "no hot tail: {stats:?}");
    assert!(stats.bytes * 2 < stats.jsonl_bytes, "{stats:?}");
    store.close().unwrap();
    for reopened in [
        Store::open_read_only(dir.path()).unwrap(),
        Store::open(dir.path(), Options::default()).unwrap(),
    ] {
        assert_eq!(view(&reopened, "s"), expected);
        reopened.verify("s").unwrap();
    }
    // The next append starts a new segment after the image.
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let more = common::next_turn(&log);
    store.append("s", &more).unwrap();
    assert_eq!(files(&sdir, ".seg").len(), 1);
    store.close().unwrap();
    let reader = Store::open_read_only(dir.path()).unwrap();
    let (events, _) = view(&reader, "s");
    assert_eq!(&events[..log.len()], &log[..]);
    assert_eq!(&events[log.len()..], &more[..]);
    reader.verify("s").unwrap();
}

#[test]
fn a_raw_segment_listed_but_gone_is_read_from_its_image_everywhere() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    let log = write(&store, "s", 40);
    let expected = view(&store, "s");
    assert!(store.compress_sealed("s").unwrap().segments >= 2);
    store.close().unwrap();
    let stale: std::sync::Arc<dyn sessionlog::vfs::Vfs> =
        std::sync::Arc::new(hooked_fs::stale_listings());
    // Reads with and without the checkpoint (a rebuild maps every segment).
    for rebuild in [false, true] {
        if rebuild {
            common::remove_checkpoint(&session_dir(dir.path(), "s"));
        }
        let reader = Store::open_read_only_with_vfs(dir.path(), stale.clone()).unwrap();
        assert_eq!(view(&reader, "s"), expected, "rebuild: {rebuild}");
        reader.verify("s").unwrap();
        let salvaged = reader.salvage("s").unwrap();
        assert_eq!(salvaged.cut, None);
        assert_eq!(salvaged.events, log);
    }
    // A fork links the images it shares.
    let writer = Store::open_with_vfs(dir.path(), options(false), stale).unwrap();
    writer.fork("s", 60, SessionHeader::new("c", 0)).unwrap();
    assert_eq!(&writer.load("c").unwrap().1[..60], &log[..60]);
    assert!(!files(&session_dir(dir.path(), "c"), ".segz").is_empty());
    writer.verify("c").unwrap();
}

/// Decoded images are kept for later derives only within
/// `Options::max_decoded_images`: a derive that leaves the handle above it
/// gives its session's back (its `Derived` still reads them), so memory is
/// bounded however many sessions a handle derives.
#[test]
fn derive_keeps_decoded_images_only_within_the_budget() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    for id in ["a", "b"] {
        write(&store, id, 60);
        assert!(store.compress_sealed(id).unwrap().segments >= 3);
    }
    store.close().unwrap();
    let with_budget = |max_decoded_images: u64| {
        Store::open(
            dir.path(),
            Options {
                max_decoded_images,
                ..options(false)
            },
        )
        .unwrap()
    };
    let messages = |d: &sessionlog::store::Derived| -> Vec<String> {
        d.messages().map(|m| m.to_json()).collect()
    };
    // Unbounded: each session keeps what its derive decoded.
    let all = with_budget(u64::MAX);
    let (da, db) = (all.derive("a").unwrap(), all.derive("b").unwrap());
    let (ma, mb) = (messages(&da), messages(&db));
    assert!(!ma.is_empty() && !mb.is_empty());
    let kept_a = all.stats("a").unwrap().decoded_bytes;
    assert!(kept_a > 0 && all.stats("b").unwrap().decoded_bytes > 0);
    drop((da, db));
    all.close().unwrap();

    // Room for one session: the first keeps its images, the second not.
    let one = with_budget(kept_a);
    assert_eq!(messages(&one.derive("a").unwrap()), ma);
    assert_eq!(one.stats("a").unwrap().decoded_bytes, kept_a);
    let db = one.derive("b").unwrap();
    assert_eq!(one.stats("b").unwrap().decoded_bytes, 0);
    assert_eq!(messages(&db), mb, "the Derived keeps what it reads");
    drop(db);
    assert_eq!(messages(&one.derive("b").unwrap()), mb);
    assert_eq!(one.stats("b").unwrap().decoded_bytes, 0);
    assert_eq!(one.stats("a").unwrap().decoded_bytes, kept_a);
    one.close().unwrap();

    // None kept: every derive decodes what it reads, and reads it right
    // (a reader takes the bound too).
    let none = Store::open_read_only_with(
        dir.path(),
        Options {
            max_decoded_images: 0,
            ..Options::default()
        },
    )
    .unwrap();
    for _ in 0..2 {
        assert_eq!(messages(&none.derive("a").unwrap()), ma);
        assert_eq!(none.stats("a").unwrap().decoded_bytes, 0);
    }
}

/// A derive decodes the images it reads before it returns, even when an
/// earlier derive gave them back: an image damaged in between is an error
/// naming it, not a message missing from the `Derived`.
#[test]
fn a_derive_after_its_images_were_given_back_checks_them_again() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    write(&store, "s", 40);
    store.compress_sealed("s").unwrap();
    store.close().unwrap();
    let store = Store::open(
        dir.path(),
        Options {
            max_decoded_images: 0,
            ..options(false)
        },
    )
    .unwrap();
    let count = store.derive("s").unwrap().messages().count();
    assert!(count > 0);
    assert_eq!(store.stats("s").unwrap().decoded_bytes, 0);
    // Damaged in place (the image stays mapped: no truncation).
    let image = files(&session_dir(dir.path(), "s"), ".segz")[0].clone();
    let bytes = std::fs::read(&image).unwrap();
    let at = bytes.len() / 2;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(&[bytes[at] ^ 0x10]).unwrap();
    drop(f);
    match store.derive("s") {
        Err(e @ (Error::Corrupt { .. } | Error::Segment { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&*image.file_name().unwrap().to_string_lossy()),
                "{msg}"
            );
        }
        Err(other) => panic!("expected the image named: {other}"),
        Ok(d) => panic!(
            "a damaged image must fail the derive ({} messages)",
            d.messages().count()
        ),
    }
}

/// A reader that loaded a session between segments (its last one sealed,
/// no active one) sees the records of the next segment whatever became of
/// that file: still raw, sealed, or compressed into an image.
#[test]
fn a_reader_between_segments_sees_the_next_one_once_it_is_compressed() {
    let dir = fast_tempdir();
    let writer = Store::open(dir.path(), options(false)).unwrap();
    let log = turn_log(2, "s");
    writer.create(SessionHeader::new("s", 0)).unwrap();
    writer.append("s", &log[..3]).unwrap();
    assert!(writer.seal("s").unwrap());
    let reader = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.read_from("s", 0).unwrap(), log[..3]);
    writer.append("s", &log[3..]).unwrap();
    assert!(writer.seal("s").unwrap());
    let done = writer.compress_sealed("s").unwrap();
    assert!(done.segments >= 1, "{done:?}");
    // The segment from seq 3 on is an image now; no raw file of it is left.
    let sdir = session_dir(dir.path(), "s");
    assert_eq!(files(&sdir, ".segz").len(), 2, "{:?}", files(&sdir, ""));
    assert!(files(&sdir, ".seg").is_empty(), "{:?}", files(&sdir, ""));
    assert_eq!(reader.read_from("s", 0).unwrap(), log);
    assert_eq!(reader.next_seq("s").unwrap(), log.len() as u64);
}

/// The budget holds for every call that decodes images, not only derive:
/// a fork (which checks the parent's sealed segments) and a rebuild from
/// the log (a checkpoint found wrong) leave nothing decoded past it.
#[test]
fn calls_other_than_derive_keep_no_image_past_the_budget() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    let log = write(&store, "s", 60);
    assert!(store.compress_sealed("s").unwrap().segments >= 3);
    store.close().unwrap();
    let none = || {
        Store::open(
            dir.path(),
            Options {
                max_decoded_images: 0,
                ..options(false)
            },
        )
        .unwrap()
    };
    let store = none();
    store
        .fork("s", log.len() as u64, SessionHeader::new("child", 0))
        .unwrap();
    assert_eq!(store.stats("s").unwrap().decoded_bytes, 0);
    assert_eq!(store.load("child").unwrap().1.len(), log.len() + 1);
    store.close().unwrap();
    // A rebuild: the checkpoint's STATE damaged, found by `surface`.
    let sdir = session_dir(dir.path(), "s");
    let mut bytes = common::read_checkpoint(&sdir);
    let state = sessionlog::checkpoint::sections(&bytes).unwrap()
        [sessionlog::checkpoint::Section::State as usize]
        .clone();
    bytes[state.start + state.len() / 2] ^= 0x40;
    common::write_checkpoint_bytes(&sdir, &bytes);
    let store = none();
    store.surface("s").unwrap();
    assert!(store.recovery("s").unwrap().rebuild_reason.is_some());
    assert_eq!(store.stats("s").unwrap().decoded_bytes, 0);
}

/// A reader that found new records in the active segment, whose file is
/// then sealed and compressed (the raw file removed) before it maps it,
/// reads the session again from its files: the log, whole. Before, the map
/// failed with "No such file or directory" and a follower (`tail -f`) died.
#[test]
fn a_reader_whose_active_segment_is_compressed_before_its_map_reads_it_again() {
    let dir = fast_tempdir();
    let writer = std::sync::Arc::new(Store::open(dir.path(), options(false)).unwrap());
    let log = turn_log(4, "s");
    writer.create(SessionHeader::new("s", 0)).unwrap();
    writer.append("s", &log[..3]).unwrap();
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (hook_writer, hook_armed) = (writer.clone(), armed.clone());
    let vfs = std::sync::Arc::new(hooked_fs::HookedFs {
        before_map: Some(Box::new(move |p| {
            let raw = p.extension().is_some_and(|e| e == "seg");
            if raw && hook_armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                assert!(hook_writer.seal("s").unwrap());
                assert_eq!(hook_writer.compress_sealed("s").unwrap().segments, 1);
            }
        })),
        ..hooked_fs::HookedFs::default()
    });
    let reader = Store::open_read_only_with_vfs(dir.path(), vfs).unwrap();
    assert_eq!(reader.read_from("s", 0).unwrap(), log[..3]);
    writer.append("s", &log[3..]).unwrap();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut tail = reader.tail("s", 3).unwrap();
    assert_eq!(tail.poll().unwrap(), log[3..]);
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "the hook ran"
    );
    assert_eq!(reader.read_from("s", 0).unwrap(), log);
}

/// A follower told to wait for good (`Duration::MAX`) waits, and returns
/// what is appended (the deadline used to overflow the clock: a panic).
#[test]
fn a_follower_can_wait_for_good() {
    let dir = fast_tempdir();
    let writer = Store::open(dir.path(), options(false)).unwrap();
    let log = turn_log(2, "s");
    writer.create(SessionHeader::new("s", 0)).unwrap();
    writer.append("s", &log[..3]).unwrap();
    let reader = Store::open_read_only(dir.path()).unwrap();
    let mut tail = reader.tail("s", 3).unwrap();
    std::thread::scope(|scope| {
        let waiting = scope.spawn(move || tail.wait(Duration::MAX));
        std::thread::sleep(Duration::from_millis(100));
        writer.append("s", &log[3..]).unwrap();
        assert_eq!(waiting.join().unwrap().unwrap(), log[3..]);
    });
}

/// A seal a crash interrupted (footer written, preallocated zeros not yet
/// cut) is finished by the session's next writer, which cuts the file; the
/// writer then compresses the segment and forks the session. Before, the
/// writer kept its map of the file as it was before the cut, and still
/// used it once the segment was compressed: the fork's check of the
/// footer at the end of that map touched a page past the end of the file
/// and the process died of SIGBUS (or, with a longer file, the fork failed
/// with "no footer magic at the end of the file" naming the image).
#[test]
fn a_seal_its_writer_completed_is_read_to_its_end_and_forked_once_compressed() {
    let dir = fast_tempdir();
    let store = Store::open(dir.path(), options(false)).unwrap();
    let log = write(&store, "s", 3);
    assert!(store.seal("s").unwrap());
    store.close().unwrap();
    let sdir = session_dir(dir.path(), "s");
    let raw = files(&sdir, ".seg")[0].clone();
    let sealed = std::fs::metadata(&raw).unwrap().len();
    assert!(sealed < 4096 - 40, "the old end lies a page past the cut");
    // A crash between the footer's write and the cut: zeros after it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&raw)
        .unwrap()
        .set_len(4160)
        .unwrap();
    let store = Store::open(dir.path(), options(false)).unwrap();
    store.repair("s").unwrap();
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), sealed, "cut");
    assert_eq!(store.compress_sealed("s").unwrap().segments, 1);
    store
        .fork("s", log.len() as u64, SessionHeader::new("f", 0))
        .unwrap();
    let fork: Vec<OwnedEvent> = store.read_from("f", 0).unwrap();
    assert_eq!(&fork[..log.len()], &log[..]);
    store.verify("s").unwrap();
    store.verify("f").unwrap();
    store.close().unwrap();
}
