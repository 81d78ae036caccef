//! The command line's grammar: every subcommand and what it takes, as clap parses it and
//! `--help` shows it. The same values are the control protocol's requests (crate::control):
//! a command about a served pool crosses the control socket in their serde form, so a field
//! renamed here is a protocol change; property values whose types have no serde form cross
//! by their names ([`by_name`]). What each command does is main.rs's dispatch and the modules
//! it calls.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::{exit, pools};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A user-space, ZFS-style storage system for fast, durable synchronous writes",
    after_help = exit::HELP
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What the command line asks for. A command about a served pool crosses the control socket
/// as this value (crate::control), so its serde form is the request of the control protocol;
/// the commands that never do are skipped there.
#[derive(Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Command {
    /// Serve volumes over NBD. With no POOL, uses (or creates) a 2-way mirror pool on two
    /// thin files in --dir (about 2 GiB on disk at the start: each file's intent-log region
    /// is written ahead; --thick allocates them in full) with a volume vol0, and listens on
    /// DIR/nbd.sock and 127.0.0.1:10809.
    /// Stops cleanly on SIGINT/SIGTERM: requests in flight finish, the pool is synced and
    /// exported.
    #[serde(skip)]
    Serve {
        /// A pool known to `sluice pool` (created or imported) to serve instead of --dir's.
        pool: Option<String>,
        /// Where the default pool's files and the Unix socket live.
        #[arg(long, default_value = "sluice-data")]
        dir: PathBuf,
        /// Unix socket path (default: DIR/nbd.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// TCP address to listen on, or `none`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Serve one client on stdin/stdout (for libnbd's nbd_connect_command).
        #[arg(long)]
        stdio: bool,
        /// Size of each of the default pool's two files, when it is created.
        #[arg(long, value_parser = pools::parse_size, default_value = "16G")]
        leaf_size: u64,
        /// Allocate the default pool's files in full when it is created, so the filesystem
        /// holding them cannot run out under the pool (thin files take space as the pool
        /// writes, and a full filesystem suspends the pool until space is freed).
        #[arg(long, conflicts_with = "sparse")]
        thick: bool,
        /// Thin files (the default; kept for scripts that say so).
        #[arg(long, hide = true)]
        sparse: bool,
        /// Size of vol0, when the default pool is created.
        #[arg(long, value_parser = pools::parse_size, default_value = "8G")]
        volume_size: u64,
        /// Tunables, as name=value (repeatable); `sluice tunables` lists them.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        settings: Vec<String>,
        /// Also answer HTTP `GET /metrics` on this address (for example 127.0.0.1:9127) with
        /// the pool's counters and latency histograms in the Prometheus/OpenMetrics text
        /// format. Unauthenticated: anyone who can reach the address reads the pool's layout,
        /// device paths and volume names, so prefer loopback or a private network.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Serving cores: event loops, each on its own thread with its own io_uring; every
        /// connection lives on one of them, and each but core 0 (the txg syncs'; core 0 too
        /// when it is the only one) watches its sockets and ring for up to `--set
        /// cores.idle_poll_us` before it sleeps, unless its recent requests are large (a
        /// quarter MiB on average). 0 means one per CPU the process may run on.
        #[arg(long, default_value_t = 0)]
        cores: usize,
        #[command(flatten)]
        tls: TlsArgs,
        /// Run the programs in DIR for each of the pool's events (ZED's zedlets): those named
        /// for the event's subclass (`statechange-notify.sh`, `scrub_finish-mail`) or `all-*`,
        /// owned by root and writable by no one else, with the event in `ZEVENT_*` variables;
        /// 8 at once at most, each killed after 60 s; their output goes to the server's log.
        /// `sluice pool events` lists the events. Examples: contrib/hooks.
        #[arg(long, value_name = "DIR")]
        event_hook: Option<PathBuf>,
    },
    /// Create, import, inspect and check pools.
    Pool {
        #[command(subcommand)]
        pool: PoolCommand,
    },
    /// Create, list, resize and destroy volumes.
    Vol {
        #[command(subcommand)]
        vol: VolCommand,
    },
    /// Take, list and destroy snapshots of volumes. A snapshot is served read-only as export
    /// VOL@NAME.
    Snapshot {
        #[command(subcommand)]
        snapshot: SnapshotCommand,
    },
    /// Write snapshot POOL/VOL@SNAP as a stream to standard output (zfs send): whole, or with
    /// -i only what changed since an older snapshot of the volume, so `sluice send -i @mon
    /// tank/db@tue | ssh host sluice recv backup/db` replicates. Every record is checksummed;
    /// holes go as holes, compressed blocks compressed. With -t, the rest of the stream an
    /// interrupted `recv -s` needs. Works on a served pool too (through its control socket).
    Send {
        /// The snapshot, POOL/VOL@SNAP.
        #[arg(required_unless_present = "token", conflicts_with = "token")]
        spec: Option<String>,
        /// The older snapshot (`@NAME`, `NAME` or `POOL/VOL@NAME`).
        #[arg(short = 'i', value_name = "OLDER", conflicts_with = "token")]
        from: Option<String>,
        /// Resume an interrupted receive: the token `sluice vol list` shows for it on the
        /// receiving pool (zfs send -t).
        #[arg(short = 't', value_name = "TOKEN")]
        token: Option<String>,
        /// Raw (zfs send -w): an encrypted volume as it is stored, its blocks encrypted and
        /// its key wrapped, so the receiving pool needs no key and its disks and the stream
        /// show no data; `key load` there with the volume's key reads it. Needs no key here.
        /// (Without -w an encrypted volume is refused; a volume that is not encrypted is
        /// sent as usual.)
        #[arg(short = 'w', long = "raw", conflicts_with = "token")]
        #[serde(default)]
        raw: bool,
    },
    /// Read a stream from standard input into POOL/VOL (zfs receive): a full stream makes the
    /// volume, an incremental one adds its snapshot to the volume holding the older one. The
    /// stream lands in a hidden volume and takes the target's place only once every record has
    /// checked; a damaged or cut stream is refused, naming the record, and nothing of it stays
    /// (with -s, what arrived stays hidden and `vol list` shows the token that resumes it).
    /// A raw stream (`send -w`) is stored as it came, encrypted, and needs no key here.
    /// Works on a served pool too (through its control socket).
    Recv {
        spec: String,
        /// Keep what arrived if the stream stops part way, so `sluice send -t TOKEN` can
        /// resume it (zfs receive -s).
        #[arg(short = 's')]
        resumable: bool,
        /// Drop what an interrupted `recv -s` into POOL/VOL kept (zfs receive -A); reads no
        /// stream.
        #[arg(short = 'A', conflicts_with = "resumable")]
        abort: bool,
        #[command(flatten)]
        #[serde(default)]
        encrypt: pools::key::EncryptArgs,
    },
    /// Load, unload or change the key of an encrypted volume (zfs load-key, unload-key,
    /// change-key). The key is read here, from the terminal or the key file, and handed to the
    /// pool: through the control socket of a served pool, which then serves the volume.
    Key {
        #[command(subcommand)]
        key: KeyCommand,
    },
    /// Make a writable volume from a snapshot: `sluice clone tank/template@golden tank/vm7`.
    /// It shares every block with the snapshot until it writes its own (thin, instant
    /// whatever the size); the snapshot cannot be destroyed while it has clones.
    Clone { snapshot: String, volume: String },
    /// List every tunable with its default, range and meaning; with NAME=VALUE arguments,
    /// validate those settings together and print the resulting values.
    #[serde(skip)]
    Tunables {
        /// Settings to check, as name=value (for example vdev.max_active=32).
        settings: Vec<String>,
    },
    /// Moved: the benchmarks are the `sluice-bench` binary (kept so that the old spelling
    /// says where they went).
    #[command(hide = true)]
    #[serde(skip)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The new leaf of `pool attach`.
