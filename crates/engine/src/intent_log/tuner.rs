//! How many log groups the `auto` commit policy lets start on each top-level vdev before the
//! earlier ones are durable.
//!
//! A group is every record ready when it is formed, written in one or more blocks on one vdev
//! and made durable by one flush. One group per vdev at a time is a batch per device: on a
//! disk with one actuator every extra group in flight only adds a write command and a flush of
//! the drive's cache, where one bigger group pays once (measured in the simulator: on one HDD,
//! batches with one group per vdev beat both fixed policies at every writer count). A device
//! with parallel channels runs several flushes at once, so more groups in flight lower the
//! latency until the channels are busy; on the simulated 8-channel SSD 8 groups per vdev did
//! best of 1 to 64.
//!
//! The cap comes from the device class of the vdevs that hold log blocks (the log devices
//! when the pool has any), one cap for all of them: 1 if every one has a leaf whose flushes
//! cannot overlap and one of them is rotational (a disk); 2 if so and none is rotational (a
//! file: its leaf completes one durable write at a time); else 8. On a file a second group starts beside the first only once
//! it carries an even share of everything outstanding, never on a timeout and never by
//! splitting what is ready over free slots: a small group beside another only adds a flush (on
//! this project's VM, 8 groups per file leaf were 7% to 12% behind batch at 8 and 32
//! write+flush clients, and two groups that started on the commit timeout flushed 0.46 times
//! per operation against pipelined's 0.35), while one group per file leaf left the writers of
//! the next group waiting for the whole of the first (8 write + flush clients: plain writes
//! 12 to 65 us slower at the median than under pipelined in every run on one core; with two,
//! the fastest of the three policies in a 12-round run; docs/bench/peers-zil-auto.md).
//! What the log measures decides the rest (intent_log/mod.rs: group sizes from what is
//! outstanding, the next block's place from which groups will finish first, its size from
//! what groups carried, a short wait from the measured group latency); with that, a cap per
//! class is within 5% of the better fixed policy at every point of `docs/bench/seeds-zil.md`.
//! The cap itself does not follow measured latency yet; `intent_log.groups_per_vdev` sets it
//! by hand.

use crate::pool::Pool;

/// Groups per vdev for a vdev with a rotational leaf.
const SERIAL_GROUPS: u32 = 1;
/// Groups per vdev for a vdev whose leaves' flushes do not overlap but are not rotational (a
/// file): a second group, once it carries an even share of what is outstanding.
const SHARED_GROUPS: u32 = 2;
/// Groups per vdev otherwise.
const PARALLEL_GROUPS: u32 = 8;

#[derive(Clone, Debug)]
pub struct GroupTuner {
    cap: u32,
    rotational: bool,
    /// A group starts beside another only once it carries an even share of what is
    /// outstanding (see [`GroupTuner::waits_for_share`]).
    waits_for_share: bool,
    /// The top-level vdevs log blocks go to: the log devices when the pool has any (the
    /// allocator falls back to the others only when they are full), else every vdev.
    holds_log: Vec<bool>,
}

impl GroupTuner {
    /// The cap for `pool`'s top-level vdevs that hold log blocks, from their device class
    /// (the module doc), unless `intent_log.groups_per_vdev` sets it.
    pub fn for_pool(pool: &Pool) -> GroupTuner {
        let root = pool.root();
        let tops = root.top_level();
        let config = pool.config();
        let top = |v: usize| config.top.get(v);
        let log_only: Vec<bool> = (0..tops.len()).map(|v| top(v).is_some_and(|t| t.log)).collect();
        let has_log_devices = log_only.iter().any(|&l| l);
        // A removed log device's hole holds nothing.
        let hole = |v: usize| top(v).is_some_and(|t| t.kind == sluice_format::TopKind::Hole);
        let holds_log: Vec<bool> = (log_only.iter().enumerate())
            .map(|(v, &l)| (l || !has_log_devices) && !hole(v))
            .collect();
        let log_tops = || tops.iter().zip(&holds_log).filter(|(_, &holds)| holds);
        let every = |f: fn(&crate::vdev::Leaf) -> bool| {
            !tops.is_empty() && log_tops().all(|(top, _)| top.leaves().iter().any(|l| f(l)))
        };
        let rotational = every(|l| l.is_rotational());
        let serial = every(|l| !l.parallel_flushes());
        // Files only: a pool that logs to a disk as well keeps one group per vdev, which the
        // disk needs (its extra flush costs a rotation).
        let any_rotational =
            log_tops().any(|(top, _)| top.leaves().iter().any(|l| l.is_rotational()));
        let shared = serial && !any_rotational;
        let cap = match pool.log_groups_per_vdev() {
            0 if shared => SHARED_GROUPS,
            0 if serial => SERIAL_GROUPS,
            0 => PARALLEL_GROUPS,
            set => set,
        };
        // A cap set by hand means that many groups, as on any vdev.
        let waits_for_share = shared && pool.log_groups_per_vdev() == 0;
        GroupTuner { cap, rotational, waits_for_share, holds_log }
    }

    /// Whether log blocks go to top-level vdev `vdev`.
    pub fn holds_log(&self, vdev: usize) -> bool {
        self.holds_log.get(vdev).copied().unwrap_or(false)
    }

    /// The top-level vdevs that hold log blocks.
    pub fn log_vdevs(&self) -> usize {
        self.holds_log.iter().filter(|&&h| h).count().max(1)
    }

    /// Groups that may be in flight on all the vdevs that hold log blocks.
    pub fn slots(&self) -> usize {
        self.cap as usize * self.holds_log.iter().filter(|&&h| h).count().max(1)
    }

    /// Groups that may be in flight per top-level vdev.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Whether a group may start while another is in flight on its vdev only once it carries
    /// an even share of what is outstanding, never on the commit timeout, and what is ready is
    /// split over at most one group per vdev, never over a vdev's two slots: on a leaf whose
    /// flushes do not overlap (a file), a small group beside another only adds a flush, while
    /// a full one lets the next group fill as the first is written.
    pub fn waits_for_share(&self) -> bool {
        self.waits_for_share
    }

    /// Whether every top-level vdev that holds log blocks has a rotational leaf.
    pub fn rotational(&self) -> bool {
        self.rotational
    }
}
