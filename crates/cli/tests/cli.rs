//! The `sluice pool` and `sluice vol` commands as a person runs them, on sparse files in a
//! temporary directory: create, volumes, status, scrub, export, import by searching a
//! directory, refusal while another process holds a leaf, and destroy; `pool create` refusing
//! leaves that hold something unless forced, leaf locks on a filesystem that refuses them, and
//! `serve --stdio` on a socket and on pipes.

// Test helpers unwrap freely: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use sluice_engine::{FileDevice, FileDeviceOptions};

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

fn sluice_with(cache: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command.args(args).env("SLUICE_CACHE_FILE", cache);
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn fails(cache: &Path, args: &[&str]) -> String {
    let out = sluice(cache, args);
    assert!(!out.status.success(), "sluice {args:?} should have failed");
    String::from_utf8(out.stderr).unwrap()
}

/// `sluice serve tank` on a socket in `dir`, with `extra` arguments, once its socket is there
/// (or after 10 s, when the commands that follow fail and say why).
fn serve(dir: &Path, cache: &Path, extra: &[&str]) -> std::process::Child {
    let socket = dir.join("nbd.sock");
    let server = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "tank", "--listen", "none"])
        .args(extra)
        .arg("--socket")
        .arg(&socket)
        .arg("--dir")
        .arg(dir)
        .env("SLUICE_CACHE_FILE", cache)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    server
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
    let scripted = ok(&cache, &["vol", "list", "-H"]);
    // name, size, used, avail, refer, reserv, block, compression, ratio, dedup, sync, logbias,
    // keystatus
    let fields: Vec<&str> = scripted.trim().split('\t').collect();
    assert_eq!(fields.len(), 13, "{scripted}");
    assert_eq!(fields[12], "-", "not encrypted: {scripted}");
    assert_eq!((fields[0], fields[1], fields[4]), ("tank/vm1", "16777216", "0"), "{scripted}");
    // Thick by default: the whole size and the indirect blocks above it are set aside, and
    // count as used.
    let reserved: u64 = fields[5].parse().unwrap();
    assert!(reserved > 16 << 20 && fields[2] == fields[5], "{scripted}");
    assert_eq!((fields[6], fields[7], fields[8]), ("4096", "lz4", "1.00x"), "{scripted}");
    // --sparse makes a thin one; a thick one the pool cannot set aside is refused, and says so.
    ok(&cache, &["vol", "create", "tank/thin", "--size", "1G", "--sparse"]);
    let refused = fails(&cache, &["vol", "create", "tank/thick", "--size", "1G"]);
    assert!(refused.contains("set aside") && refused.contains("--sparse"), "{refused}");
    ok(&cache, &["vol", "destroy", "tank/thin"]);
    let volume: serde_json::Value =
        serde_json::from_str(ok(&cache, &["vol", "list", "--json", "tank"]).trim()).unwrap();
    assert_eq!(
        (volume["name"].as_str(), volume["size_bytes"].as_u64()),
        (Some("tank/vm1"), Some(16 << 20))
    );
    // New volumes are compressed with lz4, as in OpenZFS; the property can be changed, and a
    // bad value is refused with the ones that exist.
    assert_eq!(volume["compression"].as_str(), Some("lz4"));
    ok(&cache, &["vol", "set", "tank/vm1", "compression=zstd-7"]);
    assert!(ok(&cache, &["vol", "list", "-H"]).contains("\tzstd-7\t"));
    let refused = fails(&cache, &["vol", "set", "tank/vm1", "compression=gzip"]);
    assert!(refused.contains("zstd-1 to zstd-19"), "{refused}");
    // Rename within the pool (by full name or the new name alone); vol get names properties in
    // the order asked, and refuses unknown ones with the list.
    ok(&cache, &["vol", "rename", "tank/vm1", "tank/web"]);
    ok(&cache, &["vol", "rename", "tank/web", "vm1"]);
    assert!(fails(&cache, &["vol", "rename", "tank/vm1", "other/vm1"]).contains("within its pool"));
    let got = ok(&cache, &["vol", "get", "tank/vm1", "compression", "volsize", "-H"]);
    assert_eq!(got, "tank/vm1\tcompression\tzstd-7\ntank/vm1\tvolsize\t16777216\n", "{got:?}");
    assert!(fails(&cache, &["vol", "get", "tank/vm1", "colour"]).contains("refreservation"));
    let status = ok(&cache, &["pool", "status", "tank"]);
    assert!(
        status.contains("state: ONLINE") && status.contains(a) && status.contains("mirror-0"),
        "{status}"
    );
    assert!(ok(&cache, &["pool", "scrub", "tank"]).contains("0 bad copies"));
    // Leaf administration: a temporary offline needs the serving process; a lasting one, online
    // and clear work on the pool opened for the command; an unknown leaf is named with the
    // real ones.
    assert!(fails(&cache, &["pool", "offline", "-t", "tank", "b"]).contains("not being served"));
    assert!(ok(&cache, &["pool", "offline", "tank", "b"]).contains("is offline until"));
    let status = ok(&cache, &["pool", "status", "tank"]);
    assert!(status.contains("OFFLINE") && status.contains("state: DEGRADED"), "{status}");
    assert!(ok(&cache, &["pool", "online", "tank", "b"]).contains("is online"));
    let status = ok(&cache, &["pool", "status", "tank"]);
    assert!(!status.contains("OFFLINE"), "{status}");
    // Attach a third leaf (a missing file is made at the existing leaf's size), detach it.
    let e = leaves.join("e");
    let e = e.to_str().unwrap();
    assert!(ok(&cache, &["pool", "attach", "tank", "a", e]).contains("attached beside"));
    assert!(ok(&cache, &["pool", "status", "tank"]).contains(e));
    assert_eq!(std::fs::metadata(e).unwrap().len(), std::fs::metadata(a).unwrap().len());
    let again = fails(&cache, &["pool", "attach", "tank", "a", e]);
    assert!(again.contains("already one of its leaves"), "{again}");
    assert!(ok(&cache, &["pool", "detach", "tank", e]).contains("labels are erased"));
    assert!(!ok(&cache, &["pool", "status", "tank"]).contains(e));
    std::fs::remove_file(e).unwrap();
    assert!(ok(&cache, &["pool", "clear", "tank"]).contains("cleared the errors of"));
    let unknown = fails(&cache, &["pool", "online", "tank", "zz"]);
    assert!(unknown.contains("no leaf zz") && unknown.contains(a), "{unknown}");
    assert!(fails(&cache, &["pool", "scrub", "-s", "tank"]).contains("no scrub in progress"));
    let list = ok(&cache, &["pool", "list"]);
    assert!(list.starts_with("NAME") && list.contains("tank") && list.contains("ONLINE"), "{list}");
    let scripted = ok(&cache, &["pool", "list", "-H", "tank"]);
    let fields: Vec<&str> = scripted.trim_end().split('\t').collect();
    assert_eq!(fields.len(), 5, "{scripted}");
    assert_eq!((fields[0], fields[4]), ("tank", "ONLINE"));
    let [size, alloc, free] = [1, 2, 3].map(|i| fields[i].parse::<u64>().unwrap());
    assert_eq!(size, alloc + free, "{scripted}");
    // JSON, one object per pool per line.
    let listed: serde_json::Value =
        serde_json::from_str(ok(&cache, &["pool", "list", "--json", "tank"]).trim()).unwrap();
    assert_eq!(listed["name"], "tank");
    assert_eq!(listed["size_bytes"].as_u64(), Some(size));
    let status: serde_json::Value =
        serde_json::from_str(ok(&cache, &["pool", "status", "--json", "tank"]).trim()).unwrap();
    assert_eq!(status["state"], "ONLINE", "{status}");
    assert!(status["status"].is_null(), "{status}");
    let members = status["vdevs"][0]["leaves"].as_array().unwrap();
    assert_eq!(status["vdevs"][0]["kind"], "mirror");
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|l| l["state"] == "ONLINE" && l["write_errors"] == 0), "{status}");
    assert_eq!(status["scan"]["phase"], "finished", "the last scan, kept by the pool: {status}");

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
    // The destroyed pool's leaves still hold its uberblocks: reusing them takes --force, as
    // with `zpool create`.
    let (c, d) = (leaves.join("c"), leaves.join("d"));
    let (c, d) = (c.to_str().unwrap(), d.to_str().unwrap());
    let error =
        fails(&cache, &["pool", "create", "fast", "mirror", a, b, "log", c, "--size", "64M"]);
    assert!(error.contains(&format!("{a} holds a destroyed sluice pool")), "{error}");
    assert!(!Path::new(c).exists(), "the refused create left the file it made: {c}");
    ok(&cache, &["pool", "create", "fast", "-f", "mirror", a, b, "log", c, "--size", "64M"]);
    let status = ok(&cache, &["pool", "status", "fast"]);
    let logs_at = status.find("logs").expect(&status);
    assert!(status[logs_at..].contains(c) && !status[logs_at..].contains(a), "{status}");
    ok(&cache, &["pool", "destroy", "fast"]);
    assert!(fails(&cache, &["pool", "create", "nodata", "log", d, "--size", "64M"])
        .contains("data vdev"));
}

