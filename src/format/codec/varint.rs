//! The integer encodings of the batch layout: the project's varints
//! ([`crate::format::varint`], one implementation for every format) and
//! length-prefixed bytes (see the module docs of [`codec`](super)).

pub(super) use crate::format::varint::{len as varint_len, put as put_varint, unzigzag, zigzag};

pub(super) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::codec::decode::Cursor;

    #[test]
    fn the_cursor_reads_what_put_writes_and_refuses_bad_forms() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            let mut c = Cursor::new(&out, 0, 0);
            assert_eq!(c.varint().unwrap(), v);
            assert_eq!(c.remaining(), 0);
        }
        // Overlong, overflowing and truncated encodings.
        for bad in [&[0x80, 0x00][..], &[0xff; 10][..], &[0x80][..], &[][..]] {
            assert!(Cursor::new(bad, 0, 0).varint().is_err(), "{bad:?}");
        }
        let mut bytes = vec![7u8; 3];
        put_bytes(&mut bytes, b"ab");
        assert_eq!(bytes, [7, 7, 7, 2, b'a', b'b']);
    }
}
