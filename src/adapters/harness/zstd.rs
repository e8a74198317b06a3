//! Zstandard session logs: a header frame, then one frame per append
//! batch; reading them into JSONL text (a torn final frame is a torn tail,
//! damage inside a complete frame is corruption) and writing them.

use super::packed::{Row, pack_chunks, write_rows};
use crate::adapters::bounded;
use crate::event::Event;
use crate::header::SessionHeader;
use std::io::{self, Write};

/// The zstd compression level of written frames (zstd's default).
const ZSTD_LEVEL: i32 = 3;
/// The magic number that starts every Zstandard frame, little-endian.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// A Zstandard session log decoded into its JSONL text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZstdText {
    /// The decoded JSONL text: every complete frame, then what the torn
    /// final frame gave, if any (its unterminated last line is a torn tail
    /// for [`jsonl::read_session`]).
    ///
    /// [`jsonl::read_session`]: crate::adapters::jsonl::read_session
    pub text: Vec<u8>,
    /// Complete frames decoded (the header frame included).
    pub frames: usize,
    /// Bytes of `text` that came from complete frames: a bad line or seq
    /// gap inside them is damage, never a torn tail.
    pub complete_bytes: usize,
    /// The torn final frame, if the file ends inside one.
    pub torn: Option<TornFrame>,
}

/// A final frame cut short by a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornFrame {
    /// Its position among the frames (0 is the header frame).
    pub frame: usize,
    /// The byte offset where it starts in the file.
    pub offset: u64,
    /// Bytes of it in the file.
    pub bytes: u64,
    /// Bytes of JSONL text it still gave.
    pub decoded: u64,
    /// What was wrong.
    pub reason: String,
}

/// A sentence for a note: `frame 2 at byte 187 (101 bytes) is cut short:
/// REASON; what it still decodes to (142 bytes of text) is kept up to its
/// last complete line`.
impl std::fmt::Display for TornFrame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = |n: u64| {
            if n == 1 {
                "1 byte".to_owned()
            } else {
                format!("{n} bytes")
            }
        };
        write!(
            f,
            "frame {} at byte {} ({}) is cut short: {}; ",
            self.frame,
            self.offset,
            bytes(self.bytes),
            self.reason
        )?;
        if self.decoded == 0 {
            write!(f, "nothing of it is kept")
        } else {
            write!(
                f,
                "what it still decodes to ({} of text) is kept up to its last complete line",
                bytes(self.decoded)
            )
        }
    }
}

/// Damage in a Zstandard session log that a crash cannot explain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZstdError {
    /// A frame does not decode (bad magic, corrupt block, checksum
    /// mismatch).
    #[error("corrupt Zstandard session log: frame {frame} at byte {offset}: {reason}")]
    Corrupt {
        /// The frame's position (0 is the header frame).
        frame: usize,
        /// Its byte offset.
        offset: u64,
        /// The decoder's complaint.
        reason: String,
    },
    /// The first frame is not exactly one line.
    #[error("corrupt Zstandard session log: first frame is not exactly one header line ({reason})")]
    HeaderFrame {
        /// What it holds instead.
        reason: String,
    },
    /// The log decodes to more than the limit for hostile input.
    #[error(
        "Zstandard session log decodes to more than {limit} bytes; refused (limit for hostile input)"
    )]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
    /// A complete frame ends inside a line.
    #[error(
        "corrupt Zstandard session log: complete frame {frame} at byte {offset} contains an unterminated JSONL record"
    )]
    Unterminated {
        /// The frame's position.
        frame: usize,
        /// Its byte offset.
        offset: u64,
    },
}

/// Whether `bytes` start like a Zstandard frame.
pub fn is_zstd(bytes: &[u8]) -> bool {
    bytes.starts_with(&ZSTD_MAGIC)
}

/// Decodes a Zstandard session log (a sequence of frames: the header line,
/// then one frame per append batch) into its JSONL text, decoding at most
/// [`bounded::zstd_session_limit`] bytes (see
/// [`read_zstd_session_limited`]).
pub fn read_zstd_session(bytes: &[u8]) -> Result<ZstdText, ZstdError> {
    read_zstd_session_limited(bytes, bounded::zstd_session_limit(bytes.len()))
}

