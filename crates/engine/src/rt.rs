//! Runtime seam: the only way engine code reaches time, task spawning and randomness.
//!
//! The engine is runtime-agnostic async Rust (docs/design.md, "Runtime model"). Production passes a tokio-backed
//! [`Env`] (crate `sluice-host`); the simulator passes one whose clock is virtual and whose
//! executor is single-threaded and deterministic (crate `sluice-sim`). Engine code never names a
//! runtime: it asks its `Env` for the time, sleeps through it, spawns through it and draws random
//! numbers from streams forked off the one seed it carries, so a simulated run is a pure function
//! of its seed.

use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A boxed future that may move between threads, as production executors require.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A point in time, in nanoseconds since the clock's epoch (process start or simulation start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    pub fn as_nanos(self) -> u64 {
        self.0
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self + duration`, saturating instead of wrapping at the end of time.
    #[must_use]
    pub fn plus(self, duration: Duration) -> Time {
        Time(self.0.saturating_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6}s", self.as_secs_f64())
    }
}

/// Source of time. `sleep_until` must complete no earlier than `deadline`.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Time;
    fn sleep_until(&self, deadline: Time) -> BoxFuture<()>;
}

/// Spawns a detached task. `name` names the module that owns the task (`vdev_io`, `sim_hdd`),
/// so traces and thread dumps say who is running.
pub trait Spawn: Send + Sync + 'static {
    fn spawn(&self, name: &'static str, task: BoxFuture<()>);
}

/// Everything the engine needs from the outside world, passed in at pool open.
#[derive(Clone)]
pub struct Env {
    clock: Arc<dyn Clock>,
    spawner: Arc<dyn Spawn>,
    seed: u64,
    /// Draws of [`Env::unique_rng`] so far, shared by clones.
    draws: Arc<AtomicU64>,
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env").field("now", &self.now()).field("seed", &self.seed).finish()
    }
}

impl Env {
    pub fn new(clock: Arc<dyn Clock>, spawner: Arc<dyn Spawn>, seed: u64) -> Env {
        Env { clock, spawner, seed, draws: Arc::new(AtomicU64::new(0)) }
    }

    pub fn now(&self) -> Time {
        self.clock.now()
    }

    pub fn sleep_until(&self, deadline: Time) -> BoxFuture<()> {
        self.clock.sleep_until(deadline)
    }

    pub fn sleep(&self, duration: Duration) -> BoxFuture<()> {
        self.clock.sleep_until(self.now().plus(duration))
    }

    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.spawner.spawn(name, Box::pin(task));
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// An independent random stream for the component called `stream`. Forking by name rather
    /// than by call order keeps one component's draws from shifting another's when code changes.
    /// The same name gives the same stream every time: use it for behaviour (latencies, fault
    /// odds), never for identities.
    pub fn rng(&self, stream: &str) -> Rng {
        Rng::new(mix_seed(self.seed, stream))
    }

    /// A stream that no other call on this `Env` (or its clones) gets, for identities such as
    /// pool and vdev guids: two pools created with the same name must not share a guid, or a
    /// stale label of one could be taken for the other. Still a function of the seed and the
    /// order of calls, so simulations repeat.
    pub fn unique_rng(&self, stream: &str) -> Rng {
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        Rng::new(mix_seed(self.seed ^ splitmix64(draw), stream))
    }
}

/// Derives a child seed from a parent seed and a name (FNV-1a over the name, then splitmix64).
pub fn mix_seed(seed: u64, name: &str) -> u64 {
    let mut hasher = Fnv1a::default();
    name.hash(&mut hasher);
    splitmix64(seed ^ hasher.finish())
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small, stable, seedable hasher. `std`'s `DefaultHasher` makes no promise that its output
/// stays the same across Rust releases, and seeds and trace hashes must.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
}

/// A seeded pseudo-random stream (wyrand, through `fastrand`): fast, and the same sequence for
/// the same seed on every platform, which is all the simulator and the fault injector need.
#[derive(Clone, Debug)]
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    pub fn u64(&mut self) -> u64 {
        self.0.u64(..)
    }

    /// Uniform in `0..bound`; `bound` must be positive.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "Rng::below needs a positive bound");
        self.0.u64(..bound)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.0.f64()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.f64() < p
    }

    /// A new independent stream, derived from this one.
    pub fn fork(&mut self) -> Rng {
        Rng::new(splitmix64(self.0.u64(..)))
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        self.0.shuffle(items);
    }
}

/// Returns after letting every task that is ready now run first: wakes itself and is pending
/// once. Both runtimes queue a woken task behind those already ready (the simulator in FIFO
/// order, tokio's local queue likewise), so this is a yield on either side of the seam.
pub fn yield_now() -> impl Future<Output = ()> {
    struct YieldNow(bool);
    impl Future for YieldNow {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
            if self.0 {
                return std::task::Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
    YieldNow(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Named streams are stable and independent of each other.
    #[test]
    fn named_streams_are_stable() {
        let a1 = Rng::new(mix_seed(7, "hdd")).u64();
        let a2 = Rng::new(mix_seed(7, "hdd")).u64();
        let b = Rng::new(mix_seed(7, "ssd")).u64();
        assert_eq!(a1, a2);
        assert_ne!(a1, b);
    }

    /// Identities drawn from one Env never repeat, even for the same stream name.
    #[test]
    fn unique_streams_differ() {
        struct NoClock;
        impl Clock for NoClock {
            fn now(&self) -> Time {
                Time::ZERO
            }
            fn sleep_until(&self, _: Time) -> BoxFuture<()> {
                Box::pin(async {})
            }
        }
        struct NoSpawn;
        impl Spawn for NoSpawn {
            fn spawn(&self, _: &'static str, _: BoxFuture<()>) {}
        }
        let env = Env::new(Arc::new(NoClock), Arc::new(NoSpawn), 3);
        let a = env.unique_rng("pool_create/tank").u64();
        let b = env.clone().unique_rng("pool_create/tank").u64();
        assert_ne!(a, b);
        assert_eq!(env.rng("x").u64(), env.rng("x").u64());
    }

    #[test]
    fn time_arithmetic_saturates() {
        let t = Time(u64::MAX - 1).plus(Duration::from_secs(1));
        assert_eq!(t, Time(u64::MAX));
        assert_eq!(Time(5).since(Time(9)), Duration::ZERO);
    }
}
