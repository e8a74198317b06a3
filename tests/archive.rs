//! The archive tier on object storage (issue 17): upload, eviction, fetch on
//! demand, resume on a second store directory (a second host), ownership
//! races and take-over, and an object store that fails or hangs mid-upload.
//!
//! Every test runs against `object_store`'s local file system backend, and
//! also against a real S3-compatible server when `SESSIONLOG_S3_ENDPOINT`
//! is set (`scripts/s3-server.sh start` prints one); without it the S3 runs
//! print "skipped" on stderr.
#![cfg(feature = "archive")]

mod common;
#[path = "common/hooked_fs.rs"]
mod hooked_fs;
#[path = "common/archive_support.rs"]
mod support;

#[path = "archive/fence.rs"]
mod fence;

use common::turn_log;
use sessionlog::event::OwnedEvent;
use sessionlog::header::SessionHeader;
use sessionlog::headerfile;
use sessionlog::store::object_store::{self, ObjectStore, path::Path as ObjectPath};
use sessionlog::store::{Error, EvictionPolicy, Options, Store};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use support::*;

#[test]
fn sealed_segments_are_uploaded_evicted_and_fetched_back_on_demand() {
    for bucket in buckets("evict") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let log = turn_log(200, "evict");
        let store = Store::open(
            &dir,
            host_options(&bucket, "a", EvictionPolicy::immediately()),
        )
        .unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &log);
        let session_dir = dir.join("sessions").join("s");
        let before = segment_files(&session_dir);
        assert!(before.len() > 3, "{}: the log spans segments", bucket.name);

        let report = store.archive_sync().unwrap();
        assert!(
            report.uploaded >= before.len() as u64,
            "{}: {report:?}",
            bucket.name
        );
        assert_eq!(report.evicted, before.len() as u64 - 1, "{}", bucket.name);
        // Only the tail is local now; the bucket has every segment and the
        // session's HEADER.
        assert_eq!(
            segment_files(&session_dir),
            vec![before.last().unwrap().clone()]
        );
        let keys: Vec<String> = objects(&bucket).into_iter().map(|(k, _)| k).collect();
        for name in before.iter().chain([&"HEADER".to_owned()]) {
            let key = format!("{}/sessions/s/{name}", bucket.prefix);
            assert!(
                keys.contains(&key),
                "{}: {key} missing in {keys:?}",
                bucket.name
            );
        }
        // The loaded session still reads (its maps outlive the files).
        assert_eq!(read_all(&store, "s"), log, "{}", bucket.name);
        store.close().unwrap();

        // Temporary files of fetches a killed process left: only the one
        // whose process is gone and that is a minute old goes, when the
        // session is next loaded. The one named with this process's pid
        // (a dead process's, the pid since reused) is the very name this
        // process's first fetch of that segment picks: it takes another.
        let dead = {
            let mut child = std::process::Command::new("true").spawn().unwrap();
            child.wait().unwrap();
            child.id()
        };
        let tmp_name = |pid: u32| format!(".{}.{pid}-0.fetch.tmp", before[0]);
        let stale = session_dir.join(tmp_name(dead));
        let fresh = session_dir.join(format!(".{}.{dead}-1.fetch.tmp", before[0]));
        let live = session_dir.join(tmp_name(std::process::id()));
        let two_minutes_ago = std::time::SystemTime::now() - Duration::from_secs(120);
        for (path, old) in [(&stale, true), (&fresh, false), (&live, true)] {
            let f = std::fs::File::create(path).unwrap();
            if old {
                f.set_modified(two_minutes_ago).unwrap();
            }
        }

        // Reopened: the evicted segments come back as the reads need them.
        let store =
            Store::open(&dir, host_options(&bucket, "a", EvictionPolicy::default())).unwrap();
        assert_eq!(read_all(&store, "s"), log, "{}", bucket.name);
        assert!(!stale.exists(), "{}", bucket.name);
        assert!(fresh.exists() && live.exists(), "{}", bucket.name);
        for path in [&fresh, &live] {
            std::fs::remove_file(path).unwrap();
        }
        let stats = store.archive_stats().unwrap();
        assert!(
            stats.objects_fetched >= before.len() as u64 - 1,
            "{}: {stats:?}",
            bucket.name
        );
        assert_eq!(segment_files(&session_dir), before, "{}", bucket.name);
        // And the session is writable again.
        let more = turn_log(201, "evict");
        store.append("s", &more[log.len()..]).unwrap();
        assert_eq!(read_all(&store, "s"), more, "{}", bucket.name);
        store.close().unwrap();
    }
}

/// A small session keeps its checkpoint in its HEADER (format-spec
/// section 6); the bucket gets a version-1 HEADER (readable by every build
/// that reads store version 3) and the checkpoint as an object of its own,
/// which a second host resumes from.
#[test]
fn an_embedded_checkpoint_goes_to_the_bucket_as_its_own_object() {
    for bucket in buckets("embedded") {
        let tmp = tempfile::tempdir().unwrap();
        let log = archived_session(&bucket, &tmp.path().join("a"), Some(turn_log(6, "small")));
        let local = std::fs::read(tmp.path().join("a/sessions/s/HEADER")).unwrap();
        let local = headerfile::decode(&local).unwrap();
        let embedded = local
            .checkpoint
            .expect("a small session embeds its checkpoint");
        assert!(!tmp.path().join("a/sessions/s/CHECKPOINT").exists());
        let find = |name: &str| {
            objects(&bucket)
                .into_iter()
                .find(|(k, _)| k.ends_with(&format!("/sessions/s/{name}")))
                .map(|(k, _)| object_bytes(&bucket.store, &k))
        };
        let theirs = find("HEADER").expect("the HEADER object");
        assert_eq!(&theirs[8..12], &1u32.to_le_bytes(), "{}", bucket.name);
        let theirs = headerfile::decode(&theirs).unwrap();
        assert_eq!(
            (theirs.uid, theirs.json, theirs.checkpoint),
            (local.uid, local.json, None),
            "{}",
            bucket.name
        );
        assert_eq!(
            find("CHECKPOINT").as_deref(),
            Some(embedded),
            "{}",
            bucket.name
        );

        let (b, _) = new_host(&bucket, &tmp.path().join("b"), "b");
        assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);
        assert!(b.recovery("s").unwrap().used_checkpoint, "{}", bucket.name);
        b.close().unwrap();
    }
}

