//! Limits on the work hostile input can cause, and the bounded Zstandard
//! decoder the adapters share.
//!
//! A compressed log, a zstd-compressed SQLite value or a packed row can
//! claim (or expand to) far more than its own size. Every adapter decodes
//! through [`decode_zstd`], which streams into an output buffer that grows
//! only with bytes actually produced, refuses as soon as the output passes
//! its limit, and never sizes anything from a frame header's declared
//! content size. The window a frame may ask for is capped too
//! ([`ZSTD_WINDOW_LOG_MAX`]), so the decoder's own buffer is bounded. The
//! README's "Limits on hostile input" lists these numbers.

use serde_json::value::RawValue;
use std::io;

/// The largest Zstandard window a frame may use: 2^24 bytes (16 MiB). The
/// harness writes level 3 (a window of at most 2 MiB); a frame asking for
/// more is refused rather than allocated.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 24;

/// A compressed session log may always decode to this much (64 MiB) ...
pub const ZSTD_MIN_DECODED_ALLOWANCE: u64 = 64 << 20;
/// ... and beyond that to at most this many times its own size. Session
/// JSONL compresses about 5-30 fold; 1024 fold only comes from a bomb.
pub const ZSTD_MAX_RATIO: u64 = 1024;

/// The most a zstd-compressed scalar SQLite `data` value may decode to
/// (64 MiB, the store's default record limit: a larger event could not be
/// stored anyway).
pub const MAX_SCALAR_DATA_BYTES: u64 = 64 << 20;

/// The most bytes the values a packed row copies into every member
/// (`turn`, `step`, `index`, `id` and `name`, as written) may take
/// together. This bounds how much larger the expanded events are than the
/// row: at most about (110 + this) bytes per member, for at least 3 bytes
/// of row per member. Real rows copy well under 100 bytes.
pub const MAX_PACKED_REPLICATED_BYTES: usize = 256;

/// The bytes a packed row copies into every member: its `turn`, `step`,
/// `index`, and a tool call's `id` and `name` (compared with
/// [`MAX_PACKED_REPLICATED_BYTES`] by the reader and the writer alike).
pub(crate) fn packed_replicated_bytes(
    turn: &RawValue,
    step: &RawValue,
    index: &RawValue,
    id: Option<&RawValue>,
    name: Option<&RawValue>,
) -> usize {
    [Some(turn), Some(step), Some(index), id, name]
        .into_iter()
        .flatten()
        .map(|v| v.get().len())
        .sum()
}

/// The longest JSON number literal accepted for a packed row's `turn`,
/// `step` or `index` (every number JavaScript prints fits in 24 bytes).
pub const MAX_PACKED_NUMBER_BYTES: usize = 32;

/// The decoded-size limit for a compressed session log of `compressed`
/// bytes: `max(64 MiB, 1024 × compressed)`.
pub fn zstd_session_limit(compressed: usize) -> u64 {
    (compressed as u64)
        .saturating_mul(ZSTD_MAX_RATIO)
        .max(ZSTD_MIN_DECODED_ALLOWANCE)
}

/// Why a bounded decode stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not valid Zstandard (bad magic, corrupt block, checksum
    /// mismatch, a window above [`ZSTD_WINDOW_LOG_MAX`]).
    #[error("{0}")]
    Corrupt(String),
    /// The output passed the limit; decoding stopped there.
    #[error("decodes to more than {limit} bytes (limit for hostile input)")]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
}

/// How a decode of `input` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes of `input` consumed.
    pub consumed: usize,
    /// Whether the last frame was complete (`false`: the input ended inside
    /// a frame, and `out` holds what that frame gave so far).
    pub complete: bool,
}

/// A streaming decoder with the window cap applied.
pub fn decoder() -> io::Result<zstd::stream::raw::Decoder<'static>> {
    let mut dec = zstd::stream::raw::Decoder::new()?;
    dec.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(
        ZSTD_WINDOW_LOG_MAX,
    ))?;
    Ok(dec)
}

/// Decodes ONE Zstandard frame from the start of `input`, appending its
/// plaintext to `out`, which may hold at most `limit` bytes in total. Stops
/// at the end of that frame (the rest of `input` is left for the caller),
/// or at the end of `input` when the frame is cut short.
pub fn decode_frame(
    dec: &mut zstd::stream::raw::Decoder<'static>,
    input: &[u8],
    out: &mut Vec<u8>,
    limit: u64,
) -> Result<Decoded, DecodeError> {
    use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
    // A fixed scratch buffer: the output grows by what the decoder really
    // produced, never by what a frame header claims.
    let mut buf = vec![0u8; 1 << 16];
    let mut pos = 0;
    loop {
        let mut inb = InBuffer::around(&input[pos..]);
        let mut outb = OutBuffer::around(&mut buf[..]);
        let hint = dec
            .run(&mut inb, &mut outb)
            .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
        let (read, written) = (inb.pos(), outb.pos());
        if out.len() as u64 + written as u64 > limit {
            return Err(DecodeError::TooLarge { limit });
        }
        out.extend_from_slice(&buf[..written]);
        pos += read;
        if hint == 0 {
            return Ok(Decoded {
                consumed: pos,
                complete: true,
            });
        }
        if pos == input.len() && written < buf.len() {
            return Ok(Decoded {
                consumed: pos,
                complete: false,
            });
        }
        if read == 0 && written == 0 {
            return Err(DecodeError::Corrupt("the decoder made no progress".into()));
        }
    }
}

