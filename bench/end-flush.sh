#!/usr/bin/env bash
# What a stream's final flush costs: 1 MiB sequential writes at queue depth 8 for 10 s over the
# first SPAN of a thick 2 GiB volume (16 KiB blocks, default tunables) on one file leaf, ended
# by fio's --end_fsync=1 as bench/peers.sh's seqwrite-1m is, then the intent log's counters
# from `pool status` (how the flush was answered: blocks written in place, records sharing a
# block, records left to their txg's sync, or a txg sync). fio's runtime over the 10 s is the
# final flush's time.
#
# Usage: bench/end-flush.sh [--bin PATH] [--span 1G] [--leaf-mib 4096] [--fio "ARGS"]
#   --span:     the range the stream goes over (64M: each block written many times per txg)
#   --leaf-mib: the leaf's size (4096: bench/peers.sh's pool, where the thick volume holds
#               half the pool)
#   --fio:      fio arguments in place of --iodepth=8 (e.g. "--iodepth=1 --fsync=1")
# Needs fio and python3; builds nothing.
set -euo pipefail

bin=target/release/sluice; span=1G; leaf_mib=4096; fio_args="--iodepth=8"
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --span) span=$2; shift 2 ;;
    --leaf-mib) leaf_mib=$2; shift 2 ;;
    --fio) fio_args=$2; shift 2 ;;
    *) echo "end-flush: unknown argument $1" >&2; exit 2 ;;
  esac
done
dir=$(mktemp -d "${TMPDIR:-/tmp}/end-flush.XXXXXX")
pid=""
# The server ends with the status of its signal: under set -e that status would end the
# handler before its rm.
cleanup() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi; rm -rf "$dir"; }
trap cleanup EXIT
export SLUICE_CACHE_FILE=$dir/pools
dd if=/dev/zero of="$dir/leaf.img" bs=1M count="$leaf_mib" oflag=direct status=none
"$bin" pool create ef "$dir/leaf.img" >/dev/null
"$bin" vol create ef/disk --size 2G >/dev/null
"$bin" serve ef --socket "$dir/s.sock" --listen none --dir "$dir" 2>"$dir/serve.log" &
pid=$!
for _ in $(seq 1 100); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
uri="nbd+unix:///disk?socket=$dir/s.sock"
fio --name=prefill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=2G \
  >/dev/null 2>&1
"$bin" pool sync ef >/dev/null
# shellcheck disable=SC2086 # the fio arguments are words
fio --name=op --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size="$span" --runtime=10 \
  --time_based --end_fsync=1 --output-format=json $fio_args 2>/dev/null \
  | grep -v '^fio: ' >"$dir/fio.json"
/usr/bin/python3 - "$dir/fio.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(f"{w['bw'] / 1024:,.0f} MiB/s; runtime {w['runtime']} ms (10,000 of writes, the rest the "
      f"final flush); {w['io_bytes'] >> 20:,} MiB written")
PY
"$bin" pool status ef | grep "intent log"
