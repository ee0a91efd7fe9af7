# Sourced by the ensure-* scripts: installs Debian packages with apt-get as root (directly,
# or through passwordless sudo). `apt_install PKG...` returns 1 with a message when it cannot.

apt_install() {
    local -a as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            as_root=(sudo -n)
        else
            say "no root access to install $*: install them with your package manager"
            return 1
        fi
    fi
    command -v apt-get >/dev/null || { say "no apt-get: install $* with your package manager"; return 1; }
    export DEBIAN_FRONTEND=noninteractive
    # Try the cached package lists first; refresh them only when that fails.
    if ! "${as_root[@]}" apt-get install -y -qq "$@" >/dev/null 2>&1; then
        "${as_root[@]}" apt-get update -qq >/dev/null
        "${as_root[@]}" apt-get install -y -qq "$@" >/dev/null
    fi
    # New shared libraries: refresh the linker cache that the checks read.
    "${as_root[@]}" env PATH="$PATH:/sbin:/usr/sbin" ldconfig 2>/dev/null || true
}
