//! The per-leaf I/O scheduler (ZFS: `vdev_queue.c`; reference §4, seed 003).
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
//!
//! Why per-class maxima matter (seed 003): a sync write that reaches a device holding hundreds
//! of streaming reads waits behind all of them. Keeping reads below the depth leaves the write a
//! free slot, and keeping the depth shallow keeps the device's own queue short.
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
            limits,
            queued: HashMap::new(),
            by_class: Default::default(),
            by_offset: Default::default(),
            active: [0; IoClass::COUNT],
            active_total: 0,
            last_class: IoClass::COUNT - 1,
            last_end: 0,
            next_id: 0,
        }
    }

    pub fn queued_count(&self) -> usize {
        self.queued.len()
    }

    pub fn active_total(&self) -> u32 {
        self.active_total
    }

    pub fn active(&self, class: IoClass) -> u32 {
        self.active[class.index()]
    }

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
        self.queued.insert(id, (key, io));
    }

    /// The next command to send to the device, if the limits allow one.
    pub fn next_issue(&mut self) -> Option<Issue<T>> {
        if self.active_total >= self.limits.total_active_max {
            return None;
        }
        let class = self.class_to_issue()?;
        let id = self.pick_in_class(class)?;
        let slots = self.limits.total_active_max - self.active_total;
        let class_slots = self.limits.max_active[class.index()]
            .max(self.limits.min_active[class.index()])
            .saturating_sub(self.active[class.index()]);
        let members_max = if self.limits.count_members {
            slots.min(class_slots).max(1) as usize
        } else {
            usize::MAX
        };
        let issue = self.aggregate(id, members_max);
        let carried = if self.limits.count_members { issue.members.len() as u32 } else { 1 };
        self.active[class.index()] += carried;
        self.active_total += carried;
        self.last_class = class.index();
        self.last_end = issue.offset + issue.len;
        Some(issue)
    }

    /// Records that an issued command of `class` carrying `members` I/Os completed.
    pub fn done(&mut self, class: IoClass, members: usize) {
        let members =
            if self.limits.count_members { u32::try_from(members).unwrap_or(u32::MAX) } else { 1 };
        let active = &mut self.active[class.index()];
        assert!(
            *active >= members && self.active_total >= members,
            "vdev queue: completion of an I/O never issued"
        );
        *active -= members;
        self.active_total -= members;
    }

    fn class_to_issue(&self) -> Option<IoClass> {
        let waiting = |c: IoClass| !self.by_class[c.index()].is_empty();
        // Pass one: round-robin over classes below their minimum.
        for step in 1..=IoClass::COUNT {
            let class = IoClass::ALL[(self.last_class + step) % IoClass::COUNT];
            if waiting(class) && self.active[class.index()] < self.limits.min_active[class.index()]
            {
                return Some(class);
            }
        }
        // Pass two: priority order, below the maximum.
        IoClass::ALL.into_iter().find(|&class| {
            waiting(class) && self.active[class.index()] < self.limits.max_active[class.index()]
        })
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
        self.by_offset[dir_index(io.direction)].remove(&(io.offset, id));
        Some(io)
    }

    /// Removes `id` and up to `members_max - 1` neighbours it can absorb; returns them as one
    /// command.
    fn aggregate(&mut self, id: u64, members_max: usize) -> Issue<T> {
        let Some(seed) = self.take(id) else {
            unreachable!("vdev queue: picked I/O {id} is not queued");
        };
        let direction = seed.direction;
        let limit = self.limits.aggregation_limit_bytes;
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn limits(total: u32, read_max: u32) -> QueueLimits {
        let mut limits = QueueLimits::from_tunables(&Tunables::default(), false);
        limits.total_active_max = total;
        limits.max_active[IoClass::SyncRead.index()] = read_max;
        limits.min_active[IoClass::SyncRead.index()] = read_max.min(limits.min_active[0]);
        limits
    }

    fn io(class: IoClass, direction: Direction, offset: u64, len: u64) -> QueuedIo<u64> {
        QueuedIo { class, direction, offset, len, payload: offset }
    }

    /// A sync write queued behind many reads is issued as soon as the reads reach their class
    /// maximum, not after them (seed 003's fix).
    #[test]
    fn sync_write_passes_queued_reads() {
        let mut scheduler = Scheduler::new(limits(13, 12));
        for i in 0..40 {
            scheduler
                .enqueue(io(IoClass::SyncRead, Direction::Read, i * (1 << 20), 32768), Time::ZERO);
        }
        scheduler.enqueue(io(IoClass::SyncWrite, Direction::Write, 1 << 40, 8192), Time::ZERO);
        let mut issued = Vec::new();
        while let Some(issue) = scheduler.next_issue() {
            issued.push((issue.class, issue.offset));
        }
        assert_eq!(issued.len(), 13);
        assert_eq!(issued.iter().filter(|(c, _)| *c == IoClass::SyncRead).count(), 12);
        assert!(issued.contains(&(IoClass::SyncWrite, 1 << 40)));
    }

    /// Adjacent reads merge into one command up to the limit; writes need contiguity.
    #[test]
    fn adjacent_ios_aggregate() {
        let mut scheduler = Scheduler::new(limits(1000, 10));
        scheduler.enqueue(io(IoClass::AsyncRead, Direction::Read, 4096, 4096), Time::ZERO);
        scheduler.enqueue(io(IoClass::AsyncRead, Direction::Read, 0, 4096), Time::ZERO);
        scheduler.enqueue(io(IoClass::SyncRead, Direction::Read, 8192 + 4096, 4096), Time::ZERO);
        scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, 8192, 4096), Time::ZERO);
        scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, 16384, 4096), Time::ZERO);
        let first = scheduler.next_issue().unwrap();
        // Sync read first (priority), absorbing the two reads before it across a 4 KiB gap.
        assert_eq!((first.offset, first.len, first.members.len()), (0, 16384, 3));
        let second = scheduler.next_issue().unwrap();
        assert_eq!(second.direction, Direction::Write);
        assert_eq!(second.members.len(), 1, "writes 8192 and 16384 are not contiguous");
    }

    /// Every class below its minimum gets a turn before higher classes fill to their maxima.
    #[test]
    fn minimums_prevent_starvation() {
        let mut scheduler = Scheduler::new(limits(1000, 10));
        for i in 0..20 {
            scheduler.enqueue(io(IoClass::SyncRead, Direction::Read, i << 30, 4096), Time::ZERO);
            scheduler.enqueue(
                io(IoClass::Scrub, Direction::Read, (i << 30) + (1 << 29), 4096),
                Time::ZERO,
            );
        }
        let mut scrub = 0;
        while let Some(issue) = scheduler.next_issue() {
            scrub += u32::from(issue.class == IoClass::Scrub);
        }
        assert_eq!(scrub, 3, "scrub reaches its maximum of 3 only after its minimum turn");
        assert_eq!(scheduler.active(IoClass::SyncRead), 10);
    }

    proptest! {
        /// Whatever is queued and however commands complete, every queued I/O is issued exactly
        /// once, no command exceeds the aggregation limit (unless a single I/O does), and the
        /// active counts never exceed their maxima.
        #[test]
        fn everything_issues_once_within_limits(
            ios in proptest::collection::vec((0usize..6, any::<bool>(), 0u64..64, 1u64..4), 1..80),
            total in 1u32..16,
        ) {
            let mut limits = limits(total, 4);
            limits.aggregation_limit_bytes = 8 * 4096;
            let mut scheduler = Scheduler::new(limits.clone());
            for (n, (class, write, block, blocks)) in ios.iter().enumerate() {
                let direction = if *write { Direction::Write } else { Direction::Read };
                let io = QueuedIo { class: IoClass::ALL[*class], direction, offset: block * 4096, len: blocks * 4096, payload: n };
                scheduler.enqueue(io, Time(n as u64));
            }
            let mut seen = vec![false; ios.len()];
            let mut in_flight = Vec::new();
            loop {
                while let Some(issue) = scheduler.next_issue() {
                    prop_assert!(scheduler.active_total() <= limits.total_active_max);
                    for class in IoClass::ALL {
                        let cap = limits.max_active[class.index()].max(limits.min_active[class.index()]);
                        // A single I/O may always go when its class has a slot.
                        prop_assert!(scheduler.active(class) <= cap, "class {:?} over its maximum", class);
                    }
                    prop_assert!(issue.members.len() == 1 || issue.len <= limits.aggregation_limit_bytes);
                    for member in &issue.members {
                        prop_assert!(!seen[member.payload], "I/O issued twice");
                        seen[member.payload] = true;
                        prop_assert!(member.offset >= issue.offset && member.offset + member.len <= issue.offset + issue.len);
                    }
                    in_flight.push((issue.class, issue.members.len()));
                }
                match in_flight.pop() {
                    Some((class, members)) => scheduler.done(class, members),
                    None => break,
                }
            }
            prop_assert!(seen.iter().all(|s| *s), "some I/O was never issued");
            prop_assert_eq!(scheduler.queued_count(), 0);
        }
    }
}
