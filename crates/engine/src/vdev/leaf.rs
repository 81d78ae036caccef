//! Leaf vdevs: one device behind its submission queues (ZFS: `vdev_file.c`/`vdev_disk.c` with
//! `vdev_queue.c`).
//!
//! A read or write enters one of the leaf's submission queues (round-robin, the way requests
//! from different CPUs land on different hardware queues), waits for the scheduler to pick it,
//! rides in a device command (alone or aggregated with neighbours) and completes. Every
//! completion tries to issue more. A command that carries only the caller's own I/O (the common
//! case, a queue below its limits) runs in the caller's task; every other command gets a task of
//! its own. Either way no queue lock is held across the I/O. Flush and discard bypass the scheduler: they are barriers and
//! hints, not data transfers, and ordering them behind queued reads would only delay them.
//!
//! Mirror read selection asks a leaf how many I/Os are pending on it (an atomic) and whether a
//! read would continue one of its pending I/Os: the end offsets of every queued or in-flight
//! I/O are kept in a small ordered map. With many interleaved streams a single "last offset"
//! almost always belongs to another stream; the map recognises each stream's continuation, and
//! a continuation merges with its predecessor at no positioning cost.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::channel::oneshot;
use parking_lot::Mutex;

use super::queue::{Direction, Issue, QueueLimits, QueuedIo, Scheduler};
use super::{VdevError, VdevId};
use crate::device::{AlignedBuf, BlockDevice, SharedBuf};
use crate::rt::Env;
use crate::stats::LeafStats;
use crate::tunables::{IoClass, Tunable, Tunables};

/// What a queued I/O carries: its data (writes) and who to tell when it is done.
/// A device command the caller runs itself ([`Leaf::enqueue`]).
type OwnIssue = Issue<(Waiter, crate::rt::Time)>;

#[derive(Debug)]
enum Waiter {
    Read(oneshot::Sender<Result<AlignedBuf, VdevError>>),
    /// Data, whether the write must be flushed before it is answered, and who to tell.
    Write(SharedBuf, bool, oneshot::Sender<Result<(), VdevError>>),
}

/// A leaf's health, as `pool status` shows it (ZFS's vdev states). Mirrors decide from it
/// which children get I/O; it is one atomic load on every read and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeafState {
    /// In service.
    Online,
    /// In service, but it returned bad data too often: a mirror reads it only when no
    /// healthy child is left to try.
    Degraded,
    /// Out of service because its device failed: mirrors send it no writes and read it only
    /// as the last resort (a device that vanished may have come back).
    Faulted(FaultReason),
    /// Taken out of service by the administrator (`pool offline`): no I/O at all until
    /// `pool online`.
    Offline,
}

/// Why a leaf was faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultReason {
    /// The device reported itself gone (unplugged, its file deleted or its path unreachable).
    Gone,
    /// Its I/O errors passed the diagnosis threshold.
    TooManyErrors,
}

impl LeafState {
    const ONLINE: u8 = 0;
    const DEGRADED: u8 = 1;
    const FAULTED_GONE: u8 = 2;
    const FAULTED_ERRORS: u8 = 3;
    const OFFLINE: u8 = 4;

    fn encode(self) -> u8 {
        match self {
            LeafState::Online => Self::ONLINE,
            LeafState::Degraded => Self::DEGRADED,
            LeafState::Faulted(FaultReason::Gone) => Self::FAULTED_GONE,
            LeafState::Faulted(FaultReason::TooManyErrors) => Self::FAULTED_ERRORS,
            LeafState::Offline => Self::OFFLINE,
        }
    }

    fn decode(raw: u8) -> LeafState {
        match raw {
            Self::ONLINE => LeafState::Online,
            Self::DEGRADED => LeafState::Degraded,
            Self::FAULTED_GONE => LeafState::Faulted(FaultReason::Gone),
            Self::FAULTED_ERRORS => LeafState::Faulted(FaultReason::TooManyErrors),
            _ => LeafState::Offline,
        }
    }

    /// Whether writes go to the leaf: a leaf out of service misses them, and a resilver
    /// brings it up to date when it returns.
    pub fn takes_writes(self) -> bool {
        matches!(self, LeafState::Online | LeafState::Degraded)
    }

    /// The word `pool status` prints.
    pub fn name(self) -> &'static str {
        match self {
            LeafState::Online => "ONLINE",
            LeafState::Degraded => "DEGRADED",
            LeafState::Faulted(_) => "FAULTED",
            LeafState::Offline => "OFFLINE",
        }
    }

    /// Why the leaf is in this state, for the status line beside it.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            LeafState::Online | LeafState::Offline => None,
            LeafState::Degraded => Some("too many checksum errors"),
            LeafState::Faulted(FaultReason::Gone) => Some("device gone"),
            LeafState::Faulted(FaultReason::TooManyErrors) => Some("too many I/O errors"),
        }
    }
}

