//! The decoder: batch bytes to events, zero-copy where the data is stored
//! verbatim, never panicking and never allocating from an untrusted length
//! alone.

use super::varint::unzigzag;
use super::{
    CodecError, F_APPEND, F_IGNORABLE, F_NEW_TYPE, F_PACKED, F_REPLACE, F_RESERVED, F_SOURCES,
    corrupt, pack_limit,
};
use crate::event::{Data, Event, SurfaceOp};
use crate::model::payload::{boxed_raw_value, raw_value};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::RefCell;

/// Fewest bytes one event can take (flags, type id, time, data length).
const MIN_EVENT_LEN: usize = 4;

/// Decodes a whole batch into a `Vec` (see [`BatchDecoder`] for the
/// streaming form). `first_seq` and `count` come from the batch header,
/// `prev_time` is the value the encoder was given.
///
/// `data` is checked to be UTF-8 but not re-validated as JSON: the segment
/// CRC vouches for it (see [`BatchDecoder::validate_json`]).
pub fn decode_batch(
    bytes: &[u8],
    first_seq: u64,
    count: u32,
    prev_time: i64,
) -> Result<Vec<Event<'_>>, CodecError> {
    let mut cursor = Cursor::new(bytes, first_seq, prev_time);
    cursor.read_pack(None)?;
    cursor.decode_all(count)
}

/// [`decode_batch`] with the pack decompressed into `pack` (overwritten),
/// so that packed data is borrowed from it as verbatim data is from
/// `bytes`: given the same buffer batch after batch, decoding allocates
/// nothing per event.
pub fn decode_batch_in<'a>(
    bytes: &'a [u8],
    first_seq: u64,
    count: u32,
    prev_time: i64,
    pack: &'a mut Vec<u8>,
) -> Result<Vec<Event<'a>>, CodecError> {
    let mut cursor = Cursor::new(bytes, first_seq, prev_time);
    cursor.read_pack(Some(pack))?;
    cursor.decode_all(count)
}

/// Decodes a batch one event at a time, without collecting them.
///
/// Yields `count` events, then, if bytes are left over, one
/// [`CodecError::Corrupt`]; after any error it yields nothing more. A caller
/// that stops after `count` events should call [`BatchDecoder::finish`] to
/// detect leftover bytes.
#[derive(Debug)]
#[cfg(any(test, feature = "internals"))]
pub struct BatchDecoder<'a> {
    cursor: Cursor<'a>,
    count: u32,
    index: u32,
    validate_json: bool,
    done: bool,
    /// A bad pack header, reported by the first call to `next`.
    pack_error: Option<CodecError>,
}

#[cfg(any(test, feature = "internals"))]
impl<'a> BatchDecoder<'a> {
    /// A decoder of the batch `bytes` (arguments as for [`decode_batch`]).
    ///
    /// The pack (if the batch has one) is decompressed here, once; an error
    /// in it is the first item.
    pub fn new(bytes: &'a [u8], first_seq: u64, count: u32, prev_time: i64) -> Self {
        let mut cursor = Cursor::new(bytes, first_seq, prev_time);
        let pack_error = cursor.read_pack(None).err();
        BatchDecoder {
            cursor,
            count,
            index: 0,
            validate_json: false,
            done: false,
            pack_error,
        }
    }

    /// Also parse every `data` as JSON and report text that is not JSON as
    /// corruption (off by default: it roughly halves decoding throughput and
    /// the segment CRC already covers the bytes). For verification tools.
    pub fn validate_json(mut self, on: bool) -> Self {
        self.validate_json = on;
        self
    }

    /// Checks that the batch ends after the last event; call after consuming
    /// all `count` events.
    pub fn finish(&self) -> Result<(), CodecError> {
        if let Some(e) = &self.pack_error {
            return Err(e.clone());
        }
        if self.index < self.count {
            return Err(corrupt(self.cursor.pos, "finish before the last event"));
        }
        self.cursor.finish()
    }

    fn decode_next(&mut self) -> Result<Event<'a>, CodecError> {
        let index = self.index as usize;
        let ev = self.cursor.next_event(index)?;
        if self.validate_json
            && serde_json::from_str::<serde::de::IgnoredAny>(ev.data.get()).is_err()
        {
            return Err(corrupt(self.cursor.event_start, "data is not valid JSON"));
        }
        self.index += 1;
        Ok(ev)
    }
}

