//! RAID-Z vdevs on simulated disks: every block reads back with up to `parity` children
//! missing, returning garbage or with bits flipped; the wrong columns are found, counted on the
//! right leaf and rewritten; too much damage is a clear error after a bounded search; scrub
//! checks parity too; resilver rebuilds a stale child; flushes reach only written children.

use std::sync::Arc;

use sluice_engine::device::sim::{Fault, SimOptions};
use sluice_engine::device::{SharedBuf, SimDevice, SimProfile};
use sluice_engine::rt::Env;
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::vdev::{Leaf, LeafState, Raidz, VdevError, VdevId};
use sluice_format::raidz::RaidzGeometry;
use sluice_format::DATA_START_BYTES;
use sluice_sim::Sim;

const DEVICE_BYTES: u64 = 64 << 20;
const CHILD_END: u64 = DEVICE_BYTES - (1 << 20);

struct Vdev {
    raidz: Arc<Raidz>,
    devices: Vec<SimDevice>,
    /// (offset, data) of each block written.
    blocks: Vec<(u64, Vec<u8>)>,
}

fn raidz_of(env: &Env, width: u32, parity: u32) -> Vdev {
    let tunables = Tunables::default();
    let devices: Vec<SimDevice> = (0..width)
        .map(|i| {
            SimDevice::new(
                env,
                &format!("d{i}"),
                SimProfile::Instant,
                DEVICE_BYTES,
                SimOptions::default(),
            )
        })
        .collect();
    let ashift = sluice_engine::device::BlockDevice::sector_bytes(&devices[0]).trailing_zeros();
    let leaves: Vec<Arc<Leaf>> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| Leaf::new(VdevId(i as u32 + 1), env, Arc::new(d.clone()), &tunables))
        .collect();
    let geometry = RaidzGeometry::new(width, parity, ashift).expect("a valid geometry");
    let replacing = vec![None; leaves.len()];
    let raidz = Arc::new(Raidz::new(VdevId(0), geometry, leaves, replacing, CHILD_END));
    Vdev { raidz, devices, blocks: Vec::new() }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A checksum stand-in: the block must equal what was written.
fn expect(data: Vec<u8>) -> impl Fn(&[u8]) -> bool + Send + Sync {
    move |got: &[u8]| got == &data[..]
}

/// Block sizes from one sector (the simulated disks have 512-byte sectors) to many rows, and
/// ones that leave a short last row, so that parity lands on every child.
const SIZES: [usize; 10] = [512, 4096, 1536, 8192, 2560, 3 * 4096, 16384, 7 * 4096, 65536, 131072];

/// Writes a block of each size, one after another as an allocator would place them.
fn fill(sim: &Sim, vdev: &mut Vdev) {
    let (mut at, _) = vdev.raidz.data_area();
    for (i, &size) in SIZES.iter().enumerate() {
        let data = pattern(i as u64 + 1, size);
        let raidz = Arc::clone(&vdev.raidz);
        let buf = SharedBuf::copy_from(&data);
        sim.run(async move { raidz.write_flushed(at, buf, IoClass::AsyncWrite, false).await })
            .expect("the sim runs")
            .0
            .expect("the write succeeds");
        vdev.blocks.push((at, data));
        at += vdev.raidz.asize(size as u64);
    }
}

fn read(sim: &Sim, vdev: &Vdev, offset: u64, data: &[u8]) -> Result<Vec<u8>, VdevError> {
    let raidz = Arc::clone(&vdev.raidz);
    let check = expect(data.to_vec());
    let len = data.len() as u32;
    sim.run(
        async move { raidz.read(offset, len, IoClass::SyncRead, &check).await.map(|b| b.to_vec()) },
    )
    .expect("the sim runs")
    .0
}

fn read_all(sim: &Sim, vdev: &Vdev, what: &str) {
    for (offset, data) in &vdev.blocks {
        let got = read(sim, vdev, *offset, data)
            .unwrap_or_else(|e| panic!("{what}: block at {offset} of {}: {e}", data.len()));
        assert!(got == *data, "{what}: block at {offset} of {} reads back", data.len());
    }
}

/// Every combination of `k` of `n` items.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    (0..n)
        .flat_map(|first| {
            combinations(n - first - 1, k - 1).into_iter().map(move |rest| {
                std::iter::once(first).chain(rest.iter().map(|r| r + first + 1)).collect()
            })
        })
        .collect()
}

const SHAPES: [(u32, u32); 4] = [(3, 1), (4, 1), (6, 2), (7, 3)];

