//! `sluice serve --metrics ADDR`: the served pool's statistics for Prometheus, over HTTP.
//!
//! Each scrape captures a [`PoolSnapshot`] (the same figures `sluice pool iostat` diffs) and
//! renders it with `prometheus-client`, the Prometheus project's Rust client, into the
//! OpenMetrics text format: a fresh registry per scrape holding one [`Collector`] over the
//! snapshot, so the server keeps no metric state of its own and nothing can drift from what
//! iostat shows. Names start with `sluice_`, carry their unit (`_bytes`, `_seconds`), and
//! counters end in `_total`; labels are `pool`, `vdev` and `leaf` (its path) for leaves,
//! `volume` for volumes, and `class` (I/O class), `op` (request type), `kind` or `stage`
//! where a figure is split. The engine's latency histograms (4 log-linear buckets per power of
//! two, in nanoseconds) are regrouped into seconds buckets whose bounds are engine bucket
//! edges a factor 2 apart, so no sample moves to a bucket it does not belong to.
//!
//! The HTTP side is about a hundred lines on tokio rather than an HTTP crate: a scrape is one
//! `GET /metrics` with no body, answered with the whole text and `Connection: close`, and
//! hyper (or a framework over it) would add more compile time than the rest of the command
//! for no part of HTTP a scrape uses.
//! It reads at most [`REQUEST_HEAD_BYTES_MAX`] of request head within [`REQUEST_TIMEOUT`],
//! serves at most [`SCRAPES_MAX`] connections at once, answers 404 for other paths, 405 for
//! other methods, 400 for anything that is not an HTTP/1 request line, and never panics on
//! what a client sends. There is no authentication: anyone who can reach ADDR can read the
//! pool's layout, device paths and volume names, so bind it to loopback or a private network.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use sluice_engine::stats::{bucket_upper_nanos, HistogramSnapshot};
use sluice_engine::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::snapshot::{
    class_names, op_names, DedupSnapshot, LeafSnapshot, PoolSnapshot, VolumeSnapshot,
};

/// The content type of the OpenMetrics text format, which `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A scrape's request line and headers fit in far less; more is not a scrape.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 << 10;
/// How long a client may take to send its request and read the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more are closed at once, so a flood costs no memory.
pub const SCRAPES_MAX: usize = 16;
/// Histogram bounds: engine bucket edges at 2^k - 1 ns for k in this range, about 1 us to
/// 69 s; a sample above the last counts only in `+Inf`.
const BOUND_EXPONENTS: std::ops::RangeInclusive<u32> = 10..=36;

/// Listens on `address` and answers scrapes of the served store until the task is aborted.
/// Returns the address bound (a port of 0 picks a free one). Scrapes hold the store only
/// while they capture it, so a scrape in flight never keeps the server from exporting the
/// pool at shutdown.
pub async fn serve(
    store: &Arc<Store>,
    address: &str,
) -> anyhow::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(address).await.with_context(|| {
        format!(
            "listening for metrics on {address}: pass a free HOST:PORT to --metrics (for \
             example 127.0.0.1:9127), or leave --metrics out"
        )
    })?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("reading the address the metrics listener on {address} got"))?;
    let store = Arc::downgrade(store);
    let scrape = move || {
        let snapshot = PoolSnapshot::capture(&*store.upgrade().ok_or(ScrapeError::Stopping)?);
        render(&snapshot).map_err(|fmt::Error| ScrapeError::Render)
    };
    Ok((bound, tokio::spawn(accept_loop(listener, scrape))))
}

/// Why a scrape has no text to answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScrapeError {
    /// The server is exporting the pool.
    Stopping,
    /// The encoder failed (it writes to a String, so it does not).
    Render,
}

/// Answers each connection on its own task, at most [`SCRAPES_MAX`] at once.
async fn accept_loop<F>(listener: TcpListener, render: F)
where
    F: Fn() -> Result<String, ScrapeError> + Send + Sync + 'static,
{
    let render = Arc::new(render);
    let slots = Arc::new(Semaphore::new(SCRAPES_MAX));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, most likely: wait rather than spin, and keep the
                // NBD side serving.
                eprintln!("sluice: accepting a metrics connection: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else { continue };
        let render = Arc::clone(&render);
        tokio::spawn(async move {
            let _slot = slot;
            // A client too slow to finish in time is simply disconnected.
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &*render)).await;
        });
    }
}

/// What a request head asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    /// `GET /metrics` (any query string), or `HEAD` for the headers only.
    Metrics { head_only: bool },
    /// Another method on `/metrics`.
    MethodNotAllowed,
    /// Another path.
    NotFound,
    /// Not an HTTP/1 request line.
    Bad,
}

/// Reads a request head from `bytes`, which hold at least its first line.
fn parse(bytes: &[u8]) -> Request {
    let line_end = bytes.iter().position(|&b| b == b'\n').unwrap_or(bytes.len());
    let Some(line) = bytes.get(..line_end) else { return Request::Bad };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(line) = std::str::from_utf8(line) else { return Request::Bad };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Request::Bad;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Request::Bad;
    }
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    match (path, method) {
        ("/metrics", "GET") => Request::Metrics { head_only: false },
        ("/metrics", "HEAD") => Request::Metrics { head_only: true },
        ("/metrics", _) => Request::MethodNotAllowed,
        _ => Request::NotFound,
    }
}

