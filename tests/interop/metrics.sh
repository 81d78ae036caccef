#!/usr/bin/env bash
# `sluice serve --metrics`: Prometheus scrapes of a served pool while fio writes to it. Run by
# scripts/test after tests/interop/run.sh; needs the sluice binary as $1 (default
# target/release/sluice), fio, curl, promtool (Debian package prometheus) and
# python3-prometheus-client. Checks that a scrape passes `promtool check metrics` and the
# strict OpenMetrics parser of python3-prometheus-client, that the write counters are nonzero
# during the run and grow by the end of it, that the latency histograms agree with the request
# counts, and that other paths, methods and malformed requests get 404, 405, 400 or 431
# without stopping the server.
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
fail() { echo "metrics: FAIL: $*" >&2; exit 1; }
step() { echo "metrics: $*"; }
for tool in fio curl promtool; do
  command -v "$tool" >/dev/null || fail "$tool is missing (scripts/test installs fio, curl and prometheus)"
done
/usr/bin/python3 -c 'import prometheus_client.openmetrics.parser' 2>/dev/null \
  || fail "python3-prometheus-client is missing (scripts/test installs it)"

# Port 0 on both listeners: the server picks free ports and prints them.
"$bin" serve --dir "$work/data" --leaf-size 1G --volume-size 256M --listen 127.0.0.1:0 \
  --metrics 127.0.0.1:0 >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do
  if grep -q "sluice: serving" "$work/server.log" 2>/dev/null; then break; fi
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; fail "server exited at start"; }
  sleep 0.1
done
grep -q "sluice: serving" "$work/server.log" || { cat "$work/server.log"; fail "server did not start"; }
tcp=$(sed -n 's/.*tcp:\(127\.0\.0\.1:[0-9]*\).*/\1/p' "$work/server.log" | head -1)
metrics=$(sed -n 's|.*metrics \(http://127\.0\.0\.1:[0-9]*/metrics\).*|\1|p' "$work/server.log" | head -1)
[ -n "$tcp" ] || { cat "$work/server.log"; fail "no NBD TCP address in the server log"; }
[ -n "$metrics" ] || { cat "$work/server.log"; fail "no metrics address in the server log"; }

scrape() {
  curl -sS --max-time 10 -D "$work/$1.headers" -o "$work/$1.txt" "$metrics" || fail "scrape $1 of $metrics failed"
  grep -qi '^content-type: application/openmetrics-text; version=1.0.0' "$work/$1.headers" \
    || { cat "$work/$1.headers"; fail "scrape $1: not the OpenMetrics content type"; }
}

step "scrape before any client"
scrape idle

step "fio: 4k random sync writes for 3 s, scraped during and after"
fio --name=metrics --ioengine=nbd --uri="nbd://$tcp/vol0" --rw=randwrite --bs=4k --fsync=1 \
  --size=64M --runtime=3 --time_based --output="$work/fio.out" >/dev/null 2>&1 &
fio_pid=$!
# Scraped once the server has answered writes and their flushes, while fio still runs (not
# after a fixed sleep).
counted() { # op
  grep -Eq "^sluice_volume_requests_total\\{[^}]*op=\"$1\"[^}]*\\} [1-9][0-9]" "$work/during.txt"
}
for _ in $(seq 1 200); do
  scrape during
  counted write && counted flush && break
  sleep 0.05
done
counted write && counted flush || fail "fewer than 10 writes and flushes counted in 10 s of fio"
kill -0 "$fio_pid" 2>/dev/null || fail "fio ended before the scrape during its run"
wait "$fio_pid" || { cat "$work/fio.out"; fail "fio failed"; }
fio_pid=""
scrape after

step "promtool check metrics, and the OpenMetrics parser of python3-prometheus-client"
# promtool (2.42 here) parses the classic text format only. That format names a counter's
# family with its `_total`; OpenMetrics names it without, so promtool finds each counter's
# samples without their HELP line and says "no help text" (exit 3, a lint finding; a parse
# error exits 1). Those findings are accepted, each only if the OpenMetrics HELP line of the
# family is there; any other finding fails.
for name in during after; do
  rc=0
  promtool check metrics <"$work/$name.txt" >"$work/promtool.$name" 2>&1 || rc=$?
  if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
    cat "$work/promtool.$name"; fail "promtool cannot parse the $name scrape (exit $rc)"
  fi
  while read -r series finding; do
    [ -z "$series" ] && continue
    family=${series%_total}
    if [ "$finding" != "no help text" ] || [ "$family" = "$series" ] \
      || ! grep -q "^# TYPE $family counter$" "$work/$name.txt" \
      || ! grep -q "^# HELP $family " "$work/$name.txt"; then
      cat "$work/promtool.$name"; fail "promtool finds a problem in the $name scrape: $series $finding"
    fi
  done <"$work/promtool.$name"
