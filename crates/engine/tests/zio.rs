//! The block pipeline (crate::zio): one fault at one stage, armed once for each block writer
//! in turn, is reported by that writer; and a txg's blocks run their CPU stages on more than
//! one worker, a commit's blocks only where their work is worth moving, and the sync's spans
//! are sealed in order by the core's taskq, which yields between quanta.
//!
//! The fault is armed at the issue stage, the one stage every writer's blocks pass (the intent
//! log's chain blocks carry their own checksum and skip the others). A writer of the txg sync
//! fails the sync, which suspends the store and says which writer's block failed; the intent
//! log's writers fall back to a txg sync, and the acknowledged write is durable all the same.
//! One more fault is armed at the checksum stage of blocks logged by pointer, which their
//! writes pass before it.

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sluice_engine::device::SimProfile;
use sluice_engine::pool::Pool;
use sluice_engine::rt::{BoxFuture, Spawn};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{NewKey, ReceiveMode, Store, VolumeProperty};
use sluice_engine::volume::Volume;
use sluice_engine::zio::{Stage, Writer};
use sluice_engine::UserKey;
use sluice_format::{Compression, DedupMode, KeyFormat, KeyLocation, StreamReader, StreamWriter};
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;
const BLOCK: u32 = 16384;

/// A store on a fresh mirror with volume "v" (8 MiB, 16 KiB blocks, uncompressed), synced.
async fn store_with_v(
    env: &sluice_engine::rt::Env,
    sim_legs: &[sluice_engine::device::SimDevice],
) -> Arc<Store> {
    let t = Tunables::default();
    let store = Arc::new(common::mirror_store(env, common::leaf_specs(sim_legs), &t).await);
    store.create_volume("v", 8 << 20, BLOCK).unwrap();
    store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
    store.sync().await.unwrap();
    store
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(13)).collect()
}

/// A writer of the txg sync: arming a fault for it makes the next sync fail, suspend the
/// store, and name the writer and the stage.
fn sync_writer_reports(writer: Writer, seed: u64) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store = store_with_v(&env, &legs).await;
        match writer {
            Writer::DedupTable | Writer::DedupData => {
                store.set_property("v", VolumeProperty::Dedup(DedupMode::On)).unwrap();
            }
            Writer::Deadlist => {
                // Blocks a snapshot holds, then replaced: the sync appends them to its dead
                // list.
                store.write("v", 0, &pattern(1, 1 << 20)).await.unwrap();
                store.sync().await.unwrap();
                store.create_snapshots(&[("v".into(), "s".into())], 1).await.unwrap();
            }
            _ => {}
        }
        store.write("v", 0, &pattern(2, 1 << 20)).await.unwrap();
        store.pool().zio().arm_fault(Stage::Issue, writer);
        let error = store.sync().await.unwrap_err().to_string();
        let named = format!("issue stage of a {writer} block");
        assert!(error.contains(&named), "{writer}: the sync said {error:?}");
        assert!(store.is_suspended(), "{writer}: a failed sync left the store serving");
        assert_eq!(store.pool().zio().errors(writer), 1, "{writer}: counted once");
    })
    .unwrap();
}

#[test]
fn a_fault_in_a_sync_writer_suspends_the_store_and_names_the_writer() {
    let writers = [
        Writer::VolumeData,
        Writer::Indirect,
        Writer::SpaceMap,
        Writer::Directory,
        Writer::Deadlist,
        Writer::DedupTable,
        Writer::DedupData,
    ];
    for (seed, writer) in writers.into_iter().enumerate() {
        sync_writer_reports(writer, seed as u64);
    }
}

