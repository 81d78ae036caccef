//! The encrypt and decrypt stages' cryptography, and the keys they use (ZFS: `zio_crypt.c`,
//! and the key derivation of `dsl_crypt.c`).
//!
//! Three levels of key, as in ZFS:
//! - the **wrapping key**: what the user holds (32 raw bytes, 64 hex digits, or a passphrase
//!   stretched with Argon2id under a stored salt and parameters, [`WrappingKey::derive`]). It
//!   seals the master key and nothing else, so changing it rewrites no data;
//! - the **master key** of a key family (an encryption root with its snapshots and clones):
//!   256 random bits, stored only sealed ([`MasterKey::wrap`], [`MasterKey::unwrap`]);
//! - **block keys**, one per salt: BLAKE3's key derivation of the master key and a random
//!   64-bit salt ([`MasterKey::block_key`]). Blocks carry their salt, and a family draws a new
//!   one at every key load and after [`SALT_USES_MAX`] blocks, so no block key meets enough
//!   random nonces for two to collide: 96-bit nonces drawn at random collide with probability
//!   about n²/2⁹⁷, under 10⁻¹² for n below 4·10⁸ (ZFS's `ZFS_CURRENT_MAX_SALT_USES`).
//!
//! Nonces are random, from OpenSSL's CSPRNG (a DRBG seeded from the kernel and reseeded after
//! a fork), never derived from where or when a block is written: a pool rewound to an older
//! txg writes other data at the same places and txgs, and a derived nonce would then be used
//! twice under one key, which gives away both plaintexts' XOR and GCM's authentication key
//! (why ZFS dropped Solaris's derived IVs). In a volume with dedup the salt and nonce are
//! instead taken from a keyed MAC of the data under the family's dedup key
//! ([`MasterKey::convergent`]), so equal data encrypts to equal bytes; a nonce then repeats
//! only with the same plaintext, which repeats the same ciphertext and tells nothing new.
//!
//! The cipher is AES-256-GCM through OpenSSL, already linked for TLS: its x86-64 code
//! interleaves AES-NI and PCLMULQDQ in one pass (docs/bench/encryption.md measures it here).
//! BLAKE3 (already the dedup hash) derives keys: it is built to be a KDF, and a block key costs
//! one compression of 72 bytes. Argon2id (RustCrypto's `argon2`; OpenSSL 3.0 has none)
//! stretches passphrases. Keys are zeroed when dropped (`zeroize`).

use foreign_types::ForeignTypeRef;
use openssl::cipher::Cipher;
use openssl::cipher_ctx::{CipherCtx, CipherCtxRef};
use parking_lot::RwLock;
use sluice_format::{
    Argon2Params, BlockCompression, BlockCrypt, BlockKind, BlockPointer, CryptSuite, KeyFormat,
    WrappedKey, IV_BYTES, KDF_SALT_BYTES, MAC_BYTES, MASTER_KEY_BYTES,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::device::{AlignedBuf, UninitBuf};

/// Blocks encrypted under one salt before the family draws another (ZFS: 400,000,000).
pub const SALT_USES_MAX: u64 = 400_000_000;
/// A passphrase's length bounds, in bytes (ZFS's).
pub const PASSPHRASE_BYTES_MIN: usize = 8;
pub const PASSPHRASE_BYTES_MAX: usize = 512;
/// AES-GCM contexts a family keeps with their block key expanded, for reuse (see
/// [`Contexts`]): enough for every thread of the pipeline to seal under the current salt and
/// open blocks of a few older ones at once.
const CONTEXTS_MAX: usize = 32;
/// Argon2id's parameters for new passphrases: RFC 9106's second recommendation (64 MiB, three
/// passes), with one lane, since a key load runs on one thread. Stored with each wrapped key.
pub const ARGON2_MEMORY_KIB: u32 = 64 << 10;
pub const ARGON2_PASSES: u32 = 3;
pub const ARGON2_LANES: u32 = 1;

/// BLAKE3 key-derivation contexts: one per kind of key, so no two kinds can coincide.
const CONTEXT_BLOCK: &str = "sluice 2026-11-29 block key";
const CONTEXT_DEDUP: &str = "sluice 2026-11-29 dedup key";
const CONTEXT_TREE: &str = "sluice 2026-11-29 tree mac key";
const CONTEXT_CHILDREN: &str = "sluice 2026-11-29 children mac";

/// What went wrong with a key or a sealed block. Messages never include key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptError {
    /// The key did not unseal the master key: it is not this family's key.
    #[error("the key is wrong")]
    WrongKey,
    /// A block's MAC did not match: its bytes, or the fields its MAC covers, were changed.
    #[error("authentication failed: the block was changed or is not this volume's")]
    Authentication,
    #[error("a raw key is {want} bytes; this one is {found}")]
    RawKeyLength { want: usize, found: usize },
    #[error("a hex key is {want} hexadecimal digits; {found}")]
    HexKey { want: usize, found: String },
    #[error(
        "a passphrase is {PASSPHRASE_BYTES_MIN} to {PASSPHRASE_BYTES_MAX} bytes; this one is {found}"
    )]
    PassphraseLength { found: usize },
    #[error("Argon2id failed: {0}")]
    Kdf(String),
    /// OpenSSL failed (not for a wrong key or a bad tag, which are the variants above).
    #[error("OpenSSL: {0}")]
    OpenSsl(#[from] openssl::error::ErrorStack),
}

