//! The encoder: events to batch bytes, with the data of packable events in
//! one Zstandard-compressed pack when that pays (see the module docs of
//! [`codec`](super) for the layout).

use super::varint::{put_bytes, put_varint, varint_len, zigzag};
use super::{
    CodecError, F_APPEND, F_IGNORABLE, F_NEW_TYPE, F_PACKED, F_REPLACE, F_SOURCES, MIN_PACK_SAVING,
    pack_limit,
};
use crate::event::{Event, SurfaceOp};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::ops::Range;

/// Zstandard level of the pack. Measured on the sample workload at batch
/// 4096: level 1 stores the non-message data in 12.6 B/event at the speed of
/// level -3 (15.2 B/event); level 3 saves 0.5 B/event more for 12% more
/// time.
const PACK_LEVEL: i32 = 1;

/// Zstandard level of a pack shorter than [`SMALL_PACK`]. On a pack of a
/// few KiB the fixed cost of level 1, building the Huffman table of the
/// literals, is most of the time; level -1 stores the literals raw. Measured
/// on packs of 16 events: 4.2 us -> 1.8 us per pack for the many-session
/// bench's chunks (125 -> 157 B), 8.5 us -> 5.7 us for the sample workload
/// (468 -> 582 B); at 20 KiB the two levels differ by 9% in time.
const SMALL_PACK_LEVEL: i32 = -1;

/// Packs shorter than this many bytes use [`SMALL_PACK_LEVEL`].
const SMALL_PACK: usize = 8 << 10;

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
#[cfg(any(test, feature = "internals"))]
pub fn encode_batch(
    events: &[Event<'_>],
    prev_time: i64,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    encode_batch_with(events, prev_time, EncodeOptions::default(), out)
}

/// [`encode_batch`] with explicit options.
#[cfg(any(test, feature = "internals"))]
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
/// - when the batch bytes `&out[start..]` are given to [`decode_batch`](super::decode_batch) or
///   [`BatchDecoder`](super::BatchDecoder), the event's decoded data borrows exactly that range of
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
    check_contiguous(events)?;
    if let Some(ranges) = data_ranges.as_deref_mut() {
        ranges.clear();
        ranges.reserve(events.len());
    }
    Packer::with(|packer| {
        let packed = options.compress && packer.pack(events, options);
        let pack = packed.then(|| (packer.raw.len(), &packer.frame[..]));
        encode_events(events, prev_time, options, out, data_ranges, pack);
    });
    Ok(())
}

/// The pack of one batch built apart from its encoding, so that its
/// compression (most of an encode's time in a large batch) can run on
/// another thread while the appending thread checks the batch: gathered
/// ([`Pack::gather`]) where the events are, compressed ([`Pack::compress`])
/// anywhere, then given with the same events and options to
/// [`encode_batch_prepacked`], which writes what [`encode_batch_indexed`]
/// would.
#[derive(Debug, Default)]
pub struct Pack {
    raw: Vec<u8>,
    frame: Vec<u8>,
    /// Compressed, and worth keeping.
    keep: bool,
}