impl std::fmt::Display for LeafState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.reason() {
            Some(reason) => write!(f, "{} ({reason})", self.name()),
            None => f.write_str(self.name()),
        }
    }
}

/// A leaf vdev.
pub struct Leaf {
    id: VdevId,
    env: Env,
    device: Arc<dyn BlockDevice>,
    queues: Vec<Mutex<Scheduler<(Waiter, crate::rt::Time)>>>,
    next_queue: AtomicUsize,
    pending: AtomicU64,
    last_end: AtomicU64,
    /// End offsets of queued and in-flight I/Os, with how many end there.
    pending_ends: Mutex<BTreeMap<u64, u32>>,
    /// A [`LeafState`], encoded.
    state: AtomicU8,
    stats: LeafStats,
    /// Read, write and checksum errors counted when the errors were last cleared (`pool
    /// clear`), and those carried over from before the pool was imported (the pool
    /// directory's leaf records): the counters themselves only grow, as the metrics expect.
    cleared: Mutex<ErrorBase>,
    /// Writes a mirror did not send here because the leaf was out of service, writes refused
    /// because it was offline, and flushes that failed or were refused with writes pending
    /// ([`Leaf::flush`]): with the write errors, what it missed.
    skipped_writes: AtomicU64,
    /// Copies of acknowledged writes this leaf may lack: writes its vdev answered as done that
    /// it did not take (it failed them or was out of service), and flushes that failed, were
    /// refused or were skipped with writes pending (a durable write's own flush included).
    /// Unlike [`Leaf::writes_missed`] it leaves out writes that failed for the whole vdev
    /// (their writers were told) and uberblock and resilver writes; what it counts is a write
    /// this leaf may not durably hold though its vdev, or a flush, said it was done. The
    /// pool's sync checks it across a txg ([`crate::pool::Pool::sync_uberblock`]).
    copies_missed: AtomicU64,
    /// Resilver copies meant for this leaf that it did not take (it was out of service, or
    /// the write failed): a resilver that counted any does not credit the leaf.
    resilver_misses: AtomicU64,
    /// Set by the pool while the leaf misses txgs its mirror has (until a resilver catches
    /// it up): mirrors read it only when no up-to-date child is left, and a stale copy there
    /// is not counted as a checksum error.
    behind: std::sync::atomic::AtomicBool,
    /// Recent errors, for the fault diagnosis (see [`Leaf::verdict`]).
    diagnosis: Mutex<Diagnosis>,
    /// Writes completed without a flush of their own, counted; and of that count, how many a
    /// completed flush covers (the count when it started). A RAID-Z vdev flushes only the
    /// children with writes not covered. A flush under way covers nothing yet: a second one
    /// asked meanwhile must not take its start for its end.
    writes_done: AtomicU64,
    flushed_through: AtomicU64,
    /// A timer is set to issue async writes the pace holds ([`Scheduler::paced_until`]).
    pace_timer: std::sync::atomic::AtomicBool,
    /// An intent-log or sync write completed here that no flush has covered yet: the next
    /// flush is one a client waits on (the pace's rule 7 counts it as the log's).
    log_unflushed: std::sync::atomic::AtomicBool,
    /// Where the leaf's events go, and the path they name it by: set once by the pool that
    /// opens it (a leaf outside a pool, as in the vdev tests, posts none).
    watch: std::sync::OnceLock<Watch>,
    /// I/O and checksum errors not yet posted as events ([`crate::fm::Burst`]).
    bursts: Mutex<[crate::fm::Burst; 2]>,
}

/// A leaf's link to its pool's events.
#[derive(Debug)]
struct Watch {
    events: Arc<crate::fm::Events>,
    path: String,
}

/// What [`Leaf::errors`] counts from: the counters' values at the last clear, and the errors
/// recorded before this import.
#[derive(Debug, Default)]
struct ErrorBase {
    cleared: [u64; 3],
    carried: [u64; 3],
}

/// When the recent errors of a leaf happened, and how many within what window make a
/// verdict (zed's SERD engines: N events in T).
#[derive(Debug)]
struct Diagnosis {
    io: std::collections::VecDeque<crate::rt::Time>,
    checksum: std::collections::VecDeque<crate::rt::Time>,
    io_max: usize,
    checksum_max: usize,
    window: std::time::Duration,
}

impl Diagnosis {
    fn note(
        events: &mut std::collections::VecDeque<crate::rt::Time>,
        max: usize,
        window: std::time::Duration,
        now: crate::rt::Time,
    ) {
        while events.front().is_some_and(|&t| now.since(t) > window) {
            events.pop_front();
        }
        events.push_back(now);
        while events.len() > max {
            events.pop_front();
        }
    }
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf").field("id", &self.id).field("device", &self.device.name()).finish()
    }
}

