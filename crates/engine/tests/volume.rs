//! Volumes: resize and destroy (alone and during a sync), holes reported by block status,
//! request counts and latency per volume, and a shrink that lands between a write's range check
//! and its insert (made to happen every time with a pause point; crates/host/tests/
//! shrink_race.rs races the same on real threads, where it happens only some of the time): the
//! write is refused as out of range, nothing is stored past the new end, the audit balances,
//! and a grow reads the tail back as zeros. Indirect blocks as scattered writes, overwrites and
//! zeroes change their slots: each slot its pointer's encoding, fills their children's, and a
//! block of holes a hole.

use crate::common;

use sluice_engine::device::SimProfile;
use sluice_engine::objset;
use sluice_engine::pool::Pool;
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::txg::{Store, StoreError};
use sluice_format::{BlockPointer, BLKPTR_BYTES};
use sluice_sim::Sim;
use std::sync::Arc;
use std::time::Duration;

const LEAF_BYTES: u64 = 64 << 20;

/// Volumes resize and are destroyed: growing past what the tree's levels address keeps every
/// block and adds levels; shrinking drops the blocks past the end and frees their space;
/// destroying frees the whole tree. All of it survives export and import.
#[test]
fn resize_and_destroy_volumes() {
    let sim = Sim::new(99);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let spec = common::mirror_pool(specs.clone());
        let store = Store::create(Pool::create(&env, spec, &tunables).await.unwrap(), &tunables);
        // 64 blocks of 4 KiB: one level of indirection.
        store.create_volume("v", 64 * 4096, 4096).unwrap();
        store.create_volume("gone", 1 << 20, 4096).unwrap();
        store.write("v", 0, &[1; 4096]).await.unwrap();
        store.write("v", 63 * 4096, &[2; 4096]).await.unwrap();
        store.write("gone", 0, &vec![3; 1 << 20]).await.unwrap();
        store.sync().await.unwrap();
        let full = store.free_bytes();
        // Grow to 1000 blocks: needs two levels; old blocks stay, new space is writable.
        store.resize_volume("v", 1000 * 4096).await.unwrap();
        // Before the sync that deepens the tree, the new blocks read as zeros: the old tree
        // addresses 128 blocks, and block 128 is not block 0.
        for block in [128u64, 191] {
            let got = store.read("v", block * 4096, 4096).await.unwrap();
            assert!(got == vec![0; 4096], "block {block} read another block's bytes");
        }
        store.write("v", 999 * 4096, &[4; 4096]).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![1; 4096]);
        assert_eq!(store.read("v", 63 * 4096, 4096).await.unwrap(), vec![2; 4096]);
        // Shrink to 32 blocks: block 63 and 999 go; reads past the end are refused.
        store.resize_volume("v", 32 * 4096).await.unwrap();
        assert!(store.read("v", 63 * 4096, 4096).await.is_err());
        store.destroy_volume("gone").await.unwrap();
        assert!(store.read("gone", 0, 4096).await.is_err());
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        // Less what the two-level tree that remains (each indirect block in two copies) and
        // the space maps and directory (in two and three copies) of the later txgs hold.
        let free = store.free_bytes();
        assert!(
            free > full + (1 << 20) - 4 * 65536,
            "destroyed and cut blocks were freed: {free} free, {full} before"
        );
        store.export().await.unwrap();
        let store =
            Store::open(Pool::import(&env, specs, "tank", &tunables).await.unwrap(), &tunables)
                .await
                .unwrap();
        let volumes = store.volumes();
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].size_bytes, 32 * 4096);
        assert_eq!(store.read("v", 0, 4096).await.unwrap(), vec![1; 4096]);
        // Growing again exposes zeros, not the old block 63.
        store.resize_volume("v", 64 * 4096).await.unwrap();
        assert_eq!(store.read("v", 63 * 4096, 4096).await.unwrap(), vec![0; 4096]);
    })
    .unwrap();
}

