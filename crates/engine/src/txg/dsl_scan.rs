//! Scrub and resilver in the background while the pool serves (ZFS: `dsl_scan.c`).
//!
//! A scan walks the pool's trees in a fixed order (the pool directory and the space maps, the
//! dedup table's buckets and the blocks their entries name, then each volume by id and its
//! blocks by index, skipping the blocks it shares through the dedup table) and remembers how
//! far it got as a bookmark. The shared blocks are visited through the table, as ZFS does:
//! a shared block is born once but referenced from many places, and a reference added behind
//! the bookmark to an old block whose other references were then overwritten would otherwise
//! never be visited. (A table that grows its bucket count while a scan runs moves entries
//! between buckets; the bookmark may then pass some of them: a known gap.) It works in chunks: each chunk pins the newest synced txg in the
//! allocator (so no indirect block of that tree is handed out again while the walk reads it),
//! walks that txg's tree from the bookmark gathering up to `scan.chunk_bytes` of block
//! pointers, queues them in the allocator and unpins, sorts them by device offset (the heads
//! sweep instead of seeking), issues them `scan.ios_in_flight` at a time at the scrub I/O
//! class, and advances the bookmark. A queued block that is freed before its turn is not read
//! (its space may hold another block by then); one whose read or repair is in flight keeps its
//! space until that I/O ends (ZFS: `dsl_scan_freed`; crate::alloc's scan queue).
//! Between chunks the syncer goes on, so the next chunk walks a newer tree from the same
//! bookmark: blocks written meanwhile were born after the scan began and reached every leaf
//! in service, which is why only births in `[min_birth, max_birth]` are issued.
//!
//! - A **scrub** reads every copy of every block born up to the txg it started at, checks it
//!   against its pointer's checksum and rewrites bad copies from a good one.
//! - A **resilver** copies onto the leaves that missed writes (returned after being offline or
//!   faulted, or that had write errors) every block born after the newest txg each of them
//!   holds, reading a copy that verifies from another child; it writes without reading the
//!   stale copy first, as ZFS does for the ranges a leaf is known to miss. When it ends, each
//!   such leaf that stayed in service without a write error holds every txg again, so the
//!   syncs write its uberblocks once more (crate::pool, `write_uberblock`).
//!
//! A resilver starts by itself after a sync that leaves a leaf behind, and when a leaf comes
//! back online. It takes precedence: a running scrub is canceled (as `zpool` does), and a
//! scrub is refused while a resilver runs. A resilver cannot be stopped; a scrub can be
//! paused, resumed and stopped.
//!
//! Each txg's pool directory carries the scan's record (what, where its bookmark is, its
//! figures), so a scan interrupted by an export or a crash goes on from its bookmark when the
//! pool is served again; a paused scrub stays paused. A resumed resilver finishes the range
//! it had, `[min_birth, max_birth]`, and its leaves are then known to hold up to `max_birth`
//! only (what they missed while the pool was closed is not known), so the next sync starts a
//! resilver of the txgs after it, if any. A leaf that is further behind than the record's
//! range (it was attached or went missing since) starts a new resilver instead.
//!
//! Why a bookmark and chunks rather than one walk of one pinned tree: a pin holds back every
//! free made after its txg, so one walk of a large pool under a write load would hold back
//! the space of everything overwritten for its whole duration.

use std::sync::Arc;

use futures::StreamExt;
use sluice_format::{
    BlockKind, BlockPointer, DdtBucket, PoolDirectory, ScanBookmark, ScanKind, ScanRecord,
    ScanRecordPhase, TreeRef, BLKPTR_BYTES,
};

use super::spa::Spa;
use super::{Store, StoreError};
use crate::fm::EventClass;
use crate::pool::{Pool, PoolError};
use crate::rt::Time;
use crate::tunables::IoClass;
use crate::vdev::{ScrubOutcome, VdevId};

/// What a scan does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanFunc {
    Scrub,
    Resilver,
}

impl ScanFunc {
    pub fn name(self) -> &'static str {
        match self {
            ScanFunc::Scrub => "scrub",
            ScanFunc::Resilver => "resilver",
        }
    }
}

/// Where a scan is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanPhase {
    Scanning,
    Finished,
    Canceled,
}

/// A scan's progress and findings, as `pool status` shows them.
#[derive(Clone, Debug)]
pub struct ScanStatus {
    pub func: ScanFunc,
    pub phase: ScanPhase,
    pub paused: bool,
    /// Blocks born in `[min_birth, max_birth]` are issued.
    pub min_birth: u64,
    pub max_birth: u64,
    pub started: Time,
    pub ended: Option<Time>,
    /// Wall-clock (UTC) seconds since the Unix epoch when the scan began and ended, as the
    /// directory records them: what "last scrubbed" and the scrub schedule count from.
    pub started_unix_secs: u64,
    pub ended_unix_secs: Option<u64>,
    /// Seconds spent scanning before this import (the scan resumed from a pool directory).
    pub earlier_secs: u64,
    /// Volume bytes (logical) the walk has passed, of `total_bytes`, as of the last chunk.
    pub examined_bytes: u64,
    pub total_bytes: u64,
    /// Blocks and bytes (as stored) read and checked, or copied.
    pub issued_blocks: u64,
    pub issued_bytes: u64,
    /// Copies rewritten (a scrub's repairs, a resilver's copies).
    pub repaired_copies: u64,
    pub repaired_bytes: u64,
    /// Copies that failed to read or verify.
    pub errors: u64,
    /// Blocks with no good copy anywhere.
    pub unrecoverable: u64,
    /// The leaves a resilver copies onto, by path.
    pub targets: Vec<String>,
    /// Why the scan ended early, when a tree could not be read.
    pub failure: Option<String>,
}

impl ScanStatus {
    /// Seconds spent scanning, across imports, as of `now`.
    pub fn run_secs(&self, now: Time) -> u64 {
        self.earlier_secs + self.ended.unwrap_or(now).since(self.started).as_secs()
    }

    /// Share of the walk done, from 0 to 1.
    pub fn progress(&self) -> f64 {
        match self.phase {
            ScanPhase::Finished => 1.0,
            _ if self.total_bytes == 0 => 0.0,
            _ => (self.examined_bytes as f64 / self.total_bytes as f64).min(1.0),
        }
    }
}

