#!/usr/bin/env bash
# One MNIST epoch of the default MLP (784-512-256-10, AdamW, batch 128) in murmur on its
# default device beside PyTorch on the CPU, with the same number of threads, in one run on
# this machine: the reference for murmur's CPU path (docs/benchmarks.md).
# PyTorch comes from pip into target/pytorch-venv (a few GB: the wheel pulls its CUDA
# libraries even when only the CPU is used).
# Usage: scripts/pytorch-mlp.sh [EPOCHS] (default 3; the mean epoch time is compared)
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=${1:-3}
threads=$(nproc)
venv=target/pytorch-venv
if ! "$venv/bin/python" -c 'import torch, numpy' 2>/dev/null; then
  echo "pytorch-mlp: installing PyTorch into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch numpy
fi
scripts/ensure-gpu.sh
scripts/fetch-data.sh mnist
cargo build --release --quiet
export RAYON_NUM_THREADS=$threads
murmur_json=$(target/release/murmur train --model mlp --epochs "$epochs" --quiet | tail -n 1)
torch_json=$("$venv/bin/python" scripts/lib/pytorch_mlp.py data/mnist "$epochs" "$threads")
python3 - "$murmur_json" "$torch_json" <<'PY'
import json, sys
m, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
mean = lambda v: sum(v) / len(v)
ms, ts = mean(m["epoch_seconds"]), mean(t["epoch_seconds"])
print(f"machine: {m['machine']}, {t['threads']} threads")
print(f"murmur ({m['device']}): {ms:.2f} s per epoch, test accuracy {100 * m['final_test_accuracy']:.2f}%")
print(f"PyTorch {t['torch']} (cpu): {ts:.2f} s per epoch, test accuracy {100 * t['test_accuracy']:.2f}%")
print(f"murmur / PyTorch time: {ms / ts:.2f}")
PY
