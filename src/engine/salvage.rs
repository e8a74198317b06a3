//! Getting the readable part out of a damaged session: the longest prefix
//! of whole batches whose records check out, and where and why it stops.
//! Never used by a normal read (damage there is an error); only when asked.

use super::error::{Error, Result, io_at, segment_error};
use super::handle::Store;
use crate::codec;
use crate::event::{Event, OwnedEvent};
use crate::header::SessionHeader;
use crate::lineage::Lineage;
use crate::segment::{self, Committed, ScanOptions, SegmentIdent};
use std::path::PathBuf;

/// What [`Store::salvage`] could read.
#[derive(Debug, Clone)]
pub struct Salvaged {
    /// The session's header.
    pub header: SessionHeader,
    /// The events of the readable prefix, whole batches only.
    pub events: Vec<OwnedEvent>,
    /// Where reading stopped, when it stopped before the end of the log.
    pub cut: Option<SalvageCut>,
}

/// Where a salvage stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SalvageCut {
    /// The segment file.
    pub segment: PathBuf,
    /// Byte offset of the first record not read.
    pub offset: u64,
    /// The seq the first event not read would have had.
    pub seq: u64,
    /// Why reading stopped there.
    pub reason: String,
}

impl Store {
    /// Reads what can be read of session `id` even when it is damaged: each
    /// segment in order, its records up to the first one whose frame,
    /// checksum or batch does not check out, and nothing after a gap. The
    /// session's `HEADER` must be readable. Nothing is written or cut; the
    /// damage stays for `verify` and a person to look at. A log with no
    /// damage comes back whole, with no cut.
    pub fn salvage(&self, id: &str) -> Result<Salvaged> {
        self.open_handle()?;
        let entry = self
            .entry(id)?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let vfs = &*self.inner.vfs;
        let lineage = Lineage::read_with(vfs, &entry.dir).map_err(|reason| Error::Corrupt {
            session: id.to_owned(),
            segment: entry.dir.join(crate::lineage::LINEAGE_FILE),
            offset: 0,
            reason,
        })?;
        let files = super::segfiles::list(
            vfs.read_dir(&entry.dir).map_err(io_at(&entry.dir))?,
            &entry.dir,
        );
        let mut events = Vec::new();
        let mut next = 0u64;
        let mut cut = None;
        let stop = |path: &PathBuf, offset: u64, seq: u64, reason: String| SalvageCut {
            segment: path.clone(),
            offset,
            seq,
            reason,
        };
        'segments: for (first_seq, path) in &files {
            if *first_seq != next {
                cut = Some(stop(
                    path,
                    0,
                    next,
                    format!(
                        "the segment holding seq {next} is missing (next one starts at seq {first_seq})"
                    ),
                ));
                break;
            }
            let ident = SegmentIdent {
                store_id: self.inner.store_id,
                session_uid: lineage.owner(*first_seq).unwrap_or(entry.uid),
                first_seq: *first_seq,
            };
            // A raw file found gone was compressed meanwhile: its image.
            let image = super::segfiles::is_image(path)
                || !vfs.exists(path)
                    && super::segfiles::image_of(path).is_some_and(|i| vfs.exists(&i));
            let (bytes, end, sealed) = if image {
                // A compressed sealed segment is usable whole or not at all:
                // its image decodes and checks whole, or the salvage stops.
                match self.read_seg_file(id, path, &ident) {
                    Ok((_, raw)) => {
                        let end = (raw.len() - segment::FOOTER_LEN) as u64;
                        (raw, end, true)
                    }
                    Err(e) => {
                        cut = Some(stop(path, 0, next, e.to_string()));
                        break;
                    }
                }
            } else {
                let file = vfs.open(path, false).map_err(io_at(path))?;
                let walked = segment::committed_end(
                    &*file,
                    &ident,
                    segment::HEADER_LEN as u64,
                    self.read_limit(),
                )
                .map_err(io_at(path))?;
                let bytes = vfs.read_file(path).map_err(io_at(path))?;
                match walked {
                    Committed::Records { end } => (bytes, end, false),
                    Committed::Sealed { end } => (bytes, end, true),
                }
            };
            let prefix = &bytes[..(end as usize).min(bytes.len())];
            let opts = ScanOptions {
                max_record: self.read_limit(),
                expect_sealed: false,
            };
            let scan = match segment::scan(prefix, &ident, &opts) {
                Ok(scan) => scan,
                Err(e) => {
                    let e = segment_error(id, path, e);
                    cut = Some(stop(path, segment::HEADER_LEN as u64, next, e.to_string()));
                    break;
                }
            };
            for b in &scan.batches {
                if b.first_seq != next {
                    cut = Some(stop(
                        path,
                        b.offset,
                        next,
                        format!("the record at this offset starts at seq {}", b.first_seq),
                    ));
                    break 'segments;
                }
                let r = b.codec_range();
                match codec::decode_batch(
                    &prefix[r.start as usize..r.end as usize],
                    b.first_seq,
                    b.count,
                    0,
                ) {
                    Ok(batch) => Event::into_owned_batch(batch, 0..u64::MAX, &mut events),
                    Err(e) => {
                        cut = Some(stop(
                            path,
                            b.offset,
                            next,
                            format!("the batch does not decode: {e}"),
                        ));
                        break 'segments;
                    }
                }
                next += u64::from(b.count);
            }
            let rest = &bytes[(end as usize).min(bytes.len())..];
            if !sealed && rest.iter().any(|&b| b != 0) {
                cut = Some(stop(
                    path,
                    end,
                    next,
                    "the record here is damaged or was never completely written".into(),
                ));
                break;
            }
        }
        Ok(Salvaged {
            header: entry.header,
            events,
            cut,
        })
    }
}
