//! How the allocator places a txg sync's blocks on a pool that random writes have aged
//! (`sluice-bench alloc`): the engine's own [`Allocator`], driven as the txg sync drives it,
//! with no I/O. A volume is written whole, in order, then txg after txg rewrites blocks chosen
//! at random; each txg's blocks go in offset order, cut into spans of a write's bytes
//! ([`run_pieces`] and [`Allocator::allocate_span`], as `zio::allocate` does), their old places
//! are freed in that txg, and the txg is marked synced, which ends the deferral of the frees of
//! the txg `FREE_DEFER_TXGS` before it. A run of blocks placed back to back, joined across
//! spans up to a span's bytes as `zio::issue_placed` joins them ([`span_runs`]), is one
//! device write (the leaf's queue may merge neighbouring runs further, up to its aggregation
//! limit); the figure is how many bytes each such write carries once the layout has settled.
//!
//! Why a benchmark of its own: on a pool half full, the sync's writes are small and many, and
//! every log flush that follows a burst of them waits for the device to write them back (the
//! flush tail of many clients: docs/bench/peers-notes.md, 2026-12-02). On a disk that writes
//! three times faster from one minute to the next, how an allocation policy changes the
//! layout cannot be seen beside the noise; here it is exact and takes seconds.
//!
//! What it leaves out: the indirect blocks and space maps a sync also writes (a few percent of
//! its bytes for 16 KiB data blocks), their ditto copies, and the intent log's blocks, which
//! live in the log region that data avoids.

use serde::Serialize;
use sluice_engine::alloc::{run_pieces, AllocClass, Allocator, Place};
use sluice_engine::zio::{span_runs, WRITE_SPAN_BYTES_MAX};

/// A new pool's allocation unit (`pool create`'s default ashift).
const ASHIFT: u8 = 12;
/// The prefill's txgs: what a sync starts at when the dirty data is a quarter of its bound on
/// a machine of a few GiB (`txg.dirty_max=auto`'s floor).
const PREFILL_TXG_BYTES: u64 = 256 << 20;

/// One leaf size's run.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub leaf_bytes: u64,
    /// The volume over the data area outside the log region.
    pub fill: f64,
    /// Bytes per device write, over the txgs of the second half of the run: their bytes over
    /// their writes.
    pub write_bytes_mean: f64,
    /// Each txg's bytes per write, the median txg's and the lowest txg's.
    pub write_bytes_median: f64,
    pub write_bytes_min: f64,
    /// Device writes per MiB of blocks, over the second half.
    pub writes_per_mib: f64,
    /// Free bytes at the end, the log region's included.
    pub free_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub volume_bytes: u64,
    pub block_bytes: u64,
    pub writes_per_txg: u64,
    pub txgs: u64,
    pub seed: u64,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "The engine's allocator, no I/O: a volume of {} MiB in {} KiB blocks written in \
             order, then {} txgs of {} blocks rewritten at random (seed {}); the figures are \
             the device writes of the last {} txgs (blocks placed back to back are one write, \
             up to a span's bytes, as the txg sync issues them).\n\n| leaf | volume / data area | KiB per write, mean | median txg | \
             lowest txg | writes per MiB | free at the end |\n\
             |---:|---:|---:|---:|---:|---:|---:|\n",
            self.volume_bytes >> 20,
            self.block_bytes >> 10,
            self.txgs,
            self.writes_per_txg,
            self.seed,
            self.txgs - self.txgs / 2,
        );
        for row in &self.rows {
            out += &format!(
                "| {} MiB | {:.2} | {:.0} | {:.0} | {:.0} | {:.1} | {} MiB |\n",
                row.leaf_bytes >> 20,
                row.fill,
                row.write_bytes_mean / 1024.0,
                row.write_bytes_median / 1024.0,
                row.write_bytes_min / 1024.0,
                row.writes_per_mib,
                row.free_bytes >> 20,
            );
        }
        out
    }
}

