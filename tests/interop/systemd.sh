#!/usr/bin/env bash
# The systemd units in contrib/systemd, checked offline: `systemd-analyze verify` of
# sluice@tank.service and sluice@tank.socket in a scratch root that holds the units, the
# sluice binary at the path ExecStart names, the host's own unit directory (for the targets
# the units are ordered against), and the drop-ins a pool needs: the one `sluice pool service
# tank --install` writes for a pool made here (a mirror of a file leaf and, where a loop
# device can be had, a block-device leaf), and a TCP listener for the socket. Any line verify
# prints fails the test, since it exits 0 on some warnings. Also checks that verify really
# reads the drop-ins and the binary (a misspelt key and a missing binary must be reported),
# that the drop-in opens every leaf and the pool cache, that the flags of ExecStart are flags
# of `sluice serve`, and that the syscall filter systemd compiles from the unit keeps
# io_uring_setup, io_uring_enter and io_uring_register; prints the exposure score of
# `systemd-analyze security --offline=yes` for information. PID 1 need not be systemd.
# Needs the sluice binary as $1 (default target/release/sluice) and systemd-analyze (Debian
# package systemd); run as root to include a block-device leaf (losetup).
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
repo=$(cd "$(dirname "$0")/../.." && pwd)
units=$repo/contrib/systemd
work=$(mktemp -d)
loop=""
cleanup() {
  if [ -n "$loop" ]; then losetup -d "$loop" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "systemd: FAIL: $*" >&2; exit 1; }
step() { echo "systemd: $*"; }
command -v systemd-analyze >/dev/null || fail "systemd-analyze is missing (Debian package systemd)"
[ -x "$bin" ] || fail "no sluice binary at $bin"
step "$(systemd-analyze --version | head -1)"
service=$units/sluice@.service
socket=$units/sluice@.socket
[ -f "$service" ] && [ -f "$socket" ] || fail "contrib/systemd/sluice@.service or sluice@.socket is missing"

# The scratch root. verify resolves unit names, drop-ins and ExecStart's binary inside it.
root=$work/root
unit_dir=$root/etc/systemd/system
mkdir -p "$unit_dir" "$root/usr/lib/systemd"
cp "$service" "$socket" "$unit_dir/"
# The host's units, for sysinit.target, sockets.target and the rest the units depend on. On
# a merged-/usr system /lib is a link to usr/lib: the root gets the same link.
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
if [ -L /lib ]; then
  ln -s usr/lib "$root/lib"
elif [ -d /lib/systemd/system ]; then
  mkdir -p "$root/lib/systemd" && cp -a /lib/systemd/system "$root/lib/systemd/"
