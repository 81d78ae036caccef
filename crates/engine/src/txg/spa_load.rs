//! Opening an imported pool's data (ZFS: `spa_load`, `spa_load_verify`, `zil_claim`).
//!
//! Import reads before it writes (only a read that finds a bad mirror copy rewrites it from a
//! good one, as every read does; a dry run does not even that). It loads the newest txg: the pool directory, the space maps, and every block born in the last
//! `FREE_DEFER_TXGS + 1` txgs, data included, which is what a disk that acknowledged flushes
//! it had not made durable can lose (OpenZFS verifies the same window). Then it walks every
//! volume's intent-log chain. Only when all of that reads does it write: the replay of each
//! chain's records newer than the last synced txg (each exactly once, `zil.rs`), a sync, and
//! new chains. The directory's leaf records give the leaves back their states and error
//! counts; a leaf that is behind (each leaf's newest uberblock says which txgs it holds) is
//! resilvered in the background once the store serves, from where a recorded resilver got.
//!
//! Two failures are never papered over:
//! - A newest txg whose blocks do not verify is reported with its txg and the way out:
//!   [`ImportOptions::rewind`] goes back to the newest earlier txg whose whole tree verifies
//!   (the frees of the abandoned txgs were still deferred, so its blocks were not reused; the
//!   walk checks that they were not) and erases the abandoned uberblocks, as `zpool import -F`
//!   does. [`Store::check_import`] says which txg and how much time that loses, writing nothing.
//! - A log block that cannot be read (an I/O error on every copy, not a block that was never
//!   written) fails the import with the pool, volume and block, and changes nothing: the
//!   records past it were acknowledged as durable. Once the device answers, import replays
//!   them all. [`ImportOptions::discard_unreadable_log`] imports anyway, replaying the chain up
//!   to the unreadable block and reporting what was dropped (`zpool import -m`).

use std::collections::BTreeMap;

use sluice_format::{LogHeader, PoolDirectory, SpaceMap, Uberblock, DATA_START_BYTES};

use super::dataset::Dataset;
use super::dataset::Datasets;
use super::dsl_pool::TxgLimits;
use super::spa_sync::SyncedMetadata;
use super::zil::{self, LostLog};
use super::{LogStats, Store, StoreError};
use crate::alloc::{Allocator, FREE_DEFER_TXGS};
use crate::intent_log::Chain;
use crate::objset;
use crate::pool::{Pool, PoolError};
use crate::tunables::{IoClass, Tunables};

/// How to import a pool's data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// When the newest txg does not verify, go back to the newest earlier one whose whole tree
    /// does (`zpool import -F`). The writes of the txgs in between are lost; the report says
    /// how many seconds of them.
    pub rewind: bool,
    /// Import even when a volume's intent log cannot be read: replay the chain up to the
    /// unreadable block and drop the rest (`zpool import -m`). The report names each volume
    /// and block.
    pub discard_unreadable_log: bool,
}

/// What an import found, and did or (for [`Store::check_import`]) would do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// The txg opened, and when it was synced (seconds on the pool's clock).
    pub txg: u64,
    pub timestamp_secs: u64,
    /// Blocks read and verified before anything was written.
    pub blocks_verified: u64,
    /// Set when the import went back past damaged txgs.
    pub rewound: Option<Rewind>,
    /// Intent-log records newer than the txg opened: replayed (or to be replayed).
    pub records_to_replay: u64,
    /// Logs cut short at an unreadable block ([`ImportOptions::discard_unreadable_log`]).
    pub lost_logs: Vec<LostLog>,
    /// Volumes of a pool written before space figures were kept whose figures were counted
    /// past indirect blocks that could not be read: (volume, blocks skipped). Their used
    /// bytes show low.
    pub space_counted_short: Vec<(String, u64)>,
}

/// A rewind past damaged txgs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewind {
    /// The newest txg found, which did not verify, and when it was synced.
    pub from_txg: u64,
    pub from_timestamp_secs: u64,
    /// Why it did not verify (the first damaged block).
    pub damage: String,
    /// Txgs abandoned, and the seconds of writes between the txg opened and the newest.
    pub txgs_lost: u64,
    pub seconds_lost: u64,
}

/// A txg's data as loaded, not yet written to.
struct Loaded {
    uberblock: Uberblock,
    directory: PoolDirectory,
    allocator: Allocator,
    /// Each volume's chain, with its header's claim txg set.
    chains: Vec<(String, LogHeader, Chain)>,
    log_stats: LogStats,
    report: ImportReport,
}

/// Why one txg could not be loaded, in words.
type Damage = String;

impl Store {
    /// Opens the data of an imported pool as of its newest uberblock; see the module doc.
    pub async fn open(pool: Pool, tunables: &Tunables) -> Result<Store, StoreError> {
        Ok(Store::import(pool, tunables, ImportOptions::default()).await?.0)
    }

