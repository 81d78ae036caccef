//! The intent log's commit path under crashes, for every policy (seed 004): every record
//! whose commit returned is found when the chain is walked after a power cut, with its data
//! intact and in order; a chain ends cleanly at the first block that was not written. Also
//! how `auto` groups records on a disk without parallelism.

use crate::common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_engine::alloc::Allocator;
use sluice_engine::device::sim::SsdParams;
use sluice_engine::device::sim::{CrashPolicy, Fault};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::intent_log::BlockWritten;
use sluice_engine::intent_log::{read_chain, ChainOwner, CommitPolicy, LogSettings, LogWriter};
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_format::LogRecord;
use sluice_sim::Sim;

/// Log settings with the default linger and largest block `max_block_bytes`.
fn settings(policy: CommitPolicy, max_block_bytes: u32) -> LogSettings {
    LogSettings { policy, commit_timeout_pct: 10, max_block_bytes }
}

/// The chain `chain_id` of volume 1.
fn owner(chain_id: u64) -> ChainOwner {
    ChainOwner { chain_id, volume_id: 1, key_family: 0 }
}

/// A pool whose top-level vdevs are the given leaves, each on its own.
fn leaves_spec(specs: Vec<sluice_engine::pool::LeafSpec>) -> sluice_engine::pool::PoolSpec {
    sluice_engine::pool::PoolSpec {
        name: "tank".into(),
        ashift: 12,
        top: specs.into_iter().map(sluice_engine::pool::TopSpec::Leaf).collect(),
    }
}

/// An `auto` log writer on `pool` (blocks of up to 128 KiB), with its allocator, both shared
/// with tasks a test spawns.
fn auto_log(pool: &Pool) -> (Arc<Mutex<Allocator>>, Arc<LogWriter>) {
    let allocator = Arc::new(Mutex::new(Allocator::new(pool.ashift(), &pool.data_areas())));
    let log = Arc::new(
        LogWriter::new("tank", &allocator, settings(CommitPolicy::Auto, 128 << 10), owner(5))
            .unwrap(),
    );
    (allocator, log)
}

const LEAF_BYTES: u64 = 64 << 20;
const WRITERS: u64 = 8;

fn payload(sequence: u64) -> Vec<u8> {
    (0..(64 + sequence % 700)).map(|i| (sequence as u8).wrapping_add(i as u8)).collect()
}

/// The pools the crash test runs on: a mirror of two SSDs, or two HDDs striped (so that one
/// commit's groups and blocks land on several top-level vdevs, in sizes that are not powers
/// of two under `auto`).
#[derive(Clone, Copy, Debug)]
enum Layout {
    SsdMirror,
    HddStripe,
    /// A mirror of one-channel SSDs, whose flushes do not overlap, as a file leaf's do: `auto`
    /// runs two groups there, the second only once it carries an even share.
    SerialSsdMirror,
}

impl Layout {
    fn profile(self) -> SimProfile {
        match self {
            Layout::SsdMirror => SimProfile::ssd(),
            Layout::HddStripe => SimProfile::hdd(),
            Layout::SerialSsdMirror => serial_ssd(),
        }
    }

    fn spec(self, leaves: Vec<sluice_engine::pool::LeafSpec>) -> sluice_engine::pool::PoolSpec {
        match self {
            Layout::SsdMirror | Layout::SerialSsdMirror => common::mirror_pool(leaves),
            Layout::HddStripe => sluice_engine::pool::PoolSpec {
                name: "tank".into(),
                ashift: 12,
                top: leaves.into_iter().map(sluice_engine::pool::TopSpec::Leaf).collect(),
            },
        }
    }
}

/// An SSD with one channel: one flush at a time.
fn serial_ssd() -> SimProfile {
    SimProfile::Ssd(SsdParams { channels: 1, ..SsdParams::default() })
}

fn run(seed: u64, policy: CommitPolicy, crash: bool) {
    run_on(seed, policy, crash, Layout::SsdMirror);
}

