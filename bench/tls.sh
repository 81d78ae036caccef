#!/usr/bin/env bash
# What TLS costs a sync write: random writes of --write-size (4 KiB unless said), each
# followed by a flush, over TCP on loopback, to sluice in plain text and with TLS (a
# pre-shared key), and to qemu-nbd in plain text and with TLS from the same keys.psk
# (tls-creds-psk).
#
# sluice serves its default pool (a 2-way mirror of two files in --dir, thick 1 GiB vol0)
# with `--tls on`, so one server answers both the plain and the TLS clients. qemu-nbd serves a
# 1 GiB raw file (allocated in full, cache=none, aio=native) twice: plain on one port, with
# --tls-creds on another. The writers are python3-libnbd clients (fio's nbd engine cannot
# read a PSK file: libnbd forbids local files in URIs unless the program allows them), each
# on its own connection, doing pwrite then flush in a loop for --seconds. Per round, targets
# and writer counts alternate; the table gives medians of IOPS and of the server's CPU per
# write (utime + stime from /proc over the run, divided by the writes).
# Usage: bench/tls.sh [--rounds 3] [--seconds 10] [--write-size 4K|1M] [--dir DIR] [--no-build]
#          [--bin PATH (a sluice binary to run instead of building one)] [--report PATH.md]
set -euo pipefail
rounds=3 seconds=10 dir=/tmp/sluice-tls build=1 report=docs/bench/tls.md size=4096 bin=target/release/sluice
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --report) report=$2; shift 2 ;;
    --write-size) size=$(numfmt --from=iec "$2"); shift 2 ;;
    --bin) bin=$2; build=0; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--seconds S] [--write-size 4K|1M] [--dir DIR] [--no-build] [--bin PATH] [--report PATH.md]" >&2; exit 2 ;;
  esac
done
for tool in qemu-nbd openssl /usr/bin/python3; do
  command -v $tool >/dev/null || { echo "tls bench: $tool is missing" >&2; exit 1; }
done
[ "$build" = 1 ] && cargo build -q --release -p sluice-cli
bin=$(realpath "$bin")
rm -rf "$dir"; mkdir -p "$dir/psk"
export SLUICE_CACHE_FILE=$dir/cache
pids=()
# The servers are waited for, not only killed: a run started right after would otherwise find
# their ports still taken, and its qemu-nbd would exit at once.
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT
printf 'alice:%s\n' "$(openssl rand -hex 32)" >"$dir/psk/keys.psk"
psk=$dir/psk/keys.psk
"$bin" serve --dir "$dir/sluice" --leaf-size 4G --volume-size 1G --listen 127.0.0.1:10931 \
  --tls on --tls-psk "$psk" >"$dir/sluice.log" 2>&1 &
sluice_pid=$!; pids+=($!)
fallocate -l 1G "$dir/qemu.img"
qemu-nbd -f raw --cache=none --aio=native -e 64 -t -b 127.0.0.1 -p 10932 -x disk "$dir/qemu.img" \
  >"$dir/qemu-plain.log" 2>&1 &
qemu_plain_pid=$!; pids+=($!)
qemu-nbd -f raw --cache=none --aio=native -e 64 -t -b 127.0.0.1 -p 10933 -x disk \
  --object tls-creds-psk,id=tls0,endpoint=server,dir="$dir/psk" --tls-creds tls0 \
  "$dir/qemu.img" >"$dir/qemu-tls.log" 2>&1 &
qemu_tls_pid=$!; pids+=($!)
for _ in $(seq 1 300); do grep -q "sluice: serving" "$dir/sluice.log" && break; sleep 0.1; done
sleep 1
for log in sluice qemu-plain qemu-tls; do
  case $log in sluice) p=$sluice_pid ;; qemu-plain) p=$qemu_plain_pid ;; qemu-tls) p=$qemu_tls_pid ;; esac
  kill -0 "$p" 2>/dev/null || { echo "tls bench: the $log server exited at start:" >&2; cat "$dir/$log.log" >&2; exit 1; }
