//! `recover`: arbitrary bytes written into a real store directory (as the
//! tail of a session's last segment, a whole segment, a patch inside one, a
//! truncation, the checkpoint, the session HEADER, the manifest or the
//! lineage),
//! then `Store::open` + `load`.
//!
//! Properties, for every input:
//! - no panic, no hang, and no allocation beyond the input's size
//!   (`sessionlog_fuzz::budget`);
//! - the result is an error, or the log is a prefix of the original log cut
//!   at a batch boundary, followed by exactly the repair closers of that
//!   prefix (never a partial batch, never an event that was not written);
//! - when it loads: `verify` passes (or reports a checkpoint that does not
//!   decode), `derive` and `surface` work, a read-only
//!   open sees the same log, a second open sees the same log (repair is
//!   idempotent), and the session accepts a new batch.
//!
//! Input layout: `mode u8 | flags u8 | param u16 | payload...`. Flags: bit 0
//! deletes the checkpoint, bit 1 zero-pads a rewritten segment to its old
//! length (preallocated space).
//!
//! Modes 15 and 16 store a sealed segment as a compressed image (`.segz`,
//! the manifest raised to version 4): arbitrary bytes, or the real image
//! with bytes changed.
//!
//! With `SESSIONLOG_FUZZ_CRAFTED=1` four more modes write inputs *with valid
//! checksums*: a checkpoint body, a patched real checkpoint body, a
//! segment record, and an image claiming any decoded length around any
//! frame. The store trusts checksummed bytes by design, so there
//! only "no panic, no huge allocation, the log before the crafted record is
//! intact" is checked. With `SESSIONLOG_FUZZ_SEED_DIR=DIR` the first run
//! writes one seed per mode (built from the real files) into DIR.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionlog::checkpoint;
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::segment::{self, ScanOptions, SegmentIdent};
use sessionlog::store::{Durability, Error, Options, Store};
use sessionlog_fuzz::{AllocWindow, Bytes, budget, prefix_boundary, remove_tree, scratch_root};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SESSION: &str = "s";

/// The store image every input starts from.
struct Template {
    root: PathBuf,
    /// Every file of the store, relative to the store directory.
    files: Vec<(PathBuf, Vec<u8>)>,
    original: Vec<OwnedEvent>,
    boundaries: Vec<usize>,
    /// Indexes into `files` of the segments, in order (the last is active).
    segments: Vec<usize>,
    /// Committed end of each segment's records, and its identity.
    seg_info: Vec<(u64, SegmentIdent)>,
    /// First seq of each batch in the active segment, and its frame offset.
    active_batches: Vec<(u64, u64)>,
    checkpoint: usize,
    header: usize,
    manifest: usize,
    session_dir: PathBuf,
    image_len: usize,
    /// The compressed image of each sealed segment (`segments[k]`).
    images: Vec<Vec<u8>>,
    /// The manifest raised to version 4, for the image modes.
    manifest_v4: Vec<u8>,
    /// The modes in play (`SESSIONLOG_FUZZ_MODES`, default all).
    modes: Vec<u8>,
}

/// Modes that write bytes with valid checksums (`SESSIONLOG_FUZZ_CRAFTED=1`).
const CRAFTED_MODES: [u8; 4] = [12, 13, 14, 17];

/// Parses `SESSIONLOG_FUZZ_MODES` ("0-2,4,6-11"): the modes to run, so a
/// long run can go on past a known failure of one mode.
fn modes(crafted: bool) -> Vec<u8> {
    let all: Vec<u8> = (0..18)
        .filter(|m| crafted || !CRAFTED_MODES.contains(m))
        .collect();
    let Ok(spec) = std::env::var("SESSIONLOG_FUZZ_MODES") else {
        return all;
    };
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u8, u8) = (
            a.parse().expect("SESSIONLOG_FUZZ_MODES: a number"),
            b.parse().expect("SESSIONLOG_FUZZ_MODES: a number"),
        );
        out.extend((a..=b).filter(|m| all.contains(m)));
    }
    assert!(!out.is_empty(), "SESSIONLOG_FUZZ_MODES selects no mode");
    out
}

