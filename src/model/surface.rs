//! The surface index: the ordered list of events that produce model messages
//! (section 4 of the domain page).
//!
//! The surface is a doubly linked list of node seqs. Each node carries an
//! *order label*: appends take increasing labels, and a replacing node takes
//! the label of the first node it shadows, which lies strictly between its
//! neighbours' labels. Label order therefore always equals list order, so
//! "start is not after end" is one comparison, and a replace costs
//! O(length of the shadowed range) rather than the harness's linear
//! `indexOf` over the whole surface.
//!
//! Every operation is validate-then-apply: [`Surface::check`] inspects the
//! event without changing anything and returns a [`Plan`];
//! [`Surface::apply`] carries the plan out and returns an [`Undo`] so a batch
//! can be rolled back whole.

use crate::event::{Event, SurfaceOp};
use crate::json::{self, Fields};
use crate::violation::{Rule, Violation};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Read access to the events of a session, for the rules that must look at
/// an earlier event's payload (the tool/result rewrite rule, derive).
pub trait EventSource {
    /// The `data` of the event with this seq, borrowed from the source.
    fn data(&self, seq: u64) -> Option<&RawValue>;
}

/// A slice of a whole log, where event `i` has seq `i`.
impl EventSource for [Event<'_>] {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        let e = self.get(usize::try_from(seq).ok()?)?;
        (e.seq == seq).then_some(&*e.data)
    }
}

impl EventSource for Vec<Event<'_>> {
    fn data(&self, seq: u64) -> Option<&RawValue> {
        self.as_slice().data(seq)
    }
}

/// The three surface-eligible event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeKind {
    /// `user/message`.
    User,
    /// `assistant/message`.
    Assistant,
    /// `tool/result`.
    ToolResult,
}

impl NodeKind {
    /// The kind of a surface-eligible event type.
    pub fn of(kind: &str) -> Option<NodeKind> {
        match kind {
            "user/message" => Some(NodeKind::User),
            "assistant/message" => Some(NodeKind::Assistant),
            "tool/result" => Some(NodeKind::ToolResult),
            _ => None,
        }
    }
}

/// "No node": the end of a link.
pub(crate) const NIL: u32 = u32::MAX;

/// One node ever placed on the surface: its seq, links (indices into
/// [`Surface::nodes`], [`NIL`] for none) and order label. A shadowed node
/// stays in the vector, marked not live, so the vector stays sorted by seq
/// and indices stay valid. Plain data: the checkpoint codec reads and builds
/// nodes ([`SurfaceParts`]); [`Surface::from_parts`] checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) seq: u64,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) label: u64,
    pub(crate) kind: NodeKind,
    pub(crate) live: bool,
}

/// One applied replacement, kept as history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// The replacing event.
    pub seq: u64,
    /// The first shadowed node.
    pub start: u64,
    /// The last shadowed node.
    pub end: u64,
    /// Every shadowed node, in surface order.
    pub shadowed_seqs: Vec<u64>,
}

/// The surface of one session.
///
/// Nodes live in one vector in seq order: seqs only grow, so a new node (an
/// append, or a replacement) is always pushed at the end, and a node is found
/// by binary search. Links are vector indices, so walking the list and
/// appending touch no hash table; shadowed nodes are marked, not removed.
#[derive(Debug, Clone)]
pub struct Surface {
    nodes: Vec<Node>,
    head: u32,
    tail: u32,
    live: usize,
    next_label: u64,
    replace_generation: u64,
    last_processed_seq: Option<u64>,
    replacements: Vec<Replacement>,
    /// Counts [`Surface::undo`] calls: after an undo, a later node can reuse
    /// a seq the derive cache already saw, so caches key on this too.
    undo_epoch: u64,
}

impl Default for Surface {
    fn default() -> Self {
        Surface {
            nodes: Vec::new(),
            head: NIL,
            tail: NIL,
            live: 0,
            next_label: 0,
            replace_generation: 0,
            last_processed_seq: None,
            replacements: Vec::new(),
            undo_epoch: 0,
        }
    }
}

