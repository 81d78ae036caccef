#!/usr/bin/env bash
# Snapshot create and destroy time against volume size: neither walks the volume, so a 64 GiB
# volume should take what a 1 GiB one takes.
#
# One served pool (a 2-way mirror of sparse files in --dir) holds a thin volume of each size,
# compression off. Each is written across its whole range, one 16 KiB block of random bytes
# in every MiB, so its tree of indirect blocks spans the volume (1,024 blocks for 1 GiB,
# 65,536 for 64 GiB). Then, per round and size, alternating the sizes:
#   - create: wall time of `sluice snapshot create` through the server's control socket (a new
#     process, the socket round trip and the txg sync that takes the snapshot);
#   - 1,000 random blocks of the volume's first GiB overwritten and flushed (the same blocks
#     whatever the size, so the snapshot then holds alone the same data and nearly the same
#     indirect blocks: the larger tree has one level more);
#   - `sluice pool sync` writes them out (the snapshot's USED then counts them);
#   - destroy: wall time of `sluice snapshot destroy` (reads the volume's dead list, frees the
#     blocks the snapshot held alone, in one sync).
# For scale, `nbdinfo --map` of each volume: a walk of every pointer of its tree, which is what
# a create or destroy that walked the volume would cost at least.
# Usage: bench/snapshot.sh [--rounds 5] [--dir DIR] [--no-build] [--report PATH.md]
set -euo pipefail
rounds=5 dir=/tmp/sluice-snapshot build=1 report=docs/bench/snapshot.md
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$(realpath -m "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    --report) report=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--dir DIR] [--no-build] [--report PATH.md]" >&2; exit 2 ;;
  esac
done
for tool in nbdinfo /usr/bin/python3; do
  command -v $tool >/dev/null || { echo "snapshot: $tool is missing" >&2; exit 1; }
done
[ "$build" = 1 ] && cargo build -q --release -p sluice-cli
bin=$(realpath target/release/sluice)
rm -rf "$dir"; mkdir -p "$dir"
export SLUICE_CACHE_FILE=$dir/cache
server=""
cleanup() { [ -n "$server" ] && kill -KILL "$server" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
sock=$dir/nbd.sock
"$bin" pool create bench mirror "$dir/a" "$dir/b" --size 80G --sparse >/dev/null
"$bin" serve bench --socket "$sock" --listen none >"$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do [ -S "$sock" ] && break; sleep 0.1; done
sizes="1G 64G"
for size in $sizes; do
  "$bin" vol create "bench/v$size" --size "$size" --sparse --compression off >/dev/null
  /usr/bin/python3 - "nbd+unix:///v$size?socket=$sock" <<'EOF'
import os, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = h.get_size()
for at in range(0, size, 1 << 20):
    h.pwrite(os.urandom(16384), at)
h.flush()
h.shutdown()
EOF
done
elapsed() { local start end; start=$(date +%s.%N); "$@" >/dev/null; end=$(date +%s.%N); python3 -c "print(f'{($end - $start) * 1000:.1f}')"; }
declare -A create destroy walk held
for round in $(seq 1 "$rounds"); do
  for size in $sizes; do
    create[$size]+="$(elapsed "$bin" snapshot create "bench/v$size@r$round") "
    /usr/bin/python3 - "nbd+unix:///v$size?socket=$sock" "$round" <<'EOF'
import os, random, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
blocks = min(h.get_size(), 1 << 30) // 16384
rng = random.Random(int(sys.argv[2]))
for _ in range(1000):
    h.pwrite(os.urandom(16384), rng.randrange(blocks) * 16384)
h.flush()
h.shutdown()
EOF
    "$bin" pool sync bench >/dev/null
    held[$size]+="$("$bin" snapshot list "bench/v$size" -H | awk -v s="bench/v$size@r$round" '$1 == s {print $2}') "
    destroy[$size]+="$(elapsed "$bin" snapshot destroy "bench/v$size@r$round") "
    walk[$size]+="$(elapsed nbdinfo --map "nbd+unix:///v$size?socket=$sock") "
  done
done
kill -INT "$server"; wait "$server" 2>/dev/null || true; server=""
median() { python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.1f}')" $1; }
table() {
  echo "| volume | snapshot create, ms | snapshot destroy, ms | what it freed (its USED) | nbdinfo --map (a walk of the tree), ms |"
  echo "|---|---:|---:|---:|---:|"
  for size in $sizes; do
    echo "| $size | $(median "${create[$size]}") | $(median "${destroy[$size]}") | $(python3 -c "import statistics, sys; print(f'{statistics.median(map(int, sys.argv[1:])) / 1048576:.1f} MiB')" ${held[$size]}) | $(median "${walk[$size]}") |"
  done
  echo
  echo "Each round's figures, in order:"
  echo
  for size in $sizes; do
    echo "- $size: create ${create[$size]}; destroy ${destroy[$size]}; freed ${held[$size]}; map ${walk[$size]}"
  done
}
table
if [ -n "$report" ]; then
  {
    echo "# Snapshot create and destroy against volume size"
    echo
    echo "Command: \`bench/snapshot.sh --rounds $rounds\`; machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -r); date: $(date -u +%Y-%m-%d); commit $(git rev-parse --short HEAD)."
    echo
    echo "Medians of $rounds rounds (sizes alternating within each round). Each time is a whole"
    echo "\`sluice\` command through the served pool's control socket: process start, the socket"
    echo "round trip and the txg sync that makes the change. Volumes thin, compression off, one"
    echo "16 KiB block written in every MiB, so each tree spans its volume (1,024 and 65,536 data"
    echo "blocks). Before each destroy, the same 1,000 random blocks of each volume's first GiB were"
    echo "overwritten: the snapshot then held those alone, with the indirect blocks above them"
    echo "(one level more in the larger tree), which is what the destroy reads and frees. \`nbdinfo"
    echo "--map\` reads every pointer of the tree: the least a create or destroy that walked the"
    echo "volume would cost."
    echo
    table
  } >"$report"
  echo "snapshot: wrote $report"
fi
