//! Snapshots (ZFS: `dsl_dataset.c`'s snapshot half, `dsl_destroy.c`, `zfs rollback`).
//!
//! A snapshot is a volume's tree as one txg's sync left it, kept read-only. Taking one costs
//! the same whatever the volume's size: the sync records the new root it has just written,
//! hands the volume's dead list to the snapshot, and starts the volume's next list; nothing
//! is copied or walked. From then on the sync routes what it replaces by birth txg: a block
//! born after the newest snapshot is the volume's alone and is freed, one born at or before
//! it goes on the volume's dead list (crate::txg::dsl_deadlist), which is how every block
//! stays owned exactly once: by the volume's tree or by one dead list.
//!
//! Destroying snapshot S (the one before it P, the dataset after it N, a later snapshot or the
//! volume): the entries of N's dead list born after P are referenced by S alone and are
//! freed; the rest, with S's own list, become N's list. Only N's list is read. Rollback to the
//! newest snapshot frees the volume's blocks born after it, found by a walk that skips every
//! subtree born before (copy-on-write gives a parent a birth no older than its children),
//! and the volume's dead list is dropped, its blocks being the snapshot's again.
//!
//! A clone (ZFS: `zfs clone`) is a new volume whose tree starts as a snapshot's: its origin.
//! Blocks born by the origin's txg are the origin's; the clone routes them to its dead list
//! when it replaces them and leaves them when it is destroyed, exactly as a volume treats its
//! newest snapshot's. A snapshot with clones cannot be destroyed. Promote (ZFS: `zfs
//! promote`) swaps the roles: the origin and the snapshots before it move to the clone, and
//! the old parent becomes a clone of it; only the clone's own dead lists are read, to count
//! their bytes by the ranges the moved snapshots bring.
//!
//! Every change is made by the sync of the txg it was asked in (`SnapshotOp`), so several
//! volumes' snapshots taken by one command share a txg and are consistent with each other,
//! and a crash leaves either all of a change or none of it. The calls hold the sync lock
//! from their checks to the end of that sync, so nothing they checked changes before it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_format::{BlockPointer, Deadlist, Origin, SnapshotEntry, VolumeEntry, VolumeSpace};

use super::dataset::Datasets;
use super::dataset::{
    check_volume_name, reservable_bytes, room_beyond, unique_bytes, Dataset, Dsl,
};
use super::dsl_deadlist::{count_entry, merge_range, range_bytes};
use super::dsl_pool::{Txg, TxgLimits};
use super::dsl_synctask::{Family, SyncCx, SyncTask, SyncedTree};
use super::spa::Spa;
use super::zil::Zil;
use super::{Store, StoreError};
use crate::objset::{self, TreeUpdate};
use crate::pool::PoolError;

/// A change to a volume's snapshots, made by the sync of the txg it was asked in.
#[derive(Clone, Debug)]
pub(super) enum SnapshotOp {
    /// Take a snapshot: the sync fills in its txg, tree and figures.
    Create {
        volume: String,
        snapshot: Box<SnapshotEntry>,
    },
    Destroy {
        volume: String,
        name: String,
    },
    /// Return the volume to its newest snapshot, `name`.
    Rollback {
        volume: String,
        name: String,
    },
    /// Make clone `volume` the parent of its origin, which belongs to `parent`.
    Promote {
        volume: String,
        parent: String,
    },
}

/// A snapshot change runs in the sync of its txg, after the dead lists are appended: a
/// snapshot made there takes the tree and dead list as of the txg's end; a destroy, rollback
/// or promote frees what only it held into `replaced`, and has a scan walk the volumes again.
impl SyncTask for SnapshotOp {
    fn sync<'c, 's: 'c>(
        self: Box<Self>,
        cx: SyncCx<'c, 's>,
    ) -> futures::future::BoxFuture<'c, Result<(), PoolError>> {
        Box::pin(sync_snapshot_op(cx, *self))
    }
}

/// One snapshot as `snapshot list` shows it (ZFS: `used`, `referenced`, `written`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub volume: String,
    pub name: String,
    pub txg: u64,
    pub creation_secs: u64,
    pub size_bytes: u64,
    /// What destroying it alone would free: blocks no other snapshot or the volume holds.
    pub used_bytes: u64,
    /// What it references (the volume's figure when it was taken).
    pub referenced_bytes: u64,
    /// What it references that the snapshot before it did not (written between the two).
    pub written_bytes: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    /// Volumes cloned from it.
    pub clones: Vec<String>,
    /// Taken by the volume's snapshot schedule, which also prunes it (schedule.rs).
    pub automatic: bool,
}

