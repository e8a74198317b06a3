//! Ownership of a session across hosts (`format-spec.md` section 10.3).
//!
//! A session's lease is a sequence of records `<prefix>/leases/<dir>/<epoch>`
//! (epoch as 20 digits), each written once with a create-if-absent put
//! (`If-None-Match: *` on S3, a no-replace link on the local file system):
//! the record with the highest epoch says who owns the session. Taking the
//! lease is creating the next epoch's record, so of two hosts racing for one
//! epoch exactly one create succeeds: a compare-and-swap built from the one
//! conditional write every `object_store` backend has (the local file
//! system's has no `If-Match`). A record is never changed after it is
//! written; old epochs are deleted once a newer one exists.

use super::{Archive, archive_error};
use crate::engine::error::{Error, Result};

/// One lease record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct LeaseRecord {
    /// The host that wrote it.
    pub(super) host: String,
    /// Its epoch (also in its key).
    pub(super) epoch: u64,
    /// The host gave the session up (`close`): the next host may take it
    /// without forcing.
    pub(super) released: bool,
    /// The host deleted the session (a tombstone, always `released`): a
    /// store whose copy predates it may not write that copy back. Absent
    /// from the JSON when false (records before 2026-12-07 never have it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) deleted: bool,
}

/// What taking a lease found.
pub(super) struct Taken {
    /// The epoch now held.
    pub(super) epoch: u64,
    /// The record before ours (`None`: the session had no lease).
    pub(super) previous: Option<LeaseRecord>,
}

impl Archive {
    /// The current lease record of session directory `dir`. Only keys that
    /// are exactly a record's (`<prefix>/leases/<dir>/<20 digits>`) count:
    /// anything else a bucket holds under the prefix is ignored, so no
    /// listing can make this loop or pick a record it cannot read.
    pub(super) fn current_lease(&self, id: &str, dir: &str) -> Result<Option<LeaseRecord>> {
        let prefix = self.opts.lease_prefix(dir);
        // A record deleted between the listing and the read is older than
        // a newer one (only those are deleted): look again, a few times.
        for _ in 0..8 {
            let listed = self
                .list(&prefix)
                .map_err(|e| archive_error(Some(id), &prefix, "listing the lease", e))?;
            let Some(epoch) = listed
                .iter()
                .filter_map(|(k, _)| {
                    let epoch = k.filename()?.parse::<u64>().ok()?;
                    (*k == self.opts.lease_key(dir, epoch)).then_some(epoch)
                })
                .max()
            else {
                return Ok(None);
            };
            let key = self.opts.lease_key(dir, epoch);
            let bytes = self
                .get(&key)
                .map_err(|e| archive_error(Some(id), &key, "reading the lease", e))?;
            let Some(bytes) = bytes else {
                continue;
            };
            let rec: LeaseRecord = serde_json::from_slice(&bytes)
                .map_err(|e| archive_error(Some(id), &key, "decoding the lease", e))?;
            if rec.epoch != epoch {
                return Err(Error::Archive {
                    session: Some(id.to_owned()),
                    key: key.to_string(),
                    reason: format!(
                        "the lease record says epoch {}, its key {epoch}: damaged; `take-over` writes a new one",
                        rec.epoch
                    ),
                });
            }
            return Ok(Some(rec));
        }
        Err(Error::Archive {
            session: Some(id.to_owned()),
            key: prefix.to_string(),
            reason: "the newest lease record vanished on every read; try again".into(),
        })
    }

    /// Writes the record of `epoch` if no one has; `false` if someone had.
    fn create_record(&self, id: &str, dir: &str, rec: &LeaseRecord) -> Result<bool> {
        let key = self.opts.lease_key(dir, rec.epoch);
        let body = serde_json::to_vec(rec).expect("a lease record serialises");
        let put = self.put_if_absent(&key, body);
        // `false` may also be our own record, written by a try whose answer
        // was lost: the caller reads the lease again and finds it ours.
        put.map_err(|e| archive_error(Some(id), &key, "writing the lease", e))
    }

