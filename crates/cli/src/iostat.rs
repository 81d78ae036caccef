//! `sluice pool iostat`: what a served pool is doing (ZFS: `zpool iostat -v`, `-l`, `-q`).
//!
//! The server answers a hidden control command, `pool stats NAME`, with its counters and
//! latency histograms as one typed [`PoolSnapshot`] (crate::snapshot), a `Reply::Stats`. The command
//! asks for one per interval and prints the difference between consecutive ones, so the
//! server keeps no state per watcher and any number of them can watch at once. The first
//! report covers the time since import, as `zpool iostat` does.
//!
//! Rows: the pool, each top-level vdev and each leaf (I/Os and bytes per second, flushes, how
//! often the txg sync's writes waited for the intent log's flushes (`paced`), what is queued
//! and in the device now, and the depth the device queue allows), then each volume (client
//! requests per second), then the intent log, txg syncs and the bytes written by kind of block
//! (volume data, indirect blocks, the log's chain, ...). A mirror's and the pool's rows add
//! up their leaves' I/Os, so a mirrored write counts once per copy. With `--latency`,
//! percentiles per I/O class for each leaf (queued to done) and per request type for each
//! volume (arrival to answer, which includes waiting for the log).

use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use sluice_engine::stats::{HistogramSnapshot, VolumeOp};

use crate::control;
use crate::pools::output::Reply;
use crate::snapshot::{
    class_names, op_names, LeafSnapshot, PoolSnapshot, PrefetchSnapshot, RewriteSnapshot,
    SnapshotError, VolumeSnapshot,
};

/// `iostat` says the txg sync writes in small pieces when its runs on a data vdev average
/// under this (on a pool with room they reach half a megabyte and more: docs/bench/alloc.md)...
const SMALL_SYNC_WRITE_BYTES: u64 = 128 << 10;
/// ...there were at least this many device writes in the report's interval (a sync of a few
/// blocks says nothing about the free space)...
const SMALL_SYNC_WRITES_MIN: u64 = 100;
/// ...and the pool is at least this full, in percent: below it the free space is not cut up
/// enough to make them small (docs/bench/alloc.md: 514 KiB at 29% full), so small writes there
/// have another cause, such as txgs of a few blocks each.
const SMALL_SYNC_WRITES_FILL_PERCENT: u64 = 30;

/// What to print and how often.
pub struct Options {
    pub pool: String,
    pub interval: Option<Duration>,
    pub count: Option<u64>,
    pub latency: bool,
    /// One JSON document per report (a line each), with every figure.
    pub json: bool,
}

/// Prints reports until `count` have been printed (one without an interval).
pub fn run(options: &Options) -> anyhow::Result<()> {
    let count = options.count.unwrap_or(if options.interval.is_some() { u64::MAX } else { 1 });
    let mut earlier: Option<PoolSnapshot> = None;
    for n in 0..count {
        if n > 0 {
            std::thread::sleep(options.interval.unwrap_or_default());
        }
        let now = fetch(&options.pool)?;
        if options.json {
            println!("{}", report_json(&now, earlier.as_ref()));
        } else {
            print!("{}", report(&now, earlier.as_ref(), options.latency));
        }
        earlier = Some(now);
    }
    Ok(())
}

fn fetch(pool: &str) -> anyhow::Result<PoolSnapshot> {
    let stats = crate::command::Command::Pool {
        pool: crate::command::PoolCommand::Stats { name: pool.to_owned() },
    };
    let mut replies = Vec::new();
    control::forward(pool, &stats, &mut replies).unwrap_or_else(|| {
        anyhow::bail!(
            "pool {pool} is not being served here: iostat shows what a running `sluice serve` \
             is doing (no control socket at {}); start it with `sluice serve {pool}`",
            control::socket_path(pool).display()
        )
    })?;
    match replies.pop() {
        Some(Reply::Stats(snapshot)) => Ok(*snapshot),
        _ => Err(SnapshotError::Server {
            message: "the server answered `pool stats` without its statistics".into(),
        })
        .with_context(|| format!("reading the statistics the server of {pool} sent")),
    }
}

/// What a counter became since `earlier`'s value (a counter `earlier` lacks counts from zero).
fn since(now: u64, earlier: Option<u64>) -> u64 {
    now.saturating_sub(earlier.unwrap_or(0))
}

fn histograms_since(
    now: &[HistogramSnapshot],
    earlier: Option<&[HistogramSnapshot]>,
) -> Vec<HistogramSnapshot> {
    now.iter()
        .enumerate()
        .map(|(i, h)| match earlier.and_then(|e| e.get(i)) {
            Some(e) => h.since(e),
            None => h.clone(),
        })
        .collect()
}

fn leaf_since(now: &LeafSnapshot, earlier: Option<&LeafSnapshot>) -> LeafSnapshot {
    let was = |f: fn(&LeafSnapshot) -> u64| since(f(now), earlier.map(f));
    LeafSnapshot {
        path: now.path.clone(),
        state: now.state.clone(),
        top: now.top,
        reads: was(|l| l.reads),
        writes: was(|l| l.writes),
        read_bytes: was(|l| l.read_bytes),
        write_bytes: was(|l| l.write_bytes),
        flushes: was(|l| l.flushes),
        sync_paced: was(|l| l.sync_paced),
        read_errors: was(|l| l.read_errors),
        write_errors: was(|l| l.write_errors),
        flush_errors: was(|l| l.flush_errors),
        checksum_errors: was(|l| l.checksum_errors),
        repairs: was(|l| l.repairs),
        aggregated: was(|l| l.aggregated),
        async_write_commands: was(|l| l.async_write_commands),
        async_written_bytes: was(|l| l.async_written_bytes),
        // Gauges: as they are now.
        queued: now.queued,
        active: now.active.clone(),
        queue_depth: now.queue_depth,
        latency: histograms_since(&now.latency, earlier.map(|e| &e.latency[..])),
    }
}

