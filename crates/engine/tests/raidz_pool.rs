//! Pools on RAID-Z: a raidz1 of 4 and a raidz2 of 6 with volumes of 4K, 16K and 128K blocks.
//! Every block reads back with one (two) leaves missing, with one (two) leaves returning
//! garbage, and with a leaf's sectors bit-flipped at random; scrub repairs everything and a
//! second scrub finds nothing; the pool imports and reads back with one (two) leaves gone.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::sim::Fault;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{Pool, PoolSpec, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_engine::LeafState;
use sluice_format::raidz::RaidzLayout;
use sluice_format::DATA_START_BYTES;
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const VOLUME_BYTES: u64 = 2 << 20;

/// The block cache off: these tests are about what reads find on the devices.
fn uncached() -> Tunables {
    Tunables::with([("cache.bytes_max", "0")]).expect("valid tunables")
}

const SHAPES: [(usize, u8); 2] = [(4, 1), (6, 2)];
const BLOCKS: [u32; 3] = [4096, 16384, 131072];

fn setup(
    seed: u64,
    width: usize,
    parity: u8,
    block: u32,
) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, width, SimProfile::Instant, LEG_BYTES);
    let data = common::random_bytes(seed, VOLUME_BYTES);
    let store = common::store_with_volume(
        &sim,
        &legs,
        |leaves| TopSpec::Raidz { parity, leaves },
        &uncached(),
        &data,
        block,
        |_| {},
    );
    (sim, legs, store, data)
}

/// Imports pool "tank" from `devices` and opens its store, without the block cache.
fn import(sim: &Sim, devices: &[SimDevice]) -> Arc<Store> {
    let (specs, env) = (common::leaf_specs(devices), sim.env());
    sim.run(async move {
        let pool = Pool::import(&env, specs, "tank", &uncached()).await.expect("imports");
        Arc::new(Store::open(pool, &uncached()).await.expect("opens"))
    })
    .expect("the sim runs")
    .0
}

fn scrub(sim: &Sim, store: &Arc<Store>) -> sluice_engine::pool::ScrubReport {
    let s = Arc::clone(store);
    sim.run(async move { s.pool().scrub().await.expect("the scrub runs") }).expect("the sim runs").0
}

fn what(width: usize, parity: u8, block: u32) -> String {
    format!("raidz{parity} of {width}, {}K blocks", block / 1024)
}

/// Every block reads back with `parity` leaves offline, each set of them in turn.
#[test]
fn volumes_read_back_with_leaves_missing() {
    for (width, parity) in SHAPES {
        for block in BLOCKS {
            let (sim, _legs, store, data) =
                setup(u64::from(block) + width as u64, width, parity, block);
            let name = what(width, parity, block);
            assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}");
            for first in 0..width {
                let gone: Vec<usize> =
                    (0..usize::from(parity)).map(|i| (first + i) % width).collect();
                let leaves = store.pool().leaves();
                for &g in &gone {
                    leaves[g].leaf.set_state(LeafState::Offline);
                }
                assert_eq!(
                    common::read_all(&sim, &store, &data, block),
                    (0, 0),
                    "{name}, leaves {gone:?} offline"
                );
                for &g in &gone {
                    leaves[g].leaf.set_state(LeafState::Online);
                }
            }
        }
    }
}

/// Leaves returning another place's bytes (as many as the parity) are found out by the
/// checksums, counted and rewritten; a scrub then finds only what reads did not touch (parity,
/// metadata copies) and a second scrub finds nothing.
#[test]
fn garbage_leaves_heal_and_scrub_comes_clean() {
    for (width, parity) in SHAPES {
        for block in BLOCKS {
            let (sim, legs, store, data) = setup(7 + u64::from(block), width, parity, block);
            let name = what(width, parity, block);
            for leg in legs.iter().take(usize::from(parity)) {
                leg.inject(Fault::Misdirect {
                    offset_bytes: DATA_START_BYTES,
                    len_bytes: 16 << 20,
                    from_offset_bytes: DATA_START_BYTES + (24 << 20),
                });
            }
            assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}: garbage");
            let report = scrub(&sim, &store);
            assert!(report.unrecoverable.is_empty(), "{name}: {report:?}");
            assert_eq!(report.repaired, report.errors, "{name}: the scrub repaired what it found");
            // Counted by the reads or, for a leaf whose garbage only parity columns met (where
            // a small block's columns fall depends on the layout), by the scrub.
            let leaves = store.pool().leaves();
            for (i, leaf) in leaves.iter().enumerate() {
                let errors = leaf.leaf.stats().checksum_errors.get();
                if i < usize::from(parity) {
                    assert!(errors > 0, "{name}: leaf {i} returned garbage and is counted");
                } else {
                    assert_eq!(errors, 0, "{name}: leaf {i} held good columns");
                }
            }
            for leg in &legs {
                leg.clear_faults();
            }
            let second = scrub(&sim, &store);
            assert_eq!((second.errors, second.repaired), (0, 0), "{name}: a second scrub is clean");
            assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}: after");
        }
    }
}

