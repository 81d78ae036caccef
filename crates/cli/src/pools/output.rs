//! The one renderer: every pool, volume and snapshot command builds a typed [`Reply`] and this
//! module turns it into what the command prints, as a table or lines for a person, as `-H`
//! (no header, tab-separated, sizes in bytes, times in seconds) for scripts, or as `--json`
//! (one object per pool, volume, snapshot or property set, one per line). A served pool's
//! server sends the same replies over the control socket (crate::control) and the command
//! renders them here, so its output is the same whether the pool is served or not.
//!
//! The `--json` field names are a promise to scripts: each JSON row is the serde form of its
//! row type, with keys in alphabetical order (as they always were), and a reply's text-only
//! figures (the block cache, intent log and dedup lines of `pool status`) travel beside the
//! JSON part rather than in it.

use serde::{Deserialize, Serialize};

use crate::snapshot::PoolSnapshot;

/// How a command's replies are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Tables and sentences for a person; sizes like 8.2M.
    Text,
    /// `-H`: no header, fields separated by tabs, sizes in bytes, times in seconds.
    Scripted,
    /// `--json`: one JSON object per row.
    Json,
}

impl Format {
    /// The format a command's `-H` and `--json` flags ask for.
    pub fn of(scripted: bool, json: bool) -> Format {
        match (scripted, json) {
            (_, true) => Format::Json,
            (true, false) => Format::Scripted,
            (false, false) => Format::Text,
        }
    }
}

/// What a command has to say: typed, so that a served pool's server can send it and the
/// command render it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reply {
    /// What a command did, in words (`created volume tank/vm1 (...)`).
    Done(Done),
    PoolList(PoolList),
    PoolStatus(Box<PoolStatus>),
    VolList(VolList),
    VolProps(VolProps),
    SnapshotList(SnapshotList),
    /// A served pool's counters (`pool stats`, read by `pool iostat`), their layout checked
    /// as they are read.
    Stats(#[serde(deserialize_with = "PoolSnapshot::deserialize_checked")] Box<PoolSnapshot>),
    /// A served pool's events (`pool events`).
    Events(crate::events::EventList),
}

/// A command's account of what it did: one or more lines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub message: String,
}

impl Reply {
    /// A [`Reply::Done`] saying `message`.
    pub fn done(message: impl Into<String>) -> Reply {
        Reply::Done(Done { message: message.into() })
    }
}

/// How far a scrub or resilver has got, sent while a command waits for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub pool: String,
    /// `scrub` or `resilver`.
    pub func: String,
    /// Share of the walk done, from 0 to 1 (the engine's `ScanStatus::progress`).
    pub fraction: f64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub issued_bytes: u64,
    pub errors: u64,
    pub seconds: u64,
}

/// `pool list`: a row per pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolList {
    pub pools: Vec<PoolRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolRow {
    pub name: String,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub health: String,
}

