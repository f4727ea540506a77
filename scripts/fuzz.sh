#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) in build-fuzz/ and runs each for SECONDS
# (default 30) on a copy of its seed corpus (tests/fuzz/corpus/<target>), so the committed seeds stay as they are.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   e.g. scripts/fuzz.sh 120 gguf recipe
# Fails on the first finding (crash, sanitizer report, uncaught exception, timeout, memory over 2 GB); the input is
# left in build-fuzz/findings/<target>/. Each run's last status line goes to build-fuzz/fuzz-<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=30
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then seconds=$1; shift; fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for f in tests/fuzz/fuzz_*.cpp; do t=$(basename "$f" .cpp); targets+=("${t#fuzz_}"); done
fi

if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  cmake -S . -B build-fuzz -DLMTUNE_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
fi
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"

for t in "${targets[@]}"; do
  work=build-fuzz/corpus/$t findings=build-fuzz/findings/$t
  rm -rf "$work" && mkdir -p "$work" "$findings"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  echo "== fuzz_$t: ${seconds}s on $(ls "$work" | wc -l) seeds"
  if ! build-fuzz/fuzz/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="$findings"/ -print_final_stats=1 "$work" > build-fuzz/fuzz-"$t".log 2>&1; then
    tail -n 60 build-fuzz/fuzz-"$t".log
    echo "fuzz_$t: FINDING (input in $findings/)" >&2
    exit 1
  fi
  grep -E '^#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb' build-fuzz/fuzz-"$t".log || true
  echo "   corpus: $(ls "$work" | wc -l) inputs"
done
