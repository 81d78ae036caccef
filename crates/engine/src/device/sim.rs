//! Simulated disks for benchmarks and fault testing (docs/design.md, "Devices").
//!
//! A `SimDevice` keeps two things apart, as redb's crash test does: the *durable image* and the
//! *volatile cache* of writes completed since the last flush (a flush covers the writes that
//! completed before it was submitted, not those completing while it runs). Reads see both; a crash keeps a
//! subset chosen by a seeded [`CrashPolicy`]. Flush is the only barrier.
//!
//! Timing follows a [`SimProfile`], in whatever time the [`Env`] clock gives: virtual in the
//! simulator (a run of minutes takes milliseconds and repeats exactly), real in production-mode
//! benchmarks (the device sleeps).
//!
//! - `Hdd`: one actuator and a write-back cache (64 MiB by default): writes are acknowledged
//!   once they reach the cache at the interface rate, and a flush writes the cached writes to
//!   the platter in elevator order, paying their mechanical cost. Positioning by distance: zero when a request starts where the head is
//!   (so adjacent queued requests merge into one stream); otherwise a seek of
//!   `track_to_track + (full_stroke - track_to_track) * sqrt(distance / 1 TB)` plus a
//!   rotational delay drawn uniformly from one revolution, or, for a short forward gap, the time
//!   the platter takes to turn past it when that is sooner. The drive keeps up to `ncq_depth`
//!   commands and serves them in C-LOOK elevator order; more wait in arrival order. Transfer at
//!   `media_bytes_per_sec`.
//! - `Ssd`: a device-wide transfer stage (`bus_bytes_per_sec`, first in first out, which is how a
//!   provisioned cloud disk throttles), then one of `channels` parallel channels for a fixed
//!   read/write latency plus `len / channel_bytes_per_sec`; flush takes `flush_latency`.
//!
//! Faults, each documented on [`Fault`]: read-time faults (bit flips, EIO ranges, misdirected
//! reads, device loss, slowness) are applied over the pristine image, so clearing them restores
//! it; write-time faults (EIO, phantom and misdirected writes, failing flushes) change what is
//! stored. The write log records every operation with its flush epoch so tests can rebuild the
//! image a power cut after any operation would leave ([`SimDevice::crash_image`]).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::oneshot;
use futures::FutureExt;
use parking_lot::Mutex;

use super::{check_range, AlignedBuf, BlockDevice, DeviceError, DeviceOp, SharedBuf};
use crate::rt::{BoxFuture, Env, Rng, Time};

/// Granularity of the stored image. Tearing works on 512-byte sectors within it.
const PAGE_BYTES: u64 = 4096;
const SECTOR_BYTES: u32 = 512;

/// Timing model of a simulated disk.
#[derive(Clone, Debug, PartialEq)]
pub enum SimProfile {
    Hdd(HddParams),
    Ssd(SsdParams),
    /// Completes everything at once: for tests that exercise content, not time.
    Instant,
}

/// A 7200 rpm SATA disk by default.
#[derive(Clone, Debug, PartialEq)]
pub struct HddParams {
    pub rpm: u32,
    pub track_to_track: Duration,
    pub full_stroke: Duration,
    pub media_bytes_per_sec: u64,
    /// Forward gaps up to this size are passed over by rotation instead of a seek.
    pub skip_window_bytes: u64,
    /// Commands the drive reorders among (NCQ); further commands wait in order.
    pub ncq_depth: usize,
    /// Fixed controller cost per command (merged commands pay it once).
    pub command_overhead: Duration,
    pub flush_latency: Duration,
    /// Write-back cache: writes up to this many bytes are acknowledged once they reach the
    /// cache, and a flush pays their mechanical cost. 0 means write-through.
    pub write_cache_bytes: u64,
    /// Host interface rate, at which writes enter the cache.
    pub interface_bytes_per_sec: u64,
}

impl Default for HddParams {
    fn default() -> Self {
        HddParams {
            rpm: 7200,
            track_to_track: Duration::from_micros(800),
            full_stroke: Duration::from_millis(16),
            media_bytes_per_sec: 150_000_000,
            skip_window_bytes: 2 << 20,
            ncq_depth: 32,
            command_overhead: Duration::from_micros(50),
            flush_latency: Duration::from_micros(200),
            write_cache_bytes: 64 << 20,
            interface_bytes_per_sec: 600_000_000,
        }
    }
}

/// A datacenter NVMe SSD by default; see [`SsdParams::cloud_disk`] for a provisioned cloud disk.
#[derive(Clone, Debug, PartialEq)]
pub struct SsdParams {
    pub channels: usize,
    pub read_latency: Duration,
    pub write_latency: Duration,
    pub flush_latency: Duration,
    pub channel_bytes_per_sec: u64,
    pub bus_bytes_per_sec: u64,
}

impl Default for SsdParams {
    fn default() -> Self {
        SsdParams {
            channels: 8,
            read_latency: Duration::from_micros(80),
            write_latency: Duration::from_micros(30),
            flush_latency: Duration::from_micros(300),
            channel_bytes_per_sec: 400_000_000,
            bus_bytes_per_sec: 3_000_000_000,
        }
    }
}

