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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

    /// The wall-clock time in nanoseconds since the Unix epoch (UTC), for what a person reads
    /// (an event's time); intervals are measured with [`Clock::now`]. By default the clock's
    /// own time from [`SIMULATED_EPOCH_UNIX_NANOS`], so that a simulated run stamps the same
    /// times on every run; a host clock gives the system's.
    fn unix_nanos(&self) -> u64 {
        SIMULATED_EPOCH_UNIX_NANOS.saturating_add(self.now().as_nanos())
    }
}

/// Where a clock without a wall clock of its own starts: 2026-01-01T00:00:00Z.
pub const SIMULATED_EPOCH_UNIX_NANOS: u64 = 1_767_225_600 * 1_000_000_000;

/// Spawns a detached task. `name` names the module that owns the task (`vdev_io`, `sim_hdd`),
/// so traces and thread dumps say who is running.
pub trait Spawn: Send + Sync + 'static {
    fn spawn(&self, name: &'static str, task: BoxFuture<()>);

    /// Spawns `task` on a thread other than the caller's where the host has one, for work that
    /// would otherwise all fall on the caller's core while it has other work to do: CPU alone
    /// (compression, checksums; ZFS hands the same work to its write-issue taskqs), or an early
    /// log fill while the caller receives the rest of its write (its device writes then go
    /// through the other thread's ring). Hosts with one thread run it as [`Spawn::spawn`] does.
    fn spawn_elsewhere(&self, name: &'static str, task: BoxFuture<()>) {
        self.spawn(name, task);
    }

    /// How many threads [`Spawn::spawn_elsewhere`] and the caller's own together spread work
    /// over; 1 where it is [`Spawn::spawn`].
    fn parallelism(&self) -> usize {
        1
    }

    /// Whether a task shares its thread with tasks that answer clients (a serving core's
    /// loop), so that long work should let them run now and then ([`Env::pause`]). The
    /// simulator says no: its tasks' turns are its schedule, and pauses would add turns that
    /// its seeds do not choose.
    fn shares_thread(&self) -> bool {
        false
    }

    /// A turn for the thread's other tasks ([`Env::pause`]). The default, [`yield_now`], lets
    /// only tasks already woken run; a spawner whose [`Spawn::shares_thread`] is true must let
    /// its loop look for I/O first, and run what that wakes: on tokio's current-thread loop a
    /// task merely woken again goes back in the run queue, which the loop works through for up
    /// to a few dozen turns before it polls its sockets and ring, so connections waiting for
    /// bytes or completions would not run meanwhile.
    fn yield_now(&self) -> BoxFuture<()> {
        Box::pin(yield_now())
    }
}

/// Nanoseconds of the clock since the thread's last pause after which [`Env::pause`] lets the
/// others run.
pub const PAUSE_AFTER_NANOS: u64 = 500_000;

thread_local! {
    /// Which clock (its address) the thread's last pause read, and when, by that clock: the
    /// time of a pause is compared only with times of the same clock.
    static LAST_PAUSE: std::cell::Cell<Option<(usize, Time)>> =
        const { std::cell::Cell::new(None) };

    /// A moving mean of the bytes of the reads and writes a frontend served on this thread,
    /// each request weighing an eighth.
    static REQUEST_BYTES_MEAN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Records that a frontend serves a client's read or write of `bytes` on this thread, for
/// the runtime's use (a serving core's idle polling skips its poll while they are large).
/// Only reads and writes: a trim's or zeroing's length moves no data, and one of gigabytes
/// would hold the mean high for hundreds of requests.
pub fn note_request(bytes: u32) {
    REQUEST_BYTES_MEAN.with(|mean| {
        let known = mean.get();
        mean.set(known - known / 8 + u64::from(bytes) / 8);
    });
}

/// The moving mean of the bytes of the reads and writes served on this thread
/// ([`note_request`]): a run of requests of one size moves it three quarters of the way to
/// that size in eleven requests.
pub fn request_bytes_mean() -> u64 {
    REQUEST_BYTES_MEAN.with(std::cell::Cell::get)
}

/// The memory this process may use, for sizing the block cache and, through
/// [`Env::with_memory_bytes`], the dirty data a txg may hold: the machine's physical memory,
/// or its control group's limit where that is lower (a container's server must not size
/// its caches by the host); `None` if the OS will not say.
pub fn machine_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page_bytes) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGE_SIZE)) };
    let pages = u64::try_from(pages).ok()?;
    let page_bytes = u64::try_from(page_bytes).ok()?;
    let physical = pages.checked_mul(page_bytes)?;
    Some(cgroup_memory_limit().map_or(physical, |limit| limit.min(physical)))
}