/// A volume's space beyond its tree (ZFS: `usedbysnapshots`, `written`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotSpace {
    /// What the volume's tree holds of its own (ZFS: `usedbydataset`): all it references, or
    /// for a clone what it does not share with its origin.
    pub dataset_bytes: u64,
    /// Blocks only snapshots hold: freed if every snapshot were destroyed (a clone's origin's
    /// blocks not counted).
    pub snapshots_bytes: u64,
    /// What the volume references that its newest snapshot does not.
    pub written_bytes: u64,
}

fn check_snapshot_name(volume: &str, name: &str) -> Result<(), StoreError> {
    check_volume_name(name)
        .map_err(|_| StoreError::InvalidVolumeName { name: format!("{volume}@{name}") })
}

/// The namespace's side of snapshots: lookups and figures that read the volumes' entries
/// alone, under the namespace's lock, and the served snapshots' datasets.
impl Dsl {
    /// The snapshots of `volume`, oldest first, with their space figures.
    pub(super) fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotInfo>, StoreError> {
        let entry = self.dataset(volume)?.state.lock().entry.clone();
        let clones = self.clones_by_origin();
        let snapshots = &entry.snapshots;
        Ok(snapshots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let prev = i.checked_sub(1).map(|p| &snapshots[p]);
                let next_list = snapshots.get(i + 1).map_or(&entry.deadlist, |n| &n.deadlist);
                let origin = entry.origin.filter(|_| i == 0);
                let (prev_start, prev_referenced) = match (prev, origin) {
                    (Some(p), _) => (p.txg + 1, p.space.referenced_bytes),
                    (None, Some(o)) => (o.txg + 1, o.referenced_bytes),
                    (None, None) => (0, 0),
                };
                SnapshotInfo {
                    volume: entry.name.clone(),
                    name: s.name.clone(),
                    txg: s.txg,
                    creation_secs: s.creation_secs,
                    size_bytes: s.size_bytes,
                    used_bytes: range_bytes(next_list, prev_start),
                    referenced_bytes: s.space.referenced_bytes,
                    written_bytes: (s.space.referenced_bytes + s.deadlist.bytes())
                        .saturating_sub(prev_referenced),
                    logical_bytes: s.space.logical_bytes,
                    physical_bytes: s.space.physical_bytes,
                    clones: clones.get(&s.id).cloned().unwrap_or_default(),
                    automatic: s.automatic,
                }
            })
            .collect())
    }

    /// The clones of every snapshot, by snapshot id.
    fn clones_by_origin(&self) -> BTreeMap<u64, Vec<String>> {
        let dsl = self.read();
        let mut clones: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (name, dataset) in dsl.iter() {
            if let Some(origin) = dataset.state.lock().entry.origin {
                clones.entry(origin.snapshot).or_default().push(name.clone());
            }
        }
        clones
    }

    /// Refuses to destroy snapshot `volume@snapshot` (id `id`) while volumes are cloned
    /// from it, naming them.
    pub(super) fn refuse_if_cloned(
        &self,
        dsl: &Datasets,
        volume: &str,
        snapshot: &str,
        id: u64,
    ) -> Result<(), StoreError> {
        let clones: Vec<&str> = dsl
            .iter()
            .filter(|(_, d)| d.state.lock().entry.origin.is_some_and(|o| o.snapshot == id))
            .map(|(name, _)| name.as_str())
            .collect();
        if clones.is_empty() {
            return Ok(());
        }
        Err(StoreError::HasClones {
            pool: self.pool_name().to_owned(),
            volume: volume.to_owned(),
            snapshot: snapshot.to_owned(),
            clones: clones.join(", "),
        })
    }

    /// Bytes that only snapshots hold, over every volume: what destroying them all would free.
    pub(super) fn snapshots_bytes(&self) -> u64 {
        let names: Vec<String> = self.read().iter().map(|(name, _)| name.clone()).collect();
        names.iter().filter_map(|v| self.snapshot_space(v).ok()).map(|s| s.snapshots_bytes).sum()
    }

    /// What a volume's snapshots hold beyond its tree, and what it wrote since the newest.
    pub(super) fn snapshot_space(&self, volume: &str) -> Result<SnapshotSpace, StoreError> {
        let dataset = self.dataset(volume)?;
        let v = dataset.state.lock();
        let lists =
            std::iter::once(&v.entry.deadlist).chain(v.entry.snapshots.iter().map(|s| &s.deadlist));
        // A clone's lists' first range holds its origin's blocks.
        let (mut held, mut origins) = (0, 0);
        for list in lists {
            held += list.bytes();
            origins += if v.entry.origin.is_some() { range_bytes(list, 0) } else { 0 };
        }
        let referenced = v.entry.space.map_or(0, |s| s.referenced_bytes);
        let shared = v.entry.origin.map_or(0, |o| o.referenced_bytes.saturating_sub(origins));
        Ok(SnapshotSpace {
            dataset_bytes: referenced.saturating_sub(shared),
            snapshots_bytes: held - origins,
            written_bytes: unique_bytes(&v.entry),
        })
    }

    /// A read-only handle's dataset for `volume@snapshot` (its NBD export), made on first use
    /// and shared while any handle holds it.
    pub(super) fn snapshot_dataset(
        &self,
        volume: &str,
        name: &str,
        limits: &TxgLimits,
    ) -> Result<Arc<Dataset>, StoreError> {
        let mut dsl = self.write();
        let snapshot = self.snapshot_of(&dsl, volume, name)?;
        let parent = dsl.get(volume).expect("a volume checked above under the same lock");
        let block_bytes = parent.block_bytes;
        let key_family = parent.state.lock().entry.key_family;
        if let Some(open) = dsl.export(snapshot.id) {
            return Ok(open);
        }
        let mut entry = VolumeEntry::new(
            snapshot.id,
            &format!("{volume}@{name}"),
            snapshot.size_bytes,
            block_bytes,
            snapshot.levels,
        );
        entry.root = snapshot.root;
        entry.root_mac = snapshot.root_mac;
        entry.space = Some(snapshot.space);
        entry.key_family = key_family;
        let dataset = Dataset::snapshot(entry, limits);
        dsl.add_export(snapshot.id, &dataset);
        Ok(dataset)
    }

    /// Handles on destroyed snapshots fail from now on.
    pub(super) fn retire_snapshot_exports(&self, ids: &[u64]) {
        let mut dsl = self.write();
        for id in ids {
            if let Some(dataset) = dsl.retire_export(*id) {
                dataset.destroyed.store(true, Ordering::Release);
            }
        }
    }

    pub(super) fn snapshot_of(
        &self,
        dsl: &Datasets,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotEntry, StoreError> {
        let dataset = dsl.get(volume).ok_or_else(|| self.no_such_volume(volume))?;
        let found = dataset.state.lock().entry.snapshots.iter().find(|s| s.name == name).cloned();
        found.ok_or_else(|| StoreError::NoSuchSnapshot {
            pool: self.pool_name().to_owned(),
            volume: volume.to_owned(),
            snapshot: name.to_owned(),
        })
    }
}