/// How far the walk got: everything before it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Bookmark {
    /// The pool directory and the space maps come first.
    Start,
    /// The dedup table's buckets, from `block` on.
    Ddt {
        block: u64,
    },
    /// Volume `id`, from data block `block` on.
    Volume {
        id: u64,
        block: u64,
    },
    Done,
}

/// A leaf a resilver copies onto.
#[derive(Clone, Copy, Debug)]
struct Target {
    guid: u64,
    id: VdevId,
    /// The writes it had missed when the txg after the resilver's last birth opened
    /// ([`crate::pool::Pool::mark_caught_up`]); `u64::MAX` when not known (a resilver resumed
    /// at import), so that it is never taken to hold the txgs after the resilver's range.
    missed_then: u64,
    /// Its [`crate::vdev::Leaf::resilver_misses`] when it became a target: a copy it did not
    /// take since means the resilver does not credit it.
    resilver_misses: u64,
}

impl Target {
    fn of(leaf: &crate::pool::PoolLeaf, missed_then: u64) -> Target {
        Target {
            guid: leaf.guid,
            id: leaf.leaf.id(),
            missed_then,
            resilver_misses: leaf.leaf.resilver_misses(),
        }
    }
}

/// The scan's shared state (`Scan::state`, held by `Dsl`).
#[derive(Debug)]
pub(super) struct ScanState {
    status: Option<ScanStatus>,
    bookmark: Bookmark,
    /// Leaves a resilver copies onto.
    targets: Vec<Target>,
    /// The leaves behind (guid, writes missed) when a resilver last ended with blocks it
    /// could not copy: it is not started again for the same leaves until something changes,
    /// or it would run after every sync.
    gave_up: Option<Vec<(u64, u64)>>,
    /// A task is working on the scan.
    running: bool,
    pause_requested: bool,
    /// Counts the scans begun; a chunk's results count only for the scan it was run for (one
    /// stopped or replaced meanwhile keeps the figures it had).
    generation: u64,
    /// The store is closing: the task stops after its chunk without changing the status.
    halt: bool,
    /// A resilver was asked for while one ran (another leaf fell behind): run again after.
    resilver_again: bool,
    /// Woken whenever the task stops.
    stopped: Vec<futures::channel::oneshot::Sender<()>>,
    /// Client requests answered so far (all volumes), and when that count last moved: the
    /// scan yields while it moved within `scan.idle_ms`.
    client_requests: u64,
    clients_seen: Time,
    /// When the counters were last summed: at most once a millisecond, not per run issued.
    clients_checked: Time,
    /// Where a snapshot change moved the bookmark back to: a chunk in flight, which walked
    /// the trees as they were, ends no later (`Scan::rewind`).
    rewind: Option<Bookmark>,
}

/// The background scan (ZFS: `dsl_scan_t`): its state behind its own lock, and the settings
/// it runs with. This file alone changes it.
#[derive(Debug)]
pub(super) struct Scan {
    state: parking_lot::Mutex<ScanState>,
    /// `scan.chunk_bytes` and `scan.ios_in_flight`.
    chunk_bytes: u64,
    ios_in_flight: usize,
    /// `scan.idle_ms` and `scan.busy_delay_ms` (yielding to clients).
    idle: std::time::Duration,
    busy_delay: std::time::Duration,
}

impl Scan {
    pub(super) fn new(tunables: &crate::tunables::Tunables) -> Scan {
        use crate::tunables::Tunable;
        Scan {
            state: parking_lot::Mutex::new(ScanState::new()),
            chunk_bytes: tunables.get(Tunable::ScanChunkBytes).max(1),
            ios_in_flight: usize::try_from(tunables.get(Tunable::ScanIosInFlight))
                .unwrap_or(32)
                .max(1),
            idle: std::time::Duration::from_millis(tunables.get(Tunable::ScanIdleMs)),
            busy_delay: std::time::Duration::from_millis(tunables.get(Tunable::ScanBusyDelayMs)),
        }
    }

    /// The scan's state (crate::txg's lock order: after the sync's lock, before the namespace).
    fn lock(&self) -> parking_lot::MutexGuard<'_, ScanState> {
        self.state.lock()
    }
}

impl ScanState {
    fn new() -> ScanState {
        ScanState {
            status: None,
            bookmark: Bookmark::Done,
            targets: Vec::new(),
            running: false,
            pause_requested: false,
            generation: 0,
            halt: false,
            resilver_again: false,
            gave_up: None,
            stopped: Vec::new(),
            client_requests: 0,
            clients_seen: Time::ZERO,
            clients_checked: Time::ZERO,
            rewind: None,
        }
    }

    fn active(&self) -> Option<&ScanStatus> {
        self.status.as_ref().filter(|s| s.phase == ScanPhase::Scanning)
    }

    /// Ends the current scan, if it is still scanning, and posts its end.
    fn end(&mut self, pool: &Pool, phase: ScanPhase) {
        let now = pool.env().now();
        if let Some(status) = self.status.as_mut().filter(|s| s.phase == ScanPhase::Scanning) {
            status.phase = phase;
            status.ended = Some(now);
            status.ended_unix_secs = Some(unix_secs(pool));
            if status.func == ScanFunc::Scrub && phase == ScanPhase::Finished {
                // What the scrub schedule counts from, kept apart from the scan record, which
                // the next resilver replaces.
                pool.note_scrub_finished(unix_secs(pool));
            }
            status.paused = false;
            self.bookmark = Bookmark::Done;
            self.pause_requested = false;
            let class = match (status.func, phase, status.unrecoverable) {
                (ScanFunc::Scrub, ScanPhase::Finished, _) => EventClass::ScrubFinish,
                (ScanFunc::Scrub, _, _) => EventClass::ScrubAbort,
                (ScanFunc::Resilver, ScanPhase::Finished, 0) => EventClass::ResilverFinish,
                (ScanFunc::Resilver, _, _) => EventClass::ResilverAbort,
            };
            let mut details = vec![
                ("examined_bytes", status.examined_bytes.to_string()),
                ("repaired_bytes", status.repaired_bytes.to_string()),
                ("errors", status.errors.to_string()),
                ("unrecoverable", status.unrecoverable.to_string()),
                ("seconds", status.run_secs(now).to_string()),
            ];
            if !status.targets.is_empty() {
                details.push(("targets", status.targets.join(",")));
            }
            if let Some(failure) = &status.failure {
                details.push(("failure", failure.clone()));
            }
            pool.events().post(class, None, details);
        }
    }

