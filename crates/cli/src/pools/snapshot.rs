//! `sluice snapshot` and `sluice clone`: snapshots of volumes taken together in one txg,
//! listed with what each holds, destroyed; and writable clones made from them.

use anyhow::Context;

use super::output::{human, ratio_hundredths, Reply, SnapshotList, SnapshotRow};
use super::{name_in_pool, split_snapshot, Ctx};

/// `snapshot create POOL/VOL@SNAP...`: every one in one txg.
pub async fn create(ctx: &mut Ctx<'_>, specs: &[String]) -> anyhow::Result<()> {
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
    let said: Vec<String> =
        specs.iter().map(|spec| format!("took snapshot {spec} in txg {txg}")).collect();
    ctx.done(said.join("\n"));
    Ok(())
}

/// `snapshot destroy POOL/VOL@SNAP`.
pub async fn destroy(ctx: &mut Ctx<'_>, spec: &str) -> anyhow::Result<()> {
    let (pool, volume, snapshot) = split_snapshot(spec)?;
    let store = ctx.hold(pool).await?;
    let used = store
        .snapshots(volume)?
        .into_iter()
        .find(|s| s.name == snapshot)
        .map_or(0, |s| s.used_bytes);
    store.destroy_snapshot(volume, snapshot).await?;
    store.release().await?;
    ctx.done(format!("destroyed snapshot {spec}, freeing {}", human(used)));
    Ok(())
}

/// `snapshot list [POOL | POOL/VOL]...`.
pub async fn list(ctx: &mut Ctx<'_>, targets: &[String]) -> anyhow::Result<()> {
    let mut rows = Vec::new();
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
                rows.push(SnapshotRow {
                    name: format!("{pool}/{}@{}", s.volume, s.name),
                    txg: s.txg,
                    creation_secs: s.creation_secs,
                    size_bytes: s.size_bytes,
                    used_bytes: s.used_bytes,
                    referenced_bytes: s.referenced_bytes,
                    written_bytes: s.written_bytes,
                    logical_bytes: s.logical_bytes,
                    physical_bytes: s.physical_bytes,
                    compress_ratio: ratio_hundredths(s.logical_bytes, s.physical_bytes),
                    clones: s.clones.iter().map(|c| format!("{pool}/{c}")).collect(),
                    automatic: s.automatic,
                });
            }
        }
        store.release().await?;
    }
    ctx.say(Reply::SnapshotList(SnapshotList { snapshots: rows }));
    Ok(())
}

/// `clone POOL/VOL@SNAP POOL/NEW` (or just `NEW`).
pub async fn clone(ctx: &mut Ctx<'_>, snapshot: &str, to: &str) -> anyhow::Result<()> {
    let (pool, volume, name) = split_snapshot(snapshot)?;
    let new = name_in_pool(to, pool, snapshot, "a clone is made in its snapshot's pool")?;
    let store = ctx.hold(pool).await?;
    store.clone_snapshot(volume, name, new).await?;
    store.release().await?;
    ctx.done(format!("cloned {snapshot} as {pool}/{new}"));
    Ok(())
}
