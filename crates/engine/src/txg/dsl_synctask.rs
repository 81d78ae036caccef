//! Work the sync does for changes asked in the open txg (ZFS: `dsl_synctask.c`).
//!
//! A snapshot made or destroyed, a rollback, a promote, a volume destroyed, a log chain
//! retired: each is checked when it is asked (in open context, against the state it would
//! change, under the locks that keep that state), then queued as a [`SyncTask`] in the open
//! txg. Its sync runs the queue in order, after the volumes' trees are written and their dead
//! lists appended, so a task sees every tree as of its txg. The sync driver (spa_sync.rs) runs
//! them without knowing their types: each mechanism keeps its task beside its own code
//! (dsl_snapshot.rs, dataset.rs, zil.rs), as ZFS's sync tasks carry their own functions.
//!
//! A task cannot be refused at sync time: whatever could refuse it was checked when it was
//! queued (ZFS's check function runs again in syncing context; here the sync lock, which a
//! task's asker holds from its check to its queueing, keeps the state checked from changing
//! before the sync). A task that fails fails the sync, which suspends the store.

use std::collections::BTreeMap;

use futures::future::BoxFuture;

use super::dsl_snapshot::SyncedTree;
use super::Store;
use crate::objset::TreeUpdate;
use crate::pool::PoolError;

/// What a task may change in the sync that runs it.
pub(super) struct SyncCx<'c, 's> {
    pub(super) store: &'s Store,
    /// The txg's frees (`replaced`), and its pool and allocator.
    pub(super) update: &'c mut TreeUpdate<'s>,
    /// Each quiesced volume's tree, by name, as this txg's sync leaves it.
    pub(super) trees: &'c mut BTreeMap<String, SyncedTree>,
    /// Volumes (by id) whose trees a scan must walk again once this txg is durable (their
    /// trees went back or moved: `Store::rewind_scan`).
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

impl Store {
    /// Queues `task` for the open txg's sync. The caller holds the txg lock (`txg`), under
    /// which it also counted what the task adds to the sync (`pending_frees`,
    /// `pending_metadata_bytes`): admission sees both at once.
    pub(super) fn queue_task(txg: &mut super::TxgState, task: impl SyncTask + 'static) {
        txg.tasks.push(Box::new(task));
    }

    /// Runs a quiesced txg's tasks in the order they were queued.
    pub(super) async fn run_sync_tasks<'s>(
        &'s self,
        update: &mut TreeUpdate<'s>,
        trees: &mut BTreeMap<String, SyncedTree>,
        tasks: Vec<Box<dyn SyncTask>>,
    ) -> Result<Vec<u64>, PoolError> {
        let mut rewind = Vec::new();
        for task in tasks {
            let cx = SyncCx {
                store: self,
                update: &mut *update,
                trees: &mut *trees,
                rewind: &mut rewind,
            };
            task.sync(cx).await?;
        }
        Ok(rewind)
    }
}