fn volume_since(now: &VolumeSnapshot, earlier: Option<&VolumeSnapshot>) -> VolumeSnapshot {
    let was = |f: fn(&VolumeSnapshot) -> u64| since(f(now), earlier.map(f));
    VolumeSnapshot {
        name: now.name.clone(),
        // What the log chose is a gauge: as it is now.
        log: now.log.clone(),
        block_bytes: now.block_bytes,
        requests: now
            .requests
            .iter()
            .enumerate()
            .map(|(i, &n)| since(n, earlier.and_then(|e| e.requests.get(i).copied())))
            .collect(),
        read_bytes: was(|v| v.read_bytes),
        write_bytes: was(|v| v.write_bytes),
        errors: was(|v| v.errors),
        partial_writes: was(|v| v.partial_writes),
        latency: histograms_since(&now.latency, earlier.map(|e| &e.latency[..])),
        prefetch: PrefetchSnapshot {
            hits: was(|v| v.prefetch.hits),
            misses: was(|v| v.prefetch.misses),
            blocks_fetched: was(|v| v.prefetch.blocks_fetched),
            ios: was(|v| v.prefetch.ios),
            blocks_used: was(|v| v.prefetch.blocks_used),
            blocks_unused: was(|v| v.prefetch.blocks_unused),
        },
        rewrite: RewriteSnapshot {
            scattered_reads: was(|v| v.rewrite.scattered_reads),
            blocks_rewritten: was(|v| v.rewrite.blocks_rewritten),
            blocks_shared: was(|v| v.rewrite.blocks_shared),
            blocks_deferred: was(|v| v.rewrite.blocks_deferred),
        },
    }
}

/// Counts are totals; what they became since `earlier` (a leaf or volume it lacks counts from
/// zero). Gauges (queued, active, depth) stay as they are now, and so does the dedup table,
/// which iostat does not show.
fn difference(now: &PoolSnapshot, earlier: &PoolSnapshot) -> PoolSnapshot {
    let mut out = now.clone();
    out.uptime_nanos = now.uptime_nanos.saturating_sub(earlier.uptime_nanos);
    out.txg_syncs = now.txg_syncs.saturating_sub(earlier.txg_syncs);
    let (log, was) = (&now.intent_log, &earlier.intent_log);
    out.intent_log.commits = since(log.commits, Some(was.commits));
    out.intent_log.early_commits = since(log.early_commits, Some(was.early_commits));
    out.intent_log.early_fills = since(log.early_fills, Some(was.early_fills));
    out.intent_log.commits_via_txg = since(log.commits_via_txg, Some(was.commits_via_txg));
    out.intent_log.syncs_for_log_space =
        since(log.syncs_for_log_space, Some(was.syncs_for_log_space));
    out.intent_log.blocks_written = since(log.blocks_written, Some(was.blocks_written));
    out.intent_log.groups_written = since(log.groups_written, Some(was.groups_written));
    out.intent_log.records_written = since(log.records_written, Some(was.records_written));
    out.intent_log.block_bytes_written =
        since(log.block_bytes_written, Some(was.block_bytes_written));
    out.intent_log.block_bytes_allocated =
        since(log.block_bytes_allocated, Some(was.block_bytes_allocated));
    let (throttle, was) = (&now.throttle, &earlier.throttle);
    out.throttle.delayed = since(throttle.delayed, Some(was.delayed));
    out.throttle.delayed_nanos = since(throttle.delayed_nanos, Some(was.delayed_nanos));
    out.throttle.woken_by_sync = since(throttle.woken_by_sync, Some(was.woken_by_sync));
    out.throttle.waited_for_sync = since(throttle.waited_for_sync, Some(was.waited_for_sync));
    out.throttle.waited_nanos = since(throttle.waited_nanos, Some(was.waited_nanos));
    out.throttle.spared = since(throttle.spared, Some(was.spared));
    out.throttle.waited_for_space = since(throttle.waited_for_space, Some(was.waited_for_space));
    out.throttle.waited_for_space_nanos =
        since(throttle.waited_for_space_nanos, Some(was.waited_for_space_nanos));
    let (patches, was) = (&now.patches, &earlier.patches);
    out.patches.completed_beside = since(patches.completed_beside, Some(was.completed_beside));
    out.patches.completed_by_sync = since(patches.completed_by_sync, Some(was.completed_by_sync));
    out.patches.left_to_sync = since(patches.left_to_sync, Some(was.left_to_sync));
    for kind in &mut out.written_by_kind {
        let was = earlier.written_by_kind.iter().find(|e| e.kind == kind.kind);
        kind.bytes = since(kind.bytes, was.map(|e| e.bytes));
    }
    out.leaves = now
        .leaves
        .iter()
        .map(|leaf| leaf_since(leaf, earlier.leaves.iter().find(|e| e.path == leaf.path)))
        .collect();
    out.volumes = now
        .volumes
        .iter()
        .map(|volume| volume_since(volume, earlier.volumes.iter().find(|e| e.name == volume.name)))
        .collect();
    out
}