impl Leaf {
    pub fn new(
        id: VdevId,
        env: &Env,
        device: Arc<dyn BlockDevice>,
        tunables: &Tunables,
    ) -> Arc<Leaf> {
        let limits = QueueLimits::from_tunables(tunables, device.is_rotational());
        let queue_count = usize::try_from(tunables.get(Tunable::VdevQueues)).unwrap_or(1).max(1);
        Arc::new(Leaf {
            id,
            env: env.clone(),
            device,
            queues: (0..queue_count).map(|_| Mutex::new(Scheduler::new(limits.clone()))).collect(),
            next_queue: AtomicUsize::new(0),
            pending: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            pending_ends: Mutex::new(BTreeMap::new()),
            state: AtomicU8::new(LeafState::ONLINE),
            stats: LeafStats::default(),
            cleared: Mutex::new(ErrorBase::default()),
            resilver_misses: AtomicU64::new(0),
            skipped_writes: AtomicU64::new(0),
            copies_missed: AtomicU64::new(0),
            behind: std::sync::atomic::AtomicBool::new(false),
            writes_done: AtomicU64::new(0),
            flushed_through: AtomicU64::new(0),
            pace_timer: std::sync::atomic::AtomicBool::new(false),
            log_unflushed: std::sync::atomic::AtomicBool::new(false),
            watch: std::sync::OnceLock::new(),
            bursts: Mutex::new(Default::default()),
            diagnosis: Mutex::new(Diagnosis {
                io: std::collections::VecDeque::new(),
                checksum: std::collections::VecDeque::new(),
                io_max: usize::try_from(tunables.get(Tunable::VdevIoErrorsMax)).unwrap_or(10),
                checksum_max: usize::try_from(tunables.get(Tunable::VdevChecksumErrorsMax))
                    .unwrap_or(10),
                window: std::time::Duration::from_millis(tunables.get(Tunable::VdevErrorsWindowMs)),
            }),
        })
    }

    pub fn id(&self) -> VdevId {
        self.id
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    pub fn name(&self) -> &str {
        self.device.name()
    }

    pub fn stats(&self) -> &LeafStats {
        &self.stats
    }

    pub fn is_rotational(&self) -> bool {
        self.device.is_rotational()
    }

    /// See [`BlockDevice::parallel_flushes`].
    pub fn parallel_flushes(&self) -> bool {
        self.device.parallel_flushes()
    }

    /// I/Os queued or in the device.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// End offset of the last I/O handed to this leaf (queued or issued). Mirror selection
    /// uses it for locality: ZFS uses the last *issued* offset, but once a queue is full that
    /// position is stale, and a request's later records would pay a seek penalty on the very
    /// child where they would have merged with their predecessors.
    pub fn last_end(&self) -> u64 {
        self.last_end.load(Ordering::Relaxed)
    }

    /// Distance from `offset` to the nearest end of a pending I/O at or before it, if one
    /// lies within `window` bytes. `Some(0)`: the read continues a pending I/O exactly.
    pub fn pending_end_distance(&self, offset: u64, window: u64) -> Option<u64> {
        let ends = self.pending_ends.lock();
        let (&end, _) = ends.range(offset.saturating_sub(window)..=offset).next_back()?;
        Some(offset - end)
    }

    /// The depth reads and async writes may use in each submission queue (the measured one
    /// with `vdev.max_active=auto`).
    pub fn queue_depth(&self) -> u32 {
        self.queues.iter().map(|q| q.lock().depth()).max().unwrap_or(0)
    }

    /// I/Os waiting in the submission queues to be issued.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(|q| q.lock().queued_count()).sum()
    }

    /// What is in the device now, per class, over all submission queues: device commands on
    /// rotational leaves (an aggregated command counts once), I/Os on others, as the scheduler
    /// counts them against its limits.
    pub fn active_by_class(&self) -> [u32; IoClass::COUNT] {
        let mut active = [0; IoClass::COUNT];
        for queue in &self.queues {
            let queue = queue.lock();
            for class in IoClass::ALL {
                active[class.index()] += queue.active(class);
            }
        }
        active
    }

    /// Read, write and checksum errors since the last [`Leaf::clear_errors`], as `pool
    /// status` shows them.
    pub fn errors(&self) -> [u64; 3] {
        let base = self.cleared.lock();
        let now = self.counted_errors();
        [0, 1, 2].map(|i| base.carried[i] + now[i].saturating_sub(base.cleared[i]))
    }

    fn counted_errors(&self) -> [u64; 3] {
        [
            self.stats.read_errors.get(),
            self.stats.write_errors.get(),
            self.stats.checksum_errors.get(),
        ]
    }

