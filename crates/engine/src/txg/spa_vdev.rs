//! Leaf administration on an open store (ZFS: `spa_vdev_*` in `spa.c`, with `vdev_online`,
//! `vdev_offline` and `vdev_clear`): the pool changes the leaf's state or the vdev tree, and
//! the store makes sure what a leaf misses is copied onto it.
//!
//! A leaf returning to service (online, or cleared after a fault) takes every write from that
//! moment. What it missed before is in synced trees only once the open txg syncs, including
//! blocks written in place ahead of their txg (large sync writes), so the store syncs first
//! and then starts a resilver of every block born after the last txg the leaf holds, up to
//! that sync (crate::txg::dsl_scan).
//!
//! A format feature is enabled on the pool (`pool upgrade`) as a change of the tree's config:
//! every label is rewritten, then a sync writes it into the pool directory
//! ([`Store::enable_features`]).
//!
//! A log device's removal empties it of log blocks by moving the chains, then leaves a hole
//! ([`Store::remove_log`]).
//!
//! A change of leaves (attach, detach, replace; crate::pool `attach.rs`) swaps the tree while
//! holding the sync lock and syncs at once, so the txg that first carries the new tree in its
//! pool directory is the one the new labels name; then every label is rewritten. A replaced
//! leaf is detached once its replacement's resilver has finished, checked after every sync
//! ([`Store::resilver_if_needed`]) and when the store starts serving.

use std::sync::Arc;

use super::{Store, StoreError};

/// A log device being removed ([`Store::remove_log`]): while this lives, the allocator places
/// no log block on it; dropped before [`Removing::done`] (an error, or the removal's caller
/// gone), the device takes log blocks again and the chain restart not yet run is called off.
struct Removing<'a> {
    store: &'a Store,
    vdev: u32,
    done: bool,
}

impl<'a> Removing<'a> {
    fn start(store: &'a Store, vdev: u32) -> Removing<'a> {
        store.spa.allocator().lock().set_removing(vdev, true);
        Removing { store, vdev, done: false }
    }

    /// The device is a hole now: nothing to undo.
    fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Removing<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.store.spa.allocator().lock().set_removing(self.vdev, false);
            self.store.zil.take_restart();
        }
    }
}

/// The most syncs [`Store::remove_log`] runs for a log device to empty: one moves the chains,
/// one frees their blocks, [`crate::alloc::FREE_DEFER_TXGS`] see the frees through, and two
/// spare for a sync that a commit's fallback ran in between.
const REMOVAL_SYNCS_MAX: u64 = crate::alloc::FREE_DEFER_TXGS + 4;
use crate::fm::EventClass;
use crate::pool::LeafSpec;

impl Store {
    /// Takes a leaf out of service until [`Store::online_leaf`] (`zpool offline`); unless
    /// `temporary`, across imports too, from the next sync on. Returns its path.
    pub async fn offline_leaf(&self, name: &str, temporary: bool) -> Result<String, StoreError> {
        let path = self.spa.pool().offline(name, temporary)?.path;
        if !temporary {
            // The directory records it: written now, so an export or a crash right after
            // still finds the leaf offline.
            self.sync().await?;
        }
        Ok(path)
    }

    /// Returns a leaf to service and resilvers what it missed (`zpool online`). Returns its
    /// path and whether a resilver started.
    pub async fn online_leaf(self: &Arc<Self>, name: &str) -> Result<(String, bool), StoreError> {
        let leaf = self.spa.pool().online(name)?;
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
        let leaves = self.spa.pool().clear(name)?;
        self.sync().await?;
        Ok((leaves.into_iter().map(|l| l.path).collect(), self.resilver_if_needed()))
    }

    /// Adds `new` to the vdev of leaf `existing` (`zpool attach`): a lone leaf becomes a
    /// mirror, a mirror gets wider. A resilver copies everything onto it in the background.
    pub async fn attach_leaf(
        self: &Arc<Self>,
        existing: &str,
        new: LeafSpec,
    ) -> Result<String, StoreError> {
        self.add_leaf(existing, new, false).await
    }

    /// Replaces leaf `old` by `new` (`zpool replace`): `new` is attached beside it and
    /// resilvered in the background, and `old` is detached when that has finished. `old` may
    /// be faulted or missing, as long as another leaf of its vdev holds everything.
    pub async fn replace_leaf(
        self: &Arc<Self>,
        old: &str,
        new: LeafSpec,
    ) -> Result<String, StoreError> {
        self.add_leaf(old, new, true).await
    }

