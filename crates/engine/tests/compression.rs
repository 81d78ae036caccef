//! Compressed volumes: what is read back is what was written, through the cache and around it,
//! across export and import, after partial overwrites of compressed blocks, and when one leg's
//! copy is damaged; each volume's space figures match its tree (the audit checks them), a
//! block is stored compressed only when that saves an eighth, and indirect blocks are always
//! stored lz4 (on a pool made without that feature, once `pool upgrade` enables it).

use crate::common;

use std::sync::Arc;

use sluice_engine::alloc::log_region_bytes;
use sluice_engine::device::sim::Fault;
use sluice_engine::device::{BlockDevice, SharedBuf, SimDevice, SimProfile};
use sluice_engine::objset;
use sluice_engine::pool::{NewFeatures, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, VolumeProperty};
use sluice_format::{
    data_end_bytes, label_offsets, BlockCompression, Compression, LabelHeader, DATA_START_BYTES,
    LABEL_HEADER_BYTES,
};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 4 << 20;
const LEG_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 16384;

/// Volume contents of three kinds, 64 KiB each in turn: text-like (compresses well), random
/// (does not), and half of each within every block (saves a quarter, rounded to 4 KiB).
fn contents(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let words: [&[u8]; 6] = [b"volume ", b"block ", b"sluice ", b"pool ", b"txg ", b"log "];
    let mut data = Vec::with_capacity(VOLUME_BYTES as usize);
    while data.len() < VOLUME_BYTES as usize {
        match data.len() / 65536 % 3 {
            0 => data.extend_from_slice(words[rng.u64() as usize % words.len()]),
            1 => data.push(rng.u64() as u8),
            _ if data.len() % BLOCK as usize >= BLOCK as usize / 2 => data.push(0),
            _ => data.push(rng.u64() as u8),
        }
    }
    data.truncate(VOLUME_BYTES as usize);
    data
}

/// A pool on two legs with volume "v" (compressed as asked) holding [`contents`], synced.
fn setup(
    seed: u64,
    compression: Compression,
    tunables: &Tunables,
) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let data = contents(seed);
    let set = move |store: &Store| {
        store.set_property("v", VolumeProperty::Compression(compression)).unwrap();
    };
    let store =
        common::store_with_volume(&sim, &legs, TopSpec::Mirror, tunables, &data, BLOCK, set);
    (sim, legs, store, data)
}

fn uncached() -> Tunables {
    Tunables::with([("cache.bytes_max", "0")]).unwrap()
}

/// How many of the volume's data blocks are stored with each algorithm.
fn stored_as(sim: &Sim, store: &Arc<Store>) -> (u64, u64, u64) {
    let s = Arc::clone(store);
    sim.run(async move {
        let entry = s.volume_info("v").unwrap();
        let tree = objset::walk(s.pool(), entry.root, entry.levels).await.unwrap();
        let (mut none, mut lz4, mut zstd) = (0, 0, 0);
        for (level, _, bp) in tree {
            if level > 0 {
                continue;
            }
            match bp.compression {
                BlockCompression::None => none += 1,
                BlockCompression::Lz4 => lz4 += 1,
                BlockCompression::Zstd => zstd += 1,
            }
            if bp.compression != BlockCompression::None {
                assert!(bp.psize_bytes() <= bp.lsize_bytes() * 7 / 8, "saves an eighth");
                assert_eq!(bp.psize_bytes() % 4096, 0, "whole allocation units");
            }
        }
        (none, lz4, zstd)
    })
    .unwrap()
    .0
}

/// Exports the pool and imports it again from `legs`, without the block cache.
fn export_import(sim: &Sim, store: Arc<Store>, legs: &[SimDevice]) -> Arc<Store> {
    let store = Arc::try_unwrap(store)
        .unwrap_or_else(|_| panic!("the test holds the only reference to the store"));
    let (env, specs) = (sim.env(), common::leaf_specs(legs));
    sim.run(async move {
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &uncached()).await.unwrap();
        Arc::new(Store::open(pool, &uncached()).await.unwrap())
    })
    .unwrap()
    .0
}

