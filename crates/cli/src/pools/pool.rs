//! `sluice pool`: creating, importing, exporting and destroying pools; `list` and `status`;
//! scrubs; leaves taken out of service, returned, attached, detached and replaced; `sync`;
//! the served pool's counters (`stats`) and fault injection (`inject`).
//!
//! `create` first looks at what each leaf holds (`sluice_engine::probe`) and, like
//! `zpool create`, overwrites another pool, a filesystem or data only with --force. A command
//! that waits for a scrub or resilver (`scrub -w`, `attach -w`, `replace -w`, and any of them
//! on a pool opened only for the command) reports its progress while it waits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use sluice_engine::inject::Injection;
use sluice_engine::probe::{self, Finding};
use sluice_engine::tunables::Tunables;
use sluice_engine::LeafState;
use sluice_engine::{BlockDevice, FileDevice, FileDeviceOptions};
use sluice_engine::{ImportOptions, ImportReport, ScanFunc, ScanPhase, ScanStatus, Store};
use sluice_engine::{LeafSpec, NewFeatures, Pool, PoolError, PoolLeaf, PoolSpec, TopSpec};

use super::output::{
    CacheFigures, DedupFigures, LeafReport, LogFigures, PoolList, PoolRow, PoolStatus, PoolSummary,
    Reply, ScanReport, SpareReport, StatusDetail, StatusVolume, VdevReport,
};
use super::{cache, injections, open_leaf, open_store, Ctx, Held};

/// How `pool create` makes the pool beyond its leaves.
pub struct CreateOptions {
    /// log2 of the smallest allocation.
    pub ashift: u8,
    /// Overwrite leaves that hold something.
    pub force: bool,
    /// The optional format features (`-d`: none).
    pub features: NewFeatures,
}

/// `sluice pool create NAME [--size S [--sparse]] [--force] VDEV... [log VDEV...]`, VDEV being
/// paths, or `mirror` followed by paths; what follows `log` becomes separate intent-log
/// devices. `create` is the size of missing files and whether they are sparse. Leaves that
/// already hold something are refused unless `options.force` (see [`check_leaves`]).
pub async fn create(
    ctx: &mut Ctx<'_>,
    name: &str,
    (size, sparse): (Option<u64>, bool),
    vdevs: &[String],
    options: CreateOptions,
) -> anyhow::Result<()> {
    let CreateOptions { ashift, force, features } = options;
    if cache::read_cache()?.contains_key(name) {
        bail!("a pool named {name} already exists here; destroy or export it first");
    }
    let layout = parse_layout(name, vdevs)?;
    let mut top = Vec::new();
    let mut leaves = Vec::new();
    // Files this command creates: removed again if the pool is refused.
    let mut created = Vec::new();
    let mut open = |path: &str| -> anyhow::Result<LeafSpec> {
        let existed = Path::new(path).exists();
        let leaf = open_leaf(path, size, sparse)?;
        if !existed {
            created.push(path.to_owned());
        }
        leaves.push(leaf.clone());
        Ok(leaf)
    };
    let mut notes = Vec::new();
    let mut spares = Vec::new();
    for group in &layout {
        if group.spare {
            spares.push(open(&group.paths[0])?);
            continue;
        }
        let spec = match (&group.mirror, group.raidz) {
            (Some(paths), Some(parity)) => {
                let leaves: Vec<LeafSpec> =
                    paths.iter().map(|p| open(p)).collect::<Result<_, _>>()?;
                notes.extend(raidz_sizes_note(parity, &leaves));
                TopSpec::Raidz { parity, leaves }
            }
            (Some(paths), None) => {
                TopSpec::Mirror(paths.iter().map(|p| open(p)).collect::<Result<_, _>>()?)
            }
            (None, _) => TopSpec::Leaf(open(&group.paths[0])?),
        };
        top.push(if group.log { TopSpec::Log(Box::new(spec)) } else { spec });
    }
    if !spares.is_empty() {
        top.push(TopSpec::Spare(spares));
    }
    if let Err(refusal) = check_leaves(name, &leaves, force).await {
        // The devices (and their locks) go before the files this command made are removed.
        drop((top, leaves));
        for path in &created {
            let _ = std::fs::remove_file(path);
        }
        return Err(refusal);
    }
    let pool = Pool::create_as(
        ctx.env,
        PoolSpec { name: name.to_owned(), ashift, top },
        &Tunables::default(),
        features,
    )
    .await?;
    cache::forget_taken_leaves(&pool)?;
    cache::remember(&pool)?;
    let store = Store::create(pool, &Tunables::default());
    store.export().await?;
    let mut said = format!("created pool {name}");
    if features != NewFeatures::ALL {
        said.push_str(
            "\nwithout the optional features: older sluice builds import it; `sluice pool \
             upgrade` enables lz4_indirect later",
        );
    }
    for note in notes {
        said.push_str(&format!("\n{note}"));
    }
    ctx.done(said);
    Ok(())
}