#[test]
fn a_session_resumed_elsewhere_fetches_its_checkpoint_and_tail_then_old_segments_on_read() {
    for bucket in buckets("lazy") {
        let tmp = tempfile::tempdir().unwrap();
        let log = archived_session(&bucket, &tmp.path().join("a"), None);
        let segs = segment_objects(&bucket);
        assert!(segs.len() > 5, "{}: {segs:?}", bucket.name);
        let (last, last_size) = segs.last().unwrap().clone();
        let checkpoint_size = object_size(&bucket, "CHECKPOINT");
        // A fresh directory (a second host): opening the store brings the
        // store's MANIFEST and the session's HEADER (of the session's
        // objects, only it).
        let (b, (opened, opened_objects)) = new_host(&bucket, &tmp.path().join("b"), "b");
        let local = tmp.path().join("b").join("sessions").join("s");
        assert!(segment_files(&local).is_empty(), "{}", bucket.name);
        assert!(!local.join("CHECKPOINT").exists(), "{}", bucket.name);
        let base = |bytes: u64, objects: u64| (opened + bytes, opened_objects + objects);

        // First access: the checkpoint and the tail (the checkpoint covers
        // the whole log, so the tail is the last segment), not the log.
        assert_eq!(b.next_seq("s").unwrap(), log.len() as u64);
        assert_eq!(
            fetched(&b),
            base(checkpoint_size + last_size, 2),
            "{}: fetched more than HEADER, CHECKPOINT and {last}",
            bucket.name
        );
        assert_eq!(segment_files(&local), vec![last.clone()], "{}", bucket.name);

        // Reading the first events fetches the first segment, and only it.
        let first: Vec<OwnedEvent> = b
            .events("s", 0)
            .unwrap()
            .take(3)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(first, log[..3].to_vec(), "{}", bucket.name);
        let (first_name, first_size) = segs[0].clone();
        assert_eq!(
            fetched(&b),
            base(checkpoint_size + last_size + first_size, 3),
            "{}",
            bucket.name
        );
        assert_eq!(
            segment_files(&local),
            vec![first_name, last.clone()],
            "{}",
            bucket.name
        );

        // Reading it all, from four threads at once, fetches the rest,
        // each segment once.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| assert_eq!(read_all(&b, "s"), log, "{}", bucket.name));
            }
        });
        let all: u64 = segs.iter().map(|(_, n)| n).sum();
        assert_eq!(
            fetched(&b),
            base(checkpoint_size + all, 1 + segs.len() as u64),
            "{}",
            bucket.name
        );
        let names: Vec<String> = segs.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(segment_files(&local), names, "{}", bucket.name);
        b.derive("s").unwrap();
        b.verify("s").unwrap();

        // And the session is writable on this host.
        let more = turn_log(201, "lazy");
        b.append("s", &more[log.len()..]).unwrap();
        assert_eq!(read_all(&b, "s"), more, "{}", bucket.name);
        b.close().unwrap();
    }
}

#[test]
fn a_fork_of_a_resumed_session_fetches_the_segments_it_shares() {
    for bucket in buckets("lazyfork") {
        let tmp = tempfile::tempdir().unwrap();
        let log = archived_session(&bucket, &tmp.path().join("a"), None);
        let (b, _) = new_host(&bucket, &tmp.path().join("b"), "b");
        let at = turns_len(&log, 120) as u64;
        b.fork("s", at, SessionHeader::new("child", 1)).unwrap();
        let child = read_all(&b, "child");
        assert_eq!(child[..at as usize], log[..at as usize], "{}", bucket.name);
        assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);
        b.close().unwrap();
    }
}

#[test]
fn derive_of_a_resumed_session_fetches_only_the_segments_holding_surface_data() {
    for bucket in buckets("lazyderive") {
        let tmp = tempfile::tempdir().unwrap();
        // 200 turns, then a compaction: one summary replaces the whole
        // surface, so derive needs only the segment holding it.
        let mut log = turn_log(200, "lazy");
        let first = log
            .iter()
            .find(|e| e.source_event_seqs.is_some())
            .unwrap()
            .seq;
        let last = log.len() as u64 - 2;
        // Every node on the surface (all user messages but the two the
        // first compaction replaced) is shadowed.
        let sources: Vec<String> = log
            .iter()
            .filter(|e| e.kind == "user/message" && e.seq != 1 && e.seq != 4)
            .map(|e| e.seq.to_string())
            .collect();
        let sources = sources.join(",");
        let n = log.len() as u64;
        for json in [
            format!(r#"{{"type":"turn/start","seq":{n},"time":300,"data":{{"turn":201}}}}"#),
            format!(
                r#"{{"type":"user/message","seq":{},"time":300,"data":{{"role":"user","content":[{{"type":"text","text":"all of it, summarised"}}]}},"sourceEventSeqs":[{sources}],"surfaceOp":{{"op":"replace","start":{first},"end":{last}}}}}"#,
                n + 1
            ),
            format!(
                r#"{{"type":"turn/end","seq":{},"time":300,"data":{{"turn":201,"reason":{{"kind":"completed"}}}}}}"#,
                n + 2
            ),
        ] {
            log.push(
                sessionlog::event::Event::from_json(&json)
                    .unwrap()
                    .into_owned(),
            );
        }
        let log = archived_session(&bucket, &tmp.path().join("a"), Some(log));
        let segs = segment_objects(&bucket);
        let (_, last_size) = segs.last().unwrap().clone();
        let checkpoint_size = object_size(&bucket, "CHECKPOINT");
        let (b, (opened, opened_objects)) = new_host(&bucket, &tmp.path().join("b"), "b");
        let messages = |store: &Store| -> Vec<String> {
            let d = store.derive("s").unwrap();
            d.messages().map(|m| format!("{m:?}")).collect()
        };
        let derived = messages(&b);
        assert_eq!(
            fetched(&b),
            (opened + checkpoint_size + last_size, opened_objects + 2),
            "{}: derive fetched more than the checkpoint and the tail",
            bucket.name
        );
        let expected = messages(&Store::open_read_only(tmp.path().join("a")).unwrap());
        assert_eq!(derived, expected, "{}", bucket.name);
        assert_eq!(derived.len(), 1, "{}", bucket.name);
        assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);
        b.close().unwrap();
    }
}

#[test]
fn a_damaged_or_missing_archived_segment_is_an_error_naming_session_segment_and_key() {
    for bucket in buckets("lazybad") {
        let tmp = tempfile::tempdir().unwrap();
        archived_session(&bucket, &tmp.path().join("a"), None);
        let segs = segment_objects(&bucket);
        let key = |name: &str| format!("{}/sessions/s/{name}", bucket.prefix);
        let (b, _) = new_host(&bucket, &tmp.path().join("b"), "b");
        b.next_seq("s").unwrap(); // loaded: knows its segments are archived

        // One byte of the first segment's records flipped in the bucket.
        let (first, _) = &segs[0];
        let good = object_bytes(&bucket.store, &key(first));
        let mut bytes = good.clone();
        bytes[100] ^= 0x40;
        on_bucket(
            bucket
                .store
                .put(&ObjectPath::from(key(first)), bytes.into()),
        )
        .unwrap();
        // The second one deleted after the load listed it.
        let (second, _) = &segs[1];
        on_bucket(bucket.store.delete(&ObjectPath::from(key(second)))).unwrap();
        let second_seq: u64 = second.trim_end_matches(".seg").parse().unwrap();

        let archive_error = |e: Error, name: &str, what: &str| match e {
            Error::Archive {
                session,
                key: k,
                reason,
            } => {
                assert_eq!(session.as_deref(), Some("s"), "{}", bucket.name);
                assert_eq!(k, key(name), "{}", bucket.name);
                assert!(reason.contains(name), "{}: {reason}", bucket.name);
                assert!(reason.contains(what), "{}: {reason}", bucket.name);
            }
            other => panic!("{}: expected an archive error, got {other}", bucket.name),
        };
        archive_error(b.read_from("s", 0).unwrap_err(), first, "damaged");
        let item = b.events("s", second_seq).unwrap().next().unwrap();
        archive_error(item.unwrap_err(), second, "not in the archive");
        // Neither left a file behind, whole or partial.
        let local = tmp.path().join("b").join("sessions").join("s");
        assert_eq!(
            segment_files(&local),
            vec![segs.last().unwrap().0.clone()],
            "{}",
            bucket.name
        );
        let names: Vec<String> = std::fs::read_dir(&local)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains("tmp")),
            "{}: {names:?}",
            bucket.name
        );
        b.close().unwrap();

        // A segment the checkpoint covers that is neither local nor in the
        // bucket is damage to the log, as without an archive.
        on_bucket(bucket.store.put(&ObjectPath::from(key(first)), good.into())).unwrap();
        let (c, _) = new_host(&bucket, &tmp.path().join("c"), "c");
        match c.next_seq("s") {
            Err(Error::Corrupt { session, .. }) => assert_eq!(session, "s"),
            other => panic!("{}: expected corruption, got {other:?}", bucket.name),
        }
    }
}

