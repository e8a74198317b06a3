//! The project's varint (`format-spec.md` section 0): unsigned LEB128, 7
//! bits a byte, low group first, high bit set when more bytes follow, at
//! most 10 bytes, shortest form required; signed values are zigzagged
//! first. One implementation for every file format that uses varints.

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VarintError {
    /// The bytes end inside the varint.
    #[error("truncated varint")]
    Truncated,
    /// The value does not fit 64 bits.
    #[error("varint overflows u64")]
    Overflow,
    /// A longer form than needed (a trailing zero group).
    #[error("overlong varint")]
    Overlong,
}

impl VarintError {
    /// The reason as a static string, for errors that carry one.
    pub fn reason(self) -> &'static str {
        match self {
            VarintError::Truncated => "truncated varint",
            VarintError::Overflow => "varint overflows u64",
            VarintError::Overlong => "overlong varint",
        }
    }
}

/// Appends `v` as a varint.
pub fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes `v` takes as a varint.
pub fn len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Reads a varint at the start of `bytes`: the value and the bytes it took.
pub fn read(bytes: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut value = 0u64;
    let mut shift = 0u32;
    for (i, &b) in bytes.iter().enumerate() {
        if shift == 63 && b > 1 {
            return Err(VarintError::Overflow);
        }
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            if b == 0 && shift > 0 {
                return Err(VarintError::Overlong);
            }
            return Ok((value, i + 1));
        }
        shift += 7;
    }
    Err(VarintError::Truncated)
}

/// Zigzag: small magnitudes of either sign become small unsigned values.
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The inverse of [`zigzag`].
pub fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_has_the_stated_length() {
        for v in [0, 1, 127, 128, 300, 1 << 35, u64::MAX - 1, u64::MAX] {
            let mut b = Vec::new();
            put(&mut b, v);
            assert_eq!(b.len(), len(v), "{v}");
            assert_eq!(read(&b), Ok((v, b.len())), "{v}");
        }
        let mut b = Vec::new();
        put(&mut b, 300);
        assert_eq!(b, [0xac, 0x02]);
        for v in [0, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }

    #[test]
    fn refuses_truncated_overlong_and_overflowing_forms() {
        assert_eq!(read(&[]), Err(VarintError::Truncated));
        assert_eq!(read(&[0x80]), Err(VarintError::Truncated));
        assert_eq!(read(&[0x80, 0x00]), Err(VarintError::Overlong));
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(read(&max), Ok((u64::MAX, 10)));
        max[9] = 0x02;
        assert_eq!(read(&max), Err(VarintError::Overflow));
    }
}