/// What `pool create` says of a RAID-Z vdev whose leaves differ in size: each child gives as
/// much as the smallest (its address space is the children side by side).
fn raidz_sizes_note(parity: u8, leaves: &[LeafSpec]) -> Option<String> {
    let smallest = leaves.iter().map(|l| l.device.len_bytes()).min()?;
    let larger: Vec<&str> = leaves
        .iter()
        .filter(|l| l.device.len_bytes() > smallest)
        .map(|l| l.path.as_str())
        .collect();
    (!larger.is_empty()).then(|| {
        format!(
            "raidz{parity}: {} {} larger than the smallest leaf ({}); each is used only up to \
             that size",
            larger.join(", "),
            if larger.len() == 1 { "is" } else { "are" },
            super::output::human(smallest)
        )
    })
}

/// A top-level vdev as `pool create` was given it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Group {
    /// A lone leaf's path (`mirror` is `None`).
    pub(super) paths: Vec<String>,
    /// A mirror's leaves, or a RAID-Z vdev's.
    pub(super) mirror: Option<Vec<String>>,
    /// A RAID-Z vdev's parity (`mirror` holds its leaves).
    pub(super) raidz: Option<u8>,
    /// After `log`: a separate intent-log device.
    pub(super) log: bool,
    /// After `spare`: a hot spare (a lone leaf).
    pub(super) spare: bool,
}

/// The parity a RAID-Z word asks for: `raidz` and `raidz1` one, `raidz2` two, `raidz3` three.
fn raidz_parity(word: &str) -> Option<u8> {
    match word {
        "raidz" | "raidz1" => Some(1),
        "raidz2" => Some(2),
        "raidz3" => Some(3),
        _ => None,
    }
}

/// `pool create`'s VDEV words as top-level vdevs: plain paths are leaves of their own,
/// `mirror` starts a mirror, and what follows `log` holds only intent-log blocks.
pub(super) fn parse_layout(name: &str, words: &[String]) -> anyhow::Result<Vec<Group>> {
    let mut groups = Vec::new();
    let mut mirror: Option<Vec<String>> = None;
    let mut raidz: Option<u8> = None;
    let mut log = false;
    let mut spare = false;
    for word in words {
        let parity = raidz_parity(word);
        if word == "spare" {
            if let Some(children) = mirror.take() {
                groups.push(Group { paths: Vec::new(), mirror: Some(children), raidz, log, spare });
            }
            if spare {
                bail!("pool {name}: `spare` appears twice; list every hot spare after one `spare`");
            }
            (spare, log, raidz) = (true, false, None);
            continue;
        }
        if spare && (word == "mirror" || parity.is_some()) {
            bail!(
                "pool {name}: hot spares are single leaves: list their paths after `spare`, \
                 without `{word}`"
            );
        }
        if word == "mirror" || word == "log" || parity.is_some() {
            if let Some(children) = mirror.take() {
                groups.push(Group { paths: Vec::new(), mirror: Some(children), raidz, log, spare });
            }
            raidz = None;
            if word == "log" {
                spare = false;
                if log {
                    bail!(
                        "pool {name}: `log` appears twice; list every log device after one `log`"
                    );
                }
                log = true;
            } else {
                if parity.is_some() && log {
                    bail!(
                        "pool {name}: a log device cannot be RAID-Z; give log devices as leaves \
                         or `mirror` groups"
                    );
                }
                mirror = Some(Vec::new());
                raidz = parity;
            }
            continue;
        }
        match &mut mirror {
            Some(children) => children.push(word.clone()),
            None => groups.push(Group {
                paths: vec![word.clone()],
                mirror: None,
                raidz: None,
                log,
                spare,
            }),
        }
    }
    if let Some(children) = mirror.take() {
        groups.push(Group { paths: Vec::new(), mirror: Some(children), raidz, log, spare });
    }
    // Widths are checked before any file is made.
    for group in &groups {
        if let (Some(parity), Some(children)) = (group.raidz, &group.mirror) {
            let width = u32::try_from(children.len()).unwrap_or(u32::MAX);
            sluice_format::raidz::RaidzGeometry::new(width, u32::from(parity), 9)
                .map_err(|error| anyhow::anyhow!("pool {name}: {error}"))?;
        }
    }
    Ok(groups)
}

