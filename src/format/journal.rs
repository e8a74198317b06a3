//! The store-wide journal: the bytes of one journal file (issue 18).
//!
//! With `Options::journal`, a durable append of a small batch is made
//! durable by one `fdatasync` shared by every batch (of any session) that
//! waits at that moment: the batch's record is written to its segment
//! unsynced, then copied into the handle's journal file, and the journal is
//! synced for the whole group. The segments are synced later, in the
//! background, before the journal file is removed. Section 11 of
//! `format-spec.md` gives the protocol; this module only knows the bytes.
//!
//! A journal file `<store>/journal/<number as 16 hex digits>.wal` has a
//! fixed size, zero-filled when it is created, so appending to it never
//! changes its length (an `fdatasync` then writes data only):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `SLOGJRNL` |
//! | 8 | 4 | version, u32 = 1 |
//! | 12 | 4 | reserved, 0 |
//! | 16 | 8 | the file's number (as in its name) |
//! | 24 | 16 | store id (as in `MANIFEST`) |
//! | 40 | 4 | CRC-32 of bytes 0..40 |
//! | 44 | 4 | zero |
//! | 48 | ... | entries, then zeros |
//!
//! An entry is `len u32 | crc u32 | payload[len]`, `crc` the CRC-32 of the
//! four length bytes then the payload; the payload is
//! `session uid [16] | segment first seq u64 | offset u64 | id length u16 |
//! id (UTF-8) | record`, where `record` is the whole record frame exactly as
//! written at `offset` of that segment. A zero length, a length past the
//! file's end or a bad CRC ends the entries (an unsynced, torn tail).

use crate::format::bytes::{le_u16, le_u32, le_u64};

/// The journal directory's name in a store.
pub const JOURNAL_DIR: &str = "journal";
/// Bytes before the first entry.
pub const HEADER_LEN: usize = 48;
/// Bytes of an entry besides its id and record.
pub const ENTRY_OVERHEAD: usize = 8 + 16 + 8 + 8 + 2;
/// The longest session id an entry holds (its length is a u16). A session
/// with a longer id is not journaled: its records are synced in place.
pub const MAX_ID_LEN: usize = u16::MAX as usize;
const MAGIC: [u8; 8] = *b"SLOGJRNL";
const VERSION: u32 = 1;

/// Errors reading a journal file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalError {
    /// The header is not a journal header of this version.
    #[error("bad journal header: {0}")]
    BadHeader(String),
    /// An entry whose checksum holds but whose contents do not parse.
    #[error("bad journal entry at offset {offset}: {reason}")]
    BadEntry {
        /// Where the entry starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// The header of a journal file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalHeader {
    /// The file's number.
    pub number: u64,
    /// The store it belongs to.
    pub store_id: [u8; 16],
}

impl JournalHeader {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.number.to_le_bytes());
        b[24..40].copy_from_slice(&self.store_id);
        let crc = crc32fast::hash(&b[0..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a header.
    pub fn decode(b: &[u8]) -> Result<JournalHeader, JournalError> {
        if b.len() < HEADER_LEN {
            return Err(JournalError::BadHeader(format!(
                "{} bytes, a header has {HEADER_LEN}",
                b.len()
            )));
        }
        if b[0..8] != MAGIC {
            return Err(JournalError::BadHeader("no journal magic".into()));
        }
        if crc32fast::hash(&b[0..40]) != le_u32(b, 40) {
            return Err(JournalError::BadHeader("header checksum mismatch".into()));
        }
        let version = le_u32(b, 8);
        if version != VERSION {
            return Err(JournalError::BadHeader(format!(
                "journal version {version}; this build reads version {VERSION}"
            )));
        }
        Ok(JournalHeader {
            number: le_u64(b, 16),
            store_id: b[24..40].try_into().expect("16 bytes"),
        })
    }
}

/// One journaled record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The uid the segment was created with (its identity).
    pub uid: [u8; 16],
    /// The segment's first seq (its name).
    pub segment: u64,
    /// Where the record frame starts in the segment.
    pub offset: u64,
    /// The session id.
    pub session: &'a str,
    /// The record frame, as written to the segment.
    pub record: &'a [u8],
}

