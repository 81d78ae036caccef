#!/usr/bin/env bash
# RAID-Z under a client: `sluice serve` on a raidz2 of six files, fio writing 4 KiB blocks
# with crc32c verification. While it writes, one leaf (d2) is overwritten with garbage over its
# data area, as a disk that returns wrong bytes, and another (d4) is taken away (`pool inject
# ... gone`, a disk that died; its file stays). fio must see no error; `pool status` must say
# DEGRADED and name both (d4 FAULTED; d2 with checksum errors once a scrub has read every
# column); `pool replace` puts a new file in
# each one's place and the resilver runs in the background (the script waits for the replaced
# leaves to be detached, not for a time); fio reads back every block it wrote; the pool is
# ONLINE and a scrub finds nothing to repair. Small leaves keep it to a few seconds. Run by
# scripts/test; needs the sluice binary as $1 (default target/release/sluice) and fio.
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
fail() { echo "raidz: FAIL: $*" >&2; exit 1; }
step() { echo "raidz: $*"; }
command -v fio >/dev/null || fail "fio is missing (scripts/test installs it)"
began=$SECONDS

leaves=()
for i in 0 1 2 3 4 5; do leaves+=("$work/d$i.img"); done
"$bin" pool create rz raidz2 "${leaves[@]}" --size 160M --sparse >/dev/null
"$bin" vol create rz/vol0 --size 64M >/dev/null

start() {
  # No block cache: fio's read-back must reach the leaves, garbage and all.
  "$bin" serve rz --socket "$work/nbd.sock" --listen 127.0.0.1:0 --set cache.bytes_max=0 \
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
job() {
  fio --name=raidz --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=randwrite --bs=4k \
    --size=48M --fsync=16 --verify=crc32c --verify_fatal=1 --randseed=57 "$@"
}
status() { "$bin" pool status rz; }
written_mib() {
  "$bin" pool iostat rz --json | /usr/bin/python3 -c '
import json, sys
report = json.loads(sys.stdin.readline())
volume = next(v for v in report["volumes"] if v["name"] == "vol0")
print(int(volume["write_bytes_per_s"] * report["seconds"]) >> 20)'
}
await_written() {
  for _ in $(seq 1 600); do
    [ "$(written_mib)" -ge $(($2 + $1)) ] && return 0
    kill -0 "$fio_pid" 2>/dev/null || fail "fio ended before writing $1 MiB more"
    sleep 0.1
  done
  fail "fio did not write $1 MiB in 60 s"
}

start
status | grep -q "raidz2-0" || { status; fail "pool status does not show the raidz2 vdev"; }
step "fio writes 48 MiB in 4 KiB blocks with verification; d2 turns to garbage, d4 goes"
# At most 1,500 writes a second (48 MiB in 8 s or more): the faults below land while fio
# runs however fast this machine is, or however loaded (unthrottled, a busy CI host's dd of
# 150 MiB outlasted fio's whole run).
job --rate_iops=1500 --output="$work/fio.out" >/dev/null 2>&1 &
fio_pid=$!
await_written 6 0
# What fio wrote so far goes to the leaves first, so that the garbage lands on blocks it reads
# back at its end.
"$bin" pool sync rz >/dev/null
# Garbage over d2's data area (past the labels and the reserved start, short of the end
# labels), written around the server's open descriptor.
dd if=/dev/urandom of="$work/d2.img" bs=1M seek=5 count=150 conv=notrunc oflag=direct status=none
"$bin" pool inject rz d4.img gone | grep -q "injecting" || fail "inject refused"
await_written 6 "$(written_mib)"
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio failed or a block did not verify"; }
fio_pid=""
grep -q "err= 0" "$work/fio.out" || { cat "$work/fio.out"; fail "fio reported errors"; }
out=$(status)
echo "$out" | sed -n '1,12p'
echo "$out" | grep -q "state: DEGRADED" || { echo "$out"; fail "pool not DEGRADED"; }
echo "$out" | grep -Eq "raidz2-0 +DEGRADED" || { echo "$out"; fail "raidz2-0 not DEGRADED"; }
echo "$out" | grep -Eq "d4.img +FAULTED" || { echo "$out"; fail "d4 not shown FAULTED"; }
# fio's reads may not have met d2's garbage (the block cache served them, or the blocks they
# read had only parity on d2: where a block's columns fall depends on the layout); a scrub
# reads every column, and with d4 gone still finds a good copy of every block.
"$bin" pool scrub -w rz >/dev/null 2>&1 || fail "the degraded pool's scrub found a block with no good copy"
out=$(status)
d2=$(echo "$out" | grep "d2.img" | awk '{print $5}')
[ "${d2:-0}" -gt 0 ] || { echo "$out"; fail "d2's garbage was not counted as checksum errors"; }

step "replace d2 and d4 with new files; the resilver runs in the background"
"$bin" pool replace rz d2.img "$work/d6.img" | grep -q "replacing" || fail "replace of d2 refused"
"$bin" pool replace rz d4.img "$work/d7.img" | grep -q "replacing" || fail "replace of d4 refused"
status | grep -q "replacing-" || true
for _ in $(seq 1 1200); do
  out=$(status)
  if ! echo "$out" | grep -Eq "d2.img|d4.img"; then break; fi
  sleep 0.1
done
echo "$out" | grep -Eq "d2.img|d4.img" && { echo "$out"; fail "the replaced leaves were not detached in 120 s"; }
echo "$out" | grep "scan:"
echo "$out" | grep -q "0 blocks unrecoverable" || { echo "$out"; fail "the resilver left blocks behind"; }

step "fio reads back every block; scrub finds nothing; the pool is ONLINE"
job --verify_only --output="$work/verify.out" >/dev/null 2>&1 \
  || { cat "$work/verify.out"; fail "a block fio wrote does not read back"; }
scrub=$("$bin" pool scrub -w rz)
echo "$scrub"
echo "$scrub" | grep -q "0 bad copies found" || fail "scrub found bad copies after the replace"
out=$(status)
echo "$out" | grep -q "state: ONLINE" || { echo "$out"; fail "pool not ONLINE at the end"; }
echo "$out" | grep -Eq "d6.img +ONLINE" && echo "$out" | grep -Eq "d7.img +ONLINE" \
  || { echo "$out"; fail "d6 and d7 are not both ONLINE"; }
stop
step "all passed in $((SECONDS - began)) s"
