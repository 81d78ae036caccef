//! `sluice vol`: volumes of a pool: create, list, get and set properties, rename, resize,
//! roll back to a snapshot, promote a clone, destroy; and the words the property values are
//! typed in (`dedup=verify`, `sync=always`, `logbias=throughput`, `compression=zstd-7`).

use anyhow::Context;
use sluice_engine::{VolumeProperty, BLOCK_BYTES_DEFAULT, RECEIVE_PREFIX};
use sluice_format::{
    Compression, DedupMode, LogBias, SchedulePeriod, ScheduleRule, SyncMode, SCHEDULE_KEEP_MAX,
};

use super::key::{self, Encrypt, KeyMaterial};
use super::output::{
    human, ratio, ratio_hundredths, InterruptedReceive, PropValue, Reply, VolEntry, VolList,
    VolProp, VolProps, VolRow,
};
use super::{name_in_pool, split_snapshot, split_volume, used_bytes, Ctx};

pub async fn create(
    ctx: &mut Ctx<'_>,
    spec: &str,
    (size, block_bytes): (u64, Option<u64>),
    thick: bool,
    properties: &[VolumeProperty],
    encrypt: Option<(Encrypt, Option<KeyMaterial>)>,
) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let block =
        u32::try_from(block_bytes.unwrap_or(u64::from(BLOCK_BYTES_DEFAULT))).unwrap_or(u32::MAX);
    let encrypted = match &encrypt {
        Some((settings, key)) => {
            let key = key.as_ref().with_context(|| format!("no key was given for {spec}"))?;
            let new = key::new_key(settings.format, settings.location.clone(), key);
            store.create_encrypted_volume(volume, size, block, thick, new).await?;
            format!(
                ", encrypted (aes-256-gcm, keyformat={}, keylocation={})",
                settings.format.name(),
                key::location_text(&settings.location)
            )
        }
        None => {
            store.create_volume_with(volume, size, block, thick)?;
            String::new()
        }
    };
    for &property in properties {
        store.set_property(volume, property)?;
    }
    let reserved = store.volume_info(volume).map_or(0, |v| v.reservation_bytes);
    let warning = raidz_cost_warning(store.pool(), block);
    store.release().await?;
    let settings: Vec<String> = properties.iter().map(|&p| property_text(p)).collect();
    let kind = if thick { format!("thick, {} reserved", human(reserved)) } else { "thin".into() };
    let mut said = format!(
        "created volume {spec} ({}, {kind}, {}{encrypted})",
        human(size),
        settings.join(", ")
    );
    if let Some(warning) = warning {
        said.push_str(&format!("\n{warning}"));
    }
    ctx.done(said);
    Ok(())
}