impl Entry<'_> {
    /// Bytes the framed entry takes in the file.
    pub fn framed_len(&self) -> usize {
        ENTRY_OVERHEAD + self.session.len() + self.record.len()
    }

    /// Appends the framed entry to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        assert!(
            self.session.len() <= MAX_ID_LEN,
            "a journal entry holds ids of at most {MAX_ID_LEN} bytes"
        );
        let start = out.len();
        let len = (self.framed_len() - 8) as u32;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.uid);
        out.extend_from_slice(&self.segment.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&(self.session.len() as u16).to_le_bytes());
        out.extend_from_slice(self.session.as_bytes());
        out.extend_from_slice(self.record);
        let mut h = crc32fast::Hasher::new();
        h.update(&out[start..start + 4]);
        h.update(&out[start + 8..]);
        out[start + 4..start + 8].copy_from_slice(&h.finalize().to_le_bytes());
    }
}

/// What a journal file holds.
#[derive(Debug)]
pub struct Scanned<'a> {
    /// Its header.
    pub header: JournalHeader,
    /// Its entries, in the order they were written.
    pub entries: Vec<Entry<'a>>,
}

/// Reads a whole journal file. The entries end at the first one that is
/// zero, torn or fails its CRC: entries are only acknowledged after a sync
/// that covered every earlier entry, so nothing acknowledged lies past a
/// torn tail. A valid entry anywhere after that point proves it is not a
/// torn tail but damage (a changed byte in an entry a sync covered, with
/// acknowledged entries after it): that is [`JournalError::BadEntry`] at
/// the point where reading stopped, never a shorter journal.
pub fn scan(b: &[u8]) -> Result<Scanned<'_>, JournalError> {
    let header = JournalHeader::decode(b)?;
    let mut entries = Vec::new();
    let mut frames = Frames::new(b);
    for (at, payload) in &mut frames {
        entries.push(parse_entry(payload).map_err(|reason| JournalError::BadEntry {
            offset: at as u64,
            reason,
        })?);
    }
    let end = frames.at;
    match valid_entry_after(b, end) {
        Beyond::Nothing => Ok(Scanned { header, entries }),
        Beyond::Entry(next) => Err(JournalError::BadEntry {
            offset: end as u64,
            reason: format!(
                "the entry here is damaged (zero length, past the end or checksum mismatch) \
                 yet a valid entry follows at offset {next}: not a torn tail"
            ),
        }),
        Beyond::Unknown => Err(JournalError::BadEntry {
            offset: end as u64,
            reason: "the entry here is damaged, and a valid entry after it could not be \
                     ruled out within the checking budget: not known to be a torn tail"
                .into(),
        }),
    }
}

/// What lies after the point where the entries stopped.
enum Beyond {
    /// Zeros, or bytes no valid entry starts in: a torn tail.
    Nothing,
    /// A valid entry (checksum and framing) starts at this offset.
    Entry(usize),
    /// Checking every candidate would checksum more than the budget.
    Unknown,
}

/// Looks for a valid entry frame starting at any byte offset after `from`
/// (where [`Frames`] stopped). Zero runs are skipped in bulk; the bytes
/// checksummed are bounded by the file's size plus 64 KiB (a candidate
/// that cannot be checked within that is [`Beyond::Unknown`]), so a
/// crafted file cannot make this quadratic. Only payloads at least as long
/// as the smallest entry are candidates.
fn valid_entry_after(b: &[u8], from: usize) -> Beyond {
    const MIN_PAYLOAD: usize = ENTRY_OVERHEAD - 8 + 1;
    let mut budget = b.len() as u64 + (64 << 10);
    let mut at = from.max(HEADER_LEN) + 1;
    while at + 8 <= b.len() {
        if b[at..at + 4] == [0; 4] {
            // Skip to just before the next nonzero byte: a length field
            // ending there is the next candidate.
            match b[at + 4..].iter().position(|&x| x != 0) {
                Some(n) => at = (at + 4 + n).saturating_sub(3).max(at + 1),
                None => break,
            }
            continue;
        }
        let len = le_u32(b, at) as usize;
        if len >= MIN_PAYLOAD && len <= b.len() - at - 8 && framed_like_an_entry(b, at, len) {
            let cost = 4 + len as u64;
            if cost > budget {
                return Beyond::Unknown;
            }
            budget -= cost;
            let mut h = crc32fast::Hasher::new();
            h.update(&b[at..at + 4]);
            h.update(&b[at + 8..at + 8 + len]);
            if h.finalize() == le_u32(b, at + 4) {
                return Beyond::Entry(at);
            }
        }
        at += 1;
    }
    Beyond::Nothing
}

