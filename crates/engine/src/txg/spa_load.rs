//! Opening an imported pool's data (ZFS: `spa_load`): the pool directory and space maps of
//! the newest txg, a resilver of leaves that are behind, then the intent logs' claim and replay
//! (`zil.rs`).

use sluice_format::{LogVerifier, PoolDirectory, SpaceMap};

use super::dataset::VolumeState;
use super::dmu_tx::TxgLimits;
use super::{LogStats, State, Store, StoreError};
use crate::alloc::Allocator;
use crate::intent_log::{self, LogAddress};
use crate::pool::{Pool, PoolError};
use crate::tunables::Tunables;

impl Store {
    /// Opens the data of an imported pool as of its newest uberblock. Leaves that are behind
    /// (a mirror child that was missing and is back) are resilvered first. Then every
    /// volume's intent log is claimed and replayed (records of txgs after the last synced
    /// one, each exactly once), a txg makes the result durable, and new chains start.
    pub async fn open(pool: Pool, tunables: &Tunables) -> Result<Store, StoreError> {
        pool.resilver().await?;
        let uberblock = pool.uberblock();
        let Some(root) = uberblock.root else { return Ok(Store::create(pool, tunables)) };
        let format = |source| PoolError::Format { pool: pool.name().to_owned(), source };
        let bytes = pool.read_block(&root, crate::tunables::IoClass::SyncRead).await?;
        let directory = PoolDirectory::decode(&bytes).map_err(format)?;
        let areas = pool.data_areas();
        let mut maps = Vec::new();
        for (index, pieces) in directory.space_maps.iter().enumerate() {
            let area = areas.get(index).copied().unwrap_or((0, 0));
            let mut map = SpaceMap {
                ashift: pool.ashift(),
                synced_txg: 0,
                free: vec![(area.0, area.1 - area.0)],
                deferred: vec![],
            };
            if !pieces.is_empty() {
                map.free.clear();
            }
            // The pieces' ranges, in order, are the map (the allocator checks they are sane).
            for bp in pieces {
                let bytes = pool.read_block(bp, crate::tunables::IoClass::SyncRead).await?;
                let piece = SpaceMap::decode(&bytes).map_err(format)?;
                map.ashift = piece.ashift;
                map.synced_txg = piece.synced_txg;
                map.free.extend(piece.free);
                map.deferred.extend(piece.deferred);
            }
            maps.push((map, area));
        }
        let no_space = |e| PoolError::NoSpace { pool: pool.name().to_owned(), source: e };
        let mut allocator = Allocator::load(pool.ashift(), &maps).map_err(no_space)?;
        allocator.synced(uberblock.txg);
        // Claim every chain before anything allocates, so no log block is handed out again.
        let mut chains = Vec::new();
        let log_stats = LogStats::default();
        for entry in &directory.volumes {
            let Some(mut header) = entry.log else { continue };
            if header.claim_txg == 0 {
                // First import since the crash: what synced before it is the line.
                header.claim_txg = uberblock.txg;
            }
            let head = LogAddress::from_pointer(&header.head);
            let verifier = LogVerifier {
                chain_id: header.chain_id,
                volume_id: entry.id,
                sequence: header.head_sequence,
            };
            let chain = intent_log::read_chain(&pool, head, verifier).await;
            for at in &chain.addresses {
                allocator
                    .claim_log(at.vdev, at.offset_bytes, u64::from(at.len_bytes))
                    .map_err(no_space)?;
            }
            log_stats.chains_claimed.inc();
            log_stats.blocks_claimed.add(chain.addresses.len() as u64);
            if chain.torn_tail {
                log_stats.torn_tails.inc();
            }
            chains.push((entry.name.clone(), header, chain));
        }
        let limits = TxgLimits::from_tunables(tunables);
        let volumes = directory
            .volumes
            .iter()
            .map(|entry| {
                let mut entry = entry.clone();
                if let Some((_, header, _)) = chains.iter().find(|(name, _, _)| *name == entry.name)
                {
                    entry.log = Some(*header);
                }
                (entry.name.clone(), VolumeState::new(entry, None, &limits))
            })
            .collect();
        let state = State {
            open_txg: uberblock.txg + 1,
            next_volume_id: directory.next_volume_id,
            volumes,
            space_maps: directory.space_maps.clone(),
            directory: Some(root),
            dirty_bytes: 0,
            dirty_metadata_bytes: 0,
            syncing_bytes: 0,
            syncing_metadata_bytes: 0,
            destroyed: Vec::new(),
            retired_log: Vec::new(),
        };
        let mut store = Store::assemble(pool, allocator, state, directory.ddt, tunables);
        store.log_stats = log_stats;
        store.replay(chains).await?;
        Ok(store)
    }
}
