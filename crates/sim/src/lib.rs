//! Deterministic simulation: a single-threaded executor with a virtual clock (docs/design.md, "Runtime model").
//!
//! The engine runs unchanged on top of it: [`Sim::env`] hands out an [`Env`] whose `Clock` is
//! virtual and whose `Spawn` queues tasks here. Time only moves when every task is waiting: the
//! executor then jumps to the earliest timer. Ready tasks run in FIFO order of wake-up, timers
//! with equal deadlines fire in registration order, and no thread or wall clock is consulted,
//! so one seed reproduces a run bit for bit. Each poll folds (virtual time, task id) into an
//! event-trace hash; two runs of the same seed must give the same hash.
//!
//! A simulated minute of eight HDDs costs milliseconds, which is what lets the seed experiments
//! (up to 1024 writers) run in CI-sized time.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::hash::Hasher;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;
use sluice_engine::rt::{BoxFuture, Clock, Env, Fnv1a, Spawn, Time};

type TaskId = u64;

#[derive(Default)]
struct Shared {
    now: Time,
    /// Timers by (deadline, registration sequence): equal deadlines fire in the order set.
    timers: BTreeMap<(Time, u64), Waker>,
    timer_seq: u64,
    ready: VecDeque<TaskId>,
    queued: std::collections::HashSet<TaskId>,
    spawned: Vec<(TaskId, &'static str, BoxFuture<()>)>,
    next_task: TaskId,
}

/// The simulator. Cheap to clone; clones drive the same world.
#[derive(Clone)]
pub struct Sim {
    shared: Arc<Mutex<Shared>>,
    seed: u64,
    /// One environment for the whole world: clones share its identity counter, so guids drawn
    /// through any of them never repeat.
    env: Env,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim").field("seed", &self.seed).field("now", &self.now()).finish()
    }
}

/// Why a simulation stopped without finishing its main task.
#[derive(Debug, PartialEq, Eq)]
pub enum SimError {
    /// Nothing is ready and no timer is set, yet the main task has not finished.
    Deadlock { at: Time },
    /// Virtual time reached the limit given to [`Sim::run_until`].
    TimeLimit { at: Time },
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Deadlock { at } => write!(f, "simulation deadlocked at {at}"),
            SimError::TimeLimit { at } => write!(f, "simulation hit its time limit at {at}"),
        }
    }
}

impl std::error::Error for SimError {}

/// Counters of one finished run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimReport {
    pub trace_hash: u64,
    pub polls: u64,
    pub end: Time,
}

struct TaskWaker {
    id: TaskId,
    shared: Arc<Mutex<Shared>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut shared = self.shared.lock();
        if shared.queued.insert(self.id) {
            shared.ready.push_back(self.id);
        }
    }
}

struct VirtualClock {
    shared: Arc<Mutex<Shared>>,
}

struct Sleep {
    shared: Arc<Mutex<Shared>>,
    deadline: Time,
    registered: Option<(Time, u64)>,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut shared = self.shared.lock();
        if shared.now >= self.deadline {
            return Poll::Ready(());
        }
        let key = match self.registered {
            Some(key) => key,
            None => {
                shared.timer_seq += 1;
                (self.deadline, shared.timer_seq)
            }
        };
        shared.timers.insert(key, cx.waker().clone());
        drop(shared);
        self.registered = Some(key);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.registered {
            self.shared.lock().timers.remove(&key);
        }
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Time {
        self.shared.lock().now
    }

    fn sleep_until(&self, deadline: Time) -> BoxFuture<()> {
        Box::pin(Sleep { shared: Arc::clone(&self.shared), deadline, registered: None })
    }
}

struct Spawner {
    shared: Arc<Mutex<Shared>>,
}

impl Spawn for Spawner {
    fn spawn(&self, name: &'static str, task: BoxFuture<()>) {
        let mut shared = self.shared.lock();
        let id = shared.next_task;
        shared.next_task += 1;
        shared.spawned.push((id, name, task));
        shared.queued.insert(id);
        shared.ready.push_back(id);
    }
}

impl Sim {
    pub fn new(seed: u64) -> Sim {
        let shared = Arc::new(Mutex::new(Shared { next_task: 1, ..Shared::default() }));
        let env = Env::new(
            Arc::new(VirtualClock { shared: Arc::clone(&shared) }),
            Arc::new(Spawner { shared: Arc::clone(&shared) }),
            seed,
        );
        Sim { shared, seed, env }
    }

    /// The engine's view of this simulated world.
    pub fn env(&self) -> Env {
        self.env.clone()
    }

    pub fn now(&self) -> Time {
        self.shared.lock().now
    }

