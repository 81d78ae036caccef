//! Send and receive (ZFS: `dmu_send.c`, `dmu_recv.c`): a snapshot as a stream of records
//! (sluice_format's send stream), whole or as the change since an older snapshot, and its
//! application on another pool.
//!
//! A send walks the snapshot's tree in block order. An incremental one skips every subtree
//! born at or before the older snapshot's txg (copy-on-write gives a parent a birth no older
//! than its children), so its work and its size follow the blocks that changed, not the
//! volume's size; within an indirect block born since, a hole is sent as a free of its range,
//! since it may have held data in the older snapshot. Blocks go as they are stored, compressed
//! ones compressed.
//!
//! A receive writes into a hidden volume (`%recv-TARGET`; no volume name may hold `%`): for a
//! full stream a new one, for an incremental one a clone of the target's newest snapshot,
//! which must be the stream's older snapshot. Only once the end record has checked every record
//! before it is the result snapshotted (with the sender's name and guid) and put in the
//! target's place: a new volume is renamed; for an incremental one the clone is promoted over
//! the target, the old target destroyed and the clone renamed. A stream refused part way (a
//! damaged, cut or reordered record) leaves nothing visible: the hidden volume is destroyed.

use sluice_format::{
    BlockCompression, BlockPointer, StreamBegin, StreamError, StreamRecord, BLKPTR_BYTES,
    COMPRESSED_HEADER_BYTES,
};

use super::{Store, StoreError};
use crate::objset::INDIRECT_BPS;
use crate::pool::compress::decompress_stored;
use crate::tunables::IoClass;

/// What a send or a receive moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamSummary {
    /// Records, the begin and end records included.
    pub records: u64,
    pub data_blocks: u64,
    /// Data bytes as they travel (compressed blocks compressed).
    pub data_bytes: u64,
    pub free_records: u64,
}

/// The prefix of a hidden receive volume's name.
pub const RECEIVE_PREFIX: &str = "%recv-";

