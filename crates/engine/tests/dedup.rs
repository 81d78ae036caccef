//! Deduplication (issue: dedup with a per-entry I/O lock): shared blocks and their reference
//! counts, frees, `dedup=verify` under forced key collisions, healing of a shared block, and
//! the table-lock acquisitions of both locking modes. The crash swarm with dedup on is in
//! txg.rs.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::sim::Fault;
use sluice_engine::device::SimProfile;
use sluice_engine::objset;
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Env;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError, VolumeProperty};
use sluice_engine::volume::Volume;
use sluice_format::{BlockCompression, Compression, DedupMode, DATA_START_BYTES};
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;
const BLOCK: usize = 4096;

fn tunables(locking: &str) -> Tunables {
    let mut t = Tunables::default();
    t.set("dedup.locking", locking).unwrap();
    t
}

/// `count` blocks of seeded random bytes.
fn random_blocks(seed: u64, count: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..count).map(|_| (0..BLOCK).map(|_| rng.u64() as u8).collect()).collect()
}

/// A store on a fresh pool over `specs` (one mirror).
async fn new_store(env: &Env, specs: Vec<LeafSpec>, t: &Tunables) -> Store {
    Store::create(Pool::create(env, common::mirror_pool(specs), t).await.unwrap(), t)
}

async fn audit_clean(store: &Store) -> sluice_engine::txg::AuditReport {
    let report = store.audit().await.unwrap();
    assert!(report.is_clean(), "audit: {:#?}", report.problems);
    report
}

#[test]
fn shared_blocks_survive_freeing_one_reference() {
    let sim = Sim::new(1);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let t = Tunables::default();
        let store = new_store(&env, specs.clone(), &t).await;
        store.sync().await.unwrap();
        for name in ["a", "b"] {
            store.create_volume(name, 1 << 20, BLOCK as u32).unwrap();
            store.set_dedup(name, DedupMode::On).unwrap();
        }
        // 16 distinct blocks, each written 4 times in a and 4 times in b.
        let blocks = random_blocks(7, 16);
        let pattern: Vec<u8> = (0..64).flat_map(|i| blocks[i % 16].clone()).collect();
        store.write("a", 0, &pattern).await.unwrap();
        store.write("b", 0, &pattern).await.unwrap();
        store.sync().await.unwrap();
        let summary = store.dedup_table().summary();
        assert_eq!((summary.entries, summary.references), (16, 128));
        assert_eq!(summary.allocated_bytes, 16 * BLOCK as u64);
        assert!((summary.ratio() - 8.0).abs() < 1e-9, "ratio {}", summary.ratio());
        let stats = store.dedup_table().stats();
        assert_eq!((stats.blocks_written.get(), stats.blocks_shared.get()), (16, 112));
        audit_clean(&store).await;

        // a is overwritten: b keeps every shared block.
        store.write("a", 0, &vec![0x5a; 64 * BLOCK]).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.read("b", 0, pattern.len() as u64).await.unwrap(), pattern);
        let summary = store.dedup_table().summary();
        assert_eq!((summary.entries, summary.references), (17, 128), "16 of b's, 1 of a's");
        audit_clean(&store).await;

        // Through an export and import the counts stay.
        store.export().await.unwrap();
        let store =
            Store::open(Pool::import(&env, specs, "tank", &t).await.unwrap(), &t).await.unwrap();
        assert_eq!(store.read("b", 0, pattern.len() as u64).await.unwrap(), pattern);
        assert_eq!(store.dedup_table().summary().references, 128);
        audit_clean(&store).await;

        // Dropping every reference frees every block: the pool is back to empty.
        store.destroy_volume("b").await.unwrap();
        store.zero("a", 0, 1 << 20).await.unwrap();
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        let summary = store.dedup_table().summary();
        assert_eq!((summary.entries, summary.references, summary.allocated_bytes), (0, 0, 0));
        assert_eq!(store.dedup_table().stats().blocks_freed.get(), 17);
        audit_clean(&store).await;
        // The audit above balanced the allocator's books against every block found: no
        // space leaked.
    })
    .unwrap();
}