    /// Begins a resilver of the leaves `behind`, posting its start unless it `continues` one
    /// (the pass a finished resilver goes on with: `Scan::finish`).
    fn begin_resilver(&mut self, pool: &Pool, behind: &[(u64, u64, u64)], continues: bool) {
        let tree = pool.tree();
        let min_birth = behind.iter().map(|&(_, held, _)| held + 1).min().unwrap_or(1);
        let found: Vec<_> = behind
            .iter()
            .filter_map(|&(guid, _, missed)| {
                tree.leaves.iter().find(|l| l.guid == guid).map(|l| (l, missed))
            })
            .collect();
        self.targets = found.iter().map(|(l, missed)| Target::of(l, *missed)).collect();
        let paths = found.iter().map(|(l, _)| l.path.clone()).collect();
        let txg = pool.uberblock().txg;
        self.status = Some(new_status(pool, ScanFunc::Resilver, min_birth, txg, paths));
        self.bookmark = Bookmark::Start;
        self.generation += 1;
        self.pause_requested = false;
        self.resilver_again = false;
        self.gave_up = None;
        if !continues {
            let targets = self.status.as_ref().map_or_else(String::new, |s| s.targets.join(","));
            pool.events().post(
                EventClass::ResilverStart,
                None,
                vec![("targets", targets), ("min_txg", min_birth.to_string())],
            );
        }
    }
}

/// What [`Scan::take_resilver`] decided.
enum Resilver {
    /// None runs: the pool is closing, or the same leaves were given up on.
    No,
    /// One already runs.
    Running,
    /// One begins: the caller starts the task.
    Begun,
}

fn refused(pool: &Pool, reason: &str) -> StoreError {
    StoreError::ScanRefused { pool: pool.name().to_owned(), reason: reason.to_owned() }
}

/// The leaves behind with what each has missed by now, to tell a new reason to resilver
/// from the one a resilver gave up on.
fn behind_now(pool: &Pool, behind: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
    let leaves = pool.leaves();
    behind
        .iter()
        .filter_map(|&(guid, _, _)| leaves.iter().find(|l| l.guid == guid))
        .map(|l| (l.guid, l.leaf.writes_missed()))
        .collect()
}

/// 2020-01-01T00:00:00Z: a recorded scan time before it came from a monotonic clock.
const WALL_CLOCK_SECS_MIN: u64 = 1_577_836_800;

/// The wall clock's seconds since the Unix epoch.
fn unix_secs(pool: &Pool) -> u64 {
    pool.env().unix_nanos() / 1_000_000_000
}

fn new_status(
    pool: &Pool,
    func: ScanFunc,
    min_birth: u64,
    max_birth: u64,
    targets: Vec<String>,
) -> ScanStatus {
    ScanStatus {
        func,
        phase: ScanPhase::Scanning,
        paused: false,
        min_birth,
        max_birth,
        started: pool.env().now(),
        ended: None,
        started_unix_secs: unix_secs(pool),
        ended_unix_secs: None,
        earlier_secs: 0,
        examined_bytes: 0,
        total_bytes: 0,
        issued_blocks: 0,
        issued_bytes: 0,
        repaired_copies: 0,
        repaired_bytes: 0,
        errors: 0,
        unrecoverable: 0,
        targets,
        failure: None,
    }
}

/// Largest run of back-to-back blocks a resilver copies as one I/O (the size the syncs write
/// spans of).
const SPAN_BYTES_MAX: u64 = crate::zio::WRITE_SPAN_BYTES_MAX;

/// Cuts blocks sorted by device offset into the runs issued together: with `spans` (a
/// resilver), blocks with one copy each that lie back to back on one vdev, up to
/// [`SPAN_BYTES_MAX`]; otherwise one block per run.
fn runs_of(sorted: &[BlockPointer], spans: bool) -> Vec<Vec<BlockPointer>> {
    let mut runs: Vec<Vec<BlockPointer>> = Vec::new();
    let mut run_bytes = 0u64;
    for &bp in sorted {
        let single = bp.copies().count() == 1;
        let joins = spans
            && single
            && runs.last().and_then(|run| run.last()).is_some_and(|last| {
                let (Some(a), Some(b)) = (last.copies().next(), bp.copies().next()) else {
                    return false;
                };
                last.copies().count() == 1
                    && a.vdev == b.vdev
                    && a.offset_bytes() + last.psize_bytes() == b.offset_bytes()
                    && run_bytes + bp.psize_bytes() <= SPAN_BYTES_MAX
            });
        if joins {
            run_bytes += bp.psize_bytes();
            if let Some(run) = runs.last_mut() {
                run.push(bp);
            }
        } else {
            run_bytes = bp.psize_bytes();
            runs.push(vec![bp]);
        }
    }
    runs
}

/// A tree a scan walks: a volume's or the dedup table's.
#[derive(Clone, Copy, Debug)]
struct Tree {
    root: Option<BlockPointer>,
    levels: u8,
    walk: Walk,
}

/// Which kind of tree a walk goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Walk {
    Volume,
    DedupTable,
}

/// What a chunk left to do.
enum Next {
    More,
    Done,
}

/// A pin of one synced txg's tree in the allocator, released on drop.
struct Pinned<'a> {
    spa: &'a Spa,
    txg: u64,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.spa.allocator().lock().unpin(self.txg);
    }
}

/// The blocks a chunk queued in the allocator, forgotten on drop (the chunk ended, or its
/// task was dropped).
struct Queued<'a> {
    spa: &'a Spa,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.spa.allocator().lock().scan_clear();
    }
}

/// A block's copies as the allocator places them: (vdev, offset, asize).
fn placed(bp: &BlockPointer) -> Vec<(u32, u64, u64)> {
    bp.copies().map(|d| (d.vdev, d.offset_bytes(), d.asize_bytes())).collect()
}

