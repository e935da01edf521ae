#!/usr/bin/env bash
# Install what tests/deploy needs (design §18), only if missing. Idempotent: a second run installs nothing and
# says so.
#   systemd   provides systemd-analyze, which verifies deploy/*.service offline (PID 1 need not be systemd)
# Not root, no apt, or apt failing: prints why and exits 1 — tests/deploy then fails (it never skips), so a
# machine that cannot verify the units says so.
set -euo pipefail

say() { echo "install_deploy_deps: $*"; }

if command -v systemd-analyze >/dev/null 2>&1; then
    say "systemd-analyze present ($(command -v systemd-analyze)), nothing to do"
    exit 0
fi
command -v dpkg-query >/dev/null 2>&1 || { say "not a Debian system and no systemd-analyze; install systemd by hand"; exit 1; }
[ "$(id -u)" -eq 0 ] || { say "not root: cannot install Debian's systemd (for systemd-analyze)"; exit 1; }
command -v apt-get >/dev/null 2>&1 || { say "no apt-get; install systemd by hand"; exit 1; }

export DEBIAN_FRONTEND=noninteractive
apt_install() {
    # Wait for another apt/dpkg run to finish instead of failing on its lock.
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends systemd
}
if ! apt_install; then
    say "install failed; refreshing package lists and retrying once"
    apt-get -o DPkg::Lock::Timeout=600 update || { say "apt-get update failed"; exit 1; }
    apt_install || { say "apt-get install systemd failed"; exit 1; }
fi
command -v systemd-analyze >/dev/null 2>&1 || { say "systemd installed but no systemd-analyze on PATH"; exit 1; }
say "installed: systemd ($(command -v systemd-analyze))"