fn audit_clean(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    let report = sim.run(async move { s.audit().await.unwrap() }).unwrap().0;
    assert!(report.is_clean(), "audit: {:?}", report.problems);
}

#[test]
fn each_algorithm_reads_back_what_was_written_across_import() {
    for (seed, compression) in
        [(1, Compression::Lz4), (2, Compression::Zstd(3)), (3, Compression::Zstd(19))]
    {
        let (sim, legs, store, data) = setup(seed, compression, &uncached());
        let (none, lz4, zstd) = stored_as(&sim, &store);
        let blocks = VOLUME_BYTES / u64::from(BLOCK);
        assert_eq!(none + lz4 + zstd, blocks);
        // Random thirds stay as they are; the others are compressed by the volume's algorithm.
        let compressed = if compression == Compression::Lz4 { lz4 } else { zstd };
        assert!(none >= blocks / 3 - 1 && none <= blocks / 3 + 1, "{compression:?}: {none}");
        assert_eq!(compressed, blocks - none, "{compression:?}");
        assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "{compression:?}");
        audit_clean(&sim, &store);
        let space = store.volume_info("v").unwrap().space.unwrap();
        assert_eq!(space.logical_bytes, VOLUME_BYTES);
        assert!(
            space.physical_bytes < VOLUME_BYTES * 3 / 4,
            "{compression:?}: {} stored",
            space.physical_bytes
        );
        // Export and import: the same bytes and figures.
        let store = export_import(&sim, store, &legs);
        assert_eq!(store.volume_info("v").unwrap().space, Some(space));
        assert_eq!(store.volume_info("v").unwrap().compression, compression);
        assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0), "{compression:?}");
        audit_clean(&sim, &store);
    }
}

/// Partial writes into compressed blocks read the old block (decompressing it) to complete
/// the new one; with the cache on and off; the figures follow overwrites, zeroes and a shrink.
#[test]
fn partial_overwrites_zeroes_and_shrinks_keep_data_and_figures() {
    for tunables in [Tunables::default(), uncached()] {
        let (sim, _legs, store, mut data) = setup(4, Compression::Lz4, &tunables);
        let s = Arc::clone(&store);
        let mut rng = Rng::new(9);
        let mut writes = Vec::new();
        for i in 0..40u64 {
            let len = 512 * (1 + rng.u64() % 16);
            let at = (rng.u64() % ((VOLUME_BYTES - len) / 512)) * 512;
            let bytes: Vec<u8> = if i % 2 == 0 {
                vec![i as u8; len as usize]
            } else {
                (0..len).map(|_| rng.u64() as u8).collect()
            };
            data[at as usize..][..len as usize].copy_from_slice(&bytes);
            writes.push((at, bytes));
        }
        let zero_at = 5 * u64::from(BLOCK) + 1024;
        data[zero_at as usize..][..3 * BLOCK as usize].fill(0);
        sim.run(async move {
            for (at, bytes) in writes {
                s.write("v", at, &bytes).await.unwrap();
            }
            s.zero("v", zero_at, 3 * u64::from(BLOCK)).await.unwrap();
            s.sync().await.unwrap();
        })
        .unwrap();
        assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
        audit_clean(&sim, &store);
        // Shrink to half: the figures lose the blocks cut off.
        let before = store.volume_info("v").unwrap().space.unwrap();
        let s = Arc::clone(&store);
        sim.run(async move {
            s.resize_volume("v", VOLUME_BYTES / 2).await.unwrap();
            s.sync().await.unwrap();
        })
        .unwrap();
        let after = store.volume_info("v").unwrap().space.unwrap();
        assert!(
            after.logical_bytes <= VOLUME_BYTES / 2
                && after.referenced_bytes < before.referenced_bytes
        );
        assert_eq!(
            common::read_all(&sim, &store, &data[..VOLUME_BYTES as usize / 2], BLOCK),
            (0, 0)
        );
        audit_clean(&sim, &store);
    }
}