fn options() -> Options {
    Options {
        durability: Durability::Sync,
        segment_size: 4096,
        preallocate: 4096,
        checkpoint_every: 16,
        // The modes damage the CHECKPOINT file's bytes; a small session's
        // checkpoint embedded in its HEADER is in the damage campaign.
        embed_checkpoints: false,
        ..Options::default()
    }
}

fn read_tree(base: &Path, dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read the template")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_tree(base, &p, out);
        } else {
            let rel = p.strip_prefix(base).expect("inside").to_owned();
            out.push((rel, std::fs::read(&p).expect("read")));
        }
    }
}

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let root = scratch_root("recover");
        let dir = root.join("template");
        remove_tree(&dir);
        let (header, original) = Sample::new(SampleConfig {
            turns: 4,
            seed: 7,
            ..SampleConfig::default()
        })
        .session(SESSION);
        let sizes = [1usize, 3, 2, 5, 1, 4, 8, 2, 6];
        let mut boundaries = vec![0];
        {
            let store = Store::open(&dir, options()).expect("create the template store");
            store.create(header).expect("create");
            let mut at = 0;
            let mut i = 0;
            while at < original.len() {
                let end = (at + sizes[i % sizes.len()]).min(original.len());
                store.append(SESSION, &original[at..end]).expect("append");
                at = end;
                boundaries.push(at);
                i += 1;
            }
            // Dropped without close: the checkpoint covers only part of the log.
        }
        let mut files = Vec::new();
        read_tree(&dir, &dir, &mut files);
        let find = |name: &str| {
            files
                .iter()
                .position(|(p, _)| p.file_name().is_some_and(|n| n == name))
                .unwrap_or_else(|| panic!("template has no {name}"))
        };
        let checkpoint = find(checkpoint::CHECKPOINT_FILE);
        let header = find("HEADER");
        let manifest = find("MANIFEST");
        let segments: Vec<usize> = (0..files.len())
            .filter(|&i| files[i].0.extension().is_some_and(|e| e == "seg"))
            .collect();
        assert!(segments.len() >= 2, "the template needs a sealed segment");
        let session_dir = files[segments[0]].0.parent().expect("dir").to_owned();
        let mut seg_info = Vec::new();
        let mut active_batches = Vec::new();
        for (k, &i) in segments.iter().enumerate() {
            let bytes = &files[i].1;
            let ident = segment::read_header(bytes).expect("template header");
            let scan = segment::scan(
                bytes,
                &ident,
                &ScanOptions {
                    expect_sealed: k + 1 < segments.len(),
                    ..ScanOptions::default()
                },
            )
            .expect("template scans");
            if k + 1 == segments.len() {
                active_batches = scan
                    .batches
                    .iter()
                    .map(|b| (b.first_seq, b.offset))
                    .collect();
            }
            seg_info.push((scan.valid_end, ident));
        }
        let images = segments[..segments.len() - 1]
            .iter()
            .map(|&i| segment::encode_image(&files[i].1).expect("image of a sealed segment"))
            .collect();
        let mut manifest_v4 = sessionlog::manifest::Manifest::decode(&files[manifest].1, &dir)
            .expect("template manifest");
        manifest_v4.version = sessionlog::manifest::STORE_FORMAT_VERSION;
        let manifest_v4 = manifest_v4.encode().to_vec();
        let image_len = files.iter().map(|(_, b)| b.len()).sum();
        let crafted = std::env::var_os("SESSIONLOG_FUZZ_CRAFTED").is_some_and(|v| v == "1");
        let t = Template {
            root,
            files,
            original,
            boundaries,
            segments,
            seg_info,
            active_batches,
            checkpoint,
            header,
            manifest,
            session_dir,
            image_len,
            images,
            manifest_v4,
            modes: modes(crafted),
        };
        if let Some(seeds) = std::env::var_os("SESSIONLOG_FUZZ_SEED_DIR") {
            write_seeds(&t, Path::new(&seeds));
        }
        t
    })
}

