#!/usr/bin/python3
"""RAID-Z against a 2-way mirror of the same files (docs/bench/raidz.md).

Every leaf is a file on the one disk here (this kernel has no md RAID), so the 2-way mirror of
the same files is the baseline. For each layout (mirror of 2, raidz1 of 4, raidz2 of 6; files
sized so that each layout holds --usable-size of data, written in full with zeros first) a pool
is created and served (`sluice serve POOL`), and fio runs over NBD. Equal usable sizes keep the
pools equally full: the 2 GiB written twice over takes most of a pool of 5 GiB. The leaves are written in full because ext4 allocates the blocks
of a sparse or fallocated file at its first direct write, and such a write is not done in the
submitting thread (io_uring hands it to a worker thread): the layout that writes fewer bytes
would also write to more never-written regions of its files, and pay for the filesystem.

  w4k-1, w4k-8, w4k-32   4 KiB random writes, a flush after each (fio --fsync=1), 1/8/32 jobs,
                         on a volume of 16 KiB blocks (the default)
  r4k-32                 4 KiB random reads, 32 in flight, same volume (written first)
  seqw-1m                1 MiB sequential writes, 8 in flight, incompressible (--refill_buffers)
                         over a whole 2 GiB volume of 128 KiB blocks written twice before
                         (unmeasured), timed until `pool sync` has made them durable
  seqw-1m-capped         the same with the server's writes to the disk holding the leaves capped
                         at --cap-bytes per second (the kernel's block throttle: cgroup v1
                         blkio.throttle.write_bps_device or v2 io.max), so that both layouts are
                         bound by the device: this disk takes more than one NBD client sends
  seqr-1m                1 MiB sequential reads of what seqw-1m wrote, 8 in flight

Each job's server CPU time (/proc/PID/stat, user + system) is given per operation or per MiB,
and for writes the bytes the leaves wrote (`sluice_leaf_written_bytes_total` from --metrics)
per byte fio wrote. Rounds alternate the layouts; the table gives medians. Then, per layout,
once: usable capacity (incompressible data written into a thin 128K volume until ENOSPC,
against the sum of the leaf sizes) and the resilver time per GiB allocated (`pool replace
-w` of one leaf with a new file).

usage: bench/raidz.py [--rounds N] [--seconds S] [--usable-size BYTES] [--capacity-leaf-size BYTES]
                      [--cap-bytes B] [--dir DIR] [--report F] [--jobs J,...] [--no-capacity]
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

LAYOUTS = [("mirror", 0, 2), ("raidz1x4", 1, 4), ("raidz2x6", 2, 6)]
# The 128K volume, written whole by seqw-1m and read by seqr-1m.
# Twice 1 GiB: more than a quarter of the dirty-data limit on this machine (where a txg sync
# starts), so the writes stream through several syncs rather than into memory and one sync.
SEQ_BYTES = 2 << 30
JOBS = ["w4k-1", "w4k-8", "w4k-32", "r4k-32", "seqw-1m", "seqw-1m-capped", "seqr-1m"]


def run(*args, check=True, **kw):
    done = subprocess.run(args, check=False, capture_output=True, text=True, **kw)
    if check and done.returncode != 0:
        sys.exit(f"raidz bench: {' '.join(map(str, args))} failed: {done.stderr.strip()}")
    return done


SERVERS = []


class Served:
    """A pool served by `sluice serve`, with its NBD address and metrics endpoint."""

    def __init__(self, args, name):
        self.args, self.name = args, name
        log = open(os.path.join(args.dir, f"{name}.log"), "w")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            metrics_port = probe.getsockname()[1]
        self.proc = subprocess.Popen(
            [args.bin, "serve", name, "--listen", "127.0.0.1:0", "--socket",
             os.path.join(args.dir, f"{name}.sock"), "--metrics", f"127.0.0.1:{metrics_port}"],
            stdout=log, stderr=subprocess.STDOUT, env=args.env)
        SERVERS.append(self.proc)
        self.metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        for _ in range(200):
            text = open(log.name).read()
            found = re.search(r"tcp:(127\.0\.0\.1:\d+)", text)
            if "sluice: serving" in text and found:
                self.tcp = found.group(1)
                return
            if self.proc.poll() is not None:
                sys.exit(f"raidz bench: server for {name} exited: {text}")
            time.sleep(0.1)
        sys.exit(f"raidz bench: server for {name} did not start")

    def cpu_ticks(self):
        stat = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return int(stat[11]) + int(stat[12])

    def leaf_bytes(self):
        text = urllib.request.urlopen(self.metrics, timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("sluice_leaf_written_bytes_total{"))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def fio(args, served, volume, job, extra=(), check=True):
    common = ["fio", "--name=" + job, "--ioengine=nbd", f"--uri=nbd://{served.tcp}/{volume}",
              "--output-format=json", "--group_reporting"]
    out = run(*common, *extra, check=check).stdout
    return json.loads(out[out.index("{"):])


def job_args(job, seconds):
    timed = ["--time_based", f"--runtime={seconds}", "--ramp_time=1"]
    if job.startswith("w4k-"):
        jobs = job.split("-")[1]
        return "v16", ["--rw=randwrite", "--bs=4k", "--fsync=1", "--iodepth=1",
                       f"--numjobs={jobs}", "--size=192M", *timed]
    if job == "r4k-32":
        return "v16", ["--rw=randread", "--bs=4k", "--iodepth=32", "--size=192M", *timed]
    if job.startswith("seqw-1m"):
        # One pass over the volume, untimed: the time counted runs until `pool sync` has made
        # it durable (fio alone would time the writes into memory, up to the dirty limit).
        return "v128", ["--rw=write", "--bs=1M", "--iodepth=8", f"--size={SEQ_BYTES}",
                        "--refill_buffers"]
    return "v128", ["--rw=read", "--bs=1M", "--iodepth=8", f"--size={SEQ_BYTES}", *timed]


def measure(args, served, job):
    volume, extra = job_args(job, args.seconds)
    run(args.bin, "pool", "sync", served.name, env=args.env)
    capped = job.endswith("-capped")
    if capped:
        args.cap.put(served.proc.pid)
    ticks, leaf = served.cpu_ticks(), served.leaf_bytes()
    began = time.monotonic()
    result = fio(args, served, volume, job, extra)["jobs"][0]
    untimed = job.startswith("seqw-1m")
    if untimed:
        run(args.bin, "pool", "sync", served.name, env=args.env)
    took = time.monotonic() - began
    if capped:
        args.cap.release(served.proc.pid)
    ticks, leaf = served.cpu_ticks() - ticks, served.leaf_bytes() - leaf
    hz = os.sysconf("SC_CLK_TCK")
    write = job.startswith(("w", "seqw"))
    side = result["write" if write else "read"]
    ops, nbytes = side["total_ios"], side["io_bytes"]
    if untimed:
        # Until durable: fio's writes and the sync after them.
        ops_all, bytes_all = ops, nbytes
        iops, bw = ops / took, nbytes / took
    else:
        # fio's totals leave the ramp out; the CPU and leaf counters include it, so both are
        # scaled to the same span by fio's own rate over the whole run time.
        span = args.seconds + 1
        ops_all, bytes_all = side["iops"] * span, side["bw_bytes"] * span
        iops, bw = side["iops"], side["bw_bytes"]
    row = {"iops": iops, "mib_s": bw / 2**20,
           "cpu_us_op": ticks / hz / max(ops_all, 1) * 1e6,
           "cpu_ms_mib": ticks / hz / max(bytes_all / 2**20, 1e-9) * 1e3,
           "ops": ops, "bytes": nbytes}
    if write:
        row["device_per_logical"] = leaf / max(bytes_all, 1)
    return row


def write_leaf(path, size):
    """A leaf file written in full with zeros (see the module doc), which `pool create` takes
    as empty."""
    if os.path.exists(path):
        os.remove(path)
    run("dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={size >> 22}", "oflag=direct",
        "status=none")


def create(args, name, parity, width, leaf_size):
    files = [os.path.join(args.dir, f"{name}-{i}.img") for i in range(width)]
    for f in files:
        write_leaf(f, leaf_size)
    words = (["mirror"] if parity == 0 else [f"raidz{parity}"]) + files
    run(args.bin, "pool", "create", name, *words, env=args.env)
    return files


class WriteCap:
    """Caps a process's writes to the disk that holds --dir, with the kernel's block throttle:
    a cgroup of its own with cgroup v1's blkio.throttle.write_bps_device or v2's io.max. It
    counts direct I/O, which is how sluice writes its leaves."""

    def __init__(self, directory, bytes_per_s):
        dev = os.stat(directory).st_dev
        node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        if not os.path.exists(node):
            sys.exit(f"raidz bench: {directory} is not on a block device; the capped job needs "
                     "one (leave it out with --jobs)")
        if os.path.exists(node + "/partition"):
            node = os.path.dirname(os.path.realpath(node))
        self.device = open(node + "/dev").read().strip()
        self.bytes_per_s = bytes_per_s
        if os.path.isdir("/sys/fs/cgroup/blkio"):
            self.root = "/sys/fs/cgroup/blkio"
            self.group = os.path.join(self.root, "sluice-raidz-bench")
            os.makedirs(self.group, exist_ok=True)
            limit = ("blkio.throttle.write_bps_device", f"{self.device} {bytes_per_s}")
        elif "io" in open("/sys/fs/cgroup/cgroup.controllers").read().split():
            self.root = "/sys/fs/cgroup"
            with open(os.path.join(self.root, "cgroup.subtree_control"), "w") as f:
                f.write("+io")
            self.group = os.path.join(self.root, "sluice-raidz-bench")
            os.makedirs(self.group, exist_ok=True)
            limit = ("io.max", f"{self.device} wbps={bytes_per_s}")
        else:
            sys.exit("raidz bench: no cgroup block throttle here (neither v1 blkio nor v2 io); "
                     "leave seqw-1m-capped out with --jobs")
        with open(os.path.join(self.group, limit[0]), "w") as f:
            f.write(limit[1])

    def put(self, pid):
        with open(os.path.join(self.group, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def release(self, pid):
        with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def remove(self):
        os.rmdir(self.group)


def destroy(args, name):
    run(args.bin, "pool", "destroy", name, env=args.env, check=False)
    for f in os.listdir(args.dir):
        if f.startswith(name + "-"):
            os.remove(os.path.join(args.dir, f))


def prefill(args, served):
    """Writes both volumes, and the 128K one a second time (unmeasured, synced): seqw-1m then
    overwrites a volume in use, as bench/peers.sh warms its targets up, rather than measuring
    the leaf files' first writes of each region."""
    fio(args, served, "v16", "prefill16", ["--rw=write", "--bs=1M", "--iodepth=8", "--size=192M",
                                           "--refill_buffers"])
    if not any(job.startswith("seq") for job in JOBS):
        # No job uses the 128K volume: 4 GiB of writes that would only lengthen the run.
        return
    for _ in range(2):
        fio(args, served, "v128", "prefill128", ["--rw=write", "--bs=1M", "--iodepth=8",
                                                 f"--size={SEQ_BYTES}", "--refill_buffers"])
        run(args.bin, "pool", "sync", served.name, env=args.env)


