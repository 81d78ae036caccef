//! An encryption root's wrapped key (ZFS: the DSL Crypto Key object of `dsl_crypt.c`): the
//! volume family's master key, encrypted under a key derived from what the user holds, and
//! what it takes to derive that key again.
//!
//! A volume created with encryption is an encryption root: a random 256-bit master key is
//! made for it, and its snapshots and clones share it (a key family). Nothing stored here lets
//! anyone read data without the user's key: the master key is sealed with AES-256-GCM under
//! the wrapping key (the user's 32 raw bytes, or Argon2id of their passphrase with the stored
//! parameters and salt), and the seal's additional data is [`WrappedKey::wrap_aad`], so a
//! changed suite, key format or KDF parameter fails the unwrap rather than weakening it. A
//! wrong key fails the same way, which is how `key load` tells a wrong key. `key change`
//! writes a new wrapping (new salt, new IV) of the same master key, so no data is rewritten.
//!
//! The record lives in the pool directory, whose checksum covers it, so it has no magic or
//! checksum of its own.
//!
//! ```text
//! offset size field
//!      0    8 guid u64              the key family's identity (random; in the wrap's AAD)
//!      8    1 suite u8              1: aes-256-gcm
//!      9    1 key format u8         1: raw (32 bytes), 2: hex (64 digits), 3: passphrase
//!     10    1 kdf u8                0: none (raw and hex), 1: argon2id (passphrase)
//!     11    1 key location kind u8  0: prompt, 1: a file (its path follows the fixed part)
//!     12    2 key location length u16
//!     14    2 reserved (zero)
//!     16    4 argon2 memory KiB u32 zero unless kdf is argon2id
//!     20    4 argon2 passes u32
//!     24    4 argon2 lanes u32
//!     28    4 reserved (zero)
//!     32   16 kdf salt              random, new at every create and key change
//!     48   12 wrap iv               random
//!     60   16 wrap mac              AES-GCM's tag over the wrapped master key
//!     76   32 wrapped master key
//!    108    4 reserved (zero)
//!    112    n key location          the file's absolute path, UTF-8, n = the length above
//! ```

use crate::codec::{Reader, Writer};
use crate::{FormatError, IV_BYTES, MAC_BYTES};

/// Bytes of a master key (and of the wrapping key that seals it).
pub const MASTER_KEY_BYTES: usize = 32;
/// Bytes of the KDF's salt.
pub const KDF_SALT_BYTES: usize = 16;
/// Bytes of a wrapped key's fixed part; the key location's path follows.
pub const WRAPPED_KEY_FIXED_BYTES: usize = 112;
/// The longest key location path.
pub const KEY_LOCATION_BYTES_MAX: usize = 1024;
/// Bytes of [`WrappedKey::wrap_aad`].
pub const WRAP_AAD_BYTES: usize = 48;
/// The most Argon2id memory (KiB), passes and lanes a stored record may ask for: a record
/// changed on the disk, or a raw stream's, must not make a key load take the machine's
/// memory or hours before the unwrap can tell it was changed. New keys use far less.
pub const ARGON2_MEMORY_KIB_MAX: u32 = 1 << 20;
pub const ARGON2_PASSES_MAX: u32 = 64;
pub const ARGON2_LANES_MAX: u32 = 16;

const OFF_GUID: usize = 0;
const OFF_SUITE: usize = 8;
const OFF_FORMAT: usize = 9;
const OFF_KDF: usize = 10;
const OFF_LOCATION_KIND: usize = 11;
const OFF_LOCATION_LEN: usize = 12;
const OFF_RESERVED_A: usize = 14;
const OFF_MEMORY: usize = 16;
const OFF_PASSES: usize = 20;
const OFF_LANES: usize = 24;
const OFF_RESERVED_B: usize = 28;
const OFF_SALT: usize = 32;
const OFF_IV: usize = 48;
const OFF_MAC: usize = 60;
const OFF_WRAPPED: usize = 76;
const OFF_RESERVED_C: usize = 108;

const _: () = assert!(OFF_SALT + KDF_SALT_BYTES == OFF_IV);
const _: () = assert!(OFF_IV + IV_BYTES == OFF_MAC);
const _: () = assert!(OFF_MAC + MAC_BYTES == OFF_WRAPPED);
const _: () = assert!(OFF_WRAPPED + MASTER_KEY_BYTES == OFF_RESERVED_C);
const _: () = assert!(OFF_RESERVED_C + 4 == WRAPPED_KEY_FIXED_BYTES);

