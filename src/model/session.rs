//! The fold of a session: every event passes, in order, contiguity, its own
//! shape, the surface, and (in strict mode) the relational invariants, and
//! is then applied to the surface, the repair tracker and the invariants.
//!
//! A rejected event or batch leaves the state exactly as it was.

use crate::event::Event;
use crate::invariants::Invariants;
use crate::repair::RepairTracker;
use crate::surface::{EventSource, Surface, Undo};
use crate::violation::{Rule, Violation};
use serde_json::value::RawValue;

/// Everything the model knows about a session's log, folded event by event.
///
/// ```
/// use sessionlog::event::Event;
/// use sessionlog::session::SessionState;
/// let log = vec![
///     Event::from_json(r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#).unwrap(),
///     Event::from_json(r#"{"type":"user/message","seq":1,"time":1,"data":{"role":"user","content":[]},"surfaceOp":"append"}"#).unwrap(),
/// ];
/// let mut state = SessionState::new(false);
/// state.append_batch(&log, &Vec::<Event>::new()).unwrap();
/// assert_eq!(state.next_seq(), 2);
/// assert_eq!(state.surface().seqs(), vec![1]);
/// assert_eq!(state.closers().len(), 1); // turn/end, interrupted
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    next_seq: u64,
    surface: Surface,
    repair: RepairTracker,
    invariants: Option<Invariants>,
}

/// A session state as its parts, for the checkpoint codec (which stores
/// each part in its own encoding; see [`SessionState::from_parts`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionParts {
    pub(crate) next_seq: u64,
    pub(crate) surface: Surface,
    pub(crate) repair: RepairTracker,
    pub(crate) invariants: Option<Invariants>,
}

impl SessionState {
    /// A state from its parts, if they describe the same log position: the
    /// surface last processed the event before `next_seq` and the repair
    /// tracker expects `next_seq` next (every fold moves all three).
    pub(crate) fn from_parts(parts: SessionParts) -> Result<SessionState, String> {
        let last = parts.next_seq.checked_sub(1);
        if parts.surface.last_processed_seq() != last {
            return Err(format!(
                "the surface last processed seq {:?}, but the next seq is {}",
                parts.surface.last_processed_seq(),
                parts.next_seq
            ));
        }
        if parts.repair.next_seq() != parts.next_seq {
            return Err(format!(
                "the repair tracker expects seq {}, but the next seq is {}",
                parts.repair.next_seq(),
                parts.next_seq
            ));
        }
        Ok(SessionState {
            next_seq: parts.next_seq,
            surface: parts.surface,
            repair: parts.repair,
            invariants: parts.invariants,
        })
    }

    /// The strict-mode invariants' state (`None` when not strict).
    pub(crate) fn invariants(&self) -> Option<&Invariants> {
        self.invariants.as_ref()
    }

    /// An empty session; `strict` enables the invariants of section 8.
    pub fn new(strict: bool) -> Self {
        SessionState {
            next_seq: 0,
            surface: Surface::new(),
            repair: RepairTracker::default(),
            invariants: strict.then(Invariants::default),
        }
    }

    /// The seq the next event must have.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The surface index.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// The repair tracker.
    pub fn repair(&self) -> &RepairTracker {
        &self.repair
    }

    /// Whether strict mode is on.
    pub fn is_strict(&self) -> bool {
        self.invariants.is_some()
    }

