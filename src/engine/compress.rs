//! Storing sealed segments compressed (`Options::compress_sealed`): the
//! image of a sealed segment (`format-spec.md` section 3.5) replaces the
//! raw file, off the acknowledgement path.
//!
//! One segment is compressed in two steps, so the slow one holds no lock:
//!
//! 1. [`prepare`], with no session lock: map the raw file, check it whole
//!    (a damaged segment is never compressed: it stays for `verify`),
//!    encode the image, write it under a temporary name of its own and
//!    `fsync` it.
//! 2. [`install`], under the session's mutex and only while this handle
//!    holds the session's writer lock (so no other process can replace or
//!    delete the session meanwhile): rename the image into place, `fsync`
//!    the directory (the image's name is durable before the raw file can
//!    go), then remove the raw file. If that removal is lost in a crash,
//!    both files exist and readers use the raw one; the next writer
//!    compresses again.
//!
//! Readers that mapped the raw file keep reading it (an unlinked file
//! lives while mapped); readers that find it gone read the image, which
//! decodes to the same bytes, so no offset anyone holds changes.

use super::error::{Result, io_at, segment_error};
use super::handle::{Sessions, Store};
use super::session::Session;
use crate::segment::{self, SegmentIdent};
use crate::vfs::Vfs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What compressing sealed segments did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compressed {
    /// Segments whose image replaced the raw file.
    pub segments: u64,
    /// Their raw size in bytes.
    pub raw_bytes: u64,
    /// Their images' size in bytes.
    pub image_bytes: u64,
    /// Sealed segments left raw because another session links the same
    /// file (a parent and its fork, `format-spec.md` section 7): an image
    /// would add its bytes to the raw file the other keeps. Compressed
    /// once one session alone links them.
    pub shared: u64,
}

impl Compressed {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Compressed) {
        self.segments += other.segments;
        self.raw_bytes += other.raw_bytes;
        self.image_bytes += other.image_bytes;
        self.shared += other.shared;
    }

    fn shared_one() -> Compressed {
        Compressed {
            shared: 1,
            ..Compressed::default()
        }
    }
}

/// The state of a handle's background compression.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompressionStatus {
    /// Segments queued or being compressed.
    pub pending: u64,
    /// What was compressed since the handle opened.
    pub done: Compressed,
    /// The last failure, if any: the segment stays raw (readable; nothing
    /// is lost), and its session's next writer tries again.
    pub last_error: Option<String>,
}

/// One sealed segment to compress.
pub(super) struct Job {
    pub(super) id: String,
    pub(super) dir: PathBuf,
    pub(super) ident: SegmentIdent,
}

/// An image written and synced under its temporary name (step 1).
pub(super) struct Prepared {
    tmp: PathBuf,
    raw: PathBuf,
    image: PathBuf,
    raw_len: u64,
    image_len: u64,
}

/// The background thread of a handle with `compress_sealed`, and its
/// counters.
pub(super) struct Compressor {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    pending: AtomicU64,
    /// Set by `stop`: queued jobs are dropped, not run.
    stopping: AtomicBool,
    status: Mutex<CompressionStatus>,
}

impl State {
    fn record(&self, outcome: &Result<Option<Compressed>>) {
        let mut st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(Some(c)) => st.done.add(c),
            Ok(None) => {}
            Err(e) => st.last_error = Some(e.to_string()),
        }
    }
}

