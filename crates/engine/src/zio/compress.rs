//! Block compression (ZFS: `zio_compress.c`): a data block is stored compressed when that
//! saves at least an eighth of its space, rounded to the pool's allocation unit, as OpenZFS
//! decides; otherwise it is stored as it is and its pointer says so. A block whose sample
//! does not compress is not compressed at all (early abort, `sample_compresses`).
//!
//! The stored bytes are a 4-byte little-endian length, the compressed bytes, and zeros up to
//! the allocation unit (sluice_format's blkptr.rs): the block pointer's `psize` is all of it
//! and its checksum covers all of it, so scrub, resilver and healing read, verify and copy
//! stored bytes without decompressing them. Readers decompress after the checksum passed; the
//! block cache holds logical bytes.
//!
//! lz4 comes from `lz4_flex` (pure Rust) and zstd from the `zstd` crate (the reference C
//! library). lz4's decoder is the crate's safe one, so a damaged block can never make it read or
//! write out of bounds. Its encoder is the unchecked one the crate builds without its
//! `safe-encode` feature, which reads only the block it is given and writes only within the
//! output bound it checks first: with the safe one, compressing a 16 KiB block of
//! the data fio writes took 18.9 us against 15.5, and of random bytes 3.6 us against 3.0
//! (2026-11-27, docs/bench/peers-notes.md); lz4 is the largest single item of the txg sync's CPU
//! under 4 KiB sync writes. Each thread keeps one zstd context per direction: creating one per
//! block would cost more than compressing a 16 KiB block.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_format::{BlockCompression, BlockPointer, Compression, COMPRESSED_HEADER_BYTES};

use crate::device::AlignedBuf;

/// Why stored bytes that passed their checksum did not decompress: a bug that wrote them, never
/// a damaged disk (the checksum catches those first).
#[derive(Debug, thiserror::Error)]
pub enum DecompressError {
    #[error("its length header says {claimed} bytes of {stored} stored")]
    BadLength { claimed: usize, stored: usize },
    #[error("{alg:?} decompression failed: {reason}")]
    Failed { alg: BlockCompression, reason: String },
    #[error("it decompressed to {got} bytes, not the {want} its pointer names")]
    WrongSize { got: usize, want: usize },
}

