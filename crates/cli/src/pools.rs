//! `sluice pool` and `sluice vol`: pools on files and block devices, in the shape zpool users
//! know.
//!
//! Each command opens the pool it names, does its work, syncs and exports, so no state lingers
//! between commands but the pools themselves. Which devices belong to which pool is remembered
//! in a cache file (`$SLUICE_CACHE_FILE`, default `~/.local/state/sluice/pools`): one line per
//! pool, its name then its leaf paths, tab-separated. `pool import -d DIR` finds a pool by
//! reading the labels of every file and block device in DIR, so a lost cache costs nothing.
//! Every leaf is opened with an exclusive lock: a second process is refused, and told who holds
//! the pool. `pool create` first looks at what each leaf holds (`sluice_engine::pool::probe`)
//! and, like `zpool create`, overwrites another pool, a filesystem or data only with --force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use sluice_engine::device::inject::{InjectHandle, Injected, Injection};
use sluice_engine::device::{BlockDevice, DeviceError, FileDevice, FileDeviceOptions};
use sluice_engine::pool::probe::{self, Finding};
use sluice_engine::pool::{LeafSpec, Pool, PoolError, PoolLeaf, PoolSpec, TopSpec};
use sluice_engine::rt::Env;
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::{
    ImportOptions, ImportReport, ReceiveMode, ScanFunc, ScanPhase, ScanStatus, SnapshotSpace,
    Store, VolumeProperty, BLOCK_BYTES_DEFAULT, RECEIVE_PREFIX,
};
use sluice_engine::vdev::LeafState;
use sluice_format::{Compression, DedupMode, LogBias, SyncMode};

/// Where a command's output goes and which pool, if any, is already open in this process
/// (`sluice serve` runs the same commands for its control socket against its live store).
pub struct Ctx<'a> {
    pub env: &'a Env,
    pub live: Option<Arc<Store>>,
    pub out: String,
}

impl Ctx<'_> {
    fn say(&mut self, line: impl AsRef<str>) {
        self.out.push_str(line.as_ref());
        self.out.push('\n');
    }

    /// The pool `name`: the live one, or opened from its leaves.
    async fn hold(&self, name: &str) -> anyhow::Result<Held> {
        match &self.live {
            Some(store) if store.pool().name() == name => Ok(Held::Live(Arc::clone(store))),
            _ => Ok(Held::Local(Arc::new(open_store(self.env, name, &Tunables::default()).await?))),
        }
    }
}

/// A pool a command works on: one this process serves, or one it opened for the command (and
/// syncs and exports after it).
enum Held {
    Live(Arc<Store>),
    Local(Arc<Store>),
}

impl std::ops::Deref for Held {
    type Target = Store;
    fn deref(&self) -> &Store {
        match self {
            Held::Live(store) => store,
            Held::Local(store) => store,
        }
    }
}

impl Held {
    /// Starts the background syncer of a pool opened for a command that writes much (a
    /// receive): without it, dirty data waits at the write throttle for syncs nothing starts.
    /// A served pool's runs already.
    fn run_syncer(&self) {
        if let Held::Local(store) = self {
            store.run_syncer();
        }
    }

    /// Ends the command: a pool opened for it finishes its scrub or resilver, and is synced
    /// and exported; a live one is synced.
    async fn release(self) -> anyhow::Result<()> {
        match self {
            Held::Live(store) => {
                store.sync().await?;
            }
            Held::Local(store) => {
                store.wait_scan().await;
                match Arc::try_unwrap(store) {
                    Ok(store) => store.export().await?,
                    Err(store) => {
                        store.sync().await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The store as the background scan needs it.
    fn shared(&self) -> &Arc<Store> {
        match self {
            Held::Live(store) | Held::Local(store) => store,
        }
    }
}

/// Parses sizes like 64M, 20G, 4096.
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    sluice_engine::tunables::parse_bytes(text).with_context(|| {
        format!("{text:?} is not a whole number of bytes that fits in 64 bits (like 4096, 4K, 4KiB, 64M or 1.5G)")
    })
}

/// Pools named in the cache file.
pub fn known_pools() -> anyhow::Result<Vec<String>> {
    Ok(read_cache()?.into_keys().collect())
}

pub(crate) fn cache_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_CACHE_FILE") {
        return PathBuf::from(path);
    }
    let home =
        std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".local/state/sluice/pools")
}

fn read_cache() -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let path = cache_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(e).with_context(|| format!("reading the pool cache {}", path.display()))
        }
    };
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next()?.to_owned();
            Some((name, fields.map(str::to_owned).collect()))
        })
        .collect())
}

fn write_cache(cache: &BTreeMap<String, Vec<String>>) -> anyhow::Result<()> {
    let path = cache_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text: String =
        cache.iter().map(|(name, paths)| format!("{name}\t{}\n", paths.join("\t"))).collect();
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, text).with_context(|| format!("writing {}", temp.display()))?;
    std::fs::rename(&temp, &path).with_context(|| format!("replacing {}", path.display()))
}

/// Opens a leaf; a missing file is created with `create_len` bytes, allocated in full unless
/// `sparse`.
pub(crate) fn open_leaf(
    path: &str,
    create_len: Option<u64>,
    sparse: bool,
) -> anyhow::Result<LeafSpec> {
    let options = FileDeviceOptions {
        create_len_bytes: create_len,
        sparse,
        exclusive: true,
        ..Default::default()
    };
    let device = FileDevice::open(Path::new(path), &options).map_err(|error| match error {
        // An error the engine wrote itself rather than one from the OS (the leaf's lock refused
        // by its filesystem, a path that is neither file nor block device): it says what went
        // wrong and what to do, which the generic "cannot open; check the path exists" of
        // DeviceError::Open would bury.
        DeviceError::Open { path, cause: source } if source.raw_os_error().is_none() => {
            anyhow::Error::new(source).context(format!("device {}", path.display()))
        }
        error => error.into(),
    })?;
    // Every leaf can be made to fail on demand (`pool inject`, hidden: for tests and drills).
    let (device, handle) = Injected::new(Arc::new(device));
    injections().insert(path.to_owned(), handle);
    Ok(LeafSpec { path: path.to_owned(), device: Arc::new(device) })
}

/// The fault-injection handle of every leaf this process opened, by path.
static INJECTIONS: std::sync::Mutex<BTreeMap<String, InjectHandle>> =
    std::sync::Mutex::new(BTreeMap::new());

fn injections() -> std::sync::MutexGuard<'static, BTreeMap<String, InjectHandle>> {
    // A panic elsewhere while holding it left a map that is still whole.
    INJECTIONS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `pool inject NAME LEAF read-errors|write-errors|gone|clear` (zinject): on a served pool,
/// makes a leaf's device fail from now on, or stop failing.
pub async fn inject(ctx: &mut Ctx<'_>, name: &str, leaf: &str, what: &str) -> anyhow::Result<()> {
    let Some(injection) = Injection::parse(what) else {
        bail!("pool inject: {what:?} is not one of read-errors, write-errors, gone, clear");
    };
    let Some(store) = ctx.live.as_ref().filter(|s| s.pool().name() == name) else {
        bail!("pool {name} is not being served: faults are injected into a running `sluice serve`");
    };
    let path = store.pool().find_leaf(leaf)?.path;
    let Some(handle) = injections().get(&path).cloned() else {
        bail!("pool {name}: leaf {path} was not opened by this server");
    };
    handle.set(injection);
    ctx.say(format!("{path} of pool {name}: injecting {what}"));
    Ok(())
}

/// Opens the pool called `name` from the cache, with `tunables` (`sluice serve --set`).
pub(crate) async fn open_store(
    env: &Env,
    name: &str,
    tunables: &Tunables,
) -> anyhow::Result<Store> {
    let cache = read_cache()?;
    let Some(paths) = cache.get(name) else {
        return Err(crate::exit::refuse(
            sluice_engine::ErrorKind::NotFound,
            format!(
                "no pool named {name} is known here; import it with \
                 `sluice pool import {name} -d DIR`"
            ),
        ));
    };
    let leaves = paths
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| open_leaf(p, None, false))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pool = Pool::import(env, leaves, name, tunables).await?;
    Ok(Store::open(pool, tunables).await?)
}

pub(crate) fn remember(pool: &Pool) -> anyhow::Result<()> {
    let mut cache = read_cache()?;
    cache.insert(
        pool.name().to_owned(),
        pool.leaves().iter().filter(|l| l.present).map(|l| l.path.clone()).collect(),
    );
    write_cache(&cache)
}

