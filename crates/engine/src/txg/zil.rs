//! The store's side of the intent log (ZFS: `zil.c`'s `zil_commit`, `zil_claim`,
//! `zil_replay`): commits for FUA writes and flushes, early commits, and replay at import.
//!
//! The log writer itself (log blocks, the pipelined and batch policies, the chain reader) is
//! `crate::intent_log`; this file decides when to use it and when a txg sync must answer
//! instead (a chain not yet anchored by a sync, or a failed log write).

use std::sync::Arc;

use sluice_format::{LogHeader, LogRecord, LogVerifier, LOG_HEADER_BYTES};

use super::dmu::Apply;
use super::{Dataset, Store, StoreError};
use crate::intent_log::{self, LogAddress, LogError, LogWriter};
use crate::pool::PoolError;

impl Store {
    /// A new, not yet anchored log chain for a volume.
    pub(super) fn new_log(&self, volume_id: u64) -> Result<Arc<LogWriter>, StoreError> {
        Ok(Arc::new(LogWriter::new(
            self.pool.name(),
            &self.allocator,
            self.limits.log_policy,
            self.limits.commit_timeout_pct,
            self.chain_id(),
            volume_id,
            self.limits.log_block_bytes_max,
        )?))
    }

    pub(super) fn chain_id(&self) -> u64 {
        self.pool.env().unique_rng("intent log chain").u64().max(1)
    }

    /// Applies each claimed chain's records that are newer than its claim txg (the last txg
    /// synced before the crash) and than what an interrupted replay already applied, then retires the chains and starts new ones. Syncs
    /// that happen during replay (dirty data) record the progress in the old header, so an
    /// import interrupted here replays every record exactly once in the end.
    pub(super) async fn replay(
        &self,
        chains: Vec<(String, LogHeader, intent_log::Chain)>,
    ) -> Result<(), StoreError> {
        let stats = &self.log_stats;
        for (name, header, chain) in &chains {
            let dataset = self.dataset(name)?;
            for record in chain.blocks.iter().flat_map(|b| b.records.iter()) {
                if record.txg() <= header.claim_txg {
                    stats.records_already_synced.inc();
                    continue;
                }
                if record.sequence() <= header.replayed_record {
                    stats.records_already_replayed.inc();
                    continue;
                }
                let (offset, len, data) = match record {
                    LogRecord::Write { offset, data, .. } => {
                        (*offset, data.len() as u64, Some(&data[..]))
                    }
                    LogRecord::Zero { offset, len, .. } => (*offset, *len, None),
                    LogRecord::WriteIndirect { .. } => {
                        return Err(StoreError::Pool(PoolError::Format {
                            pool: self.pool.name().to_owned(),
                            source: sluice_format::FormatError::Invalid {
                                what: "log record",
                                field: "kind (indirect writes are not written by this version)",
                                value: 2,
                            },
                        }));
                    }
                };
                if Self::check_range(&dataset, dataset.size_bytes(), offset, len).is_err() {
                    stats.records_out_of_range.inc();
                    continue;
                }
                self.modify(&dataset, offset, len, data, Apply::Replay(record.sequence())).await?;
                stats.records_replayed.inc();
            }
        }
        // Retire the old chains and start new ones; one sync makes it all durable.
        {
            let mut state = self.state.lock();
            for (_, _, chain) in &chains {
                state.retired_log.extend(chain.addresses.iter().copied());
            }
        }
        let datasets: Vec<Arc<Dataset>> = self.state.lock().volumes.values().cloned().collect();
        for dataset in datasets {
            let log = self.new_log(dataset.id)?;
            dataset.state.lock().log = Some(log);
        }
        self.sync().await?;
        Ok(())
    }

    /// Where `volume`'s log chain starts now (its oldest block still needed), if it has one.
    pub fn log_head(&self, volume: &str) -> Option<(LogAddress, LogVerifier)> {
        let log = self.dataset(volume).ok()?.state.lock().log.clone()?;
        Some(log.head())
    }

    /// Log blocks written by the volumes' current chains.
    pub fn log_blocks_written(&self) -> u64 {
        self.state
            .lock()
            .volumes
            .values()
            .filter_map(|d| d.state.lock().log.as_ref().map(|l| l.lwbs_written()))
            .sum()
    }

