//! sluice's storage engine: devices, the vdev tree, device queues, tunables and stats.
//!
//! Layers, bottom up (DESIGN.md §1): [`device`] (the `BlockDevice` seam: files, block devices,
//! simulated disks), [`vdev`] (leaves with their queues, mirrors, the root), with [`tunables`]
//! and [`stats`] beside them and [`rt`] as the runtime seam; [`alloc`] hands out space on the
//! top-level vdevs. Pools, transaction groups, the
//! intent log, dedup and volumes build on these.
//!
//! Lock order (outer to inner; never held across an `.await`):
//! vdev submission queue -> sim device state. Nothing else takes two locks.

pub mod alloc;
pub mod dedup;
pub mod device;
pub mod intent_log;
pub mod objset;
pub mod pool;
pub mod rt;
pub mod stats;
pub mod tunables;
pub mod txg;
pub mod vdev;
pub mod volume;
