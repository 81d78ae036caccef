//! N-way mirrors: writes to every child, reads from one chosen by policy, healing from the
//! others (ZFS: `vdev_mirror.c`; seed 002).
//!
//! Read selection ([`ReadPolicy`]):
//! - `least-pending` (default): each readable child's load is its pending I/O count plus a
//!   locality penalty (rotational: nothing when the read continues one of the child's pending
//!   I/Os or its last one, half a seek when a pending I/O ends within
//!   `mirror.rotating_seek_offset` before it or when the offset lies in the child's zone, its
//!   equal slice of the address range, a whole seek otherwise; non-rotational: a small
//!   constant unless it continues). ZFS compares against the child's last issued offset only;
//!   with many interleaved streams that offset belongs to some other stream, every read looks
//!   like a seek everywhere, and streams lose their disk (measured in docs/bench). The least-loaded child wins; among
//!   ties one is drawn at random and kept for `mirror.switch_us`, so a sequential stream stays
//!   on one disk where its reads merge (seed 002's batching). Faster children drain their queue
//!   sooner and so get more work, which is what lets an SSD+HDD mirror read near SSD speed.
//! - `offset-modulo` (seed 002's "before"): child `(offset >> 21) % children`, next in order if
//!   that one is unreadable.
//! - `round-robin`: a rotating counter.
//!
//! A read whose child fails or returns data the caller's verify callback rejects is retried on
//! the untried children. With a good copy in hand, every child that failed or returned bad data
//! is rewritten with it (never a child that returned good data: a torn rewrite of the only good
//! copy would destroy it) and the repair is counted. With none, the read fails with
//! [`VdevError::NoValidCopy`] and nothing else is affected.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::join_all;

use super::leaf::{Leaf, LeafState};
use super::{VdevError, VdevId};
use crate::device::{AlignedBuf, SharedBuf};
use crate::rt::Env;
use crate::tunables::{IoClass, Tunable, Tunables};

/// Mirror children are addressed with a bitmask of tried children.
pub const MIRROR_CHILDREN_MAX: usize = 64;

/// What scrubbing one block of a mirror found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubOutcome {
    /// Children whose copy failed to read or verify.
    pub errors: u32,
    /// Of those, how many were rewritten from a good copy.
    pub repaired: u32,
    /// No child had a good copy.
    pub unrecoverable: bool,
}

/// How a mirror picks the child to read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadPolicy {
    LeastPending,
    OffsetModulo,
    RoundRobin,
}

impl ReadPolicy {
    pub fn from_tunables(tunables: &Tunables) -> ReadPolicy {
        match tunables.choice(Tunable::MirrorReadPolicy) {
            "offset-modulo" => ReadPolicy::OffsetModulo,
            "round-robin" => ReadPolicy::RoundRobin,
            _ => ReadPolicy::LeastPending,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ReadPolicy::LeastPending => "least-pending",
            ReadPolicy::OffsetModulo => "offset-modulo",
            ReadPolicy::RoundRobin => "round-robin",
        }
    }
}

/// The load-calculation constants of `least-pending`.
#[derive(Clone, Copy, Debug)]
struct LoadParams {
    rotating_inc: u64,
    rotating_seek_inc: u64,
    rotating_seek_offset: u64,
    non_rotating_inc: u64,
    non_rotating_seek_inc: u64,
    switch_nanos: u64,
}

/// An N-way mirror of leaves.
#[derive(Debug)]
pub struct Mirror {
    id: VdevId,
    env: Env,
    children: Vec<Arc<Leaf>>,
    policy: ReadPolicy,
    load: LoadParams,
    round_robin: AtomicU64,
    /// False while the pool is opened read-only (an import's dry run): a read that finds a
    /// bad copy then leaves it as it is.
    repairs: AtomicBool,
    /// Held while a child's diagnosis is acted on, so two children failing at once cannot
    /// each see the other online and both be taken out.
    diagnosis: parking_lot::Mutex<()>,
}