/// `pool create` knows ZFS's vdev words: one sluice does not build is refused by name, never
/// taken for a file, and a leaf path that is not absolute is refused with the path it meant
/// (`zpool create rz raidz2 a b c d` once made a four-leaf stripe with a file named raidz2).
/// `pool get` and `pool set`, `vol set snapshot.schedule` and `snapshot list`'s AUTO column,
/// on a pool that is not served: setting the first property lists the pool_properties
/// feature; a finished scrub is what scrub.last and scrub.next say; everything survives the
/// pool being opened again; bad values are refused, saying what is allowed.
#[test]
fn pool_properties_and_snapshot_schedules() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    ok(&cache, &["pool", "create", "tank", "mirror", a, b, "--size", "64M", "--sparse"]);
    ok(&cache, &["vol", "create", "tank/vm1", "--size", "8M"]);
    let get = |names: &[&str]| -> Vec<(String, String)> {
        let mut args = vec!["pool", "get", "tank", "-H"];
        args.extend_from_slice(names);
        (ok(&cache, &args).lines())
            .map(|line| {
                let fields: Vec<&str> = line.split('\t').collect();
                assert_eq!((fields.len(), fields[0]), (3, "tank"), "{line}");
                (fields[1].to_owned(), fields[2].to_owned())
            })
            .collect()
    };
    let value = |name: &str| get(&[name])[0].1.clone();
    assert_eq!(get(&[]).len(), 11);
    assert_eq!(value("scrub.interval"), "30d");
    assert_eq!((value("scrub.last"), value("features")), ("-".into(), "lz4_indirect".into()));
    ok(&cache, &["pool", "set", "tank", "scrub.interval=2w"]);
    assert_eq!(
        (value("scrub.interval"), value("features")),
        ("2w".into(), "pool_properties,lz4_indirect".into())
    );
    for (bad, says) in [
        ("scrub.interval=10", "with a unit"),
        ("scrub.interval=30s", "out of range"),
        ("size=1G", "read only"),
        ("autoreplace=maybe", "on or off"),
        ("bogus=1", "does not exist"),
    ] {
        let error = fails(&cache, &["pool", "set", "tank", bad]);
        assert!(error.contains(says), "{bad}: {error}");
    }
    assert!(fails(&cache, &["pool", "get", "tank", "bogus"]).contains("does not exist"));
    ok(&cache, &["pool", "scrub", "tank"]);
    let last = value("scrub.last");
    assert!(last.ends_with(" UTC"), "{last}");
    assert_ne!(value("scrub.next"), last, "the next is two weeks after");
    ok(&cache, &["vol", "set", "tank/vm1", "snapshot.schedule=hourly:24,daily:30,weekly:8"]);
    let schedule = ok(&cache, &["vol", "get", "tank/vm1", "snapshot.schedule", "-H"]);
    assert!(schedule.contains("hourly:24,daily:30,weekly:8"), "{schedule}");
    for (bad, says) in [
        ("snapshot.schedule=hourly", "PERIOD:KEEP"),
        ("snapshot.schedule=yearly:2", "no period"),
        ("snapshot.schedule=daily:0", "1 to 1000"),
        ("snapshot.schedule=daily:2,daily:3", "twice"),
    ] {
        let error = fails(&cache, &["vol", "set", "tank/vm1", bad]);
        assert!(error.contains(says), "{bad}: {error}");
    }
    ok(&cache, &["snapshot", "create", "tank/vm1@mine"]);
    let listed = ok(&cache, &["snapshot", "list", "tank", "-H"]);
    assert!(listed.trim().ends_with("\tno"), "a person's snapshot is not the schedule's: {listed}");
    assert!(ok(&cache, &["snapshot", "list", "tank"]).lines().next().unwrap().ends_with("AUTO"));
    // Opened again (each command above opened and exported the pool): all of it is there.
    assert_eq!(value("scrub.last"), last);
    assert_eq!(value("scrub.interval"), "2w");
    ok(&cache, &["vol", "set", "tank/vm1", "snapshot.schedule=none"]);
    let schedule = ok(&cache, &["vol", "get", "tank/vm1", "snapshot.schedule", "-H"]);
    assert!(schedule.contains("none"), "{schedule}");
}

