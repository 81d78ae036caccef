//! Taking leaves out of service and back (ZFS: `vdev_offline`, `vdev_online`, `vdev_clear` in
//! `vdev.c`).
//!
//! These change a leaf's [`LeafState`] only; what a leaf missed while out of service is found
//! from the txgs it holds (crate::pool, `leaves_behind`) and copied back by a resilver, which
//! the store starts (crate::txg::dsl_scan). A leaf is found by its path as the pool knows it,
//! by the last part of that path, or by its guid in hex, as `pool status` prints them.
//!
//! The refusals are zpool's: a leaf whose vdev would be left without a copy of everything
//! (a lone leaf, or a mirror whose other children are out of service or behind) cannot be
//! taken offline, and a leaf that was missing at import cannot come online until the pool is
//! imported again with its device.

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

    /// Takes a leaf out of service (`zpool offline -t`): it gets no I/O until
    /// [`Pool::online`]. Refused when no other leaf of its vdev holds everything.
    pub fn offline(&self, name: &str) -> Result<PoolLeaf, PoolError> {
        let _one_change = self.admin.lock();
        let leaf = self.find_leaf(name)?;
        if leaf.leaf.state() == LeafState::Offline {
            return Ok(leaf);
        }
        if !self.has_other_copy(&leaf) {
            return Err(PoolError::NoValidReplicas {
                pool: self.name.clone(),
                leaf: leaf.path.clone(),
                action: "offline",
            });
        }
        leaf.leaf.set_state(LeafState::Offline);
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
        Ok(leaf)
    }

    /// Clears the error counts of one leaf, or of every leaf (`zpool clear`), and returns a
    /// faulted or degraded leaf to service: if its device still fails, the errors fault it
    /// again. An offline leaf stays offline.
    pub fn clear(&self, name: Option<&str>) -> Result<Vec<PoolLeaf>, PoolError> {
        let _one_change = self.admin.lock();
        let leaves = match name {
            Some(name) => vec![self.find_leaf(name)?],
            None => self.leaves().to_vec(),
        };
        for leaf in &leaves {
            leaf.leaf.clear_errors();
            leaf.leaf.clear_diagnosis();
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

    /// Whether another leaf of `leaf`'s vdev is in service and holds every synced txg.
    fn has_other_copy(&self, leaf: &PoolLeaf) -> bool {
        let leaves = self.leaves();
        let state = self.state.lock();
        let txg = state.uberblock.txg;
        leaves.iter().any(|other| {
            other.top == leaf.top
                && other.guid != leaf.guid
                && other.present
                && !other.leaf.is_out_of_service()
                && state.leaf_txg.get(&other.guid).copied().unwrap_or(0) >= txg
        })
    }
}