impl Mirror {
    pub fn new(id: VdevId, env: &Env, children: Vec<Arc<Leaf>>, tunables: &Tunables) -> Mirror {
        assert!(
            !children.is_empty() && children.len() <= MIRROR_CHILDREN_MAX,
            "mirror needs 1..=64 children"
        );
        let len = children[0].device().len_bytes();
        assert!(
            children.iter().all(|c| c.device().len_bytes() >= len || c.device().len_bytes() > 0),
            "mirror children must have a length"
        );
        Mirror {
            id,
            env: env.clone(),
            diagnosis: parking_lot::Mutex::new(()),
            children,
            policy: ReadPolicy::from_tunables(tunables),
            load: LoadParams {
                rotating_inc: tunables.get(Tunable::MirrorRotatingInc),
                rotating_seek_inc: tunables.get(Tunable::MirrorRotatingSeekInc),
                rotating_seek_offset: tunables.get(Tunable::MirrorRotatingSeekOffset),
                non_rotating_inc: tunables.get(Tunable::MirrorNonRotatingInc),
                non_rotating_seek_inc: tunables.get(Tunable::MirrorNonRotatingSeekInc),
                switch_nanos: tunables.get(Tunable::MirrorSwitchUs).saturating_mul(1000).max(1),
            },
            round_robin: AtomicU64::new(0),
            repairs: AtomicBool::new(true),
        }
    }

    pub fn id(&self) -> VdevId {
        self.id
    }

    pub fn children(&self) -> &[Arc<Leaf>] {
        &self.children
    }

    pub fn policy(&self) -> ReadPolicy {
        self.policy
    }

    /// Usable length: the smallest child's.
    pub fn len_bytes(&self) -> u64 {
        self.children.iter().map(|c| c.device().len_bytes()).min().unwrap_or(0)
    }