/// A report as JSON: rates per second over the span, gauges as they are, and latency
/// percentiles in microseconds for every kind with samples.
fn report_json(now: &PoolSnapshot, earlier: Option<&PoolSnapshot>) -> Value {
    let d = match earlier {
        Some(earlier) => difference(now, earlier),
        None => now.clone(),
    };
    let seconds = Duration::from_nanos(d.uptime_nanos).as_secs_f64().max(1e-3);
    let per_second = |n: u64| n as f64 / seconds;
    let micros = |t: Duration| t.as_secs_f64() * 1e6;
    let latency = |names: &[&str], histograms: &[HistogramSnapshot]| -> Value {
        let mut map = serde_json::Map::new();
        for (name, h) in names.iter().zip(histograms).filter(|(_, h)| h.count > 0) {
            map.insert(
                (*name).to_owned(),
                json!({
                    "count": h.count,
                    "mean_us": micros(h.mean()),
                    "p50_us": micros(h.quantile(0.5)),
                    "p99_us": micros(h.quantile(0.99)),
                    "max_us": micros(h.quantile(1.0)),
                }),
            );
        }
        Value::Object(map)
    };
    let classes = class_names();
    let ops = op_names();
    let leaves: Vec<Value> = d
        .leaves
        .iter()
        .map(|l| {
            json!({
                "path": l.path,
                "top": l.top,
                "reads_per_s": per_second(l.reads),
                "writes_per_s": per_second(l.writes),
                "read_bytes_per_s": per_second(l.read_bytes),
                "write_bytes_per_s": per_second(l.write_bytes),
                "flushes_per_s": per_second(l.flushes),
                "sync_paced_per_s": per_second(l.sync_paced),
                "async_write_commands_per_s": per_second(l.async_write_commands),
                "async_written_bytes_per_s": per_second(l.async_written_bytes),
                "errors": l.errors(),
                "queued": l.queued,
                "active": l.active_total(),
                "depth": l.queue_depth,
                "latency": latency(&classes, &l.latency),
            })
        })
        .collect();
    let volumes: Vec<Value> = d
        .volumes
        .iter()
        .map(|v| {
            json!({
                "name": v.name,
                "block_bytes": v.block_bytes,
                "reads_per_s": per_second(v.requests(VolumeOp::Read)),
                "writes_per_s": per_second(v.requests(VolumeOp::Write)),
                "flushes_per_s": per_second(v.requests(VolumeOp::Flush)),
                "zeroes_per_s": per_second(v.requests(VolumeOp::Zero)),
                "read_bytes_per_s": per_second(v.read_bytes),
                "write_bytes_per_s": per_second(v.write_bytes),
                "errors": v.errors,
                "partial_writes": v.partial_writes,
                "latency": latency(&ops, &v.latency),
                "prefetch": {
                    "hits": v.prefetch.hits,
                    "misses": v.prefetch.misses,
                    "blocks_fetched": v.prefetch.blocks_fetched,
                    "ios": v.prefetch.ios,
                    "blocks_used": v.prefetch.blocks_used,
                    "blocks_unused": v.prefetch.blocks_unused,
                },
                "rewrite": {
                    "scattered_reads": v.rewrite.scattered_reads,
                    "blocks_rewritten": v.rewrite.blocks_rewritten,
                    "blocks_shared": v.rewrite.blocks_shared,
                    "blocks_deferred": v.rewrite.blocks_deferred,
                },
                "log": v.log.as_ref().map(|l| json!({
                    "policy": l.policy,
                    "groups_in_flight": l.groups_in_flight,
                    "blocks_in_flight": l.blocks_in_flight,
                    "group_cap_per_vdev": l.group_cap_per_vdev,
                    "next_block_bytes": l.next_block_bytes,
                    "group_latency_us": l.group_latency_nanos as f64 / 1e3,
                })),
            })
        })
        .collect();
    let log = &d.intent_log;
    let per_block = |n: u64| n as f64 / log.blocks_written.max(1) as f64;
    let throttle = &d.throttle;
    json!({
        "pool": d.pool,
        "since_import": earlier.is_none(),
        "seconds": seconds,
        "tops": d.tops.iter().map(|t| json!({"mirror": t.mirror, "log": t.log, "parity": t.parity, "hole": t.hole})).collect::<Vec<_>>(),
        "leaves": leaves,
        "volumes": volumes,
        "intent_log": {
            "commits_per_s": per_second(log.commits),
            "early_commits_per_s": per_second(log.early_commits),
            "early_fills_per_s": per_second(log.early_fills),
            "txg_commits_per_s": per_second(log.commits_via_txg),
            "blocks_per_s": per_second(log.blocks_written),
            "groups_per_s": per_second(log.groups_written),
            "records_per_block": per_block(log.records_written),
            "bytes_per_block": per_block(log.block_bytes_written),
            "allocated_bytes_per_block": per_block(log.block_bytes_allocated),
        },
        "written_bytes_per_s": d
            .written_by_kind
            .iter()
            .map(|k| (k.kind.clone(), json!(per_second(k.bytes))))
            .collect::<serde_json::Map<String, Value>>(),
        "txg_syncs_per_s": per_second(d.txg_syncs),
        "txg_syncs_for_log_space_per_s": per_second(d.intent_log.syncs_for_log_space),
        "throttle": {
            "delayed_per_s": per_second(throttle.delayed),
            "delay_mean_us": throttle.delayed_nanos as f64 / 1e3 / throttle.delayed.max(1) as f64,
            "woken_by_sync_per_s": per_second(throttle.woken_by_sync),
            "waited_for_sync_per_s": per_second(throttle.waited_for_sync),
            "wait_mean_us":
                throttle.waited_nanos as f64 / 1e3 / throttle.waited_for_sync.max(1) as f64,
            "spared_per_s": per_second(throttle.spared),
            "waited_for_space_per_s": per_second(throttle.waited_for_space),
            "space_wait_mean_us": throttle.waited_for_space_nanos as f64
                / 1e3
                / throttle.waited_for_space.max(1) as f64,
            "dirty_bytes": throttle.dirty_bytes,
            "dirty_max_bytes": throttle.dirty_max_bytes,
        },
        "patches": {
            "completed_beside_per_s": per_second(d.patches.completed_beside),
            "completed_by_sync_per_s": per_second(d.patches.completed_by_sync),
            "left_to_sync_per_s": per_second(d.patches.left_to_sync),
            "waiting": d.patches.waiting,
        },
    })
}