impl SsdParams {
    /// A provisioned cloud disk like seed 003's small Azure premium disk: about 2 ms per
    /// operation, deep internal parallelism, and a 170 MB/s provisioned throughput cap.
    pub fn cloud_disk() -> SsdParams {
        SsdParams {
            channels: 256,
            read_latency: Duration::from_micros(2000),
            write_latency: Duration::from_micros(2000),
            flush_latency: Duration::from_micros(100),
            channel_bytes_per_sec: 1_000_000_000,
            bus_bytes_per_sec: 170_000_000,
        }
    }
}

impl SimProfile {
    pub fn hdd() -> SimProfile {
        SimProfile::Hdd(HddParams::default())
    }

    pub fn ssd() -> SimProfile {
        SimProfile::Ssd(SsdParams::default())
    }
}

/// Content and bookkeeping options.
#[derive(Clone, Copy, Debug)]
pub struct SimOptions {
    /// Keep written bytes. Off for timing-only benchmarks on large disks: reads return zeros.
    pub store_data: bool,
    /// Keep a write log (with payloads) for crash-point enumeration.
    pub record_log: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions { store_data: true, record_log: false }
    }
}

/// An injected fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Read-time: reads covering `offset_bytes` see bit `bit` flipped (latent corruption).
    BitFlip { offset_bytes: u64, bit: u8 },
    /// Read-time: reads overlapping the range fail with EIO (latent sector error).
    ReadError { offset_bytes: u64, len_bytes: u64 },
    /// Read-time: reads of the range return the bytes stored at `from_offset_bytes` instead, as
    /// a misdirected write or read leaves them.
    Misdirect { offset_bytes: u64, len_bytes: u64, from_offset_bytes: u64 },
    /// Write-time: writes overlapping the range fail with EIO and store nothing.
    WriteError { offset_bytes: u64, len_bytes: u64 },
    /// Write-time: writes overlapping the range report success and store nothing.
    Phantom { offset_bytes: u64, len_bytes: u64 },
    /// Write-time: writes starting in the range land `shift_bytes` further on (wrapping inside
    /// the device) and report success.
    MisdirectWrite { offset_bytes: u64, len_bytes: u64, shift_bytes: u64 },
    /// Flushes fail with EIO and make nothing durable.
    FlushError,
    /// The whole device is gone: every operation fails at once.
    Lost,
    /// Every service time is multiplied by `factor` (a gray failure).
    Slow { factor: u32 },
}

/// What survives of the volatile cache at a crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPolicy {
    /// Every unflushed write is lost.
    DropAll,
    /// Every unflushed write persists, in order.
    KeepAll,
    /// Each unflushed write persists with probability one half, in order.
    RandomSubset,
    /// A random subset persists, applied in random order (overlaps may end with older data).
    Reorder,
    /// A prefix persists, then one write persists only in some of its sectors; the rest is lost.
    TearOne,
    /// One of the above, drawn from the rng.
    Any,
}

/// One recorded device operation.
#[derive(Clone, Debug)]
pub struct LogEntry {
    pub op: DeviceOp,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// Flushes completed before this operation.
    pub flush_epoch: u64,
    /// When the device completed it (the cache took the write, the flush made it durable).
    pub at: crate::rt::Time,
    /// The bytes a write stored (after write-time faults), when the log keeps payloads.
    data: Option<SharedBuf>,
    /// A write's or discard's completion number; for a flush, the last write it covers.
    seq: u64,
}

/// A durable image: sparse pages of the device. A page whose bytes are all equal is kept as
/// that byte: benchmarks write constant payloads, and at tens of thousands of writes per
/// virtual second their images would otherwise fill the host's memory.
#[derive(Clone, Debug, Default)]
pub struct SimImage {
    pages: HashMap<u64, Page>,
}

#[derive(Clone, Debug)]
enum Page {
    Uniform(u8),
    Bytes(Box<[u8]>),
}

impl Page {
    fn byte(&self, at: usize) -> u8 {
        match self {
            Page::Uniform(value) => *value,
            Page::Bytes(bytes) => bytes[at],
        }
    }
}

/// Images are equal when every byte is: how a page is kept does not matter, and a missing
/// page reads as zeros.
impl PartialEq for SimImage {
    fn eq(&self, other: &SimImage) -> bool {
        let zero = Page::Uniform(0);
        self.pages.keys().chain(other.pages.keys()).all(|page| {
            let (a, b) =
                (self.pages.get(page).unwrap_or(&zero), other.pages.get(page).unwrap_or(&zero));
            (0..PAGE_BYTES as usize).all(|at| a.byte(at) == b.byte(at))
        })
    }
}

