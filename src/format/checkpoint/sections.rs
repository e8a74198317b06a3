//! The encodings of the checkpoint's variable sections, `HEAD`, `STATE` and
//! `DERIVE` (`format-spec.md` section 5), and the entries of its two fixed
//! tables. The model hands out and takes back plain parts
//! ([`SurfaceParts`], [`RepairParts`], ...); the bytes are written and read
//! here, one field at a time, in the order the spec lists them.
//!
//! Primitives: `varint` (section 0's LEB128), `zigzag` (signed, then
//! varint), `u32` (4 bytes little-endian), `bool` (one byte, 0 or 1),
//! `option<T>` (a tag byte, 0 = none, 1 = some followed by `T`), `string`
//! (varint byte length, then UTF-8), `list<T>` (varint count, then the
//! items) and `link` (varint: 0 = none, `i + 1` = node index `i`). Every
//! length and count is checked against the bytes left in the section before
//! anything is allocated for it.

use super::{BatchEntry, CheckpointError, Coverage, DataLoc, Section};
use crate::derive::{CachedMessage, DeriveCache, DeriveParts, Shape};
use crate::format::varint;
use crate::invariants::{Invariants, InvariantsParts};
use crate::repair::{OpenStep, OpenTurn, PendingCall, RepairParts, RepairTracker};
use crate::session::{SessionParts, SessionState};
use crate::surface::{NIL, Node, NodeKind, Replacement, Surface, SurfaceParts};
use std::borrow::Cow;
use std::ops::Range;

/// The `HEAD` section, decoded: what opening a session needs at once.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Head {
    pub(super) coverage: Coverage,
    pub(super) last_time: i64,
    pub(super) repair: RepairTracker,
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

fn put_zigzag(out: &mut Vec<u8>, v: i64) {
    varint::put(out, varint::zigzag(v));
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    varint::put(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_option<T>(out: &mut Vec<u8>, v: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            put(out, v);
        }
    }
}

fn put_list<T>(out: &mut Vec<u8>, items: &[T], mut put: impl FnMut(&mut Vec<u8>, &T)) {
    varint::put(out, items.len() as u64);
    for item in items {
        put(out, item);
    }
}

fn put_link(out: &mut Vec<u8>, i: u32) {
    // NIL (u32::MAX) wraps to 0; node index i is written as i + 1.
    varint::put(out, u64::from(i.wrapping_add(1)));
}

fn put_range(out: &mut Vec<u8>, r: &Range<u32>) {
    varint::put(out, u64::from(r.start));
    varint::put(out, u64::from(r.end));
}

fn put_opt_str(out: &mut Vec<u8>, s: &Option<String>) {
    put_option(out, s.as_deref(), put_str);
}

/// `HEAD`: the coverage, the last covered time and the repair tracker.
pub(super) fn encode_head(coverage: &Coverage, last_time: i64, repair: &RepairTracker) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    varint::put(&mut out, coverage.segment_first_seq);
    varint::put(&mut out, coverage.last_record_offset);
    varint::put(&mut out, coverage.end_offset);
    out.extend_from_slice(&coverage.last_record_crc.to_le_bytes());
    varint::put(&mut out, coverage.next_seq);
    put_zigzag(&mut out, last_time);
    // The tracker's next seq is `coverage.next_seq`: not stored twice.
    let r = repair.parts();
    put_option(&mut out, r.turn.as_ref(), |o, t| put_opt_str(o, &t.turn));
    put_option(&mut out, r.step.as_ref(), |o, s| {
        put_opt_str(o, &s.turn);
        put_opt_str(o, &s.step);
    });
    put_list(&mut out, &r.pending, |o, p| {
        put_str(o, &p.call_id);
        put_option(o, p.call_seq, varint::put);
    });
    put_list(&mut out, &r.logged_calls, |o, (id, seq)| {
        put_str(o, id);
        varint::put(o, *seq);
    });
    put_zigzag(&mut out, r.last_time);
    out
}