#[test]
fn vdev_words_and_relative_leaf_paths_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    // As the command sees its directory (a tempdir behind a symlink resolves).
    let dir = tmp.path().canonicalize().unwrap();
    let cache = dir.as_path().join("pools.cache");
    let in_dir = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .env("SLUICE_CACHE_FILE", &cache)
            .current_dir(dir.as_path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "sluice {args:?} should have failed");
        String::from_utf8(out.stderr).unwrap()
    };
    let a = dir.as_path().join("a");
    let a = a.to_str().unwrap();
    let error =
        in_dir(&["pool", "create", "rz", "raidz2", a, "/tmp/sluice-no-such-b", "--size", "64M"]);
    assert!(error.contains("raidz2 needs from 4 to 64 children, not 2"), "{error}");
    for word in ["draid2:4d:1s", "cache", "special", "dedup"] {
        let error = in_dir(&["pool", "create", "rz", word, a, "b", "--size", "64M"]);
        assert!(error.contains(&format!("`{word}` is a ZFS vdev type")), "{word}: {error}");
        assert!(!Path::new(word).exists() && !dir.as_path().join(word).exists());
    }
    // Hot spares are single leaves, listed once.
    let b = dir.as_path().join("b");
    let b = b.to_str().unwrap();
    let error = in_dir(&["pool", "create", "rz", "spare", "mirror", a, b, "--size", "64M"]);
    assert!(error.contains("hot spares are single leaves"), "{error}");
    let error = in_dir(&["pool", "create", "rz", a, "spare", b, "spare", b, "--size", "64M"]);
    assert!(error.contains("`spare` appears twice"), "{error}");
    for word in ["b", "./b"] {
        let error = in_dir(&["pool", "create", "rz", "mirror", a, word, "--size", "64M"]);
        let meant = dir.as_path().join("b");
        assert!(error.contains(&format!("leaf path {word:?} is not absolute")), "{error}");
        assert!(error.contains(meant.to_str().unwrap()), "{error}");
    }
    assert!(
        !Path::new(a).exists() && !dir.as_path().join("b").exists(),
        "a refused create made files"
    );
    let error = in_dir(&["pool", "attach", "rz", a, "c"]);
    assert!(error.contains("leaf path \"c\" is not absolute"), "{error}");
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
    let mut server = serve(dir.path(), &cache, &["--set", "cache.bytes_max=3M"]);
    let status = ok(&cache, &["pool", "status", "tank"]);
    let stopped = Command::new("kill").arg(server.id().to_string()).status().unwrap();
    let exited = server.wait().unwrap();
    assert!(stopped.success() && exited.success(), "the server did not stop cleanly: {exited}");
    assert!(status.contains("served by sluice serve"), "{status}");
    assert!(status.contains("of 3.0M held"), "the cache size set was not applied: {status}");
}