impl PartialEq for Surface {
    fn eq(&self, other: &Self) -> bool {
        // Labels and shadowed nodes are details of how the state was
        // reached; two surfaces are equal when they hold the same nodes, of
        // the same kinds, in order.
        self.iter_nodes()
            .map(|n| (n.seq, n.kind))
            .eq(other.iter_nodes().map(|n| (n.seq, n.kind)))
            && self.replace_generation == other.replace_generation
            && self.last_processed_seq == other.last_processed_seq
            && self.replacements == other.replacements
    }
}

/// A surface as plain data, for the checkpoint codec (which knows the bytes;
/// the model knows what makes a surface well formed). The live count and
/// `replaceGeneration` are not parts: they follow from the nodes and the
/// replacement history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SurfaceParts<'a> {
    /// Every node ever placed, in seq order.
    pub(crate) nodes: Cow<'a, [Node]>,
    /// The first node's index, or [`NIL`].
    pub(crate) head: u32,
    /// The last node's index, or [`NIL`].
    pub(crate) tail: u32,
    /// The label the next append takes.
    pub(crate) next_label: u64,
    /// The last event folded in.
    pub(crate) last_processed_seq: Option<u64>,
    /// The replacement history, oldest first.
    pub(crate) replacements: Cow<'a, [Replacement]>,
    /// See [`Surface::undo_epoch`].
    pub(crate) undo_epoch: u64,
}

/// What [`Surface::check`] decided an event does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Plan {
    /// Not a surface event: only `lastProcessedSeq` moves.
    Skip,
    /// Append a node at the tail.
    Append(NodeKind),
    /// Replace the nodes `shadowed` (in order) by one node.
    Replace {
        /// The new node's kind.
        kind: NodeKind,
        /// The shadowed seqs, `start..=end` in surface order.
        shadowed: Vec<u64>,
    },
}

/// How to take back one [`Surface::apply`].
#[derive(Debug, Clone)]
pub struct Undo {
    prev_last_processed: Option<u64>,
    /// Appended: nothing else; replaced: the first and last shadowed nodes.
    pushed: Option<Option<(u32, u32)>>,
}

impl Surface {
    /// An empty surface.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of nodes on the surface.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the surface is empty.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// How many replacements have been applied.
    pub fn replace_generation(&self) -> u64 {
        self.replace_generation
    }

    /// How many times an apply was taken back (see [`Surface::undo`]).
    pub fn undo_epoch(&self) -> u64 {
        self.undo_epoch
    }

    /// The last event folded in, surface or not.
    pub fn last_processed_seq(&self) -> Option<u64> {
        self.last_processed_seq
    }

    /// The replacement history, oldest first.
    pub fn replacements(&self) -> &[Replacement] {
        &self.replacements
    }

    /// The index of live node `seq`: a binary search (seqs are sorted).
    fn find(&self, seq: u64) -> Option<u32> {
        let i = self.nodes.binary_search_by_key(&seq, |n| n.seq).ok()?;
        self.nodes[i].live.then_some(i as u32)
    }

    fn at(&self, i: u32) -> Option<&Node> {
        (i != NIL).then(|| &self.nodes[i as usize])
    }

    /// Whether `seq` is currently on the surface.
    pub fn contains(&self, seq: u64) -> bool {
        self.find(seq).is_some()
    }

