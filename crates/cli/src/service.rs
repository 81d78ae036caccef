//! `sluice pool service POOL [--install]`: the per-pool drop-in of the `sluice@.service` unit
//! (contrib/systemd). The unit runs the server with `ProtectSystem=strict` and
//! `DevicePolicy=closed`, which make every path read-only and every device closed to it; this
//! drop-in opens what pool POOL needs and names the pool cache the server reads, so the unit
//! itself names no path of any pool.
//!
//! - File leaves: their directories, not the files (`ReadWritePaths=-DIR`), so that a leaf
//!   created beside the others by `pool replace` or `pool attach` while the pool is served can
//!   be opened without restarting the service (a service's mount namespace is fixed when it
//!   starts). The `-` lets a degraded pool start with a directory gone.
//! - Block-device leaves: `DeviceAllow=PATH rw`, and the device's unit in `Wants=` and
//!   `After=`, so that boot waits for a slow disk rather than importing the pool degraded.
//! - The pool cache's directory, writable and required (`RequiresMountsFor=`).
//!
//! The leaves come from the pool cache (`pools::cache`), as every command naming a pool finds
//! them. The server cannot rewrite the drop-in itself (its /etc is read-only, and it should
//! not widen its own sandbox): after adding a leaf outside these directories, or a disk, the
//! administrator runs the command again.

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::pools::cache;

/// Where unit files and their drop-ins go by default.
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// The drop-in's file name inside `sluice@POOL.service.d/`.
pub const DROP_IN_NAME: &str = "50-pool.conf";

/// The drop-in for pool `name`, whose leaves are `leaves`, with the pool cache at `cache`.
/// Paths with characters a unit file would read otherwise (space, quotes, `\\`, `%`, `$`,
/// `;`, control characters) are refused: systemd would split or expand them.
pub fn drop_in(name: &str, leaves: &[String], cache: &Path) -> anyhow::Result<String> {
    let cache_dir = unit_path(parent(cache, "the pool cache file")?)?;
    let mut dirs = BTreeSet::new();
    let mut devices = Vec::new();
    for leaf in leaves {
        let path = Path::new(leaf);
        let is_device = std::fs::metadata(path).map(|m| m.file_type().is_block_device());
        if is_device.unwrap_or(false) {
            devices.push(unit_path(path)?);
        } else {
            dirs.insert(unit_path(parent(path, &format!("leaf {leaf} of pool {name}"))?)?);
        }
    }
    let mut text = format!(
        "# Written by `sluice pool service {name} --install`: what pool {name} needs opened\n\
         # under the hardening of sluice@.service. Run it again after adding a leaf outside\n\
         # these directories or a disk, then `systemctl daemon-reload` and restart the service.\n\
         [Unit]\n"
    );
    let mounts: Vec<&str> =
        std::iter::once(cache_dir.as_str()).chain(dirs.iter().map(String::as_str)).collect();
    text.push_str(&format!("RequiresMountsFor={}\n", mounts.join(" ")));
    if !devices.is_empty() {
        let units: Vec<String> = devices.iter().map(|d| device_unit(d)).collect();
        text.push_str(&format!("Wants={}\nAfter={}\n", units.join(" "), units.join(" ")));
    }
    text.push_str("[Service]\n");
    text.push_str(&format!("Environment=SLUICE_CACHE_FILE={}\n", unit_path(cache)?));
    // No `-`: a cache directory that is not there should fail the start, loudly.
    text.push_str(&format!("ReadWritePaths={cache_dir}\n"));
    for dir in &dirs {
        text.push_str(&format!("ReadWritePaths=-{dir}\n"));
    }
    for device in &devices {
        text.push_str(&format!("DeviceAllow={device} rw\n"));
    }
    Ok(text)
}

/// The directory `path` is in; `what` names it in the error.
fn parent<'a>(path: &'a Path, what: &str) -> anyhow::Result<&'a Path> {
    path.parent().filter(|d| d.is_absolute()).with_context(|| {
        format!("{what} ({}) is not an absolute path; give it as one", path.display())
    })
}