/// Compression off, then on: blocks written before stay as they are and still read; the
/// figures count both kinds.
#[test]
fn changing_the_property_applies_to_new_blocks() {
    let (sim, _legs, store, data) = setup(5, Compression::Off, &uncached());
    assert_eq!(stored_as(&sim, &store).1, 0);
    store.set_property("v", VolumeProperty::Compression(Compression::Lz4)).unwrap();
    let s = Arc::clone(&store);
    let half = data[..VOLUME_BYTES as usize / 2].to_vec();
    sim.run(async move {
        s.write("v", 0, &half).await.unwrap();
        s.sync().await.unwrap();
    })
    .unwrap();
    let (none, lz4, _) = stored_as(&sim, &store);
    assert!(lz4 > 0 && none > lz4, "{none} as they are, {lz4} lz4");
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    audit_clean(&sim, &store);
}

/// Indirect blocks are stored lz4 whatever the volume's compression (as OpenZFS stores its
/// metadata): on a volume with compression off every indirect block is compressed, saves at
/// least half (a block pointer is mostly zeros), and the tree reads, scrubs and audits clean
/// before and after an import.
#[test]
fn indirect_blocks_are_stored_lz4_whatever_the_volume_compression() {
    let (sim, legs, store, data) = setup(7, Compression::Off, &uncached());
    let indirect_blocks = |sim: &Sim, store: &Arc<Store>| {
        let s = Arc::clone(store);
        sim.run(async move {
            let entry = s.volume_info("v").unwrap();
            let tree = objset::walk(s.pool(), entry.root, entry.levels).await.unwrap();
            let mut indirect = 0;
            for (level, _, bp) in tree {
                if level == 0 {
                    assert_eq!(bp.compression, BlockCompression::None, "data as the volume says");
                    continue;
                }
                indirect += 1;
                assert_eq!(bp.compression, BlockCompression::Lz4, "level {level}");
                assert!(bp.psize_bytes() <= bp.lsize_bytes() / 2, "level {level}: {bp:?}");
            }
            indirect
        })
        .unwrap()
        .0
    };
    assert!(indirect_blocks(&sim, &store) >= 3, "a tree of more than its root");
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    audit_clean(&sim, &store);
    let s = Arc::clone(&store);
    let scrub = sim.run(async move { s.pool().scrub().await.unwrap() }).unwrap().0;
    assert!(scrub.errors == 0 && scrub.unrecoverable.is_empty(), "{scrub:?}");
    let store = export_import(&sim, store, &legs);
    assert!(indirect_blocks(&sim, &store) >= 3);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    audit_clean(&sim, &store);
}

/// How many of volume "v"'s indirect blocks are stored (plain, lz4).
fn indirect_stored_as(sim: &Sim, store: &Arc<Store>) -> (u64, u64) {
    let s = Arc::clone(store);
    sim.run(async move {
        let entry = s.volume_info("v").unwrap();
        let tree = objset::walk(s.pool(), entry.root, entry.levels).await.unwrap();
        let (mut plain, mut lz4) = (0, 0);
        for (level, _, bp) in tree.into_iter().filter(|(level, _, _)| *level > 0) {
            match bp.compression {
                BlockCompression::None => plain += 1,
                BlockCompression::Lz4 => lz4 += 1,
                BlockCompression::Zstd => panic!("level {level}: zstd indirect block {bp:?}"),
            }
        }
        (plain, lz4)
    })
    .unwrap()
    .0
}

/// The features leg `leg`'s first label lists.
fn label_features(sim: &Sim, leg: &SimDevice) -> Vec<&'static str> {
    let d = leg.clone();
    sim.run(async move {
        let bytes = d.read_at(0, LABEL_HEADER_BYTES as u32).await.unwrap();
        LabelHeader::decode(&bytes).unwrap().config.features()
    })
    .unwrap()
    .0
}

