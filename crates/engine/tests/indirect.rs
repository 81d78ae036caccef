//! Large sync writes written once (ZFS's WR_INDIRECT) and the volume properties that steer
//! the intent log: `sync=standard|always|disabled` and `logbias=latency|throughput`.
//!
//! Counted on simulated devices, which report the bytes each leaf wrote: a 1 MiB write and
//! its flush write the data once (in place, logged by pointer), and the sync that follows
//! links those blocks instead of writing them again. Blocks written in place and then
//! replaced before the sync are freed: the space audit balances. Crashes around indirect
//! records are in `log_crash.rs`.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::sim::{CrashPolicy, SimImage, SimOptions};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, VolumeProperty};
use sluice_engine::volume::Volume;
use sluice_format::{BlockCompression, Compression, LogBias, SyncMode};
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;
const MIB: usize = 1 << 20;

fn written(legs: &[SimDevice]) -> u64 {
    legs.iter().map(|l| l.stats().write_bytes).sum()
}

fn read(legs: &[SimDevice]) -> u64 {
    legs.iter().map(|l| l.stats().read_bytes).sum()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(7)).collect()
}

/// The legs as a power cut now leaves them: every write that completed, none left unflushed.
fn crash_images(legs: &[SimDevice], seed: u64) -> Vec<SimImage> {
    let mut rng = Rng::new(seed);
    legs.iter()
        .map(|l| l.crash_image(l.write_log().len(), CrashPolicy::DropAll, &mut rng))
        .map(Option::unwrap)
        .collect()
}

/// What the log's import counted (`LogStats`).
struct Imported {
    chain_ends: u64,
    claims_shared: u64,
    records_replayed: u64,
}

/// Imports `images` (claim and replay), checks that the space audit balances, and returns
/// volume "v"'s first `len` bytes and what the import counted.
fn import_after_crash(seed: u64, images: Vec<SimImage>, len: u64) -> (Vec<u8>, Imported) {
    let sim = Sim::new(seed);
    let legs = common::revive(&sim, images, SimProfile::ssd(), LEAF_BYTES);
    let (env, specs) = (sim.env(), common::leaf_specs(&legs));
    sim.run(async move {
        let t = Tunables::default();
        let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
        let store = Store::open(pool, &t).await.unwrap();
        let stats = store.log_stats();
        let imported = Imported {
            chain_ends: stats.indirect_chain_ends.get(),
            claims_shared: stats.indirect_claims_shared.get(),
            records_replayed: stats.indirect_records_replayed.get(),
        };
        let read = store.read("v", 0, len).await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        (read, imported)
    })
    .unwrap()
    .0
}

#[test]
fn a_large_sync_write_is_written_once() {
    large_sync_write_written_once(16 << 10);
}

/// A volume of the largest blocks, whose block a pool's default log block (128 KiB) cannot
/// hold copied, gets a chain of larger log blocks, so its large writes are logged by pointer
/// too rather than copied into the log (written twice).
#[test]
fn a_large_sync_write_to_the_largest_blocks_is_written_once() {
    large_sync_write_written_once(128 << 10);
}

