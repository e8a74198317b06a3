//! The batch codec: round trips (hand-made events, generated events and every
//! fixture event), size over the fixture corpus, and robustness against
//! truncated, corrupted and trailing bytes.
//!
//! The fixture test reads `../shared/fixtures/expected/*.events.jsonl` (or
//! `$SESSIONLOG_FIXTURES/expected`); when absent it prints SKIPPED, unless
//! `SESSIONLOG_REQUIRE_FIXTURES` is set.

use proptest::prelude::*;
use serde_json::value::RawValue;
use sessionlog::codec::{
    BatchDecoder, CodecError, EncodeOptions, PACK_MAX_RATIO, PACK_SLACK, Pack, decode_batch,
    decode_batch_in, encode_batch, encode_batch_indexed, encode_batch_prepacked, encode_batch_with,
};
use sessionlog::event::{Event, OwnedEvent, SurfaceOp};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Events per batch in the size model (the harness flushes small batches).
const BATCH: usize = 16;

/// Record framing (len, crc, trailer) plus the batch header (first_seq, count).
const FRAMING: usize = 12 + 12;

const VERBATIM: EncodeOptions = EncodeOptions {
    compress: false,
    verbatim_surface: false,
};

/// What the store passes.
const STORE: EncodeOptions = EncodeOptions {
    compress: true,
    verbatim_surface: true,
};

fn ev(kind: &str, seq: u64, time: i64, data: &str) -> OwnedEvent {
    OwnedEvent::new(kind, seq, time, data).unwrap()
}

fn encode(events: &[Event<'_>], prev_time: i64, options: EncodeOptions) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch_with(events, prev_time, options, &mut out).unwrap();
    out
}

/// Decodes with the three decoders, checks they agree, returns the events.
fn decode<'a>(
    bytes: &'a [u8],
    first_seq: u64,
    count: usize,
    prev_time: i64,
) -> Result<Vec<Event<'a>>, CodecError> {
    let count = u32::try_from(count).unwrap();
    let vec = decode_batch(bytes, first_seq, count, prev_time);
    let iter: Result<Vec<_>, _> = BatchDecoder::new(bytes, first_seq, count, prev_time).collect();
    assert_eq!(vec, iter, "decode_batch and BatchDecoder disagree");
    // A reused buffer holding another batch's pack, longer than this one's.
    let mut pack = vec![b'x'; 1 << 16];
    let lent = decode_batch_in(bytes, first_seq, count, prev_time, &mut pack);
    assert_eq!(vec, lent, "decode_batch and decode_batch_in disagree");
    if let (Ok(lent), Ok(vec)) = (&lent, &vec) {
        // Every payload is lent, none copied: the ones decode_batch copies
        // out of the pack from the buffer, the others from the batch.
        let batch = bytes.as_ptr_range();
        for (l, v) in lent.iter().zip(vec) {
            assert!(l.data.is_borrowed());
            let in_batch = batch.contains(&l.data.get().as_ptr());
            assert_eq!(in_batch, v.data.is_borrowed(), "{l:?}");
        }
    }
    vec
}