/// A pool made without the optional features (as by `pool create -d`, or a build before
/// `lz4_indirect`) with volume "v" of [`contents`], written and synced.
fn older_pool(seed: u64) -> (Sim, Vec<SimDevice>, Arc<Store>, Vec<u8>) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let data = contents(seed);
    let spec = PoolSpec {
        name: "tank".into(),
        ashift: 12,
        top: vec![TopSpec::Mirror(common::leaf_specs(&legs))],
    };
    let (env, tunables, written) = (sim.env(), uncached(), data.clone());
    let store = sim
        .run(async move {
            let pool = Pool::create_as(&env, spec, &tunables, NewFeatures::NONE).await.unwrap();
            let store = Store::create(pool, &tunables);
            store.create_volume("v", VOLUME_BYTES, BLOCK).unwrap();
            store.write("v", 0, &written).await.unwrap();
            store.sync().await.unwrap();
            Arc::new(store)
        })
        .unwrap()
        .0;
    (sim, legs, store, data)
}

/// Writes `bytes` at `offset` of "v" and syncs.
fn write_and_sync(sim: &Sim, store: &Arc<Store>, offset: u64, bytes: &[u8]) {
    let (s, bytes) = (Arc::clone(store), bytes.to_vec());
    sim.run(async move {
        s.write("v", offset, &bytes).await.unwrap();
        s.sync().await.unwrap();
    })
    .unwrap();
}

/// A pool made without `lz4_indirect` (by a build before it, or `pool create -d`) stores its
/// indirect blocks plain. `enable_features` (`pool upgrade`) lists the feature in every label
/// and the directory; the indirect blocks a sync rewrites from then on are lz4, those it has
/// not rewritten still read as they are, and the feature survives an import. A second upgrade
/// enables nothing.
#[test]
fn an_upgrade_stores_an_older_pools_indirect_blocks_lz4_from_then_on() {
    let (sim, legs, store, mut data) = older_pool(8);
    assert!(store.pool().config().features().is_empty());
    assert_eq!(store.pool().features_disabled(), ["lz4_indirect"]);
    assert_eq!(label_features(&sim, &legs[1]), Vec::<&str>::new());
    let (plain, lz4) = indirect_stored_as(&sim, &store);
    assert!(plain >= 3 && lz4 == 0, "before: {plain} plain, {lz4} lz4");

    let s = Arc::clone(&store);
    let (first, second) = sim
        .run(
            async move { (s.enable_features().await.unwrap(), s.enable_features().await.unwrap()) },
        )
        .unwrap()
        .0;
    assert_eq!((first, second), (vec!["lz4_indirect"], vec![]));
    assert!(store.pool().features_disabled().is_empty());
    for leg in &legs {
        assert_eq!(label_features(&sim, leg), ["lz4_indirect"]);
    }
    // The upgrade's own sync rewrote nothing of "v": its blocks are as they were.
    assert_eq!(indirect_stored_as(&sim, &store), (plain, 0));

    // One block rewritten: the indirect blocks above it are written again, now lz4.
    let block = vec![0x5a; BLOCK as usize];
    data[..BLOCK as usize].copy_from_slice(&block);
    write_and_sync(&sim, &store, 0, &block);
    let (plain_after, lz4_after) = indirect_stored_as(&sim, &store);
    assert!(lz4_after >= 2 && plain_after >= 1, "{plain_after} plain, {lz4_after} lz4");
    assert_eq!(plain_after + lz4_after, plain, "the same tree");
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    audit_clean(&sim, &store);

    let store = export_import(&sim, store, &legs);
    assert_eq!(store.pool().config().features(), ["lz4_indirect"]);
    assert_eq!(indirect_stored_as(&sim, &store), (plain_after, lz4_after));
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let s = Arc::clone(&store);
    let again = sim.run(async move { s.enable_features().await.unwrap() }).unwrap().0;
    assert!(again.is_empty());
    // Every block rewritten: no plain indirect block is left.
    write_and_sync(&sim, &store, 0, &data);
    assert_eq!(indirect_stored_as(&sim, &store), (0, plain));
    audit_clean(&sim, &store);
}