/// New copies of a dedup volume are stored compressed; the key is of the logical bytes, so a
/// volume with compression off shares them, and verify compares logical bytes.
#[test]
fn shared_blocks_are_stored_compressed() {
    let sim = Sim::new(6);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let t = Tunables::default();
        let store = new_store(&env, specs.clone(), &t).await;
        let block = 16384usize;
        for (name, mode, compression) in [
            ("lz4", DedupMode::On, Compression::Lz4),
            ("zstd", DedupMode::Verify, Compression::Zstd(3)),
            ("plain", DedupMode::Verify, Compression::Off),
        ] {
            store.create_volume(name, 1 << 20, block as u32).unwrap();
            store.set_dedup(name, mode).unwrap();
            store.set_property(name, VolumeProperty::Compression(compression)).unwrap();
        }
        // 8 distinct compressible blocks, each twice per volume.
        let blocks: Vec<Vec<u8>> = (0..8u8)
            .map(|i| (0..block).map(|j| if j % 64 < 8 { i } else { (j / 512) as u8 }).collect())
            .collect();
        let data: Vec<u8> = (0..16).flat_map(|i| blocks[i % 8].clone()).collect();
        store.write("lz4", 0, &data).await.unwrap();
        store.sync().await.unwrap();
        store.write("zstd", 0, &data).await.unwrap();
        store.write("plain", 0, &data).await.unwrap();
        store.sync().await.unwrap();
        let summary = store.dedup_table().summary();
        assert_eq!((summary.entries, summary.references), (8, 48));
        assert!(
            summary.allocated_bytes < 8 * block as u64 / 2,
            "{} bytes stored for 8 blocks of 16 KiB",
            summary.allocated_bytes
        );
        for name in ["lz4", "zstd", "plain"] {
            let entry = store.volume_info(name).unwrap();
            let tree = objset::walk(store.pool(), entry.root, entry.levels).await.unwrap();
            // The copies the first volume wrote, compressed with lz4, are shared by all three.
            assert!(tree
                .iter()
                .filter(|(level, _, _)| *level == 0)
                .all(|(_, _, bp)| bp.compression == BlockCompression::Lz4 && bp.dedup.is_some()));
            assert_eq!(store.read(name, 0, data.len() as u64).await.unwrap(), data);
        }
        audit_clean(&store).await;
        store.export().await.unwrap();
        let store =
            Store::open(Pool::import(&env, specs, "tank", &t).await.unwrap(), &t).await.unwrap();
        assert_eq!(store.read("plain", 0, data.len() as u64).await.unwrap(), data);
        audit_clean(&store).await;
    })
    .unwrap();
}

#[test]
fn verify_never_shares_different_data() {
    // Keys cut to 6 bits: 200 distinct blocks fall into 64 keys, so most collide.
    let run = |mode: DedupMode| {
        let sim = Sim::new(2);
        let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
        let specs = common::leaf_specs(&legs);
        let env = sim.env();
        sim.run(async move {
            let t = Tunables::default();
            let store = new_store(&env, specs, &t).await;
            store.dedup_table().truncate_keys_for_tests(6);
            store.create_volume("v", 1 << 20, BLOCK as u32).unwrap();
            store.set_dedup("v", mode).unwrap();
            let blocks = random_blocks(11, 200);
            // Each block twice: real duplicates must still be shared.
            let data: Vec<u8> = (0..256).flat_map(|i| blocks[i % 200].clone()).collect();
            // Written in two txgs, so shares are checked against stored copies and against
            // copies still being written.
            store.write("v", 0, &data[..128 * BLOCK]).await.unwrap();
            store.sync().await.unwrap();
            store.write("v", 128 * BLOCK as u64, &data[128 * BLOCK..]).await.unwrap();
            store.sync().await.unwrap();
            let same = store.read("v", 0, data.len() as u64).await.unwrap() == data;
            let stats = store.dedup_table().stats();
            (
                same,
                stats.verify_mismatches.get(),
                stats.blocks_shared.get(),
                store.audit().await.unwrap(),
            )
        })
        .unwrap()
        .0
    };
    let (same, mismatches, shared, audit) = run(DedupMode::Verify);
    assert!(same, "dedup=verify returned different data");
    assert!(mismatches > 100, "only {mismatches} collisions were caught by verify");
    // Of the 56 true duplicates, those whose block owns its (truncated) key are shared; the
    // others collide with a different block under that key and are written on their own.
    assert!((20..=56).contains(&shared), "{shared} of the 56 true duplicates were shared");
    assert!(audit.is_clean(), "{:#?}", audit.problems);
    // The same collisions without verify corrupt data: what verify is for, and proof that
    // the test above could fail.
    let (same, _, _, _) = run(DedupMode::On);
    assert!(!same, "truncated keys without verify should have shared different blocks");
}

