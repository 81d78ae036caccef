//! The per-leaf I/O scheduler (ZFS: `vdev_queue.c`; seed 003).
//!
//! Each submission queue holds I/Os of six classes and decides which to send to the device
//! next. Rules, in order:
//! 1. Nothing is issued while `max_active` commands are in the device.
//! 2. Pass one: starting after the class served last, the first class below its minimum active
//!    count is served (every class makes progress).
//! 3. Pass two: in priority order, the first class below its maximum is served.
//! 4. Within a class, sync classes are first in first out; async and scrub classes run an
//!    elevator inside arrival buckets of about half a second, which orders by offset without
//!    starving old requests.
//! 5. The chosen I/O absorbs queued neighbours of the same direction (of any class) into one
//!    command while the span stays within the aggregation limit; reads may read through gaps
//!    up to the read gap limit, writes must be contiguous.
//! 6. On non-rotational leaves active counts are in I/Os, not commands: a command carrying four
//!    merged reads uses four slots, and merging stops where the slots run out. There transfer
//!    time dominates, and counting commands would let aggregation multiply the bytes the device
//!    holds (four 32 KiB reads per 128 KiB command quadruple the queue in bytes): exactly the
//!    deep queue a sync write must not wait behind (measured: seed 003's writer fell from 420
//!    to 137 IOPS). On rotational leaves a contiguous aggregate costs one positioning plus its
//!    transfer, so it counts as one command, as in ZFS; counting members there stopped merging
//!    whenever a single slot freed and cost sequential readers a third of their bandwidth.
//! 7. With `vdev.sync_pace_bytes` set (it is off by default), while the intent log flushes
//!    the leaf, async writes (the txg sync's) are paced: after a budget of them (that many
//!    bytes, or with `auto` the last sync's bytes spread over half the txg interval), the
//!    rest wait for the next flush to complete, or with none in flight for a millisecond to
//!    pass; what a flush's completion lets through waits for the next log write, and goes
//!    behind it ([`SyncPace`]).
//!
//! Why per-class maxima matter (seed 003): a sync write that reaches a device holding hundreds
//! of streaming reads waits behind all of them. Keeping reads below the depth leaves the write a
//! free slot, and keeping the depth shallow keeps the device's own queue short.
//!
//! With `vdev.max_active=auto` ([`DepthController`]), reads, async writes and scrub together
//! get a depth the queue measures: it climbs while each step up gains throughput, steps down
//! when a shallower depth loses none, and probes again now and then. Sync and log writes are
//! then limited only by their own maxima, on top of that depth, so they always find a slot. A
//! device whose throughput saturates early (a provisioned cloud disk) ends shallow, which keeps
//! its queue short for sync writes; an HDD, whose elevator gains from every command it can see,
//! ends deep. This is the "depends on the latency of the storage" of seeds 000 and 003, found
//! by measurement instead of by hand. The shallow-depth rule is there for sync and log writes,
//! so it holds only while they use the device: after a second without one, sync reads (clients'
//! reads, and the pool's own reads of its metadata) take any depth that gains at least 2%, up
//! to 256, while scrub and the txg sync's writes keep the depth held with writes around, so a
//! client's read never waits behind hundreds of theirs. The next sync or log write brings that
//! depth back at once, and its own slots never depend on what the reads hold. (Scattered 16
//! KiB reads of a volume random writes had aged sat at a depth of 4-8 under the writes' rule
//! and read half as fast as at 96.)
//!
//! This module is pure bookkeeping: it never touches a device, a clock or a lock, so it is
//! tested directly. The leaf wraps it in a mutex and does the I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::rt::Time;
use crate::tunables::{IoClass, Tunable, Tunables};

/// Arrival buckets of 2^29 ns (about 0.54 s), as ZFS uses for its async elevators.
const ELEVATOR_BUCKET_SHIFT: u32 = 29;

/// Direction of an I/O; only same-direction I/Os aggregate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Read,
    Write,
}

/// The limits one submission queue enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueLimits {
    pub min_active: [u32; IoClass::COUNT],
    pub max_active: [u32; IoClass::COUNT],
    pub total_active_max: u32,
    pub aggregation_limit_bytes: u64,
    pub read_gap_limit_bytes: u64,
    /// Charge an aggregated command one slot per I/O it carries (non-rotational leaves) rather
    /// than one slot (rotational leaves); see rule 6 in the module doc.
    pub count_members: bool,
    /// `vdev.max_active=auto`: the throughput classes' depth is measured, not configured.
    pub auto_depth: bool,
    /// With `auto`, sync reads may deepen the queue while no write shares the device (see
    /// [`DepthController`]): on non-rotational leaves only.
    pub deepen_alone: bool,
    /// Async write bytes allowed between two durable completions while the intent log writes
    /// here (rule 7; 0: no pacing, or the budget [`QueueLimits::sync_pace_auto`] sets).
    pub sync_pace_bytes: u64,
    /// `vdev.sync_pace_bytes=auto`: the budget follows the sync (rule 7, [`SyncDeadline`]).
    pub sync_pace_auto: bool,
}

