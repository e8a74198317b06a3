//! The session header: the record kept outside the event log (section 5).

use crate::json::{self, Fields};
use crate::violation::{Location, Rule, Violation};

/// The session format version this build reads and writes.
pub const SESSION_FORMAT_VERSION: u64 = 0;

/// A session header: `{type:"session", version, id, createdAt, cwd?,
/// parentSession?, seedLength?, origin?, delegationDepth?, agentPreset?}`.
///
/// A missing `version` or `delegationDepth` reads as 0 and is written back
/// explicitly.
///
/// ```
/// use sessionlog::header::SessionHeader;
/// let h = SessionHeader::from_json(r#"{"type":"session","id":"s1","createdAt":5}"#).unwrap().header;
/// assert_eq!(h.id, "s1");
/// assert_eq!(h.to_json(), r#"{"type":"session","version":0,"id":"s1","createdAt":5,"delegationDepth":0}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionHeader {
    /// The session format version (always [`SESSION_FORMAT_VERSION`]).
    pub version: u64,
    /// The session id (any non-empty string).
    pub id: String,
    /// Creation time, Unix epoch milliseconds.
    pub created_at: u64,
    /// The working directory the session ran in.
    pub cwd: Option<String>,
    /// The session this one was forked from.
    pub parent_session: Option<String>,
    /// How many events were inherited through a fork.
    pub seed_length: Option<u64>,
    /// Why the session exists; only `"subagent"` is defined.
    pub origin: Option<String>,
    /// How deep in a subagent delegation chain the session is.
    pub delegation_depth: u64,
    /// The agent preset selected for the session.
    pub agent_preset: Option<String>,
}

/// A header as read from JSON, with what the input left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedHeader {
    /// The header, normalised.
    pub header: SessionHeader,
    /// Whether the input had `version` (strict mode requires it).
    pub had_version: bool,
    /// Whether the input had `delegationDepth` (strict mode requires it).
    pub had_delegation_depth: bool,
}

