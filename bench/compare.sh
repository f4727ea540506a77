#!/usr/bin/env bash
# lmtune vs PyTorch + PEFT on one machine, in one go (docs/benchmarks.md).
#
#   bench/compare.sh [options] MODEL_DIR_OR_PRESET ...
#
# Each MODEL is a model directory (config.json + weights) or a preset name / file from configs/presets (e.g.
# qwen2.5-0.5b, llama-3.2-1b), which `lmtune init` turns into a model with random bf16 weights and the real shapes;
# MODEL@B1,B2,... runs it at those batch sizes instead of --batch. --grid adds the shape grid: qwen2.5-0.5b@8,
# llama-3.2-1b@8, qwen3-1.7b@4, gemma-3-1b@4, llama-3.1-8b@2 (head dims 64, 64, 128, 256, 128).
# Speed (default): for each model, batch and gradient checkpointing on and off, `lmtune bench train` and
# bench/peft_baseline.py with the same arguments (with --compile also under torch.compile); then a table of
# tokens/s, the ratios lmtune / PEFT, peak memory and MFU, and each tool's best batch per model. Parity (--parity): lmtune trains --parity-steps steps from the adapter it writes at initialization
# (--save-init-adapter) on random batches it saves (--save-batches); PEFT trains from that adapter on those
# batches with the same optimizer settings; the script prints both loss curves' max |diff| and relative diff and
# fails beyond the tolerances (below).
#
# Options: --out DIR (JSON and logs; default bench-out), --seq N (2048), --batch N (4), --steps N (10),
#   --warmup N (3), --checkpointing "on off", --peak-tflops X (the GPU's datasheet bf16 dense peak, e.g. 989 for
#   an H100 SXM), --device D (lmtune's --device; default vulkan), --parity, --speed (with --parity: both),
#   --parity-steps N (100), --parity-seq N (512), --parity-batch N (4), --parity-lr X (2e-4), --grid, --compile.
# Environment: LMTUNE (the binary; default build/lmtune, else lmtune on PATH), PYTHON (python3),
#   TOKENIZER (a tokenizer directory for presets without vocab_size).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PYTHON=${PYTHON:-python3}
if [[ -z "${LMTUNE:-}" ]]; then
  if [[ -x "$ROOT/build/lmtune" ]]; then LMTUNE=$ROOT/build/lmtune; else LMTUNE=$(command -v lmtune || true); fi
fi
OUT=bench-out SEQ=2048 BATCH=4 STEPS=10 WARMUP=3 CKPT="on off" PEAK=0 DEVICE=vulkan
SPEED=1 PARITY=0 P_STEPS=100 P_SEQ=512 P_BATCH=4 P_LR=2e-4 COMPILE=0
GRID=(qwen2.5-0.5b@8 llama-3.2-1b@8 qwen3-1.7b@4 gemma-3-1b@4 llama-3.1-8b@2)
MODELS=()
die() { echo "compare.sh: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --checkpointing) CKPT=$2; shift 2 ;;
    --peak-tflops) PEAK=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --parity) PARITY=1; [[ ${SPEED_SET:-0} == 1 ]] || SPEED=0; shift ;;
    --speed) SPEED=1; SPEED_SET=1; shift ;;
    --parity-steps) P_STEPS=$2; shift 2 ;;
    --parity-seq) P_SEQ=$2; shift 2 ;;
    --parity-batch) P_BATCH=$2; shift 2 ;;
    --parity-lr) P_LR=$2; shift 2 ;;
    --grid) MODELS+=("${GRID[@]}"); shift ;;
    --compile) COMPILE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) MODELS+=("$1"); shift ;;
  esac
