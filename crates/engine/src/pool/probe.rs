//! What a device holds before a pool is created on it (ZFS: `zpool_in_use` in libzfs, and the
//! libblkid check `zpool create` makes): creating a pool overwrites the start and the end of
//! every leaf, so `sluice pool create` asks [`probe`] first and refuses, unless forced, when a
//! leaf already holds something. What counts, most telling first: the labels of a sluice pool,
//! the uberblocks a destroyed pool leaves behind (`pool destroy` zeroes only the label
//! headers), the signature of a filesystem, partition table or known container format, and
//! finally any non-zero byte in the first or last MiB (where the labels go). A new sparse or
//! all-zero device holds nothing. The probe only reads; whether a pool it finds is imported on
//! this machine is for the caller to say, since only the caller knows the pool cache.

use crate::device::{BlockDevice, DeviceError};

/// Bytes read at each end of the device: the sluice labels live there, and so does every
/// signature looked for.
pub const PROBE_WINDOW_BYTES: u64 = 1 << 20;

/// A known on-disk format, recognised by its magic bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signature {
    /// ext2/ext3/ext4: superblock magic 0xEF53 at 1080.
    Ext,
    /// XFS: "XFSB" at 0.
    Xfs,
    /// btrfs: "_BHRfS_M" at 65600.
    Btrfs,
    /// Linux swap: "SWAPSPACE2" ten bytes before the end of the first page.
    Swap,
    /// GPT: "EFI PART" at the start of the second sector.
    Gpt,
    /// MBR: 0x55AA at 510 with at least one partition entry filled in.
    Mbr,
    /// LUKS: "LUKS\xba\xbe" at 0.
    Luks,
    /// qcow2 image: "QFI\xfb" at 0.
    Qcow2,
    /// LVM physical volume: "LABELONE" at the start of one of the first four sectors.
    Lvm,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signature::Ext => "an ext2/ext3/ext4 filesystem",
            Signature::Xfs => "an XFS filesystem",
            Signature::Btrfs => "a btrfs filesystem",
            Signature::Swap => "Linux swap space",
            Signature::Gpt => "a GPT partition table",
            Signature::Mbr => "an MBR partition table",
            Signature::Luks => "a LUKS encrypted volume",
            Signature::Qcow2 => "a qcow2 image",
            Signature::Lvm => "an LVM physical volume",
        })
    }
}

/// What [`probe`] found on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finding {
    /// The device carries a valid label of a sluice pool (the newest one, by config txg).
    Pool { name: String, guid: u64 },
    /// No label, but uberblocks of a pool: what `sluice pool destroy` leaves.
    DestroyedPool { guid: u64 },
    /// Labels of a newer sluice: its magic, a format version this build cannot read.
    NewerPool { version: u16 },
    /// A filesystem, partition table or container format.
    Signature { signature: Signature, offset_bytes: u64 },
    /// Nothing recognised, but the first non-zero byte in the windows probed is here.
    Data { offset_bytes: u64 },
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Finding::Pool { name, guid } => {
                write!(f, "is part of sluice pool '{name}' (guid {guid:016x})")
            }
            Finding::NewerPool { version } => write!(
                f,
                "holds the labels of a pool written by a newer sluice (label format version \
                 {version}, which this build cannot read)"
            ),
            Finding::DestroyedPool { guid } => write!(
                f,
                "holds a destroyed sluice pool (guid {guid:016x}): its uberblocks remain, its \
                 labels were erased"
            ),
            Finding::Signature { signature, offset_bytes } => {
                write!(f, "holds {signature} (signature at offset {offset_bytes})")
            }
            Finding::Data { offset_bytes } => {
                write!(f, "holds data: non-zero bytes at offset {offset_bytes}")
            }
        }
    }
}

