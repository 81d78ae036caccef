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
    BlockCompression, BlockPointer, Compression, DedupMode, ReceiveState, ResumeToken, StreamBegin,
    StreamError, StreamRecord, BLKPTR_BYTES, COMPRESSED_HEADER_BYTES,
};

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;

use super::dbuf::{Block, Prewritten};
use super::{Dataset, Store, StoreError};
use crate::device::{AlignedBuf, SharedBuf};
use crate::intent_log::DataWrite;
use crate::objset::INDIRECT_BPS;
use crate::pool::PoolError;
use crate::tunables::IoClass;
use crate::vdev::VdevAddress;
use crate::zio::compress::decompress_stored;
use crate::zio::{BlockProps, Issue, Writer};

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
        self.send_snapshot_from(volume, snapshot, from, None, emit).await
    }

    /// Sends what an interrupted receive still needs (ZFS: `zfs send -t TOKEN`): the stream
    /// the token names, from its next block on. The snapshots are found by guid, so a renamed
    /// one still resumes.
    pub async fn send_resume(
        &self,
        token: &ResumeToken,
        emit: &mut (dyn FnMut(StreamRecord) -> Result<(), StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        let pool = self.pool.name().to_owned();
        let refuse = |volume: &str, reason: String| StoreError::ReceiveRefused {
            pool: pool.clone(),
            volume: volume.to_owned(),
            reason,
        };
        let volume = match token.source.split_once('/') {
            Some((p, v)) if p == pool => v.to_owned(),
            _ => {
                return Err(refuse(
                    &token.source,
                    format!("the resume token is for {}, not a volume of this pool", token.source),
                ))
            }
        };
        let entry = self.dataset(&volume)?.state.lock().entry.clone();
        let by_guid = |guid: u64| entry.snapshots.iter().find(|s| s.guid == guid);
        let to = by_guid(token.to_guid).ok_or_else(|| {
            refuse(
                &volume,
                format!(
                    "it no longer has the snapshot the resume token names (guid {:#x}): it \
                     was destroyed; send again from the start and drop the partial receive \
                     with `sluice recv -A`",
                    token.to_guid
                ),
            )
        })?;
        let from = match token.from_guid {
            None => None,
            Some(guid) => Some(by_guid(guid).ok_or_else(|| {
                refuse(
                    &volume,
                    format!("it no longer has the older snapshot the token names ({guid:#x})"),
                )
            })?),
        };
        let (to, from) = (to.name.clone(), from.map(|f| f.name.clone()));
        self.send_snapshot_from(&volume, &to, from.as_deref(), Some(token.next_block), emit).await
    }

    /// [`Store::send_snapshot`]; a resumed stream leaves out every block before
    /// `resume_block`.
    async fn send_snapshot_from(
        &self,
        volume: &str,
        snapshot: &str,
        from: Option<&str>,
        resume_block: Option<u64>,
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
            source: format!("{}/{volume}", self.pool.name()),
            resume_block,
        }))
        .map_err(stream_error)?;
        summary.records += 1;
        let since = older.as_ref().map_or(0, |o| o.txg);
        let blocks = to.size_bytes / u64::from(entry.block_bytes);
        let mut out =
            Emitter { emit, summary: &mut summary, pending_free: None, blocks, resume_block };
        let resume_block = resume_block.unwrap_or(0);
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
                    let span = INDIRECT_BPS.saturating_pow(u32::from(level));
                    if bp.birth_txg <= since || first.saturating_add(span) <= resume_block {
                        continue;
                    }
                    if level == 0 {
                        if first < resume_block {
                            continue;
                        }
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
                    if level > 1 {
                        stack.extend(children.into_iter().rev());
                        continue;
                    }
                    // Data blocks: read several at once (one at a time, a send would go at
                    // one device latency per block), emitted in order as they arrive.
                    let depth = (SEND_READ_BYTES / u64::from(entry.block_bytes).max(1))
                        .clamp(1, INDIRECT_BPS) as usize;
                    let steps = children.into_iter().filter_map(|child| match child {
                        Visit::Tree { first, bp, .. } => (bp.birth_txg > since
                            && first >= resume_block)
                            .then_some(Leaf::Data(first, bp)),
                        Visit::Hole { first, count } => Some(Leaf::Hole(first, count)),
                    });
                    let mut ready = futures::stream::iter(steps)
                        .map(|step| async move {
                            match step {
                                Leaf::Data(first, bp) => self.data_record(first, &bp).await,
                                Leaf::Hole(first, count) => Ok(StreamRecord::Free { first, count }),
                            }
                        })
                        .buffered(depth);
                    while let Some(record) = ready.next().await {
                        match record? {
                            StreamRecord::Free { first, count } => {
                                out.free(first, count).map_err(stream_error)?;
                            }
                            record => out.data(record).map_err(stream_error)?,
                        }
                    }
                }
            }
        }
        out.flush_free().map_err(stream_error)?;
        Ok(summary)
    }
}

