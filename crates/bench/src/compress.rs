//! Compression's cost on this CPU (`sluice-bench compress`): how many bytes a second one core
//! puts through the write pipeline's compress stage and the read path's decompression, per
//! algorithm, block size and kind of data. The blocks go as the pipeline sends a 1 MiB write's:
//! in runs of 1 MiB whose early abort is planned together, each run going on from where the
//! last left it as one volume's batches do (`zio::compress::plan_run`: each run's first block
//! and every block until four in a row did or did not compress are sampled, then one in a
//! stride that grows with the run from 4 to 16 blocks), then each through
//! `zio::compress::compress` with its plan. No I/O: the figures are the code's ceiling, not a
//! pool's. The allocator is the server's (mimalloc, tuned as `sluice serve` tunes it); each
//! compressed block's buffer is allocated inside the timed work, as in the pipeline. On glibc's
//! allocator, which this benchmark used before 2026-12-04, those buffers' page faults were part
//! of every figure (docs/bench/compression.md compares the two).
//!
//! Why a benchmark of its own: the goal rows of the peers comparison count "lz4's own cost",
//! which `bench/peers.sh` can only take as the difference between two servers' CPU per MiB
//! (compression on and off), each noisy on a shared VM. This measures the same code alone.
//!
//! The kinds of data are those the peers comparison writes: random bytes (fio's default
//! buffers, which no compressor shrinks: lz4 pays only the early abort's sample), bytes that
//! compress to about half (fio's `--buffer_compress_percentage=50`: in each 512-byte chunk,
//! half random bytes and half zeros), and zeros.

use sluice_engine::zio::compress::{compress, decompress_stored, plan_run, RunHint};
use sluice_format::{BlockCompression, Compression};

/// The allocation unit the stored size is rounded to: a new pool's (`pool create`'s default
/// ashift, 12).
const UNIT: u64 = 4096;
/// The bytes of blocks whose early abort is planned together: a 1 MiB write's.
const RUN_BYTES: u64 = 1 << 20;
/// The chunk fio's `buffer_compress_percentage` fills half with random bytes, half with zeros
/// (its `buffer_compress_chunk` default).
const CHUNK: usize = 512;

/// What a block holds.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Data {
    Random,
    Half,
    Zeros,
}

impl Data {
    const ALL: [Data; 3] = [Data::Random, Data::Half, Data::Zeros];

    fn name(self) -> &'static str {
        match self {
            Data::Random => "random",
            Data::Half => "half compressible",
            Data::Zeros => "zeros",
        }
    }

    /// `len` bytes of this kind, from a fixed seed so runs compare.
    fn fill(self, len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed;
        let mut random = move || {
            // splitmix64: fast, and its bytes do not compress.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let mut out = vec![0u8; len];
        match self {
            Data::Zeros => {}
            Data::Random => out.chunks_mut(8).for_each(|c| {
                let word = random().to_le_bytes();
                c.copy_from_slice(&word[..c.len()]);
            }),
            Data::Half => out.chunks_mut(CHUNK).for_each(|chunk| {
                let half = chunk.len() / 2;
                chunk[..half].chunks_mut(8).for_each(|c| {
                    let word = random().to_le_bytes();
                    c.copy_from_slice(&word[..c.len()]);
                });
            }),
        }
        out
    }
}

/// One algorithm, block size and kind of data.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub algorithm: String,
    pub block_bytes: u64,
    pub data: Data,
    /// Stored bytes over logical bytes (1.0 where the block is stored as it is).
    pub stored_ratio: f64,
    /// GB/s of logical bytes through the compress stage, median of the runs, and each run's.
    pub compress_gb_per_s: f64,
    pub compress_runs: Vec<f64>,
    /// Microseconds of one core per MiB compressed, from the median.
    pub compress_us_per_mib: f64,
    /// GB/s of logical bytes decompressed (none where the block is stored as it is).
    pub decompress_gb_per_s: Option<f64>,
}

/// Every row, with how it was measured.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub seconds_per_run: f64,
    pub runs: usize,
    pub rows: Vec<Row>,
}

impl Report {
    /// The rows as a markdown table, after a line that says how they were measured.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "One core, {} runs of {:.2} s each, through the compress stage (blocks in runs of \
             1 MiB, the early abort planned over each run; stored sizes rounded to 4 KiB); \
             GB/s of logical bytes, median (range).\n\n| algorithm | block | data | \
             stored / logical | compress GB/s | range | µs per MiB | decompress GB/s |\n\
             |---|---:|---|---:|---:|---|---:|---:|\n",
            self.runs, self.seconds_per_run
        );
        for row in &self.rows {
            let range = crate::range_of(&row.compress_runs);
            let decompress = row.decompress_gb_per_s.map_or("-".to_owned(), |g| format!("{g:.2}"));
            out += &format!(
                "| {} | {} KiB | {} | {:.2} | {:.2} | {range} | {:.0} | {decompress} |\n",
                row.algorithm,
                row.block_bytes >> 10,
                row.data.name(),
                row.stored_ratio,
                row.compress_gb_per_s,
                row.compress_us_per_mib,
            );
        }
        out
    }
}

