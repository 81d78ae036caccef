#!/usr/bin/env bash
# Where one client's write + flush spends its time inside the server: kernel tracepoints on the
# server's threads (socket receives and sends, io_uring submissions and completions) for one
# second, cut into operations.
#
# 4 KiB writes (the default). For each operation, from the write's request received:
#   recv->submit          until the log block's write is submitted to the ring
#   recv->write reply     until the write's reply is sent
#   submit->complete      the durable log write in the kernel and the device
#   complete->flush reply from its completion to the flush's reply
#   flush reply->next     the client's turn: its next write received
#
# 1 MiB writes (--write-size 1M; any size of 256 KiB or more), whose blocks are written in
# place and then flushed. For each operation, from the write's first bytes received:
#   receive               until the write's reply is sent (the payload's receive, and the parts
#                         handed over while it arrives)
#   reply->last submit    until the last write submitted before the flush (the data's, then
#                         the log block's)
#   last submit->complete until the last of the writes submitted after the reply completes
#   complete->fsync done  until the device flush completes: its submission, and an io_uring
#                         worker running it
#   fsync done->reply     until the flush's reply is sent
#   flush reply->next     the client's turn: its next write's first bytes received
#   data: reply->submit   the data's writes (all but the log block, which goes last): from
#                         the write's reply until the first of them went to the ring
#   data: submit->complete from then until the last of them completed; beside "last
#                         submit->complete" it says whether the flush waited for the data or
#                         for the log block
#   writes before reply   data writes submitted while the payload arrived (a count, not us)
# Operations whose writes carry more than the payload and a log block (a txg sync wrote in
# between) are dropped, and counted.
#
# Each segment's median, mean, 90th and 99th percentiles over the operations seen are printed.
#
# Usage: bench/op-timeline.sh [--bin PATH] [--set NAME=VALUE (sluice tunable)]
#          [--write-size 4k|SIZE (fio's --bs: 4k, the default, or 256K and more, say 1M)]
#          [--compression lz4|off|... (the volume's, `sluice vol create --compression`)]
#          [--fio ARG (added to the traced job: --fio --buffer_compress_percentage=50 --fio
#          --refill_buffers writes data that compresses to about half)]
#          [--warmup N (seconds of 4 KiB random writes at queue depth 32 before the traced job;
#          default 15, 0 for none)]
# A pool on a 3 GiB zeroed file, a 1 GiB volume written first (as bench/per-op.sh does), the
# warm-up, then fio's nbd engine at one job and queue depth 1 (--fsync=1) for 8 s, traced from
# 3 s in. The warm-up is there because a fresh server grows its heap under its first seconds of
# small writes (by some 1.4 GiB here: dirty blocks, the block cache), and each 2 MiB of growth is
# a huge page the serving core faults in and clears, stalling its requests for milliseconds;
# bench/peers.sh warms its targets up likewise. Needs
# perf with tracepoint access (root), fio, and Debian's /usr/bin/python3; builds nothing.
set -euo pipefail

bin=target/release/sluice; serve_args=(); bs=4k; vol_args=(); fio_args=(); warmup=15
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --set) serve_args+=(--set "$2"); shift 2 ;;
    --write-size) bs=$2; shift 2 ;;
    --compression) vol_args+=(--compression "$2"); shift 2 ;;
    --fio) fio_args+=("$2"); shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    *) echo "op-timeline: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $warmup =~ ^[0-9]+$ ]] || { echo "op-timeline: --warmup takes a number of seconds (0: none), not $warmup" >&2; exit 2; }
# The 4 KiB cut knows a 4 KiB write by its request's size; the large one takes 256 KiB and up.
bytes=$(numfmt --from=iec "${bs^^}" 2>/dev/null || true)
if [ -z "$bytes" ] || { [ "$bytes" -ne 4096 ] && [ "$bytes" -lt $((256 << 10)) ]; }; then
  echo "op-timeline: --write-size takes 4k or a size of 256K or more, not $bs" >&2; exit 2