impl QueueLimits {
    pub fn from_tunables(tunables: &Tunables, rotational: bool) -> QueueLimits {
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let aggregation = if rotational {
            tunables.get(Tunable::AggregationLimit)
        } else {
            tunables.get(Tunable::AggregationLimitNonRotating)
        };
        QueueLimits {
            min_active: IoClass::ALL.map(|c| clamp(tunables.class_min_active(c))),
            max_active: IoClass::ALL.map(|c| clamp(tunables.class_max_active(c))),
            total_active_max: clamp(tunables.get(Tunable::VdevMaxActive)),
            aggregation_limit_bytes: aggregation,
            read_gap_limit_bytes: tunables.get(Tunable::ReadGapLimit),
            count_members: !rotational,
            auto_depth: tunables.is_auto(Tunable::VdevMaxActive),
            deepen_alone: !rotational,
            sync_pace_bytes: if tunables.is_auto(Tunable::SyncPaceBytes) {
                0
            } else {
                tunables.get(Tunable::SyncPaceBytes)
            },
            sync_pace_auto: tunables.is_auto(Tunable::SyncPaceBytes),
        }
    }
}

/// One queued I/O.
#[derive(Debug)]
pub struct QueuedIo<T> {
    pub class: IoClass,
    pub direction: Direction,
    pub offset: u64,
    pub len: u64,
    pub payload: T,
}

/// A device command chosen for issue: one or more queued I/Os covering `[offset, offset+len)`,
/// in offset order. Reads may leave gaps between members.
#[derive(Debug)]
pub struct Issue<T> {
    pub class: IoClass,
    pub direction: Direction,
    pub offset: u64,
    pub len: u64,
    pub members: Vec<QueuedIo<T>>,
}

/// Sort key within a class: FIFO classes use (0, arrival sequence), elevator classes use
/// (arrival bucket, offset).
type ClassKey = (u64, u64, u64);

/// The scheduler state of one submission queue.
#[derive(Debug)]
pub struct Scheduler<T> {
    limits: QueueLimits,
    queued: HashMap<u64, (ClassKey, QueuedIo<T>)>,
    by_class: [BTreeSet<ClassKey>; IoClass::COUNT],
    /// Queued I/Os by (offset, id), per direction, for aggregation.
    by_offset: [BTreeMap<(u64, u64), ()>; 2],
    active: [u32; IoClass::COUNT],
    active_total: u32,
    last_class: usize,
    /// End of the last issued command: where the elevator continues from.
    last_end: u64,
    next_id: u64,
    /// Queued I/Os of the throughput classes (for the depth controller's demand test).
    queued_throughput: usize,
    depth: Option<DepthController>,
    pace: SyncPace,
}

/// Classes whose depth `auto` measures: they move data in bulk and are judged by throughput.
/// The others (sync and log writes) are judged by latency and keep their own slots.
fn is_throughput(class: IoClass) -> bool {
    !matches!(class, IoClass::SyncWrite | IoClass::LogWrite)
}

fn is_fifo(class: IoClass) -> bool {
    matches!(class, IoClass::SyncRead | IoClass::SyncWrite | IoClass::LogWrite)
}

fn dir_index(direction: Direction) -> usize {
    match direction {
        Direction::Read => 0,
        Direction::Write => 1,
    }
}

impl<T> Scheduler<T> {
    pub fn new(limits: QueueLimits) -> Scheduler<T> {
        Scheduler {
            queued: HashMap::new(),
            by_class: Default::default(),
            by_offset: Default::default(),
            active: [0; IoClass::COUNT],
            active_total: 0,
            last_class: IoClass::COUNT - 1,
            last_end: 0,
            next_id: 0,
            queued_throughput: 0,
            depth: limits_auto(&limits).then(|| DepthController::new(limits.deepen_alone)),
            pace: SyncPace::new(limits.sync_pace_bytes, limits.sync_pace_auto),
            limits,
        }
    }

    /// The depth of the throughput classes now: measured with `auto`, else the class maximum of
    /// sync reads.
    pub fn depth(&self) -> u32 {
        match &self.depth {
            Some(controller) => controller.depth,
            None => {
                self.limits.max_active[IoClass::SyncRead.index()].min(self.limits.total_active_max)
            }
        }
    }

    fn active_throughput(&self) -> u32 {
        IoClass::ALL.iter().filter(|c| is_throughput(**c)).map(|c| self.active[c.index()]).sum()
    }

    /// The most I/Os of `class` that may be active now.
    fn class_max(&self, class: IoClass) -> u32 {
        let configured = self.limits.max_active[class.index()];
        match &self.depth {
            Some(controller) if is_throughput(class) => {
                // The class may use what the other throughput classes leave of its depth.
                let others = self.active_throughput() - self.active[class.index()];
                controller.class_depth(class).saturating_sub(others)
            }
            _ => configured,
        }
    }

    /// The fewest I/Os of `class` the queue tries to keep active. With `auto` a throughput
    /// class's minimum is capped by the measured depth: otherwise the depth could not go below
    /// the minimums, every step down would look free, and the controller would walk to 1
    /// while the device ran at the minimums' depth (measured before this cap existed).
    fn class_min(&self, class: IoClass) -> u32 {
        let configured = self.limits.min_active[class.index()];
        match &self.depth {
            Some(controller) if is_throughput(class) => {
                configured.min(controller.class_depth(class))
            }
            _ => configured,
        }
    }

    /// With `auto`, sync and log writes have slots of their own on top of the throughput
    /// classes' depth, counted from what those hold even when it is more than the depth (just
    /// after the depth came down, as when a sync write ends a time alone): otherwise the
    /// writes after the first would wait for hundreds of reads to drain.
    fn total_max(&self) -> u32 {
        match &self.depth {
            Some(controller) => {
                controller.depth.max(self.active_throughput())
                    + self.limits.max_active[IoClass::SyncWrite.index()]
                    + self.limits.max_active[IoClass::LogWrite.index()]
            }
            None => self.limits.total_active_max,
        }
    }

    pub fn queued_count(&self) -> usize {
        self.queued.len()
    }

    // Read only by tests and the benchmarks.
    #[cfg(any(test, feature = "testing"))]
    pub fn active_total(&self) -> u32 {
        self.active_total
    }

