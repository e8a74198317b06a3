//! The batch codec: one append batch of events as compact bytes, the payload
//! of one segment record after its batch header.
//!
//! The segment layer frames the record (length, CRC, trailer) and writes the
//! batch header (`first_seq` u64, `count` u32) in front of these bytes, so the
//! codec stores neither: seqs are implicit (`first_seq + index`) and the
//! caller supplies `first_seq`, `count` and `prev_time` to the decoder.
//!
//! Every batch is self-contained: event types are defined inline at their
//! first use *within the batch* and data may only refer back to earlier
//! events of the same batch, so any record decodes on its own (random access
//! and recovery need no state from earlier records).
//!
//! Decoding is zero-copy where the bytes allow it: `kind` always borrows from
//! the input, and `data` borrows when it is stored verbatim
//! ([`Cow::Borrowed`]). Compressed `data` is rebuilt ([`Cow::Owned`]).
//!
//! # Format
//!
//! Notation: `varint` is unsigned LEB128 of a u64 (7 bits per byte, least
//! significant group first, high bit = "more bytes follow"; at most 10 bytes;
//! the decoder rejects encodings longer than needed and values above
//! `u64::MAX`). `zigzag(x)` maps an i64 to a u64 (`0,-1,1,-2,... ->
//! 0,1,2,3,...`, i.e. `(x << 1) ^ (x >> 63)`) and is then written as a varint.
//! Differences are taken with wrapping (two's complement) arithmetic, so every
//! i64/u64 value round-trips.
//!
//! A batch is the concatenation of its `count` events, in seq order, with
//! nothing before, between or after them. Event `i` (from 0) has seq
//! `first_seq + i`. Each event is:
//!
//! ```text
//! flags      u8      bit 0  has_sources   (a sources field follows)
//!                    bit 1  surfaceOp = "append"
//!                    bit 2  surfaceOp = replace (a replace field follows)
//!                    bit 3  ignorable = true
//!                    bit 4  type_is_new   (the type is defined inline)
//!                    bit 5  data_lz       (data is LZ-coded, see below)
//!                    bits 6-7 zero. Bits 1 and 2 are never both set.
//! type       if type_is_new: varint byte length, then that many bytes of
//!                    UTF-8: the type string, which gets the next id of the
//!                    batch's type table (ids count from 0 in each batch);
//!            else:   varint id of a type defined earlier in the batch.
//! time       zigzag(time - prev), where prev is the previous event's time in
//!                    the batch, or for event 0 the `prev_time` the caller
//!                    passes (the last time of the previous batch, or 0).
//! replace    only if bit 2: varint start, varint end.
//! sources    only if bit 0: varint n, then n entries; entry j is
//!                    zigzag(p - source_j) where p is the event's own seq for
//!                    j = 0 and source_{j-1} after that.
//! data       if not data_lz: varint byte length, then the exact JSON bytes
//!                    (UTF-8), stored verbatim.
//!            if data_lz:     varint ref, varint decoded byte length, then an
//!                    LZ stream (below) that rebuilds exactly that many bytes.
//!                    ref = 0: no dictionary; ref = d (1..=16, at most the
//!                    event's index): the dictionary is the data of the event
//!                    d positions earlier in this batch. The decoded length
//!                    is at most dictionary length + 255 x (bytes that follow
//!                    the length field in the batch).
//! ```
//!
//! The LZ stream works on the virtual buffer `dictionary ++ output`. It is a
//! sequence of literal runs and matches, always starting with a literal run
//! and stopping as soon as the output has the decoded length (after either a
//! literal run or a match):
//!
//! ```text
//! literal run   varint n (may be 0), then n bytes copied to the output.
//! match         varint offset (>= 1), varint (length - 4): copy `length`
//!               bytes, one at a time, from `offset` bytes back in the
//!               virtual buffer (the copy may overlap its own output and may
//!               start in the dictionary).
//! ```
//!
//! After the last event the batch must end; leftover bytes are corruption.
//! The decoded `kind` and `data` must be UTF-8.
//!
//! The encoder compresses an event's data when that saves at least
//! [`MIN_LZ_SAVING`] bytes over storing it verbatim, using as dictionary the
//! nearest earlier event of the same type within 16 events, and checks every
//! LZ stream by decoding it before writing it.

