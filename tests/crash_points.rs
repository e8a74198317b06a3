//! Crash-point enumeration over a page-cache model.
//!
//! [`CrashFs`] runs the engine on the real file system and records, beside
//! it, what a power loss would keep: per file, the contents as of its last
//! `fsync`/`fdatasync` plus the writes since (volatile); per directory, the
//! entries as of its last directory `fsync` plus the changes since
//! (volatile: create, rename, unlink, link). At a crash point (operation
//! index k, before operation k runs) it materialises disk images, one per
//! crash model:
//!
//! * file data: unsynced writes dropped, kept, torn (all but the last
//!   unsynced write, then the first half of the last), or torn as zeros (the
//!   last unsynced write's range reads as zeros);
//! * directories: unsynced entry changes vanish, or are kept.
//!
//! After the crash every operation fails (the process is gone). Each image
//! is "rebooted": opened with the real file system and checked against the
//! model of `tests/common` (every acknowledged batch present, the one
//! in-flight batch whole or absent, nothing partial, repair closers exactly
//! once), plus: `verify` passes, surface and derive equal a from-scratch
//! fold of the recovered events (a fresh store fed the same events), and a
//! second crash at each operation of the reopen is recovered too.

use sessionlog::header::SessionHeader;
use sessionlog::store::Store;
use sessionlog::vfs::{self, Metadata, SegmentBytes, Vfs, VfsFile};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

// ---------------------------------------------------------------------------
// The page-cache model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    /// Contents as of the last sync.
    durable: Vec<u8>,
    /// Changes since, in order.
    pending: Vec<Pending>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File(u64),
    /// A directory, by its id in `Model::dirs` (its identity follows it
    /// through renames, like an inode).
    Dir(u64),
}

#[derive(Debug, Clone, Default)]
struct Dir {
    current: BTreeMap<OsString, Node>,
    durable: BTreeMap<OsString, Node>,
}

#[derive(Debug, Default)]
struct Model {
    inodes: HashMap<u64, Inode>,
    /// Directories by id.
    dirs: HashMap<u64, Dir>,
    /// Live path of every directory, to find its id.
    dir_paths: HashMap<PathBuf, u64>,
    /// Live path of every file, to find its inode.
    paths: HashMap<PathBuf, u64>,
    next_ino: u64,
    next_dir: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DataModel {
    Drop,
    Keep,
    TornPrefix,
    TornZeros,
}

const DATA_MODELS: [DataModel; 4] = [
    DataModel::Drop,
    DataModel::Keep,
    DataModel::TornPrefix,
    DataModel::TornZeros,
];

fn apply(bytes: &mut Vec<u8>, op: &Pending) {
    match op {
        Pending::Write(off, data) => {
            let end = *off as usize + data.len();
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[*off as usize..end].copy_from_slice(data);
        }
        Pending::SetLen(len) => bytes.resize(*len as usize, 0),
    }
}

impl Inode {
    fn image(&self, data: DataModel) -> Vec<u8> {
        let mut b = self.durable.clone();
        let n = self.pending.len();
        match data {
            DataModel::Drop => {}
            DataModel::Keep => self.pending.iter().for_each(|p| apply(&mut b, p)),
            DataModel::TornPrefix | DataModel::TornZeros => {
                if n == 0 {
                    return b;
                }
                self.pending[..n - 1].iter().for_each(|p| apply(&mut b, p));
                match &self.pending[n - 1] {
                    Pending::Write(off, bytes) if data == DataModel::TornPrefix => apply(
                        &mut b,
                        &Pending::Write(*off, bytes[..bytes.len() / 2].to_vec()),
                    ),
                    Pending::Write(off, bytes) => {
                        apply(&mut b, &Pending::Write(*off, vec![0; bytes.len()]))
                    }
                    last => apply(&mut b, last),
                }
            }
        }
        b
    }
}

impl Model {
    fn new(root: &Path) -> Model {
        let mut m = Model::default();
        m.new_dir(root);
        m
    }

    /// A new, empty directory whose live path is `path` (its entry in the
    /// parent is the caller's to add).
    fn new_dir(&mut self, path: &Path) -> u64 {
        let id = self.next_dir;
        self.next_dir += 1;
        self.dirs.insert(id, Dir::default());
        self.dir_paths.insert(path.to_owned(), id);
        id
    }