/// `pool create -d` makes a pool without the optional format features, for older builds;
/// `pool status` says so and what to do, `pool upgrade` with no pool names what each lacks
/// and changes nothing, and `pool upgrade tank` enables it while the pool is served (a second
/// time enables nothing) and it stays enabled once the server stops; `pool upgrade -v` lists
/// every feature, those the command enables marked.
/// A pool that cannot be opened does not hide the pools after it from the commands that go
/// over every known pool: each answers, the failure is reported, and the command fails.
#[test]
fn a_pool_that_cannot_be_opened_does_not_hide_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    // Known pools are taken in name order: "gone" comes first.
    ok(&cache, &["pool", "create", "gone", a, "--size", "64M"]);
    ok(&cache, &["pool", "create", "tank", "-d", b, "--size", "64M"]);
    ok(&cache, &["vol", "create", "tank/vm1", "--size", "8M"]);
    std::fs::remove_file(a).unwrap();
    let every: [&[&str]; 4] =
        [&["pool", "list"], &["pool", "status"], &["vol", "list"], &["pool", "upgrade", "-a"]];
    for args in every {
        let out = sluice(&cache, args);
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "{args:?} hid the failure: {stdout}");
        assert!(stderr.contains("gone"), "{args:?}: the failure names its pool: {stderr}");
        assert!(stdout.contains("tank"), "{args:?}: the pool after it answered: {stdout}");
    }
    // The upgrade went through: nothing is left to enable on tank.
    let features = ok(&cache, &["pool", "get", "tank", "features", "-H"]);
    assert!(features.contains("lz4_indirect"), "{features}");
}

#[test]
fn pool_upgrade_enables_what_create_d_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let made = ok(&cache, &["pool", "create", "tank", "-d", "mirror", a, b, "--size", "64M"]);
    assert!(made.contains("older sluice builds import it"), "{made}");
    ok(&cache, &["vol", "create", "tank/vm1", "--size", "8M"]);
    let features = || ok(&cache, &["pool", "get", "tank", "features", "-H"]);
    assert_eq!(features(), "tank\tfeatures\t-\n");
    let status = ok(&cache, &["pool", "status", "tank"]);
    assert!(status.contains("not enabled: lz4_indirect"), "{status}");
    assert!(status.contains("sluice pool upgrade tank"), "{status}");
    let listing = ok(&cache, &["pool", "upgrade"]);
    assert!(listing.contains("pool tank: not enabled: lz4_indirect"), "{listing}");
    assert_eq!(features(), "tank\tfeatures\t-\n", "the listing enabled nothing");

    let mut server = serve(dir.path(), &cache, &[]);
    let upgraded = ok(&cache, &["pool", "upgrade", "tank"]);
    let again = ok(&cache, &["pool", "upgrade", "-a"]);
    let served_features = features();
    let stopped = Command::new("kill").arg(server.id().to_string()).status().unwrap();
    let exited = server.wait().unwrap();
    assert!(stopped.success() && exited.success(), "the server did not stop cleanly: {exited}");
    assert!(upgraded.contains("pool tank: enabled lz4_indirect"), "{upgraded}");
    assert!(again.contains("pool tank: every optional feature"), "{again}");
    assert_eq!(served_features, "tank\tfeatures\tlz4_indirect\n");
    assert_eq!(features(), "tank\tfeatures\tlz4_indirect\n", "after the server stopped");
    let status = ok(&cache, &["pool", "status", "tank"]);
    assert!(!status.contains("not enabled"), "{status}");

    let verbose = ok(&cache, &["pool", "upgrade", "-v"]);
    assert!(verbose.contains("* lz4_indirect"), "{verbose}");
    assert!(verbose.contains("  raidz_log_copies"), "{verbose}");
    assert!(fails(&cache, &["pool", "upgrade", "-a", "tank"]).contains("cannot be used with"));
}

