#!/usr/bin/env bash
# Interop tests: `sluice serve` against the real NBD clients from Debian's packages (qemu-img,
# qemu-io, nbdinfo, nbdcopy, python3-libnbd, fio). Run by scripts/test; needs the sluice binary
# as $1 (default target/release/sluice). Every check fails the run with a message saying what
# differed.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
data=$work/data
sock=$data/nbd.sock
uri="nbd+unix:///vol0?socket=$sock"
fail() { echo "interop: FAIL: $*" >&2; exit 1; }
step() { echo "interop: $*"; }

start() {
  "$bin" serve --dir "$data" --leaf-size 1G --volume-size 256M --listen 127.0.0.1:0 \
    >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do
    if grep -q "sluice: serving" "$work/server.log" 2>/dev/null; then return; fi
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; fail "server exited at start"; }
    sleep 0.1
  done
  cat "$work/server.log"; fail "server did not start"
}
stop() {
  kill -TERM "$server"
  wait "$server" || fail "server exited with $? after SIGTERM"
  grep -q "exported" "$work/server.log" || fail "server did not export the pool on SIGTERM"
  server=""
}

start
tcp=$(sed -n 's/.*tcp:\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/server.log" | head -1)
[ -n "$tcp" ] || fail "no TCP address in the server log"

step "nbdinfo: flags and block sizes"
nbdinfo --json "$uri" >"$work/info.json"
/usr/bin/python3 - "$work/info.json" <<'EOF'
import json, sys
info = json.load(open(sys.argv[1]))
e = info["exports"][0]
want = {"can_flush": True, "can_fua": True, "can_trim": True, "can_zero": True,
        "can_fast_zero": True, "can_multi_conn": True, "can_df": True, "is_read_only": False,
        "block_size_minimum": 512, "block_size_preferred": 16384,
        "block_size_maximum": 33554432, "export-size": 256 << 20}
bad = {k: (e.get(k), v) for k, v in want.items() if e.get(k) != v}
assert not bad, f"nbdinfo differs (got, want): {bad}"
assert "base:allocation" in e.get("contexts", []), e.get("contexts")
EOF
nbdinfo --list "nbd+unix://?socket=$sock" | grep -q 'export="vol0"' || fail "nbdinfo --list does not show vol0"
nbdinfo "nbd://$tcp/vol0" >/dev/null || fail "TCP connection failed"

step "control socket: commands reach the running server"
"$bin" pool status sluice | grep -q "served by sluice serve" || fail "pool status did not go through the server"
"$bin" vol create sluice/extra --size 64M >/dev/null
nbdinfo --list "nbd+unix://?socket=$sock" | grep -q 'export="extra"' || fail "a volume created while serving is not exported"
"$bin" vol list | grep -q "sluice/extra" || fail "vol list does not show the new volume"
# A rename while a client holds the volume: the client keeps it, new clients use the new name.
/usr/bin/python3 - "$bin" "$sock" <<'EOF' || fail "vol rename of a served volume"
import subprocess, sys, nbd
binary, sock = sys.argv[1:]
h = nbd.NBD()
h.connect_uri(f"nbd+unix:///extra?socket={sock}")
h.pwrite(b"\x5a" * 65536, 0)
h.flush()
subprocess.run([binary, "vol", "rename", "sluice/extra", "sluice/renamed"], check=True,
               stdout=subprocess.DEVNULL)
h.pwrite(b"\x6b" * 4096, 4096)
h.flush()
g = nbd.NBD()
g.connect_uri(f"nbd+unix:///renamed?socket={sock}")
data = g.pread(65536, 0)
assert data[:4096] == b"\x5a" * 4096 and data[4096:8192] == b"\x6b" * 4096, "renamed volume lost data"
old = nbd.NBD()
try:
    old.connect_uri(f"nbd+unix:///extra?socket={sock}")
    raise SystemExit("the old name is still exported after a rename")
except nbd.Error:
    pass
EOF
"$bin" vol get sluice/renamed compression -H | grep -q "compression.lz4" || fail "vol get through the server"
"$bin" vol destroy sluice/renamed >/dev/null
if "$bin" pool export sluice 2>/dev/null; then fail "pool export of a served pool was not refused"; fi

step "snapshots: a read-only export that stays as taken"
"$bin" vol create sluice/snap --size 32M --sparse >/dev/null
/usr/bin/python3 - "nbd+unix:///snap?socket=$sock" <<'EOF'
import os, sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for i in range(0, 32 << 20, 1 << 20):
    h.pwrite(os.urandom(65536), i)
h.flush()
h.shutdown()
EOF
# The copy taken at snapshot time (nothing writes in between), then the snapshot.
nbdcopy "nbd+unix:///snap?socket=$sock" "$work/at-snapshot.raw" || fail "nbdcopy of the volume"
"$bin" snapshot create sluice/snap@one | grep -q "took snapshot sluice/snap@one" || fail "snapshot create through the server"
# The volume moves on; the snapshot does not.
qemu-io -f raw -c "write -P 0x77 0 4M" "nbd+unix:///snap?socket=$sock" >/dev/null || fail "write after the snapshot"
qemu-img compare -f raw -F raw "nbd+unix:///snap@one?socket=$sock" "$work/at-snapshot.raw" >/dev/null \
  || fail "qemu-img compare: the snapshot export differs from the copy taken at snapshot time"
qemu-img convert -f raw -O qcow2 "nbd+unix:///snap@one?socket=$sock" "$work/snap.qcow2" || fail "qemu-img convert from a snapshot export"
qemu-img compare -f qcow2 -F raw "$work/snap.qcow2" "$work/at-snapshot.raw" >/dev/null || fail "the converted snapshot differs"
nbdinfo --json "nbd+unix:///snap@one?socket=$sock" | /usr/bin/python3 -c '
import json, sys
e = json.load(sys.stdin)["exports"][0]
assert e["is_read_only"] and not e["can_trim"] and not e["can_zero"], e' || fail "a snapshot export is not advertised read-only"
/usr/bin/python3 - "nbd+unix:///snap@one?socket=$sock" <<'EOF' || fail "a write to a snapshot export was not refused with EPERM"
import errno, sys, nbd
h = nbd.NBD()
h.set_strict_mode(0)  # send the write anyway: the server must refuse it
h.connect_uri(sys.argv[1])
try:
    h.pwrite(b"x" * 4096, 0)
    raise SystemExit("the write was accepted")
except nbd.Error as e:
    assert "EPERM" in str(e) or e.errno == errno.EPERM, e
EOF
"$bin" snapshot list sluice/snap | grep -q "sluice/snap@one" || fail "snapshot list"
"$bin" vol rollback sluice/snap@one >/dev/null || fail "vol rollback through the server"
qemu-img compare -f raw -F raw "nbd+unix:///snap?socket=$sock" "$work/at-snapshot.raw" >/dev/null \
  || fail "after rollback the volume differs from the snapshot"
if "$bin" vol destroy sluice/snap 2>/dev/null; then fail "a volume with snapshots was destroyed without -r"; fi
# A clone shares the snapshot's blocks, holes included, and diverges on its own.
"$bin" clone sluice/snap@one sluice/snapclone >/dev/null || fail "clone through the server"
nbdinfo --map "nbd+unix:///snapclone?socket=$sock" >"$work/map.txt" || fail "nbdinfo --map of a clone"
/usr/bin/python3 - "$work/map.txt" <<'EOF' || fail "nbdinfo --map of a clone does not show its holes"
import sys
rows = [line.split() for line in open(sys.argv[1]) if line.strip()]
# offset, length, type code, description: 64 KiB of data at each MiB, holes between.
data = [(int(r[0]), int(r[1])) for r in rows if r[2] == "0"]
holes = [(int(r[0]), int(r[1])) for r in rows if int(r[2]) & 1]
assert (0, 65536) in data and any(o == 65536 for o, _ in holes), rows[:6]
assert sum(l for _, l in data) == 32 * 65536, sum(l for _, l in data)
EOF
qemu-img compare -f raw -F raw "nbd+unix:///snapclone?socket=$sock" "$work/at-snapshot.raw" >/dev/null \
  || fail "a clone differs from its snapshot"
qemu-io -f raw -c "write -P 0x31 1M 64k" "nbd+unix:///snapclone?socket=$sock" >/dev/null || fail "write to a clone"
qemu-img compare -f raw -F raw "nbd+unix:///snap@one?socket=$sock" "$work/at-snapshot.raw" >/dev/null \
  || fail "a write to a clone changed its origin"
if "$bin" snapshot destroy sluice/snap@one 2>"$work/err.txt"; then fail "a snapshot with a clone was destroyed"; fi
grep -q snapclone "$work/err.txt" || fail "the refusal does not name the clone: $(cat "$work/err.txt")"
# Promote: the snapshot moves to the clone; the old volume, now its clone, can go.
"$bin" vol promote sluice/snapclone >/dev/null || fail "vol promote through the server"
"$bin" snapshot list sluice/snapclone | grep -q "sluice/snapclone@one" || fail "the snapshot did not move on promote"
"$bin" vol destroy sluice/snap >/dev/null || fail "destroying the old parent after promote"
qemu-img compare -f raw -F raw "nbd+unix:///snapclone@one?socket=$sock" "$work/at-snapshot.raw" >/dev/null \
  || fail "the promoted snapshot differs"
"$bin" vol destroy -r sluice/snapclone >/dev/null || fail "vol destroy -r"
rm -f "$work/map.txt" "$work/err.txt"
rm -f "$work/at-snapshot.raw" "$work/snap.qcow2"

step "pool iostat: counts what clients asked of a volume"
"$bin" vol create sluice/watched --size 64M >/dev/null
/usr/bin/python3 - "nbd+unix:///watched?socket=$sock" <<'EOF'
import sys, nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
for i in range(5):
    h.pwrite(bytes([i + 1]) * 4096, i * 65536)
h.flush()
assert h.pread(4096, 65536) == bytes([2]) * 4096
h.shutdown()
EOF
"$bin" pool iostat sluice --latency 0.2 2 >"$work/iostat.txt" || fail "pool iostat failed"
/usr/bin/python3 - "$work/iostat.txt" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
first, second = text.split("\n\n")[:2]
assert first.startswith("pool sluice: since import") and "the last" in second, text
def counts(report):
    # Latency rows of the volume: its name on the first, the request type then the count.
    rows, inside = {}, False
    for line in report.splitlines():
        if line.startswith("  watched (arrival to answer)"):
            inside = True
        elif line.startswith("  ") and not line.startswith("   "):
            inside = False
        if inside:
            m = re.search(r"(read|write|flush|zero)\s+(\d+)\s", line)
            rows[m.group(1)] = int(m.group(2))
    return rows
assert counts(first) == {"read": 1, "write": 5, "flush": 1}, (counts(first), first)
# Nothing reached the volume in the second report's interval.
assert counts(second) == {}, second
assert re.search(r"^  watched\s", first, re.M), first
EOF
"$bin" pool iostat sluice --json >"$work/iostat.json" || fail "pool iostat --json failed"
/usr/bin/python3 - "$work/iostat.json" <<'EOF'
import json, sys
report = json.load(open(sys.argv[1]))
vol = next(v for v in report["volumes"] if v["name"] == "watched")
counts = {op: h["count"] for op, h in vol["latency"].items()}
assert counts == {"read": 1, "write": 5, "flush": 1}, vol
# 4 KiB writes on a 16 KiB-block volume each cover part of a block.
assert vol["partial_writes"] == 5 and vol["block_bytes"] == 16384, vol
assert report["since_import"] and report["leaves"], report
EOF
"$bin" vol destroy sluice/watched >/dev/null

step "qemu-img: convert a random image in and out, compare, map"
head -c 24M /dev/urandom >"$work/rand.img"
truncate -s 256M "$work/rand.img"
qemu-img convert -n -f raw -O raw "$work/rand.img" "$uri"
qemu-img convert -f raw -O raw "$uri" "$work/back.img"
cmp "$work/rand.img" "$work/back.img" || fail "image read back differs"
qemu-img compare -f raw -F raw "$work/rand.img" "$uri" >/dev/null || fail "qemu-img compare differs"
qemu-img map --output=json -f raw "$uri" >"$work/map.json"
/usr/bin/python3 - "$work/map.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
data = sum(e["length"] for e in m if e["data"])
assert data >= 24 << 20 and data <= (24 << 20) + (1 << 20), f"mapped data {data}"
assert any(e["zero"] and not e["data"] for e in m), "no hole reported"
EOF

step "qemu-io: pattern writes with and without FUA, verified reads"
qemu-io -f raw -c 'write -P 0xa5 0 1M' -c 'write -f -P 0x5a 1M 1M' -c 'write -z 2M 1M' \
  -c 'read -P 0xa5 0 1M' -c 'read -P 0x5a 1M 1M' -c 'read -P 0 2M 1M' -c 'flush' "$uri" \
  >"$work/qemu-io.log" 2>&1
if grep -qi "fail\|error" "$work/qemu-io.log"; then cat "$work/qemu-io.log"; fail "qemu-io"; fi

step "nbdinfo --map after trims"
qemu-io -f raw -c 'discard 0 4M' "$uri" >/dev/null
nbdinfo --map "$uri" >"$work/nbdmap.txt"
head -1 "$work/nbdmap.txt" | grep -q "hole,zero" || { cat "$work/nbdmap.txt"; fail "trimmed range is not a hole"; }

step "nbdcopy: multi-connection copy, hashes equal"
nbdcopy --connections=4 "$work/rand.img" "$uri"
nbdcopy --connections=4 "$uri" - | cmp - "$work/rand.img" || fail "nbdcopy round trip differs"

step "python3-libnbd: protocol corner cases"
/usr/bin/python3 "$here/libnbd_cases.py" "$uri"

step "fio: verify job through the nbd engine"
# fio writes its verify state (local-verify-0-verify.state) to its working directory, whatever
# --directory says: run it inside the temporary directory so nothing lands in the caller's tree.
(cd "$work" && fio --name=verify --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --size=16M \
  --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 --output-format=json) \
  >"$work/fio.out" 2>&1 || { cat "$work/fio.out"; fail "fio verify"; }
[ -e "$work/local-verify-0-verify.state" ] || fail "fio's verify state is not in the temporary directory"
grep -v '^fio: ' "$work/fio.out" | /usr/bin/python3 -c '
import json, sys
job = json.load(sys.stdin)["jobs"][0]
assert job["error"] == 0, job["error"]
assert job["write"]["io_bytes"] >= 16 << 20, job["write"]["io_bytes"]
'

step "dedup: a volume with dedup=on written with repeated data (counted after the restart)"
"$bin" vol create sluice/dd --size 64M --block-size 4K --dedup on >/dev/null
dd_uri="nbd+unix:///dd?socket=$sock"
head -c 1M /dev/urandom >"$work/chunk"
for _ in 1 2 3 4 5 6 7 8; do cat "$work/chunk"; done >"$work/dd.img"
truncate -s 64M "$work/dd.img"
nbdcopy "$work/dd.img" "$dd_uri"
"$bin" vol set sluice/dd dedup=verify >/dev/null
"$bin" vol list sluice | grep -Eq "sluice/dd .* verify +standard +latency +-$" || fail "vol set dedup=verify did not reach the served volume"
"$bin" vol set sluice/dd sync=always >/dev/null
"$bin" vol set sluice/dd logbias=throughput >/dev/null
"$bin" vol list sluice | grep -Eq "sluice/dd .* verify +always +throughput +-$" || fail "vol set sync/logbias did not reach the served volume"
if "$bin" vol set sluice/dd sync=sometimes 2>"$work/err"; then fail "vol set accepted sync=sometimes"; fi
grep -q "use standard, always or disabled" "$work/err" || fail "sync=sometimes: unclear error: $(cat "$work/err")"

step "clean stop, restart, data intact"
nbdcopy "$uri" "$work/before.img"
stop
start
qemu-img compare -f raw -F raw "$work/before.img" "$uri" >/dev/null || fail "data changed across a restart"
qemu-img compare -f raw -F raw "$work/dd.img" "$dd_uri" >/dev/null || fail "dedup volume changed across a restart"
"$bin" pool status sluice >"$work/status.txt"
/usr/bin/python3 - "$work/status.txt" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"dedup: ratio ([0-9.]+)x \((\d+) references to (\d+) stored blocks", text)
assert m, f"no dedup line in pool status:\n{text}"
ratio, refs, stored = float(m[1]), int(m[2]), int(m[3])
# 8 copies of 256 distinct 4 KiB blocks; the zeros beyond are holes.
assert (refs, stored) == (2048, 256) and ratio == 8.0, (ratio, refs, stored)
EOF

