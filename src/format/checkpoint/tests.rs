//! Tests of the checkpoint format: the pinned bytes of a small session, round
//! trips over generated sessions, and damage of every kind refused.

use super::*;
use crate::event::{Event, OwnedEvent};
use crate::sample::{Sample, SampleConfig};
use crate::surface::Surface;
use proptest::prelude::*;

fn ev(text: &str) -> OwnedEvent {
    Event::from_json(text).unwrap().into_owned()
}

/// A strict session that exercises every part of the state: a replace
/// shadowing a range, an open turn and step, a tool call requested, logged
/// and still pending.
fn pinned_log() -> Vec<OwnedEvent> {
    [
        r#"{"type":"turn/start","seq":0,"time":1000,"data":{"turn":1}}"#,
        r#"{"type":"user/message","seq":1,"time":1001,"data":{"role":"user","content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
        r#"{"type":"user/message","seq":2,"time":1002,"data":{"role":"user","content":[{"type":"text","text":"again"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
        r#"{"type":"user/message","seq":3,"time":1003,"data":{"role":"user","content":[{"type":"text","text":"hi, again"}],"source":{"kind":"user"}},"surfaceOp":{"op":"replace","start":1,"end":2},"sourceEventSeqs":[1,2]}"#,
        r#"{"type":"step/start","seq":4,"time":1004,"data":{"turn":1,"step":1}}"#,
        r#"{"type":"assistant/message","seq":5,"time":1005,"data":{"turn":1,"step":1,"message":{"role":"assistant","content":[{"type":"tool-call","id":"c1","name":"ls"}],"source":{"kind":"model"}}},"surfaceOp":"append"}"#,
        r#"{"type":"tool/call","seq":6,"time":1006,"data":{"turn":1,"step":1,"callId":"c1"}}"#,
    ]
    .into_iter()
    .map(ev)
    .collect()
}