    /// Runs `main` and every task it spawns until `main` finishes.
    pub fn run<T: 'static>(
        &self,
        main: impl Future<Output = T> + 'static,
    ) -> Result<(T, SimReport), SimError> {
        self.run_until(Time(u64::MAX), main)
    }

    /// As [`Sim::run`], failing if virtual time passes `limit` first. Spawned tasks still
    /// pending when `main` finishes stay queued for the next run on this `Sim`.
    pub fn run_until<T: 'static>(
        &self,
        limit: Time,
        main: impl Future<Output = T> + 'static,
    ) -> Result<(T, SimReport), SimError> {
        // The main task is not Send; it lives here, on this thread, under id 0.
        let mut main: Pin<Box<dyn Future<Output = T>>> = Box::pin(main);
        let mut tasks: HashMap<TaskId, (&'static str, BoxFuture<()>)> = HashMap::new();
        let mut hasher = Fnv1a::default();
        hasher.write_u64(self.seed);
        let mut polls = 0u64;
        {
            let mut shared = self.shared.lock();
            shared.queued.insert(0);
            shared.ready.push_front(0);
        }
        loop {
            let next = {
                let mut shared = self.shared.lock();
                for (id, name, task) in shared.spawned.drain(..) {
                    tasks.insert(id, (name, task));
                }
                match shared.ready.pop_front() {
                    Some(id) => {
                        shared.queued.remove(&id);
                        Some((id, shared.now))
                    }
                    None => None,
                }
            };
            let Some((id, now)) = next else {
                // Everyone waits: jump to the earliest timer and wake all due at that instant.
                let mut shared = self.shared.lock();
                let Some(&(deadline, _)) = shared.timers.keys().next() else {
                    return Err(SimError::Deadlock { at: shared.now });
                };
                if deadline > limit {
                    return Err(SimError::TimeLimit { at: shared.now });
                }
                assert!(deadline >= shared.now, "virtual time never goes backwards");
                shared.now = deadline;
                let due: Vec<(Time, u64)> =
                    shared.timers.range(..=(deadline, u64::MAX)).map(|(key, _)| *key).collect();
                let wakers: Vec<Waker> =
                    due.iter().filter_map(|key| shared.timers.remove(key)).collect();
                drop(shared);
                wakers.into_iter().for_each(Waker::wake);
                continue;
            };
            polls += 1;
            hasher.write_u64(now.as_nanos());
            hasher.write_u64(id);
            let waker = Waker::from(Arc::new(TaskWaker { id, shared: Arc::clone(&self.shared) }));
            let mut cx = Context::from_waker(&waker);
            if id == 0 {
                if let Poll::Ready(value) = main.as_mut().poll(&mut cx) {
                    let end = self.now();
                    // Leave the other tasks where they are: a later run continues them.
                    let mut shared = self.shared.lock();
                    for (id, (name, task)) in tasks {
                        shared.spawned.push((id, name, task));
                    }
                    shared.spawned.sort_by_key(|(id, _, _)| *id);
                    return Ok((value, SimReport { trace_hash: hasher.finish(), polls, end }));
                }
            } else if let Some((_, task)) = tasks.get_mut(&id) {
                if task.as_mut().poll(&mut cx).is_ready() {
                    tasks.remove(&id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Virtual time advances only through timers, and tasks interleave by deadline.
    #[test]
    fn timers_order_tasks() {
        let sim = Sim::new(1);
        let env = sim.env();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (l1, l2, e1, e2) = (Arc::clone(&log), Arc::clone(&log), env.clone(), env.clone());
        let ((), report) = sim
            .run(async move {
                env.spawn("a", async move {
                    e1.sleep(Duration::from_millis(5)).await;
                    l1.lock().push(("a", e1.now()));
                });
                env.spawn("b", async move {
                    e2.sleep(Duration::from_millis(2)).await;
                    l2.lock().push(("b", e2.now()));
                });
                env.sleep(Duration::from_millis(10)).await;
            })
            .unwrap();
        let log = log.lock().clone();
        assert_eq!(log, vec![("b", Time(2_000_000)), ("a", Time(5_000_000))]);
        assert_eq!(report.end, Time(10_000_000));
    }

    /// A main task that waits on nothing that can ever happen is reported, not hung.
    #[test]
    fn deadlock_is_reported() {
        let sim = Sim::new(1);
        let result = sim.run(futures::future::pending::<()>());
        assert_eq!(result.err(), Some(SimError::Deadlock { at: Time::ZERO }));
    }

    #[test]
    fn time_limit_is_reported() {
        let sim = Sim::new(1);
        let env = sim.env();
        let result =
            sim.run_until(Time(1000), async move { env.sleep(Duration::from_secs(1)).await });
        assert!(matches!(result, Err(SimError::TimeLimit { .. })));
    }
}
