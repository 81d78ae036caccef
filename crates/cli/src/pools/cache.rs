//! The pool cache: which devices belong to which pool on this host, so that a command names a
//! pool and not its leaves. A file (`$SLUICE_CACHE_FILE`, default
//! `~/.local/state/sluice/pools`) of one line per pool, its name then its leaf paths,
//! tab-separated, replaced whole on every change (written beside and renamed). Only this
//! module reads or writes it; a lost cache costs nothing, as `pool import -d DIR` finds a
//! pool's leaves by their labels.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use sluice_engine::Pool;

/// Where the cache file is.
pub fn cache_path() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_CACHE_FILE") {
        return PathBuf::from(path);
    }
    let home =
        std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".local/state/sluice/pools")
}

/// Pools named in the cache file.
pub fn known_pools() -> anyhow::Result<Vec<String>> {
    Ok(read_cache()?.into_keys().collect())
}

/// The leaf paths of every known pool, by pool name.
pub fn read_cache() -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let path = cache_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(e).with_context(|| format!("reading the pool cache {}", path.display()))
        }
    };
    Ok(parse(&text))
}

/// The cache file's text as pools and their leaves.
fn parse(text: &str) -> BTreeMap<String, Vec<String>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let name = fields.next().filter(|n| !n.is_empty())?.to_owned();
            Some((name, fields.map(str::to_owned).collect()))
        })
        .collect()
}

fn write_cache(cache: &BTreeMap<String, Vec<String>>) -> anyhow::Result<()> {
    let path = cache_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text: String =
        cache.iter().map(|(name, paths)| format!("{name}\t{}\n", paths.join("\t"))).collect();
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, text).with_context(|| format!("writing {}", temp.display()))?;
    std::fs::rename(&temp, &path).with_context(|| format!("replacing {}", path.display()))
}

/// Records `pool` with the leaves it has now.
pub fn remember(pool: &Pool) -> anyhow::Result<()> {
    let mut cache = read_cache()?;
    // Available hot spares too: import finds them by their labels among these.
    let tree = pool.tree();
    let spares = tree.spares.iter().filter(|s| s.device.is_some()).map(|s| s.path.clone());
    cache.insert(
        pool.name().to_owned(),
        (pool.leaves().iter().filter(|l| l.present).map(|l| l.path.clone()))
            .chain(spares)
            .collect(),
    );
    write_cache(&cache)
}

/// Drops the leaves of a new pool from the cache entries of other pools (a leaf of an imported
/// pool taken with --force): else the old pool would keep pointing at a leaf that is no longer
/// its own, and one left with no leaf could not even be exported.
pub fn forget_taken_leaves(pool: &Pool) -> anyhow::Result<()> {
    let taken: Vec<PathBuf> =
        pool.leaves().iter().filter_map(|l| std::fs::canonicalize(&l.path).ok()).collect();
    let mut cache = read_cache()?;
    let mut changed = false;
    for (other, paths) in cache.iter_mut() {
        let before = paths.len();
        paths.retain(|p| std::fs::canonicalize(p).map_or(true, |p| !taken.contains(&p)));
        if paths.len() != before {
            changed = true;
            let left = if paths.is_empty() {
                "it has no leaf left and is forgotten".to_owned()
            } else {
                format!("it keeps {}", paths.join(", "))
            };
            eprintln!("sluice: pool {other} lost leaves to pool {}; {left}", pool.name());
        }
    }
    if changed {
        cache.retain(|_, paths| !paths.is_empty());
        write_cache(&cache)?;
    }
    Ok(())
}

/// Drops `name` from the cache (export, destroy).
pub fn forget(name: &str) -> anyhow::Result<()> {
    let mut cache = read_cache()?;
    cache.remove(name);
    write_cache(&cache)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line per pool, its name then its leaves; blank lines are no pool.
    #[test]
    fn cache_lines_parse() {
        let cache = parse("tank\t/d/a\t/d/b\n\nsolo\t/d/c\n");
        assert_eq!(cache.len(), 2);
        assert_eq!(cache["tank"], ["/d/a", "/d/b"]);
        assert_eq!(cache["solo"], ["/d/c"]);
    }
}