/// Drops the leaves of a new pool from the cache entries of other pools (a leaf of an imported
/// pool taken with --force): else the old pool would keep pointing at a leaf that is no longer
/// its own, and one left with no leaf could not even be exported.
fn forget_taken_leaves(pool: &Pool) -> anyhow::Result<()> {
    let taken: Vec<PathBuf> =
        pool.leaves().iter().filter_map(|l| std::fs::canonicalize(&l.path).ok()).collect();
    let mut cache = read_cache()?;
    let mut changed = false;
    for (other, paths) in cache.iter_mut() {
        let before = paths.len();
        paths.retain(|p| std::fs::canonicalize(p).map_or(true, |p| !taken.contains(&p)));
        if paths.len() != before {
            changed = true;
            let left = if paths.is_empty() {
                "it has no leaf left and is forgotten".to_owned()
            } else {
                format!("it keeps {}", paths.join(", "))
            };
            eprintln!("sluice: pool {other} lost leaves to pool {}; {left}", pool.name());
        }
    }
    if changed {
        cache.retain(|_, paths| !paths.is_empty());
        write_cache(&cache)?;
    }
    Ok(())
}

fn forget(name: &str) -> anyhow::Result<()> {
    let mut cache = read_cache()?;
    cache.remove(name);
    write_cache(&cache)
}

/// `sluice pool create NAME [--size S [--sparse]] [--force] VDEV... [log VDEV...]`, VDEV being
/// paths, or `mirror` followed by paths; what follows `log` becomes separate intent-log
/// devices. `create` is the size of missing files and whether they are sparse. Leaves that
/// already hold something are refused unless `force` (see [`check_leaves`]).
pub async fn create(
    env: &Env,
    name: &str,
    (size, sparse): (Option<u64>, bool),
    ashift: u8,
    vdevs: &[String],
    force: bool,
) -> anyhow::Result<()> {
    if read_cache()?.contains_key(name) {
        bail!("a pool named {name} already exists here; destroy or export it first");
    }
    let mut top = Vec::new();
    let mut mirror: Option<Vec<LeafSpec>> = None;
    let mut log = false;
    let mut leaves = Vec::new();
    // Files this command creates: removed again if the pool is refused.
    let mut created = Vec::new();
    // Wraps a top-level vdev as a log device after the `log` keyword.
    let place = |spec: TopSpec, log: bool| if log { TopSpec::Log(Box::new(spec)) } else { spec };
    for word in vdevs {
        if word == "mirror" || word == "log" {
            if let Some(children) = mirror.take() {
                top.push(place(TopSpec::Mirror(children), log));
            }
            if word == "log" {
                if log {
                    bail!(
                        "pool {name}: `log` appears twice; list every log device after one `log`"
                    );
                }
                log = true;
            } else {
                mirror = Some(Vec::new());
            }
            continue;
        }
        let existed = Path::new(word).exists();
        let leaf = open_leaf(word, size, sparse)?;
        if !existed {
            created.push(word.clone());
        }
        leaves.push(leaf.clone());
        match &mut mirror {
            Some(children) => children.push(leaf),
            None => top.push(place(TopSpec::Leaf(leaf), log)),
        }
    }
    if let Some(children) = mirror.take() {
        top.push(place(TopSpec::Mirror(children), log));
    }
    if let Err(refusal) = check_leaves(name, &leaves, force).await {
        // The devices (and their locks) go before the files this command made are removed.
        drop((top, leaves));
        for path in &created {
            let _ = std::fs::remove_file(path);
        }
        return Err(refusal);
    }
    let pool =
        Pool::create(env, PoolSpec { name: name.to_owned(), ashift, top }, &Tunables::default())
            .await?;
    forget_taken_leaves(&pool)?;
    remember(&pool)?;
    let store = Store::create(pool, &Tunables::default());
    store.export().await?;
    println!("created pool {name}");
    Ok(())
}

/// What a leaf of a new pool already holds, in the words `zpool create` uses: a sluice pool is
/// "imported on this machine" when the pool cache lists it with this leaf, else "exported".
async fn finding(leaf: &LeafSpec) -> anyhow::Result<Option<String>> {
    let found = probe::probe(leaf.device.as_ref())
        .await
        .with_context(|| format!("reading {} to see what it holds", leaf.path))?;
    let Some(found) = found else { return Ok(None) };
    let Finding::Pool { name, guid } = &found else { return Ok(Some(found.to_string())) };
    let here = std::fs::canonicalize(&leaf.path).ok();
    let imported = read_cache()?.get(name).is_some_and(|paths| {
        paths.iter().any(|p| here.is_some() && std::fs::canonicalize(p).ok() == here)
    });
    Ok(Some(if imported {
        format!("is part of pool '{name}', imported on this machine (guid {guid:016x})")
    } else {
        format!("is part of exported pool '{name}' (guid {guid:016x})")
    }))
}