/// Data a send reads ahead of what it has written out.
const SEND_READ_BYTES: u64 = 8 << 20;

/// A child of a level-1 indirect block, as a send emits it.
enum Leaf {
    Data(u64, BlockPointer),
    Hole(u64, u64),
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
    /// Nothing before it is sent (a resumed stream).
    resume_block: Option<u64>,
}

impl Emitter<'_> {
    fn free(&mut self, first: u64, count: u64) -> Result<(), StreamError> {
        let end = first.saturating_add(count).min(self.blocks);
        let first = first.max(self.resume_block.unwrap_or(0));
        let count = end.saturating_sub(first);
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

/// A data block of a stream, not yet written.
struct Received {
    block: u64,
    logical: AlignedBuf,
    compression: BlockCompression,
    /// As the stream carried it: stored this way, raw.
    stored: Vec<u8>,
}

/// A receive's blocks written in place: the next batch, the writes in flight, and the first
/// write that failed.
#[derive(Default)]
struct InPlace {
    batch: Vec<Received>,
    writes: Vec<DataWrite>,
    failed: Arc<Mutex<Option<PoolError>>>,
}

impl InPlace {
    /// Waits for the writes in flight; the first that failed fails the receive. (Its block is
    /// written again by the sync, which finds the write failed: nothing is lost, but a receive
    /// that met a write error says so.)
    async fn settle(&mut self) -> Result<(), StoreError> {
        futures::future::join_all(self.writes.drain(..)).await;
        match self.failed.lock().take() {
            Some(error) => Err(StoreError::Pool(error)),
            None => Ok(()),
        }
    }
}

/// How a receive treats an interruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiveMode {
    /// A stream refused part way leaves nothing.
    Whole,
    /// What arrived before an interruption is kept, hidden, and can be resumed from the
    /// token `Store::interrupted_receives` shows (ZFS: `zfs receive -s`).
    Resumable,
}

/// Data a resumable receive applies between two syncs that record how far it got: a crash
/// loses at most this much of the stream, and the syncs cost little beside it.
const CHECKPOINT_BYTES: u64 = 256 << 20;

/// A receive state's `next_block` once the stream is whole and checked: the hidden volume is
/// being put in the target's place, which takes more than one txg (snapshot, promote,
/// destroy and rename); a crash part way is rolled forward at import.
const RECEIVE_COMPLETE: u64 = u64::MAX;

