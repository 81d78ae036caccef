#!/usr/bin/env bash
# The default pool is thin: the filesystem holding it can fill under it. Here that filesystem
# is a 600 MiB tmpfs; `sluice serve --dir` on it makes the default pool (a 2-way mirror of two
# thin 1 GiB files, their intent-log regions written ahead) with a 900 MiB volume vol0. A
# libnbd client writes 1 MiB chunks of random bytes with FUA, one after another, and keeps
# the digest of each acknowledged one, until a write fails. Then: the server's log names the
# leaf and the full filesystem, the server is stopped, the tmpfs grown, the pool served again
# (import replays the intent log), and every acknowledged chunk reads back as it was written.
# Run by scripts/test (it mounts a tmpfs, so as root); needs the sluice binary as $1 and
# python3-libnbd.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
work=$(mktemp -d)
server=""
cleanup() {
  # No errexit here: `wait` on the killed server returns 137, which would end the trap before
  # the unmount (and left the tmpfs mounted after every failure).
  set +e
  if [ -n "$server" ]; then kill -KILL "$server" 2>/dev/null; wait "$server" 2>/dev/null; fi
  umount "$work/fs" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap, so the tmpfs is unmounted.
trap 'exit 143' TERM
trap 'exit 130' INT
export SLUICE_CACHE_FILE=$work/cache
fail() { echo "host_full: FAIL: $*" >&2; exit 1; }
step() { echo "host_full: $*"; }

# A run killed outright (SIGKILL, a timeout) never ran its cleanup: its tmpfs is still mounted,
# holding memory. Unmount those, and remove their directories, before mounting another; a run
# whose script is still alive (its pid in its directory's owner file) is left alone.
while read -r source target _; do
  if [ "$source" = sluice-host-full ] && [[ "$target" == */fs ]]; then
    owner=$(cat "${target%/fs}/owner" 2>/dev/null || true)
    if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then continue; fi
    if umount "$target" 2>/dev/null; then
      step "unmounted $target, left by an earlier run"
      rm -rf "${target%/fs}"
    else
      step "$target, left by an earlier run, is busy (a server of that run may still be running)"
    fi
  fi
done < /proc/mounts
echo $$ > "$work/owner"

mkdir "$work/fs"
mount -t tmpfs -o size=600M sluice-host-full "$work/fs" \
  || fail "cannot mount a tmpfs on $work/fs (the test needs root)"
data=$work/fs/data

# Serves the default pool in $data, logging to $work/$1.log, once it says so.
serve() {
  "$bin" serve --dir "$data" --leaf-size 1G --volume-size 900M --listen none \
    >"$work/$1.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do
    if grep -q "sluice: serving" "$work/$1.log" 2>/dev/null; then return; fi
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/$1.log"; fail "the server did not start"
}

serve first
# Thin, but the log regions (an eighth of each leaf) are written: about 254 MiB in all.
used=$(du -sk "$data" | cut -f1)
step "the new default pool takes $((used / 1024)) MiB of the filesystem"
[ "$used" -lt $((600 << 10)) ] || fail "the thin pool took $used KiB at the start"
[ "$used" -gt $((200 << 10)) ] || fail "the log regions were not written ahead ($used KiB)"

uri="nbd+unix:///vol0?socket=$data/nbd.sock"
/usr/bin/python3 - "$uri" "$work/acked" >"$work/writer.out" 2>&1 <<'PYEOF' || true
import hashlib, os, sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = h.get_size()
with open(sys.argv[2], "w") as acked:
    for at in range(0, size, 1 << 20):
        chunk = os.urandom(1 << 20)
        try:
            h.pwrite(chunk, at, nbd.CMD_FLAG_FUA)
        except nbd.Error as e:
            print(f"refused at {at >> 20} MiB: {e}")
            break
        acked.write(f"{at} {hashlib.sha256(chunk).hexdigest()}\n")
        acked.flush()
    else:
        print("the volume never filled the filesystem")
        sys.exit(1)
PYEOF
cat "$work/writer.out"
grep -q "refused at" "$work/writer.out" || fail "no write was refused: $(cat "$work/writer.out")"
chunks=$(wc -l <"$work/acked")
[ "$chunks" -gt 0 ] || fail "no write was acknowledged before the filesystem filled"
step "$chunks MiB acknowledged before the filesystem filled"

# The error names the leaf and the filesystem holding it.
for _ in $(seq 1 100); do
  grep -q "is full" "$work/first.log" && break
  sleep 0.1
done
grep -E "device $data/[^ ]+: the filesystem holding it \($work/fs\) is full" "$work/first.log" \
  >/dev/null || { cat "$work/first.log"; fail "the server's log does not name the leaf and $work/fs"; }

kill -TERM "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
server=""
mount -o remount,size=2G "$work/fs" || fail "cannot grow the tmpfs"
serve again
/usr/bin/python3 - "$uri" "$work/acked" <<'PYEOF' || fail "an acknowledged write was lost"
import hashlib, sys
import nbd
h = nbd.NBD()
h.connect_uri(sys.argv[1])
lost = []
for line in open(sys.argv[2]):
    at, digest = line.split()
    if hashlib.sha256(h.pread(1 << 20, int(at))).hexdigest() != digest:
        lost.append(int(at) >> 20)
if lost:
    print(f"chunks at MiB {lost} differ from what was acknowledged")
    sys.exit(1)
PYEOF
kill -TERM "$server"
wait "$server" || fail "the server exited with $? after SIGTERM"
server=""
step "every acknowledged chunk read back after the pool was served again; ok"
