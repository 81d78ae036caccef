//! The intent log's commit path under crashes, for both policies (seed 004): every record
//! whose commit returned is found when the chain is walked after a power cut, with its data
//! intact and in order; a chain ends cleanly at the first block that was not written.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_engine::alloc::Allocator;
use sluice_engine::device::sim::{CrashPolicy, Fault};
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::intent_log::{read_chain, CommitPolicy, LogWriter};
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_format::LogRecord;
use sluice_sim::Sim;

const LEAF_BYTES: u64 = 64 << 20;
const WRITERS: u64 = 8;

fn payload(sequence: u64) -> Vec<u8> {
    (0..(64 + sequence % 700)).map(|i| (sequence as u8).wrapping_add(i as u8)).collect()
}

fn run(seed: u64, policy: CommitPolicy, crash: bool) {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let acked = Rc::new(RefCell::new(BTreeSet::new()));
    let mut rng = Rng::new(seed);
    let crash_after = Duration::from_micros(rng.below(3_000));
    let (a, crash_legs) = (Rc::clone(&acked), legs.clone());
    let (head, verifier) = sim
        .run(async move {
            let tunables = Tunables::default();
            let spec = common::mirror_pool(specs);
            let pool = Arc::new(Pool::create(&env, spec, &tunables).await.unwrap());
            let allocator = Arc::new(Mutex::new(Allocator::new(pool.ashift(), &pool.data_areas())));
            let log = Arc::new(
                LogWriter::new("tank", &allocator, policy, 10, 0xabc ^ seed, 1, 16 << 10).unwrap(),
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
    let revived =
        common::leaf_specs(&common::revive(&fresh, images, SimProfile::ssd(), LEAF_BYTES));
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
    for policy in [CommitPolicy::Pipelined, CommitPolicy::Batch] {
        run(1000, policy, false);
        for seed in 0..150 {
            run(seed, policy, true);
        }
    }
}
