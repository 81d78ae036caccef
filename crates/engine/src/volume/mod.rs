//! The volume front (ZFS: `zvol.c`; seed 000): what a client's requests turn
//! into.
//!
//! A write with FUA (every write, with the volume property sync=always) commits the intent log
//! up to its own record; a flush commits everything
//! written to the volume before it, whichever connection wrote it, so one flush covers all of
//! a client's connections (NBD's CAN_MULTI_CONN is honest). Trim and write-zeroes are logged
//! like writes.
//!
//! Requests run as tasks: how many a volume serves at once is bounded only by its clients'
//! queue depths and the dirty-data throttle. `volume.request_threads=N` caps it at N per
//! volume, shared by every handle, to reproduce seed 000: with a cap, committers parked on the
//! log hold every slot, so later writes cannot join the next log block and blocks stay small.
//!
//! Every answered request is counted in the volume's [`VolumeStats`], with its latency from
//! arrival (before any wait for a slot) to answer: what `sluice pool iostat` shows per volume.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_format::SyncMode;

use crate::device::AlignedBuf;
use crate::rt::Time;
use crate::stats::{VolumeOp, VolumeStats};
use crate::txg::{Dataset, ReadData, Store, StoreError, WriteData};

/// A handle on one volume of a store. Cheap to clone; every clone shares the volume's
/// request limit.
#[derive(Clone, Debug)]
pub struct Volume {
    store: Arc<Store>,
    /// The volume itself: requests reach it without a lookup by name.
    dataset: Arc<Dataset>,
    gate: Option<Arc<async_lock::Semaphore>>,
    /// Requests in flight on the volume (all handles): the store keeps a lone writer's
    /// partial-block writes as patches, and completes them at once under concurrency.
    requests: Arc<AtomicUsize>,
    stats: Arc<VolumeStats>,
    /// Fixed when the volume is made.
    block_bytes: u64,
    /// Its key family (0: not encrypted), fixed when the volume is made.
    key_family: u64,
}