impl Store {
    /// Sends snapshot `volume@snapshot`, whole, or with `from` only what changed since that
    /// older snapshot of the same volume (ZFS: `zfs send [-i @from] vol@snap`). `emit` takes
    /// each record in order, the begin record first; the caller writes the end record
    /// (sluice_format's `StreamWriter::finish`).
    pub async fn send_snapshot(
        &self,
        volume: &str,
        snapshot: &str,
        from: Option<&str>,
        emit: &mut (dyn FnMut(StreamRecord) -> Result<(), StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        self.check_live()?;
        let dataset = self.dataset(volume)?;
        let entry = dataset.state.lock().entry.clone();
        let find = |name: &str| {
            entry.snapshots.iter().find(|s| s.name == name).cloned().ok_or_else(|| {
                StoreError::NoSuchSnapshot {
                    pool: self.pool.name().to_owned(),
                    volume: volume.to_owned(),
                    snapshot: name.to_owned(),
                }
            })
        };
        let to = find(snapshot)?;
        let older = from.map(find).transpose()?;
        if let Some(older) = &older {
            if older.txg >= to.txg {
                return Err(StoreError::InvalidProperty {
                    volume: volume.to_owned(),
                    reason: format!(
                        "an incremental send goes from an older snapshot to a newer one; \
                         {} is not older than {}",
                        older.name, to.name
                    ),
                });
            }
        }
        let stream_error = |source| StoreError::Stream { volume: volume.to_owned(), source };
        let mut summary = StreamSummary::default();
        emit(StreamRecord::Begin(StreamBegin {
            block_bytes: entry.block_bytes,
            size_bytes: to.size_bytes,
            guid: to.guid,
            txg: to.txg,
            creation_secs: to.creation_secs,
            from_guid: older.as_ref().map(|o| o.guid),
            name: to.name.clone(),
        }))
        .map_err(stream_error)?;
        summary.records += 1;
        let since = older.as_ref().map_or(0, |o| o.txg);
        let blocks = to.size_bytes / u64::from(entry.block_bytes);
        let mut out = Emitter { emit, summary: &mut summary, pending_free: None, blocks };
        match to.root {
            None if older.is_some() => out.free(0, blocks).map_err(stream_error)?,
            None => {}
            Some(root) => {
                // Popped in block order: children are pushed last first.
                let mut stack = vec![Visit::Tree { level: to.levels, first: 0, bp: root }];
                while let Some(visit) = stack.pop() {
                    let (level, first, bp) = match visit {
                        Visit::Hole { first, count } => {
                            out.free(first, count).map_err(stream_error)?;
                            continue;
                        }
                        Visit::Tree { level, first, bp } => (level, first, bp),
                    };
                    if bp.birth_txg <= since {
                        continue;
                    }
                    if level == 0 {
                        let record = self.data_record(first, &bp).await?;
                        out.data(record).map_err(stream_error)?;
                        continue;
                    }
                    let node = self.pool.read_block_cached(&bp, IoClass::AsyncRead).await?;
                    let child_span = INDIRECT_BPS.saturating_pow(u32::from(level - 1));
                    let mut children = Vec::new();
                    for (slot, raw) in node.chunks_exact(BLKPTR_BYTES).enumerate() {
                        let child_first = first + slot as u64 * child_span;
                        if child_first >= blocks {
                            break;
                        }
                        let child = BlockPointer::decode(raw).map_err(|source| {
                            crate::pool::PoolError::Format {
                                pool: self.pool.name().to_owned(),
                                source,
                            }
                        })?;
                        match child {
                            Some(bp) => children.push(Visit::Tree {
                                level: level - 1,
                                first: child_first,
                                bp,
                            }),
                            // A hole under a block born since may have held data before.
                            None if older.is_some() => {
                                children.push(Visit::Hole { first: child_first, count: child_span })
                            }
                            None => {}
                        }
                    }
                    stack.extend(children.into_iter().rev());
                }
            }
        }
        out.flush_free().map_err(stream_error)?;
        Ok(summary)
    }
}

/// A step of a send's walk.
enum Visit {
    Tree {
        level: u8,
        first: u64,
        bp: BlockPointer,
    },
    /// Blocks `first..first + count` are holes in a part that changed.
    Hole {
        first: u64,
        count: u64,
    },
}

/// Emits a send's records, merging frees that run on.
struct Emitter<'a> {
    emit: &'a mut (dyn FnMut(StreamRecord) -> Result<(), StreamError> + Send),
    summary: &'a mut StreamSummary,
    pending_free: Option<(u64, u64)>,
    /// The snapshot's blocks: nothing past them is sent.
    blocks: u64,
}

impl Emitter<'_> {
    fn free(&mut self, first: u64, count: u64) -> Result<(), StreamError> {
        let count = count.min(self.blocks.saturating_sub(first));
        if count == 0 {
            return Ok(());
        }
        match self.pending_free {
            Some((start, n)) if start + n == first => self.pending_free = Some((start, n + count)),
            _ => {
                self.flush_free()?;
                self.pending_free = Some((first, count));
            }
        }
        Ok(())
    }

    fn flush_free(&mut self) -> Result<(), StreamError> {
        if let Some((first, count)) = self.pending_free.take() {
            (self.emit)(StreamRecord::Free { first, count })?;
            self.summary.records += 1;
            self.summary.free_records += 1;
        }
        Ok(())
    }

    fn data(&mut self, record: StreamRecord) -> Result<(), StreamError> {
        self.flush_free()?;
        if let StreamRecord::Data { bytes, .. } = &record {
            self.summary.data_bytes += bytes.len() as u64;
        }
        (self.emit)(record)?;
        self.summary.records += 1;
        self.summary.data_blocks += 1;
        Ok(())
    }
}