    /// Says what [`Store::import`] with `options` would do (which txg, what a rewind loses,
    /// how many log records replay, which logs would be cut short) without writing anything:
    /// `zpool import -n`.
    pub async fn check_import(
        pool: &Pool,
        options: ImportOptions,
    ) -> Result<ImportReport, StoreError> {
        if pool.uberblock().root.is_none() {
            return Ok(ImportReport { txg: pool.uberblock().txg, ..ImportReport::default() });
        }
        pool.set_read_only(true);
        let loaded = load(pool, options).await;
        pool.set_read_only(false);
        Ok(loaded?.report)
    }

    /// Opens the data of an imported pool; see the module doc. Returns the store and what the
    /// import found.
    pub async fn import(
        pool: Pool,
        tunables: &Tunables,
        options: ImportOptions,
    ) -> Result<(Store, ImportReport), StoreError> {
        if pool.uberblock().root.is_none() {
            pool.resilver().await?;
            let report = ImportReport { txg: pool.uberblock().txg, ..ImportReport::default() };
            return Ok((Store::create(pool, tunables), report));
        }
        let loaded = load(&pool, options).await;
        let Loaded { uberblock, directory, allocator, chains, log_stats, mut report } = loaded?;
        if report.rewound.is_some() {
            pool.rewind_to(uberblock).await?;
        }
        // Leaves keep their recorded states and error counts; a leaf behind is resilvered in
        // the background once the store serves (`Store::resume_scan`).
        if let Some(records) = &directory.records {
            // The directory says which leaves are members; a change of leaves that a crash
            // cut short between its sync and its label rewrite is finished here.
            if pool.adopt_config(&records.config).await {
                pool.write_labels(uberblock.txg).await?;
            }
            // Labels written before the first key family's (a leaf missing then, say) may lack
            // the feature the directory lists: the pool has it, and its labels say so now.
            if records.config.encryption {
                pool.activate_encryption(uberblock.txg).await?;
            }
            if records.config.properties {
                pool.activate_properties(uberblock.txg).await?;
            }
            // An upgrade whose sync the directory records but whose label rewrite a crash cut
            // short: without this, the next sync's directory would drop the features from
            // the config while blocks stored as they say remain.
            let upgraded = records.config.features_disabled();
            if pool.features_disabled().iter().any(|f| !upgraded.contains(f)) {
                pool.enable_features(uberblock.txg).await?;
            }
            pool.apply_leaf_records(&records.leaves);
        }
        let scan = directory.records.as_ref().and_then(|r| r.scan.as_ref());
        pool.restore_properties(directory.properties, scan);
        let limits = TxgLimits::from_tunables(tunables, pool.env().memory_bytes());
        let mut volumes = BTreeMap::new();
        for entry in &directory.volumes {
            let mut entry = entry.clone();
            if let Some((_, header, _)) = chains.iter().find(|(name, _, _)| *name == entry.name) {
                entry.log = Some(*header);
            }
            // A pool written before the figures were kept: count them once, from the tree.
            if entry.space.is_none() {
                let (space, unreadable) =
                    objset::count_space(&pool, entry.root, entry.levels).await?;
                if unreadable > 0 {
                    report.space_counted_short.push((entry.name.clone(), unreadable));
                }
                entry.space = Some(space);
            }
            volumes.insert(entry.name.clone(), Dataset::new(entry, None, &limits));
        }
        debug_assert_eq!(
            uberblock.txg,
            pool.uberblock().txg,
            "the store opens after the loaded txg"
        );
        let datasets = Datasets::new(directory.next_volume_id, volumes);
        let synced =
            SyncedMetadata { space_maps: directory.space_maps.clone(), directory: uberblock.root };
        let store = Store::assemble(
            pool,
            allocator,
            (datasets, synced),
            (
                directory.ddt,
                log_stats,
                super::dsl_crypt::DslCrypt::new(directory.key_families.clone()),
            ),
            tunables,
        );
        // Before replay, whose syncs write the scan record again.
        if let Some(scan) = directory.records.as_ref().and_then(|r| r.scan.as_ref()) {
            store.dsl.scan().restore(store.spa.pool(), scan);
        }
        store.replay(chains).await?;
        store.settle_receives().await?;
        store.spa.pool().events().post(
            crate::fm::EventClass::PoolImport,
            None,
            vec![("txg", store.spa.pool().uberblock().txg.to_string())],
        );
        Ok((store, report))
    }
}