    pub fn active(&self, class: IoClass) -> u32 {
        self.active[class.index()]
    }

    // Read only by tests and the benchmarks.
    #[cfg(any(test, feature = "testing"))]
    pub fn last_end(&self) -> u64 {
        self.last_end
    }

    pub fn enqueue(&mut self, io: QueuedIo<T>, now: Time) {
        let id = self.next_id;
        self.next_id += 1;
        let key = if is_fifo(io.class) {
            (0, id, id)
        } else {
            (now.as_nanos() >> ELEVATOR_BUCKET_SHIFT, io.offset, id)
        };
        self.by_class[io.class.index()].insert(key);
        self.by_offset[dir_index(io.direction)].insert((io.offset, id), ());
        if is_throughput(io.class) {
            self.queued_throughput += 1;
        } else if let Some(controller) = &mut self.depth {
            controller.write_arrived(now);
        }
        if io.class == IoClass::AsyncWrite {
            self.pace.async_queued(io.len, now);
        }
        self.queued.insert(id, (key, io));
    }

    /// Records that a flush of the device (or a durable write, which ends with one) was
    /// issued (rule 7).
    pub fn flush_started(&mut self) {
        self.pace.flush_started();
    }

    /// Records that a flush [`Scheduler::flush_started`] counted ended at `now`: `flushed`
    /// unless it failed or was abandoned, and `for_log` if the intent log waited on it.
    pub fn flush_done(&mut self, flushed: bool, for_log: bool, now: Time) {
        self.pace.flush_done(flushed, for_log, now);
    }

    /// When the last [`Scheduler::next_issue`] passed over queued async writes for the pace
    /// (rule 7): the time the pace lets them go at the latest, for a timer to issue them then
    /// if no completion comes first.
    pub fn paced_until(&self) -> Option<Time> {
        if self.by_class[IoClass::AsyncWrite.index()].is_empty() {
            return None;
        }
        self.pace.held_until()
    }

    /// Whether async writes are held by the pace now for the first time since its last refill:
    /// how often the sync waited for the log's flushes, for the leaf's statistics.
    pub fn pace_hold_started(&mut self) -> bool {
        if self.paced_until().is_none() || self.pace.hold_counted {
            return false;
        }
        self.pace.hold_counted = true;
        true
    }

    /// The next command to send to the device at `now`, if the limits allow one.
    pub fn next_issue(&mut self, now: Time) -> Option<Issue<T>> {
        self.pace.held_at = None;
        let total_max = self.total_max();
        if self.active_total >= total_max {
            return None;
        }
        let paced = self.pace.holds(now);
        let class = self.class_to_issue(paced)?;
        let id = self.pick_in_class(class)?;
        let slots = total_max - self.active_total;
        let class_slots = self
            .class_max(class)
            .max(self.class_min(class))
            .saturating_sub(self.active[class.index()]);
        let members_max = if self.limits.count_members {
            slots.min(class_slots).max(1) as usize
        } else {
            usize::MAX
        };
        let span_max = match class {
            IoClass::AsyncWrite => self.pace.span_max(now),
            _ => None,
        };
        let issue = self.aggregate(id, members_max, span_max);
        let carried = if self.limits.count_members { issue.members.len() as u32 } else { 1 };
        self.active[class.index()] += carried;
        self.active_total += carried;
        self.last_class = class.index();
        if matches!(class, IoClass::LogWrite | IoClass::SyncWrite) {
            self.pace.log_issued = true;
        }
        self.last_end = issue.offset + issue.len;
        // Async writes a command of another class absorbed count as well.
        let async_bytes: u64 =
            issue.members.iter().filter(|m| m.class == IoClass::AsyncWrite).map(|m| m.len).sum();
        if async_bytes > 0 {
            self.pace.spend(async_bytes, now);
        }
        Some(issue)
    }

    /// Records that an issued command of `class`, carrying `members` I/Os and `bytes`,
    /// completed at `now`.
    pub fn done(&mut self, class: IoClass, members: usize, bytes: u64, now: Time) {
        let members =
            if self.limits.count_members { u32::try_from(members).unwrap_or(u32::MAX) } else { 1 };
        let active = &mut self.active[class.index()];
        assert!(
            *active >= members && self.active_total >= members,
            "vdev queue: completion of an I/O never issued"
        );
        *active -= members;
        self.active_total -= members;
        if is_throughput(class) {
            // Demand exceeded the depth if throughput I/O was still waiting for a slot, and one
            // that could use the whole depth: alone, the depth above the one held with writes
            // is the sync reads' only.
            let sync_reads_waiting = !self.by_class[IoClass::SyncRead.index()].is_empty();
            if let Some(controller) = &mut self.depth {
                let saturated = self.queued_throughput > 0
                    && (controller.depth_is_shared() || sync_reads_waiting);
                controller.completed(bytes, saturated, now);
            }
        }
    }

    /// The class to serve next; async writes are passed over while `paced`.
    fn class_to_issue(&self, paced: bool) -> Option<IoClass> {
        let waiting = |c: IoClass| {
            !(self.by_class[c.index()].is_empty() || (paced && c == IoClass::AsyncWrite))
        };
        // Pass one: round-robin over classes below their minimum.
        for step in 1..=IoClass::COUNT {
            let class = IoClass::ALL[(self.last_class + step) % IoClass::COUNT];
            if waiting(class) && self.active[class.index()] < self.class_min(class) {
                return Some(class);
            }
        }
        // Pass two: priority order, below the maximum.
        IoClass::ALL
            .into_iter()
            .find(|&class| waiting(class) && self.active[class.index()] < self.class_max(class))
    }

