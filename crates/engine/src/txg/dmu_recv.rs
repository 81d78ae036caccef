//! Receive (ZFS: `dmu_recv.c`): a send stream (txg/dmu_send.rs) applied on another pool.
//!
//! A receive writes into a hidden volume (`%recv-TARGET`; no volume name may hold `%`): for a
//! full stream a new one, for an incremental one a clone of the target's newest snapshot,
//! which must be the stream's older snapshot. Only once the end record has checked every record
//! before it is the result snapshotted (with the sender's name and guid) and put in the
//! target's place: a new volume is renamed; for an incremental one the clone is promoted over
//! the target, the old target destroyed and the clone renamed. A stream refused part way (a
//! damaged, cut or reordered record) leaves nothing visible: the hidden volume is destroyed.
//!
//! Data blocks are written in place as the stream carried them (zio's raw mode: a compressed
//! block is not decompressed and compressed again), a span at a time, and the sync links them
//! as it links the blocks the intent log writes in place (txg/zil_commit.rs).

use std::sync::Arc;

use futures::FutureExt;
use parking_lot::Mutex;
use sluice_format::{
    BlockCompression, Compression, DedupMode, ReceiveState, ResumeToken, StreamBegin, StreamError,
    StreamRecord,
};

use super::dataset::{check_volume_name, unique_bytes, Dsl, RECEIVE_PREFIX};
use super::dbuf::{Apply, Block, Prewritten};
use super::dmu_send::StreamSummary;
use super::{Dataset, NewKey, Store, StoreError};
use crate::device::AlignedBuf;
use crate::intent_log::{BlockWritten, DataWrite};
use crate::pool::PoolError;
use crate::zio::compress::decompress_stored;
use crate::zio::{BlockProps, Issue, Writer};

/// An encrypted data block of a raw stream, not yet written: its ciphertext and seal.
struct RawReceived {
    block: u64,
    lsize: u32,
    compression: BlockCompression,
    sealing: crate::zio::crypt::Sealing,
    bytes: Vec<u8>,
}

/// A run of blocks written as one I/O, not started yet: its vdev, its blocks, and where its
/// end is told.
type PendingRun = (u32, Vec<crate::vdev::RunBlock>, futures::channel::oneshot::Sender<bool>);

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
    raw_batch: Vec<RawReceived>,
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

