//! Fault injection (`internals` feature, and the crate's unit tests): a
//! [`Vfs`] that fails the Nth operation.

use super::{Metadata, SegmentBytes, Vfs, VfsFile};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The error a [`FaultFs`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `EIO`: an I/O error.
    Eio,
    /// `ENOSPC`: no space left on the device.
    Enospc,
    /// `EMFILE`: the process is out of file descriptors (transient: says
    /// nothing about the files).
    Emfile,
}

impl FaultKind {
    fn error(self, op: &str) -> io::Error {
        let code = match self {
            FaultKind::Eio => libc::EIO,
            FaultKind::Enospc => libc::ENOSPC,
            FaultKind::Emfile => libc::EMFILE,
        };
        let os = io::Error::from_raw_os_error(code);
        io::Error::new(
            os.kind(),
            Injected {
                op: op.to_owned(),
                os,
            },
        )
    }
}

/// An injected error: names the operation, and has the OS error it stands
/// for as its source (what a caller classifying errors looks at).
#[derive(Debug)]
struct Injected {
    op: String,
    os: io::Error,
}

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "injected fault in {}: {}", self.op, self.os)
    }
}

impl std::error::Error for Injected {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.os)
    }
}

/// What a [`FaultFs`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultPlan {
    /// Fail the operation with this 1-based index (`None`: never fail).
    pub fail_at: Option<u64>,
    /// The error injected.
    pub kind: FaultKind,
    /// Keep failing every operation after the first injected fault.
    pub persistent: bool,
    /// A failed write first writes the first half of its buffer (a torn
    /// write that also reports an error).
    pub partial_write: bool,
    /// Reads return at most half of what was asked (at least one byte).
    pub short_reads: bool,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            fail_at: None,
            kind: FaultKind::Eio,
            persistent: false,
            partial_write: false,
            short_reads: false,
        }
    }
}

#[derive(Debug)]
struct FaultState {
    plan: Mutex<FaultPlan>,
    ops: AtomicU64,
    injected: AtomicU64,
    /// The operations that failed: (index, description).
    failed: Mutex<Vec<(u64, String)>>,
}

/// A [`Vfs`] that passes every operation to an inner backend, counting
/// them, and fails operation number [`FaultPlan::fail_at`] (and, with
/// [`FaultPlan::persistent`], every later one). Clones share the counter
/// and the plan.
#[derive(Debug, Clone)]
pub struct FaultFs {
    inner: Arc<dyn Vfs>,
    state: Arc<FaultState>,
}

