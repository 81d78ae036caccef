//! `sluice pool get`, `pool set` and `pool upgrade` (zpool get, zpool set, zpool upgrade): the
//! pool's properties, and its optional format features. Settable:
//! `scrub.interval` (how long after the last finished scrub the served pool starts the next;
//! `off` for never) and `autoreplace` (a new device at a faulted leaf's path replaces it). Read only: size, allocated, free, capacity, health, guid, the last
//! scrub's end and when the next is due, and the format features the pool uses. The engine
//! keeps them (crate `sluice_engine`'s pool properties); this module reads and writes their
//! words.

use anyhow::Context;
use sluice_engine::Store;
use sluice_format::{feature_description, FEATURES_KNOWN, FEATURES_UPGRADABLE};

use super::output::{utc, PropValue, Reply, VolProp, VolProps};
use super::Ctx;

/// The properties `pool get` shows, in its order.
pub const PROPERTIES: &[&str] = &[
    "size",
    "allocated",
    "free",
    "capacity",
    "health",
    "guid",
    "autoreplace",
    "scrub.interval",
    "scrub.last",
    "scrub.next",
    "features",
];

/// A duration as `scrub.interval` takes it: a whole number with a unit, `s`, `m`, `h`, `d` or
/// `w` (`30d`, `12h`), or `off`. At least a minute, the schedule's resolution; at most ten
/// years.
pub fn parse_interval(value: &str) -> anyhow::Result<u64> {
    if matches!(value, "off" | "none" | "0") {
        return Ok(0);
    }
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => anyhow::bail!(
            "scrub.interval: {value:?} is not a number with a unit s, m, h, d or w (like 30d or \
             12h), or off"
        ),
    };
    let secs =
        number.parse::<u64>().ok().and_then(|n| n.checked_mul(unit_secs)).with_context(|| {
            format!("scrub.interval: {value:?} is not a whole number of {unit}")
        })?;
    anyhow::ensure!(
        (60..=3_650 * 86_400).contains(&secs),
        "scrub.interval: {value} is out of range: from 1m (checks run once a minute) to 3650d, \
         or off"
    );
    Ok(secs)
}

/// An interval in the largest unit that divides it (`30d`, `90m`), or `off`.
pub fn interval_text(secs: u64) -> String {
    if secs == 0 {
        return "off".to_owned();
    }
    for (unit, unit_secs) in [("w", 7 * 86_400), ("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs % unit_secs == 0 {
            return format!("{}{unit}", secs / unit_secs);
        }
    }
    format!("{secs}s")
}

/// `pool set POOL NAME=VALUE`.
pub async fn set(ctx: &mut Ctx<'_>, name: &str, setting: &str) -> anyhow::Result<()> {
    let (property, value) = setting.split_once('=').with_context(|| {
        format!("{setting:?} is not NAME=VALUE (for example scrub.interval=7d)")
    })?;
    match property {
        "scrub.interval" => {
            let secs = parse_interval(value)?;
            let store = ctx.hold(name).await?;
            store.set_scrub_interval(secs).await?;
            store.release().await?;
            ctx.done(if secs == 0 {
                format!("pool {name}: scrub.interval=off; no scrub starts by itself")
            } else {
                format!(
                    "pool {name}: scrub.interval={}; while served, a scrub starts that long after \
                     the last one finished",
                    interval_text(secs)
                )
            });
            Ok(())
        }
        "autoreplace" => {
            let on = match value {
                "on" => true,
                "off" => false,
                _ => anyhow::bail!("autoreplace is on or off, not {value:?}"),
            };
            let store = ctx.hold(name).await?;
            store.set_autoreplace(on).await?;
            store.release().await?;
            ctx.done(if on {
                format!(
                    "pool {name}: autoreplace=on; while served, a new empty device found at a \
                     faulted or missing leaf's path replaces it"
                )
            } else {
                format!("pool {name}: autoreplace=off")
            });
            Ok(())
        }
        other if PROPERTIES.contains(&other) => anyhow::bail!(
            "pool property {other} is read only; the settable ones are autoreplace and \
             scrub.interval"
        ),
        other => anyhow::bail!(
            "pool property {other:?} does not exist; the properties are {} (settable: \
             autoreplace, scrub.interval)",
            PROPERTIES.join(", ")
        ),
    }
}