/// A volume's allocation map, asserting that a read's map (`read_with_status`, what NBD reads
/// use) agrees with `block_status`, and its data with `read`.
async fn block_status_checked(store: &Store, offset: u64, len: u64) -> Vec<(u64, bool)> {
    let status = store.block_status("v", offset, len).await.unwrap();
    let (data, runs) = store.read_with_status("v", offset, len).await.unwrap();
    assert_eq!(runs, status, "the read's map at {offset}+{len}");
    assert_eq!(data.to_vec(), store.read("v", offset, len).await.unwrap(), "the read's data");
    status
}

/// Holes are reported as such: never-written, trimmed and zeroed ranges are holes (and read as
/// zeros), written ones are data, before and after a sync, and a read's map agrees.
#[test]
fn block_status_reports_holes() {
    let sim = Sim::new(5);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let spec = common::mirror_pool(specs);
        let store = Store::create(Pool::create(&env, spec, &tunables).await.unwrap(), &tunables);
        store.create_volume("v", 1 << 20, 4096).unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, vec![(1 << 20, false)]);
        store.write("v", 8192, &[1; 8192]).await.unwrap();
        let expected = vec![(8192, false), (8192, true), ((1 << 20) - 16384, false)];
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, expected);
        store.sync().await.unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, expected);
        // A partial write over a synced block and one over a hole, both still in memory.
        store.write("v", 8192 + 512, &[2; 512]).await.unwrap();
        store.write("v", 40960 + 1024, &[3; 1024]).await.unwrap();
        let patched = vec![
            (8192, false),
            (8192, true),
            (40960 - 16384, false),
            (4096, true),
            ((1 << 20) - 45056, false),
        ];
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, patched);
        store.sync().await.unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, patched);
        store.zero("v", 40960, 4096).await.unwrap();
        // A zeroed block in memory, not yet synced, is a hole.
        store.zero("v", 8192, 4096).await.unwrap();
        let after = vec![(12288, false), (4096, true), ((1 << 20) - 16384, false)];
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, after);
        store.sync().await.unwrap();
        assert_eq!(block_status_checked(&store, 0, 1 << 20).await, after);
        assert_eq!(store.read("v", 8192, 4096).await.unwrap(), vec![0; 4096]);
        // Partial ranges are clipped to the request.
        assert_eq!(block_status_checked(&store, 12800, 1024).await, vec![(1024, true)]);
        assert_eq!(
            block_status_checked(&store, 11776, 1024).await,
            vec![(512, false), (512, true)]
        );
    })
    .unwrap();
}

