//! Hot spares on an open store (ZED's retire agent, `zfs_retire.c`, which OpenZFS runs outside
//! the kernel; `spa_vdev_attach` with a spare; `zpool add … spare` and `zpool remove`): the
//! store adds and removes spares, puts one in for a leaf that faults or degrades, and lets it
//! go back once the leaf is replaced or returns (crate::pool's `spare.rs` changes the tree).
//!
//! The syncer checks after every sync ([`Store::retire_if_needed`]), so a spare goes in
//! within a txg's timeout of the leaf's fault, whether or not clients write. Activation is
//! an attach: the spare's labels are written first, then the tree is swapped under the sync
//! lock and synced at once, then every label is rewritten and a resilver copies every birth
//! onto the spare. A crash anywhere in it leaves either the tree before (the spare available,
//! its labels ahead, which import sets aside) or the tree after (the spare in use, resilvered
//! again from the start: it holds no txg): the pool directory of the txg the pool opens
//! decides, as for any change of leaves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Store, StoreError};
use crate::fm::EventClass;
use crate::pool::LeafSpec;

impl Store {
    /// Adds hot spares (`zpool add POOL spare DEV…`): their labels are written, then the
    /// config listing them is synced and every label rewritten. Returns their paths.
    pub async fn add_spares(&self, new: Vec<LeafSpec>) -> Result<Vec<String>, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        let txg = self.spa.pool().uberblock().txg + 1;
        let prepared = self.spa.pool().prepare_spares(new, txg).await?;
        let one_at_a_time = self.syncer.lock().await;
        let paths = self.spa.pool().install_spares(prepared)?;
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.spa.pool().write_labels(synced).await?;
        Ok(paths)
    }

    /// Removes an available hot spare (`zpool remove POOL DEV`): the config without it is
    /// synced, every label rewritten, and the spare's labels blanked. Returns its path.
    pub async fn remove_spare(&self, name: &str) -> Result<String, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        let one_at_a_time = self.syncer.lock().await;
        let gone = self.spa.pool().remove_spare(name)?;
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        let labels = self.spa.pool().write_labels(synced).await;
        self.spa.pool().blank_spare_labels(&gone).await;
        labels?;
        Ok(gone.path)
    }

    /// Puts spare `spare` (by guid) in for the leaf called `leaf`, and resilvers onto it.
    /// Returns the spare's path.
    pub async fn activate_spare(
        self: &Arc<Self>,
        leaf: &str,
        spare: u64,
    ) -> Result<String, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        let txg = self.spa.pool().uberblock().txg + 1;
        let prepared = self.spa.pool().prepare_activation(leaf, spare, txg).await?;
        let stands_in_for = prepared.stands_in_for.clone();
        self.spa.fail_point("retire.spare_prepared");
        let one_at_a_time = self.syncer.lock().await;
        let joined = self.spa.pool().install_activation(prepared)?;
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.spa.fail_point("retire.spare_synced");
        let labels = self.spa.pool().write_labels(synced).await;
        self.spa.pool().events().post(
            EventClass::VdevSpare,
            Some(&joined.path),
            vec![("stands_in_for", stands_in_for)],
        );
        self.resilver_if_needed();
        labels?;
        Ok(joined.path)
    }

    /// Starts [`Store::retire`] in a task when there is something for it to do and it is not
    /// running already: called after each sync, by the syncer (and by the schedule's checks).
    pub fn retire_if_needed(self: &Arc<Self>) {
        let pool = self.spa.pool();
        if pool.tree().config.spares.is_empty()
            || (pool.leaves_to_spare().is_empty() && pool.spares_to_return().is_empty())
            || self.retire_running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let weak = Arc::downgrade(self);
        pool.env().spawn("retire", async move {
            let Some(store) = weak.upgrade() else { return };
            store.retire().await;
            store.retire_running.store(false, Ordering::Release);
        });
    }

    /// What ZED's retire agent does: a spare in for each leaf that needs one
    /// (`Pool::leaves_to_spare`), and back to the available ones each spare whose leaf was
    /// replaced or has returned (`Pool::spares_to_return`). What fails is posted as a `retire`
    /// event and tried again after a later sync. Returns the spares put in and sent back.
    pub async fn retire(self: &Arc<Self>) -> (Vec<String>, Vec<String>) {
        let (mut put_in, mut back) = (Vec::new(), Vec::new());
        for (leaf, spare) in self.spa.pool().leaves_to_spare() {
            match self.activate_spare(&leaf, spare).await {
                Ok(path) => put_in.push(path),
                Err(error) => {
                    let error = crate::error_chain(&error);
                    self.spa.pool().events().post(
                        EventClass::Retire,
                        None,
                        vec![("error", format!("putting a spare in for {leaf}: {error}"))],
                    );
                }
            }
        }
        for spare in self.spa.pool().spares_to_return() {
            // Refused when the mirror or column went short meanwhile: tried again later.
            if let Ok(path) = self.detach_leaf(&spare).await {
                back.push(path);
            }
        }
        (put_in, back)
    }
}

/// Whether the store's retire task is running: one at a time.
pub(super) type RetireRunning = AtomicBool;
