#!/usr/bin/env bash
# Checks that what lmtune writes loads in the Python ecosystem (run where torch, transformers and peft are
# installed, e.g. the GPU machine): a LoRA adapter trained by lmtune loads with peft, a merged model with
# transformers, and greedy generation there gives the same tokens as lmtune's.
#   bench/interop_check.sh LMTUNE_BIN TOKENIZER_DIR OUT_DIR
set -euo pipefail
L=$1; TOK=$2; OUT=$3
work=$(mktemp -d); mkdir -p "$OUT"
src=$(cd "$(dirname "$0")/.." && pwd)
"$L" --device cpu init --config "$src/configs/presets/tiny-qwen3.yaml" --tokenizer "$TOK" --out "$work/base" --dtype f32 --seed 7 >/dev/null
python3 - "$work/data.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(64):
        f.write(json.dumps({"prompt": f"Count: {i}", "completion": f" {i + 1} {i + 2} {i + 3}"}) + "\n")
PY
cat > "$work/r.yaml" <<YAML
base: $src/configs/lora.yaml
model: $work/base
device: cpu
precision: fp32
data: {train: $work/data.jsonl, max_seq_len: 64}
lora: {rank: 4, alpha: 8, dropout: 0.0, targets: [all-linear]}
optimizer: {lr: 1.0e-2}
train: {batch_size: 8, steps: 20, grad_checkpointing: false}
schedule: {name: constant, warmup_steps: 0}
eval: {every: 0}
save: {every: 0, dir: $work/run}
YAML
"$L" train "$work/r.yaml" --log-every 10 2>&1 | tail -2
"$L" --device cpu export --model "$work/base" --adapter "$work/run/adapter" --out "$work/merged" --merge 2>&1 | tail -1
prompt="Count: 5"
"$L" --device cpu generate --model "$work/base" --adapter "$work/run/adapter" --prompt "$prompt" --max-tokens 12 --json > "$work/lm_adapter.json"
"$L" --device cpu generate --model "$work/merged" --prompt "$prompt" --max-tokens 12 --json > "$work/lm_merged.json"
python3 - "$work" "$prompt" <<'PY' | tee "$OUT/interop.txt"
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel
work, prompt = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(f"{work}/base")
ids = tok(prompt, return_tensors="pt").input_ids
def greedy(model):
    out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()
base = AutoModelForCausalLM.from_pretrained(f"{work}/base", torch_dtype=torch.float32)
peft_model = PeftModel.from_pretrained(base, f"{work}/run/adapter")
merged = AutoModelForCausalLM.from_pretrained(f"{work}/merged", torch_dtype=torch.float32)
lm_a = json.load(open(f"{work}/lm_adapter.json"))["ids"]
lm_m = json.load(open(f"{work}/lm_merged.json"))["ids"]
hf_a, hf_m = greedy(peft_model), greedy(merged)
print("prompt ids (HF)      ", ids[0].tolist())
print("lmtune base+adapter  ", lm_a)
print("peft base+adapter    ", hf_a)
print("lmtune merged        ", lm_m)
print("transformers merged  ", hf_m)
n = min(len(lm_a), len(hf_a))
print("adapter match:", lm_a[:n] == hf_a[:n], " merged match:", lm_m[:min(len(lm_m), len(hf_m))] == hf_m[:min(len(lm_m), len(hf_m))])
PY
rm -rf "$work"
