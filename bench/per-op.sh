#!/usr/bin/env bash
# What one client operation costs the server: IOPS, server CPU (and the whole machine's busy
# CPU, fio's included), context switches, disk commands and bytes written per operation, for
# one fio job against sluice or qemu-nbd on a fresh image; the server's CPU and its context
# switches also by thread (its serving cores, its main runtime, the kernel's io_uring workers);
# and the machine's interrupts per operation (rescheduling and function-call IPIs, virtio's).
#
# Usage: bench/per-op.sh [sluice|qemu-nbd] [syncwrite|syncwrite-1m|stream-1m|seqwrite|mixed|randread|seqread] [JOBS] [--bin PATH]
#        [--block-size 4K] [--compression off|lz4|zstd] [--logbias latency|throughput] [--seconds N] [--disk vda] [--set NAME=VALUE (sluice tunable)]
#        [--cores N (sluice's serving cores)] [--age SECONDS] [--warm SECONDS]
#        [--mirror (sluice: a 2-way mirror of two such leaves in the same dir, the default
#        pool's layout)] [--volume-mib N (bench/peers.sh's layout: a volume of N MiB in a leaf
#        of twice that, every job over the whole volume)] [--fio ARG (added to the measured
#        job, and its warm-up: --fio --rate=100m holds the rate down to see what CPU per
#        operation owes to time rather than to operations)]
#   syncwrite: 4 KiB random writes, each followed by a flush, JOBS jobs at queue depth 1
#   syncwrite-1m: 1 MiB sequential writes, each followed by a flush, JOBS jobs at queue depth
#              1, each in its own slice of the volume (bench/peers.sh's syncwrite-1m-N; IOPS
#              are MiB/s)
#   stream-1m: 1 MiB sequential writes with a flush after every 64 (64 MiB), JOBS jobs at
#              queue depth 1, each in its own slice (a stream that flushes now and then; IOPS
#              are MiB/s, the flush figures are those flushes')
#   seqwrite:  1 MiB sequential writes at queue depth 8, no flush (bench/peers.sh's
#              seqwrite-1m; IOPS are MiB/s). Each write only dirties the open txg, so the
#              CPU per op counts the syncs that run meanwhile, not those after the run
#   mixed:     4 KiB and 8 KiB random writes, half each, a flush after every 4 writes, JOBS
#              jobs at queue depth 1 (bench/peers.sh's mixed-8: a filesystem's or database's
#              small writes; an operation is a write, flushes are counted apart)
#   randread:  4 KiB random reads at queue depth 32
#   seqread:   1 MiB sequential reads at queue depth 8 (IOPS are MiB/s)
# The image is a 1.5 GiB volume, of which the jobs use the first 1 GiB (sluice: in a 3 GiB
# zeroed leaf; qemu-nbd: a 1.5 GiB zeroed raw file, cache=none, aio=native), or with
# --volume-mib bench/peers.sh's layout, written sequentially first, as bench/peers.sh does; --age
# then writes 4 KiB at random places (queue depth 32) for that long and flushes, as
# bench/peers.sh's write jobs leave the volume before its read jobs (copy-on-write scatters
# the blocks; the raw file stays in place). --warm runs the job itself, unmeasured, for that
# long before the measured seconds: a fresh server's memory grows until its block cache and
# dirty data reach their bounds, and the kernel's clearing of those new pages (huge pages
# here) was 60-80% of a fresh server's samples under 1 MiB writes at queue depth 8 (perf,
# 2026-11-30), a cost a long-running server, and bench/peers.sh's warmed one, does not pay
# per write. Disk
# commands come from /proc/diskstats of --disk (the device under the data directory), so run
# nothing else meanwhile. Needs fio, qemu-utils, python3; builds nothing.
set -euo pipefail

