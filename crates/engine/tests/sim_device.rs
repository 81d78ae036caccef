//! SimDevice semantics: flush is the only barrier, crash policies, the write log, faults, and
//! the timing models' basic shape. All runs are in virtual time under the deterministic simulator.

use std::time::Duration;

use sluice_engine::device::sim::{CrashPolicy, Fault, HddParams, SimOptions, SsdParams};
use sluice_engine::device::{BlockDevice, DeviceError, SharedBuf, SimDevice, SimProfile};
use sluice_engine::rt::Rng;
use sluice_sim::Sim;

const DEVICE_BYTES: u64 = 1 << 20;

fn block(byte: u8, len: usize) -> SharedBuf {
    SharedBuf::copy_from(&vec![byte; len])
}

fn device(sim: &Sim, profile: SimProfile, options: SimOptions) -> SimDevice {
    SimDevice::new(&sim.env(), "sim0", profile, DEVICE_BYTES, options)
}

fn read(sim: &Sim, device: &SimDevice, offset: u64, len: u32) -> Result<Vec<u8>, DeviceError> {
    let d = device.clone();
    sim.run(async move { d.read_at(offset, len).await.map(|b| b.to_vec()) }).unwrap().0
}

fn write(sim: &Sim, device: &SimDevice, offset: u64, data: SharedBuf) {
    let d = device.clone();
    sim.run(async move { d.write_at(offset, data).await }).unwrap().0.unwrap();
}

fn flush(sim: &Sim, device: &SimDevice) -> Result<(), DeviceError> {
    let d = device.clone();
    sim.run(async move { d.flush().await }).unwrap().0
}

/// The core crash contract, over many seeds and every policy: a flushed write is never lost,
/// an unflushed one may be, and DropAll loses every unflushed write.
#[test]
fn flushed_writes_survive_every_crash_policy() {
    let policies = [
        CrashPolicy::DropAll,
        CrashPolicy::KeepAll,
        CrashPolicy::RandomSubset,
        CrashPolicy::Reorder,
        CrashPolicy::TearOne,
        CrashPolicy::Any,
    ];
    let mut lost_unflushed = 0;
    for seed in 0..200u64 {
        for policy in policies {
            let sim = Sim::new(seed);
            let dev = device(&sim, SimProfile::ssd(), SimOptions::default());
            write(&sim, &dev, 0, block(1, 8192));
            flush(&sim, &dev).unwrap();
            write(&sim, &dev, 8192, block(2, 8192));
            write(&sim, &dev, 0, block(3, 4096));
            dev.crash(policy);
            let head = read(&sim, &dev, 0, 8192).unwrap();
            // Offset 0..4096 holds the flushed 1s or the later 3s (whole sectors of either).
            assert!(head[..4096]
                .chunks(512)
                .all(|s| s.iter().all(|&b| b == 1) || s.iter().all(|&b| b == 3)));
            assert!(
                head[4096..].iter().all(|&b| b == 1),
                "flushed data lost (seed {seed}, {policy:?})"
            );
            let tail = read(&sim, &dev, 8192, 8192).unwrap();
            if tail.iter().all(|&b| b == 0) {
                lost_unflushed += 1;
            }
            if policy == CrashPolicy::DropAll {
                assert!(tail.iter().all(|&b| b == 0) && head[..4096].iter().all(|&b| b == 1));
            }
            if policy == CrashPolicy::KeepAll {
                assert!(tail.iter().all(|&b| b == 2) && head[..4096].iter().all(|&b| b == 3));
            }
        }
    }
    assert!(lost_unflushed > 200, "unflushed writes were lost only {lost_unflushed} times");
}

/// TearOne leaves some write with a mix of old and new sectors for some seed.
#[test]
fn tear_mixes_sectors() {
    let mut torn = false;
    for seed in 0..50 {
        let sim = Sim::new(seed);
        let dev = device(&sim, SimProfile::Instant, SimOptions::default());
        write(&sim, &dev, 0, block(9, 8192));
        dev.crash(CrashPolicy::TearOne);
        let data = read(&sim, &dev, 0, 8192).unwrap();
        let new = data.chunks(512).filter(|s| s[0] == 9).count();
        assert!(data.chunks(512).all(|s| s.iter().all(|&b| b == s[0])), "tears are sector-aligned");
        torn |= new > 0 && new < 16;
    }
    assert!(torn);
}

