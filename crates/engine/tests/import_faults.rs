//! Import under faults: an intent log that cannot be read, and a newest txg that does not
//! verify. Neither may lose an acknowledged write silently. An unreadable log block fails the
//! import (naming pool, volume and block) and changes nothing, so the import that follows
//! once the fault clears replays every record; an explicit option drops the unreadable part
//! and says what was lost. A damaged newest txg is named, with the way out: a rewind to the
//! newest txg whose whole tree verifies, which a dry run reports without writing anything.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::device::sim::{CrashPolicy, Fault, SimOptions};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::intent_log::{read_chain, LogAddress};
use sluice_engine::pool::{LeafSpec, Pool};
use sluice_engine::rt::Env;
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::txg::{ImportOptions, Store, StoreError};
use sluice_engine::volume::Volume;
use sluice_format::{LogVerifier, PoolDirectory};
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;
const UNIT: u64 = 4096;
/// FUA writes to volume "v" after the last sync: each is its own log block.
const LOGGED: u64 = 6;

fn unit(version: u8, index: u64) -> Vec<u8> {
    let mut out = vec![version; UNIT as usize];
    out[..8].copy_from_slice(&index.to_le_bytes());
    out
}

fn two_legs(sim: &Sim) -> Vec<SimDevice> {
    let options = SimOptions { store_data: true, record_log: false };
    common::legs_with(sim, 2, SimProfile::ssd(), LEAF_BYTES, options)
}

/// A pool with volumes "v" and "w": unit 0 of each synced, then `LOGGED` FUA writes to "v"
/// acknowledged through its log only, then a power cut that drops every unflushed write.
fn logged_writes_then_crash(sim: &Sim, legs: &[SimDevice]) {
    let env = sim.env();
    let specs = common::leaf_specs(legs);
    let crash_legs = legs.to_vec();
    sim.run(async move {
        let tunables = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        store.create_volume("v", 1 << 20, 4096).unwrap();
        store.create_volume("w", 1 << 20, 4096).unwrap();
        store.write("v", 0, &unit(1, 0)).await.unwrap();
        store.write("w", 0, &unit(1, 0)).await.unwrap();
        store.sync().await.unwrap();
        let v = Volume::open(&store, "v").unwrap();
        for i in 1..=LOGGED {
            v.write(i * UNIT, &unit(2, i), true).await.unwrap();
        }
        drop(v);
        drop(store);
        for leg in &crash_legs {
            leg.crash(CrashPolicy::DropAll);
        }
    })
    .unwrap();
}

/// Where each block of volume "v"'s log chain is, read from the directory (a read-only walk).
async fn chain_of_v(env: &Env, specs: Vec<LeafSpec>) -> Vec<LogAddress> {
    let pool = Pool::import(env, specs, "tank", &Tunables::default()).await.unwrap();
    let root = pool.uberblock().root.unwrap();
    let directory =
        PoolDirectory::decode(&pool.read_block(&root, IoClass::SyncRead).await.unwrap()).unwrap();
    let entry = directory.volumes.iter().find(|v| v.name == "v").unwrap();
    let header = entry.log.unwrap();
    let verifier = LogVerifier {
        chain_id: header.chain_id,
        volume_id: entry.id,
        sequence: header.head_sequence,
    };
    let chain = read_chain(&pool, LogAddress::from_pointer(&header.head), verifier).await.unwrap();
    assert_eq!(chain.blocks.len() as u64, LOGGED, "one log block per FUA write");
    chain.addresses
}

fn eio_at(address: LogAddress) -> Fault {
    Fault::ReadError { offset_bytes: address.offset_bytes, len_bytes: u64::from(address.len_bytes) }
}

async fn import(
    env: &Env,
    specs: Vec<LeafSpec>,
    options: ImportOptions,
) -> Result<(Store, sluice_engine::txg::ImportReport), StoreError> {
    let tunables = Tunables::default();
    let pool = Pool::import(env, specs, "tank", &tunables).await.unwrap();
    Store::import(pool, &tunables, options).await
}

