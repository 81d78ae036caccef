//! Event hooks (ZFS's ZED and its zedlets): `sluice serve --event-hook DIR` runs, for each of
//! the pool's events (crate::events), every executable in DIR whose name starts with the
//! event's subclass or with `all`, followed by anything but a letter (`statechange-notify.sh`,
//! `all-syslog.sh`): ZED's rule, so its zedlets' names carry over.
//!
//! A hook runs only if it is a regular file (symbolic links are followed), executable by its
//! owner, owned by root and writable by no one else: whoever may change it could run anything
//! as the server. Dot files are skipped. The directory is read again for each event, so
//! hooks added or removed take effect at once.
//!
//! Each hook gets the event in its environment and nothing else of the server's but `TZ` and
//! `SLUICE_CACHE_FILE`:
//! `ZEVENT_EID`, `ZEVENT_CLASS`, `ZEVENT_SUBCLASS`, `ZEVENT_TIME` (RFC 3339, UTC),
//! `ZEVENT_TIME_SECS`, `ZEVENT_TIME_NSECS`, `ZEVENT_POOL`, `ZEVENT_VDEV_PATH` (when the event
//! is about a leaf) and each detail as `ZEVENT_` and its name in capitals (`ZEVENT_STATE`,
//! `ZEVENT_ERRORS`), with `PATH`, `SLUICE` (this binary) and `SLUICE_HOOK_DIR`. Its standard
//! output and error go to the server's log, a line at a time, naming the hook and the event.
//!
//! Hooks run concurrently, at most [`HOOKS_AT_ONCE`] (ZED's `-j` default is 16; a storage
//! server on a small machine keeps fewer), in event order as slots free. A hook still running
//! after [`HOOK_TIMEOUT`] is killed and the log says so: ZED waits forever, and one hook stuck
//! on a dead mail server would hold a slot for good.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sluice_engine::fm::Event;
use sluice_engine::Store;
use tokio::io::AsyncBufReadExt;

use crate::events::EventView;

/// The most hooks running at once.
pub const HOOKS_AT_ONCE: usize = 8;

/// How long a hook may run before it is killed.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// `dir` as an absolute path, if it is a directory (checked before the pool is opened).
pub fn check_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let absolute = dir.canonicalize().map_err(|e| {
        anyhow::anyhow!("--event-hook {}: {e} (a directory of hook programs)", dir.display())
    })?;
    if !absolute.is_dir() {
        anyhow::bail!("--event-hook {}: not a directory", dir.display());
    }
    Ok(absolute)
}

/// Runs the hooks in `dir` for every event of the store's pool, from those kept when it
/// starts, until the store is dropped.
pub fn spawn(store: &Arc<Store>, dir: &Path) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let dir = check_dir(dir)?;
    let binary = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sluice"));
    let slots = Arc::new(tokio::sync::Semaphore::new(HOOKS_AT_ONCE));
    let (kept, new) = store.pool().events().follow();
    Ok(tokio::spawn(async move {
        let mut events = futures::stream::iter(kept).chain(new);
        while let Some(event) = events.next().await {
            for hook in hooks_for(&dir, &event) {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
                let environment = environment(&event, &binary, &dir);
                let eid = event.eid;
                tokio::spawn(async move {
                    run(&hook, eid, environment).await;
                    drop(slot);
                });
            }
        }
    }))
}

/// The hooks in `dir` that `event` runs, by name, in name order.
fn hooks_for(dir: &Path, event: &Event) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!("sluice: event hooks: cannot read {}", dir.display());
        return Vec::new();
    };
    let subclass = event.class.subclass();
    let mut hooks: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && (matches(&name, subclass) || matches(&name, "all"))
        })
        .map(|entry| entry.path())
        .filter(|path| may_run(path))
        .collect();
    hooks.sort();
    hooks
}

/// Whether a hook named `name` is for `prefix`: it starts with it, and the next character is
/// not a letter (`scrub_finish-notify.sh` is for `scrub_finish`, not for `scrub`).
fn matches(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphabetic()))
}

