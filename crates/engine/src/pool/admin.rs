//! Taking leaves out of service and back (ZFS: `vdev_offline`, `vdev_online`, `vdev_clear` in
//! `vdev.c`).
//!
//! These change a leaf's [`LeafState`] only; what a leaf missed while out of service is found
//! from the txgs it holds (crate::pool, `leaves_behind`) and copied back by a resilver, which
//! the store starts (crate::txg::dsl_scan). A leaf is found by its path as the pool knows it,
//! by the last part of that path, or by its guid in hex, as `pool status` prints them.
//!
//! What should outlive the process (a leaf taken offline without `-t`, a leaf faulted or
//! degraded by the diagnosis, every leaf's error counts) goes into each txg's pool directory
//! as leaf records ([`Pool::leaf_records`]) and is put back at import
//! ([`Pool::apply_leaf_records`]). A leaf faulted because its device was gone is not kept: the
//! next import looks for the device again.
//!
//! The refusals are zpool's: a leaf whose vdev would be left without a copy of everything
//! (a lone leaf, or a mirror whose other children are out of service or behind) cannot be
//! taken offline, and a leaf that was missing at import cannot come online until the pool is
//! imported again with its device.

use sluice_format::{LeafRecord, LeafRecordState};

use super::{Pool, PoolError, PoolLeaf};
use crate::vdev::{FaultReason, LeafState};