#[test]
fn corrupted_shared_block_heals_from_its_mirror_copy() {
    let sim = Sim::new(3);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let blocks = random_blocks(5, 8);
    let pattern: Vec<u8> = (0..32).flat_map(|i| blocks[i % 8].clone()).collect();
    let p = pattern.clone();
    let store = sim
        .run(async move {
            let t = Tunables::default();
            let store = new_store(&env, specs, &t).await;
            for name in ["a", "b"] {
                store.create_volume(name, 1 << 20, BLOCK as u32).unwrap();
                store.set_dedup(name, DedupMode::On).unwrap();
                store.write(name, 0, &p).await.unwrap();
            }
            store.sync().await.unwrap();
            Arc::new(store)
        })
        .unwrap()
        .0;
    // Damage every allocated block on leg 0: the 8 shared blocks among them.
    // Data starts after the labels and the log region.
    let start = DATA_START_BYTES
        + sluice_engine::alloc::log_region_bytes(
            sluice_format::data_end_bytes(LEAF_BYTES) - DATA_START_BYTES,
        );
    for at in (start..start + (2 << 20)).step_by(BLOCK) {
        legs[0].inject(Fault::BitFlip { offset_bytes: at + 17, bit: 3 });
    }
    let s = Arc::clone(&store);
    let p = pattern.clone();
    sim.run(async move {
        // Block by block and whole (whole-range reads go in spans).
        for name in ["a", "b"] {
            for at in (0..p.len()).step_by(BLOCK) {
                let got = s.read(name, at as u64, BLOCK as u64).await.unwrap();
                assert_eq!(got, p[at..at + BLOCK], "{name} block at {at} reads true");
            }
            assert_eq!(s.read(name, 0, p.len() as u64).await.unwrap(), p, "{name} reads true");
        }
        // Reads may all go to the good child; a scrub reads every copy of every block (a
        // shared one once per pointer) and rewrites the bad ones from the good copy.
        let report = s.pool().scrub().await.unwrap();
        assert!(report.unrecoverable.is_empty());
        assert!(report.repaired >= 8, "the 8 shared blocks and more were healed: {report:?}");
        let again = s.pool().scrub().await.unwrap();
        assert_eq!((again.errors, again.repaired), (0, 0), "nothing left to heal");
    })
    .unwrap();
}

/// Seed 001's count: for blocks written as new copies, `entry` takes the table lock twice and
/// `global` four times; both leave the same table.
#[test]
fn table_lock_acquisitions_per_written_block() {
    let run = |locking: &'static str| {
        let sim = Sim::new(4);
        let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
        let specs = common::leaf_specs(&legs);
        let env = sim.env();
        sim.run(async move {
            let t = tunables(locking);
            let store = new_store(&env, specs, &t).await;
            store.create_volume("v", 4 << 20, BLOCK as u32).unwrap();
            store.set_dedup("v", DedupMode::On).unwrap();
            let data: Vec<u8> = random_blocks(9, 512).concat();
            store.write("v", 0, &data).await.unwrap();
            store.sync().await.unwrap();
            let stats = store.dedup_table().stats();
            assert_eq!(stats.blocks_written.get(), 512);
            (stats.write_acquisitions(), store.dedup_table().summary())
        })
        .unwrap()
        .0
    };
    let (entry, entry_table) = run("entry");
    let (global, global_table) = run("global");
    assert_eq!(entry, 2 * 512);
    assert_eq!(global, 4 * 512);
    assert_eq!(entry_table, global_table);
}