/// One report: `now` less `earlier` (or since import), per second.
fn report(now: &PoolSnapshot, earlier: Option<&PoolSnapshot>, latency: bool) -> String {
    let d = match earlier {
        Some(earlier) => difference(now, earlier),
        None => now.clone(),
    };
    let seconds = Duration::from_nanos(d.uptime_nanos).as_secs_f64().max(1e-3);
    let rate = |n: u64| scaled(n as f64 / seconds, 1000.0, "");
    let bytes = |n: u64| scaled(n as f64 / seconds, 1024.0, "B");
    let mut out = String::new();
    let span = if earlier.is_some() { "the last" } else { "since import," };
    out.push_str(&format!(
        "pool {}: {span} {:.1} s, per second\n{:<36} {:>7} {:>7} {:>8} {:>8} {:>7} {:>6} {:>7} {:>6} {:>5} {:>6}\n",
        d.pool, seconds, "vdev", "reads", "writes", "read", "written", "flushes", "paced",
        "queued", "active", "depth", "errors"
    ));
    let row = |name: String, leaves: &[&LeafSnapshot], depth: Option<u64>| -> String {
        let sum = |f: fn(&LeafSnapshot) -> u64| leaves.iter().map(|l| f(l)).sum::<u64>();
        format!(
            "{:<36} {:>7} {:>7} {:>8} {:>8} {:>7} {:>6} {:>7} {:>6} {:>5} {:>6}\n",
            name,
            rate(sum(|l| l.reads)),
            rate(sum(|l| l.writes)),
            bytes(sum(|l| l.read_bytes)),
            bytes(sum(|l| l.write_bytes)),
            rate(sum(|l| l.flushes)),
            rate(sum(|l| l.sync_paced)),
            sum(|l| l.queued),
            sum(LeafSnapshot::active_total),
            depth.map_or(String::new(), |x| x.to_string()),
            sum(LeafSnapshot::errors)
        )
    };
    let all: Vec<&LeafSnapshot> = d.leaves.iter().collect();
    out.push_str(&row(d.pool.clone(), &all, None));
    for (index, top) in d.tops.iter().enumerate() {
        let members: Vec<&LeafSnapshot> = d.leaves.iter().filter(|l| l.top == index).collect();
        let indent = if top.grouped() {
            let name = if top.log { format!("log {}", top.name(index)) } else { top.name(index) };
            out.push_str(&row(format!("  {name}"), &members, None));
            "    "
        } else {
            "  "
        };
        for leaf in members {
            let log = if top.log && !top.grouped() { " (log)" } else { "" };
            let name = format!("{indent}{}{log}", leaf.path);
            out.push_str(&row(name, &[leaf], Some(leaf.queue_depth)));
        }
    }
    out.push_str(&format!(
        "{:<36} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>6}\n",
        "volume", "reads", "writes", "partial", "flushes", "zeroes", "read", "written", "errors"
    ));
    let mut hints = String::new();
    for volume in &d.volumes {
        let writes = volume.requests(VolumeOp::Write);
        let partial = volume.partial_writes;
        out.push_str(&format!(
            "  {:<34} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>6}\n",
            volume.name,
            rate(volume.requests(VolumeOp::Read)),
            rate(writes),
            (100 * partial).checked_div(writes).map_or("-".to_owned(), |p| format!("{p}%")),
            rate(volume.requests(VolumeOp::Flush)),
            rate(volume.requests(VolumeOp::Zero)),
            bytes(volume.read_bytes),
            bytes(volume.write_bytes),
            volume.errors
        ));
        // Worth saying when most writes rewrite a bigger block than they carry.
        if writes >= 100 && partial * 2 > writes && volume.block_bytes > 4096 {
            let written = volume.write_bytes / writes.max(1);
            hints.push_str(&format!(
                "  {}: {}% of writes cover part of a {} block (about {} each), and the txg \
                 sync writes each such block whole; a volume made with `--block-size` near the \
                 write size writes less.\n",
                volume.name,
                100 * partial / writes,
                size(volume.block_bytes),
                size(written),
            ));
        }
    }
    out.push_str(&hints);
    let log = &d.intent_log;
    let (commits, blocks) = (log.commits, log.blocks_written);
    out.push_str(&format!(
        "intent log: {} commits/s ({} early, {} through a txg sync), {} log blocks/s in {} \
         groups/s (one flush each), {:.2} commits per block, {} parts of writes filled early; \
         txgs synced: {}/s ({}/s asked for by a log region three quarters full)\n",
        rate(commits),
        rate(log.early_commits),
        rate(log.commits_via_txg),
        rate(blocks),
        rate(log.groups_written),
        commits as f64 / blocks.max(1) as f64,
        rate(log.early_fills),
        rate(d.txg_syncs),
        rate(log.syncs_for_log_space)
    ));
    if blocks > 0 {
        out.push_str(&format!(
            "  log blocks: {:.1} records, {} written of {} allocated per block\n",
            log.records_written as f64 / blocks as f64,
            size(log.block_bytes_written / blocks),
            size(log.block_bytes_allocated / blocks),
        ));
    }
    out.push_str(&sync_writes(&d, &rate));
    out.push_str(&written_by_kind(&d, &bytes));
    // Why the log writes as it does: what each volume's log has in flight and chose now.
    for volume in &d.volumes {
        let Some(l) = &volume.log else { continue };
        let cap = match l.group_cap_per_vdev {
            Some(cap) => format!(" (at most {cap} per device)"),
            None => String::new(),
        };
        out.push_str(&format!(
            "  {}: log {}, {} groups{} and {} blocks in flight, next block {}, group latency {}\n",
            volume.name,
            l.policy,
            l.groups_in_flight,
            cap,
            l.blocks_in_flight,
            size(l.next_block_bytes),
            duration(Duration::from_nanos(l.group_latency_nanos)),
        ));
    }
    let throttle = &d.throttle;
    let (delayed, waited, spared) = (throttle.delayed, throttle.waited_for_sync, throttle.spared);
    let (delayed_ns, waited_ns) = (throttle.delayed_nanos, throttle.waited_nanos);
    let mean =
        |total: u64, n: u64| duration(Duration::from_nanos(total.checked_div(n).unwrap_or(0)));
    // A server of an older build does not say how much is dirty.
    let dirty = if throttle.dirty_max_bytes == 0 {
        String::new()
    } else {
        format!(
            "{} dirty of {} (a sync starts at {}, sooner where free space is short), ",
            size(throttle.dirty_bytes),
            size(throttle.dirty_max_bytes),
            size(throttle.dirty_max_bytes / 4)
        )
    };
    out.push_str(&format!(
        "write throttle: {dirty}{} writes delayed/s (mean {}; {} woken as their txg began its \
         sync), {} spared/s (their volume was not the one filling the dirty data), {} waited \
         for a txg sync/s (mean {}), {} waits for a sync to free space/s (mean {})\n",
        rate(delayed),
        mean(delayed_ns, delayed),
        rate(throttle.woken_by_sync),
        rate(spared),
        rate(waited),
        mean(waited_ns, waited),
        rate(throttle.waited_for_space),
        mean(throttle.waited_for_space_nanos, throttle.waited_for_space)
    ));
    let patches = &d.patches;
    if patches.completed_beside + patches.completed_by_sync + patches.left_to_sync + patches.waiting
        > 0
    {
        out.push_str(&format!(
            "patches (writes into part of a block not in memory, completed from the block on \
             disk): {}/s beside their writes, {}/s by the txg sync (a lone write's, or one no \
             task reached in time; {}/s found every task busy and the line full), {} waiting \
             for a task now\n",
            rate(patches.completed_beside),
            rate(patches.completed_by_sync),
            rate(patches.left_to_sync),
            patches.waiting,
        ));
    }
    if latency {
        out.push_str(&latency_table(&d));
    }
    out.push('\n');
    out
}

