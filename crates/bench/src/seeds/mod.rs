//! One module per seed experiment: `zvol` (seed 000), `ddt` (seed 001, in real time), `mirror`
//! (seed 002), `queue` (seed 003), `zil` (seed 004).

pub mod ddt;
pub mod mirror;
pub mod queue;
pub mod zil;
pub mod zvol;

use std::sync::Arc;

use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::rt::Env;
use sluice_engine::tunables::Tunables;
use sluice_engine::vdev::{Leaf, VdevId};

/// A timing-only leaf (no data kept) on a simulated device.
pub(crate) fn sim_leaf(
    env: &Env,
    id: u32,
    profile: SimProfile,
    len_bytes: u64,
    tunables: &Tunables,
) -> (Arc<Leaf>, SimDevice) {
    let device = SimDevice::new(
        env,
        &format!("sim{id}"),
        profile,
        len_bytes,
        SimOptions { store_data: false, record_log: false },
    );
    (Leaf::new(VdevId(id), env, Arc::new(device.clone()), tunables), device)
}