/// One seed per mode, from the real files.
fn write_seeds(t: &Template, dir: &Path) {
    std::fs::create_dir_all(dir).expect("seed dir");
    let active = &t.files[*t.segments.last().expect("active")].1;
    let sealed = &t.files[t.segments[0]].1;
    let ckpt = &t.files[t.checkpoint].1;
    let payloads: Vec<(u8, u8, u16, Vec<u8>)> = vec![
        (0, 2, 100, active[64..active.len().min(400)].to_vec()),
        (1, 0, 0, active.clone()),
        (2, 0, 0, sealed.clone()),
        (3, 0, 70, vec![0xff; 4]),
        (4, 0, 0, ckpt.clone()),
        (5, 0, 0, t.files[t.header].1.clone()),
        (6, 0, 0, vec![5, 0, 0, 0, 1, 2, 3, 4, 0]),
        (
            7,
            0,
            0,
            br#"{"type":"session","id":"s","createdAt":1}"#.to_vec(),
        ),
        (8, 0, 0, t.files[t.manifest].1.clone()),
        (9, 1, 200, Vec::new()),
        (10, 0, 0, b"SLOGLINE".to_vec()),
        (11, 1, 0, Vec::new()),
        (12, 0, 0, ckpt[checkpoint::CHECKPOINT_HEADER_LEN..].to_vec()),
        (13, 0, 0, vec![0, 0, 1]),
        (14, 0, 2, active[64..active.len().min(200)].to_vec()),
        (15, 0, 0, t.images[0].clone()),
        (16, 0, 0, vec![0, 0, 0]),
        (17, 0, 0, crafted_image_seed(t)),
    ];
    for (mode, flags, param, payload) in payloads {
        let mut seed = vec![mode, flags];
        seed.extend_from_slice(&param.to_le_bytes());
        seed.extend_from_slice(&payload);
        std::fs::write(dir.join(format!("seed-mode-{mode:02}")), seed).expect("write seed");
    }
    // The real checkpoint file, for the `checkpoint` target's corpus.
    std::fs::write(dir.join("real-CHECKPOINT"), ckpt).expect("write seed");
}

/// How much to check of a loaded image.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The full prefix oracle.
    Prefix,
    /// Crafted checksummed bytes: the events before `seq` must be intact.
    IntactBefore(usize),
    /// A crafted checkpoint: only no panic / bounded allocation.
    NoPanic,
}

/// A checksummed checkpoint whose sections are `body` cut at the lengths
/// of the template's real sections (the last takes the rest), so the real
/// sections' bytes give back the real file.
fn with_crcs(t: &Template, body: &[u8]) -> Vec<u8> {
    let real = checkpoint::sections(&t.files[t.checkpoint].1).expect("template checkpoint");
    let mut parts: [&[u8]; checkpoint::SECTION_COUNT] = [&[]; checkpoint::SECTION_COUNT];
    let mut rest = body;
    for (i, part) in parts.iter_mut().enumerate() {
        let n = if i + 1 == checkpoint::SECTION_COUNT {
            rest.len()
        } else {
            real[i].len().min(rest.len())
        };
        let (head, tail) = rest.split_at(n);
        *part = head;
        rest = tail;
    }
    checkpoint::frame(parts)
}

/// A checksum-valid session HEADER (format-spec.md) holding `json`, with
/// the real header's session uid.
fn header_file(real: &[u8], json: &[u8]) -> Vec<u8> {
    let mut out = b"SLOGHEAD".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&real[12..28]);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&out);
    h.update(json);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.extend_from_slice(json);
    out
}