impl Scan {
    /// Starts a scrub, or resumes a paused one, in the scan's state; the caller starts the
    /// task.
    pub(super) fn start_scrub(&self, pool: &Pool) -> Result<(), StoreError> {
        let refuse = |reason: &str| refused(pool, reason);
        {
            let mut scan = self.lock();
            if scan.halt {
                return Err(refuse("the pool is closing"));
            }
            match scan.active() {
                Some(s) if s.func == ScanFunc::Resilver => {
                    return Err(refuse(
                        "a resilver is in progress; scrub when it has finished (`pool status` \
                         shows its progress)",
                    ))
                }
                Some(s) if !s.paused => {
                    return Err(refuse(
                        "a scrub is already in progress; pause it with `pool scrub -p` or stop \
                         it with `pool scrub -s`",
                    ))
                }
                Some(_) => {
                    if let Some(status) = scan.status.as_mut() {
                        status.paused = false;
                    }
                    scan.pause_requested = false;
                    pool.events().post(EventClass::ScrubStart, None, vec![("resumed", "1".into())]);
                }
                None => {
                    let txg = pool.uberblock().txg;
                    scan.status = Some(new_status(pool, ScanFunc::Scrub, 0, txg, Vec::new()));
                    scan.bookmark = Bookmark::Start;
                    scan.targets.clear();
                    scan.generation += 1;
                    scan.pause_requested = false;
                    pool.events().post(EventClass::ScrubStart, None, Vec::new());
                }
            }
        }
        Ok(())
    }

    /// The scan's record for the pool directory of the txg being synced: the last or current
    /// scan and its bookmark.
    pub(super) fn record(&self, pool: &Pool) -> Option<ScanRecord> {
        let scan = self.lock();
        let status = scan.status.as_ref()?;
        let now = pool.env().now();
        Some(ScanRecord {
            kind: match status.func {
                ScanFunc::Scrub => ScanKind::Scrub,
                ScanFunc::Resilver => ScanKind::Resilver,
            },
            phase: match status.phase {
                ScanPhase::Scanning => ScanRecordPhase::Scanning,
                ScanPhase::Finished => ScanRecordPhase::Finished,
                ScanPhase::Canceled => ScanRecordPhase::Canceled,
            },
            paused: status.paused,
            bookmark: match scan.bookmark {
                Bookmark::Start => ScanBookmark::Start,
                Bookmark::Ddt { block } => ScanBookmark::DedupTable { block },
                Bookmark::Volume { id, block } => ScanBookmark::Volume { id, block },
                Bookmark::Done => ScanBookmark::Done,
            },
            min_birth: status.min_birth,
            max_birth: status.max_birth,
            start_secs: status.started_unix_secs,
            end_secs: status.ended_unix_secs.unwrap_or(0),
            run_secs: status.run_secs(now),
            examined_bytes: status.examined_bytes,
            total_bytes: status.total_bytes,
            issued_blocks: status.issued_blocks,
            issued_bytes: status.issued_bytes,
            repaired_copies: status.repaired_copies,
            repaired_bytes: status.repaired_bytes,
            errors: status.errors,
            unrecoverable: status.unrecoverable,
            targets: scan.targets.iter().map(|t| t.guid).collect(),
        })
    }

    /// Takes up the scan recorded in the directory the store opened (see the module doc); the
    /// syncer starts it ([`Store::resume_scan`]).
    pub(super) fn restore(&self, pool: &Pool, record: &ScanRecord) {
        let now = pool.env().now();
        let func = match record.kind {
            ScanKind::Scrub => ScanFunc::Scrub,
            ScanKind::Resilver => ScanFunc::Resilver,
        };
        let mut status = new_status(pool, func, record.min_birth, record.max_birth, Vec::new());
        status.earlier_secs = record.run_secs;
        status.examined_bytes = record.examined_bytes;
        status.total_bytes = record.total_bytes;
        status.issued_blocks = record.issued_blocks;
        status.issued_bytes = record.issued_bytes;
        status.repaired_copies = record.repaired_copies;
        status.repaired_bytes = record.repaired_bytes;
        status.errors = record.errors;
        status.unrecoverable = record.unrecoverable;
        status.paused = record.paused;
        // Builds before wall-clock scan times recorded seconds of the process's monotonic
        // clock here: a time before 2020 is one of those, and is not known.
        let wall = |secs: u64| (secs >= WALL_CLOCK_SECS_MIN).then_some(secs);
        status.started_unix_secs = wall(record.start_secs).unwrap_or(0);
        let ended_unix_secs = wall(record.end_secs);
        let bookmark = match record.bookmark {
            ScanBookmark::Start => Bookmark::Start,
            ScanBookmark::DedupTable { block } => Bookmark::Ddt { block },
            ScanBookmark::Volume { id, block } => Bookmark::Volume { id, block },
            ScanBookmark::Done => Bookmark::Done,
        };
        let mut scan = self.lock();
        match record.phase {
            ScanRecordPhase::Scanning if func == ScanFunc::Resilver => {
                // Only the leaves it was copying onto, still behind and within its range: a
                // leaf that was not a target missed the copies before the bookmark. Any other
                // leaf behind gets a resilver of its own once this one ends.
                let behind = pool.leaves_behind();
                let tree = pool.tree();
                let found: Vec<_> = behind
                    .iter()
                    .filter(|&&(guid, held, _)| {
                        record.targets.contains(&guid) && held + 1 >= record.min_birth
                    })
                    .filter_map(|&(guid, _, _)| tree.leaves.iter().find(|l| l.guid == guid))
                    .collect();
                if found.is_empty() {
                    // Nothing it was copying for is left: `resume_scan` starts afresh if
                    // anything is behind.
                    return;
                }
                scan.resilver_again = found.len() < behind.len();
                // What they missed before this import is not known: never "current" at the
                // end (`Scan::finish`), so the txgs after the range are resilvered next.
                scan.targets = found.iter().map(|l| Target::of(l, u64::MAX)).collect();
                status.targets = found.iter().map(|l| l.path.clone()).collect();
                status.paused = false;
            }
            ScanRecordPhase::Scanning => {}
            ScanRecordPhase::Finished | ScanRecordPhase::Canceled => {
                status.phase = if record.phase == ScanRecordPhase::Finished {
                    ScanPhase::Finished
                } else {
                    ScanPhase::Canceled
                };
                status.earlier_secs = 0;
                let run = record.run_secs.saturating_mul(1_000_000_000);
                status.started = Time::from_nanos(now.as_nanos().saturating_sub(run));
                status.ended = Some(now);
                status.ended_unix_secs = ended_unix_secs;
                status.paused = false;
            }
        }
        scan.status = Some(status);
        scan.bookmark =
            if record.phase == ScanRecordPhase::Scanning { bookmark } else { Bookmark::Done };
        scan.generation += 1;
        scan.pause_requested = false;
    }

