#!/usr/bin/env bash
# Resilver rate and client sync writes during a resilver, on this machine's disk.
#
# `sluice serve` on its default pool (a 2-way mirror of two files in --dir) with a volume of
# --size. Each round: leg1 is taken offline (`pool offline -t`), fio rewrites the whole volume
# in 1 MiB blocks, leg1 comes back (`pool online`) and the background resilver copies what it
# missed. Measured per round:
#   - the resilver alone: bytes resilvered (from `pool status`) over the wall time from
#     `pool online` to the status saying it finished;
#   - dd copying the same number of bytes from leg0's file to a new file on the same disk
#     (O_DIRECT both ways, fdatasync at the end): what the disk gives one sequential copy;
#   - 4 KiB random write + flush (fio --fsync=1, 8 jobs) for --seconds while a second
#     resilver of the same size runs, and for --seconds without one: IOPS and p99.
# Rounds alternate the with/without order; the table gives each round and the medians.
# Usage: bench/resilver.sh [--size 2G] [--rounds 3] [--seconds 5] [--dir DIR] [--no-build]
#          [--report PATH.md] [--set TUNABLE=VALUE]...
set -euo pipefail
size=2G rounds=3 seconds=5 dir=/tmp/sluice-resilver build=1 report=docs/bench/resilver.md
sets=()
while [ $# -gt 0 ]; do
  case $1 in
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --report) report=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    *) echo "usage: $0 [--size 2G] [--rounds N] [--seconds N] [--dir DIR] [--no-build] [--report PATH.md]" >&2; exit 2 ;;
  esac
done
[ "$build" = 1 ] && cargo build -q --release -p sluice-cli
bin=$(realpath target/release/sluice)
command -v fio >/dev/null || { echo "resilver: fio is missing" >&2; exit 1; }
rm -rf "$dir"; mkdir -p "$dir"
export SLUICE_CACHE_FILE=$dir/cache
server=""
cleanup() { [ -n "$server" ] && kill -KILL "$server" 2>/dev/null || true; }
trap cleanup EXIT
bytes=$(numfmt --from=iec "$size")
leaf=$(( bytes * 2 + (1 << 30) ))
"$bin" serve --dir "$dir/data" --leaf-size "$leaf" --volume-size "$bytes" --listen 127.0.0.1:0 \
  --set cache.bytes_max=64M "${sets[@]}" >"$dir/server.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do grep -q "sluice: serving" "$dir/server.log" && break; sleep 0.1; done
tcp=$(sed -n 's/.*tcp:\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$dir/server.log" | head -1)
[ -n "$tcp" ] || { cat "$dir/server.log"; exit 1; }
uri="nbd://$tcp/vol0"
now() { date +%s.%N; }
status() { "$bin" pool status sluice; }
# Leg1 misses a rewrite of the whole volume, then comes back; prints the online time.
miss_and_return() {
  "$bin" pool offline -t sluice leg1.img >/dev/null
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size="$bytes" --iodepth=4 \
    --output="$dir/fill.out" >/dev/null 2>&1
  # Past a txg timeout (5 s), so the rewrite is synced while leg1 is away: otherwise what is
  # still dirty when it returns goes to both legs, and the resilver has little to copy.
  sleep 6
  "$bin" pool online sluice leg1.img >/dev/null
}
wait_resilver() {
  for _ in $(seq 1 6000); do
    status | grep -q "scan: resilver took" && return 0
    sleep 0.05
  done
  echo "resilver: no end in 300 s" >&2; status >&2; exit 1
}
resilvered_bytes() {
  status | sed -n 's/.*scan: resilver took [0-9:.]*: \([0-9.]*\)\([KMGT]\) checked.*/\1 \2/p' \
    | awk '{m=1; if($2=="K")m=1024; if($2=="M")m=1048576; if($2=="G")m=1073741824; if($2=="T")m=1099511627776; printf "%d", $1*m}'
}
syncwrite() {
  fio --name=sw --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --fsync=1 --numjobs=8 \
    --iodepth=1 --size="$bytes" --time_based --runtime="$seconds" --group_reporting \
    --output-format=json --output="$dir/$1.json" >/dev/null 2>&1
  grep -v '^fio: ' "$dir/$1.json" | /usr/bin/python3 -c "
import json,sys
w=json.load(sys.stdin)['jobs'][0]['write']
print('%.0f %.0f' % (w['iops'], w['clat_ns']['percentile']['99.000000']/1000))"
}
echo "| round | resilvered | resilver s | resilver MB/s | dd MB/s | resilver / dd | IOPS without | IOPS during | p99 us without | p99 us during |" >"$dir/rows.md"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" >>"$dir/rows.md"
for round in $(seq 1 "$rounds"); do
  echo "resilver: round $round/$rounds" >&2
  t0=$(now); miss_and_return; t1=$(now)
  wait_resilver; t2=$(now)
  got=$(resilvered_bytes)
  secs=$(echo "$t2 - $t1" | bc -l)
  rate=$(echo "$got / $secs / 1000000" | bc -l)
  rm -f "$dir/dd.out"
  ddsecs=$( { /usr/bin/time -f %e dd if="$dir/data/leg0.img" of="$dir/dd.out" bs=1M \
      count=$(( got / 1048576 )) iflag=direct oflag=direct conv=fdatasync status=none; } 2>&1 )
  rm -f "$dir/dd.out"
  ddrate=$(echo "$got / $ddsecs / 1000000" | bc -l)
  if [ $(( round % 2 )) = 1 ]; then
    without=$(syncwrite "r$round-without")
    miss_and_return; during=$(syncwrite "r$round-during"); wait_resilver
  else
    miss_and_return; during=$(syncwrite "r$round-during"); wait_resilver
    without=$(syncwrite "r$round-without")
  fi
  printf "| %d | %s | %.1f | %.0f | %.0f | %.2fx | %s | %s | %s | %s |\n" "$round" \
    "$(numfmt --to=iec "$got")" "$secs" "$rate" "$ddrate" "$(echo "$rate / $ddrate" | bc -l)" \
    "${without% *}" "${during% *}" "${without#* }" "${during#* }" >>"$dir/rows.md"
done
kill -TERM "$server"; wait "$server" || true; server=""
{
  echo "# Resilver rate and sync writes during a resilver"
  echo
  echo "Command: \`bench/resilver.sh --size $size --rounds $rounds --seconds $seconds${sets[*]:+ ${sets[*]}}\` ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo +changes)). Machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $(uname -r); data on $(df --output=source,fstype "$dir" | tail -1 | awk '{print $2 " (" $1 ")"}'). fio $(fio --version)."
  echo
  echo "Each round: leg1 of the default 2-way mirror is taken offline, fio rewrites the whole $size volume in 1 MiB blocks, leg1 comes back and the background resilver copies what it missed (the bytes shown). Resilver time runs from \`pool online\` to \`pool status\` reporting the end (polled every 50 ms). dd copies the same bytes from leg0's file to a new file on the same disk (O_DIRECT, fdatasync). The IOPS columns are 4 KiB random write + flush from 8 fio jobs for $seconds s, without a resilver and while a second resilver of the same size runs (the order alternates by round)."
  echo
  cat "$dir/rows.md"
} >"$report"
echo "resilver: wrote $report" >&2
