//! `sluice serve`: serve a pool's volumes over NBD until SIGINT or SIGTERM.
//!
//! With no pool named, the pool lives in `./sluice-data`: a 2-way mirror of two thin files
//! (`--thick` allocates them in full), created on first use with a volume `vol0`, imported
//! afterwards. Thin, the files take about 2 GiB at the start: pool creation writes each
//! file's intent-log region (an eighth of it, at most 1 GiB) ahead, so log writes land on
//! extents the filesystem has already allocated (crate::alloc of the engine), and the
//! first sync writes are as fast as on a thick file. The rest is taken as the pool writes;
//! a filesystem that fills under it fails the pool's writes with an error that names the leaf
//! and the filesystem (the engine's `DeviceError::HostFull`), and the pool suspends until
//! space is freed and it is imported again; acknowledged writes are in the intent log. Every volume of the pool is
//! an export, including volumes created while serving; the export named "" is `vol0` if it
//! exists, else the first volume. On a signal the server stops accepting, answers what it
//! has read, syncs and exports the pool. With `--metrics ADDR` it also answers Prometheus
//! scrapes (crate::metrics) until then. `--tls` and its credentials (docs/tls.md) are read and
//! checked before the pool is touched, and so is the rule that a TCP listener on an address
//! other than loopback needs `--tls` said explicitly. While it serves, the pool's scheduled
//! scrubs and snapshots run (the engine's `schedule`), and a service manager is told when it
//! is ready and when it stops (crate::notify).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use sluice_engine::rt::Env;
use sluice_engine::tunables::Tunables;
use sluice_engine::Store;
use sluice_engine::Volume;
use sluice_engine::{KeyStatus, UserKey};
use sluice_engine::{Pool, PoolSpec, TopSpec};
use sluice_format::KeyLocation;
use sluice_nbd::listen::{self, Listener};
use sluice_nbd::tls::{AllowList, TlsServer, TlsSettings};
use sluice_nbd::Exports;

use crate::command::{TlsArgs, TlsChoice};
use crate::pools;

/// How `sluice serve` was asked to run.
pub struct ServeOptions {
    pub pool: Option<String>,
    pub dir: PathBuf,
    pub socket: Option<PathBuf>,
    pub listen: Option<String>,
    pub stdio: bool,
    pub leaf_bytes: u64,
    /// Create the default pool's files thin (sparse) instead of allocated in full.
    pub sparse: bool,
    pub volume_bytes: u64,
    pub tunables: Tunables,
    /// Sockets passed by socket activation, taken at startup; used instead of the defaults.
    pub inherited: listen::Inherited,
    /// Where to answer `GET /metrics`, if anywhere.
    pub metrics: Option<String>,
    /// TLS for NBD clients.
    pub tls: TlsArgs,
    /// A directory of programs to run for each event (crate::zed).
    pub event_hook: Option<PathBuf>,
}

impl TlsArgs {
    /// The server's TLS, read and checked: `None` when off.
    fn server(&self) -> anyhow::Result<Option<Arc<TlsServer>>> {
        let credentials = self.tls_certificates.is_some() || self.tls_psk.is_some();
        let mode = match self.tls {
            Some(mode) => mode,
            None if credentials => anyhow::bail!(
                "TLS credentials were given without --tls: pass --tls require (TLS or nothing) \
                 or --tls on (TLS for clients that ask)"
            ),
            None if !self.tls_allow.is_empty() || self.tls_verify_peer => {
                anyhow::bail!(
                    "--tls-allow needs --tls require, and --tls-verify-peer --tls on or \
                     require, each with credentials (--tls-certificates, --tls-psk)"
                )
            }
            None => return Ok(None),
        };
        if mode == TlsChoice::Off {
            anyhow::ensure!(
                !credentials && !self.tls_verify_peer && self.tls_allow.is_empty(),
                "--tls off with TLS credentials or policy (--tls-certificates, --tls-psk, \
                 --tls-verify-peer, --tls-allow): drop them, or pass --tls on|require"
            );
            return Ok(None);
        }
        let settings = TlsSettings {
            require: mode == TlsChoice::Require,
            certificates: self.tls_certificates.clone(),
            verify_peer: self.tls_verify_peer,
            psk: self.tls_psk.clone(),
            allow: AllowList::parse(&self.tls_allow)?,
        };
        Ok(Some(Arc::new(TlsServer::new(&settings)?)))
    }
}

