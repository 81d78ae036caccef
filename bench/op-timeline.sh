#!/usr/bin/env bash
# Where one client's 4 KiB write + flush spends its time inside the server: kernel tracepoints
# on the serving core (socket receives and sends, io_uring submissions and completions) for one
# second, cut into operations. For each operation, from the write's request received:
#   recv->submit          until the log block's write is submitted to the ring
#   recv->write reply     until the write's reply is sent
#   submit->complete      the durable log write in the kernel and the device
#   complete->flush reply from its completion to the flush's reply
#   flush reply->next     the client's turn: its next write received
# and prints each segment's median and mean over the operations seen.
#
# Usage: bench/op-timeline.sh [--bin PATH] [--set NAME=VALUE (sluice tunable)]
# A pool on a 3 GiB zeroed file, a 1 GiB volume written first (as bench/per-op.sh does), then
# fio's nbd engine at one job and queue depth 1 (--fsync=1) for 8 s, traced from 3 s in. Needs
# perf with tracepoint access (root), fio, and Debian's /usr/bin/python3; builds nothing.
set -euo pipefail

bin=target/release/sluice; serve_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --set) serve_args+=(--set "$2"); shift 2 ;;
    *) echo "op-timeline: unknown argument $1" >&2; exit 2 ;;
  esac
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/op-timeline.XXXXXX")
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT

export SLUICE_CACHE_FILE=$dir/pools
dd if=/dev/zero of="$dir/leaf.img" bs=1M count=3072 oflag=direct status=none
"$bin" pool create timeline "$dir/leaf.img" >/dev/null
"$bin" vol create timeline/disk --size 1536M >/dev/null
"$bin" serve timeline --socket "$dir/s.sock" --listen none --dir "$dir" ${serve_args[@]+"${serve_args[@]}"} 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
# The prefill's txg sync, past txg.timeout_ms, so it is not in the traced second.
sleep 6
fio --name=op --ioengine=nbd --uri="$uri" --bs=4k --size=1G --runtime=8 --time_based \
  --rw=randwrite --fsync=1 --numjobs=1 --iodepth=1 >/dev/null 2>&1 &
fio_pid=$!
sleep 3
events=io_uring:io_uring_submit_req,io_uring:io_uring_complete
events+=,syscalls:sys_exit_recvfrom,syscalls:sys_enter_sendto
perf record -q -p "$pid" -e "$events" -o "$dir/trace.data" -- sleep 1 >/dev/null 2>&1
wait "$fio_pid"
perf script -i "$dir/trace.data" -F comm,time,event,trace 2>/dev/null >"$dir/trace.txt"
/usr/bin/python3 - "$dir/trace.txt" <<'PY'
import re, statistics, sys

# One event per line: the serving core's thread, time (s), event, its fields.
events = []
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\S+)\s+([\d.]+):\s+(\S+):\s*(.*)", line)
    if not m or not m.group(1).startswith("sluice_core"):
        continue
    t, name, fields = float(m.group(2)) * 1e6, m.group(3), m.group(4)
    # A write request is its 28-byte header and 4 KiB of data; a flush is the header alone.
    if name == "syscalls:sys_exit_recvfrom" and fields.strip().endswith("0x101c"):
        events.append((t, "W"))
    elif name == "io_uring:io_uring_submit_req" and "opcode WRITE" in fields:
        events.append((t, "S"))
    elif name == "io_uring:io_uring_complete":
        events.append((t, "C"))
    elif name == "syscalls:sys_enter_sendto":
        events.append((t, "R"))

segments = {k: [] for k in ("recv->submit", "recv->write reply", "submit->complete",
                            "complete->flush reply", "flush reply->next", "whole operation")}
starts = [i for i, (_, e) in enumerate(events) if e == "W"]
for a, b in zip(starts, starts[1:]):
    op = events[a:b + 1]
    kinds = "".join(e for _, e in op)
    # Only operations with exactly one log write and two replies (the write's and the
    # flush's): a txg sync's writes or a batch of two would be cut wrongly.
    if kinds.count("S") != 1 or kinds.count("C") != 1 or kinds.count("R") != 2:
        continue
    at = lambda kind: [t for t, e in op if e == kind]
    w, s, c, r, n = op[0][0], at("S")[0], at("C")[0], at("R"), op[-1][0]
    if not w < s < c < r[1]:
        continue
    segments["recv->submit"].append(s - w)
    segments["recv->write reply"].append(r[0] - w)
    segments["submit->complete"].append(c - s)
    segments["complete->flush reply"].append(r[1] - c)
    segments["flush reply->next"].append(n - r[1])
    segments["whole operation"].append(n - w)
count = len(segments["whole operation"])
if count == 0:
    sys.exit("op-timeline: no whole operations in the trace (is perf allowed tracepoints?)")
print(f"{count} operations traced; microseconds")
print(f"{'segment':24s} {'median':>8s} {'mean':>8s}")
for name, values in segments.items():
    print(f"{name:24s} {statistics.median(values):8.0f} {statistics.mean(values):8.0f}")
PY