/// The namespace's side of a receive: what it checks of the target alone.
impl Dsl {
    /// For an incremental stream: the target's newest snapshot is still the stream's older
    /// one and nothing was written since (as of the last sync).
    fn check_unchanged(&self, target: &str, begin: &StreamBegin) -> Result<(), StoreError> {
        let entry = self.dataset(target)?.state.lock().entry.clone();
        let newest = entry.snapshots.last();
        if newest.map(|s| s.guid) == begin.from_guid && unique_bytes(&entry) == 0 {
            return Ok(());
        }
        Err(StoreError::ReceiveRefused {
            pool: self.pool_name().to_owned(),
            volume: target.to_owned(),
            reason: format!(
                "it changed since the receive began (written or snapshotted since {}): roll it \
                 back to that snapshot, then resume from the receive's resume token or send \
                 again",
                newest.map_or("its older snapshot", |s| s.name.as_str())
            ),
        })
    }
}

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
        self.receive_with(target, mode, None, next).await
    }

    /// [`Store::receive`] of a full stream that is not raw into a new encrypted volume, the
    /// root of a new key family with the user's `key` (ZFS: `zfs receive -o encryption=on`):
    /// how an existing volume moves into encryption, since none is encrypted in place. Its
    /// blocks are encrypted as the syncs write them, never stored in the clear.
    pub async fn receive_encrypted(
        &self,
        target: &str,
        key: NewKey,
        next: &mut (dyn FnMut() -> Result<Option<StreamRecord>, StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        self.receive_with(target, ReceiveMode::Whole, Some(key), next).await
    }

    async fn receive_with(
        &self,
        target: &str,
        mode: ReceiveMode,
        encrypt: Option<NewKey>,
        next: &mut (dyn FnMut() -> Result<Option<StreamRecord>, StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        self.spa.check_live()?;
        check_volume_name(target)?;
        let stream_error = |source| StoreError::Stream { volume: target.to_owned(), cause: source };
        let refuse = |reason: String| StoreError::ReceiveRefused {
            pool: self.spa.pool().name().to_owned(),
            volume: target.to_owned(),
            reason,
        };
        let begin = match next().map_err(stream_error)? {
            Some(StreamRecord::Begin(begin)) => begin,
            _ => return Err(refuse("the stream has no begin record".to_owned())),
        };
        check_volume_name(&begin.name).map_err(|_| {
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
        let existing_family = existing.as_ref().map(|e| e.key_family);
        if encrypt.is_some() {
            let why = if begin.raw.is_some() {
                Some("the stream is raw: it keeps the key it was sent with")
            } else if begin.from_guid.is_some() || begin.resume_block.is_some() {
                Some(
                    "a new encrypted volume is made by a full stream; an incremental one \
                      applies to the volume its full stream made",
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(refuse(format!("--encryption: {why}")));
            }
        }
        match (&begin.raw, existing_family) {
            // OpenZFS's errata #4 came from taking one kind of stream onto the other.
            (None, Some(family)) if family != 0 => {
                return Err(refuse(
                    "it is encrypted, and the stream is not raw: send it with `sluice send -w`, \
                     which carries the blocks as they are encrypted"
                        .to_owned(),
                ))
            }
            (Some(raw), Some(family)) if family != raw.key.guid => {
                return Err(refuse(if family == 0 {
                    "the stream is raw (encrypted) and the volume is not encrypted: a raw stream \
                     applies only to a volume received from raw streams of the same key"
                        .to_owned()
                } else {
                    format!(
                        "the stream is raw, of key family {:#018x}, and the volume is of key \
                         family {family:#018x}: a raw stream applies only to the volume its \
                         full stream made",
                        raw.key.guid
                    )
                }))
            }
            (Some(_), _) if mode == ReceiveMode::Resumable || begin.resume_block.is_some() => {
                return Err(StoreError::NotWithEncryption {
                    pool: self.spa.pool().name().to_owned(),
                    volume: target.to_owned(),
                    what: "a resumable receive of a raw stream (receive it without -s)",
                })
            }
            _ => {}
        }
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
                     snapshot {:#x}; send with the resume token the receive into {target} kept",
                    begin.guid, state.to_guid
                )));
            }
            if begin.from_guid.is_some() {
                self.dsl.check_unchanged(target, &begin)?;
            }
            if state.next_block != resume_block {
                return Err(refuse(format!(
                    "the stream resumes at block {}, and the receive kept stopped at block {}; \
                     send with the resume token it shows now",
                    resume_block, state.next_block
                )));
            }
        } else {
            if let Some(Some(_)) = &partial {
                return Err(refuse(
                    "an interrupted receive into it is kept; resume it with a send from its \
                     resume token, or abort it"
                        .to_owned(),
                ));
            }
            self.receive_target(target, &hidden, &begin, existing.as_ref(), encrypt).await?;
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
            if let Err(error) =
                self.sync().await.and_then(|_| self.dsl.check_unchanged(target, &begin))
            {
                applied = Err(error);
            }
        }
        match applied {
            Ok(mut summary) => {
                summary.records += 1;
                self.finish_receive(target, &hidden, &begin).await?;
                // Its blocks are synced and its root's MAC is the stream's: from now on it
                // is a volume of its family like any other.
                if let Ok(received) = self.dataset(target) {
                    received.state.lock().raw_receive = false;
                }
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
                    pool: self.spa.pool().name().to_owned(),
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

    /// Makes the hidden volume a stream from its start lands in: a new volume for a full
    /// stream, a clone of the target's newest snapshot for an incremental one.
    async fn receive_target(
        &self,
        target: &str,
        hidden: &str,
        begin: &StreamBegin,
        existing: Option<&sluice_format::VolumeEntry>,
        encrypt: Option<NewKey>,
    ) -> Result<(), StoreError> {
        let refuse = |reason: String| StoreError::ReceiveRefused {
            pool: self.spa.pool().name().to_owned(),
            volume: target.to_owned(),
            reason,
        };
        match (begin.from_guid, existing) {
            (None, Some(_)) => Err(refuse(
                "it exists, and a full stream makes a new volume: receive into a new name, or \
                 send incrementally from a snapshot both pools have"
                    .to_owned(),
            )),
            (None, None) => match &begin.raw {
                None => {
                    let (size, bs) = (begin.size_bytes, begin.block_bytes);
                    match encrypt {
                        Some(key) => {
                            self.create_encrypted_volume(hidden, size, bs, false, key).await?
                        }
                        None => self.create_volume_with(hidden, size, bs, false)?,
                    }
                    Ok(())
                }
                Some(raw) => {
                    // The feature first, as for a new encryption root (dsl_crypt.rs); then
                    // the stream's key family, kept as it came unless the pool has it already
                    // (a stream sent back to where it came from).
                    let pool = self.spa.pool();
                    pool.activate_encryption(pool.uberblock().txg + 1).await?;
                    let guid = self.spa.crypt().adopt(raw.key.clone());
                    let bs = begin.block_bytes;
                    let made = self.create_volume_in(hidden, begin.size_bytes, bs, false, guid);
                    self.spa.crypt().adopted(guid);
                    made?;
                    self.dataset(hidden)?.state.lock().raw_receive = true;
                    Ok(())
                }
            },
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
                if unique_bytes(entry) > 0 {
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
                if begin.raw.is_some() && entry.size_bytes != begin.size_bytes {
                    return Err(StoreError::NotWithEncryption {
                        pool: self.spa.pool().name().to_owned(),
                        volume: target.to_owned(),
                        what: "a raw incremental stream of a volume that was resized",
                    });
                }
                self.clone_snapshot(target, &newest, hidden).await?;
                if begin.raw.is_some() {
                    self.dataset(hidden)?.state.lock().raw_receive = true;
                }
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
        self.dsl
            .all_volumes()
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
        self.spa.check_live()?;
        let hidden = format!("{RECEIVE_PREFIX}{target}");
        if self.dataset(&hidden).is_err() {
            return Err(StoreError::ReceiveRefused {
                pool: self.spa.pool().name().to_owned(),
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
        let stream_error = |source| StoreError::Stream { volume: hidden.to_owned(), cause: source };
        let bad = |what: String| StoreError::ReceiveRefused {
            pool: self.spa.pool().name().to_owned(),
            volume: hidden.to_owned(),
            reason: format!("the stream names {what}, outside the volume's {blocks} blocks"),
        };
        let out_of_order = |what: String, at: u64| StoreError::ReceiveRefused {
            pool: self.spa.pool().name().to_owned(),
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
            let raw = begin.raw.is_some();
            match (&record, raw) {
                (Some(StreamRecord::Data { .. }), true)
                | (Some(StreamRecord::RawData { .. }), false) => {
                    return Err(StoreError::ReceiveRefused {
                        pool: self.spa.pool().name().to_owned(),
                        volume: hidden.to_owned(),
                        reason: format!(
                            "record {} is a {} record in a stream that {} raw",
                            summary.records + 1,
                            record.as_ref().map_or("", StreamRecord::kind_name),
                            if raw { "is" } else { "is not" }
                        ),
                    })
                }
                _ => {}
            }
            match record {
                Some(record @ (StreamRecord::Data { .. } | StreamRecord::RawData { .. })) => {
                    let (block, lsize, travelled) = match &record {
                        StreamRecord::Data { block, lsize, bytes, .. }
                        | StreamRecord::RawData { block, lsize, bytes, .. } => {
                            (*block, *lsize, bytes.len() as u64)
                        }
                        _ => unreachable!("matched as a data record above"),
                    };
                    if block >= blocks || u64::from(lsize) != bs {
                        return Err(bad(format!("block {block}")));
                    }
                    // In order, so the blocks before `progress` are the ones received.
                    if block < expected {
                        return Err(out_of_order(format!("block {block}"), expected));
                    }
                    match record {
                        StreamRecord::Data { compression, bytes, .. } => {
                            let logical = decompress_stored(compression, lsize as usize, &bytes)
                                .map_err(|e| StoreError::ReceiveRefused {
                                    pool: self.spa.pool().name().to_owned(),
                                    volume: hidden.to_owned(),
                                    reason: format!("block {block} does not decompress: {e}"),
                                })?;
                            let stored = bytes;
                            in_place.batch.push(Received { block, logical, compression, stored });
                        }
                        StreamRecord::RawData { compression, salt, iv, mac, bytes, .. } => {
                            let sealing = crate::zio::crypt::Sealing { salt, iv, mac };
                            let raw = RawReceived { block, lsize, compression, sealing, bytes };
                            self.check_raw_block(&dataset, hidden, bs, &raw)?;
                            in_place.raw_batch.push(raw);
                        }
                        _ => unreachable!("matched as a data record above"),
                    }
                    let pending = (in_place.batch.len() + in_place.raw_batch.len()) as u64 * bs;
                    if pending >= crate::zio::WRITE_SPAN_BYTES_MAX {
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
                    let (at, len) = (first * bs, (end - first) * bs);
                    if raw {
                        self.modify(&dataset, at, len, None, Apply::Receive).await?;
                    } else {
                        self.zero_in(&dataset, at, len).await?;
                    }
                    *progress = end;
                    expected = end;
                    summary.records += 1;
                    summary.free_records += 1;
                }
                Some(StreamRecord::End { .. }) => {
                    summary.records += 1;
                    self.write_in_place(&dataset, bs, in_place, progress).await?;
                    in_place.settle().await?;
                    if let Some(raw) = &begin.raw {
                        // The tree is the sender's, block for block: its root's MAC is the
                        // sender's too, checked when the key is loaded here.
                        dataset.state.lock().entry.root_mac = raw.root_mac;
                    }
                    return Ok(summary);
                }
                Some(StreamRecord::Begin(_)) | None => {
                    return Err(StoreError::Stream {
                        volume: hidden.to_owned(),
                        cause: StreamError::Truncated { last: summary.records },
                    })
                }
            }
        }
    }

    /// A raw stream's block as this pool must store it: whole allocation units of it, no
    /// more than a block, exactly as sealed. With the family's key here (a stream sent back to
    /// a pool that has it loaded), its tag is checked as it arrives: a changed block refuses
    /// the stream, and nothing of it stays. Without the key it is checked by `key load` (the
    /// root's MAC covers every tag) and by each read.
    fn check_raw_block(
        &self,
        dataset: &Dataset,
        hidden: &str,
        bs: u64,
        raw: &RawReceived,
    ) -> Result<(), StoreError> {
        let refuse = |reason: String| StoreError::ReceiveRefused {
            pool: self.spa.pool().name().to_owned(),
            volume: hidden.to_owned(),
            reason,
        };
        let (block, stored) = (raw.block, raw.bytes.len() as u64);
        let unit = self.spa.pool().unit_bytes();
        if stored == 0 || stored % unit != 0 || stored > bs {
            return Err(refuse(format!(
                "block {block} is {stored} bytes as stored, not whole {unit}-byte units of this \
                 pool (nor at most a block): a raw block is stored as it was sealed"
            )));
        }
        let family = dataset.state.lock().entry.key_family;
        if let Some(key) = self.spa.pool().zio().keys().get(family) {
            let sector = u64::from(sluice_format::SECTOR_BYTES);
            let aad = crate::zio::crypt::block_aad(
                family,
                (u64::from(raw.lsize) / sector) as u32,
                (stored / sector) as u32,
                raw.compression,
                sluice_format::BlockKind::Data,
                0,
            );
            let mut scratch = raw.bytes.clone();
            if key.open(&mut scratch, &aad, &raw.sealing).is_err() {
                return Err(refuse(format!(
                    "block {block} fails its tag under the volume's key: the stream was changed, \
                     or is not this key family's"
                )));
            }
        }
        Ok(())
    }

    /// Writes a batch of received blocks into the open txg, and, unless the volume dedups
    /// (its blocks go through the table at the sync), in place as the stream carried them
    /// (zio's raw mode: no second compression), so the sync links them rather than writing
    /// them (as it links the blocks of records logged by pointer, txg/zil_commit.rs). A block whose
    /// place cannot be had is left to the sync.
    /// `progress` moves past the batch once it is in the open txg.
    async fn write_in_place(
        &self,
        dataset: &Dataset,
        bs: u64,
        in_place: &mut InPlace,
        progress: &mut u64,
    ) -> Result<(), StoreError> {
        if !in_place.raw_batch.is_empty() {
            return self.write_raw_in_place(dataset, bs, in_place, progress).await;
        }
        let batch = std::mem::take(&mut in_place.batch);
        for received in &batch {
            self.write_in(dataset, received.block * bs, &received.logical).await?;
        }
        if let Some(last) = batch.last() {
            *progress = last.block + 1;
        }
        let (txg, held) = {
            let txg = self.txg.lock();
            let v = dataset.state.lock();
            // Nor an encrypted volume's (a receive into a new one): the stream's blocks are
            // plain, and the sync encrypts them as it writes them.
            if v.entry.dedup != DedupMode::Off || v.entry.key_family != 0 {
                return Ok(());
            }
            let held: Vec<Option<Arc<AlignedBuf>>> = batch
                .iter()
                .map(|r| match v.open.get(&r.block) {
                    Some(Block::Data(data)) => Some(Arc::clone(data)),
                    _ => None,
                })
                .collect();
            (txg.open_txg(), held)
        };
        let mut sealed = Vec::with_capacity(batch.len());
        let mut blocks = Vec::with_capacity(batch.len());
        for (received, data) in batch.iter().zip(held) {
            // Not in the open txg any more (a sync took it meanwhile): that sync writes it.
            let Some(data) = data else { continue };
            let props = BlockProps::data(Writer::Receive, txg, Compression::Off);
            let stored = &received.stored;
            sealed.push(self.spa.pool().seal_raw(props, data, stored, received.compression)?);
            blocks.push(received.block);
        }
        let mut placed: Vec<(u32, u64, u64)> = Vec::with_capacity(sealed.len());
        {
            let mut allocator = self.spa.allocator().lock();
            for block in &sealed {
                match allocator.allocate_indirect(block.psize()) {
                    Ok(at) => placed.push(at),
                    Err(_) => break,
                }
            }
        }
        let (prewritten, writes) = self.runs_of(&sealed, &placed, |i| blocks[i], in_place);
        // Recorded for the sync before the writes start, so that a sync beginning now waits
        // for them; a block that left the open txg meanwhile is orphaned (the next sync frees
        // it once its write ends).
        {
            let mut open = self.txg.lock();
            let mut v = dataset.state.lock();
            let mut orphaned = Vec::new();
            for (index, block) in prewritten {
                let current = matches!(v.open.get(&index),
                    Some(Block::Data(data)) if Arc::ptr_eq(data, &block.data));
                // A destroy (under the txg lock, as here) orphans the prewritten blocks
                // it finds; one linked after it would be freed by no sync.
                let live = !dataset.destroyed.load(std::sync::atomic::Ordering::Acquire);
                if current && live && open.open_txg() == txg {
                    if let Some(replaced) = v.prewritten.insert(index, block) {
                        orphaned.push(replaced);
                    }
                    open.count_prewritten(bs, self.spa.pool().inflate(bs, bs));
                } else {
                    orphaned.push(block);
                }
            }
            if !orphaned.is_empty() {
                open.queue(super::dataset::Orphaned(orphaned));
            }
        }
        self.start_runs(writes, in_place);
        Ok(())
    }

    /// The writes of `sealed` blocks at their `placed` places, a span of blocks back to back
    /// at a time: each block's record for the sync (block `index_of(i)`, the pointer, the
    /// write it waits for), and the runs to start ([`Store::start_runs`]).
    fn runs_of(
        &self,
        sealed: &[crate::zio::Sealed],
        placed: &[(u32, u64, u64)],
        index_of: impl Fn(usize) -> u64,
        in_place: &mut InPlace,
    ) -> (Vec<(u64, Prewritten)>, Vec<PendingRun>) {
        let mut writes = Vec::new();
        let mut records = Vec::with_capacity(placed.len());
        for run in crate::zio::span_runs(placed, self.spa.pool().root().write_span_bytes()) {
            let (vdev, _, _) = placed[run.start];
            let pieces = crate::zio::run_blocks(placed, run.clone(), |i| &sealed[i].stored);
            let (done, written) = futures::channel::oneshot::channel::<bool>();
            let write: DataWrite = written
                .map(|r| if r == Ok(true) { BlockWritten::Flushed } else { BlockWritten::Failed })
                .boxed()
                .shared();
            for i in run {
                let bp = crate::zio::describe(&sealed[i], &placed[i..=i]);
                let data = Arc::clone(&sealed[i].logical);
                records.push((index_of(i), Prewritten { data, bp, write: write.clone() }));
            }
            in_place.writes.push(write);
            writes.push((vdev, pieces, done));
        }
        (records, writes)
    }

    /// Starts the runs [`Store::runs_of`] made; the first that fails fails the receive
    /// (`InPlace::settle`).
    fn start_runs(&self, writes: Vec<PendingRun>, in_place: &InPlace) {
        for (vdev, run, done) in writes {
            let pool = Arc::clone(self.spa.pool());
            let failed = Arc::clone(&in_place.failed);
            self.spa.pool().env().spawn("received block write", async move {
                let written = pool.issue_run(Writer::Receive, vdev, run, Issue::ASYNC).await;
                let ok = written.is_ok();
                if let Err(error) = written {
                    failed.lock().get_or_insert(error);
                }
                let _ = done.send(ok);
            });
        }
    }

    /// Writes a batch of a raw stream's blocks in place as they came (ciphertext, with their
    /// seals in the pointers), and puts each in the open txg with the record that its sync
    /// links it: the sync never seals such a block (`VolumeState::raw_receive`). There is no
    /// falling back to the sync as for other streams: a block whose place cannot be had fails
    /// the receive.
    async fn write_raw_in_place(
        &self,
        dataset: &Dataset,
        bs: u64,
        in_place: &mut InPlace,
        progress: &mut u64,
    ) -> Result<(), StoreError> {
        let batch = std::mem::take(&mut in_place.raw_batch);
        let family = dataset.state.lock().entry.key_family;
        let txg = self.txg.lock().open_txg();
        let mut sealed = Vec::with_capacity(batch.len());
        for received in &batch {
            // What the open txg holds of it: the ciphertext in a block-sized buffer, which
            // nothing reads (the volume is hidden) and the sync never writes; its length is
            // the block's logical size, as the pointer says.
            let mut logical = AlignedBuf::zeroed(bs as usize);
            logical[..received.bytes.len()].copy_from_slice(&received.bytes);
            let mut props = BlockProps::data(Writer::Receive, txg, Compression::Off);
            props.crypt = crate::zio::PropsCrypt::Encrypt { family, convergent: false };
            let logical = Arc::new(logical);
            let mut block =
                self.spa.pool().seal_raw(props, logical, &received.bytes, received.compression)?;
            debug_assert_eq!(block.psize(), received.bytes.len() as u64, "whole units, checked");
            debug_assert_eq!(u64::from(received.lsize), bs);
            block.sealing = Some(received.sealing);
            sealed.push(block);
        }
        let placed = self
            .spa
            .allocator()
            .lock()
            .allocate_indirect_all(
                &sealed.iter().map(crate::zio::Sealed::psize).collect::<Vec<_>>(),
                self.spa.pool().root().write_span_bytes(),
            )
            .map_err(|source| PoolError::NoSpace {
                pool: self.spa.pool().name().to_owned(),
                cause: source,
            })?;
        let (stored, writes) = self.runs_of(&sealed, &placed, |i| batch[i].block, in_place);
        // Each block and its record go into the open txg together, before the writes start,
        // so that a sync beginning now waits for them; the writes are started whatever
        // happens here (a block whose record did not go in is freed by the sync that finds
        // it orphaned).
        let mut registered = Ok(());
        let mut orphaned = Vec::new();
        for (index, block) in stored {
            if registered.is_err() {
                orphaned.push(block);
                continue;
            }
            let at = index * bs;
            registered = self
                .modify_with(dataset, at, bs, None, Apply::Receive, vec![(index, block.clone())])
                .await
                .map(|_| ());
            if registered.is_err() {
                orphaned.push(block);
            } else {
                *progress = index + 1;
            }
        }
        if !orphaned.is_empty() {
            self.txg.lock().queue(super::dataset::Orphaned(orphaned));
        }
        self.start_runs(writes, in_place);
        registered
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
        self.create_snapshots_with(&names, begin.creation_secs, Some(begin.guid), false).await?;
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
                    pool: self.spa.pool().name().to_owned(),
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
            .dsl
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
