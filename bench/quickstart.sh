#!/usr/bin/env bash
# The quick start as a new user meets it: `sluice serve` with no pool on a fresh directory.
# Prints the disk its default pool takes when it answers its first client, how long it took
# to get there, and the 4 KiB write + flush IOPS of its first SECONDS (fio, JOBS jobs at queue
# depth 1, a flush after every write, over the whole 8 GiB vol0), with the server's CPU per
# operation.
#
# Usage: bench/quickstart.sh [--bin PATH] [--seconds 30] [--jobs 8] [--dir PARENT]
# Needs fio and python3; builds nothing. The directory is made under PARENT (default: the
# current directory's filesystem, as a user's would be) and removed after.
set -euo pipefail

bin=target/release/sluice; seconds=30; jobs=8; parent=$PWD
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --dir) parent=$2; shift 2 ;;
    *) echo "quickstart: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin=$(realpath "$bin")
dir=$(mktemp -d "$parent/quickstart.XXXXXX")
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT
export SLUICE_CACHE_FILE=$dir/pools

start=$(date +%s.%N)
(cd "$dir" && exec "$bin" serve --listen none) >"$dir/serve.log" 2>&1 &
pid=$!
uri="nbd+unix:///vol0?socket=$dir/sluice-data/nbd.sock"
for _ in $(seq 1 6000); do
  grep -q "sluice: serving" "$dir/serve.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/serve.log"; exit 1; }
  sleep 0.05
done
# The first client: nbdinfo-free, a one-sector read through fio would start the clock late;
# the server answers clients once it says it is serving.
ready=$(date +%s.%N)
used_kib=$(du -sk "$dir/sluice-data" | cut -f1)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(cpu)
fio --name=qs --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --numjobs="$jobs" --iodepth=1 \
  --fsync=1 --size=8G --runtime="$seconds" --time_based --group_reporting \
  --output-format=json 2>/dev/null | grep -v '^fio: ' >"$dir/fio.json"
after=$(cpu)
/usr/bin/python3 - "$dir/fio.json" "$seconds" "$before" "$after" "$used_kib" "$start" "$ready" "$bin" <<'PY'
import json, os, sys
path, seconds, before, after, used_kib, start, ready, binary = sys.argv[1:]
iops = json.load(open(path))["jobs"][0]["write"]["iops"]
ops = iops * float(seconds)
tick = os.sysconf("SC_CLK_TCK")
cpu_us = (float(after) - float(before)) / tick / ops * 1e6
print(f"{binary}: disk used at the first client {int(used_kib) / 1024:,.0f} MiB after "
      f"{float(ready) - float(start):.1f} s; 4 KiB write + flush over the first {seconds} s: "
      f"{iops:,.0f} IOPS, server CPU {cpu_us:.0f} us/op")
PY