/// A warning when a RAID-Z vdev of the pool stores blocks of `block` bytes no more cheaply
/// than a 2-way mirror would (a small block is one data sector beside its parity), naming the
/// smallest block size that does better.
fn raidz_cost_warning(pool: &sluice_engine::Pool, block: u32) -> Option<String> {
    let block = u64::from(block);
    let cost = pool.asize_max(block);
    if !pool.has_raidz() || cost < 2 * block {
        return None;
    }
    let better = (12..=20).map(|shift| 1u64 << shift).find(|&b| pool.asize_max(b) < 2 * b);
    let advice = match better {
        Some(b) => format!("a block size of {} or more stores more cheaply", human(b)),
        None => String::from("a mirror stores them as cheaply"),
    };
    Some(format!(
        "warning: on this pool's RAID-Z vdev each {} block allocates {} with its parity and \
         padding, as much as a 2-way mirror or more; {advice} (--block-size)",
        human(block),
        human(cost)
    ))
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

/// `NAME=VALUE` of `vol set` as the property it sets.
pub fn parse_setting(setting: &str) -> anyhow::Result<VolumeProperty> {
    let (name, value) = setting
        .split_once('=')
        .with_context(|| format!("{setting:?} is not NAME=VALUE (for example sync=always)"))?;
    let parsed = match name {
        "dedup" => parse_dedup(value).map(VolumeProperty::Dedup),
        "sync" => parse_sync(value).map(VolumeProperty::Sync),
        "logbias" => parse_logbias(value).map(VolumeProperty::LogBias),
        "compression" | "compress" => parse_compression(value).map(VolumeProperty::Compression),
        _ => Err(format!(
            "volume property {name:?} does not exist; the settable ones are dedup, sync, \
             logbias, compression and snapshot.schedule"
        )),
    };
    parsed.map_err(|e| anyhow::anyhow!(e))
}

/// `snapshot.schedule`'s value: `hourly:24,daily:30,weekly:8` (periods minutely, hourly,
/// daily, weekly, monthly, each at most once, keeping 1 to 1000), or `none`.
pub fn parse_schedule(value: &str) -> anyhow::Result<Vec<ScheduleRule>> {
    if matches!(value, "none" | "off" | "") {
        return Ok(Vec::new());
    }
    let mut rules = Vec::new();
    for part in value.split(',') {
        let (period, keep) = part.split_once(':').with_context(|| {
            format!(
                "snapshot.schedule: {part:?} is not PERIOD:KEEP (for example hourly:24,daily:30); \
                 none removes the schedule"
            )
        })?;
        let period =
            (SchedulePeriod::ALL.into_iter().find(|p| p.name() == period)).with_context(|| {
                format!(
                    "snapshot.schedule: no period {period:?}; periods are minutely, hourly, \
                     daily, weekly and monthly"
                )
            })?;
        let keep = keep.parse::<u16>().ok().filter(|k| (1..=SCHEDULE_KEEP_MAX).contains(k));
        let keep = keep.with_context(|| {
            format!("snapshot.schedule: {part:?} must keep 1 to {SCHEDULE_KEEP_MAX} snapshots")
        })?;
        if rules.iter().any(|r: &ScheduleRule| r.period == period) {
            anyhow::bail!("snapshot.schedule: {} is given twice", period.name());
        }
        rules.push(ScheduleRule { period, keep });
    }
    Ok(rules)
}

/// A schedule as `snapshot.schedule` shows it.
pub fn schedule_text(rules: &[ScheduleRule]) -> String {
    if rules.is_empty() {
        return "none".to_owned();
    }
    let parts: Vec<String> =
        rules.iter().map(|r| format!("{}:{}", r.period.name(), r.keep)).collect();
    parts.join(",")
}

pub async fn set(ctx: &mut Ctx<'_>, spec: &str, setting: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    if let Some(value) = setting.strip_prefix("snapshot.schedule=") {
        let rules = parse_schedule(value)?;
        let store = ctx.hold(pool).await?;
        store.set_snapshot_schedule(volume, rules.clone()).await?;
        store.release().await?;
        let text = schedule_text(&rules);
        ctx.done(if rules.is_empty() {
            format!(
                "set snapshot.schedule=none on {spec}; the snapshots it took stay (auto-*), no \
                 longer pruned"
            )
        } else {
            format!(
                "set snapshot.schedule={text} on {spec}; the served pool takes snapshots named \
                 auto-YYYY-MM-DDTHHMM (UTC) and prunes them as the rules keep"
            )
        });
        return Ok(());
    }
    let property = parse_setting(setting)?;
    let store = ctx.hold(pool).await?;
    store.set_property(volume, property)?;
    store.release().await?;
    let applies = match property {
        VolumeProperty::Dedup(_) | VolumeProperty::Compression(_) => {
            "blocks written from now on follow it"
        }
        _ => "requests from now on follow it",
    };
    ctx.done(format!("set {} on {spec}; {applies}", property_text(property)));
    Ok(())
}

pub async fn destroy(
    ctx: &mut Ctx<'_>,
    spec: &str,
    recursive: bool,
    force: bool,
) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let snapshots = store.snapshots(volume).map(|s| s.len()).unwrap_or(0);
    if force {
        store.destroy_volume_discarding_log(volume, recursive).await?;
    } else {
        store.destroy_volume_with(volume, recursive).await?;
    }
    store.release().await?;
    if snapshots > 0 {
        ctx.done(format!("destroyed volume {spec} and its {snapshots} snapshot(s)"));
    } else {
        ctx.done(format!("destroyed volume {spec}"));
    }
    Ok(())
}