/// The write log rebuilds the image of a power cut after any operation; writes before the last
/// flush within the prefix are always present.
#[test]
fn crash_images_respect_flush_epochs() {
    let sim = Sim::new(3);
    let dev = device(&sim, SimProfile::Instant, SimOptions { store_data: true, record_log: true });
    for i in 0..6u8 {
        write(&sim, &dev, u64::from(i) * 4096, block(i + 1, 4096));
        if i % 2 == 1 {
            flush(&sim, &dev).unwrap();
        }
    }
    let log = dev.write_log();
    assert_eq!(log.len(), 9);
    let mut rng = Rng::new(1);
    for ops in 0..=log.len() {
        for policy in [CrashPolicy::DropAll, CrashPolicy::Any, CrashPolicy::KeepAll] {
            let image = dev.crash_image(ops, policy, &mut rng).unwrap();
            let replay = SimDevice::from_image(
                &sim.env(),
                "replay",
                SimProfile::Instant,
                DEVICE_BYTES,
                SimOptions::default(),
                image,
            );
            let flushes = log[..ops]
                .iter()
                .filter(|e| e.op == sluice_engine::device::DeviceOp::Flush)
                .count();
            for i in 0..(flushes * 2) as u64 {
                let data = read(&sim, &replay, i * 4096, 4096).unwrap();
                assert!(data.iter().all(|&b| u64::from(b) == i + 1), "op {ops}: block {i} lost");
            }
        }
    }
}

/// Read-time faults are applied over the pristine image and cured by a rewrite; write-time
/// faults change what is stored or fail the operation.
#[test]
fn faults_behave_as_documented() {
    let sim = Sim::new(5);
    let dev = device(&sim, SimProfile::Instant, SimOptions::default());
    write(&sim, &dev, 0, block(7, 4096));
    write(&sim, &dev, 4096, block(8, 4096));
    dev.inject(Fault::BitFlip { offset_bytes: 10, bit: 0 });
    assert_eq!(read(&sim, &dev, 0, 512).unwrap()[10], 6);
    dev.inject(Fault::ReadError { offset_bytes: 1024, len_bytes: 512 });
    assert!(matches!(read(&sim, &dev, 0, 4096), Err(DeviceError::Io { .. })));
    dev.inject(Fault::Misdirect { offset_bytes: 4096, len_bytes: 512, from_offset_bytes: 0 });
    assert_eq!(read(&sim, &dev, 4096, 512).unwrap()[100], 7);
    dev.clear_faults();
    assert!(read(&sim, &dev, 0, 4096).unwrap().iter().all(|&b| b == 7), "pristine image kept");
    // Rewriting cures a latent fault.
    dev.inject(Fault::ReadError { offset_bytes: 0, len_bytes: 512 });
    write(&sim, &dev, 0, block(4, 4096));
    assert!(read(&sim, &dev, 0, 4096).unwrap().iter().all(|&b| b == 4));
    // A partial rewrite cures only what it covers.
    dev.inject(Fault::ReadError { offset_bytes: 0, len_bytes: 8192 });
    write(&sim, &dev, 0, block(4, 4096));
    assert!(read(&sim, &dev, 0, 4096).is_ok());
    assert!(read(&sim, &dev, 4096, 4096).is_err());
    dev.clear_faults();
    // Phantom writes report success and store nothing.
    dev.inject(Fault::Phantom { offset_bytes: 8192, len_bytes: 4096 });
    write(&sim, &dev, 8192, block(5, 4096));
    assert!(read(&sim, &dev, 8192, 4096).unwrap().iter().all(|&b| b == 0));
    dev.clear_faults();
    // Misdirected writes land elsewhere.
    dev.inject(Fault::MisdirectWrite { offset_bytes: 12288, len_bytes: 4096, shift_bytes: 65536 });
    write(&sim, &dev, 12288, block(6, 4096));
    assert!(read(&sim, &dev, 12288, 4096).unwrap().iter().all(|&b| b == 0));
    assert!(read(&sim, &dev, 12288 + 65536, 4096).unwrap().iter().all(|&b| b == 6));
    dev.clear_faults();
    dev.inject(Fault::FlushError);
    assert!(flush(&sim, &dev).is_err());
    dev.crash(CrashPolicy::DropAll);
    assert!(
        read(&sim, &dev, 0, 4096).unwrap().iter().all(|&b| b == 0),
        "a failed flush made nothing durable"
    );
    dev.clear_faults();
    dev.inject(Fault::WriteError { offset_bytes: 0, len_bytes: 4096 });
    let d = dev.clone();
    assert!(sim.run(async move { d.write_at(0, block(1, 4096)).await }).unwrap().0.is_err());
    dev.inject(Fault::Lost);
    assert!(matches!(read(&sim, &dev, 0, 512), Err(DeviceError::Gone { .. })));
}

