#!/usr/bin/env bash
# The promise a thick volume makes, on a pool it nearly fills: none of its writes is refused for
# space and no sync fails. For each run: a fresh pool of one file leaf of LEAF_GIB GiB, the
# largest thick volume it accepts (tried in 32 MiB steps down from the leaf's size), written
# whole with 1 MiB writes, then six fio jobs of 10 s each over it, in turn: 1 MiB writes at
# queue depth 8; the same with data that compresses to about half; 4 KiB random writes at
# queue depth 32; 1 MiB write + flush from 4 clients, each in its own quarter; 1 MiB random
# writes at queue depth 8; 4 and 8 KiB random writes from 8 clients with a flush every 4.
# Fails (exit 1) at the first job fio reports an error for, or whose server log says the pool
# was suspended, and keeps that server log as thick-full-RUN.log in the current directory.
#
# Usage: bench/thick-full.sh [--bin PATH] [--runs N] [--leaf-gib G] [--dir DIR]
# Needs fio with its nbd engine; builds nothing (default binary: target/release/sluice).
set -euo pipefail
bin=target/release/sluice runs=2 gib=2 dir=${TMPDIR:-/tmp}
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --leaf-gib) gib=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: $0 [--bin PATH] [--runs N] [--leaf-gib G] [--dir DIR]" >&2; exit 2 ;;
  esac
done
bin=$(realpath "$bin")
[ -x "$bin" ] || { echo "thick-full: $bin is not an executable (build it: cargo build --release)" >&2; exit 2; }
command -v fio >/dev/null || { echo "thick-full: fio is missing (apt-get install fio)" >&2; exit 2; }
work=$(mktemp -d "$dir/thick-full.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/pools
for run in $(seq 1 "$runs"); do
  d=$work/$run; mkdir -p "$d"
  fallocate -l "${gib}G" "$d/leaf.img"
  "$bin" pool create "tf$run" "$d/leaf.img" >/dev/null
  size=$(( gib * 1024 ))
  until "$bin" vol create "tf$run/disk" --size "${size}M" >/dev/null 2>&1; do size=$(( size - 32 )); done
  echo "thick-full: run $run: a thick volume of $size MiB on $gib GiB"
  "$bin" serve "tf$run" --socket "$d/nbd.sock" --listen none --dir "$d" 2>"$d/serve.log" &
  pid=$!
  for _ in $(seq 50); do [ -S "$d/nbd.sock" ] && break; sleep 0.1; done
  f=(--ioengine=nbd --uri="nbd+unix:///disk?socket=$d/nbd.sock" --size="${size}M")
  quarter=$(( size / 4 ))
  jobs=("--rw=write --bs=1M --iodepth=8 --end_fsync=1"
    "--rw=write --bs=1M --iodepth=8 --end_fsync=1 --buffer_compress_percentage=50 --refill_buffers"
    "--rw=randwrite --bs=4k --iodepth=32 --end_fsync=1"
    "--rw=write --bs=1M --iodepth=1 --fsync=1 --numjobs=4 --offset_increment=${quarter}M --size=${quarter}M"
    "--rw=randwrite --bs=1M --iodepth=8 --end_fsync=1"
    "--rw=randwrite --bsrange=4k-8k --iodepth=1 --numjobs=8 --fsync=4")
  fio --name=fill "${f[@]}" --rw=write --bs=1M --iodepth=8 --end_fsync=1 >"$d/fio.log" 2>&1 ||
    { cp "$d/serve.log" "thick-full-$run.log"; echo "thick-full: FAIL: run $run: writing the volume whole failed" >&2; exit 1; }
  for job in "${jobs[@]}"; do
    # shellcheck disable=SC2086 # each job is a list of fio options
    if ! fio --name=job "${f[@]}" --time_based --runtime=10 $job >>"$d/fio.log" 2>&1 ||
      grep -q suspended "$d/serve.log"; then
      cp "$d/serve.log" "thick-full-$run.log"
      grep -h "err=" "$d/fio.log" | grep -v "err= 0" | head -3 >&2 || true
      echo "thick-full: FAIL: run $run, job '$job' (server log: thick-full-$run.log)" >&2
      exit 1
    fi
  done
  kill -TERM "$pid"; wait "$pid" || true; pid=
  rm -rf "$d"
  echo "thick-full: run $run: every job ran clean"
done
echo "thick-full: ok ($runs runs)"
