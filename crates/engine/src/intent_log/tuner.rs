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
//! The cap starts from the device class (rotational: 1; otherwise 8). It does not yet adapt
//! to measured latency: `docs/bench/seeds-zil.md` lists the pools and loads where a fixed cap
//! falls short of the better fixed policy.

use crate::pool::Pool;

/// Groups per vdev for a vdev with a rotational leaf.
const ROTATIONAL_GROUPS: u32 = 1;
/// Groups per vdev otherwise.
const SOLID_STATE_GROUPS: u32 = 8;

#[derive(Debug)]
pub struct GroupTuner {
    cap: u32,
    rotational: bool,
}

impl GroupTuner {
    /// The starting cap for `pool`'s top-level vdevs: the solid-state one unless every
    /// top-level vdev has a rotational leaf.
    pub fn for_pool(pool: &Pool) -> GroupTuner {
        let tops = pool.root().top_level();
        let rotational = !tops.is_empty()
            && tops.iter().all(|top| top.leaves().iter().any(|l| l.is_rotational()));
        let cap = if rotational { ROTATIONAL_GROUPS } else { SOLID_STATE_GROUPS };
        GroupTuner { cap, rotational }
    }

    /// Groups that may be in flight per top-level vdev.
    pub fn cap(&self) -> u32 {
        self.cap
    }

    /// Whether every top-level vdev has a rotational leaf.
    pub fn rotational(&self) -> bool {
        self.rotational
    }
}
