//! Fault-management events (ZFS: the zevent queue of `fm.c`, which `zpool events` lists and
//! ZED acts on): every change of a leaf's state, bursts of I/O and checksum errors, scrubs and
//! resilvers starting and ending, replacements, suspension and keys loaded, each with the
//! wall-clock time, the pool, the vdev and what else it says.
//!
//! A pool keeps the newest [`EVENTS_KEPT`] in memory, numbered from 1 in the order they were
//! posted (ZFS's eid). Followers ([`Events::follow`]) get the ones kept and then every new
//! one, without a gap between the two; the server writes each to its log and runs its event
//! hooks from one. Events are not persisted: like zevents they describe what this process
//! saw, and what lasts (leaf states, error counts, the last scan) is in the pool itself.
//!
//! Class names follow ZFS's with `sluice` in place of `zfs` (`ereport.fs.sluice.checksum`,
//! `resource.fs.sluice.statechange`, `sysevent.fs.sluice.scrub_finish`), so that a hook
//! named for ZED's subclasses (`statechange-notify.sh`) is found by the same rule.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::channel::mpsc;
use parking_lot::Mutex;

use crate::rt::Env;

/// Events a pool keeps for `pool events` (ZFS's `zfs_zevent_len_max` keeps 512); older ones
/// are dropped, and followers that were listening have had them.
pub const EVENTS_KEPT: usize = 1000;

/// What an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventClass {
    /// Checksum errors on a leaf: copies it returned that failed verification.
    Checksum,
    /// I/O errors on a leaf.
    Io,
    /// A leaf changed state (ONLINE, DEGRADED, FAULTED, OFFLINE).
    StateChange,
    ScrubStart,
    ScrubFinish,
    /// A scrub stopped, or canceled by a resilver or a failure.
    ScrubAbort,
    ResilverStart,
    ResilverFinish,
    /// A resilver ended with blocks it could not rebuild, or was canceled.
    ResilverAbort,
    /// A leaf was attached beside another or began replacing one.
    VdevAttach,
    /// A leaf left the pool (detached, or replaced and its replacement caught up).
    VdevDetach,
    /// A leaf's error counts and diagnosis were cleared (`pool clear`).
    VdevClear,
    /// The pool stopped writing: a sync failed (ZFS: `io_failure`).
    PoolSuspend,
    /// The pool writes again after a suspension.
    PoolResume,
    /// The pool was opened (imported or created) by this process.
    PoolImport,
    /// A volume's key was loaded.
    KeyLoad,
    /// A volume's key was unloaded.
    KeyUnload,
    /// A top-level vdev was added (`pool add`): one event per new leaf.
    VdevAdd,
    /// A log device or a hot spare was removed (`pool remove`): one event per leaf.
    VdevRemove,
    /// A hot spare began standing in for a leaf.
    VdevSpare,
    /// A hot spare could not be put in for a leaf that needs one.
    Retire,
    /// A volume's snapshot schedule took a snapshot (and pruned those its retention no
    /// longer keeps).
    SnapshotAuto,
    /// A scheduled scrub or snapshot could not be started or taken, or a snapshot pruned.
    Schedule,
}

impl EventClass {
    /// The part of the class a hook's name starts with (ZED's subclass).
    pub fn subclass(self) -> &'static str {
        match self {
            EventClass::Checksum => "checksum",
            EventClass::Io => "io",
            EventClass::StateChange => "statechange",
            EventClass::ScrubStart => "scrub_start",
            EventClass::ScrubFinish => "scrub_finish",
            EventClass::ScrubAbort => "scrub_abort",
            EventClass::ResilverStart => "resilver_start",
            EventClass::ResilverFinish => "resilver_finish",
            EventClass::ResilverAbort => "resilver_abort",
            EventClass::VdevAttach => "vdev_attach",
            EventClass::VdevDetach => "vdev_detach",
            EventClass::VdevClear => "vdev_clear",
            EventClass::PoolSuspend => "pool_suspend",
            EventClass::PoolResume => "pool_resume",
            EventClass::PoolImport => "pool_import",
            EventClass::KeyLoad => "key_load",
            EventClass::KeyUnload => "key_unload",
            EventClass::VdevAdd => "vdev_add",
            EventClass::VdevRemove => "vdev_remove",
            EventClass::VdevSpare => "vdev_spare",
            EventClass::Retire => "retire",
            EventClass::SnapshotAuto => "snapshot_auto",
            EventClass::Schedule => "schedule",
        }
    }

    /// The full class: an error report, a resource's change, or a system event.
    pub fn name(self) -> String {
        let family = match self {
            EventClass::Checksum | EventClass::Io | EventClass::Schedule | EventClass::Retire => {
                "ereport"
            }
            EventClass::StateChange => "resource",
            _ => "sysevent",
        };
        format!("{family}.fs.sluice.{}", self.subclass())
    }
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Its number: 1 for the pool's first in this process, one more for each after.
    pub eid: u64,
    /// When, in nanoseconds since the Unix epoch (UTC).
    pub unix_nanos: u64,
    pub class: EventClass,
    pub pool: String,
    /// The leaf (its path) the event is about, if it is about one.
    pub vdev: Option<String>,
    /// What else it says, as (name, value), in the order posted: for a state change `state`,
    /// `previous` and `reason`; for an error burst `errors` (since the event before) and
    /// `total`; for a scan's end its counts.
    pub details: Vec<(&'static str, String)>,
}