    /// Pauses a running scrub after its current chunk (`zpool scrub -p`).
    pub(super) fn pause(&self, pool: &Pool) -> Result<(), StoreError> {
        let mut scan = self.lock();
        match scan.active().map(|s| (s.func, s.paused)) {
            Some((ScanFunc::Scrub, false)) => {
                scan.pause_requested = true;
                if let Some(status) = scan.status.as_mut() {
                    status.paused = true;
                }
                Ok(())
            }
            Some((ScanFunc::Scrub, true)) => Ok(()),
            Some((ScanFunc::Resilver, _)) => Err(refused(pool, "a resilver cannot be paused")),
            None => Err(refused(pool, "there is no scrub in progress to pause")),
        }
    }

    /// Stops a scrub, running or paused (`zpool scrub -s`).
    pub(super) fn stop(&self, pool: &Pool) -> Result<(), StoreError> {
        let mut scan = self.lock();
        match scan.active().map(|s| s.func) {
            Some(ScanFunc::Scrub) => {
                // At once: a chunk in work finishes, and its figures are dropped.
                scan.end(pool, ScanPhase::Canceled);
                Ok(())
            }
            Some(ScanFunc::Resilver) => Err(refused(
                pool,
                "a resilver cannot be stopped: the leaves it copies onto are missing data until \
                 it ends",
            )),
            None => Err(refused(pool, "there is no scrub in progress to stop")),
        }
    }

    /// Whether a resilver of the leaves `behind` runs now: one already does (asked to go on
    /// with any new leaf behind), or one begins here (a running scrub is canceled for it).
    /// `No` when the pool is closing or this resilver already gave up on the same leaves.
    fn take_resilver(&self, pool: &Pool, behind: &[(u64, u64, u64)]) -> Resilver {
        let evidence = behind_now(pool, behind);
        let mut scan = self.lock();
        if scan.halt || scan.gave_up.as_ref() == Some(&evidence) {
            return Resilver::No;
        }
        match scan.active().map(|s| s.func) {
            Some(ScanFunc::Resilver) => {
                let targets: Vec<u64> = scan.targets.iter().map(|t| t.guid).collect();
                if behind.iter().any(|(guid, _, _)| !targets.contains(guid)) {
                    scan.resilver_again = true;
                }
                return Resilver::Running;
            }
            Some(ScanFunc::Scrub) => {
                // The resilver replaces it (a running task goes on with the resilver).
                scan.end(pool, ScanPhase::Canceled);
            }
            None => {}
        }
        scan.begin_resilver(pool, behind, false);
        Resilver::Begun
    }

    /// Decides, in one critical section with anything that starts or resumes a scan, whether
    /// the task goes on: with a resilver that was asked for, or a scan started or resumed
    /// while this one ended (whose `spawn_scan` saw the task still running). Otherwise the
    /// task stops and its waiters are woken.
    fn next_or_stop(&self, pool: &Pool) -> bool {
        let waiters = {
            let mut scan = self.lock();
            if std::mem::take(&mut scan.resilver_again) && !scan.halt {
                let behind = pool.leaves_behind();
                if !behind.is_empty() {
                    scan.begin_resilver(pool, &behind, false);
                }
            }
            let more =
                !scan.halt && !scan.pause_requested && scan.active().is_some_and(|s| !s.paused);
            if more {
                return true;
            }
            scan.running = false;
            std::mem::take(&mut scan.stopped)
        };
        for waiter in waiters {
            let _ = waiter.send(());
        }
        false
    }

    /// Moves a scan's bookmark back to the start of volume `volume_id`, if it is past it: a
    /// snapshot destroy, a rollback or a promote changes which of a volume's trees holds a
    /// block, and the volume is walked before its snapshots (their ids come later), so a block
    /// the volume's walk left to a snapshot that is now gone must be found again (ZFS:
    /// `dsl_scan_ds_destroyed`). Walking a tree twice costs time, never a missed block.
    pub(super) fn rewind(&self, volume_id: u64) {
        let mut scan = self.lock();
        if scan.active().is_none() {
            return;
        }
        let target = Bookmark::Volume { id: volume_id, block: 0 };
        if scan.bookmark > target {
            scan.bookmark = target;
        }
        scan.rewind = Some(scan.rewind.map_or(target, |r| r.min(target)));
    }

    /// Whether the pool's clients made a request within `scan.idle_ms`. `requests` sums
    /// every volume's request counters (the namespace's, taken only when the last sum is a
    /// millisecond old, and not while the scan's state is held).
    fn clients_busy(&self, pool: &Pool, requests: impl FnOnce() -> u64) -> bool {
        if self.idle.is_zero() {
            return false;
        }
        let now = pool.env().now();
        {
            let scan = self.lock();
            if now.since(scan.clients_checked) < std::time::Duration::from_millis(1) {
                return now.since(scan.clients_seen) < self.idle;
            }
        }
        let total = requests();
        let mut scan = self.lock();
        scan.clients_checked = now;
        if total != scan.client_requests {
            scan.client_requests = total;
            scan.clients_seen = now;
        }
        now.since(scan.clients_seen) < self.idle
    }

    /// Sets the scan to stop after its current chunk and start no other.
    pub(super) fn halt(&self) {
        self.lock().halt = true;
    }

    /// The scan running, paused, or last finished or canceled since the store opened.
    pub(super) fn status(&self) -> Option<ScanStatus> {
        self.lock().status.clone()
    }

    /// Waits until no scan task is working (the scan finished, was paused or canceled).
    pub(super) async fn wait(&self) {
        loop {
            let wait = {
                let mut scan = self.lock();
                if !scan.running {
                    return;
                }
                let (tx, rx) = futures::channel::oneshot::channel();
                scan.stopped.push(tx);
                rx
            };
            let _ = wait.await;
        }
    }

    /// As [`Store::halt_scan`], for a store no task can hold any more (export owns it): a task
    /// between chunks finds the store gone and ends without saying so.
    pub(super) fn forget(&self) {
        let waiters = {
            let mut scan = self.lock();
            scan.halt = true;
            scan.running = false;
            std::mem::take(&mut scan.stopped)
        };
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}

impl Store {
    /// The scan running, paused, or last finished or canceled since the store opened.
    pub fn scan_status(&self) -> Option<ScanStatus> {
        self.dsl.scan().status()
    }

