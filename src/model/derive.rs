//! Deriving the model's message history from the surface (section 4,
//! "Deriving messages").
//!
//! Each surface node projects to at most one message: `user/message` gives
//! its data; `assistant/message` its message (skipped when the content is
//! empty: it only carries usage); `tool/result` its message. The dialect is
//! decided per event: nested when `data.message` is an object, flat
//! otherwise, where the message is assembled from borrowed pieces of `data`.
//!
//! Messages are zero-copy: [`Message`] borrows slices of the stored payload.
//! The [`DeriveCache`] remembers, per message, where those slices lie inside
//! the payload, so a call after new appends costs O(new nodes); it is rebuilt
//! only when the surface's `replaceGeneration` changes.

use crate::json::{self, Fields};
use crate::surface::{EventSource, NodeKind, Surface};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::ops::Range;

/// One derived message, borrowing from the stored payloads.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Message<'a> {
    /// A stored JSON value used as is (user messages, nested dialect).
    Verbatim(&'a str),
    /// A flat-dialect assistant message:
    /// `{role:"assistant", content, provenance?}`.
    FlatAssistant {
        /// `data.content`.
        content: &'a str,
        /// `data.provenance`, when present.
        provenance: Option<&'a str>,
    },
    /// A flat-dialect tool result: `{role:"user", content:[{type:"tool-result",
    /// toolCallId, content, isError}]}`; absent fields are left out.
    FlatToolResult {
        /// `data.callId`.
        call_id: Option<&'a str>,
        /// `data.content`.
        content: Option<&'a str>,
        /// `data.isError`.
        is_error: Option<&'a str>,
    },
}

impl Message<'_> {
    /// Writes the message as one JSON value.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Message::Verbatim(v) => out.extend_from_slice(v.as_bytes()),
            Message::FlatAssistant {
                content,
                provenance,
            } => {
                out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
                out.extend_from_slice(content.as_bytes());
                if let Some(p) = provenance {
                    out.extend_from_slice(b",\"provenance\":");
                    out.extend_from_slice(p.as_bytes());
                }
                out.push(b'}');
            }
            Message::FlatToolResult {
                call_id,
                content,
                is_error,
            } => {
                out.extend_from_slice(b"{\"role\":\"user\",\"content\":[{\"type\":\"tool-result\"");
                for (key, v) in [
                    ("toolCallId", call_id),
                    ("content", content),
                    ("isError", is_error),
                ] {
                    if let Some(v) = v {
                        out.extend_from_slice(b",\"");
                        out.extend_from_slice(key.as_bytes());
                        out.extend_from_slice(b"\":");
                        out.extend_from_slice(v.as_bytes());
                    }
                }
                out.extend_from_slice(b"}]}");
            }
        }
    }

    /// The message as a JSON string.
    pub fn to_json(&self) -> String {
        let mut out = Vec::new();
        self.write_json(&mut out);
        String::from_utf8(out).expect("JSON output is UTF-8")
    }
}

/// Where a message's pieces lie inside its event's `data` (byte ranges).
/// Plain data, for the checkpoint codec: a range that does not fit the data
/// is never sliced (see `materialise`), so any values are safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Shape {
    Verbatim(Range<u32>),
    FlatAssistant {
        content: Range<u32>,
        provenance: Option<Range<u32>>,
    },
    FlatToolResult {
        call_id: Option<Range<u32>>,
        content: Option<Range<u32>>,
        is_error: Option<Range<u32>>,
    },
}

/// Derive failed because the log does not hold a surface node's event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("surface node seq={seq} is missing from the log")]
pub struct MissingEvent {
    /// The node's seq.
    pub seq: u64,
}

/// The projection of one node: `None` when it yields no message.
fn project(kind: NodeKind, data: &RawValue) -> Option<Shape> {
    let base = data.get().as_ptr() as usize;
    let range = |v: &RawValue| {
        let start = (v.get().as_ptr() as usize - base) as u32;
        start..start + v.get().len() as u32
    };
    if kind == NodeKind::User {
        return Some(Shape::Verbatim(range(data)));
    }
    let fields: Fields<'_> = json::object(data)?;
    if let Some(message) = fields.get("message").filter(|m| m.get().starts_with('{')) {
        if kind == NodeKind::Assistant {
            let content = json::object(message).and_then(|m| m.get("content"));
            if content.is_some_and(json::is_empty_array) {
                return None;
            }
        }
        return Some(Shape::Verbatim(range(message)));
    }
    match kind {
        NodeKind::Assistant => {
            let content = fields.get("content").filter(|c| !json::is_empty_array(c))?;
            Some(Shape::FlatAssistant {
                content: range(content),
                provenance: fields.get("provenance").map(range),
            })
        }
        _ => Some(Shape::FlatToolResult {
            call_id: fields.get("callId").map(range),
            content: fields.get("content").map(range),
            is_error: fields.get("isError").map(range),
        }),
    }
}