impl Event {
    /// The value of detail `name`, if the event has it.
    pub fn detail(&self, name: &str) -> Option<&str> {
        self.details.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// A pool's events: the newest kept, and the followers to tell of new ones.
#[derive(Debug)]
pub struct Events {
    pool: String,
    env: Env,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    kept: VecDeque<Arc<Event>>,
    next_eid: u64,
    followers: Vec<mpsc::UnboundedSender<Arc<Event>>>,
}

impl Events {
    pub fn new(env: &Env, pool: &str) -> Events {
        Events {
            pool: pool.to_owned(),
            env: env.clone(),
            inner: Mutex::new(Inner { next_eid: 1, ..Inner::default() }),
        }
    }

    /// Posts an event about `vdev` (a leaf's path), stamped now; returns its number.
    pub fn post(
        &self,
        class: EventClass,
        vdev: Option<&str>,
        details: Vec<(&'static str, String)>,
    ) -> u64 {
        let mut inner = self.inner.lock();
        let eid = inner.next_eid;
        inner.next_eid += 1;
        let event = Arc::new(Event {
            eid,
            unix_nanos: self.env.unix_nanos(),
            class,
            pool: self.pool.clone(),
            vdev: vdev.map(str::to_owned),
            details,
        });
        inner.followers.retain(|f| f.unbounded_send(Arc::clone(&event)).is_ok());
        inner.kept.push_back(event);
        while inner.kept.len() > EVENTS_KEPT {
            inner.kept.pop_front();
        }
        eid
    }

    /// The events kept, oldest first.
    pub fn list(&self) -> Vec<Arc<Event>> {
        self.inner.lock().kept.iter().cloned().collect()
    }

    /// The events kept, and a stream of every one posted after them: nothing posted between
    /// the two is missed or given twice. The stream ends when the pool is dropped.
    pub fn follow(&self) -> (Vec<Arc<Event>>, mpsc::UnboundedReceiver<Arc<Event>>) {
        let mut inner = self.inner.lock();
        let (sender, receiver) = mpsc::unbounded();
        inner.followers.push(sender);
        (inner.kept.iter().cloned().collect(), receiver)
    }

    /// Forgets the events kept (`pool events -c`); returns how many there were. Numbering goes
    /// on from where it was.
    pub fn clear(&self) -> usize {
        let mut inner = self.inner.lock();
        let count = inner.kept.len();
        inner.kept.clear();
        count
    }
}

/// Errors of one kind on one leaf, posted as bursts: the first at once, then at most one
/// event a second, each counting the errors since the one before (ZFS rate-limits its
/// ereports per vdev the same way, `zfs_checksum_events_per_second`). Errors past the last
/// event of a burst are counted in the next one and always in the leaf's totals.
#[derive(Debug, Default)]
pub(crate) struct Burst {
    last_posted: Option<crate::rt::Time>,
    unposted: u64,
}

/// The shortest time between two events of one kind of error on one leaf.
pub(crate) const BURST_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl Burst {
    /// Counts an error at `now`; returns how many to post now, if an event is due.
    pub(crate) fn note(&mut self, now: crate::rt::Time) -> Option<u64> {
        self.unposted += 1;
        let due = self.last_posted.is_none_or(|last| now.since(last) >= BURST_INTERVAL);
        if !due {
            return None;
        }
        self.last_posted = Some(now);
        Some(std::mem::take(&mut self.unposted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_post_the_first_error_then_one_event_a_second() {
        let mut burst = Burst::default();
        let at = |ms: u64| crate::rt::Time::from_nanos(ms * 1_000_000);
        assert_eq!(burst.note(at(0)), Some(1));
        assert_eq!(burst.note(at(10)), None);
        assert_eq!(burst.note(at(500)), None);
        assert_eq!(burst.note(at(1000)), Some(3));
        assert_eq!(burst.note(at(5000)), Some(1));
    }
}
