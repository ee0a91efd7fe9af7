#!/usr/bin/env bash
# Installs what the network tests build their namespaces with, where missing: iproute2 (`ip`:
# namespaces, veth pairs, routes), nftables (`nft`: the NATs of the NAT-traversal tests) and
# procps (`sysctl`: forwarding in a router namespace). Linux only. Exits 1 when something is
# missing and cannot be installed.
set -euo pipefail

say() { printf 'ensure-net-tools: %s\n' "$*" >&2; }
# shellcheck source=lib/apt.sh
. "$(dirname "$0")/lib/apt.sh"

[ "$(uname -s)" = Linux ] || exit 0
export PATH="$PATH:/sbin:/usr/sbin"

missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
command -v sysctl >/dev/null || missing+=(procps)
[ ${#missing[@]} -eq 0 ] && exit 0

say "installing ${missing[*]}"
apt_install "${missing[@]}" || exit 1
command -v ip >/dev/null && command -v nft >/dev/null && command -v sysctl >/dev/null || {
    say "${missing[*]} installed, but ip, nft or sysctl is still missing"
    exit 1
}
