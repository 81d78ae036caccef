//! Thick and thin volumes (ZFS: `refreservation`): a thick volume's writes, first writes and
//! overwrites alike, never fail for space however full thin volumes make the pool; the thin
//! one that fills it is refused; a thick volume (or a grow of one) that the pool cannot set
//! aside is refused; the reservation survives export and import; the audit balances throughout.

use crate::common;

use std::sync::Arc;

use sluice_engine::device::SimProfile;
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError, VolumeProperty};
use sluice_format::Compression;
use sluice_sim::Sim;

const LEG_BYTES: u64 = 64 << 20;
const THICK_BYTES: u64 = 16 << 20;
const CHUNK: usize = 1 << 20;

fn random(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.u64() as u8).collect()
}

async fn audit_clean(store: &Store) {
    let report = store.audit().await.unwrap();
    assert!(report.is_clean(), "audit: {:?}", report.problems);
}

#[test]
fn a_thick_volume_writes_into_a_pool_thin_volumes_filled() {
    let sim = Sim::new(11);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let tunables = Tunables::default();
    let (written_by_thin, overwrites) = sim
        .run(async move {
            let store = common::mirror_store(&env, specs, &tunables).await;
            store.create_volume_with("thick", THICK_BYTES, 16384, true).unwrap();
            store.create_volume("thin", 256 << 20, 16384).unwrap();
            // Random bytes: compression saves nothing, so the figures are the worst case.
            for volume in ["thick", "thin"] {
                store.set_property(volume, VolumeProperty::Compression(Compression::Off)).unwrap();
            }
            let reserved = store.volume_info("thick").unwrap().reservation_bytes;
            assert!(reserved > THICK_BYTES, "data and indirect blocks: {reserved}");
            let mut rng = Rng::new(3);
            // The thin volume fills the pool before the thick one has written anything.
            let mut at = 0u64;
            let refused = loop {
                match store.write("thin", at, &random(&mut rng, CHUNK)).await {
                    Ok(_) => at += CHUNK as u64,
                    Err(error) => break error,
                }
                store.sync().await.unwrap();
            };
            assert!(matches!(refused, StoreError::NoSpace { .. }), "{refused}");
            // The space held back for the thick volume is what the thin one could not take.
            assert!(store.available_bytes(Some("thin")).unwrap() < CHUNK as u64);
            assert!(store.available_bytes(Some("thick")).unwrap() >= THICK_BYTES);
            // Every block of the thick volume, then three overwrites of all of it.
            let mut overwrites = 0;
            for pass in 0..4 {
                for at in (0..THICK_BYTES).step_by(CHUNK) {
                    store.write("thick", at, &random(&mut rng, CHUNK)).await.unwrap_or_else(|e| {
                        panic!("pass {pass}: write at {at} of the thick volume: {e}")
                    });
                    overwrites += u64::from(pass > 0);
                }
                store.sync().await.unwrap();
            }
            // The thin volume takes at most the little the reservation's estimate of the
            // indirect blocks left over, and the thick volume still overwrites all of itself.
            let mut more = 0u64;
            while store.write("thin", at + more, &random(&mut rng, CHUNK)).await.is_ok() {
                more += CHUNK as u64;
                store.sync().await.unwrap();
            }
            assert!(more <= 2 * CHUNK as u64, "the thin volume took {more} more bytes");
            for at in (0..THICK_BYTES).step_by(CHUNK) {
                store.write("thick", at, &random(&mut rng, CHUNK)).await.unwrap_or_else(|e| {
                    panic!("after the thin refill: write at {at} of the thick volume: {e}")
                });
            }
            store.sync().await.unwrap();
            audit_clean(&store).await;
            (at, overwrites)
        })
        .unwrap()
        .0;
    assert!(written_by_thin > 32 << 20, "the thin volume wrote {written_by_thin} bytes");
    assert_eq!(overwrites, 3 * THICK_BYTES / CHUNK as u64);
}