#[derive(clap::Args, Serialize, Deserialize)]
pub(crate) struct NewLeafArgs {
    /// The new leaf's absolute path.
    #[arg(value_parser = pools::parse_leaf_path)]
    new: String,
    #[command(flatten)]
    options: NewLeafOptions,
}

/// How `pool attach` and `pool replace` make and take the new leaf.
#[derive(clap::Args, Serialize, Deserialize)]
pub(crate) struct NewLeafOptions {
    /// Size of the file to create if it is missing (default: the existing leaf's size).
    #[arg(long, value_parser = pools::parse_size)]
    size: Option<u64>,
    /// Create a missing file sparse (thin) instead of allocated in full.
    #[arg(long)]
    sparse: bool,
    /// Overwrite a leaf that holds data, a filesystem or another pool.
    #[arg(short, long)]
    force: bool,
    /// Wait until the resilver ends, printing its progress on standard error (zpool attach
    /// -w); on a pool that is not being served the command always does.
    #[arg(short, long)]
    wait: bool,
}

impl NewLeafOptions {
    /// The new leaf at `path` (empty: the device now at the old leaf's path).
    pub(crate) fn leaf(self, path: String) -> pools::pool::NewLeaf {
        let NewLeafOptions { size, sparse, force, wait } = self;
        pools::pool::NewLeaf { path, size, sparse, force, wait }
    }
}

