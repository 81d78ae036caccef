//! The `sluice` command. `main` only turns a result into an exit code (by the kind of failure,
//! exit.rs); each subcommand is a function that returns `anyhow::Result`.
//!
//! Commands (their grammar: command.rs): `sluice pool`, `sluice vol`, `sluice snapshot`,
//! `sluice clone`, `sluice send` and `sluice recv` (pools on files and block devices, pools/),
//! `sluice tunables` (the table, or settings validated) and `sluice serve` (volumes over NBD,
//! serve.rs). A command about a pool runs here, or, when the pool is served, in its server:
//! the parsed command is the request of the control protocol (control.rs), and either way it
//! answers with typed replies that this process renders as text, `-H` or `--json`
//! (pools/output.rs), merged when a list spans several pools. The benchmarks and the seeds'
//! experiments are a binary of their own, `sluice-bench` (crates/bench), so that the served
//! binary does not link the simulator.

mod command;
mod control;
mod events;
mod exit;
mod hints;
mod iostat;
mod metrics;
mod notify;
mod pools;
mod serve;
mod service;
mod snapshot;
mod zed;

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use sluice_engine::tunables::{Tunable, Tunables};
use sluice_engine::{ImportOptions, NewFeatures, VolumeProperty};

use command::{Cli, Command, KeyCommand, PoolCommand, SnapshotCommand, VolCommand};
use pools::output::{Format, Reply};
use pools::Ctx;

/// mimalloc, with the option crates/host/src/allocator.rs sets and says why.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // SAFETY: first thing in main: no runtime, pool or other thread has started, so nothing
    // reads the environment while the socket-activation variables are removed.
    let inherited = unsafe { sluice_nbd::listen::take_inherited() };
    sluice_host::allocator::tune();
    match run(Cli::parse(), inherited) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice: {}", hints::message(&error));
            ExitCode::from(exit::code(&error))
        }
    }
}

/// Runs an engine task on a fresh tokio runtime with a random seed (guids must differ between
/// processes; only the simulator fixes seeds).
fn on_runtime<F>(task: impl FnOnce(sluice_engine::rt::Env) -> F) -> anyhow::Result<()>
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = sluice_host::runtime()?;
    let seed = random_seed();
    runtime.block_on(async move { task(sluice_host::tokio_env(seed)).await })
}

/// A seed that differs between processes.
fn random_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (u64::from(std::process::id()) << 32)
}

/// Runs each command about one pool, through the pool's server when it is being served, else
/// here, and prints their replies after `first`, merged (one table for rows of several pools)
/// and rendered as `format` asks. A pool that fails does not keep the others from answering,
/// as with `zpool status` or `zpool upgrade -a`: one pool that cannot be opened would
/// otherwise hide every pool after it. Each failure but the last is reported as it comes; the
/// last is returned, and its kind sets the exit code.
async fn per_pools(
    env: &sluice_engine::rt::Env,
    jobs: Vec<(String, Command)>,
    format: Format,
    first: Vec<Reply>,
) -> anyhow::Result<()> {
    let mut replies = first;
    let mut failed = None;
    for (pool, command) in jobs {
        if let Err(error) = gather(env, &pool, command, &mut replies).await {
            if let Some(earlier) = failed.replace(error) {
                eprintln!("sluice: {}", hints::message(&earlier));
            }
        }
    }
    print!("{}", pools::output::render_all(replies, format));
    failed.map_or(Ok(()), Err)
}

/// One command about `pool`: its replies are added to `replies` (those it made before a
/// failure too); progress reports are printed as they come.
async fn gather(
    env: &sluice_engine::rt::Env,
    pool: &str,
    command: Command,
    replies: &mut Vec<Reply>,
) -> anyhow::Result<()> {
    if let Some(forwarded) = control::forward(pool, &command, replies) {
        return forwarded;
    }
    let mut ctx = Ctx::local(env);
    let result = run_pool_command(&mut ctx, command).await;
    replies.append(&mut ctx.replies);
    result
}

