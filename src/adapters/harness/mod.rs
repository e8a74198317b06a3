//! The harness's own JSONL storage, on the way in and out (section 9 of the
//! domain notes): packed chunk rows as the harness's encoder writes them,
//! Zstandard session logs (a header frame, then one frame per append batch),
//! the layouts of a harness sessions root, and import into / export from a
//! [`Store`].
//!
//! Reading builds on [`jsonl::read_session`]: every format here decodes to the
//! same JSONL text, so every rule of the session model applies the same way.
//!
//! # Packed rows
//!
//! [`pack_chunks`] turns each maximal run of [`MIN_PACKED_RUN`] or more
//! consecutive `assistant/chunk` events of one block into one row
//! `{"type":"text-chunks"|"reasoning-chunks"|"tool-call-chunks","seq0":S,"time0":T,"data":{...}}`,
//! with the key order and bytes of the harness's rows. A run only takes
//! events that expand back to exactly their own bytes, so expanding a packed
//! file ([`jsonl::read_session`]) always gives back exactly the events.
//!
//! # Zstandard logs
//!
//! [`read_zstd_session`] decodes every frame and concatenates them into the
//! JSONL text; [`write_zstd_session`] writes a header frame and one frame per
//! batch. See [`read_zstd_session`] for what counts as a torn tail.
//!
//! # Roots
//!
//! The root layouts live in [`crate::adapters::root`] (re-exported here):
//! older `<root>/cwd-<12 hex>/<escaped id>.jsonl`, current
//! `<root>/--<slug>--/<escaped id>/session.jsonl[.zstd]`.
//!
//! # Where things are
//!
//! `packed` (packed chunk rows), `zstd` (Zstandard logs: reading, writing,
//! batch boundaries), `import` (a harness file into a [`Store`]) and
//! `export` (a stored session out as a harness file). Everything public is
//! re-exported here.
//!
//! [`Store`]: crate::store::Store
//! [`jsonl::read_session`]: crate::adapters::jsonl::read_session

pub use crate::adapters::root::{
    NAME_MAX, NO_CWD_DIR, PATH_MAX, PLAIN_FILE_NAME, ZSTD_FILE_NAME, create_dirs_durably,
    cwd_dir_name, export_path, find_sessions, id_escape, id_unescape, project_dir_name,
    shadowed_sessions, write_atomically,
};

mod export;
mod import;
mod packed;
mod zstd;

pub use export::{
    ExportError, ExportOptions, ExportReport, VERBATIM_KIND, check_export_to_root, export_session,
    export_session_to_root, harness_events, other_encoding_in_root, root_export_path,
};
pub use import::{
    ImportError, ImportOptions, ImportReport, import_file, import_file_with_progress,
};
pub use packed::{MIN_PACKED_RUN, PackedKind, PackedRow, Row, pack_chunks, write_session_packed};
pub use zstd::{
    TornFrame, WriteStats, ZstdError, ZstdText, is_zstd, read_zstd_session,
    read_zstd_session_limited, turn_batches, write_zstd_session, write_zstd_session_with,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_round_trip() {
        for id in ["a/b", "~", "é", "😀", ".", "..", "...", "a b", "x~0041"] {
            assert_eq!(id_unescape(&id_escape(id)).as_deref(), Some(id), "{id}");
        }
        for bad in [".", "..", "~0041", "~002f", "a/b", "~D83D", "~00"] {
            assert_eq!(id_unescape(bad), None, "{bad}");
        }
    }
}
