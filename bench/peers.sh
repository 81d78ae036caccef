#!/usr/bin/env bash
# Runs the same fio jobs against sluice and its peers on the same disk and writes a table, the
# goals and a plot to docs/bench/peers.md (and peers.svg). Targets, all on files in one data dir:
#   raw            fio itself on a raw file (libaio, O_DIRECT): the disk's limit, no server
#   qemu-nbd       a raw file, cache=none, aio=native
#   nbdkit         the file plugin, cache=none
#   nbdkit-memory  the memory plugin: no disk and no durability, the cost of the protocol alone
#   sluice         `sluice serve` on a pool of one file leaf twice the volume's size, a volume of
#                  the default 16 KiB blocks
#   sluice-nocache the same caching no data (cache.contents=metadata), like the peers' cache=none;
#                  4 KiB writes and the reads only
#   sluice-mirror  (--mirror) the same on a 2-way mirror of two files, as the default pool is
#                  (the quick start's layout and leaf kind); every job
#   sluice-nolz4   (--mirror too, or named in --targets) the same with the volume's compression off, every job, so
#                  that the CPU sluice spends on lz4 shows apart from the rest
#   sluice-bsN     (--volblock N, say 4K or 8K) the same with a volume of N blocks; the mixed
#                  small-write job only
#   sluice-nocache-bsN (--volblock N too) the same caching no data, where a block the writes
#                  cover in part is read from the disk; the mixed small-write job only
#   sluice[K=V]    (--sluice-tunable K=V) the same with tunables
#   sluice-before  (--before BIN) the same served by another binary (one built from an earlier
#                  commit), to show a change against the tree before it in the same run
#   sluice-nocache-before (--before BIN) sluice-nocache served by that binary, for a change
#                  to the disk's read path
# Jobs: 4 KiB random writes with a flush after every write (fio --fsync=1) at 1, 8 and 32 jobs
# (one connection each); 4 KiB random reads at queue depth 32; 1 MiB sequential reads; 1 MiB
# sequential writes ending with a flush (fio --end_fsync=1); 1 MiB sequential writes each
# followed by a flush at 1 and 4 jobs; the three 1 MiB write jobs again on compressible data
# (names ending -z); and a filesystem's or database's mixed small writes (mixed-8: 8 jobs of
# 4 KiB and 8 KiB random writes, half each, a flush after every 4 writes, over the whole
# volume).
#
# What makes each row fair:
# - Writes without flushes are measured as durable throughput: the job ends with a flush, and
#   its MB/s are the bytes fio counted over the time from the end of the ramp to fio's exit,
#   that flush included (fio's own figure leaves the end flush out, and a server that
#   finishes into the page cache, as nbdkit's file plugin does, would be credited with the
#   page cache's speed).
# - Reads read from the disk wherever a target caches nothing: the kernel's page cache is
#   dropped before every read job, for every target, and while a read job runs nbdkit may
#   keep no more than PAGE_CACHE_CAP of it (a memory cgroup; see below): enough
#   for the kernel's readahead, which counts (it is what users get), too little to hold what
#   an earlier pass over the span read. A 10 s job passes over its 1 GiB span many times, and
#   nbdkit's file plugin reads through the page cache even with cache=none: unbounded, it
#   served 21.5 GB of a 1 MiB read job while the disk read 1.86 GB (2026-12-04 22:45Z). Each
#   read job's disk bytes per operation (/proc/diskstats of the disk under --dir) are reported
#   to show it. sluice's own cache is left as it is: "sluice" is its defaults, and
#   "sluice-nocache" caches no data (cache.contents=metadata) for the rows that compare disk
#   paths.
# - The same data for every target: fio's default buffers, which are random (lz4 stores them
#   as they are: measured 1.00x), and in the -z jobs buffers that compress to about half
#   (fio --buffer_compress_percentage=50 --refill_buffers), so lz4's cost and its early abort
#   both show.
# - CPU per operation twice: the server process's (/proc/PID/stat, its threads only) and the
#   machine's busy time (/proc/stat: user, nice, system, irq and softirq of every CPU, fio's
#   own included, which is alike for every NBD target), since kernel threads doing a peer's
#   writeback are charged to no process. For a job that ends with a flush, the machine's CPU
#   from the end of the measured period to fio's exit is added, over all of the job's
#   operations, and for sluice's write jobs the txg sync after the job (see run_one).
#
# All servers run side by side for the whole run. Each round runs every job on every target in
# turn (job-major, the target order rotated each round), so the targets of a job run minutes
# apart at most and a slow phase of the VM hits all of them alike; each target's volume sees the
# same jobs in the same order. The report gives the median of three rounds and their spread.
# (An idle sluice server still syncs an empty txg every txg.timeout_ms: a few small writes and
# two flushes a leaf every 5 s, next to the thousands a second of the target being measured.)
# Besides fio's figures, each server's CPU time (/proc/PID/stat) and context switches (every
# thread's, /proc/PID/task/*/status) are sampled while fio runs and given per operation (a
# write-and-flush job's operation is one write and its flush).
#
# Usage: bench/peers.sh [--seconds N] [--rounds N] [--warmup N] [--dir DIR] [--size SIZE]
#          [--no-build] [--mirror] [--volblock N]... [--sluice-tunable K=V[,K=V...]]... [--jobs JOB,...]
#          [--targets NAME,...] [--report PATH.md] [--before BIN]
# --warmup N (default 10; 0: none): after its prefill, every target gets N s of 4 KiB random
# writes at queue depth 32 and N s of 1 MiB sequential writes at queue depth 8, unmeasured, so
# that the first round starts where the later ones do: without it sluice's first round paid
# for its heap growing to its working set (RSS 1.13 to 2.86 GB over round 1 and flat through
# round 2, each new page cleared by the kernel) and ran on a volume its own writes had not yet
# scattered (docs/bench/peers-notes.md, 2026-11-27 22:50Z).
# --report writes the table somewhere other than docs/bench/peers.md (and the plot beside it),
# so a run of a few jobs or targets leaves the main table alone. A run with the targets
# sluice[intent_log.policy=batch] and sluice[intent_log.policy=pipelined] beside sluice (whose
# log policy is auto) also judges auto against the better of the two in each sync-write job.
# A run takes about 12 s per job and target each round, plus the warm-up (about 25 s a target)
# and each target's prefill of --size: with every target but nbdkit-memory, --mirror and two
# --volblock targets (86 runs a round; 92 since the compression-off target runs every job; 94
# with the uncached --volblock targets),
# three rounds took 43 minutes on 2026-11-29 and about
# 45 GB of the data dir (checked before anything is written).
# Needs: fio, qemu-utils (qemu-nbd), nbdkit, libnbd-bin; builds target/release/sluice unless
# --no-build.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C  # $EPOCHREALTIME and numfmt must use a decimal point
cmdline="bench/peers.sh"
for a in "$@"; do
  if [[ $a =~ ^[A-Za-z0-9_./=,:+@%-]+$ ]]; then cmdline+=" $a"; else cmdline+=" $(printf '%q' "$a")"; fi