impl SimImage {
    fn write(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let page = at / PAGE_BYTES;
            let in_page = (at % PAGE_BYTES) as usize;
            let n = (PAGE_BYTES as usize - in_page).min(data.len() - done);
            let src = &data[done..done + n];
            let uniform = src.iter().all(|&b| b == src[0]);
            let slot = self.pages.entry(page).or_insert(Page::Uniform(0));
            match slot {
                Page::Uniform(value)
                    if uniform && (n == PAGE_BYTES as usize || *value == src[0]) =>
                {
                    *value = src[0];
                }
                Page::Uniform(value) => {
                    let mut bytes = vec![*value; PAGE_BYTES as usize].into_boxed_slice();
                    bytes[in_page..in_page + n].copy_from_slice(src);
                    *slot = Page::Bytes(bytes);
                }
                Page::Bytes(_) if uniform && n == PAGE_BYTES as usize => {
                    *slot = Page::Uniform(src[0]);
                }
                Page::Bytes(bytes) => bytes[in_page..in_page + n].copy_from_slice(src),
            }
            done += n;
        }
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        let mut done = 0usize;
        while done < out.len() {
            let at = offset + done as u64;
            let page = at / PAGE_BYTES;
            let in_page = (at % PAGE_BYTES) as usize;
            let n = (PAGE_BYTES as usize - in_page).min(out.len() - done);
            match self.pages.get(&page) {
                Some(Page::Bytes(bytes)) => {
                    out[done..done + n].copy_from_slice(&bytes[in_page..in_page + n]);
                }
                Some(Page::Uniform(value)) => out[done..done + n].fill(*value),
                None => out[done..done + n].fill(0),
            }
            done += n;
        }
    }

    /// Zeroes a range, dropping whole pages so a large discard costs no memory.
    fn zero(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let first_whole = offset.div_ceil(PAGE_BYTES);
        let last_whole = end / PAGE_BYTES;
        if first_whole < last_whole {
            if last_whole - first_whole < self.pages.len() as u64 {
                (first_whole..last_whole).for_each(|page| drop(self.pages.remove(&page)));
            } else {
                self.pages.retain(|page, _| !(first_whole..last_whole).contains(page));
            }
        }
        let zeros = [0u8; PAGE_BYTES as usize];
        let head_end = end.min(first_whole * PAGE_BYTES);
        if offset < head_end {
            self.write(offset, &zeros[..(head_end - offset) as usize]);
        }
        let tail_start = (last_whole * PAGE_BYTES).max(offset);
        if tail_start < end && last_whole >= first_whole {
            self.write(tail_start, &zeros[..(end - tail_start) as usize]);
        }
    }

    /// Bytes of pages that hold data.
    pub fn stored_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE_BYTES
    }
}

/// A completed but unflushed write in the volatile cache. Discards enter as writes of zeros
/// (a discarded range may read back as zeros or as its old data: both are allowed).
#[derive(Clone, Debug)]
struct PendingWrite {
    /// Completion order: a flush covers the writes completed before it was submitted.
    seq: u64,
    offset: u64,
    len: u64,
    /// `None`: a discard, which reads back as zeros.
    data: Option<SharedBuf>,
}

impl PendingWrite {
    fn apply(&self, image: &mut SimImage) {
        match &self.data {
            Some(data) => image.write(self.offset, data),
            None => image.zero(self.offset, self.len),
        }
    }
}

/// Counters a benchmark or test reads back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Commands served right behind the previous one with no positioning (HDD merges).
    pub merged: u64,
    pub busy_nanos: u64,
}

enum Request {
    Read {
        len: u32,
        done: oneshot::Sender<Result<AlignedBuf, DeviceError>>,
    },
    Write {
        data: SharedBuf,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
    /// `upto`: the last write completed when the flush was submitted; later ones stay
    /// volatile, as a real cache flush promises nothing about writes that completed after it
    /// was issued.
    Flush {
        upto: u64,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
    Discard {
        len: u64,
        done: oneshot::Sender<Result<(), DeviceError>>,
    },
}

struct Queued {
    offset: u64,
    request: Request,
    /// Crash generation the request was submitted in; a crash fails everything older.
    generation: u64,
}

struct HddState {
    head_offset: u64,
    ncq: Vec<Queued>,
    waiting: VecDeque<Queued>,
    serving: bool,
    /// Writes acknowledged from the drive's cache and not yet on the platter: (offset, len).
    cached_writes: Vec<(u64, u64)>,
    cached_bytes: u64,
}

struct SsdState {
    bus_free: Time,
    channel_free: Vec<Time>,
}

struct State {
    durable: SimImage,
    volatile: Vec<PendingWrite>,
    /// Writes completed so far (the last `PendingWrite::seq`).
    completed_writes: u64,
    faults: Vec<Fault>,
    log: Vec<LogEntry>,
    /// Image when the log started, so crash images can be rebuilt from it.
    log_base: Option<SimImage>,
    flush_epoch: u64,
    generation: u64,
    hdd: HddState,
    ssd: SsdState,
    rng: Rng,
    stats: SimStats,
}

struct Inner {
    name: String,
    env: Env,
    profile: SimProfile,
    options: SimOptions,
    len_bytes: u64,
    state: Mutex<State>,
}

/// A simulated disk. Cheap to clone: clones share the same disk.
#[derive(Clone)]
pub struct SimDevice {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("name", &self.inner.name)
            .field("profile", &self.inner.profile)
            .finish()
    }
}

impl SimDevice {
    pub fn new(
        env: &Env,
        name: &str,
        profile: SimProfile,
        len_bytes: u64,
        options: SimOptions,
    ) -> SimDevice {
        SimDevice::from_image(env, name, profile, len_bytes, options, SimImage::default())
    }

