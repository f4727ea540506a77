#!/usr/bin/env bash
# The offline quickstart. Until the trainer lands (issue: `lmtune train`), it shows the devices lmtune finds
# and benchmarks its ops on the chosen device.
set -euo pipefail
cd "$(dirname "$0")/.."
build/lmtune info
if build/lmtune bench --help >/dev/null 2>&1; then
  build/lmtune bench ops --sizes small
fi
