//! Progress of an import as it goes: see [`Progress`].

/// Bytes of a session file's text between two reports while reading.
pub const REPORT_BYTES: u64 = 64 * 1024;
/// Events of a database between two reports while reading.
pub const REPORT_EVENTS: u64 = 1000;

/// What an import is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Stage {
    /// Reading the input and checking it by the rules of the session model:
    /// `bytes` (a session file) or `sessions` and `events` (a database)
    /// move. Nothing is written yet.
    #[default]
    Reading,
    /// Writing the checked sessions into the store: `sessions` and `events`
    /// count what is stored, from 0; `events` moves within a session too,
    /// as the store writes its batches.
    Storing,
}

/// How far one import call has got: what
/// [`import_file_with_progress`] and [`import_db_with_progress`] hand their
/// observer, a `&mut dyn FnMut(Progress)`.
///
/// Within a [`Stage`] every count only grows; the last report of a
/// successful import is [`Stage::Storing`] with `sessions ==
/// total_sessions`. Reports come at a bounded rate whatever the input's
/// size: while reading, one per [`REPORT_BYTES`] of a session file's text
/// or per [`REPORT_EVENTS`] events of a database, plus one per database
/// session and two at the change of stage; while storing, one per
/// session, plus within a session one per batch the store writes (see
/// [`Store::import_with_progress`]) once another [`REPORT_EVENTS`] events
/// are written. An observer may draw each one.
///
/// ```
/// use sessionlog::adapters::{Progress, Stage};
/// let mut seen = Vec::new();
/// let mut observer = |p: Progress| seen.push((p.stage, p.bytes, p.total_bytes));
/// observer(Progress::default());
/// assert_eq!(seen, [(Stage::Reading, 0, 0)]);
/// ```
///
/// [`import_file_with_progress`]: crate::adapters::harness::import_file_with_progress
/// [`import_db_with_progress`]: crate::adapters::sqlite::import_db_with_progress
/// [`Store::import_with_progress`]: crate::store::Store::import_with_progress
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Progress {
    /// What the import is doing.
    pub stage: Stage,
    /// A session file: bytes of its JSONL text read and checked (of a
    /// Zstandard log, of the decoded text). 0 for a database.
    pub bytes: u64,
    /// A session file: the size of that text (the file's size for plain
    /// JSONL), known from the first report on. 0 for a database.
    pub total_bytes: u64,
    /// Events read and checked ([`Stage::Reading`]; packed rows expanded),
    /// then events stored ([`Stage::Storing`]; those of the session being
    /// stored included as its batches are written).
    pub events: u64,
    /// Sessions read and checked, then sessions stored (closers appended).
    pub sessions: u64,
    /// Sessions in the input: 1 for a session file, the `sessions` rows of a
    /// database (0 until they are counted).
    pub total_sessions: u64,
}

/// Hands [`Progress`] to an observer at a bounded rate.
pub(crate) struct Reporter<'a> {
    observe: &'a mut dyn FnMut(Progress),
    now: Progress,
    next_bytes: u64,
    next_events: u64,
    /// Events of the sessions stored whole ([`Stage::Storing`]).
    stored_events: u64,
}

impl<'a> Reporter<'a> {
    /// A reporter to `observe`.
    pub(crate) fn new(observe: &'a mut dyn FnMut(Progress)) -> Self {
        Reporter {
            observe,
            now: Progress::default(),
            next_bytes: 0,
            next_events: 0,
            stored_events: 0,
        }
    }

    fn send(&mut self) {
        (self.observe)(self.now);
    }

    /// Reading a session file of `total` bytes (of text) begins.
    pub(crate) fn start_text(&mut self, total: u64) {
        self.now.total_bytes = total;
        self.now.total_sessions = 1;
        self.next_bytes = REPORT_BYTES;
        self.send();
    }