/// A writer of the intent log: the commit falls back to a txg sync, the write is durable
/// (it reads back after the pool is exported and imported), and the failure is counted.
fn log_writer_reports(writer: Writer, seed: u64) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store = store_with_v(&env, &legs).await;
        let volume = Volume::open(&store, "v").unwrap();
        // A MiB is logged by pointer (its whole blocks written in place); 4 KiB is copied
        // into a log block.
        let data = match writer {
            Writer::LogIndirect => pattern(3, 1 << 20),
            _ => pattern(4, 4096),
        };
        let via_txg = store.log_stats().commits_via_txg.get();
        store.pool().zio().arm_fault(Stage::Issue, writer);
        volume.write(0, &data, true).await.unwrap();
        assert_eq!(store.pool().zio().errors(writer), 1, "{writer}: the failure was counted");
        assert!(store.log_stats().commits_via_txg.get() > via_txg, "{writer}: no fallback");
        assert!(!store.is_suspended(), "{writer}: a failed log write suspended the store");
        drop(volume);
        let t = Tunables::default();
        Arc::try_unwrap(store).ok().unwrap().export().await.unwrap();
        let pool = Pool::import(&env, common::leaf_specs(&legs), "tank", &t).await.unwrap();
        let store = Store::open(pool, &t).await.unwrap();
        assert_eq!(store.read("v", 0, data.len() as u64).await.unwrap(), data, "{writer}");
    })
    .unwrap();
}

#[test]
fn a_fault_in_a_log_writer_falls_back_to_a_sync_and_loses_nothing() {
    log_writer_reports(Writer::LogIndirect, 20);
    log_writer_reports(Writer::LogChain, 21);
}

/// A log commit's blocks stored as they are start their writes before their checksums
/// (`zio::stage_as_is`): a checksum that fails after the writes started falls back to a txg
/// sync like any failed log write, and the places those writes took are freed once they end
/// (the audit finds no log space besides the chain's).
#[test]
fn a_checksum_fault_after_a_commits_writes_started_frees_their_places() {
    let sim = Sim::new(22);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store = store_with_v(&env, &legs).await;
        let volume = Volume::open(&store, "v").unwrap();
        let data = pattern(6, 1 << 20);
        let via_txg = store.log_stats().commits_via_txg.get();
        store.pool().zio().arm_fault(Stage::Checksum, Writer::LogIndirect);
        volume.write(0, &data, true).await.unwrap();
        assert_eq!(store.pool().zio().errors(Writer::LogIndirect), 1, "counted once");
        assert!(store.log_stats().commits_via_txg.get() > via_txg, "no fallback to a sync");
        assert_eq!(
            store.log_stats().indirect_blocks_written.get(),
            64,
            "the blocks' writes did not start before their checksums"
        );
        assert!(!store.is_suspended());
        for _ in 0..3 {
            store.sync().await.unwrap();
        }
        assert_eq!(volume.read(0, data.len() as u64).await.unwrap(), data);
        let audit = store.audit().await.unwrap();
        assert!(audit.is_clean(), "{:?}", audit.problems);
        assert_eq!(audit.log_bytes, audit.chain_bytes, "the started writes' places leaked");
    })
    .unwrap();
}

/// A receive's blocks fail at the issue stage: the receive says so, and the store suspends.
#[test]
fn a_fault_in_a_receive_is_reported_by_the_receive() {
    let sim = Sim::new(30);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    sim.run(async move {
        let store = store_with_v(&env, &legs).await;
        store.write("v", 0, &pattern(5, 1 << 20)).await.unwrap();
        store.create_snapshots(&[("v".into(), "s".into())], 1).await.unwrap();
        let mut stream = Vec::new();
        let mut out = StreamWriter::new(&mut stream);
        {
            let mut emit = |record| out.write(&record);
            store.send_snapshot("v", "s", None, &mut emit).await.unwrap();
        }
        out.finish().unwrap();
        store.pool().zio().arm_fault(Stage::Issue, Writer::Receive);
        let mut reader = StreamReader::new(&stream[..]);
        let mut next = || reader.next_record();
        let error = store.receive("w", ReceiveMode::Whole, &mut next).await.unwrap_err();
        let error = error.to_string();
        assert!(error.contains("issue stage of a received block"), "the receive said {error:?}");
        assert_eq!(store.pool().zio().errors(Writer::Receive), 1);
    })
    .unwrap();
}

