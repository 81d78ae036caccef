# Sourced by the interop scripts that serve pools of their own (replicate.sh, space.sh): starts
# and addresses `sluice serve POOL`. The sourcing script defines $bin, $work, the array
# `servers` (the pids to stop) and fail().

# Serves pool $1 from $work/$1 (control and NBD sockets there, no TCP), once it says so.
serve() {
  "$bin" serve "$1" --dir "$work/$1" --listen none >"$work/$1.log" 2>&1 &
  servers+=($!)
  for _ in $(seq 1 100); do
    if grep -q "sluice: serving" "$work/$1.log" 2>/dev/null; then return; fi
    sleep 0.1
  done
  cat "$work/$1.log"; fail "server of pool $1 did not start"
}

# The NBD URI of export $2 of served pool $1.
export_uri() { echo "nbd+unix:///$2?socket=$work/$1/nbd.sock"; }