/// The pool, volume and snapshot commands that may run against a pool held elsewhere in this
/// process (the server's live store, for its control socket); the replies go to `ctx`.
pub(crate) async fn run_pool_command(ctx: &mut Ctx<'_>, command: Command) -> anyhow::Result<()> {
    use pools::{pool, replication, snapshot, vol};
    match command {
        Command::Pool { pool: command } => match command {
            PoolCommand::Status { names, .. } => pool::status(ctx, &names).await,
            PoolCommand::List { names, .. } => pool::list(ctx, &names).await,
            PoolCommand::Sync { name } => pool::sync(ctx, &name).await,
            PoolCommand::Add { name, vdevs, size, sparse, force } => {
                pools::spares::add(ctx, &name, &vdevs, (size, sparse), force).await
            }
            PoolCommand::Remove { name, leaf } => pools::spares::remove(ctx, &name, &leaf).await,
            PoolCommand::Get { name, properties, .. } => {
                pools::props::get(ctx, &name, &properties).await
            }
            PoolCommand::Set { name, property } => pools::props::set(ctx, &name, &property).await,
            PoolCommand::Upgrade { names, list_only, .. } => {
                pools::props::upgrade(ctx, &names, list_only).await
            }
            PoolCommand::Scrub { name, pause, stop, wait } => {
                pool::scrub(ctx, &name, pool::ScrubAction::from_flags(pause, stop, wait)).await
            }
            PoolCommand::Offline { name, leaf, temporary } => {
                pool::offline(ctx, &name, &leaf, temporary).await
            }
            PoolCommand::Online { name, leaf } => pool::online(ctx, &name, &leaf).await,
            PoolCommand::Clear { name, leaf } => pool::clear(ctx, &name, leaf.as_deref()).await,
            PoolCommand::Attach { name, existing, new } => {
                pool::attach(ctx, &name, &existing, new.into(), false).await
            }
            PoolCommand::Replace { name, old, new, options } => {
                // No NEW: the device now at OLD's path (the engine names the old leaf
                // PATH/old until it leaves).
                pool::attach(ctx, &name, &old, options.leaf(new.unwrap_or_default()), true).await
            }
            PoolCommand::Detach { name, leaf } => pool::detach(ctx, &name, &leaf).await,
            PoolCommand::Inject { name, leaf, what } => {
                pool::inject(ctx, &name, &leaf, &what).await
            }
            PoolCommand::Stats { name } => pool::stats(ctx, &name),
            PoolCommand::Events { name, clear, .. } => pool::events(ctx, &name, clear),
            PoolCommand::Create { .. }
            | PoolCommand::Import { .. }
            | PoolCommand::Export { .. }
            | PoolCommand::Destroy { .. }
            | PoolCommand::Iostat { .. }
            | PoolCommand::Service { .. } => not_served(),
        },
        Command::Vol { vol: command } => match command {
            VolCommand::Create {
                spec,
                size,
                block_size,
                dedup,
                sync,
                logbias,
                compression,
                sparse,
                encryption,
                keyformat,
                keylocation,
                key,
            } => {
                let properties = [
                    VolumeProperty::Dedup(dedup),
                    VolumeProperty::Sync(sync),
                    VolumeProperty::LogBias(logbias),
                    VolumeProperty::Compression(compression),
                ];
                let encrypt = pools::key::Encrypt::from_args(&encryption, keyformat, keylocation)?
                    .map(|settings| (settings, key));
                vol::create(ctx, &spec, (size, block_size), !sparse, &properties, encrypt).await
            }
            VolCommand::Set { spec, property } => vol::set(ctx, &spec, &property).await,
            VolCommand::List { pools, .. } => vol::list(ctx, &pools).await,
            VolCommand::Destroy { spec, recursive, force } => {
                vol::destroy(ctx, &spec, recursive, force).await
            }
            VolCommand::Rollback { spec, recursive } => vol::rollback(ctx, &spec, recursive).await,
            VolCommand::Promote { spec } => vol::promote(ctx, &spec).await,
            VolCommand::Rename { spec, to } => vol::rename(ctx, &spec, &to).await,
            VolCommand::Get { spec, properties, .. } => vol::get(ctx, &spec, &properties).await,
            VolCommand::Resize { spec, size } => vol::resize(ctx, &spec, size).await,
        },
        Command::Snapshot { snapshot: command } => match command {
            SnapshotCommand::Create { specs } => snapshot::create(ctx, &specs).await,
            SnapshotCommand::List { targets, .. } => snapshot::list(ctx, &targets).await,
            SnapshotCommand::Destroy { spec } => snapshot::destroy(ctx, &spec).await,
        },
        Command::Clone { snapshot, volume } => snapshot::clone(ctx, &snapshot, &volume).await,
        Command::Key { key: command } => match command {
            KeyCommand::Load { spec, key, .. } => pools::key::load(ctx, &spec, key.as_ref()).await,
            KeyCommand::Unload { spec, force } => pools::key::unload(ctx, &spec, force).await,
            KeyCommand::Change { spec, keyformat, keylocation, key } => {
                pools::key::change(ctx, &spec, keyformat, keylocation, key.as_ref()).await
            }
        },
        Command::Recv { spec, abort: true, .. } => replication::recv_abort(ctx, &spec).await,
        // Received here only by the control socket's own path (control.rs), which carries the
        // stream.
        Command::Serve { .. }
        | Command::Send { .. }
        | Command::Recv { .. }
        | Command::Tunables { .. }
        | Command::Bench { .. } => not_served(),
    }
}