fn body() -> CheckpointBody {
    let log = pinned_log();
    let mut state = SessionState::new(true);
    state.append_batch(&log[..4], &Vec::<Event>::new()).unwrap();
    state.append_batch(&log[4..], &log[..4].to_vec()).unwrap();
    let mut derive = DeriveCache::default();
    derive.update(state.surface(), &log).unwrap();
    CheckpointBody {
        coverage: Coverage {
            segment_first_seq: 0,
            last_record_offset: 300,
            end_offset: 420,
            last_record_crc: 0xDEAD_BEEF,
            next_seq: 7,
        },
        last_time: 1006,
        state,
        derive,
        batches: vec![
            BatchEntry {
                first_seq: 0,
                segment: 0,
                offset: 64,
            },
            BatchEntry {
                first_seq: 4,
                segment: 0,
                offset: 300,
            },
        ],
        node_locs: vec![
            (
                3,
                DataLoc {
                    segment: 0,
                    offset: 200,
                    len: 80,
                },
            ),
            (
                5,
                DataLoc {
                    segment: 0,
                    offset: 330,
                    len: 90,
                },
            ),
        ],
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checkpoint of [`body`], byte for byte. If this test fails you changed
/// the checkpoint format: bump `CHECKPOINT_VERSION`, update
/// `format-spec.md` section 5 and its version table, then this literal.
const PINNED: &str = concat!(
    // header: magic, version 6, 5 sections
    "534c4f47434b50540600000005000000",
    // section table: HEAD, STATE
    "7800000000000000240000000000000020b5d6269c0000000000000031000000",
    "00000000c1c1d7f0",
    // section table: DERIVE, BATCHES
    "cd000000000000000e0000000000000027d91928db0000000000000038000000",
    "00000000b1db2ffc",
    // section table: NODES, header CRC
    "13010000000000004000000000000000e63dec93bccdcba8",
    // HEAD
    "00ac02a403efbeadde07dc0f0101013101010131010131010263310106010263",
    "3106dc0f",
    // STATE
    "0401000200000002010001000003000400000105030002010103040301060103",
    "0102020102000102010202010201026331",
    // DERIVE
    "01000105020300005705001d8201",
    // BATCHES
    "0200000000000000000000000000000000000000000000004000000000000000",
    "040000000000000000000000000000002c01000000000000",
    // NODES
    "020000000000000003000000000000000000000000000000c800000000000000",
    "50000000050000000000000000000000000000004a010000000000005a000000",
);

#[test]
fn the_encoding_is_pinned() {
    let b = body();
    let bytes = encode(&b);
    assert_eq!(hex(&bytes), PINNED);
    let back = decode(&bytes).unwrap();
    assert_eq!(back, b);
    // Equality of states ignores labels and shadowed nodes; the bytes don't.
    assert_eq!(encode(&back), bytes);
    assert!(back.state.is_strict());
    assert_eq!(back.state.repair().closers().len(), 3);
}

#[test]
fn sections_hold_what_the_spec_says() {
    let b = body();
    let bytes = encode(&b);
    let ranges = sections(&bytes).unwrap();
    let section = |s: Section| &bytes[ranges[s as usize].clone()];
    // HEAD starts with the coverage: varints, the CRC as 4 bytes.
    let head = section(Section::Head);
    assert_eq!(&head[..3], &[0, 0xac, 0x02]); // segment 0, offset 300
    assert_eq!(&head[3..5], &[0xa4, 0x03]); // end offset 420
    assert_eq!(&head[5..9], &0xDEAD_BEEFu32.to_le_bytes());
    // The fixed tables: u64 count, then fixed-width little-endian entries.
    let batches = section(Section::Batches);
    assert_eq!(batches.len(), 8 + 2 * BATCH_ENTRY_LEN);
    assert_eq!(u64_at(batches, 0), 2);
    assert_eq!(u64_at(batches, 8 + 24), 4);
    assert_eq!(u64_at(batches, 8 + 24 + 16), 300);
    let nodes = section(Section::Nodes);
    assert_eq!(nodes.len(), 8 + 2 * NODE_ENTRY_LEN);
    assert_eq!(u64_at(nodes, 8 + 28), 5);
    assert_eq!(u64_at(nodes, 8 + 28 + 16), 330);
    assert_eq!(u32_at(nodes, 8 + 28 + 24), 90);
}

/// Every error the decoder gives for damaged bytes is one of the typed kinds.
fn refused(e: &CheckpointError) -> bool {
    matches!(
        e,
        CheckpointError::Corrupt(_)
            | CheckpointError::Malformed { .. }
            | CheckpointError::UnsupportedVersion { .. }
    )
}

#[test]
fn every_flip_and_truncation_is_refused() {
    let bytes = encode(&body());
    for i in 0..bytes.len() {
        for x in (0..8).map(|bit| 1u8 << bit).chain([0xff]) {
            let mut b = bytes.clone();
            b[i] ^= x;
            let e = decode(&b).expect_err(&format!("flip {x:#x} of byte {i} accepted"));
            assert!(refused(&e), "{e}");
        }
    }
    for n in 0..bytes.len() {
        let e = decode(&bytes[..n]).expect_err(&format!("truncation to {n} accepted"));
        assert!(refused(&e), "{e}");
    }
}

#[test]
fn checksummed_damage_is_refused_or_reencodes_exactly() {
    // Past the CRCs, every accepted byte string is canonical (shortest
    // varints, tags 0 or 1, links in range), so what decodes re-encodes to
    // the same bytes; everything else is refused, never a panic.
    let bytes = encode(&body());
    let (mut accepted, mut malformed) = (0, 0);
    for i in CHECKPOINT_HEADER_LEN..bytes.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= x;
            fix_checksums(&mut b).unwrap();
            match decode(&b) {
                Ok(body) => {
                    assert_eq!(encode(&body), b, "byte {i} ^ {x:#x}");
                    accepted += 1;
                }
                Err(e) => {
                    assert!(refused(&e), "{e}");
                    malformed += usize::from(matches!(e, CheckpointError::Malformed { .. }));
                }
            }
        }
    }
    assert!(accepted > 0 && malformed > 0, "{accepted} {malformed}");
}

#[test]
fn other_versions_are_refused_by_name() {
    let mut b = encode(&body());
    for other in [4, 5, CHECKPOINT_VERSION + 1] {
        b[8..12].copy_from_slice(&other.to_le_bytes());
        let e = decode(&b).unwrap_err();
        assert!(
            matches!(e, CheckpointError::UnsupportedVersion { found } if found == other),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("version {other}")));
    }
}

#[test]
fn out_of_order_tables_are_refused_with_valid_checksums() {
    let mut b = body();
    b.batches.swap(0, 1);
    let e = decode(&encode(&b)).unwrap_err();
    assert!(e.to_string().contains("batch index is out of order"), "{e}");
    let mut b = body();
    b.node_locs.push(b.node_locs[0]);
    let e = decode(&encode(&b)).unwrap_err();
    assert!(
        e.to_string().contains("node locations are out of order"),
        "{e}"
    );
}