/// Where the request head ends (after its blank line), if `bytes` hold all of it.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Reads one request and answers it; any I/O error just ends the connection.
async fn answer<F>(mut stream: TcpStream, render: &F) -> std::io::Result<()>
where
    F: Fn() -> Result<String, ScrapeError>,
{
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let request = loop {
        if head_end(&head).is_some() {
            break parse(&head);
        }
        if head.len() >= REQUEST_HEAD_BYTES_MAX {
            let message = "request head too large\n";
            return respond(&mut stream, "431 Request Header Fields Too Large", message).await;
        }
        let room = (REQUEST_HEAD_BYTES_MAX - head.len()).min(chunk.len());
        let read = stream.read(&mut chunk[..room]).await?;
        if read == 0 {
            // The client stopped before the blank line ending the head.
            break Request::Bad;
        }
        head.extend_from_slice(&chunk[..read]);
    };
    match request {
        Request::Metrics { head_only } => match render() {
            Ok(body) => {
                let header = header("200 OK", CONTENT_TYPE, body.len(), "");
                stream.write_all(header.as_bytes()).await?;
                if !head_only {
                    stream.write_all(body.as_bytes()).await?;
                }
                stream.shutdown().await
            }
            Err(ScrapeError::Stopping) => {
                let message = "the server is stopping and exporting the pool\n";
                respond(&mut stream, "503 Service Unavailable", message).await
            }
            Err(ScrapeError::Render) => {
                let message = "the statistics could not be rendered\n";
                respond(&mut stream, "500 Internal Server Error", message).await
            }
        },
        Request::MethodNotAllowed => {
            let message = "only GET and HEAD are answered\n";
            let header = header("405 Method Not Allowed", "text/plain", message.len(), "GET, HEAD");
            stream.write_all(header.as_bytes()).await?;
            stream.write_all(message.as_bytes()).await?;
            stream.shutdown().await
        }
        Request::NotFound => {
            respond(&mut stream, "404 Not Found", "the metrics are at /metrics\n").await
        }
        Request::Bad => {
            respond(&mut stream, "400 Bad Request", "expected GET /metrics HTTP/1.1\n").await
        }
    }
}

fn header(status: &str, content_type: &str, length: usize, allow: &str) -> String {
    let allow = if allow.is_empty() { String::new() } else { format!("Allow: {allow}\r\n") };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\
         {allow}Connection: close\r\n\r\n"
    )
}

async fn respond(stream: &mut TcpStream, status: &str, message: &str) -> std::io::Result<()> {
    let header = header(status, "text/plain; charset=utf-8", message.len(), "");
    stream.write_all(header.as_bytes()).await?;
    stream.write_all(message.as_bytes()).await?;
    stream.shutdown().await
}

