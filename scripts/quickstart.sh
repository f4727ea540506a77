#!/usr/bin/env bash
# The offline quickstart (README, command one). With build/lmtune built (scripts/setup.sh does it), it:
#   1. creates a small Llama-style base model with random weights          (lmtune init)
#   2. pre-trains it briefly on the bundled English corpus, full fine-tune  (lmtune train recipes/quickstart-pretrain.yaml)
#   3. LoRA-fine-tunes it on the bundled instruction data                   (lmtune train recipes/quickstart-lora.yaml)
#   4. evaluates base vs adapter on the held-out split, and fails unless the adapter wins (lmtune eval --json)
#   5. exports the adapter (PEFT) and a merged model                       (lmtune export [--merge])
#   6. generates one answer with the adapter                               (lmtune generate)
# Everything lands in out/quickstart/ (removed first, so re-running starts over). About 5-8 minutes on 2 CPU cores.
# Environment: LMTUNE (binary, default build/lmtune), QS_OUT (default out/quickstart), QS_TOKENIZER (a tokenizer
# directory; default: the Llama 2 fixture from scripts/fetch_fixtures.sh), and QS_DEVICE (default auto).
# Extra arguments are passed to both `lmtune train` runs as overrides (e.g. train.steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."

LMTUNE=${LMTUNE:-build/lmtune}
OUT=${QS_OUT:-out/quickstart}
TOKENIZER=${QS_TOKENIZER:-tests/fixtures/npm/llama2/models}
DEVICE=${QS_DEVICE:-auto}
OVERRIDES=("$@")

die() { echo "quickstart: $*" >&2; exit 1; }
[ -x "$LMTUNE" ] || die "$LMTUNE not found: build it first (bash scripts/setup.sh)"
[ -f "$TOKENIZER/tokenizer.json" ] || die "no tokenizer in $TOKENIZER: run scripts/fetch_fixtures.sh (setup.sh does)"
command -v python3 >/dev/null || die "python3 is needed to read the eval results"
for f in datasets/corpus/train.jsonl datasets/instruct/train.jsonl datasets/instruct/valid.jsonl; do
  [ -f "$f" ] || die "missing $f (regenerate: python3 scripts/make_corpus.py; python3 scripts/make_instruct_dataset.py)"
done

T0=$SECONDS
STAGE_T=$SECONDS
STAGE_CPU=0
STAGE_NAME=""
TIMINGS=()
# CPU seconds (user + system) used by finished child processes so far, from the `times` builtin (run in this
# shell, not a subshell, which would count only its own children); sets CPU.
TIMES_FILE=$(mktemp)
trap 'rm -f "$TIMES_FILE"' EXIT
child_cpu() {
  times >"$TIMES_FILE"
  CPU=$(tail -1 "$TIMES_FILE" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /m|s/); s += a[1] * 60 + a[2] } printf "%.0f", s }')
}
stage() {
  end_stage
  STAGE_NAME=$1
  STAGE_T=$SECONDS
  child_cpu
  STAGE_CPU=$CPU
  printf '\n==== [%s] %s\n' "$(date +%H:%M:%S)" "$1"
}
end_stage() {
  if [ -n "$STAGE_NAME" ]; then
    child_cpu
    local dt=$((SECONDS - STAGE_T)) cpu=$((CPU - STAGE_CPU))
    TIMINGS+=("$(printf '%-58s %4ds wall %4ds cpu' "$STAGE_NAME" "$dt" "$cpu")")
    printf -- '---- %s: %ds (%ds cpu)\n' "$STAGE_NAME" "$dt" "$cpu"
    STAGE_NAME=""
  fi
}

rm -rf "$OUT"
mkdir -p "$OUT"
stage "1/6 init: random base model"
"$LMTUNE" init --arch llama --config configs/presets/quickstart.yaml --tokenizer "$TOKENIZER" --out "$OUT/init"

stage "2/6 pre-train: full fine-tune on the corpus"
"$LMTUNE" --device "$DEVICE" train recipes/quickstart-pretrain.yaml model="$OUT/init" save.dir="$OUT/pretrain" --log-every 25 \
  "${OVERRIDES[@]}"
BASE="$OUT/pretrain/model"

stage "3/6 LoRA fine-tune on the instruction data"
"$LMTUNE" --device "$DEVICE" train recipes/quickstart-lora.yaml model="$BASE" save.dir="$OUT/lora" --log-every 25 \
  "${OVERRIDES[@]}"
ADAPTER="$OUT/lora/adapter"

stage "4/6 eval: base vs adapter on datasets/instruct/valid.jsonl"
"$LMTUNE" --device "$DEVICE" eval --model "$BASE" --adapter "$ADAPTER" --data datasets/instruct/valid.jsonl --json \
  --batch-size 16 | tee "$OUT/eval.jsonl"
python3 - "$OUT/eval.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
if len(rows) != 2:
    sys.exit(f"quickstart: expected 2 eval results (base, adapter) in {sys.argv[1]}, got {len(rows)}")
base, lora = rows
print(f"\n{'':10} {'loss':>8} {'ppl':>10} {'exact_match':>12} {'contains':>9}")
for name, r in (("base", base), ("adapter", lora)):
    print(f"{name:10} {r['loss']:8.4f} {r['ppl']:10.3f} {r.get('exact_match', 0):12.3f} {r.get('contains', 0):9.3f}")
problems = []
if not lora["loss"] < base["loss"]:
    problems.append(f"adapter loss {lora['loss']:.4f} is not below the base's {base['loss']:.4f}")
if not lora.get("exact_match", 0) > base.get("exact_match", 0):
    problems.append(f"adapter exact_match {lora.get('exact_match', 0):.3f} is not above the base's "
                    f"{base.get('exact_match', 0):.3f}")
if problems:
    print("\nquickstart FAILED: the adapter does not beat the base model: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
print(f"\nthe adapter wins: loss {base['loss']:.3f} -> {lora['loss']:.3f}, "
      f"exact match {100 * base.get('exact_match', 0):.1f}% -> {100 * lora.get('exact_match', 0):.1f}%")
EOF

stage "5/6 export: PEFT adapter and merged model"
"$LMTUNE" export --model "$BASE" --adapter "$ADAPTER" --out "$OUT/export/adapter"
"$LMTUNE" export --model "$BASE" --adapter "$ADAPTER" --out "$OUT/export/merged" --merge
ls -l "$OUT/export/adapter" "$OUT/export/merged"

stage "6/6 generate: one held-out prompt with the adapter"
PROMPT=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["prompt"])' \
  datasets/instruct/valid.jsonl)
WANT=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["completion"].strip())' \
  datasets/instruct/valid.jsonl)
printf '%s' "$PROMPT"
"$LMTUNE" --device "$DEVICE" generate --model "$BASE" --adapter "$ADAPTER" --prompt "$PROMPT" --max-tokens 8
printf '\n(expected: %s)\n' "$WANT"
end_stage

child_cpu
printf '\n==== quickstart done in %ds (%ds of cpu time)\n' "$((SECONDS - T0))" "$CPU"
printf '  %s\n' "${TIMINGS[@]}"
printf 'outputs in %s: init/ (random base), pretrain/model (pre-trained base), lora/adapter (PEFT adapter),\n' "$OUT"
printf '  eval.jsonl, export/adapter, export/merged (base + adapter merged, loadable by lmtune and transformers)\n'
