#!/usr/bin/env bash
# TLS interop tests (docs/tls.md): `sluice serve --tls` against GnuTLS clients (nbdinfo from
# libnbd, qemu-img and qemu-io) with pre-shared keys and with x509 certificates, a raw client
# that tries options before STARTTLS, the per-export allow-list, `--tls on`, and the rule
# that a non-loopback listener needs --tls said. Run by scripts/test; needs the sluice binary
# as $1 (default target/release/sluice). Credentials are made here with the openssl CLI.
set -euo pipefail
bin=$(realpath "${1:-target/release/sluice}")
work=$(mktemp -d)
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export SLUICE_CACHE_FILE=$work/cache
data=$work/data
fail() { echo "tls: FAIL: $*" >&2; exit 1; }
step() { echo "tls: $*"; }

# Credentials: a CA, a server certificate for localhost/127.0.0.1, a client certificate
# (CN=client1), one from a CA the server does not know, and a PSK file.
certs=$work/certs
mkdir -p "$certs" "$work/server" "$work/client" "$work/rogue" "$work/psk" "$work/wrongpsk"
ossl() { openssl "$@" >/dev/null 2>&1 || fail "openssl $1 failed"; }
issue() { # issue CA-PREFIX CN OUT-PREFIX EXTENSIONS
  ossl req -newkey rsa:2048 -nodes -keyout "$3-key.pem" -out "$3.csr" -subj "/CN=$2"
  printf '%b' "$4" >"$3.ext"
  ossl x509 -req -in "$3.csr" -CA "$1-cert.pem" -CAkey "$1-key.pem" -CAcreateserial \
    -out "$3-cert.pem" -days 2 -extfile "$3.ext"
}
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$certs/ca-key.pem" -out "$certs/ca-cert.pem" \
  -days 2 -subj "/CN=sluice test CA"
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$certs/rogueca-key.pem" \
  -out "$certs/rogueca-cert.pem" -days 2 -subj "/CN=another CA"
issue "$certs/ca" localhost "$certs/server" \
  'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'
issue "$certs/ca" client1 "$certs/client" 'extendedKeyUsage=clientAuth\n'
issue "$certs/rogueca" client1 "$certs/rogue" 'extendedKeyUsage=clientAuth\n'
# The server's directory (qemu's tls-creds-x509 and nbdkit's layout) and the clients' (what
# libnbd's tls-certificates= and qemu's endpoint=client read).
cp "$certs/ca-cert.pem" "$certs/server-cert.pem" "$certs/server-key.pem" "$work/server/"
cp "$certs/ca-cert.pem" "$certs/client-cert.pem" "$certs/client-key.pem" "$work/client/"
cp "$certs/ca-cert.pem" "$work/rogue/"
cp "$certs/rogue-cert.pem" "$work/rogue/client-cert.pem"
cp "$certs/rogue-key.pem" "$work/rogue/client-key.pem"
psk=$work/psk/keys.psk
printf 'alice:%s\n' "$(openssl rand -hex 32)" >"$psk"
printf 'alice:%s\n' "$(openssl rand -hex 32)" >"$work/wrongpsk/keys.psk"
printf 'mallory:%s\n' "$(openssl rand -hex 32)" >"$work/wrongpsk/unknown.psk"

