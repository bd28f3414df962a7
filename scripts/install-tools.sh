#!/usr/bin/env bash
# Installs what the test suite needs beyond the Python venv. Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- infra (issue 2): checkov in its own venv (it pins an old boto3; kept out of .venv) -------------
CHECKOV_VERSION=3.3.30
if ! .tools/checkov/bin/checkov --version 2>/dev/null | grep -qx "$CHECKOV_VERSION"; then
  PY=$(command -v python3.11 || command -v python3)
  "$PY" -m venv .tools/checkov
  .tools/checkov/bin/pip install -q --upgrade pip
  .tools/checkov/bin/pip install -q "checkov==$CHECKOV_VERSION"
fi
# --- end infra ---------------------------------------------------------------------------------------

# --- ansible (issue 4): SSH integration test hosts (debootstrap rootfs, sshd, netns, loop disks) -----
ANSIBLE_TEST_PKGS="debootstrap openssh-server openssh-client iproute2 util-linux e2fsprogs systemd tar"
MISSING=""
for p in $ANSIBLE_TEST_PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || MISSING="$MISSING $p"
done
if [ -n "$MISSING" ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $MISSING
  else
    echo "install-tools: not root, skipping apt packages:$MISSING" >&2
  fi
fi
# --- end ansible -------------------------------------------------------------------------------------