/// Fills `out` from OpenSSL's CSPRNG.
pub fn random_bytes(out: &mut [u8]) -> Result<(), CryptError> {
    openssl::rand::rand_bytes(out)?;
    Ok(())
}

/// A random u64 from the CSPRNG.
pub fn random_u64() -> Result<u64, CryptError> {
    let mut raw = [0u8; 8];
    random_bytes(&mut raw)?;
    Ok(u64::from_le_bytes(raw))
}

/// The user's key as given, before derivation: zeroed on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct UserKey(Vec<u8>);

impl UserKey {
    pub fn new(bytes: Vec<u8>) -> UserKey {
        UserKey(bytes)
    }
}

impl std::fmt::Debug for UserKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserKey({} bytes)", self.0.len())
    }
}

/// The key that seals a master key.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct WrappingKey([u8; MASTER_KEY_BYTES]);

impl std::fmt::Debug for WrappingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WrappingKey(..)")
    }
}

impl WrappingKey {
    /// Checks `user` against `format`'s rules and derives the wrapping key (for a passphrase,
    /// with `kdf`, which must be `Some`).
    pub fn derive(
        format: KeyFormat,
        kdf: Option<&Argon2Params>,
        user: &UserKey,
    ) -> Result<WrappingKey, CryptError> {
        // Filled in place: the key is never copied out of what zeroes it on drop.
        let mut out = WrappingKey([0u8; MASTER_KEY_BYTES]);
        let key = &mut out.0;
        match format {
            KeyFormat::Raw => {
                if user.0.len() != MASTER_KEY_BYTES {
                    return Err(CryptError::RawKeyLength {
                        want: MASTER_KEY_BYTES,
                        found: user.0.len(),
                    });
                }
                key.copy_from_slice(&user.0);
            }
            KeyFormat::Hex => {
                // A trailing newline, as `echo` writes into a key file, is not part of it.
                let text = user.0.strip_suffix(b"\n").unwrap_or(&user.0);
                let bad = |found: String| CryptError::HexKey { want: 2 * MASTER_KEY_BYTES, found };
                if text.len() != 2 * MASTER_KEY_BYTES {
                    return Err(bad(format!("this one has {} characters", text.len())));
                }
                for (i, pair) in text.chunks(2).enumerate() {
                    let digit = |c: u8| (c as char).to_digit(16);
                    match (digit(pair[0]), digit(pair[1])) {
                        (Some(hi), Some(lo)) => key[i] = (hi * 16 + lo) as u8,
                        _ => {
                            return Err(bad(format!(
                                "character {} is not one",
                                2 * i + 1 + usize::from(digit(pair[0]).is_some())
                            )));
                        }
                    }
                }
            }
            KeyFormat::Passphrase => {
                let text = user.0.strip_suffix(b"\n").unwrap_or(&user.0);
                if !(PASSPHRASE_BYTES_MIN..=PASSPHRASE_BYTES_MAX).contains(&text.len()) {
                    return Err(CryptError::PassphraseLength { found: text.len() });
                }
                let kdf = kdf.ok_or_else(|| CryptError::Kdf("no parameters stored".into()))?;
                let params = argon2::Params::new(
                    kdf.memory_kib,
                    kdf.passes,
                    kdf.lanes,
                    Some(MASTER_KEY_BYTES),
                )
                .map_err(|e| CryptError::Kdf(e.to_string()))?;
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
                    .hash_password_into(text, &kdf.salt, key)
                    .map_err(|e| CryptError::Kdf(e.to_string()))?;
            }
        }
        Ok(out)
    }

    /// Fresh Argon2id parameters (the current defaults, a new random salt) for a passphrase
    /// set now.
    pub fn new_kdf() -> Result<Argon2Params, CryptError> {
        let mut salt = [0u8; KDF_SALT_BYTES];
        random_bytes(&mut salt)?;
        Ok(Argon2Params {
            memory_kib: ARGON2_MEMORY_KIB,
            passes: ARGON2_PASSES,
            lanes: ARGON2_LANES,
            salt,
        })
    }
}

/// A key family's master key, unsealed: zeroed on drop, never printed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct MasterKey([u8; MASTER_KEY_BYTES]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

/// A block's encryption: which key (salt), the nonce, and the tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealing {
    pub salt: u64,
    pub iv: [u8; IV_BYTES],
    pub mac: [u8; MAC_BYTES],
}

impl MasterKey {
    /// A new random master key.
    pub fn generate() -> Result<MasterKey, CryptError> {
        let mut key = [0u8; MASTER_KEY_BYTES];
        random_bytes(&mut key)?;
        Ok(MasterKey(key))
    }