/// Refuses to create pool `name` over leaves that hold something (another pool's labels, a
/// filesystem or partition table, any data where the labels go), naming what each holds,
/// unless `force`; forced, it says what is being overwritten. A leaf a running server holds
/// never gets here: its lock already refused it.
async fn check_leaves(name: &str, leaves: &[LeafSpec], force: bool) -> anyhow::Result<()> {
    let mut found = Vec::new();
    for leaf in leaves {
        if let Some(what) = finding(leaf).await? {
            found.push((leaf.path.clone(), what));
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    if force {
        for (path, what) in &found {
            eprintln!("sluice: pool {name}: overwriting {path}, which {what}");
        }
        return Ok(());
    }
    let lines: Vec<String> = found.iter().map(|(path, what)| format!("{path} {what}")).collect();
    bail!(
        "pool {name} not created, its leaves are not empty:\n  {}\nuse --force to overwrite \
         them (what they hold is lost)",
        lines.join("\n  ")
    )
}

/// `sluice pool import NAME -d DIR...`: finds the pool's leaves by their labels.
pub async fn import(
    env: &Env,
    name: &str,
    dirs: &[PathBuf],
    devices: &[String],
    options: ImportOptions,
    dry_run: bool,
) -> anyhow::Result<()> {
    let mut paths: Vec<String> = devices.to_vec();
    for dir in dirs {
        let entries = std::fs::read_dir(dir)
            .with_context(|| format!("reading directory {}", dir.display()))?;
        for entry in entries.flatten() {
            let file_type = entry.file_type()?;
            use std::os::unix::fs::FileTypeExt;
            if file_type.is_file() || file_type.is_block_device() {
                paths.push(entry.path().display().to_string());
            }
        }
    }
    paths.sort();
    // Read labels without locking (another pool's leaves may be in use), then lock only ours.
    let mut candidates = Vec::new();
    for path in &paths {
        let options = FileDeviceOptions { io_threads: 1, direct: false, ..Default::default() };
        if let Ok(device) = FileDevice::open(Path::new(path), &options) {
            candidates.push(LeafSpec {
                path: path.clone(),
                device: Arc::new(device) as Arc<dyn BlockDevice>,
            });
        }
    }
    let members: Vec<String> = {
        let pool = Pool::import(env, candidates, name, &Tunables::default()).await?;
        pool.leaves().iter().filter(|l| l.present).map(|l| l.path.clone()).collect()
    };
    let leaves =
        members.iter().map(|p| open_leaf(p, None, false)).collect::<anyhow::Result<Vec<_>>>()?;
    let pool = Pool::import(env, leaves, name, &Tunables::default()).await?;
    let missing: Vec<String> =
        pool.leaves().iter().filter(|l| !l.present).map(|l| l.path.clone()).collect();
    let degraded = if missing.is_empty() {
        String::new()
    } else {
        format!(", DEGRADED: missing {}", missing.join(", "))
    };
    if dry_run {
        let report = Store::check_import(&pool, options).await?;
        println!(
            "pool {name} would be imported at txg {}{degraded} (dry run: nothing written)",
            report.txg
        );
        print_import_report(&report);
        return Ok(());
    }
    remember(&pool)?;
    let (store, report) = Store::import(pool, &Tunables::default(), options).await?;
    store.export().await?;
    println!("imported pool {name} at txg {}{degraded}", report.txg);
    print_import_report(&report);
    Ok(())
}

/// What an import found beyond the txg: a rewind, logs cut short, records replayed.
fn print_import_report(report: &ImportReport) {
    if let Some(rewind) = &report.rewound {
        println!(
            "  rewound from txg {}, which does not verify ({}): {} txg(s) abandoned, {} s of \
             writes lost",
            rewind.from_txg, rewind.damage, rewind.txgs_lost, rewind.seconds_lost
        );
    }
    for lost in &report.lost_logs {
        println!(
            "  volume {}: intent log cut short: {}; {} record(s) before it replayed, every \
             record from sequence {} on is lost",
            lost.volume, lost.block, lost.records_replayed, lost.first_lost_sequence
        );
    }
    for (volume, blocks) in &report.space_counted_short {
        println!(
            "  volume {volume}: {blocks} indirect block(s) could not be read while counting its \
             space (a pool made before space figures were kept); its used bytes show low, and \
             `sluice pool scrub` reports the damage"
        );
    }
    println!(
        "  {} block(s) verified, {} intent-log record(s) to replay",
        report.blocks_verified, report.records_to_replay
    );
}

pub async fn export(env: &Env, name: &str) -> anyhow::Result<()> {
    let store = open_store(env, name, &Tunables::default()).await?;
    store.export().await?;
    forget(name)?;
    println!("exported pool {name}");
    Ok(())
}

pub async fn destroy(env: &Env, name: &str) -> anyhow::Result<()> {
    let store = open_store(env, name, &Tunables::default()).await?;
    let pool = store.pool();
    // Zeroing the label headers is what makes the leaves no longer a pool.
    for leaf in pool.leaves().iter().filter(|l| l.present) {
        let device = leaf.leaf.device();
        for offset in sluice_format::label_offsets(device.len_bytes()) {
            let zeros = sluice_engine::device::SharedBuf::copy_from(
                &[0u8; sluice_format::LABEL_HEADER_BYTES],
            );
            device.write_at(offset, zeros).await?;
        }
        device.flush().await?;
    }
    forget(name)?;
    println!("destroyed pool {name}");
    Ok(())
}

/// Bytes of the data areas of a pool's vdevs, separate log devices left out.
fn data_capacity(pool: &Pool) -> u64 {
    let logs = pool.log_vdevs();
    (pool.data_areas().iter().enumerate())
        .filter(|(index, _)| !logs.contains(&(*index as u32)))
        .map(|(_, (s, e))| e - s)
        .sum()
}

/// The header of `pool list`.
pub const LIST_HEADER: &str = "NAME                     SIZE   ALLOC    FREE  HEALTH";

/// `pool list`'s line for each named pool (the header is printed once by the caller).
pub async fn list_line(
    ctx: &mut Ctx<'_>,
    names: &[String],
    scripted: bool,
    json: bool,
) -> anyhow::Result<()> {
    for name in names {
        let store = ctx.hold(name).await?;
        let pool = store.pool();
        let size = data_capacity(pool);
        let free = store.free_bytes();
        let healthy =
            pool.leaves().iter().all(|l| l.present && l.leaf.state() == LeafState::Online);
        let health = if healthy { "ONLINE" } else { "DEGRADED" };
        if json {
            let row = serde_json::json!({
                "name": name,
                "size_bytes": size,
                "allocated_bytes": size - free,
                "free_bytes": free,
                "health": health,
            });
            store.release().await?;
            ctx.say(row.to_string());
            continue;
        }
        let line = if scripted {
            format!("{name}\t{size}\t{}\t{free}\t{health}", size - free)
        } else {
            format!(
                "{name:<20} {:>8} {:>7} {:>7}  {health}",
                human(size),
                human(size - free),
                human(free)
            )
        };
        store.release().await?;
        ctx.say(line);
    }
    Ok(())
}

/// zpool's `status:` and `action:` lines for a pool that is not healthy.
fn health_lines(name: &str, leaves: &[PoolLeaf], scan: Option<&ScanStatus>) -> Vec<String> {
    match health(name, leaves, scan) {
        Some((status, action)) => {
            vec![format!("  status: {status}"), format!("  action: {action}")]
        }
        None => Vec::new(),
    }
}

/// What is wrong with a pool that is not healthy, and what to do: zpool's status and action.
fn health(name: &str, leaves: &[PoolLeaf], scan: Option<&ScanStatus>) -> Option<(String, String)> {
    let with = |f: &dyn Fn(&PoolLeaf) -> bool| -> Vec<&str> {
        leaves.iter().filter(|l| f(l)).map(|l| l.path.as_str()).collect()
    };
    let missing = with(&|l| !l.present);
    let faulted = with(&|l| l.present && matches!(l.leaf.state(), LeafState::Faulted(_)));
    let offline = with(&|l| l.present && l.leaf.state() == LeafState::Offline);
    let degraded = with(&|l| l.present && l.leaf.state() == LeafState::Degraded);
    let erring = with(&|l| l.leaf.errors().iter().any(|&e| e > 0));
    let resilvering =
        scan.is_some_and(|s| s.func == ScanFunc::Resilver && s.phase == ScanPhase::Scanning);
    let (status, action) = if !missing.is_empty() {
        (
            format!(
                "{} could not be found at import; the pool runs without it",
                missing.join(", ")
            ),
            format!(
                "export the pool, attach the device and import it again (-d), or replace it \
                 with `sluice pool replace {name} LEAF NEW`"
            ),
        )
    } else if !faulted.is_empty() {
        (
            format!(
                "{} failed and is out of service; its mirror serves without it",
                faulted.join(", ")
            ),
            format!(
                "replace the device with `sluice pool replace {name} LEAF NEW`, or once it \
                 works again return it with `sluice pool clear {name} LEAF`"
            ),
        )
    } else if resilvering {
        (
            String::from("a leaf is being resilvered: it is copied what it missed"),
            String::from("wait for the resilver to finish"),
        )
    } else if !offline.is_empty() {
        (
            format!("{} was taken offline; its mirror serves without it", offline.join(", ")),
            format!("return it with `sluice pool online {name} LEAF`"),
        )
    } else if !degraded.is_empty() || !erring.is_empty() {
        let which = if degraded.is_empty() { erring } else { degraded };
        (
            format!("{} returned errors; applications were not affected", which.join(", ")),
            format!(
                "check the device; `sluice pool clear {name}` resets the counts, and a \
                 replacement is due if they grow"
            ),
        )
    } else {
        return None;
    };
    Some((status, action))
}

/// `pool status --json`: one JSON object per pool, one per line (the same facts as the text,
/// for scripts).
pub async fn status_json(ctx: &mut Ctx<'_>, names: &[String]) -> anyhow::Result<()> {
    let names: Vec<String> =
        if names.is_empty() { read_cache()?.into_keys().collect() } else { names.to_vec() };
    for name in names {
        let store = ctx.hold(&name).await?;
        let pool = store.pool();
        let scan = store.scan_status();
        let leaves = pool.leaves();
        let degraded = leaves.iter().any(|l| !l.present || l.leaf.state() != LeafState::Online);
        let (status, action) = health(&name, &leaves, scan.as_ref()).unzip();
        let resilvering: Vec<String> = scan
            .as_ref()
            .filter(|s| s.func == ScanFunc::Resilver && s.phase == ScanPhase::Scanning)
            .map(|s| s.targets.clone())
            .unwrap_or_default();
        let now = pool.env().now();
        let vdevs: Vec<serde_json::Value> = pool
            .config()
            .top
            .iter()
            .enumerate()
            .map(|(index, top)| {
                let members: Vec<serde_json::Value> = leaves
                    .iter()
                    .filter(|l| l.top == index)
                    .map(|l| {
                        let [read, write, checksum] = l.leaf.errors();
                        let state = if l.present { l.leaf.state().name() } else { "MISSING" };
                        serde_json::json!({
                            "path": l.path,
                            "guid": format!("{:016x}", l.guid),
                            "state": state,
                            "reason": l.leaf.state().reason(),
                            "read_errors": read,
                            "write_errors": write,
                            "checksum_errors": checksum,
                            "resilvering": resilvering.contains(&l.path),
                            "being_replaced": pool.is_replaced(l.guid),
                        })
                    })
                    .collect();
                serde_json::json!({
                    "kind": if top.kind == sluice_format::TopKind::Mirror { "mirror" } else { "leaf" },
                    "log": top.log,
                    "guid": format!("{:016x}", top.guid),
                    "leaves": members,
                })
            })
            .collect();
        let scan_json = scan.as_ref().map(|s| {
            serde_json::json!({
                "func": s.func.name(),
                "phase": match s.phase {
                    ScanPhase::Scanning => "scanning",
                    ScanPhase::Finished => "finished",
                    ScanPhase::Canceled => "canceled",
                },
                "paused": s.paused,
                "progress": s.progress(),
                "seconds": s.run_secs(now),
                "examined_bytes": s.examined_bytes,
                "total_bytes": s.total_bytes,
                "issued_bytes": s.issued_bytes,
                "repaired_bytes": s.repaired_bytes,
                "errors": s.errors,
                "unrecoverable": s.unrecoverable,
                "targets": s.targets,
                "failure": s.failure,
            })
        });
        let capacity = data_capacity(pool);
        let free = store.free_bytes();
        let (reserved, available) = reserved_and_available(&store)?;
        let object = serde_json::json!({
            "name": name,
            "guid": format!("{:016x}", pool.guid()),
            "txg": pool.uberblock().txg,
            "state": if degraded { "DEGRADED" } else { "ONLINE" },
            "status": status,
            "action": action,
            "scan": scan_json,
            "vdevs": vdevs,
            "capacity_bytes": capacity,
            "allocated_bytes": capacity - free,
            "free_bytes": free,
            "reserved_unused_bytes": reserved,
            "available_bytes": available,
        });
        drop(leaves);
        store.release().await?;
        ctx.say(object.to_string());
    }
    Ok(())
}

/// zpool's `scan:` line.
fn scan_line(scan: &ScanStatus, now: sluice_engine::rt::Time) -> String {
    let func = scan.func.name();
    let end = scan.ended.unwrap_or(now);
    // Time before this import counts too (a scan resumed from the pool directory).
    let secs = scan.earlier_secs as f64 + end.since(scan.started).as_secs_f64();
    // Tenths of a second: a resilver of what a short offline missed takes a second or two.
    let clock = |secs: f64| {
        let tenths = (secs.max(0.0) * 10.0).round() as u64;
        let whole = tenths / 10;
        format!("{}:{:02}:{:02}.{}", whole / 3600, whole / 60 % 60, whole % 60, tenths % 10)
    };
    let fixed = if scan.func == ScanFunc::Scrub { "repaired" } else { "resilvered" };
    let found = format!(
        "{} {fixed}, {} errors, {} blocks unrecoverable",
        human(scan.repaired_bytes),
        scan.errors,
        scan.unrecoverable
    );
    match (scan.phase, scan.paused) {
        (ScanPhase::Scanning, paused) => {
            let done = scan.progress();
            let rate = if secs > 0.0 { scan.issued_bytes as f64 / secs } else { 0.0 };
            let left = if done > 0.0 && !paused {
                format!(", {} to go", clock(secs * (1.0 - done) / done))
            } else {
                String::new()
            };
            format!(
                "{func} {} for {}: {:.1}% done, {} issued at {}/s, {found}{left}",
                if paused { "paused" } else { "in progress" },
                clock(secs),
                done * 100.0,
                human(scan.issued_bytes),
                human(rate as u64),
            )
        }
        (ScanPhase::Finished, _) => {
            format!("{func} took {}: {} checked, {found}", clock(secs), human(scan.issued_bytes))
        }
        (ScanPhase::Canceled, _) => format!(
            "{func} canceled after {}: {} checked, {found}{}",
            clock(secs),
            human(scan.issued_bytes),
            scan.failure.as_ref().map(|f| format!(" ({f})")).unwrap_or_default()
        ),
    }
}

/// What `pool scrub` was asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubAction {
    Start { wait: bool },
    Pause,
    Stop,
}

impl ScrubAction {
    pub fn from_flags(pause: bool, stop: bool, wait: bool) -> ScrubAction {
        match (pause, stop) {
            (true, _) => ScrubAction::Pause,
            (_, true) => ScrubAction::Stop,
            _ => ScrubAction::Start { wait },
        }
    }
}

pub async fn scrub(ctx: &mut Ctx<'_>, name: &str, action: ScrubAction) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let live = matches!(store, Held::Live(_));
    let result = match action {
        ScrubAction::Pause => store.scrub_pause().map(|()| format!("scrub of {name} paused")),
        ScrubAction::Stop => store.scrub_stop().map(|()| format!("scrub of {name} stopped")),
        ScrubAction::Start { .. } => store.shared().scrub_start().map(|()| {
            format!("scrub of {name} started; `sluice pool status {name}` shows its progress")
        }),
    };
    let said = match result {
        Ok(said) => said,
        Err(error) => {
            store.release().await?;
            return Err(error.into());
        }
    };
    // A pool opened only for this command is scrubbed to the end before it is exported.
    let wait = matches!(action, ScrubAction::Start { wait: true }) || !live;
    if !wait {
        ctx.say(said);
        return store.release().await;
    }
    store.wait_scan().await;
    let status = store.scan_status();
    store.release().await?;
    let Some(status) = status else { bail!("pool {name}: the scrub left no status") };
    ctx.say(format!(
        "scrub of {name}: {} blocks, {} bytes checked; {} bad copies found, {} repaired, {} \
         blocks unrecoverable",
        status.issued_blocks,
        status.issued_bytes,
        status.errors,
        status.repaired_copies,
        status.unrecoverable
    ));
    if let Some(failure) = &status.failure {
        bail!("pool {name}: the scrub ended early: {failure}");
    }
    if status.phase != ScanPhase::Finished {
        bail!("pool {name}: the scrub was {} before it finished", phase_word(&status));
    }
    if status.unrecoverable > 0 {
        bail!(
            "pool {name} has {} blocks with no good copy; restore the affected volumes",
            status.unrecoverable
        );
    }
    Ok(())
}

fn phase_word(status: &ScanStatus) -> &'static str {
    match (status.phase, status.paused) {
        (ScanPhase::Scanning, true) => "paused",
        (ScanPhase::Scanning, false) => "in progress",
        (ScanPhase::Finished, _) => "finished",
        (ScanPhase::Canceled, _) => "canceled",
    }
}