#[cfg(any(test, feature = "internals"))]
impl<'a> Iterator for BatchDecoder<'a> {
    type Item = Result<Event<'a>, CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        // Cloned, not taken: `finish` reports the same error afterwards.
        if let Some(e) = self.pack_error.clone() {
            self.done = true;
            return Some(Err(e));
        }
        if self.index == self.count {
            self.done = true;
            return self.cursor.finish().err().map(Err);
        }
        let item = self.decode_next();
        if item.is_err() {
            self.done = true;
        }
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else {
            (0, Some((self.count - self.index) as usize + 1))
        }
    }
}

#[cfg(any(test, feature = "internals"))]
impl std::iter::FusedIterator for BatchDecoder<'_> {}

/// The decoding state shared by [`decode_batch`] and [`BatchDecoder`].
#[derive(Debug)]
pub(super) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    first_seq: u64,
    time: i64,
    types: Vec<&'a str>,
    /// Where the event being decoded starts.
    event_start: usize,
    /// The decoded pack (empty before it is read, or when there is none) and
    /// how much of it the events so far have taken. In the cursor's own
    /// buffer, packed data is copied out per event; in a caller's, it is
    /// borrowed.
    pack: Cow<'a, [u8]>,
    pack_used: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(bytes: &'a [u8], first_seq: u64, prev_time: i64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            first_seq,
            time: prev_time,
            types: Vec::new(),
            event_start: 0,
            pack: Cow::Borrowed(&[]),
            pack_used: 0,
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn finish(&self) -> Result<(), CodecError> {
        if self.pack_used != self.pack.len() {
            return Err(corrupt(
                self.pos,
                "pack data left over after the last event",
            ));
        }
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(corrupt(self.pos, "trailing bytes after the last event"))
        }
    }

    /// Decodes the batch's `count` events (after [`Cursor::read_pack`]) and
    /// checks that nothing is left over.
    fn decode_all(mut self, count: u32) -> Result<Vec<Event<'a>>, CodecError> {
        // Each event takes at least MIN_EVENT_LEN bytes: never trust `count` alone.
        let mut out: Vec<Event<'a>> =
            Vec::with_capacity((count as usize).min(self.bytes.len() / MIN_EVENT_LEN));
        for index in 0..count {
            out.push(self.next_event(index as usize)?);
        }
        self.finish()?;
        Ok(out)
    }

    /// Reads and decompresses the pack header; called once, first. The pack
    /// goes into `into` (overwritten) if given, else into a buffer of the
    /// cursor's own.
    fn read_pack(&mut self, into: Option<&'a mut Vec<u8>>) -> Result<(), CodecError> {
        let at = self.pos;
        let p = self.varint()?;
        if p == 0 {
            return Ok(());
        }
        let z = self.len("pack frame length exceeds the batch")?;
        let p = usize::try_from(p)
            .ok()
            .filter(|&p| p <= pack_limit(z))
            .ok_or_else(|| corrupt(at, "pack length out of range"))?;
        let frame_at = self.pos;
        let frame = self.take(z)?;
        // Decoding into a buffer of exactly P bytes: zstd needs no window
        // buffer of its own then, and output beyond P is an error, never an
        // allocation. (A reused buffer is cut to P, its old bytes zeroed:
        // `[u8]` is the output type zstd writes without a length of its own.)
        let unpack = |pack: &mut Vec<u8>| {
            pack.clear();
            pack.resize(p, 0);
            let n = Unpacker::with(|zstd| zstd.decompress_to_buffer(frame, &mut pack[..]))
                .map_err(|_| corrupt(frame_at, "pack is not valid Zstandard data"))?;
            if n != p {
                return Err(corrupt(
                    frame_at,
                    "pack decodes to another length than stated",
                ));
            }
            Ok(())
        };
        self.pack = match into {
            Some(buf) => {
                unpack(buf)?;
                Cow::Borrowed(buf)
            }
            None => {
                let mut own = Vec::new();
                unpack(&mut own)?;
                Cow::Owned(own)
            }
        };
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or_else(|| corrupt(self.pos, "truncated event"))?;
        self.pos += 1;
        Ok(b)
    }

    pub(super) fn varint(&mut self) -> Result<u64, CodecError> {
        let start = self.pos;
        let (value, used) = crate::format::varint::read(&self.bytes[self.pos..])
            .map_err(|e| corrupt(start, e.reason()))?;
        self.pos += used;
        Ok(value)
    }

    /// A varint that counts bytes (or items of at least one byte) still to
    /// come in the batch.
    fn len(&mut self, what: &'static str) -> Result<usize, CodecError> {
        let start = self.pos;
        let v = self.varint()?;
        match usize::try_from(v) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(corrupt(start, what)),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        // Callers check `n` against `remaining()`; keep this total anyway.
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| corrupt(self.pos, "truncated event"))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn str(&mut self, n: usize, what: &'static str) -> Result<&'a str, CodecError> {
        let start = self.pos;
        std::str::from_utf8(self.take(n)?).map_err(|_| corrupt(start, what))
    }

    /// Decodes event `index` (after [`Cursor::read_pack`]).
    fn next_event(&mut self, index: usize) -> Result<Event<'a>, CodecError> {
        let start = self.pos;
        self.event_start = start;
        let seq = self
            .first_seq
            .checked_add(index as u64)
            .ok_or_else(|| corrupt(start, "seq overflows u64"))?;
        let flags = self.u8()?;
        if flags & F_RESERVED != 0 {
            return Err(corrupt(start, "unknown flag bits"));
        }
        if flags & F_APPEND != 0 && flags & F_REPLACE != 0 {
            return Err(corrupt(start, "both append and replace flags"));
        }

        let kind = if flags & F_NEW_TYPE != 0 {
            let n = self.len("type length exceeds the batch")?;
            let kind = self.str(n, "type is not UTF-8")?;
            self.types.push(kind);
            kind
        } else {
            let at = self.pos;
            let id = self.varint()?;
            *usize::try_from(id)
                .ok()
                .and_then(|id| self.types.get(id))
                .ok_or_else(|| corrupt(at, "unknown type id"))?
        };

        self.time = self.time.wrapping_add(unzigzag(self.varint()?));

        let surface_op = if flags & F_APPEND != 0 {
            Some(SurfaceOp::Append)
        } else if flags & F_REPLACE != 0 {
            let start = self.varint()?;
            let end = self.varint()?;
            Some(SurfaceOp::Replace { start, end })
        } else {
            None
        };

        let source_event_seqs = if flags & F_SOURCES != 0 {
            // Each entry takes at least one byte, so `n` is capped by the input.
            let n = self.len("source count exceeds the batch")?;
            let mut sources = Vec::with_capacity(n);
            let mut p = seq;
            for _ in 0..n {
                p = p.wrapping_sub(unzigzag(self.varint()?) as u64);
                sources.push(p);
            }
            Some(sources)
        } else {
            None
        };

        let data: Cow<'a, RawValue> = if flags & F_PACKED == 0 {
            let n = self.len("data length exceeds the batch")?;
            Cow::Borrowed(raw_value(self.str(n, "data is not UTF-8")?))
        } else {
            let at = self.pos;
            let n = self.varint()?;
            let left = self.pack.len() - self.pack_used;
            let n = usize::try_from(n)
                .ok()
                .filter(|&n| n <= left)
                .ok_or_else(|| corrupt(at, "packed data length exceeds the pack"))?;
            let range = self.pack_used..self.pack_used + n;
            self.pack_used += n;
            match &self.pack {
                Cow::Borrowed(pack) => Cow::Borrowed(raw_value(packed_text(pack, range, at)?)),
                Cow::Owned(pack) => Cow::Owned(boxed_raw_value(packed_text(pack, range, at)?.into())),
            }
        };

        Ok(Event {
            kind: Cow::Borrowed(kind),
            seq,
            time: self.time,
            // This crate's own checksummed records: checked when written.
            data: Data::trusted(data),
            source_event_seqs,
            surface_op,
            ignorable: flags & F_IGNORABLE != 0,
        })
    }
}

