#!/usr/bin/env bash
# Events, hooks and diagnosis under a client: `sluice serve --event-hook DIR` of a mirror of
# two 128 MiB files, fio writing 4 KiB blocks with crc32c verification. While it writes, one
# leaf (d1) is overwritten with garbage, and a scrub finds it: the leaf must end DEGRADED
# ("too many checksum errors") while fio sees no error. The script waits for conditions, not
# for times. Then: `pool events --json` lists the checksum burst, the state change and the
# scrub's start and end; the test hook (owned by root, writable by no one else) ran for them
# with the event in its environment, and a hook writable by others was not run; the server's
# log has a line per event; `pool events -f` streams the state change of a `pool clear` as it
# happens; and the moment a resilver's end is posted, the resilvered leaf holds every txg (the
# other leg goes offline at once). A scrape of the metrics endpoint while d1 is DEGRADED feeds
# `promtool test rules` on contrib/prometheus/sluice-alerts.yml (the leaf's alert must fire),
# and every metric contrib/grafana/sluice-dashboard.json queries must be in it. Run by
# scripts/test (as root: hooks must be root's); needs the sluice binary as $1 (default
# target/release/sluice), fio, curl, promtool and python3-yaml.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
work=$(mktemp -d)
server=""
fio_pid=""
follower=""
cleanup() {
  for pid in "$fio_pid" "$follower" "$server"; do
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
fail() { echo "events: FAIL: $*" >&2; exit 1; }
step() { echo "events: $*"; }
for tool in fio curl promtool; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/test installs fio, curl and prometheus)"
done
/usr/bin/python3 -c 'import yaml, prometheus_client' 2>/dev/null \
  || fail "python3-yaml or python3-prometheus-client is missing (scripts/test installs them)"
repo=$(cd "$(dirname "$0")/../.." && pwd)
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

"$bin" pool create ev mirror "$work/d0.img" "$work/d1.img" --size 128M --sparse >/dev/null
"$bin" vol create ev/vol0 --size 48M >/dev/null

mkdir "$work/hooks"
# The test hook: one line per event, with what its environment said.
cat >"$work/hooks/all-record.sh" <<EOF
#!/bin/sh
echo "\$ZEVENT_EID \$ZEVENT_SUBCLASS vdev=\${ZEVENT_VDEV_PATH:-} state=\${ZEVENT_STATE:-} pool=\$ZEVENT_POOL" >>"$work/hook.log"
EOF
# Writable by others: must not run.
cat >"$work/hooks/statechange-unsafe.sh" <<EOF
#!/bin/sh
echo ran >>"$work/unsafe.log"
EOF
chmod 755 "$work/hooks/all-record.sh"
chmod 777 "$work/hooks/statechange-unsafe.sh"

# No block cache: reads and the scrub reach the leaves, garbage and all.
"$bin" serve ev --socket "$work/nbd.sock" --listen 127.0.0.1:0 --set cache.bytes_max=0 \
  --event-hook "$work/hooks" --metrics 127.0.0.1:0 >"$work/server.log" 2>&1 &
server=$!
await 100 grep -q "sluice: serving" "$work/server.log" \
  || { cat "$work/server.log"; fail "server did not start"; }
