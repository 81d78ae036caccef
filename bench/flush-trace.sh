#!/usr/bin/env bash
# What the device's cache flushes cost while clients wait on them: JOBS clients of 4 KiB
# write + flush (fio's nbd engine, queue depth 1 each) against sluice or qemu-nbd on a file in
# DIR, and three seconds of the block layer's requests on the disk holding DIR (the kernel's
# block_rq_insert, block_rq_issue and block_rq_complete trace events, read through tracefs:
# `perf record -a` lost almost every completion here, which the kernel runs in the idle
# task's softirq, so it is not used). Prints fio's figures, then:
#   - the device's flushes: how many, how long each took (issue to completion; the block layer
#     keeps one flush in flight per queue, and a log write's flush waits for the one before);
#   - the bytes written, by size, and the flushes' durations by the bytes the device took
#     since the flush before (what the flush had to write back);
#   - the longest flushes, with what was written in the 100 ms before each;
#   - the server's CPU and the machine's busy CPU over the traced seconds;
#   - with --iostat (sluice), `sluice pool iostat` over the traced seconds: the txg syncs, what
#     asked for them, the log's blocks, the write throttle, the paced count.
# A log write's flush that follows a burst of the txg sync's writes shows as a flush of
# milliseconds after megabytes, where one after a log block alone takes a tenth of one (how the
# sync's pacing, vdev.sync_pace_bytes, was found: docs/bench/peers-notes.md, 2026-12-02).
#
# Usage: bench/flush-trace.sh [--target sluice|qemu-nbd] [--bin PATH] [--jobs N (default 8)]
#          [--set NAME=VALUE (sluice tunable)] [--leaf SIZE (sluice's leaf, default 4G)]
#          [--iostat] [--dir DIR (default: a new one in $TMPDIR)]
# sluice: a pool on a sparse file of --leaf, a 2 GiB volume (how much room the pool has beside
# the volume sets how cut up its free space gets, and with it the sync's writes: the flush
# tail on a 4 GiB leaf was 3-7x that on 8 or 16 GiB, docs/bench/peers-notes.md); qemu-nbd: a 2 GiB raw file,
# cache=none, aio=native (as bench/peers.sh runs it). Each volume is written whole, then gets
# 10 s of 4 KiB random writes at queue depth 32 and a flush, then the traced run: 12 s, traced
# from 4 s in. Needs root (tracefs), fio, qemu-nbd for its target, and Debian's
# /usr/bin/python3; builds nothing.
set -euo pipefail

target=sluice; bin=target/release/sluice; jobs=8; serve_args=(); base=${TMPDIR:-/tmp}
leaf=4G; iostat=0
while [ $# -gt 0 ]; do
  case $1 in
    --target) target=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --set) serve_args+=(--set "$2"); shift 2 ;;
    --dir) base=$2; shift 2 ;;
    --leaf) leaf=$2; shift 2 ;;
    --iostat) iostat=1; shift ;;
    *) echo "flush-trace: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $target in sluice|qemu-nbd) ;; *) echo "flush-trace: --target is sluice or qemu-nbd" >&2; exit 2 ;; esac
