//! `checkpoint`: the checkpoint codec.
//!
//! Properties: `checkpoint::decode` never panics and allocates only in
//! proportion to its input, whatever the bytes, and what it accepts
//! re-encodes to exactly those bytes (the encoding has one form per value);
//! for a body produced by folding a sample session (cut into batches, with
//! its derive cache and read indexes), `decode(encode(x)) == x`; and bodies
//! damaged *with their checksums fixed* (so the bytes reach the section
//! decoders) either fail to decode or re-encode exactly. That last property
//! runs only with `SESSIONLOG_FUZZ_CRAFTED=1`: checksummed bytes are trusted
//! by design, so it is a hardening check, not the crash-safety contract.
//!
//! Input: first byte even: the rest is checkpoint file bytes, decoded as
//! they are. Odd: the rest drives a sample (seed, turns, interruption, batch
//! sizes, coverage fields), then `(offset u16, xor u8)` patches applied to
//! the encoded payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionlog::checkpoint::{
    self, BatchEntry, CHECKPOINT_HEADER_LEN, CheckpointBody, Coverage, DataLoc,
};
use sessionlog::derive::DeriveCache;
use sessionlog::event::Event;
use sessionlog::sample::{Sample, SampleConfig};
use sessionlog::session::SessionState;
use sessionlog_fuzz::{AllocWindow, Bytes, budget};

fn crafted() -> bool {
    static CRAFTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CRAFTED.get_or_init(|| std::env::var_os("SESSIONLOG_FUZZ_CRAFTED").is_some_and(|v| v == "1"))
}

fn fix_crcs(bytes: &mut [u8]) {
    checkpoint::fix_checksums(bytes).expect("the damage spares the header");
}

fn sample_body(input: &mut Bytes<'_>) -> CheckpointBody {
    let seed = u64::from(input.u32());
    let turns = 1 + (input.u8() % 5) as usize;
    let flags = input.u8();
    let (_, events) = Sample::new(SampleConfig {
        turns,
        seed,
        compaction: flags & 1 == 0,
        interrupt_last_turn: flags & 2 != 0,
        ..SampleConfig::default()
    })
    .session("s");
    // A prefix, cut into batches of sizes drawn from the input.
    let keep = events.len() - (input.u16() as usize % events.len());
    let log = &events[..keep];
    let mut state = SessionState::new(flags & 4 != 0);
    let mut batches = Vec::new();
    let mut at = 0;
    let segment_every = 1 + u64::from(input.u8() % 64);
    while at < log.len() {
        let n = 1 + (input.u8() % 9) as usize;
        let end = (at + n).min(log.len());
        let segment = (at as u64 / segment_every) * segment_every;
        batches.push(BatchEntry {
            first_seq: at as u64,
            segment,
            offset: 64 + u64::from(input.u16()),
        });
        // Strict mode may refuse a sample batch; the state stays as it was.
        if state
            .append_batch(&log[at..end], &log[..at].to_vec())
            .is_err()
        {
            break;
        }
        at = end;
    }
    let mut derive = DeriveCache::default();
    derive
        .update(state.surface(), &log.to_vec())
        .expect("the sample's surface nodes are in the log");
    // The body's contract: node locations sorted by seq (the surface lists
    // them in message order, which a replace makes differ).
    let mut nodes: Vec<u64> = state.surface().iter().collect();
    nodes.sort_unstable();
    let node_locs = nodes
        .into_iter()
        .map(|seq| {
            (
                seq,
                DataLoc {
                    segment: 0,
                    offset: u64::from(input.u32()),
                    len: log[seq as usize].data.get().len() as u32,
                },
            )
        })
        .collect();
    CheckpointBody {
        coverage: Coverage {
            segment_first_seq: input.u64(),
            last_record_offset: input.u64(),
            end_offset: input.u64(),
            last_record_crc: input.u32(),
            next_seq: state.next_seq(),
        },
        last_time: log.last().map_or(0, |e: &Event<'_>| e.time),
        state,
        derive,
        batches,
        node_locs,
    }
}

fuzz_target!(|data: &[u8]| {
    let window = AllocWindow::start();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        if let Ok(body) = checkpoint::decode(rest) {
            let again = checkpoint::encode(&body);
            assert!(again == rest, "a decoded body does not re-encode exactly");
        }
        window.check(budget(rest.len(), 0), "decode");
        return;
    }
    let mut input = Bytes::new(rest);
    let body = sample_body(&mut input);
    let bytes = checkpoint::encode(&body);
    let back = checkpoint::decode(&bytes).expect("an encoded body decodes");
    assert!(back == body, "decode(encode(x)) != x");
    // Damage with the checksums fixed: reach the section decoders.
    let mut damaged = bytes.clone();
    let payload_len = damaged.len() - CHECKPOINT_HEADER_LEN;
    let mut patched = false;
    while !input.is_empty() && payload_len > 0 {
        let at = CHECKPOINT_HEADER_LEN + input.u16() as usize % payload_len;
        damaged[at] ^= input.u8();
        patched = true;
    }
    // Gated: such bodies can only come from checksummed bytes a writer
    // produced, which the store trusts by design (see README.md).
    if patched && crafted() {
        fix_crcs(&mut damaged);
        let window = AllocWindow::start();
        if let Ok(b) = checkpoint::decode(&damaged) {
            let again = checkpoint::encode(&b);
            assert!(
                again == damaged,
                "a decoded damaged body does not re-encode exactly"
            );
        }
        window.check(budget(damaged.len(), 0), "decode of a damaged body");
    }
});
