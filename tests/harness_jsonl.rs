//! The harness's JSONL formats on the way in and out: packed chunk rows,
//! Zstandard logs, root layouts, and import into / export from a store.
//!
//! The fixture tests use `../shared/fixtures/` (real harness logs and their
//! expected outputs). When they are absent the tests say so loudly and skip;
//! set `SESSIONLOG_REQUIRE_FIXTURES=1` (CI does) to make that a failure.

use proptest::prelude::*;
use serde_json::Value;
use sessionlog::adapters::harness::{
    self, ExportOptions, ImportError, ImportOptions, Row, ZstdError, cwd_dir_name, export_path,
    export_session, export_session_to_root, find_sessions, id_escape, id_unescape, import_file,
    pack_chunks, read_zstd_session, write_session_packed, write_zstd_session,
};
use sessionlog::adapters::jsonl;
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::json::value_eq;
use sessionlog::store::{Durability, Options, Store};
use sessionlog::violation::Rule;
use std::path::{Path, PathBuf};

mod common;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The fixture files whose manifest says `check = ok`.
fn ok_fixtures(dir: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(dir.join("harness-jsonl/MANIFEST.tsv")).unwrap();
    let mut lines = manifest.lines();
    let cols: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let file_col = cols.iter().position(|c| *c == "filename").unwrap();
    let check_col = cols.iter().position(|c| *c == "check").unwrap();
    let files: Vec<PathBuf> = lines
        .map(|l| l.split('\t').collect::<Vec<_>>())
        .filter(|r| r[check_col] == "ok")
        .map(|r| dir.join("harness-jsonl").join(r[file_col]))
        .collect();
    assert!(files.len() > 50, "expected many ok fixtures");
    files
}

fn store(dir: &Path) -> Store {
    store_with(dir, false)
}

fn store_with(dir: &Path, strict: bool) -> Store {
    Store::open(
        dir,
        Options {
            durability: Durability::None,
            strict,
            ..Options::default()
        },
    )
    .unwrap()
}

fn json_lines(text: &[u8]) -> Vec<Value> {
    std::str::from_utf8(text)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn normalise_header(v: &mut Value) {
    if let Some(h) = v.as_object_mut() {
        h.entry("version").or_insert(Value::from(0));
        h.entry("delegationDepth").or_insert(Value::from(0));
    }
}

fn assert_values_eq(got: &[Value], want: &[Value], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: line counts differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            value_eq(g, w),
            "{what}: line {} differs:\n got {g}\nwant {w}",
            i + 1
        );
    }
}

fn export(store: &Store, id: &str, opts: ExportOptions) -> Vec<u8> {
    let mut out = Vec::new();
    export_session(store, id, &mut out, opts).unwrap();
    out
}

fn header(id: &str) -> SessionHeader {
    SessionHeader::new(id, 1)
}

fn ev(kind: &str, seq: u64, data: &str) -> OwnedEvent {
    Event::new(kind, seq, 1000 + seq as i64, data).unwrap()
}

fn text_chunk(seq: u64, turn: u32, text: &str) -> OwnedEvent {
    ev(
        "assistant/chunk",
        seq,
        &format!(
            r#"{{"turn":{turn},"step":1,"chunk":{{"type":"text-delta","index":0,"text":"{text}"}}}}"#
        ),
    )
}