fn large_sync_write_written_once(block_bytes: u32) {
    let blocks = MIB as u64 / u64::from(block_bytes);
    let sim = Sim::new(7);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let counted = legs.clone();
    sim.run(async move {
        let t = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
        store.create_volume("v", 8 << 20, block_bytes).unwrap();
        // Bytes are counted: stored as they are (compressed ones are in the next test).
        store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
        store.sync().await.unwrap();
        let volume = Volume::open(&store, "v").unwrap();
        let data = pattern(1, MIB);
        let before = written(&counted);
        volume.write(0, &data, false).await.unwrap();
        volume.flush().await.unwrap();
        let commit = written(&counted) - before;
        let stats = store.log_stats();
        assert_eq!(stats.indirect_blocks_written.get(), blocks, "{blocks} blocks in place");
        assert_eq!(stats.indirect_records_copied.get(), 0);
        // Each leg: the MiB once, and a log block of pointers (well under 64 KiB).
        assert!(commit >= 2 * MIB as u64, "{commit} bytes for a MiB on a 2-way mirror");
        assert!(commit < 2 * (MIB as u64 + (64 << 10)), "{commit} bytes: data logged twice?");
        // Written in place, the blocks stay dirty until a sync links them: they hold space
        // like any write, so the throttle and the start of the next sync must count them.
        assert_eq!(store.dirty_bytes(), MIB as u64, "blocks written in place left the dirty data");
        let before = written(&counted);
        store.sync().await.unwrap();
        let sync = written(&counted) - before;
        assert!(sync < 2 * (256 << 10), "the sync wrote {sync} bytes: it rewrote the data");
        // The linked blocks are cached as blocks the sync wrote itself would be: reading them,
        // or completing a partial write of one at the next sync, reads nothing back.
        let reads_before = read(&counted);
        assert_eq!(volume.read(0, MIB as u64).await.unwrap(), data);
        let mut data = data;
        data[20_480..24_576].copy_from_slice(&pattern(9, 4096));
        volume.write(20_480, &data[20_480..24_576], false).await.unwrap();
        store.sync().await.unwrap();
        assert_eq!(read(&counted), reads_before, "blocks written in place were read back");
        assert_eq!(volume.read(0, MIB as u64).await.unwrap(), data);
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        drop(volume);
        Arc::try_unwrap(store).unwrap().export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
        let store = Store::open(pool, &t).await.unwrap();
        assert_eq!(store.read("v", 0, MIB as u64).await.unwrap(), data);
        assert!(store.audit().await.unwrap().is_clean());
    })
    .unwrap();
}

/// Blocks written in place for indirect records are compressed as the sync would compress
/// them: a compressible MiB takes a fraction of its size on the disk, the sync links the
/// compressed blocks, and the data reads back, before and after a crash that replays the log.
#[test]
fn blocks_written_in_place_are_compressed() {
    let sim = Sim::new(10);
    let options = SimOptions { record_log: true, ..SimOptions::default() };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEAF_BYTES, options);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let counted = legs.clone();
    let data = pattern(5, MIB);
    let d = data.clone();
    let images = sim
        .run(async move {
            let t = Tunables::default();
            let store = Arc::new(common::mirror_store(&env, specs, &t).await);
            store.create_volume("v", 8 << 20, 16384).unwrap();
            store.set_property("v", VolumeProperty::Compression(Compression::Lz4)).unwrap();
            store.sync().await.unwrap();
            let volume = Volume::open(&store, "v").unwrap();
            let before = written(&counted);
            volume.write(0, &d, false).await.unwrap();
            volume.flush().await.unwrap();
            let commit = written(&counted) - before;
            assert_eq!(store.log_stats().indirect_blocks_written.get(), 64);
            assert!(commit < MIB as u64, "{commit} bytes on two legs for a compressible MiB");
            // The crash image: the flush made the MiB durable through the log alone.
            let images = crash_images(&counted, 1);
            store.sync().await.unwrap();
            let entry = store.volume_info("v").unwrap();
            let tree =
                sluice_engine::objset::walk(store.pool(), entry.root, entry.levels).await.unwrap();
            let data_blocks: Vec<_> = tree.iter().filter(|(level, _, _)| *level == 0).collect();
            assert_eq!(data_blocks.len(), 64);
            assert!(data_blocks.iter().all(|(_, _, bp)| bp.compression == BlockCompression::Lz4));
            // Linked compressed blocks are cached as their logical bytes: read back from there.
            let reads_before = read(&counted);
            assert_eq!(volume.read(0, MIB as u64).await.unwrap(), d);
            assert_eq!(read(&counted), reads_before, "linked compressed blocks were read back");
            let audit = store.audit().await.unwrap();
            assert!(audit.is_clean(), "{:?}", audit.problems);
            images
        })
        .unwrap()
        .0;
    // After the crash, replay reads each compressed block through its pointer.
    let (read, _) = import_after_crash(11, images, MIB as u64);
    assert_eq!(read, data);
}