impl Store {
    /// Takes a snapshot of each named volume, `(volume, snapshot)`, all in one txg (ZFS:
    /// `zfs snapshot a@s b@s`), and returns that txg once it is durable. Writes answered
    /// before the call are in it. A thick volume must find the space its reservation will
    /// need again: after a snapshot, every block it overwrites is new space.
    pub async fn create_snapshots(
        &self,
        names: &[(String, String)],
        creation_secs: u64,
    ) -> Result<u64, StoreError> {
        self.create_snapshots_with(names, creation_secs, None, false).await
    }

    /// [`Store::create_snapshots`], with the snapshots' guids given (a received snapshot
    /// keeps its sender's), and marked `automatic` when a schedule takes them (schedule.rs).
    pub(super) async fn create_snapshots_with(
        &self,
        names: &[(String, String)],
        creation_secs: u64,
        guid: Option<u64>,
        automatic: bool,
    ) -> Result<u64, StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a snapshot create");
        for (i, (volume, name)) in names.iter().enumerate() {
            if !super::dataset::is_hidden(volume) {
                check_volume_name(volume)?;
            }
            check_snapshot_name(volume, name)?;
            self.check_log_replayed(volume, "a snapshot")?;
            if names[..i].iter().any(|(other, _)| other == volume) {
                return Err(StoreError::InvalidProperty {
                    volume: volume.clone(),
                    reason: "named twice: one snapshot per volume per command".to_owned(),
                });
            }
        }
        let one_at_a_time = self.syncer.lock().await;
        self.dsl.queue_snapshots(&self.spa, &self.txg, names, (creation_secs, guid, automatic))?;
        self.sync_handle().sync_holding_lock(one_at_a_time).await
    }

    /// Destroys a snapshot (ZFS: `zfs destroy vol@snap`): frees the blocks no other snapshot
    /// and not the volume hold, reading only the next dataset's dead list. Durable when this
    /// returns. A client reading it through its export gets errors from then on.
    pub async fn destroy_snapshot(&self, volume: &str, name: &str) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a snapshot destroy");
        let one_at_a_time = self.syncer.lock().await;
        let id = self.dsl.queue_snapshot_destroy(&self.spa, &self.txg, volume, name)?;
        self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.dsl.retire_snapshot_exports(&[id]);
        Ok(())
    }

    /// Returns a volume to a snapshot (ZFS: `zfs rollback`): its contents, size and space as
    /// they were when the snapshot was taken; writes since are gone. The snapshot must be the
    /// newest unless `destroy_later`, which destroys the later ones first (`-r`). Connected
    /// clients see the old contents at once (as with ZFS, they should not be writing). Durable
    /// when this returns.
    pub async fn rollback_volume(
        &self,
        volume: &str,
        name: &str,
        destroy_later: bool,
    ) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a rollback");
        // Changes to the volume wait until the rollback's sync has ended, and those under way
        // end first: each then lands wholly before or wholly after it.
        let dataset = self.dataset(volume)?;
        self.check_log_replayed(volume, "a rollback")?;
        let _no_writes = dataset.rollback_gate.write().await;
        let one_at_a_time = self.syncer.lock().await;
        let later_ids =
            self.dsl.queue_rollback(&self.spa, &self.txg, &dataset, volume, name, destroy_later)?;
        self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        self.dsl.retire_snapshot_exports(&later_ids);
        Ok(())
    }

    /// The snapshots of `volume`, oldest first, with their space figures.
    pub fn snapshots(&self, volume: &str) -> Result<Vec<SnapshotInfo>, StoreError> {
        self.dsl.snapshots(volume)
    }

    /// Makes volume `clone` from snapshot `volume@name` (ZFS: `zfs clone`): writable, sharing
    /// every block with the snapshot until it writes its own. It takes the snapshot's size
    /// and the volume's properties, and is thin. Durable when this returns.
    pub async fn clone_snapshot(
        &self,
        volume: &str,
        name: &str,
        clone: &str,
    ) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a clone");
        if !super::dataset::is_hidden(clone) {
            check_volume_name(clone)?;
        }
        let one_at_a_time = self.syncer.lock().await;
        self.dsl.add_clone(&self.spa, &self.txg, &self.zil, volume, name, clone)?;
        self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        Ok(())
    }

    /// Makes clone `volume` the parent of its origin (ZFS: `zfs promote`): the origin snapshot
    /// and those before it move to the clone, and the volume they came from becomes a clone
    /// of it, which can then be destroyed. Refused when a moving snapshot's name is taken
    /// among the clone's own. Durable when this returns.
    pub async fn promote_volume(&self, volume: &str) -> Result<(), StoreError> {
        self.spa.check_live()?;
        let _guard = self.spa.panic_guard("a promote");
        let one_at_a_time = self.syncer.lock().await;
        self.dsl.queue_promote(&self.spa, &self.txg, volume)?;
        self.sync_handle().sync_holding_lock(one_at_a_time).await?;
        Ok(())
    }

    /// Bytes that only snapshots hold, over every volume: what destroying them all would free.
    pub fn snapshots_bytes(&self) -> u64 {
        self.dsl.snapshots_bytes()
    }

    /// What a volume's snapshots hold beyond its tree, and what it wrote since the newest.
    pub fn snapshot_space(&self, volume: &str) -> Result<SnapshotSpace, StoreError> {
        self.dsl.snapshot_space(volume)
    }
}