/// `STATE`: the surface, then the strict-mode invariants. (The next seq and
/// the repair tracker are `HEAD`'s.)
pub(super) fn encode_state(state: &SessionState) -> Vec<u8> {
    let s = state.surface().parts();
    let mut out = Vec::with_capacity(16 + s.nodes.len() * 8);
    put_list(&mut out, &s.nodes, |o, n| {
        varint::put(o, n.seq);
        put_link(o, n.prev);
        put_link(o, n.next);
        varint::put(o, n.label);
        o.push(match n.kind {
            NodeKind::User => 0,
            NodeKind::Assistant => 1,
            NodeKind::ToolResult => 2,
        });
        o.push(u8::from(n.live));
    });
    put_link(&mut out, s.head);
    put_link(&mut out, s.tail);
    varint::put(&mut out, s.next_label);
    put_option(&mut out, s.last_processed_seq, varint::put);
    put_list(&mut out, &s.replacements, |o, r| {
        varint::put(o, r.seq);
        varint::put(o, r.start);
        varint::put(o, r.end);
        put_list(o, &r.shadowed_seqs, |o, s| varint::put(o, *s));
    });
    varint::put(&mut out, s.undo_epoch);
    put_option(
        &mut out,
        state.invariants().map(Invariants::parts),
        |o, i| {
            put_zigzag(o, i.last_turn);
            put_option(o, i.open_turn, put_zigzag);
            put_zigzag(o, i.last_step);
            put_option(o, i.open_step, put_zigzag);
            put_list(o, &i.calls, |o, c| put_str(o, c));
        },
    );
    out
}

/// `DERIVE`: the derive cache.
pub(super) fn encode_derive(derive: &DeriveCache) -> Vec<u8> {
    let d = derive.parts();
    let mut out = Vec::with_capacity(16 + d.entries.len() * 8);
    varint::put(&mut out, d.generation);
    varint::put(&mut out, d.undo_epoch);
    put_option(&mut out, d.last_node, varint::put);
    put_list(&mut out, &d.entries, |o, e| {
        varint::put(o, e.seq);
        match &e.shape {
            Shape::Verbatim(r) => {
                o.push(0);
                put_range(o, r);
            }
            Shape::FlatAssistant {
                content,
                provenance,
            } => {
                o.push(1);
                put_range(o, content);
                put_option(o, provenance.as_ref(), put_range);
            }
            Shape::FlatToolResult {
                call_id,
                content,
                is_error,
            } => {
                o.push(2);
                for r in [call_id, content, is_error] {
                    put_option(o, r.as_ref(), put_range);
                }
            }
        }
    });
    out
}

/// A fixed-width table: u64 count, then the entries.
pub(super) fn encode_table<T>(
    items: &[T],
    width: usize,
    put: impl Fn(&mut Vec<u8>, &T),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + items.len() * width);
    out.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for item in items {
        put(&mut out, item);
    }
    debug_assert_eq!(out.len(), 8 + items.len() * width);
    out
}

/// One `BATCHES` entry: `first_seq`, `segment`, `offset`, each u64.
pub(super) fn put_batch(out: &mut Vec<u8>, b: &BatchEntry) {
    for v in [b.first_seq, b.segment, b.offset] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// One `NODES` entry: `seq`, `segment`, `offset` (u64 each), `len` (u32).
pub(super) fn put_node(out: &mut Vec<u8>, (seq, loc): &(u64, DataLoc)) {
    for v in [*seq, loc.segment, loc.offset] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&loc.len.to_le_bytes());
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// Reads one section front to back; every error names the section and the
/// file offset where the bad value starts.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// The section's offset in the file.
    base: usize,
    section: Section,
}

type Result<T> = std::result::Result<T, CheckpointError>;

impl<'a> Reader<'a> {
    /// A reader of `section`'s `bytes`, which start at file offset `base`.
    pub(super) fn new(section: Section, bytes: &'a [u8], base: usize) -> Self {
        Reader {
            bytes,
            pos: 0,
            base,
            section,
        }
    }