/// An id whose directory name has escapes (`~`, which object keys encode).
const ID: &str = "{{run}} 42/\u{3b1}";

#[test]
fn the_background_uploader_uploads_sealed_segments_but_not_the_active_one() {
    for bucket in buckets("background") {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = host_options(&bucket, "a", EvictionPolicy::default());
        opts.archive.as_mut().unwrap().upload_interval = Duration::from_millis(20);
        let store = Store::open(tmp.path().join("a"), opts).unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &turn_log(60, "background"));
        let local = segment_files(&tmp.path().join("a").join("sessions").join("s"));
        let sealed: Vec<String> = local[..local.len() - 1]
            .iter()
            .map(|n| format!("{}/sessions/s/{n}", bucket.prefix))
            .collect();
        // Not a timing test: a generous deadline for a pass every 20 ms.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let keys = loop {
            let keys: Vec<String> = objects(&bucket).into_iter().map(|(k, _)| k).collect();
            if sealed.iter().all(|k| keys.contains(k)) || std::time::Instant::now() > deadline {
                break keys;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            sealed.iter().all(|k| keys.contains(k)),
            "{}: {keys:?}",
            bucket.name
        );
        let active = format!("{}/sessions/s/{}", bucket.prefix, local.last().unwrap());
        assert!(
            !keys.contains(&active),
            "{}: {active} uploaded",
            bucket.name
        );
        store.close().unwrap();
        // Close uploads the active segment too.
        let keys: Vec<String> = objects(&bucket).into_iter().map(|(k, _)| k).collect();
        assert!(keys.contains(&active), "{}", bucket.name);
    }
}

#[test]
fn a_second_host_lists_and_resumes_a_session_from_the_bucket_alone() {
    for bucket in buckets("resume") {
        let tmp = tempfile::tempdir().unwrap();
        let log = turn_log(120, "resume");
        let a = Store::open(
            tmp.path().join("a"),
            host_options(&bucket, "a", EvictionPolicy::default()),
        )
        .unwrap();
        a.create(SessionHeader::new(ID, 7)).unwrap();
        let cut = turns_len(&log, 80);
        append_turns(&a, ID, &log[..cut]);
        // Close uploads the active segment too and gives the lease up.
        a.close().unwrap();

        let b = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        assert_eq!(
            b.store_id(),
            Store::open_read_only(tmp.path().join("a"))
                .unwrap()
                .store_id()
        );
        let listed: Vec<String> = b.list().unwrap().into_iter().map(|h| h.id).collect();
        assert_eq!(listed, vec![ID.to_owned()], "{}", bucket.name);
        assert_eq!(read_all(&b, ID), log[..cut].to_vec(), "{}", bucket.name);
        append_turns(&b, ID, &log[cut..]);
        b.close().unwrap();

        // Back on the first host: its copy is stale; taking the session
        // back brings what the second host wrote.
        let a = Store::open(
            tmp.path().join("a"),
            host_options(&bucket, "a", EvictionPolicy::default()),
        )
        .unwrap();
        let more = turn_log(121, "resume");
        a.append(ID, &more[log.len()..]).unwrap();
        assert_eq!(read_all(&a, ID), more, "{}", bucket.name);
        a.close().unwrap();
    }
}

/// The store format version of MANIFEST bytes (format-spec section 2: a
/// u32 at byte 8).
fn manifest_version(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

#[test]
fn compressed_sealed_segments_stay_local_the_bucket_gets_them_raw() {
    for bucket in buckets("images") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let log = turn_log(200, "images");
        let compressing = |evict| Options {
            compress_sealed: true,
            ..host_options(&bucket, "a", evict)
        };
        let store = Store::open(&dir, compressing(EvictionPolicy::default())).unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &log);
        store.compress_sealed("s").unwrap();
        let session_dir = dir.join("sessions").join("s");
        let images = files_ending(&session_dir, ".segz");
        assert!(images.len() > 2, "{}: {images:?}", bucket.name);
        assert_eq!(
            files_ending(&session_dir, ".seg").len(),
            1,
            "only the active one"
        );

        // Uploaded as the raw segments they decode to: one object per
        // segment, under the raw name, of the length the image header
        // gives (format-spec 3.5: a u64 at byte 12); no image objects.
        store.archive_sync().unwrap();
        let objects = objects(&bucket);
        assert!(
            objects.iter().all(|(k, _)| !k.ends_with(".segz")),
            "{}: {objects:?}",
            bucket.name
        );
        for image in &images {
            let bytes = std::fs::read(session_dir.join(image)).unwrap();
            let raw_len = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
            let key = format!(
                "{}/sessions/s/{}",
                bucket.prefix,
                image.strip_suffix('z').unwrap()
            );
            assert!(
                objects.contains(&(key.clone(), raw_len)),
                "{}: {key} of {raw_len} bytes missing in {objects:?}",
                bucket.name
            );
        }
        store.close().unwrap();
        // The local store is version 5 (it holds images); the bucket's
        // MANIFEST is the version-3 form of the same store.
        assert_eq!(
            manifest_version(&std::fs::read(dir.join("MANIFEST")).unwrap()),
            5
        );
        let theirs = objects
            .iter()
            .find(|(k, _)| k.ends_with("/MANIFEST"))
            .expect("the bucket's MANIFEST");
        let bucket_manifest = object_bytes(&bucket.store, &theirs.0);
        assert_eq!(manifest_version(&bucket_manifest), 3, "{}", bucket.name);

        // A host without the option resumes from the bucket alone: every
        // segment it fetches is a raw segment that passes its whole check.
        let b = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);
        b.close().unwrap();

        // Back on the first host (its MANIFEST is version 5, the bucket's
        // 3: one store), with eviction: the images go once their raw
        // objects are confirmed, and reads fetch the raw segments back.
        let store = Store::open(&dir, compressing(EvictionPolicy::immediately())).unwrap();
        let more = turn_log(201, "images");
        store.append("s", &more[log.len()..]).unwrap();
        let report = store.archive_sync().unwrap();
        assert!(
            report.evicted >= images.len() as u64,
            "{}: {report:?}",
            bucket.name
        );
        assert!(
            files_ending(&session_dir, ".segz").is_empty(),
            "{}",
            bucket.name
        );
        store.close().unwrap();
        let store = Store::open(&dir, compressing(EvictionPolicy::default())).unwrap();
        assert_eq!(read_all(&store, "s"), more, "{}", bucket.name);
        store.close().unwrap();
    }
}

