//! Seed 003: device queue depth and submission queues against a small synchronous writer.
//!
//! The seed's experiment (its small Azure disk): two sequential readers of 32 KiB blocks with 22
//! requests each in flight, together with one sequential writer of 8 KiB blocks at queue depth
//! 1, on a disk provisioned for 170 MB/s with about 2 ms per operation. With one hardware queue
//! per CPU (32) of depth 11, the device held every read and the writer got 56 IOPS; with one
//! queue it got 346 IOPS, and reads went from 123 to 165 MB/s.
//!
//! Ours: the same jobs on one leaf over `SsdParams::cloud_disk()`, in virtual time, under
//! (a) `deep`: `vdev.queues=32`, `vdev.max_active=11`, reads allowed the whole depth, and
//! (b) `shallow`: `vdev.queues=1`, `vdev.max_active=13`, sync reads capped at 12, so the device
//! holds just enough reads to keep its 170 MB/s busy and the writer always finds a free slot.
//! Each setting runs reads alone, the writer alone, and both together. Two more rows show ZFS's
//! fixed depths (sync reads at most 10, 128 KiB merging) and sluice's defaults
//! (`vdev.max_active=auto`: the depth is measured, nothing is set by hand).
//! With `SLUICE_BENCH_DEBUG` set, each run prints the leaf's queue depth every half second.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde::Serialize;
use sluice_engine::device::sim::SsdParams;
use sluice_engine::device::{SharedBuf, SimProfile};
use sluice_engine::rt::Time;
use sluice_engine::tunables::{IoClass, TunableError, Tunables};
use sluice_sim::Sim;

use super::sim_leaf;
use crate::{tunables_with, Settings};

const DISK_BYTES: u64 = 16 << 30;
const READ_BYTES: u64 = 32 << 10;
const WRITE_BYTES: usize = 8 << 10;
const READERS: u64 = 2;
const READER_DEPTH: u64 = 22;

/// A named queue setting.
#[derive(Clone, Debug, Serialize)]
pub struct Setting {
    pub name: &'static str,
    pub tunables: Vec<(&'static str, &'static str)>,
}

pub fn settings() -> Vec<Setting> {
    vec![
        Setting {
            name: "deep (32 queues x 11)",
            tunables: vec![
                ("vdev.queues", "32"),
                ("vdev.max_active", "11"),
                ("vdev.sync_read_max_active", "11"),
            ],
        },
        Setting {
            name: "ZFS depths (1 queue, max_active=1000, reads <= 10, 128K merges)",
            tunables: vec![
                ("vdev.max_active", "1000"),
                ("vdev.aggregation_limit_non_rotating", "128K"),
            ],
        },
        Setting { name: "defaults (1 queue, max_active=auto)", tunables: vec![] },
        Setting {
            name: "shallow (1 queue x 13, reads <= 12)",
            tunables: vec![
                ("vdev.queues", "1"),
                ("vdev.max_active", "13"),
                ("vdev.sync_read_max_active", "12"),
            ],
        },
    ]
}

/// Figures of one setting.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub setting: String,
    pub read_alone_mb_s: f64,
    pub write_alone_iops: f64,
    pub read_with_writer_mb_s: f64,
    pub write_with_readers_iops: f64,
    /// Writer IOPS under load over writer IOPS alone.
    pub write_ratio: f64,
    /// Read bandwidth with the writer over the best read-alone bandwidth of all settings.
    pub read_ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seconds_per_point: f64,
    pub seed: u64,
    pub rows: Vec<Row>,
    pub seed_write_iops: (f64, f64),
    pub seed_read_mb_s: (f64, f64),
}

pub fn run(seconds: f64, seed: u64, base: &Settings) -> Result<Report, TunableError> {
    let mut rows: Vec<Row> = settings()
        .into_iter()
        .map(|setting| {
            let tunables = tunables_with(base, &setting.tunables)?;
            let (read_alone, _) = run_point(&tunables, true, false, seconds, seed);
            let (_, write_alone) = run_point(&tunables, false, true, seconds, seed);
            let (read_both, write_both) = run_point(&tunables, true, true, seconds, seed);
            Ok(Row {
                setting: setting.name.to_owned(),
                read_alone_mb_s: read_alone,
                write_alone_iops: write_alone,
                read_with_writer_mb_s: read_both,
                write_with_readers_iops: write_both,
                write_ratio: write_both / write_alone,
                read_ratio: 0.0,
            })
        })
        .collect::<Result<_, TunableError>>()?;
    let best_read = rows.iter().map(|r| r.read_alone_mb_s).fold(0.0, f64::max);
    for row in &mut rows {
        row.read_ratio = row.read_with_writer_mb_s / best_read;
    }
    Ok(Report {
        seconds_per_point: seconds,
        seed,
        rows,
        seed_write_iops: (56.0, 346.0),
        seed_read_mb_s: (123.0, 165.0),
    })
}