target=${1:-sluice}; job=${2:-syncwrite}; jobs=${3:-32}
shift $(( $# < 3 ? $# : 3 ))
bin=target/release/sluice; block=""; compression=""; logbias=""; seconds=6; disk=""; serve_args=(); age=0
mirror=0; warm=0; vol_mib=1536; leaf_mib=3072; span_mib=1024; fio_extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --block-size) block=$2; shift 2 ;;
    --compression) compression=$2; shift 2 ;;
    --logbias) logbias=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --disk) disk=$2; shift 2 ;;
    --set) serve_args+=(--set "$2"); shift 2 ;;
    --cores) serve_args+=(--cores "$2"); shift 2 ;;
    --age) age=$2; shift 2 ;;
    --warm) warm=$2; shift 2 ;;
    --mirror) mirror=1; shift ;;
    --fio) fio_extra+=("$2"); shift 2 ;;
    --volume-mib) vol_mib=$2; leaf_mib=$(( 2 * $2 )); span_mib=$2; shift 2 ;;
    *) echo "per-op: unknown argument $1" >&2; exit 2 ;;
  esac
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/per-op.XXXXXX")
if [ -z "$disk" ]; then
  disk=$(lsblk -no PKNAME "$(df --output=source "$dir" | tail -1)" 2>/dev/null || true)
  disk=${disk:-$(basename "$(df --output=source "$dir" | tail -1)")}
fi
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT

case $target in
  sluice)
    export SLUICE_CACHE_FILE=$dir/pools
    dd if=/dev/zero of="$dir/leaf.img" bs=1M count="$leaf_mib" oflag=direct status=none
    if [ "$mirror" = 1 ]; then
      dd if=/dev/zero of="$dir/leaf2.img" bs=1M count="$leaf_mib" oflag=direct status=none
      "$bin" pool create perop mirror "$dir/leaf.img" "$dir/leaf2.img" >/dev/null
    else
      "$bin" pool create perop "$dir/leaf.img" >/dev/null
    fi
    "$bin" vol create perop/disk --size "${vol_mib}M" ${block:+--block-size "$block"} \
      ${compression:+--compression "$compression"} ${logbias:+--logbias "$logbias"} >/dev/null
    "$bin" serve perop --socket "$dir/s.sock" --listen none --dir "$dir" ${serve_args[@]+"${serve_args[@]}"} 2>"$dir/serve.log" &
    pid=$! ;;
  qemu-nbd)
    dd if=/dev/zero of="$dir/q.img" bs=1M count="$vol_mib" oflag=direct status=none
    qemu-nbd -f raw --cache=none --aio=native -e 64 -t -k "$dir/s.sock" -x disk "$dir/q.img" &
    pid=$! ;;
  *) echo "per-op: target is sluice or qemu-nbd" >&2; exit 2 ;;
esac
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
# A server that refused its arguments (a tunable out of range, say) has said why in its log.
if [ ! -S "$dir/s.sock" ]; then
  echo "per-op: $target did not start serving" >&2
  cat "$dir/serve.log" >&2 2>/dev/null || true
  exit 1
fi
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size="${span_mib}M" >/dev/null 2>&1
# The prefill leaves up to a quarter of txg.dirty_max (a tenth of memory) in its open txg;
# written out by a sync inside the measured seconds, it would count against the job's
# operations (bench/peers.sh waits for it too).
if [ "$target" = sluice ]; then "$bin" pool sync perop >/dev/null; fi
if [ "$age" != 0 ]; then
  fio --name=age --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size="${span_mib}M" \
    --runtime="$age" --time_based --end_fsync=1 >/dev/null 2>&1
  # The txg sync of what the flush left in the log runs after it: past txg.timeout_ms.
  if [ "$target" = sluice ]; then sleep 6; fi
fi
case $job in
  syncwrite) args=(--rw=randwrite --fsync=1 --numjobs="$jobs" --iodepth=1) ;;
  syncwrite-1m) slice=$(( span_mib / jobs ))M
    args=(--rw=write --bs=1M --fsync=1 --numjobs="$jobs" --iodepth=1 --size="$slice" --offset_increment="$slice") ;;
  stream-1m) slice=$(( span_mib / jobs ))M
    args=(--rw=write --bs=1M --fsync=64 --numjobs="$jobs" --iodepth=1 --size="$slice" --offset_increment="$slice") ;;
  seqwrite) args=(--rw=write --bs=1M --iodepth=8) ;;
  mixed) args=(--rw=randwrite --bssplit=4k/50:8k/50 --fsync=4 --numjobs="$jobs" --iodepth=1) ;;
  randread) args=(--rw=randread --iodepth=32) ;;
  seqread) args=(--rw=read --bs=1M --iodepth=8) ;;
  *) echo "per-op: job is syncwrite, syncwrite-1m, stream-1m, seqwrite, mixed, randread or seqread" >&2; exit 2 ;;
