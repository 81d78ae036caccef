//! Corruption and healing on a mirrored pool (F4, F5, F6): damage within redundancy is
//! detected, healed and counted with zero wrong bytes returned; beyond redundancy the damaged
//! blocks fail with an error and everything else still reads; after a scrub, a second scrub
//! finds nothing.

use crate::common;

use std::sync::Arc;

use sluice_engine::alloc::log_region_bytes;
use sluice_engine::device::sim::Fault;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::objset;
use sluice_engine::pool::{Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::IoClass;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_format::{data_end_bytes, BlockPointer, PoolDirectory, DATA_START_BYTES};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 2 << 20;
const LEG_BYTES: u64 = 64 << 20;

/// Where volume data starts on a leg: after the labels and the log region.
fn data_start() -> u64 {
    DATA_START_BYTES + log_region_bytes(data_end_bytes(LEG_BYTES) - DATA_START_BYTES)
}
const BLOCK: u32 = 4096;

/// A pool on two legs with one volume full of random data, synced.
fn setup(seed: u64) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    setup_with(seed, uncached())
}

/// Defaults with the block cache off: the sync caches what it writes, and these tests are
/// about what reads find on the devices.
fn uncached() -> Tunables {
    Tunables::with([("cache.bytes_max", "0")]).unwrap()
}

fn setup_with(seed: u64, tunables: Tunables) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let data = common::random_bytes(seed, VOLUME_BYTES);
    let store =
        common::store_with_volume(&sim, &legs, TopSpec::Mirror, &tunables, &data, BLOCK, |_| {});
    (sim, legs, store, data)
}

fn scrub(sim: &Sim, store: &Arc<Store>) -> sluice_engine::pool::ScrubReport {
    let s = Arc::clone(store);
    sim.run(async move { s.pool().scrub().await.unwrap() }).unwrap().0
}

fn flip_every_block(leg: &SimDevice, start: u64, len: u64, bit: u8) -> u64 {
    let mut count = 0;
    let mut at = start;
    while at < start + len {
        leg.inject(Fault::BitFlip { offset_bytes: at + 100, bit });
        at += u64::from(BLOCK);
        count += 1;
    }
    count
}

#[test]
fn bit_flips_on_one_leg_heal() {
    let (sim, legs, store, data) = setup(1);
    // Every allocated block of leg 0 (data, indirect, space maps, directory) is damaged.
    let injected = flip_every_block(&legs[0], data_start(), 4 << 20, 5);
    assert_eq!(
        common::read_all(&sim, &store, &data, BLOCK),
        (0, 0),
        "no read fails and no wrong byte is returned"
    );
    let report = scrub(&sim, &store);
    assert!(report.unrecoverable.is_empty());
    assert_eq!(report.repaired, report.errors, "every bad copy found by scrub was rewritten");
    let leaf0 = &store.pool().leaves()[0].leaf;
    let detected = leaf0.stats().checksum_errors.get();
    assert!(
        detected >= VOLUME_BYTES / u64::from(BLOCK),
        "{detected} of {injected} damaged copies detected"
    );
    assert_eq!(leaf0.stats().repairs.get(), detected, "healed exactly what was detected");
    let second = scrub(&sim, &store);
    assert_eq!((second.errors, second.repaired), (0, 0), "a second scrub finds nothing");
    assert_eq!(second.blocks, report.blocks);
}

/// A read of many adjacent blocks goes to the disk as one span; a bad copy anywhere in it
/// sends the whole span to the other child and rewrites it, so the data comes back true and
/// the spans read from the damaged leg are healed.
#[test]
fn span_reads_heal_too() {
    // Round-robin, so some spans go to the damaged leg (least-pending might avoid it).
    let mut tunables = uncached();
    tunables.set("mirror.read_policy", "round-robin").unwrap();
    let (sim, legs, store, data) = setup_with(7, tunables);
    flip_every_block(&legs[0], data_start(), 4 << 20, 2);
    let s = Arc::clone(&store);
    let expected = data.clone();
    let healed = sim
        .run(async move {
            let got = s.read("v", 0, VOLUME_BYTES).await.unwrap();
            assert!(got == expected, "a whole-volume read returned wrong bytes");
            s.pool().leaves()[0].leaf.stats().repairs.get()
        })
        .unwrap()
        .0;
    assert!(healed > 0, "no span was repaired");
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "block by block, too");
    let report = scrub(&sim, &store);
    assert!(report.unrecoverable.is_empty());
    assert_eq!(scrub(&sim, &store).errors, 0, "a second scrub finds nothing to heal");
}

