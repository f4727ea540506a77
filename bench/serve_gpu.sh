#!/usr/bin/env bash
# Serving throughput on a GPU: a Qwen2.5-0.5B-shaped model (random weights) with three random rank-8 adapters,
# aggregate generated tokens/s at 1, 8 and 32 concurrent greedy requests, mixed adapters vs one adapter vs base.
#   bench/serve_gpu.sh LMTUNE_BIN TOKENIZER_DIR OUT_DIR [DEVICE]
set -uo pipefail
L=$1; TOK=$2; OUT=$3; DEV=${4:-vulkan}
src=$(cd "$(dirname "$0")/.." && pwd); work=$(mktemp -d); mkdir -p "$OUT"
"$L" init --config "$src/configs/presets/qwen2.5-0.5b.yaml" --tokenizer "$TOK" --out "$work/base" --dtype bf16 >/dev/null
for i in 1 2 3; do python3 "$src/scripts/serve_bench.py" --make-adapter "$work/base" "$work/a$i" --rank 8 --seed $i >/dev/null; done
"$L" --device "$DEV" serve --model "$work/base" --adapter alpha="$work/a1" --adapter beta="$work/a2" --adapter gamma="$work/a3" \
  --port 18080 --max-batch 32 --dtype bf16 --compute-dtype bf16 > "$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:18080/health')" 2>/dev/null && break; sleep 1; done
b="python3 $src/scripts/serve_bench.py --url http://127.0.0.1:18080 --max-tokens 64 --requests 2"
{ echo "== mixed (base + 3 adapters)"; $b --models base,alpha,beta,gamma --concurrency 1,8,32
echo "== one adapter"; $b --models alpha --concurrency 32
echo "== base only"; $b --models base --concurrency 32; } 2>&1 | tee "$OUT/serve_bench.txt"
kill $pid; wait $pid 2>/dev/null; rm -rf "$work"
