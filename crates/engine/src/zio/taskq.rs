//! The write-issue taskq of a serving core (ZFS: the `z_wr_iss` threads, which run a write's
//! compress and checksum stages for the sync apart from the threads that issue and complete
//! its I/O).
//!
//! A txg sync keeps several spans of a volume's data in flight, and each span's CPU stages
//! (lz4 and xxh3, some 200 us per MiB) run on the sync's own core. Spawned as a task per span,
//! as they were, the spans' seals sat in the core's run queue in front of everything they
//! woke: a sealed span's write waited for the sync's task behind every other queued seal, and
//! then for the ring's submitter behind the seals queued meanwhile. The sync's writes reached
//! the disk in bursts, with the core half idle and the disk idle between them (a 1 MiB stream:
//! a span 1.85 ms from issue to return where the disk writes 1 MiB in 0.27 ms; 2026-11-30,
//! docs/bench/peers-notes.md).
//!
//! So a core seals its batches one at a time, in the order they came, in one task: the first
//! span is sealed first and goes to the disk while the next is sealed. The task yields after
//! every [`QUANTUM_BYTES`] of a batch, so the tasks that push writes, submit them and reap their
//! completions on this core wait for one quantum, not for whole spans. (The yield puts the task
//! back in the run queue; it does not make the runtime look at its I/O driver first, which it
//! does every so many polls. A completion can so wait a few quanta for its reaper.)
//!
//! A batch its caller stopped waiting for (the sync failed on another span) is skipped.
//! The queue is the thread's, and its task runs on the thread's runtime: a thread that ran two
//! executors in turn, one of them idle, would leave its batches behind the idle one's task
//! (the simulator runs one `Sim` per thread; a serving core, one runtime).

use std::collections::VecDeque;
use std::sync::Arc;

use futures::channel::oneshot;
use parking_lot::Mutex;

use super::{compress::RunHint, seal_stages, EarlyAbort, Pipeline, Sealed, ZioError};
use crate::device::AlignedBuf;
use crate::rt::Env;
use crate::zio::BlockProps;

/// Logical bytes the taskq seals between two yields: one stage's pass over them, at most
/// about 12 us (lz4 and xxh3 together take some 200 us per MiB).
const QUANTUM_BYTES: usize = 64 << 10;

type Answer = oneshot::Sender<Result<Vec<Sealed>, ZioError>>;

/// One batch waiting for the taskq.
struct Job {
    pipeline: Arc<Pipeline>,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    unit: u64,
    /// The volume's early-abort hint, where the batch is one volume's data.
    hint: Option<Arc<RunHint>>,
    answer: Answer,
}

/// A thread's batches, and whether a task works through them.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    working: bool,
}

thread_local! {
    /// Shared with the worker, which may run elsewhere on a runtime that moves tasks: it
    /// serves the queue it was started for, wherever it runs.
    static QUEUE: Arc<Mutex<Queue>> = Arc::default();
}

/// Seals `blocks` in this thread's taskq, after the batches queued before them. `None` when
/// the taskq's task ended without an answer (a runtime shutting down, or one that drops what
/// it is given): the caller then seals them itself.
pub(super) async fn seal(
    env: &Env,
    pipeline: &Arc<Pipeline>,
    blocks: Vec<(BlockProps, Arc<AlignedBuf>)>,
    unit: u64,
    hint: Option<Arc<RunHint>>,
) -> Option<Result<Vec<Sealed>, ZioError>> {
    let (answer, answered) = oneshot::channel();
    let queue = QUEUE.with(Arc::clone);
    let start = {
        let mut queue = queue.lock();
        queue.jobs.push_back(Job { pipeline: Arc::clone(pipeline), blocks, unit, hint, answer });
        !std::mem::replace(&mut queue.working, true)
    };
    if start {
        let worker = Worker { queue, finished: false };
        env.spawn("zio_taskq", worker.run());
    }
    answered.await.ok()
}

/// The task that works through one thread's queue until it is empty.
struct Worker {
    queue: Arc<Mutex<Queue>>,
    finished: bool,
}

impl Worker {
    async fn run(mut self) {
        loop {
            let job = {
                let mut queue = self.queue.lock();
                match queue.jobs.pop_front() {
                    Some(job) => job,
                    None => {
                        // Under the lock a batch queued later finds no worker, and starts one.
                        queue.working = false;
                        self.finished = true;
                        return;
                    }
                }
            };
            if job.answer.is_canceled() {
                continue;
            }
            let early_abort = EarlyAbort::Hint(job.hint);
            let quantum = Some(QUANTUM_BYTES);
            let sealed =
                seal_stages(&job.pipeline, job.blocks, early_abort, job.unit, quantum).await;
            let _ = job.answer.send(sealed);
        }
    }
}

impl Drop for Worker {
    /// A worker dropped before its queue was empty answers nothing more: its waiting callers
    /// see their answers dropped and seal themselves, and the next batch starts a worker.
    fn drop(&mut self) {
        if !self.finished {
            let jobs = {
                let mut queue = self.queue.lock();
                queue.working = false;
                std::mem::take(&mut queue.jobs)
            };
            drop(jobs);
        }
    }
}
