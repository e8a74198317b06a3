//! Uploads fenced by the lease (format-spec section 10.5): a host that
//! lost a session's lease never replaces what the new holder wrote, and a
//! local segment that diverged from the bucket's is neither uploaded nor
//! thrown away.

use super::*;
use std::sync::Mutex;

type Then = Box<dyn FnOnce() + Send>;

/// Objects with their bytes.
type Objects = Vec<(String, Vec<u8>)>;

/// An object store that, once armed, runs an action right before the first
/// request (a put, or the `HEAD` of the local backend's emulated `If-Match`)
/// on a key ending with a given suffix: another host's whole take-over
/// happens between a pass's lease check and its write.
#[derive(Default)]
struct BeforePut {
    inner: Option<Arc<dyn ObjectStore>>,
    armed: Mutex<Option<(String, Then)>>,
    fired: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for BeforePut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforePut")
    }
}

impl std::fmt::Display for BeforePut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforePut")
    }
}

impl BeforePut {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        self.inner.as_ref().unwrap()
    }

    /// Runs the armed action if `location` is the key it waits for.
    fn fire(&self, location: &ObjectPath) {
        let action = {
            let mut armed = self.armed.lock().unwrap();
            match armed.as_ref() {
                Some((suffix, _)) if location.as_ref().ends_with(suffix.as_str()) => {
                    armed.take().map(|(_, then)| then)
                }
                _ => None,
            }
        };
        if let Some(then) = action {
            // On a thread of its own: the other host's store blocks on its
            // own runtime, which it cannot do inside this one's.
            std::thread::spawn(then).join().unwrap();
            self.fired.store(true, Ordering::SeqCst);
        }
    }
}

#[async_trait::async_trait]
impl ObjectStore for BeforePut {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.fire(location);
        self.inner().put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner().put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.fire(location);
        self.inner().get_opts(location, options).await
    }
    async fn delete(&self, location: &ObjectPath) -> object_store::Result<()> {
        self.inner().delete(location).await
    }
    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner().list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner().list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &ObjectPath, to: &ObjectPath) -> object_store::Result<()> {
        self.inner().copy(from, to).await
    }
    async fn copy_if_not_exists(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
    ) -> object_store::Result<()> {
        self.inner().copy_if_not_exists(from, to).await
    }
}

/// Every object of session `s` under `prefix`, with its bytes.
fn session_objects(store: &Arc<dyn ObjectStore>, prefix: &str) -> Objects {
    use futures::TryStreamExt;
    let dir = ObjectPath::from(format!("{prefix}/sessions/s"));
    let mut keys: Vec<String> = on_bucket(store.list(Some(&dir)).try_collect::<Vec<_>>())
        .unwrap()
        .into_iter()
        .map(|m| m.location.to_string())
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let b = object_bytes(store, &k);
            (k, b)
        })
        .collect()
}

/// Appends the events of `log` from the session's next seq to `upto` (an
/// event count), a turn at a time: `log` continues whatever this host's
/// copy of the session holds (the logs of two tags have the same shape).
fn continue_with(store: &Store, log: &[OwnedEvent], upto: usize) {
    let from = store.next_seq("s").unwrap() as usize;
    append_turns(store, "s", &log[from..upto]);
}