/// Mode 17's seed: the real image's claimed length (8 bytes) and frame.
fn crafted_image_seed(t: &Template) -> Vec<u8> {
    let image = &t.images[0];
    let mut out = image[12..20].to_vec();
    out.extend_from_slice(&image[segment::IMAGE_HEADER_LEN..]);
    out
}

/// A segment image with valid checksums claiming `len` decoded bytes
/// around `frame`.
fn image_file(len: u64, frame: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; segment::IMAGE_HEADER_LEN];
    out[0..8].copy_from_slice(&segment::IMAGE_MAGIC);
    out[8..10].copy_from_slice(&segment::IMAGE_VERSION.to_le_bytes());
    out[12..20].copy_from_slice(&len.to_le_bytes());
    out[20..24].copy_from_slice(&crc32fast::hash(frame).to_le_bytes());
    let crc = crc32fast::hash(&out[0..28]);
    out[28..32].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(frame);
    out
}

/// Sealed segment `k` stored as the image `bytes` in place of its raw
/// file, in a store of version 4.
fn as_image(t: &Template, files: &mut [(PathBuf, Vec<u8>)], k: usize, bytes: Vec<u8>) {
    let (_, ident) = t.seg_info[k];
    let i = t.segments[k];
    files[i] = (
        t.session_dir
            .join(segment::image_file_name(ident.first_seq)),
        bytes,
    );
    files[t.manifest].1 = t.manifest_v4.clone();
}