/// Decodes a Zstandard session log into its JSONL text, refusing it
/// ([`ZstdError::TooLarge`]) as soon as the text passes `limit` bytes. The
/// output grows with the bytes really decoded (a frame's declared size is
/// never trusted), and frames needing a window above
/// [`bounded::ZSTD_WINDOW_LOG_MAX`] are corrupt.
///
/// - Every complete frame is decoded and the texts are concatenated.
/// - The first frame must be exactly one line ending in a newline, and every
///   later complete frame must end in a newline (or be empty): a complete
///   frame is a finished write, so a line it leaves open is damage, as the
///   harness's own reader says.
/// - A file that ends inside a frame (a torn final write, even one that
///   lacks only its checksum) is a torn tail: what the partial frame still
///   decodes is kept, and [`jsonl::read_session`] then drops its
///   unterminated last line. A tail of zero bytes where a frame should start (a crash
///   after the file grew but before its data landed) is torn too.
/// - Anything that does not decode (bad magic, corrupt block, checksum
///   mismatch) is [`ZstdError::Corrupt`]: bytes that are wrong, not missing.
///
/// [`jsonl::read_session`]: crate::adapters::jsonl::read_session
pub fn read_zstd_session_limited(bytes: &[u8], limit: u64) -> Result<ZstdText, ZstdError> {
    let corrupt = |frame: usize, offset: usize, reason: String| ZstdError::Corrupt {
        frame,
        offset: offset as u64,
        reason,
    };
    let mut dec = bounded::decoder().map_err(|e| corrupt(0, 0, e.to_string()))?;
    // Which frame is torn is decided from the frame structure first, as the
    // harness decides it: damage inside a complete frame is corruption, while
    // a torn final frame keeps what it decodes to (nothing if it does not).
    let torn_start = bounded::torn_frame_start(bytes)
        .map_err(|(frame, offset, reason)| corrupt(frame, offset, reason))?;
    let complete_end = torn_start.unwrap_or(bytes.len());
    let mut text = Vec::new();
    let mut pos = 0;
    let mut frames = 0;
    let mut torn = None;
    while pos < bytes.len() {
        let start = pos;
        let text_start = text.len();
        if start >= complete_end {
            let mut reason = if bytes[start..].iter().all(|&b| b == 0) {
                "zero-filled tail where a frame should start".to_owned()
            } else {
                "the file ends inside the frame (torn write)".to_owned()
            };
            if !bytes[start..].iter().all(|&b| b == 0) {
                match bounded::decode_frame(&mut dec, &bytes[start..], &mut text, limit) {
                    Ok(_) => {}
                    Err(bounded::DecodeError::TooLarge { limit }) => {
                        return Err(ZstdError::TooLarge { limit });
                    }
                    Err(bounded::DecodeError::Corrupt(why)) => {
                        // The harness recovers nothing from a torn frame that
                        // does not decode; the complete frames stand.
                        text.truncate(text_start);
                        reason = format!("torn final frame does not decode: {why}");
                    }
                }
            }
            torn = Some(TornFrame {
                frame: frames,
                offset: start as u64,
                bytes: (bytes.len() - start) as u64,
                decoded: (text.len() - text_start) as u64,
                reason,
            });
            break;
        }
        let d = bounded::decode_frame(&mut dec, &bytes[pos..complete_end], &mut text, limit)
            .map_err(|e| match e {
                bounded::DecodeError::TooLarge { limit } => ZstdError::TooLarge { limit },
                bounded::DecodeError::Corrupt(reason) => corrupt(frames, start, reason),
            })?;
        pos += d.consumed;
        if !d.complete {
            return Err(corrupt(
                frames,
                start,
                "a structurally complete frame did not decode to its end".into(),
            ));
        }
        let frame_text = &text[text_start..];
        if frames == 0 {
            let newlines = frame_text.iter().filter(|&&b| b == b'\n').count();
            if newlines != 1 || frame_text.last() != Some(&b'\n') {
                return Err(ZstdError::HeaderFrame {
                    reason: format!(
                        "{} bytes, {newlines} newline(s){}",
                        frame_text.len(),
                        if frame_text.last() == Some(&b'\n') {
                            ""
                        } else {
                            ", unterminated"
                        }
                    ),
                });
            }
        } else if frame_text.last().is_some_and(|&b| b != b'\n') {
            return Err(ZstdError::Unterminated {
                frame: frames,
                offset: start as u64,
            });
        }
        frames += 1;
    }
    let complete_bytes = match &torn {
        Some(t) => text.len() - t.decoded as usize,
        None => text.len(),
    };
    Ok(ZstdText {
        text,
        frames,
        complete_bytes,
        torn,
    })
}