fn not_served() -> anyhow::Result<()> {
    anyhow::bail!(
        "only pool status|list|stats|events|sync|scrub|offline|online|clear|attach|detach|replace|\
         upgrade, vol \
         create|list|get|set|rename|resize|rollback|promote|destroy, snapshot \
         create|list|destroy, clone, key load|unload|change, send and recv run on a served pool"
    )
}

/// Refuses a command that needs the pool's leaves to itself while a server holds them.
fn refuse_if_served(name: &str) -> anyhow::Result<()> {
    if control::is_served(name) {
        anyhow::bail!(
            "pool {name} is being served by `sluice serve` (control socket {}); stop the server \
             first (Ctrl-C or SIGTERM)",
            control::socket_path(name).display()
        );
    }
    Ok(())
}

/// Prints what a command run here said, then returns its result.
fn show(ctx: Ctx<'_>, result: anyhow::Result<()>) -> anyhow::Result<()> {
    print!("{}", pools::output::render_all(ctx.replies, Format::Text));
    result
}

/// `sluice pool ...`.
async fn pool_command(env: &sluice_engine::rt::Env, command: PoolCommand) -> anyhow::Result<()> {
    let mut ctx = Ctx::local(env);
    let pools_named = |names: Vec<String>| {
        if names.is_empty() {
            pools::known_pools()
        } else {
            Ok(names)
        }
    };
    match command {
        PoolCommand::Create { name, vdevs, size, sparse, ashift, force, no_features } => {
            refuse_if_served(&name)?;
            let features = if no_features { NewFeatures::NONE } else { NewFeatures::ALL };
            let (leaves, options) =
                (&vdevs[..], pools::pool::CreateOptions { ashift, force, features });
            let result =
                pools::pool::create(&mut ctx, &name, (size, sparse), leaves, options).await;
            show(ctx, result)
        }
        PoolCommand::Upgrade { verbose: true, .. } => {
            print!("{}", pools::props::features_text());
            Ok(())
        }
        PoolCommand::Upgrade { names, all, .. } => {
            // Named pools, or -a, are upgraded; with neither, every known pool is only looked at.
            let list_only = names.is_empty() && !all;
            let names = pools_named(names)?;
            if names.is_empty() {
                println!("no pools");
            }
            let jobs = (names.into_iter())
                .map(|name| {
                    let names = vec![name.clone()];
                    let command =
                        PoolCommand::Upgrade { names, all: false, verbose: false, list_only };
                    (name, Command::Pool { pool: command })
                })
                .collect();
            per_pools(env, jobs, Format::Text, Vec::new()).await
        }
        PoolCommand::Import { name, dirs, devices, rewind, dry_run, discard_unreadable_log } => {
            refuse_if_served(&name)?;
            let options = ImportOptions { rewind, discard_unreadable_log };
            let searched = (&dirs[..], &devices[..]);
            let result = pools::pool::import(&mut ctx, &name, searched, options, dry_run).await;
            show(ctx, result)
        }
        PoolCommand::Export { name } => {
            refuse_if_served(&name)?;
            let result = pools::pool::export(&mut ctx, &name).await;
            show(ctx, result)
        }
        PoolCommand::Destroy { name } => {
            refuse_if_served(&name)?;
            let result = pools::pool::destroy(&mut ctx, &name).await;
            show(ctx, result)
        }
        PoolCommand::List { names, scripted, json } => {
            let jobs = (pools_named(names)?.into_iter())
                .map(|name| {
                    let names = vec![name.clone()];
                    (name, Command::Pool { pool: PoolCommand::List { names, scripted, json } })
                })
                .collect();
            // The header even when no pool is known.
            let first = vec![Reply::PoolList(Default::default())];
            per_pools(env, jobs, Format::of(scripted, json), first).await
        }
        PoolCommand::Status { names, json } => {
            let names = pools_named(names)?;
            if names.is_empty() && !json {
                println!("no pools");
            }
            let jobs = (names.into_iter())
                .map(|name| {
                    let names = vec![name.clone()];
                    (name, Command::Pool { pool: PoolCommand::Status { names, json } })
                })
                .collect();
            per_pools(env, jobs, Format::of(false, json), Vec::new()).await
        }
        PoolCommand::Iostat { .. } | PoolCommand::Service { .. } => {
            unreachable!("iostat and service run without a runtime")
        }
        PoolCommand::Events { ref name, follow: true, json, .. } => {
            let format = Format::of(false, json);
            let print = |reply: Reply| {
                use std::io::Write;
                print!("{}", pools::output::render(&reply, format));
                let _ = std::io::stdout().flush();
            };
            let pool = name.clone();
            control::forward_each(&pool, &Command::Pool { pool: command }, print)
                .unwrap_or_else(|| Err(pools::pool::not_served_events(&pool)))
        }
        PoolCommand::Events { ref name, json, .. } => {
            let pool = name.clone();
            let jobs = vec![(pool, Command::Pool { pool: command })];
            per_pools(env, jobs, Format::of(false, json), Vec::new()).await
        }
        PoolCommand::Get { ref name, scripted, json, .. } => {
            let pool = name.clone();
            let format = Format::of(scripted, json);
            per_pools(env, vec![(pool, Command::Pool { pool: command })], format, Vec::new()).await
        }
        PoolCommand::Scrub { ref name, .. }
        | PoolCommand::Add { ref name, .. }
        | PoolCommand::Remove { ref name, .. }
        | PoolCommand::Set { ref name, .. }
        | PoolCommand::Sync { ref name }
        | PoolCommand::Offline { ref name, .. }
        | PoolCommand::Online { ref name, .. }
        | PoolCommand::Clear { ref name, .. }
        | PoolCommand::Attach { ref name, .. }
        | PoolCommand::Replace { ref name, .. }
        | PoolCommand::Detach { ref name, .. }
        | PoolCommand::Inject { ref name, .. }
        | PoolCommand::Stats { ref name } => {
            let pool = name.clone();
            per_pools(env, vec![(pool, Command::Pool { pool: command })], Format::Text, Vec::new())
                .await
        }
    }
}