/// What a leaf of a new pool already holds, in the words `zpool create` uses: a sluice pool is
/// "imported on this machine" when the pool cache lists it with this leaf, else "exported".
pub(super) async fn finding(leaf: &LeafSpec) -> anyhow::Result<Option<String>> {
    let found = probe::probe(leaf.device.as_ref())
        .await
        .with_context(|| format!("reading {} to see what it holds", leaf.path))?;
    let Some(found) = found else { return Ok(None) };
    let Finding::Pool { name, guid } = &found else { return Ok(Some(found.to_string())) };
    let here = std::fs::canonicalize(&leaf.path).ok();
    let imported = cache::read_cache()?.get(name).is_some_and(|paths| {
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
    ctx: &mut Ctx<'_>,
    name: &str,
    (dirs, devices): (&[PathBuf], &[String]),
    options: ImportOptions,
    dry_run: bool,
) -> anyhow::Result<()> {
    let env = ctx.env;
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
        ctx.done(format!(
            "pool {name} would be imported at txg {}{degraded} (dry run: nothing written)\n{}",
            report.txg,
            import_report(&report)
        ));
        return Ok(());
    }
    cache::remember(&pool)?;
    let (store, report) = Store::import(pool, &Tunables::default(), options).await?;
    store.export().await?;
    ctx.done(format!(
        "imported pool {name} at txg {}{degraded}\n{}",
        report.txg,
        import_report(&report)
    ));
    Ok(())
}

/// What an import found beyond the txg: a rewind, logs cut short, records replayed.
fn import_report(report: &ImportReport) -> String {
    let mut lines = Vec::new();
    if let Some(rewind) = &report.rewound {
        lines.push(format!(
            "  rewound from txg {}, which does not verify ({}): {} txg(s) abandoned, {} s of \
             writes lost",
            rewind.from_txg, rewind.damage, rewind.txgs_lost, rewind.seconds_lost
        ));
    }
    for lost in &report.lost_logs {
        lines.push(format!(
            "  volume {}: intent log cut short: {}; {} record(s) before it replayed, every \
             record from sequence {} on is lost",
            lost.volume, lost.block, lost.records_replayed, lost.first_lost_sequence
        ));
    }
    for (volume, blocks) in &report.space_counted_short {
        lines.push(format!(
            "  volume {volume}: {blocks} indirect block(s) could not be read while counting its \
             space (a pool made before space figures were kept); its used bytes show low, and \
             `sluice pool scrub` reports the damage"
        ));
    }
    lines.push(format!(
        "  {} block(s) verified, {} intent-log record(s) to replay",
        report.blocks_verified, report.records_to_replay
    ));
    lines.join("\n")
}

pub async fn export(ctx: &mut Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let store = open_store(ctx.env, name, &Tunables::default()).await?;
    store.export().await?;
    cache::forget(name)?;
    ctx.done(format!("exported pool {name}"));
    Ok(())
}

pub async fn destroy(ctx: &mut Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let store = open_store(ctx.env, name, &Tunables::default()).await?;
    let pool = store.pool();
    // Zeroing the label headers is what makes the leaves (and available spares) no longer a
    // pool's.
    let tree = pool.tree();
    let devices = (tree.leaves.iter().filter(|l| l.present).map(|l| l.leaf.device()))
        .chain(tree.spares.iter().filter_map(|s| s.device.as_ref()));
    for device in devices {
        for offset in sluice_format::label_offsets(device.len_bytes()) {
            let zeros =
                sluice_engine::SharedBuf::copy_from(&[0u8; sluice_format::LABEL_HEADER_BYTES]);
            device.write_at(offset, zeros).await?;
        }
        device.flush().await?;
    }
    cache::forget(name)?;
    ctx.done(format!("destroyed pool {name}"));
    Ok(())
}

/// `pool list`'s HEALTH: ONLINE when every leaf is present and online, else DEGRADED.
pub fn pool_health(store: &Store) -> &'static str {
    let leaves = store.pool().leaves();
    let healthy = leaves.iter().all(|l| l.present && l.leaf.state() == LeafState::Online);
    if healthy {
        "ONLINE"
    } else {
        "DEGRADED"
    }
}

