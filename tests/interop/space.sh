#!/usr/bin/env bash
# A pool short of space, written and administered at once, never suspends, and its thick
# volume is never refused a write. Pool sk: a 2-way mirror of two sparse 256 MiB files, a
# 64 MiB thick volume v and a 128 MiB thin volume t (grown up to 192 MiB), served; pool rep
# receives v's snapshots. fio writes 4 KiB blocks at random over v from 4 jobs (queue depth
# 4, a flush every 32 writes, crc32c verification after each pass, paced so that the run
# lasts about SLUICE_SPACE_SECONDS, 40 by default); a libnbd client writes 64 KiB blocks over
# t, sweeping it again and again, where no space is allowed (and must be said as ENOSPC);
# beside them, about twice a second: `snapshot create`, an incremental `send` piped into
# rep's `recv`, the older snapshot destroyed on both pools, a clone of the new one made and
# destroyed, and in turn a scrub, `pool offline -t` + `online` of one leg, a grow of t, a
# `pool sync`. A snapshot, clone or grow may be refused for lack of space, with a message
# naming the pool. At the end fio's read-back verification has no error, rep's newest
# snapshot equals sk's (qemu-img compare over NBD), the pool ran short (t was told ENOSPC,
# commands were refused), sk is ONLINE and neither pool was suspended. Run by scripts/test;
# needs the sluice binary as $1, fio, qemu-img and python3-libnbd.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
seconds=${SLUICE_SPACE_SECONDS:-40}
work=$(mktemp -d)
servers=()
clients=()
cleanup() {
  for pid in "${clients[@]}" "${servers[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
fail() { echo "space: FAIL: $*" >&2; exit 1; }
step() { echo "space: $*"; }
command -v fio >/dev/null || fail "fio is missing (scripts/test installs it)"

source "$(dirname "$0")/served_pools.sh"
# Runs an administrative command that may be refused for lack of space; fails on any other
# error, or on a refusal that names no pool. Returns 1 when refused.
may_refuse() {
  local out
  if out=$("$@" 2>&1); then return 0; fi
  if echo "$out" | grep -q "suspended"; then fail "'$*': $out"; fi
  if echo "$out" | grep -Eq "no space|set aside"; then
    echo "$out" | grep -q "pool sk" || fail "refusal of '$*' names no pool: $out"
    [ "$(echo "$out" | grep -Eo "no space|set aside" | wc -l)" -eq 1 ] \
      || fail "refusal of '$*' says it more than once: $out"
    refusals=$((refusals + 1))
    return 1
  fi
  fail "'$*': $out"
}
# A suspended pool says so in `pool status` (state SUSPENDED, with the cause) and in its
# server's log.
not_suspended() {
  out=$("$bin" pool status "$1" 2>&1) || fail "pool status $1: $out"
  if echo "$out" | grep -q "SUSPENDED" || grep -q "sync failed" "$work/$1.log"; then
    echo "$out"; cat "$work/$1.log"; fail "pool $1 suspended"
  fi
}

"$bin" pool create sk mirror "$work/sk-a.img" "$work/sk-b.img" --size 256M --sparse >/dev/null
"$bin" pool create rep mirror "$work/rep-a.img" "$work/rep-b.img" --size 512M --sparse >/dev/null
"$bin" vol create sk/v --size 64M >/dev/null
"$bin" vol create sk/t --size 128M --sparse >/dev/null
serve sk
serve rep

step "fio over thick v, a writer filling thin t, and an administrator, for about ${seconds} s"
# 4 jobs of 500 writes a second, each over its own quarter of v, which takes about 8 s;
# each loop ends with fio reading its quarter back, so later loops overwrite verified blocks.
loops=$(((seconds + 7) / 8))
fio --name=space --ioengine=nbd --uri="$(export_uri sk v)" --rw=randwrite --bs=4k --numjobs=4 \
  --size=16M --offset_increment=16M --loops="$loops" --iodepth=4 --rate_iops=500 \
  --fsync=32 --verify=crc32c --verify_fatal=1 --randseed=55 --group_reporting \
  --output="$work/fio.out" >/dev/null 2>&1 &
fio_pid=$!
clients+=("$fio_pid")
touch "$work/thin.run"
/usr/bin/python3 - "$(export_uri sk t)" "$work/thin.run" >"$work/thin.out" 2>&1 <<'PYEOF' &
import errno, os, sys, time
import nbd
# Sweeps the volume (which grows meanwhile) from start to end and over again, so that it fills
# the pool however slowly the machine runs.
refused = written = at = 0
while os.path.exists(sys.argv[2]):
    h = nbd.NBD()
    h.connect_uri(sys.argv[1])
    size = h.get_size()
    for _ in range(64):
        at = (at + 65536) % size
        try:
            h.pwrite(os.urandom(65536), at)
            written += 1
        except nbd.Error as e:
            if e.errnum != errno.ENOSPC:
                print(f"thin write at {at}: {e}")
                sys.exit(1)
            refused += 1
        time.sleep(0.005)
    h.shutdown()
print(f"written {written} refused {refused}")
PYEOF
thin_pid=$!
clients+=("$thin_pid")

refusals=0
sent=""
round=0
while kill -0 "$fio_pid" 2>/dev/null; do
  sleep 0.5
  round=$((round + 1))
  name=s$round
  if may_refuse "$bin" snapshot create "sk/v@$name"; then
    if [ -n "$sent" ]; then
      "$bin" send -i "@$sent" "sk/v@$name" 2>"$work/send.err" \
        | "$bin" recv rep/v 2>"$work/recv.err" \
        || { cat "$work/send.err" "$work/recv.err"; fail "incremental send | recv of v@$name"; }
      "$bin" snapshot destroy "rep/v@$sent" >/dev/null || fail "destroy of rep/v@$sent"
      "$bin" snapshot destroy "sk/v@$sent" >/dev/null || fail "destroy of sk/v@$sent"
    else
      "$bin" send "sk/v@$name" 2>"$work/send.err" | "$bin" recv rep/v 2>"$work/recv.err" \
        || { cat "$work/send.err" "$work/recv.err"; fail "full send | recv of v@$name"; }
    fi
    sent=$name
    if may_refuse "$bin" clone "sk/v@$name" sk/c; then
      "$bin" vol destroy sk/c >/dev/null || fail "destroy of clone sk/c"
    fi
  fi
  case $((round % 4)) in
    0) out=$("$bin" pool scrub sk 2>&1) || echo "$out" | grep -q "in progress" \
         || fail "scrub: $out" ;;
    1) "$bin" pool offline -t sk "$work/sk-b.img" >/dev/null || fail "offline of sk-b"
       sleep 0.3
       "$bin" pool online sk "$work/sk-b.img" >/dev/null || fail "online of sk-b" ;;
    2) size=$("$bin" vol get -H sk/t volsize | cut -f3)
       if [ "$size" -lt $((192 << 20)) ]; then
         may_refuse "$bin" vol resize sk/t --size $(((size >> 20) + 2))M || true
       fi ;;
    3) "$bin" pool sync sk >/dev/null || fail "pool sync" ;;
  esac
  not_suspended sk