use crate::event::{Event, SurfaceOp};
use rustc_hash::FxHashMap;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// How far back (in events of the same batch) an LZ dictionary may be.
pub const MAX_REF_DISTANCE: usize = 16;

/// The decoded length of an LZ-coded data field is at most its dictionary's
/// length plus this many times the bytes that follow its length field.
pub const LZ_MAX_EXPANSION: usize = 255;

/// The encoder LZ-codes a data field only when that is at least this many
/// bytes smaller than storing it verbatim (verbatim data decodes zero-copy).
pub const MIN_LZ_SAVING: usize = 8;

/// Data shorter than this is not LZ-coded unless it has a dictionary.
const LZ_MIN_LEN: usize = 16;

/// Shortest LZ match.
const MIN_MATCH: usize = 4;

const F_SOURCES: u8 = 1 << 0;
const F_APPEND: u8 = 1 << 1;
const F_REPLACE: u8 = 1 << 2;
const F_IGNORABLE: u8 = 1 << 3;
const F_NEW_TYPE: u8 = 1 << 4;
const F_LZ: u8 = 1 << 5;
const F_RESERVED: u8 = !(F_SOURCES | F_APPEND | F_REPLACE | F_IGNORABLE | F_NEW_TYPE | F_LZ);

/// Fewest bytes one event can take (flags, type id, time, data length).
const MIN_EVENT_LEN: usize = 4;

/// Why a batch could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The bytes are not a valid batch (never a panic, whatever the input).
    #[error("corrupt event batch at byte {offset}: {reason}")]
    Corrupt {
        /// Offset in the batch bytes where the problem was found.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// The events to encode do not have contiguous seqs (seqs are implicit).
    #[error("event {index} of the batch has seq {found}, expected {expected}")]
    NonContiguous {
        /// Index of the offending event in the batch.
        index: usize,
        /// `events[0].seq + index`.
        expected: u64,
        /// The event's seq.
        found: u64,
    },
}

fn corrupt(offset: usize, reason: &'static str) -> CodecError {
    CodecError::Corrupt { offset, reason }
}

/// Encoder settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// LZ-code data where it pays (see the module docs). With `false` every
    /// data field is stored verbatim and decodes zero-copy.
    pub compress: bool,
    /// Never LZ-code the data of events that carry a `surfaceOp` (message
    /// events), so they decode zero-copy and can be read in place, even when
    /// `compress` is on. The store sets it: derive reads message payloads
    /// straight from the mapped segments.
    pub verbatim_surface: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            compress: true,
            verbatim_surface: false,
        }
    }
}

