//! `sluice pool`, `sluice vol`, `sluice snapshot`, `sluice clone`, `sluice send` and
//! `sluice recv`: pools on files and block devices, in the shape zpool and zfs users know.
//!
//! Each command opens the pool it names, does its work, syncs and exports, so no state lingers
//! between commands but the pools themselves; on a served pool the server runs the same
//! functions against its live store ([`Ctx::live`]). Every leaf is opened with an exclusive
//! lock: a second process is refused, and told who holds the pool. Commands do not print:
//! each says what it found or did as a typed [`output::Reply`] in its [`Ctx`], and the
//! caller renders the replies ([`output`]), here or, for a served pool, in the command that
//! sent the request.
//!
//! By noun: [`pool`] (create, import, list, status, scrub, leaves), [`vol`], [`snapshot`]
//! (and clones), [`replication`] (send and receive), [`cache`] (which leaves make which pool
//! on this host) and [`output`] (the one renderer). This module holds what they share: the
//! command context, opening a pool, leaves and their fault injection, and name splitting.

pub mod cache;
pub mod key;
pub mod output;
pub mod pool;
pub mod props;
pub mod replication;
pub mod snapshot;
pub mod spares;
pub mod vol;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sluice_engine::inject::{InjectHandle, Injected};
use sluice_engine::rt::Env;
use sluice_engine::tunables::Tunables;
use sluice_engine::{DeviceError, FileDevice, FileDeviceOptions};
use sluice_engine::{LeafSpec, Pool};
use sluice_engine::{SnapshotSpace, Store};

use output::{Progress, Reply};

pub use cache::{cache_path, known_pools, remember};

/// How often a command that waits for a scrub or resilver reports its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What a command works in: the runtime, which pool, if any, is already open in this process
/// (`sluice serve` runs the same commands for its control socket against its live store), the
/// replies the command has made so far, and where its progress reports go.
pub struct Ctx<'a> {
    pub env: &'a Env,
    pub live: Option<Arc<Store>>,
    /// What the command has said, in order; the caller renders them.
    pub replies: Vec<Reply>,
    /// The server's channel to the client for progress reports; printed here when `None`.
    progress: Option<tokio::sync::mpsc::UnboundedSender<Progress>>,
}

impl<'a> Ctx<'a> {
    /// A command run here, on a pool it opens.
    pub fn local(env: &'a Env) -> Ctx<'a> {
        Ctx { env, live: None, replies: Vec::new(), progress: None }
    }

    /// A command the server of `store` runs for a client, progress going to `progress`.
    pub fn serving(
        env: &'a Env,
        store: Arc<Store>,
        progress: tokio::sync::mpsc::UnboundedSender<Progress>,
    ) -> Ctx<'a> {
        Ctx { env, live: Some(store), replies: Vec::new(), progress: Some(progress) }
    }

    fn say(&mut self, reply: Reply) {
        self.replies.push(reply);
    }

    fn done(&mut self, message: impl Into<String>) {
        self.say(Reply::done(message));
    }

    /// Reports progress: to the client of a served pool, else on standard error.
    fn progress(&self, progress: Progress) {
        match &self.progress {
            // A client gone stops hearing; the command still runs to its end.
            Some(to) => drop(to.send(progress)),
            None => eprintln!("{}", output::render_progress(&progress)),
        }
    }

    /// Waits for `store`'s scrub or resilver to end, reporting its progress at the start and
    /// every [`PROGRESS_EVERY`] until then.
    async fn wait_scan_reporting(&self, store: &Store) {
        let wait = store.wait_scan();
        tokio::pin!(wait);
        loop {
            if let Some(progress) = scan_progress(store) {
                self.progress(progress);
            }
            if tokio::time::timeout(PROGRESS_EVERY, &mut wait).await.is_ok() {
                return;
            }
        }
    }

    /// The pool `name`: the live one, or opened from its leaves.
    async fn hold(&self, name: &str) -> anyhow::Result<Held> {
        match &self.live {
            Some(store) if store.pool().name() == name => Ok(Held::Live(Arc::clone(store))),
            _ => Ok(Held::Local(Arc::new(open_store(self.env, name, &Tunables::default()).await?))),
        }
    }
}

/// How far `store`'s scan has got, if it has one.
fn scan_progress(store: &Store) -> Option<Progress> {
    let scan = store.scan_status()?;
    Some(Progress {
        pool: store.pool().name().to_owned(),
        func: scan.func.name().to_owned(),
        fraction: scan.progress(),
        examined_bytes: scan.examined_bytes,
        total_bytes: scan.total_bytes,
        issued_bytes: scan.issued_bytes,
        errors: scan.errors,
        seconds: scan.run_secs(store.pool().env().now()),
    })
}

