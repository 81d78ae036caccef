//! Send and receive between two pools: a full stream makes the volume and its snapshot
//! byte for byte; an incremental one carries only what changed and adds the newer snapshot; a
//! stream cut short or damaged is refused naming the record and leaves nothing visible; the
//! audit balances on both pools.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod common;

use sluice_engine::device::SimProfile;
use sluice_engine::pool::Pool;
use sluice_engine::rt::Rng;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{Store, StoreError};
use sluice_format::{StreamReader, StreamWriter};
use sluice_sim::Sim;

const VOLUME_BYTES: u64 = 4 << 20;
const BLOCK: u64 = 16384;

async fn send(store: &Store, snapshot: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut writer = StreamWriter::new(&mut out);
    let summary = {
        let mut emit = |record| writer.write(&record);
        store.send_snapshot("v", snapshot, from, &mut emit).await.unwrap()
    };
    let (records, _) = writer.finish().unwrap();
    assert_eq!(records, summary.records);
    out
}

async fn receive(store: &Store, target: &str, stream: &[u8]) -> Result<(), StoreError> {
    let mut reader = StreamReader::new(stream);
    let mut next = || reader.next_record();
    store.receive(target, &mut next).await.map(|_| ())
}

async fn audit_clean(store: &Store, step: &str) {
    let report = store.audit().await.unwrap();
    assert!(report.is_clean(), "audit after {step}: {:?}", report.problems);
}

#[test]
fn full_and_incremental_streams_replicate_snapshots() {
    let sim = Sim::new(31);
    let a_legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let b_legs = common::legs(&sim, 2, SimProfile::Instant, 64 << 20);
    let env = sim.env();
    sim.run(async move {
        let tunables = Tunables::default();
        let a = common::mirror_store(&env, common::leaf_specs(&a_legs), &tunables).await;
        let b = common::mirror_store(&env, common::leaf_specs(&b_legs), &tunables).await;
        let mut rng = Rng::new(3);
        a.create_volume("v", VOLUME_BYTES, BLOCK as u32).unwrap();
        // Half compressible (sent compressed), half random, a hole in between.
        let mut data = vec![0u8; VOLUME_BYTES as usize];
        for (i, chunk) in data.chunks_mut(BLOCK as usize).enumerate() {
            match i % 4 {
                0 => chunk.fill(i as u8),
                1 | 2 => chunk.iter_mut().for_each(|b| *b = rng.u64() as u8),
                _ => {}
            }
        }
        for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
            if i % 4 != 3 {
                a.write("v", i as u64 * BLOCK, chunk).await.unwrap();
            }
        }
        a.create_snapshots(&[("v".into(), "one".into())], 100).await.unwrap();
        let full = send(&a, "one", None).await;
        receive(&b, "w", &full).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        assert!(b.read("w@one", 0, VOLUME_BYTES).await.unwrap() == data);
        let got = b.snapshots("w").unwrap();
        assert_eq!((got[0].name.as_str(), got[0].creation_secs), ("one", 100));
        let first = data.clone();
        assert!(b.volumes().iter().all(|v| !v.name.starts_with('%')));
        // Ten blocks change, one is trimmed: the incremental stream carries those.
        for i in 0..10u64 {
            let block: Vec<u8> = (0..BLOCK).map(|_| rng.u64() as u8).collect();
            let at = (i * 37 % 256) * BLOCK;
            a.write("v", at, &block).await.unwrap();
            data[at as usize..][..BLOCK as usize].copy_from_slice(&block);
        }
        a.zero("v", BLOCK, BLOCK).await.unwrap();
        data[BLOCK as usize..][..BLOCK as usize].fill(0);
        a.create_snapshots(&[("v".into(), "two".into())], 200).await.unwrap();
        let incremental = send(&a, "two", Some("one")).await;
        assert!(
            incremental.len() * 10 < full.len(),
            "incremental {} bytes, full {}",
            incremental.len(),
            full.len()
        );
        // Cut short, or damaged: refused, naming what went wrong; w stays as it was.
        let cut = receive(&b, "w", &incremental[..incremental.len() / 2]).await.unwrap_err();
        assert!(cut.to_string().contains("cut short"), "{cut}");
        let mut damaged = incremental.clone();
        let at = damaged.len() / 3;
        damaged[at] ^= 0x40;
        let refused = receive(&b, "w", &damaged).await.unwrap_err();
        assert!(refused.to_string().contains("record"), "{refused}");
        assert!(b.volumes().iter().all(|v| !v.name.starts_with('%')));
        assert_eq!(b.snapshots("w").unwrap().len(), 1);
        audit_clean(&b, "refused streams").await;
        // Whole, it applies.
        receive(&b, "w", &incremental).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        let got = b.snapshots("w").unwrap();
        assert_eq!(got.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        assert!(b.read("w@one", 0, VOLUME_BYTES).await.unwrap() == first);
        assert!(b.read("w@two", 0, VOLUME_BYTES).await.unwrap() == data);
        // Sent again, it is refused: w's newest snapshot is no longer the stream's older one.
        assert!(matches!(
            receive(&b, "w", &incremental).await,
            Err(StoreError::ReceiveRefused { .. })
        ));
        // A full stream into an existing volume is refused too.
        assert!(matches!(receive(&b, "w", &full).await, Err(StoreError::ReceiveRefused { .. })));
        audit_clean(&a, "sends").await;
        audit_clean(&b, "receives").await;
        b.export().await.unwrap();
        let pool =
            Pool::import(&env, common::leaf_specs(&b_legs), "tank", &tunables).await.unwrap();
        let b = Store::open(pool, &tunables).await.unwrap();
        assert!(b.read("w", 0, VOLUME_BYTES).await.unwrap() == data);
        audit_clean(&b, "import").await;
    })
    .unwrap();
}
