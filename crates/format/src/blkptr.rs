//! Block pointers (ZFS: `blkptr_t` in `spa.h`): where a block's copies live and how to verify it.
//!
//! A block pointer is embedded in its parent (an indirect block, an object's root, the
//! uberblock), whose own checksum covers it, so it carries no magic or checksum of its own. All
//! zeros is a hole: no block, reads as zeros.
//!
//! ```text
//! offset size field
//!      0   16 dva[0]: vdev u32 | asize_sectors u32 | offset_sectors u64
//!     16   16 dva[1] (all zero when unused)
//!     32   16 dva[2]
//!     48    4 lsize_sectors u32     logical size / 512
//!     52    4 psize_sectors u32     physical size / 512 (after compression)
//!     56    8 birth_txg u64         txg in which the block was written
//!     64    1 checksum_alg u8
//!     65    1 compression u8        BlockCompression: 0 none, 1 lz4, 2 zstd
//!     66    1 kind u8               BlockKind
//!     67    1 level u8              0 = data, n = indirect block n levels above data
//!     68    1 flags u8              bit 0: dedup (the block is shared through the dedup table)
//!                                   bit 1: encrypted (a data block of an encrypted volume)
//!                                   bit 2: children's MACs (an indirect block above encrypted
//!                                   blocks)
//!     69    3 reserved (zero)
//!     72    8 fill u64              data blocks beneath this pointer that are not holes
//!     80   16 checksum              of the block's physical bytes
//!     96   32 dedup key             keyed BLAKE3 of the block's contents when the dedup flag
//!                                   is set (how a free finds its table entry), else zero
//! ```
//!
//! An encrypted block (flag bit 1; ZFS gives up its third DVA the same way) has at most two
//! copies, and the third DVA's and the dedup key's bytes hold what its decryption needs:
//!
//! ```text
//!     32    8 salt u64              which block key encrypted it (derived from the volume's
//!                                   master key and this salt)
//!     40    8 key family u64        the guid of the key family (encryption root) whose master
//!                                   key that is: a read finds its key from the pointer alone
//!     96   12 iv                    AES-GCM's 96-bit nonce, random (or, in a volume with
//!                                   dedup, derived from a keyed MAC of the data)
//!    108   16 mac                   AES-GCM's tag over the ciphertext and the block's
//!                                   portable fields
//!    124    4 reserved (zero)
//! ```
//!
//! The checksum at 80 is over the ciphertext, so scrub, resilver and self-healing need no key.
//! An encrypted block with the dedup flag has as its dedup key its checksum followed by its
//! MAC: the same data in the same volume family encrypts to the same bytes, and the pair,
//! unlike a hash of the data, says nothing to whoever holds the disks.
//!
//! An indirect block above encrypted blocks (flag bit 2) keeps its three DVAs and holds at 96,
//! in place of a dedup key, a BLAKE3 hash of its children's portable fields and MACs
//! ([`BlockPointer::auth_bytes`]), so a child swapped for another or for an older version of
//! itself fails authentication at its parent, and the volume's root carries a keyed MAC over
//! the top of the tree.
//!
//! A compressed block (ZFS: `zio_compress.c`) is stored as a 4-byte little-endian length, that
//! many compressed bytes, and zeros up to whole sectors: `psize` counts all of it and the
//! checksum covers all of it, so scrub and resilver verify and copy it without decompressing.
//! The length is there because neither lz4's block format nor a zstd frame followed by padding
//! says where the compressed bytes end (ZFS stores the same 4-byte header for lz4).

use crate::codec::{Reader, Writer};
use crate::{Checksum, ChecksumAlg, DdtKey, FormatError, DDT_KEY_BYTES, SECTOR_BYTES};

pub const BLKPTR_BYTES: usize = 128;
/// Copies a block pointer can name (ZFS's ditto blocks: 3).
pub const DVAS_MAX: usize = 3;
const DVA_BYTES: usize = 16;