/// The message a cached shape describes, or `None` when a range does not fit
/// the data (a stale or damaged cache: never slice blindly).
fn materialise<'a>(data: &'a str, shape: &Shape) -> Option<Message<'a>> {
    let fits = |r: &Range<u32>| data.get(r.start as usize..r.end as usize).is_some();
    let ok = match shape {
        Shape::Verbatim(r) => fits(r),
        Shape::FlatAssistant {
            content,
            provenance,
        } => fits(content) && provenance.as_ref().is_none_or(fits),
        Shape::FlatToolResult {
            call_id,
            content,
            is_error,
        } => [call_id, content, is_error]
            .iter()
            .all(|r| r.as_ref().is_none_or(fits)),
    };
    ok.then(|| materialise_unchecked(data, shape))
}

fn materialise_unchecked<'a>(data: &'a str, shape: &Shape) -> Message<'a> {
    let at = |r: &Range<u32>| &data[r.start as usize..r.end as usize];
    match shape {
        Shape::Verbatim(r) => Message::Verbatim(at(r)),
        Shape::FlatAssistant {
            content,
            provenance,
        } => Message::FlatAssistant {
            content: at(content),
            provenance: provenance.as_ref().map(at),
        },
        Shape::FlatToolResult {
            call_id,
            content,
            is_error,
        } => Message::FlatToolResult {
            call_id: call_id.as_ref().map(at),
            content: content.as_ref().map(at),
            is_error: is_error.as_ref().map(at),
        },
    }
}

/// One cached message: its node and where its pieces lie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CachedMessage {
    pub(crate) seq: u64,
    pub(crate) shape: Shape,
}

/// A derive cache as plain data, for the checkpoint codec (which knows the
/// bytes). Any values make a cache that is safe to use: a stale cache is
/// rebuilt ([`DeriveCache::needs_rebuild`]) and a range that does not fit
/// its data is a [`MissingEvent`], never a slice out of bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeriveParts<'a> {
    pub(crate) generation: u64,
    pub(crate) undo_epoch: u64,
    pub(crate) last_node: Option<u64>,
    pub(crate) entries: Cow<'a, [CachedMessage]>,
}

/// The incremental derive cache.
///
/// ```
/// use sessionlog::derive::DeriveCache;
/// use sessionlog::event::Event;
/// use sessionlog::surface::Surface;
/// let log = vec![Event::from_json(r#"{"type":"user/message","seq":0,"time":0,"data":{"role":"user","content":[]},"surfaceOp":"append"}"#).unwrap()];
/// let mut surface = Surface::new();
/// surface.fold(&log[0], &log).unwrap();
/// let mut cache = DeriveCache::default();
/// cache.update(&surface, &log).unwrap();
/// let msgs: Vec<String> = cache.messages(&log).map(|m| m.unwrap().to_json()).collect();
/// assert_eq!(msgs, vec![r#"{"role":"user","content":[]}"#]);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeriveCache {
    generation: u64,
    undo_epoch: u64,
    last_node: Option<u64>,
    entries: Vec<CachedMessage>,
}

