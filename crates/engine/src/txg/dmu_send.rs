//! Send (ZFS: `dmu_send.c`): a snapshot as a stream of records (sluice_format's send stream),
//! whole or as the change since an older snapshot; txg/dmu_recv.rs applies one.
//!
//! A send walks the snapshot's tree in block order. An incremental one skips every subtree
//! born at or before the older snapshot's txg (copy-on-write gives a parent a birth no older
//! than its children), so its work and its size follow the blocks that changed, not the
//! volume's size; within an indirect block born since, a hole is sent as a free of its range,
//! since it may have held data in the older snapshot. Blocks go as they are stored, compressed
//! ones compressed.

use futures::StreamExt;
use sluice_format::{
    BlockCompression, BlockCrypt, BlockPointer, RawBegin, ResumeToken, StreamBegin, StreamError,
    StreamRecord, BLKPTR_BYTES, COMPRESSED_HEADER_BYTES,
};

use super::dataset::Dsl;
use super::spa::Spa;
use super::{Store, StoreError};
use crate::objset::INDIRECT_BPS;
use crate::pool::Pool;
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
        let what = SendWhat { volume, snapshot, from, resume_block: None, raw: false };
        send_snapshot_from(&self.spa, &self.dsl, what, emit).await
    }

    /// [`Store::send_snapshot`] raw (ZFS: `zfs send -w`): an encrypted volume's blocks as
    /// they are stored (ciphertext, salts, nonces, tags) with its wrapped key and the keyed MAC
    /// of the snapshot's root, so that a receiver stores it without the key. Needs no key here
    /// either. A volume that is not encrypted is sent as [`Store::send_snapshot`] sends it.
    pub async fn send_snapshot_raw(
        &self,
        volume: &str,
        snapshot: &str,
        from: Option<&str>,
        emit: &mut (dyn FnMut(StreamRecord) -> Result<(), StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        let what = SendWhat { volume, snapshot, from, resume_block: None, raw: true };
        send_snapshot_from(&self.spa, &self.dsl, what, emit).await
    }

    /// Sends what an interrupted receive still needs (ZFS: `zfs send -t TOKEN`): the stream
    /// the token names, from its next block on. The snapshots are found by guid, so a renamed
    /// one still resumes.
    pub async fn send_resume(
        &self,
        token: &ResumeToken,
        emit: &mut (dyn FnMut(StreamRecord) -> Result<(), StreamError> + Send),
    ) -> Result<StreamSummary, StoreError> {
        let pool = self.spa.pool().name().to_owned();
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
                     was destroyed; send again from the start and abort the partial receive",
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
        let what = SendWhat {
            volume: &volume,
            snapshot: &to,
            from: from.as_deref(),
            resume_block: Some(token.next_block),
            raw: false,
        };
        send_snapshot_from(&self.spa, &self.dsl, what, emit).await
    }
}

/// What a send sends: `volume@snapshot`, since `from` if incremental, from `resume_block` on
/// if resumed, raw or not.
struct SendWhat<'a> {
    volume: &'a str,
    snapshot: &'a str,
    from: Option<&'a str>,
    resume_block: Option<u64>,
    raw: bool,
}