    /// Seals this key under `wrapping` into `template` (whose guid, suite, format, KDF and
    /// location are kept; its IV, MAC and sealed bytes are replaced): a new random IV each
    /// time, with [`WrappedKey::wrap_aad`] authenticated.
    pub fn wrap(
        &self,
        wrapping: &WrappingKey,
        template: WrappedKey,
    ) -> Result<WrappedKey, CryptError> {
        let mut out = template;
        random_bytes(&mut out.iv)?;
        // Sealed in a buffer that is zeroed on drop, so a failed seal leaves no clear copy.
        let mut sealed = Zeroizing::new(self.0);
        out.mac = seal(&mut *keyed(&wrapping.0)?, &out.iv, &out.wrap_aad(), &mut sealed[..])?;
        out.wrapped = *sealed;
        Ok(out)
    }

    /// Unseals `wrapped` with `wrapping`; [`CryptError::WrongKey`] if it is not the key it was
    /// sealed under (or the record was changed).
    pub fn unwrap(wrapping: &WrappingKey, wrapped: &WrappedKey) -> Result<MasterKey, CryptError> {
        let CryptSuite::Aes256Gcm = wrapped.suite;
        let mut key = MasterKey(wrapped.wrapped);
        match open(
            &mut *keyed(&wrapping.0)?,
            &wrapped.iv,
            &wrapped.wrap_aad(),
            &mut key.0,
            &wrapped.mac,
        ) {
            Ok(()) => Ok(key),
            Err(CryptError::Authentication) => Err(CryptError::WrongKey),
            Err(e) => Err(e),
        }
    }

    /// The key of blocks sealed under `salt`.
    pub fn block_key(&self, salt: u64) -> Zeroizing<[u8; 32]> {
        let mut material = Zeroizing::new([0u8; MASTER_KEY_BYTES + 8]);
        material[..MASTER_KEY_BYTES].copy_from_slice(&self.0);
        material[MASTER_KEY_BYTES..].copy_from_slice(&salt.to_le_bytes());
        Zeroizing::new(blake3::derive_key(CONTEXT_BLOCK, &material[..]))
    }

    /// The key of the hashes that bind a volume's tree to its root (a keyed BLAKE3).
    pub fn tree_key(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(blake3::derive_key(CONTEXT_TREE, &self.0))
    }

    /// The salt and nonce of `data` sealed with additional data `aad` in a volume with dedup:
    /// a keyed BLAKE3 of both under the family's dedup key, so the same data in the same
    /// family seals to the same bytes, neither reveals anything about the data to whoever
    /// lacks the key, and a (key, nonce) pair repeats only with the same data and the same
    /// additional data (GCM under one nonce with two additional data would give away its
    /// authentication key).
    pub fn convergent(&self, aad: &[u8], data: &[u8]) -> (u64, [u8; IV_BYTES]) {
        let key = Zeroizing::new(blake3::derive_key(CONTEXT_DEDUP, &self.0));
        let mut hasher = blake3::Hasher::new_keyed(&key);
        hasher.update(&(aad.len() as u64).to_le_bytes());
        hasher.update(aad);
        hasher.update(data);
        let hash = hasher.finalize();
        let bytes = hash.as_bytes();
        let mut salt = [0u8; 8];
        salt.copy_from_slice(&bytes[..8]);
        let mut iv = [0u8; IV_BYTES];
        iv.copy_from_slice(&bytes[8..8 + IV_BYTES]);
        (u64::from_le_bytes(salt), iv)
    }
}

/// A loaded key family: its master key and the salt its new blocks are sealed under now.
#[derive(Debug)]
pub struct FamilyKey {
    master: MasterKey,
    /// The current salt and how many blocks it has sealed, under one lock: a salt is never
    /// used past [`SALT_USES_MAX`].
    salt: parking_lot::Mutex<(u64, u64)>,
    sealed: AtomicU64,
    contexts: Contexts,
}

/// AES-256-GCM contexts with a block key already expanded, by salt, for reuse. OpenSSL 3
/// looks the cipher up in its provider tables and expands the key at every initialisation
/// given a cipher and key: for a 4 KiB block that cost several times the sealing itself
/// (docs/bench/encryption.md). A kept context is initialised again with the nonce alone.
/// Contexts are taken out while in use, so no two threads share one, and are dropped with
/// the family: OpenSSL cleanses a freed context's key schedule, so an unloaded key leaves
/// none behind. A context whose operation failed is not kept.
#[derive(Default)]
struct Contexts(parking_lot::Mutex<Vec<Kept>>);

/// A kept context: its salt, and whether it has been used again since it was made (until
/// then it is on probation, see [`FamilyKey::with_context`]).
struct Kept {
    salt: u64,
    reused: bool,
    ctx: CipherCtx,
}

impl std::fmt::Debug for Contexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Contexts({} kept)", self.0.lock().len())
    }
}

impl FamilyKey {
    /// The family of `master`, with a new random salt (ZFS draws one at every key load too:
    /// a salt's use count is not stored, so a reloaded key must not go on counting from zero).
    pub fn new(master: MasterKey) -> Result<FamilyKey, CryptError> {
        Ok(FamilyKey {
            master,
            salt: parking_lot::Mutex::new((random_u64()?, 0)),
            sealed: AtomicU64::new(0),
            contexts: Contexts::default(),
        })
    }

    pub fn master(&self) -> &MasterKey {
        &self.master
    }