    /// Moves every live path under `from` (itself included) to `to`.
    fn rekey(&mut self, from: &Path, to: &Path) {
        fn moved<T: Copy>(map: &mut HashMap<PathBuf, T>, from: &Path, to: &Path) {
            let keys: Vec<PathBuf> = map
                .keys()
                .filter(|k| k.starts_with(from))
                .cloned()
                .collect();
            let taken: Vec<(PathBuf, T)> = keys
                .into_iter()
                .map(|k| {
                    let v = map.remove(&k).unwrap();
                    (to.join(k.strip_prefix(from).unwrap()), v)
                })
                .collect();
            map.extend(taken);
        }
        moved(&mut self.paths, from, to);
        moved(&mut self.dir_paths, from, to);
    }

    /// Removes every live path under `path` (itself included).
    fn forget(&mut self, path: &Path) {
        self.paths.retain(|k, _| !k.starts_with(path));
        self.dir_paths.retain(|k, _| !k.starts_with(path));
    }

    fn split(path: &Path) -> (PathBuf, OsString) {
        (
            path.parent().unwrap().to_owned(),
            path.file_name().unwrap().to_owned(),
        )
    }

    fn add_entry(&mut self, path: &Path, node: Node) {
        let (parent, name) = Self::split(path);
        if let Some(d) = self
            .dir_paths
            .get(&parent)
            .and_then(|id| self.dirs.get_mut(id))
        {
            d.current.insert(name, node);
        }
    }

    fn remove_entry(&mut self, path: &Path) -> Option<Node> {
        let (parent, name) = Self::split(path);
        let id = self.dir_paths.get(&parent)?;
        self.dirs.get_mut(id)?.current.remove(&name)
    }

    /// A rename of `from` (file or directory) to `to`, replacing what `to`
    /// named.
    fn renamed(&mut self, from: &Path, to: &Path) {
        if let Some(node) = self.remove_entry(from) {
            self.remove_entry(to);
            self.forget(to);
            self.add_entry(to, node);
        }
        self.rekey(from, to);
    }

    /// Writes the image of the model under `out` (which maps `root`).
    fn materialise(&self, root: u64, out: &Path, data: DataModel, keep_dirs: bool) {
        let dir = &self.dirs[&root];
        let entries = if keep_dirs {
            &dir.current
        } else {
            &dir.durable
        };
        for (name, node) in entries {
            let dst = out.join(name);
            match node {
                Node::Dir(id) => {
                    std::fs::create_dir(&dst).unwrap();
                    self.materialise(*id, &dst, data, keep_dirs);
                }
                Node::File(ino) => {
                    std::fs::write(&dst, self.inodes[ino].image(data)).unwrap();
                }
            }
        }
    }
}

/// The recording backend. Clones share the model and the counter.
#[derive(Debug, Clone)]
struct CrashFs {
    real: Arc<dyn Vfs>,
    root: PathBuf,
    model: Arc<Mutex<Model>>,
    ops: Arc<AtomicU64>,
    crash_at: u64,
    /// Images written at the crash: (data model, dirs kept, directory).
    images: Arc<Mutex<Vec<(String, tempfile::TempDir)>>>,
    /// Set by [`CrashFs::kill`]: every later operation fails, nothing is
    /// snapshotted (the process is gone, the page cache stays).
    killed: Arc<std::sync::atomic::AtomicBool>,
}

impl CrashFs {
    /// A backend over the live directory `root` (which exists, empty, and
    /// is durable) that crashes before operation `crash_at` (1-based; 0:
    /// never).
    fn new(root: &Path, crash_at: u64) -> CrashFs {
        CrashFs {
            real: vfs::real(),
            root: root.to_owned(),
            model: Arc::new(Mutex::new(Model::new(root))),
            ops: Arc::new(AtomicU64::new(0)),
            crash_at,
            images: Arc::new(Mutex::new(Vec::new())),
            killed: Arc::default(),
        }
    }

    /// A backend over an existing directory tree, all of it durable.
    fn over_existing(root: &Path, crash_at: u64) -> CrashFs {
        let fs = CrashFs::new(root, crash_at);
        {
            let mut m = fs.model.lock().unwrap();
            fn walk(m: &mut Model, dir: &Path) -> u64 {
                let mut d = Dir::default();
                for e in std::fs::read_dir(dir).unwrap() {
                    let e = e.unwrap();
                    let p = e.path();
                    if e.file_type().unwrap().is_dir() {
                        let id = walk(m, &p);
                        d.current.insert(e.file_name(), Node::Dir(id));
                    } else {
                        let ino = m.next_ino;
                        m.next_ino += 1;
                        m.inodes.insert(
                            ino,
                            Inode {
                                durable: std::fs::read(&p).unwrap(),
                                pending: Vec::new(),
                            },
                        );
                        m.paths.insert(p, ino);
                        d.current.insert(e.file_name(), Node::File(ino));
                    }
                }
                d.durable = d.current.clone();
                let id = match m.dir_paths.get(dir) {
                    Some(id) => *id,
                    None => m.new_dir(dir),
                };
                m.dirs.insert(id, d);
                id
            }
            walk(&mut m, root);
        }
        fs
    }

