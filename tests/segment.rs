//! Integration tests of the segment file layer, through its public API only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sessionlog::segment::*;

/// Refuses any single allocation above 256 MiB (the process aborts), so a
/// scanner that sized a buffer from a corrupt length field fails the run.
struct CappedAlloc;

const ALLOC_CAP: usize = 256 << 20;

// SAFETY: every call is forwarded to the system allocator unchanged, except
// that oversized requests report failure with a null pointer, as allowed.
unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_CAP {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: CappedAlloc = CappedAlloc;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn ident(session: u8, first_seq: u64) -> SegmentIdent {
    SegmentIdent {
        store_id: [0x5a; 16],
        session_uid: [session; 16],
        first_seq,
    }
}

/// A batch as the tests see it: first seq, count, codec bytes.
type Batch = (u64, u32, Vec<u8>);

fn opts() -> ScanOptions {
    ScanOptions::default()
}

fn sealed_opts() -> ScanOptions {
    ScanOptions {
        expect_sealed: true,
        ..ScanOptions::default()
    }
}

/// Codec bytes that differ per batch, so swapped or shifted batches show.
fn codec(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8 ^ 0xa5).collect()
}

/// Writes `specs` (count, codec length) as consecutive batches; returns the
/// batches written.
fn write_batches(w: &mut SegmentWriter, specs: &[(u32, usize)]) -> Vec<Batch> {
    let mut out = Vec::new();
    for (i, &(count, len)) in specs.iter().enumerate() {
        let first = w.next_seq();
        let bytes = codec(i, len);
        let before = w.len();
        let loc = w.append(first, count, &bytes).unwrap();
        assert_eq!(loc.offset, before);
        assert_eq!(loc.payload_len as usize, 12 + len);
        out.push((first, count, bytes));
    }
    w.sync().unwrap();
    out
}

fn new_segment(
    dir: &Path,
    id: &SegmentIdent,
    prealloc: u64,
    specs: &[(u32, usize)],
) -> (PathBuf, Vec<Batch>) {
    let path = dir.join(segment_file_name(id.first_seq));
    let mut w = SegmentWriter::create(&path, id, prealloc).unwrap();
    let batches = write_batches(&mut w, specs);
    (path, batches)
}

fn contents(bytes: &[u8], scan: &Scan) -> Vec<Batch> {
    scan.batches
        .iter()
        .map(|b| (b.first_seq, b.count, read_batch_payload(bytes, b).to_vec()))
        .collect()
}

/// The five-batch segment most tests damage.
const FIVE: [(u32, usize); 5] = [(1, 0), (3, 5), (2, 40), (1, 300), (4, 17)];