    /// The keyed MAC of a tree whose root is `root` in family `family` (`VolumeEntry::
    /// root_mac`): BLAKE3 keyed with the family's tree key over the root's
    /// [`BlockPointer::auth_bytes`], which the children's-MAC hashes chain down to every
    /// block. Only the key's holder can make one, so a root pointer swapped on the disk for
    /// one the family never had fails it.
    pub fn root_mac(&self, family: u64, root: Option<&BlockPointer>) -> [u8; 32] {
        let key = self.master.tree_key();
        let mut hasher = blake3::Hasher::new_keyed(&key);
        hasher.update(b"sluice root v1\0\0");
        hasher.update(&family.to_le_bytes());
        hasher.update(&BlockPointer::auth_bytes(root));
        *hasher.finalize().as_bytes()
    }

    /// Blocks sealed through this key since it was loaded.
    pub fn sealed_count(&self) -> u64 {
        self.sealed.load(Ordering::Relaxed)
    }

    /// The salt for the next block: the current one, or a new one once it has sealed
    /// [`SALT_USES_MAX`] blocks.
    fn next_salt(&self) -> Result<u64, CryptError> {
        let mut current = self.salt.lock();
        if current.1 >= SALT_USES_MAX {
            *current = (random_u64()?, 0);
        }
        current.1 += 1;
        Ok(current.0)
    }

    /// Encrypts `data` in place under a fresh random nonce (or, with `convergent`, the salt
    /// and nonce of [`MasterKey::convergent`] of `data`), authenticating `aad` too.
    pub fn seal(
        &self,
        data: &mut [u8],
        aad: &[u8],
        convergent: bool,
    ) -> Result<Sealing, CryptError> {
        let (salt, iv) = if convergent {
            self.master.convergent(aad, data)
        } else {
            let mut iv = [0u8; IV_BYTES];
            random_bytes(&mut iv)?;
            (self.next_salt()?, iv)
        };
        let mac = self.with_context(salt, |ctx| seal(ctx, &iv, aad, data))?;
        self.sealed.fetch_add(1, Ordering::Relaxed);
        Ok(Sealing { salt, iv, mac })
    }

    /// Decrypts `data` in place if `sealing` and `aad` authenticate it; otherwise
    /// [`CryptError::Authentication`], and `data` is garbage.
    pub fn open(&self, data: &mut [u8], aad: &[u8], sealing: &Sealing) -> Result<(), CryptError> {
        self.with_context(sealing.salt, |ctx| open(ctx, &sealing.iv, aad, data, &sealing.mac))
    }

    /// The bytes `stored` decrypts to, in a buffer of their own, if `sealing` and `aad`
    /// authenticate them; otherwise [`CryptError::Authentication`], and nothing is returned.
    /// The read path's way to open a block that lies in a fetched span, which other blocks
    /// and other reads share: decrypted straight out of it, not copied out first.
    pub fn open_to(
        &self,
        stored: &[u8],
        aad: &[u8],
        sealing: &Sealing,
    ) -> Result<AlignedBuf, CryptError> {
        self.with_context(sealing.salt, |ctx| open_to(ctx, &sealing.iv, aad, stored, &sealing.mac))
    }

    /// Runs `op` on a context holding the block key of `salt`: a kept one, or a new one with
    /// the key derived and expanded. The context is kept again if `op` succeeded.
    ///
    /// A new context is kept on probation in the list's front slot, replacing the one there
    /// if that one was never used again; a context used again joins the kept ones at the back,
    /// the oldest of them giving way past [`CONTEXTS_MAX`]. A salt used once (a dedup volume's
    /// convergent salts are one per block) so only ever displaces another such salt, never the
    /// current salt's contexts, which every other seal reuses.
    fn with_context<T>(
        &self,
        salt: u64,
        op: impl FnOnce(&mut CipherCtxRef) -> Result<T, CryptError>,
    ) -> Result<T, CryptError> {
        let kept = {
            let mut kept = self.contexts.0.lock();
            let found = kept.iter().rposition(|entry| entry.salt == salt);
            found.map(|at| kept.remove(at).ctx)
        };
        let reused = kept.is_some();
        let mut ctx = match kept {
            Some(ctx) => ctx,
            None => {
                let key = self.master.block_key(salt);
                keyed(&key)?
            }
        };
        let result = op(&mut ctx);
        if result.is_ok() {
            let mut kept = self.contexts.0.lock();
            let entry = Kept { salt, reused, ctx };
            // Freed after the lock is released: freeing cleanses a key schedule.
            let displaced = if !reused && kept.first().is_some_and(|front| !front.reused) {
                Some(std::mem::replace(&mut kept[0], entry))
            } else {
                let on_probation = usize::from(kept.first().is_some_and(|front| !front.reused));
                let displaced = (kept.len() >= CONTEXTS_MAX).then(|| kept.remove(on_probation));
                if reused {
                    kept.push(entry);
                } else {
                    kept.insert(0, entry);
                }
                displaced
            };
            debug_assert!(kept.len() <= CONTEXTS_MAX);
            debug_assert!(kept.iter().skip(1).all(|entry| entry.reused), "one on probation");
            drop(kept);
            drop(displaced);
        }
        result
    }
}

