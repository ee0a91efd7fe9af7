#!/usr/bin/env bash
# Installs what the portability tests use on Linux, where missing: Khronos' validators for
# the translated shaders (spirv-val from spirv-tools, glslangValidator from glslang-tools) and
# Mesa's OpenGL driver with headless EGL, through which the kernel tests run a second time on
# wgpu's GL back end (llvmpipe). Exits 1 when something is missing and cannot be installed.
set -euo pipefail

say() { printf 'ensure-shader-tools: %s\n' "$*" >&2; }
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

[ "$(uname -s)" = Linux ] || exit 0

has_mesa_egl() {
    PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | grep 'libEGL_mesa\.so\.0' >/dev/null
}

missing=()
command -v spirv-val >/dev/null || missing+=(spirv-tools)
command -v glslangValidator >/dev/null || missing+=(glslang-tools)
has_mesa_egl || missing+=(libegl1 libegl-mesa0 libgl1-mesa-dri)
[ ${#missing[@]} -eq 0 ] && exit 0

say "installing ${missing[*]}"
apt_install "${missing[@]}" || exit 1
command -v spirv-val >/dev/null && command -v glslangValidator >/dev/null && has_mesa_egl || {
    say "${missing[*]} installed, but a validator or Mesa's EGL is still missing"
    exit 1
}
