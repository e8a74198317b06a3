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
//! nearest earlier event of the same type within 16 events. Its match finder
//! is a greedy LZ77: a hash table of 4-byte sequences that lives across the
//! events of a batch (and, per thread, across batches) and only holds each
//! event's data once, whether as data or later as a dictionary; the previous
//! match's offset is tried first; matches are extended 8 bytes at a time; a
//! field is given up as soon as its stream can no longer save enough. The
//! stream is written straight into the output. Debug builds decode every LZ
//! stream and compare it with the data before keeping it; the tests prove the
//! round trip on random and repetitive batches.
//!
//! [`encode_batch_indexed`] also reports where each verbatim data field lies
//! in the encoded bytes, so a caller that writes the batch can index those
//! fields without decoding it again.

use crate::event::{Event, SurfaceOp};
use rustc_hash::FxHashMap;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Range;

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
    encode(events, prev_time, options, out, None)
}

/// [`encode_batch_with`] that also reports where every verbatim `data` field
/// lies in the encoded bytes, so that a caller who writes the batch somewhere
/// can locate those fields without decoding it again. It appends the same
/// bytes as [`encode_batch_with`].
///
/// On success `data_ranges` is cleared and then holds one entry per event, in
/// order: `Some(range)` when the event's data is stored verbatim, `None` when
/// it is LZ-coded. (With `verbatim_surface`, every event with a `surfaceOp`
/// gets `Some`; with `compress: false`, every event does.)
///
/// A range counts bytes from the **start of this batch's codec bytes**, that
/// is from `out.len()` as it was before the call, not from the start of
/// `out`. With `start` that length:
/// - `&out[start..][range]` is exactly the event's `data.get()` bytes;
/// - when the batch bytes `&out[start..]` are given to [`decode_batch`] or
///   [`BatchDecoder`], the event's decoded data borrows exactly that range of
///   them (its pointer minus theirs is `range.start`);
/// - a caller that writes the codec bytes at offset `o` of a file (for a
///   segment record, `o` is `BatchLoc::codec_range().start`, after the batch
///   header) finds the data at `o + range.start .. o + range.end`.
///
/// Ranges are in seq order and do not overlap.
///
/// On error (the only one: non-contiguous seqs) neither `out` nor
/// `data_ranges` is changed.
pub fn encode_batch_indexed(
    events: &[Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    out: &mut Vec<u8>,
    data_ranges: &mut Vec<Option<Range<usize>>>,
) -> Result<(), CodecError> {
    encode(events, prev_time, options, out, Some(data_ranges))
}

fn encode(
    events: &[Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    out: &mut Vec<u8>,
    mut data_ranges: Option<&mut Vec<Option<Range<usize>>>>,
) -> Result<(), CodecError> {
    // The only failure; checked first so that a failed call changes nothing.
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
    if let Some(ranges) = data_ranges.as_deref_mut() {
        ranges.clear();
        ranges.reserve(events.len());
    }
    if options.compress {
        LzEncoder::with(|lz| {
            lz.begin_batch(events);
            encode_events(events, prev_time, options, out, data_ranges, Some(lz));
        });
    } else {
        encode_events(events, prev_time, options, out, data_ranges, None);
    }
    Ok(())
}

/// The body of [`encode`], after the seqs are checked. `lz` is the LZ
/// encoder's scratch when `options.compress` is on.
fn encode_events<'e>(
    events: &'e [Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    out: &mut Vec<u8>,
    mut data_ranges: Option<&mut Vec<Option<Range<usize>>>>,
    mut lz: Option<&mut LzEncoder>,
) {
    let start = out.len();
    // Type string -> id; ids are indexes in `recent`, which holds the data of
    // the last event of each type (the dictionary of the next one).
    let mut types: FxHashMap<&str, usize> = FxHashMap::default();
    let mut recent: Vec<Option<LzSource<'e>>> = Vec::new();
    let mut prev_time = prev_time;
    for (index, ev) in events.iter().enumerate() {
        let mut flags = 0u8;
        let kind: &str = &ev.kind;
        let (type_id, new_type) = match types.get(kind) {
            Some(&id) => (id, false),
            None => {
                let id = types.len();
                types.insert(kind, id);
                recent.push(None);
                flags |= F_NEW_TYPE;
                (id, true)
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

        // F_LZ is set below once the data is LZ-coded.
        let flags_at = out.len();
        out.push(flags);
        if new_type {
            put_bytes(out, kind.as_bytes());
        } else {
            put_varint(out, type_id as u64);
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

        let data = ev.data.get().as_bytes();
        let coded = match lz.as_deref_mut() {
            Some(lz) if !(options.verbatim_surface && ev.surface_op.is_some()) => {
                lz.try_encode(index, type_id, data, &mut recent[type_id], out)
            }
            Some(_) => {
                recent[type_id] = Some(LzSource::new(index, data));
                false
            }
            None => false,
        };
        let range = if coded {
            out[flags_at] |= F_LZ;
            None
        } else {
            put_varint(out, data.len() as u64);
            let at = out.len() - start;
            out.extend_from_slice(data);
            Some(at..at + data.len())
        };
        if let Some(ranges) = data_ranges.as_deref_mut() {
            ranges.push(range);
        }
    }
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

/// The data of the last event of a type in the batch: the dictionary of the
/// next event of that type, and how much of it the hash table holds.
#[derive(Debug, Clone, Copy)]
struct LzSource<'a> {
    /// The event's index in the batch.
    index: usize,
    data: &'a [u8],
    /// Position of `data[0]` in the encoder's position space; 0: none given.
    pos: u32,
    /// The encoder's epoch when `pos` was given.
    epoch: u64,
    /// Every position of `data` below this has been entered in the table
    /// (those inside a match only sparsely, as the match finder does).
    hashed: usize,
}

impl<'a> LzSource<'a> {
    fn new(index: usize, data: &'a [u8]) -> Self {
        LzSource {
            index,
            data,
            pos: 0,
            epoch: 0,
            hashed: 0,
        }
    }
}

/// Fewest and most bits of the LZ hash table's index.
const LZ_MIN_BITS: u32 = 10;
const LZ_MAX_BITS: u32 = 16;
const LZ_TABLE_LEN: usize = 1 << LZ_MAX_BITS;

/// Longest match when the stream must stay within the decoder's expansion
/// bound on its own: a match of more than 131 bytes takes at least 3 bytes
/// (offset, and a length of 2 bytes), so none stands for more than
/// `LZ_MAX_EXPANSION` bytes per byte of the stream.
const LZ_BOUNDED_MATCH: usize = 3 * LZ_MAX_EXPANSION;

/// Every how many positions inside a match the encoder enters one in the hash
/// table (the last two are always entered). On the sample workload, entering
/// every one costs 30% more instructions for 0.1% fewer bytes; every eighth
/// costs 0.06% more bytes than every fourth and saves 4% of the instructions
/// (the repeat-offset check finds most matches the skipped entries would).
const MATCH_ENTRY_STEP: usize = 8;
// `slot` truncates indexes to u16.
const _: () = assert!(LZ_TABLE_LEN == 1 << u16::BITS);

/// The LZ encoder's state, kept across the events of a batch and, per
/// thread, across batches: a hash table of 4-byte prefixes that is never
/// cleared (see below), and where the position space has got to.
///
/// Every data field the match finder looks at gets a range of a position
/// space that only grows (`next`), so an entry of the table names one byte of
/// one event. A candidate is used only if it lies in the range of the current
/// event's dictionary or before the current position of the data being
/// coded, and its 4 bytes match, so entries left by other types, earlier
/// events or earlier batches are harmless and nothing has to be cleared,
/// except when the u32 positions run out (every 4 GiB of data: a new epoch).
/// The type's id is mixed into the hash so that interleaved types do not
/// evict each other's entries.
#[derive(Debug)]
struct LzEncoder {
    /// Hash of 4 bytes (and the type) -> position. Its first `1 << bits`
    /// entries are in use (the rest is never touched, so its pages are never
    /// mapped in).
    table: Box<[u32; LZ_TABLE_LEN]>,
    bits: u32,
    /// The next free position (>= 1: 0 is an empty entry).
    next: u32,
    /// Bumped when the table is cleared to restart positions.
    epoch: u64,
}

thread_local! {
    static LZ_ENCODER: RefCell<LzEncoder> = RefCell::new(LzEncoder::new());
}

impl LzEncoder {
    fn new() -> Self {
        let table = vec![0; LZ_TABLE_LEN].into_boxed_slice();
        LzEncoder {
            table: table.try_into().expect("LZ_TABLE_LEN entries"),
            bits: LZ_MIN_BITS,
            next: 1,
            epoch: 1,
        }
    }

    /// Runs `f` on this thread's encoder (so its table is allocated once per
    /// thread, at most 256 KiB), or on a new one if that is not available.
    fn with(f: impl FnOnce(&mut LzEncoder)) {
        let mut f = Some(f);
        let _ = LZ_ENCODER.try_with(|cell| {
            if let Ok(mut lz) = cell.try_borrow_mut() {
                (f.take().expect("called once"))(&mut lz);
            }
        });
        if let Some(f) = f {
            f(&mut LzEncoder::new());
        }
    }

    /// Sizes the table for `events`: the power of two above the largest
    /// amount of data that one event's dictionary and data can span (the data
    /// of `MAX_REF_DISTANCE + 1` consecutive events). Twice that is not worth
    /// it on the sample workload: 0.05% fewer bytes, 30-70% more L1 misses.
    fn begin_batch(&mut self, events: &[Event<'_>]) {
        let len = |e: &Event<'_>| e.data.get().len();
        let (mut window, mut widest) = (0usize, 0usize);
        for (i, e) in events.iter().enumerate() {
            window += len(e);
            if i > MAX_REF_DISTANCE {
                window -= len(&events[i - MAX_REF_DISTANCE - 1]);
            }
            widest = widest.max(window);
        }
        self.bits = (usize::BITS - widest.leading_zeros()).clamp(LZ_MIN_BITS, LZ_MAX_BITS);
    }

    /// Makes room for `n` more positions; false if `n` is too large.
    fn reserve(&mut self, n: usize) -> bool {
        if n >= (u32::MAX / 2) as usize {
            return false;
        }
        if ((u32::MAX - self.next) as usize) < n {
            self.table.fill(0);
            self.next = 1;
            self.epoch += 1;
        }
        true
    }

    /// Gives `src` positions (after a [`LzEncoder::reserve`] that covers it)
    /// unless it has some in this epoch.
    fn place(&mut self, src: &mut LzSource<'_>) {
        if src.pos == 0 || src.epoch != self.epoch {
            src.pos = self.next;
            src.epoch = self.epoch;
            src.hashed = 0;
            self.next += src.data.len() as u32;
        }
    }

    /// Enters the positions of `src` not yet in the table.
    fn enter_rest(&mut self, src: &mut LzSource<'_>, salt: u32) {
        let table = &mut *self.table;
        let shift = 32 - self.bits;
        let d = src.data;
        for p in src.hashed..d.len().saturating_sub(MIN_MATCH - 1) {
            table[slot(read_u32(d, p), salt, shift)] = src.pos + p as u32;
        }
        src.hashed = src.hashed.max(d.len());
    }

    /// LZ-codes `data`, the data of event `index` of type `type_id`, if that
    /// pays: appends `ref`, the decoded length and the LZ stream to `out` and
    /// returns true, or appends nothing and returns false. `recent` is the
    /// last event of the type (the dictionary, if it is near enough); it is
    /// replaced by this event.
    fn try_encode<'a>(
        &mut self,
        index: usize,
        type_id: usize,
        data: &'a [u8],
        recent: &mut Option<LzSource<'a>>,
        out: &mut Vec<u8>,
    ) -> bool {
        let mut dict = recent.filter(|r| index - r.index <= MAX_REF_DISTANCE);
        let me = recent.insert(LzSource::new(index, data));
        let distance = dict.map_or(0, |d| index - d.index);
        if data.len() < LZ_MIN_LEN && dict.is_none() {
            return false;
        }
        // Bytes the stream may take for LZ to save MIN_LZ_SAVING (verbatim:
        // varint length + data; coded: varint ref + varint length + stream).
        let Some(budget) = data
            .len()
            .checked_sub(MIN_LZ_SAVING + varint_len(distance as u64))
        else {
            return false;
        };
        let dict_len = dict.map_or(0, |d| d.data.len());
        if !self.reserve(dict_len + data.len()) {
            return false;
        }
        let salt = (type_id as u32).wrapping_mul(0x9E37_79B9);
        if let Some(d) = &mut dict {
            self.place(d);
            self.enter_rest(d, salt);
        }
        self.place(me);
        let mark = out.len();
        put_varint(out, distance as u64);
        put_varint(out, data.len() as u64);
        let stream_at = out.len();
        let (mut done, hashed) = self.compress(dict.as_ref(), me, salt, out, budget, usize::MAX);
        me.hashed = hashed;
        // The decoder's bound counts every byte after the length field; the
        // stream alone is a lower bound of those.
        let within_bound = |stream_len: usize| {
            data.len() - dict_len.min(data.len()) <= stream_len.saturating_mul(LZ_MAX_EXPANSION)
        };
        if done && !within_bound(out.len() - stream_at) {
            // Long runs: code again with matches short enough that no byte
            // of the stream stands for more than LZ_MAX_EXPANSION bytes.
            out.truncate(stream_at);
            done = self
                .compress(dict.as_ref(), me, salt, out, budget, LZ_BOUNDED_MATCH)
                .0;
        }
        if !done || !within_bound(out.len() - stream_at) {
            out.truncate(mark);
            return false;
        }
        if cfg!(debug_assertions) {
            let dict = dict.map_or(&b""[..], |d| d.data);
            let mut check = Cursor::new(&out[stream_at..], 0, 0);
            let rebuilt = check.lz_decode(dict, data.len());
            assert!(
                rebuilt.is_ok_and(|r| r == data) && check.remaining() == 0,
                "LZ stream does not rebuild the data"
            );
        }
        true
    }

    /// Greedy LZ77 of `src.data` against `dict` (whose positions are in the
    /// table) as an LZ stream appended to `out`, entering the positions of
    /// `src` as it goes, with matches of at most `max_match` bytes. Gives up
    /// as soon as the stream would exceed `budget` bytes. Returns whether it finished, and how far `src` has been
    /// entered in the table.
    fn compress(
        &mut self,
        dict: Option<&LzSource<'_>>,
        src: &LzSource<'_>,
        salt: u32,
        out: &mut Vec<u8>,
        budget: usize,
        max_match: usize,
    ) -> (bool, usize) {
        let table = &mut *self.table;
        let shift = 32 - self.bits;
        let (dict, dict_pos) = dict.map_or((&b""[..], 0), |d| (d.data, d.pos));
        let data = src.data;
        let pos = src.pos;
        let n = data.len();
        let last = n.saturating_sub(MIN_MATCH - 1); // positions with 4 bytes
        let mut left = budget;
        let mut anchor = 0;
        let mut i = 0;
        let mut matched = false;
        // The offset of the last match, tried first at every position; at
        // first the same position in the dictionary (events of a type tend to
        // share their layout).
        let mut rep = dict.len();
        while i < last {
            let w = read_u32(data, i);
            let vpos = dict.len() + i;
            // Matches are cut at `max_match`, so they are never extended past
            // it: a long run would otherwise cost O(run) per match, O(n^2)
            // in all.
            let window = &data[..n.min(i.saturating_add(max_match))];
            // (offset back in the virtual buffer, length) of a match at `i`.
            let mut found = None;
            if rep != 0 && rep <= vpos {
                found = match_len(dict, window, vpos - rep, i, w).map(|m| (rep, m));
            }
            let h = slot(w, salt, shift);
            if found.is_none() {
                let cand = table[h];
                let src = if cand >= pos {
                    let c = (cand - pos) as usize;
                    (c < i).then_some(dict.len() + c)
                } else if cand >= dict_pos {
                    let k = (cand - dict_pos) as usize;
                    (k + MIN_MATCH <= dict.len()).then_some(k)
                } else {
                    None
                };
                found = src.and_then(|s| Some((vpos - s, match_len(dict, window, s, i, w)?)));
            }
            table[h] = pos + i as u32;
            let Some((offset, m)) = found.map(|(o, m)| (o, m.min(max_match))) else {
                i += 1;
                // The literals so far will take at least this many bytes.
                if i - anchor > left {
                    return (false, i);
                }
                continue;
            };
            let lit = i - anchor;
            let cost = varint_len(lit as u64)
                + lit
                + varint_len(offset as u64)
                + varint_len((m - MIN_MATCH) as u64);
            if cost > left {
                return (false, i + 1);
            }
            left -= cost;
            put_bytes(out, &data[anchor..i]);
            put_varint(out, offset as u64);
            put_varint(out, (m - MIN_MATCH) as u64);
            // Enter some of the positions inside the match (for the next event
            // of the type, which has this one as its dictionary), and the last
            // two (where matches after a short difference tend to start).
            let end = (i + m).min(last);
            let mut p = i + 1;
            while p < end {
                table[slot(read_u32(data, p), salt, shift)] = pos + p as u32;
                p += MATCH_ENTRY_STEP;
            }
            for p in end.saturating_sub(2).max(i + 1)..end {
                table[slot(read_u32(data, p), salt, shift)] = pos + p as u32;
            }
            i += m;
            anchor = i;
            matched = true;
            rep = offset;
        }
        if anchor < n || !matched {
            let lit = n - anchor;
            if varint_len(lit as u64) + lit > left {
                return (false, n);
            }
            put_bytes(out, &data[anchor..]);
        }
        (true, n)
    }
}

/// The table index of the 4 bytes `w` for the type of `salt`; `shift` is
/// `32 - bits`, so the index is below `1 << bits` (the cast to u16 only tells
/// the compiler that it is in bounds of a table of `LZ_TABLE_LEN`).
#[inline]
fn slot(w: u32, salt: u32, shift: u32) -> usize {
    ((w ^ salt).wrapping_mul(0x9E37_79B1) >> shift) as u16 as usize
}

#[inline]
fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The length of the match of `data[i..]` against the virtual buffer
/// `dict ++ data` at `src` (`src < dict.len() + i`), if it has at least
/// [`MIN_MATCH`] bytes (`w`: the 4 bytes at `i`); a match may run on from the
/// dictionary into the data.
#[inline(always)]
fn match_len(dict: &[u8], data: &[u8], src: usize, i: usize, w: u32) -> Option<usize> {
    if let Some(c) = src.checked_sub(dict.len()) {
        (read_u32(data, c) == w).then(|| MIN_MATCH + extend(data, c, data, i))
    } else if src + MIN_MATCH <= dict.len() && read_u32(dict, src) == w {
        Some(MIN_MATCH + extend_from_dict(dict, data, src, i))
    } else {
        None
    }
}

/// How far a match of 4 bytes between `a[s..]` and `b[i..]` goes on.
#[inline(never)]
fn extend(a: &[u8], s: usize, b: &[u8], i: usize) -> usize {
    common_prefix(&a[s + MIN_MATCH..], &b[i + MIN_MATCH..])
}

/// [`extend`] for a match that starts in the dictionary and may run on into
/// the data.
#[inline(never)]
fn extend_from_dict(dict: &[u8], data: &[u8], src: usize, i: usize) -> usize {
    let mut m = common_prefix(&dict[src + MIN_MATCH..], &data[i + MIN_MATCH..]);
    if src + MIN_MATCH + m == dict.len() {
        m += common_prefix(data, &data[i + MIN_MATCH + m..]);
    }
    m
}

/// How many leading bytes `a` and `b` have in common, 8 at a time.
#[inline]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut k = 0;
    while k + 8 <= n {
        let x = u64::from_le_bytes(a[k..k + 8].try_into().expect("8 bytes"))
            ^ u64::from_le_bytes(b[k..k + 8].try_into().expect("8 bytes"));
        if x != 0 {
            return k + (x.trailing_zeros() / 8) as usize;
        }
        k += 8;
    }
    while k < n && a[k] == b[k] {
        k += 1;
    }
    k
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

    /// LZ-codes `data` against `dict` with `enc` (no budget), checks that the
    /// stream rebuilds it, returns the stream's length.
    fn lz_with(enc: &mut LzEncoder, dict: &[u8], data: &[u8]) -> usize {
        let mut d = LzSource::new(0, dict);
        let mut me = LzSource::new(1, data);
        assert!(enc.reserve(dict.len() + data.len()));
        enc.place(&mut d);
        enc.enter_rest(&mut d, 7);
        enc.place(&mut me);
        let mut out = Vec::new();
        let (done, hashed) = enc.compress(Some(&d), &me, 7, &mut out, usize::MAX, usize::MAX);
        assert!(done);
        assert_eq!(hashed, data.len());
        let mut c = Cursor::new(&out, 0, 0);
        assert_eq!(c.lz_decode(dict, data.len()).unwrap(), data);
        assert_eq!(c.remaining(), 0);
        out.len()
    }

    fn lz_round_trip(dict: &[u8], data: &[u8]) -> usize {
        let mut enc = LzEncoder::new();
        enc.bits = 12;
        lz_with(&mut enc, dict, data)
    }

    #[test]
    fn bounded_matches_of_a_long_run_cost_linear_time() {
        // 4 MiB of one byte, matches cut at LZ_BOUNDED_MATCH: each match
        // once extended to the end of the run (quadratic: this test then
        // ran for minutes, a 65 MiB import for hours).
        let data = vec![b'x'; 4 << 20];
        let mut enc = LzEncoder::new();
        let mut me = LzSource::new(0, &data);
        assert!(enc.reserve(data.len()));
        enc.place(&mut me);
        let mut out = Vec::new();
        let (done, _) = enc.compress(None, &me, 7, &mut out, usize::MAX, LZ_BOUNDED_MATCH);
        assert!(done);
        assert!(
            data.len() <= out.len() * LZ_MAX_EXPANSION,
            "{} bytes",
            out.len()
        );
        let mut c = Cursor::new(&out, 0, 0);
        assert_eq!(c.lz_decode(b"", data.len()).unwrap(), data);
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
        // Matches that run from the dictionary into the data, and start at
        // the dictionary's last 4 bytes.
        lz_round_trip(b"0123456789abcdef", b"cdefcdefcdefcdef0123456789abcdef0123");
        lz_round_trip(b"wxyz", b"wxyzwxyzwxyz");
        // The same encoder, one table, many fields: stale entries are ignored.
        let mut enc = LzEncoder::new();
        enc.bits = 10;
        for k in 0..50 {
            lz_with(&mut enc, &noise[k..k + 200], &noise[k * 3..k * 3 + 300]);
        }
    }

    /// Events whose data repeats across and within events.
    fn repetitive_batch(n: usize, seed: u32) -> Vec<crate::event::OwnedEvent> {
        let mut x = seed | 1;
        let mut rnd = move |m: u32| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x % m
        };
        let words = [
            " the",
            " file",
            " test",
            "abcabcabc",
            "x",
            "\\n",
            "{\\\"a\\\":1}",
        ];
        (0..n)
            .map(|i| {
                let kind = ["a", "b", "c", "d"][rnd(4) as usize];
                let text: String = (0..rnd(200)).map(|_| words[rnd(7) as usize]).collect();
                let data = format!(r#"{{"turn":{},"i":{i},"text":"{text}"}}"#, rnd(3));
                crate::event::OwnedEvent::new(kind, i as u64, 0, &data).unwrap()
            })
            .collect()
    }

    fn assert_batch_round_trips(events: &[crate::event::OwnedEvent]) -> usize {
        let mut out = Vec::new();
        encode_batch(events, 0, &mut out).unwrap();
        assert_eq!(
            decode_batch(&out, 0, events.len() as u32, 0).unwrap(),
            events
        );
        out.len()
    }

    #[test]
    fn lz_positions_run_out_and_restart() {
        let events = repetitive_batch(300, 7);
        let size = assert_batch_round_trips(&events);
        // Start just below the end of the position space: the batch starts
        // a new epoch in the middle (every few events, with big ones).
        for left in [0, 1, 100, 5000, 20_000] {
            let epoch = LZ_ENCODER.with(|lz| {
                let mut lz = lz.borrow_mut();
                lz.next = u32::MAX - left;
                lz.epoch
            });
            assert_batch_round_trips(&events);
            assert!(LZ_ENCODER.with(|lz| lz.borrow().epoch) > epoch);
        }
        // A restart costs compression only around it.
        assert!(assert_batch_round_trips(&events) <= size);
    }

    #[test]
    fn lz_table_contents_never_matter_for_correctness() {
        // Candidates are checked against the current ranges and the bytes, so
        // whatever the table holds (here: positions of the coming events at
        // random slots), the streams are exact.
        let events = repetitive_batch(200, 11);
        let mut x = 99u32;
        for round in 0..4 {
            LZ_ENCODER.with(|lz| {
                let mut lz = lz.borrow_mut();
                let next = lz.next;
                for e in lz.table.iter_mut() {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    *e = if round == 0 {
                        x
                    } else {
                        next.wrapping_add(x % 100_000)
                    };
                }
            });
            assert_batch_round_trips(&events);
        }
        // Batches of other sizes and table sizes, one after the other.
        for n in [1, 17, 500, 3, 60] {
            assert_batch_round_trips(&repetitive_batch(n, n as u32));
        }
    }
}
