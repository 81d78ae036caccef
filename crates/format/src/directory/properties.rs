//! What a V8 pool directory adds (ZFS keeps the like in the MOS's pool property object, and
//! leaves schedules to tools outside the pool; sluice keeps them in the pool so that they move
//! with it): the pool's properties, each volume's snapshot schedule, and which snapshots a
//! schedule took.
//!
//! ```text
//! pool properties, at the end of the directory (24 bytes):
//!   0 flags u8 (bit 0 autoreplace; the rest zero)   1 reserved 7 (zero)
//!   8 scrub_interval_secs u64 (0: no scheduled scrubs)
//!  16 last_scrub_end_secs u64 (wall clock, UTC; 0: none finished)
//! each volume's schedule, after its V7 fields:
//!   rule_count u8 (at most one rule per period), per rule: period u8 (0 minutely, 1 hourly,
//!   2 daily, 3 weekly, 4 monthly), reserved u8 (zero), keep u16 (1 to 1000)
//! each snapshot's byte at offset 41 (reserved before V8): bit 0 taken by the schedule
//! ```
//!
//! A directory is written at V8 only when its config lists the feature `pool_properties`
//! (crate::label), so that an older build refuses the pool by that name before it reads a
//! directory it would misread.

use crate::codec::{Reader, Writer};
use crate::FormatError;

const WHAT: &str = "pool directory";
pub(super) const PROPERTIES_BYTES: usize = 24;
pub(super) const RULE_BYTES: usize = 4;
const AUTOREPLACE_BIT: u8 = 1;
/// Bit 0 of a snapshot's flags byte: a schedule took it.
pub(super) const SNAPSHOT_AUTOMATIC_BIT: u8 = 1;
/// The most snapshots one rule keeps.
pub const SCHEDULE_KEEP_MAX: u16 = 1000;

/// The pool's properties (ZFS: `zpool get`), as of the txg.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolProperties {
    /// A new device found at a faulted leaf's path replaces it.
    pub autoreplace: bool,
    /// A scrub starts once this long has passed since the last one finished; 0: never by
    /// itself.
    pub scrub_interval_secs: u64,
    /// When the last scrub that ran to its end finished (Unix seconds, UTC); 0: none has.
    pub last_scrub_end_secs: u64,
}

/// Thirty days: a scrub a month, as distributions' scrub timers run OpenZFS's.
pub const SCRUB_INTERVAL_DEFAULT_SECS: u64 = 30 * 86_400;

impl Default for PoolProperties {
    fn default() -> PoolProperties {
        PoolProperties {
            autoreplace: false,
            scrub_interval_secs: SCRUB_INTERVAL_DEFAULT_SECS,
            last_scrub_end_secs: 0,
        }
    }
}

impl PoolProperties {
    pub(super) fn encode_into(&self, w: &mut Writer<'_>, at: usize) -> usize {
        w.u8(at, if self.autoreplace { AUTOREPLACE_BIT } else { 0 });
        w.u64(at + 8, self.scrub_interval_secs);
        w.u64(at + 16, self.last_scrub_end_secs);
        at + PROPERTIES_BYTES
    }

    pub(super) fn decode_from(r: &Reader<'_>, at: usize) -> Result<PoolProperties, FormatError> {
        let flags = r.u8(at)?;
        if flags & !AUTOREPLACE_BIT != 0 {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "pool property flags",
                value: u64::from(flags),
            });
        }
        r.zeros(at + 1, 7)?;
        Ok(PoolProperties {
            autoreplace: flags & AUTOREPLACE_BIT != 0,
            scrub_interval_secs: r.u64(at + 8)?,
            last_scrub_end_secs: r.u64(at + 16)?,
        })
    }
}

/// How often a schedule snapshots a volume; also the periods its retention counts in (UTC:
/// hours, days, ISO weeks from Monday, calendar months).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SchedulePeriod {
    /// For tests and short-lived volumes.
    Minutely = 0,
    Hourly = 1,
    Daily = 2,
    Weekly = 3,
    Monthly = 4,
}

impl SchedulePeriod {
    pub const ALL: [SchedulePeriod; 5] = [
        SchedulePeriod::Minutely,
        SchedulePeriod::Hourly,
        SchedulePeriod::Daily,
        SchedulePeriod::Weekly,
        SchedulePeriod::Monthly,
    ];

    /// The name `snapshot.schedule` uses.
    pub fn name(self) -> &'static str {
        match self {
            SchedulePeriod::Minutely => "minutely",
            SchedulePeriod::Hourly => "hourly",
            SchedulePeriod::Daily => "daily",
            SchedulePeriod::Weekly => "weekly",
            SchedulePeriod::Monthly => "monthly",
        }
    }

    fn decode(byte: u8) -> Result<SchedulePeriod, FormatError> {
        (SchedulePeriod::ALL.into_iter().find(|p| *p as u8 == byte)).ok_or(FormatError::Invalid {
            what: WHAT,
            field: "schedule period",
            value: u64::from(byte),
        })
    }
}

/// One rule of a volume's snapshot schedule: a snapshot each period, the newest `keep`
/// periods' kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleRule {
    pub period: SchedulePeriod,
    pub keep: u16,
}

/// Checks a schedule as encode and decode both do: at most one rule per period, each keeping
/// 1 to [`SCHEDULE_KEEP_MAX`].
pub fn check_schedule(rules: &[ScheduleRule]) -> Result<(), FormatError> {
    for (i, rule) in rules.iter().enumerate() {
        if !(1..=SCHEDULE_KEEP_MAX).contains(&rule.keep) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "schedule keep (1 to 1000)",
                value: u64::from(rule.keep),
            });
        }
        if rules[..i].iter().any(|r| r.period == rule.period) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "schedule period (listed twice)",
                value: rule.period as u64,
            });
        }
    }
    Ok(())
}

pub(super) fn schedule_len(rules: &[ScheduleRule]) -> usize {
    1 + rules.len() * RULE_BYTES
}

pub(super) fn encode_schedule(
    rules: &[ScheduleRule],
    w: &mut Writer<'_>,
    at: usize,
) -> Result<usize, FormatError> {
    check_schedule(rules)?;
    // At most one rule per period: five.
    w.u8(at, rules.len() as u8);
    let mut at = at + 1;
    for rule in rules {
        w.u8(at, rule.period as u8);
        w.u16(at + 2, rule.keep);
        at += RULE_BYTES;
    }
    Ok(at)
}

pub(super) fn decode_schedule(
    r: &Reader<'_>,
    at: usize,
) -> Result<(Vec<ScheduleRule>, usize), FormatError> {
    let count = usize::from(r.u8(at)?);
    let mut at = at + 1;
    let mut rules = Vec::with_capacity(count.min(SchedulePeriod::ALL.len()));
    for _ in 0..count {
        let period = SchedulePeriod::decode(r.u8(at)?)?;
        r.zeros(at + 1, 1)?;
        rules.push(ScheduleRule { period, keep: r.u16(at + 2)? });
        at += RULE_BYTES;
    }
    check_schedule(&rules)?;
    Ok((rules, at))
}
