//! Volume throughput through the engine API on file leaves, in real time (issue: pools and
//! txgs). Not a test: it measures, and its table goes to docs/bench/engine.md.
//!
//! A pool is created on a 2-way mirror of files in the given directory, with one volume, and
//! its txg syncer runs as under `sluice serve` (a sync starts when dirty data builds up, while
//! writes go on into the next txg).
//! Workloads, each timed with its sync (a write counts once it is durable):
//! - sequential write: 1 MiB writes over the whole volume, then sync; two warm-up rounds and
//!   then three measured rounds, each alternating with the raw file, medians of the measured
//!   ones reported;
//! - random write: 4 KiB writes at random 4 KiB offsets from `queue_depth` concurrent writers,
//!   then sync;
//! - sequential read: 1 MiB reads over the volume after reopening the pool (cold cache);
//! - random read: 4 KiB reads at random offsets from `queue_depth` concurrent readers, cold.
//!
//! The same patterns run straight on one `FileDevice` (no pool, no checksums, no mirror) as the
//! baseline, so the table shows what the engine costs on this machine's disk.
//!
//! The data is pseudo-random bytes, which no compression shrinks: the volume has the default
//! compression (lz4), and bytes that compress would measure the compressor, not the disk (until
//! 2026-11-24 the benchmark wrote constant bytes, which lz4 stores in a few bytes a block).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use serde::Serialize;
use sluice_engine::device::{BlockDevice, FileDevice, FileDeviceOptions, SharedBuf};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;

#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: &'static str,
    pub unit: &'static str,
    pub sluice: f64,
    pub raw_file: f64,
    /// Each round's (sluice, raw file) figures where the row is a median of rounds, in the
    /// order they ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds: Vec<(f64, f64)>,
    /// The warm-up rounds' (sluice, raw file) figures, run before `rounds` and not counted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warmup: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub volume_bytes: u64,
    pub queue_depth: usize,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = String::from("| workload | unit | sluice (2-way mirror) | raw file | ratio |\n|---|---|---:|---:|---:|\n");
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.2} |\n",
                row.workload,
                row.unit,
                row.sluice,
                row.raw_file,
                row.sluice / row.raw_file
            ));
        }
        let list = |rounds: &[(f64, f64)]| {
            let each: Vec<String> =
                rounds.iter().map(|(s, r)| format!("{s:.0} / {r:.0} ({:.2})", s / r)).collect();
            each.join(", ")
        };
        for row in self.rows.iter().filter(|r| !r.rounds.is_empty()) {
            out.push_str(&format!(
                "\n{}, rounds: {}; warm-up rounds (not counted): {}.\n",
                row.workload,
                list(&row.rounds),
                list(&row.warmup)
            ));
        }
        out.push_str(&format!(
            "\nVolume {} MiB, 16 KiB blocks; random I/O at queue depth {}. The raw-file column runs the \
             same pattern on one file with O_DIRECT and one fdatasync at the end of each write phase. \
             Sequential writes: median of {} rounds alternating with the raw file, after {} \
             warm-up rounds.\n",
            self.volume_bytes >> 20,
            self.queue_depth,
            SEQUENTIAL_ROUNDS,
            WARMUP_ROUNDS
        ));
        out
    }
}

const MIB: u64 = 1 << 20;
/// Alternating rounds of the sequential write, of which each side's median is reported.
const SEQUENTIAL_ROUNDS: usize = 3;
/// Rounds of the sequential write run first and not counted. A fresh process's heap grows
/// to its working set over the first two: a round allocates its blocks' new buffers before
/// the sync frees the versions they replace, and the block cache keeps the round before's
/// blocks, so only the third round runs on reused memory. The kernel clears each new page
/// (47% of the samples of a whole run, perf, 2026-11-25; docs/bench/engine.md), which
/// measures the process's start, not the engine a long-running server uses. The raw file's
/// first round also writes fallocated extents for the first time.
const WARMUP_ROUNDS: usize = 2;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn leaf(path: &Path, len: u64) -> Result<LeafSpec, Box<dyn std::error::Error>> {
    let options =
        FileDeviceOptions { create_len_bytes: Some(len), exclusive: true, ..Default::default() };
    let device = FileDevice::open(path, &options)?;
    Ok(LeafSpec { path: path.display().to_string(), device: Arc::new(device) })
}