esac
args+=(${fio_extra[@]+"${fio_extra[@]}"})
sample() {
  local cpu switches disk_io
  cpu=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  switches=$(cat /proc/"$pid"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}')
  disk_io=$(awk -v d="$disk" '$3 == d {print $4, $8, $19, $10}' /proc/diskstats)
  # Every CPU's busy time (user, nice, system, irq, softirq): fio's own and the kernel
  # threads that finish a write's I/O (dio completions, flushes) are charged to no server.
  machine=$(awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8}' /proc/stat)
  echo "$cpu $switches ${disk_io:-0 0 0 0} $machine"
}
# Each thread's /proc stat line, to split the server's CPU by thread name (its cores, I/O
# threads, the kernel's io_uring workers), and its context switches, voluntary (it waited:
# a park, a blocking call) and involuntary (it was preempted), as "tid voluntary involuntary".
threads() {
  cat /proc/"$pid"/task/*/stat 2>/dev/null || true
  for task in /proc/"$pid"/task/*; do
    awk -v tid="${task##*/}" '/^voluntary_ctxt/ {v = $2} /^nonvoluntary_ctxt/ {n = $2}
      END {if (v != "") print "switches", tid, v, n}' "$task/status" 2>/dev/null || true
  done
}
# The machine's interrupts so far, summed over its CPUs: rescheduling IPIs (a CPU told to run a
# woken task, or to take a completion's task work), function-call IPIs, and the devices' own
# (every line that names virtio). On a VM each IPI costs an exit on the sender, and often on
# the receiver.
interrupts() {
  awk 'NR == 1 { cpus = NF; next }
    { n = 0; for (i = 2; i <= cpus + 1 && $i ~ /^[0-9]+$/; i++) n += $i }
    $1 == "RES:" { res = n } $1 == "CAL:" { cal = n } /virtio/ { dev += n }
    END { print res + 0, cal + 0, dev + 0 }' /proc/interrupts
}
if [ "$warm" != 0 ]; then
  fio --name=warm --ioengine=nbd --uri="$uri" --bs=4k --size="${span_mib}M" --runtime="$warm" --time_based \
    "${args[@]}" >/dev/null 2>&1
  # What the warm-up left open is synced before the measured seconds, as after the prefill.
  if [ "$target" = sluice ]; then "$bin" pool sync perop >/dev/null; fi
fi
before=$(sample); threads >"$dir/threads.before"; interrupts >"$dir/irq.before"
fio --name=op --ioengine=nbd --uri="$uri" --bs=4k --size="${span_mib}M" --runtime="$seconds" --time_based \
  --group_reporting --output-format=json "${args[@]}" 2>/dev/null | grep -v '^fio: ' >"$dir/fio.json"
after=$(sample); threads >"$dir/threads.after"; interrupts >"$dir/irq.after"
# What the prefetch and the rewrite of scattered blocks did over the whole run (prefill, ageing
# and warm-up included), for the read jobs.
if [ "$target" = sluice ] && [[ $job == *read ]]; then
  "$bin" pool iostat perop --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
v = json.loads(sys.stdin.readline())["volumes"][0]
p, r = v.get("prefetch"), v.get("rewrite")
if p:
    print("prefetch: {blocks_fetched:,} blocks fetched ahead in {ios:,} I/Os, {blocks_used:,} read, "
          "{blocks_unused:,} unread; {hits:,} reads continued a stream, {misses:,} did not".format(**p))
if r:
    print("rewrite: {scattered_reads:,} reads found their blocks scattered; {blocks_rewritten:,} blocks "
          "rewritten, {blocks_shared:,} shared (left), {blocks_deferred:,} deferred".format(**r))' || true