    async fn add_leaf(
        self: &Arc<Self>,
        existing: &str,
        new: LeafSpec,
        replacing: bool,
    ) -> Result<String, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        // Labels and the log region (up to hundreds of MiB on a file) are written before the
        // sync lock is taken: syncs, and writers waiting on them, go on meanwhile.
        let txg = self.spa.pool().uberblock().txg + 1;
        let prepared = self.spa.pool().prepare_attach(existing, new, txg, replacing).await?;
        let one_at_a_time = self.syncer.lock().await;
        let (leaf, dropped) = self.spa.pool().install_attach(prepared)?;
        self.spa.fail_point("spa_vdev.attach_synced");
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.spa.fail_point("spa_vdev.attach_labels");
        let labels = self.spa.pool().write_labels(synced).await;
        if let Some(dropped) = dropped {
            // A RAID-Z leaf a spare stood in for: the spare took its column.
            self.retire_detached(&dropped, false).await;
        }
        self.spa.pool().events().post(
            EventClass::VdevAttach,
            Some(&leaf.path),
            vec![
                ("existing", existing.to_owned()),
                ("replacing", if replacing { "1" } else { "0" }.to_owned()),
            ],
        );
        self.resilver_if_needed();
        labels?;
        Ok(leaf.path)
    }

    /// Adds top-level vdevs (`zpool add`): leaves, mirrors, RAID-Z vdevs, separate log
    /// devices (crate::pool's add.rs). Their labels first, then the tree and the allocator
    /// under the sync lock and a sync at once; then every label is rewritten. Returns the new
    /// leaves' paths.
    pub async fn add_vdevs(
        &self,
        tops: Vec<crate::pool::TopSpec>,
    ) -> Result<Vec<String>, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        let txg = self.spa.pool().uberblock().txg + 1;
        let prepared = self.spa.pool().prepare_add(tops, txg).await?;
        let one_at_a_time = self.syncer.lock().await;
        let (paths, spaces) = self.spa.pool().install_add(prepared)?;
        {
            let mut allocator = self.spa.allocator().lock();
            for &(area, geometry, log) in &spaces {
                allocator.add_vdev(area, geometry, log);
            }
        }
        self.syncer.add_vdevs(spaces.len());
        self.spa.fail_point("spa_vdev.add_installed");
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        let labels = self.spa.pool().write_labels(synced).await;
        for path in &paths {
            self.spa.pool().events().post(EventClass::VdevAdd, Some(path), Vec::new());
        }
        labels?;
        Ok(paths)
    }

    /// Removes a separate log device (`zpool remove POOL LOG`; crate::pool's remove.rs): no
    /// log block is placed on it from now on, the next sync moves every volume's chain to a
    /// new one, and syncs follow until the device holds no live log block (the old chains'
    /// blocks freed and past their deferral: a few txgs). Commits meanwhile fall back to txg
    /// syncs, as they do while a new chain waits for its first sync. Then, under the sync
    /// lock, the vdev becomes a hole in the tree and the allocator, a sync records that, every
    /// label is rewritten and the removed leaves' labels are blanked. Returns their paths.
    pub async fn remove_log(&self, name: &str) -> Result<Vec<String>, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        let vdev = self.spa.pool().find_log_device(name)?;
        if let Some(volume) = self.zil.deferred_on(vdev).into_iter().next() {
            return Err(StoreError::LogAwaitsKey {
                pool: self.spa.pool().name().to_owned(),
                volume,
                what: "the removal of a log device holding its records",
            });
        }
        // Until the hole is in, an error or a caller that gives up (its future dropped)
        // leaves the device taking log blocks again.
        let removing = Removing::start(self, vdev);
        self.zil.restart_chains();
        let emptied = self.empty_log_device(vdev).await;
        let one_at_a_time = self.syncer.lock().await;
        let held = self.spa.allocator().lock().log_held_on(vdev);
        emptied?;
        if held != 0 {
            return Err(StoreError::Pool(crate::pool::PoolError::CannotRemove {
                pool: self.spa.pool().name().to_owned(),
                device: name.to_owned(),
                reason: format!(
                    "{held} bytes of intent-log blocks are still live on it after \
                     {REMOVAL_SYNCS_MAX} syncs; try again (pool events may say why)"
                ),
            }));
        }
        let gone = self.spa.pool().install_log_removal(vdev)?;
        self.spa.allocator().lock().remove_vdev(vdev);
        removing.done();
        self.spa.fail_point("spa_vdev.remove_installed");
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.spa.fail_point("spa_vdev.remove_labels");
        // Blanked only once the other labels no longer name them: a leaf blanked while some
        // label still lists it would be missing at the next import. Left as they are, an
        // import drops them (`Pool::adopt_config`).
        self.spa.pool().write_labels(synced).await?;
        for leaf in &gone {
            self.retire_removed(leaf).await;
        }
        Ok(gone.into_iter().map(|l| l.path).collect())
    }

    /// Syncs until log device `vdev` holds no live log block, at most
    /// [`REMOVAL_SYNCS_MAX`] times: the first moves every chain off it, the next frees the
    /// old chains' blocks, and those after see the frees' deferral out.
    async fn empty_log_device(&self, vdev: u32) -> Result<(), StoreError> {
        for _ in 0..REMOVAL_SYNCS_MAX {
            self.sync().await?;
            if self.spa.allocator().lock().log_held_on(vdev) == 0 {
                break;
            }
        }
        Ok(())
    }

    /// The end of a removed log leaf: I/O already under way drained (for up to ten seconds),
    /// its labels blanked, the event posted.
    async fn retire_removed(&self, gone: &crate::pool::PoolLeaf) {
        self.drain(gone).await;
        self.spa.pool().blank_labels(gone).await;
        self.spa.pool().events().post(EventClass::VdevRemove, Some(&gone.path), Vec::new());
    }

    /// Waits for I/O under way on a leaf that left the tree, for up to ten seconds: a dead
    /// device may never answer.
    async fn drain(&self, gone: &crate::pool::PoolLeaf) {
        for _ in 0..10_000 {
            if gone.leaf.pending() == 0 {
                break;
            }
            self.spa.pool().env().sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Enables every format feature this build can add to the pool (`zpool upgrade`; crate::pool
    /// `zfeature.rs`) and syncs, so the pool directory lists them too. Returns the features
    /// enabled, none when it had them all. Durable when this returns; from then on builds
    /// that do not know them refuse the pool by their names.
    pub async fn enable_features(&self) -> Result<Vec<&'static str>, StoreError> {
        self.spa.check_live()?;
        let pool = self.spa.pool();
        let enabled = pool.enable_features(pool.uberblock().txg + 1).await?;
        if !enabled.is_empty() {
            self.sync().await?;
        }
        Ok(enabled)
    }

    /// Takes leaf `name` out of its mirror for good (`zpool detach`): its labels are blanked.
    /// Returns its path.
    pub async fn detach_leaf(&self, name: &str) -> Result<String, StoreError> {
        self.spa.check_live()?;
        let _one_change = self.spa.lock_vdevs().await;
        let one_at_a_time = self.syncer.lock().await;
        let (gone, spare) = self.spa.pool().detach(name)?;
        let synced = self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.spa.fail_point("spa_vdev.detach_labels");
        // A spare's labels are rewritten here as an available spare's.
        let labels = self.spa.pool().write_labels(synced).await;
        self.retire_detached(&gone, spare).await;
        labels?;
        Ok(gone.path)
    }

    /// The end of a leaf's detach, after the sync: its labels blanked (I/O already under way
    /// on the old tree drained first, for up to ten seconds: a dead device may never answer),
    /// unless it is a spare going back to the available ones, whose labels were rewritten.
    async fn retire_detached(&self, gone: &crate::pool::PoolLeaf, spare: bool) {
        self.drain(gone).await;
        let details = if spare {
            vec![("spare", "available".to_owned())]
        } else {
            self.spa.pool().blank_labels(gone).await;
            Vec::new()
        };
        self.spa.pool().events().post(EventClass::VdevDetach, Some(&gone.path), details);
    }

    /// Detaches the replaced leaves whose replacements hold everything; returns their paths.
    /// A detach refused now (a leaf went out of service meanwhile) is tried again later.
    pub async fn detach_replaced(&self) -> Vec<String> {
        let mut detached = Vec::new();
        for guid in self.spa.pool().replacements_done() {
            if let Ok(path) = self.detach_leaf(&guid).await {
                detached.push(path);
            }
        }
        detached
    }

    /// [`Store::detach_replaced`] in a task, if there is anything to detach (the caller may be
    /// the syncer).
    pub(super) fn finish_replacements(self: &Arc<Self>) {
        if self.spa.pool().replacements_done().is_empty() {
            return;
        }
        let weak = Arc::downgrade(self);
        self.spa.pool().env().spawn("replace done", async move {
            let Some(store) = weak.upgrade() else { return };
            store.detach_replaced().await;
        });
    }
}