done
seconds=10
rounds=3
warmup=10
dir=${TMPDIR:-/tmp}/sluice-peers
size=2G
build=1
mirror=0
volblocks=()
tunables=()
only_jobs=""
only_targets=""
report=docs/bench/peers.md
before=""
usage="usage: $0 [--seconds N] [--rounds N] [--warmup N] [--dir DIR] [--size SIZE] [--no-build] [--mirror] [--volblock N]... [--sluice-tunable K=V[,K=V...]]... [--jobs JOB,...] [--targets NAME,...] [--report PATH.md] [--before BIN]"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --dir) dir=$(realpath -m "$2"); shift 2 ;;
    --size) size=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --mirror) mirror=1; shift ;;
    --volblock) volblocks+=("$2"); shift 2 ;;
    --sluice-tunable) tunables+=("$2"); shift 2 ;;
    --jobs) only_jobs=$2; shift 2 ;;
    --targets) only_targets=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --before) before=$(realpath "$2"); shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
[[ $seconds =~ ^[0-9]+$ && $seconds -ge 2 ]] || { echo "peers: --seconds must be 2 or more" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "peers: --rounds must be a positive number" >&2; exit 2; }
[[ $warmup =~ ^[0-9]+$ ]] || { echo "peers: --warmup must be a number of seconds (0: none)" >&2; exit 2; }
[[ $report == *.md ]] || { echo "peers: --report must name a .md file (the plot goes beside it as .svg)" >&2; exit 2; }
[ -d "$(dirname "$report")" ] || { echo "peers: --report $report: the directory $(dirname "$report") does not exist (create it first)" >&2; exit 2; }
# The socket paths go into NBD URIs unescaped.
[[ $dir =~ ^[A-Za-z0-9_./+-]+$ ]] || { echo "peers: --dir must be a plain path (letters, digits, _ . / + -)" >&2; exit 2; }
for tool in fio qemu-nbd nbdkit nbdinfo; do
  command -v "$tool" >/dev/null || { echo "peers: $tool is missing (apt-get install fio qemu-utils nbdkit libnbd-bin)" >&2; exit 1; }
done
[ "$build" = 1 ] && cargo build -q --release -p sluice-cli
bin=$PWD/target/release/sluice
[ -x "$bin" ] || { echo "peers: $bin is missing (run without --no-build)" >&2; exit 1; }
# Taken now: the servers keep running this binary even if a build replaces the file meanwhile.
bin_mtime=$(date -u -r "$bin" +%Y-%m-%dT%H:%MZ)
[ -z "$before" ] || [ -x "$before" ] || { echo "peers: --before $before is not an executable" >&2; exit 2; }
# The tree as the servers start, not as the report is written: edits made while the run goes
# on are not in the binary.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- crates Cargo.toml Cargo.lock 2>/dev/null || commit="$commit+changes"

all_jobs=(syncwrite-1 syncwrite-8 syncwrite-32 randread-qd32 seqread-1m seqwrite-1m syncwrite-1m-1 syncwrite-1m-4
  seqwrite-1m-z syncwrite-1m-1-z syncwrite-1m-4-z mixed-8)
if [ -n "$only_jobs" ]; then
  IFS=, read -ra jobs <<<"$only_jobs"
  for j in "${jobs[@]}"; do
    [[ " ${all_jobs[*]} " == *" $j "* ]] || { echo "peers: unknown job $j (jobs: ${all_jobs[*]})" >&2; exit 2; }
  done
else
  jobs=("${all_jobs[@]}")
