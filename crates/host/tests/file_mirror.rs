//! The engine's vdev layer on the production runtime: a mirror of two FileDevices driven by
//! tokio, the same code the simulator drives. Writes reach both files, a corrupted file is
//! healed from the other, and a flush succeeds.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use sluice_engine::device::{FileDevice, FileDeviceOptions, SharedBuf};
use sluice_engine::tunables::{IoClass, Tunables};
use sluice_engine::vdev::{Leaf, Mirror, VdevId};

#[test]
fn file_mirror_heals_under_tokio() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = sluice_host::runtime().unwrap();
    runtime.block_on(async {
        let env = sluice_host::tokio_env(1);
        let tunables = Tunables::with([("mirror.read_policy", "round-robin")]).unwrap();
        let options = FileDeviceOptions { create_len_bytes: Some(8 << 20), ..Default::default() };
        let paths: Vec<_> = (0..2).map(|i| dir.path().join(format!("leg{i}"))).collect();
        let leaves = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Leaf::new(
                    VdevId(i as u32),
                    &env,
                    Arc::new(FileDevice::open(p, &options).unwrap()),
                    &tunables,
                )
            })
            .collect();
        let mirror = Mirror::new(VdevId(9), &env, leaves, &tunables);
        let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
        mirror.write(1 << 20, SharedBuf::copy_from(&data), IoClass::AsyncWrite).await.unwrap();
        mirror.flush().await.unwrap();
        for path in &paths {
            let mut back = vec![0u8; data.len()];
            std::fs::File::open(path).unwrap().read_exact_at(&mut back, 1 << 20).unwrap();
            assert_eq!(back, data, "{} holds the write", path.display());
        }
        // Corrupt one leg behind the engine's back; reads must still return the data.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&paths[0])
            .unwrap()
            .write_all_at(&[0xff; 512], (1 << 20) + 4096)
            .unwrap();
        let expected = data.clone();
        let verify = move |got: &[u8]| got == &expected[..];
        for _ in 0..2 {
            let got = mirror.read(1 << 20, 65536, IoClass::SyncRead, &verify).await.unwrap();
            assert_eq!(&got[..], &data[..]);
        }
        assert_eq!(mirror.children()[0].stats().repairs.get(), 1);
        let mut healed = vec![0u8; data.len()];
        std::fs::File::open(&paths[0]).unwrap().read_exact_at(&mut healed, 1 << 20).unwrap();
        assert_eq!(healed, data, "the bad leg was rewritten");
    });
}
