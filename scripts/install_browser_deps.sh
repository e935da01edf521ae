#!/usr/bin/env bash
# Idempotent: Debian's chromium for the browser tests. Playwright launches /usr/bin/chromium directly
# (executable_path), so `playwright install` and its downloads are never needed (STACK.md "Browser").
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "installing Debian chromium for the browser tests…"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
test -x /usr/bin/chromium
