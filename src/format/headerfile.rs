//! The bytes of a session's `HEADER` file (format-spec section 6): the
//! session uid and the harness's header line, checksummed, and (version 2)
//! the session's checkpoint after them. The JSON is the engine's to parse;
//! this module knows its bytes only.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `SLOGHEAD` |
//! | 8 | 4 | version, u32: 1, or 2 when a checkpoint follows the JSON |
//! | 12 | 16 | session uid |
//! | 28 | 4 | `n`: length of the header JSON, u32 |
//! | 32 | 4 | CRC-32 of bytes 0..32 and the JSON |
//! | 36 | `n` | the harness's header line (JSON, no newline) |
//! | 36 + `n` | rest | version 2 only: a checkpoint (section 5), to the end of the file |

use super::bytes::le_u32;

/// The name of the file.
pub const HEADER_FILE: &str = "HEADER";
/// `HEADER` magic.
pub const HEADER_MAGIC: [u8; 8] = *b"SLOGHEAD";
/// `HEADER` format version 1: the header alone.
pub const HEADER_VERSION: u32 = 1;
/// `HEADER` format version 2: the same, followed by the session's
/// checkpoint (store version 5).
pub const HEADER_VERSION_EMBEDDED: u32 = 2;
/// A checkpoint is embedded only when the whole `HEADER` then fits in this
/// many bytes (one block of the usual file systems): a small session keeps
/// one metadata block instead of two.
pub const HEADER_BLOCK: usize = 4096;
/// Fixed part: magic, version, uid, length, CRC.
pub const HEADER_FIXED: usize = 8 + 4 + 16 + 4 + 4;
/// The largest header JSON accepted (a header is a few hundred bytes).
pub const MAX_HEADER_JSON: usize = 1 << 20;

/// A decoded `HEADER`, borrowing the file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFile<'a> {
    /// The session uid.
    pub uid: [u8; 16],
    /// The header JSON (checked UTF-8 and covered by the checksum; not
    /// parsed).
    pub json: &'a str,
    /// Version 2: the embedded checkpoint's bytes (not covered by the
    /// header's checksum: the checkpoint has its own, and damage to a cache
    /// must not make the session unaccounted).
    pub checkpoint: Option<&'a [u8]>,
}

/// Encodes a version-1 `HEADER`.
pub fn encode(json: &str, uid: &[u8; 16]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_FIXED + json.len());
    b.extend_from_slice(&HEADER_MAGIC);
    b.extend_from_slice(&HEADER_VERSION.to_le_bytes());
    b.extend_from_slice(uid);
    b.extend_from_slice(&(json.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&b);
    crc.update(json.as_bytes());
    b.extend_from_slice(&crc.finalize().to_le_bytes());
    b.extend_from_slice(json.as_bytes());
    b
}

/// Decodes a `HEADER` file; the error says what is wrong.
pub fn decode(bytes: &[u8]) -> Result<HeaderFile<'_>, String> {
    if bytes.len() < HEADER_FIXED {
        return Err(format!(
            "{} bytes, shorter than the {HEADER_FIXED}-byte fixed part",
            bytes.len()
        ));
    }
    if bytes[0..8] != HEADER_MAGIC {
        return Err("bad magic (not a session HEADER)".into());
    }
    let version = le_u32(bytes, 8);
    if version != HEADER_VERSION && version != HEADER_VERSION_EMBEDDED {
        return Err(format!(
            "HEADER format version {version}; this build reads versions {HEADER_VERSION} and \
             {HEADER_VERSION_EMBEDDED}"
        ));
    }
    let n = le_u32(bytes, 28) as usize;
    let end = HEADER_FIXED.saturating_add(n);
    // Version 1 ends with its JSON; version 2 has a checkpoint after it
    // (one cut off whole, damage to the cache, reads as none: the session
    // stays accounted for).
    let fits = match version {
        HEADER_VERSION => bytes.len() == end,
        _ => bytes.len() >= end,
    };
    if n > MAX_HEADER_JSON || !fits {
        return Err(format!(
            "header length {n} does not match the file's {} bytes (version {version})",
            bytes.len()
        ));
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[0..32]);
    crc.update(&bytes[HEADER_FIXED..end]);
    if crc.finalize() != le_u32(bytes, 32) {
        return Err("checksum mismatch".into());
    }
    let json = std::str::from_utf8(&bytes[HEADER_FIXED..end])
        .map_err(|_| "the header is not UTF-8".to_string())?;
    Ok(HeaderFile {
        uid: bytes[12..28].try_into().expect("16 bytes"),
        json,
        checkpoint: (end < bytes.len()).then(|| &bytes[end..]),
    })
}

/// `HEADER` file `bytes` with `checkpoint` embedded (version 2), or with
/// none (version 1): the fixed part and the JSON are kept byte for byte,
/// the version and the checksum written again.
pub fn with_checkpoint(bytes: &[u8], checkpoint: Option<&[u8]>) -> Result<Vec<u8>, String> {
    let end = HEADER_FIXED + decode(bytes)?.json.len();
    let mut b = Vec::with_capacity(end + checkpoint.map_or(0, <[u8]>::len));
    b.extend_from_slice(&bytes[..end]);
    let version = match checkpoint {
        Some(_) => HEADER_VERSION_EMBEDDED,
        None => HEADER_VERSION,
    };
    b[8..12].copy_from_slice(&version.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&b[0..32]);
    crc.update(&b[HEADER_FIXED..end]);
    b[32..36].copy_from_slice(&crc.finalize().to_le_bytes());
    if let Some(ck) = checkpoint {
        b.extend_from_slice(ck);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned bytes of a version-1 `HEADER`, and its version-2 form.
    #[test]
    fn bytes_are_pinned_and_a_checkpoint_round_trips() {
        let b = encode("{}", &[7; 16]);
        let mut want = b"SLOGHEAD\x01\0\0\0".to_vec();
        want.extend_from_slice(&[7; 16]);
        want.extend_from_slice(&2u32.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&want);
        crc.update(b"{}");
        want.extend_from_slice(&crc.finalize().to_le_bytes());
        want.extend_from_slice(b"{}");
        assert_eq!(b, want);
        let plain = decode(&b).unwrap();
        assert_eq!((plain.uid, plain.json, plain.checkpoint), ([7; 16], "{}", None));
        let v2 = with_checkpoint(&b, Some(b"ck")).unwrap();
        assert_eq!(&v2[8..12], &2u32.to_le_bytes());
        assert_eq!(decode(&v2).unwrap().checkpoint, Some(&b"ck"[..]));
        assert_eq!(with_checkpoint(&v2, None).unwrap(), b);
        // Damage to the checkpoint part is not the header's: version 2 with
        // its checkpoint cut off whole reads as none. Version 1 with
        // trailing bytes is refused.
        assert_eq!(decode(&v2[..b.len()]).unwrap().checkpoint, None);
        assert!(decode(&v2[..b.len() - 1]).is_err());
        let mut trailing = b.clone();
        trailing.push(0);
        assert!(decode(&trailing).is_err());
        let mut damaged = v2.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert_eq!(decode(&damaged).unwrap().checkpoint, Some(&b"cj"[..]));
    }
}