/// A MiB written twice in one txg and then flushed has two records per block, and the commit
/// places each block once, its current version, for both records (ZFS: `TX_WRITE2`): the
/// flush writes the MiB once, not twice. After a crash that keeps only what the flush made
/// durable, import claims each shared block once, replays every record (the shared ones and a
/// MiB written after them) and reads the second version.
#[test]
fn a_block_written_again_before_its_flush_is_placed_once() {
    let sim = Sim::new(12);
    let options = SimOptions { record_log: true, ..SimOptions::default() };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEAF_BYTES, options);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let counted = legs.clone();
    let second = pattern(7, MIB);
    let expected = [second.clone(), pattern(8, MIB)].concat();
    let expected_here = expected.clone();
    let images = sim
        .run(async move {
            let t = Tunables::default();
            let store = Arc::new(common::mirror_store(&env, specs, &t).await);
            store.create_volume("v", 8 << 20, 16384).unwrap();
            store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
            store.sync().await.unwrap();
            let volume = Volume::open(&store, "v").unwrap();
            volume.write(0, &pattern(6, MIB), false).await.unwrap();
            volume.write(0, &second, false).await.unwrap();
            // Records behind the shared ones: a chain cut at a shared block would lose them.
            volume.write(MIB as u64, &pattern(8, MIB), false).await.unwrap();
            let before = written(&counted);
            volume.flush().await.unwrap();
            let commit = written(&counted) - before;
            let stats = store.log_stats();
            assert_eq!(stats.indirect_blocks_written.get(), 128, "each block placed once");
            assert_eq!(stats.indirect_records_shared.get(), 64, "the first write's records");
            assert_eq!(stats.indirect_records_copied.get(), 0);
            let limit = 2 * (2 * MIB as u64 + (128 << 10));
            assert!(commit < limit, "{commit} bytes on two legs for 2 MiB: a MiB twice?");
            let images = crash_images(&counted, 3);
            store.sync().await.unwrap();
            assert_eq!(volume.read(0, 2 * MIB as u64).await.unwrap(), expected_here);
            let audit = store.audit().await.unwrap();
            assert!(audit.is_clean(), "{:?}", audit.problems);
            images
        })
        .unwrap()
        .0;
    let (read, imported) = import_after_crash(13, images, 2 * MIB as u64);
    assert_eq!(imported.chain_ends, 0, "the chain ended at a shared block");
    assert_eq!(imported.claims_shared, 64);
    assert_eq!(imported.records_replayed, 192);
    assert_eq!(read, expected);
}

/// A record logged by pointer whose txg is syncing when its commit comes is filled with a
/// copy of its block, as one record (as `records_of_a_syncing_txg_are_copied_or_left_to_the_sync`
/// shows for 16 KiB blocks). On a volume of 128 KiB blocks that record is larger than the
/// pool's largest log block (128 KiB by default), so the volume's chain is given larger ones.
/// After a crash that keeps what the flush made durable, the volume reads back.
#[test]
fn a_copied_block_of_the_largest_size_fits_its_chain_and_reads_back_after_a_crash() {
    const BLOCK: u32 = 128 << 10;
    let sim = Sim::new(21);
    let options = SimOptions { record_log: true, ..SimOptions::default() };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEAF_BYTES, options);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let counted = legs.clone();
    let data = pattern(4, MIB);
    let expected = data.clone();
    let images = sim
        .run(async move {
            // No early commits: the records stay unfilled until the flush.
            let t = Tunables::with([("intent_log.early_commit", "off")]).unwrap();
            let store = Arc::new(common::mirror_store(&env, specs, &t).await);
            store.create_volume("v", 8 << 20, BLOCK).unwrap();
            store.create_volume("w", 8 << 20, 16384).unwrap();
            store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
            store.sync().await.unwrap();
            let v = Volume::open(&store, "v").unwrap();
            let w = Volume::open(&store, "w").unwrap();
            // v's MiB behind 4 MiB that w dirtied and never flushed: a small share of the
            // sync that starts before v's flush, so its records are copied.
            w.write(0, &pattern(5, 4 * MIB), false).await.unwrap();
            v.write(0, &data, false).await.unwrap();
            let (done, synced) = futures::channel::oneshot::channel();
            let syncing = Arc::clone(&store);
            env.spawn("sync", async move {
                let _ = done.send(syncing.sync().await.map(drop));
            });
            env.sleep(std::time::Duration::from_micros(1)).await;
            v.flush().await.unwrap();
            let stats = store.log_stats();
            assert_eq!(stats.indirect_records_copied.get(), 8, "the MiB's 8 blocks, copied");
            let images = crash_images(&counted, 5);
            synced.await.unwrap().unwrap();
            assert_eq!(v.read(0, MIB as u64).await.unwrap(), data);
            images
        })
        .unwrap()
        .0;
    let (read, _) = import_after_crash(22, images, MIB as u64);
    assert_eq!(read, expected);
}

