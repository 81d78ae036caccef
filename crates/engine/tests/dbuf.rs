//! The write path's blocks in memory (ZFS: `dbuf.c`): partial writes kept as patches over the
//! version below and completed by the sync or under pressure, every sector kept across quiesces,
//! recently written blocks completed from memory without a read, and new blocks written to the
//! disk in spans.

use crate::common;

use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_sim::Sim;
use std::sync::Arc;
use std::time::Duration;

const LEAF_BYTES: u64 = 64 << 20;

/// A txg's blocks, written by the client at random offsets, reach the disk in spans: a few
/// device writes per leg instead of one per block. Each block still has its own pointer: all
/// read back, after an import too, and scrub checks every one against its own checksum. The
/// indirect blocks written stay cached for the next txg.
#[test]
fn random_writes_reach_the_disk_in_spans() {
    let sim = Sim::new(5);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let spec = PoolSpec {
            name: "spans".into(),
            ashift: 12,
            top: vec![TopSpec::Mirror(specs.clone())],
        };
        let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
        let store = Store::create(pool, &Tunables::default());
        let blocks = 1024u64;
        store.create_volume("v", blocks * 4096, 4096).unwrap();
        store.sync().await.unwrap();
        let pattern = |block: u64| -> Vec<u8> {
            (0..4096u64).map(|i| (block.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8).collect()
        };
        let mut order: Vec<u64> = (0..blocks).collect();
        let mut rng = Rng::new(9);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let before: Vec<u64> = legs.iter().map(|leg| leg.stats().writes).collect();
        for &block in &order {
            store.write("v", block * 4096, &pattern(block)).await.unwrap();
        }
        store.sync().await.unwrap();
        for (leg, before) in legs.iter().zip(before) {
            // 4 MiB of data in 1 MiB spans, the 8 indirect blocks above it in one, then the
            // root, the space map, the directory and the labels: 13 here, against 1,040 when
            // every block was written on its own.
            let writes = leg.stats().writes - before;
            assert!(writes <= 24, "{writes} device writes for {blocks} blocks");
        }
        // The indirect blocks just written are cached: the next txg rewrites them without
        // reading any back.
        let reads: Vec<u64> = legs.iter().map(|leg| leg.stats().reads).collect();
        store.write("v", 77 * 4096, &pattern(77)).await.unwrap();
        store.sync().await.unwrap();
        for (leg, before) in legs.iter().zip(reads) {
            assert_eq!(leg.stats().reads, before, "the sync read indirect blocks back");
        }
        let scrubbed = store.pool().scrub().await.unwrap();
        assert!(scrubbed.errors == 0 && scrubbed.blocks > blocks, "{scrubbed:?}");
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "spans", &Tunables::default()).await.unwrap();
        let store = Store::open(pool, &Tunables::default()).await.unwrap();
        for block in 0..blocks {
            let got = store.read("v", block * 4096, 4096).await.unwrap();
            assert!(got == pattern(block), "block {block} reads back wrong");
        }
    })
    .unwrap();
}