impl DeriveCache {
    /// The cache as plain data, borrowed (see [`DeriveParts`]).
    pub(crate) fn parts(&self) -> DeriveParts<'_> {
        DeriveParts {
            generation: self.generation,
            undo_epoch: self.undo_epoch,
            last_node: self.last_node,
            entries: Cow::Borrowed(&self.entries),
        }
    }

    /// A cache from plain data.
    pub(crate) fn from_parts(parts: DeriveParts<'_>) -> DeriveCache {
        DeriveCache {
            generation: parts.generation,
            undo_epoch: parts.undo_epoch,
            last_node: parts.last_node,
            entries: parts.entries.into_owned(),
        }
    }

    /// Brings the cache up to date with `surface`: O(new nodes) when no
    /// replacement happened since the last update, a rebuild otherwise.
    pub fn update(
        &mut self,
        surface: &Surface,
        source: &dyn EventSource,
    ) -> Result<(), MissingEvent> {
        if self.needs_rebuild(surface) {
            *self = DeriveCache {
                generation: surface.replace_generation(),
                undo_epoch: surface.undo_epoch(),
                ..DeriveCache::default()
            };
        }
        let mut cursor = match self.last_node {
            None => surface.head(),
            Some(n) => surface.next(n),
        };
        while let Some(seq) = cursor {
            let kind = surface.kind(seq).expect("iterating the surface");
            let data = source.data(seq).ok_or(MissingEvent { seq })?;
            if let Some(shape) = project(kind, data) {
                self.entries.push(CachedMessage { seq, shape });
            }
            self.last_node = Some(seq);
            cursor = surface.next(seq);
        }
        Ok(())
    }

    /// Whether [`DeriveCache::update`] would rebuild the cache from scratch
    /// (O(surface)) rather than extend it (O(new nodes)): after a
    /// replacement, and after an undo (a node seen before may have been taken
    /// back and its seq reused by another event).
    pub fn needs_rebuild(&self, surface: &Surface) -> bool {
        self.generation != surface.replace_generation()
            || self.undo_epoch != surface.undo_epoch()
            || self.last_node.is_some_and(|n| !surface.contains(n))
    }

    /// Checks a cache that was not built here (decoded from a checkpoint)
    /// against `surface` and `source`: every entry names a node of the
    /// surface, in surface order, up to `last_node`, and its pieces fit
    /// that node's data, so [`DeriveCache::messages`] yields no
    /// [`MissingEvent`]. A checksum proves the bytes are the ones written,
    /// not that the writer was right; a crafted one must not reach a
    /// reader. O(surface); `Err` names the first entry that does not fit.
    pub fn check(&self, surface: &Surface, source: &dyn EventSource) -> Result<(), MissingEvent> {
        // The surface's own links, not `Surface::next` (a search per node).
        let mut nodes = surface.iter();
        let mut passed_last = self.last_node.is_none();
        for e in &self.entries {
            let missing = || MissingEvent { seq: e.seq };
            // Walk to the entry's node; never past `last_node`.
            loop {
                let seq = nodes.next().filter(|_| !passed_last).ok_or_else(missing)?;
                passed_last = Some(seq) == self.last_node;
                if seq == e.seq {
                    break;
                }
            }
            let data = source.data(e.seq).ok_or_else(missing)?;
            materialise(data.get(), &e.shape).ok_or_else(missing)?;
        }
        Ok(())
    }

    /// Number of cached messages.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no message is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The cached messages, borrowed from `source` (which must be the log
    /// the cache was updated from).
    pub fn messages<'a>(
        &'a self,
        source: &'a dyn EventSource,
    ) -> impl Iterator<Item = Result<Message<'a>, MissingEvent>> + 'a {
        self.entries.iter().map(move |e| {
            let data = source.data(e.seq).ok_or(MissingEvent { seq: e.seq })?;
            materialise(data.get(), &e.shape).ok_or(MissingEvent { seq: e.seq })
        })
    }

    /// The seqs of the nodes that produced messages, in order.
    pub fn message_seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|e| e.seq)
    }
}

/// Derives the messages from scratch (no cache).
pub fn derive<'a>(
    surface: &Surface,
    source: &'a dyn EventSource,
) -> Result<Vec<Message<'a>>, MissingEvent> {
    surface
        .iter()
        .filter_map(|seq| {
            let data = match source.data(seq) {
                Some(d) => d,
                None => return Some(Err(MissingEvent { seq })),
            };
            let kind = surface.kind(seq).expect("iterating the surface");
            project(kind, data).map(|shape| Ok(materialise_unchecked(data.get(), &shape)))
        })
        .collect()
}

