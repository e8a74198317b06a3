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
use std::ops::Deref;

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
/// dereferences to the [`RawValue`], so `data.get()` is the text.
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
pub struct Data<'a>(Cow<'a, RawValue>);

impl<'a> Data<'a> {
    /// Borrows `raw` once its numbers are checked.
    pub fn new(raw: &'a RawValue) -> Result<Data<'a>, DataError> {
        check(raw)?;
        Ok(Data(Cow::Borrowed(raw)))
    }

    /// Takes `raw` once its numbers are checked.
    pub fn from_raw(raw: Box<RawValue>) -> Result<Data<'static>, DataError> {
        check(&raw)?;
        Ok(Data(Cow::Owned(raw)))
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
        Data(raw)
    }

    /// The payload's JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Whether the text is borrowed from an input rather than owned.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Cow::Borrowed(_))
    }

    /// A borrowed view.
    pub fn borrowed(&self) -> Data<'_> {
        Data(Cow::Borrowed(&self.0))
    }

    /// Copies the text if it is borrowed, so it outlives its input.
    pub fn into_owned(self) -> Data<'static> {
        Data(Cow::Owned(self.0.into_owned()))
    }
}

fn check(raw: &RawValue) -> Result<(), DataError> {
    json::check_finite_numbers(raw.get()).map_err(|reason| DataError { reason })
}

impl Deref for Data<'_> {
    type Target = RawValue;
    fn deref(&self) -> &RawValue {
        &self.0
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
        fmt::Debug::fmt(&*self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