#[test]
fn misdirected_data_is_caught() {
    let (sim, legs, store, data) = setup(2);
    // Leg 1 returns the bytes of a neighbouring region for 512 KiB of its data area.
    legs[1].inject(Fault::Misdirect {
        offset_bytes: data_start(),
        len_bytes: 512 << 10,
        from_offset_bytes: data_start() + (1 << 20),
    });
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let report = scrub(&sim, &store);
    assert!(report.unrecoverable.is_empty());
    assert_eq!(report.repaired, report.errors);
    assert_eq!(scrub(&sim, &store).errors, 0);
}

#[test]
fn lost_leg_runs_degraded() {
    let (sim, legs, store, data) = setup(3);
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let s = Arc::clone(&store);
    sim.run(async move {
        s.write("v", 0, &[7u8; 4096]).await.unwrap();
        s.sync().await.unwrap();
        assert_eq!(s.read("v", 0, 4096).await.unwrap(), vec![7u8; 4096]);
    })
    .unwrap();
    assert!(store.pool().leaves()[0].leaf.is_faulted());
    let report = scrub(&sim, &store);
    assert!(report.unrecoverable.is_empty(), "the surviving leg holds every block");
}

#[test]
fn damage_beyond_redundancy_fails_only_those_blocks() {
    let (sim, legs, store, data) = setup(4);
    // The same 64 KiB of data damaged on both legs.
    let start = data_start() + (256 << 10);
    for leg in &legs {
        flip_every_block(leg, start, 64 << 10, 1);
    }
    let (failed, wrong) = common::read_all(&sim, &store, &data, BLOCK);
    assert_eq!(wrong, 0, "never wrong bytes");
    assert!((1..=16).contains(&failed), "{failed} blocks failed; 16 were damaged on both legs");
    let report = scrub(&sim, &store);
    assert!(!report.unrecoverable.is_empty());
    assert!(report.unrecoverable.len() <= 16);
    // The pool keeps working for everything else.
    let s = Arc::clone(&store);
    sim.run(async move {
        s.write("v", VOLUME_BYTES - 4096, &[9u8; 4096]).await.unwrap();
        s.sync().await.unwrap();
    })
    .unwrap();
}

/// A mirror child that was missing while the pool kept writing comes back: import resilvers
/// exactly the blocks born while it was away (not the ones it already had), after which it
/// alone serves every block correctly and a scrub finds nothing.
#[test]
fn returning_child_is_resilvered_with_only_what_it_missed() {
    let (sim, legs, store, mut data) = setup(5);
    let env = sim.env();
    let store = Arc::try_unwrap(store).unwrap();
    sim.run(async move { store.export().await.unwrap() }).unwrap();
    let all = common::leaf_specs(&legs);
    let only_first = vec![all[0].clone()];
    // Degraded: leg1 away while 64 KiB of new data is written over three txgs.
    let changed = vec![0xabu8; 64 << 10];
    data[(512 << 10)..(512 << 10) + changed.len()].copy_from_slice(&changed);
    let e = env.clone();
    let c = changed.clone();
    sim.run(async move {
        let tunables = Tunables::default();
        let store =
            Store::open(Pool::import(&e, only_first, "tank", &tunables).await.unwrap(), &tunables)
                .await
                .unwrap();
        for (i, piece) in c.chunks(16 << 10).enumerate() {
            store.write("v", (512 << 10) + (i as u64) * (16 << 10), piece).await.unwrap();
            store.sync().await.unwrap();
        }
        store.export().await.unwrap();
    })
    .unwrap();
    // Both legs back: leg1 is behind and gets resilvered at open.
    let e = env.clone();
    let (behind, report, store) = sim
        .run(async move {
            let tunables = Tunables::default();
            let pool = Pool::import(&e, all, "tank", &tunables).await.unwrap();
            let behind = pool.leaves_behind();
            let report = pool.resilver().await.unwrap().unwrap();
            assert!(pool.leaves_behind().is_empty());
            (behind, report, Arc::new(Store::open(pool, &tunables).await.unwrap()))
        })
        .unwrap()
        .0;
    assert_eq!(behind.len(), 1, "leg1 was behind");
    let all_blocks = scrub(&sim, &store).blocks;
    assert!(report.repaired >= 16, "the 16 new data blocks were copied, got {}", report.repaired);
    assert!(
        report.blocks < all_blocks / 2,
        "resilver visited {} of {all_blocks} blocks",
        report.blocks
    );
    // Leg0 gone: leg1 alone must hold everything.
    legs[0].inject(Fault::Lost);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
}

