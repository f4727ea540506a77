#!/usr/bin/env bash
# The server's memory over a soak (issue #31): a tiny random model (byte-level tokenizer) served on the CPU with two
# PEFT adapters takes six rounds of 700 mixed requests (scripts/serve_soak.py: every endpoint, streaming,
# sampling, log-probs, clients hanging up mid-stream, refused requests); every request must get its expected status,
# and the server's RSS after the last round must stay within 10% of every earlier round's and within 25% of the first
# two rounds'. 16 clients, as many as the server's workers, so that every worker thread is busy from the first round
# on. glibc opens a new malloc arena whenever threads contend, so on a loaded machine a slow round can step the RSS
# up by an arena's pages; two arenas keep those steps out of a test that looks for leaks.
# Usage: serve_soak.sh LMTUNE_BINARY SOURCE_DIR
set -euo pipefail
L=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$L" --device cpu init --config "$SRC/configs/presets/tiny-qwen3.yaml" \
  --tokenizer "$SRC/tests/train/fixtures/byte_tokenizer" --out "$T/m" --dtype f32 --log-level warn
python3 "$SRC/scripts/serve_bench.py" --make-adapter "$T/m" "$T/a1" --rank 8 --seed 1 > /dev/null
python3 "$SRC/scripts/serve_bench.py" --make-adapter "$T/m" "$T/a2" --rank 4 --seed 2 > /dev/null
MALLOC_ARENA_MAX=2 python3 "$SRC/scripts/serve_soak.py" --lmtune "$L" --model "$T/m" \
  --adapter "alpha=$T/a1" --adapter "beta=$T/a2" --rounds 6 --requests 700 --concurrency 16