impl Pool {
    /// The leaf called `name`: its path, the last part of its path, or its guid in hex.
    pub fn find_leaf(&self, name: &str) -> Result<PoolLeaf, PoolError> {
        let leaves = self.leaves();
        let file_name = |path: &str| path.rsplit('/').next().map(str::to_owned);
        let by = |f: &dyn Fn(&PoolLeaf) -> bool| leaves.iter().filter(|l| f(l)).cloned().collect();
        let candidates: Vec<PoolLeaf> = [
            by(&|l| l.path == name),
            by(&|l| format!("{:016x}", l.guid) == name || format!("{:x}", l.guid) == name),
            by(&|l| file_name(&l.path).as_deref() == Some(name)),
        ]
        .into_iter()
        .find(|found: &Vec<PoolLeaf>| !found.is_empty())
        .unwrap_or_default();
        match candidates.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(PoolError::NoSuchLeaf {
                pool: self.name.clone(),
                leaf: name.to_owned(),
                leaves: leaves.iter().map(|l| l.path.as_str()).collect::<Vec<_>>().join(", "),
            }),
            several => Err(PoolError::NoSuchLeaf {
                pool: self.name.clone(),
                leaf: name.to_owned(),
                leaves: format!(
                    "{} match; name one by its full path or guid",
                    several.iter().map(|l| l.path.as_str()).collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// Takes a leaf out of service (`zpool offline`): it gets no I/O until [`Pool::online`].
    /// `temporary` (`-t`) ends it at the next import; otherwise the pool directory keeps it
    /// offline from the next sync on. Refused when no other leaf of its vdev holds
    /// everything.
    pub fn offline(&self, name: &str, temporary: bool) -> Result<PoolLeaf, PoolError> {
        let _one_change = self.admin.lock();
        let leaf = self.find_leaf(name)?;
        if leaf.leaf.state() == LeafState::Offline {
            let mut state = self.state.lock();
            if temporary {
                state.offline_kept.remove(&leaf.guid);
            } else {
                state.offline_kept.insert(leaf.guid);
            }
            return Ok(leaf);
        }
        if !self.has_complete_copy(&self.tree(), leaf.top, Some(leaf.guid)) {
            return Err(PoolError::NoValidReplicas {
                pool: self.name.clone(),
                leaf: leaf.path.clone(),
                action: "offline",
            });
        }
        leaf.leaf.set_state(LeafState::Offline);
        if !temporary {
            self.state.lock().offline_kept.insert(leaf.guid);
        }
        Ok(leaf)
    }

    /// Returns a leaf to service (`zpool online`); a faulted one too, as its device may be
    /// back. The store resilvers what it missed.
    pub fn online(&self, name: &str) -> Result<PoolLeaf, PoolError> {
        let _one_change = self.admin.lock();
        let leaf = self.find_leaf(name)?;
        if !leaf.present {
            return Err(PoolError::LeafMissing {
                pool: self.name.clone(),
                leaf: leaf.path.clone(),
            });
        }
        // A leaf brought back starts its diagnosis afresh: the errors that faulted it were
        // the device's before whatever the administrator did about it.
        leaf.leaf.clear_diagnosis();
        leaf.leaf.set_state(LeafState::Online);
        self.state.lock().offline_kept.remove(&leaf.guid);
        Ok(leaf)
    }

    /// Clears the error counts of one leaf, or of every leaf (`zpool clear`), and returns a
    /// faulted or degraded leaf to service: if its device still fails, the errors fault it
    /// again. An offline leaf stays offline.
    pub fn clear(&self, name: Option<&str>) -> Result<Vec<PoolLeaf>, PoolError> {
        let _one_change = self.admin.lock();
        // Spares and leaves the retire agent was leaving alone are tried again.
        self.clear_retire_skips();
        let leaves = match name {
            Some(name) => vec![self.find_leaf(name)?],
            None => self.leaves().to_vec(),
        };
        for leaf in &leaves {
            leaf.leaf.clear_errors();
            leaf.leaf.clear_diagnosis();
            self.events.post(crate::fm::EventClass::VdevClear, Some(&leaf.path), Vec::new());
            let state = leaf.leaf.state();
            let back = matches!(state, LeafState::Degraded)
                || (state == LeafState::Faulted(FaultReason::TooManyErrors))
                || (state == LeafState::Faulted(FaultReason::Gone) && leaf.present);
            if back {
                leaf.leaf.set_state(LeafState::Online);
            }
        }
        Ok(leaves)
    }

    /// Each leaf's record for the pool directory of the txg being synced.
    pub fn leaf_records(&self) -> Vec<LeafRecord> {
        let leaves = self.leaves();
        let kept = self.state.lock();
        leaves
            .iter()
            .map(|l| {
                let [read_errors, write_errors, checksum_errors] = l.leaf.errors();
                let state = match l.leaf.state() {
                    LeafState::Degraded => LeafRecordState::Degraded,
                    LeafState::Faulted(FaultReason::TooManyErrors) => LeafRecordState::Faulted,
                    LeafState::Offline if kept.offline_kept.contains(&l.guid) => {
                        LeafRecordState::Offline
                    }
                    _ => LeafRecordState::Online,
                };
                LeafRecord {
                    guid: l.guid,
                    state,
                    replaced_by: kept.replaced.get(&l.guid).copied().unwrap_or(0),
                    read_errors,
                    write_errors,
                    checksum_errors,
                }
            })
            .collect()
    }

    /// Puts back what the directory opened at import recorded of each leaf: its error counts,
    /// and a state set by the administrator or the diagnosis. A leaf whose device is missing
    /// stays faulted as missing, whatever was recorded, but keeps an offline.
    pub fn apply_leaf_records(&self, records: &[LeafRecord]) {
        let leaves = self.leaves();
        let mut state = self.state.lock();
        for record in records {
            let Some(leaf) = leaves.iter().find(|l| l.guid == record.guid) else { continue };
            leaf.leaf.carry_errors([
                record.read_errors,
                record.write_errors,
                record.checksum_errors,
            ]);
            if record.replaced_by != 0 && leaves.iter().any(|l| l.guid == record.replaced_by) {
                state.replaced.insert(leaf.guid, record.replaced_by);
            }
            match record.state {
                LeafRecordState::Online => {}
                LeafRecordState::Offline => {
                    leaf.leaf.set_state(LeafState::Offline);
                    state.offline_kept.insert(leaf.guid);
                }
                LeafRecordState::Faulted if leaf.present => {
                    leaf.leaf.set_state(LeafState::Faulted(FaultReason::TooManyErrors));
                }
                LeafRecordState::Degraded if leaf.present => {
                    leaf.leaf.set_state(LeafState::Degraded);
                }
                LeafRecordState::Faulted | LeafRecordState::Degraded => {}
            }
        }
        let synced = state.uberblock.txg;
        Self::mark_behind(&leaves, &state, synced);
    }
}
