#!/usr/bin/env bash
# Two configurations of one bench/per-op.sh job, alternated in ABBA order, with medians.
#
# On this project's VMs one run can differ from the next by 20-30% for reasons no run controls
# (the disk's phase, the host), and in one session the first run of each hand-alternated pair
# was the slower one six times in seven whichever configuration it was
# (docs/bench/peers-notes.md, 2026-12-04 04:36Z). ABBA order (A B, B A, A B, ...) puts each
# configuration first in half the pairs, so neither gains from the order; the summary gives
# each configuration's median, the ratio of medians, and in how many pairs B did better.
#
# Usage: bench/ab.sh [--pairs N (default 4)] [--a 'WORDS'] [--b 'WORDS'] -- PER-OP ARGUMENTS
#   WORDS: extra arguments for that configuration's runs, split at spaces; leading NAME=VALUE
#   words are set in its environment instead (a trial build's switches). The arguments after
#   -- are bench/per-op.sh's, shared by both.
# Example: bench/ab.sh --pairs 3 --a '--bin /tmp/sluice-old' --b '--bin target/release/sluice' \
#            -- sluice syncwrite 1 --seconds 8 --warm 3 --volume-mib 2048
# Prints each run's line from bench/per-op.sh, then the medians. Needs what bench/per-op.sh
# needs and Debian's /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=4; a_words=""; b_words=""
while [ $# -gt 0 ]; do
  case $1 in
    --pairs) pairs=$2; shift 2 ;;
    --a) a_words=$2; shift 2 ;;
    --b) b_words=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "ab: unknown argument $1 (per-op's arguments go after --)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "ab: no bench/per-op.sh arguments after --" >&2; exit 2; }
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "ab: --pairs must be a positive count, got $pairs" >&2; exit 2; }
common=("$@")
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# One run of configuration $1 (A or B) with its words $2; appends "CONFIG LINE" to $results.
run() {
  local config=$1 words=$2 envs=() extra=() split=() w line
  read -ra split <<<"$words"
  for w in ${split[@]+"${split[@]}"}; do
    if [ ${#extra[@]} -eq 0 ] && [[ $w =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then envs+=("$w"); else extra+=("$w"); fi
  done
  # All of per-op's output, then its summary line (the one that names the target; a read
  # job prints its prefetch figures before it): a reader that stops early would end per-op
  # with SIGPIPE before it prints the rest.
  line=$(env ${envs[@]+"${envs[@]}"} bench/per-op.sh "${common[@]}" ${extra[@]+"${extra[@]}"})
  line=$(grep -m1 -E '^(sluice|qemu-nbd) ' <<<"$line" || true)
  [ -n "$line" ] || { echo "ab: a run of $config printed nothing" >&2; exit 1; }
  echo "$config: $line"
  echo "$config $line" >>"$results"
}

for pair in $(seq 1 "$pairs"); do
  if [ $(( pair % 2 )) -eq 1 ]; then run A "$a_words"; run B "$b_words"; else run B "$b_words"; run A "$a_words"; fi
done

/usr/bin/python3 - "$results" "$pairs" <<'PY'
import re, statistics, sys
path, pairs = sys.argv[1], int(sys.argv[2])
runs = {"A": [], "B": []}
for line in open(path):
    config, text = line.split(" ", 1)
    figures = {}
    m = re.search(r": ([\d,.]+) IOPS", text)
    if m:
        figures["IOPS"] = float(m.group(1).replace(",", ""))
    for name, pattern in [("server CPU us/op", r"server CPU ([\d.]+) us/op"),
                          ("machine CPU us/op", r"machine ([\d.]+) us/op"),
                          ("p99 us", r"(?:write )?[\d.]+ us mean, [\d.]+ us p50, ([\d.]+) us p99"),
                          ("flush p99 us", r"flush [\d.]+ us mean, [\d.]+ us p50, ([\d.]+) us p99")]:
        m = re.search(pattern, text)
        if m:
            figures[name] = float(m.group(1))
    runs[config].append(figures)
print(f"\n{pairs} pairs, ABBA order; medians:")
print(f"{'':<20} {'A':>10} {'B':>10} {'B/A':>7}  pairs where B is better")
for name in ["IOPS", "server CPU us/op", "machine CPU us/op", "p99 us", "flush p99 us"]:
    a = [r[name] for r in runs["A"] if name in r]
    b = [r[name] for r in runs["B"] if name in r]
    if len(a) != pairs or len(b) != pairs:
        continue
    higher_better = name == "IOPS"
    wins = sum(1 for x, y in zip(a, b) if (y > x if higher_better else y < x))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:<20} {ma:>10,.0f} {mb:>10,.0f} {mb / ma:>6.2f}x  {wins} of {pairs}")
PY