/// `pool list`: a row for each named pool.
pub async fn list(ctx: &mut Ctx<'_>, names: &[String]) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for name in names {
        let store = ctx.hold(name).await?;
        let pool = store.pool();
        let size = pool.data_capacity_bytes();
        let free = store.free_bytes();
        rows.push(PoolRow {
            name: name.clone(),
            size_bytes: size,
            allocated_bytes: size - free,
            free_bytes: free,
            health: pool_health(&store).to_owned(),
        });
        store.release().await?;
    }
    ctx.say(Reply::PoolList(PoolList { pools: rows }));
    Ok(())
}

/// What is wrong with a pool that is not healthy, and what to do: zpool's status and action.
/// With nothing wrong, a pool made without some optional feature (`disabled`) says so, as
/// zpool status does.
fn health(
    name: &str,
    leaves: &[PoolLeaf],
    scan: Option<&ScanStatus>,
    disabled: &[&str],
) -> Option<(String, String)> {
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
                "{} failed and is out of service; the rest of its vdev serves without it",
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
            format!(
                "{} was taken offline; the rest of its vdev serves without it",
                offline.join(", ")
            ),
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
    } else if !disabled.is_empty() {
        (
            format!(
                "optional features this build supports are not enabled: {}; the pool works \
                 without them",
                disabled.join(", ")
            ),
            format!(
                "enable them with `sluice pool upgrade {name}`; sluice builds that do not know \
                 them then refuse the pool"
            ),
        )
    } else {
        return None;
    };
    Some((status, action))
}

/// A top-level vdev's state, as `zpool status` gives it: ONLINE with every leaf online;
/// DEGRADED while it still serves every block (a mirror with a leaf left, a RAID-Z vdev with
/// at most `parity` columns out); FAULTED beyond.
fn vdev_state(top: &sluice_format::TopConfig, leaves: &[PoolLeaf], index: usize) -> &'static str {
    let serves = |guid: u64| {
        leaves.iter().any(|l| {
            l.guid == guid
                && l.present
                && matches!(l.leaf.state(), LeafState::Online | LeafState::Degraded)
        })
    };
    let all_online = (leaves.iter().filter(|l| l.top == index))
        .all(|l| l.present && l.leaf.state() == LeafState::Online);
    let serving = top.serves_with(serves);
    match (serving, all_online) {
        (false, _) => "FAULTED",
        (true, false) => "DEGRADED",
        (true, true) => "ONLINE",
    }
}

/// `pool status`: layout, health, errors, scan, space, caches and volumes of each named pool
/// (every known one without names).
pub async fn status(ctx: &mut Ctx<'_>, names: &[String]) -> anyhow::Result<()> {
    let names = if names.is_empty() { cache::known_pools()? } else { names.to_vec() };
    for name in names {
        let store = ctx.hold(&name).await?;
        let status = pool_status(&name, &store)?;
        store.release().await?;
        ctx.say(Reply::PoolStatus(Box::new(status)));
    }
    Ok(())
}

