//! Progress on stderr: a bar on a terminal (not with `--quiet`), and for
//! `import --progress` plain lines where no bar is drawn.

use crate::failure::{Failure, io_err};
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sessionlog::adapters::{Progress as Report, Stage};
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

/// A bar on stderr drawn with `template`, hidden off a terminal and with
/// `quiet`.
fn bar(len: u64, quiet: bool, template: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(len),
        if quiet || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        },
    );
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Prints a line above `bar` (or plainly, when it is hidden).
fn println_above(bar: &ProgressBar, out: &mut impl Write, line: &str) -> Result<(), Failure> {
    if bar.is_hidden() {
        writeln!(out, "{line}").map_err(io_err)
    } else {
        bar.suspend(|| writeln!(out, "{line}").and_then(|()| out.flush()))
            .map_err(io_err)
    }
}

/// A progress bar on stderr over sessions, shown only on a terminal and
/// without `--quiet`.
pub struct Progress {
    bar: ProgressBar,
    events: u64,
}

impl Progress {
    /// A bar over `len` sessions.
    pub fn new(what: &str, len: u64, quiet: bool) -> Progress {
        let bar = bar(
            len,
            quiet,
            "{prefix} [{bar:30}] {pos}/{len} sessions, {msg} ({elapsed})",
        );
        bar.set_prefix(what.to_owned());
        Progress { bar, events: 0 }
    }

    /// One session done, with its events.
    pub fn done(&mut self, events: u64) {
        self.events += events;
        let secs = self.bar.elapsed().as_secs_f64().max(1e-9);
        self.bar.set_message(format!(
            "{} events, {:.0} events/s",
            self.events,
            self.events as f64 / secs
        ));
        self.bar.inc(1);
    }

    /// Prints a line above the bar (or plainly, when hidden).
    pub fn println(&self, out: &mut impl Write, line: &str) -> Result<(), Failure> {
        println_above(&self.bar, out, line)
    }

    /// Removes the bar.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}

/// `import`'s progress: within the current source (a session file or a
/// database) the bytes or sessions read, with a rate, then the events (and
/// sessions) stored; and which source of how many it is. The bar moves with
/// the library's reports, which come at most once per 64 KiB of a file's
/// text, 1,000 events or session of a database, and, while storing, once
/// per session or per store batch past another 1,000 events.
pub struct ImportProgress {
    bar: ProgressBar,
    /// Plain lines on stderr (`--progress` where no bar is drawn).
    lines: bool,
    sources: u64,
    current: u64,
    name: String,
    started: Instant,
    /// Events read from the current source.
    read: u64,
    /// The stage of the last report.
    stage: Stage,
    /// The tenth of the current stage of the current source last printed as
    /// a plain line.
    printed: u64,
}

impl ImportProgress {
    /// Progress over `sources` sources; with `lines`, plain lines on stderr
    /// when no bar is drawn (not with `quiet`).
    pub fn new(sources: u64, quiet: bool, lines: bool) -> ImportProgress {
        // Length 1, not 0: indicatif draws an empty length as a full bar.
        let bar = bar(1, quiet, "{prefix} [{bar:30}] {msg} ({elapsed})");
        let lines = lines && !quiet && bar.is_hidden();
        ImportProgress {
            bar,
            lines,
            sources,
            current: 0,
            name: String::new(),
            started: Instant::now(),
            read: 0,
            stage: Stage::Reading,
            printed: 0,
        }
    }

    /// The next source begins.
    pub fn start(&mut self, path: &Path) {
        self.current += 1;
        self.name = path.display().to_string();
        self.started = Instant::now();
        self.read = 0;
        self.stage = Stage::Reading;
        self.printed = 0;
        self.bar
            .set_prefix(format!("import {}/{}", self.current, self.sources));
        self.bar.set_length(1);
        self.bar.set_position(0);
        self.bar.set_message(self.name.clone());
    }

    /// A report of the library's import of the current source.
    pub fn observe(&mut self, p: Report) {
        if self.bar.is_hidden() && !self.lines {
            return;
        }
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let file = p.total_bytes > 0;
        let (pos, len, what) = match p.stage {
            Stage::Reading if file => {
                self.read = p.events;
                (
                    p.bytes,
                    p.total_bytes,
                    format!(
                        "{}/{} read, {} events, {}/s",
                        HumanBytes(p.bytes),
                        HumanBytes(p.total_bytes),
                        p.events,
                        HumanBytes((p.bytes as f64 / secs) as u64)
                    ),
                )
            }
            Stage::Reading => {
                self.read = p.events;
                (
                    p.sessions,
                    p.total_sessions,
                    format!(
                        "{}/{} sessions read, {} events, {:.0} events/s",
                        p.sessions,
                        p.total_sessions,
                        p.events,
                        p.events as f64 / secs
                    ),
                )
            }
            // Storing moves by events, within a session too.
            _ if file => (
                p.events,
                self.read,
                format!(
                    "{}/{} events stored, {:.0} events/s",
                    p.events,
                    self.read,
                    p.events as f64 / secs
                ),
            ),
            // (By sessions when there are no events to count.)
            _ => (
                if self.read > 0 { p.events } else { p.sessions },
                if self.read > 0 {
                    self.read
                } else {
                    p.total_sessions
                },
                format!(
                    "{}/{} sessions stored, {}/{} events, {:.0} events/s",
                    p.sessions,
                    p.total_sessions,
                    p.events,
                    self.read,
                    p.events as f64 / secs
                ),
            ),
        };
        if p.stage != self.stage {
            // Storing begins: its rate and tenths from here.
            self.stage = p.stage;
            self.started = Instant::now();
            self.printed = 0;
        }
        let line = format!("{}: {what}", self.name);
        if self.lines && len > 0 {
            // A line each time another tenth is read, then stored.
            let tenth = pos.saturating_mul(10) / len;
            if tenth > self.printed {
                self.printed = tenth;
                eprintln!("import {}/{}: {line}", self.current, self.sources);
            }
        }
        self.bar.set_length(len.max(1));
        self.bar.set_position(pos);
        self.bar.set_message(line);
    }

    /// Prints a line above the bar (or plainly, when hidden).
    pub fn println(&self, out: &mut impl Write, line: &str) -> Result<(), Failure> {
        println_above(&self.bar, out, line)
    }

    /// Removes the bar.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
