//! Seed experiments and peer comparisons (docs/bench/).
//!
//! Each seed experiment builds the seed's setup from simulated devices, runs it in virtual time
//! under the deterministic simulator (so a figure is exactly repeatable and a minute of eight
//! disks costs milliseconds), and returns a report that renders as a markdown table in the
//! seed's layout, with the seed's published figures beside ours, or as JSON.

pub mod alloc;
pub mod compress;
pub mod crypt;
pub mod engine;
pub mod raidz;
pub mod seeds;

/// Runs `op` repeatedly for `seconds` of real time; gigabytes a second, given `bytes` per call.
/// The one-core measurements (`sluice-bench raidz`, `crypt` and `compress`) use it.
pub fn rate_gb_per_s(bytes: u64, seconds: f64, mut op: impl FnMut()) -> f64 {
    let start = std::time::Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < std::time::Duration::from_secs_f64(seconds) {
        op();
        calls += 1;
    }
    (calls * bytes) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// The runs' range as the tables print it: `min-max`, two decimals.
pub fn range_of(runs: &[f64]) -> String {
    let min = runs.iter().copied().fold(f64::MAX, f64::min);
    let max = runs.iter().copied().fold(0.0, f64::max);
    format!("{min:.2}-{max:.2}")
}

/// The median of `runs` (the upper one of an even count).
pub fn median_of(runs: &[f64]) -> f64 {
    let mut sorted = runs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

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
