#!/usr/bin/env bash
# Encrypted volumes under real clients: `sluice serve` of a pool with two encrypted volumes,
# db (a raw key in a file, which the server loads when it starts) and pp (a passphrase given
# at a prompt, here on standard input). Bad input is refused and changes nothing (a key option
# without --encryption, a key file of the wrong length, a passphrase too short, a wrong
# passphrase). The server serves db and not pp; qemu-img and nbdinfo see db; fio writes it with
# verification, and `key unload` is refused while fio is connected; `key load` of pp serves it
# at once. The pool is exported and served again with db's key file moved away: db is not
# served until `key load -L file://...`, then fio's verify pass reads back what it wrote. After
# `key change` to a passphrase, a restart serves db only once that passphrase is loaded, and
# fio reads it back again. A raw send (`send -w`) goes to a second pool that never has the
# key, which scrubs it and sends it back raw; qemu-img compares it there with the snapshot.
# The control socket is the owner's only. Run by scripts/test; needs
# the sluice binary as $1 (default target/release/sluice), fio, qemu-img and nbdinfo.
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
fail() { echo "encryption: FAIL: $*" >&2; exit 1; }
step() { echo "encryption: $*"; }
for tool in fio qemu-img nbdinfo; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/test installs it)"
done
began=$SECONDS

# Refused: each says why, and leaves nothing behind.
refused() {
  local want=$1
  shift
  local out
  if out=$("$@" 2>&1); then fail "accepted: $*"; fi
  echo "$out" | grep -q -- "$want" || { echo "$out"; fail "refusal of '$*' does not say '$want'"; }
}

"$bin" pool create en mirror "$work/d0.img" "$work/d1.img" --size 256M --sparse >/dev/null
head -c 32 /dev/urandom >"$work/db.key"
chmod 600 "$work/db.key"
"$bin" vol create en/db --size 64M --encryption on --keyformat raw \
  --keylocation "file://$work/db.key" | grep -q "encrypted (aes-256-gcm, keyformat=raw" \
  || fail "vol create --encryption did not say it encrypted"
printf 'correct horse battery\n' \
  | "$bin" vol create en/pp --size 16M -s --encryption on --keyformat passphrase >/dev/null
# 128 KiB blocks, read back in 1 MiB requests after a restart: spans of several encrypted blocks
# read from the leaves, decrypted on every core.
head -c 32 /dev/urandom >"$work/big.key"
chmod 600 "$work/big.key"
"$bin" vol create en/big --size 48M -s --block-size 128K --encryption on --keyformat raw \
  --keylocation "file://$work/big.key" >/dev/null

step "bad input is refused and changes nothing"
refused "add --encryption on" "$bin" vol create en/x --size 16M --keyformat raw
head -c 31 /dev/urandom >"$work/short.key"
refused "32 bytes" "$bin" vol create en/x --size 16M --encryption on --keyformat raw \
  --keylocation "file://$work/short.key"
refused "not absolute" "$bin" vol create en/x --size 16M --encryption on --keyformat raw \
  --keylocation file://db.key
refused "8 to 512" sh -c "printf 'short\n' | '$bin' vol create en/x --size 16M --encryption on --keyformat passphrase"
refused "snapshot" "$bin" vol create en/db@s --size 16M --encryption on --keyformat raw
"$bin" vol list en -H | grep -q "^en/x" && fail "a refused create left a volume"

