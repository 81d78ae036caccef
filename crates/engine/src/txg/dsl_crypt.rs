//! Key families and their keys (ZFS: `dsl_crypt.c`): which wrapped keys the pool directory
//! records, which are loaded, and the administration of both (a new encryption root, key
//! load, unload and change).
//!
//! A key family is an encryption root's master key, shared by the root's snapshots and
//! clones; each encrypted volume names its family's guid (`VolumeEntry::key_family`). The
//! wrapped keys live here, written by every sync into the directory (V7); the unwrapped master
//! keys live in the pipeline's keystore (crate::zio::crypt), where the encrypt and decrypt
//! stages find them. A family being unloaded is *closing*: its volumes refuse new writes while
//! a sync writes what they hold dirty, and only then is its key forgotten, so no sync meets a
//! block it cannot encrypt.
//!
//! A family no volume names any more (its last volume destroyed) is dropped by the next sync,
//! its wrapped key and, if loaded, its key with it.
//!
//! The first family made turns on the pool's `encryption` feature (every label lists it from
//! then on, and the directory is written at V7), so a build that does not know encryption
//! refuses the pool by that name rather than misreading it.
//!
//! Lock order: the families' lock is a leaf, taken after the datasets' lock and never across
//! an `.await`.

use std::collections::BTreeSet;

use parking_lot::Mutex;
use sluice_format::{
    Argon2Params, CryptSuite, KeyFormat, KeyLocation, WrappedKey, IV_BYTES, MAC_BYTES,
};

use super::{Store, StoreError};
use crate::zio::crypt::{self, CryptError, FamilyKey, MasterKey, UserKey, WrappingKey};

/// The pool's key families: their wrapped keys and which are closing.
#[derive(Debug, Default)]
pub(super) struct DslCrypt {
    state: Mutex<Families>,
}

#[derive(Debug, Default)]
struct Families {
    wrapped: Vec<WrappedKey>,
    /// Families whose key is being unloaded: their volumes take no new writes.
    closing: BTreeSet<u64>,
    /// Families with a volume whose intent log waits for the key to replay: their volumes
    /// take no writes until it has (a write applied before an older record would be
    /// overwritten by it).
    awaiting_log: BTreeSet<u64>,
    /// Families being made, whose volume is not in the namespace yet: kept by a sync that
    /// finds no volume naming them.
    creating: BTreeSet<u64>,
}

impl DslCrypt {
    /// The families an imported directory recorded.
    pub(super) fn new(wrapped: Vec<WrappedKey>) -> DslCrypt {
        DslCrypt {
            state: Mutex::new(Families {
                wrapped,
                closing: BTreeSet::new(),
                awaiting_log: BTreeSet::new(),
                creating: BTreeSet::new(),
            }),
        }
    }

    /// The wrapped keys the next directory records: those of the families in `in_use` (named
    /// by a volume) or being made. The others are dropped here, and their keys unloaded from
    /// `keys`: the last volume of the family was destroyed, and nothing can need the key again.
    pub(super) fn keep_in_use(
        &self,
        in_use: &BTreeSet<u64>,
        keys: &crypt::Keystore,
    ) -> Vec<WrappedKey> {
        let mut state = self.state.lock();
        let Families { wrapped, creating, .. } = &mut *state;
        wrapped.retain(|k| {
            let keep = in_use.contains(&k.guid) || creating.contains(&k.guid);
            if !keep {
                keys.unload(k.guid);
            }
            keep
        });
        wrapped.clone()
    }

    pub(super) fn find(&self, guid: u64) -> Option<WrappedKey> {
        self.state.lock().wrapped.iter().find(|k| k.guid == guid).cloned()
    }

    /// Takes a raw stream's key family into the pool, unless it has it already (a stream
    /// sent back to where it came from: the wrapped key kept is the pool's own, which a
    /// `key change` there may have made newer); returns its guid. Kept by every sync until
    /// [`DslCrypt::adopted`], whether or not a volume names it yet.
    pub(super) fn adopt(&self, key: WrappedKey) -> u64 {
        let mut state = self.state.lock();
        let guid = key.guid;
        if !state.wrapped.iter().any(|k| k.guid == guid) {
            state.wrapped.push(key);
        }
        state.creating.insert(guid);
        guid
    }

    /// Ends [`DslCrypt::adopt`]'s hold: from now on the family is kept while a volume names it.
    pub(super) fn adopted(&self, guid: u64) {
        self.state.lock().creating.remove(&guid);
    }