/// `pool create` once overwrote whatever its leaves held without a word: a file full of
/// someone's data, or a leaf of another pool (which was then gone). Like `zpool create` it now
/// refuses, saying what it found on each leaf, and goes ahead only with --force (or -f).
#[test]
fn pool_create_refuses_leaves_that_hold_something() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (data, exported, imported, fresh) =
        (path("data"), path("exported"), path("imported"), path("fresh"));

    // 64 MiB of someone's data: refused, the offset of the first byte named; forced, it works.
    let bytes: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
    std::fs::write(&data, &bytes).unwrap();
    let error = fails(&cache, &["pool", "create", "mine", &data]);
    assert!(error.contains(&format!("{data} holds data: non-zero bytes at offset 0")), "{error}");
    assert!(error.contains("use --force"), "{error}");
    assert!(std::fs::read(&data).unwrap() == bytes, "a refused create changed the data");
    ok(&cache, &["pool", "create", "mine", &data, "--force"]);
    ok(&cache, &["pool", "destroy", "mine"]);

    // A leaf of an exported pool: refused with the pool's name and guid, then forced.
    ok(&cache, &["pool", "create", "tank", &exported, "--size", "64M"]);
    ok(&cache, &["vol", "create", "tank/v", "--size", "16M"]);
    ok(&cache, &["pool", "export", "tank"]);
    let error = fails(&cache, &["pool", "create", "new", &exported]);
    assert!(
        error.contains(&format!("{exported} is part of exported pool 'tank' (guid ")),
        "{error}"
    );
    ok(&cache, &["pool", "create", "new", &exported, "-f"]);
    assert!(fails(&cache, &["pool", "import", "tank", "-d", dir.path().to_str().unwrap()])
        .contains("no pool named tank"));

    // A leaf of a pool imported here (in the pool cache, not served): refused, then forced; the
    // old pool's cache entry lets go of the leaf.
    ok(&cache, &["pool", "create", "home", &imported, "--size", "64M"]);
    let error = fails(&cache, &["pool", "create", "other", &imported]);
    assert!(
        error.contains(&format!("{imported} is part of pool 'home', imported on this machine")),
        "{error}"
    );
    assert!(ok(&cache, &["pool", "status", "home"]).contains("state: ONLINE"));
    ok(&cache, &["pool", "create", "other", &imported, "-f"]);
    assert!(!std::fs::read_to_string(&cache).unwrap().contains("home"), "home still cached");

    // Several leaves: each one that holds something is listed; a new file is fine.
    let error = fails(&cache, &["pool", "create", "two", &fresh, &data, "--size", "64M"]);
    assert!(
        error.contains(&format!("{data} holds")) && !error.contains(&format!("{fresh} ")),
        "{error}"
    );
    assert!(!Path::new(&fresh).exists(), "the refused create left the file it made");
    ok(&cache, &["pool", "create", "two", &fresh, "--size", "64M"]);
    // An all-zero file goes ahead too.
    let zeros = path("zeros");
    std::fs::write(&zeros, vec![0u8; 32 << 20]).unwrap();
    ok(&cache, &["pool", "create", "zeros", &zeros]);
}

/// A preloaded shim that makes `fcntl(F_OFD_SETLK)` fail with EINVAL, the way some FUSE and
/// network filesystems refuse OFD locks, and, with SHIM_REFUSE_FLOCK set, `flock` with ENOLCK.
/// Each refusal is appended to $SHIM_LOG, so a test can tell the shim really intercepted.
/// `sluice` calls `fcntl` (checked with `nm -D`); `fcntl64` is covered too in case a libc
/// update moves it there.
const LOCK_SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>

static void note(const char *what) {
    const char *path = getenv("SHIM_LOG");
    FILE *log = path ? fopen(path, "a") : NULL;
    if (log) { fprintf(log, "%s\n", what); fclose(log); }
}

static int forward(const char *name, int fd, int cmd, void *arg) {
    if (cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW) {
        note("refused F_OFD_SETLK");
        errno = EINVAL;
        return -1;
    }
    int (*real)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, name);
    return real(fd, cmd, arg);
}