start() { # start ARGS...: serves $data with ARGS; sets $port to its TCP port
  # Emptied here, not only by the redirection (which the background child does later): the
  # previous server's log says "serving" too.
  : >"$work/server.log"
  "$bin" serve --dir "$data" --leaf-size 1G --volume-size 64M --sparse --cores 1 "$@" \
    >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do
    if grep -q "sluice: serving" "$work/server.log" 2>/dev/null; then
      port=$(sed -n 's/.*tcp:[0-9.]*:\([0-9]*\).*/\1/p' "$work/server.log" | head -1)
      [ -n "$port" ] || { cat "$work/server.log"; fail "no TCP port in the server log"; }
      return
    fi
    kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; fail "server exited at start"; }
    sleep 0.1
  done
  cat "$work/server.log"; fail "server did not start"
}
stop() {
  kill -TERM "$server"
  wait "$server" || fail "server exited with $? after SIGTERM"
  server=""
}
tls_args=(--tls-certificates "$work/server" --tls-psk "$psk")
psk_uri() { echo "nbds://${2:-alice}@127.0.0.1:$port/$1?tls-psk-file=${3:-$psk}"; }
x509_uri() { echo "nbds://127.0.0.1:$port/$1?tls-certificates=${2:-$work/client}"; }
# qemu-img/qemu-io options for an export over TLS: PSK (identity alice) or x509.
qemu_psk() { echo "--object tls-creds-psk,id=tls0,endpoint=client,dir=$work/psk,username=alice --image-opts driver=nbd,host=127.0.0.1,port=$port,export=$1,tls-creds=tls0"; }
qemu_x509() { echo "--object tls-creds-x509,id=tls0,endpoint=client,dir=$work/client --image-opts driver=nbd,host=127.0.0.1,port=$port,export=$1,tls-creds=tls0"; }
refused() { # refused WHAT COMMAND...: the command must fail, and not by hanging
  local what=$1 rc=0
  shift
  timeout 60 "$@" >"$work/out.txt" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || { cat "$work/out.txt"; fail "$what was not refused"; }
  [ "$rc" -ne 124 ] || fail "$what hung"
}

step "bad configurations are refused before the pool is touched"
config_error() { # config_error PATTERN ARGS...: serve must exit non-zero saying PATTERN
  local pattern=$1
  shift
  if timeout 20 "$bin" serve --dir "$work/never" --listen 127.0.0.1:0 "$@" >"$work/err.txt" 2>&1; then
    fail "serve $* started"
  fi
  grep -q -- "$pattern" "$work/err.txt" || fail "serve $*: the error does not say '$pattern': $(cat "$work/err.txt")"
  [ ! -e "$work/never/leg0.img" ] || fail "serve $* created a pool before refusing"
}
config_error "needs credentials" --tls require
config_error "without --tls" --tls-psk "$psk"
config_error "--tls off with" --tls off --tls-psk "$psk"
printf 'alice:0g\n' >"$work/bad.psk"
config_error "bad.psk line 1" --tls require --tls-psk "$work/bad.psk"
printf 'alice:00\nalice:11\n' >"$work/dup.psk"
config_error "already given on line 1" --tls require --tls-psk "$work/dup.psk"
mkdir -p "$work/nokey" && cp "$certs/server-cert.pem" "$work/nokey/"
config_error "server-key.pem is missing" --tls require --tls-certificates "$work/nokey"
config_error "needs --tls require" --tls on --tls-psk "$psk" --tls-allow vol0=alice

start --listen 127.0.0.1:0 --tls require "${tls_args[@]}"
grep -q "TLS required" "$work/server.log" || fail "the server log does not say TLS is required"

step "1. nbdinfo with a pre-shared key"
nbdinfo "$(psk_uri vol0)" >"$work/info.txt" || fail "nbdinfo with PSK"
grep -q "with TLS" "$work/info.txt" || fail "nbdinfo with PSK did not use TLS: $(cat "$work/info.txt")"
grep -q 'export="vol0"' "$work/info.txt" || fail "nbdinfo with PSK did not see vol0"

step "2. nbdinfo with x509 certificates"
nbdinfo "$(x509_uri vol0)" >"$work/info.txt" || fail "nbdinfo with x509"
grep -q "with TLS" "$work/info.txt" || fail "nbdinfo with x509 did not use TLS"

step "3. qemu-img and qemu-io with PSK and x509, data round trip"
# shellcheck disable=SC2046 # the option strings hold no spaces inside an option
qemu-img info $(qemu_psk vol0) | grep -q "virtual size: 64 MiB" || fail "qemu-img info with PSK"
# shellcheck disable=SC2046
qemu-img info $(qemu_x509 vol0) | grep -q "virtual size: 64 MiB" || fail "qemu-img info with x509"
# shellcheck disable=SC2046
qemu-io $(qemu_psk vol0) -c 'write -P 0x5a 0 1M' -c 'write -P 0x3c 3M 64k' >/dev/null \
  || fail "qemu-io write over TLS (PSK)"