/// `sluice vol ...`.
async fn vol_command(env: &sluice_engine::rt::Env, command: VolCommand) -> anyhow::Result<()> {
    match command {
        VolCommand::List { pools, scripted, json } => {
            let names = if pools.is_empty() { pools::known_pools()? } else { pools };
            let jobs = (names.into_iter())
                .map(|name| {
                    let pools = vec![name.clone()];
                    (name, Command::Vol { vol: VolCommand::List { pools, scripted, json } })
                })
                .collect();
            per_pools(env, jobs, Format::of(scripted, json), Vec::new()).await
        }
        VolCommand::Get { ref spec, scripted, json, .. } => {
            let pool = pools::pool_of(spec).to_owned();
            let format = Format::of(scripted, json);
            per_pools(env, vec![(pool, Command::Vol { vol: command })], format, Vec::new()).await
        }
        VolCommand::Create {
            spec,
            size,
            block_size,
            dedup,
            sync,
            logbias,
            compression,
            sparse,
            encryption,
            keyformat,
            keylocation,
            key: _,
        } => {
            let pool = pools::pool_of(&spec).to_owned();
            let settings = pools::key::Encrypt::from_args(
                &encryption,
                keyformat.clone(),
                keylocation.clone(),
            )?;
            let key = match settings {
                Some(settings) => {
                    pools::key::check_new_volume_name(&spec)?;
                    Some(pools::key::read_key(&spec, settings.format, &settings.location, true)?)
                }
                None => None,
            };
            let command = VolCommand::Create {
                spec,
                size,
                block_size,
                dedup,
                sync,
                logbias,
                compression,
                sparse,
                encryption,
                keyformat,
                keylocation,
                key,
            };
            per_pools(env, vec![(pool, Command::Vol { vol: command })], Format::Text, Vec::new())
                .await
        }
        VolCommand::Set { ref spec, .. }
        | VolCommand::Destroy { ref spec, .. }
        | VolCommand::Rollback { ref spec, .. }
        | VolCommand::Promote { ref spec }
        | VolCommand::Rename { ref spec, .. }
        | VolCommand::Resize { ref spec, .. } => {
            let pool = pools::pool_of(spec).to_owned();
            per_pools(env, vec![(pool, Command::Vol { vol: command })], Format::Text, Vec::new())
                .await
        }
    }
}

