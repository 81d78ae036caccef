//! Prefetch of sequential reads (docs/design.md, "Sequential reads are fetched ahead";
//! txg/dmu_zfetch.rs) on the simulator, with no data cached (`cache.contents=metadata`), so
//! every read goes to the disks: a volume whose blocks rewrites have scattered reads back
//! whole and right in fewer I/Os than blocks; a block written after it was fetched ahead reads
//! its new bytes, from memory or from its new place; a damaged block fetched ahead fails only
//! itself on one leaf and is healed on a mirror; an encrypted volume's blocks fetched ahead
//! open with its key and not without. And the rewrite of what a stream's reads find scattered
//! (txg/dmu_rewrite.rs): the blocks come to lie side by side and read back the same; blocks a
//! snapshot shares stay where they are, and where the pool's free space is small holes,
//! blocks move only where there is room in runs at least twice as long, so pass after pass
//! none moves often; on RAID-Z the runs count parity and padding too; a write that lands
//! while the read is in flight is never undone by the rewrite.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::sim::Fault;
use sluice_engine::device::sim::SsdParams;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::TopSpec;
use sluice_engine::stats::PrefetchStats;
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::txg::{NewKey, Store};
use sluice_engine::UserKey;
use sluice_format::{BlockPointer, KeyFormat, KeyLocation, PoolDirectory};
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const VOLUME_BYTES: u64 = 8 << 20;
const BLOCK: u64 = 16384;
/// The size of each sequential read.
const READ: u64 = 128 << 10;

/// Devices that take time: on instant ones a read never waits, so the fetch it spawns would
/// run only after the test's reads.
fn ssd() -> SimProfile {
    SimProfile::Ssd(SsdParams::default())
}

fn no_data_cached() -> Tunables {
    Tunables::with([("cache.contents", "metadata")]).unwrap()
}

/// A volume "v" of random data on `legs` (one leaf, a mirror of two, or a RAID-Z1 of three or
/// more), whose blocks four
/// rounds of rewrites, each its own txg, have moved apart: neighbouring blocks no longer lie
/// side by side. Returns the store and the volume's bytes.
fn scattered(sim: &Sim, legs: &[SimDevice], tunables: &Tunables) -> (Arc<Store>, Vec<u8>) {
    let top = |leaves: Vec<_>| match leaves.len() {
        1 => TopSpec::Leaf(leaves.into_iter().next().unwrap()),
        2 => TopSpec::Mirror(leaves),
        _ => TopSpec::Raidz { parity: 1, leaves },
    };
    // Random bytes, then text lz4 shrinks: blocks stored plain and compressed.
    let mut data = common::random_bytes(1, VOLUME_BYTES / 2);
    let mut line = 0u64;
    while data.len() < VOLUME_BYTES as usize {
        data.extend_from_slice(format!("line {line:08} of a volume read in order\n").as_bytes());
        line += 1;
    }
    data.truncate(VOLUME_BYTES as usize);
    let store = common::store_with_volume(sim, legs, top, tunables, &data, BLOCK as u32, |_| {});
    let mut writes = Vec::new();
    for round in 0..4u64 {
        for index in (round..VOLUME_BYTES / BLOCK).step_by(3 + round as usize) {
            let bytes = common::random_bytes(100 + round * 10_000 + index, BLOCK);
            data[(index * BLOCK) as usize..][..BLOCK as usize].copy_from_slice(&bytes);
            writes.push((round, index * BLOCK, bytes));
        }
    }
    let s = Arc::clone(&store);
    sim.run(async move {
        for round in 0..4 {
            for (_, at, bytes) in writes.iter().filter(|(r, _, _)| *r == round) {
                s.write("v", *at, bytes).await.unwrap();
            }
            s.sync().await.unwrap();
        }
    })
    .unwrap();
    (store, data)
}

/// Reads the whole of "v" as [`read_in_order`] does; every read must succeed.
fn read_volume(sim: &Sim, store: &Arc<Store>) -> Vec<u8> {
    read_in_order(sim, store, 0..VOLUME_BYTES).into_iter().flat_map(|r| r.unwrap()).collect()
}