/// A volume's indirect blocks after scattered writes, overwrites and zeroes: every slot is
/// stored as its pointer encodes (the sync copies an indirect block's unchanged slots as they
/// are and encodes only the changed ones), each block's fill is its children's, a level-1
/// block whose data all became holes is a hole itself, and so is the root once every block is.
#[test]
fn indirect_blocks_hold_their_childrens_encodings_as_slots_change() {
    let sim = Sim::new(11);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let (env, specs) = (sim.env(), common::leaf_specs(&legs));
    sim.run(async move {
        let store = common::mirror_store(&env, specs, &Tunables::default()).await;
        // 1,024 blocks of 4 KiB: eight level-1 blocks of 128 under the root.
        store.create_volume("v", 4 << 20, 4096).unwrap();
        let node_bytes = 128 * 4096;
        let scattered = [0u64, 5, 127, 128 + 3, 128 + 64, 3 * 128 + 9, 7 * 128 + 127];
        for (i, &block) in scattered.iter().enumerate() {
            store.write("v", block * 4096, &[i as u8 + 1; 4096]).await.unwrap();
        }
        store.sync().await.unwrap();
        assert_eq!(level_one_blocks(&store).await, vec![0, 128, 384, 896]);
        // Overwrites and a zero beside untouched slots of the same level-1 blocks.
        store.write("v", 5 * 4096, &[9; 4096]).await.unwrap();
        store.write("v", 6 * 4096, &[10; 4096]).await.unwrap();
        store.zero("v", 127 * 4096, 4096).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(level_one_blocks(&store).await, vec![0, 128, 384, 896]);
        assert_eq!(store.read("v", 5 * 4096, 8192).await.unwrap()[4095..4097], [9, 10]);
        assert_eq!(store.read("v", 127 * 4096, 4096).await.unwrap(), vec![0; 4096]);
        // Every data block under the second level-1 block zeroed: it goes, its neighbours stay.
        store.zero("v", node_bytes, node_bytes).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(level_one_blocks(&store).await, vec![0, 384, 896]);
        assert!(store.audit().await.unwrap().is_clean());
        store.zero("v", 0, 4 << 20).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(store.volume_info("v").unwrap().root, None, "a tree of holes is a hole");
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

/// The first data block under each level-1 block of volume "v", after checking every indirect
/// block: each slot's bytes are its decoded pointer's encoding, and its fill the sum of its
/// children's.
async fn level_one_blocks(store: &Store) -> Vec<u64> {
    let entry = store.volume_info("v").unwrap();
    let tree = objset::walk(store.pool(), entry.root, entry.levels).await.unwrap();
    for (level, base, bp) in &tree {
        if *level == 0 {
            continue;
        }
        let bytes = store.pool().read_block_cached(bp, IoClass::SyncRead).await.unwrap();
        let mut fill = 0;
        for slot in bytes.chunks_exact(BLKPTR_BYTES) {
            let child = BlockPointer::decode(slot).unwrap();
            assert_eq!(&BlockPointer::encode(child.as_ref())[..], slot, "level {level} at {base}");
            fill += child.map_or(0, |c| c.fill);
        }
        assert_eq!(bp.fill, fill, "the fill of the level-{level} block over blocks {base}..");
    }
    let mut bases: Vec<u64> =
        tree.iter().filter(|(level, ..)| *level == 1).map(|(_, base, _)| *base).collect();
    bases.sort_unstable();
    bases
}

/// The volume front counts every answered request per type, across all handles, with its
/// bytes and its latency from arrival to answer; errors are counted too.
#[test]
fn volumes_count_requests_and_their_latency() {
    use sluice_engine::stats::VolumeOp;
    let sim = Sim::new(32);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs, &t).await);
        store.create_volume("v", 4 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let a = sluice_engine::volume::Volume::open(&store, "v").unwrap();
        let b = sluice_engine::volume::Volume::open(&store, "v").unwrap();
        for i in 0..3u64 {
            a.write(i * 4096, &[1; 4096], false).await.unwrap();
        }
        b.write(65536, &[2; 8192], true).await.unwrap();
        // The FUA write made everything before it durable; this one leaves the flush work.
        a.write(12288, &[1; 4096], false).await.unwrap();
        // A whole block: the only write that is not partial.
        b.write(16384 * 8, &[3; 16384], false).await.unwrap();
        a.flush().await.unwrap();
        assert_eq!(b.read(0, 4096).await.unwrap(), vec![1; 4096]);
        b.zero(0, 16384, false).await.unwrap();
        assert!(a.read(8 << 20, 4096).await.is_err(), "a read beyond the end must fail");
        let stats = store.volume_stats("v").unwrap();
        let requests = |op: VolumeOp| stats.requests[op.index()].get();
        assert_eq!(
            VolumeOp::ALL.map(requests),
            [2, 6, 1, 1],
            "reads, writes, flushes, zeroes counted over both handles"
        );
        assert_eq!(stats.write_bytes.get(), 4 * 4096 + 8192 + 16384);
        assert_eq!(stats.partial_writes.get(), 5, "writes covering part of a 16 KiB block");
        assert_eq!(stats.read_bytes.get(), 4096, "the failed read moved no bytes");
        assert_eq!(stats.errors.get(), 1);
        for op in VolumeOp::ALL {
            assert_eq!(stats.latency[op.index()].count(), requests(op), "{op:?} latencies");
        }
        // The flush waited for the log's device write and flush (300 us on this SSD model);
        // the plain writes only for memory.
        let flush = stats.latency[VolumeOp::Flush.index()].mean();
        assert!(flush >= Duration::from_micros(300), "flush latency {flush:?}");
        assert!(stats.latency[VolumeOp::Write.index()].quantile(0.5) < flush);
        assert!(store.volume_stats("nope").is_err());
    })
    .unwrap();
}