/// The checks of the snapshot changes, and their queueing for the open txg's sync: the
/// `Store` methods above hold the sync's lock around each and sync.
impl Dsl {
    /// Checks and queues the snapshots of [`Store::create_snapshots`] for the open txg's
    /// sync, the sync's lock held by the caller.
    pub(super) fn queue_snapshots(
        &self,
        spa: &Spa,
        txg: &Txg,
        names: &[(String, String)],
        (creation_secs, guid, automatic): (u64, Option<u64>, bool),
    ) -> Result<(), StoreError> {
        let mut dsl = self.write();
        let mut txg = txg.lock();
        let mut more_reserved = 0u64;
        for (volume, name) in names {
            let dataset = dsl.get(volume).ok_or_else(|| self.no_such_volume(volume))?;
            let v = dataset.state.lock();
            if v.entry.snapshots.iter().any(|s| &s.name == name) {
                return Err(StoreError::SnapshotExists {
                    pool: spa.pool().name().to_owned(),
                    volume: volume.clone(),
                    snapshot: name.clone(),
                });
            }
            // After the snapshot the volume's unique bytes are zero: its whole
            // reservation is unused again (ZFS refuses such a snapshot the same way).
            let dirty = dataset.dirty_bytes.load(Ordering::Relaxed);
            let reservation = v.entry.reservation_bytes;
            drop(v);
            more_reserved +=
                reservation.saturating_sub(dirty).saturating_sub(dataset.unused_reservation());
        }
        let available = reservable_bytes(spa, &dsl, &txg);
        if more_reserved > available {
            return Err(StoreError::SnapshotNeedsSpace {
                pool: spa.pool().name().to_owned(),
                what: "a snapshot of",
                volumes: names.iter().map(|(v, _)| v.clone()).collect::<Vec<_>>().join(", "),
                needed_bytes: more_reserved,
                available_bytes: available,
            });
        }
        let mut guids = spa.pool().env().unique_rng("snapshot guid");
        for (volume, name) in names {
            let id = dsl.next_id();
            dsl.use_id(id);
            let snapshot = SnapshotEntry {
                id,
                guid: guid.unwrap_or_else(|| guids.u64() | 1),
                name: name.clone(),
                txg: 0,
                creation_secs,
                size_bytes: 0,
                levels: 0,
                root: None,
                space: VolumeSpace::default(),
                deadlist: Deadlist::default(),
                root_mac: [0; sluice_format::ROOT_MAC_BYTES],
                automatic,
            };
            let snapshot = Box::new(snapshot);
            // Until its sync ends, the rewrite of scattered blocks must see the blocks it
            // will share (dmu_rewrite.rs).
            if let Some(dataset) = dsl.get(volume) {
                dataset.state.lock().snapshot_queued_txg = txg.open_txg();
            }
            txg.queue(SnapshotOp::Create { volume: volume.clone(), snapshot });
        }
        Ok(())
    }