impl Store {
    /// Data block `block` as a send record: its bytes as stored, verified against `bp`
    /// (a compressed block without the padding to its allocation unit).
    async fn data_record(&self, block: u64, bp: &BlockPointer) -> Result<StreamRecord, StoreError> {
        let stored = self.pool.read_block(bp, IoClass::AsyncRead).await?;
        let lsize = bp.lsize_bytes() as usize;
        let len = if bp.compression == BlockCompression::None {
            lsize.min(stored.len())
        } else {
            let header = &stored[..COMPRESSED_HEADER_BYTES];
            let body = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            (COMPRESSED_HEADER_BYTES + body).min(stored.len())
        };
        Ok(StreamRecord::Data {
            block,
            lsize: lsize as u32,
            compression: bp.compression,
            bytes: stored[..len].to_vec(),
        })
    }
}

impl Store {
    /// Receives a stream into volume `target` (ZFS: `zfs receive`): a full stream makes a new
    /// volume; an incremental one applies to the volume whose newest snapshot is the stream's
    /// older one, unchanged since (roll it back first otherwise). `next` yields the records,
    /// checked (sluice_format's `StreamReader`). Nothing is visible under `target` until the
    /// end record has checked every record; a refused stream leaves the target as it was.
    pub async fn receive(
        &self,
        target: &str,
        next: &mut (dyn FnMut() -> Result<Option<StreamRecord>, StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        self.check_live()?;
        super::dataset::check_volume_name(target)?;
        let stream_error = |source| StoreError::Stream { volume: target.to_owned(), source };
        let refuse = |reason: String| StoreError::ReceiveRefused {
            pool: self.pool.name().to_owned(),
            volume: target.to_owned(),
            reason,
        };
        let begin = match next().map_err(stream_error)? {
            Some(StreamRecord::Begin(begin)) => begin,
            _ => return Err(refuse("the stream has no begin record".to_owned())),
        };
        super::dataset::check_volume_name(&begin.name).map_err(|_| {
            refuse(format!("the stream's snapshot name {:?} is invalid", begin.name))
        })?;
        let hidden = format!("{RECEIVE_PREFIX}{target}");
        // What an interrupted receive left goes first.
        if self.dataset(&hidden).is_ok() {
            self.destroy_volume_with(&hidden, true).await?;
        }
        let existing = self.dataset(target).ok().map(|d| d.state.lock().entry.clone());
        match (begin.from_guid, &existing) {
            (None, Some(_)) => {
                return Err(refuse(
                    "it exists, and a full stream makes a new volume: receive into a new name, \
                     or send incrementally from a snapshot both pools have"
                        .to_owned(),
                ))
            }
            (None, None) => {
                self.create_volume_with(&hidden, begin.size_bytes, begin.block_bytes, false)?;
            }
            (Some(_), None) => {
                return Err(refuse(
                    "it does not exist, and an incremental stream applies to a volume with its \
                     older snapshot; send the whole snapshot first"
                        .to_owned(),
                ))
            }
            (Some(from), Some(entry)) => {
                let newest = entry.snapshots.last();
                if let Some(have) = entry.snapshots.iter().find(|s| s.guid == begin.guid) {
                    return Err(refuse(format!(
                        "it already has this stream's snapshot (as {}); nothing to do",
                        have.name
                    )));
                }
                if newest.map(|s| s.guid) != Some(from) {
                    return Err(refuse(format!(
                        "the stream applies to the snapshot with guid {from:#x}, and {target}'s \
                         newest snapshot is {}",
                        newest.map_or("none".to_owned(), |s| format!("{} ({:#x})", s.name, s.guid))
                    )));
                }
                if super::dsl_snapshot::unique_bytes(entry) > 0 {
                    return Err(refuse(format!(
                        "it was written since its newest snapshot {}; roll it back to that \
                         snapshot first",
                        newest.map_or("", |s| s.name.as_str())
                    )));
                }
                if entry.snapshots.iter().any(|s| s.name == begin.name) {
                    return Err(refuse(format!("it already has a snapshot {}", begin.name)));
                }
                let newest = newest.map(|s| s.name.clone()).unwrap_or_default();
                self.clone_snapshot(target, &newest, &hidden).await?;
                let size = self.dataset(&hidden)?.size_bytes();
                if size != begin.size_bytes {
                    self.resize_volume(&hidden, begin.size_bytes).await?;
                }
            }
        }
        match self.apply_stream(&hidden, &begin, next).await {
            Ok(mut summary) => {
                summary.records += 1;
                self.finish_receive(target, &hidden, &begin, existing.is_some()).await?;
                Ok(summary)
            }
            Err(error) => {
                // Nothing of it stays.
                if self.dataset(&hidden).is_ok() {
                    let _ = self.destroy_volume_with(&hidden, true).await;
                    let _ = self.sync().await;
                }
                Err(error)
            }
        }
    }

    /// Writes the stream's records into the hidden volume, up to and with the end record.
    async fn apply_stream(
        &self,
        hidden: &str,
        begin: &StreamBegin,
        next: &mut (dyn FnMut() -> Result<Option<StreamRecord>, StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        let dataset = self.dataset(hidden)?;
        let bs = u64::from(begin.block_bytes);
        let blocks = begin.size_bytes / bs;
        let stream_error = |source| StoreError::Stream { volume: hidden.to_owned(), source };
        let bad = |what: String| StoreError::ReceiveRefused {
            pool: self.pool.name().to_owned(),
            volume: hidden.to_owned(),
            reason: format!("the stream names {what}, outside the volume's {blocks} blocks"),
        };
        let mut summary = StreamSummary::default();
        loop {
            let record = next().map_err(stream_error)?;
            match record {
                Some(StreamRecord::Data { block, lsize, compression, bytes }) => {
                    if block >= blocks || u64::from(lsize) != bs {
                        return Err(bad(format!("block {block}")));
                    }
                    let logical =
                        decompress_stored(compression, lsize as usize, &bytes).map_err(|e| {
                            StoreError::ReceiveRefused {
                                pool: self.pool.name().to_owned(),
                                volume: hidden.to_owned(),
                                reason: format!("block {block} does not decompress: {e}"),
                            }
                        })?;
                    self.write_in(&dataset, block * bs, &logical).await?;
                    summary.records += 1;
                    summary.data_blocks += 1;
                    summary.data_bytes += bytes.len() as u64;
                }
                Some(StreamRecord::Free { first, count }) => {
                    let end = first.checked_add(count).filter(|&end| end <= blocks);
                    let Some(end) = end else { return Err(bad(format!("free {first}+{count}"))) };
                    self.zero_in(&dataset, first * bs, (end - first) * bs).await?;
                    summary.records += 1;
                    summary.free_records += 1;
                }
                Some(StreamRecord::End { .. }) => {
                    summary.records += 1;
                    return Ok(summary);
                }
                Some(StreamRecord::Begin(_)) | None => {
                    return Err(StoreError::Stream {
                        volume: hidden.to_owned(),
                        source: StreamError::Truncated { last: summary.records },
                    })
                }
            }
        }
    }

    /// Snapshots the complete hidden volume as the sender's snapshot and puts it in the
    /// target's place.
    async fn finish_receive(
        &self,
        target: &str,
        hidden: &str,
        begin: &StreamBegin,
        incremental: bool,
    ) -> Result<(), StoreError> {
        let names = [(hidden.to_owned(), begin.name.clone())];
        self.create_snapshots_with(&names, begin.creation_secs, Some(begin.guid)).await?;
        if incremental {
            // The clone takes the target's snapshots; the old target, now a clone of its
            // newest one with nothing of its own, goes, and the clone takes its name in the
            // same txg.
            self.promote_volume(hidden).await?;
            self.destroy_volume_with(target, false).await?;
        }
        self.rename_volume(hidden, target).await?;
        self.sync().await?;
        Ok(())
    }
}
