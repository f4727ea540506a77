#!/usr/bin/env bash
# Measures lmtune on a GPU machine in one go: the Vulkan test binaries, `lmtune bench ops`, LoRA training
# throughput of a Qwen2.5-0.5B-shaped model (random weights, real shapes and vocabulary) at seq 1024, and
# prefill/decode speed of the same model. Writes logs and JSON into OUT_DIR.
#   bench/gpu_run.sh BIN_DIR TOKENIZER_DIR OUT_DIR [tests|bench|train|generate ...]
# BIN_DIR holds lmtune and the test binaries; TOKENIZER_DIR a tokenizer (e.g. the qwen3 fixture).
set -uo pipefail
BIN=$(cd "$1" && pwd); TOK=$2; OUT=$3; shift 3
STAGES=${*:-tests bench train generate}
mkdir -p "$OUT"
work=$(mktemp -d)
run() { echo "== $*"; "$@"; echo "rc=$?"; }

for stage in $STAGES; do case $stage in
tests)
  for t in test_vulkan test_ops test_autodiff test_models test_infer test_train; do
    [ -x "$BIN/$t" ] || continue
    timeout 300 "$BIN/$t" --gtest_filter='*ulkan*:*evice*:*Parity*:*Kv*' > "$OUT/$t.txt" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/$t.txt" | head -2 | tr '\n' ' ')"
  done ;;
bench)
  timeout 240 "$BIN/lmtune" --device vulkan bench ops > "$OUT/bench_ops.txt" 2>&1; echo "bench ops rc=$?" ;;
train)
  "$BIN/lmtune" init --config "$BIN/qwen2.5-0.5b.yaml" --tokenizer "$TOK" --out "$work/qwen" --dtype bf16 > /dev/null
  python3 - "$work/data.jsonl" <<'PY'
import json, random, sys
random.seed(0)
words = "the of and to in a is that for it as was with be by on not he this are or his from at which but have".split()
with open(sys.argv[1], "w") as f:
    for i in range(400):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(900))}) + "\n")
PY
  for ckpt in true false; do
    timeout 200 "$BIN/lmtune" --device vulkan train "$BIN/bench-lora.yaml" model="$work/qwen" data.train="$work/data.jsonl" \
      train.grad_checkpointing=$ckpt save.dir="$work/run-$ckpt" --log-every 1 > "$OUT/train_ckpt_$ckpt.txt" 2>&1
    echo "train grad_checkpointing=$ckpt rc=$?"; tail -4 "$OUT/train_ckpt_$ckpt.txt"
    cp "$work/run-$ckpt/metrics.jsonl" "$OUT/metrics_ckpt_$ckpt.jsonl" 2>/dev/null
  done ;;
generate)
  [ -d "$work/qwen" ] || "$BIN/lmtune" init --config "$BIN/qwen2.5-0.5b.yaml" --tokenizer "$TOK" --out "$work/qwen" --dtype bf16 > /dev/null
  prompt=$(python3 -c "print(' '.join(['hello world'] * 60))")
  timeout 120 "$BIN/lmtune" --device vulkan generate --model "$work/qwen" --prompt "$prompt" --max-tokens 128 --json \
    > "$OUT/generate.json" 2> "$OUT/generate.err"; echo "generate rc=$?"; head -c 600 "$OUT/generate.json"; echo ;;
esac; done
rm -rf "$work"