/// `sluice key ...`: the key is read here (from the terminal or its file) before the command
/// goes to the pool; `load` and `change` first ask the pool how the volume's key is kept.
async fn key_command(env: &sluice_engine::rt::Env, command: KeyCommand) -> anyhow::Result<()> {
    let pool = pools::pool_of(match &command {
        KeyCommand::Load { spec, .. }
        | KeyCommand::Unload { spec, .. }
        | KeyCommand::Change { spec, .. } => spec,
    })
    .to_owned();
    let command = match command {
        KeyCommand::Load { spec, location, .. } => {
            let kept = key_settings(env, &pool, &spec).await?;
            let location = match location {
                Some(text) => pools::key::parse_keylocation(&text).map_err(anyhow::Error::msg)?,
                None => kept.location,
            };
            let key = pools::key::read_key(&spec, kept.format, &location, false)?;
            KeyCommand::Load { spec, location: None, key: Some(key) }
        }
        KeyCommand::Change { spec, keyformat, keylocation, .. } => {
            let kept = key_settings(env, &pool, &spec).await?;
            let format = match &keyformat {
                Some(text) => pools::key::parse_keyformat(text).map_err(anyhow::Error::msg)?,
                None => kept.format,
            };
            let location = match &keylocation {
                Some(text) => pools::key::parse_keylocation(text).map_err(anyhow::Error::msg)?,
                None => kept.location,
            };
            let key = pools::key::read_key(&spec, format, &location, true)?;
            let keyformat = Some(format.name().to_owned());
            let keylocation = Some(pools::key::location_text(&location));
            KeyCommand::Change { spec, keyformat, keylocation, key: Some(key) }
        }
        unload @ KeyCommand::Unload { .. } => unload,
    };
    per_pools(env, vec![(pool, Command::Key { key: command })], Format::Text, Vec::new()).await
}