#[test]
fn node_locations_beyond_coverage_or_missing_are_refused() {
    // Found by the recover fuzz target: a location at or past the covered
    // seq would break the order of the locations added after reopen.
    let mut b = body();
    b.node_locs[1].0 = b.coverage.next_seq;
    let e = decode(&encode(&b)).unwrap_err();
    assert!(e.to_string().contains("beyond the covered log"), "{e}");
    // Surface node 3 with no location could not be derived.
    let mut b = body();
    b.node_locs.remove(0);
    let e = decode(&encode(&b)).unwrap_err();
    assert!(
        e.to_string().contains("surface node 3 has no location"),
        "{e}"
    );
}

/// A checkpoint of `body` with one section's bytes replaced (checksums valid).
fn with_section(s: Section, bytes: &[u8]) -> Vec<u8> {
    let ck = Checkpoint::parse(SegmentBytes::new(encode(&body()))).unwrap();
    let mut parts = [
        Section::Head,
        Section::State,
        Section::Derive,
        Section::Batches,
        Section::Nodes,
    ]
    .map(|x| ck.section_bytes(x).to_vec());
    parts[s as usize] = bytes.to_vec();
    frame(parts.each_ref().map(|p| p.as_slice()))
}

#[test]
fn huge_length_claims_are_refused_before_allocating() {
    // HEAD whose first string (the open turn number) claims 2^31 bytes.
    let mut head = encode_head_prefix();
    head.extend_from_slice(&[1, 1, 0x80, 0x80, 0x80, 0x80, 0x08]);
    let e = decode(&with_section(Section::Head, &head)).unwrap_err();
    // The claim's varint follows the two option tags; HEAD starts at 120.
    let at = (CHECKPOINT_HEADER_LEN + head.len() - 5) as u64;
    assert!(
        matches!(&e, CheckpointError::Malformed { section: Section::Head, offset, reason }
            if *offset == at && reason.contains("runs past")),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("section HEAD at file offset {at}")),
        "{e}"
    );
    // STATE claiming 2^40 surface nodes, right at its start.
    let state = [0x80, 0x80, 0x80, 0x80, 0x80, 0x20];
    let file = with_section(Section::State, &state);
    let at = sections(&file).unwrap()[Section::State as usize].start as u64;
    let e = decode(&file).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Malformed { section: Section::State, offset, reason }
            if *offset == at && reason.contains("cannot fit")),
        "{e}"
    );
}

/// `HEAD`'s bytes up to the repair tracker.
fn encode_head_prefix() -> Vec<u8> {
    let b = body();
    let full = sections::encode_head(
        &b.coverage,
        b.last_time,
        &crate::repair::RepairTracker::default(),
    );
    // Coverage and last time, then the empty tracker's 5 bytes: 0, 0, 0, 0, zigzag(0).
    full[..full.len() - 5].to_vec()
}

#[test]
fn a_surface_that_is_not_well_formed_is_refused() {
    let b = body();
    let mut surface = b.state.surface().parts();
    // Live node 2 (seq 3, the replacement) links to itself: a cycle.
    assert!(surface.nodes[2].live);
    surface.nodes.to_mut()[2].next = 2;
    let e = Surface::from_parts(surface).unwrap_err();
    assert!(e.contains("cycle") || e.contains("badly linked"), "{e}");
    // In checksummed bytes: node 0 (seq 1, shadowed) marked live. Its
    // fields are the bytes after the node count: seq 1, prev none, next
    // index 1, label 0, kind user, live 0.
    let mut state = sections::encode_state(&b.state);
    assert_eq!(&state[..7], &[4, 1, 0, 2, 0, 0, 0]);
    state[6] = 1;
    let e = decode(&with_section(Section::State, &state)).unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Malformed { reason, .. } if reason.contains("not well formed")),
        "{e}"
    );
}

#[test]
fn batch_index_searches_base_and_tail() {
    let ck = Checkpoint::parse(SegmentBytes::new(encode(&body()))).unwrap();
    let mut idx = ck.batches();
    idx.push(BatchEntry {
        first_seq: 9,
        segment: 0,
        offset: 500,
    });
    assert_eq!(idx.len(), 3);
    assert_eq!(idx.after_seq(0), 1);
    assert_eq!(idx.after_seq(8), 2);
    assert_eq!(idx.after_seq(9), 3);
    assert_eq!(idx.get(2).unwrap().offset, 500);
    assert_eq!(
        idx.iter_from(1).map(|b| b.first_seq).collect::<Vec<_>>(),
        vec![4, 9]
    );
}

