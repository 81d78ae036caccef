//! Hot spares on an open store (ZED's retire agent, `zfs_retire.c`, which OpenZFS runs outside
//! the kernel; `spa_vdev_attach` with a spare; `zpool add … spare` and `zpool remove`): the
//! store adds and removes spares, puts one in for a leaf that faults or degrades, and lets it
//! go back once the leaf is replaced or returns (crate::pool's `spare.rs` changes the tree).
//!
//! With the pool property `autoreplace` on (ZFS's too), a new device found at the path of a
//! faulted or missing leaf replaces it (`zpool replace POOL LEAF` done by the pool itself):
//! the device is found through the opener the server gives the store
//! ([`Store::set_device_opener`]; the simulator's tests give their own), and only one that
//! holds nothing (no labels, no filesystem, no data where labels go) is taken.
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
        let autoreplace = pool.properties().autoreplace
            && self.device_opener.lock().is_some()
            && !pool.leaves_to_autoreplace().is_empty();
        let has_spares = !pool.tree().config.spares.is_empty();
        let spares = has_spares
            && (!pool.leaves_to_spare().is_empty() || !pool.spares_to_return().is_empty());
        if !(autoreplace || spares) || self.retire_running.swap(true, Ordering::AcqRel) {
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
        self.autoreplace().await;
        for (leaf, spare) in self.spa.pool().leaves_to_spare() {
            match self.activate_spare(&leaf, spare).await {
                Ok(path) => put_in.push(path),
                Err(error) => {
                    // Not tried after every sync: the next spare is, until `pool clear`.
                    self.spa.pool().skip_spare(spare);
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

/// Opens the device now at a leaf's path, if there is one: how `autoreplace` finds a disk
/// swapped in (the server opens files and block devices; a test gives simulated ones).
pub type DeviceOpener = Arc<dyn Fn(&str) -> Option<LeafSpec> + Send + Sync>;

impl Store {
    /// Gives the store the way to open a device by path, for `autoreplace`.
    pub fn set_device_opener(&self, opener: DeviceOpener) {
        *self.device_opener.lock() = Some(opener);
    }

    /// Sets the pool property `autoreplace`. Durable when this returns.
    pub async fn set_autoreplace(&self, on: bool) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let pool = self.spa.pool();
        if !pool.config().properties {
            pool.activate_properties(pool.uberblock().txg + 1).await?;
        }
        pool.update_properties(|p| p.autoreplace = on);
        self.sync().await?;
        Ok(())
    }

    /// With `autoreplace` on: each faulted or missing leaf whose path now opens a device that
    /// holds nothing is replaced by it. Returns the paths replaced.
    pub async fn autoreplace(self: &Arc<Self>) -> Vec<String> {
        let pool = self.spa.pool();
        let opener = self.device_opener.lock().clone();
        let Some(opener) = opener.filter(|_| pool.properties().autoreplace) else {
            return Vec::new();
        };
        let mut replaced = Vec::new();
        for (guid, path) in pool.leaves_to_autoreplace() {
            let Some(spec) = opener(&path) else { continue };
            // Only an empty device: one that holds anything is someone's.
            match crate::pool::probe::probe(spec.device.as_ref()).await {
                Ok(None) => {}
                _ => continue,
            }
            match self.replace_leaf(&path, spec).await {
                Ok(_) => replaced.push(path),
                Err(error) => {
                    pool.skip_autoreplace(guid);
                    let error = crate::error_chain(&error);
                    pool.events().post(
                        EventClass::Retire,
                        Some(&path),
                        vec![("error", format!("autoreplace of {path}: {error}"))],
                    );
                }
            }
        }
        replaced
    }
}

/// Where the store keeps its [`DeviceOpener`], once given one.
#[derive(Default)]
pub(super) struct OpenerSlot(parking_lot::Mutex<Option<DeviceOpener>>);

impl OpenerSlot {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Option<DeviceOpener>> {
        self.0.lock()
    }
}

impl std::fmt::Debug for OpenerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let given = self.0.lock().is_some();
        f.debug_struct("OpenerSlot").field("given", &given).finish()
    }
}

/// Whether the store's retire task is running: one at a time.
pub(super) type RetireRunning = AtomicBool;