/// Spawns as the simulator does, but runs tasks spawned elsewhere on threads of their own:
/// three workers, as a host with three cores. The simulator knows nothing of those threads,
/// so a task of its own waits for each (in steps of virtual time) and keeps it from taking
/// a world whose tasks all wait on them for a deadlock.
struct Recording {
    inner: Arc<dyn Spawn>,
    sim: sluice_engine::rt::Env,
}

impl Spawn for Recording {
    fn spawn(&self, name: &'static str, task: BoxFuture<()>) {
        self.inner.spawn(name, task);
    }

    fn spawn_elsewhere(&self, _: &'static str, task: BoxFuture<()>) {
        let done = Arc::new(AtomicBool::new(false));
        let finished = Arc::clone(&done);
        std::thread::spawn(move || {
            futures::executor::block_on(task);
            finished.store(true, Ordering::Release);
        });
        let env = self.sim.clone();
        self.inner.spawn(
            "elsewhere",
            Box::pin(async move {
                while !done.load(Ordering::Acquire) {
                    env.sleep(Duration::from_micros(10)).await;
                }
            }),
        );
    }

    fn parallelism(&self) -> usize {
        3
    }
}

/// The stages seen, each with the thread that ran it, and a signal for each new one.
type Seen = (Mutex<BTreeSet<(Stage, String)>>, Condvar);

/// The CPU stages (compress, encrypt, checksum) of one txg's data blocks ran on more than one
/// worker. The first worker to reach the checksum stage waits there (up to 10 s) for another
/// to arrive: a pipeline that ran a batch's blocks on one worker leaves it alone, and the
/// assertion fails (after the wait); one that spreads them gets there whatever the threads'
/// timing.
#[test]
fn the_stages_of_one_txgs_blocks_run_on_more_than_one_worker() {
    let sim = Sim::new(40);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env().with_spawner(|inner| Arc::new(Recording { inner, sim: sim.env() }));
    let seen: Arc<Seen> = Arc::default();
    let watch = Arc::clone(&seen);
    // Only the first to arrive waits.
    let waited = AtomicBool::new(false);
    let (stages, threads) = sim
        .run(async move {
            let store = store_with_v(&env, &legs).await;
            // zstd: the sync spreads what costs more than moving it (zio's worth_spreading).
            store.set_property("v", VolumeProperty::Compression(Compression::Zstd(3))).unwrap();
            store.write("v", 0, &pattern(6, 4 << 20)).await.unwrap();
            let observe = move |stage: Stage, writer: Writer| {
                if writer != Writer::VolumeData || stage > Stage::Checksum {
                    return;
                }
                let thread = format!("{:?}", std::thread::current().id());
                let (lock, arrived) = &*watch;
                let mut seen = lock.lock().unwrap();
                seen.insert((stage, thread));
                arrived.notify_all();
                let threads = |s: &BTreeSet<(Stage, String)>| {
                    s.iter().map(|(_, t)| t.clone()).collect::<BTreeSet<_>>().len()
                };
                if stage == Stage::Checksum && threads(&seen) < 2 && !waited.swap(true, Relaxed) {
                    let wait = Duration::from_secs(10);
                    drop(arrived.wait_timeout_while(seen, wait, |s| threads(s) < 2).unwrap());
                }
            };
            store.pool().zio().observe(Some(Arc::new(observe)));
            store.sync().await.unwrap();
            store.pool().zio().observe(None);
            let seen = seen.0.lock().unwrap();
            let stages: BTreeSet<Stage> = seen.iter().map(|(s, _)| *s).collect();
            let threads: BTreeSet<String> = seen.iter().map(|(_, t)| t.clone()).collect();
            (stages, threads.len())
        })
        .unwrap()
        .0;
    assert_eq!(stages, BTreeSet::from([Stage::Compress, Stage::Encrypt, Stage::Checksum]));
    assert!(threads >= 2, "the txg's blocks were sealed on {threads} worker(s)");
}