    /// Counts an operation; at the crash point, writes the images; after
    /// it, fails.
    fn op(&self) -> io::Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            return Err(io::Error::other("killed"));
        }
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_at != 0 && n == self.crash_at {
            self.snapshot();
        }
        if self.crash_at != 0 && n >= self.crash_at {
            return Err(io::Error::other("crashed"));
        }
        Ok(())
    }

    fn snapshot(&self) {
        let m = self.model.lock().unwrap();
        let mut images = self.images.lock().unwrap();
        let mut seen = HashSet::new();
        for data in DATA_MODELS {
            for keep_dirs in [false, true] {
                let dir = tempdir();
                let root = m.dir_paths[&self.root];
                m.materialise(root, dir.path(), data, keep_dirs);
                // Identical images are checked once.
                let digest = tree_digest(dir.path());
                if seen.insert(digest) {
                    images.push((format!("{data:?}, dirs kept: {keep_dirs}"), dir));
                }
            }
        }
    }

    fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// The same page-cache model for the next process after this one died
    /// (a kill, not a power loss: its writes are in the page cache, its
    /// syncs durable), with an operation counter of its own; it never
    /// crashes, and [`CrashFs::snapshot`] then gives the power loss.
    fn revived(&self) -> CrashFs {
        CrashFs {
            ops: Arc::new(AtomicU64::new(0)),
            crash_at: 0,
            images: Arc::new(Mutex::new(Vec::new())),
            killed: Arc::default(),
            ..self.clone()
        }
    }

    /// The process using this backend is killed: its later operations (a
    /// dropped handle's clean-up) fail and change nothing.
    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
    }
}

fn tree_digest(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_owned();
            if p.is_dir() {
                out.push((rel, b"/".to_vec()));
                stack.push(p);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[derive(Debug)]
struct CrashFile {
    inner: Box<dyn VfsFile>,
    ino: u64,
    fs: CrashFs,
}

impl CrashFile {
    fn record(&self, p: Pending) {
        let mut m = self.fs.model.lock().unwrap();
        m.inodes.get_mut(&self.ino).unwrap().pending.push(p);
    }

    fn sync(&self) {
        let mut m = self.fs.model.lock().unwrap();
        let len = self.inner.len().unwrap();
        let mut bytes = vec![0; len as usize];
        self.inner.read_exact_at(&mut bytes, 0).unwrap();
        let inode = m.inodes.get_mut(&self.ino).unwrap();
        inode.durable = bytes;
        inode.pending.clear();
    }
}

impl VfsFile for CrashFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.fs.op()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.fs.op()?;
        let n = self.inner.write_at(buf, offset)?;
        self.record(Pending::Write(offset, buf[..n].to_vec()));
        Ok(n)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.fs.op()?;
        self.inner.sync_data()?;
        self.sync();
        Ok(())
    }
    fn sync_all(&self) -> io::Result<()> {
        self.fs.op()?;
        self.inner.sync_all()?;
        self.sync();
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.fs.op()?;
        self.inner.set_len(len)?;
        self.record(Pending::SetLen(len));
        Ok(())
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fs.op()?;
        let before = self.inner.len()?;
        self.inner.allocate(offset, len)?;
        let after = self.inner.len()?;
        if after != before {
            self.record(Pending::SetLen(after));
        }
        Ok(())
    }
    fn len(&self) -> io::Result<u64> {
        self.fs.op()?;
        self.inner.len()
    }
}

impl CrashFs {
    fn file(&self, inner: Box<dyn VfsFile>, path: &Path) -> Box<dyn VfsFile> {
        let ino = *self
            .model
            .lock()
            .unwrap()
            .paths
            .get(path)
            .unwrap_or_else(|| panic!("unknown file {}", path.display()));
        Box::new(CrashFile {
            inner,
            ino,
            fs: self.clone(),
        })
    }
}

