#!/usr/bin/env bash
# Makes sure wgpu will find a GPU adapter. Where no Vulkan driver is installed on Linux,
# installs Mesa's software Vulkan driver (lavapipe) with apt-get when it can (root, or
# passwordless sudo). Metal (macOS) and DX12 (Windows) need nothing.
set -euo pipefail

say() { printf 'ensure-gpu: %s\n' "$*" >&2; }
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

[ "$(uname -s)" = Linux ] || exit 0

has_vulkan() {
    # ldconfig lives in /sbin, which is not on an ordinary user's PATH on Debian. grep reads
    # the whole list (no -q): with pipefail, `grep -q` stopping at the first match can kill
    # ldconfig with SIGPIPE and fail the pipeline, which made this check flaky.
    PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1' >/dev/null || return 1
    local d f dirs=(/usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d)
    # The loader's override variables hold colon-separated lists of driver manifests.
    local -a listed=()
    IFS=: read -ra listed <<< "${VK_DRIVER_FILES:-}:${VK_ICD_FILENAMES:-}"
    for f in "${listed[@]}"; do
        [ -n "$f" ] && dirs+=("$(dirname "$f")")
    done
    for d in "${dirs[@]}"; do
        ls "$d"/*.json >/dev/null 2>&1 && return 0
    done
    return 1
}

if has_vulkan; then
    exit 0
fi

say "no Vulkan driver found: installing Mesa's lavapipe (mesa-vulkan-drivers)"
if ! apt_install mesa-vulkan-drivers libvulkan1; then
    say "install your GPU's Vulkan driver, or Mesa's lavapipe: sudo apt-get install mesa-vulkan-drivers"
    exit 1
fi
has_vulkan || { say "mesa-vulkan-drivers installed but no Vulkan driver is visible"; exit 1; }
say "lavapipe installed"
