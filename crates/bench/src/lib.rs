//! Seed experiments and peer comparisons (DESIGN.md §7).
//!
//! Each seed experiment builds the seed's setup from simulated devices, runs it in virtual time
//! under the deterministic simulator (so a figure is exactly repeatable and a minute of eight
//! disks costs milliseconds), and returns a report that renders as a markdown table in the
//! seed's layout, with the seed's published figures beside ours, or as JSON.

pub mod seeds;

/// Percentage change from `before` to `after`.
pub fn gain_pct(before: f64, after: f64) -> f64 {
    if before == 0.0 {
        return 0.0;
    }
    (after - before) / before * 100.0
}