tcp=$(sed -n 's/.*tcp:\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/server.log" | head -1)
[ -n "$tcp" ] || { cat "$work/server.log"; fail "no NBD TCP address in the server log"; }
metrics=$(sed -n 's|.*metrics \(http://127\.0\.0\.1:[0-9]*/metrics\).*|\1|p' "$work/server.log" | head -1)
[ -n "$metrics" ] || { cat "$work/server.log"; fail "no metrics address in the server log"; }
status() { "$bin" pool status ev; }
events() { "$bin" pool events ev --json; }
has_event() { events | grep "\"subclass\":\"$1\"" | grep -q "${2:-}"; }

step "fio writes with verification; d1 turns to garbage and a scrub finds it"
fio --name=ev --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=randwrite --bs=4k --size=32M \
  --fsync=16 --verify=crc32c --verify_fatal=1 --randseed=60 --rate_iops=2000 \
  --output="$work/fio.out" >/dev/null 2>&1 &
fio_pid=$!
sleep 1
"$bin" pool sync ev >/dev/null
# Garbage over d1's data area (past the labels and the reserved start, short of the end
# labels), written around the server's open descriptor.
dd if=/dev/urandom of="$work/d1.img" bs=1M seek=5 count=110 conv=notrunc oflag=direct status=none
"$bin" pool scrub ev >/dev/null
await 600 sh -c "'$bin' pool status ev | grep -Eq 'd1.img +DEGRADED'" \
  || { status; fail "d1 did not end DEGRADED"; }
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio failed or a block did not verify"; }
fio_pid=""
grep -q "err= 0" "$work/fio.out" || { cat "$work/fio.out"; fail "fio reported errors"; }
out=$(status)
echo "$out" | grep -q "too many checksum errors" || { echo "$out"; fail "status does not say why"; }
echo "$out" | grep -Eq "d0.img +ONLINE" || { echo "$out"; fail "d0 is not ONLINE"; }

step "pool events lists the burst, the degradation and the scrub; the hook and the log saw them"
await 600 has_event scrub_finish || { events; fail "no scrub_finish event"; }
has_event checksum d1.img || { events; fail "no checksum error event on d1"; }
has_event statechange '"state":"DEGRADED"' || { events; fail "no statechange to DEGRADED"; }
has_event scrub_start || { events; fail "no scrub_start event"; }
events | /usr/bin/python3 -c '
import json, sys
events = [json.loads(line) for line in sys.stdin]
eids = [e["eid"] for e in events]
assert eids == sorted(eids) and len(set(eids)) == len(eids), eids
for e in events:
    assert e["pool"] == "ev" and e["time"].endswith("Z") and e["class"].endswith(e["subclass"]), e
' || fail "pool events --json is not well formed"
await 100 grep -q "statechange vdev=$work/d1.img state=DEGRADED pool=ev" "$work/hook.log" \
  || { cat "$work/hook.log" 2>/dev/null; fail "the hook did not run for the state change"; }
grep -q "scrub_finish" "$work/hook.log" || fail "the hook did not run for the scrub's end"
[ ! -e "$work/unsafe.log" ] || fail "a hook writable by others was run"
grep -q "statechange-unsafe.sh not run: writable by group or others" "$work/server.log" \
  || fail "the server's log does not say why the unsafe hook did not run"
grep -q "sluice: event .*resource.fs.sluice.statechange" "$work/server.log" \
  || fail "the server's log has no line for the state change"

step "alert rules fire on a scrape of the degraded pool; the dashboard queries only served metrics"
promtool check rules "$repo/contrib/prometheus/sluice-alerts.yml" >/dev/null \
  || fail "promtool check rules refuses contrib/prometheus/sluice-alerts.yml"
curl -sS --max-time 10 -o "$work/degraded.scrape" "$metrics" || fail "scraping $metrics failed"
/usr/bin/python3 "$repo/tests/interop/alert_rules.py" "$work/degraded.scrape" \
  "$repo/contrib/prometheus/sluice-alerts.yml" "$work/rules-test.yml" --expect-leaf "$work/d1.img" \
  || fail "the alert rules did not fire as expected on the degraded pool's scrape"
# The scrub has ended, so the last-scrub series is there too: every name must be.
/usr/bin/python3 "$repo/tests/interop/dashboard_metrics.py" "$repo/contrib/grafana/sluice-dashboard.json" \
  "$work/degraded.scrape" --require-all || fail "the dashboard queries a metric the server does not serve"

step "pool events -f streams a pool clear's state change as it happens"
"$bin" pool events ev -f --json >"$work/follow.out" 2>&1 &
follower=$!
await 100 grep -q scrub_finish "$work/follow.out" || fail "-f did not print the events kept"
"$bin" pool clear ev d1.img >/dev/null
await 100 grep -q '"state":"ONLINE"' "$work/follow.out" \
  || { cat "$work/follow.out"; fail "-f did not stream the state change"; }
kill "$follower"
wait "$follower" 2>/dev/null || true
follower=""
status | grep -Eq "d1.img +ONLINE" || { status; fail "d1 not ONLINE after pool clear"; }

step "once a resilver's end is posted, the other leg can go offline at once"
"$bin" pool offline ev d1.img >/dev/null
fio --name=more --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=write --bs=1M --size=4M \
  --offset=40M >/dev/null
"$bin" pool sync ev >/dev/null
"$bin" pool online ev d1.img >/dev/null
await 600 grep -q "resilver_finish" "$work/hook.log" \
  || { cat "$work/hook.log"; fail "no resilver_finish event reached the hook"; }
"$bin" pool offline ev d0.img -t >/dev/null \
  || { status; fail "d0 could not go offline right after d1's resilver was posted finished"; }
"$bin" pool online ev d0.img >/dev/null
await 600 sh -c "'$bin' pool status ev | grep -q 'state: ONLINE'" || { status; fail "not ONLINE"; }

kill -TERM "$server"
wait "$server" || fail "server exited with $? after SIGTERM"
server=""
step "ok ($((SECONDS - began)) s)"