/// Reads `range` of "v" in reads of [`READ`] bytes, in order; returns each read's result.
fn read_in_order(
    sim: &Sim,
    store: &Arc<Store>,
    range: std::ops::Range<u64>,
) -> Vec<Result<Vec<u8>, String>> {
    let s = Arc::clone(store);
    sim.run(async move {
        let mut out = Vec::new();
        for at in range.step_by(READ as usize) {
            out.push(s.read("v", at, READ).await.map_err(|e| e.to_string()));
        }
        out
    })
    .unwrap()
    .0
}

fn prefetch(store: &Store) -> (u64, u64, u64, u64) {
    let stats = store.volume_stats("v").unwrap();
    let p: &PrefetchStats = &stats.prefetch;
    (p.blocks_fetched.get(), p.ios.get(), p.blocks_used.get(), p.blocks_unused.get())
}

/// Volume "v"'s data block `index`, as the pool's newest tree has it.
fn block_pointer(sim: &Sim, store: &Arc<Store>, index: u64) -> BlockPointer {
    let s = Arc::clone(store);
    sim.run(async move {
        let root = s.pool().uberblock().root.unwrap();
        let bytes = s.pool().read_block(&root, IoClass::SyncRead).await.unwrap();
        let directory = PoolDirectory::decode(&bytes).unwrap();
        let entry = directory.volumes.iter().find(|v| v.name == "v").unwrap();
        sluice_engine::objset::data_block_pointer(s.pool(), entry.root, entry.levels, index)
            .await
            .unwrap()
            .unwrap()
    })
    .unwrap()
    .0
}

#[test]
fn scattered_blocks_read_in_order_come_ahead_in_fewer_ios_than_blocks() {
    let sim = Sim::new(1);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let (store, data) = scattered(&sim, &legs, &no_data_cached());
    let got = read_volume(&sim, &store);
    assert!(got == data, "the volume read in order returned wrong bytes");
    let (fetched, ios, used, _) = prefetch(&store);
    let blocks = VOLUME_BYTES / BLOCK;
    assert!(used >= blocks * 3 / 4, "{used} of {blocks} blocks came from the prefetch");
    assert!(fetched >= used);
    assert!(ios * 2 < fetched, "{fetched} blocks fetched ahead took {ios} I/Os");
    // With prefetch off, the same reads fetch nothing ahead.
    let sim = Sim::new(1);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let mut off = no_data_cached();
    off.set("zfetch.max_distance", "0").unwrap();
    let (store, data) = scattered(&sim, &legs, &off);
    let got = read_volume(&sim, &store);
    assert!(got == data);
    assert_eq!(prefetch(&store), (0, 0, 0, 0));
}

#[test]
fn a_block_written_after_it_was_fetched_ahead_reads_its_new_bytes() {
    let sim = Sim::new(2);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let (store, mut data) = scattered(&sim, &legs, &no_data_cached());
    // Reading the first MiB fetches well past it.
    for read in read_in_order(&sim, &store, 0..1 << 20) {
        read.unwrap();
    }
    let (fetched, _, _, _) = prefetch(&store);
    assert!(fetched * BLOCK > (1 << 20) + 4 * READ, "{fetched} blocks fetched ahead");
    // Two blocks just ahead change: one synced to a new place, one left in the open txg.
    let synced = vec![0xa5; BLOCK as usize];
    let open = vec![0x5a; BLOCK as usize];
    let (at_synced, at_open) = ((1 << 20) + BLOCK, (1 << 20) + 3 * BLOCK);
    data[at_synced as usize..][..BLOCK as usize].copy_from_slice(&synced);
    data[at_open as usize..][..BLOCK as usize].copy_from_slice(&open);
    let s = Arc::clone(&store);
    sim.run(async move {
        s.write("v", at_synced, &synced).await.unwrap();
        s.sync().await.unwrap();
        s.write("v", at_open, &open).await.unwrap();
    })
    .unwrap();
    let got: Vec<u8> = read_in_order(&sim, &store, (1 << 20)..VOLUME_BYTES)
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    assert!(got == data[1 << 20..], "a block rewritten after its fetch read stale bytes");
    let (_, _, _, unused) = prefetch(&store);
    assert!(unused >= 1, "the synced block's old version was not dropped");
}