fi
wanted() { [ -z "$only_targets" ] || [[ ",$only_targets," == *",$1,"* ]]; }
# A name in --targets that is no target of this run would silently leave it out. (Names are
# taken out whole rather than split at commas: sluice[K=V,K=V] holds commas.)
if [ -n "$only_targets" ]; then
  known=(raw qemu-nbd nbdkit nbdkit-memory sluice sluice-nocache sluice-nolz4)
  [ "$mirror" = 1 ] && known+=(sluice-mirror)
  for b in ${volblocks[@]+"${volblocks[@]}"}; do known+=("sluice-bs$b" "sluice-nocache-bs$b"); done
  for t in ${tunables[@]+"${tunables[@]}"}; do known+=("sluice[$t]"); done
  [ -n "$before" ] && known+=(sluice-before sluice-nocache-before)
  rest=",$only_targets,"
  for k in "${known[@]}"; do
    while [[ $rest == *",$k,"* ]]; do rest=${rest/",$k,"/,}; done
  done
  rest=${rest#,}; rest=${rest%,}
  if [ -n "$rest" ]; then
    echo "peers: --targets names $rest, which is no target of this run (sluice[K=V] needs --sluice-tunable K=V, sluice-mirror --mirror, sluice-bsN and sluice-nocache-bsN --volblock N, sluice-before and sluice-nocache-before --before BIN)" >&2
    exit 2
  fi
fi

bytes=$(numfmt --from=iec "$size")
# Every target's image or volume is --size (2 GiB by default), written whole once; the jobs
# work in its first 1 GiB (less on a small --size; a multiple of 4 MiB so the 4-job 1 MiB job
# splits it evenly), but for mixed-8, which spreads over all of it.
vol_bytes=$(( bytes / 16384 * 16384 ))
# sluice's leaves hold twice the volume, as bench/per-op.sh's do. A copy-on-write pool needs
# room beside its live data for the blocks of the txgs in flight and the frees they defer
# (ZFS's advice: keep a pool under 80% full); on a leaf of --size (2 GiB for a 1.5 GiB
# volume whose 1 GiB the jobs rewrite) its free space was cut into pieces: 32 clients of 4 KiB
# write + flush took 0.67-0.70 disk writes and 89-90 us of CPU per operation against
# 0.30-0.31 and 75-77 us on a 3 GiB leaf (docs/bench/peers-notes.md, 2026-11-27 20:30Z).
# The peers' files stay at --size: their writes go in place.
leaf_bytes=$(( vol_bytes * 2 ))
span_mib=$(( vol_bytes >> 20 )); [ "$span_mib" -gt 1024 ] && span_mib=1024
span_mib=$(( span_mib / 4 * 4 ))
[ "$span_mib" -ge 16 ] || { echo "peers: --size is too small" >&2; exit 2; }
span=${span_mib}M
ramp=1
tck=$(getconf CLK_TCK)
# The device under --dir (major:minor), whose reads and writes each job's sample counts.
rm -rf "$dir"; mkdir -p "$dir"
disk=$(findmnt -no MAJ:MIN -T "$dir" 2>/dev/null | head -1 | tr -d ' ' || true)
awk -v d="$disk" '$1 ":" $2 == d { found = 1 } END { exit !found }' /proc/diskstats ||
  { echo "peers: the device under $dir (${disk:-unknown}) is not in /proc/diskstats; disk bytes per operation will read n/a" >&2; }

# nbdkit's file plugin reads through the page cache even with cache=none (qemu-nbd's cache=none
# is O_DIRECT), so nbdkit runs in a memory cgroup of its own: unbounded, but while a read job
# runs, when it may hold PAGE_CACHE_CAP above what it held once the caches were dropped (its own
# memory): the page cache its reads fill is charged to it, so readahead works and nothing read in
# an earlier pass stays. cgroup v2 (memory.high, which reclaims without killing) and v1
# (memory.limit_in_bytes, which reclaims the page cache first) both work; a kill by the cgroup
# fails the row. Without either, the read rows say so (cache_cap "none" in the report).
# The cap is taken before fio connects, so what nbdkit allocates for the job's requests (a few
# MiB at queue depth 8 of 1 MiB) comes out of the 64 MiB too: on v2 nothing is killed (the
# kill count there stays 0) and reclaim takes the page cache first; only if its own memory
# grew past the cap would memory.high slow nbdkit down, which the rows' rates would show.
PAGE_CACHE_CAP=$(( 64 << 20 ))
cg_dir=""; cg_limit=""; cg_unlimited=""; cg_usage=""; cg_events=""
if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
    echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  cg_dir=/sys/fs/cgroup/sluice-peers-$$; cg_limit=memory.high; cg_unlimited=max; cg_usage=memory.current
  cg_events=memory.events
elif [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
  cg_dir=/sys/fs/cgroup/memory/sluice-peers-$$; cg_limit=memory.limit_in_bytes; cg_unlimited=-1
  cg_usage=memory.usage_in_bytes; cg_events=memory.oom_control
fi
if [ -n "$cg_dir" ] && ! { mkdir -p "$cg_dir" && [ -f "$cg_dir/$cg_limit" ]; }; then
  rmdir "$cg_dir" 2>/dev/null || true; cg_dir=""
fi
# Removed on any exit; cleanup (below) takes this over once there are servers to stop.
trap '[ -z "$cg_dir" ] || rmdir "$cg_dir" 2>/dev/null || true' EXIT
[ -n "$cg_dir" ] || echo "peers: no memory cgroup here: nbdkit's read rows may be served from the page cache (see their disk bytes per operation)" >&2
cache_cap="none"; [ -n "$cg_dir" ] && cache_cap=$PAGE_CACHE_CAP
confine() {  # moves server $1 into the page-cache cgroup
  [ -n "$cg_dir" ] || return 0
  echo "$1" >"$cg_dir/cgroup.procs" || { echo "peers: could not move process $1 into $cg_dir" >&2; exit 1; }
}
cap_page_cache() {  # on | off; on right after the caches were dropped
  [ -n "$cg_dir" ] || return 0
  local v=$cg_unlimited
  [ "$1" = on ] && v=$(( $(cat "$cg_dir/$cg_usage") + PAGE_CACHE_CAP ))
  echo "$v" >"$cg_dir/$cg_limit" || { echo "peers: could not set $cg_dir/$cg_limit to $v" >&2; exit 1; }
}
cg_kills() {  # processes the cgroup's limit killed so far
  [ -n "$cg_dir" ] && [ -r "$cg_dir/$cg_events" ] || { echo 0; return; }
  awk '$1 == "oom_kill" { n = $2 } END { print n + 0 }' "$cg_dir/$cg_events" 2>/dev/null || echo 0
}
# Room for every image first: a run that fills the filesystem halfway through fails its targets
# one by one (and leaves too little for anything else). The peers' files are --size, each
# sluice leaf twice the volume; the mirror has two.
leaves=0
for t in sluice sluice-nocache; do wanted "$t" && leaves=$(( leaves + 1 )); done
if [ "$mirror" = 1 ]; then
  wanted sluice-mirror && leaves=$(( leaves + 2 ))
  wanted sluice-nolz4 && leaves=$(( leaves + 1 ))
fi
for b in ${volblocks[@]+"${volblocks[@]}"}; do
  for t in "sluice-bs$b" "sluice-nocache-bs$b"; do wanted "$t" && leaves=$(( leaves + 1 )); done
done
for t in ${tunables[@]+"${tunables[@]}"}; do wanted "sluice[$t]" && leaves=$(( leaves + 1 )); done
if [ -n "$before" ]; then
  for t in sluice-before sluice-nocache-before; do wanted "$t" && leaves=$(( leaves + 1 )); done
fi
files=0
for t in raw qemu-nbd nbdkit; do wanted "$t" && files=$(( files + 1 )); done
need=$(( files * bytes + leaves * leaf_bytes ))
have=$(( $(df --output=avail -B1 "$dir" | tail -1) ))
if [ "$need" -gt "$have" ]; then
  echo "peers: the images need $(numfmt --to=iec "$need") in $dir, which has $(numfmt --to=iec "$have") free; free space there, pick fewer targets (--targets), or a smaller --size" >&2
  exit 1
fi
results=$dir/results.jsonl
: >"$results"
export SLUICE_CACHE_FILE=$dir/sluice-pools

# Per target: how fio reaches it (nbd URI or file), the server's PID (none for raw), what it
# is, the jobs it runs, how long its prefill's last txg takes to sync, and for sluice its
# pool (synced after each write job, see run_one).
targets=()
declare -A uri_of file_of pid_of desc_of jobs_of settle_of pool_of
pids=()
fio_pid=""
cleanup() {
  [ -n "$fio_pid" ] && kill "$fio_pid" 2>/dev/null
  # TERM lets sluice finish its requests, sync and export the pool.
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -z "$cg_dir" ] || rmdir "$cg_dir" 2>/dev/null || true
}
trap cleanup EXIT

wait_socket() {
  for _ in $(seq 1 200); do [ -S "$1" ] && nbdinfo --size "nbd+unix:///$2?socket=$1" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "peers: no server on $1" >&2; exit 1
}

# The PID sampled must be the server itself, not a shell around it: `cmd &` execs cmd in the
# child, and qemu-nbd and nbdkit -f do not fork, but say so loudly if that ever changes.
check_pid() {
  local comm; comm=$(cat "/proc/$1/comm" 2>/dev/null || true)
  [ "$comm" = "$2" ] || { echo "peers: process $1 is '$comm', not $2" >&2; exit 1; }
}

prefill() {  # writes the whole image once, so reads read data and writes overwrite it
  fio --name=prefill --rw=write --bs=1M --iodepth=8 --size="$(( vol_bytes >> 20 ))M" --end_fsync=1 "$@" >/dev/null 2>&1
}

add_target() {  # name, description, jobs (space-separated), seconds for the prefill's last txg to sync
  targets+=("$1"); desc_of[$1]=$2; jobs_of[$1]=" $3 "; settle_of[$1]=$4
}

# 1. The raw file, directly (the limit).
if wanted raw; then
  truncate -s "$size" "$dir/raw.img"
  prefill --ioengine=libaio --direct=1 --filename="$dir/raw.img"
  add_target raw "fio directly on a raw file (libaio, O_DIRECT): the disk's limit, no server" "${all_jobs[*]}" 0
  file_of[raw]=$dir/raw.img
fi

# 2. qemu-nbd on a raw file, cache=none, as many connections as jobs.
if wanted qemu-nbd; then
  truncate -s "$size" "$dir/qemu.img"
  qemu-nbd -f raw --cache=none --aio=native -e 64 -t -k "$dir/qemu.sock" -x disk "$dir/qemu.img" &
  pid_of[qemu-nbd]=$!; pids+=($!); wait_socket "$dir/qemu.sock" disk; check_pid "$!" qemu-nbd
  uri_of[qemu-nbd]="nbd+unix:///disk?socket=$dir/qemu.sock"
  prefill --ioengine=nbd --uri="${uri_of[qemu-nbd]}"
  add_target qemu-nbd "qemu-nbd on a raw file, cache=none, aio=native, up to 64 connections" "${all_jobs[*]}" 0
fi

# 3. nbdkit's file plugin, cache=none. nbdkit runs a fixed number of threads per connection
# (16 by default), each holding one request: 32 lets the QD 32 job have its whole queue served.
if wanted nbdkit; then
  truncate -s "$size" "$dir/nbdkit.img"
  nbdkit -f --threads=32 -U "$dir/nbdkit.sock" file file="$dir/nbdkit.img" cache=none &
  pid_of[nbdkit]=$!; pids+=($!); wait_socket "$dir/nbdkit.sock" ""; check_pid "$!" nbdkit; confine "$!"
  uri_of[nbdkit]="nbd+unix:///?socket=$dir/nbdkit.sock"
  prefill --ioengine=nbd --uri="${uri_of[nbdkit]}"
  add_target nbdkit "nbdkit's file plugin on a raw file, cache=none, 32 threads per connection" "${all_jobs[*]}" 0
fi

# 4. nbdkit's memory plugin: the ceiling. allocator=malloc, a flat array, is the plugin's
# fastest (the default sparse array takes a lock on every write).
if wanted nbdkit-memory; then
  nbdkit -f --threads=32 -U "$dir/memory.sock" memory size="$size" allocator=malloc &
  pid_of[nbdkit-memory]=$!; pids+=($!); wait_socket "$dir/memory.sock" ""; check_pid "$!" nbdkit
  uri_of[nbdkit-memory]="nbd+unix:///?socket=$dir/memory.sock"
  prefill --ioengine=nbd --uri="${uri_of[nbdkit-memory]}"
  add_target nbdkit-memory "nbdkit's memory plugin (allocator=malloc, 32 threads per connection): no disk, no durability, the cost of the protocol alone" "${all_jobs[*]}" 0
fi

# 5. sluice: label, description, jobs, `mirror` or `single`, then `serve` arguments. Each has a
# pool and a directory of its own (pool names also name the control sockets).
sluice_n=0
# The binary the next sluice target runs (sluice-before and sluice-nocache-before: --before's); each target's own is
# also the one that syncs its pool (the control protocol may differ between them).
target_bin=$bin
declare -A bin_of
sluice_target() {
  local label=$1 desc=$2 target_jobs=$3 layout=$4 vol_args=$5; shift 5
  local bin=$target_bin
  local d=$dir/sluice$sluice_n pool=peers$sluice_n
  sluice_n=$(( sluice_n + 1 ))
  mkdir -p "$d"
  local leaves=("$d/leaf0.img")
  [ "$layout" = mirror ] && leaves=(mirror "$d/leaf0.img" "$d/leaf1.img")
  # Written once, like the peers' images after their prefill: a sparse leaf would make ext4
  # allocate extents (and commit its journal at every flush) on the first write to each
  # region, a cost of the sparse file rather than of the server.
  local leaf
  for leaf in "${leaves[@]}"; do
    [ "$leaf" = mirror ] && continue
    dd if=/dev/zero of="$leaf" bs=1M count="$(( leaf_bytes >> 20 ))" oflag=direct status=none
  done
  "$bin" pool create "$pool" "${leaves[@]}" >/dev/null
  # shellcheck disable=SC2086  # vol_args is a list of words
  "$bin" vol create "$pool/disk" --size "$vol_bytes" $vol_args >/dev/null
  "$bin" serve "$pool" --socket "$d/nbd.sock" --listen none --dir "$d" "$@" 2>"$d/serve.log" &
  pid_of[$label]=$!; pids+=($!); wait_socket "$d/nbd.sock" disk
  # The process is named after its binary's file (at most 15 bytes of it).
  check_pid "$!" "$(basename "$bin" | cut -c1-15)"
  uri_of[$label]="nbd+unix:///disk?socket=$d/nbd.sock"
  prefill --ioengine=nbd --uri="${uri_of[$label]}"
  # A write job leaves its open txg (up to a quarter of txg.dirty_max, a tenth of memory by
  # default) to a later sync. After each write job `pool sync` writes it out and waits, which
  # keeps that work off the next target's run and charges it to this job; the prefill's
  # txg waits out txg.timeout_ms (5 s by default) before the first round.
  local timeout_ms=5000 a
  for a in "$@"; do [[ $a == txg.timeout_ms=* ]] && timeout_ms=${a#txg.timeout_ms=}; done
  add_target "$label" "$desc" "$target_jobs" "$(( timeout_ms / 1000 + 1 ))"
  pool_of[$label]=$pool
  bin_of[$label]=$bin
}
if wanted sluice; then
  sluice_target sluice "sluice serve on a pool of one file leaf twice the volume's size, a volume of 16 KiB blocks, default tunables" "${all_jobs[*]}" single ""
fi
# ZFS's primarycache=metadata: qemu-nbd and nbdkit run cache=none, and sluice's default cache
# (an eighth of memory) holds this whole volume, so this target shows what the disk path does.
# Indirect blocks stay cached, as in any ZFS setting. It skips the 1 MiB writes, which cover
# whole blocks and so do not depend on the cache; the 4 KiB writes stay, both for their own
# figures and so that its volume is as scattered by copy-on-write as sluice's when read.
# (sluice-nocache-before, below, runs the same jobs.)
nocache_jobs="syncwrite-1 syncwrite-8 syncwrite-32 randread-qd32 seqread-1m mixed-8"
if wanted sluice-nocache; then
  sluice_target sluice-nocache "the same with cache.contents=metadata (caches no data, like ZFS's primarycache=metadata)" \
    "$nocache_jobs" single "" --set cache.contents=metadata
fi
# What the default pool layout costs: every log block and txg write goes to both files, on the
# same disk here; reads may go to either.
if [ "$mirror" = 1 ] && wanted sluice-mirror; then
  sluice_target sluice-mirror "the same on a 2-way mirror of two files in the same dir (the default pool's layout)" \
    "${all_jobs[*]}" mirror ""
fi
# lz4's own cost: the volume's compression off. Every job, so that its pool ages as the
# default's does: with the 1 MiB writes alone its free space stayed whole while the 4 KiB
# random writes scattered sluice's, and the difference counted as lz4's (2026-11-29).
# With --mirror, or when --targets names it: a run of a few jobs needs it for the CPU goal rows.
if { [ "$mirror" = 1 ] && wanted sluice-nolz4; } || [[ ",$only_targets," == *",sluice-nolz4,"* ]]; then
  sluice_target sluice-nolz4 "the same with the volume's compression off" "${all_jobs[*]}" single "--compression off"
fi
for b in ${volblocks[@]+"${volblocks[@]}"}; do
  wanted "sluice-bs$b" || continue
  sluice_target "sluice-bs$b" "the same with a volume of $b blocks" "mixed-8" single "--block-size $b"
done
# The same uncached: with 16 KiB blocks every 4 or 8 KiB write reads the rest of its block, and
# those reads in the device slow the log's durable writes (docs/bench/peers-notes.md,
# 2026-12-04 04:36Z); blocks the size of the writes read nothing.
for b in ${volblocks[@]+"${volblocks[@]}"}; do
  wanted "sluice-nocache-bs$b" || continue
  sluice_target "sluice-nocache-bs$b" "the same with a volume of $b blocks and cache.contents=metadata" \
    "mixed-8" single "--block-size $b" --set cache.contents=metadata
done
for t in ${tunables[@]+"${tunables[@]}"}; do
  label="sluice[$t]"
  wanted "$label" || continue
  IFS=, read -ra kv <<<"$t"
  set_args=(); desc="the same as sluice with"
  for x in "${kv[@]}"; do set_args+=(--set "$x"); desc+=" --set $x"; done
  sluice_target "$label" "$desc" "${all_jobs[*]}" single "" "${set_args[@]}"
done
if [ -n "$before" ] && wanted sluice-before; then
  target_bin=$before
  sluice_target sluice-before "the same as sluice, served by $before ($("$before" --version 2>/dev/null || echo "another build"))" "${all_jobs[*]}" single ""
  target_bin=$bin
fi
if [ -n "$before" ] && wanted sluice-nocache-before; then
  target_bin=$before
  sluice_target sluice-nocache-before "the same as sluice-nocache, served by $before ($("$before" --version 2>/dev/null || echo "another build"))" \
    "$nocache_jobs" single "" --set cache.contents=metadata
  target_bin=$bin
fi
[ ${#targets[@]} -gt 0 ] || { echo "peers: no targets selected" >&2; exit 2; }
# How fio reaches target $1, into the array `where` (the caller's, if it declared one local).
target_args() {
  if [ -n "${file_of[$1]:-}" ]; then
    where=(--ioengine=libaio --direct=1 --filename="${file_of[$1]}")
  else
    where=(--ioengine=nbd --uri="${uri_of[$1]}")
  fi
}

# The warm-up (see --warmup), one target after another, each sluice pool synced after it.
if [ "$warmup" -gt 0 ]; then
  for t in "${targets[@]}"; do
    target_args "$t"
    echo "peers: warm-up, $t" >&2
    # Each ends with an fsync, so that no target's first measured flush carries the warm-up.
    fio --name=warmup-4k --rw=randwrite --bs=4k --iodepth=32 --size="$span" --time_based \
      --runtime="$warmup" --end_fsync=1 "${where[@]}" >/dev/null 2>&1 ||
      { echo "peers: the warm-up's 4 KiB writes to $t failed" >&2; exit 1; }
    fio --name=warmup-1m --rw=write --bs=1M --iodepth=8 --size="$span" --time_based \
      --runtime="$warmup" --end_fsync=1 "${where[@]}" >/dev/null 2>&1 ||
      { echo "peers: the warm-up's 1 MiB writes to $t failed" >&2; exit 1; }
    if [ -n "${pool_of[$t]:-}" ]; then "${bin_of[$t]}" pool sync "${pool_of[$t]}" >/dev/null; fi
  done
fi
# Every prefill's last txg synced before the first measurement.
max_settle=0
for t in "${targets[@]}"; do [ "${settle_of[$t]}" -gt "$max_settle" ] && max_settle=${settle_of[$t]}; done
sleep "$max_settle"

job_args() {  # the fio arguments of a job, into jargs
  local n job=${1%-z}
  case $job in
    syncwrite-1m-*) n=${job##*-}
      # Each job its own slice of the region, written sequentially.
      jargs=(--rw=write --bs=1M --fsync=1 --iodepth=1 --numjobs="$n" --size="$(( span_mib / n ))M" --offset_increment="$(( span_mib / n ))M") ;;
    syncwrite-*) jargs=(--rw=randwrite --bs=4k --fsync=1 --iodepth=1 --numjobs="${job#syncwrite-}" --size="$span") ;;
    randread-qd32) jargs=(--rw=randread --bs=4k --iodepth=32 --numjobs=1 --size="$span") ;;
    seqread-1m) jargs=(--rw=read --bs=1M --iodepth=8 --numjobs=1 --size="$span") ;;
    seqwrite-1m) jargs=(--rw=write --bs=1M --iodepth=8 --numjobs=1 --size="$span" --end_fsync=1) ;;
    # As a filesystem or database sends them: 4 and 8 KiB at random places over the whole
    # volume, a flush after every 4 writes, 8 clients.
    mixed-8) jargs=(--rw=randwrite --bssplit=4k/50:8k/50 --fsync=4 --iodepth=1 --numjobs=8 --size="$(( vol_bytes >> 20 ))M") ;;
  esac
  # Compressible data: about half of each buffer compresses, refilled for every write.
  [[ $1 == *-z ]] && jargs+=(--buffer_compress_percentage=50 --refill_buffers)
  return 0
}

