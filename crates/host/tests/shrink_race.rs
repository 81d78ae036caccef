//! A shrink racing writes, on real threads. A write checks its range against the volume's size,
//! then builds its blocks and takes the store's lock to insert them; a shrink that runs in
//! between used to leave the write's blocks past the new end, where the next sync stored them
//! (space that no later shrink frees, and old data that reappears if the volume grows again).
//! The simulator runs one task at a time and never interleaves there; threads do. Writers pour
//! large writes into the tail of a volume while it shrinks under them; after each shrink the
//! audit must find no block past the end. A given run may not hit the race;
//! crates/engine/tests/volume.rs makes it happen every time with a pause point, and fails
//! without the write's second range check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sluice_engine::device::{FileDevice, FileDeviceOptions};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;

const FULL: u64 = 16 << 20;
const SHRUNK: u64 = 12 << 20;
const WRITE: u64 = 256 << 10;
const ROUNDS: u64 = 100;
const WRITERS: u64 = 4;

#[test]
fn shrink_never_leaves_blocks_past_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    runtime.block_on(async {
        let env = sluice_host::tokio_env(11);
        // No syncer: the test syncs when it checks, and the dirty limit stays out of the way.
        let tunables = Tunables::with([("txg.timeout_ms", "100000")]).unwrap();
        let options = FileDeviceOptions { create_len_bytes: Some(96 << 20), ..Default::default() };
        let path = dir.path().join("leaf");
        let leaf = LeafSpec {
            path: path.display().to_string(),
            device: Arc::new(FileDevice::open(&path, &options).unwrap()),
        };
        let spec = PoolSpec { name: "shrink".into(), ashift: 12, top: vec![TopSpec::Leaf(leaf)] };
        let pool = Pool::create(&env, spec, &tunables).await.unwrap();
        let store = Arc::new(Store::create(pool, &tunables));
        store.create_volume("v", FULL, 16 << 10).unwrap();
        store.sync().await.unwrap();
        let data = Arc::new(vec![0x5au8; WRITE as usize]);
        for round in 0..ROUNDS {
            let stop = Arc::new(AtomicBool::new(false));
            let writers: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let (store, stop, data) =
                        (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&data));
                    tokio::spawn(async move {
                        let mut i = w;
                        while !stop.load(Ordering::Relaxed) {
                            // Writes past the end once the shrink is done are refused; that is
                            // expected and not what this test is about.
                            let offset = SHRUNK + (i * WRITE) % (FULL - SHRUNK);
                            let _ = store.write("v", offset, &data).await;
                            i += WRITERS;
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            tokio::task::yield_now().await;
            store.resize_volume("v", SHRUNK).await.unwrap();
            stop.store(true, Ordering::Relaxed);
            for writer in writers {
                writer.await.unwrap();
            }
            store.sync().await.unwrap();
            let report = store.audit().await.unwrap();
            assert!(report.is_clean(), "round {round}: {:?}", report.problems);
            store.resize_volume("v", FULL).await.unwrap();
            // What was past the end before the shrink is gone: the grown tail reads as zeros.
            let tail = store.read("v", SHRUNK, FULL - SHRUNK).await.unwrap();
            assert!(tail.iter().all(|&b| b == 0), "round {round}: old data reappeared");
            store.sync().await.unwrap();
        }
    });
}