done
declare -A uri pid
uri[sluice-plain]="nbd://127.0.0.1:10931/vol0"; pid[sluice-plain]=$sluice_pid
uri[sluice-tls]="nbds://alice@127.0.0.1:10931/vol0?tls-psk-file=$psk"; pid[sluice-tls]=$sluice_pid
uri[qemu-nbd-plain]="nbd://127.0.0.1:10932/disk"; pid[qemu-nbd-plain]=$qemu_plain_pid
uri[qemu-nbd-tls]="nbds://alice@127.0.0.1:10933/disk?tls-psk-file=$psk"; pid[qemu-nbd-tls]=$qemu_tls_pid
targets="sluice-plain sluice-tls qemu-nbd-plain qemu-nbd-tls"
cpu_ticks() { read -r -a f <"/proc/$1/stat"; echo $((f[13] + f[14])); }
ticks=$(getconf CLK_TCK)
results=$dir/results
: >"$results"
for round in $(seq 1 "$rounds"); do
  for writers in 1 8; do
    for target in $targets; do
      before=$(cpu_ticks "${pid[$target]}")
      ops=$(/usr/bin/python3 - "${uri[$target]}" "$writers" "$seconds" "$size" <<'EOF'
import os, random, sys, threading, time
import nbd
uri, writers, seconds, size = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
handles = []
for _ in range(writers):
    h = nbd.NBD()
    h.set_uri_allow_local_file(True)
    h.connect_uri(uri)
    handles.append(h)
counts = [0] * writers
start = time.monotonic()
def run(i):
    h, rng, buf = handles[i], random.Random(i), os.urandom(size)
    blocks = min(h.get_size(), 1 << 30) // size
    while time.monotonic() - start < seconds:
        h.pwrite(buf, rng.randrange(blocks) * size)
        h.flush()
        counts[i] += 1
threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.monotonic() - start
for h in handles: h.shutdown()
print(sum(counts), f"{elapsed:.3f}")
EOF
)
      after=$(cpu_ticks "${pid[$target]}")
      echo "$target $writers $round $ops $((after - before))" | tee -a "$results"
    done
  done
done
commit=$(git rev-parse --short HEAD)
/usr/bin/python3 - "$results" "$report" "$rounds" "$seconds" "$commit" "$ticks" "$size" <<'EOF'
import datetime, os, platform, statistics, sys
results, report, rounds, seconds, commit, ticks, size = sys.argv[1:]
ticks, size = int(ticks), int(size)
what = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
option = "" if size == 4096 else f" --write-size {what.replace(' KiB', 'K').replace(' MiB', 'M')}"
rows = [l.split() for l in open(results) if l.strip()]
def cell(target, writers):
    rs = [r for r in rows if r[0] == target and r[1] == str(writers)]
    iops = statistics.median(int(r[3]) / float(r[4]) for r in rs)
    cpu = statistics.median(int(r[5]) / ticks / max(int(r[3]), 1) * 1e6 for r in rs)
    return iops, cpu
targets = ["sluice-plain", "sluice-tls", "qemu-nbd-plain", "qemu-nbd-tls"]
lines = ["# Sync writes over TLS", ""]
lines.append(f"Measured {datetime.date.today()} at commit {commit} with `bench/tls.sh --rounds {rounds} "
             f"--seconds {seconds}{option}` on this development VM ({os.cpu_count()} vCPUs, {platform.machine()}, "
             "Debian; files on its virtual disk, whose fdatasync latency swings between minutes). "
             "Medians of the rounds; targets and writer counts alternate within each round.")
lines.append("")
lines.append(f"{what} random writes, each followed by a flush, from python3-libnbd clients over TCP on "
             "loopback, one connection per writer. TLS is TLS 1.3 with a pre-shared key "
             "(TLS_AES_128_GCM_SHA256), the same keys.psk for sluice (`--tls on --tls-psk`) and "
             "qemu-nbd (`tls-creds-psk`). CPU is the server process's, per write.")
lines.append("")
lines.append("| target | writers | IOPS | server CPU per write (µs) |")
lines.append("|---|---:|---:|---:|")
got = {}
for writers in (1, 8):
    for t in targets:
        iops, cpu = cell(t, writers)
        got[(t, writers)] = (iops, cpu)
        lines.append(f"| {t} | {writers} | {iops:.0f} | {cpu:.1f} |")
lines.append("")
for writers in (1, 8):
    sp, st = got[("sluice-plain", writers)], got[("sluice-tls", writers)]
    qt = got[("qemu-nbd-tls", writers)]
    lines.append(f"- {writers} writer(s): TLS gives sluice {st[0] / sp[0]:.2f}x the plain IOPS at "
                 f"{st[1] / sp[1]:.2f}x the CPU per write; sluice over TLS reaches "
                 f"{st[0] / qt[0]:.2f}x qemu-nbd's IOPS over TLS at {st[1] / qt[1]:.2f}x its CPU per write.")
lines.append("")
for writers in (1, 8):
    added = {t: got[(f"{t}-tls", writers)][1] - got[(f"{t}-plain", writers)][1]
             for t in ("sluice", "qemu-nbd")}
    lines.append(f"- {writers} writer(s): TLS adds {added['sluice']:.1f} µs of server CPU per write "
                 f"to sluice and {added['qemu-nbd']:.1f} µs to qemu-nbd.")
lines.append("")
lines.append("Every run (writes, seconds, server CPU ticks at "
             f"{ticks}/s):")
lines.append("")
lines.append("| target | writers | round | writes | seconds | CPU ticks |")
lines.append("|---|---:|---:|---:|---:|---:|")
for r in rows:
    lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} |")
open(report, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