/// `vol rollback POOL/VOL@SNAP [-r]`.
pub async fn rollback(ctx: &mut Ctx<'_>, spec: &str, recursive: bool) -> anyhow::Result<()> {
    let (pool, volume, snapshot) = split_snapshot(spec)?;
    let store = ctx.hold(pool).await?;
    store.rollback_volume(volume, snapshot, recursive).await?;
    store.release().await?;
    ctx.done(format!("rolled volume {pool}/{volume} back to {spec}"));
    Ok(())
}

/// `vol promote POOL/VOL`.
pub async fn promote(ctx: &mut Ctx<'_>, spec: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.promote_volume(volume).await?;
    let moved: Vec<String> = store.snapshots(volume)?.into_iter().map(|s| s.name).collect();
    store.release().await?;
    ctx.done(format!("promoted {spec}; its snapshots now: {}", moved.join(", ")));
    Ok(())
}

pub async fn rename(ctx: &mut Ctx<'_>, spec: &str, to: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let new = name_in_pool(to, pool, spec, "a volume is renamed within its pool")?;
    let store = ctx.hold(pool).await?;
    store.rename_volume(volume, new).await?;
    store.release().await?;
    ctx.done(format!("renamed volume {spec} to {pool}/{new}"));
    Ok(())
}

pub async fn resize(ctx: &mut Ctx<'_>, spec: &str, size: u64) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.resize_volume(volume, size).await?;
    store.release().await?;
    ctx.done(format!("resized volume {spec} to {}", human(size)));
    Ok(())
}