int fcntl(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    return forward("fcntl", fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    return forward("fcntl64", fd, cmd, arg);
}

int flock(int fd, int op) {
    if (getenv("SHIM_REFUSE_FLOCK")) {
        note("refused flock");
        errno = ENOLCK;
        return -1;
    }
    int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    return real(fd, op);
}
"#;

/// On a filesystem that refuses OFD locks, leaves are locked with flock instead: a pool is
/// created, and a leaf flock-locked by another open file is still refused, naming the holder.
/// When flock is refused too, the error says the lock failed, on which path, with each errno,
/// and what to do; before, it read "cannot open ... check the path exists".
#[test]
fn leaf_locks_fall_back_to_flock_and_say_why_they_failed() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("shim.c");
    let shim = dir.path().join("shim.so");
    std::fs::write(&source, LOCK_SHIM).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&shim)
        .arg(&source)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(built.status.success(), "cc: {}", String::from_utf8_lossy(&built.stderr));
    let cache = dir.path().join("cache");
    let log = dir.path().join("shim.log");
    let leaf = dir.path().join("leaf");
    let leaf_text = leaf.to_str().unwrap();

    // OFD refused: the pool is made through flock.
    let env = [("LD_PRELOAD", shim.as_path()), ("SHIM_LOG", log.as_path())];
    let out = sluice_with(&cache, &["pool", "create", "tank", leaf_text, "--size", "64M"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "create with OFD locks refused: {stderr}");
    let noted = std::fs::read_to_string(&log).unwrap();
    assert!(noted.contains("refused F_OFD_SETLK"), "the shim did not intercept: {noted:?}");

    // The flock taken instead still keeps a second holder out.
    let held = std::fs::OpenOptions::new().read(true).write(true).open(&leaf).unwrap();
    // SAFETY: flock on a descriptor this test holds open.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) };
    assert_eq!(locked, 0);
    let out = sluice_with(&cache, &["pool", "status", "tank"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a flock-held leaf was opened");
    assert!(
        stderr.contains("in use by process") && stderr.contains(&std::process::id().to_string()),
        "{stderr}"
    );
    drop(held);

    // Both refused: the error is about the lock, with the path, each errno and what to do.
    let env = [
        ("LD_PRELOAD", shim.as_path()),
        ("SHIM_LOG", log.as_path()),
        ("SHIM_REFUSE_FLOCK", Path::new("1")),
    ];
    let out = sluice_with(&cache, &["pool", "status", "tank"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "opened a leaf that could not be locked");
    for part in [
        &format!("the exclusive lock on {leaf_text} failed"),
        "fcntl(F_OFD_SETLK) answered EINVAL (Invalid argument)",
        "flock(LOCK_EX|LOCK_NB) answered ENOLCK (No locks available)",
        "put the leaf on a local filesystem",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    assert!(std::fs::read_to_string(&log).unwrap().contains("refused flock"));
    // Without the shim, the same pool opens.
    assert!(ok(&cache, &["pool", "status", "tank"]).contains("state: ONLINE"));
}

/// The newest uberblock in a leaf file's first label ring.
fn newest_uberblock(leaf: &Path) -> sluice_format::Uberblock {
    use sluice_format::{uberblock_offset, Uberblock, UBERBLOCK_BYTES, UBERBLOCK_SLOTS};
    let bytes = std::fs::read(leaf).unwrap();
    let start = uberblock_offset(0, 0) as usize;
    (0..UBERBLOCK_SLOTS as usize)
        .filter_map(|slot| {
            let at = start + slot * UBERBLOCK_BYTES;
            Uberblock::decode(&bytes[at..at + UBERBLOCK_BYTES]).ok()
        })
        .max_by_key(|u| u.txg)
        .unwrap()
}

/// A pool whose newest txg's directory is damaged on both copies (a disk that acknowledged a
/// flush it had not done): plain import names the txg and the way out; `--rewind --dry-run`
/// says which txg and what is lost, writing nothing; `--rewind` imports there, and the pool
/// then imports plainly.
#[test]
fn import_rewinds_past_a_damaged_txg() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let leaves = dir.path().join("leaves");
    std::fs::create_dir(&leaves).unwrap();
    let (a, b) = (leaves.join("a"), leaves.join("b"));
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    let leaves_s = leaves.to_str().unwrap();
    ok(&cache, &["pool", "create", "tank", "mirror", a_s, b_s, "--size", "64M"]);
    ok(&cache, &["vol", "create", "tank/old", "--size", "16M"]);
    ok(&cache, &["vol", "create", "tank/new", "--size", "16M"]);
    ok(&cache, &["pool", "export", "tank"]);
    let newest = newest_uberblock(&a);
    // Every copy of the directory (it has three).
    let root = newest.root.unwrap();
    for leaf in [&a, &b] {
        let file = std::fs::OpenOptions::new().write(true).open(leaf).unwrap();
        for copy in root.copies() {
            file.write_all_at(&[0xa5; 512], copy.offset_bytes()).unwrap();
        }
    }
    let error = fails(&cache, &["pool", "import", "tank", "-d", leaves_s]);
    assert!(error.contains(&format!("txg {}, the newest, does not verify", newest.txg)), "{error}");
    assert!(error.contains("--rewind"), "{error}");
    let before = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let dry = ok(&cache, &["pool", "import", "tank", "-d", leaves_s, "--rewind", "--dry-run"]);
    assert!(dry.contains("dry run: nothing written"), "{dry}");
    assert!(dry.contains(&format!("rewound from txg {}", newest.txg)), "{dry}");
    assert!(dry.contains("1 txg(s) abandoned"), "{dry}");
    assert_eq!(before, (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap()), "dry run wrote");
    let imported = ok(&cache, &["pool", "import", "tank", "-d", leaves_s, "--rewind"]);
    assert!(imported.contains(&format!("at txg {}", newest.txg - 1)), "{imported}");
    assert!(imported.contains("s of writes lost"), "{imported}");
    // Each command syncs as it opens and as it exports, so the txg before the newest (the
    // export's) still holds both volumes.
    let volumes = ok(&cache, &["vol", "list"]);
    assert!(volumes.contains("tank/old") && volumes.contains("tank/new"), "{volumes}");
    ok(&cache, &["pool", "export", "tank"]);
    let again = ok(&cache, &["pool", "import", "tank", "-d", leaves_s]);
    assert!(!again.contains("rewound"), "{again}");
}

/// The exit code of `sluice args`, and what it printed on stderr.
fn exit_code(cache: &Path, args: &[&str]) -> (i32, String) {
    let out = sluice(cache, args);
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stderr).unwrap())
}

/// Every line of `sluice args` (which must succeed) parses as a JSON object.
fn json_lines(cache: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let out = ok(cache, args);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("sluice {args:?}: {e}: {line}"))
        })
        .collect();
    assert!(!lines.is_empty(), "sluice {args:?} printed nothing");
    assert!(lines.iter().all(serde_json::Value::is_object), "sluice {args:?}: {out}");
    lines
}