    /// When the last scrub that ran to its end finished, in wall-clock seconds since the Unix
    /// epoch; `None` when none is known to have.
    pub fn last_scrub_end_unix_secs(&self) -> Option<u64> {
        Some(self.spa.pool().properties().last_scrub_end_secs).filter(|&secs| secs != 0)
    }

    /// Starts a scrub, or resumes a paused one (`zpool scrub`).
    pub fn scrub_start(self: &Arc<Self>) -> Result<(), StoreError> {
        self.dsl.scan().start_scrub(self.spa.pool())?;
        self.spawn_scan();
        Ok(())
    }

    /// Starts the scan the store opened with, or a resilver if a leaf is behind: called when
    /// the store begins serving ([`Store::run_syncer`]).
    pub fn resume_scan(self: &Arc<Self>) {
        self.resilver_if_needed();
        self.spawn_scan();
    }

    /// Pauses a running scrub after its current chunk (`zpool scrub -p`).
    pub fn scrub_pause(&self) -> Result<(), StoreError> {
        self.dsl.scan().pause(self.spa.pool())
    }

    /// Stops a scrub, running or paused (`zpool scrub -s`).
    pub fn scrub_stop(&self) -> Result<(), StoreError> {
        self.dsl.scan().stop(self.spa.pool())
    }

    /// Starts a resilver when a leaf in service is behind the pool and another leaf of its
    /// mirror holds everything; a running scrub is canceled for it. Returns whether one runs.
    /// With nothing behind, detaches the leaves whose replacements have caught up.
    pub fn resilver_if_needed(self: &Arc<Self>) -> bool {
        let behind = self.spa.pool().leaves_behind();
        if behind.is_empty() {
            // A replacement that holds everything now: its old leaf goes.
            self.finish_replacements();
            return false;
        }
        match self.dsl.scan().take_resilver(self.spa.pool(), &behind) {
            Resilver::No => false,
            Resilver::Running => true,
            Resilver::Begun => {
                self.spawn_scan();
                true
            }
        }
    }

    /// Waits until no scan task is working (the scan finished, was paused or canceled).
    pub async fn wait_scan(&self) {
        self.dsl.scan().wait().await;
    }

    /// Stops the scan task after its current chunk and starts no other (the server stopping).
    pub async fn halt_scan(&self) {
        self.dsl.scan().halt();
        self.wait_scan().await;
    }

    /// Starts the scan task unless one is working. It holds the store only while a chunk is in
    /// work, so an export waits for at most one chunk.
    fn spawn_scan(self: &Arc<Self>) {
        {
            let mut scan = self.dsl.scan().lock();
            if scan.running || scan.active().is_none_or(|s| s.paused) {
                return;
            }
            scan.running = true;
        }
        let weak = Arc::downgrade(self);
        self.spa.pool().env().spawn("dsl_scan", async move {
            loop {
                let Some(store) = weak.upgrade() else { return };
                if !store.scan_step().await {
                    return;
                }
            }
        });
    }

    /// One chunk of the scan, and its end when it is done; whether the task goes on.
    async fn scan_step(self: &Arc<Self>) -> bool {
        let requests = || -> u64 {
            let dsl = self.dsl.read();
            dsl.values().map(|d| d.stats.requests.iter().map(|c| c.get()).sum::<u64>()).sum()
        };
        self.dsl.scan().step(&self.spa, &requests, self.syncer.lock()).await
    }
}

/// The scan's chunks: the walk of the newest synced tree and the reads it issues, through the
/// pool alone (the namespace only sums its clients' requests, to yield to them).
impl Scan {
    /// Runs one chunk, or ends the scan; `requests` sums the volumes' request counters (see
    /// [`Scan::clients_busy`]), and `hold_syncs` takes the sync's lock (see [`Scan::finish`]).
    /// Returns whether the task goes on.
    async fn step<G>(
        &self,
        spa: &Spa,
        requests: &(dyn Fn() -> u64 + Sync),
        hold_syncs: impl std::future::Future<Output = G>,
    ) -> bool {
        let (go, generation) = {
            let scan = self.lock();
            let go = !scan.halt && !scan.pause_requested && scan.active().is_some();
            (go, scan.generation)
        };
        if go {
            match self.scan_chunk(spa, requests, generation).await {
                Ok(Next::More) => return true,
                Ok(Next::Done) => self.finish(spa.pool(), generation, hold_syncs).await,
                Err(error) => {
                    // The store is suspended or its newest tree did not read: the scan ends,
                    // canceled, saying why.
                    let mut scan = self.lock();
                    if scan.generation == generation {
                        if let Some(status) = scan.status.as_mut() {
                            status.failure = Some(error.to_string());
                        }
                        scan.end(spa.pool(), ScanPhase::Canceled);
                    }
                }
            }
        }
        self.next_or_stop(spa.pool())
    }

    /// A finished resilver brings its targets up to date: each holds every block born up to
    /// the resilver's last birth, and one that missed no write since then holds every synced
    /// txg. One that did (it went out of service again, or a write failed on it) is behind
    /// by the txgs since, and the next sync starts a resilver of those. Under the sync lock,
    /// so that no sync is between writing its uberblocks and counting who took them.
    ///
    /// A target that took every copy and is still behind goes on at once with a pass over
    /// the txgs after the range, within this resilver: a resumed resilver cannot know what its
    /// leaves missed before the import, so it ends holding only its range. Ended there, status
    /// said "resilvered" while the pool still counted the leaf behind (an offline of the other
    /// leg refused for want of a valid replica) until the next sync's resilver; a resilver is
    /// reported finished only once its leaves hold every txg.
    async fn finish<G>(
        &self,
        pool: &Pool,
        generation: u64,
        hold_syncs: impl std::future::Future<Output = G>,
    ) {
        let (func, targets, clean, resilvered) = {
            let scan = self.lock();
            if scan.generation != generation || scan.active().is_none() {
                return;
            }
            let status = scan.status.as_ref();
            let clean = status.is_some_and(|s| s.unrecoverable == 0);
            let resilvered = status.map_or(0, |s| s.max_birth);
            (status.map(|s| s.func), scan.targets.clone(), clean, resilvered)
        };
        if func == Some(ScanFunc::Resilver) {
            if clean {
                let _one_at_a_time = hold_syncs.await;
                let leaves = pool.leaves();
                let mut took_all = Vec::new();
                for target in &targets {
                    // A copy it did not take (out of service, or a failed write) leaves it
                    // behind as it was: the next resilver starts over for it.
                    let missed_copies = leaves
                        .iter()
                        .find(|l| l.guid == target.guid)
                        .is_none_or(|l| l.leaf.resilver_misses() != target.resilver_misses);
                    if !missed_copies {
                        pool.mark_caught_up(target.guid, resilvered, target.missed_then);
                        took_all.push(target.guid);
                    }
                }
                let behind = pool.leaves_behind();
                if behind.iter().any(|(guid, _, _)| took_all.contains(guid)) {
                    let mut scan = self.lock();
                    if scan.generation == generation && !scan.halt {
                        scan.begin_resilver(pool, &behind, true);
                        return;
                    }
                }
            } else {
                let behind = pool.leaves_behind();
                self.lock().gave_up = Some(behind_now(pool, &behind));
            }
        }
        let mut scan = self.lock();
        if scan.generation == generation {
            scan.end(pool, ScanPhase::Finished);
        }
    }