    /// The section's bytes whole (the fixed tables are read in place).
    pub(super) fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    fn err_at(&self, at: usize, reason: impl Into<String>) -> CheckpointError {
        CheckpointError::Malformed {
            section: self.section,
            offset: (self.base + at) as u64,
            reason: reason.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The section must end where its last value does.
    pub(super) fn finish(self) -> Result<()> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(self.err_at(self.pos, "trailing bytes after the last value"))
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err_at(self.pos, format!("{what} runs past the section's end")));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn varint(&mut self, what: &str) -> Result<u64> {
        let (v, n) = varint::read(&self.bytes[self.pos..])
            .map_err(|e| self.err_at(self.pos, format!("{what}: {e}")))?;
        self.pos += n;
        Ok(v)
    }

    fn varint_u32(&mut self, what: &str) -> Result<u32> {
        let at = self.pos;
        let v = self.varint(what)?;
        u32::try_from(v).map_err(|_| self.err_at(at, format!("{what} {v} does not fit 32 bits")))
    }

    fn zigzag(&mut self, what: &str) -> Result<i64> {
        Ok(varint::unzigzag(self.varint(what)?))
    }

    fn tag(&mut self, what: &str, max: u8) -> Result<u8> {
        let at = self.pos;
        let t = self.u8(what)?;
        if t > max {
            return Err(self.err_at(at, format!("{what} has tag {t}, at most {max} allowed")));
        }
        Ok(t)
    }

    fn bool(&mut self, what: &str) -> Result<bool> {
        Ok(self.tag(what, 1)? == 1)
    }

    fn option<T>(
        &mut self,
        what: &str,
        read: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<Option<T>> {
        match self.tag(what, 1)? {
            0 => Ok(None),
            _ => read(self).map(Some),
        }
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let n = self.varint(what)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.remaining())
            .ok_or_else(|| {
                self.err_at(
                    at,
                    format!("{what} of {n} bytes runs past the section's end"),
                )
            })?;
        let text = self.take(n, what)?;
        let text = std::str::from_utf8(text)
            .map_err(|_| self.err_at(at, format!("{what} is not UTF-8")))?;
        Ok(text.to_owned())
    }

    /// A list whose items take at least `min` bytes each: the count is
    /// refused unless that many bytes are left, so it never drives an
    /// allocation beyond a small multiple of the section's length.
    fn list<T>(
        &mut self,
        what: &str,
        min: usize,
        mut read: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let at = self.pos;
        let n = self.varint(what)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n.checked_mul(min).is_some_and(|b| b <= self.remaining()))
            .ok_or_else(|| {
                self.err_at(
                    at,
                    format!("{what}: {n} items cannot fit the section's remaining bytes"),
                )
            })?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(read(self)?);
        }
        Ok(out)
    }

    fn link(&mut self, what: &str) -> Result<u32> {
        // 0 is NIL; i + 1 is index i (which must be below NIL).
        let at = self.pos;
        match self.varint(what)? {
            0 => Ok(NIL),
            v if v <= u64::from(NIL) => Ok((v - 1) as u32),
            v => Err(self.err_at(at, format!("{what} {v} does not fit 32 bits"))),
        }
    }

    fn range(&mut self, what: &str) -> Result<Range<u32>> {
        Ok(self.varint_u32(what)?..self.varint_u32(what)?)
    }

    fn opt_str(&mut self, what: &str) -> Result<Option<String>> {
        self.option(what, |r| r.string(what))
    }
}

/// Decodes `HEAD`.
pub(super) fn decode_head(mut r: Reader<'_>) -> Result<Head> {
    let coverage = Coverage {
        segment_first_seq: r.varint("coverage segment")?,
        last_record_offset: r.varint("coverage record offset")?,
        end_offset: r.varint("coverage end offset")?,
        last_record_crc: r.u32("coverage record CRC")?,
        next_seq: r.varint("coverage next seq")?,
    };
    let last_time = r.zigzag("last time")?;
    let at = r.pos;
    let parts = RepairParts {
        turn: r.option("open turn", |r| {
            Ok(OpenTurn {
                turn: r.opt_str("open turn number")?,
            })
        })?,
        step: r.option("open step", |r| {
            Ok(OpenStep {
                turn: r.opt_str("open step's turn")?,
                step: r.opt_str("open step number")?,
            })
        })?,
        pending: r.list("pending calls", 2, |r| {
            Ok(PendingCall {
                call_id: r.string("pending call id")?,
                call_seq: r.option("pending call seq", |r| r.varint("pending call seq"))?,
            })
        })?,
        logged_calls: r.list("logged calls", 2, |r| {
            Ok((r.string("logged call id")?, r.varint("logged call seq")?))
        })?,
        next_seq: coverage.next_seq,
        last_time: r.zigzag("repair tracker's last time")?,
    };
    let repair = RepairTracker::from_parts(parts).map_err(|why| r.err_at(at, why))?;
    r.finish()?;
    Ok(Head {
        coverage,
        last_time,
        repair,
    })
}