#[test]
fn reservations_the_pool_cannot_hold_are_refused_and_survive_import() {
    let sim = Sim::new(12);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let env = sim.env();
    let specs = common::leaf_specs(&legs);
    let env2 = env.clone();
    sim.run(async move {
        let tunables = Tunables::default();
        let store = common::mirror_store(&env, specs, &tunables).await;
        // More than the pool holds: refused, and nothing is created.
        let refused = store.create_volume_with("huge", 96 << 20, 16384, true).unwrap_err();
        assert!(matches!(refused, StoreError::NoSpaceToReserve { .. }), "{refused}");
        assert!(store.volume_info("huge").is_none());
        // Thin, the same size is accepted.
        store.create_volume("huge", 96 << 20, 16384).unwrap();
        // Two thick volumes that fit one at a time but not together.
        // Even in blocks, so that half of it is whole blocks too.
        let half = store.available_bytes(None).unwrap() * 3 / 5 / 32768 * 32768;
        store.create_volume_with("a", half, 16384, true).unwrap();
        assert!(store.create_volume_with("b", half, 16384, true).is_err());
        // A grow past what is free is refused and leaves the volume as it was; a shrink
        // gives the reservation back.
        assert!(store.resize_volume("a", half * 2).await.is_err());
        assert_eq!(store.volume_info("a").unwrap().size_bytes, half);
        let before = store.volume_info("a").unwrap().reservation_bytes;
        store.resize_volume("a", half / 2).await.unwrap();
        let after = store.volume_info("a").unwrap().reservation_bytes;
        assert!(after < before && after >= half / 2, "{before} -> {after}");
        store.create_volume_with("b", half / 2, 16384, true).unwrap();
        store.sync().await.unwrap();
        store.export().await.unwrap();
        let specs = common::leaf_specs(&legs);
        let pool = Pool::import(&env2, specs, "tank", &tunables).await.unwrap();
        let store = Arc::new(Store::open(pool, &tunables).await.unwrap());
        assert_eq!(store.volume_info("a").unwrap().reservation_bytes, after);
        assert_eq!(store.volume_info("huge").unwrap().reservation_bytes, 0);
        assert!(store.create_volume_with("c", half, 16384, true).is_err());
        audit_clean(&store).await;
    })
    .unwrap();
}

/// A thick volume overwritten on a pool whose free space is partly holes smaller than a block
/// never runs its sync out of room. Admission counts what each free range holds in whole
/// 16 KiB blocks, not all free bytes: a block that does not compress needs a range of its
/// size, and holes left by blocks that did compress hold none. (Counted in bytes, 1 MiB overwrites of a thick
/// volume on a 2 GiB pool admitted more than the sync could place, and the pool was suspended
/// with 69 MB free and no 16 KiB range left: peers run, 2026-11-27.)
#[test]
fn overwrites_never_fail_a_sync_on_a_pool_of_small_holes() {
    let sim = Sim::new(12);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    // Syncs start only when dirty data or free space asks for one.
    let tunables =
        Tunables::with([("txg.timeout_ms", "3600000"), ("txg.dirty_max", "1G")]).unwrap();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let volume = 40u64 << 20;
        let block = 16384u64;
        store.create_volume_with("v", volume, block as u32, true).unwrap();
        store.sync().await.unwrap();
        store.run_syncer();
        let mut rng = Rng::new(5);
        // Every other block compresses to one 4 KiB unit, so the blocks lie on disk as 4 KiB,
        // 16 KiB, 4 KiB, ... Rewriting the small ones with bytes that do not compress frees
        // their units: 1,280 holes of 4 KiB between live blocks, 5 MiB that no 16 KiB block
        // can use.
        for at in (0..volume).step_by(block as usize) {
            let data = if at / block % 2 == 0 {
                vec![0x5a; block as usize]
            } else {
                random(&mut rng, block as usize)
            };
            store.write("v", at, &data).await.unwrap();
        }
        store.sync().await.unwrap();
        for at in (0..volume).step_by(2 * block as usize) {
            store.write("v", at, &random(&mut rng, block as usize)).await.unwrap();
        }
        for _ in 0..3 {
            store.sync().await.unwrap();
        }
        // Passes over the whole volume: each txg's blocks need new space before the blocks
        // they replace come back.
        let chunk = 256usize << 10;
        let mut last = Vec::new();
        for _ in 0..3 {
            last.clear();
            for at in (0..volume).step_by(chunk) {
                let data = random(&mut rng, chunk);
                store.write("v", at, &data).await.unwrap();
                last.push(data);
            }
        }
        store.sync().await.unwrap();
        assert!(!store.is_suspended());
        for (i, data) in last.iter().enumerate() {
            let at = (i * chunk) as u64;
            assert!(store.read("v", at, chunk as u64).await.unwrap() == *data, "at {at}");
        }
        audit_clean(&store).await;
    })
    .unwrap();
}