    /// Reads `[offset, offset+len)` from the first child whose data `verify` accepts, and
    /// rewrites the children that failed.
    pub async fn read(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> Result<AlignedBuf, VdevError> {
        self.read_counting(offset, len, class, verify, true).await
    }

    /// As `read`; with `count_if_none` false, copies that fail `verify` are counted as
    /// checksum errors only when another copy passes (see `Vdev::read_counting`).
    pub async fn read_counting(
        &self,
        offset: u64,
        len: u32,
        class: IoClass,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        count_if_none: bool,
    ) -> Result<AlignedBuf, VdevError> {
        let mut tried = 0u64;
        let mut bad = Vec::new();
        let mut mismatched: Vec<usize> = Vec::new();
        let mut last_error = None;
        let mut unreadable = 0u32;
        while let Some(child) = self.select(offset, tried) {
            tried |= 1 << child;
            let leaf = &self.children[child];
            match leaf.read(offset, len, class).await {
                Ok(buf) if verify(&buf) => {
                    for &child in &mismatched {
                        self.count_mismatch(child);
                    }
                    self.repair(&bad, offset, &buf).await;
                    return Ok(buf);
                }
                Ok(_) => {
                    mismatched.push(child);
                    bad.push(child);
                }
                Err(error) => {
                    if !leaf.is_out_of_service() {
                        bad.push(child);
                        unreadable += 1;
                    }
                    last_error = Some(error);
                    self.diagnose(child);
                }
            }
        }
        if count_if_none {
            for &child in &mismatched {
                self.count_mismatch(child);
            }
        }
        Err(VdevError::NoValidCopy {
            vdev: self.id,
            offset_bytes: offset,
            len_bytes: len,
            tried: tried.count_ones(),
            mismatched: mismatched.len() as u32,
            unreadable,
            last: last_error.map(Box::new),
        })
    }

    /// Reads every child's copy of `[offset, offset+len)`, checks each with `verify`, and
    /// rewrites the bad ones from a good one (scrub). Children out of service are skipped.
    pub async fn scrub(
        &self,
        offset: u64,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> ScrubOutcome {
        let reads = self.children.iter().map(|child| async move {
            if child.is_out_of_service() {
                return None;
            }
            Some(child.read(offset, len, IoClass::Scrub).await)
        });
        let results = join_all(reads).await;
        let mut outcome = ScrubOutcome::default();
        let mut good = None;
        let mut bad = Vec::new();
        for (child, result) in results.into_iter().enumerate() {
            match result {
                None => {}
                Some(Ok(buf)) if verify(&buf) => good = good.or(Some(buf)),
                Some(Ok(_)) => {
                    self.count_mismatch(child);
                    bad.push(child);
                }
                Some(Err(_)) => bad.push(child),
            }
        }
        outcome.errors = bad.len() as u32;
        match good {
            Some(buf) => outcome.repaired = self.repair(&bad, offset, &buf).await,
            None => outcome.unrecoverable = true,
        }
        outcome
    }

    /// Copies `[offset, offset+len)` onto the children in `targets` from the first other child
    /// whose copy verifies (ZFS's resilver writes a DTL child without reading it: its copy is
    /// known to be stale or missing). When every other copy fails (or every child is a target:
    /// each missed different writes), a target's own copy that verifies serves. Other children
    /// whose copy failed are repaired too.
    pub async fn resilver(
        &self,
        offset: u64,
        len: u32,
        verify: &(dyn Fn(&[u8]) -> bool + Send + Sync),
        targets: &[VdevId],
    ) -> ScrubOutcome {
        let mut outcome = ScrubOutcome::default();
        let mut bad = Vec::new();
        let mut good = None;
        let is_target = |c: usize| targets.contains(&self.children[c].id());
        let in_service = |c: usize| !self.children[c].is_out_of_service();
        let others = (0..self.children.len()).filter(|&c| !is_target(c) && in_service(c));
        let stale = (0..self.children.len()).filter(|&c| is_target(c) && in_service(c));
        for c in others.chain(stale) {
            match self.children[c].read(offset, len, IoClass::Scrub).await {
                Ok(buf) if verify(&buf) => {
                    good = Some((c, buf));
                    break;
                }
                // A target's stale copy is expected, not an error.
                Ok(_) if is_target(c) => {}
                Ok(_) => {
                    self.count_mismatch(c);
                    bad.push(c);
                }
                Err(_) => bad.push(c),
            }
        }
        outcome.errors = bad.len() as u32;
        let Some((source, buf)) = good else {
            outcome.unrecoverable = true;
            return outcome;
        };
        let copies = SharedBuf::copy_from(&buf);
        // A target out of service misses this copy: its resilver must not credit it.
        for c in (0..self.children.len()).filter(|&c| is_target(c) && !in_service(c)) {
            self.children[c].note_resilver_miss();
        }
        let writes = (0..self.children.len())
            .filter(|&c| c != source && (bad.contains(&c) || is_target(c)) && in_service(c))
            .map(|c| {
                let (leaf, data) = (&self.children[c], copies.clone());
                async move {
                    let ok = leaf.write(offset, data, IoClass::AsyncWrite).await.is_ok();
                    if !ok && is_target(c) {
                        leaf.note_resilver_miss();
                    }
                    ok
                }
            });
        outcome.repaired = join_all(writes).await.into_iter().filter(|&ok| ok).count() as u32;
        outcome
    }

    /// Writes to every child in service; succeeds when at least one child took the write.
    /// Children that failed have their error counted (the pool's resilver bookkeeping uses the
    /// result). Children out of service miss the write; a resilver brings them up to date.
    pub async fn write(
        &self,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
    ) -> Result<(), VdevError> {
        self.write_flushed(offset, data, class, false).await
    }

    /// As [`Mirror::write`], each child flushing its copy before it answers when `durable`.
    pub async fn write_flushed(
        &self,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
        durable: bool,
    ) -> Result<(), VdevError> {
        let writes = self.taking_writes().map(|child| {
            let data = data.clone();
            async move { (child.write_flushed(offset, data, class, durable).await, child) }
        });
        let results = join_all(writes).await;
        for (result, child) in &results {
            if result.is_err() {
                self.diagnose_leaf(child);
            }
        }
        let lacking = self.lacking(&results);
        let results = results.into_iter().map(|(result, _)| result).collect();
        let written = self.any_succeeded(results, "write", offset, u64::from(data.len_bytes()));
        if written.is_ok() {
            self.note_copies_missed(lacking);
        }
        written
    }

    /// The children without a copy of a write whose per-child `results` these are (failed, or
    /// not sent it), as a bitmask; zero at once in the common case, every child took it.
    fn lacking(&self, results: &[(Result<(), VdevError>, &Arc<Leaf>)]) -> u64 {
        let all = u64::MAX >> (64 - self.children.len());
        if results.len() == self.children.len() && results.iter().all(|(r, _)| r.is_ok()) {
            return 0;
        }
        let index = |leaf: &Arc<Leaf>| self.children.iter().position(|c| Arc::ptr_eq(c, leaf));
        (results.iter())
            .filter(|(result, _)| result.is_ok())
            .filter_map(|(_, leaf)| index(leaf))
            .fold(all, |lacking, c| lacking & !(1 << c))
    }

    /// After a write answered as done: each child in `lacking` lacks its copy.
    fn note_copies_missed(&self, lacking: u64) {
        for (c, child) in self.children.iter().enumerate() {
            if lacking & (1 << c) != 0 {
                child.note_copy_missed();
            }
        }
    }

    /// Writes and flushes on every child in service; fails if one of them failed and did not
    /// turn out to be gone (see `Root::write_durable`).
    pub async fn write_flushed_everywhere(
        &self,
        offset: u64,
        data: SharedBuf,
        class: IoClass,
    ) -> Result<(), VdevError> {
        let len = u64::from(data.len_bytes());
        let writes = self.taking_writes().map(|child| {
            let data = data.clone();
            async move { (child.write_flushed(offset, data, class, true).await, child) }
        });
        let results = join_all(writes).await;
        let lacking = self.lacking(&results);
        let mut any_ok = false;
        let mut failed_present = None;
        for (result, child) in results {
            if result.is_err() {
                self.diagnose_leaf(child);
            }
            match result {
                Ok(()) => any_ok = true,
                // A child that went missing marks itself faulted (and one taken offline
                // meanwhile refuses); either holds nothing an import will trust.
                Err(error) if !child.is_out_of_service() => {
                    failed_present.get_or_insert(error);
                }
                Err(_) => {}
            }
        }
        match failed_present {
            None if any_ok => {
                // Those out of service were skipped: they lack it.
                self.note_copies_missed(lacking);
                Ok(())
            }
            Some(error) if any_ok => Err(VdevError::ChildWriteFailed {
                vdev: self.id,
                offset_bytes: offset,
                len_bytes: len,
                cause: Box::new(error),
            }),
            last => Err(VdevError::AllChildrenFailed {
                vdev: self.id,
                op: "write",
                offset_bytes: offset,
                len_bytes: len,
                last: last.map(Box::new),
            }),
        }
    }

    /// Flushes every child in service; succeeds when at least one child flushed. A child out
    /// of service is not sent it, and what it holds unflushed counts as missed
    /// ([`Leaf::skip_flush`]): it may be back in service before anyone reads the count. That
    /// the flushed children hold every write is for the caller to know (the pool's sync
    /// checks it per txg, `Pool::sync_uberblock`): a write succeeds when one child took it.
    pub async fn flush(&self) -> Result<(), VdevError> {
        // Each child's state read once: one that leaves service meanwhile is either flushed
        // (and refuses, counting it) or counted here, never neither.
        let (serving, out): (Vec<&Arc<Leaf>>, Vec<&Arc<Leaf>>) =
            self.children.iter().partition(|child| !child.is_out_of_service());
        for child in out {
            child.skip_flush();
        }
        let results = join_all(serving.into_iter().map(|child| child.flush())).await;
        self.any_succeeded(results, "flush", 0, 0)
    }

    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        let results = join_all(self.in_service().map(|child| child.discard(offset, len))).await;
        self.any_succeeded(results, "discard", offset, len)
    }

    /// Counts a copy that failed its checksum against `child`, unless the child is known to
    /// be behind (its stale copies are expected, and its resilver is on the way), and feeds
    /// the child's diagnosis: a scrub's or a resilver's finding as a read's (docs/design.md,
    /// "Fault diagnosis and events").
    fn count_mismatch(&self, child: usize) {
        let leaf = &self.children[child];
        if leaf.is_behind() {
            return;
        }
        leaf.count_checksum_error();
        leaf.note_checksum_error();
        self.diagnose(child);
    }

    fn diagnose_leaf(&self, leaf: &Arc<Leaf>) {
        if let Some(child) = self.children.iter().position(|c| Arc::ptr_eq(c, leaf)) {
            self.diagnose(child);
        }
    }

    /// Acts on a child's recent errors ([`Leaf::verdict`]): faults or degrades it, unless no
    /// other child is online and up to date, since the only good copy is never taken out of
    /// service (ZFS's vdev_fault rule). Only an online child is degraded, and only an online
    /// or degraded one faulted: an administrator's offline, or a fault already found, stays.
    fn diagnose(&self, child: usize) {
        let leaf = &self.children[child];
        let Some(verdict) = leaf.verdict() else { return };
        let _one_verdict_at_a_time = self.diagnosis.lock();
        let applies = matches!(
            (leaf.state(), verdict),
            (LeafState::Online, _) | (LeafState::Degraded, LeafState::Faulted(_))
        );
        let another = self.children.iter().enumerate().any(|(c, other)| {
            c != child && other.state() == LeafState::Online && !other.is_behind()
        });
        if applies && another {
            leaf.set_state(verdict);
        }
    }

    /// The children that take writes, counting a skipped write on each of the others (what
    /// they missed decides when a resilver has brought them up to date).
    fn taking_writes(&self) -> impl Iterator<Item = &Arc<Leaf>> {
        self.children.iter().filter(|child| {
            let takes = !child.is_out_of_service();
            if !takes {
                child.note_skipped_write();
            }
            takes
        })
    }

    /// The children that take writes (each state is read as the iterator reaches it).
    fn in_service(&self) -> impl Iterator<Item = &Arc<Leaf>> + Clone {
        self.children.iter().filter(|child| !child.is_out_of_service())
    }

    fn any_succeeded(
        &self,
        results: Vec<Result<(), VdevError>>,
        op: &'static str,
        offset: u64,
        len: u64,
    ) -> Result<(), VdevError> {
        if results.iter().any(Result::is_ok) {
            return Ok(());
        }
        let last = results.into_iter().filter_map(Result::err).last().map(Box::new);
        Err(VdevError::AllChildrenFailed {
            vdev: self.id,
            op,
            offset_bytes: offset,
            len_bytes: len,
            last,
        })
    }

    /// Turns the rewriting of bad copies found by reads and scrubs on or off.
    pub fn set_repairs(&self, on: bool) {
        self.repairs.store(on, Ordering::Relaxed);
    }

    /// Rewrites the good copy onto the children that failed it; returns how many took it.
    async fn repair(&self, bad: &[usize], offset: u64, good: &[u8]) -> u32 {
        if bad.is_empty() || !self.repairs.load(Ordering::Relaxed) {
            return 0;
        }
        let data = SharedBuf::copy_from(good);
        let repairs =
            bad.iter().filter(|&&c| !self.children[c].is_out_of_service()).map(|&child| {
                let leaf = &self.children[child];
                let data = data.clone();
                async move {
                    let ok = leaf.write(offset, data, IoClass::AsyncWrite).await.is_ok();
                    if ok {
                        leaf.stats().repairs.inc();
                    }
                    ok
                }
            });
        join_all(repairs).await.into_iter().filter(|&ok| ok).count() as u32
    }

    /// The child to try next, or `None` when every child has been tried.
    fn select(&self, offset: u64, tried: u64) -> Option<usize> {
        let count = self.children.len();
        let untried = |c: usize| tried & (1 << c) == 0;
        // Up-to-date online children first; a degraded one (bad data too often) or one behind
        // (a resilver has yet to copy what it missed) when none is left; a faulted one last,
        // since it fails fast but its device may have come back. An offline child is never
        // read: the administrator took it out of service.
        let rank = |c: usize| match self.children[c].state() {
            LeafState::Online if !self.children[c].is_behind() => Some(0),
            LeafState::Online | LeafState::Degraded => Some(1),
            LeafState::Faulted(_) => Some(2),
            LeafState::Offline => None,
        };
        let best = (0..count).filter(|&c| untried(c)).filter_map(rank).min()?;
        let usable: Vec<usize> =
            (0..count).filter(|&c| untried(c) && rank(c) == Some(best)).collect();
        let first_from =
            |start: usize| (0..count).map(|i| (start + i) % count).find(|c| usable.contains(c));
        match self.policy {
            ReadPolicy::OffsetModulo => first_from(((offset >> 21) % count as u64) as usize),
            ReadPolicy::RoundRobin => {
                let turn = self.round_robin.fetch_add(1, Ordering::Relaxed);
                first_from((turn % count as u64) as usize)
            }
            ReadPolicy::LeastPending => self.least_loaded(offset, &usable),
        }
    }

    /// The child whose zone holds `offset`: the address range cut into one equal slice per
    /// child. Reads that continue nothing prefer their zone's child, so each disk of an HDD mirror
    /// seeks over a slice of the stroke instead of all of it (short-stroking; md's raid1 gets the
    /// same from reading on the disk whose head is nearest). On the seed's experiment this took
    /// random 4 KiB reads from +1% to +14% over offset-modulo on the 2-way pool and from +15% to
    /// +40% on the 4-way pool (docs/bench/seeds-mirror.md). It is a preference of half a seek's
    /// load, so a child whose zone is busy still hands work to the others.
    fn zone(&self, offset: u64) -> usize {
        let len = u128::from(self.len_bytes().max(1));
        (u128::from(offset) * self.children.len() as u128 / len) as usize
    }

    fn least_loaded(&self, offset: u64, usable: &[usize]) -> Option<usize> {
        let home = self.zone(offset);
        let load = |child: usize| {
            let leaf = &self.children[child];
            let pending = leaf.pending();
            if leaf.is_rotational() {
                match leaf.pending_end_distance(offset, self.load.rotating_seek_offset) {
                    // A continuation merges with its predecessor: it costs a transfer, where a
                    // seek costs more than ten. It stays until this child is about twice as
                    // loaded as another, whatever the absolute queue lengths.
                    Some(0) => pending / 2 + self.load.rotating_inc,
                    Some(_) => pending + self.load.rotating_seek_inc / 2,
                    None if leaf.last_end() == offset => pending / 2 + self.load.rotating_inc,
                    // A seek within the child's own zone is a short one (see `zone`).
                    None if child == home => pending + self.load.rotating_seek_inc / 2,
                    None => pending + self.load.rotating_seek_inc,
                }
            } else if leaf.pending_end_distance(offset, 0) == Some(0) || leaf.last_end() == offset {
                pending + self.load.non_rotating_inc
            } else {
                pending + self.load.non_rotating_seek_inc
            }
        };
        let loads: Vec<(usize, u64)> = usable.iter().map(|&c| (c, load(c))).collect();
        let lowest = loads.iter().map(|&(_, l)| l).min()?;
        let ties: Vec<usize> =
            loads.iter().filter(|&&(_, l)| l == lowest).map(|&(c, _)| c).collect();
        if ties.len() == 1 {
            return ties.first().copied();
        }
        // Ties: a random child, kept for a switch window (seed 002's batching).
        let window = self.env.now().as_nanos() / self.load.switch_nanos;
        let pick = crate::rt::mix_seed(window ^ (u64::from(self.id.0) << 40), "mirror_tie");
        ties.get((pick % ties.len() as u64) as usize).copied()
    }
}