    /// A device whose durable contents are `image` (for example a crash image).
    pub fn from_image(
        env: &Env,
        name: &str,
        profile: SimProfile,
        len_bytes: u64,
        options: SimOptions,
        image: SimImage,
    ) -> SimDevice {
        assert!(len_bytes % PAGE_BYTES == 0, "sim device length must be whole 4 KiB pages");
        let channels = match &profile {
            SimProfile::Ssd(params) => params.channels.max(1),
            _ => 1,
        };
        let log_base = options.record_log.then(|| image.clone());
        let state = State {
            durable: image,
            volatile: Vec::new(),
            completed_writes: 0,
            faults: Vec::new(),
            log: Vec::new(),
            log_base,
            flush_epoch: 0,
            generation: 0,
            hdd: HddState {
                head_offset: 0,
                ncq: Vec::new(),
                waiting: VecDeque::new(),
                serving: false,
                cached_writes: Vec::new(),
                cached_bytes: 0,
            },
            ssd: SsdState { bus_free: Time::ZERO, channel_free: vec![Time::ZERO; channels] },
            rng: env.rng(&format!("sim_device/{name}")),
            stats: SimStats::default(),
        };
        SimDevice {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                env: env.clone(),
                profile,
                options,
                len_bytes,
                state: Mutex::new(state),
            }),
        }
    }

    pub fn inject(&self, fault: Fault) {
        self.inner.state.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.inner.state.lock().faults.clear();
    }

    pub fn stats(&self) -> SimStats {
        self.inner.state.lock().stats
    }

    /// Unflushed writes in the volatile cache.
    pub fn volatile_writes(&self) -> usize {
        self.inner.state.lock().volatile.len()
    }

    /// The durable image (what survives a crash that drops every unflushed write).
    pub fn durable_image(&self) -> SimImage {
        self.inner.state.lock().durable.clone()
    }

    /// Cuts power: the volatile cache is resolved into the durable image by `policy`, requests
    /// in flight fail, and the device comes back empty-cached and ready, like a disk after a
    /// power cycle.
    pub fn crash(&self, policy: CrashPolicy) {
        let mut state = self.inner.state.lock();
        let pending = std::mem::take(&mut state.volatile);
        let State { durable, rng, .. } = &mut *state;
        resolve_crash(durable, &pending, policy, rng);
        state.generation += 1;
        let generation = state.generation;
        // Requests queued in the drive die with the power; their submitters see the device gone.
        let hdd = &mut state.hdd;
        hdd.cached_writes.clear();
        hdd.cached_bytes = 0;
        let dead: Vec<Queued> = hdd.ncq.drain(..).chain(hdd.waiting.drain(..)).collect();
        state.hdd.serving = false;
        state.hdd.head_offset = 0;
        let now = self.inner.env.now();
        state.ssd.bus_free = now;
        state.ssd.channel_free.iter_mut().for_each(|t| *t = now);
        drop(state);
        for queued in dead {
            debug_assert!(queued.generation < generation);
            self.fail_gone(queued.request);
        }
    }

    /// The recorded operations (needs `record_log`).
    pub fn write_log(&self) -> Vec<LogEntry> {
        self.inner.state.lock().log.clone()
    }

    /// The durable image a power cut right after the first `ops` logged operations would leave,
    /// with the unflushed writes among them resolved by `policy`. Needs `record_log`.
    pub fn crash_image(&self, ops: usize, policy: CrashPolicy, rng: &mut Rng) -> Option<SimImage> {
        self.crash_image_lying(ops, policy, rng, |_| false)
    }

    /// As [`SimDevice::crash_image`], for a drive whose write cache lied about its flushes:
    /// the writes `lost` picks never reach the medium, flushed or not. A disk behind a cheap
    /// USB bridge or a controller with a volatile cache and no battery does this.
    pub fn crash_image_lying(
        &self,
        ops: usize,
        policy: CrashPolicy,
        rng: &mut Rng,
        mut lost: impl FnMut(&LogEntry) -> bool,
    ) -> Option<SimImage> {
        let state = self.inner.state.lock();
        let mut image = state.log_base.clone()?;
        let mut pending = Vec::new();
        for entry in state.log.iter().take(ops) {
            if entry.op == DeviceOp::Write && lost(entry) {
                continue;
            }
            match entry.op {
                DeviceOp::Flush => {
                    let (covered, later): (Vec<PendingWrite>, Vec<PendingWrite>) =
                        pending.drain(..).partition(|w: &PendingWrite| w.seq <= entry.seq);
                    covered.iter().for_each(|write| write.apply(&mut image));
                    pending = later;
                }
                DeviceOp::Write | DeviceOp::Discard => pending.push(PendingWrite {
                    seq: entry.seq,
                    offset: entry.offset_bytes,
                    len: entry.len_bytes,
                    data: entry.data.clone(),
                }),
                DeviceOp::Read | DeviceOp::Open => {}
            }
        }
        resolve_crash(&mut image, &pending, policy, rng);
        Some(image)
    }

    /// Checks the range, submits the request and waits for its answer; a request dropped
    /// unanswered (the device was torn down) reports the device gone.
    fn call<T: Send + 'static>(
        &self,
        op: DeviceOp,
        offset: u64,
        len: u64,
        request: impl FnOnce(oneshot::Sender<Result<T, DeviceError>>) -> Request,
    ) -> BoxFuture<Result<T, DeviceError>> {
        let inner = &self.inner;
        if op != DeviceOp::Flush {
            if let Err(e) = check_range(&inner.name, op, offset, len, inner.len_bytes, SECTOR_BYTES)
            {
                return async move { Err(e) }.boxed();
            }
        }
        let (done, wait) = oneshot::channel();
        self.submit(offset, request(done));
        let name = inner.name.clone();
        async move { wait.await.unwrap_or(Err(DeviceError::Gone { device: name })) }.boxed()
    }

    fn fail_gone(&self, request: Request) {
        let gone = || DeviceError::Gone { device: self.inner.name.clone() };
        match request {
            Request::Read { done, .. } => drop(done.send(Err(gone()))),
            Request::Write { done, .. }
            | Request::Flush { done, .. }
            | Request::Discard { done, .. } => drop(done.send(Err(gone()))),
        }
    }

    fn submit(&self, offset: u64, request: Request) {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        if state.faults.contains(&Fault::Lost) {
            drop(state);
            self.fail_gone(request);
            return;
        }
        let generation = state.generation;
        let queued = Queued { offset, request, generation };
        match &inner.profile {
            SimProfile::Instant => {
                drop(state);
                self.complete(queued);
            }
            SimProfile::Ssd(params) => {
                let done_at = ssd_schedule(params, &mut state, inner.env.now(), &queued);
                drop(state);
                let device = self.clone();
                inner.env.spawn("sim_ssd", async move {
                    device.inner.env.sleep_until(done_at).await;
                    device.complete(queued);
                });
            }
            SimProfile::Hdd(params) => {
                if state.hdd.ncq.len() < params.ncq_depth {
                    state.hdd.ncq.push(queued);
                } else {
                    state.hdd.waiting.push_back(queued);
                }
                if !state.hdd.serving {
                    state.hdd.serving = true;
                    drop(state);
                    let device = self.clone();
                    inner.env.spawn("sim_hdd", async move { device.serve_hdd().await });
                }
            }
        }
    }

    /// The drive's one actuator: serves queued commands in C-LOOK order until none are left.
    async fn serve_hdd(self) {
        let SimProfile::Hdd(params) = &self.inner.profile else { return };
        loop {
            let (queued, service) = {
                let mut state = self.inner.state.lock();
                let Some(index) = clook_next(&state.hdd.ncq, state.hdd.head_offset) else {
                    state.hdd.serving = false;
                    return;
                };
                let queued = state.hdd.ncq.swap_remove(index);
                if let Some(next) = state.hdd.waiting.pop_front() {
                    state.hdd.ncq.push(next);
                }
                let service = hdd_service(params, &mut state, &queued);
                (queued, service)
            };
            let done_at = self.inner.env.now().plus(service);
            self.inner.env.sleep_until(done_at).await;
            let stale = self.inner.state.lock().generation != queued.generation;
            if stale {
                // A crash happened while this command was on the platter.
                self.fail_gone(queued.request);
                return;
            }
            self.complete(queued);
        }
    }

    /// Applies a request's effect on content and answers its submitter.
    fn complete(&self, queued: Queued) {
        let inner = &self.inner;
        let mut state = inner.state.lock();
        if state.generation != queued.generation || state.faults.contains(&Fault::Lost) {
            drop(state);
            self.fail_gone(queued.request);
            return;
        }
        let offset = queued.offset;
        let epoch = state.flush_epoch;
        match queued.request {
            Request::Read { len, done } => {
                state.stats.reads += 1;
                state.stats.read_bytes += u64::from(len);
                let result = read_with_faults(inner, &state, offset, len);
                drop(state);
                let _ = done.send(result);
            }
            Request::Write { data, done } => {
                state.stats.writes += 1;
                state.stats.write_bytes += u64::from(data.len_bytes());
                let result = write_with_faults(inner, &mut state, offset, data, epoch);
                drop(state);
                let _ = done.send(result);
            }
            Request::Discard { len, done } => {
                state.stats.discards += 1;
                state.completed_writes += 1;
                let seq = state.completed_writes;
                if inner.options.store_data {
                    state.volatile.push(PendingWrite { seq, offset, len, data: None });
                }
                if inner.options.record_log {
                    let entry = LogEntry {
                        op: DeviceOp::Discard,
                        offset_bytes: offset,
                        len_bytes: len,
                        flush_epoch: epoch,
                        at: inner.env.now(),
                        data: None,
                        seq,
                    };
                    state.log.push(entry);
                }
                drop(state);
                let _ = done.send(Ok(()));
            }
            Request::Flush { upto, done } => {
                state.stats.flushes += 1;
                if state.faults.contains(&Fault::FlushError) {
                    drop(state);
                    let _ = done.send(Err(io_error(inner, DeviceOp::Flush, 0, 0)));
                    return;
                }
                let (covered, later): (Vec<PendingWrite>, Vec<PendingWrite>) =
                    std::mem::take(&mut state.volatile).into_iter().partition(|w| w.seq <= upto);
                for write in &covered {
                    write.apply(&mut state.durable);
                }
                state.volatile = later;
                state.flush_epoch += 1;
                if inner.options.record_log {
                    let entry = LogEntry {
                        op: DeviceOp::Flush,
                        offset_bytes: 0,
                        len_bytes: 0,
                        flush_epoch: epoch,
                        at: inner.env.now(),
                        data: None,
                        seq: upto,
                    };
                    state.log.push(entry);
                }
                drop(state);
                let _ = done.send(Ok(()));
            }
        }
    }
}