    /// Checks and queues the destroy of snapshot `volume@name` for the open txg's sync
    /// ([`Store::destroy_snapshot`]), the sync's lock held by the caller; returns its id.
    pub(super) fn queue_snapshot_destroy(
        &self,
        spa: &Spa,
        txg: &Txg,
        volume: &str,
        name: &str,
    ) -> Result<u64, StoreError> {
        let dsl = self.read();
        let mut txg = txg.lock();
        let id = self.snapshot_of(&dsl, volume, name)?.id;
        self.refuse_if_cloned(&dsl, volume, name, id)?;
        // Its sync rewrites the next dead list (the next snapshot's, or the volume's) with
        // the entries it keeps, and frees the rest with the old pieces: admission counts
        // both. It frees space, so as ZFS does it may go into the slop
        // (`SlopTier::Freeing`); only a rewrite that not even that holds is refused.
        let (next_entries, next_pieces) = dsl.get(volume).map_or((0, 0), |dataset| {
            let v = dataset.state.lock();
            let after = v.entry.snapshots.iter().skip_while(|s| s.name != name).nth(1);
            let list = after.map_or(&v.entry.deadlist, |s| &s.deadlist);
            (list.entries, list.pieces.len() as u64)
        });
        let copies = spa.pool().metadata_copies() as u64;
        let needed = super::dsl_deadlist::pieces_bytes(next_entries, copies);
        let available = room_beyond(spa, &dsl, &txg, crate::alloc::SlopTier::Freeing);
        if needed > available {
            return Err(StoreError::DestroyNeedsSpace {
                pool: spa.pool().name().to_owned(),
                volume: volume.to_owned(),
                snapshot: name.to_owned(),
                needed_bytes: needed,
                available_bytes: available,
            });
        }
        let frees = next_entries.saturating_add(next_pieces).saturating_mul(copies);
        txg.count_pending(needed, frees);
        txg.queue(SnapshotOp::Destroy { volume: volume.to_owned(), name: name.to_owned() });
        Ok(id)
    }