/// Blocks written in place and replaced in the same txg (overwritten, zeroed, or written
/// again by another flush) are freed by the sync; partial blocks at a write's ends are copied
/// into the log; a record whose txg is syncing when its commit comes is filled with a copy.
#[test]
fn replaced_blocks_are_freed_and_the_audit_balances() {
    let sim = Sim::new(8);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
        store.create_volume("v", 8 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let volume = Volume::open(&store, "v").unwrap();
        // 128 KiB at an offset that is not block aligned: 7 whole blocks and two partial.
        let first = pattern(2, 128 << 10);
        volume.write(4096, &first, false).await.unwrap();
        volume.flush().await.unwrap();
        assert_eq!(store.log_stats().indirect_blocks_written.get(), 7);
        // The same range again, then a zero over part of it, each flushed: the first
        // version's blocks, and the second's under the zero, are never linked.
        let second = pattern(3, 128 << 10);
        volume.write(4096, &second, false).await.unwrap();
        volume.flush().await.unwrap();
        volume.zero(16384, 32768, false).await.unwrap();
        volume.flush().await.unwrap();
        // A write whose commit comes only after its txg started syncing.
        let third = pattern(4, 64 << 10);
        volume.write(1 << 20, &third, false).await.unwrap();
        let syncing = Arc::clone(&store);
        let (done, synced) = futures::channel::oneshot::channel();
        env.spawn("sync", async move {
            let _ = done.send(syncing.sync().await.map(drop));
        });
        env.sleep(std::time::Duration::from_micros(1)).await;
        volume.flush().await.unwrap();
        synced.await.unwrap().unwrap();
        store.sync().await.unwrap();
        store.sync().await.unwrap();
        store.sync().await.unwrap();
        let mut expected = second.clone();
        expected[(16384 - 4096)..(16384 - 4096 + 32768)].fill(0);
        assert_eq!(volume.read(4096, 128 << 10).await.unwrap(), expected);
        assert_eq!(volume.read(1 << 20, 64 << 10).await.unwrap(), third);
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        // Every block written in place was linked or freed: the log holds its chain alone.
        assert_eq!(audit.log_bytes, audit.chain_bytes, "blocks written in place leaked");
    })
    .unwrap();
}