    /// A write that is durable when this returns (NBD's FUA): commits up to its own record.
    pub async fn write_durable(
        &self,
        volume: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let sequence = self.write(volume, offset, data).await?;
        self.commit(volume, sequence).await
    }

    /// Makes every write and zero on `volume` that returned before this call durable (NBD's
    /// FLUSH; it covers every connection to the volume).
    pub async fn flush(&self, volume: &str) -> Result<(), StoreError> {
        let dataset = self.dataset(volume)?;
        self.flush_in(&dataset).await
    }

    /// [`Store::flush`] through a handle's dataset.
    pub async fn flush_in(&self, dataset: &Dataset) -> Result<(), StoreError> {
        let log = dataset.state.lock().log.clone();
        let last = log.as_ref().map_or(0, |log| log.last_record());
        self.commit_in(dataset, last).await
    }

    /// Returns once record `sequence` of `volume`'s log and every earlier one are durable:
    /// through the log when its chain is anchored and healthy, else through a txg sync.
    pub async fn commit(&self, volume: &str, sequence: u64) -> Result<(), StoreError> {
        let dataset = self.dataset(volume)?;
        self.commit_in(&dataset, sequence).await
    }

    /// [`Store::commit`] through a handle's dataset.
    pub async fn commit_in(&self, dataset: &Dataset, sequence: u64) -> Result<(), StoreError> {
        self.check_live()?;
        let _guard = self.panic_guard("a log commit");
        self.check_exists(dataset)?;
        let log = dataset.state.lock().log.clone();
        let Some(log) = log else {
            // Replay is still running: only a sync makes anything durable.
            self.sync().await?;
            return Ok(());
        };
        log.note_commit();
        if log.durable_record() >= sequence {
            return Ok(());
        }
        self.log_stats.commits.inc();
        if log.anchored() {
            match log.commit(&self.pool, &self.allocator, sequence).await {
                Ok(()) => return Ok(()),
                // The sync below covers the record, and replaces the failed chain.
                Err(LogError::Failed { .. } | LogError::Pool(_)) => {}
            }
        }
        self.log_stats.commits_via_txg.inc();
        // The record's txg is at most the open one, which this sync makes durable.
        self.sync().await?;
        Ok(())
    }

    /// Starts writing record `sequence` to `volume`'s log now, without waiting, when the log
    /// asks for it (`intent_log.early_commit`, [`LogWriter::wants_early`]); the caller is a
    /// write that was the only request in flight on the volume. A failure is left to the
    /// client's own commit, which falls back to a txg sync.
    pub fn commit_early(self: &Arc<Self>, dataset: &Dataset, sequence: u64) {
        if !self.limits.early_commit {
            return;
        }
        let Some(log) = dataset.state.lock().log.clone() else { return };
        if !log.wants_early() {
            return;
        }
        self.log_stats.early_commits.inc();
        let store = Arc::clone(self);
        self.pool.env().spawn("early log commit", async move {
            let _guard = store.panic_guard("an early log commit");
            let _ = log.commit(&store.pool, &store.allocator, sequence).await;
        });
    }
}

/// Appends the records of one change: a zero as one record, a write in pieces that each fit
/// the largest log block. Returns the last sequence.
pub(super) fn append_records(
    log: &LogWriter,
    now: crate::rt::Time,
    txg: u64,
    offset: u64,
    len: u64,
    data: Option<&[u8]>,
    block_bytes_max: u32,
) -> u64 {
    let Some(data) = data else {
        return log.append(now, |sequence| LogRecord::Zero { txg, sequence, offset, len });
    };
    // Header, record header and write fields, rounded down to whole 4 KiB pieces.
    let piece = (block_bytes_max as usize - LOG_HEADER_BYTES - 40) / 4096 * 4096;
    let mut sequence = 0;
    for (i, chunk) in data.chunks(piece.max(512)).enumerate() {
        let at = offset + (i * piece.max(512)) as u64;
        sequence = log.append(now, |sequence| LogRecord::Write {
            txg,
            sequence,
            offset: at,
            data: chunk.to_vec(),
        });
    }
    sequence
}
