//! The intent log through the store, under crashes (issue: intent log; seed 004).
//!
//! A workload of writes, FUA writes, zeroes, flushes and syncs runs on a 2-way mirror of
//! simulated SSDs, with every device operation recorded. A ledger notes when each version of
//! each 4 KiB unit was started, and when it became durably acknowledged (its FUA write, a flush
//! or a sync returned after it completed). Then power is cut at a point in virtual time: each
//! leg keeps the operations it had completed by then, and its unflushed writes are dropped,
//! kept, reordered or torn by a seeded policy. After import (claim, replay, sync) every unit
//! must hold the newest durably acknowledged version or a later one that had been started, and
//! its bytes must be exactly that version's.
//!
//! Scripted workloads are cut after every device operation; random workloads at random points.
//! Some imports are themselves cut short in the middle of replay and imported again. Probes
//! (the store's log statistics and the leaves' repair counters) show that the rare paths ran:
//! a torn log tail, a replay resumed after an interruption, a log block healed from the other
//! copy. A failure prints the workload, policy and cut to replay it.

use crate::common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

use sluice_engine::device::sim::{CrashPolicy, Fault, SimImage, SimOptions};
use sluice_engine::device::{AlignedBuf, SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool};
use sluice_engine::rt::{Env, Rng, Time};
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::txg::{ImportOptions, Store, SyncRecord, VolumeProperty};
use sluice_engine::volume::Volume;
use sluice_format::raidz::RaidzLayout;
use sluice_format::LogBias;
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 32 << 20;
const UNIT: u64 = 4096;
/// Units in the volume; each writer owns `UNITS_PER_WRITER` consecutive ones.
const UNITS: u64 = 64;
const UNITS_PER_WRITER: u64 = 8;
/// Volume blocks hold two units, so unit writes exercise read-modify-write.
const VOLUME_BLOCK: u32 = 8192;

/// Contents of unit `unit` at version `version` (0: zeros).
fn pattern(version: u64, unit: u64) -> Vec<u8> {
    if version == 0 {
        return vec![0; UNIT as usize];
    }
    let mut out: Vec<u8> =
        (0..UNIT).map(|i| (version.wrapping_mul(31) ^ i.wrapping_mul(7) ^ unit) as u8).collect();
    out[..8].copy_from_slice(&version.to_le_bytes());
    out[8..16].copy_from_slice(&unit.to_le_bytes());
    out
}

/// One version of one unit.
#[derive(Clone, Debug)]
struct Version {
    /// 0 for zeros (trim or write-zeroes).
    id: u64,
    started: Time,
    /// Logical time of completion, for deciding what a flush covers.
    completed: Option<u64>,
    durable: Option<Time>,
}

#[derive(Default)]
struct Ledger {
    units: Vec<Vec<Version>>,
    clock: u64,
    next_id: u64,
}