fn node(r: &mut Reader<'_>) -> Result<Node> {
    Ok(Node {
        seq: r.varint("node seq")?,
        prev: r.link("node prev link")?,
        next: r.link("node next link")?,
        label: r.varint("node label")?,
        kind: match r.tag("node kind", 2)? {
            0 => NodeKind::User,
            1 => NodeKind::Assistant,
            _ => NodeKind::ToolResult,
        },
        live: r.bool("node live flag")?,
    })
}

fn replacement(r: &mut Reader<'_>) -> Result<Replacement> {
    Ok(Replacement {
        seq: r.varint("replacement seq")?,
        start: r.varint("replacement start")?,
        end: r.varint("replacement end")?,
        shadowed_seqs: r.list("shadowed seqs", 1, |r| r.varint("shadowed seq"))?,
    })
}

fn invariants(r: &mut Reader<'_>) -> Result<Invariants> {
    let at = r.pos;
    let parts = InvariantsParts {
        last_turn: r.zigzag("last turn")?,
        open_turn: r.option("open turn", |r| r.zigzag("open turn"))?,
        last_step: r.zigzag("last step")?,
        open_step: r.option("open step", |r| r.zigzag("open step"))?,
        calls: r.list("step calls", 1, |r| r.string("step call id"))?,
    };
    Invariants::from_parts(parts).map_err(|why| r.err_at(at, why))
}

/// Decodes `STATE`, completing it with `HEAD`'s next seq and repair tracker.
pub(super) fn decode_state(
    mut r: Reader<'_>,
    next_seq: u64,
    repair: RepairTracker,
) -> Result<SessionState> {
    let parts = SurfaceParts {
        nodes: Cow::Owned(r.list("surface nodes", 6, node)?),
        head: r.link("surface head")?,
        tail: r.link("surface tail")?,
        next_label: r.varint("next label")?,
        last_processed_seq: r.option("last processed seq", |r| r.varint("last processed seq"))?,
        replacements: Cow::Owned(r.list("replacements", 4, replacement)?),
        undo_epoch: r.varint("undo epoch")?,
    };
    let surface = Surface::from_parts(parts)
        .map_err(|why| r.err_at(0, format!("the surface is not well formed: {why}")))?;
    let invariants = r.option("invariants", invariants)?;
    let end = r.pos;
    r.finish()?;
    SessionState::from_parts(SessionParts {
        next_seq,
        surface,
        repair,
        invariants,
    })
    .map_err(|why| CheckpointError::Malformed {
        section: Section::State,
        offset: end as u64,
        reason: format!("the state and HEAD disagree: {why}"),
    })
}

fn shape(r: &mut Reader<'_>) -> Result<Shape> {
    Ok(match r.tag("message shape", 2)? {
        0 => Shape::Verbatim(r.range("message range")?),
        1 => Shape::FlatAssistant {
            content: r.range("content range")?,
            provenance: r.option("provenance", |r| r.range("provenance range"))?,
        },
        _ => Shape::FlatToolResult {
            call_id: r.option("call id", |r| r.range("call id range"))?,
            content: r.option("content", |r| r.range("content range"))?,
            is_error: r.option("isError", |r| r.range("isError range"))?,
        },
    })
}

/// Decodes `DERIVE`.
pub(super) fn decode_derive(mut r: Reader<'_>) -> Result<DeriveCache> {
    let parts = DeriveParts {
        generation: r.varint("derive generation")?,
        undo_epoch: r.varint("derive undo epoch")?,
        last_node: r.option("last derived node", |r| r.varint("last derived node"))?,
        entries: Cow::Owned(r.list("cached messages", 4, |r| {
            Ok(CachedMessage {
                seq: r.varint("message seq")?,
                shape: shape(r)?,
            })
        })?),
    };
    r.finish()?;
    Ok(DeriveCache::from_parts(parts))
}