    /// The closers a crash at this point would need (empty when balanced).
    pub fn closers(&self) -> Vec<Event<'static>> {
        self.repair.closers()
    }

    /// The contiguity rule: `seq` must be the next seq.
    pub fn check_contiguity(&self, seq: u64) -> Result<(), Violation> {
        if seq == self.next_seq {
            Ok(())
        } else {
            Err(Violation::at(
                seq,
                Rule::Contiguity,
                format!(
                    "event seq {seq} is not contiguous; expected {}",
                    self.next_seq
                ),
            ))
        }
    }

    /// Checks and folds one event; on error nothing changes. `source` holds
    /// the earlier events of the log.
    pub fn append(&mut self, event: &Event<'_>, source: &dyn EventSource) -> Result<(), Violation> {
        self.apply_checked(event, source).map(drop)
    }

    fn apply_checked(
        &mut self,
        event: &Event<'_>,
        source: &dyn EventSource,
    ) -> Result<Undo, Violation> {
        self.check_contiguity(event.seq)?;
        event.check_shape()?;
        let plan = self.surface.check(event, source)?;
        if let Some(inv) = &self.invariants {
            inv.check(event)?;
        }
        if let Some(inv) = &mut self.invariants {
            inv.apply(event);
        }
        self.repair.observe(event);
        self.next_seq = event.seq + 1;
        Ok(self.surface.apply(event, plan))
    }

    /// Checks and folds a batch: all of it or, on the first violation,
    /// none of it. `base` holds the events before the batch; later events of
    /// the batch see the earlier ones.
    pub fn append_batch(
        &mut self,
        batch: &[Event<'_>],
        base: &dyn EventSource,
    ) -> Result<(), Violation> {
        self.append_batch_undoable(batch, base).map(drop)
    }

    /// Like [`SessionState::append_batch`], returning what
    /// [`SessionState::revert`] needs to take the whole batch back (the store
    /// folds a batch before writing it, and takes it back if the write fails).
    pub fn append_batch_undoable(
        &mut self,
        batch: &[Event<'_>],
        base: &dyn EventSource,
    ) -> Result<BatchUndo, Violation> {
        let mut undo = BatchUndo {
            repair: self.repair.clone(),
            invariants: self.invariants.clone(),
            next_seq: self.next_seq,
            surface: Vec::with_capacity(batch.len()),
        };
        let source = BatchSource {
            base,
            batch,
            first: self.next_seq,
        };
        for event in batch {
            match self.apply_checked(event, &source) {
                Ok(u) => undo.surface.push(u),
                Err(v) => {
                    self.revert(undo);
                    return Err(v);
                }
            }
        }
        Ok(undo)
    }

    /// Takes back a batch folded by [`SessionState::append_batch_undoable`];
    /// it must be the last batch folded.
    pub fn revert(&mut self, mut undo: BatchUndo) {
        while let Some(u) = undo.surface.pop() {
            self.surface.undo(u);
        }
        self.repair = undo.repair;
        self.invariants = undo.invariants;
        self.next_seq = undo.next_seq;
    }
}

/// How to take back one folded batch (see [`SessionState::revert`]).
#[derive(Debug)]
pub struct BatchUndo {
    repair: RepairTracker,
    invariants: Option<Invariants>,
    next_seq: u64,
    surface: Vec<Undo>,
}

/// The log as seen from inside a batch: the stored events, then the batch.
struct BatchSource<'a, 'e> {
    base: &'a dyn EventSource,
    batch: &'a [Event<'e>],
    first: u64,
}

impl EventSource for BatchSource<'_, '_> {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        if seq < self.first {
            return self.base.data(seq);
        }
        let e = self.batch.get(usize::try_from(seq - self.first).ok()?)?;
        (e.seq == seq).then_some(&*e.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(text: &str) -> Event<'_> {
        Event::from_json(text).unwrap()
    }

    #[test]
    fn a_rejected_batch_changes_nothing() {
        let first = vec![
            ev(r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#),
            ev(
                r#"{"type":"user/message","seq":1,"time":1,"data":{"role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            ),
        ];
        let mut state = SessionState::new(true);
        state.append_batch(&first, &Vec::<Event>::new()).unwrap();
        let before = state.clone();
        let bad = vec![
            ev(
                r#"{"type":"user/message","seq":2,"time":1,"data":{"role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":{"op":"replace","start":1,"end":1},"sourceEventSeqs":[1]}"#,
            ),
            ev(r#"{"type":"step/start","seq":3,"time":1,"data":{"turn":1,"step":1}}"#),
            ev(r#"{"type":"user/message","seq":5,"time":1,"data":{},"surfaceOp":"append"}"#),
        ];
        let v = state.append_batch(&bad, &first).unwrap_err();
        assert_eq!((v.rule, v.seq()), (Rule::Contiguity, Some(5)));
        assert_eq!(state, before);
    }

    #[test]
    fn contiguity_names_expected_seq() {
        let state = SessionState::new(false);
        let v = state.check_contiguity(87).unwrap_err();
        assert_eq!(
            v.to_string(),
            "seq=87 [contiguity] event seq 87 is not contiguous; expected 0"
        );
    }
}