/// Resizes and destroys that arrive while a sync is in flight. The sync writes each volume's
/// tree at the levels of its quiesce and records it by name when it ends; a grow across a
/// level boundary inside it used to leave a root read with one level too many, and a destroy
/// (then a create under the same name) inside it freed the old tree twice and gave the new
/// volume the old one's blocks. They now wait for the sync. The audit balances and an import
/// reads every volume back.
#[test]
fn resize_and_destroy_during_a_sync() {
    let sim = Sim::new(101);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let tunables = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &tunables).await);
        // 64 blocks: one level; growing to 256 crosses to two.
        store.create_volume("grow", 64 * 4096, 4096).unwrap();
        store.create_volume("gone", 64 * 4096, 4096).unwrap();
        store.write("grow", 0, &[1; 64 * 4096]).await.unwrap();
        store.write("gone", 0, &[2; 64 * 4096]).await.unwrap();
        store.sync().await.unwrap();
        store.write("grow", 0, &[3; 64 * 4096]).await.unwrap();
        store.write("gone", 0, &[4; 64 * 4096]).await.unwrap();
        let syncing = Arc::clone(&store);
        let (done, finished) = futures::channel::oneshot::channel();
        env.spawn("sync", async move {
            let _ = done.send(syncing.sync().await.map(drop));
        });
        // Let the sync quiesce and start writing.
        env.sleep(Duration::from_micros(1)).await;
        store.resize_volume("grow", 256 * 4096).await.unwrap();
        store.destroy_volume("gone").await.unwrap();
        store.create_volume("gone", 64 * 4096, 4096).unwrap();
        finished.await.unwrap().unwrap();
        store.write("grow", 200 * 4096, &[5; 4096]).await.unwrap();
        store.sync().await.unwrap();
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        let check = |store: Arc<Store>| async move {
            assert_eq!(store.read("grow", 0, 64 * 4096).await.unwrap(), vec![3; 64 * 4096]);
            assert_eq!(store.read("grow", 200 * 4096, 4096).await.unwrap(), vec![5; 4096]);
            assert_eq!(store.read("gone", 0, 64 * 4096).await.unwrap(), vec![0; 64 * 4096]);
        };
        check(Arc::clone(&store)).await;
        Arc::try_unwrap(store).unwrap().export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &tunables).await.unwrap();
        let store = Arc::new(Store::open(pool, &tunables).await.unwrap());
        check(Arc::clone(&store)).await;
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

const FULL: u64 = 4 << 20;
const SHRUNK: u64 = 3 << 20;
const BLOCK: u32 = 16384;

#[test]
fn a_shrink_between_a_writes_check_and_its_insert_refuses_the_write() {
    let sim = Sim::new(21);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    sim.run(async move {
        let store = Arc::new(
            common::mirror_store(&env, common::leaf_specs(&legs), &Tunables::default()).await,
        );
        store.create_volume("v", FULL, BLOCK).unwrap();
        store.sync().await.unwrap();
        let (reached, release) = store.arm_pause("dmu.assigned");
        // A write into the part the shrink takes away, stopped after its range check.
        let write = {
            let store = Arc::clone(&store);
            async move { store.write("v", SHRUNK + 65536, &[0x5a; 262144]).await }
        };
        let shrink = async {
            reached.await.unwrap();
            store.resize_volume("v", SHRUNK).await.unwrap();
            drop(release);
        };
        let (written, ()) = futures::join!(write, shrink);
        assert!(
            matches!(written, Err(StoreError::OutOfRange { size_bytes: SHRUNK, .. })),
            "the write that the shrink overtook: {written:?}"
        );
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        store.resize_volume("v", FULL).await.unwrap();
        let tail = store.read("v", SHRUNK, FULL - SHRUNK).await.unwrap();
        assert!(tail.iter().all(|&b| b == 0), "the refused write's bytes are in the tail");
    })
    .unwrap();
}