#[test]
fn a_damaged_block_fetched_ahead_fails_alone_on_one_leaf_and_heals_on_a_mirror() {
    // One leaf: the damaged block's read fails, every other read returns the right bytes.
    let sim = Sim::new(3);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let (store, data) = scattered(&sim, &legs, &no_data_cached());
    let damaged = 200;
    let bp = block_pointer(&sim, &store, damaged);
    legs[0].inject(Fault::BitFlip { offset_bytes: bp.dvas[0].offset_bytes() + 100, bit: 3 });
    let reads = read_in_order(&sim, &store, 0..VOLUME_BYTES);
    for (i, read) in reads.iter().enumerate() {
        let at = i as u64 * READ;
        if (at..at + READ).contains(&(damaged * BLOCK)) {
            match read {
                Err(error) => assert!(error.contains("checksum"), "{error}"),
                Ok(_) => panic!("the read at {at} of a damaged block succeeded"),
            }
        } else {
            let got = read.as_ref().unwrap();
            assert!(got[..] == data[at as usize..][..READ as usize], "read at {at} was wrong");
        }
    }
    assert!(prefetch(&store).2 > 0, "the reads used blocks fetched ahead");
    // A mirror: every read is right, and the bad copies are rewritten.
    let sim = Sim::new(4);
    let legs = common::legs(&sim, 2, ssd(), LEG_BYTES);
    let mut tunables = no_data_cached();
    tunables.set("mirror.read_policy", "round-robin").unwrap();
    let (store, data) = scattered(&sim, &legs, &tunables);
    for index in (0..VOLUME_BYTES / BLOCK).step_by(7) {
        let bp = block_pointer(&sim, &store, index);
        legs[(index % 2) as usize]
            .inject(Fault::BitFlip { offset_bytes: bp.dvas[0].offset_bytes() + 100, bit: 5 });
    }
    let got = read_volume(&sim, &store);
    assert!(got == data, "a mirror returned wrong bytes");
    let repairs: u64 = store.pool().leaves().iter().map(|l| l.leaf.stats().repairs.get()).sum();
    assert!(repairs > 0, "no bad copy was rewritten");
    assert!(prefetch(&store).2 > 0, "the reads used blocks fetched ahead");
}

/// A mirror of `legs` caching no data, with an encrypted volume "v" under a raw key of
/// `key_byte`s holding `data`, synced.
async fn encrypted_volume(
    env: &sluice_engine::rt::Env,
    legs: &[SimDevice],
    key_byte: u8,
    data: &[u8],
) -> Store {
    let store = common::mirror_store(env, common::leaf_specs(legs), &no_data_cached()).await;
    let key = NewKey {
        format: KeyFormat::Raw,
        location: KeyLocation::Prompt,
        key: UserKey::new(vec![key_byte; 32]),
    };
    store.create_encrypted_volume("v", VOLUME_BYTES, BLOCK as u32, false, key).await.unwrap();
    store.write("v", 0, data).await.unwrap();
    store.sync().await.unwrap();
    store
}