    /// Adds the errors a previous import recorded (read, write, checksum) to what
    /// [`Leaf::errors`] shows, until the next clear.
    pub fn carry_errors(&self, errors: [u64; 3]) {
        self.cleared.lock().carried = errors;
    }

    /// Writes this leaf did not take (failed, skipped out of service, refused offline, or
    /// left unflushed by a flush that failed). It only grows; the pool compares it across
    /// txgs to tell whether the leaf missed a block.
    pub fn writes_missed(&self) -> u64 {
        self.stats.write_errors.get() + self.skipped_writes.load(Ordering::Relaxed)
    }

    /// See the field: only grows.
    pub fn copies_missed(&self) -> u64 {
        self.copies_missed.load(Ordering::Acquire)
    }

    /// Counts a write its vdev answered as done that this leaf did not take. Called once the
    /// vdev's write has ended on every leaf: a pool that reads the count after a write was
    /// answered sees the miss.
    pub fn note_copy_missed(&self) {
        self.copies_missed.fetch_add(1, Ordering::AcqRel);
    }

    /// A flush its vdev did not send here (the leaf is out of service): writes it holds
    /// unflushed may be lost, as with a flush that failed.
    pub fn skip_flush(&self) {
        self.note_flush_missed(self.writes_done.load(Ordering::Acquire));
    }

    /// Posts this leaf's events to `events`, naming it `path`. Once: a leaf belongs to one
    /// pool.
    pub fn watch(&self, events: Arc<crate::fm::Events>, path: &str) {
        let _ = self.watch.set(Watch { events, path: path.to_owned() });
    }