/// The memory limit of this process's control group: the lowest of cgroup v2's `memory.max`
/// along its path (a limit set on a parent slice binds too), else v1's
/// `memory.limit_in_bytes`; in a container whose own cgroup is mounted at the root the path
/// in `/proc/self/cgroup` does not exist there, so the root's files are read too. `None`
/// when there is none ("max", or v1's huge placeholder, which the `min` with physical memory
/// absorbs).
fn cgroup_memory_limit() -> Option<u64> {
    let read = |path: &str| -> Option<u64> {
        std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok()
    };
    let groups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut limits = Vec::new();
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            // v2: this group and every parent up to the root.
            let mut at = path.trim_end_matches('/');
            loop {
                limits.extend(read(&format!("/sys/fs/cgroup{at}/memory.max")));
                let Some(cut) = at.rfind('/') else { break };
                at = &at[..cut];
            }
            limits.extend(read("/sys/fs/cgroup/memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            let path = path.trim_end_matches('/');
            limits.extend(read(&format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")));
            limits.extend(read("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
        }
    }
    limits.into_iter().min()
}

/// Everything the engine needs from the outside world, passed in at pool open.
#[derive(Clone)]
pub struct Env {
    clock: Arc<dyn Clock>,
    spawner: Arc<dyn Spawn>,
    seed: u64,
    /// Draws of [`Env::unique_rng`] so far, shared by clones.
    draws: Arc<AtomicU64>,
    /// The memory the process may use, where the host says (see [`Env::memory_bytes`] and
    /// [`machine_memory_bytes`]).
    memory_bytes: Option<u64>,
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env").field("now", &self.now()).field("seed", &self.seed).finish()
    }
}

impl Env {
    pub fn new(clock: Arc<dyn Clock>, spawner: Arc<dyn Spawn>, seed: u64) -> Env {
        Env { clock, spawner, seed, draws: Arc::new(AtomicU64::new(0)), memory_bytes: None }
    }

    /// The same environment, spawning through what `wrap` makes of its spawner (a test's
    /// spawner that runs work elsewhere on threads of its own, around the simulator's).
    #[must_use]
    pub fn with_spawner(self, wrap: impl FnOnce(Arc<dyn Spawn>) -> Arc<dyn Spawn>) -> Env {
        Env { spawner: wrap(self.spawner), ..self }
    }

    /// The same environment, saying the machine has `bytes` of memory.
    #[must_use]
    pub fn with_memory_bytes(self, bytes: Option<u64>) -> Env {
        Env { memory_bytes: bytes, ..self }
    }

    /// The machine's memory, for tunables whose `auto` scales with it (`txg.dirty_max`).
    /// `None` unless the host set it: the simulator does not, so a simulated run is the same
    /// on every machine.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory_bytes
    }

    pub fn now(&self) -> Time {
        self.clock.now()
    }

    /// A point where long work (a txg sync's tree update, its blocks' bookkeeping) lets the
    /// other tasks of its thread run, once [`PAUSE_AFTER_NANOS`] have passed since the last
    /// pause there: the serving cores run the sync beside connections, and a current-thread
    /// loop runs a task until it waits. The time is the clock's, so waits and other tasks'
    /// turns since that pause count too, and the first call after an idle spell yields at
    /// once (a turn of the loop, a few microseconds). The thread's first call, or the first
    /// after another clock's, only starts a stretch; so does a time before the last one (a
    /// new clock at an old one's address). Nothing where the thread is the task's own
    /// ([`Spawn::shares_thread`]).
    pub async fn pause(&self) {
        if !self.spawner.shares_thread() {
            return;
        }
        let clock = Arc::as_ptr(&self.clock).cast::<()>() as usize;
        let now = self.now();
        let due = LAST_PAUSE.with(|last| match last.get() {
            Some((at_clock, at)) if at_clock == clock && now >= at => {
                now.0 - at.0 >= PAUSE_AFTER_NANOS
            }
            _ => {
                last.set(Some((clock, now)));
                false
            }
        });
        if due {
            self.spawner.yield_now().await;
            LAST_PAUSE.with(|last| last.set(Some((clock, self.now()))));
        }
    }

    /// [`Clock::unix_nanos`]: the wall-clock time, UTC.
    pub fn unix_nanos(&self) -> u64 {
        self.clock.unix_nanos()
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

    /// [`Spawn::spawn_elsewhere`]: CPU-bound work for another thread where the host has one.
    pub fn spawn_elsewhere(
        &self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawner.spawn_elsewhere(name, Box::pin(task));
    }

    /// [`Spawn::parallelism`]: 1 where everything runs on one thread (the simulator).
    pub fn parallelism(&self) -> usize {
        self.spawner.parallelism()
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// `f` applied to each of `items`, in order, spread over the host's threads. For CPU-bound
    /// work on a core that would otherwise do all of it, as the committer of a large write
    /// does (txg/zil_commit.rs; ZFS hands the same work to its write-issue taskqs). Tasks on the other
    /// threads ([`Spawn::spawn_elsewhere`]) and the caller take items one at a time until none
    /// is left, so a thread that is busy elsewhere takes fewer and the answer never waits on
    /// a task that has not started (or a runtime that no longer runs): whatever such a task
    /// would have taken, the caller takes. The caller first lets its own core's ready tasks
    /// run, which gives the other threads a head start on a core that is itself the busy one.
    /// With one thread, or one item, everything runs here, in order, with no yield: the
    /// simulator's runs are unchanged.
    pub async fn map_spread<T, R, F>(&self, name: &'static str, items: Vec<T>, f: F) -> Vec<R>
    where
        T: Send + Sync + 'static,
        R: Send + 'static,
        F: Fn(&T) -> R + Copy + Send + Sync + 'static,
    {
        let helpers = self.spawner.parallelism().min(items.len()).saturating_sub(1);
        if helpers == 0 {
            return items.iter().map(f).collect();
        }
        let (all_done, done) = futures::channel::oneshot::channel();
        let spread = Arc::new(Spread {
            slots: items.iter().map(|_| std::sync::Mutex::new(None)).collect(),
            items,
            next: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            all_done: std::sync::Mutex::new(Some(all_done)),
        });
        for _ in 0..helpers {
            let spread = Arc::clone(&spread);
            self.spawner.spawn_elsewhere(name, Box::pin(async move { spread.take_items(f) }));
        }
        yield_now().await;
        spread.take_items(f);
        // Items other threads took are finished, or their task ended early (it panicked)
        // and left its item empty, which the caller then computes.
        let _ = done.await;
        let Spread { items, slots, .. } = &*spread;
        items
            .iter()
            .zip(slots)
            .map(|(item, slot)| {
                slot.lock().ok().and_then(|mut r| r.take()).unwrap_or_else(|| f(item))
            })
            .collect()
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

/// The items of one [`Env::map_spread`], shared by the threads that take them.
struct Spread<T, R> {
    items: Vec<T>,
    /// Each item's answer, once its taker has it.
    slots: Vec<std::sync::Mutex<Option<R>>>,
    /// The next item to take.
    next: AtomicUsize,
    /// Items whose taker is done with them (answered, or unwound).
    finished: AtomicUsize,
    /// Told when the last item is finished.
    all_done: std::sync::Mutex<Option<futures::channel::oneshot::Sender<()>>>,
}

impl<T, R> Spread<T, R> {
    /// Takes and answers items until none is left.
    fn take_items(&self, f: impl Fn(&T) -> R) {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = self.items.get(index) else { return };
            // Counts the item finished even if `f` unwinds, so the caller is not left waiting.
            let _finish = Finish(self);
            let answer = f(item);
            if let Ok(mut slot) = self.slots[index].lock() {
                *slot = Some(answer);
            }
        }
    }
}

/// Marks one item of a [`Spread`] finished when dropped; the last one tells the caller.
struct Finish<'a, T, R>(&'a Spread<T, R>);

impl<T, R> Drop for Finish<'_, T, R> {
    fn drop(&mut self) {
        let spread = self.0;
        if spread.finished.fetch_add(1, Ordering::AcqRel) + 1 == spread.items.len() {
            if let Some(all_done) = spread.all_done.lock().ok().and_then(|mut d| d.take()) {
                let _ = all_done.send(());
            }
        }
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
/// order, tokio's local queue likewise), so this is a yield on either side of the seam, but
/// on tokio's loop not one past its look at sockets and rings ([`Spawn::yield_now`] is).
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

    struct NoClock;
    impl Clock for NoClock {
        fn now(&self) -> Time {
            Time::ZERO
        }
        fn sleep_until(&self, _: Time) -> BoxFuture<()> {
            Box::pin(async {})
        }
    }

    /// Drops every task it is given.
    struct NoSpawn;
    impl Spawn for NoSpawn {
        fn spawn(&self, _: &'static str, _: BoxFuture<()>) {}
    }

    /// A clock that stands still until the test moves it.
    struct SetClock(AtomicU64);
    impl Clock for SetClock {
        fn now(&self) -> Time {
            Time(self.0.load(Ordering::Relaxed))
        }
        fn sleep_until(&self, _: Time) -> BoxFuture<()> {
            Box::pin(async {})
        }
    }

    /// A serving core's spawner, as far as pauses go.
    struct Shared(bool);
    impl Spawn for Shared {
        fn spawn(&self, _: &'static str, _: BoxFuture<()>) {}
        fn shares_thread(&self) -> bool {
            self.0
        }
    }

    /// On a shared thread a pause yields once [`PAUSE_AFTER_NANOS`] have passed since the last
    /// one there, and only then; elsewhere it never does.
    #[test]
    fn pauses_yield_only_after_a_stretch_on_a_shared_thread() {
        // Its own thread: the last pause is the thread's.
        std::thread::spawn(|| {
            let clock = Arc::new(SetClock(AtomicU64::new(1_000_000)));
            let shared = Env::new(clock.clone(), Arc::new(Shared(true)), 1);
            let alone = Env::new(clock.clone(), Arc::new(Shared(false)), 1);
            // How many times a pause was pending before it returned.
            let yields = |env: &Env| {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                let mut pause = std::pin::pin!(env.pause());
                let mut pending = 0;
                while pause.as_mut().poll(&mut cx).is_pending() {
                    pending += 1;
                }
                pending
            };
            let advance = |by: u64| clock.0.fetch_add(by, Ordering::Relaxed);
            assert_eq!(yields(&shared), 0, "the first pause starts the stretch");
            advance(PAUSE_AFTER_NANOS - 1);
            assert_eq!(yields(&shared), 0);
            advance(1);
            assert_eq!(yields(&shared), 1);
            assert_eq!(yields(&shared), 0, "the yield began a new stretch");
            advance(10 * PAUSE_AFTER_NANOS);
            assert_eq!(yields(&alone), 0, "a thread of its own never pauses");
            assert_eq!(yields(&shared), 1);
            // Another clock's time is not compared with this one's: it starts a stretch.
            let other = Env::new(Arc::new(SetClock(AtomicU64::new(0))), Arc::new(Shared(true)), 1);
            assert_eq!(yields(&other), 0);
            advance(PAUSE_AFTER_NANOS);
            assert_eq!(yields(&shared), 0, "the other clock's pause began a stretch");
            // A time before the last pause's (a new clock where an old one was) starts one too.
            clock.0.store(0, Ordering::Relaxed);
            assert_eq!(yields(&shared), 0);
            advance(PAUSE_AFTER_NANOS);
            assert_eq!(yields(&shared), 1);
        })
        .join()
        .unwrap();
    }

    /// What [`Threads`] does with a task spawned elsewhere.
    #[derive(Clone, Copy, Debug)]
    enum Elsewhere {
        /// Runs it to the end on a thread of its own before returning.
        Ran,
        /// Keeps it, unrun (a core whose loop is busy or stopped).
        Queued,
        /// Drops it unrun (a runtime shutting down).
        Dropped,
    }

    struct Threads {
        parallelism: usize,
        elsewhere: Elsewhere,
        queued: std::sync::Mutex<Vec<BoxFuture<()>>>,
    }
    impl Spawn for Threads {
        fn spawn(&self, _: &'static str, _: BoxFuture<()>) {
            unreachable!("map_spread spawns elsewhere only");
        }
        fn spawn_elsewhere(&self, _: &'static str, task: BoxFuture<()>) {
            match self.elsewhere {
                Elsewhere::Ran => {
                    // A task that panics has unwound by the time join returns.
                    let _ = std::thread::spawn(move || futures::executor::block_on(task)).join();
                }
                Elsewhere::Queued => self.queued.lock().unwrap().push(task),
                Elsewhere::Dropped => drop(task),
            }
        }
        fn parallelism(&self) -> usize {
            self.parallelism
        }
    }

    /// map_spread answers in order whatever the number of threads and items; items another
    /// thread took are its, and the caller takes what no other thread started on (a task that
    /// starts after that takes nothing).
    #[test]
    fn map_spread_answers_in_order_and_spreads() {
        let here = std::thread::current().id();
        for elsewhere in [Elsewhere::Ran, Elsewhere::Queued, Elsewhere::Dropped] {
            for parallelism in 1..=4 {
                let queued = std::sync::Mutex::new(Vec::new());
                let threads = Arc::new(Threads { parallelism, elsewhere, queued });
                let env = Env::new(Arc::new(NoClock), threads.clone(), 1);
                for len in [0u64, 1, 2, 7, 64] {
                    let items: Vec<u64> = (0..len).collect();
                    let square = |i: &u64| (i * i, std::thread::current().id());
                    let out = futures::executor::block_on(env.map_spread("test", items, square));
                    let squares: Vec<u64> = out.iter().map(|o| o.0).collect();
                    assert_eq!(squares, (0..len).map(|i| i * i).collect::<Vec<_>>());
                    let away = out.iter().filter(|o| o.1 != here).count();
                    let case = format!("{elsewhere:?}, parallelism {parallelism}, {len} items");
                    match elsewhere {
                        // The first task ran before the caller looked, and took every item.
                        Elsewhere::Ran if parallelism > 1 && len > 1 => {
                            assert_eq!(away, len as usize, "{case}")
                        }
                        _ => assert_eq!(away, 0, "{case}"),
                    }
                    // Tasks that start late find their shares taken and answer nothing.
                    let late: Vec<BoxFuture<()>> =
                        threads.queued.lock().unwrap().drain(..).collect();
                    for task in late {
                        futures::executor::block_on(task);
                    }
                }
            }
        }
    }

    /// An item whose taker unwound is computed by the caller, which is not left waiting.
    #[test]
    fn map_spread_survives_a_taker_that_panics() {
        let here = std::thread::current().id();
        let queued = std::sync::Mutex::new(Vec::new());
        let threads = Arc::new(Threads { parallelism: 2, elsewhere: Elsewhere::Ran, queued });
        let env = Env::new(Arc::new(NoClock), threads, 1);
        // Elsewhere, the first item taken panics (the thread's own hook prints it).
        let square = move |i: &u64| {
            assert!(std::thread::current().id() == here, "a taker elsewhere fails");
            i * i
        };
        let out = futures::executor::block_on(env.map_spread("test", (0..5).collect(), square));
        assert_eq!(out, [0, 1, 4, 9, 16]);
    }

    /// Identities drawn from one Env never repeat, even for the same stream name.
    #[test]
    fn unique_streams_differ() {
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
