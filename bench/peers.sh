#!/usr/bin/env bash
# Runs the same fio jobs against sluice, qemu-nbd (raw file, cache=none), nbdkit (file plugin,
# cache=none) and fio directly on a raw file (the limit), one after the other on the same disk,
# and writes a table and a plot to docs/bench/peers.md (and peers.svg). sluice runs twice: as
# it comes, and caching no data (cache.contents=metadata), like the peers' cache=none.
#
# Jobs: 4 KiB random writes with a flush after every write (fio --fsync=1) at 1, 8 and 32 jobs
# (one connection each); 4 KiB random reads at queue depth 32; 1 MiB sequential reads and
# writes. sluice serves a pool of one file leaf, like the peers' one raw file, with a volume of
# the default 16 KiB blocks.
#
# Usage: bench/peers.sh [--seconds N] [--dir DIR] [--size SIZE]
# Needs: fio, qemu-utils (qemu-nbd), nbdkit, libnbd-bin; builds target/release/sluice.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=10
dir=${TMPDIR:-/tmp}/sluice-peers
size=2G
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--dir DIR] [--size SIZE]" >&2; exit 2 ;;
  esac
done
for tool in fio qemu-nbd nbdkit nbdinfo; do
  command -v "$tool" >/dev/null || { echo "peers: $tool is missing (apt-get install fio qemu-utils nbdkit libnbd-bin)" >&2; exit 1; }
done
cargo build -q --release -p sluice-cli
bin=$PWD/target/release/sluice
rm -rf "$dir"; mkdir -p "$dir"
results=$dir/results.jsonl
: >"$results"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_socket() {
  for _ in $(seq 1 200); do [ -S "$1" ] && nbdinfo --size "nbd+unix:///$2?socket=$1" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "peers: no server on $1" >&2; exit 1
}

# One fio job: name, target label, then fio arguments.
run_fio() {
  local job=$1 target=$2; shift 2
  local out=$dir/$target-$job.json
  fio --name="$job" --time_based --runtime="$seconds" --ramp_time=1 --group_reporting \
    --output-format=json "$@" 2>/dev/null | grep -v '^fio: ' >"$out" || true
  /usr/bin/python3 - "$out" "$job" "$target" >>"$results" <<'EOF'
import json, sys
path, job, target = sys.argv[1:]
try:
    j = json.load(open(path))["jobs"][0]
except Exception as e:
    print(json.dumps({"job": job, "target": target, "error": str(e)}))
    sys.exit(0)
rw = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
lat = rw.get("clat_ns", {})
print(json.dumps({"job": job, "target": target, "iops": rw["iops"], "mb_s": rw["bw_bytes"] / 1e6,
                  "p50_us": lat.get("percentile", {}).get("50.000000", 0) / 1000,
                  "p99_us": lat.get("percentile", {}).get("99.000000", 0) / 1000}))
EOF
}

jobs() {  # target label, then the fio arguments that reach it
  local target=$1; shift
  echo "peers: $target" >&2
  for n in 1 8 32; do
    run_fio "syncwrite-$n" "$target" "$@" --rw=randwrite --bs=4k --fsync=1 --numjobs="$n" --iodepth=1 --size=1G
  done
  run_fio "randread-qd32" "$target" "$@" --rw=randread --bs=4k --iodepth=32 --numjobs=1 --size=1G
  run_fio "seqread-1m" "$target" "$@" --rw=read --bs=1M --iodepth=8 --numjobs=1 --size=1G
  run_fio "seqwrite-1m" "$target" "$@" --rw=write --bs=1M --iodepth=8 --numjobs=1 --size=1G
}

prefill() {  # writes 1 GiB of data so reads read something
  fio --name=prefill --rw=write --bs=1M --iodepth=8 --size=1G "$@" >/dev/null 2>&1
}

# 1. The raw file, directly (the limit).
truncate -s "$size" "$dir/raw.img"
prefill --ioengine=libaio --direct=1 --filename="$dir/raw.img"
jobs raw --ioengine=libaio --direct=1 --filename="$dir/raw.img"

# 2. qemu-nbd on a raw file, cache=none, as many connections as jobs.
truncate -s "$size" "$dir/qemu.img"
qemu-nbd -f raw --cache=none --aio=native -e 64 -t -k "$dir/qemu.sock" -x disk "$dir/qemu.img" &
pids+=($!); wait_socket "$dir/qemu.sock" disk
uri="nbd+unix:///disk?socket=$dir/qemu.sock"
prefill --ioengine=nbd --uri="$uri"
jobs qemu-nbd --ioengine=nbd --uri="$uri"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

# 3. nbdkit's file plugin, cache=none.
truncate -s "$size" "$dir/nbdkit.img"
nbdkit -f -U "$dir/nbdkit.sock" file file="$dir/nbdkit.img" cache=none &
pids+=($!); wait_socket "$dir/nbdkit.sock" ""
uri="nbd+unix:///?socket=$dir/nbdkit.sock"
prefill --ioengine=nbd --uri="$uri"
jobs nbdkit --ioengine=nbd --uri="$uri"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true

# 4. sluice: a pool of one file leaf, one volume; label, then `serve` arguments.
export SLUICE_CACHE_FILE=$dir/sluice-pools
sluice_target() {
  local label=$1; shift
  rm -f "$dir/sluice.img" "$SLUICE_CACHE_FILE"
  # Written once, like the peers' images after their prefill: a sparse leaf would make ext4
  # allocate extents (and commit its journal at every flush) on the first write to each
  # region, a cost of the sparse file rather than of the server.
  dd if=/dev/zero of="$dir/sluice.img" bs=1M count="$(( $(numfmt --from=iec "$size") >> 20 ))" oflag=direct status=none
  "$bin" pool create peers "$dir/sluice.img" >/dev/null
  local vol_bytes=$(( $(numfmt --from=iec "$size") * 3 / 4 / 16384 * 16384 ))
  "$bin" vol create peers/disk --size "$vol_bytes" >/dev/null
  "$bin" serve peers --socket "$dir/sluice.sock" --listen none --dir "$dir" "$@" 2>"$dir/$label.log" &
  pids+=($!); wait_socket "$dir/sluice.sock" disk
  uri="nbd+unix:///disk?socket=$dir/sluice.sock"
  prefill --ioengine=nbd --uri="$uri"
  jobs "$label" --ioengine=nbd --uri="$uri"
  kill -TERM "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
}
sluice_target sluice
# 5. The same caching no data (ZFS's primarycache=metadata): qemu-nbd and nbdkit run
# cache=none, and sluice's default cache (an eighth of memory) holds this whole volume, so this
# column shows what the disk path does. Indirect blocks stay cached, as in any ZFS setting.
sluice_target sluice-nocache --set cache.contents=metadata

/usr/bin/python3 bench/peers_report.py "$results" "$seconds" docs/bench/peers.md docs/bench/peers.svg
echo "peers: wrote docs/bench/peers.md and docs/bench/peers.svg" >&2
