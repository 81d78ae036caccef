//! Seed experiments and peer comparisons (docs/bench/).
//!
//! Each seed experiment builds the seed's setup from simulated devices, runs it in virtual time
//! under the deterministic simulator (so a figure is exactly repeatable and a minute of eight
//! disks costs milliseconds), and returns a report that renders as a markdown table in the
//! seed's layout, with the seed's published figures beside ours, or as JSON.

pub mod crypt;
pub mod engine;
pub mod raidz;
pub mod seeds;

/// Percentage change from `before` to `after`.
pub fn gain_pct(before: f64, after: f64) -> f64 {
    if before == 0.0 {
        return 0.0;
    }
    (after - before) / before * 100.0
}

/// Settings given on the command line, applied before the experiment's own.
pub type Settings = [(String, String)];

/// Tunables from `base` settings followed by an experiment's own.
pub fn tunables_with(
    base: &Settings,
    own: &[(&str, &str)],
) -> Result<sluice_engine::tunables::Tunables, sluice_engine::tunables::TunableError> {
    let all = base.iter().map(|(n, v)| (n.as_str(), v.as_str())).chain(own.iter().copied());
    sluice_engine::tunables::Tunables::with(all)
}
