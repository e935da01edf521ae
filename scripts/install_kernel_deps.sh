#!/usr/bin/env bash
# Install the Debian packages that kernel enforcement (design §4) and its tests/benchmark need, only those
# missing. Idempotent: a second run installs nothing and says so. Called by `make test` and `make bench-net`.
#   python3-bpfcc bpfcc-tools   BCC, loads bpf/*.bpf.c (never the unrelated PyPI package "bcc")
#   linux-headers-<arch>        headers BCC compiles against (merged at run time, see nodeagent/enforcement/bccshim.py)
#   iperf3 iproute2 iputils-ping ethtool iptables nftables   traffic, namespaces, qdiscs, the fallback kill-switch
# Not root, no apt, or apt failing: prints why and exits 0 (the net tests then skip and say why), unless
# RN_DEPS_STRICT=1, which makes any of those an error.
set -euo pipefail

strict="${RN_DEPS_STRICT:-0}"
say() { echo "install_kernel_deps: $*"; }
give_up() { say "$*"; if [ "$strict" = 1 ]; then exit 1; fi; exit 0; }

command -v dpkg-query >/dev/null 2>&1 || give_up "not a Debian system (no dpkg-query); nothing installed"
arch="$(dpkg --print-architecture)"
pkgs=(python3-bpfcc bpfcc-tools "linux-headers-${arch}" iperf3 iproute2 iputils-ping ethtool iptables nftables libcap2-bin)

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    say "all present, nothing to do (${pkgs[*]})"
    exit 0
fi
say "missing: ${missing[*]}"
[ "$(id -u)" -eq 0 ] || give_up "not root: cannot install; kernel-enforcement tests will skip"
command -v apt-get >/dev/null 2>&1 || give_up "no apt-get; install by hand: ${missing[*]}"

export DEBIAN_FRONTEND=noninteractive
apt_install() {
    # Wait for another apt/dpkg run to finish instead of failing on its lock.
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}"
}
if ! apt_install; then
    say "install failed; refreshing package lists and retrying once"
    apt-get -o DPkg::Lock::Timeout=600 update || give_up "apt-get update failed"
    apt_install || give_up "apt-get install ${missing[*]} failed"
fi
say "installed: ${missing[*]}"
