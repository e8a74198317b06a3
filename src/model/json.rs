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
/// parses just those. Strings are told from the rest 64 bytes at a time
/// (quote, backslash and digit masks, the escaped quotes removed, a prefix
/// XOR of the quotes giving the bytes inside strings), so the bytes of
/// strings, most of any event's text, are never looked at one by one.
///
/// ```
/// use sessionlog::json::check_finite_numbers;
/// assert!(check_finite_numbers(r#"{"a":[1e308,"1e999"]}"#).is_ok());
/// assert!(check_finite_numbers(r#"{"a":[-1E400]}"#).is_err());
/// ```
pub fn check_finite_numbers(text: &str) -> Result<(), String> {
    let b = text.as_bytes();
    let mut scan = StringMask::default();
    // Number bytes before `resume` belong to a literal already checked.
    let mut resume = 0;
    let mut block = [b' '; 64];
    for base in (0..b.len()).step_by(64) {
        let bytes: &[u8; 64] = match b.get(base..base + 64) {
            Some(full) => full.try_into().expect("64 bytes"),
            None => {
                // The tail, padded with spaces (neither quote, backslash nor
                // digit).
                let tail = &b[base..];
                block[..tail.len()].copy_from_slice(tail);
                block[tail.len()..].fill(b' ');
                &block
            }
        };
        let masks = classify(bytes);
        let mut starts = masks.number & !scan.inside(masks.quote, masks.backslash);
        while starts != 0 {
            let at = base + starts.trailing_zeros() as usize;
            starts &= starts - 1;
            if at < resume {
                continue;
            }
            resume = check_literal(text, at)?;
        }
    }
    Ok(())
}