/// The snapshot in the OpenMetrics text format, ending with `# EOF`.
pub fn render(snapshot: &PoolSnapshot) -> Result<String, fmt::Error> {
    let mut registry = Registry::with_prefix("sluice");
    registry.register_collector(Box::new(SnapshotCollector(snapshot.clone())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(text)
}

/// One scrape's figures, encoded when the registry is.
#[derive(Debug)]
struct SnapshotCollector(PoolSnapshot);

type Labels = Vec<(&'static str, String)>;

/// What a figure counts, which decides its unit suffix and how its value is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    Count,
    Bytes,
    /// Held in nanoseconds, exposed in seconds.
    Nanos,
}

/// One metric family read off a part of the snapshot: its name after `sluice_` (without the
/// unit and `_total`, which the encoder adds), its help text, and its value for each part.
struct Figure<T> {
    name: &'static str,
    help: &'static str,
    measure: Measure,
    value: fn(&T) -> u64,
}

const fn figure<T>(
    name: &'static str,
    help: &'static str,
    measure: Measure,
    value: fn(&T) -> u64,
) -> Figure<T> {
    Figure { name, help, measure, value }
}

use Measure::{Bytes, Count, Nanos};

const POOL_COUNTERS: &[Figure<PoolSnapshot>] = &[
    figure("txg_syncs", "Txgs synced since import.", Count, |p| p.txg_syncs),
    figure(
        "log_commits",
        "Intent-log commits (FUA writes and flushes with records to make durable).",
        Count,
        |p| p.intent_log.commits,
    ),
    figure(
        "log_early_commits",
        "Log commits sent before their flush arrived (a lone sync writer's).",
        Count,
        |p| p.intent_log.early_commits,
    ),
    figure(
        "log_early_fills",
        "Parts of a lone writer's large write whose blocks were written in place while the rest \
         of its payload was still arriving.",
        Count,
        |p| p.intent_log.early_fills,
    ),
    figure(
        "log_txg_commits",
        "Commits answered by a txg sync instead of a log write.",
        Count,
        |p| p.intent_log.commits_via_txg,
    ),
    figure(
        "log_syncs_for_space",
        "Txg syncs asked for because log blocks held three quarters of a log region.",
        Count,
        |p| p.intent_log.syncs_for_log_space,
    ),
    figure(
        "log_blocks_written",
        "Log blocks written by the volumes' current log chains (a destroyed volume's leave \
         the sum).",
        Count,
        |p| p.intent_log.blocks_written,
    ),
    figure(
        "log_groups_written",
        "Groups of log blocks written and made durable by one flush, by the current chains.",
        Count,
        |p| p.intent_log.groups_written,
    ),
    figure("log_records_written", "Records the current chains' log blocks carried.", Count, |p| {
        p.intent_log.records_written
    }),
    figure("log_block_written", "Bytes of log blocks written by the current chains.", Bytes, |p| {
        p.intent_log.block_bytes_written
    }),
    figure(
        "log_block_allocated",
        "Bytes allocated for those log blocks (what is not written is left unwritten).",
        Bytes,
        |p| p.intent_log.block_bytes_allocated,
    ),
    figure("log_claimed_chains", "Log chains claimed at import.", Count, |p| {
        p.intent_log.chains_claimed
    }),
    figure("log_claimed_blocks", "Log blocks found in the chains claimed at import.", Count, |p| {
        p.intent_log.blocks_claimed
    }),
    figure("log_replayed_records", "Log records replayed at import.", Count, |p| {
        p.intent_log.records_replayed
    }),
    figure(
        "log_torn_tails",
        "Log chains that ended at a block written only in part.",
        Count,
        |p| p.intent_log.torn_tails,
    ),
    figure(
        "throttle_delayed_writes",
        "Writes the write throttle delayed because dirty data was building up.",
        Count,
        |p| p.throttle.delayed,
    ),
    figure("throttle_delay", "Time writes spent delayed by the write throttle.", Nanos, |p| {
        p.throttle.delayed_nanos
    }),
    figure(
        "throttle_delays_cut_by_sync",
        "Delayed writes woken before their delay's end because the txg they filled started its sync.",
        Count,
        |p| p.throttle.woken_by_sync,
    ),
    figure(
        "throttle_sync_waits",
        "Writes that found the dirty-data maximum reached and waited for a txg sync.",
        Count,
        |p| p.throttle.waited_for_sync,
    ),
    figure(
        "throttle_sync_wait",
        "Time writes spent waiting for a txg sync at the dirty-data maximum.",
        Nanos,
        |p| p.throttle.waited_nanos,
    ),
    figure(
        "throttle_space_waits",
        "Writes that waited for free space: behind another such write, or for txg syncs to give space back.",
        Count,
        |p| p.throttle.waited_for_space,
    ),
    figure(
        "throttle_space_wait",
        "Time writes spent waiting for free space.",
        Nanos,
        |p| p.throttle.waited_for_space_nanos,
    ),
    figure(
        "throttle_spared_writes",
        "Writes spared a delay because another volume was filling the dirty data.",
        Count,
        |p| p.throttle.spared,
    ),
    figure(
        "patches_completed_beside",
        "Blocks that writes covered in part, not in memory, completed from the disk beside the writes.",
        Count,
        |p| p.patches.completed_beside,
    ),
    figure(
        "patches_completed_by_sync",
        "Blocks that writes covered in part, not in memory, completed from the disk by the txg sync.",
        Count,
        |p| p.patches.completed_by_sync,
    ),
    figure(
        "patches_left_to_sync",
        "Writes into part of a block not in memory left to the txg sync: every completing task busy, the line full.",
        Count,
        |p| p.patches.left_to_sync,
    ),
];

const POOL_GAUGES: &[Figure<PoolSnapshot>] = &[
    figure(
        "pool_uptime",
        "Time since this server imported or created the pool: the span every counter covers.",
        Nanos,
        |p| p.uptime_nanos,
    ),
    figure("pool_txg", "The txg of the pool's newest uberblock.", Count, |p| p.txg),
    figure(
        "pool_suspended",
        "1 while the pool is suspended: a sync failed and nothing more is written (pool status says why).",
        Count,
        |p| u64::from(p.suspended),
    ),
    figure(
        "pool_size",
        "The pool's size: its data vdevs' allocatable space, as pool list shows it.",
        Bytes,
        |p| p.size_bytes,
    ),
    figure("pool_allocated", "Space allocated in the pool's data vdevs.", Bytes, |p| {
        p.allocated_bytes
    }),
    figure("pool_free", "Space free in the pool's data vdevs.", Bytes, |p| {
        p.size_bytes.saturating_sub(p.allocated_bytes)
    }),
    figure("dirty", "Dirty data the open and quiescing txgs hold.", Bytes, |p| {
        p.throttle.dirty_bytes
    }),
    figure(
        "dirty_max",
        "Dirty data the open txg may hold (txg.dirty_max); a sync starts at a quarter of it.",
        Bytes,
        |p| p.throttle.dirty_max_bytes,
    ),
    figure(
        "patches_waiting",
        "Blocks that writes covered in part, not in memory, waiting for a task to complete them from the disk.",
        Count,
        |p| p.patches.waiting,
    ),
];

const LEAF_COUNTERS: &[Figure<LeafSnapshot>] = &[
    figure(
        "leaf_reads",
        "Reads a leaf completed (a mirror's copies count on their own leaves).",
        Count,
        |l| l.reads,
    ),
    figure("leaf_writes", "Writes a leaf completed.", Count, |l| l.writes),
    figure("leaf_read", "Bytes a leaf read.", Bytes, |l| l.read_bytes),
    figure("leaf_written", "Bytes a leaf wrote.", Bytes, |l| l.write_bytes),
    figure("leaf_flushes", "Cache flushes a leaf completed.", Count, |l| l.flushes),
    figure(
        "leaf_sync_paced",
        "Times the txg sync's writes to a leaf waited for the intent log's flushes there \
         (vdev.sync_pace_bytes).",
        Count,
        |l| l.sync_paced,
    ),
    figure("leaf_repairs", "Bad copies on a leaf rewritten from a good one.", Count, |l| l.repairs),
    figure("leaf_aggregated", "I/Os that rode in another I/O's device command.", Count, |l| {
        l.aggregated
    }),
    figure(
        "leaf_async_write_commands",
        "Device commands that carried async writes to a leaf (the txg sync's blocks; a \
         resilver's while one runs); with leaf_async_written, how large the sync's writes \
         reach the device.",
        Count,
        |l| l.async_write_commands,
    ),
    figure(
        "leaf_async_written",
        "Bytes of async writes (the txg sync's blocks) in a leaf's device commands.",
        Bytes,
        |l| l.async_written_bytes,
    ),
];

const LEAF_GAUGES: &[Figure<LeafSnapshot>] = &[
    figure("leaf_queued", "I/Os waiting in a leaf's submission queues now.", Count, |l| l.queued),
    figure("leaf_queue_depth", "The depth a leaf's device queue allows now.", Count, |l| {
        l.queue_depth
    }),
];

/// A figure read off a leaf.
type LeafValue = fn(&LeafSnapshot) -> u64;

/// The states a hot spare's `spare_state` series are labelled with.
const SPARE_STATES: [&str; 3] = ["AVAIL", "INUSE", "UNAVAIL"];

/// The kinds of scan `scan_active` has a series for.
const SCANS: [&str; 2] = ["scrub", "resilver"];

/// The states a leaf's `leaf_state` series are labelled with.
const LEAF_STATES: [&str; 4] = ["ONLINE", "DEGRADED", "FAULTED", "OFFLINE"];

/// Errors by kind, written as one family with a `kind` label.
const LEAF_ERRORS: [(&str, LeafValue); 4] = [
    ("read", |l| l.read_errors),
    ("write", |l| l.write_errors),
    ("flush", |l| l.flush_errors),
    ("checksum", |l| l.checksum_errors),
];

const VOLUME_COUNTERS: &[Figure<VolumeSnapshot>] = &[
    figure("volume_read", "Bytes clients read from a volume.", Bytes, |v| v.read_bytes),
    figure(
        "volume_written",
        "Bytes clients wrote to a volume (zeroed ranges not counted).",
        Bytes,
        |v| v.write_bytes,
    ),
    figure("volume_errors", "Client requests a volume answered with an error.", Count, |v| {
        v.errors
    }),
    figure(
        "volume_partial_writes",
        "Writes that covered only part of a volume block (the txg sync rewrites the block).",
        Count,
        |v| v.partial_writes,
    ),
    figure(
        "volume_prefetch_hits",
        "Reads of a volume that continued a sequential stream its prefetch follows.",
        Count,
        |v| v.prefetch.hits,
    ),
    figure(
        "volume_prefetch_misses",
        "Reads of a volume that continued no stream (each starts one).",
        Count,
        |v| v.prefetch.misses,
    ),
    figure(
        "volume_prefetch_blocks_fetched",
        "Blocks a volume's prefetch fetched ahead of its sequential reads.",
        Count,
        |v| v.prefetch.blocks_fetched,
    ),
    figure(
        "volume_prefetch_ios",
        "I/Os that read the blocks a volume's prefetch fetched ahead.",
        Count,
        |v| v.prefetch.ios,
    ),
    figure(
        "volume_prefetch_blocks_used",
        "Blocks fetched ahead that a read of the volume took.",
        Count,
        |v| v.prefetch.blocks_used,
    ),
    figure(
        "volume_prefetch_blocks_unused",
        "Blocks fetched ahead that no read took (the stream ended, skipped them, or they were rewritten).",
        Count,
        |v| v.prefetch.blocks_unused,
    ),
    figure(
        "volume_rewrite_scattered_reads",
        "Sequential reads of a volume that found their blocks scattered on disk.",
        Count,
        |v| v.rewrite.scattered_reads,
    ),
    figure(
        "volume_rewrite_blocks_rewritten",
        "Blocks those reads handed to the open txg to be written side by side.",
        Count,
        |v| v.rewrite.blocks_rewritten,
    ),
    figure(
        "volume_rewrite_blocks_shared",
        "Scattered blocks left in place because a snapshot, a clone's origin or the dedup table shares them.",
        Count,
        |v| v.rewrite.blocks_shared,
    ),
    figure(
        "volume_rewrite_blocks_deferred",
        "Scattered blocks left in place for now (changed since the read, the txg's share taken, or free space short).",
        Count,
        |v| v.rewrite.blocks_deferred,
    ),
];

const VOLUME_GAUGES: &[Figure<VolumeSnapshot>] = &[
    figure("volume_block_size", "A volume's block size.", Bytes, |v| v.block_bytes),
    figure(
        "volume_log_groups_in_flight",
        "Groups of log blocks a volume's intent log has written and not yet seen durable.",
        Count,
        |v| v.log.as_ref().map_or(0, |l| l.groups_in_flight),
    ),
    figure(
        "volume_log_next_block_size",
        "Size of the block a volume's intent log allocated for its next log block.",
        Bytes,
        |v| v.log.as_ref().map_or(0, |l| l.next_block_bytes),
    ),
    figure(
        "volume_log_group_latency",
        "Smoothed time from a log group's issue to its being durable.",
        Nanos,
        |v| v.log.as_ref().map_or(0, |l| l.group_latency_nanos),
    ),
];

const DEDUP_COUNTERS: &[Figure<DedupSnapshot>] = &[
    figure(
        "dedup_table_lock_contended",
        "Dedup table-lock acquisitions that found the lock held.",
        Count,
        |d| d.table_lock_contended,
    ),
    figure("dedup_table_lock_wait", "Time spent waiting for the dedup table lock.", Nanos, |d| {
        d.table_lock_wait_nanos
    }),
    figure(
        "dedup_blocks_written",
        "Blocks written as new copies through the dedup table.",
        Count,
        |d| d.blocks_written,
    ),
    figure(
        "dedup_blocks_shared",
        "Blocks that shared a stored copy instead of being written.",
        Count,
        |d| d.blocks_shared,
    ),
    figure(
        "dedup_blocks_piggybacked",
        "Blocks that shared a copy still being written.",
        Count,
        |d| d.blocks_piggybacked,
    ),
    figure(
        "dedup_verify_compares",
        "dedup=verify comparisons of a block with its stored copy.",
        Count,
        |d| d.verify_compares,
    ),
    figure(
        "dedup_verify_mismatches",
        "dedup=verify comparisons that found different bytes under one key.",
        Count,
        |d| d.verify_mismatches,
    ),
    figure(
        "dedup_blocks_freed",
        "Deduplicated blocks freed when their last reference went.",
        Count,
        |d| d.blocks_freed,
    ),
];

const DEDUP_GAUGES: &[Figure<DedupSnapshot>] = &[
    figure("dedup_entries", "Dedup table entries (as of the last sync).", Count, |d| d.entries),
    figure(
        "dedup_references",
        "Block pointers the dedup table's entries count (as of the last sync).",
        Count,
        |d| d.references,
    ),
    figure(
        "dedup_allocated",
        "Bytes the dedup table's blocks take (as of the last sync).",
        Bytes,
        |d| d.allocated_bytes,
    ),
    figure(
        "dedup_referenced",
        "Bytes the dedup table's blocks would take without sharing (as of the last sync).",
        Bytes,
        |d| d.referenced_bytes,
    ),
    figure("dedup_entries_in_memory", "Dedup table entries held in memory now.", Count, |d| {
        d.entries_in_memory
    }),
];

/// Writes one metric family (descriptor, then a sample per label set), skipping a family
/// without samples so the exposition only names what exists.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric_type: MetricType,
    samples: Vec<(Labels, M)>,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let unit = unit.as_ref();
    let mut metric = encoder.encode_descriptor(name, help, unit, metric_type)?;
    for (labels, sample) in samples {
        sample.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes the families of `figures`, each with one sample per part (`parts` gives each
/// part's labels).
fn figures<'a, T: 'a>(
    encoder: &mut DescriptorEncoder,
    metric_type: MetricType,
    figures: &[Figure<T>],
    parts: impl Iterator<Item = (&'a T, Labels)> + Clone,
) -> fmt::Result {
    for figure in figures {
        let values = parts.clone().map(|(part, labels)| (labels, (figure.value)(part)));
        let (name, help) = (figure.name, figure.help);
        match (figure.measure, metric_type) {
            (Nanos, MetricType::Counter) => {
                let samples = values.map(|(l, n)| (l, ConstCounter::new(seconds(n)))).collect();
                family(encoder, name, help, Some(Unit::Seconds), metric_type, samples)?;
            }
            (Nanos, _) => {
                let samples = values.map(|(l, n)| (l, ConstGauge::new(seconds(n)))).collect();
                family(encoder, name, help, Some(Unit::Seconds), metric_type, samples)?;
            }
            (measure, MetricType::Counter) => {
                let unit = (measure == Bytes).then_some(Unit::Bytes);
                let samples = values.map(|(l, n)| (l, ConstCounter::new(n))).collect();
                family(encoder, name, help, unit, metric_type, samples)?;
            }
            (measure, _) => {
                let unit = (measure == Bytes).then_some(Unit::Bytes);
                let samples = values.map(|(l, n)| (l, ConstGauge::new(n))).collect();
                family(encoder, name, help, unit, metric_type, samples)?;
            }
        }
    }
    Ok(())
}

/// Writes one family split by a label (`class`, `op`, `kind`, `stage`): one sample per part
/// and value of the label.
fn split<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help, unit, metric_type): (&str, &str, Option<Unit>, MetricType),
    samples: impl Iterator<Item = (Labels, M)>,
) -> fmt::Result {
    family(encoder, name, help, unit, metric_type, samples.collect())
}

/// A part once per entry of `names` (I/O classes, request types), with its index and the
/// name as label `key`.
fn by_name<'a, T>(
    (part, labels): (&'a T, Labels),
    key: &'static str,
    names: &'a [&'static str],
) -> impl Iterator<Item = (&'a T, usize, Labels)> + 'a {
    names.iter().enumerate().map(move |(i, name)| (part, i, with(labels.clone(), key, name)))
}

fn with(mut labels: Labels, key: &'static str, value: &str) -> Labels {
    labels.push((key, value.to_owned()));
    labels
}

/// An engine histogram regrouped into seconds buckets, for encoding as it is.
#[derive(Debug)]
struct SecondsHistogram {
    sum_seconds: f64,
    count: u64,
    /// (upper bound in seconds, samples in this bucket only), the last bound infinite.
    buckets: Vec<(f64, u64)>,
}

/// The histogram bounds in nanoseconds.
fn bounds_nanos() -> impl Iterator<Item = u64> {
    BOUND_EXPONENTS.map(|k| (1u64 << k) - 1)
}

impl From<&HistogramSnapshot> for SecondsHistogram {
    fn from(histogram: &HistogramSnapshot) -> SecondsHistogram {
        let bounds: Vec<u64> = bounds_nanos().collect();
        let mut counts = vec![0u64; bounds.len() + 1];
        for (index, &n) in histogram.buckets.iter().enumerate().filter(|(_, n)| **n > 0) {
            // The first bound at or above everything in the engine bucket: exact, since
            // every bound is an engine edge.
            let upper = bucket_upper_nanos(index);
            let slot = bounds.iter().position(|&b| b >= upper).unwrap_or(bounds.len());
            if let Some(count) = counts.get_mut(slot) {
                *count += n;
            }
        }
        let buckets = bounds
            .iter()
            .map(|&b| b as f64 / 1e9)
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts.iter().copied())
            .collect();
        SecondsHistogram {
            sum_seconds: histogram.sum_nanos as f64 / 1e9,
            // A sample recorded while the snapshot was taken may be in the count and not yet
            // in a bucket; the exposition's count must equal its +Inf bucket.
            count: counts.iter().sum(),
            buckets,
        }
    }
}

impl EncodeMetric for SecondsHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn seconds(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let e = &mut encoder;
        let pool = || -> Labels { vec![("pool", s.pool.clone())] };
        figures(e, MetricType::Gauge, POOL_GAUGES, std::iter::once((s, pool())))?;
        figures(e, MetricType::Counter, POOL_COUNTERS, std::iter::once((s, pool())))?;
        // Absent until a scrub has run to its end, so that an alert can tell "never" from a
        // time long ago (`unless on(pool) sluice_scrub_last_end_timestamp_seconds`).
        family(
            e,
            "scrub_last_end_timestamp",
            "When the last scrub that ran to its end finished, in seconds since the Unix epoch.",
            Some(Unit::Seconds),
            MetricType::Gauge,
            s.last_scrub_end_secs.map(|t| (pool(), ConstGauge::new(t))).into_iter().collect(),
        )?;
        split(
            e,
            (
                "scan_active",
                "1 while a scan of this kind (scrub, resilver) runs.",
                None,
                MetricType::Gauge,
            ),
            SCANS.iter().map(|&func| {
                let running = s.scan_running.as_deref() == Some(func);
                (with(pool(), "func", func), ConstGauge::new(u64::from(running)))
            }),
        )?;

        split(
            e,
            (
                "spare_state",
                "A hot spare's state: 1 on the series of its state (AVAIL, INUSE, UNAVAIL), 0 on the others.",
                None,
                MetricType::Gauge,
            ),
            s.spares.iter().flat_map(|(path, state)| {
                SPARE_STATES.map(|name| {
                    let labels = with(with(pool(), "spare", path), "state", name);
                    (labels, ConstGauge::new(u64::from(state == name)))
                })
            }),
        )?;
        split(
            e,
            (
                "written",
                "Stored bytes written, by kind of block (volume data, indirect, space map, \
                 intent log chain, ...): every copy once, a mirror's legs and RAID-Z's parity \
                 not counted.",
                Some(Unit::Bytes),
                MetricType::Counter,
            ),
            s.written_by_kind
                .iter()
                .map(|k| (with(pool(), "kind", &k.kind), ConstCounter::new(k.bytes))),
        )?;
        let leaves = s.leaves.iter().map(|l| {
            let vdev =
                s.tops.get(l.top).map_or_else(|| format!("top-{}", l.top), |t| t.name(l.top));
            (l, vec![("pool", s.pool.clone()), ("vdev", vdev), ("leaf", l.path.clone())])
        });
        figures(e, MetricType::Counter, LEAF_COUNTERS, leaves.clone())?;
        figures(e, MetricType::Gauge, LEAF_GAUGES, leaves.clone())?;
        split(
            e,
            (
                "leaf_errors",
                "Errors a leaf returned, by kind; a read another mirror child served still counts.",
                None,
                MetricType::Counter,
            ),
            leaves
                .clone()
                .flat_map(|(l, labels)| {
                    LEAF_ERRORS.map(|(kind, value)| (with(labels.clone(), "kind", kind), value(l)))
                })
                .map(|(labels, n)| (labels, ConstCounter::new(n))),
        )?;
        split(
            e,
            (
                "leaf_state",
                "A leaf's state: 1 on the series of its state (ONLINE, DEGRADED, FAULTED, OFFLINE), 0 on the others.",
                None,
                MetricType::Gauge,
            ),
            leaves
                .clone()
                .flat_map(|(l, labels)| {
                    LEAF_STATES.map(|state| {
                        (with(labels.clone(), "state", state), u64::from(l.state == state))
                    })
                })
                .map(|(labels, n)| (labels, ConstGauge::new(n))),
        )?;
        let classes = class_names();
        let by_class = |part| by_name(part, "class", &classes);
        split(
            e,
            ("leaf_active", "I/Os in a leaf's device now, by I/O class.", None, MetricType::Gauge),
            leaves.clone().flat_map(by_class).map(|(l, i, labels)| {
                (labels, ConstGauge::new(l.active.get(i).copied().unwrap_or(0)))
            }),
        )?;
        split(
            e,
            (
                "leaf_latency",
                "Time from queueing an I/O on a leaf to its completion, by I/O class.",
                Some(Unit::Seconds),
                MetricType::Histogram,
            ),
            leaves.clone().flat_map(by_class).filter_map(|(l, i, labels)| {
                Some((labels, SecondsHistogram::from(l.latency.get(i)?)))
            }),
        )?;

        let volumes = s.volumes.iter().map(|v| (v, with(pool(), "volume", &v.name)));
        figures(e, MetricType::Counter, VOLUME_COUNTERS, volumes.clone())?;
        figures(e, MetricType::Gauge, VOLUME_GAUGES, volumes.clone())?;
        let ops = op_names();
        let by_op = |part| by_name(part, "op", &ops);
        split(
            e,
            (
                "volume_requests",
                "Client requests a volume answered, by type (zero: trim and write-zeroes).",
                None,
                MetricType::Counter,
            ),
            volumes.clone().flat_map(by_op).map(|(v, i, labels)| {
                (labels, ConstCounter::new(v.requests.get(i).copied().unwrap_or(0)))
            }),
        )?;
        split(
            e,
            (
                "volume_latency",
                "Time from a client request's arrival to its answer, by type (a flush's \
                 includes its log write).",
                Some(Unit::Seconds),
                MetricType::Histogram,
            ),
            volumes.clone().flat_map(by_op).filter_map(|(v, i, labels)| {
                Some((labels, SecondsHistogram::from(v.latency.get(i)?)))
            }),
        )?;

        if let Some(dedup) = &s.dedup {
            figures(e, MetricType::Gauge, DEDUP_GAUGES, std::iter::once((dedup, pool())))?;
            figures(e, MetricType::Counter, DEDUP_COUNTERS, std::iter::once((dedup, pool())))?;
            split(
                e,
                (
                    "dedup_table_lock_acquisitions",
                    "Dedup table-lock acquisitions, by stage.",
                    None,
                    MetricType::Counter,
                ),
                dedup
                    .table_lock
                    .iter()
                    .map(|(stage, n)| (with(pool(), "stage", stage), ConstCounter::new(*n))),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use sluice_engine::stats::Histogram;

    use super::*;
    use crate::snapshot::{LeafSnapshot, TopSnapshot, VolumeSnapshot};

    /// The samples of a rendered exposition, by series (name and labels as written).
    fn parse_samples(text: &str) -> HashMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    fn snapshot() -> PoolSnapshot {
        let leaf_latency = Histogram::default();
        for _ in 0..3 {
            leaf_latency.record(Duration::from_micros(100));
        }
        let flush_latency = Histogram::default();
        flush_latency.record(Duration::from_millis(3));
        flush_latency.record(Duration::from_secs(100));
        let empty = Histogram::default().snapshot();
        let mut volume_latency = vec![empty.clone(); 4];
        volume_latency[2] = flush_latency.snapshot();
        PoolSnapshot {
            version: crate::snapshot::SNAPSHOT_VERSION,
            pool: "tank".into(),
            uptime_nanos: 2_500_000_000,
            txg: 17,
            txg_syncs: 9,
            tops: vec![TopSnapshot { mirror: true, log: false, parity: 0, hole: false }],
            leaves: vec![LeafSnapshot {
                path: "/d/a \"quoted\"".into(),
                state: "DEGRADED".into(),
                top: 0,
                writes: 3,
                write_bytes: 12288,
                read_errors: 1,
                active: vec![0, 2, 0, 0, 0, 0],
                queue_depth: 32,
                latency: {
                    let mut l = vec![empty.clone(); 6];
                    l[1] = leaf_latency.snapshot();
                    l
                },
                ..LeafSnapshot::default()
            }],
            volumes: vec![VolumeSnapshot {
                name: "vm1".into(),
                block_bytes: 16384,
                requests: vec![0, 5, 2, 0],
                write_bytes: 20480,
                latency: volume_latency,
                ..VolumeSnapshot::default()
            }],
            size_bytes: 1_000_000_000,
            allocated_bytes: 250_000_000,
            last_scrub_end_secs: Some(1_800_000_000),
            scan_running: Some("resilver".into()),
            spares: vec![("/d/s".into(), "INUSE".into())],
            patches: crate::snapshot::PatchSnapshot {
                completed_beside: 40,
                completed_by_sync: 6,
                left_to_sync: 1,
                waiting: 3,
            },
            written_by_kind: vec![
                crate::snapshot::KindBytes { kind: "volume data".into(), bytes: 65536 },
                crate::snapshot::KindBytes { kind: "indirect".into(), bytes: 8192 },
            ],
            ..PoolSnapshot::default()
        }
    }

    /// The exposition carries the snapshot's counters under their names and labels, latency
    /// in cumulative seconds buckets that agree with the count, and ends as OpenMetrics
    /// requires.
    #[test]
    fn renders_counters_and_histograms() {
        let text = render(&snapshot()).expect("render");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let samples = parse_samples(&text);
        let leaf = r#"pool="tank",vdev="mirror-0",leaf="/d/a \"quoted\"""#;
        let get =
            |series: &str| *samples.get(series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
        assert_eq!(get(&format!("sluice_leaf_writes_total{{{leaf}}}")), 3.0);
        assert_eq!(get(&format!("sluice_leaf_written_bytes_total{{{leaf}}}")), 12288.0);
        assert_eq!(get(&format!("sluice_leaf_errors_total{{{leaf},kind=\"read\"}}")), 1.0);
        // One series per state, 1 on the leaf's own: an alert on `sluice_leaf_state{state=
        // "ONLINE"} == 0` fires for a leaf in any other state.
        assert_eq!(get(&format!("sluice_leaf_state{{{leaf},state=\"DEGRADED\"}}")), 1.0);
        assert_eq!(get(&format!("sluice_leaf_state{{{leaf},state=\"ONLINE\"}}")), 0.0);
        assert_eq!(get("sluice_pool_suspended{pool=\"tank\"}"), 0.0);
        assert_eq!(get("sluice_pool_size_bytes{pool=\"tank\"}"), 1e9);
        assert_eq!(get("sluice_pool_allocated_bytes{pool=\"tank\"}"), 25e7);
        assert_eq!(get("sluice_pool_free_bytes{pool=\"tank\"}"), 75e7);
        assert_eq!(get("sluice_scrub_last_end_timestamp_seconds{pool=\"tank\"}"), 1.8e9);
        assert_eq!(get("sluice_scan_active{pool=\"tank\",func=\"resilver\"}"), 1.0);
        assert_eq!(get("sluice_scan_active{pool=\"tank\",func=\"scrub\"}"), 0.0);
        let spare = |state: &str| {
            format!("sluice_spare_state{{pool=\"tank\",spare=\"/d/s\",state=\"{state}\"}}")
        };
        assert_eq!((get(&spare("INUSE")), get(&spare("AVAIL"))), (1.0, 0.0));
        assert_eq!(get(&format!("sluice_leaf_active{{{leaf},class=\"sync_write\"}}")), 2.0);
        assert_eq!(get("sluice_pool_uptime_seconds{pool=\"tank\"}"), 2.5);
        assert_eq!(get("sluice_txg_syncs_total{pool=\"tank\"}"), 9.0);
        assert_eq!(get("sluice_patches_completed_beside_total{pool=\"tank\"}"), 40.0);
        assert_eq!(get("sluice_patches_completed_by_sync_total{pool=\"tank\"}"), 6.0);
        assert_eq!(get("sluice_patches_left_to_sync_total{pool=\"tank\"}"), 1.0);
        assert_eq!(get("sluice_patches_waiting{pool=\"tank\"}"), 3.0);
        let written =
            |kind: &str| format!("sluice_written_bytes_total{{pool=\"tank\",kind=\"{kind}\"}}");
        assert_eq!((get(&written("volume data")), get(&written("indirect"))), (65536.0, 8192.0));
        let volume = r#"pool="tank",volume="vm1""#;
        assert_eq!(get(&format!("sluice_volume_requests_total{{{volume},op=\"write\"}}")), 5.0);
        assert_eq!(get(&format!("sluice_volume_block_size_bytes{{{volume}}}")), 16384.0);
        assert!(text.contains("# TYPE sluice_leaf_latency_seconds histogram\n"), "{text}");
        assert!(text.contains("# UNIT sluice_leaf_latency_seconds seconds\n"), "{text}");
        // 100 us samples: none at or below 65.5 us, all three at or below 131 us. The
        // encoder writes `le` before the other labels.
        let bucket = |le: &str| {
            let series = "sluice_leaf_latency_seconds_bucket";
            get(&format!("{series}{{le=\"{le}\",{leaf},class=\"sync_write\"}}"))
        };
        assert_eq!(bucket("0.000065535"), 0.0);
        assert_eq!(bucket("0.000131071"), 3.0);
        assert_eq!(bucket("+Inf"), 3.0);
        assert_eq!(
            get(&format!("sluice_leaf_latency_seconds_count{{{leaf},class=\"sync_write\"}}")),
            3.0
        );
        // 100 s is past the last bound: only +Inf holds it.
        let flush = |suffix: &str, le: Option<&str>| {
            let le = le.map_or(String::new(), |le| format!("le=\"{le}\","));
            get(&format!("sluice_volume_latency_seconds_{suffix}{{{le}{volume},op=\"flush\"}}"))
        };
        assert_eq!(flush("bucket", Some("68.719476735")), 1.0);
        assert_eq!(flush("bucket", Some("+Inf")), 2.0);
        assert!((flush("sum", None) - 100.003).abs() < 1e-6);
        // No dedup in this pool, so no dedup families; with it, they appear.
        assert!(!text.contains("sluice_dedup"), "{text}");
        // A pool never scrubbed has no last-scrub series at all.
        let never = PoolSnapshot { last_scrub_end_secs: None, ..snapshot() };
        let text_never = render(&never).expect("render");
        assert!(!text_never.contains("sluice_scrub_last_end"), "{text_never}");
        let dedup = crate::snapshot::DedupSnapshot {
            blocks_shared: 4,
            table_lock: vec![("lookup".into(), 6)],
            ..crate::snapshot::DedupSnapshot::default()
        };
        let text = render(&PoolSnapshot { dedup: Some(dedup), ..snapshot() }).expect("render");
        let with_dedup = parse_samples(&text);
        let shared = "sluice_dedup_blocks_shared_total{pool=\"tank\"}";
        assert_eq!(with_dedup.get(shared), Some(&4.0), "{text}");
        let lookup = "sluice_dedup_table_lock_acquisitions_total{pool=\"tank\",stage=\"lookup\"}";
        assert_eq!(with_dedup.get(lookup), Some(&6.0), "{text}");
    }

    /// Every histogram bound is an engine bucket edge, so regrouping moves no sample across
    /// a bound.
    #[test]
    fn bounds_are_engine_edges() {
        let edges: Vec<u64> = (0..1000).map(bucket_upper_nanos).collect();
        for bound in bounds_nanos() {
            assert!(edges.contains(&bound), "{bound} ns is not an engine bucket edge");
        }
    }

    /// Request heads: what is answered how, and nothing a client sends panics.
    #[test]
    fn parses_request_heads() {
        let parsed = |s: &[u8]| parse(s);
        assert_eq!(
            parsed(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Request::Metrics { head_only: false }
        );
        assert_eq!(parsed(b"GET /metrics?x=1 HTTP/1.0\n\n"), Request::Metrics { head_only: false });
        assert_eq!(parsed(b"HEAD /metrics HTTP/1.1\r\n\r\n"), Request::Metrics { head_only: true });
        assert_eq!(parsed(b"POST /metrics HTTP/1.1\r\n\r\n"), Request::MethodNotAllowed);
        assert_eq!(parsed(b"GET / HTTP/1.1\r\n\r\n"), Request::NotFound);
        assert_eq!(parsed(b"GET /metricsx HTTP/1.1\r\n\r\n"), Request::NotFound);
        for bad in [
            &b""[..],
            b"\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/2\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1 extra\r\n\r\n",
            b"\xff\xfe /metrics HTTP/1.1\r\n\r\n",
            b"\0\0\0\0",
        ] {
            assert_eq!(parsed(bad), Request::Bad, "{bad:?}");
        }
        // Every prefix of a request, and every byte value in every position of a short one.
        let request = b"GET /metrics HTTP/1.1\r\n\r\n";
        for end in 0..=request.len() {
            let _ = parse(&request[..end]);
            let _ = head_end(&request[..end]);
        }
        for position in 0..request.len() {
            for byte in 0..=255u8 {
                let mut mutated = request.to_vec();
                mutated[position] = byte;
                let _ = parse(&mutated);
                let _ = head_end(&mutated);
            }
        }
    }

    async fn exchange(address: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        stream.write_all(request).await.expect("send");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// The HTTP side answers a scrape with the rendered text and its content type, other
    /// paths and methods with 404 and 405, garbage with 400, and an endless head with 431,
    /// and goes on serving after each.
    #[tokio::test]
    async fn answers_scrapes_over_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let scrape = || render(&snapshot()).map_err(|fmt::Error| ScrapeError::Render);
        let task = tokio::spawn(accept_loop(listener, scrape));
        let ok = exchange(address, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")), "{ok}");
        let (head, body) = ok.split_once("\r\n\r\n").expect("head and body");
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{head}");
        assert!(body.contains("sluice_leaf_writes_total{") && body.ends_with("# EOF\n"));
        let head_only = exchange(address, b"HEAD /metrics HTTP/1.1\r\n\r\n").await;
        assert!(head_only.starts_with("HTTP/1.1 200 OK") && head_only.ends_with("\r\n\r\n"));
        let missing = exchange(address, b"GET /other HTTP/1.1\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
        let post = exchange(address, b"POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405 ") && post.contains("Allow: GET, HEAD"), "{post}");
        let garbage = exchange(address, b"\x16\x03\x01 hello\r\n\r\n").await;
        assert!(garbage.starts_with("HTTP/1.1 400 "), "{garbage}");
        // Exactly the limit: a client sending more than is read gets a reset, not the answer.
        let endless = vec![b'a'; REQUEST_HEAD_BYTES_MAX];
        let large = exchange(address, &endless).await;
        assert!(large.starts_with("HTTP/1.1 431 "), "{large}");
        let again = exchange(address, b"GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.1 200 OK\r\n"), "{again}");
        task.abort();
    }
}