/// `pool offline`: a persistent offline works on any pool (the pool directory records it);
/// a temporary one only on a served pool, where it lasts until `pool online` or the next
/// import.
pub async fn offline(
    ctx: &mut Ctx<'_>,
    name: &str,
    leaf: &str,
    temporary: bool,
) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    if temporary && !matches!(store, Held::Live(_)) {
        store.release().await?;
        bail!(
            "pool {name} is not being served: a temporary offline ends when the command does; \
             take the leaf offline on the pool `sluice serve {name}` serves, or without -t to \
             keep it offline across imports"
        );
    }
    let result = store.offline_leaf(leaf, temporary).await;
    store.release().await?;
    let path = result?;
    let until = if temporary { "until the next import or " } else { "" };
    ctx.say(format!(
        "{path} of pool {name} is offline {until}until `sluice pool online {name} {leaf}`"
    ));
    Ok(())
}

pub async fn online(ctx: &mut Ctx<'_>, name: &str, leaf: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = store.shared().online_leaf(leaf).await;
    let live = matches!(store, Held::Live(_));
    store.release().await?;
    let (path, resilvering) = result?;
    ctx.say(match (resilvering, live) {
        (true, true) => format!(
            "{path} of pool {name} is online; resilvering what it missed (`sluice pool status \
             {name}` shows the progress)"
        ),
        (true, false) => format!("{path} of pool {name} is online and resilvered"),
        (false, _) => format!("{path} of pool {name} is online; it missed nothing"),
    });
    Ok(())
}

pub async fn clear(ctx: &mut Ctx<'_>, name: &str, leaf: Option<&str>) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = store.shared().clear_leaves(leaf).await;
    store.release().await?;
    let (paths, resilvering) = result?;
    ctx.say(format!(
        "cleared the errors of {} in pool {name}{}",
        paths.join(", "),
        if resilvering { "; resilvering what the returned leaves missed" } else { "" }
    ));
    Ok(())
}

/// A leaf to attach or replace with, as the command line gave it.
pub struct NewLeaf {
    pub path: String,
    /// Size of the file to create if it is missing (default: the existing leaf's).
    pub size: Option<u64>,
    pub sparse: bool,
    pub force: bool,
}

/// `pool attach` (`replacing`: `pool replace`).
pub async fn attach(
    ctx: &mut Ctx<'_>,
    name: &str,
    existing: &str,
    new: NewLeaf,
    replacing: bool,
) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = async {
        let shared = store.shared();
        let old = shared.pool().find_leaf(existing)?;
        let size = new.size.unwrap_or_else(|| old.leaf.device().len_bytes());
        // A leaf of this pool is refused by name before opening it (its lock is ours).
        let same = |p: &str| match (std::fs::canonicalize(p), std::fs::canonicalize(&new.path)) {
            (Ok(a), Ok(b)) => a == b,
            _ => p == new.path,
        };
        if shared.pool().leaves().iter().any(|l| same(&l.path)) {
            return Err(PoolError::AlreadyMember { pool: name.to_owned(), path: new.path }.into());
        }
        let exists = Path::new(&new.path).exists();
        let spec = open_leaf(&new.path, (!exists).then_some(size), new.sparse)?;
        if exists {
            if let Some(what) = finding(&spec).await? {
                if !new.force {
                    bail!(
                        "pool {name}: {} {what}; use --force to overwrite it (what it holds is \
                         lost)",
                        new.path
                    );
                }
                eprintln!("sluice: pool {name}: overwriting {}, which {what}", new.path);
            }
        }
        let path = if replacing {
            shared.replace_leaf(existing, spec).await?
        } else {
            shared.attach_leaf(existing, spec).await?
        };
        // A pool opened for this command only: the resilver runs to its end here, and the
        // replaced leaf goes once it has.
        let live = matches!(store, Held::Live(_));
        if !live {
            shared.wait_scan().await;
            shared.detach_replaced().await;
        }
        remember(shared.pool())?;
        let old_left = shared.pool().find_leaf(&old.path).is_err();
        anyhow::Ok((old.path, path, live, old_left))
    }
    .await;
    store.release().await?;
    let (old, path, live, old_left) = result?;
    ctx.say(match (live, replacing) {
        (true, true) => format!(
            "{path} of pool {name} is replacing {old}; resilvering in the background (`sluice \
             pool status {name}` shows the progress), then {old} is detached"
        ),
        (true, false) => format!(
            "{path} of pool {name} is attached beside {old}; resilvering in the background \
             (`sluice pool status {name}` shows the progress)"
        ),
        (false, true) if old_left => {
            format!("{path} of pool {name} replaced {old}: resilvered, and {old} is detached")
        }
        (false, true) => format!(
            "{path} of pool {name} is replacing {old}, but the resilver did not finish; `sluice \
             pool status {name}` says why"
        ),
        (false, false) => format!("{path} of pool {name} is attached beside {old} and resilvered"),
    });
    Ok(())
}