    /// Checks and queues the rollback of `dataset` (volume `volume`) to its snapshot `name`
    /// for the open txg's sync ([`Store::rollback_volume`]), with the caller holding the
    /// volume's rollback gate and the sync's lock; returns the ids of the later snapshots it
    /// destroys.
    pub(super) fn queue_rollback(
        &self,
        spa: &Spa,
        txg: &Txg,
        dataset: &Arc<Dataset>,
        volume: &str,
        name: &str,
        destroy_later: bool,
    ) -> Result<Vec<u64>, StoreError> {
        let dsl = self.read();
        let mut txg = txg.lock();
        // Destroyed (and perhaps made again) while this waited for the gate.
        if !dsl.get(volume).is_some_and(|d| Arc::ptr_eq(d, dataset)) {
            return Err(self.no_such_volume(volume));
        }
        let later: Vec<(u64, String)> = {
            let v = dataset.state.lock();
            let at = v.entry.snapshots.iter().position(|s| s.name == name).ok_or_else(|| {
                StoreError::NoSuchSnapshot {
                    pool: spa.pool().name().to_owned(),
                    volume: volume.to_owned(),
                    snapshot: name.to_owned(),
                }
            })?;
            v.entry.snapshots[at + 1..].iter().map(|s| (s.id, s.name.clone())).collect()
        };
        if !later.is_empty() && !destroy_later {
            return Err(StoreError::NotNewestSnapshot {
                pool: spa.pool().name().to_owned(),
                volume: volume.to_owned(),
                snapshot: name.to_owned(),
                later: later.iter().map(|(_, n)| n.clone()).collect::<Vec<_>>().join(", "),
            });
        }
        for (id, later) in &later {
            self.refuse_if_cloned(&dsl, volume, later, *id)?;
        }
        // A thick volume's reservation follows the snapshot's size, and all of it is unused
        // again once the volume shares everything with the snapshot.
        let (reservation, size) = {
            let v = dataset.state.lock();
            let size = v.entry.snapshots.iter().find(|s| s.name == name).map(|s| s.size_bytes);
            (v.entry.reservation_bytes, size.unwrap_or(v.entry.size_bytes))
        };
        if reservation != 0 {
            let target = spa.thick_reservation(size, dataset.block_bytes);
            let more = target.saturating_sub(dataset.unused_reservation());
            let available = reservable_bytes(spa, &dsl, &txg);
            if more > available {
                return Err(StoreError::SnapshotNeedsSpace {
                    pool: spa.pool().name().to_owned(),
                    what: "a rollback of",
                    volumes: volume.to_owned(),
                    needed_bytes: more,
                    available_bytes: available,
                });
            }
        }
        // Its sync frees what the volume wrote since the snapshot and, with `-r`, rewrites
        // the dead lists of the snapshots it destroys: at most the volume's whole tree and
        // lists, counted as a destroy of it would be.
        {
            let (frees, entries) = {
                let v = dataset.state.lock();
                let entries = std::iter::once(&v.entry.deadlist)
                    .chain(v.entry.snapshots.iter().map(|s| &s.deadlist))
                    .map(|l| l.entries)
                    .fold(0u64, u64::saturating_add);
                (spa.frees_bound(&v.entry), entries)
            };
            let copies = spa.pool().metadata_copies() as u64;
            let needed = super::dsl_deadlist::pieces_bytes(entries, copies)
                .saturating_mul(later.len() as u64);
            // The destroys of `-r` rewrite dead lists as a snapshot destroy does, and may
            // go as far into the slop.
            let available = room_beyond(spa, &dsl, &txg, crate::alloc::SlopTier::Freeing);
            if let Some((_, first)) = later.first().filter(|_| needed > available) {
                return Err(StoreError::DestroyNeedsSpace {
                    pool: spa.pool().name().to_owned(),
                    volume: volume.to_owned(),
                    snapshot: first.clone(),
                    needed_bytes: needed,
                    available_bytes: available,
                });
            }
            txg.count_pending(needed, frees);
        }
        for (_, later) in later.iter().rev() {
            txg.queue(SnapshotOp::Destroy { volume: volume.to_owned(), name: later.clone() });
        }
        txg.queue(SnapshotOp::Rollback { volume: volume.to_owned(), name: name.to_owned() });
        // Writes not yet synced are written by the rollback's sync and freed by it, not
        // dropped now: an intent-log record of theirs not yet filled must still find its
        // bytes, in case the rollback never becomes durable and the log is replayed.
        Ok(later.into_iter().map(|(id, _)| id).collect())
    }

    /// Adds clone `clone` of snapshot `volume@name` to the namespace ([`Store::clone_snapshot`]),
    /// the sync's lock held by the caller; its log is a new chain of the pool's logs (`zil`).
    pub(super) fn add_clone(
        &self,
        spa: &Spa,
        txg: &Txg,
        zil: &Zil,
        volume: &str,
        name: &str,
        clone: &str,
    ) -> Result<(), StoreError> {
        let mut dsl = self.write();
        if dsl.contains(clone) {
            return Err(StoreError::VolumeExists {
                pool: spa.pool().name().to_owned(),
                volume: clone.to_owned(),
            });
        }
        let snapshot = self.snapshot_of(&dsl, volume, name)?;
        let parent = dsl
            .get(volume)
            .expect("a volume checked above under the same lock")
            .state
            .lock()
            .entry
            .clone();
        let id = dsl.next_id();
        // A clone of an encrypted volume shares its key family, which seals its log too.
        let log = Some(zil.new_log(spa, id, parent.key_family, parent.block_bytes)?);
        dsl.use_id(id);
        let (size, levels) = (snapshot.size_bytes, snapshot.levels);
        let mut entry = VolumeEntry::new(id, clone, size, parent.block_bytes, levels);
        entry.root = snapshot.root;
        entry.root_mac = snapshot.root_mac;
        entry.space = Some(snapshot.space);
        entry.prev_snap_txg = snapshot.txg;
        entry.origin = Some(Origin {
            snapshot: snapshot.id,
            txg: snapshot.txg,
            referenced_bytes: snapshot.space.referenced_bytes,
        });
        entry.dedup = parent.dedup;
        entry.sync = parent.sync;
        entry.logbias = parent.logbias;
        entry.compression = parent.compression;
        entry.key_family = parent.key_family;
        let dataset = Dataset::new(entry, log, txg.limits());
        dsl.insert(clone.to_owned(), dataset);
        Ok(())
    }

