//! Small JSON helpers shared by the session model: borrowed object fields and
//! the JS number rules the harness applies (`Number.isSafeInteger`).
//!
//! The model never re-serialises payloads; it only peeks at a few fields of a
//! `data` object, borrowing slices of the original bytes.

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// The largest integer a JavaScript number holds exactly (2^53 - 1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// An object key, borrowed when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The fields of one JSON object, in order, values as borrowed raw slices.
///
/// Only the top level is split; nested values stay unparsed. Duplicate keys
/// are kept (the caller decides whether they are an error).
#[derive(Debug, Default)]
pub struct Fields<'a>(pub Vec<(Key<'a>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some((k, v)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Fields<'a> {
    /// Splits `text` (which must be one JSON object) into its fields.
    pub fn parse(text: &'a str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The value of the first field named `key`.
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k.0 == key).map(|(_, v)| *v)
    }

    /// The first key that occurs twice, if any.
    pub fn duplicate_key(&self) -> Option<&str> {
        for (i, (k, _)) in self.0.iter().enumerate() {
            if self.0[..i].iter().any(|(p, _)| p.0 == k.0) {
                return Some(&k.0);
            }
        }
        None
    }
}

/// The fields of `raw` when it is an object, `None` otherwise.
pub fn object(raw: &RawValue) -> Option<Fields<'_>> {
    if !raw.get().starts_with('{') {
        return None;
    }
    Fields::parse(raw.get()).ok()
}

/// Reads `raw` as a JS safe integer (an integral number whose absolute value
/// is at most 2^53 - 1; `5.0` and `5e0` count, as `Number.isSafeInteger`
/// says). `None` for anything else.
pub fn safe_integer(raw: &RawValue) -> Option<i64> {
    let text = raw.get();
    let first = text.as_bytes().first()?;
    if !(first.is_ascii_digit() || *first == b'-') {
        return None;
    }
    let n: serde_json::Number = serde_json::from_str(text).ok()?;
    if let Some(i) = n.as_i64() {
        return (i.unsigned_abs() <= MAX_SAFE_INTEGER).then_some(i);
    }
    if n.as_u64().is_some() {
        return None; // above i64::MAX, so above 2^53
    }
    let f = n.as_f64()?;
    if f.is_finite() && f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64 {
        Some(f as i64)
    } else {
        None
    }
}

/// Reads `raw` as a non-negative JS safe integer.
pub fn safe_u64(raw: &RawValue) -> Option<u64> {
    safe_integer(raw).and_then(|i| u64::try_from(i).ok())
}

/// Reads `raw` as a JSON string (unescaped).
pub fn string(raw: &RawValue) -> Option<Cow<'_, str>> {
    if !raw.get().starts_with('"') {
        return None;
    }
    serde_json::from_str::<Key<'_>>(raw.get()).ok().map(|k| k.0)
}

/// Whether `raw` is the JSON literal `true`.
pub fn is_true(raw: &RawValue) -> bool {
    raw.get() == "true"
}

/// Whether `raw` is a JSON array.
pub fn is_array(raw: &RawValue) -> bool {
    raw.get().starts_with('[')
}

/// The elements of `raw` when it is an array.
pub fn array(raw: &RawValue) -> Option<Vec<&RawValue>> {
    if !is_array(raw) {
        return None;
    }
    serde_json::from_str(raw.get()).ok()
}

/// Whether `raw` is the empty array `[]` (with any inner whitespace).
pub fn is_empty_array(raw: &RawValue) -> bool {
    let t = raw.get();
    t.starts_with('[') && t[1..].trim_start().starts_with(']')
}