impl From<NewLeafArgs> for pools::pool::NewLeaf {
    fn from(a: NewLeafArgs) -> pools::pool::NewLeaf {
        a.options.leaf(a.new)
    }
}

#[derive(Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PoolCommand {
    /// Create a pool: `sluice pool create tank mirror /d/a /d/b [mirror /d/c /d/d] [log
    /// mirror /d/e /d/f]`, or `raidz2 /d/a /d/b /d/c /d/d` (raidz or raidz1, raidz2, raidz3:
    /// one to three disks' worth of parity, at least parity + 2 leaves, at most 64); plain
    /// paths are striped, and what follows `log` holds only intent-log blocks (a separate log
    /// device: put it on the fastest medium); what follows `spare` are hot spares, which the
    /// served pool puts in for a leaf that faults or degrades. Missing files are created with
    /// --size, allocated in full (--sparse: thin). A leaf that already holds something
    /// (another pool's labels, a filesystem, a partition table, any data in its first or last
    /// MiB) is refused, saying what was found, unless --force is given.
    Create {
        name: String,
        /// Leaves: absolute paths, each group of mirrored ones preceded by `mirror`, each
        /// RAID-Z group by `raidz`, `raidz2` or `raidz3`; log devices after `log`; hot spares
        /// after `spare`. ZFS's other vdev types (draid, cache, special, dedup) are refused by
        /// name: sluice does not build them yet.
        #[arg(required = true, value_parser = pools::parse_vdev_word)]
        vdevs: Vec<String>,
        /// Create missing files of this size (like 1G).
        #[arg(long, value_parser = pools::parse_size)]
        size: Option<u64>,
        /// Create missing files sparse (thin) instead of allocated in full.
        #[arg(long)]
        sparse: bool,
        /// log2 of the smallest allocation.
        #[arg(long, default_value_t = 12)]
        ashift: u8,
        /// Overwrite leaves that hold data, a filesystem, a partition table or another pool
        /// (exported, destroyed or imported here); what they hold is lost.
        #[arg(short, long)]
        force: bool,
        /// Make the pool without the optional format features (zpool create -d), so that
        /// older sluice builds import it: indirect blocks stored plain (no lz4_indirect;
        /// `pool upgrade` enables it later), and its RAID-Z vdevs' log blocks striped for
        /// their life (no raidz_log_copies; a RAID-Z vdev added later writes them as copies
        /// and lists that feature).
        #[arg(short = 'd', long)]
        no_features: bool,
    },
    /// Add vdevs to a pool while it serves (zpool add), in `pool create`'s words: `sluice
    /// pool add tank mirror /d/c /d/d`, `raidz2 /d/e …`, a lone leaf, `log /d/l` (a separate
    /// log device), `spare /d/s` (hot spares, which the served pool puts in for a leaf that
    /// faults or degrades, and sends back once it is replaced or cleared). New writes spread
    /// over every data vdev; blocks already written stay where they are. A device that holds
    /// something is refused unless --force; missing files are created with --size.
    Add {
        name: String,
        /// Leaves, as `pool create` takes them (`mirror`, `raidz…`, `log`, `spare`).
        #[arg(required = true, value_parser = pools::parse_vdev_word)]
        vdevs: Vec<String>,
        /// Create missing files of this size (like 1G).
        #[arg(long, value_parser = pools::parse_size)]
        size: Option<u64>,
        /// Create missing files sparse (thin).
        #[arg(long)]
        sparse: bool,
        /// Overwrite devices that hold data, a filesystem or another pool.
        #[arg(short, long)]
        force: bool,
    },
    /// Remove an available hot spare or a separate log device from a pool (zpool remove);
    /// their labels are erased.
    ///
    /// A spare in use is refused: replace or clear the leaf it stands in for first, or detach
    /// it. A log device is named by its path (a lone leaf) or as `pool status` names a log
    /// mirror (`mirror-N`); its volumes' intent logs move to the other log devices or the data
    /// vdevs, over a few txg syncs, while the pool serves. Removing a data vdev is not
    /// supported.
    Remove {
        name: String,
        /// The spare's or log leaf's path (or file name, or guid), or `mirror-N`.
        #[arg(value_name = "DEVICE")]
        leaf: String,
    },
    /// Find a pool's leaves by their labels and make it known here.
    ///
    /// Import verifies the blocks the newest txg wrote before it writes anything, and walks
    /// every volume's intent log. A newest txg that does not verify (a disk lost writes it had
    /// acknowledged) is named, and --rewind is the way back; a log block that cannot be read
    /// fails the import, changing nothing, until the device answers or
    /// --discard-unreadable-log is given.
    Import {
        name: String,
        /// Directories to search for leaves.
        #[arg(short = 'd', long = "dir")]
        dirs: Vec<PathBuf>,
        /// Individual leaves.
        #[arg(long = "device")]
        devices: Vec<String>,
        /// When the newest txg does not verify, open the newest earlier txg whose whole tree
        /// does (zpool import -F). The writes after it are lost; the import says how many
        /// seconds of them.
        #[arg(short = 'F', long)]
        rewind: bool,
        /// Say what the import would do (which txg, what a rewind loses, how many log records
        /// replay, which logs would be cut short) and write nothing (zpool import -n).
        #[arg(short = 'n', long)]
        dry_run: bool,
        /// Import even if a volume's intent log cannot be read: replay it up to the unreadable
        /// block and drop that block's records and every later one (zpool import -m). The
        /// import names each volume and block.
        #[arg(long)]
        discard_unreadable_log: bool,
    },
    /// Sync and release a pool so another host or process can import it.
    Export { name: String },
    /// Show layout, health, error counts, space and volumes.
    Status {
        names: Vec<String>,
        /// One JSON object per pool, one per line: state, status and action, scan progress,
        /// every vdev and leaf with its state and error counts, space.
        #[arg(long)]
        json: bool,
    },
    /// One line per pool: name, size, allocated, free, health (zpool list). Without names,
    /// every pool this host knows.
    List {
        names: Vec<String>,
        /// For scripts: no header, fields separated by tabs, sizes in bytes.
        #[arg(short = 'H')]
        scripted: bool,
        /// One JSON object per pool, one per line.
        #[arg(long, conflicts_with = "scripted")]
        json: bool,
    },
    /// Show what a served pool is doing: I/Os, bytes and flushes per second for the pool,
    /// each top-level vdev and each leaf (a mirror's row adds up its leaves); I/Os queued and
    /// in the device now, and the depth the device queue allows; client requests per volume;
    /// intent-log commits and blocks; txg syncs and the size of their device writes; the bytes
    /// written by kind of block (volume data, indirect blocks, the log, ...); what the
    /// write throttle did; where writes into part of a block not in memory had the rest of
    /// the block read (beside the writes or by the txg sync) and how many wait. The first
    /// report covers the time since import, each later one the INTERVAL before it.
    /// `--latency` adds percentiles per leaf and I/O class (queued to done) and per volume
    /// and request type (arrival to answer).
    Iostat {
        name: String,
        /// Seconds between reports; without it, one report.
        interval: Option<f64>,
        /// Reports to print (default: one without INTERVAL, endless with it).
        count: Option<u64>,
        /// Add latency percentiles.
        #[arg(short, long)]
        latency: bool,
        /// Print each report as one line of JSON, with every figure (latency included).
        #[arg(long)]
        json: bool,
    },
    /// Print the systemd drop-in that lets `sluice@NAME.service` (contrib/systemd) open pool
    /// NAME's leaves under its hardening: the leaves' directories and the pool cache made
    /// writable, and the cache file named. With --install it is written to
    /// UNIT_DIR/sluice@NAME.service.d/50-pool.conf. docs/operations.md says how to run a pool
    /// as a service.
    Service {
        name: String,
        /// Write the drop-in instead of printing it.
        #[arg(long)]
        install: bool,
        /// Where unit files live (default /etc/systemd/system).
        #[arg(long, requires = "install")]
        unit_dir: Option<PathBuf>,
    },
    /// The counters `iostat` reads, as JSON (answered by the server).
    #[command(hide = true)]
    Stats { name: String },
    /// What has happened to a served pool (zpool events): each leaf's change of state,
    /// bursts of I/O and checksum errors, scrubs and resilvers starting and ending, leaves
    /// attached and detached, suspension, keys loaded, with the time (UTC), the vdev and
    /// details. The server keeps the newest 1,000 and writes each to its log as it happens.
    Events {
        name: String,
        /// Go on printing each new event as it happens, until interrupted.
        #[arg(short, long, conflicts_with = "clear")]
        follow: bool,
        /// One JSON object per event, one per line.
        #[arg(long)]
        json: bool,
        /// Forget the events kept (numbering goes on).
        #[arg(short, long)]
        clear: bool,
    },
    /// Show pool properties (zpool get): size, allocated, free, capacity, health, guid,
    /// autoreplace, scrub.interval, scrub.last, scrub.next and the format features in use; or
    /// only those named.
    Get {
        name: String,
        properties: Vec<String>,
        /// For scripts: no header, fields separated by tabs, sizes in bytes.
        #[arg(short = 'H')]
        scripted: bool,
        /// One JSON object with the properties.
        #[arg(long, conflicts_with = "scripted")]
        json: bool,
    },
    /// Set a pool property (zpool set): `sluice pool set tank scrub.interval=7d`. A served
    /// pool starts a scrub once scrub.interval (s, m, h, d or w; default 30d; off for never)
    /// has passed since the last one finished (one never scrubbed: since serving began). With
    /// autoreplace=on, a new empty device found at a faulted or missing leaf's path replaces
    /// it.
    /// Setting a property makes the pool need a sluice that knows feature pool_properties.
    Set { name: String, property: String },
    /// Enable the optional format features this build supports on a pool made without them
    /// (zpool upgrade): `sluice pool upgrade tank`, or -a for every pool known here, served
    /// or not. Without a pool or -a, says what each known pool lacks; -v lists every feature
    /// this build knows. A pool made by an older build, or by `pool create -d`, works without
    /// them; once one is enabled, builds that do not know it refuse the pool by its name.
    /// Blocks already written keep their form: a feature applies to what is written from
    /// then on.
    Upgrade {
        names: Vec<String>,
        /// Every pool known here.
        #[arg(short, long, conflicts_with = "names")]
        all: bool,
        /// List the features this build knows, what each is, and which this command enables.
        #[arg(short, long, conflicts_with_all = ["names", "all"])]
        verbose: bool,
        /// Say what the pool lacks instead of enabling it (the listing without names; set by
        /// the command line, never given).
        #[arg(skip)]
        #[serde(default)]
        list_only: bool,
    },
    /// Write the open txg out now and wait until it is durable (zpool sync): space figures,
    /// snapshot USED and the like then count every write made so far.
    Sync { name: String },
    /// Read every copy of every block and rewrite bad copies from good ones, in the
    /// background while the pool serves (zpool scrub); `pool status` shows the progress. On a
    /// pool that is not being served, the scrub runs to its end before the command returns.
    /// Running `scrub` on a paused scrub resumes it.
    Scrub {
        name: String,
        /// Pause the running scrub (resume it with `pool scrub` again).
        #[arg(short = 'p', long, conflicts_with_all = ["stop", "wait"])]
        pause: bool,
        /// Stop the scrub, running or paused.
        #[arg(short = 's', long, conflicts_with = "wait")]
        stop: bool,
        /// Wait until the scrub ends, printing its progress on standard error every second,
        /// and report what it found (exit 1 if a block has no good copy).
        #[arg(short = 'w', long)]
        wait: bool,
    },
    /// Take a leaf out of service: no I/O reaches it until `pool online`, and the rest of its
    /// vdev serves without it (zpool offline). Refused when the rest of its vdev does not hold
    /// everything (no other complete leaf of a mirror; more than parity columns on RAID-Z). The leaf is named by its path, the last part of
    /// its path, or its guid.
    Offline {
        name: String,
        leaf: String,
        /// Until `pool online` or the next import, and only on a served pool; without it the
        /// leaf stays offline across exports and imports until `pool online`.
        #[arg(short = 't', long)]
        temporary: bool,
    },
    /// Return a leaf to service; what it missed is resilvered in the background (zpool
    /// online).
    Online { name: String, leaf: String },
    /// Clear the error counts of one leaf or all, and return faulted leaves to service; what
    /// they missed is resilvered in the background (zpool clear).
    Clear { name: String, leaf: Option<String> },
    /// Add NEW beside leaf EXISTING: a lone leaf becomes a mirror, a mirror gets wider; NEW is
    /// resilvered in the background (zpool attach; with -w the command waits for it). On a
    /// pool that is not being served, the resilver runs to its end before the command returns,
    /// printing its progress on standard error. A missing NEW file is created at
    /// EXISTING's size (--size to choose), allocated in full unless --sparse. NEW must be at
    /// least as large as the vdev's data area; one that holds something is refused unless
    /// --force. Refused for a RAID-Z leaf (that would be RAID-Z expansion): use `replace`.
    Attach {
        name: String,
        existing: String,
        #[command(flatten)]
        new: NewLeafArgs,
    },
    /// Make a served pool's leaf fail reads, writes or everything, or stop (zinject): for
    /// tests and failure drills.
    #[command(hide = true)]
    Inject { name: String, leaf: String, what: String },
    /// Take a leaf out of its mirror for good; its labels are erased (zpool detach). Refused
    /// for a vdev's only leaf, and when no other leaf of the mirror holds everything. On
    /// RAID-Z only a leaf being replaced, or its replacement (cancelling the replace), can be
    /// detached.
    Detach { name: String, leaf: String },
    /// Replace leaf OLD by NEW: NEW is attached beside OLD and resilvered in the background,
    /// then OLD is detached (zpool replace; -w waits for that, as a pool that is not being
    /// served always does, printing the resilver's progress). OLD may be faulted or missing if
    /// the rest of its vdev holds everything (another leaf of its mirror; on RAID-Z, all but at
    /// most parity columns: NEW takes OLD's column); a lone leaf must still read. NEW is made
    /// as for `attach`. Without NEW, the disk swapped in at OLD's path replaces it (OLD is
    /// shown as PATH/old until it leaves); with pool property autoreplace=on the served pool
    /// does that by itself. A leaf a hot spare stands in for is replaced the same way, and the
    /// spare goes back to the available ones once NEW holds everything.
    Replace {
        name: String,
        old: String,
        /// The new leaf's absolute path; left out, the device now at OLD's path (a disk
        /// swapped in place), which must hold nothing unless --force.
        #[arg(value_parser = pools::parse_leaf_path)]
        new: Option<String>,
        #[command(flatten)]
        options: NewLeafOptions,
    },
    /// Erase the pool's labels: its leaves are no longer a pool.
    Destroy { name: String },
}