    /// While clients are busy, makes scan I/O wait its turn behind `gate` (one run at a
    /// time) and pause `scan.busy_delay_ms` first (ZFS delays scan I/O on a busy pool the same
    /// way); returns the turn, held while the run is issued. Otherwise returns at once.
    async fn yield_to_clients<'a>(
        &self,
        pool: &Pool,
        requests: &(dyn Fn() -> u64 + Sync),
        gate: &'a futures::lock::Mutex<()>,
    ) -> Option<futures::lock::MutexGuard<'a, ()>> {
        if !self.clients_busy(pool, requests) {
            return None;
        }
        let turn = gate.lock().await;
        pool.env().sleep(self.busy_delay).await;
        Some(turn)
    }

    /// Pins the newest synced tree; walks it from the bookmark; issues what it gathered.
    /// `requests` sums every volume's request counters (see [`Scan::clients_busy`]).
    async fn scan_chunk(
        &self,
        spa: &Spa,
        requests: &(dyn Fn() -> u64 + Sync),
        generation: u64,
    ) -> Result<Next, StoreError> {
        let (bookmark, min_birth, max_birth, targets) = {
            let scan = self.lock();
            let Some(status) = scan.status.as_ref() else { return Ok(Next::Done) };
            let targets: Vec<VdevId> = scan.targets.iter().map(|t| t.id).collect();
            (scan.bookmark, status.min_birth, status.max_birth, targets)
        };
        if bookmark == Bookmark::Done {
            return Ok(Next::Done);
        }
        let (pin, root) = {
            let mut allocator = spa.allocator().lock();
            let uberblock = spa.pool().uberblock();
            allocator.pin(uberblock.txg);
            (Pinned { spa, txg: uberblock.txg }, uberblock.root)
        };
        let Some(root) = root else {
            drop(pin);
            return Ok(Next::Done);
        };
        let directory = read_directory(spa.pool(), &root).await?;
        let budget = self.chunk_bytes;
        let in_range = |bp: &BlockPointer| (min_birth..=max_birth).contains(&bp.birth_txg);
        let mut gathered: Vec<BlockPointer> = Vec::new();
        let mut gathered_bytes = 0u64;
        let mut unreadable = 0u64;
        let mut next = bookmark;
        if next == Bookmark::Start {
            let pieces = directory.space_maps.iter().flatten();
            let dead = directory.volumes.iter().flat_map(|v| v.deadlist_pieces());
            for bp in std::iter::once(&root).chain(pieces).chain(dead).filter(|bp| in_range(bp)) {
                gathered_bytes += bp.psize_bytes();
                gathered.push(*bp);
            }
            next = Bookmark::Ddt { block: 0 };
        }
        // Every volume's trees, its snapshots' included, in id order (snapshot ids come from
        // the same counter): the bookmark names one by id. A tree's blocks shared with the
        // one before it are skipped, having been visited there.
        let mut volumes: Vec<TreeRef> = directory.volumes.iter().flat_map(|v| v.trees()).collect();
        volumes.sort_by_key(|v| v.id);
        let total_bytes: u64 = volumes.iter().map(|v| v.size_bytes).sum();
        while gathered_bytes < budget && next != Bookmark::Done {
            // The tree the bookmark is in, where in it, and (a volume's) its id.
            let (root, levels, walk, from, volume_id, shared_through) = match next {
                Bookmark::Start => unreachable!("the start is gathered above"),
                Bookmark::Volume { id, block } => {
                    let Some(volume) = volumes.iter().find(|v| v.id >= id) else {
                        next = Bookmark::Done;
                        continue;
                    };
                    let from = if volume.id == id { block } else { 0 };
                    let shared = volume.shared_through;
                    (volume.root, volume.levels, Walk::Volume, from, volume.id, shared)
                }
                Bookmark::Ddt { block } => {
                    (directory.ddt.root, directory.ddt.levels, Walk::DedupTable, block, 0, 0)
                }
                Bookmark::Done => break,
            };
            let before = gathered.len();
            let walked = walk_tree(
                spa.pool(),
                Tree { root, levels, walk },
                from,
                (min_birth.max(shared_through + 1), max_birth),
                budget - gathered_bytes,
                &mut gathered,
                &mut unreadable,
            )
            .await;
            gathered_bytes += gathered[before..].iter().map(BlockPointer::psize_bytes).sum::<u64>();
            next = match (walk, walked) {
                (Walk::Volume, Some(block)) => Bookmark::Volume { id: volume_id, block },
                (Walk::Volume, None) => Bookmark::Volume { id: volume_id + 1, block: 0 },
                (Walk::DedupTable, Some(block)) => Bookmark::Ddt { block },
                (Walk::DedupTable, None) => Bookmark::Volume { id: 0, block: 0 },
            };
        }
        // The walk is over: the gathered blocks are queued and the tree unpinned, so the frees
        // of blocks overwritten while the chunk reads come back as usual, but for blocks whose
        // read is in flight (crate::alloc's scan queue; a pin held for the whole chunk kept
        // every such free back for seconds, and writers short of space were refused).
        let _queued = {
            let mut allocator = spa.allocator().lock();
            allocator.scan_queue(gathered.iter().flat_map(placed));
            Queued { spa }
        };
        drop(pin);
        // Issue in device order: a scan of an aged pool otherwise seeks for every block.
        gathered.sort_by_key(|bp| bp.copies().next().map(|d| (d.vdev, d.offset_bytes())));
        let in_flight = self.ios_in_flight;
        let runs = runs_of(&gathered, !targets.is_empty());
        let targets = &targets;
        let gate = futures::lock::Mutex::new(());
        let gate = &gate;
        let outcomes: Vec<_> = futures::stream::iter(runs.into_iter().map(|run| async move {
            // Clients busy: one run at a time, each after a pause.
            let _one_at_a_time = self.yield_to_clients(spa.pool(), requests, gate).await;
            // A block freed since the walk is not read: nothing needs it, and its space may
            // hold another block by now.
            let count = run.len();
            let run: Vec<BlockPointer> = {
                let mut allocator = spa.allocator().lock();
                run.into_iter().filter(|bp| allocator.scan_issue(&placed(bp))).collect()
            };
            let mut outcomes = Vec::with_capacity(run.len());
            let mut whole = None;
            if run.len() > 1 && run.len() == count {
                whole = spa.pool().resilver_span(&run, targets).await;
            }
            if let Some(whole) = whole {
                let each = ScrubOutcome { repaired: whole.repaired, ..ScrubOutcome::default() };
                outcomes.extend(run.iter().map(|bp| (bp.psize_bytes(), each)));
            } else {
                for bp in &run {
                    outcomes.push((bp.psize_bytes(), spa.pool().scan_block(bp, targets).await));
                }
            }
            let mut allocator = spa.allocator().lock();
            for bp in &run {
                allocator.scan_done(&placed(bp));
            }
            outcomes
        }))
        .buffer_unordered(in_flight)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flatten()
        .collect();
        let examined = match next {
            Bookmark::Start | Bookmark::Ddt { .. } => 0,
            Bookmark::Volume { id, block } => volumes
                .iter()
                .map(|v| match v.id.cmp(&id) {
                    std::cmp::Ordering::Less => v.size_bytes,
                    std::cmp::Ordering::Equal => {
                        (block * u64::from(v.block_bytes)).min(v.size_bytes)
                    }
                    std::cmp::Ordering::Greater => 0,
                })
                .sum(),
            Bookmark::Done => total_bytes,
        };
        let mut scan = self.lock();
        if scan.generation != generation || scan.active().is_none() {
            // Stopped or replaced while the chunk ran: its figures belong to no scan.
            return Ok(Next::More);
        }
        scan.bookmark = match scan.rewind.take() {
            Some(rewind) => next.min(rewind),
            None => next,
        };
        if let Some(status) = scan.status.as_mut() {
            status.total_bytes = total_bytes;
            status.examined_bytes = examined;
            status.unrecoverable += unreadable;
            for (bytes, outcome) in outcomes {
                status.issued_blocks += 1;
                status.issued_bytes += bytes;
                status.errors += u64::from(outcome.errors);
                status.repaired_copies += u64::from(outcome.repaired);
                status.repaired_bytes += u64::from(outcome.repaired) * bytes;
                status.unrecoverable += u64::from(outcome.unrecoverable);
            }
        }
        Ok(if next == Bookmark::Done { Next::Done } else { Next::More })
    }
}