/// Encodes `events` (contiguous seqs, in order) as one batch appended to
/// `out`, with default options. `prev_time` is the time of the event before
/// the batch (the previous batch's last event), or 0 for none; the decoder
/// must be given the same value.
///
/// On error nothing is appended.
pub fn encode_batch(
    events: &[Event<'_>],
    prev_time: i64,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    encode_batch_with(events, prev_time, EncodeOptions::default(), out)
}

/// [`encode_batch`] with explicit options.
pub fn encode_batch_with(
    events: &[Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    // The only failure; checked first so that a failed call appends nothing.
    if let Some(first) = events.first() {
        for (index, ev) in events.iter().enumerate() {
            let expected = first.seq.checked_add(index as u64);
            if expected != Some(ev.seq) {
                return Err(CodecError::NonContiguous {
                    index,
                    expected: first.seq.wrapping_add(index as u64),
                    found: ev.seq,
                });
            }
        }
    }
    let mut types: FxHashMap<&str, u64> = FxHashMap::default();
    let mut lz = LzEncoder::default();
    let mut prev_time = prev_time;
    for (index, ev) in events.iter().enumerate() {
        let mut flags = 0u8;
        let kind: &str = &ev.kind;
        let type_id = match types.get(kind) {
            Some(&id) => Some(id),
            None => {
                types.insert(kind, types.len() as u64);
                flags |= F_NEW_TYPE;
                None
            }
        };
        if ev.source_event_seqs.is_some() {
            flags |= F_SOURCES;
        }
        match ev.surface_op {
            None => {}
            Some(SurfaceOp::Append) => flags |= F_APPEND,
            Some(SurfaceOp::Replace { .. }) => flags |= F_REPLACE,
        }
        if ev.ignorable {
            flags |= F_IGNORABLE;
        }
        let data = ev.data.get().as_bytes();
        let lz_ref = if options.compress && !(options.verbatim_surface && ev.surface_op.is_some()) {
            lz.try_encode(events, index, data)
        } else {
            None
        };
        if lz_ref.is_some() {
            flags |= F_LZ;
        }

        out.push(flags);
        match type_id {
            Some(id) => put_varint(out, id),
            None => put_bytes(out, kind.as_bytes()),
        }
        put_varint(out, zigzag(ev.time.wrapping_sub(prev_time)));
        prev_time = ev.time;
        if let Some(SurfaceOp::Replace { start, end }) = ev.surface_op {
            put_varint(out, start);
            put_varint(out, end);
        }
        if let Some(sources) = &ev.source_event_seqs {
            put_varint(out, sources.len() as u64);
            let mut p = ev.seq;
            for &s in sources {
                put_varint(out, zigzag(p.wrapping_sub(s) as i64));
                p = s;
            }
        }
        match lz_ref {
            None => put_bytes(out, data),
            Some(distance) => {
                put_varint(out, distance as u64);
                put_varint(out, data.len() as u64);
                out.extend_from_slice(&lz.stream);
            }
        }
    }
    Ok(())
}

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
    // Each event takes at least MIN_EVENT_LEN bytes: never trust `count` alone.
    let mut out: Vec<Event<'_>> =
        Vec::with_capacity((count as usize).min(bytes.len() / MIN_EVENT_LEN));
    for _ in 0..count {
        let ev = cursor.next_event(out.len(), |d| out[out.len() - d].data.get())?;
        out.push(ev);
    }
    cursor.finish()?;
    Ok(out)
}

/// Decodes a batch one event at a time, without collecting them.
///
/// Yields `count` events, then, if bytes are left over, one
/// [`CodecError::Corrupt`]; after any error it yields nothing more. A caller
/// that stops after `count` events should call [`BatchDecoder::finish`] to
/// detect leftover bytes.
#[derive(Debug)]
pub struct BatchDecoder<'a> {
    cursor: Cursor<'a>,
    count: u32,
    index: u32,
    validate_json: bool,
    done: bool,
    /// Data of the last [`MAX_REF_DISTANCE`] events, by index modulo.
    recent: [Cow<'a, str>; MAX_REF_DISTANCE],
}

impl<'a> BatchDecoder<'a> {
    /// A decoder of the batch `bytes` (arguments as for [`decode_batch`]).
    pub fn new(bytes: &'a [u8], first_seq: u64, count: u32, prev_time: i64) -> Self {
        BatchDecoder {
            cursor: Cursor::new(bytes, first_seq, prev_time),
            count,
            index: 0,
            validate_json: false,
            done: false,
            recent: std::array::from_fn(|_| Cow::Borrowed("")),
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
        if self.index < self.count {
            return Err(corrupt(self.cursor.pos, "finish before the last event"));
        }
        self.cursor.finish()
    }

    fn decode_next(&mut self) -> Result<Event<'a>, CodecError> {
        let index = self.index as usize;
        let start = self.cursor.pos;
        let recent = &self.recent;
        let ev = self
            .cursor
            .next_event(index, |d| &recent[(index - d) % MAX_REF_DISTANCE])?;
        if self.validate_json
            && serde_json::from_str::<serde::de::IgnoredAny>(ev.data.get()).is_err()
        {
            return Err(corrupt(start, "data is not valid JSON"));
        }
        if index + 1 < self.count as usize {
            self.recent[index % MAX_REF_DISTANCE] = match &ev.data {
                Cow::Borrowed(raw) => Cow::Borrowed(raw.get()),
                Cow::Owned(raw) => Cow::Owned(raw.get().to_owned()),
            };
        }
        self.index += 1;
        Ok(ev)
    }
}

impl<'a> Iterator for BatchDecoder<'a> {
    type Item = Result<Event<'a>, CodecError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
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

impl std::iter::FusedIterator for BatchDecoder<'_> {}

/// The decoding state shared by [`decode_batch`] and [`BatchDecoder`].
#[derive(Debug)]
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    first_seq: u64,
    time: i64,
    types: Vec<&'a str>,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8], first_seq: u64, prev_time: i64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            first_seq,
            time: prev_time,
            types: Vec::new(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn finish(&self) -> Result<(), CodecError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(corrupt(self.pos, "trailing bytes after the last event"))
        }
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        let b = *self
            .bytes
            .get(self.pos)
            .ok_or_else(|| corrupt(self.pos, "truncated event"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        let start = self.pos;
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let Some(&b) = self.bytes.get(self.pos) else {
                return Err(corrupt(start, "truncated varint"));
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(corrupt(start, "varint overflows u64"));
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if b == 0 && shift > 0 {
                    return Err(corrupt(start, "overlong varint"));
                }
                return Ok(value);
            }
            shift += 7;
        }
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

    /// Decodes event `index`. `recent(d)` is the data of event `index - d`
    /// (1 <= d <= min(index, MAX_REF_DISTANCE)).
    fn next_event<'r>(
        &mut self,
        index: usize,
        recent: impl FnOnce(usize) -> &'r str,
    ) -> Result<Event<'a>, CodecError> {
        let start = self.pos;
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

        let data: Cow<'a, RawValue> = if flags & F_LZ == 0 {
            let n = self.len("data length exceeds the batch")?;
            Cow::Borrowed(raw_value(self.str(n, "data is not UTF-8")?))
        } else {
            let at = self.pos;
            let distance = self.varint()?;
            let dict = match usize::try_from(distance) {
                Ok(0) => "",
                Ok(d) if d <= index.min(MAX_REF_DISTANCE) => recent(d),
                _ => return Err(corrupt(at, "LZ dictionary reference out of range")),
            };
            let at = self.pos;
            let len = self.varint()?;
            let limit = dict
                .len()
                .saturating_add(self.remaining().saturating_mul(LZ_MAX_EXPANSION));
            let len = match usize::try_from(len) {
                Ok(n) if n <= limit => n,
                _ => return Err(corrupt(at, "LZ data length out of range")),
            };
            let text = self.lz_decode(dict.as_bytes(), len)?;
            let text = String::from_utf8(text).map_err(|_| corrupt(at, "LZ data is not UTF-8"))?;
            Cow::Owned(boxed_raw_value(text.into_boxed_str()))
        };

        Ok(Event {
            kind: Cow::Borrowed(kind),
            seq,
            time: self.time,
            data,
            source_event_seqs,
            surface_op,
            ignorable: flags & F_IGNORABLE != 0,
        })
    }

    /// Reads an LZ stream that rebuilds `len` bytes against `dict`.
    fn lz_decode(&mut self, dict: &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
        let cap = len.min(
            dict.len()
                .saturating_add(self.remaining().saturating_mul(8)),
        );
        let mut out = Vec::with_capacity(cap);
        loop {
            let at = self.pos;
            let n = self.len("LZ literal run exceeds the batch")?;
            if n > len - out.len() {
                return Err(corrupt(at, "LZ literal run exceeds the data length"));
            }
            out.extend_from_slice(self.take(n)?);
            if out.len() == len {
                return Ok(out);
            }
            let at = self.pos;
            let offset = self.varint()?;
            let length = self.varint()?;
            let vpos = dict.len() + out.len();
            let offset = match usize::try_from(offset) {
                Ok(o) if (1..=vpos).contains(&o) => o,
                _ => return Err(corrupt(at, "LZ match offset out of range")),
            };
            let mut length = usize::try_from(length)
                .ok()
                .and_then(|l| l.checked_add(MIN_MATCH))
                .filter(|&l| l <= len - out.len())
                .ok_or_else(|| corrupt(at, "LZ match exceeds the data length"))?;
            let mut src = vpos - offset;
            if src < dict.len() {
                let n = length.min(dict.len() - src);
                out.extend_from_slice(&dict[src..src + n]);
                length -= n;
                src += n;
            }
            // Any rest has its source in the output (`src >= dict.len()`); copy
            // it in runs of at most `offset` bytes so that an overlapping
            // match repeats correctly.
            let mut s = src.saturating_sub(dict.len());
            while length > 0 {
                let n = length.min(out.len() - s);
                out.extend_from_within(s..s + n);
                s += n;
                length -= n;
            }
            if out.len() == len {
                return Ok(out);
            }
        }
    }
}