/// Host a checks its lease, then host b takes the session over, writes and
/// closes, and only then does a's write land: before 2026-12-07 a's plain
/// `PUT` replaced b's segment (or checkpoint). Now it is a conditional
/// write on the version a last saw, refused; a re-checks its lease, finds
/// it lost and stops: every object b wrote is as b wrote it.
#[test]
fn a_late_upload_of_a_fenced_host_never_replaces_the_new_holders_objects() {
    for suffix in [".seg", "/CHECKPOINT"] {
        for bucket in buckets("late-put") {
            let tmp = tempfile::tempdir().unwrap();
            let (ours, theirs) = (turn_log(60, "aaa"), turn_log(60, "bbb"));
            let hooked = Arc::new(BeforePut {
                inner: Some(bucket.store.clone()),
                ..BeforePut::default()
            });
            let mut opts = host_options(&bucket, "a", EvictionPolicy::default());
            opts.archive.as_mut().unwrap().store = hooked.clone();
            let a = Store::open(tmp.path().join("a"), opts).unwrap();
            a.create(SessionHeader::new("s", 0)).unwrap();
            append_turns(&a, "s", &ours[..turns_len(&ours, 20)]);
            a.flush().unwrap();
            a.archive_sync().unwrap();
            // More on a, not uploaded yet, with a new checkpoint.
            continue_with(&a, &ours, turns_len(&ours, 30));
            a.flush().unwrap();

            let written: Arc<Mutex<Objects>> = Arc::default();
            let (b_opts, b_dir) = (
                host_options(&bucket, "b", EvictionPolicy::default()),
                tmp.path().join("b"),
            );
            let (store, prefix, seen) =
                (bucket.store.clone(), bucket.prefix.clone(), written.clone());
            let upto = turns_len(&theirs, 45);
            let resumed = Arc::new(AtomicU32::new(0));
            let (resumed_at, b_log) = (resumed.clone(), theirs.clone());
            let then: Then = Box::new(move || {
                let b = Store::open(&b_dir, b_opts).unwrap();
                b.take_over("s").unwrap();
                resumed_at.store(b.next_seq("s").unwrap() as u32, Ordering::SeqCst);
                continue_with(&b, &b_log, upto);
                b.close().unwrap();
                *seen.lock().unwrap() = session_objects(&store, &prefix);
            });
            *hooked.armed.lock().unwrap() = Some((suffix.to_owned(), then));

            let report = a.archive_sync().unwrap();
            let what = format!("{} ({suffix})", bucket.name);
            assert!(hooked.fired.load(Ordering::SeqCst), "{what}: no put of it");
            let written = written.lock().unwrap().clone();
            let now = session_objects(&bucket.store, &bucket.prefix);
            assert_eq!(
                now.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                written.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                "{what}"
            );
            for ((key, bytes), (_, was)) in now.iter().zip(&written) {
                assert!(bytes == was, "{what}: {key} is not the new holder's");
            }
            assert_eq!(report.fenced, vec!["s".to_owned()], "{what}");
            let stats = a.archive_stats().unwrap();
            assert!(stats.conflicts >= 1, "{what}: {stats:?}");
            match a.append("s", &ours[..1]) {
                Err(Error::NotOwner { owner, .. }) => assert_eq!(owner, "b", "{what}"),
                other => panic!("{what}: {other:?}"),
            }
            drop(a);

            // A third host resumes b's log from the bucket.
            let (c, _) = new_host(&bucket, &tmp.path().join("c"), "c");
            let mut expected = ours[..resumed.load(Ordering::SeqCst) as usize].to_vec();
            expected.extend_from_slice(&theirs[expected.len()..upto]);
            assert_eq!(read_all(&c, "s"), expected, "{what}");
            c.close().unwrap();
        }
    }
}

/// The local segment files of `dir` (raw and images) with their bytes.
fn local_segments(dir: &Path) -> Objects {
    let mut names = files_ending(dir, ".seg");
    names.extend(files_ending(dir, ".segz"));
    names
        .into_iter()
        .map(|n| {
            let b = std::fs::read(dir.join(&n)).unwrap();
            (n, b)
        })
        .collect()
}