const WHAT: &str = "wrapped key";

/// The cipher a key family's blocks are encrypted with. Fixed when the family is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CryptSuite {
    Aes256Gcm = 1,
}

impl CryptSuite {
    /// The name users give and see (`--encryption aes-256-gcm`).
    pub fn name(self) -> &'static str {
        match self {
            CryptSuite::Aes256Gcm => "aes-256-gcm",
        }
    }
}

/// How the user's key is given (ZFS: `keyformat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyFormat {
    /// 32 bytes, as they are.
    Raw = 1,
    /// 64 hexadecimal digits.
    Hex = 2,
    /// A passphrase of 8 to 512 bytes, stretched with Argon2id.
    Passphrase = 3,
}

impl KeyFormat {
    pub fn name(self) -> &'static str {
        match self {
            KeyFormat::Raw => "raw",
            KeyFormat::Hex => "hex",
            KeyFormat::Passphrase => "passphrase",
        }
    }
}

/// Where the user's key is found when it is loaded without saying (ZFS: `keylocation`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyLocation {
    /// Asked for on the terminal (or given by `key load`).
    Prompt,
    /// Read from this file (an absolute path; `file:///path` on the command line).
    File(String),
}

/// Argon2id's parameters for a passphrase, stored so that the same wrapping key is derived
/// again whatever the defaults become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Argon2Params {
    pub memory_kib: u32,
    pub passes: u32,
    pub lanes: u32,
    pub salt: [u8; KDF_SALT_BYTES],
}

/// An encryption root's master key, sealed under the user's key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WrappedKey {
    pub guid: u64,
    pub suite: CryptSuite,
    pub format: KeyFormat,
    /// `Some` exactly when `format` is [`KeyFormat::Passphrase`].
    pub kdf: Option<Argon2Params>,
    pub location: KeyLocation,
    pub iv: [u8; IV_BYTES],
    pub mac: [u8; MAC_BYTES],
    pub wrapped: [u8; MASTER_KEY_BYTES],
}