/// A sync caches the data blocks it writes, so 4 KiB writes into 16 KiB blocks written by an
/// earlier sync merge with the cached bytes instead of reading each block back; and the blocks a
/// sync frees leave the cache, so overwriting the volume again and again does not fill it with
/// dead versions.
#[test]
fn partial_overwrites_of_recently_written_blocks_read_nothing() {
    let sim = Sim::new(12);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let pool =
            Pool::create(&env, common::mirror_pool(specs.clone()), &tunables).await.unwrap();
        let store = Store::create(pool, &tunables);
        let (blocks, block) = (256u64, 16384u64);
        store.create_volume("v", blocks * block, block as u32).unwrap();
        store.write("v", 0, &vec![0x5a; (blocks * block) as usize]).await.unwrap();
        store.sync().await.unwrap();
        let cached_after_fill = store.pool().cache().bytes();
        assert!(cached_after_fill >= blocks * block, "{cached_after_fill} bytes cached");
        let reads = |legs: &[SimDevice]| legs.iter().map(|l| l.stats().reads).sum::<u64>();
        let before = reads(&legs);
        for round in 0..4u64 {
            // One 4 KiB piece per block, a different one each round; every block is synced
            // (and so replaced) each round.
            for b in 0..blocks {
                let at = b * block + (round % 4) * 4096;
                store.write("v", at, &[round as u8 + 1; 4096]).await.unwrap();
            }
            store.sync().await.unwrap();
        }
        assert_eq!(reads(&legs), before, "partial writes read their blocks back");
        let cached = store.pool().cache().bytes();
        assert!(
            cached <= cached_after_fill + cached_after_fill / 4,
            "{cached} bytes cached after four overwrites of {cached_after_fill}: freed blocks stayed"
        );
        for b in 0..blocks {
            let got = store.read("v", b * block, block).await.unwrap();
            for (piece, bytes) in got.chunks(4096).enumerate() {
                assert!(bytes.iter().all(|&x| x == piece as u8 + 1), "block {b} piece {piece}");
            }
        }
        // The same bytes come back from the disk.
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let store = Store::open(pool, &tunables).await.unwrap();
        let got = store.read("v", 0, blocks * block).await.unwrap();
        for (piece, bytes) in got.chunks(4096).enumerate() {
            assert!(bytes.iter().all(|&x| x == (piece % 4) as u8 + 1), "piece {piece} on disk");
        }
    })
    .unwrap();
}

/// Partial-block writes are kept as patches over the version below, read only when needed.
/// Here they land while syncs run (so patches stack over a syncing txg's patches), and every
/// read, during the run and after an import, must see exactly what was written.
#[test]
fn partial_writes_during_syncs_read_back() {
    partial_writes_during_syncs(Tunables::default());
}

/// The same under write pressure (a small dirty limit): writers complete their patches
/// themselves, racing the quiesces of the syncer.
#[test]
fn partial_writes_under_pressure_read_back() {
    let mut t = Tunables::default();
    t.set("txg.dirty_max", "1M").unwrap();
    partial_writes_during_syncs(t);
}

fn partial_writes_during_syncs(t: Tunables) {
    let sim = Sim::new(21);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let pool = Pool::create(&env, common::mirror_pool(specs.clone()), &t).await.unwrap();
        let store = Arc::new(Store::create(pool, &t));
        const SIZE: u64 = 256 << 10;
        store.create_volume("v", SIZE, 16384).unwrap();
        let mut model = vec![0u8; SIZE as usize];
        let first: Vec<u8> = (0..SIZE).map(|i| (i / 512) as u8).collect();
        store.write("v", 0, &first).await.unwrap();
        model.copy_from_slice(&first);
        store.sync().await.unwrap();
        let syncing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (s, flag, e) = (Arc::clone(&store), Arc::clone(&syncing), env.clone());
        env.spawn("syncer", async move {
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                s.sync().await.unwrap();
                e.sleep(Duration::from_micros(50)).await;
            }
        });
        let mut rng = Rng::new(3);
        for step in 0..3000u32 {
            let sectors = SIZE / 512;
            let at = rng.below(sectors);
            let len = (1 + rng.below(8)).min(sectors - at);
            let (offset, bytes) = (at * 512, len * 512);
            if rng.below(4) == 0 {
                let got = store.read("v", offset, bytes).await.unwrap();
                assert!(
                    got[..] == model[offset as usize..(offset + bytes) as usize],
                    "step {step}: read at {offset}+{bytes} differs"
                );
            } else {
                let data: Vec<u8> = (0..bytes).map(|_| rng.u64() as u8).collect();
                store.write("v", offset, &data).await.unwrap();
                model[offset as usize..(offset + bytes) as usize].copy_from_slice(&data);
            }
            if step % 3 == 0 {
                env.sleep(Duration::from_micros(30)).await;
            }
        }
        syncing.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(store.syncs() > 20, "only {} syncs ran among the writes", store.syncs());
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), model);
        store.sync().await.unwrap();
        let store =
            Arc::try_unwrap(store).unwrap_or_else(|_| panic!("syncer still holds the store"));
        store.export().await.unwrap();
        let store =
            Store::open(Pool::import(&env, specs, "tank", &t).await.unwrap(), &t).await.unwrap();
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), model);
    })
    .unwrap();
}