/// Decodes a whole value made of complete Zstandard frames (a SQLite
/// `data` blob) into at most `limit` bytes. A value cut inside a frame, or
/// with bytes after its frames that are not a frame, is corrupt.
pub fn decode_zstd(input: &[u8], limit: u64) -> Result<Vec<u8>, DecodeError> {
    let mut dec = decoder().map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    let mut out = Vec::new();
    let mut pos = 0;
    if input.is_empty() {
        return Err(DecodeError::Corrupt("empty value".into()));
    }
    while pos < input.len() {
        let d = decode_frame(&mut dec, &input[pos..], &mut out, limit)?;
        if !d.complete {
            return Err(DecodeError::Corrupt("the value ends inside a frame".into()));
        }
        pos += d.consumed;
    }
    Ok(out)
}

/// Where a concatenation of Zstandard frames ends inside its last frame,
/// found from the frame and block headers alone, as the harness's
/// `scanZstdFrames` does (no decoding): `Ok(None)` when every frame is
/// structurally complete, `Ok(Some(offset))` for the start of an incomplete
/// final frame (or of a tail of zero bytes where a frame should start, a
/// crash after the file grew but before its data landed), `Err` for a bad
/// magic number or a reserved bit or block type: `(frame index, frame
/// offset, reason)`.
pub fn torn_frame_start(bytes: &[u8]) -> Result<Option<usize>, (usize, usize, String)> {
    const MAGIC: u32 = 0xFD2F_B528;
    let mut pos = 0;
    let mut frame = 0;
    while pos < bytes.len() {
        let start = pos;
        let bad = |why: String| Err((frame, start, why));
        let rest = &bytes[pos..];
        if rest.iter().all(|&b| b == 0) || rest.len() < 4 {
            return Ok(Some(start));
        }
        if u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) != MAGIC {
            return bad("invalid frame magic".into());
        }
        pos += 4;
        let Some(&desc) = bytes.get(pos) else {
            return Ok(Some(start));
        };
        pos += 1;
        if desc & 0x18 != 0 {
            return bad("reserved frame-header bit".into());
        }
        let fcs_flag = desc >> 6;
        let single = desc & 0x20 != 0;
        let checksum = desc & 0x04 != 0;
        let dict = match desc & 0x03 {
            3 => 4,
            d => usize::from(d),
        };
        let fcs = match fcs_flag {
            0 => usize::from(single),
            f => 1 << f,
        };
        pos += usize::from(!single) + dict + fcs;
        loop {
            if pos + 3 > bytes.len() {
                return Ok(Some(start));
            }
            let h = u32::from_le_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], 0]);
            pos += 3;
            let (last, kind, size) = (h & 1 != 0, (h >> 1) & 3, (h >> 3) as usize);
            if kind == 3 {
                return bad(format!("reserved block type at byte {}", pos - 3));
            }
            pos += if kind == 1 { 1 } else { size };
            if pos > bytes.len() {
                return Ok(Some(start));
            }
            if last {
                break;
            }
        }
        if checksum {
            pos += 4;
            if pos > bytes.len() {
                return Ok(Some(start));
            }
        }
        frame += 1;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame of `blocks` RLE blocks of 128 KiB of `b'x'` each, with no
    /// declared content size: a few bytes that decode to a lot.
    pub(crate) fn rle_bomb(blocks: usize) -> Vec<u8> {
        // Magic, frame header descriptor 0 (no content size, not single
        // segment), window descriptor for 2^17 (exponent 7, mantissa 0).
        let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 7 << 3];
        for i in 0..blocks {
            let last = u32::from(i + 1 == blocks);
            let header = last | (1 << 1) | ((128 << 10) << 3);
            f.extend_from_slice(&header.to_le_bytes()[..3]);
            f.push(b'x');
        }
        f
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        let bomb = rle_bomb(64); // 8 MiB from 262 bytes
        let err = decode_zstd(&bomb, 1 << 20).unwrap_err();
        assert_eq!(err, DecodeError::TooLarge { limit: 1 << 20 });
        assert_eq!(decode_zstd(&bomb, 8 << 20).unwrap().len(), 8 << 20);
    }

    #[test]
    fn a_cut_value_is_corrupt() {
        let z = zstd::bulk::compress(b"hello world", 3).unwrap();
        assert_eq!(decode_zstd(&z, 100).unwrap(), b"hello world");
        assert!(matches!(
            decode_zstd(&z[..z.len() - 2], 100),
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[test]
    fn session_limit_grows_with_input() {
        assert_eq!(zstd_session_limit(10), 64 << 20);
        assert_eq!(zstd_session_limit(1 << 20), 1 << 30);
    }
}