    /// `bytes` of the text and `events` are read: reported once another
    /// [`REPORT_BYTES`] are.
    #[inline]
    pub(crate) fn text(&mut self, bytes: u64, events: u64) {
        if bytes >= self.next_bytes {
            self.now.bytes = bytes;
            self.now.events = events;
            self.next_bytes = (bytes / REPORT_BYTES + 1) * REPORT_BYTES;
            self.send();
        }
    }

    /// A database of `sessions` sessions is being read.
    #[cfg(feature = "sqlite")] // only databases count sessions and events as read
    pub(crate) fn start_sessions(&mut self, sessions: u64) {
        self.now.total_sessions = sessions;
        self.next_events = REPORT_EVENTS;
        self.send();
    }

    /// One more event of a database read: reported every [`REPORT_EVENTS`].
    #[cfg(feature = "sqlite")] // only databases count sessions and events as read
    #[inline]
    pub(crate) fn event(&mut self) {
        self.now.events += 1;
        if self.now.events >= self.next_events {
            self.next_events = self.now.events + REPORT_EVENTS;
            self.send();
        }
    }

    /// One more session of a database read (its events counted).
    #[cfg(feature = "sqlite")] // only databases count sessions and events as read
    pub(crate) fn session_read(&mut self) {
        self.now.sessions += 1;
        self.send();
    }

    /// Everything is read: `events` in all (a session file's text whole).
    /// Storing begins.
    pub(crate) fn storing(&mut self, events: u64) {
        self.now.bytes = self.now.total_bytes;
        self.now.events = events;
        self.now.sessions = self.now.total_sessions;
        self.send();
        self.now.stage = Stage::Storing;
        self.now.events = 0;
        self.now.sessions = 0;
        self.stored_events = 0;
        self.next_events = REPORT_EVENTS;
        self.send();
    }

    /// `written` events of the session being stored are written (the
    /// store's report after a batch): reported once another
    /// [`REPORT_EVENTS`] are.
    pub(crate) fn storing_events(&mut self, written: u64) {
        let events = self.stored_events + written;
        if events >= self.next_events {
            self.now.events = events;
            self.next_events = events + REPORT_EVENTS;
            self.send();
        }
    }

    /// One more session stored, with its `events`.
    pub(crate) fn stored(&mut self, events: u64) {
        self.stored_events += events;
        self.now.sessions += 1;
        self.now.events = self.stored_events;
        self.send();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_at_a_bounded_rate() {
        let mut seen = Vec::new();
        let mut observe = |p: Progress| seen.push(p);
        let mut r = Reporter::new(&mut observe);
        r.start_text(10 * REPORT_BYTES);
        for b in (0..=10 * REPORT_BYTES).step_by(128) {
            r.text(b, b / 128);
        }
        r.storing(10 * REPORT_EVENTS);
        for written in (0..10 * REPORT_EVENTS).step_by(100) {
            r.storing_events(written);
        }
        r.stored(10 * REPORT_EVENTS);
        // The start, ten steps, the end of reading, storing from 0, nine
        // steps within the session, stored.
        assert_eq!(seen.len(), 1 + 10 + 1 + 1 + 9 + 1, "{seen:?}");
        let reading: Vec<u64> = seen
            .iter()
            .filter(|p| p.stage == Stage::Reading)
            .map(|p| p.bytes)
            .collect();
        assert!(reading.windows(2).all(|w| w[0] <= w[1]), "{reading:?}");
        assert_eq!(reading.last(), Some(&(10 * REPORT_BYTES)));
        let storing: Vec<u64> = seen
            .iter()
            .filter(|p| p.stage == Stage::Storing)
            .map(|p| p.events)
            .collect();
        assert!(storing.windows(2).all(|w| w[0] < w[1]), "{storing:?}");
        let last = seen.last().unwrap();
        assert_eq!(
            (last.stage, last.sessions, last.events),
            (Stage::Storing, 1, 10 * REPORT_EVENTS)
        );
    }
}
