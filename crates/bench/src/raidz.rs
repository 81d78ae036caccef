//! RAID-Z's parity code on this CPU (`sluice-bench raidz`): how many bytes of data a second
//! its parity generation and rebuild go through, by each path the CPU runs (`ParityPath`) and
//! by the byte-at-a-time reference they are checked against, for 1 MiB blocks laid out as
//! RAID-Z vdevs lay them out. One core, no I/O: the figures are the code's ceiling, not a
//! pool's.

use sluice_format::raidz::{
    generate_parity, generate_parity_with, reconstruct, reference, ParityPath, RaidzGeometry,
};

/// One measured operation on one geometry.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub vdev: String,
    pub operation: String,
    /// Bytes of block data per second, median of the runs.
    pub gb_per_s: f64,
    /// Each run's figure.
    pub runs: Vec<f64>,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub block_bytes: u64,
    pub seconds_per_run: f64,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Blocks of {} KiB, one core, {} runs of {:.1} s each; GB/s of block data, median \
             (range).\n\n| vdev | operation | GB/s | range |\n|---|---|---:|---|\n",
            self.block_bytes >> 10,
            self.rows.first().map_or(0, |r| r.runs.len()),
            self.seconds_per_run
        );
        for row in &self.rows {
            let range = crate::range_of(&row.runs);
            out +=
                &format!("| {} | {} | {:.2} | {range} |\n", row.vdev, row.operation, row.gb_per_s);
        }
        out
    }
}

fn path_name(path: ParityPath) -> &'static str {
    match path {
        ParityPath::Avx2 => "AVX2",
        ParityPath::Portable => "portable (the target's baseline, SSE2 on x86-64)",
    }
}

/// A block's columns: the map's sizes, data filled with varied bytes.
fn columns(g: &RaidzGeometry, block_bytes: u64) -> (Vec<Vec<u8>>, usize) {
    let map = g.map(0, block_bytes);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut columns: Vec<Vec<u8>> = map
        .columns
        .iter()
        .map(|c| {
            (0..c.size)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        })
        .collect();
    let (parity, data) = columns.split_at_mut(map.parity);
    let data: Vec<&[u8]> = data.iter().map(|c| &c[..]).collect();
    let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|c| &mut c[..]).collect();
    generate_parity(&data, &mut parity);
    (columns, map.parity)
}

/// Measures raidz1 of 4, raidz2 of 6 and raidz3 of 8 children: parity generation (each path
/// this CPU runs, and the reference), and the rebuild of one and of `parity` lost data columns.
pub fn run(block_bytes: u64, seconds: f64, runs: usize) -> anyhow::Result<Report> {
    let mut rows = Vec::new();
    for (width, parity) in [(4, 1), (6, 2), (8, 3)] {
        let g = RaidzGeometry::new(width, parity, 12)?;
        let vdev = format!("raidz{parity} of {width}");
        let (whole, p) = columns(&g, block_bytes);
        let mut measure = |operation: String, op: &mut dyn FnMut()| {
            let figures: Vec<f64> =
                (0..runs).map(|_| crate::rate_gb_per_s(block_bytes, seconds, &mut *op)).collect();
            rows.push(Row {
                vdev: vdev.clone(),
                operation,
                gb_per_s: crate::median_of(&figures),
                runs: figures,
            });
        };
        let mut work = whole.clone();
        let mut generate = |path: Option<ParityPath>| {
            let (parity, data) = work.split_at_mut(p);
            let data: Vec<&[u8]> = data.iter().map(|c| &c[..]).collect();
            let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|c| &mut c[..]).collect();
            match path {
                Some(path) => generate_parity_with(path, &data, &mut parity),
                None => reference::generate_parity(&data, &mut parity),
            }
        };
        for path in [ParityPath::Avx2, ParityPath::Portable] {
            if path.available() {
                measure(format!("parity, {}", path_name(path)), &mut || generate(Some(path)));
            }
        }
        measure("parity, byte reference".into(), &mut || generate(None));
        let losts = if p == 1 { vec![1] } else { vec![1, p] };
        for lost in losts {
            let targets: Vec<usize> = (p..p + lost).collect();
            let mut work = whole.clone();
            let mut rebuild = || {
                let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|c| &mut c[..]).collect();
                reconstruct(&mut refs, p, &targets).expect("no more lost than parity");
            };
            measure(
                format!("rebuild {lost} data column{}", if lost == 1 { "" } else { "s" }),
                &mut rebuild,
            );
            anyhow::ensure!(work == whole, "{vdev}: the rebuild of {lost} columns was wrong");
        }
    }
    Ok(Report { block_bytes, seconds_per_run: seconds, rows })
}
