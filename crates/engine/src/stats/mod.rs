//! Counters and latency histograms per vdev and per volume.
//!
//! Everything here is updated with relaxed atomics on the I/O path and read as a consistent
//! enough snapshot by `status`/`iostat`: counters only go up, so a reader never sees a total go
//! backwards, and the difference of two snapshots (a [`HistogramSnapshot`] too) describes what
//! happened between them. The histogram is fixed-size (log-linear buckets, 4 sub-buckets per
//! power of two, about 19% relative error) so recording is allocation-free and lock-free;
//! written here because hdrhistogram needs `&mut` to record and would put a lock on every I/O
//! completion.
//!
//! A [`HistogramSnapshot`] serializes (serde) in its sparse form, only the nonzero buckets,
//! so the statistics a server sends to `sluice pool iostat` stay small; reading one back
//! rejects a bucket index this build does not have.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

const SUB_BUCKET_BITS: u32 = 2;
const SUB_BUCKETS: usize = 1 << SUB_BUCKET_BITS;
/// Buckets cover 1 ns .. 2^40 ns (about 18 minutes); slower samples land in the last bucket.
const BUCKET_COUNT: usize = 41 * SUB_BUCKETS;

/// A lock-free latency histogram.
#[derive(Debug)]
pub struct Histogram {
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..BUCKET_COUNT).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

fn bucket_of(nanos: u64) -> usize {
    if nanos < SUB_BUCKETS as u64 {
        return nanos as usize;
    }
    let exponent = 63 - nanos.leading_zeros();
    let sub = (nanos >> (exponent - SUB_BUCKET_BITS)) as usize & (SUB_BUCKETS - 1);
    (((exponent - SUB_BUCKET_BITS + 1) as usize) * SUB_BUCKETS + sub).min(BUCKET_COUNT - 1)
}

/// The upper edge, in nanoseconds, of bucket `index` of a [`HistogramSnapshot`]: every sample
/// counted in that bucket took at most this long (up to the last bucket, which also holds
/// everything slower). Exporters use it to regroup the buckets into their own.
pub fn bucket_upper_nanos(index: usize) -> u64 {
    bucket_limit(index.min(BUCKET_COUNT - 1))
}

/// Upper edge of a bucket, in nanoseconds.
fn bucket_limit(index: usize) -> u64 {
    if index < SUB_BUCKETS {
        return index as u64 + 1;
    }
    let exponent = (index / SUB_BUCKETS) as u32 + SUB_BUCKET_BITS - 1;
    let sub = (index % SUB_BUCKETS) as u64;
    ((SUB_BUCKETS as u64 + sub + 1) << (exponent - SUB_BUCKET_BITS)).saturating_sub(1)
}

impl Histogram {
    pub fn record(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(nanos)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn mean(&self) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed) / count)
    }

    /// The latency below which `quantile` (0..=1) of the samples fall, to bucket precision.
    pub fn quantile(&self, quantile: f64) -> Duration {
        quantile_of(self.buckets.iter().map(|b| b.load(Ordering::Relaxed)), self.count(), quantile)
    }

    /// The counts now, to subtract an earlier snapshot from or to send elsewhere.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            count: self.count(),
            sum_nanos: self.sum_nanos.load(Ordering::Relaxed),
        }
    }
}

fn quantile_of(buckets: impl Iterator<Item = u64>, count: u64, quantile: f64) -> Duration {
    if count == 0 {
        return Duration::ZERO;
    }
    let rank = ((count as f64 * quantile.clamp(0.0, 1.0)).ceil() as u64).max(1);
    let mut seen = 0;
    for (index, bucket) in buckets.enumerate() {
        seen += bucket;
        if seen >= rank {
            return Duration::from_nanos(bucket_limit(index));
        }
    }
    Duration::from_nanos(bucket_limit(BUCKET_COUNT - 1))
}

