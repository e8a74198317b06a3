//! Rule violations: the one error type of the pure session model.
//!
//! Every rule of the session model (envelope, contiguity, surface, provenance,
//! invariants, header) reports a [`Violation`] naming the rule, the event seq
//! (or the file line, for input that never became an event) and a reason a
//! person can act on. The storage layer wraps violations with the session id.

use std::fmt;

/// The rule a [`Violation`] broke.
///
/// The names (see [`Rule::name`]) are stable: `check` prints them and the
/// fixtures' manifest refers to them as `fail:<rule>@<seq>`. The variants are
/// listed in the order the checks run for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// The line is not a JSON object (or not valid UTF-8).
    Json,
    /// A packed chunk row is malformed.
    PackedRow,
    /// The session header is malformed.
    Header,
    /// The event envelope is malformed: unknown keys, bad `seq`/`time`,
    /// missing `data`, `ignorable` other than `true`.
    Envelope,
    /// `seq` is not the next seq of the session.
    Contiguity,
    /// A surface-eligible event lacks `surfaceOp`, or another event carries
    /// `surfaceOp`/`sourceEventSeqs`.
    Eligibility,
    /// `surfaceOp` is neither `"append"` nor an exact replace object.
    SurfaceOp,
    /// A replace range endpoint is not on the surface, or start is after end.
    ReplaceRange,
    /// `sourceEventSeqs` is malformed: not an array, empty, duplicated, or
    /// naming a seq that is not earlier.
    Provenance,
    /// A replace's `sourceEventSeqs` misses a shadowed node.
    ReplaceSources,
    /// A replacing `tool/result` changes more than the tool output.
    ToolResultRewrite,
    /// A relational invariant of strict mode (turn/step structure, tool
    /// pairing, known types, message shape).
    Invariant,
}

impl Rule {
    /// The stable kebab-case name printed in `[brackets]` by `check`.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Json => "json",
            Rule::PackedRow => "packed-row",
            Rule::Header => "header",
            Rule::Envelope => "envelope",
            Rule::Contiguity => "contiguity",
            Rule::Eligibility => "eligibility",
            Rule::SurfaceOp => "surface-op",
            Rule::ReplaceRange => "replace-range",
            Rule::Provenance => "provenance",
            Rule::ReplaceSources => "replace-sources",
            Rule::ToolResultRewrite => "tool-result-rewrite",
            Rule::Invariant => "invariant",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a violation was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Location {
    /// An event, by its seq (the seq it claims, for contiguity).
    Seq(u64),
    /// A line of an input file (1-based; line 1 is the header), for input
    /// that could not be read as an event at all.
    Line(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Seq(s) => write!(f, "seq={s}"),
            Location::Line(l) => write!(f, "line={l}"),
        }
    }
}

/// A broken rule of the session model.
///
/// Displays as `seq=N [rule] reason` (or `line=N [rule] reason`), the form
/// `sessionlog check` prints after `FAIL `.
///
/// ```
/// use sessionlog::violation::{Location, Rule, Violation};
/// let v = Violation::new(Location::Seq(87), Rule::Contiguity, "event seq 87 is not contiguous; expected 6");
/// assert_eq!(v.to_string(), "seq=87 [contiguity] event seq 87 is not contiguous; expected 6");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location} [{rule}] {reason}")]
pub struct Violation {
    /// Where.
    pub location: Location,
    /// Which rule.
    pub rule: Rule,
    /// Why, in words that name the offending values.
    pub reason: String,
}

impl Violation {
    /// A violation at `location` of `rule`.
    pub fn new(location: Location, rule: Rule, reason: impl Into<String>) -> Self {
        Violation {
            location,
            rule,
            reason: reason.into(),
        }
    }

    /// A violation by the event with this seq.
    pub fn at(seq: u64, rule: Rule, reason: impl Into<String>) -> Self {
        Violation::new(Location::Seq(seq), rule, reason)
    }

    /// The seq this violation names, if it names one.
    pub fn seq(&self) -> Option<u64> {
        match self.location {
            Location::Seq(s) => Some(s),
            Location::Line(_) => None,
        }
    }
}
