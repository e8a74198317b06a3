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
//! ([`Cow::Borrowed`]). Packed (compressed) `data` is rebuilt
//! ([`Cow::Owned`]).
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
//! A batch is a *pack* header followed by its `count` events, in seq order,
//! with nothing between or after them. Event `i` (from 0) has seq
//! `first_seq + i`.
//!
//! ```text
//! pack       varint P: the length of the pack (the packed data of the batch,
//!                    decoded); 0: no pack, and nothing else follows.
//!            if P > 0: varint Z, then Z bytes of Zstandard data (RFC 8878:
//!                    one or more frames) that decode to exactly P bytes.
//!                    P is at most 32 x Z + 1 MiB (PACK_MAX_RATIO,
//!                    PACK_SLACK), so a few bytes never claim gigabytes.
//! ```
//!
//! Each event is:
//!
//! ```text
//! flags      u8      bit 0  has_sources   (a sources field follows)
//!                    bit 1  surfaceOp = "append"
//!                    bit 2  surfaceOp = replace (a replace field follows)
//!                    bit 3  ignorable = true
//!                    bit 4  type_is_new   (the type is defined inline)
//!                    bit 5  data_packed   (the data is in the pack)
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
//! data       varint byte length n, then
//!            if not data_packed: the n exact JSON bytes (UTF-8), verbatim;
//!            if data_packed:     nothing here: the data is the next n bytes
//!                    of the pack (the packed events take consecutive
//!                    slices of it, in event order, from its start).
//! ```
//!
//! After the last event the batch must end and the pack must be used up;
//! leftover bytes of either are corruption. The decoded `kind` and `data`
//! must be UTF-8.
//!
//! The encoder, with [`EncodeOptions::compress`], packs the data of every
//! event (except message events under [`EncodeOptions::verbatim_surface`])
//! and compresses the pack as one Zstandard frame at level 1, so repetition
//! *across* events (a stream of chunks of one message, the same tool call
//! shape again and again) is found, and the literals are entropy-coded. It
//! keeps the pack only when that saves at least [`MIN_PACK_SAVING`] bytes and
//! the ratio bound holds; otherwise every data field is stored verbatim.
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

/// The pack's decoded length is at most this many times its compressed
/// length, plus [`PACK_SLACK`].
pub const PACK_MAX_RATIO: usize = 32;

/// See [`PACK_MAX_RATIO`]: lets any batch with up to 1 MiB of packed data
/// compress as well as it can.
pub const PACK_SLACK: usize = 1 << 20;

/// The encoder keeps a pack only when it is at least this many bytes smaller
/// than storing the same data verbatim (verbatim data decodes zero-copy).
pub const MIN_PACK_SAVING: usize = 8;

/// Zstandard level of the pack. Measured on the sample workload at batch
/// 4096: level 1 stores the non-message data in 12.6 B/event at the speed of
/// level -3 (15.2 B/event); level 3 saves 0.5 B/event more for 12% more
/// time.
const PACK_LEVEL: i32 = 1;

const F_SOURCES: u8 = 1 << 0;
const F_APPEND: u8 = 1 << 1;
const F_REPLACE: u8 = 1 << 2;
const F_IGNORABLE: u8 = 1 << 3;
const F_NEW_TYPE: u8 = 1 << 4;
const F_PACKED: u8 = 1 << 5;
const F_RESERVED: u8 = !(F_SOURCES | F_APPEND | F_REPLACE | F_IGNORABLE | F_NEW_TYPE | F_PACKED);

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
    /// Pack and compress data where it pays (see the module docs). With
    /// `false` every data field is stored verbatim and decodes zero-copy.
    pub compress: bool,
    /// Never pack the data of events that carry a `surfaceOp` (message
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
/// it is packed. (With `verbatim_surface`, every event with a `surfaceOp`
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
    Packer::with(|packer| {
        let packed = options.compress && packer.pack(events, options);
        encode_events(
            events,
            prev_time,
            options,
            out,
            data_ranges,
            packed.then_some(&*packer),
        );
    });
    Ok(())
}

/// Whether the encoder puts `ev`'s data in the pack.
fn packable(ev: &Event<'_>, options: EncodeOptions) -> bool {
    options.compress && !(options.verbatim_surface && ev.surface_op.is_some())
}

/// The encoder's scratch: the pack of the batch being encoded, its frame and
/// a Zstandard context, kept per thread so a batch allocates nothing once
/// they have grown.
struct Packer {
    raw: Vec<u8>,
    frame: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

/// Largest scratch buffer a thread keeps between batches.
const PACKER_KEEP: usize = 4 << 20;

thread_local! {
    static PACKER: RefCell<Packer> = const {
        RefCell::new(Packer { raw: Vec::new(), frame: Vec::new(), zstd: None })
    };
}

impl Packer {
    /// Runs `f` on this thread's packer, or on a new one if that is not
    /// available (re-entered, or the thread is ending).
    fn with(f: impl FnOnce(&mut Packer)) {
        let mut f = Some(f);
        let _ = PACKER.try_with(|cell| {
            if let Ok(mut packer) = cell.try_borrow_mut() {
                (f.take().expect("called once"))(&mut packer);
                // Do not keep a huge batch's buffers for the thread's life.
                if packer.raw.capacity() > PACKER_KEEP {
                    packer.raw = Vec::new();
                }
                if packer.frame.capacity() > PACKER_KEEP {
                    packer.frame = Vec::new();
                }
            }
        });
        if let Some(f) = f {
            f(&mut Packer {
                raw: Vec::new(),
                frame: Vec::new(),
                zstd: None,
            });
        }
    }