const OFF_LSIZE: usize = 48;
const OFF_PSIZE: usize = 52;
const OFF_BIRTH: usize = 56;
const OFF_ALG: usize = 64;
const OFF_COMPRESSION: usize = 65;
const OFF_KIND: usize = 66;
const OFF_LEVEL: usize = 67;
const OFF_FLAGS: usize = 68;
const OFF_RESERVED_A: usize = 69;
const OFF_FILL: usize = 72;
const OFF_CHECKSUM: usize = 80;
const OFF_DEDUP_KEY: usize = 96;
const OFF_SALT: usize = 32;
const OFF_FAMILY: usize = 40;
const OFF_IV: usize = 96;
const OFF_MAC: usize = 108;
const OFF_RESERVED_MAC: usize = 124;
const FLAG_DEDUP: u8 = 1;
const FLAG_ENCRYPTED: u8 = 2;
const FLAG_CHILDREN_MAC: u8 = 4;
const FLAGS_ENCRYPTED_DEDUP: u8 = FLAG_ENCRYPTED | FLAG_DEDUP;

/// Bytes of AES-GCM's nonce.
pub const IV_BYTES: usize = 12;
/// Bytes of AES-GCM's tag.
pub const MAC_BYTES: usize = 16;
/// Bytes of the hash of an indirect block's children's MACs.
pub const CHILDREN_MAC_BYTES: usize = 32;
/// Copies an encrypted block can name: its third DVA's bytes hold the salt.
pub const ENCRYPTED_DVAS_MAX: usize = 2;

const _: () = assert!(DVAS_MAX * DVA_BYTES == OFF_LSIZE);
const _: () = assert!(OFF_DEDUP_KEY + DDT_KEY_BYTES == BLKPTR_BYTES);
const _: () = assert!(OFF_SALT == ENCRYPTED_DVAS_MAX * DVA_BYTES);
const _: () = assert!(OFF_IV + IV_BYTES == OFF_MAC && OFF_RESERVED_MAC == OFF_MAC + MAC_BYTES);
const _: () = assert!(MAC_BYTES * 2 == DDT_KEY_BYTES);
const _: () = assert!(OFF_DEDUP_KEY + CHILDREN_MAC_BYTES == BLKPTR_BYTES);

const WHAT: &str = "block pointer";

/// One copy's address: a top-level vdev and an offset inside it, both in sectors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dva {
    pub vdev: u32,
    pub asize_sectors: u32,
    pub offset_sectors: u64,
}

impl Dva {
    pub fn is_empty(&self) -> bool {
        *self == Dva::default()
    }

    pub fn offset_bytes(&self) -> u64 {
        self.offset_sectors * u64::from(SECTOR_BYTES)
    }

    pub fn asize_bytes(&self) -> u64 {
        u64::from(self.asize_sectors) * u64::from(SECTOR_BYTES)
    }
}

/// What a block holds; lets scrub and debugging tools tell metadata from data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockKind {
    /// A hole: nothing is stored.
    None = 0,
    /// Volume data.
    Data = 1,
    /// An indirect block: an array of block pointers.
    Indirect = 2,
    /// Pool metadata (object directory, space maps, volume roots).
    Metadata = 3,
}

impl BlockKind {
    fn decode(raw: u8) -> Result<BlockKind, FormatError> {
        match raw {
            0 => Ok(BlockKind::None),
            1 => Ok(BlockKind::Data),
            2 => Ok(BlockKind::Indirect),
            3 => Ok(BlockKind::Metadata),
            value => {
                Err(FormatError::Invalid { what: WHAT, field: "kind", value: u64::from(value) })
            }
        }
    }
}

/// How a block's physical bytes encode its logical bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BlockCompression {
    /// Stored as it is: physical and logical bytes are the same.
    #[default]
    None = 0,
    Lz4 = 1,
    Zstd = 2,
}

impl BlockCompression {
    fn decode(raw: u8) -> Result<BlockCompression, FormatError> {
        match raw {
            0 => Ok(BlockCompression::None),
            1 => Ok(BlockCompression::Lz4),
            2 => Ok(BlockCompression::Zstd),
            value => Err(FormatError::Invalid {
                what: WHAT,
                field: "compression",
                value: u64::from(value),
            }),
        }
    }
}

/// Bytes of the length that starts a compressed block's physical bytes.
pub const COMPRESSED_HEADER_BYTES: usize = 4;

/// What a block pointer carries for encryption.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BlockCrypt {
    /// Not part of an encrypted volume's tree.
    #[default]
    None,
    /// A data block stored encrypted: AES-256-GCM under the key derived from the volume's
    /// master key and `salt`, with nonce `iv`; `mac` is the tag.
    Encrypted { family: u64, salt: u64, iv: [u8; IV_BYTES], mac: [u8; MAC_BYTES] },
    /// An indirect block above encrypted blocks: the hash of its children's
    /// [`BlockPointer::auth_bytes`].
    ChildrenMac([u8; CHILDREN_MAC_BYTES]),
}