/// A histogram's counts at one moment. Recording and snapshotting race (a sample may be in
/// `count` and not yet in its bucket), so quantiles of a snapshot are as precise as the
/// buckets, not exact.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "SparseHistogram", try_from = "SparseHistogram")]
pub struct HistogramSnapshot {
    /// One count per bucket; empty for a snapshot of nothing.
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_nanos: u64,
}

impl HistogramSnapshot {
    /// What was recorded after `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
            .collect();
        HistogramSnapshot {
            buckets,
            count: self.count.saturating_sub(earlier.count),
            sum_nanos: self.sum_nanos.saturating_sub(earlier.sum_nanos),
        }
    }

    pub fn mean(&self) -> Duration {
        Duration::from_nanos(self.sum_nanos.checked_div(self.count).unwrap_or(0))
    }

    /// As [`Histogram::quantile`].
    pub fn quantile(&self, quantile: f64) -> Duration {
        let count = self.count.min(self.buckets.iter().sum());
        quantile_of(self.buckets.iter().copied(), count, quantile)
    }

    /// The nonzero buckets as (index, count) pairs: a compact form to send.
    pub fn sparse(&self) -> Vec<(usize, u64)> {
        self.buckets.iter().copied().enumerate().filter(|(_, n)| *n > 0).collect()
    }

    /// Rebuilds a snapshot from [`HistogramSnapshot::sparse`]; `None` if an index is out of
    /// range.
    pub fn from_sparse(
        pairs: &[(usize, u64)],
        count: u64,
        sum_nanos: u64,
    ) -> Option<HistogramSnapshot> {
        let mut buckets = vec![0; BUCKET_COUNT];
        for &(index, n) in pairs {
            *buckets.get_mut(index)? = n;
        }
        Some(HistogramSnapshot { buckets, count, sum_nanos })
    }
}

/// The serialized form of a [`HistogramSnapshot`]: most buckets of a latency histogram are
/// empty, so only the others travel, as (index, count) pairs.
#[derive(Serialize, Deserialize)]
struct SparseHistogram {
    count: u64,
    sum_nanos: u64,
    buckets: Vec<(usize, u64)>,
}

impl From<HistogramSnapshot> for SparseHistogram {
    fn from(snapshot: HistogramSnapshot) -> SparseHistogram {
        SparseHistogram {
            count: snapshot.count,
            sum_nanos: snapshot.sum_nanos,
            buckets: snapshot.sparse(),
        }
    }
}

/// A serialized histogram names a bucket this build does not have (a different version of
/// sluice wrote it).
#[derive(Debug, thiserror::Error)]
#[error("histogram bucket {index} does not exist (this build has {BUCKET_COUNT} buckets)")]
pub struct BucketOutOfRange {
    pub index: usize,
}

impl TryFrom<SparseHistogram> for HistogramSnapshot {
    type Error = BucketOutOfRange;

    fn try_from(sparse: SparseHistogram) -> Result<HistogramSnapshot, BucketOutOfRange> {
        HistogramSnapshot::from_sparse(&sparse.buckets, sparse.count, sparse.sum_nanos).ok_or_else(
            || {
                let index = sparse.buckets.iter().map(|(i, _)| *i).max().unwrap_or(BUCKET_COUNT);
                BucketOutOfRange { index }
            },
        )
    }
}

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What one leaf vdev has done. Errors are counted where they were seen; a read that another
/// mirror child served still counts against the child that failed it.
#[derive(Debug, Default)]
pub struct LeafStats {
    pub reads: Counter,
    pub writes: Counter,
    pub read_bytes: Counter,
    pub write_bytes: Counter,
    pub flushes: Counter,
    /// Times the txg sync's writes waited for the intent log's flushes
    /// (`vdev.sync_pace_bytes`).
    pub sync_paced: Counter,
    pub read_errors: Counter,
    pub write_errors: Counter,
    pub flush_errors: Counter,
    pub checksum_errors: Counter,
    /// Bad copies rewritten from a good one.
    pub repairs: Counter,
    /// I/Os that rode in another's device command (aggregation).
    pub aggregated: Counter,
    /// Device commands that carried async writes (ZFS's `async_write` class: the txg sync's
    /// blocks, a receive's, and a resilver's or a repair's copies while one runs), and those
    /// writes' bytes: how large the sync's writes reach the device. On a pool about half full,
    /// random rewrites leave its free space in small ranges, and these stay small whatever the
    /// queue merges (docs/bench/alloc.md). Labels and uberblocks are sync writes, as in ZFS.
    pub async_write_commands: Counter,
    pub async_written: Counter,
    /// Time from enqueue to completion, per class.
    pub latency: [Histogram; crate::tunables::IoClass::COUNT],
}

