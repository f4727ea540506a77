#!/usr/bin/env python3
"""The tables bench/compare.sh prints: one row per (model, checkpointing, batch) with lmtune, PEFT and (when it ran)
PEFT under torch.compile, then each tool's best batch per (model, checkpointing).

  python3 bench/compare_table.py OUT_DIR "TAG CKPT BATCH" ...

Reads OUT_DIR/{lmtune,peft,peftc}_TAG_ckpt_CKPT_bBATCH.json (a run that failed, e.g. out of memory, shows "-").
"""
import json
import os
import sys


def load(out, name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def num(x, fmt):
    return "-".rjust(int(fmt.split(".")[0] or 0)) if x is None else format(x, fmt)


def tps(j):
    return None if j is None else j.get("tokens_per_s")


def gib(j):
    return None if j is None else j["peak_mem_bytes"] / 2**30


def ratio(a, b):
    return tps(a) / tps(b) if tps(a) and tps(b) else None


def mfu(j):
    if j is None:
        return "-"
    key = "mfu_given_peak" if j.get("mfu_given_peak") is not None else "mfu_measured_peak"
    return "-" if j.get(key) is None else f"{100 * j[key]:.1f}%"


def main():
    out, rows = sys.argv[1], [r.split() for r in sys.argv[2:]]
    runs = {}
    for tag, ck, b in rows:
        runs[(tag, ck, int(b))] = {t: load(out, f"{t}_{tag}_ckpt_{ck}_b{b}") for t in ("lmtune", "peft", "peftc")}
    compiled = any(r["peftc"] for r in runs.values())
    head = f"\n{'model':<14} {'ckpt':<4} {'batch':>5} {'lmtune tok/s':>12} {'PEFT tok/s':>10} {'ratio':>6}"
    if compiled:
        head += f" {'compiled':>9} {'ratio':>6}"
    head += f" {'lmtune GiB':>10} {'PEFT GiB':>8} {'lmtune MFU':>10} {'PEFT MFU':>8}"
    print(head)
    for (tag, ck, b), r in runs.items():
        a, p, c = r["lmtune"], r["peft"], r["peftc"]
        line = f"{tag:<14} {ck:<4} {b:>5} {num(tps(a), '12.0f')} {num(tps(p), '10.0f')} {num(ratio(a, p), '6.3f')}"
        if compiled:
            line += f" {num(tps(c), '9.0f')} {num(ratio(a, c), '6.3f')}"
        line += f" {num(gib(a), '10.2f')} {num(gib(p), '8.2f')} {mfu(a):>10} {mfu(p):>8}"
        print(line)
    # Each tool at its own best batch.
    best = {}
    for (tag, ck, b), r in runs.items():
        for tool, j in r.items():
            cur = best.get((tag, ck, tool))
            if tps(j) is not None and (cur is None or tps(j) > tps(cur[1])):
                best[(tag, ck, tool)] = (b, j)
    keys = list(dict.fromkeys((tag, ck) for tag, ck, _ in runs))
    print(f"\nbest batch     ckpt {'lmtune (batch)':>16} {'PEFT (batch)':>16} {'ratio':>6}" +
          (f" {'compiled (batch)':>17} {'ratio':>6}" if compiled else ""))
    for tag, ck in keys:
        cell = lambda t: best.get((tag, ck, t))
        fmt = lambda x: "-".rjust(16) if x is None else f"{tps(x[1]):>9.0f} ({x[0]:>3})".rjust(16)
        a, p, c = cell("lmtune"), cell("peft"), cell("peftc")
        line = f"{tag:<14} {ck:<4} {fmt(a)} {fmt(p)} {num(ratio(a[1], p[1]) if a and p else None, '6.3f')}"
        if compiled:
            line += f" {fmt(c):>17} {num(ratio(a[1], c[1]) if a and c else None, '6.3f')}"
        print(line)
    print("MFU = achieved model FLOP/s (6N + 12LHDT per token) / --peak-tflops when given, else / each tool's own "
          "measured bf16 matmul peak")


if __name__ == "__main__":
    main()