impl Vfs for CrashFs {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VfsFile>> {
        self.op()?;
        let f = self.real.create_new(path)?;
        {
            let mut m = self.model.lock().unwrap();
            let ino = m.next_ino;
            m.next_ino += 1;
            m.inodes.insert(ino, Inode::default());
            m.paths.insert(path.to_owned(), ino);
            m.add_entry(path, Node::File(ino));
        }
        Ok(self.file(f, path))
    }
    fn open(&self, path: &Path, writable: bool) -> io::Result<Box<dyn VfsFile>> {
        self.op()?;
        let f = self.real.open(path, writable)?;
        Ok(self.file(f, path))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.op()?;
        self.real.read_file(path)
    }
    fn map(&self, path: &Path) -> io::Result<SegmentBytes> {
        self.op()?;
        self.real.map(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.op()?;
        self.real.rename(from, to)?;
        self.model.lock().unwrap().renamed(from, to);
        Ok(())
    }
    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.op()?;
        self.real.rename_noreplace(from, to)?;
        self.model.lock().unwrap().renamed(from, to);
        Ok(())
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.op()?;
        self.real.exchange(a, b)?;
        let mut m = self.model.lock().unwrap();
        let na = m.remove_entry(a).expect("exchange: a exists");
        let nb = m.remove_entry(b).expect("exchange: b exists");
        m.add_entry(a, nb);
        m.add_entry(b, na);
        let swap = a.with_file_name(format!(".exchange-{}", std::process::id()));
        m.rekey(a, &swap);
        m.rekey(b, a);
        m.rekey(&swap, b);
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.op()?;
        self.real.remove_file(path)?;
        let mut m = self.model.lock().unwrap();
        m.remove_entry(path);
        m.paths.remove(path);
        Ok(())
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.op()?;
        self.real.remove_dir_all(path)?;
        let mut m = self.model.lock().unwrap();
        m.remove_entry(path);
        // The directory's own entries were unlinked too (not durable until
        // the directory is synced, which it never is again): keep its
        // entries so an image where the parent's entry survives shows the
        // old durable contents.
        m.forget(path);
        Ok(())
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.op()?;
        self.real.create_dir(path)?;
        let mut m = self.model.lock().unwrap();
        let id = m.new_dir(path);
        m.add_entry(path, Node::Dir(id));
        Ok(())
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.op()?;
        self.real.sync_dir(path)?;
        let mut m = self.model.lock().unwrap();
        if let Some(d) = m
            .dir_paths
            .get(path)
            .copied()
            .and_then(|id| m.dirs.get_mut(&id))
        {
            d.durable = d.current.clone();
        }
        Ok(())
    }
    fn hard_link(&self, src: &Path, dst: &Path) -> io::Result<()> {
        self.op()?;
        self.real.hard_link(src, dst)?;
        let mut m = self.model.lock().unwrap();
        let ino = m.paths[src];
        m.paths.insert(dst.to_owned(), ino);
        m.add_entry(dst, Node::File(ino));
        Ok(())
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        self.op()?;
        self.real.read_dir(path)
    }
    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        self.op()?;
        self.real.metadata(path)
    }
    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata> {
        self.op()?;
        self.real.symlink_metadata(path)
    }
}

// ---------------------------------------------------------------------------
// The workload and its model (as in tests/faults.rs)
// ---------------------------------------------------------------------------

mod common;
use common::{
    Model as SessionsModel, append_after_reopen, check_session, compress_options, fast_tempdir,
    journal_options, listed_sessions, options, workload_with,
};
use sessionlog::store::Options;

// ---------------------------------------------------------------------------
// Checking an image
// ---------------------------------------------------------------------------

fn tempdir() -> tempfile::TempDir {
    fast_tempdir()
}

/// The workload on a fresh directory through a file system that crashes
/// (or, revived, is killed) at operation `k`: the directory, the file
/// system and the model of what the workload acknowledged. `None` once the
/// workload finishes before operation `k`: every point is enumerated.
fn workload_crashed_at(
    k: u64,
    opts: Options,
) -> Option<(tempfile::TempDir, CrashFs, SessionsModel)> {
    let live = tempdir();
    let fs = CrashFs::new(live.path(), k);
    let arc: Arc<dyn Vfs> = Arc::new(fs.clone());
    let mut model = SessionsModel::default();
    let done = workload_with(&live.path().join("store"), &arc, &mut model, false, opts).is_ok();
    (!(done && fs.ops() < k)).then_some((live, fs, model))
}

fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// The recovered log of every session must fit the model; surface and
/// derive must equal a from-scratch fold. Returns the number of sessions
/// checked.
fn check_image(store_dir: &Path, model: &SessionsModel, context: &str) -> usize {
    let store = Store::open(store_dir, options())
        .unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
    let listed = listed_sessions(&store, model, context);
    let mut checked = 0;
    for (id, m) in &model.sessions {
        let Some(got) = check_session(&store, &listed, id, m, context) else {
            continue;
        };
        // A from-scratch fold: a fresh store fed the recovered events.
        let fresh_dir = tempdir();
        let fresh = Store::open(fresh_dir.path(), options()).unwrap();
        fresh.create(SessionHeader::new("x", 0)).unwrap();
        fresh.append("x", &got).unwrap();
        assert_eq!(
            store.surface(id).unwrap(),
            fresh.surface("x").unwrap(),
            "{context}: surface of {id}"
        );
        let a: Vec<String> = store
            .derive(id)
            .unwrap()
            .messages()
            .map(|m| format!("{m:?}"))
            .collect();
        let b: Vec<String> = fresh
            .derive("x")
            .unwrap()
            .messages()
            .map(|m| format!("{m:?}"))
            .collect();
        assert_eq!(a, b, "{context}: derive of {id}");
        let from = got.len() / 2;
        assert_eq!(
            store.read_from(id, from as u64).unwrap(),
            got[from..],
            "{context}: read_from of {id}"
        );
        // It accepts a new append.
        append_after_reopen(&store, id, got.len() as u64, context);
        checked += 1;
    }
    checked
}

/// A second crash at every operation of a reopen (open, take every session
/// for writing: recovery truncates torn tails, completes seals, appends
/// closers; then close) of the image in `image`. Returns (crash points,
/// images).
fn second_crash(image: &Path, model: &SessionsModel, context: &str) -> (u64, u64) {
    let (mut points, mut images) = (0, 0);
    let mut j = 1;
    loop {
        let live = tempdir();
        copy_tree(image, live.path());
        let fs = CrashFs::over_existing(live.path(), j);
        let arc: Arc<dyn Vfs> = Arc::new(fs.clone());
        let _ = (|| -> sessionlog::store::Result<()> {
            let store = Store::open_with_vfs(live.path().join("store"), options(), arc)?;
            for h in store.list()? {
                // As the session's writer: recovery with authority (torn
                // tails cut, seals finished, closers appended).
                store.repair(&h.id)?;
                store.read_from(&h.id, 0)?;
            }
            store.close()
        })();
        if fs.ops() < j {
            break;
        }
        points += 1;
        for (name, dir) in fs.images.lock().unwrap().iter() {
            images += 1;
            check_image(
                &dir.path().join("store"),
                model,
                &format!("{context}; second crash at op {j} ({name})"),
            );
        }
        j += 1;
    }
    (points, images)
}

#[test]
fn crash_at_every_operation() {
    crash_at_every_operation_of(options, "");
}

/// The same with the store-wide journal (issue 18): an acknowledged batch
/// whose segment write a crash lost is written back from the journal by
/// the reopen (the journal's file creation, entries, syncs and the
/// replay itself are crash points too).
#[test]
fn crash_at_every_operation_with_the_journal() {
    crash_at_every_operation_of(journal_options, "journal; ");
}

/// The same with a's sealed segments compressed after the checkpoint and
/// then shared by the fork: the manifest's upgrade, each image's write,
/// sync, rename, directory sync and the raw file's removal are crash
/// points; every image must read as the session did.
#[test]
fn crash_at_every_operation_compressing() {
    crash_at_every_operation_of(compress_options, "compress; ");
}

/// A writer process killed at every operation (every 7th: bounded time),
/// its page cache intact; the next process opens the store (replaying the
/// dead one's journal), takes every session for writing and closes it;
/// the power fails right after that open, or after the close. Every batch the dead writer acknowledged survives,
/// and every session loads. Before, the second process found the dead
/// one's journaled records in the page cache, synced nothing and removed
/// the journal, and wrote checkpoints over records never synced (a session
/// then refused to load after the power loss).
#[test]
fn a_writer_after_a_killed_one_makes_what_it_inherits_durable() {
    for (opts, label) in [
        (options as fn() -> Options, "sync"),
        (journal_options, "journal"),
    ] {
        let (mut points, mut images) = (0u64, 0u64);
        let mut k = 1;
        loop {
            let Some((live, fs, model)) = workload_crashed_at(k, opts()) else {
                break;
            };
            points += 1;
            let next = fs.revived();
            let reopened = (|| -> sessionlog::store::Result<()> {
                let store = Store::open_with_vfs(
                    live.path().join("store"),
                    opts(),
                    Arc::new(next.clone()),
                )?;
                // A power loss right after the open (which replayed the
                // dead writer's journal and removed it).
                next.snapshot();
                for h in store.list()? {
                    store.repair(&h.id)?;
                }
                store.close()
            })();
            reopened.unwrap_or_else(|e| {
                panic!("{label}: killed at op {k}: the next writer failed: {e}")
            });
            next.snapshot();
            for (name, dir) in next.images.lock().unwrap().iter() {
                images += 1;
                check_image(
                    &dir.path().join("store"),
                    &model,
                    &format!("{label}: killed at op {k}, next writer, power loss ({name})"),
                );
            }
            k += 7;
        }
        println!("{label}: {points} kill points, {images} images after the next writer");
        assert!(points > 10, "{label}: {points}");
    }
}