def capacity_and_resilver(args, name, parity, width):
    """Incompressible data into a thin 128K volume until ENOSPC; then a leaf replaced."""
    leaf_size = args.capacity_leaf_size
    create(args, name, parity, width, leaf_size)
    run(args.bin, "vol", "create", f"{name}/fill", "--size", str(leaf_size * width),
        "--sparse", "--block-size", "128K", env=args.env)
    served = Served(args, name)
    result = fio(args, served, "fill", "fill", ["--rw=write", "--bs=1M", "--iodepth=8",
                                                f"--size={leaf_size * width}",
                                                "--refill_buffers"], check=False)
    written = result["jobs"][0]["write"]["io_bytes"]
    served.stop()
    listed = run(args.bin, "pool", "list", "--json", env=args.env).stdout.splitlines()
    row = next(r for r in map(json.loads, listed) if r["name"] == name)
    allocated = row["allocated_bytes"]
    new = os.path.join(args.dir, f"{name}-new.img")
    old = os.path.join(args.dir, f"{name}-1.img")
    write_leaf(new, leaf_size)
    began = time.monotonic()
    run(args.bin, "pool", "replace", name, old, new, "-w", env=args.env)
    took = time.monotonic() - began
    destroy(args, name)
    return {"usable": written / (leaf_size * width), "written": written,
            "allocated": allocated, "resilver_s": took,
            "resilver_s_gib": took / max(allocated / 2**30, 1e-9)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="target/release/sluice")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--usable-size", type=int, default=5 << 30,
                        help="data each layout's pool holds: the leaf size for the mirror, "
                             "this over the data columns for RAID-Z")
    parser.add_argument("--capacity-leaf-size", type=int, default=1 << 30)
    parser.add_argument("--cap-bytes", type=int, default=10**9,
                        help="seqw-1m-capped's write limit on the leaves' disk, bytes per second")
    parser.add_argument("--dir", default="/var/tmp/sluice-raidz-bench")
    parser.add_argument("--report")
    parser.add_argument("--jobs", help="comma-separated subset of the jobs (all by default)")
    parser.add_argument("--no-capacity", action="store_true",
                        help="leave out the capacity and resilver measurements")
    args = parser.parse_args()
    if args.jobs:
        JOBS[:] = [j for j in JOBS if j in args.jobs.split(",")]
    args.bin = os.path.realpath(args.bin)
    args.dir = os.path.realpath(args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    args.env = dict(os.environ, SLUICE_CACHE_FILE=os.path.join(args.dir, "pools.cache"))
    args.cap = WriteCap(args.dir, args.cap_bytes) if "seqw-1m-capped" in JOBS else None
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = {layout: {job: [] for job in JOBS} for layout, _, _ in LAYOUTS}
    try:
        for r in range(args.rounds):
            order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
            for name, parity, width in order:
                data_leaves = 1 if parity == 0 else width - parity
                leaf_size = -(-args.usable_size // data_leaves >> 22) << 22
                create(args, name, parity, width, leaf_size)
                run(args.bin, "vol", "create", f"{name}/v16", "--size", "192M", "--sparse",
                    env=args.env)
                run(args.bin, "vol", "create", f"{name}/v128", "--size", str(SEQ_BYTES), "--sparse",
                    "--block-size", "128K", env=args.env)
                served = Served(args, name)
                prefill(args, served)
                for job in JOBS:
                    row = measure(args, served, job)
                    rows[name][job].append(row)
                    print(f"round {r} {name} {job}: {json.dumps(row)}", flush=True)
                served.stop()
                destroy(args, name)
        once = {}
        for name, parity, width in ([] if args.no_capacity else LAYOUTS):
            once[name] = capacity_and_resilver(args, name + "c", parity, width)
            print(f"{name}: {json.dumps(once[name])}", flush=True)
    finally:
        for proc in SERVERS:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for name, _, _ in LAYOUTS:
            destroy(args, name)
            destroy(args, name + "c")
        if args.cap:
            args.cap.remove()
    finished = datetime.datetime.now(datetime.timezone.utc)
    report = render(args, rows, once, started, finished)
    print(report)
    if args.report:
        open(args.report, "w").write(report)
    shutil.rmtree(args.dir, ignore_errors=True)


def median(rows, key):
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def render(args, rows, once, started, finished):
    cpu = platform.processor() or "?"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except StopIteration:
        pass
    fio_version = run("fio", "--version").stdout.strip()
    lines = [
        f"# RAID-Z against a 2-way mirror of the same files, {started:%Y-%m-%d %H:%M}Z",
        "",
        f"Command: `bench/raidz.py --rounds {args.rounds} --seconds {args.seconds} "
        f"--usable-size {args.usable_size} --capacity-leaf-size {args.capacity_leaf_size}"
        + (f" --cap-bytes {args.cap_bytes}" if args.cap else "")
        + (f" --jobs {args.jobs}" if args.jobs else "")
        + (" --no-capacity" if args.no_capacity else "")
        + f"` ({started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC). "
        f"Machine: {os.cpu_count()} cores ({cpu}), "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') >> 30} GiB, every leaf a "
        f"file on one ext4 filesystem on one virtio disk; {fio_version} over NBD (TCP, "
        "loopback). Medians of the rounds; the layouts alternate their order each round.",
        "",
        "| job | " + " | ".join(name for name, _, _ in LAYOUTS) + " | raidz1x4 / mirror | "
        "raidz2x6 / mirror |",
        "|---|" + "---|" * (len(LAYOUTS) + 2),
    ]
    for job in JOBS:
        key = "mib_s" if job.startswith("seq") else "iops"
        unit = "MiB/s" if key == "mib_s" else "IOPS"
        vals = [median(rows[name][job], key) for name, _, _ in LAYOUTS]
        lines.append(f"| {job} ({unit}) | " + " | ".join(f"{v:,.0f}" for v in vals) +
                     f" | {vals[1] / vals[0]:.2f}x | {vals[2] / vals[0]:.2f}x |")
    lines += ["", "Server CPU per operation (µs; per MiB for the sequential jobs, ms) and, for "
              "writes, bytes the leaves wrote per byte written:", "",
              "| job | " + " | ".join(f"{n} CPU | {n} device/logical" for n, _, _ in LAYOUTS)
              + " |", "|---|" + "---|---|" * len(LAYOUTS)]
    for job in JOBS:
        key = "cpu_ms_mib" if job.startswith("seq") else "cpu_us_op"
        cells = []
        for name, _, _ in LAYOUTS:
            amp = median(rows[name][job], "device_per_logical")
            cells.append(f"{median(rows[name][job], key):.1f} | "
                         + ("-" if amp != amp else f"{amp:.2f}"))
        lines.append(f"| {job} | " + " | ".join(cells) + " |")
    # Per-round ratios: each round runs every layout back to back, so its ratio is taken
    # within one stretch of the disk's weather, which swings more between minutes than
    # between layouts.
    lines += ["", "Per-round ratios against the mirror (each round's layouts run back to back); "
              "median and range:", "",
              "| job | " + " | ".join(f"{n} / mirror, rounds" for n, _, _ in LAYOUTS[1:])
              + " | " + " | ".join(f"{n} / mirror, median (range)" for n, _, _ in LAYOUTS[1:])
              + " |", "|---|" + "---|" * (2 * (len(LAYOUTS) - 1))]
    for job in JOBS:
        key = "mib_s" if job.startswith("seq") else "iops"
        rounds, summary = [], []
        for name, _, _ in LAYOUTS[1:]:
            ratios = [r[key] / m[key] for r, m in zip(rows[name][job], rows["mirror"][job])]
            rounds.append(", ".join(f"{x:.2f}" for x in ratios))
            summary.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                           if ratios else "-")
        lines.append(f"| {job} | " + " | ".join(rounds) + " | " + " | ".join(summary) + " |")
    if not once:
        return "\n".join(lines) + "\n"
    lines += ["", "Once per layout: incompressible data written into a thin volume of 128 KiB "
              "blocks until ENOSPC, against the sum of the leaf sizes; then `pool replace -w` "
              "of one leaf with a new file (the resilver rebuilds that leaf's share of what was "
              "allocated).", "",
              "| layout | usable / leaf bytes | written | allocated (raw) | resilver | "
              "resilver per GiB allocated |", "|---|---|---|---|---|---|"]
    for name, _, _ in LAYOUTS:
        if name not in once:
            continue
        o = once[name]
        lines.append(f"| {name} | {o['usable']:.3f} | {o['written'] / 2**30:.2f} GiB | "
                     f"{o['allocated'] / 2**30:.2f} GiB | {o['resilver_s']:.1f} s | "
                     f"{o['resilver_s_gib']:.1f} s |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