/// Refuses a TCP listener on an address other than loopback unless `--tls` was given: there,
/// anyone who can reach the address would read and write the volumes.
fn check_exposure(tls: &TlsArgs, address: std::net::SocketAddr, named: &str) -> anyhow::Result<()> {
    if tls.tls.is_some() || address.ip().is_loopback() {
        return Ok(());
    }
    anyhow::bail!(
        "{named} ({address}) is not a loopback address: anyone who reaches it could read and \
         write the volumes in plain text. Pass --tls require with --tls-certificates DIR \
         and/or --tls-psk FILE, or --tls off to serve without TLS anyway"
    )
}

/// The pool name used for `./sluice-data`.
pub const DEFAULT_POOL: &str = "sluice";
/// The volume created in a new default pool.
pub const DEFAULT_VOLUME: &str = "vol0";

struct StoreExports {
    store: Arc<Store>,
}

impl StoreExports {
    /// Whether export `name` (a volume or VOL@SNAP) may be served: not an encrypted volume
    /// whose key is not loaded (it is served once `key load` loads it).
    fn servable(&self, name: &str) -> bool {
        let volume = name.split('@').next().unwrap_or(name);
        !matches!(self.store.key_status(volume), Ok(KeyStatus::Unavailable))
    }
}

impl Exports for StoreExports {
    fn names(&self) -> Vec<String> {
        let names = self.store.volumes().into_iter().map(|v| v.name);
        names.filter(|name| self.servable(name)).collect()
    }

    fn open(&self, name: &str) -> Option<Volume> {
        let name = if name.is_empty() {
            let names = self.names();
            names.iter().find(|n| *n == DEFAULT_VOLUME).or(names.first()).cloned()?
        } else {
            name.to_owned()
        };
        if !self.servable(&name) {
            return None;
        }
        Volume::open(&self.store, &name).ok()
    }
}

/// Loads, at start, the keys of encrypted volumes kept in files (`keylocation=file://…`), as
/// a service manager needs, where nobody answers a prompt; says on standard error what it
/// loaded and what it could not (those volumes are not served until `sluice key load`).
async fn load_file_keys(store: &Store) {
    let mut families = std::collections::BTreeSet::new();
    for volume in store.volumes() {
        let Ok(Some(info)) = store.encryption(&volume.name) else { continue };
        let KeyLocation::File(path) = &info.location else {
            if info.status == KeyStatus::Unavailable && families.insert(info.family) {
                eprintln!(
                    "sluice: volume {}/{} is encrypted with a key given at a prompt: it is \
                     served once `sluice key load {0}/{1}` loads it",
                    store.pool().name(),
                    volume.name
                );
            }
            continue;
        };
        if info.status != KeyStatus::Unavailable || !families.insert(info.family) {
            continue;
        }
        let spec = format!("{}/{}", store.pool().name(), volume.name);
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o077 != 0 {
                eprintln!(
                    "sluice: warning: the key file {path} of {spec} can be read or written by \
                     other users (mode {:o}); `chmod 600 {path}`",
                    meta.permissions().mode() & 0o777
                );
            }
        }
        let loaded = match std::fs::read(path) {
            Ok(bytes) => {
                store.load_key(&volume.name, &UserKey::new(bytes)).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(format!("reading {path}: {e}")),
        };
        match loaded {
            Ok(()) => eprintln!("sluice: loaded the key of {spec} from file://{path}"),
            Err(e) => eprintln!(
                "sluice: the key of {spec} was not loaded ({e}); it is not served until \
                 `sluice key load {spec}`"
            ),
        }
    }
}

/// Opens (or creates) the default pool in `dir`.
async fn default_store(env: &Env, options: &ServeOptions) -> anyhow::Result<Store> {
    let dir = &options.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Absolute paths: the pool cache and the printed URIs must work from any directory.
    let dir =
        &std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let legs: Vec<String> = ["leg0.img", "leg1.img"]
        .iter()
        .map(|f| dir.join(f).to_string_lossy().into_owned())
        .collect();
    if legs.iter().any(|p| Path::new(p).exists()) {
        let leaves = legs
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| pools::open_leaf(p, None, false))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pool = Pool::import(env, leaves, DEFAULT_POOL, &options.tunables).await?;
        pools::remember(&pool)?;
        return Ok(Store::open(pool, &options.tunables).await?);
    }
    let leaves = legs
        .iter()
        .map(|p| pools::open_leaf(p, Some(options.leaf_bytes), options.sparse))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let spec =
        PoolSpec { name: DEFAULT_POOL.into(), ashift: 12, top: vec![TopSpec::Mirror(leaves)] };
    let pool = Pool::create(env, spec, &options.tunables).await?;
    pools::remember(&pool)?;
    let store = Store::create(pool, &options.tunables);
    // Thick, as `vol create` makes volumes by default.
    store.create_volume_with(DEFAULT_VOLUME, options.volume_bytes, 16 << 10, true)?;
    store.sync().await?;
    eprintln!(
        "created pool {DEFAULT_POOL} (a mirror of {} and {}) with volume {DEFAULT_VOLUME} ({} bytes)",
        legs[0], legs[1], options.volume_bytes
    );
    Ok(store)
}