fn corrupt_offset(r: Result<Scan, SegmentError>) -> u64 {
    match r {
        Err(SegmentError::Corrupt { offset, .. }) => offset,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Naming and header
// ---------------------------------------------------------------------------

#[test]
fn file_names_round_trip() {
    assert_eq!(segment_file_name(42), "00000000000000000042.seg");
    for seq in [0, 1, 42, 1 << 40, u64::MAX] {
        assert_eq!(parse_segment_file_name(&segment_file_name(seq)), Some(seq));
    }
    for bad in [
        "42.seg",
        "0000000000000000004.seg",
        "000000000000000000042.seg",
        "0000000000000000004x.seg",
        "00000000000000000042.log",
        "00000000000000000042",
        "+0000000000000000042.seg",
        "99999999999999999999.seg", // overflows u64
    ] {
        assert_eq!(parse_segment_file_name(bad), None, "{bad}");
    }
}

#[test]
fn header_identity_and_version_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(1, 100);
    let (path, _) = new_segment(dir.path(), &id, 0, &FIVE);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(read_header(&bytes).unwrap(), id);

    // Misplaced file: every identity field matters.
    for other in [
        ident(2, 100),
        ident(1, 101),
        SegmentIdent {
            store_id: [0; 16],
            ..id
        },
    ] {
        assert_eq!(corrupt_offset(scan(&bytes, &other, &opts())), 12);
    }

    // Version 1 (records without packs) and a newer one are refused by name.
    for found in [1u16, FORMAT_VERSION + 1] {
        let mut other = bytes.clone();
        other[8..10].copy_from_slice(&found.to_le_bytes());
        assert!(matches!(
            scan(&other, &id, &opts()),
            Err(SegmentError::UnsupportedVersion {
                found: f,
                supported: FORMAT_VERSION
            }) if f == found
        ));
    }

    let mut magic = bytes.clone();
    magic[0] = b'X';
    corrupt_offset(scan(&magic, &id, &opts()));
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

#[test]
fn round_trip_many_batches() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(3, 1);
    let specs: Vec<(u32, usize)> = (0..300)
        .map(|i| ((i % 7 + 1) as u32, (i * 13) % 900))
        .collect();
    let (path, written) = new_segment(dir.path(), &id, 16 << 10, &specs);
    let bytes = fs::read(&path).unwrap();
    let s = scan(&bytes, &id, &opts()).unwrap();
    assert_eq!(s.tail, Tail::Clean);
    assert_eq!(s.footer, None);
    assert_eq!(contents(&bytes, &s), written);

    // Active segments are read with pread.
    let file = File::open(&path).unwrap();
    for (b, (_, _, codec)) in s.batches.iter().zip(&written) {
        assert_eq!(&read_range(&file, b.codec_range()).unwrap(), codec);
    }
}

#[test]
fn capacity_grows_in_preallocated_steps() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(4, 7);
    let path = dir.path().join("grow.seg");
    let mut w = SegmentWriter::create(&path, &id, 256).unwrap();
    assert_eq!(w.capacity(), 64 + 256);
    assert_eq!(fs::metadata(&path).unwrap().len(), 64 + 256);
    let written = write_batches(&mut w, &[(1, 50); 40]);
    assert!(w.capacity() >= w.len());
    assert!(w.capacity() > 64 + 256);
    assert_eq!(fs::metadata(&path).unwrap().len(), w.capacity());
    let bytes = fs::read(&path).unwrap();
    let s = scan(&bytes, &id, &opts()).unwrap();
    assert_eq!(s.valid_end, w.len());
    assert_eq!(contents(&bytes, &s), written);
}

#[test]
fn zero_filled_preallocated_tail_is_clean_end() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(5, 1);
    let (path, written) = new_segment(dir.path(), &id, 1 << 20, &FIVE);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 64 + (1 << 20));
    let s = scan(&bytes, &id, &opts()).unwrap();
    assert_eq!(s.tail, Tail::Clean);
    assert_eq!(contents(&bytes, &s), written);
    assert!(s.valid_end < 1024);

    // An empty preallocated segment is a clean, empty log.
    let empty_id = ident(5, 1000);
    let (path, _) = new_segment(dir.path(), &empty_id, 1 << 20, &[]);
    let bytes = fs::read(&path).unwrap();
    let s = scan(&bytes, &empty_id, &opts()).unwrap();
    assert_eq!((s.batches.len(), s.valid_end, s.tail), (0, 64, Tail::Clean));
}