/// Bits flipped at random over a leaf's data area (two leaves' on raidz2) are healed by
/// reads and scrub.
#[test]
fn random_bit_flips_heal() {
    for (width, parity) in SHAPES {
        let block = 16384;
        let (sim, legs, store, data) = setup(31 + width as u64, width, parity, block);
        let name = what(width, parity, block);
        let mut x = 0x9E37_79B9_u64 + width as u64;
        for leg in legs.iter().take(usize::from(parity)) {
            for _ in 0..2000 {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let offset = DATA_START_BYTES + (x >> 20) % (2 << 20);
                leg.inject(Fault::BitFlip { offset_bytes: offset, bit: (x & 7) as u8 });
            }
        }
        assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}: bit flips");
        let report = scrub(&sim, &store);
        assert!(report.unrecoverable.is_empty(), "{name}: {report:?}");
        for leg in &legs {
            leg.clear_faults();
        }
        let second = scrub(&sim, &store);
        assert_eq!((second.errors, second.repaired), (0, 0), "{name}: a second scrub is clean");
    }
}

/// Exported and imported with `parity` leaves gone, the pool opens and every block reads back;
/// with one more gone, import refuses and names them.
#[test]
fn imports_with_up_to_parity_leaves_gone() {
    for (width, parity) in SHAPES {
        let block = 16384;
        let (sim, legs, store, data) = setup(51 + width as u64, width, parity, block);
        let name = what(width, parity, block);
        drop(store);
        let keep = width - usize::from(parity);
        let store = import(&sim, &legs[..keep]);
        assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}: degraded");
        drop(store);
        let specs = common::leaf_specs(&legs[..keep - 1]);
        let env = sim.env();
        let refused = sim
            .run(async move { Pool::import(&env, specs, "tank", &uncached()).await.err() })
            .expect("the sim runs")
            .0
            .expect("too many leaves gone");
        let message = refused.to_string();
        let missing_count = usize::from(parity) + 1;
        assert!(
            message.contains(&format!("has {missing_count} of its leaves missing"))
                && message.contains("until 1 of them is found again"),
            "{name}: {message}"
        );
    }
}

fn spec(device: &SimDevice) -> sluice_engine::pool::LeafSpec {
    common::leaf_specs(std::slice::from_ref(device)).remove(0)
}

fn paths(store: &Store) -> Vec<String> {
    store.pool().leaves().iter().map(|l| l.path.clone()).collect()
}

/// A leaf that fails every write is faulted; `pool replace` puts a new device in its column
/// while writes go on: the new leaf is resilvered, the old one detached, and with `parity`
/// other leaves lost every block still reads back, also after an import: the new leaf holds
/// its column.
#[test]
fn replace_a_faulted_leaf_under_writes() {
    for (width, parity) in SHAPES {
        let block = 16384;
        let sim = Sim::new(71 + width as u64);
        let legs = common::legs(&sim, width + 1, SimProfile::ssd(), LEG_BYTES);
        let mut data = common::random_bytes(3, VOLUME_BYTES);
        let store = common::store_with_volume(
            &sim,
            &legs[..width],
            |leaves| TopSpec::Raidz { parity, leaves },
            &uncached(),
            &data,
            block,
            |_| {},
        );
        let name = what(width, parity, block);
        legs[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: LEG_BYTES });
        common::overwrite(&sim, &store, &mut data, 6, 0x51);
        assert!(
            matches!(store.pool().leaves()[1].leaf.state(), LeafState::Faulted(_)),
            "{name}: the failing leaf is faulted"
        );
        let s = Arc::clone(&store);
        let new = spec(&legs[width]);
        sim.run(async move { s.replace_leaf("leg1", new).await.expect("replace starts") })
            .expect("the sim runs");
        common::overwrite(&sim, &store, &mut data, 4, 0x61);
        let s = Arc::clone(&store);
        sim.run(async move {
            for _ in 0..4 {
                s.resume_scan();
                s.wait_scan().await;
                s.detach_replaced().await;
            }
        })
        .expect("the sim runs");
        let mut expected: Vec<String> = (0..width).map(|i| format!("leg{i}")).collect();
        expected[1] = format!("leg{width}");
        assert_eq!(paths(&store), expected, "{name}: the new leaf took the column");
        // The new leaf and all but `parity` of the others: every block is there.
        for leg in &legs[2..2 + usize::from(parity)] {
            leg.inject(Fault::Lost);
        }
        assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}: after replace");
        drop(store);
        let mut present = vec![legs[0].clone(), legs[width].clone()];
        present.extend(legs[2 + usize::from(parity)..width].iter().cloned());
        for leg in &legs {
            leg.clear_faults();
        }
        let store = import(&sim, &present);
        assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{name}: imported");
    }
}