#[test]
fn a_fork_compresses_what_it_inherited_and_the_bucket_still_gets_raw_segments() {
    for bucket in buckets("fork-images") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let log = turn_log(200, "fork-images");
        let store =
            Store::open(&dir, host_options(&bucket, "a", EvictionPolicy::default())).unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &log);
        let at = turns_len(&log, 150) as u64;
        store.fork("s", at, SessionHeader::new("c", 1)).unwrap();
        let child = read_all(&store, "c");
        // The parent gone, the fork alone links what it inherited and
        // compresses it (images named under the parent's uid, LINEAGE).
        store.delete("s").unwrap();
        let done = store.compress_sealed("c").unwrap();
        assert!(
            done.segments >= 2 && done.shared == 0,
            "{}: {done:?}",
            bucket.name
        );
        store.archive_sync().unwrap();
        let objects = objects(&bucket);
        assert!(
            objects.iter().all(|(k, _)| !k.ends_with(".segz")),
            "{}: {objects:?}",
            bucket.name
        );
        assert_eq!(read_all(&store, "c"), child, "{}", bucket.name);
        store.close().unwrap();

        // A second host resumes the fork from the bucket alone.
        let b = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        assert_eq!(read_all(&b, "c"), child, "{}", bucket.name);
        b.verify("c").unwrap();
        b.close().unwrap();
    }
}

/// Session "s" of a 120-turn log, its first 100 turns written in `dir`
/// without an archive (the bucket has none of it) and its sealed segments
/// compressed; returns the log, the length written and the images made.
fn compressed_without_archive(dir: &Path, tag: &str) -> (Vec<OwnedEvent>, usize, u64) {
    let log = turn_log(120, tag);
    let cut = turns_len(&log, 100);
    let plain = Options {
        segment_size: 4096,
        preallocate: 4096,
        ..Options::default()
    };
    let store = Store::open(dir, plain).unwrap();
    store.create(SessionHeader::new("s", 0)).unwrap();
    append_turns(&store, "s", &log[..cut]);
    let images = store.compress_sealed("s").unwrap().segments;
    assert!(images > 2, "{tag}: {images} images");
    store.close().unwrap();
    (log, cut, images)
}

#[test]
fn a_segment_compressed_after_the_uploader_listed_it_is_uploaded_from_its_image() {
    for bucket in buckets("stale-images") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let (log, cut, images) = compressed_without_archive(&dir, "stale-images");
        // Every listing shows the images under their raw names: the
        // uploader maps a raw file that is gone, and must read the image.
        let stale: Arc<dyn sessionlog::vfs::Vfs> = Arc::new(hooked_fs::stale_listings());
        let store = Store::open_with_vfs(
            &dir,
            host_options(&bucket, "a", EvictionPolicy::default()),
            stale,
        )
        .unwrap();
        append_turns(&store, "s", &log[cut..]);
        store.archive_sync().unwrap();
        let uploaded = segment_objects(&bucket).len() as u64;
        assert!(uploaded > images, "{}: {uploaded} objects", bucket.name);
        store.close().unwrap();
        let b = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);
        b.close().unwrap();
    }
}

#[test]
fn a_damaged_local_image_is_never_uploaded_and_the_pass_names_it() {
    for bucket in buckets("bad-image") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let (log, cut, _) = compressed_without_archive(&dir, "bad-image");
        // One byte of an image's compressed data changed on the disk.
        let session_dir = dir.join("sessions").join("s");
        let images = files_ending(&session_dir, ".segz");
        let damaged = session_dir.join(&images[1]);
        let mut bytes = std::fs::read(&damaged).unwrap();
        bytes[40] ^= 0x10;
        std::fs::write(&damaged, &bytes).unwrap();

        let store = Store::open(
            &dir,
            host_options(&bucket, "a", EvictionPolicy::immediately()),
        )
        .unwrap();
        append_turns(&store, "s", &log[cut..]);
        match store.archive_sync() {
            Err(Error::Corrupt {
                session, segment, ..
            }) => {
                assert_eq!(segment, damaged, "{}", bucket.name);
                assert_eq!(session, "s", "{}", bucket.name);
            }
            other => panic!("{}: {other:?}", bucket.name),
        }
        // Nothing of it went up, nor a checkpoint the bucket could not
        // back; the image is still there (for verify), not evicted.
        let names: Vec<String> = objects(&bucket).into_iter().map(|(k, _)| k).collect();
        let raw_name = images[1].strip_suffix('z').unwrap();
        assert!(
            !names
                .iter()
                .any(|k| k.ends_with(&format!("/sessions/s/{raw_name}"))),
            "{}: {names:?}",
            bucket.name
        );
        assert!(
            !names.iter().any(|k| k.ends_with("/sessions/s/CHECKPOINT")),
            "{}: {names:?}",
            bucket.name
        );
        assert_eq!(std::fs::read(&damaged).unwrap(), bytes, "{}", bucket.name);
        drop(store);
    }
}