fn run_on(seed: u64, policy: CommitPolicy, crash: bool, layout: Layout) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, layout.profile(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let acked = Rc::new(RefCell::new(BTreeSet::new()));
    let mut rng = Rng::new(seed);
    let crash_after = Duration::from_micros(rng.below(3_000));
    let (a, crash_legs) = (Rc::clone(&acked), legs.clone());
    let (head, verifier) = sim
        .run(async move {
            let tunables = Tunables::default();
            let spec = layout.spec(specs);
            let pool = Arc::new(Pool::create(&env, spec, &tunables).await.unwrap());
            let allocator = Arc::new(Mutex::new(Allocator::new(pool.ashift(), &pool.data_areas())));
            let log = Arc::new(
                LogWriter::new("tank", &allocator, settings(policy, 16 << 10), owner(0xabc ^ seed))
                    .unwrap(),
            );
            if crash {
                let (clock, legs) = (env.clone(), crash_legs.clone());
                env.spawn("crasher", async move {
                    clock.sleep(crash_after).await;
                    for leg in &legs {
                        leg.crash(CrashPolicy::Any);
                        leg.inject(Fault::Lost);
                    }
                });
            }
            let writers = (0..WRITERS).map(|w| {
                let (pool, allocator, log, a) =
                    (Arc::clone(&pool), Arc::clone(&allocator), Arc::clone(&log), Rc::clone(&a));
                let env = env.clone();
                async move {
                    for i in 0..20u64 {
                        let offset = (w * 100 + i) * 4096;
                        let sequence = log.append(env.now(), |sequence| LogRecord::Write {
                            txg: 1,
                            sequence,
                            offset,
                            data: payload(sequence),
                        });
                        if log.commit(&pool, &allocator, sequence).await.is_err() {
                            return;
                        }
                        a.borrow_mut().insert(sequence);
                    }
                }
            });
            futures::future::join_all(writers).await;
            if !crash {
                assert_eq!(a.borrow().len() as u64, WRITERS * 20);
            }
            log.head()
        })
        .unwrap()
        .0;
    if crash {
        // Power is already off; nothing more reaches the legs.
    } else {
        for leg in &legs {
            leg.crash(CrashPolicy::DropAll);
        }
    }
    let images: Vec<_> = legs.iter().map(SimDevice::durable_image).collect();
    let fresh = Sim::new(seed + 1);
    let revived = common::leaf_specs(&common::revive(&fresh, images, layout.profile(), LEAF_BYTES));
    let env = fresh.env();
    let blocks = fresh
        .run(async move {
            let pool = Pool::import(&env, revived, "tank", &Tunables::default()).await.unwrap();
            read_chain(&pool, head, verifier).await.unwrap()
        })
        .unwrap()
        .0;
    let mut found = Vec::new();
    for block in &blocks.blocks {
        for record in &block.records {
            let LogRecord::Write { sequence, data, .. } = record else {
                panic!("unexpected record")
            };
            assert_eq!(*data, payload(*sequence), "seed {seed}: record {sequence} damaged");
            found.push(*sequence);
        }
    }
    assert!(found.windows(2).all(|w| w[0] < w[1]), "seed {seed} {policy:?}: records out of order");
    let found: BTreeSet<u64> = found.into_iter().collect();
    let lost: Vec<u64> = acked.borrow().difference(&found).copied().collect();
    assert!(lost.is_empty(), "seed {seed} {policy:?}: acknowledged records lost: {lost:?}");
}

#[test]
fn committed_records_survive_crashes() {
    for policy in [CommitPolicy::Auto, CommitPolicy::Pipelined, CommitPolicy::Batch] {
        run(1000, policy, false);
        for seed in 0..150 {
            run(seed, policy, true);
        }
    }
    for policy in [CommitPolicy::Auto, CommitPolicy::Pipelined] {
        run_on(2000, policy, false, Layout::HddStripe);
        for seed in 0..60 {
            run_on(seed, policy, true, Layout::HddStripe);
        }
    }
    run_on(3000, CommitPolicy::Auto, false, Layout::SerialSsdMirror);
    for seed in 0..60 {
        run_on(seed, CommitPolicy::Auto, true, Layout::SerialSsdMirror);
    }
}

/// Closed-loop writers on one HDD for 200 ms of virtual time: (commits, lwb figures).
fn hdd_closed_loop(
    policy: CommitPolicy,
    writers: u64,
) -> (u64, sluice_engine::intent_log::LogFigures) {
    closed_loop(SimProfile::hdd(), policy, writers, &Tunables::default(), 200)
}

