#!/usr/bin/env bash
# Replication cost: `sluice send | sluice recv` against nbdcopy of the same snapshot through the
# same kind of pipe, and the size of incremental streams against the share of blocks changed.
#
# Two served pools (each a 2-way mirror of sparse files in --dir), src and dst. src/vm is a
# 1 GiB volume (16 KiB blocks, lz4) written in full: half random bytes, half text, as a VM
# image with compressible and incompressible parts. Snapshot src/vm@base. Then, per round,
# alternating the two ways:
#   - send:    `sluice send src/vm@base | sluice recv dst/sN` (both through the servers'
#              control sockets; the receive has synced when it returns);
#   - nbdcopy: `nbdcopy --flush SRC - | nbdcopy --flush - DST` from the export vm@base to a new
#              1 GiB volume dst/cN (nbdcopy's raw stream on a pipe; --flush makes it durable).
# Each is timed (wall), with the CPU of every process it involves: the client commands and
# both servers (utime + stime from /proc). The copy is destroyed between rounds.
# Then, from @base, 1%, 10% and 50% of the blocks (chosen at random) are overwritten with
# random bytes, a snapshot taken, and the incremental stream `send -i @base` measured in bytes.
# Usage: bench/send_recv.sh [--rounds 3] [--dir DIR] [--no-build] [--report PATH.md]
set -euo pipefail
rounds=3 dir=/tmp/sluice-sendrecv build=1 report=docs/bench/send-recv.md
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --dir) dir=$(realpath -m "$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    --report) report=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--dir DIR] [--no-build] [--report PATH.md]" >&2; exit 2 ;;
  esac
done
for tool in nbdcopy /usr/bin/python3; do
  command -v $tool >/dev/null || { echo "send_recv: $tool is missing" >&2; exit 1; }
done
[ "$build" = 1 ] && cargo build -q --release -p sluice-cli
bin=$(realpath target/release/sluice)
rm -rf "$dir"; mkdir -p "$dir"
export SLUICE_CACHE_FILE=$dir/cache
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
for pool in src dst; do
  "$bin" pool create $pool mirror "$dir/$pool-a" "$dir/$pool-b" --size 8G --sparse >/dev/null
  "$bin" serve $pool --socket "$dir/$pool.sock" --listen none >"$dir/$pool.log" 2>&1 &
  pids+=($!)
done
for s in src dst; do for _ in $(seq 1 600); do [ -S "$dir/$s.sock" ] && break; sleep 0.1; done; done
uri() { echo "nbd+unix:///$2?socket=$dir/$1.sock"; }
"$bin" vol create src/vm --size 1G --sparse >/dev/null
/usr/bin/python3 - "$(uri src vm)" <<'EOF'
import os, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
text = (b"sluice replicates volumes between pools; " * 30000)[:1 << 20]
for mib in range(1024):
    h.pwrite(os.urandom(1 << 20) if mib % 2 == 0 else text, mib << 20)
h.flush()
h.shutdown()
EOF
"$bin" snapshot create src/vm@base >/dev/null
ticks=$(getconf CLK_TCK)
# CPU seconds the two servers have used so far.
server_cpu() {
  local total=0
  for p in "${pids[@]}"; do
    read -r -a f <"/proc/$p/stat"
    total=$((total + f[13] + f[14]))
  done
  echo "$total"
}
# Runs "$@" under bash, printing "wall_s cpu_s" (the command's processes plus the servers').
measure() {
  local before after t0 t1 out
  before=$(server_cpu)
  t0=$(date +%s.%N)
  /usr/bin/time -o "$dir/time" -f "%U %S" bash -c "$1" >/dev/null 2>"$dir/measure.log" \
    || { cat "$dir/measure.log" >&2; exit 1; }
  out=$(tail -1 "$dir/time")
  t1=$(date +%s.%N)
  after=$(server_cpu)
  /usr/bin/python3 -c "
import sys
u, s = map(float, '$out'.split())
print(f'{$t1 - $t0:.3f} {u + s + ($after - $before) / $ticks:.3f}')"
}
results=$dir/results
: >"$results"
for round in $(seq 1 "$rounds"); do
  for way in send nbdcopy; do
    if [ $way = send ]; then
      m=$(measure "'$bin' send src/vm@base | '$bin' recv dst/s$round")
      bytes=$("$bin" send src/vm@base | wc -c)
      "$bin" vol destroy -r dst/s$round >/dev/null
    else
      "$bin" vol create dst/c$round --size 1G --sparse >/dev/null
      m=$(measure "nbdcopy --flush '$(uri src vm@base)' - | nbdcopy --flush - '$(uri dst c$round)'")
      bytes=$((1 << 30))
      "$bin" vol destroy dst/c$round >/dev/null
    fi
    "$bin" pool sync dst >/dev/null
    echo "$way $round $m $bytes" | tee -a "$results"
  done
done
full=$("$bin" send src/vm@base | wc -c)
for pct in 1 10 50; do
  "$bin" vol rollback src/vm@base >/dev/null
  /usr/bin/python3 - "$(uri src vm)" "$pct" <<'EOF'
import os, random, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
blocks = (1 << 30) // 16384
rng = random.Random(int(sys.argv[2]))
for b in sorted(rng.sample(range(blocks), blocks * int(sys.argv[2]) // 100)):
    h.pwrite(os.urandom(16384), b * 16384)
h.flush()
h.shutdown()
EOF
  "$bin" snapshot create src/vm@p$pct >/dev/null
  bytes=$("$bin" send -i @base src/vm@p$pct | wc -c)
  echo "incremental $pct $bytes $full" | tee -a "$results"
  "$bin" snapshot destroy src/vm@p$pct >/dev/null
done
commit=$(git rev-parse --short HEAD)
/usr/bin/python3 - "$results" "$report" "$rounds" "$commit" <<'EOF'
import statistics, sys, datetime, platform, os
results, report, rounds, commit = sys.argv[1:]
rows = [l.split() for l in open(results) if l.strip()]
def med(way, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == way)
GiB = 1 << 30
send_wall, send_cpu = med("send", 2), med("send", 3)
copy_wall, copy_cpu = med("nbdcopy", 2), med("nbdcopy", 3)
send_bytes = med("send", 4)
cpus = os.cpu_count()
lines = []
lines.append("# Send and receive against nbdcopy")
lines.append("")
lines.append(f"Measured {datetime.date.today()} at commit {commit} with `bench/send_recv.sh --rounds {rounds}` "
             f"on this development VM ({cpus} vCPUs, {platform.machine()}, Debian; the pools are sparse "
             "files on its virtual disk). Medians of the rounds, the two ways alternating.")
lines.append("")
lines.append("A 1 GiB volume written in full (half random bytes, half text; lz4) is copied from one "
             "served pool to another through a pipe: `sluice send src/vm@base | sluice recv dst/sN` "
             "against `nbdcopy --flush SRC - | nbdcopy --flush - DST` (the export vm@base to a new "
             "volume). CPU is every process involved: the client commands and both servers.")
lines.append("")
lines.append("| way | wall (s) | MiB/s of volume | CPU (s) | bytes through the pipe |")
lines.append("|---|---:|---:|---:|---:|")
lines.append(f"| send \\| recv | {send_wall:.2f} | {1024 / send_wall:.0f} | {send_cpu:.2f} | {send_bytes / 2**20:.0f} MiB |")
lines.append(f"| nbdcopy \\| nbdcopy | {copy_wall:.2f} | {1024 / copy_wall:.0f} | {copy_cpu:.2f} | 1024 MiB |")
lines.append("")
lines.append(f"send | recv takes {send_wall / copy_wall:.2f}x nbdcopy's time and {send_cpu / copy_cpu:.2f}x its CPU, "
             f"and moves {send_bytes / GiB:.2f}x the bytes (compressed blocks travel compressed). Beyond "
             "the copy, the receiver gets the snapshot itself (name, guid, creation time), so later "
             "incremental streams apply to it; nbdcopy gives a volume with no history.")
lines.append("")
lines.append("Every round:")
lines.append("")
lines.append("| way | round | wall (s) | CPU (s) | bytes |")
lines.append("|---|---:|---:|---:|---:|")
for r in rows:
    if r[0] in ("send", "nbdcopy"):
        lines.append(f"| {r[0]} | {r[1]} | {float(r[2]):.2f} | {float(r[3]):.2f} | {int(float(r[4]))} |")
lines.append("")
lines.append("## Incremental stream size")
lines.append("")
lines.append("From @base, a share of the volume's 65,536 blocks (chosen at random) overwritten with "
             "random bytes, a snapshot taken, and `sluice send -i @base` measured:")
lines.append("")
lines.append("| blocks changed | changed data | stream | stream / changed data | stream / full stream |")
lines.append("|---:|---:|---:|---:|---:|")
for r in rows:
    if r[0] == "incremental":
        pct, size, full = int(r[1]), int(r[2]), int(r[3])
        changed = 65536 * pct // 100 * 16384
        lines.append(f"| {pct}% | {changed / 2**20:.1f} MiB | {size / 2**20:.1f} MiB | {size / changed:.3f} | {size / full:.3f} |")
lines.append("")
lines.append("The stream follows the changed blocks: the walk skips every subtree born before @base, "
             "and each record adds 40 bytes (header and checksum) to its block.")
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