fn crash_at_every_operation_of(opts: fn() -> Options, label: &str) {
    let (mut points, mut images, mut sessions) = (0u64, 0u64, 0usize);
    let (mut points2, mut images2) = (0u64, 0u64);
    let mut k = 1;
    loop {
        let Some((_live, fs, model)) = workload_crashed_at(k, opts()) else {
            break;
        };
        points += 1;
        let taken = std::mem::take(&mut *fs.images.lock().unwrap());
        for (i, (name, dir)) in taken.iter().enumerate() {
            images += 1;
            let context = format!("{label}crash at op {k} ({name})");
            // A second crash during recovery, for every 4th crash point
            // (on its first image: unsynced data dropped, unsynced entries
            // gone): bounded time. Copied before the check below changes it.
            let pristine = (i == 0 && k % 4 == 0).then(|| {
                let copy = tempdir();
                copy_tree(dir.path(), copy.path());
                copy
            });
            sessions += check_image(&dir.path().join("store"), &model, &context);
            if let Some(copy) = pristine {
                let (p, n) = second_crash(copy.path(), &model, &context);
                points2 += p;
                images2 += n;
            }
        }
        k += 1;
    }
    println!(
        "{label}crash points: {points}, distinct images checked: {images} ({sessions} session checks); \
         second crash during recovery: {points2} points, {images2} images"
    );
    assert!(points > 100 && images > points);
}

/// A process killed at every operation of its first writable open with
/// the journal (creating the store, `journal/` and its first journal
/// file), its page cache kept; the next process opens the store with the
/// journal, creates a session and appends two batches (the second
/// acknowledged by the journal alone), and the power fails with that
/// handle open. Both batches survive in every image. Before, a `journal/`
/// the killed process had created but not yet synced into the store
/// directory was taken as durable by the next process, whose journal file
/// (and acknowledged batch) then vanished with it.
#[test]
fn a_journal_directory_a_killed_process_created_is_synced_by_the_next() {
    use common::next_turn;
    let (mut points, mut images) = (0u64, 0u64);
    let mut k = 1;
    loop {
        let live = tempdir();
        let store_dir = live.path().join("store");
        let fs = CrashFs::new(live.path(), k);
        let arc: Arc<dyn Vfs> = Arc::new(fs.clone());
        let done = Store::open_with_vfs(&store_dir, journal_options(), arc).is_ok();
        if done && fs.ops() < k {
            break;
        }
        k += 1;
        // Only kills after the journal directory exists are of interest.
        if !store_dir.join("journal").exists() {
            continue;
        }
        points += 1;
        let next = fs.revived();
        let store =
            Store::open_with_vfs(&store_dir, journal_options(), Arc::new(next.clone())).unwrap();
        store.create(SessionHeader::new("s", 0)).unwrap();
        let first = next_turn(&[]);
        let second = next_turn(&first);
        store.append("s", &first).unwrap();
        store.append("s", &second).unwrap();
        // The power fails; the handle never closes.
        next.snapshot();
        for (name, dir) in next.images.lock().unwrap().iter() {
            images += 1;
            let context = format!("killed at op {}, power loss ({name})", k - 1);
            let reopened = Store::open(dir.path().join("store"), options())
                .unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
            assert_eq!(
                reopened.read_from("s", 0).ok(),
                Some([first.clone(), second.clone()].concat()),
                "{context}: an acknowledged batch was lost"
            );
        }
        // The power failed: the handle's clean-up changes nothing.
        next.kill();
        drop(store);
    }
    println!("{points} kill points, {images} images");
    assert!(points > 3, "{points}");
}

