//! Seed 000: volume request dispatch, capped threads against unbounded requests.
//!
//! The seed: zvol requests were served by `zvol_threads` worker threads (one per CPU, 1 to 8).
//! A synchronous write holds its thread while it waits in `zil_commit`, so at most that many
//! writes can gather in one log commit; raising the threads from 8 to 32 gave +50% sequential
//! synchronous write throughput for VM images.
//!
//! Ours: the whole stack, in virtual time. A pool of one 2-way mirror of simulated disks (SSD
//! and HDD profiles), one volume whose block size is the write size (the seed's zvols had 8 KiB
//! blocks; matching sizes keep read-modify-write out of the measurement, and lets the
//! simulated disks keep no data), the txg syncer running, and
//! 64 writers each writing its own region sequentially with FUA (every write durable when it
//! returns), 4 KiB or 8 KiB at a time. `volume.request_threads` is 8, 32 or 0 (unbounded, the
//! default), shared by all writers as a zvol's threads were.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde::Serialize;
use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::txg::Store;
use sluice_engine::volume::Volume;
use sluice_sim::Sim;

use crate::{gain_pct, tunables_with, Settings};

const DISK_BYTES: u64 = 64 << 30;
const WRITERS: u64 = 64;
/// Each writer's region of the volume.
const REGION_BYTES: u64 = 256 << 20;

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub media: &'static str,
    pub write_bytes: usize,
    /// 0: unbounded.
    pub request_threads: u64,
    pub iops: f64,
    pub mb_per_s: f64,
    pub mean_latency_us: f64,
    /// Mean records per log block written.
    pub records_per_log_block: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seconds: f64,
    pub seed: u64,
    pub points: Vec<Point>,
}

/// Request thread settings of the experiment (0: unbounded).
pub const THREADS: [u64; 3] = [8, 32, 0];

/// Runs the experiment on the pools named in `media` ("ssd", "hdd").
pub fn run(
    seconds: f64,
    seed: u64,
    media: &[String],
    base: &Settings,
) -> Result<Report, sluice_engine::tunables::TunableError> {
    let mut points = Vec::new();
    for name in ["ssd", "hdd"] {
        if !media.iter().any(|m| m == name) {
            continue;
        }
        let media = name;
        for write_bytes in [4096usize, 8192] {
            for threads in THREADS {
                points.push(run_point(media, write_bytes, threads, seconds, seed, base)?);
            }
        }
    }
    Ok(Report { seconds, seed, points })
}