/// Encodes with and without compression and checks the round trip, and the
/// data ranges `encode_batch_indexed` reports.
fn assert_round_trip(events: &[Event<'_>], prev_time: i64) {
    let first_seq = events.first().map_or(7, |e| e.seq);
    for options in [EncodeOptions::default(), VERBATIM, STORE] {
        assert_indexed(events, prev_time, options);
        assert_prepacked(events, prev_time, options);
        let bytes = encode(events, prev_time, options);
        let back = decode(&bytes, first_seq, events.len(), prev_time).unwrap();
        assert_eq!(back, events, "{options:?}");
        // kind always borrows from the input; verbatim data does too.
        let range = bytes.as_ptr_range();
        for e in &back {
            assert!(matches!(e.kind, Cow::Borrowed(_)));
            assert!(range.contains(&e.kind.as_ptr()) || e.kind.is_empty());
            if e.data.is_borrowed() {
                let raw = e.data.get();
                assert!(range.contains(&raw.as_ptr()) || raw.is_empty());
            } else {
                assert!(options.compress, "verbatim data must decode borrowed");
            }
        }
    }
}

/// `encode_batch_indexed` writes what `encode_batch_with` writes, after
/// whatever `out` held, and reports for every event the range of its data in
/// the batch bytes when (and only when) the decoder borrows the data from
/// there: exactly the offset of the decoded `data.get()` pointer, which is
/// what the store used to find by decoding the batch again.
fn assert_indexed(events: &[Event<'_>], prev_time: i64, options: EncodeOptions) {
    let first_seq = events.first().map_or(7, |e| e.seq);
    let plain = encode(events, prev_time, options);
    let prefix = b"earlier bytes";
    let mut out = prefix.to_vec();
    let mut ranges = vec![Some(0..1), None]; // replaced, not appended to
    encode_batch_indexed(events, prev_time, options, &mut out, &mut ranges).unwrap();
    assert_eq!(&out[..prefix.len()], prefix);
    let bytes = &out[prefix.len()..];
    assert_eq!(bytes, plain, "{options:?}: same bytes as encode_batch_with");
    assert_eq!(ranges.len(), events.len());
    let back = decode(bytes, first_seq, events.len(), prev_time).unwrap();
    assert_eq!(back, events);
    let base = bytes.as_ptr() as usize;
    let mut end = 0;
    for (i, (e, range)) in back.iter().zip(&ranges).enumerate() {
        if e.data.is_borrowed() {
            let raw = e.data.get();
            let at = raw.as_ptr() as usize - base;
            assert_eq!(range, &Some(at..at + raw.len()), "{options:?}: event {i}");
            let range = range.clone().unwrap();
            assert!(range.start >= end, "ranges in order, disjoint");
            end = range.end;
            assert_eq!(&bytes[range], events[i].data.get().as_bytes());
        } else {
            assert_eq!(range, &None, "{options:?}: event {i} is packed");
        }
    }
}

/// A pack built apart (gathered, compressed on another thread, as the
/// store does for a large batch) gives the bytes and data ranges of an
/// encode on one thread; a pack gathered but never compressed gives a batch
/// with every data field verbatim, which decodes to the same events.
fn assert_prepacked(events: &[Event<'_>], prev_time: i64, options: EncodeOptions) {
    let first_seq = events.first().map_or(7, |e| e.seq);
    let mut plain = Vec::new();
    let mut plain_ranges = Vec::new();
    encode_batch_indexed(events, prev_time, options, &mut plain, &mut plain_ranges).unwrap();
    let mut pack = Pack::default();
    // Buffers reused from a different batch must not leak into this one.
    pack.gather(&[ev("other", 1, 0, r#""left over""#).borrowed()], options);
    pack.gather(events, options);
    let compressed = std::thread::scope(|scope| {
        scope
            .spawn(move || {
                pack.compress();
                pack
            })
            .join()
            .unwrap()
    });
    let mut out = b"before".to_vec();
    let mut ranges = vec![None];
    encode_batch_prepacked(
        events,
        prev_time,
        options,
        &compressed,
        &mut out,
        &mut ranges,
    )
    .unwrap();
    assert_eq!(&out[6..], plain, "{options:?}: prepacked bytes");
    assert_eq!(ranges, plain_ranges, "{options:?}: prepacked ranges");

    let mut gathered = Pack::default();
    gathered.gather(events, options);
    let mut out = Vec::new();
    encode_batch_prepacked(events, prev_time, options, &gathered, &mut out, &mut ranges).unwrap();
    let back = decode(&out, first_seq, events.len(), prev_time).unwrap();
    assert_eq!(back, events, "{options:?}: an uncompressed pack");
    assert!(back.iter().all(|e| e.data.is_borrowed()), "all verbatim");
    assert_eq!(ranges.iter().flatten().count(), events.len());

    // A pack of other events is never used: the batch is stored verbatim.
    let mut other = Pack::default();
    let big = format!(r#""{}""#, "other ".repeat(500));
    other.gather(&[ev("other", 1, 0, &big).borrowed()], options);
    other.compress();
    let mut out = Vec::new();
    encode_batch_prepacked(events, prev_time, options, &other, &mut out, &mut ranges).unwrap();
    let back = decode(&out, first_seq, events.len(), prev_time).unwrap();
    assert_eq!(back, events, "{options:?}: a pack of other events");
}

fn varied_events() -> Vec<OwnedEvent> {
    let base = u64::MAX - 40;
    let mut events = vec![
        ev("turn/start", base, 1_784_973_850_102, r#"{"turn":1}"#),
        ev(
            "user/message",
            base + 1,
            1_784_973_850_103,
            r#"{"content":[{"type":"text","text":"héllo 😀"}]}"#,
        ),
        ev("tÿpe/ünïcödé/😀", base + 2, -5, r#""just a string""#),
        ev(
            "assistant/message",
            base + 3,
            i64::MIN,
            r#"{"a":1.50,"b":"\u00e9"}"#,
        ),
        ev("assistant/message", base + 4, i64::MAX, r#"[1,2,3]"#),
        ev("tool/result", base + 5, 0, r#"{"content":"x"}"#),
        ev("", base + 6, 1, "null"),
        ev("turn/start", base + 7, 0, r#"{"turn":2}"#),
    ];
    events[1].surface_op = Some(SurfaceOp::Append);
    events[1].source_event_seqs = Some(vec![]);
    events[2].ignorable = true;
    events[2].source_event_seqs = Some(vec![0, u64::MAX, base + 2, base + 30, 5]);
    events[3].surface_op = Some(SurfaceOp::Replace {
        start: 0,
        end: u64::MAX,
    });
    events[3].source_event_seqs = Some(vec![base + 1, base]);
    events[4].surface_op = Some(SurfaceOp::Replace {
        start: base,
        end: base + 3,
    });
    events[4].ignorable = true;
    events[5].surface_op = Some(SurfaceOp::Append);
    events[6].ignorable = true;
    // A run of chunks that share everything but the text, and one large,
    // repetitive payload: the compressed paths.
    let mut seq = base + 8;
    for (i, text) in ["The", " user", " wants", " me", " to \\\"quote\\\" ünï"]
        .iter()
        .enumerate()
    {
        events.push(ev(
            "assistant/chunk",
            seq,
            1_784_973_850_200 + i as i64 * 3,
            &format!(
                r#"{{"turn":1,"step":1,"chunk":{{"type":"reasoning-delta","index":0,"text":"{text}"}}}}"#
            ),
        ));
        seq += 1;
    }
    let big = format!(
        r#"{{"header":{{"tools":[{}]}}}}"#,
        (0..50)
            .map(|i| format!(r#"{{"name":"tool{i}","description":"does thing {i}"}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    events.push(ev("request/header", seq, 1_784_973_850_100, &big));
    events.push(ev("request/header", seq + 1, 1_784_973_850_101, &big));
    events
}

#[test]
fn round_trip_varied_events() {
    let events = varied_events();
    for prev_time in [0, -1, i64::MIN, i64::MAX, 1_784_973_850_000] {
        assert_round_trip(&events, prev_time);
    }
    // Every sub-batch, including the empty one and single events.
    for start in 0..events.len() {
        for end in start..=events.len() {
            assert_round_trip(&events[start..end], 3);
        }
    }
}

#[test]
fn compression_paths_are_used_and_exact() {
    let events = varied_events();
    let bytes = encode(&events, 0, EncodeOptions::default());
    let verbatim = encode(&events, 0, VERBATIM);
    assert!(
        bytes.len() < verbatim.len() * 3 / 4,
        "{} vs {}",
        bytes.len(),
        verbatim.len()
    );
    let back = decode(&bytes, events[0].seq, events.len(), 0).unwrap();
    let owned = back.iter().filter(|e| !e.data.is_borrowed()).count();
    assert!(owned >= 4, "chunks and the repeated header are compressed");
    assert_eq!(back, events);
}

#[test]
fn one_pack_serves_many_events_of_many_types() {
    // Events of three types interleaved: each takes its slice of the pack in
    // order; message events (surfaceOp) stay out of it with the store's
    // options.
    let mut events = Vec::new();
    for i in 0..80u64 {
        let kind = ["a/x", "b/y", "c/z"][(i % 7 % 3) as usize];
        let data = format!(
            r#"{{"turn":{},"payload":"{}","i":{i}}}"#,
            i / 9,
            "abc".repeat((i % 5) as usize * 10)
        );
        events.push(ev(kind, i, i as i64 * 1000, &data));
    }
    assert_round_trip(&events, 0);
    for e in events.iter_mut().step_by(5) {
        e.surface_op = Some(SurfaceOp::Append);
    }
    assert_round_trip(&events, 0);
    let bytes = encode(&events, 0, STORE);
    let back = decode(&bytes, 0, events.len(), 0).unwrap();
    for (i, e) in back.iter().enumerate() {
        assert_eq!(
            e.data.is_borrowed(),
            i % 5 == 0,
            "event {i}: only messages are verbatim"
        );
    }
}

#[test]
fn non_contiguous_seqs_are_refused_and_append_nothing() {
    let mut events = varied_events();
    events[3].seq += 1;
    let mut out = vec![1, 2, 3];
    let err = encode_batch(&events, 0, &mut out).unwrap_err();
    assert!(
        matches!(err, CodecError::NonContiguous { index: 3, .. }),
        "{err}"
    );
    assert_eq!(out, [1, 2, 3]);
    // Seqs may not wrap around u64::MAX either.
    let wrap = [ev("x", u64::MAX, 0, "1"), ev("x", 0, 0, "2")];
    assert!(encode_batch(&wrap, 0, &mut out).is_err());
    // encode_batch appends.
    let events = varied_events();
    encode_batch(&events, 0, &mut out).unwrap();
    assert_eq!(&out[..3], [1, 2, 3]);
    assert_eq!(
        decode(&out[3..], events[0].seq, events.len(), 0).unwrap(),
        events
    );
}

#[test]
fn indexed_encoding_changes_nothing_on_error() {
    let mut events = varied_events();
    events[2].seq += 1;
    let mut out = vec![1, 2, 3];
    let mut ranges = vec![Some(5..7)];
    let err = encode_batch_indexed(&events, 0, STORE, &mut out, &mut ranges).unwrap_err();
    assert!(matches!(err, CodecError::NonContiguous { index: 2, .. }));
    assert_eq!(out, [1, 2, 3]);
    assert_eq!(ranges, [Some(5..7)]);
    // An empty batch: its pack header ("none"), no ranges.
    encode_batch_indexed(&[], 0, STORE, &mut out, &mut ranges).unwrap();
    assert_eq!(out, [1, 2, 3, 0]);
    assert!(ranges.is_empty());
}

#[test]
fn repeated_data_is_packed() {
    // The same 1 KiB payload again and again (within and across types), a
    // long run of one byte, and a payload that only extends the previous one.
    let big = format!(r#"{{"text":"{}"}}"#, "the quick brown fox ".repeat(50));
    let run = format!(r#""{}""#, "x".repeat(5000));
    let mut events = Vec::new();
    for i in 0..40u64 {
        let data = match i % 4 {
            0 | 1 => big.clone(),
            2 => run.clone(),
            _ => format!(
                r#"{{"text":"{}","more":{i}}}"#,
                "the quick brown fox ".repeat(50)
            ),
        };
        events.push(ev(["a", "b"][(i % 2) as usize], i, 0, &data));
    }
    assert_round_trip(&events, 0);
    let bytes = encode(&events, 0, EncodeOptions::default());
    let verbatim = encode(&events, 0, VERBATIM);
    assert!(
        bytes.len() * 20 < verbatim.len(),
        "{} vs {}",
        bytes.len(),
        verbatim.len()
    );
    let back = decode(&bytes, 0, events.len(), 0).unwrap();
    let owned = back.iter().filter(|e| !e.data.is_borrowed()).count();
    assert_eq!(owned, 40, "{owned} of 40 packed");
}

#[test]
fn every_truncation_is_an_error() {
    let events = varied_events();
    for options in [EncodeOptions::default(), VERBATIM] {
        let bytes = encode(&events, 0, options);
        for cut in 0..bytes.len() {
            let res = decode(&bytes[..cut], events[0].seq, events.len(), 0);
            assert!(
                matches!(res, Err(CodecError::Corrupt { .. })),
                "prefix of {cut} bytes decoded"
            );
        }
    }
}

#[test]
fn every_single_byte_corruption_is_handled() {
    // Every position, every bit, and +-1 (which hits lengths, offsets and ids
    // exactly): no panic, both decoders agree, and in the verbatim encoding a
    // change that still decodes yields different events (nothing is silently
    // ignored; in a compressed pack a change may legitimately rebuild the
    // same bytes, and the store's record CRC is what catches it there).
    let events = varied_events();
    let first = events[0].seq;
    for options in [EncodeOptions::default(), VERBATIM] {
        let bytes = encode(&events, 0, options);
        let mut decoded_ok = 0;
        for i in 0..bytes.len() {
            let mut variants: Vec<u8> = (0..8).map(|bit| bytes[i] ^ (1 << bit)).collect();
            variants.extend([bytes[i].wrapping_add(1), bytes[i].wrapping_sub(1)]);
            for v in variants {
                let mut bad = bytes.clone();
                bad[i] = v;
                if let Ok(back) = decode(&bad, first, events.len(), 0) {
                    if !options.compress {
                        assert!(back != events, "byte {i} changed to {v} was ignored");
                    }
                    decoded_ok += 1;
                }
            }
        }
        assert!(
            decoded_ok > 0,
            "some corruptions (in data text) still decode"
        );
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let events = varied_events();
    let first = events[0].seq;
    let mut bytes = encode(&events, 0, EncodeOptions::default());
    let len = bytes.len();
    // One event fewer than encoded: the last event is left over (and its
    // slice of the pack, checked first).
    assert!(matches!(
        decode(&bytes, first, events.len() - 1, 0),
        Err(CodecError::Corrupt { reason, .. }) if reason.contains("pack data left over")
    ));
    let verbatim = encode(&events, 0, VERBATIM);
    assert!(matches!(
        decode(&verbatim, first, events.len() - 1, 0),
        Err(CodecError::Corrupt { reason, .. }) if reason.contains("trailing")
    ));
    bytes.push(0);
    assert_eq!(
        decode(&bytes, first, events.len(), 0),
        Err(CodecError::Corrupt {
            offset: len,
            reason: "trailing bytes after the last event"
        })
    );
    // The iterator yields every event, then the error; finish() agrees.
    let mut it = BatchDecoder::new(&bytes, first, events.len() as u32, 0);
    for _ in 0..events.len() {
        it.next().unwrap().unwrap();
    }
    assert!(it.finish().is_err());
    assert!(matches!(it.next(), Some(Err(CodecError::Corrupt { offset, .. })) if offset == len));
    assert!(it.next().is_none());
    // An empty batch is its pack header, "no pack".
    assert_eq!(encode(&[], 0, EncodeOptions::default()), [0]);
    assert_eq!(decode(&[0], 0, 0, 0).unwrap(), vec![]);
    assert!(decode(&[], 0, 0, 0).is_err());
    assert!(decode(&[0, 0], 0, 0, 0).is_err());
}

#[test]
fn unknown_and_conflicting_flags_are_rejected() {
    let events = [ev("x", 0, 0, r#"{"a":1}"#)];
    let bytes = encode(&events, 0, VERBATIM);
    // Byte 0 is the pack header (0: none); the event's flags follow.
    assert_eq!(bytes[0], 0);
    for bit in [6, 7] {
        let mut bad = bytes.clone();
        bad[1] |= 1 << bit;
        assert_eq!(
            decode(&bad, 0, 1, 0),
            Err(CodecError::Corrupt {
                offset: 1,
                reason: "unknown flag bits"
            })
        );
    }
    let mut bad = bytes.clone();
    bad[1] |= 0b110; // append and replace
    assert!(matches!(
        decode(&bad, 0, 1, 0),
        Err(CodecError::Corrupt { offset: 1, reason }) if reason.contains("append and replace")
    ));
    // The packed flag without a pack: the data length exceeds the (empty)
    // pack.
    let mut bad = bytes.clone();
    bad[1] |= 1 << 5;
    assert!(matches!(
        decode(&bad, 0, 1, 0),
        Err(CodecError::Corrupt { reason, .. }) if reason.contains("exceeds the pack")
    ));
}

#[test]
fn bad_utf8_and_bad_references_are_rejected() {
    let events = [ev("ab", 0, 0, r#""ok""#), ev("ab", 1, 0, r#""ok""#)];
    let bytes = encode(&events, 0, VERBATIM);
    // pack 0, flags, len 2, "ab": break the type's UTF-8.
    let mut bad = bytes.clone();
    assert_eq!(&bad[2..5], b"\x02ab");
    bad[3] = 0xff;
    assert!(matches!(
        decode(&bad, 0, 2, 0),
        Err(CodecError::Corrupt { offset: 3, reason }) if reason.contains("UTF-8")
    ));
    // The second event refers to type id 0; make it id 1 (undefined).
    let second = 1 + 1 + 3 + 1 + 5; // pack, flags, len + "ab", time, len + "\"ok\""
    assert_eq!(bytes[second..second + 2], [0, 0]);
    let mut bad = bytes.clone();
    bad[second + 1] = 1;
    assert!(matches!(
        decode(&bad, 0, 2, 0),
        Err(CodecError::Corrupt {
            reason: "unknown type id",
            ..
        })
    ));
    // Data that is UTF-8 but not JSON: accepted by default (the CRC vouches
    // for it), rejected when validation is asked for.
    let mut bad = bytes.clone();
    let last = bad.len() - 1;
    assert_eq!(bad[last], b'"');
    bad[last] = b'x';
    assert!(decode(&bad, 0, 2, 0).is_ok());
    let checked: Result<Vec<_>, _> = BatchDecoder::new(&bad, 0, 2, 0)
        .validate_json(true)
        .collect();
    assert!(matches!(
        checked,
        Err(CodecError::Corrupt {
            reason: "data is not valid JSON",
            ..
        })
    ));
    let checked: Result<Vec<_>, _> = BatchDecoder::new(&bytes, 0, 2, 0)
        .validate_json(true)
        .collect();
    assert_eq!(checked.unwrap(), events);
}

#[test]
fn huge_counts_and_lengths_do_not_allocate() {
    // A tiny input claiming u32::MAX events, a huge source count, a huge
    // pack: errors, quickly, without trying to reserve the claimed sizes.
    assert!(decode_batch(&[0, 0x10, 1, b'x', 0, 1, b'1'], 0, u32::MAX, 0).is_err());
    let huge_sources = [0, 0x11, 1, b'x', 0, 0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(decode_batch(&huge_sources, 0, 1, 0).is_err());
    let huge_pack = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 0];
    assert!(matches!(
        decode_batch(&huge_pack, 0, 0, 0),
        Err(CodecError::Corrupt {
            offset: 0,
            reason: "pack length out of range"
        })
    ));
}

/// A batch whose pack is `frame`, stated to decode to `p` bytes, followed
/// by one event of type "x" whose `n` bytes of data are packed.
fn batch_with_pack(p: usize, frame: &[u8], n: usize) -> Vec<u8> {
    fn put(out: &mut Vec<u8>, mut v: usize) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = Vec::new();
    put(&mut out, p);
    put(&mut out, frame.len());
    out.extend_from_slice(frame);
    // flags: new type, packed; type "x"; time delta 0; data length n.
    out.extend_from_slice(&[0x10 | 0x20, 1, b'x', 0]);
    put(&mut out, n);
    out
}

#[test]
fn pack_headers_are_checked() {
    let data = br#"{"text":"hello hello hello hello hello"}"#;
    let frame = zstd::bulk::compress(data, 1).unwrap();
    let good = batch_with_pack(data.len(), &frame, data.len());
    let back = decode(&good, 0, 1, 0).unwrap();
    assert_eq!(back[0].data.get().as_bytes(), data);
    assert!(!back[0].data.is_borrowed());
    let reason = |bytes: &[u8]| match decode(bytes, 0, 1, 0) {
        Err(CodecError::Corrupt { reason, .. }) => reason,
        other => panic!("decoded: {other:?}"),
    };
    // The stated length disagrees with the frame, either way.
    assert_eq!(
        reason(&batch_with_pack(data.len() + 1, &frame, data.len())),
        "pack decodes to another length than stated"
    );
    assert_eq!(
        reason(&batch_with_pack(data.len() - 1, &frame, data.len() - 1)),
        "pack is not valid Zstandard data"
    );
    // The event takes less or more than the pack holds.
    assert_eq!(
        reason(&batch_with_pack(data.len(), &frame, data.len() - 1)),
        "pack data left over after the last event"
    );
    assert_eq!(
        reason(&batch_with_pack(data.len(), &frame, data.len() + 1)),
        "packed data length exceeds the pack"
    );
    // Not Zstandard at all.
    assert_eq!(
        reason(&batch_with_pack(4, b"abcdefgh", 4)),
        "pack is not valid Zstandard data"
    );
    // Packed data must be UTF-8, sliced per event.
    let frame = zstd::bulk::compress(b"\xff\xfe", 1).unwrap();
    assert_eq!(
        reason(&batch_with_pack(2, &frame, 2)),
        "packed data is not UTF-8"
    );
    // The ratio bound: a frame of Z bytes may state at most 32 Z + 1 MiB.
    let zeros = vec![b' '; PACK_SLACK + 64 * 1024];
    let frame = zstd::bulk::compress(&zeros, 1).unwrap();
    assert!(frame.len() * PACK_MAX_RATIO + PACK_SLACK < zeros.len());
    assert_eq!(
        reason(&batch_with_pack(zeros.len(), &frame, zeros.len())),
        "pack length out of range"
    );
}

#[test]
fn batch_decoder_reports_a_bad_pack_first_and_again_from_finish() {
    let bad_frame = batch_with_pack(4, b"abcdefgh", 4);
    // A batch of no events whose only content is a bad pack header, too.
    let header_only = &bad_frame[..bad_frame.len() - 5];
    for (bytes, count) in [(&bad_frame[..], 1), (header_only, 0)] {
        let mut it = BatchDecoder::new(bytes, 0, count, 0);
        let first = it.next().expect("an item");
        let Err(CodecError::Corrupt { reason, .. }) = &first else {
            panic!("first item: {first:?}");
        };
        assert_eq!(*reason, "pack is not valid Zstandard data");
        assert!(it.next().is_none(), "nothing after the error");
        assert_eq!(it.finish(), first.map(|_| ()), "finish repeats it");
    }
}

#[test]
fn data_too_compressible_for_the_ratio_bound_is_stored_verbatim() {
    // 2 MiB of spaces compress far beyond 32x: the encoder must not write a
    // pack the decoder refuses, so it stores the data verbatim.
    let big = format!(r#""{}""#, " ".repeat(PACK_SLACK * 2));
    let events = [ev("x", 0, 0, &big), ev("x", 1, 0, &big)];
    let bytes = encode(&events, 0, EncodeOptions::default());
    assert_eq!(bytes[0], 0, "no pack");
    let back = decode(&bytes, 0, 2, 0).unwrap();
    assert_eq!(back, events);
    assert!(back.iter().all(|e| e.data.is_borrowed()));
    // Below the slack, the same data packs.
    let small = format!(r#""{}""#, " ".repeat(PACK_SLACK / 4));
    let events = [ev("x", 0, 0, &small), ev("x", 1, 0, &small)];
    let bytes = encode(&events, 0, EncodeOptions::default());
    assert!(bytes.len() < 1000, "{}", bytes.len());
    assert_eq!(decode(&bytes, 0, 2, 0).unwrap(), events);
}

// ---------------------------------------------------------------- proptest

fn arb_json() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "\\PC{0,12}".prop_map(serde_json::Value::from),
        prop::sample::select(vec!["text-delta", "reasoning-delta", " the", "{{tools}}"])
            .prop_map(serde_json::Value::from),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::vec(
                (
                    prop::sample::select(vec!["turn", "step", "chunk", "text", "ü"]),
                    inner
                ),
                0..4
            )
            .prop_map(|kv| serde_json::Value::Object(
                kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    });
    value.prop_map(|v| serde_json::to_string(&v).unwrap())
}

fn arb_event() -> impl Strategy<Value = OwnedEvent> {
    (
        prop_oneof![
            prop::sample::select(vec!["assistant/chunk", "user/message", "tool/result"])
                .prop_map(str::to_owned),
            "\\PC{0,6}",
        ],
        prop_oneof![any::<i64>(), -5i64..5],
        arb_json(),
        prop::option::of(prop::collection::vec(
            prop_oneof![any::<u64>(), 0u64..64],
            0..4,
        )),
        prop_oneof![
            Just(None),
            Just(Some(SurfaceOp::Append)),
            (any::<u64>(), any::<u64>())
                .prop_map(|(start, end)| Some(SurfaceOp::Replace { start, end })),
        ],
        any::<bool>(),
    )
        .prop_map(|(kind, time, data, sources, op, ignorable)| {
            let mut e = ev(&kind, 0, time, &data);
            e.source_event_seqs = sources;
            e.surface_op = op;
            e.ignorable = ignorable;
            e
        })
}

fn arb_batch() -> impl Strategy<Value = (Vec<OwnedEvent>, i64)> {
    (
        prop_oneof![any::<u64>(), 0u64..100],
        prop::collection::vec(arb_event(), 0..40),
        any::<i64>(),
        any::<bool>(),
    )
        .prop_map(|(first, mut events, prev_time, ascending)| {
            let first = first.min(u64::MAX - events.len() as u64);
            let mut t = prev_time;
            for (i, e) in events.iter_mut().enumerate() {
                e.seq = first + i as u64;
                if ascending {
                    t = t.wrapping_add(e.time.rem_euclid(1000));
                    e.time = t;
                }
            }
            (events, prev_time)
        })
}

/// Text that repeats within and across events: a few fragments (JSON-looking
/// text, escapes, multi-byte characters), random words, and runs.
fn arb_repetitive_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            prop::sample::select(vec![
                r#"{"turn":1,"step":2,"chunk":{"type":"text-delta","index":0,"text":""#,
                " the",
                " file",
                "\"quoted\"",
                "\n",
                "ü😀",
                "0123456789abcdef",
            ])
            .prop_map(str::to_owned),
            "[a-z ]{1,12}",
            (
                prop::sample::select(vec!["x", "ab", "abc", "0123456"]),
                1usize..300
            )
                .prop_map(|(s, n)| s.repeat(n)),
        ],
        0..30,
    )
    .prop_map(|parts| parts.concat())
}

/// How an event's text is made: fresh, or an earlier event's text (by index
/// back from this one) with a piece cut out and another put in.
#[derive(Debug, Clone)]
enum Recipe {
    Fresh(String),
    Edit {
        back: prop::sample::Index,
        at: prop::sample::Index,
        cut: usize,
        insert: String,
    },
}

fn arb_repetitive_batch() -> impl Strategy<Value = Vec<OwnedEvent>> {
    let recipe = prop_oneof![
        1 => arb_repetitive_text().prop_map(Recipe::Fresh),
        3 => (any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0usize..20, "[a-z0-9]{0,6}")
            .prop_map(|(back, at, cut, insert)| Recipe::Edit { back, at, cut, insert }),
    ];
    let event = (
        prop::sample::select(vec!["a", "b", "c", "tool/result"]),
        recipe,
        prop::sample::select(vec![None, Some(SurfaceOp::Append)]),
    );
    prop::collection::vec(event, 0..60).prop_map(|events| {
        let mut texts: Vec<Vec<char>> = Vec::new();
        events
            .into_iter()
            .enumerate()
            .map(|(i, (kind, recipe, op))| {
                let text = match recipe {
                    Recipe::Edit {
                        back,
                        at,
                        cut,
                        insert,
                    } if !texts.is_empty() => {
                        let mut t = texts[i - 1 - back.index(texts.len().min(20))].clone();
                        let at = at.index(t.len() + 1);
                        t.splice(at..(at + cut).min(t.len()), insert.chars());
                        t
                    }
                    Recipe::Edit { insert, .. } => insert.chars().collect(),
                    Recipe::Fresh(text) => text.chars().collect(),
                };
                let s: String = text.iter().collect();
                texts.push(text);
                let data = if i % 3 == 0 {
                    serde_json::to_string(&s).unwrap()
                } else {
                    serde_json::json!({ "turn": i % 4, "text": s }).to_string()
                };
                let mut e = ev(kind, 1000 + i as u64, i as i64, &data);
                e.surface_op = op;
                e
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn repetitive_batches_round_trip(events in arb_repetitive_batch()) {
        // Every form, and the reported data ranges (assert_round_trip).
        assert_round_trip(&events, -3);
    }

    #[test]
    fn generated_batches_round_trip((events, prev_time) in arb_batch()) {
        assert_round_trip(&events, prev_time);
    }

    #[test]
    fn byte_flips_never_panic(
        (events, prev_time) in arb_batch(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..5),
        compress in any::<bool>(),
    ) {
        let mut bytes = encode(&events, prev_time, EncodeOptions {
                compress,
                verbatim_surface: false,
            });
        prop_assume!(!bytes.is_empty());
        for (at, mask) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= mask;
        }
        let first = events.first().map_or(0, |e| e.seq);
        // Ok or Err are both fine; both decoders must agree and not panic.
        let _ = decode(&bytes, first, events.len(), prev_time);
        let _: Vec<_> = BatchDecoder::new(&bytes, first, events.len() as u32, prev_time)
            .validate_json(true)
            .collect();
    }

    #[test]
    fn random_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        first in any::<u64>(),
        count in prop_oneof![0u32..50, any::<u32>()],
        prev_time in any::<i64>(),
    ) {
        let _ = decode_batch(&bytes, first, count, prev_time);
        let _ = BatchDecoder::new(&bytes, first, count, prev_time).take(60).count();
        let mut pack = vec![0xff; 64];
        let _ = decode_batch_in(&bytes, first, count, prev_time, &mut pack);
    }
}

// ---------------------------------------------------------------- fixtures

fn fixture_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("SESSIONLOG_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures"))
        .join("expected");
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("SESSIONLOG_REQUIRE_FIXTURES").is_none(),
        "fixtures required but not found at {}",
        dir.display()
    );
    println!("SKIPPED: fixtures not found at {}", dir.display());
    None
}

/// Each `*.events.jsonl` file's text (header line included).
fn fixture_texts() -> Option<Vec<(String, String)>> {
    let dir = fixture_dir()?;
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".events.jsonl"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.events.jsonl in {}", dir.display());
    Some(
        files
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).unwrap();
                (p.file_name().unwrap().to_string_lossy().into_owned(), text)
            })
            .collect(),
    )
}

/// The events of one file (header skipped) and their JSONL size in bytes.
fn parse_session(name: &str, text: &str) -> (Vec<Event<'static>>, usize) {
    let mut jsonl = 0;
    let events = text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            jsonl += line.len() + 1;
            Event::from_json(line)
                .unwrap_or_else(|v| panic!("{name}: {v}"))
                .into_owned()
        })
        .collect();
    (events, jsonl)
}

/// One encoded batch: bytes, first_seq, count, prev_time.
type Batch = (Vec<u8>, u64, usize, i64);

fn encode_session(events: &[Event<'_>], options: EncodeOptions) -> Vec<Batch> {
    let mut prev_time = 0;
    events
        .chunks(BATCH)
        .map(|chunk| {
            let bytes = encode(chunk, prev_time, options);
            let batch = (bytes, chunk[0].seq, chunk.len(), prev_time);
            prev_time = chunk.last().unwrap().time;
            batch
        })
        .collect()
}

/// The bytes a segment-wide type table would save over defining types in
/// every batch: per batch, each type already defined by an earlier batch of
/// the session costs its inline definition instead of an id.
fn self_contained_type_cost(events: &[Event<'_>]) -> usize {
    fn vlen(v: usize) -> usize {
        (usize::BITS as usize - (v | 1).leading_zeros() as usize).div_ceil(7)
    }
    let mut segment: Vec<&str> = Vec::new();
    let mut cost = 0;
    for chunk in events.chunks(BATCH) {
        let mut batch: Vec<&str> = Vec::new();
        for e in chunk {
            if batch.contains(&&*e.kind) {
                continue;
            }
            batch.push(&e.kind);
            match segment.iter().position(|k| *k == e.kind) {
                Some(id) => cost += vlen(e.kind.len()) + e.kind.len() - vlen(id),
                None => segment.push(&e.kind),
            }
        }
    }
    cost
}

#[test]
fn fixture_events_round_trip_and_size() {
    let Some(texts) = fixture_texts() else { return };
    let (mut jsonl, mut n_events, mut n_batches) = (0usize, 0usize, 0usize);
    let (mut packed, mut verbatim, mut type_cost) = (0usize, 0usize, 0usize);
    // What the store writes: data packed, but message events verbatim.
    let mut store_form = 0usize;
    let store_options = EncodeOptions {
        compress: true,
        verbatim_surface: true,
    };
    let (mut borrowed, mut owned) = (0usize, 0usize);
    for (name, text) in &texts {
        let (events, size) = parse_session(name, text);
        if events.is_empty() {
            continue;
        }
        jsonl += size;
        n_events += events.len();
        type_cost += self_contained_type_cost(&events);
        for (options, total) in [
            (EncodeOptions::default(), &mut packed),
            (VERBATIM, &mut verbatim),
            (store_options, &mut store_form),
        ] {
            let batches = encode_session(&events, options);
            let mut decoded = Vec::with_capacity(events.len());
            for (bytes, first, count, prev_time) in &batches {
                *total += bytes.len() + FRAMING;
                let back = decode(bytes, *first, *count, *prev_time)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                if options == EncodeOptions::default() {
                    for e in &back {
                        if e.data.is_borrowed() {
                            borrowed += 1;
                        } else {
                            owned += 1;
                        }
                    }
                }
                decoded.extend(back.into_iter().map(Event::into_owned));
            }
            assert_eq!(decoded, events, "{name}: {options:?}");
            if options == EncodeOptions::default() {
                n_batches += batches.len();
            }
            if options == store_options {
                for (bytes, first, count, prev_time) in &batches {
                    for e in decode(bytes, *first, *count, *prev_time).unwrap() {
                        assert!(
                            e.surface_op.is_none() || e.data.is_borrowed(),
                            "{name}: message event {} was not stored verbatim",
                            e.seq
                        );
                    }
                }
            }
        }
    }
    let ratio = |n: usize| n as f64 / jsonl as f64;
    println!(
        "codec over {} fixture sessions: {n_events} events in {n_batches} batches of <= {BATCH}, \
         framing {FRAMING} B/batch",
        texts.len()
    );
    println!("  plain JSONL            {jsonl:>9} B");
    println!(
        "  verbatim data          {verbatim:>9} B  ratio {:.4}",
        ratio(verbatim)
    );
    println!(
        "  packed data            {packed:>9} B  ratio {:.4}  (data borrowed {borrowed}, owned {owned})",
        ratio(packed)
    );
    println!(
        "  store form (messages verbatim) {store_form:>9} B  ratio {:.4}",
        ratio(store_form)
    );
    println!(
        "  per-batch type tables cost {type_cost} B over a segment-wide table: {:.2}% of verbatim, \
         {:.2}% of packed",
        100.0 * type_cost as f64 / verbatim as f64,
        100.0 * type_cost as f64 / packed as f64,
    );
    assert!(
        ratio(packed) <= 0.5,
        "size target missed: {:.4}",
        ratio(packed)
    );
    assert!(packed < verbatim);
    assert!(
        ratio(store_form) <= 0.5,
        "size target missed by the store's form: {:.4}",
        ratio(store_form)
    );
}

#[test]
fn fixture_batch_truncations_are_errors() {
    let Some(texts) = fixture_texts() else { return };
    // A few sessions' first batches, compressed and verbatim.
    for (name, text) in texts.iter().step_by(10) {
        let (events, _) = parse_session(name, text);
        for options in [EncodeOptions::default(), VERBATIM] {
            for (bytes, first, count, prev_time) in encode_session(&events, options).iter().take(2)
            {
                for cut in 0..bytes.len() {
                    assert!(
                        decode(&bytes[..cut], *first, *count, *prev_time).is_err(),
                        "{name}: prefix of {cut} decoded"
                    );
                }
            }
        }
    }
}

/// Throughput, for the record (run with `--release -- --ignored --nocapture`).
#[test]
#[ignore]
fn fixture_throughput() {
    let Some(texts) = fixture_texts() else { return };
    let sessions: Vec<_> = texts.iter().map(|(n, t)| parse_session(n, t).0).collect();
    let data_bytes: usize = sessions.iter().flatten().map(|e| e.data.get().len()).sum();
    const ROUNDS: usize = 20;
    for options in [EncodeOptions::default(), VERBATIM] {
        let t = Instant::now();
        let mut encoded = Vec::new();
        for _ in 0..ROUNDS {
            encoded = sessions
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| encode_session(s, options))
                .collect::<Vec<_>>();
        }
        let enc = t.elapsed() / ROUNDS as u32;
        let mut timings = Vec::new();
        for validate in [false, true] {
            let t = Instant::now();
            let mut n = 0;
            for _ in 0..ROUNDS {
                for batches in &encoded {
                    for (bytes, first, count, prev) in batches {
                        for e in BatchDecoder::new(bytes, *first, *count as u32, *prev)
                            .validate_json(validate)
                        {
                            n += e.unwrap().data.get().len();
                        }
                    }
                }
            }
            assert_eq!(n, data_bytes * ROUNDS);
            timings.push(t.elapsed() / ROUNDS as u32);
        }
        let t = Instant::now();
        for _ in 0..ROUNDS {
            for batches in &encoded {
                for (bytes, first, count, prev) in batches {
                    let evs = decode_batch(bytes, *first, *count as u32, *prev).unwrap();
                    assert_eq!(evs.len(), *count);
                }
            }
        }
        let vec_time = t.elapsed() / ROUNDS as u32;
        let mbps = |d: std::time::Duration| data_bytes as f64 / d.as_secs_f64() / 1e6;
        println!(
            "{options:?}: encode {enc:?} ({:.0} MB/s of data), decode_batch {vec_time:?} ({:.0} MB/s), \
             iterator {:?} ({:.0} MB/s), iterator+validate_json {:?} ({:.0} MB/s)",
            mbps(enc),
            mbps(vec_time),
            timings[0],
            mbps(timings[0]),
            timings[1],
            mbps(timings[1]),
        );
    }
    // serde_json's checked borrowed constructor alone, for comparison.
    let t = Instant::now();
    for _ in 0..ROUNDS {
        for e in sessions.iter().flatten() {
            let raw: &RawValue = serde_json::from_str(e.data.get()).unwrap();
            std::hint::black_box(raw);
        }
    }
    let d = t.elapsed() / ROUNDS as u32;
    println!(
        "serde_json::from_str::<&RawValue> over all data: {d:?} ({:.0} MB/s)",
        data_bytes as f64 / d.as_secs_f64() / 1e6
    );
}