#[test]
fn sealed_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(6, 10);
    let path = dir.path().join(segment_file_name(10));
    let mut w = SegmentWriter::create(&path, &id, 1 << 16).unwrap();
    let written = write_batches(&mut w, &FIVE);
    let events: u64 = FIVE.iter().map(|&(c, _)| u64::from(c)).sum();
    let records_end = w.len();

    // The footer must agree with what was appended.
    let mut w2 = SegmentWriter::create(dir.path().join("other.seg"), &id, 0).unwrap();
    write_batches(&mut w2, &FIVE);
    assert!(matches!(
        w2.seal(events + 1, 10 + events - 1),
        Err(SegmentError::InvalidArgument { .. })
    ));

    w.seal(events, 10 + events - 1).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), records_end + 40);

    let map = map_sealed(&path).unwrap();
    let footer = verify_footer(&map).unwrap();
    assert_eq!(
        footer,
        Footer {
            event_count: events,
            last_seq: 10 + events - 1,
            records_crc: footer.records_crc,
            record_count: 5,
        }
    );
    let s = scan(&map, &id, &sealed_opts()).unwrap();
    assert_eq!(s.footer, Some(footer));
    assert_eq!(s.sealed_len(), Some(map.len() as u64));
    assert_eq!(contents(&map, &s), written);

    // A sealed segment cannot be continued.
    assert!(matches!(
        SegmentWriter::open_append(&path, &id, &s),
        Err(SegmentError::InvalidArgument { .. })
    ));

    // A segment sealed without events.
    let empty = ident(6, 500);
    let epath = dir.path().join("empty.seg");
    SegmentWriter::create(&epath, &empty, 4096)
        .unwrap()
        .seal(0, 499)
        .unwrap();
    let ebytes = fs::read(&epath).unwrap();
    assert_eq!(ebytes.len(), 64 + 40);
    assert_eq!(verify_footer(&ebytes).unwrap().event_count, 0);
    assert!(scan(&ebytes, &empty, &sealed_opts()).unwrap().is_sealed());
}

// ---------------------------------------------------------------------------
// Crash shapes: truncation, zero fill, interrupted seal, torn header
// ---------------------------------------------------------------------------

#[test]
fn truncation_at_every_offset_yields_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(7, 1);
    let (path, written) = new_segment(dir.path(), &id, 0, &FIVE);
    let bytes = fs::read(&path).unwrap();
    let full = scan(&bytes, &id, &opts()).unwrap();
    assert_eq!(full.valid_end as usize, bytes.len());

    for cut in 0..=bytes.len() {
        let s = scan(&bytes[..cut], &id, &opts()).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let whole = full
            .batches
            .iter()
            .filter(|b| b.end() as usize <= cut)
            .count();
        assert_eq!(contents(&bytes, &s), written[..whole], "cut at {cut}");
        let boundary = cut == 64 || full.batches.iter().any(|b| b.end() as usize == cut);
        assert_eq!(
            s.tail == Tail::Clean,
            boundary,
            "cut at {cut}: {:?}",
            s.tail
        );
    }
}

#[test]
fn zero_fill_from_every_offset_yields_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(8, 1);
    let (path, written) = new_segment(dir.path(), &id, 0, &FIVE);
    let bytes = fs::read(&path).unwrap();
    let full = scan(&bytes, &id, &opts()).unwrap();

    for from in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[from..].fill(0);
        let s = scan(&damaged, &id, &opts()).unwrap_or_else(|e| panic!("zeros from {from}: {e}"));
        let got = contents(&damaged, &s);
        let whole = full
            .batches
            .iter()
            .filter(|b| b.end() as usize <= from)
            .count();
        // Zeroing a byte that already was zero changes nothing, so more than
        // the untouched batches may survive, but only as a prefix.
        assert!(got.len() >= whole, "zeros from {from}");
        assert_eq!(got, written[..got.len()], "zeros from {from}");
    }
}