impl Store {
    /// Receives a stream into volume `target` (ZFS: `zfs receive`): a full stream makes a new
    /// volume; an incremental one applies to the volume whose newest snapshot is the stream's
    /// older one, unchanged since (roll it back first otherwise). `next` yields the records,
    /// checked (sluice_format's `StreamReader`). Nothing is visible under `target` until the
    /// end record has checked every record; a refused stream leaves the target as it was.
    /// A stream resumed from a token continues the hidden volume its interruption left.
    pub async fn receive(
        &self,
        target: &str,
        mode: ReceiveMode,
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
        // A receive that ended whole but was not yet in place is finished; what a crash left
        // of one that was all or nothing goes.
        self.settle_receive(target).await?;
        let partial = self.dataset(&hidden).ok().map(|d| d.state.lock().entry.receive.clone());
        if begin.from_guid.is_some() {
            // So the target's figures count every write it acknowledged: one since its newest
            // snapshot refuses the stream.
            self.sync().await?;
        }
        let existing = self.dataset(target).ok().map(|d| d.state.lock().entry.clone());
        let incremental = existing.is_some() && begin.from_guid.is_some();
        if let Some(resume_block) = begin.resume_block {
            // A resumed stream continues exactly where the interruption left the volume.
            let Some(Some(state)) = &partial else {
                return Err(refuse(format!(
                    "the stream resumes an interrupted receive from block {}, and none into \
                     {target} is kept; send the whole stream again",
                    resume_block
                )));
            };
            if state.to_guid != begin.guid || state.from_guid != begin.from_guid {
                return Err(refuse(format!(
                    "the stream resumes snapshot {:#x}, and the interrupted receive kept is of \
                     snapshot {:#x}; send with the token `sluice vol list` shows for {target}",
                    begin.guid, state.to_guid
                )));
            }
            if begin.from_guid.is_some() {
                self.check_unchanged(target, &begin)?;
            }
            if state.next_block != resume_block {
                return Err(refuse(format!(
                    "the stream resumes at block {}, and the receive kept stopped at block {}; \
                     send with the token `sluice vol list` shows now",
                    resume_block, state.next_block
                )));
            }
        } else {
            if let Some(Some(_)) = &partial {
                return Err(refuse(format!(
                    "an interrupted receive into it is kept; resume it (`sluice send -t TOKEN`, \
                     the token `sluice vol list` shows) or drop it with `sluice recv -A \
                     {}/{target}`",
                    self.pool.name()
                )));
            }
            self.receive_target(target, &hidden, &begin, existing.as_ref()).await?;
            if mode == ReceiveMode::Resumable {
                let dataset = self.dataset(&hidden)?;
                dataset.state.lock().entry.receive = Some(ReceiveState {
                    to_guid: begin.guid,
                    from_guid: begin.from_guid,
                    next_block: 0,
                    source: begin.source.clone(),
                });
            }
        }
        // A resumed receive stays resumable.
        let resumable = mode == ReceiveMode::Resumable || begin.resume_block.is_some();
        let mut progress = begin.resume_block.unwrap_or(0);
        let mut applied = self.apply_stream(&hidden, &begin, resumable, &mut progress, next).await;
        // The clone takes the target's place: a write the target took meanwhile would be lost.
        // So writes to the target wait (as they wait out a rollback) from the check until it
        // is replaced; synced first, its figures count every write acknowledged before.
        let target_dataset = if incremental { self.dataset(target).ok() } else { None };
        let _no_writes = match &target_dataset {
            Some(dataset) if applied.is_ok() => Some(dataset.rollback_gate.write().await),
            _ => None,
        };
        if applied.is_ok() && incremental {
            if let Err(error) = self.sync().await.and_then(|_| self.check_unchanged(target, &begin))
            {
                applied = Err(error);
            }
        }
        match applied {
            Ok(mut summary) => {
                summary.records += 1;
                self.finish_receive(target, &hidden, &begin).await?;
                Ok(summary)
            }
            Err(error) if resumable && self.dataset(&hidden).is_ok() => {
                // What arrived stays: synced, then marked as received, so a crash in between
                // resumes from the mark before.
                self.sync().await?;
                let dataset = self.dataset(&hidden)?;
                let token = {
                    let mut state = dataset.state.lock();
                    let receive = state.entry.receive.get_or_insert_with(|| ReceiveState {
                        to_guid: begin.guid,
                        from_guid: begin.from_guid,
                        next_block: 0,
                        source: begin.source.clone(),
                    });
                    receive.next_block = progress;
                    token_of(receive)
                };
                self.sync().await?;
                Err(StoreError::ReceiveInterrupted {
                    pool: self.pool.name().to_owned(),
                    volume: target.to_owned(),
                    cause: error.to_string(),
                    next_block: progress,
                    token: token.encode(),
                })
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

    /// For an incremental stream: the target's newest snapshot is still the stream's older
    /// one and nothing was written since (as of the last sync).
    fn check_unchanged(&self, target: &str, begin: &StreamBegin) -> Result<(), StoreError> {
        let entry = self.dataset(target)?.state.lock().entry.clone();
        let newest = entry.snapshots.last();
        if newest.map(|s| s.guid) == begin.from_guid
            && super::dsl_snapshot::unique_bytes(&entry) == 0
        {
            return Ok(());
        }
        Err(StoreError::ReceiveRefused {
            pool: self.pool.name().to_owned(),
            volume: target.to_owned(),
            reason: format!(
                "it changed since the receive began (written or snapshotted since {}): roll it \
                 back to that snapshot, then resume (`sluice vol list` shows the token) or send \
                 again",
                newest.map_or("its older snapshot", |s| s.name.as_str())
            ),
        })
    }

    /// Makes the hidden volume a stream from its start lands in: a new volume for a full
    /// stream, a clone of the target's newest snapshot for an incremental one.
    async fn receive_target(
        &self,
        target: &str,
        hidden: &str,
        begin: &StreamBegin,
        existing: Option<&sluice_format::VolumeEntry>,
    ) -> Result<(), StoreError> {
        let refuse = |reason: String| StoreError::ReceiveRefused {
            pool: self.pool.name().to_owned(),
            volume: target.to_owned(),
            reason,
        };
        match (begin.from_guid, existing) {
            (None, Some(_)) => Err(refuse(
                "it exists, and a full stream makes a new volume: receive into a new name, or \
                 send incrementally from a snapshot both pools have"
                    .to_owned(),
            )),
            (None, None) => {
                self.create_volume_with(hidden, begin.size_bytes, begin.block_bytes, false)?;
                Ok(())
            }
            (Some(_), None) => Err(refuse(
                "it does not exist, and an incremental stream applies to a volume with its older \
                 snapshot; send the whole snapshot first"
                    .to_owned(),
            )),
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
                self.clone_snapshot(target, &newest, hidden).await?;
                let size = self.dataset(hidden)?.size_bytes();
                if size != begin.size_bytes {
                    self.resize_volume(hidden, begin.size_bytes).await?;
                }
                Ok(())
            }
        }
    }

    /// Interrupted resumable receives kept in this pool: each target and its resume token.
    pub fn interrupted_receives(&self) -> Vec<(String, ResumeToken)> {
        self.all_volumes()
            .into_iter()
            .filter_map(|v| {
                let target = v.name.strip_prefix(RECEIVE_PREFIX)?.to_owned();
                let state = v.receive.as_ref().filter(|r| r.next_block != RECEIVE_COMPLETE)?;
                Some((target, token_of(state)))
            })
            .collect()
    }

    /// Drops what an interrupted receive into `target` kept (ZFS: `zfs receive -A`).
    pub async fn abort_receive(&self, target: &str) -> Result<(), StoreError> {
        self.check_live()?;
        let hidden = format!("{RECEIVE_PREFIX}{target}");
        if self.dataset(&hidden).is_err() {
            return Err(StoreError::ReceiveRefused {
                pool: self.pool.name().to_owned(),
                volume: target.to_owned(),
                reason: "no interrupted receive into it is kept; nothing to drop".to_owned(),
            });
        }
        self.destroy_volume_with(&hidden, true).await?;
        self.sync().await?;
        Ok(())
    }

    /// Writes the stream's records into the hidden volume, up to and with the end record.
    /// `progress` ends at the first block not yet applied; a resumable receive syncs every
    /// [`CHECKPOINT_BYTES`] and records it, so a crash resumes from there.
    async fn apply_stream(
        &self,
        hidden: &str,
        begin: &StreamBegin,
        resumable: bool,
        progress: &mut u64,
        next: &mut (dyn FnMut() -> Result<Option<StreamRecord>, StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        let mut in_place = InPlace::default();
        let applied =
            self.apply_records(hidden, begin, resumable, progress, next, &mut in_place).await;
        if applied.is_err() {
            // Records checked before an interruption or a refused record are applied, so a
            // resume starts after them. Whatever failed here, the receive's error is the one
            // reported.
            let bs = u64::from(begin.block_bytes);
            if let Ok(dataset) = self.dataset(hidden) {
                let _ = self.write_in_place(&dataset, bs, &mut in_place, progress).await;
            }
            let _ = in_place.settle().await;
        }
        applied
    }

    /// [`Store::apply_stream`]'s loop; blocks wait in `in_place` to be written a span at a time.
    async fn apply_records(
        &self,
        hidden: &str,
        begin: &StreamBegin,
        resumable: bool,
        progress: &mut u64,
        next: &mut (dyn FnMut() -> Result<Option<StreamRecord>, StreamError> + Send),
        in_place: &mut InPlace,
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
        let out_of_order = |what: String, at: u64| StoreError::ReceiveRefused {
            pool: self.pool.name().to_owned(),
            volume: hidden.to_owned(),
            reason: format!("the stream names {what} after block {at}: blocks go in order"),
        };
        let mut summary = StreamSummary::default();
        let mut since_checkpoint = 0u64;
        // Where the next record must start; `progress` follows once the blocks before it are
        // written (a resume token names it).
        let mut expected = *progress;
        loop {
            if resumable && since_checkpoint >= CHECKPOINT_BYTES {
                self.write_in_place(&dataset, bs, in_place, progress).await?;
                in_place.settle().await?;
                self.sync().await?;
                if let Some(receive) = dataset.state.lock().entry.receive.as_mut() {
                    receive.next_block = *progress;
                }
                since_checkpoint = 0;
            }
            let record = next().map_err(stream_error)?;
            match record {
                Some(StreamRecord::Data { block, lsize, compression, bytes }) => {
                    if block >= blocks || u64::from(lsize) != bs {
                        return Err(bad(format!("block {block}")));
                    }
                    // In order, so the blocks before `progress` are the ones received.
                    if block < expected {
                        return Err(out_of_order(format!("block {block}"), expected));
                    }
                    let logical =
                        decompress_stored(compression, lsize as usize, &bytes).map_err(|e| {
                            StoreError::ReceiveRefused {
                                pool: self.pool.name().to_owned(),
                                volume: hidden.to_owned(),
                                reason: format!("block {block} does not decompress: {e}"),
                            }
                        })?;
                    let travelled = bytes.len() as u64;
                    in_place.batch.push(Received { block, logical, compression, stored: bytes });
                    if in_place.batch.len() as u64 * bs >= crate::zio::WRITE_SPAN_BYTES_MAX {
                        self.write_in_place(&dataset, bs, in_place, progress).await?;
                    }
                    expected = block + 1;
                    since_checkpoint += bs;
                    summary.records += 1;
                    summary.data_blocks += 1;
                    summary.data_bytes += travelled;
                }
                Some(StreamRecord::Free { first, count }) => {
                    let end = first.checked_add(count).filter(|&end| end <= blocks);
                    let Some(end) = end else { return Err(bad(format!("free {first}+{count}"))) };
                    if first < expected {
                        return Err(out_of_order(format!("free {first}+{count}"), expected));
                    }
                    self.write_in_place(&dataset, bs, in_place, progress).await?;
                    self.zero_in(&dataset, first * bs, (end - first) * bs).await?;
                    *progress = end;
                    expected = end;
                    summary.records += 1;
                    summary.free_records += 1;
                }
                Some(StreamRecord::End { .. }) => {
                    summary.records += 1;
                    self.write_in_place(&dataset, bs, in_place, progress).await?;
                    in_place.settle().await?;
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

    /// Writes a batch of received blocks into the open txg, and, unless the volume dedups
    /// (its blocks go through the table at the sync), in place as the stream carried them
    /// (zio's raw mode: no second compression), so the sync links them rather than writing
    /// them (as it links the blocks of records logged by pointer, txg/zil.rs). A block whose
    /// place cannot be had is left to the sync.
    /// `progress` moves past the batch once it is in the open txg.
    async fn write_in_place(
        &self,
        dataset: &Dataset,
        bs: u64,
        in_place: &mut InPlace,
        progress: &mut u64,
    ) -> Result<(), StoreError> {
        let batch = std::mem::take(&mut in_place.batch);
        for received in &batch {
            self.write_in(dataset, received.block * bs, &received.logical).await?;
        }
        if let Some(last) = batch.last() {
            *progress = last.block + 1;
        }
        let (txg, held) = {
            let state = self.state.lock();
            let v = dataset.state.lock();
            if v.entry.dedup != DedupMode::Off {
                return Ok(());
            }
            let held: Vec<Option<Arc<AlignedBuf>>> = batch
                .iter()
                .map(|r| match v.open.get(&r.block) {
                    Some(Block::Data(data)) => Some(Arc::clone(data)),
                    _ => None,
                })
                .collect();
            (state.open_txg, held)
        };
        let mut sealed = Vec::with_capacity(batch.len());
        let mut blocks = Vec::with_capacity(batch.len());
        for (received, data) in batch.iter().zip(held) {
            // Not in the open txg any more (a sync took it meanwhile): that sync writes it.
            let Some(data) = data else { continue };
            let props = BlockProps::data(Writer::Receive, txg, Compression::Off);
            let stored = &received.stored;
            sealed.push(self.pool.seal_raw(props, data, stored, received.compression)?);
            blocks.push(received.block);
        }
        let mut placed: Vec<(u32, u64, u64)> = Vec::with_capacity(sealed.len());
        {
            let mut allocator = self.allocator.lock();
            for block in &sealed {
                match allocator.allocate_indirect(block.psize()) {
                    Ok(at) => placed.push(at),
                    Err(_) => break,
                }
            }
        }
        let mut writes = Vec::new();
        let mut prewritten = Vec::with_capacity(placed.len());
        for run in crate::zio::span_runs(&placed) {
            let (vdev, start, _) = placed[run.start];
            let pieces = crate::zio::run_pieces(&placed, run.clone(), |i| &sealed[i].stored);
            let (done, written) = futures::channel::oneshot::channel::<bool>();
            let write: DataWrite = written.map(|r| r.unwrap_or(false)).boxed().shared();
            for i in run {
                let bp = crate::zio::describe(&sealed[i], &placed[i..=i]);
                let data = Arc::clone(&sealed[i].logical);
                prewritten.push((blocks[i], Prewritten { data, bp, write: write.clone() }));
            }
            in_place.writes.push(write);
            writes.push((
                VdevAddress { vdev, offset_bytes: start },
                SharedBuf::gather(pieces),
                done,
            ));
        }
        // Recorded for the sync before the writes start, so that a sync beginning now waits
        // for them; a block that left the open txg meanwhile is orphaned (the next sync frees
        // it once its write ends).
        {
            let mut state = self.state.lock();
            let state = &mut *state;
            let mut v = dataset.state.lock();
            for (index, block) in prewritten {
                let current = matches!(v.open.get(&index),
                    Some(Block::Data(data)) if Arc::ptr_eq(data, &block.data));
                if current && state.open_txg == txg {
                    if let Some(replaced) = v.prewritten.insert(index, block) {
                        state.orphaned.push(replaced);
                    }
                    state.prewritten_bytes += bs;
                } else {
                    state.orphaned.push(block);
                }
            }
        }
        for (at, data, done) in writes {
            let pool = Arc::clone(&self.pool);
            let failed = Arc::clone(&in_place.failed);
            self.pool.env().spawn("received block write", async move {
                let written = pool.issue(Writer::Receive, at, data, Issue::ASYNC).await;
                let ok = written.is_ok();
                if let Err(error) = written {
                    failed.lock().get_or_insert(error);
                }
                let _ = done.send(ok);
            });
        }
        Ok(())
    }

    /// Snapshots the complete hidden volume as the sender's snapshot and puts it in the
    /// target's place. The mark that it is complete goes out with the snapshot, so from then
    /// on a crash is rolled forward (`Store::settle_receives`), never back.
    async fn finish_receive(
        &self,
        target: &str,
        hidden: &str,
        begin: &StreamBegin,
    ) -> Result<(), StoreError> {
        self.dataset(hidden)?.state.lock().entry.receive = Some(ReceiveState {
            to_guid: begin.guid,
            from_guid: begin.from_guid,
            next_block: RECEIVE_COMPLETE,
            source: begin.source.clone(),
        });
        let names = [(hidden.to_owned(), begin.name.clone())];
        self.create_snapshots_with(&names, begin.creation_secs, Some(begin.guid)).await?;
        self.put_in_place(target, hidden).await
    }

    /// The steps after the snapshot, each done only if not done yet, so a crash between them
    /// is finished by running them again: an incremental stream's clone is promoted over the
    /// target; the old target, then a clone of the received volume's older snapshot with
    /// nothing of its own, is destroyed; the received volume takes the target's name.
    async fn put_in_place(&self, target: &str, hidden: &str) -> Result<(), StoreError> {
        let entry = self.dataset(hidden)?.state.lock().entry.clone();
        if let Some(origin) = entry.origin {
            let parent_is_target = self.dataset(target).is_ok_and(|d| {
                d.state.lock().entry.snapshots.iter().any(|s| s.id == origin.snapshot)
            });
            if parent_is_target {
                self.promote_volume(hidden).await?;
            }
        }
        if let Ok(old) = self.dataset(target) {
            let old = old.state.lock().entry.clone();
            let received = self.dataset(hidden)?.state.lock().entry.snapshots.clone();
            let replaced = old.snapshots.is_empty()
                && old.origin.is_some_and(|o| received.iter().any(|s| s.id == o.snapshot));
            if !replaced {
                return Err(StoreError::ReceiveRefused {
                    pool: self.pool.name().to_owned(),
                    volume: target.to_owned(),
                    reason: "the stream is received, and a volume of that name was made \
                             meanwhile: rename that volume; the received one takes the name \
                             at the next receive or import"
                        .to_owned(),
                });
            }
            self.destroy_volume_with(target, false).await?;
        }
        self.dataset(hidden)?.state.lock().entry.receive = None;
        self.rename_volume(hidden, target).await?;
        self.sync().await?;
        Ok(())
    }

    /// Settles what receives left at a crash (run at import): a complete one is put in place;
    /// one that was all or nothing (not `recv -s`) goes. Resumable ones wait for their token.
    pub(super) async fn settle_receives(&self) -> Result<(), StoreError> {
        let targets: Vec<String> = self
            .all_volumes()
            .into_iter()
            .filter_map(|v| v.name.strip_prefix(RECEIVE_PREFIX).map(str::to_owned))
            .collect();
        for target in targets {
            self.settle_receive(&target).await?;
        }
        Ok(())
    }

    /// [`Store::settle_receives`] for the receive into `target`.
    async fn settle_receive(&self, target: &str) -> Result<(), StoreError> {
        let hidden = format!("{RECEIVE_PREFIX}{target}");
        let Ok(dataset) = self.dataset(&hidden) else { return Ok(()) };
        let state = dataset.state.lock().entry.receive.clone();
        match state {
            None => {
                self.destroy_volume_with(&hidden, true).await?;
                self.sync().await?;
                Ok(())
            }
            Some(state) if state.next_block == RECEIVE_COMPLETE => {
                self.put_in_place(target, &hidden).await
            }
            Some(_) => Ok(()),
        }
    }
}

/// The token that resumes a kept receive.
fn token_of(state: &ReceiveState) -> ResumeToken {
    ResumeToken {
        to_guid: state.to_guid,
        from_guid: state.from_guid,
        next_block: state.next_block,
        source: state.source.clone(),
    }
}
