#!/usr/bin/env bash
# What holds up the volume's serving core while clients wait: JOBS clients of 4 KiB write +
# flush (fio's nbd engine, queue depth 1 each) against a warmed server, and two seconds of its
# threads under perf (CPU samples at 4 kHz with call stacks, context switches, socket receives
# and sends). Prints fio's figures, then:
#   - the serving core's time off the CPU by cause: a lock (where it waited, by the first
#     frame of sluice's own code) or its loop's idle wait (nothing to do: every client waits
#     on the device or on the sync);
#   - the longest gaps between requests received or replied on the serving core, and in each
#     what the other threads (the txg sync on core 0) were running, by function.
# A serving core that waits on a lock the sync holds shows as lock time and as gaps with the
# sync's work inside them (how the allocator's lock held across a sync's cache removals was
# found: docs/bench/peers-notes.md, 2026-11-29).
#
# Usage: bench/core-stalls.sh [--bin PATH] [--jobs N (default 8)] [--set NAME=VALUE (sluice
# tunable)] [--gap-us N (default 1500)]
# A pool on a 4 GiB sparse file, a 2 GiB volume written whole, then 10 s of 4 KiB random
# writes at queue depth 32 and a flush (the warm-up bench/peers.sh gives), then the traced
# run: 12 s, traced from 4 s in. Needs perf (root), fio and Debian's /usr/bin/python3; builds
# nothing.
set -euo pipefail

bin=target/release/sluice; jobs=8; gap_us=1500; serve_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --set) serve_args+=(--set "$2"); shift 2 ;;
    --gap-us) gap_us=$2; shift 2 ;;
    *) echo "core-stalls: unknown argument $1" >&2; exit 2 ;;
  esac
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/core-stalls.XXXXXX")
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT

export SLUICE_CACHE_FILE=$dir/pools
truncate -s 4G "$dir/leaf.img"
"$bin" pool create stalls "$dir/leaf.img" >/dev/null
"$bin" vol create stalls/disk --size 2G >/dev/null
"$bin" serve stalls --socket "$dir/s.sock" --listen none --dir "$dir" ${serve_args[@]+"${serve_args[@]}"} 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=2G >/dev/null 2>&1
fio --name=warm --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=1G \
  --runtime=10 --time_based --end_fsync=1 >/dev/null 2>&1
fio --name=op --ioengine=nbd --uri="$uri" --bs=4k --size=1G --runtime=12 --time_based \
  --rw=randwrite --fsync=1 --numjobs="$jobs" --iodepth=1 --group_reporting \
  --output-format=json --output="$dir/fio.json" >/dev/null 2>&1 &
fio_pid=$!
sleep 4
# The sampling rate is the CPU clock's alone: a global -F would sample the tracepoints too,
# which must each be recorded.
perf record -q -p "$pid" -e cpu-clock/freq=4000/ \
  -e sched:sched_switch,syscalls:sys_exit_recvfrom,syscalls:sys_enter_sendto \
  --call-graph dwarf,8192 -o "$dir/perf.data" -- sleep 2 >/dev/null 2>&1
wait "$fio_pid"
perf script -i "$dir/perf.data" 2>/dev/null >"$dir/perf.txt"
/usr/bin/python3 - "$dir/fio.json" "$dir/perf.txt" "$gap_us" <<'PY'
import collections, json, re, sys

text = open(sys.argv[1]).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
pct = lambda p: [round(p[k] / 1e3) for k in ("50.000000", "99.000000", "99.900000")]
print(f"{job['write']['iops']:.0f} write + flush operations/s; flush p50/p99/p99.9 "
      f"{pct(job['sync']['lat_ns']['percentile'])} us, write {pct(job['write']['clat_ns']['percentile'])} us")

# perf script's records: a header line (thread, tid, [cpu], time, [period], event, fields),
# then the call stack, one frame per line, then a blank line.
header = re.compile(r"^(\S.*?)\s+(\d+)\s+(?:\[\d+\]\s+)?([\d.]+):\s+(?:\d+\s+)?(\S+):\s*(.*)$")
records, current = [], None
for line in open(sys.argv[2]):
    if not line.strip():
        if current:
            records.append(current)
        current = None
    elif not line.startswith(("\t", " ")):
        m = header.match(line)
        current = m and dict(thread=m.group(1).strip(), t=float(m.group(3)) * 1e6,
                             event=m.group(4), fields=m.group(5), stack=[])
    elif current is not None:
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            current["stack"].append(parts[1].split("+0x")[0])
if current:
    records.append(current)

def own(stack):
    """The first frame of sluice's own code, else the leaf."""
    for frame in stack:
        if "sluice_" in frame and "{{closure}}" not in frame.split("::")[-1:][0]:
            return frame
    for frame in stack:
        if "sluice_" in frame:
            return frame
    return stack[0] if stack else "?"

# The volume's serving core: the serving-core thread with the most request events.
requests = collections.Counter(r["thread"] for r in records
                               if r["event"] in ("syscalls:sys_exit_recvfrom", "syscalls:sys_enter_sendto"))
if not requests:
    sys.exit("core-stalls: no requests in the trace (is perf allowed tracepoints?)")
core = requests.most_common(1)[0][0]
print(f"serving core: {core}")

# perf follows only the server's threads, so a switch back to the core is not seen: its time
# off the CPU runs from its switch out to its next event of any kind.
off, count, left = collections.defaultdict(float), collections.Counter(), None
for r in records:
    if r["thread"] != core:
        continue
    if left and r["event"] != "sched:sched_switch":
        off[left[1]] += r["t"] - left[0]
        count[left[1]] += 1
        left = None
    if r["event"] == "sched:sched_switch" and f"prev_comm={core} " in r["fields"]:
        state = re.search(r"prev_state=(\S+)", r["fields"]).group(1)
        if state.startswith("R"):
            cause = "preempted (runnable)"
        elif any("lock_slow" in f or "futex" in f for f in r["stack"][:8]):
            cause = "lock in " + own(r["stack"])
        else:
            cause = "idle wait"
        left = (r["t"], cause)
print("time off the CPU, by cause (2 s traced):")
for cause, us in sorted(off.items(), key=lambda kv: -kv[1]):
    print(f"  {us / 1e3:8.1f} ms over {count[cause]:5d} waits  {cause}")

marks = [r["t"] for r in records if r["thread"] == core
         and r["event"] in ("syscalls:sys_exit_recvfrom", "syscalls:sys_enter_sendto")]
gaps = sorted(((b - a, a) for a, b in zip(marks, marks[1:]) if b - a > float(sys.argv[3])), reverse=True)
print(f"gaps between requests on the serving core over {sys.argv[3]} us: {len(gaps)}")
for length, start in gaps[:6]:
    samples = collections.Counter(
        (r["thread"], own(r["stack"])) for r in records
        if r["event"].startswith("cpu-clock") and start <= r["t"] <= start + length)
    print(f"  {length:7.0f} us; samples inside (4 kHz):")
    for (thread, frame), n in samples.most_common(5):
        print(f"      {n:4d}  {thread:16s} {frame[:110]}")
PY