/// Several writers patch the same few blocks (each its own sectors), through the volume front
/// so their patches are completed at once (by tasks of their own, or past their cap by the
/// writers), while a syncer quiesces txgs: a writer completing its patch must not apply a newer patch over a
/// base read before a quiesce moved the layers. Every sector must hold its writer's last value.
#[test]
fn concurrent_patches_across_quiesces_keep_every_sector() {
    let sim = Sim::new(33);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        let mut t = Tunables::default();
        t.set("txg.dirty_max", "1M").unwrap();
        let pool = Pool::create(&env, common::mirror_pool(specs), &t).await.unwrap();
        let store = Arc::new(Store::create(pool, &t));
        const SIZE: u64 = 512 << 10;
        const WRITERS: u64 = 8;
        store.create_volume("v", SIZE, 16384).unwrap();
        store.write("v", 0, &vec![0xee; SIZE as usize]).await.unwrap();
        store.sync().await.unwrap();
        let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (s, flag, e) = (Arc::clone(&store), Arc::clone(&running), env.clone());
        env.spawn("syncer", async move {
            while flag.load(std::sync::atomic::Ordering::Relaxed) {
                s.sync().await.unwrap();
                e.sleep(Duration::from_micros(20)).await;
            }
        });
        let (done_tx, done_rx) = futures::channel::mpsc::unbounded::<Vec<(u64, u8)>>();
        for w in 0..WRITERS {
            // Through the volume front, which counts requests in flight: with several, the
            // writers' patches are completed at once, beside their answers.
            let s = sluice_engine::volume::Volume::open(&store, "v").unwrap();
            let (e, done) = (env.clone(), done_tx.clone());
            env.spawn("writer", async move {
                let mut rng = Rng::new(100 + w);
                let mut last = std::collections::BTreeMap::new();
                for _ in 0..1500 {
                    // Sectors of this writer only: sector % WRITERS == w.
                    let sector = rng.below(SIZE / 512 / WRITERS) * WRITERS + w;
                    let value = rng.u64() as u8;
                    s.write(sector * 512, &[value; 512], false).await.unwrap();
                    let back = s.read(sector * 512, 512).await.unwrap();
                    assert!(back == [value; 512], "writer {w}: sector {sector} lost its write");
                    last.insert(sector, value);
                    if rng.below(2) == 0 {
                        e.sleep(Duration::from_micros(rng.below(20))).await;
                    }
                }
                done.unbounded_send(last.into_iter().collect()).unwrap();
            });
        }
        drop(done_tx);
        let mut expected = vec![0xeeu8; SIZE as usize];
        let finished: Vec<Vec<(u64, u8)>> = futures::StreamExt::collect(done_rx).await;
        assert_eq!(finished.len() as u64, WRITERS);
        for (sector, value) in finished.into_iter().flatten() {
            expected[(sector * 512) as usize..((sector + 1) * 512) as usize].fill(value);
        }
        running.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(store.syncs() > 20, "only {} syncs ran among the writes", store.syncs());
        let got = store.read("v", 0, SIZE).await.unwrap();
        let bad = (0..SIZE / 512).find(|&s| {
            got[(s * 512) as usize..((s + 1) * 512) as usize]
                != expected[(s * 512) as usize..((s + 1) * 512) as usize]
        });
        assert!(bad.is_none(), "sector {bad:?} lost its writer's last value");
        store.sync().await.unwrap();
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), expected);
    })
    .unwrap();
}