#[test]
fn an_encrypted_volume_fetched_ahead_opens_with_its_key_only() {
    let sim = Sim::new(5);
    let legs = common::legs(&sim, 2, ssd(), LEG_BYTES);
    let env = sim.env();
    let data = common::random_bytes(5, VOLUME_BYTES);
    let expected = data.clone();
    let store =
        sim.run(async move { Arc::new(encrypted_volume(&env, &legs, 3, &data).await) }).unwrap().0;
    // Half the volume in order: the rest is fetched ahead.
    let first: Vec<u8> = read_in_order(&sim, &store, 0..VOLUME_BYTES / 2)
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    assert!(first == expected[..VOLUME_BYTES as usize / 2]);
    assert!(prefetch(&store).2 > 0, "the reads used blocks fetched ahead");
    let s = Arc::clone(&store);
    sim.run(async move { s.unload_key("v").await.unwrap() }).unwrap();
    for read in read_in_order(&sim, &store, VOLUME_BYTES / 2..VOLUME_BYTES) {
        match read {
            Err(error) => assert!(error.contains("key"), "a read without the key: {error}"),
            Ok(_) => panic!("a read of an encrypted volume succeeded without its key"),
        }
    }
    let s = Arc::clone(&store);
    sim.run(async move { s.load_key("v", &UserKey::new(vec![3; 32])).await.unwrap() }).unwrap();
    let rest: Vec<u8> = read_in_order(&sim, &store, VOLUME_BYTES / 2..VOLUME_BYTES)
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect();
    assert!(rest == expected[VOLUME_BYTES as usize / 2..]);
}

/// An encrypted volume's blocks fetched ahead are decrypted on every core, as a read's own
/// span of them is: 1 MiB reads in order, each served whole from blocks fetched ahead, hand
/// their blocks to the other core (opened on the reading core alone, uncached 1 MiB reads of
/// an encrypted volume ran at 0.73x-0.78x of one that is not, bench/encryption.py), and read
/// back what was written.
#[test]
fn an_encrypted_volumes_blocks_fetched_ahead_are_decrypted_on_every_core() {
    const READ_LARGE: u64 = 1 << 20;
    let sim = Sim::new(6);
    let legs = common::legs(&sim, 2, ssd(), LEG_BYTES);
    let spread: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let count = Arc::clone(&spread);
    let env = sim.env().with_spawner(move |inner| {
        Arc::new(common::Counting { inner, name: "zio_read_intr", spawned: count, drops: false })
    });
    let data = common::random_bytes(6, VOLUME_BYTES);
    let (opened_ahead, spread_ahead) = sim
        .run(async move {
            let store = encrypted_volume(&env, &legs, 4, &data).await;
            let used = || store.volume_stats("v").unwrap().prefetch.blocks_used.get();
            let spread_now = || spread.load(std::sync::atomic::Ordering::Relaxed);
            // The first reads start the stream; from the fourth MiB on, the reads find every
            // block fetched ahead.
            let mut ahead = (0, 0);
            for at in (0..VOLUME_BYTES).step_by(READ_LARGE as usize) {
                let (used_before, spread_before) = (used(), spread_now());
                let got = store.read("v", at, READ_LARGE).await.unwrap();
                assert!(got == data[at as usize..(at + READ_LARGE) as usize], "MiB at {at}");
                if at >= 3 * READ_LARGE {
                    assert_eq!(used() - used_before, READ_LARGE / BLOCK, "MiB at {at} fetched");
                    ahead.0 += used() - used_before;
                    ahead.1 += spread_now() - spread_before;
                }
            }
            ahead
        })
        .unwrap()
        .0;
    assert_eq!(opened_ahead, (VOLUME_BYTES - 3 * READ_LARGE) / BLOCK);
    assert!(spread_ahead > 0, "{opened_ahead} blocks fetched ahead were opened on one core");
}

fn rewrites(store: &Store) -> (u64, u64, u64, u64) {
    let stats = store.volume_stats("v").unwrap();
    let r = &stats.rewrite;
    (
        r.scattered_reads.get(),
        r.blocks_rewritten.get(),
        r.blocks_shared.get(),
        r.blocks_deferred.get(),
    )
}

/// Volume "v"'s blocks in the pool's newest tree, in block order.
fn all_block_pointers(sim: &Sim, store: &Arc<Store>) -> Vec<BlockPointer> {
    (0..VOLUME_BYTES / BLOCK).map(|index| block_pointer(sim, store, index)).collect()
}