/// `vol get POOL/VOL [PROPERTY...]`: every property, or the ones named, in the order asked
/// for (as zfs get prints them).
pub async fn get(ctx: &mut Ctx<'_>, spec: &str, wanted: &[String]) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let token = store
        .interrupted_receives()
        .into_iter()
        .find(|(target, _)| target == volume)
        .map_or_else(|| "-".to_owned(), |(_, token)| token.encode());
    let text = |value: &str| PropValue::Text(value.to_owned());
    if wanted.len() == 1
        && wanted[0] == "receive_resume_token"
        && store.volume_info(volume).is_none()
    {
        // A full stream's target does not exist until it is whole; its token does.
        store.release().await?;
        let property = VolProp { name: wanted[0].clone(), value: text(&token) };
        ctx.say(Reply::VolProps(VolProps { name: spec.to_owned(), properties: vec![property] }));
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
    let crypt = key::properties(&store, pool, volume);
    store.release().await?;
    let space = entry.space.unwrap_or_default();
    let all: Vec<(&str, PropValue)> = vec![
        ("volsize", PropValue::Bytes(entry.size_bytes)),
        ("volblocksize", PropValue::Bytes(u64::from(entry.block_bytes))),
        ("used", PropValue::Bytes(used_bytes(&entry, &snapshots))),
        ("usedbysnapshots", PropValue::Bytes(snapshots.snapshots_bytes)),
        ("written", PropValue::Bytes(snapshots.written_bytes)),
        ("available", PropValue::Bytes(available)),
        ("referenced", PropValue::Bytes(space.referenced_bytes)),
        ("logicalreferenced", PropValue::Bytes(space.logical_bytes)),
        (
            "refreservation",
            match entry.reservation_bytes {
                0 => text("none"),
                bytes => PropValue::Bytes(bytes),
            },
        ),
        ("compression", PropValue::Text(entry.compression.name())),
        (
            "compressratio",
            PropValue::Text(format!("{:.2}x", ratio(space.logical_bytes, space.physical_bytes))),
        ),
        ("dedup", text(entry.dedup.name())),
        ("sync", text(entry.sync.name())),
        ("logbias", text(entry.logbias.name())),
        ("snapshot.schedule", PropValue::Text(schedule_text(&entry.snapshot_schedule))),
        ("origin", PropValue::Text(origin.unwrap_or_else(|| "-".to_owned()))),
        ("receive_resume_token", PropValue::Text(token)),
    ]
    .into_iter()
    .chain(crypt.into_iter().map(|(name, value)| (name, PropValue::Text(value))))
    .collect();
    for name in wanted {
        if !all.iter().any(|(p, _)| p == name) {
            let names: Vec<&str> = all.iter().map(|(p, _)| *p).collect();
            anyhow::bail!(
                "volume property {name:?} does not exist; the properties are {}",
                names.join(", ")
            );
        }
    }
    let shown: Vec<VolProp> = if wanted.is_empty() {
        all.into_iter().map(|(name, value)| VolProp { name: name.to_owned(), value }).collect()
    } else {
        (wanted.iter())
            .filter_map(|w| all.iter().find(|(p, _)| p == w))
            .map(|(name, value)| VolProp { name: (*name).to_owned(), value: value.clone() })
            .collect()
    };
    ctx.say(Reply::VolProps(VolProps { name: spec.to_owned(), properties: shown }));
    Ok(())
}

/// `vol list`: the volumes of each named pool, then its interrupted receives.
pub async fn list(ctx: &mut Ctx<'_>, pools: &[String]) -> anyhow::Result<()> {
    let mut entries = Vec::new();
    for name in pools {
        let store = ctx.hold(name).await?;
        for volume in store.volumes() {
            // A receive's hidden volume shows as its target's resume token, below.
            if volume.name.starts_with(RECEIVE_PREFIX) {
                continue;
            }
            let space = volume.space.unwrap_or_default();
            // Space as this volume's blocks use it: on RAID-Z, net of the parity and padding
            // its block size costs (as `zfs list` deflates, for the volume's own block size).
            let usable = |raw: u64| store.pool().deflate(raw, u64::from(volume.block_bytes));
            entries.push(VolEntry::Volume(VolRow {
                name: format!("{name}/{}", volume.name),
                size_bytes: volume.size_bytes,
                used_bytes: usable(used_bytes(&volume, &store.snapshot_space(&volume.name)?)),
                available_bytes: usable(store.available_bytes(Some(&volume.name))?),
                referenced_bytes: usable(space.referenced_bytes),
                reservation_bytes: usable(volume.reservation_bytes),
                logical_bytes: space.logical_bytes,
                physical_bytes: space.physical_bytes,
                block_bytes: u64::from(volume.block_bytes),
                compression: volume.compression.name(),
                compress_ratio: ratio_hundredths(space.logical_bytes, space.physical_bytes),
                dedup: volume.dedup.name().to_owned(),
                sync: volume.sync.name().to_owned(),
                logbias: volume.logbias.name().to_owned(),
                keystatus: key::status_text(
                    store.key_status(&volume.name).unwrap_or(sluice_engine::KeyStatus::None),
                )
                .to_owned(),
            }));
        }
        for (target, token) in store.interrupted_receives() {
            entries.push(VolEntry::Interrupted(InterruptedReceive {
                name: format!("{name}/{target}"),
                receive_resume_token: token.encode(),
                received_blocks: token.next_block,
            }));
        }
        store.release().await?;
    }
    ctx.say(Reply::VolList(VolList { entries }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `vol set`'s NAME=VALUE, and the words of each property; refusals name what exists.
    #[test]
    fn settings_parse() {
        assert_eq!(parse_setting("sync=always").unwrap(), VolumeProperty::Sync(SyncMode::Always));
        assert_eq!(
            parse_setting("logbias=throughput").unwrap(),
            VolumeProperty::LogBias(LogBias::Throughput)
        );
        assert_eq!(
            parse_setting("dedup=verify").unwrap(),
            VolumeProperty::Dedup(DedupMode::Verify)
        );
        let zstd = parse_setting("compress=zstd-7").unwrap();
        assert_eq!(zstd, VolumeProperty::Compression(Compression::parse("zstd-7").unwrap()));
        assert_eq!(property_text(zstd), "compression=zstd-7");
        let bad = parse_setting("compression=gzip").unwrap_err().to_string();
        assert!(bad.contains("zstd-1 to zstd-19"), "{bad}");
        let unknown = parse_setting("colour=red").unwrap_err().to_string();
        assert!(unknown
            .contains("settable ones are dedup, sync, logbias, compression and snapshot.schedule"));
        assert!(parse_setting("sync").unwrap_err().to_string().contains("NAME=VALUE"));
        assert!(parse_sync("sometimes").is_err() && parse_dedup("maybe").is_err());
    }
}