/// [`Store::send_snapshot`]; a resumed stream leaves out every block before
/// `resume_block`. It reads the pool alone, once the namespace has given the volume.
async fn send_snapshot_from(
    spa: &Spa,
    dsl: &Dsl,
    what: SendWhat<'_>,
    emit: &mut (dyn FnMut(StreamRecord) -> Result<(), StreamError> + Send),
) -> Result<StreamSummary, StoreError> {
    let SendWhat { volume, snapshot, from, resume_block, raw } = what;
    spa.check_live()?;
    let dataset = dsl.dataset(volume)?;
    let entry = dataset.state.lock().entry.clone();
    let raw = raw && entry.key_family != 0;
    if entry.key_family != 0 && !raw {
        // A stream of its stored bytes would carry ciphertext without what decrypts it.
        return Err(StoreError::NotWithEncryption {
            pool: spa.pool().name().to_owned(),
            volume: volume.to_owned(),
            what: "a send that is not raw (send it with -w)",
        });
    }
    if raw && resume_block.is_some() {
        return Err(StoreError::NotWithEncryption {
            pool: spa.pool().name().to_owned(),
            volume: volume.to_owned(),
            what: "resuming a raw stream",
        });
    }
    let find = |name: &str| {
        entry.snapshots.iter().find(|s| s.name == name).cloned().ok_or_else(|| {
            StoreError::NoSuchSnapshot {
                pool: spa.pool().name().to_owned(),
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
    let stream_error = |source| StoreError::Stream { volume: volume.to_owned(), cause: source };
    let raw_begin = if raw {
        let key = spa.crypt().find(entry.key_family).ok_or_else(|| StoreError::Key {
            pool: spa.pool().name().to_owned(),
            volume: volume.to_owned(),
            cause: crate::zio::crypt::CryptError::Kdf(format!(
                "key family {:#018x} is not in the pool",
                entry.key_family
            )),
        })?;
        Some(Box::new(RawBegin { key, root_mac: to.root_mac }))
    } else {
        None
    };
    let mut summary = StreamSummary::default();
    emit(StreamRecord::Begin(StreamBegin {
        block_bytes: entry.block_bytes,
        size_bytes: to.size_bytes,
        guid: to.guid,
        txg: to.txg,
        creation_secs: to.creation_secs,
        from_guid: older.as_ref().map(|o| o.guid),
        name: to.name.clone(),
        source: format!("{}/{volume}", spa.pool().name()),
        resume_block,
        raw: raw_begin,
    }))
    .map_err(stream_error)?;
    summary.records += 1;
    let since = older.as_ref().map_or(0, |o| o.txg);
    let blocks = to.size_bytes / u64::from(entry.block_bytes);
    let mut out = Emitter { emit, summary: &mut summary, pending_free: None, blocks, resume_block };
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
                    let record = data_record(spa.pool(), first, &bp, raw).await?;
                    out.data(record).map_err(stream_error)?;
                    continue;
                }
                let node = spa.pool().read_block_cached(&bp, IoClass::AsyncRead).await?;
                let child_span = INDIRECT_BPS.saturating_pow(u32::from(level - 1));
                let mut children = Vec::new();
                for (slot, raw) in node.chunks_exact(BLKPTR_BYTES).enumerate() {
                    let child_first = first + slot as u64 * child_span;
                    if child_first >= blocks {
                        break;
                    }
                    let child = BlockPointer::decode(raw).map_err(|source| {
                        crate::pool::PoolError::Format {
                            pool: spa.pool().name().to_owned(),
                            cause: source,
                        }
                    })?;
                    match child {
                        Some(bp) => {
                            children.push(Visit::Tree { level: level - 1, first: child_first, bp })
                        }
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
                            Leaf::Data(first, bp) => data_record(spa.pool(), first, &bp, raw).await,
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
        if let StreamRecord::Data { bytes, .. } | StreamRecord::RawData { bytes, .. } = &record {
            self.summary.data_bytes += bytes.len() as u64;
        }
        (self.emit)(record)?;
        self.summary.records += 1;
        self.summary.data_blocks += 1;
        Ok(())
    }
}

/// Data block `block` as a send record: its bytes as stored, verified against `bp`
/// (a compressed block without the padding to its allocation unit; an encrypted one, raw,
/// with it, since its tag covers every byte).
async fn data_record(
    pool: &Pool,
    block: u64,
    bp: &BlockPointer,
    raw: bool,
) -> Result<StreamRecord, StoreError> {
    let stored = pool.read_block(bp, IoClass::AsyncRead).await?;
    if let (true, BlockCrypt::Encrypted { salt, iv, mac, .. }) = (raw, bp.crypt) {
        let psize = (bp.psize_bytes() as usize).min(stored.len());
        return Ok(StreamRecord::RawData {
            block,
            lsize: bp.lsize_bytes() as u32,
            compression: bp.compression,
            salt,
            iv,
            mac,
            bytes: stored[..psize].to_vec(),
        });
    }
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
