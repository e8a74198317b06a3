//! The harness's `SessionHeader` (JSON text at the boundary) to and from the
//! store's [`SessionHeader`].
//!
//! The harness header has no `type` key, carries `version` as any JS number
//! (the coordinator, not the store, refuses unsupported versions on load, so
//! a log written with version 99 or -1 must be storable and read back as it
//! was). `delegationDepth` is optional there ("absent (zero) for a top-level
//! session"); the store keeps a number, so it is always written back, as 0
//! when it was absent: the same header under the harness's reading, though
//! not the same keys.

use sessionlog::header::SessionHeader;
use sessionlog::json::{self, Fields};
use std::io::Write;

/// The keys a harness header may carry; any other key is refused rather than
/// silently dropped (the store has nowhere to keep it).
const KEYS: [&str; 9] = [
    "version",
    "id",
    "createdAt",
    "cwd",
    "parentSession",
    "seedLength",
    "origin",
    "delegationDepth",
    "agentPreset",
];

/// Parses a harness header. `version` is kept bit-for-bit as an `i64` in the
/// store's `u64` field (two's complement), so negative versions round-trip.
pub fn from_json(text: &str) -> Result<SessionHeader, String> {
    let f = Fields::parse(text).map_err(|e| format!("session header is not a JSON object: {e}"))?;
    if let Some(k) = f.duplicate_key() {
        return Err(format!("session header has a duplicate key {k:?}"));
    }
    if let Some((k, _)) = f.0.iter().find(|(k, _)| !KEYS.contains(&&*k.0)) {
        return Err(format!(
            "session header key {:?} cannot be stored (known keys: {})",
            k.0,
            KEYS.join(", ")
        ));
    }
    let string = |key: &str| -> Result<Option<String>, String> {
        f.get(key)
            .map(|v| {
                json::string(v).map(|s| s.into_owned()).ok_or_else(|| {
                    if v.get().starts_with('"') {
                        // Valid JSON (the object parsed) that does not decode
                        // to UTF-8: an escaped lone surrogate, as
                        // JSON.stringify writes one.
                        format!(
                            "session header {key:?} holds a lone UTF-16 surrogate, which the store cannot hold (its strings are UTF-8): {}",
                            v.get()
                        )
                    } else {
                        format!("session header {key:?} must be a string, got {}", v.get())
                    }
                })
            })
            .transpose()
    };
    let count = |key: &str| -> Result<Option<u64>, String> {
        f.get(key)
            .map(|v| {
                json::safe_u64(v).ok_or_else(|| {
                    format!(
                        "session header {key:?} must be a non-negative safe integer, got {}",
                        v.get()
                    )
                })
            })
            .transpose()
    };
    let version = match f.get("version") {
        None => return Err("session header lacks \"version\"".into()),
        Some(v) => json::safe_integer(v).ok_or_else(|| {
            format!(
                "session header version must be a safe integer, got {}",
                v.get()
            )
        })?,
    };
    Ok(SessionHeader {
        version: version as u64,
        id: string("id")?.ok_or("session header lacks \"id\"")?,
        created_at: count("createdAt")?.ok_or("session header lacks \"createdAt\"")?,
        cwd: string("cwd")?,
        parent_session: string("parentSession")?,
        seed_length: count("seedLength")?,
        origin: string("origin")?,
        delegation_depth: count("delegationDepth")?.unwrap_or(0),
        agent_preset: string("agentPreset")?,
    })
}

/// Writes the harness header for `h`: the inverse of [`from_json`], with
/// `delegationDepth` always present (see the module doc).
pub fn write_json(h: &SessionHeader, out: &mut Vec<u8>) {
    let _ = write!(out, "{{\"version\":{},\"id\":", h.version as i64);
    json::write_str(out, &h.id);
    let _ = write!(out, ",\"createdAt\":{}", h.created_at);
    let opt = |out: &mut Vec<u8>, key: &str, v: &Option<String>| {
        if let Some(v) = v {
            let _ = write!(out, ",\"{key}\":");
            json::write_str(out, v);
        }
    };
    opt(out, "cwd", &h.cwd);
    opt(out, "parentSession", &h.parent_session);
    if let Some(n) = h.seed_length {
        let _ = write!(out, ",\"seedLength\":{n}");
    }
    opt(out, "origin", &h.origin);
    let _ = write!(out, ",\"delegationDepth\":{}", h.delegation_depth);
    opt(out, "agentPreset", &h.agent_preset);
    out.push(b'}');
}

/// `units` as a JSON string literal, with every lone surrogate written as
/// its `\uXXXX` escape (as `JSON.stringify` does), for error messages.
pub fn escape_utf16(units: &[u16]) -> String {
    let mut out = String::from("\"");
    for c in char::decode_utf16(units.iter().copied()) {
        match c {
            Ok(c) => {
                let mut one = Vec::new();
                json::write_str(&mut one, c.encode_utf8(&mut [0; 4]));
                out.push_str(&String::from_utf8_lossy(&one[1..one.len() - 1]));
            }
            Err(e) => out.push_str(&format!("\\u{:04x}", e.unpaired_surrogate())),
        }
    }
    out.push('"');
    out
}