/// `pool detach`.
pub async fn detach(ctx: &mut Ctx<'_>, name: &str, leaf: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = async {
        let path = store.shared().detach_leaf(leaf).await?;
        remember(store.shared().pool())?;
        anyhow::Ok(path)
    }
    .await;
    store.release().await?;
    let path = result?;
    ctx.say(format!("{path} is detached from pool {name}; its labels are erased"));
    Ok(())
}

/// The served pool's counters as JSON, for `sluice pool iostat` (see `crate::iostat`).
pub fn stats(ctx: &mut Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let Some(store) = ctx.live.as_ref().filter(|s| s.pool().name() == name) else {
        bail!(
            "pool {name} is not being served: its statistics come from a running `sluice serve \
             {name}`"
        );
    };
    let text = crate::snapshot::PoolSnapshot::capture(store).to_json();
    ctx.say(text);
    Ok(())
}

pub async fn status(ctx: &mut Ctx<'_>, names: &[String]) -> anyhow::Result<()> {
    let names: Vec<String> =
        if names.is_empty() { read_cache()?.into_keys().collect() } else { names.to_vec() };
    if names.is_empty() {
        ctx.say("no pools");
    }
    for name in names {
        let store = ctx.hold(&name).await?;
        let pool = store.pool();
        if matches!(store, Held::Live(_)) {
            ctx.say(format!("(served by sluice serve, process {})", std::process::id()));
        }
        let scan = store.scan_status();
        let leaves = pool.leaves();
        let degraded = leaves.iter().any(|l| !l.present || l.leaf.state() != LeafState::Online);
        let suspended = store.suspended_cause();
        ctx.say(format!(
            "pool: {name}  guid: {:016x}  txg: {}  state: {}",
            pool.guid(),
            pool.uberblock().txg,
            match (&suspended, degraded) {
                (Some(_), _) => "SUSPENDED",
                (None, true) => "DEGRADED",
                (None, false) => "ONLINE",
            }
        ));
        if let Some(cause) = suspended {
            ctx.say(format!(
                "  status: suspended: {cause}; nothing more is written. Stop the server and \
                 import the pool again (it returns to the last synced txg and replays the log)"
            ));
        }
        for line in health_lines(&name, &leaves, scan.as_ref()) {
            ctx.say(line);
        }
        if let Some(scan) = &scan {
            ctx.say(format!("  scan: {}", scan_line(scan, pool.env().now())));
        }
        let resilvering: Vec<String> = scan
            .as_ref()
            .filter(|s| s.func == ScanFunc::Resilver && s.phase == ScanPhase::Scanning)
            .map(|s| s.targets.clone())
            .unwrap_or_default();
        ctx.say(format!(
            "  {:<40} {:<8} {:>6} {:>6} {:>6}",
            "NAME", "STATE", "READ", "WRITE", "CKSUM"
        ));
        let mut logs_shown = false;
        for (index, top) in pool.config().top.iter().enumerate() {
            if top.log && !logs_shown {
                ctx.say("  logs");
                logs_shown = true;
            }
            if top.kind == sluice_format::TopKind::Mirror {
                // ZFS shows a mirror with a leaf being replaced as `replacing-N`.
                let replacing = leaves.iter().any(|l| l.top == index && pool.is_replaced(l.guid));
                let kind = if replacing { "replacing" } else { "mirror" };
                ctx.say(format!("  {:<40}", format!("{kind}-{index}")));
            }
            for leaf in leaves.iter().filter(|l| l.top == index) {
                let [read, write, checksum] = leaf.leaf.errors();
                let (state, reason) = if leaf.present {
                    (leaf.leaf.state().name(), leaf.leaf.state().reason())
                } else {
                    ("MISSING", Some("not found at import"))
                };
                let note = if resilvering.contains(&leaf.path) {
                    String::from("  (resilvering)")
                } else if pool.is_replaced(leaf.guid) {
                    format!(
                        "  (being replaced{})",
                        reason.map(|r| format!("; {r}")).unwrap_or_default()
                    )
                } else {
                    reason.map(|r| format!("  ({r})")).unwrap_or_default()
                };
                ctx.say(format!(
                    "    {:<38} {:<8} {:>6} {:>6} {:>6}{note}",
                    leaf.path, state, read, write, checksum,
                ));
            }
        }
        let capacity = data_capacity(pool);
        let free = store.free_bytes();
        let (reserved, available) = reserved_and_available(&store)?;
        ctx.say(format!(
            "  space: {} used, {} free, {} capacity; {} reserved for thick volumes and not yet \
             written, {} available to new data",
            human(capacity - free),
            human(free),
            human(capacity),
            human(reserved),
            human(available)
        ));
        let cache = pool.cache();
        let (hits, misses) = (cache.hits.get(), cache.misses.get());
        ctx.say(format!(
            "  block cache: {} of {} held; {} hits, {} misses ({:.0}% hits since import)",
            human(cache.bytes()),
            human(cache.bytes_max()),
            hits,
            misses,
            100.0 * hits as f64 / (hits + misses).max(1) as f64
        ));
        let log = store.log_stats();
        ctx.say(format!(
            "  intent log: {} commits ({} through a txg sync, {} early, {} not waited for: \
             sync=disabled), {} log blocks written, {} blocks written in place for indirect \
             records ({} records copied instead, {} left to their txg's sync); at import {} \
             chains claimed, {} records replayed ({} indirect; {} already applied by an \
             interrupted replay), {} torn tails, {} chains ended at an indirect block never \
             written",
            log.commits.get(),
            log.commits_via_txg.get(),
            log.early_commits.get(),
            log.commits_ignored.get(),
            store.log_blocks_written(),
            log.indirect_blocks_written.get(),
            log.indirect_records_copied.get(),
            log.indirect_records_left_to_sync.get(),
            log.chains_claimed.get(),
            log.records_replayed.get(),
            log.indirect_records_replayed.get(),
            log.records_already_replayed.get(),
            log.torn_tails.get(),
            log.indirect_chain_ends.get()
        ));
        let ddt = store.dedup_table();
        let summary = ddt.summary();
        let stats = ddt.stats();
        ctx.say(format!(
            "  dedup: ratio {:.2}x ({} references to {} stored blocks, {} stored for {} \
             referenced); table: {} entries in {} buckets, {} encoded, {} in memory",
            summary.ratio(),
            summary.references,
            summary.entries,
            human(summary.allocated_bytes),
            human(summary.referenced_bytes),
            summary.entries,
            1u64 << summary.bucket_bits,
            human(summary.table_bytes()),
            summary.in_memory
        ));
        let stages: Vec<String> = stats
            .by_stage()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(stage, n)| format!("{stage} {n}"))
            .collect();
        ctx.say(format!(
            "  dedup table lock ({}): {} acquisitions ({}), {} contended, {:.3} ms waited; \
             {} blocks written, {} shared, {} verify mismatches",
            match ddt.locking() {
                sluice_engine::dedup::Locking::Entry => "per-entry I/O lock",
                sluice_engine::dedup::Locking::Global => "global",
            },
            stats.by_stage().iter().map(|(_, n)| n).sum::<u64>(),
            if stages.is_empty() { String::from("none yet") } else { stages.join(", ") },
            stats.table_lock_contended.get(),
            stats.table_lock_wait_nanos.get() as f64 / 1e6,
            stats.blocks_written.get(),
            stats.blocks_shared.get(),
            stats.verify_mismatches.get()
        ));
        for volume in store.volumes() {
            let space = volume.space.unwrap_or_default();
            ctx.say(format!(
                "  volume {name}/{}: {} ({} blocks, dedup={}, compression={}), {} used, \
                 compress ratio {:.2}x",
                volume.name,
                human(volume.size_bytes),
                human(u64::from(volume.block_bytes)),
                volume.dedup.name(),
                volume.compression.name(),
                human(space.referenced_bytes),
                compress_ratio(&space)
            ));
        }
        store.release().await?;
    }
    Ok(())
}