/// The key families loaded in a pool (ZFS: `spa_keystore`), by guid: what the encrypt and
/// decrypt stages find a block's key in. A block of a family not loaded is neither written
/// nor read; nothing else needs a key.
#[derive(Debug, Default)]
pub struct Keystore {
    families: RwLock<HashMap<u64, Arc<FamilyKey>>>,
}

impl Keystore {
    /// Makes `key` the key of family `guid` (replacing any loaded before).
    pub fn load(&self, guid: u64, key: FamilyKey) {
        self.families.write().insert(guid, Arc::new(key));
    }

    /// Forgets family `guid`'s key; true if it was loaded. Blocks being sealed or opened with
    /// it finish; the key is zeroed when the last of them drops it. The pool's block cache
    /// still holds the family's plaintext: whoever unloads a key empties it too.
    pub fn unload(&self, guid: u64) -> bool {
        self.families.write().remove(&guid).is_some()
    }

    pub fn get(&self, guid: u64) -> Option<Arc<FamilyKey>> {
        self.families.read().get(&guid).cloned()
    }

    pub fn is_loaded(&self, guid: u64) -> bool {
        self.families.read().contains_key(&guid)
    }
}

/// The hash an indirect block's pointer carries of its children (`BlockCrypt::ChildrenMac`),
/// or `None` where no child is part of an encrypted tree (then it carries none): BLAKE3, keyed
/// by a fixed context so it is no other hash, over every slot's [`BlockPointer::auth_bytes`]
/// (holes included). Keyless, so a sync, scrub or receive can compute it without the family's
/// key; what makes it bind the tree is that each child's MAC is in it, and the root's keyed
/// MAC covers the top.
pub fn children_mac(
    slots: &[Option<BlockPointer>],
) -> Option<[u8; sluice_format::CHILDREN_MAC_BYTES]> {
    if slots.iter().flatten().all(|bp| bp.crypt == BlockCrypt::None) {
        return None;
    }
    let key = blake3::derive_key(CONTEXT_CHILDREN, b"");
    let mut hasher = blake3::Hasher::new_keyed(&key);
    for slot in slots {
        hasher.update(&BlockPointer::auth_bytes(slot.as_ref()));
    }
    Some(*hasher.finalize().as_bytes())
}

/// [`children_mac`] of an indirect block's encoded slots, as read from the disk; `None` also
/// where a slot does not decode.
pub fn children_mac_of_bytes(bytes: &[u8]) -> Option<[u8; sluice_format::CHILDREN_MAC_BYTES]> {
    let slots: Option<Vec<Option<BlockPointer>>> = bytes
        .chunks_exact(sluice_format::BLKPTR_BYTES)
        .map(|slot| BlockPointer::decode(slot).ok())
        .collect();
    children_mac(&slots?)
}

/// Bytes of [`block_aad`].
pub const BLOCK_AAD_BYTES: usize = 32;

/// What a data block's MAC authenticates besides its bytes: its family and the fields that
/// say how to read it (ZFS MACs the same: lsize, psize, compression), so stored bytes cannot
/// be passed off as another family's, or as compressed when they are not, or the reverse.
pub fn block_aad(
    family: u64,
    lsize_sectors: u32,
    psize_sectors: u32,
    compression: BlockCompression,
    kind: BlockKind,
    level: u8,
) -> [u8; BLOCK_AAD_BYTES] {
    let mut out = [0u8; BLOCK_AAD_BYTES];
    out[..8].copy_from_slice(b"sluiceB1");
    out[8..16].copy_from_slice(&family.to_le_bytes());
    out[16..20].copy_from_slice(&lsize_sectors.to_le_bytes());
    out[20..24].copy_from_slice(&psize_sectors.to_le_bytes());
    out[24] = compression as u8;
    out[25] = kind as u8;
    out[26] = level;
    out
}

/// An AES-256-GCM context with `key` expanded, for [`seal`] and [`open`] to give a nonce.
fn keyed(key: &[u8; 32]) -> Result<CipherCtx, CryptError> {
    let mut ctx = CipherCtx::new()?;
    ctx.encrypt_init(Some(Cipher::aes_256_gcm()), Some(key), None)?;
    Ok(ctx)
}

/// AES-256-GCM in place with `ctx`'s key: encrypts `data`, authenticating `aad`; returns
/// the tag.
fn seal(
    ctx: &mut CipherCtxRef,
    iv: &[u8; IV_BYTES],
    aad: &[u8],
    data: &mut [u8],
) -> Result<[u8; MAC_BYTES], CryptError> {
    ctx.encrypt_init(None, None, Some(iv))?;
    ctx.cipher_update(aad, None)?;
    ctx.cipher_update_inplace(data, data.len())?;
    ctx.cipher_final(&mut [])?;
    let mut mac = [0u8; MAC_BYTES];
    ctx.tag(&mut mac)?;
    Ok(mac)
}

