#!/usr/bin/env bash
# Smoke test of the inference commands on a tiny random model: generate (text and --json), chat, eval (--json,
# several adapters), export (PEFT and --merge), and one-line errors with exit status 1 for bad input.
# Usage: cli_smoke.sh LMTUNE_BINARY SOURCE_DIR
set -euo pipefail
L=$1; SRC=$2
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$L" --device cpu init --config "$SRC/configs/presets/tiny-qwen3.yaml" --tokenizer "$SRC/tests/fixtures/npm/qwen3/models" \
  --out "$T/m" --dtype f32 --log-level warn
out=$("$L" --device cpu generate --model "$T/m" --prompt "Hello" --max-tokens 5)
[ -n "$out" ] || fail "generate printed nothing"
"$L" --device cpu generate --model "$T/m" --prompt "Hello" --chat --max-tokens 5 --temperature 0.7 --top-k 5 --seed 1 --json \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d["ids"]) <= 5 and d["decode_tokens_per_s"] > 0 and "peak_memory_bytes" in d, d'
printf 'Hi\n/exit\n' | "$L" --device cpu chat --model "$T/m" --max-tokens 3 > "$T/chat.txt"
[ "$(wc -l < "$T/chat.txt")" -eq 1 ] || fail "chat: expected one reply line"
# An adapter: the PEFT re-export of one written by python (q_proj on both layers).
python3 - "$T" <<'PY'
import json, struct, sys, os, random
d = os.path.join(sys.argv[1], "ad"); os.makedirs(d)
random.seed(0); header = {}; blob = b""
for l in range(2):
    for kind, shape in (("lora_A", (2, 64)), ("lora_B", (128, 2))):
        data = struct.pack("<%df" % (shape[0] * shape[1]), *[random.gauss(0, 0.2) for _ in range(shape[0] * shape[1])])
        header[f"base_model.model.model.layers.{l}.self_attn.q_proj.{kind}.weight"] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
open(os.path.join(d, "adapter_model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + blob)
json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "bias": "none"}, open(os.path.join(d, "adapter_config.json"), "w"))
PY
printf '{"prompt": "2+2=", "completion": " 4"}\n{"prompt": "Hi", "completion": " there"}\n' > "$T/d.jsonl"
"$L" --device cpu eval --model "$T/m" --data "$T/d.jsonl" --adapter "$T/ad" --adapter "$T/ad:0.5" --json --log-level warn > "$T/eval.txt"
python3 - "$T/eval.txt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["name"] for r in rows][0] == "base" and len(rows) == 3, rows
assert all(k in r for r in rows for k in ("loss", "ppl", "tokens", "exact_match", "contains")), rows
assert rows[0]["loss"] != rows[1]["loss"], rows
PY
"$L" --device cpu export --model "$T/m" --adapter "$T/ad" --out "$T/re" --log-level warn
"$L" --device cpu export --model "$T/m" --adapter "$T/re" --merge --out "$T/merged" --log-level warn
"$L" --device cpu eval --model "$T/merged" --data "$T/d.jsonl" --json --no-generate --log-level warn > "$T/merged.txt"
python3 - "$T/eval.txt" "$T/merged.txt" <<'PY'
import json, sys
a = json.loads(open(sys.argv[1]).readlines()[1])  # the adapter at scale 1
b = json.loads(open(sys.argv[2]).readline())
assert abs(a["loss"] - b["loss"]) < 1e-4 * abs(a["loss"]), (a, b)
PY
# Errors: one line, exit status 1, naming the problem.
expect_error() {
  local want=$1; shift
  set +e; msg=$("$@" 2>&1); rc=$?; set -e
  [ $rc -eq 1 ] || fail "expected exit 1 from $*, got $rc"
  echo "$msg" | grep -q -- "$want" || fail "expected '$want' in: $msg"
}
expect_error top_p "$L" --device cpu generate --model "$T/m" --prompt x --top-p 1.5
expect_error temperature "$L" --device cpu generate --model "$T/m" --prompt x --temperature -1
expect_error adapter_config.json "$L" --device cpu generate --model "$T/m" --prompt x --adapter "$T/nothing"
expect_error "cannot open\|not found\|No such" "$L" --device cpu eval --model "$T/m" --data "$T/d.jsonl" --adapter "$T/missing"
echo "cli smoke test passed"