/// Bytes of [`BlockPointer::auth_bytes`].
pub const AUTH_BYTES: usize = 64;

/// A decoded block pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockPointer {
    pub dvas: [Dva; DVAS_MAX],
    pub lsize_sectors: u32,
    pub psize_sectors: u32,
    pub birth_txg: u64,
    pub checksum_alg: ChecksumAlg,
    /// `None` unless the block is stored compressed (then `psize < lsize`).
    pub compression: BlockCompression,
    pub kind: BlockKind,
    pub level: u8,
    pub fill: u64,
    pub checksum: Checksum,
    /// Set on data blocks written through the dedup table: the entry that counts their
    /// references. Freeing such a pointer drops a reference instead of the space. On an
    /// encrypted block it is the checksum followed by the MAC.
    pub dedup: Option<DdtKey>,
    pub crypt: BlockCrypt,
}

impl BlockPointer {
    /// Copies named (non-empty DVAs).
    pub fn copies(&self) -> impl Iterator<Item = &Dva> {
        self.dvas.iter().filter(|d| !d.is_empty())
    }

    pub fn lsize_bytes(&self) -> u64 {
        u64::from(self.lsize_sectors) * u64::from(SECTOR_BYTES)
    }

    pub fn psize_bytes(&self) -> u64 {
        u64::from(self.psize_sectors) * u64::from(SECTOR_BYTES)
    }

    /// The dedup key of an encrypted block whose checksum and MAC are these: how a free of a
    /// deduplicated encrypted block finds its table entry without a key.
    pub fn encrypted_dedup_key(checksum: &Checksum, mac: &[u8; MAC_BYTES]) -> DdtKey {
        let mut key = [0u8; DDT_KEY_BYTES];
        key[..MAC_BYTES].copy_from_slice(&checksum.0);
        key[MAC_BYTES..].copy_from_slice(mac);
        DdtKey(key)
    }

    /// What a parent's hash of its children's MACs covers of this pointer (a hole: all zeros):
    /// the fields that describe the block wherever it is stored, which a raw send carries and
    /// a receive keeps. Left out, as ZFS leaves them out: where the copies are (DVAs), when it
    /// was written (a receive writes it in another txg), the checksum (the MAC covers the
    /// ciphertext), and the dedup flag (a receive may store the block either way). An
    /// indirect block's stored size and compression are left out too (written as a 16 KiB
    /// block stored plain, as every indirect block was before the `lz4_indirect` feature, so
    /// MACs made then still hold): a receive builds its own indirect blocks, whose compressed
    /// size follows its own addresses and allocation unit (ZFS:
    /// `zio_crypt_bp_zero_nonportable_blkprop`).
    pub fn auth_bytes(pointer: Option<&BlockPointer>) -> [u8; AUTH_BYTES] {
        let mut out = [0u8; AUTH_BYTES];
        let Some(bp) = pointer else { return out };
        let mut w = Writer::new(&mut out);
        w.u32(0, bp.lsize_sectors);
        let (psize_sectors, compression) = if bp.level > 0 {
            (bp.lsize_sectors, BlockCompression::None)
        } else {
            (bp.psize_sectors, bp.compression)
        };
        w.u32(4, psize_sectors);
        w.u8(8, compression as u8);
        w.u8(9, bp.kind as u8);
        w.u8(10, bp.level);
        w.u64(16, bp.fill);
        match &bp.crypt {
            BlockCrypt::None => {}
            BlockCrypt::Encrypted { family, salt, iv, mac } => {
                w.u8(11, FLAG_ENCRYPTED);
                w.u64(24, *salt);
                w.put(32, iv);
                w.put(44, mac);
                w.u64(56, *family);
            }
            BlockCrypt::ChildrenMac(hash) => {
                w.u8(11, FLAG_CHILDREN_MAC);
                w.put(24, hash);
            }
        }
        out
    }

    /// True when `bytes` (the block's physical contents) match this pointer's checksum.
    pub fn verifies(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 == self.psize_bytes()
            && self.checksum_alg.compute(bytes) == self.checksum
    }

