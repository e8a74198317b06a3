//! Tests of the store metadata files: the catalog, the manifest, the session
//! directory names and the file-system helpers.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use proptest::prelude::*;
use sessionlog::catalog::{
    CATALOG_FILE, CATALOG_HEADER_LEN, Catalog, CatalogError, CatalogRecord, MAX_RECORD,
    SESSIONS_DIR, encode_frame,
};
use sessionlog::fsutil::{
    self, BadId, create_dir_private, create_file_private, encode_session_dir_name, fnv1a_128,
    write_atomic,
};
use sessionlog::header::SessionHeader;
use sessionlog::manifest::{
    MANIFEST_FILE, MANIFEST_LEN, Manifest, ManifestError, STORE_FORMAT_VERSION,
};

fn header(id: &str, created_at: u64) -> SessionHeader {
    let mut h = SessionHeader::new(id, created_at);
    h.cwd = Some(format!("/work/{created_at}"));
    h
}

fn uid(n: u8) -> [u8; 16] {
    [n; 16]
}

/// The live set as (header, uid) per id.
type State = BTreeMap<String, (SessionHeader, [u8; 16])>;

fn state(c: &Catalog) -> State {
    c.entries()
        .iter()
        .map(|(id, e)| (id.clone(), (e.header.clone(), e.session_uid)))
        .collect()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Start offsets of the record frames of a catalog file, plus the end.
fn frame_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut at = CATALOG_HEADER_LEN;
    let mut out = vec![at];
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
        out.push(at);
    }
    assert_eq!(at, bytes.len(), "test helper expects a clean file");
    out
}

type Op = Box<dyn Fn(&mut Catalog)>;

/// A catalog built with a mix of operations, and the live set after each of
/// its records (index 0: no records).
fn build_mixed(dir: &Path) -> Vec<State> {
    let (mut c, _) = Catalog::open(dir, false).unwrap();
    let long = "L".repeat(300);
    let mut states = vec![state(&c)];
    let ops: Vec<Op> = vec![
        Box::new(|c| c.put(header("a", 1), uid(1)).unwrap()),
        Box::new(|c| c.put(header("b/\0é", 2), uid(2)).unwrap()),
        Box::new(|c| c.put(header("a", 3), uid(1)).unwrap()),
        Box::new(|c| {
            c.delete("b/\0é").unwrap();
        }),
        Box::new(move |c| c.put(header(&long, 4), uid(4)).unwrap()),
        Box::new(|c| c.put(header("..", 5), uid(5)).unwrap()),
    ];
    for op in ops {
        op(&mut c);
        states.push(state(&c));
    }
    states
}

#[test]
fn put_delete_reopen_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, replay) = Catalog::open(dir.path(), false).unwrap();
    assert!(replay.created);
    assert_eq!(replay.records, 0);
    assert!(c.is_empty());
    c.put(header("s1", 1), uid(1)).unwrap();
    c.put(header("s2", 2), uid(2)).unwrap();
    c.put(header("s3", 3), uid(3)).unwrap();
    let mut updated = header("s2", 2);
    updated.agent_preset = Some("minimal".into());
    c.put(updated.clone(), uid(2)).unwrap();
    let removed = c.delete("s1").unwrap();
    assert_eq!(removed.header, header("s1", 1));
    assert_eq!(c.record_count(), 5);
    let before = state(&c);
    assert_eq!(before.len(), 2);
    assert_eq!(c.get("s2").unwrap().header, updated);
    assert_eq!(c.get("s2").unwrap().dir_name, "s2");
    assert!(c.get("s1").is_none());
    drop(c);

    for read_only in [true, false] {
        let (c, replay) = Catalog::open(dir.path(), read_only).unwrap();
        assert_eq!(state(&c), before);
        assert_eq!(replay.records, 5);
        assert_eq!(replay.torn_bytes, 0);
        assert!(!replay.created);
        let ids: Vec<&str> = c.list().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["s2", "s3"]);
    }
}

