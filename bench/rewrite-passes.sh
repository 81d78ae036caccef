#!/usr/bin/env bash
# Repeated uncached sequential passes over a volume that random writes aged: what the read
# path's rewrite of scattered blocks (crates/engine/src/txg/dmu_rewrite.rs) does pass after
# pass. Each pass is a 1 MiB sequential read job at queue depth 8 over the first 1 GiB for
# --seconds; it prints the MB/s, the reads that found their blocks scattered, the blocks
# rewritten and deferred, and what the disk under --dir wrote per MiB read (/proc/diskstats,
# so run nothing else meanwhile). A rewrite that works moves each block once and the later
# passes find nothing scattered.
#
# Usage: bench/rewrite-passes.sh [--bin PATH] [--dir DIR] [--leaf-mib N (4096: twice the
#        volume, bench/peers.sh's layout)] [--passes N (6)] [--seconds N (5)] [--age S (30)]
#        [--set NAME=VALUE (sluice tunable; cache.contents=metadata is always set)]...
# The pool is one zeroed file leaf of --leaf-mib with a 2 GiB volume of 16 KiB blocks, written
# sequentially, then 4 KiB random writes at queue depth 32 for --age seconds and a flush.
# Needs fio and /usr/bin/python3; builds nothing.
set -euo pipefail
bin=target/release/sluice; dir=/var/tmp/sluice-rewrite-passes; leaf_mib=4096; passes=6
seconds=5; age=30; serve_args=(--set cache.contents=metadata)
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --leaf-mib) leaf_mib=$2; shift 2 ;;
    --passes) passes=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --age) age=$2; shift 2 ;;
    --set) serve_args+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rewrite-passes: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$leaf_mib" -ge 2560 ] || { echo "rewrite-passes: --leaf-mib must be at least 2560 (the 2 GiB volume and room)" >&2; exit 2; }
rm -rf "$dir"; mkdir -p "$dir"
disk=$(findmnt -no MAJ:MIN -T "$dir" | head -1 | tr -d ' ')
export SLUICE_CACHE_FILE=$dir/pools
pid=""
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT
dd if=/dev/zero of="$dir/leaf.img" bs=1M count="$leaf_mib" oflag=direct status=none
"$bin" pool create passes "$dir/leaf.img" >/dev/null
"$bin" vol create passes/disk --size 2048M >/dev/null
"$bin" serve passes --socket "$dir/s.sock" --listen none --dir "$dir" "${serve_args[@]}" 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
[ -S "$dir/s.sock" ] || { cat "$dir/serve.log" >&2; exit 1; }
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=2048M >/dev/null 2>&1
fio --name=age --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=2048M \
  --runtime="$age" --time_based --end_fsync=1 >/dev/null 2>&1
"$bin" pool sync passes >/dev/null
rewrite_stats() {
  "$bin" pool iostat passes --json | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.readline())["volumes"][0]["rewrite"]
print(r["scattered_reads"], r["blocks_rewritten"], r["blocks_deferred"])'
}
written() { awk -v d="$disk" '$1 ":" $2 == d { print $10 }' /proc/diskstats; }
for pass in $(seq 1 "$passes"); do
  s0=$(rewrite_stats); w0=$(written)
  out=$(fio --name=pass --ioengine=nbd --uri="$uri" --rw=read --bs=1M --iodepth=8 --size=1024M \
    --runtime="$seconds" --time_based --output-format=json 2>/dev/null | grep -v '^fio: ')
  s1=$(rewrite_stats); w1=$(written)
  /usr/bin/python3 - "$out" "$s0" "$s1" "${w0:-0}" "${w1:-0}" "$pass" <<'PY'
import json, sys
out, s0, s1, w0, w1, n = sys.argv[1:]
r = json.loads(out)["jobs"][0]["read"]
a, b = [int(x) for x in s0.split()], [int(x) for x in s1.split()]
mib = r["io_bytes"] / 2**20
print(f"pass {n}: {r['bw_bytes'] / 1e6:,.0f} MB/s, {mib:,.0f} MiB read; {b[0] - a[0]:,} reads found "
      f"their blocks scattered, {b[1] - a[1]:,} blocks rewritten, {b[2] - a[2]:,} deferred; the disk "
      f"wrote {(int(w1) - int(w0)) / 2 / mib:,.0f} KiB per MiB read")
PY
done