/// A crash after an upgrade's sync wrote the pool directory but before every label was
/// rewritten (here: the labels put back as they were): the directory lists `lz4_indirect`,
/// the labels do not. Import takes the feature from the directory and rewrites the labels,
/// so the syncs after it keep listing it while lz4 indirect blocks are on the disk; without
/// that, a build that does not know the feature would open the pool and misread them.
#[test]
fn an_upgrade_cut_short_before_its_labels_is_finished_at_import() {
    let (sim, legs, store, mut data) = older_pool(9);
    let headers = |sim: &Sim, leg: &SimDevice| {
        let d = leg.clone();
        sim.run(async move {
            let mut headers = Vec::new();
            for offset in label_offsets(d.len_bytes()) {
                headers.push((offset, d.read_at(offset, LABEL_HEADER_BYTES as u32).await.unwrap()));
            }
            headers
        })
        .unwrap()
        .0
    };
    let before: Vec<_> = legs.iter().map(|leg| headers(&sim, leg)).collect();
    let s = Arc::clone(&store);
    let enabled = sim.run(async move { s.enable_features().await.unwrap() }).unwrap().0;
    assert_eq!(enabled, ["lz4_indirect"]);
    let block = vec![0xa5; BLOCK as usize];
    data[..BLOCK as usize].copy_from_slice(&block);
    write_and_sync(&sim, &store, 0, &block);
    let (_, lz4) = indirect_stored_as(&sim, &store);
    assert!(lz4 >= 2, "{lz4} lz4 indirect blocks");

    // The crash: the labels as before the upgrade, the store gone without an export.
    for (leg, headers) in legs.iter().zip(before) {
        let d = leg.clone();
        sim.run(async move {
            for (offset, bytes) in headers {
                d.write_at(offset, SharedBuf::copy_from(&bytes)).await.unwrap();
            }
        })
        .unwrap();
        assert_eq!(label_features(&sim, leg), Vec::<&str>::new());
    }
    drop(Arc::try_unwrap(store).unwrap_or_else(|_| panic!("the test holds the only reference")));
    let (env, specs) = (sim.env(), common::leaf_specs(&legs));
    let store = sim
        .run(async move {
            let pool = Pool::import(&env, specs, "tank", &uncached()).await.unwrap();
            Arc::new(Store::open(pool, &uncached()).await.unwrap())
        })
        .unwrap()
        .0;
    assert_eq!(store.pool().config().features(), ["lz4_indirect"]);
    for leg in &legs {
        assert_eq!(label_features(&sim, leg), ["lz4_indirect"], "labels rewritten at import");
    }
    // A sync after the import, and another import: the directory still lists it.
    write_and_sync(&sim, &store, u64::from(BLOCK), &data[BLOCK as usize..2 * BLOCK as usize]);
    let store = export_import(&sim, store, &legs);
    assert_eq!(store.pool().config().features(), ["lz4_indirect"]);
    assert_eq!(indirect_stored_as(&sim, &store).1, lz4);
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    audit_clean(&sim, &store);
}

/// One leg's copies of every block damaged: reads verify the stored (compressed) bytes, take
/// the other leg's copy and heal; nothing wrong is returned, and a scrub then finds nothing.
#[test]
fn a_damaged_leg_heals_compressed_blocks() {
    let (sim, legs, store, data) = setup(6, Compression::Zstd(3), &uncached());
    let start = DATA_START_BYTES + log_region_bytes(data_end_bytes(LEG_BYTES) - DATA_START_BYTES);
    let mut at = start;
    while at < start + VOLUME_BYTES {
        legs[0].inject(Fault::BitFlip { offset_bytes: at + 100, bit: 3 });
        at += 4096;
    }
    assert_eq!(common::read_all(&sim, &store, &data, BLOCK), (0, 0));
    let s = Arc::clone(&store);
    let (first, second) = sim
        .run(async move {
            let first = s.pool().scrub().await.unwrap();
            let second = s.pool().scrub().await.unwrap();
            (first, second)
        })
        .unwrap()
        .0;
    assert!(first.unrecoverable.is_empty(), "{first:?}");
    assert!(second.errors == 0 && second.unrecoverable.is_empty(), "{second:?}");
    audit_clean(&sim, &store);
}
