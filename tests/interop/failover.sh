#!/usr/bin/env bash
# A mirror leg taken out of service and back while a client writes: `sluice serve` on its
# default pool (a 2-way mirror of two files), fio writing 4 KiB blocks with crc32c
# verification; meanwhile `pool offline -t` takes leg1 out (status DEGRADED, leg1 OFFLINE with
# an action line), `pool online` returns it and a background resilver copies what it missed.
# fio must end without an error (its read-back verifies every block), `pool scrub -w` must
# find nothing to repair, and, with leg0 moved away, the server on leg1 alone must return
# every block fio wrote (fio --verify_only).
# Then a leg dies under load and is replaced: with leg0 back and fio writing and verifying
# again, `pool inject` makes every write to leg1 fail; the diagnosis faults it (status FAULTED,
# pool DEGRADED, an action naming `pool replace`); `pool replace` puts a new file leg2 in its
# place, whose background resilver's progress moves in `pool status`; leg1 is detached when it
# ends; fio ends without an error, the pool is ONLINE on leg0 and leg2, and a scrub finds
# nothing to repair. Run by scripts/test; needs the sluice binary as $1 (default
# target/release/sluice) and fio.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
work=$(mktemp -d)
server=""
fio_pid=""
cleanup() {
  if [ -n "$fio_pid" ] && kill -0 "$fio_pid" 2>/dev/null; then kill -KILL "$fio_pid" 2>/dev/null || true; fi
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
fail() { echo "failover: FAIL: $*" >&2; exit 1; }
step() { echo "failover: $*"; }
command -v fio >/dev/null || fail "fio is missing (scripts/test installs it)"

start() {
  "$bin" serve --dir "$work/data" --leaf-size 512M --volume-size 128M --listen 127.0.0.1:0 "$@" \
    >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do
    if grep -q "sluice: serving" "$work/server.log" 2>/dev/null; then break; fi
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; fail "server exited at start"; }
    sleep 0.1
  done
  grep -q "sluice: serving" "$work/server.log" || { cat "$work/server.log"; fail "server did not start"; }
  tcp=$(sed -n 's/.*tcp:\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/server.log" | head -1)
  [ -n "$tcp" ] || { cat "$work/server.log"; fail "no NBD TCP address in the server log"; }
}
stop() {
  kill -TERM "$server"
  wait "$server" || fail "server exited with $? after SIGTERM"
  server=""
}
# The same job (offsets, data, seed) for the write and for the later read-back.
job() {
  fio --name=failover --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=randwrite --bs=4k \
    --size=96M --fsync=16 --verify=crc32c --verify_fatal=1 --randseed=18 "$@"
}
# Polls `pool status` until it matches $1 (an extended regex), for up to $2 tenths of a second.
await_status() {
  for _ in $(seq 1 "$2"); do
    out=$(status)
    if echo "$out" | grep -Eq "$1"; then return 0; fi
    sleep 0.1
  done
  echo "$out"
  return 1
}
status() { "$bin" pool status sluice; }
# MiB the clients have written to vol0 since the server started (`pool iostat --json`'s first
# report covers the time since import).
written_mib() {
  "$bin" pool iostat sluice --json | /usr/bin/python3 -c '
import json, sys
report = json.loads(sys.stdin.readline())
volume = next(v for v in report["volumes"] if v["name"] == "vol0")
print(int(volume["write_bytes_per_s"] * report["seconds"]) >> 20)'
}
# Waits until fio has written $1 MiB more than $2 (an earlier written_mib), for up to 60 s:
# the steps below must happen while it writes, not before it has started.
await_written() {
  for _ in $(seq 1 600); do
    [ "$(written_mib)" -ge $(($2 + $1)) ] && return 0
    kill -0 "$fio_pid" 2>/dev/null || fail "fio ended before writing $1 MiB more"
    sleep 0.1
  done
  fail "fio did not write $1 MiB in 60 s"
}

start
step "fio writes 96 MiB in 4 KiB blocks with verification; leg1 goes offline and back meanwhile"
job --output="$work/fio.out" >/dev/null 2>&1 &
fio_pid=$!
await_written 8 0
"$bin" pool offline -t sluice leg1.img | grep -q "is offline" || fail "offline refused"
out=$(status)
echo "$out" | grep -q "state: DEGRADED" || { echo "$out"; fail "pool not DEGRADED with a leg offline"; }
echo "$out" | grep -q "leg1.img *OFFLINE" || { echo "$out"; fail "leg1 not shown OFFLINE"; }
echo "$out" | grep -q "action: return it with .sluice pool online" || { echo "$out"; fail "no action line"; }
refused=$("$bin" pool offline -t sluice leg0.img 2>&1) && fail "offline of the last leg in service was accepted"
echo "$refused" | grep -q "no valid replicas" || fail "offline of leg0 refused without the reason: $refused"
# Writes the offline leg misses, for the resilver to copy.
await_written 8 "$(written_mib)"
"$bin" pool online sluice leg1.img | grep -q "is online" || fail "online refused"
resilvered=""
for _ in $(seq 1 300); do
  out=$(status)
  if echo "$out" | grep -q "scan: resilver took"; then resilvered=yes; break; fi
  sleep 0.1
done
[ -n "$resilvered" ] || { echo "$out"; fail "the resilver did not finish in 30 s"; }
echo "$out" | grep "scan:"
echo "$out" | grep -q "0 blocks unrecoverable" || { echo "$out"; fail "the resilver left blocks behind"; }
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio failed or a block did not verify"; }
fio_pid=""
grep -q "err= 0" "$work/fio.out" || { cat "$work/fio.out"; fail "fio reported errors"; }

step "scrub -w: nothing to repair"
scrub=$("$bin" pool scrub -w sluice)
echo "$scrub"
echo "$scrub" | grep -q "0 bad copies found" || fail "scrub found bad copies after the resilver"
out=$(status)
echo "$out" | grep -q "state: ONLINE" || { echo "$out"; fail "pool not ONLINE at the end"; }

step "leg1 alone returns every block fio wrote"
stop
mv "$work/data/leg0.img" "$work/leg0.away"
start
job --verify_only --output="$work/verify.out" >/dev/null 2>&1 \
  || { cat "$work/verify.out"; fail "leg1 alone does not hold what fio wrote"; }
stop

step "leg0 back; fio writes and verifies again while leg1 dies and is replaced by leg2"
mv "$work/leg0.away" "$work/data/leg0.img"
# Scan chunks of 1 MiB, one I/O at a time: the resilver onto leg2 then takes long enough for
# `pool status` to show its progress moving.
start --set scan.chunk_bytes=1M --set scan.ios_in_flight=1
# Leg0 missed the txgs of the run without it: wait for its resilver.
await_status "scan: resilver took" 300 || fail "leg0 was not resilvered after its return"
before=$(written_mib)
job --randseed=29 --loops=2 --output="$work/fio2.out" >/dev/null 2>&1 &
fio_pid=$!
await_written 8 "$before"
"$bin" pool inject sluice leg1.img write-errors | grep -q "injecting" || fail "inject refused"
await_status "leg1.img +FAULTED" 300 || fail "leg1 was not faulted by its write errors"
echo "$out" | grep -q "state: DEGRADED" || { echo "$out"; fail "pool not DEGRADED with leg1 faulted"; }
echo "$out" | grep -q "action: replace the device with .sluice pool replace" \
  || { echo "$out"; fail "no action line naming replace"; }
echo "$out" | grep "leg1.img"
"$bin" pool replace sluice leg1.img "$work/data/leg2.img" | grep -q "replacing" \
  || fail "replace refused"
# The resilver's progress moves: two different "N% done" readings, or it finished between.
seen=""
for _ in $(seq 1 600); do
  out=$(status)
  if echo "$out" | grep -q "scan: resilver took"; then seen="$seen finished"; break; fi
  pct=$(echo "$out" | sed -n 's/.*scan: resilver in progress.*: \([0-9.]*\)% done.*/\1/p')
  if [ -n "$pct" ] && ! echo " $seen " | grep -q " $pct "; then seen="$seen $pct"; fi
  sleep 0.1
done
echo "failover: resilver progress seen:$seen"
echo "$seen" | grep -q "finished" || { echo "$out"; fail "the resilver onto leg2 did not finish in 60 s"; }
[ "$(echo "$seen" | tr ' ' '\n' | grep -c '^[0-9]')" -ge 2 ] \
  || fail "the resilver's progress was not seen moving in pool status ($seen)"
await_status "leg2.img" 10 || fail "leg2 is not in the pool"
# The replaced leg is detached once its replacement holds everything (after the next sync).
for _ in $(seq 1 300); do
  out=$(status)
  if ! echo "$out" | grep -q "leg1.img"; then break; fi
  sleep 0.1
done
echo "$out" | grep -q "leg1.img" && { echo "$out"; fail "leg1 was not detached after the replace"; }
wait "$fio_pid" || { cat "$work/fio2.out"; fail "fio failed or a block did not verify during the replace"; }
fio_pid=""
grep -q "err= 0" "$work/fio2.out" || { cat "$work/fio2.out"; fail "fio reported errors during the replace"; }
scrub=$("$bin" pool scrub -w sluice)
echo "$scrub"
echo "$scrub" | grep -q "0 bad copies found" || fail "scrub found bad copies after the replace"
out=$(status)
echo "$out" | grep -q "state: ONLINE" || { echo "$out"; fail "pool not ONLINE after the replace"; }
echo "$out" | grep -Eq "leg0.img +ONLINE" && echo "$out" | grep -Eq "leg2.img +ONLINE" \
  || { echo "$out"; fail "leg0 and leg2 are not both ONLINE"; }
stop
step "all passed"