/// With logbias=throughput a write that covers blocks in part is logged by pointer too (ZFS's
/// `dmu_sync` of a partial `WR_INDIRECT` write): each block's whole new version, the write's
/// bytes over the version on disk (read for it: the pool was imported, nothing is cached),
/// is written in place and its record points at it, so the log holds no copy of the bytes. A
/// block written again and flushed is placed again. After a power cut that keeps what the
/// flushes made durable, replay puts back every block, the bytes around each write included.
#[test]
fn partial_blocks_are_logged_by_pointer_with_logbias_throughput() {
    let sim = Sim::new(14);
    let options = SimOptions { record_log: true, ..SimOptions::default() };
    let legs = common::legs_with(&sim, 2, SimProfile::ssd(), LEAF_BYTES, options);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let counted = legs.clone();
    // 4 KiB inside block 1; 8 KiB across blocks 3 and 4; 4 KiB more inside block 1.
    let writes =
        [(20_480, pattern(2, 4096)), (61_440, pattern(3, 8192)), (24_576, pattern(4, 4096))];
    let mut expected = pattern(1, MIB);
    for (at, data) in &writes {
        expected[*at..*at + data.len()].copy_from_slice(data);
    }
    let expected_here = expected.clone();
    let images = sim
        .run(async move {
            let t = Tunables::default();
            let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
            store.create_volume("v", 8 << 20, 16384).unwrap();
            store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
            store.set_property("v", VolumeProperty::LogBias(LogBias::Throughput)).unwrap();
            let volume = Volume::open(&store, "v").unwrap();
            volume.write(0, &pattern(1, MIB), false).await.unwrap();
            store.sync().await.unwrap();
            drop(volume);
            Arc::try_unwrap(store).unwrap_or_else(|_| panic!("one store")).export().await.unwrap();
            let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
            let store = Arc::new(Store::open(pool, &t).await.unwrap());
            let volume = Volume::open(&store, "v").unwrap();
            let stats = store.log_stats();
            let (reads_before, writes_before) = (read(&counted), written(&counted));
            for (at, data) in &writes {
                volume.write(*at as u64, data, false).await.unwrap();
                volume.flush().await.unwrap();
            }
            assert_eq!(stats.indirect_blocks_written.get(), 4, "blocks 1, 3, 4 and 1 again");
            assert_eq!(stats.indirect_records_copied.get(), 0);
            assert!(read(&counted) - reads_before >= 3 * 16384, "the blocks' old bytes unread");
            // Each leg: four 16 KiB blocks and three log blocks of pointers.
            let commits = written(&counted) - writes_before;
            assert!(commits <= 2 * (4 * 16384 + 3 * 16384), "{commits} bytes for 4 blocks");
            assert_eq!(volume.read(0, MIB as u64).await.unwrap(), expected_here);
            let images = crash_images(&counted, 5);
            // The first version of block 1 was never linked: the sync frees it.
            store.sync().await.unwrap();
            store.sync().await.unwrap();
            store.sync().await.unwrap();
            assert_eq!(volume.read(0, MIB as u64).await.unwrap(), expected_here);
            let audit = store.audit().await.unwrap();
            assert!(audit.is_clean(), "{:?}", audit.problems);
            assert_eq!(audit.log_bytes, audit.chain_bytes, "blocks written in place leaked");
            images
        })
        .unwrap()
        .0;
    let (read, imported) = import_after_crash(15, images, MIB as u64);
    assert_eq!(imported.chain_ends, 0);
    assert_eq!(imported.records_replayed, 4);
    assert_eq!(read, expected);
}