#[test]
fn of_two_hosts_racing_for_a_new_session_exactly_one_writes() {
    for bucket in buckets("race") {
        let tmp = tempfile::tempdir().unwrap();
        let hosts: Vec<Store> = ["a", "b"]
            .iter()
            .map(|h| {
                Store::open(
                    tmp.path().join(h),
                    host_options(&bucket, h, EvictionPolicy::default()),
                )
                .unwrap()
            })
            .collect();
        let log = turn_log(3, "race");
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let results: Vec<Result<(), Error>> = std::thread::scope(|scope| {
            let handles: Vec<_> = hosts
                .iter()
                .map(|store| {
                    let (barrier, log) = (barrier.clone(), &log);
                    scope.spawn(move || {
                        store.create(SessionHeader::new("r", 0)).unwrap();
                        barrier.wait();
                        store.append("r", log)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<usize> = (0..2).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(won.len(), 1, "{}: {results:?}", bucket.name);
        let lost = 1 - won[0];
        match &results[lost] {
            Err(Error::NotOwner { session, owner, .. }) => {
                assert_eq!(session, "r");
                assert_eq!(owner, ["a", "b"][won[0]], "{}", bucket.name);
            }
            other => panic!("{}: the loser got {other:?}", bucket.name),
        }
        // The loser wrote nothing.
        let loser_dir = tmp.path().join(["a", "b"][lost]).join("sessions").join("r");
        assert!(
            !loser_dir.exists() || segment_files(&loser_dir).is_empty(),
            "{}",
            bucket.name
        );
        for h in hosts {
            h.close().unwrap();
        }
    }
}

#[test]
fn a_host_whose_session_was_taken_over_fails_before_writing_a_byte() {
    for bucket in buckets("takeover") {
        let tmp = tempfile::tempdir().unwrap();
        let log = turn_log(40, "takeover");
        let a = Store::open(
            tmp.path().join("a"),
            host_options(&bucket, "a", EvictionPolicy::default()),
        )
        .unwrap();
        a.create(SessionHeader::new("s", 0)).unwrap();
        let cut = turns_len(&log, 20);
        append_turns(&a, "s", &log[..cut]);
        a.archive_sync().unwrap();

        // Host b: the session is a's.
        let b = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        match b.append("s", &log[cut..cut + 1]) {
            Err(Error::NotOwner { owner, .. }) => assert_eq!(owner, "a", "{}", bucket.name),
            other => panic!("{}: {other:?}", bucket.name),
        }
        // a is presumed gone: b takes the session over and writes.
        b.take_over("s").unwrap();
        append_turns(&b, "s", &log[cut..]);
        assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);

        // a is not gone after all: its next pass finds the loss, and its
        // next append fails without touching the file.
        let a_dir = tmp.path().join("a").join("sessions").join("s");
        let sizes = |d: &Path| -> Vec<u64> {
            segment_files(d)
                .iter()
                .map(|n| std::fs::metadata(d.join(n)).unwrap().len())
                .collect()
        };
        let report = a.archive_sync().unwrap();
        assert_eq!(report.fenced, vec!["s".to_owned()], "{}", bucket.name);
        let before = sizes(&a_dir);
        match a.append("s", &log[cut..cut + 1]) {
            Err(Error::NotOwner { session, owner, .. }) => {
                assert_eq!(
                    (session.as_str(), owner.as_str()),
                    ("s", "b"),
                    "{}",
                    bucket.name
                );
            }
            other => panic!("{}: {other:?}", bucket.name),
        }
        assert_eq!(sizes(&a_dir), before, "{}", bucket.name);
        b.close().unwrap();
        let _ = a.close();
    }
}

#[test]
fn a_deleted_session_leaves_the_bucket_and_other_hosts_lists() {
    for bucket in buckets("delete") {
        let tmp = tempfile::tempdir().unwrap();
        let opts = |h: &str| host_options(&bucket, h, EvictionPolicy::default());
        let a = Store::open(tmp.path().join("a"), opts("a")).unwrap();
        for id in ["keep", "gone"] {
            a.create(SessionHeader::new(id, 0)).unwrap();
            append_turns(&a, id, &turn_log(30, id));
        }
        a.archive_sync().unwrap();
        a.delete("gone").unwrap();
        let keys: Vec<String> = objects(&bucket).into_iter().map(|(k, _)| k).collect();
        assert!(
            keys.iter().all(|k| !k.contains("/sessions/gone/")),
            "{}: {keys:?}",
            bucket.name
        );
        a.close().unwrap();
        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        let listed: Vec<String> = b.list().unwrap().into_iter().map(|h| h.id).collect();
        assert_eq!(listed, vec!["keep".to_owned()], "{}", bucket.name);
        b.close().unwrap();
    }
}

/// Host "a" writes session "s" (returned) under `root/a` and closes; host
/// "b" reads it whole into `root/b` (a local copy) and closes; "a" opens
/// again and deletes "s" (its handle returned, open).
fn copied_then_deleted(bucket: &Bucket, root: &Path) -> (Vec<OwnedEvent>, Store) {
    let opts = |h: &str| host_options(bucket, h, EvictionPolicy::default());
    let log = turn_log(30, "t");
    let a = Store::open(root.join("a"), opts("a")).unwrap();
    a.create(SessionHeader::new("s", 0)).unwrap();
    append_turns(&a, "s", &log);
    a.close().unwrap();
    let b = Store::open(root.join("b"), opts("b")).unwrap();
    assert_eq!(read_all(&b, "s"), log, "{}", bucket.name);
    b.close().unwrap();
    let a = Store::open(root.join("a"), opts("a")).unwrap();
    a.delete("s").unwrap();
    (log, a)
}

/// A host holding a copy of a session another host then deletes must not
/// bring the session back by writing it: before, its next append took
/// the lease (released by the deleting host's close) and uploaded its
/// stale copy, and every host listed the deleted session again. The
/// delete now leaves a tombstone (the next lease record, marked
/// `deleted`); a host whose copy predates it is refused with
/// `Error::DeletedElsewhere` when it writes or reads the copy, which is
/// kept but not listed; a new session of that id, or `take_over`, goes
/// past it.
#[test]
fn a_stale_copy_never_brings_a_deleted_session_back() {
    for bucket in buckets("tombstone") {
        let tmp = tempfile::tempdir().unwrap();
        let opts = |h: &str| host_options(&bucket, h, EvictionPolicy::default());
        let (log, a) = copied_then_deleted(&bucket, tmp.path());
        a.close().unwrap();

        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        // Nor listed (before, b's listing read its own directory and asked
        // the bucket only for sessions b lacked).
        assert!(b.list().unwrap().is_empty(), "{}: listed", bucket.name);
        let deleted_by_a = |r: Result<(), Error>, what: &str| match r {
            Err(Error::DeletedElsewhere { session, host, .. }) => {
                assert_eq!(
                    (session.as_str(), host.as_str()),
                    ("s", "a"),
                    "{}",
                    bucket.name
                )
            }
            other => panic!("{}: {what}: {other:?}", bucket.name),
        };
        let more = turn_log(31, "t");
        deleted_by_a(b.append("s", &more[log.len()..]), "an append");
        // Nor is it read as if the session still existed (before, only
        // writes were refused).
        deleted_by_a(b.read_from("s", 0).map(drop), "a read");
        b.close().unwrap();
        // The copy is kept: the store opened without the archive lists and
        // reads it.
        let plain = Store::open(tmp.path().join("b"), Options::default()).unwrap();
        assert_eq!(plain.list().unwrap().len(), 1, "{}", bucket.name);
        assert_eq!(
            read_all(&plain, "s"),
            log,
            "{}: the copy is kept",
            bucket.name
        );
        plain.close().unwrap();
        // What the refusal asks for: deleting the copy here too.
        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        b.delete("s").unwrap();
        assert!(b.list().unwrap().is_empty(), "{}", bucket.name);
        b.close().unwrap();
        let c = Store::open(tmp.path().join("c"), opts("c")).unwrap();
        assert!(c.list().unwrap().is_empty(), "{}", bucket.name);
        // A new session of that id goes past the tombstone.
        c.create(SessionHeader::new("s", 5)).unwrap();
        append_turns(&c, "s", &log[..4]);
        assert_eq!(c.list().unwrap().len(), 1, "{}: the new one", bucket.name);
        c.close().unwrap();
        let d = Store::open(tmp.path().join("d"), opts("d")).unwrap();
        assert_eq!(read_all(&d, "s"), log[..4], "{}", bucket.name);
        d.close().unwrap();
    }
}

/// A host holding a copy of a session that another host then deleted and
/// created again. Before, loading the copy fetched the new incarnation's
/// checkpoint into it (the load then failed as "damaged or replaced"),
/// and deleting the copy deleted the new session's objects from the
/// bucket: gone from every host. Now the copy is refused
/// (`Error::ReplacedElsewhere`), nothing fetched into it; deleting it
/// deletes it here only, after which the archive's session reads.
#[test]
fn a_stale_copy_of_a_session_created_again_is_refused_and_deleted_here_only() {
    for bucket in buckets("recreated") {
        let tmp = tempfile::tempdir().unwrap();
        let opts = |h: &str| host_options(&bucket, h, EvictionPolicy::default());
        let (_, a) = copied_then_deleted(&bucket, tmp.path());
        let new = turn_log(12, "n");
        a.create(SessionHeader::new("s", 9)).unwrap();
        append_turns(&a, "s", &new);
        a.close().unwrap();

        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        let stale = |r: Result<(), Error>, what: &str| match r {
            Err(Error::ReplacedElsewhere { session, .. }) => assert_eq!(session, "s"),
            other => panic!("{}: {what}: {other:?}", bucket.name),
        };
        stale(b.read_from("s", 0).map(drop), "read");
        let more = turn_log(13, "n");
        stale(b.append("s", &more[new.len()..]), "append");
        b.delete("s").unwrap();
        b.close().unwrap();
        // (A handle brings in other hosts' sessions when it opens.)
        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        assert_eq!(
            read_all(&b, "s"),
            new,
            "{}: the archive's, here",
            bucket.name
        );
        b.close().unwrap();
        let d = Store::open(tmp.path().join("d"), opts("d")).unwrap();
        assert_eq!(
            read_all(&d, "s"),
            new,
            "{}: the archive's, elsewhere",
            bucket.name
        );
        d.close().unwrap();
    }
}

/// The same stale copy, deleted while the host that created the session
/// again still holds its lease. Before, the delete failed with
/// `Error::NotOwner`: it took the lease first, as any delete does, though
/// deleting a stale copy touches nothing of the bucket. Now it deletes the
/// copy here only; the other host goes on writing, and its session is
/// whole everywhere.
#[test]
fn a_stale_copy_is_deleted_here_while_another_host_writes_the_new_session() {
    for bucket in buckets("recreated-held") {
        let tmp = tempfile::tempdir().unwrap();
        let opts = |h: &str| host_options(&bucket, h, EvictionPolicy::default());
        let (_, a) = copied_then_deleted(&bucket, tmp.path());
        let new = turn_log(12, "n");
        a.create(SessionHeader::new("s", 9)).unwrap();
        let half = turns_len(&new, 6);
        append_turns(&a, "s", &new[..half]);
        a.archive_sync().unwrap(); // the new HEADER in the bucket, the lease held

        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        match b.read_from("s", 0) {
            Err(Error::ReplacedElsewhere { session, .. }) => assert_eq!(session, "s"),
            other => panic!("{}: {other:?}", bucket.name),
        }
        b.delete("s")
            .unwrap_or_else(|e| panic!("{}: the stale copy: {e}", bucket.name));
        assert!(
            !tmp.path().join("b/sessions/s").exists(),
            "{}: the copy is gone here",
            bucket.name
        );
        b.close().unwrap();

        append_turns(&a, "s", &new[half..]);
        a.close().unwrap();
        for host in ["b", "d"] {
            let h = Store::open(tmp.path().join(host), opts(host)).unwrap();
            assert_eq!(read_all(&h, "s"), new, "{}: on {host}", bucket.name);
            h.close().unwrap();
        }
    }
}

/// `import --replace` deletes the old session's objects before its local
/// exchange (the new session's files have the same names). Before, an
/// exchange that then failed left the old session in place without the
/// segments only the bucket held (evicted here): its events gone, and
/// nothing said so until a read failed. Now what only the bucket holds is
/// fetched back first: the old session stays whole, here and (uploaded
/// again at close) on another host.
#[test]
fn a_replace_whose_exchange_fails_keeps_the_old_session_whole() {
    for bucket in buckets("replace-fails") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let fail = Arc::new(AtomicU32::new(0));
        let vfs = failing_exchange(&fail);
        let store = Store::open_with_vfs(
            &dir,
            host_options(&bucket, "a", EvictionPolicy::immediately()),
            vfs,
        )
        .unwrap();
        let old = turn_log(120, "old");
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &old);
        let report = store.archive_sync().unwrap();
        assert!(report.evicted > 2, "{}: {report:?}", bucket.name);

        let new = turn_log(40, "new");
        fail.store(1, Ordering::SeqCst);
        let replaced = store.import(SessionHeader::new("s", 0), &new, true);
        assert!(replaced.is_err(), "{}: {replaced:?}", bucket.name);
        store.close().unwrap();
        // Read from the files (the handle's maps of evicted segments
        // outlive them).
        let store =
            Store::open(&dir, host_options(&bucket, "a", EvictionPolicy::default())).unwrap();
        assert_eq!(read_all(&store, "s"), old, "{}", bucket.name);
        store.verify("s").unwrap();
        store.close().unwrap();

        let (b, _) = new_host(&bucket, &tmp.path().join("b"), "b");
        assert_eq!(read_all(&b, "s"), old, "{}: another host", bucket.name);
        b.close().unwrap();
    }
}

/// A file system whose exchanges fail while `fail` counts down.
fn failing_exchange(fail: &Arc<AtomicU32>) -> Arc<hooked_fs::HookedFs> {
    let fail = fail.clone();
    Arc::new(hooked_fs::HookedFs {
        before_exchange: Some(Box::new(move |_| {
            if take(&fail) {
                return Err(std::io::Error::other("injected: the exchange fails"));
            }
            Ok(())
        })),
        ..hooked_fs::HookedFs::default()
    })
}

/// A background upload pass of the same handle that runs while `import
/// --replace` is between deleting the old session's objects and its
/// exchange. Before, it uploaded the old session's files again and
/// recorded them, so the new session's files under the same names never
/// went up: another host read the old session's `HEADER` (and segments)
/// under the new one's name. Now a pass waits for the replace.
#[test]
fn an_upload_pass_waits_for_a_replace_between_its_forget_and_its_exchange() {
    for bucket in buckets("replace-pass") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let armed = Arc::new(AtomicU32::new(0));
        let vfs = Arc::new(hooked_fs::HookedFs {
            before_exchange: Some(Box::new({
                let armed = armed.clone();
                move |_| {
                    if take(&armed) {
                        // Background passes (every 20 ms) have time to run
                        // before the exchange, unless they wait.
                        std::thread::sleep(Duration::from_millis(400));
                    }
                    Ok(())
                }
            })),
            ..hooked_fs::HookedFs::default()
        });
        let mut options = host_options(&bucket, "a", EvictionPolicy::default());
        options.archive.as_mut().unwrap().upload_interval = Duration::from_millis(20);
        let store = Store::open_with_vfs(&dir, options, vfs).unwrap();
        let old = turn_log(60, "old");
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &old);
        store.archive_sync().unwrap();

        let new = turn_log(90, "new");
        armed.store(1, Ordering::SeqCst);
        store
            .import(SessionHeader::new("s", 7), &new, true)
            .unwrap();
        store.archive_sync().unwrap();
        store.close().unwrap();

        let (b, _) = new_host(&bucket, &tmp.path().join("b"), "b");
        let listed = b.list().unwrap();
        assert_eq!(listed[0].created_at, 7, "{}: the new HEADER", bucket.name);
        assert_eq!(read_all(&b, "s"), new, "{}: another host", bucket.name);
        b.close().unwrap();
    }
}

/// Another process of the host (a second handle on the same directory,
/// which does not write the session) evicting while `import --replace` is
/// deleting the old session's objects. Before, its eviction (confirmed by a
/// `HEAD`, the objects not yet deleted) removed segments the replace had
/// just found local, so a failed exchange left the old session without
/// them, and their objects deleted too. Now an eviction holds the writer
/// lock of a session it does not write while it removes its files: a
/// session being replaced (or written) elsewhere is left to that handle.
#[test]
fn another_handles_eviction_leaves_a_session_being_replaced_whole() {
    for bucket in buckets("replace-evict") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let fail = Arc::new(AtomicU32::new(0));
        let vfs = failing_exchange(&fail);
        let flaky = Arc::new(Flaky::over(bucket.store.clone()));
        let mut options = host_options(&bucket, "a", EvictionPolicy::default());
        options.archive.as_mut().unwrap().store = flaky.clone();
        let writer = Store::open_with_vfs(&dir, options, vfs).unwrap();
        let old = turn_log(120, "old");
        writer.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&writer, "s", &old);
        writer.archive_sync().unwrap();
        let local = segment_files(&dir.join("sessions").join("s"));
        assert!(local.len() > 2, "{}: {local:?}", bucket.name);
        let evictor = Store::open(
            &dir,
            host_options(&bucket, "a", EvictionPolicy::immediately()),
        )
        .unwrap();

        fail.store(1, Ordering::SeqCst);
        flaky.park_deletes.store(1, Ordering::SeqCst);
        let evicted = std::thread::scope(|scope| {
            let replace = scope
                .spawn(|| writer.import(SessionHeader::new("s", 0), &turn_log(40, "new"), true));
            while flaky.parked.load(Ordering::SeqCst) == 0 && !replace.is_finished() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let report = evictor.archive_sync();
            flaky.release.store(1, Ordering::SeqCst);
            let replaced = replace.join().unwrap();
            assert!(replaced.is_err(), "{}: {replaced:?}", bucket.name);
            report.unwrap().evicted
        });
        assert_eq!(evicted, 0, "{}", bucket.name);
        assert_eq!(
            segment_files(&dir.join("sessions").join("s")),
            local,
            "{}",
            bucket.name
        );
        writer.close().unwrap();
        let store =
            Store::open(&dir, host_options(&bucket, "a", EvictionPolicy::default())).unwrap();
        assert_eq!(read_all(&store, "s"), old, "{}", bucket.name);
        store.close().unwrap();

        // With no writer left, the other handle evicts the session's
        // sealed segments (uploaded again at the writer's close).
        let report = evictor.archive_sync().unwrap();
        assert!(report.evicted > 2, "{}: {report:?}", bucket.name);
        assert_eq!(read_all(&evictor, "s"), old, "{}", bucket.name);
        evictor.close().unwrap();
    }
}

