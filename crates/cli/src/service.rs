//! `sluice pool service POOL [--install]`: the per-pool drop-in of the `sluice@.service` unit
//! (contrib/systemd). The unit runs the server with `ProtectSystem=strict`, which makes every
//! path read-only for it; this drop-in opens the paths pool POOL needs, and names the pool
//! cache the server reads, so the unit itself names no path of any pool.
//!
//! It grants directories, not files: the directory of each file leaf, so that a leaf created
//! beside the others by `pool replace` or `pool attach` while the pool is served can be opened
//! without restarting the service (a service's mount namespace is fixed when it starts), and
//! the cache file's directory. Block-device leaves need no entry: `ProtectSystem` leaves /dev
//! alone, and the unit does not close the device policy, so a disk swapped in can be opened.
//! The leaves come from the pool cache (`pools::cache`), as every command naming a pool finds
//! them.

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
/// Paths with characters a unit file would read otherwise (space, `"`, `\`, `%`, `$`, a
/// newline) are refused: systemd would split or expand them.
pub fn drop_in(name: &str, leaves: &[String], cache: &Path) -> anyhow::Result<String> {
    let mut writable = BTreeSet::new();
    let cache_dir = cache.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("/"));
    writable.insert(cache_dir.to_path_buf());
    let mut devices = Vec::new();
    for leaf in leaves {
        let path = Path::new(leaf);
        let is_device = std::fs::metadata(path).map(|m| m.file_type().is_block_device());
        if is_device.unwrap_or(false) {
            devices.push(leaf.clone());
            continue;
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).with_context(|| {
            format!("leaf {leaf} of pool {name} is not an absolute path; re-import the pool")
        })?;
        writable.insert(dir.to_path_buf());
    }
    let mut text = format!(
        "# Written by `sluice pool service {name} --install`: what pool {name} needs opened\n\
         # under the hardening of sluice@.service. Run it again after adding a leaf outside\n\
         # these directories, then `systemctl daemon-reload` and restart the service.\n\
         [Service]\n"
    );
    text.push_str(&format!("Environment=SLUICE_CACHE_FILE={}\n", unit_path(cache)?));
    for dir in &writable {
        text.push_str(&format!("ReadWritePaths={}\n", unit_path(dir)?));
    }
    for device in &devices {
        text.push_str(&format!(
            "# block device leaf, open through /dev: {}\n",
            unit_path(Path::new(device))?
        ));
    }
    Ok(text)
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
                "[Service]",
                "Environment=SLUICE_CACHE_FILE=/var/lib/sluice/pools",
                "ReadWritePaths=/srv/a",
                "ReadWritePaths=/srv/b",
                "ReadWritePaths=/var/lib/sluice",
            ]
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
