//! Volumes as datasets of the pool (ZFS: `dsl_dataset.c`, `zvol.c`'s administration):
//! create, destroy, resize, properties, and each volume's in-memory state.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_format::{DedupMode, VolumeEntry};

use super::dbuf::Block;
use super::dmu_tx::TxgLimits;
use super::{Store, StoreError, BLOCK_BYTES_MAX, BLOCK_BYTES_MIN};
use crate::intent_log::LogWriter;
use crate::objset::{self};
use crate::stats::VolumeStats;
use sluice_format::VOLUME_NAME_BYTES_MAX;

#[derive(Debug)]
pub(super) struct VolumeState {
    /// `entry.log` is the log header of the last synced txg.
    pub(super) entry: VolumeEntry,
    /// Levels of the tree on disk; below `entry.levels` after a grow until the next sync.
    pub(super) disk_levels: u8,
    pub(super) open: BTreeMap<u64, Block>,
    pub(super) syncing: BTreeMap<u64, Block>,
    /// The volume's intent log; `None` while import replays the old chain (the directory
    /// keeps pointing at it until replay is complete).
    pub(super) log: Option<Arc<LogWriter>>,
    /// Bounds the requests served at once when `volume.request_threads` is set.
    pub(super) gate: Option<Arc<async_lock::Semaphore>>,
    /// Requests the volume front is serving now (crate::volume counts them).
    pub(super) requests: Arc<std::sync::atomic::AtomicUsize>,
    /// What the volume front has answered since import.
    pub(super) stats: Arc<VolumeStats>,
    /// This volume's part of the open txg's `dirty_bytes`.
    pub(super) dirty_bytes: u64,
}

impl VolumeState {
    pub(super) fn new(
        entry: VolumeEntry,
        log: Option<Arc<LogWriter>>,
        limits: &TxgLimits,
    ) -> VolumeState {
        VolumeState {
            disk_levels: entry.levels,
            entry,
            open: BTreeMap::new(),
            syncing: BTreeMap::new(),
            log,
            gate: (limits.request_threads > 0)
                .then(|| Arc::new(async_lock::Semaphore::new(limits.request_threads))),
            requests: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            stats: Arc::new(VolumeStats::default()),
            dirty_bytes: 0,
        }
    }

    /// The newest in-memory version of block `index`, if any.
    pub(super) fn cached(&self, index: u64) -> Option<&Block> {
        self.open.get(&index).or_else(|| self.syncing.get(&index))
    }
}

pub(super) fn check_volume_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= VOLUME_NAME_BYTES_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidVolumeName { name: name.to_owned() })
    }
}