/// `turns` closed turns, each with `chunks` text chunks in one step.
fn session_events(turns: u32, chunks: u32) -> Vec<OwnedEvent> {
    fn push(out: &mut Vec<OwnedEvent>, kind: &str, data: &str) {
        let seq = out.len() as u64;
        out.push(ev(kind, seq, data));
    }
    let mut out = Vec::new();
    for turn in 1..=turns {
        push(&mut out, "turn/start", &format!(r#"{{"turn":{turn}}}"#));
        push(
            &mut out,
            "step/start",
            &format!(r#"{{"turn":{turn},"step":1}}"#),
        );
        for c in 0..chunks {
            let seq = out.len() as u64;
            out.push(text_chunk(seq, turn, &format!("w{c} ")));
        }
        push(
            &mut out,
            "step/end",
            &format!(r#"{{"turn":{turn},"step":1}}"#),
        );
        push(
            &mut out,
            "turn/end",
            &format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#),
        );
    }
    out
}

fn plain_file(header: &SessionHeader, events: &[OwnedEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    jsonl::write_session(&mut out, header, events).unwrap();
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

#[test]
fn every_ok_fixture_imports_exports_and_round_trips() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    let mut repaired = 0;
    for (n, file) in ok_fixtures(&dir).iter().enumerate() {
        let name = file.file_stem().unwrap().to_str().unwrap();
        let work = tmp.path().join(n.to_string());
        std::fs::create_dir_all(&work).unwrap();
        let s1 = store(&work.join("s1"));
        let rep = import_file(&s1, file, ImportOptions::default())
            .unwrap_or_else(|e| panic!("{name}: import failed: {e}"));
        let expected = std::fs::read(dir.join(format!("expected/{name}.events.jsonl"))).unwrap();
        let mut want = json_lines(&expected);
        normalise_header(&mut want[0]);
        if rep.events == 0 {
            // A header-only file is a session with no events: kept as such.
            assert_eq!(want.len(), 1, "{name}: expected only a header");
            let listed = s1.list().unwrap();
            assert_eq!(listed.len(), 1, "{name}: the header-only session is listed");
            assert!(s1.load(&rep.id).unwrap().1.is_empty());
            continue;
        }
        // Import, then export plain: the expected logical log, plus the
        // repair closers when the last turn was open.
        let closers =
            json_lines(&std::fs::read(dir.join(format!("expected/{name}.repair.jsonl"))).unwrap());
        let got_closers: Vec<Value> = rep
            .closers
            .iter()
            .map(|e| serde_json::from_str(&e.to_json()).unwrap())
            .collect();
        assert_values_eq(&got_closers, &closers, &format!("{name} closers"));
        repaired += usize::from(!closers.is_empty());
        want.extend(closers);
        let plain = export(&s1, &rep.id, ExportOptions::default());
        assert_values_eq(&json_lines(&plain), &want, &format!("{name} plain export"));
        let (h1, events1) = s1.load(&rep.id).unwrap();

        // Export packed, read back: the same events, byte for byte.
        let packed = export(
            &s1,
            &rep.id,
            ExportOptions {
                pack_chunks: true,
                zstd: false,
            },
        );
        let back = jsonl::read_session(&packed, false).unwrap();
        assert!(back.torn.is_none());
        assert_eq!(back.header.header, h1, "{name}: packed header");
        assert_eq!(back.events, events1, "{name}: packed export reads back");
        assert_eq!(plain_file(&h1, &events1), plain, "{name}: plain bytes");

        // Export, import into a second store: the same contents.
        let plain_path = write(&work, "plain.jsonl", &plain);
        let s2 = store(&work.join("s2"));
        let rep2 = import_file(&s2, &plain_path, ImportOptions::default()).unwrap();
        assert!(rep2.closers.is_empty() && rep2.torn.is_none());
        assert_eq!(s2.load(&rep.id).unwrap(), (h1.clone(), events1.clone()));

        // Zstandard (packed inside frames), through a root.
        let root = work.join("root");
        let opts = ExportOptions {
            pack_chunks: true,
            zstd: true,
        };
        let zpath = export_session_to_root(&s1, &rep.id, &root, opts).unwrap();
        assert_eq!(zpath, export_path(&root, &h1, true));
        assert_eq!(find_sessions(&root).unwrap(), vec![zpath.clone()]);
        let z = read_zstd_session(&std::fs::read(&zpath).unwrap()).unwrap();
        assert!(z.torn.is_none());
        let turn_ends = events1.iter().filter(|e| e.kind == "turn/end").count();
        let last_is_end = events1.last().unwrap().kind == "turn/end";
        assert_eq!(z.frames, 1 + turn_ends + usize::from(!last_is_end));
        let s3 = store(&work.join("s3"));
        let rep3 = import_file(&s3, &zpath, ImportOptions::default()).unwrap();
        assert!(rep3.zstd && rep3.torn_frame.is_none());
        assert_eq!(s3.load(&rep.id).unwrap(), (h1, events1));
        checked += 1;
    }
    assert!(checked > 50, "checked only {checked} fixtures");
    assert!(
        repaired >= 1,
        "no fixture with an open last turn was checked"
    );
}

#[test]
fn fixture_packed_rows_repack_byte_for_byte() {
    let Some(dir) = common::fixtures() else {
        return;
    };
    let mut files_checked = 0;
    let mut rows_checked = 0;
    for file in ok_fixtures(&dir) {
        let bytes = std::fs::read(&file).unwrap();
        let text = std::str::from_utf8(&bytes).unwrap();
        if !text.contains("\"seq0\"") {
            continue;
        }
        let session = jsonl::read_session(&bytes, false).unwrap();
        let rows = pack_chunks(&session.events);
        let original: Vec<&str> = text.lines().skip(1).filter(|l| !l.is_empty()).collect();
        assert_eq!(rows.len(), original.len(), "{}: row count", file.display());
        for (row, line) in rows.iter().zip(&original) {
            match row {
                Row::Packed(_) => {
                    assert_eq!(&row.to_json(), line, "{}", file.display());
                    rows_checked += 1;
                }
                Row::Event(_) => {
                    assert!(!line.contains("\"seq0\""), "{}: {line}", file.display());
                    let (a, b): (Value, Value) = (
                        serde_json::from_str(&row.to_json()).unwrap(),
                        serde_json::from_str(line).unwrap(),
                    );
                    assert!(value_eq(&a, &b), "{}: {line}", file.display());
                }
                other => unimplemented!("row {other:?}"),
            }
        }
        // The whole packed file, as values (event key order may differ:
        // closers write surfaceOp first).
        let mut out = Vec::new();
        write_session_packed(&mut out, &session.header.header, &session.events).unwrap();
        let got = json_lines(&out);
        let mut want = json_lines(&bytes);
        normalise_header(&mut want[0]);
        assert_values_eq(&got, &want, &file.display().to_string());
        files_checked += 1;
    }
    assert!(files_checked >= 10, "only {files_checked} packed fixtures");
    assert!(rows_checked >= 100, "only {rows_checked} packed rows");
}

// ---------------------------------------------------------------------------
// Packing, as a property
// ---------------------------------------------------------------------------

/// One generated event: its JSON data, and its block key when it is an
/// exact-shape packable chunk.
fn gen_event() -> impl Strategy<Value = (String, String, Option<String>)> {
    let text = (0u8..3, 1u8..3, 0u8..2, prop::bool::ANY).prop_map(|(kind, turn, index, quote)| {
        let kind = ["text-delta", "reasoning-delta", "text-delta"][kind as usize];
        let piece = if quote { r#""a\"\u00e9 é""# } else { r#""b""# };
        (
            "assistant/chunk".to_string(),
            format!(
                r#"{{"turn":{turn},"step":1,"chunk":{{"type":"{kind}","index":{index},"text":{piece}}}}}"#
            ),
            Some(format!("{kind}/{turn}/{index}")),
        )
    });
    let tool = (0u8..3, 0u8..3).prop_map(|(id, name)| {
        let id = ["c1", "c2", ""][id as usize];
        let name = ["", r#","name":"bash""#, r#","name":"""#][name as usize];
        let key = (!id.is_empty() && !name.contains(r#""""#)).then(|| format!("tool/{id}/{name}"));
        (
            "assistant/chunk".to_string(),
            format!(
                r#"{{"turn":1,"step":1,"chunk":{{"type":"tool-call-delta","index":1,"id":"{id}"{name},"argumentsDelta":"{{\"x\":1}}"}}}}"#
            ),
            key,
        )
    });
    let other = prop::sample::select(vec![
        (
            "assistant/chunk",
            r#"{"turn":1,"step":1,"chunk":{"type":"block-start","index":0,"blockType":"text"}}"#,
        ),
        (
            "assistant/chunk",
            r#"{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"x","extra":1}}"#,
        ),
        (
            "assistant/chunk",
            r#"{"step":1,"turn":1,"chunk":{"type":"text-delta","index":0,"text":"x"}}"#,
        ),
        (
            "assistant/chunk",
            r#"{"turn":1,"step":1,"chunk":{"type":"text-delta","index":-1,"text":"x"}}"#,
        ),
        (
            "assistant/chunk",
            r#"{"turn":1.0,"step":1,"chunk":{"type":"text-delta","index":0,"text":"x"}}"#,
        ),
        ("session/title", r#"{"title":"t"}"#),
    ])
    .prop_map(|(k, d)| {
        // `turn: 1.0` is a safe integer and exact-shape: packable, but
        // only with members whose turn bytes are `1.0` too.
        let key = d
            .starts_with(r#"{"turn":1.0"#)
            .then(|| "turn1.0".to_string());
        (k.to_string(), d.to_string(), key)
    });
    prop_oneof![4 => text, 3 => tool, 1 => other]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn packing_round_trips_and_packs_every_maximal_run(
        spec in prop::collection::vec((gen_event(), -3i64..6, 0u8..40), 0..60)
    ) {
        let max = (1i64 << 53) - 1;
        let mut time = 0i64;
        let mut events = Vec::new();
        let mut keys = Vec::new();
        for (i, ((kind, data, key), gap, jump)) in spec.into_iter().enumerate() {
            // Now and then a jump across the whole safe range, whose gap is
            // not a safe integer.
            time = if jump == 0 { if time > 0 { -max } else { max } } else { time + gap };
            time = time.clamp(-max, max);
            events.push(Event::new(kind, i as u64, time, &data).unwrap());
            keys.push(key);
        }
        let h = header("p");
        let mut out = Vec::new();
        write_session_packed(&mut out, &h, &events).unwrap();
        let back = jsonl::read_session(&out, false).unwrap();
        prop_assert_eq!(&back.events, &events);
        // Re-packing the expansion gives the same bytes.
        let mut again = Vec::new();
        write_session_packed(&mut again, &h, &back.events).unwrap();
        prop_assert_eq!(&again, &out);
        // The rows are exactly the maximal runs of 3+ of one key with safe gaps.
        let mut expected_rows = 0;
        let mut i = 0;
        while i < events.len() {
            let mut j = i + 1;
            if keys[i].is_some() {
                while j < events.len()
                    && keys[j] == keys[i]
                    && (events[j].time - events[j - 1].time).abs() <= max
                {
                    j += 1;
                }
            }
            expected_rows += if j - i >= 3 { 1 } else { j - i };
            i = j;
        }
        prop_assert_eq!(pack_chunks(&events).len(), expected_rows);
    }
}

// ---------------------------------------------------------------------------
// Zstandard
// ---------------------------------------------------------------------------

/// A Zstandard log of three turns (one frame each), and where its last frame
/// starts.
fn zstd_log() -> (Vec<OwnedEvent>, Vec<u8>, usize) {
    let events = session_events(3, 40);
    let bounds = harness::turn_batches(&events);
    assert_eq!(bounds.len(), 2);
    let mut full = Vec::new();
    write_zstd_session(&mut full, &header("z"), &events, &bounds).unwrap();
    let mut prefix = Vec::new();
    write_zstd_session(
        &mut prefix,
        &header("z"),
        &events[..bounds[1]],
        &bounds[..1],
    )
    .unwrap();
    assert!(full.starts_with(&prefix));
    (events, full, prefix.len())
}

#[test]
fn zstd_round_trip_packs_inside_frames() {
    let (events, full, _) = zstd_log();
    let z = read_zstd_session(&full).unwrap();
    assert_eq!((z.frames, z.torn), (4, None));
    let text = String::from_utf8(z.text.clone()).unwrap();
    assert_eq!(
        text.lines().count(),
        1 + 3 * (4 + 1),
        "one row per 40 chunks"
    );
    let s = jsonl::read_session(&z.text, false).unwrap();
    assert_eq!(s.events, events);
    assert!(s.torn.is_none());
    // No events: the header frame only.
    let mut only = Vec::new();
    write_zstd_session(&mut only, &header("z"), &[], &[]).unwrap();
    let z = read_zstd_session(&only).unwrap();
    assert_eq!(z.frames, 1);
    assert_eq!(jsonl::read_session(&z.text, false).unwrap().events.len(), 0);
    // Bad boundaries are refused.
    assert!(write_zstd_session(&mut Vec::new(), &header("z"), &events, &[5, 5]).is_err());
    assert!(write_zstd_session(&mut Vec::new(), &header("z"), &events, &[0]).is_err());
}

#[test]
fn torn_zstd_frame_is_reported_not_fatal() {
    let (events, full, last) = zstd_log();
    let tmp = tempfile::tempdir().unwrap();
    let complete_turns = events.len() / 3 * 2;
    for cut in [
        full.len() - 1,
        full.len() - 4,
        last + (full.len() - last) / 2,
        last + 3,
        last + 1,
    ] {
        let torn = &full[..cut];
        let z = read_zstd_session(torn).unwrap();
        let t = z
            .torn
            .clone()
            .unwrap_or_else(|| panic!("cut {cut}: not torn"));
        assert_eq!((t.frame, t.offset), (3, last as u64), "cut {cut}");
        assert_eq!(z.frames, 3);
        let s = jsonl::read_session(&z.text, false).unwrap();
        assert!(s.events.len() >= complete_turns, "cut {cut}");
        assert_eq!(s.events[..], events[..s.events.len()], "cut {cut}");
        if cut == full.len() - 1 {
            // Only the checksum is torn: every record is there.
            assert_eq!(s.events.len(), events.len());
        }
        // Import: not fatal, reported, the open turn closed.
        let path = write(tmp.path(), &format!("{cut}.jsonl.zstd"), torn);
        let st = store(&tmp.path().join(format!("s{cut}")));
        let rep = import_file(&st, &path, ImportOptions::default()).unwrap();
        assert_eq!(rep.torn_frame, Some(t));
        assert_eq!(rep.events, s.events.len() as u64);
        assert_eq!(rep.closers.len(), s.state.closers().len(), "cut {cut}");
    }
    // A zero-filled tail is torn too.
    let mut zeros = full.clone();
    zeros.extend_from_slice(&[0; 100]);
    let z = read_zstd_session(&zeros).unwrap();
    assert_eq!((z.frames, z.torn.unwrap().offset), (4, full.len() as u64));
}

#[test]
fn damaged_zstd_is_an_error() {
    let (_, full, last) = zstd_log();
    // A flipped byte inside a complete frame.
    let mut bad = full.clone();
    bad[last - 20] ^= 0x55;
    assert!(matches!(
        read_zstd_session(&bad),
        Err(ZstdError::Corrupt { .. })
    ));
    // Garbage where a frame should start.
    let mut bad = full.clone();
    bad.extend_from_slice(b"not zstd");
    assert!(matches!(
        read_zstd_session(&bad),
        Err(ZstdError::Corrupt { frame: 4, .. })
    ));
    let frame = |s: &str| zstd::bulk::compress(s.as_bytes(), 3).unwrap();
    let h = header("z").to_json();
    // The header frame must be exactly one line.
    let two = frame(&format!("{h}\n{h}\n"));
    assert!(matches!(
        read_zstd_session(&two),
        Err(ZstdError::HeaderFrame { .. })
    ));
    // A complete frame must end its last line.
    let mut open = frame(&format!("{h}\n"));
    open.extend(frame(
        r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1}}"#,
    ));
    assert!(matches!(
        read_zstd_session(&open),
        Err(ZstdError::Unterminated { frame: 1, .. })
    ));
    // Import names the file.
    let tmp = tempfile::tempdir().unwrap();
    let path = write(tmp.path(), "s.jsonl.zstd", &open);
    let st = store(&tmp.path().join("s"));
    let err = import_file(&st, &path, ImportOptions::default()).unwrap_err();
    assert!(matches!(err, ImportError::Zstd { .. }));
    assert!(err.to_string().contains("s.jsonl.zstd"), "{err}");
}

// ---------------------------------------------------------------------------
// Roots
// ---------------------------------------------------------------------------

#[test]
fn id_escape_examples() {
    let cases = [
        ("a/b", "a~002Fb"),
        ("~", "~007E"),
        ("é", "~00E9"),
        ("😀", "~D83D~DE00"),
        (".", "~002E"),
        ("..", "~002E~002E"),
        ("...", "..."),
        ("a.b_c-D9", "a.b_c-D9"),
        ("session:/雪", "session~003A~002F~96EA"),
    ];
    for (id, name) in cases {
        assert_eq!(id_escape(id), name, "{id}");
        assert_eq!(id_unescape(name).as_deref(), Some(id), "{name}");
    }
    for bad in [".", "..", "a/b", "~002e", "~0061", "~D83D", "~12", "a b"] {
        assert_eq!(id_unescape(bad), None, "{bad}");
    }
}

#[test]
fn cwd_dir_names() {
    assert_eq!(cwd_dir_name(None), "_no-cwd");
    assert_eq!(cwd_dir_name(Some("/")), "cwd-8a5edab28263");
    assert_eq!(cwd_dir_name(Some("/workspace/dsh")), "cwd-5abdd0c5b009");
    assert_eq!(cwd_dir_name(Some("/home/u/proj é")), "cwd-4f01a19f0b7c");
}

#[test]
fn find_sessions_walks_all_three_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mk = |rel: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"{}\n").unwrap();
        p
    };
    let mut want = vec![
        // Older layout, with and without a cwd.
        mk("cwd-5abdd0c5b009/a~002Fb.jsonl"),
        mk("_no-cwd/plain.jsonl"),
        // Current layout, compressed and plain, in any project directory.
        mk("cwd-5abdd0c5b009/s1/session.jsonl.zstd"),
        mk("--workspace-dsh--/s2/session.jsonl"),
        mk("_no-cwd/~002E/session.jsonl.zstd"),
    ];
    // Both forms: the compressed log wins.
    mk("--p--/both/session.jsonl");
    want.push(mk("--p--/both/session.jsonl.zstd"));
    // Not sessions.
    mk("cwd-5abdd0c5b009/notes.txt");
    mk("--p--/loose.jsonl");
    mk("top.jsonl");
    mk("--p--/empty/other.jsonl");
    std::fs::create_dir_all(root.join("--p--/nothing")).unwrap();
    want.sort();
    assert_eq!(find_sessions(root).unwrap(), want);
    assert!(find_sessions(&root.join("missing")).is_err());

    let mut h = header("a/b");
    h.cwd = Some("/workspace/dsh".into());
    assert_eq!(
        export_path(root, &h, false),
        root.join("--workspace-dsh--/a~002Fb/session.jsonl")
    );
    assert_eq!(
        export_path(root, &header(".."), true),
        root.join("_no-cwd/~002E~002E/session.jsonl.zstd")
    );
}

// ---------------------------------------------------------------------------
// Import semantics
// ---------------------------------------------------------------------------

const H: &str = r#"{"type":"session","version":0,"id":"s","createdAt":1}"#;

fn file_of(lines: &[&str]) -> Vec<u8> {
    let mut f = format!("{H}\n");
    for l in lines {
        f.push_str(l);
        f.push('\n');
    }
    f.into_bytes()
}

const T0: &str = r#"{"type":"turn/start","seq":0,"time":5,"data":{"turn":1}}"#;
const S1: &str = r#"{"type":"step/start","seq":1,"time":6,"data":{"turn":1,"step":1}}"#;
const E2: &str = r#"{"type":"step/end","seq":2,"time":7,"data":{"turn":1,"step":1}}"#;
const END3: &str =
    r#"{"type":"turn/end","seq":3,"time":8,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;

#[test]
fn existing_ids_need_replace_and_replace_replaces() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(&tmp.path().join("s"));
    let a = write(tmp.path(), "a.jsonl", &file_of(&[T0, S1, E2, END3]));
    let b = write(tmp.path(), "b.jsonl", &file_of(&[T0, S1]));
    let rep = import_file(&st, &a, ImportOptions::default()).unwrap();
    assert_eq!((rep.events, rep.replaced, rep.closers.len()), (4, false, 0));
    let before = st.load("s").unwrap();
    let err = import_file(&st, &b, ImportOptions::default()).unwrap_err();
    assert!(
        matches!(err, ImportError::Exists { ref id, .. } if id == "s"),
        "{err}"
    );
    assert_eq!(st.load("s").unwrap(), before);
    let opts = ImportOptions {
        replace: true,
        repair: false,
        id: None,
    };
    let rep = import_file(&st, &b, opts).unwrap();
    assert!(rep.replaced && rep.left_open && rep.closers.is_empty());
    assert_eq!(st.load("s").unwrap().1.len(), 2);
}

#[test]
fn torn_tail_and_open_turn_are_reported_and_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(&tmp.path().join("s"));
    let mut f = file_of(&[T0, S1]);
    f.extend_from_slice(br#"{"type":"step/end","se"#);
    let p = write(tmp.path(), "t.jsonl", &f);
    let rep = import_file(&st, &p, ImportOptions::default()).unwrap();
    assert_eq!(rep.torn.as_ref().map(|t| t.line), Some(4));
    assert_eq!(rep.events, 2);
    let kinds: Vec<_> = rep.closers.iter().map(|e| e.kind.to_string()).collect();
    assert_eq!(kinds, ["step/end", "turn/end"]);
    assert_eq!(rep.closers[0].seq, 2);
    assert!(!rep.left_open);
    assert_eq!(st.load("s").unwrap().1.len(), 4);
}

/// Lines after the header, the rule broken, the line and seq reported.
type Case<'a> = (&'a [&'a str], Rule, Option<u64>, Option<u64>);

#[test]
fn corruption_names_file_line_and_seq_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(&tmp.path().join("s"));
    let good = write(tmp.path(), "good.jsonl", &file_of(&[T0, S1, E2, END3]));
    import_file(&st, &good, ImportOptions::default()).unwrap();
    let before = st.load("s").unwrap();
    let replace = ImportOptions {
        replace: true,
        repair: true,
        id: None,
    };
    let gap = r#"{"type":"step/end","seq":7,"time":7,"data":{"turn":1,"step":1}}"#;
    let end8 =
        r#"{"type":"turn/end","seq":8,"time":8,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;
    let bad_row = r#"{"type":"text-chunks","seq0":2,"time0":0,"data":{"turn":1,"step":1,"index":0,"dt":[],"texts":["a","b"]}}"#;
    let bad_op = r#"{"type":"user/message","seq":2,"time":7,"data":{},"surfaceOp":"prepend"}"#;
    let cases: [Case; 4] = [
        (&[T0, S1, gap, end8], Rule::Contiguity, Some(4), Some(7)),
        (&[T0, S1, "{not json", END3], Rule::Json, Some(4), None),
        (&[T0, S1, bad_row, END3], Rule::PackedRow, Some(4), Some(2)),
        (&[T0, S1, bad_op, END3], Rule::SurfaceOp, Some(4), Some(2)),
    ];
    for (i, (lines, rule, line, seq)) in cases.into_iter().enumerate() {
        let p = write(tmp.path(), &format!("bad{i}.jsonl"), &file_of(lines));
        let err = import_file(&st, &p, replace.clone()).unwrap_err();
        let ImportError::Corrupt {
            path,
            line: l,
            seq: s,
            violation,
        } = &err
        else {
            panic!("case {i}: {err}");
        };
        assert_eq!(
            (path, violation.rule, *l, *s),
            (&p, rule, line, seq),
            "case {i}: {err}"
        );
        assert!(err.to_string().contains(&format!("bad{i}.jsonl")), "{err}");
        assert_eq!(st.load("s").unwrap(), before, "case {i}");
    }
    assert_eq!(st.list().unwrap().len(), 1);
}

/// More events than one import batch, then an unknown event type: a strict
/// store rejects the second batch after storing the first.
fn fails_midway() -> Vec<u8> {
    let mut events = session_events(1, 5000);
    let seq = events.len() as u64;
    events.push(ev("x/unknown", seq, "{}"));
    plain_file(&header("m"), &events)
}

#[test]
fn a_failed_append_midway_leaves_no_half_session() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store_with(&tmp.path().join("s"), true);
    let p = write(tmp.path(), "m.jsonl", &fails_midway());
    let err = import_file(&st, &p, ImportOptions::default()).unwrap_err();
    let ImportError::Corrupt { line, seq, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((*line, *seq), (Some(5006), Some(5004)), "{err}");
    assert!(st.list().unwrap().is_empty());
    assert!(st.load("m").is_err());

    // Replacing: the old session comes back.
    let old = session_events(2, 3);
    let q = write(tmp.path(), "old.jsonl", &plain_file(&header("m"), &old));
    import_file(&st, &q, ImportOptions::default()).unwrap();
    let before = st.load("m").unwrap();
    let opts = ImportOptions {
        replace: true,
        repair: true,
        id: None,
    };
    let err = import_file(&st, &p, opts).unwrap_err();
    assert!(matches!(err, ImportError::Corrupt { .. }), "{err}");
    assert_eq!(st.load("m").unwrap(), before);
}

#[test]
fn header_only_sessions_are_stored_and_export_as_themselves() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(&tmp.path().join("s"));
    let p = write(tmp.path(), "e.jsonl", &file_of(&[]));
    let rep = import_file(&st, &p, ImportOptions::default()).unwrap();
    assert_eq!(rep.events, 0);
    let listed = st.list().unwrap();
    assert_eq!(listed.len(), 1, "a header-only file is a session");
    let (header, events) = st.load(&rep.id).unwrap();
    assert!(events.is_empty());
    assert_eq!(header, listed[0]);
    // Importing it again is refused like any existing session...
    assert!(matches!(
        import_file(&st, &p, ImportOptions::default()),
        Err(ImportError::Exists { .. })
    ));
    // ...and replaces it with --replace.
    let again = import_file(
        &st,
        &p,
        ImportOptions {
            replace: true,
            ..ImportOptions::default()
        },
    )
    .unwrap();
    assert!(again.replaced);
    // The header-only session takes appends like any other.
    let ev = sessionlog::event::Event::from_json(
        r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
    )
    .unwrap();
    st.append(&rep.id, &[ev]).unwrap();
    assert_eq!(st.load(&rep.id).unwrap().1.len(), 1);
}