fi
/usr/bin/python3 - "$dir/fio.json" "$seconds" "$before" "$after" "$target" "$job" "$jobs" "${block:-default}${compression:+ compression=$compression}" <<'PY'
import json, os, sys
path, seconds, before, after, target, job, jobs, block = sys.argv[1:]
j = json.load(open(path))["jobs"][0]
writes = job not in ("randread", "seqread")
side = j["write" if writes else "read"]
iops = side["iops"]
pct = lambda lat, p: lat["percentile"][p] / 1000 if lat.get("percentile") else float("nan")
spread = lambda lat: (f"{lat['mean'] / 1000:.0f} us mean, {pct(lat, '50.000000'):.0f} us p50, "
                      f"{pct(lat, '99.000000'):.0f} us p99")
latency = spread(side["clat_ns"])
if writes and j.get("sync", {}).get("lat_ns", {}).get("N"):
    latency = f"write {latency}; flush {spread(j['sync']['lat_ns'])}"
ops = iops * float(seconds)
b = [float(x) for x in before.split()]; a = [float(x) for x in after.split()]
tick = os.sysconf("SC_CLK_TCK")
print(f"{target} {job} jobs={jobs} block={block}: {iops:,.0f} IOPS; server CPU {(a[0]-b[0])/tick/ops*1e6:.0f} us/op, "
      f"machine {(a[6]-b[6])/tick/ops*1e6:.0f} us/op; "
      f"context switches {(a[1]-b[1])/ops:.2f}/op; disk reads {(a[2]-b[2])/ops:.2f}/op, "
      f"writes {(a[3]-b[3])/ops:.2f}/op ({(a[5]-b[5])*512/ops/1024:.1f} KiB), flushes {(a[4]-b[4])/ops:.3f}/op; {latency}")
def threads(path):
    # "tid (name) state ... utime stime ...": the name may hold spaces and parentheses. And
    # "switches tid voluntary involuntary" lines.
    seen, switched = {}, {}
    for line in open(path):
        if line.startswith("switches "):
            _, tid, voluntary, involuntary = line.split()
            switched[tid] = (int(voluntary), int(involuntary))
            continue
        if ") " not in line:
            continue
        head, rest = line.rsplit(") ", 1)
        tid, name = head.split(" (", 1)
        fields = rest.split()
        # The kernel's io_uring workers come and go, each named with its own id.
        name = "iou-wrk" if name.startswith("iou-wrk") else name
        seen[tid] = (name, int(fields[11]) + int(fields[12]))
    return seen, switched
(t0, s0), (t1, s1) = (threads(os.path.join(os.path.dirname(path), f"threads.{when}"))
                      for when in ("before", "after"))
by_name, switches_by_name = {}, {}
for tid, (name, ticks) in t1.items():
    by_name[name] = by_name.get(name, 0) + ticks - t0.get(tid, (name, 0))[1]
    if tid in s1:
        v0, n0 = s0.get(tid, (0, 0))
        v, n = switches_by_name.get(name, (0, 0))
        switches_by_name[name] = (v + s1[tid][0] - v0, n + s1[tid][1] - n0)
# Threads that ended inside the run are counted in the process's total only.
by_name["(ended)"] = (a[0] - b[0]) - sum(by_name.values())
shares = ", ".join(f"{name} {ticks / tick / ops * 1e6:.0f}" for name, ticks in
                   sorted(by_name.items(), key=lambda kv: -kv[1]) if ticks > 0)
print(f"  server CPU by thread, us/op: {shares}")
# Threads that ended inside the run are left out here.
switched = ", ".join(f"{name} {v / ops:.2f} + {n / ops:.2f}" for name, (v, n) in
                     sorted(switches_by_name.items(), key=lambda kv: -sum(kv[1])) if v + n > 0)
print(f"  context switches by thread, voluntary + involuntary per op: {switched}")
(r0, c0, d0), (r1, c1, d1) = ([int(x) for x in open(os.path.join(os.path.dirname(path), f"irq.{when}")).read().split()]
                              for when in ("before", "after"))
print(f"  the machine's interrupts per op: rescheduling IPIs {(r1 - r0) / ops:.2f}, "
      f"function-call IPIs {(c1 - c0) / ops:.2f}, virtio devices {(d1 - d0) / ops:.2f}")
PY