#[test]
fn footer_followed_by_zeros_is_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(9, 1);
    let (path, written) = new_segment(dir.path(), &id, 0, &FIVE);
    let w = SegmentWriter::open_append(
        &path,
        &id,
        &scan(&fs::read(&path).unwrap(), &id, &opts()).unwrap(),
    )
    .unwrap();
    let events = w.event_count();
    w.seal(events, events).unwrap();
    let sealed = fs::read(&path).unwrap();

    // Crash between the footer write and set_len: the preallocated zeros remain.
    let mut crashed = sealed.clone();
    crashed.extend_from_slice(&[0u8; 5000]);
    fs::write(&path, &crashed).unwrap();

    for o in [opts(), sealed_opts()] {
        let s = scan(&crashed, &id, &o).unwrap();
        assert!(s.is_sealed());
        assert_eq!(s.tail, Tail::Clean);
        assert_eq!(s.sealed_len(), Some(sealed.len() as u64));
        assert_eq!(contents(&crashed, &s), written);
    }
    // The O(1) open path does not find the footer at EOF and says so.
    corrupt_offset(verify_footer(&crashed).map(|_| unreachable!()));

    let s = scan(&crashed, &id, &opts()).unwrap();
    SegmentWriter::complete_seal(&path, &s).unwrap();
    assert_eq!(fs::read(&path).unwrap(), sealed);
    verify_footer(&fs::read(&path).unwrap()).unwrap();

    // Garbage (not zeros) after a footer is corruption.
    let mut trailing = sealed.clone();
    trailing.extend_from_slice(&[0, 0, 7]);
    assert_eq!(
        corrupt_offset(scan(&trailing, &id, &opts())),
        sealed.len() as u64 + 2
    );
}

#[test]
fn torn_header_reads_as_empty_segment_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(10, 77);
    let header = id.header_bytes();
    let path = dir.path().join(segment_file_name(77));

    for k in 0..64 {
        for trailing_zeros in [0usize, 4096] {
            let mut file = header[..k].to_vec();
            file.resize(k + trailing_zeros, 0);
            let s = scan(&file, &id, &opts()).unwrap();
            assert!(s.batches.is_empty());
            if file.len() >= 64 && file[..64] == header {
                // Bytes 60..64 of a header are zero: the header is complete.
                assert_eq!((s.valid_end, s.tail), (64, Tail::Clean));
                continue;
            }
            assert_eq!(s.valid_end, 0);
            assert!(matches!(s.tail, Tail::Torn { offset: 0, .. }));
            corrupt_offset(scan(&file, &id, &sealed_opts()));
        }
    }

    // Something after an incomplete header cannot be a crash during creation.
    let mut file = header[..20].to_vec();
    file.resize(200, 0);
    file[150] = 1;
    corrupt_offset(scan(&file, &id, &opts()));

    // Recovery: discard, reopen (rewrites the header), append.
    let mut file = header[..30].to_vec();
    file.resize(4096, 0);
    fs::write(&path, &file).unwrap();
    let s = scan(&file, &id, &opts()).unwrap();
    SegmentWriter::discard_tail(&path, s.valid_end).unwrap();
    let mut w = SegmentWriter::open_append(&path, &id, &s).unwrap();
    let written = write_batches(&mut w, &FIVE[..2]);
    let bytes = fs::read(&path).unwrap();
    let s = scan(&bytes, &id, &opts()).unwrap();
    assert_eq!(s.tail, Tail::Clean);
    assert_eq!(contents(&bytes, &s), written);
    assert_eq!(written[0].0, 77);
}