/// Serialises as the message's JSON (exactly [`Message::to_json`]).
impl serde::Serialize for Message<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw = RawValue::from_string(self.to_json()).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;

    fn surface_of(log: &Vec<Event<'_>>) -> Surface {
        let mut s = Surface::new();
        for e in log {
            s.fold(e, log).unwrap();
        }
        s
    }

    fn ev(text: &str) -> Event<'_> {
        Event::from_json(text).unwrap()
    }

    #[test]
    fn projects_both_dialects() {
        let log = vec![
            ev(
                r#"{"type":"user/message","seq":0,"time":0,"data":{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            ),
            ev(
                r#"{"type":"assistant/message","seq":1,"time":0,"data":{"turn":1,"step":1,"content":[{"type":"text","text":"a"}],"provenance":{"p":1}},"surfaceOp":"append"}"#,
            ),
            ev(
                r#"{"type":"assistant/message","seq":2,"time":0,"data":{"turn":1,"step":1,"content":[],"usage":{}},"surfaceOp":"append"}"#,
            ),
            ev(
                r#"{"type":"tool/result","seq":3,"time":0,"data":{"turn":1,"step":1,"callId":"c","content":[{"type":"text","text":"o"}],"isError":false},"surfaceOp":"append"}"#,
            ),
            ev(
                r#"{"type":"assistant/message","seq":4,"time":0,"data":{"turn":1,"step":2,"message":{"role":"assistant","content":[]}},"surfaceOp":"append"}"#,
            ),
            ev(
                r#"{"type":"tool/result","seq":5,"time":0,"data":{"turn":1,"step":1,"message":{"role":"user","content":[1]}},"surfaceOp":"append"}"#,
            ),
        ];
        let s = surface_of(&log);
        let got: Vec<String> = derive(&s, &log)
            .unwrap()
            .iter()
            .map(Message::to_json)
            .collect();
        assert_eq!(
            got,
            vec![
                r#"{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}}"#,
                r#"{"role":"assistant","content":[{"type":"text","text":"a"}],"provenance":{"p":1}}"#,
                r#"{"role":"user","content":[{"type":"tool-result","toolCallId":"c","content":[{"type":"text","text":"o"}],"isError":false}]}"#,
                r#"{"role":"user","content":[1]}"#,
            ]
        );
    }

    #[test]
    fn cache_is_incremental_and_rebuilds_on_replace() {
        let mut log = vec![
            ev(r#"{"type":"user/message","seq":0,"time":0,"data":{"n":0},"surfaceOp":"append"}"#),
            ev(r#"{"type":"user/message","seq":1,"time":0,"data":{"n":1},"surfaceOp":"append"}"#),
        ];
        let mut cache = DeriveCache::default();
        cache.update(&surface_of(&log), &log).unwrap();
        assert_eq!(cache.len(), 2);
        log.push(ev(
            r#"{"type":"user/message","seq":2,"time":0,"data":{"n":2},"surfaceOp":"append"}"#,
        ));
        cache.update(&surface_of(&log), &log).unwrap();
        assert_eq!(cache.message_seqs().collect::<Vec<_>>(), vec![0, 1, 2]);
        log.push(ev(r#"{"type":"user/message","seq":3,"time":0,"data":{"n":3},"surfaceOp":{"op":"replace","start":0,"end":1},"sourceEventSeqs":[0,1]}"#));
        cache.update(&surface_of(&log), &log).unwrap();
        assert_eq!(cache.message_seqs().collect::<Vec<_>>(), vec![3, 2]);
        let msgs: Vec<String> = cache.messages(&log).map(|m| m.unwrap().to_json()).collect();
        assert_eq!(msgs, vec![r#"{"n":3}"#, r#"{"n":2}"#]);
    }

    #[test]
    fn check_refuses_a_cache_that_does_not_fit_its_surface_or_data() {
        let log = vec![
            ev(r#"{"type":"user/message","seq":0,"time":0,"data":{"n":0},"surfaceOp":"append"}"#),
            ev(r#"{"type":"user/message","seq":1,"time":0,"data":{"n":10},"surfaceOp":"append"}"#),
            ev(r#"{"type":"user/message","seq":2,"time":0,"data":{"n":2},"surfaceOp":"append"}"#),
        ];
        let surface = surface_of(&log);
        let mut cache = DeriveCache::default();
        cache.update(&surface, &log).unwrap();
        assert_eq!(cache.check(&surface, &log), Ok(()));
        // A surface without the last node, or in another order.
        let shorter = surface_of(&log[..2].to_vec());
        assert_eq!(cache.check(&shorter, &log), Err(MissingEvent { seq: 2 }));
        let mut swapped = cache.clone();
        swapped.entries.swap(0, 1);
        assert_eq!(swapped.check(&surface, &log), Err(MissingEvent { seq: 0 }));
        // An entry past `last_node`.
        let mut past = cache.clone();
        past.last_node = Some(1);
        assert_eq!(past.check(&surface, &log), Err(MissingEvent { seq: 2 }));
        // Data shorter than the cached range.
        let mut other = log.clone();
        other[1] =
            ev(r#"{"type":"user/message","seq":1,"time":0,"data":{"n":1},"surfaceOp":"append"}"#);
        assert_eq!(cache.check(&surface, &other), Err(MissingEvent { seq: 1 }));
    }
}