impl Pack {
    /// Gathers the data `events` put in a pack under `options`, not yet
    /// compressed, replacing what this pack held (its buffers are reused).
    pub fn gather(&mut self, events: &[Event<'_>], options: EncodeOptions) {
        gather_into(&mut self.raw, events, options);
        self.frame.clear();
        self.keep = false;
    }

    /// The bytes its buffers hold allocated.
    pub fn capacity(&self) -> usize {
        self.raw.capacity() + self.frame.capacity()
    }

    /// Compresses what was gathered, with this thread's Zstandard context,
    /// and decides (as the encoder does) whether the pack pays.
    pub fn compress(&mut self) {
        let mut keep = false;
        Packer::with(|packer| {
            keep = packer.compress_into(&self.raw, &mut self.frame);
        });
        self.keep = keep;
    }
}

/// [`encode_batch_indexed`] with the batch's pack built already: `pack`
/// is [`Pack::gather`]ed from these `events` with these `options` (then
/// compressed, or not: an uncompressed pack stores every data field
/// verbatim). The bytes are those [`encode_batch_indexed`] writes. A pack
/// whose length is not what these events gather is not used (every data
/// field verbatim): the batch stays readable whatever the caller passed.
pub fn encode_batch_prepacked(
    events: &[Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    pack: &Pack,
    out: &mut Vec<u8>,
    data_ranges: &mut Vec<Option<Range<usize>>>,
) -> Result<(), CodecError> {
    check_contiguous(events)?;
    data_ranges.clear();
    data_ranges.reserve(events.len());
    // A pack gathered from other events would make every packed field
    // decode wrong: never used, whatever the caller did (this batch is
    // then stored with every data field verbatim).
    let gathered: usize = events
        .iter()
        .filter(|ev| packable(ev, options))
        .map(|ev| ev.data.get().len())
        .sum();
    let pack = (options.compress && pack.keep && pack.raw.len() == gathered)
        .then(|| (pack.raw.len(), &pack.frame[..]));
    encode_events(events, prev_time, options, out, Some(data_ranges), pack);
    Ok(())
}

/// Appends to `raw` the data of every event of `events` the pack takes.
fn gather_into(raw: &mut Vec<u8>, events: &[Event<'_>], options: EncodeOptions) {
    raw.clear();
    for ev in events.iter().filter(|ev| packable(ev, options)) {
        raw.extend_from_slice(ev.data.get().as_bytes());
    }
}

/// Fails unless the seqs of `events` are contiguous.
fn check_contiguous(events: &[Event<'_>]) -> Result<(), CodecError> {
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
    /// The level `zstd` is set to.
    level: i32,
}

/// Largest scratch buffer a thread keeps between batches.
const PACKER_KEEP: usize = 4 << 20;

thread_local! {
    static PACKER: RefCell<Packer> = const {
        RefCell::new(Packer::new())
    };
}

impl Packer {
    /// A packer with empty buffers and no context yet.
    const fn new() -> Packer {
        Packer {
            raw: Vec::new(),
            frame: Vec::new(),
            zstd: None,
            level: PACK_LEVEL,
        }
    }

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
            f(&mut Packer::new());
        }
    }

    /// Builds and compresses the pack of `events`; true when it is worth
    /// keeping (then `frame` holds it), false to store all data verbatim.
    fn pack(&mut self, events: &[Event<'_>], options: EncodeOptions) -> bool {
        gather_into(&mut self.raw, events, options);
        let raw = std::mem::take(&mut self.raw);
        let mut frame = std::mem::take(&mut self.frame);
        let keep = self.compress_into(&raw, &mut frame);
        self.raw = raw;
        self.frame = frame;
        keep
    }

    /// Compresses `raw` into `frame` with this packer's context; true when
    /// the pack pays.
    fn compress_into(&mut self, raw: &[u8], frame: &mut Vec<u8>) -> bool {
        let p = raw.len();
        if p <= MIN_PACK_SAVING {
            return false;
        }
        if self.zstd.is_none() {
            // Fails only when zstd cannot allocate its context: store verbatim.
            self.zstd = zstd::bulk::Compressor::new(PACK_LEVEL).ok();
            self.level = PACK_LEVEL;
        }
        let Some(zstd) = self.zstd.as_mut() else {
            return false;
        };
        let level = if p < SMALL_PACK {
            SMALL_PACK_LEVEL
        } else {
            PACK_LEVEL
        };
        if level != self.level {
            if zstd.set_compression_level(level).is_err() {
                return false;
            }
            self.level = level;
        }
        frame.clear();
        frame.reserve(zstd::zstd_safe::compress_bound(p));
        let Ok(z) = zstd.compress_to_buffer(raw, frame) else {
            return false;
        };
        // Both forms write the same per-event lengths and one varint P (0 for
        // no pack, which takes one byte); the pack adds varint Z and Z bytes.
        let cost = z + varint_len(z as u64) + varint_len(p as u64) - 1;
        cost + MIN_PACK_SAVING <= p && p <= pack_limit(z)
    }
}

/// The body of [`encode`], after the seqs are checked. `pack` is this
/// batch's pack, when there is one: its decoded length and its frame.
fn encode_events(
    events: &[Event<'_>],
    prev_time: i64,
    options: EncodeOptions,
    out: &mut Vec<u8>,
    mut data_ranges: Option<&mut Vec<Option<Range<usize>>>>,
    pack: Option<(usize, &[u8])>,
) {
    let start = out.len();
    match pack {
        Some((raw_len, frame)) => {
            put_varint(out, raw_len as u64);
            put_bytes(out, frame);
        }
        None => put_varint(out, 0),
    }
    let mut types: FxHashMap<&str, usize> = FxHashMap::default();
    // Runs of one type are the common case (a streamed answer's chunks), so
    // the previous event's type is asked first: a string compare where the
    // map costs a hash, a probe and the same compare.
    let mut last: Option<(&str, usize)> = None;
    let mut prev_time = prev_time;
    for ev in events {
        let mut flags = 0u8;
        let kind: &str = &ev.kind;
        let (type_id, new_type) = match last {
            Some((k, id)) if k == kind => (id, false),
            _ => match types.get(kind) {
                Some(&id) => (id, false),
                None => {
                    let id = types.len();
                    types.insert(kind, id);
                    flags |= F_NEW_TYPE;
                    (id, true)
                }
            },
        };
        last = Some((kind, type_id));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` bytes of JSON-like text: a repeated frame (matches) around
    /// words of 16 letters (literals that a Huffman table halves).
    fn text(len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 64);
        let mut x: u32 = 12345;
        while out.len() < len {
            out.extend_from_slice(br#"{"type":"assistant/chunk","text":""#);
            for _ in 0..48 {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                out.push(b'a' + (x >> 16) as u8 % 16);
            }
            out.extend_from_slice(br#""}"#);
        }
        out.truncate(len);
        out
    }

    /// The Literals_Block_Type (RFC 8878 3.1.1.3.1.1: 0 raw, 2 compressed)
    /// of the first block of a one-frame Zstandard `frame`, which must be a
    /// compressed block.
    fn first_literals_type(frame: &[u8]) -> u8 {
        assert_eq!(frame[..4], [0x28, 0xB5, 0x2F, 0xFD], "zstd magic");
        let fhd = frame[4];
        let single_segment = fhd & 0x20 != 0;
        let dict_id = [0, 1, 2, 4][(fhd & 3) as usize];
        let fcs = match fhd >> 6 {
            0 => usize::from(single_segment),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let block = 5 + usize::from(!single_segment) + dict_id + fcs;
        let header = frame[block];
        assert_eq!((header >> 1) & 3, 2, "a compressed block");
        frame[block + 3] & 3
    }

    #[test]
    fn small_packs_store_literals_raw_and_large_ones_compress_them() {
        let mut packer = Packer::new();
        let mut frame = Vec::new();
        for (len, literals) in [(2 << 10, 0), (SMALL_PACK, 2), (1 << 10, 0), (64 << 10, 2)] {
            let raw = text(len);
            assert!(packer.compress_into(&raw, &mut frame), "{len} B pays");
            assert_eq!(first_literals_type(&frame), literals, "{len} B");
            let back = zstd::bulk::decompress(&frame, len).expect("decodes");
            assert_eq!(back, raw);
        }
    }
}