/// Failures exit with a code of their kind (listed in `sluice --help`), the same whether the
/// command ran here or in the pool's server; and every `--json` output parses, here and
/// through the server.
#[test]
fn exit_codes_follow_the_kind_of_failure_and_json_parses() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let help = ok(&cache, &["--help"]);
    assert!(help.contains("Exit codes:") && help.contains("5   no space"), "{help}");

    let (code, said) = exit_code(&cache, &["pool", "status", "nosuchpool"]);
    assert_eq!(code, 3, "no such pool: {said}");
    ok(&cache, &["pool", "create", "tank", "mirror", a, b, "--size", "64M", "--sparse"]);
    ok(&cache, &["vol", "create", "tank/vm1", "--size", "8M"]);
    ok(&cache, &["snapshot", "create", "tank/vm1@one"]);
    let refusals = |cache: &Path| {
        let no_space = exit_code(cache, &["vol", "create", "tank/big", "--size", "10G"]);
        let exists = exit_code(cache, &["vol", "create", "tank/vm1", "--size", "8M"]);
        let invalid = exit_code(cache, &["vol", "create", "tank/bad%name", "--size", "8M"]);
        let missing = exit_code(cache, &["vol", "destroy", "tank/nosuchvol"]);
        [no_space, exists, invalid, missing].map(|(code, said)| {
            assert!(said.starts_with("sluice: "), "{said}");
            code
        })
    };
    assert_eq!(refusals(&cache), [5, 4, 6, 3], "no space, exists, invalid, not found");
    let every_json = |cache: &Path| {
        json_lines(cache, &["pool", "status", "--json", "tank"]);
        json_lines(cache, &["pool", "list", "--json"]);
        json_lines(cache, &["vol", "list", "--json", "tank"]);
        json_lines(cache, &["vol", "get", "--json", "tank/vm1"]);
        json_lines(cache, &["snapshot", "list", "--json", "tank/vm1"]);
    };
    every_json(&cache);
    // Output that does not move while a pool is served (no space figures, no counters), to
    // compare with the same commands answered by the server: one renderer for both.
    let steady = |cache: &Path| {
        [
            &["snapshot", "list", "tank/vm1"][..],
            &["snapshot", "list", "-H", "tank/vm1"],
            &["snapshot", "list", "--json", "tank/vm1"],
            &["vol", "get", "tank/vm1", "volsize", "compression", "sync", "origin"],
            &["vol", "get", "-H", "tank/vm1", "volsize", "compression", "sync", "origin"],
            &["vol", "get", "--json", "tank/vm1", "volsize", "compression", "sync", "origin"],
        ]
        .map(|args| ok(cache, args))
    };
    let unserved = steady(&cache);

    // The same through the server: the kind crosses the control socket.
    let mut server = serve(dir.path(), &cache, &[]);
    let served = ok(&cache, &["pool", "status", "tank"]);
    assert!(served.contains("served by sluice serve"), "{served}");
    assert_eq!(refusals(&cache), [5, 4, 6, 3], "through the server");
    every_json(&cache);
    json_lines(&cache, &["pool", "iostat", "tank", "--json", "1", "1"]);
    assert_eq!(steady(&cache), unserved, "a served pool's replies render as the pool's own");
    // A scrub waited for reports its progress while it runs: the server sends a frame at the
    // start and every second after, and the command prints each on standard error.
    let scrub = sluice(&cache, &["pool", "scrub", "-w", "tank"]);
    let (said, progress) =
        (String::from_utf8_lossy(&scrub.stdout), String::from_utf8_lossy(&scrub.stderr));
    assert!(scrub.status.success() && said.contains("0 bad copies found"), "{said}{progress}");
    assert!(
        progress.lines().next().is_some_and(|l| l.starts_with("scrub of tank: ")),
        "{progress}"
    );
    // Commands of the first, unnumbered protocol (the arguments as a bare JSON array) and of
    // the second (`{"protocol": 2, "args": [...]}`) are told the server speaks another, not
    // misread: in the fields those commands read (`ok`, `error`, `kind`).
    for (request, theirs) in [
        ("[\"pool\", \"status\", \"tank\"]\n", "the first, unnumbered one"),
        ("{\"protocol\": 2, \"args\": [\"pool\", \"status\", \"tank\"]}\n", "speaks 2"),
    ] {
        use std::io::{BufRead, Write};
        let control = cache.with_file_name("tank.control");
        let mut stream = std::os::unix::net::UnixStream::connect(&control).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        std::io::BufReader::new(&stream).read_line(&mut answer).unwrap();
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!((answer["protocol"].as_u64(), &answer["ok"]), (Some(6), &false.into()));
        assert_eq!(answer["kind"], "protocol", "{answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains("control protocol 6") && error.contains(theirs), "{answer}");
    }
    let stopped = Command::new("kill").arg(server.id().to_string()).status().unwrap();
    let exited = server.wait().unwrap();
    assert!(stopped.success() && exited.success(), "the server did not stop cleanly: {exited}");
}