const HEADER_KEYS: [&str; 10] = [
    "type",
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

impl SessionHeader {
    /// A header for a new top-level session.
    pub fn new(id: impl Into<String>, created_at: u64) -> Self {
        SessionHeader {
            version: SESSION_FORMAT_VERSION,
            id: id.into(),
            created_at,
            cwd: None,
            parent_session: None,
            seed_length: None,
            origin: None,
            delegation_depth: 0,
            agent_preset: None,
        }
    }

    /// Parses and checks a header line: `type:"session"`, `version` absent or
    /// 0, `id` a string, `createdAt` a non-negative safe integer, optional
    /// fields typed, `origin` only `"subagent"`, no other keys.
    pub fn from_json(text: &str) -> Result<ParsedHeader, Violation> {
        Self::parse(text, false)
    }

    /// Parses a header the store wrote ([`SessionHeader::write_json`]): the
    /// checks of [`SessionHeader::from_json`], except that `version` may be
    /// any `u64`. The store keeps what it was given (a harness coordinator
    /// stores logs of other format versions and refuses them itself on
    /// load), so what it reads back must be exactly that.
    pub fn from_stored_json(text: &str) -> Result<SessionHeader, Violation> {
        Self::parse(text, true).map(|p| p.header)
    }

    fn parse(text: &str, any_version: bool) -> Result<ParsedHeader, Violation> {
        let bad = |reason: String| Violation::new(Location::Line(1), Rule::Header, reason);
        let f = Fields::parse(text).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        if let Some(k) = f.duplicate_key() {
            return Err(bad(format!("duplicate key {k:?}")));
        }
        if let Some((k, _)) = f.0.iter().find(|(k, _)| !HEADER_KEYS.contains(&&*k.0)) {
            return Err(bad(format!("unknown header key {:?}", k.0)));
        }
        if f.get("type").and_then(json::string).as_deref() != Some("session") {
            return Err(bad("header \"type\" must be \"session\"".into()));
        }
        let version = match f.get("version") {
            None => None,
            Some(v) if any_version => Some(v.get().parse::<u64>().map_err(|_| {
                bad(format!(
                    "\"version\" must be an unsigned integer, got {}",
                    v.get()
                ))
            })?),
            Some(v) => match json::safe_u64(v) {
                Some(SESSION_FORMAT_VERSION) => Some(SESSION_FORMAT_VERSION),
                _ => {
                    return Err(bad(format!(
                        "unsupported session format version {}; this build reads version {SESSION_FORMAT_VERSION}",
                        v.get()
                    )));
                }
            },
        };
        let string = |key: &str| -> Result<Option<String>, Violation> {
            f.get(key)
                .map(|v| {
                    json::string(v)
                        .map(|s| s.into_owned())
                        .ok_or_else(|| bad(format!("{key:?} must be a string, got {}", v.get())))
                })
                .transpose()
        };
        let count = |key: &str| -> Result<Option<u64>, Violation> {
            f.get(key)
                .map(|v| {
                    json::safe_u64(v).ok_or_else(|| {
                        bad(format!(
                            "{key:?} must be a non-negative safe integer, got {}",
                            v.get()
                        ))
                    })
                })
                .transpose()
        };
        let id = string("id")?.ok_or_else(|| bad("missing \"id\"".into()))?;
        let created_at = count("createdAt")?.ok_or_else(|| bad("missing \"createdAt\"".into()))?;
        let origin = string("origin")?;
        if let Some(o) = origin.as_deref().filter(|o| *o != "subagent") {
            return Err(bad(format!("origin must be \"subagent\", got {o:?}")));
        }
        let delegation_depth = count("delegationDepth")?;
        Ok(ParsedHeader {
            header: SessionHeader {
                version: version.unwrap_or(SESSION_FORMAT_VERSION),
                id,
                created_at,
                cwd: string("cwd")?,
                parent_session: string("parentSession")?,
                seed_length: count("seedLength")?,
                origin,
                delegation_depth: delegation_depth.unwrap_or(0),
                agent_preset: string("agentPreset")?,
            },
            had_version: version.is_some(),
            had_delegation_depth: delegation_depth.is_some(),
        })
    }

    /// Writes the header line in the harness's key order, with `version` and
    /// `delegationDepth` always present.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = write!(
            out,
            "{{\"type\":\"session\",\"version\":{},\"id\":",
            self.version
        );
        json::write_str(out, &self.id);
        let _ = write!(out, ",\"createdAt\":{}", self.created_at);
        let opt_str = |out: &mut Vec<u8>, key: &str, v: &Option<String>| {
            if let Some(v) = v {
                let _ = write!(out, ",\"{key}\":");
                json::write_str(out, v);
            }
        };
        opt_str(out, "cwd", &self.cwd);
        opt_str(out, "parentSession", &self.parent_session);
        if let Some(n) = self.seed_length {
            let _ = write!(out, ",\"seedLength\":{n}");
        }
        opt_str(out, "origin", &self.origin);
        let _ = write!(out, ",\"delegationDepth\":{}", self.delegation_depth);
        opt_str(out, "agentPreset", &self.agent_preset);
        out.push(b'}');
    }

    /// The header line as a string (see [`SessionHeader::write_json`]).
    pub fn to_json(&self) -> String {
        let mut out = Vec::with_capacity(128);
        self.write_json(&mut out);
        String::from_utf8(out).expect("JSON output is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_headers() {
        let rule = |t: &str| SessionHeader::from_json(t).unwrap_err().rule;
        assert_eq!(
            rule(r#"{"type":"session","version":1,"id":"a","createdAt":0}"#),
            Rule::Header
        );
        assert_eq!(
            rule(r#"{"type":"sess","id":"a","createdAt":0}"#),
            Rule::Header
        );
        assert_eq!(
            rule(r#"{"type":"session","id":5,"createdAt":0}"#),
            Rule::Header
        );
        assert_eq!(
            rule(r#"{"type":"session","id":"a","createdAt":-1}"#),
            Rule::Header
        );
        assert_eq!(rule(r#"{"type":"session","id":"a"}"#), Rule::Header);
        assert_eq!(
            rule(r#"{"type":"session","id":"a","createdAt":0,"origin":"user"}"#),
            Rule::Header
        );
        assert_eq!(
            rule(r#"{"type":"session","id":"a","createdAt":0,"x":0}"#),
            Rule::Header
        );
    }

    #[test]
    fn round_trips_all_fields() {
        let line = r#"{"type":"session","version":0,"id":"a","createdAt":3,"cwd":"/w","parentSession":"p","seedLength":4,"origin":"subagent","delegationDepth":1,"agentPreset":"minimal"}"#;
        let p = SessionHeader::from_json(line).unwrap();
        assert!(p.had_version && p.had_delegation_depth);
        assert_eq!(p.header.to_json(), line);
    }
}