/// A pool of one leaf caching no data (`cache.contents=metadata`), with a volume "v" of
/// `size` bytes in 16 KiB blocks written whole and synced: every block's version is on the
/// disk only, so a partial write leaves a patch. Returns the store and the volume's bytes.
async fn uncached_volume(
    env: &sluice_engine::rt::Env,
    specs: Vec<sluice_engine::pool::LeafSpec>,
    size: u64,
) -> (Arc<Store>, Vec<u8>) {
    let t = Tunables::with([("cache.contents", "metadata")]).unwrap();
    let spec = PoolSpec {
        name: "tank".into(),
        ashift: 12,
        top: vec![TopSpec::Leaf(specs.into_iter().next().unwrap())],
    };
    let pool = Pool::create(env, spec, &t).await.unwrap();
    let store = Arc::new(Store::create(pool, &t));
    store.create_volume("v", size, 16384).unwrap();
    let model: Vec<u8> = (0..size).map(|i| (i / 512) as u8).collect();
    store.write("v", 0, &model).await.unwrap();
    store.sync().await.unwrap();
    (store, model)
}

/// A client's partial write under concurrency, through the volume front with no data cached:
/// it is answered before the read of the version below that completes its patch (a task of
/// its own does that), and the block is right before and after that read, after a sync and
/// in the audit.
#[test]
fn a_patch_is_completed_after_its_writes_answer() {
    let sim = Sim::new(34);
    let legs = common::legs(&sim, 1, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        const SIZE: u64 = 1 << 20;
        let (store, mut model) = uncached_volume(&env, specs, SIZE).await;
        let (a, b) = (
            sluice_engine::volume::Volume::open(&store, "v").unwrap(),
            sluice_engine::volume::Volume::open(&store, "v").unwrap(),
        );
        // Another client's write, held in flight: the volume has two requests, so the next
        // write's patch is to be completed at once rather than left to the sync.
        let (reached, release) = store.arm_pause("dmu.assigned");
        let held = async move {
            b.write(16384 * 40, &[0x11; 16384], false).await.unwrap();
        };
        let model = &mut model;
        let rest = async {
            reached.await.unwrap();
            let reads = || store.pool().leaves()[0].leaf.stats().reads.get();
            let before = reads();
            a.write(16384 * 5 + 4096, &[0x77; 4096], false).await.unwrap();
            model[16384 * 5 + 4096..16384 * 5 + 8192].fill(0x77);
            assert_eq!(reads(), before, "the write waited for the read of the block below");
            env.sleep(Duration::from_millis(5)).await;
            assert!(reads() > before, "nobody read the block below to complete the patch");
            let block = store.read("v", 16384 * 5, 16384).await.unwrap();
            assert!(block[..] == model[16384 * 5..16384 * 6], "the completed block read wrong");
            // A zero of part of a block (a client's trim) answers the same way.
            let before = reads();
            a.zero(16384 * 9 + 8192, 4096, false).await.unwrap();
            model[16384 * 9 + 8192..16384 * 9 + 12288].fill(0);
            assert_eq!(reads(), before, "the zero waited for the read of the block below");
            env.sleep(Duration::from_millis(5)).await;
            assert!(reads() > before, "nobody read the block below to complete the zero's patch");
            let block = store.read("v", 16384 * 9, 16384).await.unwrap();
            assert!(block[..] == model[16384 * 9..16384 * 10], "the zeroed block read wrong");
            // Both said so where `pool iostat` looks.
            let patches = store.patch_stats();
            assert_eq!(patches.completed_beside.get(), 2);
            assert_eq!(patches.completed_by_sync.get(), 0);
            assert_eq!(store.patches_waiting(), 0);
            drop(release);
        };
        futures::join!(held, rest);
        model[16384 * 40..16384 * 41].fill(0x11);
        store.sync().await.unwrap();
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), *model);
        // That read may have rewritten blocks it found scattered (dmu_rewrite.rs).
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
    })
    .unwrap();
}