/// sync=disabled answers flushes without writing the log; sync=always makes every write
/// durable when answered; logbias=throughput writes even small whole blocks in place. The
/// properties survive an export and import.
#[test]
fn sync_and_logbias_properties() {
    let sim = Sim::new(9);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::default();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
        for name in ["off", "always", "bias"] {
            store.create_volume(name, 4 << 20, 16384).unwrap();
        }
        store.set_property("off", VolumeProperty::Sync(SyncMode::Disabled)).unwrap();
        store.set_property("always", VolumeProperty::Sync(SyncMode::Always)).unwrap();
        store.set_property("bias", VolumeProperty::LogBias(LogBias::Throughput)).unwrap();
        store.sync().await.unwrap();
        let stats = store.log_stats();

        let off = Volume::open(&store, "off").unwrap();
        for i in 0..8u64 {
            off.write(i * 4096, &[i as u8; 4096], false).await.unwrap();
            off.flush().await.unwrap();
        }
        assert_eq!(store.log_blocks_written(), 0, "sync=disabled wrote the log");
        assert_eq!(stats.commits_ignored.get(), 8);
        assert_eq!(stats.commits.get(), 0);

        let always = Volume::open(&store, "always").unwrap();
        always.write(0, &[7; 4096], false).await.unwrap();
        assert_eq!(stats.commits.get(), 1, "sync=always commits a write without FUA");
        assert!(store.log_blocks_written() >= 1);

        let bias = Volume::open(&store, "bias").unwrap();
        bias.write(16384, &[9; 16384], false).await.unwrap();
        bias.flush().await.unwrap();
        assert_eq!(stats.indirect_blocks_written.get(), 1, "logbias=throughput: 16 KiB in place");

        drop((off, always, bias));
        Arc::try_unwrap(store).unwrap().export().await.unwrap();
        let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
        let store = Store::open(pool, &t).await.unwrap();
        let volumes = store.volumes();
        let find = |name: &str| volumes.iter().find(|v| v.name == name).unwrap().clone();
        assert_eq!(find("off").sync, SyncMode::Disabled);
        assert_eq!(find("always").sync, SyncMode::Always);
        assert_eq!(find("bias").logbias, LogBias::Throughput);
        assert_eq!(find("bias").sync, SyncMode::Standard);
        assert_eq!(store.read("bias", 16384, 16384).await.unwrap(), vec![9; 16384]);
        assert_eq!(store.read("off", 7 * 4096, 4096).await.unwrap(), vec![7; 4096]);
    })
    .unwrap();
}

/// 1 MiB write + flush clients overwriting the same blocks again and again, on a thick volume
/// that takes most of a small pool: every overwrite places new blocks while the versions they
/// replace are freed only by a sync. The writes must keep succeeding (syncs started by the
/// dirty data they make free the replaced versions) and the space must balance.
#[test]
fn overwrites_logged_by_pointer_never_fill_the_pool() {
    let sim = Sim::new(9);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let t = Tunables::with([("txg.dirty_max", "16M")]).unwrap();
        let store = Arc::new(common::mirror_store(&env, specs, &t).await);
        store.create_volume_with("v", 32 << 20, 16384, true).unwrap();
        store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
        store.sync().await.unwrap();
        let volume = Arc::new(Volume::open(&store, "v").unwrap());
        // Four clients, each over the same 4 MiB, 256 MiB in all: four times the pool.
        let clients = (0..4u8).map(|c| {
            let volume = Arc::clone(&volume);
            async move {
                for i in 0..64u64 {
                    let data = pattern(c.wrapping_add(i as u8), MIB);
                    volume.write((i % 4) * MIB as u64, &data, false).await.unwrap();
                    volume.flush().await.unwrap();
                }
            }
        });
        futures::future::join_all(clients).await;
        store.sync().await.unwrap();
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
    })
    .unwrap();
}

