#!/usr/bin/env bash
# GGUF input end to end: tiny random models written by `lmtune init` are converted to GGUF by the independent
# reference converter tests/scripts/hf_to_gguf.py (convert_hf_to_gguf.py's rules, its own GGUF writer), and the GGUF
# must give what the HF directory gives: the same token ids for a corpus (byte-level BPE with the llama3 and qwen2
# pre-tokenizers, SentencePiece rebuilt from scores), the same eval loss (weights, q/k permutation, Gemma's +1 norms,
# llama3 rope factors) and the same greedy tokens, plain and through the chat template.
# Usage: gguf_smoke.sh LMTUNE_BINARY SOURCE_DIR [f32|f16|q8_0]
#   q8_0 loads the matrices into quantized Linear weights (Linear::qweight, the quantized products).
set -euo pipefail
L=$1; SRC=$2; KIND=${3:-f32}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
printf '{"prompt": "2+2=", "completion": " 4"}\n{"prompt": "Hello there, how", "completion": " are you doing"}\n' \
  > "$T/d.jsonl"
check() {  # preset tokenizer-fixture [--chat]
  local name=$1 tok=$2 chat=${3:-}
  "$L" --device cpu init --config "$SRC/configs/presets/$name.yaml" --tokenizer "$SRC/tests/fixtures/npm/$tok/models" \
    --out "$T/$name" --dtype f32 --log-level warn
  python3 "$SRC/tests/scripts/hf_to_gguf.py" "$T/$name" "$T/$name.gguf" "$KIND"
  for m in "$T/$name" "$T/$name.gguf"; do
    "$L" tokenize --tokenizer "$m" --jsonl "$SRC/tests/tokenizer/corpus.jsonl" --add-special > "$m.tok"
    "$L" --device cpu eval --model "$m" --data "$T/d.jsonl" --json --log-level warn > "$m.eval"
    "$L" --device cpu generate --model "$m" --prompt "Hello world" --max-tokens 8 $chat --json --log-level warn \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ids"])' > "$m.gen"
  done
  cmp -s "$T/$name.tok" "$T/$name.gguf.tok" || fail "$name: the GGUF tokenizer encodes the corpus differently"
  # Q8_0's rounding can flip a near-tie among a random tiny model's logits (tiny-gemma2 from its third token), so
  # quantized files are judged by the eval loss, which every position's logits enter.
  if [ "$KIND" != q8_0 ]; then
    cmp -s "$T/$name.gen" "$T/$name.gguf.gen" ||
      fail "$name: greedy tokens differ: $(cat "$T/$name.gen") vs $(cat "$T/$name.gguf.gen")"
  fi
  python3 - "$T/$name.eval" "$T/$name.gguf.eval" "$KIND" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
tol = {"f32": 1e-5, "f16": 2e-3, "q8_0": 2e-2}[sys.argv[3]]
assert a["tokens"] == b["tokens"], (a, b)
assert abs(a["loss"] - b["loss"]) <= tol * abs(a["loss"]), (a["loss"], b["loss"])
PY
}
check tiny-llama llama3
check tiny-qwen3 qwen3 --chat
check tiny-gemma2 llama2
# A directory holding one .gguf is a model too; a broken one is a one-line error and exit status 1.
mkdir "$T/dir" && cp "$T/tiny-llama.gguf" "$T/dir/"
"$L" --device cpu generate --model "$T/dir" --prompt "Hi" --max-tokens 2 > /dev/null || fail "directory with one .gguf"
head -c 1000 "$T/tiny-llama.gguf" > "$T/bad.gguf"
if "$L" --device cpu generate --model "$T/bad.gguf" --prompt "Hi" 2> "$T/err.txt"; then fail "truncated GGUF accepted"; fi
grep -q "bad.gguf" "$T/err.txt" || fail "the error does not name the file: $(cat "$T/err.txt")"
echo "gguf smoke ($KIND) ok"