fi
large=0; [ "$bytes" -ge $((256 << 10)) ] && large=1
dir=$(mktemp -d "${TMPDIR:-/tmp}/op-timeline.XXXXXX")
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT

export SLUICE_CACHE_FILE=$dir/pools
dd if=/dev/zero of="$dir/leaf.img" bs=1M count=3072 oflag=direct status=none
"$bin" pool create timeline "$dir/leaf.img" >/dev/null
"$bin" vol create timeline/disk --size 1536M ${vol_args[@]+"${vol_args[@]}"} >/dev/null
"$bin" serve timeline --socket "$dir/s.sock" --listen none --dir "$dir" ${serve_args[@]+"${serve_args[@]}"} 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null 2>&1
if [ "$warmup" -gt 0 ]; then
  fio --name=warmup --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=1G \
    --time_based --runtime="$warmup" --end_fsync=1 >/dev/null 2>&1
fi
# The last txg sync of the prefill (or warm-up), past txg.timeout_ms, so it is not in the traced
# second.
sleep 6
# Large writes sequential, as bench/peers.sh's 1 MiB write + flush jobs are.
rw=randwrite; [ "$large" = 1 ] && rw=write
fio --name=op --ioengine=nbd --uri="$uri" --bs="$bs" --size=1G --runtime=8 --time_based \
  --rw=$rw --fsync=1 --numjobs=1 --iodepth=1 ${fio_args[@]+"${fio_args[@]}"} >/dev/null 2>&1 &
fio_pid=$!
sleep 3
events=io_uring:io_uring_submit_req,io_uring:io_uring_complete
events+=,syscalls:sys_exit_recvfrom,syscalls:sys_exit_recvmsg,syscalls:sys_enter_sendto
perf record -q -p "$pid" -e "$events" -o "$dir/trace.data" -- sleep 1 >/dev/null 2>&1
wait "$fio_pid"
perf script -i "$dir/trace.data" -F comm,time,event,trace 2>/dev/null >"$dir/trace.txt"
/usr/bin/python3 - "$dir/trace.txt" "$bytes" <<'PY'
import re, statistics, sys