    /// Whether a volume of family `guid` may take writes now: its key is loaded and not
    /// being unloaded (0, no family: always).
    pub(super) fn writable(&self, keys: &crypt::Keystore, guid: u64) -> bool {
        guid == 0 || {
            let state = self.state.lock();
            keys.is_loaded(guid)
                && !state.closing.contains(&guid)
                && !state.awaiting_log.contains(&guid)
        }
    }

    /// Marks family `guid` as having (or no longer having) a log that waits for its key.
    pub(super) fn set_awaiting_log(&self, guid: u64, awaiting: bool) {
        let mut state = self.state.lock();
        if awaiting {
            state.awaiting_log.insert(guid);
        } else {
            state.awaiting_log.remove(&guid);
        }
    }
}

/// An encryption root's key as its user gives it: how, where it is kept, and the key.
#[derive(Debug)]
pub struct NewKey {
    pub format: KeyFormat,
    pub location: KeyLocation,
    pub key: UserKey,
}

/// Whether an encrypted volume's key is loaded (ZFS: `keystatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStatus {
    /// The volume is not encrypted.
    None,
    Available,
    Unavailable,
}

impl KeyStatus {
    pub fn name(self) -> &'static str {
        match self {
            KeyStatus::None => "none",
            KeyStatus::Available => "available",
            KeyStatus::Unavailable => "unavailable",
        }
    }
}

/// What `vol get` shows of a volume's encryption.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncryptionInfo {
    pub suite: CryptSuite,
    pub format: KeyFormat,
    pub location: KeyLocation,
    pub status: KeyStatus,
    /// The family's guid.
    pub family: u64,
}

/// The wrapping key a new user key derives, with the KDF parameters (fresh ones, for a
/// passphrase) to store beside it.
fn new_wrapping(key: &NewKey) -> Result<(Option<Argon2Params>, WrappingKey), CryptError> {
    let kdf = match key.format {
        KeyFormat::Passphrase => Some(WrappingKey::new_kdf()?),
        KeyFormat::Raw | KeyFormat::Hex => None,
    };
    let wrapping = WrappingKey::derive(key.format, kdf.as_ref(), &key.key)?;
    Ok((kdf, wrapping))
}

impl Store {
    /// A key error of `volume` in this pool.
    fn key_error(&self, volume: &str, cause: CryptError) -> StoreError {
        StoreError::Key {
            pool: self.spa.pool().name().to_owned(),
            volume: volume.to_owned(),
            cause,
        }
    }