/// A writer process killed at every operation, its page cache intact; the
/// next process opens the store, takes every session for writing, appends
/// one more turn to each (acknowledged), and the power fails with that
/// handle open. What the next writer acknowledged, and everything it
/// showed before, survives in every image. Before: the session's
/// publishing rename, made by the killed process but not yet synced, was
/// lost with the batches the next writer acknowledged in it ("session "a"
/// does not exist"); and with the journal, records the killed process had
/// written but not journaled (shown, built on) were never synced before
/// the next writer's journaled batches, which a power loss then left
/// behind a gap of zeros ("a: 1 events, 5 acknowledged").
fn next_writer_acknowledges_only_on_what_is_durable(opts: fn() -> Options, label: &str) {
    let (mut points, mut images) = (0u64, 0u64);
    let mut k = 1;
    loop {
        let Some((live, fs, _model)) = workload_crashed_at(k, opts()) else {
            break;
        };
        points += 1;
        let next = fs.revived();
        let store = Store::open_with_vfs(live.path().join("store"), opts(), Arc::new(next.clone()))
            .unwrap_or_else(|e| panic!("{label}: killed at op {k}: open: {e}"));
        let mut expected = Vec::new();
        for h in store.list().unwrap() {
            store
                .repair(&h.id)
                .unwrap_or_else(|e| panic!("{label}: killed at op {k}: repair: {e}"));
            let before = store.read_from(&h.id, 0).unwrap();
            let more = common::next_turn(&before);
            store.append(&h.id, &more).unwrap();
            expected.push((h.id.clone(), [before, more].concat()));
        }
        // The power fails; the handle never closes.
        next.snapshot();
        for (name, dir) in next.images.lock().unwrap().iter() {
            images += 1;
            let context =
                format!("{label}: killed at op {k}, next writer appended, power loss ({name})");
            let reopened = Store::open(dir.path().join("store"), options())
                .unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            for (id, want) in &expected {
                let got = reopened
                    .read_from(id, 0)
                    .unwrap_or_else(|e| panic!("{context}: {id}: {e}"));
                assert!(
                    got.len() >= want.len() && got[..want.len()] == want[..],
                    "{context}: {id}: {} events, {} acknowledged",
                    got.len(),
                    want.len()
                );
            }
        }
        // The power failed: the handle's clean-up changes nothing.
        next.kill();
        drop(store);
        k += 1;
    }
    println!("{label}: {points} kill points, {images} images after the next writer's append");
    assert!(points > 100, "{label}: {points}");
}

#[test]
fn a_writer_after_a_killed_one_acknowledges_only_on_what_is_durable() {
    next_writer_acknowledges_only_on_what_is_durable(options, "sync");
}

/// The same with the store-wide journal on: the next writer's batches are
/// acknowledged by the journal, so the records it inherited unsynced must
/// be synced in their segment before the first of them.
#[test]
fn a_writer_after_a_killed_one_acknowledges_only_on_what_is_durable_with_the_journal() {
    next_writer_acknowledges_only_on_what_is_durable(journal_options, "journal");
}

/// A writer process killed at every operation, its page cache intact; the
/// next process takes every session, appends a turn, seals the session,
/// compresses its sealed segments, appends again and forks it (appending
/// to the fork), all acknowledged; then the power fails with that handle
/// open. Every session and fork reads what was acknowledged, and verifies.
/// Before F39, a seal the killed process had left uncut was finished by
/// the next writer, which kept its map of the uncut file: its fork after
/// the compression failed ("no footer magic at the end of the file",
/// naming the image; `SIGBUS` when the cut removed whole pages).
fn next_writer_seals_compresses_and_forks(opts: fn() -> Options, label: &str) {
    let (mut points, mut images) = (0u64, 0u64);
    let mut k = 1;
    loop {
        let Some((live, fs, _model)) = workload_crashed_at(k, opts()) else {
            break;
        };
        points += 1;
        let next = fs.revived();
        let store = Store::open_with_vfs(
            live.path().join("store"),
            Options {
                compress_sealed: false,
                ..opts()
            },
            Arc::new(next.clone()),
        )
        .unwrap_or_else(|e| panic!("{label}: killed at op {k}: open: {e}"));
        let mut expected = Vec::new();
        for h in store.list().unwrap() {
            let id = h.id.clone();
            store
                .repair(&id)
                .unwrap_or_else(|e| panic!("{label}: killed at op {k}: repair {id}: {e}"));
            let before = store.read_from(&id, 0).unwrap();
            let more = common::next_turn(&before);
            store.append(&id, &more).unwrap();
            let _ = store.seal(&id).unwrap();
            store
                .compress_sealed(&id)
                .unwrap_or_else(|e| panic!("{label}: killed at op {k}: compress {id}: {e}"));
            let all = [before, more].concat();
            let more2 = common::next_turn(&all);
            store.append(&id, &more2).unwrap();
            let all = [all, more2].concat();
            let fid = format!("{id}-f");
            if store.load(&fid).is_err() {
                store
                    .fork(&id, all.len() as u64, SessionHeader::new(&fid, 0))
                    .unwrap_or_else(|e| panic!("{label}: killed at op {k}: fork {id}: {e}"));
                let fbase = store.read_from(&fid, 0).unwrap();
                let fm = common::next_turn(&fbase);
                store.append(&fid, &fm).unwrap();
                expected.push((fid.clone(), [fbase, fm].concat()));
            }
            expected.push((id.clone(), all));
        }
        next.snapshot();
        for (name, dir) in next.images.lock().unwrap().iter() {
            images += 1;
            let context = format!(
                "{label}: killed at op {k}, next writer sealed, compressed, forked, power loss ({name})"
            );
            let reopened = Store::open(dir.path().join("store"), options())
                .unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
            for (id, want) in &expected {
                let got = reopened
                    .read_from(id, 0)
                    .unwrap_or_else(|e| panic!("{context}: {id}: {e}"));
                assert!(
                    got.len() >= want.len() && got[..want.len()] == want[..],
                    "{context}: {id}: {} events, {} acknowledged",
                    got.len(),
                    want.len()
                );
                reopened
                    .verify(id)
                    .unwrap_or_else(|e| panic!("{context}: verify {id}: {e}"));
            }
        }
        // The power failed: the handle's clean-up changes nothing.
        next.kill();
        drop(store);
        k += 1;
    }
    println!("{label}: {points} kill points, {images} images");
    assert!(points > 100, "{label}: {points}");
}