/// The largest thick volume a pool allows: found by trying smaller sizes (`step` apart),
/// less `margin`.
async fn largest_thick_volume(store: &Store, step: u64, margin: u64) -> u64 {
    let mut size = store.available_bytes(None).unwrap() / step * step + step;
    while store.create_volume_with("v", size, 16384, true).is_err() {
        size -= step;
    }
    if margin > 0 {
        store.destroy_volume("v").await.unwrap();
        size -= margin;
        store.create_volume_with("v", size, 16384, true).unwrap();
    }
    size
}

/// A thick volume that leaves the pool only its slop, overwritten at random by eight writers
/// at once while the syncer runs: no write is refused and no sync fails. Each txg's blocks
/// need new space before the blocks they replace come back, so writers wait for syncs. Two
/// things hold it: writes admitted but not yet in the txg count against the space (without
/// that, writers admitted against the same figures while the throttle held them overran the
/// slop and failed a sync, suspending the pool); and while one writer waits for space the
/// others queue behind it (without that, a writer passed over at every sync was refused).
#[test]
fn concurrent_overwrites_of_a_thick_volume_are_never_refused() {
    let sim = Sim::new(14);
    let legs = common::legs(&sim, 2, SimProfile::ssd(), LEG_BYTES);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let tunables = Tunables::default();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let chunk = 256u64 << 10;
        // A margin for the pool's own metadata, which the reservation does not count and
        // which the small slop of so small a pool does not hold.
        let volume = largest_thick_volume(&store, chunk, 1 << 20).await;
        assert!(volume > LEG_BYTES * 3 / 4, "only {volume} bytes could be reserved");
        store.set_property("v", VolumeProperty::Compression(Compression::Off)).unwrap();
        let mut rng = Rng::new(7);
        for at in (0..volume).step_by(chunk as usize) {
            store.write("v", at, &random(&mut rng, chunk as usize)).await.unwrap();
        }
        store.sync().await.unwrap();
        store.run_syncer();
        let writers = (0..8u64).map(|w| {
            let store = store.clone();
            let mut rng = Rng::new(100 + w);
            async move {
                for i in 0..24 {
                    let at = rng.below(volume / chunk) * chunk;
                    let data = random(&mut rng, chunk as usize);
                    if let Err(error) = store.write("v", at, &data).await {
                        panic!("writer {w}, write {i} at {at}: {error}");
                    }
                }
            }
        });
        futures::future::join_all(writers).await;
        store.sync().await.unwrap();
        assert!(!store.is_suspended());
        audit_clean(&store).await;
    })
    .unwrap();
}

/// The largest thick volume a pool allows, written with bytes that do not compress, then
/// overwritten at random with bytes that compress to half, then with bytes that do not, as a
/// disk image is: no write is refused. On a pool short of room the thick volume stores its
/// blocks whole: the holes its compressed blocks left when replaced could not hold a block
/// that does not compress (320 MB of 340 MB free was such holes when a 1,920 MiB volume on a
/// 2 GiB pool was refused 1 MiB writes, 2026-11-29).
#[test]
fn a_thick_volume_on_a_pool_short_of_room_leaves_no_holes_it_cannot_use() {
    const LEG: u64 = 256 << 20;
    let sim = Sim::new(15);
    let legs = common::legs(&sim, 2, SimProfile::Instant, LEG);
    let specs = common::leaf_specs(&legs);
    let env = sim.env();
    let tunables = Tunables::default();
    sim.run(async move {
        let store = Arc::new(common::mirror_store(&env, specs, &tunables).await);
        let chunk = 1u64 << 20;
        let volume = largest_thick_volume(&store, chunk, 0).await;
        let bytes = |rng: &mut Rng, len: u64, compressible: bool| {
            let mut data = random(rng, len as usize);
            if compressible {
                for block in data.chunks_mut(16384) {
                    block[8192..].fill(0x5a);
                }
            }
            data
        };
        let mut rng = Rng::new(9);
        for at in (0..volume).step_by(chunk as usize) {
            store.write("v", at, &bytes(&mut rng, chunk, false)).await.unwrap();
        }
        store.sync().await.unwrap();
        store.run_syncer();
        // Each pass writes as much as the volume holds.
        let passes = [(chunk, true), (16384, false), (chunk, false)];
        for (pass, (len, compressible)) in passes.into_iter().enumerate() {
            for i in 0..volume / len {
                let at = rng.below(volume / len) * len;
                if let Err(error) = store.write("v", at, &bytes(&mut rng, len, compressible)).await
                {
                    panic!("pass {pass}, write {i} of {len} bytes at {at}: {error}");
                }
            }
        }
        store.sync().await.unwrap();
        assert!(!store.is_suspended());
        audit_clean(&store).await;
    })
    .unwrap();
}