/// With any `parity` children gone, every block reads back, rebuilt from parity.
#[test]
fn every_block_reads_back_with_up_to_parity_children_gone() {
    for (width, parity) in SHAPES {
        let sim = Sim::new(u64::from(width * 10 + parity));
        let mut vdev = raidz_of(&sim.env(), width, parity);
        fill(&sim, &mut vdev);
        read_all(&sim, &vdev, &format!("raidz{parity} of {width}, all present"));
        for k in 1..=parity as usize {
            for gone in combinations(width as usize, k) {
                for &c in &gone {
                    vdev.raidz.children()[c].set_state(LeafState::Offline);
                }
                read_all(&sim, &vdev, &format!("raidz{parity} of {width}, {gone:?} offline"));
                for &c in &gone {
                    vdev.raidz.children()[c].set_state(LeafState::Online);
                }
            }
        }
        // One more than the parity: the error says the columns are missing.
        let gone = combinations(width as usize, parity as usize + 1).remove(0);
        for &c in &gone {
            vdev.raidz.children()[c].set_state(LeafState::Offline);
        }
        let (offset, data) = vdev.blocks.last().expect("blocks were written").clone();
        let error = read(&sim, &vdev, offset, &data).expect_err("too many children gone");
        assert!(matches!(error, VdevError::NotReconstructed { combinations: 0, .. }), "{error:?}");
        assert!(!error.is_definite_mismatch(), "missing columns are unknown, not wrong");
        assert!(error.to_string().contains("missing"), "{error}");
    }
}

/// Children that return another block's bytes (up to `parity` of them) are found by the
/// combinatorial search, counted on those leaves alone, and rewritten: a second read finds
/// nothing wrong.
#[test]
fn garbage_on_up_to_parity_children_is_found_counted_and_rewritten() {
    for (width, parity) in SHAPES {
        for k in 1..=parity as usize {
            for bad in combinations(width as usize, k) {
                let sim = Sim::new(u64::from(width * 100 + parity) + bad.len() as u64);
                let mut vdev = raidz_of(&sim.env(), width, parity);
                fill(&sim, &mut vdev);
                for &c in &bad {
                    vdev.devices[c].inject(Fault::Misdirect {
                        offset_bytes: DATA_START_BYTES,
                        len_bytes: 4 << 20,
                        from_offset_bytes: DATA_START_BYTES + (1 << 20) * (c as u64 + 1),
                    });
                }
                read_all(&sim, &vdev, &format!("raidz{parity} of {width}, garbage on {bad:?}"));
                // A read looks at data columns only: a child that holds no block's data is not
                // read (a scrub checks parity).
                let geometry = vdev.raidz.geometry();
                let holds_data = |c: usize| {
                    vdev.blocks.iter().any(|(offset, data)| {
                        let map = geometry.map(*offset, data.len() as u64);
                        map.data_columns().iter().any(|col| col.child as usize == c)
                    })
                };
                assert!(bad.iter().any(|&c| holds_data(c)), "the test damages data");
                for (c, leaf) in vdev.raidz.children().iter().enumerate() {
                    let errors = leaf.stats().checksum_errors.get();
                    if bad.contains(&c) && holds_data(c) {
                        assert!(errors > 0, "leaf {c} returned garbage and is counted");
                        assert!(leaf.stats().repairs.get() > 0, "leaf {c} was rewritten");
                    } else {
                        assert_eq!(errors, 0, "leaf {c} held good columns (garbage on {bad:?})");
                    }
                }
                for &c in &bad {
                    vdev.devices[c].clear_faults();
                }
                let before: u64 =
                    vdev.raidz.children().iter().map(|l| l.stats().checksum_errors.get()).sum();
                read_all(&sim, &vdev, "after the repair");
                let after: u64 =
                    vdev.raidz.children().iter().map(|l| l.stats().checksum_errors.get()).sum();
                assert_eq!(before, after, "the rewritten columns read back good");
            }
        }
    }
}

/// Bits flipped at random on one child (two on raidz2) are healed as they are read.
#[test]
fn random_bit_flips_heal() {
    for (width, parity) in [(4, 1), (6, 2)] {
        let sim = Sim::new(u64::from(width) * 7);
        let mut vdev = raidz_of(&sim.env(), width, parity);
        fill(&sim, &mut vdev);
        let mut x = 0x1234_5678u64 + u64::from(width);
        for c in 0..parity as usize {
            for _ in 0..64 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let offset = DATA_START_BYTES + (x >> 33) % (300 << 10);
                vdev.devices[c].inject(Fault::BitFlip { offset_bytes: offset, bit: (x & 7) as u8 });
            }
        }
        read_all(&sim, &vdev, "bit flips");
        for c in 0..parity as usize {
            vdev.devices[c].clear_faults();
        }
        read_all(&sim, &vdev, "after healing");
    }
}