/// splitmix64: the block each rewrite picks, the same for every leaf size of a run.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Runs each of `leaf_sizes` (bytes).
pub fn run(
    leaf_sizes: &[u64],
    volume_bytes: u64,
    block_bytes: u64,
    writes_per_txg: u64,
    txgs: u64,
    seed: u64,
) -> anyhow::Result<Report> {
    anyhow::ensure!(
        block_bytes.is_power_of_two() && block_bytes >= 1 << ASHIFT,
        "--block-size must be a power of two of at least 4K"
    );
    anyhow::ensure!(volume_bytes >= block_bytes, "--volume must hold a block");
    anyhow::ensure!(writes_per_txg > 0 && txgs >= 2, "--writes-per-txg and --txgs (at least 2)");
    let rows = leaf_sizes
        .iter()
        .map(|&leaf| one(leaf, volume_bytes, block_bytes, writes_per_txg, txgs, seed))
        .collect::<anyhow::Result<_>>()?;
    Ok(Report { volume_bytes, block_bytes, writes_per_txg, txgs, seed, rows })
}

fn one(
    leaf_bytes: u64,
    volume_bytes: u64,
    block_bytes: u64,
    writes_per_txg: u64,
    txgs: u64,
    seed: u64,
) -> anyhow::Result<Row> {
    let area = (sluice_format::DATA_START_BYTES, sluice_format::data_end_bytes(leaf_bytes));
    anyhow::ensure!(area.1 > area.0, "a leaf of {leaf_bytes} bytes has no data area");
    let mut allocator = Allocator::new(ASHIFT, &[area]);
    let log_region = sluice_engine::alloc::log_region_bytes(area.1 - area.0);
    let fill = volume_bytes as f64 / (area.1 - area.0 - log_region) as f64;
    let blocks = volume_bytes / block_bytes;
    let mut places: Vec<Place> = Vec::with_capacity(blocks as usize);
    let mut txg = 1;
    let no_room = |leaf: u64, txg: u64| {
        format!(
            "a leaf of {} MiB has no room for the txg {txg} it was given; give it more room \
             beside the volume",
            leaf >> 20
        )
    };
    // The volume written whole, in order.
    let per_txg = (PREFILL_TXG_BYTES / block_bytes).max(1);
    for first in (0..blocks).step_by(per_txg as usize) {
        let count = per_txg.min(blocks - first) as usize;
        let placed = place(&mut allocator, &vec![block_bytes; count])
            .ok_or_else(|| anyhow::anyhow!(no_room(leaf_bytes, txg)))?;
        places.extend(placed);
        allocator.synced(txg);
        txg += 1;
    }
    let mut random = Random(seed);
    let mut sizes = Vec::new();
    let (mut bytes_total, mut writes_total) = (0u64, 0u64);
    for round in 0..txgs {
        let mut chosen: Vec<u64> = (0..writes_per_txg).map(|_| random.next() % blocks).collect();
        chosen.sort_unstable();
        chosen.dedup();
        let placed = place(&mut allocator, &vec![block_bytes; chosen.len()])
            .ok_or_else(|| anyhow::anyhow!(no_room(leaf_bytes, txg)))?;
        let writes = span_runs(&placed, WRITE_SPAN_BYTES_MAX).len() as u64;
        for (&block, at) in chosen.iter().zip(placed) {
            let old = std::mem::replace(&mut places[block as usize], at);
            allocator.free(txg, old.0, old.1, old.2);
        }
        allocator.synced(txg);
        txg += 1;
        if round >= txgs / 2 {
            let bytes = chosen.len() as u64 * block_bytes;
            sizes.push(bytes as f64 / writes as f64);
            bytes_total += bytes;
            writes_total += writes;
        }
    }
    let mean = bytes_total as f64 / writes_total as f64;
    let mut sorted = sizes.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(Row {
        leaf_bytes,
        fill,
        write_bytes_mean: mean,
        write_bytes_median: sorted[sorted.len() / 2],
        write_bytes_min: sorted[0],
        writes_per_mib: (1 << 20) as f64 / mean,
        free_bytes: allocator.free_bytes(),
    })
}

/// Places `psizes` as the txg sync does, in order. `None` when the pool is out of room.
fn place(allocator: &mut Allocator, psizes: &[u64]) -> Option<Vec<Place>> {
    let mut out = Vec::with_capacity(psizes.len());
    for piece in run_pieces(psizes, WRITE_SPAN_BYTES_MAX) {
        out.extend(allocator.allocate_span(&psizes[piece], AllocClass::Normal).ok()?);
    }
    Some(out)
}
