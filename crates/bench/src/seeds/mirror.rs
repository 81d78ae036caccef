//! Seed 002: load-aware mirror reads.
//!
//! The seed's experiment: 16 fio threads reading 16 files, on 2 striped disks and on two
//! top-level 2-, 3- and 4-way mirrors of HDDs; 1 MiB and 4 KiB sequential reads (MB/s) and
//! random reads (IO/s); offset-modulo ("pristine") against least-pending ("with 1461").
//!
//! Our setup: 7200 rpm simulated HDDs of 1 TB (`HddParams::default`), 16 readers on 16 regions
//! of 16 GiB spread over the pool, striped over the two top-level vdevs in 1 MiB units. As in
//! ZFS with its default 128 KiB recordsize, every read goes through 128 KiB records, and
//! sequential readers prefetch as ZFS's zfetch does: records up to 8 MiB ahead of each stream
//! (`--prefetch-mib`) are always in flight, so a 4 KiB and a 1 MiB sequential reader both
//! stream. A random read fetches the whole records it touches, with no prefetch. Each point
//! runs for a fixed span of virtual time and counts what completed.
//!
//! Why prefetch matters to the result: with it, a stream hands each disk long runs. Offset-modulo
//! deals a stream's 2 MiB chunks out to the children in turn, so each child reads a chunk, skips
//! the next and pays a positioning for every chunk; least-pending keeps a stream on the child
//! where its last read ended for as long as loads allow, so the runs stay unbroken.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use futures::stream::{FuturesOrdered, StreamExt};
use serde::Serialize;
use sluice_engine::device::sim::{HddParams, SsdParams};
use sluice_engine::device::{BlockDevice, SimDevice, SimProfile};
use sluice_engine::rt::{Env, Rng, Time};
use sluice_engine::tunables::{IoClass, TunableError, Tunables};
use sluice_engine::vdev::{Mirror, Root, Vdev, VdevId};
use sluice_sim::Sim;

use super::sim_leaf;
use crate::{gain_pct, tunables_with, Settings};

const READERS: u64 = 16;
const RECORD_BYTES: u64 = 128 << 10;
const REGION_BYTES: u64 = 16 << 30;
const STRIPE_BYTES: u64 = 1 << 20;
/// How far ahead a sequential stream's prefetch runs by default: OpenZFS's
/// zfetch_max_distance. `--prefetch-mib` varies it.
pub const PREFETCH_BYTES: u64 = 8 << 20;
const DISK_BYTES: u64 = 1_000_000_000_000 / 4096 * 4096;

/// The four workloads of the seed's table, in its column order.
#[derive(Clone, Copy, Debug, Serialize)]
pub enum Workload {
    Seq1M,
    Seq4K,
    Rand1M,
    Rand4K,
}

impl Workload {
    pub const ALL: [Workload; 4] =
        [Workload::Seq1M, Workload::Seq4K, Workload::Rand1M, Workload::Rand4K];

    fn block_bytes(self) -> u64 {
        match self {
            Workload::Seq1M | Workload::Rand1M => 1 << 20,
            Workload::Seq4K | Workload::Rand4K => 4096,
        }
    }

    fn sequential(self) -> bool {
        matches!(self, Workload::Seq1M | Workload::Seq4K)
    }

    pub fn label(self) -> &'static str {
        match self {
            Workload::Seq1M => "seq 1M MB/s",
            Workload::Seq4K => "seq 4K MB/s",
            Workload::Rand1M => "rand 1M IO/s",
            Workload::Rand4K => "rand 4K IO/s",
        }
    }
}

/// A pool layout of the experiment.
#[derive(Clone, Debug, Serialize)]
pub struct Layout {
    pub name: String,
    /// Profiles of each top-level vdev's children (one child: a plain disk).
    top_level: Vec<Vec<&'static str>>,
    /// The seed's published figures (pristine, with 1461), where the seed has this row.
    pub seed: Option<([f64; 4], [f64; 4])>,
}

fn profile(name: &str) -> SimProfile {
    match name {
        "ssd" => SimProfile::Ssd(SsdParams { channels: 4, ..SsdParams::default() }),
        _ => SimProfile::Hdd(HddParams::default()),
    }
}

