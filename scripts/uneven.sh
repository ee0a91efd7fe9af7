#!/usr/bin/env bash
# A swarm with one slow worker (issue 20): four workers train the MNIST MLP all fast, then
# with one three times slower, with shares by speed and with equal shares, on emulated devices;
# samples per second and accuracy of each (scripts/lib/uneven.py; --help for its options).
# About 4 minutes on 2 cores with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-data.sh mnist
cargo build --release --quiet
exec python3 scripts/lib/uneven.py "$@"