impl FaultFs {
    /// Wraps `inner` with `plan`.
    pub fn new(inner: Arc<dyn Vfs>, plan: FaultPlan) -> Self {
        FaultFs {
            inner,
            state: Arc::new(FaultState {
                plan: Mutex::new(plan),
                ops: AtomicU64::new(0),
                injected: AtomicU64::new(0),
                failed: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Operations counted so far.
    pub fn ops(&self) -> u64 {
        self.state.ops.load(Ordering::SeqCst)
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// The operations that failed, with their index and a description.
    pub fn failed_ops(&self) -> Vec<(u64, String)> {
        self.state.failed.lock().expect("fault log").clone()
    }

    /// Replaces the plan (the counter keeps running).
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.state.plan.lock().expect("fault plan") = plan;
    }

    /// The current plan.
    pub fn plan(&self) -> FaultPlan {
        *self.state.plan.lock().expect("fault plan")
    }

    /// Counts one operation; `Err` if it must fail.
    fn op(&self, what: impl FnOnce() -> String) -> Result<(), (io::Error, bool)> {
        self.state.op(what)
    }
}

impl FaultState {
    fn op(&self, what: impl FnOnce() -> String) -> Result<(), (io::Error, bool)> {
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        let plan = *self.plan.lock().expect("fault plan");
        let fail = match plan.fail_at {
            Some(k) => n == k || (plan.persistent && n > k),
            None => false,
        };
        if fail {
            let what = what();
            self.injected.fetch_add(1, Ordering::SeqCst);
            let err = plan.kind.error(&what);
            self.failed.lock().expect("fault log").push((n, what));
            return Err((err, plan.partial_write));
        }
        Ok(())
    }

    fn short_reads(&self) -> bool {
        self.plan.lock().expect("fault plan").short_reads
    }
}

fn check(r: Result<(), (io::Error, bool)>) -> io::Result<()> {
    r.map_err(|(e, _)| e)
}

#[derive(Debug)]
struct FaultFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    state: Arc<FaultState>,
}

impl VfsFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        check(self.state.op(|| format!("read_at {}", self.path.display())))?;
        if self.state.short_reads() && buf.len() > 1 {
            let n = buf.len() / 2;
            return self.inner.read_at(&mut buf[..n], offset);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let what = || format!("write_at {} +{}", self.path.display(), buf.len());
        if let Err((e, partial)) = self.state.op(what) {
            if partial && buf.len() > 1 {
                let _ = self.inner.write_all_at(&buf[..buf.len() / 2], offset);
            }
            return Err(e);
        }
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        check(
            self.state
                .op(|| format!("sync_data {}", self.path.display())),
        )?;
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        check(
            self.state
                .op(|| format!("sync_all {}", self.path.display())),
        )?;
        self.inner.sync_all()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        check(
            self.state
                .op(|| format!("set_len {} {len}", self.path.display())),
        )?;
        self.inner.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        check(
            self.state
                .op(|| format!("allocate {}", self.path.display())),
        )?;
        self.inner.allocate(offset, len)
    }
    fn len(&self) -> io::Result<u64> {
        check(self.state.op(|| format!("len {}", self.path.display())))?;
        self.inner.len()
    }
}

impl FaultFs {
    fn file(&self, inner: Box<dyn VfsFile>, path: &Path) -> Box<dyn VfsFile> {
        Box::new(FaultFile {
            inner,
            path: path.to_owned(),
            state: self.state.clone(),
        })
    }
}

impl Vfs for FaultFs {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VfsFile>> {
        check(self.op(|| format!("create_new {}", path.display())))?;
        let f = self.inner.create_new(path)?;
        Ok(self.file(f, path))
    }
    fn open(&self, path: &Path, writable: bool) -> io::Result<Box<dyn VfsFile>> {
        check(self.op(|| format!("open {}", path.display())))?;
        let f = self.inner.open(path, writable)?;
        Ok(self.file(f, path))
    }
    fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        check(self.op(|| format!("read_file {}", path.display())))?;
        self.inner.read_file(path)
    }
    fn map(&self, path: &Path) -> io::Result<SegmentBytes> {
        check(self.op(|| format!("map {}", path.display())))?;
        self.inner.map(path)
    }
    fn coherent_maps(&self) -> bool {
        self.inner.coherent_maps()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        check(self.op(|| format!("rename {} {}", from.display(), to.display())))?;
        self.inner.rename(from, to)
    }
    fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<()> {
        check(self.op(|| format!("rename_noreplace {} {}", from.display(), to.display())))?;
        self.inner.rename_noreplace(from, to)
    }
    fn exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        check(self.op(|| format!("exchange {} {}", a.display(), b.display())))?;
        self.inner.exchange(a, b)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        check(self.op(|| format!("remove_file {}", path.display())))?;
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        check(self.op(|| format!("remove_dir_all {}", path.display())))?;
        self.inner.remove_dir_all(path)
    }
    fn create_dir(&self, path: &Path) -> io::Result<()> {
        check(self.op(|| format!("create_dir {}", path.display())))?;
        self.inner.create_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        check(self.op(|| format!("sync_dir {}", path.display())))?;
        self.inner.sync_dir(path)
    }
    fn hard_link(&self, src: &Path, dst: &Path) -> io::Result<()> {
        check(self.op(|| format!("hard_link {} {}", src.display(), dst.display())))?;
        self.inner.hard_link(src, dst)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        check(self.op(|| format!("read_dir {}", path.display())))?;
        self.inner.read_dir(path)
    }
    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        check(self.op(|| format!("metadata {}", path.display())))?;
        self.inner.metadata(path)
    }
    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata> {
        check(self.op(|| format!("symlink_metadata {}", path.display())))?;
        self.inner.symlink_metadata(path)
    }
}