start() {
  "$bin" serve en --socket "$work/nbd.sock" --listen 127.0.0.1:0 >"$work/server.log" 2>&1 &
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
exports() { nbdinfo --list "nbd://$tcp" 2>/dev/null | sed -n 's/^export="\(.*\)":$/\1/p' | sort | tr '\n' ' '; }
job() {
  fio --name=enc --ioengine=nbd --uri="nbd://$tcp/db" --rw=randwrite --bs=4k --size=24M \
    --fsync=8 --verify=crc32c --verify_fatal=1 --randseed=58 "$@"
}

step "serve: db's key loaded from its file, pp waits for its passphrase"
start
grep -q "loaded the key of en/db from file://" "$work/server.log" \
  || { cat "$work/server.log"; fail "the server did not load db's key file"; }
mode=$(stat -c %a "$work/en.control")
[ "$mode" = 600 ] || fail "the control socket is mode $mode, not 600 (owner only)"
[ "$(exports)" = "big db " ] || fail "exports are '$(exports)', want big and db only"
"$bin" vol list en -H | awk -F'\t' '$1 == "en/pp" { print $13 }' | grep -qx unavailable \
  || { "$bin" vol list en; fail "vol list does not show pp's key unavailable"; }
qemu-img info "nbd://$tcp/db" | grep -q "virtual size: 64 MiB" || fail "qemu-img info of db"

big() {
  fio --name=big --ioengine=nbd --uri="nbd://$tcp/big" --rw=write --bs=1M --iodepth=8 \
    --size=40M --verify=crc32c --verify_fatal=1 --refill_buffers --randseed=59 "$@"
}
big --output="$work/big.out" >/dev/null 2>&1 || { cat "$work/big.out"; fail "fio on big"; }
step "fio writes db with verification; key unload is refused meanwhile"
job --rate_iops=2000 --output="$work/fio.out" >/dev/null 2>&1 &
fio_pid=$!
sleep 1
refused "client connection" "$bin" key unload en/db
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio failed or a block did not verify"; }
fio_pid=""
grep -q "err= 0" "$work/fio.out" || { cat "$work/fio.out"; fail "fio reported errors"; }

# A client connected to pp that sends nothing: it reports when its connection is closed
# under it.
nbdsh_idle() {
  /usr/bin/python3 - "$tcp" <<'PY'
import sys, time, nbd
h = nbd.NBD()
h.connect_uri(f"nbd://{sys.argv[1]}/pp")
print("connected", flush=True)
deadline = time.time() + 20
while time.time() < deadline:
    # No request: only the connection is watched, so it is closed as an idle one.
    try:
        h.poll(200)
    except nbd.Error as e:
        print("closed:", e, flush=True)
        sys.exit(0)
    if h.aio_is_dead() or h.aio_is_closed():
        print("closed", flush=True)
        sys.exit(0)
print("still open", flush=True)
sys.exit(1)
PY
}
step "key load of pp: a wrong passphrase is refused, the right one serves it at once"
refused "the key is wrong" sh -c "printf 'wrong horse battery\n' | '$bin' key load en/pp"
printf 'correct horse battery\n' | "$bin" key load en/pp | grep -q "its volumes are served" \
  || fail "key load of pp"
[ "$(exports)" = "big db pp " ] || fail "exports are '$(exports)' after key load, want all three"
step "key unload -f closes an idle client's connection within a second"
nbdsh_idle >"$work/idle.out" 2>&1 &
idle=$!
for _ in $(seq 1 50); do grep -q connected "$work/idle.out" && break; sleep 0.1; done
"$bin" key unload -f en/pp | grep -q "client connection" || fail "key unload -f with a client"
wait "$idle" || { cat "$work/idle.out"; fail "the idle client's connection stayed open"; }
printf 'correct horse battery\n' | "$bin" key load en/pp >/dev/null || fail "key load of pp again"

step "export, serve again without db's key file: db waits for key load -L"
stop
mv "$work/db.key" "$work/db.key.moved"
start
[ "$(exports)" = "big " ] || fail "exports are '$(exports)' with db's key file gone, want big"
big --verify_only --output="$work/big-verify.out" >/dev/null 2>&1 \
  || { cat "$work/big-verify.out"; fail "1 MiB reads of big do not verify after the restart"; }
refused "No such file" "$bin" key load en/db
"$bin" key load en/db -L "file://$work/db.key.moved" | grep -q "loaded the key of en/db" \
  || fail "key load -L"
[ "$(exports)" = "big db " ] || fail "exports are '$(exports)', want big and db"
job --verify_only --output="$work/verify.out" >/dev/null 2>&1 \
  || { cat "$work/verify.out"; fail "a block fio wrote does not read back after key load"; }

step "key change to a passphrase; after a restart only that passphrase serves db"
printf 'a new passphrase for db\n' \
  | "$bin" key change en/db --keyformat passphrase --keylocation prompt \
  | grep -q "no data was rewritten" || fail "key change"
stop
start
[ "$(exports)" = "big " ] || fail "exports are '$(exports)' after the restart, want big"
refused "the key is wrong" "$bin" key load en/db -L "file://$work/db.key.moved"
printf 'a new passphrase for db\n' | "$bin" key load en/db >/dev/null || fail "key load after change"
job --verify_only --output="$work/verify2.out" >/dev/null 2>&1 \
  || { cat "$work/verify2.out"; fail "a block fio wrote does not read back after key change"; }
"$bin" vol get en/db keyformat keylocation keystatus encryptionroot -H >"$work/props"
grep -q "keyformat	passphrase" "$work/props" && grep -q "keystatus	available" "$work/props" \
  && grep -q "encryptionroot	en/db" "$work/props" || { cat "$work/props"; fail "vol get"; }

step "raw send to a pool that never has the key; scrub there; sent back: the same bytes"
"$bin" snapshot create en/db@s1 >/dev/null
refused "send it with -w" sh -c "'$bin' send en/db@s1 >/dev/null"
"$bin" pool create bk mirror "$work/b0.img" "$work/b1.img" --size 256M --sparse >/dev/null
"$bin" send -w en/db@s1 2>/dev/null | "$bin" recv bk/db 2>/dev/null || fail "raw send | recv into bk"
"$bin" vol list bk -H | awk -F'\t' '$1 == "bk/db" { print $13 }' | grep -qx unavailable \
  || { "$bin" vol list bk; fail "the raw copy's key is not unavailable on bk"; }
"$bin" pool scrub -w bk | grep -q "0 bad copies found" || fail "scrub of the raw copy"
"$bin" send -w bk/db@s1 2>/dev/null | "$bin" recv en/back 2>/dev/null || fail "raw send back"
[ "$(exports)" = "back big db " ] || fail "exports are '$(exports)', want back (its key is db's) too"
qemu-img compare -f raw -F raw "nbd://$tcp/db@s1" "nbd://$tcp/back" >/dev/null \
  || fail "qemu-img compare: the copy sent back differs from the snapshot"
step "a volume that is not encrypted moves into encryption: send | recv --encryption"
"$bin" vol create en/old --size 16M -s >/dev/null
fio --name=old --ioengine=nbd --uri="nbd://$tcp/old" --rw=write --bs=1M --size=12M \
  --refill_buffers >/dev/null 2>&1 || fail "fio writing old"
"$bin" snapshot create en/old@m >/dev/null
head -c 32 /dev/urandom >"$work/new.key"
chmod 600 "$work/new.key"
"$bin" send en/old@m 2>/dev/null | "$bin" recv en/new --encryption on --keyformat raw \
  --keylocation "file://$work/new.key" 2>/dev/null || fail "send | recv --encryption"
"$bin" vol get en/new encryption keystatus -H | grep -q "keystatus	available" \
  || fail "the received volume is not encrypted with its key loaded"
qemu-img compare -f raw -F raw "nbd://$tcp/old@m" "nbd://$tcp/new" >/dev/null \
  || fail "qemu-img compare: the volume moved into encryption differs"
stop
step "all passed in $((SECONDS - began)) s"