    /// Posts an event about this leaf, if it is watched.
    fn post(&self, class: crate::fm::EventClass, details: Vec<(&'static str, String)>) {
        if let Some(watch) = self.watch.get() {
            watch.events.post(class, Some(&watch.path), details);
        }
    }

    /// Counts an error of `kind` (0 I/O, 1 checksum) towards the leaf's error events.
    fn note_burst(&self, kind: usize, class: crate::fm::EventClass, total: u64) {
        if self.watch.get().is_none() {
            return;
        }
        let due = self.bursts.lock()[kind].note(self.env.now());
        if let Some(errors) = due {
            self.post(class, vec![("errors", errors.to_string()), ("total", total.to_string())]);
        }
    }

    /// Records an I/O error: an error event, and the diagnosis unless a scrub's (a scrub
    /// reads what nothing else does; a device that fails it is faulted by the reads and
    /// writes that follow, as ZED's I/O diagnosis counts only those).
    pub fn note_io_error(&self, class: IoClass) {
        let total = self.stats.read_errors.get()
            + self.stats.write_errors.get()
            + self.stats.flush_errors.get();
        self.note_burst(0, crate::fm::EventClass::Io, total);
        if class != IoClass::Scrub {
            let now = self.env.now();
            let mut d = self.diagnosis.lock();
            let (max, window) = (d.io_max, d.window);
            Diagnosis::note(&mut d.io, max, window, now);
        }
    }

    /// Counts a copy this leaf returned that failed its checksum, and posts the error event.
    pub fn count_checksum_error(&self) {
        self.stats.checksum_errors.inc();
        self.note_burst(1, crate::fm::EventClass::Checksum, self.stats.checksum_errors.get());
    }

    /// Records a copy that failed its checksum for the diagnosis: a client's read, a scrub's
    /// or a resilver's alike (docs/design.md, "Fault diagnosis and events").
    pub fn note_checksum_error(&self) {
        let now = self.env.now();
        let mut d = self.diagnosis.lock();
        let (max, window) = (d.checksum_max, d.window);
        Diagnosis::note(&mut d.checksum, max, window, now);
    }

    /// What the recent errors say: faulted after `vdev.io_errors_max` I/O errors within
    /// `vdev.errors_window_ms`, degraded after `vdev.checksum_errors_max` bad copies. The
    /// mirror decides whether to act on it (never on the leaf with the only good copy).
    pub fn verdict(&self) -> Option<LeafState> {
        let now = self.env.now();
        let d = self.diagnosis.lock();
        let within = |events: &std::collections::VecDeque<crate::rt::Time>| {
            events.iter().filter(|&&t| now.since(t) <= d.window).count()
        };
        if within(&d.io) >= d.io_max {
            Some(LeafState::Faulted(FaultReason::TooManyErrors))
        } else if within(&d.checksum) >= d.checksum_max {
            Some(LeafState::Degraded)
        } else {
            None
        }
    }

    /// Forgets the recent errors (`pool clear`).
    pub fn clear_diagnosis(&self) {
        let mut d = self.diagnosis.lock();
        d.io.clear();
        d.checksum.clear();
    }

    /// Whether the leaf misses txgs its mirror has (see the field).
    pub fn is_behind(&self) -> bool {
        self.behind.load(Ordering::Relaxed)
    }

    pub fn set_behind(&self, behind: bool) {
        self.behind.store(behind, Ordering::Relaxed);
    }

    /// Counts a resilver copy this leaf did not take.
    pub fn note_resilver_miss(&self) {
        self.resilver_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Resilver copies this leaf did not take, since it was opened.
    pub fn resilver_misses(&self) -> u64 {
        self.resilver_misses.load(Ordering::Relaxed)
    }

    /// Counts a write a mirror did not send here (the leaf is out of service).
    pub fn note_skipped_write(&self) {
        self.skipped_writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Starts the error counts of [`Leaf::errors`] again from zero.
    pub fn clear_errors(&self) {
        let now = self.counted_errors();
        *self.cleared.lock() = ErrorBase { cleared: now, carried: [0; 3] };
    }

    pub fn state(&self) -> LeafState {
        LeafState::decode(self.state.load(Ordering::Relaxed))
    }

    /// Sets the leaf's state (an administrator's offline, online or clear, or a diagnosis),
    /// posting a state change when it is one.
    pub fn set_state(&self, state: LeafState) {
        let previous = LeafState::decode(self.state.swap(state.encode(), Ordering::Relaxed));
        if previous != state {
            self.post_state_change(previous, state);
        }
    }

    fn post_state_change(&self, previous: LeafState, state: LeafState) {
        let mut details = vec![("state", state.name().to_owned())];
        details.push(("previous", previous.name().to_owned()));
        if let Some(reason) = state.reason() {
            details.push(("reason", reason.to_owned()));
        }
        self.post(crate::fm::EventClass::StateChange, details);
    }

    /// Whether the leaf is out of service because its device failed.
    pub fn is_faulted(&self) -> bool {
        matches!(self.state(), LeafState::Faulted(_))
    }

    /// Whether the leaf is out of service (faulted or offline): it holds nothing written
    /// since, so what it returns is not trusted and its failures are not errors.
    pub fn is_out_of_service(&self) -> bool {
        !self.state().takes_writes()
    }

    /// Marks the leaf faulted because its device is known to be missing. An administrator's
    /// offline stays: the device is not in use either way.
    pub fn mark_gone(&self) {
        let gone = LeafState::Faulted(FaultReason::Gone).encode();
        let changed = self.state.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |raw| {
            (raw != LeafState::OFFLINE && raw != gone).then_some(gone)
        });
        if let Ok(previous) = changed {
            self.post_state_change(LeafState::decode(previous), LeafState::decode(gone));
        }
    }

    pub async fn read(
        self: &Arc<Self>,
        offset: u64,
        len: u32,
        class: IoClass,
    ) -> Result<AlignedBuf, VdevError> {
        self.check_online()?;
        let (done, wait) = oneshot::channel();
        let own = self.enqueue(
            QueuedIo {
                class,
                direction: Direction::Read,
                offset,
                len: u64::from(len),
                payload: (Waiter::Read(done), self.env.now()),
            },
            |waiter| matches!(waiter, Waiter::Read(done) if done.is_connected_to(&wait)),
        );
        if let Some((queue, issue)) = own {
            Arc::clone(self).execute(queue, issue).await;
        }
        let result = wait.await.unwrap_or_else(|_| Err(self.gone()));
        if result.is_ok() {
            self.stats.reads.inc();
            self.stats.read_bytes.add(u64::from(len));
        } else {
            self.note_io_error(class);
        }
        result
    }

    pub async fn write(
        self: &Arc<Self>,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
    ) -> Result<(), VdevError> {
        self.write_flushed(offset, data, class, false).await
    }

    /// Writes, and when `durable` flushes this leaf before answering: in one trip to the
    /// device where it can (an intent-log block: the write and its flush used to be two trips
    /// through the I/O thread and the runtime).
    pub async fn write_flushed(
        self: &Arc<Self>,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        if let Err(offline) = self.check_online() {
            self.note_skipped_write();
            return Err(offline);
        }
        let (done, wait) = oneshot::channel();
        let len = u64::from(data.len_bytes());
        let own = self.enqueue(
            QueuedIo {
                class,
                direction: Direction::Write,
                offset,
                len,
                payload: (Waiter::Write(data, durable, done), self.env.now()),
            },
            |waiter| matches!(waiter, Waiter::Write(_, _, done) if done.is_connected_to(&wait)),
        );
        if let Some((queue, issue)) = own {
            Arc::clone(self).execute(queue, issue).await;
        }
        let result = wait.await.unwrap_or_else(|_| Err(self.gone()));
        match &result {
            Ok(()) => {
                self.stats.writes.inc();
                self.stats.write_bytes.add(len);
                if !durable {
                    self.writes_done.fetch_add(1, Ordering::AcqRel);
                    if matches!(class, IoClass::LogWrite | IoClass::SyncWrite) {
                        self.log_unflushed.store(true, Ordering::Release);
                    }
                }
            }
            Err(_) => {
                self.stats.write_errors.inc();
                self.note_io_error(class);
            }
        }
        result
    }

    /// Whether a write completed here that no completed flush covers.
    pub fn has_unflushed(&self) -> bool {
        self.writes_done.load(Ordering::Acquire) > self.flushed_through.load(Ordering::Acquire)
    }

    /// Flushes the device's cache. It covers the writes completed before it began, once it
    /// has completed.
    pub async fn flush(self: &Arc<Self>) -> Result<(), VdevError> {
        let covers = self.writes_done.load(Ordering::Acquire);
        if let Err(offline) = self.check_online() {
            self.note_flush_missed(covers);
            return Err(offline);
        }
        self.stats.flushes.inc();
        let for_log = self.log_unflushed.swap(false, Ordering::AcqRel);
        let in_flight = FlushInFlight::start(self);
        let result = self.device.flush().await.map_err(|e| self.device_error(e));
        in_flight.end(result.is_ok(), for_log);
        for queue in 0..self.queues.len() {
            self.pump(queue, None);
        }
        if result.is_ok() {
            self.flushed_through.fetch_max(covers, Ordering::AcqRel);
        } else {
            self.stats.flush_errors.inc();
            self.note_io_error(IoClass::AsyncWrite);
            self.note_flush_missed(covers);
        }
        result
    }

    /// A flush that failed or was refused may have left the writes it was to make durable
    /// only in a cache that is lost: with any such write pending, it counts as a write this
    /// leaf missed ([`Leaf::writes_missed`], [`Leaf::copies_missed`]), so the pool stops
    /// counting the leaf whole for the txg, a resilver brings it up to date, and a sync does
    /// not count on this leaf's copies. (A mirror's write and flush each succeed when one
    /// child did.)
    fn note_flush_missed(&self, covers: u64) {
        if covers > self.flushed_through.load(Ordering::Acquire) {
            self.skipped_writes.fetch_add(1, Ordering::Relaxed);
            self.copies_missed.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        self.check_online()?;
        self.device.discard(offset, len).await.map_err(|e| self.device_error(e))
    }

    /// An offline leaf's device is not touched at all, whoever asks.
    fn check_online(&self) -> Result<(), VdevError> {
        if self.state() == LeafState::Offline {
            return Err(VdevError::Offline {
                vdev: self.id,
                device: self.device.name().to_owned(),
            });
        }
        Ok(())
    }

    fn gone(&self) -> VdevError {
        VdevError::Device {
            vdev: self.id,
            cause: crate::device::DeviceError::Gone { device: self.device.name().to_owned() },
        }
    }

    fn device_error(&self, source: crate::device::DeviceError) -> VdevError {
        if source.is_gone() {
            self.mark_gone();
        }
        VdevError::Device { vdev: self.id, cause: source }
    }

    /// Queues an I/O and issues what the scheduler allows. When the caller's own I/O
    /// (`is_own`) goes out at once as a command of its own, it is returned for the caller to
    /// run in its own task: no task is spawned and no wake-up crosses between the request and
    /// its device command (the common case, a queue below its limits).
    fn enqueue(
        self: &Arc<Self>,
        io: QueuedIo<(Waiter, crate::rt::Time)>,
        is_own: impl Fn(&Waiter) -> bool,
    ) -> Option<(usize, OwnIssue)> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.last_end.store(io.offset + io.len, Ordering::Relaxed);
        *self.pending_ends.lock().entry(io.offset + io.len).or_insert(0) += 1;
        let queue = self.next_queue.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        self.queues[queue].lock().enqueue(io, self.env.now());
        self.pump(queue, Some(&is_own)).map(|issue| (queue, issue))
    }

    /// Issues every command the scheduler allows now, each on a task of its own, except one
    /// that carries only the caller's I/O, which is returned.
    fn pump(
        self: &Arc<Self>,
        queue: usize,
        is_own: Option<&dyn Fn(&Waiter) -> bool>,
    ) -> Option<OwnIssue> {
        let mut own = None;
        let now = self.env.now();
        loop {
            let (issue, paced_until) = {
                let mut scheduler = self.queues[queue].lock();
                let issue = scheduler.next_issue(now);
                let paced_until = if issue.is_none() { scheduler.paced_until() } else { None };
                if paced_until.is_some() && scheduler.pace_hold_started() {
                    self.stats.sync_paced.inc();
                }
                (issue, paced_until)
            };
            let Some(issue) = issue else {
                if let Some(at) = paced_until {
                    self.set_pace_timer(at);
                }
                return own;
            };
            let single_own = own.is_none()
                && issue.members.len() == 1
                && is_own.is_some_and(|is_own| is_own(&issue.members[0].payload.0));
            if single_own {
                own = Some(issue);
                continue;
            }
            let leaf = Arc::clone(self);
            self.env.spawn("vdev_io", async move { leaf.execute(queue, issue).await });
        }
    }

    /// Issues the async writes the pace holds once it lets them go, unless a completion comes
    /// first (one timer per leaf: it pumps every queue).
    fn set_pace_timer(self: &Arc<Self>, at: crate::rt::Time) {
        if self.pace_timer.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next hold set a timer, even when this one's task is dropped unfinished.
        struct Disarm(Arc<Leaf>);
        impl Drop for Disarm {
            fn drop(&mut self) {
                self.0.pace_timer.store(false, Ordering::Release);
            }
        }
        let disarm = Disarm(Arc::clone(self));
        let env = self.env.clone();
        self.env.spawn("vdev_pace", async move {
            env.sleep_until(at).await;
            let leaf = Arc::clone(&disarm.0);
            drop(disarm);
            for queue in 0..leaf.queues.len() {
                leaf.pump(queue, None);
            }
        });
    }

    /// Runs one device command and hands each member its result.
    async fn execute(self: Arc<Self>, queue: usize, issue: Issue<(Waiter, crate::rt::Time)>) {
        let class = issue.class;
        let ends: Vec<u64> = issue.members.iter().map(|m| m.offset + m.len).collect();
        // A command run inside a request's task ends with that task, which may be dropped
        // (a runtime shutting down): its slots in the queue are given back either way.
        let mut slots = Slots { leaf: &self, queue, class, ends, bytes: issue.len, held: true };
        if issue.members.len() > 1 {
            self.stats.aggregated.add(issue.members.len() as u64 - 1);
        }
        let len32 = u32::try_from(issue.len).unwrap_or(u32::MAX);
        match issue.direction {
            Direction::Read => {
                let result = self.device.read_at(issue.offset, len32).await;
                if result.is_err() {
                    self.stats.read_errors.inc();
                }
                slots.release();
                let now = self.env.now();
                let single = issue.members.len() == 1;
                let mut whole = None;
                let mut failure = None;
                match result {
                    Ok(buf) => whole = Some(buf),
                    Err(e) => failure = Some(e),
                }
                for member in issue.members {
                    let (Waiter::Read(done), started) = member.payload else { continue };
                    self.stats.latency[member.class.index()].record(now.since(started));
                    let answer = match (&failure, single) {
                        (Some(e), _) => Err(self.device_error(clone_device_error(e))),
                        (None, true) => whole.take().ok_or_else(|| self.gone()),
                        (None, false) => {
                            let at = (member.offset - issue.offset) as usize;
                            let buf = whole
                                .as_ref()
                                .map(|b| AlignedBuf::copy_from(&b[at..at + member.len as usize]));
                            buf.ok_or_else(|| self.gone())
                        }
                    };
                    let _ = done.send(answer);
                }
            }
            Direction::Write => {
                let data = if issue.members.len() == 1 {
                    match &issue.members[0].payload.0 {
                        Waiter::Write(data, _, _) => data.clone(),
                        Waiter::Read(_) => unreachable!("write command with a read member"),
                    }
                } else {
                    // Members come in offset order and a write's are contiguous, so each
                    // byte is copied once and none is zeroed first.
                    let pieces = issue.members.iter().map(|member| match &member.payload.0 {
                        Waiter::Write(data, _, _) => {
                            ((member.offset - issue.offset) as usize, &data[..])
                        }
                        Waiter::Read(_) => unreachable!("write command with a read member"),
                    });
                    AlignedBuf::gathered(issue.len as usize, pieces).into_shared()
                };
                // A flush after the command covers every member that asked for one.
                let durable =
                    issue.members.iter().any(|m| matches!(m.payload.0, Waiter::Write(_, true, _)));
                let result = if !durable {
                    self.device.write_at(issue.offset, data).await
                } else {
                    self.stats.flushes.inc();
                    let covers = self.writes_done.load(Ordering::Acquire);
                    let in_flight = FlushInFlight::start(&self);
                    let result = match self.device.write_durable_at(issue.offset, data.clone()) {
                        Some(fused) => fused.await,
                        None => match self.device.write_at(issue.offset, data).await {
                            Ok(()) => self.device.flush().await,
                            Err(e) => Err(e),
                        },
                    };
                    if result.is_err() {
                        self.stats.flush_errors.inc();
                        // As a plain flush that failed: the writes it was to cover too.
                        self.note_flush_missed(covers);
                    }
                    in_flight.end(result.is_ok(), true);
                    // This queue is pumped as the slots are released; the others may hold
                    // async writes the flush's completion lets go.
                    for other in (0..self.queues.len()).filter(|q| *q != queue) {
                        self.pump(other, None);
                    }
                    result
                };
                slots.release();
                // The queue merges across classes: only the async writes' own bytes count.
                let async_bytes: u64 = issue
                    .members
                    .iter()
                    .filter(|m| m.class == IoClass::AsyncWrite)
                    .map(|m| m.len)
                    .sum();
                if async_bytes > 0 && result.is_ok() {
                    self.stats.async_write_commands.inc();
                    self.stats.async_written.add(async_bytes);
                }
                for member in issue.members {
                    let (Waiter::Write(_, _, done), started) = member.payload else { continue };
                    self.stats.latency[member.class.index()].record(self.env.now().since(started));
                    let _ = done.send(
                        result
                            .as_ref()
                            .map(|_| ())
                            .map_err(|e| self.device_error(clone_device_error(e))),
                    );
                }
            }
        }
    }

    fn finish(self: &Arc<Self>, queue: usize, class: IoClass, ends: &[u64], bytes: u64) {
        let members = ends.len();
        self.pending.fetch_sub(members as u64, Ordering::Relaxed);
        {
            let mut pending_ends = self.pending_ends.lock();
            for end in ends {
                if let Some(count) = pending_ends.get_mut(end) {
                    *count -= 1;
                    if *count == 0 {
                        pending_ends.remove(end);
                    }
                }
            }
        }
        self.queues[queue].lock().done(class, members, bytes, self.env.now());
        self.pump(queue, None);
    }
}

/// A flush (or durable write) every submission queue's pace counts in flight until it ends
/// (rule 7 of `vdev::queue`); one abandoned with its task ends as not flushed, so a pace never
/// waits for a completion that cannot come.
struct FlushInFlight<'a> {
    leaf: &'a Leaf,
    ended: bool,
}

impl<'a> FlushInFlight<'a> {
    fn start(leaf: &'a Leaf) -> FlushInFlight<'a> {
        for queue in &leaf.queues {
            queue.lock().flush_started();
        }
        FlushInFlight { leaf, ended: false }
    }

    fn end(mut self, flushed: bool, for_log: bool) {
        self.finish(flushed, for_log);
    }

    fn finish(&mut self, flushed: bool, for_log: bool) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let now = self.leaf.env.now();
        for queue in &self.leaf.queues {
            queue.lock().flush_done(flushed, for_log, now);
        }
    }
}

impl Drop for FlushInFlight<'_> {
    fn drop(&mut self) {
        self.finish(false, false);
    }
}

