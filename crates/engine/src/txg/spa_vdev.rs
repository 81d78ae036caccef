//! Leaf administration on an open store (ZFS: `spa_vdev_*` in `spa.c`, with `vdev_online`,
//! `vdev_offline` and `vdev_clear`): the pool changes the leaf's state, and the store makes
//! sure what the leaf missed is copied back.
//!
//! A leaf returning to service (online, or cleared after a fault) takes every write from that
//! moment. What it missed before is in synced trees only once the open txg syncs, including
//! blocks written in place ahead of their txg (large sync writes), so the store syncs first
//! and then starts a resilver of every block born after the last txg the leaf holds, up to
//! that sync (crate::txg::dsl_scan).

use std::sync::Arc;

use super::{Store, StoreError};

impl Store {
    /// Takes a leaf out of service until [`Store::online_leaf`] (`zpool offline -t`). Returns
    /// its path.
    pub fn offline_leaf(&self, name: &str) -> Result<String, StoreError> {
        Ok(self.pool.offline(name)?.path)
    }

    /// Returns a leaf to service and resilvers what it missed (`zpool online`). Returns its
    /// path and whether a resilver started.
    pub async fn online_leaf(self: &Arc<Self>, name: &str) -> Result<(String, bool), StoreError> {
        let leaf = self.pool.online(name)?;
        self.sync().await?;
        Ok((leaf.path, self.resilver_if_needed()))
    }

    /// Clears error counts (of one leaf or all) and returns faulted leaves to service,
    /// resilvering what they missed (`zpool clear`). Returns the paths cleared and whether a
    /// resilver started.
    pub async fn clear_leaves(
        self: &Arc<Self>,
        name: Option<&str>,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let leaves = self.pool.clear(name)?;
        self.sync().await?;
        Ok((leaves.into_iter().map(|l| l.path).collect(), self.resilver_if_needed()))
    }
}
