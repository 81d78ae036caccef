//! `sluice pool iostat`: what a served pool is doing (ZFS: `zpool iostat -v`, `-l`, `-q`).
//!
//! The server answers a hidden control command, `pool stats NAME`, with its counters and
//! latency histograms as one JSON document ([`snapshot`]). The command asks for one per
//! interval and prints the difference between consecutive ones, so the server keeps no state
//! per watcher and any number of them can watch at once. The first report covers the time
//! since import, as `zpool iostat` does.
//!
//! Rows: the pool, each top-level vdev and each leaf (I/Os and bytes per second, flushes, what
//! is queued and in the device now, and the depth the device queue allows), then each volume
//! (client requests per second), then the intent log and txg syncs. A mirror's and the pool's
//! rows add up their leaves' I/Os, so a mirrored write counts once per copy. With `--latency`,
//! percentiles per I/O class for each leaf (queued to done) and per request type for each
//! volume (arrival to answer, which includes waiting for the log).

use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use sluice_engine::stats::{Histogram, HistogramSnapshot, VolumeOp};
use sluice_engine::tunables::IoClass;
use sluice_engine::txg::Store;

use crate::control;

/// The served store's counters now, as the JSON the `iostat` command reads.
pub fn snapshot(store: &Store) -> Value {
    let pool = store.pool();
    let histograms = |list: &[Histogram]| -> Vec<Value> {
        list.iter()
            .map(|h| {
                let s = h.snapshot();
                json!({"count": s.count, "sum": s.sum_nanos, "buckets": s.sparse()})
            })
            .collect()
    };
    let tops: Vec<Value> = pool
        .config()
        .top
        .iter()
        .map(|t| json!({"mirror": t.kind == sluice_format::TopKind::Mirror, "log": t.log}))
        .collect();
    let leaves: Vec<Value> = pool
        .leaves()
        .iter()
        .map(|l| {
            let s = l.leaf.stats();
            json!({
                "path": l.path,
                "top": l.top,
                "reads": s.reads.get(),
                "writes": s.writes.get(),
                "read_bytes": s.read_bytes.get(),
                "write_bytes": s.write_bytes.get(),
                "flushes": s.flushes.get(),
                "errors": s.read_errors.get() + s.write_errors.get() + s.flush_errors.get()
                    + s.checksum_errors.get(),
                "queued": l.leaf.queued(),
                "active": l.leaf.active_by_class().to_vec(),
                "depth": l.leaf.queue_depth(),
                "latency": histograms(&s.latency),
            })
        })
        .collect();
    let volumes: Vec<Value> = store
        .volumes()
        .iter()
        .filter_map(|entry| {
            let s = store.volume_stats(&entry.name).ok()?;
            Some(json!({
                "name": entry.name,
                "block_bytes": entry.block_bytes,
                "requests": s.requests.iter().map(|c| c.get()).collect::<Vec<_>>(),
                "read_bytes": s.read_bytes.get(),
                "write_bytes": s.write_bytes.get(),
                "errors": s.errors.get(),
                "partial_writes": s.partial_writes.get(),
                "latency": histograms(&s.latency),
            }))
        })
        .collect();
    let log = store.log_stats();
    let throttle = store.throttle_stats();
    json!({
        "pool": pool.name(),
        "uptime_ns": u64::try_from(pool.env().now().since(store.opened()).as_nanos())
            .unwrap_or(u64::MAX),
        "txg": pool.uberblock().txg,
        "syncs": store.syncs(),
        "tops": tops,
        "leaves": leaves,
        "volumes": volumes,
        "log": {
            "commits": log.commits.get(),
            "early": log.early_commits.get(),
            "via_txg": log.commits_via_txg.get(),
            "blocks": store.log_blocks_written(),
        },
        "throttle": {
            "delayed": throttle.delayed.get(),
            "delayed_ns": throttle.delayed_nanos.get(),
            "waited": throttle.waited_for_sync.get(),
            "waited_ns": throttle.waited_nanos.get(),
            "spared": throttle.spared.get(),
        },
    })
}

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
    let mut earlier: Option<Snapshot> = None;
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