/// Runs the benchmark in `dir` (created files are removed at the end).
pub fn run(
    dir: &Path,
    volume_bytes: u64,
    random_ops: u64,
    queue_depth: usize,
) -> Result<Report, Box<dyn std::error::Error>> {
    let runtime = sluice_host::runtime()?;
    let result = runtime.block_on(async {
        let env = sluice_host::tokio_env(0x5eed);
        let tunables = Tunables::default();
        let leaf_bytes = volume_bytes * 2 + 256 * MIB;
        let paths = [dir.join("bench-leaf-a"), dir.join("bench-leaf-b"), dir.join("bench-raw")];
        for path in &paths {
            let _ = std::fs::remove_file(path);
        }
        let specs = vec![leaf(&paths[0], leaf_bytes)?, leaf(&paths[1], leaf_bytes)?];
        let spec = PoolSpec { name: "bench".into(), ashift: 12, top: vec![TopSpec::Mirror(specs)] };
        let store = Arc::new(Store::create(Pool::create(&env, spec, &tunables).await?, &tunables));
        store.create_volume("v", volume_bytes, 16384)?;
        store.sync().await?;
        store.run_syncer();
        let raw = FileDevice::open(
            &paths[2],
            &FileDeviceOptions { create_len_bytes: Some(volume_bytes), ..Default::default() },
        )?;
        // Random bytes (see the module doc); 4 KiB writes take slices of them at varying places,
        // so no two halves of a volume block repeat each other either.
        let mut noise = Rng::new(0xa5);
        let chunk: Vec<u8> = (0..MIB / 8).flat_map(|_| noise.u64().to_le_bytes()).collect();
        let mut rows = Vec::new();

        // Sequential write: rounds alternate between the volume and the raw file, since this
        // VM's disk bandwidth swings between seconds; each side's median is reported. Later
        // rounds overwrite the volume, so they also free what the round before wrote.
        let data = SharedBuf::copy_from(&chunk);
        let (mut sluice_rounds, mut raw_rounds) = (Vec::new(), Vec::new());
        for _ in 0..WARMUP_ROUNDS + SEQUENTIAL_ROUNDS {
            let start = Instant::now();
            for at in (0..volume_bytes).step_by(MIB as usize) {
                store.write("v", at, &chunk).await?;
            }
            store.sync().await?;
            sluice_rounds.push(volume_bytes as f64 / MIB as f64 / start.elapsed().as_secs_f64());
            let start = Instant::now();
            for at in (0..volume_bytes).step_by(MIB as usize) {
                raw.write_at(at, data.clone()).await?;
            }
            raw.flush().await?;
            raw_rounds.push(volume_bytes as f64 / MIB as f64 / start.elapsed().as_secs_f64());
        }
        let mut rounds: Vec<(f64, f64)> =
            sluice_rounds.iter().copied().zip(raw_rounds.iter().copied()).collect();
        let warmup: Vec<(f64, f64)> = rounds.drain(..WARMUP_ROUNDS).collect();
        let (sluice, raw_file) =
            (median(&mut sluice_rounds[WARMUP_ROUNDS..]), median(&mut raw_rounds[WARMUP_ROUNDS..]));
        rows.push(Row {
            workload: "sequential write 1 MiB + sync",
            unit: "MiB/s",
            sluice,
            raw_file,
            rounds,
            warmup,
        });

        // Random write.
        let blocks = volume_bytes / 4096;
        let per_writer = random_ops / queue_depth as u64;
        let start = Instant::now();
        let writers = (0..queue_depth).map(|w| {
            let store = Arc::clone(&store);
            let mut rng = Rng::new(w as u64);
            let chunk = &chunk;
            async move {
                for _ in 0..per_writer {
                    let at = rng.below(blocks);
                    let data = &chunk[(at % 256) as usize * 4096..][..4096];
                    store.write("v", at * 4096, data).await?;
                }
                Ok::<(), sluice_engine::txg::StoreError>(())
            }
        });
        join_all(writers).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        store.sync().await?;
        let sluice = (per_writer * queue_depth as u64) as f64 / start.elapsed().as_secs_f64();
        let small = SharedBuf::copy_from(&chunk[..4096]);
        let start = Instant::now();
        let raw_ref = &raw;
        let writers = (0..queue_depth).map(|w| {
            let small = small.clone();
            let mut rng = Rng::new(w as u64);
            async move {
                for _ in 0..per_writer {
                    raw_ref.write_at(rng.below(blocks) * 4096, small.clone()).await?;
                }
                Ok::<(), sluice_engine::device::DeviceError>(())
            }
        });
        join_all(writers).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        raw.flush().await?;
        let raw_file = (per_writer * queue_depth as u64) as f64 / start.elapsed().as_secs_f64();
        rows.push(Row {
            workload: "random write 4 KiB + sync",
            unit: "IOPS",
            sluice,
            raw_file,
            rounds: Vec::new(),
            warmup: Vec::new(),
        });

        // Reopen for a cold cache, then read.
        let store = match Arc::try_unwrap(store) {
            Ok(store) => store,
            Err(_) => return Err("benchmark store still shared".into()),
        };
        store.export().await?;
        let specs = vec![leaf(&paths[0], leaf_bytes)?, leaf(&paths[1], leaf_bytes)?];
        let store = Arc::new(
            Store::open(Pool::import(&env, specs, "bench", &tunables).await?, &tunables).await?,
        );
        let start = Instant::now();
        for at in (0..volume_bytes).step_by(MIB as usize) {
            store.read("v", at, MIB).await?;
        }
        let sluice = volume_bytes as f64 / MIB as f64 / start.elapsed().as_secs_f64();
        let start = Instant::now();
        for at in (0..volume_bytes).step_by(MIB as usize) {
            raw.read_at(at, MIB as u32).await?;
        }
        let raw_file = volume_bytes as f64 / MIB as f64 / start.elapsed().as_secs_f64();
        rows.push(Row {
            workload: "sequential read 1 MiB",
            unit: "MiB/s",
            sluice,
            raw_file,
            rounds: Vec::new(),
            warmup: Vec::new(),
        });

        let start = Instant::now();
        let readers = (0..queue_depth).map(|r| {
            let store = Arc::clone(&store);
            let mut rng = Rng::new(1000 + r as u64);
            async move {
                for _ in 0..per_writer {
                    store.read("v", rng.below(blocks) * 4096, 4096).await?;
                }
                Ok::<(), sluice_engine::txg::StoreError>(())
            }
        });
        join_all(readers).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let sluice = (per_writer * queue_depth as u64) as f64 / start.elapsed().as_secs_f64();
        let start = Instant::now();
        let readers = (0..queue_depth).map(|r| {
            let mut rng = Rng::new(1000 + r as u64);
            async move {
                for _ in 0..per_writer {
                    raw_ref.read_at(rng.below(blocks) * 4096, 4096).await?;
                }
                Ok::<(), sluice_engine::device::DeviceError>(())
            }
        });
        join_all(readers).await.into_iter().collect::<Result<Vec<_>, _>>()?;
        let raw_file = (per_writer * queue_depth as u64) as f64 / start.elapsed().as_secs_f64();
        rows.push(Row {
            workload: "random read 4 KiB",
            unit: "IOPS",
            sluice,
            raw_file,
            rounds: Vec::new(),
            warmup: Vec::new(),
        });
        drop(store);
        drop(raw);
        for path in &paths {
            let _ = std::fs::remove_file(path);
        }
        Ok::<Report, Box<dyn std::error::Error>>(Report { volume_bytes, queue_depth, rows })
    });
    result
}
