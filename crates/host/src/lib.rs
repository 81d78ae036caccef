//! Production runtime glue: the engine's `Clock` and `Spawn` on tokio (docs/design.md, "Runtime model").
//!
//! Kept out of the engine so the engine never names a runtime; the simulator provides the
//! other implementation (crate `sluice-sim`). Disk I/O does not run here: `FileDevice` has its
//! own per-leaf I/O threads and only completes futures that these tasks await.

pub mod allocator;
mod cores;
mod idle_poll;

use std::sync::Arc;
use std::time::Instant;

pub use cores::Cores;

use sluice_engine::rt::{BoxFuture, Clock, Env, Spawn, Time};

/// Real time, measured from when the clock was made.
#[derive(Debug)]
pub struct TokioClock {
    epoch: Instant,
    epoch_tokio: tokio::time::Instant,
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock { epoch: Instant::now(), epoch_tokio: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn sleep_until(&self, deadline: Time) -> BoxFuture<()> {
        let at = self.epoch_tokio + std::time::Duration::from_nanos(deadline.as_nanos());
        // A serving core that polls before it sleeps must not hold its loop past this.
        idle_poll::note_deadline(at.into_std());
        Box::pin(tokio::time::sleep_until(at))
    }

    fn unix_nanos(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Spawns onto the tokio runtime the caller is inside.
#[derive(Debug)]
pub struct TokioSpawn {
    handle: tokio::runtime::Handle,
}

impl Spawn for TokioSpawn {
    fn spawn(&self, _name: &'static str, task: BoxFuture<()>) {
        drop(self.handle.spawn(task));
    }
}

/// An engine environment on the current tokio runtime. Must be called inside one.
pub fn tokio_env(seed: u64) -> Env {
    Env::new(
        Arc::new(TokioClock::default()),
        Arc::new(TokioSpawn { handle: tokio::runtime::Handle::current() }),
        seed,
    )
    .with_memory_bytes(sluice_engine::rt::machine_memory_bytes())
}

/// A multi-threaded tokio runtime with threads named after their job.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("sluice_rt").build()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The production clock sleeps in real time and spawned tasks run.
    #[test]
    fn real_clock_sleeps_and_spawns() {
        let runtime = runtime().unwrap();
        runtime.block_on(async {
            let env = tokio_env(1);
            let start = env.now();
            let (tx, rx) = tokio::sync::oneshot::channel();
            env.spawn("test", async move {
                let _ = tx.send(());
            });
            rx.await.unwrap();
            env.sleep(Duration::from_millis(20)).await;
            assert!(env.now().since(start) >= Duration::from_millis(20));
        });
    }
}