    /// Checks and queues the promote of clone `volume` for the open txg's sync
    /// ([`Store::promote_volume`]), the sync's lock held by the caller.
    pub(super) fn queue_promote(
        &self,
        spa: &Spa,
        txg: &Txg,
        volume: &str,
    ) -> Result<(), StoreError> {
        let dsl = self.read();
        let mut txg = txg.lock();
        let dataset = dsl.get(volume).ok_or_else(|| self.no_such_volume(volume))?;
        let entry = dataset.state.lock().entry.clone();
        let Some(origin) = entry.origin else {
            return Err(StoreError::InvalidProperty {
                volume: volume.to_owned(),
                reason: "is not a clone, so there is nothing to promote it over".to_owned(),
            });
        };
        let holds = |d: &Arc<Dataset>| {
            d.state.lock().entry.snapshots.iter().position(|s| s.id == origin.snapshot)
        };
        let found = dsl.iter().find_map(|(name, d)| Some((name.clone(), holds(d)?, d)));
        let Some((parent, at, parent_dataset)) = found else {
            return Err(StoreError::InvalidProperty {
                volume: volume.to_owned(),
                reason: format!("its origin (snapshot id {}) is in no volume", origin.snapshot),
            });
        };
        let moving: Vec<String> = parent_dataset.state.lock().entry.snapshots[..=at]
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if let Some(taken) = moving.iter().find(|m| entry.snapshots.iter().any(|s| &s.name == *m)) {
            return Err(StoreError::SnapshotExists {
                pool: spa.pool().name().to_owned(),
                volume: volume.to_owned(),
                snapshot: taken.clone(),
            });
        }
        txg.queue(SnapshotOp::Promote { volume: volume.to_owned(), parent });
        Ok(())
    }
}

/// The sync's dead-list step, after the volumes' trees are written (ZFS: `dsl_dataset_sync`):
/// appends what each volume's newest snapshot still needs of the blocks this txg replaced to
/// its dead list, through the pool alone. Pieces the appends free go into `ctx.replaced`. The
/// snapshot changes asked in this txg run after it, as sync tasks.
pub(super) async fn append_deadlists(
    spa: &Spa,
    ctx: &mut TreeUpdate<'_>,
    trees: &mut BTreeMap<String, SyncedTree>,
) -> Result<(), PoolError> {
    let txg = ctx.txg;
    for tree in trees.values_mut() {
        let dead = std::mem::take(&mut tree.dead);
        let starts = tree.family.starts();
        let list = &mut tree.family.deadlist;
        super::dsl_deadlist::append(spa, txg, list, &starts, dead, &mut ctx.replaced).await?;
    }
    Ok(())
}

/// Makes one snapshot change in the syncing txg (see [`SnapshotOp`]'s [`SyncTask`]): through
/// the pool alone, with the namespace only to name by id the volumes a scan walks again.
async fn sync_snapshot_op(cx: SyncCx<'_, '_>, op: SnapshotOp) -> Result<(), PoolError> {
    let SyncCx { spa, volume_id, update: ctx, trees, rewind } = cx;
    let txg = ctx.txg;
    let volume = match &op {
        SnapshotOp::Create { volume, .. }
        | SnapshotOp::Destroy { volume, .. }
        | SnapshotOp::Rollback { volume, .. }
        | SnapshotOp::Promote { volume, .. } => volume.clone(),
    };
    if let SnapshotOp::Promote { parent, .. } = &op {
        promote_in_sync(spa, trees, &volume, parent).await?;
        rewind.extend([&volume, parent].into_iter().filter_map(|v| volume_id(v)));
        return Ok(());
    }
    if !matches!(op, SnapshotOp::Create { .. }) {
        rewind.extend(volume_id(&volume));
    }
    // Checked under the sync lock, which the caller held until this sync.
    let Some(tree) = trees.get_mut(&volume) else {
        debug_assert!(false, "a snapshot change for volume {volume}, not quiesced");
        return Ok(());
    };
    match op {
        SnapshotOp::Create { mut snapshot, .. } => {
            let family = &mut tree.family;
            snapshot.txg = txg;
            snapshot.root = tree.root;
            snapshot.root_mac = tree.root_mac;
            snapshot.space = tree.space;
            snapshot.size_bytes = family.size_bytes;
            snapshot.levels = family.levels;
            snapshot.deadlist = std::mem::take(&mut family.deadlist);
            family.snapshots.push(*snapshot);
            family.prev_snap_txg = txg;
        }
        SnapshotOp::Destroy { name, .. } => {
            destroy_in_sync(spa, ctx, &mut tree.family, &name).await?;
        }
        SnapshotOp::Promote { .. } => unreachable!("made above"),
        SnapshotOp::Rollback { name, .. } => {
            let family = &mut tree.family;
            let Some(newest) = family.snapshots.last().filter(|s| s.name == name) else {
                debug_assert!(false, "rollback of {volume} to {name}, not its newest");
                return Ok(());
            };
            let newest = newest.clone();
            // The volume's blocks born after the snapshot are its alone.
            let born =
                objset::walk_born_after(ctx.pool, tree.root, family.levels, newest.txg).await?;
            ctx.replaced.extend(born);
            // Its dead list names the snapshot's blocks, which it holds again.
            ctx.replaced.append(&mut family.deadlist.pieces);
            family.deadlist = Deadlist::default();
            tree.root = newest.root;
            tree.root_mac = newest.root_mac;
            tree.space = newest.space;
            family.size_bytes = newest.size_bytes;
            family.levels = newest.levels;
            family.rolled_back = true;
        }
    }
    Ok(())
}