    fn pick_in_class(&self, class: IoClass) -> Option<u64> {
        let set = &self.by_class[class.index()];
        let first = *set.first()?;
        if is_fifo(class) {
            return Some(first.2);
        }
        // Elevator within the oldest bucket: the first I/O at or after the last issued end.
        let bucket = first.0;
        let ahead = set.range((bucket, self.last_end, 0)..(bucket + 1, 0, 0)).next();
        Some(ahead.unwrap_or(&first).2)
    }

    fn take(&mut self, id: u64) -> Option<QueuedIo<T>> {
        let (key, io) = self.queued.remove(&id)?;
        self.by_class[io.class.index()].remove(&key);
        if io.class == IoClass::AsyncWrite {
            self.pace.async_taken(io.len);
        }
        if is_throughput(io.class) {
            self.queued_throughput -= 1;
        }
        self.by_offset[dir_index(io.direction)].remove(&(io.offset, id));
        Some(io)
    }

    /// Removes `id` and up to `members_max - 1` neighbours it can absorb, within `span_max`
    /// bytes if given (the pace's budget: the seed goes whatever its size); returns them as one
    /// command.
    fn aggregate(&mut self, id: u64, members_max: usize, span_max: Option<u64>) -> Issue<T> {
        let Some(seed) = self.take(id) else {
            unreachable!("vdev queue: picked I/O {id} is not queued");
        };
        let direction = seed.direction;
        let limit = span_max.map_or(self.limits.aggregation_limit_bytes, |max| {
            max.min(self.limits.aggregation_limit_bytes)
        });
        let gap_limit = match direction {
            Direction::Read => self.limits.read_gap_limit_bytes,
            Direction::Write => 0,
        };
        let (mut start, mut end) = (seed.offset, seed.offset + seed.len);
        let mut member_ids = Vec::new();
        let index = &self.by_offset[dir_index(direction)];
        // Backwards: the queued I/O that ends closest before `start`.
        let mut cursor = start;
        while member_ids.len() + 1 < members_max {
            let Some((&(offset, other), ())) = index.range(..(cursor, 0)).next_back() else {
                break;
            };
            let Some((_, io)) = self.queued.get(&other) else { break };
            let io_end = offset + io.len;
            if io_end > start || start - io_end > gap_limit || end - offset > limit {
                break;
            }
            member_ids.push(other);
            start = offset;
            cursor = offset;
        }
        // Forwards: queued I/Os starting at or after `end`, within the gap.
        let mut cursor = end;
        while member_ids.len() + 1 < members_max {
            let Some((&(offset, other), ())) = index.range((cursor, 0)..).next() else { break };
            let Some((_, io)) = self.queued.get(&other) else { break };
            if offset - end > gap_limit || offset + io.len - start > limit {
                break;
            }
            member_ids.push(other);
            end = offset + io.len;
            cursor = end;
        }
        let mut members: Vec<QueuedIo<T>> =
            member_ids.into_iter().filter_map(|id| self.take(id)).collect();
        let class = seed.class;
        members.push(seed);
        members.sort_by_key(|io| io.offset);
        debug_assert!(members.windows(2).all(|w| w[0].offset + w[0].len <= w[1].offset));
        Issue { class, direction, offset: start, len: end - start, members }
    }
}

/// Pacing ends this long after the intent log's last flush here: with no client waiting on a
/// flush, the sync's writes go out at the device's pace.
const PACE_LOG_IDLE: std::time::Duration = std::time::Duration::from_millis(10);
/// With no flush in flight, the pace's budget refills at least this often: the sync is held to
/// no less than `vdev.sync_pace_bytes` per period (250 MiB/s at 256 KiB), so a log that
/// flushes rarely cannot starve it. While a flush is in flight only its completion refills:
/// what goes out meanwhile lands on the next flush, and a slow flush that let more through
/// would make the next one slower still.
const PACE_REFILL: std::time::Duration = std::time::Duration::from_millis(1);

/// With `vdev.sync_pace_bytes=auto`, async writes queued after this long without one queued
/// or issued start a new sync here ([`SyncDeadline`]). Within a sync they come and go at least
/// at every refill; between two syncs the queue is empty for the rest of the txg interval.
const PACE_AUTO_SYNC_GAP: std::time::Duration = std::time::Duration::from_millis(100);
/// With `auto`, writes apart from the sync before that add up to less than this are not a
/// sync of their own: a plan made from them would hold the next sync to a crawl (a trace of 8
/// clients showed 4 KiB written alone some 280 ms before a sync's 300 MB; planned by, it
/// halved the clients' IOPS).
const PACE_AUTO_SYNC_BYTES_MIN: u64 = 1 << 20;
/// With `auto`, a sync's writes are spread over this share of the interval since the sync
/// before started: half, so a sync that finds the device slower than it hoped still ends well
/// before the next one starts, and the log's blocks (freed by a sync) never pile up.
const PACE_AUTO_INTERVAL_SHARE: u32 = 2;
/// With `auto`, a sync's deadline is at most this far from its start (half the default
/// `txg.timeout_ms`): the sync after a long idle time is not stretched over it.
const PACE_AUTO_DEADLINE_MAX: std::time::Duration = std::time::Duration::from_millis(2500);
/// With `auto`, what a sync still has queued past its deadline is spread as if this much
/// time were left, at every refill: its last writes (the indirect blocks and space maps,
/// queued only once the data under them is written) go out within a few times this, but not
/// as one burst a single log flush carries.
const PACE_AUTO_LATE: std::time::Duration = std::time::Duration::from_millis(50);
/// With `auto`, the least budget a refill gives: a log flushing every few microseconds still
/// lets the sync's commands through whole.
const PACE_AUTO_BUDGET_MIN: u64 = 16 << 10;