/// The sync's spans of data blocks (1 MiB), lz4-compressed or not, are sealed by one task of
/// the core's taskq, not a task each: a 4 MiB sync starts one. A batch under the size that
/// goes there (a 64 KiB write's four blocks) is sealed in the sync's own task. Either way
/// every block reads back.
#[test]
fn the_syncs_spans_are_sealed_by_one_taskq_task() {
    let sim = Sim::new(41);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let spawned: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let count = Arc::clone(&spawned);
    let env = sim.env().with_spawner(move |inner| {
        Arc::new(common::Counting { inner, name: "zio_taskq", spawned: count, drops: false })
    });
    let tasks = sim
        .run(async move {
            let store = store_with_v(&env, &legs).await;
            let mut tasks = Vec::new();
            for compression in [Compression::Lz4, Compression::Off] {
                store.set_property("v", VolumeProperty::Compression(compression)).unwrap();
                for (seed, len) in [(7u8, 64usize << 10), (8, 4 << 20)] {
                    let data = pattern(seed, len);
                    store.write("v", 0, &data).await.unwrap();
                    let before = spawned.load(Relaxed);
                    store.sync().await.unwrap();
                    tasks.push(spawned.load(Relaxed) - before);
                    assert_eq!(store.read("v", 0, len as u64).await.unwrap(), data);
                }
            }
            tasks
        })
        .unwrap()
        .0;
    assert_eq!(tasks, [0, 1, 0, 1], "taskq tasks started: 64 KiB, then 4 MiB, lz4 then off");
}

/// A large write's blocks logged by pointer are sealed on more than one core when they
/// compress, and in the committer's own task when none does and they are few: random bytes
/// leave only the checksums, which cost less there than another core's wake-up. A flush's
/// commit of several MiB is spread whatever its bytes, and so is an encrypted volume's MiB
/// (lz4 on: only compressed batches are spread at all). Every write reads back.
#[test]
fn a_commits_blocks_are_spread_only_for_work_worth_moving() {
    let sim = Sim::new(43);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let spawned: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let count = Arc::clone(&spawned);
    let env = sim.env().with_spawner(move |inner| {
        Arc::new(common::Counting { inner, name: "zio_write_issue", spawned: count, drops: false })
    });
    let mut rng = sluice_engine::rt::Rng::new(43);
    let random: Vec<u8> = (0..4 << 20).map(|_| rng.u64() as u8).collect();
    let spread = sim
        .run(async move {
            let store = store_with_v(&env, &legs).await;
            store.set_property("v", VolumeProperty::Compression(Compression::Lz4)).unwrap();
            let volume = Volume::open(&store, "v").unwrap();
            let key = NewKey {
                format: KeyFormat::Raw,
                location: KeyLocation::Prompt,
                key: UserKey::new(vec![5; 32]),
            };
            store.create_encrypted_volume("e", 8 << 20, BLOCK, false, key).await.unwrap();
            store.set_property("e", VolumeProperty::Compression(Compression::Lz4)).unwrap();
            store.sync().await.unwrap();
            let encrypted = Volume::open(&store, "e").unwrap();
            let mut spread = Vec::new();
            let writes = [
                (&volume, &random[..1 << 20]),
                (&volume, &pattern(9, 1 << 20)[..]),
                (&volume, &random[..]),
                (&encrypted, &random[..1 << 20]),
            ];
            for (volume, data) in writes {
                let before = spawned.load(Relaxed);
                volume.write(0, data, false).await.unwrap();
                volume.flush().await.unwrap();
                spread.push(spawned.load(Relaxed) - before);
                assert_eq!(volume.read(0, data.len() as u64).await.unwrap(), data);
            }
            assert_eq!(store.log_stats().indirect_blocks_written.get(), 64 + 64 + 256 + 64);
            spread
        })
        .unwrap()
        .0;
    assert_eq!(spread[0], 0, "a MiB of random bytes was spread");
    assert!(spread[1] > 0, "a compressible MiB was sealed on one core");
    assert!(spread[2] > 0, "4 MiB of random bytes were sealed on one core");
    assert!(spread[3] > 0, "an encrypted MiB was sealed on one core");
}