def large_writes(payload):
    """Operations of a write of `payload` bytes (256 KiB or more) and its flush, cut into
    segments."""
    # Every thread of the server: the serving core's, the main runtime's (fills of parts handed
    # over early run there) and the io_uring workers' (a flush is run by one). Receives that
    # returned data (the header and the payload's start come through the connection's buffer,
    # the rest straight into the blocks), the replies sent, and the rings' writes and flushes,
    # each paired with the first completion of its ring and user data after it (every ring
    # numbers its own).
    events = []
    pending = {}
    for line in open(sys.argv[1]):
        m = re.match(r"\s*(\S+)\s+([\d.]+):\s+(\S+):\s*(.*)", line)
        if not m:
            continue
        t, name, fields = float(m.group(2)) * 1e6, m.group(3), m.group(4)
        if name in ("syscalls:sys_exit_recvmsg", "syscalls:sys_exit_recvfrom"):
            ret = int(fields.split()[-1], 16)
            if 0 < ret < 1 << 62:
                events.append({"t": t, "kind": "recv"})
        elif name == "syscalls:sys_enter_sendto":
            events.append({"t": t, "kind": "reply"})
        elif name in ("io_uring:io_uring_submit_req", "io_uring:io_uring_complete"):
            ring = re.search(r"ring (0x[0-9a-f]+)", fields).group(1)
            key = (ring, re.search(r"user_data (0x[0-9a-f]+)", fields).group(1))
            if name == "io_uring:io_uring_submit_req":
                op = re.search(r"opcode (\S+),", fields).group(1)
                kind = "fsync" if op == "FSYNC" else "write" if op.startswith("WRITE") else "other"
                event = {"t": t, "kind": kind, "done": None}
                pending[key] = event
                events.append(event)
            elif key in pending:
                event = pending.pop(key)
                event["done"] = t
                event["bytes"] = int(re.search(r"result (-?\d+)", fields).group(1))
    events.sort(key=lambda e: e["t"])

    names = ("receive", "reply->last submit", "last submit->complete", "complete->fsync done",
             "fsync done->reply", "flush reply->next", "whole operation", "data: reply->submit",
             "data: submit->complete", "writes before reply")
    segments = {k: [] for k in names}
    dropped = 0
    # An operation runs from the first receive after a flush's reply to the next flush's reply;
    # replies alternate, the write's then the flush's, at queue depth 1.
    replies = [i for i, e in enumerate(events) if e["kind"] == "reply"]
    for a, b, c in zip(replies, replies[1:], replies[2:]):
        # a: the last flush's reply; b: this write's reply; c: this flush's reply.
        before, after = events[a + 1:b], events[b + 1:c]
        recvs = [e["t"] for e in before if e["kind"] == "recv"]
        fsyncs = [e for e in after if e["kind"] == "fsync"]
        nxt = next((e["t"] for e in events[c + 1:] if e["kind"] == "recv"), None)
        if not recvs or len(fsyncs) != 1 or nxt is None:
            continue
        fsync = fsyncs[0]
        # The commit's writes, whichever thread's ring took them (a leaf's queue hands a write
        # to the ring of whoever frees its slot). More bytes than the payload and a log block
        # mean a txg sync wrote in between, whose writes would be counted as the operation's:
        # dropped.
        mine = [e for e in after if e["kind"] == "write" and e["t"] < fsync["t"]]
        if not mine or fsync["done"] is None or any(e["done"] is None for e in mine):
            continue
        if sum(e["bytes"] for e in mine) > payload + LOG_BLOCK_BYTES_MAX:
            dropped += 1
            continue
        start, reply, flush_reply = recvs[0], events[b]["t"], events[c]["t"]
        last_submit = mine[-1]["t"]
        last_done = max(e["done"] for e in mine)
        fsync_done = fsync["done"]
        in_order = start < reply < last_submit < last_done <= fsync["t"] < fsync_done < flush_reply
        if not in_order:
            dropped += 1
            continue
        segments["receive"].append(reply - start)
        segments["reply->last submit"].append(last_submit - reply)
        segments["last submit->complete"].append(last_done - last_submit)
        segments["complete->fsync done"].append(fsync_done - last_done)
        segments["fsync done->reply"].append(flush_reply - fsync_done)
        segments["flush reply->next"].append(nxt - flush_reply)
        segments["whole operation"].append(nxt - start)
        # The log block goes last, once the data's checksums are done.
        data = mine[:-1]
        if data:
            segments["data: reply->submit"].append(data[0]["t"] - reply)
            segments["data: submit->complete"].append(max(e["done"] for e in data) - data[0]["t"])
        segments["writes before reply"].append(sum(1 for e in before if e["kind"] == "write"))
    note = f" ({dropped} dropped: a txg sync's writes among theirs, or out of order;"
    note += " the last row is a count)"
    return segments, note


def small_writes():
    """Operations of a 4 KiB write and its flush on the serving core, cut into segments."""
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
    return segments, ""


# The largest log block a chain writes (`intent_log.block_bytes_max`, doubled for a volume of
# 128 KiB blocks).
LOG_BLOCK_BYTES_MAX = 256 << 10
payload = int(sys.argv[2])
segments, note = large_writes(payload) if payload >= 256 << 10 else small_writes()
count = len(segments["whole operation"])
if count == 0:
    sys.exit("op-timeline: no whole operations in the trace (is perf allowed tracepoints?)")
print(f"{count} operations traced; microseconds{note}")
print(f"{'segment':24s} {'median':>8s} {'mean':>8s} {'p90':>8s} {'p99':>8s}")
for name, values in segments.items():
    # An operation whose data all went ahead of the reply has no data row.
    if values:
        cuts = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
        print(f"{name:24s} {statistics.median(values):8.0f} {statistics.mean(values):8.1f}"
              f" {cuts[89]:8.0f} {cuts[98]:8.0f}")
PY