impl Store {
    /// Creates a volume; it is durable once the next sync completes.
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
    ) -> Result<(), StoreError> {
        self.check_live()?;
        check_volume_name(name)?;
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
        {
            return Err(StoreError::InvalidBlockSize { volume: name.to_owned(), block_bytes });
        }
        if size_bytes == 0 || size_bytes % u64::from(block_bytes) != 0 {
            return Err(StoreError::InvalidSize {
                volume: name.to_owned(),
                size_bytes,
                block_bytes,
            });
        }
        let mut state = self.state.lock();
        if state.volumes.contains_key(name) {
            return Err(StoreError::VolumeExists {
                pool: self.pool.name().to_owned(),
                volume: name.to_owned(),
            });
        }
        let id = state.next_volume_id;
        let log = self.new_log(id)?;
        state.next_volume_id += 1;
        let levels = objset::levels_for(size_bytes / u64::from(block_bytes));
        let entry = VolumeEntry {
            id,
            name: name.to_owned(),
            size_bytes,
            block_bytes,
            levels,
            root: None,
            log: None,
            dedup: DedupMode::Off,
        };
        state.volumes.insert(name.to_owned(), VolumeState::new(entry, Some(log), &self.limits));
        Ok(())
    }

    /// Sets a volume's dedup property; blocks written from the next sync on follow it (blocks
    /// already stored stay as they are). Durable with the next sync.
    pub fn set_dedup(&self, name: &str, mode: DedupMode) -> Result<(), StoreError> {
        self.check_live()?;
        let mut state = self.state.lock();
        let volume = state.volumes.get_mut(name).ok_or_else(|| self.no_such_volume(name))?;
        volume.entry.dedup = mode;
        Ok(())
    }

    /// Destroys a volume; its blocks are freed by the next sync.
    pub fn destroy_volume(&self, name: &str) -> Result<(), StoreError> {
        self.check_live()?;
        let mut state = self.state.lock();
        let volume = state.volumes.remove(name).ok_or_else(|| self.no_such_volume(name))?;
        if let Some(log) = &volume.log {
            state.retired_log.extend(log.retire());
        }
        if let Some(root) = volume.entry.root {
            state.destroyed.push((root, volume.disk_levels));
        }
        Ok(())
    }

    /// Changes a volume's size. Growing keeps every block; shrinking discards the blocks past
    /// the new end (their space is freed by the next sync).
    pub async fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<(), StoreError> {
        self.check_live()?;
        let _guard = self.panic_guard("a volume resize");
        let entry = self.volume_entry(name)?;
        let bs = u64::from(entry.block_bytes);
        if size_bytes == 0 || size_bytes % bs != 0 {
            return Err(StoreError::InvalidSize {
                volume: name.to_owned(),
                size_bytes,
                block_bytes: entry.block_bytes,
            });
        }
        let new_blocks = size_bytes / bs;
        let missing = || self.no_such_volume(name);
        if size_bytes < entry.size_bytes {
            // Find the stored blocks past the end, then drop them (and any dirty ones). A sync
            // that ends during the walk moves the tree: walk the new one.
            loop {
                let (root, disk_levels) = {
                    let state = self.state.lock();
                    let volume = state.volumes.get(name).ok_or_else(missing)?;
                    (volume.entry.root, volume.disk_levels)
                };
                let stored = objset::walk(&self.pool, root, disk_levels).await?;
                let mut state = self.state.lock();
                let volume = state.volumes.get_mut(name).ok_or_else(missing)?;
                if (volume.entry.root, volume.disk_levels) != (root, disk_levels) {
                    continue;
                }
                volume.open.retain(|&index, _| index < new_blocks);
                // The syncing txg stores its blocks past the end; the next sync frees them.
                let syncing: Vec<u64> =
                    volume.syncing.range(new_blocks..).map(|(&i, _)| i).collect();
                let stored = stored
                    .into_iter()
                    .filter(|&(level, index, _)| level == 0 && index >= new_blocks)
                    .map(|(_, index, _)| index);
                for index in stored.chain(syncing) {
                    volume.open.insert(index, Block::Zero);
                }
                volume.entry.size_bytes = size_bytes;
                break;
            }
        } else {
            let mut state = self.state.lock();
            let volume = state.volumes.get_mut(name).ok_or_else(missing)?;
            volume.entry.size_bytes = size_bytes;
            volume.entry.levels = volume.entry.levels.max(objset::levels_for(new_blocks));
        }
        Ok(())
    }

    /// One volume's entry (name, size, block size), if it exists.
    pub fn volume_info(&self, name: &str) -> Option<VolumeEntry> {
        self.state.lock().volumes.get(name).map(|v| v.entry.clone())
    }

    /// Names and sizes of the volumes.
    pub fn volumes(&self) -> Vec<VolumeEntry> {
        self.state.lock().volumes.values().map(|v| v.entry.clone()).collect()
    }

    pub(super) fn volume_entry(&self, name: &str) -> Result<VolumeEntry, StoreError> {
        self.state
            .lock()
            .volumes
            .get(name)
            .map(|v| v.entry.clone())
            .ok_or_else(|| self.no_such_volume(name))
    }

    /// What `volume`'s clients have asked of it since import, shared by every handle on it.
    pub fn volume_stats(&self, volume: &str) -> Result<Arc<VolumeStats>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| Arc::clone(&v.stats))
            .ok_or_else(|| self.no_such_volume(volume))
    }

    /// The volume's request limit, shared by every handle on it (`volume.request_threads`).
    pub fn request_gate(
        &self,
        volume: &str,
    ) -> Result<Option<Arc<async_lock::Semaphore>>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| v.gate.clone())
            .ok_or_else(|| self.no_such_volume(volume))
    }

    /// The counter of requests in flight on `volume`, shared by every handle on it.
    pub fn request_counter(
        &self,
        volume: &str,
    ) -> Result<Arc<std::sync::atomic::AtomicUsize>, StoreError> {
        self.state
            .lock()
            .volumes
            .get(volume)
            .map(|v| Arc::clone(&v.requests))
            .ok_or_else(|| self.no_such_volume(volume))
    }

    pub(super) fn no_such_volume(&self, volume: &str) -> StoreError {
        StoreError::NoSuchVolume { pool: self.pool.name().to_owned(), volume: volume.to_owned() }
    }
}
