//! Seed 001: the dedup table's per-entry I/O lock, in real time.
//!
//! The seed (OpenZFS PR #17960): on a 64-thread machine writing 4 KiB blocks into a dedup
//! dataset, the DDT lock was taken four times per written block, from two threads; a per-entry
//! lock for the write's ready and done stages left two acquisitions from one thread, took CPU
//! use from 100% to about 80% and write throughput up by 10%.
//!
//! Ours: a pool on a 2-way mirror of in-memory simulated leaves that answer at once (the
//! fastest leaves there are, so the table's own cost shows), one volume with 4 KiB blocks and
//! `dedup=on`, and `writers` tasks writing blocks of unique contents as fast as the txg
//! throttle lets them (`txg.dirty_max` 64M, so txgs stay short), on a tokio runtime with
//! `threads` workers. The syncer writes each txg's blocks through the table, one task per block
//! spread over the workers. Measured is a window of `seconds` in steady state, after a warm-up
//! of a third of it (0.5 to 2 s): blocks written through the table per second, the process's
//! user and system CPU time per block, and table-lock acquisitions per block. Both locking modes run `repeats` times,
//! alternating, and the table gives the median of each figure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_format::DedupMode;

use crate::tunables_with;

const BLOCK: usize = 4096;
const LEAF_BYTES: u64 = 64 << 30;
const VOLUME_BYTES: u64 = 32 << 30;

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub locking: &'static str,
    pub blocks: u64,
    pub seconds: f64,
    pub blocks_per_sec: f64,
    pub cpu_us_per_block: f64,
    /// Share of the machine's cores busy with this process.
    pub cpu_pct: f64,
    pub acquisitions_per_block: f64,
    pub contended_per_block: f64,
    pub wait_ns_per_block: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub writers: usize,
    pub threads: usize,
    pub cores: usize,
    pub seconds: f64,
    pub runs: Vec<Run>,
    /// Medians: global, entry.
    pub global: Run,
    pub entry: Run,
}

fn median(runs: &[&Run], field: impl Fn(&Run) -> f64) -> f64 {
    let mut values: Vec<f64> = runs.iter().map(|r| field(r)).collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn summarize(runs: &[Run], locking: &'static str) -> Run {
    let mine: Vec<&Run> = runs.iter().filter(|r| r.locking == locking).collect();
    Run {
        locking,
        blocks: median(&mine, |r| r.blocks as f64) as u64,
        seconds: median(&mine, |r| r.seconds),
        blocks_per_sec: median(&mine, |r| r.blocks_per_sec),
        cpu_us_per_block: median(&mine, |r| r.cpu_us_per_block),
        cpu_pct: median(&mine, |r| r.cpu_pct),
        acquisitions_per_block: median(&mine, |r| r.acquisitions_per_block),
        contended_per_block: median(&mine, |r| r.contended_per_block),
        wait_ns_per_block: median(&mine, |r| r.wait_ns_per_block),
    }
}

/// Process CPU time (user + system).
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn one_run(
    locking: &'static str,
    seconds: f64,
    writers: usize,
    threads: usize,
    seed: u64,
    base: &[(String, String)],
) -> Result<Run, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .thread_name("sluice_rt")
        .build()?;
    // A small dirty limit keeps txgs short, so the measured window spans many syncs.
    let tunables: Tunables =
        tunables_with(base, &[("txg.dirty_max", "64M"), ("dedup.locking", locking)])?;
    runtime.block_on(async move {
        let env = sluice_host::tokio_env(seed);
        let leaves: Vec<LeafSpec> = (0..2)
            .map(|i| {
                let device = SimDevice::new(
                    &env,
                    &format!("mem{i}"),
                    SimProfile::Instant,
                    LEAF_BYTES,
                    SimOptions { store_data: true, record_log: false },
                );
                LeafSpec { path: format!("mem{i}"), device: Arc::new(device) }
            })
            .collect();
        let spec =
            PoolSpec { name: "ddtbench".into(), ashift: 12, top: vec![TopSpec::Mirror(leaves)] };
        let pool = Pool::create(&env, spec, &tunables).await?;
        let store = Arc::new(Store::create(pool, &tunables));
        store.create_volume("v", VOLUME_BYTES, BLOCK as u32)?;
        store.set_dedup("v", DedupMode::On)?;
        store.sync().await?;
        store.run_syncer();
        let stop = Arc::new(AtomicBool::new(false));
        let region = VOLUME_BYTES / writers as u64 / BLOCK as u64;
        let mut tasks = Vec::new();
        for w in 0..writers {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            let mut rng = Rng::new(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            tasks.push(tokio::spawn(async move {
                let mut block: Vec<u8> = (0..BLOCK).map(|_| rng.u64() as u8).collect();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Unique contents: the writer and its sequence number in the first bytes.
                    block[..8].copy_from_slice(&(w as u64).to_le_bytes());
                    block[8..16].copy_from_slice(&n.to_le_bytes());
                    let at = (w as u64 * region + n % region) * BLOCK as u64;
                    store.write("v", at, &block).await?;
                    n += 1;
                }
                Ok::<_, sluice_engine::txg::StoreError>(())
            }));
        }
        // Measured: a window in steady state, after the first syncs (warm-up) and before the
        // writers stop (the last sync's tail is not a rate).
        let stats = store.dedup_table().stats();
        let snapshot = || {
            (
                stats.blocks_written.get() + stats.blocks_shared.get(),
                stats.write_acquisitions(),
                stats.table_lock_contended.get(),
                stats.table_lock_wait_nanos.get(),
                cpu_time(),
                Instant::now(),
            )
        };
        tokio::time::sleep(Duration::from_secs_f64((seconds / 3.0).clamp(0.5, 2.0))).await;
        let before = snapshot();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        let after = snapshot();
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await??;
        }
        store.sync().await?;
        assert_eq!(
            stats.blocks_shared.get(),
            0,
            "every block of this benchmark is unique, so none may be shared"
        );
        let blocks = after.0 - before.0;
        let elapsed = (after.5 - before.5).as_secs_f64();
        let cpu = (after.4 - before.4).as_secs_f64();
        let per_block = |n: u64| n as f64 / blocks.max(1) as f64;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Run {
            locking,
            blocks,
            seconds: elapsed,
            blocks_per_sec: blocks as f64 / elapsed,
            cpu_us_per_block: cpu * 1e6 / blocks.max(1) as f64,
            cpu_pct: 100.0 * cpu / elapsed / cores as f64,
            acquisitions_per_block: per_block(after.1 - before.1),
            contended_per_block: per_block(after.2 - before.2),
            wait_ns_per_block: per_block(after.3 - before.3),
        })
    })
}