/// The taskq seals batches in the order they came, each as the caller would have sealed it
/// itself, and lets the core's other tasks run while it works: a task spawned after the
/// first batch was queued runs before that batch is answered. (Spawned one per batch, as
/// before the taskq, the first batch's task ran to its end before anything queued after it.)
#[test]
fn the_taskq_answers_in_order_and_yields_between_quanta() {
    use sluice_engine::device::AlignedBuf;
    use sluice_engine::zio::BlockProps;
    let sim = Sim::new(42);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let spawned: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let env = sim.env().with_spawner(move |inner| {
        Arc::new(common::Counting { inner, name: "zio_taskq", spawned, drops: false })
    });
    let events = sim
        .run(async move {
            let store = store_with_v(&env, &legs).await;
            let pool = store.pool();
            let batch = |seed: u8| -> Vec<(BlockProps, Arc<AlignedBuf>)> {
                let props = BlockProps::data(Writer::VolumeData, 1, Compression::Lz4);
                (0..64u8)
                    .map(|i| {
                        let bytes = pattern(seed.wrapping_add(i), BLOCK as usize);
                        (props, Arc::new(AlignedBuf::copy_from(&bytes)))
                    })
                    .collect()
            };
            let events: Arc<Mutex<Vec<&'static str>>> = Arc::default();
            let seal = |name: &'static str, seed: u8| {
                let events = Arc::clone(&events);
                async move {
                    let sealed = pool.seal_blocks(batch(seed), None).await.unwrap();
                    events.lock().unwrap().push(name);
                    sealed
                }
            };
            // Once both batches are queued (and the taskq's task started), another task.
            let other = async {
                sluice_engine::rt::yield_now().await;
                let (ran, done) = futures::channel::oneshot::channel();
                let events = Arc::clone(&events);
                env.spawn("other", async move {
                    events.lock().unwrap().push("other task");
                    let _ = ran.send(());
                });
                done.await.unwrap();
            };
            let (first, second, ()) = futures::join!(seal("first", 1), seal("second", 2), other);
            for (seed, sealed) in [(1, first), (2, second)] {
                for (alone, queued) in batch(seed).into_iter().zip(sealed) {
                    let alone = pool.seal_block(alone.0, alone.1, None).unwrap();
                    assert_eq!(
                        (alone.checksum, alone.compression),
                        (queued.checksum, queued.compression)
                    );
                    assert_eq!(alone.stored[..], queued.stored[..]);
                }
            }
            let events = events.lock().unwrap().clone();
            events
        })
        .unwrap()
        .0;
    assert_eq!(events, ["other task", "first", "second"]);
}

/// A taskq task dropped unrun answers nothing: its batches are sealed by their callers, the
/// syncs go on and read back, and each later batch starts a task again (one per span of a
/// 4 MiB sync, each dropped too), rather than waiting on one that never runs.
#[test]
fn a_dropped_taskq_leaves_its_batches_to_their_callers() {
    let sim = Sim::new(43);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let dropped: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let count = Arc::clone(&dropped);
    let env = sim.env().with_spawner(|inner| {
        Arc::new(common::Counting { inner, name: "zio_taskq", spawned: count, drops: true })
    });
    let started = sim
        .run(async move {
            let store = store_with_v(&env, &legs).await;
            store.set_property("v", VolumeProperty::Compression(Compression::Lz4)).unwrap();
            let mut started = Vec::new();
            for seed in [9u8, 10] {
                let data = pattern(seed, 4 << 20);
                store.write("v", 0, &data).await.unwrap();
                let before = dropped.load(Relaxed);
                store.sync().await.unwrap();
                started.push(dropped.load(Relaxed) - before);
                assert_eq!(store.read("v", 0, data.len() as u64).await.unwrap(), data);
            }
            started
        })
        .unwrap()
        .0;
    assert_eq!(started, [4, 4], "taskq tasks started (and dropped) by each 4 MiB sync");
}