/// What a volume's clients asked of it, counted by the volume front ([`crate::volume`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeOp {
    Read,
    Write,
    Flush,
    /// Trim and write-zeroes.
    Zero,
}

impl VolumeOp {
    pub const COUNT: usize = 4;
    pub const ALL: [VolumeOp; VolumeOp::COUNT] =
        [VolumeOp::Read, VolumeOp::Write, VolumeOp::Flush, VolumeOp::Zero];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            VolumeOp::Read => "read",
            VolumeOp::Write => "write",
            VolumeOp::Flush => "flush",
            VolumeOp::Zero => "zero",
        }
    }
}

/// What one volume's clients asked of it since import, shared by every handle on the volume.
/// A request counts when it is answered; `latency` runs from the volume front taking it to
/// the answer, so it includes waiting for the log (flushes, FUA writes) and for the throttle.
#[derive(Debug, Default)]
pub struct VolumeStats {
    /// Requests answered, successfully or not, per [`VolumeOp`].
    pub requests: [Counter; VolumeOp::COUNT],
    /// Bytes read and written (zeroed ranges are not counted).
    pub read_bytes: Counter,
    pub write_bytes: Counter,
    /// Requests answered with an error.
    pub errors: Counter,
    /// Writes that covered only part of a volume block: the txg sync rewrites the whole block
    /// for each (read-modify-write), so a volume whose writes are mostly partial would do
    /// better with a smaller block size.
    pub partial_writes: Counter,
    pub latency: [Histogram; VolumeOp::COUNT],
    /// What the volume's prefetch did (crate::txg's dmu_zfetch).
    pub prefetch: PrefetchStats,
    /// What the rewrites of blocks its sequential reads found scattered did (crate::txg's
    /// dmu_rewrite).
    pub rewrite: RewriteStats,
}

/// What a volume's rewrites of the blocks its sequential reads found scattered did since
/// import.
#[derive(Debug, Default)]
pub struct RewriteStats {
    /// Reads that continued a stream and found their blocks scattered on disk.
    pub scattered_reads: Counter,
    /// Blocks those reads handed to the open txg, to be written side by side.
    pub blocks_rewritten: Counter,
    /// Blocks left where they lie because a snapshot, a clone's origin or the dedup table
    /// shares them (moving them would free nothing and take space twice).
    pub blocks_shared: Counter,
    /// Blocks left where they lie for now: changed since the read, or the open txg held its
    /// share of rewrites already, or the pool's free space was short.
    pub blocks_deferred: Counter,
}

