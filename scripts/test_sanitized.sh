#!/usr/bin/env bash
# Builds lmtune's tests with AddressSanitizer and UndefinedBehaviorSanitizer (LMTUNE_SANITIZE) in build-sanitize/
# and runs them, CPU and Vulkan (lavapipe) alike. Any sanitizer report fails its test: undefined behaviour aborts,
# leaks fail at exit (tests/sanitizers/lsan.supp lists the libraries outside lmtune whose allocations are not its
# leaks). Usage: scripts/test_sanitized.sh [TEST_BINARY...]   e.g. scripts/test_sanitized.sh test_io test_data
# With no names: every target and every ctest entry; with names: only those test binaries are built and run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -f build-sanitize/CMakeCache.txt ]]; then
  # -O1 -g1: line tables for the reports' stack traces; both compile in about half the time of -O3 or full debug
  # information, and the CPU backend's heavy lifting is in OpenBLAS either way. Warnings are the normal build's
  # job (LMTUNE_CMAKE_ARGS is not passed): the sanitizers' instrumentation makes gcc warn about its own code.
  cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g1 -DNDEBUG" \
    -DLMTUNE_SANITIZE=ON
fi
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
if [[ $# -eq 0 ]]; then
  cmake --build build-sanitize -j"$(nproc)"
  cd build-sanitize
  # serve_soak measures the server's RSS, which ASan's quarantine of freed memory inflates by design.
  ctest --output-on-failure -j"$(nproc)" --timeout 1800 -E '^serve_soak$'
else
  cmake --build build-sanitize -j"$(nproc)" --target "$@"
  cd build-sanitize
  ctest --output-on-failure -j"$(nproc)" --timeout 1800 -R "^($(IFS='|'; echo "$*"))\$"
fi