/// Runs of blocks that lie side by side on disk, in block order.
fn runs(bps: &[BlockPointer]) -> usize {
    let follows = |a: &BlockPointer, b: &BlockPointer| {
        a.dvas[0].vdev == b.dvas[0].vdev
            && b.dvas[0].offset_bytes() == a.dvas[0].offset_bytes() + a.dvas[0].asize_bytes()
    };
    1 + bps.windows(2).filter(|pair| !follows(&pair[0], &pair[1])).count()
}

/// Syncs whatever the reads rewrote, then audits the pool's space: it must be clean.
fn sync_and_audit(sim: &Sim, store: Arc<Store>) {
    let audit = sim
        .run(async move {
            store.sync().await.unwrap();
            store.audit().await.unwrap()
        })
        .unwrap()
        .0;
    assert!(audit.is_clean(), "{:?}", audit.problems);
}

fn sync(sim: &Sim, store: &Arc<Store>) {
    let s = Arc::clone(store);
    sim.run(async move { s.sync().await.unwrap() }).unwrap();
}

#[test]
fn scattered_blocks_a_stream_reads_are_rewritten_side_by_side_and_read_the_same() {
    let sim = Sim::new(6);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let (store, data) = scattered(&sim, &legs, &no_data_cached());
    let before = runs(&all_block_pointers(&sim, &store));
    let got = read_volume(&sim, &store);
    assert!(got == data, "the volume read in order returned wrong bytes");
    let (scattered_reads, rewritten, shared, _) = rewrites(&store);
    let blocks = VOLUME_BYTES / BLOCK;
    assert!(scattered_reads > 0 && rewritten >= blocks / 2, "{rewritten} blocks rewritten");
    assert_eq!(shared, 0, "no snapshot shares a block");
    // Nothing changed on disk yet: the rewritten blocks wait in the open txg, and read the
    // same from there.
    assert_eq!(runs(&all_block_pointers(&sim, &store)), before);
    let got = read_volume(&sim, &store);
    assert!(got == data, "the rewritten blocks read wrong from memory");
    sync(&sim, &store);
    let after = runs(&all_block_pointers(&sim, &store));
    assert!(after * 8 < before, "{before} runs on disk before the rewrite, {after} after");
    // Read again from the disk: the same bytes, in fewer I/Os, and nothing left to rewrite.
    let (_, ios_before, _, _) = prefetch(&store);
    let got = read_volume(&sim, &store);
    assert!(got == data, "the rewritten volume read back wrong bytes");
    assert_eq!(rewrites(&store).1, rewritten, "blocks side by side were rewritten again");
    let (_, ios_after, _, _) = prefetch(&store);
    assert!(ios_after - ios_before < blocks / 8, "{} I/Os", ios_after - ios_before);
    sync_and_audit(&sim, store);

    // Off: the same reads rewrite nothing.
    let sim = Sim::new(6);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let mut off = no_data_cached();
    off.set("zfetch.rewrite_run_bytes", "0").unwrap();
    let (store, _) = scattered(&sim, &legs, &off);
    for read in read_in_order(&sim, &store, 0..VOLUME_BYTES) {
        read.unwrap();
    }
    assert_eq!(rewrites(&store), (0, 0, 0, 0));
}

#[test]
fn a_raidz_volumes_scattered_blocks_are_rewritten_side_by_side_and_read_the_same() {
    // Runs on RAID-Z are counted in what blocks allocate there (parity and padding beside
    // the data): the rewrite finds room and the blocks come to lie side by side.
    let sim = Sim::new(10);
    let legs = common::legs(&sim, 3, ssd(), LEG_BYTES);
    let (store, data) = scattered(&sim, &legs, &no_data_cached());
    let before = runs(&all_block_pointers(&sim, &store));
    let got = read_volume(&sim, &store);
    assert!(got == data, "the volume read in order returned wrong bytes");
    let (scattered_reads, rewritten, _, _) = rewrites(&store);
    let blocks = VOLUME_BYTES / BLOCK;
    assert!(scattered_reads > 0 && rewritten >= blocks / 2, "{rewritten} blocks rewritten");
    sync(&sim, &store);
    let after = runs(&all_block_pointers(&sim, &store));
    assert!(after * 8 < before, "{before} runs on disk before the rewrite, {after} after");
    let got = read_volume(&sim, &store);
    assert!(got == data, "the rewritten volume read back wrong bytes");
    assert_eq!(rewrites(&store).1, rewritten, "blocks side by side were rewritten again");
    sync_and_audit(&sim, store);
}