/// Serves until a signal; connections are spread over `placement`'s cores.
pub async fn serve(
    env: &Env,
    mut options: ServeOptions,
    placement: sluice_nbd::placement::Placement,
) -> anyhow::Result<()> {
    // Credentials and listeners are checked before the pool is opened: a mistake there must
    // not leave a pool imported by a server that never served.
    let tls = options.tls.server()?;
    if let Some(dir) = &options.event_hook {
        crate::zed::check_dir(dir)?;
    }
    let inherited = if options.stdio {
        Vec::new()
    } else {
        std::mem::take(&mut options.inherited)
            .into_listeners()
            .context("adopting inherited sockets (LISTEN_FDS)")?
    };
    for listener in &inherited {
        if let Listener::Tcp(tcp) = listener {
            check_exposure(&options.tls, tcp.local_addr()?, "an inherited socket")?;
        }
    }
    let tcp_address = options.listen.clone().unwrap_or_else(|| String::from("127.0.0.1:10809"));
    if !options.stdio && inherited.is_empty() && tcp_address != "none" {
        let resolved = tokio::net::lookup_host(&tcp_address)
            .await
            .with_context(|| format!("resolving --listen {tcp_address}"))?;
        for address in resolved {
            check_exposure(&options.tls, address, &format!("--listen {tcp_address}"))?;
        }
    }
    let store = match &options.pool {
        Some(name) => pools::open_store(env, name, &options.tunables).await?,
        None => default_store(env, &options).await?,
    };
    if !store.key_families().is_empty() {
        // Keys may be loaded into this process, now or by `key load`.
        crate::pools::key::keep_keys_out_of_core_dumps();
    }
    load_file_keys(&store).await;
    let store = Arc::new(store);
    let journal = crate::events::journal(&store);
    let hooks = match &options.event_hook {
        Some(dir) => Some(crate::zed::spawn(&store, dir)?),
        None => None,
    };
    store.run_syncer();
    // Scheduled scrubs and snapshots run while the pool is served, and only then.
    store.start_schedules();
    // How autoreplace opens a disk swapped in at a leaf's path (exclusively, as every leaf).
    store.set_device_opener(Arc::new(|path: &str| crate::pools::open_leaf(path, None, false).ok()));
    let control = crate::control::serve(env.clone(), Arc::clone(&store)).await?;
    let metrics = match &options.metrics {
        Some(address) => Some(crate::metrics::serve(&store, address).await?),
        None => None,
    };
    let exports: Arc<dyn Exports> = Arc::new(StoreExports { store: Arc::clone(&store) });
    if options.stdio {
        // One client on stdin/stdout; stdout carries the protocol, so nothing else is printed.
        let result = listen::serve_stdio(exports, tls).await;
        control.abort();
        journal.abort();
        if let Some(hooks) = &hooks {
            hooks.abort();
        }
        if let Some((_, task)) = metrics {
            task.abort();
        }
        crate::control::remove(store.pool().name());
        finish(store).await?;
        return result.map_err(Into::into);
    }
    let mut listeners = inherited;
    let mut addresses = Vec::new();
    if listeners.is_empty() {
        let socket = match options.socket.clone() {
            Some(socket) => socket,
            None => std::fs::create_dir_all(&options.dir)
                .and_then(|()| std::fs::canonicalize(&options.dir))
                .with_context(|| format!("resolving {}", options.dir.display()))?
                .join("nbd.sock"),
        };
        if socket.exists() {
            // A socket left by a server that died; a live one holds the pool's leaves, so we
            // would not have got this far.
            std::fs::remove_file(&socket)
                .with_context(|| format!("removing stale {}", socket.display()))?;
        }
        let unix = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("listening on {}", socket.display()))?;
        listeners.push(Listener::Unix(unix));
        addresses.push(format!("unix:{}", socket.display()));
        if tcp_address != "none" {
            let tcp = tokio::net::TcpListener::bind(&tcp_address).await.with_context(|| {
                format!("listening on {tcp_address} (use --listen ADDR, or --listen none)")
            })?;
            addresses.push(format!("tcp:{}", tcp.local_addr()?));
            listeners.push(Listener::Tcp(tcp));
        }
        let tcp = addresses.iter().find_map(|a| a.strip_prefix("tcp:")).map(str::to_owned);
        print_help(&store, &socket, tcp.as_deref(), tls.as_deref());
    } else {
        addresses.push(format!("{} inherited socket(s)", listeners.len()));
    }
    if let Some((address, _)) = &metrics {
        addresses.push(format!("metrics http://{address}/metrics"));
    }
    match &tls {
        Some(tls) => {
            eprintln!("sluice: {}", tls.summary());
            // A typo in --tls-allow would restrict nothing that exists.
            let volumes: Vec<String> = store.volumes().into_iter().map(|v| v.name).collect();
            for export in tls.allow_list().exports().filter(|e| !volumes.iter().any(|v| v == e)) {
                eprintln!(
                    "sluice: warning: --tls-allow names volume {export}, which pool {} does not \
                     have (yet): check the name",
                    store.pool().name()
                );
            }
        }
        None => eprintln!("sluice: TLS off (plain text)"),
    }
    eprintln!("sluice: serving pool {} on {}", store.pool().name(), addresses.join(", "));
    crate::notify::notify(&format!(
        "READY=1\nSTATUS=serving pool {} on {}",
        store.pool().name(),
        addresses.join(", ")
    ));
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let signals = tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut interrupt), Ok(mut terminate)) =
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
        else {
            return;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!("sluice: stopping: finishing requests in flight, then syncing");
        crate::notify::notify("STOPPING=1\nSTATUS=finishing requests, syncing and exporting");
        let _ = stop.send(true);
    });
    listen::serve(listeners, exports, shutdown, placement, tls).await;
    signals.abort();
    control.abort();
    journal.abort();
    if let Some(hooks) = &hooks {
        hooks.abort();
    }
    let _ = control.await;
    if let Some((_, task)) = metrics {
        task.abort();
        let _ = task.await;
    }
    crate::control::remove(store.pool().name());
    finish(store).await
}

