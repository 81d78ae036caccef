//! The `sluice pool` and `sluice vol` commands as a person runs them, on sparse files in a
//! temporary directory: create, volumes, status, scrub, export, import by searching a
//! directory, refusal while another process holds a leaf, and destroy.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use sluice_engine::device::{FileDevice, FileDeviceOptions};

fn sluice(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("SLUICE_CACHE_FILE", cache)
        .output()
        .unwrap()
}

fn ok(cache: &Path, args: &[&str]) -> String {
    let out = sluice(cache, args);
    assert!(
        out.status.success(),
        "sluice {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(cache: &Path, args: &[&str]) -> String {
    let out = sluice(cache, args);
    assert!(!out.status.success(), "sluice {args:?} should have failed");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn pool_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let leaves = dir.path().join("leaves");
    std::fs::create_dir(&leaves).unwrap();
    let (a, b) = (leaves.join("a"), leaves.join("b"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());

    ok(&cache, &["pool", "create", "tank", "mirror", a, b, "--size", "64M"]);
    ok(&cache, &["vol", "create", "tank/vm1", "--size", "16M", "--block-size", "4K"]);
    assert!(ok(&cache, &["vol", "list"]).contains("tank/vm1"));
    let status = ok(&cache, &["pool", "status", "tank"]);
    assert!(
        status.contains("state: ONLINE") && status.contains(a) && status.contains("mirror-0"),
        "{status}"
    );
    assert!(ok(&cache, &["pool", "scrub", "tank"]).contains("0 bad copies"));

    // A leaf held by another process: the command is refused and names the holder.
    let held = FileDevice::open(
        Path::new(a),
        &FileDeviceOptions { exclusive: true, ..Default::default() },
    )
    .unwrap();
    let error = fails(&cache, &["pool", "status", "tank"]);
    assert!(
        error.contains("in use by process") && error.contains(&std::process::id().to_string()),
        "{error}"
    );
    drop(held);

    ok(&cache, &["pool", "export", "tank"]);
    assert!(fails(&cache, &["pool", "status", "tank"]).contains("sluice pool import tank"));
    assert!(ok(&cache, &["pool", "import", "tank", "-d", leaves.to_str().unwrap()])
        .contains("imported pool tank"));
    assert!(ok(&cache, &["vol", "list", "tank"]).contains("tank/vm1"));

    // One leaf gone: the import is degraded and says which.
    ok(&cache, &["pool", "export", "tank"]);
    std::fs::rename(b, dir.path().join("b.away")).unwrap();
    assert!(ok(&cache, &["pool", "import", "tank", "-d", leaves.to_str().unwrap()])
        .contains("DEGRADED: missing"));
    assert!(ok(&cache, &["pool", "status", "tank"]).contains("MISSING"));
    ok(&cache, &["pool", "export", "tank"]);
    std::fs::rename(dir.path().join("b.away"), b).unwrap();
    ok(&cache, &["pool", "import", "tank", "-d", leaves.to_str().unwrap()]);

    // Bad input gets a clear error.
    assert!(
        fails(&cache, &["vol", "create", "tank/vm1", "--size", "16M"]).contains("already exists")
    );
    assert!(fails(&cache, &["vol", "create", "tank/x", "--size", "10000"])
        .contains("multiple of the block size"));
    assert!(fails(&cache, &["vol", "create", "novolume", "--size", "1M"]).contains("POOL/VOLUME"));
    assert!(fails(&cache, &["pool", "create", "tank", a]).contains("already exists"));

    ok(&cache, &["vol", "resize", "tank/vm1", "--size", "32M"]);
    assert!(ok(&cache, &["vol", "list", "tank"]).contains("32.0M"));
    ok(&cache, &["vol", "destroy", "tank/vm1"]);
    assert!(!ok(&cache, &["vol", "list", "tank"]).contains("vm1"));
    assert!(fails(&cache, &["vol", "destroy", "tank/vm1"]).contains("does not exist"));

    ok(&cache, &["pool", "destroy", "tank"]);
    assert!(fails(&cache, &["pool", "import", "tank", "-d", leaves.to_str().unwrap()])
        .contains("no pool named tank"));

    // A separate log device is listed under "logs"; a pool of log devices alone is refused.
    let (c, d) = (leaves.join("c"), leaves.join("d"));
    let (c, d) = (c.to_str().unwrap(), d.to_str().unwrap());
    ok(&cache, &["pool", "create", "fast", "mirror", a, b, "log", c, "--size", "64M"]);
    let status = ok(&cache, &["pool", "status", "fast"]);
    let logs_at = status.find("logs").expect(&status);
    assert!(status[logs_at..].contains(c) && !status[logs_at..].contains(a), "{status}");
    ok(&cache, &["pool", "destroy", "fast"]);
    assert!(fails(&cache, &["pool", "create", "nodata", "log", d, "--size", "64M"])
        .contains("data vdev"));
}

/// `sluice serve POOL --set NAME=VALUE` opens the named pool with those tunables (it once
/// opened it with the defaults and dropped them silently); `pool status` reaches the server
/// over its control socket and shows the block cache at the size that was set.
#[test]
fn serve_applies_tunables_to_a_named_pool() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let leaf = dir.path().join("leaf");
    let leaf = leaf.to_str().unwrap();
    ok(&cache, &["pool", "create", "tank", leaf, "--size", "64M"]);
    let socket = dir.path().join("nbd.sock");
    let mut server = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "tank", "--listen", "none", "--set", "cache.bytes_max=3M"])
        .arg("--socket")
        .arg(&socket)
        .arg("--dir")
        .arg(dir.path())
        .env("SLUICE_CACHE_FILE", &cache)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = String::new();
    for _ in 0..100 {
        if socket.exists() {
            status = ok(&cache, &["pool", "status", "tank"]);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let stopped = Command::new("kill").arg(server.id().to_string()).status().unwrap();
    let exited = server.wait().unwrap();
    assert!(stopped.success() && exited.success(), "the server did not stop cleanly: {exited}");
    assert!(status.contains("served by sluice serve"), "{status}");
    assert!(status.contains("of 3.0M held"), "the cache size set was not applied: {status}");
}