fn split_volume(spec: &str) -> anyhow::Result<(&str, &str)> {
    spec.split_once('/')
        .with_context(|| format!("{spec:?} is not POOL/VOLUME (for example tank/vm1)"))
}

pub async fn vol_create(
    ctx: &mut Ctx<'_>,
    spec: &str,
    size: u64,
    block_bytes: Option<u64>,
    thick: bool,
    properties: &[VolumeProperty],
) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let block =
        u32::try_from(block_bytes.unwrap_or(u64::from(BLOCK_BYTES_DEFAULT))).unwrap_or(u32::MAX);
    store.create_volume_with(volume, size, block, thick)?;
    for &property in properties {
        store.set_property(volume, property)?;
    }
    let reserved = store.volume_info(volume).map_or(0, |v| v.reservation_bytes);
    store.release().await?;
    let settings: Vec<String> = properties.iter().map(|&p| property_text(p)).collect();
    let kind = if thick { format!("thick, {} reserved", human(reserved)) } else { "thin".into() };
    ctx.say(format!("created volume {spec} ({}, {kind}, {})", human(size), settings.join(", ")));
    Ok(())
}

/// `name=value` of a property.
fn property_text(property: VolumeProperty) -> String {
    match property {
        VolumeProperty::Dedup(mode) => format!("dedup={}", mode.name()),
        VolumeProperty::Sync(mode) => format!("sync={}", mode.name()),
        VolumeProperty::LogBias(bias) => format!("logbias={}", bias.name()),
        VolumeProperty::Compression(compression) => format!("compression={}", compression.name()),
    }
}

/// Parses a compression property value.
pub fn parse_compression(value: &str) -> Result<Compression, String> {
    Compression::parse(value).ok_or_else(|| {
        format!(
            "compression={value} is not a compression; use off, lz4 (or on), zstd, or zstd-1 to \
             zstd-19"
        )
    })
}

/// Parses a dedup property value.
pub fn parse_dedup(value: &str) -> Result<DedupMode, String> {
    match value {
        "off" => Ok(DedupMode::Off),
        "on" => Ok(DedupMode::On),
        "verify" => Ok(DedupMode::Verify),
        other => Err(format!("dedup={other} is not a dedup mode; use off, on or verify")),
    }
}

/// Parses a sync property value.
pub fn parse_sync(value: &str) -> Result<SyncMode, String> {
    match value {
        "standard" => Ok(SyncMode::Standard),
        "always" => Ok(SyncMode::Always),
        "disabled" => Ok(SyncMode::Disabled),
        other => Err(format!("sync={other} is not a sync mode; use standard, always or disabled")),
    }
}

/// Parses a logbias property value.
pub fn parse_logbias(value: &str) -> Result<LogBias, String> {
    match value {
        "latency" => Ok(LogBias::Latency),
        "throughput" => Ok(LogBias::Throughput),
        other => Err(format!("logbias={other} is not a log bias; use latency or throughput")),
    }
}

pub async fn vol_set(ctx: &mut Ctx<'_>, spec: &str, property: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let (name, value) = property
        .split_once('=')
        .with_context(|| format!("{property:?} is not NAME=VALUE (for example sync=always)"))?;
    let parsed = match name {
        "dedup" => parse_dedup(value).map(VolumeProperty::Dedup),
        "sync" => parse_sync(value).map(VolumeProperty::Sync),
        "logbias" => parse_logbias(value).map(VolumeProperty::LogBias),
        "compression" | "compress" => parse_compression(value).map(VolumeProperty::Compression),
        _ => Err(format!(
            "volume property {name:?} does not exist; the settable ones are dedup, sync, \
             logbias and compression"
        )),
    };
    let property = parsed.map_err(|e| anyhow::anyhow!(e))?;
    let store = ctx.hold(pool).await?;
    store.set_property(volume, property)?;
    store.release().await?;
    let applies = match property {
        VolumeProperty::Dedup(_) | VolumeProperty::Compression(_) => {
            "blocks written from now on follow it"
        }
        _ => "requests from now on follow it",
    };
    ctx.say(format!("set {} on {spec}; {applies}", property_text(property)));
    Ok(())
}

pub async fn vol_destroy(ctx: &mut Ctx<'_>, spec: &str, recursive: bool) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let snapshots = store.snapshots(volume).map(|s| s.len()).unwrap_or(0);
    store.destroy_volume_with(volume, recursive).await?;
    store.release().await?;
    if snapshots > 0 {
        ctx.say(format!("destroyed volume {spec} and its {snapshots} snapshot(s)"));
    } else {
        ctx.say(format!("destroyed volume {spec}"));
    }
    Ok(())
}

/// `POOL/VOL` split (for the control socket's streaming commands).
pub fn split_volume_spec(spec: &str) -> anyhow::Result<(&str, &str)> {
    split_volume(spec)
}

/// Splits `POOL/VOL@SNAP`.
fn split_snapshot(spec: &str) -> anyhow::Result<(&str, &str, &str)> {
    let (pool, rest) = split_volume(spec)?;
    let (volume, snapshot) = rest.split_once('@').with_context(|| {
        format!("{spec:?} is not POOL/VOLUME@SNAPSHOT (for example tank/vm1@before-upgrade)")
    })?;
    Ok((pool, volume, snapshot))
}

/// `vol rollback POOL/VOL@SNAP [-r]`.
pub async fn vol_rollback(ctx: &mut Ctx<'_>, spec: &str, recursive: bool) -> anyhow::Result<()> {
    let (pool, volume, snapshot) = split_snapshot(spec)?;
    let store = ctx.hold(pool).await?;
    store.rollback_volume(volume, snapshot, recursive).await?;
    store.release().await?;
    ctx.say(format!("rolled volume {pool}/{volume} back to {spec}"));
    Ok(())
}

/// What `sluice send` sends.
#[derive(Clone, Debug)]
pub enum SendWhat {
    /// `POOL/VOL@SNAP`, whole or (`from`) since an older snapshot.
    Snapshot { spec: String, from: Option<String> },
    /// `-t TOKEN`: the rest of an interrupted receive's stream.
    Resume(sluice_format::ResumeToken),
}

impl SendWhat {
    pub fn new(
        spec: Option<String>,
        from: Option<String>,
        token: Option<String>,
    ) -> anyhow::Result<SendWhat> {
        match (spec, token) {
            (Some(spec), None) => Ok(SendWhat::Snapshot { spec, from }),
            (None, Some(token)) => {
                Ok(SendWhat::Resume(sluice_format::ResumeToken::decode(&token)?))
            }
            _ => anyhow::bail!("send takes POOL/VOL@SNAP, or -t TOKEN to resume a receive"),
        }
    }

    /// The pool the stream comes from.
    pub fn pool(&self) -> String {
        let spec = match self {
            SendWhat::Snapshot { spec, .. } => spec,
            SendWhat::Resume(token) => &token.source,
        };
        spec.split(['/', '@']).next().unwrap_or(spec).to_owned()
    }

    /// Sends it from `store` into `writer`.
    pub async fn send_from<W: std::io::Write + Send>(
        &self,
        store: &Store,
        writer: &mut sluice_format::StreamWriter<W>,
    ) -> anyhow::Result<String> {
        let mut emit = |record| writer.write(&record);
        let (what, summary) = match self {
            SendWhat::Snapshot { spec, from } => {
                let (_, volume, snapshot) = split_snapshot(spec)?;
                let from = from.as_deref().map(|f| f.rsplit('@').next().unwrap_or(f));
                let summary = store.send_snapshot(volume, snapshot, from, &mut emit).await?;
                (
                    format!("{spec}{}", from.map(|f| format!(" from @{f}")).unwrap_or_default()),
                    summary,
                )
            }
            SendWhat::Resume(token) => {
                let summary = store.send_resume(token, &mut emit).await?;
                (format!("{} from block {} (resumed)", token.source, token.next_block), summary)
            }
        };
        Ok(format!(
            "sent {what}: {} records, {} data blocks ({}), {} frees",
            summary.records + 1,
            summary.data_blocks,
            human(summary.data_bytes),
            summary.free_records
        ))
    }
}

/// `send [-i OLDER] POOL/VOL@SNAP` or `send -t TOKEN`: the stream to standard output.
pub async fn send(ctx: &mut Ctx<'_>, what: &SendWhat) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        anyhow::bail!(
            "send writes a binary stream: redirect it to a file or pipe it to `sluice recv`"
        );
    }
    let store = ctx.hold(&what.pool()).await?;
    let mut writer =
        sluice_format::StreamWriter::new(std::io::BufWriter::with_capacity(1 << 20, stdout));
    let said = what.send_from(&store, &mut writer).await?;
    writer.finish()?;
    store.release().await?;
    eprintln!("{said}");
    Ok(())
}