/// Rule 7: the txg sync's writes spread between the flushes clients wait on.
///
/// A leaf without FUA (a file, a virtio disk with a write-back cache) makes an intent-log
/// block durable by writing it and flushing the device, and a flush writes back everything
/// the cache holds. A txg sync issuing its data as fast as the device takes it leaves
/// megabytes there, and the next log flush carries them: device flushes of 3 to 11 ms on a
/// virtio disk against 0.1 ms after a log block alone, every client stalled behind each (a
/// block-layer trace of 8 clients writing 4 KiB and flushing, docs/bench/peers-notes.md,
/// 2026-12-02). Held to a budget per flush, each
/// log flush carries a bounded share of the sync's data (the budget, and at most one command
/// over it). The budget is fixed (`vdev.sync_pace_bytes=N`), or with `auto` follows the sync
/// ([`SyncDeadline`]): a fixed one is too much for a lone client and too little for many.
/// A flush's completion is also when the clients it made durable send their next writes:
/// writes it let through at once would be in the device ahead of the next log block, which
/// would wait for them. So that budget waits for the next log (or sync) write to be issued,
/// or for a refill period to pass without one, and goes behind it.
/// Without the log flushing here (streaming, no sync clients) nothing is held. It is off by
/// default: docs/design.md, Device queues, says what each setting traded.
#[derive(Debug)]
struct SyncPace {
    /// `vdev.sync_pace_bytes`; 0 (and no `deadline`) turns pacing off.
    bytes: u64,
    /// `auto`: the budget each refill gives follows the sync.
    deadline: Option<SyncDeadline>,
    /// What may still be issued before the next refill.
    budget: u64,
    refilled: Time,
    /// When a flush the intent log waited on (a durable log write, or a flush after log
    /// writes) last completed here.
    log_flushed: Option<Time>,
    /// Flushes (and durable writes) issued and not yet completed.
    flushes_in_flight: u32,
    /// When the last [`Scheduler::next_issue`] found async writes held, the time it looked.
    held_at: Option<Time>,
    /// The hold since the last refill has been counted ([`Scheduler::pace_hold_started`]).
    hold_counted: bool,
    /// A log (or sync) write was issued since the last flush completed: the budget that
    /// completion gave goes behind it, not ahead of it in the device.
    log_issued: bool,
}

impl SyncPace {
    fn new(bytes: u64, auto: bool) -> SyncPace {
        SyncPace {
            bytes,
            deadline: auto.then(SyncDeadline::default),
            budget: if auto { u64::MAX } else { bytes },
            refilled: Time::ZERO,
            log_flushed: None,
            flushes_in_flight: 0,
            held_at: None,
            hold_counted: false,
            log_issued: true,
        }
    }

    fn flush_started(&mut self) {
        self.flushes_in_flight += 1;
    }

    fn flush_done(&mut self, flushed: bool, for_log: bool, now: Time) {
        assert!(self.flushes_in_flight > 0, "vdev queue: completion of a flush never started");
        self.flushes_in_flight -= 1;
        if flushed {
            if for_log {
                self.log_flushed = Some(now);
            }
            self.refill(now);
            self.log_issued = false;
        }
    }

    fn refill(&mut self, now: Time) {
        self.budget = match &self.deadline {
            Some(deadline) => deadline.budget(now, self.refilled),
            None => self.bytes,
        };
        self.refilled = now;
        self.hold_counted = false;
    }

    /// Whether the budget applies at `now`: the log flushes here.
    fn active(&self, now: Time) -> bool {
        (self.bytes > 0 || self.deadline.is_some())
            && self
                .log_flushed
                .is_some_and(|at| self.flushes_in_flight > 0 || now.since(at) < PACE_LOG_IDLE)
    }

    /// Whether async writes are held at `now`; refills the budget when its period has passed.
    fn holds(&mut self, now: Time) -> bool {
        let active = self.active(now);
        let waits_for_log = active && now.since(self.refilled) < PACE_REFILL;
        if !self.log_issued && !waits_for_log {
            // No log write came for a period: the budget goes now, and its period starts now
            // (else the next refill would come at once, and double it).
            self.log_issued = true;
            self.refilled = now;
        }
        let held = active
            && (!self.log_issued
                || (self.budget == 0
                    && (self.flushes_in_flight > 0 || now.since(self.refilled) < PACE_REFILL)));
        if self.budget == 0 && !held {
            self.refill(now);
        }
        self.held_at = held.then_some(now);
        held
    }

    /// The most bytes one async command may span now: the budget while it applies.
    fn span_max(&self, now: Time) -> Option<u64> {
        self.active(now).then_some(self.budget)
    }

    /// If the last look found async writes held, the latest time to look again: the next
    /// refill or the end of pacing, or with a flush in flight (whose completion refills) a
    /// period later. Always after that look.
    fn held_until(&self) -> Option<Time> {
        let at = self.held_at?;
        if self.flushes_in_flight > 0 {
            return Some(at.plus(PACE_REFILL));
        }
        let idle = self.log_flushed.map_or(at, |t| t.plus(PACE_LOG_IDLE));
        Some(self.refilled.plus(PACE_REFILL).min(idle))
    }

    /// Async writes of `len` bytes were issued at `now`: the command that crosses the budget
    /// still goes.
    fn spend(&mut self, len: u64, now: Time) {
        self.budget = self.budget.saturating_sub(len);
        if let Some(deadline) = &mut self.deadline {
            deadline.issued(len, now);
        }
    }

