//! The vdev tree on simulated disks: mirror writes, healing, policies, degraded operation,
//! queue priority, and the root's addressing.

use std::sync::Arc;

use sluice_engine::device::sim::{Fault, SimOptions};
use sluice_engine::device::{SharedBuf, SimDevice, SimProfile};
use sluice_engine::rt::Env;
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::vdev::{
    Leaf, LeafState, Mirror, ReadPolicy, Root, Vdev, VdevAddress, VdevError, VdevId,
};
use sluice_sim::Sim;

const DEVICE_BYTES: u64 = 64 << 20;

fn mirror_of(
    env: &Env,
    profiles: &[SimProfile],
    tunables: &Tunables,
) -> (Arc<Mirror>, Vec<SimDevice>) {
    let devices: Vec<SimDevice> = profiles
        .iter()
        .enumerate()
        .map(|(i, p)| {
            SimDevice::new(env, &format!("leg{i}"), p.clone(), DEVICE_BYTES, SimOptions::default())
        })
        .collect();
    let leaves = devices
        .iter()
        .enumerate()
        .map(|(i, d)| Leaf::new(VdevId(i as u32 + 1), env, Arc::new(d.clone()), tunables))
        .collect();
    (Arc::new(Mirror::new(VdevId(0), env, leaves, tunables)), devices)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

/// A checksum stand-in: the block must equal what was written.
fn expect(data: Vec<u8>) -> impl Fn(&[u8]) -> bool + Send + Sync {
    move |got: &[u8]| got == &data[..]
}

/// Writes reach every child; a bit flip on the child that is read is detected by the verify
/// callback, the good copy is returned from the other child and written back, and the repair
/// is counted. A second read finds nothing to repair.
#[test]
fn mirror_heals_a_bad_copy() {
    for bad_child in 0..2usize {
        let sim = Sim::new(11);
        let env = sim.env();
        let tunables = Tunables::with([("mirror.read_policy", "round-robin")]).unwrap();
        let (mirror, devices) =
            mirror_of(&env, &[SimProfile::Instant, SimProfile::Instant], &tunables);
        let data = pattern(1, 16384);
        let m = Arc::clone(&mirror);
        let d = data.clone();
        sim.run(async move { m.write(65536, SharedBuf::copy_from(&d), IoClass::AsyncWrite).await })
            .unwrap()
            .0
            .unwrap();
        devices[bad_child].inject(Fault::BitFlip { offset_bytes: 65536 + 100, bit: 3 });
        for _ in 0..2 {
            let m = Arc::clone(&mirror);
            let check = expect(data.clone());
            let got = sim
                .run(async move {
                    m.read(65536, 16384, IoClass::SyncRead, &check).await.map(|b| b.to_vec())
                })
                .unwrap()
                .0
                .unwrap();
            assert_eq!(got, data);
        }
        let stats = mirror.children()[bad_child].stats();
        assert!(
            stats.checksum_errors.get() <= 1 && stats.repairs.get() == stats.checksum_errors.get()
        );
        // Whether or not the round-robin read hit the bad child, read it directly now: the
        // rewrite (if any) cured it, otherwise the fault is still there.
        let cured = stats.repairs.get() == 1;
        let leaf = Arc::clone(&mirror.children()[bad_child]);
        let direct = sim
            .run(
                async move { leaf.read(65536, 16384, IoClass::SyncRead).await.map(|b| b.to_vec()) },
            )
            .unwrap()
            .0
            .unwrap();
        assert_eq!(direct == data, cured);
    }
}

/// With every copy bad the read fails with NoValidCopy, and other blocks still read fine.
#[test]
fn no_valid_copy_fails_only_that_read() {
    let sim = Sim::new(12);
    let env = sim.env();
    let (mirror, devices) = mirror_of(
        &env,
        &[SimProfile::Instant, SimProfile::Instant, SimProfile::Instant],
        &Tunables::default(),
    );
    let (a, b) = (pattern(2, 4096), pattern(3, 4096));
    let m = Arc::clone(&mirror);
    let (a2, b2) = (a.clone(), b.clone());
    sim.run(async move {
        m.write(0, SharedBuf::copy_from(&a2), IoClass::AsyncWrite).await.unwrap();
        m.write(4096, SharedBuf::copy_from(&b2), IoClass::AsyncWrite).await.unwrap();
    })
    .unwrap();
    devices[0].inject(Fault::BitFlip { offset_bytes: 5, bit: 1 });
    devices[1].inject(Fault::ReadError { offset_bytes: 0, len_bytes: 512 });
    devices[2].inject(Fault::Misdirect {
        offset_bytes: 0,
        len_bytes: 4096,
        from_offset_bytes: 4096,
    });
    let m = Arc::clone(&mirror);
    let check = expect(a);
    let result =
        sim.run(async move { m.read(0, 4096, IoClass::SyncRead, &check).await }).unwrap().0;
    assert!(matches!(result, Err(VdevError::NoValidCopy { tried: 3, .. })), "{result:?}");
    let m = Arc::clone(&mirror);
    let check = expect(b.clone());
    let got = sim
        .run(async move { m.read(4096, 4096, IoClass::SyncRead, &check).await.map(|b| b.to_vec()) })
        .unwrap()
        .0
        .unwrap();
    assert_eq!(got, b);
}

/// A lost child leaves the mirror working: reads come from the survivor, writes and flushes
/// succeed, and the lost child is marked faulted. Losing every child fails writes.
#[test]
fn degraded_mirror_keeps_working() {
    let sim = Sim::new(13);
    let env = sim.env();
    let (mirror, devices) =
        mirror_of(&env, &[SimProfile::ssd(), SimProfile::ssd()], &Tunables::default());
    devices[0].inject(Fault::Lost);
    let data = pattern(4, 8192);
    let m = Arc::clone(&mirror);
    let d = data.clone();
    let got = sim
        .run(async move {
            m.write(0, SharedBuf::copy_from(&d), IoClass::SyncWrite).await.unwrap();
            m.flush().await.unwrap();
            let check = expect(d.clone());
            let mut reads = Vec::new();
            for _ in 0..4 {
                reads.push(m.read(0, 8192, IoClass::SyncRead, &check).await.unwrap().to_vec());
            }
            reads
        })
        .unwrap()
        .0;
    assert!(got.iter().all(|r| *r == data));
    assert!(mirror.children()[0].is_faulted());
    devices[1].inject(Fault::Lost);
    let m = Arc::clone(&mirror);
    let result = sim
        .run(async move { m.write(0, SharedBuf::copy_from(&[0; 512]), IoClass::SyncWrite).await })
        .unwrap()
        .0;
    assert!(matches!(result, Err(VdevError::AllChildrenFailed { .. })));
}

/// offset-modulo reads child (offset >> 21) % n; round-robin rotates; least-pending avoids a
/// child with I/O pending.
#[test]
fn read_policies_choose_as_documented() {
    let reads_per_child = |policy: &str, offsets: &[u64]| {
        let sim = Sim::new(14);
        let env = sim.env();
        let tunables = Tunables::with([("mirror.read_policy", policy)]).unwrap();
        let (mirror, devices) = mirror_of(
            &env,
            &[SimProfile::Instant, SimProfile::Instant, SimProfile::Instant],
            &tunables,
        );
        assert_eq!(mirror.policy(), ReadPolicy::from_tunables(&tunables));
        let m = Arc::clone(&mirror);
        let offsets = offsets.to_vec();
        sim.run(async move {
            for offset in offsets {
                m.read(offset, 4096, IoClass::SyncRead, &|_: &[u8]| true).await.unwrap();
            }
        })
        .unwrap();
        devices.iter().map(|d| d.stats().reads).collect::<Vec<_>>()
    };
    let two_mib = 2 << 20;
    assert_eq!(
        reads_per_child("offset-modulo", &[0, 4096, two_mib, two_mib * 2, two_mib * 5]),
        vec![2, 1, 2]
    );
    assert_eq!(reads_per_child("round-robin", &[0; 6]), vec![2, 2, 2]);
}

/// least-pending sends most reads of a concurrent load to the fast child of an SSD+HDD mirror;
/// offset-modulo splits them evenly.
#[test]
fn least_pending_favours_the_fast_child() {
    let share_on_ssd = |policy: &str| {
        let sim = Sim::new(15);
        let env = sim.env();
        let tunables = Tunables::with([("mirror.read_policy", policy)]).unwrap();
        let (mirror, devices) = mirror_of(&env, &[SimProfile::ssd(), SimProfile::hdd()], &tunables);
        let m = Arc::clone(&mirror);
        let e = env.clone();
        sim.run(async move {
            let mut readers = Vec::new();
            for reader in 0..8u64 {
                let m = Arc::clone(&m);
                readers.push(async move {
                    for i in 0..50u64 {
                        let offset = ((reader * 7919 + i * 104_729) % 4000) * 16384;
                        m.read(offset, 16384, IoClass::SyncRead, &|_: &[u8]| true).await.unwrap();
                    }
                });
            }
            futures::future::join_all(readers).await;
            let _ = e;
        })
        .unwrap();
        let (ssd, hdd) = (devices[0].stats().reads, devices[1].stats().reads);
        ssd as f64 / (ssd + hdd) as f64
    };
    let least = share_on_ssd("least-pending");
    let modulo = share_on_ssd("offset-modulo");
    assert!(least > 0.9, "least-pending sent {least:.2} of reads to the SSD");
    assert!((0.3..0.7).contains(&modulo), "offset-modulo sent {modulo:.2} to the SSD");
}

/// On a mirror of HDDs, least-pending deals reads that continue nothing to the child whose zone
/// (its share of the address range) holds them, so each disk seeks over half the stroke; load
/// still wins: when every read falls in one zone, the other child takes a share of them.
#[test]
fn least_pending_zones_hdd_reads_and_still_balances() {
    // Returns, per read, the child that served it (when one reader runs alone), and the reads
    // per child.
    let run = |readers: u64, span: u64| {
        let sim = Sim::new(18);
        let env = sim.env();
        let tunables = Tunables::default();
        let (mirror, devices) = mirror_of(&env, &[SimProfile::hdd(), SimProfile::hdd()], &tunables);
        let m = Arc::clone(&mirror);
        let served = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (s, d) = (Arc::clone(&served), devices.clone());
        sim.run(async move {
            let tasks = (0..readers).map(|reader| {
                let (m, s, d) = (Arc::clone(&m), Arc::clone(&s), d.clone());
                async move {
                    for i in 1..=40u64 {
                        let offset = (reader * 7_919 + i * 104_729) % (span / 16384) * 16384;
                        let before = d[0].stats().reads;
                        m.read(offset, 16384, IoClass::SyncRead, &|_: &[u8]| true).await.unwrap();
                        let child = if d[0].stats().reads > before { 0 } else { 1 };
                        s.lock().push((offset, child));
                    }
                }
            });
            futures::future::join_all(tasks).await;
        })
        .unwrap();
        let served = served.lock().clone();
        (served, devices[0].stats().reads, devices[1].stats().reads)
    };
    // One reader at a time over the whole device: each read goes to its zone's child.
    let (served, _, _) = run(1, DEVICE_BYTES);
    let low = served.iter().filter(|&&(offset, _)| offset < DEVICE_BYTES / 2).count();
    assert!(low > 5 && low < 35, "the offsets should cover both zones ({low} of 40 low)");
    for (offset, child) in served {
        assert_eq!(child, usize::from(offset >= DEVICE_BYTES / 2), "read at {offset}");
    }
    // Sixteen readers, all in the first zone: the second child still serves a share.
    let (served, first, second) = run(16, DEVICE_BYTES / 2);
    assert!(served.iter().all(|&(offset, _)| offset < DEVICE_BYTES / 2));
    assert!(second * 5 > first + second, "child 1 served {second} of {} reads", first + second);
}

/// Log writes and reads through a leaf on a deep-queued HDD: a sync write enqueued behind a
/// pile of reads completes before most of them when reads are capped below the queue depth.
#[test]
fn sync_write_is_not_stuck_behind_reads() {
    let sim = Sim::new(16);
    let env = sim.env();
    let tunables = Tunables::with([
        ("vdev.max_active", "4"),
        ("vdev.sync_read_max_active", "3"),
        ("vdev.sync_read_min_active", "1"),
        ("vdev.sync_write_min_active", "1"),
        ("vdev.log_write_min_active", "1"),
        ("vdev.async_write_min_active", "1"),
    ])
    .unwrap();
    let device = SimDevice::new(
        &env,
        "hdd",
        SimProfile::hdd(),
        1 << 40,
        SimOptions { store_data: false, record_log: false },
    );
    let leaf = Leaf::new(VdevId(0), &env, Arc::new(device), &tunables);
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (l, o, e) = (Arc::clone(&leaf), Arc::clone(&order), env.clone());
    sim.run(async move {
        let mut tasks = Vec::new();
        for i in 0..40u64 {
            let (l, o) = (Arc::clone(&l), Arc::clone(&o));
            tasks.push(futures::future::Either::Left(async move {
                l.read(((i * 7_919) % 60_000) << 24, 32768, IoClass::SyncRead).await.unwrap();
                o.lock().push("read");
            }));
        }
        let (l2, o2) = (Arc::clone(&l), Arc::clone(&o));
        tasks.push(futures::future::Either::Right(async move {
            l2.write(1 << 39, SharedBuf::copy_from(&[1; 8192]), IoClass::LogWrite).await.unwrap();
            o2.lock().push("write");
        }));
        futures::future::join_all(tasks).await;
        let _ = e;
    })
    .unwrap();
    let position = order.lock().iter().position(|w| *w == "write").unwrap();
    assert!(position < 10, "the log write finished after {position} reads");
    assert_eq!(leaf.pending(), 0);
    assert_eq!(leaf.stats().reads.get(), 40);
}

/// The root stripes logical offsets over top-level vdevs and routes DVAs; a bad vdev number
/// is an error, not a panic.
#[test]
fn root_stripes_and_routes() {
    let sim = Sim::new(17);
    let env = sim.env();
    let tunables = Tunables::default();
    let tops: Vec<Vdev> = (0..2)
        .map(|i| {
            let d = SimDevice::new(
                &env,
                &format!("top{i}"),
                SimProfile::Instant,
                DEVICE_BYTES,
                SimOptions::default(),
            );
            Vdev::Leaf(Leaf::new(VdevId(i), &env, Arc::new(d), &tunables))
        })
        .collect();
    let root = Root::new(tops);
    assert_eq!(root.stripe(0, 1 << 20), VdevAddress { vdev: 0, offset_bytes: 0 });
    assert_eq!(root.stripe((1 << 20) + 5, 1 << 20), VdevAddress { vdev: 1, offset_bytes: 5 });
    assert_eq!(root.stripe(2 << 20, 1 << 20), VdevAddress { vdev: 0, offset_bytes: 1 << 20 });
    let r = root.clone();
    let data = pattern(9, 4096);
    let d = data.clone();
    let got = sim
        .run(async move {
            let dva = r.stripe(3 << 20, 1 << 20);
            r.write(dva, SharedBuf::copy_from(&d), IoClass::AsyncWrite).await.unwrap();
            r.flush().await.unwrap();
            let bad = r
                .read(
                    VdevAddress { vdev: 9, offset_bytes: 0 },
                    512,
                    IoClass::SyncRead,
                    &|_: &[u8]| true,
                )
                .await;
            assert!(matches!(bad, Err(VdevError::NoSuchVdev { vdev: 9, count: 2 })));
            let check = expect(d);
            r.read(dva, 4096, IoClass::SyncRead, &check).await.map(|b| b.to_vec())
        })
        .unwrap()
        .0
        .unwrap();
    assert_eq!(got, data);
    assert_eq!(root.leaves()[1].device().name(), "top1");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever single child is damaged, and however (bit flip, read error, misdirected read),
    /// every block reads back exactly as written, and each block read from a damaged child is
    /// rewritten there.
    #[test]
    fn mirror_heals_from_any_single_bad_child(
        width in 2usize..=4,
        bad in 0usize..4,
        fault_kind in 0u8..3,
        policy in 0usize..3,
        blocks in proptest::collection::vec(0u64..64, 1..12),
    ) {
        let bad = bad % width;
        let sim = Sim::new(blocks.len() as u64);
        let env = sim.env();
        let policy = ["least-pending", "offset-modulo", "round-robin"][policy];
        // Healing, not the fault diagnosis, is under test: up to 11 errors on the bad child
        // would otherwise fault it (vdev.io_errors_max), and a faulted child gets no repairs.
        let tunables = Tunables::with([
            ("mirror.read_policy", policy),
            ("vdev.io_errors_max", "1000"),
            ("vdev.checksum_errors_max", "1000"),
        ])
        .unwrap();
        let (mirror, devices) = mirror_of(&env, &vec![SimProfile::Instant; width], &tunables);
        let m = Arc::clone(&mirror);
        let written = blocks.clone();
        sim.run(async move {
            for block in written {
                let data = pattern(block as u8, 4096);
                m.write(block * 4096, SharedBuf::copy_from(&data), IoClass::AsyncWrite).await.unwrap();
            }
        })
        .unwrap();
        for &block in &blocks {
            let offset = block * 4096;
            let fault = match fault_kind {
                0 => Fault::BitFlip { offset_bytes: offset + 7, bit: 2 },
                1 => Fault::ReadError { offset_bytes: offset, len_bytes: 4096 },
                _ => Fault::Misdirect { offset_bytes: offset, len_bytes: 4096, from_offset_bytes: offset + 8192 },
            };
            devices[bad].inject(fault);
        }
        let m = Arc::clone(&mirror);
        let read_back = blocks.clone();
        let all_good = sim
            .run(async move {
                let mut ok = true;
                for block in read_back {
                    let check = expect(pattern(block as u8, 4096));
                    let got = m.read(block * 4096, 4096, IoClass::SyncRead, &check).await.unwrap();
                    ok &= got.to_vec() == pattern(block as u8, 4096);
                }
                ok
            })
            .unwrap()
            .0;
        proptest::prop_assert!(all_good);
        let stats = mirror.children()[bad].stats();
        let detected = stats.checksum_errors.get() + stats.read_errors.get();
        proptest::prop_assert_eq!(stats.repairs.get(), detected, "every detected bad copy was rewritten");
    }
}

/// An offline child gets no I/O: writes and flushes skip it, reads never choose it, and a read
/// asked of it directly says it is offline. Back online, it is read again; a degraded child is
/// read only when every healthy one failed, and the copy it gives heals the healthy one.
#[test]
fn offline_child_gets_no_io_and_degraded_child_is_a_last_resort() {
    let sim = Sim::new(17);
    let env = sim.env();
    let tunables = Tunables::with([("mirror.read_policy", "round-robin")]).unwrap();
    let (mirror, _devices) = mirror_of(&env, &[SimProfile::ssd(), SimProfile::ssd()], &tunables);
    let (first, second) = (Arc::clone(&mirror.children()[0]), Arc::clone(&mirror.children()[1]));
    second.set_state(LeafState::Offline);
    let data = pattern(5, 8192);
    let m = Arc::clone(&mirror);
    let d = data.clone();
    let leaf = Arc::clone(&second);
    let (reads, direct) = sim
        .run(async move {
            m.write(0, SharedBuf::copy_from(&d), IoClass::SyncWrite).await.unwrap();
            m.flush().await.unwrap();
            let check = expect(d.clone());
            let mut reads = Vec::new();
            for _ in 0..6 {
                reads.push(m.read(0, 8192, IoClass::SyncRead, &check).await.unwrap().to_vec());
            }
            (reads, leaf.read(0, 8192, IoClass::SyncRead).await.map(|_| ()))
        })
        .unwrap()
        .0;
    assert!(reads.iter().all(|r| *r == data));
    assert!(matches!(direct, Err(VdevError::Offline { .. })), "{direct:?}");
    let stats = second.stats();
    assert_eq!(
        (stats.writes.get(), stats.reads.get(), stats.flushes.get()),
        (0, 0, 0),
        "the offline child was touched"
    );
    assert_eq!(first.stats().reads.get(), 6);

    // Online again but missing the write; the first child degraded. Reads go to the second
    // child, fail its check, fall back to the degraded first child once, and heal the second.
    second.set_state(LeafState::Online);
    first.set_state(LeafState::Degraded);
    let m = Arc::clone(&mirror);
    let d = data.clone();
    let reads = sim
        .run(async move {
            let check = expect(d.clone());
            let mut reads = Vec::new();
            for _ in 0..6 {
                reads.push(m.read(0, 8192, IoClass::SyncRead, &check).await.unwrap().to_vec());
            }
            reads
        })
        .unwrap()
        .0;
    assert!(reads.iter().all(|r| *r == data));
    assert_eq!(first.stats().reads.get(), 7, "the degraded child was read beyond the one fallback");
    assert_eq!(second.stats().reads.get(), 6);
    assert_eq!(second.stats().repairs.get(), 1);
}

/// While the intent log writes, a leaf paces the txg sync's writes between its flushes
/// (`vdev.sync_pace_bytes`): a flush a log block waits on carries at most about the budget of
/// the sync's data, where without pacing the sync's burst of megabytes lands before one.
/// Once the log stops, the sync's writes still held go out with no completion to issue them
/// (the leaf's timer does).
#[test]
fn the_syncs_writes_are_paced_between_the_logs_flushes() {
    use sluice_engine::device::sim::SsdParams;
    use sluice_engine::device::DeviceOp;

    const SYNC_AT: u64 = 16 << 20;
    const WRITE_BYTES: u64 = 64 << 10;
    for pace in ["256K", "0"] {
        let sim = Sim::new(29);
        let env = sim.env();
        // A fixed depth (ZFS's), so that the unpaced burst does not depend on a measured one.
        let tunables =
            Tunables::with([("vdev.sync_pace_bytes", pace), ("vdev.max_active", "1000")]).unwrap();
        // Flushes slow against writes, as a disk's cache writing back is.
        let profile = SimProfile::Ssd(SsdParams {
            flush_latency: std::time::Duration::from_millis(2),
            ..SsdParams::default()
        });
        let options = SimOptions { store_data: false, record_log: true };
        let device = SimDevice::new(&env, "leaf", profile, DEVICE_BYTES, options);
        let leaf = Leaf::new(VdevId(1), &env, Arc::new(device.clone()), &tunables);
        let l = Arc::clone(&leaf);
        sim.run(async move {
            let log = |i: u64| {
                let l = Arc::clone(&l);
                async move {
                    let block = SharedBuf::copy_from(&[7u8; 4096]);
                    l.write_flushed(i * 4096, block, IoClass::LogWrite, true).await.unwrap()
                }
            };
            // The sync's writes, with gaps between them so that none merge.
            let sync = |first: u64, count: u64| {
                futures::future::join_all((first..first + count).map(|i| {
                    let l = Arc::clone(&l);
                    async move {
                        let data = SharedBuf::copy_from(&[9u8; WRITE_BYTES as usize]);
                        l.write(SYNC_AT + i * 2 * WRITE_BYTES, data, IoClass::AsyncWrite)
                            .await
                            .unwrap()
                    }
                }))
            };
            log(0).await;
            // 8 MiB of the sync's writes queued at once while the log writes 50 blocks.
            let logs = async {
                for i in 1..=50 {
                    log(i).await;
                }
            };
            futures::future::join(sync(0, 128), logs).await;
            // The log has stopped: 2 MiB more still go.
            sync(128, 32).await;
        })
        .unwrap();
        let mut carried = 0;
        let mut carried_max = 0;
        let mut sync_bytes = 0;
        for entry in device.write_log() {
            match entry.op {
                DeviceOp::Write if entry.offset_bytes >= SYNC_AT => {
                    carried += entry.len_bytes;
                    sync_bytes += entry.len_bytes;
                }
                DeviceOp::Flush => {
                    carried_max = std::mem::replace(&mut carried, 0).max(carried_max);
                }
                _ => {}
            }
        }
        assert_eq!(sync_bytes, 160 * WRITE_BYTES, "every write of the sync done");
        if pace == "0" {
            assert!(carried_max >= 2 << 20, "unpaced, a flush carries the burst: {carried_max}");
        } else {
            // The budget per flush; twice it, as a write issued at one flush's completion may
            // complete after the next flush began.
            assert!(carried_max <= 2 * (256 << 10), "paced, a flush carried {carried_max} bytes");
        }
    }
}

/// A leaf counts the device commands that carried the txg sync's writes, and their bytes,
/// whether the queue merged neighbours into one or not (what `pool iostat` gives as the size
/// of the sync's writes on the device); the intent log's writes are not among them.
#[test]
fn async_write_commands_count_only_async_bytes() {
    use sluice_engine::device::DeviceOp;

    const SYNC_AT: u64 = 16 << 20;
    const BLOCK: u64 = 16 << 10;
    // A sync-class write right after the eight neighbours: the queue may merge it into their
    // command, and its bytes are not the sync's.
    const OTHER_AT: u64 = SYNC_AT + 8 * BLOCK;
    let sim = Sim::new(31);
    let env = sim.env();
    let options = SimOptions { store_data: false, record_log: true };
    let device = SimDevice::new(&env, "leaf", SimProfile::ssd(), DEVICE_BYTES, options);
    // One async write at a time: the others wait in the queue, where the sync write, issued
    // at once, takes its neighbours into its command.
    let tunables = Tunables::with([
        ("vdev.max_active", "32"),
        ("vdev.async_write_min_active", "1"),
        ("vdev.async_write_max_active", "1"),
    ])
    .unwrap();
    let leaf = Leaf::new(VdevId(1), &env, Arc::new(device.clone()), &tunables);
    let l = Arc::clone(&leaf);
    sim.run(async move {
        // Eight neighbours queued at once, which the queue may merge, and eight blocks apart.
        let writes = (0..17u64).map(|i| {
            let l = Arc::clone(&l);
            let (at, class) = match i {
                0..=7 => (SYNC_AT + i * BLOCK, IoClass::AsyncWrite),
                8 => (OTHER_AT, IoClass::SyncWrite),
                _ => (SYNC_AT + (1 << 20) + i * 4 * BLOCK, IoClass::AsyncWrite),
            };
            async move {
                let data = SharedBuf::copy_from(&[9u8; BLOCK as usize]);
                l.write(at, data, class).await.unwrap()
            }
        });
        futures::future::join_all(writes).await;
        let block = SharedBuf::copy_from(&[7u8; 4096]);
        l.write_flushed(0, block, IoClass::LogWrite, true).await.unwrap();
    })
    .unwrap();
    let (mut commands, mut async_bytes, mut all_bytes, mut mixed) = (0, 0, 0, 0);
    for e in device.write_log().iter() {
        if !matches!(e.op, DeviceOp::Write) || e.offset_bytes < SYNC_AT {
            continue;
        }
        all_bytes += e.len_bytes;
        let end = e.offset_bytes + e.len_bytes;
        let other = end.min(OTHER_AT + BLOCK).saturating_sub(e.offset_bytes.max(OTHER_AT));
        if e.len_bytes > other {
            commands += 1;
            async_bytes += e.len_bytes - other;
            mixed += u32::from(other > 0);
        }
    }
    assert_eq!(mixed, 1, "the sync write rode with async ones");
    assert_eq!(all_bytes, 17 * BLOCK, "every write reached the device");
    assert_eq!(async_bytes, 16 * BLOCK, "the async writes' bytes, found in the record");
    assert!((9..=16).contains(&commands), "the blocks apart cannot merge: {commands} commands");
    let stats = leaf.stats();
    assert_eq!(
        (stats.async_write_commands.get(), stats.async_written.get()),
        (commands, async_bytes),
        "the counters match the device's own record of the async writes' commands"
    );
    assert_eq!(stats.writes.get(), 18, "the sync and log writes are writes, but not async ones");
}

/// What a child lacks of the writes its mirror answered as done, as the pool's sync counts it
/// (`Leaf::copies_missed`): a write it failed or was skipped for while another child took it,
/// and a flush it failed or was not sent (out of service) with writes pending. A write every
/// child failed was answered as failed and is not counted.
#[test]
fn a_mirror_counts_the_copies_each_child_lacks() {
    let sim = Sim::new(29);
    let env = sim.env();
    // No child is faulted by these errors: each is counted as it comes.
    let tunables = Tunables::with([("vdev.io_errors_max", "1000000")]).unwrap();
    let (mirror, devices) = mirror_of(&env, &[SimProfile::ssd(), SimProfile::ssd()], &tunables);
    let m = Arc::clone(&mirror);
    sim.run(async move {
        let children = m.children().to_vec();
        let copies = || [children[0].copies_missed(), children[1].copies_missed()];
        let block = || SharedBuf::copy_from(&[7; 4096]);
        let first_mib = Fault::WriteError { offset_bytes: 0, len_bytes: 1 << 20 };

        devices[0].inject(first_mib.clone());
        m.write(0, block(), IoClass::AsyncWrite).await.unwrap();
        assert_eq!(copies(), [1, 0], "leg0 failed a write leg1 took");
        devices[1].inject(first_mib);
        assert!(m.write(4096, block(), IoClass::AsyncWrite).await.is_err());
        assert_eq!(copies(), [1, 0], "a write both failed was answered as failed");
        devices[0].clear_faults();
        devices[1].clear_faults();

        // leg1 holds a write unflushed and is offline for the flush: it lacks that copy.
        m.write(1 << 20, block(), IoClass::AsyncWrite).await.unwrap();
        children[1].set_state(LeafState::Offline);
        m.flush().await.unwrap();
        assert_eq!(copies(), [1, 1], "leg1 was not flushed");
        // A write leg1 is skipped for while offline, durable on leg0.
        m.write_flushed_everywhere(2 << 20, block(), IoClass::LogWrite).await.unwrap();
        assert_eq!(copies(), [1, 2], "leg1 was skipped");
        children[1].set_state(LeafState::Online);

        // A flush that fails with writes pending.
        m.write(3 << 20, block(), IoClass::AsyncWrite).await.unwrap();
        devices[0].inject(Fault::FlushError);
        m.flush().await.unwrap();
        assert_eq!(copies(), [2, 2], "leg0's flush failed with a write pending");
        // Once a flush has succeeded, a failed one with nothing pending loses nothing.
        devices[0].clear_faults();
        m.flush().await.unwrap();
        devices[0].inject(Fault::FlushError);
        m.flush().await.unwrap();
        assert_eq!(copies(), [2, 2], "leg0 had nothing unflushed");
    })
    .unwrap();
}
