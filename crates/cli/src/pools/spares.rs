//! `sluice pool add POOL VDEV…` and `pool remove POOL DEV` (zpool add, zpool remove): data
//! vdevs, log devices and hot spares added, hot spares removed. The engine keeps them (and puts
//! a spare in when a leaf faults or degrades); this module opens the devices, checks what they
//! hold as `pool create` does, and records them in the pool cache so that import finds them.

use std::path::Path;

use anyhow::bail;

use super::output::Reply;
use super::pool::{finding, parse_layout};
use super::{cache, open_leaf, Ctx};
use sluice_engine::{LeafSpec, TopSpec};

/// `pool add NAME VDEV…` (zpool add): hot spares after `spare`, and data vdevs (a leaf, a
/// `mirror`, a `raidz` group) or log devices after `log`, in `pool create`'s words. `size`
/// and `sparse` make missing files; `force` overwrites a device that holds something.
pub async fn add(
    ctx: &mut Ctx<'_>,
    name: &str,
    vdevs: &[String],
    (size, sparse): (Option<u64>, bool),
    force: bool,
) -> anyhow::Result<()> {
    let layout = parse_layout(name, vdevs)?;
    if layout.is_empty() {
        bail!(
            "pool {name}: no device to add; name them as `pool create` does: `sluice pool add \
             {name} mirror /d/a /d/b`, `spare /d/s`, `log /d/l`"
        );
    }
    let store = ctx.hold(name).await?;
    let result = async {
        let shared = store.shared();
        let mut opened = Vec::new();
        let mut open = |path: &str| -> anyhow::Result<LeafSpec> {
            let exists = Path::new(path).exists();
            if !exists && size.is_none() {
                bail!("{path} does not exist; give --size to create it as a file");
            }
            let spec = open_leaf(path, size.filter(|_| !exists), sparse)?;
            opened.push((spec.clone(), exists));
            Ok(spec)
        };
        let (mut tops, mut spares) = (Vec::new(), Vec::new());
        for group in &layout {
            if group.spare {
                spares.push(open(&group.paths[0])?);
                continue;
            }
            let spec = match (&group.mirror, group.raidz) {
                (Some(paths), Some(parity)) => TopSpec::Raidz {
                    parity,
                    leaves: paths.iter().map(|p| open(p)).collect::<Result<_, _>>()?,
                },
                (Some(paths), None) => {
                    TopSpec::Mirror(paths.iter().map(|p| open(p)).collect::<Result<_, _>>()?)
                }
                (None, _) => TopSpec::Leaf(open(&group.paths[0])?),
            };
            tops.push(if group.log { TopSpec::Log(Box::new(spec)) } else { spec });
        }
        for (spec, existed) in &opened {
            if !existed {
                continue;
            }
            if let Some(what) = finding(spec).await? {
                if !force {
                    bail!(
                        "pool {name}: {} {what}; use --force to overwrite it (what it holds is \
                         lost)",
                        spec.path
                    );
                }
                eprintln!("sluice: pool {name}: overwriting {}, which {what}", spec.path);
            }
        }
        let leaves = if tops.is_empty() { Vec::new() } else { shared.add_vdevs(tops).await? };
        let spares = if spares.is_empty() { Vec::new() } else { shared.add_spares(spares).await? };
        cache::remember(shared.pool())?;
        anyhow::Ok((leaves, spares))
    }
    .await;
    store.release().await?;
    let (leaves, spares) = result?;
    let mut said = Vec::new();
    if !leaves.is_empty() {
        said.push(format!(
            "pool {name}: {} added; new writes spread over every data vdev, existing blocks \
             stay where they are",
            leaves.join(", ")
        ));
    }
    if !spares.is_empty() {
        said.push(format!(
            "pool {name}: {} added as hot spare{} (AVAIL); a spare goes in for a leaf that \
             faults or degrades while the pool is served",
            spares.join(", "),
            if spares.len() == 1 { "" } else { "s" }
        ));
    }
    ctx.say(Reply::done(said.join("\n")));
    Ok(())
}

/// `pool remove NAME DEV`: an available hot spare, or a separate log device.
pub async fn remove(ctx: &mut Ctx<'_>, name: &str, device: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = async {
        let shared = store.shared();
        let removed = match shared.remove_spare(device).await {
            Err(sluice_engine::StoreError::Pool(sluice_engine::PoolError::NoSuchSpare {
                ..
            })) => {
                // Not a spare: a log device, or a leaf whose removal is refused by name.
                let paths = shared.remove_log(device).await?;
                Removed::Log(paths, !shared.pool().log_vdevs().is_empty())
            }
            spare => Removed::Spare(spare?),
        };
        cache::remember(shared.pool())?;
        anyhow::Ok(removed)
    }
    .await;
    store.release().await?;
    match result? {
        Removed::Spare(path) => {
            ctx.done(format!("pool {name}: hot spare {path} removed; its labels are erased"))
        }
        Removed::Log(paths, other_logs) => ctx.done(format!(
            "pool {name}: log {} {} removed; intent logs now go to {}; {} labels are erased",
            if paths.len() == 1 { "device" } else { "mirror" },
            paths.join(", "),
            if other_logs { "the other log devices" } else { "the data vdevs" },
            if paths.len() == 1 { "its" } else { "their" },
        )),
    }
    Ok(())
}

/// What `pool remove` took out.
enum Removed {
    Spare(String),
    /// The log device's leaves, and whether the pool has other log devices.
    Log(Vec<String>, bool),
}