fn compressor() -> io::Result<zstd::bulk::Compressor<'static>> {
    let mut c = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    Ok(c)
}

/// Checks batch boundaries against `len` events: strictly increasing, each
/// in `1..len`.
fn check_boundaries(boundaries: &[usize], len: usize) -> io::Result<()> {
    let mut prev = 0;
    for &b in boundaries {
        if b <= prev || b >= len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "batch boundaries must be strictly increasing and inside 1..{len}, got {boundaries:?}"
                ),
            ));
        }
        prev = b;
    }
    Ok(())
}

/// What a write produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Lines written after the header (events and packed rows).
    pub rows: u64,
    /// Packed rows among them.
    pub packed_rows: u64,
    /// Zstandard frames written (0 for plain JSONL).
    pub frames: u64,
}

/// Writes a Zstandard session log as the harness's current backend does: a
/// frame holding the header line, then one frame per batch, chunk runs
/// packed inside each batch (a packed row never spans two batches).
///
/// `batch_boundaries` are the indices into `events` where a new batch
/// starts: strictly increasing, each in `1..events.len()`; none gives one
/// batch. Frames carry a content checksum. No events: the header frame only.
pub fn write_zstd_session<'e>(
    out: &mut impl Write,
    header: &SessionHeader,
    events: &'e [Event<'e>],
    batch_boundaries: &[usize],
) -> io::Result<()> {
    write_zstd_session_with(out, header, events, batch_boundaries, true).map(drop)
}

/// [`write_zstd_session`], choosing whether to pack chunk runs.
pub fn write_zstd_session_with<'e>(
    out: &mut impl Write,
    header: &SessionHeader,
    events: &'e [Event<'e>],
    batch_boundaries: &[usize],
    pack: bool,
) -> io::Result<WriteStats> {
    check_boundaries(batch_boundaries, events.len())?;
    let mut c = compressor()?;
    let mut stats = WriteStats::default();
    let mut plain = Vec::with_capacity(1 << 16);
    header.write_json(&mut plain);
    plain.push(b'\n');
    out.write_all(&c.compress(&plain)?)?;
    stats.frames += 1;
    let mut start = 0;
    let ends = batch_boundaries.iter().copied().chain([events.len()]);
    for end in ends {
        if start == end {
            break; // no events at all
        }
        let batch = &events[start..end];
        let rows: Vec<Row<'e>> = if pack {
            pack_chunks(batch)
        } else {
            batch.iter().map(Row::Event).collect()
        };
        plain.clear();
        write_rows(&mut plain, None, &rows);
        out.write_all(&c.compress(&plain)?)?;
        stats.frames += 1;
        stats.rows += rows.len() as u64;
        stats.packed_rows += rows.iter().filter(|r| matches!(r, Row::Packed(_))).count() as u64;
        start = end;
    }
    Ok(stats)
}

/// Batch boundaries after every `turn/end` (the harness flushes at turn
/// boundaries): the batches [`export_session`](super::export_session) writes as frames.
pub fn turn_batches(events: &[Event<'_>]) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(i, e)| e.kind == "turn/end" && i + 1 < events.len())
        .map(|(i, _)| i + 1)
        .collect()
}