/// A flush whose records belong to the txg being synced: copied into the log where they are a
/// small part of what that sync writes (one large write caught as its txg closed), left to the
/// sync where they are most of it (a flush after writes that never flushed): the flush then
/// returns once the sync is durable, and the log writes no copy of what the sync writes.
#[test]
fn records_of_a_syncing_txg_are_copied_or_left_to_the_sync() {
    let sim = Sim::new(10);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        // No early commits: the records stay unfilled until the flush.
        let t = Tunables::with([("intent_log.early_commit", "off")]).unwrap();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
        store.create_volume("v", 16 << 20, 16384).unwrap();
        store.create_volume("w", 16 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let v = Volume::open(&store, "v").unwrap();
        let w = Volume::open(&store, "w").unwrap();
        let stats = store.log_stats();
        let start_sync = || {
            let (done, synced) = futures::channel::oneshot::channel();
            let syncing = Arc::clone(&store);
            env.spawn("sync", async move {
                let _ = done.send(syncing.sync().await.map(drop));
            });
            synced
        };
        // 1 MiB of v's behind 4 MiB that w dirtied and never flushed: small, and a quarter of
        // the sync or less, so copied.
        let bulk = pattern(5, 4 * MIB);
        w.write(0, &bulk, false).await.unwrap();
        let small = pattern(6, MIB);
        v.write(0, &small, false).await.unwrap();
        let synced = start_sync();
        env.sleep(std::time::Duration::from_micros(1)).await;
        v.flush().await.unwrap();
        assert_eq!(stats.indirect_records_copied.get(), 64, "the MiB's 64 blocks copied");
        assert_eq!(stats.indirect_records_left_to_sync.get(), 0);
        synced.await.unwrap().unwrap();
        // 4 MiB of v's, nearly all of the next sync: the flush waits for it.
        let large = pattern(7, 4 * MIB);
        v.write(4 * MIB as u64, &large, false).await.unwrap();
        let txg = store.open_txg();
        let synced = start_sync();
        env.sleep(std::time::Duration::from_micros(1)).await;
        let logged = store.log_blocks_written();
        v.flush().await.unwrap();
        assert!(store.pool().uberblock().txg >= txg, "the flush returned before its txg synced");
        assert_eq!(stats.indirect_records_left_to_sync.get(), 256, "4 MiB of 16 KiB blocks");
        assert_eq!(stats.indirect_records_copied.get(), 64, "nothing more copied");
        assert_eq!(store.log_blocks_written(), logged, "the log wrote what the sync wrote");
        synced.await.unwrap().unwrap();
        assert_eq!(v.read(0, MIB as u64).await.unwrap(), small);
        assert_eq!(v.read(4 * MIB as u64, 4 * MIB as u64).await.unwrap(), large);
        assert_eq!(w.read(0, 4 * MIB as u64).await.unwrap(), bulk);
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
    })
    .unwrap();
}