/// AES-256-GCM in place with `ctx`'s key: decrypts `data` if `mac` authenticates it and
/// `aad`.
fn open(
    ctx: &mut CipherCtxRef,
    iv: &[u8; IV_BYTES],
    aad: &[u8],
    data: &mut [u8],
    mac: &[u8; MAC_BYTES],
) -> Result<(), CryptError> {
    ctx.decrypt_init(None, None, Some(iv))?;
    // The tag is set on every use: a kept context still holds the previous block's tag and
    // length, which the final check would otherwise compare against.
    ctx.set_tag(mac)?;
    ctx.cipher_update(aad, None)?;
    ctx.cipher_update_inplace(data, data.len())?;
    // The tag is checked here: any failure of the final step is a failed authentication.
    ctx.cipher_final(&mut []).map_err(|_| CryptError::Authentication)?;
    Ok(())
}

/// AES-256-GCM with `ctx`'s key from `stored` into a new buffer, returned if `mac`
/// authenticates `stored` and `aad`. OpenSSL writes the plaintext straight into the buffer's
/// unwritten bytes: the `openssl` crate's safe calls take only initialised output, and
/// zeroing the buffer first would write every byte twice again.
fn open_to(
    ctx: &mut CipherCtxRef,
    iv: &[u8; IV_BYTES],
    aad: &[u8],
    stored: &[u8],
    mac: &[u8; MAC_BYTES],
) -> Result<AlignedBuf, CryptError> {
    ctx.decrypt_init(None, None, Some(iv))?;
    // As in `open`: a kept context still holds the previous block's tag.
    ctx.set_tag(mac)?;
    ctx.cipher_update(aad, None)?;
    // A cipher of block size 1 writes as many bytes as it is given, which is all the room
    // `out` has (EVP_DecryptUpdate's contract); `keyed` makes only AES-256-GCM contexts.
    debug_assert_eq!(ctx.block_size(), 1, "open_to needs a stream cipher");
    let mut out = UninitBuf::new(stored.len());
    if !stored.is_empty() {
        let len =
            std::ffi::c_int::try_from(stored.len()).expect("a block is far smaller than 2 GiB");
        let mut written: std::ffi::c_int = 0;
        // SAFETY: `ctx` is a live context (borrowed mutably: nothing else uses it), `stored` is
        // readable for `len` bytes and `out`, which no reference views, writable for as many;
        // the cipher's block size is 1 (GCM, a stream mode: checked above), so OpenSSL writes
        // at most `len` bytes, and keeps none back.
        let done = unsafe {
            openssl_sys::EVP_DecryptUpdate(
                ctx.as_ptr(),
                out.as_mut_ptr(),
                &mut written,
                stored.as_ptr(),
                len,
            )
        };
        if done != 1 {
            return Err(openssl::error::ErrorStack::get().into());
        }
        assert_eq!(written, len, "AES-GCM decrypted {written} of {len} bytes");
    }
    // The tag is checked here: any failure of the final step is a failed authentication, and
    // `out` is never handed out (its buffer may go back to the buffer pool, whose next owner
    // gets it unwritten, as an `UninitBuf`).
    ctx.cipher_final(&mut []).map_err(|_| CryptError::Authentication)?;
    // SAFETY: the decryption wrote every byte of `out` (its count checked above).
    Ok(unsafe { out.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_format::KeyLocation;

    fn template(format: KeyFormat, kdf: Option<Argon2Params>) -> WrappedKey {
        WrappedKey {
            guid: 7,
            suite: CryptSuite::Aes256Gcm,
            format,
            kdf,
            location: KeyLocation::Prompt,
            iv: [0; IV_BYTES],
            mac: [0; MAC_BYTES],
            wrapped: [0; MASTER_KEY_BYTES],
        }
    }

    fn cheap_kdf() -> Argon2Params {
        // Small enough for a unit test; the stored parameters are what is used.
        Argon2Params { memory_kib: 64, passes: 1, lanes: 1, salt: [3; KDF_SALT_BYTES] }
    }

    #[test]
    fn every_key_format_wraps_and_unwraps_and_refuses_a_wrong_key() {
        // (format, its KDF, the right key, a wrong one)
        type Case = (KeyFormat, Option<Argon2Params>, Vec<u8>, Vec<u8>);
        let cases: Vec<Case> = vec![
            (KeyFormat::Raw, None, vec![9; 32], vec![8; 32]),
            (KeyFormat::Hex, None, b"ab".repeat(32), b"AC".repeat(32)),
            (
                KeyFormat::Passphrase,
                Some(cheap_kdf()),
                b"correct horse".to_vec(),
                b"battery staple".to_vec(),
            ),
        ];
        for (format, kdf, right, wrong) in cases {
            let master = MasterKey::generate().expect("rng");
            let wrapping = WrappingKey::derive(format, kdf.as_ref(), &UserKey::new(right.clone()))
                .expect("derive");
            let sealed = master.wrap(&wrapping, template(format, kdf)).expect("wrap");
            assert_ne!(sealed.wrapped, master.0, "{format:?}: stored in the clear");
            let again =
                WrappingKey::derive(format, kdf.as_ref(), &UserKey::new(right)).expect("derive");
            let opened = MasterKey::unwrap(&again, &sealed).expect("the right key unwraps");
            assert_eq!(opened.0, master.0, "{format:?}");
            let other =
                WrappingKey::derive(format, kdf.as_ref(), &UserKey::new(wrong)).expect("derive");
            assert!(matches!(MasterKey::unwrap(&other, &sealed), Err(CryptError::WrongKey)));
            // A weakened stored parameter fails the unwrap too.
            let mut changed = sealed.clone();
            changed.guid ^= 1;
            assert!(matches!(MasterKey::unwrap(&again, &changed), Err(CryptError::WrongKey)));
        }
    }

    #[test]
    fn malformed_user_keys_are_refused_by_name() {
        let derive = |format, bytes: &[u8]| {
            WrappingKey::derive(format, Some(&cheap_kdf()), &UserKey::new(bytes.to_vec()))
        };
        assert!(matches!(
            derive(KeyFormat::Raw, &[1; 31]),
            Err(CryptError::RawKeyLength { want: 32, found: 31 })
        ));
        assert!(matches!(
            derive(KeyFormat::Hex, &b"ab".repeat(31)),
            Err(CryptError::HexKey { .. })
        ));
        let mut bad = b"ab".repeat(32);
        bad[10] = b'g';
        let err = derive(KeyFormat::Hex, &bad).expect_err("not hex");
        assert!(err.to_string().contains("character 11"), "{err}");
        assert!(matches!(
            derive(KeyFormat::Passphrase, b"short"),
            Err(CryptError::PassphraseLength { found: 5 })
        ));
        // A key file's trailing newline is not part of a hex key.
        let mut line = b"0f".repeat(32);
        line.push(b'\n');
        assert!(derive(KeyFormat::Hex, &line).is_ok());
    }

    #[test]
    fn blocks_round_trip_and_any_change_fails_authentication() {
        let family = FamilyKey::new(MasterKey::generate().expect("rng")).expect("salt");
        let plain: Vec<u8> = (0..16384u32).map(|i| (i * 7) as u8).collect();
        let mut data = plain.clone();
        let sealing = family.seal(&mut data, b"aad", false).expect("seal");
        assert_ne!(data, plain);
        let mut copy = data.clone();
        family.open(&mut copy, b"aad", &sealing).expect("opens");
        assert_eq!(copy, plain);
        let mut flipped = data.clone();
        flipped[100] ^= 1;
        assert!(matches!(
            family.open(&mut flipped, b"aad", &sealing),
            Err(CryptError::Authentication)
        ));
        let mut copy = data.clone();
        assert!(matches!(
            family.open(&mut copy, b"aaD", &sealing),
            Err(CryptError::Authentication)
        ));
        let other = Sealing { salt: sealing.salt ^ 1, ..sealing };
        let mut copy = data.clone();
        assert!(matches!(family.open(&mut copy, b"aad", &other), Err(CryptError::Authentication)));
        // Random nonces: sealing the same data again gives other bytes.
        let mut again = plain.clone();
        let second = family.seal(&mut again, b"aad", false).expect("seal");
        assert_ne!(second.iv, sealing.iv);
        assert_ne!(again, data);
        // Convergent sealing gives the same bytes for the same data, other bytes for other data.
        let (mut a, mut b, mut c) = (plain.clone(), plain.clone(), plain.clone());
        c[0] ^= 1;
        let (sa, sb, sc) = (
            family.seal(&mut a, b"aad", true).expect("seal"),
            family.seal(&mut b, b"aad", true).expect("seal"),
            family.seal(&mut c, b"aad", true).expect("seal"),
        );
        assert_eq!((sa, &a), (sb, &b));
        assert_ne!(sa.iv, sc.iv);
        // The same data under other additional data gets another nonce.
        let mut d = plain.clone();
        let sd = family.seal(&mut d, b"aaD", true).expect("seal");
        assert_ne!((sd.salt, sd.iv), (sa.salt, sa.iv));
        // Another family's key reads none of it.
        let stranger = FamilyKey::new(MasterKey::generate().expect("rng")).expect("salt");
        let mut copy = data.clone();
        assert!(matches!(
            stranger.open(&mut copy, b"aad", &sealing),
            Err(CryptError::Authentication)
        ));
    }

    /// AES-256-GCM of one block on a context made for it alone, initialised in one step with
    /// the cipher, key and nonce: what a kept context's output must equal.
    fn seal_fresh(key: &[u8; 32], iv: &[u8; IV_BYTES], aad: &[u8], data: &mut [u8]) -> [u8; 16] {
        let mut ctx = CipherCtx::new().expect("context");
        ctx.encrypt_init(Some(Cipher::aes_256_gcm()), Some(key), Some(iv)).expect("init");
        ctx.cipher_update(aad, None).expect("aad");
        ctx.cipher_update_inplace(data, data.len()).expect("encrypt");
        ctx.cipher_final(&mut []).expect("final");
        let mut mac = [0u8; MAC_BYTES];
        ctx.tag(&mut mac).expect("tag");
        mac
    }

    #[test]
    fn kept_contexts_seal_and_open_as_fresh_ones_do() {
        let family = FamilyKey::new(MasterKey::generate().expect("rng")).expect("salt");
        let blocks: Vec<Vec<u8>> = (0..6u8)
            .map(|b| (0..4096u32).map(|i| (i as u8).wrapping_mul(b + 1)).collect())
            .collect();
        // Seals, opens, a failed open and seals under a second salt, interleaved, so kept
        // contexts go from encrypting to decrypting and back, and one is dropped on failure.
        let mut sealed = Vec::new();
        for (n, plain) in blocks.iter().enumerate() {
            if n == 3 {
                family.salt.lock().1 = SALT_USES_MAX;
            }
            let mut data = plain.clone();
            let sealing = family.seal(&mut data, b"aad", false).expect("seal");
            let mut fresh = plain.clone();
            let key = family.master.block_key(sealing.salt);
            assert_eq!(seal_fresh(&key, &sealing.iv, b"aad", &mut fresh), sealing.mac);
            assert_eq!(fresh, data, "block {n}: a kept context's ciphertext differs");
            if n == 1 {
                // Opened twice on the context that sealed it (encrypt, then decrypt twice),
                // before the next seal reuses that context.
                for _ in 0..2 {
                    let mut copy = data.clone();
                    family.open(&mut copy, b"aad", &sealing).expect("opens");
                    assert_eq!(&copy, plain);
                }
            }
            if n == 2 {
                let mut bad = data.clone();
                bad[0] ^= 1;
                assert!(matches!(
                    family.open(&mut bad, b"aad", &sealing),
                    Err(CryptError::Authentication)
                ));
            }
            sealed.push((data, sealing));
        }
        assert_ne!(sealed[0].1.salt, sealed[5].1.salt, "the salt was replaced");
        for _ in 0..2 {
            for ((data, sealing), plain) in sealed.iter().zip(&blocks) {
                for _ in 0..2 {
                    let mut copy = data.clone();
                    family.open(&mut copy, b"aad", sealing).expect("opens");
                    assert_eq!(&copy, plain);
                }
                let mut tampered = data.clone();
                tampered[4095] ^= 0x80;
                assert!(matches!(
                    family.open(&mut tampered, b"aad", sealing),
                    Err(CryptError::Authentication)
                ));
            }
        }
        assert!(family.contexts.0.lock().len() <= CONTEXTS_MAX);
    }

    /// Opening into a buffer of its own gives what opening in place does, whatever the
    /// length (empty, shorter than an AES block, not a multiple of one), on kept and new
    /// contexts alike, leaves the stored bytes as they were, and returns nothing for a block
    /// its tag or its authenticated fields do not match.
    #[test]
    fn a_block_opened_into_its_own_buffer_reads_as_one_opened_in_place() {
        let family = FamilyKey::new(MasterKey::generate().expect("rng")).expect("salt");
        for len in [0usize, 1, 15, 4096, 4096 + 7, 131072] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut stored = plain.clone();
            let sealing = family.seal(&mut stored, b"aad", false).expect("seal");
            // Each result kept alive, so no later open gets back a pooled buffer that already
            // holds the plaintext.
            let mut opened = Vec::new();
            for _ in 0..2 {
                opened.push(family.open_to(&stored, b"aad", &sealing).expect("opens"));
                assert_eq!(&opened.last().expect("pushed")[..], &plain[..], "{len} bytes");
                let mut in_place = stored.clone();
                family.open(&mut in_place, b"aad", &sealing).expect("opens in place");
                assert_eq!(in_place, plain);
            }
            // A forged tag on the kept context that last verified this block's real one.
            let forged = Sealing { mac: [0; MAC_BYTES], ..sealing };
            assert!(matches!(
                family.open_to(&stored, b"aad", &forged),
                Err(CryptError::Authentication)
            ));
            if len > 0 {
                let mut bad = stored.clone();
                bad[len - 1] ^= 0x10;
                assert!(matches!(
                    family.open_to(&bad, b"aad", &sealing),
                    Err(CryptError::Authentication)
                ));
            }
            assert!(matches!(
                family.open_to(&stored, b"other", &sealing),
                Err(CryptError::Authentication)
            ));
        }
    }

    #[test]
    fn salts_used_once_do_not_displace_the_current_salts_contexts() {
        let family = FamilyKey::new(MasterKey::generate().expect("rng")).expect("salt");
        let mut block = vec![7u8; 4096];
        let current = family.seal(&mut block, b"aad", false).expect("seal").salt;
        family.seal(&mut block, b"aad", false).expect("seal");
        // Convergent seals: a salt of their own per distinct block, many more than are kept.
        for n in 0..(CONTEXTS_MAX as u32 * 3) {
            let mut data = n.to_le_bytes().repeat(1024);
            family.seal(&mut data, b"aad", true).expect("seal");
        }
        let kept = family.contexts.0.lock();
        assert_eq!(kept.len(), 2, "the current salt's context and one probationer");
        assert_eq!(kept.last().map(|entry| (entry.salt, entry.reused)), Some((current, true)));
    }

    #[test]
    fn a_salt_is_replaced_after_its_uses() {
        let family = FamilyKey::new(MasterKey::generate().expect("rng")).expect("salt");
        let first = family.next_salt().expect("salt");
        family.salt.lock().1 = SALT_USES_MAX - 1;
        assert_eq!(family.next_salt().expect("salt"), first, "the last use of the salt");
        let next = family.next_salt().expect("salt");
        assert_ne!(next, first);
        assert_eq!(family.salt.lock().1, 1);
    }
}