impl Compressor {
    /// Starts the thread. It holds the sessions and the file system, never
    /// the store, so dropping the last handle stops it.
    pub(super) fn spawn(vfs: Arc<dyn Vfs>, sessions: Arc<Sessions>) -> Compressor {
        let (tx, rx) = mpsc::channel::<Job>();
        let state = Arc::new(State::default());
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("sessionlog-compress".into())
            .spawn(move || {
                for job in rx {
                    if !st.stopping.load(Ordering::Acquire) {
                        let outcome = run_job(&*vfs, &sessions, &job);
                        st.record(&outcome);
                    }
                    st.pending.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .unwrap_or_else(|e| panic!("spawn the compression thread: {e}"));
        Compressor {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            state,
        }
    }

    /// Queues a segment (dropped once the thread is stopped: the next
    /// writer of its session queues it again).
    pub(super) fn submit(&self, job: Job) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = tx.as_ref() {
            self.state.pending.fetch_add(1, Ordering::AcqRel);
            if tx.send(job).is_err() {
                self.state.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Stops taking jobs, drops the queued ones and waits for the one in
    /// progress (if any) to finish.
    pub(super) fn stop(&self) {
        self.state.stopping.store(true, Ordering::Release);
        drop(self.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    pub(super) fn status(&self) -> CompressionStatus {
        let mut st = self
            .state
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        st.pending = self.state.pending.load(Ordering::Acquire);
        st
    }
}

/// Compresses one queued segment: step 1 here, step 2 if the session is
/// still loaded, written by this handle and the same incarnation.
fn run_job(vfs: &dyn Vfs, sessions: &Sessions, job: &Job) -> Result<Option<Compressed>> {
    let prepared = match prepare(vfs, &job.id, &job.dir, &job.ident)? {
        Prep::Ready(p) => p,
        Prep::Gone => return Ok(None),
        Prep::Shared => return Ok(Some(Compressed::shared_one())),
    };
    let slot = sessions
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .get(&job.id)
        .cloned();
    let Some(slot) = slot else {
        abandon(vfs, &prepared);
        return Ok(None);
    };
    let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
    // The same incarnation: its directory, and the segment's owner as its
    // lineage names it (itself, or the parent a fork inherited it from).
    let ours = s.dir == job.dir && s.ident(job.ident.store_id, job.ident.first_seq) == job.ident;
    install(vfs, &mut s, prepared, ours)
}

/// What step 1 found.
pub(super) enum Prep {
    /// The image, written and synced under its temporary name.
    Ready(Prepared),
    /// The raw file is gone (compressed already, or the session removed)
    /// or is another incarnation's (the session replaced since the job was
    /// queued): nothing to do.
    Gone,
    /// Another session links the raw file: left raw (see
    /// [`Compressed::shared`]).
    Shared,
}

/// Whether another session (a parent or a fork) links the raw file at
/// `raw` too (`NotFound` passes through).
fn linked_elsewhere(vfs: &dyn Vfs, raw: &Path) -> std::io::Result<bool> {
    vfs.metadata(raw).map(|m| m.links > 1)
}

/// Step 1: the image of sealed segment `ident` of session `id` (in `dir`)
/// written and synced under a temporary name.
pub(super) fn prepare(vfs: &dyn Vfs, id: &str, dir: &Path, ident: &SegmentIdent) -> Result<Prep> {
    let raw = dir.join(segment::segment_file_name(ident.first_seq));
    let found = linked_elsewhere(vfs, &raw).and_then(|shared| Ok((shared, vfs.map(&raw)?)));
    let map = match found {
        Ok((true, _)) => return Ok(Prep::Shared),
        Ok((false, m)) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Prep::Gone),
        Err(e) => return Err(io_at(&raw)(e)),
    };
    if segment::read_header(&map).is_ok_and(|h| h.session_uid != ident.session_uid) {
        return Ok(Prep::Gone);
    }
    segment::check_sealed(&map, ident).map_err(|e| segment_error(id, &raw, e))?;
    let image = segment::encode_image(&map).map_err(|e| segment_error(id, &raw, e))?;
    let name = segment::image_file_name(ident.first_seq);
    let (tmp, file) =
        super::tmpfile::create(vfs, dir, &name, super::tmpfile::COMPRESS).map_err(io_at(dir))?;
    let written = file.write_all_at(&image, 0).and_then(|()| file.sync_all());
    if let Err(e) = written {
        let _ = vfs.remove_file(&tmp);
        return Err(io_at(&tmp)(e));
    }
    Ok(Prep::Ready(Prepared {
        tmp,
        raw,
        image: dir.join(name),
        raw_len: map.len() as u64,
        image_len: image.len() as u64,
    }))
}

/// Step 2 (see the module): puts the image in place of the raw file when
/// `ours` (the session is the incarnation the image was made for), this
/// handle holds the session's writer lock and no fork has linked the raw
/// file since step 1; otherwise removes the temporary file.
pub(super) fn install(
    vfs: &dyn Vfs,
    s: &mut Session,
    p: Prepared,
    ours: bool,
) -> Result<Option<Compressed>> {
    if !ours || s.lock.is_none() || s.poisoned {
        abandon(vfs, &p);
        return Ok(None);
    }
    // A fork links its parent's sealed files without the parent's mutex,
    // so one may still link this file between this check and the removal
    // below; it then keeps the raw file and this session the image. Both
    // read the same bytes: that race costs space, never data.
    match linked_elsewhere(vfs, &p.raw) {
        Ok(false) => {}
        Ok(true) => {
            abandon(vfs, &p);
            return Ok(Some(Compressed::shared_one()));
        }
        Err(e) => {
            abandon(vfs, &p);
            return match e.kind() {
                std::io::ErrorKind::NotFound => Ok(None),
                _ => Err(io_at(&p.raw)(e)),
            };
        }
    }
    let dir = s.dir.clone();
    let done = (|| {
        vfs.rename(&p.tmp, &p.image).map_err(io_at(&p.image))?;
        // The image's name must be durable before the raw file's removal
        // can be: otherwise a crash could leave neither.
        vfs.sync_dir(&dir).map_err(io_at(&dir))?;
        match vfs.remove_file(&p.raw) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_at(&p.raw)(e)),
        }
    })();
    if let Err(e) = done {
        let _ = vfs.remove_file(&p.tmp);
        return Err(e);
    }
    // The mapped raw bytes stay this session's view of the segment (they
    // equal the image's); its name is the image's now.
    if let Some(seg) = s.segs.iter_mut().find(|g| g.path == p.raw) {
        seg.path = p.image.clone();
    }
    Ok(Some(Compressed {
        segments: 1,
        raw_bytes: p.raw_len,
        image_bytes: p.image_len,
        shared: 0,
    }))
}

fn abandon(vfs: &dyn Vfs, p: &Prepared) {
    let _ = vfs.remove_file(&p.tmp);
}

impl Session {
    /// The sealed segments of this session still stored raw, its own and
    /// those a fork inherited (named by their owner's uid): what
    /// compression would do. [`prepare`] leaves any still shared raw.
    pub(super) fn raw_sealed(&self, store_id: [u8; 16]) -> Vec<SegmentIdent> {
        let sealed = if self.last_is_active() {
            self.segs.len().saturating_sub(1)
        } else {
            self.segs.len()
        };
        self.segs[..sealed]
            .iter()
            .filter(|g| g.remote.is_none())
            .filter(|g| g.path.extension().is_some_and(|e| e == "seg"))
            .map(|g| self.ident(store_id, g.first_seq))
            .collect()
    }
}

impl Store {
    /// Compresses the sealed segments of session `id` that are still raw,
    /// now, in this thread, and returns what it did (with
    /// [`Options::compress_sealed`](super::Options) a background thread
    /// does this as segments are sealed; this is for stores written
    /// without it, and for tests). Takes the session's writer lock: an
    /// error if another handle writes it. The first compression in a store
    /// raises it to format version 4 (see the option).
    pub fn compress_sealed(&self, id: &str) -> Result<Compressed> {
        self.writable()?;
        self.raise_store_version()?;
        let vfs = &*self.inner.vfs;
        self.with_session(id, |s| {
            self.ensure_writer(s)?;
            let mut total = Compressed::default();
            for ident in s.raw_sealed(self.inner.store_id) {
                let done = match prepare(vfs, id, &s.dir, &ident)? {
                    Prep::Ready(p) => install(vfs, s, p, true)?,
                    Prep::Gone => None,
                    Prep::Shared => Some(Compressed::shared_one()),
                };
                if let Some(c) = done {
                    total.add(&c);
                }
            }
            Ok(total)
        })
    }

    /// Seals session `id`'s active segment now, if it holds records, and
    /// returns whether it did: its whole log is then in sealed segments,
    /// which [`Store::compress_sealed`] (or, with
    /// [`Options::compress_sealed`](super::Options), this handle's
    /// background thread) can compress. For a session that is finished or
    /// idle: its next append starts a new segment. Takes the session's
    /// writer lock (an error if another handle writes it).
    pub fn seal(&self, id: &str) -> Result<bool> {
        self.writable()?;
        self.with_session(id, |s| {
            self.ensure_writer(s)?;
            match &s.writer {
                Some(w) if !w.is_empty() => self.roll_over(s).map(|()| true),
                _ => Ok(false),
            }
        })
    }

    /// What this handle's background compression has done and has queued
    /// (all zero without [`Options::compress_sealed`](super::Options)).
    pub fn compression_status(&self) -> CompressionStatus {
        self.inner
            .compressor
            .as_ref()
            .map(Compressor::status)
            .unwrap_or_default()
    }

    /// Queues the raw sealed segments of `s` (which this handle writes) for
    /// the background thread, if there is one: all of them (`None`, when
    /// this handle starts writing the session), or the one starting at
    /// `first_seq` (just sealed).
    pub(super) fn queue_compression(&self, s: &Session, first_seq: Option<u64>) {
        let Some(c) = &self.inner.compressor else {
            return;
        };
        // A session being built in staging (an import, a fork) is queued
        // once it is published: its directory is about to move.
        let live = self.session_dir(&s.header.id).is_ok_and(|d| d == s.dir);
        if s.unpublished || s.staged || !live {
            return;
        }
        for ident in s.raw_sealed(self.inner.store_id) {
            if first_seq.is_none_or(|f| f == ident.first_seq) {
                c.submit(Job {
                    id: s.header.id.clone(),
                    dir: s.dir.clone(),
                    ident,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::SegmentWriter;
    use crate::vfs::RealFs;

    fn sealed_segment(dir: &Path, ident: &SegmentIdent) {
        let path = dir.join(segment::segment_file_name(ident.first_seq));
        let mut w = SegmentWriter::create(&path, ident, 0).unwrap();
        w.append(ident.first_seq, 1, b"some codec bytes").unwrap();
        w.seal_auto().unwrap();
    }

    #[test]
    fn prepare_skips_a_gone_replaced_or_shared_segment_and_images_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let ident = SegmentIdent {
            store_id: [1; 16],
            session_uid: [2; 16],
            first_seq: 0,
        };
        let gone = |p: Prep| matches!(p, Prep::Gone);
        assert!(gone(prepare(&RealFs, "s", dir.path(), &ident).unwrap()));
        sealed_segment(dir.path(), &ident);
        // Queued for another incarnation of the id: not this file's.
        let older = SegmentIdent {
            session_uid: [3; 16],
            ..ident
        };
        assert!(gone(prepare(&RealFs, "s", dir.path(), &older).unwrap()));
        // Linked into a fork: an image would only add bytes.
        let raw = dir.path().join(segment::segment_file_name(0));
        let link = dir.path().join("fork-link");
        std::fs::hard_link(&raw, &link).unwrap();
        let p = prepare(&RealFs, "s", dir.path(), &ident).unwrap();
        assert!(matches!(p, Prep::Shared));
        std::fs::remove_file(&link).unwrap();
        let Prep::Ready(p) = prepare(&RealFs, "s", dir.path(), &ident).unwrap() else {
            panic!("a raw sealed segment of its own is imaged");
        };
        let image = std::fs::read(&p.tmp).unwrap();
        let raw = std::fs::read(&p.raw).unwrap();
        assert_eq!(segment::decode_image(&image, &ident).unwrap(), raw);
        abandon(&RealFs, &p);
        assert!(!p.tmp.exists());
    }
}