/// A flush left to a sync that then fails gets the failure (the store is suspended) instead
/// of waiting for records that no sync will make durable; so does a second flush that found
/// those records claimed by the first and waits behind them.
#[test]
fn a_flush_left_to_a_failing_sync_reports_it() {
    let sim = Sim::new(11);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let faulty = legs.clone();
    sim.run(async move {
        let t = Tunables::with([("intent_log.early_commit", "off")]).unwrap();
        let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
        store.create_volume("v", 16 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let v = Arc::new(Volume::open(&store, "v").unwrap());
        v.write(0, &pattern(8, 4 * MIB), false).await.unwrap();
        let syncing = Arc::clone(&store);
        env.spawn("sync", async move {
            let _ = syncing.sync().await;
        });
        // The sync has closed the txg and is writing it; its flushes will fail.
        env.sleep(std::time::Duration::from_micros(1)).await;
        for leg in &faulty {
            leg.inject(sluice_engine::device::sim::Fault::FlushError);
        }
        let flush = |v: &Arc<Volume>| {
            let (v, (done, answer)) = (Arc::clone(v), futures::channel::oneshot::channel());
            env.spawn("flush", async move {
                let _ = done.send(v.flush().await.is_err());
            });
            answer
        };
        // The first claims the records and waits for the sync; the second waits behind them.
        let first = flush(&v);
        env.sleep(std::time::Duration::from_nanos(1)).await;
        let second = flush(&v);
        assert!(first.await.unwrap(), "a flush answered though its sync failed");
        assert!(second.await.unwrap(), "a flush behind it answered though the sync failed");
        assert!(store.is_suspended());
        assert_eq!(store.log_stats().indirect_records_copied.get(), 0, "it was left to the sync");
    })
    .unwrap();
}

/// Where the largest blocks logged by pointer go: an encrypted volume on a mirror, or a plain
/// one on a raidz1 of four.
#[derive(Clone, Copy, Debug)]
enum LargestBlocks {
    Encrypted,
    Raidz,
}

/// A volume of 128 KiB blocks, encrypted or on RAID-Z: a MiB written and flushed is logged by
/// pointer (its eight blocks written in place, sealed or striped over the columns as the sync
/// would write them, half of them compressed), and after a power cut that keeps only what the
/// flush made durable, import claims and replays the eight records (once the key is loaded)
/// and the MiB reads back, the space audit balanced.
#[test]
fn the_largest_blocks_logged_by_pointer_replay_encrypted_and_on_raidz() {
    use sluice_engine::pool::{PoolSpec, TopSpec};
    use sluice_engine::txg::NewKey;
    use sluice_engine::UserKey;
    use sluice_format::{KeyFormat, KeyLocation};

    const BLOCK: u32 = 128 << 10;
    let key = || UserKey::new(vec![3; 32]);
    for (case, seed) in [(LargestBlocks::Encrypted, 31), (LargestBlocks::Raidz, 33)] {
        let sim = Sim::new(seed);
        let options = SimOptions { record_log: true, ..SimOptions::default() };
        let width = match case {
            LargestBlocks::Encrypted => 2,
            LargestBlocks::Raidz => 4,
        };
        let legs = common::legs_with(&sim, width, SimProfile::ssd(), LEAF_BYTES, options);
        let env = sim.env();
        let specs = common::leaf_specs(&legs);
        let counted = legs.clone();
        // Half text that lz4 compresses, half random bytes that it does not.
        let mut data = pattern(6, MIB / 2);
        data.extend(common::random_bytes(seed, MIB as u64 / 2));
        let d = data.clone();
        let images = sim
            .run(async move {
                let t = Tunables::default();
                let top = match case {
                    LargestBlocks::Encrypted => TopSpec::Mirror(specs),
                    LargestBlocks::Raidz => TopSpec::Raidz { parity: 1, leaves: specs },
                };
                let spec = PoolSpec { name: "tank".into(), ashift: 12, top: vec![top] };
                let store =
                    Arc::new(Store::create(Pool::create(&env, spec, &t).await.unwrap(), &t));
                match case {
                    LargestBlocks::Encrypted => {
                        let new = NewKey {
                            format: KeyFormat::Raw,
                            location: KeyLocation::Prompt,
                            key: key(),
                        };
                        store
                            .create_encrypted_volume("v", 8 << 20, BLOCK, false, new)
                            .await
                            .unwrap();
                    }
                    LargestBlocks::Raidz => store.create_volume("v", 8 << 20, BLOCK).unwrap(),
                }
                store.sync().await.unwrap();
                let volume = Volume::open(&store, "v").unwrap();
                volume.write(0, &d, false).await.unwrap();
                volume.flush().await.unwrap();
                let stats = store.log_stats();
                assert_eq!(stats.indirect_blocks_written.get(), 8, "{case:?}: in place");
                assert_eq!(stats.indirect_records_copied.get(), 0, "{case:?}: none copied");
                let images = crash_images(&counted, seed);
                // The blocks written in place are linked by the sync, and read back.
                store.sync().await.unwrap();
                assert!(volume.read(0, MIB as u64).await.unwrap() == d, "{case:?}: after the sync");
                images
            })
            .unwrap()
            .0;
        let sim = Sim::new(seed + 1);
        let legs = common::revive(&sim, images, SimProfile::ssd(), LEAF_BYTES);
        let (env, specs) = (sim.env(), common::leaf_specs(&legs));
        let (read, replayed) = sim
            .run(async move {
                let t = Tunables::default();
                let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
                let store = Store::open(pool, &t).await.unwrap();
                if matches!(case, LargestBlocks::Encrypted) {
                    assert!(store.log_awaits_key("v"), "replayed without the key");
                    store.load_key("v", &key()).await.unwrap();
                }
                let replayed = store.log_stats().indirect_records_replayed.get();
                let read = store.read("v", 0, MIB as u64).await.unwrap();
                let audit = store.audit().await.unwrap();
                assert!(audit.is_clean(), "{case:?}: {:?}", audit.problems);
                (read, replayed)
            })
            .unwrap()
            .0;
        assert_eq!(replayed, 8, "{case:?}: the eight records by pointer replayed");
        assert!(read == data, "{case:?}: the MiB the flush made durable reads back");
    }
}