/// Builds the damaged image in memory: the files to write, and what to
/// expect of it.
fn damage(t: &Template, data: &[u8]) -> (Vec<(PathBuf, Vec<u8>)>, Expect) {
    let mut input = Bytes::new(data);
    let mode = t.modes[input.u8() as usize % t.modes.len()];
    let flags = input.u8();
    let param = input.u16() as usize;
    let payload = input.rest();
    let mut files = t.files.clone();
    let mut expect = Expect::Prefix;
    let nseg = t.segments.len();
    let active = t.segments[nseg - 1];
    let pad = |bytes: &mut Vec<u8>, old: usize| {
        if flags & 2 != 0 && bytes.len() < old {
            bytes.resize(old, 0);
        }
    };
    match mode {
        // The tail of the active segment, from a point inside its records.
        0 => {
            let (end, _) = t.seg_info[nseg - 1];
            let cut = segment::HEADER_LEN + param % (end as usize - segment::HEADER_LEN + 1);
            let bytes = &mut files[active].1;
            let old = bytes.len();
            bytes.truncate(cut);
            bytes.extend_from_slice(payload);
            pad(bytes, old);
        }
        // A whole segment, active or sealed.
        1 | 2 => {
            let i = if mode == 1 {
                active
            } else {
                t.segments[param % (nseg - 1)]
            };
            let old = files[i].1.len();
            files[i].1 = payload.to_vec();
            pad(&mut files[i].1, old);
        }
        // Bytes patched in place inside a segment.
        3 => {
            let i = t.segments[(flags as usize >> 2) % nseg];
            let bytes = &mut files[i].1;
            let at = param % (bytes.len() + 1);
            let end = at + payload.len();
            if end > bytes.len() {
                bytes.resize(end, 0);
            }
            bytes[at..end].copy_from_slice(payload);
        }
        4 => files[t.checkpoint].1 = payload.to_vec(),
        5 => files[t.header].1 = payload.to_vec(),
        // Garbage after the HEADER's JSON.
        6 => files[t.header].1.extend_from_slice(payload),
        // A checksum-valid HEADER with arbitrary JSON.
        7 => files[t.header].1 = header_file(&t.files[t.header].1, payload),
        8 => files[t.manifest].1 = payload.to_vec(),
        // A segment truncated (a crash image of a shorter file).
        9 => {
            let i = t.segments[(flags as usize >> 2) % nseg];
            let bytes = &mut files[i].1;
            let n = param % (bytes.len() + 1);
            bytes.truncate(n);
        }
        // A LINEAGE file the session never had.
        10 => files.push((t.session_dir.join("LINEAGE"), payload.to_vec())),
        // A stray segment after the active one, or an extra file.
        11 => {
            let (_, ident) = t.seg_info[nseg - 1];
            let first = ident.first_seq + (param as u64 % 64);
            files.push((
                t.session_dir.join(segment::segment_file_name(first)),
                payload.to_vec(),
            ));
        }
        // Crafted: a checksummed checkpoint with an arbitrary body.
        12 => {
            files[t.checkpoint].1 = with_crcs(t, payload);
            expect = Expect::NoPanic;
        }
        // Crafted: the real checkpoint body with bytes xored in, checksums fixed.
        13 => {
            let real = &t.files[t.checkpoint].1[checkpoint::CHECKPOINT_HEADER_LEN..];
            let mut body = real.to_vec();
            let mut p = Bytes::new(payload);
            while !p.is_empty() {
                let at = p.u16() as usize;
                let x = p.u8();
                if !body.is_empty() {
                    let n = body.len();
                    body[at % n] ^= x;
                }
            }
            files[t.checkpoint].1 = with_crcs(t, &body);
            expect = Expect::NoPanic;
        }
        // A sealed segment's image: arbitrary bytes.
        15 => as_image(t, &mut files, param % (nseg - 1), payload.to_vec()),
        // A sealed segment's real image with bytes xored in (damage).
        16 => {
            let k = param % (nseg - 1);
            let mut image = t.images[k].clone();
            let mut p = Bytes::new(payload);
            while !p.is_empty() {
                let at = p.u16() as usize;
                let x = p.u8();
                let n = image.len();
                image[at % n] ^= x;
            }
            as_image(t, &mut files, k, image);
        }
        // Crafted: an image with valid checksums claiming any length.
        17 => {
            let mut p = Bytes::new(payload);
            let len = p.u64();
            let image = image_file(len, p.rest());
            as_image(t, &mut files, param % (nseg - 1), image);
            expect = Expect::NoPanic;
        }
        // Crafted: a checksum-valid record with arbitrary codec bytes after
        // a batch boundary of the active segment.
        _ => {
            let (_, ident) = t.seg_info[nseg - 1];
            let k = param % (t.active_batches.len() + 1);
            let (first_seq, offset) = match t.active_batches.get(k) {
                Some(&(s, o)) => (s, o as usize),
                None => (t.original.len() as u64, t.seg_info[nseg - 1].0 as usize),
            };
            let count = u32::from(flags >> 2).max(1);
            let mut frame = Vec::new();
            if segment::encode_frame(ident.salt(), first_seq, count, payload, &mut frame).is_ok() {
                let bytes = &mut files[active].1;
                let old = bytes.len();
                bytes.truncate(offset);
                bytes.extend_from_slice(&frame);
                if bytes.len() < old {
                    bytes.resize(old, 0);
                }
            }
            expect = Expect::IntactBefore(first_seq as usize);
        }
    }
    if flags & 1 != 0 && mode != 4 && !CRAFTED_MODES.contains(&mode) {
        files.swap_remove(t.checkpoint);
    }
    (files, expect)
}

fn write_image(dir: &Path, files: &[(PathBuf, Vec<u8>)]) {
    for (rel, bytes) in files {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, bytes).expect("write image file");
    }
}

fn load(store: &Store) -> sessionlog::store::Result<Vec<OwnedEvent>> {
    store.load(SESSION).map(|(_, events)| events)
}

fn check_loaded(t: &Template, expect: Expect, events: &[OwnedEvent], what: &str) {
    match expect {
        Expect::Prefix => {
            if let Err(why) = prefix_boundary(&t.original, &t.boundaries, events) {
                panic!("{what}: not a prefix of the original log: {why}");
            }
        }
        Expect::IntactBefore(n) => {
            let n = n.min(events.len());
            assert!(
                events[..n] == t.original[..n],
                "{what}: events before the crafted record changed"
            );
        }
        Expect::NoPanic => {}
    }
}

