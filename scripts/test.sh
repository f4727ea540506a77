#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: every test binary through ctest, on the CPU and on
# Vulkan (Mesa lavapipe on machines without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d build ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${LMTUNE_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 900 "$@"