done
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio exited with an error"; }
rm -f "$work/thin.run"
wait "$thin_pid" || { cat "$work/thin.out"; fail "the thin writer failed"; }
grep -q "err= 0" "$work/fio.out" || { cat "$work/fio.out"; fail "fio reported an error"; }
grep -q "READ:" "$work/fio.out" || { cat "$work/fio.out"; fail "fio did not read back"; }
[ -n "$sent" ] || fail "no snapshot was ever made"
# The pool did run short: the thin writer was told ENOSPC and commands were refused.
grep -Eq "refused [1-9]" "$work/thin.out" \
  || fail "the thin writer never ran out: $(cat "$work/thin.out")"
[ "$refusals" -gt 0 ] || fail "no administrative command was refused for space"
qemu-img compare -f raw -F raw "$(export_uri sk "v@$sent")" "$(export_uri rep "v@$sent")" \
  >/dev/null \
  || fail "rep/v@$sent differs from sk/v@$sent"
for _ in $(seq 1 300); do
  "$bin" pool status sk | grep -q "state: ONLINE" && break
  sleep 0.1
done
"$bin" pool status sk | grep -q "state: ONLINE" \
  || { "$bin" pool status sk; fail "sk is not ONLINE"; }
not_suspended sk
not_suspended rep
for pid in "${servers[@]}"; do
  kill -TERM "$pid"
  wait "$pid" || fail "a server exited with $? after SIGTERM"
done
servers=()
grep -E "IOPS|READ|WRITE" "$work/fio.out"
step "$round rounds, $refusals refused for space, thin writer: $(cat "$work/thin.out")"
step "ok"
