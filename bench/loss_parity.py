#!/usr/bin/env python3
"""Compares two `--losses` JSON results of the same training (lmtune bench train and bench/peft_baseline.py or
bench/torch_cpu_baseline.py: same initial adapter, same batches, same optimizer settings) and fails beyond a
mixed-precision tolerance.

  bench/loss_parity.py A.json B.json [--max-first-rel 1e-3] [--max-rel 1e-2] [--max-drop-rel 5e-2]

Checks (the defaults are for bf16 compute; docs/benchmarks.md has the measured figures):
  first step: |a0 - b0| / |b0| <= --max-first-rel (0.1%). Same weights, adapter and batch, so only the kernels
    differ: bf16 operands (8-bit significand, relative rounding <= 2^-9 = 0.2% per element) with f32
    accumulation. The loss averages B x (T - 1) token losses whose rounding errors mostly cancel, so a correct
    pair lands far below one element's rounding (measured 7e-6 on Qwen2.5-0.5B shapes); 0.1% still passes a
    systematic difference such as rounding the logits to bf16 before the softmax or not, and fails a wrong loss
    (a missing label shift changes it by several %).
  every step: max |a - b| / |b| <= --max-rel (1%). The trajectories drift apart as rounding differences in the
    gradients feed AdamW, which divides each gradient by its running RMS, so tiny gradient differences become
    update differences of the order of the learning rate; measured 9e-4 after 100 steps at lr 1e-3.
  learning: the loss drop (first loss - mean of the last 10) agrees within --max-drop-rel (5%; measured 0.2%). A
    wrong optimizer setting (learning rate, weight decay, clipping, LoRA scale) changes the drop by far more.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--max-first-rel", type=float, default=1e-3)
    ap.add_argument("--max-rel", type=float, default=1e-2)
    ap.add_argument("--max-drop-rel", type=float, default=5e-2)
    args = ap.parse_args()
    ja, jb = json.load(open(args.a)), json.load(open(args.b))
    la, lb = ja.get("losses"), jb.get("losses")
    if not la or not lb:
        sys.exit(f"loss_parity: {args.a if not la else args.b} has no 'losses' (run with --losses)")
    if len(la) != len(lb):
        sys.exit(f"loss_parity: {len(la)} losses in {args.a}, {len(lb)} in {args.b}")
    if any(x is None for x in la + lb):
        sys.exit("loss_parity: a loss is not finite")
    diffs = [abs(x - y) for x, y in zip(la, lb)]
    rels = [d / abs(y) for d, y in zip(diffs, lb)]
    worst = max(range(len(rels)), key=lambda i: rels[i])
    tail = min(10, len(la))
    drop_a = la[0] - sum(la[-tail:]) / tail
    drop_b = lb[0] - sum(lb[-tail:]) / tail
    drop_rel = abs(drop_a - drop_b) / max(abs(drop_b), 1e-12)
    name_a, name_b = ja.get("tool", "a"), jb.get("tool", "b")
    print(f"loss parity over {len(la)} steps: {name_a} {la[0]:.4f} -> {la[-1]:.4f}, {name_b} {lb[0]:.4f} -> "
          f"{lb[-1]:.4f}")
    print(f"  first step   |diff| {diffs[0]:.2e}  relative {rels[0]:.2e}  (tolerance {args.max_first_rel:.1e})")
    print(f"  all steps    max |diff| {max(diffs):.2e}  max relative {rels[worst]:.2e} at step {worst + 1}  "
          f"(tolerance {args.max_rel:.1e})")
    print(f"  loss drop    {name_a} {drop_a:.4f}, {name_b} {drop_b:.4f}, relative difference {drop_rel:.2e}  "
          f"(tolerance {args.max_drop_rel:.1e})")
    ok = rels[0] <= args.max_first_rel and rels[worst] <= args.max_rel and drop_rel <= args.max_drop_rel
    print("  PASS" if ok else "  FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
