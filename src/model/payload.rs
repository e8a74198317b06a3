//! An event's payload ([`Data`]): JSON text kept verbatim, holding only
//! numbers the harness can read (`harness-domain.md`: events are plain
//! JSON, and `JSON.parse` reads `1e999` as `Infinity`).
//!
//! The rule is checked once, where the text enters: a [`Data`] can only be
//! made by a constructor that checks it (or, inside this crate, from bytes
//! the crate wrote or checked itself), so the fold never scans a payload
//! again, whoever built the event and however it was copied.

use crate::json;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Why a text is refused as a payload: it is not JSON, or one of its
/// numbers is not finite as a double.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct DataError {
    reason: String,
}

impl DataError {
    /// What is wrong, e.g. `number 1e999 at byte 8 is not finite`.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// An event's payload: verbatim JSON text whose numbers are all finite.
///
/// Borrowed from the input where it can be (`Data<'static>` owns it); it
/// dereferences to the [`RawValue`], so `data.get()` is the text. The
/// events a store reads back ([`Store::load`](crate::store::Store::load)
/// and the other owned reads) share one buffer per stored batch: an event
/// kept keeps its batch's text alive (at most one batch's data), and
/// cloning one copies no text.
///
/// ```
/// use sessionlog::event::Data;
/// use serde_json::value::RawValue;
///
/// let data = Data::from_json(r#"{"turn":1}"#)?;
/// assert_eq!(data.get(), r#"{"turn":1}"#);
/// // A number JSON.parse would read as Infinity is refused, borrowed or not.
/// let raw: &RawValue = serde_json::from_str(r#"{"x":1e999}"#)?;
/// assert!(Data::new(raw).is_err());
/// assert!(Data::from_json("not json").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Data<'a>(Repr<'a>);

/// Where a payload's text lives.
#[derive(Clone)]
enum Repr<'a> {
    Borrowed(&'a RawValue),
    Owned(Box<RawValue>),
    /// A range of a buffer shared by the events of one batch: reading a
    /// batch back allocates once for all its payloads, not once per event.
    Shared {
        text: Arc<str>,
        start: u32,
        end: u32,
    },
}

impl<'a> Data<'a> {
    /// Borrows `raw` once its numbers are checked.
    pub fn new(raw: &'a RawValue) -> Result<Data<'a>, DataError> {
        check(raw)?;
        Ok(Data(Repr::Borrowed(raw)))
    }

    /// Takes `raw` once its numbers are checked.
    pub fn from_raw(raw: Box<RawValue>) -> Result<Data<'static>, DataError> {
        check(&raw)?;
        Ok(Data(Repr::Owned(raw)))
    }

    /// Parses `text` as one JSON value and checks its numbers; the text is
    /// kept exactly as given.
    pub fn from_json(text: impl Into<String>) -> Result<Data<'static>, DataError> {
        let raw = RawValue::from_string(text.into()).map_err(|e| DataError {
            reason: format!("not JSON: {e}"),
        })?;
        Data::from_raw(raw)
    }

    /// A payload this crate wrote itself (the closers it builds) or read
    /// back from its own checksummed records, whose payloads were checked
    /// when they were appended: not scanned again. (Like every other field
    /// of a record, a payload that passes its checksum is trusted.)
    pub(crate) fn trusted(raw: Cow<'a, RawValue>) -> Data<'a> {
        Data(match raw {
            Cow::Borrowed(raw) => Repr::Borrowed(raw),
            Cow::Owned(raw) => Repr::Owned(raw),
        })
    }

    /// The payload `range` of `text`, a buffer of payloads trusted as
    /// [`Data::trusted`] is; `None` if the range is not a `str` slice of it
    /// or does not fit the `u32` offsets kept.
    pub(crate) fn shared(text: &Arc<str>, range: Range<usize>) -> Option<Data<'static>> {
        text.get(range.clone())?;
        Some(Data(Repr::Shared {
            text: Arc::clone(text),
            start: u32::try_from(range.start).ok()?,
            end: u32::try_from(range.end).ok()?,
        }))
    }

    /// The payload's JSON text.
    pub fn get(&self) -> &str {
        self.raw().get()
    }

