//! Seed 004: the intent log's pipelined commits against the old batches.
//!
//! The seed's experiment: fio threads doing synchronous 4 KiB-class writes to one dataset,
//! (a) each as fast as it can (IOPS) and (b) each at 64 writes per second (latency), on pools of
//! HDDs and of SSDs, with 1 to 1024 threads; batch ("before") against pipelined ("after").
//! Published averages on 8 disks: +83% IOPS (HDD), +48% (SSD); -27% and -16% latency.
//!
//! Each point also runs `auto` (the policy that groups records per device) and says whether
//! it came within 5% of the better fixed policy in IOPS and in latency (or 20 us).
//!
//! Ours: pools of 1, 2, 4 and 8 simulated disks striped (default `HddParams` / `SsdParams`),
//! one volume's log ([`sluice_engine::intent_log::LogWriter`], blocks sized by the workload up
//! to 128 KiB, `intent_log.commit_timeout_pct=10`) shared by all writers, each writer
//! appending a 4 KiB write record and committing it. This measures the commit path alone;
//! `bench seeds zvol` runs the whole stack. Consecutive log blocks rotate over the disks, as
//! any pool without a separate log device spreads them. Virtual time: the figures repeat
//! exactly for a seed.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use parking_lot::Mutex;
use serde::Serialize;
use sluice_engine::alloc::Allocator;
use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::intent_log::{ChainOwner, CommitPolicy, LogSettings, LogWriter};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Time;
use sluice_engine::tunables::Tunables;
use sluice_format::LogRecord;
use sluice_sim::Sim;

use crate::gain_pct;

const DISK_BYTES: u64 = 64 << 30;
const LOG_BLOCK_BYTES: u32 = 128 << 10;
const RECORD_BYTES: usize = 4096;
/// Writes per second per writer in the latency workload.
const PACED_RATE: f64 = 64.0;

#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub writers: usize,
    pub batch_iops: f64,
    pub pipelined_iops: f64,
    pub iops_change_pct: f64,
    pub batch_latency_us: f64,
    pub pipelined_latency_us: f64,
    pub latency_change_pct: f64,
    /// The default policy, which chooses from what it measures.
    pub auto_iops: f64,
    pub auto_latency_us: f64,
    /// Whether `auto` is within 5% of the better fixed policy in IOPS, and within 5% (or
    /// 20 us) of the better one in latency.
    pub auto_ok: bool,
}

/// How close `auto` must come to the better fixed policy.
pub const AUTO_SLACK: f64 = 0.05;
/// ... or, for latency, this close in microseconds.
pub const AUTO_SLACK_US: f64 = 20.0;

/// Whether `auto`'s figures are within the slack of the better of batch and pipelined.
pub fn auto_within(p: &Point) -> bool {
    let best_iops = p.batch_iops.max(p.pipelined_iops);
    let best_latency = p.batch_latency_us.min(p.pipelined_latency_us);
    p.auto_iops >= best_iops * (1.0 - AUTO_SLACK)
        && p.auto_latency_us
            <= (best_latency * (1.0 + AUTO_SLACK)).max(best_latency + AUTO_SLACK_US)
}

#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub media: &'static str,
    pub disks: usize,
    pub points: Vec<Point>,
    /// Pipelined against batch (the seed's after against its before).
    pub average_iops_change_pct: f64,
    pub average_latency_change_pct: f64,
    /// Auto (the default) against batch.
    pub average_auto_iops_change_pct: f64,
    pub average_auto_latency_change_pct: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seconds_per_point: f64,
    pub seed: u64,
    pub series: Vec<Series>,
}

/// Writer counts of the experiment.
pub fn writer_counts(max: usize) -> Vec<usize> {
    (0..=10).map(|p| 1usize << p).filter(|&w| w <= max).collect()
}