#[derive(Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum VolCommand {
    /// Create a volume: `sluice vol create tank/vm1 --size 20G [--sparse] [--block-size 16K]
    /// [--dedup on] [--sync standard] [--logbias latency] [--compression lz4]`.
    Create {
        spec: String,
        #[arg(long, value_parser = pools::parse_size)]
        size: u64,
        #[arg(long, value_parser = pools::parse_size)]
        block_size: Option<u64>,
        /// off (default), on (blocks with equal contents are stored once, through the pool's
        /// dedup table) or verify (as on, comparing the bytes before sharing).
        #[serde(with = "by_name")]
        #[arg(long, value_parser = pools::vol::parse_dedup, default_value = "off")]
        dedup: sluice_format::DedupMode,
        /// standard (default: flushes and FUA writes are durable when answered), always (every
        /// write is, as if it carried FUA) or disabled (flushes are answered at once; writes
        /// are durable with the next txg sync, within txg.timeout_ms; a crash loses them).
        #[serde(with = "by_name")]
        #[arg(long, value_parser = pools::vol::parse_sync, default_value = "standard")]
        sync: sluice_format::SyncMode,
        /// latency (default: writes from intent_log.immediate_write_bytes up are written in
        /// place and logged by pointer, smaller ones copied into the log) or throughput (every
        /// block a write touches, whole or in part, is written in place and logged by pointer:
        /// each block written once, a partial one read first if not cached).
        #[serde(with = "by_name")]
        #[arg(long, value_parser = pools::vol::parse_logbias, default_value = "latency")]
        logbias: sluice_format::LogBias,
        /// lz4 (default, as in OpenZFS), zstd (level 3), zstd-1 to zstd-19, or off. A block is
        /// stored compressed when that saves at least an eighth of its space.
        #[serde(with = "by_name")]
        #[arg(long, value_parser = pools::vol::parse_compression, default_value = "lz4")]
        compression: sluice_format::Compression,
        /// Thin: take space only as blocks are written (writes may fail when the pool fills).
        /// Without it the volume is thick, as `zfs create -V` makes it: its whole size (and
        /// the indirect blocks above it) is set aside now, and refused if the pool cannot.
        #[arg(long, short = 's')]
        sparse: bool,
        /// Encrypt the volume: on (aes-256-gcm), aes-256-gcm or off (default). It gets a
        /// random master key of its own, wrapped by the key given here; its snapshots and
        /// clones share it. Needs --keyformat.
        #[arg(long, value_parser = pools::key::check_encryption, default_value = "off")]
        encryption: String,
        /// raw (32 bytes), hex (64 hex digits) or passphrase (8 to 512 bytes, stretched with
        /// Argon2id).
        #[arg(long, value_parser = pools::key::check_keyformat)]
        keyformat: Option<String>,
        /// Where the key is read from now and at each `key load`: prompt (default: the
        /// terminal, or standard input when it is not one) or file:///ABSOLUTE/PATH, which
        /// `sluice serve` also reads to load the key when it starts.
        #[arg(long, value_parser = pools::key::check_keylocation)]
        keylocation: Option<String>,
        /// The key, read by the command before it is sent (never on the command line).
        #[arg(skip)]
        #[serde(default)]
        key: Option<pools::key::KeyMaterial>,
    },
    /// Set a volume property: `sluice vol set tank/vm1 sync=always`. dedup=off|on|verify
    /// and compression=off|lz4|zstd|zstd-N apply to blocks written from now on;
    /// sync=standard|always|disabled and logbias=latency|throughput to requests from now on;
    /// snapshot.schedule=hourly:24,daily:30,weekly:8 (periods minutely, hourly, daily, weekly,
    /// monthly; none to stop) has the served pool take `auto-YYYY-MM-DDTHHMM` snapshots (UTC)
    /// and prune them as the rules keep.
    Set { spec: String, property: String },
    /// List volumes of the given pools (default: all known pools).
    List {
        pools: Vec<String>,
        /// For scripts: no header, fields separated by tabs, sizes in bytes.
        #[arg(short = 'H')]
        scripted: bool,
        /// One JSON object per volume, one per line.
        #[arg(long, conflicts_with = "scripted")]
        json: bool,
    },
    /// Destroy a volume and free its space. A volume with snapshots is refused unless -r; an
    /// encrypted one whose intent log holds writes waiting for its key, unless -f.
    Destroy {
        spec: String,
        /// Destroy its snapshots too.
        #[arg(short = 'r')]
        recursive: bool,
        /// Discard the acknowledged writes an encrypted volume's log holds until its key is
        /// loaded (they are lost).
        #[arg(short = 'f')]
        #[serde(default)]
        force: bool,
    },
    /// Return a volume to a snapshot: `sluice vol rollback tank/vm1@before-upgrade`. Its
    /// contents, size and space become the snapshot's; writes since are lost. Clients keep
    /// their connections and read the old contents (stop them writing first).
    Rollback {
        spec: String,
        /// Roll back past later snapshots, destroying them (refused without).
        #[arg(short = 'r')]
        recursive: bool,
    },
    /// Make a clone independent of its origin (zfs promote): the origin snapshot and the
    /// snapshots before it move to the clone, and the volume they came from becomes a clone
    /// of it, which can then be destroyed.
    Promote { spec: String },
    /// Rename a volume within its pool: `sluice vol rename tank/vm1 tank/web` (or just `web`).
    /// Clients connected to it keep it; new ones use the new export name.
    Rename { spec: String, to: String },
    /// Show a volume's properties and space, one per line (zfs get): all, or the ones named.
    Get {
        spec: String,
        properties: Vec<String>,
        /// For scripts: no header, fields separated by tabs, sizes in bytes.
        #[arg(short = 'H')]
        scripted: bool,
        /// One JSON object with every property.
        #[arg(long, conflicts_with = "scripted")]
        json: bool,
    },
    /// Grow or shrink a volume; shrinking discards the data past the new end.
    Resize {
        spec: String,
        #[arg(long, value_parser = pools::parse_size)]
        size: u64,
    },
}