/// More wrong columns than parity: every combination is tried, none verifies, and the error
/// says so; it is definite (every column was read) and nothing is rewritten.
#[test]
fn beyond_parity_is_a_clear_error_after_every_combination() {
    let sim = Sim::new(5);
    let mut vdev = raidz_of(&sim.env(), 6, 2);
    fill(&sim, &mut vdev);
    for c in 0..3 {
        vdev.devices[c].inject(Fault::Misdirect {
            offset_bytes: DATA_START_BYTES,
            len_bytes: 4 << 20,
            from_offset_bytes: DATA_START_BYTES + (8 << 20),
        });
    }
    let (offset, data) = vdev.blocks.last().expect("blocks were written").clone();
    let error = read(&sim, &vdev, offset, &data).expect_err("three wrong columns on raidz2");
    // A 128 KiB block spans all six columns: 1 + 6 + 15 combinations of up to two (the first
    // is the rebuild of none).
    assert!(
        matches!(error, VdevError::NotReconstructed { combinations: 22, gave_up: false, .. }),
        "{error:?}"
    );
    assert!(error.is_definite_mismatch());
    assert!(error.to_string().contains("22 tried"), "{error}");
    let repairs: u64 = vdev.raidz.children().iter().map(|l| l.stats().repairs.get()).sum();
    assert_eq!(repairs, 0, "nothing is rewritten from a block that did not verify");
}

/// A scrub reads parity too: a wrong parity column (which a read never looks at) is found and
/// rewritten, and a second scrub finds nothing.
#[test]
fn scrub_checks_and_repairs_parity() {
    let sim = Sim::new(9);
    let mut vdev = raidz_of(&sim.env(), 6, 2);
    fill(&sim, &mut vdev);
    let geometry = vdev.raidz.geometry();
    // Flip a bit in each block's first parity column.
    for (offset, data) in &vdev.blocks {
        let map = geometry.map(*offset, data.len() as u64);
        let p = map.columns[0];
        vdev.devices[p.child as usize]
            .inject(Fault::BitFlip { offset_bytes: p.offset + 3, bit: 5 });
    }
    read_all(&sim, &vdev, "parity is not read");
    let scrub = |vdev: &Vdev| {
        let mut total = (0u32, 0u32, false);
        for (offset, data) in &vdev.blocks {
            let raidz = Arc::clone(&vdev.raidz);
            let check = expect(data.clone());
            let (offset, len) = (*offset, data.len() as u32);
            let outcome = sim
                .run(async move { raidz.scrub(offset, len, &check).await })
                .expect("the sim runs")
                .0;
            total.0 += outcome.errors;
            total.1 += outcome.repaired;
            total.2 |= outcome.unrecoverable;
        }
        total
    };
    let first = scrub(&vdev);
    assert_eq!(first, (SIZES.len() as u32, SIZES.len() as u32, false));
    for device in &vdev.devices {
        device.clear_faults();
    }
    assert_eq!(scrub(&vdev), (0, 0, false), "the second scrub finds nothing");
}

/// A child that missed writes (behind) is read around, then rebuilt by a resilver: afterwards
/// the vdev reads back with that child as the only source of its columns.
#[test]
fn resilver_rebuilds_a_stale_child() {
    let sim = Sim::new(21);
    let mut vdev = raidz_of(&sim.env(), 4, 1);
    let stale = 2usize;
    vdev.raidz.children()[stale].set_state(LeafState::Offline);
    fill(&sim, &mut vdev);
    vdev.raidz.children()[stale].set_state(LeafState::Online);
    vdev.raidz.children()[stale].set_behind(true);
    read_all(&sim, &vdev, "read around the stale child");
    assert_eq!(vdev.raidz.children()[stale].stats().checksum_errors.get(), 0);
    let target = vdev.raidz.children()[stale].id();
    for (offset, data) in &vdev.blocks {
        let raidz = Arc::clone(&vdev.raidz);
        let check = expect(data.clone());
        let (offset, len) = (*offset, data.len() as u32);
        let outcome = sim
            .run(async move { raidz.resilver(offset, len, &check, &[target]).await })
            .expect("the sim runs")
            .0;
        assert!(!outcome.unrecoverable);
    }
    vdev.raidz.children()[stale].set_behind(false);
    // Another child gone: the rebuilt one must now hold its columns.
    vdev.raidz.children()[0].set_state(LeafState::Offline);
    read_all(&sim, &vdev, "after the resilver, with child 0 offline");
}