#[test]
fn put_and_delete_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _) = Catalog::open(dir.path(), false).unwrap();
    c.put(header("s", 1), uid(1)).unwrap();
    let len = c.file_len();
    // An identical put writes nothing.
    c.put(header("s", 1), uid(1)).unwrap();
    assert_eq!(c.file_len(), len);
    assert!(matches!(
        c.put(header("s", 1), uid(9)),
        Err(CatalogError::UidMismatch { .. })
    ));
    assert!(matches!(
        c.delete("nope"),
        Err(CatalogError::NotFound { .. })
    ));
    assert!(matches!(
        c.put(header("", 1), uid(1)),
        Err(CatalogError::BadId(BadId::Empty))
    ));
    assert_eq!(c.file_len(), len);
    // After delete the id may be reused with a new uid.
    c.delete("s").unwrap();
    c.put(header("s", 2), uid(2)).unwrap();
    drop(c);
    let (mut ro, _) = Catalog::open(dir.path(), true).unwrap();
    assert_eq!(ro.get("s").unwrap().session_uid, uid(2));
    assert!(matches!(
        ro.put(header("t", 1), uid(1)),
        Err(CatalogError::ReadOnly { .. })
    ));
    assert!(matches!(ro.delete("s"), Err(CatalogError::ReadOnly { .. })));
}

#[test]
fn records_above_the_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _) = Catalog::open(dir.path(), false).unwrap();
    let mut h = header("big", 1);
    h.cwd = Some("x".repeat(MAX_RECORD as usize + 1));
    assert!(matches!(
        c.put(h, uid(1)),
        Err(CatalogError::RecordTooLarge { .. })
    ));
    assert_eq!(c.record_count(), 0);
    c.put(header("small", 1), uid(1)).unwrap();
}

#[test]
fn read_only_open_of_a_missing_catalog_is_empty_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (c, replay) = Catalog::open(dir.path(), true).unwrap();
    assert!(c.is_empty());
    assert!(!replay.created);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn compaction_keeps_exactly_the_live_set() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _) = Catalog::open(dir.path(), false).unwrap();
    c.set_compact_min_records(16);
    let mut model = State::new();
    let mut compactions = 0;
    let mut last = 0;
    for round in 0..200u64 {
        let id = format!("s{}", round % 7);
        let u = uid((round % 7) as u8);
        if round % 5 == 4 && model.contains_key(&id) {
            c.delete(&id).unwrap();
            model.remove(&id);
        } else {
            let h = header(&id, round);
            c.put(h.clone(), u).unwrap();
            model.insert(id, (h, u));
        }
        if c.record_count() < last {
            compactions += 1;
        }
        last = c.record_count();
        assert!(c.record_count() <= 16.max(4 * c.len() as u64) + 1);
        assert_eq!(state(&c), model);
    }
    assert!(compactions > 5, "compacted {compactions} times");

    c.compact().unwrap();
    assert_eq!(c.record_count(), model.len() as u64);
    let bytes = fs::read(dir.path().join(CATALOG_FILE)).unwrap();
    assert_eq!(frame_offsets(&bytes).len() - 1, model.len());
    assert_eq!(bytes.len() as u64, c.file_len());
    assert!(!dir.path().join("CATALOG.tmp").exists());
    assert_eq!(mode(&dir.path().join(CATALOG_FILE)), 0o600);
    // Appends continue on the new file.
    c.put(header("after", 1), uid(99)).unwrap();
    model.insert("after".into(), (header("after", 1), uid(99)));
    drop(c);
    let (c, replay) = Catalog::open(dir.path(), false).unwrap();
    assert_eq!(state(&c), model);
    assert_eq!(replay.records, model.len() as u64);
}

#[test]
fn default_threshold_compacts_after_1024_records() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _) = Catalog::open(dir.path(), false).unwrap();
    let mut max_records = 0;
    for t in 0..1100 {
        c.put(header("only", t), uid(1)).unwrap();
        max_records = max_records.max(c.record_count());
    }
    assert_eq!(max_records, 1024);
    assert!(c.record_count() < 100);
    drop(c);
    let (c, _) = Catalog::open(dir.path(), true).unwrap();
    assert_eq!(c.get("only").unwrap().header.created_at, 1099);
}

#[test]
fn open_compacts_an_oversized_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _) = Catalog::open(dir.path(), false).unwrap();
    // Build a long file with a high threshold, then reopen with the default.
    c.set_compact_min_records(5000);
    for t in 0..1030 {
        c.put(header("x", t), uid(1)).unwrap();
    }
    drop(c);
    let (c, replay) = Catalog::open(dir.path(), false).unwrap();
    assert!(replay.compacted);
    assert_eq!(replay.records, 1030);
    assert_eq!(c.record_count(), 1);
    assert_eq!(c.get("x").unwrap().header.created_at, 1029);
}

