//! The fuzz harness for the NBD handshake and request parser: one client session, whose bytes
//! are the fuzzer's input, against a real store on instant simulated disks. Shared by the
//! cargo-fuzz target (fuzz_targets/nbd_session.rs, nightly) and the stable smoke test that
//! replays the corpus (crates/nbd/tests/fuzz_corpus.rs). A panic anywhere is a failure; so is
//! a session that does not end once the client's input does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_engine::volume::Volume;
use sluice_nbd::Exports;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Fixture {
    runtime: tokio::runtime::Runtime,
    store: Arc<Store>,
}

struct StoreExports(Arc<Store>);

impl Exports for StoreExports {
    fn names(&self) -> Vec<String> {
        self.0.volumes().into_iter().map(|v| v.name).collect()
    }

    fn open(&self, name: &str) -> Option<Volume> {
        let name = if name.is_empty() { "vol0" } else { name };
        Volume::open(&self.0, name).ok()
    }
}

/// Set by any panic in the process, including one the server caught in a request task (it
/// answers EIO, but it is still a bug the fuzzer must report).
static PANICKED: AtomicBool = AtomicBool::new(false);

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            default_hook(info);
        }));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("fuzz runtime");
        let store = runtime.block_on(async {
            let env = sluice_host::tokio_env(1);
            let leaves = (0..2)
                .map(|i| {
                    let device = SimDevice::new(
                        &env,
                        &format!("fuzz{i}"),
                        SimProfile::Instant,
                        64 << 20,
                        SimOptions::default(),
                    );
                    LeafSpec { path: format!("fuzz{i}"), device: Arc::new(device) }
                })
                .collect();
            let tunables = Tunables::default();
            let spec =
                PoolSpec { name: "fuzz".into(), ashift: 12, top: vec![TopSpec::Mirror(leaves)] };
            let pool = Pool::create(&env, spec, &tunables).await.expect("fuzz pool");
            let store = Arc::new(Store::create(pool, &tunables));
            store.create_volume("vol0", 16 << 20, 4096).expect("fuzz volume");
            store.sync().await.expect("fuzz sync");
            store
        });
        Fixture { runtime, store }
    })
}

/// Plays `input` as everything a client sends, then hangs up; returns what the server sent.
pub fn run(input: &[u8]) -> Vec<u8> {
    let fixture = fixture();
    let exports: Arc<dyn Exports> = Arc::new(StoreExports(Arc::clone(&fixture.store)));
    fixture.runtime.block_on(async move {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (_stop, shutdown) = tokio::sync::watch::channel(false);
        let session = tokio::spawn(sluice_nbd::serve_connection(server, exports, shutdown));
        let (mut from_server, mut to_server) = tokio::io::split(client);
        let input = input.to_vec();
        let sender = tokio::spawn(async move {
            // The server may close first (bad magic); the rest of the input is then moot.
            let _ = to_server.write_all(&input).await;
            let _ = to_server.shutdown().await;
        });
        let mut output = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), from_server.read_to_end(&mut output));
        assert!(read.await.is_ok(), "the session did not end after the client hung up");
        let _ = sender.await;
        let ended = tokio::time::timeout(Duration::from_secs(10), session).await;
        match ended {
            Ok(Ok(_)) => {}
            Ok(Err(panic)) => std::panic::resume_unwind(panic.into_panic()),
            Err(_) => panic!("the connection task did not end"),
        }
        assert!(!PANICKED.load(Ordering::SeqCst), "a request task panicked (see above)");
        output
    })
}
