#!/usr/bin/env bash
# Hot spares under a client, as the issue that asked for them describes: a served mirror of
# two 256 MiB leaves with a 256 MiB spare and 80 MiB of data, fio writing with crc32c
# verification. While it writes, one leaf (d1) is overwritten with garbage and a scrub finds
# it: the test waits (for conditions, not times) until d1 is DEGRADED and the spare INUSE
# beside it and resilvered; the event hook ran for the burst, the degradation, the spare and
# the resilver, and `pool events --json` lists them; fio ends with no error. Then d1 is
# replaced by a new file and the spare goes back to AVAIL, and it survives a restart; the
# metrics endpoint says INUSE, then AVAIL. Last, a mirror added while served (`pool add`)
# takes 200 MiB the pool had no room for before, verified again after a restart, and a log
# device is added and removed while fio writes with a flush after each write. Run by
# scripts/test (as root: hooks must be root's); needs the sluice binary as $1 (default
# target/release/sluice), fio and curl.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
work=$(mktemp -d)
server=""
fio_pid=""
cleanup() {
  for pid in "$fio_pid" "$server"; do
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
fail() { echo "spares: FAIL: $*" >&2; exit 1; }
step() { echo "spares: $*"; }
command -v fio >/dev/null || fail "fio is missing (scripts/test installs it)"
[ "$(id -u)" -eq 0 ] || fail "run as root: event hooks run only when root owns them"
began=$SECONDS

# Waits up to $1 tenths of a second for the command after it to succeed.
await() {
  local tenths=$1
  shift
  for _ in $(seq 1 "$tenths"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}

"$bin" pool create sp mirror "$work/d0.img" "$work/d1.img" spare "$work/s0.img" --size 256M \
  --sparse >/dev/null
"$bin" vol create sp/vol0 --size 96M >/dev/null
mkdir "$work/hooks"
cat >"$work/hooks/all-record.sh" <<HOOK
#!/bin/sh
echo "\$ZEVENT_EID \$ZEVENT_SUBCLASS vdev=\${ZEVENT_VDEV_PATH:-} state=\${ZEVENT_STATE:-}" >>"$work/hook.log"
HOOK
chmod 755 "$work/hooks/all-record.sh"

starts=0
serve() {
  starts=$((starts + 1))
  log=$work/server-$starts.log
  "$bin" serve sp --socket "$work/nbd.sock" --listen 127.0.0.1:0 --set cache.bytes_max=0 \
    --event-hook "$work/hooks" --metrics 127.0.0.1:0 >"$log" 2>&1 &
  server=$!
  await 100 grep -q "sluice: serving" "$log" || { cat "$log"; fail "server did not start"; }
  tcp=$(sed -n 's/.*tcp:\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$tcp" ] || { cat "$log"; fail "no NBD TCP address in the server log"; }
  metrics=$(sed -n 's|.*metrics \(http://127\.0\.0\.1:[0-9]*/metrics\).*|\1|p' "$log" | head -1)
  [ -n "$metrics" ] || { cat "$log"; fail "no metrics address in the server log"; }
}
# The spare's series for STATE is 1 in a scrape.
spare_metric() {
  curl -sS --max-time 10 -o "$work/scrape" "$metrics" || return 1
  grep -q "^sluice_spare_state{.*spare=\"$work/s0.img\",state=\"$1\"} 1$" "$work/scrape"
}
stop() {
  kill -TERM "$server"
  wait "$server" || fail "server exited with $? after SIGTERM"
  server=""
}
serve
status() { "$bin" pool status sp; }
events() { "$bin" pool events sp --json; }
has_event() { events | grep "\"subclass\":\"$1\"" | grep -q "${2:-}"; }

step "80 MiB written and verified by fio while d1 turns to garbage and a scrub finds it"
fio --name=sp --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=randwrite --bs=64k --size=80M \
  --fsync=16 --verify=crc32c --verify_fatal=1 --randseed=61 --rate=16m --output="$work/fio.out" \
  >/dev/null 2>&1 &
fio_pid=$!
await 600 sh -c "'$bin' pool status sp | grep -Eq 'space: [0-9.]+M used' && \
  [ \$('$bin' pool get sp allocated -H | cut -f3) -gt 20000000 ]" \
  || { status; fail "fio did not get going"; }
"$bin" pool sync sp >/dev/null
dd if=/dev/urandom of="$work/d1.img" bs=1M seek=5 count=240 conv=notrunc oflag=direct status=none
"$bin" pool scrub sp >/dev/null
await 900 sh -c "'$bin' pool status sp | grep -Eq 'd1.img +DEGRADED'" \
  || { status; fail "d1 did not end DEGRADED"; }
await 900 sh -c "'$bin' pool status sp | grep -Eq 's0.img +INUSE'" \
  || { status; cat "$log"; fail "the spare did not go INUSE"; }
status | grep -q "spare-1" || { status; fail "no spare-1 group beside d1"; }
spare_metric INUSE || fail "the metrics do not say the spare is INUSE"
await 1800 has_event resilver_finish s0.img \
  || { status; events; fail "the spare's resilver did not finish"; }
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio failed or a block did not verify"; }
fio_pid=""
grep -q "err= 0" "$work/fio.out" || { cat "$work/fio.out"; fail "fio reported errors"; }
status | grep -q "resilvering" && { status; fail "a leaf is still resilvering"; }

step "the hook and pool events saw the burst, the degradation, the spare and the resilver"
has_event checksum d1.img || { events; fail "no checksum burst on d1"; }
has_event statechange '"state":"DEGRADED"' || { events; fail "no statechange to DEGRADED"; }
has_event vdev_spare s0.img || { events; fail "no vdev_spare event"; }
for subclass in checksum statechange vdev_spare resilver_start resilver_finish; do
  grep -q " $subclass " "$work/hook.log" \
    || { cat "$work/hook.log"; fail "the hook did not run for $subclass"; }
done
# The spare alone with d0 holds everything: d0 taken offline, fio reads back what it wrote.
"$bin" pool offline sp d1.img -t >/dev/null
"$bin" pool offline sp d0.img -t >/dev/null \
  || { status; fail "d0 could not go offline with the spare holding everything"; }
fio --name=sp --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=randwrite --bs=64k --size=80M \
  --verify=crc32c --verify_only --verify_fatal=1 --randseed=61 --output="$work/verify.out" \
  >/dev/null 2>&1 || { cat "$work/verify.out"; fail "the spare alone did not read back fio's data"; }
"$bin" pool online sp d0.img >/dev/null
"$bin" pool online sp d1.img >/dev/null

step "d1 replaced by a new file: the spare goes back to AVAIL, and stays so after a restart"
"$bin" pool replace sp d1.img "$work/d2.img" --sparse >/dev/null
await 1800 sh -c "'$bin' pool status sp | grep -Eq 's0.img +AVAIL'" \
  || { status; fail "the spare did not go back to AVAIL"; }
status | grep -q "d1.img" && { status; fail "d1 is still a member"; }
stop
serve
status | grep -Eq 's0.img +AVAIL' || { status; fail "the spare is not AVAIL after a restart"; }
spare_metric AVAIL || fail "the metrics do not say the spare is AVAIL"
status | grep -Eq 'd2.img +ONLINE' || { status; fail "d2 is not ONLINE after a restart"; }

step "pool add of a mirror while served: new writes reach it, fio verifies, a restart keeps it"
"$bin" pool add sp mirror "$work/e0.img" "$work/e1.img" --size 256M --sparse >/dev/null
status | grep -q "mirror-1" || { status; fail "no mirror-1 after pool add"; }
"$bin" vol create sp/vol1 --size 200M --sparse >/dev/null
fio --name=add --ioengine=nbd --uri="nbd://$tcp/vol1" --rw=write --bs=1M --size=200M \
  --verify=crc32c --verify_fatal=1 --output="$work/add.out" >/dev/null 2>&1 \
  || { cat "$work/add.out"; fail "fio on the grown pool failed"; }
stop
serve
status | grep -Eq 'e1.img +ONLINE' || { status; fail "the added mirror is not there after a restart"; }
fio --name=add --ioengine=nbd --uri="nbd://$tcp/vol1" --rw=write --bs=1M --size=200M \
  --verify=crc32c --verify_only --verify_fatal=1 --output="$work/add2.out" >/dev/null 2>&1 \
  || { cat "$work/add2.out"; fail "the grown pool's data did not read back after a restart"; }

step "a log device added, then removed while fio writes with a flush after each write"
"$bin" pool add sp log "$work/l0.img" --size 64M --sparse >/dev/null
status | grep -q "logs" || { status; fail "no logs section after pool add of a log device"; }
"$bin" vol create sp/vol2 --size 32M >/dev/null
fio --name=slog --ioengine=nbd --uri="nbd://$tcp/vol2" --rw=randwrite --bs=4k --size=32M \
  --fsync=1 --verify=crc32c --verify_fatal=1 --output="$work/slog.out" >/dev/null 2>&1 &
fio_pid=$!
# Let fio get going (the removal is correct whenever it runs; this makes it run mid-stream).
sleep 1
"$bin" pool remove sp "$work/l0.img" >/dev/null || { status; fail "pool remove of the log device"; }
wait "$fio_pid" || { cat "$work/slog.out"; fail "fio failed while the log device was removed"; }
fio_pid=""
status | grep -q "l0.img" && { status; fail "the removed log device is still listed"; }
status | grep -q "logs" && { status; fail "a logs section without log devices"; }
has_event vdev_remove l0.img || { events; fail "no vdev_remove event"; }
stop
serve
fio --name=slog --ioengine=nbd --uri="nbd://$tcp/vol2" --rw=randwrite --bs=4k --size=32M \
  --verify=crc32c --verify_only --verify_fatal=1 --output="$work/slog2.out" >/dev/null 2>&1 \
  || { cat "$work/slog2.out"; fail "what was written across the removal did not read back"; }
stop
step "ok ($((SECONDS - began)) s)"