/// A pool a command works on: one this process serves, or one it opened for the command (and
/// syncs and exports after it).
enum Held {
    Live(Arc<Store>),
    Local(Arc<Store>),
}

impl std::ops::Deref for Held {
    type Target = Store;
    fn deref(&self) -> &Store {
        match self {
            Held::Live(store) => store,
            Held::Local(store) => store,
        }
    }
}

impl Held {
    /// Starts the background syncer of a pool opened for a command that writes much (a
    /// receive): without it, dirty data waits at the write throttle for syncs nothing starts.
    /// A served pool's runs already.
    fn run_syncer(&self) {
        if let Held::Local(store) = self {
            store.run_syncer();
        }
    }

    fn is_live(&self) -> bool {
        matches!(self, Held::Live(_))
    }

    /// Ends the command: a pool opened for it finishes its scrub or resilver, and is synced
    /// and exported; a live one is synced.
    async fn release(self) -> anyhow::Result<()> {
        match self {
            Held::Live(store) => {
                store.sync().await?;
            }
            Held::Local(store) => {
                store.wait_scan().await;
                match Arc::try_unwrap(store) {
                    Ok(store) => store.export().await?,
                    Err(store) => {
                        store.sync().await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The store as the background scan needs it.
    fn shared(&self) -> &Arc<Store> {
        match self {
            Held::Live(store) | Held::Local(store) => store,
        }
    }
}

/// Parses sizes like 4096, 4K, 4KiB, 64M or 1.5G (binary multiples).
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    sluice_engine::tunables::parse_bytes(text).with_context(|| {
        format!(
            "{text:?} is not a whole number of bytes that fits in 64 bits (like 4096, 4K, 4KiB, \
             64M or 1.5G)"
        )
    })
}

/// The vdev types `zpool create` knows beside `mirror` and `log` that sluice does not build,
/// with what they are: refused by name, never taken for a file's name.
const VDEV_TYPES_NOT_BUILT: [(&str, &str); 4] = [
    ("draid", "dRAID"),
    ("cache", "cache devices"),
    ("special", "special allocation class devices"),
    ("dedup", "dedup table devices"),
];

/// A word of `pool create`'s vdev list: `mirror`, `raidz` (`raidz1`), `raidz2`, `raidz3`,
/// `log`, `spare`, or a leaf's absolute path ([`parse_leaf_path`]). Another vdev type ZFS knows is
/// refused by name.
pub fn parse_vdev_word(word: &str) -> anyhow::Result<String> {
    if matches!(word, "mirror" | "log" | "spare" | "raidz" | "raidz1" | "raidz2" | "raidz3") {
        return Ok(word.to_owned());
    }
    // dRAID's words carry their parity and geometry: draid, draid2, draid2:4d:1s.
    let draid = word.strip_prefix("draid").is_some_and(|rest| {
        rest.is_empty() || rest.starts_with(|c: char| c.is_ascii_digit() || c == ':')
    });
    let kind = if draid { "draid" } else { word };
    if let Some((_, what)) = VDEV_TYPES_NOT_BUILT.iter().find(|(k, _)| *k == kind) {
        anyhow::bail!(
            "`{word}` is a ZFS vdev type ({what}) that sluice does not build yet; list leaves, \
             with `mirror` or `raidz`, `raidz2`, `raidz3` before each group"
        );
    }
    parse_leaf_path(word)
}

/// A leaf's path from the command line: absolute, as `zpool` wants for files, because the
/// server that opens it may run in another directory than the command. A relative one is
/// refused with the absolute path it would have meant here.
pub fn parse_leaf_path(word: &str) -> anyhow::Result<String> {
    let path = Path::new(word);
    if path.is_absolute() {
        return Ok(word.to_owned());
    }
    let meant = std::env::current_dir()
        .map(|dir| {
            let whole = dir.join(path);
            let parts = whole.components().filter(|c| *c != std::path::Component::CurDir);
            parts.collect::<std::path::PathBuf>().display().to_string()
        })
        .unwrap_or_else(|_| format!("/full/path/to/{word}"));
    anyhow::bail!("leaf path {word:?} is not absolute; give the whole path, such as {meant}")
}

/// Opens a leaf; a missing file is created with `create_len` bytes, allocated in full unless
/// `sparse`.
pub(crate) fn open_leaf(
    path: &str,
    create_len: Option<u64>,
    sparse: bool,
) -> anyhow::Result<LeafSpec> {
    let options = FileDeviceOptions {
        create_len_bytes: create_len,
        sparse,
        exclusive: true,
        ..Default::default()
    };
    let device = FileDevice::open(Path::new(path), &options).map_err(|error| match error {
        // An error the engine wrote itself rather than one from the OS (the leaf's lock refused
        // by its filesystem, a path that is neither file nor block device): it says what went
        // wrong and what to do, which the generic "cannot open; check the path exists" of
        // DeviceError::Open would bury.
        DeviceError::Open { path, cause: source } if source.raw_os_error().is_none() => {
            anyhow::Error::new(source).context(format!("device {}", path.display()))
        }
        error => error.into(),
    })?;
    // Every leaf can be made to fail on demand (`pool inject`, hidden: for tests and drills).
    let (device, handle) = Injected::new(Arc::new(device));
    injections().insert(path.to_owned(), handle);
    Ok(LeafSpec { path: path.to_owned(), device: Arc::new(device) })
}

/// The fault-injection handle of every leaf this process opened, by path.
static INJECTIONS: std::sync::Mutex<BTreeMap<String, InjectHandle>> =
    std::sync::Mutex::new(BTreeMap::new());

fn injections() -> std::sync::MutexGuard<'static, BTreeMap<String, InjectHandle>> {
    // A panic elsewhere while holding it left a map that is still whole.
    INJECTIONS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Opens the pool called `name` from the cache, with `tunables` (`sluice serve --set`).
pub(crate) async fn open_store(
    env: &Env,
    name: &str,
    tunables: &Tunables,
) -> anyhow::Result<Store> {
    let cache = cache::read_cache()?;
    let Some(paths) = cache.get(name) else {
        return Err(crate::exit::refuse(
            sluice_engine::ErrorKind::NotFound,
            format!(
                "no pool named {name} is known here; import it with \
                 `sluice pool import {name} -d DIR`"
            ),
        ));
    };
    let leaves = paths
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| open_leaf(p, None, false))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let pool = Pool::import(env, leaves, name, tunables).await?;
    Ok(Store::open(pool, tunables).await?)
}

/// The pool a command's POOL, POOL/VOL or POOL/VOL@SNAP names.
pub fn pool_of(spec: &str) -> &str {
    spec.split(['/', '@']).next().unwrap_or(spec)
}

/// Splits `POOL/VOL`.
pub fn split_volume(spec: &str) -> anyhow::Result<(&str, &str)> {
    spec.split_once('/')
        .with_context(|| format!("{spec:?} is not POOL/VOLUME (for example tank/vm1)"))
}

/// Splits `POOL/VOL@SNAP`.
pub fn split_snapshot(spec: &str) -> anyhow::Result<(&str, &str, &str)> {
    let (pool, rest) = split_volume(spec)?;
    let (volume, snapshot) = rest.split_once('@').with_context(|| {
        format!("{spec:?} is not POOL/VOLUME@SNAPSHOT (for example tank/vm1@before-upgrade)")
    })?;
    Ok((pool, volume, snapshot))
}

/// `NEW` or `POOL/NEW` as a name in `pool`, for a command that makes a volume in the pool of
/// `source` (`what` says what is made, for the refusal).
fn name_in_pool<'t>(to: &'t str, pool: &str, source: &str, what: &str) -> anyhow::Result<&'t str> {
    match to.split_once('/') {
        Some((other, _)) if other != pool => {
            anyhow::bail!("{to} is in pool {other}, {source} in pool {pool}; {what}")
        }
        Some((_, name)) => Ok(name),
        None => Ok(to),
    }
}

/// ZFS's `used` of a volume: what its tree holds of its own (for a clone, not what it shares
/// with its origin), what only its snapshots hold, and what is still set aside for it (its
/// reservation less what it alone references).
fn used_bytes(volume: &sluice_format::VolumeEntry, snapshots: &SnapshotSpace) -> u64 {
    snapshots.dataset_bytes
        + snapshots.snapshots_bytes
        + volume.reservation_bytes.saturating_sub(snapshots.written_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names split as the commands take them, and sizes parse as people type them.
    #[test]
    fn names_and_sizes_parse() {
        assert_eq!(split_volume("tank/vm1").unwrap(), ("tank", "vm1"));
        assert!(split_volume("tank").unwrap_err().to_string().contains("POOL/VOLUME"));
        assert_eq!(split_snapshot("tank/vm1@mon").unwrap(), ("tank", "vm1", "mon"));
        assert!(split_snapshot("tank/vm1").unwrap_err().to_string().contains("@SNAPSHOT"));
        assert_eq!(pool_of("tank/vm1@mon"), "tank");
        assert_eq!(pool_of("tank"), "tank");
        assert_eq!(name_in_pool("tank/web", "tank", "tank/vm1", "x").unwrap(), "web");
        assert_eq!(name_in_pool("web", "tank", "tank/vm1", "x").unwrap(), "web");
        assert!(name_in_pool("other/web", "tank", "tank/vm1", "within").is_err());
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        let refused = parse_size("1.5B").unwrap_err().to_string();
        assert!(refused.contains("whole number of bytes"), "{refused}");
    }
}