/// The seed's rows, plus the mixed-media mirror the issue asks for.
pub fn layouts() -> Vec<Layout> {
    let hdds = |n: usize| vec!["hdd"; n];
    vec![
        Layout {
            name: "2 Striped".into(),
            top_level: vec![hdds(1), hdds(1)],
            seed: Some(([226., 243., 11., 304.], [222., 255., 11., 299.])),
        },
        Layout {
            name: "2 2-Way Mirror".into(),
            top_level: vec![hdds(2), hdds(2)],
            seed: Some(([302., 324., 16., 534.], [433., 448., 23., 571.])),
        },
        Layout {
            name: "2 3-Way Mirror".into(),
            top_level: vec![hdds(3), hdds(3)],
            seed: Some(([429., 458., 24., 714.], [648., 648., 41., 808.])),
        },
        Layout {
            name: "2 4-Way Mirror".into(),
            top_level: vec![hdds(4), hdds(4)],
            seed: Some(([562., 601., 36., 849.], [816., 828., 82., 926.])),
        },
        Layout { name: "SSD+HDD Mirror".into(), top_level: vec![vec!["ssd", "hdd"]], seed: None },
        Layout { name: "SSD alone".into(), top_level: vec![vec!["ssd"]], seed: None },
        Layout { name: "HDD alone".into(), top_level: vec![hdds(1)], seed: None },
    ]
}

/// One row: our figures under both policies, and the seed's if it has the row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub layout: String,
    pub offset_modulo: [f64; 4],
    pub least_pending: [f64; 4],
    pub seed_pristine: Option<[f64; 4]>,
    pub seed_with_1461: Option<[f64; 4]>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub seconds_per_point: f64,
    pub seed: u64,
    /// How far ahead each sequential reader's prefetch ran.
    pub prefetch_bytes: u64,
    /// Tunables given with `--set`.
    pub settings: Vec<String>,
    pub rows: Vec<Row>,
}

/// Runs every layout, workload and policy.
pub fn run(
    seconds: f64,
    seed: u64,
    prefetch_bytes: u64,
    settings: &Settings,
) -> Result<Report, TunableError> {
    let modulo = tunables_with(settings, &[("mirror.read_policy", "offset-modulo")])?;
    let least = tunables_with(settings, &[("mirror.read_policy", "least-pending")])?;
    let rows = layouts()
        .into_iter()
        .map(|layout| {
            let measure = |t: &Tunables| {
                Workload::ALL.map(|w| run_point(&layout, t, w, prefetch_bytes, seconds, seed))
            };
            Row {
                layout: layout.name.clone(),
                offset_modulo: measure(&modulo),
                least_pending: measure(&least),
                seed_pristine: layout.seed.map(|s| s.0),
                seed_with_1461: layout.seed.map(|s| s.1),
            }
        })
        .collect();
    let settings = settings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    Ok(Report { seconds_per_point: seconds, seed, prefetch_bytes, settings, rows })
}

fn build_root(env: &Env, layout: &Layout, tunables: &Tunables) -> (Root, Vec<SimDevice>) {
    let mut devices = Vec::new();
    let mut next_id = 0u32;
    let top = layout
        .top_level
        .iter()
        .map(|children| {
            let mut leaves: Vec<_> = children
                .iter()
                .map(|p| {
                    next_id += 1;
                    let (leaf, device) = sim_leaf(env, next_id, profile(p), DISK_BYTES, tunables);
                    devices.push(device);
                    leaf
                })
                .collect();
            if leaves.len() == 1 {
                Vdev::Leaf(leaves.remove(0))
            } else {
                next_id += 1;
                Vdev::Mirror(Arc::new(Mirror::new(VdevId(1000 + next_id), env, leaves, tunables)))
            }
        })
        .collect();
    (Root::new(top), devices)
}

/// One figure: MB/s for sequential workloads, IO/s for random ones.
pub fn run_point(
    layout: &Layout,
    tunables: &Tunables,
    workload: Workload,
    prefetch_bytes: u64,
    seconds: f64,
    seed: u64,
) -> f64 {
    let sim = Sim::new(seed);
    let env = sim.env();
    let policy = tunables.choice(sluice_engine::tunables::Tunable::MirrorReadPolicy);
    let (root, devices) = build_root(&env, layout, tunables);
    let root = Arc::new(root);
    let pool_bytes: u64 = root.top_level().iter().map(Vdev::len_bytes).sum();
    let spacing = (pool_bytes / READERS) / STRIPE_BYTES * STRIPE_BYTES;
    assert!(spacing >= REGION_BYTES, "regions must not overlap");
    let end = Time::ZERO.plus(Duration::from_secs_f64(seconds));
    let done = Rc::new(RefCell::new((0u64, 0u64)));
    let readers: Vec<_> = (0..READERS)
        .map(|reader| {
            let root = Arc::clone(&root);
            let env = env.clone();
            let done = Rc::clone(&done);
            let rng = env.rng(&format!("reader{reader}"));
            let base = reader * spacing;
            async move {
                if workload.sequential() {
                    let block = workload.block_bytes();
                    read_sequential(&root, &env, base, block, prefetch_bytes, end, &done).await;
                } else {
                    read_random(&root, &env, base, workload.block_bytes(), end, &done, rng).await;
                }
            }
        })
        .collect();
    let run = sim.run(async move {
        join_all(readers).await;
    });
    if let Err(e) = run {
        panic!("mirror bench {} {policy} {workload:?}: {e}", layout.name);
    }
    if std::env::var_os("SLUICE_BENCH_DEBUG").is_some() {
        let depths: Vec<u32> = root.leaves().iter().map(|l| l.queue_depth()).collect();
        eprintln!("{} {policy} {workload:?}: queue depths {depths:?}", layout.name);
        for device in &devices {
            let s = device.stats();
            eprintln!(
                "{} {policy} {workload:?} {}: commands {} merged {} MB {} busy {:.0}%",
                layout.name,
                device.name(),
                s.reads,
                s.merged,
                s.read_bytes >> 20,
                s.busy_nanos as f64 / (seconds * 1e9) * 100.0
            );
        }
    }
    let (bytes, ops) = *done.borrow();
    if workload.sequential() {
        bytes as f64 / 1e6 / seconds
    } else {
        ops as f64 / seconds
    }
}