    /// An async write of `len` bytes was queued at `now`. The first of a sync cuts what the
    /// last refill gave (before the sync's deadline was known) to its share.
    fn async_queued(&mut self, len: u64, now: Time) {
        let Some(deadline) = &mut self.deadline else { return };
        if deadline.queued(len, now) {
            self.budget = self.budget.min(deadline.budget(now, self.refilled));
        }
    }

    /// An async write of `len` bytes left the queue (issued, or dropped with it).
    fn async_taken(&mut self, len: u64) {
        if let Some(deadline) = &mut self.deadline {
            assert!(
                deadline.backlog >= len,
                "vdev queue: async bytes taken that were never queued"
            );
            deadline.backlog -= len;
        }
    }
}

/// `vdev.sync_pace_bytes=auto`: each refill lets through the sync's planned rate for the time
/// since the last. The plan spreads as many bytes as the sync before wrote here over half the
/// txg interval (measured between the starts of the last two syncs): consecutive syncs of a
/// steady load write about as much, and half the interval leaves the sync room to end before
/// the next one starts.
///
/// The share a flush must carry is the sync's rate over the flush rate: about 16 KiB for a
/// lone client of 4 KiB write + flush into 16 KiB blocks and about 128 KiB for eight, on the
/// VM of docs/bench/peers-notes.md (2026-12-02); the plan finds both without knowing the
/// clients. It is planned from the last sync, not from what is queued: the sync keeps only a
/// few spans of writes in flight (`SPANS_IN_FLIGHT`), so its queue here says little about how
/// much it will write (a first version that spread the queued bytes up to the deadline held
/// the sync to a crawl early and let it burst late). A sync that outgrows the plan gets more
/// where its queue asks for it, and past its deadline twice the planned rate, never less
/// than its queue over `PACE_AUTO_LATE`. The first sync, with no plan, is not held.
#[derive(Debug, Default)]
struct SyncDeadline {
    /// Async bytes queued here and not yet issued.
    backlog: u64,
    /// When an async write was last queued or issued: a longer gap starts a sync.
    last_async: Option<Time>,
    /// When the current sync's first write was queued.
    started: Option<Time>,
    /// Async bytes the current sync has issued here.
    written: u64,
    /// The current sync's plan: the bytes the last one wrote, the time to spread them over,
    /// and when that time ends.
    plan: Option<(u64, std::time::Duration, Time)>,
}

impl SyncDeadline {
    /// Counts a queued async write; true if it starts a sync.
    fn queued(&mut self, len: u64, now: Time) -> bool {
        let idle = self.last_async.is_none_or(|at| now.since(at) >= PACE_AUTO_SYNC_GAP);
        // A few writes apart from a sync's (the last sync's uberblock, a pause in one sync)
        // are no sync to plan by: what follows them counts as theirs.
        let starts = idle
            && self.backlog == 0
            && (self.started.is_none() || self.written >= PACE_AUTO_SYNC_BYTES_MIN);
        if starts {
            self.plan = self.started.map(|start| {
                let span =
                    (now.since(start) / PACE_AUTO_INTERVAL_SHARE).min(PACE_AUTO_DEADLINE_MAX);
                (self.written, span, now.plus(span))
            });
            self.started = Some(now);
            self.written = 0;
        }
        self.backlog += len;
        self.last_async = Some(now);
        starts
    }

    /// Async writes of `len` bytes were issued at `now`.
    fn issued(&mut self, len: u64, now: Time) {
        self.written += len;
        self.last_async = Some(now);
    }

    /// The budget of a refill at `now`, the last having been at `since`: the plan's rate for
    /// the time since then (at least `PACE_REFILL`, the period a refill without a flush waits,
    /// and at most `PACE_LOG_IDLE`, after which pacing has ended anyway), or the queue's share
    /// of the time left if that is more; past the deadline twice the rate, or the queue's share
    /// of `PACE_AUTO_LATE`. Everything for the first sync.
    fn budget(&self, now: Time, since: Time) -> u64 {
        let Some((bytes, span, due)) = self.plan else { return u64::MAX };
        let period = now.since(since).clamp(PACE_REFILL, PACE_LOG_IDLE).as_nanos();
        let share = |bytes: u64, over: std::time::Duration| {
            u128::from(bytes) * period / over.as_nanos().max(1)
        };
        let planned = share(bytes, span);
        let budget = if now < due {
            planned.max(share(self.backlog, due.since(now).max(PACE_AUTO_LATE)))
        } else {
            (2 * planned).max(share(self.backlog, PACE_AUTO_LATE))
        };
        u64::try_from(budget).unwrap_or(u64::MAX).max(PACE_AUTO_BUDGET_MIN)
    }
}

fn limits_auto(limits: &QueueLimits) -> bool {
    limits.auto_depth
}