#[test]
fn truncation_at_every_offset_opens_a_whole_record_prefix() {
    let src = tempfile::tempdir().unwrap();
    let states = build_mixed(src.path());
    let bytes = fs::read(src.path().join(CATALOG_FILE)).unwrap();
    let offsets = frame_offsets(&bytes);
    assert_eq!(offsets.len(), states.len());

    let work = tempfile::tempdir().unwrap();
    let path = work.path().join(CATALOG_FILE);
    for cut in 0..=bytes.len() {
        fs::write(&path, &bytes[..cut]).unwrap();
        let (c, replay) =
            Catalog::open(work.path(), false).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        // Whole records that fit below the cut.
        let k = offsets.iter().rposition(|&o| o <= cut).unwrap_or(0);
        assert_eq!(state(&c), states[k], "cut at {cut}");
        assert_eq!(replay.records, k as u64, "cut at {cut}");
        let valid = if cut < CATALOG_HEADER_LEN {
            0
        } else {
            offsets[k]
        };
        assert_eq!(replay.torn_bytes, (cut - valid) as u64, "cut at {cut}");
        // The torn bytes are gone from the file, and appends continue.
        let expect_len = offsets[k];
        assert_eq!(fs::metadata(&path).unwrap().len(), expect_len as u64);
        drop(c);
        let (mut c, replay) = Catalog::open(work.path(), false).unwrap();
        assert_eq!(replay.torn_bytes, 0);
        c.put(header("new", 9), uid(200)).unwrap();
        drop(c);
        let (c, _) = Catalog::open(work.path(), true).unwrap();
        let mut want = states[k].clone();
        want.insert("new".into(), (header("new", 9), uid(200)));
        assert_eq!(state(&c), want, "cut at {cut}, after append");
    }
}

#[test]
fn torn_tail_is_left_alone_when_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let states = build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let bytes = fs::read(&path).unwrap();
    let offsets = frame_offsets(&bytes);
    let cut = offsets[3] + 5;
    fs::write(&path, &bytes[..cut]).unwrap();
    let (c, replay) = Catalog::open(dir.path(), true).unwrap();
    assert_eq!(state(&c), states[3]);
    assert_eq!(replay.torn_bytes, 5);
    assert_eq!(fs::metadata(&path).unwrap().len(), cut as u64);
}

#[test]
fn zero_filled_tail_is_torn() {
    let dir = tempfile::tempdir().unwrap();
    let states = build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let mut bytes = fs::read(&path).unwrap();
    let len = bytes.len();
    bytes.extend_from_slice(&[0; 300]);
    fs::write(&path, &bytes).unwrap();
    let (c, replay) = Catalog::open(dir.path(), false).unwrap();
    assert_eq!(state(&c), *states.last().unwrap());
    assert_eq!(replay.torn_bytes, 300);
    assert_eq!(fs::metadata(&path).unwrap().len(), len as u64);
}

#[test]
fn torn_last_record_with_zeroed_pages_is_torn() {
    // A crash can persist the end of the last frame but not its start (pages
    // are written back in any order): the length field reads as zero.
    let dir = tempfile::tempdir().unwrap();
    let states = build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let mut bytes = fs::read(&path).unwrap();
    let offsets = frame_offsets(&bytes);
    let last = offsets[offsets.len() - 2];
    bytes[last..last + 12].fill(0);
    fs::write(&path, &bytes).unwrap();
    let (c, replay) = Catalog::open(dir.path(), false).unwrap();
    assert_eq!(state(&c), states[states.len() - 2]);
    assert_eq!(replay.torn_bytes, (bytes.len() - last) as u64);
}

#[test]
fn every_bit_flip_in_a_non_last_record_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let bytes = fs::read(&path).unwrap();
    let offsets = frame_offsets(&bytes);
    let last_start = offsets[offsets.len() - 2];
    let mut checked = 0;
    for byte in CATALOG_HEADER_LEN..last_start {
        let frame_start = *offsets.iter().filter(|&&o| o <= byte).max().unwrap();
        for bit in 0..8 {
            let mut bad = bytes.clone();
            bad[byte] ^= 1 << bit;
            fs::write(&path, &bad).unwrap();
            // Writable for a sample: the failed open must not touch the file.
            let read_only = byte % 7 != 0;
            match Catalog::open(dir.path(), read_only) {
                Err(CatalogError::Corrupt { offset, .. }) => {
                    assert_eq!(offset, frame_start as u64, "byte {byte} bit {bit}")
                }
                Err(e) => panic!("byte {byte} bit {bit}: wrong error {e}"),
                Ok(_) => panic!("byte {byte} bit {bit}: opened a corrupt catalog"),
            }
            assert_eq!(fs::read(&path).unwrap(), bad);
            checked += 1;
        }
    }
    assert!(checked > 1000, "{checked}");
}