fn fetch(pool: &str) -> anyhow::Result<Snapshot> {
    let args = ["pool", "stats", pool].map(String::from);
    let text = control::forward(pool, &args).unwrap_or_else(|| {
        anyhow::bail!(
            "pool {pool} is not being served here: iostat shows what a running `sluice serve` \
             is doing (no control socket at {}); start it with `sluice serve {pool}`",
            control::socket_path(pool).display()
        )
    })?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("reading the statistics the server of {pool} sent"))?;
    Snapshot::parse(&value)
        .with_context(|| format!("the statistics the server of {pool} sent are incomplete"))
}

#[derive(Clone, Debug, Default)]
struct Snapshot {
    pool: String,
    uptime: Duration,
    syncs: u64,
    /// (mirror, log) per top-level vdev.
    tops: Vec<(bool, bool)>,
    leaves: Vec<LeafSnapshot>,
    volumes: Vec<VolumeSnapshot>,
    /// commits, early, through a txg sync, log blocks.
    log: [u64; 4],
    /// Writes delayed and their total delay (ns), writes that waited for a sync and their
    /// wait, writes spared the delay.
    throttle: [u64; 5],
}

#[derive(Clone, Debug, Default)]
struct LeafSnapshot {
    path: String,
    top: usize,
    /// reads, writes, read bytes, write bytes, flushes, errors.
    counts: [u64; 6],
    /// I/Os waiting to be issued, and what is in the device (see `Leaf::active_by_class`).
    queued: u64,
    active: u64,
    depth: u64,
    latency: Vec<HistogramSnapshot>,
}

#[derive(Clone, Debug, Default)]
struct VolumeSnapshot {
    name: String,
    block_bytes: u64,
    /// Requests per [`VolumeOp`], read bytes, write bytes, errors, partial-block writes.
    counts: [u64; VolumeOp::COUNT + 4],
    latency: Vec<HistogramSnapshot>,
}

fn histograms(value: &Value) -> Option<Vec<HistogramSnapshot>> {
    value
        .as_array()?
        .iter()
        .map(|h| {
            let pairs: Option<Vec<(usize, u64)>> = h["buckets"]
                .as_array()?
                .iter()
                .map(|p| Some((usize::try_from(p[0].as_u64()?).ok()?, p[1].as_u64()?)))
                .collect();
            HistogramSnapshot::from_sparse(&pairs?, h["count"].as_u64()?, h["sum"].as_u64()?)
        })
        .collect()
}