/// Syncs and exports the pool once every connection is gone.
async fn finish(store: Arc<Store>) -> anyhow::Result<()> {
    let name = store.pool().name().to_owned();
    // A scrub or resilver stops after its current chunk (a leaf still behind is resilvered
    // again at the next import).
    store.halt_scan().await;
    store.sync().await?;
    // Tasks a request left behind (an early log commit, a patch being completed) end within
    // a device write's or read's latency.
    let mut store = store;
    let mut waited = 0;
    let store = loop {
        match Arc::try_unwrap(store) {
            Ok(store) => break Some(store),
            Err(held) if waited < 100 => {
                store = held;
                waited += 1;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            Err(_) => break None,
        }
    };
    match store {
        Some(store) => store.export().await?,
        // A handle outlived its connection; the sync above made everything durable.
        None => {
            eprintln!("sluice: pool {name} synced; a task still holds it, so it was not exported")
        }
    }
    eprintln!("sluice: pool {name} exported");
    Ok(())
}

fn print_help(store: &Store, socket: &Path, tcp: Option<&str>, tls: Option<&TlsServer>) {
    let volume = store
        .volumes()
        .into_iter()
        .map(|v| v.name)
        .find(|n| n == DEFAULT_VOLUME)
        .or_else(|| store.volumes().first().map(|v| v.name.clone()))
        .unwrap_or_else(|| String::from("VOLUME"));
    let socket = socket.display();
    if tls.is_some_and(TlsServer::required) {
        // Every client needs credentials: the plain URIs below would be refused.
        let tcp = tcp.unwrap_or("HOST:PORT");
        eprintln!(
            "\nConnect with TLS (docs/tls.md), for example:\n  \
             nbdinfo 'nbds://IDENTITY@{tcp}/{volume}?tls-psk-file=KEYS.psk'\n  \
             nbdinfo 'nbds://{tcp}/{volume}?tls-certificates=CLIENT-DIR'\n\
             Stop with Ctrl-C (the pool is synced and exported).\n"
        );
        return;
    }
    let unix = format!("nbd+unix:///{volume}?socket={socket}");
    // fio and qemu-img take either URI; TCP is shown when the server listens on it.
    let uri = tcp.map_or_else(|| unix.clone(), |tcp| format!("nbd://{tcp}/{volume}"));
    eprintln!(
        "\nConnect with:\n  \
         nbdinfo '{unix}'\n  \
         qemu-img info '{unix}'\n  \
         qemu-img convert -n -O raw disk.img '{uri}'\n  \
         fio --name=sync --ioengine=nbd --uri='{uri}' --rw=randwrite --bs=4k --fsync=1 --size=256M\n\
         Stop with Ctrl-C (the pool is synced and exported).\n"
    );
}
