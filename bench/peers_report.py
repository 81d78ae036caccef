"""Turns bench/peers.sh results into docs/bench/peers.md (goals, tables) and peers.svg (plot).

Usage: peers_report.py RESULTS.jsonl META.json OUT.md OUT.svg

RESULTS.jsonl holds one line per round, job and target (fio's figures, the server's CPU and
context switches per operation); META.json what peers.sh ran and how. Every figure shown is
the median over the rounds, each metric on its own; the spread is the rounds' min-max.
"""
import json
import os
import platform
import statistics
import subprocess
import sys

results_path, meta_path, md_path, svg_path = sys.argv[1:]
meta = json.load(open(meta_path))
rows = [json.loads(line) for line in open(results_path) if line.strip()]
targets = [t["name"] for t in meta["targets"]]
jobs = meta["jobs"]
labels = {
    "syncwrite-1": "4K random write + flush, 1 job",
    "syncwrite-8": "4K random write + flush, 8 jobs",
    "syncwrite-32": "4K random write + flush, 32 jobs",
    "randread-qd32": "4K random read, QD 32",
    "seqread-1m": "1M sequential read",
    "seqwrite-1m": "1M sequential write",
    "syncwrite-1m-1": "1M sequential write + flush, 1 job",
    "syncwrite-1m-4": "1M sequential write + flush, 4 jobs",
    "seqwrite-1m-z": "1M sequential write, compressible",
    "syncwrite-1m-1-z": "1M sequential write + flush, 1 job, compressible",
    "syncwrite-1m-4-z": "1M sequential write + flush, 4 jobs, compressible",
    "mixed-8": "4K+8K random write, flush every 4, 8 jobs",
}
names = {
    "raw": "raw file",
    "sluice-nocache": "sluice, no data cached",
    "sluice-before": "sluice before (--before)",
    "sluice-nocache-before": "sluice, no data cached, before (--before)",
    "sluice-nolz4": "sluice, compression off",
}
for t in targets:
    if t.startswith("sluice-nocache-bs"):
        names[t] = f"sluice, no data cached, {t[len('sluice-nocache-bs'):]} blocks"
    elif t.startswith("sluice-bs"):
        names[t] = f"sluice, {t[len('sluice-bs'):]} blocks"
PEERS = ("qemu-nbd", "nbdkit")
# The flush tail is judged only over this many rounds or more.
FLUSH_TAIL_ROUNDS_MIN = 5


def mb_job(job):
    """The 1 MiB jobs are given in MB/s, the others in IOPS."""
    return "1m" in job


def headline(job):
    return "mb_s" if mb_job(job) else "iops"


runs = {}  # (job, target) -> successful rows, by round
errors = {}
for r in rows:
    if "error" in r:
        errors.setdefault((r["job"], r["target"]), []).append(r)
    else:
        runs.setdefault((r["job"], r["target"]), []).append(r)


def values(job, target, key):
    return [r[key] for r in runs.get((job, target), []) if r.get(key) is not None]


def median(job, target, key):
    v = values(job, target, key)
    return statistics.median(v) if v else None


def by_round(job, target, key):
    return {r["round"]: r[key] for r in runs.get((job, target), []) if r.get(key) is not None}


def cpu_total(job, target):
    """CPU per operation while fio ran plus, for a write job, the sync that followed it."""
    cpu = median(job, target, "cpu_us_op")
    if cpu is None:
        return None
    return cpu + (median(job, target, "settle_cpu_us_op") or 0.0)


def machine_cpu_rounds(job, target):
    """The machine's busy CPU per operation, each round: while fio ran, plus the job's end
    flush and, for sluice, the sync after it (both over all the job's operations)."""
    return {
        r["round"]: r["mcpu_us_op"] + r.get("end_mcpu_us_op", 0.0) + r.get("settle_mcpu_us_op", 0.0)
        for r in runs.get((job, target), [])
        if r.get("mcpu_us_op") is not None
    }


def machine_cpu(job, target):
    v = list(machine_cpu_rounds(job, target).values())
    return statistics.median(v) if v else None


def spread(job, target, key):
    v = values(job, target, key)
    return max(v) - min(v) if v else None


def best_peer(job):
    """The peer with the higher median headline figure in this job."""
    have = [p for p in PEERS if median(job, p, headline(job)) is not None]
    return max(have, key=lambda p: median(job, p, headline(job))) if have else None