#[test]
fn torn_tail_is_discarded_and_appending_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(11, 1);
    let (path, mut written) = new_segment(dir.path(), &id, 64 << 10, &FIVE[..3]);
    let file_len = fs::metadata(&path).unwrap().len();
    let before = scan(&fs::read(&path).unwrap(), &id, &opts()).unwrap();

    // A torn append: only the first 3000 of 9000+ frame bytes reached the disk.
    let mut frame = Vec::new();
    let next = written.last().map(|b| b.0 + u64::from(b.1)).unwrap();
    encode_frame(id.salt(), next, 2, &vec![0xee; 9000], &mut frame).unwrap();
    let torn_at = before.valid_end;
    let mut bytes = fs::read(&path).unwrap();
    bytes[torn_at as usize..torn_at as usize + 3000].copy_from_slice(&frame[..3000]);
    fs::write(&path, &bytes).unwrap();

    let s = scan(&bytes, &id, &opts()).unwrap();
    assert!(matches!(s.tail, Tail::Torn { offset, .. } if offset == torn_at));
    assert_eq!(s.valid_end, torn_at);
    assert_eq!(contents(&bytes, &s), written);

    // Appending over an undiscarded torn tail is refused.
    assert!(matches!(
        SegmentWriter::open_append(&path, &id, &s),
        Err(SegmentError::InvalidArgument { .. })
    ));

    SegmentWriter::discard_tail(&path, s.valid_end).unwrap();
    let bytes = fs::read(&path).unwrap();
    assert_eq!(
        bytes.len() as u64,
        file_len,
        "discard_tail keeps the preallocation"
    );
    assert!(bytes[torn_at as usize..].iter().all(|&b| b == 0));
    let clean = scan(&bytes, &id, &opts()).unwrap();
    assert_eq!(clean.tail, Tail::Clean);

    let mut w = SegmentWriter::open_append(&path, &id, &s).unwrap();
    assert_eq!(w.len(), torn_at);
    assert_eq!(w.next_seq(), next);
    written.extend(write_batches(&mut w, &FIVE[3..]));
    let events: u64 = written.iter().map(|b| u64::from(b.1)).sum();
    w.seal(events, events).unwrap();

    let map = map_sealed(&path).unwrap();
    verify_footer(&map).unwrap();
    let s = scan(&map, &id, &sealed_opts()).unwrap();
    assert_eq!(contents(&map, &s), written);
}

// ---------------------------------------------------------------------------
// Corruption
// ---------------------------------------------------------------------------

#[test]
fn bit_flip_in_any_record_but_the_last_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    for prealloc in [0, 4096] {
        let id = ident(12, 1);
        let sub = dir.path().join(format!("p{prealloc}"));
        fs::create_dir(&sub).unwrap();
        let (path, _) = new_segment(&sub, &id, prealloc, &FIVE);
        let bytes = fs::read(&path).unwrap();
        let full = scan(&bytes, &id, &opts()).unwrap();
        let records = &full.batches[..full.batches.len() - 1];

        for rec in records {
            for byte in rec.offset as usize..rec.end() as usize {
                for bit in 0..8 {
                    let mut damaged = bytes.clone();
                    damaged[byte] ^= 1 << bit;
                    let offset = corrupt_offset(scan(&damaged, &id, &opts()));
                    assert!(
                        (64..=rec.offset).contains(&offset),
                        "flip {byte}.{bit}: corrupt at {offset}, record at {}",
                        rec.offset
                    );
                }
            }
        }
    }
}

#[test]
fn bit_flip_in_the_last_record_payload_is_corrupt_not_torn() {
    // The last record has nothing after it, so only its intact trailer can
    // tell that the whole write reached the disk and changed afterwards.
    let dir = tempfile::tempdir().unwrap();
    for prealloc in [0, 4096] {
        let id = ident(20, 1);
        let sub = dir.path().join(format!("p{prealloc}"));
        fs::create_dir(&sub).unwrap();
        let (path, _) = new_segment(&sub, &id, prealloc, &FIVE);
        let bytes = fs::read(&path).unwrap();
        let last = scan(&bytes, &id, &opts()).unwrap().batches.pop().unwrap();
        for byte in last.payload.start as usize..last.payload.end as usize {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[byte] ^= 1 << bit;
                let offset = corrupt_offset(scan(&damaged, &id, &opts()));
                assert_eq!(offset, last.offset, "flip {byte}.{bit}");
            }
        }
        // A damaged trailer is indistinguishable from one never written.
        let mut damaged = bytes.clone();
        damaged[last.payload.end as usize] ^= 1;
        let s = scan(&damaged, &id, &opts()).unwrap();
        assert!(matches!(s.tail, Tail::Torn { offset, .. } if offset == last.offset));
    }
}