fn run_point(
    media: &'static str,
    write_bytes: usize,
    threads: u64,
    seconds: f64,
    seed: u64,
    base: &Settings,
) -> Result<Point, sluice_engine::tunables::TunableError> {
    let threads_text = threads.to_string();
    let tunables = tunables_with(base, &[("volume.request_threads", &threads_text)])?;
    let sim = Sim::new(seed);
    let env = sim.env();
    let profile = if media == "hdd" { SimProfile::hdd() } else { SimProfile::ssd() };
    let mut devices = Vec::new();
    let legs: Vec<LeafSpec> = (0..2)
        .map(|i| {
            let device = SimDevice::new(
                &env,
                &format!("{media}{i}"),
                profile.clone(),
                DISK_BYTES,
                // Data is kept: a txg sync reads back indirect blocks it did not cache.
                SimOptions { store_data: true, record_log: false },
            );
            devices.push(device.clone());
            LeafSpec { path: format!("{media}{i}"), device: Arc::new(device) }
        })
        .collect();
    let totals = Rc::new(RefCell::new((0u64, 0u128, 0u64)));
    let t = Rc::clone(&totals);
    let result = sim.run(async move {
        let spec = PoolSpec { name: "zvol".into(), ashift: 12, top: vec![TopSpec::Mirror(legs)] };
        let pool = Pool::create(&env, spec, &tunables)
            .await
            .unwrap_or_else(|e| panic!("zvol bench pool: {e}"));
        let store = Arc::new(Store::create(pool, &tunables));
        store
            .create_volume("vm", WRITERS * REGION_BYTES, write_bytes as u32)
            .unwrap_or_else(|e| panic!("zvol bench volume: {e}"));
        // Anchor the volume's log, as a volume that exists before its client connects.
        store.sync().await.unwrap_or_else(|e| panic!("zvol bench sync: {e}"));
        store.run_syncer();
        let volume = Volume::open(&store, "vm").unwrap_or_else(|e| panic!("zvol bench: {e}"));
        let start = env.now();
        let end = start.plus(Duration::from_secs_f64(seconds));
        let data = vec![0x5au8; write_bytes];
        let tasks = (0..WRITERS).map(|w| {
            let (volume, env, t, data) = (volume.clone(), env.clone(), Rc::clone(&t), data.clone());
            async move {
                let mut offset = w * REGION_BYTES;
                while env.now() < end {
                    let issued = env.now();
                    if let Err(error) = volume.write(offset, &data, true).await {
                        eprintln!("zvol bench writer {w}: {error}");
                        break;
                    }
                    offset += data.len() as u64;
                    if offset + data.len() as u64 > (w + 1) * REGION_BYTES {
                        offset = w * REGION_BYTES;
                    }
                    if env.now() > end {
                        break;
                    }
                    let mut totals = t.borrow_mut();
                    totals.0 += 1;
                    totals.1 += env.now().since(issued).as_nanos();
                }
            }
        });
        join_all(tasks).await;
        t.borrow_mut().2 = store.log_blocks_written();
        if std::env::var_os("SLUICE_BENCH_DEBUG").is_some() {
            let stats = store.log_stats();
            eprintln!(
                "zvol {media} {write_bytes} B threads {threads}: commits {} via txg {} syncs {}",
                stats.commits.get(),
                stats.commits_via_txg.get(),
                store.syncs()
            );
            for d in &devices {
                let s = d.stats();
                eprintln!(
                    "  {}: writes {} MB {} flushes {} stored MB {} volatile {}",
                    d.name(),
                    s.writes,
                    s.write_bytes >> 20,
                    s.flushes,
                    d.durable_image().stored_bytes() >> 20,
                    d.volatile_writes()
                );
            }
        }
    });
    if let Err(error) = result {
        panic!("zvol bench {media} {write_bytes} B threads {threads}: {error}");
    }
    let (ops, nanos, blocks) = *totals.borrow();
    Ok(Point {
        media,
        write_bytes,
        request_threads: threads,
        iops: ops as f64 / seconds,
        mb_per_s: ops as f64 * write_bytes as f64 / seconds / 1e6,
        mean_latency_us: if ops == 0 { 0.0 } else { nanos as f64 / ops as f64 / 1000.0 },
        records_per_log_block: if blocks == 0 { 0.0 } else { ops as f64 / blocks as f64 },
    })
}

impl Report {
    fn find(&self, media: &str, write_bytes: usize, threads: u64) -> Option<&Point> {
        self.points.iter().find(|p| {
            p.media == media && p.write_bytes == write_bytes && p.request_threads == threads
        })
    }

    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| pool | write | request_threads | IOPS | MB/s | mean latency us | writes per log block |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        for p in &self.points {
            let threads = if p.request_threads == 0 {
                String::from("unbounded")
            } else {
                p.request_threads.to_string()
            };
            out.push_str(&format!(
                "| {} mirror | {} KiB | {} | {:.0} | {:.1} | {:.0} | {:.1} |\n",
                p.media.to_uppercase(),
                p.write_bytes / 1024,
                threads,
                p.iops,
                p.mb_per_s,
                p.mean_latency_us,
                p.records_per_log_block
            ));
        }
        out.push_str(
            "\n| pool | write | 32 vs 8 threads | seed 000 | unbounded vs 8 | goal | unbounded vs 32 | goal |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for media in ["ssd", "hdd"] {
            for write_bytes in [4096usize, 8192] {
                let (Some(eight), Some(thirty_two), Some(unbounded)) = (
                    self.find(media, write_bytes, 8),
                    self.find(media, write_bytes, 32),
                    self.find(media, write_bytes, 0),
                ) else {
                    continue;
                };
                out.push_str(&format!(
                    "| {} mirror | {} KiB | {:+.0}% | +50% | {:.2}x | >= 1.5x | {:.2}x | >= 1x |\n",
                    media.to_uppercase(),
                    write_bytes / 1024,
                    gain_pct(eight.iops, thirty_two.iops),
                    unbounded.iops / eight.iops.max(1e-9),
                    unbounded.iops / thirty_two.iops.max(1e-9),
                ));
            }
        }
        out.push_str(&format!(
            "\nVirtual time: {:.0} s per point, simulator seed {}.\n",
            self.seconds, self.seed
        ));
        out
    }
}