/// Attaching to a RAID-Z child is refused (that would be expansion); detaching one that is
/// not being replaced is too.
#[test]
fn attach_and_detach_of_a_raidz_child_are_refused() {
    let sim = Sim::new(81);
    let legs = common::legs(&sim, 5, SimProfile::Instant, LEG_BYTES);
    let data = common::random_bytes(4, 1 << 20);
    let store = common::store_with_volume(
        &sim,
        &legs[..4],
        |leaves| TopSpec::Raidz { parity: 1, leaves },
        &uncached(),
        &data,
        16384,
        |_| {},
    );
    let s = Arc::clone(&store);
    let new = spec(&legs[4]);
    let (attach, detach) = sim
        .run(async move {
            let attach = s.attach_leaf("leg0", new).await.err().map(|e| e.to_string());
            let detach = s.detach_leaf("leg0").await.err().map(|e| e.to_string());
            (attach, detach)
        })
        .expect("the sim runs")
        .0;
    let attach = attach.expect("attach is refused");
    assert!(attach.contains("RAID-Z expansion"), "{attach}");
    assert!(detach.is_some(), "detaching a RAID-Z child is refused");
    assert_eq!(paths(&store), ["leg0", "leg1", "leg2", "leg3"]);
}

/// Every thick volume of a RAID-Z pool, as many as its space reserves, takes its whole size
/// of incompressible data, twice over: its reservation counted the parity and padding its
/// block size costs.
#[test]
fn thick_volumes_fill_without_enospc() {
    for (width, parity) in SHAPES {
        let sim = Sim::new(91 + width as u64);
        let legs = common::legs(&sim, width, SimProfile::Instant, LEG_BYTES);
        let specs = common::leaf_specs(&legs);
        let env = sim.env();
        let name = format!("raidz{parity} of {width}");
        let made = sim
            .run(async move {
                let spec = sluice_engine::pool::PoolSpec {
                    name: "tank".into(),
                    ashift: 12,
                    top: vec![TopSpec::Raidz { parity, leaves: specs }],
                };
                let pool = Pool::create(&env, spec, &uncached()).await.expect("creates");
                let store = Arc::new(Store::create(pool, &uncached()));
                // Volumes of each block size, until the pool reserves no more.
                let mut volumes = Vec::new();
                'fill: for round in 0.. {
                    for block in BLOCKS {
                        let volume = format!("v{round}-{}k", block / 1024);
                        let size = 8u64 << 20;
                        if store.create_volume_with(&volume, size, block, true).is_err() {
                            break 'fill;
                        }
                        volumes.push((volume, size, block));
                    }
                }
                for pass in 0..2u64 {
                    for (i, (volume, size, _)) in volumes.iter().enumerate() {
                        let bytes = common::random_bytes(pass * 1000 + i as u64, *size);
                        for (at, piece) in bytes.chunks(1 << 20).enumerate() {
                            store
                                .write(volume, at as u64 * (1 << 20), piece)
                                .await
                                .unwrap_or_else(|e| panic!("{volume} pass {pass}: {e}"));
                        }
                    }
                    store.sync().await.unwrap_or_else(|e| panic!("sync after pass {pass}: {e}"));
                }
                volumes.len()
            })
            .expect("the sim runs")
            .0;
        assert!(made >= 3, "{name}: {made} thick volumes made");
    }
}