/// The device unit systemd names for the device node at `path` (`systemd-escape --path
/// --suffix=device`): the path without its leading `/`, each `/` as `-`, letters, digits,
/// `:`, `_` and `.` kept (but not a leading `.`), every other byte as `\\xNN`.
fn device_unit(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    let mut out = String::new();
    for (i, byte) in trimmed.bytes().enumerate() {
        match byte {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.') => {
                out.push(b as char)
            }
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push_str(".device");
    out
}

/// `path` as a unit file may carry it unquoted.
fn unit_path(path: &Path) -> anyhow::Result<String> {
    let text = path.to_str().with_context(|| {
        format!("path {} is not UTF-8, which a unit file cannot name", path.display())
    })?;
    if let Some(bad) =
        text.chars().find(|c| matches!(c, ' ' | '"' | '\'' | '\\' | '%' | '$' | '\n' | '\t' | ';'))
    {
        anyhow::bail!(
            "path {text:?} holds {bad:?}, which a systemd unit file would read as syntax; \
             move the leaf or cache file to a path without it"
        );
    }
    Ok(text.to_owned())
}

/// `sluice pool service NAME [--install] [--unit-dir DIR]`: prints the drop-in, or writes it
/// to `DIR/sluice@NAME.service.d/50-pool.conf` (written beside and renamed, so a reader never
/// sees half of it).
pub fn run(name: &str, install: bool, unit_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let pools = cache::read_cache()?;
    let cache_file = cache::cache_path();
    let Some(leaves) = pools.get(name) else {
        anyhow::bail!(
            "no pool {name} in the pool cache {}: create or import it first (`sluice pool \
             import {name} -d DIR`), with SLUICE_CACHE_FILE as the service will have it",
            cache_file.display()
        );
    };
    let cache_file = std::path::absolute(&cache_file)
        .with_context(|| format!("resolving the cache file path {}", cache_file.display()))?;
    let text = drop_in(name, leaves, &cache_file)?;
    if !install {
        print!("{text}");
        return Ok(());
    }
    let dir = unit_dir
        .unwrap_or_else(|| PathBuf::from(UNIT_DIR))
        .join(format!("sluice@{name}.service.d"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(DROP_IN_NAME);
    let temporary = dir.join(format!(".{DROP_IN_NAME}.new"));
    std::fs::write(&temporary, &text)
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, &path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    println!(
        "wrote {}; now `systemctl daemon-reload` and `systemctl enable --now sluice@{name}`",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// File leaves grant their directories, once each; the cache's directory is granted
    /// and named.
    #[test]
    fn grants_leaf_directories_and_the_cache() {
        let leaves = vec!["/srv/a/l0".to_owned(), "/srv/a/l1".to_owned(), "/srv/b/l2".to_owned()];
        let text = drop_in("tank", &leaves, Path::new("/var/lib/sluice/pools")).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "[Unit]",
                "RequiresMountsFor=/var/lib/sluice /srv/a /srv/b",
                "[Service]",
                "Environment=SLUICE_CACHE_FILE=/var/lib/sluice/pools",
                "ReadWritePaths=/var/lib/sluice",
                "ReadWritePaths=-/srv/a",
                "ReadWritePaths=-/srv/b",
            ]
        );
    }

    /// Device units are named as `systemd-escape --path --suffix=device` names them.
    #[test]
    fn names_device_units_as_systemd_does() {
        assert_eq!(device_unit("/dev/sdb"), "dev-sdb.device");
        assert_eq!(
            device_unit("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"),
            "dev-disk-by\\x2did-wwn\\x2d0x5000c500a1b2c3d4.device"
        );
        assert_eq!(
            device_unit("/dev/disk/by-label/my.disk"),
            "dev-disk-by\\x2dlabel-my.disk.device"
        );
    }

    /// A path systemd would split or expand is refused, naming it.
    #[test]
    fn refuses_paths_a_unit_would_misread() {
        for bad in ["/srv/my disk/l0", "/srv/100%/l0", "/srv/$HOME/l0"] {
            let error = drop_in("tank", &[bad.to_owned()], Path::new("/c/pools")).unwrap_err();
            assert!(error.to_string().contains("unit file"), "{bad}: {error}");
        }
    }
}