step "power cut: FUA writes survive SIGKILL (replayed from the intent log)"
qemu-io -f raw -c 'write -f -P 0x3c 8M 64k' -c 'write -P 0x7e 9M 64k' -c 'flush' "$uri" >/dev/null
kill -KILL "$server"; wait "$server" 2>/dev/null || true; server=""
start
qemu-io -f raw -c 'read -P 0x3c 8M 64k' -c 'read -P 0x7e 9M 64k' "$uri" >"$work/after.log" 2>&1
if grep -qi "fail" "$work/after.log"; then cat "$work/after.log"; fail "acknowledged writes lost after SIGKILL"; fi
stop

step "launched by the client: socket activation (LISTEN_FDS) and NBD on stdin/stdout"
"$bin" pool create solo "$work/solo.img" --size 256M >/dev/null
"$bin" vol create solo/v --size 64M >/dev/null
size=$(nbdinfo --size -- [ "$bin" serve solo --dir "$work/solo" ])
[ "$size" = 67108864 ] || fail "socket-activated server reported size $size"
/usr/bin/python3 - "$bin" "$work/solo" <<'EOF'
import sys
import nbd
h = nbd.NBD()
h.connect_command([sys.argv[1], "serve", "solo", "--stdio", "--dir", sys.argv[2]])
assert h.get_size() == 64 << 20
h.pwrite(b"s" * 4096, 8192, flags=nbd.CMD_FLAG_FUA)
assert h.pread(4096, 8192) == b"s" * 4096
h.shutdown()
EOF

step "no space: every way a full pool refuses a write answers ENOSPC, and it still serves"
# Two 64 MiB leaves (about 119 MiB of data space) under a 256 MiB volume: clients can ask for
# more than the pool holds (thin, and uncompressed: the fill bytes repeat and would compress).
"$bin" pool create full "$work/full-a.img" "$work/full-b.img" --size 64M >/dev/null
"$bin" vol create full/big --size 256M --sparse --compression off >/dev/null
full_sock=$work/full.sock
"$bin" serve full --socket "$full_sock" --listen none --dir "$work/full" >"$work/full.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
  grep -q "sluice: serving" "$work/full.log" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$work/full.log"; fail "server of pool full exited at start"; }
  sleep 0.1
done
/usr/bin/python3 "$here/enospc_cases.py" "nbd+unix:///big?socket=$full_sock" \
  || { grep -v '^  ' "$work/full.log"; fail "no-space cases"; }
kill -TERM "$server"
wait "$server" || fail "server of pool full exited with $? after SIGTERM"
server=""
step "all passed"