/// Power cuts at points spread over the resilver of a RAID-Z leaf that was offline while
/// blocks were written, with syncs going on: each import finds a pool whose blocks all read
/// back (the leaf still behind is read around), serving finishes the resilver, and then, with
/// `parity` other leaves lost, every block still reads back: the resilvered leaf holds its
/// columns.
#[test]
fn power_cuts_during_a_raidz_resilver() {
    use sluice_engine::device::sim::{CrashPolicy, SimOptions};
    use sluice_engine::rt::{Rng, Time};
    use sluice_engine::txg::ScanPhase;
    for (width, parity) in SHAPES {
        let seed = 23 + width as u64;
        let sim = Sim::new(seed);
        let options = SimOptions { store_data: true, record_log: true };
        let legs = common::legs_with(&sim, width, SimProfile::ssd(), LEG_BYTES, options);
        let tunables = || {
            Tunables::with([("cache.bytes_max", "0"), ("scan.chunk_bytes", "1M")])
                .expect("valid tunables")
        };
        let block = 16384;
        let mut data = common::random_bytes(seed, VOLUME_BYTES);
        let store = common::store_with_volume(
            &sim,
            &legs,
            |leaves| TopSpec::Raidz { parity, leaves },
            &tunables(),
            &data,
            block,
            |_| {},
        );
        let s = Arc::clone(&store);
        sim.run(async move { s.offline_leaf("leg1", true).await.expect("offline") })
            .expect("the sim runs");
        let mut writes = Vec::new();
        for i in 0..24u64 {
            let at = i * (64 << 10);
            let bytes = vec![0x30 + i as u8; 64 << 10];
            data[at as usize..][..bytes.len()].copy_from_slice(&bytes);
            writes.push((at, bytes));
        }
        let s = Arc::clone(&store);
        let (start, end) = sim
            .run(async move {
                for (at, bytes) in writes {
                    s.write("v", at, &bytes).await.expect("write");
                }
                s.sync().await.expect("sync");
                s.pool().online("leg1").expect("online");
                let start = s.pool().env().now();
                s.sync().await.expect("sync");
                assert!(s.resilver_if_needed());
                while s.scan_status().is_some_and(|st| st.phase == ScanPhase::Scanning) {
                    s.pool().env().sleep(std::time::Duration::from_millis(2)).await;
                    s.sync().await.expect("sync");
                }
                (start, s.pool().env().now())
            })
            .expect("the sim runs")
            .0;
        assert!(store.pool().leaves_behind().is_empty());
        let mut rng = Rng::new(seed);
        let cuts = 8u64;
        for k in 0..=cuts {
            let cut = Time::from_nanos(
                start.as_nanos() + (end.as_nanos() - start.as_nanos()) * k / cuts + rng.below(1000),
            );
            let images: Vec<_> = legs
                .iter()
                .map(|d| {
                    let ops = d.write_log().iter().take_while(|e| e.at <= cut).count();
                    d.crash_image(ops, CrashPolicy::Any, &mut rng).expect("an image")
                })
                .collect();
            let after = Sim::new(seed * 100 + k);
            let revived = common::revive(&after, images, SimProfile::ssd(), LEG_BYTES);
            let env = after.env();
            let specs = common::leaf_specs(&revived);
            let store = after
                .run(async move {
                    let pool =
                        Pool::import(&env, specs, "tank", &tunables()).await.expect("imports");
                    Arc::new(Store::open(pool, &tunables()).await.expect("opens"))
                })
                .expect("the sim runs")
                .0;
            let what = format!("raidz{parity} of {width}, cut {k} of {cuts} at {cut:?}");
            assert_eq!(common::read_all(&after, &store, &data, block), (0, 0), "{what}: imported");
            let s = Arc::clone(&store);
            after
                .run(async move {
                    for _ in 0..3 {
                        s.resume_scan();
                        s.wait_scan().await;
                    }
                })
                .expect("the sim runs");
            assert!(store.pool().leaves_behind().is_empty(), "{what}: a leaf is still behind");
            for leg in revived.iter().skip(2).take(usize::from(parity)) {
                leg.inject(Fault::Lost);
            }
            assert_eq!(
                common::read_all(&after, &store, &data, block),
                (0, 0),
                "{what}: with the resilvered leaf standing in for lost ones"
            );
        }
    }
}