fn io_error(inner: &Inner, op: DeviceOp, offset: u64, len: u64) -> DeviceError {
    DeviceError::Io {
        device: inner.name.clone(),
        op,
        offset_bytes: offset,
        len_bytes: len,
        cause: io::Error::from_raw_os_error(libc::EIO),
    }
}

fn overlaps(a_offset: u64, a_len: u64, b_offset: u64, b_len: u64) -> bool {
    a_offset < b_offset.saturating_add(b_len) && b_offset < a_offset.saturating_add(a_len)
}

/// Current contents of `[offset, offset+len)`: durable image overlaid with the volatile cache.
fn contents(state: &State, offset: u64, out: &mut [u8]) {
    state.durable.read(offset, out);
    let len = out.len() as u64;
    for write in &state.volatile {
        if !overlaps(offset, len, write.offset, write.len) {
            continue;
        }
        let start = offset.max(write.offset);
        let end = (offset + len).min(write.offset + write.len);
        let dst = (start - offset) as usize..(end - offset) as usize;
        match &write.data {
            Some(data) => out[dst].copy_from_slice(
                &data[(start - write.offset) as usize..(end - write.offset) as usize],
            ),
            None => out[dst].fill(0),
        }
    }
}

fn read_with_faults(
    inner: &Inner,
    state: &State,
    offset: u64,
    len: u32,
) -> Result<AlignedBuf, DeviceError> {
    let len64 = u64::from(len);
    let mut buf = AlignedBuf::zeroed(len as usize);
    if !inner.options.store_data {
        return Ok(buf);
    }
    contents(state, offset, &mut buf);
    for fault in &state.faults {
        match *fault {
            Fault::ReadError { offset_bytes, len_bytes }
                if overlaps(offset, len64, offset_bytes, len_bytes) =>
            {
                return Err(io_error(inner, DeviceOp::Read, offset, len64));
            }
            Fault::Misdirect { offset_bytes, len_bytes, from_offset_bytes } => {
                if !overlaps(offset, len64, offset_bytes, len_bytes) {
                    continue;
                }
                let start = offset.max(offset_bytes);
                let end = (offset + len64).min(offset_bytes + len_bytes);
                let source = from_offset_bytes + (start - offset_bytes);
                let mut other = vec![0u8; (end - start) as usize];
                if source.saturating_add(other.len() as u64) <= inner.len_bytes {
                    contents(state, source, &mut other);
                }
                buf[(start - offset) as usize..(end - offset) as usize].copy_from_slice(&other);
            }
            Fault::BitFlip { offset_bytes, bit }
                if (offset..offset + len64).contains(&offset_bytes) =>
            {
                buf[(offset_bytes - offset) as usize] ^= 1 << (bit % 8);
            }
            _ => {}
        }
    }
    Ok(buf)
}