/// Percentiles per leaf and I/O class, and per volume and request type, for the report's span.
fn latency_table(d: &PoolSnapshot) -> String {
    let mut out = format!(
        "{:<36} {:<11} {:>9} {:>8} {:>8} {:>8} {:>8}\n",
        "latency", "", "count", "mean", "p50", "p99", "max"
    );
    let line = |name: &str, what: &str, h: &HistogramSnapshot| {
        format!(
            "{:<36} {:<11} {:>9} {:>8} {:>8} {:>8} {:>8}\n",
            name,
            what,
            h.count,
            duration(h.mean()),
            duration(h.quantile(0.5)),
            duration(h.quantile(0.99)),
            duration(h.quantile(1.0))
        )
    };
    // One line per kind with samples; the owner's name on the first.
    let mut group = |mut name: String, rows: Vec<(&str, Option<&HistogramSnapshot>)>| {
        for (what, h) in rows {
            let Some(h) = h.filter(|h| h.count > 0) else { continue };
            out.push_str(&line(&name, what, h));
            name.clear();
        }
    };
    for leaf in &d.leaves {
        let rows = class_names().into_iter().zip(leaf.latency.iter().map(Some)).collect();
        group(format!("  {} (queued to done)", leaf.path), rows);
    }
    for volume in &d.volumes {
        let rows = op_names().into_iter().zip(volume.latency.iter().map(Some)).collect();
        group(format!("  {} (arrival to answer)", volume.name), rows);
    }
    out
}

/// `value` with a k/M/G suffix (steps of `step`), three significant digits.
fn scaled(value: f64, step: f64, unit: &str) -> String {
    let mut value = value;
    let mut suffix = 0;
    const SUFFIXES: [&str; 5] = ["", "K", "M", "G", "T"];
    while value >= step && suffix + 1 < SUFFIXES.len() {
        value /= step;
        suffix += 1;
    }
    let suffix =
        if step == 1000.0 { SUFFIXES[suffix].to_lowercase() } else { SUFFIXES[suffix].to_owned() };
    if suffix.is_empty() && value == value.trunc() {
        format!("{value:.0}{unit}")
    } else if value < 10.0 {
        format!("{value:.2}{suffix}{unit}")
    } else if value < 100.0 {
        format!("{value:.1}{suffix}{unit}")
    } else {
        format!("{value:.0}{suffix}{unit}")
    }
}