/// Checks the number literal starting at `start` (a `-` or digit outside
/// any string) and returns the index just past it.
fn check_literal(text: &str, start: usize) -> Result<usize, String> {
    let b = text.as_bytes();
    let mut j = start;
    let mut risky = false;
    while let Some(&d) = b.get(j)
        && matches!(d, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
    {
        risky |= matches!(d, b'e' | b'E');
        j += 1;
    }
    // The literal is ASCII, so both ends are character boundaries.
    let lit = &text[start..j];
    if (risky || lit.len() > 300) && !lit.parse::<f64>().is_ok_and(f64::is_finite) {
        return Err(format!("number {lit} is not finite"));
    }
    Ok(j)
}

/// One bit per byte of a 64-byte block (bit `i` is byte `i`).
struct Masks {
    quote: u64,
    backslash: u64,
    /// `-` and the digits: where a number literal can start.
    number: u64,
}

/// The state carried from one block to the next while telling which bytes
/// lie inside strings.
#[derive(Default)]
struct StringMask {
    /// Whether the next block's first byte is escaped (the block before
    /// ended in an unescaped backslash).
    escaped_carry: bool,
    /// All ones when the next block starts inside a string.
    inside_carry: u64,
}

impl StringMask {
    /// The bytes of this block inside strings (an opening quote counts as
    /// inside, the closing one as outside: neither is a number byte).
    fn inside(&mut self, quote: u64, backslash: u64) -> u64 {
        let escaped = self.escaped(backslash);
        let quote = quote & !escaped;
        let inside = prefix_xor(quote) ^ self.inside_carry;
        self.inside_carry = ((inside as i64) >> 63) as u64;
        inside
    }

    /// The bytes escaped by a backslash. Backslashes are few in event text
    /// (mostly `\n`), so they are walked one by one: a backslash that is
    /// not itself escaped escapes the byte after it.
    fn escaped(&mut self, backslash: u64) -> u64 {
        let mut escaped = u64::from(self.escaped_carry);
        self.escaped_carry = false;
        let mut rest = backslash;
        while rest != 0 {
            let i = rest.trailing_zeros();
            rest &= rest - 1;
            if escaped >> i & 1 == 1 {
                continue;
            }
            if i == 63 {
                self.escaped_carry = true;
            } else {
                escaped |= 1 << (i + 1);
            }
        }
        escaped
    }
}

/// Bit `i` set when an odd number of bits at or below `i` are set in `x`:
/// with the unescaped quotes as `x`, the bytes from each opening quote up to
/// (not including) its closing one.
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// The quote, backslash and number-start masks of a block, 16 bytes per
/// SSE2 comparison (SSE2 is part of every x86-64 CPU).
#[cfg(target_arch = "x86_64")]
fn classify(block: &[u8; 64]) -> Masks {
    use std::arch::x86_64::{
        __m128i, _mm_and_si128, _mm_cmpeq_epi8, _mm_cmpgt_epi8, _mm_cmplt_epi8, _mm_loadu_si128,
        _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let (mut quote, mut backslash, mut number) = (0u64, 0u64, 0u64);
    for k in 0..4 {
        // SAFETY: SSE2 is part of the x86-64 baseline, so these intrinsics
        // run on every CPU this code is built for; `block` holds 64 bytes,
        // so bytes 16k..16k+16 are in bounds, and `loadu` needs no
        // alignment.
        let (q, s, n) = unsafe {
            let v = _mm_loadu_si128(block.as_ptr().add(16 * k).cast::<__m128i>());
            let q = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let s = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            // Signed comparisons: bytes from 0x80 up are negative, so they
            // fall outside '0'..='9' as they should.
            let digit = _mm_and_si128(
                _mm_cmpgt_epi8(v, _mm_set1_epi8(b'0' as i8 - 1)),
                _mm_cmplt_epi8(v, _mm_set1_epi8(b'9' as i8 + 1)),
            );
            let n = _mm_or_si128(digit, _mm_cmpeq_epi8(v, _mm_set1_epi8(b'-' as i8)));
            (
                _mm_movemask_epi8(q) as u16,
                _mm_movemask_epi8(s) as u16,
                _mm_movemask_epi8(n) as u16,
            )
        };
        let shift = 16 * k;
        quote |= u64::from(q) << shift;
        backslash |= u64::from(s) << shift;
        number |= u64::from(n) << shift;
    }
    Masks {
        quote,
        backslash,
        number,
    }
}

/// The quote, backslash and number-start masks of a block, a byte at a time.
#[cfg(not(target_arch = "x86_64"))]
fn classify(block: &[u8; 64]) -> Masks {
    let (mut quote, mut backslash, mut number) = (0u64, 0u64, 0u64);
    for (i, &c) in block.iter().enumerate() {
        quote |= u64::from(c == b'"') << i;
        backslash |= u64::from(c == b'\\') << i;
        number |= u64::from(c == b'-' || c.is_ascii_digit()) << i;
    }
    Masks {
        quote,
        backslash,
        number,
    }
}

/// The index of the quote that closes the string whose text starts at
/// `start` (just past the opening quote). Short strings (most keys and
/// values) are scanned byte by byte, where a `memchr` call costs more than
/// it saves; longer ones by `memchr` for quotes alone, counting the
/// backslashes before each (much faster than stopping at every escape: text
/// with many `\n` has few escaped quotes).
fn closing_quote(b: &[u8], start: usize) -> Option<usize> {
    const SHORT: usize = 24;
    let mut j = start;
    let short_end = b.len().min(start + SHORT);
    while j < short_end {
        match b[j] {
            b'"' => return Some(j),
            b'\\' => j += 2,
            _ => j += 1,
        }
    }
    // `j` is not inside an escape here: the loop stepped over each whole.
    let from = j;
    loop {
        let q = j + memchr::memchr(b'"', b.get(j..)?)?;
        let backslashes = b[from..q].iter().rev().take_while(|c| **c == b'\\').count();
        if backslashes % 2 == 0 {
            return Some(q);
        }
        j = q + 1;
    }
}

/// A JSON value inside text already known to be valid JSON (the text of a
/// [`RawValue`], or a part of one that [`Valid`] handed out), read without a
/// validating parse.
///
/// `serde_json` validates every byte of a value it is asked to skip, at
/// every nesting level `object` / `array` are applied to. The repair
/// rules look a few levels deep into every assistant message and tool result
/// of a log; this walk only finds the structure (a level is still walked
/// again when a lookup descends into it), skipping long strings with
/// `memchr`. It never panics: on text that is not valid after all, lookups
/// return `None` or stop early.
///
/// ```
/// use sessionlog::json::Valid;
/// use serde_json::value::RawValue;
/// let raw = RawValue::from_string(r#"{"message":{"content":[{"type":"tool-call","id":"c\u0031"}]}}"#.into()).unwrap();
/// let blocks = Valid::of(&raw).get("message").and_then(|m| m.get("content")).unwrap();
/// let ids: Vec<_> = blocks.elements().filter_map(|b| b.get("id")?.as_str()).collect();
/// assert_eq!(ids, ["c1"]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Valid<'a>(&'a str);

impl<'a> Valid<'a> {
    /// The value `raw` holds.
    pub fn of(raw: &'a RawValue) -> Valid<'a> {
        Valid(raw.get().trim_matches(is_ws_char))
    }

    /// The JSON text of this value.
    pub fn text(self) -> &'a str {
        self.0
    }

    /// The value of the first member named `key` (compared unescaped), when
    /// this is an object: what `object(raw)?.get(key)` gives.
    pub fn get(self, key: &str) -> Option<Valid<'a>> {
        let b = self.0.as_bytes();
        if b.first() != Some(&b'{') {
            return None;
        }
        let mut i = skip_ws(b, 1);
        while b.get(i) == Some(&b'"') {
            let key_end = skip_string(b, i);
            let raw_key = self.0.get(i + 1..key_end.checked_sub(1)?)?;
            let matches = if raw_key.contains('\\') {
                serde_json::from_str::<String>(self.0.get(i..key_end)?).is_ok_and(|k| k == key)
            } else {
                raw_key == key
            };
            i = skip_ws(b, key_end);
            if b.get(i) != Some(&b':') {
                return None;
            }
            let start = skip_ws(b, i + 1);
            let end = skip_value(b, start);
            if matches {
                return self.0.get(start..end).map(Valid);
            }
            i = skip_ws(b, end);
            if b.get(i) != Some(&b',') {
                return None;
            }
            i = skip_ws(b, i + 1);
        }
        None
    }

    /// The elements, in order, when this is an array (none otherwise).
    pub fn elements(self) -> impl Iterator<Item = Valid<'a>> + 'a {
        let text = self.0;
        let b = text.as_bytes();
        let mut i = if b.first() == Some(&b'[') {
            skip_ws(b, 1)
        } else {
            b.len()
        };
        std::iter::from_fn(move || {
            if matches!(b.get(i), None | Some(b']')) {
                return None;
            }
            let start = i;
            let end = skip_value(b, start);
            let item = text.get(start..end).map(Valid);
            i = skip_ws(b, end);
            i = if b.get(i) == Some(&b',') {
                skip_ws(b, i + 1)
            } else {
                b.len()
            };
            item
        })
    }

    /// The string, unescaped, when this is a string: what [`string`] gives.
    pub fn as_str(self) -> Option<Cow<'a, str>> {
        let t = self.0;
        if !(t.len() >= 2 && t.starts_with('"') && t.ends_with('"')) {
            return None;
        }
        let inner = &t[1..t.len() - 1];
        if inner.contains('\\') {
            serde_json::from_str::<String>(t).ok().map(Cow::Owned)
        } else {
            Some(Cow::Borrowed(inner))
        }
    }
}