thread_local! {
    static ZSTD_COMPRESSOR: RefCell<Option<(u8, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Whether [`compress`] stores a block of `len` bytes as it is without looking at its bytes:
/// compression is off, the block is too small for an eighth of it to save a unit, or the
/// early abort's plan found it incompressible.
pub fn stored_as_is(property: Compression, len: usize, unit: u64, planned: Option<bool>) -> bool {
    let unit = unit.max(1) as usize;
    property == Compression::Off || len - len / 8 < unit || planned == Some(false)
}

/// Compresses `logical` as `property` asks. Returns the bytes to store (whole allocation units
/// of `unit` bytes) and the algorithm when that saves at least an eighth of `logical`'s
/// size; `None` when the block is to be stored as it is.
///
/// `planned` is the early abort when [`plan_run`] decided it for the block: `Some(false)`
/// stores it as it is, `Some(true)` compresses it without sampling it again, `None` samples it
/// here.
pub fn compress(
    property: Compression,
    logical: &[u8],
    unit: u64,
    planned: Option<bool>,
) -> Option<(AlignedBuf, BlockCompression)> {
    if stored_as_is(property, logical.len(), unit, planned) {
        return None;
    }
    let unit = unit.max(1) as usize;
    let len = logical.len();
    // The most a stored block may take and still be worth it.
    let limit = len - len / 8;
    // Anything longer than this would round past `limit`.
    let room = (limit / unit) * unit - COMPRESSED_HEADER_BYTES;
    if !planned.unwrap_or_else(|| sample_compresses(logical)) {
        return None;
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let (alg, written) = match property {
            Compression::Off => return None,
            Compression::Lz4 => {
                scratch.resize(lz4_flex::block::get_maximum_output_size(len), 0);
                let n = lz4_flex::block::compress_into(logical, scratch).ok()?;
                (BlockCompression::Lz4, n)
            }
            Compression::Zstd(level) => {
                scratch.resize(zstd::zstd_safe::compress_bound(len), 0);
                let n = ZSTD_COMPRESSOR.with_borrow_mut(|slot| {
                    if slot.as_ref().is_none_or(|(l, _)| *l != level) {
                        let compressor = zstd::bulk::Compressor::new(i32::from(level)).ok()?;
                        *slot = Some((level, compressor));
                    }
                    let (_, compressor) = slot.as_mut()?;
                    compressor.compress_to_buffer(logical, &mut scratch[..]).ok()
                })?;
                (BlockCompression::Zstd, n)
            }
        };
        if written > room {
            return None;
        }
        let stored = (COMPRESSED_HEADER_BYTES + written).div_ceil(unit) * unit;
        let header = (written as u32).to_le_bytes();
        let pieces = [(0, &header[..]), (COMPRESSED_HEADER_BYTES, &scratch[..written])];
        Some((AlignedBuf::gathered(stored, pieces), alg))
    })
}

/// Blocks in a row judged alike (sampled or not) before [`plan_run`] stops sampling every
/// block of a run.
const RUN_ALIKE: usize = 4;
/// The fewest blocks between two samples once a run has [`RUN_ALIKE`] blocks alike.
const RUN_STRIDE: usize = 4;
/// The most blocks between two samples: the stride grows with the run (a quarter of the blocks
/// alike so far) up to this.
const RUN_STRIDE_MAX: usize = 16;

/// How far apart [`plan_run`] takes its samples, in blocks, in a run of `alike` blocks judged
/// the same way: every block until [`RUN_ALIKE`] agree, then a quarter of the run, within
/// [`RUN_STRIDE`] and [`RUN_STRIDE_MAX`].
fn stride(alike: usize) -> usize {
    if alike < RUN_ALIKE {
        1
    } else {
        (alike / RUN_ALIKE).clamp(RUN_STRIDE, RUN_STRIDE_MAX)
    }
}

/// Where the early abort's run stood after a volume's last batch, so that its next batch goes
/// on from there: a stream's blocks come in batches of a few dozen (a commit's, a span's), and
/// each batch starting over sampled its first [`RUN_ALIKE`] blocks and one in [`RUN_STRIDE`]
/// after. Under a lone client's 1 MiB write + flush of random data that was 23 samples a write
/// (docs/bench/peers-notes.md, 2026-12-06). One per volume (crate::txg's `Dataset`), shared by
/// its committers and its syncs, which store it without a lock: a batch that overwrites
/// another's hint costs a few samples or a few blocks' compression, never a block's
/// correctness.
#[derive(Debug, Default)]
pub struct RunHint(AtomicU64);

impl RunHint {
    /// Whether the run's blocks compress (`None`: no run yet), and how many blocks it has.
    fn load(&self) -> (Option<bool>, usize) {
        let v = self.0.load(Ordering::Relaxed);
        let compresses = match v & 3 {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        };
        (compresses, (v >> 2) as usize)
    }

    fn store(&self, compresses: Option<bool>, alike: usize) {
        let kind = match compresses {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        // A run's length matters only up to where the stride stops growing.
        let alike = alike.min(RUN_ALIKE * RUN_STRIDE_MAX) as u64;
        self.0.store(kind | (alike << 2), Ordering::Relaxed);
    }
}

/// The early abort for a batch of blocks written together (a commit's or a span's, of one
/// volume): each block's sample as [`compress`] takes it, until [`RUN_ALIKE`] blocks in a row
/// have been judged alike; from there one block in a stride, [`RUN_STRIDE`] blocks at first,
/// growing with the run to [`RUN_STRIDE_MAX`]. With a `hint`, the run goes on from where the
/// volume's last batch left it (its first block is sampled all the same, so no batch is planned
/// without a look, and a batch whose data turned is seen at once), and the hint is left where
/// this batch ends.
///
/// In a run of incompressible samples the blocks skipped are stored as they are, and when a
/// sample compresses the blocks skipped since the last sample are sampled after all. The sample
/// of an incompressible block costs about a third of its compression (lz4 on 2 KiB of random
/// bytes against all 16 KiB, docs/bench/peers-notes.md, 2026-12-06), and under 1 MiB writes of
/// random data the samples took 16% of the server's CPU, more than the checksum of all the
/// bytes (perf, docs/bench/peers-notes.md, 2026-11-29); streams of already compressed or
/// encrypted data are runs of such blocks. What that guess costs: a compressible stretch
/// shorter than a stride, between two incompressible samples, or at the end of a batch, is
/// stored as it is (space, never correctness: its pointer says so).
///
/// In a run of compressible samples the blocks skipped are compressed whole, as [`compress`]
/// always decides by the result whether a block is worth storing compressed: there a sample
/// is pure cost, about a fifth of the block's compression (1.2 against 5 us for 16 KiB of
/// half-compressible data, 2026-12-04). What that guess costs: up to a stride less one of
/// incompressible blocks after the data turned are compressed whole (with lz4 1.3-3 us each for
/// 16 KiB of random bytes; with zstd more, most at high levels) and then stored as they are.
///
/// Returns each block's decision for [`compress`] (`None` for blocks not compressed at all,
/// and those too short to sample) and how many samples were taken.
pub fn plan_run<'a>(
    blocks: impl IntoIterator<Item = (Compression, &'a [u8])>,
    hint: Option<&RunHint>,
) -> (Vec<Option<bool>>, usize) {
    let blocks: Vec<(Compression, &[u8])> = blocks.into_iter().collect();
    let mut plan = Vec::with_capacity(blocks.len());
    // The run: whether its blocks compress, and how many it has so far, sampled or not.
    let (mut compresses_run, mut alike) = hint.map(RunHint::load).unwrap_or_default();
    // Blocks judged without a sample since the last sample in this batch (none before the
    // batch's first sample: it takes one before it skips any).
    let mut since: Option<usize> = None;
    // This batch's blocks stored as they are without a sample since the last sample taken.
    let mut skipped: Vec<usize> = Vec::new();
    let mut samples = 0usize;
    for &(property, logical) in &blocks {
        if property == Compression::Off || logical.len() < 4 * SAMPLE_PIECE_BYTES * SAMPLE_PIECES {
            plan.push(None);
            continue;
        }
        if let (Some(compresses), Some(n)) = (compresses_run, since) {
            if n + 1 < stride(alike) {
                if !compresses {
                    skipped.push(plan.len());
                }
                since = Some(n + 1);
                alike += 1;
                plan.push(Some(compresses));
                continue;
            }
        }
        samples += 1;
        let compresses = sample_compresses(logical);
        if compresses && compresses_run == Some(false) {
            // The data turned compressible somewhere since the last sample.
            for &at in &skipped {
                samples += 1;
                plan[at] = Some(sample_compresses(blocks[at].1));
            }
        }
        if compresses_run == Some(compresses) {
            alike += 1;
        } else {
            compresses_run = Some(compresses);
            alike = 1;
        }
        skipped.clear();
        since = Some(0);
        plan.push(Some(compresses));
    }
    if let Some(hint) = hint {
        hint.store(compresses_run, alike);
    }
    (plan, samples)
}

/// Bytes of each of the [`SAMPLE_PIECES`] pieces an early abort compresses.
const SAMPLE_PIECE_BYTES: usize = 512;
/// Pieces, spread evenly over the block, so a block that is mostly zeros after an
/// incompressible start still compresses.
const SAMPLE_PIECES: usize = 4;

/// Early abort (as OpenZFS's zstd early abort runs lz4 first): whether lz4 saves at least an
/// eighth of a sample of the block. Random data, the common case of a VM's or database's
/// writes that are already compressed or encrypted, then costs lz4 on an eighth of a 16 KiB
/// block instead of all of it (about a third of the time: lz4 speeds up through incompressible
/// bytes as its misses grow, which a short sample gains less from). With 4 KiB sync writes of
/// random bytes, lz4 of whole blocks was 17% of the server's CPU (perf, 2026-11-24). Blocks
/// shorter than four samples are compressed whole.
fn sample_compresses(logical: &[u8]) -> bool {
    const SAMPLE: usize = SAMPLE_PIECE_BYTES * SAMPLE_PIECES;
    let len = logical.len();
    if len < 4 * SAMPLE {
        return true;
    }
    let mut sample = [0u8; SAMPLE];
    for (i, piece) in sample.chunks_exact_mut(SAMPLE_PIECE_BYTES).enumerate() {
        let at = i * (len / SAMPLE_PIECES);
        piece.copy_from_slice(&logical[at..at + SAMPLE_PIECE_BYTES]);
    }
    // Room for lz4's worst case (get_maximum_output_size: about 1.1x and 20 bytes).
    let mut out = [0u8; 2 * SAMPLE];
    debug_assert!(lz4_flex::block::get_maximum_output_size(SAMPLE) <= out.len());
    lz4_flex::block::compress_into(&sample, &mut out).is_ok_and(|n| n <= SAMPLE - SAMPLE / 8)
}

/// The logical bytes of a block whose stored bytes `stored` passed `bp`'s checksum.
pub fn decompress(bp: &BlockPointer, stored: &[u8]) -> Result<AlignedBuf, DecompressError> {
    decompress_stored(bp.compression, bp.lsize_bytes() as usize, stored)
}

/// The `want` logical bytes of a block stored as `stored`, compressed as `alg` says (a block
/// received in a send stream, which carries no block pointer).
pub fn decompress_stored(
    alg: BlockCompression,
    want: usize,
    stored: &[u8],
) -> Result<AlignedBuf, DecompressError> {
    if alg == BlockCompression::None {
        return Ok(AlignedBuf::copy_from(stored));
    }
    let claimed = stored
        .get(..COMPRESSED_HEADER_BYTES)
        .map_or(usize::MAX, |h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize);
    let body = stored
        .get(COMPRESSED_HEADER_BYTES..COMPRESSED_HEADER_BYTES.saturating_add(claimed))
        .ok_or(DecompressError::BadLength { claimed, stored: stored.len() })?;
    let mut out = AlignedBuf::zeroed(want);
    let failed = |reason: String| DecompressError::Failed { alg, reason };
    let got = match alg {
        BlockCompression::None => unreachable!("handled above"),
        BlockCompression::Lz4 => {
            lz4_flex::block::decompress_into(body, &mut out).map_err(|e| failed(e.to_string()))?
        }
        BlockCompression::Zstd => ZSTD_DECOMPRESSOR.with_borrow_mut(|slot| {
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| failed(e.to_string()))?);
            }
            let decompressor = slot.as_mut().expect("set above");
            decompressor.decompress_to_buffer(body, &mut out[..]).map_err(|e| failed(e.to_string()))
        })?,
    };
    if got != want {
        return Err(DecompressError::WrongSize { got, want });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_of_incompressible_or_compressible_blocks_are_sampled_sparsely() {
        use super::{plan_run, RunHint, RUN_ALIKE, RUN_STRIDE, RUN_STRIDE_MAX};
        use sluice_format::Compression;
        let mut rng = crate::rt::Rng::new(7);
        let random: Vec<Vec<u8>> =
            (0..64).map(|_| (0..16384).map(|_| rng.u64() as u8).collect()).collect();
        let text: Vec<u8> =
            b"sluice writes this line again and again. ".repeat(400)[..16384].to_vec();
        let lz4 = |b: &[Vec<u8>]| -> Vec<(Compression, Vec<u8>)> {
            b.iter().map(|x| (Compression::Lz4, x.clone())).collect()
        };
        let run_hinted = |blocks: &[(Compression, Vec<u8>)], hint: Option<&RunHint>| {
            plan_run(blocks.iter().map(|(c, b)| (*c, b.as_slice())), hint)
        };
        let run = |blocks: &[(Compression, Vec<u8>)]| run_hinted(blocks, None);
        // 64 random blocks: RUN_ALIKE samples, then at most one in RUN_STRIDE, fewer as the
        // run grows.
        let (plan, samples) = run(&lz4(&random));
        assert!(plan.iter().all(|p| *p == Some(false)));
        assert!(samples > RUN_ALIKE + 64 / RUN_STRIDE_MAX, "{samples} samples");
        assert!(samples < RUN_ALIKE + (64 - RUN_ALIKE).div_ceil(RUN_STRIDE), "{samples} samples");
        // 64 compressible blocks: the same samples; every one is compressed.
        let (plan, text_samples) = run(&lz4(&vec![text.clone(); 64]));
        assert_eq!(text_samples, samples);
        assert!(plan.iter().all(|p| *p == Some(true)), "{plan:?}");
        // A stream in batches of 16 random blocks: each batch alone starts over, sampling
        // its first RUN_ALIKE blocks; with the volume's hint, the run goes on from batch to
        // batch, down to each batch's first block (one sample in RUN_STRIDE_MAX).
        let batch = lz4(&random[..16]);
        assert_eq!(run(&batch).1, RUN_ALIKE + (16 - RUN_ALIKE).div_ceil(RUN_STRIDE));
        let hint = RunHint::default();
        let hinted: Vec<usize> = (0..12).map(|_| run_hinted(&batch, Some(&hint)).1).collect();
        assert!(hinted[6..].iter().all(|&n| n == 16 / RUN_STRIDE_MAX), "{hinted:?}");
        assert!(hinted.iter().sum::<usize>() < 12 + 2 * RUN_ALIKE + 16 / RUN_STRIDE, "{hinted:?}");
        // A batch of one block after that run is sampled all the same: a batch is never
        // planned without a look.
        let (plan, samples) = run_hinted(&lz4(std::slice::from_ref(&text)), Some(&hint));
        assert_eq!((plan, samples), (vec![Some(true)], 1));
        // And the run it starts (one compressible block) is a new one: the next random batch
        // samples block by block again until RUN_ALIKE agree.
        assert_eq!(run_hinted(&batch, Some(&hint)).1, run(&batch).1);
        // The data turns compressible in the next batch: the blocks skipped before the sample
        // that saw it are sampled after all, and every block of the batch is compressed.
        let (plan, _) = run_hinted(&lz4(&vec![text.clone(); 16]), Some(&hint));
        assert!(plan.iter().all(|p| *p == Some(true)), "{plan:?}");
        // Random, then compressible: every compressible block is compressed (those skipped
        // before the sample that found the turn are sampled after all).
        let mut mixed = lz4(&random[..21]);
        mixed.extend(lz4(&vec![text.clone(); 43]));
        let (plan, _) = run(&mixed);
        assert!(plan[..21].iter().all(|p| *p == Some(false)), "{plan:?}");
        assert!(plan[21..].iter().all(|p| *p == Some(true)), "{plan:?}");
        // Compressible, then random: the random blocks after the turn that were not sampled
        // (fewer than a stride) are compressed whole, and compress stores them as they are;
        // from the sample that saw the turn on, every block is planned as it is.
        let mut turned = lz4(&vec![text.clone(); 21]);
        turned.extend(lz4(&random[..43]));
        let (plan, _) = run(&turned);
        assert!(plan[..21].iter().all(|p| *p == Some(true)), "{plan:?}");
        let tried = plan[21..].iter().take_while(|p| **p == Some(true)).count();
        assert!(tried < RUN_STRIDE_MAX, "{plan:?}");
        assert!(plan[21 + tried..].iter().all(|p| *p == Some(false)), "{plan:?}");
        for (_, block) in &turned[21..21 + tried] {
            assert!(super::compress(Compression::Lz4, block, 4096, Some(true)).is_none());
        }
        // The price of the sparse samples: a lone compressible block skipped inside a run of
        // random ones is stored as it is.
        let mut lone = lz4(&random[..32]);
        lone[RUN_ALIKE + 1] = (Compression::Lz4, text.clone());
        assert_eq!(run(&lone).0[RUN_ALIKE + 1], Some(false));
        // Compression off, or a block too short to sample: left to `compress`.
        let off = vec![(Compression::Off, random[0].clone()), (Compression::Lz4, vec![1u8; 4096])];
        assert_eq!(run(&off).0, [None, None]);
        // What the plan says, compress does, without sampling again.
        assert!(super::compress(Compression::Lz4, &text, 4096, Some(false)).is_none());
        assert!(super::compress(Compression::Lz4, &text, 4096, Some(true)).is_some());
    }

    use super::*;
    use sluice_format::ChecksumAlg;

    fn pointer(alg: BlockCompression, logical: usize, stored: &[u8]) -> BlockPointer {
        let sealed = crate::zio::Sealed {
            props: crate::zio::BlockProps::data(
                crate::zio::Writer::VolumeData,
                1,
                Compression::Off,
            ),
            logical: std::sync::Arc::new(AlignedBuf::zeroed(logical)),
            stored: std::sync::Arc::new(AlignedBuf::copy_from(stored)),
            compression: alg,
            checksum: ChecksumAlg::Xxh3_128.compute(stored),
            sealing: None,
        };
        crate::zio::describe(&sealed, &[(0, 0, stored.len() as u64)])
    }

    #[test]
    fn round_trip_each_algorithm() {
        // Text-like data: compresses well.
        let logical: Vec<u8> =
            (0..16384u32).map(|i| b"sluice stores blocks "[(i % 21) as usize]).collect();
        for property in [Compression::Lz4, Compression::Zstd(1), Compression::Zstd(19)] {
            let (stored, alg) = compress(property, &logical, 4096, None).expect("compressible");
            assert_eq!(stored.len(), 4096, "{property:?}: one allocation unit");
            let bp = pointer(alg, logical.len(), &stored);
            assert_eq!(&decompress(&bp, &stored).unwrap()[..], &logical[..]);
            assert_eq!(bp.checksum, ChecksumAlg::Xxh3_128.compute(&stored));
        }
    }

    #[test]
    fn stored_as_is_unless_an_eighth_is_saved() {
        // Random bytes do not compress.
        let mut rng = fastrand::Rng::with_seed(7);
        let random: Vec<u8> = (0..16384).map(|_| rng.u8(..)).collect();
        assert!(compress(Compression::Lz4, &random, 4096, None).is_none());
        assert!(compress(Compression::Zstd(3), &random, 4096, None).is_none());
        // Half random, half zeros: 8 KiB + header rounds to 12 KiB of 16: saved a quarter.
        let mut half = random.clone();
        half[8192..].fill(0);
        assert_eq!(compress(Compression::Lz4, &half, 4096, None).unwrap().0.len(), 12288);
        // 15/16 random: rounding to 16 KiB saves nothing.
        let mut most = random;
        most[15360..].fill(0);
        assert!(compress(Compression::Lz4, &most, 4096, None).is_none());
        // The early abort's sample spans the block: random bytes first, zeros after, still
        // compress.
        let mut start = vec![0u8; 16384];
        start[..4096].copy_from_slice(&half[..4096]);
        assert!(compress(Compression::Lz4, &start, 4096, None).is_some());
        let noise: Vec<u8> = (0..16384).map(|_| rng.u8(..)).collect();
        assert!(sample_compresses(&start) && !sample_compresses(&noise));
        // A 4 KiB block on 4 KiB units can never save an eighth.
        assert!(compress(Compression::Lz4, &[0u8; 4096], 4096, None).is_none());
        assert!(compress(Compression::Off, &[0u8; 16384], 512, None).is_none());
    }

    #[test]
    fn mixed_blocks_round_trip() {
        // Blocks of runs copied from earlier in the block, random bytes and zeros, each run of a
        // random length (the encoder's matches start, end and overlap everywhere): whatever
        // compresses decompresses to the same bytes.
        let mut rng = fastrand::Rng::with_seed(11);
        let mut compressed = 0;
        for _ in 0..200 {
            let len = [4096usize, 16384, 131072][rng.usize(..3)];
            let mut block = Vec::with_capacity(len);
            while block.len() < len {
                let run = rng.usize(1..2048).min(len - block.len());
                match rng.u8(..3) {
                    0 if block.len() > run => {
                        let from = rng.usize(..block.len() - run);
                        block.extend_from_within(from..from + run);
                    }
                    1 => block.extend(std::iter::repeat_n(0u8, run)),
                    _ => block.extend((0..run).map(|_| rng.u8(..))),
                }
            }
            for property in [Compression::Lz4, Compression::Zstd(1)] {
                if let Some((stored, alg)) = compress(property, &block, 512, None) {
                    compressed += usize::from(alg == BlockCompression::Lz4);
                    let bp = pointer(alg, block.len(), &stored);
                    assert_eq!(&decompress(&bp, &stored).unwrap()[..], &block[..]);
                }
            }
        }
        assert!(compressed > 50, "most mixed blocks compress with lz4 ({compressed} did)");
    }

    #[test]
    fn damaged_headers_are_errors_not_panics() {
        let logical = vec![3u8; 16384];
        let (stored, alg) = compress(Compression::Lz4, &logical, 512, None).unwrap();
        let bp = pointer(alg, logical.len(), &stored);
        let mut bad = stored.to_vec();
        bad[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decompress(&bp, &bad), Err(DecompressError::BadLength { .. })));
        let mut bad = stored.to_vec();
        bad[..4].copy_from_slice(&1u32.to_le_bytes());
        assert!(decompress(&bp, &bad).is_err());
        let mut wrong = bp;
        wrong.lsize_sectors *= 2;
        assert!(decompress(&wrong, &stored).is_err());
    }
}