/// A delete while an upload pass of the same handle is uploading the
/// session (F65's delete window): the pass read the session's files
/// before the delete removed them, so an upload landing after the delete
/// deleted the objects brought the session's `HEADER` back, and other
/// hosts listed it. The delete now waits for the pass.
#[test]
fn a_delete_waits_for_an_upload_pass_in_flight() {
    for bucket in buckets("delete-pass") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let flaky = Arc::new(Flaky::over(bucket.store.clone()));
        let mut options = host_options(&bucket, "a", EvictionPolicy::default());
        options.archive.as_mut().unwrap().store = flaky.clone();
        let store = Store::open(&dir, options).unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&store, "s", &turn_log(30, "d"));
        flaky.park_session_puts.store(1, Ordering::SeqCst);
        std::thread::scope(|scope| {
            let pass = scope.spawn(|| store.archive_sync());
            while flaky.parked.load(Ordering::SeqCst) == 0 && !pass.is_finished() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let delete = scope.spawn(|| store.delete("s"));
            // The delete would run to its end now, unless it waits.
            std::thread::sleep(Duration::from_millis(300));
            flaky.release.store(1, Ordering::SeqCst);
            let _ = pass.join().unwrap(); // its files may be gone under it
            delete.join().unwrap().unwrap();
        });
        store.close().unwrap();
        let left: Vec<String> = objects(&bucket)
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| k.contains("/sessions/s/"))
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", bucket.name);
        let (b, _) = new_host(&bucket, &tmp.path().join("b"), "b");
        assert!(b.list().unwrap().is_empty(), "{}", bucket.name);
        b.close().unwrap();
    }
}