# shellcheck disable=SC2046
qemu-io $(qemu_x509 vol0) -c 'read -P 0x5a 0 1M' -c 'read -P 0x3c 3M 64k' -c 'read -P 0 1M 2M' \
  >"$work/io.txt" || fail "qemu-io read over TLS (x509)"
grep -q "Pattern verification failed" "$work/io.txt" && fail "data read over TLS differs: $(cat "$work/io.txt")"

step "4. plain-text clients are refused under --tls require"
refused "plain nbdinfo" nbdinfo "nbd://127.0.0.1:$port/vol0"
refused "plain nbdinfo --list" nbdinfo --list "nbd://127.0.0.1:$port/"
refused "plain qemu-img" qemu-img info "nbd://127.0.0.1:$port/vol0"
sock=$data/nbd.sock
refused "plain nbdinfo on the Unix socket" nbdinfo "nbd+unix:///vol0?socket=$sock"

step "5. a wrong key and an unknown identity are refused"
refused "a wrong PSK key" nbdinfo "$(psk_uri vol0 alice "$work/wrongpsk/keys.psk")"
refused "an unknown PSK identity" nbdinfo "$(psk_uri vol0 mallory "$work/wrongpsk/unknown.psk")"
grep -q "TLS handshake" "$work/server.log" || fail "failed handshakes are not logged"

step "6. a raw client: options before STARTTLS get NBD_REP_ERR_TLS_REQD and nothing else"
/usr/bin/python3 - "$port" <<'EOF' || fail "raw client before STARTTLS"
import socket, struct, sys
port = int(sys.argv[1])
OPTS, REP = 0x49484156454F5054, 0x0003E889045565A9
TLS_REQD, ACK, INVALID = (1 << 31) + 5, 1, (1 << 31) + 3
GO, LIST, ABORT, STARTTLS, EXPORT_NAME = 7, 3, 2, 5, 1

def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    hello = recv(s, 18)
    magic, opts, flags = struct.unpack(">QQH", hello)
    assert magic == 0x4E42444D41474943 and opts == OPTS and flags & 1, hello
    s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
    return s

