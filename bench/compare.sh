#!/usr/bin/env bash
# lmtune vs PyTorch + PEFT on one machine, in one go (docs/benchmarks.md).
#
#   bench/compare.sh [options] MODEL_DIR_OR_PRESET ...
#
# Each MODEL is a model directory (config.json + weights) or a preset name / file from configs/presets (e.g.
# qwen2.5-0.5b, llama-3.2-1b), which `lmtune init` turns into a model with random bf16 weights and the real shapes.
# Speed (default): for each model and for gradient checkpointing on and off, `lmtune bench train` and
# bench/peft_baseline.py with the same arguments; then a table of tokens/s, the ratio lmtune / PEFT, peak memory
# and MFU. Parity (--parity): lmtune trains --parity-steps steps from the adapter it writes at initialization
# (--save-init-adapter) on random batches it saves (--save-batches); PEFT trains from that adapter on those
# batches with the same optimizer settings; the script prints both loss curves' max |diff| and relative diff and
# fails beyond the tolerances (below).
#
# Options: --out DIR (JSON and logs; default bench-out), --seq N (2048), --batch N (4), --steps N (10),
#   --warmup N (3), --checkpointing "on off", --peak-tflops X (the GPU's datasheet bf16 dense peak, e.g. 989 for
#   an H100 SXM), --device D (lmtune's --device; default vulkan), --parity, --speed (with --parity: both),
#   --parity-steps N (100), --parity-seq N (512), --parity-batch N (4), --parity-lr X (2e-4).
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
SPEED=1 PARITY=0 P_STEPS=100 P_SEQ=512 P_BATCH=4 P_LR=2e-4
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
  for m in "${MODELS[@]}"; do
    dir=$(model_dir "$m")
    tag=$(basename "$dir")
    for ck in $CKPT; do
      common=(--model "$dir" --seq "$SEQ" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP"
              --grad-checkpointing "$ck" --json)
      [[ $PEAK == 0 ]] || common+=(--peak-tflops "$PEAK")
      run "lmtune_${tag}_ckpt_$ck" "$LMTUNE" --device "$DEVICE" bench train "${common[@]}"
      run "peft_${tag}_ckpt_$ck" "$PYTHON" "$HERE/peft_baseline.py" "${common[@]}"
      rows+=("$tag $ck")
    done
  done
  "$PYTHON" - "$OUT" "${rows[@]}" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(os.path.join(out, name + ".json")))
    except (OSError, ValueError):
        return None
def f(x, fmt):  # a number, or "-" in the same width
    return "-".rjust(int(fmt.split(".")[0] or 0)) if x is None else format(x, fmt)
print(f"\n{'model':<14} {'ckpt':<4} {'lmtune tok/s':>12} {'PEFT tok/s':>10} {'ratio':>6} {'lmtune GiB':>10} "
      f"{'PEFT GiB':>8} {'lmtune MFU':>10} {'PEFT MFU':>8} {'matmul peak lmtune / torch':>27}")
for row in sys.argv[2:]:
    tag, ck = row.split()
    a, b = load(f"lmtune_{tag}_ckpt_{ck}"), load(f"peft_{tag}_ckpt_{ck}")
    g = lambda j, k: None if j is None else j.get(k)
    ratio = a["tokens_per_s"] / b["tokens_per_s"] if a and b else None
    gib = lambda j: None if j is None else j["peak_mem_bytes"] / 2**30
    # MFU against the given datasheet peak when there is one (comparable across tools), else each tool's own
    # measured matmul peak (which differ: lmtune's matmul is not torch's).
    key = "mfu_given_peak" if (g(a, "mfu_given_peak") or g(b, "mfu_given_peak")) is not None else "mfu_measured_peak"
    mfu = lambda j: "-" if g(j, key) is None else f"{100 * j[key]:.1f}%"
    peaks = f"{f(g(a, 'measured_peak_tflops'), '.0f')} / {f(g(b, 'measured_peak_tflops'), '.0f')} TFLOP/s"
    print(f"{tag:<14} {ck:<4} {f(g(a, 'tokens_per_s'), '12.0f')} {f(g(b, 'tokens_per_s'), '10.0f')} "
          f"{f(ratio, '6.3f')} {f(gib(a), '10.2f')} {f(gib(b), '8.2f')} {mfu(a):>10} {mfu(b):>8} {peaks:>27}")
print("MFU = achieved model FLOP/s (6N + 12LHDT per token) / --peak-tflops when given, else / each tool's own "
      "measured bf16 matmul peak")
PY
fi

if [[ $PARITY == 1 ]]; then
  failed=()
  for m in "${MODELS[@]}"; do
    dir=$(model_dir "$m")
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
