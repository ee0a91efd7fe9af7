#!/usr/bin/env bash
# murmur's main job, end to end on a fresh machine: sets up a GPU driver (Mesa's lavapipe
# where there is no GPU) and MNIST, builds murmur, and trains the 784-512-256-10 MLP in a
# local swarm: 4 workers and 2 parameter-server shards, separate processes talking QUIC over
# loopback, gradients compressed to their top 1% with error feedback (BytePS-Compress: the
# small layers travel uncompressed). It shows each worker's progress, then prints the final
# test accuracy and the bytes saved against sending f32, and a JSON summary on stdout.
# Extra arguments go to `murmur swarm` (e.g. --epochs 2, --codec sign, --min-compress-bytes 0).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/ensure-gpu.sh
scripts/fetch-data.sh mnist
cargo build --release --quiet
./target/release/murmur info | sed -n '/^device auto/p' >&2
./target/release/murmur swarm --workers 4 --servers 2 --codec topk:0.01 "$@"