    /// Builds and compresses the pack of `events`; true when it is worth
    /// keeping (then `frame` holds it), false to store all data verbatim.
    fn pack(&mut self, events: &[Event<'_>], options: EncodeOptions) -> bool {
        self.raw.clear();
        for ev in events.iter().filter(|ev| packable(ev, options)) {
            self.raw.extend_from_slice(ev.data.get().as_bytes());
        }
        let p = self.raw.len();
        if p <= MIN_PACK_SAVING {
            return false;
        }
        if self.zstd.is_none() {
            // Fails only when zstd cannot allocate its context: store verbatim.
            self.zstd = zstd::bulk::Compressor::new(PACK_LEVEL).ok();
        }
        let Some(zstd) = self.zstd.as_mut() else {
            return false;
        };
        self.frame.clear();
        self.frame.reserve(zstd::zstd_safe::compress_bound(p));
        let Ok(z) = zstd.compress_to_buffer(&self.raw[..], &mut self.frame) else {
            return false;
        };
        // Both forms write the same per-event lengths and one varint P (0 for
        // no pack, which takes one byte); the pack adds varint Z and Z bytes.
        let cost = z + varint_len(z as u64) + varint_len(p as u64) - 1;
        cost + MIN_PACK_SAVING <= p && p <= pack_limit(z)
    }
}

/// The largest pack `z` compressed bytes may decode to.
fn pack_limit(z: usize) -> usize {
    z.saturating_mul(PACK_MAX_RATIO).saturating_add(PACK_SLACK)
}

/// The body of [`encode`], after the seqs are checked. `pack` is the packer
/// holding this batch's compressed pack, when there is one.
fn encode_events(
    events: &[Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    out: &mut Vec<u8>,
    mut data_ranges: Option<&mut Vec<Option<Range<usize>>>>,
    pack: Option<&Packer>,
) {
    let start = out.len();
    match pack {
        Some(pack) => {
            put_varint(out, pack.raw.len() as u64);
            put_bytes(out, &pack.frame);
        }
        None => put_varint(out, 0),
    }
    let mut types: FxHashMap<&str, usize> = FxHashMap::default();
    let mut prev_time = prev_time;
    for ev in events {
        let mut flags = 0u8;
        let kind: &str = &ev.kind;
        let (type_id, new_type) = match types.get(kind) {
            Some(&id) => (id, false),
            None => {
                let id = types.len();
                types.insert(kind, id);
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
        let packed = pack.is_some() && packable(ev, options);
        if packed {
            flags |= F_PACKED;
        }

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
        put_varint(out, data.len() as u64);
        let range = if packed {
            None
        } else {
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
    cursor.read_pack()?;
    // Each event takes at least MIN_EVENT_LEN bytes: never trust `count` alone.
    let mut out: Vec<Event<'_>> =
        Vec::with_capacity((count as usize).min(bytes.len() / MIN_EVENT_LEN));
    for index in 0..count {
        out.push(cursor.next_event(index as usize)?);
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
    /// A bad pack header, reported by the first call to `next`.
    pack_error: Option<CodecError>,
}

impl<'a> BatchDecoder<'a> {
    /// A decoder of the batch `bytes` (arguments as for [`decode_batch`]).
    ///
    /// The pack (if the batch has one) is decompressed here, once; an error
    /// in it is the first item.
    pub fn new(bytes: &'a [u8], first_seq: u64, count: u32, prev_time: i64) -> Self {
        let mut cursor = Cursor::new(bytes, first_seq, prev_time);
        let pack_error = cursor.read_pack().err();
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

impl std::iter::FusedIterator for BatchDecoder<'_> {}

/// The decoding state shared by [`decode_batch`] and [`BatchDecoder`].
#[derive(Debug)]
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    first_seq: u64,
    time: i64,
    types: Vec<&'a str>,
    /// Where the event being decoded starts.
    event_start: usize,
    /// The decoded pack (empty before it is read, or when there is none) and
    /// how much of it the events so far have taken.
    pack: Vec<u8>,
    pack_used: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8], first_seq: u64, prev_time: i64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            first_seq,
            time: prev_time,
            types: Vec::new(),
            event_start: 0,
            pack: Vec::new(),
            pack_used: 0,
        }
    }

    fn remaining(&self) -> usize {
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

    /// Reads and decompresses the pack header; called once, first.
    fn read_pack(&mut self) -> Result<(), CodecError> {
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
        // allocation.
        let mut pack = Vec::with_capacity(p);
        let n = Unpacker::with(|zstd| zstd.decompress_to_buffer(frame, &mut pack))
            .map_err(|_| corrupt(frame_at, "pack is not valid Zstandard data"))?;
        if n != p {
            return Err(corrupt(
                frame_at,
                "pack decodes to another length than stated",
            ));
        }
        self.pack = pack;
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
            let bytes = &self.pack[self.pack_used..self.pack_used + n];
            self.pack_used += n;
            let text =
                std::str::from_utf8(bytes).map_err(|_| corrupt(at, "packed data is not UTF-8"))?;
            Cow::Owned(boxed_raw_value(text.into()))
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
}
