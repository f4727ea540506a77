#!/usr/bin/env bash
# GGUF output end to end: tiny random models (llama with Llama 3 rope and byte-level BPE; gemma2 with SentencePiece)
# get a PEFT adapter on q/k/v (so the llama q/k permutation matters), then
#  - `export --merge --format gguf` must give what the merged HF export gives: the same token ids over the corpus,
#    the same eval loss and (f16, against the f16 HF export: random tiny models have near-tied logits that
#    rounding flips) the same greedy tokens, and the same tensors and keys as the independent
#    reference converter tests/scripts/hf_to_gguf.py writes from the merged HF directory (also for q8_0);
#  - `export --format gguf` (no --merge) must equal the reference's convert_lora_to_gguf.py form of the adapter;
#  - each writes a Modelfile; bad input is a one-line error with exit status 1;
#  - q8_0 / q4_k: a tiny model trained to recite a sentence continues prompts with the source's greedy tokens.
# Usage: gguf_export.sh LMTUNE_BINARY SOURCE_DIR [f16|q8_0|q4_k]
#   q8_0 / q4_k run the exported model with quantized Linear weights: they need the engine's quantized products.
set -euo pipefail
L=$1; SRC=$2; KIND=${3:-f16}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
PY=$SRC/tests/scripts
printf '{"prompt": "2+2=", "completion": " 4"}\n{"prompt": "Hello there, how", "completion": " are you doing"}\n' \
  > "$T/d.jsonl"
adapter() {  # MODEL_DIR OUT_DIR [B_STDDEV]: rank 2, alpha 4, random A and B (default stddev 0.3) on q/k/v
  python3 - "$1" "$2" "${3:-0.3}" <<'PY'
import json, os, random, struct, sys
cfg = json.load(open(os.path.join(sys.argv[1], "config.json"))); d = sys.argv[2]; os.makedirs(d)
hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
outs = {"q_proj": cfg["num_attention_heads"] * hd, "k_proj": cfg["num_key_value_heads"] * hd,
        "v_proj": cfg["num_key_value_heads"] * hd}
random.seed(1); header = {}; blob = b""
for l in range(cfg["num_hidden_layers"]):
    for mod, out in outs.items():
        for kind, shape in (("lora_A", (2, cfg["hidden_size"])), ("lora_B", (out, 2))):
            sd = 0.3 if kind == "lora_A" else float(sys.argv[3])
            v = [random.gauss(0, sd) for _ in range(shape[0] * shape[1])]
            data = struct.pack("<%df" % len(v), *v)
            header[f"base_model.model.model.layers.{l}.self_attn.{mod}.{kind}.weight"] = {
                "dtype": "F32", "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
            blob += data
h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
open(os.path.join(d, "adapter_model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + blob)
json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": list(outs), "bias": "none"},
          open(os.path.join(d, "adapter_config.json"), "w"))
PY
}
run_model() {  # MODEL OUT_PREFIX
  "$L" tokenize --tokenizer "$1" --jsonl "$SRC/tests/tokenizer/corpus.jsonl" --add-special > "$2.tok"
  "$L" --device cpu eval --model "$1" --data "$T/d.jsonl" --json --no-generate --log-level warn > "$2.eval"
  "$L" --device cpu generate --model "$1" --prompt "Hello world" --max-tokens 8 --json --log-level warn \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])' > "$2.gen"
}
check() {  # preset tokenizer-fixture arch reference-types
  local name=$1 tok=$2 arch=$3 refs=$4 m="$T/$1"
  "$L" --device cpu init --config "$SRC/configs/presets/$name.yaml" \
    --tokenizer "$SRC/tests/fixtures/npm/$tok/models" --out "$m" --dtype f32 --log-level warn
  adapter "$m" "$m.ad"
  "$L" --device cpu export --model "$m" --adapter "$m.ad" --merge --dtype f32 --out "$m.hf" --log-level warn
  "$L" --device cpu export --model "$m" --adapter "$m.ad" --merge --format gguf --quantize "$KIND" \
    --out "$m.out/" --log-level warn
  [ "$(grep -v '^#' "$m.out/Modelfile")" = "FROM ./model.gguf" ] \
    || fail "$name: merged Modelfile: $(cat "$m.out/Modelfile")"
  local run_ref="$m.hf"
  if [ "$KIND" = f16 ]; then
    "$L" --device cpu export --model "$m" --adapter "$m.ad" --merge --dtype f16 --out "$m.hf16" --log-level warn
    run_ref="$m.hf16"
  fi
  run_model "$run_ref" "$m.hf"
  run_model "$m.out/model.gguf" "$m.gguf"
  cmp -s "$m.hf.tok" "$m.gguf.tok" || fail "$name: the exported tokenizer encodes the corpus differently"
  if [ "$KIND" = f16 ]; then
    cmp -s "$m.hf.gen" "$m.gguf.gen" || fail "$name: greedy tokens differ: $(cat "$m.hf.gen") vs $(cat "$m.gguf.gen")"
  fi
  python3 - "$m.hf.eval" "$m.gguf.eval" "$KIND" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
tol = {"f16": 2e-3, "q8_0": 2e-2, "q4_k": 1e-1}[sys.argv[3]]
assert a["tokens"] == b["tokens"], (a, b)
assert abs(a["loss"] - b["loss"]) <= tol * abs(a["loss"]), (a["loss"], b["loss"])
PY
  # The same file as the reference converter's (Q8_0 blocks within ggml's rounding of ties). The pure-python
  # converter needs ~20 s to quantize the llama3 vocabulary's embedding, so only gemma2 checks q8_0 in f16 runs.
  local keys=("tokenizer.ggml.tokens" "tokenizer.ggml.merges" "tokenizer.ggml.scores" "tokenizer.ggml.model"
              "tokenizer.ggml.pre" "tokenizer.ggml.bos_token_id" "tokenizer.chat_template" "$arch.*")
  for q in $refs; do
    [ "$KIND" = f16 ] || [ "$KIND" = "$q" ] || continue
    [ "$q" != q4_k ] || continue  # the reference converter writes f32, f16 and q8_0
    [ "$q" = "$KIND" ] || "$L" --device cpu export --model "$m" --adapter "$m.ad" --merge --format gguf \
      --quantize "$q" --out "$m.out/$q.gguf" --log-level warn
    local ours="$m.out/$q.gguf"; [ "$q" = "$KIND" ] && ours="$m.out/model.gguf"
    python3 "$PY/hf_to_gguf.py" "$m.hf" "$m.ref.gguf" "$q"
    python3 "$PY/gguf_compare.py" "$ours" "$m.ref.gguf" "${keys[@]}" || fail "$name: $q differs from the reference"
  done
  # The adapter alone, as llama.cpp's GGUF LoRA.
  "$L" --device cpu export --model "$m" --adapter "$m.ad" --format gguf --out "$m.lora/a.gguf" --log-level warn
  python3 "$PY/hf_to_gguf.py" --lora "$m" "$m.ad" "$m.lora.ref.gguf"
  python3 "$PY/gguf_compare.py" "$m.lora/a.gguf" "$m.lora.ref.gguf" general.architecture general.type "adapter.*" \
    || fail "$name: the GGUF LoRA differs from the reference"
  grep -qx "FROM $m" "$m.lora/Modelfile" && grep -qx "ADAPTER ./a.gguf" "$m.lora/Modelfile" \
    || fail "$name: adapter Modelfile: $(cat "$m.lora/Modelfile")"
}
check tiny-llama llama3 llama "$KIND"
check tiny-gemma2 llama2 gemma2 "f16 q8_0"
# Greedy tokens of quantized exports. A random tiny model has near-tied logits that quantization flips, so the tiny
# gemma2 first learns to recite a sentence (a full fine-tune of 60 steps); then its q8_0 export must continue
# prompts with exactly the source model's greedy tokens, and q4_k's must agree on at least 16 of 20.
if [ "$KIND" != f16 ]; then
  text="The quick brown fox jumps over the lazy dog while seven wizards quietly box the jumping frogs."
  for _ in 1 2 3 4; do printf '{"text": "%s"}\n' "$text"; done > "$T/recite.jsonl"
  cat > "$T/recite.yaml" <<EOF