/// Reads one 128 KiB record of a reader's region.
async fn read_record(root: Arc<Root>, base: u64, record: u64) -> bool {
    let record = record % (REGION_BYTES / RECORD_BYTES);
    let dva = root.stripe(base + record * RECORD_BYTES, STRIPE_BYTES);
    root.read(dva, RECORD_BYTES as u32, IoClass::SyncRead, &|_: &[u8]| true).await.is_ok()
}

/// A sequential reader with ZFS-style prefetch: records up to `prefetch_bytes` ahead of the
/// reader are always in flight, and the reader consumes them in order.
async fn read_sequential(
    root: &Arc<Root>,
    env: &Env,
    base: u64,
    block: u64,
    prefetch_bytes: u64,
    end: Time,
    done: &Rc<RefCell<(u64, u64)>>,
) {
    let mut in_flight = FuturesOrdered::new();
    let (mut next_record, mut position, mut available) = (0u64, 0u64, 0u64);
    while env.now() < end {
        while next_record * RECORD_BYTES < position + block + prefetch_bytes {
            in_flight.push_back(read_record(Arc::clone(root), base, next_record));
            next_record += 1;
        }
        while available < position + block {
            match in_flight.next().await {
                Some(true) => available += RECORD_BYTES,
                _ => return,
            }
        }
        if env.now() > end {
            return;
        }
        position += block;
        let mut done = done.borrow_mut();
        done.0 += block;
        done.1 += 1;
    }
}

/// A random reader: each read fetches the whole records it touches.
async fn read_random(
    root: &Arc<Root>,
    env: &Env,
    base: u64,
    block: u64,
    end: Time,
    done: &Rc<RefCell<(u64, u64)>>,
    mut rng: Rng,
) {
    while env.now() < end {
        let offset = rng.below(REGION_BYTES / block) * block;
        let records = (offset / RECORD_BYTES)..=((offset + block - 1) / RECORD_BYTES);
        let results = join_all(records.map(|r| read_record(Arc::clone(root), base, r))).await;
        if results.contains(&false) || env.now() > end {
            return;
        }
        let mut done = done.borrow_mut();
        done.0 += block;
        done.1 += 1;
    }
}

impl Report {
    /// The seed's layout: before and after side by side, ours above the seed's.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "| layout | policy | seq 1M MB/s | seq 4K MB/s | rand 1M IO/s | rand 4K IO/s |\n",
        );
        out.push_str("|---|---|---:|---:|---:|---:|\n");
        let cells =
            |v: &[f64; 4]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" | ");
        let gains = |a: &[f64; 4], b: &[f64; 4]| {
            (0..4).map(|i| format!("{:+.0}%", gain_pct(a[i], b[i]))).collect::<Vec<_>>().join(" | ")
        };
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | sluice offset-modulo | {} |\n",
                row.layout,
                cells(&row.offset_modulo)
            ));
            out.push_str(&format!(
                "| {} | sluice least-pending | {} |\n",
                row.layout,
                cells(&row.least_pending)
            ));
            out.push_str(&format!(
                "| {} | sluice gain | {} |\n",
                row.layout,
                gains(&row.offset_modulo, &row.least_pending)
            ));
            if let (Some(before), Some(after)) = (&row.seed_pristine, &row.seed_with_1461) {
                out.push_str(&format!("| {} | seed pristine | {} |\n", row.layout, cells(before)));
                out.push_str(&format!("| {} | seed with 1461 | {} |\n", row.layout, cells(after)));
                out.push_str(&format!(
                    "| {} | seed gain | {} |\n",
                    row.layout,
                    gains(before, after)
                ));
            }
        }
        out.push_str(&format!(
            "\nVirtual time: {:.0} s per point, simulator seed {}, prefetch {} MiB per sequential \
             reader, tunables: {}. MB = 10^6 bytes.\n",
            self.seconds_per_point,
            self.seed,
            self.prefetch_bytes >> 20,
            if self.settings.is_empty() { "defaults".to_owned() } else { self.settings.join(" ") }
        ));
        out
    }
}
