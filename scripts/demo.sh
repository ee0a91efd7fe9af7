#!/usr/bin/env bash
# murmur's main job, end to end on a fresh machine: sets up a GPU driver (Mesa's lavapipe
# where there is no GPU) and MNIST, builds murmur, and trains the 784-512-256-10 MLP with
# AdamW for 5 epochs, printing progress, the test accuracy after each epoch and a JSON
# summary. Extra arguments go to `murmur train` (e.g. --epochs 1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/ensure-gpu.sh
scripts/fetch-data.sh mnist
cargo build --release --quiet
./target/release/murmur info | sed -n '/^selected/,/matmul kernel/p' >&2
./target/release/murmur train --model mlp --dataset mnist --epochs 5 "$@"
