//! A pool that fills: writes are refused with a no-space error naming the pool while it still
//! syncs and imports, random overwrites of a full or fragmented pool never fail a sync, and on a
//! pool smaller than the dirty maximum writers slow down by free space and share the syncs that
//! give space back. (The swarm of writers and an administrator on a pool short of space is
//! space.rs.)

use crate::common;

use sluice_engine::device::SimProfile;
use sluice_engine::pool::{Pool, PoolSpec, TopSpec};
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_sim::Sim;
use std::sync::Arc;

const LEAF_BYTES: u64 = 64 << 20;

/// A full pool (F9): writes get a no-space error naming the pool, the pool still syncs and
/// imports, every block written before the error reads back, and after a range is zeroed and
/// its txg has synced past the deferral, writes succeed again.
#[test]
fn full_pool_refuses_writes_then_recovers() {
    let sim = Sim::new(77);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 16 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let (written, error_text) = sim
        .run(async move {
            let spec = PoolSpec {
                name: "small".into(),
                ashift: 12,
                top: vec![TopSpec::Mirror(specs.clone())],
            };
            let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
            let store = Store::create(pool, &Tunables::default());
            // Sparse and larger than the pool: thin provisioning.
            store.create_volume("thin", 64 << 20, 16384).unwrap();
            store.sync().await.unwrap();
            let chunk = vec![0x5au8; 256 << 10];
            let mut written = 0u64;
            let error = loop {
                match store.write("thin", written, &chunk).await {
                    Ok(_) => written += chunk.len() as u64,
                    Err(error) => break error,
                }
                store.sync().await.unwrap();
            };
            assert!(matches!(error, sluice_engine::txg::StoreError::NoSpace { .. }), "{error}");
            // Full, the pool still syncs (from the slop reserve) and reads back what it took.
            store.sync().await.unwrap();
            assert!(store.read("thin", 0, written).await.unwrap().iter().all(|&b| b == 0x5a));
            // Free the first half; the space returns once the freeing txg is past the deferral.
            store.zero("thin", 0, written / 2).await.unwrap();
            for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 1) {
                store.sync().await.unwrap();
            }
            store.write("thin", 0, &chunk).await.unwrap();
            store.sync().await.unwrap();
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "small", &Tunables::default()).await.unwrap();
            let store = Store::open(pool, &Tunables::default()).await.unwrap();
            assert!(store
                .read("thin", 0, chunk.len() as u64)
                .await
                .unwrap()
                .iter()
                .all(|&b| b == 0x5a));
            assert!(store
                .read("thin", written / 2, written / 2)
                .await
                .unwrap()
                .iter()
                .all(|&b| b == 0x5a));
            (written, error.to_string())
        })
        .unwrap()
        .0;
    assert!(written >= 8 << 20, "only {written} bytes fit in a 16 MiB mirror");
    assert!(error_text.contains("small") && error_text.contains("trim"), "{error_text}");
}

/// Random 4 KiB overwrites of a nearly full pool: every txg rewrites indirect blocks all over
/// the volume, and each overwrite needs new space while the old block waits out its deferral.
/// Writes may be refused (NoSpace), but every sync must succeed: a sync that runs out of space
/// suspends the pool. (Found by the peers benchmark on a 4 KiB-block volume.)
#[test]
fn random_overwrites_of_a_full_pool_never_fail_a_sync() {
    let sim = Sim::new(79);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 24 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let refused = sim
        .run(async move {
            let spec = PoolSpec {
                name: "tight".into(),
                ashift: 12,
                top: vec![TopSpec::Mirror(specs.clone())],
            };
            let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
            let store = Store::create(pool, &Tunables::default());
            let blocks = 4096u64;
            store.create_volume("v", blocks * 4096, 4096).unwrap();
            let mut model = vec![1u8; (blocks * 4096) as usize];
            store.write("v", 0, &model).await.unwrap();
            store.sync().await.unwrap();
            let mut rng = Rng::new(4);
            let mut refused = 0u32;
            for round in 0..40u32 {
                for _ in 0..600 {
                    let block = rng.below(blocks);
                    let at = (block * 4096) as usize;
                    let byte = (round % 250) as u8 + 2;
                    match store.write("v", at as u64, &[byte; 4096]).await {
                        Ok(_) => model[at..at + 4096].fill(byte),
                        Err(error) => {
                            assert!(
                                matches!(error, sluice_engine::txg::StoreError::NoSpace { .. }),
                                "{error}"
                            );
                            refused += 1;
                        }
                    }
                }
                store.sync().await.unwrap();
            }
            store.export().await.unwrap();
            let pool = Pool::import(&env, specs, "tight", &Tunables::default()).await.unwrap();
            let store = Store::open(pool, &Tunables::default()).await.unwrap();
            assert!(store.read("v", 0, blocks * 4096).await.unwrap() == model);
            refused
        })
        .unwrap()
        .0;
    eprintln!("refused {refused} writes");
}