#[derive(Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum KeyCommand {
    /// Load POOL/VOL's key (zfs load-key): read from its keylocation, or from -L's. A wrong
    /// key is refused and changes nothing. On a served pool the volume, its snapshots and
    /// clones are served from then on, after the intent-log records they held are replayed.
    Load {
        spec: String,
        /// Read the key from here this once: prompt or file:///ABSOLUTE/PATH.
        #[arg(short = 'L', value_name = "LOCATION", value_parser = pools::key::check_keylocation)]
        location: Option<String>,
        #[arg(skip)]
        #[serde(default)]
        key: Option<pools::key::KeyMaterial>,
    },
    /// Unload POOL/VOL's key (zfs unload-key): what its volumes hold dirty is synced first,
    /// then nothing of them can be read or written until `key load`. Refused while clients
    /// are connected to them.
    Unload {
        spec: String,
        /// Unload even with clients connected: their requests in flight finish, and each
        /// connection is closed (at its next request, or within a second if idle).
        #[arg(short = 'f')]
        force: bool,
    },
    /// Change POOL/VOL's key (zfs change-key): its master key is wrapped again under the new
    /// key, read as --keyformat and --keylocation say (each kept as it was when not given).
    /// Its key must be loaded; no data is rewritten. A clone shares its origin's key: change
    /// that one's.
    Change {
        spec: String,
        #[arg(long, value_parser = pools::key::check_keyformat)]
        keyformat: Option<String>,
        #[arg(long, value_parser = pools::key::check_keylocation)]
        keylocation: Option<String>,
        #[arg(skip)]
        #[serde(default)]
        key: Option<pools::key::KeyMaterial>,
    },
}