#[test]
fn scattered_blocks_move_only_into_longer_runs_when_the_free_space_is_small_holes() {
    let sim = Sim::new(9);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let (store, data) = scattered(&sim, &legs, &no_data_cached());
    // Another volume takes every free range it can, then gives back every other block: the
    // free space left is 16 KiB holes, where rewritten blocks would lie as scattered as
    // they do now, and what the slop reserve keeps.
    let filler_bytes = LEG_BYTES;
    store.create_volume("f", filler_bytes, BLOCK as u32).unwrap();
    let s = Arc::clone(&store);
    sim.run(async move {
        let chunk = common::random_bytes(77, 1 << 20);
        let mut filled = 0;
        while filled < filler_bytes && s.write("f", filled, &chunk).await.is_ok() {
            filled += chunk.len() as u64;
            if filled % (8 << 20) == 0 {
                s.sync().await.unwrap();
            }
        }
        assert!(filled < filler_bytes, "the filler found room for all of itself");
        s.sync().await.unwrap();
        for at in (0..filled).step_by(2 * BLOCK as usize) {
            s.zero("f", at, BLOCK).await.unwrap();
        }
        // The frees wait out their deferral.
        for _ in 0..4 {
            s.sync().await.unwrap();
        }
    })
    .unwrap();
    // Pass after pass, each followed by syncs that see its frees through: every rewrite
    // needs room in runs at least twice as long as those its blocks lie in (16 KiB blocks
    // reach 128 KiB runs in three), so no block moves more than three times, the layout never
    // gets worse, and what room is left in long runs is used.
    let blocks = VOLUME_BYTES / BLOCK;
    let mut bps = all_block_pointers(&sim, &store);
    let initial = runs(&bps);
    let mut layout = initial;
    let mut moves = vec![0u32; bps.len()];
    for pass in 0..8 {
        let got = read_volume(&sim, &store);
        assert!(got == data, "pass {pass}: the volume read in order returned wrong bytes");
        for _ in 0..4 {
            sync(&sim, &store);
        }
        let now_bps = all_block_pointers(&sim, &store);
        for (index, (was, now)) in bps.iter().zip(&now_bps).enumerate() {
            if was.dvas[0] != now.dvas[0] {
                moves[index] += 1;
                assert!(moves[index] <= 3, "pass {pass}: block {index} moved a fourth time");
            }
        }
        let now = runs(&now_bps);
        assert!(now <= layout, "pass {pass}: {now} runs on disk, {layout} before it");
        (bps, layout) = (now_bps, now);
    }
    let (scattered_reads, rewritten, _, deferred) = rewrites(&store);
    assert!(scattered_reads > 0, "no read found its blocks scattered");
    assert!(deferred > 0, "no block waited for room");
    assert!(rewritten > 0, "no block was rewritten: the room in longer runs went unused");
    assert!(layout < initial, "{layout} runs on disk after the passes, {initial} before them");
    assert!(rewritten <= 3 * blocks, "{rewritten} blocks rewritten, of {blocks}");
}

#[test]
fn blocks_a_snapshot_shares_stay_where_they_lie() {
    let sim = Sim::new(7);
    let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
    let (store, data) = scattered(&sim, &legs, &no_data_cached());
    let s = Arc::clone(&store);
    sim.run(async move { s.create_snapshots(&[("v".into(), "s".into())], 1).await.unwrap() })
        .unwrap();
    let before = all_block_pointers(&sim, &store);
    let got = read_volume(&sim, &store);
    assert!(got == data);
    let (scattered_reads, rewritten, shared, _) = rewrites(&store);
    assert!(scattered_reads > 0);
    assert_eq!(rewritten, 0, "blocks the snapshot shares were rewritten");
    assert!(shared >= VOLUME_BYTES / BLOCK / 2, "{shared} blocks counted as shared");
    sync(&sim, &store);
    assert!(all_block_pointers(&sim, &store) == before, "a block the snapshot shares moved");
}

