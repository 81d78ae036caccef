//! Work the sync does for changes asked in the open txg (ZFS: `dsl_synctask.c`).
//!
//! A snapshot made or destroyed, a rollback, a promote, a volume destroyed, a log chain
//! retired: each is checked when it is asked (in open context, against the state it would
//! change, under the locks that keep that state), then queued as a [`SyncTask`] in the open
//! txg. Its sync runs the queue in order, after the volumes' trees are written and their dead
//! lists appended, so a task sees every tree as of its txg. The sync driver (spa_sync.rs) runs
//! them without knowing their types: each mechanism keeps its task beside its own code
//! (dsl_snapshot.rs, dataset.rs), as ZFS's sync tasks carry their own functions.
//!
//! The tasks see each quiesced volume as a [`SyncedTree`]: the tree the sync wrote and the
//! snapshots and dead lists it carries ([`Family`]), which the directory it writes records.
//!
//! A task cannot be refused at sync time: whatever could refuse it was checked when it was
//! queued (ZFS's check function runs again in syncing context; here the sync lock, which a
//! task's asker holds from its check to its queueing, keeps the state checked from changing
//! before the sync). A task that fails fails the sync, which suspends the store.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use sluice_format::{BlockPointer, Deadlist, Origin, SnapshotEntry, VolumeEntry, VolumeSpace};

use super::spa::Spa;
use crate::objset::TreeUpdate;
use crate::pool::PoolError;

/// What a task may change in the sync that runs it: the pool and what the sync carries, not
/// the store (a task reads and frees through the `Spa`, and finds volumes in the namespace
/// only by name).
pub(super) struct SyncCx<'c, 's> {
    /// The pool the task reads and frees through.
    pub(super) spa: &'s Spa,
    /// A volume's id by name, as the namespace has it when the task asks (`Dsl::volume_id`).
    /// A function rather than the `Dsl`, so that this file, which the mechanisms import for
    /// their tasks, imports none of them back.
    pub(super) volume_id: &'c (dyn Fn(&str) -> Option<u64> + Sync),
    /// The txg's frees (`replaced`), and its pool and allocator.
    pub(super) update: &'c mut TreeUpdate<'s>,
    /// Each quiesced volume's tree, by name, as this txg's sync leaves it.
    pub(super) trees: &'c mut BTreeMap<String, SyncedTree>,
    /// Volumes (by id) whose trees a scan must walk again once this txg is durable (their
    /// trees went back or moved: `Scan::rewind`).
    pub(super) rewind: &'c mut Vec<u64>,
}

/// One change a sync makes for the txg it was asked in.
pub(super) trait SyncTask: std::fmt::Debug + Send {
    /// Makes the change in the syncing txg.
    fn sync<'c, 's: 'c>(
        self: Box<Self>,
        cx: SyncCx<'c, 's>,
    ) -> BoxFuture<'c, Result<(), PoolError>>;
}

/// Runs a quiesced txg's tasks in the order they were queued. Returns the volumes (by id)
/// whose trees a scan must walk again once the txg is durable.
pub(super) async fn run_sync_tasks<'s>(
    spa: &'s Spa,
    volume_id: &(dyn Fn(&str) -> Option<u64> + Sync),
    update: &mut TreeUpdate<'s>,
    trees: &mut BTreeMap<String, SyncedTree>,
    tasks: Vec<Box<dyn SyncTask>>,
) -> Result<Vec<u64>, PoolError> {
    let mut rewind = Vec::new();
    for task in tasks {
        let cx = SyncCx {
            spa,
            volume_id,
            update: &mut *update,
            trees: &mut *trees,
            rewind: &mut rewind,
        };
        task.sync(cx).await?;
    }
    Ok(rewind)
}

/// A volume's tree as a sync wrote it.
pub(super) struct SyncedTree {
    pub(super) root: Option<BlockPointer>,
    /// The root's keyed MAC, for an encrypted volume (`VolumeEntry::root_mac`).
    pub(super) root_mac: [u8; sluice_format::ROOT_MAC_BYTES],
    pub(super) space: VolumeSpace,
    /// Blocks the sync replaced that the volume's newest snapshot still holds: they go on its
    /// dead list, not back to the allocator.
    pub(super) dead: Vec<BlockPointer>,
    /// Its snapshots and dead list as this sync leaves them.
    pub(super) family: Family,
}

/// A volume's snapshots and dead list as a sync carries them, from the quiesced entry to the
/// directory it writes and the entry it leaves.
#[derive(Clone, Debug)]
pub(super) struct Family {
    pub(super) prev_snap_txg: u64,
    pub(super) origin: Option<Origin>,
    pub(super) deadlist: Deadlist,
    pub(super) snapshots: Vec<SnapshotEntry>,
    /// The volume's size and levels (a rollback changes them).
    pub(super) size_bytes: u64,
    pub(super) levels: u8,
    /// Set by a rollback in this sync.
    pub(super) rolled_back: bool,
}

impl Family {
    pub(super) fn of(entry: &VolumeEntry) -> Family {
        Family {
            prev_snap_txg: entry.prev_snap_txg,
            origin: entry.origin,
            deadlist: entry.deadlist.clone(),
            snapshots: entry.snapshots.clone(),
            size_bytes: entry.size_bytes,
            levels: entry.levels,
            rolled_back: false,
        }
    }

    /// The starts of the birth ranges its dead lists count bytes in: 0, and the txg after
    /// each snapshot.
    pub(super) fn starts(&self) -> Vec<u64> {
        range_starts(self.origin, &self.snapshots)
    }

    /// The txg of the snapshot before snapshot `at` (its origin's for the first; 0 for none)
    /// and the start of the birth range that follows it.
    pub(super) fn before(&self, at: usize) -> (u64, u64) {
        match at.checked_sub(1) {
            Some(p) => (self.snapshots[p].txg, self.snapshots[p].txg + 1),
            None => self.origin.map_or((0, 0), |o| (o.txg, o.txg + 1)),
        }
    }

    /// Every dead list: the snapshots', then the volume's.
    pub(super) fn lists_mut(&mut self) -> impl Iterator<Item = &mut Deadlist> {
        let snapshots = self.snapshots.iter_mut().map(|s| &mut s.deadlist);
        snapshots.chain(std::iter::once(&mut self.deadlist))
    }

    /// Copies what the sync decided into a volume's entry.
    pub(super) fn apply(&self, entry: &mut VolumeEntry) {
        entry.prev_snap_txg = self.prev_snap_txg;
        entry.origin = self.origin;
        entry.deadlist = self.deadlist.clone();
        entry.snapshots = self.snapshots.clone();
        if self.rolled_back {
            entry.size_bytes = self.size_bytes;
            entry.levels = self.levels;
        }
    }
}

/// The starts of the birth ranges of a volume's dead lists: 0, and the txg after its
/// origin's and each of its snapshots'.
pub(super) fn range_starts(origin: Option<Origin>, snapshots: &[SnapshotEntry]) -> Vec<u64> {
    std::iter::once(0)
        .chain(origin.map(|o| o.txg + 1))
        .chain(snapshots.iter().map(|s| s.txg + 1))
        .collect()
}