/// A server of the second control protocol (one that was running when sluice was upgraded)
/// answers this command's request with a refusal of its own version: the command says the
/// protocols differ and exits 11, instead of misreading the answer.
#[test]
fn a_server_of_an_older_protocol_is_named_as_such() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let listener = std::os::unix::net::UnixListener::bind(dir.path().join("tank.control")).unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut request = String::new();
        std::io::BufReader::new(&stream).read_line(&mut request).unwrap();
        // What a version 2 server answers a request without `args`.
        (&stream)
            .write_all(
                b"{\"protocol\":2,\"ok\":false,\"out\":\"\",\"error\":\"bad request (a JSON \
                  object on one line): missing field `args`\",\"kind\":null}\n",
            )
            .unwrap();
        request
    });
    let (code, said) = exit_code(&cache, &["pool", "status", "tank"]);
    let request = server.join().unwrap();
    assert!(request.starts_with("{\"protocol\":6,\"command\":"), "{request}");
    assert_eq!(code, 11, "{said}");
    assert!(said.contains("speaks control protocol 2 and this sluice speaks 6"), "{said}");
}

/// `sluice serve --stdio` speaks NBD on stdin and stdout whether they are one Unix socket (as
/// libnbd's `nbd_connect_command` launches it; served directly) or a pair of pipes (through
/// tokio's stdin and stdout): a FUA write and a read of it back, then the client leaves and the
/// server exports the pool and exits cleanly.
#[test]
fn stdio_serves_a_socket_and_pipes() {
    use std::io::{Read, Write};
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let leaf = dir.path().join("leaf");
    ok(&cache, &["pool", "create", "tank", leaf.to_str().unwrap(), "--size", "64M"]);
    ok(&cache, &["vol", "create", "tank/v", "--size", "16M"]);
    let session = |input: &mut dyn Write, output: &mut dyn Read, fill: u8| {
        let mut greeting = [0u8; 18];
        output.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        // Fixed newstyle; NBD_OPT_EXPORT_NAME "v".
        input.write_all(&1u32.to_be_bytes()).unwrap();
        input.write_all(b"IHAVEOPT").unwrap();
        input.write_all(&[0, 0, 0, 1, 0, 0, 0, 1, b'v']).unwrap();
        let mut export = [0u8; 8 + 2 + 124];
        output.read_exact(&mut export).unwrap();
        assert_eq!(u64::from_be_bytes(export[..8].try_into().unwrap()), 16 << 20);
        let request = |kind: u16, flags: u16, offset: u64, len: u32| {
            let mut header = Vec::with_capacity(28);
            header.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            header.extend_from_slice(&flags.to_be_bytes());
            header.extend_from_slice(&kind.to_be_bytes());
            header.extend_from_slice(&u64::from(kind).to_be_bytes());
            header.extend_from_slice(&offset.to_be_bytes());
            header.extend_from_slice(&len.to_be_bytes());
            header
        };
        let reply = |output: &mut dyn Read, kind: u16| {
            let mut simple = [0u8; 16];
            output.read_exact(&mut simple).unwrap();
            assert_eq!(&simple[..4], &0x6744_6698u32.to_be_bytes(), "a simple reply");
            assert_eq!(&simple[4..8], &[0; 4], "error in reply to request {kind}");
            assert_eq!(u64::from_be_bytes(simple[8..].try_into().unwrap()), u64::from(kind));
        };
        let data = vec![fill; 64 << 10];
        input.write_all(&request(1, 1, 1 << 20, data.len() as u32)).unwrap();
        input.write_all(&data).unwrap();
        reply(output, 1);
        input.write_all(&request(0, 0, 1 << 20, data.len() as u32)).unwrap();
        reply(output, 0);
        let mut back = vec![0u8; data.len()];
        output.read_exact(&mut back).unwrap();
        assert!(back == data, "the write did not read back");
        input.write_all(&request(2, 0, 0, 0)).unwrap();
    };
    let command = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .args(["serve", "tank", "--stdio", "--dir"])
            .arg(dir.path())
            .env("SLUICE_CACHE_FILE", &cache)
            .stderr(Stdio::null());
        command
    };

    let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let their_copy = theirs.try_clone().unwrap();
    let mut server = command()
        .stdin(std::os::fd::OwnedFd::from(theirs))
        .stdout(std::os::fd::OwnedFd::from(their_copy))
        .spawn()
        .unwrap();
    session(&mut &mine, &mut &mine, 0x5a);
    drop(mine);
    let exited = server.wait().unwrap();
    assert!(exited.success(), "the server on a socket exited {exited}");

    let mut server = command().stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let (mut input, mut output) = (server.stdin.take().unwrap(), server.stdout.take().unwrap());
    session(&mut input, &mut output, 0xa5);
    drop((input, output));
    let exited = server.wait().unwrap();
    assert!(exited.success(), "the server on pipes exited {exited}");
}