#[derive(Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum SnapshotCommand {
    /// Take snapshots: `sluice snapshot create tank/db@nightly tank/logs@nightly`. All named
    /// volumes (of one pool) are taken in one txg, so together they are consistent, as a
    /// database spread over volumes needs. It takes the same time whatever a volume's size.
    Create {
        #[arg(required = true)]
        specs: Vec<String>,
    },
    /// List snapshots of the given pools or volumes (default: all known pools), oldest first:
    /// USED is what destroying it alone would free, REFER what it references, WRITTEN what it
    /// references that the snapshot before it did not.
    List {
        targets: Vec<String>,
        /// For scripts: no header, fields separated by tabs, sizes in bytes, times in seconds
        /// since the epoch.
        #[arg(short = 'H')]
        scripted: bool,
        /// One JSON object per snapshot, one per line.
        #[arg(long, conflicts_with = "scripted")]
        json: bool,
    },
    /// Destroy a snapshot, freeing the blocks no other snapshot and not the volume hold.
    Destroy { spec: String },
}

/// `--tls`: whether NBD clients may, must or cannot use TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsChoice {
    /// No TLS: STARTTLS is refused, every client talks in plain text.
    Off,
    /// TLS for clients that ask (STARTTLS); plain-text clients are served too.
    On,
    /// TLS or nothing: every option but STARTTLS is refused until TLS is up.
    Require,
}