/// How `spec`'s key is kept (its keyformat and keylocation), asked of its pool with `vol get`.
async fn key_settings(
    env: &sluice_engine::rt::Env,
    pool: &str,
    spec: &str,
) -> anyhow::Result<pools::key::KeptKey> {
    let properties = vec!["keyformat".to_owned(), "keylocation".to_owned()];
    let get = VolCommand::Get { spec: spec.to_owned(), properties, scripted: false, json: false };
    let mut replies = Vec::new();
    gather(env, pool, Command::Vol { vol: get }, &mut replies).await?;
    pools::key::KeptKey::from_replies(spec, &replies)
}

/// `sluice snapshot ...`.
async fn snapshot_command(
    env: &sluice_engine::rt::Env,
    command: SnapshotCommand,
) -> anyhow::Result<()> {
    let one =
        |pool: &str, command| vec![(pool.to_owned(), Command::Snapshot { snapshot: command })];
    match command {
        SnapshotCommand::List { targets, scripted, json } => {
            let targets = if targets.is_empty() { pools::known_pools()? } else { targets };
            let jobs = (targets.into_iter())
                .map(|target| {
                    let pool = pools::pool_of(&target).to_owned();
                    let targets = vec![target];
                    let list = SnapshotCommand::List { targets, scripted, json };
                    (pool, Command::Snapshot { snapshot: list })
                })
                .collect();
            per_pools(env, jobs, Format::of(scripted, json), Vec::new()).await
        }
        SnapshotCommand::Create { ref specs } => {
            let pool = pools::pool_of(&specs[0]).to_owned();
            per_pools(env, one(&pool, command), Format::Text, Vec::new()).await
        }
        SnapshotCommand::Destroy { ref spec } => {
            let pool = pools::pool_of(spec).to_owned();
            per_pools(env, one(&pool, command), Format::Text, Vec::new()).await
        }
    }
}