#[test]
fn a_write_while_the_read_is_in_flight_is_not_undone_by_its_rewrite() {
    // Two cases: the write stays in the open txg, or it is synced before the rewrite.
    for synced in [false, true] {
        let sim = Sim::new(8);
        let legs = common::legs(&sim, 1, ssd(), LEG_BYTES);
        let (store, mut data) = scattered(&sim, &legs, &no_data_cached());
        // The first reads start a stream; the one after them finds its blocks scattered and
        // stops before handing them over.
        for read in read_in_order(&sim, &store, 0..2 * READ) {
            read.unwrap();
        }
        let (reached, release) = store.arm_pause("dmu_rewrite.found");
        let at = 2 * READ + BLOCK;
        let new = vec![0xc3; BLOCK as usize];
        data[at as usize..][..BLOCK as usize].copy_from_slice(&new);
        let s = Arc::clone(&store);
        sim.run(async move {
            let read = {
                let s = Arc::clone(&s);
                async move { s.read("v", 2 * READ, READ).await.unwrap() }
            };
            let write = async {
                reached.await.unwrap();
                s.write("v", at, &new).await.unwrap();
                if synced {
                    s.sync().await.unwrap();
                }
                drop(release);
            };
            futures::join!(read, write);
            s.sync().await.unwrap();
        })
        .unwrap();
        let got = sim
            .run({
                let s = Arc::clone(&store);
                async move { s.read("v", 2 * READ, READ).await.unwrap() }
            })
            .unwrap()
            .0;
        assert!(
            got[..] == data[2 * READ as usize..][..READ as usize],
            "the rewrite undid a write (synced before it: {synced})"
        );
        let (_, rewritten, _, deferred) = rewrites(&store);
        if synced {
            // The tree changed under the read: it hands nothing over.
            assert!(deferred >= READ / BLOCK - 1, "{deferred} deferred");
        } else {
            // The block written is left out; the others go in.
            assert!(deferred >= 1 && rewritten >= 1, "{rewritten} rewritten, {deferred} deferred");
        }
        // The read above may have rewritten what it found.
        sync_and_audit(&sim, store);
    }
}

#[test]
fn an_encrypted_volumes_scattered_blocks_are_rewritten_sealed_and_read_the_same() {
    let sim = Sim::new(9);
    let legs = common::legs(&sim, 2, ssd(), LEG_BYTES);
    let env = sim.env();
    let mut data = common::random_bytes(9, VOLUME_BYTES);
    let first = data.clone();
    // Every third block written again in a later txg: neighbours lie apart.
    let mut writes = Vec::new();
    for index in (0..VOLUME_BYTES / BLOCK).step_by(3) {
        let bytes = common::random_bytes(1000 + index, BLOCK);
        data[(index * BLOCK) as usize..][..BLOCK as usize].copy_from_slice(&bytes);
        writes.push((index * BLOCK, bytes));
    }
    let store = sim
        .run(async move {
            let store = Arc::new(encrypted_volume(&env, &legs, 4, &first).await);
            for (at, bytes) in &writes {
                store.write("v", *at, bytes).await.unwrap();
            }
            store.sync().await.unwrap();
            store
        })
        .unwrap()
        .0;
    let got = read_volume(&sim, &store);
    assert!(got == data);
    assert!(rewrites(&store).1 > 0, "nothing of the encrypted volume was rewritten");
    sync(&sim, &store);
    // Read back from the disk, each block opened with the key (its MAC checked against its
    // pointer): the same bytes; and the space audit clean.
    let got = read_volume(&sim, &store);
    assert!(got == data, "the rewritten encrypted volume read back wrong bytes");
    sync_and_audit(&sim, store);
}