done
[[ ${#MODELS[@]} -gt 0 ]] || die "name at least one model directory or preset (e.g. qwen2.5-0.5b llama-3.2-1b)"
[[ -n "$LMTUNE" && -x "$LMTUNE" ]] || die "no lmtune binary: build it (cmake --build build --target lmtune) or set LMTUNE"
command -v "$PYTHON" > /dev/null || die "no python interpreter '$PYTHON' (set PYTHON)"
"$PYTHON" -c 'import torch, transformers, peft' 2> /dev/null ||
  die "$PYTHON cannot import torch, transformers and peft (pip install torch transformers peft; on a CPU-only" \
      "machine with torch alone, bench/torch_cpu_baseline.py is the baseline)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# A model directory for a directory or a preset.
model_dir() {
  local m=$1
  if [[ -f "$m/config.json" ]]; then echo "$m"; return; fi
  local preset=$m
  [[ -f "$preset" ]] || preset=$ROOT/configs/presets/$m.yaml
  [[ -f "$preset" ]] || die "$m is neither a model directory (config.json) nor a preset (configs/presets/$m.yaml)"
  local dir=$OUT/models/$(basename "$preset" .yaml)
  if [[ ! -f "$dir/config.json" ]]; then
    echo "== lmtune init $(basename "$preset") -> $dir" >&2
    "$LMTUNE" --log-level warn init --config "$preset" ${TOKENIZER:+--tokenizer "$TOKENIZER"} --out "$dir" \
      --dtype bf16 >&2 || die "lmtune init failed for $preset"
  fi
  echo "$dir"
}

# run NAME CMD...: JSON on stdout into $OUT/NAME.json, the log into $OUT/NAME.log; a failure is reported, not fatal
# (an out-of-memory configuration still leaves the others' figures).
run() {
  local name=$1; shift
  echo "== $name: $*" >&2
  local rc=0
  "$@" > "$OUT/$name.json" 2> "$OUT/$name.log" || rc=$?
  if [[ $rc != 0 ]]; then
    echo "   failed (exit $rc); last lines of $OUT/$name.log:" >&2
    tail -3 "$OUT/$name.log" >&2
    rm -f "$OUT/$name.json"
  fi
}

if [[ $SPEED == 1 ]]; then
  rows=()
  for spec in "${MODELS[@]}"; do
    m=${spec%@*} batches=$BATCH
    [[ $spec == *@* ]] && batches=${spec##*@}
    dir=$(model_dir "$m")
    tag=$(basename "$dir")
    for ck in $CKPT; do
      for b in ${batches//,/ }; do
        common=(--model "$dir" --seq "$SEQ" --batch "$b" --steps "$STEPS" --warmup "$WARMUP"
                --grad-checkpointing "$ck" --json)
        [[ $PEAK == 0 ]] || common+=(--peak-tflops "$PEAK")
        run "lmtune_${tag}_ckpt_${ck}_b$b" "$LMTUNE" --device "$DEVICE" bench train "${common[@]}"
        run "peft_${tag}_ckpt_${ck}_b$b" "$PYTHON" "$HERE/peft_baseline.py" "${common[@]}"
        [[ $COMPILE == 0 ]] || run "peftc_${tag}_ckpt_${ck}_b$b" "$PYTHON" "$HERE/peft_baseline.py" "${common[@]}" --compile
        rows+=("$tag $ck $b")
      done
    done
  done
  "$PYTHON" "$HERE/compare_table.py" "$OUT" "${rows[@]}"
fi

if [[ $PARITY == 1 ]]; then
  failed=()
  for spec in "${MODELS[@]}"; do
    dir=$(model_dir "${spec%@*}")
    tag=$(basename "$dir")
    adapter=$OUT/parity_${tag}_init_adapter
    batches=$OUT/parity_${tag}_batches.safetensors
    common=(--model "$dir" --seq "$P_SEQ" --batch "$P_BATCH" --steps "$P_STEPS" --warmup 0 --lr "$P_LR"
            --grad-checkpointing off --peak-matmul-size 0 --losses --json)
    echo "== parity $tag: lmtune" >&2
    "$LMTUNE" --device "$DEVICE" bench train "${common[@]}" --save-batches "$batches" --save-init-adapter "$adapter" \
      > "$OUT/parity_${tag}_lmtune.json" 2> "$OUT/parity_${tag}_lmtune.log" || die "lmtune failed: $OUT/parity_${tag}_lmtune.log"
    echo "== parity $tag: peft" >&2
    "$PYTHON" "$HERE/peft_baseline.py" "${common[@]}" --batches "$batches" --init-adapter "$adapter" \
      > "$OUT/parity_${tag}_peft.json" 2> "$OUT/parity_${tag}_peft.log" || die "peft failed: $OUT/parity_${tag}_peft.log"
    "$PYTHON" "$HERE/loss_parity.py" "$OUT/parity_${tag}_lmtune.json" "$OUT/parity_${tag}_peft.json" || failed+=("$tag")
  done
  [[ ${#failed[@]} == 0 ]] || die "loss parity failed for: ${failed[*]}"
fi