/// Picks the txg to open and loads it, reading only (bad mirror copies are healed unless the
/// caller made the pool read-only).
async fn load(pool: &Pool, options: ImportOptions) -> Result<Loaded, StoreError> {
    let newest = pool.uberblock();
    let candidates = if options.rewind { pool.uberblocks_found() } else { vec![newest] };
    let mut newest_damage: Option<Damage> = None;
    let mut tried = Vec::new();
    for uberblock in candidates {
        if uberblock.root.is_none() {
            continue;
        }
        // The newest txg is checked where a lying disk could have hurt it; an older one, which
        // is only opened after the newest failed, is checked whole.
        let min_birth = if uberblock.txg == newest.txg {
            uberblock.txg.saturating_sub(FREE_DEFER_TXGS + 1)
        } else {
            0
        };
        match load_txg(pool, uberblock, min_birth).await {
            Ok((directory, allocator, blocks_verified)) => {
                let rewound = (uberblock.txg != newest.txg).then(|| Rewind {
                    from_txg: newest.txg,
                    from_timestamp_secs: newest.timestamp_secs,
                    damage: newest_damage.clone().unwrap_or_default(),
                    txgs_lost: newest.txg - uberblock.txg,
                    seconds_lost: newest.timestamp_secs.saturating_sub(uberblock.timestamp_secs),
                });
                let report = ImportReport {
                    txg: uberblock.txg,
                    timestamp_secs: uberblock.timestamp_secs,
                    blocks_verified,
                    rewound,
                    ..ImportReport::default()
                };
                let rules = zil::ClaimRules {
                    rewind: options.rewind,
                    discard_unreadable_log: options.discard_unreadable_log,
                };
                let mut allocator = allocator;
                let claimed = zil::claim(pool, uberblock.txg, &directory, &mut allocator, rules);
                let zil::Claimed { chains, log_stats, lost_logs, records_to_replay } =
                    claimed.await?;
                let report = ImportReport { lost_logs, records_to_replay, ..report };
                return Ok(Loaded { uberblock, directory, allocator, chains, log_stats, report });
            }
            Err(damage) => {
                if uberblock.txg == newest.txg {
                    if !options.rewind {
                        return Err(StoreError::DamagedTxg {
                            pool: pool.name().to_owned(),
                            txg: newest.txg,
                            damage,
                        });
                    }
                    newest_damage = Some(damage.clone());
                }
                tried.push(format!("txg {}: {damage}", uberblock.txg));
            }
        }
    }
    Err(StoreError::NoIntactTxg { pool: pool.name().to_owned(), tried: tried.join("; ") })
}

/// Loads one txg: its directory, space maps and allocator, and verifies the blocks born after
/// `min_birth`. Any failure is damage to this txg.
async fn load_txg(
    pool: &Pool,
    uberblock: Uberblock,
    min_birth: u64,
) -> Result<(PoolDirectory, Allocator, u64), Damage> {
    let Some(root) = uberblock.root else { return Err("it has no pool directory".into()) };
    let verified = pool.verify_txg(&root, min_birth).await.map_err(|e| e.to_string())?;
    if let Some((bp, error)) = verified.damaged.first() {
        return Err(format!(
            "{} block(s) verify on no copy; the first, a {:?} block of level {} born in txg {}: \
             {error}",
            verified.damaged.len(),
            bp.kind,
            bp.level,
            bp.birth_txg
        ));
    }
    let format =
        |source| PoolError::Format { pool: pool.name().to_owned(), cause: source }.to_string();
    let read =
        |bp| async move { pool.read_block(bp, IoClass::SyncRead).await.map_err(|e| e.to_string()) };
    let directory = PoolDirectory::decode(&read(&root).await?).map_err(format)?;
    let areas = pool.data_areas();
    // A removed log device's hole is the directory's to say: labels that a crash left
    // unrewritten still name the device there, with its area (`Pool::adopt_config` makes the
    // tree agree later).
    let hole = |index: usize| {
        directory
            .records
            .as_ref()
            .and_then(|r| r.config.top.get(index))
            .is_some_and(|t| t.kind == sluice_format::TopKind::Hole)
    };
    let mut maps = Vec::new();
    for (index, pieces) in directory.space_maps.iter().enumerate() {
        let area = if hole(index) {
            if !pieces.is_empty() {
                return Err(format!(
                    "top-level vdev {index} is the hole of a removed log device, yet the \
                     directory lists {} space-map pieces for it",
                    pieces.len()
                ));
            }
            (DATA_START_BYTES, DATA_START_BYTES)
        } else {
            areas.get(index).copied().unwrap_or((0, 0))
        };
        let mut map = SpaceMap {
            ashift: pool.ashift(),
            synced_txg: 0,
            // A hole's area is empty.
            free: if area.1 > area.0 { vec![(area.0, area.1 - area.0)] } else { Vec::new() },
            deferred: vec![],
        };
        if !pieces.is_empty() {
            map.free.clear();
        }
        // The pieces' ranges, in order, are the map (the allocator checks they are sane).
        for bp in pieces {
            let piece = SpaceMap::decode(&read(bp).await?).map_err(format)?;
            map.ashift = piece.ashift;
            map.synced_txg = piece.synced_txg;
            map.free.extend(piece.free);
            map.deferred.extend(piece.deferred);
        }
        maps.push((map, area));
    }
    // A top-level vdev whose add a crash cut short before its sync is in the labels' tree
    // and not in the directory: the directory's vdevs are the allocator's (the import then
    // drops the other, `Pool::adopt_config`).
    let geometries: Vec<_> = (pool.geometries().into_iter().enumerate())
        .map(|(index, geometry)| geometry.filter(|_| !hole(index)))
        .collect();
    let mut allocator = Allocator::load(pool.ashift(), &maps)
        .map_err(|source| {
            PoolError::NoSpace { pool: pool.name().to_owned(), cause: source }.to_string()
        })?
        .with_geometries(&geometries[..maps.len().min(geometries.len())]);
    allocator.synced(uberblock.txg);
    Ok((directory, allocator, verified.blocks))
}