/// The TLS flags of `sluice serve` (docs/tls.md).
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "TLS (docs/tls.md)")]
pub struct TlsArgs {
    /// TLS for NBD clients (STARTTLS), on every listener including the Unix socket. Default:
    /// off, but a TCP listener on an address other than loopback needs --tls given
    /// explicitly. `on` and `require` need --tls-certificates and/or --tls-psk.
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsChoice>,
    /// x509 credentials: DIR/server-cert.pem (the server's certificate, intermediates after
    /// it), DIR/server-key.pem (its unencrypted key), and optionally DIR/ca-cert.pem (client
    /// certificates are asked for, and checked against it, only when it exists) and
    /// DIR/ca-crl.pem (revoked client certificates): the layout of qemu's tls-creds-x509 dir
    /// and nbdkit's --tls-certificates.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Refuse x509 clients without a certificate signed by DIR/ca-cert.pem (PSK clients are
    /// proven by their key and need none).
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Pre-shared keys: one IDENTITY:HEXKEY per line, as `psktool -u IDENTITY -p FILE` writes
    /// them (the keys.psk of qemu's tls-creds-psk, nbdkit's --tls-psk). With
    /// --tls-certificates too, clients may use either.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Open volume EXPORT (and its snapshots) only to clients whose PSK identity or verified
    /// certificate common name is listed (`psk:NAME` or `cert:NAME` says which kind; a bare
    /// NAME matches either); others are refused it (NBD_REP_ERR_POLICY) and do not see it in
    /// LIST. Repeatable; volumes without an entry stay open to every TLS client. Needs --tls
    /// require.
    #[arg(long, value_name = "EXPORT=[psk:|cert:]NAME[,...]")]
    pub tls_allow: Vec<String>,
}