/// A pool whose free space is fragmented into thousands of 4 KiB holes (every other block of
/// a full volume trimmed) keeps syncing and importing: its space map, far larger than any
/// free range, is written in small pieces. (A single-block map needed a contiguous range of
/// the map's size and suspended the pool, found by the peers benchmark at 80% full.)
#[test]
fn fragmented_pool_syncs_and_imports() {
    let sim = Sim::new(78);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let spec =
            PoolSpec { name: "frag".into(), ashift: 12, top: vec![TopSpec::Mirror(specs.clone())] };
        let pool = Pool::create(&env, spec, &Tunables::default()).await.unwrap();
        let store = Store::create(pool, &Tunables::default());
        let blocks = 10_000u64;
        store.create_volume("v", blocks * 4096, 4096).unwrap();
        let data: Vec<u8> = (0..blocks * 4096).map(|i| (i / 4096) as u8 | 1).collect();
        for chunk in 0..10 {
            let range =
                (chunk * blocks / 10 * 4096) as usize..((chunk + 1) * blocks / 10 * 4096) as usize;
            store.write("v", range.start as u64, &data[range]).await.unwrap();
            store.sync().await.unwrap();
        }
        for block in (0..blocks).step_by(2) {
            store.zero("v", block * 4096, 4096).await.unwrap();
        }
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        // Fill the holes again with fresh copies: allocations land in the 4 KiB holes.
        for block in (1..blocks).step_by(2).take(2000) {
            store
                .write(
                    "v",
                    block * 4096,
                    &data[(block * 4096) as usize..((block + 1) * 4096) as usize],
                )
                .await
                .unwrap();
        }
        store.sync().await.unwrap();
        store.export().await.unwrap();
        let pool = Pool::import(&env, specs, "frag", &Tunables::default()).await.unwrap();
        let store = Store::open(pool, &Tunables::default()).await.unwrap();
        for block in [1u64, 3, 4001, 9999] {
            let got = store.read("v", block * 4096, 4096).await.unwrap();
            assert_eq!(
                got,
                data[(block * 4096) as usize..((block + 1) * 4096) as usize],
                "block {block}"
            );
        }
        assert!(store.read("v", 0, 4096).await.unwrap().iter().all(|&b| b == 0));
    })
    .unwrap();
}

/// `len` bytes that do not compress, from `seed`.
fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).step_by(8).flat_map(|_| rng.u64().to_le_bytes()).take(len).collect()
}

/// Checks that volume "v" holds, in each `chunk` of its first `volume` bytes, what pass `pass`
/// wrote there: `incompressible(pass << 32 | offset, chunk)`.
async fn assert_incompressible(store: &Store, volume: u64, chunk: u64, pass: u64) {
    for at in (0..volume).step_by(chunk as usize) {
        let got = store.read("v", at, chunk).await.unwrap();
        assert!(got == incompressible(pass << 32 | at, chunk as usize), "pass {pass} at {at}");
    }
}

/// A dirty-data maximum larger than the pool can hold: writers streaming over a volume that
/// fills a third of a small pool are slowed by syncs started early and by delays, both sized
/// to the free space, rather than stopped at the space check for a whole sync each time
/// (before, only `txg.dirty_max` started syncs and set the delays, and the syncing txg's
/// allocations counted twice).
#[test]
fn a_pool_smaller_than_the_dirty_maximum_throttles_by_free_space() {
    streamed(91, 64 << 10, async |store: &Store| {
        let throttle = store.throttle_stats();
        // Slowed, not stopped: the few waits left (a sync of the txgs before may still be
        // running when the writer gets to the wall) take less time than the delays.
        let (delayed, waited) =
            (throttle.delayed_nanos.get(), throttle.waited_for_space_nanos.get());
        assert!(delayed > waited, "delayed {delayed} ns, waited for space {waited} ns");
        assert_eq!(throttle.waited_for_sync.get(), 0);
        assert!(store.syncs() >= 4, "{} syncs: none started for the free space", store.syncs());
    });
}

