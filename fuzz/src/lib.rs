//! Shared helpers of the sessionlog fuzz targets: an allocator that measures
//! what one input makes the engine allocate, a scratch directory on tmpfs, a
//! byte reader for structured inputs, and the prefix oracle of recovery.

use sessionlog::event::{Event, OwnedEvent};
use sessionlog::session::SessionState;
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

// ---------------------------------------------------------------------------
// Allocation accounting
// ---------------------------------------------------------------------------

/// The global allocator of every target: the system allocator, counting the
/// bytes live and the largest single request, so a target can assert that an
/// input never makes the engine allocate more than the input's size allows
/// (a length field read from a file must never drive an allocation).
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
    LARGEST.fetch_max(size, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; the counters are
// only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What one input allocated, measured from [`AllocWindow::start`].
pub struct AllocWindow {
    base: usize,
}

impl AllocWindow {
    /// Starts measuring: the peak and the largest request are reset.
    pub fn start() -> AllocWindow {
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        LARGEST.store(0, Ordering::Relaxed);
        AllocWindow { base }
    }

    /// Bytes live at the peak, above what was live at the start.
    pub fn peak(&self) -> usize {
        PEAK.load(Ordering::Relaxed).saturating_sub(self.base)
    }

    /// The largest single allocation.
    pub fn largest(&self) -> usize {
        LARGEST.load(Ordering::Relaxed)
    }

    /// Panics when the input made the engine allocate more than `budget`
    /// bytes at once (peak live bytes or one request).
    pub fn check(&self, budget: usize, what: &str) {
        let (peak, largest) = (self.peak(), self.largest());
        assert!(
            peak <= budget && largest <= budget,
            "{what}: allocation beyond the input's size: peak {peak} B live, largest request \
             {largest} B, budget {budget} B"
        );
    }
}

/// The allocation budget for an input of `input_len` bytes acting on files
/// of `image_len` bytes: a fixed floor (I/O buffers, the fold's indexes)
/// plus a small multiple of the bytes that exist. A length field of 2^32-1
/// blows through it; honest work on a small image does not.
pub fn budget(input_len: usize, image_len: usize) -> usize {
    (8 << 20) + 32 * (input_len + image_len)
}

// ---------------------------------------------------------------------------
// Scratch space
// ---------------------------------------------------------------------------

/// A per-process scratch directory, on tmpfs when there is one (fsync is
/// then nearly free, which is what makes thousands of store opens a second
/// possible). Directories of processes that no longer run are removed.
pub fn scratch_root(target: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    // Remove what earlier processes (fork-mode jobs, killed runs) left.
    let prefix = format!("sessionlog-fuzz-{target}-");
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                remove_tree(&entry.path());
            }
        }
    }
    let root = base.join(format!("{prefix}{}", std::process::id()));
    std::fs::create_dir_all(&root).expect("create the scratch root");
    root
}

/// Removes a directory tree, making it writable first (an input may have
/// left a file where a directory was, or the reverse).
pub fn remove_tree(dir: &Path) {
    if std::fs::remove_dir_all(dir).is_err() {
        let _ = std::fs::remove_file(dir);
    }
}

// ---------------------------------------------------------------------------
// Structured input
// ---------------------------------------------------------------------------

/// Reads fixed-size values from the front of a fuzz input; past the end it
/// yields zeros, so every input decodes to something.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

// ---------------------------------------------------------------------------
// The recovery oracle
// ---------------------------------------------------------------------------

/// The repair closers the store appends after the first `n` events of `log`
/// (empty when the prefix ends with every turn closed).
pub fn closers_after(log: &[OwnedEvent], n: usize) -> Vec<OwnedEvent> {
    let mut state = SessionState::new(false);
    state
        .append_batch(&log[..n], &Vec::<Event<'_>>::new())
        .expect("a prefix of an accepted log folds");
    state.closers()
}

/// Checks that `loaded` is the first `b` events of `original` followed by
/// exactly the closers of that prefix, for some batch boundary `b` in
/// `boundaries` (cumulative event counts of the batches, 0 included).
/// Returns `b`, or a description of the mismatch.
pub fn prefix_boundary(
    original: &[OwnedEvent],
    boundaries: &[usize],
    loaded: &[OwnedEvent],
) -> Result<usize, String> {
    let common = original
        .iter()
        .zip(loaded)
        .take_while(|(a, b)| a == b)
        .count();
    for &b in boundaries.iter().rev() {
        if b > common || b > loaded.len() {
            continue;
        }
        if loaded[b..] == closers_after(original, b)[..] {
            return Ok(b);
        }
    }
    Err(format!(
        "loaded {} events; {} agree with the original log ({} events) but no batch boundary \
         <= {} is followed by exactly its repair closers; first differing event: {:?}",
        loaded.len(),
        common,
        original.len(),
        common,
        loaded.get(common).map(Event::to_json),
    ))
}