/// Looks at what `device` holds; `None` when it is all zeros where a pool would write (or too
/// small to read). Only a failed read of the device's first or last MiB is an error: a pool
/// could not be created there either.
pub async fn probe(device: &dyn BlockDevice) -> Result<Option<Finding>, DeviceError> {
    if let Some(header) = super::read_best_label(device).await {
        return Ok(Some(Finding::Pool { name: header.pool_name, guid: header.pool_guid }));
    }
    if let Some(version) = super::newer_label_version(device).await {
        return Ok(Some(Finding::NewerPool { version }));
    }
    let newest = super::read_uberblocks(device).await.into_iter().max_by_key(|u| u.txg);
    if let Some(uberblock) = newest {
        return Ok(Some(Finding::DestroyedPool { guid: uberblock.pool_guid }));
    }
    let sector = u64::from(device.sector_bytes().max(1));
    let end = device.len_bytes() / sector * sector;
    let head_len = end.min(PROBE_WINDOW_BYTES);
    if head_len == 0 {
        return Ok(None);
    }
    // Bounded by PROBE_WINDOW_BYTES.
    let head = device.read_at(0, head_len as u32).await?;
    if let Some((signature, offset_bytes)) = sniff(&head, sector) {
        return Ok(Some(Finding::Signature { signature, offset_bytes }));
    }
    if let Some(at) = head.iter().position(|&b| b != 0) {
        return Ok(Some(Finding::Data { offset_bytes: at as u64 }));
    }
    let tail_start = end.saturating_sub(PROBE_WINDOW_BYTES).max(head_len);
    if tail_start < end {
        let tail = device.read_at(tail_start, (end - tail_start) as u32).await?;
        if let Some(at) = tail.iter().position(|&b| b != 0) {
            return Ok(Some(Finding::Data { offset_bytes: tail_start + at as u64 }));
        }
    }
    Ok(None)
}

/// Page sizes a swap area may have been made with (on this machine or another): its signature
/// sits ten bytes before the end of the first page.
const SWAP_PAGE_BYTES: [usize; 4] = [4096, 8192, 16384, 65536];