fn write_with_faults(
    inner: &Inner,
    state: &mut State,
    offset: u64,
    data: SharedBuf,
    epoch: u64,
) -> Result<(), DeviceError> {
    let len = u64::from(data.len_bytes());
    let mut target = Some(offset);
    for fault in &state.faults {
        match *fault {
            Fault::WriteError { offset_bytes, len_bytes }
                if overlaps(offset, len, offset_bytes, len_bytes) =>
            {
                return Err(io_error(inner, DeviceOp::Write, offset, len));
            }
            Fault::Phantom { offset_bytes, len_bytes }
                if overlaps(offset, len, offset_bytes, len_bytes) =>
            {
                target = None;
            }
            Fault::MisdirectWrite { offset_bytes, len_bytes, shift_bytes }
                if (offset_bytes..offset_bytes.saturating_add(len_bytes)).contains(&offset) =>
            {
                let span = inner.len_bytes - len;
                let shifted = (offset + shift_bytes) % span.max(1);
                target = target.map(|_| shifted - shifted % u64::from(SECTOR_BYTES));
            }
            _ => {}
        }
    }
    if let Some(at) = target {
        // Rewriting a sector cures its latent read faults, as a real drive remaps on write:
        // ranged faults keep only the parts outside the rewritten range.
        let faults = std::mem::take(&mut state.faults);
        state.faults = faults.into_iter().flat_map(|fault| cure(fault, at, len)).collect();
        state.completed_writes += 1;
        let seq = state.completed_writes;
        if inner.options.store_data {
            state.volatile.push(PendingWrite { seq, offset: at, len, data: Some(data.clone()) });
        }
        if inner.options.record_log {
            let entry = LogEntry {
                op: DeviceOp::Write,
                offset_bytes: at,
                len_bytes: len,
                flush_epoch: epoch,
                at: inner.env.now(),
                data: Some(data),
                seq,
            };
            state.log.push(entry);
        }
    }
    Ok(())
}