/// Discards read back as zeros and survive a flush; a huge discard costs no memory.
#[test]
fn discard_zeroes() {
    let sim = Sim::new(6);
    let dev =
        SimDevice::new(&sim.env(), "big", SimProfile::Instant, 1 << 40, SimOptions::default());
    write(&sim, &dev, 4096, block(3, 8192));
    let d = dev.clone();
    sim.run(async move { d.discard(0, (1 << 40) - 4096).await }).unwrap().0.unwrap();
    flush(&sim, &dev).unwrap();
    assert!(read(&sim, &dev, 4096, 8192).unwrap().iter().all(|&b| b == 0));
    assert_eq!(dev.durable_image().stored_bytes(), 0);
}

/// HDD: sequential reads merge and beat scattered ones; slowness multiplies service time;
/// a crash fails requests in flight. SSD: the bus caps throughput.
#[test]
fn timing_models_have_the_right_shape() {
    let elapsed = |offsets: Vec<u64>, slow: bool| {
        let sim = Sim::new(9);
        let dev = SimDevice::new(
            &sim.env(),
            "hdd",
            SimProfile::Hdd(HddParams::default()),
            1 << 40,
            SimOptions { store_data: false, record_log: false },
        );
        if slow {
            dev.inject(Fault::Slow { factor: 10 });
        }
        let d = dev.clone();
        let (_, report) = sim
            .run(async move {
                for offset in offsets {
                    d.read_at(offset, 65536).await.unwrap();
                }
            })
            .unwrap();
        (report.end.as_nanos(), dev.stats().merged)
    };
    let sequential: Vec<u64> = (0..64).map(|i| i * 65536).collect();
    let scattered: Vec<u64> = (0..64u64).map(|i| (i * 7_919_993 % 1000) << 30).collect();
    let (t_seq, merged) = elapsed(sequential.clone(), false);
    let (t_rand, _) = elapsed(scattered, false);
    let (t_slow, _) = elapsed(sequential, true);
    assert!(t_seq * 5 < t_rand, "sequential {t_seq} ns vs scattered {t_rand} ns");
    assert_eq!(merged, 64, "the head starts at 0, so every read continues the last");
    assert!(t_slow > t_seq * 9);

    let sim = Sim::new(1);
    let params = SsdParams::cloud_disk();
    let dev = SimDevice::new(
        &sim.env(),
        "cloud",
        SimProfile::Ssd(params.clone()),
        1 << 30,
        SimOptions { store_data: false, record_log: false },
    );
    let env = sim.env();
    let d = dev.clone();
    let (_, report) = sim
        .run(async move {
            let reads = (0..200u64).map(|i| d.read_at(i * 32768, 32768));
            futures::future::join_all(reads).await;
            let _ = env;
        })
        .unwrap();
    let bytes_per_sec = 200.0 * 32768.0 / report.end.as_secs_f64();
    assert!(bytes_per_sec <= params.bus_bytes_per_sec as f64 * 1.001, "{bytes_per_sec}");
    assert!(bytes_per_sec > params.bus_bytes_per_sec as f64 * 0.8, "{bytes_per_sec}");
    let _ = Duration::ZERO;
}

/// A crash while a command is on the platter fails it instead of completing it.
#[test]
fn crash_fails_requests_in_flight() {
    let sim = Sim::new(2);
    let dev = SimDevice::new(&sim.env(), "hdd", SimProfile::hdd(), 1 << 30, SimOptions::default());
    let env = sim.env();
    let d = dev.clone();
    let (result, _) = sim
        .run(async move {
            let pending = d.write_at(0, block(1, 4096));
            let crasher = d.clone();
            env.spawn("crash", async move { crasher.crash(CrashPolicy::KeepAll) });
            pending.await
        })
        .unwrap();
    assert!(matches!(result, Err(DeviceError::Gone { .. })));
    assert!(read(&sim, &dev, 0, 4096).unwrap().iter().all(|&b| b == 0));
}