/// Depth the controller starts from (ZFS's sync read maximum).
const DEPTH_AUTO_INITIAL: u32 = 10;
const DEPTH_AUTO_MAX: u32 = 1024;
/// While sync or log writes share the device, a step up is kept only if throughput grows at
/// least this much relative to the depth: (gain in throughput / throughput) >= this x (added
/// depth / depth). Every added slot is then latency for a write that queues behind it in the
/// device (seed 003), so depth is bought only where it pays (on a 2 ms cloud disk 10 -> 12
/// has elasticity 0.65, 12 -> 15 about 0.05).
const DEPTH_AUTO_ELASTICITY_MIN: f64 = 0.25;
/// ... and by at least this fraction, so measurement noise alone never deepens the queue.
const DEPTH_AUTO_GAIN_MIN: f64 = 0.01;
/// With only throughput classes on the device, a step up is kept when it gains at least
/// this much, whatever the elasticity. Their demand exceeds the depth (only such windows
/// count), so the I/Os not in the device wait in this queue instead, and by Little's law a
/// deeper queue that moves more bytes lowers their time from queued to done as well. The
/// elasticity rule there held scattered 16 KiB reads at a depth of 4-8 on this VM's disk,
/// which gives about 20% more per fourfold depth up to 256 (elasticity about 0.07; 1 MiB
/// sequential reads of a volume random writes had scattered, 2026-11-27).
const DEPTH_AUTO_GAIN_ALONE_MIN: f64 = 0.02;
/// The most sync reads get while no sync or log write shares the device (unless writes had
/// held the depth deeper): when one comes, it waits behind at most this many.
const DEPTH_AUTO_ALONE_MAX: u32 = 256;
/// The queue is alone once no sync or log write has arrived for this long. A client that
/// syncs now and then beside a stream of reads keeps it from deepening; one that stopped
/// writing lets it.
const DEPTH_AUTO_ALONE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
/// Alone, windows last at least this long. Scattered reads gain a few percent per quarter
/// more depth, less than this VM's disk swings between windows of a few dozen milliseconds:
/// with quarter steps and short windows the depth wandered between 23 and 57 and read no
/// faster than before. A fifth of a second averages the swings out.
const DEPTH_AUTO_ALONE_WINDOW: std::time::Duration = std::time::Duration::from_millis(200);
/// A step down may lose at most this fraction.
const DEPTH_AUTO_LOSS_MAX: f64 = 0.01;
/// Windows to stay put after a failed probe before probing again.
const DEPTH_AUTO_HOLD_WINDOWS: u32 = 8;
/// A window must have seen queued demand at this share of its completions to count.
const DEPTH_AUTO_SATURATED_SHARE: f64 = 0.9;

/// Chooses the throughput classes' depth by hill climbing on measured throughput (bytes per
/// second of completed I/O), counting only windows in which demand exceeded the depth: an idle
/// or lightly loaded queue says nothing about what a deeper one would do.
#[derive(Debug)]
pub struct DepthController {
    depth: u32,
    /// Throughput measured at the depth a probe started from.
    baseline: Option<f64>,
    /// The depth a probe left, and whether it went up.
    probe: Option<(u32, bool)>,
    next_probe_up: bool,
    hold: u32,
    window_start: Option<Time>,
    window_bytes: u64,
    window_completions: u32,
    window_saturated: u32,
    /// Completions still to ignore after a depth change: I/Os issued at the old depth would
    /// make the new one look like the old (measured: without this, steps down always looked
    /// free and the depth drifted to 2 on HDDs).
    warm_up: u32,
    /// Depth changes so far (for tests and status).
    pub changes: u32,
    /// Whether the queue may go alone at all (non-rotational leaves). An HDD's windows at a
    /// depth of 256 last half a minute (24 x depth completions at a few hundred a second), so
    /// the search down from the top never finished in seed 002's runs and its mirrors read
    /// 15-20% slower (simulated, 2026-11-27).
    deepen_alone: bool,
    /// When the last sync or log write arrived.
    last_write: Option<Time>,
    /// No sync or log write for [`DEPTH_AUTO_ALONE_AFTER`]: the depth is the sync reads'.
    alone: bool,
    /// Alone: the throughput last measured at the top ([`DepthController::depth_max`]).
    top: Option<f64>,
    /// The depth the controller had judged when the time alone began: what the classes other
    /// than sync reads keep meanwhile, and where the depth returns when writes come back.
    shared_depth: u32,
}

impl DepthController {
    fn new(deepen_alone: bool) -> DepthController {
        DepthController {
            deepen_alone,
            depth: DEPTH_AUTO_INITIAL,
            baseline: None,
            probe: None,
            next_probe_up: true,
            hold: 0,
            window_start: None,
            window_bytes: 0,
            window_completions: 0,
            window_saturated: 0,
            warm_up: 0,
            changes: 0,
            last_write: None,
            alone: false,
            top: None,
            shared_depth: DEPTH_AUTO_INITIAL,
        }
    }

    /// The depth `class` (a throughput class) may use: all of it, except that alone the
    /// depth above the one held with writes is the sync reads'. A scrub, a resilver or the
    /// txg sync's writes taking it would put a client's read behind up to 256 of theirs in the
    /// device (seconds on an HDD).
    fn class_depth(&self, class: IoClass) -> u32 {
        if class == IoClass::SyncRead || self.depth_is_shared() {
            self.depth
        } else {
            self.shared_depth
        }
    }

    /// The most the depth may be now.
    fn depth_max(&self) -> u32 {
        if self.alone {
            DEPTH_AUTO_ALONE_MAX.max(self.shared_depth)
        } else {
            DEPTH_AUTO_MAX
        }
    }

    /// A sync or log write arrived. After a time alone the depth returns at once to the one
    /// held with writes, so the write that ends it waits behind at most
    /// [`DEPTH_AUTO_ALONE_MAX`] reads in the device and the next ones behind the usual depth.
    fn write_arrived(&mut self, now: Time) {
        self.last_write = Some(now);
        if self.alone {
            self.alone = false;
            self.start_over();
        }
    }

    /// A new regime starts from the depth judged with writes, with nothing carried over: no
    /// probe, baseline, hold or part of a window.
    fn start_over(&mut self) {
        self.probe = None;
        self.baseline = None;
        self.hold = 0;
        self.reset_window();
        self.set_depth(self.shared_depth);
    }