impl Snapshot {
    fn parse(v: &Value) -> Option<Snapshot> {
        let u = |v: &Value, key: &str| v[key].as_u64();
        let leaves = v["leaves"]
            .as_array()?
            .iter()
            .map(|l| {
                Some(LeafSnapshot {
                    path: l["path"].as_str()?.to_owned(),
                    top: usize::try_from(u(l, "top")?).ok()?,
                    counts: [
                        u(l, "reads")?,
                        u(l, "writes")?,
                        u(l, "read_bytes")?,
                        u(l, "write_bytes")?,
                        u(l, "flushes")?,
                        u(l, "errors")?,
                    ],
                    queued: u(l, "queued")?,
                    active: l["active"].as_array()?.iter().filter_map(Value::as_u64).sum(),
                    depth: u(l, "depth")?,
                    latency: histograms(&l["latency"])?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let volumes = v["volumes"]
            .as_array()?
            .iter()
            .map(|vol| {
                let requests = vol["requests"].as_array()?;
                let mut counts = [0; VolumeOp::COUNT + 4];
                for op in VolumeOp::ALL {
                    counts[op.index()] = requests.get(op.index())?.as_u64()?;
                }
                counts[VolumeOp::COUNT] = u(vol, "read_bytes")?;
                counts[VolumeOp::COUNT + 1] = u(vol, "write_bytes")?;
                counts[VolumeOp::COUNT + 2] = u(vol, "errors")?;
                counts[VolumeOp::COUNT + 3] = u(vol, "partial_writes")?;
                Some(VolumeSnapshot {
                    name: vol["name"].as_str()?.to_owned(),
                    block_bytes: u(vol, "block_bytes")?,
                    counts,
                    latency: histograms(&vol["latency"])?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let tops = v["tops"]
            .as_array()?
            .iter()
            .map(|t| Some((t["mirror"].as_bool()?, t["log"].as_bool()?)))
            .collect::<Option<Vec<_>>>()?;
        let log = &v["log"];
        let t = &v["throttle"];
        Some(Snapshot {
            pool: v["pool"].as_str()?.to_owned(),
            uptime: Duration::from_nanos(u(v, "uptime_ns")?),
            syncs: u(v, "syncs")?,
            tops,
            leaves,
            volumes,
            log: [u(log, "commits")?, u(log, "early")?, u(log, "via_txg")?, u(log, "blocks")?],
            throttle: [
                u(t, "delayed")?,
                u(t, "delayed_ns")?,
                u(t, "waited")?,
                u(t, "waited_ns")?,
                u(t, "spared")?,
            ],
        })
    }
}

/// Counts are totals; what they became since `earlier` (a leaf or volume it lacks counts from
/// zero). Gauges (queued, active, depth) stay as they are now.
fn difference(now: &Snapshot, earlier: &Snapshot) -> Snapshot {
    let sub = |a: &[u64], b: &[u64]| -> Vec<u64> {
        a.iter()
            .enumerate()
            .map(|(i, x)| x.saturating_sub(b.get(i).copied().unwrap_or(0)))
            .collect()
    };
    let hist =
        |a: &[HistogramSnapshot], b: Option<&[HistogramSnapshot]>| -> Vec<HistogramSnapshot> {
            a.iter()
                .enumerate()
                .map(|(i, h)| match b.and_then(|b| b.get(i)) {
                    Some(e) => h.since(e),
                    None => h.clone(),
                })
                .collect()
        };
    let mut out = now.clone();
    out.uptime = now.uptime.saturating_sub(earlier.uptime);
    out.syncs = now.syncs.saturating_sub(earlier.syncs);
    out.log.copy_from_slice(&sub(&now.log, &earlier.log));
    out.throttle.copy_from_slice(&sub(&now.throttle, &earlier.throttle));
    for leaf in &mut out.leaves {
        let before = earlier.leaves.iter().find(|e| e.path == leaf.path);
        let counts = sub(&leaf.counts, before.map_or(&[][..], |e| &e.counts[..]));
        leaf.counts.copy_from_slice(&counts);
        leaf.latency = hist(&leaf.latency, before.map(|e| &e.latency[..]));
    }
    for volume in &mut out.volumes {
        let before = earlier.volumes.iter().find(|e| e.name == volume.name);
        let counts = sub(&volume.counts, before.map_or(&[][..], |e| &e.counts[..]));
        volume.counts.copy_from_slice(&counts);
        volume.latency = hist(&volume.latency, before.map(|e| &e.latency[..]));
    }
    out
}

/// A report as JSON: rates per second over the span, gauges as they are, and latency
/// percentiles in microseconds for every kind with samples.
fn report_json(now: &Snapshot, earlier: Option<&Snapshot>) -> Value {
    let d = match earlier {
        Some(earlier) => difference(now, earlier),
        None => now.clone(),
    };
    let seconds = d.uptime.as_secs_f64().max(1e-3);
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
    let classes = IoClass::ALL.map(IoClass::name);
    let ops = VolumeOp::ALL.map(VolumeOp::name);
    let leaves: Vec<Value> = d
        .leaves
        .iter()
        .map(|l| {
            let c = &l.counts;
            json!({
                "path": l.path,
                "top": l.top,
                "reads_per_s": per_second(c[0]),
                "writes_per_s": per_second(c[1]),
                "read_bytes_per_s": per_second(c[2]),
                "write_bytes_per_s": per_second(c[3]),
                "flushes_per_s": per_second(c[4]),
                "errors": c[5],
                "queued": l.queued,
                "active": l.active,
                "depth": l.depth,
                "latency": latency(&classes, &l.latency),
            })
        })
        .collect();
    let volumes: Vec<Value> = d
        .volumes
        .iter()
        .map(|v| {
            let c = &v.counts;
            json!({
                "name": v.name,
                "block_bytes": v.block_bytes,
                "reads_per_s": per_second(c[VolumeOp::Read.index()]),
                "writes_per_s": per_second(c[VolumeOp::Write.index()]),
                "flushes_per_s": per_second(c[VolumeOp::Flush.index()]),
                "zeroes_per_s": per_second(c[VolumeOp::Zero.index()]),
                "read_bytes_per_s": per_second(c[VolumeOp::COUNT]),
                "write_bytes_per_s": per_second(c[VolumeOp::COUNT + 1]),
                "errors": c[VolumeOp::COUNT + 2],
                "partial_writes": c[VolumeOp::COUNT + 3],
                "latency": latency(&ops, &v.latency),
            })
        })
        .collect();
    let [commits, early, via_txg, blocks] = d.log;
    json!({
        "pool": d.pool,
        "since_import": earlier.is_none(),
        "seconds": seconds,
        "tops": d.tops.iter().map(|(mirror, log)| json!({"mirror": mirror, "log": log})).collect::<Vec<_>>(),
        "leaves": leaves,
        "volumes": volumes,
        "intent_log": {
            "commits_per_s": per_second(commits),
            "early_commits_per_s": per_second(early),
            "txg_commits_per_s": per_second(via_txg),
            "blocks_per_s": per_second(blocks),
        },
        "txg_syncs_per_s": per_second(d.syncs),
        "throttle": {
            "delayed_per_s": per_second(d.throttle[0]),
            "delay_mean_us": d.throttle[1] as f64 / 1e3 / d.throttle[0].max(1) as f64,
            "waited_for_sync_per_s": per_second(d.throttle[2]),
            "wait_mean_us": d.throttle[3] as f64 / 1e3 / d.throttle[2].max(1) as f64,
            "spared_per_s": per_second(d.throttle[4]),
        },
    })
}

/// One report: `now` less `earlier` (or since import), per second.
fn report(now: &Snapshot, earlier: Option<&Snapshot>, latency: bool) -> String {
    let d = match earlier {
        Some(earlier) => difference(now, earlier),
        None => now.clone(),
    };
    let seconds = d.uptime.as_secs_f64().max(1e-3);
    let rate = |n: u64| scaled(n as f64 / seconds, 1000.0, "");
    let bytes = |n: u64| scaled(n as f64 / seconds, 1024.0, "B");
    let mut out = String::new();
    let span = if earlier.is_some() { "the last" } else { "since import," };
    out.push_str(&format!(
        "pool {}: {span} {:.1} s, per second\n{:<36} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} {:>6} {:>5} {:>6}\n",
        d.pool, seconds, "vdev", "reads", "writes", "read", "written", "flushes", "queued",
        "active", "depth", "errors"
    ));
    let row = |name: String, leaves: &[&LeafSnapshot], depth: Option<u64>| -> String {
        let sum = |i: usize| leaves.iter().map(|l| l.counts[i]).sum::<u64>();
        let queued: u64 = leaves.iter().map(|l| l.queued).sum();
        let active: u64 = leaves.iter().map(|l| l.active).sum();
        format!(
            "{:<36} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} {:>6} {:>5} {:>6}\n",
            name,
            rate(sum(0)),
            rate(sum(1)),
            bytes(sum(2)),
            bytes(sum(3)),
            rate(sum(4)),
            queued,
            active,
            depth.map_or(String::new(), |x| x.to_string()),
            sum(5)
        )
    };
    let all: Vec<&LeafSnapshot> = d.leaves.iter().collect();
    out.push_str(&row(d.pool.clone(), &all, None));
    for (index, (mirror, log)) in d.tops.iter().enumerate() {
        let members: Vec<&LeafSnapshot> = d.leaves.iter().filter(|l| l.top == index).collect();
        let indent = if *mirror {
            let kind = if *log { "log mirror" } else { "mirror" };
            out.push_str(&row(format!("  {kind}-{index}"), &members, None));
            "    "
        } else {
            "  "
        };
        for leaf in members {
            let name =
                format!("{indent}{}{}", leaf.path, if *log && !*mirror { " (log)" } else { "" });
            out.push_str(&row(name, &[leaf], Some(leaf.depth)));
        }
    }
    out.push_str(&format!(
        "{:<36} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>6}\n",
        "volume", "reads", "writes", "partial", "flushes", "zeroes", "read", "written", "errors"
    ));
    let mut hints = String::new();
    for volume in &d.volumes {
        let c = &volume.counts;
        let writes = c[VolumeOp::Write.index()];
        let partial = c[VolumeOp::COUNT + 3];
        out.push_str(&format!(
            "  {:<34} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>8} {:>6}\n",
            volume.name,
            rate(c[VolumeOp::Read.index()]),
            rate(writes),
            (100 * partial).checked_div(writes).map_or("-".to_owned(), |p| format!("{p}%")),
            rate(c[VolumeOp::Flush.index()]),
            rate(c[VolumeOp::Zero.index()]),
            bytes(c[VolumeOp::COUNT]),
            bytes(c[VolumeOp::COUNT + 1]),
            c[VolumeOp::COUNT + 2]
        ));
        // Worth saying when most writes rewrite a bigger block than they carry.
        if writes >= 100 && partial * 2 > writes && volume.block_bytes > 4096 {
            let written = c[VolumeOp::COUNT + 1] / writes.max(1);
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
    let [commits, early, via_txg, blocks] = d.log;
    out.push_str(&format!(
        "intent log: {} commits/s ({} early, {} through a txg sync), {} log blocks/s, {:.2} commits \
         per block; txgs synced: {}/s\n",
        rate(commits),
        rate(early),
        rate(via_txg),
        rate(blocks),
        commits as f64 / blocks.max(1) as f64,
        rate(d.syncs)
    ));
    let [delayed, delayed_ns, waited, waited_ns, spared] = d.throttle;
    let mean =
        |total: u64, n: u64| duration(Duration::from_nanos(total.checked_div(n).unwrap_or(0)));
    out.push_str(&format!(
        "write throttle: {} writes delayed/s (mean {}), {} spared/s (their volume was not the \
         one filling the dirty data), {} waited for a txg sync/s (mean {})\n",
        rate(delayed),
        mean(delayed_ns, delayed),
        rate(spared),
        rate(waited),
        mean(waited_ns, waited)
    ));
    if latency {
        out.push_str(&latency_table(&d));
    }
    out.push('\n');
    out
}

/// Percentiles per leaf and I/O class, and per volume and request type, for the report's span.
fn latency_table(d: &Snapshot) -> String {
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
        let rows = IoClass::ALL.iter().map(|c| (c.name(), leaf.latency.get(c.index()))).collect();
        group(format!("  {} (queued to done)", leaf.path), rows);
    }
    for volume in &d.volumes {
        let rows =
            VolumeOp::ALL.iter().map(|o| (o.name(), volume.latency.get(o.index()))).collect();
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
        let histogram = Histogram::default();
        let leaf = |writes: u64, latency: HistogramSnapshot| LeafSnapshot {
            path: "/d/a".into(),
            top: 0,
            counts: [0, writes, 0, writes * 4096, writes, 0],
            queued: 1,
            active: 1,
            depth: 32,
            latency: vec![latency],
        };
        let mut earlier = Snapshot {
            pool: "tank".into(),
            uptime: Duration::from_secs(10),
            tops: vec![(false, false)],
            ..Snapshot::default()
        };
        earlier.leaves.push(leaf(1000, histogram.snapshot()));
        for _ in 0..20 {
            histogram.record(Duration::from_micros(200));
        }
        let volume = |writes: u64, partial: u64| VolumeSnapshot {
            name: "vm".into(),
            block_bytes: 16384,
            counts: [0, writes, 0, 0, 0, writes * 4096, 0, partial],
            latency: Vec::new(),
        };
        earlier.volumes.push(volume(500, 100));
        earlier.throttle = [10, 10_000_000, 0, 0, 0];
        let mut now = earlier.clone();
        now.throttle = [30, 50_000_000, 2, 4_000_000, 8];
        now.uptime = Duration::from_secs(12);
        now.leaves[0] = leaf(3000, histogram.snapshot());
        // 400 writes in the interval, 300 of them partial: 75%, and worth a hint.
        now.volumes[0] = volume(900, 400);
        let text = report(&now, Some(&earlier), true);
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
                "write throttle: 10 writes delayed/s (mean 2.0ms), 4 spared/s (their volume was \
                 not the one filling the dirty data), 1 waited for a txg sync/s (mean 2.0ms)"
            ),
            "{text}"
        );
        let json = report_json(&now, Some(&earlier));
        assert_eq!(json["throttle"]["delay_mean_us"], 2000.0, "{json}");
        assert_eq!(json["leaves"][0]["writes_per_s"], 1000.0, "{json}");
        assert_eq!(json["leaves"][0]["latency"]["sync_read"]["count"], 20, "{json}");
        assert_eq!(json["volumes"][0]["partial_writes"], 300, "{json}");
        assert_eq!(json["since_import"], false);
        let first = report(&now, None, false);
        assert!(first.contains("since import, 12.0 s"), "{first}");
        assert!(!first.contains("latency"), "{first}");
    }
}