    /// Encodes `pointer`, or a hole for `None`.
    pub fn encode(pointer: Option<&BlockPointer>) -> [u8; BLKPTR_BYTES] {
        let mut out = [0u8; BLKPTR_BYTES];
        let Some(bp) = pointer else { return out };
        debug_assert!(bp.copies().count() > 0, "a block pointer names at least one copy");
        let mut w = Writer::new(&mut out);
        for (i, dva) in bp.dvas.iter().enumerate() {
            let at = i * DVA_BYTES;
            w.u32(at, dva.vdev);
            w.u32(at + 4, dva.asize_sectors);
            w.u64(at + 8, dva.offset_sectors);
        }
        w.u32(OFF_LSIZE, bp.lsize_sectors);
        w.u32(OFF_PSIZE, bp.psize_sectors);
        w.u64(OFF_BIRTH, bp.birth_txg);
        w.u8(OFF_ALG, bp.checksum_alg as u8);
        w.u8(OFF_COMPRESSION, bp.compression as u8);
        w.u8(OFF_KIND, bp.kind as u8);
        w.u8(OFF_LEVEL, bp.level);
        let mut flags = 0;
        match &bp.crypt {
            BlockCrypt::None => {
                if let Some(key) = &bp.dedup {
                    flags |= FLAG_DEDUP;
                    w.put(OFF_DEDUP_KEY, &key.0);
                }
            }
            BlockCrypt::Encrypted { family, salt, iv, mac } => {
                // Their bytes hold the salt and family; a dedup key must be findable from the
                // decoded pointer. Either broken would lose track of space or references.
                assert!(
                    bp.dvas[ENCRYPTED_DVAS_MAX..].iter().all(Dva::is_empty),
                    "an encrypted block has at most {ENCRYPTED_DVAS_MAX} copies"
                );
                assert!(
                    bp.dedup.is_none_or(|key| {
                        key == BlockPointer::encrypted_dedup_key(&bp.checksum, mac)
                    }),
                    "an encrypted block's dedup key is its checksum and MAC"
                );
                flags |= FLAG_ENCRYPTED;
                if bp.dedup.is_some() {
                    flags |= FLAG_DEDUP;
                }
                w.u64(OFF_SALT, *salt);
                w.u64(OFF_FAMILY, *family);
                w.put(OFF_IV, iv);
                w.put(OFF_MAC, mac);
            }
            BlockCrypt::ChildrenMac(hash) => {
                debug_assert!(bp.dedup.is_none(), "indirect blocks are not deduplicated");
                flags |= FLAG_CHILDREN_MAC;
                w.put(OFF_DEDUP_KEY, hash);
            }
        }
        w.u8(OFF_FLAGS, flags);
        w.u64(OFF_FILL, bp.fill);
        w.put(OFF_CHECKSUM, &bp.checksum.0);
        out
    }

    /// The fill of an encoded pointer, read without decoding it (a hole's is 0): how a parent
    /// whose other slots are copied as they are sums its children.
    pub fn encoded_fill(bytes: &[u8; BLKPTR_BYTES]) -> u64 {
        let mut fill = [0u8; 8];
        fill.copy_from_slice(&bytes[OFF_FILL..OFF_FILL + 8]);
        u64::from_le_bytes(fill)
    }

    /// Whether an encoded pointer is part of an encrypted tree (an encrypted block, or an
    /// indirect block over them), read without decoding it: a parent over such a slot hashes
    /// its children's MACs, which needs every slot decoded.
    pub fn encoded_is_authenticated(bytes: &[u8; BLKPTR_BYTES]) -> bool {
        bytes[OFF_FLAGS] & (FLAG_ENCRYPTED | FLAG_CHILDREN_MAC) != 0
    }