    /// The seqs in `range` that are on the surface, in order: one binary
    /// search and a walk, where asking [`Surface::contains`] of each seq of
    /// a batch costs a search per event.
    pub fn live_in(&self, range: std::ops::Range<u64>) -> impl Iterator<Item = u64> + '_ {
        let from = self.nodes.partition_point(|n| n.seq < range.start);
        self.nodes[from..]
            .iter()
            .take_while(move |n| n.seq < range.end)
            .filter(|n| n.live)
            .map(|n| n.seq)
    }

    /// The kind of the node `seq`, if it is on the surface.
    pub fn kind(&self, seq: u64) -> Option<NodeKind> {
        self.find(seq).map(|i| self.nodes[i as usize].kind)
    }

    /// The first node.
    pub fn head(&self) -> Option<u64> {
        self.at(self.head).map(|n| n.seq)
    }

    /// The last node.
    pub fn tail(&self) -> Option<u64> {
        self.at(self.tail).map(|n| n.seq)
    }

    /// The node after `seq`, if `seq` is on the surface and not last.
    pub fn next(&self, seq: u64) -> Option<u64> {
        let i = self.find(seq)?;
        self.at(self.nodes[i as usize].next).map(|n| n.seq)
    }

    fn iter_nodes(&self) -> impl Iterator<Item = &Node> + '_ {
        std::iter::successors(self.at(self.head), move |n| self.at(n.next))
    }

    /// Iterates over node seqs in surface order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter_nodes().map(|n| n.seq)
    }

    /// Node seqs in surface order.
    pub fn seqs(&self) -> Vec<u64> {
        self.iter().collect()
    }

    /// The surface as plain data, borrowed (see [`SurfaceParts`]).
    pub(crate) fn parts(&self) -> SurfaceParts<'_> {
        SurfaceParts {
            nodes: Cow::Borrowed(&self.nodes),
            head: self.head,
            tail: self.tail,
            next_label: self.next_label,
            last_processed_seq: self.last_processed_seq,
            replacements: Cow::Borrowed(&self.replacements),
            undo_epoch: self.undo_epoch,
        }
    }

    /// A surface from plain data, if it is well formed ([`Surface::validate`],
    /// every link in range, every label below the next one): the parts come
    /// from a file, and a checksum only proves they are the bytes written.
    pub(crate) fn from_parts(parts: SurfaceParts<'_>) -> Result<Surface, String> {
        let nodes = parts.nodes.into_owned();
        if nodes.len() >= NIL as usize {
            return Err(format!(
                "{} nodes, at most {} allowed",
                nodes.len(),
                NIL - 1
            ));
        }
        let in_range = |i: u32| i == NIL || (i as usize) < nodes.len();
        if let Some(n) = nodes
            .iter()
            .find(|n| !in_range(n.prev) || !in_range(n.next))
        {
            return Err(format!("node {} links outside the node list", n.seq));
        }
        if let Some(n) = nodes.iter().find(|n| n.label >= parts.next_label) {
            return Err(format!(
                "node {} has label {}, not below the next label {}",
                n.seq, n.label, parts.next_label
            ));
        }
        let surface = Surface {
            live: nodes.iter().filter(|n| n.live).count(),
            nodes,
            head: parts.head,
            tail: parts.tail,
            next_label: parts.next_label,
            replace_generation: parts.replacements.len() as u64,
            last_processed_seq: parts.last_processed_seq,
            replacements: parts.replacements.into_owned(),
            undo_epoch: parts.undo_epoch,
        };
        surface.validate()?;
        Ok(surface)
    }

    /// Checks the surface's own structure: sorted seqs, links in range and
    /// mutually consistent, order labels increasing along the list, one
    /// walk from head to tail visiting exactly the live nodes. A surface read
    /// from a checkpoint is validated before it is trusted (a checksum only
    /// proves the bytes are the ones written, not that the writer was right).
    pub fn validate(&self) -> Result<(), String> {
        let n = self.nodes.len();
        let in_range = |i: u32| i == NIL || (i as usize) < n;
        if !in_range(self.head) || !in_range(self.tail) {
            return Err("head or tail out of range".into());
        }
        if self.nodes.windows(2).any(|w| w[0].seq >= w[1].seq) {
            return Err("node seqs are not strictly increasing".into());
        }
        let mut count = 0usize;
        let mut prev = NIL;
        let mut cur = self.head;
        let mut last_label = None;
        while cur != NIL {
            let node = &self.nodes[cur as usize];
            if !node.live || node.prev != prev || !in_range(node.next) {
                return Err(format!("node {} is badly linked", node.seq));
            }
            if last_label.is_some_and(|l| l >= node.label) {
                return Err(format!("node {} is out of label order", node.seq));
            }
            last_label = Some(node.label);
            count += 1;
            if count > n {
                return Err("the node list has a cycle".into());
            }
            prev = cur;
            cur = node.next;
        }
        if prev != self.tail {
            return Err("the walk does not end at the tail".into());
        }
        let live = self.nodes.iter().filter(|x| x.live).count();
        if count != live || live != self.live {
            return Err(format!(
                "{count} nodes on the list, {live} marked live, {} counted",
                self.live
            ));
        }
        if self
            .last_processed_seq
            .is_none_or(|l| self.nodes.last().is_some_and(|x| x.seq > l))
            && n > 0
        {
            return Err("a node is newer than the last processed event".into());
        }
        Ok(())
    }

    /// Checks `event` against the surface without changing it. `source`
    /// gives the payloads of earlier events (the tool/result rewrite rule
    /// compares the replacement with the node it shadows).
    ///
    /// Checks, in order: replace range (start on the surface, end on the
    /// surface, start not after end), provenance (non-empty except on
    /// `assistant/message`, no duplicates, earlier seqs only), replace
    /// sources cover the shadowed nodes, tool/result rewrite.
    pub fn check(&self, event: &Event<'_>, source: &dyn EventSource) -> Result<Plan, Violation> {
        let seq = event.seq;
        let Some(kind) = NodeKind::of(&event.kind) else {
            return Ok(Plan::Skip);
        };
        let plan = match event.surface_op {
            None => return Ok(Plan::Skip), // eligibility is the envelope's rule
            Some(SurfaceOp::Append) => Plan::Append(kind),
            Some(SurfaceOp::Replace { start, end }) => Plan::Replace {
                kind,
                shadowed: self.range(seq, start, end)?,
            },
        };
        if let Some(src) = &event.source_event_seqs {
            check_provenance(seq, &event.kind, src)?;
        }
        if let Plan::Replace { shadowed, .. } = &plan {
            check_covered(seq, event.source_event_seqs.as_deref(), shadowed)?;
            if kind == NodeKind::ToolResult {
                self.check_rewrite(event, shadowed, source)?;
            }
        }
        Ok(plan)
    }

    /// The shadowed range `start..=end`, in O(its length) after two binary
    /// searches.
    fn range(&self, seq: u64, start: u64, end: u64) -> Result<Vec<u64>, Violation> {
        let bad = |why: String| Violation::at(seq, Rule::ReplaceRange, why);
        let s = self
            .find(start)
            .ok_or_else(|| bad(format!("replace start {start} is not on the surface")))?;
        let e = self
            .find(end)
            .ok_or_else(|| bad(format!("replace end {end} is not on the surface")))?;
        if self.nodes[s as usize].label > self.nodes[e as usize].label {
            return Err(bad(format!(
                "replace start {start} comes after end {end} on the surface"
            )));
        }
        let mut out = vec![start];
        let mut cur = s;
        while cur != e {
            cur = self.nodes[cur as usize].next;
            out.push(self.nodes[cur as usize].seq);
        }
        Ok(out)
    }

    fn check_rewrite(
        &self,
        event: &Event<'_>,
        shadowed: &[u64],
        source: &dyn EventSource,
    ) -> Result<(), Violation> {
        let seq = event.seq;
        let bad = |why: String| Violation::at(seq, Rule::ToolResultRewrite, why);
        if shadowed.len() != 1 {
            return Err(bad(format!(
                "a replacing tool/result must shadow exactly one node, not {}",
                shadowed.len()
            )));
        }
        let old = shadowed[0];
        if self.kind(old) != Some(NodeKind::ToolResult) {
            return Err(bad(format!("shadowed node {old} is not a tool/result")));
        }
        let old_data = source
            .data(old)
            .ok_or_else(|| bad(format!("shadowed node {old} is not in the log")))?;
        rewrite_differs_only_in_output(old_data, &event.data)
            .map_err(|why| bad(format!("rewrite of tool/result {old}: {why}")))
    }

    /// Applies a plan from [`Surface::check`] for `event` (which must be the
    /// event that was checked, and the next to be folded).
    pub fn apply(&mut self, event: &Event<'_>, plan: Plan) -> Undo {
        let seq = event.seq;
        let mut undo = Undo {
            prev_last_processed: self.last_processed_seq,
            pushed: None,
        };
        self.last_processed_seq = Some(seq);
        match plan {
            Plan::Skip => {}
            Plan::Append(kind) => {
                let label = self.next_label;
                self.next_label += 1;
                let tail = self.tail;
                let me = self.push(Node {
                    seq,
                    prev: tail,
                    next: NIL,
                    label,
                    kind,
                    live: true,
                });
                self.set_next(tail, me);
                self.tail = me;
                self.live += 1;
                undo.pushed = Some(None);
            }
            Plan::Replace { kind, shadowed } => {
                let first = self.find(shadowed[0]).expect("checked on surface");
                let mut last = first;
                self.nodes[first as usize].live = false;
                for _ in 1..shadowed.len() {
                    last = self.nodes[last as usize].next;
                    self.nodes[last as usize].live = false;
                }
                let (prev, next) = (
                    self.nodes[first as usize].prev,
                    self.nodes[last as usize].next,
                );
                let me = self.push(Node {
                    seq,
                    prev,
                    next,
                    label: self.nodes[first as usize].label,
                    kind,
                    live: true,
                });
                self.set_next(prev, me);
                self.set_prev(next, me);
                self.live = self.live + 1 - shadowed.len();
                self.replace_generation += 1;
                self.replacements.push(Replacement {
                    seq,
                    start: shadowed[0],
                    end: *shadowed.last().expect("non-empty"),
                    shadowed_seqs: shadowed,
                });
                undo.pushed = Some(Some((first, last)));
            }
        }
        undo
    }

    /// Takes back an [`Surface::apply`]; undos must be taken back newest first.
    pub fn undo(&mut self, undo: Undo) {
        self.undo_epoch += 1;
        self.last_processed_seq = undo.prev_last_processed;
        let Some(shadowed) = undo.pushed else {
            return;
        };
        let me = self.nodes.pop().expect("the applied node is last");
        let (prev, next) = (me.prev, me.next);
        match shadowed {
            None => {
                self.next_label -= 1;
                self.tail = prev;
                self.set_next(prev, NIL);
                self.live -= 1;
            }
            Some((first, last)) => {
                // The shadowed nodes kept their own links: revive them and
                // point the neighbours back at the ends of the range.
                let mut cur = first;
                let mut count = 1;
                self.nodes[cur as usize].live = true;
                while cur != last {
                    cur = self.nodes[cur as usize].next;
                    self.nodes[cur as usize].live = true;
                    count += 1;
                }
                self.set_next(prev, first);
                self.set_prev(next, last);
                self.live = self.live + count - 1;
                self.replace_generation -= 1;
                self.replacements.pop();
            }
        }
    }

    /// Checks and applies in one step.
    pub fn fold(&mut self, event: &Event<'_>, source: &dyn EventSource) -> Result<(), Violation> {
        let plan = self.check(event, source)?;
        self.apply(event, plan);
        Ok(())
    }

    fn push(&mut self, node: Node) -> u32 {
        debug_assert!(
            self.nodes.last().is_none_or(|n| n.seq < node.seq),
            "seqs grow"
        );
        self.nodes.push(node);
        u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 surface nodes")
    }

    /// Sets `at.next = to`; `at == NIL` means the head pointer.
    fn set_next(&mut self, at: u32, to: u32) {
        if at == NIL {
            self.head = to;
        } else {
            self.nodes[at as usize].next = to;
        }
    }

    /// Sets `at.prev = to`; `at == NIL` means the tail pointer.
    fn set_prev(&mut self, at: u32, to: u32) {
        if at == NIL {
            self.tail = to;
        } else {
            self.nodes[at as usize].prev = to;
        }
    }

    /// The surface as `sessionlog surface` prints it:
    /// `{"nodes":[...],"replacements":[{"seq","start","end","shadowedSeqs"}],"replaceGeneration":N}`.
    pub fn to_json(&self) -> String {
        use std::fmt::Write;
        let mut out = String::from("{\"nodes\":[");
        for (i, s) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{s}");
        }
        out.push_str("],\"replacements\":[");
        for (i, r) in self.replacements.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let shadowed: Vec<String> = r.shadowed_seqs.iter().map(u64::to_string).collect();
            let _ = write!(
                out,
                "{{\"seq\":{},\"start\":{},\"end\":{},\"shadowedSeqs\":[{}]}}",
                r.seq,
                r.start,
                r.end,
                shadowed.join(",")
            );
        }
        let _ = write!(out, "],\"replaceGeneration\":{}}}", self.replace_generation);
        out
    }
}