/// A flush reaches only the children written since their last flush.
#[test]
fn flush_reaches_only_written_children() {
    let sim = Sim::new(3);
    let vdev = raidz_of(&sim.env(), 6, 1);
    let (start, _) = vdev.raidz.data_area();
    // One sector of data at the start of a row: its parity and data on children 0 and 1.
    let raidz = Arc::clone(&vdev.raidz);
    let buf = SharedBuf::copy_from(&pattern(1, 512));
    sim.run(async move {
        raidz.write_flushed(start, buf, IoClass::AsyncWrite, false).await.expect("write");
        raidz.flush().await.expect("flush");
    })
    .expect("the sim runs");
    let flushed: Vec<u64> = vdev.raidz.children().iter().map(|l| l.stats().flushes.get()).collect();
    assert_eq!(flushed, vec![1, 1, 0, 0, 0, 0]);
    let raidz = Arc::clone(&vdev.raidz);
    sim.run(async move { raidz.flush().await.expect("flush") }).expect("the sim runs");
    let again: Vec<u64> = vdev.raidz.children().iter().map(|l| l.stats().flushes.get()).collect();
    assert_eq!(again, flushed, "nothing written since: nothing flushed");
}

/// A durable write (the intent log's) fails when a present child failed its column, even though
/// the block could be read: an acknowledged record must not lean on parity from the start.
#[test]
fn durable_write_fails_when_a_present_child_fails() {
    let sim = Sim::new(4);
    let vdev = raidz_of(&sim.env(), 4, 1);
    let (start, _) = vdev.raidz.data_area();
    vdev.devices[1].inject(Fault::WriteError { offset_bytes: 0, len_bytes: DEVICE_BYTES });
    let raidz = Arc::clone(&vdev.raidz);
    let data = pattern(2, 3 * 4096);
    let (plain, durable) = sim
        .run(async move {
            let plain = raidz
                .write_flushed(start, SharedBuf::copy_from(&data), IoClass::AsyncWrite, false)
                .await;
            let durable = raidz
                .write_flushed(start + 65536, SharedBuf::copy_from(&data), IoClass::SyncWrite, true)
                .await;
            (plain, durable)
        })
        .expect("the sim runs")
        .0;
    assert!(plain.is_ok(), "one failed column of raidz1 still leaves the block: {plain:?}");
    assert!(matches!(durable, Err(VdevError::ChildWriteFailed { .. })), "{durable:?}");
}

/// A run of blocks back to back goes out as one write per child (their columns and the pads
/// between them), and every block reads back from it, with a child missing too.
#[test]
fn a_run_is_one_write_per_child() {
    for (width, parity) in SHAPES {
        let sim = Sim::new(u64::from(width) * 13);
        let vdev = raidz_of(&sim.env(), width, parity);
        let (mut at, _) = vdev.raidz.data_area();
        let mut blocks = Vec::new();
        let mut expected = Vec::new();
        for (i, &size) in SIZES.iter().enumerate() {
            let data = pattern(100 + i as u64, size);
            let asize = vdev.raidz.asize(size as u64);
            blocks.push(sluice_engine::vdev::RunBlock {
                offset: at,
                asize,
                data: Arc::new(sluice_engine::device::AlignedBuf::copy_from(&data)),
            });
            expected.push((at, data));
            at += asize;
        }
        let raidz = Arc::clone(&vdev.raidz);
        sim.run(async move {
            raidz.write_run(&blocks, IoClass::AsyncWrite, false).await.expect("the run is written")
        })
        .expect("the sim runs");
        for leaf in vdev.raidz.children() {
            assert_eq!(leaf.stats().writes.get(), 1, "one write per child");
        }
        let mut vdev = vdev;
        vdev.blocks = expected;
        read_all(&sim, &vdev, "a run");
        vdev.raidz.children()[1].set_state(LeafState::Offline);
        read_all(&sim, &vdev, "a run, child 1 offline");
    }
}

/// A flush counts the columns that missed writes since the last flush beside the ones whose
/// flush failed: a raidz1 with a child offline and another failing its flush has blocks with
/// two columns not durable, and the flush says so; with the offline child alone it succeeds.
#[test]
fn a_flush_counts_missed_columns() {
    let sim = Sim::new(6);
    let vdev = raidz_of(&sim.env(), 4, 1);
    let (start, _) = vdev.raidz.data_area();
    vdev.raidz.children()[0].set_state(LeafState::Offline);
    let write = |at: u64| {
        let raidz = Arc::clone(&vdev.raidz);
        let buf = SharedBuf::copy_from(&pattern(at, 3 * 4096));
        sim.run(async move { raidz.write_flushed(at, buf, IoClass::AsyncWrite, false).await })
            .expect("the sim runs")
            .0
    };
    let flush = || {
        let raidz = Arc::clone(&vdev.raidz);
        sim.run(async move { raidz.flush().await }).expect("the sim runs").0
    };
    write(start).expect("one column missed of raidz1 is written");
    flush().expect("one column missed is within the parity");
    write(start + 65536).expect("written");
    vdev.devices[1].inject(Fault::FlushError);
    let failed = flush();
    assert!(failed.is_err(), "a missed column and a failed flush are two: {failed:?}");
    vdev.devices[1].clear_faults();
    flush().expect("the failed flush's writes are flushed now, and the miss is within parity");
}