/// `pool upgrade POOL` (zpool upgrade): enables every optional feature the pool lacks; with
/// `list_only`, says what it lacks instead (the listing of `pool upgrade` without a pool).
pub async fn upgrade(ctx: &mut Ctx<'_>, names: &[String], list_only: bool) -> anyhow::Result<()> {
    for name in names {
        let store = ctx.hold(name).await?;
        let result = if list_only {
            Ok(store.pool().features_disabled())
        } else {
            store.enable_features().await
        };
        store.release().await?;
        let features = result.with_context(|| format!("upgrading pool {name}"))?;
        ctx.done(match (list_only, &features[..]) {
            (_, []) => {
                format!("pool {name}: every optional feature this build supports is enabled")
            }
            (true, lacking) => format!(
                "pool {name}: not enabled: {}; `sluice pool upgrade {name}` enables {} (sluice \
                 builds that do not know {} then refuse the pool)",
                lacking.join(", "),
                if lacking.len() == 1 { "it" } else { "them" },
                if lacking.len() == 1 { "it" } else { "them" },
            ),
            (false, enabled) => format!(
                "pool {name}: enabled {}; sluice builds that do not know {} refuse the pool from \
                 now on",
                enabled.join(", "),
                if enabled.len() == 1 { "it" } else { "them" },
            ),
        });
    }
    Ok(())
}

/// `pool upgrade -v`: the features this build knows, each with what it is, those `pool
/// upgrade` enables marked.
pub fn features_text() -> String {
    let mut text = String::from(
        "Format features this build knows. A pool lists those it uses; builds that do not know\n\
         one refuse a pool that lists it, by its name. `pool upgrade` enables those marked *\n\
         on a pool made without them; the others are listed when the pool first uses them.\n\n",
    );
    let width = FEATURES_KNOWN.iter().map(|f| f.len()).max().unwrap_or(0);
    for name in FEATURES_KNOWN {
        let mark = if FEATURES_UPGRADABLE.contains(name) { '*' } else { ' ' };
        let about = feature_description(name).unwrap_or("");
        text.push_str(&format!("{mark} {name:width$}  {about}\n"));
    }
    text
}

/// `pool get POOL [NAME...]`.
pub async fn get(ctx: &mut Ctx<'_>, name: &str, wanted: &[String]) -> anyhow::Result<()> {
    for property in wanted {
        anyhow::ensure!(
            PROPERTIES.contains(&property.as_str()),
            "pool property {property:?} does not exist; the properties are {}",
            PROPERTIES.join(", ")
        );
    }
    let store = ctx.hold(name).await?;
    let all = values(&store, ctx.live.is_some());
    store.release().await?;
    let shown = (PROPERTIES.iter().zip(all))
        .filter(|(property, _)| wanted.is_empty() || wanted.iter().any(|w| w == *property))
        .map(|(property, value)| VolProp { name: (*property).to_owned(), value })
        .collect();
    ctx.say(Reply::VolProps(VolProps { name: name.to_owned(), properties: shown }));
    Ok(())
}

/// Every property's value, in [`PROPERTIES`] order; `served` says whether this process serves
/// the pool (the schedule runs only then).
fn values(store: &Store, served: bool) -> Vec<PropValue> {
    let pool = store.pool();
    let properties = pool.properties();
    let size = pool.data_capacity_bytes();
    let free = store.free_bytes();
    let allocated = size.saturating_sub(free);
    let text = |s: String| PropValue::Text(s);
    let last = store.last_scrub_end_unix_secs();
    let next = match (properties.scrub_interval_secs, last) {
        (0, _) => "off".to_owned(),
        (interval, Some(last)) => utc(last + interval),
        (interval, None) if served => {
            format!("{} after this server began serving", interval_text(interval))
        }
        (interval, None) => format!("{} after the pool is served", interval_text(interval)),
    };
    let features = pool.config().features();
    vec![
        PropValue::Bytes(size),
        PropValue::Bytes(allocated),
        PropValue::Bytes(free),
        text(format!("{}%", (allocated * 100).checked_div(size).unwrap_or(0))),
        text(super::pool::pool_health(store).to_owned()),
        text(format!("{:016x}", pool.guid())),
        text(if properties.autoreplace { "on" } else { "off" }.to_owned()),
        text(interval_text(properties.scrub_interval_secs)),
        text(last.map_or_else(|| "-".to_owned(), utc)),
        text(if store.is_suspended() { "suspended".to_owned() } else { next }),
        text(if features.is_empty() { "-".to_owned() } else { features.join(",") }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_read_and_print_in_units() {
        assert_eq!(parse_interval("30d").ok(), Some(30 * 86_400));
        assert_eq!(parse_interval("12h").ok(), Some(12 * 3_600));
        assert_eq!(parse_interval("2w").ok(), Some(14 * 86_400));
        assert_eq!(parse_interval("off").ok(), Some(0));
        for bad in ["", "30", "d", "30x", "-1d", "30s", "3651d", "99999999999999999999d"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
        assert_eq!(interval_text(30 * 86_400), "30d");
        assert_eq!(interval_text(14 * 86_400), "2w");
        assert_eq!(interval_text(90 * 60), "90m");
        assert_eq!(interval_text(61), "61s");
        assert_eq!(interval_text(0), "off");
    }
}
