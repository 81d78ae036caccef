#!/usr/bin/python3
"""Encrypted volumes against volumes that are not, on the same pool (docs/bench/encryption.md).

One 2-way mirror of two files (written in full with zeros first, as bench/raidz.py does, so
that neither volume pays for the filesystem's first writes) holds four thin volumes: p16 and
e16 (16 KiB blocks, 192 MiB, the second encrypted), p128 and e128 (128 KiB blocks, 1 GiB, the
second encrypted; aes-256-gcm, a raw key in a file that `sluice serve` loads at start). The
pool is served with its defaults for the writes, then again with `cache.contents=metadata` for
the reads, so that they reach the leaves (and are decrypted) rather than the block cache; each
volume is written in full before the first round.
fio runs over NBD; in each round, each job runs on both volumes, the order alternating.

  w4k-1, w4k-8, w4k-32   4 KiB random writes, a flush after each (fio --fsync=1), 1/8/32 jobs
  w1m-flush              1 MiB sequential writes, a flush after each, one job, incompressible
  r1m                    1 MiB sequential reads, 8 in flight (what the volume holds)

Each job's server CPU time (/proc/PID/stat, user + system) is given per operation (4 KiB
jobs) or per MiB (1 MiB jobs). The table gives medians of the rounds and the ratio encrypted /
not.

usage: bench/encryption.py [--rounds N] [--seconds S] [--dir DIR] [--report F] [--jobs J,...]
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import raidz  # noqa: E402  (the served pool, fio and leaf helpers)

JOBS = ["w4k-1", "w4k-8", "w4k-32", "w1m-flush", "r1m"]
POOL = "crypt"
LEAF_BYTES = 3 << 30


def job_args(job, seconds):
    timed = ["--time_based", f"--runtime={seconds}", "--ramp_time=1"]
    if job.startswith("w4k-"):
        return "16", ["--rw=randwrite", "--bs=4k", "--fsync=1", "--iodepth=1",
                      f"--numjobs={job.split('-')[1]}", "--size=192M", *timed]
    if job == "w1m-flush":
        return "128", ["--rw=write", "--bs=1M", "--fsync=1", "--iodepth=1", "--size=1G",
                       "--refill_buffers", *timed]
    return "128", ["--rw=read", "--bs=1M", "--iodepth=8", "--size=1G", *timed]


def measure(args, served, volume, job):
    raidz.run(args.bin, "pool", "sync", POOL, env=args.env)
    ticks = served.cpu_ticks()
    result = raidz.fio(args, served, volume, job, job_args(job, args.seconds)[1])["jobs"][0]
    ticks = served.cpu_ticks() - ticks
    side = result["read" if job == "r1m" else "write"]
    # fio's rates leave the ramp out; the CPU counter includes it: both over the same span.
    span = args.seconds + 1
    ops_all, bytes_all = side["iops"] * span, side["bw_bytes"] * span
    cpu_s = ticks / os.sysconf("SC_CLK_TCK")
    return {"iops": side["iops"], "mib_s": side["bw_bytes"] / 2**20,
            "cpu_us_op": cpu_s / max(ops_all, 1) * 1e6,
            "cpu_ms_mib": cpu_s / max(bytes_all / 2**20, 1e-9) * 1e3,
            "lat_p99_us": side["clat_ns"]["percentile"].get("99.000000", 0) / 1e3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="target/release/sluice")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--dir", default="/var/tmp/sluice-crypt-bench")
    parser.add_argument("--report")
    parser.add_argument("--jobs", help="comma-separated subset of the jobs (all by default)")
    args = parser.parse_args()
    if args.jobs:
        JOBS[:] = [j for j in JOBS if j in args.jobs.split(",")]
    args.bin = os.path.realpath(args.bin)
    args.dir = os.path.realpath(args.dir)
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    args.env = dict(os.environ, SLUICE_CACHE_FILE=os.path.join(args.dir, "pools.cache"))
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = {kind: {job: [] for job in JOBS} for kind in ("p", "e")}
    served = None
    try:
        files = [os.path.join(args.dir, f"{POOL}-{i}.img") for i in range(2)]
        for f in files:
            raidz.write_leaf(f, LEAF_BYTES)
        raidz.run(args.bin, "pool", "create", POOL, "mirror", *files, env=args.env)
        key = os.path.join(args.dir, "key")
        with open(key, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(key, 0o600)
        for kind in ("p", "e"):
            crypt = (["--encryption", "on", "--keyformat", "raw", "--keylocation",
                      f"file://{key}"] if kind == "e" else [])
            raidz.run(args.bin, "vol", "create", f"{POOL}/{kind}16", "--size", "192M",
                      "--sparse", *crypt, env=args.env)
            raidz.run(args.bin, "vol", "create", f"{POOL}/{kind}128", "--size", "1G", "--sparse",
                      "--block-size", "128K", *crypt, env=args.env)
        served = raidz.Served(args, POOL)
        for kind in ("p", "e"):
            for size, total in (("16", "192M"), ("128", "1G")):
                raidz.fio(args, served, f"{kind}{size}", "prefill",
                          ["--rw=write", "--bs=1M", "--iodepth=8", f"--size={total}",
                           "--refill_buffers"])
        raidz.run(args.bin, "pool", "sync", POOL, env=args.env)
        # Writes with the defaults; reads, after a restart, with data left out of the cache.
        for phase in ("writes", "reads"):
            jobs = [j for j in JOBS if (j == "r1m") == (phase == "reads")]
            if phase == "reads" and jobs:
                served.stop()
                served = ServedMetadataCache(args, POOL)
            for r in range(args.rounds):
                for job in jobs:
                    order = ("p", "e") if r % 2 == 0 else ("e", "p")
                    for kind in order:
                        volume = kind + job_args(job, args.seconds)[0]
                        row = measure(args, served, volume, job)
                        rows[kind][job].append(row)
                        print(f"round {r} {volume} {job}: {json.dumps(row)}", flush=True)
        served.stop()
        served = None
    finally:
        for proc in raidz.SERVERS:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raidz.run(args.bin, "pool", "destroy", POOL, env=args.env, check=False)
    finished = datetime.datetime.now(datetime.timezone.utc)
    report = render(args, rows, started, finished)
    print(report)
    if args.report:
        open(args.report, "w").write(report)
    shutil.rmtree(args.dir, ignore_errors=True)


class ServedMetadataCache(raidz.Served):
    """The pool served with the block cache holding metadata only, so reads reach the leaves."""

    def __init__(self, args, name):
        serve_args = argparse.Namespace(**vars(args))
        real_bin = args.bin
        wrapper = os.path.join(args.dir, "serve-metadata-cache")
        with open(wrapper, "w") as f:
            f.write(f"#!/bin/sh\nexec {real_bin} \"$@\" --set cache.contents=metadata\n")
        os.chmod(wrapper, 0o755)
        serve_args.bin = wrapper
        super().__init__(serve_args, name)


def render(args, rows, started, finished):
    cpu = platform.processor() or "?"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                   if l.startswith("model name"))
    except StopIteration:
        pass
    fio_version = raidz.run("fio", "--version").stdout.strip()
    med = raidz.median
    lines = [
        f"# Encrypted volumes against volumes that are not, {started:%Y-%m-%d %H:%M}Z",
        "",
        f"Command: `bench/encryption.py --rounds {args.rounds} --seconds {args.seconds}"
        + (f" --jobs {args.jobs}" if args.jobs else "")
        + f"` ({started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC). "
        f"Machine: {os.cpu_count()} cores ({cpu}), "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') >> 30} GiB; a 2-way mirror "
        f"of two files on one ext4 filesystem on one virtio disk; {fio_version} over NBD (TCP, "
        "loopback); writes with the server's defaults, reads with cache.contents=metadata. "
        "Medians of the rounds; the volumes alternate their order each round.",
        "",
        "| job | not encrypted | encrypted | encrypted / not | CPU not | CPU encrypted | "
        "CPU encrypted / not | p99 not | p99 encrypted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for job in JOBS:
        key, unit = ("iops", "IOPS") if job.startswith("w4k") else ("mib_s", "MiB/s")
        cpu_key, cpu_unit = (("cpu_us_op", "µs/op") if job.startswith("w4k")
                             else ("cpu_ms_mib", "ms/MiB"))
        p, e = med(rows["p"][job], key), med(rows["e"][job], key)
        cp, ce = med(rows["p"][job], cpu_key), med(rows["e"][job], cpu_key)
        lp, le = med(rows["p"][job], "lat_p99_us"), med(rows["e"][job], "lat_p99_us")
        lines.append(f"| {job} ({unit}) | {p:,.0f} | {e:,.0f} | {e / p:.2f}x | "
                     f"{cp:.1f} {cpu_unit} | {ce:.1f} {cpu_unit} | {ce / cp:.2f}x | "
                     f"{lp:,.0f} µs | {le:,.0f} µs |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