/// A checkpoint body of a generated session: a prefix of it folded in
/// batches of the given sizes, with its derive cache and indexes.
fn sample_body(seed: u64, turns: usize, flags: u8, cut: usize, sizes: &[usize]) -> CheckpointBody {
    let (_, events) = Sample::new(SampleConfig {
        turns,
        seed,
        compaction: flags & 1 == 0,
        interrupt_last_turn: flags & 2 != 0,
        ..SampleConfig::default()
    })
    .session("s");
    let log = &events[..events.len() - cut % events.len()];
    let mut state = SessionState::new(flags & 4 != 0);
    let mut batches = Vec::new();
    let mut at = 0;
    for n in sizes.iter().cycle() {
        if at >= log.len() {
            break;
        }
        let end = (at + n).min(log.len());
        // Strict mode may refuse a sample batch: stop at the last good one.
        if state
            .append_batch(&log[at..end], &log[..at].to_vec())
            .is_err()
        {
            break;
        }
        batches.push(BatchEntry {
            first_seq: at as u64,
            segment: at as u64 / 64 * 64,
            offset: 64 + at as u64 * 100,
        });
        at = end;
    }
    let log = log[..at].to_vec();
    let mut derive = DeriveCache::default();
    derive.update(state.surface(), &log).unwrap();
    let mut nodes: Vec<u64> = state.surface().iter().collect();
    nodes.sort_unstable();
    let node_locs = nodes
        .into_iter()
        .map(|seq| {
            let loc = DataLoc {
                segment: 0,
                offset: seq * 100,
                len: log[seq as usize].data.get().len() as u32,
            };
            (seq, loc)
        })
        .collect();
    CheckpointBody {
        coverage: Coverage {
            segment_first_seq: seed % 7,
            last_record_offset: seed,
            end_offset: seed.wrapping_mul(3),
            last_record_crc: seed as u32,
            next_seq: state.next_seq(),
        },
        last_time: log.last().map_or(0, |e| e.time),
        state,
        derive,
        batches,
        node_locs,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Encode then decode gives the body back, and encoding that gives the
    /// same bytes (so labels and shadowed nodes survive too).
    #[test]
    fn generated_sessions_round_trip(
        seed in any::<u64>(),
        turns in 1usize..6,
        flags in any::<u8>(),
        cut in any::<usize>(),
        sizes in proptest::collection::vec(1usize..9, 1..6),
    ) {
        let body = sample_body(seed, turns, flags, cut, &sizes);
        let bytes = encode(&body);
        let back = decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &body);
        prop_assert_eq!(encode(&back), bytes);
        prop_assert_eq!(back.state.closers(), body.state.closers());
        prop_assert_eq!(back.state.surface().to_json(), body.state.surface().to_json());
    }
}

#[test]
fn model_parts_refuse_what_the_model_cannot_use() {
    use crate::invariants::Invariants;
    use crate::repair::{OpenTurn, RepairTracker};
    use crate::session::SessionParts;
    let b = body();
    let good = b.state.surface().parts();
    let mut p = good.clone();
    p.nodes.to_mut()[0].prev = 9;
    let e = Surface::from_parts(p).unwrap_err();
    assert!(e.contains("links outside"), "{e}");
    let mut p = good.clone();
    p.next_label = 2;
    let e = Surface::from_parts(p).unwrap_err();
    assert!(e.contains("not below the next label"), "{e}");
    // A state whose surface and next seq disagree.
    let parts = |next_seq| SessionParts {
        next_seq,
        surface: b.state.surface().clone(),
        repair: b.state.repair().clone(),
        invariants: None,
    };
    assert!(SessionState::from_parts(parts(7)).is_ok());
    let e = SessionState::from_parts(parts(8)).unwrap_err();
    assert!(e.contains("next seq is 8"), "{e}");
    // Turn numbers are written into closers as they are: they must be JSON.
    let mut r = b.state.repair().parts();
    r.turn = Some(OpenTurn {
        turn: Some("}{".into()),
    });
    let e = RepairTracker::from_parts(r).unwrap_err();
    assert!(e.contains("not JSON"), "{e}");
    // Strict mode adds one to turn numbers: they must be safe integers.
    let mut i = b.state.invariants().unwrap().parts();
    assert!(Invariants::from_parts(i.clone()).is_ok());
    i.last_turn = i64::MAX;
    let e = Invariants::from_parts(i).unwrap_err();
    assert!(e.contains("not a safe integer"), "{e}");
}