/// What remains of `fault` after `[at, at+len)` was rewritten.
fn cure(fault: Fault, at: u64, len: u64) -> Vec<Fault> {
    let end = at + len;
    let remainder = |offset: u64, fault_len: u64, make: &dyn Fn(u64, u64) -> Fault| {
        let fault_end = offset + fault_len;
        if !overlaps(offset, fault_len, at, len) {
            return vec![make(offset, fault_len)];
        }
        let mut kept = Vec::new();
        if offset < at {
            kept.push(make(offset, at - offset));
        }
        if end < fault_end {
            kept.push(make(end, fault_end - end));
        }
        kept
    };
    match fault {
        Fault::BitFlip { offset_bytes, .. } if (at..end).contains(&offset_bytes) => vec![],
        Fault::ReadError { offset_bytes, len_bytes } => {
            remainder(offset_bytes, len_bytes, &|o, l| Fault::ReadError {
                offset_bytes: o,
                len_bytes: l,
            })
        }
        Fault::Misdirect { offset_bytes, len_bytes, from_offset_bytes } => {
            remainder(offset_bytes, len_bytes, &|o, l| Fault::Misdirect {
                offset_bytes: o,
                len_bytes: l,
                from_offset_bytes: from_offset_bytes + (o - offset_bytes),
            })
        }
        other => vec![other],
    }
}

/// Applies the unflushed writes that survive a crash to `image`.
fn resolve_crash(
    image: &mut SimImage,
    pending: &[PendingWrite],
    policy: CrashPolicy,
    rng: &mut Rng,
) {
    let policy = match policy {
        CrashPolicy::Any => match rng.below(5) {
            0 => CrashPolicy::DropAll,
            1 => CrashPolicy::KeepAll,
            2 => CrashPolicy::RandomSubset,
            3 => CrashPolicy::Reorder,
            _ => CrashPolicy::TearOne,
        },
        other => other,
    };
    match policy {
        CrashPolicy::DropAll | CrashPolicy::Any => {}
        CrashPolicy::KeepAll => pending.iter().for_each(|w| w.apply(image)),
        CrashPolicy::RandomSubset => {
            for write in pending {
                if rng.chance(0.5) {
                    write.apply(image);
                }
            }
        }
        CrashPolicy::Reorder => {
            let mut kept: Vec<&PendingWrite> = pending.iter().filter(|_| rng.chance(0.5)).collect();
            rng.shuffle(&mut kept);
            kept.iter().for_each(|w| w.apply(image));
        }
        CrashPolicy::TearOne => {
            if pending.is_empty() {
                return;
            }
            let torn = rng.below(pending.len() as u64) as usize;
            pending[..torn].iter().for_each(|w| w.apply(image));
            let write = &pending[torn];
            let sector = u64::from(SECTOR_BYTES);
            for index in 0..write.len.div_ceil(sector) {
                if rng.chance(0.5) {
                    let at = index * sector;
                    let n = sector.min(write.len - at);
                    match &write.data {
                        Some(data) => {
                            image.write(write.offset + at, &data[at as usize..(at + n) as usize])
                        }
                        None => image.zero(write.offset + at, n),
                    }
                }
            }
        }
    }
}

/// C-LOOK: the queued command at or after the head with the lowest offset, else the lowest.
fn clook_next(queue: &[Queued], head: u64) -> Option<usize> {
    let ahead = queue
        .iter()
        .enumerate()
        .filter(|(_, q)| q.offset >= head)
        .min_by_key(|(i, q)| (q.offset, *i))
        .map(|(i, _)| i);
    ahead.or_else(|| queue.iter().enumerate().min_by_key(|(i, q)| (q.offset, *i)).map(|(i, _)| i))
}

fn slow_factor(state: &State) -> u32 {
    state
        .faults
        .iter()
        .filter_map(|f| if let Fault::Slow { factor } = f { Some(*factor) } else { None })
        .max()
        .unwrap_or(1)
        .max(1)
}

fn request_len(queued: &Queued) -> u64 {
    match &queued.request {
        Request::Read { len, .. } => u64::from(*len),
        Request::Write { data, .. } => u64::from(data.len_bytes()),
        Request::Discard { .. } | Request::Flush { .. } => 0,
    }
}

fn transfer(bytes: u64, bytes_per_sec: u64) -> Duration {
    Duration::from_nanos(bytes.saturating_mul(1_000_000_000) / bytes_per_sec.max(1))
}