pub fn run(seconds: f64, seed: u64, disks: &[usize], max_writers: usize) -> Report {
    let mut series = Vec::new();
    for media in ["hdd", "ssd"] {
        for &n in disks {
            let points: Vec<Point> = writer_counts(max_writers)
                .into_iter()
                .map(|writers| {
                    let (batch_iops, _) =
                        run_point(media, n, writers, CommitPolicy::Batch, false, seconds, seed);
                    let (pipelined_iops, _) =
                        run_point(media, n, writers, CommitPolicy::Pipelined, false, seconds, seed);
                    let (_, batch_latency) =
                        run_point(media, n, writers, CommitPolicy::Batch, true, seconds, seed);
                    let (_, pipelined_latency) =
                        run_point(media, n, writers, CommitPolicy::Pipelined, true, seconds, seed);
                    let (auto_iops, _) =
                        run_point(media, n, writers, CommitPolicy::Auto, false, seconds, seed);
                    let (_, auto_latency) =
                        run_point(media, n, writers, CommitPolicy::Auto, true, seconds, seed);
                    let mut point = Point {
                        writers,
                        batch_iops,
                        pipelined_iops,
                        iops_change_pct: gain_pct(batch_iops, pipelined_iops),
                        batch_latency_us: batch_latency,
                        pipelined_latency_us: pipelined_latency,
                        latency_change_pct: gain_pct(batch_latency, pipelined_latency),
                        auto_iops,
                        auto_latency_us: auto_latency,
                        auto_ok: false,
                    };
                    point.auto_ok = auto_within(&point);
                    point
                })
                .collect();
            let count = points.len().max(1) as f64;
            series.push(Series {
                media,
                disks: n,
                average_iops_change_pct: points.iter().map(|p| p.iops_change_pct).sum::<f64>()
                    / count,
                average_latency_change_pct: points
                    .iter()
                    .map(|p| p.latency_change_pct)
                    .sum::<f64>()
                    / count,
                average_auto_iops_change_pct: points
                    .iter()
                    .map(|p| gain_pct(p.batch_iops, p.auto_iops))
                    .sum::<f64>()
                    / count,
                average_auto_latency_change_pct: points
                    .iter()
                    .map(|p| gain_pct(p.batch_latency_us, p.auto_latency_us))
                    .sum::<f64>()
                    / count,
                points,
            });
        }
    }
    Report { seconds_per_point: seconds, seed, series }
}

/// Returns (commits per second, mean commit latency in microseconds).
fn run_point(
    media: &str,
    disks: usize,
    writers: usize,
    policy: CommitPolicy,
    paced: bool,
    seconds: f64,
    seed: u64,
) -> (f64, f64) {
    let sim = Sim::new(seed);
    let env = sim.env();
    let profile = if media == "hdd" { SimProfile::hdd() } else { SimProfile::ssd() };
    let leaves: Vec<TopSpec> = (0..disks)
        .map(|i| {
            let device = SimDevice::new(
                &env,
                &format!("{media}{i}"),
                profile.clone(),
                DISK_BYTES,
                SimOptions { store_data: false, record_log: false },
            );
            TopSpec::Leaf(LeafSpec { path: format!("{media}{i}"), device: Arc::new(device) })
        })
        .collect();
    let end = Time::ZERO.plus(Duration::from_secs_f64(seconds));
    let totals = Rc::new(RefCell::new((0u64, 0u128)));
    let t = Rc::clone(&totals);
    let result = sim.run(async move {
        let tunables = Tunables::default();
        let pool = Arc::new(
            Pool::create(&env, PoolSpec { name: "zil".into(), ashift: 12, top: leaves }, &tunables)
                .await
                .unwrap_or_else(|e| panic!("zil bench pool: {e}")),
        );
        let allocator = Arc::new(Mutex::new(Allocator::new(pool.ashift(), &pool.data_areas())));
        let log = Arc::new(
            LogWriter::new(
                "sim",
                &allocator,
                LogSettings { policy, commit_timeout_pct: 10, max_block_bytes: LOG_BLOCK_BYTES },
                ChainOwner { chain_id: seed, volume_id: 1, key_family: 0 },
            )
            .unwrap_or_else(|e| panic!("zil bench log: {e}")),
        );
        let start = env.now();
        let tasks = (0..writers).map(|w| {
            let (pool, allocator, log, env, t) = (
                Arc::clone(&pool),
                Arc::clone(&allocator),
                Arc::clone(&log),
                env.clone(),
                Rc::clone(&t),
            );
            async move {
                let period = Duration::from_secs_f64(1.0 / PACED_RATE);
                // Paced writers start spread over one period, as independent clients would.
                let mut next = start.plus(period.mul_f64(w as f64 / writers as f64));
                let mut i = 0u64;
                while env.now() < end {
                    if paced {
                        env.sleep_until(next).await;
                        next = next.plus(period);
                    }
                    let issued = env.now();
                    let offset = ((w as u64) << 24) + (i % 4096) * 4096;
                    i += 1;
                    let sequence = log.append(env.now(), |sequence| LogRecord::Write {
                        txg: 1,
                        sequence,
                        offset,
                        data: vec![0x5a; RECORD_BYTES],
                    });
                    if log.commit(&pool, &allocator, sequence).await.is_err() || env.now() > end {
                        break;
                    }
                    let mut totals = t.borrow_mut();
                    totals.0 += 1;
                    totals.1 += env.now().since(issued).as_nanos();
                }
            }
        });
        join_all(tasks).await;
    });
    if let Err(error) = result {
        panic!("zil bench {media} x{disks} {writers} writers {policy:?}: {error}");
    }
    let (ops, nanos) = *totals.borrow();
    (ops as f64 / seconds, if ops == 0 { 0.0 } else { nanos as f64 / ops as f64 / 1000.0 })
}