# The machine's busy CPU ticks so far (user, nice, system, irq, softirq of every CPU; idle,
# iowait and steal are not busy).
machine_ticks() {
  awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8; exit }' /proc/stat
}

# The disk's sectors read and written so far.
disk_sectors() {
  awk -v d="$disk" '$1 ":" $2 == d { print $6, $10; found = 1; exit } END { if (!found) print "-", "-" }' /proc/diskstats
}

sample() {  # time, the machine's busy ticks and the disk's sectors, then the server's /proc/PID/stat and every thread's context switches
  { echo "$EPOCHREALTIME"; echo "$(machine_ticks) $(disk_sectors)"; [ -z "$1" ] || { cat "/proc/$1/stat"; grep -H ctxt_switches /proc/"$1"/task/*/status; }; } 2>/dev/null || true
}

sleep_until() {
  local d; d=$(awk -v t="$1" -v now="$EPOCHREALTIME" 'BEGIN { d = t - now; printf "%.3f", (d > 0 ? d : 0) }')
  sleep "$d"
}

# One fio job on one target: round, position in the round, job, target.
run_one() {
  local round=$1 pos=$2 job=$3 target=$4
  local base; base=$dir/r$round-$job-$(printf %s "$target" | tr -c 'A-Za-z0-9_.=-' '_')
  local pid=${pid_of[$target]:-}
  local where
  target_args "$target"
  job_args "$job"
  echo "peers: round $round/$rounds, $job, $target" >&2
  rm -f "$base".{before,after,exit,end,settled,kills}
  local kills; kills=$(cg_kills)
  if [[ $job == *read* ]]; then
    # Reads come from the disk, not from what the kernel kept of earlier writes.
    sync; echo 3 >/proc/sys/vm/drop_caches
    cap_page_cache on
  fi
  local start=$EPOCHREALTIME
  fio --name="$job" --time_based --runtime="$seconds" --ramp_time="$ramp" --group_reporting \
    --output-format=json "${where[@]}" "${jargs[@]}" >"$base.out" 2>"$base.err" &
  fio_pid=$!
  # Both samples inside the measured period (which starts after fio's setup and the ramp),
  # so the CPU and switches counted are those of the steady state fio's figures describe;
  # they are divided by the time between the samples and by fio's IOPS.
  sleep_until "$(awk -v s="$start" -v r="$ramp" 'BEGIN { printf "%.6f", s + r + 0.5 }')"
  sample "$pid" >"$base.before"
  sleep_until "$(awk -v s="$start" -v r="$ramp" -v n="$seconds" 'BEGIN { printf "%.6f", s + r + n }')"
  sample "$pid" >"$base.after"
  wait "$fio_pid" || true
  # fio's exit: after a job's end flush.
  sample "$pid" >"$base.exit"
  fio_pid=""
  if [[ $job == *read* ]]; then cap_page_cache off; fi
  echo $(( $(cg_kills) - kills )) >"$base.kills"
  if [ -n "${pool_of[$target]:-}" ] && [[ $job == *write* || $job == mixed* ]]; then
    sample "$pid" >"$base.end"
    "${bin_of[$target]}" pool sync "${pool_of[$target]}" >/dev/null
    sample "$pid" >"$base.settled"
  fi
  grep -v '^fio: ' "$base.out" >"$base.json" || true
  /usr/bin/python3 - "$base" "$round" "$pos" "$job" "$target" "$tck" "$start" "$ramp" >>"$results" <<'EOF'
import json, sys
base, rnd, pos, job, target, tck, start, ramp = sys.argv[1:]
row = {"round": int(rnd), "pos": int(pos), "job": job, "target": target, "start": float(start)}
def done(**kw):
    row.update(kw)
    print(json.dumps(row))
    sys.exit(0)
try:
    j = json.load(open(base + ".json"))["jobs"][0]
except Exception as e:
    err = open(base + ".err").read().strip().splitlines()
    done(error=f"fio: {err[-1] if err else e}")
if j.get("error"):
    done(error=f"fio error {j['error']}")
try:
    if int(open(base + ".kills").read()) and target == "nbdkit":
        done(error="the page-cache cgroup's limit killed nbdkit")
except (OSError, ValueError):
    pass
rw = j["read"] if "read" in job else j["write"]
if not rw["total_ios"]:
    done(error="fio did no I/O")
pct = lambda lat, p: lat.get("percentile", {}).get(p, 0) / 1000
iops = rw["iops"]
row.update(iops=iops, ops=rw["total_ios"], mb_s=rw["bw_bytes"] / 1e6,
           p50_us=pct(rw["clat_ns"], "50.000000"), p99_us=pct(rw["clat_ns"], "99.000000"))
sync = j.get("sync", {}).get("lat_ns", {})
if sync.get("N"):
    # A durable write's latency is its write's and its flush's together; means add up exactly
    # where percentiles do not.
    row.update(flush_p50_us=pct(sync, "50.000000"), flush_p99_us=pct(sync, "99.000000"),
               durable_mean_us=(rw["clat_ns"]["mean"] + sync["mean"]) / 1000)

def read_sample(name):
    """(time, machine busy ticks, process ticks or None, switches by thread) of a sample."""
    try:
        lines = open(f"{base}.{name}").read().splitlines()
        t = float(lines[0])
        fields = lines[1].split()
        machine = int(fields[0])
    except (OSError, IndexError, ValueError):
        return None
    try:
        disks[name] = (int(fields[1]), int(fields[2]))
    except (IndexError, ValueError):  # "-": the device is not in /proc/diskstats
        pass
    if len(lines) < 3:
        return t, machine, None, {}
    try:
        stat = lines[2].rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        ticks = int(stat[11]) + int(stat[12])      # fields 14 and 15: utime, stime
    except (IndexError, ValueError):
        return t, machine, None, {}
    switches = {}
    for line in lines[3:]:  # /proc/P/task/T/status:voluntary_ctxt_switches:\tN
        path, _, n = line.rsplit(":", 2)
        tid = path.split("/")[4]
        switches[tid] = switches.get(tid, 0) + int(n)
    return t, machine, ticks, switches

def since(a, b):  # the machine's and the process's CPU seconds, and switches, from a to b
    # Per thread: a thread that exits between the samples takes its count with it, and one
    # born between them counts from zero.
    machine = (b[1] - a[1]) / int(tck)
    if a[2] is None or b[2] is None:
        return machine, None, None
    return machine, (b[2] - a[2]) / int(tck), sum(n - a[3].get(tid, 0) for tid, n in b[3].items())

disks = {}  # sample name -> the disk's sectors read and written
before, after, exited = read_sample("before"), read_sample("after"), read_sample("exit")
if before and after and after[0] > before[0]:
    machine, cpu, switches = since(before, after)
    per_s = iops * (after[0] - before[0])
    row.update(mcpu_us_op=machine / per_s * 1e6)
    # What the disk read and wrote per operation: a read job served from memory shows here.
    if "before" in disks and "after" in disks:
        (r0, w0), (r1, w1) = disks["before"], disks["after"]
        row.update(disk_read_kib_op=(r1 - r0) / 2 / per_s, disk_written_kib_op=(w1 - w0) / 2 / per_s)
    if cpu is not None:
        row.update(cpu_us_op=cpu / per_s * 1e6, ctx_op=switches / per_s)
    elif target != "raw":
        row.update(error="the server is gone")
if "seqwrite" in job and exited:
    # Durable throughput: the bytes fio counted over the time from the end of the ramp to
    # fio's exit, which comes after the job's end flush.
    elapsed = exited[0] - float(start) - float(ramp)
    row.update(fio_mb_s=row["mb_s"], mb_s=rw["io_bytes"] / elapsed / 1e6, iops=rw["io_bytes"] / elapsed / (1 << 20))
    if after:
        machine, cpu, _ = since(after, exited)
        row.update(end_mcpu_us_op=machine / rw["total_ios"] * 1e6)
        if cpu is not None:
            row.update(end_cpu_us_op=cpu / rw["total_ios"] * 1e6)
end, settled = read_sample("end"), read_sample("settled")
if end and settled:
    # The work the job left behind (its last txg), over the job's operations.
    machine, cpu, switches = since(end, settled)
    row.update(settle_mcpu_us_op=machine / rw["total_ios"] * 1e6)
    if cpu is not None:
        row.update(settle_cpu_us_op=cpu / rw["total_ios"] * 1e6, settle_ctx_op=switches / rw["total_ios"])
# What the disk wrote after the measured period, over all the job's operations: the end flush
# (to fio's exit) and the txg sluice's sync after the job wrote out.
if "write" in job or job.startswith("mixed"):
    tail = [(a, b) for a, b in (("after", "exit"), ("end", "settled")) if a in disks and b in disks]
    if tail:
        row.update(end_disk_written_kib_op=sum(disks[b][1] - disks[a][1] for a, b in tail) / 2 / rw["total_ios"])
done()
EOF
}

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
n=${#targets[@]}
for round in $(seq 1 "$rounds"); do
  k=$(( (round - 1) % n ))
  order=("${targets[@]:k}" "${targets[@]:0:k}")
  pos=0
  for job in "${jobs[@]}"; do
    for target in "${order[@]}"; do
      [[ ${jobs_of[$target]} == *" $job "* ]] || continue
      run_one "$round" "$pos" "$job" "$target"
      pos=$(( pos + 1 ))
    done
  done
done
finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# What the report needs to say how the figures were made.
for t in "${targets[@]}"; do printf '%s\t%s\t%s\n' "$t" "${jobs_of[$t]}" "${desc_of[$t]}"; done >"$dir/targets.tsv"
CACHE_CAP=$cache_cap COMMAND=$cmdline SECONDS_=$seconds ROUNDS=$rounds WARMUP=$warmup RAMP=$ramp SIZE=$size SPAN=$span DIR=$dir \
  BUILT=$build COMMIT=$commit BINARY_MTIME=$bin_mtime STARTED=$started \
  FINISHED=$finished JOBS="${jobs[*]}" FIO=$(fio --version) QEMU_NBD=$(qemu-nbd --version | head -1) \
  NBDKIT=$(nbdkit --version) /usr/bin/python3 - "$dir/targets.tsv" "$dir/meta.json" <<'EOF'
import json, os, sys
e = os.environ
targets = [dict(zip(("name", "jobs", "description"), line.rstrip("\n").split("\t")))
           for line in open(sys.argv[1])]
for t in targets:
    t["jobs"] = t["jobs"].split()
json.dump({"command": e["COMMAND"], "seconds": int(e["SECONDS_"]), "rounds": int(e["ROUNDS"]),
           "warmup": int(e["WARMUP"]), "page_cache_cap": e["CACHE_CAP"],
           "ramp": int(e["RAMP"]), "size": e["SIZE"], "span": e["SPAN"], "dir": e["DIR"],
           "built": e["BUILT"] == "1", "commit": e["COMMIT"], "binary_mtime": e["BINARY_MTIME"],
           "started": e["STARTED"], "finished": e["FINISHED"], "jobs": e["JOBS"].split(),
           "targets": targets, "fio": e["FIO"], "qemu_nbd": e["QEMU_NBD"], "nbdkit": e["NBDKIT"]},
          open(sys.argv[2], "w"), indent=1)
EOF
/usr/bin/python3 bench/peers_report.py "$results" "$dir/meta.json" "$report" "${report%.md}.svg"
echo "peers: wrote $report and ${report%.md}.svg (raw results in $dir)" >&2