/// A table larger than its memory bound: buckets double as it grows, clean entries leave
/// memory after each sync, and a later write of the same blocks finds them in their buckets.
#[test]
fn table_grows_and_pages_entries_from_disk() {
    let sim = Sim::new(6);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 128 << 20);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let mut t = Tunables::default();
        // 1 MiB holds about 3,300 entries.
        t.set("dedup.table_mem_max", "1M").unwrap();
        let pool = Pool::create(&env, common::mirror_pool(specs), &t).await.unwrap();
        let store = Store::create(pool, &t);
        for name in ["a", "b"] {
            store.create_volume(name, 32 << 20, BLOCK as u32).unwrap();
            store.set_dedup(name, DedupMode::On).unwrap();
        }
        let data: Vec<u8> = random_blocks(13, 6000).concat();
        for part in data.chunks(1000 * BLOCK).enumerate() {
            store.write("a", (part.0 * 1000 * BLOCK) as u64, part.1).await.unwrap();
            store.sync().await.unwrap();
        }
        let summary = store.dedup_table().summary();
        assert_eq!(summary.entries, 6000);
        assert!(summary.bucket_bits >= 6, "6000 entries need 64 buckets or more");
        assert!(summary.in_memory < 3400, "{} entries kept in memory", summary.in_memory);
        let reads = store.dedup_table().stats().bucket_reads.get();
        store.write("b", 0, &data).await.unwrap();
        store.sync().await.unwrap();
        let summary = store.dedup_table().summary();
        assert_eq!((summary.entries, summary.references), (6000, 12000));
        assert!(store.dedup_table().stats().bucket_reads.get() > reads, "entries were paged in");
        assert_eq!(store.read("b", 0, data.len() as u64).await.unwrap(), data);
        audit_clean(&store).await;
    })
    .unwrap();
}

/// A nearly full pool with a dedup volume of unique 4 KiB blocks: writes get ENOSPC, then a
/// trim, a flush and a write must each either succeed or be refused with NoSpace; no sync may
/// fail. Rewriting the table's buckets costs space that admission used not to count, so the
/// writes ate the slop reserve, and the sync after the trim (which drops references and so
/// rewrites buckets too) failed and suspended the pool: the user's only remedy killed it.
#[test]
fn full_dedup_pool_trims_without_suspending() {
    let sim = Sim::new(81);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let spec = PoolSpec { name: "tiny".into(), ashift: 12, top: vec![TopSpec::Mirror(specs)] };
        let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
        let store = Arc::new(Store::create(pool, &Tunables::default()));
        store.create_volume("big", 256 << 20, 4096).unwrap();
        store.set_dedup("big", DedupMode::Verify).unwrap();
        let volume = Volume::open(&store, "big").unwrap();
        let no_space = |e: &StoreError| e.kind() == sluice_engine::ErrorKind::NoSpace;
        let mut rng = Rng::new(5);
        let mut refused = 0;
        let mut written = Vec::new();
        for i in 0..40_000u64 {
            let block = rng.below(65536);
            let mut data = vec![0u8; 4096];
            data[..8].copy_from_slice(&i.to_le_bytes());
            data[8..16].copy_from_slice(&rng.u64().to_le_bytes());
            match volume.write(block * 4096, &data, true).await {
                Ok(()) => written.push(block),
                Err(error) => {
                    assert!(no_space(&error), "write {i}: {error}");
                    refused += 1;
                    if refused > 2000 {
                        break;
                    }
                }
            }
        }
        assert!(refused > 0, "the pool never filled");
        // The remedy: trim a quarter of the volume, flush, write again.
        volume.zero(0, 64 << 20, false).await.unwrap();
        volume.flush().await.unwrap();
        for _ in 0..4 {
            store.sync().await.unwrap();
        }
        let result = volume.write(0, &[7u8; 65536], true).await;
        assert!(result.is_ok() || result.as_ref().is_err_and(no_space), "{result:?}");
        assert!(!store.is_suspended(), "the pool suspended");
        store.sync().await.unwrap();
        assert_eq!(store.read("big", 0, 4096).await.unwrap()[0], 7, "the write after the trim");
    })
    .unwrap();
}
