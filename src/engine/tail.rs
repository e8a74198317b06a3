//! Following a session: its events from a seq on, then new ones as any
//! writer (in any process) appends them.
//!
//! Waiting uses inotify on the session's directory where the OS has it (a
//! record written with `pwrite`, a new segment, a checkpoint renamed in, or
//! the directory itself replaced all wake the follower), so an idle follower
//! costs nothing; elsewhere, or if inotify cannot be had, it looks again
//! every 50 ms. Every wake-up re-reads through the store's fresh-read path,
//! so a missed or spurious notification only costs a look.

use super::error::{Error, Result};
use super::handle::Store;
use crate::event::OwnedEvent;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A follower of one session (see [`Store::tail`]).
pub struct Tail {
    store: Store,
    id: String,
    /// The incarnation followed: another one is [`Error::Replaced`].
    incarnation: String,
    next: u64,
    dir: PathBuf,
    watch: Option<Watch>,
}

impl Store {
    /// Follows session `id` from seq `from`: [`Tail::poll`] returns what is
    /// stored from there on (acknowledged batches of any writer, whole),
    /// [`Tail::wait`] waits for more. Only stored events are returned: a
    /// read-only handle's synthesised closers never are (the session's next
    /// writer appends the real ones).
    pub fn tail(&self, id: &str, from: u64) -> Result<Tail> {
        let dir = self.session_dir(id)?;
        if !self.exists(id)? {
            return Err(Error::NotFound(id.to_owned()));
        }
        Ok(Tail {
            store: self.clone(),
            id: id.to_owned(),
            incarnation: self.incarnation(id)?,
            next: from,
            watch: Watch::new(&dir),
            dir,
        })
    }
}

impl Tail {
    /// The seq of the next event this follower will return.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// The events stored from the follow position on, now (possibly none);
    /// the position moves past them. A session replaced since the follow
    /// began (another incarnation of the id) is [`Error::Replaced`], a
    /// deleted one [`Error::NotFound`]: its events are never mixed in.
    pub fn poll(&mut self) -> Result<Vec<OwnedEvent>> {
        self.same_incarnation()?;
        // Nothing new: no read (it would decode the last batch, or a whole
        // compressed segment, on every wake of an idle follower).
        if self.store.next_seq(&self.id)? <= self.next {
            return Ok(Vec::new());
        }
        let events = self.store.read_stored_from(&self.id, self.next)?;
        // Checked again: a replacement between the check and the read must
        // not hand out the new log's events as this one's.
        self.same_incarnation()?;
        if let Some(last) = events.last() {
            self.next = last.seq + 1;
        }
        Ok(events)
    }

    fn same_incarnation(&self) -> Result<()> {
        if self.store.incarnation(&self.id)? == self.incarnation {
            Ok(())
        } else {
            Err(Error::Replaced(self.id.clone()))
        }
    }

    /// Like [`Tail::poll`], but when nothing new is stored, waits up to
    /// `timeout` for something to be (an empty result means none came).
    /// A deleted session is [`Error::NotFound`], a replaced one
    /// [`Error::Replaced`].
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<OwnedEvent>> {
        // `Duration::MAX` (wait for good) must not overflow the clock.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let events = self.poll()?;
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if !events.is_empty() || left.is_zero() {
                return Ok(events);
            }
            let step = left.min(Duration::from_millis(500));
            match &mut self.watch {
                Some(w) => {
                    if w.wait(step) == Woke::Moved {
                        // The directory was replaced: watch the new one.
                        self.watch = Watch::new(&self.dir);
                    }
                }
                None => std::thread::sleep(step.min(Duration::from_millis(50))),
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Woke {
    Changed,
    Moved,
    TimedOut,
}

/// An inotify watch on one directory.
struct Watch {
    fd: std::os::fd::OwnedFd,
}

impl Watch {
    #[cfg(target_os = "linux")]
    fn new(dir: &Path) -> Option<Watch> {
        use std::ffi::CString;
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let path = CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: plain syscalls; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is a descriptor we just opened and own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mask = libc::IN_MODIFY
            | libc::IN_CREATE
            | libc::IN_MOVED_TO
            | libc::IN_CLOSE_WRITE
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid inotify descriptor and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) };
        (wd >= 0).then_some(Watch { fd })
    }

    #[cfg(not(target_os = "linux"))]
    fn new(_dir: &Path) -> Option<Watch> {
        None
    }

    /// Waits for an event or `timeout`, then drains what is queued.
    fn wait(&mut self, timeout: Duration) -> Woke {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            return Woke::TimedOut;
        }
        let mut woke = Woke::Changed;
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into a buffer we own, within its length.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                break;
            }
            let mut at = 0usize;
            let header = std::mem::size_of::<libc::inotify_event>();
            while at + header <= r as usize {
                // SAFETY: the kernel wrote whole events; read one unaligned.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                if ev.mask & (libc::IN_MOVE_SELF | libc::IN_DELETE_SELF | libc::IN_IGNORED) != 0 {
                    woke = Woke::Moved;
                }
                at += header + ev.len as usize;
            }
        }
        woke
    }
}