/// Time to move the head from where it is to `target`, then transfer `len` bytes; moves it.
fn hdd_mechanical(params: &HddParams, state: &mut State, target: u64, len: u64) -> Duration {
    let head = state.hdd.head_offset;
    let positioning = if target == head {
        state.stats.merged += 1;
        Duration::ZERO
    } else {
        let distance = target.abs_diff(head) as f64;
        let fraction = (distance / 1e12_f64.max(distance)).sqrt();
        let span = params.full_stroke.saturating_sub(params.track_to_track);
        let revolution = Duration::from_nanos(60_000_000_000 / u64::from(params.rpm.max(1)));
        let seek =
            params.track_to_track + span.mul_f64(fraction) + revolution.mul_f64(state.rng.unit());
        // A short forward gap can be passed over by letting the platter turn; the drive
        // takes whichever is sooner.
        let pass_over = (target > head && target - head <= params.skip_window_bytes)
            .then(|| transfer(target - head, params.media_bytes_per_sec));
        pass_over.map_or(seek, |p| p.min(seek)) + params.command_overhead
    };
    state.hdd.head_offset = target + len;
    positioning + transfer(len, params.media_bytes_per_sec)
}

/// Service time of one HDD command, moving the head. With a write cache, writes are
/// acknowledged from the cache and a flush writes every cached write to the platter in
/// elevator order: that is where a sync write's mechanical cost is paid.
fn hdd_service(params: &HddParams, state: &mut State, queued: &Queued) -> Duration {
    let len = request_len(queued);
    let service = match queued.request {
        Request::Flush { .. } => {
            let mut cached = std::mem::take(&mut state.hdd.cached_writes);
            state.hdd.cached_bytes = 0;
            let head = state.hdd.head_offset;
            // C-LOOK from the head: everything ahead in offset order, then wrap.
            cached.sort_by_key(|&(offset, _)| (offset < head, offset));
            let mut total = params.flush_latency;
            for (offset, write_len) in cached {
                total += hdd_mechanical(params, state, offset, write_len);
            }
            total
        }
        Request::Discard { .. } => params.command_overhead,
        Request::Write { .. } if state.hdd.cached_bytes + len <= params.write_cache_bytes => {
            state.hdd.cached_writes.push((queued.offset, len));
            state.hdd.cached_bytes += len;
            params.command_overhead + transfer(len, params.interface_bytes_per_sec)
        }
        Request::Read { .. } | Request::Write { .. } => {
            hdd_mechanical(params, state, queued.offset, len)
        }
    };
    let service = service * slow_factor(state);
    state.stats.busy_nanos += u64::try_from(service.as_nanos()).unwrap_or(u64::MAX);
    service
}

/// Completion time of an SSD command: FIFO through the transfer stage, then the first free
/// channel. Computed at submission because the order never changes after arrival.
fn ssd_schedule(params: &SsdParams, state: &mut State, now: Time, queued: &Queued) -> Time {
    let slow = slow_factor(state);
    let len = request_len(queued);
    let latency = match queued.request {
        Request::Read { .. } => params.read_latency + transfer(len, params.channel_bytes_per_sec),
        Request::Write { .. } => params.write_latency + transfer(len, params.channel_bytes_per_sec),
        Request::Flush { .. } => params.flush_latency,
        Request::Discard { .. } => params.write_latency,
    } * slow;
    let bus_start = state.ssd.bus_free.max(now);
    let bus_done = bus_start.plus(transfer(len, params.bus_bytes_per_sec) * slow);
    state.ssd.bus_free = bus_done;
    let (channel, free) = state
        .ssd
        .channel_free
        .iter()
        .copied()
        .enumerate()
        .min_by_key(|(i, t)| (*t, *i))
        .unwrap_or((0, now));
    let start = free.max(bus_done);
    let done = start.plus(latency);
    if let Some(slot) = state.ssd.channel_free.get_mut(channel) {
        *slot = done;
    }
    state.stats.busy_nanos += done.since(bus_start).as_nanos() as u64;
    done
}

impl BlockDevice for SimDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes
    }

    fn sector_bytes(&self) -> u32 {
        SECTOR_BYTES
    }

    fn is_rotational(&self) -> bool {
        matches!(self.inner.profile, SimProfile::Hdd(_))
    }

    /// An SSD with one channel runs one flush at a time, as a file leaf's do: the intent log's
    /// tuner treats it as it treats a file.
    fn parallel_flushes(&self) -> bool {
        match &self.inner.profile {
            SimProfile::Hdd(_) => false,
            SimProfile::Ssd(params) => params.channels > 1,
            SimProfile::Instant => true,
        }
    }

    fn read_at(&self, offset: u64, len: u32) -> BoxFuture<Result<AlignedBuf, DeviceError>> {
        self.call(DeviceOp::Read, offset, u64::from(len), |done| Request::Read { len, done })
    }

    fn write_at(&self, offset: u64, data: SharedBuf) -> BoxFuture<Result<(), DeviceError>> {
        let len = u64::from(data.len_bytes());
        self.call(DeviceOp::Write, offset, len, |done| Request::Write { data, done })
    }

    fn flush(&self) -> BoxFuture<Result<(), DeviceError>> {
        // Flush is ordered behind the head's current position like any command: offset 0
        // would make C-LOOK serve it first, so it queues at the head.
        let (at, upto) = {
            let state = self.inner.state.lock();
            (state.hdd.head_offset, state.completed_writes)
        };
        self.call(DeviceOp::Flush, at, 0, move |done| Request::Flush { upto, done })
    }

    fn discard(&self, offset: u64, len: u64) -> BoxFuture<Result<(), DeviceError>> {
        self.call(DeviceOp::Discard, offset, len, |done| Request::Discard { len, done })
    }
}
