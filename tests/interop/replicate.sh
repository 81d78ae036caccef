#!/usr/bin/env bash
# Replication between two pools, each served by its own `sluice serve`: `sluice send | sluice
# recv` through both servers' control sockets, full and incremental, checked with qemu-img
# compare over NBD; an incremental stream's size follows the changed blocks; a cut or damaged
# stream is refused naming the record and leaves nothing visible; an interrupted `recv -s`
# resumes from the token `vol list` shows and ends identical. Needs the sluice binary as $1.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
work=$(mktemp -d)
servers=()
cleanup() {
  for pid in "${servers[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
fail() { echo "replicate: FAIL: $*" >&2; exit 1; }
step() { echo "replicate: $*"; }

source "$(dirname "$0")/served_pools.sh"

# Four leaves of 512 MiB, allocated in full, and the streams and data (about 400 MiB): say so
# before starting rather than fail halfway with ENOSPC. Each pool holds at most about 300 MiB
# (dst: vm's four snapshots and copy), so 512 MiB leaves leave room; CI's disk has had 3 GiB free.
need_mib=2560
free_mib=$(df -Pm "$work" | awk 'NR == 2 { print $4 }')
[ "${free_mib:-0}" -ge "$need_mib" ] \
  || fail "needs $need_mib MiB free where it works ($work), and its filesystem has \
${free_mib:-an unknown number of} MiB; free space there, or point TMPDIR at a filesystem with room"

"$bin" pool create src "$work/src-a.img" "$work/src-b.img" --size 512M >/dev/null
"$bin" pool create dst "$work/dst-a.img" "$work/dst-b.img" --size 512M >/dev/null
"$bin" vol create src/vm --size 256M --block-size 16K >/dev/null
serve src
serve dst

step "full send | recv between two served pools"
# 96 MiB of data (half of it compressible) and holes after it.
head -c 48M /dev/urandom >"$work/data.img"
(yes "sluice replicates" || true) | head -c 48M >>"$work/data.img"
nbdcopy "$work/data.img" "$(export_uri src vm)"
"$bin" snapshot create src/vm@one >/dev/null
"$bin" send src/vm@one >"$work/full.stream" 2>"$work/send.log" || { cat "$work/send.log"; fail "full send"; }
"$bin" recv dst/vm <"$work/full.stream" 2>"$work/recv.log" || { cat "$work/recv.log"; fail "full recv"; }
qemu-img compare -f raw -F raw "$(export_uri src vm@one)" "$(export_uri dst vm@one)" >/dev/null \
  || fail "dst/vm@one differs from src/vm@one"
qemu-img compare -f raw -F raw "$(export_uri src vm)" "$(export_uri dst vm)" >/dev/null \
  || fail "dst/vm differs from src/vm"
full=$(stat -c %s "$work/full.stream")
# Compressed blocks go compressed: the stream is smaller than the 96 MiB written.
[ "$full" -lt $((80 << 20)) ] || fail "full stream of 96 MiB (half compressible) is $full bytes"

step "incremental send -i | recv: the stream follows the changed blocks"
# 1% of the volume's 16K blocks (164 of 16,384), scattered.
/usr/bin/python3 - "$(export_uri src vm)" <<'PYEOF'
import os, random, sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
rng = random.Random(7)
blocks = (256 << 20) // 16384
for b in rng.sample(range(blocks), blocks // 100):
    h.pwrite(os.urandom(16384), b * 16384)
h.flush()
h.shutdown()
PYEOF
"$bin" snapshot create src/vm@two >/dev/null
"$bin" send -i @one src/vm@two >"$work/inc.stream" 2>/dev/null
inc=$(stat -c %s "$work/inc.stream")
# 164 blocks of 16K are 2.6 MiB; records, headers and the indirect walk add little.
[ "$inc" -lt $((4 << 20)) ] || fail "a 1% incremental stream is $inc bytes (full: $full)"
"$bin" recv dst/vm <"$work/inc.stream" 2>"$work/recv.log" || { cat "$work/recv.log"; fail "incremental recv"; }
qemu-img compare -f raw -F raw "$(export_uri src vm@two)" "$(export_uri dst vm@two)" >/dev/null \
  || fail "dst/vm@two differs from src/vm@two"
qemu-img compare -f raw -F raw "$(export_uri src vm@one)" "$(export_uri dst vm@one)" >/dev/null \
  || fail "dst/vm@one changed with the incremental receive"
"$bin" snapshot list dst/vm -H | cut -f1 | tr '\n' ' ' | grep -qx "dst/vm@one dst/vm@two " \
  || fail "dst/vm's snapshots: $("$bin" snapshot list dst/vm -H | cut -f1 | tr '\n' ' ')"

step "a cut or damaged stream is refused naming the record; nothing is visible"
"$bin" snapshot create src/vm@three >/dev/null
# Changes some blocks so the stream has records to damage.
nbdcopy "$work/data.img" "$(export_uri src vm)"
"$bin" snapshot create src/vm@four >/dev/null
"$bin" send -i @two src/vm@four >"$work/inc2.stream" 2>/dev/null
len=$(stat -c %s "$work/inc2.stream")
before=$("$bin" vol list dst -H | cut -f1)
if head -c $((len / 2)) "$work/inc2.stream" | "$bin" recv dst/vm 2>"$work/cut.log"; then
  fail "a stream cut in half was received"
fi
grep -q "cut short" "$work/cut.log" || { cat "$work/cut.log"; fail "the cut stream's error does not say so"; }
/usr/bin/python3 - "$work/inc2.stream" "$work/bad.stream" <<'PYEOF'
import sys
data = bytearray(open(sys.argv[1], "rb").read())
data[len(data) // 3] ^= 0x10
open(sys.argv[2], "wb").write(data)
PYEOF
if "$bin" recv dst/vm <"$work/bad.stream" 2>"$work/bad.log"; then fail "a damaged stream was received"; fi
grep -Eq "record [0-9]+" "$work/bad.log" || { cat "$work/bad.log"; fail "the damaged stream's error names no record"; }
[ "$("$bin" vol list dst -H | cut -f1)" = "$before" ] || fail "a refused stream left a volume: $("$bin" vol list dst -H | cut -f1)"
if nbdinfo --list "nbd+unix://?socket=$work/dst/nbd.sock" | grep -q '%'; then
  fail "a hidden receive volume is listed as an export"
fi
"$bin" snapshot list dst/vm -H | grep -q "@four" && fail "a refused stream's snapshot is visible"

step "an interrupted recv -s resumes from the token vol list shows"
if head -c $((full * 2 / 5)) "$work/full.stream" | "$bin" recv -s dst/copy 2>"$work/int.log"; then
  fail "a stream cut at 40% was received"
fi
grep -q "sluice send -t" "$work/int.log" || { cat "$work/int.log"; fail "the interruption gives no resume command"; }
"$bin" vol list dst | grep -q "dst/copy: interrupted receive" || fail "vol list does not show the interrupted receive"
token=$("$bin" vol get dst/copy receive_resume_token -H | cut -f3)
case "$token" in 1-*) ;; *) fail "no resume token for dst/copy: $token" ;; esac
"$bin" vol list dst -H | cut -f1 | grep -qx "dst/copy" && fail "a half-received volume is listed"
"$bin" send -t "$token" >"$work/rest.stream" 2>/dev/null
rest=$(stat -c %s "$work/rest.stream")
[ "$rest" -lt $((full * 7 / 10)) ] || fail "the resumed stream is $rest bytes of $full"
"$bin" recv -s dst/copy <"$work/rest.stream" 2>"$work/resume.log" || { cat "$work/resume.log"; fail "resumed recv"; }
qemu-img compare -f raw -F raw "$(export_uri src vm@one)" "$(export_uri dst copy@one)" >/dev/null \
  || fail "the resumed receive differs from src/vm@one"
[ "$("$bin" vol get dst/copy receive_resume_token -H | cut -f3)" = "-" ] || fail "a token is left after the resume"
# recv -A drops a kept one.
head -c $((full / 2)) "$work/full.stream" | "$bin" recv -s dst/dropped 2>/dev/null && fail "cut stream received"
"$bin" recv -A dst/dropped >/dev/null
"$bin" vol list dst | grep -q "dst/dropped" && fail "recv -A left the interrupted receive"

step "both pools stop cleanly and scrub clean"
for pid in "${servers[@]}"; do kill -TERM "$pid"; wait "$pid" || fail "a server exited with $?"; done
servers=()
for pool in src dst; do
  "$bin" pool scrub "$pool" >"$work/scrub.log" 2>&1 || { cat "$work/scrub.log"; fail "scrub of $pool"; }
done
step "ok"