/// Closed-loop writers on one leaf of `profile` for `millis` ms of virtual time: (commits, lwb
/// figures). The log is never trimmed: the leaf must hold everything written meanwhile.
fn closed_loop(
    profile: SimProfile,
    policy: CommitPolicy,
    writers: u64,
    tunables: &Tunables,
    millis: u64,
) -> (u64, sluice_engine::intent_log::LogFigures) {
    let tunables = tunables.clone();
    let sim = Sim::new(7);
    let legs = common::legs(&sim, 1, profile, LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let end = sluice_engine::rt::Time::ZERO.plus(Duration::from_millis(millis));
    sim.run(async move {
        let pool =
            Arc::new(Pool::create(&env, Layout::HddStripe.spec(specs), &tunables).await.unwrap());
        let allocator = Arc::new(Mutex::new(Allocator::new(pool.ashift(), &pool.data_areas())));
        let log = Arc::new(
            LogWriter::new("tank", &allocator, settings(policy, 128 << 10), owner(9)).unwrap(),
        );
        let commits = Rc::new(RefCell::new(0u64));
        let tasks = (0..writers).map(|w| {
            let (pool, allocator, log, env, commits) = (
                Arc::clone(&pool),
                Arc::clone(&allocator),
                Arc::clone(&log),
                env.clone(),
                Rc::clone(&commits),
            );
            async move {
                let mut i = 0;
                while env.now() < end {
                    let sequence = log.append(env.now(), |sequence| LogRecord::Write {
                        txg: 1,
                        sequence,
                        offset: (w * 1000 + i) * 4096,
                        data: vec![7; 4096],
                    });
                    i += 1;
                    log.commit(&pool, &allocator, sequence).await.unwrap();
                    *commits.borrow_mut() += 1;
                }
            }
        });
        futures::future::join_all(tasks).await;
        let commits = *commits.borrow();
        (commits, log.figures())
    })
    .unwrap()
    .0
}

/// On one disk with a single actuator, `auto` keeps one group in flight carrying every
/// waiting record: 16 writers' records share a flush, where pipelined pays one per block and
/// batch alternates between a lone record and the rest.
#[test]
fn auto_groups_everything_waiting_on_one_disk() {
    let (auto, figures) = hdd_closed_loop(CommitPolicy::Auto, 16);
    let (pipelined, _) = hdd_closed_loop(CommitPolicy::Pipelined, 16);
    let (batch, _) = hdd_closed_loop(CommitPolicy::Batch, 16);
    eprintln!("commits in 200 ms: auto {auto}, pipelined {pipelined}, batch {batch}; {figures:?}");
    assert_eq!(figures.group_cap_per_vdev, Some(1), "{figures:?}");
    let per_group = figures.records_written as f64 / figures.groups_written as f64;
    assert!(per_group >= 12.0, "{per_group} records per group: {figures:?}");
    // Blocks are allocated at the size their group needs: little space is left unwritten.
    let unwritten = figures.block_bytes_allocated - figures.block_bytes_written;
    assert!(
        unwritten * 10 < figures.block_bytes_allocated,
        "{unwritten} of {} bytes allocated unwritten",
        figures.block_bytes_allocated
    );
    assert!(auto > pipelined && auto > batch, "auto {auto}, pipelined {pipelined}, batch {batch}");
}

/// On a leaf whose flushes do not overlap but cost no rotation (a file; here a one-channel
/// SSD), `auto` runs two groups, the second only once it carries an even share of what is
/// outstanding: its groups carry more records than two plain groups (the same cap set by
/// hand: the second starts at once and what is ready is split over both), and at 8 and 32
/// writers auto
/// commits at least 95% as often as the better fixed policy.
#[test]
fn auto_starts_a_second_group_with_its_share_where_flushes_do_not_overlap() {
    let default = Tunables::default();
    let two = Tunables::with([("intent_log.groups_per_vdev", "2")]).unwrap();
    let per_group = |f: &sluice_engine::intent_log::LogFigures| {
        f.records_written as f64 / f.groups_written as f64
    };
    for writers in [8, 32] {
        let run = |policy, tunables| closed_loop(serial_ssd(), policy, writers, tunables, 20);
        let (auto, figures) = run(CommitPolicy::Auto, &default);
        let (by_hand, by_hand_figures) = run(CommitPolicy::Auto, &two);
        let (pipelined, _) = run(CommitPolicy::Pipelined, &default);
        let (batch, _) = run(CommitPolicy::Batch, &default);
        eprintln!(
            "{writers} writers, commits in 20 ms: auto {auto} ({:.1} records per group), \
             2 by hand {by_hand} ({:.1}), pipelined {pipelined}, batch {batch}",
            per_group(&figures),
            per_group(&by_hand_figures)
        );
        assert_eq!(figures.group_cap_per_vdev, Some(2), "{figures:?}");
        assert!(
            per_group(&figures) > per_group(&by_hand_figures) * 1.2,
            "{writers} writers: {figures:?} against {by_hand_figures:?}"
        );
        let better = pipelined.max(batch);
        assert!(
            auto * 100 >= better * 95,
            "{writers} writers: auto {auto}, pipelined {pipelined}, batch {batch}"
        );
    }
}

/// A block pointer for an indirect record; the log only carries it.
fn placed_block(at: u64) -> sluice_format::BlockPointer {
    use sluice_format::{BlockCompression, BlockKind, ChecksumAlg, Dva};
    sluice_format::BlockPointer {
        dvas: [
            Dva { vdev: 0, asize_sectors: 32, offset_sectors: at },
            Dva::default(),
            Dva::default(),
        ],
        lsize_sectors: 32,
        psize_sectors: 32,
        birth_txg: 1,
        checksum_alg: ChecksumAlg::Xxh3_128,
        compression: BlockCompression::None,
        kind: BlockKind::Data,
        level: 0,
        fill: 1,
        checksum: ChecksumAlg::Xxh3_128.compute(&[7u8; 16384]),
        dedup: None,
        crypt: sluice_format::BlockCrypt::None,
    }
}

/// On one disk `auto` keeps one group in flight, except for groups whose records are all
/// logged by pointer: their blocks are already on their way to the disk, so a second one
/// starts at once, with its blocks, instead of waiting for the slot. A record with its data copied
/// still waits for the slot.
#[test]
fn auto_starts_groups_of_records_logged_by_pointer_past_the_cap() {
    let sim = Sim::new(11);
    let legs = common::legs(&sim, 1, SimProfile::hdd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let in_flight = sim
        .run(async move {
            let pool = Arc::new(
                Pool::create(&env, Layout::HddStripe.spec(specs), &Tunables::default())
                    .await
                    .unwrap(),
            );
            let (allocator, log) = auto_log(&pool);
            // The blocks' writes end only when released, so their groups stay in flight.
            let (release, released) = futures::channel::oneshot::channel::<()>();
            let released = futures::FutureExt::shared(released);
            // A commit of `sequence` on its own task; the receiver says whether it succeeded.
            let spawn_commit = |sequence: u64| {
                let (pool, allocator, log) =
                    (Arc::clone(&pool), Arc::clone(&allocator), Arc::clone(&log));
                let (done, finished) = futures::channel::oneshot::channel();
                env.spawn("commit", async move {
                    let _ = done.send(log.commit(&pool, &allocator, sequence).await.is_ok());
                });
                finished
            };
            let mut figures = Vec::new();
            let mut commits = Vec::new();
            for (i, at) in [(0u64, 8192u64), (1, 16384)] {
                let sequence =
                    log.append_unfilled(env.now(), |sequence| LogRecord::WriteIndirect {
                        txg: 1,
                        sequence,
                        offset: i << 20,
                        len: 16384,
                        block: placed_block(at),
                    });
                let claimed = log.claim_unfilled(sequence);
                assert_eq!(claimed.len(), 1);
                let record = claimed.into_iter().next().unwrap();
                let released = released.clone();
                let write: sluice_engine::intent_log::DataWrite =
                    futures::FutureExt::shared(Box::pin(async move {
                        match released.await {
                            Ok(_) => BlockWritten::Flushed,
                            Err(_) => BlockWritten::Failed,
                        }
                    })
                        as futures::future::BoxFuture<'static, BlockWritten>);
                assert!(log.fill(record, Some(write)));
                commits.push(spawn_commit(sequence));
                env.sleep(Duration::from_millis(30)).await;
                figures.push(log.figures().groups_in_flight);
            }
            // A copied record waits for a slot.
            let sequence = log.append(env.now(), |sequence| LogRecord::Write {
                txg: 1,
                sequence,
                offset: 9 << 20,
                data: vec![3; 4096],
            });
            commits.push(spawn_commit(sequence));
            env.sleep(Duration::from_millis(30)).await;
            figures.push(log.figures().groups_in_flight);
            release.send(()).unwrap();
            for finished in commits {
                assert!(
                    finished.await.unwrap(),
                    "every commit returns once the blocks are written"
                );
            }
            figures.push(log.figures().groups_in_flight);
            figures
        })
        .unwrap()
        .0;
    assert_eq!(in_flight, vec![1, 2, 2, 0], "groups in flight after each commit, then at the end");
}

/// Records logged by pointer that overflow the block allocated for the next group go out as
/// one group of several blocks, and a single-leaf vdev is flushed once for all of them and the
/// blocks they point at: their blocks' writes are not flushed on their own, so a group per block
/// would cost a flush per block.
#[test]
fn auto_writes_records_logged_by_pointer_as_one_group_with_one_flush() {
    let sim = Sim::new(12);
    // One leaf whose flushes do not overlap, as a file's (on a mirror each block is written
    // durably on every child instead: import_faults.rs).
    let legs = common::legs(&sim, 1, serial_ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let flushes = |legs: &[SimDevice]| legs.iter().map(|l| l.stats().flushes).collect::<Vec<_>>();
    let (figures, before, after) = sim
        .run({
            let legs = legs.clone();
            async move {
                let pool =
                    Pool::create(&env, leaves_spec(specs), &Tunables::default()).await.unwrap();
                let allocator = Mutex::new(Allocator::new(pool.ashift(), &pool.data_areas()));
                let log = LogWriter::new(
                    "tank",
                    &allocator,
                    settings(CommitPolicy::Auto, 128 << 10),
                    owner(5),
                )
                .unwrap();
                // More pointers than the largest block holds (each record takes over 64 bytes).
                let records = (128 << 10) / 64 + 1;
                let mut last = 0;
                for i in 0..records as u64 {
                    last = log.append_unfilled(env.now(), |sequence| LogRecord::WriteIndirect {
                        txg: 1,
                        sequence,
                        offset: i * 16384,
                        len: 16384,
                        block: placed_block(8192 + i * 16384),
                    });
                    let record = log.claim_unfilled(last).into_iter().next().unwrap();
                    // Written unflushed on the pool's one leaf, as a fill writes them there.
                    let leaf = pool.root().plain_leaf(0).unwrap();
                    let written: sluice_engine::intent_log::DataWrite = futures::FutureExt::shared(
                        Box::pin(async move { BlockWritten::Unflushed(leaf) })
                            as futures::future::BoxFuture<'static, BlockWritten>,
                    );
                    assert!(log.fill(record, Some(written)));
                }
                let before = flushes(&legs);
                log.commit(&pool, &allocator, last).await.unwrap();
                (log.figures(), before, flushes(&legs))
            }
        })
        .unwrap()
        .0;
    assert!(figures.lwbs_written >= 3, "the records overflow two blocks: {figures:?}");
    assert_eq!(figures.groups_written, 1, "one group for them all: {figures:?}");
    assert_eq!(figures.groups_in_flight, 0);
    let each: Vec<u64> = before.iter().zip(&after).map(|(b, a)| a - b).collect();
    assert_eq!(each, vec![1], "one flush of the leaf for the group (before {before:?})");
}

/// A commit whose records logged by pointer are partly being filled by another committer
/// (a large write's parts filled early on the other core) waits for that fill and writes them
/// all as one group: a group of the records filled so far would cost a flush of its own while
/// the commit still waits for the rest. A commit of only the records before it is not held.
#[test]
fn a_commit_waits_for_records_another_committer_fills_and_writes_one_group() {
    let sim = Sim::new(13);
    let legs = common::legs(&sim, 1, serial_ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let flushes = |legs: &[SimDevice]| legs.iter().map(|l| l.stats().flushes).sum::<u64>();
    let (while_filling, figures, flushed) = sim
        .run({
            let legs = legs.clone();
            async move {
                let pool =
                    Pool::create(&env, leaves_spec(specs), &Tunables::default()).await.unwrap();
                let pool = Arc::new(pool);
                let (allocator, log) = auto_log(&pool);
                let leaf = pool.root().plain_leaf(0).unwrap();
                let written = move || -> sluice_engine::intent_log::DataWrite {
                    let leaf = leaf.clone();
                    futures::FutureExt::shared(Box::pin(
                        async move { BlockWritten::Unflushed(leaf) },
                    )
                        as futures::future::BoxFuture<'static, BlockWritten>)
                };
                let sequences: Vec<u64> = (0..3u64)
                    .map(|i| {
                        log.append_unfilled(env.now(), |sequence| LogRecord::WriteIndirect {
                            txg: 1,
                            sequence,
                            offset: i * 16384,
                            len: 16384,
                            block: placed_block(8192 + i * 16384),
                        })
                    })
                    .collect();
                // The first part is filled; the second is claimed by its filler and not yet
                // filled; the committer claims and fills the last.
                let first = log.claim_unfilled(sequences[0]);
                assert!(log.fill(first.into_iter().next().unwrap(), Some(written())));
                let second = log.claim_unfilled(sequences[1]);
                assert_eq!(second.len(), 1);
                let last = log.claim_unfilled(sequences[2]);
                assert_eq!(last.len(), 1, "the record being filled is not claimed again");
                assert!(log.fill(last.into_iter().next().unwrap(), Some(written())));
                // A commit that needs only the ready record is not held by the fill.
                log.commit(&pool, &allocator, sequences[0]).await.unwrap();
                assert_eq!(log.figures().groups_written, 1);
                let before = flushes(&legs);
                let (done, finished) = futures::channel::oneshot::channel();
                env.spawn("commit", {
                    let (pool, allocator, log) =
                        (Arc::clone(&pool), Arc::clone(&allocator), Arc::clone(&log));
                    let sequence = sequences[2];
                    async move {
                        let _ = done.send(log.commit(&pool, &allocator, sequence).await.is_ok());
                    }
                });
                env.sleep(Duration::from_millis(5)).await;
                let while_filling = log.figures().groups_written;
                assert!(log.fill(second.into_iter().next().unwrap(), Some(written())));
                assert!(finished.await.unwrap(), "the commit returns once the group is durable");
                (while_filling, log.figures(), flushes(&legs) - before)
            }
        })
        .unwrap()
        .0;
    assert_eq!(while_filling, 1, "nothing more is written while a record it needs is filled");
    assert_eq!(figures.groups_written, 2, "one group for the other two: {figures:?}");
    assert_eq!(figures.records_written, 3);
    assert_eq!(flushed, 1, "one flush of the leaf for the group");
}

/// A chain replaced at a sync (`Zil::restart_chains`, or a failed write) hands its records
/// on and is retired: a committer waiting on it for a record handed on is woken and told the
/// chain failed (it then falls back to a txg sync), rather than waiting for ever.
#[test]
fn a_commit_waiting_on_a_retired_chain_is_told_it_failed() {
    let sim = Sim::new(14);
    let legs = common::legs(&sim, 1, serial_ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let outcome = sim
        .run(async move {
            let pool = Pool::create(&env, leaves_spec(specs), &Tunables::default()).await.unwrap();
            let pool = Arc::new(pool);
            let (allocator, log) = auto_log(&pool);
            // A record of txg 2, claimed by a filler that has not finished: its commit waits.
            let sequence = log.append_unfilled(env.now(), |sequence| LogRecord::WriteIndirect {
                txg: 2,
                sequence,
                offset: 0,
                len: 16384,
                block: placed_block(8192),
            });
            assert_eq!(log.claim_unfilled(sequence).len(), 1);
            let (done, finished) = futures::channel::oneshot::channel();
            env.spawn("commit", {
                let (pool, allocator, log) =
                    (Arc::clone(&pool), Arc::clone(&allocator), Arc::clone(&log));
                async move {
                    let _ = done.send(log.commit(&pool, &allocator, sequence).await);
                }
            });
            env.sleep(Duration::from_millis(5)).await;
            // Txg 1 synced; the chain is replaced and its txg-2 record carried over.
            let handover = log.hand_over(1);
            drop(handover);
            log.retire();
            finished.await.unwrap()
        })
        .unwrap()
        .0;
    assert!(
        matches!(outcome, Err(sluice_engine::intent_log::LogError::Failed { .. })),
        "{outcome:?}"
    );
}

/// A lone writer that flushes after every write gets its log writes started early
/// (`intent_log.early_commit=auto`): its flushes find the records already on their way. Writes
/// that stream without flushes stop it within two records, `off` never does it, and what was
/// written early is durable the same way: it reads back after an export and import.
#[test]
fn a_lone_sync_writer_commits_early() {
    for setting in ["auto", "off"] {
        let sim = Sim::new(31);
        let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
        let env = sim.env();
        let specs = common::leaf_specs(&legs);
        let setting = setting.to_owned();
        sim.run(async move {
            let t = Tunables::with([("intent_log.early_commit", setting.as_str())]).unwrap();
            let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
            store.create_volume("v", 4 << 20, 16384).unwrap();
            // The chain must be anchored by a sync before the log is used at all.
            store.sync().await.unwrap();
            let volume = sluice_engine::volume::Volume::open(&store, "v").unwrap();
            for i in 0..64u64 {
                volume.write(i * 4096, &[i as u8 + 1; 4096], false).await.unwrap();
                volume.flush().await.unwrap();
            }
            let early = store.log_stats().early_commits.get();
            if setting == "auto" {
                assert!(early >= 48, "{early} early commits for 64 write-flush pairs");
            } else {
                assert_eq!(early, 0, "early commits with intent_log.early_commit=off");
            }
            for i in 64..128u64 {
                volume.write(i * 4096, &[i as u8 + 1; 4096], false).await.unwrap();
                // Let each write's early commit (if any) finish before the next.
                env.sleep(Duration::from_millis(1)).await;
            }
            let streaming = store.log_stats().early_commits.get() - early;
            assert!(streaming <= 2, "{streaming} early commits for 64 writes with no flush");
            volume.flush().await.unwrap();
            drop(volume);
            let Ok(store) = Arc::try_unwrap(store) else { panic!("a task still holds the store") };
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            for i in 0..128u64 {
                let got = store.read("v", i * 4096, 4096).await.unwrap();
                assert!(got == [i as u8 + 1; 4096], "block {i} after import");
            }
        })
        .unwrap();
    }
}

/// The same for a lone writer of large writes, logged by pointer, under every commit policy
/// that commits early: each write is many records (one per block), which `auto` must not take
/// for many writers. The volume reads back whole after an export and import.
#[test]
fn a_lone_writer_of_large_writes_commits_early() {
    for policy in ["auto", "pipelined"] {
        let sim = Sim::new(32);
        let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
        let env = sim.env();
        let specs = common::leaf_specs(&legs);
        let policy = policy.to_owned();
        sim.run(async move {
            let t = Tunables::with([("intent_log.policy", policy.as_str())]).unwrap();
            let store = Arc::new(common::mirror_store(&env, specs.clone(), &t).await);
            store.create_volume("v", 16 << 20, 16384).unwrap();
            store.sync().await.unwrap();
            let volume = sluice_engine::volume::Volume::open(&store, "v").unwrap();
            const LEN: usize = 256 << 10;
            const PAIRS: u64 = 32;
            for i in 0..PAIRS {
                volume.write(i * LEN as u64, &vec![i as u8 + 1; LEN], false).await.unwrap();
                volume.flush().await.unwrap();
            }
            // The smoothed commit density reaches one per two changes after six pairs, so
            // at most 26 of the 32 writes can start early.
            let early = store.log_stats().early_commits.get();
            assert!(
                early >= 20,
                "{policy}: {early} early commits for {PAIRS} large write-flush pairs"
            );
            drop(volume);
            // The last early commit's task ends after the flush it served.
            for _ in 0..100 {
                if Arc::strong_count(&store) == 1 {
                    break;
                }
                env.sleep(Duration::from_millis(1)).await;
            }
            let Ok(store) = Arc::try_unwrap(store) else { panic!("a task still holds the store") };
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "tank", &t).await.unwrap();
            let store = Store::open(pool, &t).await.unwrap();
            for i in 0..PAIRS {
                let got = store.read("v", i * LEN as u64, LEN as u64).await.unwrap();
                assert!(got == vec![i as u8 + 1; LEN], "{policy}: write {i} after import");
            }
        })
        .unwrap();
    }
}