dir=$(mktemp -d "$base/flush-trace.XXXXXX")
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
tracefs=/sys/kernel/tracing
[ -d "$tracefs/events/block" ] || tracefs=/sys/kernel/debug/tracing
[ -d "$tracefs/events/block" ] || { echo "flush-trace: no tracefs with block events (mount tracefs, run as root)" >&2; exit 1; }
events=(block_rq_insert block_rq_issue block_rq_complete)
trace_off() {
  echo 0 >"$tracefs/tracing_on"
  for e in "${events[@]}"; do echo 0 >"$tracefs/events/block/$e/enable"; done
}
cleanup() {
  trace_off 2>/dev/null || true
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

# The whole disk under DIR: the block layer's requests name it, not a partition.
source_dev=$(findmnt -no SOURCE -T "$dir")
parent=$(lsblk -no PKNAME "$source_dev" 2>/dev/null | head -1 || true)
disk=${parent:+/dev/$parent}; disk=${disk:-$source_dev}
majmin=$(lsblk -dno MAJ:MIN "$disk" | tr -d ' ' | tr : ,)

export SLUICE_CACHE_FILE=$dir/pools
if [ "$target" = sluice ]; then
  truncate -s "$leaf" "$dir/leaf.img"
  "$bin" pool create trace "$dir/leaf.img" >/dev/null
  "$bin" vol create trace/disk --size 2G >/dev/null
  "$bin" serve trace --socket "$dir/s.sock" --listen none --dir "$dir" ${serve_args[@]+"${serve_args[@]}"} 2>"$dir/serve.log" &
else
  truncate -s 2G "$dir/q.img"
  qemu-nbd -f raw --cache=none --aio=native -e 64 -t -k "$dir/s.sock" -x disk "$dir/q.img" &
fi
pid=$!
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=2G --end_fsync=1 >/dev/null 2>&1
fio --name=warm --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=1G \
  --runtime=10 --time_based --end_fsync=1 >/dev/null 2>&1
fio --name=op --ioengine=nbd --uri="$uri" --bs=4k --size=1G --runtime=12 --time_based \
  --rw=randwrite --fsync=1 --numjobs="$jobs" --iodepth=1 --group_reporting \
  --output-format=json --output="$dir/fio.json" >/dev/null 2>&1 &
fio_pid=$!
sleep 4
echo 0 >"$tracefs/tracing_on"
echo >"$tracefs/trace"
echo 32768 >"$tracefs/buffer_size_kb"
for e in "${events[@]}"; do echo 1 >"$tracefs/events/block/$e/enable"; done
echo 1 >"$tracefs/tracing_on"
# /proc/stat's busy fields: user, nice, system, irq, softirq.
cpu_server() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
cpu_machine() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
server0=$(cpu_server); machine0=$(cpu_machine)
iostat_pid=""
if [ "$iostat" = 1 ] && [ "$target" = sluice ]; then
  "$bin" pool iostat trace 3 2 >"$dir/iostat.txt" 2>&1 &
  iostat_pid=$!
fi
sleep 3
server1=$(cpu_server); machine1=$(cpu_machine)
trace_off
cp "$tracefs/trace" "$dir/blk.txt"
echo >"$tracefs/trace"
wait "$fio_pid"
[ -n "$iostat_pid" ] && wait "$iostat_pid"
/usr/bin/python3 - "$dir/fio.json" "$dir/blk.txt" "$majmin" <<'PY'
import bisect, collections, json, re, sys

text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
pct = lambda p: [round(p[k] / 1e3) for k in ("50.000000", "99.000000", "99.900000")]
print(f"{job['write']['iops']:.0f} write + flush operations/s; flush p50/p99/p99.9 "
      f"{pct(job['sync']['lat_ns']['percentile'])} us, write {pct(job['write']['clat_ns']['percentile'])} us")

# The trace's block lines: "... TIME: block_rq_EVENT: MAJ,MIN RWBS [BYTES] () SECTOR + SECTORS ..."
line_re = re.compile(r"\s([\d.]+): block_rq_(\w+): (\d+,\d+) (\S+) (?:\d+ )?\(\) (\d+) \+ (\d+)")
flush_start, flushes, inserted, writes = None, [], {}, []
for line in open(sys.argv[2]):
    m = line_re.search(line)
    if not m or m.group(3) != sys.argv[3]:
        continue
    t, event, rwbs = float(m.group(1)) * 1e6, m.group(2), m.group(4)
    if rwbs.startswith("F") and int(m.group(6)) == 0:
        # A flush carries no data. The block layer keeps one in flight at a time; one the
        # device could not take is issued again: its time runs from its first issue.
        if event == "issue" and flush_start is None:
            flush_start = t
        elif event == "complete":
            if flush_start is not None:
                flushes.append((flush_start, t))
            flush_start = None
        continue
    if "W" not in rwbs:
        continue
    key = (int(m.group(5)), int(m.group(6)))
    if event == "insert":
        inserted.setdefault(key, t)
    elif event == "complete" and key in inserted:
        writes.append((inserted.pop(key), t, key[1] * 512))
if not flushes:
    sys.exit("flush-trace: no flush was traced on the disk " + sys.argv[3])
q = lambda a, p: a[min(len(a) - 1, int(p * len(a)))]
span = (flushes[-1][1] - flushes[0][0]) / 1e6
took = sorted(c - s for s, c in flushes)
print(f"device flushes: {len(took)} in {span:.2f} s, issue to completion p50 {q(took, .5):.0f} "
      f"p90 {q(took, .9):.0f} p99 {q(took, .99):.0f} max {took[-1]:.0f} us; "
      f"a flush in flight {sum(took) / 1e6 / span:.0%} of the time")
size = lambda b: "<=8K" if b <= 8192 else "<=64K" if b <= 65536 else "<=512K" if b <= 524288 else ">512K"
by_size = collections.Counter(size(b) for _, _, b in writes)
print(f"writes: {len(writes)}, {sum(b for *_, b in writes) / span / 1e6:.1f} MB/s; by size "
      + ", ".join(f"{k} {by_size[k]}" for k in ("<=8K", "<=64K", "<=512K", ">512K")))
done = sorted((c, b) for _, c, b in writes)
ends, total = [c for c, _ in done], [0]
for _, b in done:
    total.append(total[-1] + b)
taken = lambda a, b: total[bisect.bisect_right(ends, b)] - total[bisect.bisect_right(ends, a)]
rows, previous = collections.defaultdict(list), flushes[0][0]
names = ["<64K", "64K-256K", "256K-1M", "1M-4M", ">=4M"]
for s, c in flushes[1:]:
    carried = taken(previous, s)
    rows[sum(carried >= x for x in (64 << 10, 256 << 10, 1 << 20, 4 << 20))].append(c - s)
    previous = s
print("flush duration by the bytes written since the flush before:")
for k in sorted(rows):
    v = sorted(rows[k])
    print(f"  {names[k]:>9}: {len(v):5d} flushes, p50 {q(v, .5) / 1e3:7.2f} p90 "
          f"{q(v, .9) / 1e3:7.2f} max {v[-1] / 1e3:7.1f} ms")
print("longest flushes:")
for s, c in sorted(flushes, key=lambda f: f[0] - f[1])[:5]:
    n = taken(s - 100000, s)
    print(f"  {(c - s) / 1e3:7.1f} ms, after {n / 1e6:.2f} MB written in the 100 ms before it")
PY
tck=$(getconf CLK_TCK)
echo "CPU over the traced 3 s: the server $(( (server1 - server0) * 100 / tck / 3 ))% of a core," \
  "the machine $(( (machine1 - machine0) * 100 / tck / 3 ))% (of $(nproc) cores' $(( $(nproc) * 100 ))%)"
if [ -n "$iostat_pid" ]; then
  echo "sluice pool iostat over the traced 3 s:"
  sed -n '/the last/,$p' "$dir/iostat.txt"
fi