/// Large writes are held to a quarter of the room the free space leaves the open txg, small
/// ones are not: the same passes over a volume that fills a third of a small pool, in 1 MiB
/// writes and in 64 KiB ones, make txgs of which the large writes' biggest is well under the
/// small writes' (a txg that takes most of the free space takes its small holes, and a
/// stream then keeps a fragmented pool fragmented).
#[test]
fn large_writes_keep_their_txgs_to_a_part_of_the_free_space() {
    let largest_txg = |chunk: u64| {
        streamed(93, chunk, async |store: &Store| {
            // Slowed, never stopped for a sync.
            assert_eq!(store.throttle_stats().waited_for_sync.get(), 0);
            store.sync_history().iter().map(|r| r.admitted_bytes).max().unwrap()
        })
    };
    let (large, small) = (largest_txg(1 << 20), largest_txg(64 << 10));
    assert!(large * 2 < small, "largest txg of 1 MiB writes {large}, of 64 KiB writes {small}");
}

/// Four passes of writes of `chunk` over a 20 MiB volume on a 64 MiB mirror whose
/// `txg.dirty_max` (1 GiB) is more than the pool holds, with the syncer running: 80 MiB through
/// the pool, each pass's blocks replacing the last pass's (freed, and held two more txgs).
/// Runs `check` once the last write returned, then syncs and reads every chunk back.
fn streamed<T: 'static>(
    seed: u64,
    chunk: u64,
    check: impl AsyncFnOnce(&Store) -> T + 'static,
) -> T {
    let sim = Sim::new(seed);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let tunables =
        Tunables::with([("txg.timeout_ms", "3600000"), ("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let volume = 20u64 << 20;
        store.create_volume("v", volume, 16384).unwrap();
        store.sync().await.unwrap();
        store.run_syncer();
        for pass in 0..4u64 {
            for at in (0..volume).step_by(chunk as usize) {
                store
                    .write("v", at, &incompressible(pass << 32 | at, chunk as usize))
                    .await
                    .unwrap();
            }
        }
        let checked = check(&store).await;
        store.sync().await.unwrap();
        assert_incompressible(&store, volume, chunk, 3).await;
        checked
    })
    .unwrap()
    .0
}

/// Writers that meet the space check together wait for one sync, not one each: they queue
/// behind the first, and a writer whose turn comes after a sync ended looks at the space again
/// before syncing itself (each syncing in turn made the last writer wait for every other's
/// sync).
#[test]
fn writers_short_of_space_share_a_sync() {
    let sim = Sim::new(92);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    // No syncer and no dirty limit to reach: only the space check syncs.
    let tunables = Tunables::with([("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let volume = 40u64 << 20;
        store.create_volume("v", volume, 16384).unwrap();
        let chunk = 64u64 << 10;
        for at in (0..volume).step_by(chunk as usize) {
            store.write("v", at, &incompressible(at, chunk as usize)).await.unwrap();
        }
        store.sync().await.unwrap();
        let before = store.syncs();
        // Four writers overwrite a quarter each.
        let quarter = volume / 4;
        let writers = (0..4u64).map(|w| {
            let store = store.clone();
            async move {
                for at in (w * quarter..(w + 1) * quarter).step_by(chunk as usize) {
                    let data = incompressible(1 << 32 | at, chunk as usize);
                    store.write("v", at, &data).await.unwrap();
                }
            }
        });
        futures::future::join_all(writers).await;
        let waits = store.throttle_stats().waited_for_space.get();
        let syncs = store.syncs() - before;
        assert!(waits >= 4, "{waits} waits: the writers never met the space check together");
        assert!(syncs < waits, "{syncs} syncs for {waits} waits: each writer synced for itself");
        store.sync().await.unwrap();
        assert_incompressible(&store, volume, chunk, 1).await;
    })
    .unwrap();
}

/// Blocks larger than 16 KiB need free ranges of their own size, and there are no gang
/// blocks: a volume of 128 KiB blocks written into a pool whose free space is partly 16 KiB
/// holes is refused with a no-space error once the ranges that hold whole 128 KiB blocks are
/// spoken for, rather than admitted into a sync that cannot place it. (Admission counted room
/// in 16 KiB blocks for every volume, and a served pool's sync failed with 198 MB free and no
/// 128 KiB range left, bench/raidz.py, 2026-11-29.) The holes still take 16 KiB blocks.
#[test]
fn large_blocks_are_refused_before_a_sync_cannot_place_them() {
    let sim = Sim::new(79);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEAF_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    // Syncs start only when dirty data or free space asks for one.
    let tunables =
        Tunables::with([("txg.timeout_ms", "3600000"), ("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let spec = PoolSpec { name: "holes".into(), ashift: 12, top: vec![TopSpec::Mirror(specs)] };
        let pool = Pool::create(&env, spec, &tunables).await.unwrap();
        let store = Arc::new(Store::create(pool, &tunables));
        store.run_syncer();
        // 40 MiB of 16 KiB blocks, then every other one zeroed: 1,280 holes of 16 KiB.
        let (small, block) = (40u64 << 20, 16u64 << 10);
        store.create_volume("small", small, block as u32).unwrap();
        for at in (0..small).step_by(1 << 20) {
            store.write("small", at, &incompressible(at, 1 << 20)).await.unwrap();
        }
        store.sync().await.unwrap();
        for at in (0..small).step_by(2 * block as usize) {
            store.zero("small", at, block).await.unwrap();
        }
        for _ in 0..(sluice_engine::alloc::FREE_DEFER_TXGS + 2) {
            store.sync().await.unwrap();
        }
        // A thin volume of 128 KiB blocks, larger than the pool, written until refused.
        let (large, chunk) = (64u64 << 20, 128u64 << 10);
        store.create_volume("large", large, chunk as u32).unwrap();
        let mut written = 0;
        let refused = loop {
            assert!(written < large, "a 64 MiB pool took 64 MiB of new blocks");
            match store
                .write("large", written, &incompressible(written | 1 << 40, chunk as usize))
                .await
            {
                Ok(_) => written += chunk,
                Err(e) => break e,
            }
        };
        assert!(
            matches!(refused, sluice_engine::txg::StoreError::NoSpace { .. }),
            "refused with {refused}"
        );
        assert!(!store.is_suspended(), "a sync ran out of room");
        assert!(written >= 4 << 20, "only {written} bytes of 128 KiB blocks were taken");
        store.sync().await.unwrap();
        for at in (0..written).step_by(chunk as usize) {
            let got = store.read("large", at, chunk).await.unwrap();
            assert!(got == incompressible(at | 1 << 40, chunk as usize), "large at {at}");
        }
        // The 16 KiB holes are still there for 16 KiB blocks.
        for at in (0..small).step_by(8 * block as usize) {
            store.write("small", at, &incompressible(at | 1 << 41, block as usize)).await.unwrap();
        }
        store.sync().await.unwrap();
        assert!(!store.is_suspended());
        let report = store.audit().await.unwrap();
        assert!(report.is_clean(), "audit: {:?}", report.problems);
    })
    .unwrap();
}

/// A write refused on a full pool, then a trim, then a write at once, with no sync between: the
/// second write waits for the syncs that bring the trim's frees back and is admitted. (Writers
/// queued behind a refused writer are refused with it; one that arrived after the trim was
/// refused too, as if nothing had changed: tests/interop/enospc_cases.py, 2026-11-29.)
#[test]
fn a_write_after_a_refusal_and_a_trim_waits_for_the_trims_frees() {
    let sim = Sim::new(78);
    let legs = common::legs(&sim, 2, SimProfile::Instant, 16 << 20);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    sim.run(async move {
        let store = common::mirror_store(&env, specs, &Tunables::default()).await;
        store.create_volume("thin", 64 << 20, 16384).unwrap();
        store.sync().await.unwrap();
        let chunk = incompressible(1, 64 << 10);
        let mut written = 0u64;
        let refused = loop {
            match store.write("thin", written, &chunk).await {
                Ok(_) => written += chunk.len() as u64,
                Err(error) => break error,
            }
        };
        assert!(matches!(refused, StoreError::NoSpace { .. }), "{refused}");
        // Refused again at once: nothing changed.
        let again = store.write("thin", written, &chunk).await.unwrap_err();
        assert!(matches!(again, StoreError::NoSpace { .. }), "{again}");
        store.zero("thin", 0, written / 2).await.unwrap();
        store
            .write("thin", 0, &chunk)
            .await
            .unwrap_or_else(|e| panic!("the write after the trim of {} bytes: {e}", written / 2));
        store.sync().await.unwrap();
        assert_eq!(store.read("thin", 0, chunk.len() as u64).await.unwrap(), chunk);
    })
    .unwrap();
}
