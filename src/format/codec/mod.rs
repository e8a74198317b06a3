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
//! ([`Cow::Borrowed`](std::borrow::Cow::Borrowed)). Packed (compressed) `data` is rebuilt
//! ([`Cow::Owned`](std::borrow::Cow::Owned)).
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
//! and compresses the pack as one Zstandard frame at level 1 (level -1, raw
//! literals, for a pack under 8 KiB, where the literals' Huffman table costs
//! more than it saves), so repetition *across* events (a stream of chunks of
//! one message, the same tool call shape again and again) is found, and the
//! literals of larger packs are entropy-coded. It
//! keeps the pack only when that saves at least [`MIN_PACK_SAVING`] bytes and
//! the ratio bound holds; otherwise every data field is stored verbatim.
//!
//! [`encode_batch_indexed`] also reports where each verbatim data field lies
//! in the encoded bytes, so a caller that writes the batch can index those
//! fields without decoding it again.
//!
//! # Where things are
//!
//! `encode` (the encoder and its pack), `decode` (the decoder, whole-batch
//! and streaming) and `varint` (the integer encodings both use). The event
//! layout's flags, the pack bound and the error are here; everything public
//! is re-exported.


mod decode;
mod encode;
mod varint;

#[cfg(any(test, feature = "internals"))]
pub use decode::BatchDecoder;
pub use decode::{decode_batch, decode_batch_in};
pub use encode::{EncodeOptions, Pack, encode_batch_indexed, encode_batch_prepacked};
#[cfg(any(test, feature = "internals"))]
pub use encode::{encode_batch, encode_batch_with};

/// The pack's decoded length is at most this many times its compressed
/// length, plus [`PACK_SLACK`].
pub const PACK_MAX_RATIO: usize = 32;

/// See [`PACK_MAX_RATIO`]: lets any batch with up to 1 MiB of packed data
/// compress as well as it can.
pub const PACK_SLACK: usize = 1 << 20;

/// The encoder keeps a pack only when it is at least this many bytes smaller
/// than storing the same data verbatim (verbatim data decodes zero-copy).
pub const MIN_PACK_SAVING: usize = 8;

const F_SOURCES: u8 = 1 << 0;
const F_APPEND: u8 = 1 << 1;
const F_REPLACE: u8 = 1 << 2;
const F_IGNORABLE: u8 = 1 << 3;
const F_NEW_TYPE: u8 = 1 << 4;
const F_PACKED: u8 = 1 << 5;
const F_RESERVED: u8 = !(F_SOURCES | F_APPEND | F_REPLACE | F_IGNORABLE | F_NEW_TYPE | F_PACKED);

/// Why a batch could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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

/// The largest pack `z` compressed bytes may decode to.
fn pack_limit(z: usize) -> usize {
    z.saturating_mul(PACK_MAX_RATIO).saturating_add(PACK_SLACK)
}