/// Views JSON text as a [`RawValue`] without re-parsing it.
pub(crate) fn raw_value(text: &str) -> &RawValue {
    // SAFETY: serde_json declares `#[repr(transparent)] pub struct RawValue
    // { json: str }` (src/raw.rs) and converts `&str` to `&RawValue` the same
    // way internally (`RawValue::from_borrowed` transmutes), so the two
    // unsized types have the same layout and pointer metadata (the length);
    // the cast keeps the address, length and lifetime. `RawValue` adds no
    // validity invariant beyond `str` (UTF-8, checked by the caller): text
    // that is not JSON is a logic error for its users, never undefined
    // behaviour. The test `raw_value_layout` below guards the assumption.
    unsafe { &*(text as *const str as *const RawValue) }
}

/// [`raw_value`] for owned text.
fn boxed_raw_value(text: Box<str>) -> Box<RawValue> {
    // SAFETY: as in `raw_value`: same layout and metadata, and the
    // allocation's layout (size and alignment of the `str`) is unchanged, so
    // the box frees it correctly (serde_json's `RawValue::from_owned`
    // transmutes `Box<str>` to `Box<RawValue>` likewise).
    unsafe { Box::from_raw(Box::into_raw(text) as *mut RawValue) }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Scratch space of the LZ encoder, reused across the events of a batch.
#[derive(Debug, Default)]
struct LzEncoder {
    /// Hash of 4 bytes -> position + 1 in `buf` (0: empty).
    table: Vec<u32>,
    /// dictionary ++ data.
    buf: Vec<u8>,
    /// The LZ stream of the last successful `try_encode`.
    stream: Vec<u8>,
}

impl LzEncoder {
    /// LZ-codes the data of `events[index]` into `self.stream` if that pays;
    /// returns the dictionary reference to write (0: none).
    fn try_encode(&mut self, events: &[Event<'_>], index: usize, data: &[u8]) -> Option<usize> {
        let kind = &events[index].kind;
        let distance = (1..=index.min(MAX_REF_DISTANCE)).find(|&d| events[index - d].kind == *kind);
        if data.len() < LZ_MIN_LEN && distance.is_none() {
            return None;
        }
        let dict = distance.map_or(&b""[..], |d| events[index - d].data.get().as_bytes());
        if dict.len() + data.len() >= u32::MAX as usize {
            return None;
        }
        self.compress(dict, data);
        let distance = distance.unwrap_or(0);
        let verbatim = varint_len(data.len() as u64) + data.len();
        let coded = varint_len(distance as u64) + varint_len(data.len() as u64) + self.stream.len();
        // The decoder's bound counts every byte after the length field; the
        // stream alone is a lower bound of those.
        let within_bound = data.len() - dict.len().min(data.len())
            <= self.stream.len().saturating_mul(LZ_MAX_EXPANSION);
        if coded + MIN_LZ_SAVING > verbatim || !within_bound {
            return None;
        }
        // Never write a stream that does not rebuild the data exactly.
        let mut check = Cursor::new(&self.stream, 0, 0);
        let ok = check
            .lz_decode(dict, data.len())
            .is_ok_and(|rebuilt| rebuilt == data)
            && check.remaining() == 0;
        debug_assert!(ok, "LZ stream does not rebuild the data");
        ok.then_some(distance)
    }

    /// Greedy LZ77 of `data` against `dict` into `self.stream`.
    fn compress(&mut self, dict: &[u8], data: &[u8]) {
        self.buf.clear();
        self.buf.extend_from_slice(dict);
        self.buf.extend_from_slice(data);
        self.stream.clear();
        let v = &self.buf;
        let n = v.len();
        let base = dict.len();
        let bits = n.next_power_of_two().trailing_zeros().clamp(8, 16);
        self.table.clear();
        self.table.resize(1 << bits, 0);
        let hash = |p: usize| -> usize {
            let w = u32::from_le_bytes([v[p], v[p + 1], v[p + 2], v[p + 3]]);
            (w.wrapping_mul(0x9E37_79B1) >> (32 - bits)) as usize
        };
        let last = n.saturating_sub(MIN_MATCH - 1); // positions with 4 bytes
        for p in 0..base.min(last) {
            self.table[hash(p)] = p as u32 + 1;
        }
        let mut anchor = base;
        let mut i = base;
        let mut matched = false;
        while i < last {
            let h = hash(i);
            let cand = self.table[h] as usize;
            self.table[h] = i as u32 + 1;
            if cand != 0 && v[cand - 1..cand + 3] == v[i..i + 4] {
                let c = cand - 1;
                let mut m = MIN_MATCH;
                while i + m < n && v[c + m] == v[i + m] {
                    m += 1;
                }
                put_bytes(&mut self.stream, &v[anchor..i]);
                put_varint(&mut self.stream, (i - c) as u64);
                put_varint(&mut self.stream, (m - MIN_MATCH) as u64);
                let end = (i + m).min(last);
                for p in (i + 1..end)
                    .step_by(4)
                    .chain(end.saturating_sub(2).max(i + 1)..end)
                {
                    self.table[hash(p)] = p as u32 + 1;
                }
                i += m;
                anchor = i;
                matched = true;
            } else {
                i += 1;
            }
        }
        if anchor < n || !matched {
            put_bytes(&mut self.stream, &v[anchor..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_value_layout() {
        // The casts in `raw_value` rely on RawValue being a transparent str.
        assert_eq!(size_of::<&RawValue>(), size_of::<&str>());
        assert_eq!(align_of::<&RawValue>(), align_of::<&str>());
        let text = r#"{"a":[1,2]}"#;
        let raw = raw_value(text);
        assert_eq!(raw.get(), text);
        assert_eq!(raw.get().as_ptr(), text.as_ptr());
        let owned = boxed_raw_value(text.into());
        assert_eq!(owned.get(), text);
        assert_eq!(
            serde_json::from_str::<&RawValue>(text).unwrap().get(),
            raw.get()
        );
    }

    #[test]
    fn varints() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            let mut c = Cursor::new(&out, 0, 0);
            assert_eq!(c.varint().unwrap(), v);
            assert_eq!(c.remaining(), 0);
        }
        for v in [0, 1, -1, 63, -64, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        // Overlong, overflowing and truncated encodings.
        for bad in [&[0x80, 0x00][..], &[0xff; 10][..], &[0x80][..], &[][..]] {
            assert!(Cursor::new(bad, 0, 0).varint().is_err(), "{bad:?}");
        }
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(Cursor::new(&max, 0, 0).varint().unwrap(), u64::MAX);
    }

    fn lz_round_trip(dict: &[u8], data: &[u8]) -> usize {
        let mut enc = LzEncoder::default();
        enc.compress(dict, data);
        let mut c = Cursor::new(&enc.stream, 0, 0);
        assert_eq!(c.lz_decode(dict, data.len()).unwrap(), data);
        assert_eq!(c.remaining(), 0);
        enc.stream.len()
    }

    #[test]
    fn lz_streams() {
        assert_eq!(lz_round_trip(b"", b""), 1);
        assert_eq!(lz_round_trip(b"abc", b""), 1);
        lz_round_trip(b"", b"abc");
        // Overlapping match (run length encoding).
        assert!(lz_round_trip(b"", &[b'x'; 1000]) < 10);
        // Match in the dictionary, running into the output.
        assert!(lz_round_trip(b"hello world", b"hello world hello world") < 10);
        let text = br#"{"turn":1,"step":2,"chunk":{"type":"text-delta","index":0,"text":"Hi"}}"#;
        let next =
            br#"{"turn":1,"step":2,"chunk":{"type":"text-delta","index":0,"text":" there"}}"#;
        assert!(lz_round_trip(text, next) < 16);
        let mut noise = Vec::new();
        let mut x = 12345u32;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            noise.push((x % 7) as u8 + b'a');
        }
        lz_round_trip(&noise[..100], &noise);
        lz_round_trip(b"", &noise);
    }
}