/// Counts one request while it is served.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn new(counter: &'a AtomicUsize) -> InFlight<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Volume {
    /// A handle on the volume `name`, or on snapshot `VOL@SNAP` (read-only).
    pub fn open(store: &Arc<Store>, name: &str) -> Result<Volume, StoreError> {
        let dataset = store.export_dataset(name)?;
        Ok(Volume {
            store: Arc::clone(store),
            gate: dataset.gate().cloned(),
            requests: Arc::clone(dataset.requests()),
            stats: Arc::clone(dataset.stats()),
            block_bytes: u64::from(dataset.block_bytes()).max(1),
            key_family: dataset.key_family(),
            dataset,
        })
    }

    fn now(&self) -> Time {
        self.store.pool().env().now()
    }

    /// Counts an answered request; `bytes` are the data it moved, if it succeeded.
    fn answered<T>(
        &self,
        op: VolumeOp,
        arrived: Time,
        bytes: u64,
        result: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let stats = &self.stats;
        stats.requests[op.index()].inc();
        match (&result, op) {
            (Ok(_), VolumeOp::Read) => stats.read_bytes.add(bytes),
            (Ok(_), VolumeOp::Write) => stats.write_bytes.add(bytes),
            (Ok(_), _) => {}
            (Err(_), _) => stats.errors.inc(),
        }
        stats.latency[op.index()].record(self.now().since(arrived));
        result
    }

    pub fn name(&self) -> String {
        self.dataset.name()
    }

    /// Whether the volume is encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.key_family != 0
    }

    /// Whether the volume is encrypted and its key is not loaded (unloaded since the handle
    /// was opened, say): a server closes the client's connection then.
    pub fn key_unloaded(&self) -> bool {
        self.key_family != 0 && !self.store.pool().zio().keys().is_loaded(self.key_family)
    }

    /// Identifies the volume (or snapshot) this handle serves, the same for every handle on
    /// it while any of them lives: the NBD server places a volume's connections by it.
    pub fn dataset_key(&self) -> usize {
        Arc::as_ptr(&self.dataset) as usize
    }

    /// Whether this is a snapshot, served read-only.
    pub fn is_read_only(&self) -> bool {
        self.dataset.is_read_only()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The volume's size now (it may be resized while a handle is open), or `None` once it is
    /// destroyed.
    pub fn size_bytes(&self) -> Option<u64> {
        self.store.check_exists(&self.dataset).ok().map(|()| self.dataset.size_bytes())
    }

    /// The volume's block size: the best request size and alignment.
    pub fn block_bytes(&self) -> Option<u32> {
        self.store.check_exists(&self.dataset).ok().map(|()| self.dataset.block_bytes())
    }

    /// Holds one of the volume's request slots when it has a limit.
    async fn slot(&self) -> Option<async_lock::SemaphoreGuardArc> {
        match &self.gate {
            Some(gate) => Some(gate.acquire_arc().await),
            None => None,
        }
    }

    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        let arrived = self.now();
        let _slot = self.slot().await;
        let _counted = InFlight::new(&self.requests);
        let result = self
            .store
            .read_with_status_in(&self.dataset, offset, len)
            .await
            .map(|(d, _)| d.to_vec());
        self.answered(VolumeOp::Read, arrived, len, result)
    }

    /// Reads, and maps what is allocated (see [`Store::read_with_status`]).
    pub async fn read_with_status(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<(ReadData, Vec<(u64, bool)>), StoreError> {
        let arrived = self.now();
        let _slot = self.slot().await;
        let _counted = InFlight::new(&self.requests);
        let result = self.store.read_with_status_in(&self.dataset, offset, len).await;
        self.answered(VolumeOp::Read, arrived, len, result)
    }

    /// Writes `data` at `offset`; with `fua` it is durable when this returns. Without it, a
    /// write that is the volume's only request may start its log write early
    /// ([`Store::commit_early`]).
    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), StoreError> {
        self.write_data(offset, WriteData::Borrowed(data), fua).await
    }

    /// [`Volume::write`] of a buffer the caller hands over (a request's payload): a small write
    /// is logged in this very buffer instead of a copy of it.
    pub async fn write_owned(
        &self,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    ) -> Result<(), StoreError> {
        self.write_data(offset, WriteData::Owned(data), fua).await
    }

    /// Whether a write's whole blocks should have their checksums taken as they arrive
    /// (`UninitBuf::remember_xxh3`): only where the sync would checksum the bytes as
    /// received, so not on an encrypted volume, whose blocks are checksummed sealed. A block
    /// that the sync then compresses has had its checksum taken for nothing, about 0.4 us per
    /// 16 KiB in cache, where lz4 takes some 15 us.
    pub fn checksums_on_arrival(&self) -> bool {
        !self.is_encrypted()
    }

    /// The volume's block size if a write of `len` bytes at `offset` covers whole blocks
    /// only: its payload can then be received into a buffer per block and handed over
    /// ([`Volume::write_blocks`]).
    pub fn whole_blocks(&self, offset: u64, len: u64) -> Option<usize> {
        let bs = self.block_bytes;
        (len >= bs && offset % bs == 0 && len % bs == 0).then_some(bs as usize)
    }

    /// [`Volume::write`] of a payload received into one buffer per block, from a block
    /// boundary ([`Volume::whole_blocks`]): each buffer becomes its dirty block, without the
    /// copy a contiguous payload's bytes take into their blocks (ZFS's `dmu_assign_arcbuf`).
    pub async fn write_blocks(
        &self,
        offset: u64,
        blocks: Vec<AlignedBuf>,
        fua: bool,
    ) -> Result<(), StoreError> {
        assert!(
            offset % self.block_bytes == 0
                && blocks.iter().all(|b| b.len() as u64 == self.block_bytes),
            "write_blocks takes whole blocks from a block boundary"
        );
        let blocks = blocks.into_iter().map(Arc::new).collect();
        self.write_data(offset, WriteData::Blocks(blocks), fua).await
    }

    /// Whether a write of `len` bytes logs its whole blocks by pointer (their blocks written in
    /// place when committed, not copied into log blocks): what a part written ahead must be,
    /// and the rest after it, for the parts to be filled early ([`Volume::write_blocks_ahead`]).
    pub fn logs_by_pointer(&self, len: u64) -> bool {
        self.store.logs_by_pointer(&self.dataset, len)
    }

    /// A part of a write of whole blocks whose payload is still arriving (a large NBD write,
    /// as its bytes come off the socket): `blocks`, from block boundary `offset`, enter the
    /// open txg now, and when nothing else is in flight on the volume their records logged by
    /// pointer are filled at once ([`Store::fill_early`]), so the device writes them while the
    /// rest arrives and a flush after the write finds most of it written. The write is
    /// answered, and counted, by the [`Volume::write_blocks`] of its last part, whose commit
    /// covers these records too; a part is not a change of its own for the early commit's
    /// pattern. A part that fails is answered here (the caller replies with its error and
    /// drops the rest), and the parts before it stay written, as any failed write may leave
    /// its range.
    pub async fn write_blocks_ahead(
        &self,
        offset: u64,
        blocks: Vec<AlignedBuf>,
    ) -> Result<(), StoreError> {
        assert!(
            offset % self.block_bytes == 0
                && blocks.iter().all(|b| b.len() as u64 == self.block_bytes),
            "write_blocks_ahead takes whole blocks from a block boundary"
        );
        let arrived = self.now();
        let _slot = self.slot().await;
        let _counted = InFlight::new(&self.requests);
        let len = blocks.len() as u64 * self.block_bytes;
        let blocks = WriteData::Blocks(blocks.into_iter().map(Arc::new).collect());
        let result = self.store.write_data_in(&self.dataset, offset, blocks).await;
        match result {
            Ok(sequence) => {
                if self.dataset.sync_mode() != SyncMode::Disabled
                    && self.requests.load(Ordering::Relaxed) == 1
                {
                    self.store.fill_early(&self.dataset, sequence);
                }
                self.store.note_part(&self.dataset);
                self.stats.write_bytes.add(len);
                Ok(())
            }
            Err(e) => self.answered(VolumeOp::Write, arrived, len, Err(e)),
        }
    }

    async fn write_data(
        &self,
        offset: u64,
        data: WriteData<'_>,
        fua: bool,
    ) -> Result<(), StoreError> {
        let arrived = self.now();
        let _slot = self.slot().await;
        let _counted = InFlight::new(&self.requests);
        let len = data.len() as u64;
        let result = async {
            let sequence =
                self.store.modify_answering_early(&self.dataset, offset, len, Some(data)).await?;
            if fua || self.dataset.sync_mode() == SyncMode::Always {
                self.store.commit_in(&self.dataset, sequence).await?;
            } else if self.requests.load(Ordering::Relaxed) == 1 {
                self.store.commit_early(&self.dataset, sequence);
            }
            Ok(())
        }
        .await;
        if result.is_ok() && (offset % self.block_bytes != 0 || len % self.block_bytes != 0) {
            self.stats.partial_writes.inc();
        }
        self.answered(VolumeOp::Write, arrived, len, result)
    }

    /// Zeroes a range (trim and write-zeroes); whole blocks become holes.
    pub async fn zero(&self, offset: u64, len: u64, fua: bool) -> Result<(), StoreError> {
        let arrived = self.now();
        let _slot = self.slot().await;
        let _counted = InFlight::new(&self.requests);
        let result = async {
            let sequence =
                self.store.modify_answering_early(&self.dataset, offset, len, None).await?;
            if fua || self.dataset.sync_mode() == SyncMode::Always {
                self.store.commit_in(&self.dataset, sequence).await?;
            }
            Ok(())
        }
        .await;
        self.answered(VolumeOp::Zero, arrived, 0, result)
    }

    /// Makes every completed write and zero of this volume durable.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let arrived = self.now();
        let _slot = self.slot().await;
        let _counted = InFlight::new(&self.requests);
        let result = self.store.flush_in(&self.dataset).await;
        self.answered(VolumeOp::Flush, arrived, 0, result)
    }

    /// Runs of (length, allocated) over `[offset, offset+len)`.
    pub async fn block_status(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, bool)>, StoreError> {
        let _slot = self.slot().await;
        self.store.block_status_in(&self.dataset, offset, len).await
    }
}