fi
exec_path=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$service")
case $exec_path in /*) ;; *) fail "ExecStart of sluice@.service does not name an absolute path: $exec_path" ;; esac
mkdir -p "$root$(dirname "$exec_path")"
cp "$bin" "$root$exec_path"
step "units and $bin placed at $exec_path in a scratch root"

# ExecStart's flags are flags of `sluice serve`.
serve_help=$("$bin" serve --help)
for flag in $(sed -n 's/^ExecStart=//p' "$service" | grep -o -- '--[a-z-]*' | sort -u); do
  grep -q -- "$flag " <<<"$serve_help" || fail "ExecStart passes $flag, which \`sluice serve --help\` does not list"
done
step "ExecStart's flags are in \`sluice serve --help\`: $(sed -n 's/^ExecStart=//p' "$service" | grep -o -- '--[a-z-]*' | sort -u | xargs)"

# A pool named tank as the service would find it: leaves in a directory of their own, the
# pool cache elsewhere.
export SLUICE_CACHE_FILE=$work/state/sluice/pools
mkdir -p "$work/leaves"
leaves=("$work/leaves/leaf0")
if [ "$(id -u)" -eq 0 ] && command -v losetup >/dev/null; then
  truncate -s 64M "$work/block.img"
  loop=$(losetup -f --show "$work/block.img" 2>/dev/null) || loop=""
fi
if [ -n "$loop" ]; then
  leaves+=("$loop")
else
  leaves+=("$work/leaves/leaf1")
  step "no loop device (needs root and losetup): both leaves are files"
fi
"$bin" pool create tank mirror "${leaves[@]}" --size 64M --sparse >/dev/null
step "pool tank: a mirror of ${leaves[*]}"

drop_in=$unit_dir/sluice@tank.service.d/50-pool.conf
if "$bin" pool service --help >/dev/null 2>&1; then
  "$bin" pool service tank --install --unit-dir "$unit_dir" >/dev/null
  step "drop-in written by \`sluice pool service tank --install --unit-dir ...\`"
else
  # Not in this binary yet: what docs/operations.md says the command writes.
  mkdir -p "$(dirname "$drop_in")"
  {
    echo "# Written by \`sluice pool service tank --install\`; rewritten when leaves change."
    echo "[Unit]"
    echo "RequiresMountsFor=$(dirname "$SLUICE_CACHE_FILE") $work/leaves"
    if [ -n "$loop" ]; then
      device=$(systemd-escape --path --suffix=device "$loop")
      echo "Wants=$device"
      echo "After=$device"
    fi
    echo "[Service]"
    echo "Environment=SLUICE_CACHE_FILE=$SLUICE_CACHE_FILE"
    echo "ReadWritePaths=$(dirname "$SLUICE_CACHE_FILE")"
    echo "ReadWritePaths=-$work/leaves"
    if [ -n "$loop" ]; then echo "DeviceAllow=$loop rw"; fi
  } >"$drop_in"
  step "drop-in written by this script (this sluice has no \`pool service\`)"
fi
[ -f "$drop_in" ] || fail "no drop-in at $drop_in"
sed 's/^/    /' "$drop_in"

# The drop-in opens what the server writes: the cache's directory (the cache and the control
# socket), each file leaf (itself or a directory above it), and, under DevicePolicy=closed,
# each block-device leaf.
writable=$(sed -n 's/^ReadWritePaths=//p' "$drop_in" | tr ' ' '\n' | sed 's/^-//' | grep . || true)
covered() {
  local path=$1 dir
  for dir in $writable; do
    case $path in "$dir" | "$dir"/*) return 0 ;; esac
  done
  return 1
}
grep -qx "Environment=SLUICE_CACHE_FILE=$SLUICE_CACHE_FILE" "$drop_in" \
  || fail "the drop-in does not set SLUICE_CACHE_FILE=$SLUICE_CACHE_FILE"
covered "$(dirname "$SLUICE_CACHE_FILE")" || fail "the drop-in leaves the pool cache's directory read-only"
for leaf in "${leaves[@]}"; do
  if [ -b "$leaf" ]; then
    if grep -qx 'DevicePolicy=closed' "$service"; then
      grep -q "^DeviceAllow=$leaf rw" "$drop_in" \
        || fail "block-device leaf $leaf has no DeviceAllow= line, and the unit sets DevicePolicy=closed"
    fi
  else
    covered "$leaf" || fail "file leaf $leaf is under no ReadWritePaths= of the drop-in"
  fi
done
step "the drop-in opens the pool cache's directory and every leaf"

# Per-instance TCP listener for the socket unit.
mkdir -p "$unit_dir/sluice@tank.socket.d"
printf '[Socket]\nListenStream=127.0.0.1:10809\n' >"$unit_dir/sluice@tank.socket.d/tcp.conf"

# verify prints warnings and may still exit 0: any output fails.
verify() { (cd "$work" && systemd-analyze verify --root="$root" --man=no "$@" 2>&1); }
set +e
output=$(verify sluice@tank.service sluice@tank.socket)
status=$?
set -e
if [ "$status" -ne 0 ] || [ -n "$output" ]; then
  printf '%s\n' "$output" >&2
  fail "systemd-analyze verify sluice@tank.service sluice@tank.socket: exit $status and the output above"
fi
step "systemd-analyze verify --root=ROOT sluice@tank.service sluice@tank.socket: exit 0, no output"

# verify sees the drop-ins and the binary: a misspelt key and a missing binary are reported.
printf '[Service]\nReadWritePath=/nowhere\n' >"$unit_dir/sluice@tank.service.d/90-typo.conf"
grep -q "Unknown key 'ReadWritePath'" <<<"$(verify sluice@tank.service)" \
  || fail "verify did not report a misspelt key in a drop-in: it does not read them"
rm "$unit_dir/sluice@tank.service.d/90-typo.conf"
mv "$root$exec_path" "$work/sluice.aside"
grep -q "$exec_path" <<<"$(verify sluice@tank.service)" \
  || fail "verify did not report the missing $exec_path: it does not check ExecStart"
mv "$work/sluice.aside" "$root$exec_path"
step "verify reports a misspelt key in a drop-in and a missing $exec_path"

# What systemd 252 makes of the unit, from the dump verify prints at debug level: the drop-in
# is applied and the compiled syscall filter allows io_uring (SystemCallFilter= with
# @system-service, minus @privileged and @resources).
dump=$(cd "$work" && SYSTEMD_LOG_LEVEL=debug systemd-analyze verify --root="$root" --man=no \
  sluice@tank.service 2>&1 | sed -n '/-> Unit sluice@tank.service:/,/-> Unit /p')
if [ -z "$dump" ]; then
  step "no unit dump at debug level from this systemd: the applied settings were not read back"
else
  grep -q "DropIn Path: $drop_in" <<<"$dump" || fail "the unit dump does not list the drop-in $drop_in"
  filter=$(sed -n 's/^[[:space:]]*SystemCallFilter: //p' <<<"$dump")
  [ -n "$filter" ] || fail "the unit dump has no SystemCallFilter"
  for call in io_uring_setup io_uring_enter io_uring_register; do
    grep -qw "$call" <<<"$filter" || fail "the compiled syscall filter refuses $call"
  done
  grep -Eq '^[[:space:]]*CapabilityBoundingSet: *$' <<<"$dump" \
    || fail "the unit dump shows capabilities in the bounding set: $(grep CapabilityBoundingSet <<<"$dump")"
  step "applied: the drop-in; a syscall filter of $(wc -w <<<"$filter") calls with io_uring_setup, io_uring_enter, io_uring_register; no capabilities"
fi

# Informational: the exposure score (not a failure, whatever it is).
score=$(cd "$work" && systemd-analyze security --offline=yes --root="$root" --no-pager \
  sluice@tank.service 2>&1 | grep 'Overall exposure level' || true)
if [ -n "$score" ]; then
  step "security --offline=yes: ${score#→ }"
else
  step "systemd-analyze security --offline=yes is not supported here: no exposure score"
fi
echo "systemd: ok"