/// Returns (read MB/s, write IOPS) of one run.
fn run_point(
    tunables: &Tunables,
    readers: bool,
    writer: bool,
    seconds: f64,
    seed: u64,
) -> (f64, f64) {
    let sim = Sim::new(seed);
    let env = sim.env();
    let (leaf, _device) =
        sim_leaf(&env, 0, SimProfile::Ssd(SsdParams::cloud_disk()), DISK_BYTES, tunables);
    let end = Time::ZERO.plus(Duration::from_secs_f64(seconds));
    let counts = Rc::new(RefCell::new((0u64, 0u64)));
    let mut jobs: Vec<futures::future::LocalBoxFuture<'static, ()>> = Vec::new();
    if readers {
        for reader in 0..READERS {
            // Each reader streams through its own half of the disk with READER_DEPTH in flight.
            let next = Arc::new(AtomicU64::new(0));
            for _ in 0..READER_DEPTH {
                let (leaf, env, next, counts) =
                    (Arc::clone(&leaf), env.clone(), Arc::clone(&next), Rc::clone(&counts));
                jobs.push(Box::pin(async move {
                    let half = DISK_BYTES / READERS;
                    while env.now() < end {
                        let offset =
                            reader * half + next.fetch_add(READ_BYTES, Ordering::Relaxed) % half;
                        if leaf.read(offset, READ_BYTES as u32, IoClass::SyncRead).await.is_err()
                            || env.now() > end
                        {
                            break;
                        }
                        counts.borrow_mut().0 += READ_BYTES;
                    }
                }));
            }
        }
    }
    if std::env::var_os("SLUICE_BENCH_DEBUG").is_some() {
        let (leaf, env) = (Arc::clone(&leaf), env.clone());
        jobs.push(Box::pin(async move {
            let mut trace = Vec::new();
            while env.now() < end {
                env.sleep(Duration::from_millis(500)).await;
                trace.push(leaf.queue_depth());
            }
            eprintln!("queue depth every 0.5 s: {trace:?}");
        }));
    }
    if writer {
        let (leaf, env, counts) = (Arc::clone(&leaf), env.clone(), Rc::clone(&counts));
        jobs.push(Box::pin(async move {
            let data = SharedBuf::copy_from(&[0x5a; WRITE_BYTES]);
            let mut offset = 0u64;
            while env.now() < end {
                if leaf.write(offset, data.clone(), IoClass::SyncWrite).await.is_err()
                    || env.now() > end
                {
                    break;
                }
                offset = (offset + WRITE_BYTES as u64) % DISK_BYTES;
                counts.borrow_mut().1 += 1;
            }
        }));
    }
    if let Err(e) = sim.run(async move {
        join_all(jobs).await;
    }) {
        panic!("queue bench: {e}");
    }
    let (bytes, writes) = *counts.borrow();
    (bytes as f64 / 1e6 / seconds, writes as f64 / seconds)
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        out.push_str("| setting | read alone MB/s | write alone IOPS | read with writer MB/s | write with readers IOPS | write kept | read kept |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0}% | {:.0}% |\n",
                r.setting,
                r.read_alone_mb_s,
                r.write_alone_iops,
                r.read_with_writer_mb_s,
                r.write_with_readers_iops,
                r.write_ratio * 100.0,
                r.read_ratio * 100.0
            ));
        }
        out.push_str(&format!(
            "| seed 003 (ncpu queues -> 1 queue) | | | {:.0} -> {:.0} | {:.0} -> {:.0} | | |\n",
            self.seed_read_mb_s.0,
            self.seed_read_mb_s.1,
            self.seed_write_iops.0,
            self.seed_write_iops.1
        ));
        out.push_str(&format!(
            "\n\"write kept\": writer IOPS with the readers over writer IOPS alone (goal >= 80%). \
             \"read kept\": read MB/s with the writer over the best read-alone MB/s (goal >= 95%). \
             Virtual time: {:.0} s per point, simulator seed {}.\n",
            self.seconds_per_point, self.seed
        ));
        out
    }
}