/// Host a keeps appending after b took the session over (a has not
/// noticed yet), so a seals segments b also sealed, with other records at
/// the same length. When a takes the session back, those copies are not
/// the bucket's: before 2026-12-07 a kept them (sealed segments were
/// assumed the same everywhere), read its own history and uploaded them
/// over b's. Now they are moved aside (never deleted), the bucket's are
/// used, and b's objects stay as b wrote them. Both when a's first call
/// loads the session (an append: the lease is taken after the load) and
/// when a takes it with `take_over`.
#[test]
fn a_host_taking_a_session_back_moves_its_diverged_segments_aside() {
    for (forced, bucket) in [false, true]
        .into_iter()
        .flat_map(|f| buckets("take-back").into_iter().map(move |b| (f, b)))
    {
        let tmp = tempfile::tempdir().unwrap();
        let (ours, theirs) = (turn_log(60, "aaa"), turn_log(60, "bbb"));
        let a_dir = tmp.path().join("a");
        let opts = |h: &str| host_options(&bucket, h, EvictionPolicy::default());
        let a = Store::open(&a_dir, opts("a")).unwrap();
        a.create(SessionHeader::new("s", 0)).unwrap();
        append_turns(&a, "s", &ours[..turns_len(&ours, 20)]);
        a.archive_sync().unwrap();

        let b = Store::open(tmp.path().join("b"), opts("b")).unwrap();
        b.take_over("s").unwrap();
        continue_with(&b, &theirs, turns_len(&theirs, 35));
        b.close().unwrap();
        let written = session_objects(&bucket.store, &bucket.prefix);

        // a writes on, locally only, then stops (no pass ran meanwhile).
        continue_with(&a, &ours, turns_len(&ours, 35));
        drop(a);
        let session = a_dir.join("sessions").join("s");
        let before = local_segments(&session);
        let object = |name: &str| {
            let key = format!("{}/sessions/s/{name}", bucket.prefix);
            written
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, b)| b.clone())
        };
        let diverged: Vec<&(String, Vec<u8>)> = before
            .iter()
            .filter(|(n, b)| object(n).as_ref() != Some(b))
            .collect();
        // Some sealed segment of a has the length of b's but other bytes.
        assert!(
            diverged
                .iter()
                .any(|(n, b)| object(n).is_some_and(|o| o.len() == b.len())),
            "{}: {:?}",
            bucket.name,
            before.iter().map(|(n, b)| (n, b.len())).collect::<Vec<_>>()
        );

        // a takes the session back (b released it) and writes on b's log.
        let a = Store::open(&a_dir, opts("a")).unwrap();
        if forced {
            a.take_over("s").unwrap();
        }
        continue_with(&a, &theirs, turns_len(&theirs, 40));
        let mut expected = ours[..turns_len(&ours, 20)].to_vec();
        expected.extend_from_slice(&theirs[expected.len()..turns_len(&theirs, 40)]);
        let what = format!("{} (take_over: {forced})", bucket.name);
        let read = read_all(&a, "s");
        let first_wrong = read.iter().zip(&expected).position(|(r, e)| r != e);
        assert!(
            read.len() == expected.len() && first_wrong.is_none(),
            "{what}: the log read differs from the bucket's from seq {first_wrong:?} ({} events, {} expected)",
            read.len(),
            expected.len()
        );
        a.archive_sync().unwrap();

        // Every diverged local file is kept aside, byte for byte.
        let aside = files_ending(&session, ".diverged-0");
        for (name, bytes) in &diverged {
            let kept = format!("{name}.diverged-0");
            assert!(
                aside.contains(&kept),
                "{}: {kept} in {aside:?}",
                bucket.name
            );
            assert!(
                std::fs::read(session.join(&kept)).unwrap() == *bytes,
                "{}: {kept} is not a's copy",
                bucket.name
            );
        }
        let stats = a.archive_stats().unwrap();
        assert_eq!(stats.quarantined, diverged.len() as u64, "{stats:?}");
        // b's sealed segments are still b's (the last one, b's active
        // segment at its close, a has written on since).
        let now = session_objects(&bucket.store, &bucket.prefix);
        let sealed: Vec<&(String, Vec<u8>)> = written
            .iter()
            .filter(|(k, _)| k.ends_with(".seg"))
            .collect();
        for (key, was) in &sealed[..sealed.len() - 1] {
            let is = now.iter().find(|(k, _)| k == key).map(|(_, b)| b);
            assert!(is == Some(was), "{}: {key} is not b's", bucket.name);
        }
        a.verify("s").unwrap();
        a.close().unwrap();
    }
}

/// An object store whose write to a key ending with the armed suffix lands
/// but whose answer is lost, and which then answers nothing (every request
/// fails) until the outage is over: a pass's write is in the bucket while
/// the pass failed.
#[derive(Default)]
struct LostAnswer {
    inner: Option<Arc<dyn ObjectStore>>,
    armed: Mutex<Option<String>>,
    down: std::sync::atomic::AtomicBool,
    landed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for LostAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LostAnswer")
    }
}

impl std::fmt::Display for LostAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LostAnswer")
    }
}

