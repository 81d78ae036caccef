//! The store on the production runtime, with real threads: many writers with FUA writes and
//! flushes, partial-block writes into shared blocks, and the txg syncer running every few
//! milliseconds, all at once on a multi-threaded tokio runtime over file leaves. The simulator
//! runs one task at a time and cannot find lock-order deadlocks or lost read-modify-write
//! updates between threads; this test can (it found a deadlock between a write's free-space
//! check and the sync). Every writer owns 2 KiB halves of shared 4 KiB blocks, so concurrent
//! partial writes to one block must all land. A watchdog fails the test instead of hanging.

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::device::{FileDevice, FileDeviceOptions};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_engine::volume::Volume;

const WRITERS: u64 = 16;
const ROUNDS: u64 = 150;
const HALF: u64 = 2048;

fn pattern(writer: u64, round: u64) -> Vec<u8> {
    (0..HALF).map(|i| (writer * 31 + round * 7 + i) as u8).collect()
}

#[test]
fn writers_and_syncer_on_threads() {
    let dir = tempfile::tempdir().unwrap();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    runtime.block_on(async {
        let env = sluice_host::tokio_env(7);
        let tunables = Tunables::with([("txg.timeout_ms", "3")]).unwrap();
        let options = FileDeviceOptions { create_len_bytes: Some(64 << 20), ..Default::default() };
        let leaves = (0..2)
            .map(|i| {
                let path = dir.path().join(format!("leg{i}"));
                LeafSpec {
                    path: path.display().to_string(),
                    device: Arc::new(FileDevice::open(&path, &options).unwrap()),
                }
            })
            .collect();
        let spec =
            PoolSpec { name: "threads".into(), ashift: 12, top: vec![TopSpec::Mirror(leaves)] };
        let pool = Pool::create(&env, spec, &tunables).await.unwrap();
        let store = Arc::new(Store::create(pool, &tunables));
        store.create_volume("v", 16 << 20, 4096).unwrap();
        store.sync().await.unwrap();
        store.run_syncer();
        let volume = Volume::open(&store, "v").unwrap();
        let work = async {
            let tasks: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let volume = volume.clone();
                    tokio::spawn(async move {
                        // Writer w owns half (w % 2) of blocks w/2*8 .. w/2*8+8: two writers
                        // share every block.
                        for round in 0..ROUNDS {
                            let block = (w / 2) * 8 + round % 8;
                            let offset = block * 4096 + (w % 2) * HALF;
                            let fua = round % 3 == 0;
                            volume.write(offset, &pattern(w, round), fua).await.unwrap();
                            if round % 5 == 0 {
                                volume.flush().await.unwrap();
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
        };
        // A deadlock blocks the runtime's threads, and with them its timers: the watchdog is a
        // thread of its own.
        let (done, finished) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if finished.recv_timeout(Duration::from_secs(120)).is_err() {
                eprintln!(
                    "writers did not finish in 120 s: a deadlock between writers and the syncer"
                );
                std::process::abort();
            }
        });
        work.await;
        let _ = done.send(());
        // The last round of each writer in each of its blocks is what must be there.
        for w in 0..WRITERS {
            for slot in 0..8 {
                let round = (ROUNDS - 1) - ((ROUNDS - 1 - slot) % 8);
                let block = (w / 2) * 8 + round % 8;
                let offset = block * 4096 + (w % 2) * HALF;
                let data = volume.read(offset, HALF).await.unwrap();
                assert_eq!(data, pattern(w, round), "writer {w} block {block}: an update was lost");
            }
        }
        store.sync().await.unwrap();
    });
}
