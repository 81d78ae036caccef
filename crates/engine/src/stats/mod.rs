//! Counters and latency histograms per vdev (and later per pool and volume).
//!
//! Everything here is updated with relaxed atomics on the I/O path and read as a consistent
//! enough snapshot by `status`/`iostat`: counters only go up, so a reader never sees a total go
//! backwards. The histogram is fixed-size (log-linear buckets, 4 sub-buckets per power of two,
//! about 19% relative error) so recording is allocation-free and lock-free; written here because
//! hdrhistogram needs `&mut` to record and would put a lock on every I/O completion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        let rank = ((count as f64 * quantile.clamp(0.0, 1.0)).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, bucket) in self.buckets.iter().enumerate() {
            seen += bucket.load(Ordering::Relaxed);
            if seen >= rank {
                return Duration::from_nanos(bucket_limit(index));
            }
        }
        Duration::from_nanos(bucket_limit(BUCKET_COUNT - 1))
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
    pub read_errors: Counter,
    pub write_errors: Counter,
    pub flush_errors: Counter,
    pub checksum_errors: Counter,
    /// Bad copies rewritten from a good one.
    pub repairs: Counter,
    /// I/Os that rode in another's device command (aggregation).
    pub aggregated: Counter,
    /// Time from enqueue to completion, per class.
    pub latency: [Histogram; crate::tunables::IoClass::COUNT],
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
}