/// Whether the `len` bytes of payload at `at + 8` are laid out as every
/// entry the store writes: the fixed part, the id its length field
/// declares, then a record frame exactly as long as the frame's own length
/// field says (section 3.2: `len`, `crc`, payload, trailer). Checked before
/// a candidate's CRC: in the random-looking bytes of a torn entry, a
/// length merely in range is common (1 in 64 offsets of a 64 MiB file),
/// and a few KiB of them spent the whole budget on checksums, so a process
/// killed in the middle of writing a large entry left a journal refused as
/// damaged; this layout holds by chance about once in 2^32.
fn framed_like_an_entry(b: &[u8], at: usize, len: usize) -> bool {
    let payload = at + 8;
    let fixed = ENTRY_OVERHEAD - 8;
    let id_len = usize::from(le_u16(b, payload + fixed - 2));
    let record = payload + fixed + id_len;
    let end = payload + len;
    record + 4 <= end
        && (le_u32(b, record) as usize).checked_add(crate::segment::FRAME_OVERHEAD)
            == Some(end - record)
}

/// The framed entries of a journal file, as (offset, payload), while the
/// framing and CRC hold; `at` is then where they stopped.
struct Frames<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Frames<'a> {
    fn new(b: &'a [u8]) -> Self {
        Frames {
            b,
            at: HEADER_LEN.min(b.len()),
        }
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = (usize, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let (b, at) = (self.b, self.at);
        if at + 8 > b.len() {
            return None;
        }
        let len = le_u32(b, at) as usize;
        if len == 0 || len > b.len() - at - 8 {
            return None;
        }
        let payload = &b[at + 8..at + 8 + len];
        let mut h = crc32fast::Hasher::new();
        h.update(&b[at..at + 4]);
        h.update(payload);
        if h.finalize() != le_u32(b, at + 4) {
            return None;
        }
        self.at = at + 8 + len;
        Some((at, payload))
    }
}

/// What [`salvage`] could read of a journal file the store refused.
#[derive(Debug)]
pub struct Salvage<'a> {
    /// Every entry whose checksum holds and that parses, in file order.
    pub entries: Vec<Entry<'a>>,
    /// Entries whose checksum holds but that do not parse: where each
    /// starts and why (skipped: its framing still says where the next one
    /// starts).
    pub unparsed: Vec<(u64, String)>,
    /// Where reading stopped: the first entry that is zero, torn or fails
    /// its CRC, or the end of the file.
    pub end: u64,
    /// Non-zero bytes from `end` to the end of the file: a torn tail, or
    /// entries hidden behind damage (nothing can tell which).
    pub unread: u64,
}

/// Reads what can be read of a damaged journal file: the entries after the
/// header whatever the header holds, skipping entries that do not parse,
/// stopping where [`scan`] stops. No resynchronisation past that point: a
/// later entry could only be replayed after a lost one, leaving a gap in
/// its segment, which the segment's reader would take for corruption.
pub fn salvage(b: &[u8]) -> Salvage<'_> {
    let mut entries = Vec::new();
    let mut unparsed = Vec::new();
    let mut frames = Frames::new(b);
    for (at, payload) in &mut frames {
        match parse_entry(payload) {
            Ok(e) => entries.push(e),
            Err(reason) => unparsed.push((at as u64, reason)),
        }
    }
    let end = frames.at;
    Salvage {
        entries,
        unparsed,
        end: end as u64,
        unread: b[end..].iter().filter(|&&x| x != 0).count() as u64,
    }
}

fn parse_entry(p: &[u8]) -> Result<Entry<'_>, String> {
    let fixed = ENTRY_OVERHEAD - 8;
    if p.len() < fixed {
        return Err(format!("{} bytes, an entry has at least {fixed}", p.len()));
    }
    let id_len = usize::from(le_u16(p, 32));
    let record = p
        .get(fixed + id_len..)
        .filter(|r| !r.is_empty())
        .ok_or("the id runs past the entry, or no record follows")?;
    let session = std::str::from_utf8(&p[fixed..fixed + id_len])
        .map_err(|_| "the session id is not UTF-8".to_string())?;
    Ok(Entry {
        uid: p[0..16].try_into().expect("16 bytes"),
        segment: le_u64(p, 16),
        offset: le_u64(p, 24),
        session,
        record,
    })
}

