#!/usr/bin/env bash
# Installs what the test suite needs beyond the Python venv. Idempotent: a second run does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