/// What the pool wrote, by kind of block, each kind that wrote anything: how a client write's
/// bytes on the disk divide between its data, the log's copy and the metadata above them.
/// Every copy counts once and a mirror's legs or RAID-Z's parity not at all (the vdev rows
/// count those); labels, uberblocks and repairs are not blocks of a kind and not counted.
fn written_by_kind(d: &PoolSnapshot, bytes: &dyn Fn(u64) -> String) -> String {
    let kinds: Vec<String> = (d.written_by_kind.iter())
        .filter(|k| k.bytes > 0)
        .map(|k| format!("{} {}/s", k.kind, bytes(k.bytes)))
        .collect();
    if kinds.is_empty() {
        return String::new();
    }
    format!("  written by kind of block: {}\n", kinds.join(", "))
}

/// How large the txg sync's writes reach the devices (the async write class: with a resilver
/// running, its writes too), and a hint where a data vdev takes them in small runs: the pool's
/// free space cut up. A RAID-Z leaf takes a column of each run, so a run there is a leaf's
/// write times the data columns.
fn sync_writes(d: &PoolSnapshot, rate: &dyn Fn(u64) -> String) -> String {
    let commands: u64 = d.leaves.iter().map(|l| l.async_write_commands).sum();
    let bytes: u64 = d.leaves.iter().map(|l| l.async_written_bytes).sum();
    let Some(mean) = bytes.checked_div(commands) else { return String::new() };
    let mut out =
        format!("  txg sync: {} device writes/s of {} on average", rate(commands), size(mean));
    if let Some(scan) = &d.scan_running {
        // A resilver's writes are in the same class; the figures are not the sync's alone.
        out.push_str(&format!(" (with the {scan}'s)\n"));
        return out;
    }
    out.push('\n');
    let full = d.allocated_bytes.saturating_mul(100)
        >= d.size_bytes.saturating_mul(SMALL_SYNC_WRITES_FILL_PERCENT);
    if !full {
        return out;
    }
    // With a log device the log's flushes do not wait behind these writes.
    let log_device = d.tops.iter().any(|t| t.log && !t.hole);
    for (index, top) in d.tops.iter().enumerate().filter(|(_, t)| !t.log && !t.hole) {
        let leaves: Vec<&LeafSnapshot> = d.leaves.iter().filter(|l| l.top == index).collect();
        let commands: u64 = leaves.iter().map(|l| l.async_write_commands).sum();
        let bytes: u64 = leaves.iter().map(|l| l.async_written_bytes).sum();
        let Some(per_leaf) = bytes.checked_div(commands) else { continue };
        let columns = (leaves.len() as u64).saturating_sub(u64::from(top.parity)).max(1);
        let run = if top.parity > 0 { per_leaf * columns } else { per_leaf };
        if commands < SMALL_SYNC_WRITES_MIN || run >= SMALL_SYNC_WRITE_BYTES {
            continue;
        }
        let columns =
            if top.parity > 0 { format!(" ({} per disk)", size(per_leaf)) } else { String::new() };
        let wait = if log_device {
            ""
        } else {
            ", and the log's flushes wait while the device writes them back"
        };
        out.push_str(&format!(
            "  the txg sync writes to {} in runs of {}{columns} where the pool's free space is \
             cut up (random rewrites on a pool {}% full leave it so){wait}: more free space \
             beside the volumes makes them larger.\n",
            top.name(index),
            size(run),
            d.allocated_bytes * 100 / d.size_bytes.max(1),
        ));
    }
    out
}

/// A size in bytes as `16K` when it is a whole number of units, else as [`scaled`] gives it.
fn size(bytes: u64) -> String {
    let mut unit = 0;
    let mut value = bytes;
    while value >= 1024 && value % 1024 == 0 && unit < 4 {
        value /= 1024;
        unit += 1;
    }
    if unit > 0 || bytes < 1024 {
        format!("{value}{}", ["B", "K", "M", "G", "T"][unit])
    } else {
        scaled(bytes as f64, 1024.0, "B")
    }
}