/// `recv [-s] POOL/VOL`: a stream from standard input.
pub async fn recv(ctx: &mut Ctx<'_>, spec: &str, resumable: bool) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.run_syncer();
    let mut reader = sluice_format::StreamReader::new(std::io::BufReader::with_capacity(
        1 << 20,
        std::io::stdin(),
    ));
    let mode = if resumable { ReceiveMode::Resumable } else { ReceiveMode::Whole };
    let result = {
        let mut next = || reader.next_record();
        store.receive(volume, mode, &mut next).await
    };
    let released = store.release().await;
    let summary = result?;
    released?;
    let newest = store_snapshot_note(&summary);
    ctx.say(format!("received {spec}: {newest}"));
    Ok(())
}

/// `recv -A POOL/VOL`: drops what an interrupted receive kept.
pub async fn recv_abort(ctx: &mut Ctx<'_>, spec: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.abort_receive(volume).await?;
    store.release().await?;
    ctx.say(format!("dropped the interrupted receive into {spec}"));
    Ok(())
}

pub fn store_snapshot_note(summary: &sluice_engine::txg::StreamSummary) -> String {
    format!(
        "{} records, {} data blocks ({}), {} frees",
        summary.records,
        summary.data_blocks,
        human(summary.data_bytes),
        summary.free_records
    )
}

/// `pool sync POOL`.
pub async fn sync(ctx: &mut Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let txg = store.sync().await?;
    store.release().await?;
    ctx.say(format!("pool {name}: txg {txg} synced"));
    Ok(())
}

/// `vol promote POOL/VOL`.
pub async fn vol_promote(ctx: &mut Ctx<'_>, spec: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.promote_volume(volume).await?;
    let moved: Vec<String> = store.snapshots(volume)?.into_iter().map(|s| s.name).collect();
    store.release().await?;
    ctx.say(format!("promoted {spec}; its snapshots now: {}", moved.join(", ")));
    Ok(())
}

/// `clone POOL/VOL@SNAP POOL/NEW` (or just `NEW`).
pub async fn clone(ctx: &mut Ctx<'_>, snapshot: &str, to: &str) -> anyhow::Result<()> {
    let (pool, volume, name) = split_snapshot(snapshot)?;
    let new = match to.split_once('/') {
        Some((other, _)) if other != pool => anyhow::bail!(
            "{to} is in pool {other}, {snapshot} in pool {pool}; a clone is made in its \
             snapshot's pool"
        ),
        Some((_, new)) => new,
        None => to,
    };
    let store = ctx.hold(pool).await?;
    store.clone_snapshot(volume, name, new).await?;
    store.release().await?;
    ctx.say(format!("cloned {snapshot} as {pool}/{new}"));
    Ok(())
}

/// `snapshot create POOL/VOL@SNAP...`: every one in one txg.
pub async fn snapshot_create(ctx: &mut Ctx<'_>, specs: &[String]) -> anyhow::Result<()> {
    let mut pairs = Vec::with_capacity(specs.len());
    let mut pool = None;
    for spec in specs {
        let (p, volume, snapshot) = split_snapshot(spec)?;
        match pool {
            Some(first) if first != p => anyhow::bail!(
                "{spec} is in pool {p}, {} in pool {first}; snapshots taken together (in one \
                 txg) must be of one pool",
                specs[0]
            ),
            _ => pool = Some(p),
        }
        pairs.push((volume.to_owned(), snapshot.to_owned()));
    }
    let pool = pool.context("no snapshot named")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let store = ctx.hold(pool).await?;
    let txg = store.create_snapshots(&pairs, now).await?;
    store.release().await?;
    for spec in specs {
        ctx.say(format!("took snapshot {spec} in txg {txg}"));
    }
    Ok(())
}

/// `snapshot destroy POOL/VOL@SNAP`.
pub async fn snapshot_destroy(ctx: &mut Ctx<'_>, spec: &str) -> anyhow::Result<()> {
    let (pool, volume, snapshot) = split_snapshot(spec)?;
    let store = ctx.hold(pool).await?;
    let used = store
        .snapshots(volume)?
        .into_iter()
        .find(|s| s.name == snapshot)
        .map_or(0, |s| s.used_bytes);
    store.destroy_snapshot(volume, snapshot).await?;
    store.release().await?;
    ctx.say(format!("destroyed snapshot {spec}, freeing {}", human(used)));
    Ok(())
}