    fn raw(&self) -> &RawValue {
        match &self.0 {
            Repr::Borrowed(raw) => raw,
            Repr::Owned(raw) => raw,
            // In range and on char boundaries: checked by `shared`.
            Repr::Shared { text, start, end } => raw_value(&text[*start as usize..*end as usize]),
        }
    }

    /// Whether the text is borrowed from an input rather than owned.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Repr::Borrowed(_))
    }

    /// A borrowed view.
    pub fn borrowed(&self) -> Data<'_> {
        Data(Repr::Borrowed(self.raw()))
    }

    /// Copies the text if it is borrowed, so it outlives its input (text
    /// already owned or shared is kept as it is).
    pub fn into_owned(self) -> Data<'static> {
        Data(match self.0 {
            Repr::Borrowed(raw) => Repr::Owned(raw.to_owned()),
            Repr::Owned(raw) => Repr::Owned(raw),
            Repr::Shared { text, start, end } => Repr::Shared { text, start, end },
        })
    }
}

/// Views JSON text as a [`RawValue`] without re-parsing it.
pub(crate) fn raw_value(text: &str) -> &RawValue {
    // SAFETY: serde_json declares `#[repr(transparent)] pub struct RawValue
    // { json: str }` (src/raw.rs) and converts `&str` to `&RawValue` the same
    // way internally (`RawValue::from_borrowed` transmutes), so the two
    // unsized types have the same layout and pointer metadata (the length);
    // the cast keeps the address, length and lifetime. `RawValue` adds no
    // validity invariant beyond `str` (UTF-8, checked by the caller): text
    // that is not JSON is a logic error for its users, never undefined
    // behaviour. The test `raw_value_layout` below guards the assumption.
    unsafe { &*(text as *const str as *const RawValue) }
}

/// [`raw_value`] for owned text.
pub(crate) fn boxed_raw_value(text: Box<str>) -> Box<RawValue> {
    // SAFETY: as in `raw_value`: same layout and metadata, and the
    // allocation's layout (size and alignment of the `str`) is unchanged, so
    // the box frees it correctly (serde_json's `RawValue::from_owned`
    // transmutes `Box<str>` to `Box<RawValue>` likewise).
    unsafe { Box::from_raw(Box::into_raw(text) as *mut RawValue) }
}

fn check(raw: &RawValue) -> Result<(), DataError> {
    json::check_finite_numbers(raw.get()).map_err(|reason| DataError { reason })
}

impl Deref for Data<'_> {
    type Target = RawValue;
    fn deref(&self) -> &RawValue {
        self.raw()
    }
}

/// Equal when the texts are equal byte for byte.
impl PartialEq for Data<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Data<'_> {}

impl fmt::Debug for Data<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.raw(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_value_layout() {
        // The casts in `raw_value` rely on RawValue being a transparent str.
        assert_eq!(size_of::<&RawValue>(), size_of::<&str>());
        assert_eq!(align_of::<&RawValue>(), align_of::<&str>());
        let text = r#"{"a":[1,2]}"#;
        let raw = raw_value(text);
        assert_eq!(raw.get(), text);
        assert_eq!(raw.get().as_ptr(), text.as_ptr());
        let owned = boxed_raw_value(text.into());
        assert_eq!(owned.get(), text);
        assert_eq!(
            serde_json::from_str::<&RawValue>(text).unwrap().get(),
            raw.get()
        );
    }

    #[test]
    fn every_public_constructor_refuses_what_json_parse_reads_as_infinity() {
        let text = r#"{"a":[1,-1E400]}"#;
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        assert!(Data::new(raw).is_err());
        assert!(Data::from_raw(raw.to_owned()).is_err());
        let e = Data::from_json(text).unwrap_err();
        assert!(e.reason().contains("not finite"), "{e}");
        // The same digits inside a string are text, not a number.
        assert!(Data::from_json(r#"{"a":"-1E400"}"#).is_ok());
    }

    #[test]
    fn the_text_is_kept_verbatim_whether_borrowed_or_owned() {
        let text = "{ \"a\" : 1.50 }";
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let borrowed = Data::new(raw).unwrap();
        assert!(borrowed.is_borrowed());
        let owned = borrowed.clone().into_owned();
        assert!(!owned.is_borrowed());
        assert_eq!((borrowed.get(), owned.get()), (text, text));
        assert_eq!(borrowed, owned);
        assert_eq!(owned.borrowed().get(), text);
    }
}