fn duration(d: Duration) -> String {
    let micros = d.as_secs_f64() * 1e6;
    if d.is_zero() {
        "-".to_owned()
    } else if micros < 1000.0 {
        format!("{micros:.0}us")
    } else if micros < 1e6 {
        format!("{:.1}ms", micros / 1000.0)
    } else {
        format!("{:.2}s", micros / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short() {
        assert_eq!(scaled(0.0, 1000.0, ""), "0");
        assert_eq!(scaled(7.0, 1000.0, ""), "7");
        assert_eq!(scaled(3400.0, 1000.0, ""), "3.40k");
        assert_eq!(scaled(13.3 * 1024.0 * 1024.0, 1024.0, "B"), "13.3MB");
        assert_eq!(scaled(2.5, 1000.0, ""), "2.50");
        assert_eq!(duration(Duration::from_micros(180)), "180us");
        assert_eq!(duration(Duration::from_micros(2500)), "2.5ms");
        assert_eq!(duration(Duration::ZERO), "-");
        assert_eq!(size(16384), "16K");
        assert_eq!(size(4096), "4K");
        assert_eq!(size(512), "512B");
        assert_eq!(size(6000), "5.86KB");
    }

    /// A report of two snapshots counts only what happened between them.
    #[test]
    fn reports_show_the_difference() {
        use sluice_engine::stats::Histogram;

        use crate::snapshot::{LogSnapshot, ThrottleSnapshot, TopSnapshot};
        let histogram = Histogram::default();
        let leaf = |writes: u64, latency: HistogramSnapshot| LeafSnapshot {
            path: "/d/a".into(),
            top: 0,
            writes,
            write_bytes: writes * 4096,
            flushes: writes,
            queued: 1,
            active: vec![1],
            queue_depth: 32,
            latency: vec![latency],
            ..LeafSnapshot::default()
        };
        let mut earlier = PoolSnapshot {
            pool: "tank".into(),
            uptime_nanos: 10_000_000_000,
            tops: vec![TopSnapshot { mirror: false, log: false, parity: 0, hole: false }],
            size_bytes: 4 << 30,
            allocated_bytes: 2300 << 20,
            ..PoolSnapshot::default()
        };
        earlier.leaves.push(leaf(1000, histogram.snapshot()));
        earlier.leaves[0].async_write_commands = 100;
        earlier.leaves[0].async_written_bytes = 100 * 65536;
        for _ in 0..20 {
            histogram.record(Duration::from_micros(200));
        }
        let volume = |writes: u64, partial: u64| VolumeSnapshot {
            name: "vm".into(),
            block_bytes: 16384,
            requests: vec![0, writes, 0, 0],
            write_bytes: writes * 4096,
            partial_writes: partial,
            ..VolumeSnapshot::default()
        };
        earlier.volumes.push(volume(500, 100));
        earlier.intent_log = LogSnapshot {
            commits: 1000,
            blocks_written: 500,
            groups_written: 400,
            records_written: 1500,
            block_bytes_written: 500 * 8192,
            block_bytes_allocated: 500 * 12288,
            ..LogSnapshot::default()
        };
        earlier.throttle = ThrottleSnapshot {
            delayed: 10,
            delayed_nanos: 10_000_000,
            ..ThrottleSnapshot::default()
        };
        let mut now = earlier.clone();
        now.throttle = ThrottleSnapshot {
            delayed: 30,
            delayed_nanos: 50_000_000,
            woken_by_sync: 6,
            waited_for_sync: 2,
            waited_nanos: 4_000_000,
            spared: 8,
            waited_for_space: 3,
            waited_for_space_nanos: 6_000_000,
            dirty_bytes: 96 << 20,
            dirty_max_bytes: 2 << 30,
        };
        earlier.patches.completed_beside = 100;
        now.patches = crate::snapshot::PatchSnapshot {
            completed_beside: 700,
            completed_by_sync: 240,
            left_to_sync: 20,
            waiting: 17,
        };
        let kinds = |data: u64, indirect: u64| {
            [("volume data", data), ("indirect", indirect), ("space map", 0)]
                .map(|(kind, bytes)| crate::snapshot::KindBytes { kind: kind.into(), bytes })
                .to_vec()
        };
        earlier.written_by_kind = kinds(1 << 30, 64 << 20);
        now.written_by_kind = kinds((1 << 30) + (64 << 20), 72 << 20);
        now.uptime_nanos = 12_000_000_000;
        now.leaves[0] = leaf(3000, histogram.snapshot());
        // 400 of the sync's device writes in the interval, 56K each: small, and worth a hint.
        now.leaves[0].async_write_commands = 500;
        now.leaves[0].async_written_bytes = 100 * 65536 + 400 * 57344;
        // 400 writes in the interval, 300 of them partial: 75%, and worth a hint.
        now.volumes[0] = volume(900, 400);
        now.volumes[0].log = Some(crate::snapshot::VolumeLogSnapshot {
            policy: "auto".into(),
            groups_in_flight: 3,
            blocks_in_flight: 4,
            group_cap_per_vdev: Some(8),
            next_block_bytes: 24576,
            group_latency_nanos: 350_000,
        });
        // 200 blocks in 100 groups carrying 1000 records, 16K written of 20K each.
        now.intent_log = LogSnapshot {
            commits: 1800,
            blocks_written: 700,
            groups_written: 500,
            records_written: 2500,
            block_bytes_written: 500 * 8192 + 200 * 16384,
            block_bytes_allocated: 500 * 12288 + 200 * 20480,
            ..LogSnapshot::default()
        };
        let text = report(&now, Some(&earlier), true);
        assert!(
            text.contains(
                "100 log blocks/s in 50 groups/s (one flush each), 4.00 commits per block"
            ),
            "{text}"
        );
        assert!(
            text.contains("  log blocks: 5.0 records, 16K written of 20K allocated per block"),
            "{text}"
        );
        assert!(
            text.contains(
                "  vm: log auto, 3 groups (at most 8 per device) and 4 blocks in flight, next block \
                 24K, group latency 350us"
            ),
            "{text}"
        );
        // 2000 writes in 2 s: 1000 per second; the 20 samples of 200 us (recorded as sync
        // reads, the first class) in the latency table.
        assert!(text.contains("the last 2.0 s"), "{text}");
        let row = text.lines().find(|l| l.trim_start().starts_with("/d/a ")).expect("leaf row");
        assert_eq!(row.split_whitespace().nth(2), Some("1.00k"), "{row}");
        let latency = text.lines().find(|l| l.contains("sync_read")).expect("latency row");
        assert!(latency.contains(" 20 "), "{latency}");
        let row = text.lines().find(|l| l.starts_with("  vm ")).expect("volume row");
        assert_eq!(row.split_whitespace().nth(3), Some("75%"), "{row}");
        assert!(
            text.contains("vm: 75% of writes cover part of a 16K block (about 4K each)"),
            "{text}"
        );
        assert!(
            text.contains(
                "write throttle: 96M dirty of 2G (a sync starts at 512M, sooner where free space \
                 is short), 10 writes delayed/s (mean 2.0ms; 3 woken as their txg began its \
                 sync), 4 spared/s (their volume was not the one filling the dirty data), 1 \
                 waited for a txg sync/s (mean 2.0ms), "
            ),
            "{text}"
        );
        assert!(text.contains("waits for a sync to free space/s (mean 2.0ms)"), "{text}");
        // Counts per second over the 2 s; the line waiting is a gauge, as it is now.
        assert!(
            text.contains(
                "from the block on disk): 300/s beside their writes, 120/s by the txg sync (a \
                 lone write's, or one no task reached in time; 10/s found every task busy and the \
                 line full), 17 waiting for a task now\n"
            ),
            "{text}"
        );
        assert!(text.contains("  txg sync: 200 device writes/s of 56K on average\n"), "{text}");
        // Bytes by kind of block over the 2 s, kinds that wrote nothing left out.
        assert!(
            text.contains("  written by kind of block: volume data 32.0MB/s, indirect 4.00MB/s\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "the txg sync writes to disk-0 in runs of 56K where the pool's free space is cut \
                 up (random rewrites on a pool 56% full leave it so), and the log's flushes wait"
            ),
            "{text}"
        );
        // Writes of half a megabyte are what a pool with room gives: no hint.
        let mut roomy = now.clone();
        roomy.leaves[0].async_written_bytes = 100 * 65536 + 400 * (512 << 10);
        let roomy = report(&roomy, Some(&earlier), false);
        assert!(roomy.contains("  txg sync: 200 device writes/s of 512K on average\n"), "{roomy}");
        assert!(!roomy.contains("in runs of"), "{roomy}");
        // Small writes on a pool a fifth full are not its free space cut up: no hint.
        let emptier = report(
            &PoolSnapshot { allocated_bytes: 800 << 20, ..now.clone() },
            Some(&earlier),
            false,
        );
        assert!(emptier.contains("of 56K on average\n"), "{emptier}");
        assert!(!emptier.contains("in runs of"), "{emptier}");
        // A resilver's writes are in the same class: said, and no hint.
        let resilvering = PoolSnapshot { scan_running: Some("resilver".into()), ..now.clone() };
        let resilvering = report(&resilvering, Some(&earlier), false);
        assert!(resilvering.contains("of 56K on average (with the resilver's)\n"), "{resilvering}");
        assert!(!resilvering.contains("in runs of"), "{resilvering}");
        // A log device: the log's flushes do not wait behind the sync's writes.
        let mut logged = now.clone();
        logged.tops.push(TopSnapshot { mirror: false, log: true, parity: 0, hole: false });
        let logged = report(&logged, Some(&earlier), false);
        assert!(logged.contains("disk-0 in runs of 56K"), "{logged}");
        assert!(!logged.contains("flushes wait"), "{logged}");
        // A RAID-Z leaf takes a column of each run: 56K on each of four leaves of a raidz1 is
        // a 168K run, not small.
        let mut raidz = now.clone();
        let mut raidz_earlier = earlier.clone();
        raidz.tops[0] = TopSnapshot { mirror: false, log: false, parity: 1, hole: false };
        for (snapshot, leaf) in
            [(&mut raidz, &now.leaves[0]), (&mut raidz_earlier, &earlier.leaves[0])]
        {
            snapshot.leaves =
                (0..4).map(|i| LeafSnapshot { path: format!("/d/{i}"), ..leaf.clone() }).collect();
        }
        let wide = report(&raidz, Some(&raidz_earlier), false);
        assert!(wide.contains("  txg sync: 800 device writes/s of 56K on average\n"), "{wide}");
        assert!(!wide.contains("in runs of"), "{wide}");
        // A raidz1 of three: 112K runs, small.
        raidz.leaves.truncate(3);
        raidz_earlier.leaves.truncate(3);
        let narrow = report(&raidz, Some(&raidz_earlier), false);
        assert!(narrow.contains("raidz1-0 in runs of 112K (56K per disk) where"), "{narrow}");
        let json = report_json(&now, Some(&earlier));
        assert_eq!(json["leaves"][0]["async_write_commands_per_s"], 200.0, "{json}");
        assert_eq!(json["leaves"][0]["async_written_bytes_per_s"], 200.0 * 57344.0, "{json}");
        assert_eq!(json["throttle"]["delay_mean_us"], 2000.0, "{json}");
        assert_eq!(json["throttle"]["dirty_max_bytes"], 2u64 << 30, "{json}");
        assert_eq!(json["throttle"]["waited_for_space_per_s"], 1.5, "{json}");
        assert_eq!(json["throttle"]["space_wait_mean_us"], 2000.0, "{json}");
        assert_eq!(json["leaves"][0]["writes_per_s"], 1000.0, "{json}");
        assert_eq!(json["leaves"][0]["latency"]["sync_read"]["count"], 20, "{json}");
        assert_eq!(json["volumes"][0]["partial_writes"], 300, "{json}");
        assert_eq!(json["patches"]["completed_beside_per_s"], 300.0, "{json}");
        assert_eq!(json["patches"]["left_to_sync_per_s"], 10.0, "{json}");
        assert_eq!(json["patches"]["waiting"], 17, "{json}");
        assert_eq!(json["since_import"], false);
        assert_eq!(json["intent_log"]["records_per_block"], 5.0, "{json}");
        assert_eq!(json["intent_log"]["groups_per_s"], 50.0, "{json}");
        assert_eq!(json["volumes"][0]["log"]["group_cap_per_vdev"], 8, "{json}");
        let first = report(&now, None, false);
        assert!(first.contains("since import, 12.0 s"), "{first}");
        assert!(!first.lines().any(|l| l.starts_with("latency ")), "{first}");
        // What crossed the control socket as JSON reports the same.
        let wired = |s: &PoolSnapshot| {
            let s = PoolSnapshot { version: crate::snapshot::SNAPSHOT_VERSION, ..s.clone() };
            PoolSnapshot::from_json(&s.to_json()).expect("snapshot round trip")
        };
        assert_eq!(report(&wired(&now), Some(&wired(&earlier)), true), text);
    }
}