/// The file name of journal `number`.
pub fn file_name(number: u64) -> String {
    format!("{number:016x}.wal")
}

/// The number in a journal file's name.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    (hex.len() == 16)
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[Entry<'_>]) -> Vec<u8> {
        let h = JournalHeader {
            number: 7,
            store_id: [3; 16],
        };
        let mut b = h.encode().to_vec();
        for e in entries {
            e.encode(&mut b);
        }
        b.resize(b.len() + 100, 0);
        b
    }

    /// `payload` in a record frame's layout (its CRC and trailer not
    /// computed: the journal does not check them), as the store journals.
    fn frame(payload: &[u8]) -> &'static [u8] {
        let mut f = (payload.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(&[0xc5; 4]);
        f.extend_from_slice(payload);
        f.extend_from_slice(&[0x5c; 4]);
        Box::leak(f.into_boxed_slice())
    }

    fn entry<'a>(id: &'a str, payload: &[u8], offset: u64) -> Entry<'a> {
        Entry {
            uid: [9; 16],
            segment: 1,
            offset,
            session: id,
            record: frame(payload),
        }
    }

    #[test]
    fn round_trip_and_pinned_header() {
        let es = [entry("a", b"rec-one", 64), entry("bb", b"r2", 80)];
        let b = file(&es);
        let s = scan(&b).unwrap();
        assert_eq!(s.header.number, 7);
        assert_eq!(s.entries, es);
        assert_eq!(&b[0..12], b"SLOGJRNL\x01\0\0\0");
        assert_eq!(file_name(0xab), "00000000000000ab.wal");
        assert_eq!(parse_file_name("00000000000000ab.wal"), Some(0xab));
        assert_eq!(parse_file_name("ab.wal"), None);
    }

    #[test]
    fn a_torn_or_flipped_entry_ends_the_journal() {
        let es = [entry("a", b"rec-one", 64), entry("b", b"rec-two", 80)];
        let good = file(&es);
        let second = HEADER_LEN + es[0].framed_len();
        for at in second..second + es[1].framed_len() {
            let mut b = good.clone();
            b[at] ^= 0x40;
            let s = scan(&b).unwrap();
            assert_eq!(s.entries, es[..1], "flip at {at}");
        }
        let mut cut = good.clone();
        cut.truncate(second + 5);
        assert_eq!(scan(&cut).unwrap().entries, es[..1]);
    }

    #[test]
    fn a_damaged_entry_with_a_valid_one_after_it_is_refused() {
        let es = [
            entry("a", b"rec-one", 64),
            entry("b", b"rec-two", 80),
            entry("c", b"rec-3", 96),
        ];
        let good = file(&es);
        let second = HEADER_LEN + es[0].framed_len();
        let third = second + es[1].framed_len();
        // Every byte of the second entry, length field included: whatever
        // the flip makes of it (zero length, past the end, bad CRC), the
        // valid third entry after it proves damage, not a torn tail.
        for at in second..third {
            for bit in [0x01, 0x40, 0x80] {
                let mut b = good.clone();
                b[at] ^= bit;
                match scan(&b) {
                    Err(JournalError::BadEntry { offset, .. }) => {
                        assert_eq!(offset, second as u64, "flip {bit:#x} at {at}")
                    }
                    other => panic!("flip {bit:#x} at {at}: {other:?}"),
                }
            }
        }
        // Zeroed (an unsynced entry a crash never wrote), with nothing
        // valid after it: the end.
        let mut b = good.clone();
        b[second..].fill(0);
        assert_eq!(scan(&b).unwrap().entries, es[..1]);
        // A large file of zeros after the entries is read quickly.
        let mut big = good.clone();
        big.resize(32 << 20, 0);
        let t = std::time::Instant::now();
        assert_eq!(scan(&big).unwrap().entries, es);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn the_search_past_a_bad_entry_is_bounded() {
        // After a bad entry, a candidate every 64 bytes laid out as an
        // entry (id length 0, a record frame whose length field fits),
        // each claiming a payload to the end of the file but failing its
        // CRC: checking each would be quadratic; past the budget the
        // verdict is damage, not a torn tail.
        let es = [entry("a", b"rec-one", 64)];
        let mut b = file(&es);
        let end = b.len() - 100;
        b.truncate(end);
        let slots = 1 << 12;
        let total = end + 1 + slots * 64 + (1 << 20);
        b.resize(total, 0);
        for k in 0..slots {
            let at = end + 1 + k * 64;
            let len = total - at - 8;
            b[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
            b[at + 4..at + 8].copy_from_slice(&[0xee; 4]);
            let record = at + 8 + ENTRY_OVERHEAD - 8;
            let frame_len = (total - record - crate::segment::FRAME_OVERHEAD) as u32;
            b[record..record + 4].copy_from_slice(&frame_len.to_le_bytes());
        }
        let t = std::time::Instant::now();
        assert!(matches!(scan(&b), Err(JournalError::BadEntry { offset, .. }) if offset == end as u64));
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }

    /// A process killed in the middle of writing a large entry (the kernel
    /// copies a write page by page and stops at a fatal signal): the
    /// entry's first page is in the file, the rest zeros, in a large
    /// file. Its random-looking bytes are no entry's layout, so the search
    /// past it checksums next to nothing and the verdict is a torn tail.
    /// Before the layout check, about 1 in 256 of those offsets (in this
    /// 16 MiB file) claimed a payload in range, each costing megabytes of
    /// checksum: the budget ran out and the journal was refused as
    /// damaged, blocking every session until a salvage.
    #[test]
    fn a_large_entry_cut_at_a_page_by_a_kill_is_a_torn_tail() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..64 << 10)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let es = [entry("a", b"rec-one", 64), entry("b", &noise, 128)];
        let mut b = file(&es[..1]);
        let second = b.len() - 100;
        b.truncate(second);
        let mut whole = Vec::new();
        es[1].encode(&mut whole);
        let cut = (second + 4096) / 4096 * 4096 - second;
        b.extend_from_slice(&whole[..cut]);
        b.resize(16 << 20, 0);
        let scanned = scan(&b).unwrap();
        assert_eq!(scanned.entries, es[..1]);
    }

    #[test]
    fn salvage_reads_past_a_bad_header_and_an_unparsable_entry() {
        let es = [
            entry("a", b"rec-one", 64),
            entry("b", b"rec-two", 80),
            entry("c", b"rec-3", 96),
        ];
        let mut b = file(&es);
        // An entry whose CRC holds but whose id length runs past it.
        let second = HEADER_LEN + es[0].framed_len();
        b[second + 8 + 32..second + 8 + 34].copy_from_slice(&u16::MAX.to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&b[second..second + 4]);
        h.update(&b[second + 8..second + es[1].framed_len()]);
        b[second + 4..second + 8].copy_from_slice(&h.finalize().to_le_bytes());
        assert!(matches!(scan(&b), Err(JournalError::BadEntry { offset, .. }) if offset == second as u64));
        b[3] ^= 1; // and a bad header
        assert!(matches!(scan(&b), Err(JournalError::BadHeader(_))));
        let s = salvage(&b);
        assert_eq!(s.entries, [es[0], es[2]]);
        assert_eq!(s.unparsed.len(), 1);
        assert_eq!(s.unparsed[0].0, second as u64);
        let end = HEADER_LEN + es.iter().map(|e| e.framed_len()).sum::<usize>();
        assert_eq!((s.end, s.unread), (end as u64, 0));

        // A flipped CRC ends the reading; what follows is counted, not read.
        let third = second + es[1].framed_len();
        b[third + 5] ^= 1;
        let s = salvage(&b);
        assert_eq!(s.entries, [es[0]]);
        assert_eq!(s.end, third as u64);
        let nonzero = b[third..].iter().filter(|&&x| x != 0).count() as u64;
        assert!(s.unread > 0);
        assert_eq!(s.unread, nonzero);
        // Too short for a header: nothing, no panic.
        let s = salvage(&b[..20]);
        assert!(s.entries.is_empty());
        assert_eq!(s.end, 20);
    }

    #[test]
    fn a_damaged_header_is_refused() {
        let good = file(&[entry("a", b"x", 64)]);
        for at in 0..44 {
            let mut b = good.clone();
            b[at] ^= 1;
            assert!(
                matches!(scan(&b), Err(JournalError::BadHeader(_))),
                "flip at {at}"
            );
        }
    }
}
