#!/usr/bin/env bash
# The server's memory over a soak (issue #31): a tiny random model (byte-level tokenizer) served on the CPU with two
# PEFT adapters takes four rounds of 1,000 mixed requests (scripts/serve_soak.py: every endpoint, streaming,
# sampling, log-probs, clients hanging up mid-stream, refused requests); every request must get its expected status
# and the server's RSS after the last round must stay within 10% of the first two rounds'. 16 clients, as many as
# the server's workers, so that every worker thread (and its malloc arena) is busy from the first round on.
# Usage: serve_soak.sh LMTUNE_BINARY SOURCE_DIR
set -euo pipefail
L=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$L" --device cpu init --config "$SRC/configs/presets/tiny-qwen3.yaml" \
  --tokenizer "$SRC/tests/train/fixtures/byte_tokenizer" --out "$T/m" --dtype f32 --log-level warn
python3 "$SRC/scripts/serve_bench.py" --make-adapter "$T/m" "$T/a1" --rank 8 --seed 1 > /dev/null
python3 "$SRC/scripts/serve_bench.py" --make-adapter "$T/m" "$T/a2" --rank 4 --seed 2 > /dev/null
python3 "$SRC/scripts/serve_soak.py" --lmtune "$L" --model "$T/m" --adapter "alpha=$T/a1" --adapter "beta=$T/a2" \
  --rounds 4 --requests 1000 --concurrency 16 --tolerance 0.10
