//! The integer encodings of the batch layout: unsigned LEB128 varints and
//! zigzag for signed differences (see the module docs of [`codec`](super)).
//! The decoder reads varints in `decode::Cursor::varint`.

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(super) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::codec::decode::Cursor;

    #[test]
    fn varints() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            let mut c = Cursor::new(&out, 0, 0);
            assert_eq!(c.varint().unwrap(), v);
            assert_eq!(c.remaining(), 0);
        }
        for v in [0, 1, -1, 63, -64, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        // Overlong, overflowing and truncated encodings.
        for bad in [&[0x80, 0x00][..], &[0xff; 10][..], &[0x80][..], &[][..]] {
            assert!(Cursor::new(bad, 0, 0).varint().is_err(), "{bad:?}");
        }
        let mut max = vec![0xff; 9];
        max.push(0x01);
        assert_eq!(Cursor::new(&max, 0, 0).varint().unwrap(), u64::MAX);
    }
}