fn pool_status(name: &str, store: &Held) -> anyhow::Result<PoolStatus> {
    let pool = store.pool();
    let scan = store.scan_status();
    let leaves = pool.leaves();
    let degraded = leaves.iter().any(|l| !l.present || l.leaf.state() != LeafState::Online);
    let (status, action) = health(name, &leaves, scan.as_ref(), &pool.features_disabled()).unzip();
    let resilvering: Vec<String> = scan
        .as_ref()
        .filter(|s| s.func == ScanFunc::Resilver && s.phase == ScanPhase::Scanning)
        .map(|s| s.targets.clone())
        .unwrap_or_default();
    let now = pool.env().now();
    let report = |l: &PoolLeaf, group: Option<String>| {
        let [read, write, checksum] = l.leaf.errors();
        LeafReport {
            path: l.path.clone(),
            guid: format!("{:016x}", l.guid),
            state: if l.present { l.leaf.state().name() } else { "MISSING" }.to_owned(),
            reason: l.leaf.state().reason().map(str::to_owned),
            read_errors: read,
            write_errors: write,
            checksum_errors: checksum,
            resilvering: resilvering.contains(&l.path),
            being_replaced: pool.is_replaced(l.guid),
            group,
        }
    };
    let config = pool.config();
    let spare_of = |guid: u64| config.spares.iter().find(|s| s.stands_in_for == guid);
    let is_spare = |guid: u64| config.spares.iter().any(|s| s.guid == guid);
    let vdevs: Vec<VdevReport> = (config.top.iter().enumerate())
        .map(|(index, top)| {
            let find = |guid: u64| leaves.iter().find(|l| l.guid == guid);
            let rows = match &top.raidz {
                // A leaf a spare stands in for and the spare, under `spare-N` (N: the leaf's
                // place in the mirror), as zpool status shows them.
                None => {
                    let mut rows = Vec::new();
                    let children = || top.children.iter().filter_map(|c| find(c.guid));
                    for (at, leaf) in children().enumerate() {
                        if spare_of(leaf.guid).is_none() && is_spare(leaf.guid) {
                            let stood_for = config.spares.iter().find(|s| s.guid == leaf.guid);
                            let shown = stood_for.is_some_and(|s| find(s.stands_in_for).is_some());
                            if shown {
                                continue;
                            }
                        }
                        match spare_of(leaf.guid).and_then(|s| find(s.guid)) {
                            Some(spare) => {
                                let group = Some(format!("spare-{at}"));
                                rows.push(report(leaf, group.clone()));
                                rows.push(report(spare, group));
                            }
                            None => rows.push(report(leaf, None)),
                        }
                    }
                    rows
                }
                Some(raidz) => {
                    let mut rows = Vec::new();
                    for (column, child) in top.children.iter().enumerate() {
                        let pair = raidz.replacing.iter().find(|(c, _)| usize::from(*c) == column);
                        let kind = match pair {
                            Some((_, new)) if is_spare(new.guid) => "spare",
                            _ => "replacing",
                        };
                        let group = pair.map(|_| format!("{kind}-{column}"));
                        rows.extend(find(child.guid).map(|l| report(l, group.clone())));
                        if let Some((_, new)) = pair {
                            rows.extend(find(new.guid).map(|l| report(l, group.clone())));
                        }
                    }
                    rows
                }
            };
            VdevReport {
                kind: match (&top.raidz, top.kind) {
                    (Some(raidz), _) => format!("raidz{}", raidz.parity),
                    (None, sluice_format::TopKind::Mirror) => String::from("mirror"),
                    (None, sluice_format::TopKind::Hole) => String::from("hole"),
                    (None, _) => String::from("leaf"),
                },
                state: vdev_state(top, &leaves, index).to_owned(),
                log: top.log,
                guid: format!("{:016x}", top.guid),
                leaves: rows,
            }
        })
        .collect();
    let faulted = vdevs.iter().any(|v| v.state == "FAULTED");
    let spares = (pool.spares().into_iter())
        .map(|s| SpareReport {
            path: s.path,
            guid: format!("{:016x}", s.guid),
            state: s.state.to_owned(),
            stands_in_for: s.stands_in_for,
        })
        .collect();
    let scan_report = scan.as_ref().map(|s| ScanReport {
        func: s.func.name().to_owned(),
        phase: match s.phase {
            ScanPhase::Scanning => "scanning",
            ScanPhase::Finished => "finished",
            ScanPhase::Canceled => "canceled",
        }
        .to_owned(),
        paused: s.paused,
        progress: s.progress(),
        seconds: s.run_secs(now),
        examined_bytes: s.examined_bytes,
        total_bytes: s.total_bytes,
        issued_bytes: s.issued_bytes,
        repaired_bytes: s.repaired_bytes,
        errors: s.errors,
        unrecoverable: s.unrecoverable,
        targets: s.targets.clone(),
        failure: s.failure.clone(),
    });
    // Time before this import counts too (a scan resumed from the pool directory).
    let scan_secs = scan
        .as_ref()
        .map(|s| s.earlier_secs as f64 + s.ended.unwrap_or(now).since(s.started).as_secs_f64());
    let capacity = pool.data_capacity_bytes();
    let free = store.free_bytes();
    let (reserved, available) = reserved_and_available(store)?;
    let summary = PoolSummary {
        name: name.to_owned(),
        guid: format!("{:016x}", pool.guid()),
        txg: pool.uberblock().txg,
        state: if faulted {
            "FAULTED"
        } else if degraded {
            "DEGRADED"
        } else {
            "ONLINE"
        }
        .to_owned(),
        status,
        action,
        scan: scan_report,
        vdevs,
        spares,
        capacity_bytes: capacity,
        allocated_bytes: capacity - free,
        free_bytes: free,
        reserved_unused_bytes: reserved,
        available_bytes: available,
    };
    let cache = pool.cache();
    let log = store.log_stats();
    let ddt = store.dedup_table();
    let ddt_summary = ddt.summary();
    let ddt_stats = ddt.stats();
    let detail = StatusDetail {
        served_by: store.is_live().then(std::process::id),
        suspended: store.suspended_cause().map(|cause| cause.to_string()),
        scan_secs,
        cache: CacheFigures {
            bytes: cache.bytes(),
            bytes_max: cache.bytes_max(),
            hits: cache.hits.get(),
            misses: cache.misses.get(),
        },
        log: LogFigures {
            commits: log.commits.get(),
            commits_via_txg: log.commits_via_txg.get(),
            early_commits: log.early_commits.get(),
            early_fills: log.early_fills.get(),
            commits_ignored: log.commits_ignored.get(),
            log_blocks_written: store.log_blocks_written(),
            indirect_blocks_written: log.indirect_blocks_written.get(),
            indirect_records_shared: log.indirect_records_shared.get(),
            indirect_records_copied: log.indirect_records_copied.get(),
            indirect_records_left_to_sync: log.indirect_records_left_to_sync.get(),
            chains_claimed: log.chains_claimed.get(),
            records_replayed: log.records_replayed.get(),
            indirect_records_replayed: log.indirect_records_replayed.get(),
            records_already_replayed: log.records_already_replayed.get(),
            torn_tails: log.torn_tails.get(),
            indirect_chain_ends: log.indirect_chain_ends.get(),
        },
        dedup: DedupFigures {
            ratio: ddt_summary.ratio(),
            references: ddt_summary.references,
            entries: ddt_summary.entries,
            allocated_bytes: ddt_summary.allocated_bytes,
            referenced_bytes: ddt_summary.referenced_bytes,
            buckets: 1u64 << ddt_summary.bucket_bits,
            table_bytes: ddt_summary.table_bytes(),
            in_memory: ddt_summary.in_memory,
            locking: match ddt.locking() {
                sluice_engine::Locking::Entry => "per-entry I/O lock",
                sluice_engine::Locking::Global => "global",
            }
            .to_owned(),
            stages: (ddt_stats.by_stage().into_iter())
                .map(|(stage, n)| (stage.to_owned(), n))
                .collect(),
            contended: ddt_stats.table_lock_contended.get(),
            waited_nanos: ddt_stats.table_lock_wait_nanos.get(),
            blocks_written: ddt_stats.blocks_written.get(),
            blocks_shared: ddt_stats.blocks_shared.get(),
            verify_mismatches: ddt_stats.verify_mismatches.get(),
        },
        volumes: (store.volumes().into_iter())
            .map(|volume| {
                let space = volume.space.unwrap_or_default();
                StatusVolume {
                    name: format!("{name}/{}", volume.name),
                    size_bytes: volume.size_bytes,
                    block_bytes: u64::from(volume.block_bytes),
                    dedup: volume.dedup.name().to_owned(),
                    compression: volume.compression.name(),
                    referenced_bytes: space.referenced_bytes,
                    logical_bytes: space.logical_bytes,
                    physical_bytes: space.physical_bytes,
                }
            })
            .collect(),
    };
    Ok(PoolStatus { summary, detail })
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
    // As `zfs list` shows them: on RAID-Z, what 128 KiB blocks could use of them (a volume's
    // own figures, in `vol list`, are for its block size).
    let usable = |raw: u64| store.pool().deflate(raw, 128 << 10);
    Ok((usable(reserved), usable(store.available_bytes(None)?)))
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
    let wait = matches!(action, ScrubAction::Start { wait: true }) || !store.is_live();
    if !wait {
        ctx.done(said);
        return store.release().await;
    }
    ctx.wait_scan_reporting(&store).await;
    let status = store.scan_status();
    store.release().await?;
    let Some(status) = status else { bail!("pool {name}: the scrub left no status") };
    ctx.done(format!(
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
    if temporary && !store.is_live() {
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
    ctx.done(format!(
        "{path} of pool {name} is offline {until}until `sluice pool online {name} {leaf}`"
    ));
    Ok(())
}

pub async fn online(ctx: &mut Ctx<'_>, name: &str, leaf: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = store.shared().online_leaf(leaf).await;
    let live = store.is_live();
    store.release().await?;
    let (path, resilvering) = result?;
    ctx.done(match (resilvering, live) {
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
    ctx.done(format!(
        "cleared the errors of {} in pool {name}{}",
        paths.join(", "),
        if resilvering { "; resilvering what the returned leaves missed" } else { "" }
    ));
    Ok(())
}

/// A leaf to attach or replace with, as the command line gave it.
#[derive(Clone, Debug)]
pub struct NewLeaf {
    pub path: String,
    /// Size of the file to create if it is missing (default: the existing leaf's).
    pub size: Option<u64>,
    pub sparse: bool,
    pub force: bool,
    /// Wait for the resilver to end on a served pool too (a pool opened for the command
    /// always does).
    pub wait: bool,
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
    // A pool opened for this command only: the resilver runs to its end here, and the
    // replaced leaf goes once it has; a served one waits when asked to.
    let waits = new.wait || !store.is_live();
    let result = async {
        let shared = store.shared();
        let old = shared.pool().find_leaf(existing)?;
        let size = new.size.unwrap_or_else(|| old.leaf.device().len_bytes());
        // `pool replace POOL LEAF`: the device now at the leaf's own path.
        let in_place = new.path.is_empty();
        let new = NewLeaf { path: if in_place { old.path.clone() } else { new.path }, ..new };
        // A leaf of this pool is refused by name before opening it (its lock is ours).
        let same = |p: &str| match (std::fs::canonicalize(p), std::fs::canonicalize(&new.path)) {
            (Ok(a), Ok(b)) => a == b,
            _ => p == new.path,
        };
        if !in_place && shared.pool().leaves().iter().any(|l| same(&l.path)) {
            return Err(PoolError::AlreadyMember { pool: name.to_owned(), path: new.path }.into());
        }
        let exists = Path::new(&new.path).exists();
        let spec = open_leaf(&new.path, (!exists).then_some(size), new.sparse).map_err(|e| {
            if in_place {
                e.context(format!(
                    "pool {name}: replacing {} in place needs a new device at its path; the one \
                     there is still the leaf (swap the disk or file first, or name a NEW path)",
                    old.path
                ))
            } else {
                e
            }
        })?;
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
        if waits {
            ctx.wait_scan_reporting(shared).await;
            shared.detach_replaced().await;
        }
        cache::remember(shared.pool())?;
        let old_left = shared.pool().find_leaf(&format!("{:016x}", old.guid)).is_err();
        anyhow::Ok((old.path, path, old_left))
    }
    .await;
    store.release().await?;
    let (old, path, old_left) = result?;
    ctx.done(match (waits, replacing) {
        (false, true) => format!(
            "{path} of pool {name} is replacing {old}; resilvering in the background (`sluice \
             pool status {name}` shows the progress), then {old} is detached"
        ),
        (false, false) => format!(
            "{path} of pool {name} is attached beside {old}; resilvering in the background \
             (`sluice pool status {name}` shows the progress)"
        ),
        (true, true) if old_left => {
            format!("{path} of pool {name} replaced {old}: resilvered, and {old} is detached")
        }
        (true, true) => format!(
            "{path} of pool {name} is replacing {old}, but the resilver did not finish; `sluice \
             pool status {name}` says why"
        ),
        (true, false) => format!("{path} of pool {name} is attached beside {old} and resilvered"),
    });
    Ok(())
}

/// `pool detach`.
pub async fn detach(ctx: &mut Ctx<'_>, name: &str, leaf: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = async {
        let path = store.shared().detach_leaf(leaf).await?;
        cache::remember(store.shared().pool())?;
        // A hot spare goes back to the available ones rather than leaving.
        let spare = store.shared().pool().spares().iter().any(|s| s.path == path);
        anyhow::Ok((path, spare))
    }
    .await;
    store.release().await?;
    let (path, spare) = result?;
    ctx.done(if spare {
        format!("hot spare {path} of pool {name} is detached and available again (AVAIL)")
    } else {
        format!("{path} is detached from pool {name}; its labels are erased")
    });
    Ok(())
}

/// `pool sync POOL`.
pub async fn sync(ctx: &mut Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let txg = store.sync().await?;
    store.release().await?;
    ctx.done(format!("pool {name}: txg {txg} synced"));
    Ok(())
}

/// The served pool's counters, for `sluice pool iostat` (see `crate::iostat`).
pub fn stats(ctx: &mut Ctx<'_>, name: &str) -> anyhow::Result<()> {
    let Some(store) = ctx.live.as_ref().filter(|s| s.pool().name() == name) else {
        bail!(
            "pool {name} is not being served: its statistics come from a running `sluice serve \
             {name}`"
        );
    };
    let snapshot = crate::snapshot::PoolSnapshot::capture(store);
    ctx.say(Reply::Stats(Box::new(snapshot)));
    Ok(())
}

/// `pool events NAME [-c]` (zpool events): the events the server keeps, or with `clear`
/// forgets them, saying how many.
pub fn events(ctx: &mut Ctx<'_>, name: &str, clear: bool) -> anyhow::Result<()> {
    let Some(store) = ctx.live.as_ref().filter(|s| s.pool().name() == name) else {
        return Err(not_served_events(name));
    };
    if clear {
        let count = store.pool().events().clear();
        ctx.say(Reply::done(format!("cleared {count} events of pool {name}")));
    } else {
        let events = crate::events::list(store);
        ctx.say(Reply::Events(crate::events::EventList { events }));
    }
    Ok(())
}

/// Why `pool events` of a pool no server holds has nothing to show.
pub fn not_served_events(name: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "pool {name} is not being served: its events are kept by the running `sluice serve \
         {name}` (and written to its log)"
    )
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
    ctx.done(format!("{path} of pool {name}: injecting {what}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    /// `pool create`'s vdev words: plain paths stripe, `mirror` groups, `log` marks the rest.
    #[test]
    fn layouts_parse() {
        let groups = parse_layout("tank", &words("mirror a b mirror c d log e")).unwrap();
        assert_eq!(groups.len(), 3);
        assert_eq!(groups[0].mirror.as_deref(), Some(&words("a b")[..]));
        assert_eq!(groups[1].mirror.as_deref(), Some(&words("c d")[..]));
        assert_eq!((groups[2].paths.clone(), groups[2].log), (words("e"), true));
        let plain = parse_layout("tank", &words("a b")).unwrap();
        assert!(plain.iter().all(|g| g.mirror.is_none() && !g.log));
        let twice = parse_layout("tank", &words("a log b log c")).unwrap_err().to_string();
        assert!(twice.contains("`log` appears twice"), "{twice}");
        let log_mirror = parse_layout("tank", &words("a log mirror b c")).unwrap();
        assert!(log_mirror[1].log && log_mirror[1].mirror.is_some());
        let raidz = parse_layout("tank", &words("raidz a b c raidz2 d e f g mirror h i")).unwrap();
        assert_eq!(raidz.iter().map(|g| g.raidz).collect::<Vec<_>>(), [Some(1), Some(2), None]);
        assert_eq!(raidz[1].mirror.as_deref(), Some(&words("d e f g")[..]));
        let refused = parse_layout("tank", &words("a log raidz b c d")).unwrap_err();
        assert!(refused.to_string().contains("cannot be RAID-Z"), "{refused}");
    }

    #[test]
    fn scrub_flags_pick_one_action() {
        assert_eq!(ScrubAction::from_flags(true, false, false), ScrubAction::Pause);
        assert_eq!(ScrubAction::from_flags(false, true, false), ScrubAction::Stop);
        assert_eq!(ScrubAction::from_flags(false, false, true), ScrubAction::Start { wait: true });
    }
}