    /// Whether every throughput class may use the whole depth (not alone above the depth
    /// judged with writes, which is the sync reads' only).
    fn depth_is_shared(&self) -> bool {
        !self.alone || self.depth <= self.shared_depth
    }

    /// A window begun under one regime is not judged under the other.
    fn reset_window(&mut self) {
        self.window_start = None;
        self.window_bytes = 0;
        self.window_completions = 0;
        self.window_saturated = 0;
    }

    /// No sync or log write came for a while: what held the depth with writes around (a
    /// failed probe's hold, the direction) says nothing now, and a hold of eight windows of a
    /// fifth of a second each would keep the depth shallow for most of a short job. A probe
    /// in flight is undone: the depth kept is the one judged.
    fn enter_alone(&mut self) {
        self.shared_depth = self.probe.map_or(self.depth, |(from, _)| from);
        self.alone = true;
        self.next_probe_up = true;
        self.top = None;
        self.start_over();
    }

    /// The depth one step up or down from here: a quarter more or less; alone on the device,
    /// straight up to the most allowed, or down by half to no less than the depth judged with
    /// writes. Doubling from the depth writes had
    /// held took five windows, a second, to reach the 160 a stream of scattered reads wanted
    /// (2026-11-27); from the top, halving finds where depth stops paying in fewer.
    fn stepped(&self, up: bool) -> u32 {
        let step = (self.depth / 4).max(1);
        match (self.alone, up) {
            (false, true) => self.depth + step,
            (false, false) => self.depth - step.min(self.depth - 1),
            (true, true) => self.depth_max(),
            // Never below the depth judged with writes: alone is for deepening.
            (true, false) => (self.depth / 2).max(self.shared_depth.min(self.depth)),
        }
    }

    fn set_depth(&mut self, depth: u32) {
        let depth = depth.clamp(1, self.depth_max());
        if depth != self.depth {
            self.changes += 1;
            self.warm_up = self.depth.max(depth);
            self.reset_window();
        }
        self.depth = depth;
    }

    fn completed(&mut self, bytes: u64, saturated: bool, now: Time) {
        let quiet = self.last_write.is_none_or(|at| now.since(at) >= DEPTH_AUTO_ALONE_AFTER);
        if quiet && self.deepen_alone && !self.alone {
            self.enter_alone();
        }
        if self.warm_up > 0 {
            self.warm_up -= 1;
            return;
        }
        let start = *self.window_start.get_or_insert(now);
        self.window_bytes += bytes;
        self.window_completions += 1;
        self.window_saturated += u32::from(saturated);
        // Long enough to average over the device's own reordering.
        // By Little's law n x depth completions span about n mean latencies; 24 of them
        // average out where in its service each window happens to cut.
        if self.window_completions < (24 * self.depth).max(64) {
            return;
        }
        let elapsed = now.since(start).as_secs_f64();
        if self.alone && elapsed < DEPTH_AUTO_ALONE_WINDOW.as_secs_f64() {
            return;
        }
        let valid = f64::from(self.window_saturated)
            >= f64::from(self.window_completions) * DEPTH_AUTO_SATURATED_SHARE;
        let throughput = if elapsed > 0.0 { self.window_bytes as f64 / elapsed } else { 0.0 };
        self.window_start = Some(now);
        self.window_bytes = 0;
        self.window_completions = 0;
        self.window_saturated = 0;
        if valid && throughput > 0.0 {
            self.judge(throughput);
        }
    }

    fn judge(&mut self, throughput: f64) {
        if self.alone && self.depth == self.depth_max() {
            self.top = Some(throughput);
        }
        match (self.probe, self.baseline) {
            (Some((from, up)), Some(baseline)) => {
                let kept = if up {
                    let gain = throughput / baseline - 1.0;
                    if self.alone {
                        gain >= DEPTH_AUTO_GAIN_ALONE_MIN
                    } else {
                        let added =
                            f64::from(self.depth.saturating_sub(from)) / f64::from(from.max(1));
                        gain > DEPTH_AUTO_GAIN_MIN && gain >= DEPTH_AUTO_ELASTICITY_MIN * added
                    }
                } else {
                    // Alone, a step down is judged against the top, so that losses of just
                    // under 1% a halving cannot add up, walk after walk, to a depth of 1.
                    let reference =
                        if self.alone { self.top.unwrap_or(baseline) } else { baseline };
                    throughput >= reference * (1.0 - DEPTH_AUTO_LOSS_MAX)
                };
                if kept {
                    // Keep going the same way from the new depth.
                    self.baseline = Some(throughput);
                    self.probe = Some((self.depth, up));
                    let next = self.stepped(up);
                    if next == self.depth {
                        self.probe = None;
                        if self.alone {
                            // At the top (or at 1): look the other way next window, so the
                            // knee below a kept jump is found at once.
                            self.next_probe_up = !up;
                        } else {
                            self.hold = DEPTH_AUTO_HOLD_WINDOWS;
                        }
                    }
                    self.set_depth(next);
                } else {
                    self.set_depth(from);
                    self.probe = None;
                    self.baseline = None;
                    self.hold = DEPTH_AUTO_HOLD_WINDOWS;
                    self.next_probe_up = !up;
                }
            }
            _ => {
                self.baseline = Some(throughput);
                if self.hold > 0 {
                    self.hold -= 1;
                    return;
                }
                let mut up = self.next_probe_up || self.depth == 1;
                let mut next = self.stepped(up);
                if next == self.depth {
                    // Already at the end this way (alone, at the top).
                    up = !up;
                    next = self.stepped(up);
                }
                self.probe = Some((self.depth, up));
                self.set_depth(next);
            }
        }
    }
}

#[cfg(test)]
mod tests;