#[test]
fn bit_flip_anywhere_in_a_sealed_segment_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(13, 1);
    let (path, _) = new_segment(dir.path(), &id, 4096, &FIVE);
    let s = scan(&fs::read(&path).unwrap(), &id, &opts()).unwrap();
    let w = SegmentWriter::open_append(&path, &id, &s).unwrap();
    let events = w.event_count();
    w.seal(events, events).unwrap();
    let bytes = fs::read(&path).unwrap();
    scan(&bytes, &id, &sealed_opts()).unwrap();

    for byte in 0..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[byte] ^= 1 << bit;
            match scan(&damaged, &id, &sealed_opts()) {
                Err(SegmentError::Corrupt { .. }) => {}
                Err(SegmentError::UnsupportedVersion { .. }) if (8..10).contains(&byte) => {}
                other => panic!("flip {byte}.{bit}: {other:?}"),
            }
            // The O(1) check covers the header and the footer.
            if byte < 64 || byte >= bytes.len() - 40 {
                assert!(verify_footer(&damaged).is_err(), "flip {byte}.{bit}");
            }
        }
    }
}

#[test]
fn zeroed_record_before_valid_records_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(14, 1);
    let (path, _) = new_segment(dir.path(), &id, 4096, &FIVE);
    let bytes = fs::read(&path).unwrap();
    let full = scan(&bytes, &id, &opts()).unwrap();
    let victim = &full.batches[2];
    let mut damaged = bytes.clone();
    damaged[victim.offset as usize..victim.end() as usize].fill(0);
    let err = scan(&damaged, &id, &opts()).unwrap_err();
    match err {
        SegmentError::Corrupt { offset, reason } => {
            assert_eq!(offset, victim.offset);
            assert!(reason.contains("followed by valid records"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn record_from_another_segment_is_not_data() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(15, 1);
    for prealloc in [0, 4096] {
        let sub = dir.path().join(format!("p{prealloc}"));
        fs::create_dir(&sub).unwrap();
        let (path, written) = new_segment(&sub, &id, prealloc, &FIVE[..3]);
        let bytes = fs::read(&path).unwrap();
        let end = scan(&bytes, &id, &opts()).unwrap().valid_end as usize;
        let next = written.last().map(|b| b.0 + u64::from(b.1)).unwrap();

        let paste = |salt: u32| {
            let mut frame = Vec::new();
            encode_frame(salt, next, 2, b"pasted record", &mut frame).unwrap();
            let mut out = bytes[..end].to_vec();
            out.extend_from_slice(&frame);
            if out.len() < bytes.len() {
                out.extend_from_slice(&bytes[out.len()..]);
            }
            out
        };

        // Same sequence numbers, valid in its own segment, but salted for another.
        for other in [ident(16, 1), ident(15, 2)] {
            let foreign = paste(other.salt());
            let s = scan(&foreign, &id, &opts()).unwrap();
            assert_eq!(contents(&foreign, &s), written);
            assert!(matches!(s.tail, Tail::Torn { offset, .. } if offset as usize == end));
        }

        // Control: the same frame salted for this segment is data.
        let own = paste(id.salt());
        let s = scan(&own, &id, &opts()).unwrap();
        assert_eq!(s.batches.len(), 4);
        assert_eq!(read_batch_payload(&own, &s.batches[3]), b"pasted record");
    }
}

#[test]
fn sequence_discontinuity_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(17, 1);
    let (path, written) = new_segment(dir.path(), &id, 0, &FIVE[..3]);
    let bytes = fs::read(&path).unwrap();
    let next = written.last().map(|b| b.0 + u64::from(b.1)).unwrap();

    for first_seq in [next + 1, next - 1, 0, u64::MAX - 1] {
        let mut frame = Vec::new();
        encode_frame(id.salt(), first_seq, 1, b"x", &mut frame).unwrap();
        let mut gap = bytes.clone();
        gap.extend_from_slice(&frame);
        assert_eq!(corrupt_offset(scan(&gap, &id, &opts())), bytes.len() as u64);
    }

    // The first batch must start at the segment's first_seq.
    let mut frame = Vec::new();
    encode_frame(id.salt(), 2, 1, b"x", &mut frame).unwrap();
    let mut first = id.header_bytes().to_vec();
    first.extend_from_slice(&frame);
    assert_eq!(corrupt_offset(scan(&first, &id, &opts())), 64);

    // The writer refuses to create a gap, and nothing is written.
    let mut w =
        SegmentWriter::open_append(&path, &id, &scan(&bytes, &id, &opts()).unwrap()).unwrap();
    let len = w.len();
    for bad in [next + 1, next - 1] {
        assert!(matches!(
            w.append(bad, 1, b"x"),
            Err(SegmentError::InvalidArgument { .. })
        ));
    }
    assert!(matches!(
        w.append(next, 0, b"x"),
        Err(SegmentError::InvalidArgument { .. })
    ));
    assert_eq!(w.len(), len);
    w.append(next, 1, b"x").unwrap();
}

#[test]
fn huge_length_field_is_torn_or_corrupt_without_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(18, 1);
    for prealloc in [0, 1 << 16] {
        let sub = dir.path().join(format!("p{prealloc}"));
        fs::create_dir(&sub).unwrap();
        let (path, written) = new_segment(&sub, &id, prealloc, &FIVE);
        let bytes = fs::read(&path).unwrap();
        let full = scan(&bytes, &id, &opts()).unwrap();

        for len in [
            u32::MAX,
            MAX_RECORD_LIMIT,
            MAX_RECORD_LIMIT + 1,
            DEFAULT_MAX_RECORD,
        ] {
            // In the last record: a torn tail.
            let last = full.batches.last().unwrap();
            let mut damaged = bytes.clone();
            damaged[last.offset as usize..last.offset as usize + 4]
                .copy_from_slice(&len.to_le_bytes());
            let s = scan(&damaged, &id, &opts()).unwrap();
            assert_eq!(contents(&damaged, &s), written[..4]);
            assert!(matches!(s.tail, Tail::Torn { offset, .. } if offset == last.offset));

            // In a middle record: corruption at that record.
            let mid = &full.batches[1];
            let mut damaged = bytes.clone();
            damaged[mid.offset as usize..mid.offset as usize + 4]
                .copy_from_slice(&len.to_le_bytes());
            assert_eq!(corrupt_offset(scan(&damaged, &id, &opts())), mid.offset);
        }
    }
}

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------

#[test]
fn record_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(19, 1);
    let path = dir.path().join("big.seg");
    let mut w = SegmentWriter::create(&path, &id, 4096).unwrap();
    w.set_max_record(100).unwrap();
    assert!(w.set_max_record(11).is_err());
    assert!(w.set_max_record(MAX_RECORD_LIMIT + 1).is_err());

    let len = w.len();
    match w.append(1, 1, &[7; 89]) {
        Err(SegmentError::RecordTooLarge {
            size: 101,
            max: 100,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(w.len(), len);
    w.append(1, 1, &[7; 88]).unwrap(); // payload exactly 100 bytes
    w.sync().unwrap();

    // A complete record over the reader's limit is reported, never dropped
    // as a torn tail.
    let bytes = fs::read(&path).unwrap();
    let small = ScanOptions {
        max_record: 50,
        ..ScanOptions::default()
    };
    assert!(matches!(
        scan(&bytes, &id, &small),
        Err(SegmentError::RecordTooLarge { size: 100, max: 50 })
    ));
    assert_eq!(scan(&bytes, &id, &opts()).unwrap().batches.len(), 1);

    // The default limit.
    let mut w = SegmentWriter::create(dir.path().join("default.seg"), &id, 0).unwrap();
    let too_big = vec![0u8; DEFAULT_MAX_RECORD as usize - 11];
    assert!(matches!(
        w.append(1, 1, &too_big),
        Err(SegmentError::RecordTooLarge { .. })
    ));
}

// ---------------------------------------------------------------------------
// Resuming after a checkpoint
// ---------------------------------------------------------------------------

#[test]
fn scan_from_walks_only_the_records_after_the_resume_point() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(8, 0);
    let (path, written) = new_segment(dir.path(), &id, 1 << 14, &FIVE);
    let bytes = fs::read(&path).unwrap();
    let full = scan(&bytes, &id, &opts()).unwrap();
    let third = &full.batches[2];
    let resumed = scan_from(&bytes, &id, &opts(), third.offset, third.first_seq).unwrap();
    assert_eq!(resumed.batches, full.batches[2..]);
    assert_eq!(resumed.valid_end, full.valid_end);
    assert_eq!(contents(&bytes, &resumed), written[2..]);
    // A resume point that does not continue the seqs is corruption.
    assert!(matches!(
        scan_from(&bytes, &id, &opts(), third.offset, third.first_seq + 1),
        Err(SegmentError::Corrupt { .. })
    ));
    assert!(scan_from(&bytes, &id, &opts(), 10, 0).is_err());
    // record_at confirms a record, and only at a frame start.
    assert_eq!(record_at(&bytes, &id, third.offset).as_ref(), Some(third));
    assert_eq!(record_at(&bytes, &id, third.offset + 1), None);
    assert_eq!(record_at(&bytes, &ident(9, 0), third.offset), None);
}

#[test]
fn resume_then_seal_auto_writes_the_same_footer_as_an_uninterrupted_writer() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(9, 100);
    let a = dir.path().join("a.seg");
    let b = dir.path().join("b.seg");
    let mut wa = SegmentWriter::create(&a, &id, 1 << 14).unwrap();
    write_batches(&mut wa, &FIVE);
    let mut wb = SegmentWriter::create(&b, &id, 1 << 14).unwrap();
    write_batches(&mut wb, &FIVE[..3]);
    let (end, next) = (wb.len(), wb.next_seq());
    drop(wb);
    let mut wb = SegmentWriter::resume(&b, &id, end, next).unwrap();
    for (i, &(count, len)) in FIVE.iter().enumerate().skip(3) {
        let first = wb.next_seq();
        wb.append(first, count, &codec(i, len)).unwrap();
    }
    wa.seal_auto().unwrap();
    wb.seal_auto().unwrap();
    assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
    // Resuming over bytes that are not free space is refused.
    let c = dir.path().join("c.seg");
    let mut wc = SegmentWriter::create(&c, &id, 1 << 14).unwrap();
    write_batches(&mut wc, &FIVE);
    drop(wc);
    assert!(matches!(
        SegmentWriter::resume(&c, &id, 64, 100),
        Err(SegmentError::InvalidArgument { .. })
    ));
}

/// F13: an image whose header (checksums valid: crafted, not rot) claims
/// gigabytes around a small frame is refused without allocating the
/// claim. Under `CappedAlloc` an allocation of the claim aborts the run.
#[test]
fn an_image_claiming_gigabytes_is_refused_without_allocating_them() {
    let dir = tempfile::tempdir().unwrap();
    let id = ident(7, 0);
    let path = dir.path().join(segment_file_name(0));
    let mut w = SegmentWriter::create(&path, &id, 0).unwrap();
    write_batches(&mut w, &FIVE);
    w.seal_auto().unwrap();
    let raw = map_sealed(&path).unwrap().to_vec();
    let image = encode_image(&raw).unwrap();
    assert_eq!(decode_image(&image, &id).unwrap(), raw);
    for claim in [1u64 << 30, 8 << 30] {
        let mut crafted = image.clone();
        crafted[12..20].copy_from_slice(&claim.to_le_bytes());
        let crc = crc32fast::hash(&crafted[0..28]);
        crafted[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(image_len(&crafted).unwrap(), claim);
        let e = decode_image(&crafted, &id).unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "decodes to {} bytes, its header says {claim}",
                raw.len()
            )),
            "{e}"
        );
    }
}