/// Section 4: `sourceEventSeqs` is non-empty (except on `assistant/message`,
/// where `[]` means a known-empty stream), has no duplicates, and names only
/// earlier events.
fn check_provenance(seq: u64, kind: &str, src: &[u64]) -> Result<(), Violation> {
    let bad = |why: String| Violation::at(seq, Rule::Provenance, why);
    if src.is_empty() && kind != "assistant/message" {
        return Err(bad(format!("sourceEventSeqs of {kind} must not be empty")));
    }
    if let Some(late) = src.iter().find(|&&s| s >= seq) {
        return Err(bad(format!(
            "sourceEventSeqs entry {late} is not earlier than the event itself"
        )));
    }
    // Sources are usually ascending (chunk seqs); only sort when they are not.
    if !src.windows(2).all(|w| w[0] < w[1]) {
        let mut sorted = src.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("sourceEventSeqs names {} twice", w[0])));
        }
    }
    Ok(())
}

/// Section 4: a replace's `sourceEventSeqs` contains every shadowed node.
fn check_covered(seq: u64, src: Option<&[u64]>, shadowed: &[u64]) -> Result<(), Violation> {
    let src = src.unwrap_or(&[]);
    let mut sorted = src.to_vec();
    sorted.sort_unstable();
    if let Some(missing) = shadowed.iter().find(|s| sorted.binary_search(s).is_err()) {
        return Err(Violation::at(
            seq,
            Rule::ReplaceSources,
            format!("sourceEventSeqs must contain shadowed node {missing}"),
        ));
    }
    Ok(())
}