/// A pool of one leaf keeps two copies of every indirect block and space-map piece, and three
/// of the pool directory, an eighth of the leaf apart. With the first copy of every indirect
/// block and two of the directory's three damaged, every read still returns the right bytes;
/// the bad copies are counted as checksum errors and rewritten from the good ones, by the
/// reads themselves and then by a scrub, and a second scrub finds nothing.
#[test]
fn metadata_copies_heal_each_other_on_one_leaf() {
    let sim = Sim::new(12);
    let legs = common::legs(&sim, 1, SimProfile::Instant, LEG_BYTES);
    let specs = common::leaf_specs(&legs);
    let mut rng = Rng::new(12);
    let data: Vec<u8> = (0..VOLUME_BYTES).map(|_| rng.u64() as u8).collect();
    let env = sim.env();
    let d = data.clone();
    let (store, metadata) = sim
        .run(async move {
            let tunables = uncached();
            let spec = PoolSpec {
                name: "tank".into(),
                ashift: 12,
                top: vec![TopSpec::Leaf(specs.into_iter().next().unwrap())],
            };
            let store =
                Store::create(Pool::create(&env, spec, &tunables).await.unwrap(), &tunables);
            store.create_volume("v", VOLUME_BYTES, BLOCK).unwrap();
            store.write("v", 0, &d).await.unwrap();
            store.sync().await.unwrap();
            // The directory, and every indirect block of the volume.
            let pool = store.pool();
            let root = pool.uberblock().root.unwrap();
            let bytes = pool.read_block(&root, IoClass::SyncRead).await.unwrap();
            let directory = PoolDirectory::decode(&bytes).unwrap();
            let volume = &directory.volumes[0];
            let tree = objset::walk(pool, volume.root, volume.levels).await.unwrap();
            let indirect: Vec<BlockPointer> =
                tree.into_iter().filter(|(level, _, _)| *level > 0).map(|(_, _, bp)| bp).collect();
            let mut metadata = vec![root];
            metadata.extend(indirect);
            metadata.extend(directory.space_maps.iter().flatten().copied());
            (Arc::new(store), metadata)
        })
        .unwrap()
        .0;
    let (root, indirect) = (metadata[0], &metadata[1..]);
    assert_eq!(root.copies().count(), 3, "the directory has three copies");
    assert!(indirect.len() >= 2, "{} indirect blocks and space-map pieces", indirect.len());
    let area = data_end_bytes(LEG_BYTES) - data_start();
    for bp in &metadata {
        assert!(bp.copies().count() >= 2, "{bp:?} has one copy");
        let offsets: Vec<u64> = bp.copies().map(|c| c.offset_bytes()).collect();
        for (i, a) in offsets.iter().enumerate() {
            for b in &offsets[i + 1..] {
                assert!(a.abs_diff(*b) >= area / 8, "copies {a} and {b} of {bp:?} are close");
            }
        }
    }
    // Damage: two of the directory's copies, the first copy of everything else.
    let mut damaged = 0u64;
    for (i, bp) in metadata.iter().enumerate() {
        let bad = if i == 0 { 2 } else { 1 };
        for copy in bp.copies().take(bad) {
            legs[0].inject(Fault::BitFlip { offset_bytes: copy.offset_bytes() + 64, bit: 2 });
            damaged += 1;
        }
    }
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "every read is right");
    let leaf = &store.pool().leaves()[0].leaf;
    let (found, repaired) = (leaf.stats().checksum_errors.get(), leaf.stats().repairs.get());
    assert!(found > 0 && repaired == found, "reads found {found} bad copies, repaired {repaired}");
    // The scrub finds and rewrites the rest (the directory's and the space maps' copies,
    // which the reads above did not need).
    let report = scrub(&sim, &store);
    assert!(report.unrecoverable.is_empty(), "{report:?}");
    assert_eq!(report.repaired, report.errors, "{report:?}");
    assert!(found + report.errors >= damaged, "{found} + {} of {damaged} found", report.errors);
    let second = scrub(&sim, &store);
    assert_eq!((second.errors, second.repaired), (0, 0), "a second scrub finds nothing");
}