#[test]
fn every_bit_flip_in_the_file_header_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let bytes = fs::read(&path).unwrap();
    for byte in 0..CATALOG_HEADER_LEN {
        for bit in 0..8 {
            let mut bad = bytes.clone();
            bad[byte] ^= 1 << bit;
            fs::write(&path, &bad).unwrap();
            let err = Catalog::open(dir.path(), false).expect_err("flipped header");
            if (8..12).contains(&byte) {
                assert!(
                    matches!(err, CatalogError::UnsupportedVersion { supported: 1, .. }),
                    "{err}"
                );
            } else {
                assert!(matches!(err, CatalogError::Corrupt { .. }), "{err}");
            }
            assert_eq!(fs::read(&path).unwrap(), bad);
        }
    }
}

#[test]
fn oversized_record_length_is_corruption_even_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.len();
    bytes.extend_from_slice(&(MAX_RECORD + 1).to_le_bytes());
    bytes.extend_from_slice(&[0xAB; 12]);
    fs::write(&path, &bytes).unwrap();
    match Catalog::open(dir.path(), false) {
        Err(CatalogError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, at as u64);
            assert!(reason.contains("limit"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fs::read(&path).unwrap(), bytes);
}

#[test]
fn valid_frames_that_make_no_sense_are_corruption() {
    let dir = tempfile::tempdir().unwrap();
    build_mixed(dir.path());
    let path = dir.path().join(CATALOG_FILE);
    let good = fs::read(&path).unwrap();
    let cases = [
        CatalogRecord::Delete { id: "ghost".into() },
        CatalogRecord::Put {
            header: header("a", 1),
            session_uid: uid(77),
        },
        CatalogRecord::Put {
            header: header("", 1),
            session_uid: uid(1),
        },
    ];
    for record in cases {
        let mut bytes = good.clone();
        let at = bytes.len();
        bytes.extend_from_slice(&encode_frame(&record).unwrap());
        fs::write(&path, &bytes).unwrap();
        match Catalog::open(dir.path(), false) {
            Err(CatalogError::Corrupt { offset, .. }) => assert_eq!(offset, at as u64),
            other => panic!("{record:?}: {other:?}"),
        }
    }
    // A checksum-valid frame whose payload is not a record.
    let mut bytes = good.clone();
    let at = bytes.len();
    let payload = [0xFFu8; 5];
    bytes.extend_from_slice(&5u32.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&5u32.to_le_bytes());
    crc.update(&payload);
    bytes.extend_from_slice(&crc.finalize().to_le_bytes());
    bytes.extend_from_slice(&payload);
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        Catalog::open(dir.path(), false),
        Err(CatalogError::Corrupt { offset, .. }) if offset == at as u64
    ));
}

#[test]
fn record_encoding_is_pinned() {
    // Pins the bincode encoding of a record, and so the field order of
    // SessionHeader: if this fails, the catalog format changed and
    // CATALOG_FORMAT_VERSION must be bumped.
    let record = CatalogRecord::Put {
        header: SessionHeader {
            version: 0,
            id: "s1".into(),
            created_at: 300,
            cwd: Some("/w".into()),
            parent_session: None,
            seed_length: Some(4),
            origin: Some("subagent".into()),
            delegation_depth: 1,
            agent_preset: None,
        },
        session_uid: [7; 16],
    };
    let frame = encode_frame(&record).unwrap();
    let want_payload: Vec<u8> = [
        &[0u8, 0, 2][..],
        b"s1",
        &[251, 44, 1, 1, 2],
        b"/w",
        &[0, 1, 4, 1, 8],
        b"subagent",
        &[1, 0],
        &[7; 16],
    ]
    .concat();
    assert_eq!(&frame[8..], &want_payload[..]);
    assert_eq!(&frame[0..4], &(want_payload.len() as u32).to_le_bytes());
    let delete = encode_frame(&CatalogRecord::Delete { id: "s1".into() }).unwrap();
    assert_eq!(&delete[8..], &[1, 2, b's', b'1']);
}