/// Runs both locking modes `repeats` times each, alternating.
pub fn run(
    seconds: f64,
    seed: u64,
    writers: usize,
    threads: usize,
    repeats: usize,
    base: &[(String, String)],
) -> Result<Report, Box<dyn std::error::Error>> {
    let mut runs = Vec::new();
    for repeat in 0..repeats.max(1) {
        for locking in ["global", "entry"] {
            runs.push(one_run(locking, seconds, writers, threads, seed + repeat as u64, base)?);
        }
    }
    Ok(Report {
        writers,
        threads,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        seconds,
        global: summarize(&runs, "global"),
        entry: summarize(&runs, "entry"),
        runs,
    })
}

impl Report {
    pub fn markdown(&self) -> String {
        let (g, e) = (&self.global, &self.entry);
        let gain = crate::gain_pct(g.blocks_per_sec, e.blocks_per_sec);
        let mut out = String::from(
            "| dedup.locking | blocks/s | MB/s | CPU us/block | CPU % | table-lock acquisitions/block | contended/block | wait ns/block |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in [g, e] {
            out.push_str(&format!(
                "| {} | {:.0} | {:.1} | {:.2} | {:.0} | {:.2} | {:.3} | {:.0} |\n",
                r.locking,
                r.blocks_per_sec,
                r.blocks_per_sec * BLOCK as f64 / 1e6,
                r.cpu_us_per_block,
                r.cpu_pct,
                r.acquisitions_per_block,
                r.contended_per_block,
                r.wait_ns_per_block
            ));
        }
        out.push_str(&format!(
            "\n| | seed 001 (64 threads) | ours ({} cores, {} runtime threads, {} writers) |\n|---|---|---|\n\
             | table-lock acquisitions per written block | 4 -> 2 | {:.2} -> {:.2} |\n\
             | write throughput | +10% | {:+.1}% |\n\
             | CPU | 100% -> ~80% busy | {:.0}% -> {:.0}% busy; {:.2} -> {:.2} us per block ({:+.1}%) |\n",
            self.cores,
            self.threads,
            self.writers,
            g.acquisitions_per_block,
            e.acquisitions_per_block,
            gain,
            g.cpu_pct,
            e.cpu_pct,
            g.cpu_us_per_block,
            e.cpu_us_per_block,
            crate::gain_pct(g.cpu_us_per_block, e.cpu_us_per_block),
        ));
        for locking in ["global", "entry"] {
            let each: Vec<String> = self
                .runs
                .iter()
                .filter(|r| r.locking == locking)
                .map(|r| format!("{:.0}", r.blocks_per_sec))
                .collect();
            out.push_str(&format!("\nEach {locking} run, blocks/s: {}.", each.join(", ")));
        }
        out.push('\n');
        out.push_str(&format!(
            "\nMedians of {} runs per mode ({} s measured each, in steady state), alternating.\n",
            self.runs.len() / 2,
            self.seconds
        ));
        out
    }
}
