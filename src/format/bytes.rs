//! Little-endian integers at fixed offsets of a byte slice: the one set of
//! readers every file format here uses (segment, manifest, lineage, session
//! HEADER).
//!
//! Each panics if the slice is too short; callers check lengths first, as
//! they must to report what is wrong.

/// The little-endian u16 at `at..at + 2` of `b`.
pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2-byte slice"))
}

/// The little-endian u32 at `at..at + 4` of `b`.
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4-byte slice"))
}

/// The little-endian u64 at `at..at + 8` of `b`.
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8-byte slice"))
}
