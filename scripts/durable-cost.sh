#!/usr/bin/env bash
# What durable nodes cost: one shard and two CPU workers on loopback train the MNIST MLP
# (default 784-512-256-10) for 300 rounds, plain, with `murmur server --state`, and with the
# workers' `--state` as well, for an f32 and a top-1% job (both with error feedback on the
# server and the workers, so each saves a 2.1 MB memory every round). Prints the wall time of
# each run, the ratios to the plain run, and the median time the shard took to save a round
# (from its debug log). Needs `cargo build --release` and MNIST (scripts/fetch-data.sh).
# Usage: scripts/durable-cost.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-300}
bin=target/release/murmur
[ -x "$bin" ] || { echo "build first: cargo build --release" >&2; exit 1; }
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
"$bin" swarm init "$dir" >/dev/null
"$bin" swarm issue "$dir" server-0 --role server/0 >/dev/null 2>&1
"$bin" swarm issue "$dir" worker-0 worker-1 --role worker >/dev/null 2>&1

# run CODEC SERVER_STATE WORKER_STATE (each yes or no): prints the seconds the workers took.
run() {
  local codec=$1 server_state=() w0_state=() w1_state=()
  rm -rf "$dir/state" "$dir"/w?.state
  [ "$2" = yes ] && server_state=(--state "$dir/state")
  [ "$3" = yes ] && w0_state=(--state "$dir/w0.state") && w1_state=(--state "$dir/w1.state")
  RUST_LOG=murmur_net=debug "$bin" server --listen 127.0.0.1:0 --swarm "$dir" --node server-0 \
    --workers 2 --codec "$codec" --pull-codec "$codec" --server-memory ef --memory ef \
    --max-steps "$rounds" "${server_state[@]}" >"$dir/server.out" 2>"$dir/server.err" &
  local server=$!
  while [ ! -s "$dir/server.out" ]; do sleep 0.1; done
  local addr
  addr=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['addr'])" "$dir/server.out")
  local start end
  start=$(date +%s.%N)
  "$bin" worker --connect "$addr" --swarm "$dir" --node worker-0 --device cpu "${w0_state[@]}" \
    >"$dir/w0.out" 2>&1 &
  local w0=$!
  "$bin" worker --connect "$addr" --swarm "$dir" --node worker-1 --device cpu "${w1_state[@]}" \
    >"$dir/w1.out" 2>&1
  wait "$w0"
  end=$(date +%s.%N)
  kill "$server"; wait "$server" 2>/dev/null || true
  python3 -c "print(f'{$end - $start:.2f}')"
}

median_save_ms() {
  grep -o 'saved in [0-9.]*[mµ]s' "$dir/server.err" | python3 -c '
import statistics, sys
ms = [float(l.split()[2][:-2]) / (1000 if l.strip().endswith("µs") else 1) for l in sys.stdin]
print(f"{statistics.median(ms):.2f}" if ms else "?")'
}

echo "codec      rounds  plain     shard --state  (ratio)  median save  + workers --state  (ratio)"
for codec in f32 topk:0.01; do
  for _ in 1 2; do
    plain=$(run "$codec" no no)
    shard=$(run "$codec" yes no)
    save=$(median_save_ms)
    both=$(run "$codec" yes yes)
    ratio() { python3 -c "print(f'{$1 / $plain:.2f}')"; }
    printf '%-10s %6s  %6s s  %10s s  (%s)  %8s ms  %14s s  (%s)\n' "$codec" "$rounds" "$plain" \
      "$shard" "$(ratio "$shard")" "$save" "$both" "$(ratio "$both")"
  done
done