/// Checks that the logged units 1..=`replayed` of volume "v" hold their FUA write and the
/// later ones are zeros (their records were dropped).
async fn assert_logged_units(store: &Store, replayed: u64, what: &str) {
    for i in 1..=LOGGED {
        let data = store.read("v", i * UNIT, UNIT).await.unwrap();
        let expected = if i <= replayed { unit(2, i) } else { vec![0; UNIT as usize] };
        assert_eq!(data, expected, "{what}: unit {i}");
    }
}

/// EIO on both copies of a log block: the import fails, naming the pool, the volume and the
/// block, and writes nothing. Once the fault clears, import replays every record.
#[test]
fn unreadable_log_block_fails_import_until_it_clears() {
    let sim = Sim::new(31);
    let legs = two_legs(&sim);
    logged_writes_then_crash(&sim, &legs);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let legs_in = legs.clone();
    sim.run(async move {
        let chain = chain_of_v(&env, specs.clone()).await;
        for leg in &legs_in {
            leg.inject(eio_at(chain[2]));
        }
        let writes_before: u64 = legs_in.iter().map(|l| l.stats().writes).sum();
        let error = match import(&env, specs.clone(), ImportOptions::default()).await {
            Ok(_) => panic!("import went ahead past an unreadable log block"),
            Err(error) => error,
        };
        let message = error.to_string();
        assert!(matches!(error, StoreError::UnreadableLog { .. }), "{message}");
        assert!(message.contains("pool tank, volume v"), "{message}");
        assert!(message.contains("log block 2 of the chain"), "{message}");
        assert!(message.contains(&format!("offset {}", chain[2].offset_bytes)), "{message}");
        assert!(message.contains("discarding the unreadable part of the log"), "{message}");
        let writes_after: u64 = legs_in.iter().map(|l| l.stats().writes).sum();
        assert_eq!(writes_before, writes_after, "a failed import wrote");
        // The fault clears (a cable reseated): every acknowledged write comes back.
        for leg in &legs_in {
            leg.clear_faults();
        }
        let (store, report) = import(&env, specs, ImportOptions::default()).await.unwrap();
        assert_eq!(report.records_to_replay, LOGGED);
        assert_eq!(store.log_stats().records_replayed.get(), LOGGED);
        assert_logged_units(&store, LOGGED, "after the fault cleared").await;
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

/// EIO on one copy: the other copy is read, the bad one rewritten, nothing lost.
#[test]
fn log_block_unreadable_on_one_copy_heals_from_the_other() {
    let sim = Sim::new(32);
    let legs = two_legs(&sim);
    logged_writes_then_crash(&sim, &legs);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let legs_in = legs.clone();
    sim.run(async move {
        let chain = chain_of_v(&env, specs.clone()).await;
        // Each block unreadable on one leg, alternating, so whichever leg a read tries first
        // some blocks need the other copy.
        for (i, address) in chain.iter().enumerate() {
            legs_in[i % 2].inject(eio_at(*address));
        }
        let (store, report) = import(&env, specs, ImportOptions::default()).await.unwrap();
        assert_eq!(report.records_to_replay, LOGGED);
        assert!(report.lost_logs.is_empty());
        assert_logged_units(&store, LOGGED, "healed").await;
        let repairs: u64 = store.pool().leaves().iter().map(|l| l.leaf.stats().repairs.get()).sum();
        assert!(repairs >= LOGGED / 2, "only {repairs} unreadable copies were rewritten");
    })
    .unwrap();
}

/// `discard_unreadable_log`: the chain replays up to the unreadable block, and the report says
/// which volume lost what. A dry run says the same and writes nothing. Other volumes keep
/// everything.
#[test]
fn discarding_an_unreadable_log_reports_what_was_lost() {
    let sim = Sim::new(33);
    let legs = two_legs(&sim);
    logged_writes_then_crash(&sim, &legs);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let legs_in = legs.clone();
    sim.run(async move {
        let chain = chain_of_v(&env, specs.clone()).await;
        for leg in &legs_in {
            leg.inject(eio_at(chain[3]));
        }
        let options = ImportOptions { discard_unreadable_log: true, ..ImportOptions::default() };
        let tunables = Tunables::default();
        let pool = Pool::import(&env, specs.clone(), "tank", &tunables).await.unwrap();
        let writes_before: u64 = legs_in.iter().map(|l| l.stats().writes).sum();
        let dry = Store::check_import(&pool, options).await.unwrap();
        let writes_after: u64 = legs_in.iter().map(|l| l.stats().writes).sum();
        assert_eq!(writes_before, writes_after, "a dry run wrote");
        drop(pool);
        let (store, report) = import(&env, specs, options).await.unwrap();
        assert_eq!(dry, report, "the dry run reported something else than the import did");
        assert_eq!(report.lost_logs.len(), 1, "{report:?}");
        let lost = &report.lost_logs[0];
        assert_eq!(lost.volume, "v");
        assert_eq!(lost.records_replayed, 3, "blocks 0..3 hold one record each");
        // Sequence 1 was the synced write; the FUA writes took 2, 3, 4 (replayed), 5...
        assert_eq!(lost.first_lost_sequence, 5);
        assert!(lost.block.contains("log block 3 of the chain"), "{}", lost.block);
        assert_logged_units(&store, 3, "log discarded from block 3").await;
        assert_eq!(store.read("w", 0, UNIT).await.unwrap(), unit(1, 0), "volume w");
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

/// Which block of the newest txg a test damages.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// The pool directory the newest uberblock points at.
    Directory,
    /// A data block the newest txg wrote.
    DataBlock,
}

/// Three txgs a virtual second or more apart, each with its own version of volume "v"'s first
/// 64 KiB; then a power cut and, on both copies, damage to a block of the newest txg.
/// Returns the txg numbers.
fn three_txgs_then_damage(sim: &Sim, legs: &[SimDevice], target: Target) -> [u64; 3] {
    let env = sim.env();
    let specs = common::leaf_specs(legs);
    let crash_legs = legs.to_vec();
    let txgs = sim
        .run(async move {
            let tunables = Tunables::default();
            let store = common::mirror_store(&env, specs.clone(), &tunables).await;
            store.create_volume("v", 1 << 20, 16384).unwrap();
            let mut txgs = [0; 3];
            for (version, txg) in txgs.iter_mut().enumerate() {
                env.sleep(Duration::from_secs(2)).await;
                store.write("v", 0, &vec![version as u8 + 1; 64 << 10]).await.unwrap();
                *txg = store.sync().await.unwrap();
            }
            drop(store);
            for leg in &crash_legs {
                leg.crash(CrashPolicy::DropAll);
            }
            let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
            let root = pool.uberblock().root.unwrap();
            let damaged = match target {
                Target::Directory => root,
                Target::DataBlock => {
                    let bytes = pool.read_block(&root, IoClass::SyncRead).await.unwrap();
                    let directory = PoolDirectory::decode(&bytes).unwrap();
                    let entry = &directory.volumes[0];
                    let bp = sluice_engine::objset::data_block_pointer(
                        &pool,
                        entry.root,
                        entry.levels,
                        2,
                    )
                    .await
                    .unwrap()
                    .unwrap();
                    assert_eq!(bp.birth_txg, txgs[2], "the newest txg wrote this block");
                    bp
                }
            };
            // Every copy: metadata has more than one (`pool.metadata_copies`).
            for leg in &crash_legs {
                for dva in damaged.copies() {
                    leg.inject(Fault::BitFlip { offset_bytes: dva.offset_bytes() + 100, bit: 1 });
                }
            }
            txgs
        })
        .unwrap()
        .0;
    txgs
}

/// A newest txg that verifies on no copy: plain import names it and the rewind option; a dry
/// run reports the txg a rewind opens and the seconds lost, writing nothing; the rewind opens
/// the txg before, and later imports do not return to the damaged one.
fn damaged_newest_txg_rewinds(target: Target, seed: u64) {
    let sim = Sim::new(seed);
    let legs = two_legs(&sim);
    let [_, second, third] = three_txgs_then_damage(&sim, &legs, target);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let legs_in = legs.clone();
    sim.run(async move {
        let tunables = Tunables::default();
        let writes = || legs_in.iter().map(|l| l.stats().writes).sum::<u64>();
        let before = writes();
        let error = match import(&env, specs.clone(), ImportOptions::default()).await {
            Ok(_) => panic!("{target:?}: a damaged newest txg imported"),
            Err(error) => error,
        };
        let message = error.to_string();
        assert!(matches!(error, StoreError::DamagedTxg { txg, .. } if txg == third), "{message}");
        assert!(
            message.contains(&format!("txg {third}")) && message.contains("with a rewind"),
            "{message}"
        );
        let rewind = ImportOptions { rewind: true, ..ImportOptions::default() };
        let pool = Pool::import(&env, specs.clone(), "tank", &tunables).await.unwrap();
        let dry = Store::check_import(&pool, rewind).await.unwrap();
        drop(pool);
        assert_eq!(writes(), before, "{target:?}: the plain import or the dry run wrote");
        assert_eq!(dry.txg, second, "{target:?}: {dry:?}");
        let rewound = dry.rewound.clone().unwrap();
        assert_eq!((rewound.from_txg, rewound.txgs_lost), (third, 1));
        assert!(rewound.seconds_lost >= 2, "{rewound:?}");
        let (store, report) = import(&env, specs.clone(), rewind).await.unwrap();
        assert_eq!(report, dry);
        assert_eq!(store.read("v", 0, 64 << 10).await.unwrap(), vec![2; 64 << 10]);
        assert!(store.audit().await.unwrap().is_clean());
        // Life goes on from there: later txgs, and an import that does not go back to the
        // damaged txg even though its number was higher.
        for leg in &legs_in {
            leg.clear_faults();
        }
        store.write("v", 65536, &vec![9; 4096]).await.unwrap();
        store.sync().await.unwrap();
        store.export().await.unwrap();
        let (store, report) = import(&env, specs, ImportOptions::default()).await.unwrap();
        assert!(report.rewound.is_none());
        assert_eq!(report.txg, second + 3, "the import's sync, the write's and the export's");
        assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![2; 4096]);
        assert_eq!(store.read("v", 65536, 4096).await.unwrap(), vec![9; 4096]);
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

#[test]
fn damaged_directory_of_the_newest_txg_rewinds() {
    damaged_newest_txg_rewinds(Target::Directory, 41);
}

#[test]
fn damaged_data_block_of_the_newest_txg_rewinds() {
    damaged_newest_txg_rewinds(Target::DataBlock, 42);
}

/// A log write that reaches one leg of a mirror only. It used to be acknowledged (any child
/// sufficed), so an import that found only the other leg read a block that was never written
/// there, took it for the end of the chain, and dropped the acknowledged write without a word.
/// Now a log block must reach every child that is not faulted, else the commit falls back to
/// a txg sync: an import from the leg that missed writes either returns the write or refuses,
/// naming what is damaged; it never answers with the old data.
#[test]
fn a_log_write_that_missed_a_leg_is_never_lost_silently() {
    log_write_missing_a_leg(34, UNIT as usize, &[]);
}

/// As above, for a write copied into several log blocks of one batch (256 KiB, copied, in
/// blocks of at most 64 KiB): each is written durably on every child that is not faulted, as a
/// lone one is, never written plainly and then flushed once, which one child sufficed for.
#[test]
fn a_batch_of_log_blocks_that_missed_a_leg_is_never_lost_silently() {
    let copied = [
        ("intent_log.policy", "batch"),
        ("intent_log.immediate_write_bytes", "1M"),
        ("intent_log.block_bytes_max", "64K"),
    ];
    log_write_missing_a_leg(36, 256 << 10, &copied);
}

/// As above, for a write logged by pointer (1 MiB: its blocks are written in place and the log
/// block points at them): on a mirror both are written on every child that is not faulted, as
/// a log block alone is, never a write and a flush that one child sufficed for.
#[test]
fn a_write_logged_by_pointer_that_missed_a_leg_is_never_lost_silently() {
    log_write_missing_a_leg(35, 1 << 20, &[]);
}

/// A leg whose flushes fail takes a txg's writes (they succeed) but cannot make them durable,
/// and a mirror's flush succeeds when one child did: the failed flushes count as writes the
/// leg missed, so the pool stops counting it whole for the txg and a resilver brings it up to
/// date. Without that, its uberblocks claimed txgs whose blocks its cache had lost. Once
/// resilvered, the leg alone holds the writes through a power cut.
#[test]
fn a_leg_whose_flushes_fail_is_resilvered_not_trusted() {
    let tunables = Tunables::with([("vdev.io_errors_max", "1000000")]).unwrap();
    let sim = Sim::new(37);
    let legs = two_legs(&sim);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let faulty = legs.clone();
    let len = 1usize << 20;
    let written: Vec<u8> = (0..len).map(|i| (i / 4096 + 5) as u8).collect();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &tunables).await);
        store.create_volume("v", 4 << 20, 4096).unwrap();
        store.sync().await.unwrap();
        let v = Volume::open(&store, "v").unwrap();
        v.write(0, &written, false).await.unwrap();
        store.sync().await.unwrap();
        assert!(store.pool().leaves_behind().is_empty(), "both legs whole before the fault");
        faulty[0].inject(Fault::FlushError);
        v.write(len as u64, &written, false).await.unwrap();
        store.sync().await.unwrap();
        let behind: Vec<u64> = store.pool().leaves_behind().iter().map(|b| b.0).collect();
        assert_eq!(behind.len(), 1, "the leg whose flushes failed is behind");
        faulty[0].clear_faults();
        for _ in 0..1000 {
            store.resilver_if_needed();
            store.wait_scan().await;
            if store.pool().leaves_behind().is_empty() {
                break;
            }
            env.sleep(Duration::from_millis(1)).await;
        }
        assert!(store.pool().leaves_behind().is_empty(), "the leg was resilvered");
        // The resilver's copies are made durable by the next sync's flushes, as a txg's are.
        store.sync().await.unwrap();
        drop(v);
        drop(store);
        for leg in &faulty {
            leg.crash(CrashPolicy::DropAll);
        }
        let only_leg0 = vec![specs[0].clone()];
        let pool = Pool::import(&env, only_leg0, "tank", &tunables).await.unwrap();
        let store = Store::open(pool, &tunables).await.unwrap();
        for at in 0..2u64 {
            let data = store.read("v", at * len as u64, len as u64).await.unwrap();
            assert!(data[..] == written[..], "write {at} read back from the resilvered leg");
        }
    })
    .unwrap();
}

fn log_write_missing_a_leg(seed: u64, len: usize, settings: &[(&str, &str)]) {
    use sluice_format::{data_end_bytes, DATA_START_BYTES};
    // The diagnosis would fault leg 0 for its write errors within the one sync below, and a
    // faulted leg gets no uberblocks (a leg that may hang is not waited for): imported alone
    // later, it opens the txg before, where the write is not. This test is about the log's
    // rule, so the threshold is out of reach.
    let mut all = vec![("vdev.io_errors_max", "1000000")];
    all.extend_from_slice(settings);
    let tunables = Tunables::with(all).unwrap();
    let sim = Sim::new(seed);
    let legs = two_legs(&sim);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let crash_legs = legs.clone();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &tunables).await);
        store.create_volume("v", 4 << 20, 4096).unwrap();
        store.sync().await.unwrap();
        let written: Vec<u8> = (0..len).map(|i| (i / 4096 + 9) as u8).collect();
        // Leg 0 stops taking data-area writes (labels still work): a failing stretch of disk.
        let data = DATA_START_BYTES..data_end_bytes(LEAF_BYTES);
        crash_legs[0].inject(Fault::WriteError {
            offset_bytes: data.start,
            len_bytes: data.end - data.start,
        });
        let v = Volume::open(&store, "v").unwrap();
        v.write(0, &written, true).await.unwrap();
        drop(v);
        drop(store);
        for leg in &crash_legs {
            leg.crash(CrashPolicy::DropAll);
            leg.clear_faults();
        }
        // Leg 1 is gone; import from leg 0 alone.
        let only_leg0 = vec![specs[0].clone()];
        let pool = Pool::import(&env, only_leg0, "tank", &tunables).await.unwrap();
        match Store::open(pool, &tunables).await {
            Ok(store) => {
                let data = store.read("v", 0, len as u64).await;
                assert!(
                    matches!(&data, Ok(d) if **d == written[..]) || data.is_err(),
                    "the acknowledged write was replaced by old data: {:?}",
                    data.map(|d| d[..16].to_vec())
                );
            }
            Err(error) => assert!(
                matches!(error, StoreError::DamagedTxg { .. } | StoreError::UnreadableLog { .. }),
                "{error}"
            ),
        }
    })
    .unwrap();
}
