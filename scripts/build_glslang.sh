#!/usr/bin/env bash
# Builds glslang 15 (the GL_NV_cooperative_matrix2 shader compiler) from Debian 13's ("trixie") source package
# into ${XDG_CACHE_HOME:-~/.cache}/lmtune/glslang-15, where cmake/kernels.cmake finds it. Debian 12's glslang
# 12 knows only GL_NV_cooperative_matrix. The system's apt configuration is left as it is: the source package is
# fetched through a private sources list and state directory. About 2 CPU-minutes; does nothing when the cache
# already holds it. Prints the compiler's path.
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}/lmtune/glslang-15
if [ -x "$cache/bin/glslang" ] && "$cache/bin/glslang" --version 2>/dev/null | grep -qE 'Glslang Version: [0-9]+:1[5-9]\.'; then
  echo "$cache/bin/glslang"
  exit 0
fi
command -v cmake >/dev/null || { echo "build_glslang.sh: cmake is needed (scripts/setup.sh installs it)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/src"
# The same mirror as the system's own Debian sources (deb.debian.org where none is found).
mirror=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null |
         grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -1 || true)
echo "deb-src ${mirror:-http://deb.debian.org/debian} trixie main" > "$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root -qq)
apt-get "${apt_opts[@]}" update >&2
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only glslang >&2)
tar xzf "$work"/src/glslang_*.orig.tar.gz -C "$work/src"
srcdir=$(find "$work/src" -maxdepth 1 -mindepth 1 -type d -name 'glslang*' | head -1)
cmake -S "$srcdir" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DENABLE_OPT=OFF -DGLSLANG_TESTS=OFF \
  -DBUILD_EXTERNAL=OFF -DENABLE_HLSL=OFF > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" -j"$(nproc)" --target glslang-standalone > "$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache/bin.tmp"
cp "$work/build/StandAlone/glslang" "$cache/bin.tmp/glslang"
rm -rf "$cache/bin" && mv "$cache/bin.tmp" "$cache/bin"
"$cache/bin/glslang" --version | head -1 >&2
echo "$cache/bin/glslang"