/// Checks that every number literal in the JSON text `text` is finite as an
/// IEEE double. `serde_json` accepts `1e999` inside an unparsed raw value; the
/// harness would read it as `Infinity`, which is not plain JSON.
///
/// Only literals with an exponent or many digits can overflow, so the scan
/// parses just those; strings are skipped with their escapes.
pub fn check_finite_numbers(text: &str) -> Result<(), String> {
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // Outside strings: look at the structural bytes up to the next quote
        // (few: JSON text is mostly strings), checking number literals.
        let end = memchr::memchr(b'"', &b[i..]).map_or(b.len(), |q| i + q);
        let mut j = i;
        while j < end {
            if matches!(b[j], b'-' | b'0'..=b'9') {
                let start = j;
                let mut risky = false;
                while j < end && matches!(b[j], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    risky |= matches!(b[j], b'e' | b'E');
                    j += 1;
                }
                let lit = &text[start..j];
                if (risky || lit.len() > 300) && !lit.parse::<f64>().is_ok_and(f64::is_finite) {
                    return Err(format!("number {lit} is not finite"));
                }
            } else {
                j += 1;
            }
        }
        if end >= b.len() {
            break;
        }
        // Inside a string: jump from escape to escape to the closing quote.
        i = end + 1;
        loop {
            match memchr::memchr2(b'"', b'\\', b.get(i..).unwrap_or_default()) {
                None => return Ok(()),
                Some(k) if b[i + k] == b'\\' => i += k + 2,
                Some(k) => {
                    i += k + 1;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Writes `s` as a JSON string literal.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

/// Two JSON texts are equal as values (numbers by value: `5 == 5.0`).
pub fn values_equal(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => value_eq(&x, &y),
        _ => false,
    }
}

/// JSON value equality with numbers compared by value.
pub fn value_eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => {
            if let (Some(p), Some(q)) = (x.as_i64(), y.as_i64()) {
                p == q
            } else if let (Some(p), Some(q)) = (x.as_u64(), y.as_u64()) {
                p == q
            } else {
                x.as_f64() == y.as_f64()
            }
        }
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| value_eq(p, q)),
        (Object(x), Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| value_eq(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> &RawValue {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn safe_integers_follow_js() {
        assert_eq!(safe_integer(raw("5")), Some(5));
        assert_eq!(safe_integer(raw("5.0")), Some(5));
        assert_eq!(safe_integer(raw("5e0")), Some(5));
        assert_eq!(safe_integer(raw("-3")), Some(-3));
        assert_eq!(
            safe_integer(raw("9007199254740991")),
            Some(9007199254740991)
        );
        assert_eq!(safe_integer(raw("9007199254740992")), None);
        assert_eq!(safe_integer(raw("5.5")), None);
        assert_eq!(safe_integer(raw("\"5\"")), None);
        assert_eq!(safe_integer(raw("18446744073709551616")), None);
        assert_eq!(safe_u64(raw("-1")), None);
    }

    #[test]
    fn fields_keep_order_and_escapes() {
        let f = Fields::parse(r#"{"a":1,"b\u0041":[2],"a":3}"#).unwrap();
        assert_eq!(f.0.len(), 3);
        assert_eq!(f.0[1].0.0, "bA");
        assert_eq!(f.get("a").unwrap().get(), "1");
        assert_eq!(f.duplicate_key(), Some("a"));
        assert!(is_empty_array(raw("[ ]")));
        assert!(!is_empty_array(raw("[1]")));
        assert!(values_equal("{\"a\":5}", "{ \"a\" : 5.0 }"));
        assert!(check_finite_numbers(r#"{"a":[1e308,-2.5E3,"1e999 \"x"]}"#).is_ok());
        assert!(check_finite_numbers(r#"{"a":[1e309]}"#).is_err());
        assert!(check_finite_numbers(r#"[-1e999]"#).is_err());
        assert!(check_finite_numbers(r#"{"a\\":"\\\"1e999","b":[1,2e3],"c":-1E400}"#).is_err());
        assert!(check_finite_numbers(r#"{"a\\":"\\\"1e999","b":[1,2e3]}"#).is_ok());
        assert!(check_finite_numbers("\"trailing escape \\").is_ok());
        assert!(check_finite_numbers(&format!("[{}]", "9".repeat(400))).is_err());
    }
}