impl Ledger {
    fn new() -> Ledger {
        Ledger { units: vec![Vec::new(); UNITS as usize], clock: 0, next_id: 1 }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Versions a crash at `cut` may leave in `unit`.
    fn allowed(&self, unit: u64, cut: Time) -> Vec<u64> {
        self.allowed_since(unit, |durable| durable <= cut, cut)
    }

    /// Versions `unit` may hold after a crash at `cut`: the newest version whose durability
    /// `required` says must survive, and every later one started by then (0 for zeros when
    /// none must).
    fn allowed_since(&self, unit: u64, required: impl Fn(Time) -> bool, cut: Time) -> Vec<u64> {
        let versions = &self.units[unit as usize];
        let durable = versions.iter().rposition(|v| v.durable.is_some_and(&required));
        let mut allowed: Vec<u64> = Vec::new();
        if durable.is_none() {
            allowed.push(0);
        }
        for v in &versions[durable.unwrap_or(0)..] {
            if v.started <= cut {
                allowed.push(v.id);
            }
        }
        allowed
    }
}

impl Ledger {
    /// Versions a rewind to a txg that quiesced at `quiesced` may leave in `unit` after a crash
    /// at `cut`: the txg holds every write acknowledged before it quiesced, and replay may add
    /// any later one.
    fn allowed_rewound(&self, unit: u64, quiesced: Time, cut: Time) -> Vec<u64> {
        self.allowed_since(unit, |durable| durable < quiesced, cut)
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Units [first, first+count) of the writer's range, with or without FUA.
    Write {
        first: u64,
        count: u64,
        fua: bool,
    },
    Zero {
        first: u64,
        count: u64,
        fua: bool,
    },
    Flush,
    Sync,
}

/// The script of each writer.
type Script = Vec<Vec<Op>>;

fn scripted(name: &str) -> Script {
    let w = |first, count, fua| Op::Write { first, count, fua };
    match name {
        // One writer, FUA writes only: each is durable when it returns.
        "sync-writes" => vec![(0..10).map(|i| w(i % 8, 1, true)).collect()],
        // FUA writes of whole volume blocks (two units each), overwriting each other.
        "sync-writes-indirect" => vec![
            (0..8).map(|i| w(2 * (i % 4), 2 + 2 * (i % 2), true)).collect(),
            (0..6).map(|i| w(2 * (i % 3), 2, i % 2 == 0)).chain([Op::Flush]).collect(),
        ],
        // Plain writes made durable by a flush; a sync in the middle of the txg.
        "flush-mid-txg" => vec![
            vec![
                w(0, 2, false),
                w(2, 1, false),
                Op::Flush,
                w(0, 1, false),
                Op::Sync,
                w(1, 3, false),
                Op::Flush,
            ],
            vec![w(0, 1, false), w(4, 4, false), Op::Flush, w(3, 1, false), Op::Flush],
            vec![Op::Zero { first: 0, count: 2, fua: false }, w(5, 2, true), Op::Flush],
        ],
        // Whole blocks written again before their flush or FUA write, in one txg: the records
        // of one commit share the block of the last version.
        "rewritten-before-flush" => vec![
            vec![
                w(0, 4, false),
                w(0, 4, false),
                w(2, 2, false),
                Op::Flush,
                w(0, 2, false),
                w(0, 2, true),
            ],
            vec![w(0, 8, false), w(2, 4, false), w(0, 8, false), Op::Flush],
        ],
        // Many writers with multi-unit FUA writes: the chain crosses many blocks.
        "chain-crosses-blocks" => (0..6)
            .map(|k| {
                (0..5)
                    .map(|i| {
                        if (i + k) % 4 == 3 {
                            Op::Zero { first: i % 4, count: 2, fua: true }
                        } else {
                            w(i % 4, 4, true)
                        }
                    })
                    .collect()
            })
            .collect(),
        other => panic!("no script {other}"),
    }
}

fn random_script(rng: &mut Rng) -> Script {
    let writers = 1 + rng.below(6);
    (0..writers)
        .map(|_| {
            (0..(4 + rng.below(10)))
                .map(|_| {
                    let first = rng.below(UNITS_PER_WRITER);
                    let count = 1 + rng.below(UNITS_PER_WRITER - first);
                    match rng.below(10) {
                        0 => Op::Flush,
                        1 => Op::Sync,
                        2 => Op::Zero { first, count, fua: rng.chance(0.5) },
                        _ => Op::Write { first, count, fua: rng.chance(0.6) },
                    }
                })
                .collect()
        })
        .collect()
}

/// `policy` is an `intent_log.policy`, or one followed by `+indirect`: then every write that
/// covers a whole volume block logs that block by pointer (the block written in place, ZFS's
/// WR_INDIRECT), where the default does so only from 32 KiB writes on; or by `+throughput`:
/// the volume also has logbias=throughput ([`throughput`]), so every write logs every block it
/// touches by pointer, those it covers in part too.
fn tunables(policy: &str, dirty_max: &str) -> Tunables {
    let by_pointer =
        policy.strip_suffix("+indirect").or_else(|| policy.strip_suffix("+throughput"));
    let (policy, immediate) = match by_pointer {
        Some(policy) => (policy, "4K"),
        None => (policy, "32K"),
    };
    Tunables::with([
        ("intent_log.policy", policy),
        ("txg.dirty_max", dirty_max),
        ("intent_log.immediate_write_bytes", immediate),
    ])
    .unwrap()
}

/// Whether `policy` asks for volume "v" with logbias=throughput ([`tunables`]).
fn throughput(policy: &str) -> bool {
    policy.ends_with("+throughput")
}

/// Each device's image after a power cut once everything it was sent has arrived, with every
/// write its cache still held lost.
fn power_cut(devices: &[SimDevice], seed: u64) -> Vec<SimImage> {
    let mut rng = Rng::new(seed);
    let images = devices
        .iter()
        .map(|d| d.crash_image(d.write_log().len(), CrashPolicy::DropAll, &mut rng).unwrap());
    images.collect()
}

fn legs(sim: &Sim, images: Option<Vec<SimImage>>) -> Vec<SimDevice> {
    legs_of(sim, images, 2)
}

/// `count` disks (or as many as `images`), recording their operations.
fn legs_of(sim: &Sim, images: Option<Vec<SimImage>>, count: usize) -> Vec<SimDevice> {
    let options = SimOptions { store_data: true, record_log: true };
    match images {
        None => common::legs_with(sim, count, SimProfile::ssd(), LEAF_BYTES, options),
        Some(images) => common::revive_with(sim, images, SimProfile::ssd(), LEAF_BYTES, options),
    }
}

/// Runs one writer's script, noting everything in the ledger.
async fn run_writer(
    env: Env,
    volume: Volume,
    writer: u64,
    ops: Vec<Op>,
    ledger: Rc<RefCell<Ledger>>,
) {
    let base = writer * UNITS_PER_WRITER;
    for op in ops {
        let started = env.now();
        match op {
            Op::Write { first, count, fua } | Op::Zero { first, count, fua } => {
                let zero = matches!(op, Op::Zero { .. });
                let units: Vec<u64> = (base + first..base + first + count).collect();
                let mut ids = Vec::new();
                let mut data = Vec::new();
                {
                    let mut l = ledger.borrow_mut();
                    for &unit in &units {
                        let id = if zero {
                            0
                        } else {
                            l.next_id += 1;
                            l.next_id
                        };
                        ids.push(id);
                        data.extend(pattern(id, unit));
                        l.units[unit as usize].push(Version {
                            id,
                            started,
                            completed: None,
                            durable: None,
                        });
                    }
                }
                let offset = units[0] * UNIT;
                let result = if zero {
                    volume.zero(offset, count * UNIT, fua).await
                } else {
                    volume.write(offset, &data, fua).await
                };
                if result.is_err() {
                    return;
                }
                let mut l = ledger.borrow_mut();
                let done = l.tick();
                for &unit in &units {
                    let version = l.units[unit as usize].last_mut().unwrap();
                    version.completed = Some(done);
                    if fua {
                        version.durable = Some(env.now());
                    }
                }
            }
            Op::Flush | Op::Sync => {
                let start = ledger.borrow_mut().tick();
                let result = match op {
                    Op::Flush => volume.flush().await,
                    _ => volume.store().sync().await.map(|_| ()),
                };
                if result.is_err() {
                    return;
                }
                let now = env.now();
                let mut l = ledger.borrow_mut();
                for versions in &mut l.units {
                    for v in versions.iter_mut() {
                        if v.completed.is_some_and(|c| c < start) && v.durable.is_none() {
                            v.durable = Some(now);
                        }
                    }
                }
            }
        }
    }
}

/// What one workload run leaves: the devices with their operation logs, and the ledger.
struct Run {
    devices: Vec<SimDevice>,
    ledger: Ledger,
    /// Every txg the store synced, with when it quiesced and when it was durable.
    syncs: Vec<SyncRecord>,
    /// The pool and volume exist durably from here on; cuts come later.
    setup_done: Time,
}

fn run_workload(seed: u64, policy: &str, script: &Script) -> Run {
    run_workload_with(seed, policy, script, false)
}

/// As [`run_workload`]; with `admin`, a third disk (leg2) is swapped in while the writers run:
/// by the seed, a replace of leg1 or of leg0, or an attach beside leg0 and then a detach of
/// leg0, each followed through its resilver and detach.
fn run_workload_with(seed: u64, policy: &str, script: &Script, admin: bool) -> Run {
    run_workload_on(seed, policy, script, admin, 0)
}

/// As [`run_workload_with`] on a mirror (`parity` 0), or without `admin` on a RAID-Z vdev of
/// `parity + 3` leaves (raidz1 of 4, raidz2 of 5, raidz3 of 6) and no separate log device.
fn run_workload_on(seed: u64, policy: &str, script: &Script, admin: bool, parity: u8) -> Run {
    run_workload_laid_out(seed, policy, script, admin, parity, RaidzLayout::Copies)
}

/// As [`run_workload_on`], the RAID-Z vdev laying out log blocks as `log_layout`.
fn run_workload_laid_out(
    seed: u64,
    policy: &str,
    script: &Script,
    admin: bool,
    parity: u8,
    log_layout: RaidzLayout,
) -> Run {
    let sim = Sim::new(seed);
    let width = if parity > 0 { usize::from(parity) + 3 } else { 2 };
    let devices = if admin {
        let options = SimOptions { store_data: true, record_log: true };
        common::legs_with(&sim, 3, SimProfile::ssd(), LEAF_BYTES, options)
    } else {
        legs_of(&sim, None, width)
    };
    let specs = common::leaf_specs(&devices[..width]);
    let spec = match parity {
        0 => common::mirror_pool(specs),
        parity => sluice_engine::pool::PoolSpec {
            name: "tank".into(),
            ashift: 12,
            top: vec![sluice_engine::pool::TopSpec::Raidz { parity, leaves: specs }],
        },
    };
    let spare = (admin && parity == 0)
        .then(|| devices.get(2))
        .flatten()
        .map(|d| LeafSpec { path: "leg2".into(), device: Arc::new(d.clone()) });
    let env = sim.env();
    let ledger = Rc::new(RefCell::new(Ledger::new()));
    let (l, script, policy) = (Rc::clone(&ledger), script.clone(), policy.to_owned());
    let (setup_done, syncs) = sim
        .run(async move {
            let tunables = tunables(&policy, "64M");
            let pool =
                Pool::create_as(&env, spec, &tunables, common::features(log_layout)).await.unwrap();
            let store = Arc::new(Store::create(pool, &tunables));
            store.create_volume("v", UNITS * UNIT, VOLUME_BLOCK).unwrap();
            if throughput(&policy) {
                store.set_property("v", VolumeProperty::LogBias(LogBias::Throughput)).unwrap();
            }
            store.sync().await.unwrap();
            let setup_done = env.now();
            let volume = Volume::open(&store, "v").unwrap();
            let writers = script.into_iter().enumerate().map(|(w, ops)| {
                run_writer(env.clone(), volume.clone(), w as u64, ops, Rc::clone(&l))
            });
            let swap = async {
                let Some(spare) = spare else { return };
                env.sleep(std::time::Duration::from_micros(100 + seed * 7919 % 3000)).await;
                match seed % 3 {
                    0 => drop(store.replace_leaf("leg1", spare).await.unwrap()),
                    1 => drop(store.replace_leaf("leg0", spare).await.unwrap()),
                    _ => drop(store.attach_leaf("leg0", spare).await.unwrap()),
                }
                for _ in 0..1000 {
                    store.resilver_if_needed();
                    store.wait_scan().await;
                    store.detach_replaced().await;
                    if store.pool().leaves_behind().is_empty() {
                        break;
                    }
                    env.sleep(std::time::Duration::from_millis(1)).await;
                }
                if seed % 3 == 2 {
                    store.detach_leaf("leg0").await.unwrap();
                }
            };
            futures::future::join(futures::future::join_all(writers), swap).await;
            // The pool is left as it is: no export. The crash cuts decide what survived.
            (setup_done, store.sync_history())
        })
        .unwrap()
        .0;
    let ledger = Rc::try_unwrap(ledger).ok().unwrap().into_inner();
    Run { devices, ledger, syncs, setup_done }
}

/// Probes: counts of the rare paths, summed over every crash state.
#[derive(Debug, Default)]
struct Probes {
    states: u64,
    replayed: u64,
    torn_tails: u64,
    resumed: u64,
    healed: u64,
    /// Indirect records replayed (their blocks read where the record points).
    indirect_replayed: u64,
    /// Chains that ended at an indirect record whose block never reached the disk.
    indirect_ends: u64,
    /// Indirect records whose block an earlier record of the chain had claimed (a block
    /// written again before its commit).
    indirect_shared: u64,
    /// Imports that opened a pool whose leaves were not leg0 and leg1 alone: a cut during or
    /// after a swap of disks.
    swapped: u64,
}

/// Images of the devices as a cut at `cut` leaves them.
fn images_at(devices: &[SimDevice], cut: Time, rng: &mut Rng) -> Vec<SimImage> {
    devices
        .iter()
        .map(|d| {
            let ops = d.write_log().iter().take_while(|e| e.at <= cut).count();
            d.crash_image(ops, CrashPolicy::Any, rng).unwrap()
        })
        .collect()
}

/// Imports, checks every unit against the ledger at `cut`, and returns the revived devices
/// (with their own operation logs, for cutting the import short).
fn import_and_check(
    what: &str,
    run: &Run,
    images: Vec<SimImage>,
    cut: Time,
    policy: &str,
    faults: &[(usize, Fault)],
    probes: &mut Probes,
) -> Vec<SimDevice> {
    import_without(what, run, images, cut, policy, faults, &[], probes)
}

/// As [`import_and_check`], with the leaves `missing` (indices) left out of the import.
#[allow(clippy::too_many_arguments)]
fn import_without(
    what: &str,
    run: &Run,
    images: Vec<SimImage>,
    cut: Time,
    policy: &str,
    faults: &[(usize, Fault)],
    missing: &[usize],
    probes: &mut Probes,
) -> Vec<SimDevice> {
    let sim = Sim::new(cut.0 ^ 0x5151);
    let devices = legs(&sim, Some(images));
    for (leg, fault) in faults {
        devices[*leg].inject(fault.clone());
    }
    let present: Vec<SimDevice> = (devices.iter().enumerate())
        .filter(|(i, _)| !missing.contains(i))
        .map(|(_, d)| d.clone())
        .collect();
    let specs: Vec<LeafSpec> = common::leaf_specs(&present);
    let env = sim.env();
    let policy = policy.to_owned();
    let found = Rc::new(RefCell::new(Vec::new()));
    let f = Rc::clone(&found);
    let outcome = sim.run(async move {
        // Replay with a small dirty limit, so a long replay spans several txgs.
        let tunables = tunables(&policy, "1M");
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let store = match Store::open(pool, &tunables).await {
            Ok(store) => store,
            Err(error) => panic!("import failed: {error}"),
        };
        for unit in 0..UNITS {
            let data = store.read("v", unit * UNIT, UNIT).await.unwrap();
            f.borrow_mut().push(data);
        }
        let stats = store.log_stats();
        let leaves_repaired: u64 =
            store.pool().leaves().iter().map(|l| l.leaf.stats().repairs.get()).sum();
        let paths: Vec<String> = store.pool().leaves().iter().map(|l| l.path.clone()).collect();
        let swapped = u64::from(paths != ["leg0", "leg1"]);
        (
            stats.records_replayed.get(),
            stats.torn_tails.get(),
            stats.records_already_replayed.get(),
            leaves_repaired,
            (
                stats.indirect_records_replayed.get(),
                stats.indirect_chain_ends.get(),
                stats.indirect_claims_shared.get(),
                swapped,
            ),
        )
    });
    let (replayed, torn, resumed, healed, (indirect_replayed, indirect_ends, shared, swapped)) =
        match outcome {
            Ok((result, _)) => result,
            Err(error) => panic!("{what}: simulation failed: {error}"),
        };
    probes.states += 1;
    probes.replayed += replayed;
    probes.torn_tails += torn;
    probes.resumed += resumed;
    probes.healed += healed;
    probes.indirect_replayed += indirect_replayed;
    probes.indirect_ends += indirect_ends;
    probes.indirect_shared += shared;
    probes.swapped += swapped;
    for (unit, data) in found.borrow().iter().enumerate() {
        let unit = unit as u64;
        let allowed = run.ledger.allowed(unit, cut);
        let id = if data.iter().all(|&b| b == 0) {
            0
        } else {
            u64::from_le_bytes(data[..8].try_into().unwrap())
        };
        assert!(
            allowed.contains(&id),
            "{what}: unit {unit} holds version {id}, allowed {allowed:?} (newest durable first)"
        );
        assert_eq!(*data, pattern(id, unit), "{what}: unit {unit} holds a damaged version {id}");
    }
    devices
}

/// Distinct completion times of the run's device operations after setup: the cut points.
fn cut_points(run: &Run) -> Vec<Time> {
    let times: BTreeSet<Time> = run
        .devices
        .iter()
        .flat_map(|d| d.write_log().into_iter().map(|e| e.at))
        .filter(|&at| at >= run.setup_done)
        .collect();
    times.into_iter().collect()
}

/// Every device operation of each scripted workload, both policies.
#[test]
fn scripted_workloads_cut_at_every_operation() {
    let mut probes = Probes::default();
    for policy in ["auto", "pipelined", "batch"] {
        for name in ["sync-writes", "flush-mid-txg", "chain-crosses-blocks"] {
            let run = run_workload(11, policy, &scripted(name));
            let mut rng = Rng::new(3);
            for cut in cut_points(&run) {
                let what = format!("script {name} policy {policy} cut {cut:?}");
                for _ in 0..4 {
                    let images = images_at(&run.devices, cut, &mut rng);
                    import_and_check(&what, &run, images, cut, policy, &[], &mut probes);
                }
            }
        }
    }
    eprintln!("scripted: {probes:?}");
    // Every device operation is a cut point; new blocks written in spans make fewer of them
    // (568 states with spans, 616 block by block).
    assert!(probes.states >= 500, "{probes:?}");
    assert!(probes.replayed > 0, "no crash state needed replay: {probes:?}");
    assert!(probes.torn_tails > 0, "no crash state tore the log tail: {probes:?}");
}

/// Writes logged by pointer, cut after every device operation: the block written in place,
/// the pointer logged, the crash before the txg. A record whose block is on disk replays from
/// it; one whose log block landed but whose block did not (the crash between the two writes a
/// commit waits for) ends the log there, and loses nothing acknowledged.
#[test]
fn indirect_records_cut_at_every_operation() {
    let mut probes = Probes::default();
    for policy in ["auto+indirect", "pipelined+indirect", "batch+indirect", "auto+throughput"] {
        for name in [
            "sync-writes-indirect",
            "flush-mid-txg",
            "chain-crosses-blocks",
            "rewritten-before-flush",
        ] {
            let run = run_workload(12, policy, &scripted(name));
            let mut rng = Rng::new(5);
            for cut in cut_points(&run) {
                let what = format!("script {name} policy {policy} cut {cut:?}");
                for _ in 0..3 {
                    let images = images_at(&run.devices, cut, &mut rng);
                    import_and_check(&what, &run, images, cut, policy, &[], &mut probes);
                }
            }
        }
    }
    eprintln!("indirect: {probes:?}");
    assert!(probes.indirect_replayed > 0, "no indirect record was replayed: {probes:?}");
    assert!(probes.indirect_ends > 0, "no chain ended at an unwritten block: {probes:?}");
    assert!(probes.indirect_shared > 0, "no record shared its block with a later one: {probes:?}");
}

/// Random workloads cut at random points; some imports are cut short during replay and
/// imported again; some have one copy of a log block damaged.
#[test]
fn random_workloads_and_interrupted_replay() {
    for policy in ["auto", "pipelined", "batch"] {
        let mut probes = Probes::default();
        for seed in 0..100u64 {
            // A third of the seeds log every block a write touches by pointer, the partial
            // ones too; half the others whole blocks only.
            let policy = if seed % 3 == 0 {
                format!("{policy}+throughput")
            } else if seed % 2 == 1 {
                format!("{policy}+indirect")
            } else {
                policy.into()
            };
            let policy = policy.as_str();
            let mut rng = Rng::new(seed);
            let script = random_script(&mut rng);
            // Every fourth seed swaps a disk while the writers run (attach, replace, detach,
            // and the resilvers between).
            let run = run_workload_with(seed, policy, &script, seed % 4 == 3);
            let cuts = cut_points(&run);
            let last = *cuts.last().unwrap();
            for k in 0..50 {
                let cut = if k == 0 { last } else { cuts[rng.below(cuts.len() as u64) as usize] };
                let what = format!("random seed {seed} policy {policy} cut {cut:?}");
                let images = images_at(&run.devices, cut, &mut rng);
                let revived = import_and_check(&what, &run, images, cut, policy, &[], &mut probes);
                if k % 10 == 0 {
                    // Cut the import itself short, anywhere in its replay and sync, and
                    // import again: the ledger at the first cut still holds.
                    let times: Vec<Time> = revived
                        .iter()
                        .flat_map(|d| d.write_log().into_iter().map(|e| e.at))
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    if let Some(&again) = times.get(rng.below(times.len().max(1) as u64) as usize) {
                        let images = images_at(&revived, again, &mut rng);
                        let what = format!("{what}, import cut at {again:?}");
                        import_and_check(&what, &run, images, cut, policy, &[], &mut probes);
                    }
                }
            }
        }
        eprintln!("random, {policy}: {probes:?}");
        // The issue asks for at least 5,000 crash states per policy in CI.
        assert!(probes.states >= 5000, "{policy}: {probes:?}");
        assert!(probes.torn_tails > 0, "{policy}: no torn log tail: {probes:?}");
        assert!(probes.indirect_replayed > 0, "{policy}: no indirect record replayed: {probes:?}");
        assert!(probes.swapped > 0, "{policy}: no cut fell during a swap of disks: {probes:?}");
    }
}

/// The intent log on RAID-Z pools (no separate log device): random workloads, logged by
/// value and by pointer, cut at random points; each crash state is imported with `parity`
/// leaves missing (a different set each time), and everything acknowledged is there: log
/// blocks are written with their parity (as copies, or striped and whole on a pool made
/// before feature `raidz_log_copies`: every fourth seed), and a chain read around the
/// missing leaves.
#[test]
fn raidz_log_replays_with_leaves_missing() {
    let mut probes = Probes::default();
    for seed in 0..24u64 {
        let parity = 1 + (seed % 3) as u8;
        let width = usize::from(parity) + 3;
        let policy = if seed % 3 == 0 {
            "auto+throughput"
        } else if seed % 2 == 1 {
            "auto+indirect"
        } else {
            "auto"
        };
        let layout = if seed % 4 == 3 { RaidzLayout::Striped } else { RaidzLayout::Copies };
        let mut rng = Rng::new(seed + 7000);
        let script = random_script(&mut rng);
        let run = run_workload_laid_out(seed, policy, &script, false, parity, layout);
        let cuts = cut_points(&run);
        for k in 0..12 {
            let cut = if k == 0 {
                *cuts.last().unwrap()
            } else {
                cuts[rng.below(cuts.len() as u64) as usize]
            };
            let first = rng.below(width as u64) as usize;
            let missing: Vec<usize> =
                (0..usize::from(parity)).map(|i| (first + i) % width).collect();
            let what = format!(
                "raidz{parity} ({layout:?} log blocks) seed {seed} policy {policy} cut {cut:?} \
                 without legs {missing:?}"
            );
            let images = images_at(&run.devices, cut, &mut rng);
            import_without(&what, &run, images, cut, policy, &[], &missing, &mut probes);
        }
    }
    eprintln!("raidz: {probes:?}");
    assert!(probes.states >= 288, "{probes:?}");
    assert!(probes.replayed > 0, "no crash state needed replay: {probes:?}");
    assert!(probes.indirect_replayed > 0, "no indirect record replayed: {probes:?}");
}

/// Large logged writes whose replay spans several txgs: an import cut after one of those
/// syncs resumes where it stopped (records already applied are skipped, none twice).
#[test]
fn replay_resumes_after_an_interrupted_import() {
    let mut probes = Probes::default();
    for policy in ["auto", "pipelined", "batch"] {
        // 4 writers x 12 FUA writes of all their 8 units (32 KiB): 1.5 MiB of records, which
        // a 1 MiB dirty limit cannot replay in one txg.
        let script: Script = (0..4)
            .map(|_| (0..12).map(|_| Op::Write { first: 0, count: 8, fua: true }).collect())
            .collect();
        let run = run_workload(21, policy, &script);
        let last = *cut_points(&run).last().unwrap();
        let mut rng = Rng::new(9);
        let images = images_at(&run.devices, last, &mut rng);
        let what = format!("long replay policy {policy}");
        let revived = import_and_check(&what, &run, images, last, policy, &[], &mut probes);
        // Every cut of the first import's operations.
        let times: BTreeSet<Time> =
            revived.iter().flat_map(|d| d.write_log().into_iter().map(|e| e.at)).collect();
        for again in times {
            let images = images_at(&revived, again, &mut rng);
            let what = format!("{what}, import cut at {again:?}");
            import_and_check(&what, &run, images, last, policy, &[], &mut probes);
        }
    }
    eprintln!("resume: {probes:?}");
    assert!(probes.resumed > 0, "no import resumed an interrupted replay: {probes:?}");
}

/// One copy of a log block is damaged on one leg: replay reads the other copy, rewrites the
/// damaged one, and loses nothing.
#[test]
fn damaged_log_block_heals_from_the_mirror() {
    let mut probes = Probes::default();
    for seed in 0..8u64 {
        let script: Script = (0..3)
            .map(|_| (0..6).map(|i| Op::Write { first: i % 8, count: 1, fua: true }).collect())
            .collect();
        let run = run_workload(100 + seed, "auto", &script);
        let last = *cut_points(&run).last().unwrap();
        let mut rng = Rng::new(seed);
        let images = images_at(&run.devices, last, &mut rng);
        // Damage the chain's first block on one leg; replay must read the other copy.
        let (offset, _) = log_head_after_crash(images.clone());
        let fault = Fault::BitFlip { offset_bytes: offset + 200, bit: 3 };
        let what = format!("heal seed {seed}");
        let leg = (seed % 2) as usize;
        import_and_check(&what, &run, images, last, "auto", &[(leg, fault)], &mut probes);
    }
    eprintln!("heal: {probes:?}");
    assert!(probes.healed > 0, "no log block was healed: {probes:?}");
}

/// Where the log chain of volume "v" starts in crash images (read from the directory).
fn log_head_after_crash(images: Vec<SimImage>) -> (u64, u32) {
    let sim = Sim::new(1);
    let devices = legs(&sim, Some(images));
    let specs = common::leaf_specs(&devices);
    let env = sim.env();
    sim.run(async move {
        let tunables = Tunables::default();
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let root = pool.uberblock().root.unwrap();
        let bytes = pool.read_block(&root, IoClass::SyncRead).await.unwrap();
        let directory = sluice_format::PoolDirectory::decode(&bytes).unwrap();
        let header = directory.volumes[0].log.unwrap();
        let dva = header.head.dvas[0];
        (dva.offset_bytes(), dva.vdev)
    })
    .unwrap()
    .0
}

/// With a separate log device, log blocks go there, and a crash loses no acknowledged write:
/// replay reads the chain from the log device.
#[test]
fn separate_log_device_holds_the_chain() {
    use sluice_engine::pool::{PoolSpec, TopSpec};
    let sim = Sim::new(77);
    let mut devices = legs(&sim, None);
    let slog = SimDevice::new(
        &sim.env(),
        "slog",
        SimProfile::ssd(),
        LEAF_BYTES,
        SimOptions { store_data: true, record_log: true },
    );
    devices.push(slog.clone());
    let specs = common::leaf_specs(&devices);
    let env = sim.env();
    let head_vdev = sim
        .run(async move {
            let tunables = tunables("auto", "64M");
            let spec = PoolSpec {
                name: "tank".into(),
                ashift: 12,
                top: vec![
                    TopSpec::Mirror(specs[..2].to_vec()),
                    TopSpec::Log(Box::new(TopSpec::Leaf(specs[2].clone()))),
                ],
            };
            let pool = Pool::create(&env, spec, &tunables).await.unwrap();
            let store = Arc::new(Store::create(pool, &tunables));
            store.create_volume("v", UNITS * UNIT, VOLUME_BLOCK).unwrap();
            store.sync().await.unwrap();
            let volume = Volume::open(&store, "v").unwrap();
            for unit in 0..16 {
                volume.write(unit * UNIT, &pattern(unit + 1, unit), true).await.unwrap();
            }
            store.log_head("v").unwrap().0.vdev
        })
        .unwrap()
        .0;
    assert_eq!(head_vdev, 1, "log blocks go to the log device");
    assert!(slog.stats().writes > 0 && slog.stats().flushes > 0);
    // Power off now, with the log holding every write: import and find them all.
    let images = power_cut(&devices, 1);
    let fresh = Sim::new(78);
    let revived: Vec<SimDevice> = images
        .into_iter()
        .zip(["leg0", "leg1", "slog"])
        .map(|(image, name)| {
            SimDevice::from_image(
                &fresh.env(),
                name,
                SimProfile::ssd(),
                LEAF_BYTES,
                SimOptions::default(),
                image,
            )
        })
        .collect();
    let specs = common::leaf_specs(&revived);
    let env = fresh.env();
    let replayed = fresh
        .run(async move {
            let tunables = tunables("auto", "64M");
            let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
            let store = Store::open(pool, &tunables).await.unwrap();
            for unit in 0..16 {
                let data = store.read("v", unit * UNIT, UNIT).await.unwrap();
                assert_eq!(data, pattern(unit + 1, unit), "unit {unit} after replay from the slog");
            }
            store.log_stats().records_replayed.get()
        })
        .unwrap()
        .0;
    assert_eq!(replayed, 16);
}

/// A write cache that lied about its flushes (the fault model's "flush that lies", within the
/// free-deferral window): after the writes of their last one or two txg syncs went in, the
/// leaves lose all or some of them, and every log block since, though the uberblocks that point
/// at those txgs arrived. Plain import either opens the newest txg (the lost writes did not
/// matter) or names it as damaged; import with rewind always succeeds, at a txg whose every
/// block reads back as the model says for it.
#[test]
fn lying_flushes_rewind_to_an_intact_txg() {
    let (states, rewound) = lying_flushes(&["auto", "pipelined", "batch"], 150, 0);
    assert!(states >= 1000, "{states} states");
    assert!(rewound > 0, "no crash state needed a rewind");
}

/// As [`lying_flushes_rewind_to_an_intact_txg`] on RAID-Z pools (raidz1 of 4, raidz2 of 5):
/// every leaf's cache lies over the same writes, so a block of the lost txgs may have any of
/// its columns old; the rewind still finds an intact txg.
#[test]
fn lying_flushes_on_raidz_rewind_to_an_intact_txg() {
    let mut states = 0;
    let mut rewound = 0;
    for parity in [1u8, 2] {
        let (s, r) = lying_flushes(&["auto"], 40, parity);
        states += s;
        rewound += r;
    }
    assert!(states >= 250, "{states} states");
    assert!(rewound > 0, "no crash state needed a rewind");
}

/// Runs `seeds` lying-flush workloads per policy on a mirror (`parity` 0, every fourth seed
/// swapping a disk) or a RAID-Z vdev; returns (crash states, states that rewound).
fn lying_flushes(policies: &[&str], seeds: u64, parity: u8) -> (u64, u64) {
    use sluice_format::{data_end_bytes, DATA_START_BYTES};
    let mut rewound = 0u64;
    let mut states = 0u64;
    for &policy in policies {
        for seed in 0..seeds {
            let mut rng = Rng::new(seed ^ 0x11e);
            let script = random_script(&mut rng);
            // Every fourth seed swaps a disk while the writers run (attach, replace, detach,
            // and the resilvers between).
            let run = run_workload_on(seed, policy, &script, parity == 0 && seed % 4 == 3, parity);
            let syncs: Vec<SyncRecord> =
                run.syncs.iter().copied().filter(|s| s.quiesced >= run.setup_done).collect();
            if syncs.len() < 2 {
                continue;
            }
            for _ in 0..5 {
                // The cut falls after sync `last` was durable; the lie takes the writes of its
                // last `lost` syncs.
                let last = 1 + rng.below(syncs.len() as u64 - 1) as usize;
                let lost = 1 + rng.below(2.min(last as u64)) as usize;
                let cut = syncs[last].synced;
                let lie_from = syncs[last + 1 - lost].quiesced;
                let all = rng.chance(0.5);
                let images: Vec<SimImage> = run
                    .devices
                    .iter()
                    .map(|d| {
                        let len = LEAF_BYTES;
                        let ops = d.write_log().iter().take_while(|e| e.at <= cut).count();
                        let mut coin = Rng::new(rng.u64());
                        d.crash_image_lying(ops, CrashPolicy::Any, &mut rng, |e| {
                            let data =
                                (DATA_START_BYTES..data_end_bytes(len)).contains(&e.offset_bytes);
                            data && e.at > lie_from && (all || coin.chance(0.5))
                        })
                        .unwrap()
                    })
                    .collect();
                let what =
                    format!("lying seed {seed} policy {policy} cut {cut:?} lost {lost} all {all}");
                let sim = Sim::new(seed ^ cut.0);
                let devices = legs(&sim, Some(images));
                let specs = common::leaf_specs(&devices);
                let env = sim.env();
                let tunables = tunables(policy, "1M");
                let what_in = what.clone();
                let (txg, found) = sim
                    .run(async move {
                        let pool =
                            Pool::import(&env, specs.clone(), "tank", &tunables).await.unwrap();
                        let plain = Store::check_import(&pool, ImportOptions::default()).await;
                        drop(pool);
                        if let Err(error) = &plain {
                            assert!(
                                matches!(error, sluice_engine::txg::StoreError::DamagedTxg { .. }),
                                "{what_in}: plain import failed otherwise: {error}"
                            );
                        }
                        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
                        let rewind = ImportOptions { rewind: true, ..ImportOptions::default() };
                        let (store, report) = match Store::import(pool, &tunables, rewind).await {
                            Ok(opened) => opened,
                            Err(error) => panic!("{what_in}: import with rewind failed: {error}"),
                        };
                        let mut found = Vec::new();
                        for unit in 0..UNITS {
                            found.push(store.read("v", unit * UNIT, UNIT).await.unwrap());
                        }
                        let audit = store.audit().await.unwrap();
                        assert!(audit.is_clean(), "{what_in}: {:?}", audit.problems);
                        (report.txg, found)
                    })
                    .unwrap()
                    .0;
                states += 1;
                let Some(opened) = run.syncs.iter().find(|s| s.txg == txg) else {
                    panic!("{what}: rewound to txg {txg}, which the run never synced")
                };
                assert!(txg >= syncs[last - lost].txg, "{what}: rewound past the lie to txg {txg}");
                if txg < syncs[last].txg {
                    rewound += 1;
                }
                for (unit, data) in found.iter().enumerate() {
                    let unit = unit as u64;
                    let allowed = run.ledger.allowed_rewound(unit, opened.quiesced, cut);
                    let id = if data.iter().all(|&b| b == 0) {
                        0
                    } else {
                        u64::from_le_bytes(data[..8].try_into().unwrap())
                    };
                    assert!(
                        allowed.contains(&id),
                        "{what}: txg {txg}: unit {unit} holds version {id}, allowed {allowed:?}"
                    );
                    assert_eq!(
                        *data,
                        pattern(id, unit),
                        "{what}: unit {unit} holds a damaged version"
                    );
                }
            }
        }
    }
    eprintln!("lying flushes (parity {parity}): {states} crash states, {rewound} rewound");
    (states, rewound)
}

/// Writes handed over by value (as the NBD server hands its request buffers to the volume) are
/// logged in their own buffers when they fit one record, and in copied pieces when they do
/// not; both kinds, durable by FUA or by a flush, come back from the log after a power cut.
#[test]
fn writes_handed_over_replay_after_a_crash() {
    let sim = Sim::new(91);
    let devices = legs(&sim, None);
    let specs = common::leaf_specs(&devices);
    let env = sim.env();
    // No write is logged by pointer (`immediate_write_bytes=0`), so the large one is copied in
    // pieces of at most a log block less its headers: 124 + 124 + 8 KiB.
    let tunables = || {
        Tunables::with([
            ("intent_log.policy", "auto"),
            ("txg.dirty_max", "64M"),
            ("intent_log.immediate_write_bytes", "0"),
        ])
        .unwrap()
    };
    const LARGE: u64 = 256 << 10;
    let large = || (0..LARGE).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    sim.run(async move {
        let tunables = tunables();
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        store.create_volume("v", UNITS * UNIT + LARGE, VOLUME_BLOCK).unwrap();
        store.sync().await.unwrap();
        let volume = Volume::open(&store, "v").unwrap();
        for unit in 0..16 {
            // Even units durable by FUA, odd ones by the flush below.
            volume.write_owned(unit * UNIT, pattern(unit + 1, unit), unit % 2 == 0).await.unwrap();
        }
        volume.write_owned(UNITS * UNIT, large(), false).await.unwrap();
        volume.flush().await.unwrap();
    })
    .unwrap();
    let images = power_cut(&devices, 2);
    let fresh = Sim::new(92);
    let specs = common::leaf_specs(&legs(&fresh, Some(images)));
    let env = fresh.env();
    let (replayed, indirect) = fresh
        .run(async move {
            let tunables = tunables();
            let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
            let store = Store::open(pool, &tunables).await.unwrap();
            for unit in 0..16 {
                let data = store.read("v", unit * UNIT, UNIT).await.unwrap();
                assert_eq!(data, pattern(unit + 1, unit), "unit {unit} after replay");
            }
            let got = store.read("v", UNITS * UNIT, LARGE).await.unwrap();
            assert!(got == large(), "the large write after replay");
            let stats = store.log_stats();
            (stats.records_replayed.get(), stats.indirect_records_replayed.get())
        })
        .unwrap()
        .0;
    // Every write came back from the log (no sync ran): 16 records of one piece and 3 pieces.
    assert_eq!((replayed, indirect), (19, 0));
}

/// A lone writer of large writes with a flush after each, whose last write comes in parts
/// (`Volume::write_blocks_ahead`, as the NBD server hands over a write's blocks while the rest
/// arrives): the parts' records are filled early (their blocks written in place), the last
/// part still commits early (the parts did not count as changes of their own), and after a
/// power cut the whole write comes back from the log.
#[test]
fn parts_of_a_write_filled_early_replay_after_a_crash() {
    let seed = 97;
    let sim = Sim::new(seed);
    let devices = legs(&sim, None);
    let specs = common::leaf_specs(&devices);
    let env = sim.env();
    let tunables =
        || Tunables::with([("intent_log.policy", "auto"), ("txg.dirty_max", "64M")]).unwrap();
    const LARGE: u64 = 256 << 10;
    let bs = u64::from(VOLUME_BLOCK);
    let bytes = |version: u64, len: u64| -> Vec<u8> {
        (0..len).map(|i| ((i * 11 + version * 17) % 251) as u8).collect()
    };
    let blocks = move |data: &[u8]| -> Vec<AlignedBuf> {
        data.chunks(bs as usize).map(AlignedBuf::copy_from).collect()
    };
    let last = bytes(9, LARGE);
    let expected = last.clone();
    sim.run(async move {
        let tunables = tunables();
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        store.create_volume("v", 16 * LARGE, VOLUME_BLOCK).unwrap();
        store.sync().await.unwrap();
        let volume = Volume::open(&store, "v").unwrap();
        // The pattern an early commit looks for: a write, then its flush, again and again.
        for i in 0..8 {
            volume.write_blocks(i * LARGE, blocks(&bytes(i, LARGE)), false).await.unwrap();
            volume.flush().await.unwrap();
        }
        let (fills, commits) =
            (store.log_stats().early_fills.get(), store.log_stats().early_commits.get());
        let at = 8 * LARGE;
        let (first, rest) = last.split_at(LARGE as usize / 4);
        let (second, rest) = rest.split_at(LARGE as usize / 4);
        volume.write_blocks_ahead(at, blocks(first)).await.unwrap();
        volume.write_blocks_ahead(at + first.len() as u64, blocks(second)).await.unwrap();
        volume.write_blocks(at + LARGE / 2, blocks(rest), false).await.unwrap();
        assert_eq!(store.log_stats().early_fills.get(), fills + 2, "each part filled early");
        assert_eq!(store.log_stats().early_commits.get(), commits + 1, "the last part's");
        volume.flush().await.unwrap();
    })
    .unwrap();
    let images = power_cut(&devices, 5);
    let fresh = Sim::new(seed + 1);
    let specs = common::leaf_specs(&legs(&fresh, Some(images)));
    let env = fresh.env();
    fresh
        .run(async move {
            let tunables = tunables();
            let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
            let store = Store::open(pool, &tunables).await.unwrap();
            let got = store.read("v", 8 * LARGE, LARGE).await.unwrap();
            assert!(got == expected, "the write in parts, after replay");
            assert!(store.log_stats().indirect_records_replayed.get() > 0, "replayed by pointer");
        })
        .unwrap();
}

/// Writes received a buffer per block (`Volume::write_blocks`, as the NBD server receives a
/// write of whole blocks) become their blocks as they are, and are logged like any other: by
/// pointer when large, or copied into records whose pieces span several of the buffers. Both,
/// made durable by FUA or a flush, come back from the log after a power cut, byte for byte.
#[test]
fn writes_received_as_blocks_replay_after_a_crash() {
    for (seed, by_pointer) in [(93, true), (95, false)] {
        let sim = Sim::new(seed);
        let devices = legs(&sim, None);
        let specs = common::leaf_specs(&devices);
        let env = sim.env();
        // Logged by pointer from 64 KiB (the 128 KiB writes below); with 0, nothing is, and
        // the 128 KiB write is copied in pieces of at most a log block less its headers.
        let immediate = if by_pointer { "64K" } else { "0" };
        let tunables = move || {
            Tunables::with([
                ("intent_log.policy", "auto"),
                ("txg.dirty_max", "64M"),
                ("intent_log.immediate_write_bytes", immediate),
            ])
            .unwrap()
        };
        const LARGE: u64 = 128 << 10;
        let bs = u64::from(VOLUME_BLOCK);
        let bytes = |version: u64, len: u64| -> Vec<u8> {
            (0..len).map(|i| ((i * 7 + version * 13) % 253) as u8).collect()
        };
        let blocks = move |data: &[u8]| -> Vec<AlignedBuf> {
            data.chunks(bs as usize).map(AlignedBuf::copy_from).collect()
        };
        sim.run(async move {
            let tunables = tunables();
            let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
            store.create_volume("v", 4 * LARGE, VOLUME_BLOCK).unwrap();
            store.sync().await.unwrap();
            let volume = Volume::open(&store, "v").unwrap();
            assert_eq!(volume.whole_blocks(bs, bs), Some(bs as usize));
            assert_eq!(volume.whole_blocks(bs / 2, bs), None, "not on a block boundary");
            assert_eq!(volume.whole_blocks(0, bs / 2), None, "less than a block");
            // One block by FUA; a large write made durable by the flush; the large one written
            // over again in part.
            volume.write_blocks(0, blocks(&bytes(1, bs)), true).await.unwrap();
            volume.write_blocks(LARGE, blocks(&bytes(2, LARGE)), false).await.unwrap();
            volume.write_blocks(LARGE + 2 * bs, blocks(&bytes(3, 4 * bs)), false).await.unwrap();
            volume.flush().await.unwrap();
        })
        .unwrap();
        let images = power_cut(&devices, 3);
        let fresh = Sim::new(seed + 1);
        let specs = common::leaf_specs(&legs(&fresh, Some(images)));
        let env = fresh.env();
        let indirect = fresh
            .run(async move {
                let tunables = tunables();
                let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
                let store = Store::open(pool, &tunables).await.unwrap();
                assert!(store.read("v", 0, bs).await.unwrap() == bytes(1, bs), "the FUA write");
                let mut large = bytes(2, LARGE);
                large[2 * bs as usize..6 * bs as usize].copy_from_slice(&bytes(3, 4 * bs));
                let got = store.read("v", LARGE, LARGE).await.unwrap();
                assert!(got == large, "the large write and the one over it, after replay");
                store.log_stats().indirect_records_replayed.get()
            })
            .unwrap()
            .0;
        // Logged by pointer: a record per block of the 128 KiB write; copied: none.
        let expected = if by_pointer { LARGE / bs } else { 0 };
        assert_eq!(indirect, expected, "records logged by pointer (by_pointer {by_pointer})");
    }
}