model: $T/tiny-gemma2
device: cpu
precision: fp32
finetune: full
data: {train: $T/recite.jsonl, max_seq_len: 64, packing: false}
optimizer: {name: adamw, lr: 1.0e-2}
schedule: {name: constant}
train: {batch_size: 4, steps: 60, grad_checkpointing: false}
eval: {every: 0}
save: {every: 0, dir: $T/recite}
EOF
  "$L" train "$T/recite.yaml" --log-level warn
  adapter "$T/recite/model" "$T/recite.ad" 0  # B = 0: the merged model is the trained one
  "$L" --device cpu export --model "$T/recite/model" --adapter "$T/recite.ad" --merge --format gguf \
    --quantize "$KIND" --out "$T/recite.gguf" --log-level warn
  greedy() {  # MODEL PROMPT
    "$L" --device cpu generate --model "$1" --prompt "$2" --max-tokens 10 --json --log-level warn \
      | python3 -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["ids"])))'
  }
  src="" out=""
  for p in "The quick brown" "seven wizards"; do
    src="$src $(greedy "$T/recite/model" "$p")" out="$out $(greedy "$T/recite.gguf" "$p")"
  done
  python3 - "$KIND" "$src" "$out" <<'PY' || fail "$KIND: greedy tokens of the trained model differ"
import sys
kind, a, b = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
same = sum(x == y for x, y in zip(a, b))
print(f"{kind}: {same} of {len(a)} greedy tokens as the source model's")
assert len(a) == len(b) == 20 and same >= (20 if kind == "q8_0" else 16), (a, b)
PY
fi
# Bad input: one line naming the problem, exit status 1.
if "$L" --device cpu export --model "$T/tiny-llama" --adapter "$T/tiny-llama.ad" --merge --format gguf \
  --quantize q3_k --out "$T/x.gguf" 2> "$T/err.txt"; then fail "--quantize q3_k accepted"; fi
grep -q "q3_k" "$T/err.txt" || fail "the error does not name the value: $(cat "$T/err.txt")"
echo "gguf export ($KIND) ok"
