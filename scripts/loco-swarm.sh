#!/usr/bin/env bash
# The swarm's LoCo rows of docs/results/loco.md: `murmur swarm` (4 workers, 2 server shards,
# loopback) on Fashion-MNIST with the MLP [256, 128], 128 samples per worker and step, AdamW
# lr 0.001, 6 epochs, every tensor compressed, servers replying with the exact f32 mean (the
# last four arms reply in LoCo codes, as recalibration needs: the calibrated scale and one far
# too large, as it was before the product path calibrated, each left as it is or recalibrated
# every epoch).
# Each arm's outcome (accuracy per epoch, bytes, clipped codes, nonzero error) is written as
# JSON to OUT/<arm>.json, its dashboard to OUT/<arm>.log. About 5 minutes per arm on 2 cores.
# Usage: [ARMS="name ..."] scripts/loco-swarm.sh [OUT] (default: target/loco-swarm; all arms)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/loco-swarm}
mkdir -p "$out"
cargo build --release --quiet
murmur=target/release/murmur
common=(--dataset fashion-mnist --hidden 256 --hidden 128 --lr 0.001 --epochs 6 --workers 4
  --batch 128 --min-compress-bytes 0 --server-memory none --quiet)
arm() {
  local name=$1
  shift
  echo "arm $name: murmur swarm ${common[*]} $*" >&2
  rm -rf "${out:?}/$name"
  "$murmur" swarm "${common[@]}" --dir "$out/$name" "$@" >"$out/$name.json" 2>"$out/$name.log"
}
only=${ARMS:-}
run() { if [[ -z $only || " $only " == *" $1 "* ]]; then arm "$@"; fi; }
run f32 --codec f32 --memory none --pull-codec f32
run naive-4bit --codec loco --memory none --pull-codec f32
run loco --codec loco --memory loco-ema --pull-codec f32
run loco-uncalibrated --codec loco:bits=4:log2s=19 --memory loco-ema --pull-codec f32
run ef-f32-error --codec loco --memory ef --pull-codec f32
run loco-loco-replies --codec loco --memory loco-ema
run loco-recalibrated --codec loco --memory loco-ema --loco-recalibrate-every 1
run loco19-loco-replies --codec loco:bits=4:log2s=19 --memory loco-ema
run loco19-recalibrated --codec loco:bits=4:log2s=19 --memory loco-ema --loco-recalibrate-every 1
for f in "$out"/*.json; do
  echo "$(basename "$f" .json): $(cat "$f")"
done