/// serde for the property values of `vol create` (types of the format crate, which has no
/// serde), by the names `vol set` takes.
pub(crate) mod by_name {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use sluice_format::{Compression, DedupMode, LogBias, SyncMode};

    use crate::pools::vol;

    /// A value with a name of its own.
    pub trait Named: Sized {
        fn to_name(&self) -> String;
        fn from_name(name: &str) -> Result<Self, String>;
    }

    impl Named for DedupMode {
        fn to_name(&self) -> String {
            self.name().to_owned()
        }
        fn from_name(name: &str) -> Result<Self, String> {
            vol::parse_dedup(name)
        }
    }

    impl Named for SyncMode {
        fn to_name(&self) -> String {
            self.name().to_owned()
        }
        fn from_name(name: &str) -> Result<Self, String> {
            vol::parse_sync(name)
        }
    }

    impl Named for LogBias {
        fn to_name(&self) -> String {
            self.name().to_owned()
        }
        fn from_name(name: &str) -> Result<Self, String> {
            vol::parse_logbias(name)
        }
    }

    impl Named for Compression {
        fn to_name(&self) -> String {
            self.name()
        }
        fn from_name(name: &str) -> Result<Self, String> {
            vol::parse_compression(name)
        }
    }

    pub fn serialize<T: Named, S: Serializer>(value: &T, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(&value.to_name())
    }

    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(from: D) -> Result<T, D::Error> {
        T::from_name(&String::deserialize(from)?).map_err(D::Error::custom)
    }
}
