#!/usr/bin/env bash
# What one durable 4 KiB write costs the disk under the data directory, four ways, with no
# server in between: the floor under any server's write + flush at one client.
#
# Usage: bench/durable-write.sh [--dir DIR] [--seconds N] [--rounds N]
#   psync-fdatasync   pwrite, then fdatasync (what qemu-nbd's write and flush do)
#   pvsync2-dsync     pwritev2 on an O_DSYNC descriptor (the write is durable when it returns)
#   uring-dsync       the same through io_uring (what sluice's log block write does)
#   uring-fdatasync   an io_uring write, then an io_uring fdatasync
# Each is 4 KiB random writes at queue depth 1 with O_DIRECT on a 512 MiB file written with
# zeros first (no unwritten extents), rounds alternating the four. Needs fio and python3.
set -euo pipefail

dir=/tmp/sluice-peers; seconds=6; rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "durable-write: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
file=$dir/durable-write.img
trap 'rm -f "$file"' EXIT
dd if=/dev/zero of="$file" bs=1M count=512 oflag=direct status=none
sync
common=(--name=t --filename="$file" --size=512M --rw=randwrite --bs=4k --direct=1 --iodepth=1
  --time_based --runtime="$seconds" --ramp_time=1 --output-format=json)
printf '%-16s %5s %8s %14s %13s %8s\n' way round IOPS "write p50 us" "sync p50 us" "ctx/op"
for round in $(seq 1 "$rounds"); do
  for way in psync-fdatasync pvsync2-dsync uring-dsync uring-fdatasync; do
    case $way in
      psync-fdatasync) args=(--ioengine=psync --fdatasync=1) ;;
      pvsync2-dsync) args=(--ioengine=pvsync2 --sync=dsync) ;;
      uring-dsync) args=(--ioengine=io_uring --sync=dsync) ;;
      uring-fdatasync) args=(--ioengine=io_uring --fdatasync=1) ;;
    esac
    fio "${common[@]}" "${args[@]}" | python3 -c '
import json, sys
job = json.load(sys.stdin)["jobs"][0]
write, sync = job["write"], job.get("sync", {})
def p50(lat):
    return lat.get("percentile", {}).get("50.000000", 0) / 1000
ops = write["total_ios"] or 1
synced = "%.1f" % p50(sync["lat_ns"]) if sync.get("lat_ns", {}).get("percentile") else "-"
print("%-16s %5s %8.0f %14.1f %13s %8.2f" % (sys.argv[1], sys.argv[2], write["iops"],
      p50(write["clat_ns"]), synced, job["ctx"] / ops))' "$way" "$round"
  done
done