/// The tool/result rewrite rule: the replacement may differ from the
/// shadowed result only in the tool-result block's inner `content`. Nested:
/// compare all of `data` with `message.content[0].content` nulled on both
/// sides; flat: all of `data` with `content` nulled; a change of dialect is
/// a violation.
fn rewrite_differs_only_in_output(old: &RawValue, new: &RawValue) -> Result<(), String> {
    let (old_nested, new_nested) = (is_nested(old), is_nested(new));
    if old_nested != new_nested {
        return Err("the rewrite changes the payload dialect".into());
    }
    let parse = |r: &RawValue| serde_json::from_str::<serde_json::Value>(r.get());
    let (Ok(mut a), Ok(mut b)) = (parse(old), parse(new)) else {
        return Err("payload is not JSON".into());
    };
    for v in [&mut a, &mut b] {
        let slot = if old_nested {
            v.pointer_mut("/message/content/0/content")
        } else {
            v.pointer_mut("/content")
        };
        if let Some(slot) = slot {
            *slot = serde_json::Value::Null;
        }
    }
    if json::value_eq(&a, &b) {
        Ok(())
    } else {
        Err("only the tool output (the tool-result block's content) may change".into())
    }
}

/// Whether a tool/result or assistant/message payload is in the nested
/// dialect: `data.message` is an object.
pub fn is_nested(data: &RawValue) -> bool {
    json::object(data)
        .and_then(|f: Fields<'_>| f.get("message"))
        .is_some_and(|m| m.get().starts_with('{'))
}

#[cfg(test)]
mod tests;