async fn read_directory(pool: &Pool, root: &BlockPointer) -> Result<PoolDirectory, StoreError> {
    let bytes = pool.read_block(root, IoClass::Scrub).await?;
    PoolDirectory::decode(&bytes).map_err(|source| {
        StoreError::Pool(PoolError::Format { pool: pool.name().to_owned(), cause: source })
    })
}

/// Walks a tree of `levels` levels of indirect blocks (a volume's, or the dedup table's)
/// in block order from data block `from`, adding to `gathered` the blocks born in `births`
/// until about `budget` bytes are gathered. Returns the block to resume from, or `None`
/// when the tree is done. A subtree born before `births` is skipped whole: copy-on-write
/// gives a parent a birth no older than any of its children. An indirect block is
/// gathered on the walk that first enters it (one whose first block is where a chunk
/// stopped may be issued again by the next, at most one per level). An indirect block
/// that cannot be read on any copy is counted in `unreadable` and its subtree skipped:
/// the scan goes on with the rest, as ZFS's does.
async fn walk_tree(
    pool: &Pool,
    Tree { root, levels, walk }: Tree,
    from: u64,
    births: (u64, u64),
    budget: u64,
    gathered: &mut Vec<BlockPointer>,
    unreadable: &mut u64,
) -> Option<u64> {
    let root = root?;
    let span = |level: u8| crate::objset::INDIRECT_BPS.saturating_pow(u32::from(level));
    let mut bytes = 0u64;
    // (pointer, level, first data block under it), popped in block order.
    let mut stack = vec![(root, levels, 0u64)];
    while let Some((bp, level, first)) = stack.pop() {
        if first.saturating_add(span(level)) <= from || bp.birth_txg < births.0 {
            continue;
        }
        if bytes >= budget {
            return Some(first.max(from));
        }
        // A volume's shared blocks are visited through the dedup table.
        let shared = walk == Walk::Volume && level == 0 && bp.dedup.is_some();
        let issue = !shared && bp.birth_txg <= births.1 && (level == 0 || first >= from);
        if issue {
            bytes += bp.psize_bytes();
            gathered.push(bp);
        }
        if level == 0 && walk == Walk::DedupTable {
            // A bucket: the blocks its entries name (a bucket rewritten since the scan
            // began may still name older blocks).
            let Ok(bucket) = pool.read_block(&bp, IoClass::Scrub).await else {
                *unreadable += 1;
                continue;
            };
            let Ok(bucket) = DdtBucket::decode(&bucket) else {
                *unreadable += 1;
                continue;
            };
            for entry in bucket.entries {
                if (births.0..=births.1).contains(&entry.bp.birth_txg) {
                    bytes += entry.bp.psize_bytes();
                    gathered.push(entry.bp);
                }
            }
            continue;
        }
        if level == 0 || bp.kind != BlockKind::Indirect {
            continue;
        }
        // Its pointers as they decode: decompressed (indirect blocks are stored lz4).
        let Ok(node) = pool.read_block_logical(&bp, IoClass::Scrub).await else {
            *unreadable += 1;
            continue;
        };
        let child_span = span(level - 1);
        let children = node.chunks_exact(BLKPTR_BYTES).enumerate().rev();
        for (slot, bytes) in children {
            if let Ok(Some(child)) = BlockPointer::decode(bytes) {
                let child_first = first.saturating_add((slot as u64).saturating_mul(child_span));
                stack.push((child, level - 1, child_first));
            }
        }
    }
    None
}