fn run(data: &[u8]) {
    let t = template();
    let window = AllocWindow::start();
    let (files, expect) = damage(t, data);
    let in_place = data
        .first()
        .is_some_and(|m| t.modes[*m as usize % t.modes.len()] == 3);
    let dir = t.root.join("img");
    remove_tree(&dir);
    write_image(&dir, &files);

    // Read-only first: it must not write, and must see what a writer sees.
    let ro = Store::open_read_only(&dir).and_then(|s| {
        let events = load(&s)?;
        let _ = s.surface(SESSION)?;
        if expect != Expect::NoPanic {
            let _ = s.derive(SESSION)?.messages().count();
        }
        Ok(events)
    });
    if let Ok(events) = &ro {
        check_loaded(t, expect, events, "read-only open");
    }

    // Writable: taking the session for writing runs recovery with
    // authority (a torn tail cut, an interrupted turn closed).
    let rw = Store::open(&dir, options()).and_then(|s| {
        s.repair(SESSION)?;
        let events = load(&s)?;
        Ok((s, events))
    });
    let Ok((store, events)) = rw else {
        window.check(budget(data.len(), t.image_len), "failed open");
        return;
    };
    check_loaded(t, expect, &events, "writable open");
    if expect != Expect::Prefix {
        // Crafted checksummed bytes: reading them must not panic; what they
        // say is trusted by design.
        let _ = store.verify(SESSION);
        let _ = store.surface(SESSION);
        window.check(budget(data.len(), t.image_len), "crafted open");
        return;
    }
    if let Ok(ro_events) = &ro {
        assert!(
            *ro_events == events,
            "read-only open saw {} events, writable open {}",
            ro_events.len(),
            events.len()
        );
    }
    // Opening checks sealed segments (and the records of the active one)
    // that the checkpoint covers by header and footer only, so a byte
    // changed in place inside them is found by `verify`, not by `open`.
    match store.verify(SESSION) {
        Ok(_) => {}
        Err(Error::Corrupt { .. }) if in_place => {}
        // A damaged checkpoint is reported, although the log reads whole
        // without it; only one that really does not decode.
        Err(Error::Corrupt { segment, .. })
            if segment.ends_with(checkpoint::CHECKPOINT_FILE)
                && std::fs::read(&segment).map_or(true, |b| checkpoint::decode(&b).is_err()) => {}
        Err(e) => panic!("verify failed after a successful open: {e}"),
    }
    let _ = store.surface(SESSION).expect("surface of a loaded session");
    let _ = store
        .derive(SESSION)
        .expect("derive of a loaded session")
        .messages()
        .count();
    drop(store);

    // Recovery is idempotent: a second open finds the same log (closers
    // appended once), and the session takes new batches.
    let store = Store::open(&dir, options()).expect("second open");
    store.repair(SESSION).expect("second recovery");
    let again = load(&store).expect("second load");
    assert!(
        again == events,
        "second open saw {} events, first {}",
        again.len(),
        events.len()
    );
    let next = events.len() as u64;
    let time = events.last().map_or(0, |e| e.time);
    let start =
        format!(r#"{{"type":"turn/start","seq":{next},"time":{time},"data":{{"turn":99}}}}"#);
    let end = format!(
        r#"{{"type":"turn/end","seq":{},"time":{time},"data":{{"turn":99,"reason":{{"kind":"completed"}}}}}}"#,
        next + 1
    );
    let turn = [
        Event::from_json(&start).expect("event"),
        Event::from_json(&end).expect("event"),
    ];
    store
        .append(SESSION, &turn)
        .expect("a recovered session accepts a new batch");
    let after = load(&store).expect("load after append");
    assert_eq!(after.len(), events.len() + 2, "appended batch visible");
    assert!(after[..events.len()] == events[..], "append kept the log");
    window.check(budget(data.len(), t.image_len), "successful open");
}

fuzz_target!(|data: &[u8]| run(data));