/// `pool status`: what `--json` prints ([`PoolSummary`]) and the figures only the text shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub summary: PoolSummary,
    pub detail: StatusDetail,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolSummary {
    pub name: String,
    pub guid: String,
    pub txg: u64,
    /// ONLINE or DEGRADED.
    pub state: String,
    pub status: Option<String>,
    pub action: Option<String>,
    pub scan: Option<ScanReport>,
    pub vdevs: Vec<VdevReport>,
    /// Hot spares: AVAIL, INUSE (standing in for a leaf) or UNAVAIL (not found at import).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spares: Vec<SpareReport>,
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub reserved_unused_bytes: u64,
    pub available_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScanReport {
    pub func: String,
    /// scanning, finished or canceled.
    pub phase: String,
    pub paused: bool,
    pub progress: f64,
    pub seconds: u64,
    pub examined_bytes: u64,
    pub total_bytes: u64,
    pub issued_bytes: u64,
    pub repaired_bytes: u64,
    pub errors: u64,
    pub unrecoverable: u64,
    pub targets: Vec<String>,
    pub failure: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpareReport {
    pub path: String,
    pub guid: String,
    pub state: String,
    /// The leaf it stands in for (its path), while in use.
    pub stands_in_for: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VdevReport {
    /// mirror, raidz1, raidz2, raidz3, leaf, or hole (a removed log device's place, which
    /// keeps the vdevs after it at their numbers; it has no leaves).
    pub kind: String,
    /// ONLINE; DEGRADED while it serves with leaves out (on RAID-Z, up to its parity);
    /// FAULTED when it cannot serve every block.
    #[serde(default)]
    pub state: String,
    pub log: bool,
    pub guid: String,
    /// In column order on RAID-Z, a column being replaced followed by its new leaf.
    pub leaves: Vec<LeafReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeafReport {
    pub path: String,
    pub guid: String,
    /// The leaf's state, or MISSING when it was not found at import.
    pub state: String,
    pub reason: Option<String>,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    pub resilvering: bool,
    pub being_replaced: bool,
    /// On RAID-Z, `replacing-N` for both leaves of column N while one replaces the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What `pool status` shows beyond its JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusDetail {
    /// The serving process, when the pool is served.
    pub served_by: Option<u32>,
    /// Why the pool stopped writing, when it did.
    pub suspended: Option<String>,
    /// The scan's running time to the tenth of a second.
    pub scan_secs: Option<f64>,
    pub cache: CacheFigures,
    pub log: LogFigures,
    pub dedup: DedupFigures,
    pub volumes: Vec<StatusVolume>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheFigures {
    pub bytes: u64,
    pub bytes_max: u64,
    pub hits: u64,
    pub misses: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogFigures {
    pub commits: u64,
    pub commits_via_txg: u64,
    pub early_commits: u64,
    #[serde(default)]
    pub early_fills: u64,
    pub commits_ignored: u64,
    pub log_blocks_written: u64,
    pub indirect_blocks_written: u64,
    #[serde(default)]
    pub indirect_records_shared: u64,
    pub indirect_records_copied: u64,
    pub indirect_records_left_to_sync: u64,
    pub chains_claimed: u64,
    pub records_replayed: u64,
    pub indirect_records_replayed: u64,
    pub records_already_replayed: u64,
    pub torn_tails: u64,
    pub indirect_chain_ends: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DedupFigures {
    pub ratio: f64,
    pub references: u64,
    pub entries: u64,
    pub allocated_bytes: u64,
    pub referenced_bytes: u64,
    pub buckets: u64,
    pub table_bytes: u64,
    pub in_memory: u64,
    /// How the table is locked: "per-entry I/O lock" or "global".
    pub locking: String,
    /// Lock acquisitions by stage, in the engine's order.
    pub stages: Vec<(String, u64)>,
    pub contended: u64,
    pub waited_nanos: u64,
    pub blocks_written: u64,
    pub blocks_shared: u64,
    pub verify_mismatches: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusVolume {
    pub name: String,
    pub size_bytes: u64,
    pub block_bytes: u64,
    pub dedup: String,
    pub compression: String,
    pub referenced_bytes: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
}

/// `vol list`: volumes and interrupted receives, in order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VolList {
    pub entries: Vec<VolEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolEntry {
    Volume(VolRow),
    Interrupted(InterruptedReceive),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolRow {
    pub name: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub available_bytes: u64,
    pub referenced_bytes: u64,
    pub reservation_bytes: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    pub block_bytes: u64,
    pub compression: String,
    /// Rounded to hundredths (the text's RATIO comes from the logical and physical bytes).
    pub compress_ratio: f64,
    pub dedup: String,
    pub sync: String,
    pub logbias: String,
    /// available or unavailable for an encrypted volume, `-` for one that is not.
    #[serde(default)]
    pub keystatus: String,
}

/// A receive that stopped part way and kept what arrived (`recv -s`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InterruptedReceive {
    pub name: String,
    pub receive_resume_token: String,
    pub received_blocks: u64,
}

/// `vol get`: a volume's properties in the order asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolProps {
    pub name: String,
    pub properties: Vec<VolProp>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolProp {
    pub name: String,
    pub value: PropValue,
}

/// A property's value: a size (human in the text, bytes for scripts and JSON) or words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PropValue {
    Bytes(u64),
    Text(String),
}

/// `snapshot list`: a row per snapshot, oldest first within each volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRow {
    pub name: String,
    pub txg: u64,
    pub creation_secs: u64,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub referenced_bytes: u64,
    pub written_bytes: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
    pub compress_ratio: f64,
    pub clones: Vec<String>,
    /// Taken by the volume's snapshot schedule (`snapshot.schedule`), which also prunes it.
    #[serde(default)]
    pub automatic: bool,
}

/// The header of `pool list`.
const POOL_LIST_HEADER: &str = "NAME                     SIZE   ALLOC    FREE  HEALTH";

/// Replies of several pools as one: adjacent lists of one kind become one list, so a table
/// has one header whichever pools (served or not) its rows came from.
pub fn merge(replies: Vec<Reply>) -> Vec<Reply> {
    let mut merged: Vec<Reply> = Vec::with_capacity(replies.len());
    for reply in replies {
        match (merged.last_mut(), reply) {
            (Some(Reply::PoolList(list)), Reply::PoolList(more)) => list.pools.extend(more.pools),
            (Some(Reply::VolList(list)), Reply::VolList(more)) => list.entries.extend(more.entries),
            (Some(Reply::SnapshotList(list)), Reply::SnapshotList(more)) => {
                list.snapshots.extend(more.snapshots)
            }
            (Some(Reply::Events(list)), Reply::Events(more)) => list.events.extend(more.events),
            (_, reply) => merged.push(reply),
        }
    }
    merged
}

/// Every reply, merged, as the command prints it.
pub fn render_all(replies: Vec<Reply>, format: Format) -> String {
    merge(replies).iter().map(|reply| render(reply, format)).collect()
}

/// One reply as the command prints it, each line ending in a newline.
pub fn render(reply: &Reply, format: Format) -> String {
    let mut out = Lines::default();
    match reply {
        Reply::Done(done) => out.say(&done.message),
        Reply::PoolList(list) => pool_list(&mut out, list, format),
        Reply::PoolStatus(status) if format == Format::Json => out.json(&status.summary),
        Reply::PoolStatus(status) => pool_status(&mut out, status),
        Reply::VolList(list) => vol_list(&mut out, list, format),
        Reply::VolProps(props) => vol_props(&mut out, props, format),
        Reply::SnapshotList(list) => snapshot_list(&mut out, list, format),
        Reply::Stats(snapshot) => out.say(snapshot.to_json()),
        Reply::Events(list) => {
            for event in &list.events {
                match format {
                    Format::Json => out.json(event),
                    _ => out.say(event.line()),
                }
            }
        }
    }
    out.0
}

/// A progress report as the line the command prints (on standard error, so that standard
/// output stays the command's result).
pub fn render_progress(progress: &Progress) -> String {
    if progress.total_bytes == 0 {
        return format!("{} of {}: starting", progress.func, progress.pool);
    }
    format!(
        "{} of {}: {:.1}% done, {} of {} examined, {} issued, {} errors, {} elapsed",
        progress.func,
        progress.pool,
        progress.fraction * 100.0,
        human(progress.examined_bytes),
        human(progress.total_bytes),
        human(progress.issued_bytes),
        progress.errors,
        clock(progress.seconds as f64)
    )
}

/// The text being built.
#[derive(Default)]
struct Lines(String);

impl Lines {
    fn say(&mut self, line: impl AsRef<str>) {
        self.0.push_str(line.as_ref());
        self.0.push('\n');
    }

    /// `row` as one line of JSON. Through `serde_json::Value`, whose objects keep their keys
    /// sorted: the order `--json` has always printed.
    fn json(&mut self, row: &impl Serialize) {
        let line = serde_json::to_value(row)
            .map_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()), |v| v.to_string());
        self.say(line);
    }
}

fn pool_list(out: &mut Lines, list: &PoolList, format: Format) {
    if format == Format::Text {
        out.say(POOL_LIST_HEADER);
    }
    for row in &list.pools {
        let allocated = row.allocated_bytes;
        match format {
            Format::Json => out.json(row),
            Format::Scripted => out.say(format!(
                "{}\t{}\t{allocated}\t{}\t{}",
                row.name, row.size_bytes, row.free_bytes, row.health
            )),
            Format::Text => out.say(format!(
                "{:<20} {:>8} {:>7} {:>7}  {}",
                row.name,
                human(row.size_bytes),
                human(allocated),
                human(row.free_bytes),
                row.health
            )),
        }
    }
}

fn pool_status(out: &mut Lines, status: &PoolStatus) {
    let (summary, detail) = (&status.summary, &status.detail);
    let name = &summary.name;
    if let Some(process) = detail.served_by {
        out.say(format!("(served by sluice serve, process {process})"));
    }
    let state = if detail.suspended.is_some() { "SUSPENDED" } else { summary.state.as_str() };
    out.say(format!("pool: {name}  guid: {}  txg: {}  state: {state}", summary.guid, summary.txg));
    if let Some(cause) = &detail.suspended {
        out.say(format!(
            "  status: suspended: {cause}; nothing more is written. Stop the server and import \
             the pool again (it returns to the last synced txg and replays the log)"
        ));
    }
    if let (Some(status), Some(action)) = (&summary.status, &summary.action) {
        out.say(format!("  status: {status}"));
        out.say(format!("  action: {action}"));
    }
    if let Some(scan) = &summary.scan {
        let secs = detail.scan_secs.unwrap_or(scan.seconds as f64);
        out.say(format!("  scan: {}", scan_line(scan, secs)));
    }
    out.say(format!("  {:<40} {:<8} {:>6} {:>6} {:>6}", "NAME", "STATE", "READ", "WRITE", "CKSUM"));
    let mut logs_shown = false;
    for (index, vdev) in summary.vdevs.iter().enumerate() {
        if vdev.kind == "hole" {
            // A removed log device's place: kept so that the others keep their numbers.
            continue;
        }
        if vdev.log && !logs_shown {
            out.say("  logs");
            logs_shown = true;
        }
        if vdev.kind == "mirror" || vdev.kind.starts_with("raidz") {
            // ZFS shows a mirror with a leaf being replaced as `replacing-N`.
            let replacing = vdev.kind == "mirror" && vdev.leaves.iter().any(|l| l.being_replaced);
            let kind = if replacing { "replacing" } else { vdev.kind.as_str() };
            out.say(format!("  {:<40} {:<8}", format!("{kind}-{index}"), vdev.state));
        }
        let mut group_shown: Option<&str> = None;
        for leaf in &vdev.leaves {
            // A RAID-Z column being replaced, or a leaf and its spare: under `replacing-N` or
            // `spare-N`.
            if let Some(group) = leaf.group.as_deref() {
                if group_shown != Some(group) {
                    out.say(format!("    {group:<38}"));
                    group_shown = Some(group);
                }
            }
            let deeper = if leaf.group.is_some() { "  " } else { "" };
            let reason = if leaf.state == "MISSING" {
                Some("not found at import")
            } else {
                leaf.reason.as_deref()
            };
            let note = if leaf.resilvering {
                String::from("  (resilvering)")
            } else if leaf.being_replaced {
                format!(
                    "  (being replaced{})",
                    reason.map(|r| format!("; {r}")).unwrap_or_default()
                )
            } else {
                reason.map(|r| format!("  ({r})")).unwrap_or_default()
            };
            out.say(format!(
                "    {:<38} {:<8} {:>6} {:>6} {:>6}{note}",
                format!("{deeper}{}", leaf.path),
                leaf.state,
                leaf.read_errors,
                leaf.write_errors,
                leaf.checksum_errors,
            ));
        }
    }
    if !summary.spares.is_empty() {
        out.say("  spares");
        for spare in &summary.spares {
            let note = match &spare.stands_in_for {
                Some(leaf) => format!("  (in use, standing in for {leaf})"),
                None if spare.state == "UNAVAIL" => String::from("  (not found at import)"),
                None => String::new(),
            };
            out.say(format!("    {:<38} {:<8}{note}", spare.path, spare.state));
        }
    }
    let raidz = summary.vdevs.iter().any(|v| v.kind.starts_with("raidz"));
    let (raw, usable) = if raidz {
        (
            " (raw, parity included, as pool list shows)",
            " (these two as 128K blocks; vol list gives each volume's for its block size)",
        )
    } else {
        ("", "")
    };
    out.say(format!(
        "  space: {} used, {} free, {} capacity{raw}; {} reserved for thick volumes and not yet \
         written, {} available to new data{usable}",
        human(summary.allocated_bytes),
        human(summary.free_bytes),
        human(summary.capacity_bytes),
        human(summary.reserved_unused_bytes),
        human(summary.available_bytes)
    ));
    let cache = &detail.cache;
    out.say(format!(
        "  block cache: {} of {} held; {} hits, {} misses ({:.0}% hits since import)",
        human(cache.bytes),
        human(cache.bytes_max),
        cache.hits,
        cache.misses,
        100.0 * cache.hits as f64 / (cache.hits + cache.misses).max(1) as f64
    ));
    let log = &detail.log;
    out.say(format!(
        "  intent log: {} commits ({} through a txg sync, {} early, {} not waited for: \
         sync=disabled), {} parts of writes filled early, {} log blocks written, {} blocks \
         written in place for indirect records ({} more records sharing a block written again \
         in its txg, {} records \
         copied instead, {} left to their txg's sync); at import {} \
         chains claimed, {} records replayed ({} indirect; {} already applied by an \
         interrupted replay), {} torn tails, {} chains ended at an indirect block never \
         written",
        log.commits,
        log.commits_via_txg,
        log.early_commits,
        log.commits_ignored,
        log.early_fills,
        log.log_blocks_written,
        log.indirect_blocks_written,
        log.indirect_records_shared,
        log.indirect_records_copied,
        log.indirect_records_left_to_sync,
        log.chains_claimed,
        log.records_replayed,
        log.indirect_records_replayed,
        log.records_already_replayed,
        log.torn_tails,
        log.indirect_chain_ends
    ));
    let dedup = &detail.dedup;
    out.say(format!(
        "  dedup: ratio {:.2}x ({} references to {} stored blocks, {} stored for {} \
         referenced); table: {} entries in {} buckets, {} encoded, {} in memory",
        dedup.ratio,
        dedup.references,
        dedup.entries,
        human(dedup.allocated_bytes),
        human(dedup.referenced_bytes),
        dedup.entries,
        dedup.buckets,
        human(dedup.table_bytes),
        dedup.in_memory
    ));
    let stages: Vec<String> = (dedup.stages.iter())
        .filter(|(_, n)| *n > 0)
        .map(|(stage, n)| format!("{stage} {n}"))
        .collect();
    out.say(format!(
        "  dedup table lock ({}): {} acquisitions ({}), {} contended, {:.3} ms waited; {} \
         blocks written, {} shared, {} verify mismatches",
        dedup.locking,
        dedup.stages.iter().map(|(_, n)| n).sum::<u64>(),
        if stages.is_empty() { String::from("none yet") } else { stages.join(", ") },
        dedup.contended,
        dedup.waited_nanos as f64 / 1e6,
        dedup.blocks_written,
        dedup.blocks_shared,
        dedup.verify_mismatches
    ));
    for volume in &detail.volumes {
        out.say(format!(
            "  volume {}: {} ({} blocks, dedup={}, compression={}), {} used, compress ratio \
             {:.2}x",
            volume.name,
            human(volume.size_bytes),
            human(volume.block_bytes),
            volume.dedup,
            volume.compression,
            human(volume.referenced_bytes),
            ratio(volume.logical_bytes, volume.physical_bytes)
        ));
    }
}

/// zpool's `scan:` line; `secs`, the time it has run.
fn scan_line(scan: &ScanReport, secs: f64) -> String {
    let fixed = if scan.func == "scrub" { "repaired" } else { "resilvered" };
    let found = format!(
        "{} {fixed}, {} errors, {} blocks unrecoverable",
        human(scan.repaired_bytes),
        scan.errors,
        scan.unrecoverable
    );
    let func = &scan.func;
    match scan.phase.as_str() {
        "scanning" => {
            let done = scan.progress;
            let rate = if secs > 0.0 { scan.issued_bytes as f64 / secs } else { 0.0 };
            let left = if done > 0.0 && !scan.paused {
                format!(", {} to go", clock(secs * (1.0 - done) / done))
            } else {
                String::new()
            };
            format!(
                "{func} {} for {}: {:.1}% done, {} issued at {}/s, {found}{left}",
                if scan.paused { "paused" } else { "in progress" },
                clock(secs),
                done * 100.0,
                human(scan.issued_bytes),
                human(rate as u64),
            )
        }
        "finished" => {
            format!("{func} took {}: {} checked, {found}", clock(secs), human(scan.issued_bytes))
        }
        _ => format!(
            "{func} canceled after {}: {} checked, {found}{}",
            clock(secs),
            human(scan.issued_bytes),
            scan.failure.as_ref().map(|f| format!(" ({f})")).unwrap_or_default()
        ),
    }
}

/// H:MM:SS.t (tenths of a second: a resilver of what a short offline missed takes a second or
/// two).
fn clock(secs: f64) -> String {
    let tenths = (secs.max(0.0) * 10.0).round() as u64;
    let whole = tenths / 10;
    format!("{}:{:02}:{:02}.{}", whole / 3600, whole / 60 % 60, whole % 60, tenths % 10)
}

fn vol_list(out: &mut Lines, list: &VolList, format: Format) {
    let row = |cells: [&str; 13]| {
        if format == Format::Scripted {
            cells.join("\t")
        } else {
            let [name, size, used, avail, refer, reserv, block, compress, ratio, dedup, sync, logbias, keystatus] =
                cells;
            format!(
                "{name:<24} {size:>8} {used:>8} {avail:>8} {refer:>8} {reserv:>8} {block:>6} \
                 {compress:>8} {ratio:>6} {dedup:>7} {sync:>9} {logbias:>10} {keystatus:>11}"
            )
        }
    };
    if format == Format::Text {
        out.say(row([
            "NAME",
            "SIZE",
            "USED",
            "AVAIL",
            "REFER",
            "RESERV",
            "BLOCK",
            "COMPRESS",
            "RATIO",
            "DEDUP",
            "SYNC",
            "LOGBIAS",
            "KEYSTATUS",
        ]));
    }
    let bytes = |b: u64| if format == Format::Scripted { b.to_string() } else { human(b) };
    for entry in &list.entries {
        match (entry, format) {
            (VolEntry::Volume(volume), Format::Json) => out.json(volume),
            (VolEntry::Interrupted(receive), Format::Json) => out.json(receive),
            (VolEntry::Volume(v), _) => {
                let reserv = match v.reservation_bytes {
                    0 => "none".to_owned(),
                    b => bytes(b),
                };
                out.say(row([
                    &v.name,
                    &bytes(v.size_bytes),
                    &bytes(v.used_bytes),
                    &bytes(v.available_bytes),
                    &bytes(v.referenced_bytes),
                    &reserv,
                    &bytes(v.block_bytes),
                    &v.compression,
                    &format!("{:.2}x", ratio(v.logical_bytes, v.physical_bytes)),
                    &v.dedup,
                    &v.sync,
                    &v.logbias,
                    &v.keystatus,
                ]))
            }
            // Scripts read it with `vol get POOL/VOL receive_resume_token -H`: a row here
            // would not have the table's columns.
            (VolEntry::Interrupted(_), Format::Scripted) => {}
            (VolEntry::Interrupted(r), Format::Text) => out.say(format!(
                "{full}: interrupted receive, blocks before {} kept; resume: `sluice send -t {} | \
                 sluice recv -s {full}` (drop it: `sluice recv -A {full}`)",
                r.received_blocks,
                r.receive_resume_token,
                full = r.name,
            )),
        }
    }
}

fn vol_props(out: &mut Lines, props: &VolProps, format: Format) {
    let spec = &props.name;
    let value = |value: &PropValue| match value {
        PropValue::Bytes(b) if format == Format::Text => human(*b),
        PropValue::Bytes(b) => b.to_string(),
        PropValue::Text(text) => text.clone(),
    };
    match format {
        Format::Json => {
            let mut object = serde_json::Map::new();
            object.insert("name".into(), spec.as_str().into());
            for property in &props.properties {
                let json = match &property.value {
                    PropValue::Bytes(b) => (*b).into(),
                    // As it always was: words that read as a number are one.
                    PropValue::Text(text) => {
                        text.parse::<u64>().map_or_else(|_| text.as_str().into(), Into::into)
                    }
                };
                object.insert(property.name.clone(), json);
            }
            out.say(serde_json::Value::Object(object).to_string());
        }
        Format::Scripted => {
            for property in &props.properties {
                out.say(format!("{spec}\t{}\t{}", property.name, value(&property.value)));
            }
        }
        Format::Text => {
            out.say(format!("{:<24} {:<18} {}", "NAME", "PROPERTY", "VALUE"));
            for property in &props.properties {
                out.say(format!("{spec:<24} {:<18} {}", property.name, value(&property.value)));
            }
        }
    }
}

fn snapshot_list(out: &mut Lines, list: &SnapshotList, format: Format) {
    // AUTO last, so that scripts reading the columns before it read what they did.
    let row = |cells: [&str; 8]| {
        if format == Format::Scripted {
            cells.join("\t")
        } else {
            let [name, used, refer, written, size, ratio, creation, auto] = cells;
            format!(
                "{name:<36} {used:>8} {refer:>8} {written:>8} {size:>8} {ratio:>6}  {creation:<23}  \
                 {auto}"
            )
        }
    };
    if format == Format::Text {
        out.say(row(["NAME", "USED", "REFER", "WRITTEN", "SIZE", "RATIO", "CREATION", "AUTO"]));
    }
    for s in &list.snapshots {
        if format == Format::Json {
            out.json(s);
            continue;
        }
        let scripted = format == Format::Scripted;
        let bytes = |b: u64| if scripted { b.to_string() } else { human(b) };
        let creation = if scripted { s.creation_secs.to_string() } else { utc(s.creation_secs) };
        out.say(row([
            &s.name,
            &bytes(s.used_bytes),
            &bytes(s.referenced_bytes),
            &bytes(s.written_bytes),
            &bytes(s.size_bytes),
            &format!("{:.2}x", ratio(s.logical_bytes, s.physical_bytes)),
            &creation,
            match (s.automatic, scripted) {
                (true, _) => "yes",
                (false, true) => "no",
                (false, false) => "-",
            },
        ]));
    }
}

/// Logical over stored bytes (ZFS's compressratio); 1.00 when nothing is stored.
pub fn ratio(logical_bytes: u64, physical_bytes: u64) -> f64 {
    if physical_bytes == 0 {
        1.0
    } else {
        logical_bytes as f64 / physical_bytes as f64
    }
}

/// A ratio as `--json` gives it: to hundredths.
pub fn ratio_hundredths(logical_bytes: u64, physical_bytes: u64) -> f64 {
    (ratio(logical_bytes, physical_bytes) * 100.0).round() / 100.0
}

/// Bytes as a person reads them: 512B, 4.0K, 1.5G.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`: humantime's RFC 3339 form
/// (`2026-11-28T09:30:00Z`) in the words `snapshot list` has always printed.
pub fn utc(secs: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let rfc3339 = humantime::format_rfc3339_seconds(time).to_string();
    format!("{} UTC", rfc3339.trim_end_matches('Z').replacen('T', " ", 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(name: &str, logical_bytes: u64, physical_bytes: u64) -> VolEntry {
        VolEntry::Volume(VolRow {
            name: name.to_owned(),
            size_bytes: 16 << 20,
            used_bytes: 8_552_448,
            available_bytes: 51_421_184,
            referenced_bytes: 0,
            reservation_bytes: 0,
            logical_bytes,
            physical_bytes,
            block_bytes: 16384,
            compression: "lz4".into(),
            compress_ratio: ratio_hundredths(logical_bytes, physical_bytes),
            dedup: "off".into(),
            sync: "standard".into(),
            logbias: "latency".into(),
            keystatus: "-".into(),
        })
    }

    /// One typed list, three forms: a table with its header, tab-separated bytes, and JSON
    /// rows with the field names scripts read, keys sorted.
    #[test]
    fn a_volume_list_renders_as_text_scripted_and_json() {
        let interrupted = VolEntry::Interrupted(InterruptedReceive {
            name: "tank/copy".into(),
            receive_resume_token: "T0K".into(),
            received_blocks: 7,
        });
        let list =
            Reply::VolList(VolList { entries: vec![volume("tank/vm1", 300, 100), interrupted] });
        let text = render(&list, Format::Text);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("NAME") && lines[0].ends_with("LOGBIAS   KEYSTATUS"),
            "{text}"
        );
        assert!(lines[1].starts_with("tank/vm1") && lines[1].contains(" 16.0M "), "{text}");
        assert!(lines[1].contains(" 3.00x "), "{text}");
        assert!(lines[2].starts_with("tank/copy: interrupted receive, blocks before 7"), "{text}");
        let scripted = render(&list, Format::Scripted);
        assert_eq!(
            scripted,
            "tank/vm1\t16777216\t8552448\t51421184\t0\tnone\t16384\tlz4\t3.00x\toff\tstandard\t\
             latency\t-\n",
            "an interrupted receive has no row for scripts"
        );
        let json = render(&list, Format::Json);
        let rows: Vec<serde_json::Value> =
            json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["size_bytes"], 16 << 20);
        assert_eq!(rows[0]["compress_ratio"], 3.0);
        assert_eq!(rows[1]["receive_resume_token"], "T0K");
        assert_eq!(rows[1]["received_blocks"], 7);
        assert!(json.starts_with("{\"available_bytes\":51421184,\"block_bytes\""), "{json}");
    }

    /// Rows of several pools make one table: one header.
    #[test]
    fn lists_of_several_pools_merge() {
        let one = |name: &str| {
            Reply::PoolList(PoolList {
                pools: vec![PoolRow {
                    name: name.into(),
                    size_bytes: 1 << 30,
                    allocated_bytes: 1 << 20,
                    free_bytes: (1 << 30) - (1 << 20),
                    health: "ONLINE".into(),
                }],
            })
        };
        let replies = vec![Reply::PoolList(PoolList::default()), one("tank"), one("two")];
        let text = render_all(replies.clone(), Format::Text);
        assert_eq!(text.matches("NAME").count(), 1, "{text}");
        assert!(
            text.contains("\ntank                     1.0G    1.0M 1023.0M  ONLINE\n"),
            "{text}"
        );
        let json = render_all(replies, Format::Json);
        assert_eq!(json.lines().count(), 2);
        assert!(json.starts_with(
            "{\"allocated_bytes\":1048576,\"free_bytes\":1072693248,\"health\":\"ONLINE\",\
             \"name\":\"tank\",\"size_bytes\":1073741824}"
        ));
    }

    /// Sizes are human in the text and bytes for scripts; JSON makes them numbers.
    #[test]
    fn properties_render_by_kind() {
        let props = Reply::VolProps(VolProps {
            name: "tank/vm1".into(),
            properties: vec![
                VolProp { name: "volsize".into(), value: PropValue::Bytes(8 << 20) },
                VolProp { name: "refreservation".into(), value: PropValue::Text("none".into()) },
            ],
        });
        let text = render(&props, Format::Text);
        assert!(text.lines().nth(1).unwrap().ends_with("volsize            8.0M"), "{text}");
        assert_eq!(
            render(&props, Format::Scripted),
            "tank/vm1\tvolsize\t8388608\ntank/vm1\trefreservation\tnone\n"
        );
        assert_eq!(
            render(&props, Format::Json),
            "{\"name\":\"tank/vm1\",\"refreservation\":\"none\",\"volsize\":8388608}\n"
        );
    }

    /// A reply survives the control socket's serde form whole.
    #[test]
    fn replies_round_trip() {
        let reply = Reply::VolList(VolList { entries: vec![volume("tank/a", 0, 0)] });
        let back: Reply = serde_json::from_str(&serde_json::to_string(&reply).unwrap()).unwrap();
        assert_eq!(back, reply);
        let done = Reply::done("took snapshot tank/a@x in txg 9");
        assert_eq!(render(&done, Format::Json), "took snapshot tank/a@x in txg 9\n");
    }

    #[test]
    fn sizes_times_and_progress_read_as_people_write_them() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(4096), "4.0K");
        assert_eq!(human(3 << 29), "1.5G");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06:40 UTC");
        assert_eq!(clock(3725.25), "1:02:05.3");
        let mut progress = Progress {
            pool: "tank".into(),
            func: "scrub".into(),
            fraction: 0.0,
            examined_bytes: 0,
            total_bytes: 0,
            issued_bytes: 0,
            errors: 0,
            seconds: 0,
        };
        assert_eq!(render_progress(&progress), "scrub of tank: starting");
        progress.fraction = 0.25;
        progress.examined_bytes = 1 << 20;
        progress.total_bytes = 4 << 20;
        progress.issued_bytes = 1 << 19;
        progress.seconds = 3;
        assert_eq!(
            render_progress(&progress),
            "scrub of tank: 25.0% done, 1.0M of 4.0M examined, 512.0K issued, 0 errors, 0:00:03.0 \
             elapsed"
        );
    }
}
