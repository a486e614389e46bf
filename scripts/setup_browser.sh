#!/usr/bin/env bash
# Install the headless browser the viewer's test drives: Debian's Chromium and its WebDriver.
# (Selenium itself is a Python test dependency, in the `dev` extra.) Idempotent: does nothing
# when both are already on PATH.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends chromium chromium-driver
echo "browser installed: $(chromium --version), $(chromedriver --version | cut -d' ' -f1-2)"