#[test]
fn orphan_and_missing_session_dirs_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, replay) = Catalog::open(dir.path(), false).unwrap();
    assert!(replay.orphan_dirs.is_empty() && replay.missing_dirs.is_empty());
    let sessions = dir.path().join(SESSIONS_DIR);
    assert_eq!(mode(&sessions), 0o700);
    // Store protocol: directory first, then the put.
    for id in ["live/1", "live2"] {
        create_dir_private(c.session_dir(id).unwrap()).unwrap();
        c.put(header(id, 1), uid(1)).unwrap();
    }
    c.put(header("no-dir", 1), uid(2)).unwrap();
    // A crashed creation and a crashed deletion.
    create_dir_private(c.session_dir("crashed").unwrap()).unwrap();
    c.delete("live2").unwrap();
    assert_eq!(c.sessions_dir(), sessions);
    drop(c);
    let (c, replay) = Catalog::open(dir.path(), true).unwrap();
    assert_eq!(
        replay.orphan_dirs,
        vec![sessions.join("crashed"), sessions.join("live2")]
    );
    assert_eq!(replay.missing_dirs, vec!["no-dir".to_string()]);
    assert_eq!(c.get("live/1").unwrap().dir_name, "live~2F1");
}

// ---------------------------------------------------------------------------
// Session directory names
// ---------------------------------------------------------------------------

/// Decodes a plain (unhashed) name; for a hashed name returns the decoded
/// prefix and the hash.
fn decode_name(name: &str) -> (Vec<u8>, Option<String>) {
    let (body, hash) = match name.split_once("~h") {
        Some((b, h)) => (b, Some(h.to_string())),
        None => (name, None),
    };
    let b = body.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'~' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            assert!(
                hex.bytes()
                    .all(|c| c.is_ascii_digit() || (b'A'..=b'F').contains(&c))
            );
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    (out, hash)
}

fn check_name(id: &str) -> String {
    let name = encode_session_dir_name(id).unwrap();
    assert!(!name.is_empty());
    assert!(
        name.len() <= 255 && name.len() <= fsutil::MAX_DIR_NAME,
        "{name}"
    );
    assert!(!name.contains('/') && !name.contains('\0'), "{name:?}");
    assert!(
        name != "." && name != ".." && !name.starts_with('.'),
        "{name}"
    );
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-~".contains(&b)),
        "{name:?}"
    );
    let (decoded, hash) = decode_name(&name);
    match hash {
        None => assert_eq!(decoded, id.as_bytes(), "{name}"),
        Some(h) => {
            assert!(id.as_bytes().starts_with(&decoded), "{name}");
            assert!(decoded.len() >= 40, "{name}");
            assert_eq!(h, format!("{:032x}", fnv1a_128(id.as_bytes())));
        }
    }
    name
}