fn is_ws_char(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// From the opening quote at `i` to just past the closing one.
fn skip_string(b: &[u8], i: usize) -> usize {
    closing_quote(b, i + 1).map_or(b.len(), |q| q + 1)
}

/// From the first byte of a value at `i` to just past its end.
fn skip_value(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&c) = b.get(j) {
                match c {
                    b'"' => {
                        j = skip_string(b, j);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            b.len()
        }
        _ => {
            let mut j = i;
            while !matches!(
                b.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                j += 1;
            }
            j
        }
    }
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

    use proptest::prelude::*;

    /// JSON text with the things a lookup can get wrong: whitespace
    /// everywhere, escaped keys (`t\u0079pe` is `type`), duplicate keys,
    /// escaped quotes and brackets inside strings.
    fn arb_text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", " ", "\n  ", "\t"]);
        let leaf = prop_oneof![
            prop::sample::select(vec![
                "null",
                "true",
                "false",
                "0",
                "-1.5e3",
                "12",
                "1e999",
                "-2E+400",
                "1e-999",
                r#""1e999""#,
                r#""\\\"1e999 \\""#,
                r#""""#,
                r#""a\"b""#,
                r#""]}\\""#,
                r#""\u0041é""#,
                r#""tool-call""#,
                r#""{[,""#,
            ])
            .prop_map(str::to_owned),
            "[a-z ]{0,6}".prop_map(|t| format!("{t:?}")),
            // Past the byte-by-byte prefix of `closing_quote`, with escapes.
            "[a-z\"\\\\ ]{16,70}".prop_map(|t| format!("{t:?}")),
        ];
        leaf.prop_recursive(4, 32, 4, move |inner| {
            let key = prop::sample::select(vec![
                r#""type""#,
                r#""t\u0079pe""#,
                r#""id""#,
                r#""content""#,
                r#""message""#,
                r#""a\\""#,
                r#""""#,
            ]);
            prop_oneof![
                (
                    prop::collection::vec((inner.clone(), ws.clone()), 0..4),
                    ws.clone()
                )
                    .prop_map(|(items, w)| {
                        let body: Vec<String> =
                            items.iter().map(|(v, s)| format!("{s}{v}{s}")).collect();
                        format!("[{w}{}]", body.join(","))
                    }),
                (
                    prop::collection::vec((key, inner, ws.clone()), 0..4),
                    ws.clone()
                )
                    .prop_map(|(members, w)| {
                        let body: Vec<String> = members
                            .iter()
                            .map(|(k, v, s)| format!("{s}{k}{s}:{s}{v}{s}"))
                            .collect();
                        format!("{{{w}{}}}", body.join(","))
                    }),
            ]
        })
    }

    /// `Valid` agrees with the validating helpers on `v` and all it holds.
    fn agree(v: Valid<'_>) {
        let owned = RawValue::from_string(v.text().to_owned()).expect("valid JSON");
        assert_eq!(v.as_str(), string(&owned));
        match object(&owned) {
            Some(f) => {
                for key in
                    f.0.iter()
                        .map(|(k, _)| k.0.as_ref())
                        .chain(["type", "absent"])
                {
                    assert_eq!(
                        v.get(key).map(Valid::text),
                        f.get(key).map(RawValue::get),
                        "{key}"
                    );
                }
                f.0.iter().for_each(|(_, x)| agree(Valid(x.get())));
            }
            None => assert_eq!(v.get("type"), None),
        }
        match array(&owned) {
            Some(items) => {
                let mine: Vec<&str> = v.elements().map(Valid::text).collect();
                let theirs: Vec<&str> = items.iter().map(|x| x.get()).collect();
                assert_eq!(mine, theirs);
                items.iter().for_each(|x| agree(Valid(x.get())));
            }
            None => assert_eq!(v.elements().count(), 0),
        }
    }

    proptest! {
        #[test]
        fn valid_lookups_agree_with_the_parser(text in arb_text(), pad in "[ \n]{0,2}") {
            let raw = RawValue::from_string(format!("{pad}{text}{pad}")).expect("the generator writes valid JSON");
            agree(Valid::of(&raw));
            // serde_json refuses an infinite number when it parses values.
            prop_assert_eq!(
                check_finite_numbers(raw.get()).is_ok(),
                serde_json::from_str::<serde_json::Value>(raw.get()).is_ok()
            );
        }
    }

    /// The byte-at-a-time scan `check_finite_numbers` replaced: the oracle
    /// for the block scan.
    fn finite_reference(text: &str) -> Result<(), String> {
        let b = text.as_bytes();
        let mut j = 0;
        while let Some(&c) = b.get(j) {
            match c {
                b'"' => {
                    let mut k = j + 1;
                    loop {
                        match b.get(k) {
                            None => return Ok(()),
                            Some(b'"') => break,
                            Some(b'\\') => k += 2,
                            Some(_) => k += 1,
                        }
                    }
                    j = k + 1;
                }
                b'-' | b'0'..=b'9' => j = check_literal(text, j)?,
                _ => j += 1,
            }
        }
        Ok(())
    }

    proptest! {
        // Strings with escaped quotes and backslash runs, numbers between
        // them, shifted across the 64-byte blocks by a prefix: the block scan
        // agrees with the byte-at-a-time one wherever backslashes are inside
        // strings, as in all JSON text.
        #[test]
        fn block_scan_agrees_with_the_byte_scan(
            pad in 0usize..70,
            parts in prop::collection::vec(prop_oneof![
                prop::collection::vec(
                    prop::sample::select(vec!["\\\\", "\\\"", "\\n", "a", " ", "1e999"]),
                    0..40,
                ).prop_map(|p| format!("\"{}\"", p.concat())),
                prop::sample::select(vec!["1e999", "-1", "2E-400", "1e308", "[", ",", "é"]).prop_map(str::to_owned),
                "[0-9]{290,320}".prop_map(|t| t.to_string()),
            ], 0..30),
        ) {
            let text = format!("{}{}", " ".repeat(pad), parts.concat());
            prop_assert_eq!(check_finite_numbers(&text), finite_reference(&text), "{:?}", text);
        }
    }

    #[test]
    fn escapes_carried_across_a_block_boundary() {
        // The string's backslash run ends exactly at byte 63 (escaping the
        // quote at byte 64) or one byte later.
        for run in 1..=4 {
            for lead in 55..66 {
                let body = format!("{}{}", "a".repeat(lead), "\\".repeat(run));
                let text = format!("[\"{body}\",1e999]");
                let text_closed = format!("[\"{body}\"1e999\"]");
                for t in [&text, &text_closed] {
                    assert_eq!(check_finite_numbers(t), finite_reference(t), "{t:?}");
                }
            }
        }
        assert!(check_finite_numbers(&format!("[\"{}\\\\\",1e999]", "a".repeat(60))).is_err());
    }

    proptest! {
        // Decoded log data reaches `Valid` unvalidated when a record is
        // checksum-valid but crafted: nothing may panic on any text.
        #[test]
        fn lookups_never_panic_on_any_text(text in r#"[{}\[\]",:\\ a-z0-9eé\-]{0,40}"#) {
            let v = Valid(&text);
            let _ = v.get("a").map(|x| x.elements().count());
            let _ = v.elements().filter_map(Valid::as_str).count();
            let _ = check_finite_numbers(&text);
        }
    }

    #[test]
    fn valid_lookups_never_panic_on_truncated_text() {
        let text = r#"{"message":{"content":[{"type":"tool-call","id":"a\"b"},"]}"]},"x":1}"#;
        for end in 0..text.len() {
            let v = Valid(&text[..end]);
            let _ = v
                .get("message")
                .and_then(|m| m.get("content"))
                .map(|c| c.elements().count());
            let _ = v.get("x").and_then(Valid::as_str);
        }
        let v = Valid(text);
        let ids: Vec<_> = v
            .get("message")
            .and_then(|m| m.get("content"))
            .unwrap()
            .elements()
            .filter_map(|b| b.get("id")?.as_str())
            .collect();
        assert_eq!(ids, ["a\"b"]);
    }

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