    /// Creates an encrypted volume, the root of a new key family (ZFS: `zfs create -o
    /// encryption=on -o keyformat=… -o keylocation=…`): a random master key, sealed under the
    /// wrapping key `key` derives, loaded at once. The first family turns on the pool's
    /// `encryption` feature (its labels are rewritten). Dedup is refused on it until
    /// deduplication within a key family is built.
    pub async fn create_encrypted_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
        thick: bool,
        key: NewKey,
    ) -> Result<(), StoreError> {
        self.spa.check_live()?;
        self.check_new_volume(name, size_bytes, block_bytes)?;
        let pool = self.spa.pool();
        let crypt_error = |cause| self.key_error(name, cause);
        let (kdf, wrapping) = new_wrapping(&key).map_err(crypt_error)?;
        let master = MasterKey::generate().map_err(crypt_error)?;
        let guid = loop {
            let guid = crypt::random_u64().map_err(crypt_error)?;
            if guid != 0 && self.spa.crypt().find(guid).is_none() {
                break guid;
            }
        };
        let template = WrappedKey {
            guid,
            suite: CryptSuite::Aes256Gcm,
            format: key.format,
            kdf,
            location: key.location,
            iv: [0; IV_BYTES],
            mac: [0; MAC_BYTES],
            wrapped: [0; sluice_format::MASTER_KEY_BYTES],
        };
        let wrapped = master.wrap(&wrapping, template).map_err(crypt_error)?;
        // The feature first (a sync writes families only into a directory whose config lists
        // it), then the family, then the volume naming it: a sync that sees the volume sees
        // its family.
        let next_txg = pool.uberblock().txg + 1;
        pool.activate_encryption(next_txg).await?;
        let family = FamilyKey::new(master).map_err(crypt_error)?;
        {
            let mut state = self.spa.crypt().state.lock();
            state.wrapped.push(wrapped);
            state.creating.insert(guid);
        }
        pool.zio().keys().load(guid, family);
        let created = self.create_volume_in(name, size_bytes, block_bytes, thick, guid);
        let mut state = self.spa.crypt().state.lock();
        state.creating.remove(&guid);
        if created.is_err() {
            // No volume names the family: it goes (a sync that wrote it meanwhile wrote an
            // unused record, which the next drops).
            state.wrapped.retain(|k| k.guid != guid);
            pool.zio().keys().unload(guid);
        }
        created
    }

    /// The encrypted volume `volume`'s family and wrapped key.
    fn family_of(&self, volume: &str) -> Result<WrappedKey, StoreError> {
        let dataset = self.export_dataset(volume)?;
        let guid = dataset.state.lock().entry.key_family;
        if guid == 0 {
            return Err(StoreError::NotEncrypted {
                pool: self.spa.pool().name().to_owned(),
                volume: volume.to_owned(),
            });
        }
        self.spa.crypt().find(guid).ok_or_else(|| {
            self.key_error(
                volume,
                CryptError::Kdf(format!("key family {guid:#018x} is not in the pool")),
            )
        })
    }

    /// Loads the key of encrypted volume `volume`'s family (ZFS: `zfs load-key`): every
    /// volume, snapshot and clone of the family can then be read and written. A wrong key is
    /// refused as [`CryptError::WrongKey`], and nothing changes. The intent-log records the
    /// family's volumes held at import replay now, before any of them takes a write; if they
    /// do not (a record fails its tag), the key is unloaded again and the error returned.
    pub async fn load_key(&self, volume: &str, key: &UserKey) -> Result<(), StoreError> {
        let wrapped = self.family_of(volume)?;
        let crypt_error = |cause| self.key_error(volume, cause);
        let keys = self.spa.pool().zio().keys();
        if keys.is_loaded(wrapped.guid) {
            return Err(StoreError::KeyLoaded {
                pool: self.spa.pool().name().to_owned(),
                volume: volume.to_owned(),
            });
        }
        let wrapping =
            WrappingKey::derive(wrapped.format, wrapped.kdf.as_ref(), key).map_err(crypt_error)?;
        let master = MasterKey::unwrap(&wrapping, &wrapped).map_err(crypt_error)?;
        let family = FamilyKey::new(master).map_err(crypt_error)?;
        // Every tree of the family must be one the key's holder wrote: a root pointer swapped
        // on the disk (for another tree's, or an older one's) fails its MAC here, and the key
        // is not loaded. The trees' blocks are checked as they are read, against their parents.
        for dataset in self.dsl.read().values() {
            let (entry, raw_receive) = {
                let v = dataset.state.lock();
                (v.entry.clone(), v.raw_receive)
            };
            // A raw receive's volume gets its root's MAC when the stream is whole.
            if entry.key_family != wrapped.guid || raw_receive {
                continue;
            }
            let trees = std::iter::once((entry.name.clone(), entry.root, entry.root_mac)).chain(
                entry
                    .snapshots
                    .iter()
                    .map(|s| (format!("{}@{}", entry.name, s.name), s.root, s.root_mac)),
            );
            for (name, root, mac) in trees {
                if family.root_mac(wrapped.guid, root.as_ref()) != mac {
                    return Err(StoreError::Pool(crate::pool::PoolError::Authentication {
                        pool: self.spa.pool().name().to_owned(),
                        block: format!("the root of {name}"),
                    }));
                }
            }
        }
        // The family's volumes stay closed to writes until the replay is done
        // (`DslCrypt::awaiting_log`).
        keys.load(wrapped.guid, family);
        match self.replay_deferred(wrapped.guid).await {
            Ok(()) => {
                self.spa.crypt().set_awaiting_log(wrapped.guid, false);
                self.spa.pool().events().post(
                    crate::fm::EventClass::KeyLoad,
                    None,
                    vec![("volume", volume.to_owned())],
                );
                Ok(())
            }
            // Every record's tag is checked before any is applied: nothing changed, and the
            // key goes again.
            Err(error @ StoreError::LogAuthentication { .. }) => {
                keys.unload(wrapped.guid);
                self.spa.pool().cache().clear();
                Err(error)
            }
            // Applied in part (an I/O error, say): the key stays, to sync what was applied,
            // and the volumes stay closed to writes; unloading and loading the key again
            // replays the rest.
            Err(error) => Err(error),
        }
    }

    /// Unloads the key of `volume`'s family (ZFS: `zfs unload-key`): its volumes stop taking
    /// writes, a sync writes what they hold dirty, then the key is forgotten and the block
    /// cache emptied, so nothing of the family can be read until a `key load`.
    pub async fn unload_key(&self, volume: &str) -> Result<(), StoreError> {
        let wrapped = self.family_of(volume)?;
        let keys = self.spa.pool().zio().keys();
        if !keys.is_loaded(wrapped.guid) {
            return Err(StoreError::KeyNotLoaded {
                pool: self.spa.pool().name().to_owned(),
                volume: volume.to_owned(),
            });
        }
        self.spa.crypt().state.lock().closing.insert(wrapped.guid);
        // The sync that writes the family's dirty blocks, with its key still loaded. Writes
        // check the family under the txg lock, so none lands after the sync's quiesce.
        let synced = self.sync().await;
        if synced.is_ok() {
            debug_assert!(
                self.dsl.read().values().all(|d| {
                    let v = d.state.lock();
                    v.entry.key_family != wrapped.guid || v.open.is_empty()
                }),
                "a closing family's volume holds dirty blocks after its sync"
            );
            keys.unload(wrapped.guid);
            self.spa.pool().cache().clear();
            self.spa.pool().events().post(
                crate::fm::EventClass::KeyUnload,
                None,
                vec![("volume", volume.to_owned())],
            );
        }
        self.spa.crypt().state.lock().closing.remove(&wrapped.guid);
        synced.map(|_| ())
    }

    /// Rewraps `volume`'s family's master key under a new user key (ZFS: `zfs change-key`):
    /// the family's key must be loaded; no data is rewritten. Durable with the next sync.
    pub fn change_key(&self, volume: &str, key: NewKey) -> Result<(), StoreError> {
        let wrapped = self.family_of(volume)?;
        let crypt_error = |cause| self.key_error(volume, cause);
        let family = self.spa.pool().zio().keys().get(wrapped.guid).ok_or_else(|| {
            StoreError::KeyNotLoaded {
                pool: self.spa.pool().name().to_owned(),
                volume: volume.to_owned(),
            }
        })?;
        let (kdf, wrapping) = new_wrapping(&key).map_err(crypt_error)?;
        let template = WrappedKey { format: key.format, kdf, location: key.location, ..wrapped };
        let rewrapped = family.master().wrap(&wrapping, template).map_err(crypt_error)?;
        let mut state = self.spa.crypt().state.lock();
        if let Some(slot) = state.wrapped.iter_mut().find(|k| k.guid == rewrapped.guid) {
            *slot = rewrapped;
        }
        Ok(())
    }

    /// `volume`'s encryption as `vol get` shows it; `None` for a volume not encrypted.
    pub fn encryption(&self, volume: &str) -> Result<Option<EncryptionInfo>, StoreError> {
        let wrapped = match self.family_of(volume) {
            Ok(wrapped) => wrapped,
            Err(StoreError::NotEncrypted { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let loaded = self.spa.pool().zio().keys().is_loaded(wrapped.guid);
        Ok(Some(EncryptionInfo {
            suite: wrapped.suite,
            format: wrapped.format,
            location: wrapped.location,
            status: if loaded { KeyStatus::Available } else { KeyStatus::Unavailable },
            family: wrapped.guid,
        }))
    }

    /// Handles open on the volumes of `volume`'s key family (each client connection holds
    /// one): what `key unload` refuses to cut off unless forced.
    pub fn family_handles(&self, volume: &str) -> Result<usize, StoreError> {
        let wrapped = self.family_of(volume)?;
        let dsl = self.dsl.read();
        let handles = dsl
            .values()
            .filter(|d| d.state.lock().entry.key_family == wrapped.guid)
            // The dataset holds one itself; every handle on it another.
            .map(|d| std::sync::Arc::strong_count(d.requests()) - 1)
            .sum();
        Ok(handles)
    }

    /// The guids of the key families the pool records (each an encryption root's, shared by
    /// its snapshots and clones).
    pub fn key_families(&self) -> Vec<u64> {
        self.spa.crypt().state.lock().wrapped.iter().map(|k| k.guid).collect()
    }

    /// Whether `volume`'s key is loaded.
    pub fn key_status(&self, volume: &str) -> Result<KeyStatus, StoreError> {
        Ok(self.encryption(volume)?.map_or(KeyStatus::None, |info| info.status))
    }
}