impl LostAnswer {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        self.inner.as_ref().unwrap()
    }

    fn outage(&self) -> object_store::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "LostAnswer",
                source: "connection reset".into(),
            });
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ObjectStore for LostAnswer {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.outage()?;
        let hit = {
            let mut armed = self.armed.lock().unwrap();
            let hit = armed
                .as_ref()
                .is_some_and(|s| location.as_ref().ends_with(s.as_str()));
            if hit {
                armed.take();
            }
            hit
        };
        let put = self.inner().put_opts(location, payload, opts).await;
        if hit && put.is_ok() {
            self.landed.store(true, Ordering::SeqCst);
            self.down.store(true, Ordering::SeqCst);
            return self.outage().map(|_| unreachable!());
        }
        put
    }
    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.outage()?;
        self.inner().put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.outage()?;
        self.inner().get_opts(location, options).await
    }
    async fn delete(&self, location: &ObjectPath) -> object_store::Result<()> {
        self.outage()?;
        self.inner().delete(location).await
    }
    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        if self.down.load(Ordering::SeqCst) {
            return Box::pin(futures::stream::once(async {
                Err(object_store::Error::Generic {
                    store: "LostAnswer",
                    source: "connection reset".into(),
                })
            }));
        }
        self.inner().list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<object_store::ListResult> {
        self.outage()?;
        self.inner().list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &ObjectPath, to: &ObjectPath) -> object_store::Result<()> {
        self.outage()?;
        self.inner().copy(from, to).await
    }
    async fn copy_if_not_exists(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
    ) -> object_store::Result<()> {
        self.outage()?;
        self.inner().copy_if_not_exists(from, to).await
    }
}

/// The holder's write lands but its answer is lost and the pass fails (the
/// network went down meanwhile); by the next pass the local file has moved
/// on (a new checkpoint; the active segment grew). The object is this
/// host's own earlier write, so the next pass replaces it. Before, that
/// pass found an object "changed since this host last saw it" holding
/// other bytes and stopped with `ArchiveDiverged`, at every pass for the
/// rest of the lease: the session was never uploaded again (F61).
#[test]
fn a_write_whose_answer_was_lost_in_a_failed_pass_is_replaced_by_the_next() {
    let mut failed = Vec::new();
    for (first_synced, suffix) in [
        (false, "/CHECKPOINT"),
        (true, "/CHECKPOINT"),
        (true, "active"),
    ] {
        for bucket in buckets("lost-answer") {
            let what = format!("{} ({suffix}, synced before: {first_synced})", bucket.name);
            let tmp = tempfile::tempdir().unwrap();
            let log = turn_log(60, "aaa");
            let hooked = Arc::new(LostAnswer {
                inner: Some(bucket.store.clone()),
                ..LostAnswer::default()
            });
            let mut opts = host_options(&bucket, "a", EvictionPolicy::default());
            let archive = opts.archive.as_mut().unwrap();
            archive.store = hooked.clone();
            archive.max_retries = 2;
            let a = Store::open(tmp.path().join("a"), opts).unwrap();
            a.create(SessionHeader::new("s", 0)).unwrap();
            append_turns(&a, "s", &log[..turns_len(&log, 10)]);
            a.flush().unwrap();
            if first_synced {
                a.archive_sync().unwrap();
                continue_with(&a, &log, turns_len(&log, 15));
                a.flush().unwrap();
            }
            let session = tmp.path().join("a").join("sessions").join("s");
            let armed = if suffix == "active" {
                format!("/{}", segment_files(&session).last().unwrap())
            } else {
                suffix.to_owned()
            };
            *hooked.armed.lock().unwrap() = Some(armed.clone());
            assert!(a.archive_sync().is_err(), "{what}: the pass fails");
            assert!(
                hooked.landed.load(Ordering::SeqCst),
                "{what}: {armed} landed"
            );
            hooked.down.store(false, Ordering::SeqCst);

            continue_with(&a, &log, turns_len(&log, 20));
            a.flush().unwrap();
            if let Err(e) = a.archive_sync() {
                failed.push(format!("{what}: {e}"));
                continue;
            }
            a.close().unwrap();
            let (c, _) = new_host(&bucket, &tmp.path().join("c"), "c");
            assert_eq!(read_all(&c, "s"), log[..turns_len(&log, 20)], "{what}");
            c.close().unwrap();
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
