#!/usr/bin/env bash
# The churn benchmark (issue 20): a local swarm of 8 workers and 2 shards trains the MNIST
# MLP without churn, then while workers are killed or frozen every 30-60 s (seeded) and a
# shard is killed once; reports accuracy, stalls, missed rounds, shard memory and samples per
# epoch (scripts/lib/churn.py). Over 10 minutes a run on 2 cores with the defaults.
# Usage: scripts/churn.sh [--epochs N] [--every-min S --every-max S] [--seed N] ...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-gpu.sh >/dev/null
scripts/fetch-data.sh mnist
cargo build --release --quiet
exec python3 scripts/lib/churn.py "$@"