#[test]
fn session_dir_names_are_injective_and_safe() {
    let long_a = "x".repeat(300);
    let long_b = format!("{}y", "x".repeat(299));
    let p150 = "p".repeat(150);
    let hashed_name = encode_session_dir_name(&long_a).unwrap();
    let mut ids: Vec<String> = [
        ".", "..", "...", ".a", "a.", "a", "A", "a/b", "a~b", "a~2Fb", "a/2Fb", "~", "~2E", "~7E",
        "~h", "\0", "a\0b", "é", "e\u{301}", "/", "//", "a b", "\n", "CATALOG", "MANIFEST",
        "sessions", "x.tmp", "🦀", "-", "_",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ids.extend([
        long_a.clone(),
        long_b,
        format!("{p150}{}", "q".repeat(100)),
        format!("{p150}{}", "r".repeat(100)),
        format!("{p150}/{}", "q".repeat(99)),
        "k".repeat(200),
        "k".repeat(201),
        "/".repeat(66),
        "/".repeat(67),
        "é".repeat(100),
        format!("a{}", "é".repeat(100)),
        long_a[..120].to_string(),
        hashed_name.clone(),
        format!("{}\0", "z".repeat(250)),
    ]);
    let mut names = HashSet::new();
    for id in &ids {
        assert!(names.insert(check_name(id)), "duplicate name for {id:?}");
    }
    assert_eq!(names.len(), ids.len());
    assert_eq!(
        encode_session_dir_name("k".repeat(200).as_str())
            .unwrap()
            .len(),
        200
    );
    assert!(
        encode_session_dir_name(&"k".repeat(201))
            .unwrap()
            .contains("~h")
    );
    assert_eq!(encode_session_dir_name("."), Ok("~2E".to_string()));
    assert_eq!(encode_session_dir_name("a~b"), Ok("a~7Eb".to_string()));
    assert_eq!(encode_session_dir_name("a\0b"), Ok("a~00b".to_string()));
    assert_eq!(encode_session_dir_name(""), Err(BadId::Empty));
}

fn id_strategy() -> impl Strategy<Value = String> {
    let alphabet =
        prop::sample::select(vec!['a', 'Z', '.', '~', '/', '\0', 'é', '2', 'F', 'h', '-']);
    prop::collection::vec(alphabet, 1..260).prop_map(|v| v.into_iter().collect())
}

proptest! {
    #[test]
    fn session_dir_names_are_injective(
        prefix in prop::collection::vec(prop::sample::select(vec!['x', '/', '.']), 0..250)
            .prop_map(|v| v.into_iter().collect::<String>()),
        a in id_strategy(),
        b in id_strategy(),
    ) {
        let a = format!("{prefix}{a}");
        let b = format!("{prefix}{b}");
        let (na, nb) = (check_name(&a), check_name(&b));
        prop_assert_eq!(a == b, na == nb, "{:?} {:?} -> {} {}", a, b, na, nb);
    }
}

// ---------------------------------------------------------------------------
// Manifest
// ---------------------------------------------------------------------------

fn rewrite_with_crc(bytes: &mut [u8]) {
    let body = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..body]);
    bytes[body..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn manifest_round_trip_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let m = Manifest::create(dir.path()).unwrap();
    assert_eq!(Manifest::open(dir.path()).unwrap(), m);
    let bytes = fs::read(dir.path().join(MANIFEST_FILE)).unwrap();
    assert_eq!(bytes.len(), MANIFEST_LEN);
    assert_eq!(&bytes[0..8], b"SLOGSTOR");
    assert_eq!(&bytes[8..12], &STORE_FORMAT_VERSION.to_le_bytes());
    assert_eq!(&bytes[16..32], &m.store_id);
    assert_eq!(m.store_id_hex().len(), 32);
    assert!(matches!(
        Manifest::create(dir.path()),
        Err(ManifestError::AlreadyExists { .. })
    ));
    let other = tempfile::tempdir().unwrap();
    assert_ne!(Manifest::create(other.path()).unwrap().store_id, m.store_id);
}

#[test]
fn manifest_missing_and_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(matches!(
        Manifest::open(&missing),
        Err(ManifestError::Missing { .. })
    ));
    assert!(matches!(
        Manifest::open(dir.path()),
        Err(ManifestError::Missing { .. })
    ));
    // A crashed creation leaves only the temporary file: still empty.
    fs::write(dir.path().join("MANIFEST.tmp"), b"partial").unwrap();
    assert!(matches!(
        Manifest::open(dir.path()),
        Err(ManifestError::Missing { .. })
    ));
    let m = Manifest::create(dir.path()).unwrap();
    assert!(!dir.path().join("MANIFEST.tmp").exists());
    assert_eq!(Manifest::open(dir.path()).unwrap(), m);

    let other = tempfile::tempdir().unwrap();
    fs::write(other.path().join("notes.txt"), b"hello").unwrap();
    let err = Manifest::open(other.path()).unwrap_err();
    assert!(matches!(err, ManifestError::NotAStore { .. }), "{err}");
    assert!(err.to_string().contains("not a sessionlog store"));
    assert!(matches!(
        Manifest::create(other.path()),
        Err(ManifestError::NotAStore { .. })
    ));

    let (m2, created) = Manifest::open_or_create(&missing).unwrap();
    assert!(created);
    assert_eq!(mode(&missing), 0o700);
    assert_eq!(Manifest::open_or_create(&missing).unwrap(), (m2, false));
}