/// Blocks of each size cycled through, so one block's bytes do not stay in the first-level
/// cache: about 4 MiB of data per size, as a stream's blocks arrive.
fn blocks_for(size: u64, data: Data) -> Vec<Vec<u8>> {
    let count = ((4 << 20) / size).clamp(4, 1024);
    (0..count).map(|i| data.fill(size as usize, 0x5eed ^ (i << 20) ^ size)).collect()
}

/// Measures each algorithm on each block size and kind of data, `runs` runs of `seconds` each,
/// after checking that every block it compresses decompresses to itself.
pub fn run(
    algorithms: &[Compression],
    sizes: &[u64],
    seconds: f64,
    runs: usize,
) -> anyhow::Result<Report> {
    let mut rows = Vec::new();
    for &algorithm in algorithms {
        anyhow::ensure!(algorithm != Compression::Off, "compression off has nothing to measure");
        for &size in sizes {
            for data in Data::ALL {
                let blocks = blocks_for(size, data);
                let per_run = (RUN_BYTES / size).max(1) as usize;
                let runs_of_blocks: Vec<&[Vec<u8>]> = blocks.chunks(per_run).collect();
                // Compresses a run as the pipeline does: its early abort planned over the run,
                // going on from where the last run left it, as one volume's batches do.
                let hint = RunHint::default();
                let compress_run = |run: &[Vec<u8>]| {
                    let (plan, _) = plan_run(run.iter().map(|b| (algorithm, &b[..])), Some(&hint));
                    run.iter()
                        .zip(plan)
                        .map(|(b, planned)| compress(algorithm, b, UNIT, planned))
                        .collect::<Vec<_>>()
                };
                let stored: Vec<Option<(Vec<u8>, BlockCompression)>> = runs_of_blocks
                    .iter()
                    .flat_map(|run| compress_run(run))
                    .map(|c| c.map(|(s, alg)| (s.to_vec(), alg)))
                    .collect();
                let stored_bytes: usize = stored
                    .iter()
                    .zip(&blocks)
                    .map(|(s, b)| s.as_ref().map_or(b.len(), |s| s.0.len()))
                    .sum();
                let logical_bytes: usize = blocks.iter().map(Vec::len).sum();
                // Every block compressed must come back as it was.
                for (s, b) in stored.iter().zip(&blocks) {
                    if let Some((bytes, alg)) = s {
                        let back = decompress_stored(*alg, b.len(), bytes)?;
                        anyhow::ensure!(
                            back[..] == b[..],
                            "a {size}-byte {data:?} block did not decompress to itself"
                        );
                    }
                }
                let mut next = 0usize;
                let run_bytes = size * per_run as u64;
                let compress_runs: Vec<f64> = (0..runs)
                    .map(|_| {
                        crate::rate_gb_per_s(run_bytes, seconds, || {
                            let run = runs_of_blocks[next % runs_of_blocks.len()];
                            next += 1;
                            std::hint::black_box(compress_run(run));
                        })
                    })
                    .collect();
                let compressed: Vec<&(Vec<u8>, BlockCompression)> =
                    stored.iter().flatten().collect();
                let decompress_gb_per_s = (!compressed.is_empty()).then(|| {
                    let mut next = 0usize;
                    let rates: Vec<f64> = (0..runs)
                        .map(|_| {
                            crate::rate_gb_per_s(size, seconds, || {
                                let (bytes, alg) = compressed[next % compressed.len()];
                                next += 1;
                                let back = decompress_stored(*alg, size as usize, bytes);
                                std::hint::black_box(back.expect("checked above"));
                            })
                        })
                        .collect();
                    crate::median_of(&rates)
                });
                let median = crate::median_of(&compress_runs);
                rows.push(Row {
                    algorithm: algorithm.name(),
                    block_bytes: size,
                    data,
                    stored_ratio: stored_bytes as f64 / logical_bytes as f64,
                    compress_gb_per_s: median,
                    compress_runs,
                    compress_us_per_mib: (1u64 << 20) as f64 / (median * 1e9) * 1e6,
                    decompress_gb_per_s,
                });
            }
        }
    }
    Ok(Report { seconds_per_run: seconds, runs, rows })
}