/// A lone client's partial write leaves its patch to the sync (its read would run beside its
/// own log write), and the figures `pool iostat` shows say where it was completed.
#[test]
fn a_lone_writes_patch_is_completed_by_the_sync() {
    let sim = Sim::new(36);
    let legs = common::legs(&sim, 1, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        const SIZE: u64 = 1 << 20;
        let (store, mut model) = uncached_volume(&env, specs, SIZE).await;
        let volume = sluice_engine::volume::Volume::open(&store, "v").unwrap();
        let reads = || store.pool().leaves()[0].leaf.stats().reads.get();
        let before = reads();
        volume.write(16384 * 7 + 4096, &[0x42; 4096], false).await.unwrap();
        model[16384 * 7 + 4096..16384 * 7 + 8192].fill(0x42);
        env.sleep(Duration::from_millis(5)).await;
        assert_eq!(reads(), before, "a lone write's patch was read before its sync");
        let patches = store.patch_stats();
        assert_eq!((patches.completed_beside.get(), patches.completed_by_sync.get()), (0, 0));
        store.sync().await.unwrap();
        assert!(reads() > before, "the sync did not read the block below the patch");
        assert_eq!((patches.completed_beside.get(), patches.completed_by_sync.get()), (0, 1));
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), model);
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
    })
    .unwrap();
}

/// Past the tasks that complete patches (64), a client's partial writes are still answered
/// without a read: their patches wait in line for a task, which completes them once its own
/// read is back. Before, such a write read the block below itself before its answer, and
/// where the disk stalled behind the sync's flush every write in flight waited for it.
#[test]
fn patches_past_the_completing_tasks_wait_in_line_not_their_writes() {
    let sim = Sim::new(35);
    let legs = common::legs(&sim, 1, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    sim.run(async move {
        const SIZE: u64 = 4 << 20;
        const WRITES: u64 = 80;
        let (store, mut model) = uncached_volume(&env, specs, SIZE).await;
        let (a, b) = (
            sluice_engine::volume::Volume::open(&store, "v").unwrap(),
            sluice_engine::volume::Volume::open(&store, "v").unwrap(),
        );
        // Another client's write held in flight: the volume has two requests, so each
        // partial write's patch is to be completed at once.
        let (reached, release) = store.arm_pause("dmu.assigned");
        let held = async move {
            b.write(0, &[0x11; 16384], false).await.unwrap();
        };
        let model = &mut model;
        let legs = &legs;
        let rest = async {
            reached.await.unwrap();
            let reads = || store.pool().leaves()[0].leaf.stats().reads.get();
            // Every read takes 0.8 s: the 64 tasks all wait on theirs.
            legs[0].inject(sluice_engine::device::sim::Fault::Slow { factor: 10_000 });
            let (start, before, syncs) = (env.now(), reads(), store.syncs());
            for i in 0..WRITES {
                let at = 16384 * (100 + i) + 4096;
                a.write(at, &[0x55; 4096], false).await.unwrap();
                model[at as usize..at as usize + 4096].fill(0x55);
            }
            let took = env.now().since(start);
            assert!(took < Duration::from_millis(100), "{WRITES} writes took {took:?}");
            // The line holds what the 64 tasks could not take, and `pool iostat` says so.
            assert_eq!(store.patches_waiting(), WRITES - 64);
            legs[0].clear_faults();
            env.sleep(Duration::from_secs(3)).await;
            // No sync ran, so the tasks read every block, the line's included.
            assert_eq!(store.syncs(), syncs, "a sync ran and may have completed the patches");
            assert!(reads() - before >= WRITES, "{} reads for {WRITES} patches", reads() - before);
            assert_eq!(store.patches_waiting(), 0);
            assert_eq!(store.patch_stats().completed_beside.get(), WRITES);
            assert_eq!(store.patch_stats().left_to_sync.get(), 0);
            drop(release);
        };
        futures::join!(held, rest);
        model[..16384].fill(0x11);
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), *model);
        store.sync().await.unwrap();
        assert_eq!(store.read("v", 0, SIZE).await.unwrap(), *model);
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
    })
    .unwrap();
}
