"""Turns bench/peers.sh results into docs/bench/peers.md (table, goals) and peers.svg (plot).

Usage: peers_report.py RESULTS.jsonl SECONDS OUT.md OUT.svg
"""
import datetime
import json
import platform
import subprocess
import sys

results_path, seconds, md_path, svg_path = sys.argv[1:]
rows = [json.loads(line) for line in open(results_path) if line.strip()]
targets = ["raw", "qemu-nbd", "nbdkit", "sluice", "sluice-nocache"]
jobs = ["syncwrite-1", "syncwrite-8", "syncwrite-32", "randread-qd32", "seqread-1m", "seqwrite-1m"]
labels = {
    "syncwrite-1": "4K random write + flush, 1 job",
    "syncwrite-8": "4K random write + flush, 8 jobs",
    "syncwrite-32": "4K random write + flush, 32 jobs",
    "randread-qd32": "4K random read, QD 32",
    "seqread-1m": "1M sequential read",
    "seqwrite-1m": "1M sequential write",
}
get = {(r["job"], r["target"]): r for r in rows}


def value(job, target, key="iops"):
    r = get.get((job, target), {})
    return r.get(key, 0.0) if "error" not in r else 0.0


def cpu():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


mem_gib = 0
try:
    mem_gib = round(int(open("/proc/meminfo").readline().split()[1]) / (1 << 20))
except (OSError, ValueError, IndexError):
    pass
cores = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
today = datetime.date.today().isoformat()

out = []
out.append("# sluice against qemu-nbd, nbdkit and the raw file\n")
out.append(
    f"Command: `bench/peers.sh --seconds {seconds}`. Machine: {cores}-core {cpu()}, {mem_gib} GiB, "
    f"{platform.system()} {platform.release()}; date {today}. All targets use files on the "
    "same filesystem, one after the other, with the same fio jobs (fio's nbd engine for the "
    "servers, libaio with O_DIRECT for the raw file). sluice serves a pool of one file leaf, "
    "as it comes (its block cache, like ZFS's ARC, is an eighth of memory and holds this "
    "volume) and caching no data (`--set cache.contents=metadata`, ZFS's "
    "primarycache=metadata), the fair match for the peers' cache=none. The goals are judged "
    "on the first. "
    "Figures: IOPS (MB/s for the 1M jobs), median and 99th percentile completion latency in us.\n"
)
out.append(
    "| job | raw file | qemu-nbd | nbdkit | sluice | sluice, no data cached | sluice / qemu-nbd "
    "| sluice, no data cached / qemu-nbd | sluice / nbdkit |"
)
out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for job in jobs:
    key = "mb_s" if job.endswith("1m") else "iops"
    cells = []
    for t in targets:
        v = value(job, t, key)
        p50, p99 = value(job, t, "p50_us"), value(job, t, "p99_us")
        cells.append(f"{v:,.0f} ({p50:,.0f} / {p99:,.0f} us)")
    q, n, s = value(job, "qemu-nbd", key), value(job, "nbdkit", key), value(job, "sluice", key)
    cold = value(job, "sluice-nocache", key)
    ratio = lambda a, b: f"{a / b:.2f}x" if b else "n/a"
    out.append(
        f"| {labels[job]} | " + " | ".join(cells)
        + f" | {ratio(s, q)} | {ratio(cold, q)} | {ratio(s, n)} |"
    )

goals = [
    ("sync writes, 32 jobs: sluice >= 2x qemu-nbd", "syncwrite-32", "iops", 2.0),
    ("sync writes, 1 job: sluice >= 0.9x qemu-nbd", "syncwrite-1", "iops", 0.9),
    ("random reads: sluice >= 0.9x qemu-nbd", "randread-qd32", "iops", 0.9),
    ("sequential reads: sluice >= 0.9x qemu-nbd", "seqread-1m", "mb_s", 0.9),
]
out.append("\n| goal | measured | met |")
out.append("|---|---:|---|")
for text, job, key, want in goals:
    q, s = value(job, "qemu-nbd", key), value(job, "sluice", key)
    r = s / q if q else 0.0
    out.append(f"| {text} | {r:.2f}x | {'yes' if r >= want else 'no'} |")
out.append("\n![IOPS and bandwidth relative to the raw file](peers.svg)\n")
# The analysis of the latest run, kept by hand next to the generated tables.
notes = md_path.replace("peers.md", "peers-notes.md")
try:
    out.append(open(notes).read())
except OSError:
    pass
open(md_path, "w").write("\n".join(out) + "\n")

# The plot: for each job, each target's figure as a share of the raw file's.
colors = {
    "raw": "#888888",
    "qemu-nbd": "#4e79a7",
    "nbdkit": "#f28e2b",
    "sluice": "#59a14f",
    "sluice-nocache": "#8cd17d",
}
width, row_h, left = 760, 45, 250
height = 40 + len(jobs) * (row_h * 1 + 14) + 40
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">']
svg.append('<text x="10" y="20" font-size="14">Share of the raw file\'s IOPS / bandwidth (longer is better)</text>')
y = 40
scale_max = 1.0
for job in jobs:
    key = "mb_s" if job.endswith("1m") else "iops"
    raw = value(job, "raw", key) or 1.0
    for t in targets:
        scale_max = max(scale_max, value(job, t, key) / raw)
bar_w = (width - left - 60) / scale_max
for job in jobs:
    key = "mb_s" if job.endswith("1m") else "iops"
    raw = value(job, "raw", key) or 1.0
    svg.append(f'<text x="10" y="{y + 16}">{labels[job]}</text>')
    for i, t in enumerate(targets):
        share = value(job, t, key) / raw
        h = row_h / len(targets)
        svg.append(f'<rect x="{left}" y="{y + i * h:.1f}" width="{share * bar_w:.1f}" height="{h - 1:.1f}" fill="{colors[t]}"/>')
        svg.append(f'<text x="{left + share * bar_w + 4:.1f}" y="{y + i * h + h - 2:.1f}" font-size="9">{t} {share:.2f}</text>')
    y += row_h + 14
svg.append(f'<line x1="{left + bar_w:.1f}" y1="35" x2="{left + bar_w:.1f}" y2="{y}" stroke="#000" stroke-dasharray="3,3"/>')
svg.append(f'<text x="{left + bar_w - 30:.1f}" y="{y + 14}">raw = 1.0</text>')
svg.append("</svg>")
open(svg_path, "w").write("\n".join(svg) + "\n")