/// Whether the file at `path` may run as a hook (see the module doc); says why not in the log.
fn may_run(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else { return false };
    let refuse = |why: &str| {
        eprintln!("sluice: event hook {} not run: {why}", path.display());
        false
    };
    if !meta.is_file() {
        return false;
    }
    if meta.mode() & 0o100 == 0 {
        return refuse("not executable by its owner");
    }
    if meta.uid() != 0 {
        return refuse("not owned by root (chown root)");
    }
    if meta.mode() & 0o022 != 0 {
        return refuse("writable by group or others (chmod go-w)");
    }
    true
}

/// The hook's environment for `event` (see the module doc).
fn environment(event: &Event, binary: &Path, dir: &Path) -> Vec<(String, String)> {
    let view = EventView::of(event);
    let mut vars = vec![
        ("PATH".to_owned(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ("SLUICE".to_owned(), binary.display().to_string()),
        ("SLUICE_HOOK_DIR".to_owned(), dir.display().to_string()),
        ("ZEVENT_EID".to_owned(), view.eid.to_string()),
        ("ZEVENT_CLASS".to_owned(), view.class.clone()),
        ("ZEVENT_SUBCLASS".to_owned(), view.subclass.clone()),
        ("ZEVENT_TIME".to_owned(), view.time.clone()),
        ("ZEVENT_TIME_SECS".to_owned(), (view.unix_nanos / 1_000_000_000).to_string()),
        ("ZEVENT_TIME_NSECS".to_owned(), (view.unix_nanos % 1_000_000_000).to_string()),
        ("ZEVENT_POOL".to_owned(), view.pool.clone()),
    ];
    if let Some(vdev) = &view.vdev {
        vars.push(("ZEVENT_VDEV_PATH".to_owned(), vdev.clone()));
    }
    for (name, value) in &view.details {
        let name: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        vars.push((format!("ZEVENT_{}", name.to_ascii_uppercase()), value.clone()));
    }
    // The time zone, and where the server's pools are known (so that `$SLUICE pool status`
    // in a hook finds the pool's control socket).
    for kept in ["TZ", "SLUICE_CACHE_FILE"] {
        if let Ok(value) = std::env::var(kept) {
            vars.push((kept.to_owned(), value));
        }
    }
    vars
}

/// Runs one hook to its end or its timeout, its output to the log.
async fn run(hook: &Path, eid: u64, environment: Vec<(String, String)>) {
    let name = hook.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let child = tokio::process::Command::new(hook)
        .env_clear()
        .envs(environment)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => {
            eprintln!("sluice: event hook {name} (event {eid}) did not start: {error}");
            return;
        }
    };
    let log = |stream: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
        let name = name.clone();
        async move {
            let Some(stream) = stream else { return };
            let mut lines = tokio::io::BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("sluice: event hook {name} (event {eid}): {line}");
            }
        }
    };
    let out = log(child.stdout.take().map(|s| Box::new(s) as _));
    let err = log(child.stderr.take().map(|s| Box::new(s) as _));
    let waited = tokio::time::timeout(HOOK_TIMEOUT, async {
        let (_, _, status) = tokio::join!(out, err, child.wait());
        status
    })
    .await;
    match waited {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(status)) => eprintln!("sluice: event hook {name} (event {eid}) failed: {status}"),
        Ok(Err(error)) => eprintln!("sluice: event hook {name} (event {eid}): {error}"),
        Err(_) => {
            let _ = child.kill().await;
            eprintln!(
                "sluice: event hook {name} (event {eid}) killed after {} s",
                HOOK_TIMEOUT.as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_are_matched_by_zeds_rule() {
        assert!(matches("statechange-notify.sh", "statechange"));
        assert!(matches("statechange", "statechange"));
        assert!(matches("all-syslog.sh", "all"));
        assert!(matches("scrub_finish-notify.sh", "scrub_finish"));
        assert!(!matches("scrub_finish-notify.sh", "scrub_start"));
        assert!(!matches("allsyslog.sh", "all"));
        assert!(!matches("io-notify.sh", "statechange"));
    }
}