    /// Decodes a block pointer; `Ok(None)` is a hole.
    pub fn decode(bytes: &[u8]) -> Result<Option<BlockPointer>, FormatError> {
        let r = Reader::new(WHAT, bytes, BLKPTR_BYTES)?;
        if r.slice(0, BLKPTR_BYTES)?.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let flags = r.u8(OFF_FLAGS)?;
        let encrypted = flags & FLAG_ENCRYPTED != 0;
        let copies = if encrypted { ENCRYPTED_DVAS_MAX } else { DVAS_MAX };
        let mut dvas = [Dva::default(); DVAS_MAX];
        for (i, dva) in dvas.iter_mut().enumerate().take(copies) {
            let at = i * DVA_BYTES;
            *dva = Dva {
                vdev: r.u32(at)?,
                asize_sectors: r.u32(at + 4)?,
                offset_sectors: r.u64(at + 8)?,
            };
        }
        if dvas[0].is_empty() {
            return Err(FormatError::Invalid { what: WHAT, field: "dva[0]", value: 0 });
        }
        let compression = BlockCompression::decode(r.u8(OFF_COMPRESSION)?)?;
        r.zeros(OFF_RESERVED_A, OFF_FILL - OFF_RESERVED_A)?;
        let checksum = Checksum(r.bytes16(OFF_CHECKSUM)?);
        let bad_flags =
            || FormatError::Invalid { what: WHAT, field: "flags", value: u64::from(flags) };
        let (dedup, crypt) = match flags {
            0 => {
                r.zeros(OFF_DEDUP_KEY, DDT_KEY_BYTES)?;
                (None, BlockCrypt::None)
            }
            FLAG_DEDUP => {
                let mut key = [0u8; DDT_KEY_BYTES];
                key.copy_from_slice(r.slice(OFF_DEDUP_KEY, DDT_KEY_BYTES)?);
                (Some(DdtKey(key)), BlockCrypt::None)
            }
            FLAG_ENCRYPTED | FLAGS_ENCRYPTED_DEDUP => {
                r.zeros(OFF_RESERVED_MAC, BLKPTR_BYTES - OFF_RESERVED_MAC)?;
                let mut iv = [0u8; IV_BYTES];
                iv.copy_from_slice(r.slice(OFF_IV, IV_BYTES)?);
                let mac = r.bytes16(OFF_MAC)?;
                let dedup = (flags & FLAG_DEDUP != 0)
                    .then(|| BlockPointer::encrypted_dedup_key(&checksum, &mac));
                let (salt, family) = (r.u64(OFF_SALT)?, r.u64(OFF_FAMILY)?);
                (dedup, BlockCrypt::Encrypted { family, salt, iv, mac })
            }
            FLAG_CHILDREN_MAC => {
                let mut hash = [0u8; CHILDREN_MAC_BYTES];
                hash.copy_from_slice(r.slice(OFF_DEDUP_KEY, CHILDREN_MAC_BYTES)?);
                (None, BlockCrypt::ChildrenMac(hash))
            }
            _ => return Err(bad_flags()),
        };
        let (kind_raw, level) = (r.u8(OFF_KIND)?, r.u8(OFF_LEVEL)?);
        // Only data blocks are encrypted, of a family, and only indirect blocks hash their
        // children.
        let crypt_fits = match crypt {
            BlockCrypt::None => true,
            BlockCrypt::Encrypted { family, .. } => {
                kind_raw == BlockKind::Data as u8 && level == 0 && family != 0
            }
            BlockCrypt::ChildrenMac(_) => kind_raw == BlockKind::Indirect as u8 && level > 0,
        };
        if !crypt_fits {
            return Err(bad_flags());
        }
        let psize_sectors = r.u32(OFF_PSIZE)?;
        let lsize_sectors = r.u32(OFF_LSIZE)?;
        if psize_sectors == 0 || lsize_sectors == 0 {
            return Err(FormatError::Invalid { what: WHAT, field: "size", value: 0 });
        }
        let kind = BlockKind::decode(r.u8(OFF_KIND)?)?;
        if compression != BlockCompression::None
            && !matches!(kind, BlockKind::Data | BlockKind::Indirect)
        {
            // Data and indirect blocks may be stored compressed; pool metadata readers take
            // stored bytes as they are.
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "compression of a block that is neither data nor indirect",
                value: compression as u64,
            });
        }
        if compression != BlockCompression::None && psize_sectors >= lsize_sectors {
            // Stored compressed only when that saves space: anything else is damage.
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "psize of a compressed block",
                value: u64::from(psize_sectors),
            });
        }
        Ok(Some(BlockPointer {
            dvas,
            lsize_sectors,
            psize_sectors,
            birth_txg: r.u64(OFF_BIRTH)?,
            checksum_alg: ChecksumAlg::decode(WHAT, r.u8(OFF_ALG)?)?,
            compression,
            kind,
            level: r.u8(OFF_LEVEL)?,
            fill: r.u64(OFF_FILL)?,
            checksum,
            dedup,
            crypt,
        }))
    }
}