/// An object store that fails, or hangs, on its first puts.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn ObjectStore>,
    /// Puts that fail at once, nothing written.
    fail: AtomicU32,
    /// Puts that hang (longer than the request timeout) before anything
    /// is written: the client gives up mid-upload.
    hang_before: AtomicU32,
    /// Puts that complete, then hang: the answer never comes.
    hang_after: AtomicU32,
    /// Deletes that wait (up to 10 s) for `release` before going on; each
    /// one sets `parked` first.
    park_deletes: AtomicU32,
    /// The same for puts of session files (not leases).
    park_session_puts: AtomicU32,
    parked: AtomicU32,
    release: AtomicU32,
}

impl Flaky {
    fn over(inner: Arc<dyn ObjectStore>) -> Flaky {
        Flaky {
            inner,
            fail: AtomicU32::new(0),
            hang_before: AtomicU32::new(0),
            hang_after: AtomicU32::new(0),
            park_deletes: AtomicU32::new(0),
            park_session_puts: AtomicU32::new(0),
            parked: AtomicU32::new(0),
            release: AtomicU32::new(0),
        }
    }
}

impl std::fmt::Display for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flaky({})", self.inner)
    }
}

impl Flaky {
    /// Sets `parked`, then waits (up to 10 s) for `release`.
    async fn park(&self) {
        self.parked.store(1, Ordering::SeqCst);
        for _ in 0..1000 {
            if self.release.load(Ordering::SeqCst) != 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn take(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

#[async_trait::async_trait]
impl ObjectStore for Flaky {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        let hang = Duration::from_secs(5);
        if take(&self.fail) {
            return Err(object_store::Error::Generic {
                store: "flaky",
                source: "injected failure".into(),
            });
        }
        if take(&self.hang_before) {
            tokio::time::sleep(hang).await;
        }
        if location.as_ref().contains("/sessions/") && take(&self.park_session_puts) {
            self.park().await;
        }
        let r = self.inner.put_opts(location, payload, opts).await?;
        if take(&self.hang_after) {
            tokio::time::sleep(hang).await;
        }
        Ok(r)
    }
    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn delete(&self, location: &ObjectPath) -> object_store::Result<()> {
        if take(&self.park_deletes) {
            self.park().await;
        }
        self.inner.delete(location).await
    }
    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &ObjectPath, to: &ObjectPath) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }
    async fn copy_if_not_exists(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
    ) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

#[test]
fn uploads_that_fail_or_hang_are_retried_and_never_leave_a_partial_object() {
    for bucket in buckets("flaky") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let flaky = Arc::new(Flaky::over(bucket.store.clone()));
        let mut opts = host_options(&bucket, "a", EvictionPolicy::immediately());
        let archive = opts.archive.as_mut().unwrap();
        archive.store = flaky.clone();
        archive.request_timeout = Duration::from_millis(300);
        archive.max_retries = 0;
        let store = Store::open(&dir, opts.clone()).unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        let log = turn_log(100, "flaky");
        append_turns(&store, "s", &log);
        let session_dir = dir.join("sessions").join("s");
        let local = segment_files(&session_dir);

        // No retries: a put that hangs fails the pass; nothing of the
        // session is in the bucket, and nothing is evicted.
        flaky.hang_before.store(1, Ordering::SeqCst);
        let err = store.archive_sync().unwrap_err();
        assert!(
            matches!(err, Error::Archive { .. }),
            "{}: {err}",
            bucket.name
        );
        let session_objects = || -> Vec<(String, u64)> {
            objects(&bucket)
                .into_iter()
                .filter(|(k, _)| k.contains("/sessions/"))
                .collect()
        };
        assert!(
            session_objects().is_empty(),
            "{}: {:?}",
            bucket.name,
            session_objects()
        );
        assert_eq!(segment_files(&session_dir), local, "{}", bucket.name);
        // The process dies (no close): the lease stays this host's.
        drop(store);

        // With retries: two failures, a put that hangs before writing and
        // one whose answer never comes; the pass succeeds, and every object
        // is the whole file.
        let saved: Vec<(String, Vec<u8>)> = local
            .iter()
            .map(|n| (n.clone(), std::fs::read(session_dir.join(n)).unwrap()))
            .collect();
        opts.archive.as_mut().unwrap().max_retries = 6;
        let store = Store::open(&dir, opts).unwrap();
        flaky.fail.store(2, Ordering::SeqCst);
        flaky.hang_before.store(1, Ordering::SeqCst);
        flaky.hang_after.store(1, Ordering::SeqCst);
        let report = store.archive_sync().unwrap();
        assert_eq!(
            report.evicted,
            local.len() as u64 - 1,
            "{}: {report:?}",
            bucket.name
        );
        let stats = store.archive_stats().unwrap();
        assert!(stats.retries >= 4, "{}: {stats:?}", bucket.name);
        for (name, bytes) in &saved {
            let key = format!("{}/sessions/s/{name}", bucket.prefix);
            assert!(
                object_bytes(&bucket.store, &key) == *bytes,
                "{}: {key} is not the whole file",
                bucket.name
            );
        }
        assert_eq!(read_all(&store, "s"), log, "{}", bucket.name);
        store.close().unwrap();
    }
}

/// The command line: `--archive URL` on two store directories (two hosts)
/// over one local-directory bucket: an import on one is listed, read,
/// taken over and synced on the other.
#[test]
fn the_cli_shares_a_store_between_two_directories_through_the_archive() {
    use std::process::Command;
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tmp.path().join("bucket").display());
    let log = turn_log(5, "cli");
    let mut jsonl = String::from(r#"{"type":"session","version":0,"id":"cli-run","createdAt":0}"#);
    jsonl.push('\n');
    for e in &log {
        jsonl.push_str(&e.to_json());
        jsonl.push('\n');
    }
    let file = tmp.path().join("run.jsonl");
    std::fs::write(&file, jsonl).unwrap();
    let run = |host: &str, args: &[&str]| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_sessionlog"))
            .arg("--store")
            .arg(tmp.path().join(host))
            .args(["--archive", &url])
            .args(args)
            .env_remove("SESSIONLOG_STORE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{host} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run("h1", &["import", file.to_str().unwrap()]);
    assert!(run("h2", &["ls"]).starts_with("cli-run\t"));
    assert_eq!(
        run("h2", &["cat", "cli-run"]).lines().count(),
        log.len() + 1
    );
    assert_eq!(run("h2", &["take-over", "cli-run"]), "took cli-run over\n");
    assert!(run("h2", &["archive-sync"]).starts_with("uploaded "));
}

/// A compressed image evicted after a reader listed the session's
/// directory is read from the bucket, as a raw file evicted so is (it used
/// to fail the read with "No such file or directory").
#[test]
fn an_image_evicted_after_the_listing_is_fetched_raw() {
    for bucket in buckets("evicted-image") {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a");
        let (log, cut, images) = compressed_without_archive(&dir, "evicted-image");
        let opts = || host_options(&bucket, "a", EvictionPolicy::default());
        let store = Store::open(&dir, opts()).unwrap();
        append_turns(&store, "s", &log[cut..]);
        store.archive_sync().unwrap(); // every segment in the bucket
        store.close().unwrap();
        let session_dir = dir.join("sessions").join("s");
        assert_eq!(files_ending(&session_dir, ".segz").len() as u64, images);
        // Each image removed just before it is mapped: an eviction (every
        // segment is in the bucket) after the loader listed the directory.
        let evicted = Arc::new(AtomicU32::new(0));
        let counted = evicted.clone();
        let vfs = Arc::new(hooked_fs::HookedFs {
            before_map: Some(Box::new(move |p| {
                if p.extension().is_some_and(|e| e == "segz") && std::fs::remove_file(p).is_ok() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            })),
            ..hooked_fs::HookedFs::default()
        });
        let store = Store::open_with_vfs(&dir, opts(), vfs).unwrap();
        assert_eq!(read_all(&store, "s"), log, "{}", bucket.name);
        assert!(
            evicted.load(Ordering::Relaxed) > 0,
            "{}: an image was evicted under the load",
            bucket.name
        );
        store.verify("s").unwrap();
        store.close().unwrap();
    }
}

/// Objects under a session's lease prefix that are not lease records (a
/// short name, a deeper path) are ignored, and a record at the last epoch
/// is refused with a typed error: opening, writing and taking over never
/// loop, recurse or overflow on what a bucket holds. (Before: the stray
/// names parsed as epoch 9, whose record was never there, and the lookup
/// recursed until the stack overflowed.)
#[test]
fn stray_and_exhausted_lease_objects_are_ignored_or_refused() {
    for bucket in buckets("hostile-lease") {
        let tmp = tempfile::tempdir().unwrap();
        let log = turn_log(2, "hostile-lease");
        let leases = format!("{}/leases/s", bucket.prefix);
        put_object(&bucket.store, &format!("{leases}/9"), b"{}");
        put_object(
            &bucket.store,
            &format!("{leases}/sub/00000000000000000009"),
            b"{}",
        );
        let a = Store::open(
            tmp.path().join("a"),
            host_options(&bucket, "a", EvictionPolicy::default()),
        )
        .unwrap();
        a.create(SessionHeader::new("s", 0)).unwrap();
        a.append("s", &log[..3]).unwrap();
        a.close().unwrap();
        // The newest record at the last epoch, released: the next take
        // cannot write the epoch after it.
        let last = format!(r#"{{"host":"z","epoch":{},"released":true}}"#, u64::MAX);
        put_object(
            &bucket.store,
            &format!("{leases}/{:020}", u64::MAX),
            last.as_bytes(),
        );
        let b = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        match b.append("s", &log[3..]) {
            Err(Error::Archive { reason, .. }) => {
                assert!(reason.contains("maximum"), "{}: {reason}", bucket.name)
            }
            other => panic!(
                "{}: expected the exhausted epoch refused: {other:?}",
                bucket.name
            ),
        }
    }
}

/// Two processes of one host on one store directory share the host's
/// lease: a second handle's close must not give up the lease of a session
/// the first one is still writing (before, it released every lease of the
/// host, and another host could then write the session without forcing).
#[test]
fn a_second_handle_of_a_host_leaves_the_first_ones_lease_alone() {
    for bucket in buckets("shared-host") {
        let tmp = tempfile::tempdir().unwrap();
        let log = turn_log(3, "shared-host");
        let dir = tmp.path().join("a");
        let first =
            Store::open(&dir, host_options(&bucket, "a", EvictionPolicy::default())).unwrap();
        first.create(SessionHeader::new("s", 0)).unwrap();
        first.append("s", &log[..3]).unwrap();
        first.archive_sync().unwrap();
        // A second handle (another process of the same host: a CLI run).
        let second =
            Store::open(&dir, host_options(&bucket, "a", EvictionPolicy::default())).unwrap();
        second.close().unwrap();
        let other = Store::open(
            tmp.path().join("b"),
            host_options(&bucket, "b", EvictionPolicy::default()),
        )
        .unwrap();
        match other.append("s", &log[3..6]) {
            Err(Error::NotOwner { owner, .. }) => assert_eq!(owner, "a", "{}", bucket.name),
            other => panic!(
                "{}: the first handle still writes s: {other:?}",
                bucket.name
            ),
        }
        first.append("s", &log[3..6]).unwrap();
    }
}