/// The packed data at `range` of a decoded pack (in bounds: checked by the
/// caller), which must be UTF-8.
fn packed_text(pack: &[u8], range: std::ops::Range<usize>, at: usize) -> Result<&str, CodecError> {
    std::str::from_utf8(&pack[range]).map_err(|_| corrupt(at, "packed data is not UTF-8"))
}

/// The decoder's Zstandard context, kept per thread.
struct Unpacker;

thread_local! {
    static UNPACKER: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

impl Unpacker {
    /// Runs `f` on this thread's decompressor (made on first use), or on a
    /// new one if that is not available.
    fn with<T>(
        f: impl FnOnce(&mut zstd::bulk::Decompressor<'static>) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let mut f = Some(f);
        let mut result = None;
        let _ = UNPACKER.try_with(|cell| {
            if let Ok(mut slot) = cell.try_borrow_mut() {
                if slot.is_none() {
                    *slot = zstd::bulk::Decompressor::new().ok();
                }
                if let Some(zstd) = slot.as_mut() {
                    result = Some((f.take().expect("called once"))(zstd));
                }
            }
        });
        match (result, f) {
            (Some(result), _) => result,
            (None, Some(f)) => f(&mut zstd::bulk::Decompressor::new()?),
            (None, None) => unreachable!("f ran but gave no result"),
        }
    }
}