def paired_rounds(job, a, b, key):
    """Each round's figure of target a over target b's in the same round."""
    ra, rb = by_round(job, a, key), by_round(job, b, key)
    return [ra[k] / rb[k] for k in sorted(ra) if rb.get(k)]


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt(v, digits=None):
    if v is None:
        return "n/a"
    if digits is None:
        digits = 0 if abs(v) >= 10 else 1
    return f"{v:,.{digits}f}"


def fmt_ratio(v):
    return "n/a" if v is None else f"{v:.2f}x"


def shell(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine():
    mem_gib = 0
    try:
        mem_gib = round(int(open("/proc/meminfo").readline().split()[1]) / (1 << 20))
    except (OSError, ValueError, IndexError):
        pass
    fs = shell("df", "--output=fstype,source", meta["dir"]).splitlines()
    fstype, source = fs[-1].split() if len(fs) > 1 else ("?", "?")
    # The disk under the filesystem: the partition's parent, else the device itself.
    disk = shell("lsblk", "-ndo", "PKNAME", source) or os.path.basename(source)
    info = shell("lsblk", "-ndo", "MODEL,SIZE,ROTA", f"/dev/{disk}").split()
    kind = ""
    if len(info) >= 2:
        # As the kernel reports it: a virtio disk says rotational unless the host tells it.
        rota = {"0": "non-rotational", "1": "rotational"}.get(info[-1], "")
        model = " ".join(info[:-2]) or ("virtio" if disk.startswith("vd") else "")
        kind = ", ".join(x for x in [model, info[-2], rota and f"{rota} per the kernel"] if x)
    return (
        f"{shell('nproc')}-core {cpu_model()}, {mem_gib} GiB, {platform.system()} "
        f"{platform.release()}; data dir {meta['dir']} on {fstype} ({source}), disk {disk}"
        + (f" ({kind})" if kind else "")
    )


def cmd_line():
    built = (
        f"sluice binary built from commit {meta['commit']}"
        if meta["built"]
        else f"sluice binary not rebuilt (`--no-build`; built {meta['binary_mtime']}, "
        f"tree at commit {meta['commit']})"
    )
    return (
        f"Command: `{meta['command']}` ({meta['rounds']} rounds of {meta['seconds']} s per job "
        f"after {meta['ramp']} s of ramp; {built}). Machine: {machine()}. "
        f"Run {meta['started']} to {meta['finished']}. {meta['fio']}, {meta['qemu_nbd']}, "
        f"{meta['nbdkit']}."
    )


out = ["# sluice against qemu-nbd, nbdkit and the raw file\n", cmd_line() + "\n"]
out.append("Targets, each on files in the data dir, all served side by side:\n")
for t in meta["targets"]:
    only = "" if set(jobs) <= set(t["jobs"]) else f" Jobs: {', '.join(t['jobs'])}."
    out.append(f"- **{t['name']}**: {t['description']}.{only}")
warmup = meta.get("warmup", 0)
prepared = (
    f"written once and then warmed up before the first round ({warmup} s of 4 KiB random writes "
    f"at queue depth 32 and {warmup} s of 1 MiB sequential writes at queue depth 8, unmeasured)"
    if warmup
    else "written once before the first round"
)
# Runs before the cap was recorded had none.
cap = meta.get("page_cache_cap", "none")
read_cap = (
    f", and while one runs nbdkit (whose file plugin reads through it even with cache=none) may "
    f"hold no more than {int(cap) >> 20} MiB of it above its own memory (a memory cgroup): room "
    "for the kernel's readahead, which counts, but not for what an earlier pass over the span "
    "read (\"disk KiB/op\" shows what the disk read per read)"
    if cap != "none"
    else ", but no memory cgroup bounded it while a job ran: a peer's reads may come from what an "
    "earlier pass over the span left there (see \"disk KiB/op\")"
)
out.append(
    f"\nEach round runs every job on every target in turn (the order of targets rotated each "
    f"round); every figure is the median of the {meta['rounds']} rounds, each metric on its own, "
    f"with the rounds' range beside the headline figure. Jobs work in the first {meta['span']} "
    f"of each image or volume, {prepared}. Latencies are fio's "
    "completion latencies (for write + flush jobs, of the write; the flush's are separate, and "
    "\"write + flush mean\" adds the two means: how long a durable write takes, on average). "
    "CPU is the server process's user + system time (/proc/PID/stat) and ctx the context "
    "switches of all its threads (/proc/PID/task/*/status), both sampled inside fio's measured "
    "period and divided by the operations done meanwhile; an operation of a write + flush job is "
    "one write and its flush. For sluice's write jobs, \"+N\" is the CPU per operation of the "
    "txg the job left open, measured after fio ends while `sluice pool sync` writes it out "
    "(before the next target runs); the CPU goals count it. Machine CPU is the busy time of "
    "every CPU (/proc/stat: user, nice, system, irq, softirq; fio's own included, alike for "
    "every NBD target) in the same period per operation, plus, for a job that ends with a "
    "flush, the time to fio's exit and, for sluice's write jobs, its sync after the job, both "
    "over all the job's operations: kernel threads writing back a peer's page cache are "
    "charged to no process. The 1M sequential write jobs end with a flush (fio --end_fsync=1) "
    "and their MB/s are durable: the bytes over the time from the ramp's end to fio's exit. "
    f"The kernel's page cache is dropped before every read job{read_cap}. The -z jobs write data that "
    "compresses to about half (fio --buffer_compress_percentage=50 --refill_buffers); the "
    "others fio's default random buffers, which lz4 cannot shrink. mixed-8 works over the "
    "whole volume. \"disk KiB/op\" is what the device under the data dir read (read jobs) or "
    "wrote (the others) in the measured period per operation, one target running at a time; "
    "for writes, \"+N\" is what it wrote after that period, over all the job's operations: the "
    "end flush and, for sluice, the sync after the job.\n"
)

# The goals, judged from the medians (and, for the flush tail, from each round's pair).
out.append("## Goals\n")
out.append(
    "Against the best peer in each row (qemu-nbd or nbdkit, whichever has the higher median): "
    "sluice at least that peer's median less the spread of its rounds, or at least 0.95x the "
    "raw file where the peer is at the disk's own rate (within 5% of the raw file); where a "
    "stalled round of the peer puts that bar at or below zero, the row is not judged (n/a) "
    "unless it passes by the raw file. sluice "
    "runs with its defaults for the write rows and caches no data (cache.contents=metadata) "
    "for the read rows, as the peers read from the disk; the cached reads are shown below. "
    "Machine CPU per MiB of the 1 MiB write jobs, sluice with compression off against the "
    "peer with the lower CPU; lz4's own cost is the default's CPU less that. The flush tail: "
    "the median over rounds of sluice's flush p99 over qemu-nbd's in the same round, with the "
    "rounds' range.\n"
)
out.append("| goal | measured | per round / spread | met |")
out.append("|---|---|---|---|")


def goal(text, measured, per_round, met):
    out.append(f"| {text} | {measured} | {per_round} | {'n/a' if met is None else 'yes' if met else 'no'} |")


def read_row(job):
    return "read" in job


for job in jobs:
    peer = best_peer(job)
    me = "sluice-nocache" if read_row(job) and (job, "sluice-nocache") in runs else "sluice"
    key = headline(job)
    s_, p_, raw = median(job, me, key), median(job, peer, key) if peer else None, median(job, "raw", key)
    if s_ is None or p_ is None:
        continue
    bar = p_ - (spread(job, peer, key) or 0.0)
    # At the disk's own rate: within 5% of the raw file either way. A peer well above it reads
    # or writes through the kernel's page cache (nbdkit's 1 MiB reads ran at 2.8x the raw file
    # on 2026-12-01, re-reading from memory what earlier passes over the span had read, before
    # peers.sh bounded the peers' page cache during reads), and a run whose raw file ran slow
    # must not lower sluice's bar to that.
    at_disk = raw is not None and 0.95 * raw <= p_ <= 1.05 * raw
    # A round in which the disk stalled under the peer (2026-12-06: nbdkit's 1 MiB reads at 48
    # MB/s in one round, 1,554 the median) puts its median less the spread at or below zero,
    # which any figure passes: such a row is not judged on that bar.
    stalled = bar <= 0
    met = True if at_disk and s_ >= 0.95 * raw else None if stalled else s_ >= bar
    unit = "MB/s" if key == "mb_s" else "IOPS"
    rounds = ", ".join(fmt_ratio(x) for x in paired_rounds(job, me, peer, key)) or "n/a"
    goal(
        f"{labels[job]}: {names.get(me, me)} >= best peer ({peer}) less its spread"
        + (" or 0.95x raw" if at_disk else ""),
        f"{fmt_ratio(ratio(s_, p_))} ({fmt(s_)} against {fmt(p_)} {unit}; bar {fmt(bar)}"
        + (f", raw {fmt(raw)}" if raw is not None else "")
        + ("; a round of the peer stalled: not judged on its spread" if stalled else "") + ")",
        rounds,
        met,
    )
for job in [j for j in jobs if "1m" in j and "write" in j]:
    peers_cpu = {p: machine_cpu(job, p) for p in PEERS if machine_cpu(job, p) is not None}
    off, on = machine_cpu(job, "sluice-nolz4"), machine_cpu(job, "sluice")
    if not peers_cpu or off is None:
        continue
    low = min(peers_cpu, key=peers_cpu.get)
    lz4 = None if on is None else on - off
    goal(
        f"{labels[job]}: machine CPU per MiB, compression off <= {low}'s",
        f"{fmt_ratio(ratio(off, peers_cpu[low]))} ({fmt(off)} against {fmt(peers_cpu[low])} us; "
        f"with lz4 {fmt(on)} us, lz4's own {fmt(lz4)} us)",
        ", ".join(
            fmt_ratio(a / b)
            for k, a in sorted(machine_cpu_rounds(job, "sluice-nolz4").items())
            if (b := machine_cpu_rounds(job, low).get(k))
        ) or "n/a",
        off <= peers_cpu[low],
    )
for job in ["syncwrite-1", "syncwrite-8", "syncwrite-32"]:
    if job not in jobs:
        continue
    pairs = paired_rounds(job, "sluice", "qemu-nbd", "flush_p99_us")
    if not pairs:
        continue
    mid = statistics.median(pairs)
    # A p99 swings between rounds more than a median does: judged over five rounds or more.
    enough = len(pairs) >= FLUSH_TAIL_ROUNDS_MIN
    goal(
        f"{labels[job]}: flush p99 <= qemu-nbd's (paired by round, {FLUSH_TAIL_ROUNDS_MIN}+ rounds)",
        f"{fmt_ratio(mid)} (medians {fmt(median(job, 'sluice', 'flush_p99_us'))} against "
        f"{fmt(median(job, 'qemu-nbd', 'flush_p99_us'))} us; {len(pairs)} rounds"
        + ("" if enough else f", too few to judge: run --rounds {FLUSH_TAIL_ROUNDS_MIN}") + ")",
        f"{fmt_ratio(min(pairs))} to {fmt_ratio(max(pairs))}",
        mid <= 1.0 if enough else None,
    )
if "syncwrite-1" in jobs:
    s_, raw = median("syncwrite-1", "sluice", "durable_mean_us"), median("syncwrite-1", "raw", "durable_mean_us")
    if s_ is not None and raw:
        goal(
            "4K write + flush, 1 job: mean durable write <= 1.3x the raw file's write + fdatasync",
            f"{fmt_ratio(s_ / raw)} ({fmt(s_)} against {fmt(raw)} us)",
            ", ".join(fmt_ratio(x) for x in paired_rounds("syncwrite-1", "sluice", "raw", "durable_mean_us")),
            s_ <= 1.3 * raw,
        )
if "mixed-8" in jobs:
    for me in ["sluice", "sluice-nocache"] + [t for t in targets if t.startswith("sluice-nocache-bs")]:
        s_, q = median("mixed-8", me, "iops"), median("mixed-8", "qemu-nbd", "iops")
        cs, cq = machine_cpu("mixed-8", me), machine_cpu("mixed-8", "qemu-nbd")
        if None in (s_, q, cs, cq):
            continue
        goal(
            f"{labels['mixed-8']}: {names.get(me, me)} >= 1.2x qemu-nbd's IOPS at no more machine CPU per op",
            f"{fmt_ratio(s_ / q)} IOPS ({fmt(s_)} against {fmt(q)}); CPU {fmt_ratio(cs / cq)} "
            f"({fmt(cs)} against {fmt(cq)} us)",
            ", ".join(fmt_ratio(x) for x in paired_rounds("mixed-8", me, "qemu-nbd", "iops")),
            s_ >= 1.2 * q and cs <= cq,
        )
if "sluice-mirror" in targets:
    for job in jobs:
        m, one = median(job, "sluice-mirror", headline(job)), median(job, "sluice", headline(job))
        if m is None or not one:
            continue
        bound = 1.0 if read_row(job) else 0.5
        goal(
            f"{labels[job]}: 2-way mirror >= {bound}x one leaf",
            f"{fmt_ratio(m / one)} ({fmt(m)} against {fmt(one)})",
            ", ".join(fmt_ratio(x) for x in paired_rounds(job, "sluice-mirror", "sluice", headline(job))),
            m / one >= bound,
        )

# The intent log's `auto` against the better fixed policy, when the run has all three: `auto`
# is the default, so the plain sluice target is it unless a target sets it explicitly. Within
# 5% of the better one in IOPS (MB/s), and in the durable write's mean latency (write + flush)
# within 5% or 20 us. Beside the medians, the median over rounds of auto's figure over the
# better policy's in the same round (the better one by the medians: taking each round's better
# of two would favour the fixed policies by their noise): the targets of one round run seconds
# apart, so pairing them cancels most of this VM's minute-to-minute swings.
policy = {p: f"sluice[intent_log.policy={p}]" for p in ("auto", "batch", "pipelined")}
if policy["auto"] not in targets:
    policy["auto"] = "sluice"
policy_jobs = [
    j for j in jobs
    if j.startswith("syncwrite")
    and all(median(j, t, k) for t in policy.values() for k in (headline(j), "durable_mean_us"))
]


def paired(job, a, b, key):
    """The median over rounds of target a's figure over target b's in the same round."""
    ra, rb = by_round(job, a, key), by_round(job, b, key)
    ratios = [ra[k] / rb[k] for k in ra if rb.get(k)]
    return statistics.median(ratios) if ratios else None


if policy_jobs:
    out.append("\n## The intent log's auto policy against the better fixed one\n")
    out.append(
        f"`auto` is {policy['auto']}. Bounds: IOPS (MB/s) at least 0.95x the better of batch "
        "and pipelined; write + flush mean latency at most 1.05x the better one's or 20 us "
        "above it. \"Paired\" is the median over rounds of auto's figure over the better "
        "policy's (by the medians) in the same round.\n"
    )
    out.append(
        "| job | auto | batch | pipelined | auto / better | paired | "
        "auto latency us | better latency us | paired | met |"
    )
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for job in policy_jobs:
        key = headline(job)
        fixed = (policy["batch"], policy["pipelined"])
        best = max(fixed, key=lambda t: median(job, t, key))
        fast = min(fixed, key=lambda t: median(job, t, "durable_mean_us"))
        a, b, p, top = (median(job, t, key) for t in (policy["auto"], *fixed, best))
        la, lb = (median(job, t, "durable_mean_us") for t in (policy["auto"], fast))
        met = a >= 0.95 * top and (la <= 1.05 * lb or la - lb <= 20)
        out.append(
            f"| {labels[job]} | {fmt(a)} | {fmt(b)} | {fmt(p)} | {fmt_ratio(a / top)} | "
            f"{fmt_ratio(paired(job, policy['auto'], best, key))} | {fmt(la)} | {fmt(lb)} | "
            f"{fmt_ratio(paired(job, policy['auto'], fast, 'durable_mean_us'))} | "
            f"{'yes' if met else 'no'} |"
        )

# One line per job: the headline figure of every target.
out.append("\n## Summary\n")
out.append("IOPS (MB/s for the 1M jobs), medians.\n")
shown = [t for t in targets if any((j, t) in runs for j in jobs)]
compared = [t for t in ["sluice", "sluice-nocache"] if t in shown]
out.append(
    "| job | " + " | ".join(names.get(t, t) for t in shown)
    + "".join(f" | {names.get(t, t)} / qemu-nbd" for t in compared) + " |"
)
out.append("|---|" + "---:|" * (len(shown) + len(compared)))
for job in jobs:
    key = headline(job)
    cells = [fmt(median(job, t, key)) if (job, t) in runs else "-" for t in shown]
    cells += [fmt_ratio(ratio(median(job, t, key), median(job, "qemu-nbd", key))) for t in compared]
    out.append(f"| {labels[job]} | " + " | ".join(cells) + " |")

# With --before: this tree against the binary before it, job by job, IOPS (or MB/s) and CPU
# per operation, with each round's ratio (the rounds' spread is what "within" means); the
# uncached targets' rows too where both ran.
pairs = [(me, then) for me, then in [("sluice", "sluice-before"), ("sluice-nocache", "sluice-nocache-before")]
         if then in shown]
if pairs:
    out.append("\n## This tree against the binary before (--before)\n")
    out.append("| job | sluice / before | per round | CPU per op: sluice / before | per round |")
    out.append("|---|---:|---|---:|---|")
    for me, then_t in pairs:
        for job in jobs:
            if (job, me) not in runs or (job, then_t) not in runs:
                continue
            key = headline(job)
            now, then = by_round(job, me, key), by_round(job, then_t, key)
            cpu_now = by_round(job, me, "cpu_us_op")
            cpu_then = by_round(job, then_t, "cpu_us_op")
            per = lambda a, b: ", ".join(fmt_ratio(a[k] / b[k]) for k in sorted(a) if b.get(k)) or "n/a"
            label = labels[job] + (", no data cached" if me == "sluice-nocache" else "")
            out.append(
                f"| {label} | {fmt_ratio(ratio(median(job, me, key), median(job, then_t, key)))} "
                f"| {per(now, then)} "
                f"| {fmt_ratio(ratio(median(job, me, 'cpu_us_op'), median(job, then_t, 'cpu_us_op')))} "
                f"| {per(cpu_now, cpu_then)} |"
            )

# Per job: every metric of every target.
out.append("\n## Per job\n")
for job in jobs:
    key = headline(job)
    flush = any(values(job, t, "flush_p50_us") for t in targets)
    unit = "MB/s" if key == "mb_s" else "IOPS"
    out.append(f"### {labels[job]}\n")
    head = f"| target | {unit} | range | / qemu-nbd | p50 us | p99 us |"
    head += " flush p50 us | flush p99 us | write + flush mean us |" if flush else ""
    # What the disk read per read, or wrote per write (the whole disk, while only this target
    # ran): a read row served from memory, or a write row's amplification, shows here.
    disk_key = "disk_read_kib_op" if read_row(job) else "disk_written_kib_op"
    out.append(head + " CPU us/op | machine CPU us/op | ctx/op | disk KiB/op |")
    out.append("|---|" + "---:|" * (12 if flush else 9))
    metrics = ["p50_us", "p99_us"] + (["flush_p50_us", "flush_p99_us", "durable_mean_us"] if flush else [])
    for t in targets:
        if (job, t) not in runs and (job, t) not in errors:
            continue
        v = values(job, t, key)
        spread = f"{fmt(min(v))}-{fmt(max(v))}" if v else "n/a"
        failed = len(errors.get((job, t), []))
        if failed:
            spread += f" ({failed} failed)"
        cells = [fmt(median(job, t, key)), spread, fmt_ratio(ratio(median(job, t, key), median(job, "qemu-nbd", key)))]
        cells += [fmt(median(job, t, m)) for m in metrics]
        if t == "raw":
            cells += ["-", fmt(machine_cpu(job, t)), "-"]
        else:
            cpu = fmt(median(job, t, "cpu_us_op"))
            settle = median(job, t, "settle_cpu_us_op")
            if settle is not None:
                cpu += f" (+{fmt(settle)})"
            cells += [cpu, fmt(machine_cpu(job, t)), fmt(median(job, t, "ctx_op"), 2)]
        disk = fmt(median(job, t, disk_key), 1)
        tail = median(job, t, "end_disk_written_kib_op") if not read_row(job) else None
        if tail is not None and disk != "n/a":
            disk += f" (+{fmt(tail, 1)})"
        cells.append(disk)
        out.append(f"| {names.get(t, t)} | " + " | ".join(cells) + " |")
    if (job, "sluice") in runs and (job, "qemu-nbd") in runs:
        cells = [fmt_ratio(ratio(median(job, "sluice", key), median(job, "qemu-nbd", key))), "", ""]
        cells += [fmt_ratio(ratio(median(job, "sluice", m), median(job, "qemu-nbd", m))) for m in metrics]
        cells += [fmt_ratio(ratio(cpu_total(job, "sluice"), median(job, "qemu-nbd", "cpu_us_op"))),
                  fmt_ratio(ratio(machine_cpu(job, "sluice"), machine_cpu(job, "qemu-nbd"))),
                  fmt_ratio(ratio(median(job, "sluice", "ctx_op"), median(job, "qemu-nbd", "ctx_op"))),
                  fmt_ratio(ratio(median(job, "sluice", disk_key), median(job, "qemu-nbd", disk_key)))]
        out.append("| *sluice / qemu-nbd* | " + " | ".join(cells) + " |")
    out.append("")

failed = [r for r in rows if "error" in r]
if failed:
    out.append("Failed runs (left out of the medians):\n")
    out += [f"- round {r['round']}, {labels.get(r['job'], r['job'])}, {r['target']}: {r['error']}" for r in failed]
    out.append("")
out.append(f"![IOPS and bandwidth relative to the raw file]({os.path.basename(svg_path)})\n")
# The analysis of the latest run, kept by hand next to the generated tables (peers-notes.md
# for peers.md; a report elsewhere takes its own NAME-notes.md if there is one).
notes = md_path[:-3] + "-notes.md" if md_path.endswith(".md") else md_path + "-notes.md"
try:
    out.append(open(notes).read())
except OSError:
    pass
open(md_path, "w").write("\n".join(out) + "\n")

# The plot: for each job, each target's median as a share of the raw file's, with the rounds'
# range as a whisker. The memory plugin can be many times the disk's figure; bars are cut at
# `cap` so the others stay readable, and their labels give the real share.
palette = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#8cd17d", "#b6992d", "#499894", "#d37295", "#9d7660"]
colors = {"raw": "#888888"}
for i, t in enumerate(t for t in targets if t != "raw"):
    colors[t] = palette[i % len(palette)]
plotted = [j for j in jobs if any((j, t) in runs for t in targets)]
width, left, bar_h = 780, 250, 9
group_h = lambda job: bar_h * sum((job, t) in runs for t in targets) + 14
height = 50 + sum(group_h(j) for j in plotted) + 30
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">']
svg.append(f'<text x="10" y="20" font-size="14">Share of the raw file\'s IOPS / bandwidth (longer is better; median of {meta["rounds"]} rounds, whisker: range)</text>')
cap = 2.5
scale_max = 1.0
for job in plotted:
    raw = median(job, "raw", headline(job)) or 1.0
    for t in targets:
        for v in values(job, t, headline(job)):
            scale_max = max(scale_max, min(cap, v / raw))
bar_w = (width - left - 130) / scale_max
y = 40
for job in plotted:
    key = headline(job)
    raw = median(job, "raw", key) or 1.0
    svg.append(f'<text x="10" y="{y + 12}">{labels[job]}</text>')
    for t in targets:
        if (job, t) not in runs:
            continue
        share = median(job, t, key) / raw
        lo, hi = (min(values(job, t, key)) / raw, max(values(job, t, key)) / raw)
        w = min(share, cap) * bar_w
        svg.append(f'<rect x="{left}" y="{y:.1f}" width="{w:.1f}" height="{bar_h - 1}" fill="{colors[t]}"/>')
        x0, x1 = left + min(lo, cap) * bar_w, left + min(hi, cap) * bar_w
        mid = y + (bar_h - 1) / 2
        svg.append(f'<line x1="{x0:.1f}" y1="{mid:.1f}" x2="{x1:.1f}" y2="{mid:.1f}" stroke="#000" stroke-width="0.8"/>')
        mark = " (cut)" if share > cap else ""
        svg.append(f'<text x="{max(w, x1 - left) + left + 4:.1f}" y="{y + bar_h - 1.5:.1f}" font-size="8">{t} {share:.2f}{mark}</text>')
        y += bar_h
    y += 14
svg.append(f'<line x1="{left + bar_w:.1f}" y1="35" x2="{left + bar_w:.1f}" y2="{y}" stroke="#000" stroke-dasharray="3,3"/>')
svg.append(f'<text x="{left + bar_w - 30:.1f}" y="{y + 14}">raw = 1.0</text>')
svg.append("</svg>")
open(svg_path, "w").write("\n".join(svg) + "\n")