/// Promotes clone `clone` over `parent` in the syncing txg (see the module doc).
async fn promote_in_sync(
    spa: &Spa,
    trees: &mut BTreeMap<String, SyncedTree>,
    clone: &str,
    parent: &str,
) -> Result<(), PoolError> {
    let (Some(mut c), Some(mut o)) = (trees.remove(clone), trees.remove(parent)) else {
        debug_assert!(false, "promote of {clone} over {parent}, not both quiesced");
        return Ok(());
    };
    let origin = c.family.origin;
    let at =
        origin.and_then(|origin| o.family.snapshots.iter().position(|s| s.id == origin.snapshot));
    if let Some(at) = at {
        let moved: Vec<SnapshotEntry> = o.family.snapshots.drain(..=at).collect();
        let s = moved.last().expect("the origin moves").clone();
        // The old parent becomes a clone of S: everything born by S's txg is S's now, one
        // range in its lists.
        let folded =
            moved[..at].iter().map(|m| m.txg + 1).chain(o.family.origin.map(|p| p.txg + 1));
        let folded: Vec<u64> = folded.collect();
        for list in o.family.lists_mut() {
            for &start in &folded {
                merge_range(list, start, 0);
            }
        }
        let grandparent = o.family.origin;
        o.family.origin =
            Some(Origin { snapshot: s.id, txg: s.txg, referenced_bytes: s.space.referenced_bytes });
        // The clone takes them before its own snapshots, and the parent's origin; its own
        // lists are counted again by the ranges they bring.
        c.family.origin = grandparent;
        let own = std::mem::take(&mut c.family.snapshots);
        c.family.snapshots = moved;
        c.family.snapshots.extend(own);
        let starts = c.family.starts();
        for i in at + 1..c.family.snapshots.len() {
            recount(spa, &mut c.family.snapshots[i].deadlist, &starts).await?;
        }
        recount(spa, &mut c.family.deadlist, &starts).await?;
    } else {
        debug_assert!(false, "promote of {clone}: its origin is not in {parent}");
    }
    trees.insert(clone.to_owned(), c);
    trees.insert(parent.to_owned(), o);
    Ok(())
}

/// Destroys snapshot `name` of `family` in the syncing txg (see the module doc).
async fn destroy_in_sync(
    spa: &Spa,
    ctx: &mut TreeUpdate<'_>,
    family: &mut Family,
    name: &str,
) -> Result<(), PoolError> {
    let Some(at) = family.snapshots.iter().position(|s| s.name == name) else {
        debug_assert!(false, "destroy of snapshot {name}, which does not exist");
        return Ok(());
    };
    let (prev_txg, prev_start) = family.before(at);
    let gone = family.snapshots.remove(at);
    let next_is_volume = at == family.snapshots.len();
    let starts = family.starts();
    let next =
        if next_is_volume { &mut family.deadlist } else { &mut family.snapshots[at].deadlist };
    let entries = super::dsl_deadlist::entries(spa, next).await?;
    // Born after the snapshot before: only the destroyed one held them.
    let (freed, kept): (Vec<BlockPointer>, Vec<BlockPointer>) =
        entries.into_iter().partition(|bp| bp.birth_txg > prev_txg);
    ctx.replaced.extend(freed);
    ctx.replaced.append(&mut next.pieces);
    let mut list = Deadlist::default();
    for bp in &kept {
        count_entry(&mut list, &starts, bp);
    }
    list.entries = kept.len() as u64;
    list.pieces = super::dsl_deadlist::write_pieces(spa, ctx.txg, &kept).await?;
    // The destroyed snapshot's own list names blocks the one before still holds: they
    // are now dead to the next dataset, whose list takes its pieces as they are.
    list.entries += gone.deadlist.entries;
    list.pieces.extend(gone.deadlist.pieces.iter().copied());
    for &(start, bytes) in &gone.deadlist.buckets {
        match list.buckets.binary_search_by_key(&start, |&(s, _)| s) {
            Ok(i) => list.buckets[i].1 += bytes,
            Err(i) => list.buckets.insert(i, (start, bytes)),
        }
    }
    *next = list;
    // Its txg no longer bounds a birth range.
    for list in family.lists_mut() {
        merge_range(list, gone.txg + 1, prev_start);
    }
    if next_is_volume {
        family.prev_snap_txg = prev_txg;
    }
    Ok(())
}

/// Counts `list`'s bytes again by the birth ranges `starts` (reading its entries).
async fn recount(spa: &Spa, list: &mut Deadlist, starts: &[u64]) -> Result<(), PoolError> {
    let entries = super::dsl_deadlist::entries(spa, list).await?;
    list.buckets.clear();
    for bp in &entries {
        count_entry(list, starts, bp);
    }
    Ok(())
}