/// `inherited`: the sockets socket activation passed, taken at startup; only `serve` uses
/// them (or reports why they could not be taken).
fn run(
    cli: Cli,
    inherited: Result<sluice_nbd::listen::Inherited, sluice_nbd::listen::InheritError>,
) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            pool,
            dir,
            socket,
            listen,
            stdio,
            leaf_size,
            thick,
            sparse: _,
            volume_size,
            settings,
            metrics,
            cores,
            tls,
            event_hook,
        } => {
            let pairs = parse_settings(&settings)?;
            let tunables = Tunables::with(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())))?;
            let options = serve::ServeOptions {
                pool,
                dir,
                socket,
                listen,
                stdio,
                leaf_bytes: leaf_size,
                sparse: !thick,
                volume_bytes: volume_size,
                tunables,
                inherited: inherited.context("taking the sockets passed by socket activation")?,
                metrics,
                tls,
                event_hook,
            };
            let cores = match cores {
                0 => std::thread::available_parallelism().map_or(1, usize::from),
                n => n,
            };
            let idle_poll =
                std::time::Duration::from_micros(options.tunables.get(Tunable::CoresIdlePollUs));
            let cores = sluice_host::Cores::start_polling(cores, idle_poll)
                .context("starting the serving cores")?;
            let env = cores.env(random_seed());
            let policy = match options.tunables.choice(Tunable::VolumePlacement) {
                "home" => sluice_nbd::placement::Policy::Home,
                "spread" => sluice_nbd::placement::Policy::Spread,
                other => anyhow::bail!("volume.placement: no policy {other:?} (home or spread)"),
            };
            let placement =
                sluice_nbd::placement::Placement::cores(cores.handles().to_vec(), policy);
            cores.block_on(serve::serve(&env, options, placement))
        }
        // A loop of requests to the server and sleeps: no runtime needed.
        Command::Pool { pool: PoolCommand::Iostat { name, interval, count, latency, json } } => {
            let interval = interval
                .map(|s| {
                    anyhow::ensure!(
                        s > 0.0 && s <= 86_400.0,
                        "the iostat INTERVAL is in seconds, above 0 and at most 86400; got {s}"
                    );
                    Ok(std::time::Duration::from_secs_f64(s))
                })
                .transpose()?;
            anyhow::ensure!(count != Some(0), "the iostat COUNT must be at least 1");
            iostat::run(&iostat::Options { pool: name, interval, count, latency, json })
        }
        // Reads the pool cache only: the pool need not be open.
        Command::Pool { pool: PoolCommand::Service { name, install, unit_dir } } => {
            service::run(&name, install, unit_dir)
        }
        Command::Pool { pool } => on_runtime(|env| async move { pool_command(&env, pool).await }),
        Command::Vol { vol } => on_runtime(|env| async move { vol_command(&env, vol).await }),
        Command::Key { key } => on_runtime(|env| async move { key_command(&env, key).await }),
        Command::Snapshot { snapshot } => {
            on_runtime(|env| async move { snapshot_command(&env, snapshot).await })
        }
        Command::Send { spec, from, token, raw } => {
            use std::io::IsTerminal;
            if std::io::stdout().is_terminal() {
                anyhow::bail!(
                    "send writes a binary stream: redirect it to a file or pipe it to `sluice recv`"
                );
            }
            let what =
                pools::replication::SendWhat::new(spec.clone(), from.clone(), token.clone(), raw)?;
            let request = Command::Send { spec, from, token, raw };
            let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout());
            if let Some(forwarded) = control::forward_send(&what.pool(), &request, &mut out) {
                forwarded?;
                return Ok(std::io::Write::flush(&mut out)?);
            }
            on_runtime(
                |env| async move { pools::replication::send(&mut Ctx::local(&env), &what).await },
            )
        }
        Command::Recv { spec, resumable, abort: true, encrypt } => on_runtime(|env| async move {
            let pool = pools::pool_of(&spec).to_owned();
            let command = Command::Recv { spec, resumable, abort: true, encrypt };
            per_pools(&env, vec![(pool, command)], Format::Text, Vec::new()).await
        }),
        Command::Recv { spec, resumable, abort: false, encrypt } => on_runtime(|env| async move {
            let pool = pools::pool_of(&spec).to_owned();
            // What a receive says goes to standard error, as `send`'s does: a pipeline's
            // standard output is its data. A passphrase typed for the new volume comes from
            // the terminal (a piped standard input carries the stream).
            let said = |replies| eprint!("{}", pools::output::render_all(replies, Format::Text));
            let encrypt = encrypt.with_key(&spec)?;
            let request = Command::Recv {
                spec: spec.clone(),
                resumable,
                abort: false,
                encrypt: encrypt.clone(),
            };
            if let Some(forwarded) = control::forward_recv(&pool, &request, &mut std::io::stdin()) {
                return forwarded.map(said);
            }
            let mut ctx = Ctx::local(&env);
            let new_key = encrypt.new_key(&spec)?;
            let result = pools::replication::recv(&mut ctx, &spec, resumable, new_key).await;
            said(ctx.replies);
            result
        }),
        Command::Clone { snapshot, volume } => on_runtime(|env| async move {
            let pool = pools::pool_of(&snapshot).to_owned();
            let command = Command::Clone { snapshot, volume };
            per_pools(&env, vec![(pool, command)], Format::Text, Vec::new()).await
        }),
        Command::Tunables { settings } => tunables(&settings),
        Command::Bench { args } => anyhow::bail!(
            "the benchmarks are a binary of their own, so that the served one does not link \
             the simulator: run `sluice-bench {}` (built with `cargo build --release -p \
             sluice-bench`)",
            args.join(" ")
        ),
    }
}

fn parse_settings(settings: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    Ok(sluice_engine::tunables::parse_settings(settings)?)
}

fn tunables(settings: &[String]) -> anyhow::Result<()> {
    let pairs = parse_settings(settings)?;
    let values = Tunables::with(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())))?;
    for &tunable in Tunable::all() {
        let def = tunable.def();
        if settings.is_empty() {
            println!("{:<36} {:<14} {}", def.name, values.display(tunable), def.kind);
            println!("    {}", def.doc);
        } else {
            println!("{}={}", def.name, values.display(tunable));
        }
    }
    Ok(())
}