impl WrappedKey {
    /// Bytes [`WrappedKey::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        WRAPPED_KEY_FIXED_BYTES + self.location_bytes().len()
    }

    fn location_bytes(&self) -> &[u8] {
        match &self.location {
            KeyLocation::Prompt => &[],
            KeyLocation::File(path) => path.as_bytes(),
        }
    }

    /// The additional data the master key's seal authenticates: every field that decides how
    /// the wrapping key is derived and what it wraps, so none can be changed on the disk to a
    /// weaker one without the unwrap failing. The key location is left out: it says only
    /// where to look, and may change without the key.
    pub fn wrap_aad(&self) -> [u8; WRAP_AAD_BYTES] {
        let mut out = [0u8; WRAP_AAD_BYTES];
        let mut w = Writer::new(&mut out);
        w.put(0, b"sluice wrapped key v1\0\0\0");
        w.u64(24, self.guid);
        w.u8(32, self.suite as u8);
        w.u8(33, self.format as u8);
        if let Some(kdf) = &self.kdf {
            w.u8(34, 1);
            w.u32(36, kdf.memory_kib);
            w.u32(40, kdf.passes);
            w.u32(44, kdf.lanes);
        }
        out
    }

    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let location = self.location_bytes();
        if location.len() > KEY_LOCATION_BYTES_MAX {
            return Err(FormatError::TooLarge {
                what: WHAT,
                len: location.len(),
                max: KEY_LOCATION_BYTES_MAX,
            });
        }
        if self.kdf.is_some() != (self.format == KeyFormat::Passphrase) {
            return Err(FormatError::Invalid {
                what: WHAT,
                field: "kdf for this key format",
                value: self.format as u64,
            });
        }
        let mut out = vec![0u8; self.encoded_len()];
        let mut w = Writer::new(&mut out);
        w.u64(OFF_GUID, self.guid);
        w.u8(OFF_SUITE, self.suite as u8);
        w.u8(OFF_FORMAT, self.format as u8);
        if let Some(kdf) = &self.kdf {
            w.u8(OFF_KDF, 1);
            w.u32(OFF_MEMORY, kdf.memory_kib);
            w.u32(OFF_PASSES, kdf.passes);
            w.u32(OFF_LANES, kdf.lanes);
            w.put(OFF_SALT, &kdf.salt);
        }
        if let KeyLocation::File(_) = self.location {
            w.u8(OFF_LOCATION_KIND, 1);
        }
        // Checked against KEY_LOCATION_BYTES_MAX above.
        w.u16(OFF_LOCATION_LEN, location.len() as u16);
        w.put(OFF_IV, &self.iv);
        w.put(OFF_MAC, &self.mac);
        w.put(OFF_WRAPPED, &self.wrapped);
        w.put(WRAPPED_KEY_FIXED_BYTES, location);
        Ok(out)
    }

    /// Decodes a wrapped key from the start of `bytes`; returns it and the bytes it took.
    pub fn decode(bytes: &[u8]) -> Result<(WrappedKey, usize), FormatError> {
        let r = Reader::new(WHAT, bytes, WRAPPED_KEY_FIXED_BYTES)?;
        let invalid =
            |field, value: u8| FormatError::Invalid { what: WHAT, field, value: u64::from(value) };
        let suite = match r.u8(OFF_SUITE)? {
            1 => CryptSuite::Aes256Gcm,
            other => return Err(invalid("suite", other)),
        };
        let format = match r.u8(OFF_FORMAT)? {
            1 => KeyFormat::Raw,
            2 => KeyFormat::Hex,
            3 => KeyFormat::Passphrase,
            other => return Err(invalid("key format", other)),
        };
        r.zeros(OFF_RESERVED_A, OFF_MEMORY - OFF_RESERVED_A)?;
        r.zeros(OFF_RESERVED_B, OFF_SALT - OFF_RESERVED_B)?;
        r.zeros(OFF_RESERVED_C, WRAPPED_KEY_FIXED_BYTES - OFF_RESERVED_C)?;
        let kdf = match r.u8(OFF_KDF)? {
            0 => {
                r.zeros(OFF_MEMORY, OFF_RESERVED_B - OFF_MEMORY)?;
                r.zeros(OFF_SALT, KDF_SALT_BYTES)?;
                None
            }
            1 => {
                let params = Argon2Params {
                    memory_kib: r.u32(OFF_MEMORY)?,
                    passes: r.u32(OFF_PASSES)?,
                    lanes: r.u32(OFF_LANES)?,
                    salt: r.bytes16(OFF_SALT)?,
                };
                let bounded = |value: u32, max: u32, field| {
                    if (1..=max).contains(&value) {
                        Ok(())
                    } else {
                        Err(FormatError::Invalid { what: WHAT, field, value: u64::from(value) })
                    }
                };
                bounded(params.memory_kib, ARGON2_MEMORY_KIB_MAX, "argon2 memory KiB")?;
                bounded(params.passes, ARGON2_PASSES_MAX, "argon2 passes")?;
                bounded(params.lanes, ARGON2_LANES_MAX, "argon2 lanes")?;
                Some(params)
            }
            other => return Err(invalid("kdf", other)),
        };
        if kdf.is_some() != (format == KeyFormat::Passphrase) {
            return Err(invalid("kdf for this key format", format as u8));
        }
        let len = usize::from(r.u16(OFF_LOCATION_LEN)?);
        if len > KEY_LOCATION_BYTES_MAX {
            return Err(FormatError::TooLarge { what: WHAT, len, max: KEY_LOCATION_BYTES_MAX });
        }
        let location = match r.u8(OFF_LOCATION_KIND)? {
            0 if len == 0 => KeyLocation::Prompt,
            1 if len > 0 => {
                let raw = r.slice(WRAPPED_KEY_FIXED_BYTES, len)?;
                let path =
                    std::str::from_utf8(raw).map_err(|_| invalid("key location (not UTF-8)", 1))?;
                KeyLocation::File(path.to_owned())
            }
            other => return Err(invalid("key location kind", other)),
        };
        let mut iv = [0u8; IV_BYTES];
        iv.copy_from_slice(r.slice(OFF_IV, IV_BYTES)?);
        let mut wrapped = [0u8; MASTER_KEY_BYTES];
        wrapped.copy_from_slice(r.slice(OFF_WRAPPED, MASTER_KEY_BYTES)?);
        let key = WrappedKey {
            guid: r.u64(OFF_GUID)?,
            suite,
            format,
            kdf,
            location,
            iv,
            mac: r.bytes16(OFF_MAC)?,
            wrapped,
        };
        Ok((key, WRAPPED_KEY_FIXED_BYTES + len))
    }
}