    /// Takes the lease of session `id` (directory `dir`) for this host:
    /// kept if this host holds it, taken if it is free or released (or,
    /// with `force`, from whoever holds it), else [`Error::NotOwner`].
    /// `stale_copy`: this store has a published copy of the session, which
    /// a tombstone (the session deleted since) makes
    /// [`Error::DeletedElsewhere`] unless forced.
    pub(super) fn take_lease(
        &self,
        id: &str,
        dir: &str,
        force: bool,
        stale_copy: bool,
    ) -> Result<Taken> {
        // A few rounds: each lost race means another host wrote an epoch,
        // which the next round reads.
        for _ in 0..4 {
            let cur = self.current_lease(id, dir)?;
            let next = match &cur {
                Some(r) if r.deleted && stale_copy && !force => {
                    return Err(self.deleted_elsewhere(id, dir, r));
                }
                Some(r) if r.host == self.host && !r.released => {
                    return Ok(Taken {
                        epoch: r.epoch,
                        previous: cur,
                    });
                }
                Some(r) if r.released || force => {
                    r.epoch.checked_add(1).ok_or_else(|| Error::Archive {
                        session: Some(id.to_owned()),
                        key: self.opts.lease_key(dir, r.epoch).to_string(),
                        reason: "the lease epoch is at its maximum: damaged".into(),
                    })?
                }
                Some(r) => return Err(self.not_owner(id, dir, r)),
                None => 1,
            };
            let rec = LeaseRecord {
                host: self.host.clone(),
                epoch: next,
                released: false,
                deleted: false,
            };
            if self.create_record(id, dir, &rec)? {
                // Ours only if it is the newest record: a slow host can
                // create an epoch a newer holder already pruned. Otherwise
                // the next round reads the newest one.
                match self.current_lease(id, dir)? {
                    Some(r) if r.epoch == next && r.host == self.host && !r.released => {
                        self.prune(dir, next);
                        return Ok(Taken {
                            epoch: next,
                            previous: cur,
                        });
                    }
                    _ => continue,
                }
            }
        }
        match self.current_lease(id, dir)? {
            Some(r) if r.host != self.host => Err(self.not_owner(id, dir, &r)),
            _ => Err(Error::Archive {
                session: Some(id.to_owned()),
                key: self.opts.lease_prefix(dir).to_string(),
                reason: "the lease changed hands on every try; try again".into(),
            }),
        }
    }

    /// Gives the lease of `dir` (held at `epoch`) up: the next host takes it
    /// without forcing. Nothing happens if another host took it meanwhile.
    pub(super) fn release_lease(&self, id: &str, dir: &str, epoch: u64) -> Result<()> {
        self.end_lease(id, dir, epoch, false)
    }

    /// Gives the lease of `dir` (held at `epoch`) up as a tombstone: the
    /// session was deleted (its objects are gone).
    pub(super) fn tombstone(&self, id: &str, dir: &str, epoch: u64) -> Result<()> {
        self.end_lease(id, dir, epoch, true)
    }

    fn end_lease(&self, id: &str, dir: &str, epoch: u64, deleted: bool) -> Result<()> {
        let Some(next) = epoch.checked_add(1) else {
            return Ok(()); // a damaged epoch: nothing to give up
        };
        let rec = LeaseRecord {
            host: self.host.clone(),
            epoch: next,
            released: true,
            deleted,
        };
        if self.create_record(id, dir, &rec)? {
            self.prune(dir, next);
        }
        Ok(())
    }

    /// Whether this host still holds `dir`'s lease at `epoch`; the record
    /// that replaced it if not.
    pub(super) fn check_lease(
        &self,
        id: &str,
        dir: &str,
        epoch: u64,
    ) -> Result<std::result::Result<(), LeaseRecord>> {
        match self.current_lease(id, dir)? {
            Some(r) if r.epoch == epoch && r.host == self.host => Ok(Ok(())),
            Some(r) => Ok(Err(r)),
            None => Ok(Err(LeaseRecord {
                host: String::new(),
                epoch: 0,
                released: true,
                deleted: false,
            })),
        }
    }

    /// Deletes the records before `epoch - 1` (best effort: a leftover
    /// old record is never the highest, so it is harmless). The one just
    /// before stays, so a reader that listed before our create still finds
    /// a record to read.
    fn prune(&self, dir: &str, epoch: u64) {
        for old in epoch.saturating_sub(3)..epoch.saturating_sub(1) {
            if old == 0 {
                continue;
            }
            let key = self.opts.lease_key(dir, old);
            let _ = self.call(|s| {
                let key = key.clone();
                async move { s.delete(&key).await }
            });
        }
    }

    /// The error for a copy of session `id` whose lease record `rec` is a
    /// tombstone: deleted elsewhere since the copy was made.
    pub(super) fn deleted_elsewhere(&self, id: &str, dir: &str, rec: &LeaseRecord) -> Error {
        Error::DeletedElsewhere {
            session: id.to_owned(),
            host: rec.host.clone(),
            epoch: rec.epoch,
            key: self.opts.lease_key(dir, rec.epoch).to_string(),
        }
    }

    /// The error for a session `rec` says another host owns.
    pub(super) fn not_owner(&self, id: &str, dir: &str, rec: &LeaseRecord) -> Error {
        Error::NotOwner {
            session: id.to_owned(),
            owner: rec.host.clone(),
            epoch: rec.epoch,
            key: self.opts.lease_key(dir, rec.epoch).to_string(),
        }
    }
}