#[test]
fn a_writer_after_a_killed_one_seals_compresses_and_forks_durably() {
    next_writer_seals_compresses_and_forks(compress_options, "compress");
}

#[test]
fn a_writer_after_a_killed_one_seals_compresses_and_forks_durably_with_the_journal() {
    fn journal_compress() -> Options {
        Options {
            compress_sealed: true,
            ..journal_options()
        }
    }
    next_writer_seals_compresses_and_forks(journal_compress, "journal, compress");
}

/// A writer process killed at every operation of the compressing workload
/// (which raises the store to version 4 before its first image), its page
/// cache kept; the next process seals and compresses every session, and
/// the power fails with that handle open. An image never exists in a
/// store whose durable `MANIFEST` says version 3 (format-spec section 2:
/// a build that reads only version 3 would read such a store short).
/// Before, a killed process's rename of the version-4 manifest, not yet
/// synced, was taken as done by the next process, which wrote images
/// under it: the power loss then left images beside a version-3 manifest.
#[test]
fn no_image_outlives_the_manifest_upgrade_a_killed_process_began() {
    // The next process compresses with `Store::compress_sealed`, or in the
    // background (`Options::compress_sealed` at its open).
    for background in [false, true] {
        no_image_outlives_the_manifest_upgrade(background);
    }
}

fn no_image_outlives_the_manifest_upgrade(background: bool) {
    let (mut points, mut images) = (0u64, 0u64);
    let mut k = 1;
    loop {
        let Some((live, fs, _model)) = workload_crashed_at(k, compress_options()) else {
            break;
        };
        k += 1;
        points += 1;
        let next = fs.revived();
        let opts = if background {
            compress_options()
        } else {
            options()
        };
        let store = Store::open_with_vfs(live.path().join("store"), opts, Arc::new(next.clone()))
            .unwrap_or_else(|e| panic!("killed at op {}: open: {e}", k - 1));
        for h in store.list().unwrap() {
            store.seal(&h.id).unwrap();
            if !background {
                store.compress_sealed(&h.id).unwrap();
            }
        }
        let start = std::time::Instant::now();
        while store.compression_status().pending > 0 {
            assert!(start.elapsed().as_secs() < 60, "compression stuck");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        next.snapshot();
        for (name, dir) in next.images.lock().unwrap().iter() {
            images += 1;
            let store_dir = dir.path().join("store");
            // (No manifest: the killed process's store never became
            // durable, and no image either.)
            let version = std::fs::read(store_dir.join("MANIFEST"))
                .map_or(0, |m| u32::from_le_bytes(m[8..12].try_into().unwrap()));
            let mut stack = vec![store_dir.join("sessions")];
            let mut image = None;
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "segz") {
                        image = Some(p);
                    }
                }
            }
            if let Some(image) = image {
                // Version 4 brought images; this build raises to 5.
                assert!(
                    version >= 4,
                    "background: {background}: killed at op {}, power loss ({name}): {} exists under a version-{version} manifest",
                    k - 1,
                    image.display()
                );
            }
        }
        next.kill();
        drop(store);
    }
    println!("background: {background}: {points} kill points, {images} images");
    assert!(points > 100, "{points}");
}