def recv(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise SystemExit(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return out

def option(s, opt, data=b""):
    s.sendall(struct.pack(">QII", OPTS, opt, len(data)) + data)

def reply(s):
    magic, opt, kind, length = struct.unpack(">QIII", recv(s, 20))
    assert magic == REP, hex(magic)
    return opt, kind, recv(s, length)

def nothing_more(s, what):
    s.settimeout(0.5)
    try:
        extra = s.recv(4096)
    except socket.timeout:
        extra = None
    s.settimeout(5)
    assert extra is None, f"after {what} the server sent more: {extra!r}"

s = connect()
name = b"vol0"
option(s, GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
opt, kind, data = reply(s)
assert (opt, kind) == (GO, TLS_REQD), (opt, hex(kind), data)
nothing_more(s, "GO's TLS_REQD")
option(s, LIST)
opt, kind, data = reply(s)
assert (opt, kind) == (LIST, TLS_REQD), (opt, hex(kind), data)
nothing_more(s, "LIST's TLS_REQD")
# STARTTLS with data is malformed: refused, and the session goes on in plain text.
option(s, STARTTLS, b"x")
opt, kind, _ = reply(s)
assert (opt, kind) == (STARTTLS, INVALID), (opt, hex(kind))
option(s, ABORT)
opt, kind, _ = reply(s)
assert (opt, kind) == (ABORT, ACK), (opt, hex(kind))
s.close()

# EXPORT_NAME cannot be refused with a reply: the server closes without a byte.
s = connect()
option(s, EXPORT_NAME, b"vol0")
s.settimeout(5)
assert s.recv(4096) == b"", "EXPORT_NAME before STARTTLS got an answer"
s.close()

# Bytes sent behind STARTTLS, before its reply, were sent in plain text where TLS was asked
# for: the server acknowledges STARTTLS (it has read it) and then closes. (One send, so they
# arrive with the option.)
s = connect()
s.sendall(struct.pack(">QII", OPTS, STARTTLS, 0) + b"not a TLS hello")
try:
    opt, kind, _ = reply(s)
    assert (opt, kind) == (STARTTLS, ACK), (opt, hex(kind))
    s.settimeout(5)
    while s.recv(4096):
        pass
except (ConnectionResetError, SystemExit):
    pass
s.close()
EOF
stop

step "7. the allow-list: vol0 only for client1"
start --listen 127.0.0.1:0 --tls require "${tls_args[@]}" --tls-allow vol0=client1
"$bin" vol create sluice/vol1 --size 16M >/dev/null || fail "vol create on a TLS server"
nbdinfo "$(x509_uri vol0)" >/dev/null || fail "client1's certificate does not open vol0"
refused "PSK alice opening vol0" nbdinfo "$(psk_uri vol0)"
nbdinfo "$(psk_uri vol1)" >/dev/null || fail "PSK alice cannot open vol1 (no allow-list entry)"
nbdinfo --list "$(psk_uri '')" >"$work/list.txt" || fail "nbdinfo --list for alice"
grep -q 'export="vol1"' "$work/list.txt" || fail "alice's LIST lacks vol1"
grep -q 'export="vol0"' "$work/list.txt" && fail "alice's LIST shows vol0, which she may not open"
# The refusal is NBD_REP_ERR_POLICY, with a message saying why (libnbd logs it as debug).
/usr/bin/python3 - "$(psk_uri vol0)" <<'EOF' || fail "alice's refusal for vol0"
import sys, nbd
messages = []
h = nbd.NBD()
h.set_debug_callback(lambda context, message: messages.append(message))
h.set_debug(True)
h.set_uri_allow_local_file(True)
try:
    h.connect_uri(sys.argv[1])
    raise SystemExit("alice opened vol0")
except nbd.Error as e:
    assert "policy" in str(e), f"not NBD_REP_ERR_POLICY: {e}"
said = [m for m in messages if "server error message" in m]
assert any('export "vol0" is open only' in m and "--tls-allow" in m and '"alice"' in m
           for m in said), said
EOF
# shellcheck disable=SC2046
qemu-io $(qemu_x509 vol0) -c 'read -P 0x5a 0 1M' >/dev/null || fail "qemu-io as client1 on vol0"
stop

step "7b. --tls-verify-peer: x509 clients need a certificate, PSK clients do not"
start --listen 127.0.0.1:0 --tls require "${tls_args[@]}" --tls-verify-peer
mkdir -p "$work/anon" && cp "$certs/ca-cert.pem" "$work/anon/"
refused "an x509 client without a certificate" nbdinfo "$(x509_uri vol0 "$work/anon")"
# GnuTLS offers only a certificate whose issuer the server named, so this one arrives as no
# certificate at all: refused either way.
refused "a certificate from another CA" nbdinfo "$(x509_uri vol0 "$work/rogue")"
nbdinfo "$(x509_uri vol0)" >/dev/null || fail "client1 under --tls-verify-peer"
nbdinfo "$(psk_uri vol0)" >/dev/null || fail "PSK under --tls-verify-peer"
stop

step "8. --tls on: plain and TLS clients both served"
start --listen 127.0.0.1:0 --tls on "${tls_args[@]}"
nbdinfo "nbd://127.0.0.1:$port/vol0" | grep -q "without TLS" || fail "plain client under --tls on"
nbdinfo "$(psk_uri vol0)" | grep -q "with TLS" || fail "PSK client under --tls on"
nbdinfo "$(x509_uri vol0)" | grep -q "with TLS" || fail "x509 client under --tls on"
stop

step "9. a non-loopback listener needs --tls said"
if timeout 20 "$bin" serve --dir "$data" --listen 0.0.0.0:0 >"$work/err.txt" 2>&1; then
  fail "serving on 0.0.0.0 without --tls started"
fi
grep -q "not a loopback address" "$work/err.txt" || fail "the refusal does not say why: $(cat "$work/err.txt")"
grep -q -- "--tls require" "$work/err.txt" || fail "the refusal does not name --tls require"
grep -q -- "--tls off" "$work/err.txt" || fail "the refusal does not name --tls off"
start --listen 0.0.0.0:0 --tls off
grep -q "TLS off" "$work/server.log" || fail "the log does not say TLS is off"
nbdinfo "nbd://127.0.0.1:$port/vol0" >/dev/null || fail "plain client with --tls off on 0.0.0.0"
stop

step "passed"