/// What a volume's prefetch of sequential reads did since import.
#[derive(Debug, Default)]
pub struct PrefetchStats {
    /// Reads that continued a stream, and reads that matched none.
    pub hits: Counter,
    pub misses: Counter,
    /// Blocks fetched ahead, and the I/Os that read them.
    pub blocks_fetched: Counter,
    pub ios: Counter,
    /// Blocks a read took from what was fetched ahead.
    pub blocks_used: Counter,
    /// Blocks fetched ahead that no read took: the stream ended or skipped them, or the block
    /// was written since.
    pub blocks_unused: Counter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bounded() {
        let mut last = 0;
        for nanos in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 123_456, 1 << 39, u64::MAX] {
            let bucket = bucket_of(nanos);
            assert!(bucket >= last && bucket < BUCKET_COUNT);
            if nanos < (1 << 39) {
                assert!(bucket_limit(bucket) >= nanos, "{nanos} above its bucket's limit");
            }
            last = bucket;
        }
    }

    /// Quantiles come out within bucket precision (25%) of the true values.
    #[test]
    fn quantiles_are_close() {
        let histogram = Histogram::default();
        for micros in 1..=1000u64 {
            histogram.record(Duration::from_micros(micros));
        }
        let p50 = histogram.quantile(0.5).as_micros() as f64;
        let p99 = histogram.quantile(0.99).as_micros() as f64;
        assert!((p50 - 500.0).abs() / 500.0 < 0.25, "p50 {p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.25, "p99 {p99}");
        assert_eq!(histogram.count(), 1000);
    }

    /// The difference of two snapshots holds exactly the samples recorded between them, and
    /// survives the sparse form.
    #[test]
    fn snapshots_subtract_and_round_trip() {
        let histogram = Histogram::default();
        for micros in 1..=100u64 {
            histogram.record(Duration::from_micros(micros));
        }
        let before = histogram.snapshot();
        for _ in 0..50 {
            histogram.record(Duration::from_millis(10));
        }
        let after = histogram.snapshot();
        let between = after.since(&before);
        assert_eq!(between.count, 50);
        assert_eq!(between.mean(), Duration::from_millis(10));
        let p50 = between.quantile(0.5).as_micros() as f64;
        assert!((p50 - 10_000.0).abs() / 10_000.0 < 0.25, "p50 {p50}");
        // The earlier samples are gone from the difference: its smallest sample is 10 ms.
        assert!(between.quantile(0.0) >= Duration::from_millis(8));
        let sparse = after.sparse();
        let rebuilt = HistogramSnapshot::from_sparse(&sparse, after.count, after.sum_nanos);
        assert_eq!(rebuilt.as_ref(), Some(&after));
        assert_eq!(HistogramSnapshot::from_sparse(&[(BUCKET_COUNT, 1)], 1, 1), None);
    }

    /// A snapshot survives serde (in its sparse form), and a bucket index past the last is
    /// refused rather than dropped or panicked on.
    #[test]
    fn snapshots_serialize_sparse_and_reject_bad_buckets() {
        let histogram = Histogram::default();
        histogram.record(Duration::from_micros(3));
        histogram.record(Duration::from_millis(7));
        let snapshot = histogram.snapshot();
        let text = serde_json::to_string(&snapshot).expect("serialize");
        assert_eq!(text.matches('[').count(), 3, "two nonzero buckets only: {text}");
        let back: HistogramSnapshot = serde_json::from_str(&text).expect("deserialize");
        assert_eq!(back, snapshot);
        let bad = format!(r#"{{"count":1,"sum_nanos":1,"buckets":[[{BUCKET_COUNT},1]]}}"#);
        let error = serde_json::from_str::<HistogramSnapshot>(&bad).expect_err("out of range");
        assert!(error.to_string().contains(&format!("bucket {BUCKET_COUNT}")), "{error}");
    }

    /// Every sample lies at or below the upper edge of the bucket it is counted in, and the
    /// edges never shrink with the index: what an exporter regrouping buckets relies on.
    #[test]
    fn bucket_upper_edges_bound_their_samples() {
        for nanos in [1u64, 5, 1023, 1024, 1025, 999_999, 1 << 30] {
            assert!(bucket_upper_nanos(bucket_of(nanos)) >= nanos, "{nanos}");
        }
        for index in 1..BUCKET_COUNT {
            assert!(bucket_upper_nanos(index) >= bucket_upper_nanos(index - 1), "{index}");
        }
        assert_eq!(bucket_upper_nanos(BUCKET_COUNT + 5), bucket_upper_nanos(BUCKET_COUNT - 1));
    }
}