/// The queue slots an issued command holds, released when it completes or is abandoned.
struct Slots<'a> {
    leaf: &'a Arc<Leaf>,
    queue: usize,
    class: IoClass,
    ends: Vec<u64>,
    bytes: u64,
    held: bool,
}

impl Slots<'_> {
    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.leaf.finish(self.queue, self.class, &self.ends, self.bytes);
        }
    }
}

impl Drop for Slots<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Device errors carry an `io::Error`, which is not `Clone`; aggregated members each get an
/// equivalent copy.
fn clone_device_error(error: &crate::device::DeviceError) -> crate::device::DeviceError {
    use crate::device::DeviceError;
    match error {
        DeviceError::Io { device, op, offset_bytes, len_bytes, cause: source } => DeviceError::Io {
            device: device.clone(),
            op: *op,
            offset_bytes: *offset_bytes,
            len_bytes: *len_bytes,
            cause: std::io::Error::new(source.kind(), source.to_string()),
        },
        DeviceError::OutOfRange {
            device,
            op,
            offset_bytes,
            len_bytes,
            device_bytes,
            sector_bytes,
        } => DeviceError::OutOfRange {
            device: device.clone(),
            op: *op,
            offset_bytes: *offset_bytes,
            len_bytes: *len_bytes,
            device_bytes: *device_bytes,
            sector_bytes: *sector_bytes,
        },
        DeviceError::Open { path, cause: source } => DeviceError::Open {
            path: path.clone(),
            cause: std::io::Error::new(source.kind(), source.to_string()),
        },
        DeviceError::HostFull { device, filesystem, op, offset_bytes, len_bytes } => {
            DeviceError::HostFull {
                device: device.clone(),
                filesystem: filesystem.clone(),
                op: *op,
                offset_bytes: *offset_bytes,
                len_bytes: *len_bytes,
            }
        }
        DeviceError::Gone { device } => DeviceError::Gone { device: device.clone() },
        DeviceError::Locked { path, holder } => {
            DeviceError::Locked { path: path.clone(), holder: holder.clone() }
        }
    }
}