/// `snapshot list [POOL | POOL/VOL]... [-H | --json]`.
pub async fn snapshot_list(
    ctx: &mut Ctx<'_>,
    targets: &[String],
    scripted: bool,
    json: bool,
) -> anyhow::Result<()> {
    let row = |cells: [&str; 7]| {
        if scripted {
            cells.join("\t")
        } else {
            let [name, used, refer, written, size, ratio, creation] = cells;
            format!("{name:<36} {used:>8} {refer:>8} {written:>8} {size:>8} {ratio:>6}  {creation}")
        }
    };
    if !scripted && !json {
        ctx.say(row(["NAME", "USED", "REFER", "WRITTEN", "SIZE", "RATIO", "CREATION"]));
    }
    for target in targets {
        let (pool, only) = match target.split_once('/') {
            Some((pool, volume)) => (pool, Some(volume)),
            None => (target.as_str(), None),
        };
        let store = ctx.hold(pool).await?;
        let volumes: Vec<String> = match only {
            Some(volume) => vec![volume.to_owned()],
            None => store.volumes().into_iter().map(|v| v.name).collect(),
        };
        for volume in volumes {
            for s in store.snapshots(&volume)? {
                let full = format!("{pool}/{}@{}", s.volume, s.name);
                let ratio = compress_ratio(&sluice_format::VolumeSpace {
                    referenced_bytes: s.referenced_bytes,
                    logical_bytes: s.logical_bytes,
                    physical_bytes: s.physical_bytes,
                });
                if json {
                    ctx.say(
                        serde_json::json!({
                            "name": full,
                            "txg": s.txg,
                            "creation_secs": s.creation_secs,
                            "size_bytes": s.size_bytes,
                            "used_bytes": s.used_bytes,
                            "referenced_bytes": s.referenced_bytes,
                            "written_bytes": s.written_bytes,
                            "logical_bytes": s.logical_bytes,
                            "physical_bytes": s.physical_bytes,
                            "compress_ratio": (ratio * 100.0).round() / 100.0,
                            "clones": s.clones.iter().map(|c| format!("{pool}/{c}")).collect::<Vec<_>>(),
                        })
                        .to_string(),
                    );
                    continue;
                }
                let bytes = |b: u64| if scripted { b.to_string() } else { human(b) };
                let creation =
                    if scripted { s.creation_secs.to_string() } else { utc(s.creation_secs) };
                ctx.say(row([
                    &full,
                    &bytes(s.used_bytes),
                    &bytes(s.referenced_bytes),
                    &bytes(s.written_bytes),
                    &bytes(s.size_bytes),
                    &format!("{ratio:.2}x"),
                    &creation,
                ]));
            }
        }
        store.release().await?;
    }
    Ok(())
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`: humantime's RFC 3339 form
/// (`2026-11-28T09:30:00Z`) in the words `snapshot list` has always printed.
fn utc(secs: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    let rfc3339 = humantime::format_rfc3339_seconds(time).to_string();
    format!("{} UTC", rfc3339.trim_end_matches('Z').replacen('T', " ", 1))
}

pub async fn vol_rename(ctx: &mut Ctx<'_>, spec: &str, to: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let new = match to.split_once('/') {
        Some((other, _)) if other != pool => anyhow::bail!(
            "{to} is in pool {other}, {spec} in pool {pool}; a volume is renamed within its pool"
        ),
        Some((_, name)) => name,
        None => to,
    };
    let store = ctx.hold(pool).await?;
    store.rename_volume(volume, new).await?;
    store.release().await?;
    ctx.say(format!("renamed volume {spec} to {pool}/{new}"));
    Ok(())
}

/// `vol get POOL/VOL [PROPERTY...] [-H | --json]`: every property, or the ones named.
pub async fn vol_get(
    ctx: &mut Ctx<'_>,
    spec: &str,
    wanted: &[String],
    scripted: bool,
    json: bool,
) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let token = store
        .interrupted_receives()
        .into_iter()
        .find(|(target, _)| target == volume)
        .map_or_else(|| "-".to_owned(), |(_, token)| token.encode());
    if wanted.len() == 1
        && wanted[0] == "receive_resume_token"
        && store.volume_info(volume).is_none()
    {
        // A full stream's target does not exist until it is whole; its token does.
        store.release().await?;
        if json {
            ctx.say(serde_json::json!({"name": spec, "receive_resume_token": token}).to_string());
        } else if scripted {
            ctx.say(format!("{spec}\treceive_resume_token\t{token}"));
        } else {
            ctx.say(format!("{:<24} {:<18} {}", "NAME", "PROPERTY", "VALUE"));
            ctx.say(format!("{spec:<24} {:<18} {token}", "receive_resume_token"));
        }
        return Ok(());
    }
    let entry = store.volume_info(volume).ok_or_else(|| {
        anyhow::anyhow!("volume {spec} does not exist; `sluice vol list {pool}` shows the volumes")
    })?;
    let available = store.available_bytes(Some(volume))?;
    let snapshots = store.snapshot_space(volume)?;
    let origin = entry.origin.and_then(|o| {
        store.volumes().into_iter().find_map(|v| {
            let s = v.snapshots.iter().find(|s| s.id == o.snapshot)?;
            Some(format!("{pool}/{}@{}", v.name, s.name))
        })
    });
    store.release().await?;
    let space = entry.space.unwrap_or_default();
    let bytes = |b: u64| if scripted || json { b.to_string() } else { human(b) };
    let all: Vec<(&str, String)> = vec![
        ("volsize", bytes(entry.size_bytes)),
        ("volblocksize", bytes(u64::from(entry.block_bytes))),
        ("used", bytes(used_bytes(&entry, &snapshots))),
        ("usedbysnapshots", bytes(snapshots.snapshots_bytes)),
        ("written", bytes(snapshots.written_bytes)),
        ("available", bytes(available)),
        ("referenced", bytes(space.referenced_bytes)),
        ("logicalreferenced", bytes(space.logical_bytes)),
        (
            "refreservation",
            if entry.reservation_bytes == 0 {
                "none".into()
            } else {
                bytes(entry.reservation_bytes)
            },
        ),
        ("compression", entry.compression.name()),
        ("compressratio", format!("{:.2}x", compress_ratio(&space))),
        ("dedup", entry.dedup.name().to_owned()),
        ("sync", entry.sync.name().to_owned()),
        ("logbias", entry.logbias.name().to_owned()),
        ("origin", origin.unwrap_or_else(|| "-".to_owned())),
        ("receive_resume_token", token),
    ];
    for name in wanted {
        if !all.iter().any(|(p, _)| p == name) {
            let names: Vec<&str> = all.iter().map(|(p, _)| *p).collect();
            anyhow::bail!(
                "volume property {name:?} does not exist; the properties are {}",
                names.join(", ")
            );
        }
    }
    // In the order asked for, as zfs get prints them.
    let shown: Vec<(&str, String)> = if wanted.is_empty() {
        all
    } else {
        wanted.iter().filter_map(|w| all.iter().find(|(p, _)| p == w).cloned()).collect()
    };
    if json {
        let mut object = serde_json::Map::new();
        object.insert("name".into(), spec.into());
        for (property, value) in shown {
            let value = value.parse::<u64>().map_or(serde_json::Value::from(value), Into::into);
            object.insert(property.into(), value);
        }
        ctx.say(serde_json::Value::Object(object).to_string());
        return Ok(());
    }
    if !scripted {
        ctx.say(format!("{:<24} {:<18} {}", "NAME", "PROPERTY", "VALUE"));
    }
    for (property, value) in shown {
        ctx.say(if scripted {
            format!("{spec}\t{property}\t{value}")
        } else {
            format!("{spec:<24} {property:<18} {value}")
        });
    }
    Ok(())
}

pub async fn vol_resize(ctx: &mut Ctx<'_>, spec: &str, size: u64) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.resize_volume(volume, size).await?;
    store.release().await?;
    ctx.say(format!("resized volume {spec} to {}", human(size)));
    Ok(())
}

/// `vol list [-H | --json]`.
pub async fn vol_list(
    ctx: &mut Ctx<'_>,
    pools: &[String],
    scripted: bool,
    json: bool,
) -> anyhow::Result<()> {
    let row = |cells: [&str; 12]| {
        if scripted {
            cells.join("\t")
        } else {
            let [name, size, used, avail, refer, reserv, block, compress, ratio, dedup, sync, logbias] =
                cells;
            format!(
                "{name:<24} {size:>8} {used:>8} {avail:>8} {refer:>8} {reserv:>8} {block:>6} \
                 {compress:>8} {ratio:>6} {dedup:>7} {sync:>9} {logbias:>10}"
            )
        }
    };
    if !scripted && !json {
        ctx.say(row([
            "NAME", "SIZE", "USED", "AVAIL", "REFER", "RESERV", "BLOCK", "COMPRESS", "RATIO",
            "DEDUP", "SYNC", "LOGBIAS",
        ]));
    }
    for name in pools {
        let name = name.clone();
        let store = ctx.hold(&name).await?;
        for volume in store.volumes() {
            // A receive's hidden volume shows as its target's resume token, below.
            if volume.name.starts_with(RECEIVE_PREFIX) {
                continue;
            }
            let full = format!("{name}/{}", volume.name);
            let block = u64::from(volume.block_bytes);
            let space = volume.space.unwrap_or_default();
            let ratio = compress_ratio(&space);
            let used = used_bytes(&volume, &store.snapshot_space(&volume.name)?);
            let avail = store.available_bytes(Some(&volume.name))?;
            if json {
                ctx.say(
                    serde_json::json!({
                        "name": full,
                        "size_bytes": volume.size_bytes,
                        "used_bytes": used,
                        "available_bytes": avail,
                        "referenced_bytes": space.referenced_bytes,
                        "reservation_bytes": volume.reservation_bytes,
                        "logical_bytes": space.logical_bytes,
                        "physical_bytes": space.physical_bytes,
                        "block_bytes": block,
                        "compression": volume.compression.name(),
                        "compress_ratio": (ratio * 100.0).round() / 100.0,
                        "dedup": volume.dedup.name(),
                        "sync": volume.sync.name(),
                        "logbias": volume.logbias.name(),
                    })
                    .to_string(),
                );
                continue;
            }
            let bytes = |b: u64| if scripted { b.to_string() } else { human(b) };
            let reserv = match volume.reservation_bytes {
                0 => "none".to_owned(),
                b => bytes(b),
            };
            ctx.say(row([
                &full,
                &bytes(volume.size_bytes),
                &bytes(used),
                &bytes(avail),
                &bytes(space.referenced_bytes),
                &reserv,
                &bytes(block),
                &volume.compression.name(),
                &format!("{ratio:.2}x"),
                volume.dedup.name(),
                volume.sync.name(),
                volume.logbias.name(),
            ]));
        }
        for (target, token) in store.interrupted_receives() {
            let full = format!("{name}/{target}");
            if json {
                ctx.say(
                    serde_json::json!({
                        "name": full,
                        "receive_resume_token": token.encode(),
                        "received_blocks": token.next_block,
                    })
                    .to_string(),
                );
            } else if !scripted {
                // Scripts read it with `vol get POOL/VOL receive_resume_token -H`: a row
                // here would not have the table's columns.
                ctx.say(format!(
                    "{full}: interrupted receive, blocks before {} kept; resume: `sluice send -t \
                     {} | sluice recv -s {full}` (drop it: `sluice recv -A {full}`)",
                    token.next_block,
                    token.encode()
                ));
            }
        }
        store.release().await?;
    }
    Ok(())
}

/// Bytes thick volumes have set aside and not written yet, and what the pool can still give
/// to new data or new reservations (free space less the slop, those reservations and what
/// is dirty).
fn reserved_and_available(store: &Store) -> anyhow::Result<(u64, u64)> {
    let mut reserved = 0;
    for v in store.volumes() {
        let unique = store.snapshot_space(&v.name)?.written_bytes;
        reserved += v.reservation_bytes.saturating_sub(unique);
    }
    Ok((reserved, store.available_bytes(None)?))
}

/// ZFS's `used` of a volume: what its tree holds of its own (for a clone, not what it shares
/// with its origin), what only its snapshots hold, and what is still set aside for it (its
/// reservation less what it alone references).
fn used_bytes(volume: &sluice_format::VolumeEntry, snapshots: &SnapshotSpace) -> u64 {
    snapshots.dataset_bytes
        + snapshots.snapshots_bytes
        + volume.reservation_bytes.saturating_sub(snapshots.written_bytes)
}

/// Logical over stored bytes of a volume's data blocks (ZFS's compressratio); 1.00 when
/// empty.
fn compress_ratio(space: &sluice_format::VolumeSpace) -> f64 {
    if space.physical_bytes == 0 {
        1.0
    } else {
        space.logical_bytes as f64 / space.physical_bytes as f64
    }
}

fn human(bytes: u64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_times_print_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06:40 UTC");
    }
}
