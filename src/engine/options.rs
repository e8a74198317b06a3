//! Store options: durability modes and tuning.

use crate::segment;

/// When an append is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// `fdatasync` before `append` returns (the default).
    Sync,
    /// Group commit: `append` returns before its batch is durable; one
    /// background thread syncs every dirty session each `window`, so many
    /// appends share one `fdatasync`. [`Store::flush`](crate::store::Store::flush) waits for it.
    Batched {
        /// How long an append may stay unsynced.
        window: std::time::Duration,
    },
    /// No sync on append; only [`Store::flush`](crate::store::Store::flush) and [`Store::close`](crate::store::Store::close) sync.
    None,
}

/// Store options. Build them with struct update syntax over
/// [`Options::default`].
#[derive(Debug, Clone)]
pub struct Options {
    /// When appends are durable.
    pub durability: Durability,
    /// Roll over to a new segment when the active one would pass this size.
    pub segment_size: u64,
    /// The largest batch record this handle writes, in bytes (an append
    /// encoding to more is [`Error::TooLarge`](super::Error::TooLarge));
    /// at most [`MAX_RECORD_LIMIT`](crate::store::MAX_RECORD_LIMIT). Reads
    /// take any record up to that limit, so a store written with a higher
    /// `max_record` reads the same through every handle.
    pub max_record: u32,
    /// Write a checkpoint when this many events were appended since the
    /// last one (or when the log's index grew past the checkpoint's size,
    /// whichever is larger: the cost per event stays O(1) amortised).
    pub checkpoint_every: u64,
    /// The largest step of segment space preallocated (allocated and
    /// zeroed) at a time (default 1 MiB);
    /// a segment grows by as much as it holds (at least 64 KiB) up to this,
    /// so small sessions zero-fill little. 0 disables preallocation.
    pub preallocate: u64,
    /// Share syncs across sessions through a store-wide journal (issue 18;
    /// default `false`). With [`Durability::Sync`], an append of a batch up
    /// to a quarter of `journal_file_size` writes its record to the
    /// session's segment unsynced and a copy to this handle's journal; one
    /// `fdatasync` of the journal then acknowledges every batch waiting at
    /// that moment, whatever its session, and the segments are synced in
    /// the background. Durability on return is unchanged: a crash loses no
    /// acknowledged batch (the session's next writer, or the next writable
    /// open, writes the journal's copies back). Pays off with many sessions
    /// appending at once; one session alone gains nothing, and opening a
    /// writable handle writes and syncs its first journal file
    /// (`journal_file_size` of zeros). Ignored in the other durability
    /// modes.
    pub journal: bool,
    /// The size of each journal file (default 32 MiB), zero-filled when
    /// made so a journal sync writes data only.
    pub journal_file_size: u64,
    /// Store sealed segments compressed (default `false`). When a segment
    /// is sealed, a background thread of this handle writes its compressed
    /// image (`<first seq>.segz`, Zstandard level 3) beside it, makes it
    /// durable, then removes the raw file; a session's writer also
    /// compresses the sealed segments it finds raw when it loads the
    /// session. Sealed data then takes about 0.2-0.4x the bytes of plain
    /// JSONL. The cost is on reads of sealed data: a segment is decoded
    /// whole when a read needs it. Reads through the whole log decode one
    /// segment at a time and keep none; a derive keeps the segments
    /// holding the messages it reads decoded while the session is loaded
    /// (`SessionStats::decoded_bytes`). The active segment, the hot tail,
    /// is never compressed. Turning it on raises the store to the newest
    /// format version (5; images came with version 4: `format-spec.md`,
    /// sections 2 and 3.5), which older builds refuse; any build that reads
    /// version 4 reads compressed segments whatever this option says. With an archive,
    /// images stay local: the bucket holds every segment raw (an image is
    /// decoded for its upload), so hosts with and without this option
    /// share one bucket.
    pub compress_sealed: bool,
    /// A small session's checkpoint is kept at the end of its `HEADER`
    /// rather than in a `CHECKPOINT` file of its own, when the `HEADER`
    /// then fits in 4 KiB (default on): a file costs a whole block of the
    /// disk, so 1,000 sessions of ~16 KB kept a quarter of their bytes
    /// again in checkpoint blocks. The first such `HEADER` raises the store
    /// to format version 5 (`format-spec.md`, sections 2 and 6), which
    /// older builds refuse; off keeps a store they can read (every
    /// checkpoint in its own file). Any build that reads version 5 reads
    /// both, whatever this option says.
    pub embed_checkpoints: bool,
    /// Bytes of decoded compressed images this handle keeps for later
    /// derives (default 256 MiB). A derive reads message data in place, so
    /// it decodes the images holding the messages it reads; while the
    /// handle's decoded images (kept by sessions, and held by [`Derived`]
    /// values and reads in progress) stay within this, the session keeps
    /// them for its next derive. Any call on a session that leaves the
    /// handle above it (a derive, a rebuild, a fork, a flush writing a
    /// checkpoint) gives that session's back before it returns: a
    /// [`Derived`] keeps what it borrows until it is dropped, and the next
    /// derive of that session decodes them again. 0 keeps none; memory
    /// then holds only what callers hold.
    ///
    /// [`Derived`]: crate::store::Derived
    pub max_decoded_images: u64,
    /// Also enforce the strict invariants on append.
    pub strict: bool,
    /// Sessions a handle keeps loaded at once (default 512). Past it, the
    /// least recently used idle ones are released (synced, their
    /// preallocated space trimmed, their writer lock given back), so open
    /// files stay bounded however many sessions one process touches: a
    /// loaded session holds at most one file descriptor, its active
    /// segment's, while this handle writes it.
    pub max_open_sessions: usize,
    /// When this handle takes a session for writing and its last turn is
    /// open (its previous writer stopped mid-turn), append the harness's
    /// closers first (default `true`). A caller that repairs on its own
    /// terms (the harness's coordinator does) turns this off and uses
    /// [`Store::repair`](crate::store::Store::repair).
    pub close_interrupted_turns: bool,
    /// The archive tier on object storage (`archive` feature, issue 17;
    /// default `None`: sessions live on the local disk only).
    #[cfg(feature = "archive")]
    pub archive: Option<super::archive::ArchiveOptions>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            segment_size: 64 << 20,
            max_record: segment::DEFAULT_MAX_RECORD,
            checkpoint_every: 65_536,
            preallocate: segment::DEFAULT_PREALLOCATE,
            journal: false,
            journal_file_size: 32 << 20,
            compress_sealed: false,
            embed_checkpoints: true,
            max_decoded_images: 256 << 20,
            strict: false,
            max_open_sessions: 512,
            close_interrupted_turns: true,
            #[cfg(feature = "archive")]
            archive: None,
        }
    }
}