/// The first known signature in the device's first bytes, and where it was found. Formats that
/// own byte 0 come first; an MBR is checked last because other formats' boot sectors carry its
/// 0x55AA too.
fn sniff(head: &[u8], sector_bytes: u64) -> Option<(Signature, u64)> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    let fixed: [(Signature, usize, &[u8]); 3] = [
        (Signature::Luks, 0, b"LUKS\xba\xbe"),
        (Signature::Qcow2, 0, b"QFI\xfb"),
        (Signature::Xfs, 0, b"XFSB"),
    ];
    for (signature, offset, magic) in fixed {
        if at(offset, magic) {
            return Some((signature, offset as u64));
        }
    }
    if let Some(offset) = (0..4).map(|s| s * 512).find(|&o| at(o, b"LABELONE")) {
        return Some((Signature::Lvm, offset as u64));
    }
    // The GPT header is in the second logical sector: 512 bytes in, or 4096 on 4Kn disks.
    let gpt = [512, usize::try_from(sector_bytes).unwrap_or(512)];
    if let Some(&offset) = gpt.iter().find(|&&o| at(o, b"EFI PART")) {
        return Some((Signature::Gpt, offset as u64));
    }
    if at(65600, b"_BHRfS_M") {
        return Some((Signature::Btrfs, 65600));
    }
    // s_magic, little-endian, 56 bytes into the superblock at 1024.
    if at(1080, &0xEF53u16.to_le_bytes()) {
        return Some((Signature::Ext, 1080));
    }
    if let Some(offset) = SWAP_PAGE_BYTES.iter().map(|p| p - 10).find(|&o| at(o, b"SWAPSPACE2")) {
        return Some((Signature::Swap, offset as u64));
    }
    let entries = head.get(446..510).is_some_and(|e| e.iter().any(|&b| b != 0));
    if at(510, &[0x55, 0xaa]) && entries {
        return Some((Signature::Mbr, 510));
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use futures::executor::block_on;
    use sluice_format::{
        uberblock_offset, LabelHeader, LeafConfig, TopConfig, TopKind, Uberblock, VdevTreeConfig,
        LABEL_BYTES, LABEL_HEADER_BYTES,
    };

    use super::*;
    use crate::device::{FileDevice, FileDeviceOptions, SharedBuf};

    const LEN: u64 = 64 << 20;

    /// A sparse file leaf of 64 MiB with `bytes` written at `offset` (nothing when empty).
    fn leaf(dir: &Path, name: &str, offset: u64, bytes: &[u8]) -> FileDevice {
        let path = dir.join(name);
        let options = FileDeviceOptions {
            create_len_bytes: Some(LEN),
            io_uring: false,
            direct: false,
            ..Default::default()
        };
        let device = FileDevice::open(&path, &options).unwrap();
        if !bytes.is_empty() {
            // Whole sectors around the bytes, so any offset can be written.
            let start = offset / 512 * 512;
            let end = (offset + bytes.len() as u64).div_ceil(512) * 512;
            let mut sectors = vec![0u8; (end - start) as usize];
            let at = (offset - start) as usize;
            sectors[at..at + bytes.len()].copy_from_slice(bytes);
            block_on(device.write_at(start, SharedBuf::copy_from(&sectors))).unwrap();
        }
        device
    }

    fn found(device: &FileDevice) -> Option<Finding> {
        block_on(probe(device)).unwrap()
    }

    /// A new sparse leaf holds nothing: creating a pool there needs no force.
    #[test]
    fn empty_leaf_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(found(&leaf(dir.path(), "empty", 0, &[])), None);
    }

    /// Each signature of the brief is named, with where it was found.
    #[test]
    fn signatures_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut mbr = vec![0u8; 66];
        mbr[4] = 0x83;
        mbr[64..].copy_from_slice(&[0x55, 0xaa]);
        let cases: [(u64, &[u8], Signature); 11] = [
            (1080, &[0x53, 0xef], Signature::Ext),
            (0, b"XFSB", Signature::Xfs),
            (65600, b"_BHRfS_M", Signature::Btrfs),
            (4086, b"SWAPSPACE2", Signature::Swap),
            (65526, b"SWAPSPACE2", Signature::Swap),
            (512, b"EFI PART", Signature::Gpt),
            (446, &mbr, Signature::Mbr),
            (0, b"LUKS\xba\xbe", Signature::Luks),
            (0, b"QFI\xfb", Signature::Qcow2),
            (512, b"LABELONE", Signature::Lvm),
            (1536, b"LABELONE", Signature::Lvm),
        ];
        for (i, (offset, magic, signature)) in cases.into_iter().enumerate() {
            let device = leaf(dir.path(), &format!("sig{i}"), offset, magic);
            let offset_bytes = if signature == Signature::Mbr { 510 } else { offset };
            let want = Finding::Signature { signature, offset_bytes };
            assert_eq!(found(&device), Some(want), "case {i}: {signature}");
        }
        // 0x55AA with an empty partition table is not an MBR; it is still data.
        let device = leaf(dir.path(), "bare55aa", 510, &[0x55, 0xaa]);
        assert_eq!(found(&device), Some(Finding::Data { offset_bytes: 510 }));
    }

    /// Bytes nobody recognises, at either end, are data, at their offset; the middle of the
    /// device is not read.
    #[test]
    fn data_at_either_end_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let head = leaf(dir.path(), "head", 8192, b"someone's data");
        assert_eq!(found(&head), Some(Finding::Data { offset_bytes: 8192 }));
        let tail = leaf(dir.path(), "tail", LEN - 1000, b"x");
        assert_eq!(found(&tail), Some(Finding::Data { offset_bytes: LEN - 1000 }));
        let middle = leaf(dir.path(), "middle", LEN / 2, b"unseen");
        assert_eq!(found(&middle), None);
        let message = Finding::Data { offset_bytes: 8192 }.to_string();
        assert_eq!(message, "holds data: non-zero bytes at offset 8192");
    }

    fn label(name: &str, guid: u64, config_txg: u64) -> [u8; LABEL_HEADER_BYTES] {
        let config = VdevTreeConfig {
            top: vec![TopConfig {
                kind: TopKind::Leaf,
                log: false,
                guid: 2,
                children: vec![LeafConfig { guid: 3, path: "a".into() }],
                raidz: None,
            }],
            encryption: false,
            properties: false,
            spares: Vec::new(),
            lz4_indirect: false,
        };
        let header = LabelHeader {
            ashift: 12,
            pool_guid: guid,
            leaf_guid: 3,
            top_guid: 2,
            config_txg,
            leaf_bytes: LEN,
            pool_name: name.into(),
            config,
        };
        header.encode().unwrap()
    }

    /// A sluice label names its pool; of two, the newer configuration wins. With the label
    /// headers zeroed (what `pool destroy` does), the uberblocks still show a destroyed pool.
    #[test]
    fn pools_and_destroyed_pools_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let device = leaf(dir.path(), "pool", 0, &label("old", 7, 1));
        let newer = SharedBuf::copy_from(&label("tank", 0xabc, 5));
        block_on(device.write_at(LEN - LABEL_BYTES, newer)).unwrap();
        let finding = found(&device).unwrap();
        assert_eq!(finding, Finding::Pool { name: "tank".into(), guid: 0xabc });
        assert_eq!(finding.to_string(), "is part of sluice pool 'tank' (guid 0000000000000abc)");

        let uberblock = Uberblock {
            txg: 9,
            pool_guid: 0xdef,
            guid_sum: 1,
            timestamp_secs: 1,
            root: None,
            complete_txg: 9,
        };
        let remains = leaf(dir.path(), "destroyed", uberblock_offset(0, 9), &uberblock.encode());
        assert_eq!(found(&remains), Some(Finding::DestroyedPool { guid: 0xdef }));
    }
}