impl Report {
    /// The points where `auto` is not within the slack of the better fixed policy, named
    /// ("HDD x 4, 128 writers").
    pub fn misses(&self) -> Vec<String> {
        let mut misses = Vec::new();
        for s in &self.series {
            for p in s.points.iter().filter(|p| !p.auto_ok) {
                let pool = s.media.to_uppercase();
                misses.push(format!("{pool} x {}, {} writers", s.disks, p.writers));
            }
        }
        misses
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for s in &self.series {
            out.push_str(&format!("\n### {} x {}\n\n", s.media.to_uppercase(), s.disks));
            out.push_str("| writers | batch IOPS | pipelined IOPS | change | auto IOPS | auto vs better | batch latency us | pipelined latency us | change | auto latency us | auto vs better |\n");
            out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            for p in &s.points {
                let best_iops = p.batch_iops.max(p.pipelined_iops);
                let best_latency = p.batch_latency_us.min(p.pipelined_latency_us);
                out.push_str(&format!(
                    "| {} | {:.0} | {:.0} | {:+.0}% | {:.0} | {:+.0}% | {:.0} | {:.0} | {:+.0}% | {:.0} | {:+.0}%{} |\n",
                    p.writers,
                    p.batch_iops,
                    p.pipelined_iops,
                    p.iops_change_pct,
                    p.auto_iops,
                    gain_pct(best_iops, p.auto_iops),
                    p.batch_latency_us,
                    p.pipelined_latency_us,
                    p.latency_change_pct,
                    p.auto_latency_us,
                    gain_pct(best_latency, p.auto_latency_us),
                    if p.auto_ok { "" } else { " (miss)" }
                ));
            }
        }
        out.push_str(
            "\nAverage changes against batch (the seed's before) over the writer counts:\n",
        );
        out.push_str("\n| pool | pipelined IOPS | auto IOPS | seed 004 IOPS | pipelined latency | auto latency | seed 004 latency | auto within 5% of the better |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
        for s in &self.series {
            let (seed_iops, seed_latency) = match (s.media, s.disks) {
                ("hdd", 8) => ("+83%", "-27%"),
                ("ssd", 8) => ("+48%", "-16%"),
                _ => ("", ""),
            };
            let within = s.points.iter().filter(|p| p.auto_ok).count();
            out.push_str(&format!(
                "| {} x {} | {:+.0}% | {:+.0}% | {} | {:+.0}% | {:+.0}% | {} | {} of {} |\n",
                s.media.to_uppercase(),
                s.disks,
                s.average_iops_change_pct,
                s.average_auto_iops_change_pct,
                seed_iops,
                s.average_latency_change_pct,
                s.average_auto_latency_change_pct,
                seed_latency,
                within,
                s.points.len()
            ));
        }
        out.push_str(&format!(
            "\nVirtual time: {} s per point, simulator seed {}.\n",
            self.seconds_per_point, self.seed
        ));
        out
    }
}