/// Leaves lost in the middle of a sync (one of a raidz1 of 4, two of a raidz2 of 6), at
/// points spread over it (from 10 us after it starts, closely around when its writes go out): the sync completes, every block reads back, and the pool imports
/// and reads back without them.
#[test]
fn leaves_lost_mid_sync() {
    for (width, parity) in SHAPES {
        // Losses that fell inside the sync: the lost leaf took some of its writes and missed
        // others.
        let mut inside = 0;
        let mut delays = vec![10u64, 100, 400, 1000];
        delays.extend((0..=24).map(|i| 1400 + i * 50));
        for (k, delay_us) in delays.into_iter().enumerate() {
            let block = 16384;
            let seed = 61 + width as u64 * 10 + k as u64;
            let sim = Sim::new(seed);
            let legs = common::legs(&sim, width, SimProfile::ssd(), LEG_BYTES);
            let mut data = common::random_bytes(seed, VOLUME_BYTES);
            let store = common::store_with_volume(
                &sim,
                &legs,
                |leaves| TopSpec::Raidz { parity, leaves },
                &uncached(),
                &data,
                block,
                |_| {},
            );
            let fresh = common::random_bytes(seed + 1, VOLUME_BYTES);
            data.copy_from_slice(&fresh);
            let before = store.pool().leaves()[1].leaf.stats().writes.get();
            let lost: Vec<SimDevice> = legs[1..=usize::from(parity)].to_vec();
            let (s, env) = (Arc::clone(&store), sim.env());
            let what = format!("raidz{parity} of {width}, leaves lost {delay_us} us into a sync");
            let synced = sim
                .run(async move {
                    s.write("v", 0, &fresh).await.expect("the write is taken");
                    let timer = env.clone();
                    env.spawn("lose leaves", async move {
                        timer.sleep(std::time::Duration::from_micros(delay_us)).await;
                        for leg in &lost {
                            leg.inject(Fault::Lost);
                        }
                    });
                    s.sync().await.map(drop)
                })
                .expect("the sim runs")
                .0;
            synced.unwrap_or_else(|e| panic!("{what}: the sync failed: {e}"));
            let leaf = &store.pool().leaves()[1].leaf;
            if leaf.stats().writes.get() > before && leaf.writes_missed() > 0 {
                inside += 1;
            }
            assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{what}");
            drop(store);
            let mut present = vec![legs[0].clone()];
            present.extend(legs[usize::from(parity) + 1..].iter().cloned());
            let store = import(&sim, &present);
            assert_eq!(common::read_all(&sim, &store, &data, block), (0, 0), "{what}: imported");
        }
        assert!(inside > 0, "raidz{parity} of {width}: no loss fell inside a sync");
    }
}

/// A durable 4 KiB write's log block (two sectors: the record and its headers) is written as
/// one data column and its copies: `parity + 1` leaf writes, each flushed, as on a mirror of
/// that many. A pool made before feature `raidz_log_copies` stripes it, written to the
/// block's full length: at least two data columns and their parity. Both replay the write
/// after a power cut.
#[test]
fn a_log_block_is_parity_plus_one_writes() {
    let cases = [
        (4, 1, RaidzLayout::Copies),
        (6, 2, RaidzLayout::Copies),
        (4, 1, RaidzLayout::Striped),
        (6, 2, RaidzLayout::Striped),
    ];
    for (width, parity, layout) in cases {
        let what = format!("raidz{parity} of {width}, {layout:?} log blocks");
        let sim = Sim::new(width as u64 * 10 + u64::from(parity));
        let legs = common::legs(&sim, width, SimProfile::Instant, LEG_BYTES);
        let spec = PoolSpec {
            name: "tank".into(),
            ashift: 12,
            top: vec![TopSpec::Raidz { parity, leaves: common::leaf_specs(&legs) }],
        };
        let env = sim.env();
        let (leaf_writes, leaves_written) = sim
            .run(async move {
                let pool = Pool::create_as(&env, spec, &uncached(), common::features(layout))
                    .await
                    .unwrap();
                let store = Store::create(pool, &uncached());
                store.create_volume("v", VOLUME_BYTES, 16384).unwrap();
                store.sync().await.unwrap();
                let counts = || -> Vec<u64> {
                    store.pool().leaves().iter().map(|l| l.leaf.stats().writes.get()).collect()
                };
                let before = counts();
                store.write_durable("v", 8192, &[0x5a; 4096]).await.unwrap();
                let delta: Vec<u64> =
                    counts().iter().zip(&before).map(|(after, before)| after - before).collect();
                (delta.iter().sum::<u64>(), delta.iter().filter(|&&d| d > 0).count())
            })
            .unwrap()
            .0;
        // One write per leaf written, each a column.
        assert_eq!(leaf_writes, leaves_written as u64, "{what}");
        let copies = u64::from(parity) + 1;
        match layout {
            RaidzLayout::Copies => assert_eq!(leaf_writes, copies, "{what}"),
            RaidzLayout::Striped => assert!(leaf_writes > copies, "{what}: {leaf_writes}"),
        }
        // The power cut: the write is only in the log, and replays from it.
        let store = import(&sim, &legs);
        let s = Arc::clone(&store);
        let read = sim.run(async move { s.read("v", 8192, 4096).await.unwrap() }).unwrap().0;
        assert!(read.iter().all(|&b| b == 0x5a), "{what}: the logged write replayed");
    }
}
