//! `sluice pool add POOL spare DEV…` and `pool remove POOL DEV` (zpool add, zpool remove) for
//! hot spares. The engine keeps them and puts one in when a leaf faults or degrades; this
//! module opens the devices, checks what they hold as `pool create` does, and records them in
//! the pool cache so that import finds them.

use std::path::Path;

use anyhow::bail;

use super::output::Reply;
use super::pool::{finding, parse_layout};
use super::{cache, open_leaf, Ctx};

/// `pool add NAME spare DEV…` (`size` and `sparse` for missing files; `force` overwrites a
/// device that holds something).
pub async fn add(
    ctx: &mut Ctx<'_>,
    name: &str,
    vdevs: &[String],
    (size, sparse): (Option<u64>, bool),
    force: bool,
) -> anyhow::Result<()> {
    let layout = parse_layout(name, vdevs)?;
    if layout.is_empty() {
        bail!("pool {name}: no device to add; name them after `spare`: `sluice pool add {name} spare /path/to/disk`");
    }
    if layout.iter().any(|g| !g.spare) {
        bail!(
            "pool {name}: adding data vdevs and log devices to a pool is not built yet; `pool \
             add` adds hot spares: `sluice pool add {name} spare /path/to/disk ...`"
        );
    }
    let store = ctx.hold(name).await?;
    let result = async {
        let shared = store.shared();
        let mut specs = Vec::new();
        for group in &layout {
            let path = &group.paths[0];
            let exists = Path::new(path).exists();
            if !exists && size.is_none() {
                bail!("{path} does not exist; give --size to create it as a file");
            }
            let spec = open_leaf(path, size.filter(|_| !exists), sparse)?;
            if exists {
                if let Some(what) = finding(&spec).await? {
                    if !force {
                        bail!(
                            "pool {name}: {path} {what}; use --force to overwrite it (what it \
                             holds is lost)"
                        );
                    }
                    eprintln!("sluice: pool {name}: overwriting {path}, which {what}");
                }
            }
            specs.push(spec);
        }
        let added = shared.add_spares(specs).await?;
        cache::remember(shared.pool())?;
        anyhow::Ok(added)
    }
    .await;
    store.release().await?;
    let added = result?;
    ctx.say(Reply::done(format!(
        "pool {name}: {} added as hot spare{} (AVAIL); a spare goes in for a leaf that faults or \
         degrades while the pool is served",
        added.join(", "),
        if added.len() == 1 { "" } else { "s" }
    )));
    Ok(())
}

/// `pool remove NAME DEV`: an available hot spare.
pub async fn remove(ctx: &mut Ctx<'_>, name: &str, leaf: &str) -> anyhow::Result<()> {
    let store = ctx.hold(name).await?;
    let result = async {
        let shared = store.shared();
        let removed = shared.remove_spare(leaf).await;
        if let Err(sluice_engine::StoreError::Pool(sluice_engine::PoolError::NoSuchSpare {
            ..
        })) = &removed
        {
            if shared.pool().find_leaf(leaf).is_ok() {
                bail!(
                    "pool {name}: {leaf} is a member of a vdev, not a hot spare; removing data \
                     vdevs and log devices is not built (a mirror's leaf goes with `pool detach`)"
                );
            }
        }
        let path = removed?;
        cache::remember(shared.pool())?;
        anyhow::Ok(path)
    }
    .await;
    store.release().await?;
    let path = result?;
    ctx.done(format!("pool {name}: hot spare {path} removed; its labels are erased"));
    Ok(())
}