done
/usr/bin/python3 - "$work/during.txt" "$work/after.txt" <<'EOF'
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for path in sys.argv[1:]:
    # Strict: raises on anything OpenMetrics 1.0 forbids (a missing # EOF, a counter sample
    # without _total, histogram buckets out of order or not matching the count, bad escapes).
    families = list(text_string_to_metric_families(open(path).read()))
    assert len(families) >= 30, f"{path}: {len(families)} families"
EOF

step "write counters are nonzero and grow"
/usr/bin/python3 - "$work/idle.txt" "$work/during.txt" "$work/after.txt" <<'EOF'
import re, sys

def parse(path):
    """Samples by (name, frozenset of labels); the label order of the text does not matter."""
    text = open(path).read()
    assert text.endswith("# EOF\n"), f"{path}: no # EOF at the end"
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
        assert m, f"{path}: cannot read {line!r}"
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        samples[(m[1], labels)] = float(m[3])
    return samples

def total(samples, name, **want):
    """The sum of `name` over the series whose labels include `want`."""
    want = set(want.items())
    found = [v for (n, labels), v in samples.items() if n == name and want <= labels]
    assert found, f"no {name} with {want}"
    return sum(found)

idle, during, after = (parse(p) for p in sys.argv[1:4])
vol = dict(pool="sluice", volume="vol0")
for counter, labels in [
    ("sluice_volume_requests_total", dict(vol, op="write")),
    ("sluice_volume_requests_total", dict(vol, op="flush")),
    ("sluice_volume_written_bytes_total", vol),
    ("sluice_leaf_writes_total", dict(pool="sluice")),
    ("sluice_leaf_written_bytes_total", dict(pool="sluice")),
    ("sluice_log_commits_total", dict(pool="sluice")),
]:
    a, b, c = (total(s, counter, **labels) for s in (idle, during, after))
    assert b > 0, f"{counter}{labels} is {b} during the fio run"
    assert a <= b < c, f"{counter}{labels} does not grow: {a} idle, {b} during, {c} after"
# fio's 4 KiB writes: one request each, so the bytes are 4096 times the requests.
writes = total(after, "sluice_volume_requests_total", op="write", **vol)
assert total(after, "sluice_volume_written_bytes_total", **vol) == 4096 * writes
# Every answered write is in the latency histogram, whose +Inf bucket equals its count.
count = total(after, "sluice_volume_latency_seconds_count", op="write", **vol)
inf = total(after, "sluice_volume_latency_seconds_bucket", op="write", le="+Inf", **vol)
assert count == inf == writes, (count, inf, writes)
assert total(after, "sluice_volume_latency_seconds_sum", op="write", **vol) > 0
# A mirror: both leaves are labelled with it and both took writes.
leaves = {dict(l)["leaf"] for (n, l) in after if n == "sluice_leaf_writes_total"}
assert len(leaves) == 2, leaves
for leaf in leaves:
    assert total(after, "sluice_leaf_writes_total", leaf=leaf, vdev="mirror-0") > 0, leaf
print(f"metrics: {int(writes)} writes counted, {len(after)} series in the last scrape")
EOF

step "other paths, methods and malformed requests"
code=$(curl -sS -o /dev/null -w '%{http_code}' "${metrics%/metrics}/other")
[ "$code" = 404 ] || fail "GET /other answered $code, not 404"
code=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$metrics")
[ "$code" = 405 ] || fail "POST /metrics answered $code, not 405"
/usr/bin/python3 - "${metrics#http://}" <<'EOF'
import socket, sys
host, rest = sys.argv[1].split(":", 1)
port = int(rest.split("/", 1)[0])
def ask(data):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]
assert ask(b"\x16\x03\x01\x02\x00hello\r\n\r\n") == b"HTTP/1.1 400 Bad Request", "garbage"
assert ask(b"GET /metrics HTTP/1.1\r\n") == b"HTTP/1.1 400 Bad Request", "unfinished head"
assert ask(b"X" * 8192) == b"HTTP/1.1 431 Request Header Fields Too Large", "endless head"
assert ask(b"GET /metrics HTTP/1.0\r\n\r\n") == b"HTTP/1.1 200 OK", "scrape after the bad ones"
EOF

step "clean stop"
kill -TERM "$server"
wait "$server" || fail "server exited with $? after SIGTERM"
server=""
grep -q "exported" "$work/server.log" || fail "server did not export the pool on SIGTERM"
step "all passed"