#[test]
fn manifest_version_mismatch_names_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    Manifest::create(dir.path()).unwrap();
    let path = dir.path().join(MANIFEST_FILE);
    let bytes = fs::read(&path).unwrap();
    // An older store (version 1: records without packs) and a newer one.
    for found in [STORE_FORMAT_VERSION - 1, STORE_FORMAT_VERSION + 1] {
        let mut bytes = bytes.clone();
        bytes[8..12].copy_from_slice(&found.to_le_bytes());
        rewrite_with_crc(&mut bytes);
        fs::write(&path, &bytes).unwrap();
        let err = Manifest::open(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                ManifestError::UnsupportedVersion { found: f, supported: 2, .. } if f == found
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("store format version {found}")),
            "{msg}"
        );
        assert!(msg.contains("reads only version 2"), "{msg}");
    }

    // A newer version with a longer layout is still reported as a version
    // mismatch, not as corruption (the envelope: magic, version, final CRC).
    let mut longer = bytes[..32].to_vec();
    longer[8..12].copy_from_slice(&7u32.to_le_bytes());
    longer.extend_from_slice(&[5; 20]);
    longer.extend_from_slice(&[0; 4]);
    rewrite_with_crc(&mut longer);
    fs::write(&path, &longer).unwrap();
    assert!(matches!(
        Manifest::open(dir.path()),
        Err(ManifestError::UnsupportedVersion { found: 7, .. })
    ));
}

#[test]
fn manifest_damage_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    Manifest::create(dir.path()).unwrap();
    let path = dir.path().join(MANIFEST_FILE);
    let good = fs::read(&path).unwrap();
    for byte in 0..good.len() {
        for bit in 0..8 {
            let mut bad = good.clone();
            bad[byte] ^= 1 << bit;
            fs::write(&path, &bad).unwrap();
            let err = Manifest::open(dir.path()).unwrap_err();
            assert!(
                matches!(err, ManifestError::Corrupt { .. }),
                "{byte}/{bit}: {err}"
            );
        }
    }
    for len in 0..good.len() {
        fs::write(&path, &good[..len]).unwrap();
        assert!(matches!(
            Manifest::open(dir.path()),
            Err(ManifestError::Corrupt { .. })
        ));
    }
    // Nonzero flags with a valid checksum.
    let mut flagged = good.clone();
    flagged[12] = 1;
    rewrite_with_crc(&mut flagged);
    fs::write(&path, &flagged).unwrap();
    assert!(matches!(
        Manifest::open(dir.path()),
        Err(ManifestError::Corrupt { .. })
    ));
}

// ---------------------------------------------------------------------------
// File-system helpers
// ---------------------------------------------------------------------------

#[test]
fn store_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    Manifest::open_or_create(&root).unwrap();
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&root.join(MANIFEST_FILE)), 0o600);
    let (mut c, _) = Catalog::open(&root, false).unwrap();
    assert_eq!(mode(&root.join(CATALOG_FILE)), 0o600);
    assert_eq!(mode(&root.join(SESSIONS_DIR)), 0o700);
    c.put(header("s", 1), uid(1)).unwrap();
    c.compact().unwrap();
    assert_eq!(mode(&root.join(CATALOG_FILE)), 0o600);

    let sub = root.join("d");
    create_dir_private(&sub).unwrap();
    assert_eq!(mode(&sub), 0o700);
    assert!(create_dir_private(&sub).is_err());
    let f = root.join("f");
    create_file_private(&f).unwrap();
    assert_eq!(mode(&f), 0o600);
    assert!(create_file_private(&f).is_err(), "create_new");
    write_atomic(&root, "w", b"x").unwrap();
    assert_eq!(mode(&root.join("w")), 0o600);
}

#[test]
fn write_atomic_replaces_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    write_atomic(dir.path(), "f", b"one").unwrap();
    // A stale temporary file from a crash does not block the next write.
    fs::write(dir.path().join("f.tmp"), b"stale").unwrap();
    write_atomic(dir.path(), "f", b"two").unwrap();
    assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"two");
    assert!(!dir.path().join("f.tmp").exists());
    for bad in ["", ".", "..", "a/b"] {
        assert!(write_atomic(dir.path(), bad, b"x").is_err(), "{bad:?}");
    }
    // A failing write (missing directory) leaves nothing behind.
    let missing = dir.path().join("missing");
    assert!(write_atomic(&missing, "f", b"x").is_err());
    assert!(!missing.exists());
    fsutil::sync_dir(dir.path()).unwrap();
}
